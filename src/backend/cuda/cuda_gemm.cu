/* cuda_gemm.cu — prefill- and batch-shaped matmuls through cuBLAS.
 *
 * out[M,N] = x[M,K] . W[N,K]^T (+ bias). W stays in its checkpoint dtype.
 * For BF16/F16 weights the f32 activations are rounded to that dtype in a
 * backend-owned scratch buffer and the product runs on tensor cores with f32
 * accumulation and f32 output (what HF transformers does in bf16 too); the
 * backend advertises this through kn_backend.matmul_x_rounding_min_rows so
 * tests hold it to the right reference. F32 weights use plain f32 GEMM
 * (no TF32), so fp32 parity is unchanged.
 * Row-major out^T = W . x^T is cuBLAS's column-major C[N,M] = op(A) op(B) with
 * A = W read transposed (lda K) and B = x (ldb K). */
#include <cublas_v2.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define GEMM_WORKSPACE_BYTES (32u << 20)

__global__ void k_round_x(const float *x, int64_t n, int dt, void *y) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (dt == KN_DT_BF16) ((__nv_bfloat16 *)y)[i] = __float2bfloat16(x[i]);
    else ((__half *)y)[i] = __float2half(x[i]);
}

__global__ void k_add_bias(float *out, int64_t n, int64_t N, const float *bias) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % N];
}

static cublasHandle_t blas(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    if (c->blas_failed) return NULL;
    if (!c->blas) {
        cublasHandle_t h;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
            c->blas_failed = 1;
            return NULL;
        }
        /* a fixed workspace keeps cuBLAS from allocating inside graph capture */
        if (cudaMalloc(&c->blas_workspace, GEMM_WORKSPACE_BYTES) != cudaSuccess ||
            cublasSetWorkspace(h, c->blas_workspace, GEMM_WORKSPACE_BYTES) != CUBLAS_STATUS_SUCCESS ||
            cublasSetStream(h, c->stream) != CUBLAS_STATUS_SUCCESS ||
            cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
            cublasDestroy(h);
            c->blas_failed = 1;
            return NULL;
        }
        c->blas = h;
    }
    return (cublasHandle_t)c->blas;
}

void *kn_cuda_blas(kn_backend *be) { return (void *)blas(be); }

int kn_cuda_gemm_cublas(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                        int accumulate) {
    cublasHandle_t h = blas(be);
    if (!h) return 0;
    cudaStream_t s = kn_cuda_stream(be);
    const int N = (int)w->rows, K = (int)w->cols;
    const float one = 1.0f, zero = 0.0f, *beta = accumulate ? &one : &zero;
    cublasStatus_t st;
    if (w->dtype == KN_DT_F32) {
        st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w->data, CUDA_R_32F, K, x, CUDA_R_32F, K, beta,
                          out, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        const int64_t n = (int64_t)M * K;
        void *xr = kn_cuda_scratch(be, KN_CUDA_SCRATCH_GEMM_X, (size_t)n * 2);
        if (!xr) return 0;
        k_round_x<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, n, w->dtype, xr);
        cudaDataType t = w->dtype == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w->data, t, K, xr, t, K, beta, out, CUDA_R_32F,
                          N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kiln: cublasGemmEx failed (%d) for M=%d N=%d K=%d\n", (int)st, M, N, K);
        return 0;
    }
    if (bias) {
        const int64_t n = (int64_t)M * N;
        k_add_bias<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(out, n, N, bias);
    }
    return 1;
}

void kn_cuda_gemm_destroy(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c->blas_workspace) cudaFree(c->blas_workspace);
    c->blas = NULL, c->blas_workspace = NULL;
}

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
 * A = W read transposed (lda K) and B = x (ldb K).
 *
 * 16-bit weights go through cuBLASLt with the algorithm picked per shape by
 * timing: the first call of a shape (M, N, K, dtype, accumulate) — always an
 * eager run, never inside graph capture — times up to 16 heuristic candidates
 * (into scratch, so out is untouched) and caches the fastest; later calls and
 * recorded graphs reuse it. KILN_NO_LT=1 uses cublasGemmEx's default choice. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

#define GEMM_WORKSPACE_BYTES (32u << 20)

__global__ void k_round_x(const float *x, int64_t n, int dt, void *y) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (dt == KN_DT_BF16) ((__nv_bfloat16 *)y)[i] = __float2bfloat16(x[i]);
    else ((__half *)y)[i] = __float2half(x[i]);
}

/* one block per row: y = round(rms_norm(x) * w) (w NULL: round(x)) */
template <typename T>
__global__ void k_norm_round(const float *x, int64_t K, const float *w, float eps, T *y) {
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * K;
    T *yr = y + (int64_t)blockIdx.x * K;
    float inv = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int64_t j = threadIdx.x; j < K; j += blockDim.x) ss += xr[j] * xr[j];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
        inv = 1.0f / sqrtf(tot / (float)K + eps);
    }
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
        const float v = w ? w[j] * (xr[j] * inv) : xr[j];
        yr[j] = (T)v;
    }
}

/* out[r, j] = silu(g) * u of gu's row r = [g | u] (T: stored as T, the value
 * k_round_x would make of the f32 result) */
template <typename T> __device__ __forceinline__ T gemm_store(float v);
template <> __device__ __forceinline__ float gemm_store<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 gemm_store<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half gemm_store<__half>(float v) { return __float2half(v); }
template <typename T>
__global__ void k_swiglu_rows(const float *gu, int64_t n_total, int64_t dim, T *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_total) return;
    const int64_t r = i / dim, j = i % dim;
    const float g = gu[r * 2 * dim + j], u = gu[r * 2 * dim + dim + j];
    out[i] = gemm_store<T>(g / (1.0f + expf(-g)) * u);
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

/* ---- cuBLASLt with per-shape autotuning ---- */

#define LT_CACHE 96
#define LT_CANDIDATES 16
typedef struct {
    int M, N, K, dt, acc;
    cublasLtMatmulAlgo_t algo;
} lt_algo;
struct kn_cuda_lt {
    cublasLtHandle_t h;
    lt_algo e[LT_CACHE];
    int n, next; /* entries, ring position once full */
};

static kn_cuda_lt *lt_state(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    if (c->lt_failed) return NULL;
    if (!c->lt) {
        static int disabled = -1;
        if (disabled < 0) disabled = getenv("KILN_NO_LT") != NULL;
        kn_cuda_lt *l = disabled || !blas(be) ? NULL : (kn_cuda_lt *)calloc(1, sizeof *l);
        if (!l || cublasLtCreate(&l->h) != CUBLAS_STATUS_SUCCESS) {
            free(l);
            c->lt_failed = 1;
            return NULL;
        }
        c->lt = l;
    }
    return c->lt;
}

static void kn_cuda_lt_destroy(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    if (c->lt) cublasLtDestroy(c->lt->h), free(c->lt);
    c->lt = NULL;
}

/* out[M,N] (+)= xr[M,K] . W^T with xr already in W's 16-bit dtype. 0: not done. */
static int lt_matmul(kn_backend *be, const void *xr, int M, const kn_weight *w, float *out, int accumulate) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    kn_cuda_lt *l = lt_state(be);
    if (!l) return 0;
    const int N = (int)w->rows, K = (int)w->cols, dt = (int)w->dtype;
    const cudaDataType t = w->dtype == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const float one = 1.0f, zero = 0.0f, *beta = accumulate ? &one : &zero;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    int ok = 0;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return 0;
    if (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT) ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN) ||
        cublasLtMatrixLayoutCreate(&la, t, K, N, K) || cublasLtMatrixLayoutCreate(&lb, t, K, M, K) ||
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N))
        goto done;
    {
        int i = 0;
        for (; i < l->n; i++)
            if (l->e[i].M == M && l->e[i].N == N && l->e[i].K == K && l->e[i].dt == dt && l->e[i].acc == accumulate)
                break;
        if (i == l->n) { /* first sight: time the candidates */
            if (c->capturing) goto done;
            cublasLtMatmulPreference_t pref = NULL;
            cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
            int nres = 0;
            size_t ws = GEMM_WORKSPACE_BYTES;
            if (cublasLtMatmulPreferenceCreate(&pref) ||
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
                cublasLtMatmulAlgoGetHeuristic(l->h, op, la, lb, lc, lc, pref, LT_CANDIDATES, res, &nres) || nres < 1) {
                if (pref) cublasLtMatmulPreferenceDestroy(pref);
                goto done;
            }
            cublasLtMatmulPreferenceDestroy(pref);
            /* timing writes D into scratch (C = out is only read), so out is untouched */
            float *d = (float *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTN_GEMM, (size_t)M * N * sizeof(float));
            int best = 0;
            if (d && nres > 1) {
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0), cudaEventCreate(&e1);
                float best_ms = 1e30f;
                for (int r = 0; r < nres; r++) {
                    float ms = 0.0f;
                    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
                    for (int rep = 0; rep < 4 && st == CUBLAS_STATUS_SUCCESS; rep++) {
                        if (rep == 1) cudaEventRecord(e0, c->stream);
                        st = cublasLtMatmul(l->h, op, &one, w->data, la, xr, lb, beta, out, lc, d, lc, &res[r].algo,
                                            c->blas_workspace, GEMM_WORKSPACE_BYTES, c->stream);
                    }
                    cudaEventRecord(e1, c->stream);
                    if (st != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(e1) != cudaSuccess ||
                        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
                        continue;
                    if (ms < best_ms) best_ms = ms, best = r;
                }
                cudaEventDestroy(e0), cudaEventDestroy(e1);
                cudaGetLastError();
            }
            if (l->n < LT_CACHE) i = l->n++;
            else i = l->next, l->next = (l->next + 1) % LT_CACHE;
            lt_algo *e = &l->e[i];
            e->M = M, e->N = N, e->K = K, e->dt = dt, e->acc = accumulate, e->algo = res[best].algo;
        }
        ok = cublasLtMatmul(l->h, op, &one, w->data, la, xr, lb, beta, out, lc, out, lc, &l->e[i].algo,
                            c->blas_workspace, GEMM_WORKSPACE_BYTES, c->stream) == CUBLAS_STATUS_SUCCESS;
    }
done:
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
    return ok;
}

/* out[M,N] (+)= xw[M,K] . W^T + bias with xw already in W's dtype: 16-bit
 * weights through cuBLASLt (autotuned), else (and f32 weights)
 * cublasGemmEx's default. 0 when the GEMM failed (said on stderr; no bias
 * added). */
static int gemm_w(kn_backend *be, const void *xw, int M, const kn_weight *w, const float *bias, float *out,
                  int accumulate) {
    const int N = (int)w->rows, K = (int)w->cols;
    if (w->dtype == KN_DT_F32 || !lt_matmul(be, xw, M, w, out, accumulate)) {
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType t = w->dtype == KN_DT_F32 ? CUDA_R_32F : w->dtype == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const cublasStatus_t st = cublasGemmEx(blas(be), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w->data, t, K, xw, t,
                                               K, accumulate ? &one : &zero, out, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "kiln: cublasGemmEx failed (%d) for M=%d N=%d K=%d\n", (int)st, M, N, K);
            return 0;
        }
    }
    if (bias) {
        const int64_t n = (int64_t)M * N;
        k_add_bias<<<(unsigned)((n + 255) / 256), 256, 0, kn_cuda_stream(be)>>>(out, n, N, bias);
    }
    return 1;
}

int kn_cuda_gemm_cublas(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                        int accumulate) {
    if (!blas(be)) return 0;
    if (w->dtype == KN_DT_F32) return gemm_w(be, x, M, w, bias, out, accumulate);
    const int64_t n = (int64_t)M * w->cols;
    void *xr = kn_cuda_scratch(be, KN_CUDA_SCRATCH_GEMM_X, (size_t)n * 2);
    if (!xr) return 0;
    k_round_x<<<(unsigned)((n + 255) / 256), 256, 0, kn_cuda_stream(be)>>>(x, n, w->dtype, xr);
    return gemm_w(be, xr, M, w, bias, out, accumulate);
}

void kn_cuda_gemm_destroy(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    kn_cuda_lt_destroy(be);
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c->blas_workspace) cudaFree(c->blas_workspace);
    c->blas = NULL, c->blas_workspace = NULL;
}

/* y[M, N] = round(rms_norm(x) * norm_w) . W^T + bias for a 16-bit W, y in
 * scratch slot ys_slot (or out when ys_slot < 0); NULL when nothing was done
 * (no cuBLAS, no scratch) and a non-NULL y once the work is enqueued, even
 * when the GEMM failed (loudly). */
static float *gemm_norm(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                        const float *bias, int ys_slot, float *out) {
    if (!blas(be)) return NULL;
    cudaStream_t s = kn_cuda_stream(be);
    const int N = (int)w->rows, K = (int)w->cols;
    void *xr = kn_cuda_scratch(be, KN_CUDA_SCRATCH_GEMM_X, (size_t)M * K * 2);
    float *y = ys_slot >= 0 ? (float *)kn_cuda_scratch(be, ys_slot, (size_t)M * N * 4) : out;
    if (!xr || !y) return NULL;
    const int thr = K >= 1024 ? 256 : 128;
    if (w->dtype == KN_DT_BF16) k_norm_round<__nv_bfloat16><<<M, thr, 0, s>>>(x, K, norm_w, eps, (__nv_bfloat16 *)xr);
    else k_norm_round<__half><<<M, thr, 0, s>>>(x, K, norm_w, eps, (__half *)xr);
    gemm_w(be, xr, M, w, bias, y, 0); /* a failure is said; the norm kernel is enqueued, so the op is done */
    return y;
}

static int gemm_16bit(const kn_weight *w) { return !w->bits && (w->dtype == KN_DT_BF16 || w->dtype == KN_DT_F16); }

int kn_cuda_gemm_fused(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                       const float *bias, float *out, int epi) {
    if (!gemm_16bit(w) || (epi == KN_EPI_SWIGLU && w->rows % 2)) return 0;
    const int swiglu = epi == KN_EPI_SWIGLU;
    float *y = gemm_norm(be, x, M, norm_w, eps, w, bias, swiglu ? KN_CUDA_SCRATCH_GEMM_OUT : -1, out);
    if (!y) return 0;
    if (swiglu) {
        const int64_t n = (int64_t)M * (w->rows / 2);
        k_swiglu_rows<float><<<(unsigned)((n + 255) / 256), 256, 0, kn_cuda_stream(be)>>>(y, n, w->rows / 2, out);
    }
    return 1;
}

/* backend.h mlp_swiglu_add for prefill-sized M: the SwiGLU kernel writes the
 * activation straight in the down projection's dtype (the rounding the down
 * GEMM would apply to an f32 activation), so neither the f32 activation nor
 * its rounding pass exists: 1.5 x M x inter x 4 bytes less traffic. */
int kn_cuda_mlp_swiglu_add(kn_backend *be, const float *xn, int M, const float *norm_w, float eps,
                           const kn_weight *gu, const float *gu_bias, const kn_weight *down, const float *down_bias,
                           float *x) {
    const int64_t I = gu->rows / 2;
    if (M <= KN_CUDA_GEMV_MAX_M || !gemm_16bit(gu) || !gemm_16bit(down) || gu->dtype != down->dtype ||
        gu->rows % 2 || down->cols != I)
        return 0;
    cudaStream_t s = kn_cuda_stream(be);
    const int64_t n = (int64_t)M * I;
    void *act = kn_cuda_scratch(be, KN_CUDA_SCRATCH_MLP_ACT, (size_t)n * 2);
    if (!act || !blas(be)) return 0;
    float *y = gemm_norm(be, xn, M, norm_w, eps, gu, gu_bias, KN_CUDA_SCRATCH_GEMM_OUT, NULL);
    if (!y) return 0;
    const unsigned blocks = (unsigned)((n + 255) / 256);
    if (down->dtype == KN_DT_BF16) k_swiglu_rows<__nv_bfloat16><<<blocks, 256, 0, s>>>(y, n, I, (__nv_bfloat16 *)act);
    else k_swiglu_rows<__half><<<blocks, 256, 0, s>>>(y, n, I, (__half *)act);
    gemm_w(be, act, M, down, down_bias, x, 1); /* a failure is said; the op is done */
    return 1;
}

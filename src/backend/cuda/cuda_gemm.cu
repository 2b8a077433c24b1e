/* cuda_gemm.cu — prefill- and batch-shaped matmuls through cuBLAS.
 *
 * out[M,N] = x[M,K] . W[N,K]^T (+ bias). W stays in its checkpoint dtype.
 * For BF16/F16 weights the f32 activations are rounded to that dtype in a
 * backend-owned scratch buffer and the product runs on tensor cores with f32
 * accumulation and f32 output (what HF transformers does in bf16 too); the
 * backend advertises this through kn_backend.matmul_x_rounding_min_rows so
 * tests hold it to the right reference. The SwiGLU epilogue also rounds
 * gate and up to that dtype (the gate/up GEMM writes 16-bit output, as in HF
 * transformers' bf16 MLP). F32 weights use plain f32 GEMM
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
#include <stdint.h>
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

/* SwiGLU over rows of gu = [g | u] (dim columns each): out[r, j] =
 * silu(g) * u stored as Tout. Tin is the GEMM's output type; Tr the type g and
 * u are rounded to first (float: none), so an f32 GEMM output with its bias
 * added gives the numbers a 16-bit GEMM output would. V columns per thread
 * (8 when dim % 8 == 0 and the buffers are aligned: 16- or 32-byte loads). */
template <typename T> __device__ __forceinline__ float gemm_load(const T *p) { return (float)*p; }
template <> __device__ __forceinline__ float gemm_load<__nv_bfloat16>(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
template <> __device__ __forceinline__ float gemm_load<__half>(const __half *p) { return __half2float(*p); }
template <typename T> __device__ __forceinline__ T gemm_store(float v);
template <> __device__ __forceinline__ float gemm_store<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 gemm_store<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half gemm_store<__half>(float v) { return __float2half(v); }
/* v as type T holds it (T float: v) */
template <typename T> __device__ __forceinline__ float gemm_round(float v) {
    const T t = gemm_store<T>(v);
    return gemm_load<T>(&t);
}
template <> __device__ __forceinline__ float gemm_round<float>(float v) { return v; }

/* V consecutive elements of type T, moved as one aligned vector */
template <typename T, int V> struct alignas(sizeof(T) * V) gemm_vec { T v[V]; };

template <typename Tin, typename Tr, typename Tout, int V>
__global__ void k_swiglu_rows(const Tin *gu, int rows, int64_t dim, Tout *out) {
    const int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (j >= dim) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const gemm_vec<Tin, V> g = *(const gemm_vec<Tin, V> *)(gu + (int64_t)r * 2 * dim + j);
        const gemm_vec<Tin, V> u = *(const gemm_vec<Tin, V> *)(gu + (int64_t)r * 2 * dim + dim + j);
        gemm_vec<Tout, V> o;
#pragma unroll
        for (int i = 0; i < V; i++) {
            const float gv = gemm_round<Tr>(gemm_load<Tin>(&g.v[i])), uv = gemm_round<Tr>(gemm_load<Tin>(&u.v[i]));
            o.v[i] = gemm_store<Tout>(gv / (1.0f + expf(-gv)) * uv);
        }
        *(gemm_vec<Tout, V> *)(out + (int64_t)r * dim + j) = o;
    }
}

template <typename Tin, typename Tr, typename Tout>
static void swiglu_rows(cudaStream_t s, const void *gu, int rows, int64_t dim, void *out) {
    /* 8 columns per thread where every row start is a whole vector (dim % 8)
     * and both buffers are aligned to one; else one column per thread */
    const int v = dim % 8 == 0 && (uintptr_t)gu % (8 * sizeof(Tin)) == 0 && (uintptr_t)out % (8 * sizeof(Tout)) == 0
                      ? 8 : 1;
    const dim3 grid((unsigned)((dim / v + 255) / 256), (unsigned)(rows < 65535 ? rows : 65535));
    if (v == 8) k_swiglu_rows<Tin, Tr, Tout, 8><<<grid, 256, 0, s>>>((const Tin *)gu, rows, dim, (Tout *)out);
    else k_swiglu_rows<Tin, Tr, Tout, 1><<<grid, 256, 0, s>>>((const Tin *)gu, rows, dim, (Tout *)out);
}

/* The SwiGLU epilogue of a GEMM-shaped gate/up projection in dtype wdt:
 * gu is wdt when gu_rounded (the GEMM wrote 16-bit output), else f32 to be
 * rounded to wdt here; out is f32 (act_f32) or wdt. */
static void swiglu_epilogue(cudaStream_t s, int wdt, const void *gu, int gu_rounded, int rows, int64_t dim, void *out,
                            int act_f32) {
    if (wdt == KN_DT_BF16) {
        typedef __nv_bfloat16 B;
        if (gu_rounded) act_f32 ? swiglu_rows<B, B, float>(s, gu, rows, dim, out) : swiglu_rows<B, B, B>(s, gu, rows, dim, out);
        else act_f32 ? swiglu_rows<float, B, float>(s, gu, rows, dim, out) : swiglu_rows<float, B, B>(s, gu, rows, dim, out);
    } else {
        typedef __half F;
        if (gu_rounded) act_f32 ? swiglu_rows<F, F, float>(s, gu, rows, dim, out) : swiglu_rows<F, F, F>(s, gu, rows, dim, out);
        else act_f32 ? swiglu_rows<float, F, float>(s, gu, rows, dim, out) : swiglu_rows<float, F, F>(s, gu, rows, dim, out);
    }
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
    int M, N, K, dt, out16, acc;
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

/* out[M,N] (+)= xr[M,K] . W^T with xr already in W's 16-bit dtype; out is
 * f32, or W's dtype when out16. 0: not done. */
static int lt_matmul(kn_backend *be, const void *xr, int M, const kn_weight *w, void *out, int out16, int accumulate) {
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
        cublasLtMatrixLayoutCreate(&lc, out16 ? t : CUDA_R_32F, N, M, N))
        goto done;
    {
        int i = 0;
        for (; i < l->n; i++)
            if (l->e[i].M == M && l->e[i].N == N && l->e[i].K == K && l->e[i].dt == dt && l->e[i].out16 == out16 &&
                l->e[i].acc == accumulate)
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
            void *d = kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTN_GEMM, (size_t)M * N * (out16 ? 2 : 4));
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
            e->M = M, e->N = N, e->K = K, e->dt = dt, e->out16 = out16, e->acc = accumulate, e->algo = res[best].algo;
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
 * cublasGemmEx's default. out is f32, or (out16, 16-bit W, no bias) W's
 * dtype. 0 when the GEMM failed (said on stderr; no bias added). */
static int gemm_w(kn_backend *be, const void *xw, int M, const kn_weight *w, const float *bias, void *out, int out16,
                  int accumulate) {
    const int N = (int)w->rows, K = (int)w->cols;
    if (w->dtype == KN_DT_F32 || !lt_matmul(be, xw, M, w, out, out16, accumulate)) {
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType t = w->dtype == KN_DT_F32 ? CUDA_R_32F : w->dtype == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const cublasStatus_t st = cublasGemmEx(blas(be), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w->data, t, K, xw, t,
                                               K, accumulate ? &one : &zero, out, out16 ? t : CUDA_R_32F, N,
                                               CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "kiln: cublasGemmEx failed (%d) for M=%d N=%d K=%d\n", (int)st, M, N, K);
            return 0;
        }
    }
    if (bias) {
        const int64_t n = (int64_t)M * N;
        kn_cuda_before_launch();
        k_add_bias<<<(unsigned)((n + 255) / 256), 256, 0, kn_cuda_stream(be)>>>((float *)out, n, N, bias);
        kn_cuda_launched(be, "add_bias");
    }
    return 1;
}

int kn_cuda_gemm_cublas(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                        int accumulate) {
    if (!blas(be)) return 0;
    if (w->dtype == KN_DT_F32) return gemm_w(be, x, M, w, bias, out, 0, accumulate);
    const int64_t n = (int64_t)M * w->cols;
    void *xr = kn_cuda_scratch(be, KN_CUDA_SCRATCH_GEMM_X, (size_t)n * 2);
    if (!xr) return 0;
    kn_cuda_before_launch();
    k_round_x<<<(unsigned)((n + 255) / 256), 256, 0, kn_cuda_stream(be)>>>(x, n, w->dtype, xr);
    kn_cuda_launched(be, "round_x");
    return gemm_w(be, xr, M, w, bias, out, 0, accumulate);
}

void kn_cuda_gemm_destroy(kn_backend *be) {
    kn_cuda_backend *c = (kn_cuda_backend *)be;
    kn_cuda_lt_destroy(be);
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c->blas_workspace) cudaFree(c->blas_workspace);
    c->blas = NULL, c->blas_workspace = NULL;
}

/* y[M, N] = round(rms_norm(x) * norm_w) . W^T + bias for a 16-bit W, y in
 * scratch slot ys_slot (or out when ys_slot < 0), in W's dtype when *out16
 * (cleared when a bias needs the f32 output), else f32; NULL when nothing was
 * done (no cuBLAS, no scratch) and a non-NULL y once the work is enqueued,
 * even when the GEMM failed (loudly). */
static void *gemm_norm(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                       const float *bias, int ys_slot, float *out, int *out16) {
    if (!blas(be)) return NULL;
    cudaStream_t s = kn_cuda_stream(be);
    const int N = (int)w->rows, K = (int)w->cols;
    if (bias) *out16 = 0;
    void *xr = kn_cuda_scratch(be, KN_CUDA_SCRATCH_GEMM_X, (size_t)M * K * 2);
    void *y = ys_slot >= 0 ? kn_cuda_scratch(be, ys_slot, (size_t)M * N * (*out16 ? 2 : 4)) : out;
    if (!xr || !y) return NULL;
    const int thr = K >= 1024 ? 256 : 128;
    kn_cuda_before_launch();
    if (w->dtype == KN_DT_BF16) k_norm_round<__nv_bfloat16><<<M, thr, 0, s>>>(x, K, norm_w, eps, (__nv_bfloat16 *)xr);
    else k_norm_round<__half><<<M, thr, 0, s>>>(x, K, norm_w, eps, (__half *)xr);
    kn_cuda_launched(be, "norm_round");
    gemm_w(be, xr, M, w, bias, y, *out16, 0); /* a failure is said; the norm kernel is enqueued, so the op is done */
    return y;
}

static int gemm_16bit(const kn_weight *w) { return !w->bits && (w->dtype == KN_DT_BF16 || w->dtype == KN_DT_F16); }

/* The SwiGLU epilogue (backend.h matmul_x_rounding_min_rows) rounds gate and
 * up to the weight dtype, as a 16-bit GEMM output would be (and as HF
 * transformers computes in bf16): the gate/up GEMM writes 16-bit output,
 * half the traffic of f32 both ways. */
int kn_cuda_gemm_fused(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                       const float *bias, float *out, int epi) {
    if (!gemm_16bit(w) || (epi == KN_EPI_SWIGLU && w->rows % 2)) return 0;
    const int swiglu = epi == KN_EPI_SWIGLU;
    int out16 = swiglu;
    void *y = gemm_norm(be, x, M, norm_w, eps, w, bias, swiglu ? KN_CUDA_SCRATCH_GEMM_OUT : -1, out, &out16);
    if (!y) return 0;
    if (swiglu) {
        kn_cuda_before_launch();
        swiglu_epilogue(kn_cuda_stream(be), w->dtype, y, out16, M, w->rows / 2, out, 1);
        kn_cuda_launched(be, "swiglu_rows");
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
    const int64_t n = (int64_t)M * I;
    void *act = kn_cuda_scratch(be, KN_CUDA_SCRATCH_MLP_ACT, (size_t)n * 2);
    if (!act || !blas(be)) return 0;
    int out16 = 1;
    void *y = gemm_norm(be, xn, M, norm_w, eps, gu, gu_bias, KN_CUDA_SCRATCH_GEMM_OUT, NULL, &out16);
    if (!y) return 0;
    kn_cuda_before_launch();
    swiglu_epilogue(kn_cuda_stream(be), gu->dtype, y, out16, M, I, act, 0);
    kn_cuda_launched(be, "swiglu_rows");
    gemm_w(be, act, M, down, down_bias, x, 0, 1); /* a failure is said; the op is done */
    return 1;
}

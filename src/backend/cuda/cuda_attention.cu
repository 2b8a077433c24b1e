/* cuda_attention.cu — paged grouped-query attention on the GPU (the
 * `attention` op of backend.h): it routes each run of tokens to a kernel.
 *
 * Tokens attended one at a time (decode, scattered positions) go to the
 * split-K flash-decode kernel in cuda_kv.cu, which reads every cache format,
 * float32 and bf16 rows included.
 *
 * Prefill runs (>= ATT_GEMM_MIN_RUN consecutive positions of one sequence,
 * known from the host mirrors of pos/seq) go to the fused tensor-core kernel
 * (cuda_flash_prefill.cu) where it covers the shape, else through cuBLAS:
 * the run's keys/values are gathered from the paged cache into contiguous
 * [kv_head][ctx][hd] buffers, S = Q K^T is one strided-batched GEMM per KV
 * head (its G query heads stacked), a masked softmax writes P, O = P V is a
 * second batched GEMM, and O is scattered back to the token-major output.
 * compute_dtype picks BF16/F16 tensor cores or exact F32 GEMMs. Caches in
 * other formats are gathered through kn_cuda_kv_gather.
 *
 * Invariants: block tables of int32, positions attended
 * [max(0, pos - window + 1), pos]. */
#include <cublas_v2.h>
#include <float.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"


__device__ float block_sum_att(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t += sh[i];
    return t;
}
__device__ float block_max_att(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t = fmaxf(t, sh[i]);
    return t;
}

/* ---- GEMM path for prefill runs ----------------------------------------- */

#define ATT_GEMM_MIN_RUN 32
#define ATT_GEMM_MAX_SCORES ((size_t)256 << 20) /* floats of S per GEMM batch */

template <typename T> __device__ __forceinline__ T to_t(float v);
template <> __device__ __forceinline__ float to_t<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half to_t<__half>(float v) { return __float2half(v); }

/* K/V of positions [k0, k0 + ctx) of sequence s -> kc/vc [n_kv][ctx][hd] */
template <typename T>
__global__ void k_gather_kv(kn_kv_layer kv, const int32_t *bt, int k0, int ctx, T *kc, T *vc) {
    const int j = blockIdx.x, g = blockIdx.y, hd = kv.head_dim, bs = kv.block_size, p = k0 + j;
    const int64_t src = ((int64_t)bt[p / bs] * bs + p % bs) * kv.n_kv_heads * hd + (int64_t)g * hd;
    const int64_t dst = ((int64_t)g * ctx + j) * hd;
    const float *ks = (const float *)kv.k, *vs = (const float *)kv.v;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) kc[dst + d] = to_t<T>(ks[src + d]), vc[dst + d] = to_t<T>(vs[src + d]);
}

/* queries of tokens [t0, t0 + len) -> qc [n_heads][len][hd] */
template <typename T>
__global__ void k_gather_q(const float *q, int64_t q_stride, int t0, int len, int hd, T *qc) {
    const int i = blockIdx.x, h = blockIdx.y;
    const float *src = q + (int64_t)(t0 + i) * q_stride + (int64_t)h * hd;
    T *dst = qc + ((int64_t)h * len + i) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = to_t<T>(src[d]);
}

/* row (h, i): query at position p0 + i sees keys [lo, p0 + i] (absolute),
 * i.e. columns [lo - k0, p0 + i - k0] of S; softmax there, zeros elsewhere */
template <typename T>
__global__ void k_masked_softmax(const float *S, int len, int ctx, int p0, int k0, int window, float cap, T *P) {
    __shared__ float sh[32];
    const int row = blockIdx.x, i = row % len, p = p0 + i;
    const int lo = (window > 0 && p - window + 1 > k0) ? p - window + 1 - k0 : 0, hi = p - k0;
    const float *s = S + (int64_t)row * ctx;
    T *o = P + (int64_t)row * ctx;
#define CAPPED(v) (cap > 0.0f ? cap * tanhf((v) / cap) : (v))
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) mx = fmaxf(mx, CAPPED(s[j]));
    mx = block_max_att(mx, sh);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) sum += expf(CAPPED(s[j]) - mx);
    sum = block_sum_att(sum, sh);
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < ctx; j += blockDim.x)
        o[j] = to_t<T>(j >= lo && j <= hi ? expf(CAPPED(s[j]) - mx) * inv : 0.0f);
#undef CAPPED
}

/* ob [n_heads][len][hd] -> out rows t0 + i */
__global__ void k_scatter_out(const float *ob, int t0, int len, int n_heads, int hd, float *out) {
    const int i = blockIdx.x, h = blockIdx.y;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        out[((int64_t)(t0 + i) * n_heads + h) * hd + d] = ob[((int64_t)h * len + i) * hd + d];
}

template <typename T>
static int attention_gemm_run(kn_backend *be, const kn_attention_args *a, int t0, int len, cudaDataType ct) {
    cublasHandle_t h = (cublasHandle_t)kn_cuda_blas(be);
    if (!h) return 0;
    cudaStream_t st = kn_cuda_stream(be);
    const kn_kv_layer *kv = a->kv;
    const int hd = kv->head_dim, nkv = kv->n_kv_heads, G = a->n_heads / nkv;
    const int p0 = a->pos_host[t0], p_last = p0 + len - 1, s = a->seq_host[t0];
    const int k0 = (a->window > 0 && p0 - a->window + 1 > 0) ? p0 - a->window + 1 : 0, ctx = p_last - k0 + 1;
    const size_t et = sizeof(T);
    size_t off_k = 0, off_v = off_k + (size_t)nkv * ctx * hd * et, off_q = off_v + (size_t)nkv * ctx * hd * et;
    size_t off_s = (off_q + (size_t)a->n_heads * len * hd * et + 255) & ~(size_t)255;
    size_t off_p = off_s + (size_t)a->n_heads * len * ctx * 4;
    size_t off_o = (off_p + (size_t)a->n_heads * len * ctx * et + 255) & ~(size_t)255;
    size_t total = off_o + (size_t)a->n_heads * len * hd * 4;
    char *buf = (char *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTN_GEMM, total);
    if (!buf) return 0;
    T *kc = (T *)(buf + off_k), *vc = (T *)(buf + off_v), *qc = (T *)(buf + off_q), *P = (T *)(buf + off_p);
    float *S = (float *)(buf + off_s), *ob = (float *)(buf + off_o);
    const int thr = hd >= 128 ? 128 : 64;
    if (kv->k_fmt == KN_KVF_F32 && kv->v_fmt == KN_KVF_F32)
        k_gather_kv<T><<<dim3(ctx, nkv), thr, 0, st>>>(*kv, a->block_tables + (int64_t)s * a->max_blocks, k0, ctx, kc, vc);
    else /* compressed cache: dequantize this chunk (cuda_kv.cu) */
        kn_cuda_kv_gather(be, kv, a->block_tables + (int64_t)s * a->max_blocks, k0, ctx, kc, vc,
                          ct == CUDA_R_16BF ? KN_DT_BF16 : ct == CUDA_R_16F ? KN_DT_F16 : KN_DT_F32);
    kn_cuda_before_launch();
    k_gather_q<T><<<dim3(len, a->n_heads), thr, 0, st>>>(a->q, a->q_stride, t0, len, hd, qc);
    kn_cuda_launched(be, "gather_q");
    const float alpha = a->scale, one = 1.0f, zero = 0.0f;
    /* S_g [G*len, ctx] (row-major) = Q_g [G*len, hd] . K_g^T: column-major C[ctx, G*len] = K_g^T . Q_g */
    cublasStatus_t r = cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, ctx, G * len, hd, &alpha, kc, ct, hd, (long long)ctx * hd, qc, ct, hd,
        (long long)G * len * hd, &zero, S, CUDA_R_32F, ctx, (long long)G * len * ctx, nkv, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS) return 0;
    kn_cuda_before_launch();
    k_masked_softmax<T><<<a->n_heads * len, 256, 0, st>>>(S, len, ctx, p0, k0, a->window, a->softcap, P);
    kn_cuda_launched(be, "masked_softmax");
    /* O_g [G*len, hd] = P_g [G*len, ctx] . V_g [ctx, hd]: column-major C[hd, G*len] = V_g^T' . P_g */
    r = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, hd, G * len, ctx, &one, vc, ct, hd,
                                   (long long)ctx * hd, P, ct, ctx, (long long)G * len * ctx, &zero, ob, CUDA_R_32F,
                                   hd, (long long)G * len * hd, nkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS) return 0;
    kn_cuda_before_launch();
    k_scatter_out<<<dim3(len, a->n_heads), thr, 0, st>>>(ob, t0, len, a->n_heads, hd, a->out);
    kn_cuda_launched(be, "scatter_out");
    return 1;
}

/* One run through the GEMM path, split into sub-runs that bound S. */
static int attention_gemm(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    if (kn_cuda_flash_prefill(be, a, t0, len)) return 1; /* fused tensor-core kernel (bf16/f16) */
    const int p_last = a->pos_host[t0] + len - 1;
    size_t per_row = (size_t)a->n_heads * (size_t)(p_last + 1);
    int sub = (int)(ATT_GEMM_MAX_SCORES / per_row);
    if (sub < 1) return 0;
    for (int i = 0; i < len; i += sub) {
        int n = len - i < sub ? len - i : sub, ok;
        if (a->compute_dtype == KN_DT_BF16) ok = attention_gemm_run<__nv_bfloat16>(be, a, t0 + i, n, CUDA_R_16BF);
        else if (a->compute_dtype == KN_DT_F16) ok = attention_gemm_run<__half>(be, a, t0 + i, n, CUDA_R_16F);
        else ok = attention_gemm_run<float>(be, a, t0 + i, n, CUDA_R_32F);
        if (!ok) {
            if (i == 0) return 0;
            fprintf(stderr, "kiln: cuda attention GEMM failed mid-run\n");
            return 0;
        }
    }
    return 1;
}

/* tokens [t0, t0 + n) of a through the flash-decode kernel */
static void decode_tokens(kn_backend *be, const kn_attention_args *a, int t0, int n) {
    kn_attention_args sub = *a;
    sub.q = a->q + (int64_t)t0 * a->q_stride, sub.out = a->out + (int64_t)t0 * a->n_heads * a->kv->head_dim;
    sub.pos = a->pos + t0, sub.seq = a->seq + t0, sub.n_tokens = n;
    sub.pos_host = a->pos_host + t0, sub.seq_host = a->seq_host + t0;
    kn_cuda_flash_decode(be, &sub);
}

void kn_cuda_attention(kn_backend *be, const kn_attention_args *a) {
    if (!a->pos_host || !a->seq_host || a->n_tokens < ATT_GEMM_MIN_RUN) {
        kn_cuda_flash_decode(be, a);
        return;
    }
    /* split the tokens into same-sequence runs of consecutive positions */
    int t = 0, flash_from = 0;
    while (t < a->n_tokens) {
        int e = t + 1;
        while (e < a->n_tokens && a->seq_host[e] == a->seq_host[t] && a->pos_host[e] == a->pos_host[e - 1] + 1) e++;
        if (e - t >= ATT_GEMM_MIN_RUN) {
            if (t > flash_from) { /* the short runs before this one */
                decode_tokens(be, a, flash_from, t - flash_from);
            }
            if (!attention_gemm(be, a, t, e - t)) {
                decode_tokens(be, a, t, e - t);
            }
            flash_from = e;
        }
        t = e;
    }
    if (a->n_tokens > flash_from) {
        decode_tokens(be, a, flash_from, a->n_tokens - flash_from);
    }
}


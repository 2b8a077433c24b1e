/* cuda_attention.cu — paged grouped-query attention on the GPU (the
 * `attention` op of backend.h), flash-style: an online softmax over the keys,
 * so no score row is materialized and any context length works.
 *
 * One block per (query token, KV head, head group, key split). The GB query
 * heads of a group share their KV head, so every cached key/value row is read
 * once for all of them (GQA). Each warp walks a strided subset of the block's
 * keys: lane l owns head dims l, l+32, ... (coalesced 128-byte row reads), the
 * GB dot products are finished with warp butterflies, and each warp keeps a
 * running max m, sum l and unnormalized output per head. Warps are merged in
 * shared memory. When there are few (token, head) pairs — batch-1 decode — the
 * keys are also split across blocks (split-K flash-decode) and a second kernel
 * merges the splits' (m, l, acc) triples. The split count depends only on the
 * batch shape, never on the context length, so a captured CUDA graph stays
 * valid as sequences grow.
 *
 * Prefill runs (>= ATT_GEMM_MIN_RUN consecutive positions of one sequence,
 * known from the host mirrors of pos/seq) go through tensor cores instead:
 * the run's keys/values are gathered from the paged cache into contiguous
 * [kv_head][ctx][hd] buffers, S = Q K^T is one strided-batched GEMM per KV
 * head (its G query heads stacked), a masked softmax writes P, O = P V is a
 * second batched GEMM, and O is scattered back to the token-major output.
 * compute_dtype picks BF16/F16 tensor cores or exact F32 GEMMs.
 *
 * Caches in other formats (base/kv_codec.h) decode in cuda_kv.cu; the GEMM
 * path gathers them through kn_cuda_kv_gather.
 *
 * Invariants: float32 or bf16 K/V slots [n_kv_heads * head_dim] per token
 * here (other formats: cuda_kv.cu), block tables of int32, positions attended
 * [max(0, pos - window + 1), pos]. */
#include <cublas_v2.h>
#include <float.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define ATT_WARPS 4
#define ATT_MAX_SPLITS 32
#define ATT_NEG (-1e30f)

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

/* Per (token, head, split) partial: m, l, then head_dim accumulators. */
/* element i of a float (BF = false) or bf16 (BF = true) K/V store */
template <bool BF> __device__ __forceinline__ float kv_elem(const void *p, int64_t i) {
    if (BF) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    return ((const float *)p)[i];
}

template <int NI, int GB, bool BF>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_flash_attention(kn_attention_args a, kn_kv_layer kv, int n_groups, int n_splits, float *partial) {
    kn_pdl_trigger();
    const int t = blockIdx.x, kvh = blockIdx.y / n_groups, grp = blockIdx.y % n_groups, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = kv.head_dim, bs = kv.block_size;
    const int G = a.n_heads / kv.n_kv_heads, h0 = kvh * G + grp * GB;
    const int64_t slot_w = (int64_t)kv.n_kv_heads * hd;
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    const int p = a.pos[t];
    const int lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0;
    const int n = p - lo + 1, per = (n + n_splits - 1) / n_splits;
    const int j0 = lo + split * per, j1 = min(p + 1, j0 + per);

    float q[GB][NI], acc[GB][NI], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const float *qh = a.q + (int64_t)t * a.q_stride + (int64_t)(h0 + g) * hd;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            q[g][i] = d < hd ? qh[d] * a.scale : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = ATT_NEG, l[g] = 0.0f;
    }
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const int64_t base = ((int64_t)bt[j / bs] * bs + j % bs) * slot_w + (int64_t)kvh * hd;
        float kr[NI], vr[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            kr[i] = d < hd ? kv_elem<BF>(kv.k, base + d) : 0.0f;
            vr[i] = d < hd ? kv_elem<BF>(kv.v, base + d) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++) s += q[g][i] * kr[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
            float mn = fmaxf(m[g], s), c = expf(m[g] - mn), e = expf(s - mn);
            l[g] = l[g] * c + e;
#pragma unroll
            for (int i = 0; i < NI; i++) acc[g][i] = acc[g][i] * c + e * vr[i];
            m[g] = mn;
        }
    }
    /* merge the warps: each writes (m, l, acc) per head, warp 0 combines */
    extern __shared__ float sh[]; /* [ATT_WARPS][GB][2 + 32*NI] */
    const int row = 2 + 32 * NI;
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float *r = sh + ((int64_t)warp * GB + g) * row;
        if (lane == 0) r[0] = m[g], r[1] = l[g];
#pragma unroll
        for (int i = 0; i < NI; i++) r[2 + lane + 32 * i] = acc[g][i];
    }
    __syncthreads();
    for (int g = warp; g < GB; g += ATT_WARPS) {
        float M = ATT_NEG;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sh[((int64_t)w * GB + g) * row]);
        float L = 0.0f, o[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) o[i] = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            const float *r = sh + ((int64_t)w * GB + g) * row;
            float c = expf(r[0] - M);
            L += r[1] * c;
#pragma unroll
            for (int i = 0; i < NI; i++) o[i] += r[2 + lane + 32 * i] * c;
        }
        const int h = h0 + g;
        if (n_splits == 1) {
            float *out = a.out + ((int64_t)t * a.n_heads + h) * hd;
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) out[lane + 32 * i] = o[i] * inv;
        } else {
            float *pr = partial + (((int64_t)t * a.n_heads + h) * n_splits + split) * (2 + hd);
            if (lane == 0) pr[0] = M, pr[1] = L;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) pr[2 + lane + 32 * i] = o[i];
        }
    }
}

/* Merge key splits: one block per (token, head). */
__global__ void k_flash_merge(const float *partial, int n_splits, int hd, int n_heads, float *out) {
    kn_pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pr = partial + ((int64_t)t * n_heads + h) * n_splits * (2 + hd);
    float M = ATT_NEG, L = 0.0f;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, pr[s * (2 + hd)]);
    for (int s = 0; s < n_splits; s++) L += pr[s * (2 + hd) + 1] * expf(pr[s * (2 + hd)] - M);
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) o += pr[s * (2 + hd) + 2 + d] * expf(pr[s * (2 + hd)] - M);
        out[((int64_t)t * n_heads + h) * hd + d] = o * inv;
    }
}

template <int NI, int GB>
static void launch(kn_backend *be, const kn_attention_args *a, int n_groups, int n_splits, float *partial) {
    dim3 grid((unsigned)a->n_tokens, (unsigned)(a->kv->n_kv_heads * n_groups), (unsigned)n_splits);
    size_t smem = (size_t)ATT_WARPS * GB * (2 + 32 * NI) * sizeof(float);
    if (a->kv->k_fmt == KN_KVF_BF16)
        k_flash_attention<NI, GB, true><<<grid, ATT_WARPS * 32, smem, kn_cuda_stream(be)>>>(*a, *a->kv, n_groups,
                                                                                            n_splits, partial);
    else
        k_flash_attention<NI, GB, false><<<grid, ATT_WARPS * 32, smem, kn_cuda_stream(be)>>>(*a, *a->kv, n_groups,
                                                                                             n_splits, partial);
}

template <int NI>
static void launch_ni(kn_backend *be, const kn_attention_args *a, int gb, int n_splits, float *partial) {
    int n_groups = a->n_heads / a->kv->n_kv_heads / gb;
    switch (gb) {
    case 8: launch<NI, 8>(be, a, n_groups, n_splits, partial); break;
    case 4: launch<NI, 4>(be, a, n_groups, n_splits, partial); break;
    case 2: launch<NI, 2>(be, a, n_groups, n_splits, partial); break;
    default: launch<NI, 1>(be, a, n_groups, n_splits, partial); break;
    }
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
    k_gather_q<T><<<dim3(len, a->n_heads), thr, 0, st>>>(a->q, a->q_stride, t0, len, hd, qc);
    const float alpha = a->scale, one = 1.0f, zero = 0.0f;
    /* S_g [G*len, ctx] (row-major) = Q_g [G*len, hd] . K_g^T: column-major C[ctx, G*len] = K_g^T . Q_g */
    cublasStatus_t r = cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, ctx, G * len, hd, &alpha, kc, ct, hd, (long long)ctx * hd, qc, ct, hd,
        (long long)G * len * hd, &zero, S, CUDA_R_32F, ctx, (long long)G * len * ctx, nkv, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS) return 0;
    k_masked_softmax<T><<<a->n_heads * len, 256, 0, st>>>(S, len, ctx, p0, k0, a->window, a->softcap, P);
    /* O_g [G*len, hd] = P_g [G*len, ctx] . V_g [ctx, hd]: column-major C[hd, G*len] = V_g^T' . P_g */
    r = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, hd, G * len, ctx, &one, vc, ct, hd,
                                   (long long)ctx * hd, P, ct, ctx, (long long)G * len * ctx, &zero, ob, CUDA_R_32F,
                                   hd, (long long)G * len * hd, nkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS) return 0;
    k_scatter_out<<<dim3(len, a->n_heads), thr, 0, st>>>(ob, t0, len, a->n_heads, hd, a->out);
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

static void attention_flash(kn_backend *be, const kn_attention_args *a);

void kn_cuda_attention(kn_backend *be, const kn_attention_args *a) {
    if (!a->pos_host || !a->seq_host || a->n_tokens < ATT_GEMM_MIN_RUN) {
        attention_flash(be, a);
        return;
    }
    /* split the tokens into same-sequence runs of consecutive positions */
    const int hd = a->kv->head_dim;
    int t = 0, flash_from = 0;
    kn_attention_args sub = *a;
    while (t < a->n_tokens) {
        int e = t + 1;
        while (e < a->n_tokens && a->seq_host[e] == a->seq_host[t] && a->pos_host[e] == a->pos_host[e - 1] + 1) e++;
        if (e - t >= ATT_GEMM_MIN_RUN) {
            if (t > flash_from) { /* the short runs before this one */
                sub.q = a->q + (int64_t)flash_from * a->q_stride, sub.out = a->out + (int64_t)flash_from * a->n_heads * hd;
                sub.pos = a->pos + flash_from, sub.seq = a->seq + flash_from, sub.n_tokens = t - flash_from;
                attention_flash(be, &sub);
            }
            if (!attention_gemm(be, a, t, e - t)) {
                sub.q = a->q + (int64_t)t * a->q_stride, sub.out = a->out + (int64_t)t * a->n_heads * hd;
                sub.pos = a->pos + t, sub.seq = a->seq + t, sub.n_tokens = e - t;
                attention_flash(be, &sub);
            }
            flash_from = e;
        }
        t = e;
    }
    if (a->n_tokens > flash_from) {
        sub.q = a->q + (int64_t)flash_from * a->q_stride, sub.out = a->out + (int64_t)flash_from * a->n_heads * hd;
        sub.pos = a->pos + flash_from, sub.seq = a->seq + flash_from, sub.n_tokens = a->n_tokens - flash_from;
        attention_flash(be, &sub);
    }
}

static void attention_flash(kn_backend *be, const kn_attention_args *a) {
    const int plain = (a->kv->k_fmt == KN_KVF_F32 && a->kv->v_fmt == KN_KVF_F32) ||
                      (a->kv->k_fmt == KN_KVF_BF16 && a->kv->v_fmt == KN_KVF_BF16);
    if (!plain) { /* compressed rows: cuda_kv.cu */
        kn_cuda_attention_kv(be, a);
        return;
    }
    const int hd = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
    const int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    /* enough blocks to fill the GPU twice over; split keys when the batch
     * shape alone does not */
    const int blocks = a->n_tokens * a->n_heads / gb, target = 2 * kn_cuda_sm_count(be);
    int n_splits = blocks >= target ? 1 : (target + blocks - 1) / blocks;
    if (n_splits > ATT_MAX_SPLITS) n_splits = ATT_MAX_SPLITS;
    if (a->pos_host) { /* no more splits than the context bucket fills (>= 128 keys each) */
        int max_pos = 0;
        for (int t = 0; t < a->n_tokens; t++) max_pos = a->pos_host[t] > max_pos ? a->pos_host[t] : max_pos;
        int by_ctx = (kn_ctx_bucket(max_pos) << KN_CTX_BUCKET_SHIFT) / 128;
        if (n_splits > by_ctx) n_splits = by_ctx > 0 ? by_ctx : 1;
    }
    float *partial = NULL;
    if (n_splits > 1) {
        size_t bytes = (size_t)a->n_tokens * a->n_heads * n_splits * (2 + hd) * sizeof(float);
        partial = (float *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTENTION, bytes);
        if (!partial) n_splits = 1;
    }
    const int ni = (hd + 31) / 32;
    if (ni <= 1) launch_ni<1>(be, a, gb, n_splits, partial);
    else if (ni <= 2) launch_ni<2>(be, a, gb, n_splits, partial);
    else if (ni <= 4) launch_ni<4>(be, a, gb, n_splits, partial);
    else launch_ni<8>(be, a, gb, n_splits, partial);
    if (n_splits > 1) {
        dim3 grid((unsigned)a->n_tokens, (unsigned)a->n_heads);
        k_flash_merge<<<grid, hd >= 128 ? 128 : 64, 0, kn_cuda_stream(be)>>>(partial, n_splits, hd, a->n_heads,
                                                                             a->out);
    }
}

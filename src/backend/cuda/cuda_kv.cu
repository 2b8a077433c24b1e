/* cuda_kv.cu — KV caches in compressed row formats (base/kv_codec.h) on the
 * GPU: quantize-on-write, the fused split-K flash-decode kernel that reads
 * compressed K/V directly, and the per-chunk dequantizing gather the prefill
 * GEMM path uses. The float32 layout stays in cuda_attention.cu.
 *
 * Decode (k_flash_kv): one block per (query token, KV head, head group, key
 * split), as k_flash_attention: lane l of a warp owns head dims l, l+32, ...
 * and decodes exactly those elements of each stored key/value row (no
 * dequantized copy of the cache). tq keys are compared with the query
 * rotated by the same transform (a warp Walsh-Hadamard: shuffles across
 * lanes, register pairs across the lane's elements); rotated values are
 * accumulated in the rotated domain and every output row is un-rotated once
 * after the splits are merged (k_unrotate_rows). The format pair is a
 * template parameter for the presets (the decode switch folds away) and a
 * runtime value otherwise.
 *
 * Encode (k_kv_write_fmt): one thread per (token, KV head) row running the
 * very encoder the CPU runs (kn_kv_encode), so both backends store the same
 * codes up to float rounding.
 *
 * Invariants: head_dim <= 512 (rotated formats: 64/128/256/512), rows of
 * kn_kv_row_bytes(fmt, head_dim) bytes, block tables of int32. */
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define KVF_WARPS 4
#define KVF_MAX_SPLITS 32
#define KVF_NEG (-1e30f)
#define KVF_RUNTIME (-1)

/* ---- quantize on write -------------------------------------------------------- */

__global__ void k_kv_write_fmt(kn_kv_layer kv, const float *k, const float *v, int64_t stride, int n_rows,
                               const int32_t *slots) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows) return;
    const int nkv = kv.n_kv_heads, D = kv.head_dim, t = i / nkv, h = i % nkv;
    float tmp[512];
    const kn_kv_aux ak = {kv.k_tab, kv.signs, kv.k_scale ? kv.k_scale[h] : 1.0f};
    const kn_kv_aux av = {kv.v_tab, kv.signs, kv.v_scale ? kv.v_scale[h] : 1.0f};
    const int64_t kb = kn_kv_row_bytes(kv.k_fmt, D), vb = kn_kv_row_bytes(kv.v_fmt, D);
    const int64_t row = (int64_t)slots[t] * nkv + h;
    kn_kv_encode(kv.k_fmt, k + t * stride + (int64_t)h * D, D, (uint8_t *)kv.k + row * kb, &ak, tmp);
    kn_kv_encode(kv.v_fmt, v + t * stride + (int64_t)h * D, D, (uint8_t *)kv.v + row * vb, &av, tmp);
}

void kn_cuda_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                      int n_tokens, const int32_t *slots) {
    const int rows = n_tokens * kv->n_kv_heads;
    k_kv_write_fmt<<<(rows + 63) / 64, 64, 0, kn_cuda_stream(be)>>>(*kv, k, v, stride, rows, slots);
}

/* ---- warp Walsh-Hadamard ------------------------------------------------------- */

/* x holds elements d = lane + 32 i of a D-vector (D a power of two, D/32 <= NI) */
template <int NI> __device__ __forceinline__ void warp_fwht(float (&x)[NI], int lane, int D) {
    for (int h = 1; h < 32 && h < D; h <<= 1) {
#pragma unroll
        for (int i = 0; i < NI; i++) {
            float o = __shfl_xor_sync(0xffffffffu, x[i], h);
            x[i] = (lane & h) ? o - x[i] : x[i] + o;
        }
    }
#pragma unroll
    for (int m = 1; m < NI; m <<= 1) {
        if (32 * m >= D) break;
#pragma unroll
        for (int i = 0; i < NI; i++)
            if (!(i & m)) {
                float a = x[i], b = x[i | m];
                x[i] = a + b, x[i | m] = a - b;
            }
    }
}

/* rows [n_rows][D] in place: x = s * H(y) / sqrt(D); one warp per row */
template <int NI> __global__ void k_unrotate_rows(float *out, int n_rows, int D, const float *signs) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    float *o = out + (int64_t)row * D;
    float x[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) x[i] = lane + 32 * i < D ? o[lane + 32 * i] : 0.0f;
    warp_fwht<NI>(x, lane, D);
    const float r = rsqrtf((float)D);
#pragma unroll
    for (int i = 0; i < NI; i++)
        if (lane + 32 * i < D) o[lane + 32 * i] = x[i] * r * signs[lane + 32 * i];
}

static void unrotate_rows(kn_backend *be, float *out, int n_rows, int D, const float *signs) {
    const dim3 grid((unsigned)((n_rows + 3) / 4));
    cudaStream_t st = kn_cuda_stream(be);
    if (D <= 64) k_unrotate_rows<2><<<grid, 128, 0, st>>>(out, n_rows, D, signs);
    else if (D <= 128) k_unrotate_rows<4><<<grid, 128, 0, st>>>(out, n_rows, D, signs);
    else if (D <= 256) k_unrotate_rows<8><<<grid, 128, 0, st>>>(out, n_rows, D, signs);
    else k_unrotate_rows<16><<<grid, 128, 0, st>>>(out, n_rows, D, signs);
}

/* ---- fused split-K flash decode over compressed rows ------------------------------ */

template <int NI, int GB, int KF, int VF>
__global__ void __launch_bounds__(KVF_WARPS * 32)
    k_flash_kv(kn_attention_args a, kn_kv_layer kv, int n_groups, int n_splits, float *partial) {
    const int t = blockIdx.x, kvh = blockIdx.y / n_groups, grp = blockIdx.y % n_groups, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = kv.head_dim, bs = kv.block_size, nkv = kv.n_kv_heads;
    const int kf = KF >= 0 ? KF : kv.k_fmt, vf = VF >= 0 ? VF : kv.v_fmt;
    const int G = a.n_heads / nkv, h0 = kvh * G + grp * GB;
    const int64_t kb = kn_kv_row_bytes(kf, hd), vb = kn_kv_row_bytes(vf, hd);
    const uint8_t *K = (const uint8_t *)kv.k, *V = (const uint8_t *)kv.v;
    const kn_kv_aux ak = {kv.k_tab, kv.signs, kv.k_scale ? kv.k_scale[kvh] : 1.0f};
    const kn_kv_aux av = {kv.v_tab, kv.signs, kv.v_scale ? kv.v_scale[kvh] : 1.0f};
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    const int p = a.pos[t];
    const int lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0;
    const int n = p - lo + 1, per = (n + n_splits - 1) / n_splits;
    const int j0 = lo + split * per, j1 = min(p + 1, j0 + per);
    const int krot = kn_kv_fmt_rotated(kf);

    float q[GB][NI], acc[GB][NI], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const float *qh = a.q + (int64_t)t * a.q_stride + (int64_t)(h0 + g) * hd;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            q[g][i] = d < hd ? qh[d] * a.scale * (krot ? kv.signs[d] : 1.0f) : 0.0f;
            acc[g][i] = 0.0f;
        }
        if (krot) { /* compare rotated keys with the rotated query */
            warp_fwht<NI>(q[g], lane, hd);
            const float r = rsqrtf((float)hd);
#pragma unroll
            for (int i = 0; i < NI; i++) q[g][i] *= r;
        }
        m[g] = KVF_NEG, l[g] = 0.0f;
    }
    for (int j = j0 + warp; j < j1; j += KVF_WARPS) {
        const int64_t row = ((int64_t)bt[j / bs] * bs + j % bs) * nkv + kvh;
        const uint8_t *kr_row = K + row * kb, *vr_row = V + row * vb;
        float kr[NI], vr[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            kr[i] = d < hd ? kn_kv_elem(kf, kr_row, d, hd, &ak) : 0.0f;
            vr[i] = d < hd ? kn_kv_elem(vf, vr_row, d, hd, &av) : 0.0f;
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
    extern __shared__ float sh[]; /* [KVF_WARPS][GB][2 + 32*NI] */
    const int rw = 2 + 32 * NI;
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float *r = sh + ((int64_t)warp * GB + g) * rw;
        if (lane == 0) r[0] = m[g], r[1] = l[g];
#pragma unroll
        for (int i = 0; i < NI; i++) r[2 + lane + 32 * i] = acc[g][i];
    }
    __syncthreads();
    for (int g = warp; g < GB; g += KVF_WARPS) {
        float M = KVF_NEG;
        for (int w = 0; w < KVF_WARPS; w++) M = fmaxf(M, sh[((int64_t)w * GB + g) * rw]);
        float L = 0.0f, o[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) o[i] = 0.0f;
        for (int w = 0; w < KVF_WARPS; w++) {
            const float *r = sh + ((int64_t)w * GB + g) * rw;
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

/* merge key splits: one block per (token, head) */
__global__ void k_flash_kv_merge(const float *partial, int n_splits, int hd, int n_heads, float *out) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pr = partial + ((int64_t)t * n_heads + h) * n_splits * (2 + hd);
    float M = KVF_NEG, L = 0.0f;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, pr[s * (2 + hd)]);
    for (int s = 0; s < n_splits; s++) L += pr[s * (2 + hd) + 1] * expf(pr[s * (2 + hd)] - M);
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) o += pr[s * (2 + hd) + 2 + d] * expf(pr[s * (2 + hd)] - M);
        out[((int64_t)t * n_heads + h) * hd + d] = o * inv;
    }
}

template <int NI, int GB, int KF, int VF>
static void launch_kv(kn_backend *be, const kn_attention_args *a, int n_splits, float *partial) {
    const int n_groups = a->n_heads / a->kv->n_kv_heads / GB;
    dim3 grid((unsigned)a->n_tokens, (unsigned)(a->kv->n_kv_heads * n_groups), (unsigned)n_splits);
    size_t smem = (size_t)KVF_WARPS * GB * (2 + 32 * NI) * sizeof(float);
    k_flash_kv<NI, GB, KF, VF><<<grid, KVF_WARPS * 32, smem, kn_cuda_stream(be)>>>(*a, *a->kv, n_groups, n_splits,
                                                                                   partial);
}

template <int NI, int KF, int VF>
static void launch_gb(kn_backend *be, const kn_attention_args *a, int gb, int n_splits, float *partial) {
    switch (gb) {
    case 8: launch_kv<NI, 8, KF, VF>(be, a, n_splits, partial); break;
    case 4: launch_kv<NI, 4, KF, VF>(be, a, n_splits, partial); break;
    case 2: launch_kv<NI, 2, KF, VF>(be, a, n_splits, partial); break;
    default: launch_kv<NI, 1, KF, VF>(be, a, n_splits, partial); break;
    }
}

/* presets: 64 <= head_dim <= 256 (NI 2..8) with the pair folded in */
template <int KF, int VF>
static void launch_preset(kn_backend *be, const kn_attention_args *a, int ni, int gb, int n_splits, float *partial) {
    if (ni <= 2) launch_gb<2, KF, VF>(be, a, gb, n_splits, partial);
    else if (ni <= 4) launch_gb<4, KF, VF>(be, a, gb, n_splits, partial);
    else launch_gb<8, KF, VF>(be, a, gb, n_splits, partial);
}

static void launch_runtime(kn_backend *be, const kn_attention_args *a, int ni, int gb, int n_splits, float *partial) {
    const int R = KVF_RUNTIME;
    if (ni <= 1) launch_gb<1, R, R>(be, a, gb, n_splits, partial);
    else if (ni <= 2) launch_gb<2, R, R>(be, a, gb, n_splits, partial);
    else if (ni <= 4) launch_gb<4, R, R>(be, a, gb, n_splits, partial);
    else if (ni <= 8) launch_gb<8, R, R>(be, a, gb, n_splits, partial);
    else launch_gb<16, R, R>(be, a, gb < 2 ? gb : 2, n_splits, partial); /* head_dim 512: registers allow 2 heads */
}

void kn_cuda_attention_kv(kn_backend *be, const kn_attention_args *a) {
    const kn_kv_layer *kv = a->kv;
    const int hd = kv->head_dim, G = a->n_heads / kv->n_kv_heads;
    const int ni = (hd + 31) / 32;
    int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    if (ni > 8 && gb > 2) gb = 2;
    /* as attention_flash: fill the GPU twice over, splitting keys when the
     * batch shape alone does not; never more splits than the context
     * bucket fills (>= 128 keys each), so recorded graphs stay valid */
    const int blocks = a->n_tokens * a->n_heads / gb, target = 2 * kn_cuda_sm_count(be);
    int n_splits = blocks >= target ? 1 : (target + blocks - 1) / blocks;
    if (n_splits > KVF_MAX_SPLITS) n_splits = KVF_MAX_SPLITS;
    if (a->pos_host) {
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
    const int kf = kv->k_fmt, vf = kv->v_fmt, preset_dim = ni >= 2 && ni <= 8;
    if (preset_dim && kf == KN_KVF_BF16 && vf == KN_KVF_BF16) launch_preset<KN_KVF_BF16, KN_KVF_BF16>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_FP8 && vf == KN_KVF_FP8) launch_preset<KN_KVF_FP8, KN_KVF_FP8>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_Q8 && vf == KN_KVF_Q8) launch_preset<KN_KVF_Q8, KN_KVF_Q8>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_Q4 && vf == KN_KVF_Q4) launch_preset<KN_KVF_Q4, KN_KVF_Q4>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_Q8A && vf == KN_KVF_TQV3) launch_preset<KN_KVF_Q8A, KN_KVF_TQV3>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_TQ4 && vf == KN_KVF_TQ4) launch_preset<KN_KVF_TQ4, KN_KVF_TQ4>(be, a, ni, gb, n_splits, partial);
    else if (preset_dim && kf == KN_KVF_TQ4 && vf == KN_KVF_TQV3) launch_preset<KN_KVF_TQ4, KN_KVF_TQV3>(be, a, ni, gb, n_splits, partial);
    else launch_runtime(be, a, ni, gb, n_splits, partial);
    if (n_splits > 1) {
        dim3 grid((unsigned)a->n_tokens, (unsigned)a->n_heads);
        k_flash_kv_merge<<<grid, hd >= 128 ? 128 : 64, 0, kn_cuda_stream(be)>>>(partial, n_splits, hd, a->n_heads,
                                                                                a->out);
    }
    if (kn_kv_fmt_rotated(vf)) unrotate_rows(be, a->out, a->n_tokens * a->n_heads, hd, kv->signs);
}

/* ---- prefill: dequantize one chunk for the GEMM path ----------------------------- */

template <typename T> __device__ __forceinline__ T kv_to(float v);
template <> __device__ __forceinline__ float kv_to<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 kv_to<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half kv_to<__half>(float v) { return __float2half(v); }

/* rotated-domain row in sh[D] -> original domain, in place (block-wide) */
__device__ void block_unrotate(float *sh, int D, const float *signs) {
    for (int h = 1; h < D; h <<= 1) {
        __syncthreads();
        for (int e = threadIdx.x; e < D / 2; e += blockDim.x) {
            const int i = (e / h) * 2 * h + e % h;
            float a = sh[i], b = sh[i + h];
            sh[i] = a + b, sh[i + h] = a - b;
        }
    }
    __syncthreads();
    const float r = rsqrtf((float)D);
    for (int d = threadIdx.x; d < D; d += blockDim.x) sh[d] *= r * signs[d];
    __syncthreads();
}

/* K/V of positions [k0, k0 + ctx) of one sequence -> kc/vc [n_kv][ctx][hd] */
template <typename T>
__global__ void k_gather_kv_fmt(kn_kv_layer kv, const int32_t *bt, int k0, int ctx, T *kc, T *vc) {
    __shared__ float sk[512], sv[512];
    const int j = blockIdx.x, g = blockIdx.y, hd = kv.head_dim, bs = kv.block_size, p = k0 + j;
    const int64_t row = ((int64_t)bt[p / bs] * bs + p % bs) * kv.n_kv_heads + g;
    const uint8_t *kr = (const uint8_t *)kv.k + row * kn_kv_row_bytes(kv.k_fmt, hd);
    const uint8_t *vr = (const uint8_t *)kv.v + row * kn_kv_row_bytes(kv.v_fmt, hd);
    const kn_kv_aux ak = {kv.k_tab, kv.signs, kv.k_scale ? kv.k_scale[g] : 1.0f};
    const kn_kv_aux av = {kv.v_tab, kv.signs, kv.v_scale ? kv.v_scale[g] : 1.0f};
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        sk[d] = kn_kv_elem(kv.k_fmt, kr, d, hd, &ak), sv[d] = kn_kv_elem(kv.v_fmt, vr, d, hd, &av);
    if (kn_kv_fmt_rotated(kv.k_fmt)) block_unrotate(sk, hd, kv.signs);
    if (kn_kv_fmt_rotated(kv.v_fmt)) block_unrotate(sv, hd, kv.signs);
    __syncthreads();
    const int64_t dst = ((int64_t)g * ctx + j) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) kc[dst + d] = kv_to<T>(sk[d]), vc[dst + d] = kv_to<T>(sv[d]);
}

void kn_cuda_kv_gather(kn_backend *be, const kn_kv_layer *kv, const int32_t *bt, int k0, int ctx, void *kc, void *vc,
                       int elem) {
    const dim3 grid((unsigned)ctx, (unsigned)kv->n_kv_heads);
    cudaStream_t st = kn_cuda_stream(be);
    if (elem == KN_DT_BF16)
        k_gather_kv_fmt<__nv_bfloat16><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc);
    else if (elem == KN_DT_F16)
        k_gather_kv_fmt<__half><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (__half *)kc, (__half *)vc);
    else k_gather_kv_fmt<float><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (float *)kc, (float *)vc);
}

/* cuda_kv.cu — the KV cache's row formats on the GPU: quantize-on-write for
 * the compressed formats (base/kv_codec.h), the split-K flash-decode kernel
 * every format's decode attention runs (float32 and bf16 rows included), and
 * the per-chunk dequantizing gather the prefill GEMM path uses.
 *
 * Decode (k_flash_kv): one block per (query token, KV head, head group, key
 * split). The GB query heads of a group share their KV head, so every cached
 * row is read once for all of them (GQA). Lane l of a warp owns head dims l,
 * l+32, ... and decodes exactly those elements of each stored key/value row
 * (no dequantized copy of the cache); each warp walks a strided subset of the
 * split's keys, several rows' loads in flight at once, keeping a running max
 * m, sum l and unnormalized output per head, and the warps meet in shared
 * memory. When the batch shape alone does not fill the GPU (batch-1 decode)
 * the keys are split across blocks; the last block of a head group to finish
 * merges the splits' (m, l, acc) triples, so one launch does it all. tq keys
 * are compared with the query rotated by the same transform (a warp
 * Walsh-Hadamard: shuffles across lanes, register pairs across the lane's
 * elements); rotated values are accumulated in the rotated domain and every
 * output row is un-rotated once as it is written (write_head). The format
 * pair is a template parameter for the presets (the decode switch folds away)
 * and a runtime value otherwise.
 *
 * Encode (k_kv_write_fmt): one thread per (token, KV head) row running the
 * very encoder the CPU runs (kn_kv_encode), so both backends store the same
 * codes up to float rounding.
 *
 * Invariants: head_dim <= 512 (rotated formats: 64/128/256/512), rows of
 * kn_kv_row_bytes(fmt, head_dim) bytes, block tables of int32, positions
 * attended [max(0, pos - window + 1), pos]. */
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define KVF_WARPS 4
#define KVF_MAX_SPLITS 128
#define KVF_MIN_SPLIT_KEYS 32
#define KVF_WARP_KEYS 64
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

/* ---- quantize on write, a warp per row ----------------------------------------- */

/* Formats whose groups are whole 32-element lane sets, encoded by a warp:
 * lane l holds elements d = l + 32 i, group statistics are warp reductions,
 * bit-packed codes are OR-reduced across the warp and written bytewise. The
 * arithmetic per element is the codec's (kn_kv_encode); sums of squares are
 * added in a different order, so a scale can differ from the host's in its
 * last bit. */
__host__ __device__ static inline int warp_encodes(int f, int D) {
    if (D % 32 || D > 512) return 0;
    if (f == KN_KVF_F32 || f == KN_KVF_BF16 || (f == KN_KVF_Q8A && kn_kv_fmt_group(f, D) == 32)) return 1;
    return kn_kv_fmt_rotated(f) && (D & (D - 1)) == 0;
}

__device__ __forceinline__ float warp_sum_kv(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* lane's b-bit code c of element i * 32 + lane -> the 4b bytes of group i */
__device__ __forceinline__ void put_group_codes(uint8_t *codes, int i, int b, unsigned c, int lane) {
    uint32_t word[4];
#pragma unroll
    for (int w = 0; w < 4; w++) {
        if (w >= b) break;
        const int sh = lane * b - 32 * w; /* where the lane's bits start inside word w */
        const uint32_t part = sh >= 32 || sh <= -b ? 0u : sh >= 0 ? c << sh : c >> -sh;
        word[w] = __reduce_or_sync(0xffffffffu, part);
    }
    if (lane < 4 * b) codes[i * 4 * b + lane] = (uint8_t)(word[lane >> 2] >> (8 * (lane & 3)));
}

template <int NI>
__device__ void encode_row_warp(int f, const float *x, int D, uint8_t *row, const kn_kv_aux *aux, int lane) {
    float y[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) y[i] = lane + 32 * i < D ? x[lane + 32 * i] : 0.0f;
    const int ng = D / 32;
    if (f == KN_KVF_F32 || f == KN_KVF_BF16) {
#pragma unroll
        for (int i = 0; i < NI; i++) {
            if (i >= ng) break;
            const int d = lane + 32 * i;
            if (f == KN_KVF_F32) ((float *)row)[d] = y[i];
            else kn_kv_half_put(row, d, kn_kv_f32_to_bf16(y[i]));
        }
        return;
    }
    if (f == KN_KVF_Q8A) {
#pragma unroll
        for (int i = 0; i < NI; i++) {
            if (i >= ng) break;
            float mn = y[i], mx = y[i];
            for (int o = 16; o > 0; o >>= 1)
                mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o)), mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float s = fmaxf((mx - mn) / 254.0f, fabsf(mx + mn) * 0.5f / 2048.0f);
            const uint16_t sh = kn_kv_scale_f16(s);
            s = kn_kv_f16_to_f32(sh);
            float z = s > 0.0f ? rintf((mx + mn) * 0.5f / s) : 0.0f;
            z = z == z ? fminf(fmaxf(z, -2048.0f), 2048.0f) : 0.0f;
            if (lane == 0) kn_kv_half_put(row, i, sh), kn_kv_half_put(row, ng + i, kn_kv_f32_to_f16(z));
            float q = s > 0.0f ? rintf(y[i] / s) - z : 0.0f;
            q = fminf(fmaxf(q, -127.0f), 127.0f);
            row[4 * ng + 32 * i + lane] = (uint8_t)(int8_t)(q == q ? q : 0.0f);
        }
        return;
    }
    /* rotated formats: y = H(x * signs) / sqrt(D) */
    const int b = kn_kv_fmt_bits(f), L = 1 << b;
#pragma unroll
    for (int i = 0; i < NI; i++) y[i] *= lane + 32 * i < D ? aux->signs[lane + 32 * i] : 0.0f;
    warp_fwht<NI>(y, lane, D);
    const float r = 1.0f / sqrtf((float)D);
#pragma unroll
    for (int i = 0; i < NI; i++) y[i] *= r;
    if (kn_kv_fmt_is_tq(f)) { /* one norm per row, corrected by the codes' own norm */
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++) ss += y[i] * y[i];
        const float n = sqrtf(warp_sum_kv(ss)), inv = n > 0.0f ? 1.0f / n : 0.0f;
        float cc = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            if (i >= ng) break;
            const unsigned c = kn_kv_lm_code(y[i] * inv, aux->tab + L, L);
            cc += aux->tab[c] * aux->tab[c];
            put_group_codes(row + 2, i, b, c, lane);
        }
        cc = warp_sum_kv(cc);
        if (lane == 0) kn_kv_half_put(row, 0, kn_kv_scale_f16(cc > 0.0f ? n / sqrtf(cc) : 0.0f));
        return;
    }
#pragma unroll
    for (int i = 0; i < NI; i++) { /* tqv: an RMS scale per 32 */
        if (i >= ng) break;
        const uint16_t sh = kn_kv_scale_f16(sqrtf(warp_sum_kv(y[i] * y[i]) / 32.0f));
        const float s = kn_kv_f16_to_f32(sh), inv = s > 0.0f ? 1.0f / s : 0.0f;
        if (lane == 0) kn_kv_half_put(row, i, sh);
        put_group_codes(row + 2 * ng, i, b, kn_kv_lm_code(y[i] * inv, aux->tab + L, L), lane);
    }
}

/* one warp per (token, KV head) row: its key, then its value */
template <int NI>
__global__ void k_kv_write_warp(kn_kv_layer kv, const float *k, const float *v, int64_t stride, int n_rows,
                                const int32_t *slots) {
    kn_pdl_trigger();
    kn_pdl_wait();
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= n_rows) return;
    const int nkv = kv.n_kv_heads, D = kv.head_dim, t = i / nkv, h = i % nkv;
    const kn_kv_aux ak = {kv.k_tab, kv.signs, kv.k_scale ? kv.k_scale[h] : 1.0f};
    const kn_kv_aux av = {kv.v_tab, kv.signs, kv.v_scale ? kv.v_scale[h] : 1.0f};
    const int64_t row = (int64_t)slots[t] * nkv + h;
    encode_row_warp<NI>(kv.k_fmt, k + t * stride + (int64_t)h * D, D,
                        (uint8_t *)kv.k + row * kn_kv_row_bytes(kv.k_fmt, D), &ak, lane);
    encode_row_warp<NI>(kv.v_fmt, v + t * stride + (int64_t)h * D, D,
                        (uint8_t *)kv.v + row * kn_kv_row_bytes(kv.v_fmt, D), &av, lane);
}

void kn_cuda_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                      int n_tokens, const int32_t *slots) {
    const int rows = n_tokens * kv->n_kv_heads, D = kv->head_dim;
    if (warp_encodes(kv->k_fmt, D) && warp_encodes(kv->v_fmt, D)) { /* a warp per row */
        const dim3 grid((unsigned)((rows + 3) / 4)), block(128);
        if (D <= 64) kn_cuda_launch(be, k_kv_write_warp<2>, grid, block, 0, *kv, k, v, stride, rows, slots);
        else if (D <= 128) kn_cuda_launch(be, k_kv_write_warp<4>, grid, block, 0, *kv, k, v, stride, rows, slots);
        else if (D <= 256) kn_cuda_launch(be, k_kv_write_warp<8>, grid, block, 0, *kv, k, v, stride, rows, slots);
        else kn_cuda_launch(be, k_kv_write_warp<16>, grid, block, 0, *kv, k, v, stride, rows, slots);
        return;
    }
    k_kv_write_fmt<<<(rows + 63) / 64, 64, 0, kn_cuda_stream(be)>>>(*kv, k, v, stride, rows, slots);
}

/* one head's normalized output o (elements lane + 32 i) -> out; values
 * stored rotated are un-rotated here, x = s * H(y) / sqrt(D) */
template <int NI>
__device__ __forceinline__ void write_head(float (&o)[NI], float *out, int D, int lane, int rotated, const float *signs) {
    if (rotated) {
        warp_fwht<NI>(o, lane, D);
        const float r = rsqrtf((float)D);
#pragma unroll
        for (int i = 0; i < NI; i++) o[i] = lane + 32 * i < D ? o[i] * r * signs[lane + 32 * i] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < NI; i++)
        if (lane + 32 * i < D) out[lane + 32 * i] = o[i];
}

/* ---- fused split-K flash decode ------------------------------------------------- */

/* element d of a stored row: plain formats by one aligned load, the others
 * through the shared codec */
template <int KF>
__device__ __forceinline__ float kv_at(int f, const uint8_t *row, int d, int hd, const kn_kv_aux *aux) {
    const uint16_t *h = (const uint16_t *)row; /* every row and field below is 2-byte aligned */
    if (KF == KN_KVF_BF16) return __uint_as_float((uint32_t)h[d] << 16);
    if (KF == KN_KVF_F32) return ((const float *)row)[d];
    if (KF == KN_KVF_Q8A) { /* groups of 32 (head_dim >= 32): scale, zero, int8 code */
        const int ng = hd / 32, g = d / 32;
        return __half2float(__ushort_as_half(h[g])) *
               ((float)(int8_t)row[4 * ng + d] + __half2float(__ushort_as_half(h[ng + g])));
    }
    if (KF == KN_KVF_TQV2 || KF == KN_KVF_TQV3 || KF == KN_KVF_TQV4) {
        const int b = KF == KN_KVF_TQV2 ? 2 : KF == KN_KVF_TQV3 ? 3 : 4;
        return __half2float(__ushort_as_half(h[d / 32])) * aux->tab[kn_kv_code(row + 2 * (hd / 32), d, b)];
    }
    return kn_kv_elem(f, row, d, hd, aux);
}

/* The last of a (token, head group)'s n_splits blocks to finish merges their
 * partials; true in that block. Each block's partial writes are made visible
 * before it counts itself; the last one resets the counter for the next
 * launch. */
__device__ __forceinline__ bool split_is_last(int *counter, int n_splits) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == n_splits - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* one head's n_splits (<= KVF_MAX_SPLITS) partials (m, l, acc[hd]) -> out[hd];
 * a warp. Every split's m and l are loaded at once (lane l holds splits
 * l, l + 32, ...), so the merge costs one round trip before the accumulators
 * are read; the splits are added in order. */
template <int NI>
__device__ __forceinline__ void merge_splits(const float *pr, int n_splits, int hd, float *out, int lane, int rotated,
                                             const float *signs) {
    constexpr int SK = KVF_MAX_SPLITS / 32;
    const int rw = 2 + hd;
    float ms[SK], c[SK], M = KVF_NEG, L = 0.0f;
#pragma unroll
    for (int k = 0; k < SK; k++) {
        const int sp = lane + 32 * k;
        ms[k] = sp < n_splits ? __ldcg(pr + sp * rw) : KVF_NEG;
        c[k] = sp < n_splits ? __ldcg(pr + sp * rw + 1) : 0.0f; /* l, for now */
        M = fmaxf(M, ms[k]);
    }
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll
    for (int k = 0; k < SK; k++) {
        const float e = lane + 32 * k < n_splits ? expf(ms[k] - M) : 0.0f;
        L += c[k] * e;
        c[k] = e;
    }
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    float acc[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) acc[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < SK; k++) {
        const int n = n_splits - 32 * k < 32 ? n_splits - 32 * k : 32;
        for (int j = 0; j < n; j++) {
            const float cs = __shfl_sync(0xffffffffu, c[k], j);
            const float *ps = pr + (32 * k + j) * rw + 2;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) acc[i] += __ldcg(ps + lane + 32 * i) * cs;
        }
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < NI; i++) acc[i] *= inv;
    write_head<NI>(acc, out, hd, lane, rotated, signs);
}

template <int NI, int GB, int KF, int VF>
__global__ void __launch_bounds__(KVF_WARPS * 32)
    k_flash_kv(kn_attention_args a, kn_kv_layer kv, int n_groups, int n_splits, float *partial, int *counters) {
    /* keys whose loads are issued together by a warp: registers permitting,
     * fewer for decoded formats (code size), one for the runtime switch */
    constexpr bool plain = (KF == KN_KVF_F32 || KF == KN_KVF_BF16) && (VF == KN_KVF_F32 || VF == KN_KVF_BF16);
    constexpr int UF = KF < 0 || VF < 0 ? 1 : plain ? 4 : 2;
    constexpr int UR = NI * GB <= 16 ? 4 : NI * GB <= 32 ? 2 : 1;
    constexpr int U = UF < UR ? UF : UR;
    kn_pdl_trigger();
    kn_pdl_wait(); /* q, the cache and the positions come from earlier kernels */
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
    /* warp w takes keys j0 + w, j0 + w + KVF_WARPS, ... in order, U at a time:
     * all U rows are loaded before the first is used */
    for (int j = j0 + warp; j < j1; j += KVF_WARPS * U) {
        float kr[U][NI], vr[U][NI];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int jj = j + u * KVF_WARPS < j1 ? j + u * KVF_WARPS : j; /* past the split: reload j, unused */
            const int64_t row = ((int64_t)bt[jj / bs] * bs + jj % bs) * nkv + kvh;
            const uint8_t *kr_row = K + row * kb, *vr_row = V + row * vb;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                int d = lane + 32 * i;
                kr[u][i] = d < hd ? kv_at<KF>(kf, kr_row, d, hd, &ak) : 0.0f;
                vr[u][i] = d < hd ? kv_at<VF>(vf, vr_row, d, hd, &av) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j + u * KVF_WARPS >= j1) break; /* warp-uniform */
#pragma unroll
            for (int g = 0; g < GB; g++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < NI; i++) s += q[g][i] * kr[u][i];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
                float mn = fmaxf(m[g], s), c = expf(m[g] - mn), e = expf(s - mn);
                l[g] = l[g] * c + e;
#pragma unroll
                for (int i = 0; i < NI; i++) acc[g][i] = acc[g][i] * c + e * vr[u][i];
                m[g] = mn;
            }
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
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++) o[i] *= inv;
            write_head<NI>(o, a.out + ((int64_t)t * a.n_heads + h) * hd, hd, lane, kn_kv_fmt_rotated(vf), kv.signs);
        } else {
            float *pr = partial + (((int64_t)t * a.n_heads + h) * n_splits + split) * (2 + hd);
            if (lane == 0) pr[0] = M, pr[1] = L;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) pr[2 + lane + 32 * i] = o[i];
        }
    }
    /* split-K: the group's last block merges every split (no second kernel) */
    if (n_splits > 1 && split_is_last(counters + (int64_t)t * gridDim.y + blockIdx.y, n_splits))
        for (int g = warp; g < GB; g += KVF_WARPS) {
            const int64_t th = (int64_t)t * a.n_heads + h0 + g;
            merge_splits<NI>(partial + th * n_splits * (2 + hd), n_splits, hd, a.out + th * hd, lane,
                             kn_kv_fmt_rotated(vf), kv.signs);
        }
}

/* one decode launch: the key-split count and, when split, its scratch */
typedef struct {
    int n_splits;
    float *partial; /* [token][head][split][2 + head_dim] */
    int *counters;  /* [token][KV head x head group], zero between launches */
} flash_plan;

template <int NI, int GB, int KF, int VF> static void launch_kv(kn_backend *be, const kn_attention_args *a, flash_plan f) {
    const int n_groups = a->n_heads / a->kv->n_kv_heads / GB;
    dim3 grid((unsigned)a->n_tokens, (unsigned)(a->kv->n_kv_heads * n_groups), (unsigned)f.n_splits);
    size_t smem = (size_t)KVF_WARPS * GB * (2 + 32 * NI) * sizeof(float);
    kn_cuda_launch(be, k_flash_kv<NI, GB, KF, VF>, grid, dim3(KVF_WARPS * 32), smem, *a, *a->kv, n_groups, f.n_splits,
                   f.partial, f.counters);
}

template <int NI, int KF, int VF> static void launch_gb(kn_backend *be, const kn_attention_args *a, int gb, flash_plan f) {
    switch (gb) {
    case 8: launch_kv<NI, 8, KF, VF>(be, a, f); break;
    case 4: launch_kv<NI, 4, KF, VF>(be, a, f); break;
    case 2: launch_kv<NI, 2, KF, VF>(be, a, f); break;
    default: launch_kv<NI, 1, KF, VF>(be, a, f); break;
    }
}

/* presets: 64 <= head_dim <= 256 (NI 2..8) with the pair folded in */
template <int KF, int VF> static void launch_preset(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    if (ni <= 2) launch_gb<2, KF, VF>(be, a, gb, f);
    else if (ni <= 4) launch_gb<4, KF, VF>(be, a, gb, f);
    else launch_gb<8, KF, VF>(be, a, gb, f);
}

static void launch_runtime(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    const int R = KVF_RUNTIME;
    if (ni <= 1) launch_gb<1, R, R>(be, a, gb, f);
    else if (ni <= 2) launch_gb<2, R, R>(be, a, gb, f);
    else if (ni <= 4) launch_gb<4, R, R>(be, a, gb, f);
    else if (ni <= 8) launch_gb<8, R, R>(be, a, gb, f);
    else launch_gb<16, R, R>(be, a, gb < 2 ? gb : 2, f); /* head_dim 512: registers allow 2 heads */
}

/* Enough blocks to fill the GPU twice over, splitting keys when the batch
 * shape alone does not, and at long contexts enough splits that a warp walks
 * at most ~KVF_WARP_KEYS keys; never more splits than the context bucket
 * fills with KVF_MIN_SPLIT_KEYS keys each, so the count depends only on the
 * batch shape and the bucket and recorded graphs stay valid as sequences
 * grow. */
static flash_plan plan_splits(kn_backend *be, const kn_attention_args *a, int gb) {
    flash_plan f = {1, NULL, NULL};
    const int hd = a->kv->head_dim;
    const int blocks = a->n_tokens * a->n_heads / gb, target = 2 * kn_cuda_sm_count(be);
    int n = blocks >= target ? 1 : (target + blocks - 1) / blocks;
    if (a->pos_host) {
        int max_pos = 0;
        for (int t = 0; t < a->n_tokens; t++) max_pos = a->pos_host[t] > max_pos ? a->pos_host[t] : max_pos;
        const int keys = kn_ctx_bucket(max_pos) << KN_CTX_BUCKET_SHIFT, by_ctx = keys / KVF_MIN_SPLIT_KEYS;
        /* long contexts: no more than KVF_WARP_KEYS keys per warp where the
         * split count allows (each warp walks its keys one batch at a time) */
        const int by_latency = keys / (KVF_WARPS * KVF_WARP_KEYS);
        if (blocks < target && n < by_latency) n = by_latency;
        if (n > by_ctx) n = by_ctx > 0 ? by_ctx : 1;
    }
    if (n > KVF_MAX_SPLITS) n = KVF_MAX_SPLITS;
    if (n <= 1) return f;
    f.partial = (float *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTENTION,
                                         (size_t)a->n_tokens * a->n_heads * n * (2 + hd) * sizeof(float));
    f.counters = (int *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_SPLIT_COUNT, (size_t)a->n_tokens * (a->n_heads / gb) * sizeof(int));
    if (f.partial && f.counters) f.n_splits = n;
    return f;
}

void kn_cuda_flash_decode(kn_backend *be, const kn_attention_args *a) {
    const kn_kv_layer *kv = a->kv;
    const int hd = kv->head_dim, G = a->n_heads / kv->n_kv_heads;
    const int ni = (hd + 31) / 32;
    int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    if (ni > 8 && gb > 2) gb = 2;
    const flash_plan f = plan_splits(be, a, gb);
    const int kf = kv->k_fmt, vf = kv->v_fmt, preset_dim = ni >= 2 && ni <= 8;
    if (preset_dim && kf == KN_KVF_BF16 && vf == KN_KVF_BF16) launch_preset<KN_KVF_BF16, KN_KVF_BF16>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_F32 && vf == KN_KVF_F32) launch_preset<KN_KVF_F32, KN_KVF_F32>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_FP8 && vf == KN_KVF_FP8) launch_preset<KN_KVF_FP8, KN_KVF_FP8>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_Q8 && vf == KN_KVF_Q8) launch_preset<KN_KVF_Q8, KN_KVF_Q8>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_Q4 && vf == KN_KVF_Q4) launch_preset<KN_KVF_Q4, KN_KVF_Q4>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_Q8A && vf == KN_KVF_TQV3) launch_preset<KN_KVF_Q8A, KN_KVF_TQV3>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_TQ4 && vf == KN_KVF_TQ4) launch_preset<KN_KVF_TQ4, KN_KVF_TQ4>(be, a, ni, gb, f);
    else if (preset_dim && kf == KN_KVF_TQ4 && vf == KN_KVF_TQV3) launch_preset<KN_KVF_TQ4, KN_KVF_TQV3>(be, a, ni, gb, f);
    else launch_runtime(be, a, ni, gb, f);
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

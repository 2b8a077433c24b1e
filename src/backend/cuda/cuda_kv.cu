/* cuda_kv.cu — the KV cache's row formats on the GPU: quantize-on-write for
 * the compressed formats (base/kv_codec.h), the planning and dispatch of the
 * split-K flash-decode kernel every format's decode attention runs
 * (cuda_flash_decode.cuh; float32 and bf16 rows included), and the per-chunk
 * dequantizing gather the prefill GEMM path uses.
 *
 * Encode: a warp per (token, KV head) row where the format's groups are whole
 * 32-element lane sets (k_kv_write_warp), else one thread per row running the
 * very encoder the CPU runs (k_kv_write_fmt, kn_kv_encode); both store the
 * CPU's codes up to float rounding.
 *
 * Invariants: head_dim <= 512 (rotated formats: 64/128/256/512), rows of
 * kn_kv_row_bytes(fmt, head_dim) bytes, block tables of int32. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_flash_decode.cuh"

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

/* the row's elements d = lane + 32 i in y (zero past D) -> row */
template <int NI>
__device__ void encode_vals_warp(int f, float (&y)[NI], int D, uint8_t *row, const kn_kv_aux *aux, int lane) {
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

template <int NI>
__device__ void encode_row_warp(int f, const float *x, int D, uint8_t *row, const kn_kv_aux *aux, int lane) {
    float y[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) y[i] = lane + 32 * i < D ? x[lane + 32 * i] : 0.0f;
    encode_vals_warp<NI>(f, y, D, row, aux, lane);
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

/* RoPE and the cache write in one launch, for the formats a warp encodes: a
 * warp per (token, head) of the n_q query heads, the key heads that follow
 * them in x, and then the value heads. A query or key warp rotates its head
 * in registers (full rotary over D = 32 NI: the pair d, d + D/2 is in one
 * lane, elements i and i + NI/2; rope_block's arithmetic) and writes it
 * back; a key warp then encodes the rotated key, a value warp its value row,
 * as k_kv_write_warp does. Keys and values on separate warps halve the
 * dependent chain of a decode step (one token: the launch is latency). */
template <int NI>
__global__ void k_rope_kv_write_warp(kn_kv_layer kv, float *x, const float *__restrict__ v, int64_t stride,
                                     int n_tokens, int n_q, const int32_t *pos, const float *__restrict__ inv_freq,
                                     float scale, const int32_t *slots) {
    kn_pdl_trigger();
    const int nkv = kv.n_kv_heads, nh = n_q + 2 * nkv, D = 32 * NI;
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= n_tokens * nh) return;
    const int t = i / nh, h = i % nh;
    float f[NI / 2];
#pragma unroll
    for (int e = 0; e < NI / 2; e++) f[e] = __ldg(inv_freq + lane + 32 * e); /* constant: before the wait */
    kn_pdl_wait();
    float y[NI];
    if (h >= n_q + nkv) { /* a value head */
        const int hv = h - n_q - nkv;
        const kn_kv_aux av = {kv.v_tab, kv.signs, kv.v_scale ? kv.v_scale[hv] : 1.0f};
        const int64_t row = (int64_t)slots[t] * nkv + hv;
        encode_row_warp<NI>(kv.v_fmt, v + t * stride + (int64_t)hv * D, D,
                            (uint8_t *)kv.v + row * kn_kv_row_bytes(kv.v_fmt, D), &av, lane);
        return;
    }
    float *xr = x + t * stride + (int64_t)h * D;
#pragma unroll
    for (int e = 0; e < NI; e++) y[e] = xr[lane + 32 * e];
    const float p = (float)pos[t];
#pragma unroll
    for (int e = 0; e < NI / 2; e++) {
        float sn, c;
        sincosf(p * f[e], &sn, &c);
        c *= scale, sn *= scale;
        kn_rope_rotate(y[e], y[e + NI / 2], c, sn);
    }
#pragma unroll
    for (int e = 0; e < NI; e++) xr[lane + 32 * e] = y[e];
    if (h < n_q) return;
    const int hk = h - n_q;
    const kn_kv_aux ak = {kv.k_tab, kv.signs, kv.k_scale ? kv.k_scale[hk] : 1.0f};
    const int64_t row = (int64_t)slots[t] * nkv + hk;
    encode_vals_warp<NI>(kv.k_fmt, y, D, (uint8_t *)kv.k + row * kn_kv_row_bytes(kv.k_fmt, D), &ak, lane);
}

int kn_cuda_rope_kv_write(kn_backend *be, float *qk, const float *v, int64_t stride, int n_tokens, int n_q,
                          const int32_t *pos, const kn_rope_table *r, const kn_kv_layer *kv, const int32_t *slots) {
    const int D = kv->head_dim, rows = n_tokens * (n_q + 2 * kv->n_kv_heads);
    if (r->rot_dim != D || !warp_encodes(kv->k_fmt, D) || !warp_encodes(kv->v_fmt, D) || n_tokens < 1) return 0;
    const dim3 grid((unsigned)((rows + 3) / 4)), block(128);
    switch (D) {
    case 64: kn_cuda_run(be, "rope_kv_write_warp", k_rope_kv_write_warp<2>, grid, block, 0, *kv, qk, v, stride,
                         n_tokens, n_q, pos, r->inv_freq, r->attn_scale, slots); return 1;
    case 128: kn_cuda_run(be, "rope_kv_write_warp", k_rope_kv_write_warp<4>, grid, block, 0, *kv, qk, v, stride,
                          n_tokens, n_q, pos, r->inv_freq, r->attn_scale, slots); return 1;
    case 256: kn_cuda_run(be, "rope_kv_write_warp", k_rope_kv_write_warp<8>, grid, block, 0, *kv, qk, v, stride,
                          n_tokens, n_q, pos, r->inv_freq, r->attn_scale, slots); return 1;
    default: return 0;
    }
}

void kn_cuda_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                      int n_tokens, const int32_t *slots) {
    const int rows = n_tokens * kv->n_kv_heads, D = kv->head_dim;
    if (warp_encodes(kv->k_fmt, D) && warp_encodes(kv->v_fmt, D)) { /* a warp per row */
        const dim3 grid((unsigned)((rows + 3) / 4)), block(128);
        if (D <= 64) kn_cuda_run(be, "kv_write_warp", k_kv_write_warp<2>, grid, block, 0, *kv, k, v, stride, rows,
                                 slots);
        else if (D <= 128) kn_cuda_run(be, "kv_write_warp", k_kv_write_warp<4>, grid, block, 0, *kv, k, v, stride,
                                       rows, slots);
        else if (D <= 256) kn_cuda_run(be, "kv_write_warp", k_kv_write_warp<8>, grid, block, 0, *kv, k, v, stride,
                                       rows, slots);
        else kn_cuda_run(be, "kv_write_warp", k_kv_write_warp<16>, grid, block, 0, *kv, k, v, stride, rows, slots);
        return;
    }
    kn_cuda_before_launch();
    k_kv_write_fmt<<<(rows + 63) / 64, 64, 0, kn_cuda_stream(be)>>>(*kv, k, v, stride, rows, slots);
    kn_cuda_launched(be, "kv_write_fmt");
}

/* the keys of the batch's context bucket; 0 when positions are not on the host */
static int ctx_keys(const kn_attention_args *a) {
    if (!a->pos_host) return 0;
    int max_pos = 0;
    for (int t = 0; t < a->n_tokens; t++) max_pos = a->pos_host[t] > max_pos ? a->pos_host[t] : max_pos;
    return kn_ctx_bucket(max_pos) << KN_CTX_BUCKET_SHIFT;
}

/* Enough blocks to fill the GPU per_sm times over, splitting keys when the batch
 * shape alone does not, and at long contexts enough splits that a warp walks
 * at most ~warp_keys keys (KVF_WARP_KEYS, KVF_TC_WARP_KEYS); never more
 * splits than the context bucket fills with min_split_keys keys each
 * (KVF_MIN_SPLIT_KEYS), so the count depends only on the batch shape and the
 * bucket and recorded graphs stay valid as sequences grow. keys: ctx_keys (0:
 * the batch shape alone decides). */
static flash_plan plan_splits(kn_backend *be, const kn_attention_args *a, int keys, int gb, int warp_keys, int per_sm,
                              int min_split_keys) {
    flash_plan f = {1, NULL, NULL};
    const int hd = a->kv->head_dim;
    const int blocks = a->n_tokens * a->n_heads / gb, target = per_sm * kn_cuda_sm_count(be);
    int n = blocks >= target ? 1 : (target + blocks - 1) / blocks;
    if (keys > 0) {
        const int by_ctx = keys / min_split_keys;
        /* long contexts: no more than warp_keys keys per warp where the
         * split count allows (each warp walks its keys one batch at a time) */
        const int by_latency = keys / (KVF_WARPS * warp_keys);
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

/* the tensor-core decode kernel where it covers a's cache and shape (with
 * rk.on, also rope_kv_write's work); 0: not launched */
static int flash_decode_tc(kn_backend *be, const kn_attention_args *a, kn_tc_rope rk) {
    const kn_kv_layer *kv = a->kv;
    const int hd = kv->head_dim, G = a->n_heads / kv->n_kv_heads;
    static int no_tc = -1; /* KILN_NO_TC_DECODE=1: the CUDA-core kernel for every cache (A/B runs) */
    if (no_tc < 0) no_tc = getenv("KILN_NO_TC_DECODE") != NULL;
    /* tensor cores: bf16 caches of bf16 models, k8v3 caches of bf16/f16 models */
    const int tc_bf16 = kv->k_fmt == KN_KVF_BF16 && kv->v_fmt == KN_KVF_BF16 && a->compute_dtype == KN_DT_BF16;
    const int tc_k8v3 = kv->k_fmt == KN_KVF_Q8A && kv->v_fmt == KN_KVF_TQV3 &&
                        (a->compute_dtype == KN_DT_BF16 || a->compute_dtype == KN_DT_F16);
    const int tc_shape = (hd == 64 || hd == 128) && G <= 16 && !(kv->block_size & (kv->block_size - 1)) &&
                         !((uintptr_t)kv->k & 15) && !((uintptr_t)kv->v & 15);
    /* long contexts take the transposed form (groups <= 8), short ones the
     * row form: Llama-3-8B shape, bf16 KV, 128 tokens 238.3 (row) against
     * 230.8 tok/s (transposed); 32k 185.7 (transposed, 4 blocks per SM)
     * against 180.6 (row, 2); the crossover between 1k and 32k is not
     * measured. The transposed bf16 kernel (128 registers) fits 4 blocks per
     * SM and gains from them (32k: 175.9 -> 185.6); k8v3 loses from more,
     * shorter splits (171.2 -> 163.3 at 3), so it keeps 2. */
    static int tr_mode = -2; /* KILN_TC_TRANS=0 / 1: the row / transposed form at every context (tests, A/B) */
    if (tr_mode == -2) tr_mode = getenv("KILN_TC_TRANS") ? atoi(getenv("KILN_TC_TRANS")) != 0 : -1;
    const int keys = ctx_keys(a);
    const int tc_trans = G <= 8 && (tr_mode >= 0 ? tr_mode : keys >= KVF_TC_TRANS_KEYS);
    const int tc_per_sm = tc_bf16 && tc_trans ? 4 : 2;
    /* at least KVF_TC_MIN_SPLIT_KEYS keys of the context bucket per split of
     * the tensor-core kernel (KILN_TC_MIN_SPLIT_KEYS=N for A/B runs): with 32
     * a short context split below one step of a block's four warps (64 keys);
     * the Qwen3-30B-A3B shape at 128 + 128 tokens ran 16 splits of 10 keys,
     * one warp of four busy and 16 partials merged. H100, that shape: 32 ->
     * 237.7-238.7 tok/s, 64 -> 248.9, 160 (no split) -> 249.3 */
    static int tc_min_split = 0;
    if (!tc_min_split) {
        const char *e = getenv("KILN_TC_MIN_SPLIT_KEYS");
        tc_min_split = e && atoi(e) >= 1 ? atoi(e) : KVF_TC_MIN_SPLIT_KEYS;
    }
    return !no_tc && (tc_bf16 || tc_k8v3) && tc_shape &&
           kn_flash_decode_tc(be, a, plan_splits(be, a, keys, G, KVF_TC_WARP_KEYS, tc_per_sm, tc_min_split), tc_trans,
                              rk);
}

void kn_cuda_flash_decode(kn_backend *be, const kn_attention_args *a) {
    if (flash_decode_tc(be, a, kn_tc_rope{0, NULL, NULL, NULL, 0.0f, NULL, NULL, 0.0f, 0})) return;
    const kn_kv_layer *kv = a->kv;
    const int hd = kv->head_dim, G = a->n_heads / kv->n_kv_heads;
    const int ni = (hd + 31) / 32;
    const int keys = ctx_keys(a);
    int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    if (ni > 8 && gb > 2) gb = 2;
    const flash_plan f = plan_splits(be, a, keys, gb, KVF_WARP_KEYS, 2, KVF_MIN_SPLIT_KEYS);
    const int preset_dim = ni >= 2 && ni <= 8; /* 64 <= head_dim <= 256 */
    if (preset_dim && (kn_flash_decode_plain(be, a, ni, gb, f) || kn_flash_decode_quant(be, a, ni, gb, f) ||
                       kn_flash_decode_tq(be, a, ni, gb, f)))
        return;
    kn_flash_decode_any(be, a, ni, gb, f);
}

/* rope_kv_write(r) and attention(a) in one launch of the tensor-core
 * decode kernel: bf16 caches of bf16 models, full rotary, each query token
 * its sequence's only one (the caller checks). It saves the RoPE +
 * cache-write kernel and its programmatic-launch boundary per layer, and
 * costs each block the norms and rotations of its group's query heads: used
 * for groups of at most KVF_TC_FUSED_ROPE_MAX_GROUP heads;
 * KILN_FUSED_ROPE_ATTN=1 / 0 forces it on / off (tests, A/B runs). */
int kn_cuda_rope_kv_attention(kn_backend *be, const kn_rope_kv_args *r, const kn_attention_args *a) {
    static int env = -2;
    if (env == -2) env = kvf_env_switch("KILN_FUSED_ROPE_ATTN", -1);
    const int on = env >= 0 ? env : r->n_kv_heads > 0 && r->n_q_heads / r->n_kv_heads <= KVF_TC_FUSED_ROPE_MAX_GROUP;
    const kn_kv_layer *kv = r->kv;
    if (!on || r->n_tokens < 1 || a->n_tokens != r->n_tokens || a->q != r->qk || a->q_stride != r->stride ||
        a->kv->k != kv->k || a->kv->v != kv->v || kv->k_fmt != KN_KVF_BF16 || kv->v_fmt != KN_KVF_BF16 ||
        r->n_kv_heads != kv->n_kv_heads || r->head_dim != kv->head_dim || r->n_q_heads != a->n_heads ||
        r->rope->rot_dim != r->head_dim || !r->q_norm != !r->k_norm)
        return 0;
    static int preload = -2; /* KILN_ATTN_PRELOAD=0 / 1 (A/B runs) */
    if (preload == -2) preload = kvf_env_switch("KILN_ATTN_PRELOAD", 1);
    const kn_tc_rope rk = {1, r->v, r->slots, r->rope->inv_freq, r->rope->attn_scale, r->q_norm, r->k_norm, r->eps,
                           preload};
    return flash_decode_tc(be, a, rk);
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
    kn_cuda_before_launch();
    if (elem == KN_DT_BF16)
        k_gather_kv_fmt<__nv_bfloat16><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc);
    else if (elem == KN_DT_F16)
        k_gather_kv_fmt<__half><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (__half *)kc, (__half *)vc);
    else k_gather_kv_fmt<float><<<grid, 128, 0, st>>>(*kv, bt, k0, ctx, (float *)kc, (float *)vc);
    kn_cuda_launched(be, "gather_kv_fmt");
}

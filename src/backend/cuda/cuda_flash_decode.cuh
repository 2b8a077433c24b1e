/* cuda_flash_decode.cuh — the split-K flash-decode kernel over every KV row
 * format (float32, bf16 and the compressed ones of base/kv_codec.h), shared by
 * the translation units that instantiate it: cuda_kv.cu plans and dispatches,
 * cuda_flash_decode_{plain,quant,tq,any}.cu each instantiate a family of
 * format pairs, so nvcc compiles them in parallel.
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
 * Invariants: head_dim <= 512 (rotated formats: 64/128/256/512), rows of
 * kn_kv_row_bytes(fmt, head_dim) bytes, block tables of int32, positions
 * attended [max(0, pos - window + 1), pos]. */
#ifndef KN_CUDA_FLASH_DECODE_CUH
#define KN_CUDA_FLASH_DECODE_CUH

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define KVF_WARPS 4
#define KVF_MAX_SPLITS 128
#define KVF_MIN_SPLIT_KEYS 32
#define KVF_TC_MIN_SPLIT_KEYS 64 /* one step of the tensor-core kernel's four warps */
#define KVF_WARP_KEYS 64
#define KVF_TC_WARP_KEYS 256 /* the tensor-core kernel walks 16 keys a step: longer runs per warp, fewer splits */
#define KVF_TC_TRANS_KEYS 8192 /* context bucket from which groups <= 8 take the transposed tensor-core form */
/* Per-group-size defaults of the tensor-core decode kernel (bf16 caches),
 * from alternated runs on an H100 (docs/PERF.md, twentieth and
 *   twenty-second sessions):
 *   the fused RoPE prologue (rope_kv_attention) where a group has at most
 *   this many query heads: Llama-3-8B (4 heads a KV head, 1k) +1.9%;
 *   Qwen3-30B-A3B (8 heads with q/k norms, 128 + 128) -1.6% before the
 *   fused kernel loaded its first tile before the wait, +3.7% (bf16) and
 *   +3.1% (4-bit) with it; 16 not measured;
 *   the L2 prefetch of each warp's first tile before the programmatic wait
 *   from this many: Qwen3-30B-A3B +0.5%, Llama-3-8B -0.35% */
#define KVF_TC_FUSED_ROPE_MAX_GROUP 8
#define KVF_TC_PREFETCH_MIN_GROUP 8
/* an on/off switch from the environment: 1 / 0 when NAME is "1" / "0", else dflt */
static inline int kvf_env_switch(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "0") ? 0 : dflt;
}
#define KVF_NEG (-1e30f)
#define KVF_RUNTIME (-1)

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

/* log2 of a block size that is a power of two (the usual 16), else -1 */
__device__ __forceinline__ int kv_block_shift(int bs) { return (bs & (bs - 1)) ? -1 : __ffs(bs) - 1; }

/* the cache slot of position j through a sequence's block table; a shift
 * instead of a division when the block size is a power of two (sh >= 0) */
__device__ __forceinline__ int64_t kv_slot(const int32_t *bt, int j, int bs, int sh) {
    const int b = sh >= 0 ? j >> sh : j / bs;
    return (int64_t)bt[b] * bs + (j - b * bs);
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
 * a warp. Split s's record starts at row(s): global scratch read through the
 * L2 (CG), or a cluster peer's shared memory. Every split's m and l are
 * loaded at once (lane l holds splits l, l + 32, ...), so the merge costs
 * one round trip before the accumulators are read; the splits are added in
 * order. */
template <int NI, bool CG, typename Row>
__device__ __forceinline__ void merge_rows(Row row, int n_splits, int hd, float *out, int lane, int rotated,
                                           const float *signs) {
    constexpr int SK = KVF_MAX_SPLITS / 32;
    auto ld = [](const float *p) { return CG ? __ldcg(p) : *p; };
    float ms[SK], c[SK], M = KVF_NEG, L = 0.0f;
#pragma unroll
    for (int k = 0; k < SK; k++) {
        const int sp = lane + 32 * k;
        ms[k] = sp < n_splits ? ld(row(sp)) : KVF_NEG;
        c[k] = sp < n_splits ? ld(row(sp) + 1) : 0.0f; /* l, for now */
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
    /* MU splits' accumulators are loaded before the first is added (the
     * loop would otherwise wait out an L2 round trip per split) */
    constexpr int MU = NI <= 4 ? 8 : 4;
#pragma unroll
    for (int k = 0; k < SK; k++) {
        const int n = n_splits - 32 * k < 32 ? n_splits - 32 * k : 32;
        for (int j0 = 0; j0 < n; j0 += MU) {
            float v[MU][NI];
#pragma unroll
            for (int u = 0; u < MU; u++) {
                const float *ps = row(j0 + u < n ? 32 * k + j0 + u : 0) + 2;
#pragma unroll
                for (int i = 0; i < NI; i++) v[u][i] = j0 + u < n && lane + 32 * i < hd ? ld(ps + lane + 32 * i) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < MU; u++) {
                const float cs = __shfl_sync(0xffffffffu, c[k], (j0 + u) & 31);
#pragma unroll
                for (int i = 0; i < NI; i++) acc[i] += v[u][i] * cs;
            }
        }
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < NI; i++) acc[i] *= inv;
    write_head<NI>(acc, out, hd, lane, rotated, signs);
}
/* the splits' records in global scratch, (2 + hd) floats apart from pr */
template <int NI>
__device__ __forceinline__ void merge_splits(const float *pr, int n_splits, int hd, float *out, int lane, int rotated,
                                             const float *signs) {
    merge_rows<NI, true>([&](int sp) { return pr + (int64_t)sp * (2 + hd); }, n_splits, hd, out, lane, rotated, signs);
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
    const int krot = kn_kv_fmt_rotated(kf), bsh = kv_block_shift(bs);

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
            const int64_t row = kv_slot(bt, jj, bs, bsh) * nkv + kvh;
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

/* The launchers of one family of format pairs (one translation unit each):
 * 1 when the pair (a->kv's formats, head_dim of ni warps-widths) is theirs
 * and the kernel was enqueued, 0 otherwise. kn_flash_decode_any takes every
 * pair, with the format decoded at run time. */
int kn_flash_decode_plain(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f);
int kn_flash_decode_quant(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f);
int kn_flash_decode_tq(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f);
void kn_flash_decode_any(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f);
/* bf16 K/V with bf16 compute and k8v3 with bf16/f16 compute, head_dim 64/128,
 * at most 16 query heads per KV head, f planned with gb = the whole group (cuda_flash_decode_tc.cu); trans:
 * the transposed form where the group allows it (<= 8 heads); 0 when not
 * enqueued */
/* rope_kv_write's work done by the tensor-core decode kernel itself
 * (kn_cuda_rope_kv_attention): on = 0 for plain attention (the query heads
 * come rotated and the cache holds the new rows) */
typedef struct {
    int on;
    const float *v;        /* raw value rows, a->q_stride apart; key heads follow a->q's query heads */
    const int32_t *slots;  /* the new rows' cache slots */
    const float *inv_freq; /* [head_dim / 2]: full rotary */
    float scale;           /* the table's attn_scale */
    const float *qn, *kn;  /* per-head RMSNorm weights [head_dim], or NULL */
    float eps;
    int preload;           /* each warp's first tile of cached rows loaded before the programmatic wait */
} kn_tc_rope;

int kn_flash_decode_tc(kn_backend *be, const kn_attention_args *a, flash_plan f, int trans, kn_tc_rope rk);

#endif

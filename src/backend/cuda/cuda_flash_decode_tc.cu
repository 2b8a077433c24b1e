/* cuda_flash_decode_tc.cu — split-K flash decode on tensor cores, head dims
 * 64 and 128 and up to 16 query heads per KV head, for two caches:
 *   bf16 K/V rows with bf16 compute (a bf16 model's cache): bf16 operands;
 *   k8v3 (q8a keys, tqv3 values) with bf16/f16 compute: f16 operands, the
 *   rows decoded into fragments in registers (no dequantized copy).
 *
 * One block of 4 warps per (query token, KV head, key split), as in
 * k_flash_kv; the G query heads sharing the KV head are the 16 rows of the
 * mma's A operand (rows >= G are zero), so every cached row is read once for
 * all of them. A warp takes 16-key tiles of the split in turn:
 *   S [16 heads x 16 keys] = Q K^T    mma m16n8k16, 2 key n-tiles x HD/16 steps
 *   P = 2^(S scale log2e - m)          rounded to the operand type, in registers
 *   O [16 heads x HD] += P V           mma, HD/8 dim n-tiles, 16 keys deep
 * with a running max m and sum l per head (l by an mma of P against ones).
 * Fragments come straight from the paged cache, no shared memory: the dot
 * product does not care in which order dims are summed, so lane (g, t) loads
 * one contiguous quarter of key row g (of each 8-key n-tile) and the Q
 * fragments are built in the same dim order; for P V, lane (g, t) loads dims
 * [g NT, g NT + NT) of key rows 2t, 2t+1, 2t+8, 2t+9 and pairs rows (a byte
 * permute for bf16), so output column c of n-tile nt is dim c NT + nt.
 *
 * Groups of at most 8 heads take the transposed form (step_tr): the keys are
 * the A rows, S^T = K Q^T, and O^T = V^T P^T with P^T turned into the B
 * fragment by movmatrix. The loads are the same; it takes half the mmas and
 * half the output accumulators (k8v3 at head dim 128: 168 registers, 3 blocks
 * per SM, against 224 and 2). The caller picks it for long contexts
 * (kn_cuda_flash_decode; KILN_TC_TRANS=0 / 1 forces either form).
 *
 * k8v3 decode: a key quarter lies in one q8a group, so a lane needs one
 * (scale, zero) per row: codes become f16 1024 + 128 + c by one byte permute
 * (exact), then s (c + z) by a subtract and an fma. A value fragment register
 * holds one dim of two rows: their two 3-bit codes index a 64-entry shared
 * table of centroid pairs (replicated per lane, so no bank conflicts) and the
 * pair is multiplied by the rows' two scales. q is scaled before it is
 * rounded to f16 (range); values stay rotated and every output row is
 * un-rotated once as it is written (write_head, merge_splits).
 *
 * The warps meet in shared memory; with one split the block writes the
 * normalized output, otherwise its (m, l, acc) partial, and the split's last
 * block merges them (merge_splits, as the CUDA-core kernel).
 *
 * With the RoPE prologue (rope_kv_attention: one token per sequence), the
 * row form's warps load their first tile of cached rows into registers
 * before the programmatic wait (PRE): rows below the token's position were
 * written by earlier steps; in the tile holding the new row, the lanes that
 * hold it take it from the copy the prologue leaves in shared memory. At
 * short contexts a warp has one tile, so its only dependent load after the
 * wait is the query (H100, 4-bit Llama-3-8B at 128-256 tokens: +4.6%, and
 * +0.8% for the shared-memory row instead of a second load of the tile;
 * KILN_ATTN_PRELOAD=0 turns the preload off).
 *
 * Numerics: bf16 caches round q and the probabilities to bf16 (as the flash
 * prefill kernel does), k8v3 rounds q, the decoded rows and the
 * probabilities to f16; products and sums are f32. f32 compute (f32 models)
 * and every other format keep the CUDA-core kernel (exact f32 dot products). */
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_flash_decode.cuh"

#define TC_WARPS 4 /* warps per block */
#define TC_KEYS 16 /* keys per warp step */

/* two floats as one operand register (lo in the low half): bf16 or f16 */
template <bool F16> __device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    if (F16) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ __half2 tc_h2(uint32_t u) { return *(__half2 *)&u; }
__device__ __forceinline__ uint32_t tc_u32(__half2 h) { return *(uint32_t *)&h; }

/* 16-byte pieces of a row, read through the non-coherent path (the cache is
 * written by earlier kernels only) */
__device__ __forceinline__ uint4 tc_ld16(const uint8_t *p) { return __ldg((const uint4 *)p); }

/* N 32-bit words of a row from p (16-byte aligned) into w, 16 bytes a load;
 * CG: through the L2 (rows this kernel wrote: kn_tc_rope) */
template <int N, bool CG = false> __device__ __forceinline__ void tc_ld_words(const uint8_t *p, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const uint4 u = CG ? __ldcg((const uint4 *)(p + 16 * i)) : tc_ld16(p + 16 * i);
        w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
    }
}

/* four q8a codes (dims 4m .. 4m + 3 of a row) -> two f16 pairs s (c + z):
 * 0x64xx is the f16 1024 + xx, so c ^ 0x80 becomes 1152 + c exactly, and
 * the fma rounds s (c + z) once (sz = s z rounded to f16) */
__device__ __forceinline__ void tc_q8_pairs(uint32_t w, __half2 s2, __half2 sz2, uint32_t &lo, uint32_t &hi) {
    const uint32_t x = w ^ 0x80808080u;
    const __half2 base = __float2half2_rn(1152.0f);
    lo = tc_u32(__hfma2(__hsub2(tc_h2(__byte_perm(x, 0x64646464u, 0x4140)), base), s2, sz2));
    hi = tc_u32(__hfma2(__hsub2(tc_h2(__byte_perm(x, 0x64646464u, 0x4342)), base), s2, sz2));
}

/* a q8a row's scale s and s z (f16 bits ks, kz) as the pairs tc_q8_pairs takes */
__device__ __forceinline__ void tc_q8_scale(uint16_t ks, uint16_t kz, __half2 &s2, __half2 &sz2) {
    const __half hs = __ushort_as_half(ks);
    s2 = __half2half2(hs);
    sz2 = __float2half2_rn(__half2float(hs) * __half2float(__ushort_as_half(kz)));
}

/* the transpose of an 8x8 b16 matrix held as an mma fragment (lane (g, t)
 * holds row g, columns 2t, 2t + 1): afterwards it holds row g of the transpose */
__device__ __forceinline__ uint32_t tc_trans(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* 3-bit code fields: bits 6k .. 6k + 2, k < 8 */
#define TC_CODE_EVEN 0x1C71C71C71C7ull

template <int HD, bool CAP, bool CQ, bool TR, bool PRE, bool CL>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_flash_tc(kn_attention_args a, kn_kv_layer kv, int n_splits, float *partial, int *counters, int prefetch,
               int early_trigger, kn_tc_rope rk) {
    constexpr int KT = HD / 16;   /* QK steps (16 dims each) */
    constexpr int NT = HD / 8;    /* PV n-tiles (8 dims each) */
    constexpr int QD = HD / 4;    /* dims of a key row per lane in QK */
    constexpr int KW = QD / 2;    /* ... as 32-bit words of bf16 pairs */
    constexpr int VW = NT / 2;    /* words of a bf16 value row per lane in PV */
    constexpr int NG = HD / 32;   /* k8v3: scale groups per row */
    constexpr int CW = QD / 4;    /* k8v3: words of q8a codes per lane in QK */
    constexpr int64_t KB = CQ ? HD + 4 * NG : 2 * HD, VB = CQ ? 2 * NG + 3 * HD / 8 : 2 * HD; /* row bytes */
    extern __shared__ float tsh[]; /* [TC_WARPS][16][2 + HD]; k8v3: the value table first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    if (early_trigger) kn_pdl_trigger();
    if constexpr (CQ) { /* value table: entry i (codes i & 7 of row 2t, i >> 3 of row 2t + 1) at word 32 i + lane */
        __shared__ float cent[8];
        if (threadIdx.x < 8) cent[threadIdx.x] = kv.v_tab[threadIdx.x];
        __syncthreads();
        uint32_t *vt = (uint32_t *)tsh;
        for (int i = threadIdx.x; i < 64 * 32; i += TC_WARPS * 32) vt[i] = tc_pack<true>(cent[(i >> 5) & 7], cent[i >> 8]);
        __syncthreads();
    }
    /* Before the wait: the positions and block tables (uploaded before the
     * step's kernels and written by none, kn_attention_args), and an L2
     * prefetch (when `prefetch`) of this warp's first tile of cached rows,
     * which earlier steps wrote (the newest row, which the kernel before
     * writes, may come too: a prefetch only moves lines into the L2, where
     * that write lands). The rows' DRAM round trip then overlaps the kernels
     * before instead of following the wait. */
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int bs = kv.block_size, nkv = kv.n_kv_heads, G = a.n_heads / nkv, h0 = kvh * G;
    const uint8_t *K = (const uint8_t *)kv.k, *V = (const uint8_t *)kv.v;
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    const int p = a.pos[t];
    const int lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0;
    const int n = p - lo + 1, per = (n + n_splits - 1) / n_splits;
    const int j0 = lo + split * per, j1 = min(p + 1, j0 + per);
    const int bsh = __ffs(bs) - 1; /* block sizes are powers of two here (kn_cuda_flash_decode) */
    auto row_of = [&](int j) -> int64_t { return ((int64_t)bt[j >> bsh] * bs + (j & (bs - 1))) * nkv + kvh; };
    /* k8v3 value codes of this lane: bytes [vo, vo + 3 NT / 8) of a row (after
     * the scales), read as one or two aligned words */
    constexpr int VNB = 3 * NT / 8;
    const int vo = 2 * NG + g * VNB, vsh = 8 * (vo & 3);
    const bool v2w = (vo & 3) + VNB > 4;
    const uint32_t lane4 = (uint32_t)lane << 2;

    /* a tile's raw rows: loaded (load) before they are decoded and used (step) */
    struct raw_tile {
        uint32_t kw[2][CQ ? CW : KW], vw[4][CQ ? 1 : VW];
        uint16_t ks[2], kz[2], vs[4];
        uint64_t vc[4];
    };
    /* the rows a lane holds of the tile at jt: key rows jt + g, jt + 8 + g
     * (its quarter) and value rows jt + 2tq, +1, +8, +9 (dims g NT ..); past
     * j1: row jt, masked */
    auto key_row = [&](int jt, int nt) { return jt + nt * 8 + g < j1 ? jt + nt * 8 + g : jt; };
    auto value_row = [&](int jt, int rr) {
        const int jr = jt + 2 * tq + (rr & 1) + (rr >> 1) * 8;
        return jr < j1 ? jr : jt;
    };
    auto load = [&](int jt, raw_tile &r) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int j = key_row(jt, nt);
            const uint8_t *p = K + row_of(j) * KB;
            if constexpr (CQ) {
                const int grp = tq * QD / 32;
                r.ks[nt] = __ldg((const unsigned short *)p + grp), r.kz[nt] = __ldg((const unsigned short *)p + NG + grp);
                p += 4 * NG + tq * QD;
                if constexpr (KB % 16 == 0) {
                    tc_ld_words<CW>(p, r.kw[nt]);
                } else {
#pragma unroll
                    for (int i = 0; i < CW / 2; i++) {
                        const uint2 u = __ldg((const uint2 *)(p + 8 * i));
                        r.kw[nt][2 * i] = u.x, r.kw[nt][2 * i + 1] = u.y;
                    }
                }
            } else if (rk.on) {
                tc_ld_words<KW, true>(p + tq * QD * 2, r.kw[nt]);
            } else {
                tc_ld_words<KW>(p + tq * QD * 2, r.kw[nt]);
            }
        }
#pragma unroll
        for (int rr = 0; rr < 4; rr++) {
            const int j = value_row(jt, rr);
            const uint8_t *p = V + row_of(j) * VB;
            if constexpr (CQ) {
                r.vs[rr] = __ldg((const unsigned short *)p + g * NT / 32);
                const uint32_t *w = (const uint32_t *)(p + (vo & ~3));
                const uint32_t w0 = __ldg(w), w1 = v2w ? __ldg(w + 1) : 0u;
                r.vc[rr] = (((uint64_t)w1 << 32) | w0) >> vsh;
            } else if (rk.on) {
                tc_ld_words<VW, true>(p + g * NT * 2, r.vw[rr]);
            } else {
                tc_ld_words<VW>(p + g * NT * 2, r.vw[rr]);
            }
        }
    };
    const int jstep = TC_WARPS * TC_KEYS;
    int jt = j0 + warp * TC_KEYS;
    /* rope_kv_attention (bf16): the warp's first tile of cached rows loaded
     * into registers before the wait. Rows below p are final (the caller
     * gives each sequence one token, and earlier steps wrote them); the tile
     * holding p, which this kernel writes, takes that row from the copy
     * the prologue leaves in shared memory (no second round trip). */
    const bool preload = PRE && jt < j1; /* PRE: bf16 rows, rk.on, the row form (launch_tc) */
    raw_tile r0;
    if (preload) load(jt, r0);
    if (prefetch) { /* lanes 0-15: key rows of the warp's first tile (preload: its second), 16-31: value rows */
        const int j = jt + (preload ? jstep : 0) + (lane & 15);
        if (j < j1) {
            const char *r = lane < 16 ? (const char *)K + row_of(j) * KB : (const char *)V + row_of(j) * VB;
            const int64_t len = lane < 16 ? KB : VB;
            for (int64_t o = 0; o < len; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(r + o));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(r + len - 1)); /* a row may straddle one more line */
        }
    }
    kn_pdl_wait();
    /* PRE: the new row's K and V as written to the cache (bf16 bits), for the
     * preloaded tile that holds p */
    __shared__ uint32_t new_kv[PRE ? 2 : 1][PRE ? HD / 2 : 1];
    if constexpr (!CQ && HD % 64 == 0) /* rope_kv_attention: the query heads into shared memory, rotated */
        if (rk.on) {
            /* heads r < G: query head h0 + r; r == G (the split holding p
             * only): the token's key head, written to the cache with its
             * value row. Warp w takes heads w, w + 4, ...: every load first,
             * then the norms and rotations, so a warp waits for one round
             * trip whatever its number of heads; the angles depend only on
             * the dim, so each lane computes its own once. Same arithmetic
             * as k_rope_kv (the norm's sum in another order). */
            constexpr int PER = HD / 64, HALF = HD / 2, MAXH = (16 + 1 + TC_WARPS - 1) / TC_WARPS;
            const int nh = G + (j0 <= p && p < j1);
            const float *qk = a.q + (int64_t)t * a.q_stride;
            const float *vr = rk.v + (int64_t)t * a.q_stride + (int64_t)kvh * HD;
            float x[MAXH][2 * PER], vv[2 * PER], wq[2 * PER], wk[2 * PER], cs[PER], sn[PER];
#pragma unroll
            for (int u = 0; u < MAXH; u++) {
                const int r = warp + TC_WARPS * u;
                if (r >= nh) break;
                const float *src = qk + (int64_t)(r < G ? h0 + r : a.n_heads + kvh) * HD;
#pragma unroll
                for (int i = 0; i < PER; i++) x[u][i] = src[lane + 32 * i], x[u][PER + i] = src[lane + 32 * i + HALF];
                if (r == G)
#pragma unroll
                    for (int i = 0; i < PER; i++) vv[i] = vr[lane + 32 * i], vv[PER + i] = vr[lane + 32 * i + HALF];
            }
            if (rk.qn)
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    wq[i] = rk.qn[lane + 32 * i], wq[PER + i] = rk.qn[lane + 32 * i + HALF];
                    wk[i] = rk.kn[lane + 32 * i], wk[PER + i] = rk.kn[lane + 32 * i + HALF];
                }
#pragma unroll
            for (int i = 0; i < PER; i++) {
                sincosf((float)p * rk.inv_freq[lane + 32 * i], &sn[i], &cs[i]);
                cs[i] *= rk.scale, sn[i] *= rk.scale;
            }
#pragma unroll
            for (int u = 0; u < MAXH; u++) {
                const int r = warp + TC_WARPS * u;
                if (r >= nh) break;
                float d0[PER], d1[PER], ss = 0.0f;
#pragma unroll
                for (int i = 0; i < PER; i++) d0[i] = x[u][i], d1[i] = x[u][PER + i], ss += d0[i] * d0[i] + d1[i] * d1[i];
                if (rk.qn) {
                    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                    const float inv = 1.0f / sqrtf(ss / HD + rk.eps);
#pragma unroll
                    for (int i = 0; i < PER; i++) {
                        d0[i] = (r < G ? wq[i] : wk[i]) * (d0[i] * inv);
                        d1[i] = (r < G ? wq[PER + i] : wk[PER + i]) * (d1[i] * inv);
                    }
                }
#pragma unroll
                for (int i = 0; i < PER; i++) kn_rope_rotate(d0[i], d1[i], cs[i], sn[i]);
                if (r < G) {
#pragma unroll
                    for (int i = 0; i < PER; i++) tsh[r * HD + lane + 32 * i] = d0[i], tsh[r * HD + lane + 32 * i + HALF] = d1[i];
                    continue;
                }
                const int64_t at = ((int64_t)rk.slots[t] * nkv + kvh) * HD;
                uint16_t *kc = (uint16_t *)kv.k + at, *vc = (uint16_t *)kv.v + at;
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const int j = lane + 32 * i;
                    const uint16_t k0 = __bfloat16_as_ushort(__float2bfloat16(d0[i]));
                    const uint16_t k1 = __bfloat16_as_ushort(__float2bfloat16(d1[i]));
                    const uint16_t v0 = __bfloat16_as_ushort(__float2bfloat16(vv[i]));
                    const uint16_t v1 = __bfloat16_as_ushort(__float2bfloat16(vv[PER + i]));
                    kc[j] = k0, kc[j + HALF] = k1, vc[j] = v0, vc[j + HALF] = v1;
                    if constexpr (PRE) {
                        uint16_t *sk = (uint16_t *)new_kv[0], *sv = (uint16_t *)new_kv[1];
                        sk[j] = k0, sk[j + HALF] = k1, sv[j] = v0, sv[j + HALF] = v1;
                    }
                }
            }
            __syncthreads(); /* q in shared memory; the new rows in the L2 for the block's loads (CG) */
        }
    /* k8v3 scales q before rounding it to f16, so raw scores are already scaled */
    const float qs = CQ ? a.scale : 1.0f, ss = CQ ? 1.0f : a.scale;
    const float sl2 = ss * 1.4426950408889634f;
    const float cap_in = CAP ? ss / a.softcap : 0.0f, cap_out = CAP ? a.softcap / ss : 0.0f;

    /* Q fragments in the QK dim order: step kk, k index 2tq + e <-> dim
     * tq QD + 4 kk + e, k index 2tq + 8 + e <-> dim tq QD + 4 kk + 2 + e */
    uint32_t qa[KT][TR ? 2 : 4]; /* TR: the B fragment, head g (k indices as the keys' A fragment) */
    {
        const bool ra = g < G, rb = g + 8 < G;
        const float *qra = !CQ && rk.on ? tsh + g * HD + tq * QD /* rotated above */
                                        : a.q + (int64_t)t * a.q_stride + (int64_t)(h0 + g) * HD + tq * QD;
        const float *qrb = qra + (int64_t)8 * HD;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) { /* scalar loads: q rows need not be 16-byte aligned */
            const float *pa = qra + 4 * kk, *pb = qrb + 4 * kk;
            if constexpr (TR) {
                qa[kk][0] = ra ? tc_pack<CQ>(pa[0] * qs, pa[1] * qs) : 0u;
                qa[kk][1] = ra ? tc_pack<CQ>(pa[2] * qs, pa[3] * qs) : 0u;
                continue;
            }
            qa[kk][0] = ra ? tc_pack<CQ>(pa[0] * qs, pa[1] * qs) : 0u;
            qa[kk][2] = ra ? tc_pack<CQ>(pa[2] * qs, pa[3] * qs) : 0u;
            qa[kk][1] = rb ? tc_pack<CQ>(pb[0] * qs, pb[1] * qs) : 0u;
            qa[kk][3] = rb ? tc_pack<CQ>(pb[2] * qs, pb[3] * qs) : 0u;
        }
    }
    if (!CQ && rk.on) __syncthreads(); /* every warp's q fragments read before the warps meet in tsh */
    /* The next kernel (the o projection) launched only now, after the
     * prologue's dependent loads: launched at the start, its blocks' weight
     * copies (9.4 MB at Llama-3-8B) fill the memory system while this
     * kernel's q, k, v and first rows make their round trips. H100, 4-bit
     * Llama-3-8B decode, three alternated rounds: 414.7 -> 417.6 tok/s
     * (docs/PERF.md, thirty-first session); KILN_ATTN_EARLY_TRIGGER=1
     * restores the start (A/B runs). */
    if (!early_trigger) kn_pdl_trigger();
    constexpr int OT = TR ? NT / 2 : NT; /* output tiles: TR m-tiles of 16 dims, else n-tiles of 8 */
    float o[OT][4], ol[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < OT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY; /* raw-score running max of heads g, g + 8 (TR: 2tq, 2tq + 1) */
    /* k8v3 values: the two rows' codes interleaved: field k of xe[pr] is
     * (code 2k of row 2pr, code 2k of row 2pr + 1), of xo[pr] codes 2k + 1;
     * shifted so that a field lands on the table's word index */
    struct v_codes {
        uint64_t xe[2], xo[2];
        __half2 sc[2];
    };
    auto v_unpack = [&](const raw_tile &r) {
        v_codes c;
#pragma unroll
        for (int pr = 0; pr < 2; pr++) {
            const uint64_t c0 = r.vc[2 * pr], c1 = r.vc[2 * pr + 1];
            c.xe[pr] = ((c0 & TC_CODE_EVEN) | ((c1 << 3) & ~TC_CODE_EVEN)) << 7;
            c.xo[pr] = (((c0 >> 3) & TC_CODE_EVEN) | (c1 & ~TC_CODE_EVEN)) << 7;
            c.sc[pr] = __halves2half2(__ushort_as_half(r.vs[2 * pr]), __ushort_as_half(r.vs[2 * pr + 1]));
        }
        return c;
    };
    /* dim g NT + nt of value rows 2tq + 8 pr, + 1, as an f16 pair */
    auto v_pair = [&](const v_codes &c, int nt, int pr) -> uint32_t {
        const uint64_t x = nt & 1 ? c.xo[pr] : c.xe[pr];
        const uint32_t off = ((uint32_t)(x >> (6 * (nt >> 1))) & (63u << 7)) | lane4;
        return tc_u32(__hmul2(*(const __half2 *)((const char *)tsh + off), c.sc[pr]));
    };
    /* the transposed step (G <= 8: the group fits the mma's 8 columns):
     *   S^T [16 keys x 8 heads] = K Q^T   HD/16 mmas, keys jt + g, jt + g + 8 as A rows
     *   P^T -> B fragment                  movmatrix transposes each 8x8 half
     *   O^T [HD x 8 heads] += V^T P^T      HD/16 mmas; m-tile mt row g is dim
     *                                      g NT + 2 mt, row g + 8 dim g NT + 2 mt + 1
     * half the mmas and accumulators of the row form; the lane holds heads
     * 2tq, 2tq + 1 (C columns), so the softmax reduces over g */
    auto step_tr = [&](int jt, const raw_tile &r) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (CQ) {
            __half2 s2[2], sz2[2];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) tc_q8_scale(r.ks[nt], r.kz[nt], s2[nt], sz2[nt]);
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t ka[4];
                tc_q8_pairs(r.kw[0][kk], s2[0], sz2[0], ka[0], ka[2]);
                tc_q8_pairs(r.kw[1][kk], s2[1], sz2[1], ka[1], ka[3]);
                kn_mma_f16(s, ka, qa[kk][0], qa[kk][1]);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                const uint32_t ka[4] = {r.kw[0][2 * kk], r.kw[1][2 * kk], r.kw[0][2 * kk + 1], r.kw[1][2 * kk + 1]};
                kn_mma_bf16(s, ka, qa[kk][0], qa[kk][1]);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) { /* s[e]: key jt + g + 8 (e >> 1), head 2tq + (e & 1) */
            float v = s[e];
            if (CAP) v = cap_out * tanhf(v * cap_in);
            if (jt + g + 8 * (e >> 1) >= j1) v = -INFINITY;
            s[e] = v;
        }
        const kn_softmax_step sm = kn_softmax_rows<true>(fmaxf(s[0], s[2]), fmaxf(s[1], s[3]), ma, mb, sl2);
        const float za = sm.za, zb = sm.zb, aa = sm.aa, ab = sm.ab;
        const uint32_t pb0 = tc_trans(tc_pack<CQ>(kn_exp2_approx(fmaf(s[0], sl2, -za)), kn_exp2_approx(fmaf(s[1], sl2, -zb))));
        const uint32_t pb1 = tc_trans(tc_pack<CQ>(kn_exp2_approx(fmaf(s[2], sl2, -za)), kn_exp2_approx(fmaf(s[3], sl2, -zb))));
        if (__any_sync(0xffffffffu, aa != 1.0f || ab != 1.0f)) {
            ol[0] *= aa, ol[1] *= ab, ol[2] *= aa, ol[3] *= ab;
#pragma unroll
            for (int i = 0; i < OT; i++) o[i][0] *= aa, o[i][1] *= ab, o[i][2] *= aa, o[i][3] *= ab;
        }
        const uint32_t one = CQ ? 0x3c003c00u : 0x3f803f80u, ones[4] = {one, one, one, one};
        if constexpr (CQ) {
            kn_mma_f16(ol, ones, pb0, pb1); /* column sums of the rounded P^T */
            const v_codes c = v_unpack(r);
#pragma unroll
            for (int mt = 0; mt < OT; mt++) {
                const uint32_t va[4] = {v_pair(c, 2 * mt, 0), v_pair(c, 2 * mt + 1, 0), v_pair(c, 2 * mt, 1),
                                        v_pair(c, 2 * mt + 1, 1)};
                kn_mma_f16(o[mt], va, pb0, pb1);
            }
        } else {
            kn_mma_bf16(ol, ones, pb0, pb1);
#pragma unroll
            for (int mt = 0; mt < OT; mt++) {
                const uint32_t va[4] = {__byte_perm(r.vw[0][mt], r.vw[1][mt], 0x5410),
                                        __byte_perm(r.vw[0][mt], r.vw[1][mt], 0x7632),
                                        __byte_perm(r.vw[2][mt], r.vw[3][mt], 0x5410),
                                        __byte_perm(r.vw[2][mt], r.vw[3][mt], 0x7632)};
                kn_mma_bf16(o[mt], va, pb0, pb1);
            }
        }
    };
    auto step = [&](int jt, const raw_tile &r) {
        if constexpr (TR) {
            step_tr(jt, r);
        } else {
            /* S = Q K^T: s[nt] covers keys jt + nt*8 + 2tq, +1 (heads g, g + 8) */
            float s[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
                if constexpr (CQ) {
                    __half2 s2, sz2;
                    tc_q8_scale(r.ks[nt], r.kz[nt], s2, sz2);
#pragma unroll
                    for (int kk = 0; kk < KT; kk++) {
                        uint32_t b0, b1;
                        tc_q8_pairs(r.kw[nt][kk], s2, sz2, b0, b1);
                        kn_mma_f16(s[nt], qa[kk], b0, b1);
                    }
                } else {
#pragma unroll
                    for (int kk = 0; kk < KT; kk++) kn_mma_bf16(s[nt], qa[kk], r.kw[nt][2 * kk], r.kw[nt][2 * kk + 1]);
                }
            }
            float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[nt][e];
                    if (CAP) v = cap_out * tanhf(v * cap_in); /* v scale = softcap tanh(s scale / softcap) */
                    if (jt + nt * 8 + 2 * tq + (e & 1) >= j1) v = -INFINITY;
                    s[nt][e] = v;
                    if (e < 2) mxa = fmaxf(mxa, v);
                    else mxb = fmaxf(mxb, v);
                }
            const kn_softmax_step sm = kn_softmax_rows(mxa, mxb, ma, mb, sl2);
            const float za = sm.za, zb = sm.zb, aa = sm.aa, ab = sm.ab;
            uint32_t pf[4]; /* P as the A fragment: keys 2tq.. (n-tile 0) and 2tq + 8.. (n-tile 1) */
            pf[0] = tc_pack<CQ>(kn_exp2_approx(fmaf(s[0][0], sl2, -za)), kn_exp2_approx(fmaf(s[0][1], sl2, -za)));
            pf[1] = tc_pack<CQ>(kn_exp2_approx(fmaf(s[0][2], sl2, -zb)), kn_exp2_approx(fmaf(s[0][3], sl2, -zb)));
            pf[2] = tc_pack<CQ>(kn_exp2_approx(fmaf(s[1][0], sl2, -za)), kn_exp2_approx(fmaf(s[1][1], sl2, -za)));
            pf[3] = tc_pack<CQ>(kn_exp2_approx(fmaf(s[1][2], sl2, -zb)), kn_exp2_approx(fmaf(s[1][3], sl2, -zb)));
            if (__any_sync(0xffffffffu, aa != 1.0f || ab != 1.0f)) {
                ol[0] *= aa, ol[1] *= aa, ol[2] *= ab, ol[3] *= ab;
#pragma unroll
                for (int i = 0; i < NT; i++) o[i][0] *= aa, o[i][1] *= aa, o[i][2] *= ab, o[i][3] *= ab;
            }
            /* O += P V: n-tile nt's column g is dim g NT + nt; b0 pairs value
             * rows 2tq, 2tq + 1, b1 rows 2tq + 8, 2tq + 9 */
            if constexpr (CQ) {
                kn_mma_f16(ol, pf, 0x3c003c00u, 0x3c003c00u); /* row sums of the rounded P */
                const v_codes c = v_unpack(r);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) kn_mma_f16(o[nt], pf, v_pair(c, nt, 0), v_pair(c, nt, 1));
            } else {
                kn_mma_bf16(ol, pf, 0x3f803f80u, 0x3f803f80u); /* row sums of the rounded P */
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    const uint32_t b0e = __byte_perm(r.vw[0][i], r.vw[1][i], 0x5410), b0o = __byte_perm(r.vw[0][i], r.vw[1][i], 0x7632);
                    const uint32_t b1e = __byte_perm(r.vw[2][i], r.vw[3][i], 0x5410), b1o = __byte_perm(r.vw[2][i], r.vw[3][i], 0x7632);
                    kn_mma_bf16(o[2 * i], pf, b0e, b1e);
                    kn_mma_bf16(o[2 * i + 1], pf, b0o, b1o);
                }
            }
        }
    };
    /* k8v3 rows carry few bytes per tile, so each warp keeps the next tile's
     * loads in flight while it decodes and multiplies the current one (a
     * third tile in flight, 234 registers, measured slower: docs/PERF.md
     * 2026-12-05); a bf16 tile is large enough alone */
    if (preload) {
        if constexpr (PRE)
            if (jt <= p && p < jt + TC_KEYS) { /* the row this kernel wrote: from shared memory, not a reload */
                /* every register that load() filled from row p, the masked
                 * lanes' stand-in row jt included (stale bits times a zero
                 * probability could still be NaN) */
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
                    if (key_row(jt, nt) == p)
#pragma unroll
                        for (int i = 0; i < KW; i++) r0.kw[nt][i] = new_kv[0][tq * QD / 2 + i];
#pragma unroll
                for (int rr = 0; rr < 4; rr++)
                    if (value_row(jt, rr) == p)
#pragma unroll
                        for (int i = 0; i < VW; i++) r0.vw[rr][i] = new_kv[1][g * NT / 2 + i];
            }
        step(jt, r0);
        jt += jstep;
    }
    if constexpr (CQ) { /* two buffers in turn (no copies) */
        raw_tile ra, rb;
        if (jt < j1) load(jt, ra);
        while (jt < j1) {
            if (jt + jstep < j1) load(jt + jstep, rb);
            step(jt, ra);
            if ((jt += jstep) >= j1) break;
            if (jt + jstep < j1) load(jt + jstep, ra);
            step(jt, rb);
            jt += jstep;
        }
    } else {
        for (; jt < j1; jt += jstep) {
            raw_tile r;
            load(jt, r);
            step(jt, r);
        }
    }

    /* the warps meet: per warp m (natural units), l and acc of its 16 rows
     * in natural dim order (k8v3: once every warp is done with the table) */
    if constexpr (CQ) __syncthreads();
    const int rw = 2 + HD;
    if constexpr (TR) { /* heads 2tq, 2tq + 1; dims g NT + 2 mt (+ 1) */
        float *ra = tsh + ((int64_t)warp * 16 + 2 * tq) * rw, *rb = ra + rw;
        if (g == 0) {
            ra[0] = ma == -INFINITY ? KVF_NEG : ma * ss, ra[1] = ol[0];
            rb[0] = mb == -INFINITY ? KVF_NEG : mb * ss, rb[1] = ol[1];
        }
#pragma unroll
        for (int mt = 0; mt < OT; mt++) {
            ra[2 + g * NT + 2 * mt] = o[mt][0], ra[2 + g * NT + 2 * mt + 1] = o[mt][2];
            rb[2 + g * NT + 2 * mt] = o[mt][1], rb[2 + g * NT + 2 * mt + 1] = o[mt][3];
        }
    } else {
        float *ra = tsh + ((int64_t)warp * 16 + g) * rw, *rb = ra + 8 * rw;
        if (tq == 0) {
            ra[0] = ma == -INFINITY ? KVF_NEG : ma * ss, ra[1] = ol[0];
            rb[0] = mb == -INFINITY ? KVF_NEG : mb * ss, rb[1] = ol[2];
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
            ra[2 + (2 * tq) * NT + i] = o[i][0], ra[2 + (2 * tq + 1) * NT + i] = o[i][1];
            rb[2 + (2 * tq) * NT + i] = o[i][2], rb[2 + (2 * tq + 1) * NT + i] = o[i][3];
        }
    }
    __syncthreads();
    for (int r = warp; r < G; r += TC_WARPS) { /* a warp per head */
        float M = KVF_NEG;
        for (int w = 0; w < TC_WARPS; w++) M = fmaxf(M, tsh[((int64_t)w * 16 + r) * rw]);
        float L = 0.0f, c[TC_WARPS];
        for (int w = 0; w < TC_WARPS; w++) {
            const float *rr = tsh + ((int64_t)w * 16 + r) * rw;
            c[w] = expf(rr[0] - M);
            L += rr[1] * c[w];
        }
        const int h = h0 + r;
        float acc[HD / 32];
#pragma unroll
        for (int i = 0; i < HD / 32; i++) {
            float v = 0.0f;
            for (int w = 0; w < TC_WARPS; w++) v += tsh[((int64_t)w * 16 + r) * rw + 2 + lane + 32 * i] * c[w];
            acc[i] = v;
        }
        if (n_splits == 1) {
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
            for (int i = 0; i < HD / 32; i++) acc[i] *= inv;
            write_head<HD / 32>(acc, a.out + ((int64_t)t * a.n_heads + h) * HD, HD, lane, CQ, kv.signs);
        } else {
            /* CL: the record goes to row r of warp 0's rows, which only this
             * warp (head r) reads, once every lane has read them */
            float *pr = CL ? tsh + (int64_t)r * rw : partial + (((int64_t)t * a.n_heads + h) * n_splits + split) * rw;
            if (CL) __syncwarp();
            if (lane == 0) pr[0] = M, pr[1] = L;
#pragma unroll
            for (int i = 0; i < HD / 32; i++) pr[2 + lane + 32 * i] = acc[i];
        }
    }
    if constexpr (CL) { /* the splits are one cluster (rank = split): split 0 merges from its peers' shared memory */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900 /* clusters: sm_90 (launch_tc picks CL only there) */
        if (n_splits > 1) {
            namespace cg = cooperative_groups;
            cg::cluster_group cl = cg::this_cluster();
            cl.sync(); /* every split's records written */
            if (split == 0)
                for (int r = warp; r < G; r += TC_WARPS) {
                    const int64_t th = (int64_t)t * a.n_heads + h0 + r;
                    merge_rows<HD / 32, false>([&](int sp) { return (const float *)cl.map_shared_rank(tsh + (int64_t)r * rw, sp); },
                                               n_splits, HD, a.out + th * HD, lane, CQ, kv.signs);
                }
            cl.sync(); /* the peers' shared memory stays until split 0 has read it */
        }
#else
        __trap();
#endif
    } else if (n_splits > 1 && split_is_last(counters + (int64_t)t * gridDim.y + blockIdx.y, n_splits)) {
        for (int r = warp; r < G; r += TC_WARPS) {
            const int64_t th = (int64_t)t * a.n_heads + h0 + r;
            merge_splits<HD / 32>(partial + th * n_splits * rw, n_splits, HD, a.out + th * HD, lane, CQ, kv.signs);
        }
    }
}

template <int HD, bool CQ>
static void launch_tc(kn_backend *be, const kn_attention_args *a, flash_plan f, int tr, int prefetch,
                      kn_tc_rope rk) {
    const dim3 grid((unsigned)a->n_tokens, (unsigned)a->kv->n_kv_heads, (unsigned)f.n_splits);
    size_t smem = (size_t)TC_WARPS * 16 * (2 + HD) * sizeof(float); /* 33 KB at head_dim 128 */
    if (CQ && smem < 64 * 32 * 4) smem = 64 * 32 * 4;                 /* the value table */
    const int cap = a->softcap > 0.0f;
    /* the preloading row form holds a tile more across the prologue (~40
     * registers): its own instantiation, so the other forms keep their
     * occupancy */
    const bool pre = !CQ && !tr && rk.on && rk.preload;
    /* the row form's splits (2..8) run as one thread-block cluster on sm_90,
     * merged through distributed shared memory instead of global partials, a
     * fence and a counter (H100: 4-bit Llama-3-8B decode +5%, Qwen3-30B-A3B
     * +6%); KILN_ATTN_CLUSTER=0 turns it off (A/B runs) */
    static int early = -2; /* KILN_ATTN_EARLY_TRIGGER=1: the next kernel launched at the start (A/B runs) */
    if (early == -2) early = kvf_env_switch("KILN_ATTN_EARLY_TRIGGER", 0);
    static int cl_env = -2;
    if (cl_env == -2) cl_env = kvf_env_switch("KILN_ATTN_CLUSTER", 1);
    const bool cl = cl_env == 1 && kn_cuda_has_clusters(be) && !tr && f.n_splits > 1 && f.n_splits <= 8;
    void (*const plain)(kn_attention_args, kn_kv_layer, int, float *, int *, int, int, kn_tc_rope) =
        tr    ? (cap ? k_flash_tc<HD, true, CQ, true, false, false> : k_flash_tc<HD, false, CQ, true, false, false>)
        : pre ? (cap ? k_flash_tc<HD, true, CQ, false, !CQ, false> : k_flash_tc<HD, false, CQ, false, !CQ, false>)
              : (cap ? k_flash_tc<HD, true, CQ, false, false, false> : k_flash_tc<HD, false, CQ, false, false, false>);
    if (cl) {
        void (*const clustered)(kn_attention_args, kn_kv_layer, int, float *, int *, int, int, kn_tc_rope) =
            pre ? (cap ? k_flash_tc<HD, true, CQ, false, !CQ, true> : k_flash_tc<HD, false, CQ, false, !CQ, true>)
                : (cap ? k_flash_tc<HD, true, CQ, false, false, true> : k_flash_tc<HD, false, CQ, false, false, true>);
        if (kn_cuda_launch_cluster(be, clustered, grid, dim3(TC_WARPS * 32), smem, (unsigned)f.n_splits, *a, *a->kv,
                                   f.n_splits, f.partial, f.counters, prefetch, early, rk) == cudaSuccess)
            return;
        /* no room for the cluster (a partitioned GPU, say): clusters off from
         * here on, these splits merged through the global partials */
        cudaGetLastError();
        cl_env = 0;
    }
    kn_cuda_run(be, "flash decode", plain, grid, dim3(TC_WARPS * 32), smem, *a, *a->kv, f.n_splits, f.partial,
                f.counters, prefetch, early, rk);
}

int kn_flash_decode_tc(kn_backend *be, const kn_attention_args *a, flash_plan f, int trans, kn_tc_rope rk) {
    trans = trans && a->n_heads / a->kv->n_kv_heads <= 8;
    const int k8v3 = a->kv->k_fmt == KN_KVF_Q8A && a->kv->v_fmt == KN_KVF_TQV3;
    if (!k8v3 && !(a->kv->k_fmt == KN_KVF_BF16 && a->kv->v_fmt == KN_KVF_BF16)) return 0;
    if (rk.on && k8v3) return 0; /* the rope prologue writes bf16 rows only */
    /* the L2 prefetch of each warp's first tile before the wait: bf16
     * caches of groups of KVF_TC_PREFETCH_MIN_GROUP heads or more (not
     * measured on k8v3); KILN_ATTN_PREFETCH=1 / 0 forces it on / off (A/B runs) */
    static int pf_env = -2;
    if (pf_env == -2) pf_env = kvf_env_switch("KILN_ATTN_PREFETCH", -1);
    const int pf = pf_env >= 0 ? pf_env : !k8v3 && a->n_heads / a->kv->n_kv_heads >= KVF_TC_PREFETCH_MIN_GROUP;
    switch (a->kv->head_dim) {
    case 64: k8v3 ? launch_tc<64, true>(be, a, f, trans, pf, rk) : launch_tc<64, false>(be, a, f, trans, pf, rk); return 1;
    case 128:
        k8v3 ? launch_tc<128, true>(be, a, f, trans, pf, rk) : launch_tc<128, false>(be, a, f, trans, pf, rk);
        return 1;
    default: return 0;
    }
}

/* cuda_flash_prefill.cu — fused tensor-core attention for prefill runs
 * (FlashAttention-2 style): a run of consecutive positions of one sequence
 * attends to its paged K/V without materializing scores in global memory.
 *
 * One block of 4 warps per (query tile, query head). Each warp owns 16 query
 * rows (runs of up to 64 rows: Q fragments in registers, 64-key tiles) or 32
 * (longer runs: two m-tiles, Q rows in shared memory, 32-key tiles, so each
 * K / V fragment read feeds two mma), and keeps in registers the score tile,
 * the running max m and sum l per row and the rows x HD output accumulator.
 * Key / value tiles are staged by cp.async (double-buffered) into shared
 * memory, K and V both row-major: bf16 cache rows with bf16 compute straight
 * from the paged cache through the block table; f32 rows, or f16 compute,
 * from a copy gathered once per run and rounded to the compute dtype
 * (compressed formats take the GEMM path). S = Q K^T and O += P V run as
 * mma.sync m16n8k16 with f32 accumulation (V fragments by ldmatrix.trans);
 * scale, soft-cap and the causal / sliding-window mask are applied to S in
 * f32, and the score fragments are re-packed in registers as the A operand
 * of P V (no shared-memory trip).
 *
 * Numerics: q, k, v and the unnormalized probabilities exp(s - m) are rounded
 * to the compute dtype (as the GEMM path rounds q/k/v/P); sums are f32; l sums
 * the rounded probabilities (an mma of P against ones, beside P V), so O is a
 * convex combination of the rounded v.
 *
 * Query tiles are scheduled heaviest first across all heads (the last tile
 * sees the most keys); a warp skips key tiles that are wholly masked for its
 * rows. Head dims 64 and 128 (others take the GEMM path). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_internal.h"

#define FP_BN 64 /* keys per gathered chunk (the buffer is padded to a multiple); key tiles are 32 or 64 */
#define FP_WARPS 4

template <int HD, int BN>
struct fp_layout {
    static constexpr int LDK = HD + 8; /* K, V and Q rows; +8 halves: conflict-free fragment reads */
    static constexpr size_t k_bytes = (size_t)BN * LDK * 2, v_bytes = k_bytes;
    static constexpr size_t stage = k_bytes + v_bytes, total = 2 * stage; /* double-buffered */
};

__device__ __forceinline__ void fp_cp16(void *smem, const void *gmem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void fp_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fp_cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* Four 8x8 b16 matrices from shared memory: lane l gives the address of row
 * l % 8 of matrix l / 8 and receives, of each matrix, row l / 4, columns
 * 2 (l % 4) and 2 (l % 4) + 1 (the B-fragment layout of fp_mma). */
__device__ __forceinline__ void fp_ldsm4(uint32_t *r, const void *smem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* the same with .trans: of each matrix, lane l receives column l / 4, rows
 * 2 (l % 4) and 2 (l % 4) + 1 (B fragments from row-major V: rows = keys) */
__device__ __forceinline__ void fp_ldsm4_t(uint32_t *r, const void *smem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#define FP_LOG2E 1.4426950408889634f

template <typename T> __device__ __forceinline__ uint32_t fp_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t fp_pack<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t fp_pack<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}
/* two 1.0s packed: the B operand that turns an mma into row sums */
template <typename T> __device__ __forceinline__ uint32_t fp_ones();
template <> __device__ __forceinline__ uint32_t fp_ones<__nv_bfloat16>() { return 0x3f803f80u; }
template <> __device__ __forceinline__ uint32_t fp_ones<__half>() { return 0x3c003c00u; }

/* d (16x8, f32) += a (16x16, row) . b (16x8, col): mma.sync m16n8k16 with
 * the PTX ISA's fragment layout (g = lane / 4, t = lane % 4):
 *   a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
 *   b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
 *   d0 (g, 2t)  d1 (g, 2t+1)  d2 (g+8, 2t)  d3 (g+8, 2t+1) */
template <typename T>
__device__ __forceinline__ void fp_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void fp_mma<__nv_bfloat16>(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    kn_mma_bf16(d, a, b0, b1);
}
template <>
__device__ __forceinline__ void fp_mma<__half>(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The run's keys and values [kbase, kbase + ctxp) of every KV head, rounded
 * to T: kg / vg [n_kv][ctxp][HD]; positions past last are zero. One block
 * per (64 keys, KV head). For caches whose rows the kernel cannot read as
 * they are (f32 rows, or bf16 rows with f16 compute). */
template <bool BF> __device__ __forceinline__ float4 fp_load4(const void *p, int64_t i) {
    if (!BF) return *(const float4 *)((const float *)p + i);
    const uint2 u = *(const uint2 *)((const uint16_t *)p + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

template <typename T, int HD, bool BF>
__global__ void __launch_bounds__(256) k_fp_gather(kn_kv_layer kv, const int32_t *__restrict__ bt, int kbase, int last,
                                                   int ctxp, T *__restrict__ kg, T *__restrict__ vg) {
    const int kvh = blockIdx.y, j0 = blockIdx.x * FP_BN, bs = kv.block_size;
    const int64_t kv_w = (int64_t)kv.n_kv_heads * kv.head_dim;
    for (int idx = threadIdx.x; idx < FP_BN * HD / 4; idx += blockDim.x) {
        const int j = idx / (HD / 4), c = (idx % (HD / 4)) * 4, p = kbase + j0 + j;
        float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
        if (p <= last) {
            const int64_t off = ((int64_t)bt[p / bs] * bs + p % bs) * kv_w + (int64_t)kvh * HD + c;
            k4 = fp_load4<BF>(kv.k, off), v4 = fp_load4<BF>(kv.v, off);
        }
        const int64_t o = ((int64_t)kvh * ctxp + j0 + j) * HD + c;
        *(uint2 *)(kg + o) = make_uint2(fp_pack<T>(k4.x, k4.y), fp_pack<T>(k4.z, k4.w));
        *(uint2 *)(vg + o) = make_uint2(fp_pack<T>(v4.x, v4.y), fp_pack<T>(v4.z, v4.w));
    }
}

/* Where the kernel reads key / value rows: the gathered buffers (kg / vg
 * [n_kv][ctxp][HD] from kbase), or, with DIRECT, the paged cache itself
 * (bf16 rows read as bf16 compute: k / v, block table bt, rows of kv_w
 * elements; positions past last read row last, whose probabilities are 0). */
template <typename T> struct fp_kv_src {
    const T *k, *v;
    const int32_t *bt;
    int block_size, ctxp, kbase, last;
    int64_t kv_w;
};

/* q, out: the run's first row; rows i of the run are at positions p0 + i;
 * src: where key / value rows come from (fp_kv_src).
 * MT: m-tiles of 16 query rows per warp. MT = 1 keeps the warp's Q fragments
 * in registers; MT = 2 (32 contiguous rows per warp, 128 per block) stages
 * Q in shared memory, and each K / V fragment read feeds two mma. */
template <bool B> struct fp_flag {
    static constexpr bool value = B;
};

template <typename T, int HD, bool CAP, int MT, int BN, bool DIRECT>
__global__ void __launch_bounds__(FP_WARPS * 32, MT == 1 && !CAP ? 3 : 2) /* 16 rows per warp: 3 blocks per SM */
    k_flash_prefill(const float *__restrict__ q, int64_t q_stride, float *__restrict__ out, int n_heads, int group,
                    fp_kv_src<T> src, int p0, int len, int window, float scale, float softcap) {
    typedef fp_layout<HD, BN> L;
    extern __shared__ __align__(128) unsigned char fp_smem[];
    constexpr int KT = HD / 16, NT = HD / 8, ST = BN / 8, BM = FP_WARPS * 16 * MT, WR = 16 * MT;
    constexpr bool QREG = MT == 1;
    constexpr size_t q_bytes = QREG ? 0 : (size_t)BM * L::LDK * 2; /* Q rows, padded like K rows */

    /* blocks start in launch order, x fastest: every head's latest (heaviest)
     * query tile first, then the next latest, so the light tiles fill the tail */
    const int tile = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, kvh = h / group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = tile * BM, rows = len - i0 < BM ? len - i0 : BM;
    /* this lane's rows, per m-tile: g and g + 8 of the m-tile's 16 */
    int ra[MT], pa[MT];
    bool oka[MT], okb[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        ra[mt] = warp * WR + mt * 16 + g, pa[mt] = p0 + i0 + ra[mt];
        oka[mt] = ra[mt] < rows, okb[mt] = ra[mt] + 8 < rows;
    }

    /* Q rounded to T: fragments in registers (MT = 1), or rows in shared
     * memory (published by the first tile's barrier) */
    uint32_t qa[QREG ? KT : 1][4];
    T *Qs = (T *)fp_smem;
    if constexpr (QREG) {
        const float *qra = q + (int64_t)(i0 + ra[0]) * q_stride + (int64_t)h * HD;
        const float *qrb = qra + 8 * q_stride;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            const int c = kk * 16 + 2 * t;
            qa[kk][0] = oka[0] ? fp_pack<T>(qra[c], qra[c + 1]) : 0u;
            qa[kk][1] = okb[0] ? fp_pack<T>(qrb[c], qrb[c + 1]) : 0u;
            qa[kk][2] = oka[0] ? fp_pack<T>(qra[c + 8], qra[c + 9]) : 0u;
            qa[kk][3] = okb[0] ? fp_pack<T>(qrb[c + 8], qrb[c + 9]) : 0u;
        }
    } else {
        for (int idx = threadIdx.x; idx < BM * HD / 2; idx += FP_WARPS * 32) {
            const int r = idx / (HD / 2), c = (idx % (HD / 2)) * 2;
            const float *qr = q + (int64_t)(i0 + r) * q_stride + (int64_t)h * HD + c;
            *(uint32_t *)(Qs + r * L::LDK + c) = r < rows ? fp_pack<T>(qr[0], qr[1]) : 0u;
        }
    }
    float o[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    /* m: running max of the raw scores per row; l (ol): running row sums of
     * the rounded probabilities, summed by an mma against ones (ol[.][0] row
     * g, ol[.][2] row g + 8) */
    float ma[MT], mb[MT], ol[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) ma[mt] = mb[mt] = -INFINITY, ol[mt][0] = ol[mt][1] = ol[mt][2] = ol[mt][3] = 0.0f;
    const float sl2 = scale * FP_LOG2E; /* probabilities 2^(s sl2 - m sl2) = e^(scale (s - m)) */
    const float cap_in = CAP ? scale / softcap : 0.0f, cap_out = CAP ? softcap / scale : 0.0f;

    const int first = p0 + i0, last = p0 + i0 + rows - 1;
    const int kbase = src.kbase, lo = window > 0 && first - window + 1 > kbase ? first - window + 1 : kbase;
    const int kt0 = kbase + (lo - kbase) / BN * BN; /* key tiles aligned to kbase (the gathered buffer's start) */
    const int n_tiles = (last - kt0) / BN + 1;
    const int w_first = p0 + i0 + warp * WR, w_last = w_first + WR - 1;
    unsigned char *kv_smem = fp_smem + q_bytes;
    /* stage tile it into buffer it & 1: K rows, then V rows (HD * 2 bytes each) */
    auto issue = [&](int it) {
        unsigned char *st = kv_smem + (it & 1) * L::stage;
        T *Ks = (T *)st, *Vs = (T *)(st + L::k_bytes);
        for (int idx = threadIdx.x; idx < BN * HD / 8; idx += FP_WARPS * 32) {
            const int j = idx / (HD / 8), c = (idx % (HD / 8)) * 8, p = kt0 + it * BN + j;
            int64_t off;
            if constexpr (DIRECT) {
                const int pc = p <= src.last ? p : src.last;
                off = ((int64_t)src.bt[pc / src.block_size] * src.block_size + pc % src.block_size) * src.kv_w +
                      (int64_t)kvh * HD + c;
            } else off = ((int64_t)kvh * src.ctxp + p - src.kbase) * HD + c;
            fp_cp16(Ks + j * L::LDK + c, src.k + off);
            fp_cp16(Vs + j * L::LDK + c, src.v + off);
        }
    };
    issue(0);
    fp_cp_commit();
    for (int it = 0; it < n_tiles; it++) {
        const int kt = kt0 + it * BN;
        if (it + 1 < n_tiles) issue(it + 1);
        fp_cp_commit();
        fp_cp_wait1(); /* tile it has landed (for this thread) */
        __syncthreads();
        const T *Ks = (const T *)(kv_smem + (it & 1) * L::stage),
                *Vs = (const T *)(kv_smem + (it & 1) * L::stage + L::k_bytes);
        /* one key tile for this warp's rows; MASKED: some score of the tile
         * is masked (diagonal, window edge, padding rows). The two variants
         * are separate code, so unmasked tiles carry no mask arithmetic. */
        auto tile_step = [&](auto masked_flag) {
            constexpr bool MASKED = decltype(masked_flag)::value;
            float s[MT][ST][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < ST; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t qf[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (QREG) qf[mt][0] = qa[kk][0], qf[mt][1] = qa[kk][1], qf[mt][2] = qa[kk][2], qf[mt][3] = qa[kk][3];
                    else /* A layout: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15) */
                        fp_ldsm4(qf[mt], Qs + (warp * WR + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * L::LDK +
                                             kk * 16 + (lane >> 4) * 8);
                }
#pragma unroll
                for (int n = 0; n < ST; n += 2) { /* keys of n-tiles n, n + 1; dims kk*16 .. +16 */
                    uint32_t b[4];
                    fp_ldsm4(b, Ks + (n * 8 + (lane >> 4) * 8 + (lane & 7)) * L::LDK + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        fp_mma<T>(s[mt][n], qf[mt], b[0], b[1]);
                        fp_mma<T>(s[mt][n + 1], qf[mt], b[2], b[3]);
                    }
                }
            }
            /* soft-cap and mask the raw scores; running max per row (the 4 lanes
             * of a quad share rows). Tiles wholly inside every row's causal
             * window, with no padding rows, need no mask (warp-uniform). The
             * scale is applied inside the exponent (one fma per score). */
            uint32_t pf[MT][BN / 16][4]; /* P (rounded to T) as A fragments of the P.V product */
            float fa[MT], fb[MT]; /* per row: the factor of the output and sums so far */
            bool moved = false;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
                for (int n = 0; n < ST; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float v = s[mt][n][e];
                        if (CAP) v = cap_out * tanhf(v * cap_in); /* s' with s' scale = softcap tanh(s scale / softcap) */
                        if (MASKED) {
                            const int kp = kt + n * 8 + 2 * t + (e & 1), p = pa[mt] + (e < 2 ? 0 : 8);
                            const bool ok = (e < 2 ? oka[mt] : okb[mt]) && kp <= p && (window <= 0 || kp > p - window);
                            v = ok ? v : -INFINITY;
                        }
                        s[mt][n][e] = v;
                        if (e < 2) mxa = fmaxf(mxa, v);
                        else mxb = fmaxf(mxb, v);
                    }
                const kn_softmax_step sm = kn_softmax_rows(mxa, mxb, ma[mt], mb[mt], sl2);
                const float za = sm.za, zb = sm.zb, aa = sm.aa, ab = sm.ab;
#pragma unroll
                for (int n = 0; n < ST; n++) {
                    const float e0 = kn_exp2_approx(fmaf(s[mt][n][0], sl2, -za)), e1 = kn_exp2_approx(fmaf(s[mt][n][1], sl2, -za));
                    const float e2 = kn_exp2_approx(fmaf(s[mt][n][2], sl2, -zb)), e3 = kn_exp2_approx(fmaf(s[mt][n][3], sl2, -zb));
                    pf[mt][n / 2][(n & 1) * 2 + 0] = fp_pack<T>(e0, e1); /* n even: a0 / a1; n odd: a2 / a3 */
                    pf[mt][n / 2][(n & 1) * 2 + 1] = fp_pack<T>(e2, e3);
                }
                fa[mt] = aa, fb[mt] = ab;
                moved |= aa != 1.0f || ab != 1.0f;
            }
            if (__any_sync(0xffffffffu, moved)) { /* only when some row's max moved */
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const float aa = fa[mt], ab = fb[mt];
                    ol[mt][0] *= aa, ol[mt][1] *= aa, ol[mt][2] *= ab, ol[mt][3] *= ab;
#pragma unroll
                    for (int n = 0; n < NT; n++) o[mt][n][0] *= aa, o[mt][n][1] *= aa, o[mt][n][2] *= ab, o[mt][n][3] *= ab;
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) fp_mma<T>(ol[mt], pf[mt][kk], fp_ones<T>(), fp_ones<T>());
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int n = 0; n < NT; n += 2) { /* dims of n-tiles n, n + 1; keys kk*16 .. +16 */
                    uint32_t b[4];
                    /* matrices (keys 0-7 | 8-15) x (dims of n | n + 1), transposed */
                    fp_ldsm4_t(b, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * L::LDK + n * 8 + (lane >> 4) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        fp_mma<T>(o[mt][n], pf[mt][kk], b[0], b[1]);
                        fp_mma<T>(o[mt][n + 1], pf[mt][kk], b[2], b[3]);
                    }
                }
        };
        /* wholly masked for this warp's rows: nothing changes */
        if (!(kt > w_last || (window > 0 && kt + BN - 1 <= w_first - window) || warp * WR >= rows)) {
            if (kt + BN - 1 > w_first || (window > 0 && kt <= w_last - window) || warp * WR + WR > rows)
                tile_step(fp_flag<true>());
            else tile_step(fp_flag<false>());
        }
        __syncthreads(); /* buffer it & 1 is refilled by the next iteration's issue */
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const float la = ol[mt][0], lb = ol[mt][2];
        const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
        float *oa = out + (int64_t)(i0 + ra[mt]) * n_heads * HD + (int64_t)h * HD + 2 * t;
        float *ob = oa + (int64_t)8 * n_heads * HD;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            if (oka[mt]) *(float2 *)(oa + n * 8) = make_float2(o[mt][n][0] * ia, o[mt][n][1] * ia);
            if (okb[mt]) *(float2 *)(ob + n * 8) = make_float2(o[mt][n][2] * ib, o[mt][n][3] * ib);
        }
    }
}

/* dynamic shared memory of k_flash_prefill<., HD, ., MT, BN, .>: Q rows (MT > 1), double-buffered K / V tiles */
template <int HD, int MT, int BN> static constexpr size_t fp_smem_bytes() {
    return (MT > 1 ? (size_t)FP_WARPS * 16 * MT * fp_layout<HD, BN>::LDK * 2 : 0) + fp_layout<HD, BN>::total;
}

template <typename T, int HD, int MT, int BN, bool DIRECT>
static int launch_fp_cfg(const kn_attention_args *a, cudaStream_t st, int t0, int len, int G, const fp_kv_src<T> &src) {
    static int attr_set = 0; /* per instantiation */
    const size_t smem = fp_smem_bytes<HD, MT, BN>();
    if (!attr_set) {
        if (cudaFuncSetAttribute(k_flash_prefill<T, HD, false, MT, BN, DIRECT>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
            cudaFuncSetAttribute(k_flash_prefill<T, HD, true, MT, BN, DIRECT>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        attr_set = 1;
    }
    const int bm = FP_WARPS * 16 * MT;
    const dim3 grid((unsigned)a->n_heads, (unsigned)((len + bm - 1) / bm));
    (a->softcap > 0.0f ? k_flash_prefill<T, HD, true, MT, BN, DIRECT>
                       : k_flash_prefill<T, HD, false, MT, BN, DIRECT>)<<<grid, FP_WARPS * 32, smem, st>>>(
        a->q + (int64_t)t0 * a->q_stride, a->q_stride, a->out + (int64_t)t0 * a->n_heads * HD, a->n_heads, G, src,
        a->pos_host[t0], len, a->window, a->scale, a->softcap);
    return cudaPeekAtLastError() == cudaSuccess;
}

/* runs longer than one 64-row tile: 32 rows per warp with 32-key tiles.
 * KILN_FP_CFG=1x64 | 2x32 (16-row m-tiles per warp x keys per tile) forces
 * one, for A/B benchmarks */
template <typename T, int HD, bool DIRECT>
static int launch_fp_any(const kn_attention_args *a, cudaStream_t st, int t0, int len, int G, const fp_kv_src<T> &src) {
    static int cfg = -1;
    if (cfg < 0) {
        const char *e = getenv("KILN_FP_CFG");
        cfg = !e ? 0 : !strcmp(e, "1x64") ? 1 : !strcmp(e, "2x32") ? 2 : 0;
    }
    if (cfg == 2 || (cfg == 0 && len > FP_WARPS * 16)) return launch_fp_cfg<T, HD, 2, 32, DIRECT>(a, st, t0, len, G, src);
    return launch_fp_cfg<T, HD, 1, 64, DIRECT>(a, st, t0, len, G, src);
}

template <typename T, int HD>
static int launch_fp(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    const kn_kv_layer *kv = a->kv;
    const int s = a->seq_host[t0], G = a->n_heads / kv->n_kv_heads, p0 = a->pos_host[t0], last = p0 + len - 1;
    const int kbase = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0;
    const int ctxp = (last - kbase + FP_BN) / FP_BN * FP_BN;
    const int32_t *bt = a->block_tables + (int64_t)s * a->max_blocks;
    cudaStream_t st = kn_cuda_stream(be);
    fp_kv_src<T> src = {NULL, NULL, bt, kv->block_size, ctxp, kbase, last, (int64_t)kv->n_kv_heads * HD};
    /* bf16 rows with bf16 compute: read in place (KILN_FP_GATHER=1 gathers them first, for A/B runs) */
    static int force_gather = -1;
    if (force_gather < 0) force_gather = getenv("KILN_FP_GATHER") != NULL;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        if (kv->k_fmt == KN_KVF_BF16 && !force_gather) {
            src.k = (const T *)kv->k, src.v = (const T *)kv->v;
            return launch_fp_any<T, HD, true>(a, st, t0, len, G, src);
        }
    }
    const size_t one_buf = (size_t)kv->n_kv_heads * ctxp * HD * sizeof(T);
    T *kg = (T *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTN_GEMM, 2 * one_buf);
    if (!kg) return 0;
    T *vg = (T *)((char *)kg + one_buf);
    const dim3 ggrid((unsigned)(ctxp / FP_BN), (unsigned)kv->n_kv_heads);
    kn_cuda_before_launch();
    if (kv->k_fmt == KN_KVF_BF16) k_fp_gather<T, HD, true><<<ggrid, 256, 0, st>>>(*kv, bt, kbase, last, ctxp, kg, vg);
    else k_fp_gather<T, HD, false><<<ggrid, 256, 0, st>>>(*kv, bt, kbase, last, ctxp, kg, vg);
    kn_cuda_launched(be, "fp_gather");
    src.k = kg, src.v = vg;
    return launch_fp_any<T, HD, false>(a, st, t0, len, G, src);
}

template <typename T>
static int launch_fp_hd(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    switch (a->kv->head_dim) {
    case 64: return launch_fp<T, 64>(be, a, t0, len);
    case 128: return launch_fp<T, 128>(be, a, t0, len);
    default: return 0;
    }
}

/* Run tokens [t0, t0 + len) of a (one sequence, consecutive positions)
 * through the fused kernel. Returns 0, having enqueued nothing, when the
 * shape or dtype is not covered (f32 compute, other head dims, unaligned
 * rows): the caller then takes another path. */
int kn_cuda_flash_prefill(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    const int hd = a->kv->head_dim;
    if (a->compute_dtype != KN_DT_BF16 && a->compute_dtype != KN_DT_F16) return 0;
    const int fk = a->kv->k_fmt, fv = a->kv->v_fmt; /* float or bf16 rows; compressed ones take the GEMM path */
    if (fk != fv || (fk != KN_KVF_F32 && fk != KN_KVF_BF16)) return 0;
    if (((uintptr_t)a->out & 15) || ((uintptr_t)a->kv->k & 15) || ((uintptr_t)a->kv->v & 15) ||
        ((int64_t)a->kv->n_kv_heads * hd) % 4)
        return 0;
    static int disabled = -1; /* KILN_NO_FLASH_PREFILL=1: the GEMM path, for A/B benchmarks */
    if (disabled < 0) disabled = getenv("KILN_NO_FLASH_PREFILL") != NULL;
    if (disabled) return 0;
    return a->compute_dtype == KN_DT_BF16 ? launch_fp_hd<__nv_bfloat16>(be, a, t0, len)
                                          : launch_fp_hd<__half>(be, a, t0, len);
}

/* cuda_qgemv.cu — decode-shaped matmuls (1–2 rows of x) over MLX affine
 * 4/8-bit weights, with integer dot products (dp4a) instead of a float
 * conversion per code, so that the kernel streams codes at the memory rate.
 *
 * x is carried as two int8 terms per group of the weight (the scheme of the
 * CPU's VNNI kernels, cpu_qgemm_vnni.c): with mx = max |x| over the group,
 * t = x * 127 / mx, h = rint(t), l = clamp(rint((t - h) * 256), +-127), so
 * x ~= d * (256 h + l), d = mx / (127 * 256); an element's error is at most
 * 1/32512 of mx (kn_backend.quant_x_rel_error). For a group of codes q of one
 * weight row with scale s and bias b:
 *   sum x * (s q + b) ~= s * d * sum q (256 h + l) + b * sum x
 * where the integer sum is exact and sum x is the float sum of x itself.
 *
 * A persistent grid (as many blocks as fit at once): every block quantizes x
 * into shared memory once (the RMSNorm prologue, when fused, is applied first),
 * then each of its warps (8; the bulk kernel's 16 or 8) streams sets of 2
 * weight rows: lane j takes 16-byte pieces j, j + 32, ... of both rows (32
 * 4-bit or 16 8-bit codes, always inside one group), U per row per chunk, the
 * next chunk's loads issued before the current chunk is computed. For 4-bit
 * codes the x bytes are stored in the order the nibble split produces (per 8
 * elements: 0 2 4 6 | 1 3 5 7), so one `and` and one shift per word feed two
 * dp4a. Partial sums meet in a warp reduction; the SwiGLU epilogue pairs gate
 * row n with up row n + N in one warp.
 *
 * Two kernels stream the weights: k_qgemv_bulk, where the shape allows (every
 * chunk's codes, scales and biases whole 16-byte units), has the copy engine
 * fill a ring of shared-memory stages per warp (several chunks in flight per
 * warp without registers to hold them); k_qgemv, for every other shape, holds
 * the next chunk in registers.
 *
 * The bulk kernel also runs one token's routed MoE experts (qg_rowmap): the
 * gate/up over the selected experts' rows, and the down with each output row
 * a virtual row through the k selected experts' rows.
 *
 * Launched as a programmatic dependent launch: the first weight loads go out
 * before the wait on the previous kernel (weights are immutable; the experts'
 * gate/up waits first, since its rows depend on the routing). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_qgemv_trace.cuh"

#define QG_WARPS 8
#define QG_RW 2                 /* weight rows per warp */
#define QG_MAX_SMEM (160 << 10)

/* c + sum of the 4 byte products a (unsigned codes) . b (signed x terms) */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* scale / bias element i stored as F32, BF16 or F16, kept as raw bits so
 * the load can be issued long before its value is used */
__device__ __forceinline__ uint32_t sb_raw(const void *p, int dt, int64_t i) {
    return dt == KN_DT_F32 ? __ldg((const uint32_t *)p + i) : (uint32_t)__ldg((const unsigned short *)p + i);
}
template <int SB> /* the format known at compile time (the bulk kernel) */
__device__ __forceinline__ float sb_val_t(uint32_t raw) {
    if (SB == KN_DT_F32) return __uint_as_float(raw);
    if (SB == KN_DT_BF16) return __uint_as_float(raw << 16);
    return __half2float(__ushort_as_half((unsigned short)raw));
}
__device__ __forceinline__ float sb_val(uint32_t raw, int dt) {
    return dt == KN_DT_F32 ? sb_val_t<KN_DT_F32>(raw) : dt == KN_DT_BF16 ? sb_val_t<KN_DT_BF16>(raw) : sb_val_t<KN_DT_F16>(raw);
}

/* Shared memory of one block, for M rows of x of K elements:
 *   xh, xl  int8 [M][K]     the two terms, in code order
 *   xd      float [M][K/gs] d of each group
 *   xs      float [M][K/16] sum of x over each 16 elements */
struct qg_smem {
    int8_t *xh, *xl;
    float *xd, *xs;
};
__device__ __forceinline__ qg_smem qg_layout(void *base, int M, int64_t K, int gs) {
    qg_smem s;
    s.xh = (int8_t *)base;
    s.xl = s.xh + (int64_t)M * K;
    s.xd = (float *)(s.xl + (int64_t)M * K);
    s.xs = s.xd + (int64_t)M * (K / gs);
    return s;
}
static size_t qg_smem_bytes(int M, int64_t K, int gs) {
    return (size_t)M * (size_t)K * 2 + (size_t)M * (size_t)(K / gs) * 4 + (size_t)M * (size_t)(K / 16) * 4;
}

/* Byte offset within a row of x's terms of the 16-element chunk at k0. 8-bit:
 * in place (a piece is one chunk). 4-bit: a piece (32 codes) takes two
 * chunks, stored in two planes K/2 apart (first halves, then second halves),
 * so lane j's 16-byte reads of piece j are contiguous across the warp and
 * free of bank conflicts. */
template <int BITS, typename I>
__device__ __forceinline__ I qg_x_offset(I k0, I K) {
    if (BITS == 8) return k0;
    return ((k0 >> 4) & 1) * (K / 2) + (k0 >> 5) * 16;
}

/* position of element e (0..15) of a 16-element chunk in code order */
template <int BITS>
__device__ __forceinline__ int code_pos(int e) {
    if (BITS == 8) return e;
    const int i = e & 7;
    return (e & 8) + (i & 1) * 4 + (i >> 1);
}

/* The block of W warps quantizes x (M rows; with norm_w: rms_norm(x) * norm_w
 * first) into s. Thread t takes 16-element chunks t, t + 32 W, ..., QG_XB of
 * them per batch with all their loads issued together (the prologue is a few
 * dependent L2 round trips, not one per chunk); the gs / 16 chunks of a group
 * sit in adjacent lanes of one warp and share their max by shuffles. Every
 * thread runs the same number of iterations (the shuffles need the whole warp).
 * When x fits one batch, the sums of squares come from the same registers;
 * otherwise a first pass reads x for them. */
#define QG_XB 2
template <int M, int W>
__device__ __forceinline__ void qg_block_rms(float (&ss)[M], int64_t K, float eps, float *inv_rms) {
    __shared__ float red[M][W];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int m = 0; m < M; m++) {
        for (int o = 16; o > 0; o >>= 1) ss[m] += __shfl_xor_sync(0xffffffffu, ss[m], o);
        if (lane == 0) red[m][warp] = ss[m];
    }
    __syncthreads();
    if (tid < M) {
        float tot = 0.0f;
        for (int i = 0; i < W; i++) tot += red[tid][i];
        inv_rms[tid] = 1.0f / sqrtf(tot / (float)K + eps);
    }
    __syncthreads();
}

template <int BITS, int M, int NORM, bool XW, int W>
__device__ void qg_quantize_x(const float *__restrict__ x, int64_t K, int gs, const float *__restrict__ norm_w,
                              float eps, qg_smem s, const float *__restrict__ xw, int64_t xw_span) {
    __shared__ float inv_rms[M];
    constexpr int T = W * 32;
    const int tid = threadIdx.x;
    const int chunks = (int)(K / 16), total = M * chunks; /* 32-bit: x is at most 160 KB */
    const bool one_batch = total <= QG_XB * T;
    if (NORM && !one_batch) {
        float ss[M];
#pragma unroll
        for (int m = 0; m < M; m++) ss[m] = 0.0f;
#pragma unroll 4
        for (int c = tid; c < total; c += T) {
            const float4 *src = (const float4 *)(x + (int64_t)c * 16); /* rows are contiguous: chunk c of x */
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 v = __ldg(src + i);
                a += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
#pragma unroll
            for (int m = 0; m < M; m++) ss[m] += c / chunks == m ? a : 0.0f;
        }
        qg_block_rms<M, W>(ss, K, eps, inv_rms);
    }
    const int span = gs / 16; /* lanes sharing a group */
    for (int c0 = 0; c0 < total; c0 += QG_XB * T) {
        float v[QG_XB][16], g[QG_XB][16];
        int cm[QG_XB];
#pragma unroll
        for (int b = 0; b < QG_XB; b++) { /* every load of the batch first */
            const int c = c0 + b * T + tid;
            cm[b] = c < total ? c / chunks : -1;
            if (cm[b] < 0) continue;
            const int64_t k0 = (int64_t)(c - cm[b] * chunks) * 16;
            const float4 *src = (const float4 *)(x + (int64_t)c * 16);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 a = __ldg(src + i);
                v[b][4 * i] = a.x, v[b][4 * i + 1] = a.y, v[b][4 * i + 2] = a.z, v[b][4 * i + 3] = a.w;
            }
            if (NORM) {
                const float4 *gw = (const float4 *)(norm_w + k0);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 a = __ldg(gw + i);
                    g[b][4 * i] = a.x, g[b][4 * i + 1] = a.y, g[b][4 * i + 2] = a.z, g[b][4 * i + 3] = a.w;
                }
            }
        }
        if (NORM && one_batch) {
            float ss[M];
#pragma unroll
            for (int m = 0; m < M; m++) ss[m] = 0.0f;
#pragma unroll
            for (int b = 0; b < QG_XB; b++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i++) a += cm[b] >= 0 ? v[b][i] * v[b][i] : 0.0f;
#pragma unroll
                for (int m = 0; m < M; m++) ss[m] += cm[b] == m ? a : 0.0f;
            }
            qg_block_rms<M, W>(ss, K, eps, inv_rms);
        }
#pragma unroll
        for (int b = 0; b < QG_XB; b++) {
            const bool on = cm[b] >= 0;
            float mx = 0.0f, sum = 0.0f;
            if (on) {
                if (NORM) {
                    const float inv = inv_rms[cm[b]];
#pragma unroll
                    for (int i = 0; i < 16; i++) v[b][i] = g[b][i] * (v[b][i] * inv);
                }
                if (XW) { /* x scaled span by span (xw_span a multiple of 16) */
                    const int64_t k0 = (int64_t)(c0 + b * T + tid - cm[b] * chunks) * 16;
                    const float sw = __ldg(xw + k0 / xw_span);
#pragma unroll
                    for (int i = 0; i < 16; i++) v[b][i] *= sw;
                }
#pragma unroll
                for (int i = 0; i < 16; i++) mx = fmaxf(mx, fabsf(v[b][i])), sum += v[b][i];
            }
            for (int o = 1; o < span; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (!on) continue;
            const int c = c0 + b * T + tid, m = cm[b];
            const int64_t k0 = (int64_t)(c - m * chunks) * 16;
            const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
            uint32_t hw[4] = {0u, 0u, 0u, 0u}, lw[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int e = 0; e < 16; e++) {
                const float t = v[b][e] * inv, hf = rintf(t);
                const float lf = fminf(fmaxf(rintf((t - hf) * 256.0f), -127.0f), 127.0f);
                const int p = code_pos<BITS>(e);
                hw[p >> 2] |= ((uint32_t)(int)hf & 0xffu) << (8 * (p & 3));
                lw[p >> 2] |= ((uint32_t)(int)lf & 0xffu) << (8 * (p & 3));
            }
            const int64_t o = (int64_t)m * K + qg_x_offset<BITS>(k0, K);
            *(uint4 *)(s.xh + o) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
            *(uint4 *)(s.xl + o) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
            s.xs[(int64_t)m * chunks + k0 / 16] = sum;
            if ((k0 & (gs - 1)) == 0) s.xd[(int64_t)m * (K / gs) + (int)k0 / gs] = mx / (127.0f * 256.0f);
        }
    }
    __syncthreads();
}

/* After a kernel's weight-only loads: wait for the previous kernel, quantize
 * x into the block's shared memory at base (returned as its layout) and
 * zero the warp's sums. With xw, element c of x is first multiplied by
 * xw[c / xw_span]. */
template <int BITS, int M, int NORM, bool XW = false, int W = QG_WARPS>
__device__ __forceinline__ qg_smem qg_begin(void *base, const float *__restrict__ x, int64_t K, int gs,
                                            const float *__restrict__ norm_w, float eps, float (*acc)[M],
                                            const float *__restrict__ xw = nullptr, int64_t xw_span = 1) {
    kn_pdl_wait();
    const qg_smem s = qg_layout(base, M, K, gs);
    qg_quantize_x<BITS, M, NORM, XW, W>(x, K, gs, norm_w, eps, s, xw, xw_span);
#pragma unroll
    for (int r = 0; r < QG_RW; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    return s;
}

/* sum over one 16-byte piece of codes of q * (256 h + l); x terms at xh / xl
 * (4-bit: the piece's second half `plane` bytes further) */
template <int BITS>
__device__ __forceinline__ int qg_piece_dot(uint4 w, const int8_t *xh, const int8_t *xl, int plane) {
    const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
    if (BITS == 4) { /* 32 codes; x words 2i (even elements) and 2i + 1 (odd) of 8 */
        const uint4 h0 = *(const uint4 *)xh, h1 = *(const uint4 *)(xh + plane);
        const uint4 l0 = *(const uint4 *)xl, l1 = *(const uint4 *)(xl + plane);
        const uint32_t hx[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t lx[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) lo[i] = wd[i] & 0x0f0f0f0fu, hi[i] = (wd[i] >> 4) & 0x0f0f0f0fu;
        int ih = 0, il = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            ih = dp4a_us(lo[i], hx[2 * i], ih), ih = dp4a_us(hi[i], hx[2 * i + 1], ih);
            il = dp4a_us(lo[i], lx[2 * i], il), il = dp4a_us(hi[i], lx[2 * i + 1], il);
        }
        return ih * 256 + il;
    }
    const uint4 h = *(const uint4 *)xh, l = *(const uint4 *)xl; /* 16 codes in element order */
    const uint32_t hx[4] = {h.x, h.y, h.z, h.w}, lx[4] = {l.x, l.y, l.z, l.w};
    int ih = 0, il = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) ih = dp4a_us(wd[i], hx[i], ih), il = dp4a_us(wd[i], lx[i], il);
    return ih * 256 + il;
}

/* The loads of one chunk of a warp's stream: U pieces of each of its RW rows
 * (codes, and the raw bits of their groups' scale and bias). */
template <int U>
struct qg_chunk {
    uint4 q[U][QG_RW];
    uint32_t s[U][QG_RW], b[U][QG_RW];
};

/* The warp's stream: column sets set0, set0 + stride, ... (a set = C output
 * columns = RW weight rows), each in NCH chunks of 32 * U pieces per row. */
struct qg_stream {
    int64_t set0, stride, n_sets, N, P, G;
    int nch, gshift, sbdt; /* group size 1 << gshift */
};

/* a chunk's place in the stream: its column set and its index in the set
 * (kept incrementally: no integer division in the loop) */
struct qg_pos {
    int64_t set;
    int i;
};
__device__ __forceinline__ qg_pos qg_next(const qg_stream &st, qg_pos p) {
    if (++p.i == st.nch) p.i = 0, p.set += st.stride;
    return p;
}

/* warp's stream in a persistent grid over N output columns (C per set) of a
 * K-wide matrix with groups of gs (a power of two), chunks of 32 * U pieces
 * per row; *total = the number of chunks it computes */
template <int BITS, int C, int W = QG_WARPS>
__device__ __forceinline__ qg_stream qg_stream_of(int64_t N, int64_t K, int gs, int sbdt, int U, int warp,
                                                  int64_t *total) {
    constexpr int E = 128 / BITS;
    qg_stream st;
    st.N = N, st.P = K / E, st.G = K / gs, st.gshift = __ffs(gs) - 1, st.sbdt = sbdt;
    st.nch = (int)((st.P + 32 * U - 1) / (32 * U));
    st.n_sets = (N + C - 1) / C;
    /* warp-major: sets 0.. go to warp 0 of every block, then warp 1, ..., so
     * every block (and SM) gets the same number of sets within one; the
     * block-major order gave the first blocks a set more per warp (qkv of
     * Llama-3-8B: 1.45 sets a warp, 60 of 132 SMs with 2 a warp) */
    st.set0 = (int64_t)warp * gridDim.x + blockIdx.x, st.stride = (int64_t)gridDim.x * W;
    const int64_t my_sets = st.set0 < st.n_sets ? (st.n_sets - st.set0 + st.stride - 1) / st.stride : 0;
    *total = my_sets * st.nch;
    return st;
}


/* Where the bulk kernel's weight rows come from (idx: the slots' expert ids):
 *   dense (idx NULL): output column n's rows n and, for SwiGLU, n + N;
 *   experts' gate/up (wt NULL; kn_cuda_qgemv_moe_gate_up): output column n
 *     is row r = n % inter of slot j = n / inter, i.e. rows idx[j] * 2 *
 *     inter + r (gate) and that + inter (up) of the [n_experts * 2 * inter,
 *     K] stack;
 *   experts' down (kn_cuda_qgemv_moe_down): output row n is a virtual row of
 *     slots * inter codes, the slots' rows idx[j] * N + n of the
 *     [n_experts * N, inter] stack one after another, against x = the slots'
 *     activations [slots, inter], each slot's scaled by its routing weight
 *     wt[j] as it is quantized: out[n] = sum_j wt[j] (down_e[n] . A[j]). */
enum { QG_MAP_DENSE = 0, QG_MAP_GATE_UP = 1, QG_MAP_DOWN = 2 }; /* the bulk kernel's MAP */
struct qg_rowmap {
    const int32_t *idx;
    int64_t inter;
    const float *wt;
    int slots;
};
__device__ __forceinline__ int64_t qg_row(const qg_rowmap &mp, int64_t n, bool second) {
    const int64_t j = n / mp.inter, base = (int64_t)__ldcg(mp.idx + j) * 2 * mp.inter + (n - j * mp.inter);
    return second ? base + mp.inter : base;
}

template <int BITS, int U, int NR>
__device__ __forceinline__ void qg_load(const qg_stream &st, qg_pos pos, int lane, const uint4 *__restrict__ q,
                                        const void *__restrict__ scales, const void *__restrict__ biases,
                                        qg_chunk<U> &c) {
    constexpr int C = QG_RW / NR, E = 128 / BITS;
    const int64_t set = pos.set;
    const int i = pos.i;
#pragma unroll
    for (int r = 0; r < QG_RW; r++) {
        const int64_t n = set * C + r / NR < st.N ? set * C + r / NR : st.N - 1; /* past N: read, dropped */
        const int64_t row = (r % NR) ? n + st.N : n;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = lane + 32 * ((int64_t)U * i + u);
            if (j < st.P) {
                const int64_t gi = row * st.G + ((j * E) >> st.gshift);
                c.q[u][r] = __ldcs(q + row * st.P + j);
                c.s[u][r] = sb_raw(scales, st.sbdt, gi), c.b[u][r] = sb_raw(biases, st.sbdt, gi);
            }
        }
    }
}

/* after a set's last chunk: the warp's sums are reduced, lane 0 writes the
 * set's outputs, and the sums restart from zero */
template <int M, int EPI>
__device__ __forceinline__ void qg_finish_set(const qg_stream &st, int64_t set, int lane, float (*acc)[M],
                                              const float *__restrict__ bias, float *__restrict__ out, int accumulate) {
    constexpr int NR = EPI == KN_EPI_SWIGLU ? 2 : 1, C = QG_RW / NR;
#pragma unroll
    for (int r = 0; r < QG_RW; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
            for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if (lane == 0)
#pragma unroll
        for (int cc = 0; cc < C; cc++) {
            const int64_t n = set * C + cc;
            if (n >= st.N) break;
#pragma unroll
            for (int m = 0; m < M; m++) {
                if (EPI == KN_EPI_SWIGLU) {
                    const float gt = acc[cc * NR][m] + (bias ? bias[n] : 0.0f);
                    const float up = acc[cc * NR + NR - 1][m] + (bias ? bias[n + st.N] : 0.0f);
                    out[(int64_t)m * st.N + n] = gt / (1.0f + expf(-gt)) * up;
                } else {
                    const float v = acc[cc][m] + (bias ? bias[n] : 0.0f);
                    float *dst = out + (int64_t)m * st.N + n;
                    *dst = accumulate ? *dst + v : v;
                }
            }
        }
#pragma unroll
    for (int r = 0; r < QG_RW; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
}

/* chunk f into acc; after a set's last chunk, the warp's sums are reduced and
 * lane 0 writes the set's outputs */
template <int BITS, int M, int EPI, int U>
__device__ __forceinline__ void qg_compute(const qg_stream &st, qg_pos pos, int lane, const qg_chunk<U> &c,
                                           const qg_smem &s, int64_t K, float (*acc)[M], const float *__restrict__ bias,
                                           float *__restrict__ out, int accumulate) {
    constexpr int E = 128 / BITS;
    const int i = pos.i;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t j = lane + 32 * ((int64_t)U * i + u);
        if (j >= st.P) break;
        const int64_t k0 = j * E, g = k0 >> st.gshift;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const int64_t o = (int64_t)m * K + k0, ox = (int64_t)m * K + qg_x_offset<BITS>(k0, K);
            const float d = s.xd[(int64_t)m * st.G + g];
            float sx = s.xs[o / 16];
            if (BITS == 4) sx += s.xs[o / 16 + 1];
#pragma unroll
            for (int r = 0; r < QG_RW; r++) {
                const int dot = qg_piece_dot<BITS>(c.q[u][r], s.xh + ox, s.xl + ox, K / 2);
                acc[r][m] += sb_val(c.s[u][r], st.sbdt) * (d * (float)dot) + sb_val(c.b[u][r], st.sbdt) * sx;
            }
        }
    }
    if (i == st.nch - 1) qg_finish_set<M, EPI>(st, pos.set, lane, acc, bias, out, accumulate);
}

/* N output columns (SwiGLU: half of W's rows); K a multiple of gs, gs a
 * multiple of 32 (4-bit) or 16 (8-bit) and at most 512. A persistent grid:
 * each warp streams its column sets chunk by chunk, the next chunk's loads
 * in flight while the current one is computed, so the block's x prologue is
 * paid once and the loads never stop. */
template <int BITS, int M, int NORM, int EPI, int U>
__global__ void __launch_bounds__(QG_WARPS * 32)
    k_qgemv(const float *__restrict__ x, const uint4 *__restrict__ q, const void *__restrict__ scales,
            const void *__restrict__ biases, int sbdt, int64_t N, int64_t K, int gs, const float *__restrict__ bias,
            float *__restrict__ out, int accumulate, const float *__restrict__ norm_w, float eps) {
    extern __shared__ float4 qg_dyn[];
    constexpr int NR = EPI == KN_EPI_SWIGLU ? 2 : 1; /* weight rows per output column */
    constexpr int C = QG_RW / NR;                    /* output columns per set */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t total;
    const qg_stream st = qg_stream_of<BITS, C>(N, K, gs, sbdt, U, warp, &total);
    kn_pdl_trigger();

    qg_chunk<U> ca, cb;
    qg_pos p = {st.set0, 0};
    if (total > 0) qg_load<BITS, U, NR>(st, p, lane, q, scales, biases, ca); /* before the wait: weights only */
    float acc[QG_RW][M];
    const qg_smem s = qg_begin<BITS, M, NORM>(qg_dyn, x, K, gs, norm_w, eps, acc);
    for (int64_t f = 0; f < total; f += 2) { /* two buffers, alternating, no dynamic register indexing */
        const qg_pos p1 = qg_next(st, p), p2 = qg_next(st, p1);
        if (f + 1 < total) qg_load<BITS, U, NR>(st, p1, lane, q, scales, biases, cb);
        qg_compute<BITS, M, EPI, U>(st, p, lane, ca, s, K, acc, bias, out, accumulate);
        if (f + 2 < total) qg_load<BITS, U, NR>(st, p2, lane, q, scales, biases, ca);
        if (f + 1 < total) qg_compute<BITS, M, EPI, U>(st, p1, lane, cb, s, K, acc, bias, out, accumulate);
        p = p2;
    }
}

/* ---- Bulk-copy variant: each warp runs its own pipeline of QB_STAGES
 * shared-memory stages, filled by the copy engine (cp.async.bulk, completion
 * on one mbarrier per stage), so a warp keeps QB_STAGES - 1 chunks in flight
 * without holding them in registers, and the first QB_STAGES chunks are
 * requested before the wait on the previous kernel. A chunk is QB_U pieces
 * per lane of each of the warp's QG_RW rows (32 * QB_U contiguous 16-byte
 * pieces of a row), with the scales and biases of its groups. Used where
 * every chunk's scales and biases are whole 16-byte units (the copy engine's
 * granule); k_qgemv covers the rest. */
#define QB_U 4
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900 /* the copy engine and mbarrier tx counts: sm_90 */
#define QB_SM90 1
#else
#define QB_SM90 0
#endif
#define QB_MAX_STAGES 4 /* mbarrier slots per warp */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar) {
#if QB_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if QB_SM90
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#if QB_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
#if QB_SM90
    asm volatile("{\n\t.reg .pred p;\n"
                 "QB_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra QB_WAIT_%=;\n}" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
#else
    __trap();
#endif
}
/* policy 0: the copy's lines take the L2's normal priority; else an
 * L2::cache_hint policy (createpolicy) */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar, uint64_t policy) {
#if QB_SM90
    if (policy)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_u32(dst)),
                     "l"(src), "r"(bytes), "r"(smem_u32(bar))
                     : "memory");
#else
    __trap();
#endif
}
/* an L2 policy marking every line a copy brings in as first to evict */
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t p = 0;
#if QB_SM90
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

/* Shapes of one warp's stage: codes [QG_RW][32 * QB_U * 16 B], then scales
 * and biases [QG_RW][gc] each (gc groups of a full chunk, qb_sbsz<SB> bytes each). */
struct qb_geom {
    int gc, stages;
    int evict_first; /* the weights' lines first to leave the L2 (they are read once a step) */
    QT_GEOM_FIELD    /* cmake -DKILN_QGEMV_TRACE=ON builds only */
    int stage_bytes; /* a multiple of 16 */
};
__host__ __device__ __forceinline__ int qb_codes_bytes() { return QG_RW * 32 * QB_U * 16; }
template <int SB> /* bytes of one scale or bias */
__host__ __device__ constexpr int qb_sbsz() { return SB == KN_DT_F32 ? 4 : 2; }

/* lane 0: request chunk pos of the stream into stage buffer dst */
template <int BITS, int NR, int SB, int MAP>
__device__ __forceinline__ void qb_issue(const qg_stream &st, const qg_rowmap &mp, const qb_geom &gm, qg_pos pos,
                                         const uint8_t *q, const uint8_t *scales, const uint8_t *biases, uint8_t *dst,
                                         uint64_t *bar, uint64_t pol, const int32_t *sids) {
    constexpr int C = QG_RW / NR, E = 128 / BITS;
    const int64_t j0 = (int64_t)32 * QB_U * pos.i;
    const int64_t pieces = st.P - j0 < 32 * QB_U ? st.P - j0 : 32 * QB_U;
    const int64_t g0 = (j0 * E) >> st.gshift, ng = (pieces * E) >> st.gshift;
    constexpr int SBSZ = qb_sbsz<SB>();
    const uint32_t cb = (uint32_t)(pieces * 16), sb = (uint32_t)(ng * SBSZ);
    if (MAP == QG_MAP_DOWN) { /* the codes only (scales and biases: qb_pieces), in runs, one per slot row crossed */
        mbar_expect_tx(bar, QG_RW * cb);
        const int64_t Pe = mp.inter / E;
#pragma unroll
        for (int r = 0; r < QG_RW; r++) {
            const int64_t n = pos.set * C + r < st.N ? pos.set * C + r : st.N - 1; /* past N: read, dropped */
            for (int64_t j = j0; j < j0 + pieces;) {
                const int64_t sl = j / Pe, jj = j - sl * Pe, je = (sl + 1) * Pe < j0 + pieces ? (sl + 1) * Pe : j0 + pieces;
                const int64_t row = (int64_t)sids[sl] * st.N + n;
                bulk_load(dst + (r * 32 * QB_U + (j - j0)) * 16, q + (row * Pe + jj) * 16, (uint32_t)((je - j) * 16), bar,
                          pol);
                j = je;
            }
        }
        return;
    }
    mbar_expect_tx(bar, QG_RW * (cb + 2 * sb));
    uint8_t *dsc = dst + qb_codes_bytes(), *dbi = dsc + QG_RW * gm.gc * SBSZ;
#pragma unroll
    for (int r = 0; r < QG_RW; r++) {
        const int64_t n = pos.set * C + r / NR < st.N ? pos.set * C + r / NR : st.N - 1; /* past N: read, dropped */
        const int64_t row = MAP == QG_MAP_GATE_UP ? qg_row(mp, n, r % NR) : (r % NR) ? n + st.N : n;
        bulk_load(dst + r * 32 * QB_U * 16, q + (row * st.P + j0) * 16, cb, bar, pol);
        const int64_t so = (row * st.G + g0) * SBSZ;
        bulk_load(dsc + r * gm.gc * SBSZ, scales + so, sb, bar, pol);
        bulk_load(dbi + r * gm.gc * SBSZ, biases + so, sb, bar, pol);
    }
}

/* The experts' down form (QG_MAP_DOWN) reads its scales and biases from
 * global memory (a slot row's groups need not fill 16-byte copies): the
 * chunk's whole set of them requested at once, before its first piece. */
struct qb_down_sb {
    const uint8_t *scales, *biases;
    const int32_t *sids; /* the slots' expert ids, in shared memory */
    int64_t set;         /* the chunk's column set */
    int pe, ge;          /* pieces and groups of one slot row */
};
template <int BITS, int SB, bool FULL>
__device__ __forceinline__ void qb_down_sb_load(const qg_stream &st, const qb_down_sb &d, int j0, int lane,
                                                uint32_t (&rs)[QB_U][QG_RW], uint32_t (&rb)[QB_U][QG_RW]) {
    constexpr int E = 128 / BITS;
#pragma unroll
    for (int u = 0; u < QB_U; u++) {
        const int j = j0 + lane + 32 * u;
        if (!FULL && j >= (int)st.P) break;
        const int sl = j / d.pe, gg = ((j - sl * d.pe) * E) >> st.gshift;
#pragma unroll
        for (int r = 0; r < QG_RW; r++) {
            const int64_t n = d.set * QG_RW + r < st.N ? d.set * QG_RW + r : st.N - 1;
            const int64_t gi = ((int64_t)d.sids[sl] * st.N + n) * d.ge + gg;
            rs[u][r] = sb_raw(d.scales, SB, gi), rb[u][r] = sb_raw(d.biases, SB, gi);
        }
    }
}

/* the warp's sums over pieces j0 + lane + 32 u (u < QB_U) of its stage
 * buffer; FULL: every piece is inside the row (no bound check between them,
 * so the shared-memory loads of all QB_U pieces can be issued together) */
template <int BITS, int M, int SB, bool FULL, int MAP>
__device__ __forceinline__ void qb_pieces(const qg_stream &st, const qb_geom &gm, int j0, int lane, const uint8_t *buf,
                                          const qg_smem &s, int K, float (*acc)[M], const qb_down_sb &dsb) {
    constexpr int E = 128 / BITS, SBSZ = qb_sbsz<SB>();
    const int P = (int)st.P, gshift = st.gshift, G = (int)st.G, gc = gm.gc;
    const int g0 = (j0 * E) >> gshift;
    const uint8_t *bsc = buf + qb_codes_bytes(), *bbi = bsc + QG_RW * gc * SBSZ;
    uint32_t drs[QB_U][QG_RW], drb[QB_U][QG_RW];
    if (MAP == QG_MAP_DOWN) qb_down_sb_load<BITS, SB, FULL>(st, dsb, j0, lane, drs, drb);
#pragma unroll
    for (int u = 0; u < QB_U; u++) {
        const int jl = lane + 32 * u, j = j0 + jl;
        if (!FULL && j >= P) break;
        const int k0 = j * E, g = k0 >> gshift, gl = g - g0;
        uint4 w[QG_RW];
        float sc[QG_RW], bi[QG_RW];
#pragma unroll
        for (int r = 0; r < QG_RW; r++) {
            w[r] = *(const uint4 *)(buf + (r * 32 * QB_U + jl) * 16);
            if (MAP == QG_MAP_DOWN) {
                sc[r] = sb_val_t<SB>(drs[u][r]), bi[r] = sb_val_t<SB>(drb[u][r]);
                continue;
            }
            const int so = (r * gc + gl) * SBSZ;
            const uint32_t rs = SBSZ == 4 ? *(const uint32_t *)(bsc + so) : *(const unsigned short *)(bsc + so);
            const uint32_t rb = SBSZ == 4 ? *(const uint32_t *)(bbi + so) : *(const unsigned short *)(bbi + so);
            sc[r] = sb_val_t<SB>(rs), bi[r] = sb_val_t<SB>(rb);
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            const int o = m * K + k0, ox = m * K + qg_x_offset<BITS, int>(k0, K);
            const float d = s.xd[m * G + g];
            float sx = s.xs[o >> 4];
            if (BITS == 4) sx += s.xs[(o >> 4) + 1];
#pragma unroll
            for (int r = 0; r < QG_RW; r++) {
                const int dot = qg_piece_dot<BITS>(w[r], s.xh + ox, s.xl + ox, K / 2);
                acc[r][m] += sc[r] * (d * (float)dot) + bi[r] * sx;
            }
        }
    }
}

/* the warp's sums over chunk pos, read from its stage buffer; SB the scales'
 * and biases' format. Offsets within a row (K codes) are 32-bit. */
template <int BITS, int M, int SB, int MAP>
__device__ __forceinline__ void qb_compute(const qg_stream &st, const qb_geom &gm, qg_pos pos, int lane,
                                           const uint8_t *buf, const qg_smem &s, int K, float (*acc)[M],
                                           qb_down_sb &dsb) {
    const int j0 = 32 * QB_U * pos.i;
    dsb.set = pos.set;
    if (j0 + 32 * QB_U <= (int)st.P) qb_pieces<BITS, M, SB, true, MAP>(st, gm, j0, lane, buf, s, K, acc, dsb);
    else qb_pieces<BITS, M, SB, false, MAP>(st, gm, j0, lane, buf, s, K, acc, dsb);
}

__host__ __device__ __forceinline__ size_t qb_align16(size_t n) { return (n + 15) & ~(size_t)15; }

#define QG_MAX_SLOTS 64 /* the experts' down form: slots per token */
template <int BITS, int M, int NORM, int EPI, int SB, int MAP, int W> /* W warps a block: 16 or 8 */
__global__ void __launch_bounds__(W * 32, 16 / W) /* 16 warps per SM: at most 128 registers */
    k_qgemv_bulk(const float *__restrict__ x, const uint8_t *__restrict__ q, const uint8_t *__restrict__ scales,
                 const uint8_t *__restrict__ biases, qb_geom gm, int64_t N, int64_t K, int gs,
                 const float *__restrict__ bias, float *__restrict__ out, int accumulate,
                 const float *__restrict__ norm_w, float eps, qg_rowmap mp) {
    extern __shared__ float4 qg_dyn[];
    constexpr int NR = EPI == KN_EPI_SWIGLU ? 2 : 1, C = QG_RW / NR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t total;
    const qg_stream st = qg_stream_of<BITS, C, W>(N, K, gs, SB, QB_U, warp, &total);
    const int S = gm.stages;
    QT_BEGIN(gm);

    uint8_t *base = (uint8_t *)qg_dyn;
    const size_t xbytes = (size_t)M * (size_t)K * 2 + (size_t)M * (size_t)(K / gs) * 4 + (size_t)M * (size_t)(K / 16) * 4;
    uint64_t *bars = (uint64_t *)(base + qb_align16(xbytes)) + warp * QB_MAX_STAGES;
    uint8_t *bufs = base + qb_align16(xbytes) + W * QB_MAX_STAGES * 8 + (size_t)warp * S * gm.stage_bytes;
    if (lane == 0) {
        for (int i = 0; i < S; i++) mbar_init(bars + i);
        mbar_init_fence();
    }
    __syncwarp();
    __shared__ int32_t sids[MAP == QG_MAP_DOWN ? QG_MAX_SLOTS : 1];
    qb_down_sb dsb = {scales, biases, sids, 0, (int)(mp.inter * BITS / 128), (int)(mp.inter / gs)};
    if (MAP == QG_MAP_DOWN) { /* read before the wait: the gate/up kernel before triggers only after its wait */
        for (int i = threadIdx.x; i < mp.slots; i += W * 32) sids[i] = __ldcg(mp.idx + i);
        __syncthreads(); /* one L2 round trip for the block, not one per run a copy starts */
    }
    if (MAP != QG_MAP_GATE_UP) kn_pdl_trigger();
    const uint64_t pol = gm.evict_first ? l2_evict_first_policy() : 0;
    qg_pos pl = {st.set0, 0}; /* the next chunk to request */
    if (MAP == QG_MAP_GATE_UP) { /* the ids come from the kernel before; the trigger only after the wait, so the
                                  * down kernel after this one may read them before its own wait (cuda_internal.h) */
        kn_pdl_wait();
        kn_pdl_trigger();
    }
    for (int f = 0; f < S && f < total; f++) { /* weights (and the down form's ids) only: before the wait */
        if (lane == 0)
            qb_issue<BITS, NR, SB, MAP>(st, mp, gm, pl, q, scales, biases, bufs + (size_t)f * gm.stage_bytes, bars + f, pol,
                                        sids);
        pl = qg_next(st, pl);
    }
    float acc[QG_RW][M];
    QT_MARK(1);
    QT_WAIT();
    QT_MARK(2);
    const qg_smem s = qg_begin<BITS, M, NORM, MAP == QG_MAP_DOWN, W>(qg_dyn, x, K, gs, norm_w, eps, acc, mp.wt, mp.inter);
    QT_MARK(3);
    qg_pos p = {st.set0, 0};
    int stage = 0;
    uint32_t parity = 0;
    for (int64_t f = 0; f < total; f++) {
        uint8_t *buf = bufs + (size_t)stage * gm.stage_bytes;
        mbar_wait(bars + stage, parity);
        if (f == 0) QT_MARK(4);
        qb_compute<BITS, M, SB, MAP>(st, gm, p, lane, buf, s, (int)K, acc, dsb);
        __syncwarp(); /* every lane is done with the buffer before it is refilled */
        if (f + S < total) {
            if (lane == 0) qb_issue<BITS, NR, SB, MAP>(st, mp, gm, pl, q, scales, biases, buf, bars + stage, pol, sids);
            pl = qg_next(st, pl);
        }
        if (p.i == st.nch - 1) qg_finish_set<M, EPI>(st, p.set, lane, acc, bias, out, accumulate);
        p = qg_next(st, p);
        if (++stage == S) stage = 0, parity ^= 1u;
    }
    QT_END(gm);
}

/* 0 when the shape does not suit the bulk-copy kernel with W warps a block
 * (k_qgemv runs instead) */
template <int BITS, int M, int NORM, int EPI, int SB, int MAP, int W>
static int launch_qgemv_bulk(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias,
                             float *out, int accumulate, const float *norm_w, float eps, qg_rowmap mp) {
    constexpr int E = 128 / BITS, C = QG_RW / (EPI == KN_EPI_SWIGLU ? 2 : 1);
    const int64_t K = MAP == QG_MAP_DOWN ? (int64_t)mp.slots * w->cols : w->cols, gs = w->group_size, G = K / gs;
    constexpr int sbsz = qb_sbsz<SB>();
    const int64_t chunk_codes = (int64_t)32 * QB_U * E, tail_codes = K % chunk_codes;
    /* every copy a whole number of 16-byte units at 16-byte aligned addresses
     * (the down form copies codes only, in runs of whole pieces) */
    if (MAP == QG_MAP_DOWN ? (mp.slots > QG_MAX_SLOTS || w->cols % E || chunk_codes % gs)
                           : (chunk_codes % gs || (chunk_codes / gs * sbsz) % 16 || (G * sbsz) % 16 ||
                              (tail_codes / gs * sbsz) % 16 || ((uintptr_t)w->scales & 15) || ((uintptr_t)w->biases & 15)) ||
        K < E)
        return 0;
    static int sm90 = -1;
    if (sm90 < 0) {
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ((kn_cuda_backend *)be)->device);
        sm90 = major >= 9;
    }
    if (!sm90) return 0;
    /* 2 stages: a chunk computed while the next arrives, and the smaller
     * footprint leaves room for 16 warps per SM (measured on the H200, 4-bit
     * Llama-3-8B decode: 2 stages 363-365 tok/s, 3 353-356, 4 353-355, 6-8 342) */
    const int S = 2;
    qb_geom gm;
    gm.gc = (int)(chunk_codes / gs);
    gm.stage_bytes = (int)qb_align16((size_t)qb_codes_bytes() + 2 * (size_t)QG_RW * gm.gc * sbsz);
    const size_t xbytes = qb_align16(qg_smem_bytes(M, K, (int)gs)) + W * QB_MAX_STAGES * 8;
    const size_t limit = 226 << 10; /* the opt-in maximum (227 KB) less the kernel's static shared memory */
    const size_t smem = xbytes + (size_t)W * S * gm.stage_bytes;
    if (smem > limit) return 0;
    gm.stages = S;
    /* the copies' lines first to leave the L2, so the weight stream stops
     * evicting the KV rows, activations and kernel code the next kernels
     * read (the bf16 GEMVs' __ldcs loads do this already). H100, alternated:
     * 4-bit Llama-3-8B 400-404 -> 412-417 tok/s (1k context 374 -> 389),
     * 8-bit 270 -> 275; KILN_QGEMV_EVICT_FIRST=0 turns it off (A/B runs) */
    static int evict_env = -2;
    if (evict_env == -2) evict_env = kn_cuda_env_on("KILN_QGEMV_EVICT_FIRST");
    gm.evict_first = evict_env;
    static size_t smem_allowed = 0; /* per instantiation */
    if (smem > smem_allowed) {
        if (cudaFuncSetAttribute(k_qgemv_bulk<BITS, M, NORM, EPI, SB, MAP, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)limit) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        smem_allowed = limit;
    }
    static int per_sm = 0;
    static size_t per_sm_smem = 0;
    if (!per_sm || per_sm_smem != smem) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_qgemv_bulk<BITS, M, NORM, EPI, SB, MAP, W>, W * 32,
                                                          smem) != cudaSuccess || per_sm < 1) {
            cudaGetLastError();
            per_sm = 1;
        }
        per_sm_smem = smem;
    }
    const int64_t sets = (N + C - 1) / C, want = (sets + W - 1) / W;
    const int64_t resident = (int64_t)per_sm * kn_cuda_sm_count(be);
    const unsigned blocks = (unsigned)(want < resident ? want : resident);
    QT_SLOT(gm, N, K, BITS, EPI, MAP, NORM, (int)blocks);
    return kn_cuda_launch(be, k_qgemv_bulk<BITS, M, NORM, EPI, SB, MAP, W>, dim3(blocks), dim3(W * 32), smem, x,
                          (const uint8_t *)w->data, (const uint8_t *)w->scales, (const uint8_t *)w->biases,
                          gm, N, K, (int)gs, bias, out, accumulate, norm_w, eps, mp) == cudaSuccess;
}

template <int BITS, int M, int NORM, int EPI, int U>
static int launch_qgemv_u(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias, float *out,
                          int accumulate, const float *norm_w, float eps) {
    const size_t smem = qg_smem_bytes(M, w->cols, w->group_size);
    static size_t smem_allowed = 48 << 10; /* per instantiation */
    static int per_sm = 0;
    if (smem > QG_MAX_SMEM) return 0;
    if (smem > smem_allowed) {
        if (cudaFuncSetAttribute(k_qgemv<BITS, M, NORM, EPI, U>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 QG_MAX_SMEM) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        smem_allowed = QG_MAX_SMEM;
        per_sm = 0; /* the shared memory per block changed: ask again */
    }
    static size_t per_sm_smem = 0;
    if (!per_sm || per_sm_smem != smem) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_qgemv<BITS, M, NORM, EPI, U>, QG_WARPS * 32,
                                                          smem) != cudaSuccess || per_sm < 1) {
            cudaGetLastError();
            per_sm = 1;
        }
        per_sm_smem = smem;
    }
    constexpr int C = QG_RW / (EPI == KN_EPI_SWIGLU ? 2 : 1);
    const int64_t sets = (N + C - 1) / C, want = (sets + QG_WARPS - 1) / QG_WARPS;
    const int64_t resident = (int64_t)per_sm * kn_cuda_sm_count(be);
    const unsigned blocks = (unsigned)(want < resident ? want : resident);
    return kn_cuda_launch(be, k_qgemv<BITS, M, NORM, EPI, U>, dim3(blocks), dim3(QG_WARPS * 32), smem, x,
                          (const uint4 *)w->data, w->scales, w->biases, (int)w->sb_dtype, N, w->cols,
                          w->group_size, bias, out, accumulate, norm_w, eps) == cudaSuccess;
}

/* One block of 16 warps a SM, where x's terms leave room for the stages,
 * else two blocks of 8: each block quantizes the whole of x, so one block a
 * SM does it once. H100, 4-bit Llama-3-8B decode, alternated (docs/PERF.md
 * 2026-12-07 thirty-first session): 16 warps 420.6-422.1 tok/s against 8
 * warps 416.8-418.1; the down projection's x prologue 5.7 -> 3.7 us. */
template <int BITS, int M, int NORM, int EPI, int SB, int MAP>
static int launch_qgemv_bulk_w(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias,
                               float *out, int accumulate, const float *norm_w, float eps, qg_rowmap mp) {
    return launch_qgemv_bulk<BITS, M, NORM, EPI, SB, MAP, 16>(be, x, w, N, bias, out, accumulate, norm_w, eps, mp) ||
           launch_qgemv_bulk<BITS, M, NORM, EPI, SB, MAP, 8>(be, x, w, N, bias, out, accumulate, norm_w, eps, mp);
}

/* launch_qgemv_bulk with w's scales format as its template argument (no
 * conversion branch per piece) */
template <int BITS, int M, int NORM, int EPI, int MAP = QG_MAP_DENSE>
static int launch_qgemv_bulk_sb(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias,
                                float *out, int accumulate, const float *norm_w, float eps,
                                qg_rowmap mp = {NULL, 0, NULL, 0}) {
    switch (w->sb_dtype) {
    case KN_DT_BF16:
        return launch_qgemv_bulk_w<BITS, M, NORM, EPI, KN_DT_BF16, MAP>(be, x, w, N, bias, out, accumulate, norm_w, eps, mp);
    case KN_DT_F16:
        return launch_qgemv_bulk_w<BITS, M, NORM, EPI, KN_DT_F16, MAP>(be, x, w, N, bias, out, accumulate, norm_w, eps, mp);
    default:
        return launch_qgemv_bulk_w<BITS, M, NORM, EPI, KN_DT_F32, MAP>(be, x, w, N, bias, out, accumulate, norm_w, eps, mp);
    }
}

template <int BITS, int M, int NORM, int EPI>
static int launch_qgemv(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias, float *out,
                        int accumulate, const float *norm_w, float eps) {
    static int bulk = -1;
    if (bulk < 0) bulk = !getenv("KILN_QGEMV_NO_BULK"); /* A/B measurement */
    if (bulk && launch_qgemv_bulk_sb<BITS, M, NORM, EPI>(be, x, w, N, bias, out, accumulate, norm_w, eps)) return 1;
    /* 2 pieces per row per chunk: 4 was slower on the H200 (1 block per SM by registers) */
    return launch_qgemv_u<BITS, M, NORM, EPI, 2>(be, x, w, N, bias, out, accumulate, norm_w, eps);
}

template <int BITS, int M>
static int qgemv_m(kn_backend *be, const float *x, const kn_weight *w, const float *bias, float *out, int accumulate,
                   const float *norm_w, float eps, int epi) {
    if (epi == KN_EPI_SWIGLU)
        return norm_w ? launch_qgemv<BITS, M, 1, KN_EPI_SWIGLU>(be, x, w, w->rows / 2, bias, out, 0, norm_w, eps)
                      : launch_qgemv<BITS, M, 0, KN_EPI_SWIGLU>(be, x, w, w->rows / 2, bias, out, 0, norm_w, eps);
    return norm_w ? launch_qgemv<BITS, M, 1, KN_EPI_NONE>(be, x, w, w->rows, bias, out, accumulate, norm_w, eps)
                  : launch_qgemv<BITS, M, 0, KN_EPI_NONE>(be, x, w, w->rows, bias, out, accumulate, norm_w, eps);
}

/* 1 when every kernel of this file can read w: 4/8-bit codes, groups a
 * power of two of whole 16-byte pieces up to 512, rows of whole groups */
static int qg_weight_fits(const kn_weight *w) {
    const int gs = w->group_size;
    return (w->bits == 4 || w->bits == 8) && gs % (w->bits == 4 ? 32 : 16) == 0 && gs <= 512 && !(gs & (gs - 1)) &&
           w->cols % gs == 0 && w->rows >= 1;
}

int kn_cuda_qgemv(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                  int accumulate, const float *norm_w, float eps, int epi) {
    if (M < 1 || M > KN_CUDA_GEMV_MAX_M || !qg_weight_fits(w)) return 0;
    if (epi == KN_EPI_SWIGLU && (w->rows % 2 || accumulate)) return 0;
    if (((uintptr_t)x & 15) || ((uintptr_t)w->data & 15) || ((uintptr_t)norm_w & 15)) return 0;
    if (w->bits == 4)
        return M == 1 ? qgemv_m<4, 1>(be, x, w, bias, out, accumulate, norm_w, eps, epi)
                      : qgemv_m<4, 2>(be, x, w, bias, out, accumulate, norm_w, eps, epi);
    return M == 1 ? qgemv_m<8, 1>(be, x, w, bias, out, accumulate, norm_w, eps, epi)
                  : qgemv_m<8, 2>(be, x, w, bias, out, accumulate, norm_w, eps, epi);
}

/* The routed experts' gate/up of one token on the bulk kernel: A[j * inter +
 * r] = silu(gate_e . x') * (up_e . x') for e = idx[j], j < k, r < inter, x'
 * = rms_norm(x) * norm_w when norm_w is set (else x), with x carried as in
 * every kernel of this file. The ids are read after the wait on the
 * previous kernel (it writes them), so no load goes out before it. Returns 0,
 * having enqueued nothing, where the shape does not suit the bulk kernel. */
int kn_cuda_qgemv_moe_gate_up(kn_backend *be, const float *x, const kn_weight *gu, const int32_t *idx, int k,
                              int inter, float *A, const float *norm_w, float eps) {
    if (!qg_weight_fits(gu) || k < 1 || inter < 1 || gu->rows % (2 * (int64_t)inter)) return 0;
    if (((uintptr_t)x & 15) || ((uintptr_t)gu->data & 15) || ((uintptr_t)norm_w & 15)) return 0;
    const qg_rowmap mp = {idx, inter, NULL, 0};
    const int64_t N = (int64_t)k * inter;
    constexpr int MAP = QG_MAP_GATE_UP, SW = KN_EPI_SWIGLU;
    if (gu->bits == 4)
        return norm_w ? launch_qgemv_bulk_sb<4, 1, 1, SW, MAP>(be, x, gu, N, NULL, A, 0, norm_w, eps, mp)
                      : launch_qgemv_bulk_sb<4, 1, 0, SW, MAP>(be, x, gu, N, NULL, A, 0, norm_w, eps, mp);
    return norm_w ? launch_qgemv_bulk_sb<8, 1, 1, SW, MAP>(be, x, gu, N, NULL, A, 0, norm_w, eps, mp)
                  : launch_qgemv_bulk_sb<8, 1, 0, SW, MAP>(be, x, gu, N, NULL, A, 0, norm_w, eps, mp);
}

int kn_cuda_qgemv_moe_down(kn_backend *be, const float *A, const kn_weight *dn, const int32_t *idx, const float *wt,
                           int k, int dim, float *out, int accumulate) {
    const int64_t inter = dn->cols;
    if (!qg_weight_fits(dn) || inter % 16 || k < 1 || dim < 1 || dn->rows % dim) return 0;
    if (((uintptr_t)A & 15) || ((uintptr_t)dn->data & 15)) return 0;
    const qg_rowmap mp = {idx, inter, wt, k};
    constexpr int MAP = QG_MAP_DOWN, NO = KN_EPI_NONE;
    return dn->bits == 4 ? launch_qgemv_bulk_sb<4, 1, 0, NO, MAP>(be, A, dn, dim, NULL, out, accumulate, NULL, 0.0f, mp)
                         : launch_qgemv_bulk_sb<8, 1, 0, NO, MAP>(be, A, dn, dim, NULL, out, accumulate, NULL, 0.0f, mp);
}

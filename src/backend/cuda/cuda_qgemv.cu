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
 * into shared memory once (the RMSNorm prologue, when fused, is applied
 * first), then each of its 8 warps streams sets of 2 weight rows: lane j
 * takes 16-byte pieces j, j + 32, ... of both rows (32 4-bit or 16 8-bit
 * codes, always inside one group), U per row per chunk, the next chunk's
 * loads issued before the current chunk is computed. For
 * 4-bit codes the x bytes are stored in the order the nibble split produces
 * (per 8 elements: 0 2 4 6 | 1 3 5 7), so one `and` and one shift per word
 * feed two dp4a. Partial sums meet in a warp reduction; the SwiGLU epilogue
 * pairs gate row n with up row n + N in one warp.
 *
 * Launched as a programmatic dependent launch: the first weight loads go out
 * before the wait on the previous kernel (weights are immutable). */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

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
__device__ __forceinline__ float sb_val(uint32_t raw, int dt) {
    if (dt == KN_DT_F32) return __uint_as_float(raw);
    if (dt == KN_DT_BF16) return __uint_as_float(raw << 16);
    return __half2float(__ushort_as_half((unsigned short)raw));
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
template <int BITS>
__device__ __forceinline__ int64_t qg_x_offset(int64_t k0, int64_t K) {
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

/* The block quantizes x (M rows; with norm_w: rms_norm(x) * norm_w first)
 * into s. Thread t takes 16-element chunks t, t + 256, ...; the gs / 16
 * chunks of a group sit in adjacent lanes of one warp and share their max by
 * shuffles. Every thread runs the same number of iterations (the shuffles
 * need the whole warp). */
template <int BITS, int M, int NORM>
__device__ void qg_quantize_x(const float *__restrict__ x, int64_t K, int gs, const float *__restrict__ norm_w,
                              float eps, qg_smem s) {
    __shared__ float red[QG_WARPS];
    __shared__ float inv_rms[M];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (NORM) {
        for (int m = 0; m < M; m++) {
            const float *xm = x + (int64_t)m * K;
            float ss = 0.0f;
            for (int64_t j = (int64_t)tid * 4; j < K; j += QG_WARPS * 32 * 4) {
                const float4 v = __ldg((const float4 *)(xm + j));
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) red[warp] = ss;
            __syncthreads();
            if (tid == 0) {
                float tot = 0.0f;
                for (int i = 0; i < QG_WARPS; i++) tot += red[i];
                inv_rms[m] = 1.0f / sqrtf(tot / (float)K + eps);
            }
            __syncthreads();
        }
    }
    const int64_t chunks = K / 16, total = (int64_t)M * chunks;
    const int span = gs / 16; /* lanes sharing a group */
    for (int64_t c0 = 0; c0 < total; c0 += QG_WARPS * 32) {
        const int64_t c = c0 + tid;
        const bool on = c < total;
        const int m = on ? (int)c / (int)chunks : 0; /* 32-bit division: x is at most 160 KB */
        const int64_t k0 = on ? (int64_t)((int)c % (int)chunks) * 16 : 0;
        float v[16];
        float mx = 0.0f, sum = 0.0f;
        if (on) {
            const float4 *src = (const float4 *)(x + (int64_t)m * K + k0);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 a = __ldg(src + i);
                v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
            }
            if (NORM) {
                const float inv = inv_rms[m];
                const float4 *g = (const float4 *)(norm_w + k0);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 a = __ldg(g + i);
                    v[4 * i] = a.x * (v[4 * i] * inv), v[4 * i + 1] = a.y * (v[4 * i + 1] * inv);
                    v[4 * i + 2] = a.z * (v[4 * i + 2] * inv), v[4 * i + 3] = a.w * (v[4 * i + 3] * inv);
                }
            }
#pragma unroll
            for (int i = 0; i < 16; i++) mx = fmaxf(mx, fabsf(v[i])), sum += v[i];
        }
        for (int o = 1; o < span; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (!on) continue;
        const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        uint32_t hw[4] = {0u, 0u, 0u, 0u}, lw[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int e = 0; e < 16; e++) {
            const float t = v[e] * inv, hf = rintf(t);
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
    (void)lane;
    __syncthreads();
}

/* sum over one 16-byte piece of codes of q * (256 h + l); x terms at xh / xl
 * (4-bit: the piece's second half `plane` bytes further) */
template <int BITS>
__device__ __forceinline__ int qg_piece_dot(uint4 w, const int8_t *xh, const int8_t *xl, int64_t plane) {
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

/* chunk f into acc; after a set's last chunk, the warp's sums are reduced and
 * lane 0 writes the set's outputs */
template <int BITS, int M, int EPI, int U>
__device__ __forceinline__ void qg_compute(const qg_stream &st, qg_pos pos, int lane, const qg_chunk<U> &c,
                                           const qg_smem &s, int64_t K, float (*acc)[M], const float *__restrict__ bias,
                                           float *__restrict__ out, int accumulate) {
    constexpr int NR = EPI == KN_EPI_SWIGLU ? 2 : 1, C = QG_RW / NR, E = 128 / BITS;
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
    if (i != st.nch - 1) return;
#pragma unroll
    for (int r = 0; r < QG_RW; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
            for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    const int64_t set = pos.set;
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
    constexpr int E = 128 / BITS;                    /* codes per 16-byte piece */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    qg_stream st;
    st.N = N, st.P = K / E, st.G = K / gs, st.gshift = __ffs(gs) - 1, st.sbdt = sbdt; /* gs a power of two */
    st.nch = (int)((st.P + 32 * U - 1) / (32 * U));
    st.n_sets = (N + C - 1) / C;
    st.set0 = (int64_t)blockIdx.x * QG_WARPS + warp, st.stride = (int64_t)gridDim.x * QG_WARPS;
    const int64_t my_sets = st.set0 < st.n_sets ? (st.n_sets - st.set0 + st.stride - 1) / st.stride : 0;
    const int64_t total = my_sets * st.nch;
    kn_pdl_trigger();

    qg_chunk<U> ca, cb;
    qg_pos p = {st.set0, 0};
    if (total > 0) qg_load<BITS, U, NR>(st, p, lane, q, scales, biases, ca); /* before the wait: weights only */
    kn_pdl_wait();
    const qg_smem s = qg_layout(qg_dyn, M, K, gs);
    qg_quantize_x<BITS, M, NORM>(x, K, gs, norm_w, eps, s);

    float acc[QG_RW][M];
#pragma unroll
    for (int r = 0; r < QG_RW; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    for (int64_t f = 0; f < total; f += 2) { /* two buffers, alternating, no dynamic register indexing */
        const qg_pos p1 = qg_next(st, p), p2 = qg_next(st, p1);
        if (f + 1 < total) qg_load<BITS, U, NR>(st, p1, lane, q, scales, biases, cb);
        qg_compute<BITS, M, EPI, U>(st, p, lane, ca, s, K, acc, bias, out, accumulate);
        if (f + 2 < total) qg_load<BITS, U, NR>(st, p2, lane, q, scales, biases, ca);
        if (f + 1 < total) qg_compute<BITS, M, EPI, U>(st, p1, lane, cb, s, K, acc, bias, out, accumulate);
        p = p2;
    }
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

template <int BITS, int M, int NORM, int EPI>
static int launch_qgemv(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias, float *out,
                        int accumulate, const float *norm_w, float eps) {
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

int kn_cuda_qgemv(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                  int accumulate, const float *norm_w, float eps, int epi) {
    if (M < 1 || M > KN_CUDA_GEMV_MAX_M || (w->bits != 4 && w->bits != 8)) return 0;
    const int gs = w->group_size;
    if (gs % (w->bits == 4 ? 32 : 16) || gs > 512 || (gs & (gs - 1)) || w->cols % gs || w->rows < 1) return 0;
    if (epi == KN_EPI_SWIGLU && (w->rows % 2 || accumulate)) return 0;
    if (((uintptr_t)x & 15) || ((uintptr_t)w->data & 15) || ((uintptr_t)norm_w & 15)) return 0;
    if (w->bits == 4)
        return M == 1 ? qgemv_m<4, 1>(be, x, w, bias, out, accumulate, norm_w, eps, epi)
                      : qgemv_m<4, 2>(be, x, w, bias, out, accumulate, norm_w, eps, epi);
    return M == 1 ? qgemv_m<8, 1>(be, x, w, bias, out, accumulate, norm_w, eps, epi)
                  : qgemv_m<8, 2>(be, x, w, bias, out, accumulate, norm_w, eps, epi);
}

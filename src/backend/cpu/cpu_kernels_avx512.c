/* cpu_kernels_avx512.c — AVX-512 (F/BW/VL + BF16) inner loops, compiled
 * with those flags only for this file and chosen at runtime by
 * kn_cpu_kernels_select on processors that have them (Zen 4/5, Sapphire
 * Rapids and later). Kernels not given here come from the AVX2 set.
 *
 * gemv: decode-shaped matmul, memory bound: like the AVX2 one (each weight
 *   row streamed once, converted to f32 exactly, dotted with every x row in
 *   f32), 16 lanes wide, two weight rows in flight for one x row.
 * gemv_bf16: decode-shaped matmul over bf16 weights with x rounded to bf16
 *   (the backend says so: matmul_x_rounding_min_rows = 1): 32 exact products
 *   per vdpbf16ps, one weight row (a linear stream) at a time for one x row.
 * gemm_bf16: prefill-shaped matmul over bf16 weights with vdpbf16ps. x is
 *   rounded to bf16 (the backend says so: matmul_x_rounding_min_rows) and
 *   packed into 32-row tiles of (k, k+1) pairs; each weight row's (k, k+1)
 *   pair is one 32-bit word broadcast straight from the weight matrix, so W
 *   needs no packing. A 32 x 12 register tile (24 accumulators) runs over all
 *   of K; products are exact and summed in f32.
 * qgemv (with VNNI): MLX affine 4/8-bit GEMV reading the packed codes:
 *   sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k per group. The
 *   code bytes (nibbles split with and/shift) go straight into vpdpbusd
 *   against x as two int8 terms per element (x ~ xscale * (h + l / 256),
 *   xscale per 32-element block: |error| <= max|x over the block| / 32512);
 *   integer sums per dword lane are scaled by the lane's group scale in f32;
 *   the biases' term uses exact f32 group sums of x. prep is computed once
 *   per matmul.
 * qgemm: MLX affine prefill: 12 weight rows at a time dequantized into an
 *   f32 buffer (scale * q + bias, as the reference), then a 32 x 12 f32 FMA
 *   register tile over all of K with x in f32 (exact products). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_avx512_inline.h"
#include "backend/cpu/cpu_kernels.h"
#include "base/quant.h"

ALWAYS_INLINE __m512 load16(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (dt == KN_DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

ALWAYS_INLINE float wat(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return ((const float *)w)[i];
    if (dt == KN_DT_BF16) return kn_bf16_to_f32(((const uint16_t *)w)[i]);
    return kn_f16_to_f32(((const uint16_t *)w)[i]);
}

/* ---- gemv ---------------------------------------------------------------- */

/* x rows [0, MR) against weight row n; accumulation per row in 4 x 16-lane
 * partial sums over k, the same whatever MR is (batch-independent results). */
#define GEMV_PREFETCH_BYTES 1024

ALWAYS_INLINE void dot_rows(const float *x, int64_t ldx, int MR, const void *w, int64_t K, int64_t n, kn_dtype dt,
                            float *r) {
    __m512 a[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_ps();
    const int64_t base = n * K, esz = dt == KN_DT_F32 ? 4 : 2;
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        _mm_prefetch((const char *)w + (base + k) * esz + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
        if (dt == KN_DT_F32) _mm_prefetch((const char *)w + (base + k + 32) * esz + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
        for (int j = 0; j < 4; j++) {
            __m512 wv = load16(w, base + k + 16 * j, dt);
            for (int i = 0; i < MR; i++)
                a[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + k + 16 * j), wv, a[i][j]);
        }
    }
    for (; k + 16 <= K; k += 16) {
        __m512 wv = load16(w, base + k, dt);
        for (int i = 0; i < MR; i++) a[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + k), wv, a[i][0]);
    }
    for (int i = 0; i < MR; i++)
        r[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]), _mm512_add_ps(a[i][2], a[i][3])));
    for (; k < K; k++) {
        float wv = wat(w, base + k, dt);
        for (int i = 0; i < MR; i++) r[i] += x[i * ldx + k] * wv;
    }
}

ALWAYS_INLINE void gemv_t(const float *x, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                          int64_t n1, kn_dtype dt) {
    const int64_t K = wt->cols, N = wt->rows;
    const void *w = wt->data;
    for (int64_t n = n0; n < n1; n++) {
        const float b = bias ? bias[n] : 0.0f;
        int m = 0;
        float r[4];
        for (; m + 3 < M; m += 4) {
            dot_rows(x + (int64_t)m * K, K, 4, w, K, n, dt, r);
            for (int i = 0; i < 4; i++) out[(int64_t)(m + i) * N + n] = r[i] + b;
        }
        if (M - m == 3) dot_rows(x + (int64_t)m * K, K, 3, w, K, n, dt, r);
        else if (M - m == 2) dot_rows(x + (int64_t)m * K, K, 2, w, K, n, dt, r);
        else if (M - m == 1) dot_rows(x + (int64_t)m * K, K, 1, w, K, n, dt, r);
        for (int i = 0; m + i < M; i++) out[(int64_t)(m + i) * N + n] = r[i] + b;
    }
}

static void gemv_avx512(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                        int64_t n1) {
    switch (w->dtype) {
    case KN_DT_F32: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_F32); break;
    case KN_DT_BF16: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_BF16); break;
    default: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_F16); break;
    }
}

/* ---- gemv_bf16 ----------------------------------------------------------- */

/* x rows [0, MR) (bf16, ldx elements apart) against NR (1 or 2) consecutive
 * bf16 weight rows from w: per (x row, weight row) pair two f32
 * accumulators, the even 32-element steps of k in one and the odd ones in the
 * other (vdpbf16ps, exact products), then a0 + a1, then the tail in f32: the
 * same order whatever MR and NR are, so a row's result depends neither on the
 * batch nor on how rows are grouped. One weight row at a time (M = 1) is one
 * linear stream per thread, which the hardware prefetcher follows without
 * software prefetches: measured on the 2-core Zen 5 VM over 24 matrices of
 * 8192 x 1024 (and 1024 x 4096), 64-70 GB/s, level with a bare read, against
 * 50-62 GB/s for four rows streamed at once with prefetches 2 KB ahead. With
 * more x rows, two weight rows at a time reuse each x load twice. */
ALWAYS_INLINE void dot_bf16_tile(const uint16_t *x, int64_t ldx, int MR, const uint16_t *w, int64_t K, int NR,
                                 float r[4][2]) {
    __m512 a[4][2][2];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) a[i][j][0] = a[i][j][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        if (MR > 1) /* slower consumption than the memory rate: software prefetch, one row ahead */
#pragma GCC unroll 2
            for (int j = 0; j < NR; j++) _mm_prefetch((const char *)(w + (j + NR) * K + k), _MM_HINT_T0), _mm_prefetch((const char *)(w + (j + NR) * K + k) + 64, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            __m512bh xv[4];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) xv[i] = (__m512bh)_mm512_loadu_si512(x + i * ldx + k + 32 * p);
#pragma GCC unroll 2
            for (int j = 0; j < NR; j++) {
                const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + j * K + k + 32 * p);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) a[i][j][p] = _mm512_dpbf16_ps(a[i][j][p], xv[i], wv);
            }
        }
    }
    if (k + 32 <= K) { /* an even step left over */
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + j * K + k);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++)
                a[i][j][0] = _mm512_dpbf16_ps(a[i][j][0], (__m512bh)_mm512_loadu_si512(x + i * ldx + k), wv);
        }
        k += 32;
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) r[i][j] = _mm512_reduce_add_ps(_mm512_add_ps(a[i][j][0], a[i][j][1]));
    for (; k < K; k++) /* a bf16 x bf16 product is exact in f32 */
        for (int j = 0; j < NR; j++) {
            const float wv = kn_bf16_to_f32(w[j * K + k]);
            for (int i = 0; i < MR; i++) r[i][j] += kn_bf16_to_f32(x[i * ldx + k]) * wv;
        }
}

/* weight rows [n, n + NR) against all M rows of x */
ALWAYS_INLINE void gemv_bf16_rows(const uint16_t *xb, int M, const uint16_t *w, int64_t K, int64_t N, int NR,
                                  const float *bias, float *out, int64_t n) {
    float r[4][2] = {{0}};
    for (int m = 0; m < M; m += 4) {
        const uint16_t *xm = xb + (int64_t)m * K;
        switch (M - m < 4 ? M - m : 4) { /* constant MR and NR: accumulators stay in registers */
        case 1: NR == 2 ? dot_bf16_tile(xm, K, 1, w, K, 2, r) : dot_bf16_tile(xm, K, 1, w, K, 1, r); break;
        case 2: NR == 2 ? dot_bf16_tile(xm, K, 2, w, K, 2, r) : dot_bf16_tile(xm, K, 2, w, K, 1, r); break;
        case 3: NR == 2 ? dot_bf16_tile(xm, K, 3, w, K, 2, r) : dot_bf16_tile(xm, K, 3, w, K, 1, r); break;
        default: NR == 2 ? dot_bf16_tile(xm, K, 4, w, K, 2, r) : dot_bf16_tile(xm, K, 4, w, K, 1, r); break;
        }
        for (int i = 0; i < 4 && m + i < M; i++)
            for (int j = 0; j < NR; j++) out[(int64_t)(m + i) * N + n + j] = r[i][j] + (bias ? bias[n + j] : 0.0f);
    }
}

/* One x row (batch-1 decode): the tile kernel at MR = NR = 1 (so the same
 * sums in the same order as a row of a batch), called straight from the row
 * loop: on the 2-core Zen 5 VM the general loop's per-row bookkeeping (the
 * tile switch, the result array, the bias test) made the decode GEMVs 2-4%
 * slower in one process and bf16 decode 63.5 against 69.3 tok/s in
 * alternating runs (docs/PERF.md 2026-12-05). */
static void gemv_bf16_m1(const uint16_t *x, const uint16_t *w, int64_t K, const float *bias, float *out, int64_t n0,
                         int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
        float r[4][2];
        dot_bf16_tile(x, K, 1, w + n * K, K, 1, r);
        out[n] = r[0][0] + (bias ? bias[n] : 0.0f);
    }
}

static void gemv_bf16_avx512(const uint16_t *xb, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                             int64_t n1) {
    const int64_t K = wt->cols, N = wt->rows;
    const uint16_t *w = wt->data;
    if (M == 1) {
        gemv_bf16_m1(xb, w, K, bias, out, n0, n1);
        return;
    }
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) gemv_bf16_rows(xb, M, w + n * K, K, N, 2, bias, out, n); /* x reused across two rows */
    for (; n < n1; n++) gemv_bf16_rows(xb, M, w + n * K, K, N, 1, bias, out, n);
}

/* ---- gemm_bf16 ----------------------------------------------------------- */

/* apk[tile][kp][32]: (bf16 x[m][2kp]) | (bf16 x[m][2kp+1]) << 16 for the
 * tile's 32 rows m (zero past M); K even. Tiles [t0, t1). */
static void pack_a_bf16_avx512(const float *x, int M, int64_t K, int t0, int t1, uint32_t *apk) {
    const int64_t KP = K / 2;
    for (int t = t0; t < t1; t++) {
        uint32_t *dst = apk + (int64_t)t * KP * KN_GEMM_BF16_MR;
        for (int i = 0; i < KN_GEMM_BF16_MR; i++) {
            const int m = t * KN_GEMM_BF16_MR + i;
            if (m >= M) {
                for (int64_t kp = 0; kp < KP; kp++) dst[kp * KN_GEMM_BF16_MR + i] = 0;
                continue;
            }
            const float *row = x + (int64_t)m * K;
            int64_t kp = 0;
            for (; kp + 16 <= KP; kp += 16) { /* 32 floats -> 16 packed pairs */
                __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 2 * kp + 16), _mm512_loadu_ps(row + 2 * kp));
                uint32_t tmp[16];
                _mm512_storeu_si512(tmp, (__m512i)p);
                for (int j = 0; j < 16; j++) dst[(kp + j) * KN_GEMM_BF16_MR + i] = tmp[j];
            }
            for (; kp < KP; kp++)
                dst[kp * KN_GEMM_BF16_MR + i] =
                    (uint32_t)kn_f32_to_bf16(row[2 * kp]) | (uint32_t)kn_f32_to_bf16(row[2 * kp + 1]) << 16;
        }
    }
}

/* A finished register tile, acc[h][i] = rows 16h..16h+15 of output column
 * i, written row by row (mrows rows, NR columns, + bias): each output row's
 * columns are adjacent in memory, so a row costs one or two cache lines
 * where a scatter per column touched 16 lines per instruction (measured: the
 * scatters took a third of the bf16 GEMM's time at K = 1024). */
ALWAYS_INLINE void store_tile_rows(const __m512 acc[2][12], int NR, int mrows, const float *bias, float *out,
                                   int64_t ldo) {
    float buf[12][32] __attribute__((aligned(64)));
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        if (i >= NR) break;
        _mm512_store_ps(buf[i], acc[0][i]);
        _mm512_store_ps(buf[i] + 16, acc[1][i]);
    }
    float b[12];
    for (int i = 0; i < NR; i++) b[i] = bias ? bias[i] : 0.0f;
    const int rows = mrows < 32 ? mrows : 32;
    for (int m = 0; m < rows; m++)
        for (int i = 0; i < NR; i++) out[(int64_t)m * ldo + i] = buf[i][m] + b[i];
}

/* out[m0 + 0..31, n .. n+NR) over all of K. */
ALWAYS_INLINE void bf16_tile(const uint32_t *ap, int64_t KP, const uint32_t *w, int64_t ldw, int NR, int mrows,
                             const float *bias, float *out, int64_t ldo) {
    __m512 acc[2][12];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < KP; kp++) {
        __m512bh a0 = (__m512bh)_mm512_load_si512(ap + kp * 32), a1 = (__m512bh)_mm512_load_si512(ap + kp * 32 + 16);
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            if (i >= NR) break;
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)w[i * ldw + kp]);
            acc[0][i] = _mm512_dpbf16_ps(acc[0][i], a0, b);
            acc[1][i] = _mm512_dpbf16_ps(acc[1][i], a1, b);
        }
    }
    store_tile_rows((const __m512(*)[12])acc, NR, mrows, bias, out, ldo);
}

static void gemm_bf16_avx512(const uint32_t *apk, int M, const kn_weight *wt, const float *bias, float *out,
                             int64_t n0, int64_t n1) {
    const int64_t K = wt->cols, N = wt->rows, KP = K / 2;
    const uint32_t *w = wt->data; /* row n's pair kp is word n * KP + kp */
    const int tiles = (M + KN_GEMM_BF16_MR - 1) / KN_GEMM_BF16_MR;
    for (int64_t n = n0; n < n1; n += 12)
        for (int t = 0; t < tiles; t++) {
            const int nr = (int)(n1 - n < 12 ? n1 - n : 12);
            const int m = t * KN_GEMM_BF16_MR, mrows = M - m;
            const uint32_t *ap = apk + (int64_t)t * KP * KN_GEMM_BF16_MR;
            float *o = out + (int64_t)m * N + n;
            const float *bb = bias ? bias + n : NULL;
            switch (nr) { /* constant NR: accumulators stay in registers */
#define NR_CASE(R)                                                                                                     \
    case R: bf16_tile(ap, KP, w + n * KP, KP, R, mrows, bb, o, N); break;
                NR_CASE(1) NR_CASE(2) NR_CASE(3) NR_CASE(4) NR_CASE(5) NR_CASE(6) NR_CASE(7) NR_CASE(8) NR_CASE(9)
                NR_CASE(10) NR_CASE(11) NR_CASE(12)
#undef NR_CASE
            }
        }
}

/* ---- quantized gemv ------------------------------------------------------ */

/* qgemv_prep's form of x (one row of x per stride bytes of prep):
 *   xq: per chunk of CE elements (CE = 128 for 4-bit codes, 64 for 8-bit;
 *       zero past K) x / xscale split into two int8 vectors h and l
 *       (x ~ xscale * (h + l / 256)), each in the order the
 *       chunk's code bytes hold the elements: 8-bit as is; 4-bit the 64 low
 *       nibbles' elements (2j) then the 64 high nibbles' (2j + 1). So one
 *       chunk is [h][l] (8-bit) or [h even][h odd][l even][l odd] (4-bit).
 *       xscale = max |x| / 127 over each aligned 32-element block of x.
 *   xf: per chunk 16 floats, xscale / 256 for the block that each dword lane
 *       of the chunk's dot products covers.
 *   xs: per group the exact f32 sum of x (for the biases' term). */
typedef struct {
    int ce, epl;                            /* chunk elements; elements per dword lane */
    int64_t kp, nch, xf_off, xs_off, stride; /* padded K, chunks; byte offsets */
} qlay;

ALWAYS_INLINE qlay qlayout(int64_t K, int bits, int gs) {
    qlay L;
    L.ce = bits == 4 ? 128 : 64, L.epl = bits == 4 ? 8 : 4;
    L.kp = (K + L.ce - 1) / L.ce * L.ce, L.nch = L.kp / L.ce;
    L.xf_off = L.kp * 2, L.xs_off = L.xf_off + L.nch * 64;
    L.stride = (L.xs_off + (K / gs) * 4 + 63) & ~(int64_t)63;
    return L;
}

static void qgemv_prep_avx512(const float *x, int M, int64_t K, int bits, int gs, void *prep) {
    const qlay L = qlayout(K, bits, gs);
    const int64_t G = K / gs;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int m = 0; m < M; m++) {
        const float *xr = x + (int64_t)m * K;
        uint8_t *base = (uint8_t *)prep + m * L.stride;
        float *xf = (float *)(base + L.xf_off), *xs = (float *)(base + L.xs_off);
        for (int64_t c = 0; c < L.nch; c++) {
            int8_t *q = (int8_t *)base + c * L.ce * 2;
            for (int b = 0; b < L.ce / 32; b++) { /* 32-element blocks of x */
                const int64_t k = c * L.ce + b * 32;
                const int64_t left = K - k;
                const __mmask16 m0 = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
                const __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
                const __m512 lo = _mm512_maskz_loadu_ps(m0, xr + (m0 ? k : 0));
                const __m512 hi = _mm512_maskz_loadu_ps(m1, xr + (m1 ? k + 16 : 0));
                const float mx =
                    _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, absmask), _mm512_and_ps(hi, absmask)));
                const __m512 inv = _mm512_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
                const float fac = mx / 127.0f / 256.0f;
                __m128i h0, l0, h1, l1;
                if (bits == 4) { /* evens to the low-nibble half, odds to the high */
                    kn_quant_hl(_mm512_permutex2var_ps(lo, ev, hi), inv, &h0, &l0);
                    kn_quant_hl(_mm512_permutex2var_ps(lo, od, hi), inv, &h1, &l1);
                    _mm_storeu_si128((__m128i *)(q + 16 * b), h0);
                    _mm_storeu_si128((__m128i *)(q + 64 + 16 * b), h1);
                    _mm_storeu_si128((__m128i *)(q + 128 + 16 * b), l0);
                    _mm_storeu_si128((__m128i *)(q + 192 + 16 * b), l1);
                    for (int i = 0; i < 4; i++) xf[c * 16 + 4 * b + i] = fac; /* lanes 4b..4b+3 */
                } else {
                    kn_quant_hl(lo, inv, &h0, &l0);
                    kn_quant_hl(hi, inv, &h1, &l1);
                    _mm_storeu_si128((__m128i *)(q + 32 * b), h0);
                    _mm_storeu_si128((__m128i *)(q + 32 * b + 16), h1);
                    _mm_storeu_si128((__m128i *)(q + 64 + 32 * b), l0);
                    _mm_storeu_si128((__m128i *)(q + 64 + 32 * b + 16), l1);
                    for (int i = 0; i < 8; i++) xf[c * 16 + 8 * b + i] = fac; /* lanes 8b..8b+7 */
                }
            }
        }
        for (int64_t g = 0; g < G; g++) {
            __m512 s = _mm512_setzero_ps();
            for (int k = 0; k < gs; k += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xr + g * gs + k));
            xs[g] = _mm512_reduce_add_ps(s);
        }
    }
}

/* 16 scales or biases from i on (lanes past mask zero) as f32 */
ALWAYS_INLINE __m512 load_sb(const void *p, int64_t i, __mmask16 k, kn_dtype dt) {
    if (dt == KN_DT_F32) return _mm512_maskz_loadu_ps(k, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i);
    if (dt == KN_DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Weight row n against mr rows of prep (stride L->stride) into out[i * N + n]. */
/* how far ahead of the code stream qgemv prefetches: measured on Zen 5 (2
 * threads, 0.44B 4-bit), 3 KiB beat 0.5-2 KiB and 4 KiB */
#define QGEMV_PREFETCH_BYTES 3072

ALWAYS_INLINE void qgemv_rows(const uint8_t *prep, const qlay *L, int mr, const kn_weight *w, int64_t n,
                              const float *bias, float *out, int bits, kn_dtype sdt) {
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size;
    const int gs = w->group_size, lg = __builtin_ctz((unsigned)gs);
    const int64_t row_bytes = K * bits / 8, esz = sdt == KN_DT_F32 ? 4 : 2;
    const int cb = 64; /* code bytes per chunk (CE * bits / 8) */
    const int64_t tail = row_bytes - (L->nch - 1) * cb;
    const __mmask64 tmask = tail >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << tail) - 1);
    const __m512i lane_e = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(L->epl));
    const __m512i nib = _mm512_set1_epi8(15);
    const uint8_t *codes = (const uint8_t *)w->data + n * row_bytes;
    const char *scr = (const char *)w->scales + n * G * esz, *bir = (const char *)w->biases + n * G * esz;
    /* the scale and bias streams run 1/16 as fast as the codes': fetch them well ahead */
    _mm_prefetch(scr + 16 * G * esz, _MM_HINT_T0);
    _mm_prefetch(bir + 16 * G * esz, _MM_HINT_T0);
    __m512 acc[4], bacc[4];
    for (int i = 0; i < mr; i++) acc[i] = bacc[i] = _mm512_setzero_ps();
    for (int64_t gb = 0; gb < G; gb += 16) {
        const __mmask16 gm = G - gb >= 16 ? 0xffff : (__mmask16)((1u << (G - gb)) - 1);
        const __m512 sv = load_sb(scr, gb, gm, sdt), bv = load_sb(bir, gb, gm, sdt);
        for (int i = 0; i < mr; i++) {
            const float *xs = (const float *)(prep + i * L->stride + L->xs_off);
            bacc[i] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(gm, xs + gb), bacc[i]);
        }
        const int64_t c0 = gb * gs / L->ce, c1e = (gb + 16) * gs / L->ce, c1 = c1e < L->nch ? c1e : L->nch;
        __m512i e = lane_e; /* element offset of each lane from the block's first */
        for (int64_t c = c0; c < c1; c++, e = _mm512_add_epi32(e, _mm512_set1_epi32(L->ce))) {
            const __m512 f = _mm512_permutexvar_ps(_mm512_srli_epi32(e, lg), sv);
            const uint8_t *cp = codes + c * cb;
            _mm_prefetch((const char *)cp + QGEMV_PREFETCH_BYTES, _MM_HINT_T0);
            const __m512i v = c == L->nch - 1 ? _mm512_maskz_loadu_epi8(tmask, cp) : _mm512_loadu_si512(cp);
            __m512i lo = v, hi = v;
            if (bits == 4) lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            for (int i = 0; i < mr; i++) {
                const uint8_t *row = prep + i * L->stride;
                const int8_t *xq = (const int8_t *)row + c * L->ce * 2;
                __m512i ah, al;
                if (bits == 4) {
                    ah = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(xq));
                    ah = _mm512_dpbusd_epi32(ah, hi, _mm512_load_si512(xq + 64));
                    al = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(xq + 128));
                    al = _mm512_dpbusd_epi32(al, hi, _mm512_load_si512(xq + 192));
                } else {
                    ah = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, _mm512_load_si512(xq));
                    al = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, _mm512_load_si512(xq + 64));
                }
                const __m512i t = _mm512_add_epi32(_mm512_slli_epi32(ah, 8), al);
                const __m512 xf = _mm512_load_ps((const float *)(row + L->xf_off) + c * 16);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(f, xf), acc[i]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        out[(int64_t)i * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], bacc[i])) + (bias ? bias[n] : 0.0f);
}

/* sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k per group. The
 * code bytes are dotted with x's int8 h and l by vpdpbusd (exact integer
 * sums), the chunk's (h << 8) + l per lane converted to f32 and scaled by the
 * lane's group scale times x's block scale. Up to 4 rows of x per pass over
 * a weight row (constant counts: accumulators stay in registers). */
ALWAYS_INLINE void qgemv_t(const uint8_t *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                           int64_t n1, int bits, kn_dtype sdt) {
    const qlay L = qlayout(w->cols, bits, w->group_size);
    for (int64_t n = n0; n < n1; n++)
        for (int m0 = 0; m0 < M; m0 += 4) {
            const uint8_t *p = prep + m0 * L.stride;
            float *o = out + (int64_t)m0 * w->rows;
            switch (M - m0 < 4 ? M - m0 : 4) {
            case 1: qgemv_rows(p, &L, 1, w, n, bias, o, bits, sdt); break;
            case 2: qgemv_rows(p, &L, 2, w, n, bias, o, bits, sdt); break;
            case 3: qgemv_rows(p, &L, 3, w, n, bias, o, bits, sdt); break;
            default: qgemv_rows(p, &L, 4, w, n, bias, o, bits, sdt); break;
            }
        }
}

static int qgemv_avx512(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                        int64_t n1) {
    const uint8_t *p = prep;
#define QG(B)                                                                                                          \
    do {                                                                                                               \
        if (w->sb_dtype == KN_DT_BF16) qgemv_t(p, M, w, bias, out, n0, n1, B, KN_DT_BF16);                             \
        else if (w->sb_dtype == KN_DT_F16) qgemv_t(p, M, w, bias, out, n0, n1, B, KN_DT_F16);                          \
        else qgemv_t(p, M, w, bias, out, n0, n1, B, KN_DT_F32);                                                        \
    } while (0)
    if (w->bits == 8) QG(8);
    else if (w->bits == 4) QG(4);
    else return 0;
#undef QG
    return 1;
}

/* ---- quantized gemm (prefill) --------------------------------------------- */

/* apf[tile][k][32]: x rows of 32-row tiles [t0, t1) in f32 (zero past M);
 * for 4-bit codes k runs in each 32-chunk's evens, then its odds, to match
 * dequant_row's. */
static void pack_a_f32_avx512(const float *x, int M, int64_t K, int bits, int gs, int t0, int t1, void *prep) {
    (void)gs;
    float *apf = prep;
    for (int t = t0; t < t1; t++) {
        float *dst = apf + (int64_t)t * K * 32;
        for (int i = 0; i < 32; i++) {
            const int m = t * 32 + i;
            for (int64_t k = 0; k < K; k += 32)
                for (int j = 0; j < 32; j++) {
                    const int64_t src = bits == 4 ? k + (j < 16 ? 2 * j : 2 * (j - 16) + 1) : k + j;
                    dst[(k + j) * 32 + i] = m < M ? x[(int64_t)m * K + src] : 0.0f;
                }
        }
    }
}

/* Codes of one 32-element chunk as two f32 vectors matching pack_a_f32's order. */
ALWAYS_INLINE void codes32(const uint8_t *c, int bits, __m512 *v0, __m512 *v1) {
    if (bits == 8) {
        *v0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c)));
        *v1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + 16))));
    } else {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c));
        *v0 = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
        *v1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
    }
}

/* out[i] = scale * q + bias over packed row `codes` (K elements) whose
 * scales/biases (sb_dtype dt) start at element i0, in pack_a_f32's order. */
static void dequant_row(const uint8_t *codes, const void *sc, const void *bi, int64_t i0, kn_dtype dt, int64_t K,
                        int gs, int bits, float *out) {
    const int chunk_bytes = 32 * bits / 8;
    for (int64_t k = 0; k < K; k += 32, codes += chunk_bytes) {
        __m512 v0, v1;
        codes32(codes, bits, &v0, &v1);
        const __m512 s = _mm512_set1_ps(kn_load_f32(sc, dt, i0 + k / gs));
        const __m512 b = _mm512_set1_ps(kn_load_f32(bi, dt, i0 + k / gs));
        _mm512_storeu_ps(out + k, _mm512_fmadd_ps(v0, s, b));
        _mm512_storeu_ps(out + k + 16, _mm512_fmadd_ps(v1, s, b));
    }
}

/* out[m0 + 0..31, n .. n+NR) = apf tile . wb[0..NR)^T over all of K (f32). */
ALWAYS_INLINE void f32_tile(const float *ap, int64_t K, const float *wb, int NR, int mrows, const float *bias,
                            float *out, int64_t ldo) {
    __m512 acc[2][12];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 a0 = _mm512_load_ps(ap + k * 32), a1 = _mm512_load_ps(ap + k * 32 + 16);
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            if (i >= NR) break;
            __m512 b = _mm512_set1_ps(wb[i * K + k]);
            acc[0][i] = _mm512_fmadd_ps(a0, b, acc[0][i]);
            acc[1][i] = _mm512_fmadd_ps(a1, b, acc[1][i]);
        }
    }
    store_tile_rows((const __m512(*)[12])acc, NR, mrows, bias, out, ldo);
}

/* Output columns [n0, n1): 12 weight rows at a time are dequantized into
 * wb (12 * K floats, per thread), then every 32-row x tile runs over them. */
static size_t qgemm_f32_prep_bytes(int M, int64_t K, int bits, int gs) {
    (void)bits, (void)gs;
    return (size_t)((M + 31) / 32) * 32 * (size_t)K * sizeof(float);
}

static size_t qgemm_f32_scratch_bytes(int64_t K, int gs) {
    (void)gs;
    return (size_t)12 * (size_t)K * sizeof(float);
}

static int qgemm_avx512(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                        int64_t n1, void *scratch) {
    const float *apf = prep;
    float *wb = scratch;
    if (w->bits != 4 && w->bits != 8) return 0;
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size, row_bytes = K * w->bits / 8;
    const int tiles = (M + 31) / 32;
    for (int64_t n = n0; n < n1; n += 12) {
        const int nr = (int)(n1 - n < 12 ? n1 - n : 12);
        for (int i = 0; i < nr; i++)
            dequant_row((const uint8_t *)w->data + (n + i) * row_bytes, w->scales, w->biases, (n + i) * G, w->sb_dtype,
                        K, w->group_size, w->bits, wb + i * K);
        for (int t = 0; t < tiles; t++) {
            const float *ap = apf + (int64_t)t * K * 32;
            float *o = out + (int64_t)t * 32 * N + n;
            const float *bb = bias ? bias + n : NULL;
            switch (nr) {
#define NR_CASE(R)                                                                                                     \
    case R: f32_tile(ap, K, wb, R, M - t * 32, bb, o, N); break;
                NR_CASE(1) NR_CASE(2) NR_CASE(3) NR_CASE(4) NR_CASE(5) NR_CASE(6) NR_CASE(7) NR_CASE(8) NR_CASE(9)
                NR_CASE(10) NR_CASE(11) NR_CASE(12)
#undef NR_CASE
            }
        }
    }
    return 1;
}

/* ---- attention over bf16 KV rows ------------------------------------------ */

ALWAYS_INLINE __m512 bf16x16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* dot_rows_bf16 for head_dim = 16 nv: each key row widened once (nv
 * registers, constant indices) for all ng query vectors; the sums of the
 * general loop below, in its order */
ALWAYS_INLINE void dot_rows_bf16_widened(const float *q, int ng, int D, const uint8_t *rows, int64_t stride, int n,
                                         float *s, int64_t ld, const int nv) {
    for (int j = 0; j < n; j++) {
        const uint8_t *r = rows + j * stride;
        if (j + 2 < n) _mm_prefetch((const char *)(r + 2 * stride), _MM_HINT_T0);
        __m512 kr[16];
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) kr[v] = bf16x16(r + 32 * v);
        for (int g = 0; g < ng; g++) {
            const float *qg = q + (int64_t)g * D;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0;
#pragma GCC unroll 8
            for (int v = 0; v + 2 <= nv; v += 2) {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * v), kr[v], a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * v + 16), kr[v + 1], a1);
            }
            if (nv % 2) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * (nv - 1)), kr[nv - 1], a0);
            s[(int64_t)g * ld + j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
    }
}

static void dot_rows_bf16_avx512(const float *q, int ng, int D, const uint8_t *rows, int64_t stride, int n, float *s,
                                 int64_t ld) {
    switch (D) { /* the common head sizes */
    case 64: dot_rows_bf16_widened(q, ng, D, rows, stride, n, s, ld, 4); return;
    case 128: dot_rows_bf16_widened(q, ng, D, rows, stride, n, s, ld, 8); return;
    case 256: dot_rows_bf16_widened(q, ng, D, rows, stride, n, s, ld, 16); return;
    default: break;
    }
    for (int j = 0; j < n; j++) {
        const uint8_t *r = rows + j * stride;
        if (j + 2 < n) _mm_prefetch((const char *)(r + 2 * stride), _MM_HINT_T0);
        for (int g = 0; g < ng; g++) {
            const float *qg = q + (int64_t)g * D;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0;
            int d = 0;
            for (; d + 32 <= D; d += 32) {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + d), bf16x16(r + 2 * d), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + d + 16), bf16x16(r + 2 * d + 32), a1);
            }
            if (d < D) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + d), bf16x16(r + 2 * d), a0);
            s[(int64_t)g * ld + j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
    }
}

/* acc_g += sum_j w[g][j] * row_j for the ng query vectors: 64 columns of up
 * to 4 vectors' accumulators in registers over all n rows, each row's 64
 * bf16 values widened once for those vectors (the sums run over j in order,
 * as before) */
static void axpy_rows_bf16_avx512(float *acc, int ng, int D, const uint8_t *rows, int64_t stride, int n,
                                  const float *w, int64_t ld) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        const int nv = D - d0 >= 64 ? 4 : (D - d0) / 16;
        for (int g0 = 0; g0 < ng; g0 += 4) {
            const int gb = ng - g0 < 4 ? ng - g0 : 4;
            __m512 a[4][4];
#pragma GCC unroll 4
            for (int gi = 0; gi < 4; gi++)
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    a[gi][v] = gi < gb && v < nv ? _mm512_loadu_ps(acc + (int64_t)(g0 + gi) * D + d0 + 16 * v)
                                                 : _mm512_setzero_ps();
            for (int j = 0; j < n; j++) {
                const uint8_t *r = rows + j * stride + 2 * d0;
                __m512 kv[4];
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) kv[v] = v < nv ? bf16x16(r + 32 * v) : _mm512_setzero_ps();
#pragma GCC unroll 4
                for (int gi = 0; gi < 4; gi++) {
                    if (gi >= gb) break;
                    const __m512 wj = _mm512_set1_ps(w[(int64_t)(g0 + gi) * ld + j]);
#pragma GCC unroll 4
                    for (int v = 0; v < 4; v++)
                        if (v < nv) a[gi][v] = _mm512_fmadd_ps(wj, kv[v], a[gi][v]);
                }
            }
#pragma GCC unroll 4
            for (int gi = 0; gi < 4; gi++)
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    if (gi < gb && v < nv) _mm512_storeu_ps(acc + (int64_t)(g0 + gi) * D + d0 + 16 * v, a[gi][v]);
        }
    }
}

/* ---- softmax and SiLU pieces ---------------------------------------------- */

ALWAYS_INLINE __mmask16 tail_mask(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

static float scale_max_avx512(float *s, int n, float scale) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = tail_mask(n - j);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), sc);
        _mm512_mask_storeu_ps(s + j, k, v);
        m = _mm512_mask_max_ps(m, k, v, m); /* NaN lanes keep m */
    }
    return _mm512_reduce_max_ps(m);
}

static float exp_shift_sum_avx512(float *s, int n, float mx) {
    __m512 sum = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(mx);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = tail_mask(n - j);
        const __m512 e = kn_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

static void silu_mul_avx512(float *o, const float *g, const float *u, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = tail_mask(n - j);
        const __m512 gv = _mm512_maskz_loadu_ps(k, g + j);
        const __m512 sig = _mm512_div_ps(gv, _mm512_add_ps(one, kn_exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_mask_storeu_ps(o + j, k, _mm512_mul_ps(sig, _mm512_maskz_loadu_ps(k, u + j)));
    }
}

/* ---- the decode GEMVs' x preparation --------------------------------------- */

/* kn_f32_to_bf16 on 16 lanes, in integers (vcvtneps2bf16 would flush
 * subnormals to zero): u + 0x7fff + bit 16 of u, the high half; NaN: the
 * high half with the quiet bit set */
static void round_bf16_avx512(const float *x, int64_t n, uint16_t *out) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i > 16 ? 16 : (int)(n - i));
        const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
        const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        const __m512i w = _mm512_mask_or_epi32(r, nan, hi, quiet);
        _mm256_mask_storeu_epi16(out + i, k, _mm512_cvtepi32_epi16(w));
    }
}

/* the sum of squares in double, four chains of eight */
static double sum_squares_avx512(const float *x, int n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        const __m512d c = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)), d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
        s0 = _mm512_fmadd_pd(a, a, s0), s1 = _mm512_fmadd_pd(b, b, s1);
        s2 = _mm512_fmadd_pd(c, c, s2), s3 = _mm512_fmadd_pd(d, d, s3);
    }
    for (; i < n; i += 8) {
        const __mmask8 k = (__mmask8)(n - i >= 8 ? 0xff : (1u << (n - i)) - 1);
        const __m512d a = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + i));
        s0 = _mm512_fmadd_pd(a, a, s0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
}

/* ---- the kernel set ------------------------------------------------------ */

static kn_cpu_kernels avx512_set;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;

static void avx512_init(void) {
    avx512_set = kn_cpu_kernels_avx2;
    avx512_set.name = "avx512";
    avx512_set.gemv = gemv_avx512;
    avx512_set.pack_a_bf16 = pack_a_bf16_avx512;
    avx512_set.gemm_bf16 = gemm_bf16_avx512;
    avx512_set.gemv_bf16 = gemv_bf16_avx512;
    if (__builtin_cpu_supports("avx512vnni")) { /* vpdpbusd */
        avx512_set.qgemv_prep = qgemv_prep_avx512;
        avx512_set.qgemv = qgemv_avx512;
    }
    avx512_set.qgemm_tile_rows = 32;
    avx512_set.qgemm_prep_bytes = qgemm_f32_prep_bytes;
    avx512_set.qgemm_scratch_bytes = qgemm_f32_scratch_bytes;
    avx512_set.qpack_a = pack_a_f32_avx512;
    avx512_set.scale_max = scale_max_avx512;
    avx512_set.exp_shift_sum = exp_shift_sum_avx512;
    avx512_set.silu_mul = silu_mul_avx512;
    avx512_set.dot_rows_bf16 = dot_rows_bf16_avx512;
    avx512_set.axpy_rows_bf16 = axpy_rows_bf16_avx512;
    avx512_set.round_bf16 = round_bf16_avx512;
    avx512_set.sum_squares = sum_squares_avx512;
    avx512_set.qgemm = qgemm_avx512;
    if (__builtin_cpu_supports("avx512vnni")) { /* the integer prefill GEMM over the codes */
        avx512_set.qgemm_tile_rows = kn_qgemm_vnni_tile_rows;
        avx512_set.qgemm_prep_bytes = kn_qgemm_vnni_prep_bytes;
        avx512_set.qgemm_scratch_bytes = kn_qgemm_vnni_scratch_bytes;
        avx512_set.qpack_a = kn_qpack_vnni;
        avx512_set.qgemm = kn_qgemm_vnni;
    }
}

const kn_cpu_kernels *kn_cpu_kernels_avx512(void) {
    pthread_once(&avx512_once, avx512_init);
    return &avx512_set;
}

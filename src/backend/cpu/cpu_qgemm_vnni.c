/* cpu_qgemm_vnni.c — prefill (large-M) matmul over MLX affine 4/8-bit
 * weights with AVX-512 VNNI, reading the packed codes (no dequantized copy
 * of the weight). Compiled with the AVX-512 flags; chosen by
 * kn_cpu_kernels_avx512 where the processor has vpdpbusd.
 *
 * Per group of gs elements, sum_k x_k (s q_k + b) = s * sum_k x_k q_k +
 * b * sum_k x_k. x is quantized per (row, group) as in the decode GEMV:
 * x ~ xs * (h + l / 256) with int8 h and l (|error| <= max|x over the group|
 * / 32512 per element), so the integer dot products carry 16 bits of x.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones. x is the unsigned side,
 * u = h + 128 (and u_l = l + 128), in 16-lane vectors whose lanes are 16 rows
 * of x and whose 4 bytes are 4 elements ("a quad"); the weight is the signed
 * side, c = q - o (o = 0 for 4-bit codes, which fit int8; 128 for 8-bit), one
 * quad of one weight row broadcast to all lanes. With A = sum u c over a
 * group, sum h q = A + o sum h - 128 (sum q - o gs): exact int32 arithmetic,
 * with the x-side term (o sum h) packed beside x and the weight-side term
 * (128 (sum q - o gs)) computed when a weight row is unpacked.
 *
 * 4-bit codes: word c of a row holds elements 8c..8c+7 as nibbles, so its low
 * nibbles are the quad (8c, 8c+2, 8c+4, 8c+6) and its high nibbles the quad
 * (8c+1, 8c+3, 8c+5, 8c+7); x is packed in that order. 8-bit: quad j is
 * elements 4j..4j+3 as stored.
 *
 * Packed x, per tile of QV_ROWS = 16 * QV_MV rows: quads (K / 4 of them) of
 * QV_QUAD bytes each ([u_h of each 16 rows][u_l of each 16 rows], a dword per
 * row), then per group [xs][o sum h][o sum l][exact sum x] for the tile's
 * rows (float, int32, int32, float). Rows past M are zero (xs = 0).
 *
 * Register tile: 16 rows of x (one vector) x 8 weight rows, 16 integer
 * accumulators. Measured on the 2-core Zen 5 (4-bit prefill of the 0.44B
 * shape, 128 tokens): 522-547 tok/s, against 463-479 for 16 x 4, 497-502 for
 * 16 x 6 and 470-495 for 32 x 4 — a 16-row tile's x (K / 4 quads of 128
 * bytes: 32 KiB at K = 1024) stays in L1 while 8 weight rows run over it. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_avx512_inline.h"
#include "backend/cpu/cpu_kernels.h"
#include "base/quant.h"

#ifndef QV_MV
#define QV_MV 1 /* 16-row vectors of x per tile (see above) */
#endif
#define QV_ROWS (16 * QV_MV)  /* rows of x per packed tile */
#define QV_QUAD (128 * QV_MV) /* bytes per quad of a tile: u_h then u_l, 64 per 16 rows */
#ifndef QV_NR
#define QV_NR 8 /* weight rows per register tile (see above) */
#endif
#define QV_WM (3 * QV_NR) /* floats of unpacked group data per group */

typedef struct {
    int64_t quads, G, meta_off, bytes; /* per tile: quads, groups, byte offset of the group data, size */
} qv_layout;

ALWAYS_INLINE qv_layout qv_lay(int64_t K, int gs) {
    qv_layout L;
    L.quads = K / 4, L.G = K / gs;
    L.meta_off = L.quads * QV_QUAD;
    L.bytes = L.meta_off + L.G * 4 * QV_ROWS * 4;
    return L;
}

const int kn_qgemm_vnni_tile_rows = QV_ROWS;

size_t kn_qgemm_vnni_prep_bytes(int M, int64_t K, int bits, int gs) {
    (void)bits;
    return (size_t)((M + QV_ROWS - 1) / QV_ROWS) * (size_t)qv_lay(K, gs).bytes;
}

/* 16 elements of row xr from k on, in the quads' order (4-bit: each 8-element
 * word's evens, then its odds) */
ALWAYS_INLINE __m512 load_in_quad_order(const float *xr, int64_t k, int bits) {
    const __m512 v = _mm512_loadu_ps(xr + k);
    if (bits != 4) return v;
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15), v);
}

void kn_qpack_vnni(const float *x, int M, int64_t K, int bits, int gs, int t0, int t1, void *prep) {
    const qv_layout L = qv_lay(K, gs);
    const int o = bits == 8 ? 128 : 0;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i gidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    for (int t = t0; t < t1; t++) {
        uint8_t *tile = (uint8_t *)prep + (int64_t)t * L.bytes;
        for (int64_t g = 0; g < L.G; g++) {
            uint8_t *meta = tile + L.meta_off + g * 4 * QV_ROWS * 4;
            float *xs = (float *)meta, *xsum = (float *)(meta + 3 * QV_ROWS * 4);
            int32_t *sh = (int32_t *)(meta + QV_ROWS * 4), *sl = (int32_t *)(meta + 2 * QV_ROWS * 4);
            for (int half = 0; half < QV_MV; half++) {
                float inv[16];
                for (int i = 0; i < 16; i++) { /* scale and exact sum of each row's group */
                    const int r = half * 16 + i, m = t * QV_ROWS + r;
                    float mx = 0.0f, sum = 0.0f;
                    if (m < M) {
                        const float *xr = x + (int64_t)m * K + g * gs;
                        __m512 vm = _mm512_setzero_ps(), vs = _mm512_setzero_ps();
                        for (int k = 0; k < gs; k += 16) {
                            const __m512 v = _mm512_loadu_ps(xr + k);
                            vm = _mm512_max_ps(vm, _mm512_and_ps(v, absmask));
                            vs = _mm512_add_ps(vs, v);
                        }
                        mx = _mm512_reduce_max_ps(vm), sum = _mm512_reduce_add_ps(vs);
                    }
                    inv[i] = mx > 0.0f ? 127.0f / mx : 0.0f;
                    xs[r] = mx / 127.0f, xsum[r] = sum, sh[r] = 0, sl[r] = 0;
                }
                for (int k = 0; k < gs; k += 16) { /* 4 quads of 16 rows at a time */
                    int8_t th[16][16], tl[16][16];
                    for (int i = 0; i < 16; i++) {
                        const int r = half * 16 + i, m = t * QV_ROWS + r;
                        __m128i h = _mm_setzero_si128(), l = _mm_setzero_si128();
                        if (m < M)
                            kn_quant_hl(load_in_quad_order(x + (int64_t)m * K, g * gs + k, bits),
                                        _mm512_set1_ps(inv[i]), &h, &l);
                        _mm_storeu_si128((__m128i *)th[i], h);
                        _mm_storeu_si128((__m128i *)tl[i], l);
                        if (o) {
                            sh[r] += o * _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(h));
                            sl[r] += o * _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(l));
                        }
                    }
                    for (int q = 0; q < 4; q++) { /* dword q of each row: one quad for 16 rows */
                        uint8_t *dst = tile + ((g * gs + k) / 4 + q) * QV_QUAD + half * 64;
                        const __m512i vh = _mm512_i32gather_epi32(_mm512_add_epi32(gidx, _mm512_set1_epi32(4 * q)),
                                                                  (const void *)th, 1);
                        const __m512i vl = _mm512_i32gather_epi32(_mm512_add_epi32(gidx, _mm512_set1_epi32(4 * q)),
                                                                  (const void *)tl, 1);
                        _mm512_store_si512(dst, _mm512_xor_si512(vh, flip)); /* h + 128 as unsigned bytes */
                        _mm512_store_si512(dst + 64 * QV_MV, _mm512_xor_si512(vl, flip));
                    }
                }
            }
        }
    }
}

/* Weight rows [n, n + nr) (nr <= 4; missing rows zero) unpacked for the
 * tile: wq[r * quads + j] = quad j of row r as signed bytes c = q - o; per
 * group g, wm[g * QV_WM + {0, 1, 2} * QV_NR + r] = scale, bias and the weight-side term
 * 128 (sum q - o gs) (an integer below 2^24 in magnitude, so exact). */
static void unpack_rows(const kn_weight *w, int64_t n, int nr, int32_t *wq, float *wm) {
    const int64_t K = w->cols, G = K / w->group_size, words = K * w->bits / 32, quads = K / 4;
    const int gs = w->group_size, bits = w->bits, o = bits == 8 ? 128 : 0;
    const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f), ones = _mm512_set1_epi8(1);
    const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const int words_per_group = gs * bits / 32;
    for (int r = 0; r < QV_NR; r++) {
        int32_t *dst = wq + r * quads;
        if (r >= nr) {
            memset(dst, 0, (size_t)quads * 4);
            for (int64_t g = 0; g < G; g++) wm[g * QV_WM + r] = wm[g * QV_WM + QV_NR + r] = wm[g * QV_WM + 2 * QV_NR + r] = 0.0f;
            continue;
        }
        const uint32_t *codes = (const uint32_t *)w->data + (n + r) * words;
        int32_t wsum[16];
        int64_t g = 0;
        int32_t gsum = 0, in_group = 0;
        for (int64_t c = 0; c < words; c += 16) {
            const __mmask16 km = words - c >= 16 ? 0xffff : (__mmask16)((1u << (words - c)) - 1);
            const __m512i v = _mm512_maskz_loadu_epi32(km, codes + c);
            __m512i bytes_for_sum = v;
            if (bits == 4) {
                const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
                /* word i gives quads 2i (low nibbles) and 2i + 1 (high) */
                const int64_t nv = words - c < 16 ? words - c : 16;
                const __mmask16 k0 = nv >= 8 ? 0xffff : (__mmask16)((1u << (2 * nv)) - 1);
                const __mmask16 k1 = nv >= 16 ? 0xffff : nv <= 8 ? 0 : (__mmask16)((1u << (2 * (nv - 8))) - 1);
                _mm512_mask_storeu_epi32(dst + 2 * c, k0, _mm512_permutex2var_epi32(lo, lo_idx, hi));
                _mm512_mask_storeu_epi32(dst + 2 * c + 16, k1, _mm512_permutex2var_epi32(lo, hi_idx, hi));
                bytes_for_sum = _mm512_add_epi8(lo, hi); /* at most 30 per byte */
            } else {
                _mm512_mask_storeu_epi32(dst + c, km, _mm512_xor_si512(v, _mm512_set1_epi32((int)0x80808080u)));
            }
            _mm512_storeu_si512(wsum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), bytes_for_sum, ones));
            for (int i = 0; i < 16 && c + i < words; i++) { /* the code sum of each group */
                gsum += wsum[i];
                if (++in_group == words_per_group) {
                    const int64_t gi = (n + r) * G + g;
                    wm[g * QV_WM + r] = kn_load_f32(w->scales, w->sb_dtype, gi);
                    wm[g * QV_WM + QV_NR + r] = kn_load_f32(w->biases, w->sb_dtype, gi);
                    wm[g * QV_WM + 2 * QV_NR + r] = (float)(128 * (gsum - o * gs)); /* |.| < 2^24: exact */
                    g++, gsum = 0, in_group = 0;
                }
            }
        }
    }
}

/* acc += dot(u8 u, s8 s) per dword lane, accumulating in place: GCC 12
 * copies every accumulator of _mm512_dpbusd_epi32 around each loop trip
 * (measured: half the tile's time in register moves), the asm form keeps
 * them where they are. */
#define DPBUSD(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s))

/* out[m0 + 0..31, n .. n + nr) over all of K from one packed x tile and the
 * unpacked weight rows. */
static void vnni_tile(const uint8_t *xt, const qv_layout *L, int gs, const int32_t *wq, const float *wm, int nr,
                      int mrows, const float *bias, float *out, int64_t ldo, float *facc) {
    const int qpg = gs / 4;
    /* the float sums live in facc ([QV_MV][QV_NR][16], touched once per
     * group): the registers go to the integer accumulators of the inner loop */
    memset(facc, 0, QV_MV * QV_NR * 16 * sizeof(float));
    for (int64_t g = 0; g < L->G; g++) {
        __m512i ah[QV_MV][QV_NR], al[QV_MV][QV_NR];
#pragma GCC unroll 8
        for (int i = 0; i < QV_MV; i++)
#pragma GCC unroll 8
            for (int n = 0; n < QV_NR; n++) ah[i][n] = al[i][n] = _mm512_setzero_si512();
        const uint8_t *xq = xt + g * qpg * QV_QUAD;
        const int32_t *wg = wq + g * qpg;
        for (int j = 0; j < qpg; j++, xq += QV_QUAD) {
            __m512i xh[QV_MV], xl[QV_MV];
#pragma GCC unroll 8
            for (int i = 0; i < QV_MV; i++)
                xh[i] = _mm512_load_si512(xq + 64 * i), xl[i] = _mm512_load_si512(xq + 64 * (QV_MV + i));
#pragma GCC unroll 8
            for (int n = 0; n < QV_NR; n++) {
                const __m512i wb = _mm512_set1_epi32(wg[n * L->quads + j]);
#pragma GCC unroll 8
                for (int i = 0; i < QV_MV; i++) {
                    DPBUSD(ah[i][n], xh[i], wb);
                    DPBUSD(al[i][n], xl[i], wb);
                }
            }
        }
        const uint8_t *meta = xt + L->meta_off + g * 4 * QV_ROWS * 4;
        const float *wmg = wm + g * QV_WM;
#pragma GCC unroll 8
        for (int i = 0; i < QV_MV; i++) {
            const __m512 xs = _mm512_load_ps((const float *)meta + 16 * i);
            const __m512i sh = _mm512_load_si512(meta + QV_ROWS * 4 + 64 * i);
            const __m512i sl = _mm512_load_si512(meta + 2 * QV_ROWS * 4 + 64 * i);
            const __m512 xsum = _mm512_load_ps((const float *)(meta + 3 * QV_ROWS * 4) + 16 * i);
#pragma GCC unroll 8
            for (int n = 0; n < QV_NR; n++) {
                const __m512i cq = _mm512_set1_epi32((int32_t)wmg[2 * QV_NR + n]);
                const __m512i ih = _mm512_sub_epi32(_mm512_add_epi32(ah[i][n], sh), cq);
                const __m512i il = _mm512_sub_epi32(_mm512_add_epi32(al[i][n], sl), cq);
                const __m512 tv =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(il), _mm512_set1_ps(1.0f / 256.0f), _mm512_cvtepi32_ps(ih));
                float *fp = facc + (i * QV_NR + n) * 16;
                __m512 f = _mm512_fmadd_ps(tv, _mm512_mul_ps(xs, _mm512_set1_ps(wmg[n])), _mm512_loadu_ps(fp));
                _mm512_storeu_ps(fp, _mm512_fmadd_ps(xsum, _mm512_set1_ps(wmg[QV_NR + n]), f));
            }
        }
    }
    /* row by row: an output row's columns are adjacent (a scatter per column
     * touched 16 cache lines per instruction) */
    const int rows = mrows < QV_ROWS ? mrows : QV_ROWS;
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < nr; n++)
            out[(int64_t)m * ldo + n] = facc[((m / 16) * QV_NR + n) * 16 + m % 16] + (bias ? bias[n] : 0.0f);
}

size_t kn_qgemm_vnni_scratch_bytes(int64_t K, int gs) {
    return (size_t)QV_NR * (size_t)K + (size_t)(K / gs) * QV_WM * sizeof(float) + QV_MV * QV_NR * 16 * sizeof(float);
}

int kn_qgemm_vnni(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1,
                  void *scratch) {
    if ((w->bits != 4 && w->bits != 8) || w->cols % 32 != 0 || w->group_size % 16 != 0) return 0;
    const int64_t K = w->cols, N = w->rows;
    const qv_layout L = qv_lay(K, w->group_size);
    const int tiles = (M + QV_ROWS - 1) / QV_ROWS;
    int32_t *wq = scratch;
    float *wm = (float *)((uint8_t *)scratch + (size_t)QV_NR * (size_t)K);
    float *facc = wm + L.G * QV_WM;
    for (int64_t n = n0; n < n1; n += QV_NR) {
        const int nr = (int)(n1 - n < QV_NR ? n1 - n : QV_NR);
        unpack_rows(w, n, nr, wq, wm);
        for (int t = 0; t < tiles; t++)
            vnni_tile((const uint8_t *)prep + (int64_t)t * L.bytes, &L, w->group_size, wq, wm, nr, M - t * QV_ROWS,
                      bias ? bias + n : NULL, out + (int64_t)t * QV_ROWS * N + n, N, facc);
    }
    return 1;
}

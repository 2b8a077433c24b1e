/* cpu_qgemv_avx2.c — the MLX affine 4/8-bit decode GEMV for processors with
 * AVX2 but without AVX-512 VNNI (Zen 2/3, Intel client cores before Ice
 * Lake, ...): the scheme of the VNNI kernel (cpu_kernels_avx512.c) with
 * vpmaddubsw + vpmaddwd in place of vpdpbusd. Compiled with AVX2/FMA/F16C
 * flags for this file only; the AVX2 kernel set (cpu_kernels_avx2.c) points
 * at it, and the AVX-512 set inherits it where the processor lacks VNNI.
 *
 *   sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k  per group.
 *
 * x is carried as two int8 terms per element, x ~ xscale * (h + l / 256),
 * xscale = max|x| / 127 over each aligned 32-element block (|error| <=
 * max|x over the block| / 32512 per element: kn_backend.quant_x_rel_error),
 * prepared once per matmul (qgemv_prep). The codes are unsigned nibbles
 * (0..15; an 8-bit code is split as 16 qh + ql), the x terms signed with
 * |h|, |l| <= 127, so vpmaddubsw's two products per 16-bit lane sum to at
 * most 3,810 and never saturate; 4-bit adds the low and high nibbles' sums in
 * 16 bits (<= 7,620), then vpmaddwd by 256 (h) and 1 (l) gives exact int32
 * sums per dword lane; 8-bit multiplies by 16 * 256, 256, 16 and 1. A dword
 * lane's integer sum is scaled by its group's scale times its x block's
 * xscale / 256 in f32; the biases' term uses exact f32 group sums of x.
 *
 * Chunks of 32 code bytes (64 elements at 4 bits, 32 at 8). prep per row of
 * x (stride bytes, 64-byte aligned):
 *   xq  per chunk CE * 2 int8: 4-bit [h even][h odd][l even][l odd] (32 each:
 *       the low nibble of code byte j is element 2j, the high one 2j + 1);
 *       8-bit [h][l]; zero past K
 *   xf  per chunk 8 floats: xscale / 256 of the block each dword lane covers
 *   xs  per group the exact f32 sum of x, zero-padded to a multiple of 8. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_avx2_inline.h"
#include "backend/cpu/cpu_kernels.h"

typedef struct {
    int ce;                                  /* elements per chunk */
    int64_t nch, xf_off, xs_off, stride;     /* chunks; byte offsets; bytes per row of x */
} qlay2;

ALWAYS_INLINE qlay2 qlayout2(int64_t K, int bits, int gs) {
    qlay2 L;
    L.ce = bits == 4 ? 64 : 32;
    L.nch = (K + L.ce - 1) / L.ce;
    L.xf_off = L.nch * L.ce * 2;
    L.xs_off = L.xf_off + L.nch * 32;
    const int64_t G8 = (K / gs + 7) / 8 * 8;
    L.stride = (L.xs_off + G8 * 4 + 63) & ~(int64_t)63;
    return L;
}

/* 16 int32 (v0, v1) to 16 int8 in order (values within +-127) */
ALWAYS_INLINE __m128i pack16(__m256i v0, __m256i v1) {
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

/* h = rint(t), l = clamp(rint((t - h) * 256), +-127) for t = v * inv */
ALWAYS_INLINE void quant_hl8(__m256 v, __m256 inv, __m256i *h, __m256i *l) {
    const __m256 t = _mm256_mul_ps(v, inv);
    const __m256 hf = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 lf = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(t, hf), _mm256_set1_ps(256.0f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    lf = _mm256_min_ps(_mm256_max_ps(lf, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    *h = _mm256_cvtps_epi32(hf), *l = _mm256_cvtps_epi32(lf);
}

ALWAYS_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

void kn_qgemv_prep_avx2(const float *x, int M, int64_t K, int bits, int gs, void *prep) {
    const qlay2 L = qlayout2(K, bits, gs);
    const int64_t G = K / gs;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int m = 0; m < M; m++) {
        const float *xr = x + (int64_t)m * K;
        uint8_t *base = (uint8_t *)prep + m * L.stride;
        float *xf = (float *)(base + L.xf_off), *xs = (float *)(base + L.xs_off);
        memset(base, 0, (size_t)L.xf_off); /* the x terms past K */
        for (int64_t c = 0; c < L.nch; c++)
            for (int i = 0; i < 8; i++) xf[c * 8 + i] = 0.0f;
        for (int64_t k = 0; k < K; k += 32) { /* aligned 32-element blocks (K % 32 == 0) */
            __m256 v[4];
            __m256 mxv = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xr + k + 8 * i);
                mxv = _mm256_max_ps(mxv, _mm256_and_ps(v[i], absmask));
            }
            const float mx = hmax8(mxv);
            const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
            const float fac = mx / 127.0f / 256.0f;
            const int64_t c = k / L.ce;
            int8_t *q = (int8_t *)base + c * L.ce * 2;
            __m256i h[4], l[4];
            if (bits == 4) { /* the block's evens and odds: 16 each */
                const int b = (int)(k % 64) / 32;
                for (int i = 0; i < 2; i++) {
                    const __m256 a = v[2 * i], d = v[2 * i + 1];
                    const __m256 ev = _mm256_castpd_ps(
                        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, d, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
                    const __m256 od = _mm256_castpd_ps(
                        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, d, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
                    quant_hl8(ev, inv, &h[i], &l[i]);
                    quant_hl8(od, inv, &h[2 + i], &l[2 + i]);
                }
                _mm_storeu_si128((__m128i *)(q + 16 * b), pack16(h[0], h[1]));
                _mm_storeu_si128((__m128i *)(q + 32 + 16 * b), pack16(h[2], h[3]));
                _mm_storeu_si128((__m128i *)(q + 64 + 16 * b), pack16(l[0], l[1]));
                _mm_storeu_si128((__m128i *)(q + 96 + 16 * b), pack16(l[2], l[3]));
                for (int i = 0; i < 4; i++) xf[c * 8 + 4 * b + i] = fac; /* dword lanes 4b..4b+3 */
            } else {
                for (int i = 0; i < 4; i++) quant_hl8(v[i], inv, &h[i], &l[i]);
                _mm_storeu_si128((__m128i *)q, pack16(h[0], h[1]));
                _mm_storeu_si128((__m128i *)(q + 16), pack16(h[2], h[3]));
                _mm_storeu_si128((__m128i *)(q + 32), pack16(l[0], l[1]));
                _mm_storeu_si128((__m128i *)(q + 48), pack16(l[2], l[3]));
                for (int i = 0; i < 8; i++) xf[c * 8 + i] = fac;
            }
        }
        for (int64_t g = 0; g < G; g++) {
            __m256 s = _mm256_setzero_ps();
            for (int k = 0; k < gs; k += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(xr + g * gs + k));
            xs[g] = hsum(s);
        }
        for (int64_t g = G; g % 8; g++) xs[g] = 0.0f;
    }
}

/* scales or biases [i, i + n) (n <= 8) as 8 f32 lanes, zero past n */
ALWAYS_INLINE __m256 load_sb8(const void *p, int64_t i, int n, kn_dtype dt) {
    const size_t esz = dt == KN_DT_F32 ? 4 : 2;
    if (n == 8) return load8(p, i, dt);
    uint32_t tmp[8] = {0};
    memcpy(tmp, (const char *)p + i * esz, (size_t)n * esz);
    return load8(tmp, 0, dt);
}

/* how far ahead of the code stream the GEMV prefetches (the VNNI kernel's
 * measured distance) */
#define QGEMV2_PREFETCH_BYTES 3072

/* Weight row n against mr rows of prep into out[i * N + n]. */
ALWAYS_INLINE void qgemv2_rows(const uint8_t *prep, const qlay2 *L, int mr, const kn_weight *w, int64_t n,
                               const float *bias, float *out, int bits, kn_dtype sdt) {
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size;
    const int gs = w->group_size, lg = __builtin_ctz((unsigned)gs);
    const int64_t row_bytes = K * bits / 8, esz = sdt == KN_DT_F32 ? 4 : 2;
    const int64_t last_bytes = row_bytes - (L->nch - 1) * 32; /* 16 or 32 */
    const __m256i nib = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1), s256 = _mm256_set1_epi16(256);
    const __m256i s16 = _mm256_set1_epi16(16), s4096 = _mm256_set1_epi16(4096);
    /* element offset of each dword lane within its chunk */
    const __m256i lane_e = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits == 4 ? 8 : 4));
    const uint8_t *codes = (const uint8_t *)w->data + n * row_bytes;
    const char *scr = (const char *)w->scales + n * G * esz, *bir = (const char *)w->biases + n * G * esz;
    /* the scale and bias streams run 1/16 as fast as the codes': fetch them well ahead */
    _mm_prefetch(scr + 16 * G * esz, _MM_HINT_T0);
    _mm_prefetch(bir + 16 * G * esz, _MM_HINT_T0);
    __m256 acc[4], bacc[4];
    for (int i = 0; i < mr; i++) acc[i] = bacc[i] = _mm256_setzero_ps();
    for (int64_t gb = 0; gb < G; gb += 8) {
        const int ng = G - gb >= 8 ? 8 : (int)(G - gb);
        const __m256 sv = load_sb8(scr, gb, ng, sdt), bv = load_sb8(bir, gb, ng, sdt);
        for (int i = 0; i < mr; i++) {
            const float *xs = (const float *)(prep + i * L->stride + L->xs_off);
            bacc[i] = _mm256_fmadd_ps(bv, _mm256_load_ps(xs + gb), bacc[i]);
        }
        const int64_t c0 = gb * gs / L->ce, c1e = (gb + 8) * gs / L->ce, c1 = c1e < L->nch ? c1e : L->nch;
        __m256i e = lane_e; /* element offset of each lane from the window's first group */
        for (int64_t c = c0; c < c1; c++, e = _mm256_add_epi32(e, _mm256_set1_epi32(L->ce))) {
            const __m256 f = _mm256_permutevar8x32_ps(sv, _mm256_srli_epi32(e, lg));
            const uint8_t *cp = codes + c * 32;
            if (!(c & 1)) _mm_prefetch((const char *)cp + QGEMV2_PREFETCH_BYTES, _MM_HINT_T0); /* once a line */
            const __m256i v = c == L->nch - 1 && last_bytes < 32
                                  ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)cp))
                                  : _mm256_loadu_si256((const __m256i *)cp);
            const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            for (int i = 0; i < mr; i++) {
                const uint8_t *row = prep + i * L->stride;
                const __m256i *xq = (const __m256i *)(row + c * L->ce * 2);
                __m256i t;
                if (bits == 4) {
                    const __m256i h16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256(xq)),
                                                         _mm256_maddubs_epi16(hi, _mm256_load_si256(xq + 1)));
                    const __m256i l16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256(xq + 2)),
                                                         _mm256_maddubs_epi16(hi, _mm256_load_si256(xq + 3)));
                    t = _mm256_add_epi32(_mm256_madd_epi16(h16, s256), _mm256_madd_epi16(l16, one));
                } else {
                    const __m256i xh = _mm256_load_si256(xq), xl = _mm256_load_si256(xq + 1);
                    const __m256i th = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xh), s256),
                                                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s4096));
                    const __m256i tl = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), one),
                                                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xl), s16));
                    t = _mm256_add_epi32(th, tl);
                }
                const __m256 xf = _mm256_load_ps((const float *)(row + L->xf_off) + c * 8);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(f, xf), acc[i]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        out[(int64_t)i * N + n] = hsum(_mm256_add_ps(acc[i], bacc[i])) + (bias ? bias[n] : 0.0f);
}

/* up to 4 rows of x per pass over a weight row (constant counts: the
 * accumulators stay in registers) */
ALWAYS_INLINE void qgemv2_t(const uint8_t *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                            int64_t n1, int bits, kn_dtype sdt) {
    const qlay2 L = qlayout2(w->cols, bits, w->group_size);
    for (int64_t n = n0; n < n1; n++)
        for (int m0 = 0; m0 < M; m0 += 4) {
            const uint8_t *p = prep + m0 * L.stride;
            float *o = out + (int64_t)m0 * w->rows;
            switch (M - m0 < 4 ? M - m0 : 4) {
            case 1: qgemv2_rows(p, &L, 1, w, n, bias, o, bits, sdt); break;
            case 2: qgemv2_rows(p, &L, 2, w, n, bias, o, bits, sdt); break;
            case 3: qgemv2_rows(p, &L, 3, w, n, bias, o, bits, sdt); break;
            default: qgemv2_rows(p, &L, 4, w, n, bias, o, bits, sdt); break;
            }
        }
}

int kn_qgemv_avx2(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1) {
    const uint8_t *p = prep;
#define QG2(B)                                                                                                         \
    do {                                                                                                               \
        if (w->sb_dtype == KN_DT_BF16) qgemv2_t(p, M, w, bias, out, n0, n1, B, KN_DT_BF16);                            \
        else if (w->sb_dtype == KN_DT_F16) qgemv2_t(p, M, w, bias, out, n0, n1, B, KN_DT_F16);                         \
        else qgemv2_t(p, M, w, bias, out, n0, n1, B, KN_DT_F32);                                                       \
    } while (0)
    if (w->bits == 8) QG2(8);
    else if (w->bits == 4) QG2(4);
    else return 0;
#undef QG2
    return 1;
}

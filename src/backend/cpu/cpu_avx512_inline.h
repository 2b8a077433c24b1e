/* cpu_avx512_inline.h — small AVX-512 helpers shared by the AVX-512 kernel
 * files (each compiled with the AVX-512 flags; include nowhere else). */
#ifndef KN_CPU_AVX512_INLINE_H
#define KN_CPU_AVX512_INLINE_H

#include <immintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* x as two int8 terms: t = v * inv, h = round(t), l = round((t - h) * 256)
 * clamped to [-127, 127], so v ~ (h + l / 256) / inv (16 lanes each). */
ALWAYS_INLINE void kn_quant_hl(__m512 v, __m512 inv, __m128i *h, __m128i *l) {
    const __m512 t = _mm512_mul_ps(v, inv);
    const __m512 hf = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 lf = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t, hf), _mm512_set1_ps(256.0f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    lf = _mm512_min_ps(_mm512_max_ps(lf, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    *h = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(hf));
    *l = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(lf));
}

/* exp(x) for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts),
 * e^r by its degree-6 Taylor polynomial (truncation < 1.3e-7 relative),
 * scaled by 2^n. Below -87.34 (and -inf) 0; NaN stays NaN. */
ALWAYS_INLINE __m512 kn_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 e = _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(p, n));
    return _mm512_mask_mov_ps(e, nan, x);
}

#endif

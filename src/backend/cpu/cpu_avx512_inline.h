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

#endif

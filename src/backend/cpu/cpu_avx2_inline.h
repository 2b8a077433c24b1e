/* cpu_avx2_inline.h — small AVX2 helpers shared by the AVX2 kernel files
 * (each compiled with the AVX2/FMA/F16C flags; include nowhere else). */
#ifndef KN_CPU_AVX2_INLINE_H
#define KN_CPU_AVX2_INLINE_H

#include <immintrin.h>
#include <stdint.h>

#include "backend/backend.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 8 elements of w from i on (f32, bf16 or f16) as f32, exactly */
ALWAYS_INLINE __m256 load8(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (dt == KN_DT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* the sum of the 8 lanes */
ALWAYS_INLINE float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

#endif

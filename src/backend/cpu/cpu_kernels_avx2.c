/* cpu_kernels_avx2.c — AVX2 + FMA + F16C inner loops (compiled with those
 * flags only for this file; chosen at runtime by kn_cpu_kernels_select).
 *
 * gemv: decode-shaped matmul, memory bound. Each weight row is streamed once
 *   (converted to f32 in registers, exactly: bf16/f16 -> f32 is lossless) and
 *   dotted with every x row; 4 weight rows in flight keep the loads deep.
 * gemm: prefill-shaped matmul, compute bound. GotoBLAS-style: a KC x 16
 *   panel of W is packed (converted to f32) into L1-resident scratch, then a
 *   6 x 16 register tile (12 accumulators) runs broadcast-FMA over KC.
 * Both accumulate in f32, in the order k = 0..K-1 within 8-lane partial sums. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE __m256 load8(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (dt == KN_DT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

ALWAYS_INLINE float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

ALWAYS_INLINE float wat(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return ((const float *)w)[i];
    if (dt == KN_DT_BF16) return kn_bf16_to_f32(((const uint16_t *)w)[i]);
    return kn_f16_to_f32(((const uint16_t *)w)[i]);
}

/* One x row against 4 weight rows. */
ALWAYS_INLINE void gemv_1x4(const float *x, const void *w, int64_t K, int64_t n, kn_dtype dt, float r[4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0, K8 = K & ~(int64_t)7;
    for (; k < K8; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xv, load8(w, (n + 0) * K + k, dt), a0);
        a1 = _mm256_fmadd_ps(xv, load8(w, (n + 1) * K + k, dt), a1);
        a2 = _mm256_fmadd_ps(xv, load8(w, (n + 2) * K + k, dt), a2);
        a3 = _mm256_fmadd_ps(xv, load8(w, (n + 3) * K + k, dt), a3);
    }
    r[0] = hsum(a0), r[1] = hsum(a1), r[2] = hsum(a2), r[3] = hsum(a3);
    for (; k < K; k++)
        for (int j = 0; j < 4; j++) r[j] += x[k] * wat(w, (n + j) * K + k, dt);
}

/* Two x rows against 4 weight rows (weights loaded once for both). */
ALWAYS_INLINE void gemv_2x4(const float *x0, const float *x1, const void *w, int64_t K, int64_t n, kn_dtype dt,
                            float r0[4], float r1[4]) {
    __m256 a[2][4];
    for (int j = 0; j < 4; j++) a[0][j] = a[1][j] = _mm256_setzero_ps();
    int64_t k = 0, K8 = K & ~(int64_t)7;
    for (; k < K8; k += 8) {
        __m256 xv0 = _mm256_loadu_ps(x0 + k), xv1 = _mm256_loadu_ps(x1 + k);
        for (int j = 0; j < 4; j++) {
            __m256 wv = load8(w, (n + j) * K + k, dt);
            a[0][j] = _mm256_fmadd_ps(xv0, wv, a[0][j]);
            a[1][j] = _mm256_fmadd_ps(xv1, wv, a[1][j]);
        }
    }
    for (int j = 0; j < 4; j++) r0[j] = hsum(a[0][j]), r1[j] = hsum(a[1][j]);
    for (; k < K; k++)
        for (int j = 0; j < 4; j++) {
            float wv = wat(w, (n + j) * K + k, dt);
            r0[j] += x0[k] * wv;
            r1[j] += x1[k] * wv;
        }
}

ALWAYS_INLINE float dot_row(const float *x, const void *w, int64_t K, int64_t n, kn_dtype dt) {
    __m256 a = _mm256_setzero_ps();
    int64_t k = 0, K8 = K & ~(int64_t)7;
    for (; k < K8; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(w, n * K + k, dt), a);
    float r = hsum(a);
    for (; k < K; k++) r += x[k] * wat(w, n * K + k, dt);
    return r;
}

ALWAYS_INLINE void gemv_t(const float *x, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                          int64_t n1, kn_dtype dt) {
    const int64_t K = wt->cols, N = wt->rows;
    const void *w = wt->data;
    int m = 0;
    for (; m + 1 < M; m += 2) {
        const float *x0 = x + (int64_t)m * K, *x1 = x0 + K;
        float *o0 = out + (int64_t)m * N, *o1 = o0 + N;
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) {
            float r0[4], r1[4];
            gemv_2x4(x0, x1, w, K, n, dt, r0, r1);
            for (int j = 0; j < 4; j++) {
                float b = bias ? bias[n + j] : 0.0f;
                o0[n + j] = r0[j] + b, o1[n + j] = r1[j] + b;
            }
        }
        for (; n < n1; n++) {
            float b = bias ? bias[n] : 0.0f;
            o0[n] = dot_row(x0, w, K, n, dt) + b;
            o1[n] = dot_row(x1, w, K, n, dt) + b;
        }
    }
    for (; m < M; m++) {
        const float *x0 = x + (int64_t)m * K;
        float *o0 = out + (int64_t)m * N;
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) {
            float r[4];
            gemv_1x4(x0, w, K, n, dt, r);
            for (int j = 0; j < 4; j++) o0[n + j] = r[j] + (bias ? bias[n + j] : 0.0f);
        }
        for (; n < n1; n++) o0[n] = dot_row(x0, w, K, n, dt) + (bias ? bias[n] : 0.0f);
    }
}

static void gemv_avx2(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                      int64_t n1) {
    switch (w->dtype) {
    case KN_DT_F32: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_F32); break;
    case KN_DT_BF16: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_BF16); break;
    default: gemv_t(x, M, w, bias, out, n0, n1, KN_DT_F16); break;
    }
}

/* ---- gemm ---------------------------------------------------------------- */

/* Pack rows [n, n+16) x cols [k0, k0+kc) of W into bp[k*16 + r] as f32; rows
 * past N are zero. */
ALWAYS_INLINE void pack_panel(const void *w, int64_t K, int64_t N, int64_t n, int64_t k0, int kc, kn_dtype dt,
                              float *bp) {
    for (int r = 0; r < 16; r++) {
        if (n + r >= N) {
            for (int k = 0; k < kc; k++) bp[k * 16 + r] = 0.0f;
            continue;
        }
        int64_t base = (n + r) * K + k0;
        int k = 0;
        for (; k + 8 <= kc; k += 8) {
            float tmp[8];
            _mm256_storeu_ps(tmp, load8(w, base + k, dt));
            for (int i = 0; i < 8; i++) bp[(k + i) * 16 + r] = tmp[i];
        }
        for (; k < kc; k++) bp[k * 16 + r] = wat(w, base + k, dt);
    }
}

/* c[mr x nc] (+)= a[mr x kc] * bp[kc x 16]; first: c = acc + bias, else c += acc. */
ALWAYS_INLINE void ukernel(const int mr, int kc, const float *a, int64_t lda, const float *bp, float *c, int64_t ldc,
                           int nc, int first, const float *bias) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * 16), b1 = _mm256_loadu_ps(bp + k * 16 + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            if (i < mr) {
                __m256 av = _mm256_broadcast_ss(a + i * lda + k);
                acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
            }
        }
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = bias0;
    float btmp[16] = {0};
    if (first && bias) {
        memcpy(btmp, bias, (size_t)nc * sizeof(float));
        bias0 = _mm256_loadu_ps(btmp), bias1 = _mm256_loadu_ps(btmp + 8);
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        if (i >= mr) break;
        float *ci = c + i * ldc;
        if (nc == 16) {
            if (first) {
                _mm256_storeu_ps(ci, _mm256_add_ps(acc[i][0], bias0));
                _mm256_storeu_ps(ci + 8, _mm256_add_ps(acc[i][1], bias1));
            } else {
                _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
                _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
            }
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc[i][0]);
            _mm256_storeu_ps(tmp + 8, acc[i][1]);
            for (int j = 0; j < nc; j++) ci[j] = first ? tmp[j] + btmp[j] : ci[j] + tmp[j];
        }
    }
}

ALWAYS_INLINE void gemm_t(const float *x, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                          int64_t n1, float *bp, kn_dtype dt) {
    const int64_t K = wt->cols, N = wt->rows;
    for (int64_t k0 = 0; k0 < K; k0 += KN_GEMM_KC) {
        int kc = (int)(K - k0 < KN_GEMM_KC ? K - k0 : KN_GEMM_KC);
        int first = k0 == 0;
        for (int64_t n = n0; n < n1; n += 16) {
            int nc = (int)(n1 - n < 16 ? n1 - n : 16);
            pack_panel(wt->data, K, n + nc, n, k0, kc, dt, bp);
            (void)N;
            int m = 0;
            const float *a = x + k0;
            for (; m + 6 <= M; m += 6)
                ukernel(6, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first,
                        bias ? bias + n : NULL);
            switch (M - m) {
            case 5: ukernel(5, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first, bias ? bias + n : NULL); break;
            case 4: ukernel(4, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first, bias ? bias + n : NULL); break;
            case 3: ukernel(3, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first, bias ? bias + n : NULL); break;
            case 2: ukernel(2, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first, bias ? bias + n : NULL); break;
            case 1: ukernel(1, kc, a + (int64_t)m * K, K, bp, out + (int64_t)m * N + n, N, nc, first, bias ? bias + n : NULL); break;
            default: break;
            }
        }
    }
}

static void gemm_avx2(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                      int64_t n1, float *scratch) {
    switch (w->dtype) {
    case KN_DT_F32: gemm_t(x, M, w, bias, out, n0, n1, scratch, KN_DT_F32); break;
    case KN_DT_BF16: gemm_t(x, M, w, bias, out, n0, n1, scratch, KN_DT_BF16); break;
    default: gemm_t(x, M, w, bias, out, n0, n1, scratch, KN_DT_F16); break;
    }
}

static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

const kn_cpu_kernels kn_cpu_kernels_avx2 = {
    .name = "avx2", .gemv = gemv_avx2, .gemm = gemm_avx2, .dot = dot_avx2, .axpy = axpy_avx2,
};

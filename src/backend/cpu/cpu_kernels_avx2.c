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

#include "backend/cpu/cpu_avx2_inline.h"
#include "backend/cpu/cpu_kernels.h"

ALWAYS_INLINE float wat(const void *w, int64_t i, kn_dtype dt) {
    if (dt == KN_DT_F32) return ((const float *)w)[i];
    if (dt == KN_DT_BF16) return kn_bf16_to_f32(((const uint16_t *)w)[i]);
    return kn_f16_to_f32(((const uint16_t *)w)[i]);
}

/* Software prefetch distance for weight streams, in bytes: measured on Zen 3
 * (2 threads): 1 KiB ahead lifts a bf16 GEMV from ~86% to ~93% of the read
 * bandwidth; much further ahead thrashes. */
#define GEMV_PREFETCH_BYTES 1024

ALWAYS_INLINE void prefetch_w(const void *w, int64_t i, kn_dtype dt) {
    const char *p = (const char *)w + i * (int64_t)(dt == KN_DT_F32 ? 4 : 2) + GEMV_PREFETCH_BYTES;
    _mm_prefetch(p, _MM_HINT_T0);
}

/* One x row against weight row n: a single sequential stream (interleaving
 * several weight rows defeats the hardware prefetcher: measured 9 vs 17 GB/s). */
ALWAYS_INLINE float dot_row(const float *x, const void *w, int64_t K, int64_t n, kn_dtype dt) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int64_t base = n * K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        prefetch_w(w, base + k, dt);
        if (dt == KN_DT_F32) prefetch_w(w, base + k + 16, dt);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(w, base + k, dt), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8(w, base + k + 8, dt), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), load8(w, base + k + 16, dt), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), load8(w, base + k + 24, dt), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(w, base + k, dt), a0);
    float r = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++) r += x[k] * wat(w, base + k, dt);
    return r;
}

/* Two x rows against weight row n (the row is loaded once for both). The
 * per-row accumulation order is the same as dot_row's, so a row's result does
 * not depend on which x rows share the call. */
ALWAYS_INLINE void dot_row2(const float *x0, const float *x1, const void *w, int64_t K, int64_t n, kn_dtype dt,
                            float *r0, float *r1) {
    __m256 a[2][4];
    for (int j = 0; j < 4; j++) a[0][j] = a[1][j] = _mm256_setzero_ps();
    const int64_t base = n * K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        prefetch_w(w, base + k, dt);
        if (dt == KN_DT_F32) prefetch_w(w, base + k + 16, dt);
        for (int j = 0; j < 4; j++) {
            __m256 wv = load8(w, base + k + 8 * j, dt);
            a[0][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + k + 8 * j), wv, a[0][j]);
            a[1][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + k + 8 * j), wv, a[1][j]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 wv = load8(w, base + k, dt);
        a[0][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + k), wv, a[0][0]);
        a[1][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + k), wv, a[1][0]);
    }
    float s0 = hsum(_mm256_add_ps(_mm256_add_ps(a[0][0], a[0][1]), _mm256_add_ps(a[0][2], a[0][3])));
    float s1 = hsum(_mm256_add_ps(_mm256_add_ps(a[1][0], a[1][1]), _mm256_add_ps(a[1][2], a[1][3])));
    for (; k < K; k++) {
        float wv = wat(w, base + k, dt);
        s0 += x0[k] * wv;
        s1 += x1[k] * wv;
    }
    *r0 = s0, *r1 = s1;
}

/* Four x rows against weight row n: each weight vector is loaded and
 * converted once for four rows (batched decode). Same per-row accumulation
 * order as dot_row, so results do not depend on the batch. 16 accumulators
 * exceed the 16 ymm registers by the weight and x temporaries; the few
 * spills stay in L1 and cost less than re-streaming the weight row. */
ALWAYS_INLINE void dot_row4(const float *x, int64_t ldx, const void *w, int64_t K, int64_t n, kn_dtype dt,
                            float *r) {
    __m256 a[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    const int64_t base = n * K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        prefetch_w(w, base + k, dt);
        if (dt == KN_DT_F32) prefetch_w(w, base + k + 16, dt);
        for (int j = 0; j < 4; j++) {
            __m256 wv = load8(w, base + k + 8 * j, dt);
            for (int i = 0; i < 4; i++)
                a[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + k + 8 * j), wv, a[i][j]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 wv = load8(w, base + k, dt);
        for (int i = 0; i < 4; i++) a[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + k), wv, a[i][0]);
    }
    for (int i = 0; i < 4; i++) r[i] = hsum(_mm256_add_ps(_mm256_add_ps(a[i][0], a[i][1]), _mm256_add_ps(a[i][2], a[i][3])));
    for (; k < K; k++) {
        float wv = wat(w, base + k, dt);
        for (int i = 0; i < 4; i++) r[i] += x[i * ldx + k] * wv;
    }
}

ALWAYS_INLINE void gemv_t(const float *x, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                          int64_t n1, kn_dtype dt) {
    const int64_t K = wt->cols, N = wt->rows;
    const void *w = wt->data;
    for (int64_t n = n0; n < n1; n++) {
        const float b = bias ? bias[n] : 0.0f;
        int m = 0;
        for (; m + 3 < M; m += 4) {
            float r[4];
            dot_row4(x + (int64_t)m * K, K, w, K, n, dt, r);
            for (int i = 0; i < 4; i++) out[(int64_t)(m + i) * N + n] = r[i] + b;
        }
        for (; m + 1 < M; m += 2) {
            float r0, r1;
            dot_row2(x + (int64_t)m * K, x + (int64_t)(m + 1) * K, w, K, n, dt, &r0, &r1);
            out[(int64_t)m * N + n] = r0 + b;
            out[(int64_t)(m + 1) * N + n] = r1 + b;
        }
        if (m < M) out[(int64_t)m * N + n] = dot_row(x + (int64_t)m * K, w, K, n, dt) + b;
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

/* Pack x into 6-row tiles per k-block (ap[k*6 + i], rows past M zero): the
 * microkernel then reads A contiguously instead of 6 rows at a stride of K
 * floats (which aliases in L1 when K*4 is a multiple of 4 KiB). Done once per
 * matmul, shared by all threads. */
static void pack_a_avx2(const float *x, int M, int64_t K, int m0, int m1, float *ap) {
    const int64_t Mp = (M + 5) / 6 * 6;
    for (int64_t k0 = 0; k0 < K; k0 += KN_GEMM_KC) {
        const int kc = (int)(K - k0 < KN_GEMM_KC ? K - k0 : KN_GEMM_KC);
        for (int m = m0; m < m1; m += 6) {
            float *dst = ap + k0 * Mp + (int64_t)m * kc;
            for (int i = 0; i < 6; i++) {
                if (m + i < M) {
                    const float *row = x + (int64_t)(m + i) * K + k0;
                    for (int k = 0; k < kc; k++) dst[k * 6 + i] = row[k];
                } else {
                    for (int k = 0; k < kc; k++) dst[k * 6 + i] = 0.0f;
                }
            }
        }
    }
}

/* c[mr x nc] (+)= ap[kc x 6] * bp[kc x 16]; first: c = acc + bias, else c += acc. */
ALWAYS_INLINE void ukernel(int mr, int kc, const float *ap, const float *bp, float *c, int64_t ldc, int nc, int first,
                           const float *bias) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp + k * 16), b1 = _mm256_load_ps(bp + k * 16 + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __m256 av = _mm256_broadcast_ss(ap + k * 6 + i);
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = bias0;
    float btmp[16] = {0};
    if (first && bias) {
        memcpy(btmp, bias, (size_t)nc * sizeof(float));
        bias0 = _mm256_loadu_ps(btmp), bias1 = _mm256_loadu_ps(btmp + 8);
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) { /* constant trip count keeps acc[][] in registers */
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

/* Loop nest: k-block -> pack this item's W panels (L2) -> panel (L1) ->
 * 6-row tile over the pre-packed A. */
ALWAYS_INLINE void gemm_t(const float *ap, int M, const kn_weight *wt, const float *bias, float *out, int64_t n0,
                          int64_t n1, float *bp_all, kn_dtype dt) {
    const int64_t K = wt->cols, N = wt->rows, Mp = (M + 5) / 6 * 6;
    const int n_panels = (int)((n1 - n0 + 15) / 16);
    for (int64_t k0 = 0; k0 < K; k0 += KN_GEMM_KC) {
        const int kc = (int)(K - k0 < KN_GEMM_KC ? K - k0 : KN_GEMM_KC);
        const int first = k0 == 0;
        const float *apk = ap + k0 * Mp;
        for (int p = 0; p < n_panels; p++) pack_panel(wt->data, K, n1, n0 + 16 * p, k0, kc, dt, bp_all + p * kc * 16);
        for (int p = 0; p < n_panels; p++) {
            const int64_t n = n0 + 16 * p;
            const int nc = (int)(n1 - n < 16 ? n1 - n : 16);
            for (int m = 0; m < M; m += 6)
                ukernel(M - m < 6 ? M - m : 6, kc, apk + (int64_t)m * kc, bp_all + p * kc * 16, out + (int64_t)m * N + n,
                        N, nc, first, bias ? bias + n : NULL);
        }
    }
}

static void gemm_avx2(const float *x, const float *ap, int M, const kn_weight *w, const float *bias, float *out,
                      int64_t n0, int64_t n1, float *scratch) {
    (void)x;
    switch (w->dtype) {
    case KN_DT_F32: gemm_t(ap, M, w, bias, out, n0, n1, scratch, KN_DT_F32); break;
    case KN_DT_BF16: gemm_t(ap, M, w, bias, out, n0, n1, scratch, KN_DT_BF16); break;
    default: gemm_t(ap, M, w, bias, out, n0, n1, scratch, KN_DT_F16); break;
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

static uint64_t read_sum_avx2(const void *p, size_t bytes) {
    const char *c = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= bytes; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(c + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(c + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(c + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(c + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}

const kn_cpu_kernels kn_cpu_kernels_avx2 = {
    .name = "avx2", .gemv = gemv_avx2, .gemm = gemm_avx2, .pack_a = pack_a_avx2, .dot = dot_avx2,
    .axpy = axpy_avx2, .read_sum = read_sum_avx2, .qgemv_prep = kn_qgemv_prep_avx2, .qgemv = kn_qgemv_avx2,
};

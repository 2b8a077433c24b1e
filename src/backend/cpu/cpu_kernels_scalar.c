/* cpu_kernels_scalar.c — portable C inner loops: the fallback on processors
 * without AVX2, and the simplest statement of what each kernel computes. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

static void gemv_scalar(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                        int64_t n1) {
    const int64_t K = w->cols, N = w->rows;
    for (int64_t n = n0; n < n1; n++) {
        for (int m = 0; m < M; m++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += x[(int64_t)m * K + k] * kn_weight_at(w, n * K + k);
            out[(int64_t)m * N + n] = acc + (bias ? bias[n] : 0.0f);
        }
    }
}

static void gemm_scalar(const float *x, const float *ap, int M, const kn_weight *w, const float *bias, float *out,
                        int64_t n0, int64_t n1, float *scratch) {
    (void)scratch, (void)ap;
    gemv_scalar(x, M, w, bias, out, n0, n1);
}

static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_scalar(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static uint64_t read_sum_scalar(const void *p, size_t bytes) {
    const uint64_t *u = p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= bytes / 8; i += 4) a0 += u[i], a1 += u[i + 1], a2 += u[i + 2], a3 += u[i + 3];
    return a0 ^ a1 ^ a2 ^ a3;
}

const kn_cpu_kernels kn_cpu_kernels_scalar = {
    .name = "scalar", .gemv = gemv_scalar, .gemm = gemm_scalar, .dot = dot_scalar, .axpy = axpy_scalar,
    .read_sum = read_sum_scalar,
};

/* KILN_CPU_KERNELS=scalar forces the portable kernels, =avx2 the AVX2 ones
 * on an AVX-512 processor (tests run each set the processor has). */
const kn_cpu_kernels *kn_cpu_kernels_select(void) {
    const char *force = getenv("KILN_CPU_KERNELS");
    if (force && !strcmp(force, "scalar")) return &kn_cpu_kernels_scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && !(force && !strcmp(force, "avx2")) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bf16"))
        return kn_cpu_kernels_avx512();
    if (avx2) return &kn_cpu_kernels_avx2;
#endif
    return &kn_cpu_kernels_scalar;
}

/* cpu_kernels.h — the inner loops of the CPU backend, selected at runtime
 * (AVX2+FMA+F16C where the processor has them, portable C otherwise).
 *
 * A kernel computes a slice of an op so the caller can split work across
 * threads: gemv/gemm compute output columns [n0, n1) of out = x W^T (+ bias). */
#ifndef KN_CPU_KERNELS_H
#define KN_CPU_KERNELS_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct {
    const char *name;
    /* out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for m < M, n0 <= n < n1.
     * M small (decode): streams each weight row once for all M rows. */
    void (*gemv)(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1);
    /* Same contract, cache-blocked and register-tiled for large M; scratch
     * holds KN_GEMM_SCRATCH floats (per thread). */
    void (*gemm)(const float *x, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1,
                 float *scratch);
    float (*dot)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
} kn_cpu_kernels;

#define KN_GEMM_KC 256
#define KN_GEMM_NC 64
#define KN_GEMM_SCRATCH (KN_GEMM_KC * KN_GEMM_NC)

extern const kn_cpu_kernels kn_cpu_kernels_scalar;
#if defined(__x86_64__)
extern const kn_cpu_kernels kn_cpu_kernels_avx2;
#endif

/* The best kernel set this processor supports. */
const kn_cpu_kernels *kn_cpu_kernels_select(void);

/* Weight element i of row-major w as float (any supported dtype). */
static inline float kn_weight_at(const kn_weight *w, int64_t i) { return kn_load_f32(w->data, w->dtype, i); }

#endif

/* cpu_quant.h — MLX affine-quantized weights on the CPU backend: loading
 * (kept packed), matmul reading the packed codes, and embedding lookup. */
#ifndef KN_CPU_QUANT_H
#define KN_CPU_QUANT_H

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_stream.h"
#include "base/host_mem.h"

kn_code kn_cpu_weight_load_quant(kn_backend *be, const kn_quant_host *src, kn_weight *out, kn_error *err);
/* out[M, N] = x[M, K] . W^T (+ bias) for a quantized w where
 * kn_cpu_qgemv_prepare declined (more than 16 rows, or no packed-code GEMV in
 * the kernel set); scratch: n_threads * KN_GEMM_SCRATCH floats; *prep
 * (*prep_floats long) is the backend's buffer for the kernel set's prepared
 * x, grown here on demand. */
void kn_cpu_qmatmul(kn_backend *be, const kn_cpu_kernels *k, float *scratch, float **prep, size_t *prep_floats,
                    const float *x, int M, const kn_weight *w, const float *bias, float *out);
/* The decode GEMV job of a quantized w (cpu_stream.h) for x [M, K], M <= 16:
 * x prepared into *prep for the kernel set's qgemv; bias, out and the
 * epilogue are the caller's to set. 0 (nothing set) when the kernel set has
 * no GEMV for w or no memory: kn_cpu_qmatmul still computes it. */
int kn_cpu_qgemv_prepare(const kn_cpu_kernels *k, float **prep, size_t *prep_floats, const float *x, int M,
                         const kn_weight *w, kn_gemv_job *job);
void kn_cpu_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out);

#endif

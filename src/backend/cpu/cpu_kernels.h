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
    /* Same contract, cache-blocked and register-tiled for large M. ap is x
     * packed by pack_a (NULL when pack_a is NULL); scratch holds
     * KN_GEMM_SCRATCH floats (per thread). */
    void (*gemm)(const float *x, const float *ap, int M, const kn_weight *w, const float *bias, float *out,
                 int64_t n0, int64_t n1, float *scratch);
    /* Pack x[M, K] for gemm, rows [m0, m1) of tiles (m0, m1 multiples of
     * KN_GEMM_MR), into ap of kn_gemm_packed_floats(M, K) floats. May be NULL. */
    void (*pack_a)(const float *x, int M, int64_t K, int m0, int m1, float *ap);
    float (*dot)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
    /* Read bytes (a multiple of 128, 32-aligned) as fast as possible; returns
     * a checksum so the reads cannot be elided. The bandwidth probe. */
    uint64_t (*read_sum)(const void *p, size_t bytes);
    /* Optional (NULL where the processor lacks bf16 dot products): large-M
     * matmul over bf16 weights with x rounded to bf16 (the backend then sets
     * matmul_x_rounding_min_rows). pack_a_bf16 packs x[M, K] (K even) into
     * 32-row tiles [t0, t1) of kn_gemm_bf16_packed_words(M, K) words;
     * gemm_bf16 computes output columns [n0, n1) from it. */
    void (*pack_a_bf16)(const float *x, int M, int64_t K, int t0, int t1, uint32_t *apk);
    void (*gemm_bf16)(const uint32_t *apk, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                      int64_t n1);
    /* Optional (present with gemm_bf16): small-M matmul over bf16 weights
     * with x already rounded to bf16 (xb[M, K], row-major): the gemv
     * contract otherwise; the backend then rounds x from one row on. */
    void (*gemv_bf16)(const uint16_t *xb, int M, const kn_weight *w, const float *bias, float *out, int64_t n0,
                      int64_t n1);
    /* Optional: MLX affine GEMV (small M) reading packed codes. qgemv_prep
     * writes x in the kernel's own form into prep (kn_qgemv_prep_floats(M, K,
     * K / gs) floats, 64-byte aligned) once per matmul; qgemv computes output
     * columns [n0, n1) from it and returns 0 when it does not handle w->bits
     * (callers fall back). */
    void (*qgemv_prep)(const float *x, int M, int64_t K, int bits, int gs, void *prep);
    int (*qgemv)(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1);
    /* Optional: MLX affine matmul for large M. qpack_a writes x in the
     * kernel's own form, tiles [t0, t1) of qgemm_tile_rows rows, into prep of
     * qgemm_prep_bytes(M, K, bits, gs) bytes (64-byte aligned); qgemm
     * computes output columns [n0, n1) from it with qgemm_scratch_bytes(K,
     * gs) bytes of per-thread scratch; returns 0 for weights it does not
     * handle (callers fall back). */
    int qgemm_tile_rows; /* rows of x per tile of qpack_a's */
    size_t (*qgemm_prep_bytes)(int M, int64_t K, int bits, int gs);
    size_t (*qgemm_scratch_bytes)(int64_t K, int gs);
    void (*qpack_a)(const float *x, int M, int64_t K, int bits, int gs, int t0, int t1, void *prep);
    int (*qgemm)(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1,
                 void *scratch);
    /* Optional (NULL: callers loop with libm). scale_max: s[j] *= scale,
     * returns the largest s[j] (NaN ignored, as `if (s > m) m = s`);
     * exp_shift_sum: s[j] = exp(s[j] - m), returns the f32 sum; silu_mul:
     * o[j] = g[j] / (1 + exp(-g[j])) * u[j]. exp within 2 ulp of expf, NaN
     * kept, -inf and underflow to 0. */
    float (*scale_max)(float *s, int n, float scale);
    float (*exp_shift_sum)(float *s, int n, float m);
    void (*silu_mul)(float *o, const float *g, const float *u, int n);
    /* Optional (NULL: callers decode rows and use dot/axpy): attention over
     * n bf16 rows of D elements (D % 16 == 0), row j at rows + j * stride
     * bytes, for ng query heads (q_g = q + g * D, acc_g = acc + g * D).
     * dot_rows_bf16: s[g * ld + j] = q_g . row_j;
     * axpy_rows_bf16: acc_g[d] += sum_j w[g * ld + j] * row_j[d]. */
    void (*dot_rows_bf16)(const float *q, int ng, int D, const uint8_t *rows, int64_t stride, int n, float *s,
                          int64_t ld);
    void (*axpy_rows_bf16)(float *acc, int ng, int D, const uint8_t *rows, int64_t stride, int n, const float *w,
                           int64_t ld);
    /* Optional (NULL: scalar loops), the decode GEMVs' x preparation on the
     * calling thread. round_bf16: out[i] = kn_f32_to_bf16(x[i]), the same
     * bits (round to nearest even, NaN quieted, subnormals rounded, not
     * flushed); sum_squares: the sum of x[i]^2 in double (each square exact;
     * the order of the additions is the kernel's). */
    void (*round_bf16)(const float *x, int64_t n, uint16_t *out);
    double (*sum_squares)(const float *x, int n);
} kn_cpu_kernels;

/* Room for qgemv_prep's output, per row of x: at most 3 bytes per element of
 * K padded to 128 (two int8 terms and per-lane block scales), a float per
 * group, 64 bytes of alignment. */
static inline size_t kn_qgemv_prep_floats(int M, int64_t K, int64_t G) {
    return (size_t)M * (size_t)(K + G + 160);
}

#define KN_GEMM_BF16_MR 32 /* rows of x per packed bf16 tile */
static inline size_t kn_gemm_bf16_packed_words(int M, int64_t K) {
    return (size_t)((M + KN_GEMM_BF16_MR - 1) / KN_GEMM_BF16_MR * KN_GEMM_BF16_MR) * (size_t)(K / 2);
}

#define KN_GEMM_KC 256 /* k-block: one packed W panel (KC x 16 f32 = 16 KiB) stays in L1 */
#define KN_GEMM_NC 64  /* output columns per work item (packed W in L2) */
#define KN_GEMM_MR 6   /* rows of the register tile */
#define KN_GEMM_SCRATCH (KN_GEMM_KC * KN_GEMM_NC)

/* Packed A: for each k-block, for each 6-row tile, [kc][6] floats. */
static inline size_t kn_gemm_packed_floats(int M, int64_t K) {
    return (size_t)((M + KN_GEMM_MR - 1) / KN_GEMM_MR * KN_GEMM_MR) * (size_t)K;
}

extern const kn_cpu_kernels kn_cpu_kernels_scalar;
#if defined(__x86_64__)
extern const kn_cpu_kernels kn_cpu_kernels_avx2;
/* cpu_qgemv_avx2.c: the AVX2 set's qgemv_prep / qgemv (4/8-bit, vpmaddubsw) */
void kn_qgemv_prep_avx2(const float *x, int M, int64_t K, int bits, int gs, void *prep);
int kn_qgemv_avx2(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1);
/* the AVX2 set with AVX-512 (F/BW/VL/BF16) kernels in place of some */
const kn_cpu_kernels *kn_cpu_kernels_avx512(void);
/* cpu_qgemm_vnni.c: the AVX-512 VNNI prefill matmul over 4/8-bit codes */
extern const int kn_qgemm_vnni_tile_rows;
size_t kn_qgemm_vnni_prep_bytes(int M, int64_t K, int bits, int gs);
size_t kn_qgemm_vnni_scratch_bytes(int64_t K, int gs);
void kn_qpack_vnni(const float *x, int M, int64_t K, int bits, int gs, int t0, int t1, void *prep);
int kn_qgemm_vnni(const void *prep, int M, const kn_weight *w, const float *bias, float *out, int64_t n0, int64_t n1,
                  void *scratch);
#endif

/* The best kernel set this processor supports. */
const kn_cpu_kernels *kn_cpu_kernels_select(void);

/* Weight element i of row-major w as float (any supported dtype). */
static inline float kn_weight_at(const kn_weight *w, int64_t i) { return kn_load_f32(w->data, w->dtype, i); }

#endif

/* cpu_quant.c — MLX affine-quantized weights on the CPU (see cpu_quant.h).
 *
 * The weight stays packed in one allocation: codes, then scales and biases in
 * the checkpoint's dtype (bf16/f16 as MLX writes them: 4 bytes a group
 * instead of 8 when widened; f32 kept as is). The portable kernels
 * dequantize one group (decode) or one KC x NC tile (prefill) at a time into
 * a small float buffer with exactly quant.h's arithmetic (scale * q + bias in
 * float32) and take the dot products with the kernel set's dot, so results
 * match a float32 matmul over the dequantized matrix up to summation order.
 * The AVX-512 VNNI and AVX2 decode GEMVs instead dot the codes with x as two
 * int8 terms per element, x ~ xscale * (h + l / 256) per 32-element block
 * (|error| <= max|x over the block| / 32512 per element; see
 * cpu_kernels_avx512.c, cpu_qgemv_avx2.c), as does the VNNI prefill GEMM
 * (cpu_qgemm_vnni.c); without that GEMM the AVX2 GEMV runs over slabs of
 * x (qgemv_slabs). */
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/cpu_stream.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"

kn_code kn_cpu_weight_load_quant(kn_backend *be, const kn_quant_host *s, kn_weight *out, kn_error *err) {
    (void)be;
    const int64_t words = kn_quant_row_words(s->cols, s->bits), groups = s->cols / s->group_size;
    const size_t esz = kn_dtype_size(s->sb_dtype);
    const size_t qbytes = (size_t)s->rows * (size_t)words * 4, sbytes = (size_t)s->rows * (size_t)groups * esz;
    const size_t qpad = (qbytes + 63) & ~(size_t)63, spad = (sbytes + 63) & ~(size_t)63;
    void *p = kn_host_alloc(qpad + 2 * spad);
    if (!p)
        return kn_fail(err, KN_ERR_NOMEM, "cpu backend: out of memory for a %zu-byte quantized weight", qpad + 2 * spad);
    memcpy(p, s->q, qbytes);
    char *sc = (char *)p + qpad, *bi = (char *)p + qpad + spad;
    memcpy(sc, s->scales, sbytes);
    memcpy(bi, s->biases, sbytes);
    *out = (kn_weight){.dtype = KN_DT_U32, .rows = s->rows, .cols = s->cols, .data = p, .owned = 1, .bits = s->bits,
                       .group_size = s->group_size, .scales = sc, .biases = bi, .sb_dtype = s->sb_dtype};
    return KN_OK;
}

/* scale or bias i of w (p: w->scales or w->biases) as float */
static inline float sb_at(const kn_weight *w, const void *p, int64_t i) { return kn_load_f32(p, w->sb_dtype, i); }

/* out[i] = scale * q_i + bias for the n codes starting at code c0 (a multiple
 * of the group size) of packed row `row`; n a multiple of 32/bits. */
static void dequant_span(const uint32_t *row, int64_t c0, int n, int bits, float scale, float bias, float *out) {
    const uint32_t *w = row + c0 * bits / 32;
    if (bits == 4) {
        for (int j = 0; j < n / 8; j++) {
            uint32_t v = w[j];
            for (int i = 0; i < 8; i++) out[8 * j + i] = scale * (float)((v >> (4 * i)) & 15u) + bias;
        }
    } else if (bits == 8) {
        for (int j = 0; j < n / 4; j++) {
            uint32_t v = w[j];
            for (int i = 0; i < 4; i++) out[4 * j + i] = scale * (float)((v >> (8 * i)) & 255u) + bias;
        }
    } else { /* 2 */
        for (int j = 0; j < n / 16; j++) {
            uint32_t v = w[j];
            for (int i = 0; i < 16; i++) out[16 * j + i] = scale * (float)((v >> (2 * i)) & 3u) + bias;
        }
    }
}

/* rows [n0, n1) of out for M small: each weight row streamed once */
static void qgemv(const kn_cpu_kernels *k, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                  int64_t n0, int64_t n1) {
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size, words = kn_quant_row_words(K, w->bits);
    const int gs = w->group_size;
    float buf[128];
    for (int64_t n = n0; n < n1; n++) {
        const uint32_t *row = (const uint32_t *)w->data + n * words;
        float acc[4] = {0, 0, 0, 0};
        for (int64_t g = 0; g < G; g++) {
            dequant_span(row, g * gs, gs, w->bits, sb_at(w, w->scales, n * G + g), sb_at(w, w->biases, n * G + g), buf);
            for (int m = 0; m < M; m++) acc[m] += k->dot(x + (int64_t)m * K + g * gs, buf, gs);
        }
        for (int m = 0; m < M; m++) out[(int64_t)m * N + n] = acc[m] + (bias ? bias[n] : 0.0f);
    }
}

/* rows [n0, n1) (at most KN_GEMM_NC) for large M: dequantize a KC x (n1-n0)
 * tile into scratch, then every x row takes its dots against it */
static void qgemm(const kn_cpu_kernels *k, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                  int64_t n0, int64_t n1, float *tile) {
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size, words = kn_quant_row_words(K, w->bits);
    const int gs = w->group_size;
    for (int m = 0; m < M; m++)
        for (int64_t n = n0; n < n1; n++) out[(int64_t)m * N + n] = bias ? bias[n] : 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += KN_GEMM_KC) {
        const int kc = (int)(K - k0 < KN_GEMM_KC ? K - k0 : KN_GEMM_KC); /* multiple of gs: KC and K are */
        for (int64_t n = n0; n < n1; n++) {
            const uint32_t *row = (const uint32_t *)w->data + n * words;
            for (int c = 0; c < kc; c += gs) {
                int64_t g = (k0 + c) / gs;
                dequant_span(row, k0 + c, gs, w->bits, sb_at(w, w->scales, n * G + g), sb_at(w, w->biases, n * G + g),
                             tile + (n - n0) * KN_GEMM_KC + c);
            }
        }
        for (int m = 0; m < M; m++) {
            const float *xm = x + (int64_t)m * K + k0;
            float *om = out + (int64_t)m * N;
            for (int64_t n = n0; n < n1; n++) om[n] += k->dot(xm, tile + (n - n0) * KN_GEMM_KC, kc);
        }
    }
}

/* the backend's prepared-x buffer, at least need floats (64-byte aligned);
 * NULL when out of memory (the old buffer stays) */
static void *grow_prep(float **prep, size_t *prep_floats, size_t need) {
    if (need > *prep_floats) {
        void *p = NULL;
        if (posix_memalign(&p, 64, need * sizeof(float)) != 0) return NULL;
        free(*prep);
        *prep = p, *prep_floats = need;
    }
    return *prep;
}

/* The kernel set's packed-code GEMV (VNNI or AVX2); 0 when it does not apply.
 * Its job runs one stream per thread (cpu_stream.h). Measured on the 2-core
 * Zen 5, 0.44B 4-bit decode: one contiguous run of rows per thread ~125
 * tok/s, 128-row chunks handed out in turn ~110, 16-row ones ~100; the
 * ranges with stealing 162-171 against 146-155 for one run per thread, in
 * alternating runs (8-bit: 114-122 against 102-104) */
int kn_cpu_qgemv_prepare(const kn_cpu_kernels *k, float **prep, size_t *prep_floats, const float *x, int M,
                         const kn_weight *w, kn_gemv_job *job) {
    const int64_t K = w->cols, G = K / w->group_size;
    if (!k->qgemv || M > 16 || (w->bits != 4 && w->bits != 8) || K % 32 != 0) return 0;
    const size_t need = kn_qgemv_prep_floats(M, K, G);
    void *xp = grow_prep(prep, prep_floats, need);
    if (!xp) return 0;
    k->qgemv_prep(x, M, K, w->bits, w->group_size, xp);
    *job = (kn_gemv_job){.k = k, .prep = xp, .M = M, .w = w};
    return 1;
}

/* The kernel set's large-M quantized GEMM (AVX-512); 0 when it does not
 * apply (or no memory: the caller's path is still correct). */
static int qgemm_fast(kn_backend *be, const kn_cpu_kernels *k, float **prep, size_t *prep_floats, const float *x,
                      int M, const kn_weight *w, const float *bias, float *out) {
    const int64_t K = w->cols, N = w->rows;
    if (!k->qgemm || (w->bits != 4 && w->bits != 8) || K % 32 != 0) return 0;
    const int tiles = (M + k->qgemm_tile_rows - 1) / k->qgemm_tile_rows, nt = be->n_threads, gs = w->group_size;
    const size_t need = (k->qgemm_prep_bytes(M, K, w->bits, gs) + sizeof(float) - 1) / sizeof(float);
    void *xp = grow_prep(prep, prep_floats, need);
    if (!xp) return 0;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), per = (tiles + nt - 1) / nt;
        int t0 = t * per, t1 = t0 + per < tiles ? t0 + per : tiles;
        if (t0 < t1) k->qpack_a(x, M, K, w->bits, gs, t0, t1, xp);
    }
    const int64_t nb = 48, nblocks = (N + nb - 1) / nb;
    const size_t scratch_bytes = (k->qgemm_scratch_bytes(K, gs) + 63) & ~(size_t)63;
    int ok = 1;
#pragma omp parallel num_threads(nt)
    {
        void *wb = NULL;
        if (posix_memalign(&wb, 64, scratch_bytes) != 0) wb = NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t n0 = b * nb, n1 = n0 + nb < N ? n0 + nb : N;
            if (!wb || !k->qgemm(xp, M, w, bias, out, n0, n1, wb)) {
#pragma omp atomic write
                ok = 0;
            }
        }
        free(wb);
    }
    return ok;
}

/* Large M without the kernel set's GEMM (the AVX2 set): its decode GEMV over
 * slabs of QSLAB_ROWS rows of x, each weight row streamed once per slab and
 * reused from L1 for the slab's rows, 4 at a time. Measured on the 2-core
 * Zen 5 with KILN_CPU_KERNELS=avx2 (0.44B 4-bit, 128-token prefill): see
 * docs/PERF.md (twenty-fifth session). 0 when it does not apply. */
#define QSLAB_ROWS 64
static int qgemv_slabs(kn_backend *be, const kn_cpu_kernels *k, float **prep, size_t *prep_floats, const float *x,
                       int M, const kn_weight *w, const float *bias, float *out) {
    const int64_t K = w->cols, N = w->rows, G = K / w->group_size;
    if (k->qgemm || !k->qgemv || (w->bits != 4 && w->bits != 8) || K % 32 != 0) return 0;
    const int slab = M < QSLAB_ROWS ? M : QSLAB_ROWS;
    const size_t need = kn_qgemv_prep_floats(slab, K, G);
    void *xp = grow_prep(prep, prep_floats, need);
    if (!xp) return 0;
    const int64_t chunk = 16, n_chunks = (N + chunk - 1) / chunk;
    for (int m0 = 0; m0 < M; m0 += slab) {
        const int mm = M - m0 < slab ? M - m0 : slab;
        k->qgemv_prep(x + (int64_t)m0 * K, mm, K, w->bits, w->group_size, xp);
        float *o = out + (int64_t)m0 * N;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
        for (int64_t ch = 0; ch < n_chunks; ch++) {
            const int64_t n0 = ch * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
            k->qgemv(xp, mm, w, bias, o, n0, n1);
        }
    }
    return 1;
}

void kn_cpu_qmatmul(kn_backend *be, const kn_cpu_kernels *k, float *scratch, float **prep, size_t *prep_floats,
                    const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    const int64_t N = w->rows;
    const int nt = be->n_threads;
    if (M > 16 && (qgemm_fast(be, k, prep, prep_floats, x, M, w, bias, out) ||
                   qgemv_slabs(be, k, prep, prep_floats, x, M, w, bias, out)))
        return;
    if (M <= 4) {
        const int64_t chunk = 64, n_chunks = (N + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t ch = 0; ch < n_chunks; ch++) {
            int64_t n0 = ch * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
            qgemv(k, x, M, w, bias, out, n0, n1);
        }
        return;
    }
    const int64_t nblocks = (N + KN_GEMM_NC - 1) / KN_GEMM_NC;
#pragma omp parallel num_threads(nt)
    {
        float *tile = scratch + (size_t)omp_get_thread_num() * KN_GEMM_SCRATCH;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t n0 = b * KN_GEMM_NC, n1 = n0 + KN_GEMM_NC < N ? n0 + KN_GEMM_NC : N;
            qgemm(k, x, M, w, bias, out, n0, n1, tile);
        }
    }
}

void kn_cpu_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    const int64_t d = t->cols, G = d / t->group_size, words = kn_quant_row_words(d, t->bits);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n > 1)
    for (int i = 0; i < n; i++) {
        int64_t row = ids[i];
        float *o = out + (int64_t)i * d;
        if (row < 0 || row >= t->rows) {
            memset(o, 0, (size_t)d * sizeof(float));
            continue;
        }
        for (int64_t g = 0; g < G; g++)
            dequant_span((const uint32_t *)t->data + row * words, g * t->group_size, t->group_size, t->bits,
                         sb_at(t, t->scales, row * G + g), sb_at(t, t->biases, row * G + g), o + g * t->group_size);
    }
}

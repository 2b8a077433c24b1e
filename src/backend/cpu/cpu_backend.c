/* cpu_backend.c — the CPU implementation of the op interface (backend.h).
 *
 * Memory is host memory (64-byte aligned). Work is split across the
 * backend's threads with OpenMP; each op is a parallel loop over independent
 * rows / output columns, so results do not depend on the thread count except
 * where noted (none today). Weights may be borrowed from a read-only mapping
 * (zero copy) when their dtype is one the kernels read directly. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/host_mem.h"
#include "backend/op_profile.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/cpu_ops_whisper.h"
#include "backend/cpu/cpu_ops_models.h"
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/cpu_stream.h"

typedef struct {
    kn_backend base;
    const kn_cpu_kernels *k;
    float *gemm_scratch; /* n_threads * KN_GEMM_SCRATCH */
    float *attn_scratch; /* n_threads * attn_scratch_len */
    float *apack;        /* packed matmul input, grown on demand */
    size_t apack_floats;
    float *qprep; /* quantized GEMV: x reordered + group sums, grown on demand */
    size_t qprep_floats;
    float *xround; /* GEMV input rounded to the weight dtype (bf16 words or f32), grown on demand */
    size_t xround_floats;
    float *xnorm; /* fused_matmul: the normalized rows, grown on demand */
    size_t xnorm_floats;
    float *gu; /* fused_matmul's SwiGLU: the gate/up rows, grown on demand */
    size_t gu_floats;
    int64_t attn_scratch_len;
    kn_cpu_pool *pool; /* the decode sections' threads (NULL: OpenMP's) */
    /* cpu_rope's angles of the last position it rotated (rope_half 0: none yet) */
    int rope_pos, rope_half;
    float rope_scale, rope_freq[512], rope_cs[512], rope_sn[512];
} cpu_backend;

static cpu_backend *cpu(kn_backend *be) { return (cpu_backend *)be; }

/* The threads for a section over `rows` rows: the pool for batch-1 decode
 * (and the read probe), OpenMP's (NULL) for everything else (cpu_pool.h). */
static kn_cpu_pool *decode_pool(kn_backend *be, int rows) { return rows == 1 ? cpu(be)->pool : NULL; }

static void *cpu_alloc(kn_backend *be, size_t bytes) {
    (void)be;
    return kn_host_alloc(bytes);
}

static void cpu_free(kn_backend *be, void *p) { (void)be; kn_host_free(p); }

static void cpu_copy(kn_backend *be, void *dst, const void *src, size_t n) { (void)be; memcpy(dst, src, n); }

static void cpu_sync(kn_backend *be) { (void)be; }

static void cpu_destroy(kn_backend *be) {
    cpu_backend *c = cpu(be);
    kn_host_free(c->gemm_scratch);
    kn_host_free(c->attn_scratch);
    kn_host_free(c->apack);
    free(c->qprep);
    kn_host_free(c->xround);
    kn_host_free(c->xnorm);
    kn_host_free(c->gu);
    kn_cpu_pool_destroy(c->pool);
    free(c);
}

/* Whether a weight of this many bytes in a file mapping (4 KiB pages) is
 * copied into huge pages (kn_host_alloc) instead of read in place: from 2 MiB
 * on, while the system keeps a reserve of max(1 GiB, 1/16 of its memory)
 * available after the copy (the mapping's pages are clean page cache, which
 * the kernel reclaims as the copies grow; a model larger than that stays
 * mapped from there on). KILN_CPU_COPY_WEIGHTS=0 keeps every mapped weight in
 * place (the smallest resident set). */
static int copy_mapped_weight(size_t bytes) {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("KILN_CPU_COPY_WEIGHTS");
        env = !(e && !strcmp(e, "0"));
    }
    if (!env || bytes < KN_HOST_HUGE_MIN) return 0;
    const int64_t avail = kn_host_mem_available();
    if (avail < 0) return 0;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const int64_t total = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    const int64_t reserve = total / 16 > ((int64_t)1 << 30) ? total / 16 : (int64_t)1 << 30;
    return avail - (int64_t)bytes >= reserve;
}

static kn_code cpu_weight_load(kn_backend *be, kn_dtype dt, int64_t rows, int64_t cols, const void *host,
                               int may_borrow, kn_weight *out, kn_error *err) {
    if (dt != KN_DT_F32 && dt != KN_DT_BF16 && dt != KN_DT_F16)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "cpu backend: weights of dtype %s are not supported", kn_dtype_name(dt));
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    out->bits = out->group_size = 0;
    out->scales = out->biases = NULL;
    /* borrow in place only when aligned (kernels assume element alignment;
     * a header whose length is not a multiple of 8 misaligns every tensor),
     * and a file mapping's bytes only where no huge-page copy is made */
    if (may_borrow && ((uintptr_t)host & 63) == 0 &&
        (may_borrow == KN_BORROW_RESIDENT || !copy_mapped_weight(kn_dtype_size(dt) * (size_t)rows * (size_t)cols))) {
        out->data = host;
        out->owned = 0;
        return KN_OK;
    }
    size_t bytes = (size_t)rows * (size_t)cols * kn_dtype_size(dt);
    void *p = cpu_alloc(be, bytes);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "cpu backend: out of memory for a %zu-byte weight", bytes);
    memcpy(p, host, bytes);
    out->data = p;
    out->owned = 1;
    return KN_OK;
}

/* ---- ops ----------------------------------------------------------------- */

static void cpu_embed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    const int64_t d = t->cols;
    if (t->bits) {
        kn_cpu_qembed(be, t, ids, n, out);
        return;
    }
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n > 1)
    for (int i = 0; i < n; i++) {
        int64_t row = ids[i];
        float *o = out + (int64_t)i * d;
        if (row < 0 || row >= t->rows) { /* caller validates ids; stay memory-safe regardless */
            memset(o, 0, (size_t)d * sizeof(float));
            continue;
        }
        for (int64_t j = 0; j < d; j++) o[j] = kn_weight_at(t, row * d + j);
    }
}

/* One RMSNorm group: oi = w * xi / sqrt(mean(xi^2) + eps), the sum of
 * squares in double (k->sum_squares, else over four interleaved chains, not
 * one serial chain). */
static void rms_norm_row(const kn_cpu_kernels *k, const float *xi, float *oi, int dim, const float *w, float eps) {
    double s = 0.0;
    if (k->sum_squares) s = k->sum_squares(xi, dim);
    else {
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        int j = 0;
        for (; j + 4 <= dim; j += 4) {
            s0 += (double)xi[j] * xi[j], s1 += (double)xi[j + 1] * xi[j + 1];
            s2 += (double)xi[j + 2] * xi[j + 2], s3 += (double)xi[j + 3] * xi[j + 3];
        }
        for (; j < dim; j++) s0 += (double)xi[j] * xi[j];
        s = (s0 + s1) + (s2 + s3);
    }
    const float inv = 1.0f / sqrtf((float)(s / dim) + eps);
    for (int j = 0; j < dim; j++) oi[j] = w[j] * (xi[j] * inv);
}

/* Decode-sized ops run on the calling thread: an OpenMP region costs
 * microseconds even when its if() clause keeps it to one thread. */
#define CPU_SMALL_OP 8192 /* elements */

static void cpu_rms_norm(kn_backend *be, const float *x, int64_t x_stride, float *out, int64_t out_stride, int rows,
                         int groups, int dim, const float *w, float eps) {
    const int n = rows * groups;
    if ((int64_t)n * dim <= CPU_SMALL_OP) {
        for (int i = 0; i < n; i++)
            rms_norm_row(cpu(be)->k, x + (i / groups) * x_stride + (int64_t)(i % groups) * dim,
                         out + (i / groups) * out_stride + (int64_t)(i % groups) * dim, dim, w, eps);
        return;
    }
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int i = 0; i < n; i++)
        rms_norm_row(cpu(be)->k, x + (i / groups) * x_stride + (int64_t)(i % groups) * dim,
                     out + (i / groups) * out_stride + (int64_t)(i % groups) * dim, dim, w, eps);
}

static int cpu_matmul_bf16(cpu_backend *c, const float *x, int M, const kn_weight *w, const float *bias, float *out);
static void cpu_matmul_f32(cpu_backend *c, const float *x, int M, const kn_weight *w, const float *bias, float *out);

/* Up to 16 rows (a continuous-batching decode step) go through the GEMV
 * kernels: each weight row is streamed once for all x rows, and a row's
 * result does not depend on how many rows share the call or which thread
 * computes it, so a batched decode gives bit-identical logits to a solo one.
 * Measured on the 2-core dev machine, 0.44B bf16 synthetic, 8 sequences:
 * ~100 tok/s through GEMV vs ~5.5 tok/s through the packed GEMM. Rows are
 * split over the threads by kn_cpu_gemv_stream (one stream per thread; even
 * row counts, i.e. row pairs for several x rows). */
#define CPU_GEMV_MAX_M 16

/* c->xround with room for n floats (grown on demand), NULL without memory */
static void *grow_xround(cpu_backend *c, size_t n) {
    if (n > c->xround_floats) {
        float *p = cpu_alloc(&c->base, n * sizeof(float));
        if (!p) return NULL;
        kn_host_free(c->xround);
        c->xround = p, c->xround_floats = n;
    }
    return c->xround;
}

/* 1 when x meets 16-bit weights rounded to their dtype at M rows (the
 * backend's promise, matmul_x_rounding_min_rows) */
static int rounds_x(const cpu_backend *c, int M, const kn_weight *w) {
    return c->base.matmul_x_rounding_min_rows && w->dtype != KN_DT_F32 && M >= c->base.matmul_x_rounding_min_rows;
}

/* x rounded to w's 16-bit dtype in c->xround (f32 values), or x itself
 * without room for that: the matmul is still correct (and more exact) */
static const float *round_x_f32(cpu_backend *c, const float *x, int M, const kn_weight *w) {
    float *xr = grow_xround(c, (size_t)M * (size_t)w->cols);
    if (!xr) return x;
    for (size_t i = 0; i < (size_t)M * (size_t)w->cols; i++)
        xr[i] = w->dtype == KN_DT_BF16 ? kn_bf16_to_f32(kn_f32_to_bf16(x[i])) : kn_f16_to_f32(kn_f32_to_f16(x[i]));
    return xr;
}

/* The decode GEMV job for x [M, K], M <= CPU_GEMV_MAX_M (cpu_stream.h): x in
 * the form w's kernel reads (rounded to bf16, prepared for the quantized
 * kernel, or as it is); bias, out and the epilogue are the caller's to set.
 * 0 when w has no GEMV here (the general matmul paths remain). */
static int gemv_prepare(cpu_backend *c, const float *x, int M, const kn_weight *w, kn_gemv_job *job) {
    if (M < 1 || M > CPU_GEMV_MAX_M) return 0;
    if (w->bits) return kn_cpu_qgemv_prepare(c->k, &c->qprep, &c->qprep_floats, x, M, w, job);
    *job = (kn_gemv_job){.k = c->k, .M = M, .w = w};
    if (rounds_x(c, M, w)) {
        uint16_t *xb = w->dtype == KN_DT_BF16 && c->k->gemv_bf16 ? grow_xround(c, (size_t)M * (size_t)w->cols) : NULL;
        if (xb) {
            if (c->k->round_bf16) c->k->round_bf16(x, (int64_t)M * w->cols, xb);
            else
                for (size_t i = 0; i < (size_t)M * (size_t)w->cols; i++) xb[i] = kn_f32_to_bf16(x[i]);
            job->xb = xb;
            return 1;
        }
        x = round_x_f32(c, x, M, w);
    }
    job->x = x;
    return 1;
}

static void cpu_matmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    cpu_backend *c = cpu(be);
    if (M < 1) return;
    kn_gemv_job job;
    if (gemv_prepare(c, x, M, w, &job)) {
        job.bias = bias, job.out = out;
        kn_cpu_gemv_stream(decode_pool(be, M), be->n_threads, &job);
        return;
    }
    if (w->bits) {
        kn_cpu_qmatmul(be, c->k, c->gemm_scratch, &c->qprep, &c->qprep_floats, x, M, w, bias, out);
        return;
    }
    if (c->k->gemm_bf16 && w->dtype == KN_DT_BF16 && w->cols % 2 == 0 && cpu_matmul_bf16(c, x, M, w, bias, out))
        return;
    if (rounds_x(c, M, w)) x = round_x_f32(c, x, M, w); /* in place of the bf16 kernels (f16 weights; no memory) */
    cpu_matmul_f32(c, x, M, w, bias, out);
}

/* out += x . W^T + bias for decode shapes: the residual add in the GEMV's
 * stream (cpu_stream.h); larger M declines (0: matmul, then add) */
static int cpu_matmul_add(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    kn_gemv_job job;
    if (M < 1) return 1;
    if (!gemv_prepare(cpu(be), x, M, w, &job)) return 0;
    job.bias = bias, job.out = out, job.accumulate = 1;
    kn_cpu_gemv_stream(decode_pool(be, M), be->n_threads, &job);
    return 1;
}

/* Decode shapes: the RMSNorm on the calling thread (rows of 4096 take ~1 us:
 * a parallel region would cost more), then the GEMV with the SwiGLU in its
 * stream, each thread activating the gate/up rows it just computed. Larger
 * M declines (0: the separate ops). */
static int cpu_fused_matmul(kn_backend *be, const float *x, int M, const float *norm_w, float eps,
                            const kn_weight *w, const float *bias, float *out, int epilogue) {
    cpu_backend *c = cpu(be);
    const int64_t K = w->cols, N = w->rows;
    if (M < 1 || M > CPU_GEMV_MAX_M || (epilogue == KN_EPI_SWIGLU && N % 2)) return 0;
    if (epilogue != KN_EPI_NONE && epilogue != KN_EPI_SWIGLU) return 0;
    if (norm_w) {
        if ((size_t)M * (size_t)K > c->xnorm_floats) {
            float *p = cpu_alloc(be, (size_t)M * (size_t)K * sizeof(float));
            if (!p) return 0;
            kn_host_free(c->xnorm);
            c->xnorm = p, c->xnorm_floats = (size_t)M * (size_t)K;
        }
        for (int m = 0; m < M; m++) rms_norm_row(c->k, x + m * K, c->xnorm + m * K, (int)K, norm_w, eps);
        x = c->xnorm;
    }
    if (epilogue == KN_EPI_SWIGLU && (size_t)M * (size_t)N > c->gu_floats) {
        float *p = cpu_alloc(be, (size_t)M * (size_t)N * sizeof(float));
        if (!p) return 0;
        kn_host_free(c->gu);
        c->gu = p, c->gu_floats = (size_t)M * (size_t)N;
    }
    kn_gemv_job job;
    if (!gemv_prepare(c, x, M, w, &job)) return 0;
    job.bias = bias, job.out = out;
    if (epilogue == KN_EPI_SWIGLU) job.gu = c->gu;
    kn_cpu_gemv_stream(decode_pool(be, M), be->n_threads, &job);
    return 1;
}

/* x . W^T through the bf16 dot-product GEMM; 0 when no memory for packing
 * (the caller then takes the f32 path). */
static int cpu_matmul_bf16(cpu_backend *c, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    const int64_t K = w->cols, N = w->rows;
    const int nt = c->base.n_threads;
    size_t need = kn_gemm_bf16_packed_words(M, K); /* 4-byte words, as floats */
    if (need > c->apack_floats) {
        float *p = cpu_alloc(&c->base, need * sizeof(float));
        if (!p) return 0;
        kn_host_free(c->apack);
        c->apack = p, c->apack_floats = need;
    }
    uint32_t *apk = (uint32_t *)c->apack;
    const int tiles = (M + KN_GEMM_BF16_MR - 1) / KN_GEMM_BF16_MR;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), per = (tiles + nt - 1) / nt;
        int t0 = t * per, t1 = t0 + per < tiles ? t0 + per : tiles;
        if (t0 < t1) c->k->pack_a_bf16(x, M, K, t0, t1, apk);
    }
    /* 48 rows (four 12-row register tiles) per work item */
    const int64_t nb = 48, nblocks = (N + nb - 1) / nb;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t n0 = b * nb, n1 = n0 + nb < N ? n0 + nb : N;
        c->k->gemm_bf16(apk, M, w, bias, out, n0, n1);
    }
    return 1;
}

static void cpu_matmul_f32(cpu_backend *c, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    kn_backend *be = &c->base;
    const int64_t N = w->rows;
    const int nt = be->n_threads;
    const float *ap = NULL;
    if (c->k->pack_a) {
        size_t need = kn_gemm_packed_floats(M, w->cols);
        if (need > c->apack_floats) {
            float *p = cpu_alloc(be, need * sizeof(float));
            if (!p) { /* no memory for packing: the unblocked path is still correct */
                int64_t per = (N + nt - 1) / nt;
#pragma omp parallel num_threads(nt)
                {
                    int64_t n0 = omp_get_thread_num() * per, n1 = n0 + per < N ? n0 + per : N;
                    if (n0 < n1) c->k->gemv(x, M, w, bias, out, n0, n1);
                }
                return;
            }
            kn_host_free(c->apack);
            c->apack = p, c->apack_floats = need;
        }
        const int tiles = (M + KN_GEMM_MR - 1) / KN_GEMM_MR;
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), per = (tiles + nt - 1) / nt;
            int m0 = t * per * KN_GEMM_MR, m1 = (t + 1) * per * KN_GEMM_MR;
            if (m1 > tiles * KN_GEMM_MR) m1 = tiles * KN_GEMM_MR;
            if (m0 < m1) c->k->pack_a(x, M, w->cols, m0, m1, c->apack);
        }
        ap = c->apack;
    }
    int64_t nblocks = (N + KN_GEMM_NC - 1) / KN_GEMM_NC;
#pragma omp parallel num_threads(nt)
    {
        float *scratch = c->gemm_scratch + (size_t)omp_get_thread_num() * KN_GEMM_SCRATCH;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t n0 = b * KN_GEMM_NC, n1 = n0 + KN_GEMM_NC < N ? n0 + KN_GEMM_NC : N;
            c->k->gemm(x, ap, M, w, bias, out, n0, n1, scratch);
        }
    }
}

/* cos and sin of one position's RoPE angles, times attn_scale */
static void rope_angles(const kn_rope_table *rope, int pos, float *cs, float *sn) {
    for (int i = 0; i < rope->rot_dim / 2; i++) {
        const float f = (float)pos * rope->inv_freq[i];
        cs[i] = cosf(f) * rope->attn_scale;
        sn[i] = sinf(f) * rope->attn_scale;
    }
}

static void rope_heads(float *x, int n_heads, int head_dim, int half, const float *cs, const float *sn) {
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

/* rotate-half RoPE on the first rot_dim dims of each head, in place. A
 * decode step rotates every layer at the same position with the same
 * table: the last position's angles are kept (keyed by the position, the
 * scale and the frequencies themselves) and reused. */
static void cpu_rope(kn_backend *be, float *x, int64_t stride, int n_tokens, int n_heads, int head_dim,
                     const int32_t *pos, const kn_rope_table *rope) {
    cpu_backend *c = cpu(be);
    const int half = rope->rot_dim / 2; /* <= 512: head_dim <= 1024 checked at config */
    if (n_tokens <= 4) {
        for (int t = 0; t < n_tokens; t++) {
            if (!(c->rope_pos == pos[t] && c->rope_half == half && c->rope_scale == rope->attn_scale &&
                  !memcmp(c->rope_freq, rope->inv_freq, (size_t)half * sizeof(float)))) {
                rope_angles(rope, pos[t], c->rope_cs, c->rope_sn);
                memcpy(c->rope_freq, rope->inv_freq, (size_t)half * sizeof(float));
                c->rope_pos = pos[t], c->rope_half = half, c->rope_scale = rope->attn_scale;
            }
            rope_heads(x + t * stride, n_heads, head_dim, half, c->rope_cs, c->rope_sn);
        }
        return;
    }
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int t = 0; t < n_tokens; t++) {
        float cs[512], sn[512];
        rope_angles(rope, pos[t], cs, sn);
        rope_heads(x + t * stride, n_heads, head_dim, half, cs, sn);
    }
}

static void cpu_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                         int n_tokens, const int32_t *slots) {
    if (kv->k_fmt != KN_KVF_F32 || kv->v_fmt != KN_KVF_F32) {
        kn_cpu_kv_write(be, kv, k, v, stride, n_tokens, slots);
        return;
    }
    const int64_t w = (int64_t)kv->n_kv_heads * kv->head_dim;
    for (int t = 0; t < n_tokens; t++) {
        memcpy((float *)kv->k + (int64_t)slots[t] * w, k + t * stride, (size_t)w * sizeof(float));
        memcpy((float *)kv->v + (int64_t)slots[t] * w, v + t * stride, (size_t)w * sizeof(float));
    }
}

static void cpu_attention(kn_backend *be, const kn_attention_args *a) {
    cpu_backend *c = cpu(be);
    const kn_kv_layer *kv = a->kv;
    if (kv->k_fmt != KN_KVF_F32 || kv->v_fmt != KN_KVF_F32) {
        kn_cpu_attention_kv(be, decode_pool(be, a->n_tokens), c->k, a, c->attn_scratch, c->attn_scratch_len);
        return;
    }
    const float *kv_k = kv->k, *kv_v = kv->v;
    const int hd = kv->head_dim, bs = kv->block_size, group = a->n_heads / kv->n_kv_heads;
    const int64_t slot_w = (int64_t)kv->n_kv_heads * hd;
    const int total = a->n_tokens * a->n_heads;
#pragma omp parallel num_threads(be->n_threads)
    {
        float *scores = c->attn_scratch + (size_t)omp_get_thread_num() * (size_t)c->attn_scratch_len;
#pragma omp for schedule(dynamic, 4)
        for (int th = 0; th < total; th++) {
            int t = th / a->n_heads, h = th % a->n_heads, kvh = h / group;
            const float *q = a->q + t * a->q_stride + (int64_t)h * hd;
            float *o = a->out + (int64_t)t * a->n_heads * hd + (int64_t)h * hd;
            const int32_t *bt = a->block_tables + (int64_t)a->seq[t] * a->max_blocks;
            int p = a->pos[t], lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
            float mx = -INFINITY;
            for (int j = lo; j <= p; j++) {
                int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
                float s = c->k->dot(q, kv_k + slot * slot_w + (int64_t)kvh * hd, hd) * a->scale;
                if (a->softcap > 0.0f) s = tanhf(s / a->softcap) * a->softcap;
                scores[j - lo] = s;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int j = 0; j <= p - lo; j++) {
                scores[j] = expf(scores[j] - mx);
                sum += scores[j];
            }
            float inv = 1.0f / sum;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = lo; j <= p; j++) {
                int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
                c->k->axpy(o, scores[j - lo] * inv, kv_v + slot * slot_w + (int64_t)kvh * hd, hd);
            }
        }
    }
}

/* rows split across threads; one row (decode) runs on the caller alone: a
 * parallel region would only add a barrier */
static void cpu_swiglu(kn_backend *be, const float *gate_up, int rows, int dim, float *out) {
    const kn_cpu_kernels *k = cpu(be)->k;
    if (rows == 1) {
        kn_cpu_silu_mul(k, out, gate_up, gate_up + dim, dim);
        return;
    }
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int r = 0; r < rows; r++)
        kn_cpu_silu_mul(k, out + (int64_t)r * dim, gate_up + (int64_t)r * 2 * dim, gate_up + (int64_t)r * 2 * dim + dim, dim);
}

static void cpu_layer_norm(kn_backend *be, const float *x, int64_t x_stride, float *out, int64_t out_stride, int rows,
                           int dim, const float *w, const float *b, float eps) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (rows * dim > 8192)
    for (int r = 0; r < rows; r++) {
        const float *xi = x + r * x_stride;
        float *oi = out + r * out_stride;
        double sum = 0.0, ss = 0.0;
        for (int j = 0; j < dim; j++) sum += xi[j];
        double mean = sum / dim;
        for (int j = 0; j < dim; j++) ss += (xi[j] - mean) * (xi[j] - mean);
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps), m = (float)mean;
        for (int j = 0; j < dim; j++) {
            float v = (xi[j] - m) * inv;
            oi[j] = (w ? w[j] : 1.0f) * v + (b ? b[j] : 0.0f);
        }
    }
}

static inline float gelu_f(float v, int approx) {
    if (approx == KN_GELU_TANH) return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
}

static void cpu_gelu(kn_backend *be, const float *x, int64_t n, float *out, int approx) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) out[i] = gelu_f(x[i], approx);
}

static void cpu_geglu(kn_backend *be, const float *gate_up, int rows, int dim, float *out, int approx) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + (int64_t)r * 2 * dim, *u = g + dim;
        float *o = out + (int64_t)r * dim;
        for (int j = 0; j < dim; j++) o[j] = gelu_f(g[j], approx) * u[j];
    }
}

static void cpu_add(kn_backend *be, float *y, const float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_gather_rows(kn_backend *be, const float *x, int64_t dim, const int32_t *rows, int n, float *out) {
    (void)be;
    for (int i = 0; i < n; i++) memcpy(out + i * dim, x + rows[i] * dim, (size_t)dim * sizeof(float));
}

static void cpu_softmax(kn_backend *be, float *x, int rows, int dim) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        float *v = x + (int64_t)r * dim, mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < dim; j++) mx = v[j] > mx ? v[j] : mx;
        for (int j = 0; j < dim; j++) sum += (v[j] = expf(v[j] - mx));
        for (int j = 0; j < dim; j++) v[j] /= sum;
    }
}

/* sample_rows: the host rule itself (base/sampling.h), one row per thread */
static void cpu_sample_rows(kn_backend *be, float *x, int rows, int V, const kn_sample_params *params,
                            const kn_logit_edit *edits, int32_t *out) {
#pragma omp parallel num_threads(be->n_threads) if (rows > 1)
    {
        kn_sample_scratch s = {0};
        const int ok = kn_sample_scratch_init(&s, V) == 0;
#pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < rows; r++) {
            float *row = x + (size_t)r * V;
            kn_logit_edits_apply(row, V, edits + params[r].edit0, params[r].n_edits);
            /* out of memory for the scratch: greedy rather than nothing */
            out[r] = ok ? kn_sample_row(row, V, &params[r], &s) : kn_sample_argmax(row, V);
        }
        kn_sample_scratch_free(&s);
    }
}

static void cpu_argmax_rows(kn_backend *be, const float *x, int rows, int dim, int32_t *out) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        const float *v = x + (int64_t)r * dim;
        int best = 0;
        float bv = -INFINITY;
        for (int j = 0; j < dim; j++)
            if (v[j] > bv) bv = v[j], best = j;
        out[r] = best;
    }
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const kn_cpu_kernels *k;
    char *buf;
    size_t share;
    int n_shares;
    int fill;      /* 1: write the pages (first touch), 0: read them */
    uint64_t *acc; /* [n_shares]: the sums, kept so that the reads stay */
} probe_job;

/* shares t, t + team, ... (one each when the team is as large as asked) */
static void probe_part(void *arg, int t, int team) {
    probe_job *j = arg;
    for (int s = t; s < j->n_shares; s += team) {
        char *p = j->buf + (size_t)s * j->share;
        if (j->fill)
            for (size_t i = 0; i < j->share; i += 4096) memset(p + i, (int)(i >> 12), 4096);
        else j->acc[s] = j->k->read_sum(p, j->share);
    }
}

/* Best of 7 passes of a parallel read over 1 GiB (far beyond the caches),
 * each thread streaming its own contiguous share like the gemv kernels do,
 * on the threads the decode GEMVs run on. */
static double cpu_read_bandwidth(kn_backend *be) {
    const size_t bytes = (size_t)1 << 30;
    const int nt = be->n_threads;
    probe_job j = {.k = cpu(be)->k, .share = (bytes / (size_t)nt) & ~(size_t)4095, .n_shares = nt, .fill = 1};
    j.buf = cpu_alloc(be, bytes);
    j.acc = calloc((size_t)nt, sizeof *j.acc);
    if (!j.buf || !j.acc) {
        cpu_free(be, j.buf);
        free(j.acc);
        return 0.0;
    }
    kn_cpu_pool_run(cpu(be)->pool, nt, probe_part, &j);
    j.fill = 0;
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = seconds_now();
        kn_cpu_pool_run(cpu(be)->pool, nt, probe_part, &j);
        double dt = seconds_now() - t0;
        for (int t = 0; t < nt; t++) sink ^= j.acc[t];
        if (j.share * nt / dt > best) best = j.share * nt / dt;
    }
    (void)sink;
    cpu_free(be, j.buf);
    free(j.acc);
    return best;
}

static const kn_backend_vtbl cpu_vtbl = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .weight_load = cpu_weight_load,
    .embed = cpu_embed,
    .rms_norm = cpu_rms_norm,
    .matmul = cpu_matmul,
    .matmul_add = cpu_matmul_add,
    .fused_matmul = cpu_fused_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .layer_norm = cpu_layer_norm,
    .gelu = cpu_gelu,
    .geglu = cpu_geglu,
    .add = cpu_add,
    .gather_rows = cpu_gather_rows,
    .softmax = cpu_softmax,
    /* whisper */
    .im2col_1d = kn_cpu_im2col_1d,
    .attention_dense = kn_cpu_attention_dense,
    .argmax_rows = cpu_argmax_rows,
    .read_bandwidth = cpu_read_bandwidth,
    .softcap = kn_cpu_softcap,
    .scale = kn_cpu_scale,
    .sigmoid_gate_add = kn_cpu_sigmoid_gate_add,
    .moe_route = kn_cpu_moe_route,
    .moe_ffn = kn_cpu_moe_ffn,
    .mul_rows = kn_cpu_mul_rows,
    .weight_load_quant = kn_cpu_weight_load_quant,
    .kv_convert = kn_cpu_kv_convert,
    .stream_mix = kn_cpu_stream_mix,
    .rms_match = kn_cpu_rms_match,
    .gaussian_topk = kn_cpu_gaussian_topk,
    .sample_rows = cpu_sample_rows,
    /* log_mel NULL: the host mel is audio/mel.c, which kn_mel_compute_on calls */
};

/* Attention scratch holds one score row per thread; sized for the longest
 * context any model may use (the backend is shared across models). */
#define KN_CPU_MAX_CONTEXT (1 << 20)

/* KILN_CPU_PROFILE=1: the ops run synchronously, so a mark is the wall clock */
static double profile_marks[KN_PROFILE_SLOTS];
static void profile_mark(kn_backend *be, int slot) {
    (void)be;
    profile_marks[slot] = seconds_now();
}
static void profile_flush(kn_backend *be) { (void)be; }
static double profile_elapsed_ms(kn_backend *be, int a, int b) {
    (void)be;
    return 1e3 * (profile_marks[b] - profile_marks[a]);
}

kn_code kn_cpu_backend_create(int n_threads, kn_backend **out, kn_error *err) {
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    c->base.vt = &cpu_vtbl;
    /* KILN_CPU_NO_FUSE=1: the decode fusions off, the models run the
     * separate ops (A/B measurement) */
    static kn_backend_vtbl unfused;
    const char *nf = getenv("KILN_CPU_NO_FUSE");
    if (nf && *nf && strcmp(nf, "0") != 0) {
        unfused = cpu_vtbl;
        unfused.matmul_add = NULL, unfused.fused_matmul = NULL;
        c->base.vt = &unfused;
    }
    if (kn_profile_wanted(getenv("KILN_CPU_PROFILE"))) {
        static const kn_profile_clock clock = {profile_mark, profile_flush, profile_elapsed_ms, NULL};
        c->base.vt = kn_profile_vtbl(c->base.vt, &clock, "KILN_CPU_PROFILE");
    }
    c->base.n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->k = kn_cpu_kernels_select();
    /* with bf16 dot products, x meets 16-bit weights rounded to their dtype
     * at every M (gemv_bf16 for decode, gemm_bf16 for prefill), as HF
     * transformers' bf16 activations do; without them x stays f32 */
    if (c->k->gemm_bf16) c->base.matmul_x_rounding_min_rows = c->k->gemv_bf16 ? 1 : 17;
    c->base.moe_quantized_experts = 1; /* kn_cpu_moe_ffn: per-expert row views through matmul */
    if (c->k->qgemv) c->base.quant_x_rel_error = 1.0 / 32512; /* the VNNI or AVX2 integer GEMV (and VNNI GEMM) */
    c->attn_scratch_len = KN_CPU_MAX_CONTEXT;
    const char *pe = getenv("KILN_CPU_POOL"); /* 0: the decode sections on OpenMP too (A/B measurement) */
    if (!(pe && strcmp(pe, "0") == 0)) c->pool = kn_cpu_pool_create(c->base.n_threads);
    c->gemm_scratch = cpu_alloc(&c->base, (size_t)c->base.n_threads * KN_GEMM_SCRATCH * sizeof(float));
    /* calloc-free: pages are touched only as far as contexts actually reach */
    c->attn_scratch = cpu_alloc(&c->base, (size_t)c->base.n_threads * (size_t)c->attn_scratch_len * sizeof(float));
    if (!c->gemm_scratch || !c->attn_scratch) {
        cpu_destroy(&c->base);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for cpu backend scratch");
    }
    *out = &c->base;
    return KN_OK;
}

const char *kn_cpu_backend_kernels(const kn_backend *be) { return ((const cpu_backend *)be)->k->name; }

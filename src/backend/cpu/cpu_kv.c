/* cpu_kv.c — see cpu_kv.h.
 *
 * Attention over compressed rows: one task per (query token, KV head); each
 * stored key/value row is decoded once per task into a [D] buffer and used
 * by all G query heads of the group (GQA). Rotated formats stay rotated:
 * tq keys are compared with the query rotated by the same transform (after
 * RoPE), rotated values are accumulated in the rotated domain and the output
 * row is un-rotated once at the end. No dequantized copy of the cache is
 * ever made. Results do not depend on the thread count. */
#include "backend/cpu/cpu_kv.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/kv_codec.h"

/* Row i (token i / n_kv_heads, head i % n_kv_heads) of a kv_write. */
static void kv_write_row(const kn_kv_layer *kv, const float *k, const float *v, int64_t stride, const int32_t *slots,
                         int i) {
    const int D = kv->head_dim, nkv = kv->n_kv_heads;
    const int64_t kb = kn_kv_row_bytes(kv->k_fmt, D), vb = kn_kv_row_bytes(kv->v_fmt, D);
    float tmp[KN_KV_MAX_DIM];
    const int t = i / nkv, h = i % nkv;
    const int64_t slot = slots[t];
    const kn_kv_aux ak = {kv->k_tab, kv->signs, kv->k_scale ? kv->k_scale[h] : 1.0f};
    const kn_kv_aux av = {kv->v_tab, kv->signs, kv->v_scale ? kv->v_scale[h] : 1.0f};
    kn_kv_encode(kv->k_fmt, k + t * stride + (int64_t)h * D, D, (uint8_t *)kv->k + (slot * nkv + h) * kb, &ak, tmp);
    kn_kv_encode(kv->v_fmt, v + t * stride + (int64_t)h * D, D, (uint8_t *)kv->v + (slot * nkv + h) * vb, &av, tmp);
}

void kn_cpu_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                     int n_tokens, const int32_t *slots) {
    const int rows = n_tokens * kv->n_kv_heads;
    if (rows <= 64) { /* a decode step's rows on the calling thread (an OpenMP region costs more than they do) */
        for (int i = 0; i < rows; i++) kv_write_row(kv, k, v, stride, slots, i);
        return;
    }
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int i = 0; i < rows; i++) kv_write_row(kv, k, v, stride, slots, i);
}

void kn_cpu_kv_convert(kn_backend *be, const kn_kv_layer *kv, const int32_t *src, const int32_t *dst, int n) {
    const int D = kv->head_dim, nkv = kv->n_kv_heads;
    const int64_t kb = kn_kv_row_bytes(kv->k_fmt, D), vb = kn_kv_row_bytes(kv->v_fmt, D);
    const int64_t sb = kn_kv_row_bytes(kv->s_fmt, D);
    const int rows = n * nkv;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (rows > 64)
    for (int i = 0; i < rows; i++) {
        float x[KN_KV_MAX_DIM], tmp[KN_KV_MAX_DIM];
        const int t = i / nkv, h = i % nkv;
        const kn_kv_aux none = {NULL, NULL, 1.0f};
        const kn_kv_aux ak = {kv->k_tab, kv->signs, kv->k_scale ? kv->k_scale[h] : 1.0f};
        const kn_kv_aux av = {kv->v_tab, kv->signs, kv->v_scale ? kv->v_scale[h] : 1.0f};
        const int64_t s = ((int64_t)src[t] * nkv + h) * sb, d = (int64_t)dst[t] * nkv + h;
        kn_kv_decode(kv->s_fmt, (const uint8_t *)kv->sk + s, D, &none, x);
        kn_kv_encode(kv->k_fmt, x, D, (uint8_t *)kv->k + d * kb, &ak, tmp);
        kn_kv_decode(kv->s_fmt, (const uint8_t *)kv->sv + s, D, &none, x);
        kn_kv_encode(kv->v_fmt, x, D, (uint8_t *)kv->v + d * vb, &av, tmp);
    }
}

/* Row of D elements in format f as float: rotated formats stay in the
 * rotated domain. bf16 and f32 rows (the default cache) are converted in one
 * pass instead of element by element. */
static inline void decode_row(int f, const uint8_t *src, int D, const kn_kv_aux *aux, float *row) {
    if (f == KN_KVF_BF16) {
        for (int d = 0; d < D; d++) {
            uint16_t h;
            memcpy(&h, src + 2 * d, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(row + d, &u, 4);
        }
    } else if (f == KN_KVF_F32) memcpy(row, src, (size_t)D * sizeof(float));
    else kn_kv_decode_rot(f, src, D, aux, row);
}

/* Software prefetch of n rows of row_bytes each, stride bytes apart: the
 * rows of a later cache block, requested while this one is computed (a
 * head's rows are strided by the other heads', and a block's rows need not
 * follow the previous block's). Two blocks ahead: at 1k context (0.44B
 * bf16 decode) 193 us per layer without, 159 one block ahead, 154 two, 146
 * four. (Reading each position's rows whole instead, with positions split
 * into chunks, measured no faster in the model and slower alone.) */
#define ATTN_PREFETCH_BLOCKS 2
static inline void prefetch_rows(const uint8_t *p, int64_t stride, int n, int64_t row_bytes) {
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + r * stride + o, 0, 3);
}

/* The same into L2 only: rows wanted after the current walk (the value rows
 * of the key block being scored: 0.44B bf16 decode at 128-256 context, the
 * attention 17% shorter with them than with only the value walk's own
 * prefetches) */
static inline void prefetch_rows_l2(const uint8_t *p, int64_t stride, int n, int64_t row_bytes) {
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + r * stride + o, 0, 2);
}

/* The address of position j's row of kv head kvh in the K or V arena. */
static inline const uint8_t *row_at(const kn_kv_layer *kv, const int32_t *bt, int j, int kvh, int is_v) {
    const int bs = kv->block_size;
    const int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
    return (const uint8_t *)(is_v ? kv->v : kv->k) +
           (slot * kv->n_kv_heads + kvh) * kn_kv_row_bytes(is_v ? kv->v_fmt : kv->k_fmt, kv->head_dim);
}

/* Prefetch kv head kvh's rows of the cache block ATTN_PREFETCH_BLOCKS
 * after position j's, up to position last. */
static inline void prefetch_block(const kn_kv_layer *kv, const int32_t *bt, int j, int last, int kvh, int is_v) {
    const int bs = kv->block_size, jn = (j / bs + ATTN_PREFETCH_BLOCKS) * bs;
    if (jn > last) return;
    const uint8_t *p = row_at(kv, bt, jn, kvh, is_v);
    const int64_t rb = kn_kv_row_bytes(is_v ? kv->v_fmt : kv->k_fmt, kv->head_dim);
    prefetch_rows(p, kv->n_kv_heads * rb, last + 1 - jn < bs ? last + 1 - jn : bs, rb);
}

/* Query tokens attend in blocks: up to ATTN_BLOCK consecutive positions of
 * one sequence (a prefill run) share each K/V row read, as B * G query
 * vectors of one KV head. Causality per vector: the later keys of a block
 * are scored for the earlier tokens (those scores are never read), each
 * vector's softmax runs over its own keys, and a value row goes only to the
 * vectors of tokens at or after it. Windowed layers (each token's first key
 * differs) run token by token. */
#define ATTN_BLOCK 16

typedef struct {
    const kn_cpu_kernels *k;
    const kn_attention_args *a;
    const int *start; /* blocks of tokens: [start[i], start[i + 1]) */
    int tasks;
    float *scratch;
    int64_t scratch_len;
    _Alignas(64) _Atomic int next; /* the next task to claim */
} attn_job;

/* A thread's task buffers for VG query vectors of D: qr [VG][D], acc
 * [VG][D], row [D], mx [VG], inv [VG] (sliced in attend_task) */
static size_t attn_buf_floats(int VG, int D) { return (size_t)2 * VG * D + D + 2 * (size_t)VG; }

/* Task task (block of tokens task / nkv, kv head task % nkv); sc: the
 * thread's scores, buf: its attn_buf_floats buffers */
static void attend_task(const attn_job *job, int task, float *sc, float *buf) {
    const kn_cpu_kernels *k = job->k;
    const kn_attention_args *a = job->a;
    const kn_kv_layer *kv = a->kv;
    const int *start = job->start;
    const int64_t scratch_len = job->scratch_len;
    const int D = kv->head_dim, nkv = kv->n_kv_heads, G = a->n_heads / nkv, bs = kv->block_size;
    const int kf = kv->k_fmt, vf = kv->v_fmt, krot = kn_kv_fmt_rotated(kf), vrot = kn_kv_fmt_rotated(vf);
    const int64_t kb = kn_kv_row_bytes(kf, D), vb = kn_kv_row_bytes(vf, D);
    const int VG = ATTN_BLOCK * G;
    float *qr = buf, *acc = qr + (size_t)VG * D, *row = acc + (size_t)VG * D, *mx = row + D, *inv = mx + VG;
    const int t0 = start[task / nkv], nt = start[task / nkv + 1] - t0, kvh = task % nkv;
    const int32_t *bt = a->block_tables + (int64_t)a->seq[t0] * a->max_blocks;
    const int p0 = a->pos[t0], p = a->pos[t0 + nt - 1]; /* the block's first and last positions */
    const int lo = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0, n = p - lo + 1;
    const kn_kv_aux ak = {kv->k_tab, kv->signs, kv->k_scale ? kv->k_scale[kvh] : 1.0f};
    const kn_kv_aux av = {kv->v_tab, kv->signs, kv->v_scale ? kv->v_scale[kvh] : 1.0f};
    const int nv = nt * G; /* vector v: token t0 + v / G, head kvh * G + v % G */
    int gc = (int)(scratch_len / n);
    gc = gc < 1 ? 1 : gc > nv ? nv : gc;
    for (int g0 = 0; g0 < nv; g0 += gc) {
        const int ng = nv - g0 < gc ? nv - g0 : gc;
        for (int g = 0; g < ng; g++) {
            const int v = g0 + g, t = t0 + v / G;
            const float *q = a->q + t * a->q_stride + (int64_t)(kvh * G + v % G) * D;
            if (krot) kn_kv_rotate(q, D, kv->signs, qr + (size_t)g * D);
            else memcpy(qr + (size_t)g * D, q, (size_t)D * sizeof(float));
        }
        /* the last key each vector sees: its token's position */
        const int last_v = a->pos[t0 + (g0 + ng - 1) / G];
        /* raw scores q . k: bf16 rows one cache block at a time through the kernel set's run
         * kernel where it has one, other rows one by one */
        for (int j = lo; j <= last_v;) {
            const uint8_t *rp = row_at(kv, bt, j, kvh, 0);
            if (kf == KN_KVF_BF16 && k->dot_rows_bf16 && D % 16 == 0) {
                const int run =
                    (j / bs + 1) * bs - j < last_v + 1 - j ? (j / bs + 1) * bs - j : last_v + 1 - j;
                prefetch_block(kv, bt, j, last_v, kvh, 0); /* a later block's, while this one runs */
                prefetch_rows_l2(row_at(kv, bt, j, kvh, 1), nkv * vb, run, vb); /* its value rows, for later */
                k->dot_rows_bf16(qr, ng, D, rp, nkv * kb, run, sc + (j - lo), n);
                j += run;
                continue;
            }
            decode_row(kf, rp, D, &ak, row);
            for (int g = 0; g < ng; g++) sc[(int64_t)g * n + (j - lo)] = k->dot(qr + (size_t)g * D, row, D);
            j++;
        }
        for (int g = 0; g < ng; g++) {
            const int nvk = a->pos[t0 + (g0 + g) / G] - lo + 1; /* this vector's keys */
            float *sg = sc + (int64_t)g * n, m = -INFINITY;
            if (k->scale_max && !(a->softcap > 0.0f)) {
                mx[g] = k->scale_max(sg, nvk, a->scale);
                continue;
            }
            for (int j = 0; j < nvk; j++) {
                float s = sg[j] * a->scale;
                if (a->softcap > 0.0f) s = tanhf(s / a->softcap) * a->softcap;
                sg[j] = s;
                if (s > m) m = s;
            }
            mx[g] = m;
        }
        for (int g = 0; g < ng; g++) {
            const int nvk = a->pos[t0 + (g0 + g) / G] - lo + 1;
            float sum = 0.0f, *sg = sc + (int64_t)g * n;
            if (k->exp_shift_sum) sum = k->exp_shift_sum(sg, nvk, mx[g]);
            else
                for (int j = 0; j < nvk; j++) sum += (sg[j] = expf(sg[j] - mx[g]));
            inv[g] = 1.0f / sum;
            for (int j = 0; j < nvk; j++) sg[j] *= inv[g]; /* the softmax weights */
        }
        memset(acc, 0, (size_t)ng * D * sizeof(float));
        /* value rows up to the first vector's position go to every vector; a later row only to the
         * vectors of tokens at or after it (no 0 * v terms: a row past a token is never read for it) */
        const int pf = a->pos[t0 + g0 / G];
        for (int j = lo; j <= last_v;) {
            const uint8_t *rp = row_at(kv, bt, j, kvh, 1);
            const int vf0 = j <= pf ? 0 : (j - p0) * G - g0; /* the first vector that sees row j */
            const int end = j <= pf ? pf : j;                /* rows [j, end] share that vector set */
            float *base = acc + (size_t)vf0 * D;
            const float *w = sc + (int64_t)vf0 * n + (j - lo);
            if (vf == KN_KVF_BF16 && k->axpy_rows_bf16 && D % 16 == 0) {
                const int run = (j / bs + 1) * bs - j < end + 1 - j ? (j / bs + 1) * bs - j : end + 1 - j;
                prefetch_block(kv, bt, j, last_v, kvh, 1); /* a later block's, while this one runs */
                k->axpy_rows_bf16(base, ng - vf0, D, rp, nkv * vb, run, w, n);
                j += run;
                continue;
            }
            decode_row(vf, rp, D, &av, row);
            for (int g = 0; g < ng - vf0; g++) k->axpy(base + (size_t)g * D, w[(int64_t)g * n], row, D);
            j++;
        }
        for (int g = 0; g < ng; g++) {
            const int v = g0 + g, t = t0 + v / G;
            float *ag = acc + (size_t)g * D;
            if (vrot) kn_kv_unrotate(ag, D, kv->signs); /* the one inverse transform of this output row */
            memcpy(a->out + ((int64_t)t * a->n_heads + kvh * G + v % G) * D, ag, (size_t)D * sizeof(float));
        }
    }
}

static void attend_part(void *arg, int t, int nt) {
    attn_job *j = arg;
    (void)nt;
    const int D = j->a->kv->head_dim, VG = ATTN_BLOCK * (j->a->n_heads / j->a->kv->n_kv_heads);
    float *sc = j->scratch + (size_t)t * (size_t)j->scratch_len;
    float *buf = malloc(attn_buf_floats(VG, D) * sizeof(float));
    if (!buf) return; /* out of memory: another thread takes the tasks, or the rows stay unwritten */
    for (int task; (task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->tasks;)
        attend_task(j, task, sc, buf);
    free(buf);
}

void kn_cpu_attention_kv(kn_backend *be, kn_cpu_pool *pool, const kn_cpu_kernels *k, const kn_attention_args *a,
                         float *scratch, int64_t scratch_len) {
    const int nkv = a->kv->n_kv_heads;
    /* blocks of tokens: [start[i], start[i + 1]) */
    int *start = malloc(((size_t)a->n_tokens + 1) * sizeof(int));
    if (!start) return; /* out of memory: the rows stay unwritten (callers size hosts generously) */
    int n_blocks = 0;
    for (int t = 0; t < a->n_tokens;) {
        int e = t + 1;
        while (a->window <= 0 && e < a->n_tokens && e - t < ATTN_BLOCK && a->seq[e] == a->seq[t] &&
               a->pos[e] == a->pos[e - 1] + 1)
            e++;
        start[n_blocks++] = t;
        t = e;
    }
    start[n_blocks] = a->n_tokens;
    attn_job job = {.k = k, .a = a, .start = start, .tasks = n_blocks * nkv, .scratch = scratch,
                    .scratch_len = scratch_len};
    atomic_init(&job.next, 0);
    kn_cpu_pool_run(pool, be->n_threads, attend_part, &job);
    free(start);
}

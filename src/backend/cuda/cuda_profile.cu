/* cuda_profile.cu — per-op GPU time, for finding where a forward spends it.
 *
 * KILN_CUDA_PROFILE=1 swaps the backend's vtable for one whose ops are
 * bracketed by CUDA events (graphs stay off so every op is visible). Event
 * pairs are harvested at each synchronization; the table (total and mean
 * time per op and matmul shape) is printed to stderr when the backend is
 * destroyed. The first call of each row is left out: it pays one-time costs
 * (cuBLASLt algorithm timing, lazy allocation). Measurement only: never on in
 * normal runs. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define PROF_PENDING 8192
#define PROF_ROWS 96

typedef struct {
    const kn_backend_vtbl *real;
    cudaEvent_t ev[2 * PROF_PENDING];
    int row_of[PROF_PENDING], n_pending;
    char name[PROF_ROWS][64];
    double ms[PROF_ROWS];
    long count[PROF_ROWS], seen[PROF_ROWS];
    int n_rows;
} profiler;

static profiler P; /* one profiled backend per process: a measurement tool */
static kn_backend_vtbl prof_vt;

static int row_for(const char *name) {
    for (int i = 0; i < P.n_rows; i++)
        if (!strcmp(P.name[i], name)) return i;
    if (P.n_rows == PROF_ROWS) return PROF_ROWS - 1;
    snprintf(P.name[P.n_rows], sizeof P.name[0], "%s", name);
    return P.n_rows++;
}

static void harvest(void) {
    for (int i = 0; i < P.n_pending; i++) {
        float ms = 0;
        if (P.seen[P.row_of[i]]++ == 0) continue; /* first call: one-time costs */
        if (cudaEventElapsedTime(&ms, P.ev[2 * i], P.ev[2 * i + 1]) == cudaSuccess) {
            P.ms[P.row_of[i]] += ms;
            P.count[P.row_of[i]]++;
        }
    }
    P.n_pending = 0;
}

static int begin(kn_backend *be, const char *name) {
    if (P.n_pending == PROF_PENDING) {
        cudaStreamSynchronize(kn_cuda_stream(be));
        harvest();
    }
    int i = P.n_pending++;
    P.row_of[i] = row_for(name);
    cudaEventRecord(P.ev[2 * i], kn_cuda_stream(be));
    return i;
}
static void end(kn_backend *be, int i) { cudaEventRecord(P.ev[2 * i + 1], kn_cuda_stream(be)); }
/* an optional op that declined (enqueued nothing): its bracket is dropped */
static void drop(int i) {
    if (i == P.n_pending - 1) P.n_pending--;
}

#define WRAP(op, name, params, args)                                                                                   \
    static void p_##op params {                                                                                        \
        int i = begin(be, name);                                                                                       \
        P.real->op args;                                                                                               \
        end(be, i);                                                                                                    \
    }
WRAP(embed, "embed", (kn_backend * be, const kn_weight *t, const int32_t *ids, int n, float *out), (be, t, ids, n, out))
WRAP(rms_norm, "rms_norm",
     (kn_backend * be, const float *x, int64_t xs, float *out, int64_t os, int rows, int groups, int dim,
      const float *w, float eps),
     (be, x, xs, out, os, rows, groups, dim, w, eps))
WRAP(rope, "rope",
     (kn_backend * be, float *x, int64_t stride, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
      const kn_rope_table *r),
     (be, x, stride, n_tokens, n_heads, head_dim, pos, r))
WRAP(kv_write, "kv_write",
     (kn_backend * be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride, int n, const int32_t *s),
     (be, kv, k, v, stride, n, s))
WRAP(swiglu, "swiglu", (kn_backend * be, const float *gu, int rows, int dim, float *out), (be, gu, rows, dim, out))
WRAP(add, "add", (kn_backend * be, float *y, const float *x, int64_t n), (be, y, x, n))
WRAP(sample_rows, "sample_rows",
     (kn_backend * be, float *x, int rows, int V, const kn_sample_params *p, const kn_logit_edit *e, int32_t *out),
     (be, x, rows, V, p, e, out))
WRAP(argmax_rows, "argmax_rows", (kn_backend * be, const float *x, int rows, int dim, int32_t *out),
     (be, x, rows, dim, out))
WRAP(gather_rows, "gather_rows", (kn_backend * be, const float *x, int64_t dim, const int32_t *rows, int n, float *out),
     (be, x, dim, rows, n, out))

static void p_attention(kn_backend *be, const kn_attention_args *a) {
    char name[64];
    snprintf(name, sizeof name, "attention T=%d", a->n_tokens);
    int i = begin(be, name);
    P.real->attention(be, a);
    end(be, i);
}
static void p_matmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    char name[64];
    snprintf(name, sizeof name, "matmul M=%d N=%lld K=%lld", M, (long long)w->rows, (long long)w->cols);
    int i = begin(be, name);
    P.real->matmul(be, x, M, w, bias, out);
    end(be, i);
}
static void p_matmul_add(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    char name[64];
    snprintf(name, sizeof name, "matmul_add M=%d N=%lld K=%lld", M, (long long)w->rows, (long long)w->cols);
    int i = begin(be, name);
    P.real->matmul_add(be, x, M, w, bias, out);
    end(be, i);
}
static int p_fused_matmul(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                          const float *bias, float *out, int epi) {
    char name[64];
    snprintf(name, sizeof name, "fused%s%s M=%d N=%lld K=%lld", norm_w ? "_norm" : "", epi ? "_swiglu" : "", M,
             (long long)w->rows, (long long)w->cols);
    int i = begin(be, name);
    int done = P.real->fused_matmul(be, x, M, norm_w, eps, w, bias, out, epi);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static int p_mlp_swiglu_add(kn_backend *be, const float *xn, int M, const float *norm_w, float eps,
                            const kn_weight *gu, const float *gu_bias, const kn_weight *down, const float *down_bias,
                            float *x) {
    char name[64];
    snprintf(name, sizeof name, "mlp_swiglu_add M=%d I=%lld H=%lld", M, (long long)down->cols, (long long)down->rows);
    int i = begin(be, name);
    int done = P.real->mlp_swiglu_add(be, xn, M, norm_w, eps, gu, gu_bias, down, down_bias, x);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static void p_sync(kn_backend *be) {
    P.real->sync(be);
    harvest();
}
static void p_download(kn_backend *be, void *d, const void *s, size_t n) {
    P.real->download(be, d, s, n);
    harvest();
}
static void p_destroy(kn_backend *be) {
    cudaStreamSynchronize(kn_cuda_stream(be));
    harvest();
    double all = 0;
    for (int i = 0; i < P.n_rows; i++) all += P.ms[i];
    fprintf(stderr, "%-40s %8s %10s %9s %6s\n", "op (KILN_CUDA_PROFILE; first calls out)", "calls", "total ms", "mean us", "share");
    for (int k = 0; k < P.n_rows; k++) {
        int best = -1;
        for (int i = 0; i < P.n_rows; i++)
            if (P.count[i] > 0 && (best < 0 || P.ms[i] > P.ms[best])) best = i;
        if (best < 0) break; /* the rest never timed a call (declined, or only a first call) */
        fprintf(stderr, "%-40s %8ld %10.2f %9.2f %5.1f%%\n", P.name[best], P.count[best], P.ms[best],
                P.count[best] ? 1e3 * P.ms[best] / P.count[best] : 0.0, all > 0 ? 100.0 * P.ms[best] / all : 0.0);
        P.count[best] = -1;
    }
    for (int i = 0; i < 2 * PROF_PENDING; i++) cudaEventDestroy(P.ev[i]);
    P.real->destroy(be);
}

const kn_backend_vtbl *kn_cuda_profile_vtbl(const kn_backend_vtbl *real) {
    P.real = real;
    for (int i = 0; i < 2 * PROF_PENDING; i++) cudaEventCreate(&P.ev[i]);
    prof_vt = *real;
    prof_vt.embed = p_embed, prof_vt.rms_norm = p_rms_norm, prof_vt.matmul = p_matmul, prof_vt.matmul_add = p_matmul_add, prof_vt.rope = p_rope;
    prof_vt.kv_write = p_kv_write, prof_vt.attention = p_attention, prof_vt.swiglu = p_swiglu, prof_vt.add = p_add;
    prof_vt.gather_rows = p_gather_rows, prof_vt.sync = p_sync, prof_vt.download = p_download;
    prof_vt.destroy = p_destroy, prof_vt.fused_matmul = p_fused_matmul;
    if (real->mlp_swiglu_add) prof_vt.mlp_swiglu_add = p_mlp_swiglu_add;
    prof_vt.sample_rows = p_sample_rows, prof_vt.argmax_rows = p_argmax_rows;
    prof_vt.graph_replay = NULL, prof_vt.graph_begin = NULL, prof_vt.graph_end = NULL;
    return &prof_vt;
}

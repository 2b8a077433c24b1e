/* op_profile.c — see op_profile.h. */
#include "backend/op_profile.h"

#include <stdio.h>
#include <string.h>

#define PROF_PENDING (KN_PROFILE_SLOTS / 2)
#define PROF_ROWS 128

typedef struct {
    const kn_backend_vtbl *real;
    kn_profile_clock clock;
    const char *title;
    int row_of[PROF_PENDING], n_pending;
    char name[PROF_ROWS][64];
    double ms[PROF_ROWS];
    long count[PROF_ROWS], seen[PROF_ROWS];
    int n_rows;
} profiler;

static profiler P; /* one profiled backend per process: a measurement tool */
static kn_backend_vtbl prof_vt;

int kn_profile_wanted(const char *env) { return env && *env && strcmp(env, "0") != 0; }

static int row_for(const char *name) {
    for (int i = 0; i < P.n_rows; i++)
        if (!strcmp(P.name[i], name)) return i;
    if (P.n_rows == PROF_ROWS) return PROF_ROWS - 1; /* the last row takes the overflow */
    snprintf(P.name[P.n_rows], sizeof P.name[0], "%s", name);
    return P.n_rows++;
}

static void harvest(kn_backend *be) {
    if (P.n_pending) P.clock.flush(be);
    for (int i = 0; i < P.n_pending; i++) {
        const int r = P.row_of[i];
        if (P.seen[r]++ == 0) continue; /* first call: one-time costs */
        const double ms = P.clock.elapsed_ms(be, 2 * i, 2 * i + 1);
        if (ms >= 0) P.ms[r] += ms, P.count[r]++;
    }
    P.n_pending = 0;
}

static int begin(kn_backend *be, const char *name) {
    if (P.n_pending == PROF_PENDING) harvest(be);
    const int i = P.n_pending++;
    P.row_of[i] = row_for(name);
    P.clock.mark(be, 2 * i);
    return i;
}
static void end(kn_backend *be, int i) { P.clock.mark(be, 2 * i + 1); }
/* an optional op that declined (did nothing): its bracket is dropped */
static void drop(int i) {
    if (i == P.n_pending - 1) P.n_pending--;
}

#define WRAP(op, name, params, args)                                                                                   \
    static void p_##op params {                                                                                        \
        const int i = begin(be, name);                                                                                 \
        P.real->op args;                                                                                               \
        end(be, i);                                                                                                    \
    }
WRAP(embed, "embed", (kn_backend * be, const kn_weight *t, const int32_t *ids, int n, float *out), (be, t, ids, n, out))
WRAP(rms_norm, "rms_norm",
     (kn_backend * be, const float *x, int64_t xs, float *out, int64_t os, int rows, int groups, int dim,
      const float *w, float eps),
     (be, x, xs, out, os, rows, groups, dim, w, eps))
WRAP(layer_norm, "layer_norm",
     (kn_backend * be, const float *x, int64_t xs, float *out, int64_t os, int rows, int dim, const float *w,
      const float *b, float eps),
     (be, x, xs, out, os, rows, dim, w, b, eps))
WRAP(rope, "rope",
     (kn_backend * be, float *x, int64_t stride, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
      const kn_rope_table *r),
     (be, x, stride, n_tokens, n_heads, head_dim, pos, r))
WRAP(kv_write, "kv_write",
     (kn_backend * be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride, int n, const int32_t *s),
     (be, kv, k, v, stride, n, s))
WRAP(kv_convert, "kv_convert", (kn_backend * be, const kn_kv_layer *kv, const int32_t *src, const int32_t *dst, int n),
     (be, kv, src, dst, n))
WRAP(swiglu, "swiglu", (kn_backend * be, const float *gu, int rows, int dim, float *out), (be, gu, rows, dim, out))
WRAP(gelu, "gelu", (kn_backend * be, const float *x, int64_t n, float *out, int approx), (be, x, n, out, approx))
WRAP(geglu, "geglu", (kn_backend * be, const float *gu, int rows, int dim, float *out, int approx),
     (be, gu, rows, dim, out, approx))
WRAP(add, "add", (kn_backend * be, float *y, const float *x, int64_t n), (be, y, x, n))
WRAP(scale, "scale", (kn_backend * be, float *x, int64_t n, float s), (be, x, n, s))
WRAP(softcap, "softcap", (kn_backend * be, float *x, int64_t n, float cap), (be, x, n, cap))
WRAP(mul_rows, "mul_rows", (kn_backend * be, float *y, const float *x, int64_t xs, int rows, int dim),
     (be, y, x, xs, rows, dim))
WRAP(sigmoid_gate_add, "sigmoid_gate_add",
     (kn_backend * be, float *y, const float *x, const float *gate, int rows, int dim), (be, y, x, gate, rows, dim))
WRAP(moe_route, "moe_route",
     (kn_backend * be, const float *logits, int rows, int n_experts, int k, int norm_topk, const float *es,
      int32_t *idx, float *w),
     (be, logits, rows, n_experts, k, norm_topk, es, idx, w))
WRAP(moe_ffn, "moe_ffn", (kn_backend * be, const kn_moe_args *a), (be, a))
WRAP(sample_rows, "sample_rows",
     (kn_backend * be, float *x, int rows, int V, const kn_sample_params *p, const kn_logit_edit *e, int32_t *out),
     (be, x, rows, V, p, e, out))
WRAP(argmax_rows, "argmax_rows", (kn_backend * be, const float *x, int rows, int dim, int32_t *out),
     (be, x, rows, dim, out))
WRAP(gather_rows, "gather_rows", (kn_backend * be, const float *x, int64_t dim, const int32_t *rows, int n, float *out),
     (be, x, dim, rows, n, out))
#undef WRAP

static void p_attention(kn_backend *be, const kn_attention_args *a) {
    char name[64];
    snprintf(name, sizeof name, "attention T=%d", a->n_tokens);
    const int i = begin(be, name);
    P.real->attention(be, a);
    end(be, i);
}
/* matmul and matmul_add: one row per op and shape */
static int matmul_row(kn_backend *be, const char *op, int M, const kn_weight *w) {
    char name[64];
    snprintf(name, sizeof name, "%s M=%d N=%lld K=%lld", op, M, (long long)w->rows, (long long)w->cols);
    return begin(be, name);
}
static void p_matmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    const int i = matmul_row(be, "matmul", M, w);
    P.real->matmul(be, x, M, w, bias, out);
    end(be, i);
}
static int p_matmul_add(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    const int i = matmul_row(be, "matmul_add", M, w);
    const int done = P.real->matmul_add(be, x, M, w, bias, out);
    if (done) end(be, i);
    else drop(i);
    return done;
}

static int p_fused_matmul(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                          const float *bias, float *out, int epi) {
    char name[64];
    snprintf(name, sizeof name, "fused%s%s M=%d N=%lld K=%lld", norm_w ? "_norm" : "", epi ? "_swiglu" : "", M,
             (long long)w->rows, (long long)w->cols);
    const int i = begin(be, name);
    const int done = P.real->fused_matmul(be, x, M, norm_w, eps, w, bias, out, epi);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static int p_mlp_swiglu_add(kn_backend *be, const float *xn, int M, const float *norm_w, float eps,
                            const kn_weight *gu, const float *gu_bias, const kn_weight *down, const float *down_bias,
                            float *x) {
    char name[64];
    snprintf(name, sizeof name, "mlp_swiglu_add M=%d I=%lld H=%lld", M, (long long)down->cols, (long long)down->rows);
    const int i = begin(be, name);
    const int done = P.real->mlp_swiglu_add(be, xn, M, norm_w, eps, gu, gu_bias, down, down_bias, x);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static int p_rope_kv_write(kn_backend *be, float *qk, const float *v, int64_t stride, int n_tokens, int n_q_heads,
                           int n_kv_heads, int head_dim, const int32_t *pos, const kn_rope_table *rope,
                           const kn_kv_layer *kv, const int32_t *slots, const float *q_norm, const float *k_norm,
                           float eps) {
    const int i = begin(be, "rope_kv_write");
    const int done = P.real->rope_kv_write(be, qk, v, stride, n_tokens, n_q_heads, n_kv_heads, head_dim, pos, rope,
                                           kv, slots, q_norm, k_norm, eps);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static int p_rope_kv_attention(kn_backend *be, const kn_rope_kv_args *r, const kn_attention_args *a) {
    const int i = begin(be, "rope_kv_attention");
    const int done = P.real->rope_kv_attention(be, r, a);
    if (done) end(be, i);
    else drop(i);
    return done;
}
static void p_sync(kn_backend *be) {
    P.real->sync(be);
    harvest(be);
}
static void p_download(kn_backend *be, void *d, const void *s, size_t n) {
    P.real->download(be, d, s, n);
    harvest(be);
}
static void p_destroy(kn_backend *be) {
    harvest(be);
    double all = 0;
    for (int i = 0; i < P.n_rows; i++) all += P.ms[i];
    char head[96];
    snprintf(head, sizeof head, "op (%s; first calls out)", P.title);
    fprintf(stderr, "%-44s %8s %10s %9s %6s\n", head, "calls", "total ms", "mean us", "share");
    for (int k = 0; k < P.n_rows; k++) {
        int best = -1;
        for (int i = 0; i < P.n_rows; i++)
            if (P.count[i] > 0 && (best < 0 || P.ms[i] > P.ms[best])) best = i;
        if (best < 0) break; /* the rest never timed a call (declined, or only a first call) */
        fprintf(stderr, "%-44s %8ld %10.2f %9.2f %5.1f%%\n", P.name[best], P.count[best], P.ms[best],
                1e3 * P.ms[best] / P.count[best], all > 0 ? 100.0 * P.ms[best] / all : 0.0);
        P.count[best] = -1;
    }
    if (P.clock.release) P.clock.release(be);
    P.real->destroy(be);
}

const kn_backend_vtbl *kn_profile_vtbl(const kn_backend_vtbl *real, const kn_profile_clock *clock, const char *title) {
    memset(&P, 0, sizeof P);
    P.real = real, P.clock = *clock, P.title = title;
    prof_vt = *real;
    /* every op a forward calls; optional ones only where the backend has them */
#define SET(op) (prof_vt.op = real->op ? p_##op : NULL)
    SET(embed), SET(rms_norm), SET(layer_norm), SET(rope), SET(kv_write), SET(kv_convert), SET(swiglu), SET(gelu);
    SET(geglu), SET(add), SET(scale), SET(softcap), SET(mul_rows), SET(sigmoid_gate_add), SET(moe_route);
    SET(moe_ffn), SET(sample_rows), SET(argmax_rows), SET(gather_rows), SET(attention), SET(matmul), SET(matmul_add);
    SET(fused_matmul), SET(mlp_swiglu_add), SET(rope_kv_write), SET(rope_kv_attention);
#undef SET
    prof_vt.sync = p_sync, prof_vt.download = p_download, prof_vt.destroy = p_destroy;
    prof_vt.graph_replay = NULL, prof_vt.graph_begin = NULL, prof_vt.graph_end = NULL;
    return &prof_vt;
}

/* test_kv_e2e.c — end-to-end KV-format gates of KV_FORMATS.md: teacher-
 * forced mean KL of each compressed format against the same model with a
 * bf16 KV cache (kiln's own run is the reference, no oracle), on every
 * fixture architecture in tests/fixtures:
 *   q8, fp8 <= 0.005;  k8v3, tq4, q4 <= 0.04  (k4v3, q8s are recorded).
 * The fixtures' head_dim (16/32) is below what the rotated formats take (and
 * below the 32-wide groups of q8/q4), so each architecture's config is
 * re-shaped to head_dim 64 (hidden = heads x 64) with random weights at the
 * fixtures' scale (uniform +-0.02); boundary layers are off, every layer is
 * compressed. These models are nearly uniform (entropy ~ log V), so the gate
 * is weak; KILN_KV_E2E_SHARP=1 rescales every matrix to unit gain (sharper
 * q/k, logits entropy ~3 nats) and records the KLs without gating them. The
 * unmodified fixtures are also run (recorded; their q8/q4 groups are 16 wide).
 * Prints the KL tables that docs/FEATURES.md records. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/synthetic.h"
#include "io/model_config.h"
#include "kv/kv_paged.h"
#include "models/model.h"
#include "test_backend.h"
#include "test_util.h"

#define N_IDS 48
#define N_FMT 8
static const char *const fmts[N_FMT] = {"bf16", "q8", "fp8", "q4", "k8v3", "tq4", "k4v3", "q8s"};
static const double gates[N_FMT] = {0, 0.005, 0.005, 0.04, 0.04, 0.04, -1, -1}; /* -1: recorded only */

static const char *backend_name(void) {
    const char *b = getenv("KILN_TEST_BACKEND");
    return b ? b : "cpu";
}

/* A tensor source over a synthetic store that rescales every matrix to unit
 * gain (uniform +-gain*sqrt(3/in)); q/k projections and the output head get
 * more gain. Scaled copies are made on first use and owned here. */
typedef struct {
    kn_tensor_source inner;
    kn_st_tensor *made[1024];
    int n, sharp; /* sharp 0: the synthetic weights as they are */
} gain_src;

static const kn_st_tensor *gain_find(void *ctx, const char *name) {
    gain_src *g = ctx;
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->made[i]->name, name)) return g->made[i];
    const kn_st_tensor *t = g->inner.find(g->inner.ctx, name);
    if (!g->sharp || !t || t->ndim < 2 || t->dtype != KN_DT_F32 || g->n == 1024) return t;
    const double in = (double)t->shape[t->ndim - 1];
    double gain = 1.0;
    if (strstr(name, "q_proj") || strstr(name, "k_proj")) gain = 1.6;
    if (strstr(name, "lm_head") || strstr(name, "embed_tokens.weight")) gain = 3.0;
    const float f = (float)(gain * sqrt(3.0 / in) / 0.02); /* synthetic weights are uniform +-0.02 */
    kn_st_tensor *c = malloc(sizeof *c);
    float *data = malloc(t->nbytes);
    if (!c || !data) {
        free(c), free(data);
        return t;
    }
    *c = *t;
    c->name = strdup(name);
    const float *src = t->data;
    for (size_t i = 0; i < t->nbytes / 4; i++) data[i] = src[i] * f;
    c->data = data;
    g->made[g->n++] = c;
    return c;
}

static void gain_free(gain_src *g) {
    for (int i = 0; i < g->n; i++) free(g->made[i]->name), free((void *)g->made[i]->data), free(g->made[i]);
}

/* config.json of dir re-shaped to head_dim 64 (per-layer head dims scaled
 * alike) into tmp/config.json */
static int reshape_config(const char *dir, const char *tmp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return -1;
    json_t *c = json_object_get(root, "text_config");
    if (!json_is_object(c)) c = root;
    json_int_t heads = json_integer_value(json_object_get(c, "num_attention_heads"));
    if (heads <= 0) {
        json_decref(root);
        return -1;
    }
    /* per-layer head dims (gemma4's global layers) keep their ratio to the base head dim */
    const json_int_t hd0 = json_integer_value(json_object_get(c, "head_dim"));
    json_t *plc = json_object_get(c, "per_layer_config"), *lc;
    const char *lk;
    json_object_foreach(plc, lk, lc) {
        const json_int_t hd = json_integer_value(json_object_get(lc, "head_dim"));
        if (hd > 0 && hd0 > 0) json_object_set_new(lc, "head_dim", json_integer(hd * 64 / hd0));
    }
    const json_int_t ghd = json_integer_value(json_object_get(c, "global_head_dim"));
    if (ghd > 0 && hd0 > 0) json_object_set_new(c, "global_head_dim", json_integer(ghd * 64 / hd0));
    json_object_set_new(c, "head_dim", json_integer(64));
    json_object_set_new(c, "hidden_size", json_integer(heads * 64));
    /* longrope: one factor per rotated pair; stretch the lists to the new rotary dim */
    json_t *rs = json_object_get(c, "rope_parameters");
    if (!json_is_object(rs)) rs = json_object_get(c, "rope_scaling");
    if (json_is_object(rs)) {
        json_t *pf = json_object_get(rs, "partial_rotary_factor");
        if (!json_is_number(pf)) pf = json_object_get(c, "partial_rotary_factor");
        const int pairs = (int)(64 * (json_is_number(pf) ? json_number_value(pf) : 1.0)) / 2;
        const char *lists[2] = {"long_factor", "short_factor"};
        for (int i = 0; i < 2; i++) {
            json_t *old = json_object_get(rs, lists[i]);
            const size_t n_old = json_is_array(old) ? json_array_size(old) : 0;
            if (!n_old || pairs <= 0) continue;
            json_t *a = json_array();
            for (int k = 0; k < pairs; k++) json_array_append(a, json_array_get(old, (size_t)k * n_old / (size_t)pairs));
            json_object_set_new(rs, lists[i], a);
        }
    }
    snprintf(path, sizeof path, "%s/config.json", tmp);
    int rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    return rc;
}

static double mean_entropy(const float *l, int rows, int V) {
    double tot = 0;
    for (int r = 0; r < rows; r++) {
        const float *a = l + (size_t)r * V;
        double mx = -1e300, s = 0, h = 0;
        for (int i = 0; i < V; i++) mx = a[i] > mx ? a[i] : mx;
        for (int i = 0; i < V; i++) s += exp(a[i] - mx);
        for (int i = 0; i < V; i++) {
            double lp = a[i] - mx - log(s);
            h -= exp(lp) * lp;
        }
        tot += h;
    }
    return tot / rows;
}

/* KL of every format vs bf16 on a config + source; kl[f] = -1 when the
 * format refuses the shape. */
static int run_formats(const kn_model_config *cfg, const kn_tensor_source *src, const int32_t *ids, double *kl,
                       double *entropy) {
    const int V = cfg->vocab_size;
    float *ref = malloc((size_t)N_IDS * V * 4), *out = malloc((size_t)N_IDS * V * 4);
    int ok = 1;
    for (int f = 0; f < N_FMT && ok; f++) {
        kn_error err = {0};
        kn_kv_spec spec;
        kn_kv_spec_parse(fmts[f], 0, &spec, &err);
        kn_backend *be;
        kn_model *m;
        if (kn_backend_create(backend_name(), 2, &be, &err)) ok = 0;
        else if (kn_model_build_kv(cfg, src, be, 64, 1, &spec, &m, &err)) {
            kl[f] = -1; /* refused (head_dim); the model build owns and freed be */
            CHECK(err.code == KN_ERR_UNSUPPORTED, "%s: %s", fmts[f], err.msg);
            continue;
        } else {
            kn_code rc = kn_model_logits(m, ids, N_IDS, f ? out : ref, &err);
            CHECK(rc == KN_OK, "%s logits: %s", fmts[f], err.msg);
            kn_model_close(m);
            kl[f] = f ? kn_test_mean_kl(ref, out, N_IDS, V) : 0.0;
        }
    }
    *entropy = mean_entropy(ref, N_IDS, V);
    free(ref), free(out);
    return ok;
}

static void report(const char *what, const double *kl, double entropy, int gated) {
    printf("| %-22s | %5.2f |", what, entropy);
    for (int f = 1; f < N_FMT; f++) {
        if (kl[f] < 0) printf("   n/a   |");
        else printf(" %.1e |", kl[f]);
        if (gated && kl[f] >= 0 && gates[f] > 0)
            CHECK(kl[f] <= gates[f], "%s %s: KL %.3g > %.3g", what, fmts[f], kl[f], gates[f]);
    }
    printf("\n");
}

/* ---- delayed conversion (--kv-start) ------------------------------------------ */

/* Feed ids[0, n) to m in the given chunks (then single tokens), logits of
 * every position into out [n, V]. */
static kn_code feed(kn_model *m, kn_kv_seq *sq, const int32_t *ids, int from, int n, const int *chunks, float *out,
                    kn_error *err) {
    kn_kv_seq *seqs[1] = {sq};
    int32_t pos[64], seq0[64] = {0}, rows[64];
    for (int c0 = from, k = 0; c0 < n; k++) {
        int len = chunks[k] > 0 ? chunks[k] : 1;
        if (c0 + len > n) len = n - c0;
        for (int i = 0; i < len; i++) pos[i] = c0 + i, rows[i] = i;
        kn_batch b = {.n_tokens = len, .tokens = ids + c0, .pos = pos, .seq = seq0, .n_seqs = 1, .seqs = seqs,
                      .n_logits = len, .logit_rows = rows};
        kn_code rc = kn_model_forward(m, &b, out + (size_t)c0 * m->cfg.vocab_size, err);
        if (rc) return rc;
        sq->n_tokens = c0 += len;
        if (chunks[k] <= 0) k--; /* 0 ends the list: single tokens from here on */
    }
    return KN_OK;
}

/* Rows of positions [0, n) of one pool's layers copied from model b's
 * cache to model d's, decoded from b's format and written through d's
 * kv_write (ring layers: through the ring slots, later positions last, so
 * d's ring ends as b's). */
static void copy_rows(kn_model *mb, const kn_kv_seq *qb, kn_model *md, const kn_kv_seq *qd, int ring, int n) {
    const kn_kv_pool *pb = ring ? mb->kv->ring : mb->kv, *pd = ring ? md->kv->ring : md->kv;
    for (int l = 0; pb && l < pb->n_layers; l++) {
        const kn_kv_layer *L = &pb->layers[l];
        const int D = L->head_dim, H = L->n_kv_heads;
        const int64_t rb = kn_kv_row_bytes(L->k_fmt, D);
        float *k = malloc((size_t)H * D * 4), *v = malloc((size_t)H * D * 4);
        for (int t = 0; t < n; t++) {
            const int32_t sl = ring ? kn_kv_seq_ring_slot(mb->kv, qb, t) : kn_kv_seq_slot(mb->kv, qb, t);
            const int32_t dl = ring ? kn_kv_seq_ring_slot(md->kv, qd, t) : kn_kv_seq_slot(md->kv, qd, t);
            for (int h = 0; h < H; h++) {
                kn_kv_aux none = {NULL, NULL, 1.0f};
                kn_kv_decode(L->k_fmt, (const uint8_t *)L->k + ((int64_t)sl * H + h) * rb, D, &none, k + (int64_t)h * D);
                kn_kv_decode(L->v_fmt, (const uint8_t *)L->v + ((int64_t)sl * H + h) * rb, D, &none, v + (int64_t)h * D);
            }
            md->be->vt->kv_write(md->be, &pd->layers[l], k, v, (int64_t)H * D, 1, &dl);
        }
        free(k), free(v);
    }
}

/* A batch mixing a staged sequence (below N) and a converted one (past N),
 * the converted one first: kn_model_forward puts the staged tokens first and
 * kn_dec_attention runs them through the staging views. Each row's logits
 * must equal its sequence's logits in a batch of its own (bit for bit: the
 * GEMV rows and the attention of a token do not depend on the batch). */
static void test_delayed_mixed(const char *name, const kn_model_config *cfg, const kn_tensor_source *src, int N,
                               int max_chunk, const int *chunks) {
    const int V = cfg->vocab_size, nx = N + 8, ny = N - 8; /* X is converted, Y staged */
    int32_t ids[2][128];
    uint64_t s = 11;
    for (int q = 0; q < 2; q++)
        for (int k = 0; k <= nx; k++) ids[q][k] = (int32_t)((kn_test_rand(&s) + 1.0f) * 0.5f * (V - 1));
    kn_error err = {0};
    kn_kv_spec sp;
    kn_kv_spec_parse("k8v3", 0, &sp, &err);
    sp.kv_start = N;
    float *scratch = calloc((size_t)(nx + 1) * V, 4), *mixed = calloc(2 * (size_t)V, 4), *solo = calloc(2 * (size_t)V, 4);
    int ok = 1;
    kn_kv_spec plain = kn_kv_spec_default(KN_DT_BF16);
    float *ref = calloc((size_t)V, 4);
    for (int run = 0; ok && run < 4; run++) { /* 0: the mixed batch; 1, 2: X, then Y, alone; 3: Y on bf16 */
        kn_backend *be;
        kn_model *m = NULL;
        ok = !kn_backend_create(backend_name(), 2, &be, &err) && (be->prefill_chunk = max_chunk) &&
             !kn_model_build_kv(cfg, src, be, 128, 2, run == 3 ? &plain : &sp, &m, &err);
        CHECK(ok, "delayed mixed %s: model: %s", name, err.msg);
        if (!ok) break;
        kn_kv_seq x = {0}, y = {0};
        ok = !kn_kv_seq_reserve(m->kv, &x, nx + 1, &err) && !kn_kv_seq_reserve(m->kv, &y, ny + 1, &err) &&
             (run == 2 || !feed(m, &x, ids[0], 0, nx, chunks, scratch, &err)) &&
             (run == 1 || !feed(m, &y, ids[1], 0, ny, chunks, scratch, &err));
        CHECK(ok, "delayed mixed %s: prefix: %s", name, err.msg);
        if (ok) {
            CHECK(run >= 2 || x.converted_at == N, "delayed mixed %s: X is converted", name);
            CHECK(run == 1 || !y.converted_at, "delayed mixed %s: Y is staged", name);
            /* one step: X's token (converted) first, Y's (staged) second */
            kn_kv_seq *seqs[2] = {&x, &y};
            int32_t tok[2] = {ids[0][nx], ids[1][ny]}, pos[2] = {nx, ny}, sq[2] = {0, 1}, rows[2] = {1, 0};
            kn_batch b = {.tokens = tok, .pos = pos, .seq = sq, .n_seqs = 2, .seqs = seqs, .logit_rows = rows};
            const int one = run == 1 ? 0 : 1; /* the token of a solo run */
            if (run == 0) b.n_tokens = 2, b.n_logits = 2; /* logits rows Y, X */
            else b.tokens += one, b.pos += one, b.seq += one, b.n_tokens = 1, b.n_logits = 1, b.logit_rows = rows + 1,
                 rows[1] = 0;
            ok = !kn_model_forward(m, &b, run == 0 ? mixed : run == 1 ? solo + V : run == 2 ? solo : ref, &err);
            CHECK(ok, "delayed mixed %s: step: %s", name, err.msg);
        }
        kn_kv_seq_release(m->kv, &x), kn_kv_seq_release(m->kv, &y);
        kn_model_close(m);
    }
    if (ok) { /* the CPU: bit for bit; a GPU may pick other matmul kernels for two rows than for one */
        const int exact = !strcmp(backend_name(), "cpu");
        double d[2] = {0, 0}, mx = 0;
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < V; i++) {
                const double e = fabs((double)mixed[r * V + i] - solo[r * V + i]);
                d[r] = e > d[r] || isnan(e) ? e : d[r];
                mx = fabs(solo[r * V + i]) > mx ? fabs(solo[r * V + i]) : mx;
            }
        CHECK(exact ? !memcmp(mixed, solo, (size_t)V * 4) : d[0] <= 1e-4 * mx,
              "delayed mixed %s: the staged row differs from Y alone (max |d| %.3g)", name, d[0]);
        CHECK(exact ? !memcmp(mixed + V, solo + V, (size_t)V * 4) : d[1] <= 1e-4 * mx,
              "delayed mixed %s: the converted row differs from X alone (max |d| %.3g)", name, d[1]);
        /* a staged sequence is a bf16 cache: the same kernels on the same rows */
        CHECK(!memcmp(solo, ref, (size_t)V * 4), "delayed mixed %s: staged Y differs from Y on a bf16 cache", name);
    }
    free(scratch), free(mixed), free(solo), free(ref);
    printf("delayed conversion %s, a batch of a staged and a converted sequence: %s\n", name,
           kn_test_failures ? "checked (see failures)" : "each row as its sequence alone");
}

/* KV_FORMATS.md / issue 5: a --kv-start N cache gives logits identical to a
 * bf16 cache before N and to an immediately converted cache after N (one
 * whose first N rows were written as bf16 and re-encoded at N). T tokens in
 * chunks (0 ends the list: single tokens from there), prefill chunks of at
 * most max_chunk, a context of ctx. With a sliding-window ring (ring = 1:
 * the model must get one) the ring's entries stage too; when the ring is
 * shorter than N it wraps while still bf16. */
static void test_delayed(const char *name, const kn_model_config *cfg, const kn_tensor_source *src, int N, int T,
                         int ctx, int max_chunk, const int *chunks, int ring) {
    const int V = cfg->vocab_size;
    int32_t ids[128];
    uint64_t s = 3;
    for (int k = 0; k < T; k++) ids[k] = (int32_t)((kn_test_rand(&s) + 1.0f) * 0.5f * (V - 1));
    float *la = calloc((size_t)T * V, 4), *lb = calloc((size_t)T * V, 4), *ld = calloc((size_t)T * V, 4);
    kn_error err = {0};
    kn_kv_spec sa, sd, sb = kn_kv_spec_default(KN_DT_BF16);
    kn_kv_spec_parse("k8v3", 0, &sa, &err);
    sd = sa;
    sa.kv_start = N;
    kn_backend *ba, *bb, *bd;
    kn_model *ma = NULL, *mb = NULL, *md = NULL;
    const char *bn = "cpu"; /* the reference cache is read and written from the host below */
    int ok = !kn_backend_create(bn, 2, &ba, &err) && (ba->prefill_chunk = max_chunk) &&
             !kn_model_build_kv(cfg, src, ba, ctx, 1, &sa, &ma, &err) && !kn_backend_create(bn, 2, &bb, &err) &&
             (bb->prefill_chunk = max_chunk) && !kn_model_build_kv(cfg, src, bb, ctx, 1, &sb, &mb, &err) &&
             !kn_backend_create(bn, 2, &bd, &err) && (bd->prefill_chunk = max_chunk) &&
             !kn_model_build_kv(cfg, src, bd, ctx, 1, &sd, &md, &err);
    CHECK(ok, "delayed %s: models: %s", name, err.msg);
    ok = ok && (!ring || (ma->kv->ring && mb->kv->ring && md->kv->ring));
    CHECK(ok || !ma, "delayed %s: the model has no sliding-window ring", name);
    kn_kv_seq qa = {0}, qb = {0}, qd = {0};
    if (ok) {
        ok = !kn_kv_seq_reserve(ma->kv, &qa, T, &err) && !kn_kv_seq_reserve(mb->kv, &qb, T, &err) &&
             !kn_kv_seq_reserve(md->kv, &qd, T, &err);
        CHECK(ok, "delayed %s: reserve: %s", name, err.msg);
        CHECK(qa.blocks[0] >= ma->kv->n_blocks && qa.blocks[N / 16] < ma->kv->n_blocks,
              "delayed %s: blocks below N are staging blocks, the rest compressed", name);
        if (ring) {
            const kn_kv_pool *r = ma->kv->ring;
            const int staged = N / 16 < ma->kv->ring_blocks ? N / 16 : ma->kv->ring_blocks;
            int stage_ok = qa.n_ring_shadow == staged;
            for (int i = 0; i < qa.n_ring; i++) stage_ok &= (qa.ring[i] >= r->n_blocks) == (i < staged);
            CHECK(stage_ok, "delayed %s: ring entries below N / 16 are staging blocks (%d of %d)", name,
                  qa.n_ring_shadow, qa.n_ring);
        }
    }
    /* chunks never straddle N */
    if (ok) {
        const int len = max_chunk < 40 ? max_chunk : 40;
        int32_t pos[40], seq0[40] = {0};
        for (int i = 0; i < len; i++) pos[i] = N - len / 2 + i;
        kn_kv_seq *one[1] = {&qa};
        kn_batch b = {.n_tokens = len, .tokens = ids, .pos = pos, .seq = seq0, .n_seqs = 1, .seqs = one};
        CHECK(kn_model_forward(ma, &b, NULL, &err) == KN_ERR_INVALID_ARG && strstr(err.msg, "straddle"),
              "delayed %s: a chunk across N is refused (%s)", name, err.msg);
        CHECK(kn_kv_max_append(ma->kv, &qa, N - 10, 40) == 10 && kn_kv_max_append(ma->kv, &qa, N, 40) == 40 &&
                  kn_kv_max_append(ma->kv, &qa, 0, N) == N,
              "delayed %s: kn_kv_max_append caps at N", name);
    }
    /* B (bf16) up to N, D = B's rows re-encoded, then both on to T */
    int k_at_n = 0; /* the chunk that starts at N */
    for (int p = 0; p < N; k_at_n++) p += chunks[k_at_n] > 0 ? chunks[k_at_n] : 1;
    if (ok) ok = !feed(ma, &qa, ids, 0, T, chunks, la, &err) && !feed(mb, &qb, ids, 0, N, chunks, lb, &err);
    CHECK(ok && qa.converted_at == N, "delayed %s: run: %s (converted at %d)", name, err.msg, qa.converted_at);
    if (ok && ring) {
        int conv_ok = qa.n_ring_shadow == 0;
        for (int i = 0; i < qa.n_ring; i++) conv_ok &= qa.ring[i] < ma->kv->ring->n_blocks;
        CHECK(conv_ok && ma->kv->ring->n_stage_free == ma->kv->ring->n_stage_blocks,
              "delayed %s: after N every ring entry is compressed and the ring's staging blocks are free", name);
    }
    if (ok) {
        copy_rows(mb, &qb, md, &qd, 0, N);
        copy_rows(mb, &qb, md, &qd, 1, N);
        qd.n_tokens = N;
        ok = !feed(md, &qd, ids, N, T, chunks + k_at_n, ld, &err) && !feed(mb, &qb, ids, N, T, chunks + k_at_n, lb, &err);
        CHECK(ok, "delayed %s: converted reference: %s", name, err.msg);
    }
    if (ok) {
        CHECK(!memcmp(la, lb, (size_t)N * V * 4), "delayed %s: logits before N differ from the bf16 cache's", name);
        CHECK(!memcmp(la + (size_t)N * V, ld + (size_t)N * V, (size_t)(T - N) * V * 4),
              "delayed %s: logits after N differ from the immediately converted cache's", name);
        CHECK(memcmp(la + (size_t)N * V, lb + (size_t)N * V, (size_t)(T - N) * V * 4) != 0,
              "delayed %s: after N the cache is compressed (differs from bf16)", name);
    }
    if (ma) kn_kv_seq_release(ma->kv, &qa), kn_model_close(ma);
    if (mb) kn_kv_seq_release(mb->kv, &qb), kn_model_close(mb);
    if (md) kn_kv_seq_release(md->kv, &qd), kn_model_close(md);
    free(la), free(lb), free(ld);
    printf("delayed conversion %s (--kv-start %d, k8v3%s): %s\n", name, N,
           ring ? ", sliding-window ring" : "", kn_test_failures ? "checked (see failures)" : "identical as required");
}

int main(void) {
    const char *fx = kn_test_fixtures();
    const int brc = kn_test_backend_probe("test_kv_e2e");
    if (brc) return brc;
    const int sharp = getenv("KILN_KV_E2E_SHARP") != NULL;
    DIR *d = opendir(fx);
    if (!d) {
        fprintf(stderr, "test_kv_e2e: no fixtures at %s\n", fx);
        return 1;
    }
    char names[64][256];
    int n_dirs = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_dirs < 64) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s/model.safetensors", fx, e->d_name);
        if (e->d_name[0] != '.' && !stat(p, &st)) snprintf(names[n_dirs++], 256, "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n_dirs, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    printf("| fixture (head_dim 64%s) | H(bf16) |", sharp ? ", sharp" : "");
    for (int f = 1; f < N_FMT; f++) printf(" %-7s |", fmts[f]);
    printf("\n");
    int n_arch = 0;
    for (int i = 0; i < n_dirs; i++) {
        char dir[4096], tmp[] = "/tmp/kiln_kv_e2e_XXXXXX";
        snprintf(dir, sizeof dir, "%s/%s", fx, names[i]);
        kn_model_config cfg;
        kn_error err = {0};
        if (kn_config_load(dir, &cfg, &err) || !strcmp(cfg.model_type, "whisper")) continue;
        if (!mkdtemp(tmp)) continue;
        int ok = reshape_config(dir, tmp) == 0 && kn_config_load(tmp, &cfg, &err) == KN_OK;
        char cp[4096];
        snprintf(cp, sizeof cp, "%s/config.json", tmp);
        unlink(cp), rmdir(tmp);
        CHECK(ok, "%s: re-shaped config: %s", names[i], err.msg);
        if (!ok) continue;
        kn_synthetic *syn;
        if (kn_synthetic_create(&cfg, KN_DT_F32, 1000 + i, 2, &syn, &err)) {
            CHECK(0, "%s: synthetic: %s", names[i], err.msg);
            continue;
        }
        if (cfg.moe_parallel) { /* gemma4: skipped, said out loud, while the synthetic weights lack its MoE block */
            kn_tensor_source ps = kn_synthetic_source(syn);
            kn_backend *pb;
            kn_model *pm = NULL;
            kn_error perr = {0};
            kn_code prc = kn_backend_create("cpu", 1, &pb, &perr) ? KN_ERR_INTERNAL
                                                                   : kn_model_build(&cfg, &ps, pb, 64, 1, &pm, &perr);
            if (pm) kn_model_close(pm);
            if (prc == KN_ERR_FORMAT && strstr(perr.msg, "missing tensor")) {
                printf("| %-22s | skipped: the synthetic weights do not cover it (%s) |\n", names[i], perr.msg);
                kn_synthetic_free(syn);
                continue;
            }
        }
        gain_src g = {.inner = kn_synthetic_source(syn), .sharp = sharp};
        kn_tensor_source src = {.find = gain_find, .ctx = &g, .borrow = g.inner.borrow};
        int32_t ids[N_IDS];
        uint64_t s = 77 + i;
        for (int k = 0; k < N_IDS; k++) ids[k] = (int32_t)((kn_test_rand(&s) + 1.0f) * 0.5f * (cfg.vocab_size - 1));
        double kl[N_FMT], ent;
        if (run_formats(&cfg, &src, ids, kl, &ent)) report(names[i], kl, ent, !sharp), n_arch++;
        {   /* delayed conversion: prefill to N, a chunk after it, then decode steps (test_delayed reads and
             * writes the caches on the host: the CPU only; the mixed batch on the test's backend) */
            static const int plain[] = {32, 16, 0}, ringed[] = {16, 16, 16, 16, 16, 0};
            const int host = !getenv("KILN_TEST_BACKEND");
            if (!strcmp(names[i], "llama")) {
                if (host) test_delayed(names[i], &cfg, &src, 32, 60, 64, 512, plain, 0);
                test_delayed_mixed(names[i], &cfg, &src, 32, 512, plain);
            }
            if (!strcmp(names[i], "gemma2")) test_delayed_mixed(names[i], &cfg, &src, 64, 16, ringed);
            /* a ring of (window 8 + 15 + 15) / 16 = 2 blocks (32 positions): it wraps below N = 64 */
            if (!strcmp(names[i], "gemma2") && host) test_delayed(names[i], &cfg, &src, 64, 100, 128, 16, ringed, 1);
        }
        gain_free(&g);
        kn_synthetic_free(syn);
    }
    CHECK(n_arch >= 10, "only %d fixture architectures ran", n_arch);
    /* the fixtures as committed (head_dim 16/32: rotated formats refuse) */
    printf("| fixture (as committed) | H(bf16) |\n");
    for (int i = 0; i < n_dirs; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", fx, names[i]);
        kn_model_config cfg;
        kn_error err = {0};
        if (kn_config_load(dir, &cfg, &err) || !strcmp(cfg.model_type, "whisper")) continue;
        const int V = cfg.vocab_size;
        float *ref = malloc((size_t)N_IDS * V * 4), *out = malloc((size_t)N_IDS * V * 4);
        int32_t ids[N_IDS];
        uint64_t s = 5 + i;
        for (int k = 0; k < N_IDS; k++) ids[k] = (int32_t)((kn_test_rand(&s) + 1.0f) * 0.5f * (V - 1));
        double kl[N_FMT];
        for (int f = 0; f < N_FMT; f++) {
            kn_model_options o = {.backend = backend_name(), .n_threads = 2, .max_context = 64, .kv = fmts[f],
                                  .kv_keep_layers = -1};
            kn_model *m;
            kl[f] = -1;
            if (kn_model_open(dir, &o, &m, &err)) {
                CHECK(err.code == KN_ERR_UNSUPPORTED, "%s %s: %s", names[i], fmts[f], err.msg);
                continue;
            }
            CHECK(kn_model_logits(m, ids, N_IDS, f ? out : ref, &err) == KN_OK, "%s: %s", names[i], err.msg);
            kn_model_close(m);
            kl[f] = f ? kn_test_mean_kl(ref, out, N_IDS, V) : 0.0;
        }
        report(names[i], kl, mean_entropy(ref, N_IDS, V), 0);
        free(ref), free(out);
    }
    return kn_test_done("test_kv_e2e");
}

/* model.c — the public model API (kiln.h): open a checkpoint directory,
 * describe it, teacher-forced logits. Architecture specifics live in the
 * family files (llama.c); this file only wires config + weights + backend. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"

/* The checkpoint as the decoder sees it: decoder names ("model.layers...",
 * "lm_head.weight") mapped into a multimodal wrapper's language-model prefix,
 * and a mark on every tensor the model reads, so what is left over can be
 * reported instead of silently dropped. */
typedef struct {
    kn_safetensors *st;
    const char *prefix;  /* replaces the leading "model." (wrappers); NULL = none */
    const char *lm_head; /* the wrapper's output head name; NULL = "lm_head.weight" */
    uint8_t *used;       /* [kn_st_count(st)] */
} st_view;

static const kn_st_tensor *view_find(void *ctx, const char *name) {
    st_view *v = ctx;
    char buf[512];
    if (v->prefix && !strncmp(name, "model.", 6)) {
        snprintf(buf, sizeof buf, "%s%s", v->prefix, name + 6);
        name = buf;
    } else if (v->lm_head && !strcmp(name, "lm_head.weight")) {
        name = v->lm_head;
    }
    const kn_st_tensor *t = kn_st_find(v->st, name);
    if (t && v->used) v->used[t - kn_st_at(v->st, 0)] = 1;
    return t;
}

/* Language-model tensor layouts of multimodal checkpoints (transformers 5
 * saves model.language_model.*, published transformers 4 checkpoints
 * language_model.model.*). */
static const struct {
    const char *prefix, *lm_head;
} text_layouts[] = {{"model.language_model.", "lm_head.weight"},
                    {"language_model.model.", "language_model.lm_head.weight"}};

/* "N tensors under A, M under B" for the tensors nobody read, grouped by
 * their first name component, or first two under a "model." or
 * "language_model." root (names are sorted, so groups are runs). */
static void describe_unused(const st_view *v, char *out, size_t cap) {
    size_t n = kn_st_count(v->st), len = 0;
    out[0] = 0;
    for (size_t i = 0; i < n;) {
        if (v->used[i]) { i++; continue; }
        const char *name = kn_st_at(v->st, i)->name;
        const char *dot = strchr(name, '.');
        if (dot && (!strncmp(name, "model.", 6) || !strncmp(name, "language_model.", 15)) && strchr(dot + 1, '.'))
            dot = strchr(dot + 1, '.');
        size_t klen = dot ? (size_t)(dot - name) : strlen(name);
        size_t count = 0, j = i;
        for (; j < n && !strncmp(kn_st_at(v->st, j)->name, name, klen) &&
               (kn_st_at(v->st, j)->name[klen] == '.' || kn_st_at(v->st, j)->name[klen] == 0);
             j++)
            count += !v->used[j];
        if (len + klen + 48 < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s%zu tensor%s under %.*s", len ? ", " : "", count,
                                    count == 1 ? "" : "s", (int)klen, name);
        i = j > i ? j : i + 1;
    }
}

kn_code kn_model_open(const char *dir, const kn_model_options *opts, kn_model **out, kn_error *err) {
    *out = NULL;
    kn_model_options o = {0};
    if (opts) o = *opts;
    kn_model_config cfg;
    kn_code rc = kn_config_load(dir, &cfg, err);
    if (rc) return rc;
    kn_safetensors *st;
    if ((rc = kn_st_open(dir, &st, err))) return rc;
    st_view view = {.st = st, .used = calloc(kn_st_count(st) + 1, 1)};
    if (!view.used) {
        kn_st_close(st);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    if (cfg.wrapper_type[0]) {
        for (size_t i = 0; i < sizeof text_layouts / sizeof *text_layouts && !view.prefix; i++) {
            char probe[128];
            snprintf(probe, sizeof probe, "%sembed_tokens.weight", text_layouts[i].prefix);
            if (kn_st_find(st, probe)) view.prefix = text_layouts[i].prefix, view.lm_head = text_layouts[i].lm_head;
        }
        if (!view.prefix) {
            free(view.used);
            kn_st_close(st);
            return kn_fail(err, KN_ERR_FORMAT,
                           "%s: a %s checkpoint but no language-model tensors (model.language_model.* or "
                           "language_model.model.*)", dir, cfg.wrapper_type);
        }
    }
    kn_backend *be;
    if ((rc = kn_backend_create(o.backend, o.n_threads, &be, err))) {
        free(view.used);
        kn_st_close(st);
        return rc;
    }
    be->memory_fraction = o.gpu_memory;
    int ctx = o.max_context > 0 ? o.max_context : cfg.max_position_embeddings;
    if (o.max_context <= 0 && cfg.rope.type == KN_ROPE_DYNAMIC && cfg.rope.factor > 1.0) /* NTK scaling extends it */
        ctx = (int)fmin(16384.0, cfg.max_position_embeddings * cfg.rope.factor);
    if (o.max_context <= 0 && ctx > 16384) ctx = 16384;
    if (be->max_positions > 0 && ctx > be->max_positions) {
        if (o.max_context > 0) {
            kn_backend_destroy(be);
            free(view.used);
            kn_st_close(st);
            return kn_fail(err, KN_ERR_UNSUPPORTED, "context %d exceeds the %s backend's limit of %d positions", ctx,
                           be->vt->name, be->max_positions);
        }
        ctx = be->max_positions;
    }
    kn_tensor_source src = {.find = view_find, .ctx = &view, .borrow = KN_BORROW_MAPPED};
    kn_model *m;
    kn_kv_spec kv;
    if (o.kv_start > 0 && !o.kv) rc = kn_fail(err, KN_ERR_INVALID_ARG, "--kv-start needs --kv FORMAT");
    else if (o.kv && !(rc = kn_kv_spec_parse(o.kv, o.kv_keep_layers == 0 ? -1 : o.kv_keep_layers < 0 ? 0 : o.kv_keep_layers,
                                             &kv, err)))
        kv.kv_start = o.kv_start > 0 ? (o.kv_start + KN_KV_BLOCK_SIZE - 1) / KN_KV_BLOCK_SIZE * KN_KV_BLOCK_SIZE : 0;
    if (rc) {
        kn_backend_destroy(be);
        free(view.used);
        kn_st_close(st);
        return rc;
    }
    if ((rc = kn_model_build_kv(&cfg, &src, be, ctx, o.max_seqs > 0 ? o.max_seqs : 1, o.kv ? &kv : NULL, &m, err))) {
        free(view.used);
        kn_st_close(st);
        return kn_fail_wrap(err, "%s", dir);
    }
    m->st = st;
    /* what the backend copied is read from its copies from now on; what it
     * uses in place faults back in from the page cache */
    kn_st_release_pages(st);
    char unused[384];
    describe_unused(&view, unused, sizeof unused);
    if (cfg.wrapper_type[0])
        snprintf(m->notes, sizeof m->notes, "%s checkpoint: running its language model (text_config, %s*); ignored: %s%s%s",
                 cfg.wrapper_type, view.prefix, cfg.ignored_configs, cfg.ignored_configs[0] && unused[0] ? "; " : "",
                 unused);
    else if (unused[0])
        snprintf(m->notes, sizeof m->notes, "checkpoint tensors not used by %s: %s", cfg.model_type, unused);
    free(view.used);
    *out = m;
    return KN_OK;
}

void kn_model_close(kn_model *m) { kn_model_free_internal(m); }

int kn_model_vocab_size(const kn_model *m) { return m->cfg.vocab_size; }

const char *kn_model_describe(const kn_model *m) { return m->desc; }

const char *kn_model_notes(const kn_model *m) { return m->notes; }

kn_code kn_model_logits(kn_model *m, const int32_t *ids, int n_ids, float *out, kn_error *err) {
    if (n_ids <= 0) return kn_fail(err, KN_ERR_INVALID_ARG, "no token ids given");
    if (n_ids > m->max_context)
        return kn_fail(err, KN_ERR_INVALID_ARG, "%d ids exceed the context of %d tokens", n_ids, m->max_context);
    kn_kv_seq seq = {0};
    kn_code rc = kn_kv_seq_reserve(m->kv, &seq, n_ids, err);
    int32_t *pos = malloc((size_t)m->max_chunk * 4), *rows = malloc((size_t)m->max_chunk * 4),
            *sidx = calloc((size_t)m->max_chunk, 4);
    if (!rc && (!pos || !rows || !sidx)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_kv_seq *seqs[1] = {&seq};
    for (int c0 = 0, n = 0; !rc && c0 < n_ids; c0 += n) {
        n = kn_kv_max_append(m->kv, &seq, c0, n_ids - c0 < m->max_chunk ? n_ids - c0 : m->max_chunk);
        for (int i = 0; i < n; i++) pos[i] = c0 + i, rows[i] = i;
        const int32_t rope_len = n_ids; /* one transformers forward over all ids */
        kn_batch b = {.n_tokens = n, .tokens = ids + c0, .pos = pos, .seq = sidx, .n_seqs = 1, .seqs = seqs,
                      .n_logits = n, .logit_rows = rows, .rope_len = &rope_len};
        rc = kn_model_forward(m, &b, out + (size_t)c0 * m->cfg.vocab_size, err);
        seq.n_tokens = c0 + n;
    }
    free(pos), free(rows), free(sidx);
    kn_kv_seq_release(m->kv, &seq);
    return rc;
}

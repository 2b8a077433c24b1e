/* model.c — the public model API (kiln.h): open a checkpoint directory,
 * describe it, teacher-forced logits. Architecture specifics live in the
 * family files (llama.c); this file only wires config + weights + backend. */
#include <stdlib.h>
#include <string.h>

#include "models/model.h"

static const kn_st_tensor *st_find(void *ctx, const char *name) { return kn_st_find(ctx, name); }

kn_code kn_model_open(const char *dir, const kn_model_options *opts, kn_model **out, kn_error *err) {
    *out = NULL;
    kn_model_options o = {0};
    if (opts) o = *opts;
    kn_model_config cfg;
    kn_code rc = kn_config_load(dir, &cfg, err);
    if (rc) return rc;
    kn_safetensors *st;
    if ((rc = kn_st_open(dir, &st, err))) return rc;
    kn_backend *be;
    if ((rc = kn_backend_create(o.backend, o.n_threads, &be, err))) {
        kn_st_close(st);
        return rc;
    }
    int ctx = o.max_context > 0 ? o.max_context : cfg.max_position_embeddings;
    if (o.max_context <= 0 && ctx > 16384) ctx = 16384;
    if (be->max_positions > 0 && ctx > be->max_positions) {
        if (o.max_context > 0) {
            kn_backend_destroy(be);
            kn_st_close(st);
            return kn_fail(err, KN_ERR_UNSUPPORTED, "context %d exceeds the %s backend's limit of %d positions", ctx,
                           be->vt->name, be->max_positions);
        }
        ctx = be->max_positions;
    }
    kn_tensor_source src = {.find = st_find, .ctx = st, .outlives_model = 1};
    kn_model *m;
    if ((rc = kn_model_build(&cfg, &src, be, ctx, o.max_seqs > 0 ? o.max_seqs : 1, &m, err))) {
        kn_st_close(st);
        return kn_fail_wrap(err, "%s", dir);
    }
    m->st = st;
    *out = m;
    return KN_OK;
}

void kn_model_close(kn_model *m) { kn_model_free_internal(m); }

int kn_model_vocab_size(const kn_model *m) { return m->cfg.vocab_size; }

const char *kn_model_describe(const kn_model *m) { return m->desc; }

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
    for (int c0 = 0; !rc && c0 < n_ids; c0 += m->max_chunk) {
        int n = n_ids - c0 < m->max_chunk ? n_ids - c0 : m->max_chunk;
        for (int i = 0; i < n; i++) pos[i] = c0 + i, rows[i] = i;
        kn_batch b = {.n_tokens = n, .tokens = ids + c0, .pos = pos, .seq = sidx, .n_seqs = 1, .seqs = seqs,
                      .n_logits = n, .logit_rows = rows};
        rc = kn_model_forward(m, &b, out + (size_t)c0 * m->cfg.vocab_size, err);
        seq.n_tokens = c0 + n;
    }
    free(pos), free(rows), free(sidx);
    kn_kv_seq_release(m->kv, &seq);
    return rc;
}

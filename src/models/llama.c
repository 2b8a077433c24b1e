/* llama.c — the Llama-family decoder (llama, mistral, qwen2, qwen3, phi3):
 * weight loading from HF tensor names and the batched forward pass.
 *
 * Per layer, top to bottom (matching transformers' modeling_llama):
 *   h = x + o_proj(attn(rope(qk_norm(q)), rope(qk_norm(k)), v))   q,k,v = qkv_proj(rms_norm(x))
 *   x = h + down_proj(silu(gate) * up)                            gate,up = gate_up_proj(rms_norm(h))
 * Architecture differences are data, not code paths: fused or separate
 * projections (fused here at load), optional biases (present tensors decide),
 * optional per-head q/k RMSNorm (qwen3), per-layer sliding windows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/rope.h"

#define MAX_CHUNK 512
#define MAX_LOGIT_ROWS 16

static const kn_st_tensor *find(const kn_tensor_source *src, const char *fmt, int layer) {
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    return src->find(src->ctx, name);
}

static kn_code check_shape(const kn_st_tensor *t, const char *name, int64_t rows, int64_t cols, kn_error *err) {
    int ok = cols ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) : (t->ndim == 1 && t->shape[0] == rows);
    if (ok) return KN_OK;
    char got[128] = "";
    int n = 0;
    for (int i = 0; i < t->ndim && n < (int)sizeof got - 24; i++)
        n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (cols)
        return kn_fail(err, KN_ERR_FORMAT, "tensor %s has shape [%s], expected [%lld, %lld] from config.json", name,
                       got, (long long)rows, (long long)cols);
    return kn_fail(err, KN_ERR_FORMAT, "tensor %s has shape [%s], expected [%lld] from config.json", name, got,
                   (long long)rows);
}

static kn_code check_float(const kn_st_tensor *t, const char *name, kn_error *err) {
    if (t->dtype == KN_DT_F32 || t->dtype == KN_DT_BF16 || t->dtype == KN_DT_F16) return KN_OK;
    return kn_fail(err, KN_ERR_UNSUPPORTED, "tensor %s has dtype %s (supported: F32, BF16, F16)", name,
                   kn_dtype_name(t->dtype));
}

/* Read a vector tensor (norm weight / bias) converted to f32 into host[n].
 * Returns KN_OK with *found = 0 when absent and not required. */
static kn_code read_vec(const kn_tensor_source *src, const char *fmt, int layer, int64_t n, int required,
                        float *host, int *found, kn_error *err) {
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    const kn_st_tensor *t = src->find(src->ctx, name);
    *found = t != NULL;
    if (!t) return required ? kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name) : KN_OK;
    kn_code rc = check_float(t, name, err);
    if (!rc) rc = check_shape(t, name, n, 0, err);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) host[i] = kn_load_f32(t->data, t->dtype, i);
    return KN_OK;
}

/* Upload host[n] floats into new backend memory. */
static kn_code upload_vec(kn_model *m, const float *host, int64_t n, float **out, kn_error *err) {
    *out = kn_be_alloc(m->be, (size_t)n * sizeof(float));
    if (!*out) return kn_fail(err, KN_ERR_NOMEM, "out of memory for a %lld-float vector", (long long)n);
    kn_be_upload(m->be, *out, host, (size_t)n * sizeof(float));
    return KN_OK;
}

/* A vector (norm weight / bias) as f32 backend memory; NULL when absent and optional. */
static kn_code load_vec(kn_model *m, const kn_tensor_source *src, const char *fmt, int layer, int64_t n,
                        int required, float **out, kn_error *err) {
    *out = NULL;
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    int found;
    kn_code rc = read_vec(src, fmt, layer, n, required, host, &found, err);
    if (!rc && found) rc = upload_vec(m, host, n, out, err);
    free(host);
    return rc;
}

/* Load one or more row blocks (same dtype, same cols) as one fused weight.
 * A single part is used in place when the source outlives the model. */
typedef struct {
    const char *fmt;
    int64_t rows;
} part_spec;

static kn_code load_fused(kn_model *m, const kn_tensor_source *src, int layer, const part_spec *parts, int n_parts,
                          int64_t cols, kn_weight *out, kn_error *err) {
    const kn_st_tensor *ts[4];
    char name[4][256];
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        snprintf(name[i], sizeof name[i], parts[i].fmt, layer);
        ts[i] = src->find(src->ctx, name[i]);
        if (!ts[i]) return kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name[i]);
        kn_code rc = check_float(ts[i], name[i], err);
        if (!rc) rc = check_shape(ts[i], name[i], parts[i].rows, cols, err);
        if (rc) return rc;
        if (ts[i]->dtype != ts[0]->dtype)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "tensors %s and %s have different dtypes", name[0], name[i]);
        total += parts[i].rows;
    }
    if (n_parts == 1) return kn_be_weight_load(m->be, ts[0]->dtype, total, cols, ts[0]->data, src->outlives_model, out, err);
    size_t esz = kn_dtype_size(ts[0]->dtype);
    uint8_t *host = malloc((size_t)total * (size_t)cols * esz);
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory fusing %s", name[0]);
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        memcpy(host + off, ts[i]->data, ts[i]->nbytes);
        off += ts[i]->nbytes;
    }
    kn_code rc = kn_be_weight_load(m->be, ts[0]->dtype, total, cols, host, 0, out, err);
    free(host);
    return rc;
}

/* Optional fused bias: all parts present, or none (mixed presence is an error). */
static kn_code load_fused_bias(kn_model *m, const kn_tensor_source *src, int layer, const part_spec *parts,
                               int n_parts, float **out, kn_error *err) {
    *out = NULL;
    int present = 0;
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        present += find(src, parts[i].fmt, layer) != NULL;
        total += parts[i].rows;
    }
    if (!present) return KN_OK;
    if (present != n_parts) {
        char name[256];
        snprintf(name, sizeof name, parts[0].fmt, layer);
        return kn_fail(err, KN_ERR_FORMAT, "some but not all biases next to %s are present", name);
    }
    float *host = malloc((size_t)total * sizeof(float));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory for biases");
    int64_t off = 0;
    kn_code rc = KN_OK;
    for (int i = 0; i < n_parts && !rc; i++) {
        int found;
        rc = read_vec(src, parts[i].fmt, layer, parts[i].rows, 1, host + off, &found, err);
        off += parts[i].rows;
    }
    if (!rc) rc = upload_vec(m, host, total, out, err);
    free(host);
    return rc;
}

static kn_code load_layer(kn_model *m, const kn_tensor_source *src, int l, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    kn_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    kn_code rc;
    if (c->fused_qkv) {
        part_spec qkv[] = {{"model.layers.%d.self_attn.qkv_proj.weight", m->qkv_dim}};
        part_spec qkvb[] = {{"model.layers.%d.self_attn.qkv_proj.bias", m->qkv_dim}};
        if ((rc = load_fused(m, src, l, qkv, 1, H, &L->qkv, err))) return rc;
        if ((rc = load_fused_bias(m, src, l, qkvb, 1, &L->qkv_bias, err))) return rc;
    } else {
        part_spec qkv[] = {{"model.layers.%d.self_attn.q_proj.weight", m->q_dim},
                           {"model.layers.%d.self_attn.k_proj.weight", m->kv_dim},
                           {"model.layers.%d.self_attn.v_proj.weight", m->kv_dim}};
        part_spec qkvb[] = {{"model.layers.%d.self_attn.q_proj.bias", m->q_dim},
                            {"model.layers.%d.self_attn.k_proj.bias", m->kv_dim},
                            {"model.layers.%d.self_attn.v_proj.bias", m->kv_dim}};
        if ((rc = load_fused(m, src, l, qkv, 3, H, &L->qkv, err))) return rc;
        if ((rc = load_fused_bias(m, src, l, qkvb, 3, &L->qkv_bias, err))) return rc;
    }
    part_spec o[] = {{"model.layers.%d.self_attn.o_proj.weight", H}};
    if ((rc = load_fused(m, src, l, o, 1, m->q_dim, &L->o, err))) return rc;
    if ((rc = load_vec(m, src, "model.layers.%d.self_attn.o_proj.bias", l, H, 0, &L->o_bias, err))) return rc;
    if (c->fused_gate_up) {
        part_spec gu[] = {{"model.layers.%d.mlp.gate_up_proj.weight", 2 * I}};
        part_spec gub[] = {{"model.layers.%d.mlp.gate_up_proj.bias", 2 * I}};
        if ((rc = load_fused(m, src, l, gu, 1, H, &L->gate_up, err))) return rc;
        if ((rc = load_fused_bias(m, src, l, gub, 1, &L->gate_up_bias, err))) return rc;
    } else {
        part_spec gu[] = {{"model.layers.%d.mlp.gate_proj.weight", I}, {"model.layers.%d.mlp.up_proj.weight", I}};
        part_spec gub[] = {{"model.layers.%d.mlp.gate_proj.bias", I}, {"model.layers.%d.mlp.up_proj.bias", I}};
        if ((rc = load_fused(m, src, l, gu, 2, H, &L->gate_up, err))) return rc;
        if ((rc = load_fused_bias(m, src, l, gub, 2, &L->gate_up_bias, err))) return rc;
    }
    part_spec down[] = {{"model.layers.%d.mlp.down_proj.weight", H}};
    if ((rc = load_fused(m, src, l, down, 1, I, &L->down, err))) return rc;
    if ((rc = load_vec(m, src, "model.layers.%d.mlp.down_proj.bias", l, H, 0, &L->down_bias, err))) return rc;
    if ((rc = load_vec(m, src, "model.layers.%d.input_layernorm.weight", l, H, 1, &L->attn_norm, err))) return rc;
    if ((rc = load_vec(m, src, "model.layers.%d.post_attention_layernorm.weight", l, H, 1, &L->mlp_norm, err)))
        return rc;
    if (c->qk_norm) {
        if ((rc = load_vec(m, src, "model.layers.%d.self_attn.q_norm.weight", l, c->head_dim, 1, &L->q_norm, err)))
            return rc;
        if ((rc = load_vec(m, src, "model.layers.%d.self_attn.k_norm.weight", l, c->head_dim, 1, &L->k_norm, err)))
            return rc;
    }
    return KN_OK;
}

static void free_model_memory(kn_model *m) {
    kn_backend *be = m->be;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            kn_layer *L = &m->layers[l];
            kn_be_weight_free(be, &L->qkv), kn_be_weight_free(be, &L->o);
            kn_be_weight_free(be, &L->gate_up), kn_be_weight_free(be, &L->down);
            float *vecs[] = {L->qkv_bias, L->o_bias, L->gate_up_bias, L->down_bias,
                             L->attn_norm, L->mlp_norm, L->q_norm, L->k_norm};
            for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++) kn_be_free(be, vecs[i]);
        }
        free(m->layers);
    }
    if (m->lm_head.data != m->embed.data) kn_be_weight_free(be, &m->lm_head);
    kn_be_weight_free(be, &m->embed);
    kn_be_free(be, m->final_norm);
    kn_be_free(be, (void *)m->rope.inv_freq);
    float *scratch[] = {m->x, m->xn, m->qkv, m->attn, m->gu, m->act, m->tmp, m->logits};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) kn_be_free(be, scratch[i]);
    int32_t *idx[] = {m->d_tokens, m->d_pos, m->d_seq, m->d_slots, m->d_bt, m->d_rows};
    for (size_t i = 0; i < sizeof idx / sizeof *idx; i++) kn_be_free(be, idx[i]);
    free(m->h_bt);
    kn_kv_pool_destroy(m->kv);
}

void kn_model_free_internal(kn_model *m) {
    if (!m) return;
    free_model_memory(m);
    kn_backend_destroy(m->be);
    kn_st_close(m->st);
    free(m);
}

kn_code kn_model_build(const kn_model_config *cfg, const kn_tensor_source *src, kn_backend *be, int max_context,
                       int max_seqs, kn_model **out, kn_error *err) {
    *out = NULL;
    kn_model *m = calloc(1, sizeof *m);
    if (!m) {
        kn_backend_destroy(be);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    m->cfg = *cfg;
    m->be = be;
    const kn_model_config *c = &m->cfg;
    m->q_dim = c->n_heads * c->head_dim;
    m->kv_dim = c->n_kv_heads * c->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->max_context = max_context;
    m->max_seqs = max_seqs;
    m->max_chunk = MAX_CHUNK;
    /* a decode step of every sequence fits one logits chunk */
    m->logits_rows = max_seqs > MAX_LOGIT_ROWS ? (max_seqs < MAX_CHUNK ? max_seqs : MAX_CHUNK) : MAX_LOGIT_ROWS;
    kn_code rc = KN_OK;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto fail; }

    const kn_st_tensor *emb = src->find(src->ctx, "model.embed_tokens.weight");
    if (!emb) { rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor model.embed_tokens.weight"); goto fail; }
    if ((rc = check_float(emb, "model.embed_tokens.weight", err)) ||
        (rc = check_shape(emb, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, err)) ||
        (rc = kn_be_weight_load(be, emb->dtype, c->vocab_size, c->hidden_size, emb->data, src->outlives_model,
                                &m->embed, err)))
        goto fail;
    const kn_st_tensor *head = src->find(src->ctx, "lm_head.weight");
    if (head && !c->tie_word_embeddings) {
        part_spec hp[] = {{"lm_head.weight", c->vocab_size}};
        if ((rc = load_fused(m, src, 0, hp, 1, c->hidden_size, &m->lm_head, err))) goto fail;
    } else if (!head && !c->tie_word_embeddings) {
        rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint has no lm_head.weight and tie_word_embeddings is false");
        goto fail;
    } else {
        m->lm_head = m->embed; /* tied: same memory, owned by embed */
        m->lm_head.owned = 0;
    }
    if ((rc = load_vec(m, src, "model.norm.weight", 0, c->hidden_size, 1, &m->final_norm, err))) goto fail;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(m, src, l, err))) goto fail;

    /* rope */
    int rot = (int)(c->head_dim * c->rope.partial_rotary_factor);
    float inv_freq[512];
    if ((rc = kn_rope_frequencies(c, rot, inv_freq, &m->rope.attn_scale, err))) goto fail;
    float *dfreq = kn_be_alloc(be, (size_t)(rot / 2) * sizeof(float));
    if (!dfreq) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto fail; }
    kn_be_upload(be, dfreq, inv_freq, (size_t)(rot / 2) * sizeof(float));
    m->rope.inv_freq = dfreq;
    m->rope.rot_dim = rot;

    /* scratch */
    const size_t T = (size_t)m->max_chunk, F = sizeof(float);
    m->x = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->xn = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->tmp = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->qkv = kn_be_alloc(be, T * (size_t)m->qkv_dim * F);
    m->attn = kn_be_alloc(be, T * (size_t)m->q_dim * F);
    m->gu = kn_be_alloc(be, T * 2 * (size_t)c->intermediate_size * F);
    m->act = kn_be_alloc(be, T * (size_t)c->intermediate_size * F);
    m->logits = kn_be_alloc(be, (size_t)m->logits_rows * (size_t)c->vocab_size * F);
    m->max_blocks = (max_context + KN_KV_BLOCK_SIZE - 1) / KN_KV_BLOCK_SIZE;
    m->d_tokens = kn_be_alloc(be, T * 4), m->d_pos = kn_be_alloc(be, T * 4), m->d_seq = kn_be_alloc(be, T * 4);
    m->d_slots = kn_be_alloc(be, T * 4), m->d_rows = kn_be_alloc(be, T * 4);
    m->d_bt = kn_be_alloc(be, (size_t)max_seqs * (size_t)m->max_blocks * 4);
    m->h_bt = malloc((size_t)max_seqs * (size_t)m->max_blocks * 4);
    if (!m->x || !m->xn || !m->tmp || !m->qkv || !m->attn || !m->gu || !m->act || !m->logits || !m->d_tokens ||
        !m->d_pos || !m->d_seq || !m->d_slots || !m->d_rows || !m->d_bt || !m->h_bt) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for activations");
        goto fail;
    }
    if ((rc = kn_kv_pool_create(be, c->n_layers, c->n_kv_heads, c->head_dim, KN_KV_BLOCK_SIZE,
                                (int64_t)m->max_blocks * max_seqs, &m->kv, err)))
        goto fail;
    snprintf(m->desc, sizeof m->desc, "%s: %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d, %s weights",
             c->model_type, c->n_layers, c->hidden_size, c->n_heads, c->n_kv_heads, c->head_dim,
             c->intermediate_size, c->vocab_size, kn_dtype_name(m->embed.dtype));
    *out = m;
    return KN_OK;
fail:
    kn_model_free_internal(m);
    return rc;
}

int64_t kn_model_weight_bytes(const kn_model *m) {
    int64_t b = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        const kn_weight *ws[] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        for (int i = 0; i < 4; i++) b += ws[i]->rows * ws[i]->cols * (int64_t)kn_dtype_size(ws[i]->dtype);
    }
    b += m->lm_head.rows * m->lm_head.cols * (int64_t)kn_dtype_size(m->lm_head.dtype);
    return b;
}

/* x += in . W^T (+ bias): fused where the backend has matmul_add, else
 * through tmp. */
static void matmul_residual(kn_backend *be, const float *in, int n, const kn_weight *w, const float *bias, float *x,
                            float *tmp, int64_t n_x) {
    if (be->vt->matmul_add) {
        be->vt->matmul_add(be, in, n, w, bias, x);
        return;
    }
    be->vt->matmul(be, in, n, w, bias, tmp);
    be->vt->add(be, x, tmp, n_x);
}

/* Enqueue the whole forward of batch b (index arrays already uploaded);
 * logits_host NULL leaves the (single) logits chunk on the backend. */
static void forward_compute(kn_model *m, const kn_batch *b, float *logits_host) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const int n = b->n_tokens, H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const kn_backend_vtbl *op = be->vt;
    const float eps = (float)c->rms_norm_eps;
    op->embed(be, &m->embed, m->d_tokens, n, m->x);
    for (int l = 0; l < c->n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        op->rms_norm(be, m->x, H, m->xn, H, n, 1, H, L->attn_norm, eps);
        op->matmul(be, m->xn, n, &L->qkv, L->qkv_bias, m->qkv);
        float *q = m->qkv, *k = m->qkv + m->q_dim, *v = k + m->kv_dim;
        if (c->qk_norm) {
            op->rms_norm(be, q, m->qkv_dim, q, m->qkv_dim, n, c->n_heads, hd, L->q_norm, eps);
            op->rms_norm(be, k, m->qkv_dim, k, m->qkv_dim, n, c->n_kv_heads, hd, L->k_norm, eps);
        }
        op->rope(be, q, m->qkv_dim, n, c->n_heads, hd, m->d_pos, &m->rope);
        op->rope(be, k, m->qkv_dim, n, c->n_kv_heads, hd, m->d_pos, &m->rope);
        op->kv_write(be, &m->kv->layers[l], k, v, m->qkv_dim, n, m->d_slots);
        kn_attention_args a = {
            .q = q, .q_stride = m->qkv_dim, .out = m->attn, .n_tokens = n, .n_heads = c->n_heads,
            .scale = 1.0f / sqrtf((float)hd), .window = c->layer_sliding[l] ? c->sliding_window : 0,
            .pos = m->d_pos, .seq = m->d_seq, .block_tables = m->d_bt, .max_blocks = m->max_blocks,
            .kv = &m->kv->layers[l], .pos_host = b->pos, .seq_host = b->seq, .compute_dtype = L->qkv.dtype,
        };
        op->attention(be, &a);
        matmul_residual(be, m->attn, n, &L->o, L->o_bias, m->x, m->tmp, (int64_t)n * H);
        op->rms_norm(be, m->x, H, m->xn, H, n, 1, H, L->mlp_norm, eps);
        op->matmul(be, m->xn, n, &L->gate_up, L->gate_up_bias, m->gu);
        op->swiglu(be, m->gu, n, I, m->act);
        matmul_residual(be, m->act, n, &L->down, L->down_bias, m->x, m->tmp, (int64_t)n * H);
    }
    /* logits for the requested rows, a few rows at a time */
    for (int r0 = 0; r0 < b->n_logits; r0 += m->logits_rows) {
        int nr = b->n_logits - r0 < m->logits_rows ? b->n_logits - r0 : m->logits_rows;
        op->gather_rows(be, m->x, H, m->d_rows + r0, nr, m->xn);
        op->rms_norm(be, m->xn, H, m->xn, H, nr, 1, H, m->final_norm, eps);
        op->matmul(be, m->xn, nr, &m->lm_head, NULL, m->logits);
        if (logits_host) /* eager: fetch each chunk; recorded: the caller fetches the single chunk */
            kn_be_download(be, logits_host + (size_t)r0 * c->vocab_size, m->logits,
                           (size_t)nr * c->vocab_size * sizeof(float));
    }
}

kn_code kn_model_forward(kn_model *m, const kn_batch *b, float *logits, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const int n = b->n_tokens;
    if (n <= 0 || n > m->max_chunk || b->n_seqs > m->max_seqs)
        return kn_fail(err, KN_ERR_INVALID_ARG, "forward: batch of %d tokens / %d sequences exceeds %d / %d", n,
                       b->n_seqs, m->max_chunk, m->max_seqs);
    int32_t slots[MAX_CHUNK];
    for (int t = 0; t < n; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->vocab_size)
            return kn_fail(err, KN_ERR_INVALID_ARG, "token id %d is outside the vocabulary (0..%d)", b->tokens[t],
                           c->vocab_size - 1);
        const kn_kv_seq *s = b->seqs[b->seq[t]];
        if (b->pos[t] < 0 || b->pos[t] >= m->max_context || b->pos[t] / KN_KV_BLOCK_SIZE >= s->n_blocks)
            return kn_fail(err, KN_ERR_INVALID_ARG, "position %d has no reserved KV block (context %d)", b->pos[t],
                           m->max_context);
        slots[t] = kn_kv_seq_slot(m->kv, s, b->pos[t]);
    }
    /* block tables, one row per sequence */
    int32_t *bt_host = m->h_bt;
    memset(bt_host, 0, (size_t)b->n_seqs * (size_t)m->max_blocks * sizeof(int32_t));
    for (int s = 0; s < b->n_seqs; s++)
        memcpy(bt_host + (size_t)s * m->max_blocks, b->seqs[s]->blocks, (size_t)b->seqs[s]->n_blocks * 4);
    kn_be_upload(be, m->d_bt, bt_host, (size_t)b->n_seqs * (size_t)m->max_blocks * 4);
    kn_be_upload(be, m->d_tokens, b->tokens, (size_t)n * 4);
    kn_be_upload(be, m->d_pos, b->pos, (size_t)n * 4);
    kn_be_upload(be, m->d_seq, b->seq, (size_t)n * 4);
    kn_be_upload(be, m->d_slots, slots, (size_t)n * 4);

    if (b->n_logits > 0) kn_be_upload(be, m->d_rows, b->logit_rows, (size_t)b->n_logits * 4);

    /* A decode-shaped batch (one token per sequence, logits in one chunk) is
     * recorded once per shape and replayed where the backend supports it. */
    const kn_backend_vtbl *op = be->vt;
    uint64_t key = 0;
    if (op->graph_replay && n == b->n_seqs && b->n_logits <= m->logits_rows)
        key = ((uint64_t)n << 32) | ((uint64_t)b->n_logits << 8) | 1u;
    if (key && op->graph_replay(be, key)) {
        kn_be_download(be, logits, m->logits, (size_t)b->n_logits * c->vocab_size * sizeof(float));
        return KN_OK;
    }
    int recording = key && op->graph_begin(be, key);
    forward_compute(m, b, key ? NULL : logits);
    if (recording && !op->graph_end(be, key)) forward_compute(m, b, NULL);
    if (key && b->n_logits > 0)
        kn_be_download(be, logits, m->logits, (size_t)b->n_logits * c->vocab_size * sizeof(float));
    kn_be_sync(be);
    return KN_OK;
}

/* synthetic.c — see synthetic.h. Tensor names and shapes mirror what
 * transformers saves for the architecture, so the real loader path is what
 * the benchmark exercises. */
#include "engine/synthetic.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kn_synthetic {
    kn_st_tensor *t;
    size_t n, cap;
};

static const kn_st_tensor *syn_find(void *ctx, const char *name) {
    kn_synthetic *s = ctx;
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    return NULL;
}

kn_tensor_source kn_synthetic_source(kn_synthetic *s) {
    return (kn_tensor_source){.find = syn_find, .ctx = s, .outlives_model = 1};
}

void kn_synthetic_free(kn_synthetic *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free((void *)s->t[i].data);
    }
    free(s->t);
    free(s);
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static kn_code add(kn_synthetic *s, kn_dtype dt, int64_t rows, int64_t cols, float center, float scale,
                   uint64_t seed, int n_threads, kn_error *err, const char *fmt, int layer) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        kn_st_tensor *nt = realloc(s->t, cap * sizeof *nt);
        if (!nt) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        s->t = nt, s->cap = cap;
    }
    kn_st_tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    int64_t count = rows * (cols ? cols : 1);
    size_t esz = kn_dtype_size(dt);
    void *data = NULL;
    t->name = strdup(name);
    if (!t->name || posix_memalign(&data, 64, (size_t)count * esz) != 0) {
        free(t->name);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for synthetic %s", name);
    }
    uint64_t base = mix(seed ^ mix((uint64_t)s->n + 1));
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < count; i++) {
        float u = (float)(mix(base + (uint64_t)i) >> 40) * (1.0f / 16777216.0f); /* [0,1) */
        float v = center + scale * (2.0f * u - 1.0f);
        if (dt == KN_DT_F32) ((float *)data)[i] = v;
        else if (dt == KN_DT_BF16) ((uint16_t *)data)[i] = kn_f32_to_bf16(v);
        else ((uint16_t *)data)[i] = kn_f32_to_f16(v);
    }
    t->dtype = dt;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->nbytes = (size_t)count * esz;
    t->data = data;
    s->n++;
    return KN_OK;
}

kn_code kn_synthetic_create(const kn_model_config *c, kn_dtype dt, uint64_t seed, int n_threads, kn_synthetic **out,
                            kn_error *err) {
    *out = NULL;
    if (dt != KN_DT_F32 && dt != KN_DT_BF16 && dt != KN_DT_F16)
        return kn_fail(err, KN_ERR_INVALID_ARG, "synthetic weights must be f32, bf16 or f16");
    kn_synthetic *s = calloc(1, sizeof *s);
    if (!s) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    const int64_t H = c->hidden_size, I = c->intermediate_size, q = (int64_t)c->n_heads * c->head_dim,
                  kv = (int64_t)c->n_kv_heads * c->head_dim;
    const float ws = 0.02f;
    kn_code rc = add(s, dt, c->vocab_size, H, 0, ws, seed, n_threads, err, "model.embed_tokens.weight", 0);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        if (c->fused_qkv) rc = add(s, dt, q + 2 * kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.qkv_proj.weight", l);
        else {
            rc = add(s, dt, q, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.q_proj.weight", l);
            if (!rc) rc = add(s, dt, kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.k_proj.weight", l);
            if (!rc) rc = add(s, dt, kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.v_proj.weight", l);
        }
        if (!rc && c->attention_bias) {
            rc = add(s, dt, q, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.q_proj.bias", l);
            if (!rc) rc = add(s, dt, kv, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.k_proj.bias", l);
            if (!rc) rc = add(s, dt, kv, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (!rc) rc = add(s, dt, H, q, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.o_proj.weight", l);
        if (!rc && c->fused_gate_up) rc = add(s, dt, 2 * I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate_up_proj.weight", l);
        else if (!rc) {
            rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate_proj.weight", l);
            if (!rc) rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.up_proj.weight", l);
        }
        if (!rc) rc = add(s, dt, H, I, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.down_proj.weight", l);
        if (!rc) rc = add(s, dt, H, 0, 1, 0.1f, seed, n_threads, err, "model.layers.%d.input_layernorm.weight", l);
        if (!rc) rc = add(s, dt, H, 0, 1, 0.1f, seed, n_threads, err, "model.layers.%d.post_attention_layernorm.weight", l);
        if (!rc && c->qk_norm) {
            rc = add(s, dt, c->head_dim, 0, 1, 0.1f, seed, n_threads, err, "model.layers.%d.self_attn.q_norm.weight", l);
            if (!rc) rc = add(s, dt, c->head_dim, 0, 1, 0.1f, seed, n_threads, err, "model.layers.%d.self_attn.k_norm.weight", l);
        }
    }
    if (!rc) rc = add(s, dt, H, 0, 1, 0.1f, seed, n_threads, err, "model.norm.weight", 0);
    if (!rc && !c->tie_word_embeddings) rc = add(s, dt, c->vocab_size, H, 0, ws, seed, n_threads, err, "lm_head.weight", 0);
    if (rc) {
        kn_synthetic_free(s);
        return rc;
    }
    *out = s;
    return KN_OK;
}

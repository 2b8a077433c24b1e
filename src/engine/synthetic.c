/* synthetic.c — see synthetic.h. Tensor names and shapes mirror what
 * transformers saves for the architecture, so the real loader path is what
 * the benchmark exercises. */
#include "engine/synthetic.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_mem.h"
#include "base/quant.h"
#include "io/quantize.h"

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
    return (kn_tensor_source){.find = syn_find, .ctx = s, .borrow = KN_BORROW_RESIDENT};
}

void kn_synthetic_free(kn_synthetic *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        kn_host_free((void *)s->t[i].data);
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
    if (!t->name || !(data = kn_host_alloc((size_t)count * esz))) {
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

/* A 3-D tensor [d0, d1, d2] (transformers 5's fused experts). */
static kn_code add3(kn_synthetic *s, kn_dtype dt, int64_t d0, int64_t d1, int64_t d2, float scale, uint64_t seed,
                    int n_threads, kn_error *err, const char *fmt, int layer) {
    kn_code rc = add(s, dt, d0 * d1, d2, 0, scale, seed, n_threads, err, fmt, layer);
    if (rc) return rc;
    kn_st_tensor *t = &s->t[s->n - 1];
    t->ndim = 3, t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
    return KN_OK;
}

/* Replace the float tensor at index i (2-D, or 3-D as mlx-lm's switch_mlp
 * stacks: rows of the last dimension) by its MLX affine-quantized form:
 * random codes (uniform over all 2^bits values) in U32 words, and scales /
 * biases in the tensor's dtype such that w = scale * q + bias spans about
 * [-ws, ws] like the float weights did. Appends <module>.scales/.biases. */
static kn_code quantize_tensor(kn_synthetic *s, size_t i, int bits, int gs, float ws, uint64_t seed, int n_threads,
                               kn_error *err) {
    const int nd = s->t[i].ndim;
    const int64_t rows = nd == 3 ? s->t[i].shape[0] * s->t[i].shape[1] : s->t[i].shape[0];
    const int64_t cols = s->t[i].shape[nd - 1], words = kn_quant_row_words(cols, bits);
    const kn_dtype sdt = s->t[i].dtype;
    char base[256];
    size_t len = strlen(s->t[i].name);
    snprintf(base, sizeof base, "%.*s", (int)(len - 7), s->t[i].name);
    void *q = kn_host_alloc((size_t)rows * (size_t)words * 4);
    if (!q)
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for synthetic %s", s->t[i].name);
    const uint64_t b0 = mix(seed ^ mix(i + 0x9e37));
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t j = 0; j < rows * words; j++) ((uint32_t *)q)[j] = (uint32_t)(mix(b0 + (uint64_t)j) >> 16);
    kn_host_free((void *)s->t[i].data);
    s->t[i].data = q;
    s->t[i].dtype = KN_DT_U32;
    s->t[i].shape[nd - 1] = words;
    const int64_t d0 = s->t[i].shape[0], d1 = s->t[i].shape[1];
    s->t[i].nbytes = (size_t)rows * (size_t)words * 4;
    /* scale ~ 2 ws / (2^bits - 1) (+-10%), bias ~ -ws (+-10%) */
    const float sc = 2.0f * ws / (float)((1 << bits) - 1);
    char fmt[300];
    snprintf(fmt, sizeof fmt, "%s.scales", base);
    kn_code rc = add(s, sdt, rows, cols / gs, sc, 0.1f * sc, seed, n_threads, err, fmt, 0);
    if (!rc) {
        snprintf(fmt, sizeof fmt, "%s.biases", base);
        rc = add(s, sdt, rows, cols / gs, -ws, 0.1f * ws, seed, n_threads, err, fmt, 0);
    }
    for (size_t j = s->n - 2; !rc && nd == 3 && j < s->n; j++) /* [E, rows, groups] like the codes */
        s->t[j].ndim = 3, s->t[j].shape[0] = d0, s->t[j].shape[1] = d1, s->t[j].shape[2] = cols / gs;
    return rc;
}

/* A quantized MoE checkpoint as mlx-lm writes it: the fused experts of
 * layer prefix p ("<p>.experts.gate_up_proj" [E, 2I, H], "<p>.experts.
 * down_proj" [E, H, I], tensors gu and dn) become "<p>.switch_mlp.
 * {gate,up,down}_proj.weight" stacks, quantized. */
static kn_code quantize_experts(kn_synthetic *s, size_t gu, size_t dn, int bits, int gs, float ws, uint64_t seed,
                                int n_threads, kn_error *err) {
    const char *x = strstr(s->t[gu].name, ".experts.");
    char p[256], name[300];
    snprintf(p, sizeof p, "%.*s", (int)(x - s->t[gu].name), s->t[gu].name);
    const int64_t E = s->t[gu].shape[0], I = s->t[gu].shape[1] / 2, H = s->t[gu].shape[2];
    char *gname = malloc(strlen(p) + 32), *dname = malloc(strlen(p) + 32);
    if (!gname || !dname) {
        free(gname), free(dname);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    sprintf(gname, "%s.switch_mlp.gate_proj.weight", p), sprintf(dname, "%s.switch_mlp.down_proj.weight", p);
    free(s->t[gu].name), free(s->t[dn].name);
    s->t[gu].name = gname, s->t[dn].name = dname;
    s->t[gu].shape[1] = I; /* the first half of the rows' buffer; replaced by codes below */
    s->t[gu].nbytes /= 2;
    snprintf(name, sizeof name, "%s.switch_mlp.up_proj.weight", p);
    kn_code rc = add3(s, s->t[gu].dtype, E, I, H, ws, seed, n_threads, err, name, 0);
    const size_t up = s->n - 1;
    if (!rc) rc = quantize_tensor(s, gu, bits, gs, ws, seed, n_threads, err);
    if (!rc) rc = quantize_tensor(s, up, bits, gs, ws, seed, n_threads, err);
    if (!rc) rc = quantize_tensor(s, dn, bits, gs, ws, seed, n_threads, err);
    return rc;
}

kn_code kn_synthetic_create_quant(const kn_model_config *c, kn_dtype dt, int bits, int group_size, uint64_t seed,
                                  int n_threads, kn_synthetic **out, kn_error *err) {
    kn_code rc = kn_synthetic_create(c, dt, seed, n_threads, out, err);
    if (rc || bits == 0) return rc;
    if (!kn_quant_bits_ok(bits) || kn_quant_compute_bits(bits) != bits || !kn_quant_group_ok(group_size) || dt == KN_DT_F32) {
        kn_synthetic_free(*out);
        *out = NULL;
        return kn_fail(err, KN_ERR_INVALID_ARG,
                       "synthetic quantization needs bits 2, 4 or 8, group size 32, 64 or 128 and bf16/f16 scales");
    }
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    kn_synthetic *s = *out;
    const size_t n_float = s->n; /* tensors appended below are up_proj stacks and scales/biases */
    for (size_t i = 0; !rc && i < n_float; i++) {
        const kn_st_tensor *t = &s->t[i];
        size_t len = strlen(t->name);
        /* the MoE layers' fused experts (not gemma4's parallel block, whose loader reads them fused) */
        if (t->ndim == 3 && len > 25 && !strcmp(t->name + len - 25, ".mlp.experts.gate_up_proj") && i + 1 < n_float &&
            t->shape[2] % group_size == 0 && t->shape[1] % 2 == 0 && (t->shape[1] / 2) % group_size == 0 &&
            strstr(s->t[i + 1].name, ".mlp.experts.down_proj"))
            rc = quantize_experts(s, i, i + 1, bits, group_size, 0.02f, seed, n_threads, err);
        else if (kn_quantize_selects(t->name, t->ndim, t->shape, group_size))
            rc = quantize_tensor(s, i, bits, group_size, 0.02f, seed, n_threads, err);
    }
    if (rc) {
        kn_synthetic_free(s);
        *out = NULL;
    }
    return rc;
}

kn_code kn_synthetic_create(const kn_model_config *c, kn_dtype dt, uint64_t seed, int n_threads, kn_synthetic **out,
                            kn_error *err) {
    *out = NULL;
    if (dt != KN_DT_F32 && dt != KN_DT_BF16 && dt != KN_DT_F16)
        return kn_fail(err, KN_ERR_INVALID_ARG, "synthetic weights must be f32, bf16 or f16");
    kn_synthetic *s = calloc(1, sizeof *s);
    if (!s) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    const int64_t H = c->hidden_size, I_all = c->intermediate_size;
    const int first_shared = c->n_layers - c->n_kv_shared_layers; /* gemma3n / gemma4 KV-shared layers from here */
    const float ws = 0.02f;
    /* norms are 1 + noise, except where the family scales by (1 + w) */
    const float nc = c->norm_weight_offset != 0.0 ? 0.0f : 1.0f;
    const kn_norm_names nn = kn_family_norms(c);
    kn_code rc = add(s, dt, c->vocab_size, H, 0, ws, seed, n_threads, err, "model.embed_tokens.weight", 0);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const int shared = c->n_kv_shared_layers > 0 && l >= first_shared;
        /* per-layer attention shapes and MLP widths (gemma4 global layers, gemma3n lists, double-wide MLPs) */
        const int64_t hd = c->layer_head_dim[l], q = (int64_t)c->n_heads * hd, kv = (int64_t)c->layer_kv_heads[l] * hd;
        const int64_t I = (c->layer_inter[l] ? c->layer_inter[l] : I_all) * (c->double_wide_mlp && shared ? 2 : 1);
        const int no_v = c->k_eq_v && !c->layer_sliding[l];
        if (c->fused_qkv) rc = add(s, dt, q + 2 * kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.qkv_proj.weight", l);
        else {
            rc = add(s, dt, q, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.q_proj.weight", l);
            if (!rc && !shared) rc = add(s, dt, kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.k_proj.weight", l);
            if (!rc && !shared && !no_v)
                rc = add(s, dt, kv, H, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.v_proj.weight", l);
        }
        if (!rc && c->attention_bias) {
            rc = add(s, dt, q, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.q_proj.bias", l);
            if (!rc) rc = add(s, dt, kv, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.k_proj.bias", l);
            if (!rc) rc = add(s, dt, kv, 0, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (!rc) rc = add(s, dt, H, q, 0, ws, seed, n_threads, err, "model.layers.%d.self_attn.o_proj.weight", l);
        if (rc) break;
        if (c->moe_parallel) { /* gemma4: MoE block beside the dense MLP */
            const int64_t E = c->n_experts, MI = c->moe_intermediate_size;
            rc = add(s, dt, E, H, 0, ws, seed, n_threads, err, "model.layers.%d.router.proj.weight", l);
            if (!rc) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.router.scale", l);
            if (!rc) rc = add(s, dt, E, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.router.per_expert_scale", l);
            if (!rc) rc = add3(s, dt, E, 2 * MI, H, ws, seed, n_threads, err, "model.layers.%d.experts.gate_up_proj", l);
            if (!rc) rc = add3(s, dt, E, H, MI, ws, seed, n_threads, err, "model.layers.%d.experts.down_proj", l);
            static const char *const moe_norms[] = {"model.layers.%d.pre_feedforward_layernorm_2.weight",
                                                    "model.layers.%d.post_feedforward_layernorm_1.weight",
                                                    "model.layers.%d.post_feedforward_layernorm_2.weight"};
            for (int i = 0; i < 3 && !rc; i++) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, moe_norms[i], l);
            if (!rc) rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate_proj.weight", l);
            if (!rc) rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.up_proj.weight", l);
            if (!rc) rc = add(s, dt, H, I, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.down_proj.weight", l);
        } else if (c->n_experts > 0 && c->layer_moe[l]) {
            const int64_t E = c->n_experts, MI = c->moe_intermediate_size, SI = c->shared_expert_intermediate_size;
            rc = add(s, dt, E, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate.weight", l);
            if (!rc) rc = add3(s, dt, E, 2 * MI, H, ws, seed, n_threads, err, "model.layers.%d.mlp.experts.gate_up_proj", l);
            if (!rc) rc = add3(s, dt, E, H, MI, ws, seed, n_threads, err, "model.layers.%d.mlp.experts.down_proj", l);
            if (!rc && SI) {
                rc = add(s, dt, SI, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
                if (!rc) rc = add(s, dt, SI, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
                if (!rc) rc = add(s, dt, H, SI, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
                if (!rc) rc = add(s, dt, 1, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            }
        } else if (!c->mlp_gated) {
            rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.c_fc.weight", l);
            if (!rc) rc = add(s, dt, H, I, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.c_proj.weight", l);
        } else {
            if (c->fused_gate_up) rc = add(s, dt, 2 * I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate_up_proj.weight", l);
            else {
                rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.gate_proj.weight", l);
                if (!rc) rc = add(s, dt, I, H, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.up_proj.weight", l);
            }
            if (!rc) rc = add(s, dt, H, I, 0, ws, seed, n_threads, err, "model.layers.%d.mlp.down_proj.weight", l);
        }
        const char *norms[4] = {nn.pre_attn, nn.post_attn, nn.pre_mlp, nn.post_mlp};
        for (int i = 0; i < 4 && !rc; i++) {
            if (!norms[i]) continue;
            char fmt[160];
            snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.weight", norms[i]);
            rc = add(s, dt, H, 0, nc, 0.1f, seed, n_threads, err, fmt, l);
        }
        if (!rc && c->qk_norm_kind != KN_QK_NORM_NONE) {
            int full = c->qk_norm_kind == KN_QK_NORM_FULL;
            rc = add(s, dt, full ? q : hd, 0, nc, 0.1f, seed, n_threads, err, "model.layers.%d.self_attn.q_norm.weight", l);
            if (!rc && !shared)
                rc = add(s, dt, full ? kv : hd, 0, nc, 0.1f, seed, n_threads, err, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (!rc && c->ple_dim) { /* gemma4 / gemma3n per-layer inputs */
            const int64_t P = c->ple_dim;
            rc = add(s, dt, P, H, 0, ws, seed, n_threads, err, "model.layers.%d.per_layer_input_gate.weight", l);
            if (!rc) rc = add(s, dt, H, P, 0, ws, seed, n_threads, err, "model.layers.%d.per_layer_projection.weight", l);
            if (!rc) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.post_per_layer_input_norm.weight", l);
        }
        if (!rc && c->arch == KN_ARCH_GEMMA4) rc = add(s, dt, 1, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.layer_scalar", l);
        if (!rc && c->altup_inputs) { /* gemma3n: AltUp, Laurel */
            const int64_t K = c->altup_inputs, R = c->laurel_rank;
            rc = add(s, dt, K, H, 0, ws, seed, n_threads, err, "model.layers.%d.altup.modality_router.weight", l);
            if (!rc) rc = add(s, dt, K * K, K, 0, 0.1f, seed, n_threads, err, "model.layers.%d.altup.prediction_coefs.weight", l);
            if (!rc) rc = add(s, dt, K, K, 0, 0.1f, seed, n_threads, err, "model.layers.%d.altup.correction_coefs.weight", l);
            if (!rc) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.altup.router_norm.weight", l);
            if (!rc) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.altup.correct_output_scale", l);
            if (!rc) rc = add(s, dt, R, H, 0, ws, seed, n_threads, err, "model.layers.%d.laurel.linear_left.weight", l);
            if (!rc) rc = add(s, dt, H, R, 0, ws, seed, n_threads, err, "model.layers.%d.laurel.linear_right.weight", l);
            if (!rc) rc = add(s, dt, H, 0, 1.0f, 0.1f, seed, n_threads, err, "model.layers.%d.laurel.post_laurel_norm.weight", l);
        }
    }
    if (!rc && c->ple_dim) { /* gemma4 / gemma3n per-layer input tables */
        const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
        rc = add(s, dt, c->ple_vocab, LP, 0, ws, seed, n_threads, err, "model.embed_tokens_per_layer.weight", 0);
        if (!rc) rc = add(s, dt, LP, H, 0, ws, seed, n_threads, err, "model.per_layer_model_projection.weight", 0);
        if (!rc) rc = add(s, dt, c->ple_dim, 0, 1.0f, 0.1f, seed, n_threads, err, "model.per_layer_projection_norm.weight", 0);
    }
    if (!rc && c->altup_inputs) { /* gemma3n stream projections */
        for (int i = 0; !rc && i < c->altup_inputs - 1; i++) {
            rc = add(s, dt, H, H, 0, ws, seed, n_threads, err, "model.altup_projections.%d.weight", i);
            if (!rc) rc = add(s, dt, H, H, 0, ws, seed, n_threads, err, "model.altup_unembed_projections.%d.weight", i);
        }
    }
    if (!rc) rc = add(s, dt, H, 0, nc, 0.1f, seed, n_threads, err, "model.norm.weight", 0);
    if (!rc && !c->tie_word_embeddings) rc = add(s, dt, c->vocab_size, H, 0, ws, seed, n_threads, err, "lm_head.weight", 0);
    if (rc) {
        kn_synthetic_free(s);
        return rc;
    }
    *out = s;
    return KN_OK;
}

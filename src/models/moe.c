/* moe.c — mixture-of-experts layers. See moe.h.
 *
 * Routing follows transformers: router logits = x W_r^T, softmax in f32, the
 * top-k probabilities (renormalised when norm_topk_prob / always for
 * mixtral), experts SwiGLU-FFNs summed with those weights; qwen2_moe adds a
 * shared expert scaled by sigmoid(x w_g). Expert weights are stacked along
 * rows at load (expert e's gate rows, then its up rows; down likewise) so the
 * moe_ffn op can address any expert from its id on the device. Checkpoints
 * come with one tensor per expert (HF), fused 3-D tensors (transformers 5) or
 * mlx-lm's switch_mlp stacks, which may be MLX-quantized. */
#include "models/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/loader.h"

/* Mixtral's published layout says block_sparse_moe and w1/w3/w2; the others
 * (and transformers 5 for all) say mlp and gate_proj/up_proj/down_proj. */
static const char *const prefixes[] = {"model.layers.%d.mlp", "model.layers.%d.block_sparse_moe"};
static const char *const gemma4_prefix = "model.layers.%d"; /* router.*, experts.* */
static const char *const expert_names[][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};

static const kn_st_tensor *find2(const kn_tensor_source *src, char *name, size_t cap, const char *prefix, int l,
                                 const char *suffix) {
    char p[160];
    snprintf(p, sizeof p, prefix, l);
    snprintf(name, cap, "%s%s", p, suffix);
    return src->find(src->ctx, name);
}

/* Per-expert tensors, stacked: gate_up [E*2I, H] and down [E*H, I]. */
static kn_code load_split_experts(kn_model *m, const kn_tensor_source *src, const char *prefix, int l,
                                  kn_layer *L, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int E = c->n_experts;
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    int naming = -1;
    char name[320], sfx[96];
    for (int v = 0; v < 2 && naming < 0; v++) {
        snprintf(sfx, sizeof sfx, ".experts.0.%s.weight", expert_names[v][0]);
        if (find2(src, name, sizeof name, prefix, l, sfx)) naming = v;
    }
    if (naming < 0) {
        find2(src, name, sizeof name, prefix, l, ".experts");
        return kn_fail(err, KN_ERR_FORMAT, "checkpoint has no expert tensors under %s (per-expert or fused)", name);
    }
    uint8_t *gu = NULL, *dn = NULL;
    kn_dtype dt = KN_DT_F32;
    size_t esz = 0;
    kn_code rc = KN_OK;
    for (int e = 0; e < E && !rc; e++) {
        const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
        for (int j = 0; j < 3 && !rc; j++) {
            snprintf(sfx, sizeof sfx, ".experts.%d.%s.weight", e, expert_names[naming][j]);
            const kn_st_tensor *t = find2(src, name, sizeof name, prefix, l, sfx);
            if (!t) { rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name); break; }
            if ((rc = ld_check_float(t, name, err)) || (rc = ld_check_shape(t, name, rows[j], cols[j], err))) break;
            if (!gu) {
                dt = t->dtype, esz = kn_dtype_size(dt);
                gu = malloc((size_t)E * 2 * I * H * esz);
                dn = malloc((size_t)E * H * I * esz);
                if (!gu || !dn) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory stacking experts of layer %d", l); break; }
            }
            if (t->dtype != dt) { rc = kn_fail(err, KN_ERR_UNSUPPORTED, "expert tensor %s has a different dtype", name); break; }
            uint8_t *dst = j == 2 ? dn + (size_t)e * H * I * esz : gu + ((size_t)e * 2 + (size_t)j) * I * H * esz;
            memcpy(dst, t->data, t->nbytes);
        }
    }
    if (!rc) rc = kn_be_weight_load(m->be, dt, E * 2 * I, H, gu, 0, &L->experts_gate_up, err);
    if (!rc) rc = kn_be_weight_load(m->be, dt, E * H, I, dn, 0, &L->experts_down, err);
    free(gu), free(dn);
    return rc;
}

/* transformers 5's fused experts: gate_up_proj [E, 2I, H], down_proj [E, H, I]. */
static kn_code load_fused_experts(kn_model *m, const kn_tensor_source *src, const kn_st_tensor *gu,
                                  const char *gu_name, const char *prefix, int l, kn_layer *L, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int64_t E = c->n_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    char name[320];
    const kn_st_tensor *dn = find2(src, name, sizeof name, prefix, l, ".experts.down_proj");
    if (!dn) return kn_fail(err, KN_ERR_FORMAT, "checkpoint has %s but no %s", gu_name, name);
    kn_code rc;
    if ((rc = ld_check_float(gu, gu_name, err)) || (rc = ld_check_float(dn, name, err))) return rc;
    if (gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != H)
        return kn_fail(err, KN_ERR_FORMAT, "tensor %s must have shape [%lld, %lld, %lld] from config.json", gu_name,
                       (long long)E, (long long)(2 * I), (long long)H);
    if (dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I)
        return kn_fail(err, KN_ERR_FORMAT, "tensor %s must have shape [%lld, %lld, %lld] from config.json", name,
                       (long long)E, (long long)H, (long long)I);
    if ((rc = kn_be_weight_load(m->be, gu->dtype, E * 2 * I, H, gu->data, src->borrow, &L->experts_gate_up,
                                err)))
        return rc;
    return kn_be_weight_load(m->be, dn->dtype, E * H, I, dn->data, src->borrow, &L->experts_down, err);
}

/* mlx-lm's stacked experts (every mlx-community MoE checkpoint, bf16 or
 * quantized): switch_mlp.{gate,up,down}_proj [E, rows, cols]. */
static kn_code load_switch_experts(kn_model *m, const kn_tensor_source *src, const char *prefix, int l, kn_layer *L,
                                   kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int64_t E = c->n_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    char gname[320], uname[320], dname[320];
    find2(src, gname, sizeof gname, prefix, l, ".switch_mlp.gate_proj.weight");
    find2(src, uname, sizeof uname, prefix, l, ".switch_mlp.up_proj.weight");
    find2(src, dname, sizeof dname, prefix, l, ".switch_mlp.down_proj.weight");
    const char *gu[2] = {gname, uname}, *dn[1] = {dname};
    const int64_t gu_rows[2] = {I, I}, dn_rows[1] = {H};
    kn_code rc = ld_load_stacked(m, src, gu, 2, E, gu_rows, H, &L->experts_gate_up, err);
    if (!rc) rc = ld_load_stacked(m, src, dn, 1, E, dn_rows, I, &L->experts_down, err);
    return rc;
}

static kn_code load_experts(kn_model *m, const kn_tensor_source *src, const char *prefix, int l, kn_layer *L,
                            kn_error *err) {
    char gu_name[320];
    if (find2(src, gu_name, sizeof gu_name, prefix, l, ".switch_mlp.gate_proj.weight")) {
        kn_code rc = load_switch_experts(m, src, prefix, l, L, err);
        if (!rc && (L->experts_gate_up.bits || L->experts_down.bits) && !m->be->moe_quantized_experts)
            rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                         "layer %d: the %s backend has no kernels for MLX-quantized MoE experts yet; run this model "
                         "with --backend cpu",
                         l, m->be->vt->name);
        return rc;
    }
    const kn_st_tensor *gu = find2(src, gu_name, sizeof gu_name, prefix, l, ".experts.gate_up_proj");
    return gu ? load_fused_experts(m, src, gu, gu_name, prefix, l, L, err) : load_split_experts(m, src, prefix, l, L, err);
}

/* gemma4: router.{proj.weight [E, H], scale [H], per_expert_scale [E]}, experts.*, and the three extra norms */
static kn_code load_gemma4(kn_model *m, const kn_tensor_source *src, int l, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    kn_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size, E = c->n_experts;
    kn_code rc;
    ld_part rp[] = {{"model.layers.%d.router.proj.weight", E}};
    if ((rc = ld_load_fused(m, src, l, rp, 1, H, NULL, &L->router, err))) return rc;
    L->is_moe = 1;
    /* router input: rms_norm(x) * scale * H^-0.5, folded into one weight */
    float *w = malloc((size_t)H * sizeof(float));
    if (!w) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    int found;
    rc = ld_read_vec(src, "model.layers.%d.router.scale", l, H, 1, w, &found, err);
    const float root = (float)pow((double)H, -0.5);
    for (int64_t i = 0; !rc && i < H; i++) w[i] *= root;
    if (!rc) rc = ld_upload_vec(m, w, H, &L->router_norm_w, err);
    free(w);
    if (rc) return rc;
    if ((rc = ld_load_vec(m, src, "model.layers.%d.router.per_expert_scale", l, E, 1, 0.0f, &L->expert_scale, err)) ||
        (rc = ld_load_vec(m, src, "model.layers.%d.pre_feedforward_layernorm_2.weight", l, H, 1, 0.0f, &L->moe_pre_norm,
                          err)) ||
        (rc = ld_load_vec(m, src, "model.layers.%d.post_feedforward_layernorm_1.weight", l, H, 1, 0.0f,
                          &L->moe_post_norm1, err)) ||
        (rc = ld_load_vec(m, src, "model.layers.%d.post_feedforward_layernorm_2.weight", l, H, 1, 0.0f,
                          &L->moe_post_norm2, err)))
        return rc;
    return load_experts(m, src, gemma4_prefix, l, L, err);
}

kn_code kn_moe_load_layer(kn_model *m, const kn_tensor_source *src, int l, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    kn_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size;
    if (c->moe_parallel) return load_gemma4(m, src, l, err);
    char name[320];
    const char *prefix = NULL;
    const kn_st_tensor *router = NULL;
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes && !router; p++)
        if ((router = find2(src, name, sizeof name, prefixes[p], l, ".gate.weight"))) prefix = prefixes[p];
    if (!router) {
        find2(src, name, sizeof name, prefixes[0], l, ".gate.weight");
        return kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing the MoE router tensor %s", name);
    }
    kn_code rc;
    char rfmt[200]; /* the router may be quantized too (mlx-lm keeps it at 8 bits in its MoE recipes) */
    snprintf(rfmt, sizeof rfmt, "%s.gate.weight", prefix);
    ld_part rp[] = {{rfmt, c->n_experts}};
    if ((rc = ld_load_fused(m, src, l, rp, 1, H, NULL, &L->router, err))) return rc;
    L->is_moe = 1;
    rc = load_experts(m, src, prefix, l, L, err);
    if (rc || c->shared_expert_intermediate_size == 0) return rc;
    const int64_t S = c->shared_expert_intermediate_size;
    ld_part sgu[] = {{"model.layers.%d.mlp.shared_expert.gate_proj.weight", S},
                     {"model.layers.%d.mlp.shared_expert.up_proj.weight", S}};
    ld_part sdn[] = {{"model.layers.%d.mlp.shared_expert.down_proj.weight", H}};
    ld_part sg[] = {{"model.layers.%d.mlp.shared_expert_gate.weight", 1}};
    if ((rc = ld_load_fused(m, src, l, sgu, 2, H, NULL, &L->gate_up, err)) ||
        (rc = ld_load_fused(m, src, l, sdn, 1, S, NULL, &L->down, err)))
        return rc;
    return ld_load_fused(m, src, l, sg, 1, H, NULL, &L->shared_gate, err);
}

void kn_moe_forward(kn_model *m, const kn_layer *L, const float *x, const float *norm_w, int n, float *out,
                    int accumulate) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const kn_backend_vtbl *op = be->vt;
    const int H = c->hidden_size, k = c->n_experts_per_tok;
    const float eps = (float)c->rms_norm_eps;
    /* the router reads the normalized x: the norm fused into its matmul where
     * the backend has that (the shared expert needs x' as a tensor) */
    if (!(norm_w && !L->shared_gate.data && op->fused_matmul &&
          op->fused_matmul(be, x, n, norm_w, eps, &L->router, NULL, m->router_logits, KN_EPI_NONE))) {
        if (norm_w) {
            op->rms_norm(be, x, H, m->xn, H, n, 1, H, norm_w, eps);
            x = m->xn, norm_w = NULL;
        }
        op->matmul(be, x, n, &L->router, NULL, m->router_logits);
    }
    /* routing inside the op (the backend may fuse it into its expert kernels) */
    kn_moe_args a = {
        .x = x, .out = out, .n_tokens = n, .dim = H, .inter = c->moe_intermediate_size,
        .n_experts = c->n_experts, .k = k, .act = c->act, .idx = m->route_idx, .w = m->route_w,
        .logits = m->router_logits, .norm_topk = c->norm_topk_prob, .expert_scale = L->expert_scale,
        .gate_up = &L->experts_gate_up, .down = &L->experts_down, .scratch = m->moe_scratch,
        .norm_w = norm_w, .eps = eps, .accumulate = accumulate,
    };
    op->moe_ffn(be, &a);
    if (!L->shared_gate.data) return;
    const int S = c->shared_expert_intermediate_size; /* x is normalized here */
    op->matmul(be, x, n, &L->gate_up, NULL, m->gu);
    op->swiglu(be, m->gu, n, S, m->act);
    op->matmul(be, m->act, n, &L->down, NULL, m->tmp2);
    op->matmul(be, x, n, &L->shared_gate, NULL, m->shared_g);
    op->sigmoid_gate_add(be, out, m->tmp2, m->shared_g, n, H);
}

static int64_t wbytes(const kn_weight *w) { return kn_weight_bytes(w); }

int64_t kn_moe_active_bytes(const kn_model *m, const kn_layer *L) {
    const kn_model_config *c = &m->cfg;
    int64_t per_expert = (wbytes(&L->experts_gate_up) + wbytes(&L->experts_down)) / c->n_experts;
    return wbytes(&L->router) + per_expert * c->n_experts_per_tok + wbytes(&L->gate_up) + wbytes(&L->down) +
           wbytes(&L->shared_gate);
}

void kn_moe_gemma4_forward(kn_model *m, const kn_layer *L, const float *x, int n, float *scratch, float *out) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    /* route on rms_norm(x) * scale / sqrt(H), experts on pre_feedforward_layernorm_2(x) */
    be->vt->rms_norm(be, x, H, scratch, H, n, 1, H, L->router_norm_w, eps);
    be->vt->matmul(be, scratch, n, &L->router, NULL, m->router_logits);
    be->vt->rms_norm(be, x, H, scratch, H, n, 1, H, L->moe_pre_norm, eps);
    kn_moe_args a = { /* routed inside the op: normalized top-k, per-expert scales */
        .x = scratch, .out = out, .n_tokens = n, .dim = H, .inter = c->moe_intermediate_size,
        .n_experts = c->n_experts, .k = c->n_experts_per_tok, .act = c->act, .idx = m->route_idx, .w = m->route_w,
        .logits = m->router_logits, .norm_topk = 1, .expert_scale = L->expert_scale,
        .gate_up = &L->experts_gate_up, .down = &L->experts_down, .scratch = m->moe_scratch,
    };
    be->vt->moe_ffn(be, &a);
}

void kn_moe_free_layer(kn_model *m, kn_layer *L) {
    float *v[] = {L->router_norm_w, L->expert_scale, L->moe_pre_norm, L->moe_post_norm1, L->moe_post_norm2};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) kn_be_free(m->be, v[i]);
    kn_be_weight_free(m->be, &L->router);
    kn_be_weight_free(m->be, &L->experts_gate_up);
    kn_be_weight_free(m->be, &L->experts_down);
    kn_be_weight_free(m->be, &L->shared_gate);
}

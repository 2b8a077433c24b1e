/* llama.c — the shared decoder of every dense and MoE family kiln runs
 * (llama, mistral, qwen2/3, phi3, gemma/2/3/4, olmo2, granite, starcoder2,
 * glm4, smollm3, and the attention half of qwen2_moe/qwen3_moe/mixtral):
 * weight loading from HF tensor names and the batched forward pass.
 *
 * Per layer, top to bottom (transformers' modeling_llama and relatives):
 *   a = o_proj(attn(rope(qk_norm(q)), rope(qk_norm(k)), v))   q,k,v = qkv_proj(pre_norm(x))
 *   x = x + residual_scale * post_norm(a)
 *   f = down(act(gate) * up) | down(act(up)) | moe(...)       on pre_norm(x)
 *   x = x + residual_scale * post_norm(f)
 * Family differences are data in kn_model_config, not code paths: where the
 * norms sit (pre / sandwich / post) and their names, RMSNorm (1 + w) folded at
 * load, LayerNorm with bias, per-head or whole-projection q/k norms, gated or
 * plain MLP and its activation, embedding / residual / logit multipliers,
 * attention scale and soft-capping, per-layer windows, per-layer RoPE tables
 * (gemma3 local/global, smollm3 NoPE), GLM's interleaved RoPE (rows permuted
 * at load), fused or separate projections, optional biases (present tensors
 * decide). gemma4 adds per-layer attention shapes (KV pool viewed per layer),
 * keys-as-values and value norms, KV-shared layers (attend to an earlier
 * layer's cache, write none), per-layer input embeddings and layer scalars.
 * Expert layers live in moe.c; gemma3n's AltUp residual streams in gemma3n.c
 * (reusing this file's attention and MLP). Sliding-window layers keep their
 * K/V in a ring (kv_paged.h) where that is smaller than the context;
 * length-dependent RoPE (dynamic, longrope) gets one frequency table per run
 * of a sequence's tokens in each forward. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/loader.h"
#include "models/model.h"
#include "models/gemma3n.h"
#include "models/moe.h"
#include "models/rope.h"

#define MAX_CHUNK 2048     /* most tokens one forward takes (backends ask for fewer) */
#define DEFAULT_CHUNK 512  /* a backend without a preference */
#define MAX_LOGIT_ROWS 16

typedef kn_norm_names norm_names;

kn_norm_names kn_family_norms(const kn_model_config *c) {
    switch (c->norm_layout) {
    case KN_NORMS_POST: return (norm_names){NULL, "post_attention_layernorm", NULL, "post_feedforward_layernorm"};
    case KN_NORMS_SANDWICH:
        if (c->arch == KN_ARCH_GLM4)
            return (norm_names){"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                                "post_mlp_layernorm"};
        return (norm_names){"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm"};
    default: return (norm_names){"input_layernorm", NULL, "post_attention_layernorm", NULL};
    }
}

/* One norm (weight + LayerNorm bias) of layer l named `which`; both NULL when which is NULL. */
static kn_code load_norm(kn_model *m, const kn_tensor_source *src, int l, const char *which, float **w, float **b,
                         kn_error *err) {
    *w = NULL;
    if (b) *b = NULL;
    if (!which) return KN_OK;
    char fmt[160];
    const int64_t H = m->cfg.hidden_size;
    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.weight", which);
    kn_code rc = ld_load_vec(m, src, fmt, l, H, 1, (float)m->cfg.norm_weight_offset, w, err);
    if (rc || !b || !m->cfg.layer_norm) return rc;
    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.bias", which);
    return ld_load_vec(m, src, fmt, l, H, 0, 0.0f, b, err);
}

static kn_code load_layer(kn_model *m, const kn_tensor_source *src, int l, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    kn_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size, I = L->inter;
    const float off = (float)c->norm_weight_offset;
    const int shared = L->kv_source != l, global_kv = c->k_eq_v && !c->layer_sliding[l];
    ld_qk_perm perm = {c->n_heads, L->n_kv_heads, L->head_dim, c->rope_interleaved ? m->rope.rot_dim : 0};
    kn_code rc;
    if (c->fused_qkv) {
        ld_part qkv[] = {{"model.layers.%d.self_attn.qkv_proj.weight", L->qkv_stride}};
        ld_part qkvb[] = {{"model.layers.%d.self_attn.qkv_proj.bias", L->qkv_stride}};
        if ((rc = ld_load_fused(m, src, l, qkv, 1, H, &perm, &L->qkv, err))) return rc;
        if ((rc = ld_load_fused_bias(m, src, l, qkvb, 1, &perm, &L->qkv_bias, err))) return rc;
    } else {
        /* keys = values (gemma4 global layers): the key rows twice, so the
         * value slot holds the same projection; a KV-shared layer has only q */
        const char *vfmt = global_kv ? "model.layers.%d.self_attn.k_proj.weight" : "model.layers.%d.self_attn.v_proj.weight";
        const char *vbfmt = global_kv ? "model.layers.%d.self_attn.k_proj.bias" : "model.layers.%d.self_attn.v_proj.bias";
        ld_part qkv[] = {{"model.layers.%d.self_attn.q_proj.weight", L->q_dim},
                         {"model.layers.%d.self_attn.k_proj.weight", L->kv_dim},
                         {vfmt, L->kv_dim}};
        ld_part qkvb[] = {{"model.layers.%d.self_attn.q_proj.bias", L->q_dim},
                          {"model.layers.%d.self_attn.k_proj.bias", L->kv_dim},
                          {vbfmt, L->kv_dim}};
        int parts = shared ? 1 : 3;
        if ((rc = ld_load_fused(m, src, l, qkv, parts, H, shared ? NULL : &perm, &L->qkv, err))) return rc;
        if ((rc = ld_load_fused_bias(m, src, l, qkvb, parts, shared ? NULL : &perm, &L->qkv_bias, err))) return rc;
    }
    ld_part o[] = {{"model.layers.%d.self_attn.o_proj.weight", H}};
    if ((rc = ld_load_fused(m, src, l, o, 1, L->q_dim, NULL, &L->o, err))) return rc;
    if ((rc = ld_load_vec(m, src, "model.layers.%d.self_attn.o_proj.bias", l, H, 0, 0.0f, &L->o_bias, err))) return rc;
    if (c->layer_moe[l] && c->n_experts > 0 && !c->moe_parallel) {
        if ((rc = kn_moe_load_layer(m, src, l, err))) return rc;
    } else if (!c->mlp_gated) {
        ld_part up[] = {{"model.layers.%d.mlp.c_fc.weight", I}};
        ld_part dn[] = {{"model.layers.%d.mlp.c_proj.weight", H}};
        if ((rc = ld_load_fused(m, src, l, up, 1, H, NULL, &L->gate_up, err))) return rc;
        if ((rc = ld_load_vec(m, src, "model.layers.%d.mlp.c_fc.bias", l, I, 0, 0.0f, &L->gate_up_bias, err))) return rc;
        if ((rc = ld_load_fused(m, src, l, dn, 1, I, NULL, &L->down, err))) return rc;
        if ((rc = ld_load_vec(m, src, "model.layers.%d.mlp.c_proj.bias", l, H, 0, 0.0f, &L->down_bias, err))) return rc;
    } else {
        if (c->fused_gate_up) {
            ld_part gu[] = {{"model.layers.%d.mlp.gate_up_proj.weight", 2 * I}};
            ld_part gub[] = {{"model.layers.%d.mlp.gate_up_proj.bias", 2 * I}};
            if ((rc = ld_load_fused(m, src, l, gu, 1, H, NULL, &L->gate_up, err))) return rc;
            if ((rc = ld_load_fused_bias(m, src, l, gub, 1, NULL, &L->gate_up_bias, err))) return rc;
        } else {
            ld_part gu[] = {{"model.layers.%d.mlp.gate_proj.weight", I}, {"model.layers.%d.mlp.up_proj.weight", I}};
            ld_part gub[] = {{"model.layers.%d.mlp.gate_proj.bias", I}, {"model.layers.%d.mlp.up_proj.bias", I}};
            if ((rc = ld_load_fused(m, src, l, gu, 2, H, NULL, &L->gate_up, err))) return rc;
            if ((rc = ld_load_fused_bias(m, src, l, gub, 2, NULL, &L->gate_up_bias, err))) return rc;
        }
        ld_part down[] = {{"model.layers.%d.mlp.down_proj.weight", H}};
        if ((rc = ld_load_fused(m, src, l, down, 1, I, NULL, &L->down, err))) return rc;
        if ((rc = ld_load_vec(m, src, "model.layers.%d.mlp.down_proj.bias", l, H, 0, 0.0f, &L->down_bias, err)))
            return rc;
    }
    norm_names nn = kn_family_norms(c);
    if ((rc = load_norm(m, src, l, nn.pre_attn, &L->attn_norm, &L->attn_norm_b, err)) ||
        (rc = load_norm(m, src, l, nn.pre_mlp, &L->mlp_norm, &L->mlp_norm_b, err)) ||
        (rc = load_norm(m, src, l, nn.post_attn, &L->post_attn_norm, NULL, err)) ||
        (rc = load_norm(m, src, l, nn.post_mlp, &L->post_mlp_norm, NULL, err)))
        return rc;
    if (c->qk_norm_kind != KN_QK_NORM_NONE) {
        int full = c->qk_norm_kind == KN_QK_NORM_FULL;
        int64_t qn = full ? L->q_dim : L->head_dim, kn = full ? L->kv_dim : L->head_dim;
        if ((rc = ld_load_vec(m, src, "model.layers.%d.self_attn.q_norm.weight", l, qn, 1, off, &L->q_norm, err)))
            return rc;
        if (!shared &&
            (rc = ld_load_vec(m, src, "model.layers.%d.self_attn.k_norm.weight", l, kn, 1, off, &L->k_norm, err)))
            return rc;
    }
    if (c->moe_parallel && (rc = kn_moe_load_layer(m, src, l, err))) return rc;
    L->layer_scalar = 1.0f;
    if (c->arch == KN_ARCH_GEMMA4) {
        int found;
        if ((rc = ld_read_vec(src, "model.layers.%d.layer_scalar", l, 1, 0, &L->layer_scalar, &found, err))) return rc;
    }
    if (c->ple_dim) {
        const int64_t P = c->ple_dim;
        ld_part g[] = {{"model.layers.%d.per_layer_input_gate.weight", P}};
        ld_part pr[] = {{"model.layers.%d.per_layer_projection.weight", H}};
        if ((rc = ld_load_fused(m, src, l, g, 1, H, NULL, &L->ple_gate, err)) ||
            (rc = ld_load_fused(m, src, l, pr, 1, P, NULL, &L->ple_proj, err)) ||
            (rc = ld_load_vec(m, src, "model.layers.%d.post_per_layer_input_norm.weight", l, H, 1, off, &L->ple_norm,
                              err)))
            return rc;
    }
    return KN_OK;
}

/* Per-layer shapes and KV sources (gemma4: global layers are wider; the last
 * n_kv_shared_layers attend to the K/V of the last earlier layer of their
 * type). Fills L->head_dim ... and the model's maxima for scratch sizing. */
static kn_code plan_layers(kn_model *m, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int first_shared = c->n_layers - c->n_kv_shared_layers;
    m->q_dim = m->kv_dim = m->qkv_dim = 0;
    m->ffn_max = c->shared_expert_intermediate_size;
    for (int l = 0; l < c->n_layers; l++) {
        kn_layer *L = &m->layers[l];
        L->head_dim = c->layer_head_dim[l];
        L->n_kv_heads = c->layer_kv_heads[l];
        L->q_dim = c->n_heads * L->head_dim;
        L->kv_dim = L->n_kv_heads * L->head_dim;
        L->kv_source = l;
        if (c->n_kv_shared_layers > 0 && l >= first_shared) {
            L->kv_source = -1;
            for (int j = first_shared - 1; j >= 0; j--)
                if (c->layer_sliding[j] == c->layer_sliding[l]) { L->kv_source = j; break; }
            if (L->kv_source < 0)
                return kn_fail(err, KN_ERR_FORMAT, "layer %d shares K/V but no earlier layer has its attention type", l);
            if (c->layer_head_dim[L->kv_source] != L->head_dim || c->layer_kv_heads[L->kv_source] != L->n_kv_heads)
                return kn_fail(err, KN_ERR_FORMAT, "layer %d shares K/V with layer %d of another shape", l, L->kv_source);
        }
        L->qkv_stride = L->kv_source == l ? L->q_dim + 2 * L->kv_dim : L->q_dim;
        L->inter = (c->layer_inter[l] ? c->layer_inter[l] : c->intermediate_size) *
                   (c->double_wide_mlp && L->kv_source != l ? 2 : 1);
        L->sparse = c->layer_sparse[l], L->sparse_mult = c->layer_sparsity_mult[l];
        if (L->q_dim > m->q_dim) m->q_dim = L->q_dim;
        if (L->kv_dim > m->kv_dim) m->kv_dim = L->kv_dim;
        if (L->qkv_stride > m->qkv_dim) m->qkv_dim = L->qkv_stride;
        if (L->inter > m->ffn_max) m->ffn_max = L->inter;
        if (L->head_dim > m->max_head_dim) m->max_head_dim = L->head_dim;
    }
    return KN_OK;
}

static void free_model_memory(kn_model *m) {
    kn_backend *be = m->be;
    kn_gemma3n_free(m); /* before the layers go */
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            kn_layer *L = &m->layers[l];
            kn_be_weight_free(be, &L->qkv), kn_be_weight_free(be, &L->o);
            kn_be_weight_free(be, &L->gate_up), kn_be_weight_free(be, &L->down);
            kn_moe_free_layer(m, L);
            kn_be_weight_free(be, &L->ple_gate), kn_be_weight_free(be, &L->ple_proj);
            float *vecs[] = {L->qkv_bias,  L->o_bias,      L->gate_up_bias,   L->down_bias,     L->attn_norm,
                             L->mlp_norm,  L->q_norm,      L->k_norm,         L->attn_norm_b,   L->mlp_norm_b,
                             L->post_attn_norm, L->post_mlp_norm, L->ple_norm};
            for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++) kn_be_free(be, vecs[i]);
        }
        free(m->layers);
    }
    if (m->lm_head.data != m->embed.data) kn_be_weight_free(be, &m->lm_head);
    kn_be_weight_free(be, &m->embed);
    kn_be_free(be, m->final_norm);
    kn_be_free(be, m->final_norm_b);
    kn_be_weight_free(be, &m->ple_embed), kn_be_weight_free(be, &m->ple_model_proj);
    float *g4[] = {m->ple_proj_norm, m->ple, m->ple_tmp, m->ple_g, m->ones};
    for (size_t i = 0; i < sizeof g4 / sizeof *g4; i++) kn_be_free(be, g4[i]);
    free(m->kvl);
    free(m->kvl_stage);
    kn_be_free(be, m->d_bt_stage), kn_be_free(be, m->d_bt_ring_stage);
    free(m->h_bt_stage), free(m->h_bt_ring_stage);
    kn_be_free(be, (void *)m->rope.inv_freq);
    kn_be_free(be, (void *)m->rope_local.inv_freq);
    float *scratch[] = {m->x,      m->xn,      m->qkv,         m->attn,   m->gu,          m->act,   m->tmp,
                        m->logits, m->router_logits, m->route_w, m->moe_scratch, m->tmp2, m->shared_g};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) kn_be_free(be, scratch[i]);
    int32_t *idx[] = {m->d_tokens, m->d_pos,     m->d_seq,    m->d_slots,    m->d_bt,
                      m->d_rows,   m->route_idx, m->d_argmax, m->d_bt_ring, m->d_slots_ring};
    for (size_t i = 0; i < sizeof idx / sizeof *idx; i++) kn_be_free(be, idx[i]);
    kn_be_free(be, m->d_sample), kn_be_free(be, m->d_edits);
    free(m->h_bt), free(m->h_bt_ring);
    kn_be_free(be, m->rope_runs);
    free(m->h_rope_runs), free(m->run_t0), free(m->run_n), free(m->run_scale);
    kn_kv_pool_destroy(m->kv);
}

void kn_model_free_internal(kn_model *m) {
    if (!m) return;
    free_model_memory(m);
    kn_backend_destroy(m->be);
    kn_st_close(m->st);
    free(m);
}

/* inv_freq of rope config r for heads of head_dim (a copy of the model
 * config with r as its rope) in backend memory */
static kn_code build_rope(kn_model *m, const kn_rope_config *r, int head_dim, kn_rope_table *out, kn_error *err) {
    kn_model_config tmp = m->cfg;
    tmp.rope = *r;
    tmp.head_dim = head_dim;
    /* proportional RoPE spans the whole head (its tail frequencies are 0) */
    int rot = r->type == KN_ROPE_PROPORTIONAL ? head_dim : (int)(head_dim * r->partial_rotary_factor);
    float inv_freq[512];
    kn_code rc = kn_rope_frequencies(&tmp, rot, 0, inv_freq, &out->attn_scale, err);
    if (rc) return rc;
    float *d = kn_be_alloc(m->be, (size_t)(rot / 2) * sizeof(float));
    if (!d) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_be_upload(m->be, d, inv_freq, (size_t)(rot / 2) * sizeof(float));
    out->inv_freq = d;
    out->rot_dim = rot;
    return KN_OK;
}

/* Memory planning: where the backend reports device memory, the KV pool
 * gets what is left of memory_fraction of the device once weights, scratch
 * and the sliding-window ring pool (ring_bytes, fixed) are resident, capped
 * at what max_seqs full-context sequences need. Fewer blocks than one
 * full-context sequence is an error naming the numbers, never an
 * out-of-memory crash later; requests beyond the pool are refused by
 * kn_kv_seq_reserve. block_bytes: K+V bytes of one block over the main
 * pool's layers in their formats (KV_FORMATS.md memory formula; 0: all
 * layers are in the ring). */
static kn_code plan_kv_blocks(kn_model *m, double block_bytes, double ring_bytes, int64_t *blocks, kn_error *err) {
    kn_backend *be = m->be;
    if (!be->vt->memory_info) return KN_OK;
    size_t free_b = 0, total_b = 0;
    be->vt->memory_info(be, &free_b, &total_b);
    if (!total_b) return KN_OK;
    const double frac = be->memory_fraction > 0 ? be->memory_fraction : 0.9;
    const double used = (double)(total_b - free_b), budget = frac * (double)total_b - used - ring_bytes;
    const double reserve = 256.0 * (1 << 20); /* cuBLAS workspace, attention scratch, graphs */
    const int64_t fit = budget <= reserve ? 0 : block_bytes > 0 ? (int64_t)((budget - reserve) / block_bytes) : *blocks;
    if (fit < m->max_blocks)
        return kn_fail(err, KN_ERR_NOMEM,
                       "KV cache: %.2f GiB of the device's %.1f GiB budget (--gpu-memory %.2f) is left after the "
                       "weights%s, room for %lld tokens; context %d needs %lld (lower --ctx or raise --gpu-memory)",
                       budget > 0 ? budget / (1 << 30) : 0.0, frac * (double)total_b / (1 << 30), frac,
                       ring_bytes > 0 ? " and the sliding-window ring" : "", (long long)fit * KN_KV_BLOCK_SIZE,
                       m->max_context, (long long)m->max_blocks * KN_KV_BLOCK_SIZE);
    if (*blocks > fit) *blocks = fit;
    return KN_OK;
}

/* The KV pools: full-attention layers in m->kv, sliding-window layers in its
 * ring (kv_paged.h) when a ring of window + max_chunk - 1 positions is
 * smaller than the context. Only layers that own K/V get storage, each pool
 * layer in its model layer's shape and in the formats spec gives that model
 * layer (boundary layers count model layers); KV-shared layers view their
 * source's. With delayed conversion (--kv-start) both pools stage. */
static kn_code build_kv(kn_model *m, const kn_kv_spec *kv, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int bs = KN_KV_BLOCK_SIZE, nl = c->n_layers;
    const int ring_blocks = c->sliding_window > 0 ? (c->sliding_window + m->max_chunk - 1 + bs - 1) / bs : 0;
    const int use_ring = !c->sliding_kv_full && ring_blocks > 0 && ring_blocks < m->max_blocks;
    /* per pool p (0 main, 1 ring): model layer ids, heads, head dims of its layers, bytes per token */
    int idx[KN_MAX_LAYERS], ids[2][KN_MAX_LAYERS], heads[2][KN_MAX_LAYERS], dims[2][KN_MAX_LAYERS], n_in[2] = {0, 0};
    int64_t tok_bytes[2] = {0, 0};
    /* compute dtype: the weights' (quantized: the checkpoint's torch_dtype, the dtype its scales came in) */
    const kn_weight *w0 = &m->layers[0].qkv;
    const kn_dtype cdt = !w0->bits ? w0->dtype : strstr(c->torch_dtype, "float32") ? KN_DT_F32 : KN_DT_BF16;
    kn_kv_spec spec = kv ? *kv : kn_kv_spec_default(cdt);
    if (spec.kv_start > 0 && spec.k_fmt == spec.boundary_fmt && spec.v_fmt == spec.boundary_fmt) spec.kv_start = 0;
    if (spec.kv_start > m->max_context) spec.kv_start = 0; /* never reached: the cache stays bf16 */
    for (int l = 0; l < nl; l++) {
        kn_layer *L = &m->layers[l];
        L->in_ring = use_ring && c->layer_sliding[l];
        if (L->kv_source != l) continue;
        const int p = L->in_ring, i = n_in[p]++;
        int kf, vf;
        kn_kv_spec_layer(&spec, l, nl, &kf, &vf);
        ids[p][i] = l, heads[p][i] = L->n_kv_heads, dims[p][i] = L->head_dim;
        tok_bytes[p] += (int64_t)L->n_kv_heads * (kn_kv_row_bytes(kf, L->head_dim) + kn_kv_row_bytes(vf, L->head_dim));
        idx[l] = i;
    }
    int all_dims[KN_MAX_LAYERS]; /* every layer's head dim must suit its formats (as without a ring) */
    for (int l = 0; l < nl; l++) all_dims[l] = m->layers[l].head_dim;
    kn_code rc = kn_kv_spec_check(&spec, nl, all_dims, err);
    if (rc) return rc;
    const int64_t ring_pool_blocks = n_in[1] ? (int64_t)ring_blocks * m->max_seqs : 0;
    const double ring_bytes = (double)ring_pool_blocks * bs * (double)tok_bytes[1];
    int64_t kv_blocks = (int64_t)m->max_blocks * m->max_seqs;
    rc = plan_kv_blocks(m, (double)bs * (double)tok_bytes[0], ring_bytes, &kv_blocks, err);
    kn_kv_pool_params pp = {.n_layers = n_in[0], .block_size = bs, .n_blocks = kv_blocks, .n_kv_heads = heads[0],
                            .head_dim = dims[0], .spec = &spec,
                            .n_stage_blocks = (int64_t)m->max_seqs * (spec.kv_start / bs),
                            .layer_ids = ids[0], .model_layers = nl};
    if (!rc) rc = kn_kv_pool_create_ex(m->be, &pp, &m->kv, err);
    if (!rc && n_in[1]) {
        /* delayed conversion: a sequence stages its ring entries below kv_start */
        const int ring_stage = spec.kv_start / bs < ring_blocks ? spec.kv_start / bs : ring_blocks;
        kn_kv_pool_params rp = {.n_layers = n_in[1], .block_size = bs, .n_blocks = ring_pool_blocks,
                                .n_kv_heads = heads[1], .head_dim = dims[1], .spec = &spec,
                                .n_stage_blocks = (int64_t)m->max_seqs * ring_stage,
                                .layer_ids = ids[1], .model_layers = nl};
        rc = kn_kv_pool_add_ring_ex(m->kv, &rp, ring_blocks, err);
    }
    if (rc) return rc;
    for (int l = 0; l < nl; l++) { /* pool layers already have the layer's shape (KV-shared: the source's, the same) */
        const kn_layer *L = &m->layers[l];
        const kn_kv_pool *pool = L->in_ring ? m->kv->ring : m->kv;
        m->kvl[l] = pool->layers[idx[L->kv_source]];
    }
    if (n_in[1]) {
        const size_t bt = (size_t)m->max_seqs * (size_t)m->max_blocks * 4;
        m->d_bt_ring = kn_be_alloc(m->be, bt), m->h_bt_ring = malloc(bt);
        m->d_slots_ring = kn_be_alloc(m->be, (size_t)m->max_chunk * 4);
        if (!m->d_bt_ring || !m->h_bt_ring || !m->d_slots_ring)
            return kn_fail(err, KN_ERR_NOMEM, "out of memory for the sliding-window block tables");
    }
    if (spec.kv_start > 0) { /* delayed conversion: staged sequences through views of the staging arenas */
        const size_t bt = (size_t)m->max_seqs * (size_t)m->max_blocks * 4;
        m->kvl_stage = calloc((size_t)nl, sizeof *m->kvl_stage);
        m->d_bt_stage = kn_be_alloc(m->be, bt), m->h_bt_stage = malloc(bt);
        if (n_in[1]) m->d_bt_ring_stage = kn_be_alloc(m->be, bt), m->h_bt_ring_stage = malloc(bt);
        if (!m->kvl_stage || !m->d_bt_stage || !m->h_bt_stage || (n_in[1] && (!m->d_bt_ring_stage || !m->h_bt_ring_stage)))
            return kn_fail(err, KN_ERR_NOMEM, "out of memory for the --kv-start staging views");
        for (int l = 0; l < nl; l++) m->kvl_stage[l] = kn_kv_stage_view(&m->kvl[l]);
    }
    return KN_OK;
}

kn_code kn_model_build(const kn_model_config *cfg, const kn_tensor_source *src, kn_backend *be, int max_context,
                       int max_seqs, kn_model **out, kn_error *err) {
    return kn_model_build_kv(cfg, src, be, max_context, max_seqs, NULL, out, err);
}

kn_code kn_model_build_kv(const kn_model_config *cfg, const kn_tensor_source *src, kn_backend *be, int max_context,
                          int max_seqs, const kn_kv_spec *kv, kn_model **out, kn_error *err) {
    *out = NULL;
    kn_model *m = calloc(1, sizeof *m);
    if (!m) {
        kn_backend_destroy(be);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    m->cfg = *cfg;
    m->be = be;
    const kn_model_config *c = &m->cfg;
    m->max_context = max_context;
    m->max_seqs = max_seqs;
    m->max_chunk = be->prefill_chunk > 0 && be->prefill_chunk < MAX_CHUNK ? be->prefill_chunk
                   : be->prefill_chunk > 0                                 ? MAX_CHUNK
                                                                           : DEFAULT_CHUNK;
    /* a decode step of every sequence fits one logits chunk */
    m->logits_rows = max_seqs > MAX_LOGIT_ROWS ? (max_seqs < m->max_chunk ? max_seqs : m->max_chunk) : MAX_LOGIT_ROWS;
    kn_code rc = KN_OK;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->kvl = calloc((size_t)c->n_layers, sizeof *m->kvl);
    if (!m->layers || !m->kvl) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto fail; }
    if ((rc = plan_layers(m, err))) goto fail;
    if (c->ple_dim && c->ple_vocab < c->vocab_size && c->arch != KN_ARCH_GEMMA3N) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "vocab_size_per_layer_input %d is smaller than vocab_size %d", c->ple_vocab,
                     c->vocab_size);
        goto fail;
    }
    if (c->n_experts > 0 && (!be->vt->moe_ffn || !be->vt->moe_route)) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "the %s backend has no mixture-of-experts ops", be->vt->name);
        goto fail;
    }

    /* rope first: GLM's interleaved rotary permutes q/k rows by rot_dim at load */
    {
        int hd_global = c->head_dim, hd_local = c->head_dim; /* head dims of global / sliding layers */
        for (int l = 0; l < c->n_layers; l++) *(c->layer_sliding[l] ? &hd_local : &hd_global) = c->layer_head_dim[l];
        if ((rc = build_rope(m, &c->rope, hd_global, &m->rope, err))) goto fail;
        if (kn_rope_length_dependent(&c->rope)) { /* per-call tables: one per run of a sequence's tokens */
            if (c->has_local_rope) {
                rc = kn_fail(err, KN_ERR_UNSUPPORTED, "length-dependent RoPE (dynamic / longrope) with per-layer-type "
                             "RoPE is not supported");
                goto fail;
            }
            const size_t half = (size_t)m->rope.rot_dim / 2;
            m->rope_runs = kn_be_alloc(be, (size_t)MAX_CHUNK * half * sizeof(float));
            m->h_rope_runs = malloc((size_t)MAX_CHUNK * half * sizeof(float));
            m->run_t0 = malloc(MAX_CHUNK * sizeof(int)), m->run_n = malloc(MAX_CHUNK * sizeof(int));
            m->run_scale = malloc(MAX_CHUNK * sizeof(float));
            if (!m->rope_runs || !m->h_rope_runs || !m->run_t0 || !m->run_n || !m->run_scale) {
                rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
                goto fail;
            }
        }
        if (c->has_local_rope && (rc = build_rope(m, &c->rope_local, hd_local, &m->rope_local, err))) goto fail;
    }

    /* plain or MLX-quantized (embed_tokens.scales/.biases); a tied head then
     * multiplies by the quantized table too */
    ld_part ep[] = {{"model.embed_tokens.weight", c->vocab_size}};
    if ((rc = ld_load_fused(m, src, 0, ep, 1, c->hidden_size, NULL, &m->embed, err))) goto fail;
    const kn_st_tensor *head = src->find(src->ctx, "lm_head.weight");
    if (head && !c->tie_word_embeddings) {
        ld_part hp[] = {{"lm_head.weight", c->vocab_size}};
        if ((rc = ld_load_fused(m, src, 0, hp, 1, c->hidden_size, NULL, &m->lm_head, err))) goto fail;
    } else if (!head && !c->tie_word_embeddings) {
        rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint has no lm_head.weight and tie_word_embeddings is false");
        goto fail;
    } else {
        m->lm_head = m->embed; /* tied: same memory, owned by embed */
        m->lm_head.owned = 0;
    }
    if ((rc = ld_load_vec(m, src, "model.norm.weight", 0, c->hidden_size, 1, (float)c->norm_weight_offset,
                          &m->final_norm, err)))
        goto fail;
    if (c->layer_norm && (rc = ld_load_vec(m, src, "model.norm.bias", 0, c->hidden_size, 0, 0.0f, &m->final_norm_b, err)))
        goto fail;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(m, src, l, err))) goto fail;
    if (c->ple_dim) { /* gemma4 per-layer input embeddings */
        const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
        const kn_st_tensor *pe = src->find(src->ctx, "model.embed_tokens_per_layer.weight");
        ld_part pp[] = {{"model.per_layer_model_projection.weight", LP}};
        if (!pe) { rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor model.embed_tokens_per_layer.weight"); goto fail; }
        if ((rc = ld_check_float(pe, "model.embed_tokens_per_layer.weight", err)) ||
            (rc = ld_check_shape(pe, "model.embed_tokens_per_layer.weight", c->ple_vocab, LP, err)) ||
            (rc = kn_be_weight_load(be, pe->dtype, c->ple_vocab, LP, pe->data, src->borrow, &m->ple_embed, err)) ||
            (rc = ld_load_fused(m, src, 0, pp, 1, c->hidden_size, NULL, &m->ple_model_proj, err)) ||
            (rc = ld_load_vec(m, src, "model.per_layer_projection_norm.weight", 0, c->ple_dim, 1,
                              (float)c->norm_weight_offset, &m->ple_proj_norm, err)))
            goto fail;
    }

    /* scratch */
    const size_t T = (size_t)m->max_chunk, F = sizeof(float);
    m->x = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->xn = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->tmp = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
    m->qkv = kn_be_alloc(be, T * (size_t)m->qkv_dim * F);
    m->attn = kn_be_alloc(be, T * (size_t)m->q_dim * F);
    m->gu = kn_be_alloc(be, T * 2 * (size_t)m->ffn_max * F);
    m->act = kn_be_alloc(be, T * (size_t)m->ffn_max * F);
    m->logits = kn_be_alloc(be, (size_t)m->logits_rows * (size_t)c->vocab_size * F);
    m->max_blocks = (max_context + KN_KV_BLOCK_SIZE - 1) / KN_KV_BLOCK_SIZE;
    m->d_tokens = kn_be_alloc(be, T * 4), m->d_pos = kn_be_alloc(be, T * 4), m->d_seq = kn_be_alloc(be, T * 4);
    m->d_slots = kn_be_alloc(be, T * 4), m->d_rows = kn_be_alloc(be, T * 4), m->d_argmax = kn_be_alloc(be, T * 4);
    m->d_bt = kn_be_alloc(be, (size_t)max_seqs * (size_t)m->max_blocks * 4);
    if (be->vt->sample_rows) {
        m->d_sample = kn_be_alloc(be, T * sizeof *m->d_sample);
        m->d_edits = kn_be_alloc(be, KN_SAMPLE_MAX_EDITS * sizeof *m->d_edits);
        if (!m->d_sample || !m->d_edits) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for sampling parameters");
            goto fail;
        }
    }
    m->h_bt = malloc((size_t)max_seqs * (size_t)m->max_blocks * 4);
    int moe_ok = 1;
    if (c->ple_dim) {
        const size_t LP = (size_t)c->n_layers * (size_t)c->ple_dim;
        m->ple = kn_be_alloc(be, T * LP * F), m->ple_tmp = kn_be_alloc(be, T * LP * F);
        m->ple_g = kn_be_alloc(be, T * (size_t)c->ple_dim * F);
        moe_ok = m->ple && m->ple_tmp && m->ple_g;
    }
    if (c->v_norm) {
        float ones[1024];
        for (int i = 0; i < 1024; i++) ones[i] = 1.0f;
        if ((rc = ld_upload_vec(m, ones, m->max_head_dim, &m->ones, err))) goto fail;
    }
    if (c->n_experts > 0) {
        const size_t k = (size_t)c->n_experts_per_tok;
        m->router_logits = kn_be_alloc(be, T * (size_t)c->n_experts * F);
        m->route_w = kn_be_alloc(be, T * k * F);
        m->route_idx = kn_be_alloc(be, T * k * 4);
        m->moe_scratch = kn_be_alloc(be, kn_moe_scratch_floats(m->max_chunk, c->hidden_size, c->moe_intermediate_size,
                                                              c->n_experts_per_tok) * F);
        m->tmp2 = kn_be_alloc(be, T * (size_t)c->hidden_size * F);
        m->shared_g = kn_be_alloc(be, T * F);
        moe_ok = moe_ok && m->router_logits && m->route_w && m->route_idx && m->moe_scratch && m->tmp2 && m->shared_g;
    }
    if (!m->x || !m->xn || !m->tmp || !m->qkv || !m->attn || !m->gu || !m->act || !m->logits || !m->d_tokens ||
        !m->d_pos || !m->d_seq || !m->d_slots || !m->d_rows || !m->d_argmax || !m->d_bt || !m->h_bt || !moe_ok) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for activations");
        goto fail;
    }
    if (c->altup_inputs && (rc = kn_gemma3n_load(m, src, err))) goto fail;
    if ((rc = build_kv(m, kv, err))) goto fail;
    char wdesc[48];
    if (m->embed.bits || m->layers[0].qkv.bits) {
        const kn_weight *qw = m->layers[0].qkv.bits ? &m->layers[0].qkv : &m->embed;
        snprintf(wdesc, sizeof wdesc, "%d-bit g%d MLX-quantized", qw->bits, qw->group_size);
    } else
        snprintf(wdesc, sizeof wdesc, "%s", kn_dtype_name(m->embed.dtype));
    int n = snprintf(m->desc, sizeof m->desc, "%s: %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d, %s weights",
                     c->model_type, c->n_layers, c->hidden_size, c->n_heads, c->n_kv_heads, c->head_dim,
                     c->intermediate_size, c->vocab_size, wdesc);
    if (c->n_experts > 0 && n > 0 && (size_t)n < sizeof m->desc)
        snprintf(m->desc + n, sizeof m->desc - (size_t)n, ", %d experts (top %d, ffn %d)%s", c->n_experts,
                 c->n_experts_per_tok, c->moe_intermediate_size, c->shared_expert_intermediate_size ? " + shared" : "");
    n = (int)strlen(m->desc);
    if ((size_t)n + 48 < sizeof m->desc) {
        char kvd[160];
        kn_kv_spec_describe(&m->kv->header.spec, c->n_layers, kvd, sizeof kvd);
        snprintf(m->desc + n, sizeof m->desc - (size_t)n, ", KV %s", kvd);
    }
    *out = m;
    return KN_OK;
fail:
    kn_model_free_internal(m);
    return rc;
}

static int64_t wbytes(const kn_weight *w) { return kn_weight_bytes(w); }

int64_t kn_model_total_weight_bytes(const kn_model *m) {
    int64_t b = wbytes(&m->embed) + (m->lm_head.data != m->embed.data ? wbytes(&m->lm_head) : 0);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        b += wbytes(&L->qkv) + wbytes(&L->o) + wbytes(&L->gate_up) + wbytes(&L->down) + wbytes(&L->ple_gate) +
             wbytes(&L->ple_proj) + wbytes(&L->router) + wbytes(&L->experts_gate_up) + wbytes(&L->experts_down) +
             wbytes(&L->shared_gate);
    }
    return b;
}

int64_t kn_model_weight_bytes(const kn_model *m) {
    int64_t b = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        b += wbytes(&L->qkv) + wbytes(&L->o);
        b += L->is_moe ? kn_moe_active_bytes(m, L) : wbytes(&L->gate_up) + wbytes(&L->down);
        b += wbytes(&L->ple_gate) + wbytes(&L->ple_proj);
    }
    b += wbytes(&m->lm_head);
    return b;
}

/* norm of rows [n, H] (RMSNorm, or LayerNorm with bias); in place allowed */
static void norm_rows(kn_model *m, const float *x, float *out, int n, const float *w, const float *b) {
    const int H = m->cfg.hidden_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    if (m->cfg.layer_norm) m->be->vt->layer_norm(m->be, x, H, out, H, n, H, w, b, eps);
    else m->be->vt->rms_norm(m->be, x, H, out, H, n, 1, H, w, eps);
}

/* x += residual_scale * post_norm(y); y is clobbered */
static void residual_add(kn_model *m, float *y, const float *post_norm, int n) {
    const kn_backend_vtbl *op = m->be->vt;
    const int64_t len = (int64_t)n * m->cfg.hidden_size;
    if (post_norm) norm_rows(m, y, y, n, post_norm, NULL);
    if (m->cfg.residual_scale != 1.0) op->scale(m->be, y, len, (float)m->cfg.residual_scale);
    op->add(m->be, m->x, y, len);
}

/* x += in . W^T (+ bias), then through the optional post-norm and residual
 * scale: one fused matmul_add where the backend has it and nothing sits
 * between the projection and the residual add. */
static void project_residual(kn_model *m, const float *in, int n, const kn_weight *w, const float *bias,
                             const float *post_norm) {
    const kn_backend_vtbl *op = m->be->vt;
    if (op->matmul_add && !post_norm && m->cfg.residual_scale == 1.0 && op->matmul_add(m->be, in, n, w, bias, m->x))
        return;
    op->matmul(m->be, in, n, w, bias, m->tmp);
    residual_add(m, m->tmp, post_norm, n);
}

/* feed-forward of xn[n, H] into out[n, H] (rms_w: xn is not normalized yet,
 * RMSNorm with that weight comes first); with may_fuse (nothing between
 * it and a plain residual add) the down projection adds into x directly where
 * the backend fuses that, and 1 is returned */
static int mlp(kn_model *m, const kn_layer *L, const float *xn, const float *rms_w, int n, float *out, int may_fuse) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const kn_backend_vtbl *op = be->vt;
    const int I = L->inter;
    if (L->is_moe && !c->moe_parallel) {
        /* the residual add inside the op, unless the shared expert would then
         * read x after the routed experts added into it (no norm to copy x) */
        const int add = may_fuse && (rms_w || !L->shared_gate.data);
        kn_moe_forward(m, L, xn, rms_w, n, add ? m->x : out, add);
        return add;
    }
    /* prefill: the whole feed-forward and its residual add in one op where
     * the backend has it (the activation stays in the GEMM input dtype) */
    if (may_fuse && !L->sparse && c->mlp_gated && c->act == KN_ACT_SILU && op->mlp_swiglu_add &&
        op->mlp_swiglu_add(be, xn, n, rms_w, (float)c->rms_norm_eps, &L->gate_up, L->gate_up_bias, &L->down,
                           L->down_bias, m->x))
        return 1;
    /* decode: RMSNorm, gate_up and SwiGLU as one kernel where the backend has it */
    if (!(!L->sparse && c->mlp_gated && c->act == KN_ACT_SILU && op->fused_matmul &&
          op->fused_matmul(be, xn, n, rms_w, (float)c->rms_norm_eps, &L->gate_up, L->gate_up_bias, m->act,
                           KN_EPI_SWIGLU))) {
        if (rms_w) {
            norm_rows(m, xn, m->xn, n, rms_w, NULL);
            xn = m->xn;
        }
        op->matmul(be, xn, n, &L->gate_up, L->gate_up_bias, m->gu);
        if (L->sparse) op->gaussian_topk(be, m->gu, 2 * (int64_t)I, n, I, L->sparse_mult); /* gemma3n */
        if (!c->mlp_gated)
            op->gelu(be, m->gu, (int64_t)n * I, m->act, c->act == KN_ACT_GELU_ERF ? KN_GELU_ERF : KN_GELU_TANH);
        else if (c->act == KN_ACT_SILU) op->swiglu(be, m->gu, n, I, m->act);
        else op->geglu(be, m->gu, n, I, m->act, c->act == KN_ACT_GELU_ERF ? KN_GELU_ERF : KN_GELU_TANH);
    }
    if (may_fuse && op->matmul_add && op->matmul_add(be, m->act, n, &L->down, L->down_bias, m->x)) return 1;
    op->matmul(be, m->act, n, &L->down, L->down_bias, out);
    return 0;
}

void kn_dec_ple_inputs(kn_model *m, const float *x, int n) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const kn_backend_vtbl *op = be->vt;
    const int P = c->ple_dim, LP = c->n_layers * c->ple_dim, H = c->hidden_size;
    /* per-layer inputs [n, L*P]: (norm(x W_p^T / sqrt(H)) + table[id] * sqrt(P)) / sqrt(2) */
    op->embed(be, &m->ple_embed, m->d_ple_tokens ? m->d_ple_tokens : m->d_tokens, n, m->ple);
    op->scale(be, m->ple, (int64_t)n * LP, (float)sqrt((double)P));
    op->matmul(be, x, n, &m->ple_model_proj, NULL, m->ple_tmp);
    op->scale(be, m->ple_tmp, (int64_t)n * LP, (float)pow((double)H, -0.5));
    op->rms_norm(be, m->ple_tmp, LP, m->ple_tmp, LP, n, c->n_layers, P, m->ple_proj_norm, (float)c->rms_norm_eps);
    op->add(be, m->ple_tmp, m->ple, (int64_t)n * LP);
    op->scale(be, m->ple_tmp, (int64_t)n * LP, (float)pow(2.0, -0.5));
}

int kn_dec_mlp(kn_model *m, const kn_layer *L, const float *xn, int n, float *out, int may_fuse) {
    return mlp(m, L, xn, NULL, n, out, may_fuse);
}
void kn_dec_norm_rows(kn_model *m, const float *x, float *out, int n, const float *w, const float *b) {
    norm_rows(m, x, out, n, w, b);
}
void kn_dec_residual_add(kn_model *m, float *y, const float *post_norm, int n) { residual_add(m, y, post_norm, n); }

/* each token of b its sequence's only one (sequences in ascending order:
 * other batches are not checked, and answer 0) */
static int one_token_per_sequence(const kn_batch *b) {
    for (int t = 1; t < b->n_tokens; t++)
        if (b->seq[t] <= b->seq[t - 1]) return 0;
    return b->n_tokens > 0;
}

/* Attention of layer l on in[n, H] (already pre-normed): q/k/v projection
 * (in NULL: m->qkv holds it already, e.g. fused with the norm), q/k/v norms, RoPE, K/V written to the layer's cache (unless KV-shared),
 * paged attention into m->attn [n, q_dim] (before o_proj). */
void kn_dec_attention(kn_model *m, const kn_batch *b, int l, const float *in) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const kn_backend_vtbl *op = be->vt;
    const kn_layer *L = &m->layers[l];
    const int n = b->n_tokens, hd = L->head_dim, qs = L->qkv_stride, shared = L->kv_source != l;
    const float eps = (float)c->rms_norm_eps;
    int written = 0; /* K/V already in the cache */
    if (in) op->matmul(be, in, n, &L->qkv, L->qkv_bias, m->qkv);
    float *q = m->qkv, *k = m->qkv + L->q_dim, *v = k + L->kv_dim;
    if (c->v_norm && !shared) op->rms_norm(be, v, qs, v, qs, n, L->n_kv_heads, hd, m->ones, eps);
    const kn_rope_table *rt = c->has_local_rope && c->layer_sliding[l] ? &m->rope_local : &m->rope;
    const int head_norm = c->qk_norm_kind == KN_QK_NORM_HEAD;
    if (c->qk_norm_kind == KN_QK_NORM_FULL) { /* over the whole projection: its own op */
        op->rms_norm(be, q, qs, q, qs, n, 1, L->q_dim, L->q_norm, eps);
        op->rms_norm(be, k, qs, k, qs, n, 1, L->kv_dim, L->k_norm, eps);
    }
    /* delayed conversion: the first ns tokens (staged sequences) go to the staging views */
    const int ns = m->kvl_stage ? m->n_staged : 0;
    const kn_kv_layer *kvw = ns == n ? &m->kvl_stage[l] : &m->kvl[l]; /* the one cache of an unsplit batch */
    int32_t *slots = L->in_ring ? m->d_slots_ring : m->d_slots;
    kn_attention_args a = {
        .q = q, .q_stride = qs, .out = m->attn, .n_tokens = n, .n_heads = c->n_heads,
        .scale = (float)c->attn_scale, .window = c->layer_sliding[l] ? c->sliding_window : 0,
        .pos = m->d_pos, .seq = m->d_seq, .block_tables = L->in_ring ? m->d_bt_ring : m->d_bt,
        .max_blocks = m->max_blocks,
        .kv = &m->kvl[L->kv_source], .softcap = (float)c->attn_softcap, .pos_host = b->pos, .seq_host = b->seq,
        /* quantized weights: the dtype of their scales, as MLX computes (bf16
         * scales: bf16 attention, the tensor-core kernels; f32 scales: exact) */
        .compute_dtype = L->qkv.bits ? L->qkv.sb_dtype : L->qkv.dtype,
    };
    const int one_pass = c->layer_rope[l] && !m->rope_runs && !shared && L->q_dim == c->n_heads * hd;
    const kn_rope_kv_args rk = {q, v, qs, n, c->n_heads, L->n_kv_heads, hd, m->d_pos, rt, kvw, slots,
                                head_norm ? L->q_norm : NULL, head_norm ? L->k_norm : NULL, eps};
    /* per-head q/k norms, RoPE, the cache write and the attention in one
     * pass where the backend has it (decode rows, one per sequence) */
    if (one_pass && ns == 0 && op->rope_kv_attention && one_token_per_sequence(b) && op->rope_kv_attention(be, &rk, &a))
        return;
    int roped = 0; /* per-head q/k norms, RoPE and the cache write in one pass, where the backend has it */
    if (one_pass && op->rope_kv_write && (ns == 0 || ns == n))
        roped = written = op->rope_kv_write(be, q, v, qs, n, c->n_heads, L->n_kv_heads, hd, m->d_pos, rt, kvw, slots,
                                            rk.q_norm, rk.k_norm, eps);
    if (!roped) { /* the same steps one op at a time */
        if (head_norm) {
            op->rms_norm(be, q, qs, q, qs, n, c->n_heads, hd, L->q_norm, eps);
            if (!shared) op->rms_norm(be, k, qs, k, qs, n, L->n_kv_heads, hd, L->k_norm, eps);
        }
        if (c->layer_rope[l] && m->rope_runs) { /* length-dependent RoPE: each run of tokens with its sequence's table */
            const int half = m->rope.rot_dim / 2;
            for (int r = 0; r < m->n_runs; r++) {
                const kn_rope_table rr = {m->rope.rot_dim, m->run_scale[r], m->rope_runs + (size_t)r * half};
                const int t0 = m->run_t0[r];
                op->rope(be, q + (int64_t)t0 * qs, qs, m->run_n[r], c->n_heads, hd, m->d_pos + t0, &rr);
                if (!shared) op->rope(be, k + (int64_t)t0 * qs, qs, m->run_n[r], L->n_kv_heads, hd, m->d_pos + t0, &rr);
            }
        } else if (c->layer_rope[l]) {
            if (!shared && L->q_dim == c->n_heads * hd) { /* k's heads follow q's: one pass rotates both */
                op->rope(be, q, qs, n, c->n_heads + L->n_kv_heads, hd, m->d_pos, rt);
            } else {
                op->rope(be, q, qs, n, c->n_heads, hd, m->d_pos, rt);
                if (!shared) op->rope(be, k, qs, n, L->n_kv_heads, hd, m->d_pos, rt);
            }
        }
    }
    if (!shared && !written) {
        if (ns > 0) op->kv_write(be, &m->kvl_stage[l], k, v, qs, ns, slots);
        if (ns < n) op->kv_write(be, &m->kvl[l], k + (int64_t)ns * qs, v + (int64_t)ns * qs, qs, n - ns, slots + ns);
    }
    if (ns > 0) { /* staged sequences' tokens against the staging views */
        kn_attention_args as = a;
        as.n_tokens = ns, as.kv = &m->kvl_stage[L->kv_source];
        as.block_tables = L->in_ring ? m->d_bt_ring_stage : m->d_bt_stage;
        op->attention(be, &as);
    }
    if (ns < n) {
        const int64_t o = ns; /* the other tokens, from row ns on */
        a.q = q + o * qs, a.out = m->attn + o * c->n_heads * hd, a.n_tokens = n - ns;
        a.pos = m->d_pos + o, a.seq = m->d_seq + o, a.pos_host = b->pos + o, a.seq_host = b->seq + o;
        op->attention(be, &a);
    }
}

/* Enqueue the whole forward of batch b (index arrays already uploaded);
 * logits_host NULL leaves the (single) logits chunk on the backend. */
static void forward_compute(kn_model *m, const kn_batch *b, float *logits_host) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const int n = b->n_tokens, H = c->hidden_size;
    const kn_backend_vtbl *op = be->vt;
    const float eps = (float)c->rms_norm_eps;
    const int P = c->ple_dim, LP = c->n_layers * c->ple_dim;
    if (c->altup_inputs) { /* gemma3n: its own residual streams (gemma3n.c), final hidden state in m->x */
        kn_gemma3n_forward(m, b);
        goto logits;
    }
    op->embed(be, &m->embed, m->d_tokens, n, m->x);
    if (c->embed_scale != 1.0) op->scale(be, m->x, (int64_t)n * H, (float)c->embed_scale);
    if (P) kn_dec_ple_inputs(m, m->x, n);
    for (int l = 0; l < c->n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        /* attention */
        const float *in = m->x;
        /* decode: RMSNorm and the qkv projection as one kernel where the backend has it */
        if (!(L->attn_norm && !c->layer_norm && op->fused_matmul &&
              op->fused_matmul(be, m->x, n, L->attn_norm, eps, &L->qkv, L->qkv_bias, m->qkv, KN_EPI_NONE))) {
            if (L->attn_norm) {
                norm_rows(m, m->x, m->xn, n, L->attn_norm, L->attn_norm_b);
                in = m->xn;
            }
            op->matmul(be, in, n, &L->qkv, L->qkv_bias, m->qkv);
        }
        kn_dec_attention(m, b, l, NULL); /* m->qkv holds the projection */
        project_residual(m, m->attn, n, &L->o, L->o_bias, L->post_attn_norm);
        /* feed-forward */
        in = m->x;
        const float *mlp_rms = NULL; /* RMSNorm left to mlp() (it may fuse it) */
        if (L->mlp_norm && !c->layer_norm && !(L->is_moe && c->moe_parallel)) mlp_rms = L->mlp_norm;
        else if (L->mlp_norm) {
            norm_rows(m, m->x, m->xn, n, L->mlp_norm, L->mlp_norm_b);
            in = m->xn;
        }
        const int may_fuse = !L->post_mlp_norm && c->residual_scale == 1.0 && !(L->is_moe && c->moe_parallel);
        if (!mlp(m, L, in, mlp_rms, n, m->tmp, may_fuse)) {
            if (L->is_moe && c->moe_parallel) { /* gemma4: MoE block beside the dense MLP, both on the residual */
                norm_rows(m, m->tmp, m->tmp, n, L->moe_post_norm1, NULL);
                kn_moe_gemma4_forward(m, L, m->x, n, m->xn, m->tmp2);
                norm_rows(m, m->tmp2, m->tmp2, n, L->moe_post_norm2, NULL);
                op->add(be, m->tmp, m->tmp2, (int64_t)n * H);
            }
            residual_add(m, m->tmp, L->post_mlp_norm, n);
        }
        if (P) { /* gemma4: x += norm(proj(act(gate(x)) * per_layer_input[l])) */
            op->matmul(be, m->x, n, &L->ple_gate, NULL, m->ple_g);
            op->gelu(be, m->ple_g, (int64_t)n * P, m->ple_g, c->act == KN_ACT_GELU_ERF ? KN_GELU_ERF : KN_GELU_TANH);
            op->mul_rows(be, m->ple_g, m->ple_tmp + (size_t)l * P, LP, n, P);
            op->matmul(be, m->ple_g, n, &L->ple_proj, NULL, m->tmp);
            norm_rows(m, m->tmp, m->tmp, n, L->ple_norm, NULL);
            op->add(be, m->x, m->tmp, (int64_t)n * H);
        }
        if (L->layer_scalar != 1.0f) op->scale(be, m->x, (int64_t)n * H, L->layer_scalar);
    }
logits:
    /* logits for the requested rows, a few rows at a time */
    for (int r0 = 0; r0 < b->n_logits; r0 += m->logits_rows) {
        int nr = b->n_logits - r0 < m->logits_rows ? b->n_logits - r0 : m->logits_rows;
        op->gather_rows(be, m->x, H, m->d_rows + r0, nr, m->xn);
        if (!(!c->layer_norm && op->fused_matmul &&
              op->fused_matmul(be, m->xn, nr, m->final_norm, eps, &m->lm_head, NULL, m->logits, KN_EPI_NONE))) {
            norm_rows(m, m->xn, m->xn, nr, m->final_norm, m->final_norm_b);
            op->matmul(be, m->xn, nr, &m->lm_head, NULL, m->logits);
        }
        const int64_t len = (int64_t)nr * c->vocab_size;
        if (c->logit_scale != 1.0) op->scale(be, m->logits, len, (float)c->logit_scale);
        if (c->final_softcap > 0) op->softcap(be, m->logits, len, (float)c->final_softcap);
        if (b->sample)
            op->sample_rows(be, m->logits, nr, c->vocab_size, m->d_sample + r0, m->d_edits, m->d_argmax + r0);
        else if (b->argmax) op->argmax_rows(be, m->logits, nr, c->vocab_size, m->d_argmax + r0);
        else if (logits_host) /* eager: fetch each chunk; recorded: the caller fetches the single chunk */
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
    if (b->sample) {
        if (!m->d_sample || !b->argmax || b->n_edits < 0 || b->n_edits > KN_SAMPLE_MAX_EDITS)
            return kn_fail(err, KN_ERR_INVALID_ARG, "forward: backend sampling needs sample_rows, argmax and at most "
                           "%d edits", KN_SAMPLE_MAX_EDITS);
        for (int r = 0; r < b->n_logits; r++)
            if (b->sample[r].n_edits < 0 || b->sample[r].edit0 < 0 || b->sample[r].edit0 + b->sample[r].n_edits > b->n_edits)
                return kn_fail(err, KN_ERR_INVALID_ARG, "forward: sampling row %d names edits outside the %d given", r,
                               b->n_edits);
    }
    /* delayed KV conversion: a staged sequence appending at or beyond
     * kv_start is converted first; an append may not straddle kv_start */
    for (int s = 0; s < b->n_seqs && m->kv->header.spec.kv_start > 0; s++) {
        kn_kv_seq *sq = b->seqs[s];
        if (!kn_kv_seq_staged(m->kv, sq)) continue;
        int lo = INT32_MAX, hi = -1;
        for (int t = 0; t < n; t++)
            if (b->seq[t] == s) lo = b->pos[t] < lo ? b->pos[t] : lo, hi = b->pos[t] > hi ? b->pos[t] : hi;
        const int start = m->kv->header.spec.kv_start;
        if (hi >= start && lo < start)
            return kn_fail(err, KN_ERR_INVALID_ARG, "forward: positions %d..%d straddle --kv-start %d (cap the chunk "
                           "with kn_kv_max_append)", lo, hi, start);
        kn_code rc;
        if (lo >= start && hi >= 0 && (rc = kn_kv_seq_convert(m->kv, sq, err))) return rc;
    }
    /* staged sequences' tokens first (stable), so that kn_dec_attention writes and reads them through
     * the staging views as one run; every other op is per token, and logits rows follow logit_rows */
    kn_batch pb;
    int32_t p_tok[MAX_CHUNK], p_pos[MAX_CHUNK], p_seq[MAX_CHUNK], p_rows[MAX_CHUNK], new_of[MAX_CHUNK];
    m->n_staged = 0;
    if (m->kvl_stage) {
        for (int t = 0; t < n; t++) m->n_staged += kn_kv_seq_staged(m->kv, b->seqs[b->seq[t]]);
        if (m->n_staged > 0 && m->n_staged < n) {
            if (b->n_logits < 0 || b->n_logits > MAX_CHUNK)
                return kn_fail(err, KN_ERR_INVALID_ARG, "forward: %d logits rows", b->n_logits);
            int k = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int t = 0; t < n; t++)
                    if (kn_kv_seq_staged(m->kv, b->seqs[b->seq[t]]) == !pass)
                        p_tok[k] = b->tokens[t], p_pos[k] = b->pos[t], p_seq[k] = b->seq[t], new_of[t] = k++;
            for (int r = 0; r < b->n_logits; r++) {
                if (b->logit_rows[r] < 0 || b->logit_rows[r] >= n)
                    return kn_fail(err, KN_ERR_INVALID_ARG, "forward: logits row %d names token %d of %d", r,
                                   b->logit_rows[r], n);
                p_rows[r] = new_of[b->logit_rows[r]];
            }
            pb = *b;
            pb.tokens = p_tok, pb.pos = p_pos, pb.seq = p_seq, pb.logit_rows = p_rows;
            b = &pb;
        }
    }
    int32_t slots[MAX_CHUNK], ring_slots[MAX_CHUNK];
    const kn_kv_pool *ring = m->kv->ring;
    for (int t = 0; t < n; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->vocab_size)
            return kn_fail(err, KN_ERR_INVALID_ARG, "token id %d is outside the vocabulary (0..%d)", b->tokens[t],
                           c->vocab_size - 1);
        const kn_kv_seq *s = b->seqs[b->seq[t]];
        if (b->pos[t] < 0 || b->pos[t] >= m->max_context || b->pos[t] / KN_KV_BLOCK_SIZE >= s->n_blocks)
            return kn_fail(err, KN_ERR_INVALID_ARG, "position %d has no reserved KV block (context %d)", b->pos[t],
                           m->max_context);
        slots[t] = kn_kv_seq_slot(m->kv, s, b->pos[t]);
        if (ring) {
            if (s->n_ring < (s->n_blocks < m->kv->ring_blocks ? s->n_blocks : m->kv->ring_blocks))
                return kn_fail(err, KN_ERR_INVALID_ARG, "sequence has no reserved sliding-window blocks");
            ring_slots[t] = kn_kv_seq_ring_slot(m->kv, s, b->pos[t]);
        }
        if (t < m->n_staged) { /* slots of the staging views */
            slots[t] -= (int32_t)(m->kv->n_blocks * KN_KV_BLOCK_SIZE);
            if (ring) ring_slots[t] -= (int32_t)(ring->n_blocks * KN_KV_BLOCK_SIZE);
            if (slots[t] < 0 || (ring && ring_slots[t] < 0))
                return kn_fail(err, KN_ERR_INTERNAL, "forward: a staged sequence's position %d is not in a staging "
                               "block", b->pos[t]);
        }
    }
    if (m->rope_runs) { /* RoPE frequencies of each sequence for this call's length (its largest position + 1) */
        const int half = m->rope.rot_dim / 2;
        m->n_runs = 0;
        for (int t = 0; t < n; t++) {
            if (t > 0 && b->seq[t] == b->seq[t - 1]) {
                m->run_n[m->n_runs - 1]++;
                continue;
            }
            const int r = m->n_runs++;
            m->run_t0[r] = t, m->run_n[r] = 1;
            int len = b->rope_len ? b->rope_len[b->seq[t]] : 0; /* else its largest position in this call + 1 */
            for (int u = 0; u < n; u++)
                if (b->seq[u] == b->seq[t] && b->pos[u] + 1 > len) len = b->pos[u] + 1;
            kn_code rc = kn_rope_frequencies(c, m->rope.rot_dim, len, m->h_rope_runs + (size_t)r * half,
                                             &m->run_scale[r], err);
            if (rc) return rc;
        }
        kn_be_upload(be, m->rope_runs, m->h_rope_runs, (size_t)m->n_runs * half * sizeof(float));
    }
    /* block tables, one row per sequence */
    int32_t *bt_host = m->h_bt;
    memset(bt_host, 0, (size_t)b->n_seqs * (size_t)m->max_blocks * sizeof(int32_t));
    for (int s = 0; s < b->n_seqs; s++)
        memcpy(bt_host + (size_t)s * m->max_blocks, b->seqs[s]->blocks, (size_t)b->seqs[s]->n_blocks * 4);
    kn_be_upload(be, m->d_bt, bt_host, (size_t)b->n_seqs * (size_t)m->max_blocks * 4);
    if (ring) {
        memset(m->h_bt_ring, 0, (size_t)b->n_seqs * (size_t)m->max_blocks * sizeof(int32_t));
        for (int s = 0; s < b->n_seqs; s++) kn_kv_seq_ring_table(m->kv, b->seqs[s], m->h_bt_ring + (size_t)s * m->max_blocks);
        kn_be_upload(be, m->d_bt_ring, m->h_bt_ring, (size_t)b->n_seqs * (size_t)m->max_blocks * 4);
        kn_be_upload(be, m->d_slots_ring, ring_slots, (size_t)n * 4);
    }
    if (m->n_staged > 0) { /* staged sequences' tables into the staging views (staging block i -> i - n_blocks) */
        const size_t rows = (size_t)b->n_seqs * (size_t)m->max_blocks;
        for (int pool = 0; pool < (ring ? 2 : 1); pool++) {
            int32_t *h = pool ? m->h_bt_ring_stage : m->h_bt_stage, *src = pool ? m->h_bt_ring : bt_host;
            const int64_t nb = pool ? ring->n_blocks : m->kv->n_blocks;
            for (size_t i = 0; i < rows; i++) h[i] = src[i] >= nb ? (int32_t)(src[i] - nb) : 0;
            kn_be_upload(be, pool ? m->d_bt_ring_stage : m->d_bt_stage, h, rows * 4);
        }
    }
    kn_be_upload(be, m->d_tokens, b->tokens, (size_t)n * 4);
    if (m->d_ple_tokens) { /* gemma3n: ids past the per-layer table use its row 0 (as Gemma3nModel does) */
        int32_t ple_ids[MAX_CHUNK];
        for (int t = 0; t < n; t++) ple_ids[t] = b->tokens[t] < c->ple_vocab ? b->tokens[t] : 0;
        kn_be_upload(be, m->d_ple_tokens, ple_ids, (size_t)n * 4);
    }
    kn_be_upload(be, m->d_pos, b->pos, (size_t)n * 4);
    kn_be_upload(be, m->d_seq, b->seq, (size_t)n * 4);
    kn_be_upload(be, m->d_slots, slots, (size_t)n * 4);

    if (b->n_logits > 0) kn_be_upload(be, m->d_rows, b->logit_rows, (size_t)b->n_logits * 4);
    if (b->sample && b->n_logits > 0) {
        kn_be_upload(be, m->d_sample, b->sample, (size_t)b->n_logits * sizeof *b->sample);
        if (b->n_edits > 0) kn_be_upload(be, m->d_edits, b->edits, (size_t)b->n_edits * sizeof *b->edits);
    }

    /* A decode-shaped batch (one token per sequence, logits in one chunk) is
     * recorded once per shape and context bucket and replayed where the
     * backend supports it. */
    const kn_backend_vtbl *op = be->vt;
    uint64_t key = 0;
    if (op->graph_replay && n == b->n_seqs && b->n_logits <= m->logits_rows && (!m->rope_runs || m->n_runs == n)) {
        int max_pos = 0;
        for (int t = 0; t < n; t++) max_pos = b->pos[t] > max_pos ? b->pos[t] : max_pos;
        /* the split of a --kv-start batch (staged tokens first) changes the ops' arguments: part of the key */
        key = ((uint64_t)kn_ctx_bucket(max_pos) << 52) | ((uint64_t)m->n_staged << 42) | ((uint64_t)n << 32) |
              ((uint64_t)b->n_logits << 8) | (b->argmax ? 2u : 0u) | (b->sample ? 4u : 0u) | 1u;
    }
    if (!(key && op->graph_replay(be, key))) {
        int recording = key && op->graph_begin(be, key);
        forward_compute(m, b, key ? NULL : logits);
        if (recording && !op->graph_end(be, key)) forward_compute(m, b, NULL);
    }
    if (b->argmax && b->n_logits > 0)
        kn_be_download(be, b->argmax, m->d_argmax, (size_t)b->n_logits * sizeof(int32_t));
    else if (key && b->n_logits > 0)
        kn_be_download(be, logits, m->logits, (size_t)b->n_logits * c->vocab_size * sizeof(float));
    kn_be_sync(be);
    return kn_be_take_error(be, err); /* a kernel that did not run or faulted: the step's outputs are not valid */
}

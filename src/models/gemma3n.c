/* gemma3n.c — see gemma3n.h. transformers' Gemma3nTextModel, for the n
 * tokens of a batch, K = altup_num_inputs streams of [n, H]:
 *
 *   s0 = embed(ids) * sqrt(H); s_i = match(s0 A_i^T, s0)       i = 1..K-1
 *   per layer l:
 *     r = tanh(router(rms(s0) / H))                              [n, K]
 *     p_c = s_c + sum_a (r C_pred^T)[c*K + a] s_a                (predict)
 *     x = input_norm(p_0); lau = x + norm(R (L x))               (Laurel)
 *     a = p_0 + post_attn_norm(o_proj(attn(x)))
 *     a = (a + lau) / sqrt(2)
 *     y = a + post_ffn_norm(mlp(pre_ffn_norm(a)))                (gate: gaussian top-k on sparse layers)
 *     r' = tanh(router(rms(y) / H))
 *     s_c = p_c + (y - p_0) * ((r' C_corr^T)[c] + 1)            (correct)
 *     g = act(gate(s_0 * correct_output_scale)) * per_layer_input[l]
 *     s_c += norm(proj(g))                                       c = 1..K-1
 *   out = mean(s0, match(s_i U_i^T, s0) for i = 1..K-1)
 *
 * match(v, ref) rescales each row of v to ref's root-mean-square (with
 * mean(v^2) floored at 1e-5). KV-shared layers, RMSNorms with plain
 * weights (no 1 + w), the scale-free value norm and attention scale 1 are the
 * shared decoder's gemma4 features. */
#include "models/gemma3n.h"

#include <math.h>
#include <stdlib.h>

#include "models/loader.h"

kn_code kn_gemma3n_load(kn_model *m, const kn_tensor_source *src, kn_error *err) {
    const kn_model_config *c = &m->cfg;
    const int K = c->altup_inputs, R = c->laurel_rank;
    const int64_t H = c->hidden_size, T = m->max_chunk;
    kn_code rc;
    m->alt_proj = calloc((size_t)K, sizeof *m->alt_proj);
    m->alt_unembed = calloc((size_t)K, sizeof *m->alt_unembed);
    if (!m->alt_proj || !m->alt_unembed) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < K - 1; i++) {
        ld_part p[] = {{"model.altup_projections.%d.weight", H}};
        ld_part u[] = {{"model.altup_unembed_projections.%d.weight", H}};
        if ((rc = ld_load_fused(m, src, i, p, 1, H, NULL, &m->alt_proj[i], err)) ||
            (rc = ld_load_fused(m, src, i, u, 1, H, NULL, &m->alt_unembed[i], err)))
            return rc;
    }
    for (int l = 0; l < c->n_layers; l++) {
        kn_layer *L = &m->layers[l];
        ld_part router[] = {{"model.layers.%d.altup.modality_router.weight", K}};
        ld_part pred[] = {{"model.layers.%d.altup.prediction_coefs.weight", (int64_t)K * K}};
        ld_part corr[] = {{"model.layers.%d.altup.correction_coefs.weight", K}};
        ld_part left[] = {{"model.layers.%d.laurel.linear_left.weight", R}};
        ld_part right[] = {{"model.layers.%d.laurel.linear_right.weight", H}};
        if ((rc = ld_load_fused(m, src, l, router, 1, H, NULL, &L->alt_router, err)) ||
            (rc = ld_load_fused(m, src, l, pred, 1, K, NULL, &L->alt_pred, err)) ||
            (rc = ld_load_fused(m, src, l, corr, 1, K, NULL, &L->alt_corr, err)) ||
            (rc = ld_load_fused(m, src, l, left, 1, H, NULL, &L->laurel_l, err)) ||
            (rc = ld_load_fused(m, src, l, right, 1, R, NULL, &L->laurel_r, err)) ||
            (rc = ld_load_vec(m, src, "model.layers.%d.altup.router_norm.weight", l, H, 1, 0.0f, &L->alt_router_norm,
                              err)) ||
            (rc = ld_load_vec(m, src, "model.layers.%d.altup.correct_output_scale", l, H, 1, 0.0f, &L->alt_out_scale,
                              err)) ||
            (rc = ld_load_vec(m, src, "model.layers.%d.laurel.post_laurel_norm.weight", l, H, 1, 0.0f, &L->laurel_norm,
                              err)))
            return rc;
    }
    kn_backend *be = m->be;
    const size_t F = sizeof(float);
    m->alt_s = kn_be_alloc(be, (size_t)K * T * H * F), m->alt_p = kn_be_alloc(be, (size_t)K * T * H * F);
    m->alt_w = kn_be_alloc(be, (size_t)T * K * K * F), m->alt_mod = kn_be_alloc(be, (size_t)T * K * F);
    m->laurel_t = kn_be_alloc(be, (size_t)T * R * F), m->laurel_o = kn_be_alloc(be, (size_t)T * H * F);
    if (!m->alt_s || !m->alt_p || !m->alt_w || !m->alt_mod || !m->laurel_t || !m->laurel_o)
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for gemma3n activations");
    if (c->ple_vocab < c->vocab_size && !(m->d_ple_tokens = kn_be_alloc(be, (size_t)T * 4)))
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    return KN_OK;
}

void kn_gemma3n_free(kn_model *m) {
    kn_backend *be = m->be;
    for (int i = 0; m->alt_proj && i < m->cfg.altup_inputs; i++) kn_be_weight_free(be, &m->alt_proj[i]);
    for (int i = 0; m->alt_unembed && i < m->cfg.altup_inputs; i++) kn_be_weight_free(be, &m->alt_unembed[i]);
    free(m->alt_proj), free(m->alt_unembed);
    m->alt_proj = m->alt_unembed = NULL;
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        kn_layer *L = &m->layers[l];
        kn_be_weight_free(be, &L->alt_router), kn_be_weight_free(be, &L->alt_pred);
        kn_be_weight_free(be, &L->alt_corr), kn_be_weight_free(be, &L->laurel_l), kn_be_weight_free(be, &L->laurel_r);
        kn_be_free(be, L->alt_router_norm), kn_be_free(be, L->alt_out_scale), kn_be_free(be, L->laurel_norm);
        L->alt_router_norm = L->alt_out_scale = L->laurel_norm = NULL;
    }
    float *bufs[] = {m->alt_s, m->alt_p, m->alt_w, m->alt_mod, m->laurel_t, m->laurel_o};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) kn_be_free(be, bufs[i]);
    kn_be_free(be, m->d_ple_tokens);
    m->alt_s = m->alt_p = m->alt_w = m->alt_mod = m->laurel_t = m->laurel_o = NULL;
    m->d_ple_tokens = NULL;
}

/* tanh(router(rms_norm(x) / H)) into m->alt_mod [n, K] */
static void router(kn_model *m, const kn_layer *L, const float *x, int n) {
    const kn_backend_vtbl *op = m->be->vt;
    const int H = m->cfg.hidden_size;
    kn_dec_norm_rows(m, x, m->xn, n, L->alt_router_norm, NULL);
    op->scale(m->be, m->xn, (int64_t)n * H, (float)(1.0 / H));
    op->matmul(m->be, m->xn, n, &L->alt_router, NULL, m->alt_mod);
    op->softcap(m->be, m->alt_mod, (int64_t)n * m->cfg.altup_inputs, 1.0f); /* 1 * tanh(x / 1) */
}

void kn_gemma3n_forward(kn_model *m, const kn_batch *b) {
    const kn_model_config *c = &m->cfg;
    kn_backend *be = m->be;
    const kn_backend_vtbl *op = be->vt;
    const int n = b->n_tokens, H = c->hidden_size, K = c->altup_inputs, P = c->ple_dim, LP = c->n_layers * P;
    const int64_t SS = (int64_t)m->max_chunk * H, NH = (int64_t)n * H; /* stream stride, one stream's length */
    const int approx = c->act == KN_ACT_GELU_ERF ? KN_GELU_ERF : KN_GELU_TANH;
    float *S = m->alt_s, *Pr = m->alt_p;
    op->embed(be, &m->embed, m->d_tokens, n, S);
    op->scale(be, S, NH, (float)c->embed_scale);
    kn_dec_ple_inputs(m, S, n);
    for (int i = 1; i < K; i++) {
        op->matmul(be, S, n, &m->alt_proj[i - 1], NULL, S + i * SS);
        op->rms_match(be, S + i * SS, S, n, H, 1e-5f);
    }
    for (int l = 0; l < c->n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        /* predict */
        router(m, L, S, n);
        op->matmul(be, m->alt_mod, n, &L->alt_pred, NULL, m->alt_w);
        op->stream_mix(be, S, K, S, Pr, K, SS, m->alt_w, 0.0f, n, H);
        /* Laurel and attention on the normed active prediction */
        kn_dec_norm_rows(m, Pr, m->xn, n, L->attn_norm, NULL);
        op->matmul(be, m->xn, n, &L->laurel_l, NULL, m->laurel_t);
        op->matmul(be, m->laurel_t, n, &L->laurel_r, NULL, m->laurel_o);
        kn_dec_norm_rows(m, m->laurel_o, m->laurel_o, n, L->laurel_norm, NULL);
        op->add(be, m->laurel_o, m->xn, NH);
        kn_dec_attention(m, b, l, m->xn);
        op->matmul(be, m->attn, n, &L->o, L->o_bias, m->x);
        kn_dec_norm_rows(m, m->x, m->x, n, L->post_attn_norm, NULL);
        op->add(be, m->x, Pr, NH);
        op->add(be, m->x, m->laurel_o, NH);
        op->scale(be, m->x, NH, (float)(1.0 / sqrt(2.0)));
        /* feed-forward: m->x becomes the activated output */
        kn_dec_norm_rows(m, m->x, m->xn, n, L->mlp_norm, NULL);
        kn_dec_mlp(m, L, m->xn, n, m->tmp, 0);
        kn_dec_residual_add(m, m->tmp, L->post_mlp_norm, n);
        /* correct: s_c = p_c + (y - p_0) * (coef_c + 1) */
        router(m, L, m->x, n);
        op->matmul(be, m->alt_mod, n, &L->alt_corr, NULL, m->alt_w);
        op->stream_mix(be, Pr, 1, m->x, m->tmp, 1, SS, NULL, -1.0f, n, H);
        op->stream_mix(be, m->tmp, 1, Pr, S, K, SS, m->alt_w, 1.0f, n, H);
        /* per-layer input, added to streams 1..K-1 */
        op->stream_mix(be, S, 1, NULL, m->tmp, 1, SS, NULL, 1.0f, n, H); /* copy of s_0 */
        if (c->altup_correct_scale) op->mul_rows(be, m->tmp, L->alt_out_scale, 0, n, H);
        op->matmul(be, m->tmp, n, &L->ple_gate, NULL, m->ple_g);
        op->gelu(be, m->ple_g, (int64_t)n * P, m->ple_g, approx);
        op->mul_rows(be, m->ple_g, m->ple_tmp + (size_t)l * P, LP, n, P);
        op->matmul(be, m->ple_g, n, &L->ple_proj, NULL, m->tmp);
        kn_dec_norm_rows(m, m->tmp, m->tmp, n, L->ple_norm, NULL);
        for (int i = 1; i < K; i++) op->add(be, S + i * SS, m->tmp, NH);
    }
    /* merge: mean of s_0 and the unembedded, magnitude-matched other streams */
    op->stream_mix(be, S, 1, NULL, m->x, 1, SS, NULL, 1.0f, n, H);
    for (int i = 1; i < K; i++) {
        op->matmul(be, S + i * SS, n, &m->alt_unembed[i - 1], NULL, m->tmp);
        op->rms_match(be, m->tmp, S, n, H, 1e-5f);
        op->add(be, m->x, m->tmp, NH);
    }
    op->scale(be, m->x, NH, 1.0f / (float)K);
}

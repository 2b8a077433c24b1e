/* moe.h — mixture-of-experts feed-forward layers (qwen2_moe, qwen3_moe,
 * mixtral): loading and the forward block. The decoder (llama.c) calls these
 * for layers with cfg.layer_moe set; everything else about the layer is the
 * shared decoder's. */
#ifndef KN_MODELS_MOE_H
#define KN_MODELS_MOE_H

#include "models/model.h"

/* Load layer l's router, experts (published per-expert tensors, or
 * transformers 5's fused [E, 2I, H] / [E, H, I] tensors) and shared expert. */
kn_code kn_moe_load_layer(kn_model *m, const kn_tensor_source *src, int l, kn_error *err);

/* out[n, H] = routed experts (+ sigmoid-gated shared expert) of x'[n, H],
 * x' = rms_norm(x) * norm_w, or x itself when norm_w is NULL. With
 * accumulate the result is added to out, which may then be x (the residual
 * stream): the backend may fuse the norm into the router and expert kernels
 * and the add into the last expert kernel. */
void kn_moe_forward(kn_model *m, const kn_layer *L, const float *x, const float *norm_w, int n, float *out,
                    int accumulate);

/* Weight bytes a decode step reads from layer L's experts: router, the k
 * selected experts and the shared expert. */
int64_t kn_moe_active_bytes(const kn_model *m, const kn_layer *L);

/* gemma4's MoE block (beside the dense MLP): out[n, H] = experts of
 * pre_feedforward_layernorm_2(x), routed on the scaled rms_norm(x);
 * scratch holds n*H floats. */
void kn_moe_gemma4_forward(kn_model *m, const kn_layer *L, const float *x, int n, float *scratch, float *out);

void kn_moe_free_layer(kn_model *m, kn_layer *L);

#endif

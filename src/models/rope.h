/* rope.h — rotary-embedding frequency tables from a model config, following
 * transformers' modeling_rope_utils (default, linear, llama3, yarn, proportional). */
#ifndef KN_MODELS_ROPE_H
#define KN_MODELS_ROPE_H

#include "io/model_config.h"

/* Fill inv_freq[rot_dim/2] (host) and *attn_scale for cfg; rot_dim is
 * head_dim * partial_rotary_factor. */
kn_code kn_rope_frequencies(const kn_model_config *cfg, int rot_dim, float *inv_freq, float *attn_scale,
                            kn_error *err);

#endif

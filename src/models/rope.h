/* rope.h — rotary-embedding frequency tables from a model config, following
 * transformers' modeling_rope_utils (default, linear, llama3, yarn, proportional, dynamic,
 * longrope). */
#ifndef KN_MODELS_ROPE_H
#define KN_MODELS_ROPE_H

#include "io/model_config.h"

/* Fill inv_freq[rot_dim/2] (host) and *attn_scale for cfg; rot_dim is
 * head_dim * partial_rotary_factor. seq_len: the length transformers would
 * pass for one forward call (its largest position + 1) for the rope types
 * whose frequencies depend on it: dynamic (NTK base rescaled once seq_len
 * exceeds max_position_embeddings) and longrope (long factors once seq_len
 * exceeds original_max_position_embeddings); 0 = the model's own length
 * (unscaled / short factors). Other types ignore it. */
kn_code kn_rope_frequencies(const kn_model_config *cfg, int rot_dim, int seq_len, float *inv_freq, float *attn_scale,
                            kn_error *err);
/* 1 if the rope's frequencies depend on the sequence length (dynamic, longrope). */
int kn_rope_length_dependent(const kn_rope_config *r);

#endif

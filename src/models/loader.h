/* loader.h — reading HF-named tensors of a checkpoint into backend weights,
 * shared by the decoder (llama.c) and the expert layers (moe.c).
 *
 * Every loader validates name presence, dtype (F32/BF16/F16) and shape
 * against the config before anything reaches the backend, and reports the
 * tensor name in its error. Formats use one %d for the layer index. */
#ifndef KN_MODELS_LOADER_H
#define KN_MODELS_LOADER_H

#include "models/model.h"

typedef struct {
    const char *fmt;
    int64_t rows;
} ld_part;

/* Row permutation applied while loading the fused q|k|v projection: GLM's
 * interleaved (GPT-J) RoPE pairs dims (2i, 2i+1); moving even dims of the
 * rotary part first and odd dims after turns it into the rotate-half form the
 * rope op computes. Scores are unchanged because q and k move alike. */
typedef struct {
    int q_heads, kv_heads, head_dim, rot_dim; /* rot_dim 0 = no permutation */
} ld_qk_perm;

const kn_st_tensor *ld_find(const kn_tensor_source *src, const char *fmt, int layer);
kn_code ld_check_shape(const kn_st_tensor *t, const char *name, int64_t rows, int64_t cols, kn_error *err);
kn_code ld_check_float(const kn_st_tensor *t, const char *name, kn_error *err);
/* Vector (norm weight / bias) converted to f32 into host[n]; *found = 0 when
 * absent and not required. */
kn_code ld_read_vec(const kn_tensor_source *src, const char *fmt, int layer, int64_t n, int required, float *host,
                    int *found, kn_error *err);
kn_code ld_upload_vec(kn_model *m, const float *host, int64_t n, float **out, kn_error *err);
/* A vector as f32 backend memory plus `offset` per element (gemma's 1 + w
 * norms); *out NULL when absent and optional. */
kn_code ld_load_vec(kn_model *m, const kn_tensor_source *src, const char *fmt, int layer, int64_t n, int required,
                    float offset, float **out, kn_error *err);
/* Row blocks (same dtype and cols) as one weight; a single unpermuted part is
 * used in place when the source outlives the model. perm may be NULL. */
kn_code ld_load_fused(kn_model *m, const kn_tensor_source *src, int layer, const ld_part *parts, int n_parts,
                      int64_t cols, const ld_qk_perm *perm, kn_weight *out, kn_error *err);
/* Expert weights stored stacked (mlx-lm's switch_mlp): names[i] is
 * [E, rows[i], cols] (float) or quantized (U32 [E, rows[i], cols*bits/32],
 * scales/biases [E, rows[i], cols/group_size]). Loaded as one weight of
 * E * sum(rows) rows, expert by expert: expert e's rows of part 0, then of
 * part 1, ... (quantized parts unified as ld_load_fused does). */
kn_code ld_load_stacked(kn_model *m, const kn_tensor_source *src, const char *const *names, int n_parts, int64_t E,
                        const int64_t *rows, int64_t cols, kn_weight *out, kn_error *err);
/* Optional fused bias: all parts present, or none. */
kn_code ld_load_fused_bias(kn_model *m, const kn_tensor_source *src, int layer, const ld_part *parts, int n_parts,
                           const ld_qk_perm *perm, float **out, kn_error *err);
/* Permute rows (each row_bytes long) of q (rows [0, q_heads*head_dim)) and k
 * (the next kv_heads*head_dim rows) as described at ld_qk_perm. Returns
 * KN_ERR_NOMEM (message in err) when its small row buffer cannot be had. */
kn_code ld_permute_qk_rows(uint8_t *rows, size_t row_bytes, const ld_qk_perm *p, kn_error *err);

#endif

/* model_config.h — config.json (+ generation_config.json) parsed into a typed
 * model configuration.
 *
 * The parser accepts the key spellings of both published checkpoints
 * (`rope_theta` + `rope_scaling`) and transformers 5 (`rope_parameters`).
 * Values are validated (positive sizes, heads dividing evenly, known
 * activation); an unsupported model_type is refused with the list of supported
 * ones. Nothing here allocates: the struct is plain data. */
#ifndef KN_IO_MODEL_CONFIG_H
#define KN_IO_MODEL_CONFIG_H

#include <stdint.h>

#include "base/status.h"

typedef enum {
    KN_ARCH_LLAMA = 0,
    KN_ARCH_MISTRAL,
    KN_ARCH_QWEN2,
    KN_ARCH_QWEN3,
    KN_ARCH_PHI3,
    KN_ARCH_COUNT
} kn_arch;

typedef enum {
    KN_ROPE_DEFAULT = 0,
    KN_ROPE_LINEAR,
    KN_ROPE_DYNAMIC,
    KN_ROPE_LLAMA3,
    KN_ROPE_YARN,
    KN_ROPE_LONGROPE,
} kn_rope_type;

#define KN_MAX_LAYERS 512
#define KN_MAX_EOS 8
#define KN_MAX_ROPE_FACTORS 512

typedef struct {
    kn_rope_type type;
    double theta;
    double factor;
    double partial_rotary_factor;
    /* llama3 */
    double low_freq_factor, high_freq_factor;
    int original_max_position_embeddings; /* 0 = absent */
    /* yarn */
    double beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim;
    int has_attention_factor, truncate;
    /* longrope (phi3) */
    int n_long_factor, n_short_factor;
    double long_factor[KN_MAX_ROPE_FACTORS], short_factor[KN_MAX_ROPE_FACTORS];
} kn_rope_config;

typedef struct {
    kn_arch arch;
    char model_type[32];
    int vocab_size, hidden_size, intermediate_size, n_layers;
    int n_heads, n_kv_heads, head_dim;
    int max_position_embeddings;
    double rms_norm_eps;
    int tie_word_embeddings;
    int attention_bias, mlp_bias; /* hints; tensor presence decides */
    int qk_norm;                  /* qwen3 */
    int fused_qkv, fused_gate_up; /* phi3 */
    int sliding_window;           /* 0 = none */
    /* per-layer window: 1 if layer uses sliding_window (from layer_types /
     * use_sliding_window+max_window_layers / arch default) */
    uint8_t layer_sliding[KN_MAX_LAYERS];
    kn_rope_config rope;
    char torch_dtype[16];
    /* generation_config.json */
    int bos_token_id; /* -1 = none */
    int n_eos;
    int eos_token_ids[KN_MAX_EOS];
    int gen_do_sample;
    double gen_temperature, gen_top_p, gen_min_p;
    int gen_top_k;
} kn_model_config;

const char *kn_arch_name(kn_arch a);
/* Comma-separated list of supported model_type values (for messages). */
const char *kn_supported_model_types(void);

/* Parse config JSON text (json) and optional generation config text (gen_json
 * may be NULL). `where` names the source in error messages. */
kn_code kn_config_parse(const char *json, size_t len, const char *gen_json, size_t gen_len,
                        const char *where, kn_model_config *out, kn_error *err);

/* Read DIR/config.json and DIR/generation_config.json (optional). */
kn_code kn_config_load(const char *dir, kn_model_config *out, kn_error *err);

#endif

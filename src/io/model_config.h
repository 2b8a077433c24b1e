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
    KN_ARCH_GEMMA,
    KN_ARCH_GEMMA2,
    KN_ARCH_GEMMA3, /* gemma3_text (and the text model inside a gemma3 checkpoint) */
    KN_ARCH_QWEN2_MOE,
    KN_ARCH_QWEN3_MOE,
    KN_ARCH_MIXTRAL,
    KN_ARCH_OLMO2,
    KN_ARCH_GRANITE,
    KN_ARCH_STARCODER2,
    KN_ARCH_GLM4,
    KN_ARCH_SMOLLM3,
    KN_ARCH_GEMMA4, /* gemma4_text (and the text model inside a gemma4 checkpoint) */
    KN_ARCH_GEMMA3N, /* gemma3n_text (and the text model inside a gemma3n checkpoint) */
    KN_ARCH_COUNT
} kn_arch;

typedef enum {
    KN_ROPE_DEFAULT = 0,
    KN_ROPE_LINEAR,
    KN_ROPE_DYNAMIC,
    KN_ROPE_LLAMA3,
    KN_ROPE_YARN,
    KN_ROPE_LONGROPE,
    KN_ROPE_PROPORTIONAL, /* gemma4: the first partial_rotary_factor of the head's frequencies, the rest 0 */
} kn_rope_type;

#define KN_MAX_LAYERS 512
#define KN_MAX_EOS 8
#define KN_MAX_ROPE_FACTORS 512

typedef struct {
    kn_rope_type type;
    double theta;
    double factor;
    int has_factor; /* "factor" given (longrope otherwise uses max_position_embeddings / original) */
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

/* Where a decoder layer puts its norms (tensor names follow the family). */
typedef enum {
    KN_NORMS_PRE = 0,  /* x + f(norm(x))                    llama and most */
    KN_NORMS_SANDWICH, /* x + post_norm(f(pre_norm(x)))     gemma2, gemma3, glm4 */
    KN_NORMS_POST,     /* x + post_norm(f(x))               olmo2 */
} kn_norm_layout;

enum { KN_QK_NORM_NONE = 0, KN_QK_NORM_HEAD = 1, KN_QK_NORM_FULL = 2 };

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
    int sliding_kv_full;          /* set by callers, not config.json: 1 keeps sliding layers' whole K/V (no ring) */
    /* per-layer window: 1 if layer uses sliding_window (from layer_types /
     * use_sliding_window+max_window_layers / arch default) */
    uint8_t layer_sliding[KN_MAX_LAYERS];
    kn_rope_config rope;
    /* ---- family features: data the shared decoder reads (defaults = llama) ---- */
    int layer_norm;            /* 1: LayerNorm with bias (starcoder2), 0: RMSNorm */
    double norm_weight_offset; /* gemma: RMSNorm scales by (1 + w); folded into w at load */
    kn_norm_layout norm_layout;
    int qk_norm_kind;          /* KN_QK_NORM_*: per head (qwen3, gemma3) or over the projection (olmo2) */
    int act;                   /* KN_ACT_* (backend.h values: 0 silu, 1 gelu tanh, 2 gelu erf) */
    int mlp_gated;             /* 0: up -> act -> down with biases (starcoder2) */
    double embed_scale;        /* embeddings multiplied (gemma sqrt(hidden), granite multiplier) */
    double residual_scale;     /* granite residual_multiplier */
    double attn_scale;         /* score scale (default 1/sqrt(head_dim)) */
    double attn_softcap, final_softcap; /* 0 = off (gemma2) */
    double logit_scale;        /* granite: 1 / logits_scaling */
    int rope_interleaved;      /* glm4: GPT-J pairs (q/k rows permuted at load) */
    uint8_t layer_rope[KN_MAX_LAYERS]; /* 0: NoPE layer (smollm3) */
    int has_local_rope;        /* gemma3: sliding layers use rope_local */
    kn_rope_config rope_local;
    /* mixture of experts (qwen2_moe, qwen3_moe, mixtral) */
    int n_experts, n_experts_per_tok, moe_intermediate_size, norm_topk_prob;
    int shared_expert_intermediate_size; /* qwen2_moe; 0 = none */
    uint8_t layer_moe[KN_MAX_LAYERS];
    /* per-layer attention shape (gemma4's global layers differ); equal to
     * head_dim / n_kv_heads elsewhere */
    uint16_t layer_head_dim[KN_MAX_LAYERS], layer_kv_heads[KN_MAX_LAYERS];
    /* gemma4 */
    int k_eq_v;               /* global layers: values are the key projection (v_proj absent) */
    int v_norm;               /* RMSNorm without weight on values */
    int n_kv_shared_layers;   /* the last n layers reuse the K/V of the last earlier layer of their type */
    int ple_dim, ple_vocab;   /* per-layer input embeddings (hidden_size_per_layer_input); 0 = none */
    int double_wide_mlp;      /* KV-shared layers have a 2x intermediate MLP */
    int moe_parallel;         /* MoE block beside the dense MLP (enable_moe_block) */
    /* gemma3n (with n_kv_shared_layers, ple_dim, ple_vocab, v_norm above) */
    int altup_inputs;         /* AltUp streams (altup_num_inputs, 2..8); 0 = no AltUp */
    int altup_correct_scale;  /* scale the corrected active stream by correct_output_scale */
    int laurel_rank;          /* Laurel low-rank residual width */
    /* activation sparsity: gate values below mean + std * mult are zeroed
     * (mult = standard normal quantile of activation_sparsity_pattern[l]) */
    uint8_t layer_sparse[KN_MAX_LAYERS];
    float layer_sparsity_mult[KN_MAX_LAYERS];
    int layer_inter[KN_MAX_LAYERS]; /* per-layer intermediate size (list-valued intermediate_size); 0 = intermediate_size */
    /* multimodal wrapper (model_type gemma3 with text_config): what was used / ignored */
    char wrapper_type[32];
    char ignored_configs[128];
    char torch_dtype[16];
    /* MLX affine weight quantization ("quantization" / "quantization_config"):
     * default bits and group size (0 = not quantized) and the number of
     * per-module overrides; tensors' own shapes give each module's values. */
    int quant_bits, quant_group_size, quant_n_overrides;
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

/* test_config.c — config.json parsing: every architecture's defaults, both
 * rope spellings (rope_scaling + rope_theta, transformers 5 rope_parameters),
 * layer windows, generation_config, and one clear error per bad input. */
#include <string.h>

#include "io/model_config.h"
#include "test_util.h"

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4"

static kn_code parse(const char *json, const char *gen, kn_model_config *c, kn_error *err) {
    memset(err, 0, sizeof *err);
    return kn_config_parse(json, strlen(json), gen, gen ? strlen(gen) : 0, "config.json", c, err);
}

static void expect_error(const char *json, kn_code code, const char *needle) {
    kn_model_config c;
    kn_error err;
    kn_code rc = parse(json, NULL, &c, &err);
    CHECK(rc == code, "expected code %d, got %d for %s", code, rc, json);
    CHECK(strstr(err.msg, needle) != NULL, "message \"%s\" lacks \"%s\"", err.msg, needle);
}

int main(void) {
    kn_model_config c;
    kn_error err;
    CHECK(parse("{\"model_type\": \"llama\", " BASE "}", NULL, &c, &err) == KN_OK, "%s", err.msg);
    CHECK(c.arch == KN_ARCH_LLAMA && c.n_kv_heads == 4 && c.head_dim == 16 && c.rope.theta == 10000.0 &&
              c.rope.type == KN_ROPE_DEFAULT && !c.tie_word_embeddings,
          "llama defaults");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
                NULL, &c, &err) == KN_OK, "%s", err.msg);
    CHECK(c.rope.type == KN_ROPE_LLAMA3 && c.rope.factor == 8.0 && c.rope.theta == 500000 &&
              c.rope.original_max_position_embeddings == 8192, "llama3 rope");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6, "
                "\"factor\": 4.0, \"original_max_position_embeddings\": 32}}", NULL, &c, &err) == KN_OK, "%s", err.msg);
    CHECK(c.rope.type == KN_ROPE_YARN && c.rope.theta == 1e6 && c.rope.beta_fast == 32 && c.rope.beta_slow == 1,
          "v5 rope_parameters yarn");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", NULL, &c, &err) == KN_OK &&
              c.rope.type == KN_ROPE_LINEAR && c.rope.factor == 2.0, "legacy 'type' key");
    CHECK(parse("{\"model_type\": \"qwen3\", " BASE ", \"head_dim\": 32, \"num_key_value_heads\": 2}", NULL, &c, &err) == KN_OK &&
              c.qk_norm && c.head_dim == 32 && c.tie_word_embeddings, "qwen3");
    CHECK(parse("{\"model_type\": \"qwen2\", " BASE ", \"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 1}",
                NULL, &c, &err) == KN_OK && c.layer_sliding[0] == 0 && c.layer_sliding[1] == 1, "qwen2 window layers");
    CHECK(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": 16}", NULL, &c, &err) == KN_OK &&
              c.sliding_window == 16 && c.layer_sliding[0] && c.layer_sliding[1], "mistral window");
    CHECK(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": null}", NULL, &c, &err) == KN_OK &&
              c.sliding_window == 0 && !c.layer_sliding[0], "mistral no window");
    CHECK(parse("{\"model_type\": \"phi3\", " BASE "}", NULL, &c, &err) == KN_OK && c.fused_qkv && c.fused_gate_up, "phi3");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 4}",
                NULL, &c, &err) == KN_OK && c.layer_sliding[0] == 1 && c.layer_sliding[1] == 0, "layer_types");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": 2}", "{\"eos_token_id\": [7, 9], \"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.9}",
                &c, &err) == KN_OK && c.n_eos == 2 && c.eos_token_ids[1] == 9 && c.gen_do_sample && c.gen_temperature == 0.6,
          "generation config");
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"silu\", \"max_position_embeddings\": 4096.0}", NULL, &c, &err) == KN_OK &&
              c.max_position_embeddings == 4096, "integral float accepted");

    /* MLX quantization blocks: 2/3/4/5/6/8 bits, per-module overrides (mlx-lm's mixed recipes), refusals */
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"quantization\": {\"group_size\": 64, \"bits\": 3, "
                "\"model.layers.1.self_attn.v_proj\": {\"group_size\": 64, \"bits\": 6}, \"lm_head\": false}}",
                NULL, &c, &err) == KN_OK && c.quant_bits == 3 && c.quant_group_size == 64 && c.quant_n_overrides == 2,
          "3-bit with overrides: %s", err.msg);
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"quantization_config\": {\"group_size\": 32, \"bits\": 5}}", NULL,
                &c, &err) == KN_OK && c.quant_bits == 5 && c.quant_group_size == 32, "5-bit: %s", err.msg);
    expect_error("{\"model_type\": \"llama\", " BASE ", \"quantization\": {\"group_size\": 64, \"bits\": 7}}",
                 KN_ERR_UNSUPPORTED, "bits 7");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"quantization\": {\"group_size\": 64, \"bits\": 4, "
                 "\"model.layers.0.mlp.down_proj\": {\"group_size\": 48, \"bits\": 6}}}",
                 KN_ERR_UNSUPPORTED, "group_size 48");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"quantization\": {\"bits\": 4, \"quant_method\": \"gptq\"}}",
                 KN_ERR_UNSUPPORTED, "gptq");

    /* model families: the feature table each model_type selects */
    CHECK(parse("{\"model_type\": \"gemma\", " BASE "}", NULL, &c, &err) == KN_OK && c.arch == KN_ARCH_GEMMA &&
              c.norm_weight_offset == 1.0 && c.act == 1 && c.embed_scale == 8.0 && c.tie_word_embeddings &&
              c.norm_layout == KN_NORMS_PRE && c.attn_softcap == 0,
          "gemma: (1 + w) norms, tanh GeGLU by default, sqrt(hidden) embeddings");
    CHECK(parse("{\"model_type\": \"gemma\", " BASE ", \"hidden_act\": \"gelu\", \"hidden_activation\": \"gelu_pytorch_tanh\"}",
                NULL, &c, &err) == KN_OK && c.act == 2, "gemma (1) follows hidden_act as transformers 5.17 does");
    CHECK(parse("{\"model_type\": \"gemma2\", " BASE ", \"hidden_act\": \"gelu\", \"hidden_activation\": \"gelu_pytorch_tanh\"}",
                NULL, &c, &err) == KN_OK && c.act == 1, "gemma2 follows hidden_activation");
    CHECK(parse("{\"model_type\": \"gemma2\", " BASE ", \"query_pre_attn_scalar\": 64, \"sliding_window\": 8}", NULL, &c,
                &err) == KN_OK && c.norm_layout == KN_NORMS_SANDWICH && c.attn_softcap == 50.0 && c.final_softcap == 30.0 &&
              c.attn_scale == 0.125 && c.layer_sliding[0] == 1 && c.layer_sliding[1] == 0,
          "gemma2 defaults: softcaps 50/30, alternate sliding layers from layer 0");
    CHECK(parse("{\"model_type\": \"gemma2\", " BASE ", \"attn_logit_softcapping\": null, \"final_logit_softcapping\": null}",
                NULL, &c, &err) == KN_OK && c.attn_softcap == 0 && c.final_softcap == 0, "null soft-capping is off");
    CHECK(parse("{\"model_type\": \"gemma3_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, "
                "\"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"rope_theta\": 1e6, \"rope_local_base_freq\": 1e4, "
                "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8}, \"sliding_window\": 512}", NULL, &c, &err) == KN_OK &&
              c.qk_norm_kind == KN_QK_NORM_HEAD && c.has_local_rope && c.rope.theta == 1e6 && c.rope.type == KN_ROPE_LINEAR &&
              c.rope_local.theta == 1e4 && c.rope_local.type == KN_ROPE_DEFAULT && c.layer_sliding[4] && !c.layer_sliding[5] &&
              c.layer_sliding[6] && c.final_softcap == 0,
          "gemma3 (transformers 4 layout): global rope scaled, local rope at rope_local_base_freq, 5:1 pattern");
    CHECK(parse("{\"model_type\": \"gemma3_text\", " BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": "
                "\"linear\", \"factor\": 2.0, \"rope_theta\": 1e6}, \"sliding_attention\": {\"rope_type\": \"default\", "
                "\"rope_theta\": 1e4}}}", NULL, &c, &err) == KN_OK && c.rope.factor == 2.0 && c.rope.theta == 1e6 &&
              c.rope_local.theta == 1e4, "gemma3 (transformers 5 layout): rope_parameters per layer type");
    CHECK(parse("{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", " BASE "}, "
                "\"vision_config\": {\"model_type\": \"siglip_vision_model\"}, \"eos_token_id\": [1, 106]}", NULL, &c,
                &err) == KN_OK && c.arch == KN_ARCH_GEMMA3 && !strcmp(c.wrapper_type, "gemma3") &&
              !strcmp(c.ignored_configs, "vision_config") && c.n_eos == 2 && c.eos_token_ids[1] == 106,
          "gemma3 multimodal: text_config used, vision_config named as ignored");
    expect_error("{\"model_type\": \"gemma3\", \"vision_config\": {}}", KN_ERR_FORMAT, "text_config");
    CHECK(parse("{\"model_type\": \"qwen3_moe\", " BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 2, "
                "\"moe_intermediate_size\": 32, \"norm_topk_prob\": true, \"mlp_only_layers\": [0]}", NULL, &c, &err) == KN_OK &&
              c.n_experts == 8 && c.n_experts_per_tok == 2 && c.moe_intermediate_size == 32 && c.norm_topk_prob &&
              !c.layer_moe[0] && c.layer_moe[1] && c.qk_norm, "qwen3_moe");
    CHECK(parse("{\"model_type\": \"qwen3_moe\", " BASE ", \"num_local_experts\": 6, \"num_experts_per_tok\": 2}", NULL, &c,
                &err) == KN_OK && c.n_experts == 6, "qwen3_moe as transformers 5 saves it (num_local_experts)");
    CHECK(parse("{\"model_type\": \"qwen2_moe\", " BASE ", \"num_experts\": 4, \"num_experts_per_tok\": 2, "
                "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 32, \"decoder_sparse_step\": 2}", NULL, &c,
                &err) == KN_OK && c.shared_expert_intermediate_size == 32 && !c.norm_topk_prob && !c.layer_moe[0] && c.layer_moe[1],
          "qwen2_moe: shared expert, sparse step");
    CHECK(parse("{\"model_type\": \"mixtral\", " BASE ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2}", NULL, &c,
                &err) == KN_OK && c.n_experts == 8 && c.moe_intermediate_size == 128 && c.norm_topk_prob && c.layer_moe[0],
          "mixtral: experts of intermediate_size, always renormalised");
    expect_error("{\"model_type\": \"qwen3_moe\", " BASE ", \"num_experts\": 4, \"num_experts_per_tok\": 5}", KN_ERR_FORMAT,
                 "MoE sizes");
    expect_error("{\"model_type\": \"qwen3_moe\", " BASE ", \"mlp_only_layers\": [7]}", KN_ERR_FORMAT, "mlp_only_layers");
    CHECK(parse("{\"model_type\": \"olmo2\", " BASE "}", NULL, &c, &err) == KN_OK && c.norm_layout == KN_NORMS_POST &&
              c.qk_norm_kind == KN_QK_NORM_FULL && !c.qk_norm, "olmo2: post norms, whole-projection q/k norm");
    CHECK(parse("{\"model_type\": \"granite\", " BASE ", \"embedding_multiplier\": 12.0, \"residual_multiplier\": 0.22, "
                "\"attention_multiplier\": 0.0078125, \"logits_scaling\": 8.0}", NULL, &c, &err) == KN_OK &&
              c.embed_scale == 12.0 && c.residual_scale == 0.22 && c.attn_scale == 0.0078125 && c.logit_scale == 0.125,
          "granite multipliers");
    expect_error("{\"model_type\": \"granite\", " BASE ", \"logits_scaling\": 0}", KN_ERR_FORMAT, "logits_scaling");
    CHECK(parse("{\"model_type\": \"starcoder2\", " BASE ", \"hidden_act\": \"gelu_pytorch_tanh\", \"norm_epsilon\": 1e-5, "
                "\"sliding_window\": 16}", NULL, &c, &err) == KN_OK && c.layer_norm && !c.mlp_gated && c.act == 1 &&
              c.rms_norm_eps == 1e-5 && c.layer_sliding[1] && c.tie_word_embeddings, "starcoder2");
    CHECK(parse("{\"model_type\": \"glm4\", " BASE "}", NULL, &c, &err) == KN_OK && c.rope_interleaved &&
              c.rope.partial_rotary_factor == 0.5 && c.fused_gate_up && c.norm_layout == KN_NORMS_SANDWICH,
          "glm4: interleaved half rotary, fused gate_up, sandwich norms");
    CHECK(parse("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layers\": [1, 0]}", NULL, &c, &err) == KN_OK &&
              c.layer_rope[0] == 1 && c.layer_rope[1] == 0, "smollm3 NoPE layers");
    CHECK(parse("{\"model_type\": \"smollm3\", \"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, "
                "\"num_hidden_layers\": 8, \"num_attention_heads\": 4}", NULL, &c, &err) == KN_OK && c.layer_rope[2] &&
              !c.layer_rope[3] && !c.layer_rope[7], "smollm3 default: every 4th layer NoPE");
    expect_error("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layers\": [1]}", KN_ERR_FORMAT, "no_rope_layers");
    CHECK(parse("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layers\": [1, 0], \"use_sliding_window\": true, "
                "\"sliding_window\": 8}", NULL, &c, &err) == KN_OK && !c.layer_sliding[0] && c.layer_sliding[1],
          "smollm3: with use_sliding_window the NoPE layers slide");

    CHECK(parse("{\"model_type\": \"gemma4_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 32, "
                "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                "\"global_head_dim\": 32, \"num_global_key_value_heads\": 1, \"attention_k_eq_v\": true, "
                "\"num_kv_shared_layers\": 1, \"hidden_size_per_layer_input\": 4, \"vocab_size_per_layer_input\": 100, "
                "\"enable_moe_block\": true, \"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 8, "
                "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"], \"rope_parameters\": "
                "{\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}, \"full_attention\": "
                "{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1e6}}}", NULL, &c, &err) == KN_OK &&
              c.arch == KN_ARCH_GEMMA4 && c.layer_head_dim[0] == 16 && c.layer_kv_heads[0] == 2 && c.layer_head_dim[1] == 32 &&
              c.layer_kv_heads[1] == 1 && !c.layer_sliding[2] && c.layer_head_dim[2] == 32 && c.k_eq_v && c.v_norm &&
              c.n_kv_shared_layers == 1 && c.ple_dim == 4 && c.moe_parallel && c.n_experts_per_tok == 2 &&
              c.rope.type == KN_ROPE_PROPORTIONAL && c.rope_local.theta == 1e4 && c.attn_scale == 1.0 &&
              c.norm_weight_offset == 0.0,
          "gemma4_text: per-layer head dims, last layer forced global, k=v, KV sharing, PLE, MoE block, proportional rope: %s",
          err.msg);

    CHECK(parse("{\"model_type\": \"gemma4_text\", " BASE ", \"head_dim\": 16, \"hidden_size_per_layer_input\": 0, "
                "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"per_layer_config\": {\"full_attention\": "
                "{\"head_dim\": 64, \"num_key_value_heads\": 2}, \"0\": {\"head_dim\": 8}}}", NULL, &c, &err) == KN_OK &&
              c.layer_head_dim[0] == 8 && c.layer_head_dim[1] == 64 && c.layer_kv_heads[1] == 2 && c.ple_dim == 0,
          "gemma4 per_layer_config by type and by index: %s", err.msg);
    expect_error("{\"model_type\": \"gemma4_text\", " BASE ", \"head_dim\": 16, \"global_head_dim\": 7}", KN_ERR_FORMAT,
                 "head_dim 7");

    /* gemma3n: transformers' defaults (12 layers, 4 KV-shared: 0.95 sparsity on the first 10, every 5th layer global) */
    CHECK(parse("{\"model_type\": \"gemma3n_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 12, "
                "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": "
                "[32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 48, 48], \"vocab_size_per_layer_input\": 90, "
                "\"num_kv_shared_layers\": 4}", NULL, &c,
                &err) == KN_OK &&
              c.arch == KN_ARCH_GEMMA3N && c.altup_inputs == 4 && c.altup_correct_scale && c.laurel_rank == 64 &&
              c.ple_dim == 256 && c.ple_vocab == 90 && c.n_kv_shared_layers == 4 && c.final_softcap == 30.0 &&
              c.sliding_window == 512 && c.layer_sliding[0] && !c.layer_sliding[4] && c.layer_sparse[9] &&
              !c.layer_sparse[10] && fabsf(c.layer_sparsity_mult[0] - 1.6448536f) < 1e-6f && c.layer_inter[10] == 48 &&
              c.intermediate_size == 48 && c.v_norm && c.attn_scale == 1.0 && c.norm_weight_offset == 0.0 &&
              c.has_local_rope && c.rope.theta == 1e6 && c.rope_local.theta == 1e4,
          "gemma3n_text defaults: %s", err.msg);
    CHECK(parse("{\"model_type\": \"gemma3n\", \"text_config\": {\"model_type\": \"gemma3n_text\", " BASE ", "
                "\"num_kv_shared_layers\": 0, \"activation_sparsity_pattern\": [0.5, 0.0]}, \"audio_config\": {}, "
                "\"vision_config\": {}}", NULL, &c, &err) == KN_OK && c.arch == KN_ARCH_GEMMA3N &&
              !strcmp(c.wrapper_type, "gemma3n") && strstr(c.ignored_configs, "audio_config") && c.layer_sparse[0] &&
              fabsf(c.layer_sparsity_mult[0]) < 1e-6f,
          "gemma3n wrapper: %s", err.msg);
    CHECK(parse("{\"model_type\": \"gemma3n_text\", " BASE "}", NULL, &c, &err) == KN_OK && c.n_kv_shared_layers == 0,
          "gemma3n: the default 15 shared layers of a 2-layer model share nothing (as transformers): %s", err.msg);
    expect_error("{\"model_type\": \"gemma3n_text\", " BASE ", \"num_kv_shared_layers\": 0, \"altup_active_idx\": 1}",
                 KN_ERR_UNSUPPORTED, "altup_active_idx");
    expect_error("{\"model_type\": \"gemma3n_text\", " BASE ", \"num_kv_shared_layers\": 0, "
                 "\"activation_sparsity_pattern\": [1.0, 0.0]}", KN_ERR_FORMAT, "activation_sparsity_pattern[0]");
    expect_error("{\"model_type\": \"gemma3n_text\", " BASE ", \"num_kv_shared_layers\": 0, "
                 "\"activation_sparsity_pattern\": [0.5]}", KN_ERR_FORMAT, "one value per layer");
    expect_error("{\"model_type\": \"gemma3n_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": [32]}", KN_ERR_FORMAT, "one per layer");
    expect_error("{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": [32, 32]}", KN_ERR_FORMAT, "must be a number");
    /* longrope: phi3's top-level original_max_position_embeddings wins; factor presence recorded */
    CHECK(parse("{\"model_type\": \"phi3\", " BASE ", \"original_max_position_embeddings\": 24, \"rope_parameters\": "
                "{\"rope_type\": \"longrope\", \"original_max_position_embeddings\": 99, \"short_factor\": [1, 1], "
                "\"long_factor\": [2, 2]}}", NULL, &c, &err) == KN_OK &&
              c.rope.type == KN_ROPE_LONGROPE && c.rope.original_max_position_embeddings == 24 && !c.rope.has_factor &&
              c.rope.n_long_factor == 2,
          "phi3 longrope: %s", err.msg);

    expect_error("{\"model_type\": \"bert\", " BASE "}", KN_ERR_UNSUPPORTED, "llama, mistral, qwen2, qwen3, phi3");
    expect_error("{" BASE "}", KN_ERR_FORMAT, "model_type");
    expect_error("{\"model_type\": \"llama\", \"hidden_size\": 64}", KN_ERR_FORMAT, "vocab_size");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", KN_ERR_FORMAT, "multiple");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"head_dim\": \"x\"}", KN_ERR_FORMAT, "head_dim");
    expect_error("{\"model_type\": \"llama\", \"vocab_size\": -5, \"hidden_size\": 64, \"intermediate_size\": 1, \"num_hidden_layers\": 1, \"num_attention_heads\": 1}",
                 KN_ERR_FORMAT, "positive");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"weird\", \"factor\": 2}}", KN_ERR_UNSUPPORTED, "weird");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", KN_ERR_FORMAT, "factor");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"relu2\"}", KN_ERR_UNSUPPORTED, "relu2");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"layer_types\": [\"full_attention\"]}", KN_ERR_FORMAT, "layer_types");
    expect_error("[1, 2]", KN_ERR_FORMAT, "object");
    expect_error("{\"model_type\": \"llama\", ", KN_ERR_FORMAT, "invalid JSON");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"num_hidden_layers\": 100000}", KN_ERR_UNSUPPORTED, "layers");
    expect_error("{\"model_type\": \"phi3\", " BASE ", \"partial_rotary_factor\": 0.01}", KN_ERR_FORMAT, "rotary");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"partial_rotary_factor\": 1e200}", KN_ERR_FORMAT,
                 "outside (0, 1]"); /* found by fuzz_config: a float-to-int conversion out of range */
    expect_error("{\"model_type\": \"phi3\", " BASE ", \"partial_rotary_factor\": -2}", KN_ERR_FORMAT, "outside");
    CHECK(parse("{\"model_type\": \"llama\", " BASE "}", "{\"eos_token_id\": \"x\"}", &c, &err) == KN_ERR_FORMAT &&
              strstr(err.msg, "eos_token_id"), "bad generation config");
    return kn_test_done("test_config");
}

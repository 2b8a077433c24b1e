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

    expect_error("{\"model_type\": \"bert\", " BASE "}", KN_ERR_UNSUPPORTED, "llama, mistral, qwen2, qwen3, phi3");
    expect_error("{" BASE "}", KN_ERR_FORMAT, "model_type");
    expect_error("{\"model_type\": \"llama\", \"hidden_size\": 64}", KN_ERR_FORMAT, "vocab_size");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", KN_ERR_FORMAT, "multiple");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"head_dim\": \"x\"}", KN_ERR_FORMAT, "head_dim");
    expect_error("{\"model_type\": \"llama\", \"vocab_size\": -5, \"hidden_size\": 64, \"intermediate_size\": 1, \"num_hidden_layers\": 1, \"num_attention_heads\": 1}",
                 KN_ERR_FORMAT, "positive");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"weird\", \"factor\": 2}}", KN_ERR_UNSUPPORTED, "weird");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", KN_ERR_FORMAT, "factor");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"gelu\"}", KN_ERR_UNSUPPORTED, "gelu");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"layer_types\": [\"full_attention\"]}", KN_ERR_FORMAT, "layer_types");
    expect_error("[1, 2]", KN_ERR_FORMAT, "object");
    expect_error("{\"model_type\": \"llama\", ", KN_ERR_FORMAT, "invalid JSON");
    expect_error("{\"model_type\": \"llama\", " BASE ", \"num_hidden_layers\": 100000}", KN_ERR_UNSUPPORTED, "layers");
    expect_error("{\"model_type\": \"phi3\", " BASE ", \"partial_rotary_factor\": 0.01}", KN_ERR_FORMAT, "rotary");
    CHECK(parse("{\"model_type\": \"llama\", " BASE "}", "{\"eos_token_id\": \"x\"}", &c, &err) == KN_ERR_FORMAT &&
              strstr(err.msg, "eos_token_id"), "bad generation config");
    return kn_test_done("test_config");
}

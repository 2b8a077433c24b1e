/* model_config.c — config.json / generation_config.json -> kn_model_config.
 *
 * Strict where a wrong value would silently give wrong numbers (sizes, heads,
 * activation, rope type), lenient where transformers is lenient (absent keys
 * take the transformers default of the architecture). */
#include "io/model_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h" /* KN_MOE_MAX_EXPERTS */
#include "base/quant.h"
#include "io/file_util.h"

static const char *const arch_names[KN_ARCH_COUNT] = {
    [KN_ARCH_LLAMA] = "llama",         [KN_ARCH_MISTRAL] = "mistral",     [KN_ARCH_QWEN2] = "qwen2",
    [KN_ARCH_QWEN3] = "qwen3",         [KN_ARCH_PHI3] = "phi3",           [KN_ARCH_GEMMA] = "gemma",
    [KN_ARCH_GEMMA2] = "gemma2",       [KN_ARCH_GEMMA3] = "gemma3_text",  [KN_ARCH_QWEN2_MOE] = "qwen2_moe",
    [KN_ARCH_QWEN3_MOE] = "qwen3_moe", [KN_ARCH_MIXTRAL] = "mixtral",     [KN_ARCH_OLMO2] = "olmo2",
    [KN_ARCH_GRANITE] = "granite",     [KN_ARCH_STARCODER2] = "starcoder2", [KN_ARCH_GLM4] = "glm4",
    [KN_ARCH_SMOLLM3] = "smollm3",     [KN_ARCH_GEMMA4] = "gemma4_text", [KN_ARCH_GEMMA3N] = "gemma3n_text",
};
_Static_assert(sizeof arch_names / sizeof *arch_names == KN_ARCH_COUNT, "one name per architecture");

/* Multimodal checkpoints whose language model kiln runs: model_type -> the
 * key holding the text model's config. Everything else in them is ignored
 * (and said so: see kn_model_config.ignored_configs). */
static const struct {
    const char *model_type, *text_key;
} wrappers[] = {{"gemma3", "text_config"}, {"gemma4", "text_config"}, {"gemma3n", "text_config"}};

const char *kn_arch_name(kn_arch a) { return (unsigned)a < KN_ARCH_COUNT ? arch_names[a] : "?"; }

const char *kn_supported_model_types(void) {
    return "llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text, gemma3 (its text model), gemma4_text, "
           "gemma4 (its text model), gemma3n_text, gemma3n (its text model), qwen2_moe, qwen3_moe, mixtral, olmo2, granite, starcoder2, glm4, smollm3";
}

/* ---- small typed getters: absent/null -> default; wrong type -> error ---- */

typedef struct {
    const char *where;
    kn_error *err;
    kn_code code;
} cfg_ctx;

static int get_int(cfg_ctx *c, json_t *obj, const char *key, int def, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < -2147483647LL || x > 2147483647LL) goto bad;
        *out = (int)x;
        return 0;
    }
    if (json_is_real(v)) { /* some configs write 4096.0 */
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 2147483647.0) goto bad;
        *out = (int)d;
        return 0;
    }
bad:
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"%s\" must be an integer", c->where, key);
    return -1;
}

static int get_num(cfg_ctx *c, json_t *obj, const char *key, double def, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (json_is_number(v)) { *out = json_number_value(v); return 0; }
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"%s\" must be a number", c->where, key);
    return -1;
}

static int get_bool(cfg_ctx *c, json_t *obj, const char *key, int def, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (json_is_boolean(v)) { *out = json_is_true(v); return 0; }
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"%s\" must be true or false", c->where, key);
    return -1;
}

static int require_positive(cfg_ctx *c, json_t *obj, const char *key, int *out) {
    if (!json_object_get(obj, key) || json_is_null(json_object_get(obj, key))) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: missing required key \"%s\"", c->where, key);
        return -1;
    }
    if (get_int(c, obj, key, 0, out)) return -1;
    if (*out <= 0) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"%s\" must be positive (got %d)", c->where, key, *out);
        return -1;
    }
    return 0;
}

/* eos ids: an integer or a list of integers */
static int get_eos(cfg_ctx *c, json_t *obj, kn_model_config *cfg) {
    json_t *v = json_object_get(obj, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    cfg->n_eos = 0;
    if (json_is_integer(v)) {
        cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(v);
        return 0;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e)) break;
            if (cfg->n_eos < KN_MAX_EOS) cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(e);
        }
        if (i == json_array_size(v)) return 0;
    }
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers",
                      c->where);
    return -1;
}

static int parse_factor_list(cfg_ctx *c, json_t *rs, const char *key, double *dst, int *n) {
    json_t *v = json_object_get(rs, key);
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) > KN_MAX_ROPE_FACTORS) goto bad;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_number(e)) goto bad;
        dst[i] = json_number_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
bad:
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope \"%s\" must be a list of at most %d numbers", c->where,
                      key, KN_MAX_ROPE_FACTORS);
    return -1;
}

/* One RoPE setting: top-level keys of root, overridden by the object rs
 * (NULL = none). theta_default applies when neither names a theta. */
static int parse_rope_obj(cfg_ctx *c, json_t *root, json_t *rs, double theta_default, kn_rope_config *r) {
    if (rs && !json_is_object(rs)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope scaling must be an object", c->where);
        return -1;
    }
    double theta_top;
    if (get_num(c, root, "rope_theta", theta_default, &theta_top)) return -1;
    r->theta = theta_top;
    if (rs && get_num(c, rs, "rope_theta", theta_top, &r->theta)) return -1;
    if (get_num(c, root, "partial_rotary_factor", 1.0, &r->partial_rotary_factor)) return -1;
    if (rs && get_num(c, rs, "partial_rotary_factor", r->partial_rotary_factor, &r->partial_rotary_factor))
        return -1;
    if (!(r->partial_rotary_factor > 0.0 && r->partial_rotary_factor <= 1.0)) { /* NaN too */
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: partial_rotary_factor %g is outside (0, 1]", c->where,
                          r->partial_rotary_factor);
        return -1;
    }
    r->type = KN_ROPE_DEFAULT;
    r->factor = 1.0;
    r->truncate = 1;
    if (!rs) return 0;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(rs, "type");
    const char *ts = t && json_is_string(t) ? json_string_value(t) : "default";
    if (t && !json_is_null(t) && !json_is_string(t)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope_type must be a string", c->where);
        return -1;
    }
    if (!strcmp(ts, "default")) r->type = KN_ROPE_DEFAULT;
    else if (!strcmp(ts, "linear")) r->type = KN_ROPE_LINEAR;
    else if (!strcmp(ts, "dynamic")) r->type = KN_ROPE_DYNAMIC;
    else if (!strcmp(ts, "llama3")) r->type = KN_ROPE_LLAMA3;
    else if (!strcmp(ts, "yarn")) r->type = KN_ROPE_YARN;
    else if (!strcmp(ts, "longrope") || !strcmp(ts, "su")) r->type = KN_ROPE_LONGROPE;
    else if (!strcmp(ts, "proportional")) r->type = KN_ROPE_PROPORTIONAL;
    else {
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED,
                          "%s: rope type \"%s\" is not supported (supported: default, linear, dynamic, llama3, "
                          "yarn, longrope, proportional)", c->where, ts);
        return -1;
    }
    if (get_num(c, rs, "factor", 1.0, &r->factor)) return -1;
    r->has_factor = json_object_get(rs, "factor") && !json_is_null(json_object_get(rs, "factor"));
    if (get_num(c, rs, "low_freq_factor", 1.0, &r->low_freq_factor)) return -1;
    if (get_num(c, rs, "high_freq_factor", 4.0, &r->high_freq_factor)) return -1;
    if (get_int(c, rs, "original_max_position_embeddings", 0, &r->original_max_position_embeddings)) return -1;
    if (get_num(c, rs, "beta_fast", 32.0, &r->beta_fast)) return -1;
    if (get_num(c, rs, "beta_slow", 1.0, &r->beta_slow)) return -1;
    if (get_num(c, rs, "mscale", 0.0, &r->mscale)) return -1;
    if (get_num(c, rs, "mscale_all_dim", 0.0, &r->mscale_all_dim)) return -1;
    if (get_bool(c, rs, "truncate", 1, &r->truncate)) return -1;
    json_t *af = json_object_get(rs, "attention_factor");
    r->has_attention_factor = af && !json_is_null(af);
    if (get_num(c, rs, "attention_factor", 1.0, &r->attention_factor)) return -1;
    if (parse_factor_list(c, rs, "long_factor", r->long_factor, &r->n_long_factor)) return -1;
    if (parse_factor_list(c, rs, "short_factor", r->short_factor, &r->n_short_factor)) return -1;
    if (r->type == KN_ROPE_LONGROPE && json_is_integer(json_object_get(root, "original_max_position_embeddings"))) {
        /* transformers gives phi3's top-level original_max_position_embeddings priority */
        if (get_int(c, root, "original_max_position_embeddings", 0, &r->original_max_position_embeddings)) return -1;
    }
    if (r->original_max_position_embeddings == 0) {
        int top;
        if (get_int(c, root, "original_max_position_embeddings", 0, &top)) return -1;
        r->original_max_position_embeddings = top;
    }
    if (!(r->theta > 0) || !(r->factor > 0)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope theta and factor must be positive", c->where);
        return -1;
    }
    if ((r->type == KN_ROPE_LINEAR || r->type == KN_ROPE_LLAMA3 || r->type == KN_ROPE_YARN) &&
        !json_object_get(rs, "factor")) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope type \"%s\" needs \"factor\"", c->where, ts);
        return -1;
    }
    return 0;
}

static json_t *object_or_null(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int parse_rope(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    /* transformers 5 writes rope_parameters {rope_type, rope_theta, ...}, or
     * for models with per-layer-type RoPE (gemma3) one such object per layer
     * type; published checkpoints write rope_theta + rope_scaling. */
    json_t *rs = object_or_null(root, "rope_parameters");
    if (!rs) rs = object_or_null(root, "rope_scaling");
    if (cfg->arch != KN_ARCH_GEMMA3 && cfg->arch != KN_ARCH_GEMMA4 && cfg->arch != KN_ARCH_GEMMA3N)
        return parse_rope_obj(c, root, rs, 10000.0, &cfg->rope);
    cfg->has_local_rope = 1;
    if (rs && json_is_object(rs) && (json_object_get(rs, "full_attention") || json_object_get(rs, "sliding_attention"))) {
        json_t *full = object_or_null(rs, "full_attention"), *slide = object_or_null(rs, "sliding_attention");
        if (parse_rope_obj(c, root, full, 1000000.0, &cfg->rope)) return -1;
        return parse_rope_obj(c, root, slide, 10000.0, &cfg->rope_local);
    }
    /* transformers 4 layout: rope_scaling applies to global layers only, local
     * layers use the default rope at rope_local_base_freq */
    if (parse_rope_obj(c, root, rs, 1000000.0, &cfg->rope)) return -1;
    double local;
    if (get_num(c, root, "rope_local_base_freq", 10000.0, &local)) return -1;
    memset(&cfg->rope_local, 0, sizeof cfg->rope_local);
    cfg->rope_local.type = KN_ROPE_DEFAULT;
    cfg->rope_local.theta = local;
    cfg->rope_local.factor = 1.0;
    cfg->rope_local.partial_rotary_factor = 1.0;
    cfg->rope_local.truncate = 1;
    if (!(local > 0)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope_local_base_freq must be positive", c->where);
        return -1;
    }
    return 0;
}

static int parse_layer_windows(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && json_is_array(lt)) {
        if ((int)json_array_size(lt) != cfg->n_layers) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", c->where,
                              json_array_size(lt), cfg->n_layers);
            return -1;
        }
        for (int i = 0; i < cfg->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "sliding_attention")) cfg->layer_sliding[i] = 1;
            else if (s && !strcmp(s, "full_attention")) cfg->layer_sliding[i] = 0;
            else {
                c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED, "%s: layer_types[%d] \"%s\" is not supported",
                                  c->where, i, s ? s : "(not a string)");
                return -1;
            }
        }
        return 0;
    }
    int window_all = 0;
    switch (cfg->arch) {
    case KN_ARCH_MISTRAL:
    case KN_ARCH_MIXTRAL:
    case KN_ARCH_STARCODER2:
    case KN_ARCH_PHI3: window_all = cfg->sliding_window > 0; break;
    case KN_ARCH_GEMMA2:
    case KN_ARCH_GEMMA4:
    case KN_ARCH_GEMMA3N:
    case KN_ARCH_GEMMA3: {
        /* transformers' default layer pattern: every `pattern`-th layer is global */
        int pattern = cfg->arch == KN_ARCH_GEMMA4 ? 6 : cfg->arch == KN_ARCH_GEMMA3N ? 5 : 2;
        if (cfg->arch == KN_ARCH_GEMMA3 && get_int(c, root, "sliding_window_pattern", 6, &pattern)) return -1;
        if (pattern <= 0) pattern = 1;
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sliding[i] = cfg->sliding_window > 0 && (i + 1) % pattern != 0;
        return 0;
    }
    case KN_ARCH_SMOLLM3: {
        /* transformers' default: with use_sliding_window, the NoPE layers slide */
        int use = 0;
        if (get_bool(c, root, "use_sliding_window", 0, &use)) return -1;
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sliding[i] = use && cfg->sliding_window > 0 && !cfg->layer_rope[i];
        return 0;
    }
    case KN_ARCH_QWEN2_MOE:
    case KN_ARCH_QWEN3_MOE:
    case KN_ARCH_QWEN2:
    case KN_ARCH_QWEN3: {
        int use = 0, max_window_layers = cfg->n_layers;
        if (get_bool(c, root, "use_sliding_window", 0, &use)) return -1;
        if (get_int(c, root, "max_window_layers", cfg->n_layers, &max_window_layers)) return -1;
        for (int i = 0; i < cfg->n_layers; i++)
            cfg->layer_sliding[i] = use && cfg->sliding_window > 0 && i >= max_window_layers;
        return 0;
    }
    default: window_all = 0;
    }
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sliding[i] = (uint8_t)window_all;
    return 0;
}

/* A number that may be JSON null meaning "off" (0), absent meaning def. */
static int get_num_or_off(cfg_ctx *c, json_t *obj, const char *key, double def, double *out) {
    json_t *v = json_object_get(obj, key);
    if (v && json_is_null(v)) { *out = 0.0; return 0; }
    return get_num(c, obj, key, def, out);
}

static int parse_activation(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    int gemma = cfg->arch == KN_ARCH_GEMMA || cfg->arch == KN_ARCH_GEMMA2 || cfg->arch == KN_ARCH_GEMMA3 ||
                cfg->arch == KN_ARCH_GEMMA4 || cfg->arch == KN_ARCH_GEMMA3N;
    const char *act = NULL;
    /* transformers 5.17: gemma2/3 read hidden_activation, gemma (1) reads hidden_act */
    if (gemma && cfg->arch != KN_ARCH_GEMMA) act = json_string_value(json_object_get(root, "hidden_activation"));
    if (!act) act = json_string_value(json_object_get(root, "hidden_act"));
    if (!act) act = gemma ? "gelu_pytorch_tanh" : cfg->arch == KN_ARCH_STARCODER2 ? "gelu_pytorch_tanh" : "silu";
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) cfg->act = 0;
    else if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_new") || !strcmp(act, "gelu_fast")) cfg->act = 1;
    else if (!strcmp(act, "gelu")) cfg->act = 2;
    else {
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED,
                          "%s: hidden activation \"%s\" is not supported for %s (supported: silu, gelu, "
                          "gelu_pytorch_tanh, gelu_new)", c->where, act, cfg->model_type);
        return -1;
    }
    return 0;
}

static int parse_moe(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    int step = 1;
    if (cfg->arch == KN_ARCH_MIXTRAL) {
        if (get_int(c, root, "num_local_experts", 8, &cfg->n_experts) ||
            get_int(c, root, "num_experts_per_tok", 2, &cfg->n_experts_per_tok))
            return -1;
        cfg->moe_intermediate_size = cfg->intermediate_size;
        cfg->norm_topk_prob = 1;
    } else {
        int q2 = cfg->arch == KN_ARCH_QWEN2_MOE;
        /* transformers 5 saves qwen3_moe's num_experts as num_local_experts */
        const char *ne = json_object_get(root, "num_experts") ? "num_experts" : "num_local_experts";
        if (get_int(c, root, ne, q2 ? 60 : 128, &cfg->n_experts) ||
            get_int(c, root, "num_experts_per_tok", q2 ? 4 : 8, &cfg->n_experts_per_tok) ||
            get_int(c, root, "moe_intermediate_size", q2 ? 1408 : 768, &cfg->moe_intermediate_size) ||
            get_bool(c, root, "norm_topk_prob", 0, &cfg->norm_topk_prob) ||
            get_int(c, root, "decoder_sparse_step", 1, &step))
            return -1;
        if (q2 && get_int(c, root, "shared_expert_intermediate_size", 5632, &cfg->shared_expert_intermediate_size))
            return -1;
    }
    if (cfg->n_experts < 1 || cfg->n_experts > KN_MOE_MAX_EXPERTS || cfg->n_experts_per_tok < 1 ||
        cfg->n_experts_per_tok > cfg->n_experts || cfg->n_experts_per_tok > 64 || cfg->moe_intermediate_size <= 0 ||
        cfg->shared_expert_intermediate_size < 0 || step < 1) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT,
                          "%s: MoE sizes out of range (experts %d, per token %d, expert ffn %d, shared ffn %d, "
                          "sparse step %d)", c->where, cfg->n_experts, cfg->n_experts_per_tok,
                          cfg->moe_intermediate_size, cfg->shared_expert_intermediate_size, step);
        return -1;
    }
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_moe[i] = (i + 1) % step == 0;
    json_t *dense = json_object_get(root, "mlp_only_layers");
    if (dense && !json_is_null(dense)) {
        size_t i;
        json_t *e;
        if (!json_is_array(dense)) goto bad_list;
        json_array_foreach(dense, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->n_layers)
                goto bad_list;
            cfg->layer_moe[json_integer_value(e)] = 0;
        }
    }
    return 0;
bad_list:
    c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: mlp_only_layers must be a list of layer indices", c->where);
    return -1;
}

/* smollm3: no_rope_layers[i] = 1 uses RoPE, 0 is a NoPE layer */
static int parse_rope_layers(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_rope[i] = 1;
    if (cfg->arch != KN_ARCH_SMOLLM3) return 0;
    json_t *v = json_object_get(root, "no_rope_layers");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || (int)json_array_size(v) != cfg->n_layers) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: no_rope_layers must list one 0/1 per layer", c->where);
            return -1;
        }
        for (int i = 0; i < cfg->n_layers; i++) {
            json_t *e = json_array_get(v, (size_t)i);
            if (!json_is_integer(e) && !json_is_boolean(e)) {
                c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: no_rope_layers[%d] must be 0 or 1", c->where, i);
                return -1;
            }
            cfg->layer_rope[i] = json_is_boolean(e) ? json_is_true(e) : json_integer_value(e) != 0;
        }
        return 0;
    }
    int interval;
    if (get_int(c, root, "no_rope_layer_interval", 4, &interval)) return -1;
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_rope[i] = interval <= 0 || (i + 1) % interval != 0;
    return 0;
}

/* The per-family feature table: everything the shared decoder needs to know
 * beyond sizes, from model_type and the family's config keys. */
/* MLX quantization block: {"group_size": G, "bits": B, ["mode": "affine"],
 * "<module path>": {"group_size", "bits"} | false, ...}. Validated here so a
 * bad block is reported before any tensor is read. */
static int parse_quant_pair(cfg_ctx *c, json_t *q, const char *what, int *bits, int *gs) {
    if (get_int(c, q, "bits", 0, bits) || get_int(c, q, "group_size", 64, gs)) return -1;
    if (!kn_quant_bits_ok(*bits) || !kn_quant_group_ok(*gs)) {
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED,
                          "%s: %s: bits %d / group_size %d (supported: bits 2, 3, 4, 5, 6, 8; group_size 32, 64, 128)", c->where,
                          what, *bits, *gs);
        return -1;
    }
    return 0;
}

static int parse_quantization(cfg_ctx *c, json_t *root, json_t *outer, kn_model_config *cfg) {
    json_t *q = NULL;
    const char *keys[] = {"quantization", "quantization_config"};
    for (int i = 0; i < 2 && !q; i++) {
        q = json_object_get(root, keys[i]);
        if (!q && outer != root) q = json_object_get(outer, keys[i]);
        if (q && json_is_null(q)) q = NULL;
    }
    if (!q) return 0;
    if (!json_is_object(q)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: \"quantization\" must be an object", c->where);
        return -1;
    }
    json_t *method = json_object_get(q, "quant_method");
    json_t *mode = json_object_get(q, "mode");
    if ((method && !json_is_null(method)) || (mode && !(json_is_string(mode) && !strcmp(json_string_value(mode), "affine")))) {
        const char *name = json_string_value(method ? method : mode);
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED,
                          "%s: quantization method \"%s\" is not supported (only MLX affine: bits/group_size)", c->where,
                          name ? name : "?");
        return -1;
    }
    if (parse_quant_pair(c, q, "quantization", &cfg->quant_bits, &cfg->quant_group_size)) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (json_is_false(v)) {
            cfg->quant_n_overrides++;
            continue;
        }
        if (!json_is_object(v)) continue; /* bits, group_size, mode */
        int b, g;
        if (parse_quant_pair(c, v, key, &b, &g)) return -1;
        cfg->quant_n_overrides++;
    }
    return 0;
}

/* The standard normal quantile (torch.distributions.Normal(0, 1).icdf):
 * sqrt(2) erfinv(2p - 1), by Newton steps on erf from a bisection start. */
static double normal_icdf(double p) {
    double lo = -10, hi = 10;
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
        else hi = mid;
    }
    double x = 0.5 * (lo + hi);
    for (int i = 0; i < 3; i++) {
        double f = 0.5 * erfc(-x / sqrt(2.0)) - p, d = exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846);
        if (d > 0) x -= f / d;
    }
    return x;
}

/* gemma3n_text (transformers 5.17 Gemma3nTextConfig and its defaults) */
static int parse_gemma3n(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    cfg->embed_scale = (float)sqrt((double)cfg->hidden_size);
    cfg->norm_layout = KN_NORMS_SANDWICH;
    cfg->qk_norm_kind = KN_QK_NORM_HEAD;
    cfg->v_norm = 1;
    cfg->attn_scale = 1.0;
    int active = 0;
    double clip;
    if (get_num_or_off(c, root, "final_logit_softcapping", 30.0, &cfg->final_softcap) ||
        get_int(c, root, "num_kv_shared_layers", 15, &cfg->n_kv_shared_layers) ||
        get_int(c, root, "hidden_size_per_layer_input", 256, &cfg->ple_dim) ||
        get_int(c, root, "vocab_size_per_layer_input", 262144, &cfg->ple_vocab) ||
        get_int(c, root, "altup_num_inputs", 4, &cfg->altup_inputs) ||
        get_int(c, root, "altup_active_idx", 0, &active) || get_num(c, root, "altup_coef_clip", 120.0, &clip) ||
        get_bool(c, root, "altup_correct_scale", 1, &cfg->altup_correct_scale) ||
        get_int(c, root, "laurel_rank", 64, &cfg->laurel_rank))
        return -1;
    /* transformers shares from layer n_layers - num_kv_shared_layers only when that index is > 0 */
    if (cfg->n_kv_shared_layers >= cfg->n_layers) cfg->n_kv_shared_layers = 0;
    if (cfg->final_softcap < 0 || cfg->n_kv_shared_layers < 0 ||
        cfg->ple_dim <= 0 || cfg->ple_dim > 4096 || cfg->ple_vocab <= 0 || cfg->altup_inputs < 2 ||
        cfg->altup_inputs > 8 || cfg->laurel_rank <= 0 || cfg->laurel_rank > 65536) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT,
                          "%s: gemma3n options out of range (final_logit_softcapping, num_kv_shared_layers %d, "
                          "hidden_size_per_layer_input %d, altup_num_inputs %d (2..8), laurel_rank %d)",
                          c->where, cfg->n_kv_shared_layers, cfg->ple_dim, cfg->altup_inputs, cfg->laurel_rank);
        return -1;
    }
    if (active != 0) {
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED, "%s: altup_active_idx %d is not supported (only 0)", c->where,
                          active);
        return -1;
    }
    /* activation_sparsity_pattern: one value per layer; absent: 0.95 for the
     * first 10 layers of models deeper than 10, else none */
    json_t *asp = json_object_get(root, "activation_sparsity_pattern");
    if (asp && !json_is_null(asp) && (!json_is_array(asp) || (int)json_array_size(asp) != cfg->n_layers)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: activation_sparsity_pattern must list one value per layer (%d)",
                          c->where, cfg->n_layers);
        return -1;
    }
    for (int i = 0; i < cfg->n_layers; i++) {
        double p = asp && !json_is_null(asp) ? json_number_value(json_array_get(asp, (size_t)i))
                   : cfg->n_layers > 10 && i < 10 ? 0.95 : 0.0;
        json_t *v = asp && !json_is_null(asp) ? json_array_get(asp, (size_t)i) : NULL;
        if ((v && !json_is_number(v)) || !(p >= 0.0 && p < 1.0)) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: activation_sparsity_pattern[%d] must be in [0, 1)", c->where, i);
            return -1;
        }
        cfg->layer_sparse[i] = p > 0.0;
        cfg->layer_sparsity_mult[i] = p > 0.0 ? (float)normal_icdf(p) : 0.0f;
    }
    return 0;
}

static int parse_family(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    const kn_arch a = cfg->arch;
    cfg->mlp_gated = 1;
    cfg->embed_scale = cfg->residual_scale = cfg->logit_scale = 1.0;
    cfg->attn_scale = 1.0 / sqrt((double)cfg->head_dim);
    if (parse_activation(c, root, cfg)) return -1;
    switch (a) {
    case KN_ARCH_GEMMA:
    case KN_ARCH_GEMMA2:
    case KN_ARCH_GEMMA3: {
        cfg->norm_weight_offset = 1.0;
        cfg->embed_scale = (float)sqrt((double)cfg->hidden_size); /* a float32 tensor in transformers */
        if (a == KN_ARCH_GEMMA) break;
        cfg->norm_layout = KN_NORMS_SANDWICH;
        double qpas;
        if (get_num(c, root, "query_pre_attn_scalar", 256.0, &qpas)) return -1;
        if (!(qpas > 0)) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: query_pre_attn_scalar must be positive", c->where);
            return -1;
        }
        cfg->attn_scale = pow(qpas, -0.5);
        if (get_num_or_off(c, root, "attn_logit_softcapping", a == KN_ARCH_GEMMA2 ? 50.0 : 0.0, &cfg->attn_softcap) ||
            get_num_or_off(c, root, "final_logit_softcapping", a == KN_ARCH_GEMMA2 ? 30.0 : 0.0, &cfg->final_softcap))
            return -1;
        if (cfg->attn_softcap < 0 || cfg->final_softcap < 0) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: soft-capping values must not be negative", c->where);
            return -1;
        }
        if (a == KN_ARCH_GEMMA3) cfg->qk_norm_kind = KN_QK_NORM_HEAD;
        break;
    }
    case KN_ARCH_GEMMA4:
        cfg->embed_scale = (float)sqrt((double)cfg->hidden_size);
        cfg->norm_layout = KN_NORMS_SANDWICH;
        cfg->qk_norm_kind = KN_QK_NORM_HEAD;
        cfg->v_norm = 1;
        cfg->attn_scale = 1.0;
        if (get_num_or_off(c, root, "final_logit_softcapping", 0.0, &cfg->final_softcap) ||
            get_bool(c, root, "attention_k_eq_v", 0, &cfg->k_eq_v) ||
            get_int(c, root, "num_kv_shared_layers", 0, &cfg->n_kv_shared_layers) ||
            get_int(c, root, "hidden_size_per_layer_input", 256, &cfg->ple_dim) ||
            get_int(c, root, "vocab_size_per_layer_input", 262144, &cfg->ple_vocab) ||
            get_bool(c, root, "use_double_wide_mlp", 0, &cfg->double_wide_mlp) ||
            get_bool(c, root, "enable_moe_block", 0, &cfg->moe_parallel))
            return -1;
        if (cfg->final_softcap < 0 || cfg->n_kv_shared_layers < 0 || cfg->n_kv_shared_layers >= cfg->n_layers ||
            cfg->ple_dim < 0 || cfg->ple_dim > 4096 || (cfg->ple_dim && cfg->ple_vocab <= 0)) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT,
                              "%s: gemma4 options out of range (final_logit_softcapping, num_kv_shared_layers %d, "
                              "hidden_size_per_layer_input %d)", c->where, cfg->n_kv_shared_layers, cfg->ple_dim);
            return -1;
        }
        if (cfg->moe_parallel) {
            if (get_int(c, root, "num_experts", 0, &cfg->n_experts) ||
                get_int(c, root, "top_k_experts", 0, &cfg->n_experts_per_tok) ||
                get_int(c, root, "moe_intermediate_size", 0, &cfg->moe_intermediate_size))
                return -1;
            cfg->norm_topk_prob = 1;
            if (cfg->n_experts < 1 || cfg->n_experts > KN_MOE_MAX_EXPERTS || cfg->n_experts_per_tok < 1 ||
                cfg->n_experts_per_tok > cfg->n_experts || cfg->n_experts_per_tok > 64 || cfg->moe_intermediate_size <= 0) {
                c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: MoE sizes out of range (num_experts %d, top_k_experts %d, "
                                  "moe_intermediate_size %d)", c->where, cfg->n_experts, cfg->n_experts_per_tok,
                                  cfg->moe_intermediate_size);
                return -1;
            }
            for (int i = 0; i < cfg->n_layers; i++) cfg->layer_moe[i] = 1;
        }
        break;
    case KN_ARCH_GEMMA3N:
        if (parse_gemma3n(c, root, cfg)) return -1;
        break;
    case KN_ARCH_QWEN3:
    case KN_ARCH_QWEN3_MOE: cfg->qk_norm_kind = KN_QK_NORM_HEAD; break;
    case KN_ARCH_OLMO2:
        cfg->norm_layout = KN_NORMS_POST;
        cfg->qk_norm_kind = KN_QK_NORM_FULL;
        break;
    case KN_ARCH_GRANITE: {
        double logits_scaling;
        if (get_num(c, root, "embedding_multiplier", 1.0, &cfg->embed_scale) ||
            get_num(c, root, "residual_multiplier", 1.0, &cfg->residual_scale) ||
            get_num(c, root, "attention_multiplier", 1.0, &cfg->attn_scale) ||
            get_num(c, root, "logits_scaling", 1.0, &logits_scaling))
            return -1;
        if (!(logits_scaling != 0) || !isfinite(cfg->embed_scale) || !isfinite(cfg->residual_scale) ||
            !isfinite(cfg->attn_scale)) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: granite multipliers must be finite, logits_scaling non-zero",
                              c->where);
            return -1;
        }
        cfg->logit_scale = 1.0 / logits_scaling;
        break;
    }
    case KN_ARCH_STARCODER2:
        cfg->layer_norm = 1;
        cfg->mlp_gated = 0;
        if (get_num(c, root, "norm_epsilon", 1e-5, &cfg->rms_norm_eps)) return -1;
        break;
    case KN_ARCH_GLM4:
        cfg->norm_layout = KN_NORMS_SANDWICH;
        cfg->rope_interleaved = 1;
        cfg->fused_gate_up = 1;
        break;
    default: break;
    }
    if (a == KN_ARCH_QWEN2_MOE || a == KN_ARCH_QWEN3_MOE || a == KN_ARCH_MIXTRAL) {
        if (parse_moe(c, root, cfg)) return -1;
    }
    return parse_rope_layers(c, root, cfg);
}

/* Per-layer attention shapes: gemma4's global (full-attention) layers use
 * global_head_dim and, with attention_k_eq_v, num_global_key_value_heads;
 * transformers 5 may also write them as per_layer_config {index: {head_dim,
 * num_key_value_heads}}. Every other family is uniform. */
static int parse_layer_shapes(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    for (int i = 0; i < cfg->n_layers; i++)
        cfg->layer_head_dim[i] = (uint16_t)cfg->head_dim, cfg->layer_kv_heads[i] = (uint16_t)cfg->n_kv_heads;
    if (cfg->arch != KN_ARCH_GEMMA4) return 0;
    cfg->layer_sliding[cfg->n_layers - 1] = 0; /* transformers forces the last layer global */
    int ghd, gkv;
    if (get_int(c, root, "global_head_dim", 512, &ghd) ||
        get_int(c, root, "num_global_key_value_heads", cfg->n_kv_heads, &gkv))
        return -1;
    if (!cfg->k_eq_v) gkv = cfg->n_kv_heads;
    for (int i = 0; i < cfg->n_layers; i++)
        if (!cfg->layer_sliding[i]) cfg->layer_head_dim[i] = (uint16_t)(ghd > 0 && ghd <= 1024 ? ghd : 0), cfg->layer_kv_heads[i] = (uint16_t)(gkv > 0 && gkv <= 4096 ? gkv : 0);
    json_t *plc = json_object_get(root, "per_layer_config");
    if (plc && json_is_object(plc)) {
        const char *key;
        json_t *v;
        /* entries keyed by layer index, or by layer type (applies to every layer of that type) */
        json_object_foreach(plc, key, v) {
            if (!json_is_object(v)) continue;
            char *end;
            long idx = strtol(key, &end, 10);
            int by_type = !strcmp(key, "full_attention") ? 0 : !strcmp(key, "sliding_attention") ? 1 : -1;
            if ((*end || idx < 0 || idx >= cfg->n_layers) && by_type < 0) continue;
            for (int i = 0; i < cfg->n_layers; i++) {
                if (by_type >= 0 ? cfg->layer_sliding[i] != by_type : i != idx) continue;
                int hd = cfg->layer_head_dim[i], kv = cfg->layer_kv_heads[i];
                if (get_int(c, v, "head_dim", hd, &hd) || get_int(c, v, "num_key_value_heads", kv, &kv)) return -1;
                cfg->layer_head_dim[i] = (uint16_t)(hd > 0 && hd <= 1024 ? hd : 0);
                cfg->layer_kv_heads[i] = (uint16_t)(kv > 0 && kv <= 4096 ? kv : 0);
            }
        }
    }
    for (int i = 0; i < cfg->n_layers; i++) {
        int hd = cfg->layer_head_dim[i], kv = cfg->layer_kv_heads[i];
        if (hd <= 0 || hd % 2 || kv <= 0 || cfg->n_heads % kv) {
            c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: layer %d has head_dim %d / %d kv heads (heads %d)", c->where, i,
                              hd, kv, cfg->n_heads);
            return -1;
        }
    }
    return 0;
}

kn_code kn_config_parse(const char *json, size_t len, const char *gen_json, size_t gen_len,
                        const char *where, kn_model_config *cfg, kn_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg_ctx c = {.where = where, .err = err, .code = KN_ERR_FORMAT};
    json_error_t jerr;
    json_t *outer = json_loadb(json, len, 0, &jerr);
    if (!outer) return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", where, jerr.line, jerr.text);
    json_t *gen = NULL, *root = outer;
    kn_code rc = KN_ERR_FORMAT;
    if (!json_is_object(outer)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: top level must be a JSON object", where);
        goto done;
    }
    const char *mt = json_string_value(json_object_get(outer, "model_type"));
    if (!mt) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: missing \"model_type\" (supported: %s)", where,
                     kn_supported_model_types());
        goto done;
    }
    /* multimodal wrappers: run the language model, say what is ignored */
    for (size_t w = 0; w < sizeof wrappers / sizeof *wrappers; w++) {
        if (strcmp(mt, wrappers[w].model_type) != 0) continue;
        json_t *text = json_object_get(outer, wrappers[w].text_key);
        if (!text || !json_is_object(text)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: model_type \"%s\" needs a \"%s\" object (its language model)", where,
                         mt, wrappers[w].text_key);
            goto done;
        }
        snprintf(cfg->wrapper_type, sizeof cfg->wrapper_type, "%s", mt);
        const char *key;
        json_t *v;
        size_t n = 0;
        json_object_foreach(outer, key, v) {
            size_t kl = strlen(key);
            if (!json_is_object(v) || !strcmp(key, wrappers[w].text_key) || kl < 7 ||
                strcmp(key + kl - 7, "_config") != 0)
                continue;
            n += (size_t)snprintf(cfg->ignored_configs + n, n < sizeof cfg->ignored_configs ? sizeof cfg->ignored_configs - n : 0,
                                  "%s%s", n ? ", " : "", key);
            if (n >= sizeof cfg->ignored_configs) n = sizeof cfg->ignored_configs - 1;
        }
        root = text;
        mt = json_string_value(json_object_get(root, "model_type"));
        if (!mt) mt = !strcmp(cfg->wrapper_type, "gemma4")    ? "gemma4_text"
                      : !strcmp(cfg->wrapper_type, "gemma3n") ? "gemma3n_text"
                                                              : "gemma3_text";
        break;
    }
    int found = 0;
    for (int a = 0; a < KN_ARCH_COUNT; a++) {
        if (!strcmp(mt, arch_names[a])) { cfg->arch = (kn_arch)a; found = 1; }
    }
    if (!found) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: %s)", where, mt,
                     kn_supported_model_types());
        goto done;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
    const kn_arch A = cfg->arch;
    const int gemma = A == KN_ARCH_GEMMA || A == KN_ARCH_GEMMA2 || A == KN_ARCH_GEMMA3 || A == KN_ARCH_GEMMA4 ||
                      A == KN_ARCH_GEMMA3N;
    json_t *inter = json_object_get(root, "intermediate_size");
    if (require_positive(&c, root, "vocab_size", &cfg->vocab_size) ||
        require_positive(&c, root, "hidden_size", &cfg->hidden_size) ||
        (!json_is_array(inter) && require_positive(&c, root, "intermediate_size", &cfg->intermediate_size)) ||
        require_positive(&c, root, "num_hidden_layers", &cfg->n_layers) ||
        require_positive(&c, root, "num_attention_heads", &cfg->n_heads))
        goto fail;
    if (get_int(&c, root, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads)) goto fail;
    /* transformers 5.17 defaults: gemma family 256, glm4 128, else hidden / heads */
    int hd_default = gemma ? 256 : A == KN_ARCH_GLM4 ? 128 : cfg->hidden_size / cfg->n_heads;
    if (get_int(&c, root, "head_dim", hd_default, &cfg->head_dim)) goto fail;
    if (A == KN_ARCH_PHI3) cfg->head_dim = cfg->hidden_size / cfg->n_heads; /* phi3 has no head_dim */
    if (get_int(&c, root, "max_position_embeddings", 4096, &cfg->max_position_embeddings)) goto fail;
    if (get_num(&c, root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps)) goto fail;
    if (A == KN_ARCH_PHI3 && !json_object_get(root, "rms_norm_eps")) cfg->rms_norm_eps = 1e-5;
    int tie_default = A == KN_ARCH_QWEN3 || gemma || A == KN_ARCH_STARCODER2 || A == KN_ARCH_SMOLLM3;
    if (get_bool(&c, root, "tie_word_embeddings", tie_default, &cfg->tie_word_embeddings)) goto fail;
    if (get_bool(&c, root, "attention_bias", A == KN_ARCH_QWEN2, &cfg->attention_bias)) goto fail;
    if (get_bool(&c, root, "mlp_bias", 0, &cfg->mlp_bias)) goto fail;
    if (get_int(&c, root, "sliding_window",
                A == KN_ARCH_GEMMA2 || A == KN_ARCH_GEMMA3 ? 4096 : A == KN_ARCH_GEMMA4 || A == KN_ARCH_GEMMA3N ? 512 : 0,
                &cfg->sliding_window))
        goto fail;
    if (cfg->sliding_window < 0) cfg->sliding_window = 0;
    if (cfg->n_layers > KN_MAX_LAYERS) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: %d layers exceeds the supported %d", where, cfg->n_layers,
                     KN_MAX_LAYERS);
        goto done;
    }
    if (json_is_array(inter)) { /* gemma3n: one intermediate size per layer */
        if (A != KN_ARCH_GEMMA3N || (int)json_array_size(inter) != cfg->n_layers) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: intermediate_size must be a number%s", where,
                         A == KN_ARCH_GEMMA3N ? " or one per layer" : "");
            goto done;
        }
        for (int i = 0; i < cfg->n_layers; i++) {
            json_t *v = json_array_get(inter, (size_t)i);
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : 0;
            if (x <= 0 || x > (1 << 24)) {
                rc = kn_fail(err, KN_ERR_FORMAT, "%s: intermediate_size[%d] must be a positive integer", where, i);
                goto done;
            }
            cfg->layer_inter[i] = (int)x;
            if (x > cfg->intermediate_size) cfg->intermediate_size = (int)x;
        }
    }
    if (cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads != 0) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                     where, cfg->n_heads, cfg->n_kv_heads);
        goto done;
    }
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0 || cfg->head_dim > 1024) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: head_dim %d must be even and in 2..1024", where, cfg->head_dim);
        goto done;
    }
    if (!(cfg->rms_norm_eps >= 0) || cfg->max_position_embeddings <= 0) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: rms_norm_eps and max_position_embeddings must be positive", where);
        goto done;
    }
    cfg->fused_qkv = cfg->fused_gate_up = A == KN_ARCH_PHI3;
    if (parse_family(&c, root, cfg)) goto fail;
    cfg->qk_norm = cfg->qk_norm_kind == KN_QK_NORM_HEAD;
    if (parse_rope(&c, root, cfg)) goto fail;
    /* transformers' llama-style default rope ignores partial_rotary_factor;
     * phi3's and glm4's default and every scaled rope type honour it */
    if (A != KN_ARCH_PHI3 && A != KN_ARCH_GLM4 && cfg->rope.type == KN_ROPE_DEFAULT)
        cfg->rope.partial_rotary_factor = 1.0;
    if (A == KN_ARCH_GLM4 && !json_object_get(root, "partial_rotary_factor") &&
        !(json_is_object(json_object_get(root, "rope_parameters")) &&
          json_object_get(json_object_get(root, "rope_parameters"), "partial_rotary_factor")))
        cfg->rope.partial_rotary_factor = 0.5; /* Glm4Config's default */
    if (cfg->has_local_rope && cfg->rope_local.type == KN_ROPE_DEFAULT) cfg->rope_local.partial_rotary_factor = 1.0;
    int rot = (int)(cfg->head_dim * cfg->rope.partial_rotary_factor);
    if (rot <= 0 || rot > cfg->head_dim || rot % 2) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: partial_rotary_factor %g gives rotary dim %d for head_dim %d", where,
                     cfg->rope.partial_rotary_factor, rot, cfg->head_dim);
        goto done;
    }
    if (parse_layer_windows(&c, root, cfg) || parse_layer_shapes(&c, root, cfg)) goto fail;
    if (parse_quantization(&c, root, outer, cfg)) goto fail;
    const char *td = json_string_value(json_object_get(root, "torch_dtype"));
    if (!td) td = json_string_value(json_object_get(root, "dtype"));
    if (!td) td = json_string_value(json_object_get(outer, "torch_dtype"));
    if (!td) td = json_string_value(json_object_get(outer, "dtype"));
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", td ? td : "");

    cfg->bos_token_id = -1;
    if (get_int(&c, outer, "bos_token_id", -1, &cfg->bos_token_id) || get_eos(&c, outer, cfg)) goto fail;
    if (root != outer && (get_int(&c, root, "bos_token_id", cfg->bos_token_id, &cfg->bos_token_id) ||
                          get_eos(&c, root, cfg)))
        goto fail;
    cfg->gen_temperature = 1.0;
    cfg->gen_top_p = 1.0;
    cfg->gen_top_k = 50;
    if (gen_json) {
        gen = json_loadb(gen_json, gen_len, 0, &jerr);
        if (!gen || !json_is_object(gen)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: generation_config.json is not a valid JSON object", where);
            goto done;
        }
        if (get_int(&c, gen, "bos_token_id", cfg->bos_token_id, &cfg->bos_token_id) || get_eos(&c, gen, cfg) ||
            get_bool(&c, gen, "do_sample", 0, &cfg->gen_do_sample) ||
            get_num(&c, gen, "temperature", 1.0, &cfg->gen_temperature) ||
            get_num(&c, gen, "top_p", 1.0, &cfg->gen_top_p) || get_num(&c, gen, "min_p", 0.0, &cfg->gen_min_p) ||
            get_int(&c, gen, "top_k", 50, &cfg->gen_top_k))
            goto fail;
    }
    rc = KN_OK;
    goto done;
fail:
    rc = c.code;
done:
    json_decref(gen);
    json_decref(outer);
    return rc;
}

kn_code kn_config_load(const char *dir, kn_model_config *out, kn_error *err) {
    char path[4096], gpath[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
    char *text = NULL, *gen = NULL;
    size_t len = 0, glen = 0;
    kn_code rc = kn_read_file(path, 64u << 20, &text, &len, err);
    if (rc) return rc;
    if (kn_read_file(gpath, 16u << 20, &gen, &glen, NULL) != KN_OK) gen = NULL;
    rc = kn_config_parse(text, len, gen, glen, path, out, err);
    free(text);
    free(gen);
    return rc;
}

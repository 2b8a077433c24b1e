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

#include "io/file_util.h"

static const char *const arch_names[KN_ARCH_COUNT] = {
    [KN_ARCH_LLAMA] = "llama", [KN_ARCH_MISTRAL] = "mistral", [KN_ARCH_QWEN2] = "qwen2",
    [KN_ARCH_QWEN3] = "qwen3", [KN_ARCH_PHI3] = "phi3",
};

const char *kn_arch_name(kn_arch a) { return (unsigned)a < KN_ARCH_COUNT ? arch_names[a] : "?"; }

const char *kn_supported_model_types(void) { return "llama, mistral, qwen2, qwen3, phi3"; }

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

static int parse_rope(cfg_ctx *c, json_t *root, kn_model_config *cfg) {
    kn_rope_config *r = &cfg->rope;
    /* transformers 5 writes rope_parameters {rope_type, rope_theta, ...};
     * published checkpoints write rope_theta + rope_scaling {type|rope_type}. */
    json_t *rs = json_object_get(root, "rope_parameters");
    if (!rs || json_is_null(rs)) rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs) && !json_is_object(rs)) {
        c->code = kn_fail(c->err, KN_ERR_FORMAT, "%s: rope scaling must be an object", c->where);
        return -1;
    }
    if (rs && json_is_null(rs)) rs = NULL;
    double theta_top;
    if (get_num(c, root, "rope_theta", 10000.0, &theta_top)) return -1;
    r->theta = theta_top;
    if (rs && get_num(c, rs, "rope_theta", theta_top, &r->theta)) return -1;
    if (get_num(c, root, "partial_rotary_factor", 1.0, &r->partial_rotary_factor)) return -1;
    if (rs && get_num(c, rs, "partial_rotary_factor", r->partial_rotary_factor, &r->partial_rotary_factor))
        return -1;
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
    else {
        c->code = kn_fail(c->err, KN_ERR_UNSUPPORTED,
                          "%s: rope type \"%s\" is not supported (supported: default, linear, dynamic, llama3, "
                          "yarn, longrope)", c->where, ts);
        return -1;
    }
    if (get_num(c, rs, "factor", 1.0, &r->factor)) return -1;
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
    case KN_ARCH_PHI3: window_all = cfg->sliding_window > 0; break;
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

kn_code kn_config_parse(const char *json, size_t len, const char *gen_json, size_t gen_len,
                        const char *where, kn_model_config *cfg, kn_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg_ctx c = {.where = where, .err = err, .code = KN_ERR_FORMAT};
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root) return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", where, jerr.line, jerr.text);
    json_t *gen = NULL;
    kn_code rc = KN_ERR_FORMAT;
    if (!json_is_object(root)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: top level must be a JSON object", where);
        goto done;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: missing \"model_type\" (supported: %s)", where,
                     kn_supported_model_types());
        goto done;
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
    /* multimodal wrappers keep the language model under text_config */
    if (require_positive(&c, root, "vocab_size", &cfg->vocab_size) ||
        require_positive(&c, root, "hidden_size", &cfg->hidden_size) ||
        require_positive(&c, root, "intermediate_size", &cfg->intermediate_size) ||
        require_positive(&c, root, "num_hidden_layers", &cfg->n_layers) ||
        require_positive(&c, root, "num_attention_heads", &cfg->n_heads))
        goto fail;
    if (get_int(&c, root, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads)) goto fail;
    if (get_int(&c, root, "head_dim", cfg->hidden_size / cfg->n_heads, &cfg->head_dim)) goto fail;
    if (cfg->arch == KN_ARCH_PHI3) cfg->head_dim = cfg->hidden_size / cfg->n_heads; /* phi3 has no head_dim */
    if (get_int(&c, root, "max_position_embeddings", 4096, &cfg->max_position_embeddings)) goto fail;
    if (get_num(&c, root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps)) goto fail;
    if (cfg->arch == KN_ARCH_PHI3 && !json_object_get(root, "rms_norm_eps")) cfg->rms_norm_eps = 1e-5;
    if (get_bool(&c, root, "tie_word_embeddings", cfg->arch == KN_ARCH_QWEN3 ? 1 : 0, &cfg->tie_word_embeddings))
        goto fail;
    if (get_bool(&c, root, "attention_bias", cfg->arch == KN_ARCH_QWEN2, &cfg->attention_bias)) goto fail;
    if (get_bool(&c, root, "mlp_bias", 0, &cfg->mlp_bias)) goto fail;
    if (get_int(&c, root, "sliding_window", 0, &cfg->sliding_window)) goto fail;
    if (cfg->sliding_window < 0) cfg->sliding_window = 0;
    if (cfg->n_layers > KN_MAX_LAYERS) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: %d layers exceeds the supported %d", where, cfg->n_layers,
                     KN_MAX_LAYERS);
        goto done;
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
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported for %s (expected silu)", where,
                     act, mt);
        goto done;
    }
    cfg->qk_norm = cfg->arch == KN_ARCH_QWEN3;
    cfg->fused_qkv = cfg->fused_gate_up = cfg->arch == KN_ARCH_PHI3;
    if (parse_rope(&c, root, cfg)) goto fail;
    /* transformers' llama-style default rope ignores partial_rotary_factor;
     * phi3's default and every scaled rope type honour it */
    if (cfg->arch != KN_ARCH_PHI3 && cfg->rope.type == KN_ROPE_DEFAULT) cfg->rope.partial_rotary_factor = 1.0;
    int rot = (int)(cfg->head_dim * cfg->rope.partial_rotary_factor);
    if (rot <= 0 || rot > cfg->head_dim || rot % 2) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: partial_rotary_factor %g gives rotary dim %d for head_dim %d", where,
                     cfg->rope.partial_rotary_factor, rot, cfg->head_dim);
        goto done;
    }
    if (parse_layer_windows(&c, root, cfg)) goto fail;
    const char *td = json_string_value(json_object_get(root, "torch_dtype"));
    if (!td) td = json_string_value(json_object_get(root, "dtype"));
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", td ? td : "");

    cfg->bos_token_id = -1;
    if (get_int(&c, root, "bos_token_id", -1, &cfg->bos_token_id) || get_eos(&c, root, cfg)) goto fail;
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
    json_decref(root);
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

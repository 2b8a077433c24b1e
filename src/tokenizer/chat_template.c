/* chat_template.c — load a model's chat template and render it with the
 * variables transformers' apply_chat_template passes: messages, tools (None
 * when absent), documents (None), add_generation_prompt, the special tokens
 * tokenizer_config.json defines (bos/eos/unk/sep/pad/cls/mask_token, as
 * special_tokens_map), and chat_template_kwargs (which may override them, as
 * transformers' template kwargs do).
 *
 * Owns: the compiled template (jtmpl arena) and copies of the special tokens. Renders
 * share nothing mutable, so one template may render on many threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_internal.h"

#define KN_TEMPLATE_CONFIG_MAX (64u << 20)

const jlimits kn_jinja_default_limits = {
    .max_source = 1u << 20,       /* real templates are < 20 KB */
    .max_output = 64u << 20,      /* far above any context window */
    .max_arena = 512u << 20,      /* values of one render */
    .max_ops = 200000000ull,      /* ~ seconds of work, not hours */
    .max_loop = 10000000ull,
    .max_depth = 400,
    .max_parse_depth = 200,
};

/* The special tokens apply_chat_template passes to the template
 * (tokenizer.special_tokens_map): only those the tokenizer defines. */
static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};
#define N_SPECIAL (sizeof special_names / sizeof *special_names)

struct kn_chat_template {
    jtmpl t;
    char *special[N_SPECIAL]; /* NULL when the tokenizer has none */
};

kn_code kn_chat_template_compile(const char *source, size_t len, const char *name, kn_chat_template **out,
                                 kn_error *err) {
    *out = NULL;
    if (!source) return kn_fail(err, KN_ERR_INVALID_ARG, "chat template: no source");
    kn_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return kn_fail(err, KN_ERR_NOMEM, "chat template: out of memory");
    ct->t.arena.limit = 256u << 20;
    char msg[512];
    if (kn_jinja_parse(&ct->t, source, len, name ? name : "chat_template", &kn_jinja_default_limits, msg, sizeof msg)) {
        kn_chat_template_free(ct);
        return kn_fail(err, KN_ERR_FORMAT, "chat template syntax error: %s", msg);
    }
    *out = ct;
    return KN_OK;
}

void kn_chat_template_free(kn_chat_template *t) {
    if (!t) return;
    jarena_free(&t->t.arena);
    for (size_t i = 0; i < N_SPECIAL; i++) free(t->special[i]);
    free(t);
}

/* A special token in tokenizer_config.json: a string or {"content": ...}. */
static char *token_string(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    return strdup(json_string_value(v));
}

static kn_code pick_template(const json_t *ct, const char *variant, const char **src, kn_error *err) {
    if (json_is_string(ct)) {
        if (variant && strcmp(variant, "default"))
            return kn_fail(err, KN_ERR_NOT_FOUND, "chat template \"%s\" not found (the model has one template)", variant);
        *src = json_string_value(ct);
        return KN_OK;
    }
    if (!json_is_array(ct)) return kn_fail(err, KN_ERR_FORMAT, "tokenizer_config.json: chat_template is neither a string nor a list");
    const char *want = variant ? variant : "default";
    char names[256] = "";
    size_t i;
    json_t *it;
    json_array_foreach(ct, i, it) {
        const char *nm = json_string_value(json_object_get(it, "name"));
        const char *tp = json_string_value(json_object_get(it, "template"));
        if (!nm || !tp) return kn_fail(err, KN_ERR_FORMAT, "tokenizer_config.json: chat_template[%zu] needs name and template strings", i);
        if (!strcmp(nm, want)) {
            *src = tp;
            return KN_OK;
        }
        if (strlen(names) + strlen(nm) + 3 < sizeof names) {
            if (names[0]) strcat(names, ", ");
            strcat(names, nm);
        }
    }
    if (!variant) return kn_fail(err, KN_ERR_NOT_FOUND, "the model has several chat templates (%s) and none is named \"default\"", names);
    return kn_fail(err, KN_ERR_NOT_FOUND, "chat template \"%s\" not found (available: %s)", variant, names);
}

kn_code kn_chat_template_load(const char *dir, const char *variant, kn_chat_template **out, kn_error *err) {
    *out = NULL;
    char path[4096];
    char *cfg_text = NULL, *jinja = NULL;
    size_t cfg_len = 0, jinja_len = 0;
    json_t *cfg = NULL;
    kn_code rc = KN_OK;

    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (kn_is_file(path)) {
        if ((rc = kn_read_file(path, KN_TEMPLATE_CONFIG_MAX, &cfg_text, &cfg_len, err))) return rc;
        json_error_t je;
        /* real configs carry integers beyond 64 bits ("model_max_length": 1e30 written out) */
        cfg = json_loadb(cfg_text, cfg_len, JSON_DECODE_INT_AS_REAL, &je);
        free(cfg_text);
        if (!cfg || !json_is_object(cfg)) {
            json_decref(cfg);
            return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
        }
    }

    const char *src = NULL;
    size_t src_len = 0;
    char name[64] = "chat_template.jinja";
    if (variant && strcmp(variant, "default")) {
        snprintf(path, sizeof path, "%s/additional_chat_templates/%s.jinja", dir, variant);
        if (kn_is_file(path)) snprintf(name, sizeof name, "%.40s.jinja", variant);
    } else {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    }
    if (kn_is_file(path)) {
        if ((rc = kn_read_file(path, kn_jinja_default_limits.max_source, &jinja, &jinja_len, err))) goto done;
        src = jinja;
        src_len = jinja_len;
    } else {
        const json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
        json_t *ctj = NULL;
        if (!ct || json_is_null(ct)) {
            /* processors keep it in chat_template.json */
            snprintf(path, sizeof path, "%s/chat_template.json", dir);
            if (kn_is_file(path)) {
                json_error_t je;
                ctj = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
                ct = ctj ? json_object_get(ctj, "chat_template") : NULL;
            }
        }
        if (!ct || json_is_null(ct)) {
            json_decref(ctj);
            rc = kn_fail(err, KN_ERR_NOT_FOUND, "%s has no chat template (no chat_template.jinja, no \"chat_template\" in tokenizer_config.json)", dir);
            goto done;
        }
        rc = pick_template(ct, variant, &src, err);
        if (!rc) {
            jinja = strdup(src);
            src = jinja;
            src_len = jinja ? strlen(jinja) : 0;
            if (!jinja) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        json_decref(ctj);
        snprintf(name, sizeof name, "chat_template");
        if (rc) goto done;
    }
    if ((rc = kn_chat_template_compile(src, src_len, name, out, err))) goto done;
    if (cfg)
        for (size_t i = 0; i < N_SPECIAL; i++) (*out)->special[i] = token_string(json_object_get(cfg, special_names[i]));
done:
    free(jinja);
    json_decref(cfg);
    return rc;
}

/* JSON -> template values (arena-owned). */
static int from_json(jctx *c, const json_t *j, jv *out, int depth) {
    if (depth > 256) return jfail(c, "input JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return 0;
    case JSON_TRUE: *out = jv_bool(1); return 0;
    case JSON_FALSE: *out = jv_bool(0); return 0;
    case JSON_INTEGER: *out = jv_int(json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_STRING: *out = jv_str(c, json_string_value(j), json_string_length(j)); return c->failed ? -1 : 0;
    case JSON_ARRAY: {
        jlist *l = jlist_new(c, json_array_size(j));
        if (!l) return -1;
        for (size_t i = 0; i < json_array_size(j); i++)
            if (from_json(c, json_array_get(j, i), &l->v[l->n++], depth + 1)) return -1;
        out->t = JV_LIST;
        out->l = l;
        return 0;
    }
    case JSON_OBJECT: {
        jdict *d = jdict_new(c, json_object_size(j));
        if (!d) return -1;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            jv kv = jv_cstr(c, k), vv;
            if (c->failed || from_json(c, v, &vv, depth + 1)) return -1;
            /* keys are unique in a JSON object as jansson keeps it: append directly */
            if (d->n == d->cap) {
                if (jdict_set(c, d, kv, vv)) return -1;
            } else {
                d->k[d->n] = kv;
                d->v[d->n] = vv;
                d->n++;
            }
        }
        out->t = JV_DICT;
        out->d = d;
        return 0;
    }
    }
    return jfail(c, "unsupported JSON value");
}

static int set_var(jctx *c, jdict *vars, const char *name, jv v) {
    jv k = jv_cstr(c, name);
    if (c->failed) return -1;
    return jdict_set(c, vars, k, v);
}

kn_code kn_chat_template_render(const kn_chat_template *t, const json_t *messages, const json_t *tools,
                                int add_generation_prompt, const json_t *kwargs, char **out, size_t *len,
                                kn_error *err) {
    return kn_chat_template_render_limited(t, messages, tools, add_generation_prompt, kwargs, &kn_jinja_default_limits,
                                           out, len, err);
}

kn_code kn_chat_template_render_limited(const kn_chat_template *t, const json_t *messages, const json_t *tools,
                                        int add_generation_prompt, const json_t *kwargs, const jlimits *lim, char **out,
                                        size_t *len, kn_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!t) return kn_fail(err, KN_ERR_INVALID_ARG, "chat template: none loaded");
    if (!json_is_array(messages)) return kn_fail(err, KN_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
    if (tools && !json_is_array(tools) && !json_is_null(tools))
        return kn_fail(err, KN_ERR_INVALID_ARG, "chat template: tools must be a JSON array");
    if (kwargs && !json_is_object(kwargs) && !json_is_null(kwargs))
        return kn_fail(err, KN_ERR_INVALID_ARG, "chat template: template kwargs must be a JSON object");
    if (json_is_object(kwargs)) {
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt", NULL};
        for (int i = 0; reserved[i]; i++)
            if (json_object_get(kwargs, reserved[i]))
                return kn_fail(err, KN_ERR_INVALID_ARG, "chat template kwargs may not set \"%s\"", reserved[i]);
    }

    jctx *c = calloc(1, sizeof *c);
    if (!c) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    c->t = &t->t;
    c->lim = lim;
    c->arena.limit = c->lim->max_arena;
    jbuf outb = {0};
    kn_code rc = KN_OK;
    jdict *vars = jdict_new(c, 8);
    jv v;
    if (!vars || from_json(c, messages, &v, 0) || set_var(c, vars, "messages", v)) goto fail;
    if (tools && json_is_array(tools)) {
        if (from_json(c, tools, &v, 0) || set_var(c, vars, "tools", v)) goto fail;
    } else if (set_var(c, vars, "tools", jv_none())) {
        goto fail;
    }
    if (set_var(c, vars, "documents", jv_none()) || set_var(c, vars, "add_generation_prompt", jv_bool(add_generation_prompt)))
        goto fail;
    for (size_t i = 0; i < N_SPECIAL; i++)
        if (t->special[i] && set_var(c, vars, special_names[i], jv_cstr(c, t->special[i]))) goto fail;
    if (json_is_object(kwargs)) {
        const char *k;
        json_t *kv;
        json_object_foreach((json_t *)kwargs, k, kv) {
            if (from_json(c, kv, &v, 0) || set_var(c, vars, k, v)) goto fail;
        }
    }
    if (kn_jinja_render(&t->t, c->lim, c, vars, &outb)) goto fail;
    if (!outb.p) {
        outb.p = malloc(1);
        if (!outb.p) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        outb.p[0] = 0;
    }
    *out = outb.p;
    if (len) *len = outb.n;
    outb.p = NULL;
    goto done;
fail:
    if (!c->failed) jfail(c, "rendering failed");
    rc = kn_fail(err, c->raised ? KN_ERR_INVALID_ARG : KN_ERR_FORMAT, "%s%s", c->raised ? "chat template raised an exception: " : "chat template error: ", c->err);
done:
    free(outb.p);
    jarena_free(&c->arena);
    free(c);
    return rc;
}

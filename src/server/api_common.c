/* api_common.c — what the OpenAI and Anthropic mappings share: error bodies,
 * ids, the sampling fields of a request (validated, with defaults from
 * generation_config.json), and chat rendering (template + tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "models/model.h"
#include "server/server_internal.h"

void kn_api_error_reply(const kn_api_error *e, int anthropic, kn_api_reply *out) {
    json_t *j;
    if (anthropic)
        j = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", e->type, "message", e->msg);
    else
        j = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type", e->type, "param",
                      e->param[0] ? json_string(e->param) : json_null(), "code",
                      e->status == 429 ? json_string("rate_limit_exceeded") : json_null());
    out->status = e->status;
    out->stream = NULL;
    kn_buf_json(&out->body, j);
    json_decref(j);
}

void kn_api_new_id(char *out, size_t n, const char *prefix) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)rand();
    int k = snprintf(out, n, "%s", prefix);
    for (size_t i = 0; i < sizeof r && (size_t)k + 2 < n; i++) k += snprintf(out + k, n - (size_t)k, "%02x", r[i]);
}

static int bad(kn_api_error *e, const char *param, const char *msg) {
    return kn_api_fail(e, 400, "invalid_request_error", param, "%s", msg);
}

int kn_api_sampling(kn_srv *s, json_t *req, kn_gen_job *job, int anthropic, kn_api_error *e) {
    char m[KN_ERRMSG];
    kn_gen_params *p = &job->gp;
    kn_gen_params_init(p, s->model);
    double v;
    long long iv;
    /* temperature: OpenAI 0..2, Anthropic 0..1 */
    v = p->s.temperature;
    if (kn_json_get_num(req, "temperature", 0, anthropic ? 1 : 2, &v, m)) return bad(e, "temperature", m);
    if (json_object_get(req, "temperature") && !json_is_null(json_object_get(req, "temperature"))) {
        p->s.temperature = (float)v;
        if (!s->model->cfg.gen_do_sample) /* generation_config's top_k/top_p only apply with do_sample */
            p->s.top_k = 0, p->s.top_p = 1.0f;
    }
    v = p->s.top_p;
    if (kn_json_get_num(req, "top_p", 0, 1, &v, m)) return bad(e, "top_p", m);
    p->s.top_p = v <= 0 ? 1.0f : (float)v;
    iv = p->s.top_k;
    if (kn_json_get_int(req, "top_k", -1, 1000000, &iv, m)) return bad(e, "top_k", m);
    p->s.top_k = iv < 0 ? 0 : (int)iv;
    v = p->s.min_p;
    if (kn_json_get_num(req, "min_p", 0, 1, &v, m)) return bad(e, "min_p", m);
    p->s.min_p = (float)v;
    /* seed: any 64-bit integer; random when absent */
    json_t *seed = json_object_get(req, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return bad(e, "seed", "'seed' must be an integer");
        p->s.seed = (uint64_t)json_integer_value(seed);
    } else {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)rand();
        p->s.seed = r;
    }
    if (!anthropic) {
        v = 0;
        if (kn_json_get_num(req, "presence_penalty", -2, 2, &v, m)) return bad(e, "presence_penalty", m);
        p->presence_penalty = (float)v;
        v = 0;
        if (kn_json_get_num(req, "frequency_penalty", -2, 2, &v, m)) return bad(e, "frequency_penalty", m);
        p->frequency_penalty = (float)v;
        v = 1;
        if (kn_json_get_num(req, "repetition_penalty", 0.01, 10, &v, m)) return bad(e, "repetition_penalty", m);
        p->repetition_penalty = (float)v;
        int ig = 0;
        if (kn_json_get_bool(req, "ignore_eos", &ig, m)) return bad(e, "ignore_eos", m);
        p->s.ignore_eos = ig;
        json_t *lb = json_object_get(req, "logit_bias");
        if (lb && !json_is_null(lb)) {
            if (!json_is_object(lb)) return bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
            size_t n = json_object_size(lb);
            if (n > 1024) return bad(e, "logit_bias", "'logit_bias' has more than 1024 entries");
            static __thread int32_t ids[1024];
            static __thread float vals[1024];
            const char *k;
            json_t *bv;
            int i = 0;
            json_object_foreach(lb, k, bv) {
                char *end;
                long id = strtol(k, &end, 10);
                if (!*k || *end || id < 0 || id >= s->model->cfg.vocab_size)
                    return kn_api_fail(e, 400, "invalid_request_error", "logit_bias",
                                       "'logit_bias' key '%.32s' is not a token id in 0..%d", k,
                                       s->model->cfg.vocab_size - 1);
                if (!json_is_number(bv) || json_number_value(bv) < -100 || json_number_value(bv) > 100)
                    return bad(e, "logit_bias", "'logit_bias' values must be numbers between -100 and 100");
                ids[i] = (int32_t)id, vals[i] = (float)json_number_value(bv), i++;
            }
            p->n_logit_bias = i, p->logit_bias_ids = ids, p->logit_bias_values = vals;
        }
        json_t *sti = json_object_get(req, "stop_token_ids");
        if (sti && !json_is_null(sti)) {
            if (!json_is_array(sti) || json_array_size(sti) > KN_MAX_STOP_IDS)
                return bad(e, "stop_token_ids", "'stop_token_ids' must be an array of at most 16 token ids");
            for (size_t i = 0; i < json_array_size(sti); i++) {
                json_t *x = json_array_get(sti, i);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->model->cfg.vocab_size)
                    return bad(e, "stop_token_ids", "'stop_token_ids' entries must be token ids of this model");
                p->stop_ids[p->n_stop_ids++] = (int32_t)json_integer_value(x);
            }
        }
    }
    /* stop strings: OpenAI "stop" (string or array), Anthropic "stop_sequences" (array) */
    const char *skey = anthropic ? "stop_sequences" : "stop";
    json_t *st = json_object_get(req, skey);
    job->n_stops = 0;
    if (st && !json_is_null(st)) {
        if (json_is_string(st) && !anthropic) {
            job->stops[job->n_stops++] = json_string_value(st);
        } else if (json_is_array(st)) {
            if (json_array_size(st) > KN_MAX_STOP_STRINGS)
                return kn_api_fail(e, 400, "invalid_request_error", skey, "'%s' has more than %d entries", skey,
                                   KN_MAX_STOP_STRINGS);
            for (size_t i = 0; i < json_array_size(st); i++) {
                json_t *x = json_array_get(st, i);
                if (!json_is_string(x) || json_string_length(x) > 1024)
                    return kn_api_fail(e, 400, "invalid_request_error", skey,
                                       "'%s' entries must be strings of at most 1024 bytes", skey);
                job->stops[job->n_stops++] = json_string_value(x);
            }
        } else {
            return kn_api_fail(e, 400, "invalid_request_error", skey, "'%s' must be %s", skey,
                               anthropic ? "an array of strings" : "a string or an array of strings");
        }
    }
    return 0;
}

/* The prompt ends inside an open <think> block (the template opened it). */
static int ends_in_think(const char *t, size_t n) {
    while (n && (t[n - 1] == '\n' || t[n - 1] == ' ')) n--;
    return n >= 7 && !memcmp(t + n - 7, "<think>", 7);
}

int kn_api_render_chat(kn_srv *s, json_t *messages, json_t *tools, json_t *kwargs, int32_t **prompt, int *n_prompt,
                       int *start_reasoning, kn_api_error *e) {
    *prompt = NULL, *n_prompt = 0, *start_reasoning = 0;
    if (!s->tok || !s->tmpl)
        return kn_api_fail(e, 400, "invalid_request_error", "messages",
                           "this model has no %s, so chat requests cannot be served",
                           !s->tok ? "tokenizer.json" : "chat template");
    char *text = NULL;
    size_t len = 0;
    kn_error err = {0};
    if (kn_chat_template_render(s->tmpl, messages, tools, 1, kwargs, &text, &len, &err))
        return kn_api_fail(e, 400, "invalid_request_error", "messages", "chat template: %s", err.msg);
    *start_reasoning = ends_in_think(text, len);
    kn_code rc = kn_tokenizer_encode(s->tok, text, len, 0, prompt, n_prompt, &err);
    free(text);
    if (rc) return kn_api_fail(e, 400, "invalid_request_error", "messages", "tokenizer: %s", err.msg);
    return 0;
}

int kn_api_force_tool_call(kn_srv *s, kn_gen_job *job, const char *name, kn_api_error *e) {
    if (!s->tok || kn_tokenizer_token_id(s->tok, "<tool_call>") < 0)
        return kn_api_fail(e, 400, "invalid_request_error", "tool_choice",
                           "forcing a tool call needs the <tool_call> format, which this model's tokenizer lacks; "
                           "use tool_choice \"auto\"");
    kn_buf text = {0}, body = {0};
    if (job->start_reasoning) kn_buf_puts(&text, "</think>\n\n"); /* close the open think block first */
    kn_buf_puts(&text, "<tool_call>\n");
    if (name) {
        json_t *js = json_string(name);
        char *quoted = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        if (!quoted) {
            kn_buf_free(&text);
            return kn_api_fail(e, 400, "invalid_request_error", "tool_choice", "invalid function name");
        }
        kn_buf_printf(&body, "{\"name\": %s, \"arguments\": ", quoted);
        free(quoted);
    }
    kn_buf_puts(&body, "");
    kn_buf_add(&text, body.data ? body.data : "", body.len);
    int32_t *ids = NULL;
    int n = 0;
    kn_error err = {0};
    kn_code rc = kn_tokenizer_encode(s->tok, text.data, text.len, 0, &ids, &n, &err);
    int32_t *all = rc ? NULL : realloc(job->prompt, (size_t)(job->n_prompt + n) * sizeof *all);
    if (!all || text.oom || body.oom) {
        free(ids), kn_buf_free(&text), kn_buf_free(&body);
        return kn_api_fail(e, 500, "server_error", NULL, "cannot encode the forced tool call: %s", err.msg);
    }
    memcpy(all + job->n_prompt, ids, (size_t)n * sizeof *ids);
    job->prompt = all, job->n_prompt += n;
    job->start_reasoning = 0;
    free(job->start_tool_body);
    job->start_tool_body = strdup(body.data ? body.data : "");
    free(ids), kn_buf_free(&text), kn_buf_free(&body);
    return job->start_tool_body ? 0 : kn_api_fail(e, 500, "server_error", NULL, "out of memory");
}

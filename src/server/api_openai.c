/* api_openai.c — POST /v1/completions and /v1/chat/completions: request
 * validation into a kn_gen_job, and the response bodies / SSE chunks in the
 * shapes the official OpenAI clients parse (usage with
 * prompt_tokens_details.cached_tokens, logprobs, tool_calls,
 * reasoning_content, stream_options.include_usage, "data: [DONE]"). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/model.h"
#include "server/server_internal.h"

static const char *const COMPLETION_KEYS[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs", "echo",
    "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "seed", "suffix", "user", "top_k",
    "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", NULL};

static const char *const CHAT_KEYS[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "seed", "tools", "tool_choice", "parallel_tool_calls", "user", "response_format", "top_k", "min_p",
    "repetition_penalty", "chat_template_kwargs", "enable_thinking", "store", "metadata", "ignore_eos",
    "stop_token_ids", "service_tier", "reasoning_effort", NULL};

typedef struct {
    kn_stream base;
    kn_srv *srv;
    kn_gen_run g;
    kn_gen_job job;
    int chat, include_usage, sent_role, n_tool_calls, logprobs, top_logprobs, finished_sent;
    char id[64];
    long created;
    json_t *tool_names; /* the request's tools (array, may be NULL) */
    char *echo;         /* completions echo, sent before the first token */
    size_t text_offset; /* completions logprobs text_offset */
} oai_stream;

/* ---- shared request fields ---------------------------------------------- */

static int common_fields(kn_srv *s, json_t *req, kn_gen_job *job, int chat, int *stream, int *include_usage,
                         kn_api_error *e) {
    char m[KN_ERRMSG];
    if (kn_json_check_keys(req, chat ? CHAT_KEYS : COMPLETION_KEYS, NULL, m))
        return kn_api_fail(e, 400, "invalid_request_error", NULL, "%s", m);
    const char *model = NULL;
    if (kn_json_get_str(req, "model", 256, &model, m)) return kn_api_fail(e, 400, "invalid_request_error", "model", "%s", m);
    long long n = 1;
    if (kn_json_get_int(req, "n", 1, 1, &n, m))
        return kn_api_fail(e, 400, "invalid_request_error", "n", "only n = 1 is supported");
    if (!chat && kn_json_get_int(req, "best_of", 1, 1, &n, m))
        return kn_api_fail(e, 400, "invalid_request_error", "best_of", "only best_of = 1 is supported");
    *stream = 0, *include_usage = 0;
    if (kn_json_get_bool(req, "stream", stream, m)) return kn_api_fail(e, 400, "invalid_request_error", "stream", "%s", m);
    json_t *so = json_object_get(req, "stream_options");
    if (so && !json_is_null(so)) {
        static const char *const so_keys[] = {"include_usage", "continuous_usage_stats", NULL};
        if (!json_is_object(so) || kn_json_check_keys(so, so_keys, "stream_options", m) ||
            kn_json_get_bool(so, "include_usage", include_usage, m))
            return kn_api_fail(e, 400, "invalid_request_error", "stream_options", "%s",
                               json_is_object(so) ? m : "'stream_options' must be an object");
    }
    if (kn_api_sampling(s, req, job, 0, e)) return -1;
    long long mt = -1;
    const char *mt_key = chat && json_object_get(req, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (kn_json_get_int(req, mt_key, 1, 1 << 30, &mt, m)) return kn_api_fail(e, 400, "invalid_request_error", mt_key, "%s", m);
    job->gp.s.max_new_tokens = (int)mt; /* -1: fill the context once the prompt length is known */
    job->max_tokens_given = mt > 0;
    return 0;
}

/* max_tokens absent: whatever the context leaves after the prompt */
static int fix_max_tokens(kn_srv *s, kn_gen_job *job, kn_api_error *e) {
    int room = s->model->max_context - job->n_prompt;
    if (room < 1)
        return kn_api_fail(e, 400, "invalid_request_error", "messages",
                           "the prompt has %d tokens; this model's context is %d tokens", job->n_prompt,
                           s->model->max_context);
    if (!job->max_tokens_given) job->gp.s.max_new_tokens = room;
    return 0;
}

/* ---- logprobs ----------------------------------------------------------- */

static char *token_text(kn_srv *s, int32_t id) {
    char *t = NULL;
    size_t n;
    kn_error err;
    if (!s->tok || kn_tokenizer_decode(s->tok, &id, 1, 0, &t, &n, &err)) {
        char buf[32];
        snprintf(buf, sizeof buf, "token_id:%d", id);
        return strdup(buf);
    }
    return t;
}

static json_t *bytes_of(const char *t) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

/* chat: {"token", "logprob", "bytes", "top_logprobs": [...]} per token */
static json_t *chat_logprobs(kn_srv *s, const kn_token_event *ev, int n, int top) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        char *t = token_text(s, ev[i].token);
        json_t *tops = json_array();
        for (int k = 0; k < ev[i].n_top && k < top; k++) {
            char *tt = token_text(s, ev[i].top_ids[k]);
            json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token", kn_json_text(tt, strlen(tt)), "logprob",
                                                  (double)ev[i].top_logprobs[k], "bytes", bytes_of(tt)));
            free(tt);
        }
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", kn_json_text(t, strlen(t)),
                                                 "logprob", (double)ev[i].logprob, "bytes", bytes_of(t),
                                                 "top_logprobs", tops));
        free(t);
    }
    return json_pack("{s:o}", "content", content);
}

/* legacy completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static json_t *completion_logprobs(kn_srv *s, const kn_token_event *ev, int n, size_t *offset) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        char *t = token_text(s, ev[i].token);
        json_array_append_new(toks, kn_json_text(t, strlen(t)));
        json_array_append_new(lps, json_real(ev[i].logprob));
        json_t *o = json_object();
        for (int k = 0; k < ev[i].n_top; k++) {
            char *tt = token_text(s, ev[i].top_ids[k]);
            json_object_set_new(o, tt, json_real(ev[i].top_logprobs[k]));
            free(tt);
        }
        json_array_append_new(tops, o);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += strlen(t);
        free(t);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *usage_json(int prompt, int completion, int cached) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt, "completion_tokens", completion,
                     "total_tokens", prompt + completion, "prompt_tokens_details", "cached_tokens", cached);
}

/* ---- tool calls ----------------------------------------------------------- */

static json_t *tool_call_json(const char *body, int index, int streaming) {
    char *name, *args;
    if (kn_parse_tool_call(body, strlen(body), &name, &args)) return NULL;
    char id[48];
    kn_api_new_id(id, sizeof id, "call_");
    json_t *tc = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                           "arguments", args);
    if (streaming) json_object_set_new(tc, "index", json_integer(index));
    free(name), free(args);
    return tc;
}

/* Llama 3 style: the whole content is {"name": ..., "parameters": {...}} naming a given tool */
static json_t *llama3_tool_call(const char *content, json_t *tools) {
    if (!tools || !content) return NULL;
    const char *p = content;
    while (*p == ' ' || *p == '\n') p++;
    if (*p != '{') return NULL;
    char *name, *args;
    if (kn_parse_tool_call(p, strlen(p), &name, &args)) return NULL;
    int known = 0;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        const char *tn = json_string_value(json_object_get(f, "name"));
        known |= tn && !strcmp(tn, name);
    }
    json_t *tc = NULL;
    if (known) {
        char id[48];
        kn_api_new_id(id, sizeof id, "call_");
        tc = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                       "arguments", args);
    }
    free(name), free(args);
    return tc;
}

/* ---- chat request → job ---------------------------------------------------- */

/* content: string | null | [{"type":"text","text":...}] -> string (new ref) */
static int flatten_content(json_t *c, const char *where, json_t **out, kn_api_error *e) {
    if (!c || json_is_null(c)) return *out = json_string(""), 0;
    if (json_is_string(c)) return *out = json_incref(c), 0;
    if (!json_is_array(c))
        return kn_api_fail(e, 400, "invalid_request_error", where, "'%s' must be a string or an array of parts", where);
    kn_buf b = {0};
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *part = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(text)) {
            kn_buf_free(&b);
            return kn_api_fail(e, 400, "invalid_request_error", where,
                               "only text content parts are supported (got '%.32s')", type ? type : "?");
        }
        kn_buf_add(&b, json_string_value(text), json_string_length(text));
    }
    *out = kn_json_text(b.data ? b.data : "", b.len);
    kn_buf_free(&b);
    return 0;
}

/* OpenAI messages -> template messages (new ref): content flattened to a
 * string, developer -> system, tool_calls' arguments parsed into objects. */
static json_t *convert_messages(json_t *msgs, kn_api_error *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        kn_api_fail(e, 400, "invalid_request_error", "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    if (json_array_size(msgs) > 4096) {
        kn_api_fail(e, 400, "invalid_request_error", "messages", "'messages' has more than 4096 entries");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *content = NULL;
        char where[64];
        snprintf(where, sizeof where, "messages[%zu]", i);
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        if (!role || (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") &&
                      strcmp(role, "assistant") && strcmp(role, "tool"))) {
            kn_api_fail(e, 400, "invalid_request_error", where,
                        "%s.role must be one of system, developer, user, assistant, tool", where);
            goto fail;
        }
        snprintf(where, sizeof where, "messages[%zu].content", i);
        if (flatten_content(json_object_get(m, "content"), where, &content, e)) goto fail;
        json_t *nm = json_pack("{s:s, s:o}", "role", strcmp(role, "developer") ? role : "system", "content", content);
        json_t *tcid = json_object_get(m, "tool_call_id"), *name = json_object_get(m, "name"),
               *rc = json_object_get(m, "reasoning_content"), *tcs = json_object_get(m, "tool_calls");
        if (json_is_string(tcid)) json_object_set(nm, "tool_call_id", tcid);
        if (json_is_string(name)) json_object_set(nm, "name", name);
        if (json_is_string(rc)) json_object_set(nm, "reasoning_content", rc);
        if (tcs && !json_is_null(tcs)) {
            if (!json_is_array(tcs)) {
                json_decref(nm);
                kn_api_fail(e, 400, "invalid_request_error", where, "messages[%zu].tool_calls must be an array", i);
                goto fail;
            }
            json_t *ntcs = json_array();
            for (size_t k = 0; k < json_array_size(tcs); k++) {
                json_t *tc = json_array_get(tcs, k), *fn = json_object_get(tc, "function");
                const char *fname = json_string_value(json_object_get(fn, "name"));
                json_t *args = json_object_get(fn, "arguments");
                if (!fname) {
                    json_decref(ntcs), json_decref(nm);
                    kn_api_fail(e, 400, "invalid_request_error", where,
                                "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
                    goto fail;
                }
                json_t *pargs = NULL;
                if (json_is_string(args)) pargs = json_loads(json_string_value(args), 0, NULL);
                if (!pargs) pargs = args ? json_incref(args) : json_object();
                json_t *ntc = json_pack("{s:s, s:{s:s, s:o}}", "type", "function", "function", "name", fname,
                                        "arguments", pargs);
                json_t *id = json_object_get(tc, "id");
                if (json_is_string(id)) json_object_set(ntc, "id", id);
                json_array_append_new(ntcs, ntc);
            }
            json_object_set_new(nm, "tool_calls", ntcs);
        }
        json_array_append_new(out, nm);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static int check_tools(json_t *tools, kn_api_error *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools) || json_array_size(tools) > 512)
        return kn_api_fail(e, 400, "invalid_request_error", "tools", "'tools' must be an array (at most 512)");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            return kn_api_fail(e, 400, "invalid_request_error", "tools",
                               "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
    }
    return 0;
}

/* ---- streaming ------------------------------------------------------------ */

static json_t *chunk_base(oai_stream *st) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", st->id, "object", st->chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)st->created, "model", st->srv->model_name);
}

static void emit_chat_delta(oai_stream *st, kn_buf *out, json_t *delta, const char *finish, json_t *logprobs) {
    json_t *c = chunk_base(st);
    json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    kn_buf_sse(out, NULL, c);
}

static int oai_next(kn_stream *base, kn_buf *out, int fd) {
    oai_stream *st = (oai_stream *)base;
    if (st->finished_sent) return 0;
    if (st->echo) {
        json_t *c = chunk_base(st);
        json_object_set_new(c, "choices", json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "text",
                                                    kn_json_text(st->echo, strlen(st->echo)), "logprobs",
                                                    "finish_reason"));
        kn_buf_sse(out, NULL, c);
        free(st->echo);
        st->echo = NULL;
        return 1;
    }
    int more = kn_gen_pull(&st->g, fd);
    kn_gen_run *g = &st->g;
    if (st->chat) {
        if (!st->sent_role) {
            emit_chat_delta(st, out, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL);
            st->sent_role = 1;
        }
        json_t *lp = st->logprobs && g->n_events ? chat_logprobs(st->srv, g->events, g->n_events, st->top_logprobs)
                                                 : NULL;
        if (g->reasoning.len)
            emit_chat_delta(st, out, json_pack("{s:o}", "reasoning_content", kn_json_text(g->reasoning.data, g->reasoning.len)),
                            NULL, NULL);
        if (g->content.len || lp)
            emit_chat_delta(st, out, json_pack("{s:o}", "content", kn_json_text(g->content.data ? g->content.data : "", g->content.len)),
                            NULL, lp);
        for (int i = 0; i < g->n_tool_bodies; i++) {
            json_t *tc = tool_call_json(g->tool_bodies[i], st->n_tool_calls, 1);
            if (tc) {
                st->n_tool_calls++;
                emit_chat_delta(st, out, json_pack("{s:[o]}", "tool_calls", tc), NULL, NULL);
            } else { /* not a valid call: show the text */
                kn_buf t = {0};
                kn_buf_printf(&t, "<tool_call>\n%s\n</tool_call>", g->tool_bodies[i]);
                emit_chat_delta(st, out, json_pack("{s:o}", "content", kn_json_text(t.data, t.len)), NULL, NULL);
                kn_buf_free(&t);
            }
        }
    } else if (g->content.len || (st->logprobs && g->n_events) || (!st->srv->tok && g->n_events)) {
        json_t *c = chunk_base(st);
        json_t *lp = st->logprobs ? completion_logprobs(st->srv, g->events, g->n_events, &st->text_offset) : json_null();
        json_t *choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text",
                                   kn_json_text(g->content.data ? g->content.data : "", g->content.len), "logprobs", lp,
                                   "finish_reason");
        if (!st->srv->tok) { /* no tokenizer: the ids are the output (kiln extension) */
            json_t *ids = json_array();
            for (int i = 0; i < g->n_events; i++) json_array_append_new(ids, json_integer(g->events[i].token));
            json_object_set_new(choice, "token_ids", ids);
        }
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        kn_buf_sse(out, NULL, c);
    }
    if (more) return 1;
    if (g->finish == KN_FINISH_CANCELLED && !g->stopped_by_string) { /* client gone or shutdown */
        st->finished_sent = 1;
        return 0;
    }
    if (g->finish == KN_FINISH_ERROR) {
        json_t *err = json_pack("{s:{s:s, s:s}}", "error", "message", g->error, "type", "server_error");
        kn_buf_sse(out, NULL, err);
    } else {
        const char *fr = kn_gen_finish_reason(g, st->n_tool_calls);
        if (st->chat) emit_chat_delta(st, out, json_object(), fr, NULL);
        else {
            json_t *c = chunk_base(st);
            json_object_set_new(c, "choices",
                                json_pack("[{s:i, s:s, s:n, s:s}]", "index", 0, "text", "", "logprobs", "finish_reason", fr));
            kn_buf_sse(out, NULL, c);
        }
        if (st->include_usage) {
            json_t *c = chunk_base(st);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_json(st->job.n_prompt, g->n_generated, kn_request_cached_tokens(g->req)));
            kn_buf_sse(out, NULL, c);
        }
    }
    kn_buf_puts(out, "data: [DONE]\n\n");
    st->finished_sent = 1;
    return 0;
}

static void oai_free(kn_stream *base) {
    oai_stream *st = (oai_stream *)base;
    kn_gen_free(&st->g);
    free(st->job.prompt);
    free(st->job.start_tool_body);
    free(st->echo);
    json_decref(st->tool_names);
    free(st);
}

/* ---- non-streaming --------------------------------------------------------- */

/* Run to the end, collecting everything. */
static void run_all(kn_gen_run *g, int fd, kn_buf *content, kn_buf *reasoning, char ***tools, int *n_tools,
                    kn_token_event **evs, int *n_evs) {
    int more;
    do {
        more = kn_gen_pull(g, fd);
        kn_buf_add(content, g->content.data ? g->content.data : "", g->content.len);
        kn_buf_add(reasoning, g->reasoning.data ? g->reasoning.data : "", g->reasoning.len);
        for (int i = 0; i < g->n_tool_bodies; i++) {
            char **nt = realloc(*tools, (size_t)(*n_tools + 1) * sizeof *nt);
            if (!nt) break;
            *tools = nt;
            (*tools)[(*n_tools)++] = g->tool_bodies[i];
            g->tool_bodies[i] = NULL;
        }
        g->n_tool_bodies = 0;
        if (g->n_events) {
            kn_token_event *ne = realloc(*evs, (size_t)(*n_evs + g->n_events) * sizeof *ne);
            if (ne) {
                memcpy(ne + *n_evs, g->events, (size_t)g->n_events * sizeof *ne);
                *evs = ne, *n_evs += g->n_events;
            }
        }
    } while (more);
}

static void handle(kn_srv *s, json_t *req, kn_api_reply *out, int chat) {
    kn_api_error e = {0};
    oai_stream *st = calloc(1, sizeof *st);
    if (!st) {
        kn_api_fail(&e, 500, "server_error", NULL, "out of memory");
        kn_api_error_reply(&e, 0, out);
        return;
    }
    st->srv = s, st->chat = chat;
    st->base.next = oai_next, st->base.free = oai_free;
    st->created = (long)time(NULL);
    kn_api_new_id(st->id, sizeof st->id, chat ? "chatcmpl-" : "cmpl-");
    kn_gen_job *job = &st->job;
    int stream = 0;
    char m[KN_ERRMSG];
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    char *echo_text = NULL;
    if (common_fields(s, req, job, chat, &stream, &st->include_usage, &e)) goto fail;
    if (chat) {
        int lp = 0;
        long long top = 0;
        if (kn_json_get_bool(req, "logprobs", &lp, m) || kn_json_get_int(req, "top_logprobs", 0, 20, &top, m)) {
            kn_api_fail(&e, 400, "invalid_request_error", "logprobs", "%s", m);
            goto fail;
        }
        st->logprobs = lp, st->top_logprobs = lp ? (int)top : 0;
        json_t *rf = json_object_get(req, "response_format");
        const char *rft = json_string_value(json_object_get(rf, "type"));
        if (rf && !json_is_null(rf) && (!rft || strcmp(rft, "text"))) {
            kn_api_fail(&e, 400, "invalid_request_error", "response_format",
                        "only response_format {\"type\": \"text\"} is supported");
            goto fail;
        }
        tools = json_object_get(req, "tools");
        if (json_is_null(tools)) tools = NULL;
        if (check_tools(tools, &e)) goto fail;
        json_t *tc = json_object_get(req, "tool_choice");
        int parse = tools && json_array_size(tools) > 0;
        if (tc && !json_is_null(tc)) {
            const char *tcs = json_string_value(tc);
            if (tcs && !strcmp(tcs, "none")) parse = 0;
            else if (!(tcs && (!strcmp(tcs, "auto") || !strcmp(tcs, "required"))) &&
                     !(json_is_object(tc) && json_is_string(json_object_get(json_object_get(tc, "function"), "name")))) {
                kn_api_fail(&e, 400, "invalid_request_error", "tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
                goto fail;
            }
        }
        job->parse_tools = parse;
        job->chat = 1;
        const char *force = NULL; /* "" = any tool, else the function name */
        if (parse && json_is_string(tc) && !strcmp(json_string_value(tc), "required")) force = "";
        else if (parse && json_is_object(tc)) force = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        st->tool_names = tools ? json_incref(tools) : NULL;
        json_t *ctk = json_object_get(req, "chat_template_kwargs");
        if (ctk && !json_is_null(ctk) && !json_is_object(ctk)) {
            kn_api_fail(&e, 400, "invalid_request_error", "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            goto fail;
        }
        kwargs = ctk && json_is_object(ctk) ? json_deep_copy(ctk) : json_object();
        int et = -1;
        json_t *etj = json_object_get(req, "enable_thinking");
        if (etj && !json_is_null(etj)) {
            if (kn_json_get_bool(req, "enable_thinking", &et, m)) {
                kn_api_fail(&e, 400, "invalid_request_error", "enable_thinking", "%s", m);
                goto fail;
            }
            json_object_set_new(kwargs, "enable_thinking", json_boolean(et));
        }
        messages = convert_messages(json_object_get(req, "messages"), &e);
        if (!messages) goto fail;
        if (kn_api_render_chat(s, messages, tools, kwargs, &job->prompt, &job->n_prompt, &job->start_reasoning, &e))
            goto fail;
        if (s->think_id < 0) job->start_reasoning = 0;
        if (force && kn_api_force_tool_call(s, job, force[0] ? force : NULL, &e)) goto fail;
    } else {
        json_t *lp = json_object_get(req, "logprobs");
        long long nlp = -1;
        if (lp && !json_is_null(lp) && kn_json_get_int(req, "logprobs", 0, 20, &nlp, m)) {
            kn_api_fail(&e, 400, "invalid_request_error", "logprobs", "%s", m);
            goto fail;
        }
        st->logprobs = nlp >= 0, st->top_logprobs = nlp > 0 ? (int)nlp : 0;
        json_t *sfx = json_object_get(req, "suffix");
        if (sfx && !json_is_null(sfx)) {
            kn_api_fail(&e, 400, "invalid_request_error", "suffix", "'suffix' is not supported");
            goto fail;
        }
        if (kn_json_get_bool(req, "echo", &job->echo_prompt, m)) {
            kn_api_fail(&e, 400, "invalid_request_error", "echo", "%s", m);
            goto fail;
        }
        json_t *p = json_object_get(req, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 &&
            (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
            p = json_array_get(p, 0); /* a batch of one */
        if (json_is_string(p)) {
            if (!s->tok) {
                kn_api_fail(&e, 400, "invalid_request_error", "prompt",
                            "this model has no tokenizer.json: send the prompt as an array of token ids");
                goto fail;
            }
            kn_error err = {0};
            if (kn_tokenizer_encode(s->tok, json_string_value(p), json_string_length(p), 1, &job->prompt,
                                    &job->n_prompt, &err)) {
                kn_api_fail(&e, 400, "invalid_request_error", "prompt", "%s", err.msg);
                goto fail;
            }
            if (job->echo_prompt) echo_text = strndup(json_string_value(p), json_string_length(p));
        } else if (json_is_array(p) && json_array_size(p) > 0 && json_array_size(p) <= (size_t)s->model->max_context &&
                   json_is_integer(json_array_get(p, 0))) {
            job->n_prompt = (int)json_array_size(p);
            job->prompt = malloc((size_t)job->n_prompt * sizeof *job->prompt);
            if (!job->prompt) {
                kn_api_fail(&e, 500, "server_error", NULL, "out of memory");
                goto fail;
            }
            for (int i = 0; i < job->n_prompt; i++) {
                json_t *x = json_array_get(p, (size_t)i);
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) >= s->model->cfg.vocab_size) {
                    kn_api_fail(&e, 400, "invalid_request_error", "prompt",
                                "prompt[%d] must be a token id in 0..%d", i, s->model->cfg.vocab_size - 1);
                    goto fail;
                }
                job->prompt[i] = (int32_t)json_integer_value(x);
            }
            if (job->echo_prompt && s->tok) {
                size_t n;
                kn_error err;
                kn_tokenizer_decode(s->tok, job->prompt, job->n_prompt, 0, &echo_text, &n, &err);
            }
        } else {
            kn_api_fail(&e, 400, "invalid_request_error", "prompt",
                        json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0))
                            ? "only one prompt per request is supported"
                            : "'prompt' must be a non-empty string or an array of token ids (within the context)");
            goto fail;
        }
    }
    if (fix_max_tokens(s, job, &e)) goto fail;
    job->gp.logprobs = st->logprobs;
    job->gp.top_logprobs = st->top_logprobs;
    if (kn_gen_start(s, job, &st->g, &e)) goto fail;
    json_decref(messages), json_decref(kwargs);
    messages = kwargs = NULL;
    if (stream) {
        st->echo = echo_text; /* sent as the first chunk */
        if (echo_text) st->text_offset = strlen(echo_text);
        out->stream = &st->base;
        return;
    }
    /* non-streaming */
    kn_buf content = {0}, reasoning = {0};
    char **tool_bodies = NULL;
    int n_tools = 0, n_evs = 0;
    kn_token_event *evs = NULL;
    run_all(&st->g, out->conn_fd, &content, &reasoning, &tool_bodies, &n_tools, &evs, &n_evs);
    kn_gen_run *g = &st->g;
    if (g->finish == KN_FINISH_ERROR || (g->finish == KN_FINISH_CANCELLED && !g->stopped_by_string)) {
        kn_api_fail(&e, g->finish == KN_FINISH_ERROR ? 500 : 503, "server_error", NULL, "%s",
                    g->finish == KN_FINISH_ERROR ? g->error : "the request was cancelled");
        kn_api_error_reply(&e, 0, out);
    } else {
        json_t *choice;
        int n_calls = 0;
        if (chat) {
            json_t *msg = json_pack("{s:s}", "role", "assistant");
            json_t *calls = json_array();
            for (int i = 0; i < n_tools; i++) {
                json_t *tc = tool_call_json(tool_bodies[i], i, 0);
                if (tc) json_array_append_new(calls, tc);
                else kn_buf_printf(&content, "<tool_call>\n%s\n</tool_call>", tool_bodies[i]);
            }
            if (json_array_size(calls) == 0 && job->parse_tools) {
                json_t *tc = llama3_tool_call(content.data, st->tool_names);
                if (tc) json_array_append_new(calls, tc), content.len = 0;
            }
            n_calls = (int)json_array_size(calls);
            json_object_set_new(msg, "content", content.len || !n_calls ? kn_json_text(content.data ? content.data : "", content.len)
                                                                        : json_null());
            if (reasoning.len) json_object_set_new(msg, "reasoning_content", kn_json_text(reasoning.data, reasoning.len));
            if (n_calls) json_object_set_new(msg, "tool_calls", calls);
            else json_decref(calls);
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs",
                               st->logprobs ? chat_logprobs(s, evs, n_evs, st->top_logprobs) : json_null(),
                               "finish_reason", kn_gen_finish_reason(g, n_calls));
        } else {
            kn_buf text = {0};
            if (echo_text) kn_buf_puts(&text, echo_text);
            kn_buf_add(&text, content.data ? content.data : "", content.len);
            size_t off = echo_text ? strlen(echo_text) : 0;
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", kn_json_text(text.data ? text.data : "", text.len),
                               "logprobs", st->logprobs ? completion_logprobs(s, evs, n_evs, &off) : json_null(),
                               "finish_reason", kn_gen_finish_reason(g, 0));
            if (!s->tok) { /* no tokenizer: the ids are the only output (kiln extension) */
                json_t *ids = json_array();
                for (int i = 0; i < g->n_all; i++) json_array_append_new(ids, json_integer(g->all_ids[i]));
                json_object_set_new(choice, "token_ids", ids);
            }
            kn_buf_free(&text);
        }
        json_t *resp = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", st->id, "object",
                                 chat ? "chat.completion" : "text_completion", "created", (json_int_t)st->created,
                                 "model", s->model_name, "choices", choice, "usage",
                                 usage_json(job->n_prompt, g->n_generated, kn_request_cached_tokens(g->req)));
        out->status = 200;
        kn_buf_json(&out->body, resp);
        json_decref(resp);
    }
    kn_buf_free(&content), kn_buf_free(&reasoning);
    for (int i = 0; i < n_tools; i++) free(tool_bodies[i]);
    free(tool_bodies), free(evs), free(echo_text);
    oai_free(&st->base);
    return;
fail:
    json_decref(messages), json_decref(kwargs);
    free(echo_text);
    kn_api_error_reply(&e, 0, out);
    oai_free(&st->base);
}

void kn_api_completions(kn_srv *s, json_t *req, kn_api_reply *out) { handle(s, req, out, 0); }
void kn_api_chat(kn_srv *s, json_t *req, kn_api_reply *out) { handle(s, req, out, 1); }

/* api_anthropic.c — POST /v1/messages (Anthropic Messages API).
 *
 * Requests map onto the chat template like OpenAI chat: system (string or
 * text blocks) first; user text blocks -> user messages; tool_result blocks
 * -> role "tool" messages; assistant text / tool_use / thinking blocks ->
 * content / tool_calls / reasoning_content; tools' input_schema ->
 * function parameters; thinking {type: enabled|disabled} -> enable_thinking.
 *
 * Streaming follows Anthropic's event sequence exactly:
 *   message_start, then per content block: content_block_start,
 *   content_block_delta* (thinking_delta | text_delta | input_json_delta),
 *   content_block_stop; then message_delta (stop_reason, usage) and
 *   message_stop. Blocks are opened lazily when their first text arrives and
 *   closed when another kind starts, so indexes are dense and ordered. */
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "server/server_internal.h"

static const char *const MESSAGES_KEYS[] = {"model", "messages", "max_tokens", "system", "temperature", "top_p",
                                            "top_k", "stop_sequences", "stream", "tools", "tool_choice", "metadata",
                                            "thinking", "service_tier", "container", "mcp_servers", NULL};

enum { BLK_NONE, BLK_THINKING, BLK_TEXT };

typedef struct {
    kn_stream base;
    kn_srv *srv;
    kn_gen_run g;
    kn_gen_job job;
    char id[64];
    int started, open_kind, n_blocks, n_tool_uses, done;
} ant_stream;

static int text_of_blocks(json_t *c, const char *where, kn_buf *out, kn_api_error *e) {
    if (json_is_string(c)) return kn_buf_add(out, json_string_value(c), json_string_length(c)), 0;
    if (!json_is_array(c)) return kn_api_fail(e, 400, "invalid_request_error", where, "%s must be a string or an array of blocks", where);
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *b = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t))
            return kn_api_fail(e, 400, "invalid_request_error", where, "%s: only text blocks are supported here", where);
        kn_buf_add(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

/* Anthropic messages -> template messages (new ref) */
static json_t *convert(json_t *req, kn_api_error *e) {
    json_t *out = json_array();
    json_t *sys = json_object_get(req, "system");
    if (sys && !json_is_null(sys)) {
        kn_buf b = {0};
        if (text_of_blocks(sys, "system", &b, e)) goto fail_b;
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", kn_json_text(b.data ? b.data : "", b.len)));
        kn_buf_free(&b);
        goto msgs;
    fail_b:
        kn_buf_free(&b);
        goto fail;
    }
msgs:;
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > 4096) {
        kn_api_fail(e, 400, "invalid_request_error", "messages", "messages: must be a non-empty array (at most 4096)");
        goto fail;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        char where[64];
        snprintf(where, sizeof where, "messages.%zu", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            kn_api_fail(e, 400, "invalid_request_error", where, "%s.role: must be \"user\" or \"assistant\"", where);
            goto fail;
        }
        json_t *c = json_object_get(m, "content");
        int assistant = !strcmp(role, "assistant");
        if (json_is_string(c)) {
            json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", c));
            continue;
        }
        if (!json_is_array(c)) {
            kn_api_fail(e, 400, "invalid_request_error", where, "%s.content: must be a string or an array of blocks", where);
            goto fail;
        }
        kn_buf text = {0}, thinking = {0};
        json_t *calls = json_array();
        int bad = 0;
        for (size_t k = 0; k < json_array_size(c) && !bad; k++) {
            json_t *b = json_array_get(c, k);
            const char *type = json_string_value(json_object_get(b, "type"));
            if (!type) bad = 1;
            else if (!strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
                json_t *t = json_object_get(b, "text");
                kn_buf_add(&text, json_string_value(t), json_string_length(t));
            } else if (assistant && !strcmp(type, "thinking") && json_is_string(json_object_get(b, "thinking"))) {
                json_t *t = json_object_get(b, "thinking");
                kn_buf_add(&thinking, json_string_value(t), json_string_length(t));
            } else if (assistant && !strcmp(type, "redacted_thinking")) {
                /* nothing to render */
            } else if (assistant && !strcmp(type, "tool_use") && json_is_string(json_object_get(b, "name"))) {
                json_t *input = json_object_get(b, "input");
                json_t *tc = json_pack("{s:s, s:{s:O, s:O}}", "type", "function", "function", "name",
                                       json_object_get(b, "name"), "arguments", input ? input : json_object());
                if (json_is_string(json_object_get(b, "id"))) json_object_set(tc, "id", json_object_get(b, "id"));
                json_array_append_new(calls, tc);
            } else if (!assistant && !strcmp(type, "tool_result")) {
                /* flush pending user text first, keeping order */
                if (text.len) {
                    json_array_append_new(out, json_pack("{s:s, s:o}", "role", "user", "content", kn_json_text(text.data, text.len)));
                    text.len = 0;
                }
                kn_buf r = {0};
                json_t *rc = json_object_get(b, "content");
                if (rc && !json_is_null(rc) && text_of_blocks(rc, where, &r, e)) {
                    kn_buf_free(&r);
                    bad = 2;
                    break;
                }
                json_t *tm = json_pack("{s:s, s:o}", "role", "tool", "content", kn_json_text(r.data ? r.data : "", r.len));
                if (json_is_string(json_object_get(b, "tool_use_id")))
                    json_object_set(tm, "tool_call_id", json_object_get(b, "tool_use_id"));
                json_array_append_new(out, tm);
                kn_buf_free(&r);
            } else bad = 1;
            if (bad == 1)
                kn_api_fail(e, 400, "invalid_request_error", where, "%s.content.%zu: unsupported block type '%.32s' for role %s",
                            where, k, type ? type : "?", role);
        }
        if (!bad && (text.len || thinking.len || json_array_size(calls) || !json_array_size(c))) {
            json_t *nm = json_pack("{s:s, s:o}", "role", role, "content", kn_json_text(text.data ? text.data : "", text.len));
            if (thinking.len) json_object_set_new(nm, "reasoning_content", kn_json_text(thinking.data, thinking.len));
            if (json_array_size(calls)) json_object_set(nm, "tool_calls", calls);
            json_array_append_new(out, nm);
        }
        json_decref(calls);
        kn_buf_free(&text), kn_buf_free(&thinking);
        if (bad) goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static json_t *convert_tools(json_t *tools, kn_api_error *e) {
    if (!tools || json_is_null(tools)) return NULL;
    if (!json_is_array(tools) || json_array_size(tools) > 512) {
        kn_api_fail(e, 400, "invalid_request_error", "tools", "tools: must be an array (at most 512)");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);
        json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema"),
               *desc = json_object_get(t, "description");
        if (!json_is_string(name) || (schema && !json_is_object(schema))) {
            json_decref(out);
            kn_api_fail(e, 400, "invalid_request_error", "tools", "tools.%zu: needs a string 'name' and an object 'input_schema'", i);
            return NULL;
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        if (json_is_string(desc)) json_object_set(fn, "description", desc);
        json_object_set(fn, "parameters", schema ? schema : json_object());
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return out;
}

static const char *stop_reason(const kn_gen_run *g, int n_tool_uses) {
    if (g->stopped_by_string) return "stop_sequence";
    if (g->finish == KN_FINISH_LENGTH) return "max_tokens";
    return n_tool_uses ? "tool_use" : "end_turn";
}

static json_t *stop_sequence(const ant_stream *st) {
    if (!st->g.stopped_by_string) return json_null();
    return json_string(st->job.stops[st->g.stop.matched]);
}

/* tool_use block from a tool-call body (new ref), NULL if not valid JSON */
static json_t *tool_use_block(const char *body, char **input_json) {
    char *name, *args;
    if (kn_parse_tool_call(body, strlen(body), &name, &args)) return NULL;
    json_t *input = json_loads(args, 0, NULL);
    if (!json_is_object(input)) {
        json_decref(input);
        input = json_object();
    }
    char id[48];
    kn_api_new_id(id, sizeof id, "toolu_");
    json_t *b = json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", name, "input", input);
    if (input_json) *input_json = args;
    else free(args);
    free(name);
    return b;
}

/* ---- streaming ---------------------------------------------------------- */

static void sse(kn_buf *out, const char *event, json_t *j) { kn_buf_sse(out, event, j); }

static void close_block(ant_stream *st, kn_buf *out) {
    if (st->open_kind == BLK_NONE) return;
    if (st->open_kind == BLK_THINKING)
        sse(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                                  st->n_blocks - 1, "delta", "type", "signature_delta", "signature", ""));
    sse(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->n_blocks - 1));
    st->open_kind = BLK_NONE;
}

static void add_delta(ant_stream *st, kn_buf *out, int kind, const char *t, size_t n) {
    if (!n) return;
    if (st->open_kind != kind) {
        close_block(st, out);
        json_t *cb = kind == BLK_TEXT ? json_pack("{s:s, s:s}", "type", "text", "text", "")
                                      : json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
        sse(out, "content_block_start",
            json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->n_blocks, "content_block", cb));
        st->n_blocks++;
        st->open_kind = kind;
    }
    json_t *d = kind == BLK_TEXT ? json_pack("{s:s, s:o}", "type", "text_delta", "text", kn_json_text(t, n))
                                 : json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", kn_json_text(t, n));
    sse(out, "content_block_delta",
        json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", st->n_blocks - 1, "delta", d));
}

static int ant_next(kn_stream *base, kn_buf *out, int fd) {
    ant_stream *st = (ant_stream *)base;
    if (st->done) return 0;
    if (!st->started) {
        json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i, s:i, s:i}}", "id", st->id, "type",
                                "message", "role", "assistant", "model", st->srv->model_name, "content", "stop_reason",
                                "stop_sequence", "usage", "input_tokens", st->job.n_prompt, "output_tokens", 0,
                                "cache_read_input_tokens", 0, "cache_creation_input_tokens", 0);
        sse(out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
        sse(out, "ping", json_pack("{s:s}", "type", "ping"));
        st->started = 1;
        return 1;
    }
    kn_gen_run *g = &st->g;
    int more = kn_gen_pull(g, fd);
    add_delta(st, out, BLK_THINKING, g->reasoning.data, g->reasoning.len);
    add_delta(st, out, BLK_TEXT, g->content.data, g->content.len);
    for (int i = 0; i < g->n_tool_bodies; i++) {
        char *input_json = NULL;
        json_t *b = tool_use_block(g->tool_bodies[i], &input_json);
        if (!b) {
            kn_buf t = {0};
            kn_buf_printf(&t, "<tool_call>\n%s\n</tool_call>", g->tool_bodies[i]);
            add_delta(st, out, BLK_TEXT, t.data, t.len);
            kn_buf_free(&t);
            continue;
        }
        close_block(st, out);
        json_object_set_new(b, "input", json_object()); /* the input arrives as input_json_delta */
        sse(out, "content_block_start",
            json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->n_blocks, "content_block", b));
        sse(out, "content_block_delta",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", st->n_blocks, "delta", "type",
                      "input_json_delta", "partial_json", input_json));
        sse(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->n_blocks));
        st->n_blocks++, st->n_tool_uses++;
        free(input_json);
    }
    if (more) return 1;
    st->done = 1;
    if (g->finish == KN_FINISH_CANCELLED && !g->stopped_by_string) return 0;
    if (g->finish == KN_FINISH_ERROR) {
        sse(out, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", "api_error", "message", g->error));
        return 0;
    }
    close_block(st, out);
    sse(out, "message_delta",
        json_pack("{s:s, s:{s:s, s:o}, s:{s:i}}", "type", "message_delta", "delta", "stop_reason",
                  stop_reason(g, st->n_tool_uses), "stop_sequence", stop_sequence(st), "usage", "output_tokens",
                  g->n_generated));
    sse(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    return 0;
}

static void ant_free(kn_stream *base) {
    ant_stream *st = (ant_stream *)base;
    kn_gen_free(&st->g);
    free(st->job.prompt);
    free(st->job.start_tool_body);
    free(st);
}

void kn_api_messages(kn_srv *s, json_t *req, kn_api_reply *out) {
    kn_api_error e = {0};
    char m[KN_ERRMSG];
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    ant_stream *st = calloc(1, sizeof *st);
    if (!st) {
        kn_api_fail(&e, 500, "api_error", NULL, "out of memory");
        kn_api_error_reply(&e, 1, out);
        return;
    }
    st->srv = s;
    st->base.next = ant_next, st->base.free = ant_free;
    kn_api_new_id(st->id, sizeof st->id, "msg_");
    kn_gen_job *job = &st->job;
    int stream = 0;
    long long max_tokens = 0;
    const char *model = NULL;
    if (kn_json_check_keys(req, MESSAGES_KEYS, NULL, m)) {
        kn_api_fail(&e, 400, "invalid_request_error", NULL, "%s", m);
        goto fail;
    }
    if (kn_json_get_str(req, "model", 256, &model, m) || kn_json_get_bool(req, "stream", &stream, m) ||
        kn_json_get_int(req, "max_tokens", 1, 1 << 30, &max_tokens, m)) {
        kn_api_fail(&e, 400, "invalid_request_error", NULL, "%s", m);
        goto fail;
    }
    if (!model || !max_tokens) {
        kn_api_fail(&e, 400, "invalid_request_error", NULL, "%s: field required", !model ? "model" : "max_tokens");
        goto fail;
    }
    if (kn_api_sampling(s, req, job, 1, &e)) goto fail;
    job->gp.s.max_new_tokens = (int)max_tokens;
    tools = convert_tools(json_object_get(req, "tools"), &e);
    if (!tools && e.status) goto fail;
    json_t *tc = json_object_get(req, "tool_choice");
    const char *tct = json_string_value(json_object_get(tc, "type"));
    if (tc && !json_is_null(tc) && (!tct || (strcmp(tct, "auto") && strcmp(tct, "any") && strcmp(tct, "tool") && strcmp(tct, "none")))) {
        kn_api_fail(&e, 400, "invalid_request_error", "tool_choice", "tool_choice.type: must be auto, any, tool or none");
        goto fail;
    }
    job->parse_tools = tools && json_array_size(tools) && !(tct && !strcmp(tct, "none"));
    job->chat = 1;
    kwargs = json_object();
    json_t *th = json_object_get(req, "thinking");
    if (th && !json_is_null(th)) {
        const char *tt = json_string_value(json_object_get(th, "type"));
        if (!tt || (strcmp(tt, "enabled") && strcmp(tt, "disabled"))) {
            kn_api_fail(&e, 400, "invalid_request_error", "thinking", "thinking.type: must be \"enabled\" or \"disabled\"");
            goto fail;
        }
        json_object_set_new(kwargs, "enable_thinking", json_boolean(!strcmp(tt, "enabled")));
    }
    messages = convert(req, &e);
    if (!messages) goto fail;
    if (kn_api_render_chat(s, messages, tools, kwargs, &job->prompt, &job->n_prompt, &job->start_reasoning, &e)) goto fail;
    if (s->think_id < 0) job->start_reasoning = 0;
    if (job->parse_tools && tct && (!strcmp(tct, "any") || !strcmp(tct, "tool"))) {
        const char *name = !strcmp(tct, "tool") ? json_string_value(json_object_get(tc, "name")) : NULL;
        if (!strcmp(tct, "tool") && !name) {
            kn_api_fail(&e, 400, "invalid_request_error", "tool_choice", "tool_choice.name: required for type \"tool\"");
            goto fail;
        }
        if (kn_api_force_tool_call(s, job, name, &e)) goto fail;
    }
    if ((int64_t)job->n_prompt + job->gp.s.max_new_tokens > s->model->max_context) {
        kn_api_fail(&e, 400, "invalid_request_error", "max_tokens",
                    "prompt (%d tokens) + max_tokens (%d) exceed this model's context of %d tokens", job->n_prompt,
                    job->gp.s.max_new_tokens, s->model->max_context);
        goto fail;
    }
    if (kn_gen_start(s, job, &st->g, &e)) {
        if (e.status == 429) snprintf(e.type, sizeof e.type, "rate_limit_error");
        else if (e.status >= 500) snprintf(e.type, sizeof e.type, "overloaded_error");
        goto fail;
    }
    json_decref(messages), json_decref(tools), json_decref(kwargs);
    if (stream) {
        out->stream = &st->base;
        return;
    }
    /* non-streaming: collect blocks in order */
    json_t *content = json_array();
    kn_buf text = {0}, thinking = {0};
    kn_gen_run *g = &st->g;
    int more;
    do {
        more = kn_gen_pull(g, out->conn_fd);
        kn_buf_add(&thinking, g->reasoning.data ? g->reasoning.data : "", g->reasoning.len);
        kn_buf_add(&text, g->content.data ? g->content.data : "", g->content.len);
        for (int i = 0; i < g->n_tool_bodies; i++) {
            json_t *b = tool_use_block(g->tool_bodies[i], NULL);
            if (b) {
                if (text.len) { /* text before a tool call is its own block */
                    json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text", kn_json_text(text.data, text.len)));
                    text.len = 0;
                }
                json_array_append_new(content, b);
                st->n_tool_uses++;
            } else {
                kn_buf_printf(&text, "<tool_call>\n%s\n</tool_call>", g->tool_bodies[i]);
            }
        }
    } while (more);
    if (g->finish == KN_FINISH_ERROR || (g->finish == KN_FINISH_CANCELLED && !g->stopped_by_string)) {
        kn_api_fail(&e, g->finish == KN_FINISH_ERROR ? 500 : 503, "api_error", NULL, "%s",
                    g->finish == KN_FINISH_ERROR ? g->error : "the request was cancelled");
        json_decref(content);
        kn_buf_free(&text), kn_buf_free(&thinking);
        kn_api_error_reply(&e, 1, out);
        ant_free(&st->base);
        return;
    }
    if (text.len) json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text", kn_json_text(text.data, text.len)));
    if (thinking.len)
        json_array_insert_new(content, 0, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                     kn_json_text(thinking.data, thinking.len), "signature", ""));
    json_t *resp = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:{s:i, s:i, s:i, s:i}}", "id", st->id, "type",
                             "message", "role", "assistant", "model", s->model_name, "content", content, "stop_reason",
                             stop_reason(g, st->n_tool_uses), "stop_sequence", stop_sequence(st), "usage",
                             "input_tokens", job->n_prompt, "output_tokens", g->n_generated, "cache_read_input_tokens",
                             kn_request_cached_tokens(g->req), "cache_creation_input_tokens", 0);
    out->status = 200;
    kn_buf_json(&out->body, resp);
    json_decref(resp);
    kn_buf_free(&text), kn_buf_free(&thinking);
    ant_free(&st->base);
    return;
fail:
    json_decref(messages), json_decref(tools), json_decref(kwargs);
    if (!e.status) kn_api_fail(&e, 400, "invalid_request_error", NULL, "invalid request");
    kn_api_error_reply(&e, 1, out);
    ant_free(&st->base);
}

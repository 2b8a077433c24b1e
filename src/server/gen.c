/* gen.c — one generation as the protocol layers see it: submit to the
 * engine, then pull token events and turn them into text deltas
 * (detokenizer stream -> stop-string matcher -> think/tool-call splitter).
 * A stop string cancels the engine request; a closed client connection
 * cancels it too. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "server/server_internal.h"

int kn_api_fail(kn_api_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int kn_gen_start(kn_srv *s, const kn_gen_job *job, kn_gen_run *g, kn_api_error *e) {
    memset(g, 0, sizeof *g);
    g->srv = s;
    g->chat = job->chat;
    kn_error err = {0};
    if (kn_stop_match_init(&g->stop, job->stops, job->n_stops, &err))
        return kn_api_fail(e, 400, "invalid_request_error", "stop", "%s", err.msg);
    if (s->tok && kn_detok_stream_new(s->tok, 1, &g->detok, &err)) {
        kn_stop_match_free(&g->stop);
        return kn_api_fail(e, 500, "server_error", NULL, "%s", err.msg);
    }
    kn_chat_split_init(&g->split, job->chat, job->parse_tools, job->start_reasoning);
    if (job->chat && job->start_tool_body) { /* the prompt ends inside a forced <tool_call> */
        g->split.mode = KN_SEG_TOOL_CALL;
        g->split.at_start = 0;
        kn_buf_puts(&g->split.tool, job->start_tool_body);
    }
    kn_submit_result r = kn_engine_submit(s->engine, job->prompt, job->n_prompt, &job->gp, &g->req, &err);
    if (r != KN_SUBMIT_OK) {
        kn_gen_free(g);
        if (r == KN_SUBMIT_QUEUE_FULL) return kn_api_fail(e, 429, "rate_limit_error", NULL, "%s", err.msg);
        if (r == KN_SUBMIT_SHUTDOWN) return kn_api_fail(e, 503, "server_error", NULL, "%s", err.msg);
        return kn_api_fail(e, 400, "invalid_request_error", r == KN_SUBMIT_TOO_LONG ? "max_tokens" : "prompt", "%s",
                           err.msg);
    }
    return 0;
}

void kn_gen_free(kn_gen_run *g) {
    if (g->req) kn_request_release(g->req);
    if (g->detok) kn_detok_stream_free(g->detok);
    kn_stop_match_free(&g->stop);
    kn_chat_split_free(&g->split);
    kn_buf_free(&g->content), kn_buf_free(&g->reasoning);
    for (int i = 0; i < g->n_tool_bodies; i++) free(g->tool_bodies[i]);
    free(g->tool_bodies), free(g->events), free(g->all_ids);
    memset(g, 0, sizeof *g);
}

static void on_segment(kn_seg_kind kind, const char *text, size_t len, void *user) {
    kn_gen_run *g = user;
    if (kind == KN_SEG_CONTENT) kn_buf_add(&g->content, text, len);
    else if (kind == KN_SEG_REASONING) kn_buf_add(&g->reasoning, text, len);
    else {
        if (g->n_tool_bodies == g->cap_tool_bodies) {
            int cap = g->cap_tool_bodies ? g->cap_tool_bodies * 2 : 4;
            char **nb = realloc(g->tool_bodies, (size_t)cap * sizeof *nb);
            if (!nb) return;
            g->tool_bodies = nb, g->cap_tool_bodies = cap;
        }
        char *b = strndup(text, len);
        if (b) g->tool_bodies[g->n_tool_bodies++] = b;
    }
}

/* text that passed the stop matcher */
static void emit_text(kn_gen_run *g, const char *t, size_t n) {
    if (!n) return;
    if (g->chat) kn_chat_split_push(&g->split, t, n, on_segment, g);
    else kn_buf_add(&g->content, t, n);
}

static void feed_text(kn_gen_run *g, const char *t, size_t n) {
    if (g->stopped_by_string) return;
    const char *em;
    size_t el;
    int stopped = 0;
    kn_error err;
    if (kn_stop_match_push(&g->stop, t, n, &em, &el, &stopped, &err)) return;
    emit_text(g, em, el);
    if (stopped) {
        g->stopped_by_string = 1;
        kn_request_cancel(g->req);
    }
}

int kn_client_gone(int fd) {
    if (fd < 0) return 0;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void record_event(kn_gen_run *g, const kn_token_event *ev) {
    if (g->n_events == g->cap_events) {
        int cap = g->cap_events ? g->cap_events * 2 : 16;
        kn_token_event *ne = realloc(g->events, (size_t)cap * sizeof *ne);
        if (!ne) return;
        g->events = ne, g->cap_events = cap;
    }
    g->events[g->n_events++] = *ev;
    if (g->n_all == g->cap_all) {
        int cap = g->cap_all ? g->cap_all * 2 : 64;
        int32_t *na = realloc(g->all_ids, (size_t)cap * sizeof *na);
        if (!na) return;
        g->all_ids = na, g->cap_all = cap;
    }
    g->all_ids[g->n_all++] = ev->token;
}

static void finish_text(kn_gen_run *g) {
    kn_error err;
    if (g->detok && !g->stopped_by_string) {
        char *d = NULL;
        size_t dl = 0;
        if (!kn_detok_stream_flush(g->detok, &d, &dl, &err)) feed_text(g, d, dl);
        free(d);
    }
    if (!g->stopped_by_string) {
        const char *em;
        size_t el;
        kn_stop_match_flush(&g->stop, &em, &el);
        emit_text(g, em, el);
    }
    if (g->chat) kn_chat_split_finish(&g->split, on_segment, g);
}

int kn_gen_pull(kn_gen_run *g, int conn_fd) {
    g->content.len = 0, g->reasoning.len = 0;
    if (g->content.data) g->content.data[0] = 0;
    if (g->reasoning.data) g->reasoning.data[0] = 0;
    for (int i = 0; i < g->n_tool_bodies; i++) free(g->tool_bodies[i]);
    g->n_tool_bodies = 0, g->n_events = 0;
    if (g->done) return 0;
    kn_token_event ev;
    int rc;
    /* wait for the first event, watching the client (also between events:
     * a non-streaming answer writes nothing until the end) */
    while ((rc = kn_client_gone(conn_fd) ? -2 : kn_request_next(g->req, &ev, 100)) <= 0)
        if (rc == -2 || (rc == 0 && kn_client_gone(conn_fd))) {
            kn_request_cancel(g->req);
            g->finish = KN_FINISH_CANCELLED;
            g->done = 1;
            return 0;
        } else if (rc == -1) {
            break;
        }
    while (rc == 1) {
        record_event(g, &ev);
        g->n_generated++;
        if (g->detok && !g->stopped_by_string) {
            char *d = NULL;
            size_t dl = 0;
            kn_error err;
            if (kn_detok_stream_push(g->detok, ev.token, &d, &dl, &err) == KN_OK) feed_text(g, d, dl);
            free(d);
        }
        if (g->stopped_by_string) break;
        rc = kn_request_next(g->req, &ev, 0);
    }
    if (g->stopped_by_string || rc == -1) {
        g->done = 1;
        g->finish = g->stopped_by_string ? KN_FINISH_STOP : kn_request_finish(g->req);
        if (g->finish == KN_FINISH_ERROR) snprintf(g->error, sizeof g->error, "%s", kn_request_error(g->req));
        finish_text(g);
        return 0;
    }
    return 1;
}

const char *kn_gen_finish_reason(const kn_gen_run *g, int n_tool_calls) {
    switch (g->finish) {
    case KN_FINISH_LENGTH: return "length";
    case KN_FINISH_STOP: return n_tool_calls ? "tool_calls" : "stop";
    case KN_FINISH_ERROR: return "error";
    default: return "cancelled";
    }
}

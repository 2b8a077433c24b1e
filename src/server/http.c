/* http.c — the HTTP layer of `kiln serve` on libmicrohttpd: one thread per
 * connection (a streaming response may block its own thread while it waits
 * for tokens), routing, API-key check, bounded request bodies, JSON parsing,
 * SSE streaming through MHD's content-reader callback, /health, /v1/models,
 * /metrics (Prometheus text), and graceful shutdown on SIGINT/SIGTERM.
 *
 * Invariants:
 *  1. A request body never exceeds opt.max_body_bytes in memory: larger
 *     uploads are discarded as they arrive and answered 413.
 *  2. Every response to an API route is JSON (or SSE); errors carry the
 *     OpenAI (or Anthropic, for /v1/messages) error shape.
 *  3. A stream's kn_stream is freed exactly once, by MHD's free callback,
 *     which also runs when the client disconnects: that cancels the engine
 *     request and frees its KV blocks. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/synthetic.h"
#include "io/file_util.h"
#include "io/model_config.h"
#include "models/model.h"
#include "models/whisper.h"
#include "server/server_internal.h"

enum { ROUTE_NONE, ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MESSAGES, ROUTE_MODELS, ROUTE_MODEL, ROUTE_HEALTH,
       ROUTE_METRICS, ROUTE_TRANSCRIBE, ROUTE_TRANSLATE };

typedef struct {
    int route;
    int too_large;
    int unauthorized; /* answered 401 once the body has been read (and discarded) */
    kn_buf body;
    char content_type[512]; /* multipart routes: the request's Content-Type ("" when absent or too long) */
} conn_ctx;

typedef struct {
    kn_stream *st;
    kn_buf pending;
    size_t off;
    int ended;
    int fd;
} stream_ctx;

static int route_of(const char *url, const char *method, int *method_ok) {
    int r = ROUTE_NONE, post = 0;
    if (!strcmp(url, "/v1/completions")) r = ROUTE_COMPLETIONS, post = 1;
    else if (!strcmp(url, "/v1/chat/completions")) r = ROUTE_CHAT, post = 1;
    else if (!strcmp(url, "/v1/messages")) r = ROUTE_MESSAGES, post = 1;
    else if (!strcmp(url, "/v1/audio/transcriptions")) r = ROUTE_TRANSCRIBE, post = 1;
    else if (!strcmp(url, "/v1/audio/translations")) r = ROUTE_TRANSLATE, post = 1;
    else if (!strcmp(url, "/v1/models")) r = ROUTE_MODELS;
    else if (!strncmp(url, "/v1/models/", 11)) r = ROUTE_MODEL;
    else if (!strcmp(url, "/health")) r = ROUTE_HEALTH;
    else if (!strcmp(url, "/metrics")) r = ROUTE_METRICS;
    *method_ok = post ? !strcmp(method, "POST") : (!strcmp(method, "GET") || !strcmp(method, "HEAD"));
    return r;
}

static void count_status(kn_srv *s, int status) {
    pthread_mutex_lock(&s->stats_mu);
    int cls = status / 100;
    if (cls >= 1 && cls <= 5) s->http_by_class[cls]++;
    pthread_mutex_unlock(&s->stats_mu);
}

static enum MHD_Result send_body(kn_srv *s, struct MHD_Connection *c, int status, const char *ctype, kn_buf *b) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b->len, b->data ? b->data : (char *)"", MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ret;
}

static enum MHD_Result send_error(kn_srv *s, struct MHD_Connection *c, int anthropic, int status, const char *type,
                                  const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(kn_srv *s, struct MHD_Connection *c, int anthropic, int status, const char *type,
                                  const char *param, const char *fmt, ...) {
    kn_api_error e = {.status = status};
    snprintf(e.type, sizeof e.type, "%s", type);
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    kn_api_reply rep = {0};
    kn_api_error_reply(&e, anthropic, &rep);
    enum MHD_Result r = send_body(s, c, status, "application/json", &rep.body);
    kn_buf_free(&rep.body);
    return r;
}

/* ---- streaming ---------------------------------------------------------- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    (void)pos;
    for (;;) {
        if (sc->off < sc->pending.len) {
            size_t n = sc->pending.len - sc->off < max ? sc->pending.len - sc->off : max;
            memcpy(buf, sc->pending.data + sc->off, n);
            sc->off += n;
            return (ssize_t)n;
        }
        sc->pending.len = 0, sc->off = 0;
        if (sc->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!sc->st->next(sc->st, &sc->pending, sc->fd)) sc->ended = 1;
        if (sc->pending.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    sc->st->free(sc->st); /* releases the engine request: cancels it when still running */
    kn_buf_free(&sc->pending);
    free(sc);
}

static enum MHD_Result send_stream(kn_srv *s, struct MHD_Connection *c, kn_stream *st, int fd) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        st->free(st);
        return MHD_NO;
    }
    sc->st = st, sc->fd = fd;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, sc,
                                                               stream_free);
    if (!r) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_status(s, 200);
    return ret;
}

/* ---- simple GET routes -------------------------------------------------- */

static void hist_lines(kn_buf *b, const char *name, const char *help, const uint64_t *h, const double *bounds,
                       double sum, uint64_t count) {
    kn_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < KN_HIST_BUCKETS; i++) {
        cum += h[i];
        kn_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    cum += h[KN_HIST_BUCKETS];
    kn_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
                  sum, name, (unsigned long long)count);
}

static void metrics_body(kn_srv *s, kn_buf *b) {
    kn_engine_stats st = {0};
    if (s->engine) kn_engine_get_stats(s->engine, &st);
    uint64_t http[6], reqs[5];
    pthread_mutex_lock(&s->stats_mu);
    memcpy(http, s->http_by_class, sizeof http);
    memcpy(reqs, s->http_requests, sizeof reqs);
    pthread_mutex_unlock(&s->stats_mu);
    static const char *const ep[5] = {"completions", "chat_completions", "messages", "other", "audio"};
    kn_buf_puts(b, "# HELP kiln_http_requests_total HTTP requests by endpoint.\n# TYPE kiln_http_requests_total counter\n");
    for (int i = 0; i < 5; i++)
        kn_buf_printf(b, "kiln_http_requests_total{endpoint=\"%s\"} %llu\n", ep[i], (unsigned long long)reqs[i]);
    kn_buf_puts(b, "# HELP kiln_http_responses_total HTTP responses by status class.\n"
                   "# TYPE kiln_http_responses_total counter\n");
    for (int i = 1; i <= 5; i++)
        kn_buf_printf(b, "kiln_http_responses_total{code=\"%dxx\"} %llu\n", i, (unsigned long long)http[i]);
    if (s->whisper) {
        pthread_mutex_lock(&s->stats_mu);
        kn_buf_printf(b,
                      "# HELP kiln_transcriptions_total Finished transcriptions / translations.\n"
                      "# TYPE kiln_transcriptions_total counter\nkiln_transcriptions_total %llu\n"
                      "# HELP kiln_audio_seconds_total Seconds of audio transcribed.\n"
                      "# TYPE kiln_audio_seconds_total counter\nkiln_audio_seconds_total %.3f\n"
                      "# HELP kiln_transcribe_seconds_total Time spent transcribing (mel + decode).\n"
                      "# TYPE kiln_transcribe_seconds_total counter\nkiln_transcribe_seconds_total %.3f\n"
                      "# HELP kiln_transcriptions_waiting Requests waiting for the model.\n"
                      "# TYPE kiln_transcriptions_waiting gauge\nkiln_transcriptions_waiting %d\n",
                      (unsigned long long)s->transcriptions, s->audio_seconds, s->transcribe_seconds,
                      s->whisper_waiting);
        pthread_mutex_unlock(&s->stats_mu);
    }
    if (!s->engine) return; /* a Whisper server has no generation engine */
    kn_buf_printf(b,
                  "# HELP kiln_requests_submitted_total Generation requests accepted by the engine.\n"
                  "# TYPE kiln_requests_submitted_total counter\nkiln_requests_submitted_total %llu\n"
                  "# HELP kiln_requests_rejected_total Generation requests refused (queue full / shutdown).\n"
                  "# TYPE kiln_requests_rejected_total counter\nkiln_requests_rejected_total %llu\n",
                  (unsigned long long)st.requests_submitted, (unsigned long long)st.requests_rejected);
    static const char *const fin[5] = {"none", "stop", "length", "cancelled", "error"};
    kn_buf_puts(b, "# HELP kiln_requests_finished_total Finished generation requests by reason.\n"
                   "# TYPE kiln_requests_finished_total counter\n");
    for (int i = 1; i < 5; i++)
        kn_buf_printf(b, "kiln_requests_finished_total{reason=\"%s\"} %llu\n", fin[i],
                      (unsigned long long)st.requests_finished[i]);
    kn_buf_printf(b,
                  "# HELP kiln_prompt_tokens_total Prompt tokens prefilled.\n# TYPE kiln_prompt_tokens_total counter\n"
                  "kiln_prompt_tokens_total %llu\n"
                  "# HELP kiln_generation_tokens_total Tokens generated.\n# TYPE kiln_generation_tokens_total counter\n"
                  "kiln_generation_tokens_total %llu\n"
                  "# HELP kiln_engine_steps_total Forward passes run by the scheduler.\n"
                  "# TYPE kiln_engine_steps_total counter\nkiln_engine_steps_total %llu\n"
                  "# HELP kiln_queue_depth Requests waiting for a batch slot.\n# TYPE kiln_queue_depth gauge\n"
                  "kiln_queue_depth %d\n"
                  "# HELP kiln_running_sequences Sequences in the running batch.\n"
                  "# TYPE kiln_running_sequences gauge\nkiln_running_sequences %d\n"
                  "# HELP kiln_max_batch Configured maximum batch.\n# TYPE kiln_max_batch gauge\nkiln_max_batch %d\n"
                  "# HELP kiln_kv_blocks_free Free KV-cache blocks.\n# TYPE kiln_kv_blocks_free gauge\n"
                  "kiln_kv_blocks_free %lld\n"
                  "# HELP kiln_kv_blocks_total KV-cache blocks in the pool.\n# TYPE kiln_kv_blocks_total gauge\n"
                  "kiln_kv_blocks_total %lld\n"
                  "# HELP kiln_kv_blocks_cached KV-cache blocks held by the prefix cache.\n"
                  "# TYPE kiln_kv_blocks_cached gauge\nkiln_kv_blocks_cached %lld\n"
                  "# HELP kiln_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n"
                  "# TYPE kiln_prefix_cache_hit_tokens_total counter\nkiln_prefix_cache_hit_tokens_total %llu\n",
                  (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens,
                  (unsigned long long)st.steps, st.queue_depth, st.running, st.max_batch,
                  (long long)st.kv_blocks_free, (long long)st.kv_blocks_total, (long long)st.kv_blocks_cached,
                  (unsigned long long)st.prefix_cache_hit_tokens);
    hist_lines(b, "kiln_batch_size", "Sequences per forward pass.", st.batch_hist, kn_hist_bounds_batch, st.batch_sum,
               st.batch_count);
    hist_lines(b, "kiln_time_to_first_token_seconds", "Time from submit to the first token.", st.ttft_hist,
               kn_hist_bounds_seconds, st.ttft_sum, st.ttft_count);
    hist_lines(b, "kiln_time_per_output_token_seconds", "Time between consecutive tokens of a request.", st.tpot_hist,
               kn_hist_bounds_seconds, st.tpot_sum, st.tpot_count);
}

static void model_object(kn_srv *s, kn_buf *b) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "kiln", "max_model_len",
                          s->model ? s->model->max_context : kn_whisper_cfg(s->whisper)->max_target_positions);
    kn_buf_json(b, m);
    json_decref(m);
}

/* ---- dispatch ----------------------------------------------------------- */

static int auth_ok(kn_srv *s, struct MHD_Connection *c) {
    if (!s->opt.api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (a && !strncmp(a, "Bearer ", 7) && !strcmp(a + 7, s->opt.api_key)) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && !strcmp(x, s->opt.api_key);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static enum MHD_Result send_reply(kn_srv *s, struct MHD_Connection *c, kn_api_reply *rep) {
    if (rep->stream) return send_stream(s, c, rep->stream, rep->conn_fd);
    enum MHD_Result r =
        send_body(s, c, rep->status, rep->content_type ? rep->content_type : "application/json", &rep->body);
    kn_buf_free(&rep->body);
    return r;
}

static enum MHD_Result handle_api(kn_srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    int anthropic = cc->route == ROUTE_MESSAGES;
    int audio = cc->route == ROUTE_TRANSCRIBE || cc->route == ROUTE_TRANSLATE;
    pthread_mutex_lock(&s->stats_mu);
    s->http_requests[audio ? 4 : cc->route == ROUTE_COMPLETIONS ? 0 : cc->route == ROUTE_CHAT ? 1 : 2]++;
    pthread_mutex_unlock(&s->stats_mu);
    if (cc->too_large)
        return send_error(s, c, anthropic, 413, "invalid_request_error", NULL,
                          "request body exceeds the server's limit of %zu bytes", s->opt.max_body_bytes);
    if (s->stopping) return send_error(s, c, anthropic, 503, "server_error", NULL, "the server is shutting down");
    if (audio) {
        kn_api_reply rep = {.conn_fd = conn_fd(c), .status = 200};
        kn_api_audio(s, cc->route == ROUTE_TRANSLATE, cc->content_type[0] ? cc->content_type : NULL,
                     cc->body.data ? cc->body.data : "", cc->body.len, &rep);
        return send_reply(s, c, &rep);
    }
    if (s->whisper)
        return send_error(s, c, anthropic, 400, "invalid_request_error", "model",
                          "model '%s' is a Whisper speech-to-text model: it cannot %s; send audio to POST "
                          "/v1/audio/transcriptions (or /v1/audio/translations)",
                          s->model_name, cc->route == ROUTE_COMPLETIONS ? "complete text" : "chat");
    json_error_t je;
    json_t *req = json_loadb(cc->body.data ? cc->body.data : "", cc->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!req)
        return send_error(s, c, anthropic, 400, "invalid_request_error", NULL,
                          "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(req)) {
        json_decref(req);
        return send_error(s, c, anthropic, 400, "invalid_request_error", NULL, "the body must be a JSON object");
    }
    kn_api_reply rep = {.conn_fd = conn_fd(c), .status = 200};
    if (cc->route == ROUTE_COMPLETIONS) kn_api_completions(s, req, &rep);
    else if (cc->route == ROUTE_CHAT) kn_api_chat(s, req, &rep);
    else kn_api_messages(s, req, &rep);
    json_decref(req);
    return send_reply(s, c, &rep);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    kn_srv *s = cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) { /* first call: headers only */
        int method_ok;
        int route = route_of(url, method, &method_ok);
        int anthropic = route == ROUTE_MESSAGES;
        if (route == ROUTE_NONE)
            return send_error(s, c, 0, 404, "invalid_request_error", NULL, "no route for %s %.200s", method, url);
        if (!method_ok)
            return send_error(s, c, anthropic, 405, "invalid_request_error", NULL, "method %s is not allowed on %.200s",
                              method, url);
        int authorized = route == ROUTE_HEALTH || auth_ok(s, c);
        int has_body = route == ROUTE_COMPLETIONS || route == ROUTE_CHAT || route == ROUTE_MESSAGES ||
                       route == ROUTE_TRANSCRIBE || route == ROUTE_TRANSLATE;
        if (!authorized && !has_body)
            return send_error(s, c, anthropic, 401, anthropic ? "authentication_error" : "invalid_request_error", NULL,
                              "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')");
        if (route == ROUTE_HEALTH || route == ROUTE_MODELS || route == ROUTE_MODEL || route == ROUTE_METRICS) {
            kn_buf b = {0};
            int status = 200;
            const char *ctype = "application/json";
            if (route == ROUTE_HEALTH) {
                if (s->stopping) status = 503, kn_buf_puts(&b, "{\"status\":\"stopping\"}");
                else kn_buf_puts(&b, "{\"status\":\"ok\"}");
            } else if (route == ROUTE_METRICS) {
                metrics_body(s, &b);
                ctype = "text/plain; version=0.0.4";
            } else if (route == ROUTE_MODELS) {
                kn_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
                model_object(s, &b);
                kn_buf_puts(&b, "]}");
            } else {
                if (strcmp(url + 11, s->model_name) != 0) {
                    kn_buf_free(&b);
                    return send_error(s, c, 0, 404, "invalid_request_error", "model", "model '%.200s' does not exist",
                                      url + 11);
                }
                model_object(s, &b);
            }
            enum MHD_Result r = send_body(s, c, status, ctype, &b);
            kn_buf_free(&b);
            return r;
        }
        /* an announced body far beyond the limit is refused at once (the
         * connection closes); a moderately large one is read and discarded
         * so the client sees the 413 (invariant 1 either way) */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) / 16 > s->opt.max_body_bytes)
            return send_error(s, c, anthropic, 413, "invalid_request_error", NULL,
                              "request body exceeds the server's limit of %zu bytes", s->opt.max_body_bytes);
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->route = route;
        cc->unauthorized = !authorized; /* the upload is discarded; a client still sending it sees the 401 */
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (ct && strlen(ct) < sizeof cc->content_type) strcpy(cc->content_type, ct);
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (cc->unauthorized) {
            *upload_data_size = 0;
            return MHD_YES;
        }
        if (!cc->too_large && cc->body.len + *upload_data_size <= s->opt.max_body_bytes)
            kn_buf_add(&cc->body, upload_data, *upload_data_size);
        else cc->too_large = 1, kn_buf_free(&cc->body);
        if (cc->body.oom) cc->too_large = 1, kn_buf_free(&cc->body);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cc->unauthorized)
        return send_error(s, c, cc->route == ROUTE_MESSAGES, 401,
                          cc->route == ROUTE_MESSAGES ? "authentication_error" : "invalid_request_error", NULL,
                          "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')");
    return handle_api(s, c, cc);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_ctx *cc = *con_cls;
    if (cc) {
        kn_buf_free(&cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

/* ---- run ---------------------------------------------------------------- */

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("kiln serve: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* The KV pool holds max_batch full contexts (so an admitted request never
 * runs out of blocks). Without --ctx, keep it within a memory budget by
 * shortening the context rather than failing to allocate. */
static kn_code pick_context(const kn_server_options *o, int max_batch, int *ctx, kn_error *err) {
    kn_model_config cfg;
    kn_code rc = kn_config_load(o->model_dir, &cfg, err);
    if (rc) return rc;
    kn_kv_spec spec = kn_kv_spec_default(strstr(cfg.torch_dtype, "float32") ? KN_DT_F32 : KN_DT_BF16);
    if (o->kv && (rc = kn_kv_spec_parse(o->kv, o->kv_keep_layers == 0 ? -1 : o->kv_keep_layers < 0 ? 0 : o->kv_keep_layers,
                                        &spec, err)))
        return rc;
    int heads[KN_MAX_LAYERS], dims[KN_MAX_LAYERS];
    for (int l = 0; l < cfg.n_layers; l++) heads[l] = cfg.layer_kv_heads[l], dims[l] = cfg.layer_head_dim[l];
    int64_t per_token = kn_kv_spec_bytes_per_token(&spec, cfg.n_layers, heads, dims); /* KV_FORMATS.md formula */
    int64_t budget = (int64_t)o->kv_mb << 20;
    if (budget <= 0) budget = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 4;
    int64_t fit = per_token > 0 ? budget / ((int64_t)max_batch * per_token) : 0;
    int want = cfg.max_position_embeddings > 16384 ? 16384 : cfg.max_position_embeddings;
    if (fit >= want) {
        *ctx = 0; /* the model's default */
        return KN_OK;
    }
    fit -= fit % 16;
    if (fit < 256)
        return kn_fail(err, KN_ERR_NOMEM,
                       "a KV budget of %lld MiB holds less than 256 tokens per sequence at --max-batch %d; "
                       "raise --kv-mb or lower --max-batch",
                       (long long)(budget >> 20), max_batch);
    *ctx = (int)fit;
    fprintf(stderr, "kiln serve: context %d tokens per sequence (KV budget %lld MiB for %d sequences; --ctx or "
                    "--kv-mb to change)\n",
            *ctx, (long long)(budget >> 20), max_batch);
    return KN_OK;
}

/* random weights at a config's shape (dtype from its torch_dtype) */
static kn_code open_synthetic(const kn_server_options *o, kn_synthetic **syn, kn_model **m, kn_error *err) {
    char *text;
    size_t len;
    kn_model_config cfg;
    kn_code rc = kn_read_file(o->synthetic, 1 << 20, &text, &len, err);
    if (rc) return rc;
    rc = kn_config_parse(text, len, NULL, 0, o->synthetic, &cfg, err);
    free(text);
    if (rc) return rc;
    kn_dtype dt = strstr(cfg.torch_dtype, "float32")                                   ? KN_DT_F32
                  : strstr(cfg.torch_dtype, "float16") && !strstr(cfg.torch_dtype, "bfloat16") ? KN_DT_F16
                                                                                      : KN_DT_BF16;
    if ((rc = kn_synthetic_create(&cfg, dt, 1234, o->n_threads, syn, err))) return rc;
    kn_backend *be;
    if ((rc = kn_backend_create(o->backend, o->n_threads, &be, err))) return rc;
    int ctx = o->max_context > 0 ? o->max_context : 2048;
    kn_tensor_source src = kn_synthetic_source(*syn);
    kn_kv_spec kvs;
    if (o->kv && (rc = kn_kv_spec_parse(o->kv, o->kv_keep_layers == 0 ? -1 : o->kv_keep_layers < 0 ? 0 : o->kv_keep_layers,
                                        &kvs, err))) {
        kn_backend_destroy(be);
        return rc;
    }
    return kn_model_build_kv(&cfg, &src, be, ctx, o->max_batch > 0 ? o->max_batch : 8, o->kv ? &kvs : NULL, m, err);
}

kn_code kn_server_run(const kn_server_options *o, kn_error *err) {
    kn_srv *s = calloc(1, sizeof *s);
    if (!s) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    s->opt = *o;
    if (!s->opt.host) s->opt.host = "127.0.0.1";
    if (s->opt.max_batch <= 0) s->opt.max_batch = 8;
    int whisper = !o->synthetic && o->model_dir && kn_whisper_is_whisper_dir(o->model_dir);
    /* audio uploads: OpenAI's limit of 25 MB; JSON requests: 4 MiB */
    if (s->opt.max_body_bytes == 0) s->opt.max_body_bytes = whisper ? 25u << 20 : 4u << 20;
    if (s->opt.max_connections <= 0) s->opt.max_connections = 256;
    s->created = (long)time(NULL);
    s->think_id = s->end_think_id = -1;
    pthread_mutex_init(&s->stats_mu, NULL);
    pthread_mutex_init(&s->whisper_mu, NULL);
    const char *src_path = o->synthetic ? o->synthetic : o->model_dir;
    const char *base = strrchr(src_path, '/');
    base = base && base[1] ? base + 1 : src_path;
    snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name ? o->model_name : base);
    size_t nl = strlen(s->model_name);
    while (nl > 1 && s->model_name[nl - 1] == '/') s->model_name[--nl] = 0;

    kn_code rc;
    kn_model_options mo = {.backend = o->backend, .n_threads = o->n_threads, .max_context = o->max_context,
                           .max_seqs = s->opt.max_batch, .kv = o->kv, .kv_keep_layers = o->kv_keep_layers,
                           .kv_start = o->kv_start};
    struct MHD_Daemon *d = NULL;
    kn_synthetic *syn = NULL;
    char path[4096];
    if (whisper) {
        /* transcription-only server: no generation engine, no chat */
        kn_whisper_options wo = {.backend = o->backend, .n_threads = o->n_threads, .max_slots = 5};
        if ((rc = kn_whisper_open(o->model_dir, &wo, &s->whisper, err))) goto done;
        if ((rc = kn_tokenizer_load(o->model_dir, &s->tok, err))) goto done;
        goto listen;
    }
    if (!o->synthetic && o->max_context <= 0 && (rc = pick_context(o, s->opt.max_batch, &mo.max_context, err)))
        goto done;
    if (o->synthetic) {
        if ((rc = open_synthetic(o, &syn, &s->model, err))) goto done;
        path[0] = 0;
    } else {
        if ((rc = kn_model_open(o->model_dir, &mo, &s->model, err))) goto done;
        snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    }
    if (path[0] && access(path, R_OK) == 0) {
        if ((rc = kn_tokenizer_load(o->model_dir, &s->tok, err))) goto done;
        s->think_id = kn_tokenizer_token_id(s->tok, "<think>");
        s->end_think_id = kn_tokenizer_token_id(s->tok, "</think>");
        kn_error terr = {0};
        if (kn_chat_template_load(o->model_dir, NULL, &s->tmpl, &terr) != KN_OK) {
            s->tmpl = NULL;
            fprintf(stderr, "kiln serve: no chat template (%s); /v1/chat/completions and /v1/messages are disabled\n",
                    terr.msg);
        }
    } else {
        fprintf(stderr, "kiln serve: %s has no tokenizer.json: only token-id prompts on /v1/completions\n",
                src_path);
    }
    kn_engine_options eo = {.max_batch = s->opt.max_batch, .max_queue = o->max_queue};
    int64_t block_bytes = kn_kv_bytes_per_token(s->model->kv) * s->model->kv->block_size;
    eo.prefix_cache_blocks = o->prefix_cache_mb < 0 ? s->model->kv->n_blocks / 2
                                                    : (int64_t)o->prefix_cache_mb * (1 << 20) / block_bytes;
    if ((rc = kn_engine_create(s->model, &eo, &s->engine, err))) goto done;
listen:;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", o->port);
    if (getaddrinfo(s->opt.host, port_s, &hints, &ai) != 0) {
        rc = kn_fail(err, KN_ERR_INVALID_ARG, "--host %s is not a numeric IPv4/IPv6 address", s->opt.host);
        goto done;
    }
    /* SIGINT/SIGTERM are taken by sigwait below; every thread created from
     * here on inherits the blocked mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT), sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opt.max_connections,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        rc = kn_fail(err, KN_ERR_IO, "cannot listen on %s:%d (address in use or not permitted)", s->opt.host, o->port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (s->whisper)
        fprintf(stderr, "kiln: serving %s (%s; /v1/audio/transcriptions and /v1/audio/translations) on http://%s:%u "
                        "(transcriptions run one at a time)\n",
                s->model_name, kn_whisper_describe(s->whisper), s->opt.host, di ? di->port : (unsigned)o->port);
    else
        fprintf(stderr, "kiln: serving %s (%s) on http://%s:%u (max batch %d)\n", s->model_name,
                kn_model_describe(s->model), s->opt.host, di ? di->port : (unsigned)o->port, s->opt.max_batch);
    fflush(stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kiln: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    s->stopping = 1;
    MHD_quiesce_daemon(d);         /* no new connections */
    if (s->engine) kn_engine_shutdown(s->engine); /* cancel in-flight work: streams end, handlers return */
    MHD_stop_daemon(d);            /* joins the connection threads */
    rc = KN_OK;
done:
    kn_engine_destroy(s->engine);
    if (s->tmpl) kn_chat_template_free(s->tmpl);
    if (s->tok) kn_tokenizer_free(s->tok);
    if (s->model) kn_model_close(s->model);
    kn_whisper_close(s->whisper);
    pthread_mutex_destroy(&s->whisper_mu);
    kn_synthetic_free(syn);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
    return rc;
}

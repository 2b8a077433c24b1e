/* api_audio.c — POST /v1/audio/transcriptions and /v1/audio/translations
 * (OpenAI's audio API) on a Whisper model.
 *
 * The body is multipart/form-data (multipart.c): `file` (the audio, any
 * format libsndfile reads, decoded from memory), `model`, `language`,
 * `prompt`, `response_format` (json | text | srt | verbose_json | vtt),
 * `temperature`, `timestamp_granularities[]` (segment | word; verbose_json
 * only) and `stream` (transcriptions only: SSE `transcript.text.delta` events,
 * one per decoded segment, then `transcript.text.done`). Unknown fields are
 * refused (400 naming the field), as on the JSON endpoints.
 *
 * A server holds one kn_whisper (not thread-safe): transcriptions run one at
 * a time under whisper_mu; at most max_queue requests wait for it (429
 * beyond). A transcription stops early when its client disconnects or the
 * server shuts down (checked after every segment). A streaming request
 * decodes on a worker thread that queues SSE bytes for MHD's reader. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "audio/audio.h"
#include "engine/transcribe.h"
#include "server/multipart.h"
#include "server/server_internal.h"

#define AUDIO_MAX_SECONDS 3600.0 /* decoded audio per request (a compressed upload may expand a lot) */

/* the OpenAI fields, then kiln extensions named as in openai-whisper / transformers */
#define EXTENSION_FIELDS "temperature_increment_on_fallback", "without_timestamps", "max_new_tokens"
static const char *const TRANSCRIBE_FIELDS[] = {"file", "model", "language", "prompt", "response_format",
                                                "temperature", "timestamp_granularities[]", "stream",
                                                EXTENSION_FIELDS, NULL};
static const char *const TRANSLATE_FIELDS[] = {"file", "model", "prompt", "response_format", "temperature",
                                               EXTENSION_FIELDS, NULL};

typedef struct {
    kn_srv *srv;
    int translate, stream, words;
    char format[16];
    char language[16];
    float *pcm;
    int64_t n_pcm;
    int32_t *prompt;
    int n_prompt;
    double temperature; /* < 0: the default ladder */
    double increment;   /* fallback ladder step (0.2); 0 = no fallback */
    int without_timestamps, max_new_tokens;
} audio_job;

static void job_free(audio_job *j) {
    free(j->pcm);
    free(j->prompt);
    memset(j, 0, sizeof *j);
}

static int bad(kn_api_error *e, const char *param, const char *fmt, const char *arg) {
    return kn_api_fail(e, 400, "invalid_request_error", param, fmt, arg);
}

/* A text field as a NUL-terminated string in buf (cap bytes); -1 if it does
 * not fit or holds a NUL byte. */
static int field_str(const kn_mp_part *p, char *buf, size_t cap) {
    if (p->len >= cap || memchr(p->data, 0, p->len)) return -1;
    memcpy(buf, p->data, p->len);
    buf[p->len] = 0;
    return 0;
}

static kn_code detok_cb(void *user, const int32_t *ids, int n, char **text, kn_error *err) {
    size_t len;
    return kn_tokenizer_decode(user, ids, n, 1, text, &len, err);
}

/* Validate the form into j; on failure fill e and return -1. */
static int parse_form(kn_srv *s, int translate, const char *content_type, const char *body, size_t len,
                      audio_job *j, kn_api_error *e) {
    char boundary[KN_MP_MAX_BOUNDARY + 1];
    kn_error err = {0};
    kn_mp_part *parts = malloc(sizeof(kn_mp_part) * KN_MP_MAX_PARTS);
    int n = 0, rc = 0;
    if (!parts) return kn_api_fail(e, 500, "server_error", NULL, "out of memory");
    if (kn_multipart_boundary(content_type, boundary, sizeof boundary, &err) ||
        kn_multipart_parse(boundary, body, len, parts, KN_MP_MAX_PARTS, &n, &err)) {
        rc = kn_api_fail(e, 400, "invalid_request_error", NULL, "%s", err.msg);
        goto out;
    }
    const char *const *allowed = translate ? TRANSLATE_FIELDS : TRANSCRIBE_FIELDS;
    for (int i = 0; i < n; i++) {
        int known = 0, dup = 0;
        for (int k = 0; allowed[k]; k++) known |= !strcmp(parts[i].name, allowed[k]);
        if (!known) {
            rc = kn_api_fail(e, 400, "invalid_request_error", parts[i].name, "unknown field '%.100s'%s",
                             parts[i].name, translate ? " (translations take file, model, prompt, response_format, "
                                                        "temperature)"
                                                      : "");
            goto out;
        }
        for (int k = 0; k < i; k++) dup |= !strcmp(parts[k].name, parts[i].name);
        if (dup && strcmp(parts[i].name, "timestamp_granularities[]")) {
            rc = bad(e, parts[i].name, "field '%s' is given more than once", parts[i].name);
            goto out;
        }
    }
    char v[256];
    const kn_mp_part *p;
    if (!kn_multipart_get(parts, n, "model")) {
        rc = bad(e, "model", "%s: field required", "model");
        goto out;
    }
    if (field_str(kn_multipart_get(parts, n, "model"), v, sizeof v)) {
        rc = bad(e, "model", "'%s' must be a short string", "model");
        goto out;
    }
    snprintf(j->format, sizeof j->format, "json");
    if ((p = kn_multipart_get(parts, n, "response_format"))) {
        static const char *const formats[] = {"json", "text", "srt", "verbose_json", "vtt", NULL};
        int ok = !field_str(p, v, sizeof v);
        int known = 0;
        for (int k = 0; ok && formats[k]; k++) known |= !strcmp(v, formats[k]);
        if (!known) {
            rc = bad(e, "response_format", "response_format must be one of %s",
                     "json, text, srt, verbose_json, vtt");
            goto out;
        }
        snprintf(j->format, sizeof j->format, "%s", v);
    }
    j->temperature = -1;
    if ((p = kn_multipart_get(parts, n, "temperature"))) {
        char *end = NULL;
        double t = NAN;
        if (!field_str(p, v, sizeof v) && v[0]) t = strtod(v, &end);
        if (isnan(t) || !end || *end || t < 0 || t > 1) {
            rc = bad(e, "temperature", "temperature must be a number from 0 to 1 (got '%.40s')", v);
            goto out;
        }
        j->temperature = t;
    }
    j->increment = 0.2;
    if ((p = kn_multipart_get(parts, n, "temperature_increment_on_fallback"))) {
        char *end = NULL;
        double t = NAN;
        if (!field_str(p, v, sizeof v) && v[0]) t = strtod(v, &end);
        if (isnan(t) || !end || *end || t < 0 || t > 1) {
            rc = bad(e, "temperature_increment_on_fallback",
                     "temperature_increment_on_fallback must be a number from 0 (no fallback) to 1 (got '%.40s')", v);
            goto out;
        }
        j->increment = t;
    }
    if ((p = kn_multipart_get(parts, n, "max_new_tokens"))) {
        char *end = NULL;
        long t = -1;
        int cap = kn_whisper_cfg(s->whisper)->max_target_positions / 2;
        if (!field_str(p, v, sizeof v) && v[0]) t = strtol(v, &end, 10);
        if (!end || *end || t < 1 || t > cap) {
            rc = kn_api_fail(e, 400, "invalid_request_error", "max_new_tokens",
                             "max_new_tokens must be an integer from 1 to %d (tokens per 30 s window)", cap);
            goto out;
        }
        j->max_new_tokens = (int)t;
    }
    if ((p = kn_multipart_get(parts, n, "without_timestamps"))) {
        if (field_str(p, v, sizeof v) || (strcasecmp(v, "true") && strcasecmp(v, "false"))) {
            rc = bad(e, "without_timestamps", "without_timestamps must be %s", "true or false");
            goto out;
        }
        j->without_timestamps = !strcasecmp(v, "true");
    }
    if ((p = kn_multipart_get(parts, n, "language"))) {
        const kn_whisper_config *c = kn_whisper_cfg(s->whisper);
        int ok = !field_str(p, v, sizeof v) && strlen(v) < sizeof j->language;
        int known = 0;
        for (int k = 0; ok && k < c->n_langs; k++) known |= !strcmp(v, c->lang_code[k]);
        if (ok && c->n_langs == 0 && !strcmp(v, "en")) known = 1; /* English-only model */
        if (!known) {
            rc = kn_api_fail(e, 400, "invalid_request_error", "language",
                             "language '%.40s' is not one of this model's languages (ISO-639-1 codes such as "
                             "'en', '%s')",
                             ok ? v : "?", c->n_langs > 1 ? c->lang_code[1] : "de");
            goto out;
        }
        if (c->n_langs > 0) snprintf(j->language, sizeof j->language, "%s", v);
    }
    for (int i = 0; i < n; i++) {
        if (strcmp(parts[i].name, "timestamp_granularities[]")) continue;
        if (field_str(&parts[i], v, sizeof v) || (strcmp(v, "word") && strcmp(v, "segment"))) {
            rc = bad(e, "timestamp_granularities", "timestamp_granularities[] values are %s", "'segment' or 'word'");
            goto out;
        }
        if (strcmp(j->format, "verbose_json")) {
            rc = bad(e, "timestamp_granularities", "timestamp_granularities needs response_format %s",
                     "verbose_json");
            goto out;
        }
        if (!strcmp(v, "word")) j->words = 1;
    }
    if ((p = kn_multipart_get(parts, n, "stream"))) {
        if (field_str(p, v, sizeof v) || (strcasecmp(v, "true") && strcasecmp(v, "false"))) {
            rc = bad(e, "stream", "stream must be %s", "true or false");
            goto out;
        }
        j->stream = !strcasecmp(v, "true");
        if (j->stream && strcmp(j->format, "json") && strcmp(j->format, "text")) {
            rc = bad(e, "stream", "stream needs response_format json or text (got %s)", j->format);
            goto out;
        }
    }
    if ((p = kn_multipart_get(parts, n, "prompt")) && p->len > 0) {
        /* as openai-whisper: " " + prompt, text tokens only */
        char *spaced = malloc(p->len + 2);
        if (!spaced) {
            rc = kn_api_fail(e, 500, "server_error", NULL, "out of memory");
            goto out;
        }
        spaced[0] = ' ';
        memcpy(spaced + 1, p->data, p->len);
        spaced[p->len + 1] = 0;
        kn_code tc = memchr(p->data, 0, p->len)
                         ? kn_fail(&err, KN_ERR_FORMAT, "NUL byte in the prompt")
                         : kn_tokenizer_encode(s->tok, spaced, p->len + 1, 0, &j->prompt, &j->n_prompt, &err);
        free(spaced);
        if (tc) {
            rc = kn_api_fail(e, 400, "invalid_request_error", "prompt", "prompt: %s", err.msg);
            goto out;
        }
        int eot = kn_whisper_cfg(s->whisper)->eos_token_id;
        for (int k = 0; k < j->n_prompt; k++)
            if (j->prompt[k] >= eot) {
                rc = bad(e, "prompt", "the prompt holds a special token (%s); send plain text",
                         "<|...|> markers are not allowed");
                goto out;
            }
    }
    if (!(p = kn_multipart_get(parts, n, "file"))) {
        rc = bad(e, "file", "%s: field required (the audio file)", "file");
        goto out;
    }
    kn_code ac = kn_audio_load_memory(p->data, p->len, AUDIO_MAX_SECONDS, &j->pcm, &j->n_pcm, &err);
    if (ac == KN_ERR_NOMEM) rc = kn_api_fail(e, 500, "server_error", "file", "%s", err.msg);
    else if (ac) {
        const char *m = err.msg;
        if (!strncmp(m, "audio: ", 7)) m += 7;
        rc = kn_api_fail(e, 400, "invalid_request_error", "file", "file '%.100s' could not be decoded as audio: %s",
                         p->has_filename ? p->filename : "(no filename)", m);
    }
    j->translate = translate;
    j->srv = s;
out:
    free(parts);
    return rc;
}

static void job_options(audio_job *j, kn_decode_options *o) {
    kn_decode_options_default(o);
    o->language = j->language[0] ? j->language : NULL;
    o->task = j->translate ? KN_TASK_TRANSLATE : KN_TASK_TRANSCRIBE;
    o->initial_prompt = j->prompt;
    o->n_initial_prompt = j->n_prompt;
    /* OpenAI: temperature 0 (or absent) lets the server raise it on failure
     * (openai-whisper's ladder 0, 0.2, ..., 1.0); kiln starts the ladder at
     * the given temperature and steps by temperature_increment_on_fallback */
    double t0 = j->temperature > 0 ? j->temperature : 0.0;
    o->n_temperatures = 0;
    for (double t = t0; o->n_temperatures < KN_MAX_TEMPERATURES && t <= 1.0 + 1e-6; t += j->increment) {
        o->temperatures[o->n_temperatures++] = (float)t;
        if (j->increment <= 0) break;
    }
    o->timestamps = !j->without_timestamps;
    o->max_new_tokens = j->max_new_tokens;
    o->word_timestamps = j->words;
    o->detok = detok_cb;
    o->detok_user = j->srv->tok;
}

/* Take the Whisper model: wait in line (at most max_queue waiting). */
static int whisper_acquire(kn_srv *s, kn_api_error *e) {
    pthread_mutex_lock(&s->stats_mu);
    int limit = s->opt.max_queue > 0 ? s->opt.max_queue : 64;
    if (s->whisper_waiting >= limit) {
        pthread_mutex_unlock(&s->stats_mu);
        return kn_api_fail(e, 429, "rate_limit_error", NULL,
                           "%d transcriptions are already waiting; try again later", limit);
    }
    s->whisper_waiting++;
    pthread_mutex_unlock(&s->stats_mu);
    pthread_mutex_lock(&s->whisper_mu);
    pthread_mutex_lock(&s->stats_mu);
    s->whisper_waiting--;
    pthread_mutex_unlock(&s->stats_mu);
    return 0;
}

static void count_transcript(kn_srv *s, const kn_transcript *t) {
    pthread_mutex_lock(&s->stats_mu);
    s->transcriptions++;
    s->audio_seconds += t->duration;
    s->transcribe_seconds += t->mel_seconds + t->decode_seconds;
    pthread_mutex_unlock(&s->stats_mu);
}

static int run_failed(kn_code rc, const kn_error *err, kn_api_error *e) {
    if (rc == KN_ERR_INVALID_ARG || rc == KN_ERR_FORMAT)
        return kn_api_fail(e, 400, "invalid_request_error", "file", "%s", err->msg);
    return kn_api_fail(e, 500, "server_error", NULL, "transcription failed: %s", err->msg);
}

/* ---- non-streaming ------------------------------------------------------- */

typedef struct {
    kn_srv *srv;
    int fd;
} stop_check;

static int stop_on_segment(void *user, const kn_segment *seg) {
    stop_check *c = user;
    (void)seg;
    return c->srv->stopping || kn_client_gone(c->fd);
}

static void reply_text(kn_api_reply *out, const char *format, const char *text) {
    out->status = 200;
    out->content_type = !strcmp(format, "json") || !strcmp(format, "verbose_json") ? "application/json"
                        : !strcmp(format, "vtt")                                    ? "text/vtt; charset=utf-8"
                                                                                    : "text/plain; charset=utf-8";
    kn_buf_puts(&out->body, text);
}

static void run_blocking(audio_job *j, kn_api_reply *out) {
    kn_srv *s = j->srv;
    kn_api_error e = {0};
    kn_decode_options o;
    job_options(j, &o);
    stop_check sc = {.srv = s, .fd = out->conn_fd};
    o.on_segment = stop_on_segment;
    o.on_segment_user = &sc;
    if (whisper_acquire(s, &e)) {
        kn_api_error_reply(&e, 0, out);
        return;
    }
    kn_transcript t = {0};
    kn_error err = {0};
    kn_code rc = s->stopping ? kn_fail(&err, KN_ERR_INTERNAL, "the server is shutting down")
                             : kn_transcribe(s->whisper, j->pcm, j->n_pcm, &o, &t, &err);
    pthread_mutex_unlock(&s->whisper_mu);
    if (!rc) count_transcript(s, &t);
    char *text = NULL;
    if (!rc) rc = kn_transcript_format(&t, j->format, j->translate ? "translate" : "transcribe", &text, &err);
    if (rc) {
        if (s->stopping) kn_api_fail(&e, 503, "server_error", NULL, "the server is shutting down");
        else run_failed(rc, &err, &e);
        kn_api_error_reply(&e, 0, out);
    } else reply_text(out, j->format, text);
    free(text);
    kn_transcript_free(&t);
}

/* ---- streaming ----------------------------------------------------------- */

typedef struct {
    kn_stream base;
    audio_job job;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kn_buf queued; /* SSE bytes made by the worker, not yet taken */
    int finished;
    volatile int cancel;
} audio_stream;

static void push_event(audio_stream *st, json_t *ev) {
    pthread_mutex_lock(&st->mu);
    kn_buf_sse(&st->queued, NULL, ev);
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static int stream_segment(void *user, const kn_segment *seg) {
    audio_stream *st = user;
    if (seg->text && seg->text[0])
        push_event(st, json_pack("{s:s, s:o}", "type", "transcript.text.delta", "delta",
                                 kn_json_text(seg->text, strlen(seg->text))));
    return st->cancel || st->job.srv->stopping;
}

static void stream_error(audio_stream *st, const kn_api_error *e) {
    push_event(st, json_pack("{s:{s:s, s:s, s:o, s:n}}", "error", "message", e->msg, "type", e->type, "param",
                             e->param[0] ? json_string(e->param) : json_null(), "code"));
}

static void *stream_worker(void *arg) {
    audio_stream *st = arg;
    audio_job *j = &st->job;
    kn_srv *s = j->srv;
    kn_api_error e = {0};
    kn_decode_options o;
    job_options(j, &o);
    o.on_segment = stream_segment;
    o.on_segment_user = st;
    if (whisper_acquire(s, &e)) stream_error(st, &e);
    else {
        kn_transcript t = {0};
        kn_error err = {0};
        kn_code rc = st->cancel || s->stopping ? KN_OK : kn_transcribe(s->whisper, j->pcm, j->n_pcm, &o, &t, &err);
        pthread_mutex_unlock(&s->whisper_mu);
        if (!rc) count_transcript(s, &t);
        if (rc) {
            run_failed(rc, &err, &e);
            stream_error(st, &e);
        } else if (!st->cancel && !s->stopping) {
            const char *text = t.text ? t.text : "";
            push_event(st, json_pack("{s:s, s:o}", "type", "transcript.text.done", "text",
                                     kn_json_text(text, strlen(text))));
        }
        kn_transcript_free(&t);
    }
    pthread_mutex_lock(&st->mu);
    st->finished = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static int stream_next(kn_stream *base, kn_buf *out, int conn_fd) {
    audio_stream *st = (audio_stream *)base;
    pthread_mutex_lock(&st->mu);
    while (!st->queued.len && !st->finished) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&st->cv, &st->mu, &ts);
        if (!st->queued.len && kn_client_gone(conn_fd)) {
            st->cancel = 1;
            pthread_mutex_unlock(&st->mu);
            return 0;
        }
    }
    kn_buf_add(out, st->queued.data ? st->queued.data : "", st->queued.len);
    st->queued.len = 0;
    int more = !st->finished;
    pthread_mutex_unlock(&st->mu);
    return more;
}

static void stream_free(kn_stream *base) {
    audio_stream *st = (audio_stream *)base;
    st->cancel = 1;
    if (st->started) pthread_join(st->thread, NULL);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    kn_buf_free(&st->queued);
    job_free(&st->job);
    free(st);
}

/* ---- entry ---------------------------------------------------------------- */

void kn_api_audio(kn_srv *s, int translate, const char *content_type, const char *body, size_t len,
                  kn_api_reply *out) {
    kn_api_error e = {0};
    const char *route = translate ? "/v1/audio/translations" : "/v1/audio/transcriptions";
    if (!s->whisper) {
        kn_api_fail(&e, 400, "invalid_request_error", "model",
                    "model '%s' is not a speech-to-text (Whisper) model: %s needs a server started with "
                    "`kiln serve WHISPER_MODEL_DIR`",
                    s->model_name, route);
        kn_api_error_reply(&e, 0, out);
        return;
    }
    audio_job j = {0};
    if (parse_form(s, translate, content_type, body, len, &j, &e)) {
        job_free(&j);
        kn_api_error_reply(&e, 0, out);
        return;
    }
    if (!j.stream) {
        run_blocking(&j, out);
        job_free(&j);
        return;
    }
    audio_stream *st = calloc(1, sizeof *st);
    if (!st) {
        job_free(&j);
        kn_api_fail(&e, 500, "server_error", NULL, "out of memory");
        kn_api_error_reply(&e, 0, out);
        return;
    }
    st->base.next = stream_next;
    st->base.free = stream_free;
    st->job = j;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    if (pthread_create(&st->thread, NULL, stream_worker, st) != 0) {
        stream_free(&st->base);
        kn_api_fail(&e, 500, "server_error", NULL, "cannot start a transcription thread");
        kn_api_error_reply(&e, 0, out);
        return;
    }
    st->started = 1;
    out->stream = &st->base;
}

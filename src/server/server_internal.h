/* server_internal.h — what the HTTP layer (http.c), the generation runner
 * (gen.c) and the protocol mappings (api_openai.c, api_anthropic.c) share.
 *
 * A request's life: http.c authenticates, reads a bounded body, parses JSON
 * and calls an api_* handler with it. The handler validates the request
 * into a kn_gen_job (the protocol-independent description of one
 * generation), then either runs it to completion and builds one JSON body,
 * or returns a stream whose producer http.c pulls from MHD's content-reader
 * callback (one connection thread per client, so the producer may block). */
#ifndef KN_SERVER_INTERNAL_H
#define KN_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/stop_match.h"
#include "server/chat_parse.h"
#include "server/json_util.h"
#include "server/server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    kn_server_options opt;
    char model_name[256];
    kn_model *model;
    kn_engine *engine;
    kn_tokenizer *tok;       /* NULL when the model dir has no tokenizer.json */
    kn_chat_template *tmpl;  /* NULL when it has no chat template */
    struct kn_whisper *whisper; /* a Whisper model (transcription-only server; model/engine are NULL) */
    pthread_mutex_t whisper_mu; /* one transcription at a time */
    int whisper_waiting;        /* requests waiting for whisper_mu (under stats_mu) */
    uint64_t transcriptions;    /* finished transcriptions (under stats_mu) */
    double audio_seconds, transcribe_seconds; /* audio transcribed, time spent (under stats_mu) */
    int32_t think_id, end_think_id; /* -1 when absent */
    long created;             /* unix time the server started */
    pthread_mutex_t stats_mu;
    uint64_t http_by_class[6]; /* 1xx..5xx responses, index = status / 100 */
    uint64_t http_requests[5]; /* completions, chat, messages, other, audio */
    volatile int stopping;
} kn_srv;

/* Errors map to HTTP status + OpenAI-style {"error": {...}} bodies. */
typedef struct {
    int status;
    char type[48];   /* invalid_request_error, authentication_error, ... */
    char param[64];  /* the offending field, or "" */
    char msg[KN_ERRMSG];
} kn_api_error;

int kn_api_fail(kn_api_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One generation, protocol-independent. */
typedef struct {
    int32_t *prompt;
    int n_prompt;
    kn_gen_params gp;
    const char *stops[KN_MAX_STOP_STRINGS];
    int n_stops;
    int chat;            /* parse <think> / <tool_call> */
    int parse_tools;     /* tools were given and tool_choice is not "none" */
    int start_reasoning; /* the rendered prompt ends inside <think> */
    int echo_prompt;     /* completions echo */
    int max_tokens_given;
    char *start_tool_body; /* malloc'd; non-NULL: the prompt ends inside a forced <tool_call> whose body so far
                              is this text (tool_choice required / named); freed by the job's owner */
} kn_gen_job;

/* Streaming state of one running generation. */
typedef struct {
    kn_srv *srv;
    kn_request *req;
    kn_detok_stream *detok;
    kn_stop_match stop;
    kn_chat_split split;
    int chat;
    kn_finish finish;
    int stopped_by_string;
    int n_generated;
    int done;
    /* per-pull outputs, reset by kn_gen_pull */
    kn_buf content, reasoning;
    char **tool_bodies; /* complete tool-call bodies found in this pull */
    int n_tool_bodies, cap_tool_bodies;
    kn_token_event *events; /* token events of this pull (for logprobs) */
    int n_events, cap_events;
    int32_t *all_ids;       /* every generated id (completion token ids when there is no tokenizer) */
    int n_all, cap_all;
    char error[256];
} kn_gen_run;

/* Start a job (consumes nothing; job arrays are copied by the engine). On
 * failure fills e (400/429/503) and returns -1. */
int kn_gen_start(kn_srv *s, const kn_gen_job *job, kn_gen_run *g, kn_api_error *e);
/* Block until at least one event or the end; fill g's per-pull outputs.
 * Returns 1 while running, 0 when finished (outputs may still be filled).
 * conn_fd >= 0 is polled: a closed client cancels the request (returns 0). */
int kn_gen_pull(kn_gen_run *g, int conn_fd);
void kn_gen_free(kn_gen_run *g);
/* "stop" | "length" | "tool_calls" ... for OpenAI */
const char *kn_gen_finish_reason(const kn_gen_run *g, int n_tool_calls);

/* Protocol handlers. Return either a complete body (status, *body) or a
 * stream (*stream != NULL). */
typedef struct kn_stream kn_stream;
struct kn_stream {
    /* append more bytes to out; return 1 if more may follow, 0 at the end */
    int (*next)(kn_stream *st, kn_buf *out, int conn_fd);
    void (*free)(kn_stream *st);
};

typedef struct {
    int conn_fd; /* in: the client's socket (polled for disconnects), -1 if unknown */
    int status;
    const char *content_type; /* NULL: application/json */
    kn_buf body;
    kn_stream *stream;
} kn_api_reply;

void kn_api_completions(kn_srv *s, json_t *req, kn_api_reply *out);
void kn_api_chat(kn_srv *s, json_t *req, kn_api_reply *out);
void kn_api_messages(kn_srv *s, json_t *req, kn_api_reply *out);
/* /v1/audio/transcriptions (translate 0) and /v1/audio/translations: a
 * multipart/form-data body (api_audio.c). */
void kn_api_audio(kn_srv *s, int translate, const char *content_type, const char *body, size_t len,
                  kn_api_reply *out);
/* 1 when the client on fd has closed its connection (fd < 0: never). */
int kn_client_gone(int fd);
/* Fill out with e as a JSON error body (OpenAI shape, or Anthropic's when anthropic). */
void kn_api_error_reply(const kn_api_error *e, int anthropic, kn_api_reply *out);

/* Shared by the OpenAI and Anthropic mappings: render messages (+ tools,
 * kwargs) with the chat template and tokenize; *prompt malloc'd. */
int kn_api_render_chat(kn_srv *s, json_t *messages, json_t *tools, json_t *kwargs, int32_t **prompt, int *n_prompt,
                       int *start_reasoning, kn_api_error *e);
/* Common sampling fields (temperature, top_p, top_k, min_p, seed, penalties,
 * stop) into job; anthropic selects its field names. */
int kn_api_sampling(kn_srv *s, json_t *req, kn_gen_job *job, int anthropic, kn_api_error *e);
/* tool_choice "required" (name NULL) or a named function: append
 * "<tool_call>\n" (+ {"name": NAME, "arguments": ) to the rendered prompt so the
 * answer starts inside a call. 400 when the model has no <tool_call> token. */
int kn_api_force_tool_call(kn_srv *s, kn_gen_job *job, const char *name, kn_api_error *e);
/* Random 24-hex id with prefix. */
void kn_api_new_id(char *out, size_t n, const char *prefix);

#endif

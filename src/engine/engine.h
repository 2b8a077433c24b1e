/* engine.h — the serving engine: one thread owns the model and runs an
 * iteration-level scheduler (continuous batching) over many requests.
 *
 * Callers (HTTP threads) submit a prompt of token ids with per-request
 * generation parameters and get a kn_request handle; they read token events
 * from it as the engine produces them (kn_request_next blocks with a
 * timeout), and may cancel it at any time. The engine speaks token ids only:
 * detokenization and stop strings live with the caller (see stop_match.h),
 * which cancels the request when a stop string matches.
 *
 * Thread safety: kn_engine_submit / kn_engine_stats may be called from any
 * thread. A kn_request is used by one consumer thread; kn_request_cancel may
 * also be called from any thread. The model must not be used by anyone else
 * while the engine lives.
 *
 * Ownership: the engine borrows the model (caller closes it after
 * kn_engine_destroy). A request is reference counted between the engine and
 * the consumer; kn_request_release drops the consumer's reference (and
 * cancels the request if it is still running). */
#ifndef KN_ENGINE_ENGINE_H
#define KN_ENGINE_ENGINE_H

#include <stdint.h>

#include "kiln/kiln.h"

#define KN_MAX_STOP_IDS 16
#define KN_MAX_TOP_LOGPROBS 20

typedef struct kn_engine kn_engine;
typedef struct kn_request kn_request;

typedef struct {
    int max_batch;     /* sequences decoding at once; 0 = 8 (capped by the model's max_seqs) */
    int step_tokens;   /* token budget of one forward (decode + prefill chunks); 0 = model max_chunk */
    int max_queue;     /* waiting requests before submit answers KN_SUBMIT_QUEUE_FULL; 0 = 64 */
    int64_t prefix_cache_blocks; /* KV blocks the prefix cache may hold; 0 = no prefix cache */
} kn_engine_options;

/* Per-request generation parameters. Arrays are copied by submit. */
typedef struct {
    kn_sampling s;              /* temperature, top_k, top_p, min_p, seed, max_new_tokens, ignore_eos */
    float repetition_penalty;   /* HF semantics over prompt + output; 1 (or 0) = off */
    float presence_penalty;     /* OpenAI semantics over output tokens; 0 = off */
    float frequency_penalty;    /* OpenAI semantics over output tokens; 0 = off */
    int n_logit_bias;
    const int32_t *logit_bias_ids;
    const float *logit_bias_values;
    int logprobs;      /* 1: report the chosen token's log-probability */
    int top_logprobs;  /* 0..KN_MAX_TOP_LOGPROBS alternatives per token */
    int n_stop_ids;    /* extra stop token ids (besides generation_config's EOS) */
    int32_t stop_ids[KN_MAX_STOP_IDS];
} kn_gen_params;

void kn_gen_params_init(kn_gen_params *p, const kn_model *m);

typedef enum {
    KN_FINISH_NONE = 0,  /* still running */
    KN_FINISH_STOP,      /* EOS or a stop token id */
    KN_FINISH_LENGTH,    /* max_new_tokens or the context end */
    KN_FINISH_CANCELLED, /* kn_request_cancel / release / engine shutdown */
    KN_FINISH_ERROR,     /* the forward pass failed; see kn_request_error */
} kn_finish;

typedef enum {
    KN_SUBMIT_OK = 0,
    KN_SUBMIT_INVALID,    /* bad prompt or parameters (HTTP 400) */
    KN_SUBMIT_TOO_LONG,   /* prompt + max_new_tokens exceed the context or the KV pool (HTTP 400) */
    KN_SUBMIT_QUEUE_FULL, /* HTTP 429 */
    KN_SUBMIT_SHUTDOWN,   /* the engine is stopping (HTTP 503) */
} kn_submit_result;

typedef struct {
    int32_t token;
    float logprob; /* valid when params.logprobs or top_logprobs */
    int n_top;
    int32_t top_ids[KN_MAX_TOP_LOGPROBS];
    float top_logprobs[KN_MAX_TOP_LOGPROBS];
} kn_token_event;

kn_code kn_engine_create(kn_model *m, const kn_engine_options *o, kn_engine **out, kn_error *err);
/* Stop: cancel every request, join the engine thread. Later submits answer
 * KN_SUBMIT_SHUTDOWN; requests still held by consumers stay valid (finished,
 * CANCELLED) until released. Idempotent. */
void kn_engine_shutdown(kn_engine *e);
/* Shutdown (if not done) and free. */
void kn_engine_destroy(kn_engine *e);

/* Queue a request. On KN_SUBMIT_OK *out is a new request (release it). */
kn_submit_result kn_engine_submit(kn_engine *e, const int32_t *prompt, int n_prompt, const kn_gen_params *p,
                                  kn_request **out, kn_error *err);

/* Next event: 1 = *ev filled, 0 = timeout (timeout_ms >= 0; -1 waits), -1 =
 * finished and every event consumed. */
int kn_request_next(kn_request *r, kn_token_event *ev, int timeout_ms);
void kn_request_cancel(kn_request *r);
void kn_request_release(kn_request *r);

kn_finish kn_request_finish(kn_request *r);        /* KN_FINISH_NONE while running */
const char *kn_request_error(kn_request *r);       /* message for KN_FINISH_ERROR, else "" */
int kn_request_prompt_tokens(const kn_request *r);
/* Prompt tokens whose KV came from the prefix cache (valid once the first
 * event was read). */
int kn_request_cached_tokens(const kn_request *r);
int kn_request_generated_tokens(kn_request *r);

/* Counters and gauges for /metrics (a snapshot). */
#define KN_HIST_BUCKETS 12
typedef struct {
    uint64_t requests_submitted, requests_rejected, requests_finished[5]; /* by kn_finish */
    uint64_t prompt_tokens, generated_tokens, steps, step_tokens;
    int queue_depth, running, max_batch;
    int64_t kv_blocks_total, kv_blocks_free, kv_blocks_cached;
    uint64_t prefix_cache_hit_tokens;
    /* cumulative histograms in seconds: le = kn_hist_bounds[i], last = +Inf */
    uint64_t ttft_hist[KN_HIST_BUCKETS + 1], tpot_hist[KN_HIST_BUCKETS + 1], batch_hist[KN_HIST_BUCKETS + 1];
    double ttft_sum, tpot_sum, batch_sum;
    uint64_t ttft_count, tpot_count, batch_count;
} kn_engine_stats;
extern const double kn_hist_bounds_seconds[KN_HIST_BUCKETS];
extern const double kn_hist_bounds_batch[KN_HIST_BUCKETS];

void kn_engine_get_stats(kn_engine *e, kn_engine_stats *out);
const kn_model *kn_engine_model(const kn_engine *e);

#endif

/* engine.c — continuous-batching scheduler (see engine.h).
 *
 * One engine thread loops: admit waiting requests (FIFO) while fewer than
 * max_batch run and the KV pool can hold prompt + max_new_tokens for them;
 * pack one forward of at most step_tokens tokens: first one decode token per
 * decoding sequence, then prefill chunks of prefilling sequences in
 * admission order with the remaining budget (chunked prefill); run it; sample
 * one token per sequence that produced logits; post events; retire finished
 * sequences and free their KV blocks.
 *
 * Request states:  WAITING --admit--> PREFILL --last chunk--> DECODE --> done
 *                     \_________________\_______________________\__cancel/finish
 *
 * Invariants:
 *  1. The KV pool and every running request's engine-side fields are touched
 *     only by the engine thread.
 *  2. A running request holds KV blocks for min(n_prompt + max_new_tokens,
 *     max_context) positions from admission to retirement, so a step never
 *     runs out of blocks (no preemption needed).
 *  3. A request is freed when its reference count (engine + consumer) drops
 *     to zero; the engine's reference is dropped after its finish event.
 *  4. Events of one request are appended in generation order and each one is
 *     read exactly once by kn_request_next. */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/logits_process.h"
#include "engine/sampler.h"
#include "kv/prefix_cache.h"
#include "models/model.h"

#define KN_ENGINE_MAX_BATCH 256

enum { ST_WAITING, ST_PREFILL, ST_DECODE };

struct kn_request {
    kn_engine *e;
    /* immutable after submit (tokens[n_prompt..] are appended by the engine) */
    int32_t *prompt; /* [n_reserve]: the prompt, then the generated tokens */
    int n_prompt, n_reserve;
    atomic_int n_cached;
    kn_gen_params p;
    int32_t *bias_ids;
    float *bias_values;
    /* shared with the consumer, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kn_token_event *events;
    int n_events, cap_events, read_pos;
    kn_finish finish;
    char error[256];
    int refs;
    int n_generated;
    int engine_done; /* the engine dropped its reference; r->e may be gone */
    atomic_int cancel;
    /* engine thread only */
    int state, n_prefilled, n_past, chunk;
    int n_fill; /* prefill target: n_prompt, or the whole sequence while recomputing it (longrope switch) */
    int32_t last_token;
    kn_kv_seq kv;
    kn_rng rng;
    uint32_t *counts;
    uint8_t *seen;
    int32_t *touched; /* the distinct tokens with seen or counts set (penalties), in first-use order */
    int n_touched, cap_touched;
    double t_submit, t_last;
    kn_request *next; /* wait queue link (under e->mu) */
};

struct kn_engine {
    kn_model *m;
    int V, max_batch, step_tokens, max_queue;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    kn_request *wait_head, *wait_tail;
    int n_wait;
    kn_engine_stats stats; /* under mu */
    /* engine thread only */
    kn_request **running;
    int n_running;
    float *logits;
    int32_t *tokens, *pos, *seq, *rows;
    kn_request **row_req;
    kn_kv_seq **seqs;
    kn_sampler_scratch scratch;
    /* sampling of one step: a row's parameters (uniform drawn before the
     * forward, used by whichever side samples), the rows' edits for backend
     * sampling, one row's edits for host sampling, and a token -> edit map */
    kn_sample_params *sparams;
    int32_t *ids;
    kn_logit_edit *edits, *row_edits;
    int32_t *edit_slot; /* [V], -1 between uses */
    kn_prefix_cache *prefix; /* NULL when disabled */
    int rope_switch;         /* longrope: position at which a sequence is recomputed with long factors; -1 = none */
};

const double kn_hist_bounds_seconds[KN_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
const double kn_hist_bounds_batch[KN_HIST_BUCKETS] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void hist_add(uint64_t *h, const double *bounds, double v) {
    int i = 0;
    while (i < KN_HIST_BUCKETS && v > bounds[i]) i++;
    h[i]++;
}

void kn_gen_params_init(kn_gen_params *p, const kn_model *m) {
    memset(p, 0, sizeof *p);
    p->s = kn_sampling_defaults(m);
    p->repetition_penalty = 1.0f;
}

const kn_model *kn_engine_model(const kn_engine *e) { return e->m; }

/* ---- requests ----------------------------------------------------------- */

static void request_free(kn_request *r) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt), free(r->bias_ids), free(r->bias_values), free(r->events);
    free(r->counts), free(r->seen), free(r->touched);
    free(r);
}

static void request_unref(kn_request *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) request_free(r);
}

/* Append an event (engine thread). Returns 0, or -1 when out of memory. */
static int request_push(kn_request *r, const kn_token_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->n_events == r->cap_events) {
        int cap = r->cap_events ? r->cap_events * 2 : 16;
        kn_token_event *ne = realloc(r->events, (size_t)cap * sizeof *ne);
        if (!ne) {
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        r->events = ne, r->cap_events = cap;
    }
    r->events[r->n_events++] = *ev;
    r->n_generated++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* Mark finished and wake the consumer (the engine's reference is dropped by
 * the caller). */
static void request_finish(kn_request *r, kn_finish f, const char *msg) {
    pthread_mutex_lock(&r->mu);
    r->engine_done = 1;
    if (r->finish == KN_FINISH_NONE) {
        r->finish = f;
        if (msg) snprintf(r->error, sizeof r->error, "%s", msg);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int kn_request_next(kn_request *r, kn_token_event *ev, int timeout_ms) {
    pthread_mutex_lock(&r->mu);
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    }
    int rc;
    for (;;) {
        if (r->read_pos < r->n_events) {
            *ev = r->events[r->read_pos++];
            rc = 1;
            break;
        }
        if (r->finish != KN_FINISH_NONE) {
            rc = -1;
            break;
        }
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT) {
            rc = r->read_pos < r->n_events ? (*ev = r->events[r->read_pos++], 1) : (r->finish ? -1 : 0);
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Lock order: r->mu, then e->mu. The engine never takes r->mu while holding
 * e->mu, and sets engine_done (under r->mu) before it may go away. */
static void wake_engine(kn_request *r) {
    pthread_mutex_lock(&r->mu);
    if (!r->engine_done) {
        kn_engine *e = r->e;
        pthread_mutex_lock(&e->mu);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_unlock(&r->mu);
}

void kn_request_cancel(kn_request *r) {
    atomic_store(&r->cancel, 1);
    wake_engine(r);
}

void kn_request_release(kn_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, 1);
    wake_engine(r);
    request_unref(r);
}

kn_finish kn_request_finish(kn_request *r) {
    pthread_mutex_lock(&r->mu);
    kn_finish f = r->finish;
    pthread_mutex_unlock(&r->mu);
    return f;
}

const char *kn_request_error(kn_request *r) { return r->error; }
int kn_request_prompt_tokens(const kn_request *r) { return r->n_prompt; }
int kn_request_cached_tokens(const kn_request *r) { return atomic_load(&r->n_cached); }

int kn_request_generated_tokens(kn_request *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_generated;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- submit ------------------------------------------------------------- */

kn_submit_result kn_engine_submit(kn_engine *e, const int32_t *prompt, int n_prompt, const kn_gen_params *p,
                                  kn_request **out, kn_error *err) {
    *out = NULL;
    kn_model *m = e->m;
    const int V = e->V;
    if (n_prompt <= 0) return kn_fail(err, KN_ERR_INVALID_ARG, "the prompt is empty"), KN_SUBMIT_INVALID;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return kn_fail(err, KN_ERR_INVALID_ARG, "prompt token %d is outside the vocabulary (0..%d)", prompt[i],
                           V - 1),
                   KN_SUBMIT_INVALID;
    if (p->s.max_new_tokens <= 0)
        return kn_fail(err, KN_ERR_INVALID_ARG, "max_tokens must be at least 1"), KN_SUBMIT_INVALID;
    if (p->top_logprobs < 0 || p->top_logprobs > KN_MAX_TOP_LOGPROBS || p->n_stop_ids < 0 ||
        p->n_stop_ids > KN_MAX_STOP_IDS || p->n_logit_bias < 0 || p->n_logit_bias > V)
        return kn_fail(err, KN_ERR_INVALID_ARG, "invalid generation parameters"), KN_SUBMIT_INVALID;
    if ((int64_t)n_prompt + p->s.max_new_tokens > m->max_context)
        return kn_fail(err, KN_ERR_INVALID_ARG,
                       "this model's context is %d tokens; the prompt has %d and max_tokens asks for %d more",
                       m->max_context, n_prompt, p->s.max_new_tokens),
               KN_SUBMIT_TOO_LONG;
    int n_reserve = n_prompt + p->s.max_new_tokens;
    int64_t blocks = (n_reserve + m->kv->block_size - 1) / m->kv->block_size;
    if (blocks > m->kv->n_blocks)
        return kn_fail(err, KN_ERR_INVALID_ARG, "the request needs %lld KV blocks but the cache has %lld in all",
                       (long long)blocks, (long long)m->kv->n_blocks),
               KN_SUBMIT_TOO_LONG;

    kn_request *r = calloc(1, sizeof *r);
    if (!r) return kn_fail(err, KN_ERR_NOMEM, "out of memory"), KN_SUBMIT_INVALID;
    r->e = e;
    r->n_prompt = n_prompt, r->n_reserve = n_reserve;
    r->p = *p;
    r->prompt = malloc((size_t)n_reserve * sizeof *r->prompt);
    int ok = r->prompt != NULL;
    if (ok && p->n_logit_bias > 0) {
        r->bias_ids = malloc((size_t)p->n_logit_bias * sizeof *r->bias_ids);
        r->bias_values = malloc((size_t)p->n_logit_bias * sizeof *r->bias_values);
        ok = r->bias_ids && r->bias_values;
        if (ok) {
            memcpy(r->bias_ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *r->bias_ids);
            memcpy(r->bias_values, p->logit_bias_values, (size_t)p->n_logit_bias * sizeof *r->bias_values);
        }
    }
    r->p.logit_bias_ids = r->bias_ids, r->p.logit_bias_values = r->bias_values;
    if (ok && (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f))
        ok = (r->counts = calloc((size_t)V, sizeof *r->counts)) != NULL;
    if (ok && p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f)
        ok = (r->seen = calloc((size_t)V, 1)) != NULL;
    if (ok && (r->counts || r->seen)) {
        const int64_t cap = (int64_t)n_reserve + p->s.max_new_tokens;
        r->cap_touched = cap < V ? (int)cap : V;
        ok = (r->touched = malloc((size_t)r->cap_touched * sizeof *r->touched)) != NULL;
    }
    if (ok && r->seen)
        for (int i = 0; i < n_prompt; i++)
            if (!r->seen[prompt[i]]) r->seen[prompt[i]] = 1, r->touched[r->n_touched++] = prompt[i];
    if (!ok) {
        free(r->prompt), free(r->bias_ids), free(r->bias_values), free(r->counts), free(r->seen), free(r->touched);
        free(r);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory"), KN_SUBMIT_INVALID;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    kn_rng_seed(&r->rng, p->s.seed);
    r->refs = 2; /* engine + consumer */
    r->state = ST_WAITING;
    r->t_submit = now_seconds();

    pthread_mutex_lock(&e->mu);
    kn_submit_result res = KN_SUBMIT_OK;
    if (e->stop) res = KN_SUBMIT_SHUTDOWN;
    else if (e->n_wait >= e->max_queue) res = KN_SUBMIT_QUEUE_FULL;
    if (res == KN_SUBMIT_OK) {
        if (e->wait_tail) e->wait_tail->next = r;
        else e->wait_head = r;
        e->wait_tail = r;
        e->n_wait++;
        e->stats.requests_submitted++;
        e->stats.queue_depth = e->n_wait;
        pthread_cond_signal(&e->cv);
    } else {
        e->stats.requests_rejected++;
    }
    pthread_mutex_unlock(&e->mu);
    if (res != KN_SUBMIT_OK) {
        if (res == KN_SUBMIT_SHUTDOWN) kn_fail(err, KN_ERR_UNSUPPORTED, "the server is shutting down");
        else kn_fail(err, KN_ERR_NOMEM, "too many requests are waiting (%d); retry later", e->max_queue);
        r->refs = 1;
        request_free(r);
        return res;
    }
    *out = r;
    return KN_SUBMIT_OK;
}

/* ---- the engine thread -------------------------------------------------- */

/* Retire a request the engine holds (running or waiting, already unlinked). */
static void retire(kn_engine *e, kn_request *r, kn_finish f, const char *msg) {
    if (e->prefix && (f == KN_FINISH_STOP || f == KN_FINISH_LENGTH) && r->state == ST_DECODE)
        kn_prefix_cache_insert(e->prefix, &r->kv, r->prompt, r->n_past); /* prompt + answer, for the next turn */
    kn_kv_seq_release(e->m->kv, &r->kv);
    pthread_mutex_lock(&e->mu); /* stats first: a consumer that saw the finish sees them too */
    e->stats.requests_finished[f]++;
    e->stats.kv_blocks_free = e->m->kv->n_free;
    e->stats.kv_blocks_cached = e->prefix ? kn_prefix_cache_size(e->prefix) : 0;
    pthread_mutex_unlock(&e->mu);
    request_finish(r, f, msg);
    request_unref(r);
}

/* Under e->mu: drop cancelled waiting requests, admit from the head. */
static void admit_locked(kn_engine *e, kn_request **cancelled, int *n_cancelled, int max_cancelled) {
    kn_request **pp = &e->wait_head, *prev = NULL;
    while (*pp) {
        kn_request *r = *pp;
        if (atomic_load(&r->cancel) && *n_cancelled < max_cancelled) {
            *pp = r->next;
            if (e->wait_tail == r) e->wait_tail = prev;
            e->n_wait--;
            cancelled[(*n_cancelled)++] = r;
            continue;
        }
        prev = r;
        pp = &r->next;
    }
    while (e->wait_head && e->n_running < e->max_batch) {
        kn_request *r = e->wait_head;
        kn_kv_pool *pool = e->m->kv;
        /* reuse cached KV of the prompt's full blocks (at least one token is left to compute) */
        int cached = e->prefix ? kn_prefix_cache_attach(e->prefix, &r->kv, r->prompt, r->n_prompt - 1) : 0;
        if (kn_kv_seq_reserve(pool, &r->kv, r->n_reserve, NULL) != KN_OK) {
            int64_t need = (r->n_reserve + pool->block_size - 1) / pool->block_size - r->kv.n_blocks;
            if (!e->prefix || kn_prefix_cache_evict(e->prefix, need - pool->n_free) <= 0 ||
                kn_kv_seq_reserve(pool, &r->kv, r->n_reserve, NULL) != KN_OK) {
                kn_kv_seq_release(pool, &r->kv); /* pool short: wait */
                break;
            }
        }
        atomic_store(&r->n_cached, cached);
        r->n_prefilled = r->n_past = cached;
        r->n_fill = r->n_prompt;
        e->stats.prefix_cache_hit_tokens += (uint64_t)cached;
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        r->next = NULL;
        e->n_wait--;
        r->state = ST_PREFILL;
        e->running[e->n_running++] = r;
        e->stats.prompt_tokens += (uint64_t)r->n_prompt;
    }
    e->stats.queue_depth = e->n_wait;
    e->stats.running = e->n_running;
    e->stats.kv_blocks_free = e->m->kv->n_free;
    e->stats.kv_blocks_cached = e->prefix ? kn_prefix_cache_size(e->prefix) : 0;
}

static int is_stop_token(const kn_engine *e, const kn_request *r, int32_t tok) {
    if (!r->p.s.ignore_eos)
        for (int i = 0; i < e->m->cfg.n_eos; i++)
            if (e->m->cfg.eos_token_ids[i] == tok) return 1;
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] == tok) return 1;
    return 0;
}

/* The penalties and logit bias of r as edits (base/sampling.h), distinct
 * tokens, into out[cap]; -1 when they do not fit. Engine thread. */
static int build_edits(kn_engine *e, const kn_request *r, kn_logit_edit *out, int cap) {
    const kn_gen_params *p = &r->p;
    const float rp = p->repetition_penalty;
    const int rep_on = r->seen && rp > 0.0f && rp != 1.0f;
    const int pen_on = r->counts && (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
    int n = 0, fits = 1;
    for (int i = 0; i < r->n_touched && fits; i++) {
        const int32_t t = r->touched[i];
        kn_logit_edit ed = {t, 1.0f, 0.0f, 0.0f};
        if (rep_on && r->seen[t]) ed.rep = rp;
        if (pen_on && r->counts[t]) ed.sub = p->presence_penalty + p->frequency_penalty * (float)r->counts[t];
        if (ed.rep == 1.0f && !(pen_on && r->counts[t])) continue;
        if (n == cap) fits = 0;
        else e->edit_slot[t] = n, out[n++] = ed;
    }
    for (int i = 0; i < p->n_logit_bias && fits; i++) { /* repeated ids: their biases summed */
        const int32_t t = p->logit_bias_ids[i];
        if (t < 0 || t >= e->V) continue;
        if (e->edit_slot[t] >= 0) out[e->edit_slot[t]].add += p->logit_bias_values[i];
        else if (n == cap) fits = 0;
        else e->edit_slot[t] = n, out[n++] = (kn_logit_edit){t, 1.0f, 0.0f, p->logit_bias_values[i]};
    }
    for (int i = 0; i < n; i++) e->edit_slot[out[i].token] = -1;
    return fits ? n : -1;
}

static int wants_logprobs(const kn_request *r) { return r->p.logprobs || r->p.top_logprobs; }

/* Post the token of r (sampled on the backend: token >= 0; else sampled
 * here from row under sp); returns the finish reason (KN_FINISH_NONE to
 * continue). Engine thread. */
static kn_finish sample_and_post(kn_engine *e, kn_request *r, float *row, int32_t token, const kn_sample_params *sp,
                                 double now, double *ttft, double *tpot) {
    const int V = e->V;
    kn_token_event ev = {0};
    if (token >= 0) ev.token = token;
    else {
        const int ne = build_edits(e, r, e->row_edits, V); /* distinct tokens: always fits V */
        kn_logit_edits_apply(row, V, e->row_edits, ne > 0 ? ne : 0);
        ev.token = kn_sample_row(row, V, sp, &e->scratch);
        if (wants_logprobs(r)) kn_logits_logprobs(row, V, ev.token, r->p.top_logprobs, &ev);
    }
    if (request_push(r, &ev)) return KN_FINISH_ERROR;
    int n_gen = kn_request_generated_tokens(r);
    if (n_gen == 1) *ttft = now - r->t_submit;
    else *tpot = now - r->t_last;
    r->t_last = now;
    if (r->touched && !(r->seen && r->seen[ev.token]) && !(r->counts && r->counts[ev.token]) &&
        r->n_touched < r->cap_touched)
        r->touched[r->n_touched++] = ev.token;
    if (r->counts) r->counts[ev.token]++;
    if (r->seen) r->seen[ev.token] = 1;
    r->last_token = ev.token;
    if (r->n_prompt + n_gen - 1 < r->n_reserve) r->prompt[r->n_prompt + n_gen - 1] = ev.token;
    if (is_stop_token(e, r, ev.token)) return KN_FINISH_STOP;
    if (n_gen >= r->p.s.max_new_tokens) return KN_FINISH_LENGTH;
    if (r->n_past >= e->m->max_context) return KN_FINISH_LENGTH;
    return KN_FINISH_NONE;
}

/* One scheduler iteration over the running set. Engine thread. */
static void engine_step(kn_engine *e) {
    kn_model *m = e->m;
    int n = 0, n_seqs = 0, n_rows = 0;
    int32_t rope_len[KN_ENGINE_MAX_BATCH]; /* length-dependent RoPE: a chunked prompt scales for its whole length */
    /* decode tokens first: one per decoding sequence */
    for (int i = 0; i < e->n_running; i++) {
        kn_request *r = e->running[i];
        r->chunk = 0;
        if (r->state != ST_DECODE) continue;
        if (r->n_past == e->rope_switch && r->n_fill <= e->rope_switch && r->n_past < r->n_reserve) {
            /* longrope: the sequence first outgrows original_max_position_embeddings: recompute all of it
             * with the long factors, as transformers' phi3 generate drops its cache (prefilled below) */
            r->state = ST_PREFILL, r->n_prefilled = 0, r->n_fill = r->n_past + 1;
            continue;
        }
        e->tokens[n] = r->last_token, e->pos[n] = r->n_past, e->seq[n] = n_seqs;
        e->rows[n_rows] = n, e->row_req[n_rows++] = r;
        rope_len[n_seqs] = 0;
        e->seqs[n_seqs++] = &r->kv;
        r->chunk = 1;
        n++;
    }
    /* prefill chunks with what is left of the budget */
    for (int i = 0; i < e->n_running && n < e->step_tokens; i++) {
        kn_request *r = e->running[i];
        if (r->state != ST_PREFILL) continue;
        int c = r->n_fill - r->n_prefilled, room = e->step_tokens - n;
        if (c > room) c = room;
        c = kn_kv_max_append(e->m->kv, &r->kv, r->n_prefilled, c); /* never straddle --kv-start */
        for (int k = 0; k < c; k++) {
            e->tokens[n + k] = r->prompt[r->n_prefilled + k];
            e->pos[n + k] = r->n_prefilled + k;
            e->seq[n + k] = n_seqs;
        }
        if (r->n_prefilled + c == r->n_fill) e->rows[n_rows] = n + c - 1, e->row_req[n_rows++] = r;
        rope_len[n_seqs] = r->n_fill;
        e->seqs[n_seqs++] = &r->kv;
        r->chunk = c;
        n += c;
    }
    if (n == 0) return;
    kn_batch b = {.n_tokens = n, .tokens = e->tokens, .pos = e->pos, .seq = e->seq, .n_seqs = n_seqs,
                  .seqs = e->seqs, .n_logits = n_rows, .logit_rows = e->rows, .rope_len = rope_len};
    /* every row's uniform is drawn now (one per sampled token, whichever side samples); rows are sampled on
     * the backend, so only ids cross, unless one wants log-probabilities or the edits overflow */
    int on_backend = kn_model_samples_on_backend(m), n_edits = 0;
    for (int k = 0; k < n_rows; k++) {
        kn_request *r = e->row_req[k];
        e->sparams[k] = kn_sample_params_draw(&r->p.s, &r->rng);
        if (wants_logprobs(r)) on_backend = 0;
        if (!on_backend) continue;
        const int ne = build_edits(e, r, e->edits + n_edits, KN_SAMPLE_MAX_EDITS - n_edits);
        if (ne < 0) on_backend = 0;
        else e->sparams[k].edit0 = n_edits, e->sparams[k].n_edits = ne, n_edits += ne;
    }
    if (on_backend) b.sample = e->sparams, b.edits = e->edits, b.n_edits = n_edits, b.argmax = e->ids;
    kn_error err = {0};
    kn_code rc = kn_model_forward(m, &b, e->logits, &err);
    if (rc) { /* fail every sequence of this batch; the server keeps serving */
        for (int i = 0; i < e->n_running; i++) {
            kn_request *r = e->running[i];
            if (r->chunk) {
                retire(e, r, KN_FINISH_ERROR, err.msg);
                e->running[i] = NULL;
            }
        }
    } else {
        for (int i = 0; i < e->n_running; i++) {
            kn_request *r = e->running[i];
            if (!r->chunk) continue;
            if (r->state == ST_DECODE) r->n_past++;
            else {
                r->n_prefilled += r->chunk, r->n_past = r->n_prefilled;
                if (e->prefix && r->n_prefilled == r->n_prompt && r->n_fill == r->n_prompt) /* shareable next */
                    kn_prefix_cache_insert(e->prefix, &r->kv, r->prompt, r->n_prompt);
            }
            r->kv.n_tokens = r->n_past;
        }
        double now = now_seconds(), ttft_sum = 0, tpot_sum = 0;
        double ttft[KN_ENGINE_MAX_BATCH], tpot[KN_ENGINE_MAX_BATCH];
        int n_ttft = 0, n_tpot = 0;
        for (int k = 0; k < n_rows; k++) {
            kn_request *r = e->row_req[k];
            double t1 = -1, t2 = -1;
            kn_finish f = sample_and_post(e, r, e->logits + (size_t)k * e->V, on_backend ? e->ids[k] : -1,
                                          &e->sparams[k], now, &t1, &t2);
            if (t1 >= 0) ttft[n_ttft++] = t1, ttft_sum += t1;
            if (t2 >= 0) tpot[n_tpot++] = t2, tpot_sum += t2;
            r->state = ST_DECODE;
            if (f != KN_FINISH_NONE) {
                for (int i = 0; i < e->n_running; i++)
                    if (e->running[i] == r) e->running[i] = NULL;
                retire(e, r, f, f == KN_FINISH_ERROR ? "out of memory for events" : NULL);
            }
        }
        pthread_mutex_lock(&e->mu);
        kn_engine_stats *s = &e->stats;
        s->steps++, s->step_tokens += (uint64_t)n, s->generated_tokens += (uint64_t)n_rows;
        hist_add(s->batch_hist, kn_hist_bounds_batch, n_seqs), s->batch_sum += n_seqs, s->batch_count++;
        for (int i = 0; i < n_ttft; i++) hist_add(s->ttft_hist, kn_hist_bounds_seconds, ttft[i]);
        for (int i = 0; i < n_tpot; i++) hist_add(s->tpot_hist, kn_hist_bounds_seconds, tpot[i]);
        s->ttft_sum += ttft_sum, s->ttft_count += (uint64_t)n_ttft;
        s->tpot_sum += tpot_sum, s->tpot_count += (uint64_t)n_tpot;
        pthread_mutex_unlock(&e->mu);
    }
    /* compact the running list, keeping admission order */
    int j = 0;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]) e->running[j++] = e->running[i];
    e->n_running = j;
}

static void *engine_main(void *arg) {
    kn_engine *e = arg;
    kn_request *cancelled[64];
    for (;;) {
        /* cancelled running requests leave before the step */
        for (int i = 0; i < e->n_running; i++) {
            kn_request *r = e->running[i];
            if (atomic_load(&r->cancel)) {
                retire(e, r, KN_FINISH_CANCELLED, NULL);
                e->running[i] = NULL;
            }
        }
        int j = 0;
        for (int i = 0; i < e->n_running; i++)
            if (e->running[i]) e->running[j++] = e->running[i];
        e->n_running = j;

        int n_cancelled = 0, stop;
        pthread_mutex_lock(&e->mu);
        for (;;) {
            stop = e->stop;
            if (stop) break;
            admit_locked(e, cancelled, &n_cancelled, 64);
            if (e->n_running > 0 || n_cancelled > 0) break;
            if (e->wait_head) { /* pool short with nothing running cannot last; poll */
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_nsec += 10000000L;
                if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&e->cv, &e->mu, &dl);
            } else {
                pthread_cond_wait(&e->cv, &e->mu);
            }
        }
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n_cancelled; i++) retire(e, cancelled[i], KN_FINISH_CANCELLED, NULL);
        if (stop) break;
        engine_step(e);
    }
    /* shutdown: cancel everything still held */
    for (int i = 0; i < e->n_running; i++) retire(e, e->running[i], KN_FINISH_CANCELLED, "the server is shutting down");
    e->n_running = 0;
    pthread_mutex_lock(&e->mu);
    kn_request *r = e->wait_head;
    e->wait_head = e->wait_tail = NULL;
    e->n_wait = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        kn_request *next = r->next;
        retire(e, r, KN_FINISH_CANCELLED, "the server is shutting down");
        r = next;
    }
    return NULL;
}

/* ---- create / destroy --------------------------------------------------- */

kn_code kn_engine_create(kn_model *m, const kn_engine_options *o, kn_engine **out, kn_error *err) {
    *out = NULL;
    kn_engine_options opt = {0};
    if (o) opt = *o;
    kn_engine *e = calloc(1, sizeof *e);
    if (!e) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    e->m = m;
    e->V = m->cfg.vocab_size;
    e->max_batch = opt.max_batch > 0 ? opt.max_batch : 8;
    if (e->max_batch > m->max_seqs) e->max_batch = m->max_seqs;
    if (e->max_batch > KN_ENGINE_MAX_BATCH) e->max_batch = KN_ENGINE_MAX_BATCH;
    e->step_tokens = opt.step_tokens > 0 && opt.step_tokens < m->max_chunk ? opt.step_tokens : m->max_chunk;
    if (e->step_tokens < e->max_batch) e->step_tokens = e->max_batch;
    e->max_queue = opt.max_queue > 0 ? opt.max_queue : 64;
    e->stats.max_batch = e->max_batch;
    e->stats.kv_blocks_total = m->kv->n_blocks;
    e->stats.kv_blocks_free = m->kv->n_free;
    const size_t T = (size_t)e->step_tokens;
    e->running = calloc((size_t)e->max_batch, sizeof *e->running);
    e->logits = malloc((size_t)e->max_batch * (size_t)e->V * sizeof(float));
    e->tokens = malloc(T * 4), e->pos = malloc(T * 4), e->seq = malloc(T * 4);
    e->rows = malloc((size_t)e->max_batch * 4);
    e->row_req = calloc((size_t)e->max_batch, sizeof *e->row_req);
    e->seqs = calloc((size_t)e->max_batch, sizeof *e->seqs);
    e->sparams = calloc((size_t)e->max_batch, sizeof *e->sparams);
    e->ids = malloc((size_t)e->max_batch * sizeof *e->ids);
    e->edits = malloc(KN_SAMPLE_MAX_EDITS * sizeof *e->edits);
    e->row_edits = malloc((size_t)e->V * sizeof *e->row_edits);
    e->edit_slot = malloc((size_t)e->V * sizeof *e->edit_slot);
    if (e->edit_slot) memset(e->edit_slot, 0xff, (size_t)e->V * sizeof *e->edit_slot);
    kn_code rc = KN_OK;
    if (!e->running || !e->logits || !e->tokens || !e->pos || !e->seq || !e->rows || !e->row_req || !e->seqs ||
        !e->sparams || !e->ids || !e->edits || !e->row_edits || !e->edit_slot)
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for the engine");
    if (!rc) rc = kn_sampler_scratch_init(&e->scratch, e->V, err);
    /* no prefix to share where sliding-window rings keep only a sequence's last window, or where RoPE
     * depends on the sequence's length (a prefix's K/V then depends on what follows it) */
    e->rope_switch = m->cfg.rope.type == KN_ROPE_LONGROPE ? m->cfg.rope.original_max_position_embeddings : -1;
    if (!rc && opt.prefix_cache_blocks > 0 && !m->kv->ring && !m->rope_runs)
        rc = kn_prefix_cache_create(m->kv, opt.prefix_cache_blocks, &e->prefix, err);
    if (!rc) {
        pthread_mutex_init(&e->mu, NULL);
        pthread_cond_init(&e->cv, NULL);
        if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
            pthread_mutex_destroy(&e->mu);
            pthread_cond_destroy(&e->cv);
            rc = kn_fail(err, KN_ERR_INTERNAL, "cannot start the engine thread");
        } else {
            e->thread_started = 1;
        }
    }
    if (rc) {
        kn_prefix_cache_destroy(e->prefix);
        kn_sampler_scratch_free(&e->scratch);
        free(e->running), free(e->logits), free(e->tokens), free(e->pos), free(e->seq), free(e->rows);
        free(e->row_req), free(e->seqs), free(e->sparams), free(e->ids), free(e->edits), free(e->row_edits);
        free(e->edit_slot), free(e);
        return rc;
    }
    *out = e;
    return KN_OK;
}

void kn_engine_shutdown(kn_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    e->thread_started = 0;
}

void kn_engine_destroy(kn_engine *e) {
    if (!e) return;
    kn_engine_shutdown(e);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    kn_prefix_cache_destroy(e->prefix);
    kn_sampler_scratch_free(&e->scratch);
    free(e->running), free(e->logits), free(e->tokens), free(e->pos), free(e->seq), free(e->rows);
    free(e->row_req), free(e->seqs), free(e->sparams), free(e->ids), free(e->edits), free(e->row_edits);
    free(e->edit_slot), free(e);
}

void kn_engine_get_stats(kn_engine *e, kn_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}

/* test_scheduler.c — the continuous-batching engine against the oracle and
 * against serial generation:
 *  - a lone greedy request reproduces transformers' greedy continuation
 *    (tests/fixtures/<name>/reference.json) and kn_generate;
 *  - 8 concurrent requests with different prompt lengths and max_tokens,
 *    admitted at once and decoded in one batch, each give exactly their solo
 *    tokens (batch invariance), also with a tiny step budget (chunked
 *    prefill interleaved with decode);
 *  - with a KV pool smaller than the demand, requests wait and still finish
 *    with the right tokens; cancellation frees every block;
 *  - refusals: context overflow, out-of-vocab ids, full queue;
 *  - per-row sampling: seeds reproduce, logit_bias forces a token, stop ids,
 *    logprobs are normalised and top_logprobs sorted;
 *  - the trained chat fixture (tests/fixtures/server_chat): 10 chat and
 *    completion prompts submitted at once, with generation_config defaults
 *    (greedy, EOS ids [im_end, endoftext]), each give transformers' greedy
 *    ids, stopping at EOS exactly where transformers did. */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "models/model.h"
#include "test_util.h"

#define MAXTOK 128

typedef struct {
    int32_t ids[64], greedy[64];
    int n_ids, n_prompt, n_greedy;
} reference;

static int load_reference(const char *dir, reference *r) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        CHECK(0, "%s: %s", path, je.text);
        return -1;
    }
    json_t *ids = json_object_get(root, "ids"), *pr = json_object_get(root, "prompt"),
           *gr = json_object_get(root, "greedy");
    r->n_ids = (int)json_array_size(ids), r->n_prompt = (int)json_array_size(pr), r->n_greedy = (int)json_array_size(gr);
    for (int i = 0; i < r->n_ids && i < 64; i++) r->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    for (int i = 0; i < r->n_greedy && i < 64; i++) r->greedy[i] = (int32_t)json_integer_value(json_array_get(gr, i));
    json_decref(root);
    return r->n_ids > 0 && r->n_greedy > 0 ? 0 : -1;
}

typedef struct {
    int32_t toks[MAXTOK];
    int n;
} tokbuf;

static int collect_cb(int32_t t, void *u) {
    tokbuf *b = u;
    if (b->n < MAXTOK) b->toks[b->n++] = t;
    return 0;
}

/* drain a request; returns its finish reason */
static kn_finish drain(kn_request *r, tokbuf *b, kn_token_event *last) {
    kn_token_event ev;
    b->n = 0;
    int rc;
    while ((rc = kn_request_next(r, &ev, -1)) == 1) {
        if (b->n < MAXTOK) b->toks[b->n++] = ev.token;
        if (last) *last = ev;
    }
    return kn_request_finish(r);
}

static int same(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
}

static kn_model *open_model(const char *dir, int max_seqs, int max_context) {
    kn_model_options o = {.backend = getenv("KILN_TEST_BACKEND"), .max_seqs = max_seqs, .max_context = max_context};
    kn_model *m = NULL;
    kn_error err = {0};
    if (kn_model_open(dir, &o, &m, &err)) CHECK(0, "open %s: %s", dir, err.msg);
    return m;
}

/* prompt lengths / max_tokens for the concurrent mix */
static const int mix_len[8] = {16, 3, 40, 1, 25, 9, 33, 16};
static const int mix_gen[8] = {24, 30, 12, 20, 7, 40, 18, 1};

/* max_context > 0: a context long enough that sliding-window layers live in
 * a ring (kv_paged.h); the engine is then asked for a prefix cache, which a
 * ring model must decline without changing any result. */
static void check_batch_invariance(const char *name, int max_context) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", kn_test_fixtures(), name);
    reference ref;
    if (load_reference(dir, &ref)) return;
    kn_model *m = open_model(dir, 8, max_context);
    if (!m) return;
    if (max_context) CHECK(m->kv->ring != NULL, "%s: context %d has no sliding-window ring", name, max_context);
    kn_error err = {0};
    /* solo runs through kn_generate (serial generation, no engine) */
    tokbuf solo[8];
    for (int i = 0; i < 8; i++) {
        kn_sampling s = kn_sampling_defaults(m);
        s.temperature = 0, s.max_new_tokens = mix_gen[i], s.ignore_eos = 1;
        solo[i].n = 0;
        kn_code rc = kn_generate(m, ref.ids, mix_len[i], &s, collect_cb, &solo[i], NULL, &err);
        CHECK(rc == KN_OK, "%s: kn_generate: %s", name, err.msg);
    }
    for (int budget_i = 0; budget_i < 2; budget_i++) {
        kn_engine_options eo = {.max_batch = 8, .step_tokens = budget_i ? 12 : 0,
                                .prefix_cache_blocks = max_context ? 64 : 0};
        kn_engine *e;
        if (kn_engine_create(m, &eo, &e, &err)) {
            CHECK(0, "%s: engine: %s", name, err.msg);
            break;
        }
        /* a lone request equals the oracle */
        kn_gen_params p;
        kn_gen_params_init(&p, m);
        p.s.temperature = 0, p.s.max_new_tokens = ref.n_greedy, p.s.ignore_eos = 1;
        kn_request *r;
        CHECK(kn_engine_submit(e, ref.ids, ref.n_prompt, &p, &r, &err) == KN_SUBMIT_OK, "submit: %s", err.msg);
        tokbuf b;
        kn_finish f = drain(r, &b, NULL);
        CHECK(f == KN_FINISH_LENGTH, "%s: lone finish %d", name, f);
        CHECK(same(b.toks, b.n, ref.greedy, ref.n_greedy), "%s (budget %d): lone request differs from transformers",
              name, eo.step_tokens);
        CHECK(kn_request_prompt_tokens(r) == ref.n_prompt, "prompt token count");
        kn_request_release(r);
        /* 8 at once */
        kn_request *rs[8];
        for (int i = 0; i < 8; i++) {
            p.s.max_new_tokens = mix_gen[i];
            CHECK(kn_engine_submit(e, ref.ids, mix_len[i], &p, &rs[i], &err) == KN_SUBMIT_OK, "submit %d", i);
        }
        for (int i = 0; i < 8; i++) {
            f = drain(rs[i], &b, NULL);
            CHECK(f == KN_FINISH_LENGTH, "%s: row %d finish %d", name, i, f);
            CHECK(same(b.toks, b.n, solo[i].toks, solo[i].n),
                  "%s (budget %d): row %d (prompt %d, gen %d) differs from its solo run (%d vs %d tokens)", name,
                  eo.step_tokens, i, mix_len[i], mix_gen[i], b.n, solo[i].n);
            kn_request_release(rs[i]);
        }
        kn_engine_stats st;
        kn_engine_get_stats(e, &st);
        CHECK(st.kv_blocks_free == st.kv_blocks_total, "%s: %lld of %lld KV blocks free after all finished", name,
              (long long)st.kv_blocks_free, (long long)st.kv_blocks_total);
        CHECK(st.requests_finished[KN_FINISH_LENGTH] == 9, "finished count %llu",
              (unsigned long long)st.requests_finished[KN_FINISH_LENGTH]);
        if (budget_i == 0) CHECK(st.batch_hist[KN_HIST_BUCKETS] == 0 && st.batch_sum > st.batch_count, "no batching seen");
        kn_engine_destroy(e);
    }
    kn_model_close(m);
}

/* longrope (phi3_longrope fixture, switch at 24): requests that cross the
 * switch are recomputed with the long factors by the engine exactly as
 * kn_generate does, chunked (step budget 12) or not, alone or batched with
 * requests whose prompts are already past it. */
static void check_longrope_switch(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/phi3_longrope", kn_test_fixtures());
    reference ref;
    if (load_reference(dir, &ref)) return;
    kn_model *m = open_model(dir, 4, 0);
    if (!m) return;
    kn_error err = {0};
    static const int len[3] = {16, 5, 30}, gen[3] = {20, 30, 8};
    tokbuf solo[3];
    for (int i = 0; i < 3; i++) {
        kn_sampling s = kn_sampling_defaults(m);
        s.temperature = 0, s.max_new_tokens = gen[i], s.ignore_eos = 1;
        solo[i].n = 0;
        CHECK(kn_generate(m, ref.ids, len[i], &s, collect_cb, &solo[i], NULL, &err) == KN_OK, "generate: %s", err.msg);
    }
    for (int budget_i = 0; budget_i < 2; budget_i++) {
        kn_engine_options eo = {.max_batch = 4, .step_tokens = budget_i ? 12 : 0, .prefix_cache_blocks = 16};
        kn_engine *e;
        if (kn_engine_create(m, &eo, &e, &err)) {
            CHECK(0, "longrope engine: %s", err.msg);
            break;
        }
        kn_gen_params p;
        kn_gen_params_init(&p, m);
        p.s.temperature = 0, p.s.ignore_eos = 1;
        kn_request *rs[3];
        for (int i = 0; i < 3; i++) {
            p.s.max_new_tokens = gen[i];
            CHECK(kn_engine_submit(e, ref.ids, len[i], &p, &rs[i], &err) == KN_SUBMIT_OK, "submit %d", i);
        }
        for (int i = 0; i < 3; i++) {
            tokbuf b;
            CHECK(drain(rs[i], &b, NULL) == KN_FINISH_LENGTH, "longrope row %d finish", i);
            CHECK(same(b.toks, b.n, solo[i].toks, solo[i].n), "longrope (budget %d): row %d (prompt %d) differs from "
                  "kn_generate", eo.step_tokens, i, len[i]);
            kn_request_release(rs[i]);
        }
        kn_engine_destroy(e);
    }
    kn_model_close(m);
}

/* A KV pool shorter than the demand: a dummy sequence takes 10 of the 16
 * blocks, each request needs 5 (20 + 60 positions), so with max_batch 2 only
 * one fits at a time: the others wait (not refused) and all finish equal to
 * the solo run. */
static void check_pool_wait(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/llama", kn_test_fixtures());
    reference ref;
    if (load_reference(dir, &ref)) return;
    kn_model *m = open_model(dir, 2, 128); /* pool: 2 * 8 blocks of 16 */
    if (!m) return;
    kn_error err = {0};
    kn_sampling s = kn_sampling_defaults(m);
    s.temperature = 0, s.max_new_tokens = 60, s.ignore_eos = 1;
    tokbuf solo;
    solo.n = 0;
    kn_generate(m, ref.ids, 20, &s, collect_cb, &solo, NULL, &err);
    kn_kv_seq dummy = {0};
    CHECK(kn_kv_seq_reserve(m->kv, &dummy, 160, &err) == KN_OK && m->kv->n_free == 6, "dummy reservation");
    kn_engine_options eo = {.max_batch = 2};
    kn_engine *e;
    if (kn_engine_create(m, &eo, &e, &err)) {
        CHECK(0, "engine: %s", err.msg);
        kn_model_close(m);
        return;
    }
    kn_gen_params p;
    kn_gen_params_init(&p, m);
    p.s = s;
    kn_request *rs[5];
    for (int i = 0; i < 5; i++) CHECK(kn_engine_submit(e, ref.ids, 20, &p, &rs[i], &err) == KN_SUBMIT_OK, "submit");
    for (int i = 0; i < 5; i++) {
        tokbuf b;
        CHECK(drain(rs[i], &b, NULL) == KN_FINISH_LENGTH, "pool wait: finish");
        CHECK(same(b.toks, b.n, solo.toks, solo.n), "pool wait: request %d differs from solo", i);
        kn_request_release(rs[i]);
    }
    /* too big for the whole pool / the context: refused, not queued */
    p.s.max_new_tokens = 120;
    kn_request *r = NULL;
    CHECK(kn_engine_submit(e, ref.ids, 20, &p, &r, &err) == KN_SUBMIT_TOO_LONG && !r, "context overflow accepted");
    CHECK(strstr(err.msg, "context") != NULL, "unclear message: %s", err.msg);
    p.s.max_new_tokens = 4;
    int32_t bad[2] = {5, 100000};
    CHECK(kn_engine_submit(e, bad, 2, &p, &r, &err) == KN_SUBMIT_INVALID, "out-of-vocab id accepted");
    CHECK(kn_engine_submit(e, bad, 0, &p, &r, &err) == KN_SUBMIT_INVALID, "empty prompt accepted");
    p.s.max_new_tokens = 0;
    CHECK(kn_engine_submit(e, ref.ids, 3, &p, &r, &err) == KN_SUBMIT_INVALID, "max_tokens 0 accepted");
    kn_engine_stats st;
    kn_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_free == 6, "pool wait: %lld blocks free, expected the 6 not held by the dummy",
          (long long)st.kv_blocks_free);
    kn_engine_destroy(e);
    kn_kv_seq_release(m->kv, &dummy);
    kn_model_close(m);
}

static void check_cancel_and_queue(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/llama", kn_test_fixtures());
    reference ref;
    if (load_reference(dir, &ref)) return;
    /* a long context and generation: the engine must not finish a before the test cancels it, however the
     * threads are scheduled (at ~20 us a step, 4000 steps take far longer than the few calls in between) */
    kn_model *m = open_model(dir, 1, 4096);
    if (!m) return;
    kn_error err = {0};
    kn_engine_options eo = {.max_batch = 1, .max_queue = 1};
    kn_engine *e;
    if (kn_engine_create(m, &eo, &e, &err)) {
        kn_model_close(m);
        return;
    }
    kn_gen_params p;
    kn_gen_params_init(&p, m);
    p.s.temperature = 0, p.s.ignore_eos = 1, p.s.max_new_tokens = 4096 - 8;
    kn_request *a, *rs[8];
    CHECK(kn_engine_submit(e, ref.ids, 8, &p, &a, &err) == KN_SUBMIT_OK, "submit a");
    kn_token_event ev;
    CHECK(kn_request_next(a, &ev, -1) == 1, "first event"); /* a is running now */
    int n_ok = 0, n_full = 0;
    for (int i = 0; i < 8; i++) {
        kn_submit_result sr = kn_engine_submit(e, ref.ids, 8, &p, &rs[i], &err);
        if (sr == KN_SUBMIT_OK) n_ok++;
        else if (sr == KN_SUBMIT_QUEUE_FULL) n_full++;
        if (sr != KN_SUBMIT_OK) rs[i] = NULL;
    }
    /* a occupies the only slot until cancelled; the queue holds at most one */
    CHECK(n_ok <= 2 && n_full >= 6, "queue limit not enforced: %d accepted, %d refused", n_ok, n_full);
    kn_request_cancel(a);
    tokbuf b;
    CHECK(drain(a, &b, NULL) == KN_FINISH_CANCELLED, "cancel: finish reason");
    CHECK(b.n < 4096 - 8 - 1, "cancel did not stop generation (%d tokens)", b.n);
    kn_request_release(a);
    for (int i = 0; i < 8; i++)
        if (rs[i]) kn_request_release(rs[i]); /* release = cancel */
    /* every block returns once the engine sees the cancellations */
    kn_request *z;
    p.s.max_new_tokens = 2;
    for (int tries = 0; tries < 1000; tries++) {
        kn_submit_result sr = kn_engine_submit(e, ref.ids, 3, &p, &z, &err);
        if (sr == KN_SUBMIT_OK) {
            drain(z, &b, NULL);
            kn_request_release(z);
            break;
        }
        usleep(1000);
    }
    kn_engine_stats st;
    kn_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_free == st.kv_blocks_total, "blocks leaked after cancel: %lld of %lld free",
          (long long)st.kv_blocks_free, (long long)st.kv_blocks_total);
    CHECK(st.requests_finished[KN_FINISH_CANCELLED] >= 1, "no cancellation counted");
    /* a request released by the consumer before the engine saw it */
    p.s.max_new_tokens = 50;
    CHECK(kn_engine_submit(e, ref.ids, 8, &p, &z, &err) == KN_SUBMIT_OK, "submit z");
    kn_request_release(z);
    kn_engine_destroy(e); /* must not hang or leak (ASan) */
    kn_model_close(m);
}

static void check_sampling(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/llama", kn_test_fixtures());
    reference ref;
    if (load_reference(dir, &ref)) return;
    kn_model *m = open_model(dir, 8, 0);
    if (!m) return;
    kn_error err = {0};
    kn_engine *e;
    if (kn_engine_create(m, NULL, &e, &err)) {
        kn_model_close(m);
        return;
    }
    kn_gen_params p;
    kn_gen_params_init(&p, m);
    p.s.temperature = 1.0f, p.s.top_p = 0.95f, p.s.top_k = 0, p.s.max_new_tokens = 20, p.s.ignore_eos = 1;
    /* seeds: 3 with seed 11 and 1 with seed 12 in one batch */
    kn_request *rs[4];
    for (int i = 0; i < 4; i++) {
        p.s.seed = i < 3 ? 11 : 12;
        kn_engine_submit(e, ref.ids, 10 + (i == 1), &p, &rs[i], &err);
    }
    tokbuf b[4];
    for (int i = 0; i < 4; i++) drain(rs[i], &b[i], NULL), kn_request_release(rs[i]);
    CHECK(same(b[0].toks, b[0].n, b[2].toks, b[2].n), "same seed + prompt gave different samples in one batch");
    CHECK(!same(b[0].toks, b[0].n, b[3].toks, b[3].n), "different seeds gave identical samples");
    /* logit_bias forces a token */
    kn_gen_params_init(&p, m);
    p.s.temperature = 0, p.s.max_new_tokens = 5, p.s.ignore_eos = 1;
    int32_t bid = 77;
    float bval = 100.0f;
    p.n_logit_bias = 1, p.logit_bias_ids = &bid, p.logit_bias_values = &bval;
    kn_request *r;
    kn_engine_submit(e, ref.ids, 16, &p, &r, &err);
    drain(r, &b[0], NULL), kn_request_release(r);
    int all77 = b[0].n == 5;
    for (int i = 0; i < b[0].n; i++) all77 &= b[0].toks[i] == 77;
    CHECK(all77, "logit_bias +100 did not force token 77");
    /* stop id = the 4th greedy token: finish STOP after 4 tokens */
    kn_gen_params_init(&p, m);
    p.s.temperature = 0, p.s.max_new_tokens = 24, p.s.ignore_eos = 1;
    int stop_at = 3;
    while (stop_at < ref.n_greedy) { /* first occurrence must be at stop_at */
        int dup = 0;
        for (int i = 0; i < stop_at; i++) dup |= ref.greedy[i] == ref.greedy[stop_at];
        if (!dup) break;
        stop_at++;
    }
    p.n_stop_ids = 1, p.stop_ids[0] = ref.greedy[stop_at];
    p.logprobs = 1, p.top_logprobs = 5;
    kn_token_event last = {0};
    kn_engine_submit(e, ref.ids, ref.n_prompt, &p, &r, &err);
    kn_finish f = drain(r, &b[0], &last);
    kn_request_release(r);
    CHECK(f == KN_FINISH_STOP && b[0].n == stop_at + 1, "stop id: finish %d after %d tokens", f, b[0].n);
    CHECK(last.n_top == 5 && last.top_ids[0] == last.token && last.top_logprobs[0] == last.logprob,
          "greedy token is not the top logprob");
    for (int i = 1; i < last.n_top; i++) CHECK(last.top_logprobs[i] <= last.top_logprobs[i - 1], "top_logprobs unsorted");
    CHECK(last.logprob <= 0.0f && last.logprob > -20.0f, "logprob %g", last.logprob);
    /* repetition penalty changes a repetitive greedy run; presence penalty too */
    kn_gen_params_init(&p, m);
    p.s.temperature = 0, p.s.max_new_tokens = 24, p.s.ignore_eos = 1, p.presence_penalty = 2.0f;
    kn_engine_submit(e, ref.ids, ref.n_prompt, &p, &r, &err);
    drain(r, &b[0], NULL), kn_request_release(r);
    int distinct = 1;
    for (int i = 0; i < b[0].n; i++)
        for (int j = 0; j < i; j++) distinct &= b[0].toks[i] != b[0].toks[j];
    CHECK(distinct, "presence_penalty 2 still repeats a token (logits span ~5)");
    kn_engine_destroy(e);
    kn_model_close(m);
}

static void check_server_chat(void) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/server_chat", kn_test_fixtures());
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        CHECK(0, "%s: %s", path, je.text);
        return;
    }
    kn_model *m = open_model(dir, 8, 0);
    kn_engine *e = NULL;
    kn_error err = {0};
    if (!m || kn_engine_create(m, NULL, &e, &err)) {
        CHECK(0, "server_chat engine: %s", err.msg);
        kn_model_close(m);
        json_decref(root);
        return;
    }
    json_t *cases = json_object_get(root, "cases");
    int max_new = (int)json_integer_value(json_object_get(root, "max_new_tokens"));
    size_t n = json_array_size(cases);
    kn_request *rs[16] = {0};
    for (size_t i = 0; i < n && i < 16; i++) {
        json_t *pids = json_object_get(json_array_get(cases, i), "prompt_ids");
        int np = (int)json_array_size(pids);
        int32_t *prompt = malloc((size_t)np * sizeof *prompt);
        for (int k = 0; k < np; k++) prompt[k] = (int32_t)json_integer_value(json_array_get(pids, (size_t)k));
        kn_gen_params p;
        kn_gen_params_init(&p, m); /* generation_config.json: greedy, eos [2, 0] */
        p.s.max_new_tokens = max_new;
        CHECK(kn_engine_submit(e, prompt, np, &p, &rs[i], &err) == KN_SUBMIT_OK, "submit: %s", err.msg);
        free(prompt);
    }
    for (size_t i = 0; i < n && i < 16; i++) {
        json_t *c = json_array_get(cases, i), *g = json_object_get(c, "greedy_ids");
        const char *name = json_string_value(json_object_get(c, "name"));
        tokbuf b;
        kn_finish f = drain(rs[i], &b, NULL);
        int ok = b.n == (int)json_array_size(g);
        for (int k = 0; ok && k < b.n; k++) ok = b.toks[k] == json_integer_value(json_array_get(g, (size_t)k));
        CHECK(ok, "server_chat %s: %d tokens differ from transformers' %zu", name, b.n, json_array_size(g));
        int eos = json_is_true(json_object_get(c, "greedy_ends_with_eos"));
        CHECK(f == (eos ? KN_FINISH_STOP : KN_FINISH_LENGTH), "server_chat %s: finish %d", name, f);
        kn_request_release(rs[i]);
    }
    kn_engine_destroy(e);
    kn_model_close(m);
    json_decref(root);
}

/* The kernels behind batched decode: a matmul row's result must not depend
 * on how many rows share the call (1..16 rows, f32 and bf16 weights), bit
 * for bit, so a batched decode gives exactly the solo logits. */
static void check_matmul_batch_invariance_k(int64_t K) {
    kn_backend *be;
    kn_error err = {0};
    if (kn_backend_create(getenv("KILN_TEST_BACKEND"), 2, &be, &err)) {
        CHECK(0, "backend: %s", err.msg);
        return;
    }
    const int64_t N = 300;
    float *wf = malloc((size_t)(N * K) * sizeof *wf);
    uint16_t *wb = malloc((size_t)(N * K) * sizeof *wb);
    float *xh = malloc(16 * (size_t)K * sizeof *xh), *o1 = malloc((size_t)N * sizeof *o1),
          *om = malloc(16 * (size_t)N * sizeof *om);
    uint64_t seed = 99;
    for (int64_t i = 0; i < N * K; i++) {
        wf[i] = kn_test_rand(&seed);
        uint32_t u;
        memcpy(&u, &wf[i], 4);
        wb[i] = (uint16_t)(u >> 16);
    }
    for (int64_t i = 0; i < 16 * K; i++) xh[i] = kn_test_rand(&seed);
    float *x = kn_be_alloc(be, 16 * (size_t)K * 4), *out = kn_be_alloc(be, 16 * (size_t)N * 4);
    kn_be_upload(be, x, xh, 16 * (size_t)K * 4);
    for (int d = 0; d < 2; d++) {
        kn_weight w;
        if (kn_be_weight_load(be, d ? KN_DT_BF16 : KN_DT_F32, N, K, d ? (void *)wb : (void *)wf, 0, &w, &err)) {
            CHECK(0, "weight load: %s", err.msg);
            continue;
        }
        for (int M = 2; M <= 16; M++) {
            be->vt->matmul(be, x, M, &w, NULL, out);
            kn_be_download(be, om, out, (size_t)M * (size_t)N * 4);
            int same = 1;
            for (int r = 0; r < M && same; r++) {
                be->vt->matmul(be, x + (int64_t)r * K, 1, &w, NULL, out);
                kn_be_download(be, o1, out, (size_t)N * 4);
                same = !memcmp(o1, om + (int64_t)r * N, (size_t)N * 4);
            }
            CHECK(same, "%s matmul K=%lld: a row of a %d-row call differs from the same row alone", d ? "bf16" : "f32",
                  (long long)K, M);
        }
        kn_be_weight_free(be, &w);
    }
    kn_be_free(be, x), kn_be_free(be, out);
    free(wf), free(wb), free(xh), free(o1), free(om);
    kn_backend_destroy(be);
}

static void check_matmul_batch_invariance(void) {
    check_matmul_batch_invariance_k(200); /* K not a multiple of 32: scalar tail */
    check_matmul_batch_invariance_k(232); /* and a 32-element step past the last 64 */
}

int main(int argc, char **argv) {
    check_matmul_batch_invariance();
    const char *names[] = {"llama", "phi3", "llama3"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) check_batch_invariance(names[i], 0);
    check_batch_invariance("gemma2", 1024); /* window 8: sliding layer in a ring */
    check_longrope_switch();
    check_pool_wait();
    check_cancel_and_queue();
    check_sampling();
    check_server_chat();
    return kn_test_done("test_scheduler");
}

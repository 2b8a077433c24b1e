/* test_prefix_cache.c — the prefix cache over the paged KV pool: attach
 * shares exactly the full blocks of the longest cached prefix, blocks outlive
 * their sequence while cached, eviction is LRU and never takes a block a
 * sequence still holds, the capacity is respected, and every block returns
 * to the pool at the end. Then through the engine: a repeated prompt reports
 * cached tokens and gives the same greedy tokens, a follow-up turn (prompt +
 * answer + more) hits the blocks of the previous answer, and a full-pool
 * workload evicts cached blocks instead of waiting forever. */
#include <string.h>

#include "engine/engine.h"
#include "kv/prefix_cache.h"
#include "models/model.h"
#include "test_util.h"

static void unit(void) {
    kn_backend *be;
    kn_error err = {0};
    if (kn_backend_create("cpu", 1, &be, &err)) return;
    kn_kv_pool *p;
    kn_kv_pool_create(be, 1, 1, 4, 16, 8, &p, &err);
    kn_prefix_cache *c;
    CHECK(kn_prefix_cache_create(p, 4, &c, &err) == KN_OK, "create: %s", err.msg);
    int32_t t[128], u[128];
    for (int i = 0; i < 128; i++) t[i] = i * 7 % 101, u[i] = t[i];
    u[20] = 999; /* differs inside the second block */
    kn_kv_seq s1 = {0}, s2 = {0}, s3 = {0};
    kn_kv_seq_reserve(p, &s1, 40, &err); /* 3 blocks */
    kn_prefix_cache_insert(c, &s1, t, 40); /* 2 full blocks cached */
    CHECK(kn_prefix_cache_size(c) == 2 && p->refcount[s1.blocks[0]] == 2 && p->refcount[s1.blocks[2]] == 1,
          "insert: size %lld", (long long)kn_prefix_cache_size(c));
    int32_t b0 = s1.blocks[0], b1 = s1.blocks[1];
    kn_kv_seq_release(p, &s1);
    CHECK(p->n_free == 6, "cached blocks must outlive their sequence (free %lld)", (long long)p->n_free);
    CHECK(kn_prefix_cache_attach(c, &s2, t, 39) == 32 && s2.n_blocks == 2 && s2.blocks[0] == b0 && s2.blocks[1] == b1,
          "attach full prefix");
    CHECK(kn_prefix_cache_attach(c, &s3, u, 39) == 16 && s3.n_blocks == 1 && s3.blocks[0] == b0, "attach diverging");
    kn_kv_seq_release(p, &s3);
    CHECK(kn_prefix_cache_attach(c, &s3, t, 15) == 0 && s3.n_blocks == 0, "less than a block attaches nothing");
    CHECK(kn_prefix_cache_evict(c, 10) == 0, "evicted blocks a sequence still holds");
    kn_kv_seq_reserve(p, &s2, 48, &err); /* grows past the shared blocks */
    CHECK(s2.n_blocks == 3 && s2.blocks[0] == b0, "reserve after attach keeps the shared blocks");
    kn_kv_seq_release(p, &s2);
    /* capacity 4: six distinct blocks offered, four kept */
    kn_kv_seq s4 = {0};
    kn_kv_seq_reserve(p, &s4, 96, &err);
    for (int i = 0; i < 96; i++) u[i] = 500 + i;
    kn_prefix_cache_insert(c, &s4, u, 96);
    CHECK(kn_prefix_cache_size(c) <= 4, "capacity exceeded: %lld", (long long)kn_prefix_cache_size(c));
    kn_kv_seq_release(p, &s4);
    int64_t before = p->n_free;
    CHECK(kn_prefix_cache_evict(c, 1) == 1 && p->n_free == before + 1, "LRU eviction frees one block");
    kn_prefix_cache_destroy(c);
    CHECK(p->n_free == 8, "blocks leaked: %lld of 8 free", (long long)p->n_free);
    kn_kv_pool_destroy(p);
    kn_backend_destroy(be);
}

typedef struct {
    int32_t toks[160];
    int n;
} tokbuf;

static void run(kn_engine *e, const int32_t *prompt, int n, int gen, tokbuf *out, int *cached) {
    kn_gen_params p;
    kn_gen_params_init(&p, kn_engine_model(e));
    p.s.temperature = 0, p.s.max_new_tokens = gen, p.s.ignore_eos = 1;
    kn_request *r;
    kn_error err = {0};
    out->n = 0;
    if (kn_engine_submit(e, prompt, n, &p, &r, &err) != KN_SUBMIT_OK) {
        CHECK(0, "submit: %s", err.msg);
        return;
    }
    kn_token_event ev;
    while (kn_request_next(r, &ev, -1) == 1)
        if (out->n < 160) out->toks[out->n++] = ev.token;
    *cached = kn_request_cached_tokens(r);
    kn_request_release(r);
}

static void engine(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/llama", kn_test_fixtures());
    kn_model_options o = {.max_seqs = 4, .max_context = 128};
    kn_model *m;
    kn_error err = {0};
    if (kn_model_open(dir, &o, &m, &err)) {
        CHECK(0, "open: %s", err.msg);
        return;
    }
    int32_t prompt[128];
    for (int i = 0; i < 128; i++) prompt[i] = 3 + (i * 37) % 500;
    /* reference without the cache */
    kn_engine *e;
    kn_engine_options eo = {.max_batch = 4};
    kn_engine_create(m, &eo, &e, &err);
    tokbuf ref, ref2, got;
    int cached;
    run(e, prompt, 40, 24, &ref, &cached);
    CHECK(cached == 0, "cached tokens without a cache");
    kn_engine_destroy(e);
    eo.prefix_cache_blocks = 16;
    kn_engine_create(m, &eo, &e, &err);
    run(e, prompt, 40, 24, &got, &cached);
    CHECK(cached == 0 && got.n == ref.n && !memcmp(got.toks, ref.toks, 4 * (size_t)ref.n), "first run (miss)");
    run(e, prompt, 40, 24, &got, &cached);
    CHECK(cached == 32, "repeat: %d cached tokens, expected 32", cached);
    CHECK(got.n == ref.n && !memcmp(got.toks, ref.toks, 4 * (size_t)ref.n), "repeat with cached prefix differs");
    /* next turn: prompt + answer + 10 more tokens; the answer's blocks were cached at retirement */
    int32_t turn[128];
    memcpy(turn, prompt, 40 * 4);
    memcpy(turn + 40, ref.toks, 24 * 4);
    for (int i = 0; i < 10; i++) turn[64 + i] = 7 + i;
    run(e, turn, 74, 8, &got, &cached);
    CHECK(cached == 48, "follow-up turn: %d cached tokens, expected 48 (prompt + answer blocks)", cached);
    kn_engine_destroy(e);
    kn_engine_create(m, &(kn_engine_options){.max_batch = 4}, &e, &err);
    run(e, turn, 74, 8, &ref2, &cached);
    kn_engine_destroy(e);
    CHECK(got.n == ref2.n && !memcmp(got.toks, ref2.toks, 4 * (size_t)got.n), "follow-up differs from an uncached run");
    /* a workload needing the whole pool (4 x 8 blocks) while the cache holds blocks: evicts, finishes */
    eo.prefix_cache_blocks = 32;
    kn_engine_create(m, &eo, &e, &err);
    run(e, prompt, 100, 20, &got, &cached); /* fills the cache with 7 blocks */
    kn_engine_stats st;
    kn_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_cached >= 6, "cache holds %lld blocks", (long long)st.kv_blocks_cached);
    kn_gen_params p;
    kn_gen_params_init(&p, m);
    p.s.temperature = 0, p.s.max_new_tokens = 120, p.s.ignore_eos = 1;
    kn_request *rs[4];
    for (int i = 0; i < 4; i++) {
        int32_t q[8];
        for (int k = 0; k < 8; k++) q[k] = 11 + 13 * i + k;
        kn_engine_submit(e, q, 8, &p, &rs[i], &err);
    }
    int all = 1;
    for (int i = 0; i < 4; i++) {
        kn_token_event ev;
        int n = 0;
        while (kn_request_next(rs[i], &ev, 30000) == 1) n++;
        all &= n == 120 && kn_request_finish(rs[i]) == KN_FINISH_LENGTH;
        kn_request_release(rs[i]);
    }
    CHECK(all, "full-pool workload did not finish");
    kn_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_free + st.kv_blocks_cached == st.kv_blocks_total, "blocks leaked: free %lld + cached %lld != %lld",
          (long long)st.kv_blocks_free, (long long)st.kv_blocks_cached, (long long)st.kv_blocks_total);
    kn_engine_destroy(e);
    CHECK(m->kv->n_free == m->kv->n_blocks, "engine destroy left blocks held");
    kn_model_close(m);
}

int main(void) {
    unit();
    engine();
    return kn_test_done("test_prefix_cache");
}

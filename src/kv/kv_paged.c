/* kv_paged.c — see kv_paged.h. */
#include "kv/kv_paged.h"

#include <stdlib.h>
#include <string.h>

kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err) {
    *out = NULL;
    if (n_layers < 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || n_blocks <= 0 ||
        n_blocks > INT32_MAX / block_size)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv pool: invalid geometry");
    kn_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory");
    p->be = be;
    p->n_layers = n_layers, p->n_kv_heads = n_kv_heads, p->head_dim = head_dim, p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->layers = calloc((size_t)(n_layers ? n_layers : 1), sizeof *p->layers);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    if (!p->layers || !p->free_list || !p->refcount) goto oom;
    size_t bytes = (size_t)n_blocks * (size_t)block_size * (size_t)n_kv_heads * (size_t)head_dim * sizeof(float);
    for (int l = 0; l < n_layers; l++) {
        kn_kv_layer *L = &p->layers[l];
        L->k = kn_be_alloc(be, bytes);
        L->v = kn_be_alloc(be, bytes);
        if (!L->k || !L->v) goto oom;
        L->block_size = block_size, L->n_kv_heads = n_kv_heads, L->head_dim = head_dim, L->n_blocks = n_blocks;
    }
    /* pop order 0, 1, 2, ...: sequences get ascending blocks */
    for (int64_t i = 0; i < n_blocks; i++) p->free_list[i] = (int32_t)(n_blocks - 1 - i);
    p->n_free = n_blocks;
    *out = p;
    return KN_OK;
oom:
    kn_kv_pool_destroy(p);
    return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory for %lld blocks of %d tokens", (long long)n_blocks,
                   block_size);
}

void kn_kv_pool_destroy(kn_kv_pool *p) {
    if (!p) return;
    if (p->layers)
        for (int l = 0; l < p->n_layers; l++) {
            kn_be_free(p->be, p->layers[l].k);
            kn_be_free(p->be, p->layers[l].v);
        }
    free(p->layers);
    free(p->free_list);
    free(p->refcount);
    kn_kv_pool_destroy(p->ring);
    free(p);
}

kn_code kn_kv_pool_add_ring(kn_kv_pool *p, int n_layers, int n_kv_heads, int head_dim, int ring_blocks,
                            int64_t n_blocks, kn_error *err) {
    if (p->ring || n_layers <= 0 || ring_blocks <= 0 || n_blocks < ring_blocks)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv ring: invalid geometry");
    kn_code rc = kn_kv_pool_create(p->be, n_layers, n_kv_heads, head_dim, p->block_size, n_blocks, &p->ring, err);
    if (!rc) p->ring_blocks = ring_blocks;
    return rc;
}

void kn_kv_seq_ring_table(const kn_kv_pool *p, const kn_kv_seq *s, int32_t *row) {
    for (int i = 0; i < s->n_blocks; i++) row[i] = s->ring[i % p->ring_blocks];
}

/* K+V bytes of one position in this pool's own layers (its ring excluded) */
static int64_t own_bytes_per_token(const kn_kv_pool *p) {
    return (int64_t)p->n_layers * 2 * p->n_kv_heads * p->head_dim * (int64_t)sizeof(float);
}

int64_t kn_kv_seq_bytes(const kn_kv_pool *p, int64_t n_tokens) {
    int64_t b = own_bytes_per_token(p) * n_tokens;
    if (p->ring) {
        int64_t cap = (int64_t)p->ring_blocks * p->block_size;
        b += kn_kv_bytes_per_token(p->ring) * (n_tokens < cap ? n_tokens : cap);
    }
    return b;
}

kn_code kn_kv_seq_reserve(kn_kv_pool *p, kn_kv_seq *s, int n_positions, kn_error *err) {
    int need = (n_positions + p->block_size - 1) / p->block_size;
    if (need <= s->n_blocks) return KN_OK;
    if (need - s->n_blocks > p->n_free)
        return kn_fail(err, KN_ERR_NOMEM, "kv cache full: %d more blocks needed, %lld free", need - s->n_blocks,
                       (long long)p->n_free);
    const int ring_need = p->ring ? (need < p->ring_blocks ? need : p->ring_blocks) : 0;
    if (ring_need > s->n_ring) {
        if (ring_need - s->n_ring > p->ring->n_free)
            return kn_fail(err, KN_ERR_NOMEM, "kv cache full: %d more sliding-window blocks needed, %lld free",
                           ring_need - s->n_ring, (long long)p->ring->n_free);
        if (!s->ring && !(s->ring = malloc((size_t)p->ring_blocks * sizeof *s->ring)))
            return kn_fail(err, KN_ERR_NOMEM, "kv cache: out of memory for the ring table");
    }
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return kn_fail(err, KN_ERR_NOMEM, "kv cache: out of memory for block table");
        s->blocks = nb;
        s->cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t b = p->free_list[--p->n_free];
        p->refcount[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    while (s->n_ring < ring_need) {
        int32_t b = p->ring->free_list[--p->ring->n_free];
        p->ring->refcount[b] = 1;
        s->ring[s->n_ring++] = b;
    }
    return KN_OK;
}

void kn_kv_seq_release(kn_kv_pool *p, kn_kv_seq *s) {
    for (int i = s->n_ring - 1; i >= 0 && p->ring; i--) {
        int32_t b = s->ring[i];
        if (p->ring->refcount[b] && --p->ring->refcount[b] == 0) p->ring->free_list[p->ring->n_free++] = b;
    }
    free(s->ring);
    for (int i = s->n_blocks - 1; i >= 0; i--) {
        int32_t b = s->blocks[i];
        if (p->refcount[b] && --p->refcount[b] == 0) p->free_list[p->n_free++] = b;
    }
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

int64_t kn_kv_bytes_per_token(const kn_kv_pool *p) {
    return own_bytes_per_token(p) + (p->ring ? own_bytes_per_token(p->ring) : 0);
}

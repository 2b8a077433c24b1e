/* prefix_cache.c — see prefix_cache.h.
 *
 * Open-addressing hash table (linear probing, backward-shift deletion) of
 * entry indices; entries live in a fixed array of max_blocks slots with a
 * free-slot stack. LRU is a use counter per entry: eviction scans for the
 * smallest counter among entries whose block only the cache holds. Eviction
 * is rare (the pool is short or the cache is full), so the O(entries) scan
 * is the simple choice over an intrusive list. */
#include "kv/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash, parent;
    uint64_t last_used;
    int32_t block;
    int32_t *tokens; /* [block_size] */
} entry;

struct kn_prefix_cache {
    kn_kv_pool *pool;
    int64_t max_entries, n_entries;
    entry *entries;
    int32_t *tokens;     /* [max_entries * block_size] */
    int64_t *free_slots; /* stack of unused entry indices */
    int64_t n_free_slots;
    int64_t *table; /* [table_size] entry index or -1 */
    int64_t table_size; /* power of two >= 2 * max_entries */
    uint64_t clock, hits;
};

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

static uint64_t block_hash(uint64_t parent, const int32_t *t, int n) {
    uint64_t h = mix(0x84222325cbf29ce4ull, parent);
    for (int i = 0; i < n; i++) h = mix(h, (uint32_t)t[i]);
    return h ? h : 1;
}

kn_code kn_prefix_cache_create(kn_kv_pool *pool, int64_t max_blocks, kn_prefix_cache **out, kn_error *err) {
    *out = NULL;
    if (max_blocks <= 0) return kn_fail(err, KN_ERR_INVALID_ARG, "prefix cache: capacity must be positive");
    if (max_blocks > pool->n_blocks) max_blocks = pool->n_blocks;
    kn_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return kn_fail(err, KN_ERR_NOMEM, "prefix cache: out of memory");
    c->pool = pool;
    c->max_entries = max_blocks;
    c->table_size = 16;
    while (c->table_size < 2 * max_blocks) c->table_size *= 2;
    c->entries = calloc((size_t)max_blocks, sizeof *c->entries);
    c->tokens = malloc((size_t)max_blocks * (size_t)pool->block_size * sizeof *c->tokens);
    c->free_slots = malloc((size_t)max_blocks * sizeof *c->free_slots);
    c->table = malloc((size_t)c->table_size * sizeof *c->table);
    if (!c->entries || !c->tokens || !c->free_slots || !c->table) {
        free(c->entries), free(c->tokens), free(c->free_slots), free(c->table), free(c);
        return kn_fail(err, KN_ERR_NOMEM, "prefix cache: out of memory for %lld blocks", (long long)max_blocks);
    }
    for (int64_t i = 0; i < c->table_size; i++) c->table[i] = -1;
    for (int64_t i = 0; i < max_blocks; i++) {
        c->free_slots[i] = max_blocks - 1 - i;
        c->entries[i].tokens = c->tokens + i * pool->block_size;
    }
    c->n_free_slots = max_blocks;
    *out = c;
    return KN_OK;
}

static void block_unref(kn_kv_pool *p, int32_t b) { kn_kv_block_unref(p, b); }

/* table position of hash (entry index at table[pos], or -1 where it would go) */
static int64_t find_pos(const kn_prefix_cache *c, uint64_t hash) {
    int64_t mask = c->table_size - 1, pos = (int64_t)(hash & (uint64_t)mask);
    while (c->table[pos] >= 0 && c->entries[c->table[pos]].hash != hash) pos = (pos + 1) & mask;
    return pos;
}

static void table_remove(kn_prefix_cache *c, int64_t pos) {
    int64_t mask = c->table_size - 1;
    c->table[pos] = -1;
    for (int64_t j = (pos + 1) & mask; c->table[j] >= 0; j = (j + 1) & mask) { /* backward shift */
        int64_t home = (int64_t)(c->entries[c->table[j]].hash & (uint64_t)mask);
        /* move j's entry into the hole when its home is not in (pos, j] cyclically */
        int in_range = pos <= j ? (home > pos && home <= j) : (home > pos || home <= j);
        if (!in_range) {
            c->table[pos] = c->table[j];
            c->table[j] = -1;
            pos = j;
        }
    }
}

static void evict_entry(kn_prefix_cache *c, int64_t idx) {
    entry *e = &c->entries[idx];
    table_remove(c, find_pos(c, e->hash));
    block_unref(c->pool, e->block);
    c->free_slots[c->n_free_slots++] = idx;
    c->n_entries--;
}

/* LRU entry whose block only the cache holds; -1 if none */
static int64_t lru_victim(const kn_prefix_cache *c) {
    int64_t best = -1;
    for (int64_t i = 0; i < c->table_size; i++) {
        int64_t idx = c->table[i];
        if (idx < 0 || c->pool->refcount[c->entries[idx].block] != 1) continue;
        if (best < 0 || c->entries[idx].last_used < c->entries[best].last_used) best = idx;
    }
    return best;
}

int64_t kn_prefix_cache_evict(kn_prefix_cache *c, int64_t want) {
    int64_t freed = 0;
    while (freed < want) {
        int64_t v = lru_victim(c);
        if (v < 0) break;
        evict_entry(c, v);
        freed++;
    }
    return freed;
}

void kn_prefix_cache_destroy(kn_prefix_cache *c) {
    if (!c) return;
    for (int64_t i = 0; i < c->table_size; i++)
        if (c->table[i] >= 0) block_unref(c->pool, c->entries[c->table[i]].block);
    free(c->entries), free(c->tokens), free(c->free_slots), free(c->table), free(c);
}

int kn_prefix_cache_attach(kn_prefix_cache *c, kn_kv_seq *seq, const int32_t *tokens, int n) {
    const int bs = c->pool->block_size;
    int n_full = n / bs, k = 0;
    /* delayed KV conversion: cached blocks would mix formats below kv_start
     * (reuse there needs bf16 rows); ring layers keep only the last window of
     * a sequence: a cached prefix lacks their K/V. No reuse in either case. */
    if (n_full == 0 || seq->n_blocks != 0 || c->pool->header.spec.kv_start > 0 || c->pool->ring) return 0;
    if (seq->cap < n_full) {
        int32_t *nb = realloc(seq->blocks, (size_t)n_full * sizeof *nb);
        if (!nb) return 0;
        seq->blocks = nb, seq->cap = n_full;
    }
    uint64_t parent = 0;
    c->clock++;
    for (; k < n_full; k++) {
        const int32_t *t = tokens + (int64_t)k * bs;
        uint64_t h = block_hash(parent, t, bs);
        int64_t pos = find_pos(c, h), idx = c->table[pos];
        if (idx < 0) break;
        entry *e = &c->entries[idx];
        if (e->parent != parent || memcmp(e->tokens, t, (size_t)bs * sizeof *t)) break; /* hash collision */
        e->last_used = c->clock;
        c->pool->refcount[e->block]++;
        seq->blocks[k] = e->block;
        parent = h;
    }
    seq->n_blocks = k;
    seq->n_tokens = k * bs;
    c->hits += (uint64_t)k;
    return k * bs;
}

void kn_prefix_cache_insert(kn_prefix_cache *c, const kn_kv_seq *seq, const int32_t *tokens, int n) {
    const int bs = c->pool->block_size;
    if (c->pool->header.spec.kv_start > 0 || c->pool->ring) return; /* see kn_prefix_cache_attach */
    int n_full = n / bs;
    if (n_full > seq->n_blocks) n_full = seq->n_blocks;
    uint64_t parent = 0;
    c->clock++;
    for (int k = 0; k < n_full; k++) {
        const int32_t *t = tokens + (int64_t)k * bs;
        uint64_t h = block_hash(parent, t, bs);
        int64_t pos = find_pos(c, h), idx = c->table[pos];
        if (idx >= 0) {
            c->entries[idx].last_used = c->clock;
        } else {
            if (c->n_free_slots == 0) {
                int64_t v = lru_victim(c);
                if (v < 0) return; /* full of blocks in use: nothing to replace */
                evict_entry(c, v);
                pos = find_pos(c, h);
            }
            idx = c->free_slots[--c->n_free_slots];
            entry *e = &c->entries[idx];
            e->hash = h, e->parent = parent, e->last_used = c->clock, e->block = seq->blocks[k];
            memcpy(e->tokens, t, (size_t)bs * sizeof *t);
            c->pool->refcount[e->block]++;
            c->table[pos] = idx;
            c->n_entries++;
        }
        parent = h;
    }
}

int64_t kn_prefix_cache_size(const kn_prefix_cache *c) { return c->n_entries; }
uint64_t kn_prefix_cache_hits(const kn_prefix_cache *c) { return c->hits; }

/* prefix_cache.h — reuse of KV blocks between sequences that share a token
 * prefix (automatic prefix caching over the paged KV cache).
 *
 * The cache maps a chain hash of full blocks (hash of the previous block's
 * hash and this block's block_size token ids) to a block id, and holds one
 * reference on each block it maps, so a block outlives the sequence that
 * computed it. A new sequence attaches the longest cached chain of its
 * prompt's full blocks (taking a reference on each) and prefills only the
 * rest. Entries are evicted least-recently-used first, and only when the
 * cache is their last holder; the number of blocks the cache may hold is
 * capped (bytes / block bytes).
 *
 * Invariants: (1) an entry's block has refcount >= 1 (the cache's own);
 * (2) a cached block is full and never written again: sequences only write
 * positions past the blocks they attached; (3) the table holds each hash at
 * most once. A pool with a sliding-window ring (kv_paged.h) caches nothing:
 * the ring layers keep only a sequence's last window. Not thread-safe: the engine thread owns it with the pool. */
#ifndef KN_KV_PREFIX_CACHE_H
#define KN_KV_PREFIX_CACHE_H

#include <stdint.h>

#include "kv/kv_paged.h"

typedef struct kn_prefix_cache kn_prefix_cache;

/* max_blocks: most blocks the cache may hold (> 0). */
kn_code kn_prefix_cache_create(kn_kv_pool *pool, int64_t max_blocks, kn_prefix_cache **out, kn_error *err);
/* Drop every entry (returning blocks only the cache held) and free. */
void kn_prefix_cache_destroy(kn_prefix_cache *c);

/* seq must be empty. Attach cached blocks for the longest prefix of
 * tokens[0..n) made of full cached blocks; returns the number of tokens
 * covered (a multiple of block_size, <= n), 0 on a miss or out of memory. */
int kn_prefix_cache_attach(kn_prefix_cache *c, kn_kv_seq *seq, const int32_t *tokens, int n);

/* Offer seq's full blocks covering tokens[0..n) (their KV must be written).
 * Blocks already cached are only touched for LRU; new ones are added while
 * the cap allows (evicting unused entries to make room). */
void kn_prefix_cache_insert(kn_prefix_cache *c, const kn_kv_seq *seq, const int32_t *tokens, int n);

/* Evict LRU entries that only the cache holds until `want` blocks went back
 * to the pool or none is left; returns the number freed. */
int64_t kn_prefix_cache_evict(kn_prefix_cache *c, int64_t want);

int64_t kn_prefix_cache_size(const kn_prefix_cache *c); /* entries (= blocks held) */
uint64_t kn_prefix_cache_hits(const kn_prefix_cache *c);  /* blocks attached in all */

#endif

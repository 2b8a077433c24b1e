/* kv_paged.h — paged KV cache: a pool of fixed-size blocks per layer and a
 * per-sequence block table (vLLM's PagedAttention layout).
 *
 * The pool owns the K/V storage (backend memory, one allocation per layer for
 * K and one for V) and a host-side free list. A sequence owns a list of block
 * ids; position p of a sequence lives in slot blocks[p / block_size] *
 * block_size + p % block_size of every layer. Blocks carry reference counts so
 * a later prefix cache can share them between sequences; today each block has
 * one owner. Invariant: a block id is either on the free list (refcount 0) or
 * referenced by >= 1 sequence, never both.
 *
 * Sliding-window ring: a model whose sliding-window layers need only the last
 * `window` positions keeps those layers in a second, small pool (pool->ring)
 * of the same block size. A sequence holds at most ring_blocks blocks there;
 * logical block i (positions [i*bs, (i+1)*bs)) lives in ring block
 * seq->ring[i % ring_blocks], so position p's ring slot is reused by position
 * p + ring_blocks*bs. The attention kernels are unchanged: sliding layers get
 * a block table whose entry i is seq->ring[i % ring_blocks] and read only
 * [pos - window + 1, pos]. ring_blocks*bs >= window + max_chunk - 1 keeps
 * every key a forward chunk reads intact until that chunk has read it. The
 * main pool then holds only the full-attention layers (possibly none: a
 * bookkeeping-only pool whose blocks still count positions). */
#ifndef KN_KV_PAGED_H
#define KN_KV_PAGED_H

#include <stdint.h>

#include "backend/backend.h"

#define KN_KV_BLOCK_SIZE 16

typedef struct kn_kv_pool {
    kn_backend *be;
    int n_layers, n_kv_heads, head_dim, block_size;
    int64_t n_blocks;
    kn_kv_layer *layers; /* [n_layers] */
    int32_t *free_list;  /* stack of free block ids */
    int64_t n_free;
    uint16_t *refcount; /* [n_blocks] */
    struct kn_kv_pool *ring; /* sliding-window layers' pool, NULL when none (see above) */
    int ring_blocks;         /* most ring blocks one sequence holds */
} kn_kv_pool;

typedef struct {
    int32_t *blocks; /* block ids, in position order */
    int n_blocks, cap;
    int n_tokens; /* positions [0, n_tokens) hold valid K/V */
    int32_t *ring; /* [pool->ring_blocks] ring block ids (pool->ring), n_ring of them in use */
    int n_ring;
} kn_kv_seq;

/* n_layers may be 0: blocks then only count positions (all layers in the ring). */
kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err);
/* Give pool a ring pool of n_blocks blocks for n_layers sliding-window layers
 * (> 0), each sequence holding at most ring_blocks of them. Before any reserve. */
kn_code kn_kv_pool_add_ring(kn_kv_pool *pool, int n_layers, int n_kv_heads, int head_dim, int ring_blocks,
                            int64_t n_blocks, kn_error *err);
void kn_kv_pool_destroy(kn_kv_pool *pool);

/* Make sure seq has blocks for positions [0, n_positions) (and its ring
 * blocks, min(blocks, ring_blocks)). Fails with KN_ERR_NOMEM (nothing
 * changed) when either pool has too few free blocks. */
kn_code kn_kv_seq_reserve(kn_kv_pool *pool, kn_kv_seq *seq, int n_positions, kn_error *err);
/* Return all of seq's blocks to the pool and reset it (safe to call twice). */
void kn_kv_seq_release(kn_kv_pool *pool, kn_kv_seq *seq);

static inline int32_t kn_kv_seq_slot(const kn_kv_pool *pool, const kn_kv_seq *seq, int pos) {
    return seq->blocks[pos / pool->block_size] * pool->block_size + pos % pool->block_size;
}

/* Slot of position pos in the ring pool's layers. */
static inline int32_t kn_kv_seq_ring_slot(const kn_kv_pool *pool, const kn_kv_seq *seq, int pos) {
    const int bs = pool->block_size;
    return seq->ring[(pos / bs) % pool->ring_blocks] * bs + pos % bs;
}

/* Block table of seq for the ring layers: row[i] = ring[i % ring_blocks] for
 * the seq's n_blocks logical blocks. */
void kn_kv_seq_ring_table(const kn_kv_pool *pool, const kn_kv_seq *seq, int32_t *row);

/* Bytes of K+V storage per token position over all layers (ring layers
 * included: the cost while a sequence is shorter than the ring). */
int64_t kn_kv_bytes_per_token(const kn_kv_pool *pool);
/* Bytes of K+V storage one sequence of n_tokens positions uses. */
int64_t kn_kv_seq_bytes(const kn_kv_pool *pool, int64_t n_tokens);

#endif

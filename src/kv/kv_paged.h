/* kv_paged.h — paged KV cache: a pool of fixed-size blocks per layer and a
 * per-sequence block table (vLLM's PagedAttention layout).
 *
 * The pool owns the K/V storage (backend memory, one allocation per layer for
 * K and one for V) and a host-side free list. A sequence owns a list of block
 * ids; position p of a sequence lives in slot blocks[p / block_size] *
 * block_size + p % block_size of every layer. Blocks carry reference counts so
 * a later prefix cache can share them between sequences; today each block has
 * one owner. Invariant: a block id is either on the free list (refcount 0) or
 * referenced by >= 1 sequence, never both. */
#ifndef KN_KV_PAGED_H
#define KN_KV_PAGED_H

#include <stdint.h>

#include "backend/backend.h"

#define KN_KV_BLOCK_SIZE 16

typedef struct {
    kn_backend *be;
    int n_layers, n_kv_heads, head_dim, block_size;
    int64_t n_blocks;
    kn_kv_layer *layers; /* [n_layers] */
    int32_t *free_list;  /* stack of free block ids */
    int64_t n_free;
    uint16_t *refcount; /* [n_blocks] */
} kn_kv_pool;

typedef struct {
    int32_t *blocks; /* block ids, in position order */
    int n_blocks, cap;
    int n_tokens; /* positions [0, n_tokens) hold valid K/V */
} kn_kv_seq;

kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err);
void kn_kv_pool_destroy(kn_kv_pool *pool);

/* Make sure seq has blocks for positions [0, n_positions). Fails with
 * KN_ERR_NOMEM (nothing changed) when the pool has too few free blocks. */
kn_code kn_kv_seq_reserve(kn_kv_pool *pool, kn_kv_seq *seq, int n_positions, kn_error *err);
/* Return all of seq's blocks to the pool and reset it (safe to call twice). */
void kn_kv_seq_release(kn_kv_pool *pool, kn_kv_seq *seq);

static inline int32_t kn_kv_seq_slot(const kn_kv_pool *pool, const kn_kv_seq *seq, int pos) {
    return seq->blocks[pos / pool->block_size] * pool->block_size + pos % pool->block_size;
}

/* Bytes of K+V storage per token position over all layers. */
int64_t kn_kv_bytes_per_token(const kn_kv_pool *pool);

#endif

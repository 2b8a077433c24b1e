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
 * Storage format (KV_FORMATS.md): each layer stores K and V rows in a format
 * of base/kv_codec.h chosen by a kn_kv_spec (the cache header records it,
 * with the rotation's sign seed). Layers may differ (boundary layers of
 * presets under 4 bits stay bf16). Slots hold codes and their metadata
 * together, so moving or sharing a block stays a byte copy / refcount. */
#ifndef KN_KV_PAGED_H
#define KN_KV_PAGED_H

#include <stdint.h>

#include "backend/backend.h"

#define KN_KV_BLOCK_SIZE 16

/* A KV storage choice (`--kv`): formats of the compressed layers, which
 * layers stay in boundary_fmt, and the rotation seed. */
typedef struct {
    char name[32];       /* the preset or "K:V" as parsed */
    int k_fmt, v_fmt;    /* kn_kv_fmt of the other layers */
    int boundary_layers; /* the first and the last this many layers use boundary_fmt */
    int boundary_fmt;    /* KN_KVF_BF16 */
    uint64_t seed;       /* sign vectors of the rotated formats */
    int kv_start;        /* delayed conversion (--kv-start N): a sequence stays bf16 until it holds this
                            many tokens (a multiple of the block size); 0 = convert on write */
} kn_kv_spec;

/* Parse FORMAT: f32, bf16, fp8, q8, q8s, q4, q4g64, tq3, tq4, k8v3, k4v3, or
 * "K:V" with component formats (f32 bf16 fp8 q8 q8s q8a q4 q4g64 tqv2 tqv3
 * tqv4 tq3 tq4). boundary < 0: the preset's default (2 for presets with a
 * component under 4 bits, else 0). */
kn_code kn_kv_spec_parse(const char *s, int boundary, kn_kv_spec *out, kn_error *err);
/* The default for a model computing in dtype dt: f32 for F32, else bf16. */
kn_kv_spec kn_kv_spec_default(kn_dtype dt);
/* Formats of layer l of n_layers. */
void kn_kv_spec_layer(const kn_kv_spec *s, int l, int n_layers, int *k_fmt, int *v_fmt);
/* Refuse head dims a layer's format cannot store (clear message). */
kn_code kn_kv_spec_check(const kn_kv_spec *s, int n_layers, const int *head_dim, kn_error *err);
/* Bytes of K+V per token over all layers: sum_l H_kv(l) * (B_K(l) + B_V(l)). */
int64_t kn_kv_spec_bytes_per_token(const kn_kv_spec *s, int n_layers, const int *n_kv_heads, const int *head_dim);
/* "k8v3 (K q8a, V tqv3; layers 0-1, 26-27 bf16; seed 0x...)" */
void kn_kv_spec_describe(const kn_kv_spec *s, int n_layers, char *out, size_t cap);

/* The cache header: what a persisted or inspected cache says about itself. */
#define KN_KV_MAGIC 0x4b56434bu /* "KCVK" */
#define KN_KV_VERSION 1
typedef struct {
    uint32_t magic, version;
    kn_kv_spec spec;
    int n_layers, block_size;
} kn_kv_header;

typedef struct {
    int n_layers, block_size;
    int64_t n_blocks;
    const int *n_kv_heads, *head_dim; /* [n_layers] */
    const kn_kv_spec *spec;           /* NULL: f32 everywhere */
    int64_t n_stage_blocks;           /* spec->kv_start > 0: bf16 staging blocks (max_seqs x kv_start / block_size) */
} kn_kv_pool_params;

typedef struct {
    kn_backend *be;
    int n_layers, n_kv_heads, head_dim, block_size; /* n_kv_heads/head_dim: layer 0's */
    int64_t n_blocks;
    kn_kv_header header;
    kn_kv_layer *layers; /* [n_layers] */
    void **tables;       /* [n_layers] backend memory behind each layer's tab/signs/scale pointers */
    int32_t *free_list;  /* stack of free block ids */
    int64_t n_free;
    uint16_t *refcount; /* [n_blocks + n_stage_blocks] */
    /* delayed conversion: staging block ids are n_blocks + i */
    int64_t n_stage_blocks, n_stage_free;
    int32_t *stage_free_list;
    int32_t *conv_host, *conv_dev; /* [2 * kv_start] slot pairs of one conversion (host, backend) */
} kn_kv_pool;

typedef struct {
    int32_t *blocks; /* block ids, in position order */
    int n_blocks, cap;
    int n_tokens; /* positions [0, n_tokens) hold valid K/V */
    /* delayed conversion: blocks [0, n_shadow) of the table may be staging
     * blocks; shadow[i] is the compressed block reserved to replace block i */
    int32_t *shadow;
    int n_shadow;
    int converted_at; /* offset where the cache was converted (prefix reuse below it needs bf16); 0 = none */
} kn_kv_seq;

/* Uniform f32 pool (every layer n_kv_heads x head_dim). */
kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err);
/* Pool with per-layer shapes and the formats of p->spec. */
kn_code kn_kv_pool_create_ex(kn_backend *be, const kn_kv_pool_params *p, kn_kv_pool **out, kn_error *err);
void kn_kv_pool_destroy(kn_kv_pool *pool);

/* Make sure seq has blocks for positions [0, n_positions). Fails with
 * KN_ERR_NOMEM (nothing changed) when the pool has too few free blocks. */
kn_code kn_kv_seq_reserve(kn_kv_pool *pool, kn_kv_seq *seq, int n_positions, kn_error *err);
/* Return all of seq's blocks to the pool and reset it (safe to call twice). */
void kn_kv_seq_release(kn_kv_pool *pool, kn_kv_seq *seq);
/* Drop one reference to block b (compressed or staging). */
void kn_kv_block_unref(kn_kv_pool *pool, int32_t b);

/* Delayed conversion (spec.kv_start = N > 0). A sequence holding fewer than
 * N tokens keeps positions < N in bf16 staging blocks; before a token at
 * position >= N is appended, kn_kv_seq_convert re-encodes those rows into
 * the compressed blocks reserved for them, one layer at a time (the
 * transient is the shadow blocks reserved up front), and records N in
 * converted_at. An append (prefill chunk) never straddles N:
 * kn_kv_max_append caps it. */
static inline int kn_kv_seq_staged(const kn_kv_pool *pool, const kn_kv_seq *seq) {
    return pool->header.spec.kv_start > 0 && !seq->converted_at;
}
/* Largest append of up to want tokens starting at position pos. */
static inline int kn_kv_max_append(const kn_kv_pool *pool, const kn_kv_seq *seq, int pos, int want) {
    const int n = pool->header.spec.kv_start;
    if (!kn_kv_seq_staged(pool, seq) || pos >= n || pos + want <= n) return want;
    return n - pos;
}
/* Convert seq (it must hold kv_start tokens); no-op when not staged. */
kn_code kn_kv_seq_convert(kn_kv_pool *pool, kn_kv_seq *seq, kn_error *err);

static inline int32_t kn_kv_seq_slot(const kn_kv_pool *pool, const kn_kv_seq *seq, int pos) {
    return seq->blocks[pos / pool->block_size] * pool->block_size + pos % pool->block_size;
}

/* Bytes of K+V storage per token position over all layers (the formula
 * of kn_kv_spec_bytes_per_token for the pool's layers). */
int64_t kn_kv_bytes_per_token(const kn_kv_pool *pool);

#endif

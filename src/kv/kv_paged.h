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
 * together, so moving or sharing a block stays a byte copy / refcount.
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
/* The same for n_layers pool layers where layer l takes the formats of model
 * layer ids[l] of model_layers (ids NULL: l of n_layers). */
kn_code kn_kv_spec_check_ids(const kn_kv_spec *s, int n_layers, const int *ids, int model_layers, const int *head_dim,
                             kn_error *err);
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
    /* a pool holding some of a model's layers (full-attention or ring): the
     * spec's boundary layers count model layers, so pool layer l takes the
     * formats of model layer layer_ids[l] of model_layers (NULL / 0: l of n_layers) */
    const int *layer_ids;
    int model_layers;
} kn_kv_pool_params;

typedef struct kn_kv_pool {
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
    struct kn_kv_pool *ring; /* sliding-window layers' pool, NULL when none (see above) */
    int ring_blocks;         /* most ring blocks one sequence holds */
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
    int32_t *ring; /* [pool->ring_blocks] ring block ids (pool->ring), n_ring of them in use */
    int n_ring;
    /* delayed conversion: ring[0, n_ring_shadow) are staging blocks of the
     * ring pool, ring_shadow[i] the compressed block reserved to replace ring[i] */
    int32_t *ring_shadow;
    int n_ring_shadow;
} kn_kv_seq;

/* Uniform f32 pool (every layer n_kv_heads x head_dim). n_layers may be 0:
 * blocks then only count positions (all layers in the ring). */
kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err);
/* Pool with per-layer shapes and the formats of p->spec (n_layers may be 0, as above). */
kn_code kn_kv_pool_create_ex(kn_backend *be, const kn_kv_pool_params *p, kn_kv_pool **out, kn_error *err);
/* Give pool a ring pool for p->n_layers (> 0) sliding-window layers, built
 * as kn_kv_pool_create_ex builds a pool (per-layer shapes, the formats the
 * spec gives those layers: quantized rings keep codes and metadata with their
 * slot), p->n_blocks blocks of pool's block size, each sequence holding at
 * most ring_blocks of them. Before any reserve. With delayed conversion
 * (spec->kv_start, the same as the main pool's) a staged sequence's ring
 * entries below kv_start / block_size are staging blocks of the ring pool
 * (p->n_stage_blocks of them, at least min(that, ring_blocks)), each with
 * its compressed block reserved, converted with the main pool's blocks. */
kn_code kn_kv_pool_add_ring_ex(kn_kv_pool *pool, const kn_kv_pool_params *p, int ring_blocks, kn_error *err);
/* The same with n_layers uniform f32 ring layers. */
kn_code kn_kv_pool_add_ring(kn_kv_pool *pool, int n_layers, int n_kv_heads, int head_dim, int ring_blocks,
                            int64_t n_blocks, kn_error *err);
void kn_kv_pool_destroy(kn_kv_pool *pool);

/* Make sure seq has blocks for positions [0, n_positions) (and its ring
 * blocks, min(blocks, ring_blocks)). Fails with KN_ERR_NOMEM (nothing
 * changed) when either pool has too few free blocks. */
kn_code kn_kv_seq_reserve(kn_kv_pool *pool, kn_kv_seq *seq, int n_positions, kn_error *err);
/* Return all of seq's blocks to the pool and reset it (safe to call twice). */
void kn_kv_seq_release(kn_kv_pool *pool, kn_kv_seq *seq);
/* Drop one reference to block b (compressed or staging). */
void kn_kv_block_unref(kn_kv_pool *pool, int32_t b);

/* Delayed conversion (spec.kv_start = N > 0). A sequence holding fewer than
 * N tokens keeps positions < N in bf16 staging blocks; before a token at
 * position >= N is appended, kn_kv_seq_convert re-encodes those rows into
 * the compressed blocks reserved for them, one layer at a time (the
 * transient is the shadow blocks reserved up front; ring entries too: while
 * the ring wraps below N it holds bf16 rows of the last positions), and
 * records N in converted_at. An append (prefill chunk) never straddles N:
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

/* A layer's staging arena as a cache of its own: rows in s_fmt (bf16, never
 * rotated), staging block i of the pool as block i - pool->n_blocks. A
 * staged sequence lives wholly in staging blocks (positions < kv_start; the
 * prefix cache is off for such pools), so the model writes and attends to
 * it through this view with rebased slots and block tables, and the op
 * kernels never see a staging block. */
static inline kn_kv_layer kn_kv_stage_view(const kn_kv_layer *L) {
    kn_kv_layer v = {.k = L->sk, .v = L->sv, .block_size = L->block_size, .n_kv_heads = L->n_kv_heads,
                     .head_dim = L->head_dim, .n_blocks = L->n_stage_blocks, .k_fmt = L->s_fmt, .v_fmt = L->s_fmt};
    return v;
}

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

/* Bytes of K+V storage per token position over all layers (the formula
 * of kn_kv_spec_bytes_per_token for the pool's layers; ring layers
 * included: the cost while a sequence is shorter than the ring). */
int64_t kn_kv_bytes_per_token(const kn_kv_pool *pool);
/* Bytes of K+V storage one sequence of n_tokens positions uses. */
int64_t kn_kv_seq_bytes(const kn_kv_pool *pool, int64_t n_tokens);

#endif

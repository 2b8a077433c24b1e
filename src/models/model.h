/* model.h — the loaded model (internal view of the public kn_model) and the
 * batched forward pass the engine drives.
 *
 * A kn_model owns its backend-resident weights, its scratch activations
 * (sized for max_chunk tokens per forward) and its KV pool. The forward pass
 * runs a batch of tokens from one or more sequences; each token carries its
 * sequence and position, so one call can mix prefill chunks and decode steps
 * (continuous batching builds on this). */
#ifndef KN_MODELS_MODEL_H
#define KN_MODELS_MODEL_H

#include "backend/backend.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kiln/kiln.h"
#include "kv/kv_paged.h"

typedef struct {
    kn_weight qkv, o, gate_up, down; /* q|k|v and gate|up fused along rows (non-gated MLP: gate_up = up) */
    float *qkv_bias, *o_bias, *gate_up_bias, *down_bias; /* NULL when absent */
    float *attn_norm, *mlp_norm, *q_norm, *k_norm;       /* f32; pre-norms NULL in the post-norm layout */
    float *attn_norm_b, *mlp_norm_b;                     /* LayerNorm biases (starcoder2) */
    float *post_attn_norm, *post_mlp_norm;               /* sandwich / post-norm layouts (gemma2/3, glm4, olmo2) */
    /* mixture of experts (cfg.layer_moe): router [E, H], experts stacked
     * along rows (see kn_moe_args); the shared expert (qwen2_moe) reuses
     * gate_up / down above and its gate is shared_gate [1, H] */
    int is_moe;
    kn_weight router, experts_gate_up, experts_down, shared_gate;
    /* attention shape of this layer (gemma4's global layers differ): q rows
     * q_dim = n_heads*head_dim; the fused projection has qkv_stride rows
     * (q|k|v, or q alone for a KV-shared layer) */
    int head_dim, n_kv_heads, q_dim, kv_dim, qkv_stride, inter;
    int kv_source; /* layer whose K/V this layer attends to (itself unless KV-shared) */
    int in_ring;   /* its K/V (its source's) live in the sliding-window ring pool (kv_paged.h) */
    /* gemma4 */
    float layer_scalar;                        /* multiplies the layer output (1 = none) */
    kn_weight ple_gate, ple_proj;              /* per-layer input: [P, H], [H, P] */
    float *ple_norm;                           /* [H] post_per_layer_input_norm */
    float *router_norm_w, *expert_scale;       /* [H] router.scale / sqrt(H), [E] per_expert_scale */
    float *moe_pre_norm, *moe_post_norm1, *moe_post_norm2; /* [H] */
    /* gemma3n (gemma3n.c): AltUp router [K, H], prediction [K*K, K] and
     * correction [K, K] coefficients, router norm and corrected-output scale
     * [H]; Laurel left [R, H], right [H, R], norm [H]; activation sparsity */
    kn_weight alt_router, alt_pred, alt_corr, laurel_l, laurel_r;
    float *alt_router_norm, *alt_out_scale, *laurel_norm;
    int sparse;         /* gaussian top-k on the MLP gate */
    float sparse_mult;  /* its standard-normal quantile */
} kn_layer;

/* One forward call: n_tokens tokens; token t belongs to sequence seq[t] (an
 * index into seqs) at position pos[t]. Logits are produced for the rows in
 * logit_rows (n_logits of them), in that order. */
typedef struct {
    int n_tokens;
    const int32_t *tokens, *pos, *seq;
    int n_seqs;
    kn_kv_seq *const *seqs;
    int n_logits;
    const int32_t *logit_rows;
    /* optional: greedy ids of the logit rows, computed on the backend (only
     * n_logits int32 cross to the host; the logits argument may be NULL) */
    int32_t *argmax;
    /* optional [n_seqs]: the sequence length that length-dependent RoPE
     * (dynamic, longrope) scales for, e.g. the whole prompt's while it is
     * prefilled in chunks (transformers runs it as one forward); NULL or 0 =
     * the sequence's largest position in this batch + 1 */
    const int32_t *rope_len;
    /* optional [n_logits] (needs argmax and kn_model_samples_on_backend):
     * the logit rows are sampled on the backend under these parameters
     * (base/sampling.h) with edits [n_edits] (each row's naming distinct
     * tokens, at most KN_SAMPLE_MAX_EDITS in all); the ids land in argmax */
    const kn_sample_params *sample;
    const kn_logit_edit *edits;
    int n_edits;
} kn_batch;

#define KN_SAMPLE_MAX_EDITS 65536

struct kn_model {
    kn_model_config cfg;
    kn_backend *be;
    kn_safetensors *st;
    kn_weight embed, lm_head;
    float *final_norm, *final_norm_b;
    /* gemma4 per-layer inputs: table [ple_vocab, L*P], projection [L*P, H], norm [P] */
    kn_weight ple_embed, ple_model_proj;
    float *ple_proj_norm;
    float *ple, *ple_tmp, *ple_g; /* scratch [T, L*P], [T, L*P], [T, P] */
    float *ones;                  /* [max head_dim] weight of the scale-free value norm */
    int32_t *d_ple_tokens;        /* gemma3n: token ids for the per-layer table (ids past its vocab -> 0); NULL = d_tokens */
    /* gemma3n AltUp: stream projections [K-1] of [H, H]; scratch: streams and
     * predictions [K, max_chunk, H], coefficients [T, K*K], router [T, K],
     * Laurel [T, R] and [T, H] */
    kn_weight *alt_proj, *alt_unembed;
    float *alt_s, *alt_p, *alt_w, *alt_mod, *laurel_t, *laurel_o;
    kn_kv_layer *kvl;             /* [n_layers] per-layer views of the KV pool with the layer's shape */
    /* delayed conversion (--kv-start; NULL otherwise): kvl's staging arenas as caches (kn_kv_stage_view);
     * kn_model_forward puts the tokens of staged sequences first (n_staged of them), with slots and
     * block tables (d_bt_stage, d_bt_ring_stage) rebased into those views */
    kn_kv_layer *kvl_stage;
    int32_t *d_bt_stage, *h_bt_stage, *d_bt_ring_stage, *h_bt_ring_stage;
    int n_staged;
    kn_layer *layers;
    kn_rope_table rope, rope_local; /* rope_local: sliding layers of gemma3 (else unused) */
    /* length-dependent RoPE (dynamic, longrope): per forward call, one table
     * per run of consecutive tokens of one sequence, for that sequence's
     * length in the call (NULL otherwise) */
    float *rope_runs, *h_rope_runs, *run_scale; /* [max_chunk, rot/2] backend + host staging; [max_chunk] */
    int *run_t0, *run_n, n_runs;
    int q_dim, kv_dim, qkv_dim; /* widest of any layer (scratch sizing) */
    int max_head_dim;
    int max_context, max_chunk, max_seqs;
    kn_kv_pool *kv;
    /* scratch, backend memory, sized for max_chunk tokens */
    float *x, *xn, *qkv, *attn, *gu, *act, *tmp, *logits;
    /* MoE scratch (NULL for dense models): router logits [T, E], routing
     * idx/weights [T, k], expert scratch, shared-expert output and gate */
    float *router_logits, *route_w, *moe_scratch, *tmp2, *shared_g;
    int32_t *route_idx;
    int ffn_max; /* widest ffn of any MLP (dense or shared expert) */
    int logits_rows; /* rows of the logits scratch */
    int32_t *d_tokens, *d_pos, *d_seq, *d_slots, *d_bt, *d_rows, *d_argmax;
    kn_sample_params *d_sample; /* [max_chunk] rows of backend sampling; NULL without sample_rows */
    kn_logit_edit *d_edits;     /* [KN_SAMPLE_MAX_EDITS] */
    int32_t *h_bt; /* host staging for block tables [max_seqs, max_blocks] */
    int32_t *d_bt_ring, *d_slots_ring, *h_bt_ring; /* the ring layers' block tables and slots (NULL: no ring) */
    int max_blocks;
    char desc[320];
    char notes[512]; /* what of the checkpoint is used / ignored (multimodal wrappers); "" when all is used */
};

/* Where weights come from: a lookup by HF tensor name (NULL when absent).
 * `borrow` (kn_borrow) says whether the tensor bytes stay valid while the
 * model lives, and in what memory, so a backend may use them in place. */
typedef struct {
    const kn_st_tensor *(*find)(void *ctx, const char *name);
    void *ctx;
    kn_borrow borrow;
} kn_tensor_source;

/* A decoder layer's norm tensor names (after "model.layers.%d.", before
 * ".weight") by position; NULL where the family has none. */
typedef struct {
    const char *pre_attn, *post_attn, *pre_mlp, *post_mlp;
} kn_norm_names;
kn_norm_names kn_family_norms(const kn_model_config *c);

/* Build a model from a parsed config and a tensor source. The model takes
 * ownership of be. Used by kn_model_open and by the synthetic bench. */
kn_code kn_model_build(const kn_model_config *cfg, const kn_tensor_source *src, kn_backend *be, int max_context,
                       int max_seqs, kn_model **out, kn_error *err);

/* The same with a KV storage choice (NULL: the default for the model's
 * compute dtype: f32 for f32 weights, else bf16). */
kn_code kn_model_build_kv(const kn_model_config *cfg, const kn_tensor_source *src, kn_backend *be, int max_context,
                          int max_seqs, const kn_kv_spec *kv, kn_model **out, kn_error *err);

/* Free everything the model owns (its backend, checkpoint mapping, KV pool);
 * NULL is a no-op. kn_model_close is the public name. */
void kn_model_free_internal(kn_model *m);

/* Run one batch; logits (host, n_logits x vocab) may be NULL when n_logits 0
 * or when b->argmax asks for greedy ids instead.
 * The caller must have reserved KV blocks for every (seq, pos) in the batch. */
kn_code kn_model_forward(kn_model *m, const kn_batch *b, float *logits, kn_error *err);

/* 1 when b->sample can be used (the backend has sample_rows). */
static inline int kn_model_samples_on_backend(const kn_model *m) { return m->d_sample != NULL; }

/* Pieces of the shared decoder (llama.c) that family-specific forwards
 * (gemma3n.c) reuse; batch index arrays already uploaded. */
void kn_dec_attention(kn_model *m, const kn_batch *b, int l, const float *in); /* -> m->attn (in NULL: m->qkv set) */
int kn_dec_mlp(kn_model *m, const kn_layer *L, const float *xn, int n, float *out, int may_fuse);
void kn_dec_norm_rows(kn_model *m, const float *x, float *out, int n, const float *w, const float *b);
void kn_dec_residual_add(kn_model *m, float *y, const float *post_norm, int n);
void kn_dec_ple_inputs(kn_model *m, const float *x, int n); /* per-layer inputs of rows x into m->ple_tmp */

/* Total bytes of weights read by one decode step. */
int64_t kn_model_weight_bytes(const kn_model *m);
/* Bytes of every matrix the model holds (the embedding and all experts too). */
int64_t kn_model_total_weight_bytes(const kn_model *m);

#endif

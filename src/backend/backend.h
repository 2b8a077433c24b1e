/* backend.h — the op interface every compute backend implements.
 *
 * Models never touch CPU or CUDA code: they hold a kn_backend and call the ops
 * below through it. Conventions:
 *  - All tensor pointers passed to ops are backend memory (from kn_be_alloc or
 *    a kn_weight made by kn_be_weight_load). On the CPU backend that is host
 *    memory; on CUDA it is device memory, and ops are enqueued on the
 *    backend's stream (asynchronous until kn_be_sync / a download).
 *  - Activations are float32, row-major. Weights are [rows=out, cols=in] in
 *    F32, BF16 or F16; matmuls accumulate in float32.
 *  - Index arrays (token ids, positions, KV slots, block tables) are int32 in
 *    backend memory too, so a step needs no host round trip.
 *  - Ops are infallible once their arguments are validated by the caller
 *    (shapes come from a checked config); resource calls return kn_code.
 * One op enumeration, one implementation per backend, and tests/test_ops
 * compares each against a float64 reference. */
#ifndef KN_BACKEND_H
#define KN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/kv_codec.h"
#include "base/sampling.h"
#include "base/status.h"

typedef struct kn_backend kn_backend;

/* GELU forms: exact (erf) as torch's nn.GELU(), or the tanh approximation
 * (gelu_pytorch_tanh / gelu_new). */
enum { KN_GELU_ERF = 0, KN_GELU_TANH = 1 };

/* A weight matrix [rows, cols] owned by the backend (or borrowed from a
 * mapping that outlives it, see owned).
 * Quantized weights (bits > 0, MLX affine, dtype KN_DT_U32): data holds the
 * packed codes [rows, cols * bits / 32] uint32 (element c of a row sits in
 * word c / (32/bits) at bit offset bits * (c % (32/bits))), followed in the
 * same allocation by scales and biases [rows, cols / group_size] in sb_dtype
 * (the CPU backend keeps the checkpoint's F32/BF16/F16 values as they are,
 * 2 bytes a group each for 16-bit checkpoints; the CUDA backend widens them
 * to F32); element (r, c) = scales[r, c/gs] * q + biases[r, c/gs] in float32. */
typedef struct {
    kn_dtype dtype;
    int64_t rows, cols;
    const void *data;
    int owned; /* 1: freed by kn_be_weight_free */
    int bits, group_size;         /* 0 = not quantized */
    const void *scales, *biases; /* quantized only: inside data's allocation */
    kn_dtype sb_dtype;            /* quantized only: scales/biases element type */
} kn_weight;

/* Host description of an MLX affine-quantized weight for weight_load_quant:
 * q [rows, cols*bits/32] uint32 (little-endian), scales/biases [rows,
 * cols/group_size] in sb_dtype (F32/BF16/F16). bits in {2, 4, 8}; group_size
 * in {32, 64, 128}. Pointers need no alignment. */
typedef struct {
    int64_t rows, cols;
    int bits, group_size;
    const void *q, *scales, *biases;
    kn_dtype sb_dtype;
} kn_quant_host;

/* Rotary embedding tables: inv_freq[rot_dim/2] and the cos/sin scale. The
 * rotation is the rotate-half (GPT-NeoX / HF) form on the first rot_dim
 * elements of each head. */
typedef struct {
    int rot_dim;
    float attn_scale;      /* multiplies cos and sin (yarn / longrope) */
    const float *inv_freq; /* backend memory, rot_dim/2 entries */
} kn_rope_table;

/* Paged KV storage of one layer: blocks of block_size token slots, each slot
 * holding n_kv_heads rows for K and for V. slot = block * block_size +
 * offset. A row is head_dim values in the layer's format (base/kv_codec.h):
 * KN_KVF_F32 (0, the zero-initialised default) is head_dim floats; other
 * formats are kn_kv_row_bytes(fmt, head_dim) bytes. kv_write quantizes on
 * append and attention reads the stored rows directly (rotated formats in
 * the rotated domain). */
typedef struct {
    void *k, *v; /* [n_blocks * block_size][n_kv_heads][row bytes] */
    int block_size, n_kv_heads, head_dim;
    int64_t n_blocks;
    int k_fmt, v_fmt;               /* kn_kv_fmt */
    const float *k_tab, *v_tab;     /* rotated formats: codebook (centroids, boundaries); else NULL */
    const float *signs;             /* rotated formats: [head_dim] +-1 sign flips of the rotation */
    const float *k_scale, *v_scale; /* fp8: [n_kv_heads] scales; else NULL */
    /* delayed conversion (--kv-start): the pool's staging arena, rows in s_fmt
     * (bf16, never rotated) of sequences not yet converted; its block i is
     * the pool's block n_blocks + i. Ops other than kv_convert never see it:
     * the model writes and attends to staged sequences through a view of it
     * as a cache of its own (kn_kv_stage_view). NULL/0 when unused */
    void *sk, *sv; /* [n_stage_blocks * block_size][n_kv_heads][row bytes of s_fmt] */
    int s_fmt;
    int64_t n_stage_blocks;
} kn_kv_layer;

/* Attention of n_tokens query rows, each against its own sequence's cached
 * keys/values at positions [max(0, pos - window + 1), pos] (window 0 = all):
 * causal, grouped-query (query head h uses kv head h / (n_heads/n_kv_heads)). */
typedef struct {
    const float *q; /* [n_tokens, q_stride], heads at q + h*head_dim */
    int64_t q_stride;
    float *out; /* [n_tokens, n_heads*head_dim] */
    int n_tokens, n_heads;
    float scale;
    int window;
    /* pos, seq and block_tables are uploaded before a step's kernels and
     * written by none of them (a GPU kernel may read them before waiting on
     * the kernels before it) */
    const int32_t *pos;          /* [n_tokens] */
    const int32_t *seq;          /* [n_tokens] row into block_tables */
    const int32_t *block_tables; /* [n_seqs, max_blocks] */
    int max_blocks;
    const kn_kv_layer *kv;
    /* optional host mirrors of pos/seq (NULL: unknown). With them a backend
     * may run long same-sequence runs of queries (prefill chunks) as tensor-
     * core GEMMs, rounding q/k/v/probabilities to compute_dtype when that is
     * BF16/F16 (KN_DT_F32: exact float32 GEMMs). */
    const int32_t *pos_host, *seq_host;
    int compute_dtype;
    float softcap; /* > 0: scores become softcap * tanh(scores / softcap) before the mask (gemma2); 0 = off */
} kn_attention_args;

/* The arguments of rope_kv_write (see there), gathered for
 * rope_kv_attention */
typedef struct {
    float *qk;      /* [n_tokens, stride]: n_q_heads query heads, then n_kv_heads key heads */
    const float *v; /* [n_tokens, stride] */
    int64_t stride;
    int n_tokens, n_q_heads, n_kv_heads, head_dim;
    const int32_t *pos;
    const kn_rope_table *rope;
    const kn_kv_layer *kv;
    const int32_t *slots;
    const float *q_norm, *k_norm; /* both or neither */
    float eps;
} kn_rope_kv_args;

/* Dense multi-head attention (whisper: encoder self-attention, cross-
 * attention, decoder self-attention over a contiguous cache). Query row i,
 * head h attends to key rows j in [0, n_kv), or j in [0, min(n_kv, q_pos0 + i
 * + 1)) when causal; q, k and v have n_heads heads of head_dim each, head h
 * at column h*head_dim of its row. */
typedef struct {
    const float *q, *k, *v; /* [n_q, q_stride], [n_kv, k_stride], [n_kv, v_stride] */
    int64_t q_stride, k_stride, v_stride;
    float *out; /* [n_q, out_stride], head h at out + h*head_dim */
    int64_t out_stride;
    int n_q, n_kv, n_heads, head_dim;
    float scale;
    int causal, q_pos0;
} kn_dense_attention_args;
/* Context buckets: a recorded decode graph is valid for one batch shape and
 * one bucket of the largest position attended (backends may size attention
 * work by the bucket's end, never by the exact length). */
#define KN_CTX_BUCKET_SHIFT 9
static inline int kn_ctx_bucket(int max_pos) { return (max_pos >> KN_CTX_BUCKET_SHIFT) + 1; }

/* ---- model families (gemma, MoE, granite, ...) ---- */

/* Activation of a gated FFN: act(gate) * up. */
enum { KN_ACT_SILU = 0, KN_ACT_GELU_TANH = 1, KN_ACT_GELU_ERF = 2 };

/* The routed experts of one MoE layer, applied to n_tokens rows:
 *   out[t] = sum over the k selected experts e = idx[t, j] of
 *            w[t, j] * down_e(act(gate_e x'[t]) * up_e x'[t])
 * summed in ascending expert order (as transformers' index_add over experts),
 * where x' = x, or x' = rms_norm(x) * norm_w (eps) when norm_w is set (the
 * layer's pre-MLP RMSNorm done inside the op). With accumulate the sum is
 * added to out (out[t] += sum) instead of written; out may then alias x (the
 * residual stream: one op for norm, experts and residual add).
 * Expert weights are stacked along rows: expert e's gate rows are
 * gate_up rows [e*2*inter, e*2*inter + inter), its up rows the next inter;
 * its down rows are down rows [e*dim, (e+1)*dim). Only the selected experts'
 * rows are read. */
#define KN_MOE_MAX_EXPERTS 1024

typedef struct {
    const float *x; /* [n_tokens, dim] */
    float *out;     /* [n_tokens, dim], overwritten */
    int n_tokens, dim, inter, n_experts, k, act; /* n_experts <= KN_MOE_MAX_EXPERTS */
    int32_t *idx; /* [n_tokens, k] expert ids in [0, n_experts): read, or written when logits is set */
    float *w;     /* [n_tokens, k] routing weights: likewise */
    /* optional [n_tokens, n_experts] router logits: the op routes first, as
     * moe_route does with norm_topk and expert_scale, into idx and w (a
     * backend may fuse the routing into its expert kernels) */
    const float *logits;
    int norm_topk;
    const float *expert_scale;
    const kn_weight *gate_up; /* [n_experts * 2 * inter, dim] */
    const kn_weight *down;    /* [n_experts * dim, inter] */
    float *scratch;           /* backend memory, kn_moe_scratch_floats(n_tokens, dim, inter, k) floats */
    const float *norm_w;      /* optional [dim]: experts see rms_norm(x) * norm_w */
    float eps;                /* of that RMSNorm */
    int accumulate;           /* out += result (out may alias x) */
} kn_moe_args;

/* the last n_tokens * dim floats hold the normalized x where an
 * implementation normalizes before its expert kernels */
static inline size_t kn_moe_scratch_floats(int n_tokens, int dim, int inter, int k) {
    return (size_t)n_tokens * (size_t)k * (2 * (size_t)dim + 3 * (size_t)inter) + (size_t)n_tokens * k * 2 +
           (size_t)n_tokens * (size_t)dim;
}
static inline float *kn_moe_scratch_xn(const kn_moe_args *a) {
    return a->scratch + kn_moe_scratch_floats(a->n_tokens, a->dim, a->inter, a->k) - (size_t)a->n_tokens * a->dim;
}

/* What the host bytes given to weight_load are, for a backend that could
 * use them in place instead of copying. */
typedef enum {
    KN_BORROW_NO = 0,       /* transient: copy them */
    KN_BORROW_MAPPED = 1,   /* valid while the model lives, in a read-only file mapping (4 KiB pages of the
                             * page cache) */
    KN_BORROW_RESIDENT = 2, /* valid while the model lives, in process memory (the synthetic store's
                             * kn_host_alloc blocks, on huge pages) */
} kn_borrow;

typedef struct kn_backend_vtbl {
    const char *name;
    void (*destroy)(kn_backend *be);
    /* memory */
    void *(*alloc)(kn_backend *be, size_t bytes);
    void (*free)(kn_backend *be, void *p);
    void (*upload)(kn_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(kn_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(kn_backend *be);
    /* may_borrow: a kn_borrow value, what host is (the CPU backend may use
     * the bytes in place; others copy) */
    kn_code (*weight_load)(kn_backend *be, kn_dtype dt, int64_t rows, int64_t cols, const void *host,
                           int may_borrow, kn_weight *out, kn_error *err);
    /* ops */
    void (*embed)(kn_backend *be, const kn_weight *table, const int32_t *ids, int n, float *out);
    void (*rms_norm)(kn_backend *be, const float *x, int64_t x_stride, float *out, int64_t out_stride, int rows,
                     int groups, int dim, const float *w, float eps);
    void (*matmul)(kn_backend *be, const float *x, int rows, const kn_weight *w, const float *bias, float *out);
    /* optional (NULL, or returns 0 having done nothing: callers use matmul +
     * add): out += x . W^T (+ bias), the residual add fused into the
     * matmul's epilogue; the same numbers as matmul, then add */
    int (*matmul_add)(kn_backend *be, const float *x, int rows, const kn_weight *w, const float *bias, float *out);
    void (*rope)(kn_backend *be, float *x, int64_t stride, int n_tokens, int n_heads, int head_dim,
                 const int32_t *pos, const kn_rope_table *rope);
    void (*kv_write)(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                     int n_tokens, const int32_t *slots);
    void (*attention)(kn_backend *be, const kn_attention_args *a);
    void (*swiglu)(kn_backend *be, const float *gate_up, int rows, int dim, float *out);
    /* LayerNorm over each row of dim: (x - mean) / sqrt(var + eps) * w + b
     * (w, b may be NULL: 1 and 0). */
    void (*layer_norm)(kn_backend *be, const float *x, int64_t x_stride, float *out, int64_t out_stride, int rows,
                       int dim, const float *w, const float *b, float eps);
    /* out[i] = gelu(x[i]) (out may equal x); approx KN_GELU_ERF or KN_GELU_TANH. */
    void (*gelu)(kn_backend *be, const float *x, int64_t n, float *out, int approx);
    /* gate_up [rows, 2*dim] (gate | up) -> out [rows, dim] = gelu(gate) * up */
    void (*geglu)(kn_backend *be, const float *gate_up, int rows, int dim, float *out, int approx);
    void (*add)(kn_backend *be, float *y, const float *x, int64_t n);
    void (*gather_rows)(kn_backend *be, const float *x, int64_t dim, const int32_t *rows, int n, float *out);
    void (*softmax)(kn_backend *be, float *x, int rows, int dim);
    /* out[r] = index of the largest x[r, :] (the first one on ties; NaN never
     * wins): greedy decoding without moving logits off the backend */
    void (*argmax_rows)(kn_backend *be, const float *x, int rows, int dim, int32_t *out);
    /* ---- whisper ---- */
    /* im2col of a 1-D convolution, so that conv1d = matmul with torch's
     * Conv1d weight [c_out, c_in, k] viewed as [c_out, c_in*k]. Input element
     * (t, c), t < t_in, c < c_in, is x[t*x_t_stride + c*x_c_stride] (so a
     * [c, t] mel and a [t, c] activation both work); out is [t_out, c_in*k]
     * with out[t][c*k + j] = x(t*stride + j - pad, c), zero outside the input;
     * t_out = (t_in + 2*pad - k) / stride + 1. */
    void (*im2col_1d)(kn_backend *be, const float *x, int64_t x_t_stride, int64_t x_c_stride, int t_in, int c_in,
                      int k, int stride, int pad, float *out);
    void (*attention_dense)(kn_backend *be, const kn_dense_attention_args *a);
    /* measurement: sustained memory read bandwidth in bytes/s (the floor
     * that memory-bound decode is compared against) */
    double (*read_bandwidth)(kn_backend *be);
    /* Optional launch-free replay (NULL where a backend has none). A forward
     * of one batch shape (key) is recorded once and then replayed with new
     * index data. graph_replay: 1 if key was recorded and has been launched.
     * graph_begin: 1 if the ops enqueued until graph_end are being recorded
     * (not executed yet), 0 if they run eagerly (first sight of the key).
     * graph_end: launches the recording; 0 if recording failed, and then the
     * caller must enqueue the ops again (they will run eagerly). Index arrays
     * and scratch pointers used inside must stay fixed for a key. */
    int (*graph_replay)(kn_backend *be, uint64_t key);
    int (*graph_begin)(kn_backend *be, uint64_t key);
    int (*graph_end)(kn_backend *be, uint64_t key);
    /* optional: device memory free and total, in bytes (NULL on the CPU) */
    void (*memory_info)(kn_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* ---- model families ---- */
    /* x[i] = cap * tanh(x[i] / cap) (gemma2 final logit soft-capping) */
    void (*softcap)(kn_backend *be, float *x, int64_t n, float cap);
    /* x[i] *= s (granite multipliers, gemma embedding scale) */
    void (*scale)(kn_backend *be, float *x, int64_t n, float s);
    /* y[r, :] += sigmoid(gate[r]) * x[r, :] for rows r (qwen2_moe shared expert) */
    void (*sigmoid_gate_add)(kn_backend *be, float *y, const float *x, const float *gate, int rows, int dim);
    /* MoE router: per row of logits [rows, n_experts], softmax, then the k
     * largest probabilities (ties: lower expert id first) into idx/w [rows, k]
     * in descending order; norm_topk: divide the k weights by their sum;
     * expert_scale (NULL = none): then multiply weight j by expert_scale[idx j] (gemma4). */
    void (*moe_route)(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                      const float *expert_scale, int32_t *idx, float *w);
    void (*moe_ffn)(kn_backend *be, const kn_moe_args *a);
    /* y[r, j] *= x[r * x_stride + j] for r < rows, j < dim (gemma4 per-layer inputs) */
    void (*mul_rows)(kn_backend *be, float *y, const float *x, int64_t x_stride, int rows, int dim);
    /* optional (NULL: no quantized weights): load an MLX affine-quantized
     * weight, kept packed (scales/biases as kn_weight says). matmul, matmul_add
     * and embed then accept it. */
    kn_code (*weight_load_quant)(kn_backend *be, const kn_quant_host *src, kn_weight *out, kn_error *err);
    /* optional (NULL, or returns 0 having enqueued nothing: the caller runs the
     * separate ops): one fused decode-shaped matmul over M rows of x,
     *   y = rms_norm(x; norm_w, eps) . W^T + bias   (norm_w NULL: y = x . W^T + bias)
     * epilogue KN_EPI_NONE: out [M, W rows] = y; KN_EPI_SWIGLU: W's first half
     * of rows are gate, the second half up, out [M, rows/2] = silu(gate) * up.
     * Numerically the same as rms_norm, matmul (and swiglu) in sequence. */
    int (*fused_matmul)(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                        const float *bias, float *out, int epilogue);
    /* optional (NULL: no delayed KV conversion): rows of staging slots
     * src[i] (bf16 arena, kv->sk/sv) re-encoded into the layer's formats at
     * compressed slots dst[i], i < n */
    void (*kv_convert)(kn_backend *be, const kn_kv_layer *kv, const int32_t *src, const int32_t *dst, int n);
    /* ---- gemma3n (AltUp streams, activation sparsity) ---- */
    /* Streams are [rows, dim] blocks stream_stride floats apart. For c < n_out, t < rows:
     *   out[c][t] = sum over a < n_src of (w[t][c][a] + w_add) * src[a][t]  (+ base[c][t])
     * with w [rows, n_out, n_src] (NULL: all 0) and base NULL meaning 0; the
     * sum runs a = 0, 1, ... and base is added last. out may be base, not src. */
    void (*stream_mix)(kn_backend *be, const float *src, int n_src, const float *base, float *out, int n_out,
                       int64_t stream_stride, const float *w, float w_add, int rows, int dim);
    /* x[r, :] = x[r, :] * rms(ref[r, :]) / sqrt(max(mean(x[r, :]^2), floor)), rms = sqrt(mean of squares) */
    void (*rms_match)(kn_backend *be, float *x, const float *ref, int rows, int dim, float floor);
    /* x[r, j] = max(0, x[r, j] - (mean_r + std_r * mult)) for j < dim, rows x_stride apart; mean and
     * (population) std over the row's dim values */
    void (*gaussian_topk)(kn_backend *be, float *x, int64_t x_stride, int rows, int dim, float mult);
    /* ---- sampling ---- */
    /* optional (NULL: callers sample on the host): out[r] = the token of
     * logits row x[r, :V] under params[r] by the rule of base/sampling.h
     * (edits applied to x in place; a row's edits name distinct tokens).
     * params, edits and out are backend memory. */
    void (*sample_rows)(kn_backend *be, float *x, int rows, int V, const kn_sample_params *params,
                        const kn_logit_edit *edits, int32_t *out);
    /* optional (NULL or returns 0, having done nothing: callers run the
     * norms, rope and kv_write): rope over the n_q_heads query heads at qk
     * and the n_kv_heads key heads that follow them, then the rotated keys and
     * v written to kv at slots (as kv_write), in one pass. With q_norm and
     * k_norm (both or neither), each head is first RMS-normed in place with
     * that weight [head_dim], exactly as rms_norm(groups = heads) would. */
    int (*rope_kv_write)(kn_backend *be, float *qk, const float *v, int64_t stride, int n_tokens, int n_q_heads,
                         int n_kv_heads, int head_dim, const int32_t *pos, const kn_rope_table *rope,
                         const kn_kv_layer *kv, const int32_t *slots, const float *q_norm, const float *k_norm,
                         float eps);
    /* ---- whisper front end ---- */
    /* optional (NULL: callers compute the mel on the host, audio/mel.h):
     * Whisper's log-mel spectrogram, the numbers of kn_mel_compute. pcm
     * [n_samples] (16 kHz mono; may be unused when n_samples is 0) is taken
     * as a signal of exactly n_frames * 160 samples (zero-padded or
     * truncated); frame t is samples [t*160 - 200, t*160 + 200) of it,
     * reflect-padded at both ends, times the periodic Hann window of 400;
     * power of its 201 rFFT bins; projected on filters [n_mels, 201] (the
     * Slaney bank, kn_mel_filters) summing in double; log10(max(mel, 1e-10));
     * clamped below at (max over all of out) - 8; then (x + 4) / 4 into out
     * [n_mels, n_frames]. n_frames >= 2, 1 <= n_mels <= 512. pcm, filters
     * and out are backend memory. Returns when out is complete (a resource
     * call: device allocation and FFT failures are errors, not prints). */
    kn_code (*log_mel)(kn_backend *be, const float *pcm, int64_t n_samples, int64_t n_frames, const float *filters,
                       int n_mels, float *out, kn_error *err);
    /* optional (NULL, or returns 0 having enqueued nothing: the caller runs
     * fused_matmul with KN_EPI_SWIGLU, then matmul_add): the gated SiLU
     * feed-forward of M rows added into x,
     *   x += (silu(gate) * up) . down^T + down_bias,
     *   [gate | up] = rms_norm(xn; norm_w, eps) . gate_up^T + gate_up_bias
     * (norm_w NULL: xn as it is). Numerically the same as that pair of ops;
     * the point is that the activation never exists in f32 (a prefill-sized
     * backend keeps it in the down projection's input dtype). */
    int (*mlp_swiglu_add)(kn_backend *be, const float *xn, int M, const float *norm_w, float eps,
                          const kn_weight *gate_up, const float *gate_up_bias, const kn_weight *down,
                          const float *down_bias, float *x);
    /* optional (NULL or returns 0, having done nothing: callers run
     * rope_kv_write, or its steps, then attention): rope_kv_write(r) and
     * attention(a) in one pass, with the same results up to float rounding
     * (the norms' and rotations' sums may run in another order). a->q is
     * r->qk, a->kv is r->kv, and each query token is the only token of its
     * sequence in the batch (the caller checks), so the one cached row a
     * token reads that this step writes is its own. r->qk's query heads are
     * left unspecified (rotated or not): callers do not read them after. */
    int (*rope_kv_attention)(kn_backend *be, const kn_rope_kv_args *r, const kn_attention_args *a);
    /* optional (NULL: the backend's ops cannot fail): the first device
     * failure since the last call (a kernel that did not launch, a fault
     * found when the stream synchronized) as an error, then forgotten;
     * KN_OK when there was none. Callers ask after a synchronizing call. */
    kn_code (*take_error)(kn_backend *be, kn_error *err);
} kn_backend_vtbl;

enum { KN_EPI_NONE = 0, KN_EPI_SWIGLU = 1 };

struct kn_backend {
    const kn_backend_vtbl *vt;
    int n_threads;
    int max_positions; /* longest sequence attention supports; 0 = unlimited */
    /* matmuls of at least this many rows may round x to the weight's 16-bit
     * dtype before multiplying (tensor-core GEMM), and fused_matmul's SwiGLU
     * epilogue may round gate and up (bias included) to it before silu(g) * u
     * (a 16-bit GEMM output); 0 = x is always used in float32. Tests build
     * their reference accordingly. */
    int matmul_x_rounding_min_rows;
    /* Quantized (MLX affine) matmuls: the largest error of an element of x
     * as used, relative to max |x| over its group (0 = x used in f32). The
     * CPU's VNNI kernels carry x as two int8 terms: 1 / 32512. Tests bound
     * quantized-vs-dequantized results accordingly. */
    double quant_x_rel_error;
    /* moe_ffn accepts MLX-quantized expert stacks (else models with them are
     * refused at load) */
    int moe_quantized_experts;
    /* fraction of the device's memory this process may fill (weights, KV
     * cache, scratch); 0 = 0.9. Used where memory_info exists. */
    double memory_fraction;
    /* tokens per prefill forward this backend runs best with (larger GEMMs
     * fill a GPU); 0 = the model's default (512) */
    int prefill_chunk;
};

/* Create a backend by name ("cpu", or "cuda" in builds with KILN_CUDA).
 * n_threads 0 = all cores. */
kn_code kn_backend_create(const char *name, int n_threads, kn_backend **out, kn_error *err);
void kn_backend_destroy(kn_backend *be);

/* Thin inline dispatchers keep call sites short: kn_be_matmul(be, ...). */
static inline void *kn_be_alloc(kn_backend *be, size_t n) { return be->vt->alloc(be, n); }
static inline void kn_be_free(kn_backend *be, void *p) { if (p) be->vt->free(be, p); }
static inline void kn_be_upload(kn_backend *be, void *d, const void *s, size_t n) { be->vt->upload(be, d, s, n); }
static inline void kn_be_download(kn_backend *be, void *d, const void *s, size_t n) { be->vt->download(be, d, s, n); }
static inline void kn_be_sync(kn_backend *be) { be->vt->sync(be); }
static inline kn_code kn_be_take_error(kn_backend *be, kn_error *err) {
    return be->vt->take_error ? be->vt->take_error(be, err) : KN_OK;
}

static inline kn_code kn_be_weight_load(kn_backend *be, kn_dtype dt, int64_t rows, int64_t cols, const void *host,
                                        int may_borrow, kn_weight *out, kn_error *err) {
    return be->vt->weight_load(be, dt, rows, cols, host, may_borrow, out, err);
}
/* Validates the description (bits, group size, shape) before dispatching. */
kn_code kn_be_weight_load_quant(kn_backend *be, const kn_quant_host *src, kn_weight *out, kn_error *err);
/* Bytes a weight occupies (packed codes plus scales/biases when quantized). */
static inline int64_t kn_weight_bytes(const kn_weight *w) {
    if (!w->data) return 0;
    if (w->bits)
        return w->rows * (w->cols * w->bits / 8 + 2 * (w->cols / w->group_size) * (int64_t)kn_dtype_size(w->sb_dtype));
    return w->rows * w->cols * (int64_t)kn_dtype_size(w->dtype);
}
/* Rows [row0, row0 + rows) of w as a borrowed weight (codes and their
 * scales/biases for quantized weights; both stored row-major). */
static inline kn_weight kn_weight_rows(const kn_weight *w, int64_t row0, int64_t rows) {
    kn_weight s = *w;
    s.rows = rows, s.owned = 0;
    if (w->bits) {
        const int64_t G = w->cols / w->group_size;
        const size_t sz = kn_dtype_size(w->sb_dtype);
        s.data = (const uint8_t *)w->data + (size_t)row0 * (size_t)(w->cols * w->bits / 32) * 4;
        s.scales = (const uint8_t *)w->scales + (size_t)(row0 * G) * sz;
        s.biases = (const uint8_t *)w->biases + (size_t)(row0 * G) * sz;
    } else {
        s.data = (const uint8_t *)w->data + (size_t)row0 * (size_t)w->cols * kn_dtype_size(w->dtype);
    }
    return s;
}
static inline void kn_be_weight_free(kn_backend *be, kn_weight *w) {
    if (w->owned && w->data) be->vt->free(be, (void *)w->data);
    w->data = NULL;
    w->owned = 0;
    w->scales = w->biases = NULL;
}

#endif

/* kiln.h — the public C API of libkiln.
 *
 * Open a Hugging Face checkpoint directory, run teacher-forced logits, and
 * generate tokens. All functions return a kn_code; on failure the optional
 * kn_error receives one human-readable line. Objects are opaque and owned by
 * the caller that created them (free with the matching close/free call). */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION "0.1.0"

typedef enum {
    KN_OK = 0,
    KN_ERR_IO,          /* file missing, unreadable, mmap failed */
    KN_ERR_FORMAT,      /* malformed or hostile input */
    KN_ERR_UNSUPPORTED, /* valid input kiln does not handle (yet) */
    KN_ERR_INVALID_ARG, /* caller passed a bad value */
    KN_ERR_NOMEM,       /* allocation failed */
    KN_ERR_NOT_FOUND,   /* a named tensor/key/file is absent */
    KN_ERR_BACKEND,     /* compute backend failure */
    KN_ERR_INTERNAL,    /* invariant broken: a kiln bug */
} kn_code;

typedef struct {
    kn_code code;
    char msg[512];
} kn_error;

const char *kn_code_name(kn_code code);

/* ---- models ---------------------------------------------------------- */

typedef struct kn_model kn_model;

typedef struct {
    const char *backend; /* "cpu" (default) */
    int n_threads;       /* 0 = all cores */
    int max_context;     /* 0 = min(config max_position_embeddings, 8192) */
    double gpu_memory;   /* fraction of GPU memory to use (weights + KV + scratch); 0 = 0.9 */
    int max_seqs;        /* sequences one forward may mix (serving batch); 0 = 1 */
    const char *kv;      /* KV cache format (KV_FORMATS.md: bf16, q8, fp8, q4, k8v3, tq4, k4v3, "K:V", ...);
                            NULL = the compute dtype's (f32 for f32 weights, else bf16) */
    int kv_keep_layers;  /* layers kept bf16 at each end: 0 = the format's default (2 below 4 bits), < 0 = none */
    int kv_start;        /* delayed conversion: sequences stay bf16 until they hold this many tokens (rounded up
                            to 16), then convert to kv; 0 = convert on write (CPU backend only so far) */
} kn_model_options;

/* Open a model directory in HF layout (config.json + *.safetensors). */
kn_code kn_model_open(const char *dir, const kn_model_options *opts, kn_model **out, kn_error *err);
void kn_model_close(kn_model *m);

int kn_model_vocab_size(const kn_model *m);
/* Human-readable one-line description (architecture, sizes, dtype). */
const char *kn_model_describe(const kn_model *m);
/* What of the checkpoint is not used (e.g. the vision tower of a multimodal
 * checkpoint whose language model runs); "" when everything is used. */
const char *kn_model_notes(const kn_model *m);

/* Teacher-forced logits: out receives n_ids * vocab floats, row i is the
 * distribution after ids[0..i]. */
kn_code kn_model_logits(kn_model *m, const int32_t *ids, int n_ids, float *out, kn_error *err);

/* ---- generation ------------------------------------------------------ */

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    int max_new_tokens;
    int ignore_eos;    /* 1: do not stop at generation_config's eos ids */
} kn_sampling;

/* Defaults from the model's generation_config.json (greedy when it has none). */
kn_sampling kn_sampling_defaults(const kn_model *m);

/* Called for every generated token; return non-zero to stop. */
typedef int (*kn_token_cb)(int32_t token, void *user);

typedef struct {
    int n_prompt, n_generated;
    double prefill_seconds, decode_seconds;
} kn_generate_stats;

kn_code kn_generate(kn_model *m, const int32_t *prompt, int n_prompt, const kn_sampling *s,
                    kn_token_cb cb, void *user, kn_generate_stats *stats, kn_error *err);

#ifdef __cplusplus
}
#endif
#endif

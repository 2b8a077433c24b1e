/* whisper.h — the Whisper encoder-decoder (HF WhisperForConditionalGeneration
 * layout) on the op interface, plus the decoding-relevant parts of its
 * generation_config.json.
 *
 * A kn_whisper holds the weights and one decoding state: the encoder output
 * and the cross-attention K/V of the current 30 s window (computed once by
 * kn_whisper_encode), and a self-attention K/V cache for up to max_slots
 * decoder sequences (beams) of up to max_target_positions tokens. It is not
 * safe for concurrent use; open one per concurrent transcription.
 *
 * Flow: encode(mel) once per window, then decode(tokens of every slot at
 * positions pos0..) repeatedly; reorder() permutes slots between beam steps. */
#ifndef KN_MODELS_WHISPER_H
#define KN_MODELS_WHISPER_H

#include <stdint.h>

#include "base/status.h"

#define KN_WHISPER_MAX_SUPPRESS 512
#define KN_WHISPER_MAX_LANGS 128
#define KN_WHISPER_MAX_ALIGN_HEADS 256

typedef struct {
    /* config.json */
    int vocab_size, n_mels, d_model;
    int enc_layers, enc_heads, enc_ffn;
    int dec_layers, dec_heads, dec_ffn;
    int max_source_positions, max_target_positions;
    int gelu_approx; /* KN_GELU_ERF ("gelu") or KN_GELU_TANH ("gelu_new", "gelu_pytorch_tanh") */
    /* generation_config.json (-1 when absent) */
    int decoder_start_token_id; /* <|startoftranscript|> */
    int eos_token_id;           /* <|endoftext|> */
    int no_timestamps_token_id; /* timestamps begin at this + 1; <|nospeech|> is this - 1 */
    int prev_sot_token_id;      /* <|startofprev|> */
    int transcribe_token_id, translate_token_id;
    int max_initial_timestamp_index;
    int is_multilingual;
    int n_suppress, suppress_tokens[KN_WHISPER_MAX_SUPPRESS];
    int n_begin_suppress, begin_suppress_tokens[KN_WHISPER_MAX_SUPPRESS];
    int n_langs;
    char lang_code[KN_WHISPER_MAX_LANGS][12]; /* "en" from "<|en|>" */
    int lang_token_id[KN_WHISPER_MAX_LANGS];
    /* cross-attention heads that align text with audio (word timestamps):
     * generation_config alignment_heads [[layer, head], ...], else every
     * head of the last half of the decoder layers (as openai-whisper) */
    int n_align;
    int align_layer[KN_WHISPER_MAX_ALIGN_HEADS], align_head[KN_WHISPER_MAX_ALIGN_HEADS];
} kn_whisper_config;

typedef struct kn_whisper kn_whisper;
typedef struct kn_backend kn_backend;

typedef struct {
    const char *backend; /* "cpu" (default) or "cuda" */
    int n_threads;       /* 0 = all cores */
    int max_slots;       /* decoder sequences decoded together (beams); 0 = 5 */
} kn_whisper_options;

/* 1 if DIR/config.json says model_type "whisper" (no error reporting). */
int kn_whisper_is_whisper_dir(const char *dir);

kn_code kn_whisper_open(const char *dir, const kn_whisper_options *o, kn_whisper **out, kn_error *err);
void kn_whisper_close(kn_whisper *w);
const kn_whisper_config *kn_whisper_cfg(const kn_whisper *w);
const char *kn_whisper_describe(const kn_whisper *w);
/* The backend w runs on (owned by w, valid until kn_whisper_close; the mel
 * front end runs there too, see audio/mel_backend.h). */
kn_backend *kn_whisper_backend(kn_whisper *w);

/* Run the encoder on mel (host, [n_mels, 2 * max_source_positions], i.e.
 * [n_mels, 3000]) and compute every decoder layer's cross-attention K/V.
 * Self-attention caches of the previous window are stale afterwards: the
 * next decode starts at position 0. */
kn_code kn_whisper_encode(kn_whisper *w, const float *mel, kn_error *err);

/* Copy the encoder output of the last encode into out (host,
 * [max_source_positions, d_model]). */
void kn_whisper_encoder_output(kn_whisper *w, float *out);

/* Decode n_new tokens for each of n_slots sequences: tokens[s * n_new + i]
 * sits at position pos0 + i of slot s; positions < pos0 must already be in
 * the slot's cache. logits (host) receives, for each slot, the logits of
 * every new token (all_logits: [n_slots * n_new, vocab]; only n_slots == 1)
 * or of its last one ([n_slots, vocab]). */
kn_code kn_whisper_decode(kn_whisper *w, int n_slots, int n_new, const int32_t *tokens, int pos0, int all_logits,
                          float *logits, kn_error *err);

/* Teacher-forced pass of tokens (positions 0..n-1, slot 0's cache is
 * overwritten) that records, for each alignment head a (config n_align),
 * the scaled cross-attention scores q.k / sqrt(head_dim) of every token over
 * the first n_frames encoder positions: qk[(a * n + i) * n_frames + f]
 * (host). logits (host, may be NULL) receives [n, vocab]. */
kn_code kn_whisper_cross_qk(kn_whisper *w, const int32_t *tokens, int n, int n_frames, float *qk, float *logits,
                            kn_error *err);

/* Beam bookkeeping: slot s takes over the cache of slot src[s] for positions
 * [0, len). */
kn_code kn_whisper_reorder(kn_whisper *w, int n_slots, const int *src, int len, kn_error *err);

#endif

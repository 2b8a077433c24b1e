/* tokenizer.h — Hugging Face tokenizer.json: encode text to ids and decode ids
 * to text exactly as the `tokenizers` library does, plus streaming
 * detokenization for SSE.
 *
 * A kn_tokenizer is immutable after load and safe to share between threads.
 * Buffers returned through out-pointers are malloc'd and owned by the caller
 * (free()). Errors are values: kn_code + one line in kn_error. */
#ifndef KN_TOKENIZER_H
#define KN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kn_tokenizer kn_tokenizer;

/* Load DIR/tokenizer.json (and DIR/tokenizer_config.json for bos/eos token
 * strings when present). A DIR with only tokenizer.model is loaded through
 * libsentencepiece where the build has it (then encode's add_special adds BOS
 * and decode always drops control symbols, as SentencePiece does). */
kn_code kn_tokenizer_load(const char *dir, kn_tokenizer **out, kn_error *err);
/* Load from an in-memory tokenizer.json (config_json may be NULL). */
kn_code kn_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json, kn_tokenizer **out,
                               kn_error *err);
void kn_tokenizer_free(kn_tokenizer *t);

/* Encode UTF-8 text. add_special = 1 applies the post-processor (BOS/EOS,
 * TemplateProcessing) as HF encode(add_special_tokens=True). Special/added
 * token strings inside text are matched either way, as HF does. *ids is
 * malloc'd (caller frees); invalid UTF-8 is an error. */
kn_code kn_tokenizer_encode(const kn_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                            int *n_ids, kn_error *err);

/* Decode ids to UTF-8 text as HF decode(ids, skip_special_tokens=skip_special).
 * *text is malloc'd and NUL-terminated; an id out of range is an error. */
kn_code kn_tokenizer_decode(const kn_tokenizer *t, const int32_t *ids, int n_ids, int skip_special, char **text,
                            size_t *len, kn_error *err);

int kn_tokenizer_vocab_size(const kn_tokenizer *t);          /* model vocab + added tokens */
int32_t kn_tokenizer_token_id(const kn_tokenizer *t, const char *token); /* exact token string; -1 if absent */
const char *kn_tokenizer_token(const kn_tokenizer *t, int32_t id);      /* raw token string; NULL if out of range */
int kn_tokenizer_is_special(const kn_tokenizer *t, int32_t id);
/* bos/eos token strings from tokenizer_config.json (NULL when absent). */
const char *kn_tokenizer_bos_token(const kn_tokenizer *t);
const char *kn_tokenizer_eos_token(const kn_tokenizer *t);

/* Streaming detokenization: push ids one at a time and receive only text that
 * is final — never half a UTF-8 character, never text a later token could
 * still change (e.g. byte-fallback sequences, decoder cleanups). The
 * concatenation of all deltas plus the flush equals kn_tokenizer_decode of
 * all ids pushed. */
typedef struct kn_detok_stream kn_detok_stream;
kn_code kn_detok_stream_new(const kn_tokenizer *t, int skip_special, kn_detok_stream **out, kn_error *err);
/* *delta (malloc'd, NUL-terminated, possibly empty) is the newly final text. */
kn_code kn_detok_stream_push(kn_detok_stream *s, int32_t id, char **delta, size_t *len, kn_error *err);
/* The remaining text (e.g. an incomplete trailing byte sequence as U+FFFD, as HF decode does). */
kn_code kn_detok_stream_flush(kn_detok_stream *s, char **delta, size_t *len, kn_error *err);
void kn_detok_stream_free(kn_detok_stream *s);

#endif

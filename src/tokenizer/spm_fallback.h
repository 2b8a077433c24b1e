/* spm_fallback.h — SentencePiece (tokenizer.model) for checkpoints that ship
 * no tokenizer.json, through libsentencepiece (C++; this is its C face).
 * Built only when CMake finds sentencepiece (KILN_HAVE_SENTENCEPIECE).
 * Semantics are SentencePiece's own: encode optionally prepends BOS, decode
 * drops control symbols (bos/eos/pad) and merges byte pieces. A loaded
 * kn_spm is read-only and may be shared between threads. */
#ifndef KN_SPM_FALLBACK_H
#define KN_SPM_FALLBACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_spm kn_spm;

/* 0 on success; on failure err receives one line. */
int kn_spm_load(const char *path, kn_spm **out, char *err, size_t err_len);
void kn_spm_free(kn_spm *s);
int kn_spm_encode(const kn_spm *s, const char *text, size_t len, int add_bos, int32_t **ids, int *n_ids, char *err,
                  size_t err_len);
int kn_spm_decode(const kn_spm *s, const int32_t *ids, int n_ids, char **text, size_t *len, char *err, size_t err_len);
int kn_spm_piece_count(const kn_spm *s);
/* piece string of id (owned by s) */
const char *kn_spm_piece(const kn_spm *s, int id, size_t *len);
int kn_spm_is_control(const kn_spm *s, int id);
int kn_spm_is_byte(const kn_spm *s, int id);

#ifdef __cplusplus
}
#endif

#endif

/* tok_internal.h — the insides of kn_tokenizer, shared by the files of
 * src/tokenizer/ (tokenizer.c loads and dispatches; bpe.c, normalizers.c,
 * pretokenizers.c, postprocessors.c, decoders.c, added_tokens.c implement one
 * stage each; tok_util.c holds buffers, hash maps, UTF-8 and Unicode helpers).
 *
 * Invariants:
 *  1. A loaded kn_tokenizer is never written again: every per-call scratch
 *     buffer lives in a kn_tok_ctx owned by the caller of encode/decode.
 *  2. Every id in [0, n_ids) has a token string (possibly empty for gaps,
 *     flagged by tok_len[id] == KN_TOK_NONE).
 *  3. All text handed between stages is valid UTF-8 (input is validated once
 *     at the API boundary; each stage preserves validity). */
#ifndef KN_TOK_INTERNAL_H
#define KN_TOK_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/spm_fallback.h"
#include "tokenizer/tokenizer.h"

#define KN_TOK_NONE UINT32_MAX

/* ---- growable byte buffer ------------------------------------------------ */
typedef struct {
    char *p;
    size_t n, cap;
} kn_tbuf;

int kn_tbuf_reserve(kn_tbuf *b, size_t extra); /* 0 ok, -1 out of memory */
int kn_tbuf_put(kn_tbuf *b, const void *s, size_t n);
void kn_tbuf_free(kn_tbuf *b);

/* ---- pieces: spans of one buffer ---------------------------------------- */
/* A piece of the text on its way through the pipeline. added_id >= 0 marks a
 * piece already resolved to an added token (later stages pass it through).
 * at_origin: the piece starts at offset 0 of the original input (Metaspace
 * prepend_scheme "first" needs it). */
typedef struct {
    size_t off, len;
    int32_t added_id;
    uint8_t at_origin;
} kn_piece;

typedef struct {
    kn_tbuf text;
    kn_piece *v;
    size_t n, cap;
} kn_pieces;

int kn_pieces_push(kn_pieces *p, const char *s, size_t len, int32_t added_id, int at_origin);
/* Append a piece that already lives in p->text. */
int kn_pieces_push_span(kn_pieces *p, size_t off, size_t len, int32_t added_id, int at_origin);
void kn_pieces_clear(kn_pieces *p);
void kn_pieces_free(kn_pieces *p);

/* ---- id list --------------------------------------------------------------- */
typedef struct {
    int32_t *v;
    size_t n, cap;
} kn_ids;

int kn_ids_push(kn_ids *l, int32_t id);
int kn_ids_append(kn_ids *l, const int32_t *ids, size_t n);

/* ---- hash maps -------------------------------------------------------------- */
uint64_t kn_hash_bytes(const void *p, size_t n);

/* token string -> id over strings owned elsewhere (the tokenizer's arena) */
typedef struct {
    int32_t *slot; /* -1 empty, else id */
    uint32_t *hash;
    size_t cap, n;
    const char *const *str; /* str[id], len[id]: the key of id */
    const uint32_t *len;
} kn_strmap;

int kn_strmap_init(kn_strmap *m, size_t expected, const char *const *str, const uint32_t *len);
/* Insert id (its key is str[id]); an existing key is rebound to id. */
int kn_strmap_put(kn_strmap *m, int32_t id);
int32_t kn_strmap_get(const kn_strmap *m, const char *s, size_t n);
void kn_strmap_free(kn_strmap *m);

/* uint64 -> uint64 (key UINT64_MAX is reserved) */
typedef struct {
    uint64_t *key, *val;
    size_t cap, n;
} kn_u64map;

int kn_u64map_init(kn_u64map *m, size_t expected);
int kn_u64map_put(kn_u64map *m, uint64_t k, uint64_t v);
int kn_u64map_get(const kn_u64map *m, uint64_t k, uint64_t *v);
void kn_u64map_free(kn_u64map *m);

/* ---- UTF-8 and Unicode ------------------------------------------------------ */
/* Length of the valid prefix of s (== n when all valid). */
size_t kn_utf8_valid_prefix(const char *s, size_t n);
/* Decode one code point of valid UTF-8 at s; returns its byte length. */
int kn_utf8_decode(const char *s, size_t n, uint32_t *cp);
int kn_utf8_encode(uint32_t cp, char out[4]);
/* Append bytes to out replacing invalid sequences by U+FFFD as Rust's
 * String::from_utf8_lossy does (one per maximal invalid subpart). */
int kn_utf8_lossy(kn_tbuf *out, const char *s, size_t n);

int kn_uni_is_whitespace(uint32_t cp);  /* Rust char::is_whitespace */
int kn_uni_is_numeric(uint32_t cp);     /* Rust char::is_numeric (Nd Nl No) */
int kn_uni_is_punct(uint32_t cp);       /* ASCII punctuation or Unicode P* */
int kn_uni_is_word(uint32_t cp);        /* regex \w */
int kn_uni_is_mark_nonspacing(uint32_t cp);
int kn_uni_is_control(uint32_t cp);
int kn_uni_is_cjk(uint32_t cp);

/* ---- patterns: literal string or PCRE2 regex ---------------------------------- */
typedef struct {
    char *literal; /* when not NULL: a literal string */
    size_t literal_len;
    pcre2_code *re;
} kn_pattern;

/* Parse {"String": s} or {"Regex": r}. */
kn_code kn_pattern_parse(const json_t *j, const char *where, kn_pattern *p, kn_error *err);
void kn_pattern_free(kn_pattern *p);

/* Per-call scratch shared by all stages (never part of the tokenizer). */
typedef struct kn_tok_ctx {
    pcre2_match_data *md;
    kn_tbuf scratch[4];
    kn_pieces pa, pb;
    /* BPE word scratch */
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    void *uni; /* Unigram best-path nodes */
    size_t uni_cap;
    /* word cache: word bytes -> ids (one encode call) */
    kn_tbuf cache_keys;
    kn_ids cache_ids;
    uint64_t *cache_slot; /* hash of key << 32 | entry index + 1 */
    uint32_t *cache_entry; /* 4 per entry: key off, key len, ids off, ids n */
    size_t cache_cap, cache_n;
} kn_tok_ctx;

int kn_tok_ctx_init(kn_tok_ctx *c);
void kn_tok_ctx_free(kn_tok_ctx *c);

/* Find the next match of p in s[0..n) at or after `from`. Returns 1 and sets
 * [*ms, *me) when found, 0 when none, -1 on a regex engine error (limits). */
int kn_pattern_next(const kn_pattern *p, kn_tok_ctx *c, const char *s, size_t n, size_t from, size_t *ms,
                    size_t *me);

/* ---- stages ---------------------------------------------------------------- */
typedef struct kn_normalizer kn_normalizer;
typedef struct kn_pretok kn_pretok;
typedef struct kn_postproc kn_postproc;
typedef struct kn_decoder kn_decoder;

kn_code kn_normalizer_parse(const json_t *j, kn_normalizer **out, kn_error *err);
void kn_normalizer_free(kn_normalizer *n);
/* Normalize s into out (out is cleared first). */
kn_code kn_normalizer_apply(const kn_normalizer *n, kn_tok_ctx *c, const char *s, size_t len, kn_tbuf *out,
                            kn_error *err);

kn_code kn_pretok_parse(const json_t *j, kn_pretok **out, kn_error *err);
void kn_pretok_free(kn_pretok *p);
/* Split/transform the pieces of *io (added-token pieces pass through). */
kn_code kn_pretok_apply(const kn_pretok *p, kn_tok_ctx *c, kn_pieces *io, kn_error *err);

/* Decoders work on a token list held as pieces. */
kn_code kn_decoder_parse(const json_t *j, kn_decoder **out, kn_error *err);
void kn_decoder_free(kn_decoder *d);
kn_code kn_decoder_apply(const kn_decoder *d, kn_tok_ctx *c, kn_pieces *io, kn_error *err);
/* 1 when d has a ByteFallback stage and tok is a <0xXX> token: a later byte
 * token can still change how the current byte run decodes (streaming holds). */
int kn_decoder_pending_bytes(const kn_decoder *d, const char *tok, size_t n);

struct kn_tokenizer;
kn_code kn_postproc_parse(const json_t *j, const struct kn_tokenizer *t, kn_postproc **out, kn_error *err);
void kn_postproc_free(kn_postproc *p);
/* Apply the special-token template for a single sequence. */
kn_code kn_postproc_apply(const kn_postproc *p, const kn_ids *in, kn_ids *out, kn_error *err);

/* ---- added tokens ------------------------------------------------------------ */
typedef struct {
    char *content; /* as in tokenizer.json */
    uint32_t content_len;
    char *pattern; /* what is matched: content, or its normalized form */
    uint32_t pattern_len;
    int32_t id;
    uint8_t special, normalized, lstrip, rstrip, single_word;
} kn_added_token;

/* Byte trie over added-token patterns, leftmost-longest matching. */
typedef struct {
    kn_u64map edges; /* node << 8 | byte -> child node */
    int32_t *term;   /* node -> index into added tokens, -1 */
    size_t n_nodes, cap_nodes;
} kn_added_trie;

/* generic use (Unigram pieces): term[node] = value of the string ending there */
int kn_trie_init(kn_added_trie *tr, size_t expected_nodes);
int kn_trie_insert(kn_added_trie *tr, const char *s, size_t n, int32_t value);
kn_code kn_added_trie_build(kn_added_trie *tr, const kn_added_token *toks, size_t n, int normalized,
                            kn_error *err);
void kn_added_trie_free(kn_added_trie *tr);
/* Split piece-by-piece: pieces of `in` that are not resolved are searched for
 * added tokens; results are appended to out (pieces with added_id set for
 * matches). */
kn_code kn_added_split(const struct kn_tokenizer *t, const kn_added_trie *tr, const char *s, size_t len,
                       int at_origin, kn_pieces *out);

/* ---- fast path for model.vocab / model.merges (vocab_fast.c) ---------------- */
typedef struct {
    kn_tbuf strings;     /* vocab strings, each NUL-terminated */
    uint32_t *vocab;     /* n_vocab triples: string offset, length, id */
    size_t n_vocab;
    kn_tbuf merge_bytes; /* merge strings */
    uint32_t *merges;    /* n_merges quads: left offset, left length, right offset, right length */
    size_t n_merges;
    int has_merges;
    char *rest; /* the document with vocab and merges replaced by {} and [] */
    size_t rest_len;
} kn_vocab_fast;

/* 1 when the document has the common shape and f is filled; 0: use jansson. */
int kn_vocab_fast_parse(const char *s, size_t n, kn_vocab_fast *f);
void kn_vocab_fast_free(kn_vocab_fast *f);

/* ---- models ------------------------------------------------------------------ */
typedef enum { KN_MODEL_BPE, KN_MODEL_WORDPIECE, KN_MODEL_WORDLEVEL, KN_MODEL_UNIGRAM } kn_tokmodel_type;

typedef struct {
    kn_tokmodel_type type;
    kn_strmap vocab; /* model vocab only (not added tokens) */
    int32_t n_model;  /* number of model vocab entries */
    /* BPE */
    kn_u64map merges; /* (left id << 32 | right id) -> (rank << 32 | merged id) */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id; /* -1 when unk_token is null */
    char *unk_token;
    char *cont_prefix; /* continuing_subword_prefix (NULL: none) */
    char *eow_suffix;  /* end_of_word_suffix (NULL: none) */
    int32_t byte_id[256]; /* "<0xXX>" ids for byte fallback, -1 absent */
    /* WordPiece */
    int max_input_chars_per_word;
    /* Unigram: score per id, min score, piece trie (term = id) */
    double *scores;
    double min_score;
    kn_added_trie pieces;
    int has_pieces;
} kn_tokmodel;

/* fast: merges from the fast path (NULL: read j's "merges"). */
kn_code kn_tokmodel_parse(const json_t *j, const kn_vocab_fast *fast, struct kn_tokenizer *t, kn_error *err);
void kn_tokmodel_free(kn_tokmodel *m);
/* Unigram (unigram.c) */
kn_code kn_unigram_parse(const json_t *j, struct kn_tokenizer *t, kn_error *err);
kn_code kn_unigram_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                        kn_error *err);

/* Tokenize one pre-token; ids are appended to out. */
kn_code kn_tokmodel_encode_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                             kn_error *err);

/* ---- the tokenizer ------------------------------------------------------------ */
struct kn_tokenizer {
    int32_t n_ids;     /* max id + 1 */
    char **tok;        /* tok[id]: NUL-terminated token string */
    uint32_t *tok_len; /* KN_TOK_NONE for gaps */
    uint8_t *special;  /* special[id]: an added token marked special */
    char *arena;       /* storage of the model-vocab strings */

    kn_tokmodel model;
    kn_normalizer *normalizer;
    kn_pretok *pretok;
    kn_postproc *post;
    kn_decoder *decoder;

    kn_added_token *added;
    size_t n_added;
    const char **added_content; /* added_content[i] = added[i].content: keys of added_map */
    uint32_t *added_content_len;
    kn_strmap added_map; /* content -> index into added (token_to_id looks here first) */
    kn_added_trie trie_raw;  /* non-normalized added tokens: matched on the input */
    kn_added_trie trie_norm; /* normalized added tokens: matched after normalizing */
    int has_trie_raw, has_trie_norm;

    char *bos_token, *eos_token;

    kn_spm *spm; /* tokenizer.model fallback: when set, encode/decode go to SentencePiece */
};

/* GPT-2 byte <-> unicode map (ByteLevel): printable Latin-1 bytes map to
 * themselves, the 68 others to U+0100.. in byte order. */
uint32_t kn_byte_to_cp(uint8_t b);
int kn_cp_to_byte(uint32_t cp); /* -1 when cp is not in the map */

#endif

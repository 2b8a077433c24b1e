/* tok_util.c — small containers and text helpers for the tokenizer: byte
 * buffers, piece lists, open-addressing hash maps, UTF-8 validation and
 * lossy decoding (Rust from_utf8_lossy rules), Unicode predicates with the
 * meaning Rust's char methods give them (utf8proc categories), literal/PCRE2
 * patterns, and the GPT-2 byte<->unicode map. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

/* ---- buffers ------------------------------------------------------------ */

int kn_tbuf_reserve(kn_tbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int kn_tbuf_put(kn_tbuf *b, const void *s, size_t n) {
    if (kn_tbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void kn_tbuf_free(kn_tbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int kn_pieces_push_span(kn_pieces *p, size_t off, size_t len, int32_t added_id, int at_origin) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        kn_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (kn_piece){off, len, added_id, (uint8_t)at_origin};
    return 0;
}

int kn_pieces_push(kn_pieces *p, const char *s, size_t len, int32_t added_id, int at_origin) {
    size_t off = p->text.n;
    if (kn_tbuf_put(&p->text, s, len)) return -1;
    return kn_pieces_push_span(p, off, len, added_id, at_origin);
}

void kn_pieces_clear(kn_pieces *p) {
    p->n = 0;
    p->text.n = 0;
}

void kn_pieces_free(kn_pieces *p) {
    kn_tbuf_free(&p->text);
    free(p->v);
    memset(p, 0, sizeof *p);
}

int kn_ids_push(kn_ids *l, int32_t id) { return kn_ids_append(l, &id, 1); }

int kn_ids_append(kn_ids *l, const int32_t *ids, size_t n) {
    if (l->n + n > l->cap) {
        size_t cap = l->cap ? l->cap : 16;
        while (cap < l->n + n) cap *= 2;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    if (n) memcpy(l->v + l->n, ids, n * sizeof *ids);
    l->n += n;
    return 0;
}

/* ---- hashing ------------------------------------------------------------ */

uint64_t kn_hash_bytes(const void *p, size_t n) {
    /* FNV-1a over 8-byte words with a final avalanche; fast and good enough
     * for short tokens (keys are not attacker-chosen in bulk: the vocab is
     * fixed at load; per-call word caches are bounded). */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9e3779b97f4a7c15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *s++) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

int kn_strmap_init(kn_strmap *m, size_t expected, const char *const *str, const uint32_t *len) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2 + 1);
    m->slot = malloc(m->cap * sizeof *m->slot);
    m->hash = malloc(m->cap * sizeof *m->hash);
    if (!m->slot || !m->hash) return -1;
    memset(m->slot, 0xff, m->cap * sizeof *m->slot);
    m->str = str;
    m->len = len;
    return 0;
}

static int strmap_grow(kn_strmap *m) {
    kn_strmap g;
    if (kn_strmap_init(&g, m->cap, m->str, m->len)) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slot[i] < 0) continue;
        size_t j = m->hash[i] & (g.cap - 1);
        while (g.slot[j] >= 0) j = (j + 1) & (g.cap - 1);
        g.slot[j] = m->slot[i];
        g.hash[j] = m->hash[i];
        g.n++;
    }
    kn_strmap_free(m);
    *m = g;
    return 0;
}

int kn_strmap_put(kn_strmap *m, int32_t id) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    const char *s = m->str[id];
    size_t n = m->len[id];
    uint32_t h = (uint32_t)kn_hash_bytes(s, n);
    size_t j = h & (m->cap - 1);
    while (m->slot[j] >= 0) {
        int32_t o = m->slot[j];
        if (m->hash[j] == h && m->len[o] == n && !memcmp(m->str[o], s, n)) {
            m->slot[j] = id;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slot[j] = id;
    m->hash[j] = h;
    m->n++;
    return 0;
}

int32_t kn_strmap_get(const kn_strmap *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    uint32_t h = (uint32_t)kn_hash_bytes(s, n);
    size_t j = h & (m->cap - 1);
    while (m->slot[j] >= 0) {
        int32_t o = m->slot[j];
        if (m->hash[j] == h && m->len[o] == n && !memcmp(m->str[o], s, n)) return o;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void kn_strmap_free(kn_strmap *m) {
    free(m->slot);
    free(m->hash);
    m->slot = NULL;
    m->hash = NULL;
    m->cap = m->n = 0;
}

static inline size_t u64_slot(uint64_t k, size_t cap) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

int kn_u64map_init(kn_u64map *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->key = malloc(m->cap * sizeof *m->key);
    m->val = malloc(m->cap * sizeof *m->val);
    if (!m->key || !m->val) return -1;
    memset(m->key, 0xff, m->cap * sizeof *m->key);
    return 0;
}

int kn_u64map_put(kn_u64map *m, uint64_t k, uint64_t v) {
    if ((m->n + 1) * 2 > m->cap) {
        kn_u64map g;
        if (kn_u64map_init(&g, m->cap)) return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i] != UINT64_MAX) kn_u64map_put(&g, m->key[i], m->val[i]);
        kn_u64map_free(m);
        *m = g;
    }
    size_t j = u64_slot(k, m->cap);
    while (m->key[j] != UINT64_MAX && m->key[j] != k) j = (j + 1) & (m->cap - 1);
    if (m->key[j] == UINT64_MAX) m->n++;
    m->key[j] = k;
    m->val[j] = v;
    return 0;
}

int kn_u64map_get(const kn_u64map *m, uint64_t k, uint64_t *v) {
    if (!m->cap) return 0;
    size_t j = u64_slot(k, m->cap);
    while (m->key[j] != UINT64_MAX) {
        if (m->key[j] == k) {
            *v = m->val[j];
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}

void kn_u64map_free(kn_u64map *m) {
    free(m->key);
    free(m->val);
    m->key = m->val = NULL;
    m->cap = m->n = 0;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Length of the well-formed sequence at s (1..4), or -k when the first k bytes
 * form a maximal ill-formed subpart (k >= 1). */
static int utf8_step(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        unsigned d = s[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -i;
    }
    return need + 1;
}

size_t kn_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_step(u + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

int kn_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (!n) {
        *cp = 0;
        return 0;
    }
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if ((u[0] & 0xE0) == 0xC0 && n >= 2) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if ((u[0] & 0xF0) == 0xE0 && n >= 3) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    if (n >= 4) {
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
              (u[3] & 0x3F);
        return 4;
    }
    *cp = 0xFFFD; /* not reached on validated text */
    return 1;
}

int kn_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int kn_utf8_lossy(kn_tbuf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        int k = u[i] < 0x80 ? 1 : utf8_step(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (kn_tbuf_put(out, s + run, i - run) || kn_tbuf_put(out, "\xEF\xBF\xBD", 3)) return -1;
        i += (size_t)-k;
        run = i;
    }
    return kn_tbuf_put(out, s + run, n - run);
}

/* ---- Unicode predicates ------------------------------------------------------ */

int kn_uni_is_whitespace(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int kn_uni_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

int kn_uni_is_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                          (c >= 0x7B && c <= 0x7E);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

int kn_uni_is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

int kn_uni_is_mark_nonspacing(uint32_t c) {
    return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_MN;
}

int kn_uni_is_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF;
}

int kn_uni_is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ---- GPT-2 byte map ------------------------------------------------------------ */

uint32_t kn_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int kn_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ---- patterns ---------------------------------------------------------------- */

kn_code kn_pattern_parse(const json_t *j, const char *where, kn_pattern *p, kn_error *err) {
    memset(p, 0, sizeof *p);
    const json_t *s = json_is_object(j) ? json_object_get(j, "String") : NULL;
    const json_t *r = json_is_object(j) ? json_object_get(j, "Regex") : NULL;
    if (json_is_string(s)) {
        p->literal_len = json_string_length(s);
        p->literal = malloc(p->literal_len + 1);
        if (!p->literal) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        memcpy(p->literal, json_string_value(s), p->literal_len + 1);
        return KN_OK;
    }
    if (!json_is_string(r))
        return kn_fail(err, KN_ERR_FORMAT, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
    int ecode;
    PCRE2_SIZE eoff;
    p->re = pcre2_compile((PCRE2_SPTR)json_string_value(r), json_string_length(r), PCRE2_UTF | PCRE2_UCP, &ecode,
                          &eoff, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: regex %.80s: %s at offset %zu", where, json_string_value(r),
                       (const char *)msg, (size_t)eoff);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return KN_OK;
}

void kn_pattern_free(kn_pattern *p) {
    free(p->literal);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

int kn_pattern_next(const kn_pattern *p, kn_tok_ctx *c, const char *s, size_t n, size_t from, size_t *ms,
                    size_t *me) {
    if (from > n) return 0;
    if (p->literal) {
        if (!p->literal_len) return 0; /* HF: an empty literal never matches */
        const char *hit = memmem(s + from, n - from, p->literal, p->literal_len);
        if (!hit) return 0;
        *ms = (size_t)(hit - s);
        *me = *ms + p->literal_len;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) *me = *ms; /* \K tricks; never in tokenizer patterns */
    return 1;
}

int kn_tok_ctx_init(kn_tok_ctx *c) {
    memset(c, 0, sizeof *c);
    c->md = pcre2_match_data_create(32, NULL);
    return c->md ? 0 : -1;
}

void kn_tok_ctx_free(kn_tok_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    for (int i = 0; i < 4; i++) kn_tbuf_free(&c->scratch[i]);
    kn_pieces_free(&c->pa);
    kn_pieces_free(&c->pb);
    free(c->sym);
    free(c->heap);
    free(c->uni);
    kn_tbuf_free(&c->cache_keys);
    free(c->cache_ids.v);
    free(c->cache_slot);
    free(c->cache_entry);
    memset(c, 0, sizeof *c);
}

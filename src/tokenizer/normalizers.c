/* normalizers.c — tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD (utf8proc),
 * Lowercase, Strip, StripAccents, Replace, Prepend, BertNormalizer, ByteLevel,
 * Precompiled (SentencePiece's charsmap: a Darts double-array trie of rewrite
 * rules, applied per grapheme cluster as `tokenizers` does) and Sequence,
 * applied as HF `tokenizers` does (offsets are not tracked: kiln needs ids,
 * not alignments). An unknown type is a load error naming it. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

typedef enum {
    N_SEQUENCE,
    N_NFC,
    N_NFD,
    N_NFKC,
    N_NFKD,
    N_LOWERCASE,
    N_STRIP,
    N_STRIP_ACCENTS,
    N_REPLACE,
    N_PREPEND,
    N_BERT,
    N_BYTE_LEVEL,
    N_PRECOMPILED,
} norm_type;

struct kn_normalizer {
    norm_type type;
    kn_normalizer **child;
    size_t n_child;
    int left, right;                                   /* Strip */
    kn_pattern pat;                                    /* Replace */
    char *content;                                     /* Replace content / Prepend string */
    int clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
    uint32_t *trie;                                    /* Precompiled: double array */
    size_t trie_n;
    char *pool; /* Precompiled: NUL-separated replacement strings */
    size_t pool_n;
};

void kn_normalizer_free(kn_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_child; i++) kn_normalizer_free(n->child[i]);
    free(n->child);
    kn_pattern_free(&n->pat);
    free(n->content);
    free(n->trie);
    free(n->pool);
    free(n);
}

static int b64val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding; NULL on malformed input. */
static unsigned char *b64decode(const char *s, size_t n, size_t *out_n) {
    if (n % 4) return NULL;
    unsigned char *o = malloc(n / 4 * 3 + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            unsigned char c = (unsigned char)s[i + j];
            v[j] = c == '=' && i + 4 == n && j >= 2 ? 0 : b64val(c);
            if (v[j] < 0) {
                free(o);
                return NULL;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        o[k++] = (unsigned char)(w >> 16);
        if (!(i + 4 == n && s[i + 2] == '=')) o[k++] = (unsigned char)(w >> 8);
        if (!(i + 4 == n && s[i + 3] == '=')) o[k++] = (unsigned char)w;
    }
    *out_n = k;
    return o;
}

static kn_code parse_precompiled(const json_t *j, kn_normalizer *n, kn_error *err) {
    const json_t *v = json_object_get(j, "precompiled_charsmap");
    size_t len;
    unsigned char *blob = json_is_string(v) ? b64decode(json_string_value(v), json_string_length(v), &len) : NULL;
    if (!blob) return kn_fail(err, KN_ERR_FORMAT, "normalizer Precompiled: precompiled_charsmap is not base64");
    kn_code rc = KN_OK;
    uint32_t trie_bytes = 0;
    if (len < 4) rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Precompiled: charsmap too short");
    else {
        memcpy(&trie_bytes, blob, 4); /* little-endian host assumed (x86-64, aarch64) */
        if ((size_t)trie_bytes / 4 * 4 > len - 4 || trie_bytes < 4)
            rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Precompiled: trie size %u exceeds the charsmap", trie_bytes);
    }
    if (!rc) {
        n->trie_n = trie_bytes / 4;
        n->trie = malloc(n->trie_n * sizeof *n->trie);
        n->pool_n = len - 4 - n->trie_n * 4;
        n->pool = malloc(n->pool_n + 1);
        if (!n->trie || !n->pool) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        else {
            memcpy(n->trie, blob + 4, n->trie_n * 4);
            memcpy(n->pool, blob + 4 + n->trie_n * 4, n->pool_n);
            n->pool[n->pool_n] = 0;
            if (kn_utf8_valid_prefix(n->pool, n->pool_n) != n->pool_n)
                rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Precompiled: replacement strings are not UTF-8");
        }
    }
    free(blob);
    return rc;
}

/* Darts double-array unit fields */
static inline int unit_leaf(uint32_t u) { return (u >> 8) & 1; }
static inline uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static inline uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static inline uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* First (shortest) key that is a prefix of s: its replacement, or NULL. */
static const char *precompiled_transform(const kn_normalizer *n, const char *s, size_t len, size_t *out_len) {
    size_t pos = 0;
    if (!n->trie_n) return NULL;
    uint32_t unit = n->trie[pos];
    pos ^= unit_offset(unit);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!c) break;
        pos ^= c;
        if (pos >= n->trie_n) return NULL;
        unit = n->trie[pos];
        if (unit_label(unit) != c) return NULL;
        pos ^= unit_offset(unit);
        if (pos >= n->trie_n) return NULL;
        if (unit_leaf(unit)) {
            size_t at = unit_value(n->trie[pos]);
            if (at > n->pool_n) return NULL;
            *out_len = strnlen(n->pool + at, n->pool_n - at);
            return n->pool + at;
        }
    }
    return NULL;
}

static int jbool(const json_t *o, const char *k, int def) {
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

kn_code kn_normalizer_parse(const json_t *j, kn_normalizer **out, kn_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return KN_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kn_fail(err, KN_ERR_FORMAT, "normalizer without a \"type\"");
    kn_normalizer *n = calloc(1, sizeof *n);
    if (!n) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    if (!strcmp(type, "Sequence")) {
        n->type = N_SEQUENCE;
        const json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Sequence without a \"normalizers\" array");
            goto done;
        }
        n->child = calloc(json_array_size(a) + 1, sizeof *n->child);
        if (!n->child) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            kn_normalizer *c;
            if ((rc = kn_normalizer_parse(json_array_get(a, i), &c, err))) goto done;
            if (c) n->child[n->n_child++] = c;
        }
    } else if (!strcmp(type, "NFC")) n->type = N_NFC;
    else if (!strcmp(type, "NFD")) n->type = N_NFD;
    else if (!strcmp(type, "NFKC")) n->type = N_NFKC;
    else if (!strcmp(type, "NFKD")) n->type = N_NFKD;
    else if (!strcmp(type, "Lowercase")) n->type = N_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) n->type = N_STRIP_ACCENTS;
    else if (!strcmp(type, "ByteLevel")) n->type = N_BYTE_LEVEL;
    else if (!strcmp(type, "Precompiled")) {
        n->type = N_PRECOMPILED;
        if ((rc = parse_precompiled(j, n, err))) goto done;
    } else if (!strcmp(type, "Strip")) {
        n->type = N_STRIP;
        n->left = jbool(j, "strip_left", 1);
        n->right = jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Replace")) {
        n->type = N_REPLACE;
        const char *c = json_string_value(json_object_get(j, "content"));
        if (!c) {
            rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Replace without \"content\"");
            goto done;
        }
        if ((rc = kn_pattern_parse(json_object_get(j, "pattern"), "normalizer Replace", &n->pat, err))) goto done;
        n->content = strdup(c);
    } else if (!strcmp(type, "Prepend")) {
        n->type = N_PREPEND;
        const char *c = json_string_value(json_object_get(j, "prepend"));
        if (!c) {
            rc = kn_fail(err, KN_ERR_FORMAT, "normalizer Prepend without \"prepend\"");
            goto done;
        }
        n->content = strdup(c);
    } else if (!strcmp(type, "BertNormalizer")) {
        n->type = N_BERT;
        n->clean_text = jbool(j, "clean_text", 1);
        n->chinese = jbool(j, "handle_chinese_chars", 1);
        n->lowercase = jbool(j, "lowercase", 1);
        n->strip_accents = jbool(j, "strip_accents", n->lowercase); /* null: follows lowercase */
    } else {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                     "normalizer type \"%s\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
                     "Strip, StripAccents, Replace, Prepend, BertNormalizer, ByteLevel, Precompiled)",
                     type);
        goto done;
    }
    if ((n->type == N_REPLACE || n->type == N_PREPEND) && !n->content) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
done:
    if (rc) {
        kn_normalizer_free(n);
        return rc;
    }
    *out = n;
    return KN_OK;
}

static kn_code put(kn_tbuf *b, const void *s, size_t n) { return kn_tbuf_put(b, s, n) ? KN_ERR_NOMEM : KN_OK; }

static kn_code put_cp(kn_tbuf *b, uint32_t cp) {
    char u[4];
    return put(b, u, (size_t)kn_utf8_encode(cp, u));
}

static kn_code unicode_form(int opts, const char *s, size_t len, kn_tbuf *out, kn_error *err) {
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0x80) i++;
    if (i == len) return put(out, s, len); /* ASCII is invariant under every normalization form */
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, opts);
    if (r < 0) return kn_fail(err, KN_ERR_FORMAT, "unicode normalization: %s", utf8proc_errmsg(r));
    kn_code rc = put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

static kn_code lowercase(const char *s, size_t len, kn_tbuf *out) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)kn_utf8_decode(s + i, len - i, &cp);
        if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
            if (put(out, "i\xCC\x87", 3)) return KN_ERR_NOMEM;
            continue;
        }
        if (put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))) return KN_ERR_NOMEM;
    }
    return KN_OK;
}

static int bert_ws(uint32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
           utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ZS;
}

static int bert_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO;
}

static kn_code apply_one(const kn_normalizer *n, kn_tok_ctx *c, const char *s, size_t len, kn_tbuf *out,
                         kn_error *err);

static kn_code apply_bert(const kn_normalizer *n, kn_tok_ctx *c, const char *s, size_t len, kn_tbuf *out,
                          kn_error *err) {
    kn_tbuf a = {0}, b = {0};
    kn_code rc = KN_OK;
    for (size_t i = 0; i < len && !rc;) {
        uint32_t cp;
        i += (size_t)kn_utf8_decode(s + i, len - i, &cp);
        if (n->clean_text) {
            if (cp == 0 || cp == 0xFFFD || bert_control(cp)) continue;
            if (bert_ws(cp)) cp = ' ';
        }
        if (n->chinese && kn_uni_is_cjk(cp)) {
            rc = put(&a, " ", 1);
            if (!rc) rc = put_cp(&a, cp);
            if (!rc) rc = put(&a, " ", 1);
        } else rc = put_cp(&a, cp);
    }
    if (!rc && n->strip_accents) {
        rc = unicode_form(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, a.p ? a.p : "", a.n, &b, err);
        /* rebuild a from b without Mn */
        a.n = 0;
        for (size_t i = 0; i < b.n && !rc;) {
            uint32_t cp;
            size_t l = (size_t)kn_utf8_decode(b.p + i, b.n - i, &cp);
            if (!kn_uni_is_mark_nonspacing(cp)) rc = put(&a, b.p + i, l);
            i += l;
        }
    }
    if (!rc && n->lowercase) rc = lowercase(a.p ? a.p : "", a.n, out);
    else if (!rc) rc = put(out, a.p, a.n);
    kn_tbuf_free(&a);
    kn_tbuf_free(&b);
    (void)c;
    return rc;
}

/* tokenizers' Precompiled::normalize: per extended grapheme cluster, a
 * cluster shorter than 6 bytes is replaced whole when a key is a prefix of it;
 * otherwise each character is replaced or kept. */
static kn_code apply_precompiled(const kn_normalizer *n, const char *s, size_t len, kn_tbuf *out) {
    size_t gs = 0;
    utf8proc_int32_t state = 0;
    while (gs < len) {
        uint32_t cp, prev;
        size_t ge = gs + (size_t)kn_utf8_decode(s + gs, len - gs, &prev);
        state = 0;
        while (ge < len) {
            int l = kn_utf8_decode(s + ge, len - ge, &cp);
            if (utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev, (utf8proc_int32_t)cp, &state)) break;
            prev = cp;
            ge += (size_t)l;
        }
        size_t rl;
        const char *r;
        if (ge - gs < 6 && (r = precompiled_transform(n, s + gs, ge - gs, &rl))) {
            if (put(out, r, rl)) return KN_ERR_NOMEM;
        } else
            for (size_t i = gs; i < ge;) {
                size_t l = (size_t)kn_utf8_decode(s + i, ge - i, &cp);
                r = precompiled_transform(n, s + i, l, &rl);
                if (r ? put(out, r, rl) : put(out, s + i, l)) return KN_ERR_NOMEM;
                i += l;
            }
        gs = ge;
    }
    return KN_OK;
}

static kn_code apply_one(const kn_normalizer *n, kn_tok_ctx *c, const char *s, size_t len, kn_tbuf *out,
                         kn_error *err) {
    switch (n->type) {
    case N_PRECOMPILED: return apply_precompiled(n, s, len, out);
    case N_SEQUENCE: {
        kn_tbuf cur = {0}, next = {0};
        kn_code rc = put(&cur, s, len);
        for (size_t i = 0; i < n->n_child && !rc; i++) {
            next.n = 0;
            rc = apply_one(n->child[i], c, cur.p, cur.n, &next, err);
            kn_tbuf t = cur;
            cur = next;
            next = t;
        }
        if (!rc) rc = put(out, cur.p, cur.n);
        kn_tbuf_free(&cur);
        kn_tbuf_free(&next);
        return rc;
    }
    case N_NFC: return unicode_form(UTF8PROC_STABLE | UTF8PROC_COMPOSE, s, len, out, err);
    case N_NFD: return unicode_form(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, s, len, out, err);
    case N_NFKC: return unicode_form(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, s, len, out, err);
    case N_NFKD: return unicode_form(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, s, len, out, err);
    case N_LOWERCASE: return lowercase(s, len, out);
    case N_STRIP: {
        size_t a = 0, b = len;
        if (n->left)
            while (a < b) {
                uint32_t cp;
                int l = kn_utf8_decode(s + a, b - a, &cp);
                if (!kn_uni_is_whitespace(cp)) break;
                a += (size_t)l;
            }
        if (n->right)
            while (b > a) {
                size_t j = b - 1;
                while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                uint32_t cp;
                kn_utf8_decode(s + j, b - j, &cp);
                if (!kn_uni_is_whitespace(cp)) break;
                b = j;
            }
        return put(out, s + a, b - a);
    }
    case N_STRIP_ACCENTS: /* every combining mark (Mn, Mc, Me), as unicode-normalization's is_combining_mark */
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            size_t l = (size_t)kn_utf8_decode(s + i, len - i, &cp);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            int mark = k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
            if (!mark && put(out, s + i, l)) return KN_ERR_NOMEM;
            i += l;
        }
        return KN_OK;
    case N_REPLACE: {
        size_t pos = 0, from = 0, ms, me;
        size_t clen = strlen(n->content);
        for (;;) {
            int r = kn_pattern_next(&n->pat, c, s, len, from, &ms, &me);
            if (r < 0) return kn_fail(err, KN_ERR_UNSUPPORTED, "normalizer Replace: regex match failed (limit)");
            if (!r) break;
            if (me == ms) { /* empty match: nothing to replace; step one character */
                if (ms >= len) break;
                uint32_t cp;
                from = ms + (size_t)kn_utf8_decode(s + ms, len - ms, &cp);
                continue;
            }
            if (put(out, s + pos, ms - pos) || put(out, n->content, clen)) return KN_ERR_NOMEM;
            pos = from = me;
        }
        return put(out, s + pos, len - pos);
    }
    case N_PREPEND:
        if (len && put(out, n->content, strlen(n->content))) return KN_ERR_NOMEM;
        return put(out, s, len);
    case N_BERT: return apply_bert(n, c, s, len, out, err);
    case N_BYTE_LEVEL:
        for (size_t i = 0; i < len; i++)
            if (put_cp(out, kn_byte_to_cp((uint8_t)s[i]))) return KN_ERR_NOMEM;
        return KN_OK;
    }
    return kn_fail(err, KN_ERR_INTERNAL, "normalizer: bad type");
}

kn_code kn_normalizer_apply(const kn_normalizer *n, kn_tok_ctx *c, const char *s, size_t len, kn_tbuf *out,
                            kn_error *err) {
    out->n = 0;
    if (kn_tbuf_reserve(out, len)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    out->p[0] = 0;
    kn_code rc = apply_one(n, c, s, len, out, err);
    if (rc == KN_ERR_NOMEM) return kn_fail(err, rc, "out of memory normalizing text");
    return rc;
}

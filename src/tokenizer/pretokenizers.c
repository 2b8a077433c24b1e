/* pretokenizers.c — tokenizer.json "pre_tokenizer": cut normalized text into
 * words before the model: ByteLevel (GPT-2 regex + byte->unicode map),
 * Split (literal or PCRE2 regex, the five delimiter behaviors, invert),
 * Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation,
 * BertPreTokenizer, CharDelimiterSplit and Sequence. The split semantics
 * (match list covering the text, then behavior folding, empty pieces dropped)
 * follow HF's NormalizedString::split. Pieces that are added tokens pass
 * through untouched. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } split_behavior;

typedef enum {
    P_SEQUENCE,
    P_BYTE_LEVEL,
    P_SPLIT,
    P_METASPACE,
    P_DIGITS,
    P_WHITESPACE,
    P_WHITESPACE_SPLIT,
    P_PUNCTUATION,
    P_BERT,
    P_CHAR_DELIM,
} pretok_type;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

struct kn_pretok {
    pretok_type type;
    kn_pretok **child;
    size_t n_child;
    kn_pattern pat; /* Split pattern; ByteLevel GPT-2 regex */
    split_behavior behavior;
    int invert;
    int add_prefix_space, use_regex; /* ByteLevel */
    uint32_t replacement;            /* Metaspace; CharDelimiterSplit delimiter */
    prepend_scheme scheme;
    int split;             /* Metaspace */
    int individual_digits; /* Digits */
};

static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void kn_pretok_free(kn_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_child; i++) kn_pretok_free(p->child[i]);
    free(p->child);
    kn_pattern_free(&p->pat);
    free(p);
}

static int jbool(const json_t *o, const char *k, int def) {
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static kn_code parse_behavior(const json_t *j, const char *where, split_behavior def, split_behavior *b,
                              kn_error *err) {
    const char *s = json_string_value(json_object_get(j, "behavior"));
    if (!s) {
        *b = def;
        return KN_OK;
    }
    if (!strcmp(s, "Removed")) *b = B_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = B_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = B_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = B_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = B_CONTIGUOUS;
    else return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: unknown split behavior \"%s\"", where, s);
    return KN_OK;
}

static kn_code one_char(const json_t *j, const char *key, const char *where, uint32_t def, uint32_t *out,
                        kn_error *err) {
    const json_t *v = json_object_get(j, key);
    if (!json_is_string(v)) {
        *out = def;
        return KN_OK;
    }
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    uint32_t cp;
    if (!n || (size_t)kn_utf8_decode(s, n, &cp) != n)
        return kn_fail(err, KN_ERR_FORMAT, "%s: \"%s\" must be a single character", where, key);
    *out = cp;
    return KN_OK;
}

kn_code kn_pretok_parse(const json_t *j, kn_pretok **out, kn_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return KN_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kn_fail(err, KN_ERR_FORMAT, "pre_tokenizer without a \"type\"");
    kn_pretok *p = calloc(1, sizeof *p);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    if (!strcmp(type, "Sequence")) {
        p->type = P_SEQUENCE;
        const json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "pre_tokenizer Sequence without a \"pretokenizers\" array");
            goto done;
        }
        p->child = calloc(json_array_size(a) + 1, sizeof *p->child);
        if (!p->child) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            kn_pretok *c;
            if ((rc = kn_pretok_parse(json_array_get(a, i), &c, err))) goto done;
            if (c) p->child[p->n_child++] = c;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = P_BYTE_LEVEL;
        p->add_prefix_space = jbool(j, "add_prefix_space", 1);
        p->use_regex = jbool(j, "use_regex", 1);
        if (p->use_regex) {
            json_t *r = json_pack("{s:s}", "Regex", gpt2_regex);
            rc = r ? kn_pattern_parse(r, "pre_tokenizer ByteLevel", &p->pat, err)
                   : kn_fail(err, KN_ERR_NOMEM, "out of memory");
            json_decref(r);
        }
    } else if (!strcmp(type, "Split")) {
        p->type = P_SPLIT;
        p->invert = jbool(j, "invert", 0);
        if ((rc = parse_behavior(j, "pre_tokenizer Split", B_REMOVED, &p->behavior, err))) goto done;
        if (!json_object_get(j, "behavior")) {
            rc = kn_fail(err, KN_ERR_FORMAT, "pre_tokenizer Split without \"behavior\"");
            goto done;
        }
        rc = kn_pattern_parse(json_object_get(j, "pattern"), "pre_tokenizer Split", &p->pat, err);
    } else if (!strcmp(type, "Metaspace")) {
        p->type = P_METASPACE;
        if ((rc = one_char(j, "replacement", "pre_tokenizer Metaspace", 0x2581, &p->replacement, err))) goto done;
        p->split = jbool(j, "split", 1);
        const char *sc = json_string_value(json_object_get(j, "prepend_scheme"));
        p->scheme = PREPEND_ALWAYS;
        if (sc && !strcmp(sc, "first")) p->scheme = PREPEND_FIRST;
        else if (sc && !strcmp(sc, "never")) p->scheme = PREPEND_NEVER;
        else if (sc && strcmp(sc, "always")) {
            rc = kn_fail(err, KN_ERR_FORMAT, "pre_tokenizer Metaspace: unknown prepend_scheme \"%s\"", sc);
            goto done;
        }
        if (json_is_false(json_object_get(j, "add_prefix_space"))) p->scheme = PREPEND_NEVER;
    } else if (!strcmp(type, "Digits")) {
        p->type = P_DIGITS;
        p->individual_digits = jbool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Whitespace")) p->type = P_WHITESPACE;
    else if (!strcmp(type, "WhitespaceSplit")) p->type = P_WHITESPACE_SPLIT;
    else if (!strcmp(type, "BertPreTokenizer")) p->type = P_BERT;
    else if (!strcmp(type, "Punctuation")) {
        p->type = P_PUNCTUATION;
        rc = parse_behavior(j, "pre_tokenizer Punctuation", B_ISOLATED, &p->behavior, err);
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        p->type = P_CHAR_DELIM;
        if (!json_is_string(json_object_get(j, "delimiter"))) {
            rc = kn_fail(err, KN_ERR_FORMAT, "pre_tokenizer CharDelimiterSplit without \"delimiter\"");
            goto done;
        }
        rc = one_char(j, "delimiter", "pre_tokenizer CharDelimiterSplit", ' ', &p->replacement, err);
    } else {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                     "pre_tokenizer type \"%s\" is not supported (supported: Sequence, ByteLevel, Split, Metaspace, "
                     "Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit)",
                     type);
    }
done:
    if (rc) {
        kn_pretok_free(p);
        return rc;
    }
    *out = p;
    return KN_OK;
}

/* ---- the split machinery ------------------------------------------------------- */

typedef struct {
    size_t s, e;
    int m; /* is a match (delimiter); after folding: remove */
} span;

typedef struct {
    span *v;
    size_t n, cap;
} spans;

static int spans_push(spans *a, size_t s, size_t e, int m) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        span *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (span){s, e, m};
    return 0;
}

typedef int (*char_pred)(uint32_t cp, const kn_pretok *p);

/* Matches of a per-character predicate: each matching character is its own match. */
static int find_char_matches(const char *s, size_t n, char_pred pred, const kn_pretok *p, spans *out) {
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = (size_t)kn_utf8_decode(s + i, n - i, &cp);
        if (pred(cp, p)) {
            if (last < i && spans_push(out, last, i, 0)) return -1;
            if (spans_push(out, i, i + l, 1)) return -1;
            last = i + l;
        }
        i += l;
    }
    if (last < n && spans_push(out, last, n, 0)) return -1;
    return 0;
}

/* Matches of a pattern; -1 out of memory, -2 regex failure. */
static int find_pattern_matches(const kn_pattern *pat, kn_tok_ctx *c, const char *s, size_t n, spans *out) {
    size_t prev = 0, from = 0, ms, me;
    while (from <= n) {
        int r = kn_pattern_next(pat, c, s, n, from, &ms, &me);
        if (r < 0) return -2;
        if (!r) break;
        if (prev != ms && spans_push(out, prev, ms, 0)) return -1;
        if (spans_push(out, ms, me, 1)) return -1;
        prev = me;
        if (me == ms) {
            if (me >= n) break;
            uint32_t cp;
            from = me + (size_t)kn_utf8_decode(s + me, n - me, &cp);
        } else from = me;
    }
    if (prev != n && spans_push(out, prev, n, 0)) return -1;
    return 0;
}

/* Fold matches by behavior (HF NormalizedString::split); m becomes "remove". */
static void fold(spans *a, split_behavior b) {
    size_t k = 0;
    int prev_match = 0;
    switch (b) {
    case B_ISOLATED:
        for (size_t i = 0; i < a->n; i++) a->v[i].m = 0;
        return;
    case B_REMOVED: return;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < a->n; i++) {
            span x = a->v[i];
            if (x.m == prev_match && k) a->v[k - 1].e = x.e;
            else a->v[k++] = (span){x.s, x.e, 0};
            prev_match = x.m;
        }
        a->n = k;
        return;
    case B_MERGED_PREV:
        for (size_t i = 0; i < a->n; i++) {
            span x = a->v[i];
            if (x.m && !prev_match && k) a->v[k - 1].e = x.e;
            else a->v[k++] = (span){x.s, x.e, 0};
            prev_match = x.m;
        }
        a->n = k;
        return;
    case B_MERGED_NEXT: {
        /* walk backwards, building the result from the end of the array */
        size_t w = a->n;
        for (size_t i = a->n; i-- > 0;) {
            span x = a->v[i];
            if (x.m && !prev_match && w < a->n) a->v[w].s = x.s;
            else a->v[--w] = (span){x.s, x.e, 0};
            prev_match = x.m;
        }
        memmove(a->v, a->v + w, (a->n - w) * sizeof *a->v);
        a->n -= w;
        return;
    }
    }
}

/* Push the kept, non-empty spans of s as pieces. */
static int emit(const spans *a, const char *s, int at_origin, kn_pieces *out) {
    for (size_t i = 0; i < a->n; i++) {
        const span *x = &a->v[i];
        if (x->m || x->e <= x->s) continue;
        if (kn_pieces_push(out, s + x->s, x->e - x->s, -1, at_origin && x->s == 0)) return -1;
    }
    return 0;
}

static int pred_numeric(uint32_t cp, const kn_pretok *p) { return kn_uni_is_numeric(cp); }
static int pred_ws(uint32_t cp, const kn_pretok *p) { return kn_uni_is_whitespace(cp); }
static int pred_punct(uint32_t cp, const kn_pretok *p) { return kn_uni_is_punct(cp); }
static int pred_delim(uint32_t cp, const kn_pretok *p) { return cp == p->replacement; }

/* regex \w+|[^\w\s]+ kept, the rest removed (HF Whitespace) */
static int whitespace_split(const char *s, size_t n, spans *out) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = (size_t)kn_utf8_decode(s + i, n - i, &cp);
        if (kn_uni_is_whitespace(cp) && !kn_uni_is_word(cp)) {
            i += l;
            continue;
        }
        int word = kn_uni_is_word(cp);
        size_t j = i + l;
        while (j < n) {
            size_t l2 = (size_t)kn_utf8_decode(s + j, n - j, &cp);
            int w = kn_uni_is_word(cp);
            if (word ? !w : (w || kn_uni_is_whitespace(cp))) break;
            j += l2;
        }
        if (spans_push(out, i, j, 0)) return -1;
        i = j;
    }
    return 0;
}

static kn_code put_cp(kn_tbuf *b, uint32_t cp) {
    char u[4];
    return kn_tbuf_put(b, u, (size_t)kn_utf8_encode(cp, u)) ? KN_ERR_NOMEM : KN_OK;
}

/* Split one piece s into out according to a leaf pre-tokenizer. */
static kn_code apply_leaf(const kn_pretok *p, kn_tok_ctx *c, const char *s, size_t n, int at_origin,
                          kn_pieces *out, spans *sp, kn_error *err) {
    sp->n = 0;
    int r = 0;
    switch (p->type) {
    case P_SPLIT:
        r = find_pattern_matches(&p->pat, c, s, n, sp);
        if (p->invert)
            for (size_t i = 0; i < sp->n; i++) sp->v[i].m = !sp->v[i].m;
        if (!r) fold(sp, p->behavior);
        break;
    case P_DIGITS:
        r = find_char_matches(s, n, pred_numeric, p, sp);
        fold(sp, p->individual_digits ? B_ISOLATED : B_CONTIGUOUS);
        break;
    case P_WHITESPACE: r = whitespace_split(s, n, sp); break;
    case P_WHITESPACE_SPLIT: r = find_char_matches(s, n, pred_ws, p, sp); break;
    case P_PUNCTUATION:
        r = find_char_matches(s, n, pred_punct, p, sp);
        fold(sp, p->behavior);
        break;
    case P_CHAR_DELIM: r = find_char_matches(s, n, pred_delim, p, sp); break;
    case P_BERT: {
        /* whitespace split (removed), then punctuation isolated inside each word */
        spans words = {0};
        r = find_char_matches(s, n, pred_ws, p, &words);
        for (size_t i = 0; i < words.n && !r; i++) {
            if (words.v[i].m) continue;
            size_t base = words.v[i].s;
            size_t before = sp->n;
            r = find_char_matches(s + base, words.v[i].e - base, pred_punct, p, sp);
            for (size_t k = before; k < sp->n; k++) {
                sp->v[k].s += base;
                sp->v[k].e += base;
                sp->v[k].m = 0;
            }
        }
        free(words.v);
        break;
    }
    case P_BYTE_LEVEL: {
        kn_tbuf *pre = &c->scratch[2], *mapped = &c->scratch[3];
        pre->n = 0;
        if ((p->add_prefix_space && (n == 0 || s[0] != ' ') && kn_tbuf_put(pre, " ", 1)) || kn_tbuf_put(pre, s, n))
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (p->use_regex) r = find_pattern_matches(&p->pat, c, pre->p, pre->n, sp);
        else r = spans_push(sp, 0, pre->n, 0);
        if (r) break;
        if (p->use_regex) fold(sp, B_ISOLATED);
        for (size_t i = 0; i < sp->n; i++) {
            const span *x = &sp->v[i];
            if (x->m || x->e <= x->s) continue;
            mapped->n = 0;
            for (size_t k = x->s; k < x->e; k++)
                if (put_cp(mapped, kn_byte_to_cp((uint8_t)pre->p[k]))) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            if (kn_pieces_push(out, mapped->p, mapped->n, -1, at_origin && x->s == 0))
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        return KN_OK;
    }
    case P_METASPACE: {
        kn_tbuf *m = &c->scratch[2];
        char rep[4];
        int rl = kn_utf8_encode(p->replacement, rep);
        m->n = 0;
        int starts_with_rep = n >= (size_t)rl && !memcmp(s, rep, (size_t)rl);
        if (n && s[0] == ' ') starts_with_rep = 1; /* the space becomes the replacement below */
        int prepend = (p->scheme == PREPEND_ALWAYS && !starts_with_rep) ||
                      (p->scheme == PREPEND_FIRST && !starts_with_rep && at_origin);
        if (prepend && kn_tbuf_put(m, rep, (size_t)rl)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            if (s[i] == ' ' ? kn_tbuf_put(m, rep, (size_t)rl) : kn_tbuf_put(m, s + i, 1))
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (!p->split) {
            if (m->n && kn_pieces_push(out, m->p, m->n, -1, at_origin)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            return KN_OK;
        }
        kn_pretok d = {.replacement = p->replacement};
        r = find_char_matches(m->p, m->n, pred_delim, &d, sp);
        if (r) break;
        fold(sp, B_MERGED_NEXT);
        if (emit(sp, m->p, at_origin, out)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        return KN_OK;
    }
    case P_SEQUENCE: return kn_fail(err, KN_ERR_INTERNAL, "pre_tokenizer: nested sequence in leaf");
    }
    if (r == -2) return kn_fail(err, KN_ERR_UNSUPPORTED, "pre_tokenizer: regex match failed (engine limit)");
    if (r) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (emit(sp, s, at_origin, out)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    return KN_OK;
}

kn_code kn_pretok_apply(const kn_pretok *p, kn_tok_ctx *c, kn_pieces *io, kn_error *err) {
    if (p->type == P_SEQUENCE) {
        for (size_t i = 0; i < p->n_child; i++) {
            kn_code rc = kn_pretok_apply(p->child[i], c, io, err);
            if (rc) return rc;
        }
        return KN_OK;
    }
    kn_pieces out = {0};
    spans sp = {0};
    kn_code rc = KN_OK;
    if (kn_tbuf_reserve(&out.text, io->text.n + io->text.n / 2 + 16)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < io->n && !rc; i++) {
        const kn_piece *x = &io->v[i];
        const char *s = io->text.p + x->off;
        if (x->added_id >= 0) {
            if (kn_pieces_push(&out, s, x->len, x->added_id, x->at_origin)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            continue;
        }
        rc = apply_leaf(p, c, s, x->len, x->at_origin, &out, &sp, err);
    }
    free(sp.v);
    if (rc) {
        kn_pieces_free(&out);
        return rc;
    }
    kn_pieces_free(io);
    *io = out;
    return KN_OK;
}

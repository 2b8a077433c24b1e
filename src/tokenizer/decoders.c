/* decoders.c — tokenizer.json "decoder": turn the token strings of ids back
 * into text as HF's decode_chain does: ByteLevel (unicode->bytes, lossy
 * UTF-8), Metaspace, ByteFallback (<0xXX> runs; U+FFFD per byte when a run is
 * not valid UTF-8), Fuse, Strip, Replace, WordPiece, BPEDecoder and Sequence.
 * The token list is a kn_pieces; each decoder rewrites it. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

typedef enum { D_SEQUENCE, D_BYTE_LEVEL, D_METASPACE, D_BYTE_FALLBACK, D_FUSE, D_STRIP, D_REPLACE, D_WORDPIECE, D_BPE } dec_type;

struct kn_decoder {
    dec_type type;
    kn_decoder **child;
    size_t n_child;
    uint32_t ch; /* Metaspace replacement; Strip content */
    int prepend; /* Metaspace: prepend_scheme != never */
    long start, stop;
    kn_pattern pat;
    char *str; /* Replace content; WordPiece prefix; BPEDecoder suffix */
    int cleanup;
};

void kn_decoder_free(kn_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_child; i++) kn_decoder_free(d->child[i]);
    free(d->child);
    kn_pattern_free(&d->pat);
    free(d->str);
    free(d);
}

static int one_char(const json_t *v, uint32_t *cp) {
    if (!json_is_string(v)) return 0;
    size_t n = json_string_length(v);
    return n && (size_t)kn_utf8_decode(json_string_value(v), n, cp) == n;
}

kn_code kn_decoder_parse(const json_t *j, kn_decoder **out, kn_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return KN_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kn_fail(err, KN_ERR_FORMAT, "decoder without a \"type\"");
    kn_decoder *d = calloc(1, sizeof *d);
    if (!d) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    if (!strcmp(type, "Sequence")) {
        d->type = D_SEQUENCE;
        const json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "decoder Sequence without a \"decoders\" array");
            goto done;
        }
        d->child = calloc(json_array_size(a) + 1, sizeof *d->child);
        if (!d->child) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            kn_decoder *c;
            if (!(rc = kn_decoder_parse(json_array_get(a, i), &c, err)) && c) d->child[d->n_child++] = c;
        }
    } else if (!strcmp(type, "ByteLevel")) d->type = D_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = D_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = D_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = D_METASPACE;
        d->ch = 0x2581;
        const json_t *r = json_object_get(j, "replacement");
        if (r && !one_char(r, &d->ch)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "decoder Metaspace: \"replacement\" must be one character");
            goto done;
        }
        const char *sc = json_string_value(json_object_get(j, "prepend_scheme"));
        d->prepend = !(sc && !strcmp(sc, "never"));
        if (json_is_false(json_object_get(j, "add_prefix_space"))) d->prepend = 0;
    } else if (!strcmp(type, "Strip")) {
        d->type = D_STRIP;
        if (!one_char(json_object_get(j, "content"), &d->ch)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "decoder Strip: \"content\" must be one character");
            goto done;
        }
        const json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        d->start = json_is_integer(a) ? (long)json_integer_value(a) : 0;
        d->stop = json_is_integer(b) ? (long)json_integer_value(b) : 0;
        if (d->start < 0 || d->stop < 0) {
            rc = kn_fail(err, KN_ERR_FORMAT, "decoder Strip: negative start/stop");
            goto done;
        }
    } else if (!strcmp(type, "Replace")) {
        d->type = D_REPLACE;
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(c)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "decoder Replace without \"content\"");
            goto done;
        }
        if ((rc = kn_pattern_parse(json_object_get(j, "pattern"), "decoder Replace", &d->pat, err))) goto done;
        d->str = strdup(json_string_value(c));
    } else if (!strcmp(type, "WordPiece")) {
        d->type = D_WORDPIECE;
        const json_t *p = json_object_get(j, "prefix");
        d->str = strdup(json_is_string(p) ? json_string_value(p) : "##");
        d->cleanup = !json_is_false(json_object_get(j, "cleanup"));
    } else if (!strcmp(type, "BPEDecoder")) {
        d->type = D_BPE;
        const json_t *s = json_object_get(j, "suffix");
        d->str = strdup(json_is_string(s) ? json_string_value(s) : "</w>");
    } else
        rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                     "decoder type \"%s\" is not supported (supported: Sequence, ByteLevel, Metaspace, ByteFallback, "
                     "Fuse, Strip, Replace, WordPiece, BPEDecoder)",
                     type);
    if (!rc && (d->type == D_REPLACE || d->type == D_WORDPIECE || d->type == D_BPE) && !d->str)
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
done:
    if (rc) {
        kn_decoder_free(d);
        return rc;
    }
    *out = d;
    return KN_OK;
}

/* Replace every occurrence of literal `from` in s by `to`, appending to b. */
static int replace_all(kn_tbuf *b, const char *s, size_t n, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), i = 0;
    if (!fl) return kn_tbuf_put(b, s, n);
    while (i < n) {
        const char *hit = memmem(s + i, n - i, from, fl);
        if (!hit) break;
        if (kn_tbuf_put(b, s + i, (size_t)(hit - (s + i))) || kn_tbuf_put(b, to, tl)) return -1;
        i = (size_t)(hit - s) + fl;
    }
    return kn_tbuf_put(b, s + i, n - i);
}

static int wordpiece_cleanup(kn_tbuf *out, const char *s, size_t n) {
    static const char *const rules[][2] = {{" .", "."},   {" ?", "?"},   {" !", "!"},   {" ,", ","},
                                           {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"},
                                           {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    kn_tbuf a = {0}, b = {0};
    int r = kn_tbuf_put(&a, s, n);
    for (size_t k = 0; k < sizeof rules / sizeof *rules && !r; k++) {
        b.n = 0;
        r = replace_all(&b, a.p, a.n, rules[k][0], rules[k][1]);
        kn_tbuf t = a;
        a = b;
        b = t;
    }
    if (!r) r = kn_tbuf_put(out, a.p, a.n);
    kn_tbuf_free(&a);
    kn_tbuf_free(&b);
    return r;
}

static int byte_token(const char *s, size_t n, uint8_t *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *byte = (uint8_t)v;
    return 1;
}

static kn_code apply_leaf(const kn_decoder *d, kn_tok_ctx *c, const kn_pieces *in, kn_pieces *out, kn_error *err) {
    kn_tbuf *t = &c->scratch[0];
#define NOMEM() return kn_fail(err, KN_ERR_NOMEM, "out of memory")
    switch (d->type) {
    case D_BYTE_LEVEL: {
        t->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->v[i].off;
            size_t n = in->v[i].len, k = 0, mark = t->n;
            int all = 1;
            while (k < n) {
                uint32_t cp;
                k += (size_t)kn_utf8_decode(s + k, n - k, &cp);
                int b = kn_cp_to_byte(cp);
                if (b < 0) {
                    all = 0;
                    break;
                }
                uint8_t by = (uint8_t)b;
                if (kn_tbuf_put(t, &by, 1)) NOMEM();
            }
            if (!all) {
                t->n = mark;
                if (kn_tbuf_put(t, s, n)) NOMEM();
            }
        }
        size_t off = out->text.n;
        if (kn_utf8_lossy(&out->text, t->p ? t->p : "", t->n) || kn_pieces_push_span(out, off, out->text.n - off, -1, 0))
            NOMEM();
        return KN_OK;
    }
    case D_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->v[i].off;
            size_t n = in->v[i].len, off = out->text.n;
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                size_t l = (size_t)kn_utf8_decode(s + k, n - k, &cp);
                if (cp == d->ch) {
                    if (!(i == 0 && d->prepend) && kn_tbuf_put(&out->text, " ", 1)) NOMEM();
                } else if (kn_tbuf_put(&out->text, s + k, l)) NOMEM();
                k += l;
            }
            if (kn_pieces_push_span(out, off, out->text.n - off, -1, 0)) NOMEM();
        }
        return KN_OK;
    case D_BYTE_FALLBACK: {
        t->n = 0;
        for (size_t i = 0; i <= in->n; i++) {
            uint8_t b;
            const char *s = i < in->n ? in->text.p + in->v[i].off : NULL;
            size_t n = i < in->n ? in->v[i].len : 0;
            if (s && byte_token(s, n, &b)) {
                if (kn_tbuf_put(t, &b, 1)) NOMEM();
                continue;
            }
            if (t->n) {
                if (kn_utf8_valid_prefix(t->p, t->n) == t->n) {
                    if (kn_pieces_push(out, t->p, t->n, -1, 0)) NOMEM();
                } else
                    for (size_t k = 0; k < t->n; k++)
                        if (kn_pieces_push(out, "\xEF\xBF\xBD", 3, -1, 0)) NOMEM();
                t->n = 0;
            }
            if (s && kn_pieces_push(out, s, n, -1, 0)) NOMEM();
        }
        return KN_OK;
    }
    case D_FUSE: {
        size_t off = out->text.n;
        for (size_t i = 0; i < in->n; i++)
            if (kn_tbuf_put(&out->text, in->text.p + in->v[i].off, in->v[i].len)) NOMEM();
        if (kn_pieces_push_span(out, off, out->text.n - off, -1, 0)) NOMEM();
        return KN_OK;
    }
    case D_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->v[i].off;
            size_t n = in->v[i].len, a = 0, b = n;
            for (long k = 0; k < d->start && a < n; k++) {
                uint32_t cp;
                size_t l = (size_t)kn_utf8_decode(s + a, n - a, &cp);
                if (cp != d->ch) break;
                a += l;
            }
            for (long k = 0; k < d->stop && b > a; k++) {
                size_t j = b - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                uint32_t cp;
                kn_utf8_decode(s + j, b - j, &cp);
                if (cp != d->ch) break;
                b = j;
            }
            if (kn_pieces_push(out, s + a, b - a, -1, 0)) NOMEM();
        }
        return KN_OK;
    case D_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->v[i].off;
            size_t n = in->v[i].len, off = out->text.n, prev = 0, from = 0, ms, me;
            for (;;) {
                int r = kn_pattern_next(&d->pat, c, s, n, from, &ms, &me);
                if (r < 0) return kn_fail(err, KN_ERR_UNSUPPORTED, "decoder Replace: regex match failed (limit)");
                if (!r) break;
                if (kn_tbuf_put(&out->text, s + prev, ms - prev) || kn_tbuf_put(&out->text, d->str, strlen(d->str))) NOMEM();
                prev = me;
                if (me == ms) {
                    if (me >= n) break;
                    uint32_t cp;
                    size_t l = (size_t)kn_utf8_decode(s + me, n - me, &cp);
                    if (kn_tbuf_put(&out->text, s + me, l)) NOMEM();
                    prev = from = me + l;
                } else from = me;
            }
            if (kn_tbuf_put(&out->text, s + prev, n - prev) || kn_pieces_push_span(out, off, out->text.n - off, -1, 0))
                NOMEM();
        }
        return KN_OK;
    case D_WORDPIECE: {
        size_t pl = strlen(d->str);
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->v[i].off;
            size_t n = in->v[i].len;
            t->n = 0;
            if (i != 0) {
                if (n >= pl && !memcmp(s, d->str, pl)) s += pl, n -= pl;
                else if (kn_tbuf_put(t, " ", 1)) NOMEM();
            }
            if (kn_tbuf_put(t, s, n)) NOMEM();
            size_t off = out->text.n;
            if ((d->cleanup ? wordpiece_cleanup(&out->text, t->p, t->n) : kn_tbuf_put(&out->text, t->p, t->n)) ||
                kn_pieces_push_span(out, off, out->text.n - off, -1, 0))
                NOMEM();
        }
        return KN_OK;
    }
    case D_BPE:
        for (size_t i = 0; i < in->n; i++) {
            size_t off = out->text.n;
            if (replace_all(&out->text, in->text.p + in->v[i].off, in->v[i].len, d->str, i + 1 == in->n ? "" : " ") ||
                kn_pieces_push_span(out, off, out->text.n - off, -1, 0))
                NOMEM();
        }
        return KN_OK;
    case D_SEQUENCE: break;
    }
#undef NOMEM
    return kn_fail(err, KN_ERR_INTERNAL, "decoder: bad type");
}

kn_code kn_decoder_apply(const kn_decoder *d, kn_tok_ctx *c, kn_pieces *io, kn_error *err) {
    if (d->type == D_SEQUENCE) {
        for (size_t i = 0; i < d->n_child; i++) {
            kn_code rc = kn_decoder_apply(d->child[i], c, io, err);
            if (rc) return rc;
        }
        return KN_OK;
    }
    kn_pieces out = {0};
    if (kn_tbuf_reserve(&out.text, io->text.n + 16)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    out.text.p[0] = 0;
    kn_code rc = apply_leaf(d, c, io, &out, err);
    if (rc) {
        kn_pieces_free(&out);
        return rc;
    }
    kn_pieces_free(io);
    *io = out;
    return KN_OK;
}

int kn_decoder_pending_bytes(const kn_decoder *d, const char *tok, size_t n) {
    uint8_t b;
    if (!d) return 0;
    if (d->type == D_SEQUENCE) {
        for (size_t i = 0; i < d->n_child; i++)
            if (kn_decoder_pending_bytes(d->child[i], tok, n)) return 1;
        return 0;
    }
    return d->type == D_BYTE_FALLBACK && byte_token(tok, n, &b);
}

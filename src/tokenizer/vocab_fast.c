/* vocab_fast.c — fast path for the two big parts of tokenizer.json,
 * model.vocab (an object of token -> id) and model.merges (an array of
 * "a b" strings or ["a", "b"] pairs): jansson builds a hash-table node per
 * key and a string per merge, which dominates the load time of 150k-260k
 * token vocabularies. Here a structural scan finds the two values, a strict
 * parser reads them straight into flat arrays, and the caller hands jansson
 * the rest of the document with both values blanked out.
 *
 * Anything unexpected (other shapes, bad escapes, invalid UTF-8, duplicate
 * sections) makes kn_vocab_fast_parse return 0 and the caller uses the plain
 * jansson path, which reports the error; so this file never decides whether
 * a document is valid, only whether it is the common, well-formed shape. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    const char *s;
    size_t n, i;
} cur;

static void ws(cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\n' || c->s[c->i] == '\r' || c->s[c->i] == '\t')) c->i++;
}

/* Skip a string starting at '"'; 0 on error. */
static int skip_string(cur *c) {
    if (c->i >= c->n || c->s[c->i] != '"') return 0;
    for (c->i++; c->i < c->n; c->i++) {
        char ch = c->s[c->i];
        if (ch == '\\') c->i++;
        else if (ch == '"') {
            c->i++;
            return 1;
        }
    }
    return 0;
}

static int skip_value(cur *c) {
    ws(c);
    if (c->i >= c->n) return 0;
    char ch = c->s[c->i];
    if (ch == '"') return skip_string(c);
    if (ch == '{' || ch == '[') {
        int depth = 0;
        while (c->i < c->n) {
            ch = c->s[c->i];
            if (ch == '"') {
                if (!skip_string(c)) return 0;
                continue;
            }
            if (ch == '{' || ch == '[') depth++;
            else if (ch == '}' || ch == ']') {
                if (--depth == 0) {
                    c->i++;
                    return 1;
                }
            }
            c->i++;
        }
        return 0;
    }
    while (c->i < c->n && !strchr(",}] \t\r\n", c->s[c->i])) c->i++;
    return 1;
}

static int hexval(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

static int hex4(const char *s, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(s[k]);
        if (h < 0) return 0;
        *v = *v << 4 | (uint32_t)h;
    }
    return 1;
}

/* Decode the JSON string at c (at '"') appending its bytes to out. */
static int read_string(cur *c, kn_tbuf *out) {
    if (c->i >= c->n || c->s[c->i] != '"') return 0;
    size_t start_out = out->n;
    c->i++;
    while (c->i < c->n) {
        size_t run = c->i;
        while (c->i < c->n && c->s[c->i] != '"' && c->s[c->i] != '\\' && (unsigned char)c->s[c->i] >= 0x20) c->i++;
        if (kn_tbuf_put(out, c->s + run, c->i - run)) return 0;
        if (c->i >= c->n || (unsigned char)c->s[c->i] < 0x20) return 0;
        if (c->s[c->i] == '"') {
            c->i++;
            return kn_utf8_valid_prefix(out->p + start_out, out->n - start_out) == out->n - start_out;
        }
        /* escape */
        if (c->i + 1 >= c->n) return 0;
        char e = c->s[c->i + 1], ch;
        c->i += 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t v, lo;
            if (c->i + 4 > c->n || !hex4(c->s + c->i, &v)) return 0;
            c->i += 4;
            if (v >= 0xDC00 && v <= 0xDFFF) return 0;
            if (v >= 0xD800 && v <= 0xDBFF) {
                if (c->i + 6 > c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u' || !hex4(c->s + c->i + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return 0;
                c->i += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            }
            char u[4];
            if (kn_tbuf_put(out, u, (size_t)kn_utf8_encode(v, u))) return 0;
            continue;
        }
        default: return 0;
        }
        if (kn_tbuf_put(out, &ch, 1)) return 0;
    }
    return 0;
}

static int read_id(cur *c, int64_t *v) {
    ws(c);
    size_t st = c->i;
    *v = 0;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
        *v = *v * 10 + (c->s[c->i] - '0');
        if (*v > INT32_MAX) return 0;
        c->i++;
    }
    if (c->i == st || (c->i - st > 1 && c->s[st] == '0')) return 0;
    return c->i < c->n && strchr(",} \t\r\n", c->s[c->i]) != NULL;
}

static int push_u32(uint32_t **v, size_t *n, size_t *cap, uint32_t x) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        uint32_t *nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return 0;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return 1;
}

static int parse_vocab(cur *c, kn_vocab_fast *f) {
    size_t cap = 0;
    ws(c);
    if (c->i >= c->n || c->s[c->i] != '{') return 0;
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return 1;
    }
    for (;;) {
        ws(c);
        size_t off = f->strings.n;
        if (!read_string(c, &f->strings) || kn_tbuf_put(&f->strings, "", 1)) return 0; /* NUL-terminate */
        ws(c);
        if (c->i >= c->n || c->s[c->i] != ':') return 0;
        c->i++;
        int64_t id;
        if (!read_id(c, &id)) return 0;
        if (!push_u32(&f->vocab, &f->n_vocab, &cap, (uint32_t)off) ||
            !push_u32(&f->vocab, &f->n_vocab, &cap, (uint32_t)(f->strings.n - off - 1)) ||
            !push_u32(&f->vocab, &f->n_vocab, &cap, (uint32_t)id))
            return 0;
        ws(c);
        if (c->i >= c->n) return 0;
        if (c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->s[c->i] == '}') {
            c->i++;
            f->n_vocab /= 3;
            return 1;
        }
        return 0;
    }
}

static int parse_merges(cur *c, kn_vocab_fast *f) {
    size_t cap = 0;
    ws(c);
    if (c->i >= c->n || c->s[c->i] != '[') return 0;
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == ']') {
        c->i++;
        return 1;
    }
    for (;;) {
        ws(c);
        if (c->i >= c->n) return 0;
        size_t a = f->merge_bytes.n, na, b, nb;
        if (c->s[c->i] == '"') {
            if (!read_string(c, &f->merge_bytes)) return 0;
            const char *s = f->merge_bytes.p + a;
            size_t len = f->merge_bytes.n - a;
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) return 0;
            na = (size_t)(sp - s);
            b = a + na + 1;
            nb = len - na - 1;
        } else if (c->s[c->i] == '[') {
            c->i++;
            ws(c);
            if (!read_string(c, &f->merge_bytes)) return 0;
            na = f->merge_bytes.n - a;
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ',') return 0;
            c->i++;
            ws(c);
            b = f->merge_bytes.n;
            if (!read_string(c, &f->merge_bytes)) return 0;
            nb = f->merge_bytes.n - b;
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ']') return 0;
            c->i++;
        } else return 0;
        if (!push_u32(&f->merges, &f->n_merges, &cap, (uint32_t)a) || !push_u32(&f->merges, &f->n_merges, &cap, (uint32_t)na) ||
            !push_u32(&f->merges, &f->n_merges, &cap, (uint32_t)b) || !push_u32(&f->merges, &f->n_merges, &cap, (uint32_t)nb))
            return 0;
        ws(c);
        if (c->i >= c->n) return 0;
        if (c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->s[c->i] == ']') {
            c->i++;
            f->n_merges /= 4;
            return 1;
        }
        return 0;
    }
}

/* Find root."model".{"vocab","merges"}; spans are [start, end). */
static int locate(const char *s, size_t n, size_t span[2][2]) {
    cur c = {s, n, 0};
    memset(span, 0, sizeof(size_t) * 4);
    ws(&c);
    if (c.i >= n || s[c.i] != '{') return 0;
    c.i++;
    int found_model = 0;
    for (;;) {
        ws(&c);
        if (c.i >= n) return 0;
        if (s[c.i] == '}') break;
        size_t k0 = c.i;
        if (!skip_string(&c)) return 0;
        int is_model = c.i - k0 == 7 && !memcmp(s + k0, "\"model\"", 7);
        ws(&c);
        if (c.i >= n || s[c.i] != ':') return 0;
        c.i++;
        ws(&c);
        if (is_model) {
            if (found_model || c.i >= n || s[c.i] != '{') return 0;
            found_model = 1;
            c.i++;
            for (;;) {
                ws(&c);
                if (c.i >= n) return 0;
                if (s[c.i] == '}') {
                    c.i++;
                    break;
                }
                size_t m0 = c.i;
                if (!skip_string(&c)) return 0;
                int which = c.i - m0 == 7 && !memcmp(s + m0, "\"vocab\"", 7) ? 0
                            : c.i - m0 == 8 && !memcmp(s + m0, "\"merges\"", 8) ? 1 : -1;
                ws(&c);
                if (c.i >= n || s[c.i] != ':') return 0;
                c.i++;
                ws(&c);
                size_t v0 = c.i;
                if (!skip_value(&c)) return 0;
                if (which >= 0) {
                    if (span[which][1]) return 0; /* duplicate key */
                    span[which][0] = v0;
                    span[which][1] = c.i;
                }
                ws(&c);
                if (c.i < n && s[c.i] == ',') c.i++;
            }
        } else if (!skip_value(&c)) return 0;
        ws(&c);
        if (c.i < n && s[c.i] == ',') c.i++;
    }
    return found_model && span[0][1];
}

void kn_vocab_fast_free(kn_vocab_fast *f) {
    kn_tbuf_free(&f->strings);
    kn_tbuf_free(&f->merge_bytes);
    free(f->vocab);
    free(f->merges);
    free(f->rest);
    memset(f, 0, sizeof *f);
}

int kn_vocab_fast_parse(const char *s, size_t n, kn_vocab_fast *f) {
    memset(f, 0, sizeof *f);
    size_t span[2][2];
    if (n < 64 || !locate(s, n, span)) return 0;
    cur v = {s, span[0][1], span[0][0]};
    if (!parse_vocab(&v, f) || v.i != span[0][1]) goto fail;
    if (span[1][1]) {
        cur m = {s, span[1][1], span[1][0]};
        if (!parse_merges(&m, f) || m.i != span[1][1]) goto fail;
        f->has_merges = 1;
    }
    /* the rest of the document with both values replaced by {} / [] (only the
     * small remainder is copied: vocab and merges are most of the bytes) */
    size_t cut[2][2] = {{span[0][0], span[0][1]}, {span[1][0], span[1][1]}};
    int first = !cut[1][1] || cut[0][0] < cut[1][0] ? 0 : 1;
    f->rest = malloc(n + 8 - (span[0][1] - span[0][0]) - (span[1][1] - span[1][0]));
    if (!f->rest) goto fail;
    size_t pos = 0, o = 0;
    for (int k = 0; k < 2; k++) {
        int w = k == 0 ? first : 1 - first;
        if (!cut[w][1]) continue;
        memcpy(f->rest + o, s + pos, cut[w][0] - pos);
        o += cut[w][0] - pos;
        memcpy(f->rest + o, w == 0 ? "{}" : "[]", 2);
        o += 2;
        pos = cut[w][1];
    }
    memcpy(f->rest + o, s + pos, n - pos);
    o += n - pos;
    f->rest[o] = 0;
    f->rest_len = o;
    return 1;
fail:
    kn_vocab_fast_free(f);
    return 0;
}

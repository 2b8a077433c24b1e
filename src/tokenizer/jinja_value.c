/* jinja_value.c — values of the Jinja engine: the render arena, strings,
 * lists, dicts, Python-compatible str()/repr()/json.dumps() formatting,
 * equality and ordering. Everything allocated here lives in an arena (see
 * jinja_internal.h for the ownership rule). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

/* ---- arena ------------------------------------------------------------ */
struct jarena_chunk {
    jarena_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void *jarena_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (a->used + n > a->limit || n > a->limit)) {
        a->exhausted = 1;
        return NULL;
    }
    jarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (h && h->cap * 2 > cap && h->cap < (16u << 20)) cap = h->cap * 2;
        h = malloc(sizeof *h + cap);
        if (!h) {
            a->exhausted = 1;
            return NULL;
        }
        h->cap = cap;
        h->used = 0;
        h->next = a->head;
        a->head = h;
    }
    void *p = h->data + h->used;
    h->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strndup(jarena *a, const char *s, size_t n) {
    char *p = jarena_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jarena_free(jarena *a) {
    jarena_chunk *h = a->head;
    while (h) {
        jarena_chunk *nx = h->next;
        free(h);
        h = nx;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- errors ----------------------------------------------------------- */
int jfail(jctx *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    int n = snprintf(c->err, sizeof c->err, "%s:%d: ", c->t && c->t->name ? c->t->name : "template", c->line);
    if (n < 0 || (size_t)n >= sizeof c->err) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

int joom(jctx *c) {
    return jfail(c, "rendering exceeded the memory limit (%zu bytes)", c->lim->max_arena);
}

/* ---- UTF-8 ------------------------------------------------------------ */
size_t kn_utf8_next(const char *str, size_t len, size_t i, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned char b = s[i];
    uint32_t c;
    size_t n;
    if (b < 0x80) { *cp = b; return i + 1; }
    else if ((b & 0xe0) == 0xc0) { c = b & 0x1f; n = 1; }
    else if ((b & 0xf0) == 0xe0) { c = b & 0x0f; n = 2; }
    else if ((b & 0xf8) == 0xf0) { c = b & 0x07; n = 3; }
    else { *cp = 0xfffd; return i + 1; }
    for (size_t k = 1; k <= n; k++) {
        if (i + k >= len || (s[i + k] & 0xc0) != 0x80) { *cp = 0xfffd; return i + 1; }
        c = (c << 6) | (s[i + k] & 0x3f);
    }
    *cp = c;
    return i + n + 1;
}

int kn_utf8_put(char *d, uint32_t cp) {
    unsigned char *o = (unsigned char *)d;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xc0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3f); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xe0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3f); o[2] = 0x80 | (cp & 0x3f);
        return 3;
    }
    o[0] = 0xf0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3f);
    o[2] = 0x80 | ((cp >> 6) & 0x3f); o[3] = 0x80 | (cp & 0x3f);
    return 4;
}

size_t jstr_ncp(const jstr *s) {
    /* counted with kn_utf8_next so that indexing agrees even on malformed bytes */
    size_t n = 0, i = 0;
    uint32_t cp;
    while (i < s->len) {
        i = kn_utf8_next(s->s, s->len, i, &cp);
        n++;
    }
    return n;
}

/* ---- constructors ----------------------------------------------------- */
jv jv_undef(const char *hint) { jv v = {.t = JV_UNDEF}; v.undef_hint = hint; return v; }
jv jv_none(void) { jv v = {.t = JV_NONE}; return v; }
jv jv_bool(int b) { jv v = {.t = JV_BOOL}; v.b = !!b; return v; }
jv jv_int(int64_t i) { jv v = {.t = JV_INT}; v.i = i; return v; }
jv jv_float(double f) { jv v = {.t = JV_FLOAT}; v.f = f; return v; }

jv jv_str(jctx *c, const char *s, size_t n) {
    jstr *p = jarena_alloc(&c->arena, sizeof(jstr) + n + 1);
    if (!p) {
        joom(c);
        return jv_undef(NULL);
    }
    p->len = n;
    if (n) memcpy(p->s, s, n);
    p->s[n] = 0;
    jv v = {.t = JV_STR};
    v.s = p;
    return v;
}

jv jv_cstr(jctx *c, const char *s) { return jv_str(c, s, strlen(s)); }

jlist *jlist_new(jctx *c, size_t cap) {
    jlist *l = jarena_alloc(&c->arena, sizeof *l);
    if (!l) { joom(c); return NULL; }
    if (cap) {
        l->v = jarena_alloc(&c->arena, cap * sizeof(jv));
        if (!l->v) { joom(c); return NULL; }
        l->cap = cap;
    }
    return l;
}

int jlist_push(jctx *c, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = jarena_alloc(&c->arena, nc * sizeof(jv));
        if (!nv) return joom(c);
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict *jdict_new(jctx *c, size_t cap) {
    jdict *d = jarena_alloc(&c->arena, sizeof *d);
    if (!d) { joom(c); return NULL; }
    if (cap) {
        d->k = jarena_alloc(&c->arena, cap * sizeof(jv));
        d->v = jarena_alloc(&c->arena, cap * sizeof(jv));
        if (!d->k || !d->v) { joom(c); return NULL; }
        d->cap = cap;
    }
    return d;
}

static int key_eq(jv a, jv b) {
    if (a.t == JV_STR && b.t == JV_STR) return a.s->len == b.s->len && !memcmp(a.s->s, b.s->s, a.s->len);
    return jv_equal(a, b);
}

int jdict_get(const jdict *d, jv k, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            *out = d->v[i];
            return 1;
        }
    return 0;
}

int jdict_get_str(const jdict *d, const char *k, jv *out) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s->len == n && !memcmp(d->k[i].s->s, k, n)) {
            *out = d->v[i];
            return 1;
        }
    return 0;
}

int jdict_set(jctx *c, jdict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = jarena_alloc(&c->arena, nc * sizeof(jv)), *nv = jarena_alloc(&c->arena, nc * sizeof(jv));
        if (!nk || !nv) return joom(c);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ---- predicates ------------------------------------------------------- */
int jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s->len != 0;
    case JV_LIST: return jv_is_lazy(v) || v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return 1;
    }
}

int jv_is_seq(jv v) { return v.t == JV_LIST && !v.l->iter_name; }
int jv_is_lazy(jv v) { return v.t == JV_LIST && v.l->iter_name && strncmp(v.l->iter_name, "dict_", 5); }

static int is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num_f(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }

/* Python would raise RecursionError comparing absurdly deep values; here
 * they compare unequal past this depth (never a stack overflow). */
#define JV_MAX_COMPARE_DEPTH 400

static int equal_d(jv a, jv b, int depth);

int jv_equal(jv a, jv b) { return equal_d(a, b, 0); }

static int equal_d(jv a, jv b, int depth) {
    if (depth > JV_MAX_COMPARE_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.s->len == b.s->len && !memcmp(a.s->s, b.s->s, a.s->len);
    case JV_LIST:
        if (a.l->iter_name || b.l->iter_name) return a.l == b.l;
        if (a.l->is_tuple != b.l->is_tuple || a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal_d(a.l->v[i], b.l->v[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            jv o;
            if (!jdict_get(b.d, a.d->k[i], &o) || !equal_d(a.d->v[i], o, depth + 1)) return 0;
        }
        return 1;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    case JV_LOOP: return a.loop == b.loop;
    default: return 0;
    }
}

const char *jv_type_name(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.l->iter_name ? v.l->iter_name : v.l->is_tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

static int compare_d(jctx *c, jv a, jv b, int *cmp, int depth);

int jv_compare(jctx *c, jv a, jv b, int *cmp) { return compare_d(c, a, b, cmp, 0); }

static int compare_d(jctx *c, jv a, jv b, int *cmp, int depth) {
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
    if (depth > JV_MAX_COMPARE_DEPTH) return jfail(c, "maximum recursion depth exceeded in comparison");
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.i : a.b, y = b.t == JV_INT ? b.i : b.b;
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int r = memcmp(a.s->s, b.s->s, n); /* UTF-8 byte order == code point order */
        *cmp = r < 0 ? -1 : r > 0 ? 1 : a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.l->is_tuple == b.l->is_tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->v[i], b.l->v[i])) continue;
            return compare_d(c, a.l->v[i], b.l->v[i], cmp, depth + 1);
        }
        *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    return jfail(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

/* ---- buffers ---------------------------------------------------------- */
int jbuf_put(jctx *c, jbuf *b, const char *s, size_t n) {
    if (!n) return 0;
    if (b->n + n > c->lim->max_output)
        return jfail(c, "rendered output exceeds the limit of %zu bytes", c->lim->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) return jfail(c, "out of memory");
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int jbuf_puts(jctx *c, jbuf *b, const char *s) { return jbuf_put(c, b, s, strlen(s)); }

/* ---- number formatting (Python repr) ---------------------------------- */
void jfmt_float(double f, char *buf, size_t n) {
    if (isnan(f)) { snprintf(buf, n, "nan"); return; }
    if (isinf(f)) { snprintf(buf, n, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(buf, n, signbit(f) ? "-0.0" : "0.0"); return; }
    /* shortest round-trip digits */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp = atoi(p + 1);
    char *o = buf;
    size_t left = n;
#define PUT(ch) do { if (left > 1) { *o++ = (ch); left--; } } while (0)
    if (neg) PUT('-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT('0'); PUT('.');
            for (int i = 0; i < -exp - 1; i++) PUT('0');
            for (int i = 0; i < nd; i++) PUT(digits[i]);
        } else {
            for (int i = 0; i <= exp; i++) PUT(i < nd ? digits[i] : '0');
            PUT('.');
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) PUT(digits[i]);
            else
                PUT('0');
        }
        *o = 0;
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int i = 1; i < nd; i++) PUT(digits[i]);
        }
        *o = 0;
        size_t used = (size_t)(o - buf);
        snprintf(o, n - used, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef PUT
}

/* ---- str / repr ------------------------------------------------------- */
static int write_str_repr(jctx *c, jbuf *b, const jstr *s) {
    int has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (jbuf_put(c, b, &q, 1)) return -1;
    size_t i = 0, run = 0;
    while (i < s->len) {
        uint32_t cp;
        size_t nx = kn_utf8_next(s->s, s->len, i, &cp);
        char esc[12];
        const char *e = NULL;
        if (cp == '\\') e = "\\\\";
        else if (cp == (uint32_t)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (cp == '\n') e = "\\n";
        else if (cp == '\r') e = "\\r";
        else if (cp == '\t') e = "\\t";
        else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0) || cp == 0xad) {
            snprintf(esc, sizeof esc, "\\x%02x", cp);
            e = esc;
        } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) || cp == 0xfeff ||
                   (cp >= 0xd800 && cp <= 0xdfff)) {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            e = esc;
        }
        if (e) {
            if (jbuf_put(c, b, s->s + run, i - run) || jbuf_puts(c, b, e)) return -1;
            run = nx;
        }
        i = nx;
    }
    if (jbuf_put(c, b, s->s + run, s->len - run)) return -1;
    return jbuf_put(c, b, &q, 1);
}

int jv_write_repr(jctx *c, jbuf *b, jv v, int depth) {
    if (depth > 200) return jfail(c, "value nested too deeply to print");
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
    char num[48];
    switch (v.t) {
    case JV_UNDEF: return depth ? jbuf_puts(c, b, "Undefined") : 0; /* str() is '', repr() 'Undefined' */
    case JV_NONE: return jbuf_puts(c, b, "None");
    case JV_BOOL: return jbuf_puts(c, b, v.b ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); return jbuf_puts(c, b, num);
    case JV_FLOAT: jfmt_float(v.f, num, sizeof num); return jbuf_puts(c, b, num);
    case JV_STR: return write_str_repr(c, b, v.s);
    case JV_LIST:
        if (jv_is_lazy(v)) {
            if (jbuf_puts(c, b, "<") || jbuf_puts(c, b, v.l->iter_name) || jbuf_puts(c, b, " object>")) return -1;
            return 0;
        }
        if (v.l->iter_name && (jbuf_puts(c, b, v.l->iter_name) || jbuf_puts(c, b, "("))) return -1;
        if (jbuf_puts(c, b, v.l->is_tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && jbuf_puts(c, b, ", ")) return -1;
            if (jv_write_repr(c, b, v.l->v[i], depth + 1)) return -1;
        }
        if (v.l->is_tuple && v.l->n == 1 && jbuf_puts(c, b, ",")) return -1;
        if (jbuf_puts(c, b, v.l->is_tuple ? ")" : "]")) return -1;
        return v.l->iter_name ? jbuf_puts(c, b, ")") : 0;
    case JV_DICT:
    case JV_NS:
        if (v.t == JV_NS && jbuf_puts(c, b, "<Namespace ")) return -1;
        if (jbuf_puts(c, b, "{")) return -1;
        for (size_t i = 0; i < v.d->n; i++) {
            if (i && jbuf_puts(c, b, ", ")) return -1;
            if (jv_write_repr(c, b, v.d->k[i], depth + 1) || jbuf_puts(c, b, ": ") ||
                jv_write_repr(c, b, v.d->v[i], depth + 1))
                return -1;
        }
        return jbuf_puts(c, b, v.t == JV_NS ? "}>" : "}");
    case JV_MACRO:
        if (jbuf_puts(c, b, "<Macro '") || jbuf_puts(c, b, v.m->def->name ? v.m->def->name : "")) return -1;
        return jbuf_puts(c, b, "'>");
    case JV_FUNC:
        if (jbuf_puts(c, b, "<built-in method ") || jbuf_puts(c, b, v.fn->name)) return -1;
        return jbuf_puts(c, b, ">");
    case JV_LOOP: return jbuf_puts(c, b, "<LoopContext>");
    }
    return 0;
}

int jv_write_str(jctx *c, jbuf *b, jv v) {
    if (v.t == JV_STR) return jbuf_put(c, b, v.s->s, v.s->len);
    return jv_write_repr(c, b, v, 0);
}

int jv_to_str(jctx *c, jv v, jv *out) {
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    jbuf b = {0};
    int rc = jv_write_str(c, &b, v);
    if (!rc) {
        *out = jv_str(c, b.p ? b.p : "", b.n);
        if (c->failed) rc = -1;
    }
    free(b.p);
    return rc;
}

/* ---- json.dumps -------------------------------------------------------- */
static int json_str(jctx *c, jbuf *b, const char *s, size_t len, int ensure_ascii) {
    if (jbuf_put(c, b, "\"", 1)) return -1;
    size_t i = 0, run = 0;
    while (i < len) {
        uint32_t cp;
        size_t nx = kn_utf8_next(s, len, i, &cp);
        char esc[16];
        const char *e = NULL;
        switch (cp) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (cp < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
                e = esc;
            } else if (ensure_ascii && cp >= 0x7f) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", cp);
                }
                e = esc;
            }
        }
        if (e) {
            if (jbuf_put(c, b, s + run, i - run) || jbuf_puts(c, b, e)) return -1;
            run = nx;
        }
        i = nx;
    }
    if (jbuf_put(c, b, s + run, len - run)) return -1;
    return jbuf_put(c, b, "\"", 1);
}

static int json_newline(jctx *c, jbuf *b, const char *indent, int level) {
    if (jbuf_put(c, b, "\n", 1)) return -1;
    for (int i = 0; i < level; i++)
        if (jbuf_puts(c, b, indent)) return -1;
    return 0;
}

static int json_key(jctx *c, jbuf *b, jv k, int ensure_ascii) {
    char num[48];
    switch (k.t) {
    case JV_STR: return json_str(c, b, k.s->s, k.s->len, ensure_ascii);
    case JV_INT: snprintf(num, sizeof num, "\"%lld\"", (long long)k.i); return jbuf_puts(c, b, num);
    case JV_FLOAT: {
        char f[40];
        jfmt_float(k.f, f, sizeof f);
        snprintf(num, sizeof num, "\"%s\"", f);
        return jbuf_puts(c, b, num);
    }
    case JV_BOOL: return jbuf_puts(c, b, k.b ? "\"true\"" : "\"false\"");
    case JV_NONE: return jbuf_puts(c, b, "\"null\"");
    default: return jfail(c, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

int jv_write_json(jctx *c, jbuf *b, jv v, int ensure_ascii, const char *indent, const char *item_sep,
                  const char *key_sep, int sort_keys, int level) {
    if (level > 200) return jfail(c, "value nested too deeply for tojson");
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
    char num[48];
    switch (v.t) {
    case JV_NONE: return jbuf_puts(c, b, "null");
    case JV_BOOL: return jbuf_puts(c, b, v.b ? "true" : "false");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); return jbuf_puts(c, b, num);
    case JV_FLOAT:
        if (isnan(v.f)) return jbuf_puts(c, b, "NaN");
        if (isinf(v.f)) return jbuf_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        jfmt_float(v.f, num, sizeof num);
        return jbuf_puts(c, b, num);
    case JV_STR: return json_str(c, b, v.s->s, v.s->len, ensure_ascii);
    case JV_LIST:
        if (v.l->iter_name) return jfail(c, "Object of type %s is not JSON serializable", v.l->iter_name);
        if (v.l->n == 0) return jbuf_puts(c, b, "[]");
        if (jbuf_puts(c, b, "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && jbuf_puts(c, b, item_sep)) return -1;
            if (indent && json_newline(c, b, indent, level + 1)) return -1;
            if (jv_write_json(c, b, v.l->v[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1))
                return -1;
        }
        if (indent && json_newline(c, b, indent, level)) return -1;
        return jbuf_puts(c, b, "]");
    case JV_DICT: {
        if (v.d->n == 0) return jbuf_puts(c, b, "{}");
        size_t n = v.d->n;
        size_t *ord = jarena_alloc(&c->arena, n * sizeof(size_t));
        if (!ord) return joom(c);
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (sort_keys) /* insertion sort: stable, keys are few */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0; j--) {
                    int cmp;
                    if (jv_compare(c, v.d->k[ord[j - 1]], v.d->k[ord[j]], &cmp)) return -1;
                    if (cmp <= 0) break;
                    size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
        if (jbuf_puts(c, b, "{")) return -1;
        for (size_t i = 0; i < n; i++) {
            if (i && jbuf_puts(c, b, item_sep)) return -1;
            if (indent && json_newline(c, b, indent, level + 1)) return -1;
            if (json_key(c, b, v.d->k[ord[i]], ensure_ascii) || jbuf_puts(c, b, key_sep)) return -1;
            if (jv_write_json(c, b, v.d->v[ord[i]], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1))
                return -1;
        }
        if (indent && json_newline(c, b, indent, level)) return -1;
        return jbuf_puts(c, b, "}");
    }
    case JV_UNDEF: return jfail(c, "Object of type Undefined is not JSON serializable");
    default: return jfail(c, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ---- iteration --------------------------------------------------------- */
int jv_iter_list(jctx *c, jv v, jlist **out) {
    switch (v.t) {
    case JV_UNDEF: *out = jlist_new(c, 0); return *out ? 0 : -1;
    case JV_LIST: *out = v.l; return 0;
    case JV_DICT: {
        jlist *l = jlist_new(c, v.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = v.d->k[i];
        l->n = v.d->n;
        *out = l;
        return 0;
    }
    case JV_STR: {
        jlist *l = jlist_new(c, v.s->len);
        if (!l) return -1;
        size_t i = 0;
        while (i < v.s->len) {
            uint32_t cp;
            size_t nx = kn_utf8_next(v.s->s, v.s->len, i, &cp);
            jv ch = jv_str(c, v.s->s + i, nx - i);
            if (c->failed) return -1;
            l->v[l->n++] = ch;
            i = nx;
        }
        c->ops += l->n;
        *out = l;
        return 0;
    }
    default: return jfail(c, "'%s' object is not iterable", jv_type_name(v));
    }
}

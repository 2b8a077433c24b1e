/* jinja_builtins.c — jinja2's filters and tests as used by chat templates,
 * with transformers' tojson (json.dumps with ensure_ascii=False, optional
 * indent/separators/sort_keys) in place of jinja2's HTML-safe one.
 * autoescape is off, so `safe` is the identity and `escape` returns the
 * HTML-escaped string. Filters jinja2 has but kiln does not implement are
 * accepted at compile time and fail with a clear error when reached. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja_internal.h"

typedef int (*filter_fn)(jctx *c, jv v, const jargs *a, jv *out);

static jv list_val(jlist *l, int tuple) {
    jv v = {.t = JV_LIST};
    l->is_tuple = tuple;
    v.l = l;
    return v;
}

static int undef_err(jctx *c, jv v) { return jfail(c, "%s", v.undef_hint ? v.undef_hint : "value is undefined"); }

/* str() of a value; undefined -> "" (jinja2's soft_str). */
static int soft_str(jctx *c, jv v, jv *out) {
    if (v.t == JV_UNDEF) {
        *out = jv_str(c, "", 0);
        return c->failed ? -1 : 0;
    }
    return jv_to_str(c, v, out);
}

static int to_int64(jctx *c, jv v, const char *what, int64_t *out) {
    if (v.t == JV_INT) *out = v.i;
    else if (v.t == JV_BOOL) *out = v.b;
    else return jfail(c, "%s must be an integer, not %s", what, jv_type_name(v));
    return 0;
}

/* ---- attribute helpers -------------------------------------------------- */
static int get_attr_or_item(jctx *c, jv obj, jv attr, jv *out) {
    if (attr.t == JV_STR) return kn_jinja_attr_path(c, obj, attr.s, out);
    return kn_jinja_getitem(c, obj, attr, out);
}

/* sort key: lowercased strings unless case_sensitive */
static int sort_key(jctx *c, jv v, int case_sensitive, jv *out) {
    if (!case_sensitive && v.t == JV_STR) return kn_jinja_str_case(c, v, JCASE_LOWER, out);
    *out = v;
    return 0;
}

/* stable merge sort of idx[] by keys[]; eq_first: keys compare like
 * one-element lists (jinja2's multi-attribute getter), so equal keys never
 * reach `<` (two Undefined keys are equal) */
static int msort(jctx *c, jv *keys, size_t *idx, size_t *tmp, size_t n, int reverse, int eq_first) {
    if (n < 2) return 0;
    size_t h = n / 2;
    if (msort(c, keys, idx, tmp, h, reverse, eq_first) || msort(c, keys, idx + h, tmp, n - h, reverse, eq_first)) return -1;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int cmp = 0;
        if (eq_first && jv_equal(keys[idx[j]], keys[idx[i]])) cmp = 0;
        else if (keys[idx[j]].t == JV_UNDEF || keys[idx[i]].t == JV_UNDEF)
            return jfail(c, "%s", keys[idx[j]].t == JV_UNDEF && keys[idx[j]].undef_hint ? keys[idx[j]].undef_hint
                                 : keys[idx[i]].t == JV_UNDEF && keys[idx[i]].undef_hint ? keys[idx[i]].undef_hint
                                                                                         : "value is undefined");
        else if (jv_compare(c, keys[idx[j]], keys[idx[i]], &cmp)) return -1;
        if (reverse) cmp = -cmp;
        if (cmp < 0) tmp[k++] = idx[j++];
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return 0;
}

/* Sort items by (attribute path | item) with jinja2's case handling. */
static int sort_items(jctx *c, jlist *items, jv attr, int case_sensitive, int reverse, jlist **out) {
    size_t n = items->n;
    jv *keys = jarena_alloc(&c->arena, (n + 1) * sizeof(jv));
    size_t *idx = jarena_alloc(&c->arena, (n + 1) * sizeof(size_t)), *tmp = jarena_alloc(&c->arena, (n + 1) * sizeof(size_t));
    if (!keys || !idx || !tmp) return joom(c);
    for (size_t i = 0; i < n; i++) {
        jv k = items->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE && get_attr_or_item(c, k, attr, &k)) return -1;
        if (sort_key(c, k, case_sensitive, &keys[i])) return -1;
        idx[i] = i;
    }
    if (msort(c, keys, idx, tmp, n, reverse, attr.t == JV_STR)) return -1;
    jlist *l = jlist_new(c, n);
    if (!l) return -1;
    for (size_t i = 0; i < n; i++) l->v[i] = items->v[idx[i]];
    l->n = n;
    *out = l;
    return 0;
}

static int seq_items(jctx *c, jv v, jlist **out) {
    if (v.t == JV_NONE || v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL)
        return jfail(c, "'%s' object is not iterable", jv_type_name(v));
    return jv_iter_list(c, v, out);
}

/* ---- filters -------------------------------------------------------------- */
static int f_abs(jctx *c, jv v, const jargs *a, jv *out) {
    if (v.t == JV_INT) {
        if (v.i == INT64_MIN) return jfail(c, "integer overflow");
        *out = jv_int(v.i < 0 ? -v.i : v.i);
    } else if (v.t == JV_BOOL) *out = jv_int(v.b);
    else if (v.t == JV_FLOAT) *out = jv_float(fabs(v.f));
    else return jfail(c, "bad operand type for abs(): '%s'", jv_type_name(v));
    return 0;
}

static int f_attr(jctx *c, jv v, const jargs *a, jv *out) {
    jv name;
    if (!jarg(a, 0, "name", &name) || name.t != JV_STR) return jfail(c, "attr() needs an attribute name");
    if (v.t == JV_DICT) { /* attr() never looks at items */
        *out = jv_undef(NULL);
        return 0;
    }
    return kn_jinja_getattr(c, v, name.s->s, out);
}

static int f_capitalize(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    return soft_str(c, v, &s) || kn_jinja_str_case(c, s, JCASE_CAPITALIZE, out);
}

static int f_center(jctx *c, jv v, const jargs *a, jv *out) {
    jv s, w = jv_int(80);
    int64_t width = 0;
    jarg(a, 0, "width", &w);
    if (soft_str(c, v, &s) || to_int64(c, w, "width", &width)) return -1;
    int64_t n = (int64_t)jstr_ncp(s.s);
    if (width <= n) {
        *out = s;
        return 0;
    }
    if ((uint64_t)width > c->lim->max_output) return jfail(c, "padding exceeds the output limit");
    int64_t total = width - n, left = total / 2 + (total & width & 1);
    jbuf b = {0};
    int rc = 0;
    for (int64_t i = 0; i < left && !rc; i++) rc = jbuf_put(c, &b, " ", 1);
    if (!rc) rc = jbuf_put(c, &b, s.s->s, s.s->len);
    for (int64_t i = 0; i < total - left && !rc; i++) rc = jbuf_put(c, &b, " ", 1);
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_length(jctx *c, jv v, const jargs *a, jv *out) {
    switch (v.t) {
    case JV_UNDEF: *out = jv_int(0); return 0;
    case JV_STR: *out = jv_int((int64_t)jstr_ncp(v.s)); return 0;
    case JV_LIST:
        if (jv_is_lazy(v)) return jfail(c, "object of type '%s' has no len()", v.l->iter_name);
        *out = jv_int((int64_t)v.l->n);
        return 0;
    case JV_DICT: case JV_NS: *out = jv_int((int64_t)v.d->n); return 0;
    default: return jfail(c, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static int f_default(jctx *c, jv v, const jargs *a, jv *out) {
    jv dflt, boolean = jv_bool(0);
    if (!jarg(a, 0, "default_value", &dflt)) dflt = jv_str(c, "", 0);
    jarg(a, 1, "boolean", &boolean);
    if (v.t == JV_UNDEF || (jv_truthy(boolean) && !jv_truthy(v))) *out = dflt;
    else *out = v;
    return c->failed ? -1 : 0;
}

static int f_dictsort(jctx *c, jv v, const jargs *a, jv *out) {
    jv cs = jv_bool(0), by = jv_undef(NULL), rev = jv_bool(0);
    jarg(a, 0, "case_sensitive", &cs);
    jarg(a, 1, "by", &by);
    jarg(a, 2, "reverse", &rev);
    if (v.t != JV_DICT) return jfail(c, "dictsort expects a mapping");
    int by_value = by.t == JV_STR && !strcmp(by.s->s, "value");
    if (by.t == JV_STR && !by_value && strcmp(by.s->s, "key")) return jfail(c, "You can only sort by either \"key\" or \"value\"");
    jlist *pairs = jlist_new(c, v.d->n);
    if (!pairs) return -1;
    for (size_t i = 0; i < v.d->n; i++) {
        jlist *p = jlist_new(c, 2);
        if (!p) return -1;
        p->v[0] = v.d->k[i];
        p->v[1] = v.d->v[i];
        p->n = 2;
        pairs->v[pairs->n++] = list_val(p, 1);
    }
    jlist *sorted;
    if (sort_items(c, pairs, jv_int(by_value ? 1 : 0), jv_truthy(cs), jv_truthy(rev), &sorted)) return -1;
    *out = list_val(sorted, 0);
    return 0;
}

static int f_escape(jctx *c, jv v, const jargs *a, jv *out) { return kn_jinja_html_escape(c, v, out); }

int kn_jinja_html_escape(jctx *c, jv v, jv *out) {
    jv s;
    if (v.t == JV_STR && v.markup) {
        *out = v;
        return 0;
    }
    if (soft_str(c, v, &s)) return -1;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < s.s->len && !rc; i++) {
        const char *e = NULL;
        switch (s.s->s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        rc = e ? jbuf_puts(c, &b, e) : jbuf_put(c, &b, s.s->s + i, 1);
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    out->markup = 1;
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_first(jctx *c, jv v, const jargs *a, jv *out) {
    jlist *l;
    if (v.t == JV_UNDEF) {
        *out = jv_undef("No first item, sequence was empty.");
        return 0;
    }
    if (seq_items(c, v, &l)) return -1;
    *out = l->n ? l->v[0] : jv_undef("No first item, sequence was empty.");
    return 0;
}

static int f_last(jctx *c, jv v, const jargs *a, jv *out) {
    jlist *l;
    if (v.t == JV_UNDEF) {
        *out = jv_undef("No last item, sequence was empty.");
        return 0;
    }
    if (jv_is_lazy(v)) return jfail(c, "'%s' object is not reversible", v.l->iter_name);
    if (seq_items(c, v, &l)) return -1;
    *out = l->n ? l->v[l->n - 1] : jv_undef("No last item, sequence was empty.");
    return 0;
}

static int parse_py_int(const char *s, size_t len, int base, int64_t *out) {
    /* Python int(str, base): surrounding whitespace, sign, underscores between digits, base prefixes for 0/16/8/2 */
    size_t i = 0;
    while (i < len && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
    while (len > i && (s[len - 1] == ' ' || (s[len - 1] >= '\t' && s[len - 1] <= '\r'))) len--;
    int neg = 0;
    if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i + 1 < len && s[i] == '0' && (base == 16 || base == 0) && (s[i + 1] == 'x' || s[i + 1] == 'X')) { i += 2; base = 16; }
    else if (i + 1 < len && s[i] == '0' && (base == 8 || base == 0) && (s[i + 1] == 'o' || s[i + 1] == 'O')) { i += 2; base = 8; }
    else if (i + 1 < len && s[i] == '0' && (base == 2 || base == 0) && (s[i + 1] == 'b' || s[i + 1] == 'B')) { i += 2; base = 2; }
    if (base == 0) base = 10;
    if (i >= len) return -1;
    uint64_t acc = 0;
    int prev_us = 1;
    for (; i < len; i++) {
        char ch = s[i];
        if (ch == '_') {
            if (prev_us) return -1;
            prev_us = 1;
            continue;
        }
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'Z' ? ch - 'A' + 10 : 99;
        if (d >= base) return -1;
        if (acc > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return -2;
        acc = acc * (uint64_t)base + (uint64_t)d;
        prev_us = 0;
    }
    if (prev_us) return -1;
    if (acc > (uint64_t)INT64_MAX + (uint64_t)neg) return -2;
    *out = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 0;
}

static int parse_py_float(const char *s, size_t len, double *out) {
    char buf[128];
    size_t i = 0, n = 0;
    while (i < len && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
    while (len > i && (s[len - 1] == ' ' || (s[len - 1] >= '\t' && s[len - 1] <= '\r'))) len--;
    if (i >= len || len - i >= sizeof buf) return -1;
    for (; i < len; i++) {
        if (s[i] == '_') continue;
        if (s[i] == 'x' || s[i] == 'X' || s[i] == 'p' || s[i] == 'P') return -1; /* no hex floats in Python's float() */
        buf[n++] = s[i];
    }
    buf[n] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (end == buf || *end) return -1;
    *out = d;
    return 0;
}

static int f_int(jctx *c, jv v, const jargs *a, jv *out) {
    jv dflt = jv_int(0), basev = jv_int(10);
    jarg(a, 0, "default", &dflt);
    jarg(a, 1, "base", &basev);
    int64_t base = 10;
    if (to_int64(c, basev, "base", &base)) return -1;
    if (v.t == JV_UNDEF) return undef_err(c, v); /* int(Undefined) raises */
    switch (v.t) {
    case JV_INT: *out = v; return 0;
    case JV_BOOL: *out = jv_int(v.b); return 0;
    case JV_FLOAT:
        if (isnan(v.f) || isinf(v.f) || fabs(v.f) >= 9.2e18) { *out = dflt; return 0; }
        *out = jv_int((int64_t)v.f);
        return 0;
    case JV_STR: {
        int64_t r;
        int rc = parse_py_int(v.s->s, v.s->len, (int)base, &r);
        if (rc == 0) { *out = jv_int(r); return 0; }
        if (rc == -2) return jfail(c, "integer too large for kiln (64-bit)");
        double d;
        if (!parse_py_float(v.s->s, v.s->len, &d) && !isnan(d) && !isinf(d) && fabs(d) < 9.2e18) {
            *out = jv_int((int64_t)d);
            return 0;
        }
        *out = dflt;
        return 0;
    }
    default: *out = dflt; return 0;
    }
}

static int f_float(jctx *c, jv v, const jargs *a, jv *out) {
    jv dflt = jv_float(0.0);
    jarg(a, 0, "default", &dflt);
    if (v.t == JV_UNDEF) return undef_err(c, v); /* float(Undefined) raises */
    switch (v.t) {
    case JV_INT: *out = jv_float((double)v.i); return 0;
    case JV_BOOL: *out = jv_float(v.b); return 0;
    case JV_FLOAT: *out = v; return 0;
    case JV_STR: {
        double d;
        *out = parse_py_float(v.s->s, v.s->len, &d) ? dflt : jv_float(d);
        return 0;
    }
    default: *out = dflt; return 0;
    }
}

/* Python printf-style formatting: %[flags][width][.precision]conv with
 * conv in s r d i u f F e E g G x X o c %. Used by the format filter and by
 * `str % args`. Mapping keys (%(name)s) are not supported. */
int kn_jinja_printf(jctx *c, jv fmtv, const jv *args, int n_args, int allow_unused, jv *out) {
    jv s;
    if (soft_str(c, fmtv, &s)) return -1;
    jbuf b = {0};
    int rc = 0, ai = 0;
    const char *p = s.s->s, *end = p + s.s->len;
    while (p < end && !rc) {
        if (*p != '%') {
            const char *q = memchr(p, '%', (size_t)(end - p));
            if (!q) q = end;
            rc = jbuf_put(c, &b, p, (size_t)(q - p));
            p = q;
            continue;
        }
        p++;
        char flags[8];
        int nf = 0, width = -1, prec = -1;
        while (p < end && strchr("-+ 0#", *p) && nf < 6) flags[nf++] = *p++;
        flags[nf] = 0;
        if (p < end && *p == '(') { rc = jfail(c, "%%(name)s formatting is not supported by kiln"); break; }
        if (p < end && *p == '*') { rc = jfail(c, "'*' width in %% formatting is not supported by kiln"); break; }
        /* digits saturate just past the 4096 limit below (no int overflow on hostile input) */
        while (p < end && *p >= '0' && *p <= '9') {
            width = (width < 0 ? 0 : width) * 10 + (*p++ - '0');
            if (width > 4097) width = 4097;
        }
        if (p < end && *p == '.') {
            prec = 0;
            p++;
            while (p < end && *p >= '0' && *p <= '9') {
                prec = prec * 10 + (*p++ - '0');
                if (prec > 4097) prec = 4097;
            }
        }
        if (p >= end) { rc = jfail(c, "incomplete format"); break; }
        if (width > 4096 || prec > 4096) { rc = jfail(c, "format width or precision too large"); break; }
        char k = *p++;
        if (k == '%') { rc = jbuf_put(c, &b, "%", 1); continue; }
        if (ai >= n_args) { rc = jfail(c, "not enough arguments for format string"); break; }
        jv x = args[ai++];
        char spec[32], num[9000]; /* width, precision <= 4096 and |x| <= 1e300 for %f fit */
        if (k == 's' || k == 'r') {
            jbuf t = {0};
            rc = k == 'r' ? jv_write_repr(c, &t, x, 0) : x.t == JV_UNDEF ? 0 : jv_write_str(c, &t, x);
            size_t len = t.n, ncp = 0, i = 0;
            uint32_t cp;
            while (i < len && (prec < 0 || (int)ncp < prec)) { i = kn_utf8_next(t.p, len, i, &cp); ncp++; }
            len = i;
            int left = strchr(flags, '-') != NULL;
            for (int pad = width - (int)ncp; !rc && !left && pad > 0; pad--) rc = jbuf_put(c, &b, " ", 1);
            if (!rc && len) rc = jbuf_put(c, &b, t.p, len);
            for (int pad = width - (int)ncp; !rc && left && pad > 0; pad--) rc = jbuf_put(c, &b, " ", 1);
            free(t.p);
            continue;
        }
        int is_intconv = k == 'd' || k == 'i' || k == 'u' || k == 'x' || k == 'X' || k == 'o' || k == 'c';
        int is_fconv = k == 'f' || k == 'F' || k == 'e' || k == 'E' || k == 'g' || k == 'G';
        if (!is_intconv && !is_fconv) { rc = jfail(c, "unsupported format character '%c'", k); break; }
        if (x.t != JV_INT && x.t != JV_FLOAT && x.t != JV_BOOL) {
            rc = jfail(c, "%%%c format: a real number is required, not %s", k, jv_type_name(x));
            break;
        }
        double d = x.t == JV_FLOAT ? x.f : (double)(x.t == JV_INT ? x.i : x.b);
        if (is_intconv) {
            if (k == 'c') { rc = jfail(c, "%%c formatting is not supported by kiln"); break; }
            if ((k == 'x' || k == 'X' || k == 'o') && x.t == JV_FLOAT) { rc = jfail(c, "%%%c format: an integer is required, not float", k); break; }
            if (x.t == JV_FLOAT && !(fabs(d) < 9.2e18)) { rc = jfail(c, "cannot convert float to integer"); break; }
            long long v = x.t == JV_FLOAT ? (long long)d : (long long)(x.t == JV_INT ? x.i : x.b);
            snprintf(spec, sizeof spec, "%%%s%s%s%s%s", flags, width >= 0 ? "*" : "", prec >= 0 ? ".*" : "", "ll",
                     k == 'i' || k == 'u' ? "d" : (char[]){k, 0});
            if (width >= 0 && prec >= 0) snprintf(num, sizeof num, spec, width, prec, v);
            else if (width >= 0) snprintf(num, sizeof num, spec, width, v);
            else if (prec >= 0) snprintf(num, sizeof num, spec, prec, v);
            else snprintf(num, sizeof num, spec, v);
        } else {
            if (fabs(d) > 1e300 && (k == 'f' || k == 'F')) { rc = jfail(c, "%%f of a huge number is not supported by kiln"); break; }
            snprintf(spec, sizeof spec, "%%%s*.*%c", flags, k);
            snprintf(num, sizeof num, spec, width < 0 ? 0 : width, prec < 0 ? 6 : prec, d);
        }
        rc = jbuf_puts(c, &b, num);
    }
    if (!rc && ai < n_args && !allow_unused) rc = jfail(c, "not all arguments converted during string formatting");
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_format(jctx *c, jv v, const jargs *a, jv *out) {
    if (a->n_kw) return jfail(c, "format filter with keyword arguments is not supported by kiln");
    return kn_jinja_printf(c, v, a->pos, a->n_pos, 0, out);
}

static int f_indent(jctx *c, jv v, const jargs *a, jv *out) {
    jv s, w = jv_int(4), first = jv_bool(0), blank = jv_bool(0), ind;
    jarg(a, 0, "width", &w);
    jarg(a, 1, "first", &first);
    jarg(a, 2, "blank", &blank);
    if (v.t == JV_UNDEF) return undef_err(c, v);
    if (v.t != JV_STR) return jfail(c, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    s = v;
    if (w.t == JV_STR) ind = w;
    else {
        int64_t n = 0;
        if (to_int64(c, w, "width", &n)) return -1;
        if (n < 0) n = 0;
        if ((uint64_t)n > 4096) return jfail(c, "indent width too large");
        char sp[4097];
        memset(sp, ' ', (size_t)n);
        ind = jv_str(c, sp, (size_t)n);
    }
    /* lines = (s + "\n").splitlines(); rv = lines[0] + "\n" + "\n".join(ind + l if l (or blank) else l) */
    jbuf b = {0};
    int rc = 0, line_no = 0;
    size_t i = 0, st = 0, len = s.s->len;
    const char *p = s.s->s;
    if (jv_truthy(first)) rc = jbuf_put(c, &b, ind.s->s, ind.s->len);
    while (!rc && i <= len) {
        int br = 0;
        size_t nx = i;
        if (i == len) br = 1; /* the "\n" jinja2 appends */
        else {
            uint32_t cp;
            nx = kn_utf8_next(p, len, i, &cp);
            br = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
                 cp == 0x2028 || cp == 0x2029;
            if (br && cp == '\r' && nx < len && p[nx] == '\n') nx++;
        }
        if (br) {
            size_t ll = i - st;
            if (line_no > 0) {
                rc = jbuf_put(c, &b, "\n", 1);
                if (!rc && (ll > 0 || jv_truthy(blank))) rc = jbuf_put(c, &b, ind.s->s, ind.s->len);
            }
            if (!rc) rc = jbuf_put(c, &b, p + st, ll);
            line_no++;
            if (i == len) break;
            st = nx;
        }
        i = nx;
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_items(jctx *c, jv v, const jargs *a, jv *out) {
    jlist *l = jlist_new(c, 0);
    if (!l) return -1;
    if (v.t == JV_UNDEF) {
        *out = list_val(l, 0);
        l->iter_name = "generator";
        return 0;
    }
    if (v.t != JV_DICT && v.t != JV_NS) return jfail(c, "Can only get item pairs from a mapping.");
    for (size_t i = 0; i < v.d->n; i++) {
        jlist *p = jlist_new(c, 2);
        if (!p) return -1;
        p->v[0] = v.d->k[i];
        p->v[1] = v.d->v[i];
        p->n = 2;
        if (jlist_push(c, l, list_val(p, 1))) return -1;
    }
    *out = list_val(l, 0);
    l->iter_name = "generator";
    return 0;
}

static int f_join(jctx *c, jv v, const jargs *a, jv *out) {
    jv d = jv_undef(NULL), attr = jv_undef(NULL), sep;
    jarg(a, 0, "d", &d);
    jarg(a, 1, "attribute", &attr);
    if (d.t == JV_UNDEF) sep = jv_str(c, "", 0);
    else if (soft_str(c, d, &sep)) return -1;
    jlist *l;
    if (seq_items(c, v, &l)) return -1;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < l->n && !rc; i++) {
        jv x = l->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE) rc = get_attr_or_item(c, x, attr, &x);
        if (!rc && i) rc = jbuf_put(c, &b, sep.s->s, sep.s->len);
        if (!rc && x.t != JV_UNDEF) rc = jv_write_str(c, &b, x);
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_list(jctx *c, jv v, const jargs *a, jv *out) {
    jlist *l, *cp;
    if (seq_items(c, v, &l)) return -1;
    if (!(cp = jlist_new(c, l->n))) return -1;
    if (l->n) memcpy(cp->v, l->v, l->n * sizeof(jv));
    cp->n = l->n;
    *out = list_val(cp, 0);
    return 0;
}

static int f_lower(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    return soft_str(c, v, &s) || kn_jinja_str_case(c, s, JCASE_LOWER, out);
}

static int f_upper(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    return soft_str(c, v, &s) || kn_jinja_str_case(c, s, JCASE_UPPER, out);
}

static int f_title(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    return soft_str(c, v, &s) || kn_jinja_str_case(c, s, JCASE_TITLE_JINJA, out);
}

static int f_minmax(jctx *c, jv v, const jargs *a, jv *out, int want_max) {
    jv cs = jv_bool(0), attr = jv_undef(NULL);
    jarg(a, 0, "case_sensitive", &cs);
    jarg(a, 1, "attribute", &attr);
    jlist *l;
    if (seq_items(c, v, &l)) return -1;
    if (!l->n) {
        *out = jv_undef("No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    jv bk;
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE && get_attr_or_item(c, k, attr, &k)) return -1;
        if (sort_key(c, k, jv_truthy(cs), &k)) return -1;
        if (i == 0) { bk = k; continue; }
        int cmp;
        if (jv_compare(c, k, bk, &cmp)) return -1;
        if (want_max ? cmp > 0 : cmp < 0) { best = i; bk = k; }
    }
    *out = l->v[best];
    return 0;
}
static int f_max(jctx *c, jv v, const jargs *a, jv *out) { return f_minmax(c, v, a, out, 1); }
static int f_min(jctx *c, jv v, const jargs *a, jv *out) { return f_minmax(c, v, a, out, 0); }

static int f_replace(jctx *c, jv v, const jargs *a, jv *out) {
    jv s, old, rep, cnt = jv_none();
    if (!jarg(a, 0, "old", &old) || !jarg(a, 1, "new", &rep)) return jfail(c, "replace() needs old and new");
    jarg(a, 2, "count", &cnt);
    int64_t n = -1;
    if (cnt.t != JV_NONE && to_int64(c, cnt, "count", &n)) return -1;
    if (soft_str(c, v, &s)) return -1;
    jv so, sr;
    if (jv_to_str(c, old, &so) || jv_to_str(c, rep, &sr)) return -1;
    return kn_jinja_str_replace(c, s, so, sr, n, out);
}

static int f_reverse(jctx *c, jv v, const jargs *a, jv *out) {
    if (v.t == JV_STR) {
        jlist *l;
        if (jv_iter_list(c, v, &l)) return -1;
        jbuf b = {0};
        int rc = 0;
        for (size_t i = l->n; i-- > 0 && !rc;) rc = jbuf_put(c, &b, l->v[i].s->s, l->v[i].s->len);
        if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return rc || c->failed ? -1 : 0;
    }
    jlist *l, *r;
    if (seq_items(c, v, &l) || !(r = jlist_new(c, l->n))) return -1;
    for (size_t i = 0; i < l->n; i++) r->v[i] = l->v[l->n - 1 - i];
    r->n = l->n;
    *out = list_val(r, 0);
    /* reversed(list) is an iterator; a generator is materialized into a list */
    if (v.t == JV_LIST && !jv_is_lazy(v)) r->iter_name = "list_reverseiterator";
    else if (v.t == JV_DICT) r->iter_name = "dict_reversekeyiterator";
    return 0;
}

static int f_round(jctx *c, jv v, const jargs *a, jv *out) {
    jv pv = jv_int(0), mv = jv_undef(NULL);
    jarg(a, 0, "precision", &pv);
    jarg(a, 1, "method", &mv);
    int64_t prec = 0;
    if (to_int64(c, pv, "precision", &prec)) return -1;
    const char *method = mv.t == JV_STR ? mv.s->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jfail(c, "method must be common, ceil or floor");
    if (v.t != JV_INT && v.t != JV_FLOAT && v.t != JV_BOOL)
        return jfail(c, "type %s doesn't define __round__ method", jv_type_name(v));
    if (!strcmp(method, "common")) {
        if (v.t != JV_FLOAT) { /* round(int, n) stays int for n >= 0 */
            *out = jv_int(v.t == JV_INT ? v.i : v.b);
            return 0;
        }
        if (prec > 300 || prec < -300) { *out = v; return 0; }
        char buf[400];
        if (prec >= 0) {
            snprintf(buf, sizeof buf, "%.*f", (int)prec, v.f); /* correctly rounded, half-even on exact ties */
            *out = jv_float(strtod(buf, NULL));
        } else {
            double m = pow(10.0, (double)-prec);
            *out = jv_float(nearbyint(v.f / m) * m);
        }
        return 0;
    }
    double x = v.t == JV_FLOAT ? v.f : (double)(v.t == JV_INT ? v.i : v.b), m = pow(10.0, (double)prec);
    *out = jv_float((!strcmp(method, "ceil") ? ceil(x * m) : floor(x * m)) / m);
    return 0;
}

static int f_safe(jctx *c, jv v, const jargs *a, jv *out) {
    if (v.t != JV_STR && soft_str(c, v, &v)) return -1;
    *out = v;
    out->markup = 1;
    return 0;
}

/* select/reject/selectattr/rejectattr */
static int f_select_common(jctx *c, jv v, const jargs *a, jv *out, int by_attr, int want) {
    jlist *l, *r;
    if (!(r = jlist_new(c, 0))) return -1;
    r->iter_name = "generator";
    *out = list_val(r, 0);
    if (!jv_truthy(v)) return 0; /* jinja2: `if value:` before iterating */
    if (seq_items(c, v, &l)) return -1;
    int first = 0;
    jv attr = jv_undef(NULL);
    if (by_attr) {
        if (!jarg(a, 0, NULL, &attr)) return jfail(c, "%s() needs an attribute name", want ? "selectattr" : "rejectattr");
        first = 1;
    }
    jv test = jv_undef(NULL);
    int has_test = a->n_pos > first;
    if (has_test) test = a->pos[first];
    if (has_test && test.t != JV_STR) return jfail(c, "test name must be a string");
    jargs targs = {.pos = a->pos + first + 1, .n_pos = has_test ? a->n_pos - first - 1 : 0, .kw_names = a->kw_names, .kw = a->kw, .n_kw = a->n_kw};
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        if (by_attr && get_attr_or_item(c, x, attr, &x)) return -1;
        int ok;
        if (has_test) {
            if (kn_jinja_apply_test(c, test.s->s, x, &targs, &ok)) return -1;
        } else {
            ok = jv_truthy(x);
        }
        if (ok == want && jlist_push(c, r, l->v[i])) return -1;
    }
    return 0;
}
static int f_select(jctx *c, jv v, const jargs *a, jv *out) { return f_select_common(c, v, a, out, 0, 1); }
static int f_reject(jctx *c, jv v, const jargs *a, jv *out) { return f_select_common(c, v, a, out, 0, 0); }
static int f_selectattr(jctx *c, jv v, const jargs *a, jv *out) { return f_select_common(c, v, a, out, 1, 1); }
static int f_rejectattr(jctx *c, jv v, const jargs *a, jv *out) { return f_select_common(c, v, a, out, 1, 0); }

static int f_map(jctx *c, jv v, const jargs *a, jv *out) {
    jlist *l, *r;
    if (!jv_truthy(v)) {
        if (!(r = jlist_new(c, 0))) return -1;
        *out = list_val(r, 0);
        r->iter_name = "generator";
        return 0;
    }
    if (seq_items(c, v, &l) || !(r = jlist_new(c, l->n))) return -1;
    jv attr, dflt = jv_undef(NULL);
    int by_attr = jarg(a, -1, "attribute", &attr);
    int has_default = jarg(a, -1, "default", &dflt);
    if (!by_attr && a->n_pos == 0) return jfail(c, "map requires a filter argument");
    if (!by_attr && a->pos[0].t != JV_STR) return jfail(c, "map filter name must be a string");
    jargs fargs = {0};
    if (!by_attr) {
        fargs.pos = a->pos + 1;
        fargs.n_pos = a->n_pos - 1;
        fargs.kw_names = a->kw_names;
        fargs.kw = a->kw;
        fargs.n_kw = a->n_kw;
        if (kn_jinja_filter_exists(a->pos[0].s->s) != 1) return jfail(c, "No filter named '%s'.", a->pos[0].s->s);
    }
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        if (by_attr) {
            if (get_attr_or_item(c, x, attr, &x)) return -1;
            if (x.t == JV_UNDEF && has_default) x = dflt;
        } else if (kn_jinja_apply_filter(c, a->pos[0].s->s, x, &fargs, &x)) {
            return -1;
        }
        r->v[r->n++] = x;
    }
    *out = list_val(r, 0);
    r->iter_name = "generator";
    return 0;
}

static int f_sort(jctx *c, jv v, const jargs *a, jv *out) {
    jv rev = jv_bool(0), cs = jv_bool(0), attr = jv_undef(NULL);
    jarg(a, 0, "reverse", &rev);
    jarg(a, 1, "case_sensitive", &cs);
    jarg(a, 2, "attribute", &attr);
    jlist *l, *r;
    if (seq_items(c, v, &l)) return -1;
    if (attr.t == JV_STR && memchr(attr.s->s, ',', attr.s->len)) return jfail(c, "sort by several attributes is not supported by kiln");
    if (sort_items(c, l, attr, jv_truthy(cs), jv_truthy(rev), &r)) return -1;
    *out = list_val(r, 0);
    return 0;
}

static int f_string(jctx *c, jv v, const jargs *a, jv *out) { return soft_str(c, v, out); }

static int f_sum(jctx *c, jv v, const jargs *a, jv *out) {
    jv attr = jv_undef(NULL), acc = jv_int(0);
    jarg(a, 0, "attribute", &attr);
    jarg(a, 1, "start", &acc);
    jlist *l;
    if (seq_items(c, v, &l)) return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE && get_attr_or_item(c, x, attr, &x)) return -1;
        if ((acc.t == JV_INT || acc.t == JV_BOOL) && (x.t == JV_INT || x.t == JV_BOOL)) {
            int64_t r;
            if (__builtin_add_overflow(acc.t == JV_INT ? acc.i : acc.b, x.t == JV_INT ? x.i : x.b, &r)) return jfail(c, "integer overflow");
            acc = jv_int(r);
        } else if ((acc.t == JV_INT || acc.t == JV_FLOAT || acc.t == JV_BOOL) && (x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL)) {
            double p = acc.t == JV_FLOAT ? acc.f : (double)(acc.t == JV_INT ? acc.i : acc.b);
            double q = x.t == JV_FLOAT ? x.f : (double)(x.t == JV_INT ? x.i : x.b);
            acc = jv_float(p + q);
        } else {
            return jfail(c, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(acc), jv_type_name(x));
        }
    }
    *out = acc;
    return 0;
}

static int f_tojson(jctx *c, jv v, const jargs *a, jv *out) {
    jv ea = jv_bool(0), indent = jv_none(), seps = jv_none(), sk = jv_bool(0);
    jarg(a, 0, "ensure_ascii", &ea);
    jarg(a, 1, "indent", &indent);
    jarg(a, 2, "separators", &seps);
    jarg(a, 3, "sort_keys", &sk);
    const char *ind = NULL;
    char sp[257];
    if (indent.t == JV_INT || indent.t == JV_BOOL) {
        int64_t n = indent.t == JV_INT ? indent.i : indent.b;
        if (n < 0) n = 0;
        if (n > 256) return jfail(c, "tojson indent too large");
        memset(sp, ' ', (size_t)n);
        sp[n] = 0;
        ind = sp;
    } else if (indent.t == JV_STR) {
        ind = indent.s->s;
    } else if (indent.t != JV_NONE && indent.t != JV_UNDEF) {
        return jfail(c, "tojson indent must be an int or a string");
    }
    const char *item_sep = ind ? "," : ", ", *key_sep = ": ";
    if (seps.t == JV_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].t != JV_STR || seps.l->v[1].t != JV_STR)
            return jfail(c, "tojson separators must be a pair of strings");
        item_sep = seps.l->v[0].s->s;
        key_sep = seps.l->v[1].s->s;
    } else if (seps.t != JV_NONE && seps.t != JV_UNDEF) {
        return jfail(c, "tojson separators must be a pair of strings");
    }
    jbuf b = {0};
    int rc = jv_write_json(c, &b, v, jv_truthy(ea), ind, item_sep, key_sep, jv_truthy(sk), 0);
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int f_trim(jctx *c, jv v, const jargs *a, jv *out) {
    jv s, chars = jv_none();
    jarg(a, 0, "chars", &chars);
    return soft_str(c, v, &s) || kn_jinja_str_strip(c, s, &chars, 1, 1, out);
}

static int f_unique(jctx *c, jv v, const jargs *a, jv *out) {
    jv cs = jv_bool(0), attr = jv_undef(NULL);
    jarg(a, 0, "case_sensitive", &cs);
    jarg(a, 1, "attribute", &attr);
    jlist *l, *r, *seen;
    if (seq_items(c, v, &l) || !(r = jlist_new(c, 0)) || !(seen = jlist_new(c, 0))) return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE && get_attr_or_item(c, k, attr, &k)) return -1;
        if (sort_key(c, k, jv_truthy(cs), &k)) return -1;
        if (k.t == JV_LIST && !k.l->is_tuple) return jfail(c, "unhashable type: 'list'");
        if (k.t == JV_DICT) return jfail(c, "unhashable type: 'dict'");
        int dup = 0;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jv_equal(seen->v[j], k);
        c->ops += seen->n;
        if (c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
        if (!dup && (jlist_push(c, seen, k) || jlist_push(c, r, l->v[i]))) return -1;
    }
    *out = list_val(r, 0);
    r->iter_name = "generator";
    return 0;
}

static int f_wordcount(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    if (soft_str(c, v, &s)) return -1;
    int64_t n = 0;
    int in_word = 0;
    for (size_t i = 0; i < s.s->len;) {
        uint32_t cp;
        i = kn_utf8_next(s.s->s, s.s->len, i, &cp);
        int w = (cp < 0x80 && (cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z'))) ||
                (cp >= 0x80 && !kn_jinja_is_space(cp));
        if (w && !in_word) n++;
        in_word = w;
    }
    *out = jv_int(n);
    return 0;
}

/* jinja2 do_truncate(s, length=255, killwords=False, end='...', leeway=5) */
static int f_truncate(jctx *c, jv v, const jargs *a, jv *out) {
    jv s, lv = jv_int(255), kw = jv_bool(0), endv = jv_undef(NULL), lw = jv_int(5);
    jarg(a, 0, "length", &lv);
    jarg(a, 1, "killwords", &kw);
    jarg(a, 2, "end", &endv);
    if (jarg(a, 3, "leeway", &lw) && lw.t == JV_NONE) lw = jv_int(5);
    int64_t length = 255, leeway = 5;
    if (v.t != JV_STR) { /* jinja2 calls len() on the value itself */
        if (v.t != JV_LIST && v.t != JV_DICT && v.t != JV_UNDEF) return jfail(c, "object of type '%s' has no len()", jv_type_name(v));
        if (v.t == JV_UNDEF) { /* len(Undefined) == 0: returned as is */
            *out = v;
            return 0;
        }
        int64_t len = (int64_t)(v.t == JV_LIST ? v.l->n : v.d->n), ln = 255, lwv = 5;
        if (lv.t == JV_INT) ln = lv.i;
        if (lw.t == JV_INT) lwv = lw.i;
        if (len <= ln + lwv) { /* short enough: returned as is */
            *out = v;
            return 0;
        }
        return jfail(c, "truncate of a long %s is not supported by kiln", jv_type_name(v));
    }
    if (soft_str(c, v, &s) || to_int64(c, lv, "length", &length) || to_int64(c, lw, "leeway", &leeway)) return -1;
    jv end = endv;
    if (end.t == JV_UNDEF) end = jv_str(c, "...", 3);
    else if (soft_str(c, endv, &end)) return -1;
    int64_t endn = (int64_t)jstr_ncp(end.s), n = (int64_t)jstr_ncp(s.s);
    if (length < endn) return jfail(c, "expected length >= %lld, got %lld", (long long)endn, (long long)length);
    if (leeway < 0) return jfail(c, "expected leeway >= 0, got %lld", (long long)leeway);
    if (n <= length + leeway) {
        *out = s;
        return 0;
    }
    /* first length - len(end) code points */
    size_t cut = 0;
    uint32_t cp;
    for (int64_t i = 0; i < length - endn; i++) cut = kn_utf8_next(s.s->s, s.s->len, cut, &cp);
    if (!jv_truthy(kw)) {
        for (size_t k = cut; k-- > 0;)
            if (s.s->s[k] == ' ') {
                cut = k;
                break;
            }
    }
    jbuf b = {0};
    int rc = jbuf_put(c, &b, s.s->s, cut);
    if (!rc) rc = jbuf_put(c, &b, end.s->s, end.s->len);
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

/* jinja2 do_urlencode for strings: percent-encode UTF-8 bytes except
 * letters, digits, "_.-~" and "/" */
static int f_urlencode(jctx *c, jv v, const jargs *a, jv *out) {
    jv s;
    if (v.t == JV_DICT || v.t == JV_LIST) return jfail(c, "urlencode of mappings and sequences is not supported by kiln");
    if (soft_str(c, v, &s)) return -1;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < s.s->len && !rc; i++) {
        unsigned char ch = (unsigned char)s.s->s[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || strchr("_.-~/", ch)) {
            rc = jbuf_put(c, &b, (const char *)&ch, 1);
        } else {
            char h[4];
            snprintf(h, sizeof h, "%%%02X", ch);
            rc = jbuf_put(c, &b, h, 3);
        }
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

/* jinja2 do_groupby(value, attribute, default=None, case_sensitive=False):
 * sorted by the key, consecutive equal keys grouped into (key, [items]) */
static int f_groupby(jctx *c, jv v, const jargs *a, jv *out) {
    jv attr, dflt = jv_undef(NULL), cs = jv_bool(0);
    if (!jarg(a, 0, "attribute", &attr)) return jfail(c, "groupby() needs an attribute");
    int has_default = jarg(a, 1, "default", &dflt);
    jarg(a, 2, "case_sensitive", &cs);
    jlist *l, *r;
    if (seq_items(c, v, &l) || !(r = jlist_new(c, 0))) return -1;
    size_t n = l->n;
    jv *keys = jarena_alloc(&c->arena, (n + 1) * sizeof(jv)), *raw = jarena_alloc(&c->arena, (n + 1) * sizeof(jv));
    size_t *idx = jarena_alloc(&c->arena, (n + 1) * sizeof(size_t)), *tmp = jarena_alloc(&c->arena, (n + 1) * sizeof(size_t));
    if (!keys || !raw || !idx || !tmp) return joom(c);
    for (size_t i = 0; i < n; i++) {
        jv k;
        if (get_attr_or_item(c, l->v[i], attr, &k)) return -1;
        if (k.t == JV_UNDEF && has_default) k = dflt;
        raw[i] = k;
        if (sort_key(c, k, jv_truthy(cs), &keys[i])) return -1;
        idx[i] = i;
    }
    if (msort(c, keys, idx, tmp, n, 0, 0)) return -1;
    for (size_t i = 0; i < n;) {
        jlist *items = jlist_new(c, 0), *pair = jlist_new(c, 2);
        if (!items || !pair) return -1;
        size_t j = i;
        while (j < n && jv_equal(keys[idx[j]], keys[idx[i]])) {
            if (jlist_push(c, items, l->v[idx[j]])) return -1;
            j++;
        }
        pair->v[0] = jv_truthy(cs) ? keys[idx[i]] : raw[idx[i]];
        pair->v[1] = list_val(items, 0);
        pair->n = 2;
        if (jlist_push(c, r, list_val(pair, 1))) return -1;
        i = j;
    }
    *out = list_val(r, 0);
    return 0;
}

/* jinja2 do_batch(value, linecount, fill_with=None): a generator of lists */
static int f_batch(jctx *c, jv v, const jargs *a, jv *out) {
    jv nv, fill = jv_none();
    int has_fill = jarg(a, 1, "fill_with", &fill) && fill.t != JV_NONE;
    int64_t n = 0;
    if (!jarg(a, 0, "linecount", &nv) || to_int64(c, nv, "linecount", &n)) return jfail(c, "batch() needs a line count");
    if (n <= 0) return jfail(c, "batch() line count must be positive");
    jlist *l, *r, *cur = NULL;
    if (seq_items(c, v, &l) || !(r = jlist_new(c, 0))) return -1;
    for (size_t i = 0; i < l->n; i++) {
        if (!cur && !(cur = jlist_new(c, 0))) return -1;
        if (jlist_push(c, cur, l->v[i])) return -1;
        if ((int64_t)cur->n == n) {
            if (jlist_push(c, r, list_val(cur, 0))) return -1;
            cur = NULL;
        }
    }
    if (cur) {
        while (has_fill && (int64_t)cur->n < n)
            if (jlist_push(c, cur, fill)) return -1;
        if (jlist_push(c, r, list_val(cur, 0))) return -1;
    }
    *out = list_val(r, 0);
    r->iter_name = "generator";
    return 0;
}

static int f_unsupported(jctx *c, jv v, const jargs *a, jv *out) { return -2; }

typedef struct {
    const char *name;
    filter_fn fn;
} fdef;

static const fdef filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
    {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
    {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
    {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
    {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
    /* jinja2 built-ins kiln does not implement */
    {"batch", f_batch}, {"filesizeformat", f_unsupported}, {"groupby", f_groupby},
    {"pprint", f_unsupported}, {"random", f_unsupported}, {"slice", f_unsupported}, {"striptags", f_unsupported},
    {"truncate", f_truncate}, {"urlencode", f_urlencode}, {"urlize", f_unsupported},
    {"wordwrap", f_unsupported}, {"xmlattr", f_unsupported},
    {NULL, NULL}};

int kn_jinja_filter_exists(const char *name) {
    for (int i = 0; filters[i].name; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn == f_unsupported ? -1 : 1;
    return 0;
}

int kn_jinja_apply_filter(jctx *c, const char *name, jv v, const jargs *a, jv *out) {
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
    for (int i = 0; filters[i].name; i++)
        if (!strcmp(filters[i].name, name)) {
            int rc = filters[i].fn(c, v, a, out);
            if (rc == -2) return jfail(c, "the '%s' filter is not supported by kiln", name);
            return rc ? -1 : 0;
        }
    return jfail(c, "No filter named '%s'.", name);
}

/* ---- tests ---------------------------------------------------------------- */
static const char *const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "greaterthan", "gt", ">", "in", "integer", "iterable", "le", "<=", "lessthan", "lt", "<",
    "lower", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true",
    "undefined", "upper", NULL};

int kn_jinja_test_exists(const char *name) {
    for (int i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name)) return 1;
    return 0;
}

static int is_number(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }

static int cmp_test(jctx *c, jv v, jv o, const char *op, int *out) {
    if (v.t == JV_UNDEF) return undef_err(c, v);
    if (o.t == JV_UNDEF) return undef_err(c, o);
    if (!((is_number(v) && is_number(o)) || (v.t == JV_STR && o.t == JV_STR) || (v.t == JV_LIST && o.t == JV_LIST)))
        return jfail(c, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(v), jv_type_name(o));
    int cmp;
    if (jv_compare(c, v, o, &cmp)) return -1;
    *out = op[0] == '<' ? (op[1] ? cmp <= 0 : cmp < 0) : (op[1] ? cmp >= 0 : cmp > 0);
    return 0;
}

/* Python `value % m` compared with `want` (ints and floats) */
static int mod_is(jctx *c, jv v, int64_t m, int64_t want, int *out) {
    if (v.t == JV_INT || v.t == JV_BOOL) {
        int64_t x = v.t == JV_INT ? v.i : v.b;
        if (m == -1) { *out = want == 0; return 0; }
        int64_t r = x % m;
        if (r != 0 && ((r < 0) != (m < 0))) r += m;
        *out = r == want;
        return 0;
    }
    if (v.t == JV_FLOAT) {
        double r = fmod(v.f, (double)m);
        if (r != 0 && ((r < 0) != (m < 0))) r += (double)m;
        *out = r == (double)want;
        return 0;
    }
    if (v.t == JV_UNDEF) return undef_err(c, v);
    return jfail(c, "unsupported operand type(s) for %%: '%s' and 'int'", jv_type_name(v));
}

int kn_jinja_apply_test(jctx *c, const char *name, jv v, const jargs *a, int *out) {
    jv o;
    int has = jarg(a, 0, NULL, &o);
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit");
    static const char *const unary[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer",
                                        "float", "number", "string", "mapping", "iterable", "sequence", "callable",
                                        "escaped", "lower", "upper", "even", "odd", "filter", "test", NULL};
    for (int i = 0; unary[i]; i++)
        if (!strcmp(unary[i], name) && a->n_pos + a->n_kw > 0)
            return jfail(c, "test_%s() takes 1 positional argument but %d were given", name, 1 + a->n_pos + a->n_kw);
#define IS(n) (!strcmp(name, n))
    if (IS("defined")) *out = v.t != JV_UNDEF;
    else if (IS("undefined")) *out = v.t == JV_UNDEF;
    else if (IS("none")) *out = v.t == JV_NONE;
    else if (IS("boolean")) *out = v.t == JV_BOOL;
    else if (IS("true")) *out = v.t == JV_BOOL && v.b;
    else if (IS("false")) *out = v.t == JV_BOOL && !v.b;
    else if (IS("integer")) *out = v.t == JV_INT;
    else if (IS("float")) *out = v.t == JV_FLOAT;
    else if (IS("number")) *out = is_number(v);
    else if (IS("string")) *out = v.t == JV_STR;
    else if (IS("mapping")) *out = v.t == JV_DICT;
    else if (IS("iterable")) *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (IS("sequence")) *out = v.t == JV_STR || jv_is_seq(v) || v.t == JV_DICT || v.t == JV_UNDEF; /* len() and __getitem__ exist */
    else if (IS("callable")) *out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_UNDEF; /* Undefined has __call__ */
    else if (IS("escaped")) *out = 0;
    else if (IS("lower") || IS("upper")) { /* str(value).islower() / .isupper() */
        jv sv;
        if (v.t == JV_UNDEF) sv = jv_str(c, "", 0);
        else if (jv_to_str(c, v, &sv)) return -1;
        int cased = 0, lower = 0, upper = 0;
        for (size_t i = 0; i < sv.s->len;) {
            uint32_t cp;
            i = kn_utf8_next(sv.s->s, sv.s->len, i, &cp);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            if (k == UTF8PROC_CATEGORY_LL) lower = cased = 1;
            else if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) upper = cased = 1;
        }
        *out = IS("lower") ? cased && !upper : cased && !lower;
    } else if (IS("even") || IS("odd")) {
        if (mod_is(c, v, 2, IS("odd") ? 1 : 0, out)) return -1;
    } else if (IS("divisibleby")) {
        int64_t m = 1;
        if (!has) return jfail(c, "divisibleby needs an argument");
        if (to_int64(c, o, "divisibleby argument", &m)) return -1;
        if (m == 0) return jfail(c, "integer division or modulo by zero");
        if (mod_is(c, v, m, 0, out)) return -1;
    } else if (IS("eq") || IS("equalto") || IS("==") || IS("ne") || IS("!=") || IS("sameas")) {
        if (!has) return jfail(c, "test '%s' needs an argument", name);
        if (IS("sameas")) {
            /* identity: singletons compare by value; other objects only when they are the same object */
            if (v.t != o.t) *out = 0;
            else if (v.t == JV_NONE || v.t == JV_UNDEF) *out = 1;
            else if (v.t == JV_BOOL) *out = v.b == o.b;
            else if (v.t == JV_INT) *out = v.i == o.i && v.i >= -5 && v.i <= 256;
            else if (v.t == JV_STR) *out = v.s == o.s;
            else if (v.t == JV_LIST) *out = v.l == o.l;
            else if (v.t == JV_DICT || v.t == JV_NS) *out = v.d == o.d;
            else *out = jv_equal(v, o);
        } else {
            *out = jv_equal(v, o);
            if (name[0] == 'n' || name[0] == '!') *out = !*out;
        }
    } else if (IS("lt") || IS("<") || IS("lessthan")) return has ? cmp_test(c, v, o, "<", out) : jfail(c, "test needs an argument");
    else if (IS("le") || IS("<=")) return has ? cmp_test(c, v, o, "<=", out) : jfail(c, "test needs an argument");
    else if (IS("gt") || IS(">") || IS("greaterthan")) return has ? cmp_test(c, v, o, ">", out) : jfail(c, "test needs an argument");
    else if (IS("ge") || IS(">=")) return has ? cmp_test(c, v, o, ">=", out) : jfail(c, "test needs an argument");
    else if (IS("in")) {
        if (!has) return jfail(c, "test 'in' needs an argument");
        *out = 0;
        if (o.t == JV_STR) {
            if (v.t != JV_STR) return jfail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(v));
            *out = v.s->len == 0 || memmem(o.s->s, o.s->len, v.s->s, v.s->len) != NULL;
        } else if (o.t == JV_LIST) {
            for (size_t i = 0; i < o.l->n && !*out; i++) *out = jv_equal(o.l->v[i], v);
        } else if (o.t == JV_DICT || o.t == JV_NS) {
            jv tmp;
            *out = jdict_get(o.d, v, &tmp);
        } else if (o.t != JV_UNDEF) {
            return jfail(c, "argument of type '%s' is not iterable", jv_type_name(o));
        }
    } else if (IS("filter")) *out = v.t == JV_STR && kn_jinja_filter_exists(v.s->s) != 0;
    else if (IS("test")) *out = v.t == JV_STR && kn_jinja_test_exists(v.s->s);
    else return jfail(c, "No test named '%s'.", name);
#undef IS
    return 0;
}

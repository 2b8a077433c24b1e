/* jinja_methods.c — attribute and item lookup the way jinja2's
 * ImmutableSandboxedEnvironment does it, Python methods of str/dict/list
 * values (bound as JV_FUNC values), the `loop` object, and the global
 * functions transformers' environment provides (range, dict, namespace,
 * raise_exception, strftime_now).
 *
 * Sandbox rules kept: attributes starting with '_' are unsafe (undefined);
 * mutating list/dict methods (append, pop, update, ...) raise a security
 * error on access; range() is capped at 100000 items. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer/jinja_internal.h"

enum {
    F_NONE,
    /* globals */
    G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME,
    /* str */
    S_STRIP, S_LSTRIP, S_RSTRIP, S_SPLIT, S_RSPLIT, S_STARTSWITH, S_ENDSWITH, S_UPPER, S_LOWER, S_TITLE,
    S_CAPITALIZE, S_SWAPCASE, S_REPLACE, S_FIND, S_RFIND, S_INDEX, S_RINDEX, S_COUNT, S_FORMAT, S_JOIN, S_ISALPHA,
    S_ISDIGIT, S_ISSPACE, S_ISALNUM, S_ISUPPER, S_ISLOWER, S_ISTITLE, S_ISNUMERIC, S_ISDECIMAL, S_SPLITLINES, S_CENTER,
    S_LJUST, S_RJUST, S_ZFILL, S_PARTITION, S_RPARTITION, S_REMOVEPREFIX, S_REMOVESUFFIX, S_CASEFOLD,
    /* dict */
    D_GET, D_ITEMS, D_KEYS, D_VALUES, D_COPY,
    /* list */
    L_INDEX, L_COUNT, L_COPY,
    /* loop */
    LOOP_CYCLE,
};

typedef struct {
    const char *name;
    int id;
} mdef;

static const mdef str_methods[] = {
    {"strip", S_STRIP}, {"lstrip", S_LSTRIP}, {"rstrip", S_RSTRIP}, {"split", S_SPLIT}, {"rsplit", S_RSPLIT},
    {"startswith", S_STARTSWITH}, {"endswith", S_ENDSWITH}, {"upper", S_UPPER}, {"lower", S_LOWER},
    {"title", S_TITLE}, {"capitalize", S_CAPITALIZE}, {"swapcase", S_SWAPCASE}, {"replace", S_REPLACE},
    {"find", S_FIND}, {"rfind", S_RFIND}, {"index", S_INDEX}, {"rindex", S_RINDEX}, {"count", S_COUNT},
    {"format", S_FORMAT}, {"join", S_JOIN}, {"isalpha", S_ISALPHA}, {"isdigit", S_ISDIGIT},
    {"isspace", S_ISSPACE}, {"isalnum", S_ISALNUM}, {"isupper", S_ISUPPER}, {"islower", S_ISLOWER},
    {"istitle", S_ISTITLE}, {"isnumeric", S_ISNUMERIC}, {"isdecimal", S_ISDECIMAL}, {"splitlines", S_SPLITLINES},
    {"center", S_CENTER}, {"ljust", S_LJUST}, {"rjust", S_RJUST}, {"zfill", S_ZFILL}, {"partition", S_PARTITION},
    {"rpartition", S_RPARTITION}, {"removeprefix", S_REMOVEPREFIX}, {"removesuffix", S_REMOVESUFFIX},
    {"casefold", S_CASEFOLD}, {NULL, 0}};
static const mdef dict_methods[] = {
    {"get", D_GET}, {"items", D_ITEMS}, {"keys", D_KEYS}, {"values", D_VALUES}, {"copy", D_COPY}, {NULL, 0}};
static const mdef list_methods[] = {{"index", L_INDEX}, {"count", L_COUNT}, {"copy", L_COPY}, {NULL, 0}};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", "fromkeys", NULL};
static const char *const list_unsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};
/* other Python attributes of str that exist but kiln does not implement */
static const char *const str_other[] = {"encode", "expandtabs", "format_map", "isascii", "isidentifier",
                                        "isprintable", "maketrans", "translate", NULL};

static int find_method(const mdef *t, const char *name) {
    for (int i = 0; t[i].name; i++)
        if (!strcmp(t[i].name, name)) return t[i].id;
    return 0;
}

static int in_list(const char *const *l, const char *name) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], name)) return 1;
    return 0;
}

static jv bound(jctx *c, int id, const char *name, jv self) {
    jfunc *f = jarena_alloc(&c->arena, sizeof *f);
    if (!f) {
        joom(c);
        return jv_undef(NULL);
    }
    f->id = id;
    f->name = name;
    f->self = self;
    jv v = {.t = JV_FUNC};
    v.fn = f;
    return v;
}

static jv undef_fmt(jctx *c, const char *fmt, const char *a, const char *b) {
    size_t n = strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + 1;
    if (n > 400) n = 400;
    char *h = jarena_alloc(&c->arena, n);
    if (h) snprintf(h, n, fmt, a, b ? b : "");
    return jv_undef(h);
}

static const char *obj_desc(jv v) {
    switch (v.t) {
    case JV_STR: return "str object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    case JV_LIST: return v.l->is_tuple ? "tuple object" : "list object";
    case JV_DICT: return "dict object";
    case JV_NS: return "Namespace object";
    case JV_MACRO: return "Macro object";
    case JV_LOOP: return "LoopContext object";
    default: return "object";
    }
}

int kn_jinja_getattr(jctx *c, jv obj, const char *name, jv *out) {
    if (obj.t == JV_UNDEF) return jfail(c, "%s", obj.undef_hint ? obj.undef_hint : "value is undefined");
    if (name[0] == '_') {
        *out = undef_fmt(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
        return 0;
    }
    int id;
    switch (obj.t) {
    case JV_NONE: *out = undef_fmt(c, "'None' has no attribute '%s'%s", name, NULL); return 0;
    case JV_STR:
        if ((id = find_method(str_methods, name))) {
            *out = bound(c, id, name, obj);
            return c->failed ? -1 : 0;
        }
        if (in_list(str_other, name)) return jfail(c, "str.%s() is not supported by kiln", name);
        break;
    case JV_DICT:
        if ((id = find_method(dict_methods, name))) {
            *out = bound(c, id, name, obj);
            return c->failed ? -1 : 0;
        }
        if (in_list(dict_unsafe, name)) return jfail(c, "access to attribute '%s' of 'dict' object is unsafe.", name);
        if (jdict_get_str(obj.d, name, out)) return 0;
        break;
    case JV_NS:
        if (jdict_get_str(obj.d, name, out)) return 0;
        break;
    case JV_LIST:
        if (obj.l->iter_name) break;
        if ((id = find_method(list_methods, name))) {
            *out = bound(c, id, name, obj);
            return c->failed ? -1 : 0;
        }
        if (in_list(list_unsafe, name))
            return jfail(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
        break;
    case JV_LOOP: {
        const jloop *L = obj.loop;
        int64_t n = (int64_t)L->items->n, i = (int64_t)L->index0;
        if (!strcmp(name, "index")) *out = jv_int(i + 1);
        else if (!strcmp(name, "index0")) *out = jv_int(i);
        else if (!strcmp(name, "revindex")) *out = jv_int(n - i);
        else if (!strcmp(name, "revindex0")) *out = jv_int(n - i - 1);
        else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
        else if (!strcmp(name, "last")) *out = jv_bool(i == n - 1);
        else if (!strcmp(name, "length")) *out = jv_int(n);
        else if (!strcmp(name, "depth")) *out = jv_int(1);
        else if (!strcmp(name, "depth0")) *out = jv_int(0);
        else if (!strcmp(name, "previtem"))
            *out = i > 0 ? L->items->v[i - 1] : jv_undef("there is no previous item");
        else if (!strcmp(name, "nextitem"))
            *out = i + 1 < n ? L->items->v[i + 1] : jv_undef("there is no next item");
        else if (!strcmp(name, "cycle")) {
            *out = bound(c, LOOP_CYCLE, "cycle", obj);
            return c->failed ? -1 : 0;
        } else if (!strcmp(name, "changed")) return jfail(c, "loop.changed() is not supported by kiln");
        else break;
        return 0;
    }
    default: break;
    }
    *out = undef_fmt(c, "'%s' has no attribute '%s'", obj_desc(obj), name);
    return c->failed ? -1 : 0;
}

int kn_jinja_getitem(jctx *c, jv obj, jv key, jv *out) {
    if (obj.t == JV_UNDEF) return jfail(c, "%s", obj.undef_hint ? obj.undef_hint : "value is undefined");
    switch (obj.t) {
    case JV_DICT:
    case JV_NS:
        if (key.t == JV_LIST && !key.l->is_tuple) return jfail(c, "unhashable type: 'list'");
        if (jdict_get(obj.d, key, out)) return 0;
        break;
    case JV_LIST:
    case JV_STR:
        if (obj.t == JV_LIST && obj.l->iter_name) { /* TypeError is swallowed by jinja2's getitem */
            *out = undef_fmt(c, "'%s object' is not subscriptable%s", obj.l->iter_name, NULL);
            return c->failed ? -1 : 0;
        }
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = key.t == JV_INT ? key.i : key.b;
            if (obj.t == JV_LIST) {
                int64_t n = (int64_t)obj.l->n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    *out = obj.l->v[i];
                    return 0;
                }
            } else {
                int64_t n = (int64_t)jstr_ncp(obj.s);
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    size_t b = 0;
                    uint32_t cp;
                    for (int64_t k = 0; k < i && b < obj.s->len; k++) b = kn_utf8_next(obj.s->s, obj.s->len, b, &cp);
                    size_t e = kn_utf8_next(obj.s->s, obj.s->len, b, &cp);
                    *out = jv_str(c, obj.s->s + b, e - b);
                    return c->failed ? -1 : 0;
                }
            }
            char num[32];
            snprintf(num, sizeof num, "%lld", (long long)(key.t == JV_INT ? key.i : key.b));
            *out = undef_fmt(c, "'%s' has no element %s", obj_desc(obj), num);
            return c->failed ? -1 : 0;
        }
        break;
    default: break;
    }
    if (key.t == JV_STR) return kn_jinja_getattr(c, obj, key.s->s, out);
    jv ks;
    if (jv_to_str(c, key, &ks)) return -1;
    *out = undef_fmt(c, "'%s' has no attribute '%s'", obj.t == JV_NONE ? "None" : obj_desc(obj), ks.s->s);
    return c->failed ? -1 : 0;
}

int kn_jinja_attr_path(jctx *c, jv obj, const jstr *path, jv *out) {
    const char *p = path->s, *end = path->s + path->len;
    jv cur = obj;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        size_t n = (size_t)(dot - p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++)
            if (p[i] < '0' || p[i] > '9') digits = 0;
        jv key;
        if (digits && n < 18) key = jv_int(strtoll(p, NULL, 10));
        else key = jv_str(c, p, n);
        if (c->failed) return -1;
        if (cur.t == JV_UNDEF) {
            *out = cur;
            return 0;
        }
        if (kn_jinja_getitem(c, cur, key, &cur)) return -1;
        p = dot + 1;
        if (dot == end) break;
    }
    *out = cur;
    return 0;
}

/* ---- argument helper ------------------------------------------------------ */
int jarg(const jargs *a, int pos, const char *name, jv *out) {
    if (pos >= 0 && pos < a->n_pos) {
        *out = a->pos[pos];
        return 1;
    }
    if (name)
        for (int i = 0; i < a->n_kw; i++)
            if (!strcmp(a->kw_names[i], name)) {
                *out = a->kw[i];
                return 1;
            }
    return 0;
}

static int check_nargs(jctx *c, const char *fname, const jargs *a, int max_pos) {
    if (a->n_pos > max_pos)
        return jfail(c, "%s() takes at most %d positional argument%s (%d given)", fname, max_pos, max_pos == 1 ? "" : "s",
                     a->n_pos);
    return 0;
}

static int want_str(jctx *c, jv v, const char *what) {
    if (v.t != JV_STR) return jfail(c, "%s must be str, not %s", what, jv_type_name(v));
    return 0;
}

static int want_int(jctx *c, jv v, const char *what, int64_t *out) {
    if (v.t == JV_INT) *out = v.i;
    else if (v.t == JV_BOOL) *out = v.b;
    else return jfail(c, "%s must be an integer, not %s", what, jv_type_name(v));
    return 0;
}

/* ---- str helpers ------------------------------------------------------------ */
int kn_jinja_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

static int cp_in(uint32_t cp, const jstr *set) {
    size_t i = 0;
    while (i < set->len) {
        uint32_t x;
        i = kn_utf8_next(set->s, set->len, i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

int kn_jinja_str_strip(jctx *c, jv s, const jv *chars, int left, int right, jv *out) {
    if (chars && chars->t != JV_NONE && chars->t != JV_UNDEF && chars->t != JV_STR)
        return jfail(c, "strip arg must be None or str");
    const jstr *set = chars && chars->t == JV_STR ? chars->s : NULL;
    size_t b = 0, e = s.s->len;
    if (left) {
        while (b < e) {
            uint32_t cp;
            size_t nx = kn_utf8_next(s.s->s, e, b, &cp);
            if (set ? !cp_in(cp, set) : !kn_jinja_is_space(cp)) break;
            b = nx;
        }
    }
    if (right) {
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s.s->s[st] & 0xc0) == 0x80) st--;
            uint32_t cp;
            kn_utf8_next(s.s->s, e, st, &cp);
            if (set ? !cp_in(cp, set) : !kn_jinja_is_space(cp)) break;
            e = st;
        }
    }
    if (b == 0 && e == s.s->len) {
        *out = s;
        return 0;
    }
    *out = jv_str(c, s.s->s + b, e - b);
    return c->failed ? -1 : 0;
}

static int is_cased(uint32_t cp) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

int kn_jinja_str_case(jctx *c, jv s, int mode, jv *out) {
    jbuf b = {0};
    size_t i = 0;
    int prev_cased = 0, at_word = 1;
    while (i < s.s->len) {
        uint32_t cp;
        i = kn_utf8_next(s.s->s, s.s->len, i, &cp);
        uint32_t o = cp;
        switch (mode) {
        case JCASE_LOWER: o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); break;
        case JCASE_UPPER: o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); break;
        case JCASE_CAPITALIZE:
            o = (uint32_t)(at_word ? utf8proc_totitle((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
            at_word = 0;
            break;
        case JCASE_TITLE_PY:
            o = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)cp) : utf8proc_totitle((utf8proc_int32_t)cp));
            prev_cased = is_cased(cp);
            break;
        case JCASE_TITLE_JINJA: {
            /* jinja2: split on runs of [-\s({\[<]; first char of each piece upper, rest lower */
            int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || kn_jinja_is_space(cp);
            if (sep) {
                at_word = 1;
            } else {
                o = (uint32_t)(at_word ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
                at_word = 0;
            }
            break;
        }
        case JCASE_SWAP: {
            utf8proc_int32_t u = utf8proc_toupper((utf8proc_int32_t)cp), l = utf8proc_tolower((utf8proc_int32_t)cp);
            o = (uint32_t)((uint32_t)u != cp ? u : l);
            break;
        }
        }
        char enc[4];
        int n = kn_utf8_put(enc, o);
        if (jbuf_put(c, &b, enc, (size_t)n)) {
            free(b.p);
            return -1;
        }
    }
    *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    c->ops += s.s->len / 16;
    return c->failed ? -1 : 0;
}

int kn_jinja_str_replace(jctx *c, jv s, jv old, jv rep, int64_t count, jv *out) {
    if (want_str(c, old, "replace() argument 1") || want_str(c, rep, "replace() argument 2")) return -1;
    jbuf b = {0};
    const char *p = s.s->s, *end = s.s->s + s.s->len;
    int64_t done = 0;
    int rc = 0;
    if (old.s->len == 0) {
        /* Python inserts rep between every character and at both ends */
        size_t i = 0;
        while (!rc && (count < 0 || done < count)) {
            rc = jbuf_put(c, &b, rep.s->s, rep.s->len);
            done++;
            if (i >= s.s->len) break;
            uint32_t cp;
            size_t nx = kn_utf8_next(s.s->s, s.s->len, i, &cp);
            if (!rc) rc = jbuf_put(c, &b, s.s->s + i, nx - i);
            i = nx;
        }
        if (!rc && i < s.s->len) rc = jbuf_put(c, &b, s.s->s + i, s.s->len - i);
    } else {
        while (!rc) {
            const char *hit = (count < 0 || done < count) ? memmem(p, (size_t)(end - p), old.s->s, old.s->len) : NULL;
            if (!hit) {
                rc = jbuf_put(c, &b, p, (size_t)(end - p));
                break;
            }
            rc = jbuf_put(c, &b, p, (size_t)(hit - p));
            if (!rc) rc = jbuf_put(c, &b, rep.s->s, rep.s->len);
            p = hit + old.s->len;
            done++;
        }
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    c->ops += (uint64_t)done;
    return rc || c->failed ? -1 : 0;
}

static size_t cp_index(const jstr *s, size_t byte_off) {
    size_t n = 0, i = 0;
    uint32_t cp;
    while (i < byte_off && i < s->len) {
        i = kn_utf8_next(s->s, s->len, i, &cp);
        n++;
    }
    return n;
}

static jv mk_list(jctx *c, jlist *l, int tuple) {
    jv v = {.t = JV_LIST};
    if (l) l->is_tuple = tuple;
    v.l = l;
    return v;
}

static int split_impl(jctx *c, jv s, const jargs *a, int from_right, jv *out) {
    jv sep = jv_none(), mx = jv_int(-1);
    jarg(a, 0, "sep", &sep);
    jarg(a, 1, "maxsplit", &mx);
    int64_t maxsplit = -1;
    if (want_int(c, mx, "maxsplit", &maxsplit)) return -1;
    jlist *l = jlist_new(c, 0);
    if (!l) return -1;
    const char *str = s.s->s;
    size_t len = s.s->len;
    if (sep.t == JV_NONE) {
        /* whitespace split; the unsplit remainder keeps its outer whitespace, as in Python */
        int64_t done = 0;
        uint32_t cp;
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                while (i < len) {
                    size_t nx = kn_utf8_next(str, len, i, &cp);
                    if (!kn_jinja_is_space(cp)) break;
                    i = nx;
                }
                if (i >= len) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    if (jlist_push(c, l, jv_str(c, str + i, len - i))) return -1;
                    break;
                }
                size_t st = i;
                while (i < len) {
                    size_t nx = kn_utf8_next(str, len, i, &cp);
                    if (kn_jinja_is_space(cp)) break;
                    i = nx;
                }
                if (jlist_push(c, l, jv_str(c, str + st, i - st))) return -1;
                done++;
            }
        } else {
            jlist *rev = jlist_new(c, 0);
            if (!rev) return -1;
            size_t e = len;
            for (;;) {
                while (e > 0) {
                    size_t st = e - 1;
                    while (st > 0 && ((unsigned char)str[st] & 0xc0) == 0x80) st--;
                    kn_utf8_next(str, len, st, &cp);
                    if (!kn_jinja_is_space(cp)) break;
                    e = st;
                }
                if (e == 0) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    if (jlist_push(c, rev, jv_str(c, str, e))) return -1;
                    break;
                }
                size_t j = e;
                while (j > 0) {
                    size_t st = j - 1;
                    while (st > 0 && ((unsigned char)str[st] & 0xc0) == 0x80) st--;
                    kn_utf8_next(str, len, st, &cp);
                    if (kn_jinja_is_space(cp)) break;
                    j = st;
                }
                if (jlist_push(c, rev, jv_str(c, str + j, e - j))) return -1;
                done++;
                e = j;
            }
            for (size_t k = rev->n; k-- > 0;)
                if (jlist_push(c, l, rev->v[k])) return -1;
        }
        c->ops += l->n;
        *out = mk_list(c, l, 0);
        return c->failed ? -1 : 0;
    }
    if (want_str(c, sep, "sep")) return -1;
    if (sep.s->len == 0) return jfail(c, "empty separator");
    size_t sl = sep.s->len;
    if (!from_right) {
        const char *p = str, *end = str + len;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p, (size_t)(end - p), sep.s->s, sl) : NULL;
            if (!hit) {
                if (jlist_push(c, l, jv_str(c, p, (size_t)(end - p)))) return -1;
                break;
            }
            if (jlist_push(c, l, jv_str(c, p, (size_t)(hit - p)))) return -1;
            p = hit + sl;
            done++;
        }
    } else {
        /* scan from the right */
        size_t e = len;
        int64_t done = 0;
        jlist *rev = jlist_new(c, 0);
        if (!rev) return -1;
        for (;;) {
            size_t hit = (size_t)-1;
            if ((maxsplit < 0 || done < maxsplit) && e >= sl)
                for (size_t k = e - sl + 1; k-- > 0;)
                    if (!memcmp(str + k, sep.s->s, sl)) {
                        hit = k;
                        break;
                    }
            if (hit == (size_t)-1) {
                if (jlist_push(c, rev, jv_str(c, str, e))) return -1;
                break;
            }
            if (jlist_push(c, rev, jv_str(c, str + hit + sl, e - hit - sl))) return -1;
            e = hit;
            done++;
        }
        for (size_t k = rev->n; k-- > 0;)
            if (jlist_push(c, l, rev->v[k])) return -1;
    }
    c->ops += l->n;
    *out = mk_list(c, l, 0);
    return c->failed ? -1 : 0;
}

static int affix_match(jctx *c, jv s, jv arg, int end, int *res) {
    *res = 0;
    if (arg.t == JV_LIST && arg.l->is_tuple) {
        for (size_t i = 0; i < arg.l->n; i++) {
            int r;
            if (arg.l->v[i].t != JV_STR) return jfail(c, "tuple for startswith/endswith must only contain str");
            if (affix_match(c, s, arg.l->v[i], end, &r)) return -1;
            if (r) {
                *res = 1;
                return 0;
            }
        }
        return 0;
    }
    if (arg.t != JV_STR)
        return jfail(c, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                     jv_type_name(arg));
    size_t n = arg.s->len;
    if (n > s.s->len) return 0;
    *res = !memcmp(end ? s.s->s + s.s->len - n : s.s->s, arg.s->s, n);
    return 0;
}

static int str_pred(jv s, int id) {
    size_t i = 0;
    int any = 0, cased = 0, upper = 0, lower = 0, title_ok = 1, prev_cased = 0;
    if (s.s->len == 0) return 0;
    while (i < s.s->len) {
        uint32_t cp;
        i = kn_utf8_next(s.s->s, s.s->len, i, &cp);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int numeric = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (id) {
        case S_ISALPHA: if (!alpha) return 0; break;
        case S_ISDIGIT: case S_ISDECIMAL: if (!digit) return 0; break;
        case S_ISNUMERIC: if (!numeric) return 0; break;
        case S_ISALNUM: if (!alpha && !numeric) return 0; break;
        case S_ISSPACE: if (!kn_jinja_is_space(cp)) return 0; break;
        default: break;
        }
        if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
            upper = 1;
            cased = 1;
            if (prev_cased) title_ok = 0;
            else any = 1;
            prev_cased = 1;
        } else if (k == UTF8PROC_CATEGORY_LL) {
            lower = 1;
            cased = 1;
            if (!prev_cased) title_ok = 0;
            prev_cased = 1;
        } else {
            prev_cased = 0;
        }
    }
    if (id == S_ISUPPER) return cased && !lower;
    if (id == S_ISLOWER) return cased && !upper;
    if (id == S_ISTITLE) return title_ok && any;
    return 1;
}

static int pad_str(jctx *c, jv s, int64_t width, jv fillv, int mode, jv *out) {
    /* mode 0 center, 1 ljust, 2 rjust */
    const char *fill = " ";
    size_t fl = 1;
    if (fillv.t != JV_UNDEF) {
        if (fillv.t != JV_STR || jstr_ncp(fillv.s) != 1) return jfail(c, "The fill character must be exactly one character long");
        fill = fillv.s->s;
        fl = fillv.s->len;
    }
    int64_t n = (int64_t)jstr_ncp(s.s);
    if (width <= n) {
        *out = s;
        return 0;
    }
    if ((uint64_t)width > c->lim->max_output) return jfail(c, "padding exceeds the output limit");
    int64_t total = width - n, left = mode == 1 ? 0 : mode == 2 ? total : total / 2 + (total & width & 1);
    int64_t right = total - left;
    jbuf b = {0};
    int rc = 0;
    for (int64_t i = 0; i < left && !rc; i++) rc = jbuf_put(c, &b, fill, fl);
    if (!rc) rc = jbuf_put(c, &b, s.s->s, s.s->len);
    for (int64_t i = 0; i < right && !rc; i++) rc = jbuf_put(c, &b, fill, fl);
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int digits_only(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return n > 0;
}

static int str_format(jctx *c, jv fmt, const jargs *a, jv *out) {
    jbuf b = {0};
    const char *p = fmt.s->s, *end = p + fmt.s->len;
    int auto_idx = 0, rc = 0;
    while (p < end && !rc) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { rc = jbuf_put(c, &b, "{", 1); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { rc = jbuf_put(c, &b, "}", 1); p += 2; continue; }
        if (*p == '}') { rc = jfail(c, "Single '}' encountered in format string"); break; }
        if (*p != '{') { rc = jbuf_put(c, &b, p, 1); p++; continue; }
        const char *close = memchr(p, '}', (size_t)(end - p));
        if (!close) { rc = jfail(c, "Single '{' encountered in format string"); break; }
        const char *f = p + 1;
        size_t fl = (size_t)(close - f);
        const char *colon = memchr(f, ':', fl), *bang = memchr(f, '!', fl);
        size_t namel = colon ? (size_t)(colon - f) : fl;
        if (bang && (size_t)(bang - f) < namel) namel = (size_t)(bang - f);
        if (colon && (size_t)(close - colon) > 1) { rc = jfail(c, "format specs in str.format() are not supported by kiln"); break; }
        jv v;
        if (namel == 0) {
            if (auto_idx >= a->n_pos) { rc = jfail(c, "Replacement index %d out of range for positional args tuple", auto_idx); break; }
            v = a->pos[auto_idx++];
        } else if (digits_only(f, namel)) { /* a positional index, however many digits (no int overflow) */
            int64_t idx = 0;
            for (size_t i = 0; i < namel && idx <= a->n_pos; i++) idx = idx * 10 + (f[i] - '0');
            if (idx >= a->n_pos) { rc = jfail(c, "Replacement index %.*s out of range for positional args tuple", (int)namel, f); break; }
            v = a->pos[idx];
        } else { /* a keyword name (Python: any name that is not all digits) */
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(namel < 127 ? namel : 127), f);
            if (!jarg(a, -1, name, &v)) { rc = jfail(c, "KeyError: '%s'", name); break; }
        }
        if (bang && bang[1] == 'r') rc = jv_write_repr(c, &b, v, 0);
        else rc = jv_write_str(c, &b, v);
        p = close + 1;
    }
    if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return rc || c->failed ? -1 : 0;
}

static int str_method(jctx *c, int id, const char *name, jv s, const jargs *a, jv *out) {
    jv x, y;
    int64_t n = 0;
    int r;
    switch (id) {
    case S_STRIP: case S_LSTRIP: case S_RSTRIP: {
        jv chars = jv_none();
        if (check_nargs(c, name, a, 1)) return -1;
        jarg(a, 0, NULL, &chars);
        return kn_jinja_str_strip(c, s, &chars, id != S_RSTRIP, id != S_LSTRIP, out);
    }
    case S_SPLIT: return split_impl(c, s, a, 0, out);
    case S_RSPLIT: return split_impl(c, s, a, 1, out);
    case S_STARTSWITH: case S_ENDSWITH:
        if (!jarg(a, 0, NULL, &x)) return jfail(c, "%s() takes at least 1 argument", name);
        if (a->n_pos > 1) return jfail(c, "%s() start/end arguments are not supported by kiln", name);
        if (affix_match(c, s, x, id == S_ENDSWITH, &r)) return -1;
        *out = jv_bool(r);
        return 0;
    case S_UPPER: return kn_jinja_str_case(c, s, JCASE_UPPER, out);
    case S_LOWER: case S_CASEFOLD: return kn_jinja_str_case(c, s, JCASE_LOWER, out);
    case S_TITLE: return kn_jinja_str_case(c, s, JCASE_TITLE_PY, out);
    case S_CAPITALIZE: return kn_jinja_str_case(c, s, JCASE_CAPITALIZE, out);
    case S_SWAPCASE: return kn_jinja_str_case(c, s, JCASE_SWAP, out);
    case S_REPLACE: {
        jv cnt = jv_int(-1);
        if (!jarg(a, 0, NULL, &x) || !jarg(a, 1, NULL, &y)) return jfail(c, "replace() takes at least 2 arguments");
        jarg(a, 2, "count", &cnt);
        if (want_int(c, cnt, "count", &n)) return -1;
        return kn_jinja_str_replace(c, s, x, y, n, out);
    }
    case S_FIND: case S_RFIND: case S_INDEX: case S_RINDEX: case S_COUNT: {
        if (!jarg(a, 0, NULL, &x) || want_str(c, x, "argument")) return x.t == JV_STR ? -1 : jfail(c, "%s() takes a str argument", name);
        if (a->n_pos > 1) return jfail(c, "%s() start/end arguments are not supported by kiln", name);
        if (id == S_COUNT) {
            int64_t cnt = 0;
            if (x.s->len == 0) cnt = (int64_t)jstr_ncp(s.s) + 1;
            else
                for (const char *p = s.s->s; (p = memmem(p, (size_t)(s.s->s + s.s->len - p), x.s->s, x.s->len)); p += x.s->len) cnt++;
            *out = jv_int(cnt);
            return 0;
        }
        const char *hit = NULL;
        if (id == S_FIND || id == S_INDEX) {
            hit = memmem(s.s->s, s.s->len, x.s->s, x.s->len);
        } else if (x.s->len <= s.s->len) {
            for (size_t k = s.s->len - x.s->len + 1; k-- > 0;)
                if (!memcmp(s.s->s + k, x.s->s, x.s->len)) {
                    hit = s.s->s + k;
                    break;
                }
        }
        if (!hit) {
            if (id == S_INDEX || id == S_RINDEX) return jfail(c, "substring not found");
            *out = jv_int(-1);
            return 0;
        }
        *out = jv_int((int64_t)cp_index(s.s, (size_t)(hit - s.s->s)));
        return 0;
    }
    case S_FORMAT: return str_format(c, s, a, out);
    case S_JOIN: {
        jlist *items;
        if (!jarg(a, 0, NULL, &x)) return jfail(c, "join() takes exactly one argument");
        if (jv_iter_list(c, x, &items)) return -1;
        jbuf b = {0};
        int rc = 0;
        for (size_t i = 0; i < items->n && !rc; i++) {
            if (items->v[i].t != JV_STR) {
                rc = jfail(c, "sequence item %zu: expected str instance, %s found", i, jv_type_name(items->v[i]));
                break;
            }
            if (i) rc = jbuf_put(c, &b, s.s->s, s.s->len);
            if (!rc) rc = jbuf_put(c, &b, items->v[i].s->s, items->v[i].s->len);
        }
        if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return rc || c->failed ? -1 : 0;
    }
    case S_ISALPHA: case S_ISDIGIT: case S_ISSPACE: case S_ISALNUM: case S_ISUPPER: case S_ISLOWER: case S_ISTITLE:
    case S_ISNUMERIC: case S_ISDECIMAL:
        *out = jv_bool(str_pred(s, id));
        return 0;
    case S_SPLITLINES: {
        jv keep = jv_bool(0);
        jarg(a, 0, "keepends", &keep);
        jlist *l = jlist_new(c, 0);
        if (!l) return -1;
        size_t i = 0, st = 0;
        while (i < s.s->len) {
            uint32_t cp;
            size_t nx = kn_utf8_next(s.s->s, s.s->len, i, &cp);
            int br = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
                     cp == 0x2028 || cp == 0x2029;
            if (br) {
                if (cp == '\r' && nx < s.s->len && s.s->s[nx] == '\n') nx++;
                if (jlist_push(c, l, jv_str(c, s.s->s + st, (jv_truthy(keep) ? nx : i) - st))) return -1;
                st = nx;
            }
            i = nx;
        }
        if (st < s.s->len && jlist_push(c, l, jv_str(c, s.s->s + st, s.s->len - st))) return -1;
        *out = mk_list(c, l, 0);
        return c->failed ? -1 : 0;
    }
    case S_CENTER: case S_LJUST: case S_RJUST: {
        jv fill = jv_undef(NULL);
        if (!jarg(a, 0, NULL, &x) || want_int(c, x, "width", &n)) return jfail(c, "%s() needs an integer width", name);
        jarg(a, 1, NULL, &fill);
        return pad_str(c, s, n, fill, id == S_CENTER ? 0 : id == S_LJUST ? 1 : 2, out);
    }
    case S_ZFILL: {
        if (!jarg(a, 0, NULL, &x) || want_int(c, x, "width", &n)) return jfail(c, "zfill() needs an integer width");
        int64_t len = (int64_t)jstr_ncp(s.s);
        if (n <= len) { *out = s; return 0; }
        if ((uint64_t)n > c->lim->max_output) return jfail(c, "padding exceeds the output limit");
        jbuf b = {0};
        int rc = 0;
        size_t off = 0;
        if (s.s->len && (s.s->s[0] == '+' || s.s->s[0] == '-')) { rc = jbuf_put(c, &b, s.s->s, 1); off = 1; }
        for (int64_t i = 0; i < n - len && !rc; i++) rc = jbuf_put(c, &b, "0", 1);
        if (!rc) rc = jbuf_put(c, &b, s.s->s + off, s.s->len - off);
        if (!rc) *out = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return rc || c->failed ? -1 : 0;
    }
    case S_PARTITION: case S_RPARTITION: {
        if (!jarg(a, 0, NULL, &x) || want_str(c, x, "sep")) return -1;
        if (x.s->len == 0) return jfail(c, "empty separator");
        const char *hit = NULL;
        if (id == S_PARTITION) hit = memmem(s.s->s, s.s->len, x.s->s, x.s->len);
        else if (x.s->len <= s.s->len)
            for (size_t k = s.s->len - x.s->len + 1; k-- > 0;)
                if (!memcmp(s.s->s + k, x.s->s, x.s->len)) { hit = s.s->s + k; break; }
        jlist *l = jlist_new(c, 3);
        if (!l) return -1;
        jv empty = jv_str(c, "", 0);
        if (!hit) {
            l->v[0] = id == S_PARTITION ? s : empty;
            l->v[1] = empty;
            l->v[2] = id == S_PARTITION ? empty : s;
        } else {
            size_t off = (size_t)(hit - s.s->s);
            l->v[0] = jv_str(c, s.s->s, off);
            l->v[1] = x;
            l->v[2] = jv_str(c, hit + x.s->len, s.s->len - off - x.s->len);
        }
        l->n = 3;
        *out = mk_list(c, l, 1);
        return c->failed ? -1 : 0;
    }
    case S_REMOVEPREFIX: case S_REMOVESUFFIX:
        if (!jarg(a, 0, NULL, &x) || want_str(c, x, "argument")) return -1;
        if (affix_match(c, s, x, id == S_REMOVESUFFIX, &r)) return -1;
        if (!r || x.s->len == 0) { *out = s; return 0; }
        *out = id == S_REMOVEPREFIX ? jv_str(c, s.s->s + x.s->len, s.s->len - x.s->len) : jv_str(c, s.s->s, s.s->len - x.s->len);
        return c->failed ? -1 : 0;
    }
    return jfail(c, "str.%s() is not supported by kiln", name);
}

static int range_fn(jctx *c, const jargs *a, jv *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw) return jfail(c, "range expected 1 to 3 integer arguments");
    for (int i = 0; i < a->n_pos; i++)
        if (want_int(c, a->pos[i], "range() argument", &v[i])) return -1;
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) stop = v[0];
    else { start = v[0]; stop = v[1]; if (a->n_pos == 3) step = v[2]; }
    if (step == 0) return jfail(c, "range() arg 3 must not be zero");
    double cnt = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
    if (cnt > 100000)
        return jfail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    jlist *l = jlist_new(c, cnt > 0 ? (size_t)cnt + 1 : 0);
    if (!l) return -1;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) l->v[l->n++] = jv_int(i);
    c->ops += l->n;
    *out = mk_list(c, l, 0);
    return 0;
}

static int dict_like(jctx *c, const jargs *a, int ns, jv *out) {
    jdict *d = jdict_new(c, 0);
    if (!d) return -1;
    for (int i = 0; i < a->n_pos; i++) {
        jv p = a->pos[i];
        if (p.t == JV_DICT || p.t == JV_NS) {
            for (size_t k = 0; k < p.d->n; k++)
                if (jdict_set(c, d, p.d->k[k], p.d->v[k])) return -1;
        } else if (p.t == JV_LIST) {
            for (size_t k = 0; k < p.l->n; k++) {
                jv pair = p.l->v[k];
                if (pair.t != JV_LIST || pair.l->n != 2) return jfail(c, "dictionary update sequence element has wrong length");
                if (jdict_set(c, d, pair.l->v[0], pair.l->v[1])) return -1;
            }
        } else {
            return jfail(c, "'%s' object is not iterable", jv_type_name(p));
        }
    }
    for (int i = 0; i < a->n_kw; i++) {
        jv k = jv_cstr(c, a->kw_names[i]);
        if (c->failed || jdict_set(c, d, k, a->kw[i])) return -1;
    }
    out->t = ns ? JV_NS : JV_DICT;
    out->d = d;
    return 0;
}

int kn_jinja_call_func(jctx *c, const jfunc *fn, const jargs *a, jv *out) {
    jv x, y, s = fn->self;
    switch (fn->id) {
    case G_RANGE: return range_fn(c, a, out);
    case G_DICT: return dict_like(c, a, 0, out);
    case G_NAMESPACE: return dict_like(c, a, 1, out);
    case G_RAISE: {
        jv msg = jv_none();
        jarg(a, 0, "message", &msg);
        jv ms;
        if (jv_to_str(c, msg, &ms)) return -1;
        jfail(c, "%s", ms.s->s);
        c->raised = 1;
        return -1;
    }
    case G_STRFTIME: {
        if (!jarg(a, 0, "format", &x) || want_str(c, x, "strftime_now() format")) return -1;
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[512];
        size_t n = x.s->len ? strftime(buf, sizeof buf, x.s->s, &tmv) : 0;
        *out = jv_str(c, buf, n);
        return c->failed ? -1 : 0;
    }
    case D_GET:
        if (!jarg(a, 0, NULL, &x)) return jfail(c, "get expected at least 1 argument, got 0");
        if (!jdict_get(s.d, x, out)) {
            y = jv_none();
            jarg(a, 1, NULL, &y);
            *out = y;
        }
        return 0;
    case D_ITEMS: case D_KEYS: case D_VALUES: case D_COPY: {
        if (fn->id == D_COPY) {
            jargs one = {.pos = &s, .n_pos = 1};
            return dict_like(c, &one, 0, out);
        }
        jlist *l = jlist_new(c, s.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < s.d->n; i++) {
            if (fn->id == D_KEYS) l->v[i] = s.d->k[i];
            else if (fn->id == D_VALUES) l->v[i] = s.d->v[i];
            else {
                jlist *p = jlist_new(c, 2);
                if (!p) return -1;
                p->v[0] = s.d->k[i];
                p->v[1] = s.d->v[i];
                p->n = 2;
                l->v[i] = mk_list(c, p, 1);
            }
        }
        l->n = s.d->n;
        c->ops += l->n;
        *out = mk_list(c, l, 0);
        l->iter_name = fn->id == D_KEYS ? "dict_keys" : fn->id == D_VALUES ? "dict_values" : "dict_items";
        return 0;
    }
    case L_INDEX: case L_COUNT: {
        if (!jarg(a, 0, NULL, &x)) return jfail(c, "%s() takes exactly one argument", fn->name);
        int64_t cnt = 0;
        for (size_t i = 0; i < s.l->n; i++)
            if (jv_equal(s.l->v[i], x)) {
                if (fn->id == L_INDEX) { *out = jv_int((int64_t)i); return 0; }
                cnt++;
            }
        c->ops += s.l->n;
        if (fn->id == L_INDEX) return jfail(c, "value is not in list");
        *out = jv_int(cnt);
        return 0;
    }
    case L_COPY: {
        jlist *l = jlist_new(c, s.l->n);
        if (!l) return -1;
        if (s.l->n) memcpy(l->v, s.l->v, s.l->n * sizeof(jv));
        l->n = s.l->n;
        *out = mk_list(c, l, s.l->is_tuple);
        return 0;
    }
    case LOOP_CYCLE:
        if (a->n_pos == 0) return jfail(c, "no items for cycling given");
        *out = a->pos[s.loop->index0 % (size_t)a->n_pos];
        return 0;
    default:
        if (s.t == JV_STR) return str_method(c, fn->id, fn->name, s, a, out);
        return jfail(c, "%s() cannot be called", fn->name);
    }
}

jv kn_jinja_global(jctx *c, const char *name) {
    static const mdef globals[] = {{"range", G_RANGE}, {"dict", G_DICT}, {"namespace", G_NAMESPACE},
                                   {"raise_exception", G_RAISE}, {"strftime_now", G_STRFTIME}, {NULL, 0}};
    int id = find_method(globals, name);
    if (!id) return jv_undef(NULL);
    for (int i = 0; globals[i].name; i++)
        if (globals[i].id == id) return bound(c, id, globals[i].name, jv_none());
    return jv_undef(NULL);
}

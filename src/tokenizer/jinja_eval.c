/* jinja_eval.c — executes a parsed template: scopes, statements, operators.
 *
 * Scoping follows jinja2: a for-loop iteration, a macro call and a `with`
 * block each get a fresh child scope, so `set` inside them does not leak out
 * (hence namespace()); `if` does not create a scope. Macros close over the
 * scope they were defined in. Every evaluated node counts toward max_ops,
 * every loop iteration toward max_loop, and nesting toward max_depth.
 * Returns of exec_*: 0 ok, -1 error (ctx->err set), 1 break, 2 continue. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

struct jscope {
    jscope *parent;
    jdict *vars;
};


static int eval(jctx *c, jscope *s, const jnode *n, jv *out);
static int exec(jctx *c, jscope *s, const jnode *n);

static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = jarena_alloc(&c->arena, sizeof *s);
    if (!s || !(s->vars = jdict_new(c, 0))) {
        joom(c);
        return NULL;
    }
    s->parent = parent;
    return s;
}

static int scope_set(jctx *c, jscope *s, const char *name, jv v) {
    jv k = {.t = JV_STR};
    jv ks = jv_cstr(c, name);
    if (c->failed) return -1;
    k.s = ks.s;
    return jdict_set(c, s->vars, k, v);
}

static int lookup(jctx *c, jscope *s, const char *name, jv *out) {
    for (; s; s = s->parent)
        if (jdict_get_str(s->vars, name, out)) return 0;
    *out = kn_jinja_global(c, name);
    if (c->failed) return -1;
    if (out->t == JV_UNDEF) {
        char *h = jarena_alloc(&c->arena, strlen(name) + 32);
        if (h) sprintf(h, "'%s' is undefined", name);
        out->undef_hint = h;
    }
    return 0;
}

static int undef_error(jctx *c, jv v) {
    return jfail(c, "%s", v.undef_hint ? v.undef_hint : "value is undefined");
}

static int tick(jctx *c, const jnode *n) {
    c->line = n->line;
    if (++c->ops > c->lim->max_ops) return jfail(c, "rendering exceeded the operation limit (%llu)", (unsigned long long)c->lim->max_ops);
    return 0;
}

/* ---- output capture ---------------------------------------------------- */
static int capture(jctx *c, jscope *s, const jnode *body, jv *out) {
    jbuf *saved = c->out;
    jbuf b = {0};
    c->out = &b;
    int rc = exec(c, s, body);
    c->out = saved;
    if (rc < 0) {
        free(b.p);
        return -1;
    }
    *out = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return c->failed ? -1 : 0;
}

/* ---- arithmetic -------------------------------------------------------- */
static int is_intlike(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t ival(jv v) { return v.t == JV_INT ? v.i : v.b; }
static int is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double fval(jv v) { return v.t == JV_FLOAT ? v.f : (double)ival(v); }

static const char *op_sym(int op) {
    static const char *const s[] = {"+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    return s[op];
}

static int unsupported(jctx *c, int op, jv a, jv b) {
    return jfail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type_name(a), jv_type_name(b));
}

static int repeat(jctx *c, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        if (seq.s->len && (uint64_t)times > c->lim->max_output / seq.s->len)
            return jfail(c, "string repetition exceeds the output limit");
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (jbuf_put(c, &b, seq.s->s, seq.s->len)) {
                free(b.p);
                return -1;
            }
        *out = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        c->ops += (uint64_t)times;
        return c->failed ? -1 : 0;
    }
    if (seq.l->n && (uint64_t)times > c->lim->max_output / seq.l->n) return jfail(c, "list repetition too large");
    jlist *l = jlist_new(c, seq.l->n * (size_t)times);
    if (!l) return -1;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++) l->v[l->n++] = seq.l->v[k];
    l->is_tuple = seq.l->is_tuple;
    c->ops += l->n;
    out->t = JV_LIST;
    out->l = l;
    return 0;
}

static int binop(jctx *c, int op, jv a, jv b, jv *out) {
    if (op == OP_CONCAT) {
        jbuf buf = {0};
        int rc = 0;
        if (a.t != JV_UNDEF) rc = jv_write_str(c, &buf, a);
        if (!rc && b.t != JV_UNDEF) rc = jv_write_str(c, &buf, b);
        if (!rc) *out = jv_str(c, buf.p ? buf.p : "", buf.n);
        free(buf.p);
        return rc || c->failed ? -1 : 0;
    }
    if (a.t == JV_UNDEF) return undef_error(c, a);
    if (op == OP_MOD && a.t == JV_STR && b.t == JV_UNDEF) /* Undefined has __getitem__: a mapping to Python's % */
        return kn_jinja_printf(c, a, &b, 1, 1, out);
    if (b.t == JV_UNDEF) return undef_error(c, b);
    switch (op) {
    case OP_ADD:
        if (is_intlike(a) && is_intlike(b)) {
            int64_t r;
            if (__builtin_add_overflow(ival(a), ival(b), &r)) return jfail(c, "integer overflow");
            *out = jv_int(r);
            return 0;
        }
        if (is_num(a) && is_num(b)) {
            *out = jv_float(fval(a) + fval(b));
            return 0;
        }
        if (a.t == JV_STR && b.t == JV_STR) {
            /* Markup + str escapes the plain side (markupsafe) */
            if (a.markup != b.markup && (kn_jinja_html_escape(c, a, &a) || kn_jinja_html_escape(c, b, &b))) return -1;
            if (a.s->len + b.s->len > c->lim->max_output) return jfail(c, "string exceeds the output limit");
            jstr *s = jarena_alloc(&c->arena, sizeof(jstr) + a.s->len + b.s->len + 1);
            if (!s) return joom(c);
            memcpy(s->s, a.s->s, a.s->len);
            memcpy(s->s + a.s->len, b.s->s, b.s->len);
            s->len = a.s->len + b.s->len;
            s->s[s->len] = 0;
            out->t = JV_STR;
            out->markup = a.markup;
            out->s = s;
            return 0;
        }
        if (a.t == JV_LIST && b.t == JV_LIST && a.l->is_tuple == b.l->is_tuple && !a.l->iter_name && !b.l->iter_name) {
            jlist *l = jlist_new(c, a.l->n + b.l->n);
            if (!l) return -1;
            if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
            if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
            l->n = a.l->n + b.l->n;
            l->is_tuple = a.l->is_tuple;
            out->t = JV_LIST;
            out->l = l;
            return 0;
        }
        if (a.t == JV_STR) return jfail(c, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
        if (a.t == JV_LIST)
            return jfail(c, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b), jv_type_name(a));
        return unsupported(c, op, a, b);
    case OP_SUB:
    case OP_MUL:
        if (is_intlike(a) && is_intlike(b)) {
            int64_t r;
            if (op == OP_SUB ? __builtin_sub_overflow(ival(a), ival(b), &r) : __builtin_mul_overflow(ival(a), ival(b), &r))
                return jfail(c, "integer overflow");
            *out = jv_int(r);
            return 0;
        }
        if (is_num(a) && is_num(b)) {
            *out = jv_float(op == OP_SUB ? fval(a) - fval(b) : fval(a) * fval(b));
            return 0;
        }
        if (op == OP_MUL && (a.t == JV_STR || jv_is_seq(a)) && is_intlike(b)) return repeat(c, a, ival(b), out);
        if (op == OP_MUL && (b.t == JV_STR || jv_is_seq(b)) && is_intlike(a)) return repeat(c, b, ival(a), out);
        return unsupported(c, op, a, b);
    case OP_DIV:
        if (!is_num(a) || !is_num(b)) return unsupported(c, op, a, b);
        if (fval(b) == 0) return jfail(c, "division by zero");
        *out = jv_float(fval(a) / fval(b));
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (!is_num(a) || !is_num(b)) {
            if (op == OP_MOD && a.t == JV_STR) {
                if (jv_is_seq(b) && b.l->is_tuple) return kn_jinja_printf(c, a, b.l->v, (int)b.l->n, 0, out);
                /* Python treats other subscriptable arguments (list, dict) as a mapping that may go unused */
                return kn_jinja_printf(c, a, &b, 1, jv_is_seq(b) || b.t == JV_DICT, out);
            }
            return unsupported(c, op, a, b);
        }
        if (is_intlike(a) && is_intlike(b)) {
            int64_t x = ival(a), y = ival(b);
            if (y == 0) return jfail(c, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) return jfail(c, "integer overflow");
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                q -= 1;
                r += y;
            }
            *out = jv_int(op == OP_MOD ? r : q);
            return 0;
        }
        {
            double x = fval(a), y = fval(b);
            if (y == 0) return jfail(c, op == OP_MOD ? "float modulo" : "float floor division by zero");
            double r = fmod(x, y);
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
            if (op == OP_MOD) {
                *out = jv_float(r == 0 ? copysign(0.0, y) : r);
            } else {
                double q = (x - r) / y;
                double fq = floor(q);
                if (q - fq > 0.5) fq += 1;
                *out = jv_float(fq);
            }
            return 0;
        }
    case OP_POW:
        if (!is_num(a) || !is_num(b)) return unsupported(c, op, a, b);
        if (is_intlike(a) && is_intlike(b) && ival(b) >= 0) {
            int64_t base = ival(a), e = ival(b), r = 1;
            while (e > 0) {
                if (e & 1)
                    if (__builtin_mul_overflow(r, base, &r)) return jfail(c, "integer overflow");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) return jfail(c, "integer overflow");
            }
            *out = jv_int(r);
            return 0;
        }
        if (fval(a) == 0 && fval(b) < 0) return jfail(c, "0.0 cannot be raised to a negative power");
        *out = jv_float(pow(fval(a), fval(b)));
        return 0;
    }
    return jfail(c, "bad operator");
}

static int contains(jctx *c, jv hay, jv needle, int *res) {
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR)
            return jfail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        *res = needle.s->len == 0 || memmem(hay.s->s, hay.s->len, needle.s->s, needle.s->len) != NULL;
        return 0;
    case JV_LIST:
        *res = 0;
        for (size_t i = 0; i < hay.l->n; i++)
            if (jv_equal(hay.l->v[i], needle)) {
                *res = 1;
                break;
            }
        c->ops += hay.l->n;
        return 0;
    case JV_DICT:
    case JV_NS: {
        jv tmp;
        if ((needle.t == JV_LIST && !needle.l->is_tuple) || needle.t == JV_DICT)
            return jfail(c, "unhashable type: '%s'", jv_type_name(needle));
        *res = jdict_get(hay.d, needle, &tmp);
        c->ops += hay.d->n;
        return 0;
    }
    case JV_UNDEF: *res = 0; return 0;
    default: return jfail(c, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare_op(jctx *c, int op, jv a, jv b, int *res) {
    switch (op) {
    case OP_EQ: *res = jv_equal(a, b); return 0;
    case OP_NE: *res = !jv_equal(a, b); return 0;
    case OP_IN:
    case OP_NOTIN:
        if (contains(c, b, a, res)) return -1;
        if (op == OP_NOTIN) *res = !*res;
        return 0;
    default: {
        if (a.t == JV_UNDEF) return undef_error(c, a);
        if (b.t == JV_UNDEF) return undef_error(c, b);
        int cmp;
        if (!((is_num(a) && is_num(b)) || (a.t == JV_STR && b.t == JV_STR) || (a.t == JV_LIST && b.t == JV_LIST)))
            return jfail(c, "'%s' not supported between instances of '%s' and '%s'", op_sym(op), jv_type_name(a),
                         jv_type_name(b));
        if (jv_compare(c, a, b, &cmp)) return -1;
        *res = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
        return 0;
    }
    }
}

/* ---- slicing ------------------------------------------------------------ */
static int slice_bound(jctx *c, jv v, int64_t *out, int *present) {
    *present = 0;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return 0;
    if (!is_intlike(v)) return jfail(c, "slice indices must be integers or None");
    *out = ival(v);
    *present = 1;
    return 0;
}

static int do_slice(jctx *c, jv obj, jv vs, jv ve, jv vst, jv *out) {
    int64_t start = 0, stop = 0, step = 1;
    int hs, he, hst;
    if (slice_bound(c, vs, &start, &hs) || slice_bound(c, ve, &stop, &he) || slice_bound(c, vst, &step, &hst)) return -1;
    if (!hst) step = 1;
    if (step == 0) return jfail(c, "slice step cannot be zero");
    jlist *items;
    int is_str = obj.t == JV_STR;
    if (obj.t == JV_UNDEF) return undef_error(c, obj);
    /* jinja2 compiles slices to plain Python subscripts: no undefined fallback */
    if (obj.t == JV_DICT || obj.t == JV_NS) return jfail(c, "unhashable type: 'slice'");
    if (!is_str && !jv_is_seq(obj)) return jfail(c, "'%s' object is not subscriptable", jv_type_name(obj));
    if (jv_iter_list(c, obj, &items)) return -1;
    int64_t n = (int64_t)items->n;
    if (!hs) start = step > 0 ? 0 : n - 1;
    else if (start < 0) start = start + n < 0 ? (step > 0 ? 0 : -1) : start + n;
    else if (start >= n) start = step > 0 ? n : n - 1;
    if (!he) stop = step > 0 ? n : -1;
    else if (stop < 0) stop = stop + n < 0 ? (step > 0 ? 0 : -1) : stop + n;
    else if (stop >= n) stop = step > 0 ? n : n - 1;
    jlist *r = jlist_new(c, 0);
    if (!r) return -1;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        if (jlist_push(c, r, items->v[i])) return -1;
    c->ops += r->n;
    if (is_str) {
        jbuf b = {0};
        for (size_t i = 0; i < r->n; i++)
            if (jbuf_put(c, &b, r->v[i].s->s, r->v[i].s->len)) {
                free(b.p);
                return -1;
            }
        *out = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return c->failed ? -1 : 0;
    }
    r->is_tuple = obj.l->is_tuple;
    out->t = JV_LIST;
    out->l = r;
    return 0;
}

/* ---- calls --------------------------------------------------------------- */
static int eval_args(jctx *c, jscope *s, const jnode *n, jargs *a, int extra_kw) {
    memset(a, 0, sizeof *a);
    int np = 0, nk = 0;
    for (int i = 0; i < n->n_kids; i++) (n->kw && n->kw[i]) ? nk++ : np++;
    a->pos = jarena_alloc(&c->arena, (size_t)(np + 1) * sizeof(jv));
    a->kw = jarena_alloc(&c->arena, (size_t)(nk + extra_kw + 1) * sizeof(jv));
    a->kw_names = jarena_alloc(&c->arena, (size_t)(nk + extra_kw + 1) * sizeof(char *));
    if (!a->pos || !a->kw || !a->kw_names) return joom(c);
    for (int i = 0; i < n->n_kids; i++) {
        jv v;
        if (eval(c, s, n->kids[i], &v)) return -1;
        if (n->kw && n->kw[i]) {
            a->kw_names[a->n_kw] = n->kw[i];
            a->kw[a->n_kw++] = v;
        } else {
            a->pos[a->n_pos++] = v;
        }
    }
    return 0;
}

static int call_value(jctx *c, jv f, const jargs *a, jv *out) {
    switch (f.t) {
    case JV_MACRO: return kn_jinja_call_macro(c, f.m, a, out);
    case JV_FUNC: return kn_jinja_call_func(c, f.fn, a, out);
    case JV_UNDEF: return undef_error(c, f);
    default: return jfail(c, "'%s' object is not callable", jv_type_name(f));
    }
}

int kn_jinja_call_macro(jctx *c, const jmacro *m, const jargs *a, jv *out) {
    const jnode *def = m->def;
    if (++c->depth > c->lim->max_depth) return jfail(c, "maximum recursion depth exceeded (%d)", c->lim->max_depth);
    jscope *s = scope_new(c, m->closure);
    if (!s) return -1;
    int np = def->n_params;
    char *set = jarena_alloc(&c->arena, (size_t)np + 1);
    jlist *varargs = jlist_new(c, 0);
    jdict *kwargs = jdict_new(c, 0);
    if (!set || !varargs || !kwargs) return joom(c);
    for (int i = 0; i < a->n_pos; i++) {
        if (i < np) {
            if (scope_set(c, s, def->params[i], a->pos[i])) return -1;
            set[i] = 1;
        } else if (!(def->op & 1)) {
            return jfail(c, "macro '%s' takes not more than %d argument(s)", def->name, np);
        } else if (jlist_push(c, varargs, a->pos[i])) {
            return -1;
        }
    }
    for (int k = 0; k < a->n_kw; k++) {
        int found = 0;
        for (int i = 0; i < np; i++)
            if (!strcmp(def->params[i], a->kw_names[k])) {
                if (set[i]) return jfail(c, "macro '%s' got multiple values for argument '%s'", def->name, def->params[i]);
                if (scope_set(c, s, def->params[i], a->kw[k])) return -1;
                set[i] = 1;
                found = 1;
            }
        if (found) continue;
        if (!strcmp(a->kw_names[k], "caller") && (def->op & 4)) {
            if (scope_set(c, s, "caller", a->kw[k])) return -1;
            continue;
        }
        if (!(def->op & 2)) return jfail(c, "macro '%s' takes no keyword argument '%s'", def->name, a->kw_names[k]);
        jv key = jv_cstr(c, a->kw_names[k]);
        if (c->failed || jdict_set(c, kwargs, key, a->kw[k])) return -1;
    }
    for (int i = 0; i < np; i++) {
        if (set[i]) continue;
        jv v;
        if (def->defaults[i]) {
            if (eval(c, s, def->defaults[i], &v)) return -1;
        } else {
            char *h = jarena_alloc(&c->arena, strlen(def->params[i]) + 64);
            if (h) sprintf(h, "parameter '%s' was not provided", def->params[i]);
            v = jv_undef(h);
        }
        if (scope_set(c, s, def->params[i], v)) return -1;
    }
    jv vv = {.t = JV_LIST}, kv = {.t = JV_DICT};
    vv.l = varargs;
    varargs->is_tuple = 1;
    kv.d = kwargs;
    if (scope_set(c, s, "varargs", vv) || scope_set(c, s, "kwargs", kv)) return -1;
    int saved_line = c->line;
    int rc = capture(c, s, def->b, out);
    c->line = saved_line;
    c->depth--;
    return rc;
}

static int eval_filter(jctx *c, jscope *s, const jnode *n, const jv *base, jv *out) {
    jv operand;
    if (!n->a) {
        operand = *base;
    } else if (base && n->a->kind == E_FILTER) {
        if (++c->depth > c->lim->max_depth) return jfail(c, "maximum recursion depth exceeded (%d)", c->lim->max_depth);
        int rc = eval_filter(c, s, n->a, base, &operand);
        c->depth--;
        if (rc) return -1;
    } else if (eval(c, s, n->a, &operand)) {
        return -1;
    }
    jargs a;
    if (eval_args(c, s, n, &a, 0)) return -1;
    c->line = n->line;
    return kn_jinja_apply_filter(c, n->name, operand, &a, out);
}

/* ---- expressions ---------------------------------------------------------- */
static int eval(jctx *c, jscope *s, const jnode *n, jv *out) {
    if (tick(c, n)) return -1;
    if (++c->depth > c->lim->max_depth) return jfail(c, "maximum recursion depth exceeded (%d)", c->lim->max_depth);
    int rc = 0;
    jv a, b;
    switch (n->kind) {
    case E_CONST: *out = n->value; break;
    case E_NAME: rc = lookup(c, s, n->name, out); break;
    case E_GETATTR:
        if (!(rc = eval(c, s, n->a, &a))) {
            c->line = n->line;
            rc = kn_jinja_getattr(c, a, n->name, out);
        }
        break;
    case E_GETITEM:
        if ((rc = eval(c, s, n->a, &a))) break;
        if (n->b->kind == E_SLICE) {
            jv p[3] = {jv_none(), jv_none(), jv_none()};
            const jnode *sl = n->b;
            if ((sl->a && eval(c, s, sl->a, &p[0])) || (sl->b && eval(c, s, sl->b, &p[1])) ||
                (sl->c && eval(c, s, sl->c, &p[2]))) {
                rc = -1;
                break;
            }
            c->line = n->line;
            if ((n->op & 1) && a.t != JV_STR && a.t != JV_UNDEF && !jv_is_seq(a)) {
                /* jinja2 folds constant subscripts at compile time through environment.getitem,
                 * which turns the TypeError into an undefined */
                *out = jv_undef("object is not subscriptable");
                break;
            }
            rc = do_slice(c, a, p[0], p[1], p[2], out);
            break;
        }
        if (!(rc = eval(c, s, n->b, &b))) {
            c->line = n->line;
            rc = kn_jinja_getitem(c, a, b, out);
        }
        break;
    case E_SLICE: rc = jfail(c, "slice outside of a subscript"); break;
    case E_CALL: {
        jv f;
        jargs args;
        if ((rc = eval(c, s, n->a, &f)) || (rc = eval_args(c, s, n, &args, 0))) break;
        c->line = n->line;
        rc = call_value(c, f, &args, out);
        break;
    }
    case E_FILTER: rc = eval_filter(c, s, n, NULL, out); break;
    case E_TEST: {
        jargs args;
        int r;
        if ((rc = eval(c, s, n->a, &a)) || (rc = eval_args(c, s, n, &args, 0))) break;
        c->line = n->line;
        if (!(rc = kn_jinja_apply_test(c, n->name, a, &args, &r))) *out = jv_bool(n->op ? !r : r);
        break;
    }
    case E_NEG:
    case E_POS:
        if ((rc = eval(c, s, n->a, &a))) break;
        if (a.t == JV_UNDEF) rc = undef_error(c, a);
        else if (is_intlike(a)) {
            if (n->kind == E_NEG && ival(a) == INT64_MIN) rc = jfail(c, "integer overflow");
            else *out = jv_int(n->kind == E_NEG ? -ival(a) : ival(a));
        } else if (a.t == JV_FLOAT) *out = jv_float(n->kind == E_NEG ? -a.f : a.f);
        else rc = jfail(c, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(a));
        break;
    case E_NOT:
        if (!(rc = eval(c, s, n->a, &a))) *out = jv_bool(!jv_truthy(a));
        break;
    case E_BIN:
        if ((rc = eval(c, s, n->a, &a)) || (rc = eval(c, s, n->b, &b))) break;
        c->line = n->line;
        rc = binop(c, n->op, a, b, out);
        break;
    case E_COMPARE: {
        if ((rc = eval(c, s, n->a, &a))) break;
        int res = 1;
        for (int i = 0; i < n->n_kids && res; i++) {
            if ((rc = eval(c, s, n->kids[i], &b))) break;
            c->line = n->line;
            if ((rc = compare_op(c, n->ops[i], a, b, &res))) break;
            a = b;
        }
        if (!rc) *out = jv_bool(res);
        break;
    }
    case E_AND:
        if ((rc = eval(c, s, n->a, &a))) break;
        if (!jv_truthy(a)) *out = a;
        else rc = eval(c, s, n->b, out);
        break;
    case E_OR:
        if ((rc = eval(c, s, n->a, &a))) break;
        if (jv_truthy(a)) *out = a;
        else rc = eval(c, s, n->b, out);
        break;
    case E_COND:
        if ((rc = eval(c, s, n->a, &a))) break;
        if (jv_truthy(a)) rc = eval(c, s, n->b, out);
        else if (n->c) rc = eval(c, s, n->c, out);
        else *out = jv_undef("the inline if-expression evaluated to false and no else section was defined");
        break;
    case E_LIST:
    case E_TUPLE: {
        jlist *l = jlist_new(c, (size_t)n->n_kids);
        if (!l) { rc = -1; break; }
        for (int i = 0; i < n->n_kids && !rc; i++) rc = eval(c, s, n->kids[i], &l->v[l->n++]);
        l->is_tuple = n->kind == E_TUPLE;
        out->t = JV_LIST;
        out->l = l;
        break;
    }
    case E_DICT: {
        jdict *d = jdict_new(c, (size_t)n->n_kids / 2);
        if (!d) { rc = -1; break; }
        for (int i = 0; i + 1 < n->n_kids && !rc; i += 2) {
            if ((rc = eval(c, s, n->kids[i], &a)) || (rc = eval(c, s, n->kids[i + 1], &b))) break;
            if (a.t == JV_LIST && !a.l->is_tuple) rc = jfail(c, "unhashable type: 'list'");
            else if (a.t == JV_DICT) rc = jfail(c, "unhashable type: 'dict'");
            else rc = jdict_set(c, d, a, b);
        }
        out->t = JV_DICT;
        out->d = d;
        break;
    }
    default: rc = jfail(c, "cannot evaluate node kind %d", (int)n->kind);
    }
    c->depth--;
    return rc ? -1 : 0;
}

/* ---- assignment ---------------------------------------------------------- */
static int assign(jctx *c, jscope *s, const jnode *target, jv v) {
    if (target->kind == E_NAME) return scope_set(c, s, target->name, v);
    if (target->kind == E_NSREF) {
        jv ns;
        if (lookup(c, s, target->a->name, &ns)) return -1;
        if (ns.t != JV_NS) return jfail(c, "cannot assign attribute on non-namespace object");
        jv k = jv_cstr(c, target->name);
        if (c->failed) return -1;
        return jdict_set(c, ns.d, k, v);
    }
    /* tuple unpacking */
    jlist *items;
    if (v.t == JV_DICT || v.t == JV_STR || v.t == JV_LIST) {
        if (jv_iter_list(c, v, &items)) return -1;
    } else {
        return jfail(c, "cannot unpack non-iterable %s object", jv_type_name(v));
    }
    if ((int)items->n != target->n_kids) {
        if ((int)items->n > target->n_kids) return jfail(c, "too many values to unpack (expected %d)", target->n_kids);
        return jfail(c, "not enough values to unpack (expected %d, got %zu)", target->n_kids, items->n);
    }
    for (int i = 0; i < target->n_kids; i++)
        if (assign(c, s, target->kids[i], items->v[i])) return -1;
    return 0;
}

/* ---- statements ------------------------------------------------------------ */
static int exec_for(jctx *c, jscope *s, const jnode *n) {
    jv it;
    if (eval(c, s, n->b, &it)) return -1;
    c->line = n->line;
    if (it.t == JV_NONE || it.t == JV_INT || it.t == JV_FLOAT || it.t == JV_BOOL)
        return jfail(c, "'%s' object is not iterable", jv_type_name(it));
    jlist *items;
    if (jv_iter_list(c, it, &items)) return -1;
    if (n->filter) {
        jlist *kept = jlist_new(c, 0);
        if (!kept) return -1;
        for (size_t i = 0; i < items->n; i++) {
            jscope *fs = scope_new(c, s);
            jv keep;
            if (!fs || assign(c, fs, n->a, items->v[i]) || eval(c, fs, n->filter, &keep)) return -1;
            if (jv_truthy(keep) && jlist_push(c, kept, items->v[i])) return -1;
            if (++c->loops > c->lim->max_loop) return jfail(c, "rendering exceeded the loop iteration limit");
        }
        items = kept;
    }
    jloop *lp = items->n ? jarena_alloc(&c->arena, sizeof(jloop) * items->n) : NULL;
    if (items->n && !lp) return joom(c);
    int completed = 0; /* jinja2 runs `else` unless some iteration ran its body to the end */
    for (size_t i = 0; i < items->n; i++) {
        if (++c->loops > c->lim->max_loop)
            return jfail(c, "rendering exceeded the loop iteration limit (%llu)", (unsigned long long)c->lim->max_loop);
        jscope *is = scope_new(c, s);
        if (!is) return -1;
        lp[i].items = items;
        lp[i].index0 = i;
        jv lv = {.t = JV_LOOP};
        lv.loop = &lp[i];
        if (assign(c, is, n->a, items->v[i]) || scope_set(c, is, "loop", lv)) return -1;
        int rc = exec(c, is, n->c);
        if (rc < 0) return -1;
        if (rc == 1) break;
        if (rc == 0) completed = 1;
    }
    if (!completed && n->body2) return exec(c, s, n->body2);
    return 0;
}

static int exec(jctx *c, jscope *s, const jnode *n) {
    if (tick(c, n)) return -1;
    if (++c->depth > c->lim->max_depth) return jfail(c, "maximum recursion depth exceeded (%d)", c->lim->max_depth);
    int rc = 0;
    jv v;
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->n_kids; i++) {
            rc = exec(c, s, n->kids[i]);
            if (rc) break;
        }
        break;
    case N_DATA: rc = jbuf_put(c, c->out, n->value.s->s, n->value.s->len); break;
    case N_OUTPUT:
        if (!(rc = eval(c, s, n->a, &v))) {
            c->line = n->line;
            if (v.t != JV_UNDEF) rc = jv_write_str(c, c->out, v);
        }
        break;
    case N_IF: /* elif chains are N_IF nodes in body2: walk them without recursion */
        for (const jnode *x = n;;) {
            if ((rc = eval(c, s, x->a, &v))) break;
            if (jv_truthy(v)) {
                rc = exec(c, s, x->b);
                break;
            }
            if (!x->body2) break;
            if (x->body2->kind != N_IF) {
                rc = exec(c, s, x->body2);
                break;
            }
            x = x->body2;
            if (tick(c, x)) {
                rc = -1;
                break;
            }
        }
        break;
    case N_FOR: rc = exec_for(c, s, n); break;
    case N_SET:
        if (!(rc = eval(c, s, n->b, &v))) {
            c->line = n->line;
            rc = assign(c, s, n->a, v);
        }
        break;
    case N_SET_BLOCK:
        if ((rc = capture(c, s, n->b, &v))) break;
        if (n->filter && (rc = eval_filter(c, s, n->filter, &v, &v))) break;
        c->line = n->line;
        rc = assign(c, s, n->a, v);
        break;
    case N_MACRO: {
        jmacro *m = jarena_alloc(&c->arena, sizeof *m);
        if (!m) { rc = joom(c); break; }
        m->def = n;
        m->closure = s;
        v.t = JV_MACRO;
        v.m = m;
        rc = scope_set(c, s, n->name, v);
        break;
    }
    case N_CALL_BLOCK: {
        jmacro *caller = jarena_alloc(&c->arena, sizeof *caller);
        if (!caller) { rc = joom(c); break; }
        caller->def = n->body2;
        caller->closure = s;
        jv f, cv = {.t = JV_MACRO};
        cv.m = caller;
        jargs args;
        if ((rc = eval(c, s, n->a->a, &f)) || (rc = eval_args(c, s, n->a, &args, 1))) break;
        args.kw_names[args.n_kw] = "caller";
        args.kw[args.n_kw++] = cv;
        c->line = n->line;
        if (!(rc = call_value(c, f, &args, &v))) rc = jv_write_str(c, c->out, v);
        break;
    }
    case N_FILTER_BLOCK:
        if ((rc = capture(c, s, n->b, &v))) break;
        if (!(rc = eval_filter(c, s, n->filter, &v, &v))) rc = jv_write_str(c, c->out, v);
        break;
    case N_WITH: {
        jscope *ws = scope_new(c, s);
        if (!ws) { rc = -1; break; }
        for (int i = 0; i + 1 < n->n_kids && !rc; i += 2) {
            if (!(rc = eval(c, s, n->kids[i + 1], &v))) rc = assign(c, ws, n->kids[i], v);
        }
        if (!rc) rc = exec(c, ws, n->b);
        break;
    }
    case N_BREAK: rc = 1; break;
    case N_CONTINUE: rc = 2; break;
    default: rc = jfail(c, "cannot execute node kind %d", (int)n->kind);
    }
    c->depth--;
    return rc < 0 ? -1 : rc;
}

int kn_jinja_render(const jtmpl *t, const jlimits *lim, jctx *c, const jdict *vars, jbuf *out) {
    c->t = t;
    c->lim = lim;
    c->out = out;
    c->arena.limit = lim->max_arena;
    jscope *root = scope_new(c, NULL);
    if (!root) return -1;
    for (size_t i = 0; i < vars->n; i++)
        if (jdict_set(c, root->vars, vars->k[i], vars->v[i])) return -1;
    /* template-level scope: top-level `set` lands here, inputs stay visible */
    jscope *top = scope_new(c, root);
    if (!top) return -1;
    int rc = exec(c, top, t->root);
    if (rc > 0) return jfail(c, "break or continue outside a loop");
    return rc;
}

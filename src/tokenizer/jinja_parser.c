/* jinja_parser.c — tokens -> AST, following jinja2's Parser grammar:
 *   tuple    := expr (',' expr)* [',']
 *   expr     := or ['if' or ['else' expr]]          (conditional expression)
 *   or/and/not, compare (== != < <= > >= in, not in; chained),
 *   math1 (+ -) > concat (~) > math2 (* / // %) > pow (** left-assoc) >
 *   unary (- +) > primary + postfix (. [] ()) + filters (|f) and tests (is t)
 * Statements: if/elif/else, for (tuple targets, `if` filter, else), set
 * (expression, namespace attribute, block form with filters), macro, call,
 * filter, with, break/continue, generation (transformers' extension).
 * Unknown filters and tests are compile-time errors, as in jinja2. Nesting
 * is capped (max_parse_depth) so hostile input cannot exhaust the stack. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer/jinja_lexer.h"

typedef struct {
    jtmpl *t;
    jtok *tk;
    size_t n, i;
    int depth, loop_depth;
    const jlimits *lim;
    char *err;
    size_t errlen;
    int failed;
} parser;

static jnode *pfail(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static jnode *pfail(parser *P, const char *fmt, ...) {
    if (P->failed) return NULL;
    P->failed = 1;
    int line = P->tk[P->i < P->n ? P->i : P->n - 1].line;
    int n = snprintf(P->err, P->errlen, "%s:%d: ", P->t->name, line);
    if (n < 0 || (size_t)n >= P->errlen) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->err + n, P->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return NULL;
}

static jtok *cur(parser *P) { return &P->tk[P->i]; }
static jtok *peek(parser *P, size_t k) { return &P->tk[P->i + k < P->n ? P->i + k : P->n - 1]; }
static void adv(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}
static int is_op(jtok *t, const char *op) { return t->type == T_OP && !strcmp(t->s, op); }
static int is_name(jtok *t, const char *nm) { return t->type == T_NAME && !strcmp(t->s, nm); }

static const char *tok_desc(jtok *t) {
    switch (t->type) {
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_END: return "end of statement block";
    case T_EOF: return "end of template";
    case T_NAME: case T_OP: return t->s;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_DATA: return "template data";
    default: return "token";
    }
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        pfail(P, "expected '%s', got '%s'", op, tok_desc(cur(P)));
        return -1;
    }
    adv(P);
    return 0;
}

static jnode *nnew(parser *P, jnode_kind k, int line) {
    jnode *n = jarena_alloc(&P->t->arena, sizeof *n);
    if (!n) return pfail(P, "out of memory");
    n->kind = k;
    n->line = line;
    return n;
}

typedef struct {
    jnode **v;
    const char **kw;
    int n, cap;
} nvec;

static int nvec_push(parser *P, nvec *a, jnode *x, const char *kw) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 4;
        jnode **nv = jarena_alloc(&P->t->arena, (size_t)nc * sizeof *nv);
        const char **nk = jarena_alloc(&P->t->arena, (size_t)nc * sizeof *nk);
        if (!nv || !nk) {
            pfail(P, "out of memory");
            return -1;
        }
        if (a->n) {
            memcpy(nv, a->v, (size_t)a->n * sizeof *nv);
            memcpy(nk, a->kw, (size_t)a->n * sizeof *nk);
        }
        a->v = nv;
        a->kw = nk;
        a->cap = nc;
    }
    a->v[a->n] = x;
    a->kw[a->n] = kw;
    a->n++;
    return 0;
}

static jnode *parse_expression(parser *P, int with_condexpr);
static jnode *parse_tuple(parser *P, int with_condexpr, int explicit_parens, const char *extra_end);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_body(parser *P, const char *const *ends);

static int enter(parser *P) {
    if (++P->depth > P->lim->max_parse_depth) {
        pfail(P, "template nested too deeply (limit %d)", P->lim->max_parse_depth);
        return -1;
    }
    return 0;
}

/* ---- expressions ------------------------------------------------------ */
static int parse_call_args(parser *P, jnode *call) {
    if (expect_op(P, "(")) return -1;
    nvec a = {0};
    int first = 1;
    while (!is_op(cur(P), ")")) {
        if (!first && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        first = 0;
        if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
            pfail(P, "*args / **kwargs in calls are not supported");
            return -1;
        }
        const char *kw = NULL;
        if (cur(P)->type == T_NAME && is_op(peek(P, 1), "=")) {
            kw = cur(P)->s;
            adv(P);
            adv(P);
        } else {
            for (int k = 0; k < a.n; k++)
                if (a.kw[k]) {
                    pfail(P, "positional argument follows keyword argument");
                    return -1;
                }
        }
        jnode *e = parse_expression(P, 1);
        if (!e || nvec_push(P, &a, e, kw)) return -1;
    }
    adv(P);
    call->kids = a.v;
    call->kw = a.kw;
    call->n_kids = a.n;
    return 0;
}

static jnode *parse_filter_one(parser *P, jnode *operand) {
    /* at the filter name (after '|') */
    int line = cur(P)->line;
    if (cur(P)->type != T_NAME) return pfail(P, "expected filter name, got '%s'", tok_desc(cur(P)));
    const char *name = cur(P)->s;
    adv(P);
    while (is_op(cur(P), ".")) { /* dotted filter names: not used by jinja builtins */
        return pfail(P, "No filter named '%s.%s'.", name, cur(P)->s ? cur(P)->s : "");
    }
    if (kn_jinja_filter_exists(name) == 0) return pfail(P, "No filter named '%s'.", name);
    jnode *f = nnew(P, E_FILTER, line);
    if (!f) return NULL;
    f->a = operand;
    f->name = name;
    if (is_op(cur(P), "(") && parse_call_args(P, f)) return NULL;
    return f;
}

static jnode *parse_primary(parser *P) {
    jtok *t = cur(P);
    jnode *n;
    switch (t->type) {
    case T_NAME:
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            if (!(n = nnew(P, E_CONST, t->line))) return NULL;
            n->value = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            if (!(n = nnew(P, E_CONST, t->line))) return NULL;
            n->value = jv_none();
        } else {
            if (!(n = nnew(P, E_NAME, t->line))) return NULL;
            n->name = t->s;
        }
        adv(P);
        return n;
    case T_STRING: {
        if (!(n = nnew(P, E_CONST, t->line))) return NULL;
        size_t total = 0, k = P->i;
        while (P->tk[k].type == T_STRING) total += P->tk[k++].len;
        jstr *s = jarena_alloc(&P->t->arena, sizeof(jstr) + total + 1);
        if (!s) return pfail(P, "out of memory");
        size_t off = 0;
        while (cur(P)->type == T_STRING) {
            memcpy(s->s + off, cur(P)->s, cur(P)->len);
            off += cur(P)->len;
            adv(P);
        }
        s->s[total] = 0;
        s->len = total;
        n->value.t = JV_STR;
        n->value.s = s;
        return n;
    }
    case T_INT:
    case T_FLOAT:
        if (!(n = nnew(P, E_CONST, t->line))) return NULL;
        n->value = t->type == T_INT ? jv_int(t->ival) : jv_float(t->fval);
        adv(P);
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            adv(P);
            n = parse_tuple(P, 1, 1, NULL);
            if (!n || expect_op(P, ")")) return NULL;
            return n;
        }
        if (is_op(t, "[")) {
            adv(P);
            if (!(n = nnew(P, E_LIST, t->line))) return NULL;
            nvec a = {0};
            while (!is_op(cur(P), "]")) {
                if (a.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "]")) break;
                jnode *e = parse_expression(P, 1);
                if (!e || nvec_push(P, &a, e, NULL)) return NULL;
            }
            adv(P);
            n->kids = a.v;
            n->n_kids = a.n;
            return n;
        }
        if (is_op(t, "{")) {
            adv(P);
            if (!(n = nnew(P, E_DICT, t->line))) return NULL;
            nvec a = {0};
            while (!is_op(cur(P), "}")) {
                if (a.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "}")) break;
                jnode *k = parse_expression(P, 1);
                if (!k || expect_op(P, ":")) return NULL;
                jnode *v = parse_expression(P, 1);
                if (!v || nvec_push(P, &a, k, NULL) || nvec_push(P, &a, v, NULL)) return NULL;
            }
            adv(P);
            n->kids = a.v;
            n->n_kids = a.n;
            return n;
        }
        /* fallthrough */
    default: return pfail(P, "unexpected '%s'", tok_desc(t));
    }
}

static jnode *parse_subscribed(parser *P) {
    int line = cur(P)->line;
    jnode *args[3] = {0};
    if (is_op(cur(P), ":")) {
        adv(P);
    } else {
        jnode *e = parse_expression(P, 1);
        if (!e) return NULL;
        if (!is_op(cur(P), ":")) return e;
        adv(P);
        args[0] = e;
    }
    if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !is_op(cur(P), ",")) {
        if (!(args[1] = parse_expression(P, 1))) return NULL;
    }
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) {
            if (!(args[2] = parse_expression(P, 1))) return NULL;
        }
    }
    jnode *s = nnew(P, E_SLICE, line);
    if (!s) return NULL;
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

/* Would jinja2's optimizer fold this expression at compile time (as_const)?
 * Conservative: literals and operators, filters and tests on constants
 * (except the context filters map/select/reject/selectattr/rejectattr),
 * attribute and item access on constants; never names or calls. */
static int is_const(const jnode *n, int depth) {
    if (!n) return 1;
    if (depth > 100) return 0;
    switch (n->kind) {
    case E_CONST: return 1;
    case E_LIST: case E_TUPLE: case E_DICT: case E_COMPARE:
        if (n->kind == E_COMPARE && !is_const(n->a, depth + 1)) return 0;
        for (int i = 0; i < n->n_kids; i++)
            if (!is_const(n->kids[i], depth + 1)) return 0;
        return 1;
    case E_NEG: case E_POS: case E_NOT: case E_GETATTR: return is_const(n->a, depth + 1);
    case E_BIN: case E_AND: case E_OR: case E_GETITEM: return is_const(n->a, depth + 1) && is_const(n->b, depth + 1);
    case E_SLICE: return is_const(n->a, depth + 1) && is_const(n->b, depth + 1) && is_const(n->c, depth + 1);
    case E_COND: return n->c && is_const(n->a, depth + 1) && is_const(n->b, depth + 1) && is_const(n->c, depth + 1);
    case E_FILTER:
        if (!n->a || !strcmp(n->name, "map") || !strcmp(n->name, "select") || !strcmp(n->name, "reject") ||
            !strcmp(n->name, "selectattr") || !strcmp(n->name, "rejectattr"))
            return 0;
        /* fallthrough */
    case E_TEST:
        if (!is_const(n->a, depth + 1)) return 0;
        for (int i = 0; i < n->n_kids; i++)
            if (!is_const(n->kids[i], depth + 1)) return 0;
        return 1;
    default: return 0;
    }
}

/* jinja2 folds a whole constant `{{ expr }}` at compile time through
 * as_const, where a slice of a non-sequence becomes undefined instead of an
 * error; mark the slices of such an expression. */
static void mark_const_slices(jnode *n, int depth) {
    if (!n || depth > 100) return;
    if (n->kind == E_GETITEM && n->b && n->b->kind == E_SLICE) n->op = 1;
    mark_const_slices(n->a, depth + 1);
    mark_const_slices(n->b, depth + 1);
    mark_const_slices(n->c, depth + 1);
    for (int i = 0; i < n->n_kids; i++) mark_const_slices(n->kids[i], depth + 1);
}

static jnode *parse_postfix(parser *P, jnode *node) {
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            jtok *a = cur(P);
            if (a->type == T_NAME) {
                jnode *g = nnew(P, E_GETATTR, a->line);
                if (!g) return NULL;
                g->a = node;
                g->name = a->s;
                adv(P);
                node = g;
            } else if (a->type == T_INT) {
                jnode *g = nnew(P, E_GETITEM, a->line), *k = nnew(P, E_CONST, a->line);
                if (!g || !k) return NULL;
                k->value = jv_int(a->ival);
                g->a = node;
                g->b = k;
                adv(P);
                node = g;
            } else {
                return pfail(P, "expected name or number");
            }
        } else if (is_op(t, "[")) {
            adv(P);
            nvec a = {0};
            while (!is_op(cur(P), "]")) {
                if (a.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "]")) break;
                jnode *e = parse_subscribed(P);
                if (!e || nvec_push(P, &a, e, NULL)) return NULL;
            }
            if (a.n == 0) return pfail(P, "expected subscript expression");
            adv(P);
            jnode *g = nnew(P, E_GETITEM, t->line);
            if (!g) return NULL;
            g->a = node;
            if (a.n == 1) {
                g->b = a.v[0];
            } else {
                jnode *tup = nnew(P, E_TUPLE, t->line);
                if (!tup) return NULL;
                tup->kids = a.v;
                tup->n_kids = a.n;
                g->b = tup;
            }
            node = g;
        } else if (is_op(t, "(")) {
            jnode *c = nnew(P, E_CALL, t->line);
            if (!c) return NULL;
            c->a = node;
            if (parse_call_args(P, c)) return NULL;
            node = c;
        } else {
            return node;
        }
    }
}

static jnode *parse_test(parser *P, jnode *node) {
    int line = cur(P)->line;
    adv(P); /* is */
    int neg = 0;
    if (is_name(cur(P), "not")) {
        neg = 1;
        adv(P);
    }
    if (cur(P)->type != T_NAME) return pfail(P, "expected test name, got '%s'", tok_desc(cur(P)));
    const char *name = cur(P)->s;
    adv(P);
    if (is_op(cur(P), ".")) return pfail(P, "No test named '%s.%s'.", name, peek(P, 1)->s ? peek(P, 1)->s : "");
    if (kn_jinja_test_exists(name) == 0) return pfail(P, "No test named '%s'.", name);
    jnode *t = nnew(P, E_TEST, line);
    if (!t) return NULL;
    t->a = node;
    t->name = name;
    t->op = neg;
    jtok *c = cur(P);
    if (is_op(c, "(")) {
        if (parse_call_args(P, t)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return pfail(P, "You cannot chain multiple tests with is");
        jnode *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        jnode **k = jarena_alloc(&P->t->arena, sizeof *k);
        const char **kw = jarena_alloc(&P->t->arena, sizeof *kw);
        if (!k || !kw) return pfail(P, "out of memory");
        k[0] = arg;
        t->kids = k;
        t->kw = kw;
        t->n_kids = 1;
    }
    return t;
}

static jnode *parse_filter_expr(parser *P, jnode *node) {
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, "|")) {
            adv(P);
            if (!(node = parse_filter_one(P, node))) return NULL;
        } else if (is_name(t, "is")) {
            if (!(node = parse_test(P, node))) return NULL;
        } else if (is_op(t, "(")) {
            jnode *c = nnew(P, E_CALL, t->line);
            if (!c) return NULL;
            c->a = node;
            if (parse_call_args(P, c)) return NULL;
            node = c;
        } else {
            return node;
        }
    }
}

static jnode *parse_unary(parser *P, int with_filter) {
    if (enter(P)) return NULL;
    jtok *t = cur(P);
    jnode *node;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        jnode *o = parse_unary(P, 0);
        if (!o || !(node = nnew(P, t->s[0] == '-' ? E_NEG : E_POS, t->line))) return NULL;
        node->a = o;
    } else {
        node = parse_primary(P);
    }
    if (node) node = parse_postfix(P, node);
    if (node && with_filter) node = parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static jnode *bin(parser *P, int op, jnode *l, jnode *r, int line) {
    if (!l || !r) return NULL;
    jnode *n = nnew(P, E_BIN, line);
    if (!n) return NULL;
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *l = parse_unary(P, 1);
    while (l && is_op(cur(P), "**")) {
        int line = cur(P)->line;
        adv(P);
        l = bin(P, OP_POW, l, parse_unary(P, 1), line);
    }
    return l;
}

static jnode *parse_math2(parser *P) {
    jnode *l = parse_pow(P);
    for (;;) {
        jtok *t = cur(P);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : -1;
        if (op < 0 || !l) return l;
        adv(P);
        l = bin(P, op, l, parse_pow(P), t->line);
    }
}

static jnode *parse_concat(parser *P) {
    jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        int line = cur(P)->line;
        adv(P);
        l = bin(P, OP_CONCAT, l, parse_math2(P), line);
    }
    return l;
}

static jnode *parse_math1(parser *P) {
    jnode *l = parse_concat(P);
    for (;;) {
        jtok *t = cur(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0 || !l) return l;
        adv(P);
        l = bin(P, op, l, parse_concat(P), t->line);
    }
}

static jnode *parse_compare(parser *P) {
    int line = cur(P)->line;
    jnode *first = parse_math1(P);
    if (!first) return NULL;
    nvec a = {0};
    int ops[64], n_ops = 0;
    for (;;) {
        jtok *t = cur(P);
        int op = -1;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            adv(P);
        }
        if (op < 0) break;
        adv(P);
        if (n_ops == 64) return pfail(P, "comparison chain too long");
        ops[n_ops++] = op;
        jnode *r = parse_math1(P);
        if (!r || nvec_push(P, &a, r, NULL)) return NULL;
    }
    if (!n_ops) return first;
    jnode *n = nnew(P, E_COMPARE, line);
    if (!n) return NULL;
    n->a = first;
    n->kids = a.v;
    n->n_kids = a.n;
    n->ops = jarena_alloc(&P->t->arena, (size_t)n_ops * sizeof(int));
    if (!n->ops) return pfail(P, "out of memory");
    memcpy(n->ops, ops, (size_t)n_ops * sizeof(int));
    return n;
}

static jnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        int line = cur(P)->line;
        adv(P);
        if (enter(P)) return NULL;
        jnode *o = parse_not(P);
        P->depth--;
        jnode *n = o ? nnew(P, E_NOT, line) : NULL;
        if (n) n->a = o;
        return n;
    }
    return parse_compare(P);
}

/* a left-associative chain `x WORD y WORD z` of one boolean operator */
static jnode *parse_bool_chain(parser *P, const char *word, jnode_kind kind, jnode *(*next)(parser *)) {
    jnode *l = next(P);
    while (l && is_name(cur(P), word)) {
        int line = cur(P)->line;
        adv(P);
        jnode *r = next(P), *n = r ? nnew(P, kind, line) : NULL;
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_and(parser *P) { return parse_bool_chain(P, "and", E_AND, parse_not); }
static jnode *parse_or(parser *P) { return parse_bool_chain(P, "or", E_OR, parse_and); }

static jnode *parse_expression(parser *P, int with_condexpr) {
    if (enter(P)) return NULL;
    jnode *e = parse_or(P);
    while (e && with_condexpr && is_name(cur(P), "if")) {
        int line = cur(P)->line;
        adv(P);
        jnode *cond = parse_or(P);
        if (!cond) return NULL;
        jnode *els = NULL;
        if (is_name(cur(P), "else")) {
            adv(P);
            if (!(els = parse_expression(P, 1))) return NULL;
        }
        jnode *n = nnew(P, E_COND, line);
        if (!n) return NULL;
        n->a = cond;
        n->b = e;
        n->c = els;
        e = n;
    }
    P->depth--;
    return e;
}

static int is_tuple_end(parser *P, const char *extra_end) {
    jtok *t = cur(P);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, ")")) return 1;
    return extra_end && is_name(t, extra_end);
}

static jnode *parse_tuple(parser *P, int with_condexpr, int explicit_parens, const char *extra_end) {
    int line = cur(P)->line;
    nvec a = {0};
    int is_tuple = 0;
    for (;;) {
        if (a.n && expect_op(P, ",")) return NULL;
        if (is_tuple_end(P, extra_end)) break;
        jnode *e = parse_expression(P, with_condexpr);
        if (!e || nvec_push(P, &a, e, NULL)) return NULL;
        if (is_op(cur(P), ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (a.n) return a.v[0];
        if (!explicit_parens) return pfail(P, "Expected an expression, got '%s'", tok_desc(cur(P)));
    }
    jnode *n = nnew(P, E_TUPLE, line);
    if (!n) return NULL;
    n->kids = a.v;
    n->n_kids = a.n;
    return n;
}

/* assignment target: name, ns.attr (when allowed) or a tuple of names */
static jnode *parse_assign_target(parser *P, int with_namespace, const char *extra_end) {
    int line = cur(P)->line;
    if (with_namespace && cur(P)->type == T_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->type == T_NAME) {
        jnode *n = nnew(P, E_NSREF, line), *base = nnew(P, E_NAME, line);
        if (!n || !base) return NULL;
        base->name = cur(P)->s;
        n->a = base;
        n->name = peek(P, 2)->s;
        adv(P);
        adv(P);
        adv(P);
        return n;
    }
    nvec a = {0};
    int is_tuple = 0;
    int paren = 0;
    if (is_op(cur(P), "(")) {
        paren = 1;
        adv(P);
    }
    for (;;) {
        if (a.n && expect_op(P, ",")) return NULL;
        if (cur(P)->type != T_NAME || (extra_end && is_name(cur(P), extra_end))) {
            if (a.n && is_tuple) break;
            return pfail(P, "can't assign to '%s'", tok_desc(cur(P)));
        }
        jnode *nm = nnew(P, E_NAME, cur(P)->line);
        if (!nm) return NULL;
        nm->name = cur(P)->s;
        adv(P);
        if (nvec_push(P, &a, nm, NULL)) return NULL;
        if (is_op(cur(P), ",")) is_tuple = 1;
        else break;
    }
    if (paren && expect_op(P, ")")) return NULL;
    if (!is_tuple) return a.v[0];
    jnode *n = nnew(P, E_TUPLE, line);
    if (!n) return NULL;
    n->kids = a.v;
    n->n_kids = a.n;
    return n;
}

/* ---- statements -------------------------------------------------------- */
static int expect_block_end(parser *P) {
    if (cur(P)->type != T_BLOCK_END) {
        pfail(P, "expected 'end of statement block', got '%s'", tok_desc(cur(P)));
        return -1;
    }
    adv(P);
    return 0;
}

/* Consume `{% NAME` where NAME is one of ends (already at T_BLOCK_BEGIN + NAME). */
static const char *take_end(parser *P) {
    adv(P); /* block begin */
    const char *nm = cur(P)->s;
    adv(P);
    return nm;
}

/* if/elif/else: an elif chain is built iteratively as nested N_IF in body2,
 * so a long chain costs no parser stack. */
static jnode *parse_if(parser *P, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    jnode *head = NULL, *tail = NULL;
    for (;;) {
        jnode *n = nnew(P, N_IF, line);
        if (!n || !(n->a = parse_tuple(P, 0, 0, NULL)) || expect_block_end(P)) return NULL;
        if (!(n->b = parse_body(P, ends))) return NULL;
        if (tail) tail->body2 = n;
        else head = n;
        tail = n;
        const char *e = take_end(P);
        if (!strcmp(e, "elif")) {
            line = cur(P)->line;
            continue;
        }
        if (!strcmp(e, "else")) {
            if (expect_block_end(P) || !(tail->body2 = parse_body(P, end_only))) return NULL;
            take_end(P);
        }
        break;
    }
    if (expect_block_end(P)) return NULL;
    return head;
}

static jnode *parse_for(parser *P, int line) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    jnode *n = nnew(P, N_FOR, line);
    if (!n || !(n->a = parse_assign_target(P, 0, "in"))) return NULL;
    if (!is_name(cur(P), "in")) return pfail(P, "expected 'in', got '%s'", tok_desc(cur(P)));
    adv(P);
    if (!(n->b = parse_tuple(P, 0, 0, "recursive"))) return NULL;
    if (is_name(cur(P), "if")) {
        adv(P);
        if (!(n->filter = parse_expression(P, 1))) return NULL;
    }
    if (is_name(cur(P), "recursive")) return pfail(P, "recursive for loops are not supported");
    if (expect_block_end(P)) return NULL;
    P->loop_depth++;
    n->c = parse_body(P, ends);
    P->loop_depth--;
    if (!n->c) return NULL;
    const char *e = take_end(P);
    if (!strcmp(e, "else")) {
        if (expect_block_end(P) || !(n->body2 = parse_body(P, end_only))) return NULL;
        take_end(P);
    }
    if (expect_block_end(P)) return NULL;
    return n;
}

static jnode *parse_filter_chain(parser *P) {
    /* at a filter name: f1(args)|f2|... ; operand filled at run time */
    jnode *f = parse_filter_one(P, NULL);
    while (f && is_op(cur(P), "|")) {
        adv(P);
        f = parse_filter_one(P, f);
    }
    return f;
}

static jnode *parse_set(parser *P, int line) {
    static const char *const ends[] = {"endset", NULL};
    jnode *target = parse_assign_target(P, 1, NULL);
    if (!target) return NULL;
    if (is_op(cur(P), "=")) {
        adv(P);
        jnode *n = nnew(P, N_SET, line);
        if (!n) return NULL;
        n->a = target;
        if (!(n->b = parse_tuple(P, 1, 0, NULL)) || expect_block_end(P)) return NULL;
        return n;
    }
    jnode *n = nnew(P, N_SET_BLOCK, line);
    if (!n) return NULL;
    n->a = target;
    if (is_op(cur(P), "|")) {
        adv(P);
        if (!(n->filter = parse_filter_chain(P))) return NULL;
    }
    if (expect_block_end(P) || !(n->b = parse_body(P, ends))) return NULL;
    take_end(P);
    if (expect_block_end(P)) return NULL;
    return n;
}

static int parse_signature(parser *P, jnode *m) {
    nvec names = {0};
    nvec defs = {0};
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (names.n && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        if (cur(P)->type != T_NAME) {
            pfail(P, "expected parameter name, got '%s'", tok_desc(cur(P)));
            return -1;
        }
        jnode *nm = nnew(P, E_NAME, cur(P)->line);
        if (!nm) return -1;
        nm->name = cur(P)->s;
        adv(P);
        jnode *d = NULL;
        if (is_op(cur(P), "=")) {
            adv(P);
            if (!(d = parse_expression(P, 1))) return -1;
        } else {
            for (int k = 0; k < defs.n; k++)
                if (defs.v[k]) {
                    pfail(P, "non-default argument follows default argument");
                    return -1;
                }
        }
        if (nvec_push(P, &names, nm, nm->name) || nvec_push(P, &defs, d, NULL)) return -1;
    }
    adv(P);
    m->params = names.kw;
    m->defaults = defs.v;
    m->n_params = names.n;
    return 0;
}

/* Does the subtree reference NAME as a variable? (jinja2 only lets a macro
 * take extra positional / keyword arguments when its body uses varargs /
 * kwargs, and `caller` only when it uses caller.) Nested macros are skipped. */
static int uses_name(const jnode *n, const char *name, int depth) {
    if (!n || depth > 400) return 0;
    if (n->kind == E_NAME && !strcmp(n->name, name)) return 1;
    if (n->kind == N_MACRO && depth > 0) return 0;
    if (uses_name(n->a, name, depth + 1) || uses_name(n->b, name, depth + 1) || uses_name(n->c, name, depth + 1) ||
        uses_name(n->filter, name, depth + 1) || uses_name(n->body2, name, depth + 1))
        return 1;
    for (int i = 0; i < n->n_kids; i++)
        if (uses_name(n->kids[i], name, depth + 1)) return 1;
    for (int i = 0; n->defaults && i < n->n_params; i++)
        if (uses_name(n->defaults[i], name, depth + 1)) return 1;
    return 0;
}

static void mark_macro(jnode *m) {
    m->op = (uses_name(m->b, "varargs", 1) ? 1 : 0) | (uses_name(m->b, "kwargs", 1) ? 2 : 0) |
            (uses_name(m->b, "caller", 1) ? 4 : 0);
}

static jnode *parse_macro(parser *P, int line) {
    static const char *const ends[] = {"endmacro", NULL};
    jnode *n = nnew(P, N_MACRO, line);
    if (!n) return NULL;
    if (cur(P)->type != T_NAME) return pfail(P, "expected macro name");
    n->name = cur(P)->s;
    adv(P);
    if (parse_signature(P, n) || expect_block_end(P)) return NULL;
    int saved = P->loop_depth;
    P->loop_depth = 0;
    n->b = parse_body(P, ends);
    P->loop_depth = saved;
    if (!n->b) return NULL;
    mark_macro(n);
    take_end(P);
    if (cur(P)->type == T_NAME) adv(P); /* {% endmacro name %} */
    if (expect_block_end(P)) return NULL;
    return n;
}

static jnode *parse_call_block(parser *P, int line) {
    static const char *const ends[] = {"endcall", NULL};
    jnode *n = nnew(P, N_CALL_BLOCK, line);
    jnode *caller = nnew(P, N_MACRO, line);
    if (!n || !caller) return NULL;
    caller->name = "caller";
    if (is_op(cur(P), "(") && parse_signature(P, caller)) return NULL;
    jnode *call = parse_expression(P, 1);
    if (!call) return NULL;
    if (call->kind != E_CALL) return pfail(P, "expected call");
    n->a = call;
    if (expect_block_end(P) || !(caller->b = parse_body(P, ends))) return NULL;
    mark_macro(caller);
    take_end(P);
    if (expect_block_end(P)) return NULL;
    n->body2 = caller;
    return n;
}

static jnode *parse_filter_block(parser *P, int line) {
    static const char *const ends[] = {"endfilter", NULL};
    jnode *n = nnew(P, N_FILTER_BLOCK, line);
    if (!n || !(n->filter = parse_filter_chain(P)) || expect_block_end(P)) return NULL;
    if (!(n->b = parse_body(P, ends))) return NULL;
    take_end(P);
    if (expect_block_end(P)) return NULL;
    return n;
}

static jnode *parse_with(parser *P, int line) {
    static const char *const ends[] = {"endwith", NULL};
    jnode *n = nnew(P, N_WITH, line);
    if (!n) return NULL;
    nvec a = {0};
    while (cur(P)->type != T_BLOCK_END) {
        if (a.n && expect_op(P, ",")) return NULL;
        jnode *target = parse_assign_target(P, 0, NULL);
        if (!target || expect_op(P, "=")) return NULL;
        jnode *val = parse_expression(P, 1);
        if (!val || nvec_push(P, &a, target, NULL) || nvec_push(P, &a, val, NULL)) return NULL;
    }
    adv(P);
    n->kids = a.v;
    n->n_kids = a.n;
    if (!(n->b = parse_body(P, ends))) return NULL;
    take_end(P);
    if (expect_block_end(P)) return NULL;
    return n;
}

static jnode *parse_statement(parser *P) {
    jtok *t = cur(P);
    if (t->type != T_NAME) return pfail(P, "tag name expected");
    const char *nm = t->s;
    int line = t->line;
    adv(P);
    if (!strcmp(nm, "if")) return parse_if(P, line);
    if (!strcmp(nm, "for")) return parse_for(P, line);
    if (!strcmp(nm, "set")) return parse_set(P, line);
    if (!strcmp(nm, "macro")) return parse_macro(P, line);
    if (!strcmp(nm, "call")) return parse_call_block(P, line);
    if (!strcmp(nm, "filter")) return parse_filter_block(P, line);
    if (!strcmp(nm, "with")) return parse_with(P, line);
    if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        if (P->loop_depth == 0) return pfail(P, "'%s' outside loop", nm);
        jnode *n = nnew(P, nm[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        if (!n || expect_block_end(P)) return NULL;
        return n;
    }
    if (!strcmp(nm, "generation")) { /* transformers' AssistantTracker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        jnode *n;
        if (expect_block_end(P) || !(n = parse_body(P, ends))) return NULL;
        take_end(P);
        if (expect_block_end(P)) return NULL;
        return n;
    }
    if (!strcmp(nm, "include") || !strcmp(nm, "import") || !strcmp(nm, "from") || !strcmp(nm, "extends") ||
        !strcmp(nm, "block"))
        return pfail(P, "'%s' is not supported in chat templates (no template loader)", nm);
    P->i--;
    return pfail(P, "Encountered unknown tag '%s'.", nm);
}

static jnode *parse_body(parser *P, const char *const *ends) {
    if (enter(P)) return NULL;
    jnode *body = nnew(P, N_BODY, cur(P)->line);
    if (!body) return NULL;
    nvec a = {0};
    for (;;) {
        jtok *t = cur(P);
        if (t->type == T_EOF) {
            if (ends) {
                char want[128] = "";
                for (int k = 0; ends[k]; k++) {
                    strncat(want, k ? " or '" : "'", sizeof want - strlen(want) - 1);
                    strncat(want, ends[k], sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                }
                return pfail(P, "Unexpected end of template. Jinja was looking for the following tags: %s.", want);
            }
            break;
        }
        jnode *n = NULL;
        if (t->type == T_DATA) {
            if (!(n = nnew(P, N_DATA, t->line))) return NULL;
            jstr *s = jarena_alloc(&P->t->arena, sizeof(jstr) + t->len + 1);
            if (!s) return pfail(P, "out of memory");
            memcpy(s->s, t->s, t->len);
            s->s[t->len] = 0;
            s->len = t->len;
            n->value.t = JV_STR;
            n->value.s = s;
            adv(P);
        } else if (t->type == T_VAR_BEGIN) {
            adv(P);
            if (!(n = nnew(P, N_OUTPUT, t->line))) return NULL;
            if (!(n->a = parse_tuple(P, 1, 0, NULL))) return NULL;
            if (is_const(n->a, 0)) mark_const_slices(n->a, 0);
            if (cur(P)->type != T_VAR_END)
                return pfail(P, "expected 'end of print statement', got '%s'", tok_desc(cur(P)));
            adv(P);
        } else if (t->type == T_BLOCK_BEGIN) {
            jtok *nm = peek(P, 1);
            if (nm->type == T_NAME && ends) {
                int hit = 0;
                for (int k = 0; ends[k]; k++)
                    if (!strcmp(nm->s, ends[k])) hit = 1;
                if (hit) break;
            }
            if (nm->type == T_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "else") || !strcmp(nm->s, "elif"))) {
                P->i++;
                if (ends)
                    return pfail(P, "Encountered unknown tag '%s'. Jinja was looking for the following tags: '%s'.",
                                 nm->s, ends[0]);
                return pfail(P, "Encountered unknown tag '%s'.", nm->s);
            }
            adv(P);
            if (!(n = parse_statement(P))) return NULL;
        } else {
            return pfail(P, "unexpected '%s'", tok_desc(t));
        }
        if (nvec_push(P, &a, n, NULL)) return NULL;
    }
    body->kids = a.v;
    body->n_kids = a.n;
    P->depth--;
    return body;
}

int kn_jinja_parse(jtmpl *t, const char *src, size_t len, const char *name, const jlimits *lim, char *err,
                   size_t errlen) {
    t->name = jarena_strndup(&t->arena, name, strlen(name));
    if (!t->name) {
        snprintf(err, errlen, "%s: out of memory", name);
        return -1;
    }
    if (len > lim->max_source) {
        snprintf(err, errlen, "%s: template is %zu bytes, over the limit of %zu", name, len, lim->max_source);
        return -1;
    }
    /* Python reads templates as str: invalid UTF-8 cannot reach jinja2 */
    int line = 1;
    for (size_t i = 0; i < len;) {
        unsigned char b = (unsigned char)src[i];
        size_t n = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
        int ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++) ok = ((unsigned char)src[i + k] & 0xc0) == 0x80;
        if (ok && n == 2) ok = b >= 0xc2;
        if (ok && n == 3) {
            uint32_t cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(src[i + 1] & 0x3f) << 6) | (uint32_t)(src[i + 2] & 0x3f);
            ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
        }
        if (ok && n == 4) {
            uint32_t cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(src[i + 1] & 0x3f) << 12);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        }
        if (!ok) {
            snprintf(err, errlen, "%s:%d: template is not valid UTF-8 (byte offset %zu)", name, line, i);
            return -1;
        }
        if (b == '\n') line++;
        i += n;
    }
    jtok *toks;
    size_t n;
    if (kn_jinja_lex(&t->arena, src, len, t->name, &toks, &n, err, errlen)) return -1;
    parser P = {.t = t, .tk = toks, .n = n, .lim = lim, .err = err, .errlen = errlen};
    t->root = parse_body(&P, NULL);
    return t->root ? 0 : -1;
}

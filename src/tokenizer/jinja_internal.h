/* jinja_internal.h — the Jinja engine behind chat templates: values, lexer,
 * AST, evaluator and builtins, shared between jinja_*.c and chat_template.c.
 *
 * Ownership (one rule each):
 *  - A compiled template owns its AST, names and constant strings in its own
 *    arena (jtmpl.arena); it is immutable after compile and outlives renders.
 *  - Every value created while rendering lives in that render's arena
 *    (jctx.arena) and dies with it. Values are passed by value (jv is 16
 *    bytes); strings are immutable; lists/dicts are never mutated after they
 *    are built, except a namespace's dict (the only mutable object, as in
 *    jinja2's ImmutableSandboxedEnvironment).
 * Bounds: source size, parse nesting, eval depth, total operations, loop
 * iterations, output size and arena bytes are all capped (jlimits); hitting
 * a cap is an error, never a crash or a hang. */
#ifndef KN_JINJA_INTERNAL_H
#define KN_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/chat_template.h"

/* ---- arena ------------------------------------------------------------ */
typedef struct jarena_chunk jarena_chunk;
typedef struct {
    jarena_chunk *head;
    size_t used;  /* bytes handed out, all chunks */
    size_t limit; /* 0 = unlimited */
    int exhausted;
} jarena;

void *jarena_alloc(jarena *a, size_t n); /* zeroed; NULL when over limit or OOM */
char *jarena_strndup(jarena *a, const char *s, size_t n);
void jarena_free(jarena *a);

/* ---- values ----------------------------------------------------------- */
typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,    /* namespace(): a mutable dict */
    JV_MACRO, /* macro or caller */
    JV_FUNC,  /* global function or bound method */
    JV_LOOP,  /* the `loop` variable of a for loop */
} jv_type;

typedef struct jstr {
    size_t len; /* bytes, excluding the NUL */
    char s[];   /* UTF-8, NUL-terminated */
} jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
    jv_type t;
    int markup; /* JV_STR: a markupsafe.Markup (from |safe or |escape): `+` escapes the other side */
    union {
        int b;
        int64_t i;
        double f;
        const jstr *s;
        jlist *l;
        jdict *d; /* JV_DICT and JV_NS */
        const jmacro *m;
        const jfunc *fn;
        const jloop *loop;
        const char *undef_hint; /* JV_UNDEF: message used when it is misused (may be NULL) */
    };
} jv;

struct jlist {
    size_t n, cap;
    jv *v;
    int is_tuple;
    /* NULL for a list/tuple; else the Python type this stands for: a lazy
     * iterator ("generator", "list_reverseiterator": no len, always true,
     * not subscriptable) or a dict view ("dict_items", "dict_keys",
     * "dict_values": sized, not subscriptable). Neither is JSON-serializable. */
    const char *iter_name;
};
struct jdict {
    size_t n, cap;
    jv *k, *v;
};

/* ---- AST ---------------------------------------------------------------- */
typedef enum {
    /* statements */
    N_BODY, N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK, N_FILTER_BLOCK,
    N_BREAK, N_CONTINUE, N_WITH,
    /* expressions */
    E_CONST, E_NAME, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT,
    E_BIN, E_COMPARE, E_AND, E_OR, E_COND, E_LIST, E_TUPLE, E_DICT, E_NSREF,
} jnode_kind;

typedef enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
} jop;

typedef struct jnode jnode;
struct jnode {
    jnode_kind kind;
    int line;
    int op;           /* jop for E_BIN; negated flag for E_TEST */
    const char *name; /* E_NAME, E_GETATTR attr, filter/test/macro name, E_NSREF attr */
    jv value;         /* E_CONST */
    jnode *a, *b, *c; /* operands / condition / target / iter / else-body */
    jnode **kids;     /* body, args, list items, dict keys+values interleaved, compare operands */
    int n_kids;
    const char **kw;  /* per kid: keyword name or NULL (calls), ops for E_COMPARE stored in ops */
    int *ops;         /* E_COMPARE: n_kids-1 operators */
    jnode **defaults; /* N_MACRO: default per parameter (NULL = none) */
    const char **params;
    int n_params;
    jnode *filter;    /* N_FOR: `if` filter; N_SET_BLOCK / N_FILTER_BLOCK: filter chain */
    jnode *body2;     /* N_FOR / N_IF else body; N_CALL_BLOCK: caller macro */
};

/* ---- limits ------------------------------------------------------------- */
typedef struct {
    size_t max_source;     /* template bytes */
    size_t max_output;     /* bytes of any rendered string (output, macro result, set block) */
    size_t max_arena;      /* bytes of values one render may allocate */
    uint64_t max_ops;      /* evaluated nodes + builtin work units */
    uint64_t max_loop;     /* for-loop iterations, whole render */
    int max_depth;         /* nested evaluation depth (macro recursion included) */
    int max_parse_depth;   /* nested expressions/blocks in the source */
} jlimits;

extern const jlimits kn_jinja_default_limits;

typedef struct jtmpl {
    jarena arena;
    const char *name;
    jnode *root;
} jtmpl;

/* Parse: compile source into t (t->arena owns everything). On error returns
 * -1 and writes "NAME:LINE: message" into err (size errlen). */
int kn_jinja_parse(jtmpl *t, const char *src, size_t len, const char *name, const jlimits *lim, char *err,
                   size_t errlen);

/* ---- rendering ---------------------------------------------------------- */
typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;

typedef struct jscope jscope;
typedef struct jctx {
    jarena arena;
    const jtmpl *t;
    const jlimits *lim;
    jbuf *out; /* current output (macro calls and set blocks capture into their own) */
    jscope *globals;
    uint64_t ops, loops;
    int depth;
    int line; /* line of the node being evaluated, for messages */
    int failed;
    int raised; /* the error came from raise_exception() */
    char err[1024];
} jctx;

/* Errors: set ctx->err once (first error wins), return -1. */
int jfail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int joom(jctx *c);

/* values */
jv jv_undef(const char *hint);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jctx *c, const char *s, size_t n);   /* copies into the arena; t=JV_UNDEF + failed on OOM */
jv jv_cstr(jctx *c, const char *s);
jlist *jlist_new(jctx *c, size_t cap);
int jlist_push(jctx *c, jlist *l, jv v);
jdict *jdict_new(jctx *c, size_t cap);
int jdict_set(jctx *c, jdict *d, jv k, jv v);
int jdict_get(const jdict *d, jv k, jv *out);        /* 1 found */
int jdict_get_str(const jdict *d, const char *k, jv *out);
int jv_truthy(jv v);
int jv_equal(jv a, jv b);
const char *jv_type_name(jv v); /* Python type name: 'str', 'int', 'dict', 'NoneType', ... */
int jv_is_seq(jv v);            /* list or tuple */
int jv_is_lazy(jv v);           /* generator-like: no len(), always truthy */
size_t jstr_ncp(const jstr *s); /* code points */

/* Append str(v) (Python str()) or repr(v) to b. */
int jv_write_str(jctx *c, jbuf *b, jv v);
int jv_write_repr(jctx *c, jbuf *b, jv v, int depth);
/* str(v) as a value. */
int jv_to_str(jctx *c, jv v, jv *out);
/* Python json.dumps(v, ensure_ascii, indent (NULL = none), separators (NULL = default), sort_keys). */
int jv_write_json(jctx *c, jbuf *b, jv v, int ensure_ascii, const char *indent, const char *item_sep,
                  const char *key_sep, int sort_keys, int level);
void jfmt_float(double f, char *buf, size_t n); /* Python repr(float) */

int jbuf_put(jctx *c, jbuf *b, const char *s, size_t n);
int jbuf_puts(jctx *c, jbuf *b, const char *s);

/* Iterate: materialize v as a list of items (dict -> keys, str -> chars,
 * undefined -> empty). Errors for non-iterables. */
int jv_iter_list(jctx *c, jv v, jlist **out);
int jv_compare(jctx *c, jv a, jv b, int *cmp); /* Python <, for sort/min/max and operators */

/* ---- builtins (jinja_builtins.c) ---------------------------------------- */
typedef struct {
    jv *pos;
    int n_pos;
    const char **kw_names;
    jv *kw;
    int n_kw;
} jargs;

int kn_jinja_filter_exists(const char *name);   /* 1 implemented, 0 unknown to jinja2, -1 jinja2 has it, kiln not */
int kn_jinja_test_exists(const char *name);
int kn_jinja_apply_filter(jctx *c, const char *name, jv v, const jargs *a, jv *out);
int kn_jinja_apply_test(jctx *c, const char *name, jv v, const jargs *a, int *out);
/* attribute access on str/dict/list/namespace/loop values (methods become bound funcs) */
int kn_jinja_getattr(jctx *c, jv obj, const char *name, jv *out);
int kn_jinja_getitem(jctx *c, jv obj, jv key, jv *out);
int kn_jinja_call_func(jctx *c, const jfunc *fn, const jargs *a, jv *out);
/* global functions by name (range, dict, namespace, raise_exception, strftime_now, ...) */
jv kn_jinja_global(jctx *c, const char *name);

/* evaluator entry (jinja_eval.c): vars is a dict of top-level variables. */
int kn_jinja_render(const jtmpl *t, const jlimits *lim, jctx *c, const jdict *vars, jbuf *out);
int kn_jinja_call_macro(jctx *c, const jmacro *m, const jargs *a, jv *out);

struct jfunc {
    int id;            /* builtin id (jinja_builtins.c) */
    const char *name;
    jv self;           /* bound object for methods */
};
struct jmacro {
    const jnode *def; /* N_MACRO (name, params, defaults, body in b) */
    struct jscope *closure;
};
struct jloop {
    const jlist *items;
    size_t index0;
};

/* helpers shared by jinja_methods.c and jinja_builtins.c */
int jarg(const jargs *a, int pos, const char *name, jv *out); /* 1 when given */
int kn_jinja_str_strip(jctx *c, jv s, const jv *chars, int left, int right, jv *out);
enum { JCASE_LOWER, JCASE_UPPER, JCASE_CAPITALIZE, JCASE_TITLE_JINJA, JCASE_TITLE_PY, JCASE_SWAP };
int kn_jinja_str_case(jctx *c, jv s, int mode, jv *out);
int kn_jinja_str_replace(jctx *c, jv s, jv old, jv rep, int64_t count, jv *out);
int kn_jinja_is_space(uint32_t cp);
/* Python `fmt % args` (printf-style subset) */
int kn_jinja_printf(jctx *c, jv fmt, const jv *args, int n_args, int allow_unused, jv *out);
/* markupsafe.escape(): & < > " ' -> entities; result is Markup; Markup input is returned as is */
int kn_jinja_html_escape(jctx *c, jv v, jv *out);
/* a jinja2 attribute path "a.b.0" applied with getitem semantics */
int kn_jinja_attr_path(jctx *c, jv obj, const jstr *path, jv *out);

/* kn_chat_template_render with explicit limits (tests, fuzzing). */
kn_code kn_chat_template_render_limited(const kn_chat_template *t, const json_t *messages, const json_t *tools,
                                        int add_generation_prompt, const json_t *kwargs, const jlimits *lim, char **out,
                                        size_t *len, kn_error *err);

/* UTF-8 helpers */
size_t kn_utf8_next(const char *s, size_t len, size_t i, uint32_t *cp); /* returns next index */
int kn_utf8_put(char *dst, uint32_t cp);                                 /* returns bytes written */

#endif

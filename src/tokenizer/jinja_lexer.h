/* jinja_lexer.h — tokens of a Jinja template (see jinja_lexer.c). */
#ifndef KN_JINJA_LEXER_H
#define KN_JINJA_LEXER_H

#include "tokenizer/jinja_internal.h"

enum { T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int type;
    int line;
    const char *s; /* T_DATA: text (not NUL-terminated); T_NAME/T_STRING: NUL-terminated; T_OP: operator */
    size_t len;
    int64_t ival;
    double fval;
} jtok;

/* Tokenize; tokens and strings are allocated in arena. The last token is
 * T_EOF. On error returns -1 with "NAME:LINE: message" in err. */
int kn_jinja_lex(jarena *arena, const char *src, size_t len, const char *name, jtok **out, size_t *n_out, char *err,
                 size_t errlen);

#endif

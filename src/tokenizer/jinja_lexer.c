/* jinja_lexer.c — template source -> tokens, as jinja2's Lexer does with
 * trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False:
 *  - newlines (\r\n, \r, \n) become \n and one trailing newline is dropped;
 *  - `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}`
 *    all whitespace after it;
 *  - lstrip_blocks: spaces/tabs between a line start and `{%`/`{#` go
 *    (not for `{{`, not with `{%+`); trim_blocks: one newline after `%}`/`#}`
 *    goes (not with `+%}`);
 *  - `{% raw %}...{% endraw %}` is data; comments vanish;
 *  - inside tags: names, strings (Python unicode-escape decoding), integers,
 *    floats and operators; `}}`/`%}` end a tag only when brackets balance.
 * Tokens and decoded strings live in the template arena. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_lexer.h"

typedef struct {
    jarena *arena;
    const char *s;
    size_t n, pos;
    int line;
    size_t line_pos; /* offset up to which `line` counts newlines */
    jtok *toks;
    size_t n_toks, cap;
    const char *name;
    char *err;
    size_t errlen;
    int depth_guard;
} lexer;

static int lx_fail(lexer *L, int line, const char *fmt, const char *arg) {
    int n = snprintf(L->err, L->errlen, "%s:%d: ", L->name, line);
    if (n < 0 || (size_t)n >= L->errlen) n = 0;
    snprintf(L->err + n, L->errlen - (size_t)n, fmt, arg);
    return -1;
}

static int line_at(lexer *L, size_t off) {
    while (L->line_pos < off && L->line_pos < L->n) {
        if (L->s[L->line_pos] == '\n') L->line++;
        L->line_pos++;
    }
    return L->line;
}

static jtok *push(lexer *L, int type, int line) {
    if (L->n_toks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *nt = jarena_alloc(L->arena, nc * sizeof(jtok));
        if (!nt) return NULL;
        if (L->n_toks) memcpy(nt, L->toks, L->n_toks * sizeof(jtok));
        L->toks = nt;
        L->cap = nc;
    }
    jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int push_data(lexer *L, const char *p, size_t len, int line) {
    if (!len) return 0;
    jtok *t = push(L, T_DATA, line);
    if (!t) return lx_fail(L, line, "%s", "out of memory");
    t->s = p;
    t->len = len;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* jinja2's OptionalLStrip handling of the text before a tag. */
static size_t strip_text(const char *text, size_t len, char sign, int is_var, int line_starting) {
    if (sign == '-') {
        while (len && is_ws(text[len - 1])) len--;
        return len;
    }
    if (sign == '+' || is_var) return len;
    size_t l_pos = 0;
    for (size_t i = len; i > 0; i--)
        if (text[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    if (l_pos == 0 && !line_starting) return len;
    if (l_pos == len) return len; /* fullmatch of \s+ on "" fails */
    for (size_t i = l_pos; i < len; i++)
        if (!is_ws(text[i])) return len;
    return l_pos;
}

/* Decode a Python string literal body with unicode-escape rules. */
static int decode_string(lexer *L, const char *p, size_t len, int line, jtok *t) {
    char *o = jarena_alloc(L->arena, len * 2 + 1);
    if (!o) return lx_fail(L, line, "%s", "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = p[i];
        if (ch != '\\' || i + 1 >= len) {
            o[k++] = ch;
            continue;
        }
        char e = p[++i];
        uint32_t cp;
        int hex = 0;
        switch (e) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i + 1 < len && p[i + 1] >= '0' && p[i + 1] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(p[++i] - '0');
                k += (size_t)kn_utf8_put(o + k, cp);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (hex) {
            cp = 0;
            for (int d = 0; d < hex; d++) {
                if (i + 1 >= len || !isxdigit((unsigned char)p[i + 1]))
                    return lx_fail(L, line, "%s", "invalid \\x, \\u or \\U escape in string literal");
                char h = p[++i];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            if (cp > 0x10ffff) return lx_fail(L, line, "%s", "invalid \\U escape in string literal");
            k += (size_t)kn_utf8_put(o + k, cp);
        }
    }
    o[k] = 0;
    t->s = o;
    t->len = k;
    return 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char ops1[] = "+-/*%~[](){}><=.:|,;";

/* Lex tag contents from L->pos until the tag end. kind: T_VAR_END / T_BLOCK_END.
 * Returns 0 and sets *line_starting; -1 on error. */
static int lex_tag(lexer *L, int end_kind, int *line_starting) {
    char balance[256];
    int nb = 0;
    const char *end2 = end_kind == T_VAR_END ? "}}" : "%}";
    for (;;) {
        size_t i = L->pos;
        int line = line_at(L, i);
        if (i >= L->n) {
            jtok *t = push(L, T_EOF, line);
            (void)t;
            return 1; /* unterminated: the parser reports it */
        }
        char ch = L->s[i];
        if (is_ws(ch)) {
            L->pos++;
            continue;
        }
        if (nb == 0) {
            int minus = ch == '-' && i + 3 <= L->n && !strncmp(L->s + i + 1, end2, 2);
            int plus = end_kind == T_BLOCK_END && ch == '+' && i + 3 <= L->n && !strncmp(L->s + i + 1, end2, 2);
            int plain = i + 1 < L->n && !strncmp(L->s + i, end2, 2);
            if (minus || plus || plain) {
                jtok *t = push(L, end_kind, line);
                if (!t) return lx_fail(L, line, "%s", "out of memory");
                size_t e = i + (minus || plus ? 3 : 2);
                if (minus) {
                    while (e < L->n && is_ws(L->s[e])) e++;
                } else if (plain && end_kind == T_BLOCK_END && e < L->n && L->s[e] == '\n') {
                    e++; /* trim_blocks */
                }
                *line_starting = e > 0 && L->s[e - 1] == '\n';
                L->pos = e;
                return 0;
            }
        }
        /* numbers: find the literal's extent, then convert a copy without '_' */
        if (isdigit((unsigned char)ch)) {
            size_t j = i;
            int is_float = 0, base = 10;
            if (ch == '0' && j + 1 < L->n && strchr("bBoOxX", L->s[j + 1]) && L->s[j + 1]) {
                base = strchr("bB", L->s[j + 1]) ? 2 : strchr("oO", L->s[j + 1]) ? 8 : 16;
                j += 2;
                while (j < L->n && (isxdigit((unsigned char)L->s[j]) || L->s[j] == '_')) j++;
            } else {
#define DIGIT_RUN() \
    while (j < L->n && (isdigit((unsigned char)L->s[j]) || (L->s[j] == '_' && j + 1 < L->n && isdigit((unsigned char)L->s[j + 1])))) j++
                DIGIT_RUN();
                if (j + 1 < L->n && L->s[j] == '.' && isdigit((unsigned char)L->s[j + 1])) {
                    is_float = 1;
                    j++;
                    DIGIT_RUN();
                }
                if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
                    size_t k = j + 1;
                    if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
                    if (k < L->n && isdigit((unsigned char)L->s[k])) {
                        is_float = 1;
                        j = k;
                        DIGIT_RUN();
                    }
                }
#undef DIGIT_RUN
            }
            size_t from = base == 10 ? i : i + 2, bn = 0;
            char *buf = jarena_alloc(L->arena, j - i + 1);
            if (!buf) return lx_fail(L, line, "%s", "out of memory");
            for (size_t m = from; m < j; m++)
                if (L->s[m] != '_') buf[bn++] = L->s[m];
            buf[bn] = 0;
            jtok *t = push(L, is_float ? T_FLOAT : T_INT, line);
            if (!t) return lx_fail(L, line, "%s", "out of memory");
            if (is_float) {
                t->fval = strtod(buf, NULL);
            } else {
                char *end = NULL;
                errno = 0;
                unsigned long long u = bn ? strtoull(buf, &end, base) : 0;
                if (!bn || (end && *end)) return lx_fail(L, line, "%s", "invalid integer literal");
                if (errno == ERANGE || u > (unsigned long long)INT64_MAX)
                    return lx_fail(L, line, "%s", "integer literal is too large for kiln (64-bit)");
                t->ival = (int64_t)u;
            }
            L->pos = j;
            continue;
        }
        if (isalpha((unsigned char)ch) || ch == '_') {
            size_t j = i;
            while (j < L->n && (isalnum((unsigned char)L->s[j]) || L->s[j] == '_')) j++;
            jtok *t = push(L, T_NAME, line);
            if (!t) return lx_fail(L, line, "%s", "out of memory");
            t->s = jarena_strndup(L->arena, L->s + i, j - i);
            if (!t->s) return lx_fail(L, line, "%s", "out of memory");
            t->len = j - i;
            L->pos = j;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < L->n && L->s[j] != ch) {
                if (L->s[j] == '\\' && j + 1 < L->n) j++;
                j++;
            }
            if (j >= L->n) {
                char c2[2] = {ch, 0};
                return lx_fail(L, line, "unexpected char \"%s\" (unterminated string)", c2);
            }
            jtok *t = push(L, T_STRING, line);
            if (!t) return lx_fail(L, line, "%s", "out of memory");
            if (decode_string(L, L->s + i + 1, j - i - 1, line, t)) return -1;
            L->pos = j + 1;
            continue;
        }
        const char *op = NULL;
        for (int k = 0; ops2[k]; k++)
            if (i + 1 < L->n && !strncmp(L->s + i, ops2[k], 2)) op = ops2[k];
        if (!op) {
            const char *p = strchr(ops1, ch);
            if (p && ch) {
                static const char *const single[] = {"+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}",
                                                     ">", "<", "=", ".", ":", "|", ",", ";"};
                op = single[p - ops1];
            }
        }
        if (!op) {
            char c2[8];
            snprintf(c2, sizeof c2, "%c", isprint((unsigned char)ch) ? ch : '?');
            return lx_fail(L, line, "unexpected char '%s'", c2);
        }
        if (op[1] == 0 && (op[0] == '(' || op[0] == '[' || op[0] == '{')) {
            if (nb >= (int)sizeof balance) return lx_fail(L, line, "%s", "brackets nested too deeply");
            balance[nb++] = op[0] == '(' ? ')' : op[0] == '[' ? ']' : '}';
        } else if (op[1] == 0 && (op[0] == ')' || op[0] == ']' || op[0] == '}')) {
            if (nb == 0) return lx_fail(L, line, "unexpected '%s'", op);
            if (balance[nb - 1] != op[0]) {
                char m[48];
                snprintf(m, sizeof m, "unexpected '%c', expected '%c'", op[0], balance[nb - 1]);
                return lx_fail(L, line, "%s", m);
            }
            nb--;
        }
        jtok *t = push(L, T_OP, line);
        if (!t) return lx_fail(L, line, "%s", "out of memory");
        t->s = op;
        t->len = strlen(op);
        L->pos = i + strlen(op);
    }
}

/* Match `{%[-+]?\s*WORD\s*(-%}|%}|+%})` at i; returns end offset (after the
 * tag, with trim handling applied) or 0. *sign gets the opening sign. */
static size_t match_word_tag(lexer *L, size_t i, const char *word, char *sign, int allow_plus_end) {
    const char *s = L->s;
    size_t n = L->n, j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    while (j < n && is_ws(s[j])) j++;
    size_t wl = strlen(word);
    if (j + wl > n || strncmp(s + j, word, wl)) return 0;
    j += wl;
    if (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) return 0;
    while (j < n && is_ws(s[j])) j++;
    if (j + 3 <= n && s[j] == '-' && !strncmp(s + j + 1, "%}", 2)) {
        j += 3;
        while (j < n && is_ws(s[j])) j++;
        return j;
    }
    if (allow_plus_end && j + 3 <= n && s[j] == '+' && !strncmp(s + j + 1, "%}", 2)) return j + 3;
    if (j + 2 <= n && !strncmp(s + j, "%}", 2)) {
        j += 2;
        if (allow_plus_end && j < n && s[j] == '\n') j++;
        return j;
    }
    return 0;
}

int kn_jinja_lex(jarena *arena, const char *src, size_t len, const char *name, jtok **out, size_t *n_out, char *err,
                 size_t errlen) {
    /* normalize newlines, drop one trailing newline */
    char *s = jarena_alloc(arena, len + 1);
    if (!s) {
        snprintf(err, errlen, "%s: out of memory", name);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;

    lexer L = {.arena = arena, .s = s, .n = n, .line = 1, .name = name, .err = err, .errlen = errlen};
    int line_starting = 1;
    while (L.pos < L.n) {
        /* next tag start */
        size_t i = L.pos;
        const char *p = s + i;
        size_t t0 = (size_t)-1;
        while ((p = memchr(p, '{', (size_t)(s + n - p))) != NULL) {
            if (p + 1 < s + n && (p[1] == '{' || p[1] == '%' || p[1] == '#')) {
                t0 = (size_t)(p - s);
                break;
            }
            p++;
        }
        if (t0 == (size_t)-1) {
            if (push_data(&L, s + i, n - i, line_at(&L, i))) return -1;
            L.pos = n;
            break;
        }
        const char *text = s + i;
        size_t text_len = t0 - i;
        char kind = s[t0 + 1];
        char sign = (t0 + 2 < n && (s[t0 + 2] == '-' || s[t0 + 2] == '+')) ? s[t0 + 2] : 0;
        char rsign = 0;
        size_t raw_end = kind == '%' ? match_word_tag(&L, t0, "raw", &rsign, 0) : 0;
        if (raw_end) sign = rsign;
        int text_line = line_at(&L, i);
        size_t kept = strip_text(text, text_len, sign, kind == '{', line_starting);
        if (push_data(&L, text, kept, text_line)) return -1;
        int tag_line = line_at(&L, t0);

        if (raw_end) {
            /* find {% endraw %} */
            size_t j = raw_end, body_end = 0, after = 0;
            char esign = 0;
            for (; j + 1 < n; j++) {
                if (s[j] == '{' && s[j + 1] == '%') {
                    size_t e = match_word_tag(&L, j, "endraw", &esign, 1);
                    if (e) {
                        body_end = j;
                        after = e;
                        break;
                    }
                }
            }
            if (!after) return lx_fail(&L, tag_line, "%s", "Missing end of raw directive");
            size_t keep = strip_text(s + raw_end, body_end - raw_end, esign, 0, 0);
            if (push_data(&L, s + raw_end, keep, line_at(&L, raw_end))) return -1;
            line_starting = s[after - 1] == '\n';
            L.pos = after;
            continue;
        }
        if (kind == '#') {
            size_t j = t0 + 2;
            const char *q = NULL;
            for (; j + 1 < n; j++)
                if (s[j] == '#' && s[j + 1] == '}') {
                    q = s + j;
                    break;
                }
            if (!q) return lx_fail(&L, tag_line, "%s", "Missing end of comment tag");
            size_t e = j + 2;
            char es = j > t0 + 2 ? s[j - 1] : 0;
            if (es == '-') {
                while (e < n && is_ws(s[e])) e++;
            } else if (es != '+' && e < n && s[e] == '\n') {
                e++;
            }
            line_starting = s[e - 1] == '\n';
            L.pos = e;
            continue;
        }
        jtok *t = push(&L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, tag_line);
        if (!t) return lx_fail(&L, tag_line, "%s", "out of memory");
        L.pos = t0 + 2 + (sign ? 1 : 0);
        int rc = lex_tag(&L, kind == '{' ? T_VAR_END : T_BLOCK_END, &line_starting);
        if (rc < 0) return -1;
        if (rc > 0) break; /* EOF inside a tag; EOF token pushed */
    }
    if (!L.n_toks || L.toks[L.n_toks - 1].type != T_EOF)
        if (!push(&L, T_EOF, line_at(&L, L.n))) return lx_fail(&L, L.line, "%s", "out of memory");
    *out = L.toks;
    *n_out = L.n_toks;
    return 0;
}

/* json_util.c — see json_util.h. */
#include "server/json_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

int kn_json_get_bool(json_t *o, const char *key, int *out, char *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return snprintf(err, KN_ERRMSG, "'%s' must be a boolean", key), -1;
    *out = json_is_true(v);
    return 0;
}

int kn_json_get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, char *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return snprintf(err, KN_ERRMSG, "'%s' must be an integer", key), -1;
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return snprintf(err, KN_ERRMSG, "'%s' must be between %lld and %lld (got %lld)", key, lo, hi, x), -1;
    *out = x;
    return 0;
}

int kn_json_get_num(json_t *o, const char *key, double lo, double hi, double *out, char *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return snprintf(err, KN_ERRMSG, "'%s' must be a number", key), -1;
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return snprintf(err, KN_ERRMSG, "'%s' must be between %g and %g (got %g)", key, lo, hi, x), -1;
    *out = x;
    return 0;
}

int kn_json_get_str(json_t *o, const char *key, size_t max_len, const char **out, char *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return snprintf(err, KN_ERRMSG, "'%s' must be a string", key), -1;
    if (json_string_length(v) > max_len)
        return snprintf(err, KN_ERRMSG, "'%s' is longer than %zu bytes", key, max_len), -1;
    *out = json_string_value(v);
    return 0;
}

int kn_json_check_keys(json_t *o, const char *const *allowed, const char *where, char *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(k, allowed[i]);
        if (!ok) {
            snprintf(err, KN_ERRMSG, "unknown field '%.64s'%s%s", k, where ? " in " : "", where ? where : "");
            return -1;
        }
    }
    return 0;
}

void kn_buf_add(kn_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *nd = realloc(b->data, cap);
        if (!nd) {
            b->oom = 1;
            return;
        }
        b->data = nd, b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void kn_buf_puts(kn_buf *b, const char *s) { kn_buf_add(b, s, strlen(s)); }

void kn_buf_printf(kn_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        kn_buf_add(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kn_buf_add(b, big, (size_t)n);
    free(big);
}

static int dump_cb(const char *buf, size_t size, void *data) {
    kn_buf_add(data, buf, size);
    return 0;
}

void kn_buf_json(kn_buf *b, const json_t *j) { json_dump_callback(j, dump_cb, b, JSON_COMPACT); }

void kn_buf_sse(kn_buf *b, const char *event, json_t *j) {
    if (event) kn_buf_printf(b, "event: %s\n", event);
    kn_buf_puts(b, "data: ");
    kn_buf_json(b, j);
    kn_buf_puts(b, "\n\n");
    json_decref(j);
}

void kn_buf_free(kn_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* length of a valid UTF-8 sequence at s (n bytes left), 0 if invalid */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (len == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
    if (len == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
    return len;
}

json_t *kn_json_text(const char *s, size_t len) {
    json_t *j = json_stringn(s, len);
    if (j) return j;
    kn_buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_len(u + i, len - i);
        if (l && !(l == 1 && u[i] == 0)) kn_buf_add(&b, s + i, l), i += l;
        else kn_buf_add(&b, "\xef\xbf\xbd", 3), i++;
    }
    j = json_stringn(b.data ? b.data : "", b.len);
    kn_buf_free(&b);
    return j;
}

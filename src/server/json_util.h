/* json_util.h — strict request-field readers over jansson and a growable
 * byte buffer for response bodies.
 *
 * Every reader takes the object, the field name and bounds, and on a wrong
 * type or out-of-range value writes one message naming the field into err
 * and returns -1 (0 = ok or absent: absent leaves *out untouched, so callers
 * preset defaults). JSON null counts as absent, as the OpenAI API treats it. */
#ifndef KN_SERVER_JSON_UTIL_H
#define KN_SERVER_JSON_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define KN_ERRMSG 256

int kn_json_get_bool(json_t *o, const char *key, int *out, char *err);
int kn_json_get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, char *err);
int kn_json_get_num(json_t *o, const char *key, double lo, double hi, double *out, char *err);
/* *out borrows the string (valid while o lives); max_len bounds its length in bytes */
int kn_json_get_str(json_t *o, const char *key, size_t max_len, const char **out, char *err);
/* Fail on any key of o not in the NULL-terminated list allowed. */
int kn_json_check_keys(json_t *o, const char *const *allowed, const char *where, char *err);

typedef struct {
    char *data;
    size_t len, cap;
    int oom;
} kn_buf;

void kn_buf_add(kn_buf *b, const char *s, size_t n);
void kn_buf_puts(kn_buf *b, const char *s);
void kn_buf_printf(kn_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append the compact JSON encoding of j (j is not consumed). */
void kn_buf_json(kn_buf *b, const json_t *j);
/* Append "data: <json>\n\n" and consume j (json_decref). */
void kn_buf_sse(kn_buf *b, const char *event, json_t *j);
void kn_buf_free(kn_buf *b);

/* A JSON string from len bytes (invalid UTF-8 replaced by U+FFFD so a
 * half-decoded token never breaks the encoder). New reference. */
json_t *kn_json_text(const char *s, size_t len);

#endif

/* multipart.c — multipart/form-data parsing for the audio endpoints (see
 * multipart.h). Layout of a body (RFC 2046 5.1.1):
 *
 *   [preamble CRLF] --B [LWSP] CRLF headers CRLF CRLF data CRLF --B ... CRLF --B-- [epilogue]
 *
 * Header lines are "Name: value"; Content-Disposition carries the field name
 * and filename as parameters (quoted strings may hold \" escapes; browsers
 * and undici percent-encode quotes instead, which is kept as is). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "server/multipart.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

static int bchar_ok(unsigned char c) {
    return isalnum(c) || strchr("'()+_,-./:=? ", c) != NULL;
}

/* Skip spaces and tabs in [p, end). */
static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* Read one parameter value (quoted-string or token) from [p, end) into out
 * (cap bytes with the NUL); returns the position after it, or NULL when it
 * does not fit or is malformed. */
static const char *param_value(const char *p, const char *end, char *out, size_t cap) {
    size_t n = 0;
    if (p < end && *p == '"') {
        p++;
        while (p < end && *p != '"') {
            if (*p == '\\' && p + 1 < end) p++;
            if ((unsigned char)*p < 0x20 && *p != '\t') return NULL;
            if (n + 1 >= cap) return NULL;
            out[n++] = *p++;
        }
        if (p >= end) return NULL; /* unterminated quote */
        p++;
    } else {
        while (p < end && *p != ';' && *p != ' ' && *p != '\t') {
            if ((unsigned char)*p < 0x21 || *p == '"') return NULL;
            if (n + 1 >= cap) return NULL;
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return p;
}

/* Iterate "; key=value" parameters of a header value starting at p.
 * Calls back with each key (lower-case compared by the caller). Returns 0
 * or -1 on a malformed parameter. */
typedef int (*param_fn)(void *user, const char *key, size_t key_len, const char *value);

static int each_param(const char *p, const char *end, param_fn fn, void *user, char *scratch, size_t cap) {
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end) return 0;
        if (*p != ';') return -1;
        p = skip_ws(p + 1, end);
        if (p >= end) return 0; /* a trailing ';' */
        const char *k = p;
        while (p < end && *p != '=' && *p != ';' && *p != ' ' && *p != '\t') p++;
        size_t kl = (size_t)(p - k);
        p = skip_ws(p, end);
        if (kl == 0 || p >= end || *p != '=') return -1;
        p = skip_ws(p + 1, end);
        const char *after = param_value(p, end, scratch, cap);
        if (!after) return -1;
        if (fn(user, k, kl, scratch)) return -1;
        p = after;
    }
}

static int key_is(const char *k, size_t kl, const char *want) {
    return strlen(want) == kl && !strncasecmp(k, want, kl);
}

typedef struct {
    char *boundary;
    size_t cap;
    int found;
} boundary_ctx;

static int boundary_param(void *user, const char *k, size_t kl, const char *v) {
    boundary_ctx *b = user;
    if (!key_is(k, kl, "boundary")) return 0;
    if (b->found) return -1; /* twice */
    size_t n = strlen(v);
    if (n == 0 || n > KN_MP_MAX_BOUNDARY || n + 1 > b->cap || v[n - 1] == ' ') return -1;
    for (size_t i = 0; i < n; i++)
        if (!bchar_ok((unsigned char)v[i])) return -1;
    memcpy(b->boundary, v, n + 1);
    b->found = 1;
    return 0;
}

kn_code kn_multipart_boundary(const char *content_type, char *boundary, size_t cap, kn_error *err) {
    static const char want[] = "multipart/form-data";
    if (!content_type)
        return kn_fail(err, KN_ERR_FORMAT, "the request must be multipart/form-data (no Content-Type header)");
    const char *end = content_type + strlen(content_type);
    const char *p = skip_ws(content_type, end);
    if ((size_t)(end - p) < sizeof want - 1 || strncasecmp(p, want, sizeof want - 1))
        return kn_fail(err, KN_ERR_FORMAT, "the request must be multipart/form-data (Content-Type is \"%.80s\")",
                       content_type);
    p += sizeof want - 1;
    char scratch[KN_MP_MAX_BOUNDARY + 2];
    boundary_ctx b = {.boundary = boundary, .cap = cap};
    if (each_param(p, end, boundary_param, &b, scratch, sizeof scratch) || !b.found)
        return kn_fail(err, KN_ERR_FORMAT,
                       "multipart/form-data needs a boundary parameter of 1 to %d characters in Content-Type",
                       KN_MP_MAX_BOUNDARY);
    return KN_OK;
}

typedef struct {
    kn_mp_part *part;
    int has_name;
} disp_ctx;

static int disposition_param(void *user, const char *k, size_t kl, const char *v) {
    disp_ctx *d = user;
    if (key_is(k, kl, "name")) {
        if (d->has_name || strlen(v) >= sizeof d->part->name) return -1;
        strcpy(d->part->name, v);
        d->has_name = 1;
    } else if (key_is(k, kl, "filename")) {
        if (d->part->has_filename || strlen(v) >= sizeof d->part->filename) return -1;
        strcpy(d->part->filename, v);
        d->part->has_filename = 1;
    } /* filename*= and others: ignored */
    return 0;
}

/* Parse the header block [p, end) (lines separated by CRLF) into part. */
static kn_code part_headers(const char *p, const char *end, int index, kn_mp_part *part, kn_error *err) {
    int have_disp = 0;
    char scratch[512];
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (!eol) eol = end;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p)
            return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: malformed header line", index + 1);
        for (const char *q = p; q < eol; q++)
            if ((unsigned char)*q < 0x20 && *q != '\t')
                return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: control character in a header", index + 1);
        const char *v = skip_ws(colon + 1, eol);
        const char *ve = eol;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        size_t nl = (size_t)(colon - p);
        if (key_is(p, nl, "content-disposition")) {
            if (have_disp)
                return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: two Content-Disposition headers", index + 1);
            have_disp = 1;
            static const char fd[] = "form-data";
            if ((size_t)(ve - v) < sizeof fd - 1 || strncasecmp(v, fd, sizeof fd - 1) ||
                (ve - v > (long)sizeof fd - 1 && v[sizeof fd - 1] != ';' && v[sizeof fd - 1] != ' ' &&
                 v[sizeof fd - 1] != '\t'))
                return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: Content-Disposition is not form-data",
                               index + 1);
            disp_ctx d = {.part = part};
            if (each_param(v + sizeof fd - 1, ve, disposition_param, &d, scratch, sizeof scratch))
                return kn_fail(err, KN_ERR_FORMAT,
                               "multipart part %d: malformed Content-Disposition parameters (or a name / filename "
                               "that is too long)",
                               index + 1);
            if (!d.has_name)
                return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: Content-Disposition has no name", index + 1);
        } else if (key_is(p, nl, "content-type")) {
            size_t vl = (size_t)(ve - v);
            if (vl >= sizeof part->content_type) vl = sizeof part->content_type - 1;
            memcpy(part->content_type, v, vl);
            part->content_type[vl] = 0;
        } /* other headers (Content-Transfer-Encoding ...): ignored */
        p = eol == end ? end : eol + 2;
    }
    if (!have_disp)
        return kn_fail(err, KN_ERR_FORMAT, "multipart part %d: no Content-Disposition header", index + 1);
    return KN_OK;
}

kn_code kn_multipart_parse(const char *boundary, const char *body, size_t len, kn_mp_part *parts, int max_parts,
                           int *n_parts, kn_error *err) {
    *n_parts = 0;
    size_t bl = strlen(boundary);
    if (bl == 0 || bl > KN_MP_MAX_BOUNDARY) return kn_fail(err, KN_ERR_INVALID_ARG, "multipart: bad boundary");
    char delim[KN_MP_MAX_BOUNDARY + 4]; /* CRLF -- boundary */
    delim[0] = '\r', delim[1] = '\n', delim[2] = '-', delim[3] = '-';
    memcpy(delim + 4, boundary, bl);
    size_t dl = bl + 4;
    const char *end = body + len;
    const char *p;
    /* the first delimiter may open the body without its CRLF */
    if (len >= dl - 2 && !memcmp(body, delim + 2, dl - 2)) p = body + dl - 2;
    else {
        p = len ? memmem(body, len, delim, dl) : NULL;
        if (!p) return kn_fail(err, KN_ERR_FORMAT, "multipart body: the boundary from Content-Type never occurs");
        p += dl;
    }
    int n = 0;
    for (;;) {
        /* after a delimiter: "--" closes the body, else padding + CRLF */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') break;
        p = skip_ws(p, end);
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            return kn_fail(err, KN_ERR_FORMAT, "multipart body: a boundary line is not followed by CRLF%s",
                           p >= end ? " (body truncated?)" : "");
        p += 2;
        if (n == max_parts)
            return kn_fail(err, KN_ERR_FORMAT, "multipart body: more than %d parts", max_parts);
        kn_mp_part *part = &parts[n];
        memset(part, 0, sizeof *part);
        /* header block: up to the blank line */
        const char *hend;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') hend = p; /* no headers */
        else {
            size_t scan = (size_t)(end - p);
            if (scan > KN_MP_MAX_HEADER_BYTES + 4) scan = KN_MP_MAX_HEADER_BYTES + 4;
            hend = memmem(p, scan, "\r\n\r\n", 4);
            if (!hend)
                return kn_fail(err, KN_ERR_FORMAT,
                               end - p > KN_MP_MAX_HEADER_BYTES
                                   ? "multipart part %d: headers longer than the limit or unterminated"
                                   : "multipart part %d: unterminated headers (body truncated?)",
                               n + 1);
        }
        kn_code rc = part_headers(p, hend, n, part, err);
        if (rc) return rc;
        const char *data = hend + (hend == p ? 2 : 4);
        const char *close = data <= end ? memmem(data, (size_t)(end - data), delim, dl) : NULL;
        if (!close)
            return kn_fail(err, KN_ERR_FORMAT, "multipart part %d (\"%s\"): no closing boundary (body truncated?)",
                           n + 1, part->name);
        part->data = data;
        part->len = (size_t)(close - data);
        n++;
        p = close + dl;
    }
    *n_parts = n;
    return KN_OK;
}

const kn_mp_part *kn_multipart_get(const kn_mp_part *parts, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(parts[i].name, name)) return &parts[i];
    return NULL;
}

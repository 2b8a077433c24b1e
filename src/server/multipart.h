/* multipart.h — a bounded parser for multipart/form-data request bodies
 * (RFC 7578 over RFC 2046), as the OpenAI audio endpoints receive them.
 *
 * The whole body is already in memory (http.c bounds it by --max-body);
 * parsing makes no copies of part data: each part points into the body.
 * Every input is untrusted: the boundary is 1..70 characters, a part's
 * header block is at most KN_MP_MAX_HEADER_BYTES, at most KN_MP_MAX_PARTS
 * parts are accepted, names and filenames are bounded, and the work is
 * linear in the body length (one memmem scan per delimiter). Anything else
 * is a KN_ERR_FORMAT with one line saying what is wrong. */
#ifndef KN_SERVER_MULTIPART_H
#define KN_SERVER_MULTIPART_H

#include <stddef.h>

#include "base/status.h"

#define KN_MP_MAX_PARTS 64
#define KN_MP_MAX_HEADER_BYTES 8192
#define KN_MP_MAX_BOUNDARY 70

typedef struct {
    char name[128];         /* form field name (Content-Disposition name=) */
    char filename[256];     /* filename= when given ("" otherwise) */
    int has_filename;
    char content_type[128]; /* the part's Content-Type ("" when absent) */
    const char *data;       /* points into the body */
    size_t len;
} kn_mp_part;

/* Extract the boundary from a Content-Type header value
 * ("multipart/form-data; boundary=..."); boundary receives it NUL-terminated
 * (cap >= KN_MP_MAX_BOUNDARY + 1). */
kn_code kn_multipart_boundary(const char *content_type, char *boundary, size_t cap, kn_error *err);

/* Parse body into parts[0..*n_parts). */
kn_code kn_multipart_parse(const char *boundary, const char *body, size_t len, kn_mp_part *parts, int max_parts,
                           int *n_parts, kn_error *err);

/* The first part named name, or NULL. */
const kn_mp_part *kn_multipart_get(const kn_mp_part *parts, int n, const char *name);

#endif

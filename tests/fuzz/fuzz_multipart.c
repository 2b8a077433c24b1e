/* fuzz_multipart.c — libFuzzer target for the multipart/form-data parser of
 * the audio endpoints (src/server/multipart.c). Input: the Content-Type
 * header value up to the first '\n', then the body. Checks that every part
 * lies inside the body, names are NUL-terminated within their buffers, and
 * parsing never reads out of bounds (ASan) or loops (bounded time). */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    if (!nl) return 0;
    size_t hl = (size_t)(nl - data);
    char *ct = malloc(hl + 1);
    memcpy(ct, data, hl);
    ct[hl] = 0;
    size_t bl = size - hl - 1;
    char *body = malloc(bl ? bl : 1); /* its own allocation: ASan sees reads past the end */
    memcpy(body, nl + 1, bl);
    char boundary[KN_MP_MAX_BOUNDARY + 1];
    kn_error err = {0};
    kn_mp_part parts[8];
    int n = -1;
    if (kn_multipart_boundary(ct, boundary, sizeof boundary, &err) == KN_OK) {
        assert(strlen(boundary) >= 1 && strlen(boundary) <= KN_MP_MAX_BOUNDARY);
        if (kn_multipart_parse(boundary, body, bl, parts, 8, &n, &err) == KN_OK) {
            assert(n >= 0 && n <= 8);
            for (int i = 0; i < n; i++) {
                assert(parts[i].data >= body && parts[i].data + parts[i].len <= body + bl);
                assert(memchr(parts[i].name, 0, sizeof parts[i].name));
                assert(memchr(parts[i].filename, 0, sizeof parts[i].filename));
                assert(memchr(parts[i].content_type, 0, sizeof parts[i].content_type));
                assert(kn_multipart_get(parts, n, parts[i].name) != NULL);
            }
        } else assert(err.msg[0]);
    } else assert(err.msg[0]);
    free(ct);
    free(body);
    return 0;
}

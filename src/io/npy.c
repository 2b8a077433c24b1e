/* npy.c — see npy.h. The header is a Python dict literal; we write it in the
 * canonical form and parse only what we write (descr '<f4', fortran_order
 * False, a shape tuple), rejecting anything else with a clear error. */
#include "io/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file_util.h"

kn_code kn_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, kn_error *err) {
    if (ndim < 1 || ndim > 4) return kn_fail(err, KN_ERR_INVALID_ARG, "npy: ndim %d out of range", ndim);
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld%s", (long long)shape[i],
                      i + 1 < ndim ? ", " : ndim == 1 ? "," : "");
        count *= (size_t)shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* total header (magic 6 + version 2 + len 2 + dict + pad + \n) % 64 == 0 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return kn_fail(err, KN_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    uint16_t hlen = (uint16_t)((size_t)n + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, sizeof(float), count, f) == count;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return kn_fail(err, KN_ERR_IO, "error writing %s", path);
    return KN_OK;
}

kn_code kn_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[4], kn_error *err) {
    char *buf;
    size_t len;
    *data = NULL;
    kn_code rc = kn_read_file(path, (size_t)4 << 30, &buf, &len, err);
    if (rc) return rc;
    rc = KN_ERR_FORMAT;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        kn_fail(err, rc, "%s: not a .npy file", path);
        goto out;
    }
    size_t hlen, hstart;
    if (buf[6] == 1) {
        hlen = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8);
        hstart = 10;
    } else if (buf[6] == 2 || buf[6] == 3) {
        if (len < 12) { kn_fail(err, rc, "%s: truncated header", path); goto out; }
        hlen = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8) |
               ((size_t)(unsigned char)buf[10] << 16) | ((size_t)(unsigned char)buf[11] << 24);
        hstart = 12;
    } else {
        kn_fail(err, rc, "%s: unknown npy version %d", path, buf[6]);
        goto out;
    }
    if (hstart + hlen > len) { kn_fail(err, rc, "%s: truncated header", path); goto out; }
    char hdr[1024];
    size_t cp = hlen < sizeof hdr - 1 ? hlen : sizeof hdr - 1;
    memcpy(hdr, buf + hstart, cp);
    hdr[cp] = 0;
    if (!strstr(hdr, "'<f4'") || strstr(hdr, "'fortran_order': True")) {
        kn_fail(err, rc, "%s: only little-endian float32 C-order arrays are supported", path);
        goto out;
    }
    char *sp = strstr(hdr, "'shape': (");
    if (!sp) { kn_fail(err, rc, "%s: no shape in header", path); goto out; }
    sp += 10;
    *ndim = 0;
    size_t count = 1;
    while (*sp && *sp != ')') {
        char *end;
        long long v = strtoll(sp, &end, 10);
        if (end == sp) break;
        if (*ndim == 4 || v < 0) { kn_fail(err, rc, "%s: unsupported shape", path); goto out; }
        shape[(*ndim)++] = v;
        count *= (size_t)v;
        sp = end;
        while (*sp == ',' || *sp == ' ') sp++;
    }
    if (len - hstart - hlen != count * sizeof(float)) {
        kn_fail(err, rc, "%s: data size does not match shape", path);
        goto out;
    }
    *data = malloc(count * sizeof(float) + 1);
    if (!*data) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto out; }
    memcpy(*data, buf + hstart + hlen, count * sizeof(float));
    rc = KN_OK;
out:
    free(buf);
    return rc;
}

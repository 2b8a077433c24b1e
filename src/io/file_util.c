/* file_util.c — see file_util.h. */
#include "io/file_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

kn_code kn_read_file(const char *path, size_t max_bytes, char **out, size_t *len, kn_error *err) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kn_fail(err, KN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return kn_fail(err, KN_ERR_IO, "%s is not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return kn_fail(err, KN_ERR_FORMAT, "%s is too large (%lld bytes, limit %zu)", path, (long long)st.st_size,
                       max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory reading %s", path);
    }
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return kn_fail(err, KN_ERR_IO, "short read on %s", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return KN_OK;
}

int kn_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kn_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

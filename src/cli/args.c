/* args.c — see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <stdlib.h>

kn_code kn_parse_ids(const char *s, int32_t **ids, int *n, kn_error *err) {
    *ids = NULL;
    *n = 0;
    int cap = 64, cnt = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\n')) {
            free(v);
            return kn_fail(err, KN_ERR_INVALID_ARG, "--ids: \"%.40s\" is not a list of non-negative integers", s);
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) { free(v); return kn_fail(err, KN_ERR_NOMEM, "out of memory"); }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (!cnt) {
        free(v);
        return kn_fail(err, KN_ERR_INVALID_ARG, "--ids: no ids given");
    }
    *ids = v;
    *n = cnt;
    return KN_OK;
}

kn_code kn_parse_int(const char *flag, const char *s, long lo, long hi, long *out, kn_error *err) {
    char *end;
    errno = 0;
    long x = s ? strtol(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || x < lo || x > hi)
        return kn_fail(err, KN_ERR_INVALID_ARG, "%s expects an integer in [%ld, %ld], got \"%s\"", flag, lo, hi,
                       s ? s : "");
    *out = x;
    return KN_OK;
}

kn_code kn_parse_float(const char *flag, const char *s, double lo, double hi, double *out, kn_error *err) {
    char *end;
    errno = 0;
    double x = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno || !(x >= lo && x <= hi))
        return kn_fail(err, KN_ERR_INVALID_ARG, "%s expects a number in [%g, %g], got \"%s\"", flag, lo, hi,
                       s ? s : "");
    *out = x;
    return KN_OK;
}

kn_code kn_parse_u64(const char *flag, const char *s, uint64_t *out, kn_error *err) {
    char *end;
    errno = 0;
    unsigned long long x = s ? strtoull(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || *s == '-')
        return kn_fail(err, KN_ERR_INVALID_ARG, "%s expects a non-negative integer, got \"%s\"", flag, s ? s : "");
    *out = x;
    return KN_OK;
}

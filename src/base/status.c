/* status.c — kn_error helpers (see status.h). */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

kn_code kn_fail(kn_error *err, kn_code code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

kn_code kn_fail_wrap(kn_error *err, const char *fmt, ...) {
    if (!err) return KN_ERR_INTERNAL;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->code;
}

const char *kn_code_name(kn_code code) {
    switch (code) {
    case KN_OK: return "ok";
    case KN_ERR_IO: return "i/o error";
    case KN_ERR_FORMAT: return "malformed input";
    case KN_ERR_UNSUPPORTED: return "unsupported";
    case KN_ERR_INVALID_ARG: return "invalid argument";
    case KN_ERR_NOMEM: return "out of memory";
    case KN_ERR_NOT_FOUND: return "not found";
    case KN_ERR_BACKEND: return "backend error";
    case KN_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

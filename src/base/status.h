/* status.h — errors as values.
 *
 * Every fallible function returns a kn_code and, when given a non-NULL
 * kn_error, fills it with one human-readable line. Callers propagate the code;
 * only the CLI prints the message. Nothing in the library aborts on bad input. */
#ifndef KN_BASE_STATUS_H
#define KN_BASE_STATUS_H

#include "kiln/kiln.h"

/* Set err (if non-NULL) to code + printf-style message; returns code so that
 * callers can write `return kn_fail(err, KN_ERR_FORMAT, "...", ...);`. */
kn_code kn_fail(kn_error *err, kn_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing message with context ("loading x: <old message>"). */
kn_code kn_fail_wrap(kn_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

/* args.h — small, strict argument parsers for the CLI: every malformed value
 * is an error message, never a silent default. */
#ifndef KN_CLI_ARGS_H
#define KN_CLI_ARGS_H

#include <stdint.h>

#include "base/status.h"

/* "1,2,3" (also spaces) -> heap array of ids (caller frees). */
kn_code kn_parse_ids(const char *s, int32_t **ids, int *n, kn_error *err);
kn_code kn_parse_int(const char *flag, const char *s, long lo, long hi, long *out, kn_error *err);
kn_code kn_parse_float(const char *flag, const char *s, double lo, double hi, double *out, kn_error *err);
kn_code kn_parse_u64(const char *flag, const char *s, uint64_t *out, kn_error *err);

#endif

/* file_util.h — whole-file reads with a size bound, and path helpers. */
#ifndef KN_IO_FILE_UTIL_H
#define KN_IO_FILE_UTIL_H

#include <stddef.h>

#include "base/status.h"

/* Read all of path into a NUL-terminated heap buffer (caller frees). Fails
 * with KN_ERR_IO if unreadable, KN_ERR_FORMAT if larger than max_bytes. */
kn_code kn_read_file(const char *path, size_t max_bytes, char **out, size_t *len, kn_error *err);

/* 1 if path names an existing regular file / directory. */
int kn_is_file(const char *path);
int kn_is_dir(const char *path);

#endif

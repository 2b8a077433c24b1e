/* st_writer.h — streaming safetensors writer.
 *
 * All tensors are declared up front (the header carries every offset); their
 * bytes are then appended in declaration order with kn_st_writer_put, so a
 * checkpoint larger than memory can be produced one tensor at a time.
 * Offsets are contiguous (no padding), as the format requires. */
#ifndef KN_IO_ST_WRITER_H
#define KN_IO_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

#define KN_STW_MAX_DIMS 8

typedef struct {
    const char *name; /* copied */
    kn_dtype dtype;
    int ndim;
    int64_t shape[KN_STW_MAX_DIMS];
} kn_stw_desc;

typedef struct kn_st_writer kn_st_writer;

/* Create path (truncating) and write the header; metadata_format ("mlx",
 * "pt") goes into __metadata__.format, NULL for none. */
kn_code kn_st_writer_open(const char *path, const kn_stw_desc *t, size_t n, const char *metadata_format,
                          kn_st_writer **out, kn_error *err);
/* Bytes of the next declared tensor (nbytes must equal its declared size). */
kn_code kn_st_writer_put(kn_st_writer *w, const void *data, size_t nbytes, kn_error *err);
/* Check every tensor was written, flush and close; frees w in all cases. */
kn_code kn_st_writer_close(kn_st_writer *w, kn_error *err);
/* Abandon: close and delete the partial file. NULL is a no-op. */
void kn_st_writer_abort(kn_st_writer *w);

#endif

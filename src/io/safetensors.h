/* safetensors.h — read-only, mmap-backed safetensors checkpoints.
 *
 * A checkpoint is one `model.safetensors` or a set of shards listed by
 * `model.safetensors.index.json`. Every header is untrusted input and is
 * validated before any tensor is exposed: bounded header size, valid JSON,
 * known dtypes, shape x dtype size == byte length, offsets inside the data
 * section, no overlapping tensors. Tensor data pointers point into the
 * mapping and stay valid until kn_st_close(). */
#ifndef KN_IO_SAFETENSORS_H
#define KN_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

#define KN_ST_MAX_DIMS 8
#define KN_ST_MAX_HEADER (100u << 20) /* 100 MiB, as the reference library */

typedef struct {
    char *name;
    kn_dtype dtype;
    int ndim;
    int64_t shape[KN_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* into the mapping (or the parsed buffer) */
} kn_st_tensor;

typedef struct kn_safetensors kn_safetensors;

/* Parse and validate one whole safetensors file image (header + data) held in
 * memory. On success *tensors / *n_tensors describe it (data points into buf).
 * Free with kn_st_tensors_free. This is the fuzzing entry point. */
kn_code kn_st_parse(const uint8_t *buf, size_t len, kn_st_tensor **tensors, size_t *n_tensors,
                    kn_error *err);
void kn_st_tensors_free(kn_st_tensor *tensors, size_t n);

/* Open a checkpoint: a directory (index.json shards, or model.safetensors, or
 * the single *.safetensors it holds) or a path to one .safetensors file. */
kn_code kn_st_open(const char *path, kn_safetensors **out, kn_error *err);
void kn_st_close(kn_safetensors *st);

/* Drops the mappings' pages from the process (MADV_DONTNEED; the files are
 * mapped read-only, so the bytes stay as they are and a later read faults
 * them in again from the page cache). For after a load that copied what it
 * keeps using: the resident set then holds the copies only. */
void kn_st_release_pages(kn_safetensors *st);

size_t kn_st_count(const kn_safetensors *st);
const kn_st_tensor *kn_st_at(const kn_safetensors *st, size_t i);
/* Lookup by exact name; NULL when absent. */
const kn_st_tensor *kn_st_find(const kn_safetensors *st, const char *name);

#endif

/* npy.h — NumPy .npy files (version 1.0/2.0, little-endian float32, C order):
 * write for `kiln logits`, read for tests against reference fixtures. */
#ifndef KN_IO_NPY_H
#define KN_IO_NPY_H

#include <stdint.h>

#include "base/status.h"

/* Write a float32 array of ndim (1..4) dims. */
kn_code kn_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, kn_error *err);

/* Read a float32 ('<f4') C-order array; *data is heap (caller frees). */
kn_code kn_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[4], kn_error *err);

#endif

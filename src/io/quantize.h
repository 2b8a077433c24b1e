/* quantize.h — `kiln quantize`: write an MLX affine-quantized checkpoint
 * (mlx-lm layout: <module>.weight packed U32, .scales, .biases; config.json
 * "quantization" {"group_size", "bits"}) from a bf16/f16/f32 one. */
#ifndef KN_IO_QUANTIZE_H
#define KN_IO_QUANTIZE_H

#include "base/status.h"

typedef struct {
    int bits;       /* 2, 4 or 8 */
    int group_size; /* 32, 64 or 128 */
    int force;      /* 1: write into an existing OUT_DIR (replacing files) */
} kn_quantize_opts;

typedef struct {
    int n_quantized, n_kept; /* tensors */
    double bytes_in, bytes_out;
} kn_quantize_stats;

/* Which tensors are quantized: 2-D float ".weight" tensors of the language
 * model (every Linear and the embedding) whose column count splits into
 * groups and that have at least 16 rows; MoE experts/routers, vision towers,
 * norms, biases and small tensors stay as they are. */
int kn_quantize_selects(const char *name, int ndim, const int64_t *shape, int group_size);

kn_code kn_quantize_checkpoint(const char *in_dir, const char *out_dir, const kn_quantize_opts *o,
                               kn_quantize_stats *stats, kn_error *err);

#endif

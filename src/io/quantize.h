/* quantize.h — `kiln quantize`: write an MLX affine-quantized checkpoint
 * (mlx-lm layout: <module>.weight packed U32, .scales, .biases; config.json
 * "quantization" {"group_size", "bits", "<module path>": {...} for modules
 * quantized differently}) from a bf16/f16/f32 one.
 *
 * Mixed precision follows mlx-lm's recipes (its convert --quant-predicate):
 * mixed_L_H quantizes to L bits except lm_head, and v_proj / down_proj in the
 * layers that "use more bits", which get H: the first and last eighth of the
 * layers and every third layer between (index i with i < n/8, i >= 7n/8 or
 * (i - n/8) % 3 == 2). Recipes: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6. */
#ifndef KN_IO_QUANTIZE_H
#define KN_IO_QUANTIZE_H

#include "base/status.h"

typedef struct {
    int bits;          /* 2, 3, 4, 5, 6 or 8 (ignored with a recipe) */
    int group_size;    /* 32, 64 or 128 */
    int force;         /* 1: write into an existing OUT_DIR (replacing files) */
    const char *mixed; /* NULL or a mixed-precision recipe name (above) */
} kn_quantize_opts;

typedef struct {
    int n_quantized, n_kept; /* tensors */
    int n_high;              /* tensors given the recipe's higher bits */
    int low_bits, high_bits; /* the bits used (equal without a recipe) */
    double bytes_in, bytes_out;
} kn_quantize_stats;

/* The bits a recipe gives a tensor of a model with n_layers layers; 0 for an
 * unknown recipe (kn_quantize_recipe validates the name). */
int kn_quantize_recipe_bits(const char *recipe, const char *tensor, int n_layers);
/* 1 and the recipe's low/high bits if recipe names one. */
int kn_quantize_recipe(const char *recipe, int *low_bits, int *high_bits);

/* Which tensors are quantized: 2-D float ".weight" tensors of the language
 * model (every Linear and the embedding) whose column count splits into
 * groups and that have at least 16 rows; MoE experts/routers, vision towers,
 * norms, biases and small tensors stay as they are. */
int kn_quantize_selects(const char *name, int ndim, const int64_t *shape, int group_size);

kn_code kn_quantize_checkpoint(const char *in_dir, const char *out_dir, const kn_quantize_opts *o,
                               kn_quantize_stats *stats, kn_error *err);

#endif

/* synthetic.h — random weights at a real model's shape, in memory, so
 * benchmarks need no download (`kiln bench --synthetic CONFIG.json`). */
#ifndef KN_ENGINE_SYNTHETIC_H
#define KN_ENGINE_SYNTHETIC_H

#include "models/model.h"

typedef struct kn_synthetic kn_synthetic;

/* Create every tensor a checkpoint of cfg's family has (MoE experts in
 * transformers 5's fused layout), with values
 * uniform in [-scale, scale], in dtype dt. The store must outlive models
 * built from it (they use its memory in place). */
kn_code kn_synthetic_create(const kn_model_config *cfg, kn_dtype dt, uint64_t seed, int n_threads,
                            kn_synthetic **out, kn_error *err);
/* The same with every tensor `kiln quantize` would quantize (the embedding
 * and each Linear; MoE experts as mlx-lm's switch_mlp stacks, gemma4's
 * parallel experts excepted) in MLX affine form: random bits-bit codes in
 * groups of group_size, scales and biases in dt (bf16/f16, as mlx-community
 * checkpoints store them). bits 0 = kn_synthetic_create. */
kn_code kn_synthetic_create_quant(const kn_model_config *cfg, kn_dtype dt, int bits, int group_size, uint64_t seed,
                                  int n_threads, kn_synthetic **out, kn_error *err);
void kn_synthetic_free(kn_synthetic *s);
kn_tensor_source kn_synthetic_source(kn_synthetic *s);

#endif

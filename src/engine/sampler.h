/* sampler.h — next-token selection from a logits row: greedy, or seeded
 * sampling with temperature, top-k, top-p and min-p applied in that order
 * (the order of transformers' logits warpers). */
#ifndef KN_ENGINE_SAMPLER_H
#define KN_ENGINE_SAMPLER_H

#include <stdint.h>

#include "kiln/kiln.h"

typedef struct {
    uint64_t s[4]; /* xoshiro256** state */
} kn_rng;

void kn_rng_seed(kn_rng *r, uint64_t seed);
uint64_t kn_rng_next(kn_rng *r);
/* Uniform in [0, 1) with 53 bits. */
double kn_rng_uniform(kn_rng *r);

/* Scratch for sampling over a vocabulary of n (caller-owned, reusable). */
typedef struct {
    float v;
    int32_t i;
} kn_logit_pair;

typedef struct {
    int n;
    kn_logit_pair *pairs;
    double *prob;
} kn_sampler_scratch;

kn_code kn_sampler_scratch_init(kn_sampler_scratch *s, int n, kn_error *err);
void kn_sampler_scratch_free(kn_sampler_scratch *s);

/* Index of the largest logit (the first one on ties, as torch.argmax). */
int32_t kn_sample_greedy(const float *logits, int n);

/* Sample from logits[n] under p; greedy when p->temperature <= 0. */
int32_t kn_sample(const float *logits, int n, const kn_sampling *p, kn_rng *rng, kn_sampler_scratch *s);

#endif

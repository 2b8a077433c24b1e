/* sampler.h — next-token selection on the host: greedy, or seeded sampling
 * with temperature, top-k, top-p and min-p under the rule of base/sampling.h
 * (the one the backends' sample_rows op follows), with the uniform draw taken
 * from the request's xoshiro256** stream. */
#ifndef KN_ENGINE_SAMPLER_H
#define KN_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/sampling.h"
#include "kiln/kiln.h"

typedef struct {
    uint64_t s[4]; /* xoshiro256** state */
} kn_rng;

void kn_rng_seed(kn_rng *r, uint64_t seed);
uint64_t kn_rng_next(kn_rng *r);
/* Uniform in [0, 1) with 53 bits. */
double kn_rng_uniform(kn_rng *r);

typedef kn_sample_scratch kn_sampler_scratch;

kn_code kn_sampler_scratch_init(kn_sampler_scratch *s, int n, kn_error *err);
void kn_sampler_scratch_free(kn_sampler_scratch *s);

/* Index of the largest logit (the first one on ties, as torch.argmax). */
static inline int32_t kn_sample_greedy(const float *logits, int n) { return kn_sample_argmax(logits, n); }

/* The row parameters for p: one uniform drawn from rng unless greedy (so a
 * seeded request draws exactly once per sampled token, on any backend). */
kn_sample_params kn_sample_params_draw(const kn_sampling *p, kn_rng *rng);

/* Sample from logits[n] under p; greedy when p->temperature <= 0. */
int32_t kn_sample(const float *logits, int n, const kn_sampling *p, kn_rng *rng, kn_sampler_scratch *s);

#endif

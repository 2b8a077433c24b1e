/* sampler.c — see sampler.h. */
#include "engine/sampler.h"

#include "base/status.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kn_rng_seed(kn_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kn_rng_next(kn_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return out;
}

double kn_rng_uniform(kn_rng *r) { return (double)(kn_rng_next(r) >> 11) * 0x1.0p-53; }

kn_code kn_sampler_scratch_init(kn_sampler_scratch *s, int n, kn_error *err) {
    if (kn_sample_scratch_init(s, n)) return kn_fail(err, KN_ERR_NOMEM, "out of memory for the sampler");
    return KN_OK;
}

void kn_sampler_scratch_free(kn_sampler_scratch *s) { kn_sample_scratch_free(s); }

kn_sample_params kn_sample_params_draw(const kn_sampling *sp, kn_rng *rng) {
    kn_sample_params p = {.temperature = sp->temperature, .top_k = sp->top_k, .top_p = sp->top_p, .min_p = sp->min_p};
    if (!kn_sample_is_greedy(&p)) p.u = kn_rng_uniform(rng);
    return p;
}

int32_t kn_sample(const float *logits, int n, const kn_sampling *sp, kn_rng *rng, kn_sampler_scratch *s) {
    kn_sample_params p = kn_sample_params_draw(sp, rng);
    return kn_sample_row(logits, n, &p, s);
}

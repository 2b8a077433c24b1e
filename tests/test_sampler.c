/* test_sampler.c — greedy, seeded reproducibility, and each filter's
 * semantics against exact expected sets (empirical frequencies over many
 * draws stay inside the allowed set and follow the renormalized mass). */
#include <string.h>

#include "engine/sampler.h"
#include "test_util.h"

static int counts[8];

static void draw(const float *logits, int n, kn_sampling *sp, int trials) {
    kn_sampler_scratch s;
    kn_error err;
    kn_sampler_scratch_init(&s, n, &err);
    kn_rng r;
    kn_rng_seed(&r, sp->seed);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < trials; i++) counts[kn_sample(logits, n, sp, &r, &s)]++;
    kn_sampler_scratch_free(&s);
}

int main(void) {
    /* probabilities (T=1): softmax of log p */
    float lg[8];
    double p[8] = {0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01};
    for (int i = 0; i < 8; i++) lg[i] = (float)log(p[i]);
    CHECK(kn_sample_greedy(lg, 8) == 0, "greedy");
    float ties[4] = {1, 3, 3, 2};
    CHECK(kn_sample_greedy(ties, 4) == 1, "greedy ties -> first");
    kn_sampling sp = {.temperature = 0.0f, .top_p = 1.0f};
    draw(lg, 8, &sp, 10);
    CHECK(counts[0] == 10, "temperature 0 is greedy");

    /* top-k 3: only 0..2, in ratio 0.4:0.2:0.15 */
    sp = (kn_sampling){.temperature = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 7};
    draw(lg, 8, &sp, 200000);
    CHECK(counts[3] + counts[4] + counts[5] + counts[6] + counts[7] == 0, "top-k leaked");
    CHECK(fabs(counts[0] / 200000.0 - 0.4 / 0.75) < 0.01, "top-k mass %g", counts[0] / 200000.0);
    /* top-p 0.7: cumulative 0.4, 0.6, 0.75 -> keep 0..2 */
    sp = (kn_sampling){.temperature = 1.0f, .top_p = 0.7f, .seed = 8};
    draw(lg, 8, &sp, 100000);
    CHECK(counts[3] == 0 && counts[2] > 0, "top-p set wrong (c2=%d c3=%d)", counts[2], counts[3]);
    /* min-p 0.3: keep p >= 0.12 -> 0..2 */
    sp = (kn_sampling){.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.3f, .seed = 9};
    draw(lg, 8, &sp, 100000);
    CHECK(counts[3] == 0 && counts[2] > 0, "min-p set wrong");
    /* no filter: frequencies follow p */
    sp = (kn_sampling){.temperature = 1.0f, .top_p = 1.0f, .seed = 10};
    draw(lg, 8, &sp, 400000);
    for (int i = 0; i < 8; i++) CHECK(fabs(counts[i] / 400000.0 - p[i]) < 0.005, "freq[%d] %g vs %g", i, counts[i] / 400000.0, p[i]);
    /* high temperature flattens: token 7 becomes more likely than at T=1 */
    sp.temperature = 4.0f;
    draw(lg, 8, &sp, 100000);
    CHECK(counts[7] / 100000.0 > 0.05, "temperature did not flatten");
    /* same seed, same sequence; different seed, different sequence */
    kn_sampler_scratch s;
    kn_error err;
    kn_sampler_scratch_init(&s, 8, &err);
    kn_rng r1, r2, r3;
    kn_rng_seed(&r1, 5), kn_rng_seed(&r2, 5), kn_rng_seed(&r3, 6);
    sp = (kn_sampling){.temperature = 1.0f, .top_p = 1.0f};
    int same = 1, diff = 0;
    for (int i = 0; i < 64; i++) {
        int a = kn_sample(lg, 8, &sp, &r1, &s), b = kn_sample(lg, 8, &sp, &r2, &s), c = kn_sample(lg, 8, &sp, &r3, &s);
        same &= a == b;
        diff |= a != c;
    }
    CHECK(same, "same seed must reproduce");
    CHECK(diff, "different seeds should differ");
    kn_sampler_scratch_free(&s);
    return kn_test_done("test_sampler");
}

/* sampler.c — see sampler.h.
 *
 * Filtering follows transformers: top-k keeps the k largest (ties at the
 * boundary kept); top-p keeps the smallest prefix of the descending
 * distribution whose mass reaches p (at least one token); min-p keeps tokens
 * with prob >= min_p * max prob. The survivors are renormalized and one is
 * drawn by inverse CDF with a 53-bit uniform from xoshiro256**. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    s->n = n;
    s->pairs = malloc((size_t)n * sizeof *s->pairs);
    s->prob = malloc((size_t)n * sizeof *s->prob);
    if (!s->pairs || !s->prob) {
        kn_sampler_scratch_free(s);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for the sampler");
    }
    return KN_OK;
}

void kn_sampler_scratch_free(kn_sampler_scratch *s) {
    free(s->pairs), free(s->prob);
    s->pairs = NULL, s->prob = NULL;
}

int32_t kn_sample_greedy(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* order: value descending, index ascending (deterministic on ties) */
static int cmp_desc(const void *a, const void *b) {
    const kn_logit_pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static void swap_pair(kn_logit_pair *a, kn_logit_pair *b) {
    kn_logit_pair t = *a;
    *a = *b;
    *b = t;
}

/* Partition p[0..n) so the k largest come first; returns the count kept,
 * extended over ties with the k-th value. O(n) average (quickselect). */
static int select_top_k(kn_logit_pair *p, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = p[(lo + hi) / 2].v;
        int i = lo, j = hi;
        while (i <= j) {
            while (p[i].v > pivot) i++;
            while (p[j].v < pivot) j--;
            if (i <= j) swap_pair(&p[i++], &p[j--]);
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    float kth = p[want].v;
    int kept = k;
    for (int i = k; i < n; i++) /* ties with the k-th value survive, as in transformers */
        if (p[i].v >= kth) swap_pair(&p[kept++], &p[i]);
    return kept;
}

int32_t kn_sample(const float *logits, int n, const kn_sampling *sp, kn_rng *rng, kn_sampler_scratch *s) {
    if (sp->temperature <= 0.0f || sp->top_k == 1) return kn_sample_greedy(logits, n);
    kn_logit_pair *p = s->pairs;
    double *pr = s->prob;
    for (int i = 0; i < n; i++) p[i].v = logits[i] / sp->temperature, p[i].i = i;
    int m = n;
    if (sp->top_k > 0 && sp->top_k < n) m = select_top_k(p, n, sp->top_k);
    qsort(p, (size_t)m, sizeof *p, cmp_desc);
    double mx = p[0].v, sum = 0.0;
    for (int i = 0; i < m; i++) sum += (pr[i] = exp((double)p[i].v - mx));
    for (int i = 0; i < m; i++) pr[i] /= sum;
    int keep = m;
    if (sp->top_p > 0.0f && sp->top_p < 1.0f) {
        double cum = 0.0;
        for (int i = 0; i < m; i++) {
            cum += pr[i];
            if (cum >= sp->top_p) { keep = i + 1; break; }
        }
    }
    if (sp->min_p > 0.0f) {
        double thr = sp->min_p * pr[0];
        int k2 = 1;
        while (k2 < keep && pr[k2] >= thr) k2++;
        keep = k2;
    }
    double mass = 0.0;
    for (int i = 0; i < keep; i++) mass += pr[i];
    double u = kn_rng_uniform(rng) * mass, acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += pr[i];
        if (u < acc) return p[i].i;
    }
    return p[keep - 1].i;
}

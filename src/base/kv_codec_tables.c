/* kv_codec_tables.c — the tables behind the KV row formats of kv_codec.h:
 * Lloyd-Max quantizers computed by the fixed-point iteration in float64
 * (N(0,1) for tqv values; the coordinate law of a uniform random unit vector
 * in R^D for tq), the seeded +-1 sign vectors of the rotation, and format
 * names. Deterministic: same inputs, same bits, on every machine. */
#include "base/kv_codec_tables.h"

#include <math.h>
#include <string.h>

static const char *const fmt_names[KN_KVF_COUNT] = {"f32",  "bf16", "fp8",  "q8s",  "q8a", "q8", "q4",
                                                    "q4g64", "tqv2", "tqv3", "tqv4", "tq3", "tq4"};

const char *kn_kv_fmt_name(int f) { return f >= 0 && f < KN_KVF_COUNT ? fmt_names[f] : "?"; }

int kn_kv_fmt_parse(const char *s, int *out) {
    for (int f = 0; f < KN_KVF_COUNT; f++)
        if (!strcmp(s, fmt_names[f])) return *out = f, 0;
    return -1;
}

int kn_kv_fmt_dim_ok(int f, int D) {
    if (D <= 0 || (f != KN_KVF_F32 && D > KN_KV_MAX_DIM)) return 0;
    if (kn_kv_fmt_rotated(f)) return D == 64 || D == 128 || D == 256 || D == 512;
    const int g = kn_kv_fmt_group(f, D);
    if (g && (D % g != 0 || g % 2 != 0)) return 0;
    return 1;
}

/* ---- Lloyd-Max ---------------------------------------------------------- */

/* Gauss-Legendre nodes/weights on [-1, 1] (Newton on the Legendre recursion). */
#define GL_N 16
static void gl_nodes(double *x, double *w) {
    for (int i = 0; i < GL_N; i++) {
        double z = cos(M_PI * (i + 0.75) / (GL_N + 0.5)), pp = 0.0;
        for (int it = 0; it < 100; it++) {
            double p1 = 1.0, p2 = 0.0;
            for (int j = 1; j <= GL_N; j++) {
                double p3 = p2;
                p2 = p1;
                p1 = ((2.0 * j - 1.0) * z * p2 - (j - 1.0) * p3) / j;
            }
            pp = GL_N * (z * p1 - p2) / (z * z - 1.0);
            double z1 = z;
            z = z1 - p1 / pp;
            if (fabs(z - z1) < 1e-16) break;
        }
        x[i] = z;
        w[i] = 2.0 / ((1.0 - z * z) * pp * pp);
    }
}

typedef struct {
    int D;           /* 0: N(0,1); else t = sqrt(D) * (coordinate of a unit vector) */
    double lim, k;   /* support [-lim, lim]; density (1 - t^2/D)^k */
    double norm;     /* 1 / total mass */
    double gx[GL_N], gw[GL_N];
} lm_dist;

static double dens_beta(const lm_dist *d, double t) {
    double u = 1.0 - t * t / d->D;
    return u > 0.0 ? pow(u, d->k) : 0.0;
}

/* mass, first and second moment of the (normalised) law over [a, b] */
static void moments(const lm_dist *d, double a, double b, double *m0, double *m1, double *m2) {
    if (!d->D) {
        const double r2 = M_SQRT1_2, c = 0.3989422804014327; /* 1/sqrt(2 pi) */
        double pa = isinf(a) ? 0.0 : c * exp(-0.5 * a * a), pb = isinf(b) ? 0.0 : c * exp(-0.5 * b * b);
        double mass;
        if (a >= 0.0) mass = 0.5 * (erfc(a * r2) - erfc(b * r2));
        else if (b <= 0.0) mass = 0.5 * (erfc(-b * r2) - erfc(-a * r2));
        else mass = 1.0 - 0.5 * erfc(b * r2) - 0.5 * erfc(-a * r2);
        *m0 = mass;
        *m1 = pa - pb;
        *m2 = mass + (isinf(a) ? 0.0 : a * pa) - (isinf(b) ? 0.0 : b * pb);
        return;
    }
    /* beyond 12 standard deviations the density is below e^-70: nothing to add */
    const double cut = d->lim < 12.0 ? d->lim : 12.0;
    if (a < -cut) a = -cut;
    if (b > cut) b = cut;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0;
    if (b > a) {
        const double h = 0.5; /* panel width in units of the law's standard deviation (1) */
        int n = (int)ceil((b - a) / h);
        double w = (b - a) / n;
        for (int p = 0; p < n; p++) {
            double lo = a + p * w, mid = lo + 0.5 * w;
            for (int i = 0; i < GL_N; i++) {
                double t = mid + 0.5 * w * d->gx[i], f = d->gw[i] * 0.5 * w * dens_beta(d, t);
                s0 += f, s1 += f * t, s2 += f * t * t;
            }
        }
    }
    *m0 = s0 * d->norm, *m1 = s1 * d->norm, *m2 = s2 * d->norm;
}

static void lm_init(lm_dist *d, int D) {
    memset(d, 0, sizeof *d);
    d->D = D;
    gl_nodes(d->gx, d->gw);
    if (D) {
        d->lim = sqrt((double)D);
        d->k = (D - 3) / 2.0;
        d->norm = 1.0;
        double m0, m1, m2;
        moments(d, -d->lim, d->lim, &m0, &m1, &m2);
        d->norm = 1.0 / m0;
    }
}

static double lm_map(const lm_dist *d, int L, const double *c, double *next) {
    double delta = 0.0;
    for (int i = 0; i < L; i++) {
        double a = i ? 0.5 * (c[i - 1] + c[i]) : -INFINITY, b = i < L - 1 ? 0.5 * (c[i] + c[i + 1]) : INFINITY;
        double m0, m1, m2;
        moments(d, a, b, &m0, &m1, &m2);
        next[i] = m0 > 0.0 ? m1 / m0 : c[i];
        if (fabs(next[i] - c[i]) > delta) delta = fabs(next[i] - c[i]);
    }
    return delta;
}

double kn_lloyd_max_step(int D, int bits, const double *c, double *next) {
    lm_dist d;
    lm_init(&d, D);
    return lm_map(&d, 1 << bits, c, next);
}

double kn_lloyd_max_mse(int D, int bits, const double *c) {
    lm_dist d;
    lm_init(&d, D);
    const int L = 1 << bits;
    double mse = 0.0;
    for (int i = 0; i < L; i++) {
        double a = i ? 0.5 * (c[i - 1] + c[i]) : -INFINITY, b = i < L - 1 ? 0.5 * (c[i] + c[i + 1]) : INFINITY;
        double m0, m1, m2;
        moments(&d, a, b, &m0, &m1, &m2);
        mse += m2 - 2.0 * c[i] * m1 + c[i] * c[i] * m0;
    }
    return mse;
}

int kn_lloyd_max(int D, int bits, double *c) {
    lm_dist d;
    lm_init(&d, D);
    const int L = 1 << bits;
    double next[16];
    for (int i = 0; i < L; i++) c[i] = -2.5 + 5.0 * (i + 0.5) / L; /* spread over +-2.5 standard deviations */
    int it = 0;
    for (; it < 100000; it++) {
        double delta = lm_map(&d, L, c, next);
        /* keep the exact symmetry of both laws */
        for (int i = 0; i < L / 2; i++) {
            double v = 0.5 * (next[L - 1 - i] - next[i]);
            c[i] = -v, c[L - 1 - i] = v;
        }
        if (delta < 1e-14) break;
    }
    return it;
}

/* ---- tables ---------------------------------------------------------------- */

int kn_kv_fmt_tab_len(int f) { return kn_kv_fmt_rotated(f) ? 2 * (1 << kn_kv_fmt_bits(f)) - 1 : 0; }

void kn_kv_fmt_table(int f, int D, float *tab) {
    if (!kn_kv_fmt_rotated(f)) return;
    const int b = kn_kv_fmt_bits(f), L = 1 << b, tq = kn_kv_fmt_is_tq(f);
    double c[16];
    kn_lloyd_max(tq ? D : 0, b, c);
    /* tq codes the unit vector itself: coordinates are t / sqrt(D) */
    const double s = tq ? 1.0 / sqrt((double)D) : 1.0;
    for (int i = 0; i < L; i++) tab[i] = (float)(c[i] * s);
    for (int i = 0; i < L - 1; i++) tab[L + i] = (float)(0.5 * (c[i] + c[i + 1]) * s);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kn_kv_signs(uint64_t seed, int D, float *signs) {
    uint64_t s = seed ^ ((uint64_t)D * 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < D; i++) signs[i] = (splitmix64(&s) >> 63) ? -1.0f : 1.0f;
}

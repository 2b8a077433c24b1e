/* test_util.h — tiny assertion helpers shared by the C test programs. A test
 * program prints each failure and exits non-zero if any check failed. */
#ifndef KN_TEST_UTIL_H
#define KN_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int kn_test_failures = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            kn_test_failures++;                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static inline int kn_test_done(const char *name) {
    if (kn_test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, kn_test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

/* deterministic uniform floats in [-1, 1) */
static inline float kn_test_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* mean over rows of KL(softmax(p) || softmax(q)) of two [rows, V] logit sets */
static inline double kn_test_mean_kl(const float *p, const float *q, int rows, int V) {
    double total = 0;
    for (int r = 0; r < rows; r++) {
        const float *a = p + (size_t)r * V, *b = q + (size_t)r * V;
        double ma = -1e300, mb = -1e300, sa = 0, sb = 0, kl = 0;
        for (int i = 0; i < V; i++) ma = a[i] > ma ? a[i] : ma, mb = b[i] > mb ? b[i] : mb;
        for (int i = 0; i < V; i++) sa += exp(a[i] - ma), sb += exp(b[i] - mb);
        for (int i = 0; i < V; i++) {
            double la = a[i] - ma - log(sa), lb = b[i] - mb - log(sb);
            kl += exp(la) * (la - lb);
        }
        total += kl;
    }
    return total / rows;
}

static inline const char *kn_test_fixtures(void) {
    const char *d = getenv("KILN_FIXTURES");
    return d ? d : "tests/fixtures";
}

#endif

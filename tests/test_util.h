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

static inline const char *kn_test_fixtures(void) {
    const char *d = getenv("KILN_FIXTURES");
    return d ? d : "tests/fixtures";
}

#endif

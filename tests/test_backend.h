/* test_backend.h — the backend a test program runs on: KILN_TEST_BACKEND
 * (unset: the CPU). A named backend that cannot start here (cuda on a
 * machine without a GPU) is a skip said out loud: exit code 77, which the
 * CUDA ctest entries declare as SKIP_RETURN_CODE. */
#ifndef KN_TEST_BACKEND_H
#define KN_TEST_BACKEND_H

#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"

/* Open the test's backend into *be: 0, 77 (skip) or 1 (the CPU failed). */
static inline int kn_test_backend_open(const char *test, int n_threads, kn_backend **be) {
    kn_error err = {0};
    const char *name = getenv("KILN_TEST_BACKEND");
    if (kn_backend_create(name ? name : "cpu", n_threads, be, &err) == KN_OK) return 0;
    if (name) {
        printf("%s: SKIP backend %s: %s\n", test, name, err.msg);
        return 77;
    }
    fprintf(stderr, "%s: backend: %s\n", test, err.msg);
    return 1;
}

/* For tests that open models themselves: 0 when the backend starts here (or
 * none is named), 77 (skip) otherwise. */
static inline int kn_test_backend_probe(const char *test) {
    const char *name = getenv("KILN_TEST_BACKEND");
    if (!name) return 0;
    kn_backend *be;
    const int rc = kn_test_backend_open(test, 1, &be);
    if (rc) return rc;
    kn_backend_destroy(be);
    printf("%s: backend %s\n", test, name);
    return 0;
}

#endif

/* test_cpu_stream.c — kn_cpu_stream_rows (cpu_stream.h): every row of every
 * shape is handed out exactly once, ranges hold even row counts except at
 * the end, and when one thread is slow the others take its chunks (from
 * the back of its range). */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu_stream.h"
#include "test_util.h"

typedef struct {
    int64_t n_rows;
    _Atomic int *count;    /* times each row was handed out */
    _Atomic int *by;       /* thread that computed each row */
    _Atomic int bad_range; /* a range that was empty, reversed or odd inside */
    int slow_thread;       /* this thread spins ~0.2 ms per chunk (-1: none) */
} job;

static void visit(void *ctx, int64_t n0, int64_t n1) {
    job *j = ctx;
    if (!(n0 < n1) || n0 < 0 || n1 > j->n_rows || ((n1 - n0) % 2 && n1 != j->n_rows)) atomic_store(&j->bad_range, 1);
    const int me = omp_get_thread_num();
    if (me == j->slow_thread) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 200000L);
    }
    for (int64_t r = n0; r < n1 && r < j->n_rows && r >= 0; r++) atomic_fetch_add(&j->count[r], 1), j->by[r] = me;
}

static void check(int nt, int64_t n_rows, int64_t row_bytes, int slow) {
    job j = {.n_rows = n_rows, .slow_thread = slow};
    j.count = calloc((size_t)n_rows + 1, sizeof *j.count);
    j.by = calloc((size_t)n_rows + 1, sizeof *j.by);
    atomic_init(&j.bad_range, 0);
    kn_cpu_stream_rows(nt, n_rows, row_bytes, visit, &j);
    CHECK(!atomic_load(&j.bad_range), "threads %d rows %lld row bytes %lld: a bad range", nt, (long long)n_rows,
          (long long)row_bytes);
    int64_t wrong = 0;
    for (int64_t r = 0; r < n_rows; r++) wrong += atomic_load(&j.count[r]) != 1;
    CHECK(wrong == 0, "threads %d rows %lld row bytes %lld: %lld rows not handed out exactly once", nt,
          (long long)n_rows, (long long)row_bytes, (long long)wrong);
    free(j.count), free(j.by);
}

int main(void) {
    const int threads[] = {1, 2, 3, 7};
    const int64_t rows[] = {0, 1, 2, 3, 5, 64, 1001, 4096, 32000};
    const int64_t bytes[] = {1, 2048, 8192, KN_STREAM_CHUNK_BYTES / 3, KN_STREAM_CHUNK_BYTES + 1, 1 << 22};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            for (size_t b = 0; b < sizeof bytes / sizeof *bytes; b++) check(threads[t], rows[r], bytes[b], -1);
    /* thread 0 slow: thread 1 takes chunks of range 0 from its back, so the
     * rows of range 0 that thread 1 computed are range 0's last ones */
    const int64_t n = 2048, rb = 2048; /* 64 rows per chunk, 16 chunks per range */
    job j = {.n_rows = n, .slow_thread = 0};
    j.count = calloc(n, sizeof *j.count), j.by = calloc(n, sizeof *j.by);
    atomic_init(&j.bad_range, 0);
    kn_cpu_stream_rows(2, n, rb, visit, &j);
    int64_t stolen = 0, first_stolen = n / 2;
    for (int64_t r = 0; r < n / 2; r++)
        if (j.by[r] == 1) {
            stolen++;
            if (r < first_stolen) first_stolen = r;
        }
    int64_t own_after = 0; /* rows of range 0 past the first stolen one that thread 0 computed */
    for (int64_t r = first_stolen; r < n / 2; r++) own_after += j.by[r] == 0;
    int64_t once = 0;
    for (int64_t r = 0; r < n; r++) once += atomic_load(&j.count[r]) == 1;
    CHECK(once == n, "slow thread: %lld of %lld rows handed out exactly once", (long long)once, (long long)n);
    if (omp_get_max_threads() >= 2) { /* a team of one cannot steal */
        CHECK(stolen > 0, "slow thread 0: thread 1 took none of its chunks");
        CHECK(own_after == 0, "stolen chunks are not range 0's last ones (%lld of thread 0's rows after them)",
              (long long)own_after);
    }
    printf("test_cpu_stream: thread 1 took %lld of thread 0's %lld rows\n", (long long)stolen, (long long)(n / 2));
    free(j.count), free(j.by);
    return kn_test_done("test_cpu_stream");
}

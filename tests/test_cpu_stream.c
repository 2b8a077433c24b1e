/* test_cpu_stream.c — kn_cpu_stream_rows (cpu_stream.h): every row of every
 * shape is handed out exactly once, ranges hold even row counts except at
 * the end, and when one thread is slow the others take its chunks (from
 * the back of its range), and an owner takes up to 4 chunks at once while
 * at least twice that many are left. The slow thread waits in its first chunk until
 * another thread has taken a chunk of its range (bounded), so the stealing
 * check does not depend on how the OS schedules a busy machine's threads.
 * Each check runs on OpenMP's threads and on a kn_cpu_pool's. */
#include <omp.h>
#include <pthread.h>
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
    int slow_thread;       /* this thread is slow (-1: none) */
    _Atomic int stolen;    /* another thread has computed a row of the slow thread's range */
    _Atomic int waited;    /* the slow thread has had its first chunk's wait */
    _Atomic int64_t max_len; /* the longest range handed out */
    pthread_t caller;        /* thread 0 (OpenMP's and the pool's) */
    int can_steal;           /* the team has two threads */
} job;

static int64_t elapsed_ns(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

static void visit(void *ctx, int64_t n0, int64_t n1) {
    job *j = ctx;
    if (!(n0 < n1) || n0 < 0 || n1 > j->n_rows || ((n1 - n0) % 2 && n1 != j->n_rows)) atomic_store(&j->bad_range, 1);
    const int me = pthread_equal(pthread_self(), j->caller) ? 0 : 1; /* (1: any other thread) */
    for (int64_t m = atomic_load(&j->max_len); n1 - n0 > m && !atomic_compare_exchange_weak(&j->max_len, &m, n1 - n0);) {
    }
    if (me == j->slow_thread) {
        /* first chunk: until another thread steals from this range (at most
         * 10 s, so a broken stealer fails the check rather than hanging);
         * later chunks: ~0.2 ms each */
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!atomic_exchange(&j->waited, 1) && j->can_steal)
            while (!atomic_load(&j->stolen) && elapsed_ns(&t0) < 10000000000L) {
            }
        else
            while (elapsed_ns(&t0) < 200000L) {
            }
    } else if (j->slow_thread >= 0 && n0 < j->n_rows / 2)
        atomic_store(&j->stolen, 1);
    for (int64_t r = n0; r < n1 && r < j->n_rows && r >= 0; r++) atomic_fetch_add(&j->count[r], 1), j->by[r] = me;
}

static void check(kn_cpu_pool *pool, int nt, int64_t n_rows, int64_t row_bytes, int slow) {
    job j = {.n_rows = n_rows, .slow_thread = slow, .caller = pthread_self()};
    atomic_init(&j.stolen, 0), atomic_init(&j.waited, 0), atomic_init(&j.max_len, 0);
    j.count = calloc((size_t)n_rows + 1, sizeof *j.count);
    j.by = calloc((size_t)n_rows + 1, sizeof *j.by);
    atomic_init(&j.bad_range, 0);
    kn_cpu_stream_rows(pool, nt, n_rows, row_bytes, visit, &j);
    CHECK(!atomic_load(&j.bad_range), "threads %d rows %lld row bytes %lld: a bad range", nt, (long long)n_rows,
          (long long)row_bytes);
    int64_t wrong = 0;
    for (int64_t r = 0; r < n_rows; r++) wrong += atomic_load(&j.count[r]) != 1;
    CHECK(wrong == 0, "threads %d rows %lld row bytes %lld: %lld rows not handed out exactly once", nt,
          (long long)n_rows, (long long)row_bytes, (long long)wrong);
    free(j.count), free(j.by);
}

/* thread 0 slow: thread 1 takes chunks of range 0 from its back, so the
 * rows of range 0 that thread 1 computed are range 0's last ones; with no
 * slow thread the owners' first claims are 4 chunks, never more */
static void check_stealing(kn_cpu_pool *pool, const char *threads) {
    const int64_t n = 2048, rb = 2048; /* 64 rows per chunk, 16 chunks per range */
    const int can_steal = pool || omp_get_max_threads() >= 2; /* a team of one cannot steal */
    job j = {.n_rows = n, .slow_thread = 0, .caller = pthread_self(), .can_steal = can_steal};
    atomic_init(&j.stolen, 0), atomic_init(&j.waited, 0), atomic_init(&j.max_len, 0);
    j.count = calloc(n, sizeof *j.count), j.by = calloc(n, sizeof *j.by);
    atomic_init(&j.bad_range, 0);
    kn_cpu_stream_rows(pool, 2, n, rb, visit, &j);
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
    CHECK(once == n, "%s, slow thread: %lld of %lld rows handed out exactly once", threads, (long long)once,
          (long long)n);
    if (can_steal) {
        CHECK(stolen > 0, "%s, slow thread 0: thread 1 took none of its chunks", threads);
        CHECK(own_after == 0, "%s: stolen chunks are not range 0's last ones (%lld of thread 0's rows after them)",
              threads, (long long)own_after);
    }
    job e = {.n_rows = n, .slow_thread = -1, .caller = pthread_self(), .can_steal = can_steal};
    atomic_init(&e.stolen, 0), atomic_init(&e.waited, 0), atomic_init(&e.bad_range, 0), atomic_init(&e.max_len, 0);
    e.count = calloc(n, sizeof *e.count), e.by = calloc(n, sizeof *e.by);
    kn_cpu_stream_rows(pool, 2, n, rb, visit, &e);
    CHECK(atomic_load(&e.max_len) == 4 * 64, "%s: longest range handed out: %lld rows, want 4 chunks of 64", threads,
          (long long)atomic_load(&e.max_len));
    free(e.count), free(e.by);
    printf("test_cpu_stream (%s): thread 1 took %lld of thread 0's %lld rows\n", threads, (long long)stolen,
           (long long)(n / 2));
    free(j.count), free(j.by);
}

int main(void) {
    const int threads[] = {1, 2, 3, 7};
    const int64_t rows[] = {0, 1, 2, 3, 5, 64, 1001, 4096, 32000};
    const int64_t bytes[] = {1, 2048, 8192, KN_STREAM_CHUNK_BYTES / 3, KN_STREAM_CHUNK_BYTES + 1, 1 << 22};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        kn_cpu_pool *pool = kn_cpu_pool_create(threads[t]); /* NULL for one thread */
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            for (size_t b = 0; b < sizeof bytes / sizeof *bytes; b++) {
                check(NULL, threads[t], rows[r], bytes[b], -1);
                check(pool, threads[t], rows[r], bytes[b], -1);
            }
        kn_cpu_pool_destroy(pool);
    }
    check_stealing(NULL, "OpenMP");
    kn_cpu_pool *pool = kn_cpu_pool_create(2);
    check_stealing(pool, "pool");
    kn_cpu_pool_destroy(pool);
    return kn_test_done("test_cpu_stream");
}

/* test_cpu_pool.c — kn_cpu_pool (cpu_pool.h): every part of every job runs
 * exactly once and the call returns only after all of them; the workers
 * take part (not the caller alone); jobs still run after the workers have
 * gone to sleep; a nested call and calls from two threads at once fall back
 * to OpenMP and still run every part once; pools start and stop cleanly. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu_pool.h"
#include "test_util.h"

#define MAX_PARTS 64

typedef struct {
    _Atomic int runs[MAX_PARTS]; /* times part t ran */
    _Atomic int team;            /* the nt the parts saw (all the same) */
    _Atomic int bad;             /* a part with t out of [0, nt), or teams that disagree */
    _Atomic int off_caller;      /* parts that ran on a thread other than the caller */
    pthread_t caller;
    kn_cpu_pool *nested; /* part 0 runs a job of its own on this pool */
} job;

static void job_init(job *j, kn_cpu_pool *nested) {
    for (int t = 0; t < MAX_PARTS; t++) atomic_init(&j->runs[t], 0);
    atomic_init(&j->team, 0), atomic_init(&j->bad, 0), atomic_init(&j->off_caller, 0);
    j->caller = pthread_self();
    j->nested = nested;
}

static void part(void *ctx, int t, int nt) {
    job *j = ctx;
    if (t < 0 || t >= nt || nt > MAX_PARTS) {
        atomic_store(&j->bad, 1);
        return;
    }
    int expected = 0;
    if (!atomic_compare_exchange_strong(&j->team, &expected, nt) && expected != nt) atomic_store(&j->bad, 1);
    if (!pthread_equal(pthread_self(), j->caller)) atomic_fetch_add(&j->off_caller, 1);
    if (t == 0 && j->nested) { /* the pool is busy with this job: the inner one goes to OpenMP */
        job inner;
        job_init(&inner, NULL);
        kn_cpu_pool_run(j->nested, 2, part, &inner);
        const int team = atomic_load(&inner.team);
        int once = team >= 1 && team <= 2 && !atomic_load(&inner.bad);
        for (int u = 0; u < team; u++) once &= atomic_load(&inner.runs[u]) == 1;
        if (!once) atomic_store(&j->bad, 1);
    }
    atomic_fetch_add(&j->runs[t], 1);
}

/* every part [0, team) ran once and nothing else ran; returns the team */
static int check_job(job *j, int asked, const char *what) {
    const int team = atomic_load(&j->team);
    CHECK(!atomic_load(&j->bad), "%s: a part saw a bad index or team, or a nested job failed", what);
    CHECK(team >= 1 && team <= asked, "%s: team %d for %d asked", what, team, asked);
    for (int t = 0; t < MAX_PARTS; t++) {
        const int want = t < team ? 1 : 0;
        CHECK(atomic_load(&j->runs[t]) == want, "%s: part %d ran %d times, want %d", what, t,
              atomic_load(&j->runs[t]), want);
    }
    return team;
}

typedef struct {
    kn_cpu_pool *pool;
    int jobs, failures;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    for (int i = 0; i < r->jobs; i++) {
        job j;
        job_init(&j, NULL);
        kn_cpu_pool_run(r->pool, 3, part, &j);
        const int team = atomic_load(&j.team);
        int ok = team >= 1 && team <= 3 && !atomic_load(&j.bad);
        for (int t = 0; t < MAX_PARTS; t++) ok &= atomic_load(&j.runs[t]) == (t < team);
        r->failures += !ok;
    }
    return NULL;
}

int main(void) {
    CHECK(kn_cpu_pool_create(1) == NULL && kn_cpu_pool_create(0) == NULL, "a pool of one thread is not NULL");
    /* the pool's own jobs: the team is what was asked, up to the pool's size */
    const int sizes[] = {2, 3, 5};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        kn_cpu_pool *p = kn_cpu_pool_create(sizes[s]);
        CHECK(p != NULL, "pool of %d threads: not created", sizes[s]);
        if (!p) continue;
        int off_caller = 0;
        for (int i = 0; i < 2000; i++) {
            const int nt = 1 + i % (sizes[s] + 2);
            job j;
            job_init(&j, NULL);
            kn_cpu_pool_run(p, nt, part, &j);
            char what[64];
            snprintf(what, sizeof what, "pool %d, job %d of %d parts", sizes[s], i, nt);
            const int want = nt < sizes[s] ? nt : sizes[s];
            CHECK(check_job(&j, nt, what) == want, "%s: team %d, want %d", what, atomic_load(&j.team), want);
            off_caller += atomic_load(&j.off_caller);
        }
        CHECK(off_caller > 0, "pool %d: no part ever ran on a worker", sizes[s]);
        /* after the workers' spin budget (100 us) they sleep: jobs still run */
        for (int i = 0; i < 20; i++) {
            nanosleep(&(struct timespec){0, 2000000}, NULL);
            job j;
            job_init(&j, NULL);
            kn_cpu_pool_run(p, sizes[s], part, &j);
            check_job(&j, sizes[s], "after a sleep");
            CHECK(atomic_load(&j.off_caller) == sizes[s] - 1, "after a sleep: %d parts off the caller, want %d",
                  atomic_load(&j.off_caller), sizes[s] - 1);
        }
        /* a job that runs a job of its own on the same pool */
        job j;
        job_init(&j, p);
        kn_cpu_pool_run(p, 2, part, &j);
        check_job(&j, 2, "nested");
        kn_cpu_pool_destroy(p);
    }
    /* no pool: OpenMP */
    job j;
    job_init(&j, NULL);
    kn_cpu_pool_run(NULL, 2, part, &j);
    check_job(&j, 2, "no pool");
    /* two callers at once on one pool: one gets the pool, the other OpenMP */
    kn_cpu_pool *p = kn_cpu_pool_create(3);
    racer r[2] = {{p, 3000, 0}, {p, 3000, 0}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, race, &r[1]) == 0, "second caller: thread not started");
    race(&r[0]);
    pthread_join(th, NULL);
    CHECK(r[0].failures == 0 && r[1].failures == 0, "two callers: %d and %d jobs with parts run other than once",
          r[0].failures, r[1].failures);
    kn_cpu_pool_destroy(p);
    /* pools stopped at once, workers still starting or spinning */
    for (int i = 0; i < 50; i++) kn_cpu_pool_destroy(kn_cpu_pool_create(2 + i % 3));
    return kn_test_done("test_cpu_pool");
}

/* cpu_pool.c — see cpu_pool.h. */
#include "backend/cpu/cpu_pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long an idle worker spins before it sleeps: longer than the gaps
 * between a decode step's sections (a few us), short enough that a worker
 * left spinning by the last decode step holds a core for little longer than
 * that when OpenMP sections (prefill) or other processes want it. */
#define POOL_SPIN_NS 100000
/* The caller, waiting for its workers, yields the core after this long (a
 * worker that lost its core to another thread needs it back). */
#define POOL_WAIT_YIELD_NS 50000

typedef struct {
    kn_cpu_pool *pool;
    int t; /* the worker's part index (1..) */
} worker_arg;

struct kn_cpu_pool {
    int n_workers;
    pthread_t *threads;
    worker_arg *args; /* [n_workers], owned here */
    /* the job, written by the caller before it bumps gen */
    kn_pool_fn fn;
    void *ctx;
    int nt;
    _Atomic int stop;
    _Alignas(64) _Atomic uint32_t gen; /* job number; also the sleepers' futex word */
    _Alignas(64) _Atomic int pending;  /* workers that have not finished the current job */
    _Alignas(64) _Atomic int sleepers; /* workers asleep (or about to be) on gen */
    _Alignas(64) _Atomic int busy;     /* a job is in progress */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* the next job number after seen: spin, then sleep until one comes */
static uint32_t wait_job(kn_cpu_pool *p, uint32_t seen) {
    int64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        const uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if (i % 256) continue;
        if (now_ns() - t0 < POOL_SPIN_NS) continue;
        /* sleep: announce it first, so that a caller bumping gen after our
         * last look sees a sleeper and wakes us (both sides seq_cst) */
        atomic_fetch_add(&p->sleepers, 1);
        if (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        t0 = now_ns();
    }
}

static void *worker_main(void *arg) {
    const worker_arg *wa = arg;
    kn_cpu_pool *p = wa->pool;
    const int t = wa->t;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
        if (t < p->nt) p->fn(p->ctx, t, p->nt);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

kn_cpu_pool *kn_cpu_pool_create(int n_threads) {
    if (n_threads < 2) return NULL;
    kn_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
    p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
    if (!p->threads || !p->args) {
        kn_cpu_pool_destroy(p);
        return NULL;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->args[i] = (worker_arg){p, i + 1};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            kn_cpu_pool_destroy(p); /* stops the i workers started */
            return NULL;
        }
        p->n_workers = i + 1;
    }
    return p;
}

void kn_cpu_pool_destroy(kn_cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake_all(&p->gen);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->args);
    free(p);
}

static void run_openmp(int nt, kn_pool_fn fn, void *ctx) {
    if (nt < 2) {
        fn(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(nt)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}

void kn_cpu_pool_run(kn_cpu_pool *p, int nt, kn_pool_fn fn, void *ctx) {
    if (!p || nt < 2 || atomic_exchange_explicit(&p->busy, 1, memory_order_acquire)) {
        run_openmp(nt, fn, ctx);
        return;
    }
    if (nt > p->n_workers + 1) nt = p->n_workers + 1;
    p->fn = fn, p->ctx = ctx, p->nt = nt;
    atomic_store_explicit(&p->pending, p->n_workers, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: ordered before the sleepers check (see wait_job) */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
    fn(ctx, 0, nt);
    int64_t t0 = 0;
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if (i % 256) continue;
        if (!t0) t0 = now_ns();
        else if (now_ns() - t0 > POOL_WAIT_YIELD_NS) sched_yield();
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

/* cpu_pool.h — a persistent team of worker threads for the CPU backend's
 * short parallel sections (the decode GEMVs and the decode attention).
 *
 * Why not OpenMP there: on the 2-vCPU dev VM an empty `omp parallel` of two
 * threads costs ~3 us (libgomp wakes its team and ends the region with
 * futex system calls every time) and one with a dynamic loop ~4.4 us, while
 * a handshake through one spinning atomic costs ~0.5 us. Measured in the
 * 0.44B bf16 decode: the attention (a ~25 us section a layer) ~20% shorter
 * on the pool; the GEMV sections (40-300 us) level, their worker streaming
 * while the caller still sets up either way.
 *
 * Workers spin (with pause) on a generation counter for a bounded time after
 * their last job, then sleep on a futex; the caller wakes sleepers only when
 * there are any. The caller runs thread 0 of each job itself. One job runs
 * at a time: a call made while another is in progress (a nested call, or a
 * second thread using the same backend) runs the job through OpenMP
 * instead, so callers never deadlock and never need to know.
 *
 * The CPU backend uses it for batch-1 decode sections and the read probe
 * only; everything else stays on OpenMP. Two teams spinning on the same
 * cores hold each other up (libgomp's idle workers spin for milliseconds):
 * the 128-token prefill's attention, put on the pool between OpenMP GEMMs,
 * ran 2x slower. Between a prefill and the decode after it the two meet
 * once, for the OpenMP workers' spin time. */
#ifndef KN_CPU_POOL_H
#define KN_CPU_POOL_H

typedef struct kn_cpu_pool kn_cpu_pool;

/* fn(ctx, t, nt) for every t in [0, nt). nt may be smaller than asked for
 * (never larger); each t runs exactly once, on some thread. */
typedef void (*kn_pool_fn)(void *ctx, int t, int nt);

/* A pool for jobs of up to n_threads threads (n_threads - 1 workers).
 * NULL for n_threads < 2 or when the threads cannot be started (callers
 * then pass NULL to kn_cpu_pool_run, which uses OpenMP). */
kn_cpu_pool *kn_cpu_pool_create(int n_threads);
void kn_cpu_pool_destroy(kn_cpu_pool *p);

/* Runs fn on nt threads (the calling thread as t = 0) and returns when every
 * part has returned. p NULL, nt < 2 or the pool busy: OpenMP (or inline). */
void kn_cpu_pool_run(kn_cpu_pool *p, int nt, kn_pool_fn fn, void *ctx);

#endif

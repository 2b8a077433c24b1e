/* cpu_stream.h — splitting a weight-streaming kernel (decode GEMV) over the
 * CPU backend's threads.
 *
 * Decode reads every weight row once, so its speed is the rate at which the
 * threads stream memory. The rows are cut into chunks of about
 * KN_STREAM_CHUNK_BYTES, and the chunks into one contiguous range per
 * thread. A thread takes its own range's chunks front to back: one unbroken
 * stream, which the hardware prefetcher follows across chunk boundaries. A
 * thread whose range is done takes chunks from the back of another's range,
 * so a thread that gets less bandwidth (a shared VM) holds the others up by
 * at most one chunk. Which thread computes a row never changes the row's
 * result. On the 2-core dev VM (0.44B bf16 decode, alternating runs) this
 * gave 78-84 tok/s against 70-73 for 1 MB chunks handed out in turn, whose
 * streams broke at every chunk. */
#ifndef KN_CPU_STREAM_H
#define KN_CPU_STREAM_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_pool.h"

#define KN_STREAM_CHUNK_BYTES (128 << 10)

/* fn(ctx, n0, n1) for every row range of [0, n_rows), on up to n_threads
 * threads of pool (NULL: OpenMP's); each range holds an even number of rows
 * unless it ends at n_rows. */
typedef void (*kn_stream_fn)(void *ctx, int64_t n0, int64_t n1);
void kn_cpu_stream_rows(kn_cpu_pool *pool, int n_threads, int64_t n_rows, int64_t row_bytes, kn_stream_fn fn,
                        void *ctx);

/* A decode GEMV over every row of w, split as above. Exactly one input is
 * set: x (f32, k->gemv), xb (x rounded to bf16, k->gemv_bf16) or prep
 * (k->qgemv's prepared x for an MLX-quantized w). The epilogues give the
 * same bits as the separate ops after the plain GEMV:
 *   accumulate: out [M, rows] += x . W^T + bias (a residual add);
 *   gu set (SwiGLU, rows even): gate row n and up row rows/2 + n are
 *     computed together into gu [M, rows], and out [M, rows/2] =
 *     silu(gate) * up, each thread on the rows it just computed. */
typedef struct {
    const kn_cpu_kernels *k;
    const float *x;
    const uint16_t *xb;
    const void *prep;
    int M;
    const kn_weight *w;
    const float *bias;
    float *out;
    int accumulate;
    float *gu;
} kn_gemv_job;
void kn_cpu_gemv_stream(kn_cpu_pool *pool, int n_threads, const kn_gemv_job *job);

/* o[j] = silu(g[j]) * u[j] for j < n (k->silu_mul where the kernel set has
 * it); each element's result does not depend on n or its position. */
void kn_cpu_silu_mul(const kn_cpu_kernels *k, float *o, const float *g, const float *u, int n);

#endif

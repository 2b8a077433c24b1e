/* cuda_qgemv_trace.cuh — per-block timing marks of the bulk quantized GEMV
 * (k_qgemv_bulk, cuda_qgemv.cu), a diagnostic compiled in only with
 * `cmake -DKILN_QGEMV_TRACE=ON` (KN_QGEMV_TRACE); without it every macro
 * below is empty and the kernel is unchanged.
 *
 * At run time KILN_QGEMV_TRACE=FILE turns it on: each launch takes a slot
 * (a graph capture keeps its slot, so the file holds the last replay of each
 * captured kernel: a decode step), and block b of a launch records the
 * global timer (ns) at seven points
 *   t0 start, t1 weight copies requested, t2 programmatic wait returned,
 *   t3 x quantized, t4 warp 0's first chunk landed, t5 warp 0 done,
 *   t6 every warp done (a block barrier that exists only in this build)
 * with its SM id; the slots are written to FILE as CSV at exit.
 * tools/device/qgemv_trace_report.py summarises the file. Included by
 * cuda_qgemv.cu only (the device buffer pointer lives in that unit). */
#ifndef KN_CUDA_QGEMV_TRACE_CUH
#define KN_CUDA_QGEMV_TRACE_CUH

#ifdef KN_QGEMV_TRACE
#include <stdio.h>
#include <stdlib.h>

#define QT_KERNELS 1024 /* launch slots */
#define QT_BLOCKS 320   /* blocks recorded per launch */
#define QT_POINTS 8     /* t0..t6 and the SM id */

__device__ unsigned long long *qt_buf;

__device__ __forceinline__ void qt_store(int id, int i, unsigned long long v) {
    if (id >= 0) qt_buf[((size_t)id * QT_BLOCKS + blockIdx.x) * QT_POINTS + i] = v;
}
__device__ __forceinline__ void qt_mark(int id, int i) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    qt_store(id, i, t);
}
__device__ __forceinline__ void qt_smid(int id) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    qt_store(id, 7, sm);
}

/* host side: one slot per launch, its shape kept for the file */
struct qt_meta {
    long long N, K;
    int bits, epi, map, norm, blocks;
};
static qt_meta qt_host_meta[QT_KERNELS];
static int qt_next = 0, qt_state = -1; /* -1 not read yet, 0 off, 1 on */
static unsigned long long *qt_dev = NULL;

static void qt_dump(void) {
    const char *path = getenv("KILN_QGEMV_TRACE");
    if (!qt_dev || !path) return;
    cudaDeviceSynchronize();
    const size_t n = (size_t)QT_KERNELS * QT_BLOCKS * QT_POINTS;
    unsigned long long *h = (unsigned long long *)malloc(n * 8);
    FILE *f = fopen(path, "w");
    if (!h || !f || cudaMemcpy(h, qt_dev, n * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "kiln: qgemv trace: could not write %s\n", path);
    } else {
        fprintf(f, "id,N,K,bits,epi,map,norm,blocks,block,sm,t0,t1,t2,t3,t4,t5,t6\n");
        for (int id = 0; id < qt_next; id++)
            for (int b = 0; b < qt_host_meta[id].blocks; b++) {
                const unsigned long long *e = h + ((size_t)id * QT_BLOCKS + b) * QT_POINTS;
                if (!e[0]) continue; /* a launch that did not run */
                const qt_meta *m = &qt_host_meta[id];
                fprintf(f, "%d,%lld,%lld,%d,%d,%d,%d,%d,%d,%llu", id, m->N, m->K, m->bits, m->epi, m->map, m->norm,
                        m->blocks, b, e[7]);
                for (int i = 0; i < 7; i++) fprintf(f, ",%llu", e[i]);
                fprintf(f, "\n");
            }
    }
    free(h);
    if (f) fclose(f);
    cudaFree(qt_dev);
    qt_dev = NULL;
}

/* the launch's slot, or -1 (tracing off, or out of slots) */
static int qt_slot(long long N, long long K, int bits, int epi, int map, int norm, int blocks) {
    if (qt_state < 0) {
        qt_state = 0;
        const size_t bytes = (size_t)QT_KERNELS * QT_BLOCKS * QT_POINTS * 8;
        if (getenv("KILN_QGEMV_TRACE")) {
            if (cudaMalloc(&qt_dev, bytes) == cudaSuccess && cudaMemset(qt_dev, 0, bytes) == cudaSuccess &&
                cudaMemcpyToSymbol(qt_buf, &qt_dev, sizeof qt_dev) == cudaSuccess) {
                qt_state = 1;
                atexit(qt_dump);
            } else {
                cudaGetLastError();
                fprintf(stderr, "kiln: qgemv trace: no device buffer, tracing off\n");
            }
        }
    }
    if (qt_state != 1 || qt_next >= QT_KERNELS || blocks > QT_BLOCKS) return -1;
    qt_host_meta[qt_next] = qt_meta{N, K, bits, epi, map, norm, blocks};
    return qt_next++;
}

#define QT_GEOM_FIELD int trace_id; /* the launch's slot (-1: none) */
#define QT_BEGIN(gm)                                                                                              \
    const int qt_id = threadIdx.x == 0 ? (gm).trace_id : -1;                                                      \
    qt_mark(qt_id, 0);                                                                                            \
    qt_smid(qt_id)
#define QT_MARK(i) qt_mark(qt_id, i)
#define QT_WAIT() kn_pdl_wait() /* the wait marked on its own (qg_begin's own wait then returns at once) */
#define QT_END(gm)                                                                                                \
    if ((gm).trace_id >= 0) {                                                                                     \
        QT_MARK(5);                                                                                               \
        __syncthreads();                                                                                          \
        QT_MARK(6);                                                                                               \
    }
#define QT_SLOT(gm, N, K, bits, epi, map, norm, blocks) (gm).trace_id = qt_slot(N, K, bits, epi, map, norm, blocks)

#else /* not traced: nothing */
#define QT_GEOM_FIELD
#define QT_BEGIN(gm) ((void)0)
#define QT_MARK(i) ((void)0)
#define QT_WAIT() ((void)0)
#define QT_END(gm) ((void)0)
#define QT_SLOT(gm, N, K, bits, epi, map, norm, blocks) ((void)0)
#endif

#endif

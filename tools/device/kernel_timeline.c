/* kernel_timeline.c — a kernel timeline of any CUDA process, CUDA graphs and
 * programmatic dependent launches included, for finding what the GPU does
 * between and beside kernels (KILN_CUDA_PROFILE times ops one at a time,
 * without graphs; ncu serialises kernels; nsys is not on the GPU machine).
 *
 * Built as a preload library over CUPTI's activity API (kernel records are
 * written by the driver as kernels run; CONCURRENT_KERNEL does not serialise
 * them). At exit it writes one CSV row per kernel to $KN_TIMELINE_OUT
 * (default kernel_timeline.csv): start and end in ns, grid, block, registers,
 * dynamic shared memory, graph id (0 outside graphs) and the mangled name.
 * tools/device/timeline_report.py summarises the file.
 *
 *   gcc -O2 -shared -fPIC tools/device/kernel_timeline.c -I$CUDA/include \
 *       -L$CUPTI_LIB -lcupti -Wl,-rpath,$CUPTI_LIB -o /tmp/libkntl.so
 *   KN_TIMELINE_OUT=$OUT/tl.csv LD_PRELOAD=/tmp/libkntl.so kiln bench ...
 *
 * Measurement only: not part of kiln's build. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t start, end;
    int32_t grid[3], block;
    int32_t regs, dyn_smem;
    uint32_t graph;
    char *name; /* owned */
} kt_record;

static kt_record *recs;
static size_t n_recs, cap_recs;
static int enabled;

#define KT_BUFFER_BYTES (8u << 20)

static void CUPTIAPI kt_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, KT_BUFFER_BYTES);
    *size = *buffer ? KT_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void kt_keep(const CUpti_ActivityKernel10 *k) {
    if (n_recs == cap_recs) {
        size_t cap = cap_recs ? 2 * cap_recs : 1 << 16;
        kt_record *p = realloc(recs, cap * sizeof *p);
        if (!p) return; /* out of memory: the record is dropped */
        recs = p, cap_recs = cap;
    }
    kt_record *r = &recs[n_recs++];
    r->start = k->start, r->end = k->end;
    r->grid[0] = k->gridX, r->grid[1] = k->gridY, r->grid[2] = k->gridZ, r->block = k->blockX * k->blockY * k->blockZ;
    r->regs = k->registersPerThread, r->dyn_smem = k->dynamicSharedMemory;
    r->graph = k->graphId;
    r->name = strdup(k->name ? k->name : "?");
}

static void CUPTIAPI kt_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) kt_keep((const CUpti_ActivityKernel10 *)rec);
    free(buffer);
}

__attribute__((constructor)) static void kt_start(void) {
    if (cuptiActivityRegisterCallbacks(kt_buffer_requested, kt_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_timeline: CUPTI activity tracing could not be enabled; no timeline\n");
        return;
    }
    enabled = 1;
}

__attribute__((destructor)) static void kt_finish(void) {
    if (!enabled) return;
    cuptiActivityFlushAll(1);
    const char *path = getenv("KN_TIMELINE_OUT") ? getenv("KN_TIMELINE_OUT") : "kernel_timeline.csv";
    if (n_recs == 0) return; /* a process that ran no kernel (e.g. `timeout` wrapping kiln) keeps the file */
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kernel_timeline: cannot write %s\n", path);
        return;
    }
    fprintf(f, "start_ns,end_ns,grid_x,grid_y,grid_z,block,regs,dyn_smem,graph,name\n");
    for (size_t i = 0; i < n_recs; i++) {
        const kt_record *r = &recs[i];
        fprintf(f, "%llu,%llu,%d,%d,%d,%d,%d,%d,%u,%s\n", (unsigned long long)r->start, (unsigned long long)r->end,
                r->grid[0], r->grid[1], r->grid[2], r->block, r->regs, r->dyn_smem, r->graph, r->name);
        free(r->name);
    }
    fclose(f);
    free(recs);
    fprintf(stderr, "kernel_timeline: %zu kernels -> %s\n", n_recs, path);
}

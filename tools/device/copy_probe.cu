/* copy_probe.cu — how fast can a decode GEMV's warps pull weights through an
 * SM? Streams a large buffer once per pass the ways a quantized GEMV can load
 * its weights, with nothing computed, and prints the sustained read rate of
 * each way next to a plain vectorised read (the ceiling kiln's floor uses):
 *
 *   bulk   each warp's lane 0 asks the copy engine (cp.async.bulk, completion
 *          on an mbarrier per stage) for a chunk in COPIES pieces; S stages
 *          per warp (kiln's k_qgemv_bulk: 16 warps an SM, 2 stages of ~4.6 KB
 *          in 6 copies)
 *   async  every lane copies 16-byte pieces (cp.async.cg, one commit group
 *          per stage, wait_group S-1), the same stages
 *   ldg    every lane keeps U 16-byte loads in flight in registers
 *
 * Warps take chunks round-robin (chunk w, w + warps, ...), as the GEMV's
 * column sets. Measurement only: not part of kiln's build.
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 tools/device/copy_probe.cu -o /tmp/copy_probe
 *   /tmp/copy_probe            (a table of modes and shapes) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct probe_args {
    const uint8_t *src;
    unsigned *sink;
    long long chunks; /* chunks of the buffer */
    int chunk_bytes, copies, stages;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__global__ void k_bulk(probe_args a) {
    extern __shared__ __align__(128) uint8_t dyn[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint64_t *bars = (uint64_t *)dyn + warp * 8;
    uint8_t *buf = dyn + nw * 64 + (size_t)warp * a.stages * a.chunk_bytes;
    const long long w0 = (long long)blockIdx.x * nw + warp, stride = (long long)gridDim.x * nw;
    const int piece = a.chunk_bytes / a.copies;
    if (lane == 0)
        for (int s = 0; s < a.stages; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    auto issue = [&](long long c, int s) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bars + s)),
                     "r"(a.chunk_bytes)
                     : "memory");
        for (int k = 0; k < a.copies; k++)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             smem_u32(buf + (size_t)s * a.chunk_bytes + k * piece)),
                         "l"(a.src + c * a.chunk_bytes + (long long)k * piece), "r"(piece), "r"(smem_u32(bars + s))
                         : "memory");
    };
    long long next = w0;
    for (int s = 0; s < a.stages && next < a.chunks; s++, next += stride)
        if (lane == 0) issue(next, s);
    unsigned acc = 0, parity = 0;
    int s = 0;
    for (long long c = w0; c < a.chunks; c += stride) {
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(smem_u32(bars + s)), "r"(parity)
                         : "memory");
        acc += ((const unsigned *)(buf + (size_t)s * a.chunk_bytes))[lane];
        __syncwarp();
        if (next < a.chunks) {
            if (lane == 0) issue(next, s);
            next += stride;
        }
        if (++s == a.stages) s = 0, parity ^= 1u;
    }
    if (acc == 0x12345678u) a.sink[0] = acc;
}

__global__ void k_async(probe_args a) {
    extern __shared__ __align__(128) uint8_t dyn[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint8_t *buf = dyn + (size_t)warp * a.stages * a.chunk_bytes;
    const long long w0 = (long long)blockIdx.x * nw + warp, stride = (long long)gridDim.x * nw;
    const int units = a.chunk_bytes / 16;
    auto issue = [&](long long c, int s) {
        for (int u = lane; u < units; u += 32)
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(
                             smem_u32(buf + (size_t)s * a.chunk_bytes + u * 16)),
                         "l"(a.src + c * a.chunk_bytes + u * 16)
                         : "memory");
    };
    long long next = w0;
    for (int s = 0; s < a.stages; s++, next += stride) { /* one group per stage, empty past the end */
        if (next < a.chunks) issue(next, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    unsigned acc = 0;
    int s = 0;
    for (long long c = w0; c < a.chunks; c += stride) {
        /* the oldest of the stages groups in flight has landed */
        switch (a.stages) {
        case 2: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        default: __trap(); /* run() takes 2, 3, 4 or 6 stages only */
        }
        __syncwarp();
        acc += ((const unsigned *)(buf + (size_t)s * a.chunk_bytes))[lane];
        __syncwarp();
        if (next < a.chunks) issue(next, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
        next += stride;
        if (++s == a.stages) s = 0;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (acc == 0x12345678u) a.sink[0] = acc;
}

template <int U>
__global__ void k_ldg(probe_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const long long w0 = (long long)blockIdx.x * nw + warp, stride = (long long)gridDim.x * nw;
    const int units = a.chunk_bytes / 16; /* a chunk: U 16-byte loads per lane */
    uint4 acc = {0, 0, 0, 0};
    for (long long c = w0; c < a.chunks; c += stride) {
        const uint4 *p = (const uint4 *)(a.src + c * a.chunk_bytes);
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = lane + 32 * u < units ? __ldcs(p + lane + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) acc.x ^= v[u].x, acc.y += v[u].y, acc.z ^= v[u].z, acc.w += v[u].w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) a.sink[0] = acc.x;
}

static const size_t BUF = (size_t)2 << 30; /* 2 GiB: far past the L2 */

static double run(const char *mode, int warps, int blocks_per_sm, int chunk, int copies, int stages, const uint8_t *src,
                  unsigned *sink, int sms) {
    probe_args a = {src, sink, (long long)(BUF / chunk), chunk, copies, stages};
    size_t smem = 0;
    void (*k)(probe_args) = nullptr;
    if (mode[0] == 'a' && !(stages >= 2 && stages <= 4) && stages != 6) return -1;
    if (mode[0] == 'l' && chunk != 2048 && chunk != 4096 && chunk != 8192) return -1;
    if (mode[0] == 'b') k = k_bulk, smem = (size_t)warps * 64 + (size_t)warps * stages * chunk;
    else if (mode[0] == 'a') k = k_async, smem = (size_t)warps * stages * chunk;
    else if (chunk == 2048) k = k_ldg<4>;
    else if (chunk == 4096) k = k_ldg<8>;
    else k = k_ldg<16>;
    if (smem > 227 * 1024) return -1;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    int fit = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, warps * 32, smem));
    if (fit < blocks_per_sm) return -1;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        CHECK(cudaEventRecord(e0));
        k<<<sms * blocks_per_sm, warps * 32, smem>>>(a);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaGetLastError());
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double gbs = (double)a.chunks * chunk / (ms * 1e-3) / 1e9;
        if (rep > 0 && gbs > best) best = gbs; /* the first pass warms up */
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

int main(void) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint8_t *src;
    unsigned *sink;
    CHECK(cudaMalloc(&src, BUF));
    CHECK(cudaMalloc(&sink, 64));
    CHECK(cudaMemset(src, 1, BUF));
    struct {
        const char *mode;
        int warps, bps, chunk, copies, stages;
    } cases[] = {
        {"ldg", 8, 4, 4096, 1, 1},   {"ldg", 8, 8, 2048, 1, 1},   {"ldg", 8, 2, 8192, 1, 1},
        {"bulk", 8, 2, 4608, 6, 2},  /* kiln's k_qgemv_bulk today (4-bit g64, bf16 scales) */
        {"bulk", 8, 2, 4608, 2, 2},  {"bulk", 8, 2, 4608, 1, 2},  {"bulk", 8, 2, 4608, 18, 2},
        {"bulk", 8, 2, 4096, 1, 3},  {"bulk", 8, 2, 2048, 1, 6},  {"bulk", 8, 1, 8192, 1, 3},
        {"bulk", 8, 1, 16384, 1, 2}, {"bulk", 4, 2, 16384, 1, 2}, {"bulk", 16, 1, 4608, 6, 3},
        {"async", 8, 2, 4608, 1, 2}, {"async", 8, 2, 4096, 1, 3}, {"async", 8, 2, 2048, 1, 6},
        {"async", 16, 1, 4608, 1, 3}, {"async", 8, 1, 8192, 1, 3},
    };
    printf("%d SMs; each mode streams %zu MiB once per pass (best of 5 passes)\n", sms, BUF >> 20);
    printf("%-6s %5s %5s %7s %6s %6s %9s\n", "mode", "warps", "blk/SM", "chunk", "copies", "stages", "GB/s");
    for (auto &c : cases) {
        const double g = run(c.mode, c.warps, c.bps, c.chunk, c.copies, c.stages, src, sink, sms);
        if (g < 0) printf("%-6s %5d %5d %7d %6d %6d %9s\n", c.mode, c.warps, c.bps, c.chunk, c.copies, c.stages, "no fit / shape not taken");
        else printf("%-6s %5d %5d %7d %6d %6d %9.1f\n", c.mode, c.warps, c.bps, c.chunk, c.copies, c.stages, g);
    }
    return 0;
}

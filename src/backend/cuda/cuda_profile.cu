/* cuda_profile.cu — the clock of KILN_CUDA_PROFILE=1 runs: the generic op
 * profiler (backend/op_profile.h) with each mark a CUDA event recorded on
 * the backend's stream, so an op's time is GPU time between its two events.
 * Graphs stay off under the profiler, so every op is visible. Measurement
 * only: never on in normal runs. */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "backend/op_profile.h"
}

static cudaEvent_t events[KN_PROFILE_SLOTS]; /* one profiled backend per process */

static void ev_mark(kn_backend *be, int slot) { cudaEventRecord(events[slot], kn_cuda_stream(be)); }
static void ev_flush(kn_backend *be) { cudaStreamSynchronize(kn_cuda_stream(be)); }
static double ev_elapsed_ms(kn_backend *be, int a, int b) {
    (void)be;
    float ms = 0;
    return cudaEventElapsedTime(&ms, events[a], events[b]) == cudaSuccess ? (double)ms : -1.0;
}
static void ev_release(kn_backend *be) {
    (void)be;
    for (int i = 0; i < KN_PROFILE_SLOTS; i++) cudaEventDestroy(events[i]);
}

const kn_backend_vtbl *kn_cuda_profile_vtbl(const kn_backend_vtbl *real) {
    for (int i = 0; i < KN_PROFILE_SLOTS; i++) cudaEventCreate(&events[i]);
    static const kn_profile_clock clock = {ev_mark, ev_flush, ev_elapsed_ms, ev_release};
    return kn_profile_vtbl(real, &clock, "KILN_CUDA_PROFILE");
}

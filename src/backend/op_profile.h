/* op_profile.h — per-op time of any backend, for finding where a forward
 * spends it (KILN_CPU_PROFILE=1, KILN_CUDA_PROFILE=1).
 *
 * kn_profile_vtbl returns a vtable whose ops call the real ones between two
 * time marks. A backend supplies the clock: the CPU reads the wall clock
 * (its ops are synchronous), CUDA records events on its stream (graphs stay
 * off so every op is visible). Marks are harvested at each sync and
 * download; the table (total and mean time per op and matmul shape, largest
 * first) goes to stderr when the backend is destroyed. The first call of
 * each row is left out: it pays one-time costs (algorithm timing, lazy
 * allocation). Measurement only: never on in normal runs. One profiled
 * backend per process. */
#ifndef KN_OP_PROFILE_H
#define KN_OP_PROFILE_H

#include "backend/backend.h"

#define KN_PROFILE_SLOTS 16384 /* time marks (two per op) held until a harvest */

typedef struct {
    /* record mark slot (< KN_PROFILE_SLOTS) at the current point of be's work */
    void (*mark)(kn_backend *be, int slot);
    /* wait until every recorded mark has its time */
    void (*flush)(kn_backend *be);
    /* milliseconds from mark a to mark b (negative: unknown) */
    double (*elapsed_ms)(kn_backend *be, int a, int b);
    /* optional: free the clock's resources (before the backend goes) */
    void (*release)(kn_backend *be);
} kn_profile_clock;

/* The profiling vtable over real; title heads the table ("KILN_CPU_PROFILE"). */
const kn_backend_vtbl *kn_profile_vtbl(const kn_backend_vtbl *real, const kn_profile_clock *clock, const char *title);

/* The switch: env is set and neither empty nor "0". */
int kn_profile_wanted(const char *env);

#endif

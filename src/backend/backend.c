/* backend.c — backend registry: create a backend by name. */
#include <string.h>

#include "backend/backend.h"

kn_code kn_cpu_backend_create(int n_threads, kn_backend **out, kn_error *err);
#ifdef KILN_HAVE_CUDA
kn_code kn_cuda_backend_create(int n_threads, kn_backend **out, kn_error *err);
#endif

kn_code kn_backend_create(const char *name, int n_threads, kn_backend **out, kn_error *err) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) return kn_cpu_backend_create(n_threads, out, err);
#ifdef KILN_HAVE_CUDA
    if (!strcmp(name, "cuda")) return kn_cuda_backend_create(n_threads, out, err);
    return kn_fail(err, KN_ERR_INVALID_ARG, "unknown backend \"%s\" (supported: cpu, cuda)", name);
#else
    if (!strcmp(name, "cuda"))
        return kn_fail(err, KN_ERR_UNSUPPORTED, "backend \"cuda\" is not available in this build (supported: cpu)");
    return kn_fail(err, KN_ERR_INVALID_ARG, "unknown backend \"%s\" (supported: cpu)", name);
#endif
}

void kn_backend_destroy(kn_backend *be) {
    if (be) be->vt->destroy(be);
}

/* backend.c — backend registry: create a backend by name. */
#include <string.h>

#include "backend/backend.h"
#include "base/quant.h"

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

kn_code kn_be_weight_load_quant(kn_backend *be, const kn_quant_host *src, kn_weight *out, kn_error *err) {
    kn_code rc = kn_quant_check_compute("quantized weight", src->bits, src->group_size, src->rows, src->cols, err);
    if (rc) return rc;
    if (src->sb_dtype != KN_DT_F32 && src->sb_dtype != KN_DT_BF16 && src->sb_dtype != KN_DT_F16)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "quantized weight: scales/biases of dtype %s (supported: F32, BF16, F16)",
                       kn_dtype_name(src->sb_dtype));
    if (!be->vt->weight_load_quant)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "the %s backend has no quantized weights", be->vt->name);
    return be->vt->weight_load_quant(be, src, out, err);
}

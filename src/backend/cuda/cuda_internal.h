/* cuda_internal.h — what CUDA op files share with cuda_backend.cu: the
 * backend's stream, error reporting, and the weight-element loader. Op
 * families live in their own cuda_ops_*.cu files; cuda_backend.cu's vtable
 * points at their host wrappers. */
#ifndef KN_CUDA_INTERNAL_H
#define KN_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}

/* The stream every op of this backend is enqueued on. */
cudaStream_t kn_cuda_stream(kn_backend *be);

/* Print a CUDA error (ops are infallible by contract; failures are reported). */
void kn_cuda_check(cudaError_t e, const char *what);

/* whisper op block (cuda_ops_whisper.cu) */
extern "C" void kn_cuda_im2col_1d(kn_backend *be, const float *x, int64_t xts, int64_t xcs, int t_in, int c_in,
                                  int k, int stride, int pad, float *out);
extern "C" void kn_cuda_attention_dense(kn_backend *be, const kn_dense_attention_args *a);

/* Element i of a weight stored as F32, BF16 or F16, widened to float. */
__device__ __forceinline__ float kn_cuda_load_w(const void *w, int64_t i, int dt) {
    if (dt == KN_DT_F32) return ((const float *)w)[i];
    if (dt == KN_DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    return __half2float(((const __half *)w)[i]);
}

#endif

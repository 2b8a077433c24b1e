/* cpu_ops_whisper.h — CPU implementations of the whisper op block of
 * backend.h (im2col_1d, attention_dense); cpu_backend.c's vtable points here. */
#ifndef KN_CPU_OPS_WHISPER_H
#define KN_CPU_OPS_WHISPER_H

#include "backend/backend.h"

void kn_cpu_im2col_1d(kn_backend *be, const float *x, int64_t x_t_stride, int64_t x_c_stride, int t_in, int c_in,
                      int k, int stride, int pad, float *out);
void kn_cpu_attention_dense(kn_backend *be, const kn_dense_attention_args *a);

#endif

/* cpu_kv.h — CPU ops over KV caches stored in a compressed row format
 * (base/kv_codec.h): quantize-on-write and attention that reads the stored
 * rows directly. The float32 layout stays in cpu_backend.c. */
#ifndef KN_CPU_KV_H
#define KN_CPU_KV_H

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_pool.h"

void kn_cpu_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                     int n_tokens, const int32_t *slots);
void kn_cpu_kv_convert(kn_backend *be, const kn_kv_layer *kv, const int32_t *src, const int32_t *dst, int n);
/* scratch: n_threads x scratch_len floats (one score area per thread); k:
 * the kernel set whose dot/axpy take the per-row products; the tasks run on
 * pool's threads (NULL: OpenMP's) */
void kn_cpu_attention_kv(kn_backend *be, kn_cpu_pool *pool, const kn_cpu_kernels *k, const kn_attention_args *a,
                         float *scratch, int64_t scratch_len);

#endif

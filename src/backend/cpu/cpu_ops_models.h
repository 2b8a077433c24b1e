/* cpu_ops_models.h — CPU implementations of the "model families" ops of
 * backend.h (soft-capping, scaling, sigmoid-gated add, MoE routing and
 * experts, gemma3n's AltUp stream mixing / magnitude matching / gaussian
 * top-k). cpu_backend.c puts them in its vtable. */
#ifndef KN_CPU_OPS_MODELS_H
#define KN_CPU_OPS_MODELS_H

#include "backend/backend.h"

void kn_cpu_softcap(kn_backend *be, float *x, int64_t n, float cap);
void kn_cpu_scale(kn_backend *be, float *x, int64_t n, float s);
void kn_cpu_sigmoid_gate_add(kn_backend *be, float *y, const float *x, const float *gate, int rows, int dim);
void kn_cpu_moe_route(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                      const float *expert_scale, int32_t *idx, float *w);
void kn_cpu_mul_rows(kn_backend *be, float *y, const float *x, int64_t x_stride, int rows, int dim);
void kn_cpu_moe_ffn(kn_backend *be, const kn_moe_args *a);
void kn_cpu_stream_mix(kn_backend *be, const float *src, int n_src, const float *base, float *out, int n_out,
                       int64_t stream_stride, const float *w, float w_add, int rows, int dim);
void kn_cpu_rms_match(kn_backend *be, float *x, const float *ref, int rows, int dim, float floor);
void kn_cpu_gaussian_topk(kn_backend *be, float *x, int64_t x_stride, int rows, int dim, float mult);

#endif

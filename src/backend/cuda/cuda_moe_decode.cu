/* cuda_moe_decode.cu — the routed experts of one MoE layer for a single
 * token (batch-1 decode), in two kernels that keep many weight loads in
 * flight and read only the k selected experts:
 *
 *   k_moe_gate_up: one warp per (slot, intermediate row r) streams the
 *     expert's gate row r and up row inter + r together, 16-byte pieces, 8
 *     per row in flight per lane, and writes act(gate) * up.
 *   k_moe_down: one warp per output element d reads row d of every selected
 *     expert's down matrix at once (one load per expert in flight per lane),
 *     and sums w_j * (down_j . a_j) over the slots in ascending expert id,
 *     as kn_moe_args specifies, writing out[d]: the combine step is fused.
 *
 * Weights bf16/f16 with rows 16-byte aligned; other cases decline (the
 * generic path of cuda_ops_models.cu runs). */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

#define MD_WARPS 8
#define MD_U 8     /* pieces per row in flight (gate/up) */
#define MD_MAXK 8  /* slots handled by the fused down kernel */

template <int DT>
__device__ __forceinline__ void md_unpack(uint4 u, float *f) {
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (DT == KN_DT_BF16) {
            f[2 * j] = __uint_as_float(v[j] << 16), f[2 * j + 1] = __uint_as_float(v[j] & 0xffff0000u);
        } else {
            const float2 t = __half22float2(*(const __half2 *)&v[j]);
            f[2 * j] = t.x, f[2 * j + 1] = t.y;
        }
    }
}

__device__ __forceinline__ float md_dot8(const float *w, const float *x) {
    const float4 a = __ldg((const float4 *)x), b = __ldg((const float4 *)(x + 4));
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

__device__ __forceinline__ float md_act(float g, int act) {
    if (act == KN_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    if (act == KN_ACT_GELU_ERF) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
    return g / (1.0f + expf(-g));
}

/* A[j, r] = act(gate_e . x) * (up_e . x), e = idx[j]; grid (inter / 8, k) */
template <int DT>
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_gate_up(const float *__restrict__ x, const uint16_t *__restrict__ w, int dim, int inter,
                  const int32_t *__restrict__ idx, int act, float *__restrict__ A) {
    const int lane = threadIdx.x & 31, j = blockIdx.y;
    const int r = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (r >= inter) return;
    const int64_t e = idx[j];
    const uint16_t *g = w + (e * 2 * inter + r) * (int64_t)dim, *u = g + (int64_t)inter * dim;
    float ag = 0.0f, au = 0.0f;
    for (int c0 = lane * 8; c0 < dim; c0 += 32 * 8 * MD_U) {
        uint4 rg[MD_U], ru[MD_U];
#pragma unroll
        for (int t = 0; t < MD_U; t++) {
            const int c = c0 + t * 32 * 8;
            if (c < dim) rg[t] = __ldcs((const uint4 *)(g + c)), ru[t] = __ldcs((const uint4 *)(u + c));
        }
#pragma unroll
        for (int t = 0; t < MD_U; t++) {
            const int c = c0 + t * 32 * 8;
            if (c >= dim) break;
            float f[8];
            md_unpack<DT>(rg[t], f);
            ag += md_dot8(f, x + c);
            md_unpack<DT>(ru[t], f);
            au += md_dot8(f, x + c);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        ag += __shfl_xor_sync(0xffffffffu, ag, o);
        au += __shfl_xor_sync(0xffffffffu, au, o);
    }
    if (lane == 0) A[(int64_t)j * inter + r] = md_act(ag, act) * au;
}

/* out[d] = sum over slots in ascending expert id of wt[j] * (down_e[d] . A[j]) */
template <int DT>
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_down(const float *__restrict__ A, const uint16_t *__restrict__ w, int dim, int inter,
               const int32_t *__restrict__ idx, const float *__restrict__ wt, int k, float *__restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int d = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (d >= dim) return;
    int order[MD_MAXK]; /* slots by ascending expert id */
    const uint16_t *row[MD_MAXK];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) {
        order[s] = s;
        row[s] = w;
    }
    for (int a = 1; a < k; a++) /* insertion sort of k <= 8 ids */
        for (int b = a; b > 0 && idx[order[b]] < idx[order[b - 1]]; b--) {
            const int t = order[b];
            order[b] = order[b - 1], order[b - 1] = t;
        }
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++)
        if (s < k) row[s] = w + ((int64_t)idx[order[s]] * dim + d) * inter;
    float dot[MD_MAXK];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) dot[s] = 0.0f;
    for (int c = lane * 8; c < inter; c += 32 * 8) {
        uint4 raw[MD_MAXK];
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s < k) raw[s] = __ldcs((const uint4 *)(row[s] + c));
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s < k) {
                float f[8];
                md_unpack<DT>(raw[s], f);
                dot[s] += md_dot8(f, A + (int64_t)order[s] * inter + c);
            }
    }
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) {
        if (s >= k) break;
        float v = dot[s];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc += v * wt[order[s]];
    }
    if (lane == 0) out[d] = acc;
}

template <int DT>
static void moe_decode_dt(cudaStream_t st, const kn_moe_args *a, float *A) {
    dim3 g1((unsigned)((a->inter + MD_WARPS - 1) / MD_WARPS), (unsigned)a->k);
    k_moe_gate_up<DT><<<g1, MD_WARPS * 32, 0, st>>>(a->x, (const uint16_t *)a->gate_up->data, a->dim, a->inter,
                                                    a->idx, a->act, A);
    k_moe_down<DT><<<(unsigned)((a->dim + MD_WARPS - 1) / MD_WARPS), MD_WARPS * 32, 0, st>>>(
        A, (const uint16_t *)a->down->data, a->dim, a->inter, a->idx, a->w, a->k, a->out);
}

int kn_cuda_moe_decode(kn_backend *be, const kn_moe_args *a) {
    const kn_weight *gu = a->gate_up, *dn = a->down;
    if (a->n_tokens != 1 || a->k < 1 || a->k > MD_MAXK || gu->bits || dn->bits || gu->dtype != dn->dtype ||
        (gu->dtype != KN_DT_BF16 && gu->dtype != KN_DT_F16))
        return 0;
    if (a->dim % 8 || a->inter % 8 || ((uintptr_t)gu->data & 15) || ((uintptr_t)dn->data & 15) ||
        ((uintptr_t)a->x & 15) || ((uintptr_t)a->scratch & 15))
        return 0;
    float *A = a->scratch; /* [k, inter] */
    if (gu->dtype == KN_DT_BF16) moe_decode_dt<KN_DT_BF16>(kn_cuda_stream(be), a, A);
    else moe_decode_dt<KN_DT_F16>(kn_cuda_stream(be), a, A);
    return 1;
}

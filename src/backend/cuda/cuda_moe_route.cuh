/* cuda_moe_route.cuh — MoE routing of one row of router logits by one warp,
 * shared by the routing kernel (cuda_ops_models.cu) and the MoE decode
 * kernel that routes in its prologue (cuda_moe_decode.cu). Semantics as
 * backend.h's moe_route. */
#ifndef KN_CUDA_MOE_ROUTE_CUH
#define KN_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/cuda_internal.h"

/* Routing of the row l [E] by the calling warp, E <= 32 RI: lane l holds experts l + 32 i.
 * ir / wr [k] (global or shared memory) receive the ids and weights.
 * Softmax, then k rounds of a warp argmax (higher p, ties to the lower id)
 * give the CPU's order; the top-k sum for renormalizing runs in that order,
 * as the CPU adds it (k <= 32: the slots stay in registers, lane j holding
 * slot j, and every lane forms the sum by shuffles; larger k: on lane 0
 * through memory). Taken experts become NaN (never > any). */
template <int RI>
__device__ __forceinline__ void kn_moe_route_row(const float *__restrict__ l, int E, int k, int norm,
                                                 const float *__restrict__ escale, int32_t *__restrict__ ir,
                                                 float *__restrict__ wr, int lane) {
    float p[RI], mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < RI; i++) {
        const int e = lane + 32 * i;
        p[i] = e < E ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
#pragma unroll
    for (int i = 0; i < RI; i++)
        if (lane + 32 * i < E) p[i] = expf(p[i] - mx), sum += p[i];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int i = 0; i < RI; i++)
        if (lane + 32 * i < E) p[i] /= sum;
    float mine_w = 0.0f; /* k <= 32: lane j keeps slot j in registers */
    int mine_e = 0;
    for (int j = 0; j < k; j++) {
        float bp = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < RI; i++)
            if (p[i] > bp) bp = p[i], be = lane + 32 * i; /* ascending ids: strict > keeps the lower */
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (op > bp || (op == bp && oe < be)) bp = op, be = oe;
        }
        if (be == 0x7fffffff) be = j < E ? j : 0; /* all NaN: garbage logits, still a valid id */
#pragma unroll
        for (int i = 0; i < RI; i++)
            if (lane + 32 * i == be) p[i] = __int_as_float(0x7fc00000);
        if (k <= 32) {
            if (lane == j) mine_w = bp, mine_e = be;
        } else if (lane == 0) {
            wr[j] = bp, ir[j] = be;
        }
    }
    if (k <= 32) { /* every lane adds the k weights in slot order, as lane 0 would */
        float s = 0.0f;
        if (norm)
            for (int j = 0; j < k; j++) s += __shfl_sync(0xffffffffu, mine_w, j);
        if (lane < k) {
            float v = norm ? mine_w / s : mine_w;
            if (escale) v *= escale[mine_e];
            wr[lane] = v, ir[lane] = mine_e;
        }
        return;
    }
    if (lane) return;
    if (norm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += wr[j];
        for (int j = 0; j < k; j++) wr[j] /= s;
    }
    if (escale)
        for (int j = 0; j < k; j++) wr[j] *= escale[ir[j]];
}

#endif

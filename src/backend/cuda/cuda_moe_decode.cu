/* cuda_moe_decode.cu — the routed experts of one MoE layer token by token,
 * reading only the k selected experts of each token.
 *
 * bf16/f16 experts, one token (batch-1 decode): two kernels that keep many
 * weight loads in flight:
 *
 *   k_moe_gate_up: one warp per (slot, intermediate row r) streams the
 *     expert's gate row r and up row inter + r together, 16-byte pieces, 4
 *     per row in flight per lane (3 blocks per SM), and writes act(gate) * up.
 *   k_moe_down_slots (k dividing 8, inter a multiple of 256): a block makes
 *     8 outputs, each warp streaming one slot's rows as one contiguous run;
 *     k_moe_down (other shapes): one warp per output element d reads row d
 *     of every selected expert's down matrix at once. Both sum
 *     w_j * (down_j . a_j) over the slots in ascending expert id, as
 *     kn_moe_args specifies, writing out[d]: the combine step is fused. They
 *     read the ids and issue their first weight loads before the
 *     programmatic wait (while the gate/up kernel's last blocks finish).
 *     Where inter <= 1,024 the slots kernel holds its slot's activation
 *     pieces in registers (k_moe_down_slots_reg); otherwise the kernels stage
 *     the k activation rows in shared memory while the loads are in flight.
 *
 * MLX-quantized experts, one token, SiLU: the gate/up runs on the dense
 * quantized GEMV's streaming kernel (cuda_qgemv.cu: dp4a over x carried as
 * int8 terms, weights copied in by the copy engine), its rows mapped to the
 * selected experts, with the layer's RMSNorm fused; the down on it too where
 * its rows split into whole 16-byte copies (each output row a virtual row
 * running through the k selected experts' rows, each slot's activations
 * scaled by its routing weight), else on the down kernels below.
 *
 * MLX-quantized experts (any number of tokens): the same two-kernel shape
 * over (token, slot) with each row dequantized in float32 (scale * q + bias,
 * as base/quant.h defines), so results match the dequantized float32 experts
 * up to summation order. 4/8-bit stacks whose rows split into 16-byte pieces
 * (k_moe_gate_up_qp, k_moe_down_qp) request all of a warp's pieces at once
 * (gate and up rows together; row d of every selected expert together);
 * other stacks (2-bit, wider rows) go word by word (k_moe_gate_up_q,
 * k_moe_down_q).
 *
 * The layer's RMSNorm (kn_moe_args.norm_w) is fused into the bf16/f16
 * gate/up kernel and the streaming quantized one; the other quantized
 * kernels decline it (the caller normalizes first). The residual add
 * (accumulate) is fused into every down kernel.
 * Routing (kn_moe_args.logits) runs in its own kernel first (the caller,
 * kn_cuda_moe_ffn; routing in the gate/up kernel's prologue measured 8%
 * slower on the H200, 2026-12-05).
 *
 * Other cases decline (the generic path of cuda_ops_models.cu runs). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define MD_WARPS 8
/* pieces per row in flight (gate/up): 4, with the gate/up compiled for 3
 * blocks per SM (80 registers; 8 pieces took 121, so 2 blocks per SM): the
 * 768 blocks of the Qwen3-30B-A3B shape run in two waves instead of three.
 * H100, bf16, alternated over three rounds: 294.3-295.0 tok/s against
 * 290.4-290.9; the gate/up 22.3 us a layer against 25.0 (2026-12-06) */
#define MD_U 4
#define MD_GU_BLOCKS 3
#define MD_MAXK 8  /* slots handled by the fused down kernel */
#define MD_MAX_SMEM (160 << 10) /* normalized x in the gate/up kernel: dim <= 40960 */

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

/* x from global memory through the read-only path, or (SH) from shared memory */
template <bool SH = false>
__device__ __forceinline__ float md_dot8(const float *w, const float *x) {
    const float4 a = SH ? *(const float4 *)x : __ldg((const float4 *)x);
    const float4 b = SH ? *(const float4 *)(x + 4) : __ldg((const float4 *)(x + 4));
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

/* x in registers; the same sum as md_dot8 */
__device__ __forceinline__ float md_dot8r(const float *w, const float *x) {
    return w[0] * x[0] + w[1] * x[1] + w[2] * x[2] + w[3] * x[3] + w[4] * x[4] + w[5] * x[5] + w[6] * x[6] + w[7] * x[7];
}

__device__ __forceinline__ float md_act(float g, int act) {
    if (act == KN_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    if (act == KN_ACT_GELU_ERF) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
    return g / (1.0f + expf(-g));
}

/* A[j, r] = act(gate_e . x') * (up_e . x'), e = idx[j]; grid (inter / 8, k).
 * NORM: x' = rms_norm(x) * norm_w, formed by every block in shared memory
 * (dim floats) while its first weight loads are in flight, with the
 * arithmetic of the fused-norm GEMV (cuda_gemv.cu); otherwise x' = x. */
template <int DT, bool NORM>
__global__ void __launch_bounds__(MD_WARPS * 32, MD_GU_BLOCKS)
    k_moe_gate_up(const float *__restrict__ x, const uint16_t *__restrict__ w, int dim, int inter,
                  const int32_t *__restrict__ idx, int act, float *__restrict__ A,
                  const float *__restrict__ norm_w, float eps) {
    extern __shared__ float4 md_smem[];
    __shared__ float red[MD_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = blockIdx.y;
    kn_pdl_wait(); /* x and idx come from the kernels before */
    kn_pdl_trigger(); /* only now: the down kernel reads idx before its own wait */
    const int r = blockIdx.x * MD_WARPS + warp; /* < inter: the launch has inter % MD_WARPS == 0 */
    const int64_t e = idx[j];
    const uint16_t *g = w + (e * 2 * inter + r) * (int64_t)dim, *u = g + (int64_t)inter * dim;
    uint4 rg[MD_U], ru[MD_U];
    auto issue = [&](int c0) {
#pragma unroll
        for (int t = 0; t < MD_U; t++) {
            const int c = c0 + t * 32 * 8;
            if (c < dim) rg[t] = __ldcs((const uint4 *)(g + c)), ru[t] = __ldcs((const uint4 *)(u + c));
        }
    };
    issue(lane * 8);
    const float *xs = x;
    if (NORM) { /* the first pieces are in flight meanwhile */
        kn_block_rms_norm_smem<MD_WARPS>(x, dim, norm_w, eps, (float *)md_smem, red);
        xs = (const float *)md_smem;
    }
    float ag = 0.0f, au = 0.0f;
    for (int c0 = lane * 8; c0 < dim; c0 += 32 * 8 * MD_U) {
        if (c0 != lane * 8) issue(c0);
#pragma unroll
        for (int t = 0; t < MD_U; t++) {
            const int c = c0 + t * 32 * 8;
            if (c >= dim) break;
            float f[8];
            md_unpack<DT>(rg[t], f);
            ag += md_dot8<NORM>(f, xs + c);
            md_unpack<DT>(ru[t], f);
            au += md_dot8<NORM>(f, xs + c);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        ag += __shfl_xor_sync(0xffffffffu, ag, o);
        au += __shfl_xor_sync(0xffffffffu, au, o);
    }
    if (lane == 0) A[(int64_t)j * inter + r] = md_act(ag, act) * au;
}

/* the k <= MD_MAXK slots' expert ids (read past L1) and the slot order by
 * ascending id, in registers (insertion sort, fully unrolled).
 * The down kernels call this before their programmatic wait: idx was
 * written before the gate/up kernel passed its own wait, and that kernel
 * triggers only after it, so the ids are final once a down kernel runs
 * (the one exception to "nothing before the wait", cuda_internal.h). */
__device__ __forceinline__ void md_sort_slots(const int32_t *__restrict__ idx, int k, int (&order)[MD_MAXK],
                                              int (&id)[MD_MAXK]) {
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) order[s] = s, id[s] = s < k ? __ldcg(idx + s) : 0;
#pragma unroll
    for (int a = 1; a < MD_MAXK; a++)
#pragma unroll
        for (int b = a; b > 0; b--)
            if (b < k && id[b] < id[b - 1]) {
                const int t = order[b], v = id[b];
                order[b] = order[b - 1], order[b - 1] = t;
                id[b] = id[b - 1], id[b - 1] = v;
            }
}

/* the slots kernels' last step, by lane 0 of warp r once part is complete:
 * output row r of the block (out already offset to the block's first row),
 * the slots' sums weighted and added in ascending expert id */
__device__ __forceinline__ void md_slots_combine(const float (*part)[MD_WARPS], int r, const int32_t *__restrict__ idx,
                                                 const float *__restrict__ wt, int k, float *__restrict__ out,
                                                 int accumulate) {
    int order[MD_MAXK], id[MD_MAXK];
    md_sort_slots(idx, k, order, id);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < MD_MAXK; j++)
        if (j < k) acc += part[order[j]][r] * wt[order[j]];
    out[r] = accumulate ? out[r] + acc : acc;
}

/* out[d] (+)= sum over slots in ascending expert id of wt[j] * (down_e[d] . A[j]).
 * SH: the block copies A (k x inter floats) into shared memory after its
 * warps have issued their first weight loads; otherwise A is read from
 * global memory as it is used. */
template <int DT, bool SH>
__global__ void __launch_bounds__(MD_WARPS * 32, 2) /* 2 blocks per SM: at most 128 registers */
    k_moe_down(const float *__restrict__ A, const uint16_t *__restrict__ w, int dim, int inter,
               const int32_t *__restrict__ idx, const float *__restrict__ wt, int k, float *__restrict__ out,
               int accumulate) {
    extern __shared__ float4 md_smem[];
    const int lane = threadIdx.x & 31;
    kn_pdl_trigger();
    /* Before the wait: the ids and this warp's first weight loads (see
     * md_sort_slots); A and wt are read after the wait. */
    const int d0 = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    const bool on = d0 < dim; /* no early return: the block meets at a barrier below */
    const int d = on ? d0 : dim - 1;
    int order[MD_MAXK], id[MD_MAXK]; /* slots by ascending expert id */
    md_sort_slots(idx, k, order, id);
    const uint16_t *row[MD_MAXK];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) row[s] = s < k ? w + ((int64_t)id[s] * dim + d) * inter : w;
    float dot[MD_MAXK];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) dot[s] = 0.0f;
    /* two batches of k loads in flight: the next 256 columns' pieces are
     * issued before this batch is multiplied (inter 768: 3 batches) */
    uint4 raw[2][MD_MAXK];
    auto issue = [&](int c, uint4(&r)[MD_MAXK]) {
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s < k && c < inter) r[s] = __ldcs((const uint4 *)(row[s] + c));
    };
    const float *As = A;
    int c = lane * 8;
    issue(c, raw[0]);
    issue(c + 32 * 8, raw[1]);
    kn_pdl_wait(); /* A and wt come from the kernels before; out may be read by them */
    if (SH) { /* A into shared memory (16-byte pieces, all threads) while the weights are in flight */
        const int n4 = k * inter / 4;
        for (int i = threadIdx.x; i < n4; i += MD_WARPS * 32) md_smem[i] = __ldcg((const float4 *)A + i);
        __syncthreads();
        As = (const float *)md_smem;
    }
    auto use = [&](int c, const uint4(&r)[MD_MAXK]) {
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s < k) {
                float f[8];
                md_unpack<DT>(r[s], f);
                dot[s] += md_dot8<SH>(f, As + (int64_t)order[s] * inter + c);
            }
    };
    while (c < inter) {
        use(c, raw[0]);
        if ((c += 32 * 8) >= inter) break;
        issue(c + 32 * 8, raw[0]);
        use(c, raw[1]);
        if ((c += 32 * 8) >= inter) break;
        issue(c + 32 * 8, raw[1]);
    }
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) {
        if (s >= k) break;
        float v = dot[s];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc += v * wt[order[s]];
    }
    if (lane == 0 && on) out[d] = accumulate ? out[d] + acc : acc;
}

/* The same sums where k divides 8 and inter is a multiple of 256 (the
 * default there; KILN_MOE_DOWN_SLOTS=0 picks k_moe_down): a block computes 8
 * output rows and warp w streams one slot's rows, s = w / (8 / k), rows
 * [d0 + (w % (8 / k)) k, + k) of expert idx[s]: one contiguous run of
 * k * inter * 2 bytes, 8 pieces of 16 bytes per lane in flight, instead of
 * 8 short rows of 8 experts per warp. Lane l takes pieces l, l + 32, ... of
 * each row, as k_moe_down does, so every (slot, row) dot product is the same
 * sum; the products meet in shared memory and are added in ascending expert
 * id. A comes from shared memory (staged as in k_moe_down). */
template <int DT>
__global__ void __launch_bounds__(MD_WARPS * 32, 2)
    k_moe_down_slots(const float *__restrict__ A, const uint16_t *__restrict__ w, int dim, int inter,
                     const int32_t *__restrict__ idx, const float *__restrict__ wt, int k, float *__restrict__ out,
                     int accumulate) {
    extern __shared__ float4 md_smem[];     /* A [k][inter] */
    __shared__ float part[MD_MAXK][MD_WARPS]; /* [slot][row of the block] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    kn_pdl_trigger(); /* the ids and first weight loads before the wait, as in k_moe_down */
    const int wps = MD_WARPS / k;              /* warps per slot; each takes k rows */
    const int s = warp / wps, r0 = (warp % wps) * k, d0 = blockIdx.x * MD_WARPS;
    const int c = inter / 256, n = k * c; /* pieces per lane: per row, in all */
    const uint4 *src = (const uint4 *)(w + ((int64_t)__ldcg(idx + s) * dim + d0 + r0) * inter) + lane;
    uint4 raw[2][8];
    auto issue = [&](int b, uint4(&r)[8]) {
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (8 * b + u < n) r[u] = __ldcs(src + 32 * (8 * b + u));
    };
    issue(0, raw[0]);
    issue(1, raw[1]);
    kn_pdl_wait(); /* A and wt come from the kernels before; out may be read by them */
    const int n4 = k * inter / 4; /* A into shared memory while the weights are in flight */
    for (int i = threadIdx.x; i < n4; i += MD_WARPS * 32) md_smem[i] = __ldcg((const float4 *)A + i);
    __syncthreads();
    const float *As = (const float *)md_smem + (int64_t)s * inter;
    float cur = 0.0f;
    auto use = [&](int b, const uint4(&r)[8]) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = 8 * b + u, row = i / c, m = i - row * c;
            if (i >= n) break;
            float f[8];
            md_unpack<DT>(r[u], f);
            cur += md_dot8<true>(f, As + (32 * m + lane) * 8);
            if (m == c - 1) { /* the row's last piece: its warp sum */
                for (int o = 16; o > 0; o >>= 1) cur += __shfl_xor_sync(0xffffffffu, cur, o);
                if (lane == 0) part[s][r0 + row] = cur;
                cur = 0.0f;
            }
        }
    };
    const int nb = (n + 7) / 8;
    for (int b = 0; b < nb; b += 2) {
        use(b, raw[0]);
        if (b + 2 < nb) issue(b + 2, raw[0]);
        if (b + 1 < nb) use(b + 1, raw[1]);
        if (b + 3 < nb) issue(b + 3, raw[1]);
    }
    __syncthreads();
    if (lane == 0) md_slots_combine(part, warp, idx, wt, k, out + d0, accumulate);
}

/* k_moe_down_slots with the activations in registers, where C = inter / 256
 * is at most 4: a warp's k rows all belong to one slot, so lane l needs the
 * same C pieces of that slot's activation row for every one of them: 8 C
 * floats read once from global memory (L2) after the wait, instead of a
 * block-wide staging into shared memory and two shared-memory loads per
 * weight piece. The
 * batches are unrolled, so each piece's row and column are constants, and
 * the k row sums are kept apart and reduced together at the end. ncu on an
 * H100 had k_moe_down_slots issuing ~1,800 instructions a warp at ~14
 * cycles each: bound by its own instruction chain, at 40% of the DRAM's
 * bandwidth; this kernel took 16.1 us under ncu against 19.1, and decode
 * of the Qwen3-30B-A3B shape ran 1.0% faster (H100, alternated, 2026-12-05).
 * Same sums as k_moe_down_slots (and k_moe_down). */
template <int DT, int C>
__global__ void __launch_bounds__(MD_WARPS * 32, 2)
    k_moe_down_slots_reg(const float *__restrict__ A, const uint16_t *__restrict__ w, int dim, int inter,
                         const int32_t *__restrict__ idx, const float *__restrict__ wt, int k,
                         float *__restrict__ out, int accumulate) {
    static_assert(C >= 1 && C <= 4, "at most 4 pieces of 256 columns per row");
    constexpr int NB = (MD_MAXK * C + 7) / 8; /* batches of 8 pieces at most */
    __shared__ float part[MD_MAXK][MD_WARPS]; /* [slot][row of the block] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    kn_pdl_trigger(); /* the ids and first weight loads before the wait, as in k_moe_down */
    const int wps = MD_WARPS / k; /* warps per slot; each takes k rows */
    const int s = warp / wps, r0 = (warp % wps) * k, d0 = blockIdx.x * MD_WARPS;
    const int n = k * C; /* pieces per lane */
    const uint4 *src = (const uint4 *)(w + ((int64_t)__ldcg(idx + s) * dim + d0 + r0) * inter) + lane;
    uint4 raw[2][8];
    auto issue = [&](int b, uint4(&r)[8]) {
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (8 * b + u < n) r[u] = __ldcs(src + 32 * (8 * b + u));
    };
    issue(0, raw[0]);
    if (NB > 1) issue(1, raw[1]);
    kn_pdl_wait(); /* A and wt come from the kernels before; out may be read by them */
    float a[C][8];
    const float *As = A + (int64_t)s * inter + lane * 8;
#pragma unroll
    for (int m = 0; m < C; m++) {
        const float4 lo = __ldcg((const float4 *)(As + m * 256)), hi = __ldcg((const float4 *)(As + m * 256 + 4));
        a[m][0] = lo.x, a[m][1] = lo.y, a[m][2] = lo.z, a[m][3] = lo.w;
        a[m][4] = hi.x, a[m][5] = hi.y, a[m][6] = hi.z, a[m][7] = hi.w;
    }
    float dot[MD_MAXK];
#pragma unroll
    for (int r = 0; r < MD_MAXK; r++) dot[r] = 0.0f;
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (8 * b >= n) break;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = 8 * b + u, row = i / C, m = i % C;
            if (i >= n) break;
            float f[8];
            md_unpack<DT>(raw[b & 1][u], f);
            dot[row] += md_dot8r(f, a[m]);
        }
        if (b + 2 < NB) issue(b + 2, raw[b & 1]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < MD_MAXK; r++) dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < MD_MAXK; r++)
            if (r < k) part[s][r0 + r] = dot[r];
    __syncthreads();
    if (lane == 0) md_slots_combine(part, warp, idx, wt, k, out + d0, accumulate);
}

template <int DT, bool NORM> static int moe_decode_dt(kn_backend *be, const kn_moe_args *a, float *A) {
    const dim3 g1((unsigned)(a->inter / MD_WARPS), (unsigned)a->k);
    const dim3 g2((unsigned)((a->dim + MD_WARPS - 1) / MD_WARPS));
    const size_t smem = NORM ? (size_t)a->dim * sizeof(float) : 0;
    static size_t smem_allowed = 48 << 10; /* per instantiation */
    if (NORM && !kn_cuda_allow_smem(k_moe_gate_up<DT, NORM>, smem, MD_MAX_SMEM, &smem_allowed)) return 0;
    kn_cuda_run(be, "moe_gate_up", k_moe_gate_up<DT, NORM>, g1, dim3(MD_WARPS * 32), smem, a->x,
                (const uint16_t *)a->gate_up->data, a->dim, a->inter, (const int32_t *)a->idx, a->act, A, a->norm_w,
                a->eps);
    /* A in shared memory where it fits (k x inter floats: 24 KB for Qwen3-30B-A3B) */
    const size_t smem_a = (size_t)a->k * (size_t)a->inter * sizeof(float);
    static size_t rows_allowed = 48 << 10, slots_allowed = 48 << 10; /* one per kernel: the choice can vary by shape */
    static int slots = -1; /* KILN_MOE_DOWN_SLOTS=0: k_moe_down for every shape (A/B) */
    if (slots < 0) slots = kn_cuda_env_on("KILN_MOE_DOWN_SLOTS");
    const int use_slots = slots && MD_WARPS % a->k == 0 && a->inter % 256 == 0 && a->dim % MD_WARPS == 0;
    void (*down)(const float *, const uint16_t *, int, int, const int32_t *, const float *, int, float *, int) =
        use_slots ? k_moe_down_slots<DT> : k_moe_down<DT, true>;
    const int c = a->inter / 256;
    if (use_slots && c <= 4) {
        down = c == 1 ? k_moe_down_slots_reg<DT, 1>
               : c == 2 ? k_moe_down_slots_reg<DT, 2>
               : c == 3 ? k_moe_down_slots_reg<DT, 3>
                        : k_moe_down_slots_reg<DT, 4>;
        kn_cuda_run(be, "moe down", down, g2, dim3(MD_WARPS * 32), 0, (const float *)A,
                    (const uint16_t *)a->down->data, a->dim, a->inter, (const int32_t *)a->idx, (const float *)a->w,
                    a->k, a->out, a->accumulate);
        return 1;
    }
    const int sh = kn_cuda_allow_smem(down, smem_a, MD_MAX_SMEM, use_slots ? &slots_allowed : &rows_allowed);
    if (!sh) down = k_moe_down<DT, false>;
    kn_cuda_run(be, "moe down", down, g2, dim3(MD_WARPS * 32), sh ? smem_a : 0, (const float *)A,
                (const uint16_t *)a->down->data, a->dim, a->inter, (const int32_t *)a->idx, (const float *)a->w, a->k,
                a->out, a->accumulate);
    return 1;
}

template <int DT> static int moe_decode_norm(kn_backend *be, const kn_moe_args *a, float *A) {
    return a->norm_w ? moe_decode_dt<DT, true>(be, a, A) : moe_decode_dt<DT, false>(be, a, A);
}

/* an expert stack as the token-by-token kernels read it: MLX-quantized
 * (bits > 0: codes, scales/biases in sbdt) or float (dt) */
struct mq_w {
    const void *data, *sc, *bi;
    int sbdt, bits, gs, dt;
};
static mq_w mq_of(const kn_weight *w) {
    return mq_w{w->data, w->scales, w->biases, (int)w->sb_dtype, w->bits, w->group_size, (int)w->dtype};
}

/* dot of row `row` of w with x[0, K), reduced over the warp */
__device__ __forceinline__ float mq_dot(const mq_w &w, int64_t row, int64_t K, const float *__restrict__ x,
                                        int lane) {
    float acc = 0.0f;
    if (!w.bits) {
        for (int64_t c = lane; c < K; c += 32) acc += kn_cuda_load_w(w.data, row * K + c, w.dt) * __ldg(x + c);
    } else {
        const int per = 32 / w.bits, gshift = __ffs(w.gs) - 1; /* group sizes are powers of two */
        const uint32_t mask = (1u << w.bits) - 1u;
        const int64_t words = K / per, G = K / w.gs;
        const uint32_t *r = (const uint32_t *)w.data + row * words;
        for (int64_t w0 = lane; w0 < words; w0 += 32 * 4) {
            uint32_t v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = w0 + 32 * u < words ? __ldcs(r + w0 + 32 * u) : 0u;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int64_t wi = w0 + 32 * u;
                if (wi >= words) break;
                const int64_t c0 = wi * per, g = row * G + (c0 >> gshift);
                const float s = kn_cuda_load_w(w.sc, g, w.sbdt), b = kn_cuda_load_w(w.bi, g, w.sbdt);
                for (int i = 0; i < per; i++)
                    acc += (s * (float)((v[u] >> (w.bits * i)) & mask) + b) * __ldg(x + c0 + i);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

/* A[p, r] = act(gate . x_t) * (up . x_t), pair p = t * k + j; grid (inter / 8, k, n) */
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_gate_up_q(const float *__restrict__ x, mq_w w, int dim, int inter, int k, const int32_t *__restrict__ idx,
                    int act, float *__restrict__ A) {
    const int lane = threadIdx.x & 31, j = blockIdx.y, t = blockIdx.z;
    kn_pdl_trigger();
    kn_pdl_wait(); /* x and idx come from the kernels before */
    const int r = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (r >= inter) return;
    const int64_t p = (int64_t)t * k + j, e = idx[p], g = e * 2 * inter + r;
    const float *xt = x + (int64_t)t * dim;
    const float ag = mq_dot(w, g, dim, xt, lane), au = mq_dot(w, g + inter, dim, xt, lane);
    if (lane == 0) A[p * inter + r] = md_act(ag, act) * au;
}

/* out[t, d] = sum over t's slots in ascending expert id of wt * (down_e[d] . A[p]); grid (dim / 8, n) */
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_down_q(const float *__restrict__ A, mq_w w, int dim, int inter, const int32_t *__restrict__ idx,
                 const float *__restrict__ wt, int k, float *__restrict__ out, int accumulate) {
    const int lane = threadIdx.x & 31, t = blockIdx.y;
    kn_pdl_trigger();
    kn_pdl_wait(); /* A, idx and wt come from the kernels before */
    const int d = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (d >= dim) return;
    const int32_t *it = idx + (int64_t)t * k;
    float acc = 0.0f;
    int last = -1;
    for (int s = 0; s < k; s++) { /* next slot in ascending expert id */
        int best = -1;
        for (int j = 0; j < k; j++)
            if (it[j] > last && (best < 0 || it[j] < it[best])) best = j;
        if (best < 0) break;
        last = it[best];
        const int64_t p = (int64_t)t * k + best;
        acc += mq_dot(w, (int64_t)last * dim + d, inter, A + p * inter, lane) * wt[p];
    }
    if (lane == 0) out[(int64_t)t * dim + d] = accumulate ? out[(int64_t)t * dim + d] + acc : acc;
}

/* ---- 4/8-bit stacks, 16-byte pieces: every load of a warp in flight at once ----
 * A piece is 16 bytes of one row's codes (MQ_CP codes), inside one group
 * (group sizes are multiples of MQ_CP); lane l holds pieces l, l + 32, ...
 * The per-code arithmetic is mq_dot's (scale * q + bias, times x), so the
 * results differ from it only in summation order. */
template <int BITS> struct mq_bits {
    static constexpr int CP = 128 / BITS; /* codes per piece */
    static constexpr int PER = 32 / BITS; /* codes per 32-bit word */
};
#define MQ_GU_PIECES 4 /* pieces per lane per gate/up row: dim <= 128 * MQ_CP */
#define MQ_DN_PIECES 2 /* pieces per lane per down row and slot: inter <= 64 * MQ_CP */

/* sum over piece v's codes c0 .. c0 + CP of (s * q + b) * x[c] */
template <int BITS>
__device__ __forceinline__ float mq_piece_dot(uint4 v, float s, float b, const float *__restrict__ x) {
    constexpr int PER = mq_bits<BITS>::PER;
    constexpr uint32_t mask = (1u << BITS) - 1u;
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int h = 0; h < PER; h += 4) {
            const float4 xv = __ldg((const float4 *)(x + j * PER + h));
            const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) acc += (s * (float)((wd[j] >> (BITS * (h + i))) & mask) + b) * xs[i];
        }
    }
    return acc;
}

__device__ __forceinline__ float mq_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* k_moe_gate_up_q's contract (grid (inter / 8, k, n)); the gate and up rows'
 * pieces are requested together before any is used */
template <int BITS>
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_gate_up_qp(const float *__restrict__ x, mq_w w, int dim, int inter, int k, const int32_t *__restrict__ idx,
                     int act, float *__restrict__ A) {
    constexpr int CP = mq_bits<BITS>::CP;
    const int lane = threadIdx.x & 31, j = blockIdx.y, t = blockIdx.z;
    kn_pdl_trigger();
    kn_pdl_wait(); /* x and idx come from the kernels before */
    const int r = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (r >= inter) return;
    const int64_t p = (int64_t)t * k + j, rg = (int64_t)idx[p] * 2 * inter + r, ru = rg + inter;
    const int P = dim / CP, G = dim / w.gs, gshift = __ffs(w.gs) - 1;
    const uint4 *q = (const uint4 *)w.data;
    uint4 g[MQ_GU_PIECES], u[MQ_GU_PIECES];
#pragma unroll
    for (int i = 0; i < MQ_GU_PIECES; i++)
        if (lane + 32 * i < P) g[i] = __ldcs(q + rg * P + lane + 32 * i), u[i] = __ldcs(q + ru * P + lane + 32 * i);
    const float *xt = x + (int64_t)t * dim;
    float ag = 0.0f, au = 0.0f;
#pragma unroll
    for (int i = 0; i < MQ_GU_PIECES; i++) {
        const int pi = lane + 32 * i;
        if (pi >= P) break;
        const int c0 = pi * CP, gi = c0 >> gshift;
        ag += mq_piece_dot<BITS>(g[i], kn_cuda_load_w(w.sc, rg * G + gi, w.sbdt), kn_cuda_load_w(w.bi, rg * G + gi, w.sbdt),
                                 xt + c0);
        au += mq_piece_dot<BITS>(u[i], kn_cuda_load_w(w.sc, ru * G + gi, w.sbdt), kn_cuda_load_w(w.bi, ru * G + gi, w.sbdt),
                                 xt + c0);
    }
    ag = mq_warp_sum(ag), au = mq_warp_sum(au);
    if (lane == 0) A[p * inter + r] = md_act(ag, act) * au;
}

/* k_moe_down_q's contract (grid (dim / 8, n)); row d of every selected
 * expert requested at once, the slots summed in ascending expert id */
template <int BITS>
__global__ void __launch_bounds__(MD_WARPS * 32)
    k_moe_down_qp(const float *__restrict__ A, mq_w w, int dim, int inter, const int32_t *__restrict__ idx,
                  const float *__restrict__ wt, int k, float *__restrict__ out, int accumulate) {
    constexpr int CP = mq_bits<BITS>::CP;
    const int lane = threadIdx.x & 31, t = blockIdx.y;
    kn_pdl_trigger();
    kn_pdl_wait(); /* A, idx and wt come from the kernels before */
    const int d = blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
    if (d >= dim) return;
    const int32_t *it = idx + (int64_t)t * k;
    const int P = inter / CP, G = inter / w.gs, gshift = __ffs(w.gs) - 1;
    const uint4 *q = (const uint4 *)w.data;
    uint4 v[MD_MAXK][MQ_DN_PIECES];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++)
#pragma unroll
        for (int i = 0; i < MQ_DN_PIECES; i++)
            if (s < k && lane + 32 * i < P) v[s][i] = __ldcs(q + ((int64_t)it[s] * dim + d) * P + lane + 32 * i);
    float dot[MD_MAXK];
#pragma unroll
    for (int s = 0; s < MD_MAXK; s++) {
        dot[s] = 0.0f;
        if (s >= k) continue;
        const int64_t row = (int64_t)it[s] * dim + d;
        const float *a = A + ((int64_t)t * k + s) * inter;
#pragma unroll
        for (int i = 0; i < MQ_DN_PIECES; i++) {
            const int pi = lane + 32 * i;
            if (pi >= P) break;
            const int c0 = pi * CP, gi = c0 >> gshift;
            dot[s] += mq_piece_dot<BITS>(v[s][i], kn_cuda_load_w(w.sc, row * G + gi, w.sbdt),
                                         kn_cuda_load_w(w.bi, row * G + gi, w.sbdt), a + c0);
        }
        dot[s] = mq_warp_sum(dot[s]);
    }
    if (lane) return;
    float acc = 0.0f;
    int last = -1;
    for (int n = 0; n < k; n++) { /* next slot in ascending expert id */
        int best = -1;
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s < k && it[s] > last && (best < 0 || it[s] < it[best])) best = s;
        if (best < 0) break;
        last = it[best];
        float ds = 0.0f;
#pragma unroll
        for (int s = 0; s < MD_MAXK; s++)
            if (s == best) ds = dot[s]; /* a register, not a local-memory index */
        acc += ds * wt[(int64_t)t * k + best];
    }
    out[(int64_t)t * dim + d] = accumulate ? out[(int64_t)t * dim + d] + acc : acc;
}

/* 1 when stack w (rows of K codes) suits the piece kernels with at most
 * `pieces` pieces a lane per row */
static int mq_pieces_fit(const kn_weight *w, int64_t K, int pieces) {
    if (w->bits != 4 && w->bits != 8) return 0;
    const int cp = 128 / w->bits;
    return w->group_size % cp == 0 && K % cp == 0 && K / cp <= 32 * pieces && !((uintptr_t)w->data & 15);
}

/* the quantized down kernel over A [n * k, inter] */
static void moe_quant_down(kn_backend *be, const kn_moe_args *a, const float *A, int pieces) {
    const dim3 g2((unsigned)((a->dim + MD_WARPS - 1) / MD_WARPS), (unsigned)a->n_tokens);
    const kn_weight *dn = a->down;
    const int aligned = !((uintptr_t)A & 15);
    if (pieces && aligned && a->k <= MD_MAXK && mq_pieces_fit(dn, a->inter, MQ_DN_PIECES))
        kn_cuda_run(be, "moe_down_qp", dn->bits == 4 ? k_moe_down_qp<4> : k_moe_down_qp<8>, g2, dim3(MD_WARPS * 32), 0,
                    A, mq_of(dn), a->dim, a->inter, (const int32_t *)a->idx, (const float *)a->w, a->k, a->out,
                    a->accumulate);
    else
        kn_cuda_run(be, "moe_down_q", k_moe_down_q, g2, dim3(MD_WARPS * 32), 0, A, mq_of(dn), a->dim, a->inter,
                    (const int32_t *)a->idx, (const float *)a->w, a->k, a->out, a->accumulate);
}

/* any mix of quantized and float stacks (switch_mlp keeps a projection float
 * when its columns do not split into groups) */
static int moe_quant(kn_backend *be, const kn_moe_args *a) {
    float *A = a->scratch; /* [n * k, inter] */
    const dim3 g1((unsigned)((a->inter + MD_WARPS - 1) / MD_WARPS), (unsigned)a->k, (unsigned)a->n_tokens);
    /* the piece kernels where the shapes allow (KILN_MOE_Q_PIECES=0: the
     * word-by-word ones everywhere, A/B runs) */
    static int pieces_env = -2;
    if (pieces_env == -2) pieces_env = kn_cuda_env_on("KILN_MOE_Q_PIECES");
    const int aligned = !((uintptr_t)a->x & 15) && !((uintptr_t)A & 15);
    const kn_weight *gu = a->gate_up;
    /* one token, SiLU, 4/8-bit gate/up: the streaming dp4a kernel of dense
     * quantized GEMVs (cuda_qgemv.cu) over the selected experts' rows, the
     * RMSNorm fused (KILN_MOE_Q_BULK=0: the kernels below, A/B runs) */
    static int bulk_env = -2;
    if (bulk_env == -2) bulk_env = kn_cuda_env_on("KILN_MOE_Q_BULK");
    if (bulk_env && a->n_tokens == 1 && a->act == KN_ACT_SILU && aligned &&
        kn_cuda_qgemv_moe_gate_up(be, a->x, gu, (const int32_t *)a->idx, a->k, a->inter, A, a->norm_w, a->eps)) {
        static int down_env = -2; /* KILN_MOE_Q_BULK_DOWN=0: the down kernels below (A/B runs) */
        if (down_env == -2) down_env = kn_cuda_env_on("KILN_MOE_Q_BULK_DOWN");
        if (!down_env || !kn_cuda_qgemv_moe_down(be, A, a->down, (const int32_t *)a->idx, (const float *)a->w, a->k,
                                                 a->dim, a->out, a->accumulate))
            moe_quant_down(be, a, A, pieces_env);
        return 1;
    }
    if (a->norm_w) return 0; /* the caller normalizes first */
    if (pieces_env && aligned && mq_pieces_fit(gu, a->dim, MQ_GU_PIECES))
        kn_cuda_run(be, "moe_gate_up_qp", gu->bits == 4 ? k_moe_gate_up_qp<4> : k_moe_gate_up_qp<8>, g1,
                    dim3(MD_WARPS * 32), 0, a->x, mq_of(gu), a->dim, a->inter, a->k, (const int32_t *)a->idx,
                    a->act, A);
    else
        kn_cuda_run(be, "moe_gate_up_q", k_moe_gate_up_q, g1, dim3(MD_WARPS * 32), 0, a->x, mq_of(gu), a->dim,
                    a->inter, a->k, (const int32_t *)a->idx, a->act, A);
    moe_quant_down(be, a, A, pieces_env);
    return 1;
}

int kn_cuda_moe_decode(kn_backend *be, const kn_moe_args *a) {
    const kn_weight *gu = a->gate_up, *dn = a->down;
    if (a->logits) return 0; /* the caller routes first (kn_cuda_moe_ffn) */
    if (gu->bits || dn->bits) return moe_quant(be, a); /* declines a norm it cannot fuse: the caller normalizes */
    if (a->n_tokens != 1 || a->k < 1 || a->k > MD_MAXK || gu->bits || dn->bits || gu->dtype != dn->dtype ||
        (gu->dtype != KN_DT_BF16 && gu->dtype != KN_DT_F16))
        return 0;
    if (a->dim % 8 || a->inter % 8 || ((uintptr_t)gu->data & 15) || ((uintptr_t)dn->data & 15) ||
        ((uintptr_t)a->x & 15) || ((uintptr_t)a->scratch & 15) || ((uintptr_t)a->norm_w & 15))
        return 0;
    float *A = a->scratch; /* [k, inter] */
    return gu->dtype == KN_DT_BF16 ? moe_decode_norm<KN_DT_BF16>(be, a, A) : moe_decode_norm<KN_DT_F16>(be, a, A);
}

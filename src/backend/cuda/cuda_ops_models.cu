/* cuda_ops_models.cu — CUDA versions of the "model families" ops of
 * backend.h: logit soft-capping, scaling, the sigmoid-gated shared-expert
 * add, MoE routing and the routed experts. Same math and summation order as
 * cpu_ops_models.c (experts summed in ascending id per token).
 *
 * MoE experts: decode (one token) runs cuda_moe_decode.cu's two fused
 * kernels where they apply, else one warp per output row of each selected
 * expert, 16-byte weight loads; either way only the k active experts are
 * read. Prefill sorts the (token, slot) pairs by expert on the device
 * (counting sort, one block) and runs one block per (expert, 8 rows), each
 * weight row read once per group of up to 8 of that expert's tokens staged in
 * shared memory. Tensor-core GEMMs for large expert groups are still to come. */
#include "backend/cuda/cuda_internal.h"

#define S kn_cuda_stream(be)

__global__ void k_softcap(float *x, int64_t n, float cap) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

__global__ void k_scale(float *x, int64_t n, float s) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void k_sigmoid_gate_add(float *y, const float *x, const float *gate, int64_t n, int dim) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = 1.0f / (1.0f + expf(-gate[i / dim]));
    y[i] += g * x[i];
}

__global__ void k_mul_rows(float *y, const float *x, int64_t x_stride, int64_t n, int dim) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= x[(i / dim) * x_stride + i % dim];
}

/* Routing of the row l [E] by the calling warp, E <= 32 RI: lane l holds experts l + 32 i.
 * ir / wr [k] receive the ids and weights.
 * Softmax, then k rounds of a warp argmax (higher p, ties to the lower id)
 * give the CPU's order; the top-k sum for renormalizing runs in that order,
 * as the CPU adds it (k <= 32: the slots stay in registers, lane j holding
 * slot j, and every lane forms the sum by shuffles; larger k: on lane 0
 * through memory). Taken experts become NaN (never > any). */
template <int RI>
__device__ __forceinline__ void moe_route_row(const float *__restrict__ l, int E, int k, int norm,
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

/* MoE routing, a warp per row */
template <int RI>
__global__ void k_moe_route(const float *__restrict__ logits, int rows, int E, int k, int norm,
                            const float *__restrict__ escale, int32_t *__restrict__ idx, float *__restrict__ w) {
    kn_pdl_trigger();
    kn_pdl_wait();
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    moe_route_row<RI>(logits + (int64_t)r * E, E, k, norm, escale, idx + (int64_t)r * k, w + (int64_t)r * k, lane);
}

/* 8 consecutive weights from 16 bytes (bf16/f16) or two 16-byte loads (f32) */
template <int DT>
__device__ __forceinline__ void load8(const void *w, int64_t i, float *o) {
    if (DT == KN_DT_F32) {
        float4 a = *(const float4 *)((const float *)w + i), b = *(const float4 *)((const float *)w + i + 4);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
        uint4 u = *(const uint4 *)((const uint16_t *)w + i);
        const uint16_t *h = (const uint16_t *)&u;
        for (int j = 0; j < 8; j++) {
            if (DT == KN_DT_BF16) o[j] = __uint_as_float((uint32_t)h[j] << 16);
            else o[j] = __half2float(__ushort_as_half(h[j]));
        }
    }
}

/* out[p, r] = W[e(p) * rows_per_expert + r] . x[p / x_div] for pair p; one
 * warp per (p, r). VEC: cols % 8 == 0 and the data 16-byte aligned, so each
 * lane streams 16-byte weight loads. */
template <int DT, bool VEC>
__global__ void k_moe_rows(const float *x, int64_t x_stride, int x_div, const void *wdata, int64_t cols,
                           int64_t rows_per_expert, const int32_t *idx, float *out) {
    int p = blockIdx.y;
    int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows_per_expert) return;
    int lane = threadIdx.x % 32, e = idx[p];
    const float *xr = x + (int64_t)(p / x_div) * x_stride;
    int64_t base = ((int64_t)e * rows_per_expert + r) * cols;
    float acc = 0.0f;
    if (VEC) {
        for (int64_t c = (int64_t)lane * 8; c < cols; c += 32 * 8) {
            float wv[8];
            load8<DT>(wdata, base + c, wv);
            float4 x0 = *(const float4 *)(xr + c), x1 = *(const float4 *)(xr + c + 4);
            acc += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x + wv[5] * x1.y +
                   wv[6] * x1.z + wv[7] * x1.w;
        }
    } else {
        for (int64_t c = lane; c < cols; c += 32) acc += kn_cuda_load_w(wdata, base + c, DT) * xr[c];
    }
    for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) out[(int64_t)p * rows_per_expert + r] = acc;
}

template <int DT>
static void moe_rows_dt(cudaStream_t st, dim3 grid, int threads, const float *x, int64_t x_stride, int x_div,
                        const void *w, int64_t cols, int64_t rows, const int32_t *idx, float *out) {
    /* vector loads need 16-byte alignment of every row of w and x */
    bool vec = cols % 8 == 0 && x_stride % 4 == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (vec) k_moe_rows<DT, true><<<grid, threads, 0, st>>>(x, x_stride, x_div, w, cols, rows, idx, out);
    else k_moe_rows<DT, false><<<grid, threads, 0, st>>>(x, x_stride, x_div, w, cols, rows, idx, out);
}

static void moe_rows(cudaStream_t st, dim3 grid, int threads, const float *x, int64_t x_stride, int x_div,
                     const kn_weight *w, int64_t cols, int64_t rows, const int32_t *idx, float *out) {
    if (w->dtype == KN_DT_BF16) moe_rows_dt<KN_DT_BF16>(st, grid, threads, x, x_stride, x_div, w->data, cols, rows, idx, out);
    else if (w->dtype == KN_DT_F16) moe_rows_dt<KN_DT_F16>(st, grid, threads, x, x_stride, x_div, w->data, cols, rows, idx, out);
    else moe_rows_dt<KN_DT_F32>(st, grid, threads, x, x_stride, x_div, w->data, cols, rows, idx, out);
}

__device__ __forceinline__ float act_f(float g, int act) {
    if (act == KN_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    if (act == KN_ACT_GELU_ERF) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
    return g / (1.0f + expf(-g));
}

__global__ void k_moe_act(const float *G, int64_t n_pairs, int inter, int act, float *A) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_pairs * inter) return;
    int64_t p = i / inter, j = i % inter;
    const float *g = G + p * 2 * inter;
    A[i] = act_f(g[j], act) * g[inter + j];
}

/* out[t, d] (+)= sum over the token's slots in ascending expert id of w * Y */
__global__ void k_moe_combine(const float *Y, const int32_t *idx, const float *w, int n, int k, int dim, float *out,
                              int accumulate) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * dim) return;
    int t = (int)(i / dim), d = (int)(i % dim);
    const int32_t *it = idx + (int64_t)t * k;
    float acc = 0.0f;
    int last = -1;
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int j = 0; j < k; j++)
            if (it[j] > last && (best < 0 || it[j] < it[best])) best = j;
        if (best < 0) break;
        last = it[best];
        acc += Y[((int64_t)t * k + best) * dim + d] * w[(int64_t)t * k + best];
    }
    out[i] = accumulate ? out[i] + acc : acc;
}

/* ---- expert-grouped path (prefill): pairs sorted by expert, each weight row
 * read once per group of up to 8 of its expert's tokens ---- */

/* one block: counting sort of the P pairs by expert id; run_start[E+1],
 * pair_of[sorted position] = pair, pos_of[pair] = sorted position */
__global__ void k_moe_sort(const int32_t *idx, int P, int E, int32_t *run_start, int32_t *pair_of, int32_t *pos_of) {
    extern __shared__ int cnt[]; /* E + 1 */
    for (int i = threadIdx.x; i <= E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[idx[p] + 1], 1);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    __syncthreads();
    for (int i = threadIdx.x; i <= E; i += blockDim.x) run_start[i] = cnt[i];
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int q = atomicAdd(&cnt[idx[p]], 1);
        pair_of[q] = p, pos_of[p] = q;
    }
}

/* out[q, r] = W[e * rows + r] . x(q) for the sorted positions q of expert e =
 * blockIdx.y; x(q) = x[pair_of[q] / x_div] when gather, else x[q]. One warp
 * per row, tokens staged in shared memory tg at a time. */
template <int DT, bool VEC>
__global__ void k_moe_grouped(const float *x, int64_t x_stride, int x_div, int gather, const void *w, int64_t cols,
                              int64_t rows, const int32_t *run_start, const int32_t *pair_of, int tg, float *out) {
    extern __shared__ float xs[]; /* tg * cols */
    const int e = blockIdx.y, q0 = run_start[e], q1 = run_start[e + 1];
    if (q0 == q1) return; /* uniform for the block */
    const int lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int64_t base = ((int64_t)e * rows + r) * cols;
    for (int g0 = q0; g0 < q1; g0 += tg) {
        const int m = q1 - g0 < tg ? q1 - g0 : tg;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < (int64_t)m * cols; i += blockDim.x) {
            int j = (int)(i / cols), q = g0 + j;
            int64_t row = gather ? pair_of[q] / x_div : q;
            xs[i] = x[row * x_stride + i % cols];
        }
        __syncthreads();
        if (r >= rows) continue;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (VEC) {
            for (int64_t c = (int64_t)lane * 8; c < cols; c += 32 * 8) {
                float wv[8];
                load8<DT>(w, base + c, wv);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (j >= m) break;
                    const float *xj = xs + (int64_t)j * cols + c;
                    float4 x0 = *(const float4 *)xj, x1 = *(const float4 *)(xj + 4);
                    acc[j] += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x +
                              wv[5] * x1.y + wv[6] * x1.z + wv[7] * x1.w;
                }
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) {
                float wv = kn_cuda_load_w(w, base + c, DT);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < m) acc[j] += wv * xs[(int64_t)j * cols + c];
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = acc[j];
            for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
            if (lane == 0 && j < m) out[(int64_t)(g0 + j) * rows + r] = v;
        }
    }
}

template <int DT>
static void moe_grouped_dt(cudaStream_t st, int E, const float *x, int64_t x_stride, int x_div, int gather,
                           const void *w, int64_t cols, int64_t rows, const int32_t *run_start,
                           const int32_t *pair_of, int tg, float *out) {
    const int warps = 8;
    dim3 grid((unsigned)((rows + warps - 1) / warps), (unsigned)E);
    size_t smem = (size_t)tg * (size_t)cols * sizeof(float);
    bool vec = cols % 8 == 0 && ((uintptr_t)w & 15) == 0;
    if (vec)
        k_moe_grouped<DT, true><<<grid, warps * 32, smem, st>>>(x, x_stride, x_div, gather, w, cols, rows, run_start,
                                                                  pair_of, tg, out);
    else
        k_moe_grouped<DT, false><<<grid, warps * 32, smem, st>>>(x, x_stride, x_div, gather, w, cols, rows, run_start,
                                                                   pair_of, tg, out);
}

static void moe_grouped(cudaStream_t st, int E, const float *x, int64_t x_stride, int x_div, int gather,
                        const kn_weight *w, int64_t cols, int64_t rows, const int32_t *run_start, const int32_t *pair_of,
                        int tg, float *out) {
    if (w->dtype == KN_DT_BF16)
        moe_grouped_dt<KN_DT_BF16>(st, E, x, x_stride, x_div, gather, w->data, cols, rows, run_start, pair_of, tg, out);
    else if (w->dtype == KN_DT_F16)
        moe_grouped_dt<KN_DT_F16>(st, E, x, x_stride, x_div, gather, w->data, cols, rows, run_start, pair_of, tg, out);
    else
        moe_grouped_dt<KN_DT_F32>(st, E, x, x_stride, x_div, gather, w->data, cols, rows, run_start, pair_of, tg, out);
}

/* out[t, d] (+)= sum over the token's slots in ascending expert id of w * Y[pos_of[pair]] */
__global__ void k_moe_combine_sorted(const float *Y, const int32_t *idx, const int32_t *pos_of, const float *w, int n,
                                     int k, int dim, float *out, int accumulate) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * dim) return;
    int t = (int)(i / dim), d = (int)(i % dim);
    const int32_t *it = idx + (int64_t)t * k;
    float acc = 0.0f;
    int last = -1;
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int j = 0; j < k; j++)
            if (it[j] > last && (best < 0 || it[j] < it[best])) best = j;
        if (best < 0) break;
        last = it[best];
        int64_t p = (int64_t)t * k + best;
        acc += Y[(int64_t)pos_of[p] * dim + d] * w[p];
    }
    out[i] = accumulate ? out[i] + acc : acc;
}

static unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }

extern "C" void kn_cuda_softcap(kn_backend *be, float *x, int64_t n, float cap) {
    kn_cuda_before_launch();
    if (n > 0) k_softcap<<<blocks_for(n), 256, 0, S>>>(x, n, cap);
    kn_cuda_launched(be, "softcap");
}

extern "C" void kn_cuda_scale(kn_backend *be, float *x, int64_t n, float s) {
    kn_cuda_before_launch();
    if (n > 0) k_scale<<<blocks_for(n), 256, 0, S>>>(x, n, s);
    kn_cuda_launched(be, "scale");
}

extern "C" void kn_cuda_sigmoid_gate_add(kn_backend *be, float *y, const float *x, const float *gate, int rows,
                                         int dim) {
    int64_t n = (int64_t)rows * dim;
    kn_cuda_before_launch();
    if (n > 0) k_sigmoid_gate_add<<<blocks_for(n), 256, 0, S>>>(y, x, gate, n, dim);
    kn_cuda_launched(be, "sigmoid_gate_add");
}

extern "C" void kn_cuda_moe_route(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                                  const float *expert_scale, int32_t *idx, float *w) {
    if (rows <= 0) return;
    const dim3 grid((unsigned)((rows + 3) / 4)), block(128); /* a warp per row */
    void (*kern)(const float *, int, int, int, int, const float *, int32_t *, float *) =
        n_experts <= 32    ? k_moe_route<1>
        : n_experts <= 64  ? k_moe_route<2>
        : n_experts <= 128 ? k_moe_route<4>
        : n_experts <= 256 ? k_moe_route<8>
        : n_experts <= 512 ? k_moe_route<16>
                           : k_moe_route<32>;
    static_assert(KN_MOE_MAX_EXPERTS <= 32 * 32, "k_moe_route holds at most 32 experts per lane");
    kn_cuda_run(be, "moe route", kern, grid, block, 0, logits, rows, n_experts, k, norm_topk, expert_scale, idx, w);
}

extern "C" void kn_cuda_mul_rows(kn_backend *be, float *y, const float *x, int64_t x_stride, int rows, int dim) {
    int64_t n = (int64_t)rows * dim;
    kn_cuda_before_launch();
    if (n > 0) k_mul_rows<<<blocks_for(n), 256, 0, S>>>(y, x, x_stride, n, dim);
    kn_cuda_launched(be, "mul_rows");
}

extern "C" void kn_cuda_moe_ffn(kn_backend *be, const kn_moe_args *a0) {
    const int n = a0->n_tokens, k = a0->k, D = a0->dim, I = a0->inter;
    const int64_t pairs = (int64_t)n * k;
    if (pairs <= 0 || kn_cuda_moe_decode(be, a0)) return;
    kn_moe_args na = *a0;
    const kn_moe_args *a = &na;
    if (na.logits) { /* not routed inside the decode kernels: the routing kernel first */
        kn_cuda_moe_route(be, na.logits, n, na.n_experts, k, na.norm_topk, na.expert_scale, na.idx, na.w);
        na.logits = NULL;
        if (kn_cuda_moe_decode(be, a)) return;
    }
    if (na.norm_w) { /* the RMSNorm as its own kernel, into the scratch's tail */
        float *xn = kn_moe_scratch_xn(a0);
        be->vt->rms_norm(be, na.x, D, xn, D, n, 1, D, na.norm_w, na.eps);
        na.x = xn, na.norm_w = NULL;
        if (kn_cuda_moe_decode(be, a)) return;
    }
    float *G = a->scratch, *A = G + pairs * 2 * I, *Y = A + pairs * I;
    /* prefill: tokens grouped by expert (the int arrays live in the scratch
     * tail: P * (dim + 2) floats remain after G, A, Y) */
    const int64_t widest = D > I ? D : I;
    const int tg = widest * 4 * 8 <= 48 * 1024 ? 8 : (int)(48 * 1024 / (widest * 4));
    if (n > 1 && tg >= 1 && pairs * (D + 2) >= 2 * pairs + a->n_experts + 1) {
        int32_t *run_start = (int32_t *)(Y + pairs * D), *pair_of = run_start + a->n_experts + 1, *pos_of = pair_of + pairs;
        kn_cuda_before_launch();
        k_moe_sort<<<1, 1024, (size_t)(a->n_experts + 1) * sizeof(int), S>>>(a->idx, (int)pairs, a->n_experts, run_start,
                                                                             pair_of, pos_of);
        kn_cuda_launched(be, "moe_sort");
        kn_cuda_before_launch();
        moe_grouped(S, a->n_experts, a->x, D, k, 1, a->gate_up, D, 2 * (int64_t)I, run_start, pair_of, tg, G);
        kn_cuda_launched(be, "moe_grouped");
        kn_cuda_before_launch();
        k_moe_act<<<blocks_for(pairs * I), 256, 0, S>>>(G, pairs, I, a->act, A);
        kn_cuda_launched(be, "moe_act");
        kn_cuda_before_launch();
        moe_grouped(S, a->n_experts, A, I, 1, 0, a->down, I, D, run_start, pair_of, tg, Y);
        kn_cuda_launched(be, "moe_grouped");
        kn_cuda_before_launch();
        k_moe_combine_sorted<<<blocks_for((int64_t)n * D), 256, 0, S>>>(Y, a->idx, pos_of, a->w, n, k, D, a->out,
                                                                         a->accumulate);
        kn_cuda_launched(be, "moe_combine_sorted");
        return;
    }
    const int warps = 8;
    dim3 g1((unsigned)((2 * I + warps - 1) / warps), (unsigned)pairs);
    kn_cuda_before_launch();
    moe_rows(S, g1, warps * 32, a->x, D, k, a->gate_up, D, 2 * (int64_t)I, a->idx, G);
    kn_cuda_launched(be, "moe_rows");
    kn_cuda_before_launch();
    k_moe_act<<<blocks_for(pairs * I), 256, 0, S>>>(G, pairs, I, a->act, A);
    kn_cuda_launched(be, "moe_act");
    dim3 g2((unsigned)((D + warps - 1) / warps), (unsigned)pairs);
    kn_cuda_before_launch();
    moe_rows(S, g2, warps * 32, A, I, 1, a->down, I, D, a->idx, Y);
    kn_cuda_launched(be, "moe_rows");
    kn_cuda_before_launch();
    k_moe_combine<<<blocks_for((int64_t)n * D), 256, 0, S>>>(Y, a->idx, a->w, n, k, D, a->out, a->accumulate);
    kn_cuda_launched(be, "moe_combine");
}

/* ---- gemma3n: AltUp stream mixing, magnitude matching, gaussian top-k ---- */

__global__ void k_stream_mix(const float *src, int n_src, const float *base, float *out, int n_out, int64_t ss,
                             const float *w, float w_add, int rows, int dim) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)rows * dim * n_out) return;
    const int c = (int)(i / ((int64_t)rows * dim));
    const int64_t td = i % ((int64_t)rows * dim), t = td / dim;
    float acc = 0.0f;
    for (int a = 0; a < n_src && a < 16; a++)
        acc += ((w ? w[(t * n_out + c) * n_src + a] : 0.0f) + w_add) * src[a * ss + td];
    out[c * ss + td] = base ? acc + base[c * ss + td] : acc;
}

/* one block per row: sums of squares of x and ref (double), then the rescale */
__global__ void k_rms_match(float *x, const float *ref, int dim, float floor) {
    __shared__ double sx[256], sr[256];
    float *xr = x + (int64_t)blockIdx.x * dim;
    const float *rr = ref + (int64_t)blockIdx.x * dim;
    double a = 0, b = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) a += (double)xr[j] * xr[j], b += (double)rr[j] * rr[j];
    sx[threadIdx.x] = a, sr[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sx[threadIdx.x] += sx[threadIdx.x + s], sr[threadIdx.x] += sr[threadIdx.x + s];
        __syncthreads();
    }
    const float target = (float)sqrt(sr[0] / dim), mx = (float)(sx[0] / dim);
    const float mag = sqrtf(mx > floor ? mx : floor);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) xr[j] = xr[j] * target / mag;
}

/* one block per row: mean, then population std (double), then relu(x - cut) */
__global__ void k_gaussian_topk(float *x, int64_t stride, int dim, float mult) {
    __shared__ double red[256];
    __shared__ double mean_s;
    float *xr = x + (int64_t)blockIdx.x * stride;
    double a = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) a += xr[j];
    red[threadIdx.x] = a;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) mean_s = red[0] / dim;
    __syncthreads();
    const double mean = mean_s;
    double b = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) b += (xr[j] - mean) * (xr[j] - mean);
    __syncthreads();
    red[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float cut = (float)mean + (float)sqrt(red[0] / dim) * mult;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = xr[j] - cut;
        xr[j] = v > 0.0f ? v : 0.0f;
    }
}

extern "C" void kn_cuda_stream_mix(kn_backend *be, const float *src, int n_src, const float *base, float *out, int n_out,
                                   int64_t stream_stride, const float *w, float w_add, int rows, int dim) {
    int64_t n = (int64_t)rows * dim * n_out;
    kn_cuda_before_launch();
    if (n > 0)
        k_stream_mix<<<blocks_for(n), 256, 0, S>>>(src, n_src, base, out, n_out, stream_stride, w, w_add, rows, dim);
    kn_cuda_launched(be, "stream_mix");
}

extern "C" void kn_cuda_rms_match(kn_backend *be, float *x, const float *ref, int rows, int dim, float floor) {
    kn_cuda_before_launch();
    if (rows > 0) k_rms_match<<<rows, 256, 0, S>>>(x, ref, dim, floor);
    kn_cuda_launched(be, "rms_match");
}

extern "C" void kn_cuda_gaussian_topk(kn_backend *be, float *x, int64_t x_stride, int rows, int dim, float mult) {
    kn_cuda_before_launch();
    if (rows > 0) k_gaussian_topk<<<rows, 256, 0, S>>>(x, x_stride, dim, mult);
    kn_cuda_launched(be, "gaussian_topk");
}

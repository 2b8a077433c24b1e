/* cuda_flash_prefill.cu — fused tensor-core attention for prefill runs
 * (FlashAttention-2 style): a run of consecutive positions of one sequence
 * attends to its paged K/V without materializing scores in global memory.
 *
 * One block of 4 warps per (64-query tile, query head); each warp owns 16
 * query rows and keeps everything of them in registers: its Q fragments, the
 * 16 x 64 score tile, the running max m and sum l per row, and the 16 x HD
 * output accumulator. Key tiles of 64 are gathered from the paged cache
 * through the block table (float or bf16 cache rows; compressed formats take
 * the GEMM path) into shared memory (K row-major, V transposed),
 * rounded to the compute dtype (bf16 or f16). S = Q K^T and O += P V run as
 * mma.sync m16n8k16 with f32 accumulation; scale, soft-cap and the causal /
 * sliding-window mask are applied to S in f32, and the score fragments are
 * re-packed in registers as the A operand of P V (no shared-memory trip).
 *
 * Numerics: q, k, v and the unnormalized probabilities exp(s - m) are rounded
 * to the compute dtype (as the GEMM path rounds q/k/v/P); sums are f32; l sums
 * the rounded probabilities (an mma of P against ones, beside P V), so O is a
 * convex combination of the rounded v.
 *
 * Tiles are scheduled heaviest first (the last query tile sees the most
 * keys); a warp skips key tiles that are wholly masked for its rows. Head
 * dims 64 and 128 (others take the GEMM path). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

#define FP_BM 64 /* query rows per block: 16 per warp */
#define FP_BN 64 /* keys per tile */
#define FP_WARPS 4

template <int HD>
struct fp_layout {
    static constexpr int LDK = HD + 8, LDV = FP_BN + 8; /* +8 halves: conflict-free fragment reads */
    static constexpr size_t k_bytes = (size_t)FP_BN * LDK * 2, v_bytes = (size_t)HD * LDV * 2;
    static constexpr size_t stage = k_bytes + v_bytes, total = 2 * stage; /* double-buffered */
};

__device__ __forceinline__ void fp_cp16(void *smem, const void *gmem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void fp_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fp_cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* Four 8x8 b16 matrices from shared memory: lane l gives the address of row
 * l % 8 of matrix l / 8 and receives, of each matrix, row l / 4, columns
 * 2 (l % 4) and 2 (l % 4) + 1 (the B-fragment layout of fp_mma). */
__device__ __forceinline__ void fp_ldsm4(uint32_t *r, const void *smem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#define FP_LOG2E 1.4426950408889634f

template <typename T> __device__ __forceinline__ uint32_t fp_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t fp_pack<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t fp_pack<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <typename T> __device__ __forceinline__ float fp_lo(uint32_t v);
template <typename T> __device__ __forceinline__ float fp_hi(uint32_t v);
template <> __device__ __forceinline__ float fp_lo<__nv_bfloat16>(uint32_t v) { return __uint_as_float(v << 16); }
template <> __device__ __forceinline__ float fp_hi<__nv_bfloat16>(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
template <> __device__ __forceinline__ float fp_lo<__half>(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffff))); }
template <> __device__ __forceinline__ float fp_hi<__half>(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }
template <typename T> __device__ __forceinline__ T fp_round(float v);
template <> __device__ __forceinline__ __nv_bfloat16 fp_round<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half fp_round<__half>(float v) { return __float2half(v); }
/* two 1.0s packed: the B operand that turns an mma into row sums */
template <typename T> __device__ __forceinline__ uint32_t fp_ones();
template <> __device__ __forceinline__ uint32_t fp_ones<__nv_bfloat16>() { return 0x3f803f80u; }
template <> __device__ __forceinline__ uint32_t fp_ones<__half>() { return 0x3c003c00u; }

/* d (16x8, f32) += a (16x16, row) . b (16x8, col): mma.sync m16n8k16 with
 * the PTX ISA's fragment layout (g = lane / 4, t = lane % 4):
 *   a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
 *   b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
 *   d0 (g, 2t)  d1 (g, 2t+1)  d2 (g+8, 2t)  d3 (g+8, 2t+1) */
template <typename T>
__device__ __forceinline__ void fp_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void fp_mma<__nv_bfloat16>(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    kn_mma_bf16(d, a, b0, b1);
}
template <>
__device__ __forceinline__ void fp_mma<__half>(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The run's keys [kbase, kbase + ctxp) of every KV head, rounded to T:
 * kg [n_kv][ctxp][HD] and V transposed, vg [n_kv][HD][ctxp]; positions past
 * last are zero. One block per (64 keys, KV head); V goes through a shared
 * tile so both the paged reads and the transposed writes are coalesced. */
template <bool BF> __device__ __forceinline__ float4 fp_load4(const void *p, int64_t i) {
    if (!BF) return *(const float4 *)((const float *)p + i);
    const uint2 u = *(const uint2 *)((const uint16_t *)p + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

template <typename T, int HD, bool BF>
__global__ void __launch_bounds__(256) k_fp_gather(kn_kv_layer kv, const int32_t *__restrict__ bt, int kbase, int last,
                                                   int ctxp, T *__restrict__ kg, T *__restrict__ vg) {
    __shared__ float vt[FP_BN][HD + 1];
    const int kvh = blockIdx.y, j0 = blockIdx.x * FP_BN, bs = kv.block_size;
    const int64_t kv_w = (int64_t)kv.n_kv_heads * kv.head_dim;
    for (int idx = threadIdx.x; idx < FP_BN * HD / 4; idx += blockDim.x) {
        const int j = idx / (HD / 4), c = (idx % (HD / 4)) * 4, p = kbase + j0 + j;
        float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
        if (p <= last) {
            const int64_t off = ((int64_t)bt[p / bs] * bs + p % bs) * kv_w + (int64_t)kvh * HD + c;
            k4 = fp_load4<BF>(kv.k, off), v4 = fp_load4<BF>(kv.v, off);
        }
        *(uint2 *)(kg + ((int64_t)kvh * ctxp + j0 + j) * HD + c) =
            make_uint2(fp_pack<T>(k4.x, k4.y), fp_pack<T>(k4.z, k4.w));
        vt[j][c] = v4.x, vt[j][c + 1] = v4.y, vt[j][c + 2] = v4.z, vt[j][c + 3] = v4.w;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < FP_BN * HD; idx += blockDim.x) {
        const int d = idx / FP_BN, j = idx % FP_BN;
        vg[((int64_t)kvh * HD + d) * ctxp + j0 + j] = fp_round<T>(vt[j][d]);
    }
}

/* q, out: the run's first row; rows i of the run are at positions p0 + i;
 * kg / vg: the gathered keys / transposed values from kbase (k_fp_gather). */
template <bool B> struct fp_flag {
    static constexpr bool value = B;
};

template <typename T, int HD, bool CAP>
__global__ void __launch_bounds__(FP_WARPS * 32)
    k_flash_prefill(const float *__restrict__ q, int64_t q_stride, float *__restrict__ out, int n_heads, int group,
                    const T *__restrict__ kg, const T *__restrict__ vg, int kbase, int ctxp, int p0, int len,
                    int window, float scale, float softcap) {
    typedef fp_layout<HD> L;
    extern __shared__ __align__(128) unsigned char fp_smem[];
    constexpr int KT = HD / 16, NT = HD / 8, ST = FP_BN / 8;

    const int tile = gridDim.x - 1 - blockIdx.x; /* heaviest (latest) tiles first */
    const int h = blockIdx.y, kvh = h / group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = tile * FP_BM, rows = len - i0 < FP_BM ? len - i0 : FP_BM;
    /* this lane's two rows (g and g + 8 of the warp's 16) */
    const int ra = warp * 16 + g, rb = ra + 8;
    const bool oka = ra < rows, okb = rb < rows;
    const int pa = p0 + i0 + ra, pb = pa + 8;

    /* Q fragments, rounded to T, straight from global memory */
    uint32_t qa[KT][4];
    {
        const float *qra = q + (int64_t)(i0 + ra) * q_stride + (int64_t)h * HD;
        const float *qrb = q + (int64_t)(i0 + rb) * q_stride + (int64_t)h * HD;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            const int c = kk * 16 + 2 * t;
            qa[kk][0] = oka ? fp_pack<T>(qra[c], qra[c + 1]) : 0u;
            qa[kk][1] = okb ? fp_pack<T>(qrb[c], qrb[c + 1]) : 0u;
            qa[kk][2] = oka ? fp_pack<T>(qra[c + 8], qra[c + 9]) : 0u;
            qa[kk][3] = okb ? fp_pack<T>(qrb[c + 8], qrb[c + 9]) : 0u;
        }
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    /* m: running max of the raw scores per row; l (ol): running row sums of
     * the rounded probabilities, summed by an mma against ones (ol[0] row
     * g, ol[2] row g + 8) */
    float ma = -INFINITY, mb = -INFINITY, ol[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float sl2 = scale * FP_LOG2E; /* probabilities 2^(s sl2 - m sl2) = e^(scale (s - m)) */
    const float cap_in = CAP ? scale / softcap : 0.0f, cap_out = CAP ? softcap / scale : 0.0f;

    const int first = p0 + i0, last = p0 + i0 + rows - 1;
    const int lo = window > 0 && first - window + 1 > kbase ? first - window + 1 : kbase;
    const int kt0 = kbase + (lo - kbase) / FP_BN * FP_BN; /* tiles aligned to the gathered buffer */
    const int n_tiles = (last - kt0) / FP_BN + 1;
    const int w_first = p0 + i0 + warp * 16, w_last = w_first + 15;
    const T *kgh = kg + (int64_t)kvh * ctxp * HD, *vgh = vg + (int64_t)kvh * HD * ctxp;
    /* stage tile it into buffer it & 1: K rows (HD * 2 bytes each), V^T rows (64 keys * 2 bytes each) */
    auto issue = [&](int it) {
        unsigned char *st = fp_smem + (it & 1) * L::stage;
        T *Ks = (T *)st, *Vt = (T *)(st + L::k_bytes);
        const int r0 = kt0 - kbase + it * FP_BN;
        for (int idx = threadIdx.x; idx < FP_BN * HD / 8; idx += FP_WARPS * 32) {
            const int j = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
            fp_cp16(Ks + j * L::LDK + c, kgh + (int64_t)(r0 + j) * HD + c);
        }
        for (int idx = threadIdx.x; idx < HD * FP_BN / 8; idx += FP_WARPS * 32) {
            const int d = idx / (FP_BN / 8), c = (idx % (FP_BN / 8)) * 8;
            fp_cp16(Vt + d * L::LDV + c, vgh + (int64_t)d * ctxp + r0 + c);
        }
    };
    issue(0);
    fp_cp_commit();
    for (int it = 0; it < n_tiles; it++) {
        const int kt = kt0 + it * FP_BN;
        if (it + 1 < n_tiles) issue(it + 1);
        fp_cp_commit();
        fp_cp_wait1(); /* tile it has landed (for this thread) */
        __syncthreads();
        const T *Ks = (const T *)(fp_smem + (it & 1) * L::stage), *Vt = (const T *)(fp_smem + (it & 1) * L::stage + L::k_bytes);
        /* one key tile for this warp's rows; MASKED: some score of the tile
         * is masked (diagonal, window edge, padding rows). The two variants
         * are separate code, so unmasked tiles carry no mask arithmetic. */
        auto tile_step = [&](auto masked_flag) {
            constexpr bool MASKED = decltype(masked_flag)::value;
            float s[ST][4];
#pragma unroll
            for (int n = 0; n < ST; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++)
#pragma unroll
                for (int n = 0; n < ST; n += 2) { /* keys of n-tiles n, n + 1; dims kk*16 .. +16 */
                    uint32_t b[4];
                    fp_ldsm4(b, Ks + (n * 8 + (lane >> 4) * 8 + (lane & 7)) * L::LDK + kk * 16 + ((lane >> 3) & 1) * 8);
                    fp_mma<T>(s[n], qa[kk], b[0], b[1]);
                    fp_mma<T>(s[n + 1], qa[kk], b[2], b[3]);
                }
            /* soft-cap and mask the raw scores; running max per row (the 4 lanes
             * of a quad share rows). Tiles wholly inside every row's causal
             * window, with no padding rows, need no mask (warp-uniform). The
             * scale is applied inside the exponent (one fma per score). */
            float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
            for (int n = 0; n < ST; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[n][e];
                    if (CAP) v = cap_out * tanhf(v * cap_in); /* s' with s' scale = softcap tanh(s scale / softcap) */
                    if (MASKED) {
                        const int kp = kt + n * 8 + 2 * t + (e & 1), p = e < 2 ? pa : pb;
                        const bool ok = (e < 2 ? oka : okb) && kp <= p && (window <= 0 || kp > p - window);
                        v = ok ? v : -INFINITY;
                    }
                    s[n][e] = v;
                    if (e < 2) mxa = fmaxf(mxa, v);
                    else mxb = fmaxf(mxb, v);
                }
            const kn_softmax_step sm = kn_softmax_rows(mxa, mxb, ma, mb, sl2);
            const float za = sm.za, zb = sm.zb, aa = sm.aa, ab = sm.ab;
            /* P (rounded to T) as A fragments of the P.V product */
            uint32_t pf[FP_BN / 16][4];
#pragma unroll
            for (int n = 0; n < ST; n++) {
                const float e0 = kn_exp2_approx(fmaf(s[n][0], sl2, -za)), e1 = kn_exp2_approx(fmaf(s[n][1], sl2, -za));
                const float e2 = kn_exp2_approx(fmaf(s[n][2], sl2, -zb)), e3 = kn_exp2_approx(fmaf(s[n][3], sl2, -zb));
                pf[n / 2][(n & 1) * 2 + 0] = fp_pack<T>(e0, e1); /* n even: a0 / a1; n odd: a2 / a3 */
                pf[n / 2][(n & 1) * 2 + 1] = fp_pack<T>(e2, e3);
            }
            /* the output and sums are rescaled only when some row's max moved */
            if (__any_sync(0xffffffffu, aa != 1.0f || ab != 1.0f)) {
                ol[0] *= aa, ol[1] *= aa, ol[2] *= ab, ol[3] *= ab;
#pragma unroll
                for (int n = 0; n < NT; n++) o[n][0] *= aa, o[n][1] *= aa, o[n][2] *= ab, o[n][3] *= ab;
            }
#pragma unroll
            for (int kk = 0; kk < FP_BN / 16; kk++) fp_mma<T>(ol, pf[kk], fp_ones<T>(), fp_ones<T>());
#pragma unroll
            for (int kk = 0; kk < FP_BN / 16; kk++)
#pragma unroll
                for (int n = 0; n < NT; n += 2) { /* dims of n-tiles n, n + 1; keys kk*16 .. +16 */
                    uint32_t b[4];
                    fp_ldsm4(b, Vt + (n * 8 + (lane >> 4) * 8 + (lane & 7)) * L::LDV + kk * 16 + ((lane >> 3) & 1) * 8);
                    fp_mma<T>(o[n], pf[kk], b[0], b[1]);
                    fp_mma<T>(o[n + 1], pf[kk], b[2], b[3]);
                }
        };
        /* wholly masked for this warp's rows: nothing changes */
        if (!(kt > w_last || (window > 0 && kt + FP_BN - 1 <= w_first - window) || warp * 16 >= rows)) {
            if (kt + FP_BN - 1 > w_first || (window > 0 && kt <= w_last - window) || warp * 16 + 16 > rows)
                tile_step(fp_flag<true>());
            else tile_step(fp_flag<false>());
        }
        __syncthreads(); /* buffer it & 1 is refilled by the next iteration's issue */
    }
    const float la = ol[0], lb = ol[2];
    const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
    float *oa = out + (int64_t)(i0 + ra) * n_heads * HD + (int64_t)h * HD + 2 * t;
    float *ob = oa + (int64_t)8 * n_heads * HD;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (oka) *(float2 *)(oa + n * 8) = make_float2(o[n][0] * ia, o[n][1] * ia);
        if (okb) *(float2 *)(ob + n * 8) = make_float2(o[n][2] * ib, o[n][3] * ib);
    }
}

template <typename T, int HD>
static int launch_fp(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    static int attr_set = 0; /* per instantiation */
    const size_t smem = fp_layout<HD>::total;
    if (!attr_set) {
        if (cudaFuncSetAttribute(k_flash_prefill<T, HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess ||
            cudaFuncSetAttribute(k_flash_prefill<T, HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        attr_set = 1;
    }
    const kn_kv_layer *kv = a->kv;
    const int s = a->seq_host[t0], G = a->n_heads / kv->n_kv_heads, p0 = a->pos_host[t0], last = p0 + len - 1;
    const int kbase = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0;
    const int ctxp = (last - kbase + FP_BN) / FP_BN * FP_BN;
    const size_t one_buf = (size_t)kv->n_kv_heads * ctxp * HD * sizeof(T);
    T *kg = (T *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTN_GEMM, 2 * one_buf);
    if (!kg) return 0;
    T *vg = (T *)((char *)kg + one_buf);
    const int32_t *bt = a->block_tables + (int64_t)s * a->max_blocks;
    cudaStream_t st = kn_cuda_stream(be);
    const dim3 ggrid((unsigned)(ctxp / FP_BN), (unsigned)kv->n_kv_heads);
    if (kv->k_fmt == KN_KVF_BF16) k_fp_gather<T, HD, true><<<ggrid, 256, 0, st>>>(*kv, bt, kbase, last, ctxp, kg, vg);
    else k_fp_gather<T, HD, false><<<ggrid, 256, 0, st>>>(*kv, bt, kbase, last, ctxp, kg, vg);
    dim3 grid((unsigned)((len + FP_BM - 1) / FP_BM), (unsigned)a->n_heads);
    (a->softcap > 0.0f ? k_flash_prefill<T, HD, true> : k_flash_prefill<T, HD, false>)<<<grid, FP_WARPS * 32, smem, st>>>(a->q + (int64_t)t0 * a->q_stride, a->q_stride,
                                                              a->out + (int64_t)t0 * a->n_heads * HD, a->n_heads, G,
                                                              kg, vg, kbase, ctxp, p0, len, a->window, a->scale,
                                                              a->softcap);
    return cudaPeekAtLastError() == cudaSuccess;
}

template <typename T>
static int launch_fp_hd(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    switch (a->kv->head_dim) {
    case 64: return launch_fp<T, 64>(be, a, t0, len);
    case 128: return launch_fp<T, 128>(be, a, t0, len);
    default: return 0;
    }
}

/* Run tokens [t0, t0 + len) of a (one sequence, consecutive positions)
 * through the fused kernel. Returns 0, having enqueued nothing, when the
 * shape or dtype is not covered (f32 compute, other head dims, unaligned
 * rows): the caller then takes another path. */
int kn_cuda_flash_prefill(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    const int hd = a->kv->head_dim;
    if (a->compute_dtype != KN_DT_BF16 && a->compute_dtype != KN_DT_F16) return 0;
    const int fk = a->kv->k_fmt, fv = a->kv->v_fmt; /* float or bf16 rows; compressed ones take the GEMM path */
    if (fk != fv || (fk != KN_KVF_F32 && fk != KN_KVF_BF16)) return 0;
    if (((uintptr_t)a->out & 15) || ((uintptr_t)a->kv->k & 15) || ((uintptr_t)a->kv->v & 15) ||
        ((int64_t)a->kv->n_kv_heads * hd) % 4)
        return 0;
    static int disabled = -1; /* KILN_NO_FLASH_PREFILL=1: the GEMM path, for A/B benchmarks */
    if (disabled < 0) disabled = getenv("KILN_NO_FLASH_PREFILL") != NULL;
    if (disabled) return 0;
    return a->compute_dtype == KN_DT_BF16 ? launch_fp_hd<__nv_bfloat16>(be, a, t0, len)
                                          : launch_fp_hd<__half>(be, a, t0, len);
}

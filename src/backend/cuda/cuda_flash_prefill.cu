/* cuda_flash_prefill.cu — fused tensor-core attention for prefill runs
 * (FlashAttention-2 style): a run of consecutive positions of one sequence
 * attends to its paged K/V without materializing scores in global memory.
 *
 * One block of 4 warps per (64-query tile, query head). The block walks the
 * tile's keys in tiles of 64: K and V rows are gathered from the paged cache
 * through the block table into shared memory (rounded to the compute dtype,
 * bf16 or f16), each warp computes S = Q K^T for its 16 query rows on tensor
 * cores (WMMA 16x16x16, f32 accumulate), applies scale, soft-cap and the
 * causal / sliding-window mask in f32, and updates a running max m and sum l
 * per row (online softmax). P = exp(S - m) is rounded to the compute dtype and
 * O += P V runs on tensor cores; O lives in shared memory as f32 so that rows
 * can be rescaled when m grows. At the end O / l goes to the f32 output.
 *
 * Numerics: q, k, v and the unnormalized probabilities are rounded to the
 * compute dtype (as the GEMM path rounds q/k/v/P); every sum is f32. The
 * denominator l sums the rounded probabilities, so O is an exact convex
 * combination of the rounded values.
 *
 * Tiles are scheduled heaviest first (the last query tile sees the most
 * keys); a warp skips key tiles that are wholly masked for its rows. */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

using namespace nvcuda;

#define FP_BM 64 /* query rows per block */
#define FP_BN 64 /* keys per tile */
#define FP_WARPS 4

template <int HD>
struct fp_layout {
    static constexpr int LDQ = HD + 8, LDK = HD + 8, LDS = FP_BN + 4, LDP = FP_BN + 8, LDO = HD + 4;
    static constexpr size_t q_bytes = (size_t)FP_BM * LDQ * 2, k_bytes = (size_t)FP_BN * LDK * 2;
    static constexpr size_t s_bytes = (size_t)FP_BM * LDS * 4, p_bytes = (size_t)FP_BM * LDP * 2;
    static constexpr size_t o_bytes = (size_t)FP_BM * LDO * 4;
    static constexpr size_t total = q_bytes + 2 * k_bytes + s_bytes + p_bytes + o_bytes;
};

template <typename T> __device__ __forceinline__ T fp_round(float v);
template <> __device__ __forceinline__ __nv_bfloat16 fp_round<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half fp_round<__half>(float v) { return __float2half(v); }
template <typename T> __device__ __forceinline__ float fp_widen(T v);
template <> __device__ __forceinline__ float fp_widen<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float fp_widen<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ void fp_store4(T *dst, float4 v) {
    dst[0] = fp_round<T>(v.x), dst[1] = fp_round<T>(v.y), dst[2] = fp_round<T>(v.z), dst[3] = fp_round<T>(v.w);
}

/* q, out: the run's first row; rows i of the run are at positions p0 + i. */
template <typename T, int HD>
__global__ void __launch_bounds__(FP_WARPS * 32)
    k_flash_prefill(const float *__restrict__ q, int64_t q_stride, float *__restrict__ out, int n_heads, int group,
                    kn_kv_layer kv, const int32_t *__restrict__ bt, int p0, int len, int window, float scale,
                    float softcap) {
    typedef fp_layout<HD> L;
    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *Qs = (T *)fp_smem;
    T *Ks = (T *)(fp_smem + L::q_bytes);
    T *Vs = (T *)(fp_smem + L::q_bytes + L::k_bytes);
    float *Ss = (float *)(fp_smem + L::q_bytes + 2 * L::k_bytes);
    T *Ps = (T *)(fp_smem + L::q_bytes + 2 * L::k_bytes + L::s_bytes);
    float *Os = (float *)(fp_smem + L::q_bytes + 2 * L::k_bytes + L::s_bytes + L::p_bytes);

    const int tile = gridDim.x - 1 - blockIdx.x; /* heaviest (latest) tiles first */
    const int h = blockIdx.y, g = h / group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i0 = tile * FP_BM, rows = len - i0 < FP_BM ? len - i0 : FP_BM;
    const int64_t kv_w = (int64_t)kv.n_kv_heads * kv.head_dim;
    const int bs = kv.block_size;

    /* Q tile (zero rows past the run), O = 0 */
    for (int idx = threadIdx.x; idx < FP_BM * HD; idx += FP_WARPS * 32) { /* any q_stride: scalar loads */
        const int r = idx / HD, c = idx % HD;
        Qs[r * L::LDQ + c] = fp_round<T>(r < rows ? q[(int64_t)(i0 + r) * q_stride + (int64_t)h * HD + c] : 0.0f);
    }
    for (int idx = threadIdx.x; idx < FP_BM * L::LDO; idx += FP_WARPS * 32) Os[idx] = 0.0f;

    /* keys the tile needs: [lo, hi] absolute */
    const int pa = p0 + i0, pb = p0 + i0 + rows - 1;
    const int lo = window > 0 && pa - window + 1 > 0 ? pa - window + 1 : 0, hi = pb;
    /* this lane's softmax row and half of the key columns / head dims */
    const int r = lane >> 1, half = lane & 1;
    const int wrow = warp * 16 + r, my_i = i0 + wrow, my_p = p0 + my_i;
    const bool row_ok = wrow < rows;
    const int w_first = p0 + i0 + warp * 16, w_last = w_first + 15; /* positions of the warp's rows */
    float m_i = -INFINITY, l_i = 0.0f;

    for (int kt = lo; kt <= hi; kt += FP_BN) {
        __syncthreads(); /* previous tile's K/V no longer read */
        for (int idx = threadIdx.x; idx < FP_BN * HD / 4; idx += FP_WARPS * 32) {
            const int j = idx / (HD / 4), c = (idx % (HD / 4)) * 4, p = kt + j;
            float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
            if (p <= hi) {
                const int64_t off = ((int64_t)bt[p / bs] * bs + p % bs) * kv_w + (int64_t)g * HD + c;
                kv4 = *(const float4 *)(kv.k + off);
                vv4 = *(const float4 *)(kv.v + off);
            }
            fp_store4<T>(Ks + j * L::LDK + c, kv4);
            fp_store4<T>(Vs + j * L::LDK + c, vv4);
        }
        __syncthreads();
        /* wholly masked for this warp's rows: nothing changes */
        if (kt > w_last || (window > 0 && kt + FP_BN - 1 <= w_first - window) || warp * 16 >= rows) continue;

        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[FP_BN / 16];
#pragma unroll
        for (int n = 0; n < FP_BN / 16; n++) wmma::fill_fragment(sacc[n], 0.0f);
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Qs + warp * 16 * L::LDQ + k * 16, L::LDQ);
#pragma unroll
            for (int n = 0; n < FP_BN / 16; n++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Ks + n * 16 * L::LDK + k * 16, L::LDK);
                wmma::mma_sync(sacc[n], fa, fb, sacc[n]);
            }
        }
        float *Sw = Ss + warp * 16 * L::LDS;
#pragma unroll
        for (int n = 0; n < FP_BN / 16; n++) wmma::store_matrix_sync(Sw + n * 16, sacc[n], L::LDS, wmma::mem_row_major);
        __syncwarp();

        /* online softmax: lane pair (r, half) owns row r, key columns half*32..+31 */
        float s[FP_BN / 2], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < FP_BN / 2; c++) {
            const int j = half * (FP_BN / 2) + c, kp = kt + j;
            float v = Sw[r * L::LDS + j] * scale;
            if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
            const bool ok = row_ok && kp <= my_p && (window <= 0 || kp > my_p - window);
            s[c] = ok ? v : -INFINITY;
            mx = fmaxf(mx, s[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m_i, mx);
        const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_i - m_new); /* m_i = -inf -> 0 */
        float sum = 0.0f;
        T *Pw = Ps + warp * 16 * L::LDP;
#pragma unroll
        for (int c = 0; c < FP_BN / 2; c++) {
            const T pv = fp_round<T>(s[c] == -INFINITY ? 0.0f : __expf(s[c] - m_new));
            Pw[r * L::LDP + half * (FP_BN / 2) + c] = pv;
            sum += fp_widen<T>(pv);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_i = l_i * alpha + sum;
        m_i = m_new;
        float *Ow = Os + warp * 16 * L::LDO;
        if (alpha != 1.0f)
#pragma unroll 8
            for (int d = 0; d < HD / 2; d++) Ow[r * L::LDO + half * (HD / 2) + d] *= alpha;
        __syncwarp();

        /* O += P V */
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
            wmma::load_matrix_sync(oacc, Ow + n * 16, L::LDO, wmma::mem_row_major);
#pragma unroll
            for (int k = 0; k < FP_BN / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Pw + k * 16, L::LDP);
                wmma::load_matrix_sync(fb, Vs + k * 16 * L::LDK + n * 16, L::LDK);
                wmma::mma_sync(oacc, fa, fb, oacc);
            }
            wmma::store_matrix_sync(Ow + n * 16, oacc, L::LDO, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncwarp();
    if (row_ok) {
        const float inv = l_i > 0.0f ? 1.0f / l_i : 0.0f;
        const float *Or = Os + wrow * L::LDO + half * (HD / 2);
        float *dst = out + (int64_t)my_i * n_heads * HD + (int64_t)h * HD + half * (HD / 2);
        for (int d = 0; d < HD / 2; d += 4)
            *(float4 *)(dst + d) = make_float4(Or[d] * inv, Or[d + 1] * inv, Or[d + 2] * inv, Or[d + 3] * inv);
    }
}

template <typename T, int HD>
static int launch_fp(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    static int attr_set = 0; /* per instantiation */
    const size_t smem = fp_layout<HD>::total;
    if (!attr_set) {
        if (cudaFuncSetAttribute(k_flash_prefill<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        attr_set = 1;
    }
    const int s = a->seq_host[t0], G = a->n_heads / a->kv->n_kv_heads;
    dim3 grid((unsigned)((len + FP_BM - 1) / FP_BM), (unsigned)a->n_heads);
    k_flash_prefill<T, HD><<<grid, FP_WARPS * 32, smem, kn_cuda_stream(be)>>>(
        a->q + (int64_t)t0 * a->q_stride, a->q_stride, a->out + (int64_t)t0 * a->n_heads * HD, a->n_heads, G, *a->kv,
        a->block_tables + (int64_t)s * a->max_blocks, a->pos_host[t0], len, a->window, a->scale, a->softcap);
    return cudaPeekAtLastError() == cudaSuccess;
}

template <typename T>
static int launch_fp_hd(kn_backend *be, const kn_attention_args *a, int t0, int len) {
    switch (a->kv->head_dim) {
    case 64: return launch_fp<T, 64>(be, a, t0, len);
    case 128: return launch_fp<T, 128>(be, a, t0, len);
    case 256: return launch_fp<T, 256>(be, a, t0, len);
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
    if (((uintptr_t)a->out & 15) || ((uintptr_t)a->kv->k & 15) ||
        ((uintptr_t)a->kv->v & 15) || ((int64_t)a->kv->n_kv_heads * hd) % 4)
        return 0;
    static int disabled = -1; /* KILN_NO_FLASH_PREFILL=1: the GEMM path, for A/B benchmarks */
    if (disabled < 0) disabled = getenv("KILN_NO_FLASH_PREFILL") != NULL;
    if (disabled) return 0;
    return a->compute_dtype == KN_DT_BF16 ? launch_fp_hd<__nv_bfloat16>(be, a, t0, len)
                                          : launch_fp_hd<__half>(be, a, t0, len);
}

/* cuda_gemv.cu — decode-shaped matmuls (1–2 rows of x) on the GPU, at the
 * memory-bandwidth floor as far as one kernel gets there.
 *
 * One block of 8 warps computes 8 weight rows, splitting K over its 256
 * threads: each thread streams 16-byte pieces (8 bf16/f16 or 4 f32) of all 8
 * rows, 8-16 loads in flight before any is consumed, bypassing cache residency
 * (__ldcs); the x piece it multiplies is loaded once for all rows (from L1,
 * or shared memory, below). Partial sums meet in shared memory.
 *
 * Fusions that remove whole kernels from a decode step:
 *   - RMSNorm prologue: every block normalizes x (sum of squares, then
 *     x * inv * w) into shared memory and multiplies from there.
 *   - SwiGLU epilogue: a block streams gate rows n and up rows n + N together
 *     and writes silu(gate) * up, so the activation never round-trips.
 *   - residual add: accumulate adds into out (the o / down projections).
 *
 * Programmatic dependent launch (sm_90): the kernel is launched so that it
 * may start while the previous kernel is still finishing; it issues its first
 * weight loads (weights never depend on earlier kernels), then waits for the
 * previous grid (griddepcontrol.wait) before reading x. Every kernel of this
 * file also signals its own dependents early. */
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define GEMV_WARPS 8
#define GEMV_MAX_SMEM (160 << 10)
#define GEMV_COLS(epi) 8 /* output columns per block: 8 weight rows (16 with SwiGLU) */

template <int DT>
__device__ __forceinline__ void unpack8w(uint4 u, float *f) {
    if (DT == KN_DT_F32) {
        f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
        return;
    }
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (DT == KN_DT_BF16) {
            f[2 * j] = __uint_as_float(v[j] << 16);
            f[2 * j + 1] = __uint_as_float(v[j] & 0xffff0000u);
        } else {
            __half2 h = *(const __half2 *)&v[j];
            float2 ff = __half22float2(h);
            f[2 * j] = ff.x, f[2 * j + 1] = ff.y;
        }
    }
}

/* x[m, k..k+per) for the M rows, loaded once and reused for every weight row */
template <int DT, int M, bool SH>
__device__ __forceinline__ void load_x(const float *__restrict__ x, int64_t K, int64_t k, float (*xv)[8]) {
    const int per = DT == KN_DT_F32 ? 4 : 8;
#pragma unroll
    for (int m = 0; m < M; m++) {
        const float4 *xm = (const float4 *)(x + (int64_t)m * K + k);
        float4 a = SH ? xm[0] : __ldg(xm);
        xv[m][0] = a.x, xv[m][1] = a.y, xv[m][2] = a.z, xv[m][3] = a.w;
        if (per == 8) {
            float4 b = SH ? xm[1] : __ldg(xm + 1);
            xv[m][4] = b.x, xv[m][5] = b.y, xv[m][6] = b.z, xv[m][7] = b.w;
        }
    }
}
template <int DT, int M>
__device__ __forceinline__ void dot_x(const float *f, const float (*xv)[8], float *acc) {
    const int per = DT == KN_DT_F32 ? 4 : 8;
#pragma unroll
    for (int m = 0; m < M; m++) {
        float s = f[0] * xv[m][0] + f[1] * xv[m][1] + f[2] * xv[m][2] + f[3] * xv[m][3];
        if (per == 8) s += f[4] * xv[m][4] + f[5] * xv[m][5] + f[6] * xv[m][6] + f[7] * xv[m][7];
        acc[m] += s;
    }
}

/* Aligned rows (K % 8 == 0, 16-byte aligned x / w / norm_w). N = output
 * columns (for SwiGLU: half of W's rows). One block of GEMV_WARPS warps
 * computes C output columns, i.e. R = C * NR weight rows; the block splits K:
 * thread t owns elements [s * STEP + t * per, + per) of every row for steps
 * s = 0, 1, ..., so x is read once per block and reused for all R rows.
 * Partial sums are reduced over the warp, then over warps in shared memory. */
template <int DT, int M, int NORM, int EPI, int C>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(const float *__restrict__ x, const void *__restrict__ w, int64_t N, int64_t K, const float *__restrict__ bias,
           float *__restrict__ out, int accumulate, const float *__restrict__ norm_w, float eps) {
    extern __shared__ float4 gemv_smem[];
    constexpr int NR = EPI == KN_EPI_SWIGLU ? 2 : 1; /* weight rows per output column */
    constexpr int R = C * NR;
    constexpr int per = DT == KN_DT_F32 ? 4 : 8; /* elements per 16-byte load */
    constexpr int esz = DT == KN_DT_F32 ? 4 : 2;
    constexpr int U = R >= 8 ? 1 : 8 / R; /* steps in flight: U * R loads per thread */
    constexpr int64_t STEP = GEMV_WARPS * 32 * per;
    __shared__ float part[GEMV_WARPS][R * M];
    __shared__ float red[GEMV_WARPS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t n0 = (int64_t)blockIdx.x * C;
    const char *wb = (const char *)w;
    int64_t rowe[R]; /* element offset of each weight row (past-the-end columns read row 0, discarded) */
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int64_t col = n0 + c < N ? n0 + c : 0;
            rowe[c * NR + r] = (r == 0 ? col : col + N) * K;
        }
    kn_pdl_trigger();

    /* the first batch of weight loads, before waiting on the previous kernel */
    int64_t k = (int64_t)tid * per;
    uint4 raw[U][R];
    bool have = k + (U - 1) * STEP + per <= K;
    if (have)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) raw[u][r] = __ldcs((const uint4 *)(wb + (rowe[r] + k + u * STEP) * esz));
    kn_pdl_wait();

    const float *xs = (const float *)gemv_smem;
    if (NORM) /* x -> rms_norm(x) * norm_w in shared memory */
        for (int m = 0; m < M; m++)
            kn_block_rms_norm_smem<GEMV_WARPS>(x + (int64_t)m * K, K, norm_w, eps, (float *)gemv_smem + (int64_t)m * K, red);
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    for (; k + (U - 1) * STEP + per <= K; k += U * STEP) {
        if (!have)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    raw[u][r] = __ldcs((const uint4 *)(wb + (rowe[r] + k + u * STEP) * esz));
        have = false;
#pragma unroll
        for (int u = 0; u < U; u++) {
            float xv[M][8];
            if (NORM) load_x<DT, M, true>(xs, K, k + u * STEP, xv);
            else load_x<DT, M, false>(x, K, k + u * STEP, xv);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f[8];
                unpack8w<DT>(raw[u][r], f);
                dot_x<DT, M>(f, xv, acc[r]);
            }
        }
    }
    for (; k + per <= K; k += STEP) {
        float xv[M][8];
        if (NORM) load_x<DT, M, true>(xs, K, k, xv);
        else load_x<DT, M, false>(x, K, k, xv);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float f[8];
            unpack8w<DT>(__ldcs((const uint4 *)(wb + (rowe[r] + k) * esz)), f);
            dot_x<DT, M>(f, xv, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float v = acc[r][m];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][r * M + m] = v;
        }
    __syncthreads();
    if (tid < C * M) {
        const int c = tid / M, m = tid % M;
        const int64_t n = n0 + c;
        if (n < N) {
            float v[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                v[r] = 0.0f;
#pragma unroll
                for (int i = 0; i < GEMV_WARPS; i++) v[r] += part[i][(c * NR + r) * M + m];
            }
            if (EPI == KN_EPI_SWIGLU) {
                const float g = v[0] + (bias ? bias[n] : 0.0f), u = v[NR - 1] + (bias ? bias[n + N] : 0.0f);
                out[(int64_t)m * N + n] = g / (1.0f + expf(-g)) * u;
            } else {
                const float r = v[0] + (bias ? bias[n] : 0.0f);
                if (accumulate) out[(int64_t)m * N + n] += r;
                else out[(int64_t)m * N + n] = r;
            }
        }
    }
}

/* Any K / alignment: one element per lane (no fusions). */
template <int M>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv_any(const float *__restrict__ x, const void *__restrict__ w,
                                                              int dt, int64_t N, int64_t K, const float *__restrict__ bias,
                                                              float *__restrict__ out, int accumulate) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    kn_pdl_trigger();
    kn_pdl_wait();
    if (n >= N) return;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        float wv = kn_cuda_load_w(w, n * K + k, dt);
#pragma unroll
        for (int m = 0; m < M; m++) acc[m] += __ldg(x + (int64_t)m * K + k) * wv;
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = acc[m];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) {
            float r = v + (bias ? bias[n] : 0.0f);
            if (accumulate) out[(int64_t)m * N + n] += r;
            else out[(int64_t)m * N + n] = r;
        }
    }
}

template <int DT, int M, int NORM, int EPI>
static int launch_gemv(kn_backend *be, const float *x, const kn_weight *w, int64_t N, const float *bias, float *out,
                       int accumulate, const float *norm_w, float eps) {
    const int64_t K = w->cols;
    const size_t smem = (size_t)NORM * (size_t)M * (size_t)K * sizeof(float);
    static size_t smem_allowed = 48 << 10; /* per instantiation */
    if (NORM && !kn_cuda_allow_smem(k_gemv<DT, M, NORM, EPI, GEMV_COLS(EPI)>, smem, GEMV_MAX_SMEM, &smem_allowed))
        return 0;
    const unsigned blocks = (unsigned)((N + GEMV_COLS(EPI) - 1) / GEMV_COLS(EPI));
    return kn_cuda_launch(be, k_gemv<DT, M, NORM, EPI, GEMV_COLS(EPI)>, dim3(blocks), dim3(GEMV_WARPS * 32), smem, x, w->data, N, K,
                          bias, out, accumulate, norm_w, eps) == cudaSuccess;
}

template <int DT, int M>
static int gemv_m(kn_backend *be, const float *x, const kn_weight *w, const float *bias, float *out, int accumulate,
                  const float *norm_w, float eps, int epi) {
    if (epi == KN_EPI_SWIGLU)
        return norm_w ? launch_gemv<DT, M, 1, KN_EPI_SWIGLU>(be, x, w, w->rows / 2, bias, out, 0, norm_w, eps)
                      : launch_gemv<DT, M, 0, KN_EPI_SWIGLU>(be, x, w, w->rows / 2, bias, out, 0, norm_w, eps);
    return norm_w ? launch_gemv<DT, M, 1, KN_EPI_NONE>(be, x, w, w->rows, bias, out, accumulate, norm_w, eps)
                  : launch_gemv<DT, M, 0, KN_EPI_NONE>(be, x, w, w->rows, bias, out, accumulate, norm_w, eps);
}

template <int DT>
static int gemv_dt(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                   int accumulate, const float *norm_w, float eps, int epi) {
    return M == 1 ? gemv_m<DT, 1>(be, x, w, bias, out, accumulate, norm_w, eps, epi)
                  : gemv_m<DT, 2>(be, x, w, bias, out, accumulate, norm_w, eps, epi);
}

int kn_cuda_gemv(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                 int accumulate, const float *norm_w, float eps, int epi) {
    if (M < 1 || M > KN_CUDA_GEMV_MAX_M || w->bits) return 0;
    if (epi == KN_EPI_SWIGLU && (w->rows % 2 || accumulate)) return 0;
    const int aligned = w->cols % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w->data & 15) == 0 &&
                        ((uintptr_t)norm_w & 15) == 0;
    if (!aligned) {
        if (norm_w || epi != KN_EPI_NONE) return 0;
        const unsigned blocks = (unsigned)((w->rows + GEMV_WARPS - 1) / GEMV_WARPS);
        cudaError_t e = M == 1 ? kn_cuda_launch(be, k_gemv_any<1>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, x,
                                                w->data, (int)w->dtype, w->rows, w->cols, bias, out, accumulate)
                               : kn_cuda_launch(be, k_gemv_any<2>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, x,
                                                w->data, (int)w->dtype, w->rows, w->cols, bias, out, accumulate);
        return e == cudaSuccess;
    }
    if (w->dtype == KN_DT_BF16) return gemv_dt<KN_DT_BF16>(be, x, M, w, bias, out, accumulate, norm_w, eps, epi);
    if (w->dtype == KN_DT_F16) return gemv_dt<KN_DT_F16>(be, x, M, w, bias, out, accumulate, norm_w, eps, epi);
    return gemv_dt<KN_DT_F32>(be, x, M, w, bias, out, accumulate, norm_w, eps, epi);
}

/* cuda_quant.cu — MLX affine-quantized weights on the CUDA backend.
 *
 * A quantized weight is one device allocation: packed uint32 codes [rows,
 * cols*bits/32], then float32 scales and biases [rows, cols/group_size]
 * (widened from the checkpoint's bf16/f16 at load, exactly). Nothing is ever
 * dequantized in full:
 *   matmul M <= 2 : 4/8-bit: qgemv_vec, x staged in shared memory, a warp per
 *                   2 output rows, 16-byte code pieces, 4 per row in flight
 *                   per lane (2-bit: qgemv)
 *   matmul M <= 8 : qgemv, one warp per output row, each lane streams whole
 *                   uint32 words and dequantizes them in registers
 *   matmul M > 8  : qgemm, 32x32 output tiles; each 32-column K step
 *                   dequantizes a 32x32 weight tile into shared memory
 *   embed         : one block per token dequantizes its row
 * Element (r, c) = scale * q + bias in float32, as base/quant.h defines. */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "base/quant.h"
}

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

__device__ __forceinline__ uint32_t q_code(uint32_t v, int i, int bits) {
    return (v >> (bits * i)) & ((1u << bits) - 1u);
}

/* one warp per output row n; x [M, K], out [M, N] */
template <int MAXM>
__global__ void qgemv_kernel(const float *x, int M, const uint32_t *q, const float *scales, const float *biases,
                             int64_t N, int64_t K, int bits, int gs, const float *bias, float *out, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const int per = 32 / bits;
    const int64_t words = K / per, G = K / gs;
    const uint32_t *row = q + n * words;
    float acc[MAXM];
#pragma unroll
    for (int m = 0; m < MAXM; m++) acc[m] = 0.0f;
    for (int64_t wi = lane; wi < words; wi += 32) {
        const uint32_t v = row[wi];
        const int64_t c0 = wi * per, g = c0 / gs;
        const float s = scales[n * G + g], b = biases[n * G + g];
        for (int i = 0; i < per; i++) {
            const float wv = s * (float)q_code(v, i, bits) + b;
#pragma unroll
            for (int m = 0; m < MAXM; m++)
                if (m < M) acc[m] += wv * x[(int64_t)m * K + c0 + i];
        }
    }
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
        float a = acc[m];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && m < M) {
            float r = a + (bias ? bias[n] : 0.0f);
            float *dst = out + (int64_t)m * N + n;
            *dst = accumulate ? *dst + r : r;
        }
    }
}

/* 4/8-bit, M <= 2, K a multiple of the group (>= 32): x is staged once per
 * block in shared memory; each warp computes R output rows, each lane
 * streaming 16-byte pieces (32 4-bit or 16 8-bit codes, all in one group) of
 * every row, U pieces per row in flight before any is used, and each x value
 * read from shared memory serves all R rows; per piece s * sum(q * x) +
 * b * sum(x). */
#define QV_R 2
#define QV_U 4
#define QV_MAX_SMEM (160 << 10)
template <int BITS, int M>
__global__ void __launch_bounds__(256)
    qgemv_vec_kernel(const float *__restrict__ x, const uint4 *__restrict__ q, const float *__restrict__ scales,
                     const float *__restrict__ biases, int64_t N, int64_t K, int gs, const float *__restrict__ bias,
                     float *__restrict__ out, int accumulate) {
    constexpr int C = 128 / BITS, P = 32 / BITS, R = QV_R, U = QV_U;
    constexpr uint32_t MASK = (1u << BITS) - 1u;
    extern __shared__ float4 qv_smem[];
    float *xs = (float *)qv_smem; /* [M][K] */
    for (int64_t i = threadIdx.x; i < (int64_t)M * K / 4; i += blockDim.x) qv_smem[i] = __ldg((const float4 *)x + i);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * R;
    if (n0 >= N) return;
    const int64_t chunks = K / C, G = K / gs;
    const uint4 *row[R];
    const float *sr[R], *br[R];
#pragma unroll
    for (int r = 0; r < R; r++) { /* rows past N re-read row n0; their sums are dropped */
        const int64_t n = n0 + r < N ? n0 + r : n0;
        row[r] = q + n * chunks, sr[r] = scales + n * G, br[r] = biases + n * G;
    }
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    for (int64_t j0 = lane; j0 < chunks; j0 += 32 * U) {
        uint4 raw[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int64_t j = j0 + 32 * u;
                raw[u][r] = j < chunks ? __ldcs(row[r] + j) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = j0 + 32 * u;
            if (j >= chunks) break;
            const int64_t c0 = j * C, g = c0 / gs;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 *xv = (const float4 *)(xs + (int64_t)m * K + c0);
                float dq[R], sx = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) dq[r] = 0.0f;
#pragma unroll
                for (int t = 0; t < C / 4; t++) {
                    const float4 xx = xv[t];
                    const float xe[4] = {xx.x, xx.y, xx.z, xx.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int idx = 4 * t + e;
                        sx += xe[e];
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            const uint32_t wd = idx / P == 0 ? raw[u][r].x : idx / P == 1 ? raw[u][r].y
                                              : idx / P == 2 ? raw[u][r].z : raw[u][r].w;
                            dq[r] += (float)((wd >> (BITS * (idx % P))) & MASK) * xe[e];
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][m] += __ldg(sr[r] + g) * dq[r] + __ldg(br[r] + g) * sx;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float a = acc[r][m];
            for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            const int64_t n = n0 + r;
            if (lane == 0 && n < N) {
                const float v = a + (bias ? bias[n] : 0.0f);
                float *dst = out + (int64_t)m * N + n;
                *dst = accumulate ? *dst + v : v;
            }
        }
}

template <int BITS, int M>
static int launch_qgemv_vec(cudaStream_t s, const float *x, const kn_weight *w, const float *bias, float *out,
                            int accumulate) {
    const size_t smem = (size_t)M * (size_t)w->cols * sizeof(float);
    static int attr_set = 0; /* per instantiation */
    if (smem > QV_MAX_SMEM) return 0;
    if (smem > (48u << 10) && !attr_set) {
        if (cudaFuncSetAttribute(qgemv_vec_kernel<BITS, M>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 QV_MAX_SMEM) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        attr_set = 1;
    }
    const unsigned blocks = (unsigned)((w->rows + 8 * QV_R - 1) / (8 * QV_R));
    qgemv_vec_kernel<BITS, M><<<blocks, 256, smem, s>>>(x, (const uint4 *)w->data, (const float *)w->scales,
                                                        (const float *)w->biases, w->rows, w->cols, w->group_size,
                                                        bias, out, accumulate);
    return 1;
}

#define QT 32 /* tile edge: 32 x rows, 32 output columns, 32-wide K steps */

/* block (32 output cols) x (32 x rows); 256 threads, 4 outputs each */
__global__ void qgemm_kernel(const float *x, int M, const uint32_t *q, const float *scales, const float *biases,
                             int64_t N, int64_t K, int bits, int gs, const float *bias, float *out, int accumulate) {
    __shared__ float xs[QT][QT + 1];
    __shared__ float ws[QT][QT + 1];
    const int tid = threadIdx.x;
    const int64_t n0 = (int64_t)blockIdx.x * QT;
    const int m0 = blockIdx.y * QT;
    const int per = 32 / bits;
    const int64_t words = K / per, G = K / gs;
    const int tn = tid % QT, tm = tid / QT; /* this thread: column tn, rows tm + 8*j */
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k0 = 0; k0 < K; k0 += QT) {
        for (int e = tid; e < QT * QT; e += blockDim.x) {
            const int r = e / QT, c = e % QT;
            const int m = m0 + r;
            xs[r][c] = m < M ? x[(int64_t)m * K + k0 + c] : 0.0f;
            const int64_t n = n0 + r, col = k0 + c;
            float wv = 0.0f;
            if (n < N) {
                const uint32_t v = q[n * words + col / per];
                const int64_t g = col / gs;
                wv = scales[n * G + g] * (float)q_code(v, (int)(col % per), bits) + biases[n * G + g];
            }
            ws[r][c] = wv;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < QT; kk++) {
            const float wv = ws[tn][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) acc[j] += xs[tm + 8 * j][kk] * wv;
        }
        __syncthreads();
    }
    const int64_t n = n0 + tn;
    if (n >= N) return;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int m = m0 + tm + 8 * j;
        if (m >= M) continue;
        float r = acc[j] + (bias ? bias[n] : 0.0f);
        float *dst = out + (int64_t)m * N + n;
        *dst = accumulate ? *dst + r : r;
    }
}

__global__ void qembed_kernel(const uint32_t *q, const float *scales, const float *biases, int64_t rows, int64_t d,
                              int bits, int gs, const int32_t *ids, float *out) {
    const int64_t id = ids[blockIdx.x];
    float *o = out + (int64_t)blockIdx.x * d;
    const int per = 32 / bits;
    const int64_t G = d / gs, words = d / per;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        if (id < 0 || id >= rows) {
            o[c] = 0.0f;
            continue;
        }
        const uint32_t v = q[id * words + c / per];
        o[c] = scales[id * G + c / gs] * (float)q_code(v, (int)(c % per), bits) + biases[id * G + c / gs];
    }
}

void kn_cuda_qmatmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                     int accumulate) {
    cudaStream_t s = kn_cuda_stream(be);
    const uint32_t *q = (const uint32_t *)w->data;
    const float *sc = (const float *)w->scales, *bi = (const float *)w->biases; /* F32 here: widened at load */
    const int vec = (w->bits == 4 || w->bits == 8) && M <= 2 && w->group_size >= 32 && w->cols % w->group_size == 0 &&
                    ((uintptr_t)x & 15) == 0 && ((uintptr_t)q & 15) == 0;
    if (vec) {
        int done;
        if (w->bits == 4) done = M == 1 ? launch_qgemv_vec<4, 1>(s, x, w, bias, out, accumulate)
                                        : launch_qgemv_vec<4, 2>(s, x, w, bias, out, accumulate);
        else done = M == 1 ? launch_qgemv_vec<8, 1>(s, x, w, bias, out, accumulate)
                           : launch_qgemv_vec<8, 2>(s, x, w, bias, out, accumulate);
        if (done) return;
    }
    if (M <= 8) {
        const int warps = 8;
        const unsigned blocks = (unsigned)((w->rows + warps - 1) / warps);
        if (M <= 2)
            qgemv_kernel<2><<<blocks, warps * 32, 0, s>>>(x, M, q, sc, bi, w->rows, w->cols, w->bits,
                                                          w->group_size, bias, out, accumulate);
        else
            qgemv_kernel<8><<<blocks, warps * 32, 0, s>>>(x, M, q, sc, bi, w->rows, w->cols, w->bits,
                                                          w->group_size, bias, out, accumulate);
        return;
    }
    dim3 grid((unsigned)((w->rows + QT - 1) / QT), (unsigned)((M + QT - 1) / QT));
    qgemm_kernel<<<grid, 256, 0, s>>>(x, M, q, sc, bi, w->rows, w->cols, w->bits, w->group_size, bias,
                                      out, accumulate);
}

void kn_cuda_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    if (n <= 0) return;
    qembed_kernel<<<n, 256, 0, kn_cuda_stream(be)>>>((const uint32_t *)t->data, (const float *)t->scales,
                                                     (const float *)t->biases, t->rows, t->cols,
                                                     t->bits, t->group_size, ids, out);
}

kn_code kn_cuda_weight_load_quant(kn_backend *be, const kn_quant_host *s, kn_weight *out, kn_error *err) {
    (void)be;
    const int64_t words = kn_quant_row_words(s->cols, s->bits), groups = s->cols / s->group_size;
    const size_t qbytes = (size_t)s->rows * (size_t)words * 4, sbytes = (size_t)s->rows * (size_t)groups * 4;
    const size_t qpad = (qbytes + 255) & ~(size_t)255, spad = (sbytes + 255) & ~(size_t)255;
    float *host = (float *)malloc(2 * sbytes);
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory widening quantization scales");
    for (int64_t i = 0; i < s->rows * groups; i++) {
        host[i] = kn_load_f32(s->scales, s->sb_dtype, i);
        host[s->rows * groups + i] = kn_load_f32(s->biases, s->sb_dtype, i);
    }
    char *p = NULL;
    if (cudaMalloc((void **)&p, qpad + 2 * spad) != cudaSuccess) {
        free(host);
        return kn_fail(err, KN_ERR_NOMEM, "cuda backend: out of device memory for a %zu-byte quantized weight",
                       qpad + 2 * spad);
    }
    int ok = cudaMemcpy(p, s->q, qbytes, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(p + qpad, host, sbytes, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(p + qpad + spad, host + s->rows * groups, sbytes, cudaMemcpyHostToDevice) == cudaSuccess;
    free(host);
    if (!ok) {
        cudaFree(p);
        return kn_fail(err, KN_ERR_BACKEND, "cuda backend: quantized weight upload failed");
    }
    out->dtype = KN_DT_U32, out->rows = s->rows, out->cols = s->cols, out->data = p, out->owned = 1;
    out->bits = s->bits, out->group_size = s->group_size;
    out->scales = p + qpad, out->biases = p + qpad + spad, out->sb_dtype = KN_DT_F32; /* widened above */
    return KN_OK;
}

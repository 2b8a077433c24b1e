/* cuda_quant.cu — MLX affine-quantized weights on the CUDA backend.
 *
 * A quantized weight is one device allocation: packed uint32 codes [rows,
 * cols*bits/32], then scales and biases [rows, cols/group_size] in the
 * checkpoint's dtype (bf16/f16/f32, as loaded: 2 bytes per group each for
 * bf16, an eighth of the 4-bit g64 codes' bytes). Nothing is ever dequantized
 * in full:
 *   matmul M <= 2 : 4/8-bit: kn_cuda_qgemv (cuda_qgemv.cu, integer dot
 *                   products, fusions); other bits / shapes: qgemv
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
__global__ void qgemv_kernel(const float *x, int M, const uint32_t *q, const void *scales, const void *biases,
                             int sbdt, int64_t N, int64_t K, int bits, int gs, const float *bias, float *out,
                             int accumulate) {
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
        const float s = kn_cuda_load_w(scales, n * G + g, sbdt), b = kn_cuda_load_w(biases, n * G + g, sbdt);
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

#define QT 32 /* tile edge: 32 x rows, 32 output columns, 32-wide K steps */

/* block (32 output cols) x (32 x rows); 256 threads, 4 outputs each */
__global__ void qgemm_kernel(const float *x, int M, const uint32_t *q, const void *scales, const void *biases,
                             int sbdt, int64_t N, int64_t K, int bits, int gs, const float *bias, float *out,
                             int accumulate) {
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
                wv = kn_cuda_load_w(scales, n * G + g, sbdt) * (float)q_code(v, (int)(col % per), bits) +
                     kn_cuda_load_w(biases, n * G + g, sbdt);
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

__global__ void qembed_kernel(const uint32_t *q, const void *scales, const void *biases, int sbdt, int64_t rows,
                              int64_t d, int bits, int gs, const int32_t *ids, float *out) {
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
        o[c] = kn_cuda_load_w(scales, id * G + c / gs, sbdt) * (float)q_code(v, (int)(c % per), bits) +
               kn_cuda_load_w(biases, id * G + c / gs, sbdt);
    }
}

void kn_cuda_qmatmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                     int accumulate) {
    if (kn_cuda_qgemv(be, x, M, w, bias, out, accumulate, NULL, 0.0f, KN_EPI_NONE)) return;
    cudaStream_t s = kn_cuda_stream(be);
    const uint32_t *q = (const uint32_t *)w->data;
    const int sbdt = (int)w->sb_dtype;
    if (M <= 8) {
        const int warps = 8;
        const unsigned blocks = (unsigned)((w->rows + warps - 1) / warps);
        if (M <= 2)
            qgemv_kernel<2><<<blocks, warps * 32, 0, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols,
                                                          w->bits, w->group_size, bias, out, accumulate);
        else
            qgemv_kernel<8><<<blocks, warps * 32, 0, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols,
                                                          w->bits, w->group_size, bias, out, accumulate);
        return;
    }
    dim3 grid((unsigned)((w->rows + QT - 1) / QT), (unsigned)((M + QT - 1) / QT));
    qgemm_kernel<<<grid, 256, 0, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols, w->bits,
                                      w->group_size, bias, out, accumulate);
}

void kn_cuda_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    if (n <= 0) return;
    qembed_kernel<<<n, 256, 0, kn_cuda_stream(be)>>>((const uint32_t *)t->data, t->scales, t->biases,
                                                     (int)t->sb_dtype, t->rows, t->cols, t->bits, t->group_size,
                                                     ids, out);
}

kn_code kn_cuda_weight_load_quant(kn_backend *be, const kn_quant_host *s, kn_weight *out, kn_error *err) {
    (void)be;
    const int64_t words = kn_quant_row_words(s->cols, s->bits), groups = s->cols / s->group_size;
    const size_t qbytes = (size_t)s->rows * (size_t)words * 4;
    const size_t sbytes = (size_t)s->rows * (size_t)groups * kn_dtype_size(s->sb_dtype);
    const size_t qpad = (qbytes + 255) & ~(size_t)255, spad = (sbytes + 255) & ~(size_t)255;
    char *p = NULL;
    if (cudaMalloc((void **)&p, qpad + 2 * spad) != cudaSuccess)
        return kn_fail(err, KN_ERR_NOMEM, "cuda backend: out of device memory for a %zu-byte quantized weight",
                       qpad + 2 * spad);
    if (cudaMemcpy(p, s->q, qbytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(p + qpad, s->scales, sbytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(p + qpad + spad, s->biases, sbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(p);
        return kn_fail(err, KN_ERR_BACKEND, "cuda backend: quantized weight upload failed");
    }
    out->dtype = KN_DT_U32, out->rows = s->rows, out->cols = s->cols, out->data = p, out->owned = 1;
    out->bits = s->bits, out->group_size = s->group_size;
    out->scales = p + qpad, out->biases = p + qpad + spad, out->sb_dtype = s->sb_dtype; /* as the checkpoint has them */
    return KN_OK;
}

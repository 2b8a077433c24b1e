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
 *   matmul M > 8  : qgemm_mma, tensor cores over the exact codes (bf16) and
 *                   x as two bf16 terms, scale and bias applied per group
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
    const int per = 32 / bits, gshift = __ffs(gs) - 1; /* group sizes are powers of two */
    const int64_t words = K / per, G = K / gs;
    const uint32_t *row = q + n * words;
    float acc[MAXM];
#pragma unroll
    for (int m = 0; m < MAXM; m++) acc[m] = 0.0f;
    for (int64_t wi = lane; wi < words; wi += 32) {
        const uint32_t v = row[wi];
        const int64_t c0 = wi * per, g = c0 >> gshift;
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

/* ---- prefill (M > 8): tensor cores over exact codes ----
 * Per group g of a weight row: x . (s q + b) = s (x . q) + b sum(x). The codes
 * q are small integers, exact in bf16; x is split into two bf16 terms
 * hi = bf16(x), lo = bf16(x - hi) (|x - hi - lo| <= 2^-18 |x|), and
 * x . q = hi . q + lo . q runs as mma.sync m16n8k16 with f32 accumulation
 * into a per-group accumulator, which is then scaled by the row's s and gets
 * b times the group's float sum of x. A block computes 64 tokens x 64 weight
 * rows with 4 warps (32 x 32 each), staging one group of x (both terms), of
 * codes (as bf16) and the 64 scales / biases in shared memory per K step. */
#define QM_BM 64
#define QM_BN 64
#define QM_PAD 8 /* bf16 elements: row strides of 4 words mod 32, no bank conflicts */

template <int GS>
__global__ void __launch_bounds__(128)
    qgemm_mma_kernel(const float *__restrict__ x, int M, const uint32_t *__restrict__ q, const void *scales,
                     const void *biases, int sbdt, int64_t N, int64_t K, int bits, const float *__restrict__ bias,
                     float *__restrict__ out, int accumulate) {
    extern __shared__ float4 qm_smem[];
    constexpr int SW = GS < 64 ? GS : 64, SUB = GS / SW; /* columns staged at once; stages per group */
    constexpr int ld = SW + QM_PAD, HN = SW / 2;        /* bf16 elements per staged row; elements per staging thread */
    __nv_bfloat16 *xh = (__nv_bfloat16 *)qm_smem, *xl = xh + QM_BM * ld, *ws = xl + QM_BM * ld;
    float *ssc = (float *)(ws + QM_BN * ld), *sbi = ssc + QM_BN, *xsum = sbi + QM_BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int64_t n0 = (int64_t)blockIdx.x * QM_BN;
    const int m0 = blockIdx.y * QM_BM;
    const int per = 32 / bits, nw = HN / per; /* code words per staging thread */
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t words = K / per, G = K / GS, n_st = K / SW;
    const int sr = tid >> 1, half = tid & 1; /* staging: row sr, elements [half * HN, + HN) of the group */
    const int m = m0 + sr;
    const int64_t n = n0 + sr;
    const float *xrow = x + (int64_t)(m < M ? m : 0) * K + half * HN;
    const uint32_t *qrow = q + (n < N ? n : 0) * words + half * HN / per;
    /* the next group's raw values, loaded while the current group computes */
    float xr[HN];
    uint32_t wr[HN / 2]; /* at most HN / per words (2-bit: HN / 16) */
    float sraw = 0.0f, braw = 0.0f;
    auto fetch = [&](int64_t st) { /* stage st: columns [st * SW, + SW) of group st / SUB */
        const int64_t g = st / SUB;
#pragma unroll
        for (int i = 0; i < HN; i++) xr[i] = m < M ? __ldg(xrow + st * SW + i) : 0.0f;
#pragma unroll
        for (int i = 0; i < HN / 2; i++)
            if (i < nw) wr[i] = n < N ? __ldg(qrow + st * (SW / per) + i) : 0u;
        if (!half) {
            sraw = n < N ? kn_cuda_load_w(scales, n * G + g, sbdt) : 0.0f;
            braw = n < N ? kn_cuda_load_w(biases, n * G + g, sbdt) : 0.0f;
        }
    };
    float acc[2][4][4], accg[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    fetch(0);
    float xs_part = 0.0f; /* this row's float sum of x over the group's stages so far */
    for (int64_t st = 0; st < n_st; st++) {
        const int sub = (int)(st % SUB);
        if (sub == 0) {
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) accg[i][j][e] = 0.0f;
            xs_part = 0.0f;
        }
        { /* stage: x as two bf16 terms and its float sum; codes as bf16 (exact); scale and bias */
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < HN; i += 2) {
                const __nv_bfloat162 h = __floats2bfloat162_rn(xr[i], xr[i + 1]);
                *(__nv_bfloat162 *)&xh[sr * ld + half * HN + i] = h;
                *(__nv_bfloat162 *)&xl[sr * ld + half * HN + i] =
                    __floats2bfloat162_rn(xr[i] - __low2float(h), xr[i + 1] - __high2float(h));
                sum += xr[i] + xr[i + 1];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            xs_part += sum;
            if (!half) xsum[sr] = xs_part, ssc[sr] = sraw, sbi[sr] = braw;
#pragma unroll
            for (int i = 0; i < HN / 2; i++) {
                if (i >= nw) break;
                for (int c = 0; c < per; c += 2)
                    *(__nv_bfloat162 *)&ws[sr * ld + half * HN + i * per + c] =
                        __floats2bfloat162_rn((float)((wr[i] >> (bits * c)) & mask),
                                              (float)((wr[i] >> (bits * (c + 1))) & mask));
            }
        }
        __syncthreads();
        if (st + 1 < n_st) fetch(st + 1);
#pragma unroll
        for (int kk = 0; kk < SW; kk += 16) {
            uint32_t ah[2][4], al[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wm + i * 16 + g8;
                ah[i][0] = *(const uint32_t *)&xh[r * ld + kk + 2 * t4];
                ah[i][1] = *(const uint32_t *)&xh[(r + 8) * ld + kk + 2 * t4];
                ah[i][2] = *(const uint32_t *)&xh[r * ld + kk + 2 * t4 + 8];
                ah[i][3] = *(const uint32_t *)&xh[(r + 8) * ld + kk + 2 * t4 + 8];
                al[i][0] = *(const uint32_t *)&xl[r * ld + kk + 2 * t4];
                al[i][1] = *(const uint32_t *)&xl[(r + 8) * ld + kk + 2 * t4];
                al[i][2] = *(const uint32_t *)&xl[r * ld + kk + 2 * t4 + 8];
                al[i][3] = *(const uint32_t *)&xl[(r + 8) * ld + kk + 2 * t4 + 8];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = wn + j * 8 + g8;
                b[j][0] = *(const uint32_t *)&ws[c * ld + kk + 2 * t4];
                b[j][1] = *(const uint32_t *)&ws[c * ld + kk + 2 * t4 + 8];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kn_mma_bf16(accg[i][j], ah[i], b[j][0], b[j][1]);
                    kn_mma_bf16(accg[i][j], al[i], b[j][0], b[j][1]);
                }
        }
        if (sub == SUB - 1)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = wm + i * 16 + g8 + (e >= 2 ? 8 : 0), c = wn + j * 8 + 2 * t4 + (e & 1);
                        acc[i][j][e] += ssc[c] * accg[i][j][e] + sbi[c] * xsum[r];
                    }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mo = m0 + wm + i * 16 + g8 + (e >= 2 ? 8 : 0);
                const int64_t no = n0 + wn + j * 8 + 2 * t4 + (e & 1);
                if (mo >= M || no >= N) continue;
                const float v = acc[i][j][e] + (bias ? bias[no] : 0.0f);
                float *dst = out + (int64_t)mo * N + no;
                *dst = accumulate ? *dst + v : v;
            }
}

static size_t qgemm_mma_smem(int gs) {
    const int sw = gs < 64 ? gs : 64; /* columns staged at once */
    return (size_t)(2 * QM_BM + QM_BN) * (size_t)(sw + QM_PAD) * 2 + (size_t)(2 * QM_BN + QM_BM) * 4;
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
        kn_cuda_before_launch();
        if (M <= 2)
            qgemv_kernel<2><<<blocks, warps * 32, 0, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols,
                                                          w->bits, w->group_size, bias, out, accumulate);
        else
            qgemv_kernel<8><<<blocks, warps * 32, 0, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols,
                                                          w->bits, w->group_size, bias, out, accumulate);
        kn_cuda_launched(be, "qgemv_kernel");
        return;
    }
    const size_t smem = qgemm_mma_smem(w->group_size); /* group sizes 32/64/128 (kn_quant_check) */
    dim3 grid((unsigned)((w->rows + QM_BN - 1) / QM_BN), (unsigned)((M + QM_BM - 1) / QM_BM));
    kn_cuda_before_launch();
    if (w->group_size == 32)
        qgemm_mma_kernel<32><<<grid, 128, smem, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols, w->bits,
                                                     bias, out, accumulate);
    else if (w->group_size == 64)
        qgemm_mma_kernel<64><<<grid, 128, smem, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols, w->bits,
                                                     bias, out, accumulate);
    else
        qgemm_mma_kernel<128><<<grid, 128, smem, s>>>(x, M, q, w->scales, w->biases, sbdt, w->rows, w->cols, w->bits,
                                                      bias, out, accumulate);
    kn_cuda_launched(be, "qgemm_mma_kernel");
}

void kn_cuda_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    if (n <= 0) return;
    kn_cuda_before_launch();
    qembed_kernel<<<n, 256, 0, kn_cuda_stream(be)>>>((const uint32_t *)t->data, t->scales, t->biases,
                                                     (int)t->sb_dtype, t->rows, t->cols, t->bits, t->group_size,
                                                     ids, out);
    kn_cuda_launched(be, "qembed_kernel");
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

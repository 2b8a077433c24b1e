/* cuda_ops_whisper.cu — the whisper op block on CUDA (see backend.h):
 * im2col for the conv1d front end (one thread per output element) and dense
 * attention (one block per (query row, head): the score row lives in shared
 * memory, so n_kv is bounded by KN_CUDA_DENSE_ATTN_MAX_KV — Whisper needs
 * at most 1500). Correct-first kernels; the matmuls around them carry the
 * FLOPs. */
#include "backend/cuda/cuda_internal.h"

#define KN_CUDA_DENSE_ATTN_MAX_KV 8192

__global__ void k_im2col_1d(const float *x, int64_t xts, int64_t xcs, int t_in, int c_in, int k, int stride,
                            int pad, int t_out, float *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t cols = (int64_t)c_in * k, total = (int64_t)t_out * cols;
    if (i >= total) return;
    int t = (int)(i / cols), r = (int)(i % cols), c = r / k, j = r % k;
    int src = t * stride + j - pad;
    out[i] = src >= 0 && src < t_in ? x[(int64_t)src * xts + (int64_t)c * xcs] : 0.0f;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* block-wide max / sum for blockDim.x a multiple of 32 (<= 1024) */
__device__ float block_reduce(float v, float *sh, int is_max) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    v = is_max ? warp_max(v) : warp_sum(v);
    return v;
}

__global__ void k_attention_dense(kn_dense_attention_args a) {
    extern __shared__ float score[]; /* [n_kv] */
    __shared__ float red[32];
    const int i = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    int len = a.n_kv;
    if (a.causal && a.q_pos0 + i + 1 < len) len = a.q_pos0 + i + 1;
    float *o = a.out + (int64_t)i * a.out_stride + (int64_t)h * hd;
    if (len <= 0) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
        return;
    }
    const float *q = a.q + (int64_t)i * a.q_stride + (int64_t)h * hd;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float *kr = a.k + (int64_t)j * a.k_stride + (int64_t)h * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * kr[d];
        s *= a.scale;
        score[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_reduce(mx, red, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(score[j] - mx);
        score[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, 0);
    __syncthreads(); /* every score[j] written before any thread reads them all */
    const float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < len; j++) acc += score[j] * a.v[(int64_t)j * a.v_stride + (int64_t)h * hd + d];
        o[d] = acc * inv;
    }
}

extern "C" void kn_cuda_im2col_1d(kn_backend *be, const float *x, int64_t xts, int64_t xcs, int t_in, int c_in,
                                  int k, int stride, int pad, float *out) {
    int t_out = (t_in + 2 * pad - k) / stride + 1;
    int64_t total = (int64_t)t_out * c_in * k;
    if (total <= 0) return;
    kn_cuda_before_launch();
    k_im2col_1d<<<(unsigned)((total + 255) / 256), 256, 0, kn_cuda_stream(be)>>>(x, xts, xcs, t_in, c_in, k, stride,
                                                                                   pad, t_out, out);
    kn_cuda_launched(be, "im2col_1d");
}

extern "C" void kn_cuda_attention_dense(kn_backend *be, const kn_dense_attention_args *a) {
    if (a->n_q <= 0 || a->n_heads <= 0) return;
    if (a->n_kv > KN_CUDA_DENSE_ATTN_MAX_KV) {
        kn_cuda_note(be, cudaErrorInvalidValue, "attention_dense: n_kv above the CUDA limit");
        return;
    }
    dim3 grid((unsigned)a->n_q, (unsigned)a->n_heads);
    /* whole 16-byte units: compute-sanitizer found the score loop reading
     * 12 bytes past a 9-key row (a wide shared load over the last score;
     * the block's shared allocation covers it, memcheck's bounds do not) */
    size_t shmem = sizeof(float) * (((size_t)(a->n_kv > 0 ? a->n_kv : 1) + 3) & ~(size_t)3);
    kn_cuda_before_launch();
    k_attention_dense<<<grid, 128, shmem, kn_cuda_stream(be)>>>(*a);
    kn_cuda_launched(be, "attention_dense");
}

/* cuda_backend.cu — the CUDA implementation of the op interface (backend.h).
 *
 * Correct-first kernels: every op of the CPU backend, same layouts and the
 * same float32 accumulation, enqueued on one stream owned by the backend (no
 * host synchronization inside a forward; uploads/downloads of small index
 * arrays go through the same stream). Weights live in device memory in their
 * checkpoint dtype (F32/BF16/F16) and are widened to f32 in registers.
 *   matmul M <= 8 : one warp per output row, x rows in shared memory
 *   matmul M > 8  : 64x64 shared-memory tiles, 4x4 outputs per thread
 *   attention     : one block per (token, head) over the paged cache,
 *                   scores in shared memory, exact softmax
 * Faster paths (cuBLASLt GEMM, split-K flash-decode, CUDA graphs) build on
 * this interface without changing it. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

/* cuda_ops_models.cu */
extern "C" void kn_cuda_softcap(kn_backend *be, float *x, int64_t n, float cap);
extern "C" void kn_cuda_scale(kn_backend *be, float *x, int64_t n, float s);
extern "C" void kn_cuda_sigmoid_gate_add(kn_backend *be, float *y, const float *x, const float *gate, int rows, int dim);
extern "C" void kn_cuda_moe_route(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                                  const float *expert_scale, int32_t *idx, float *w);
extern "C" void kn_cuda_mul_rows(kn_backend *be, float *y, const float *x, int64_t x_stride, int rows, int dim);
extern "C" void kn_cuda_moe_ffn(kn_backend *be, const kn_moe_args *a);

typedef struct {
    kn_backend base;
    cudaStream_t stream;
    int device;
} cuda_backend;

static cuda_backend *cu(kn_backend *be) { return (cuda_backend *)be; }

void kn_cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fprintf(stderr, "kiln: cuda %s: %s\n", what, cudaGetErrorString(e));
}
#define check kn_cuda_check
#define load_w kn_cuda_load_w

cudaStream_t kn_cuda_stream(kn_backend *be) { return cu(be)->stream; }

/* ---- memory ---------------------------------------------------------- */

static void *cu_alloc(kn_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) return NULL;
    return p;
}
static void cu_free(kn_backend *be, void *p) { cudaFree(p); }
static void cu_upload(kn_backend *be, void *d, const void *s, size_t n) {
    check(cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, cu(be)->stream), "upload");
    /* callers may reuse the host buffer at once: wait for the copy */
    check(cudaStreamSynchronize(cu(be)->stream), "upload sync");
}
static void cu_download(kn_backend *be, void *d, const void *s, size_t n) {
    check(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, cu(be)->stream), "download");
    check(cudaStreamSynchronize(cu(be)->stream), "download sync");
}
static void cu_sync(kn_backend *be) { check(cudaStreamSynchronize(cu(be)->stream), "sync"); }
static void cu_destroy(kn_backend *be) {
    cudaStreamDestroy(cu(be)->stream);
    free(be);
}

static kn_code cu_weight_load(kn_backend *be, kn_dtype dt, int64_t rows, int64_t cols, const void *host,
                              int may_borrow, kn_weight *out, kn_error *err) {
    if (dt != KN_DT_F32 && dt != KN_DT_BF16 && dt != KN_DT_F16)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "cuda backend: weights of dtype %s are not supported", kn_dtype_name(dt));
    size_t bytes = (size_t)rows * (size_t)cols * kn_dtype_size(dt);
    void *p = cu_alloc(be, bytes);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "cuda backend: out of device memory for a %zu-byte weight", bytes);
    if (cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(p);
        return kn_fail(err, KN_ERR_BACKEND, "cuda backend: weight upload failed");
    }
    out->dtype = dt, out->rows = rows, out->cols = cols, out->data = p, out->owned = 1;
    return KN_OK;
}

/* ---- kernels --------------------------------------------------------- */

__global__ void k_embed(const void *t, int dt, int64_t rows, int64_t d, const int32_t *ids, float *out) {
    int i = blockIdx.x;
    int64_t row = ids[i];
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        out[i * d + j] = (row >= 0 && row < rows) ? load_w(t, row * d + j, dt) : 0.0f;
}

__device__ float block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t += sh[i];
    return t;
}

__device__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t = fmaxf(t, sh[i]);
    return t;
}

__global__ void k_rms_norm(const float *x, int64_t xs, float *out, int64_t os, int groups, int dim, const float *w,
                           float eps) {
    __shared__ float sh[32];
    int r = blockIdx.x / groups, g = blockIdx.x % groups;
    const float *xi = x + r * xs + (int64_t)g * dim;
    float *oi = out + r * os + (int64_t)g * dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xi[j] * xi[j];
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = w[j] * (xi[j] * inv);
}

/* Decode-shaped matmul: one warp per output column n, up to 8 x rows read
 * through L1 (x is tiny and shared by every warp). Weights stream with 16-byte
 * loads (8 bf16/f16 or 4 f32 per lane per step), x with float4 loads, when
 * rows are 16-byte aligned (K % 8 == 0, aligned bases), else one element per
 * lane. */
#define GEMV_MAX_M 8
template <int DT>
__device__ __forceinline__ void load8w(const void *w, int64_t i, float *f) {
    uint4 u = *(const uint4 *)((const char *)w + i * (DT == KN_DT_F32 ? 4 : 2));
    if (DT == KN_DT_F32) {
        f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
        return;
    }
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
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

template <int DT>
__global__ void k_gemv(const float *x, int M, const void *w, int64_t N, int64_t K, const float *bias, float *out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (n >= N) return;
    float acc[GEMV_MAX_M];
    for (int m = 0; m < GEMV_MAX_M; m++) acc[m] = 0.0f;
    const int per = DT == KN_DT_F32 ? 4 : 8; /* elements per 16-byte load */
    const int64_t row = n * K;
    int64_t k = 0;
    if (K % 8 == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0) {
#pragma unroll 4 /* several 16-byte loads in flight per lane */
        for (k = (int64_t)lane * per; k + per <= K; k += 32 * per) {
            float f[8];
            load8w<DT>(w, row + k, f);
            for (int m = 0; m < M; m++) { /* x in 16-byte loads too: 1 load per 4 weights, not 4 */
                const float4 *xm = (const float4 *)(x + (int64_t)m * K + k);
                float4 a = __ldg(xm);
                float s = f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w;
                if (per == 8) {
                    float4 b = __ldg(xm + 1);
                    s += f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
                }
                acc[m] += s;
            }
        }
    } else {
        for (k = lane; k < K; k += 32) {
            float wv = load_w(w, row + k, DT);
            for (int m = 0; m < M; m++) acc[m] += __ldg(x + (int64_t)m * K + k) * wv;
        }
    }
    for (int m = 0; m < M; m++) {
        float v = acc[m];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (lane == 0) out[(int64_t)m * N + n] = v + (bias ? bias[n] : 0.0f);
    }
}

/* 64x64 tile of out, 16x16 threads, 4x4 per thread, k-step 16 */
#define TM 64
#define TN 64
#define TK 16
__global__ void k_gemm(const float *x, int M, const void *w, int dt, int64_t N, int64_t K, const float *bias,
                       float *out) {
    __shared__ float As[TK][TM + 1], Bs[TK][TN + 1];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int64_t m0 = (int64_t)blockIdx.y * TM, n0 = (int64_t)blockIdx.x * TN;
    float acc[4][4] = {{0}};
    for (int64_t k0 = 0; k0 < K; k0 += TK) {
        for (int i = threadIdx.x; i < TM * TK; i += 256) {
            int mm = i / TK, kk = i % TK;
            int64_t gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? x[gm * K + gk] : 0.0f;
            int64_t gn = n0 + mm;
            Bs[kk][mm] = (gn < N && gk < K) ? load_w(w, gn * K + gk, dt) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < TK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty * 4 + i], b[i] = Bs[kk][tx * 4 + i];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int64_t gm = m0 + ty * 4 + i, gn = n0 + tx * 4 + j;
            if (gm < M && gn < N) out[gm * N + gn] = acc[i][j] + (bias ? bias[gn] : 0.0f);
        }
}

__global__ void k_rope(float *x, int64_t stride, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                       int rot_dim, float scale) {
    int t = blockIdx.x, half = rot_dim / 2;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float f = (float)pos[t] * inv_freq[i];
        float c = cosf(f) * scale, s = sinf(f) * scale;
        float *v = x + t * stride + (int64_t)h * head_dim;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

__global__ void k_kv_write(float *kc, float *vc, const float *k, const float *v, int64_t stride, int64_t w,
                           const int32_t *slots) {
    int t = blockIdx.x;
    for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
        kc[(int64_t)slots[t] * w + j] = k[t * stride + j];
        vc[(int64_t)slots[t] * w + j] = v[t * stride + j];
    }
}

/* one block per (token, head); dynamic smem: scores[max positions] */
__global__ void k_attention(kn_attention_args a, kn_kv_layer kv) {
    extern __shared__ float sc[];
    __shared__ float sh[32];
    int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    int hd = kv.head_dim, bs = kv.block_size, kvh = h / (a.n_heads / kv.n_kv_heads);
    int64_t slot_w = (int64_t)kv.n_kv_heads * hd;
    const float *q = a.q + t * a.q_stride + (int64_t)h * hd;
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    int p = a.pos[t], lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0, n = p - lo + 1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int pj = lo + j;
        const float *kr = kv.k + ((int64_t)bt[pj / bs] * bs + pj % bs) * slot_w + (int64_t)kvh * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * kr[d];
        s *= a.scale;
        if (a.softcap > 0.0f) s = tanhf(s / a.softcap) * a.softcap;
        sc[j] = s;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += (sc[j] = expf(sc[j] - mx));
    __syncthreads();
    sum = block_sum(sum, sh);
    float inv = 1.0f / sum;
    float *o = a.out + ((int64_t)t * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) {
            int pj = lo + j;
            acc += sc[j] * kv.v[((int64_t)bt[pj / bs] * bs + pj % bs) * slot_w + (int64_t)kvh * hd + d];
        }
        o[d] = acc * inv;
    }
}

__global__ void k_swiglu(const float *gu, int64_t n_total, int dim, float *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_total) return;
    int64_t r = i / dim, j = i % dim;
    float g = gu[r * 2 * dim + j], u = gu[r * 2 * dim + dim + j];
    out[i] = g / (1.0f + expf(-g)) * u;
}

__global__ void k_layer_norm(const float *x, int64_t xs, float *out, int64_t os, int dim, const float *w,
                             const float *b, float eps) {
    __shared__ float sh[32];
    const float *xi = x + blockIdx.x * xs;
    float *oi = out + blockIdx.x * os;
    float s = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) s += xi[j];
    float mean = block_sum(s, sh) / dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (xi[j] - mean) * (xi[j] - mean);
    float inv = rsqrtf(block_sum(ss, sh) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        oi[j] = (w ? w[j] : 1.0f) * ((xi[j] - mean) * inv) + (b ? b[j] : 0.0f);
}

__device__ __forceinline__ float gelu_f(float v, int approx) {
    if (approx == KN_GELU_TANH) return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
}

__global__ void k_gelu(const float *x, int64_t n, float *out, int approx) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_f(x[i], approx);
}

__global__ void k_geglu(const float *gu, int64_t n_total, int dim, float *out, int approx) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_total) return;
    int64_t r = i / dim, j = i % dim;
    out[i] = gelu_f(gu[r * 2 * dim + j], approx) * gu[r * 2 * dim + dim + j];
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void k_gather(const float *x, int64_t dim, const int32_t *rows, float *out) {
    int i = blockIdx.x;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[i * dim + j] = x[(int64_t)rows[i] * dim + j];
}

__global__ void k_softmax(float *x, int dim) {
    __shared__ float sh[32];
    float *v = x + (int64_t)blockIdx.x * dim;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) mx = fmaxf(mx, v[j]);
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) s += expf(v[j] - mx);
    s = block_sum(s, sh);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) v[j] = expf(v[j] - mx) / s;
}

__global__ void k_read(const float4 *p, size_t n, float *sink) {
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 12345.678f) *sink = acc; /* keeps the loads */
}

/* ---- op wrappers ----------------------------------------------------- */

#define S (cu(be)->stream)

static void cu_embed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out) {
    k_embed<<<n, 256, 0, S>>>(t->data, t->dtype, t->rows, t->cols, ids, out);
}
static void cu_rms_norm(kn_backend *be, const float *x, int64_t xs, float *out, int64_t os, int rows, int groups,
                        int dim, const float *w, float eps) {
    k_rms_norm<<<rows * groups, dim >= 256 ? 256 : 64, 0, S>>>(x, xs, out, os, groups, dim, w, eps);
}
static void cu_matmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out) {
    if (M <= GEMV_MAX_M) {
        const int warps = 8;
        unsigned blocks = (unsigned)((w->rows + warps - 1) / warps);
        if (w->dtype == KN_DT_BF16)
            k_gemv<KN_DT_BF16><<<blocks, warps * 32, 0, S>>>(x, M, w->data, w->rows, w->cols, bias, out);
        else if (w->dtype == KN_DT_F16)
            k_gemv<KN_DT_F16><<<blocks, warps * 32, 0, S>>>(x, M, w->data, w->rows, w->cols, bias, out);
        else
            k_gemv<KN_DT_F32><<<blocks, warps * 32, 0, S>>>(x, M, w->data, w->rows, w->cols, bias, out);
    } else {
        dim3 grid((unsigned)((w->rows + TN - 1) / TN), (unsigned)((M + TM - 1) / TM));
        k_gemm<<<grid, 256, 0, S>>>(x, M, w->data, w->dtype, w->rows, w->cols, bias, out);
    }
}
static void cu_rope(kn_backend *be, float *x, int64_t stride, int n_tokens, int n_heads, int head_dim,
                    const int32_t *pos, const kn_rope_table *r) {
    k_rope<<<n_tokens, 128, 0, S>>>(x, stride, n_heads, head_dim, pos, r->inv_freq, r->rot_dim, r->attn_scale);
}
static void cu_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                        int n_tokens, const int32_t *slots) {
    k_kv_write<<<n_tokens, 256, 0, S>>>(kv->k, kv->v, k, v, stride, (int64_t)kv->n_kv_heads * kv->head_dim, slots);
}
/* The score row lives in shared memory; 48 KiB by default, opted in up to
 * the device limit at creation. Longer contexts need the split-K kernel. */
#define KN_CUDA_MAX_ATTN_POSITIONS (56 * 1024)
static void cu_attention(kn_backend *be, const kn_attention_args *a) {
    /* positions attended are bounded by the max position; the caller passes
     * pos on the device, so size for the longest context this backend allows */
    size_t smem = KN_CUDA_MAX_ATTN_POSITIONS * sizeof(float);
    k_attention<<<a->n_tokens * a->n_heads, 128, smem, S>>>(*a, *a->kv);
}
static void cu_swiglu(kn_backend *be, const float *gu, int rows, int dim, float *out) {
    int64_t n = (int64_t)rows * dim;
    k_swiglu<<<(unsigned)((n + 255) / 256), 256, 0, S>>>(gu, n, dim, out);
}
static void cu_layer_norm(kn_backend *be, const float *x, int64_t xs, float *out, int64_t os, int rows, int dim,
                          const float *w, const float *b, float eps) {
    k_layer_norm<<<rows, dim >= 256 ? 256 : 64, 0, S>>>(x, xs, out, os, dim, w, b, eps);
}
static void cu_gelu(kn_backend *be, const float *x, int64_t n, float *out, int approx) {
    k_gelu<<<(unsigned)((n + 255) / 256), 256, 0, S>>>(x, n, out, approx);
}
static void cu_geglu(kn_backend *be, const float *gu, int rows, int dim, float *out, int approx) {
    int64_t n = (int64_t)rows * dim;
    k_geglu<<<(unsigned)((n + 255) / 256), 256, 0, S>>>(gu, n, dim, out, approx);
}
static void cu_add(kn_backend *be, float *y, const float *x, int64_t n) {
    k_add<<<(unsigned)((n + 255) / 256), 256, 0, S>>>(y, x, n);
}
static void cu_gather(kn_backend *be, const float *x, int64_t dim, const int32_t *rows, int n, float *out) {
    k_gather<<<n, 256, 0, S>>>(x, dim, rows, out);
}
static void cu_softmax(kn_backend *be, float *x, int rows, int dim) { k_softmax<<<rows, 256, 0, S>>>(x, dim); }

static double cu_read_bandwidth(kn_backend *be) {
    size_t bytes = (size_t)2 << 30;
    void *p = cu_alloc(be, bytes), *sink = cu_alloc(be, 64);
    if (!p || !sink) return 0.0;
    cudaMemsetAsync(p, 0, bytes, S);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(e0, S);
        k_read<<<132 * 8, 512, 0, S>>>((const float4 *)p, bytes / 16, (float *)sink);
        cudaEventRecord(e1, S);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) best = ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cu_free(be, p), cu_free(be, sink);
    return bytes / (best * 1e-3);
}

static const kn_backend_vtbl cuda_vtbl = {
    "cuda", cu_destroy, cu_alloc, cu_free, cu_upload, cu_download, cu_sync, cu_weight_load,
    cu_embed, cu_rms_norm, cu_matmul, cu_rope, cu_kv_write, cu_attention, cu_swiglu, cu_layer_norm, cu_gelu, cu_geglu, cu_add, cu_gather, cu_softmax,
    cu_read_bandwidth,
    kn_cuda_softcap, kn_cuda_scale, kn_cuda_sigmoid_gate_add, kn_cuda_moe_route, kn_cuda_moe_ffn, /* cuda_ops_models.cu */
    kn_cuda_mul_rows,
};

extern "C" kn_code kn_cuda_backend_create(int n_threads, kn_backend **out, kn_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return kn_fail(err, KN_ERR_BACKEND, "cuda backend: no usable GPU (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof *c);
    if (!c) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    c->base.vt = &cuda_vtbl;
    c->base.n_threads = n_threads;
    c->base.max_positions = KN_CUDA_MAX_ATTN_POSITIONS;
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        free(c);
        return kn_fail(err, KN_ERR_BACKEND, "cuda backend: cannot create a stream");
    }
    cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         KN_CUDA_MAX_ATTN_POSITIONS * (int)sizeof(float));
    *out = &c->base;
    return KN_OK;
}

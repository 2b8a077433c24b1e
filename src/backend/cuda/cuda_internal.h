/* cuda_internal.h — what CUDA op files share with cuda_backend.cu: the
 * backend's stream, error reporting, and the weight-element loader. Op
 * families live in their own cuda_ops_*.cu files; cuda_backend.cu's vtable
 * points at their host wrappers. */
#ifndef KN_CUDA_INTERNAL_H
#define KN_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
}

#define KN_CUDA_MAX_GRAPHS 64

/* Slots of kn_cuda_scratch. */
enum {
    KN_CUDA_SCRATCH_ATTENTION = 0, /* split-K decode partials */
    KN_CUDA_SCRATCH_SPLIT_COUNT,   /* split-K decode: blocks done per head group (kept zero between launches) */
    KN_CUDA_SCRATCH_GEMM_X,
    KN_CUDA_SCRATCH_ATTN_GEMM,
    KN_CUDA_SCRATCH_GEMM_OUT,
    KN_CUDA_SCRATCH_MLP_ACT,       /* kn_cuda_mlp_swiglu_add: the activation in the down projection's dtype */
    KN_CUDA_SCRATCH_KV_CONVERT,    /* kv_convert: staging rows widened to f32, a chunk at a time */
    KN_CUDA_SCRATCH_ARGMAX,        /* split argmax: per-block (value, index) partials */
    KN_CUDA_SCRATCH_ARGMAX_COUNT,  /* split argmax: blocks done per row (kept zero between launches) */
    KN_CUDA_SCRATCH_COUNT
};

/* The CUDA backend's state (one device, one stream). */
typedef struct {
    kn_backend base;
    cudaStream_t stream;
    int device, sm_count;
    /* pinned staging for uploads: small host->device copies are enqueued
     * asynchronously from here; the offset rewinds at every synchronization,
     * when no copy from it can still be pending */
    char *staging;
    size_t staging_bytes, staging_used;
    void *scratch[KN_CUDA_SCRATCH_COUNT];
    size_t scratch_bytes[KN_CUDA_SCRATCH_COUNT];
    void *blas, *blas_workspace; /* cublasHandle_t, lazily created */
    int blas_failed;
    struct kn_cuda_lt *lt; /* cuBLASLt handle + autotuned algorithms (cuda_gemm.cu) */
    int lt_failed;
    /* recorded forwards, by batch-shape key (see backend.h graph_*) */
    struct {
        uint64_t key;
        cudaGraphExec_t exec; /* NULL: seen once, not recorded yet */
    } graphs[KN_CUDA_MAX_GRAPHS];
    int n_graphs, graphs_disabled, capturing;
    int pdl;      /* programmatic dependent launch in use (sm_90+, KILN_NO_PDL unset) */
    int clusters; /* thread-block clusters available (sm_90+) */
    /* the first device failure not yet taken (backend.h take_error) */
    cudaError_t dev_err;
    const char *dev_err_what;
} kn_cuda_backend;

/* The stream every op of this backend is enqueued on. */
cudaStream_t kn_cuda_stream(kn_backend *be);

/* Number of streaming multiprocessors of the backend's device. */
int kn_cuda_sm_count(kn_backend *be);

/* Backend-owned device scratch, one buffer per slot (enum above the backend
 * struct), grown on demand (never while a graph is being captured: the first,
 * eager run of every batch shape sizes it). A grown buffer starts zeroed. NULL
 * when the device is out of memory. */
void *kn_cuda_scratch(kn_backend *be, int slot, size_t bytes);

/* Op families implemented in their own files. */
void kn_cuda_attention(kn_backend *be, const kn_attention_args *a);
/* Tokens [t0, t0 + len) of a — one sequence, consecutive positions — through
 * the fused tensor-core prefill kernel (cuda_flash_prefill.cu). 0 when the
 * shape/dtype is not covered (nothing enqueued). */
int kn_cuda_flash_prefill(kn_backend *be, const kn_attention_args *a, int t0, int len);
/* KV row formats (cuda_kv.cu): quantize-on-write for the compressed ones,
 * split-K flash decode for every format (tokens attended one by one), and the
 * prefill chunk gather into [n_kv][ctx][hd] of elem (KN_DT_F32/BF16/F16). */
void kn_cuda_kv_write(kn_backend *be, const kn_kv_layer *kv, const float *k, const float *v, int64_t stride,
                      int n_tokens, const int32_t *slots);
/* RoPE of the n_q query heads and the key heads after them in qk, then the
 * cache write of the keys and values, in one launch: formats a warp encodes
 * (q8a, rotated: tq*, tqv*), full rotary, head dim 64/128/256; 0 = declined */
int kn_cuda_rope_kv_write(kn_backend *be, float *qk, const float *v, int64_t stride, int n_tokens, int n_q,
                          const int32_t *pos, const kn_rope_table *r, const kn_kv_layer *kv, const int32_t *slots);
void kn_cuda_flash_decode(kn_backend *be, const kn_attention_args *a);
/* rope_kv_write + attention in the tensor-core decode kernel (cuda_kv.cu) */
int kn_cuda_rope_kv_attention(kn_backend *be, const kn_rope_kv_args *r, const kn_attention_args *a);
void kn_cuda_kv_gather(kn_backend *be, const kn_kv_layer *kv, const int32_t *bt, int k0, int ctx, void *kc, void *vc,
                       int elem);
/* out[M,N] = x[M,K] . W^T (+ bias) through cuBLAS (tensor cores for
 * bf16/f16 weights; x is rounded to the weight dtype; f32 weights use exact
 * f32 GEMM); accumulate adds to out. Returns 0 when cuBLAS is unavailable so the caller falls back. */
int kn_cuda_gemm_cublas(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                        int accumulate);
void kn_cuda_gemm_destroy(kn_backend *be);
/* GEMM-shaped fused_matmul (backend.h): RMSNorm and the rounding of x to the
 * weight's 16-bit dtype in one kernel, the GEMM, then the SwiGLU epilogue.
 * 0 (nothing enqueued) for f32 / quantized weights. */
int kn_cuda_gemm_fused(kn_backend *be, const float *x, int M, const float *norm_w, float eps, const kn_weight *w,
                       const float *bias, float *out, int epi);
/* backend.h mlp_swiglu_add for M > KN_CUDA_GEMV_MAX_M and 16-bit weights
 * (0, nothing enqueued, otherwise) */
int kn_cuda_mlp_swiglu_add(kn_backend *be, const float *xn, int M, const float *norm_w, float eps,
                           const kn_weight *gu, const float *gu_bias, const kn_weight *down, const float *down_bias,
                           float *x);
/* The backend's cuBLAS handle (a cublasHandle_t), created on first use; NULL if unavailable. */
void *kn_cuda_blas(kn_backend *be);

/* MLX affine-quantized weights (cuda_quant.cu): load kept packed, matmul
 * (accumulate adds to out), embedding lookup. */
kn_code kn_cuda_weight_load_quant(kn_backend *be, const kn_quant_host *src, kn_weight *out, kn_error *err);
void kn_cuda_qmatmul(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                     int accumulate);
void kn_cuda_qembed(kn_backend *be, const kn_weight *t, const int32_t *ids, int n, float *out);

/* The vtable of KILN_CUDA_PROFILE=1 runs: real ops bracketed by events. */
const kn_backend_vtbl *kn_cuda_profile_vtbl(const kn_backend_vtbl *real);

/* Print a CUDA error (ops are infallible by contract; failures are reported). */
void kn_cuda_check(cudaError_t e, const char *what);
/* kn_cuda_check, and keep the first failure for the backend's take_error:
 * for kernels launched without a fallback and for the synchronizations that
 * report faults of the stream's work (the model's step then fails with it) */
void kn_cuda_note(kn_backend *be, cudaError_t e, const char *what);

/* whisper op block (cuda_ops_whisper.cu) */
extern "C" void kn_cuda_im2col_1d(kn_backend *be, const float *x, int64_t xts, int64_t xcs, int t_in, int c_in,
                                  int k, int stride, int pad, float *out);
extern "C" void kn_cuda_attention_dense(kn_backend *be, const kn_dense_attention_args *a);

/* d (16x8, f32) += a (16x16, row) . b (16x8, col): mma.sync m16n8k16 over
 * bf16 with the PTX ISA's fragment layout (g = lane / 4, t = lane % 4):
 *   a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
 *   b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
 *   d0 (g, 2t)  d1 (g, 2t+1)  d2 (g+8, 2t)  d3 (g+8, 2t+1) */
__device__ __forceinline__ void kn_mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the same over f16 operands (f32 accumulate) */
__device__ __forceinline__ void kn_mma_f16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* one RoPE rotation of the pair (a, b) by (c, s) = (cos, sin) x scale, with
 * explicit roundings: every kernel that rotates gets the same bits */
__device__ __forceinline__ void kn_rope_rotate(float &a, float &b, float c, float s) {
    const float x = __fmaf_rn(a, c, -__fmul_rn(b, s)), y = __fmaf_rn(b, c, __fmul_rn(a, s));
    a = x, b = y;
}

/* 2^x (ex2.approx: the unit __expf uses after its multiply by log2 e) */
__device__ __forceinline__ float kn_exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Online softmax over the two rows (g and g + 8) of an mma C fragment, for
 * the flash kernels: mxa / mxb are this lane's maxima of a tile's raw scores
 * (the 4 lanes of a quad share rows, reduced here; with COLS the two columns
 * 2t, 2t + 1 instead, shared by the 8 lanes of equal t), ma / mb the running raw
 * maxima, updated. Probabilities are 2^(s sl2 - z) with z the returned za /
 * zb (0 for a row with every key masked so far, so nothing is NaN); the
 * sums and outputs so far are to be multiplied by aa / ab (exactly 1 when a
 * row's max stays). */
struct kn_softmax_step {
    float za, zb, aa, ab;
};
template <bool COLS = false>
__device__ __forceinline__ kn_softmax_step kn_softmax_rows(float mxa, float mxb, float &ma, float &mb, float sl2) {
#pragma unroll
    for (int x = COLS ? 4 : 1; x < (COLS ? 32 : 4); x <<= 1) {
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, x));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, x));
    }
    const float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
    kn_softmax_step r;
    r.za = na == -INFINITY ? 0.0f : na * sl2, r.zb = nb == -INFINITY ? 0.0f : nb * sl2;
    r.aa = kn_exp2_approx(ma * sl2 - r.za), r.ab = kn_exp2_approx(mb * sl2 - r.zb);
    ma = na, mb = nb;
    return r;
}

/* rms_norm(x[0, K)) * norm_w into shared memory xw[0, K) by a whole block of
 * NW warps (K % 4 == 0; x, norm_w 16-byte aligned): the prologue of the
 * GEMV and MoE gate/up kernels that fuse the RMSNorm before them. red: NW
 * floats of shared memory. Returns with the block synchronized. */
template <int NW>
__device__ __forceinline__ void kn_block_rms_norm_smem(const float *__restrict__ x, int64_t K,
                                                       const float *__restrict__ norm_w, float eps, float *xw,
                                                       float *red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float ss = 0.0f;
#pragma unroll 4 /* the loads of several iterations in flight: one L2 round trip, not four */
    for (int64_t j = (int64_t)tid * 4; j < K; j += NW * 32 * 4) {
        const float4 v = __ldg((const float4 *)(x + j));
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < NW; i++) tot += red[i];
    __syncthreads(); /* red is free for the next row */
    const float inv = 1.0f / sqrtf(tot / (float)K + eps);
#pragma unroll 4
    for (int64_t j = (int64_t)tid * 4; j < K; j += NW * 32 * 4) {
        const float4 v = __ldg((const float4 *)(x + j)), g = __ldg((const float4 *)(norm_w + j));
        *(float4 *)(xw + j) = make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
    __syncthreads();
}

/* Element i of a weight stored as F32, BF16 or F16, widened to float. */
__device__ __forceinline__ float kn_cuda_load_w(const void *w, int64_t i, int dt) {
    if (dt == KN_DT_F32) return ((const float *)w)[i];
    if (dt == KN_DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    return __half2float(((const __half *)w)[i]);
}


/* ---- programmatic dependent launch (Hopper) ----
 * A kernel started through kn_cuda_launch may begin while the previous kernel
 * of the stream is finishing. It must call kn_pdl_wait() before it reads
 * anything an earlier kernel wrote or writes anything an earlier kernel may
 * still read; before that it may only read immutable data (weights).
 * kn_pdl_trigger() lets the next kernel start early. Both are no-ops before
 * sm_90 and when the kernel was launched the ordinary way. One exception:
 * data written by a kernel that finished before the previous kernel passed
 * its own wait may be read before the wait (past L1) when that previous
 * kernel triggers only after its wait (the MoE down kernels' routing ids). */
__device__ __forceinline__ void kn_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void kn_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 1 unless the environment variable `name` is "0": the kernels' on-by-default
 * switches for A/B runs (read once by each caller, into a static). */
static inline int kn_cuda_env_on(const char *name) {
    const char *e = getenv(name);
    return !(e && strcmp(e, "0") == 0);
}

/* 1 when the backend's device runs thread-block clusters (sm_90+). */
static inline int kn_cuda_has_clusters(kn_backend *be) { return ((kn_cuda_backend *)be)->clusters; }

/* Launch kernel k on the backend's stream, as a programmatic dependent
 * launch where the backend uses them (the kernel must follow the rules
 * above); kn_cuda_launch_cluster with cluster_z > 1 also groups the blocks
 * along z into clusters of that many (cluster_z divides grid.z, at most 8). */
template <typename... KArgs, typename... Args>
static inline cudaError_t kn_cuda_launch_cluster(kn_backend *be, void (*k)(KArgs...), dim3 grid, dim3 block,
                                                 size_t smem, unsigned cluster_z, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem;
    cfg.stream = ((kn_cuda_backend *)be)->stream;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (((kn_cuda_backend *)be)->pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) { /* blocks z .. z + cluster_z - 1 of each (x, y) as one cluster */
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = 1, at[n].val.clusterDim.y = 1, at[n++].val.clusterDim.z = cluster_z;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
}
template <typename... KArgs, typename... Args>
static inline cudaError_t kn_cuda_launch(kn_backend *be, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                         Args... args) {
    return kn_cuda_launch_cluster(be, k, grid, block, smem, 1u, args...);
}

/* kn_cuda_launch for a kernel without a fallback: a launch that fails is
 * kept for the backend's take_error (kn_cuda_note) */
template <typename... KArgs, typename... Args>
static inline void kn_cuda_run(kn_backend *be, const char *what, void (*k)(KArgs...), dim3 grid, dim3 block,
                               size_t smem, Args... args) {
    kn_cuda_note(be, kn_cuda_launch(be, k, grid, block, smem, args...), what);
}

/* A plain <<<>>> launch (kernels launched without the programmatic
 * attribute) is bracketed by these two: kn_cuda_before_launch drops what an
 * earlier call left in the runtime's last error (its caller handled it or
 * fell back; a kernel fault is sticky and comes back at once), so that
 * kn_cuda_launched finds this launch's own failure (a bad configuration, too
 * few resources) and keeps it for take_error as kn_cuda_run keeps its own. */
static inline void kn_cuda_before_launch(void) { (void)cudaGetLastError(); }
static inline void kn_cuda_launched(kn_backend *be, const char *what) { kn_cuda_note(be, cudaGetLastError(), what); }

/* 1 when kernel k may be launched with smem bytes of dynamic shared memory:
 * above the default 48 KiB it opts k in up to max once (allowed: a static of
 * the caller, one per kernel instantiation); 0 when smem exceeds max or the
 * opt-in fails. */
template <typename... KArgs>
static inline int kn_cuda_allow_smem(void (*k)(KArgs...), size_t smem, size_t max, size_t *allowed) {
    if (smem <= *allowed) return 1;
    if (smem > max || cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    *allowed = max;
    return 1;
}

/* Decode-shaped matmul (cuda_gemv.cu) for M <= KN_CUDA_GEMV_MAX_M rows of x:
 * out = epi(rms_norm(x; norm_w, eps) . W^T + bias) (norm_w NULL: no norm;
 * accumulate adds into out; epi as backend.h's fused_matmul). Returns 0,
 * having enqueued nothing, for shapes it does not cover. */
#define KN_CUDA_GEMV_MAX_M 2
int kn_cuda_gemv(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                 int accumulate, const float *norm_w, float eps, int epi);
/* Routed experts token by token (cuda_moe_decode.cu): gate/up with the
 * activation fused, down with the weighted combine fused; bf16/f16 stacks for
 * one token, MLX-quantized stacks for any number. Returns 0, having enqueued
 * nothing, where it does not apply. */
int kn_cuda_moe_decode(kn_backend *be, const kn_moe_args *a);
/* The same for MLX affine 4/8-bit weights (cuda_qgemv.cu): x carried as two
 * int8 terms per group (error <= 1/32512 of the group's max |x|). */
int kn_cuda_qgemv(kn_backend *be, const float *x, int M, const kn_weight *w, const float *bias, float *out,
                  int accumulate, const float *norm_w, float eps, int epi);
/* One token's routed-expert gate/up over an MLX 4/8-bit [n_experts * 2 *
 * inter, dim] stack on the same streaming kernel (cuda_qgemv.cu): A[j *
 * inter + r] = silu(gate . x') * (up . x') of expert idx[j], x' =
 * rms_norm(x) * norm_w when norm_w is set. Returns 0, having enqueued
 * nothing, where the shape does not suit it. */
int kn_cuda_qgemv_moe_gate_up(kn_backend *be, const float *x, const kn_weight *gu, const int32_t *idx, int k,
                              int inter, float *A, const float *norm_w, float eps);
/* The down projection after it, only right after it (it reads idx before
 * its wait on the gate/up kernel): out[d] (+)= sum_j wt[j] (down_e[d] .
 * A[j]) for e = idx[j] over an MLX 4/8-bit [n_experts * dim, inter] stack,
 * each slot's activations scaled by wt[j] before they are carried as int8
 * terms. Returns 0, having enqueued nothing, where the shape does not suit. */
int kn_cuda_qgemv_moe_down(kn_backend *be, const float *A, const kn_weight *dn, const int32_t *idx, const float *wt,
                           int k, int dim, float *out, int accumulate);

#endif

/* cuda_attention.cu — paged grouped-query attention on the GPU (the
 * `attention` op of backend.h), flash-style: an online softmax over the keys,
 * so no score row is materialized and any context length works.
 *
 * One block per (query token, KV head, head group, key split). The GB query
 * heads of a group share their KV head, so every cached key/value row is read
 * once for all of them (GQA). Each warp walks a strided subset of the block's
 * keys: lane l owns head dims l, l+32, ... (coalesced 128-byte row reads), the
 * GB dot products are finished with warp butterflies, and each warp keeps a
 * running max m, sum l and unnormalized output per head. Warps are merged in
 * shared memory. When there are few (token, head) pairs — batch-1 decode — the
 * keys are also split across blocks (split-K flash-decode) and a second kernel
 * merges the splits' (m, l, acc) triples. The split count depends only on the
 * batch shape, never on the context length, so a captured CUDA graph stays
 * valid as sequences grow.
 *
 * Invariants: float32 K/V slots [n_kv_heads * head_dim] per token, block
 * tables of int32, positions attended [max(0, pos - window + 1), pos]. */
#include <float.h>

#include "backend/cuda/cuda_internal.h"

#define ATT_WARPS 4
#define ATT_MAX_SPLITS 32
#define ATT_NEG (-1e30f)

/* Per (token, head, split) partial: m, l, then head_dim accumulators. */
template <int NI, int GB>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_flash_attention(kn_attention_args a, kn_kv_layer kv, int n_groups, int n_splits, float *partial) {
    const int t = blockIdx.x, kvh = blockIdx.y / n_groups, grp = blockIdx.y % n_groups, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = kv.head_dim, bs = kv.block_size;
    const int G = a.n_heads / kv.n_kv_heads, h0 = kvh * G + grp * GB;
    const int64_t slot_w = (int64_t)kv.n_kv_heads * hd;
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    const int p = a.pos[t];
    const int lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0;
    const int n = p - lo + 1, per = (n + n_splits - 1) / n_splits;
    const int j0 = lo + split * per, j1 = min(p + 1, j0 + per);

    float q[GB][NI], acc[GB][NI], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const float *qh = a.q + (int64_t)t * a.q_stride + (int64_t)(h0 + g) * hd;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            q[g][i] = d < hd ? qh[d] * a.scale : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = ATT_NEG, l[g] = 0.0f;
    }
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const int64_t base = ((int64_t)bt[j / bs] * bs + j % bs) * slot_w + (int64_t)kvh * hd;
        float kr[NI], vr[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int d = lane + 32 * i;
            kr[i] = d < hd ? kv.k[base + d] : 0.0f;
            vr[i] = d < hd ? kv.v[base + d] : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++) s += q[g][i] * kr[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            float mn = fmaxf(m[g], s), c = expf(m[g] - mn), e = expf(s - mn);
            l[g] = l[g] * c + e;
#pragma unroll
            for (int i = 0; i < NI; i++) acc[g][i] = acc[g][i] * c + e * vr[i];
            m[g] = mn;
        }
    }
    /* merge the warps: each writes (m, l, acc) per head, warp 0 combines */
    extern __shared__ float sh[]; /* [ATT_WARPS][GB][2 + 32*NI] */
    const int row = 2 + 32 * NI;
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float *r = sh + ((int64_t)warp * GB + g) * row;
        if (lane == 0) r[0] = m[g], r[1] = l[g];
#pragma unroll
        for (int i = 0; i < NI; i++) r[2 + lane + 32 * i] = acc[g][i];
    }
    __syncthreads();
    for (int g = warp; g < GB; g += ATT_WARPS) {
        float M = ATT_NEG;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sh[((int64_t)w * GB + g) * row]);
        float L = 0.0f, o[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) o[i] = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            const float *r = sh + ((int64_t)w * GB + g) * row;
            float c = expf(r[0] - M);
            L += r[1] * c;
#pragma unroll
            for (int i = 0; i < NI; i++) o[i] += r[2 + lane + 32 * i] * c;
        }
        const int h = h0 + g;
        if (n_splits == 1) {
            float *out = a.out + ((int64_t)t * a.n_heads + h) * hd;
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) out[lane + 32 * i] = o[i] * inv;
        } else {
            float *pr = partial + (((int64_t)t * a.n_heads + h) * n_splits + split) * (2 + hd);
            if (lane == 0) pr[0] = M, pr[1] = L;
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (lane + 32 * i < hd) pr[2 + lane + 32 * i] = o[i];
        }
    }
}

/* Merge key splits: one block per (token, head). */
__global__ void k_flash_merge(const float *partial, int n_splits, int hd, int n_heads, float *out) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pr = partial + ((int64_t)t * n_heads + h) * n_splits * (2 + hd);
    float M = ATT_NEG, L = 0.0f;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, pr[s * (2 + hd)]);
    for (int s = 0; s < n_splits; s++) L += pr[s * (2 + hd) + 1] * expf(pr[s * (2 + hd)] - M);
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) o += pr[s * (2 + hd) + 2 + d] * expf(pr[s * (2 + hd)] - M);
        out[((int64_t)t * n_heads + h) * hd + d] = o * inv;
    }
}

template <int NI, int GB>
static void launch(kn_backend *be, const kn_attention_args *a, int n_groups, int n_splits, float *partial) {
    dim3 grid((unsigned)a->n_tokens, (unsigned)(a->kv->n_kv_heads * n_groups), (unsigned)n_splits);
    size_t smem = (size_t)ATT_WARPS * GB * (2 + 32 * NI) * sizeof(float);
    k_flash_attention<NI, GB><<<grid, ATT_WARPS * 32, smem, kn_cuda_stream(be)>>>(*a, *a->kv, n_groups, n_splits,
                                                                                  partial);
}

template <int NI>
static void launch_ni(kn_backend *be, const kn_attention_args *a, int gb, int n_splits, float *partial) {
    int n_groups = a->n_heads / a->kv->n_kv_heads / gb;
    switch (gb) {
    case 8: launch<NI, 8>(be, a, n_groups, n_splits, partial); break;
    case 4: launch<NI, 4>(be, a, n_groups, n_splits, partial); break;
    case 2: launch<NI, 2>(be, a, n_groups, n_splits, partial); break;
    default: launch<NI, 1>(be, a, n_groups, n_splits, partial); break;
    }
}

int kn_cuda_attention_supported(int head_dim) { return head_dim >= 1 && head_dim <= 256; }

void kn_cuda_attention(kn_backend *be, const kn_attention_args *a) {
    const int hd = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
    const int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    /* enough blocks to fill the GPU twice over; split keys when the batch
     * shape alone does not */
    const int blocks = a->n_tokens * a->n_heads / gb, target = 2 * kn_cuda_sm_count(be);
    int n_splits = blocks >= target ? 1 : (target + blocks - 1) / blocks;
    if (n_splits > ATT_MAX_SPLITS) n_splits = ATT_MAX_SPLITS;
    float *partial = NULL;
    if (n_splits > 1) {
        size_t bytes = (size_t)a->n_tokens * a->n_heads * n_splits * (2 + hd) * sizeof(float);
        partial = (float *)kn_cuda_scratch(be, KN_CUDA_SCRATCH_ATTENTION, bytes);
        if (!partial) n_splits = 1;
    }
    const int ni = (hd + 31) / 32;
    if (ni <= 1) launch_ni<1>(be, a, gb, n_splits, partial);
    else if (ni <= 2) launch_ni<2>(be, a, gb, n_splits, partial);
    else if (ni <= 4) launch_ni<4>(be, a, gb, n_splits, partial);
    else launch_ni<8>(be, a, gb, n_splits, partial);
    if (n_splits > 1) {
        dim3 grid((unsigned)a->n_tokens, (unsigned)a->n_heads);
        k_flash_merge<<<grid, hd >= 128 ? 128 : 64, 0, kn_cuda_stream(be)>>>(partial, n_splits, hd, a->n_heads,
                                                                             a->out);
    }
}

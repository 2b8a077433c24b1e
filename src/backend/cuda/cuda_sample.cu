/* cuda_sample.cu — the sample_rows op on the GPU: one token id per logits
 * row under the rule of base/sampling.h, so that only ids cross to the host.
 *
 * One block of 1024 threads per row; the row stays in global memory (L2)
 * and is read a few times:
 *  - edits (penalties, logit bias) are applied in place, one thread per
 *    edit (a row's edits name distinct tokens);
 *  - greedy rows: argmax, lowest index on ties;
 *  - top-k: radix select of the k-th largest v = x / T over order-
 *    preserving 32-bit keys, 8 bits per pass (counts in shared memory);
 *  - top-p: the same radix walk over the top-k survivors with the bins
 *    weighted by w = exp(v - max) in double, finding the key where the
 *    descending cumulative mass reaches top_p * Z; among values tied at
 *    that key the lowest indices are kept (a scan over index-ordered
 *    chunks finds the cut);
 *  - min-p: w >= min_p, a prefix of the same order;
 *  - the draw: each thread sums w over its contiguous chunk of kept tokens,
 *    a block scan orders the chunks, and the thread whose range holds
 *    u * mass walks its chunk.
 * Sums are in double; masses of radix bins use shared-memory atomics, so
 * their order (and the last bit) may vary between runs: a token differs from
 * the host sampler's only where a sum lands within rounding of a boundary. */
#include <float.h>
#include <limits.h>

#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "base/sampling.h"
}

#define SR_THREADS 1024
#define SR_WARPS (SR_THREADS / 32)

typedef struct {
    unsigned cnt[256];
    unsigned long long mass[256]; /* fixed point: w * 2^40 */
    double red_d[SR_WARPS];
    float red_f[SR_WARPS];
    int red_i[SR_WARPS];
    /* values broadcast from one thread to the block */
    uint32_t prefix;
    int need_i;
    double need_d, above;
    int found;
    int32_t token;
} sr_shared;

/* order-preserving key of a float (v != NaN; -0 is folded into +0 by the caller) */
__device__ __forceinline__ uint32_t sr_key(float v) {
    uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float sr_unkey(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float sr_v(const float *x, int i, float T) {
    float v = x[i] / T;
    return v != v ? -INFINITY : v + 0.0f;
}

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* block-wide sum, identical on every thread; red has SR_WARPS entries */
template <typename T> __device__ T sr_block_sum(T v, T *red) {
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from the previous call */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    T s = 0;
    for (int w = 0; w < SR_WARPS; w++) s += red[w];
    return s;
}

/* exclusive prefix over threads in thread order; *total gets the block sum */
template <typename T> __device__ T sr_block_scan(T v, T *red, T *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        T u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    T before = 0, all = 0;
    for (int w = 0; w < SR_WARPS; w++) {
        if (w < warp) before += red[w];
        all += red[w];
    }
    *total = all;
    return before + inc - v;
}

__device__ float sr_block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < SR_WARPS; w++) m = fmaxf(m, red[w]);
    return m;
}

/* first index of the largest value, NaN never winning (the first non-NaN
 * index when every value is -inf) */
__device__ int32_t sr_argmax(const float *x, int V, sr_shared *sh) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = threadIdx.x; j < V; j += SR_THREADS) {
        float v = x[j];
        if (v > bv || (bi == INT_MAX && v == v)) bv = v, bi = j;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh->red_f[threadIdx.x >> 5] = bv, sh->red_i[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SR_WARPS; w++)
            if (sh->red_f[w] > bv || (sh->red_f[w] == bv && sh->red_i[w] < bi)) bv = sh->red_f[w], bi = sh->red_i[w];
        sh->token = bi == INT_MAX ? 0 : bi;
    }
    __syncthreads();
    return sh->token;
}

/* w of token i if it is kept (key above tau, or at tau up to index cut, and
 * w >= min_w), else 0 */
__device__ __forceinline__ double sr_kept_w(const float *x, int i, float T, float mx, uint32_t tau, int cut,
                                            double min_w) {
    const float v = sr_v(x, i, T);
    const uint32_t key = sr_key(v);
    if (key < tau || (key == tau && i > cut)) return 0.0;
    const double w = exp((double)v - (double)mx);
    return w < min_w ? 0.0 : w;
}

/* Bin counts (and masses) of one radix pass, aggregated over the lanes of a
 * warp that fall in the same bin before one shared-memory atomic per bin:
 * with 1,024 threads most elements land in a few top-digit bins, and plain
 * per-element atomics would serialize on them. Masses are fixed point
 * (w * 2^40, w <= 1), so the sums are exact and order-independent; each
 * element's rounding is 2^-41, far below a boundary that matters. Every lane
 * of the warp must call it (bin 256: no element). */
__device__ __forceinline__ void sr_hist_add(sr_shared *sh, unsigned bin, double w, bool with_mass) {
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin >= 256) return;
    const bool leader = (threadIdx.x & 31) == (unsigned)(__ffs(peers) - 1);
    if (with_mass) {
        const unsigned long long f = (unsigned long long)llrint(w * 0x1.0p40);
        const unsigned hi = __reduce_add_sync(peers, (unsigned)(f >> 20)), lo = __reduce_add_sync(peers, (unsigned)(f & 0xfffffu));
        if (leader) atomicAdd(&sh->mass[bin], ((unsigned long long)hi << 20) + lo);
    }
    if (leader) atomicAdd(&sh->cnt[bin], (unsigned)__popc(peers));
}

/* Warp 0 picks the radix bin where the descending cumulative count (or
 * mass) reaches need, given what lies above the bins; sets sh->prefix's
 * digit at shift and sh->need_i (counts) or sh->above (mass) for the next
 * pass. by_mass: bins are sh->mass, a bin counting only with cnt > 0. */
__device__ __forceinline__ double sr_bin(const sr_shared *sh, int b, int by_mass) {
    return by_mass ? (sh->cnt[b] ? (double)sh->mass[b] * 0x1.0p-40 : 0.0) : (double)sh->cnt[b];
}

__device__ void sr_pick(sr_shared *sh, int shift, int by_mass) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    double own = 0.0; /* lane l owns bins 255 - 8l down to 248 - 8l */
    for (int j = 0; j < 8; j++) own += sr_bin(sh, 255 - 8 * lane - j, by_mass);
    double inc = own;
    for (int o = 1; o < 32; o <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    const double base = by_mass ? sh->above : 0.0, need = by_mass ? sh->need_d : (double)sh->need_i;
    const unsigned hit = __ballot_sync(0xffffffffu, base + inc >= need);
    const int l = hit ? __ffs(hit) - 1 : -1;
    const double before = __shfl_sync(0xffffffffu, inc, l > 0 ? l - 1 : 0);
    if (lane) return;
    int bin = -1;
    double acc = 0.0;
    if (l >= 0) {
        acc = base + (l > 0 ? before : 0.0);
        for (int j = 0; j < 8; j++) {
            const int b = 255 - 8 * l - j;
            if (!sh->cnt[b]) continue;
            const double c = sr_bin(sh, b, by_mass);
            if (acc + c >= need) {
                bin = b;
                break;
            }
            acc += c;
        }
    }
    if (bin < 0) { /* the sum never reached need (mass rounding): the lowest nonempty bin */
        for (int b = 255; b >= 0; b--)
            if (sh->cnt[b]) bin = b;
        acc = base;
        for (int b = 255; b > bin; b--) acc += sr_bin(sh, b, by_mass);
    }
    if (by_mass) sh->above = acc;
    else sh->need_i -= (int)(acc - base);
    sh->prefix |= (uint32_t)bin << shift;
}

__global__ void __launch_bounds__(SR_THREADS) k_sample_rows(float *x_all, int V, const kn_sample_params *params,
                                                            const kn_logit_edit *edits, int32_t *out) {
    __shared__ sr_shared sh;
    const int tid = threadIdx.x;
    float *x = x_all + (int64_t)blockIdx.x * V;
    const kn_sample_params p = params[blockIdx.x];
    for (int k = tid; k < p.n_edits; k += SR_THREADS) { /* 1. edits (distinct tokens) */
        const kn_logit_edit e = edits[p.edit0 + k];
        if (e.token < 0 || e.token >= V) continue;
        float v = x[e.token];
        if (e.rep != 1.0f) v = v > 0.0f ? v / e.rep : v * e.rep;
        v -= e.sub;
        v += e.add;
        x[e.token] = v;
    }
    __syncthreads();
    if (p.temperature <= 0.0f || p.top_k == 1) { /* 2. greedy */
        const int32_t t = sr_argmax(x, V, &sh);
        if (tid == 0) out[blockIdx.x] = t;
        return;
    }
    const float T = p.temperature;
    float mx = -INFINITY;
    for (int i = tid; i < V; i += SR_THREADS) mx = fmaxf(mx, sr_v(x, i, T));
    mx = sr_block_max(mx, sh.red_f);
    if (mx == -INFINITY) { /* nothing has mass */
        const int32_t t = sr_argmax(x, V, &sh);
        if (tid == 0) out[blockIdx.x] = t;
        return;
    }
    /* 4. top-k: the k-th largest key */
    uint32_t tau_k = 0; /* keys >= tau_k survive */
    if (p.top_k > 0 && p.top_k < V) {
        if (tid == 0) sh.prefix = 0, sh.need_i = p.top_k;
        uint32_t mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SR_THREADS) sh.cnt[b] = 0;
            __syncthreads();
            const uint32_t prefix = sh.prefix;
            for (int i0 = 0; i0 < V; i0 += SR_THREADS) { /* uniform trip count: whole warps call sr_hist_add */
                const int i = i0 + tid;
                const uint32_t key = i < V ? sr_key(sr_v(x, i, T)) : 0u;
                sr_hist_add(&sh, i < V && (key & mask) == prefix ? (key >> shift) & 255u : 256u, 0.0, false);
            }
            __syncthreads();
            sr_pick(&sh, shift, 0);
            __syncthreads();
            mask |= 255u << shift;
        }
        tau_k = sh.prefix;
    }
    /* 5. Z over the survivors */
    double z = 0.0;
    for (int i = tid; i < V; i += SR_THREADS) {
        const float v = sr_v(x, i, T);
        if (sr_key(v) >= tau_k) z += exp((double)v - (double)mx);
    }
    z = sr_block_sum(z, sh.red_d);
    /* top-p: the key where the descending mass reaches top_p * Z, and the tie cut */
    uint32_t tau = tau_k;
    int cut = INT_MAX; /* ties at tau are kept up to this index */
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        if (tid == 0) sh.prefix = 0, sh.above = 0.0, sh.need_d = (double)p.top_p * z;
        uint32_t mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SR_THREADS) sh.cnt[b] = 0, sh.mass[b] = 0ull;
            __syncthreads();
            const uint32_t prefix = sh.prefix;
            for (int i0 = 0; i0 < V; i0 += SR_THREADS) {
                const int i = i0 + tid;
                const float v = i < V ? sr_v(x, i, T) : -INFINITY;
                const uint32_t key = sr_key(v);
                const bool in = i < V && key >= tau_k && (key & mask) == prefix;
                sr_hist_add(&sh, in ? (key >> shift) & 255u : 256u, in ? exp((double)v - (double)mx) : 0.0, true);
            }
            __syncthreads();
            sr_pick(&sh, shift, 1);
            __syncthreads();
            mask |= 255u << shift;
        }
        tau = sh.prefix;
        const unsigned n_ties = sh.cnt[tau & 255u];
        const double m_t = exp((double)sr_unkey(tau) - (double)mx);
        double j = ceil((sh.need_d - sh.above) / m_t);
        const unsigned keep_ties = j < 1.0 ? 1u : j >= (double)n_ties ? n_ties : (unsigned)j;
        if (keep_ties < n_ties) { /* the keep_ties-th tie in index order */
            const int C = (V + SR_THREADS - 1) / SR_THREADS, i0 = tid * C, i1 = min(V, i0 + C);
            int own = 0;
            for (int i = i0; i < i1; i++) own += sr_key(sr_v(x, i, T)) == tau;
            int total;
            const int before = sr_block_scan(own, sh.red_i, &total);
            if (before < (int)keep_ties && (int)keep_ties <= before + own) {
                int c = before;
                for (int i = i0; i < i1; i++)
                    if (sr_key(sr_v(x, i, T)) == tau && ++c == (int)keep_ties) sh.token = i;
            }
            __syncthreads();
            cut = sh.token;
        }
    }
    const double min_w = p.min_p > 0.0f ? (double)fminf(p.min_p, 1.0f) : 0.0;
    /* 7. the draw, walking kept tokens in index order */
    const int C = (V + SR_THREADS - 1) / SR_THREADS, i0 = tid * C, i1 = min(V, i0 + C);
    double own = 0.0;
    int last = -1;
    for (int i = i0; i < i1; i++) {
        const double w = sr_kept_w(x, i, T, mx, tau, cut, min_w);
        if (w > 0.0) own += w, last = i;
    }
    double mass;
    const double before = sr_block_scan(own, sh.red_d, &mass);
    const double target = p.u * mass;
    if (tid == 0) sh.found = 0;
    __syncthreads();
    if (own > 0.0 && before <= target && target < before + own) {
        double acc = before;
        for (int i = i0; i < i1; i++) {
            const double w = sr_kept_w(x, i, T, mx, tau, cut, min_w);
            if (w <= 0.0) continue;
            acc += w;
            if (target < acc || i == last) {
                sh.token = i, sh.found = 1;
                break;
            }
        }
    }
    __syncthreads();
    if (!sh.found) { /* rounding put the target past the end: the last kept token */
        int l = last;
        for (int o = 16; o > 0; o >>= 1) l = max(l, __shfl_xor_sync(0xffffffffu, l, o));
        if ((tid & 31) == 0) sh.red_i[tid >> 5] = l;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < SR_WARPS; w++) l = max(l, sh.red_i[w]);
            sh.token = l < 0 ? 0 : l;
        }
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = sh.token;
}

extern "C" void kn_cuda_sample_rows(kn_backend *be, float *x, int rows, int V, const kn_sample_params *params,
                                    const kn_logit_edit *edits, int32_t *out) {
    if (rows <= 0) return;
    kn_cuda_before_launch();
    k_sample_rows<<<rows, SR_THREADS, 0, kn_cuda_stream(be)>>>(x, V, params, edits, out);
    kn_cuda_launched(be, "sample_rows");
}

/* cuda_flash_decode_tc.cu — split-K flash decode on tensor cores, for bf16
 * K/V rows and bf16 compute (a bf16 model's cache), head dims 64 and 128 and
 * up to 16 query heads per KV head.
 *
 * One block of 4 warps per (query token, KV head, key split), as in
 * k_flash_kv; the G query heads sharing the KV head are the 16 rows of the
 * mma's A operand (rows >= G are zero), so every cached row is read once for
 * all of them. A warp takes 16-key tiles of the split in turn:
 *   S [16 heads x 16 keys] = Q K^T    mma m16n8k16, 2 key n-tiles x HD/16 steps
 *   P = 2^(S scale log2e - m)          rounded to bf16, kept in registers
 *   O [16 heads x HD] += P V           mma, HD/8 dim n-tiles, 16 keys deep
 * with a running max m and sum l per head (l by an mma of P against ones).
 * Fragments come straight from the paged cache, no shared memory: the dot
 * product does not care in which order dims are summed, so lane (g, t) loads
 * one contiguous quarter of key row g (of each 8-key n-tile) and the Q
 * fragments are built in the same dim order; for P V, lane (g, t) loads dims
 * [g NT, g NT + NT) of key rows 2t, 2t+1, 2t+8, 2t+9 and pairs rows with one
 * byte permute, so output column c of n-tile nt is dim c NT + nt.
 *
 * The warps meet in shared memory; with one split the block writes the
 * normalized output, otherwise its (m, l, acc) partial, and the split's last
 * block merges them (merge_splits, as the CUDA-core kernel).
 *
 * Numerics: q and the probabilities are rounded to bf16 (as the flash prefill
 * kernel rounds them), products and sums are f32. f32 compute (f32 models)
 * and every other format keep the CUDA-core kernel (exact f32 dot products). */
#include "backend/cuda/cuda_flash_decode.cuh"

#define TC_WARPS 4
#define TC_KEYS 16 /* keys per warp step */

__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* 16-byte pieces of a row, read through the non-coherent path (the cache is
 * written by earlier kernels only) */
__device__ __forceinline__ uint4 tc_ld16(const uint8_t *p) { return __ldg((const uint4 *)p); }

template <int HD, bool CAP>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_flash_tc(kn_attention_args a, kn_kv_layer kv, int n_splits, float *partial, int *counters) {
    constexpr int KT = HD / 16;   /* QK steps (16 dims each) */
    constexpr int NT = HD / 8;    /* PV n-tiles (8 dims each) */
    constexpr int QD = HD / 4;    /* dims of a key row per lane in QK */
    constexpr int KW = QD / 2;    /* ... as 32-bit words */
    constexpr int VW = NT / 2;    /* words of a value row per lane in PV */
    kn_pdl_trigger();
    kn_pdl_wait();
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int bs = kv.block_size, nkv = kv.n_kv_heads, G = a.n_heads / nkv, h0 = kvh * G;
    const uint8_t *K = (const uint8_t *)kv.k, *V = (const uint8_t *)kv.v;
    const int32_t *bt = a.block_tables + (int64_t)a.seq[t] * a.max_blocks;
    const int p = a.pos[t];
    const int lo = (a.window > 0 && p - a.window + 1 > 0) ? p - a.window + 1 : 0;
    const int n = p - lo + 1, per = (n + n_splits - 1) / n_splits;
    const int j0 = lo + split * per, j1 = min(p + 1, j0 + per);
    const float sl2 = a.scale * 1.4426950408889634f;
    const float cap_in = CAP ? a.scale / a.softcap : 0.0f, cap_out = CAP ? a.softcap / a.scale : 0.0f;

    /* Q fragments in the QK dim order: step kk, k index 2tq + e <-> dim
     * tq QD + 4 kk + e, k index 2tq + 8 + e <-> dim tq QD + 4 kk + 2 + e */
    uint32_t qa[KT][4];
    {
        const bool ra = g < G, rb = g + 8 < G;
        const float *qra = a.q + (int64_t)t * a.q_stride + (int64_t)(h0 + g) * HD + tq * QD;
        const float *qrb = qra + (int64_t)8 * HD;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) { /* scalar loads: q rows need not be 16-byte aligned */
            const float *pa = qra + 4 * kk, *pb = qrb + 4 * kk;
            qa[kk][0] = ra ? tc_pack(pa[0], pa[1]) : 0u, qa[kk][2] = ra ? tc_pack(pa[2], pa[3]) : 0u;
            qa[kk][1] = rb ? tc_pack(pb[0], pb[1]) : 0u, qa[kk][3] = rb ? tc_pack(pb[2], pb[3]) : 0u;
        }
    }
    float o[NT][4], ol[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY; /* raw-score running max of heads g, g + 8 */
    const int64_t rowb = (int64_t)HD * 2;
    auto row_of = [&](int j) -> const int64_t { return ((int64_t)bt[j / bs] * bs + j % bs) * nkv + kvh; };

    for (int jt = j0 + warp * TC_KEYS; jt < j1; jt += TC_WARPS * TC_KEYS) {
        /* loads: key rows jt + g, jt + 8 + g (this lane's quarter) and value
         * rows jt + 2tq, +1, +8, +9 (dims g NT ..); past j1: row jt, masked */
        uint32_t kw[2][KW], vw[4][VW];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int j = jt + nt * 8 + g < j1 ? jt + nt * 8 + g : jt;
            const uint8_t *r = K + row_of(j) * rowb + tq * QD * 2;
#pragma unroll
            for (int i = 0; i < KW / 4; i++) {
                const uint4 u = tc_ld16(r + 16 * i);
                kw[nt][4 * i] = u.x, kw[nt][4 * i + 1] = u.y, kw[nt][4 * i + 2] = u.z, kw[nt][4 * i + 3] = u.w;
            }
        }
#pragma unroll
        for (int rr = 0; rr < 4; rr++) {
            const int jr = jt + 2 * tq + (rr & 1) + (rr >> 1) * 8;
            const int j = jr < j1 ? jr : jt;
            const uint8_t *r = V + row_of(j) * rowb + g * NT * 2;
#pragma unroll
            for (int i = 0; i < VW / 4; i++) {
                const uint4 u = tc_ld16(r + 16 * i);
                vw[rr][4 * i] = u.x, vw[rr][4 * i + 1] = u.y, vw[rr][4 * i + 2] = u.z, vw[rr][4 * i + 3] = u.w;
            }
        }
        /* S = Q K^T: s[nt] covers keys jt + nt*8 + 2tq, +1 (heads g, g + 8) */
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) kn_mma_bf16(s[nt], qa[kk], kw[nt][2 * kk], kw[nt][2 * kk + 1]);
        }
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[nt][e];
                if (CAP) v = cap_out * tanhf(v * cap_in); /* v scale = softcap tanh(s scale / softcap) */
                if (jt + nt * 8 + 2 * tq + (e & 1) >= j1) v = -INFINITY;
                s[nt][e] = v;
                if (e < 2) mxa = fmaxf(mxa, v);
                else mxb = fmaxf(mxb, v);
            }
        const kn_softmax_step sm = kn_softmax_rows(mxa, mxb, ma, mb, sl2);
        const float za = sm.za, zb = sm.zb, aa = sm.aa, ab = sm.ab;
        uint32_t pf[4]; /* P as the A fragment: keys 2tq.. (n-tile 0) and 2tq + 8.. (n-tile 1) */
        pf[0] = tc_pack(kn_exp2_approx(fmaf(s[0][0], sl2, -za)), kn_exp2_approx(fmaf(s[0][1], sl2, -za)));
        pf[1] = tc_pack(kn_exp2_approx(fmaf(s[0][2], sl2, -zb)), kn_exp2_approx(fmaf(s[0][3], sl2, -zb)));
        pf[2] = tc_pack(kn_exp2_approx(fmaf(s[1][0], sl2, -za)), kn_exp2_approx(fmaf(s[1][1], sl2, -za)));
        pf[3] = tc_pack(kn_exp2_approx(fmaf(s[1][2], sl2, -zb)), kn_exp2_approx(fmaf(s[1][3], sl2, -zb)));
        if (__any_sync(0xffffffffu, aa != 1.0f || ab != 1.0f)) {
            ol[0] *= aa, ol[1] *= aa, ol[2] *= ab, ol[3] *= ab;
#pragma unroll
            for (int i = 0; i < NT; i++) o[i][0] *= aa, o[i][1] *= aa, o[i][2] *= ab, o[i][3] *= ab;
        }
        kn_mma_bf16(ol, pf, 0x3f803f80u, 0x3f803f80u); /* row sums of the rounded P */
        /* O += P V: n-tile nt's column g is dim g NT + nt; b0 pairs value
         * rows 2tq, 2tq + 1, b1 rows 2tq + 8, 2tq + 9 */
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const uint32_t b0e = __byte_perm(vw[0][i], vw[1][i], 0x5410), b0o = __byte_perm(vw[0][i], vw[1][i], 0x7632);
            const uint32_t b1e = __byte_perm(vw[2][i], vw[3][i], 0x5410), b1o = __byte_perm(vw[2][i], vw[3][i], 0x7632);
            kn_mma_bf16(o[2 * i], pf, b0e, b1e);
            kn_mma_bf16(o[2 * i + 1], pf, b0o, b1o);
        }
    }

    /* the warps meet: per warp m (natural units), l and acc of its 16 rows
     * in natural dim order */
    extern __shared__ float tsh[]; /* [TC_WARPS][16][2 + HD] */
    const int rw = 2 + HD;
    {
        float *ra = tsh + ((int64_t)warp * 16 + g) * rw, *rb = ra + 8 * rw;
        if (tq == 0) {
            ra[0] = ma == -INFINITY ? KVF_NEG : ma * a.scale, ra[1] = ol[0];
            rb[0] = mb == -INFINITY ? KVF_NEG : mb * a.scale, rb[1] = ol[2];
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
            ra[2 + (2 * tq) * NT + i] = o[i][0], ra[2 + (2 * tq + 1) * NT + i] = o[i][1];
            rb[2 + (2 * tq) * NT + i] = o[i][2], rb[2 + (2 * tq + 1) * NT + i] = o[i][3];
        }
    }
    __syncthreads();
    for (int r = warp; r < G; r += TC_WARPS) { /* a warp per head */
        float M = KVF_NEG;
        for (int w = 0; w < TC_WARPS; w++) M = fmaxf(M, tsh[((int64_t)w * 16 + r) * rw]);
        float L = 0.0f, c[TC_WARPS];
        for (int w = 0; w < TC_WARPS; w++) {
            const float *rr = tsh + ((int64_t)w * 16 + r) * rw;
            c[w] = expf(rr[0] - M);
            L += rr[1] * c[w];
        }
        const int h = h0 + r;
        if (n_splits == 1) {
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            float *dst = a.out + ((int64_t)t * a.n_heads + h) * HD;
            for (int d = lane; d < HD; d += 32) {
                float v = 0.0f;
                for (int w = 0; w < TC_WARPS; w++) v += tsh[((int64_t)w * 16 + r) * rw + 2 + d] * c[w];
                dst[d] = v * inv;
            }
        } else {
            float *pr = partial + (((int64_t)t * a.n_heads + h) * n_splits + split) * rw;
            if (lane == 0) pr[0] = M, pr[1] = L;
            for (int d = lane; d < HD; d += 32) {
                float v = 0.0f;
                for (int w = 0; w < TC_WARPS; w++) v += tsh[((int64_t)w * 16 + r) * rw + 2 + d] * c[w];
                pr[2 + d] = v;
            }
        }
    }
    if (n_splits > 1 && split_is_last(counters + (int64_t)t * gridDim.y + blockIdx.y, n_splits))
        for (int r = warp; r < G; r += TC_WARPS) {
            const int64_t th = (int64_t)t * a.n_heads + h0 + r;
            merge_splits<HD / 32>(partial + th * n_splits * rw, n_splits, HD, a.out + th * HD, lane, 0, kv.signs);
        }
}

template <int HD> static void launch_tc(kn_backend *be, const kn_attention_args *a, flash_plan f) {
    const dim3 grid((unsigned)a->n_tokens, (unsigned)a->kv->n_kv_heads, (unsigned)f.n_splits);
    const size_t smem = (size_t)TC_WARPS * 16 * (2 + HD) * sizeof(float); /* 33 KB at head_dim 128 */
    kn_cuda_launch(be, a->softcap > 0.0f ? k_flash_tc<HD, true> : k_flash_tc<HD, false>, grid, dim3(TC_WARPS * 32),
                   smem, *a, *a->kv, f.n_splits, f.partial, f.counters);
}

int kn_flash_decode_tc(kn_backend *be, const kn_attention_args *a, flash_plan f) {
    switch (a->kv->head_dim) {
    case 64: launch_tc<64>(be, a, f); return 1;
    case 128: launch_tc<128>(be, a, f); return 1;
    default: return 0;
    }
}

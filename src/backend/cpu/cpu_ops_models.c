/* cpu_ops_models.c — CPU ops needed by model families beyond Llama:
 * logit soft-capping (gemma2), scaling (granite, gemma), the sigmoid-gated
 * shared expert add (qwen2_moe), and mixture-of-experts routing + experts.
 *
 * MoE experts run grouped by expert: (token, slot) pairs are sorted by
 * expert, each expert's rows gathered and pushed through its slices of the
 * stacked weights with the gemv kernel (each weight row streamed once for all
 * of that expert's tokens). Unselected experts are never read, so batch-1
 * decode streams only the k active experts. Each token sums its experts in
 * ascending id, transformers' order. Inputs live in host memory (this is the
 * CPU backend), so the routing indices are read directly. */
#include "backend/cpu/cpu_ops_models.h"

#include "backend/cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

void kn_cpu_softcap(kn_backend *be, float *x, int64_t n, float cap) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
}

void kn_cpu_scale(kn_backend *be, float *x, int64_t n, float s) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void kn_cpu_sigmoid_gate_add(kn_backend *be, float *y, const float *x, const float *gate, int rows, int dim) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        float g = 1.0f / (1.0f + expf(-gate[r]));
        for (int j = 0; j < dim; j++) y[(int64_t)r * dim + j] += g * x[(int64_t)r * dim + j];
    }
}

void kn_cpu_mul_rows(kn_backend *be, float *y, const float *x, int64_t x_stride, int rows, int dim) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++) y[(int64_t)r * dim + j] *= x[r * x_stride + j];
}

void kn_cpu_moe_route(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                      const float *expert_scale, int32_t *idx, float *w) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (int64_t)r * n_experts;
        int32_t *ir = idx + (int64_t)r * k;
        float *wr = w + (int64_t)r * k;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < n_experts; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < n_experts; e++) sum += expf(l[e] - mx);
        /* top-k by insertion: strictly greater moves up, so ties keep the lower id first */
        int n = 0;
        for (int e = 0; e < n_experts; e++) {
            float p = expf(l[e] - mx) / sum;
            if (n == k && !(p > wr[k - 1])) continue;
            int i = n < k ? n++ : k - 1;
            while (i > 0 && p > wr[i - 1]) {
                wr[i] = wr[i - 1], ir[i] = ir[i - 1];
                i--;
            }
            wr[i] = p, ir[i] = e;
        }
        if (norm_topk) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += wr[j];
            for (int j = 0; j < k; j++) wr[j] /= s;
        }
        if (expert_scale)
            for (int j = 0; j < k; j++) wr[j] *= expert_scale[ir[j]];
    }
}

static inline float act_f(float g, int act) {
    if (act == KN_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    if (act == KN_ACT_GELU_ERF) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
    return g / (1.0f + expf(-g));
}

/* Rows [row0, row0 + rows) of a stacked weight, as a weight of its own. */
#define MOE_CHUNK 64 /* weight rows per work item */

/* out[t] = the token's expert outputs Y (rows in sorted-pair order) weighted
 * and summed in ascending expert order (transformers' index_add order); with
 * accumulate the sum is formed in sum_rows [n, D] (free scratch), then added */
static void moe_combine(const kn_moe_args *a, const int32_t *rs, const int32_t *pair_of, const float *Y,
                        float *sum_rows, int nt) {
    const int n = a->n_tokens, D = a->dim, k = a->k;
#pragma omp parallel for num_threads(nt) schedule(static) if (n > 1)
    for (int t = 0; t < n; t++) {
        float *o = (a->accumulate ? sum_rows : a->out) + (size_t)t * D;
        memset(o, 0, (size_t)D * sizeof(float));
        int last = -1;
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int j = 0; j < k; j++) {
                int e = a->idx[t * k + j];
                if (e > last && (best < 0 || e < a->idx[t * k + best])) best = j;
            }
            if (best < 0) break;
            int e = a->idx[t * k + best], p = t * k + best;
            last = e;
            int q = rs[e];
            while (pair_of[q] != p) q++; /* within expert e's run */
            const float *y = Y + (size_t)q * D;
            const float wt = a->w[p];
            for (int d = 0; d < D; d++) o[d] += y[d] * wt;
        }
        if (a->accumulate)
            for (int d = 0; d < D; d++) a->out[(size_t)t * D + d] += o[d];
    }
}

/* Grouped by expert: the (token, slot) pairs are sorted by expert into
 * contiguous runs, each run's x rows gathered, and every phase is one
 * parallel loop over (expert run, chunk of weight rows) items, so the number
 * of thread barriers per layer does not grow with the number of experts. */
void kn_cpu_moe_ffn(kn_backend *be, const kn_moe_args *a) {
    const kn_cpu_kernels *kr = kn_cpu_kernels_select();
    const int n = a->n_tokens, D = a->dim, I = a->inter, k = a->k, E = a->n_experts, P = n * k;
    const float *x = a->x;
    if (a->logits) kn_cpu_moe_route(be, a->logits, n, E, k, a->norm_topk, a->expert_scale, a->idx, a->w);
    if (a->norm_w) { /* the layer's RMSNorm, by the backend's own op */
        float *xn = kn_moe_scratch_xn(a);
        be->vt->rms_norm(be, a->x, D, xn, D, n, 1, D, a->norm_w, a->eps);
        x = xn;
    }
    float *X = a->scratch, *G = X + (size_t)P * D, *A = G + (size_t)P * 2 * I, *Y = A + (size_t)P * I;
    int32_t *pair_of = (int32_t *)(Y + (size_t)P * D); /* sorted position -> pair t*k+j */
    int32_t rs[KN_MOE_MAX_EXPERTS + 1];                 /* expert e's run: [rs[e], rs[e+1]) */
    /* counting sort of pairs by expert (stable: tokens ascending within a run) */
    for (int e = 0; e <= E; e++) rs[e] = 0;
    for (int p = 0; p < P; p++) rs[a->idx[p] + 1]++;
    for (int e = 0; e < E; e++) rs[e + 1] += rs[e];
    int32_t fill_pos[KN_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) fill_pos[e] = rs[e];
    for (int p = 0; p < P; p++) pair_of[fill_pos[a->idx[p]]++] = p;
    /* work items: (expert with tokens, chunk) */
    int32_t active[KN_MOE_MAX_EXPERTS];
    int n_active = 0;
    for (int e = 0; e < E; e++)
        if (rs[e + 1] > rs[e]) active[n_active++] = e;
    const int nt = be->n_threads;
    if (a->gate_up->bits || a->down->bits) { /* MLX-quantized experts: each active expert's rows through matmul */
        for (int q = 0; q < P; q++)
            memcpy(X + (size_t)q * D, x + (size_t)(pair_of[q] / k) * D, (size_t)D * sizeof(float));
        for (int i = 0; i < n_active; i++) {
            const int e = active[i], r0 = rs[e], m = rs[e + 1] - r0;
            const kn_weight gu = kn_weight_rows(a->gate_up, (int64_t)e * 2 * I, 2 * (int64_t)I);
            const kn_weight dn = kn_weight_rows(a->down, (int64_t)e * D, D);
            be->vt->matmul(be, X + (size_t)r0 * D, m, &gu, NULL, G + (size_t)r0 * 2 * I);
            for (int q = r0; q < r0 + m; q++) {
                const float *g = G + (size_t)q * 2 * I;
                for (int j = 0; j < I; j++) A[(size_t)q * I + j] = act_f(g[j], a->act) * g[I + j];
            }
            be->vt->matmul(be, A + (size_t)r0 * I, m, &dn, NULL, Y + (size_t)r0 * D);
        }
        moe_combine(a, rs, pair_of, Y, X, nt);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int q = 0; q < P; q++)
            memcpy(X + (size_t)q * D, x + (size_t)(pair_of[q] / k) * D, (size_t)D * sizeof(float));
        const int c1 = (2 * I + MOE_CHUNK - 1) / MOE_CHUNK;
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_active * c1; it++) {
            int e = active[it / c1], c = it % c1, r0 = rs[e], m = rs[e + 1] - r0;
            int64_t n0 = (int64_t)c * MOE_CHUNK, n1 = n0 + MOE_CHUNK < 2 * I ? n0 + MOE_CHUNK : 2 * I;
            kn_weight gu = kn_weight_rows(a->gate_up, (int64_t)e * 2 * I, 2 * (int64_t)I);
            kr->gemv(X + (size_t)r0 * D, m, &gu, NULL, G + (size_t)r0 * 2 * I, n0, n1);
        }
#pragma omp for schedule(static)
        for (int q = 0; q < P; q++) {
            const float *g = G + (size_t)q * 2 * I;
            for (int i = 0; i < I; i++) A[(size_t)q * I + i] = act_f(g[i], a->act) * g[I + i];
        }
        const int c2 = (D + MOE_CHUNK - 1) / MOE_CHUNK;
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_active * c2; it++) {
            int e = active[it / c2], c = it % c2, r0 = rs[e], m = rs[e + 1] - r0;
            int64_t n0 = (int64_t)c * MOE_CHUNK, n1 = n0 + MOE_CHUNK < D ? n0 + MOE_CHUNK : D;
            kn_weight dn = kn_weight_rows(a->down, (int64_t)e * D, D);
            kr->gemv(A + (size_t)r0 * I, m, &dn, NULL, Y + (size_t)r0 * D, n0, n1);
        }
    }
    moe_combine(a, rs, pair_of, Y, X, nt);
}

/* ---- gemma3n ---- */

void kn_cpu_stream_mix(kn_backend *be, const float *src, int n_src, const float *base, float *out, int n_out,
                       int64_t stream_stride, const float *w, float w_add, int rows, int dim) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if ((int64_t)rows * dim * n_out * n_src >= 65536)
    for (int t = 0; t < rows; t++)
        for (int c = 0; c < n_out; c++) {
            float coef[16];
            for (int a = 0; a < n_src && a < 16; a++)
                coef[a] = (w ? w[((int64_t)t * n_out + c) * n_src + a] : 0.0f) + w_add;
            float *o = out + c * stream_stride + (int64_t)t * dim;
            const float *bs = base ? base + c * stream_stride + (int64_t)t * dim : NULL;
            for (int j = 0; j < dim; j++) {
                float acc = 0.0f;
                for (int a = 0; a < n_src && a < 16; a++) acc += coef[a] * src[a * stream_stride + (int64_t)t * dim + j];
                o[j] = bs ? acc + bs[j] : acc;
            }
        }
}

void kn_cpu_rms_match(kn_backend *be, float *x, const float *ref, int rows, int dim, float floor) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if ((int64_t)rows * dim >= 65536)
    for (int r = 0; r < rows; r++) {
        float *xr = x + (int64_t)r * dim;
        const float *rr = ref + (int64_t)r * dim;
        double sx = 0, sr = 0;
        for (int j = 0; j < dim; j++) sx += (double)xr[j] * xr[j], sr += (double)rr[j] * rr[j];
        float target = (float)sqrt(sr / dim), mx = (float)(sx / dim);
        float mag = sqrtf(mx > floor ? mx : floor);
        for (int j = 0; j < dim; j++) xr[j] = xr[j] * target / mag;
    }
}

void kn_cpu_gaussian_topk(kn_backend *be, float *x, int64_t x_stride, int rows, int dim, float mult) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if ((int64_t)rows * dim >= 65536)
    for (int r = 0; r < rows; r++) {
        float *xr = x + r * x_stride;
        double s = 0, ss = 0;
        for (int j = 0; j < dim; j++) s += xr[j];
        const double mean = s / dim;
        for (int j = 0; j < dim; j++) ss += (xr[j] - mean) * (xr[j] - mean);
        const float cut = (float)mean + (float)sqrt(ss / dim) * mult;
        for (int j = 0; j < dim; j++) {
            float v = xr[j] - cut;
            xr[j] = v > 0.0f ? v : 0.0f;
        }
    }
}

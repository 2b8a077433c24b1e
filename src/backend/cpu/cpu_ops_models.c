/* cpu_ops_models.c — CPU ops needed by model families beyond Llama:
 * logit soft-capping (gemma2), scaling (granite, gemma), the sigmoid-gated
 * shared expert add (qwen2_moe), and mixture-of-experts routing + experts.
 *
 * MoE experts run grouped by expert: for each expert that any token selected
 * (ascending id, which is also transformers' summation order), its tokens'
 * rows are gathered and pushed through that expert's slices of the stacked
 * weights with the backend's own matmul (gemv for a few rows, blocked gemm
 * for many). Unselected experts are never read, so batch-1 decode streams
 * only the k active experts. Inputs live in host memory (this is the CPU
 * backend), so the routing indices are read directly. */
#include "backend/cpu/cpu_ops_models.h"

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

void kn_cpu_moe_route(kn_backend *be, const float *logits, int rows, int n_experts, int k, int norm_topk,
                      int32_t *idx, float *w) {
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
    }
}

static inline float act_f(float g, int act) {
    if (act == KN_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    if (act == KN_ACT_GELU_ERF) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
    return g / (1.0f + expf(-g));
}

/* Rows [row0, row0 + rows) of a stacked weight, as a weight of its own. */
static kn_weight weight_rows(const kn_weight *w, int64_t row0, int64_t rows) {
    kn_weight s = *w;
    s.data = (const uint8_t *)w->data + (size_t)row0 * (size_t)w->cols * kn_dtype_size(w->dtype);
    s.rows = rows;
    s.owned = 0;
    return s;
}

void kn_cpu_moe_ffn(kn_backend *be, const kn_moe_args *a) {
    const int n = a->n_tokens, D = a->dim, I = a->inter, k = a->k;
    float *X = a->scratch, *G = X + (size_t)n * D, *A = G + (size_t)n * 2 * I, *Y = A + (size_t)n * I;
    float *wt = Y + (size_t)n * D;
    int32_t *tok = (int32_t *)(wt + (size_t)n * k);
    memset(a->out, 0, (size_t)n * D * sizeof(float));
    for (int e = 0; e < a->n_experts; e++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (a->idx[(int64_t)t * k + j] == e) {
                    tok[m] = t, wt[m] = a->w[(int64_t)t * k + j], m++;
                    break; /* an expert is selected at most once per token */
                }
        if (!m) continue;
        for (int r = 0; r < m; r++) memcpy(X + (size_t)r * D, a->x + (size_t)tok[r] * D, (size_t)D * sizeof(float));
        kn_weight gu = weight_rows(a->gate_up, (int64_t)e * 2 * I, 2 * (int64_t)I);
        kn_weight dn = weight_rows(a->down, (int64_t)e * D, D);
        be->vt->matmul(be, X, m, &gu, NULL, G);
        for (int r = 0; r < m; r++) {
            const float *g = G + (size_t)r * 2 * I;
            for (int i = 0; i < I; i++) A[(size_t)r * I + i] = act_f(g[i], a->act) * g[I + i];
        }
        be->vt->matmul(be, A, m, &dn, NULL, Y);
        for (int r = 0; r < m; r++) {
            float *o = a->out + (size_t)tok[r] * D;
            const float *y = Y + (size_t)r * D;
            for (int d = 0; d < D; d++) o[d] += y[d] * wt[r];
        }
    }
}

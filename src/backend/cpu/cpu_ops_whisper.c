/* cpu_ops_whisper.c — the whisper op block on the CPU (see backend.h):
 * im2col for the conv1d front end and dense (unpaged) attention for the
 * encoder, cross-attention and the decoder's contiguous self-attention cache.
 * Each (query row, head) pair is independent, so attention is one parallel
 * loop over them; every thread keeps one score row of n_kv floats. Softmax
 * subtracts the row max; sums accumulate in float as torch's CPU SDPA does
 * within its blocks. Keys are transposed per head first so that scores
 * vectorise across keys (see kn_cpu_attention_dense). */
#include "backend/cpu/cpu_ops_whisper.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void kn_cpu_im2col_1d(kn_backend *be, const float *x, int64_t x_t_stride, int64_t x_c_stride, int t_in, int c_in,
                      int k, int stride, int pad, float *out) {
    const int t_out = (t_in + 2 * pad - k) / stride + 1;
    const int64_t cols = (int64_t)c_in * k;
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int t = 0; t < t_out; t++) {
        float *o = out + (int64_t)t * cols;
        for (int c = 0; c < c_in; c++)
            for (int j = 0; j < k; j++) {
                int src = t * stride + j - pad;
                o[(int64_t)c * k + j] = src >= 0 && src < t_in ? x[(int64_t)src * x_t_stride + (int64_t)c * x_c_stride] : 0.0f;
            }
    }
}

void kn_cpu_attention_dense(kn_backend *be, const kn_dense_attention_args *a) {
    const int hd = a->head_dim, n_kv = a->n_kv, H = a->n_heads;
    const int64_t pairs = (int64_t)a->n_q * H;
    if (pairs <= 0) return;
    /* K transposed per head, kt[h][d][j], so that a query's scores are a
     * sum over d of (q[d] x a contiguous row of keys): vectorises over j with
     * no horizontal reduction. */
    /* worth it only when many queries share the transpose (encoder, prompt);
     * a decode step reads the keys once, strided */
    float *kt = n_kv > 0 && a->n_q >= 16 ? malloc(sizeof(float) * (size_t)n_kv * (size_t)H * (size_t)hd) : NULL;
    if (kt) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
        for (int j = 0; j < n_kv; j++) {
            const float *kr = a->k + (int64_t)j * a->k_stride;
            for (int c = 0; c < H * hd; c++) kt[(int64_t)c * n_kv + j] = kr[c];
        }
    }
#pragma omp parallel num_threads(be->n_threads)
    {
        float *score = malloc(sizeof(float) * (size_t)(n_kv > 0 ? n_kv : 1));
        float *acc = malloc(sizeof(float) * (size_t)hd);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int i = (int)(p / H), h = (int)(p % H);
            int len = n_kv;
            if (a->causal && a->q_pos0 + i + 1 < len) len = a->q_pos0 + i + 1;
            float *o = a->out + (int64_t)i * a->out_stride + (int64_t)h * hd;
            if (len <= 0 || !score || !acc) {
                memset(o, 0, sizeof(float) * (size_t)hd);
                continue;
            }
            const float *q = a->q + (int64_t)i * a->q_stride + (int64_t)h * hd;
            if (kt) {
                for (int j = 0; j < len; j++) score[j] = 0.0f;
                for (int d = 0; d < hd; d++) {
                    const float qd = q[d];
                    const float *row = kt + ((int64_t)h * hd + d) * n_kv;
#pragma omp simd
                    for (int j = 0; j < len; j++) score[j] += qd * row[j];
                }
            } else { /* few queries (or no memory for the transpose): strided keys */
                for (int j = 0; j < len; j++) {
                    const float *kr = a->k + (int64_t)j * a->k_stride + (int64_t)h * hd;
                    float s = 0;
#pragma omp simd reduction(+ : s)
                    for (int d = 0; d < hd; d++) s += q[d] * kr[d];
                    score[j] = s;
                }
            }
            float mx = -INFINITY;
            for (int j = 0; j < len; j++) {
                score[j] *= a->scale;
                if (score[j] > mx) mx = score[j];
            }
            float sum = 0;
            for (int j = 0; j < len; j++) {
                score[j] = expf(score[j] - mx);
                sum += score[j];
            }
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; d++) acc[d] = 0;
            for (int j = 0; j < len; j++) {
                const float *vr = a->v + (int64_t)j * a->v_stride + (int64_t)h * hd;
                const float wj = score[j] * inv;
#pragma omp simd
                for (int d = 0; d < hd; d++) acc[d] += wj * vr[d];
            }
            memcpy(o, acc, sizeof(float) * (size_t)hd);
        }
        free(score);
        free(acc);
    }
    free(kt);
}

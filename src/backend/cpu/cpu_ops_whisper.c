/* cpu_ops_whisper.c — the whisper op block on the CPU (see backend.h):
 * im2col for the conv1d front end and dense (unpaged) attention for the
 * encoder, cross-attention and the decoder's contiguous self-attention cache.
 * Each (query row, head) pair is independent, so attention is one parallel
 * loop over them; every thread keeps one score row of n_kv floats. Softmax
 * subtracts the row max; sums accumulate in float as torch's CPU SDPA does
 * within its blocks. Keys are transposed per head first so that scores
 * vectorise across keys, and queries are processed in blocks that share
 * every key and value row they load (see kn_cpu_attention_dense). */
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

/* Query blocks of QB rows share every key/value row they load (from L2)
 * QB times from L1; key chunks of JB keep the block's score slices in L1. */
#define QB 32
#define JB 256

void kn_cpu_attention_dense(kn_backend *be, const kn_dense_attention_args *a) {
    const int hd = a->head_dim, n_kv = a->n_kv, H = a->n_heads;
    const int n_qb = (a->n_q + QB - 1) / QB;
    const int64_t tasks = (int64_t)n_qb * H;
    if (tasks <= 0) return;
    /* K transposed per head, kt[h][d][j], so that scores are sums over d of
     * (q[d] x a contiguous run of keys): vectorises over keys with no
     * horizontal reduction. Worth it only when many queries share it
     * (encoder, prompt); a decode step reads the keys once, strided. */
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
        float *sc = malloc(sizeof(float) * (size_t)QB * (size_t)(n_kv > 0 ? n_kv : 1));
        float *acc = malloc(sizeof(float) * (size_t)QB * (size_t)hd);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            const int h = (int)(task / n_qb), qb = (int)(task % n_qb); /* head-major: a thread keeps one head hot */
            const int i0 = qb * QB, nq = a->n_q - i0 < QB ? a->n_q - i0 : QB;
            int len[QB], maxlen = 0;
            for (int q = 0; q < nq; q++) {
                len[q] = n_kv;
                if (a->causal && a->q_pos0 + i0 + q + 1 < len[q]) len[q] = a->q_pos0 + i0 + q + 1;
                if (len[q] < 0) len[q] = 0;
                if (len[q] > maxlen) maxlen = len[q];
            }
            if (!sc || !acc || maxlen == 0) {
                for (int q = 0; q < nq; q++)
                    memset(a->out + (int64_t)(i0 + q) * a->out_stride + (int64_t)h * hd, 0, sizeof(float) * (size_t)hd);
                continue;
            }
            const float *qrow[QB];
            for (int q = 0; q < nq; q++) qrow[q] = a->q + (int64_t)(i0 + q) * a->q_stride + (int64_t)h * hd;
            /* scores */
            if (kt) {
                for (int q = 0; q < nq; q++) memset(sc + (size_t)q * n_kv, 0, sizeof(float) * (size_t)maxlen);
                for (int jc = 0; jc < maxlen; jc += JB) {
                    const int je = jc + JB < maxlen ? jc + JB : maxlen;
                    for (int d = 0; d < hd; d++) {
                        const float *row = kt + ((int64_t)h * hd + d) * n_kv;
                        for (int q = 0; q < nq; q++) {
                            const float qd = qrow[q][d];
                            float *s = sc + (size_t)q * n_kv;
#pragma omp simd
                            for (int j = jc; j < je; j++) s[j] += qd * row[j];
                        }
                    }
                }
            } else {
                for (int q = 0; q < nq; q++)
                    for (int j = 0; j < len[q]; j++) {
                        const float *kr = a->k + (int64_t)j * a->k_stride + (int64_t)h * hd;
                        float s = 0;
#pragma omp simd reduction(+ : s)
                        for (int d = 0; d < hd; d++) s += qrow[q][d] * kr[d];
                        sc[(size_t)q * n_kv + j] = s;
                    }
            }
            /* softmax per query over its own length; weights normalised in place */
            for (int q = 0; q < nq; q++) {
                float *s = sc + (size_t)q * n_kv, mx = -INFINITY, sum = 0;
                for (int j = 0; j < len[q]; j++) {
                    s[j] *= a->scale;
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j < len[q]; j++) {
                    s[j] = expf(s[j] - mx);
                    sum += s[j];
                }
                const float inv = len[q] > 0 ? 1.0f / sum : 0.0f;
                for (int j = 0; j < len[q]; j++) s[j] *= inv;
            }
            /* out = P V, each value row loaded once per block */
            memset(acc, 0, sizeof(float) * (size_t)QB * (size_t)hd);
            for (int j = 0; j < maxlen; j++) {
                const float *vr = a->v + (int64_t)j * a->v_stride + (int64_t)h * hd;
                for (int q = 0; q < nq; q++) {
                    if (j >= len[q]) continue;
                    const float wj = sc[(size_t)q * n_kv + j];
                    float *ac = acc + (size_t)q * hd;
#pragma omp simd
                    for (int d = 0; d < hd; d++) ac[d] += wj * vr[d];
                }
            }
            for (int q = 0; q < nq; q++)
                memcpy(a->out + (int64_t)(i0 + q) * a->out_stride + (int64_t)h * hd, acc + (size_t)q * hd,
                       sizeof(float) * (size_t)hd);
        }
        free(sc);
        free(acc);
    }
    free(kt);
}

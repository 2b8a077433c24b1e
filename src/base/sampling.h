/* sampling.h — the next-token sampling rule every sampler in kiln follows
 * (the host sampler of the engine, the CPU backend's sample_rows op, and the
 * CUDA kernel of cuda_sample.cu), written down once.
 *
 * For one logits row x[V] with parameters p:
 *  1. edits: for each edit e, x[e.token] is divided (positive) or multiplied
 *     (negative) by e.rep when e.rep != 1 (HF repetition penalty), then
 *     e.sub is subtracted (OpenAI presence + frequency penalty) and e.add
 *     added (logit_bias), in that order;
 *  2. greedy when temperature <= 0 or top_k == 1: the first index of the
 *     largest value (NaN never wins);
 *  3. v[i] = x[i] / temperature (NaN becomes -inf);
 *  4. top-k (0 < top_k < V): keep v >= the k-th largest value (ties with it
 *     survive, as transformers);
 *  5. order the survivors by value descending, index ascending; with
 *     w[i] = exp(v[i] - max v) (double) and Z their sum, top-p (0 < top_p <
 *     1) keeps the shortest prefix whose w sum reaches top_p * Z;
 *  6. min-p (> 0) keeps, within that prefix, the tokens with w >= min_p
 *     (the first always stays);
 *  7. walking the kept tokens in ascending index order, the token returned
 *     is the first whose running w sum exceeds u * (sum of kept w), u the
 *     uniform draw in [0, 1) passed in (the last kept token if rounding
 *     leaves none).
 * The kept set and its distribution are exact; implementations may differ
 * only where a sum lands within float rounding of a boundary. */
#ifndef KN_BASE_SAMPLING_H
#define KN_BASE_SAMPLING_H

#include <stdint.h>

/* One sparse change to a logits row (step 1). */
typedef struct {
    int32_t token;
    float rep; /* 1 = none */
    float sub; /* subtracted */
    float add; /* added */
} kn_logit_edit;

/* Parameters of one row. */
typedef struct {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* >= 1 or <= 0: off */
    float min_p;       /* 0 = off */
    double u;          /* uniform draw in [0, 1) */
    int32_t edit0, n_edits; /* this row's edits: edits[edit0 .. edit0 + n_edits) */
} kn_sample_params;

static inline int kn_sample_is_greedy(const kn_sample_params *p) { return p->temperature <= 0.0f || p->top_k == 1; }

/* Step 1 on a host row. */
void kn_logit_edits_apply(float *row, int V, const kn_logit_edit *edits, int n);

/* The first index of the largest value (NaN never wins). */
int32_t kn_sample_argmax(const float *x, int V);

/* Scratch of a host sampler over a vocabulary of V (caller-owned, reusable). */
typedef struct {
    int n;
    void *pairs;   /* [n] (value, index) */
    double *w;     /* [n] */
    int32_t *kept; /* [n] */
} kn_sample_scratch;

int kn_sample_scratch_init(kn_sample_scratch *s, int V); /* 0 on success, -1 out of memory */
void kn_sample_scratch_free(kn_sample_scratch *s);

/* Steps 2-7 on a host row x (already edited); x is not modified. */
int32_t kn_sample_row(const float *x, int V, const kn_sample_params *p, kn_sample_scratch *s);

#endif

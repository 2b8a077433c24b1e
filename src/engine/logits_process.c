/* logits_process.c — see logits_process.h. */
#include "engine/logits_process.h"

#include <math.h>

void kn_logits_logprobs(const float *row, int V, int32_t token, int top_n, kn_token_event *ev) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    ev->logprob = (float)((double)row[token] - lse);
    if (top_n > KN_MAX_TOP_LOGPROBS) top_n = KN_MAX_TOP_LOGPROBS;
    if (top_n > V) top_n = V;
    ev->n_top = 0;
    if (top_n <= 0) return;
    /* insertion into a short sorted list: O(V * top_n), top_n <= 20 */
    int n = 0;
    for (int i = 0; i < V; i++) {
        float v = row[i];
        if (n == top_n && !(v > row[ev->top_ids[n - 1]])) continue;
        int j = n < top_n ? n++ : n - 1;
        while (j > 0 && row[ev->top_ids[j - 1]] < v) {
            ev->top_ids[j] = ev->top_ids[j - 1];
            j--;
        }
        ev->top_ids[j] = i;
    }
    ev->n_top = n;
    for (int k = 0; k < n; k++) ev->top_logprobs[k] = (float)((double)row[ev->top_ids[k]] - lse);
}

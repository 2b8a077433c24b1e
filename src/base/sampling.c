/* sampling.c — the host implementation of the rule in sampling.h. */
#include "base/sampling.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float v;
    int32_t i;
} pair;

void kn_logit_edits_apply(float *row, int V, const kn_logit_edit *edits, int n) {
    for (int k = 0; k < n; k++) {
        const kn_logit_edit *e = &edits[k];
        if (e->token < 0 || e->token >= V) continue;
        float x = row[e->token];
        if (e->rep != 1.0f) x = x > 0.0f ? x / e->rep : x * e->rep;
        x -= e->sub;
        x += e->add;
        row[e->token] = x;
    }
}

int32_t kn_sample_argmax(const float *x, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
    return best;
}

int kn_sample_scratch_init(kn_sample_scratch *s, int V) {
    s->n = V;
    s->pairs = malloc((size_t)V * sizeof(pair));
    s->w = malloc((size_t)V * sizeof *s->w);
    s->kept = malloc((size_t)V * sizeof *s->kept);
    if (s->pairs && s->w && s->kept) return 0;
    kn_sample_scratch_free(s);
    return -1;
}

void kn_sample_scratch_free(kn_sample_scratch *s) {
    free(s->pairs), free(s->w), free(s->kept);
    s->pairs = NULL, s->w = NULL, s->kept = NULL;
}

/* value descending, index ascending */
static int cmp_desc(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void swap_pair(pair *a, pair *b) {
    pair t = *a;
    *a = *b;
    *b = t;
}

/* Partition p[0..n) so the k largest come first; returns the count kept,
 * extended over ties with the k-th value. O(n) average (quickselect). */
static int select_top_k(pair *p, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = p[(lo + hi) / 2].v;
        int i = lo, j = hi;
        while (i <= j) {
            while (p[i].v > pivot) i++;
            while (p[j].v < pivot) j--;
            if (i <= j) swap_pair(&p[i++], &p[j--]);
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    float kth = p[want].v;
    int kept = k;
    for (int i = k; i < n; i++)
        if (p[i].v >= kth) swap_pair(&p[kept++], &p[i]);
    return kept;
}

int32_t kn_sample_row(const float *x, int V, const kn_sample_params *sp, kn_sample_scratch *s) {
    if (kn_sample_is_greedy(sp)) return kn_sample_argmax(x, V);
    pair *p = s->pairs;
    double *w = s->w;
    for (int i = 0; i < V; i++) {
        float v = x[i] / sp->temperature;
        p[i].v = v != v ? -INFINITY : v, p[i].i = i;
    }
    int m = V;
    if (sp->top_k > 0 && sp->top_k < V) m = select_top_k(p, V, sp->top_k);
    qsort(p, (size_t)m, sizeof *p, cmp_desc);
    const double mx = p[0].v;
    if (mx == -INFINITY) return kn_sample_argmax(x, V); /* nothing has mass */
    double z = 0.0;
    for (int i = 0; i < m; i++) z += (w[i] = exp((double)p[i].v - mx));
    int keep = m;
    if (sp->top_p > 0.0f && sp->top_p < 1.0f) {
        const double target = (double)sp->top_p * z;
        double cum = 0.0;
        for (int i = 0; i < m; i++) {
            cum += w[i];
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
    }
    if (sp->min_p > 0.0f) {
        int k2 = 1;
        const double min_w = sp->min_p < 1.0f ? (double)sp->min_p : 1.0;
        while (k2 < keep && w[k2] >= min_w) k2++;
        keep = k2;
    }
    /* the kept tokens in index order, and the draw over them */
    int32_t *kept = s->kept;
    for (int i = 0; i < keep; i++) kept[i] = p[i].i;
    qsort(kept, (size_t)keep, sizeof *kept, cmp_i32);
    double mass = 0.0;
    for (int i = 0; i < keep; i++) {
        const float v = x[kept[i]] / sp->temperature; /* kept: never NaN (NaN has no mass) */
        mass += (w[i] = v != v ? 0.0 : exp((double)v - mx));
    }
    const double target = sp->u * mass;
    double acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += w[i];
        if (target < acc) return kept[i];
    }
    return kept[keep - 1];
}

/* test_sample_rows.c — the sampling rule of base/sampling.h: the host
 * sampler (kn_sample_row) and a backend's sample_rows op against a float64
 * reference written here from the rule's text (full sort, prefix sums).
 *
 *  - random rows at vocabulary sizes 1,000 / 32,000 / 151,936 under greedy,
 *    temperature, top-k, top-p, min-p and their mixes, with tied values,
 *    -inf and NaN entries: every token must equal the reference's, except
 *    where the reference shows the draw (or the top-p cut) within 1e-6 of a
 *    boundary, and such exceptions may not exceed 1% of the draws;
 *  - stratified draws (u = (i + 0.5) / N) over a small row: each token's
 *    count is N times its probability within 2 (the exact distribution);
 *  - edits (repetition penalty, subtraction, addition): the edited row
 *    equals the host's edit, bit for bit.
 * KILN_TEST_BACKEND=cuda runs the op on the GPU. */
#include <string.h>

#include "backend/backend.h"
#include "base/sampling.h"
#include "test_backend.h"
#include "test_util.h"

static kn_backend *be;
static uint64_t seed = 7;

static double urand(void) { return (kn_test_rand(&seed) + 1.0) * 0.5; } /* [0, 1) */

/* ---- the reference ---- */

typedef struct {
    double v;
    int i;
} rpair;

static int rcmp(const void *a, const void *b) {
    const rpair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

/* Returns the reference token; *near = 1 when the draw or the top-p cut lies
 * within 1e-6 (relative) of a boundary, where rounding may decide. */
static int ref_sample(const float *x, int V, const kn_sample_params *p, int *near) {
    *near = 0;
    if (p->temperature <= 0.0f || p->top_k == 1) {
        int best = -1;
        for (int i = 0; i < V; i++)
            if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
        return best < 0 ? 0 : best;
    }
    rpair *o = malloc((size_t)V * sizeof *o);
    for (int i = 0; i < V; i++) {
        float v = x[i] / p->temperature;
        o[i].v = v != v ? -INFINITY : (double)v, o[i].i = i;
    }
    qsort(o, (size_t)V, sizeof *o, rcmp);
    const double mx = o[0].v;
    if (mx == -INFINITY) {
        free(o);
        int first = 0;
        while (first < V && x[first] != x[first]) first++;
        return first < V ? first : 0;
    }
    int m = V;
    if (p->top_k > 0 && p->top_k < V) {
        m = p->top_k;
        while (m < V && o[m].v == o[p->top_k - 1].v) m++;
    }
    double z = 0.0;
    for (int j = 0; j < m; j++) z += exp(o[j].v - mx);
    int keep = m;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0.0, target = (double)p->top_p * z;
        for (int j = 0; j < m; j++) {
            cum += exp(o[j].v - mx);
            if (fabs(cum - target) <= 1e-6 * z) *near = 1;
            if (cum >= target) {
                keep = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        const double t = p->min_p < 1.0f ? p->min_p : 1.0;
        int k2 = 1;
        while (k2 < keep && exp(o[k2].v - mx) >= t) k2++;
        keep = k2;
    }
    /* index order over the kept */
    char *kept = calloc((size_t)V, 1);
    for (int j = 0; j < keep; j++) kept[o[j].i] = 1;
    double mass = 0.0;
    for (int i = 0; i < V; i++)
        if (kept[i] && x[i] == x[i]) mass += exp((double)(x[i] / p->temperature) - mx);
    const double target = p->u * mass;
    double acc = 0.0;
    int tok = -1, last = -1;
    for (int i = 0; i < V; i++) {
        if (!kept[i]) continue;
        last = i;
        if (x[i] == x[i]) acc += exp((double)(x[i] / p->temperature) - mx); /* NaN: no mass */
        if (fabs(acc - target) <= 1e-6 * mass) *near = 1;
        if (tok < 0 && target < acc) tok = i;
    }
    free(kept), free(o);
    return tok >= 0 ? tok : last;
}

/* ---- running the op ---- */

static void run_op(float *x, int rows, int V, const kn_sample_params *p, const kn_logit_edit *edits, int n_edits,
                   int32_t *out, float *x_after) {
    float *dx = kn_be_alloc(be, (size_t)rows * V * 4);
    kn_sample_params *dp = kn_be_alloc(be, (size_t)rows * sizeof *dp);
    kn_logit_edit *de = kn_be_alloc(be, (size_t)(n_edits > 0 ? n_edits : 1) * sizeof *de);
    int32_t *dout = kn_be_alloc(be, (size_t)rows * 4);
    if (!dx || !dp || !de || !dout) {
        fprintf(stderr, "test_sample_rows: backend allocation failed\n");
        exit(1);
    }
    kn_be_upload(be, dx, x, (size_t)rows * V * 4);
    kn_be_upload(be, dp, p, (size_t)rows * sizeof *dp);
    if (n_edits > 0) kn_be_upload(be, de, edits, (size_t)n_edits * sizeof *de);
    for (int r = 0; r < rows; r++) out[r] = -7;
    kn_be_upload(be, dout, out, (size_t)rows * 4);
    be->vt->sample_rows(be, dx, rows, V, dp, de, dout);
    kn_be_sync(be);
    kn_be_download(be, out, dout, (size_t)rows * 4);
    if (x_after) kn_be_download(be, x_after, dx, (size_t)rows * V * 4);
    kn_be_free(be, dx), kn_be_free(be, dp), kn_be_free(be, de), kn_be_free(be, dout);
}

/* kind 0: gaussian-ish logits; 1: values on a 0.25 grid (many ties); 2: with -inf and NaN entries */
static void make_row(float *x, int V, int kind, float scale) {
    for (int i = 0; i < V; i++) {
        float g = (kn_test_rand(&seed) + kn_test_rand(&seed) + kn_test_rand(&seed)) * scale;
        x[i] = kind == 1 ? roundf(g * 4.0f) / 4.0f : g;
    }
    if (kind == 2)
        for (int i = 0; i < V; i += 7) x[i] = (i / 7) % 5 == 0 ? NAN : -INFINITY;
}

static void test_random_rows(int V) {
    const kn_sample_params shapes[] = {
        {0.0f, 0, 1.0f, 0.0f, 0, 0, 0},   {1.0f, 0, 1.0f, 0.0f, 0, 0, 0},    {0.7f, 40, 1.0f, 0.0f, 0, 0, 0},
        {0.8f, 0, 0.9f, 0.0f, 0, 0, 0},   {1.0f, 0, 0.5f, 0.0f, 0, 0, 0},    {1.2f, 0, 1.0f, 0.05f, 0, 0, 0},
        {0.6f, 50, 0.95f, 0.0f, 0, 0, 0}, {1.0f, 1000, 0.8f, 0.02f, 0, 0, 0}, {2.0f, 0, 0.99f, 0.0f, 0, 0, 0},
        {0.9f, 1, 0.5f, 0.0f, 0, 0, 0},   {1.0f, 3, 1.0f, 0.0f, 0, 0, 0},    {1.5f, 0, 0.3f, 0.3f, 0, 0, 0},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof *shapes), rows = 3 * n_shapes;
    float *x = malloc((size_t)rows * V * 4), *xr = malloc((size_t)rows * V * 4);
    kn_sample_params *p = malloc((size_t)rows * sizeof *p);
    int32_t *got = malloc((size_t)rows * 4);
    int mismatches = 0, near_ok = 0, draws = 0;
    for (int rep = 0; rep < 4; rep++) {
        for (int r = 0; r < rows; r++) {
            make_row(x + (size_t)r * V, V, r % 3, rep == 3 ? 4.0f : 2.0f);
            p[r] = shapes[r / 3];
            p[r].u = urand();
        }
        memcpy(xr, x, (size_t)rows * V * 4);
        run_op(x, rows, V, p, NULL, 0, got, NULL);
        for (int r = 0; r < rows; r++) {
            int near;
            const int want = ref_sample(xr + (size_t)r * V, V, &p[r], &near);
            draws++;
            if (got[r] == want) continue;
            mismatches++;
            if (near) near_ok++;
            CHECK(near, "V %d row %d (T %g k %d p %g min_p %g u %.17g, kind %d): got %d want %d", V, r,
                  p[r].temperature, p[r].top_k, p[r].top_p, p[r].min_p, p[r].u, r % 3, got[r], want);
        }
    }
    CHECK(mismatches * 100 <= draws, "V %d: %d of %d draws differ from the reference", V, mismatches, draws);
    printf("  V %6d: %d draws, %d at a rounding boundary differ\n", V, draws, near_ok);
    free(x), free(xr), free(p), free(got);
}

/* stratified uniforms: token counts are N x probability within 2 */
static void test_distribution(void) {
    const int V = 64, N = 4000;
    float *row = malloc((size_t)V * 4), *x = malloc((size_t)N * V * 4);
    make_row(row, V, 0, 0.5f);
    const kn_sample_params base = {0.9f, 20, 0.9f, 0.01f, 0, 0, 0};
    kn_sample_params *p = malloc((size_t)N * sizeof *p);
    for (int i = 0; i < N; i++) {
        memcpy(x + (size_t)i * V, row, (size_t)V * 4);
        p[i] = base, p[i].u = (i + 0.5) / N;
    }
    int32_t *got = malloc((size_t)N * 4);
    run_op(x, N, V, p, NULL, 0, got, NULL);
    int counts[64] = {0}, bad = 0;
    for (int i = 0; i < N; i++)
        if (got[i] >= 0 && got[i] < V) counts[got[i]]++;
        else bad++;
    CHECK(!bad, "distribution: %d ids out of range", bad);
    /* the kept set's probabilities from the reference (u = 0 walks nothing; use its mass directly) */
    rpair o[64];
    for (int i = 0; i < V; i++) o[i].v = row[i] / base.temperature, o[i].i = i;
    qsort(o, V, sizeof *o, rcmp);
    int m = 20;
    while (m < V && o[m].v == o[19].v) m++;
    double z = 0, cum = 0, mass = 0;
    for (int j = 0; j < m; j++) z += exp(o[j].v - o[0].v);
    int keep = m;
    for (int j = 0; j < m; j++) {
        cum += exp(o[j].v - o[0].v);
        if (cum >= 0.9 * z) {
            keep = j + 1;
            break;
        }
    }
    int k2 = 1;
    while (k2 < keep && exp(o[k2].v - o[0].v) >= 0.01) k2++;
    keep = k2;
    double prob[64] = {0};
    for (int j = 0; j < keep; j++) mass += exp(o[j].v - o[0].v);
    for (int j = 0; j < keep; j++) prob[o[j].i] = exp(o[j].v - o[0].v) / mass;
    for (int t = 0; t < V; t++)
        CHECK(fabs(counts[t] - N * prob[t]) <= 2.0, "distribution: token %d drawn %d times, expected %.1f", t,
              counts[t], N * prob[t]);
    CHECK(keep >= 5, "distribution: only %d tokens kept (the row is too peaked to test much)", keep);
    printf("  distribution: %d tokens kept, counts within 2 of N x p\n", keep);
    free(row), free(x), free(p), free(got);
}

static void test_edits(void) {
    const int V = 5000, rows = 3;
    float *x = malloc((size_t)rows * V * 4), *host = malloc((size_t)rows * V * 4), *after = malloc((size_t)rows * V * 4);
    for (int r = 0; r < rows; r++) make_row(x + (size_t)r * V, V, 0, 3.0f);
    memcpy(host, x, (size_t)rows * V * 4);
    kn_logit_edit e[300];
    int n = 0;
    kn_sample_params p[3] = {{0.0f, 0, 1, 0, 0, 0, 0}, {0.0f, 0, 1, 0, 0, 0, 0}, {1.0f, 10, 1, 0, 0.5, 0, 0}};
    for (int r = 0; r < rows; r++) {
        p[r].edit0 = n;
        for (int j = 0; j < 100; j++) { /* distinct tokens 0, 37, 74, ... */
            const int t = (j * 37 + r) % V;
            e[n++] = (kn_logit_edit){t, j % 3 ? 1.3f : 1.0f, j % 4 ? 0.0f : 0.4f + 0.1f * (float)(j % 5),
                                     j % 5 ? 0.0f : -0.75f};
        }
        p[r].n_edits = n - p[r].edit0;
        kn_logit_edits_apply(host + (size_t)r * V, V, e + p[r].edit0, p[r].n_edits);
    }
    int32_t got[3];
    run_op(x, rows, V, p, e, n, got, after);
    int diff = 0;
    for (int64_t i = 0; i < (int64_t)rows * V; i++) diff += memcmp(&after[i], &host[i], 4) != 0;
    CHECK(!diff, "edits: %d logits differ from the host's edit", diff);
    for (int r = 0; r < rows; r++) {
        int near;
        const int want = ref_sample(host + (size_t)r * V, V, &p[r], &near);
        CHECK(got[r] == want || near, "edits row %d: got %d want %d", r, got[r], want);
    }
    free(x), free(host), free(after);
}

/* the host sampler itself against the reference */
static void test_host_rule(void) {
    const int V = 3000;
    float *x = malloc((size_t)V * 4);
    kn_sample_scratch s;
    if (kn_sample_scratch_init(&s, V)) exit(1);
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        make_row(x, V, it % 3, 2.5f);
        kn_sample_params p = {0.5f + (float)(it % 7) * 0.2f, (int[]){0, 5, 40, 1, 0, 300}[it % 6],
                              (float[]){1.0f, 0.9f, 0.5f, 0.97f}[it % 4], (float[]){0.0f, 0.05f, 0.0f}[it % 3],
                              urand(), 0, 0};
        int near;
        const int want = ref_sample(x, V, &p, &near), got = kn_sample_row(x, V, &p, &s);
        if (got != want && !near) bad++;
    }
    CHECK(!bad, "host sampler: %d of 300 draws differ from the reference away from boundaries", bad);
    kn_sample_scratch_free(&s);
    free(x);
}

int main(void) {
    const int brc = kn_test_backend_open("test_sample_rows", 2, &be);
    if (brc) return brc;
    printf("test_sample_rows: backend %s\n", be->vt->name);
    if (!be->vt->sample_rows) {
        fprintf(stderr, "backend %s has no sample_rows\n", be->vt->name);
        return 1;
    }
    test_host_rule();
    test_edits();
    test_distribution();
    test_random_rows(1000);
    test_random_rows(32000);
    test_random_rows(151936);
    kn_backend_destroy(be);
    return kn_test_done("test_sample_rows");
}

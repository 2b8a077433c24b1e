/* test_ops.c — every CPU op against a float64 reference written here
 * independently, at many shapes (odd sizes, GQA ratios 1/4/8, head dims
 * 64/128/256, windows, paged block tables out of order), for every weight
 * dtype. Outputs are poisoned with NaN before each run; a NaN never passes.
 * KILN_TEST_BACKEND=cuda runs the same checks on the GPU (inputs uploaded,
 * results downloaded). The model-family ops (soft-capping, scale, sigmoid
 * gate, MoE routing and experts, gemma3n's stream mixing / magnitude
 * matching / gaussian top-k) are checked the same way at the end, and
 * MLX-quantized weights (bits 2/4/8, groups 32/64/128) after the matmuls.
 * KILN_TEST_SEED=N runs every case on other random draws. */
#include <string.h>

#include "backend/backend.h"
#include "base/host_mem.h"
#include "kv/kv_paged.h"
#include "test_backend.h"
#include "test_util.h"

static kn_backend *be;
static uint64_t seed = 42;

/* Inputs go to backend memory and results come back, so the same checks run
 * on every backend (CPU: plain copies; CUDA: device buffers). */
static void *dev(const void *host, size_t bytes) {
    void *d = kn_be_alloc(be, bytes);
    if (!d) {
        fprintf(stderr, "test_ops: backend allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    if (host) kn_be_upload(be, d, host, bytes);
    return d;
}
/* device bytes to the host; back() then frees the device buffer, peek()
 * leaves it to its owner (a KV pool's cache rows) */
static void peek(void *host, const void *d, size_t bytes) {
    kn_be_sync(be);
    kn_be_download(be, host, d, bytes);
}
static void back(void *host, void *d, size_t bytes) {
    peek(host, d, bytes);
    kn_be_free(be, d);
}

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = kn_test_rand(&seed) * scale;
}
static void poison(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}
/* |got - ref| <= tol * mag + 1e-6, where mag bounds the terms' magnitudes */
static int close_to(double got, double ref, double mag, double tol) {
    return !isnan(got) && fabs(got - ref) <= tol * mag + 1e-6;
}

/* N x K random weight in dtype dt (wraw) and its exact float values (wf) */
static void random_weight(kn_dtype dt, int N, int K, void *wraw, float *wf) {
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        float v = kn_test_rand(&seed);
        if (dt == KN_DT_F32) ((float *)wraw)[i] = v;
        else if (dt == KN_DT_BF16) ((uint16_t *)wraw)[i] = kn_f32_to_bf16(v);
        else ((uint16_t *)wraw)[i] = kn_f32_to_f16(v);
        wf[i] = kn_load_f32(wraw, dt, i);
    }
}

/* v rounded to dtype dt's nearest value (f32: v) */
static double round_to(kn_dtype dt, double v) {
    if (dt == KN_DT_BF16) return kn_bf16_to_f32(kn_f32_to_bf16((float)v));
    if (dt == KN_DT_F16) return kn_f16_to_f32(kn_f32_to_f16((float)v));
    return v;
}

/* Checks row m of a fused_matmul's output (out_n columns) against the float64
 * pre-epilogue sums y[n] with magnitudes mag[n] (SwiGLU: gate n, up n + out_n).
 * round_dt (not F32): the SwiGLU epilogue rounds gate and up to that dtype
 * first; a sum near a rounding boundary may round to either neighbour, so
 * one unit in the last place of each is allowed on top of tol.
 * Returns the first failing column, or -1. */
static int fused_row_bad(const float *got, const double *y, const double *mag, int out_n, int epi, double tol,
                         kn_dtype round_dt, double *want) {
    const double ulp = round_dt == KN_DT_BF16 ? 0x1p-7 : round_dt == KN_DT_F16 ? 0x1p-10 : 0.0;
    for (int n = 0; n < out_n; n++) {
        double ref = y[n], tol_mag = mag[n], extra = 0.0;
        if (epi == KN_EPI_SWIGLU) {
            const double gt = round_to(round_dt, y[n]), up = round_to(round_dt, y[n + out_n]);
            const double silu = gt / (1.0 + exp(-gt));
            ref = silu * up;
            tol_mag = (mag[n] + fabs(gt)) * (fabs(up) + mag[n + out_n]);
            extra = ulp * (1.1 * fabs(gt) * fabs(up) + fabs(silu) * fabs(up)); /* |silu'| <= 1.1 */
        }
        if (isnan(got[n]) || fabs(got[n] - ref) > tol * tol_mag + extra + 1e-6) {
            *want = ref;
            return n;
        }
    }
    return -1;
}

/* fused_matmul (optional op): rms_norm prologue and SwiGLU epilogue against
 * a float64 reference of the separate ops. Skipped where the backend has no
 * such op or declines the shape (then the model runs the separate ops). */
static void test_fused_matmul(kn_dtype dt, int M, int N, int K, int with_norm, int epi, int with_bias) {
    if (!be->vt->fused_matmul) return;
    const size_t esz = kn_dtype_size(dt);
    const int out_n = epi == KN_EPI_SWIGLU ? N / 2 : N;
    const float eps = 1e-5f;
    float *x = malloc((size_t)M * K * 4), *g = malloc((size_t)K * 4), *bias = malloc((size_t)N * 4);
    float *out = malloc((size_t)M * out_n * 4), *wf = malloc((size_t)N * K * 4);
    void *wraw = malloc((size_t)N * K * esz);
    fill(x, (int64_t)M * K, 2.0f);
    fill(g, K, 1.0f);
    fill(bias, N, 0.5f);
    random_weight(dt, N, K, wraw, wf);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load(be, dt, N, K, wraw, 0, &w, &err) == KN_OK, "weight_load: %s", err.msg);
    poison(out, (int64_t)M * out_n);
    float *dx = dev(x, (size_t)M * K * 4), *dg = dev(g, (size_t)K * 4), *db = dev(bias, (size_t)N * 4);
    float *dout = dev(out, (size_t)M * out_n * 4);
    int done = be->vt->fused_matmul(be, dx, M, with_norm ? dg : NULL, eps, &w, with_bias ? db : NULL, dout, epi);
    back(out, dout, (size_t)M * out_n * 4);
    kn_be_free(be, dx), kn_be_free(be, dg), kn_be_free(be, db);
    if (done) {
        const int round_x = dt != KN_DT_F32 && be->matmul_x_rounding_min_rows && M >= be->matmul_x_rounding_min_rows;
        double *y = malloc((size_t)N * sizeof(double)), *mag = malloc((size_t)N * sizeof(double));
        int bad = 0;
        for (int m = 0; m < M && bad < 3; m++) {
            double ss = 0, inv = 1.0;
            for (int k = 0; k < K; k++) ss += (double)x[m * K + k] * x[m * K + k];
            if (with_norm) inv = 1.0 / sqrt(ss / K + eps);
            for (int n = 0; n < N; n++) {
                y[n] = with_bias ? bias[n] : 0.0, mag[n] = fabs(y[n]);
                for (int k = 0; k < K; k++) {
                    double xv = with_norm ? (double)(g[k] * (float)(x[m * K + k] * (float)inv)) : x[m * K + k];
                    if (round_x) /* GEMM-shaped: x rounded to the weight dtype after the norm */
                        xv = dt == KN_DT_BF16 ? kn_bf16_to_f32(kn_f32_to_bf16((float)xv))
                                              : kn_f16_to_f32(kn_f32_to_f16((float)xv));
                    y[n] += xv * wf[(int64_t)n * K + k], mag[n] += fabs(xv * wf[(int64_t)n * K + k]);
                }
            }
            double ref;
            const int n = fused_row_bad(out + (int64_t)m * out_n, y, mag, out_n, epi, 4e-6 * sqrt(K + 1.0),
                                        round_x ? dt : KN_DT_F32, &ref);
            if (n >= 0) {
                bad++;
                CHECK(0, "fused_matmul %s M=%d N=%d K=%d norm=%d epi=%d bias=%d at [%d,%d]: got %g want %g",
                      kn_dtype_name(dt), M, N, K, with_norm, epi, with_bias, m, n, out[(int64_t)m * out_n + n], ref);
            }
        }
        free(y), free(mag);
    }
    kn_be_weight_free(be, &w);
    free(x), free(g), free(bias), free(out), free(wf), free(wraw);
}

/* mlp_swiglu_add (optional op) promises the numbers of fused_matmul with the
 * SwiGLU epilogue followed by matmul_add: both run here on the same inputs
 * (those two are checked against float64 above and below) and must agree
 * bit for bit. Skipped where the backend has no such op or declines. */
static void test_mlp_swiglu_add(kn_dtype dt, int M, int H, int I, int with_norm, int with_bias) {
    if (!be->vt->mlp_swiglu_add || !be->vt->fused_matmul || !be->vt->matmul_add) return;
    const float eps = 1e-5f;
    const size_t esz = kn_dtype_size(dt);
    float *xn = malloc((size_t)M * H * 4), *g = malloc((size_t)H * 4), *bgu = malloc((size_t)2 * I * 4);
    float *bd = malloc((size_t)H * 4), *x0 = malloc((size_t)M * H * 4);
    float *want = malloc((size_t)M * H * 4), *got = malloc((size_t)M * H * 4);
    float *wf = malloc((size_t)2 * I * (H > I ? H : I) * 4);
    void *wgu = malloc((size_t)2 * I * H * esz), *wd = malloc((size_t)H * I * esz);
    fill(xn, (int64_t)M * H, 2.0f), fill(g, H, 1.0f), fill(bgu, 2 * I, 0.5f), fill(bd, H, 0.5f);
    fill(x0, (int64_t)M * H, 1.0f);
    random_weight(dt, 2 * I, H, wgu, wf);
    random_weight(dt, H, I, wd, wf);
    kn_weight gu, down;
    kn_error err = {0};
    CHECK(kn_be_weight_load(be, dt, 2 * I, H, wgu, 0, &gu, &err) == KN_OK, "weight_load: %s", err.msg);
    CHECK(kn_be_weight_load(be, dt, H, I, wd, 0, &down, &err) == KN_OK, "weight_load: %s", err.msg);
    float *dxn = dev(xn, (size_t)M * H * 4), *dg = dev(g, (size_t)H * 4), *dbgu = dev(bgu, (size_t)2 * I * 4);
    float *dbd = dev(bd, (size_t)H * 4), *dact = dev(NULL, (size_t)M * I * 4);
    float *dwant = dev(x0, (size_t)M * H * 4), *dgot = dev(x0, (size_t)M * H * 4);
    const float *nw = with_norm ? dg : NULL;
    int done = be->vt->mlp_swiglu_add(be, dxn, M, nw, eps, &gu, with_bias ? dbgu : NULL, &down,
                                      with_bias ? dbd : NULL, dgot);
    if (done) {
        CHECK(be->vt->fused_matmul(be, dxn, M, nw, eps, &gu, with_bias ? dbgu : NULL, dact, KN_EPI_SWIGLU),
              "fused_matmul declined a shape mlp_swiglu_add took");
        CHECK(be->vt->matmul_add(be, dact, M, &down, with_bias ? dbd : NULL, dwant),
              "matmul_add declined a shape mlp_swiglu_add took");
    }
    back(got, dgot, (size_t)M * H * 4), back(want, dwant, (size_t)M * H * 4);
    if (done) {
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)M * H && bad < 3; i++)
            if (isnan(got[i]) || memcmp(&got[i], &want[i], 4)) {
                bad++;
                CHECK(0, "mlp_swiglu_add %s M=%d H=%d I=%d norm=%d bias=%d at %lld: got %.9g, separate ops %.9g",
                      kn_dtype_name(dt), M, H, I, with_norm, with_bias, (long long)i, got[i], want[i]);
            }
    }
    kn_be_free(be, dxn), kn_be_free(be, dg), kn_be_free(be, dbgu), kn_be_free(be, dbd), kn_be_free(be, dact);
    kn_be_weight_free(be, &gu), kn_be_weight_free(be, &down);
    free(xn), free(g), free(bgu), free(bd), free(x0), free(want), free(got), free(wf), free(wgu), free(wd);
}

static void test_matmul(kn_dtype dt, int M, int N, int K, int with_bias) {
    size_t esz = kn_dtype_size(dt);
    float *x = malloc((size_t)M * K * 4), *out = malloc((size_t)M * N * 4), *bias = malloc((size_t)N * 4);
    float *wf = malloc((size_t)N * K * 4);
    void *wraw = malloc((size_t)N * K * esz);
    fill(x, (int64_t)M * K, 1.0f);
    fill(bias, N, 0.5f);
    random_weight(dt, N, K, wraw, wf);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load(be, dt, N, K, wraw, 0, &w, &err) == KN_OK, "weight_load: %s", err.msg);
    poison(out, (int64_t)M * N);
    float *dx = dev(x, (size_t)M * K * 4), *db = dev(bias, (size_t)N * 4), *dout = dev(out, (size_t)M * N * 4);
    be->vt->matmul(be, dx, M, &w, with_bias ? db : NULL, dout);
    back(out, dout, (size_t)M * N * 4);
    kn_be_free(be, dx), kn_be_free(be, db);
    /* a backend may round x to the weight dtype for large M (tensor cores) */
    if (dt != KN_DT_F32 && be->matmul_x_rounding_min_rows && M >= be->matmul_x_rounding_min_rows)
        for (int64_t i = 0; i < (int64_t)M * K; i++)
            x[i] = dt == KN_DT_BF16 ? kn_bf16_to_f32(kn_f32_to_bf16(x[i])) : kn_f16_to_f32(kn_f32_to_f16(x[i]));
    int bad = 0;
    for (int m = 0; m < M && bad < 3; m++)
        for (int n = 0; n < N && bad < 3; n++) {
            double ref = with_bias ? bias[n] : 0.0, mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                ref += (double)x[m * K + k] * wf[(int64_t)n * K + k];
                mag += fabs((double)x[m * K + k] * wf[(int64_t)n * K + k]);
            }
            if (!close_to(out[(int64_t)m * N + n], ref, mag, 2e-6 * sqrt(K + 1.0))) {
                bad++;
                CHECK(0, "matmul %s M=%d N=%d K=%d bias=%d at [%d,%d]: got %g want %g", kn_dtype_name(dt), M, N, K,
                      with_bias, m, n, out[(int64_t)m * N + n], ref);
            }
        }
    if (be->vt->matmul_add) { /* fused residual: out += x . W^T + bias, out starting at 1.5 */
        for (int64_t i = 0; i < (int64_t)M * N; i++) out[i] = 1.5f;
        float *dacc = dev(out, (size_t)M * N * 4);
        dx = dev(x, (size_t)M * K * 4), db = dev(bias, (size_t)N * 4);
        const int done = be->vt->matmul_add(be, dx, M, &w, with_bias ? db : NULL, dacc); /* 0: declined */
        back(out, dacc, (size_t)M * N * 4);
        kn_be_free(be, dx), kn_be_free(be, db);
        bad = 0;
        for (int m = 0; m < M && bad < 3 && done; m++)
            for (int n = 0; n < N && bad < 3; n++) {
                double ref = 1.5 + (with_bias ? bias[n] : 0.0), mag = fabs(ref);
                for (int k = 0; k < K; k++) {
                    ref += (double)x[m * K + k] * wf[(int64_t)n * K + k];
                    mag += fabs((double)x[m * K + k] * wf[(int64_t)n * K + k]);
                }
                if (!close_to(out[(int64_t)m * N + n], ref, mag, 2e-6 * sqrt(K + 1.0))) {
                    bad++;
                    CHECK(0, "matmul_add %s M=%d N=%d K=%d at [%d,%d]: got %g want %g", kn_dtype_name(dt), M, N, K, m, n,
                          out[(int64_t)m * N + n], ref);
                }
            }
    }
    kn_be_weight_free(be, &w);
    free(x), free(out), free(bias), free(wf), free(wraw);
}

/* The CPU backend's promise for decode-shaped matmuls (M <= 16): a row's
 * result does not depend on how many rows share the call, so a batched
 * decode step gives the same bits as each sequence's solo step. Every row of
 * an M-row call must equal that row computed alone (the one-row kernels are
 * separate code: K with and without a 32- and a 64-element tail). */
static void test_matmul_rows_independent(kn_dtype dt, int M, int N, int K) {
    if (strcmp(be->vt->name, "cpu")) return; /* a CPU promise (test_kv_e2e's mixed/solo check relies on it too) */
    const size_t esz = kn_dtype_size(dt);
    float *x = malloc((size_t)M * K * 4), *all = malloc((size_t)M * N * 4), *one = malloc((size_t)N * 4);
    float *bias = malloc((size_t)N * 4), *wf = malloc((size_t)N * K * 4);
    void *wraw = malloc((size_t)N * K * esz);
    fill(x, (int64_t)M * K, 1.0f), fill(bias, N, 0.5f);
    random_weight(dt, N, K, wraw, wf);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load(be, dt, N, K, wraw, 0, &w, &err) == KN_OK, "weight_load: %s", err.msg);
    be->vt->matmul(be, x, M, &w, bias, all);
    for (int m = 0; m < M; m++) {
        be->vt->matmul(be, x + (int64_t)m * K, 1, &w, bias, one);
        int bad = 0;
        for (int n = 0; n < N && bad < 3; n++)
            if (memcmp(&one[n], &all[(int64_t)m * N + n], 4)) {
                bad++;
                CHECK(0, "matmul %s M=%d N=%d K=%d: row %d col %d alone %.9g, in the batch %.9g", kn_dtype_name(dt), M, N,
                      K, m, n, one[n], all[(int64_t)m * N + n]);
            }
    }
    kn_be_weight_free(be, &w);
    free(x), free(all), free(one), free(bias), free(wf), free(wraw);
}

/* MLX affine-quantized weights: random codes, scales and biases stored in
 * sb (F32/BF16/F16); the float64 reference multiplies by the dequantized
 * values scale*q + bias. matmul (decode and prefill shapes), matmul_add and
 * embed. */
static void *quant_random(int bits, int gs, int N, int K, kn_dtype sb, double *wd, kn_quant_host *h) {
    const int per = 32 / bits, G = K / gs;
    uint32_t *q = calloc((size_t)N * K / per + 1, 4);
    size_t esz = kn_dtype_size(sb);
    uint8_t *sc = malloc((size_t)N * G * esz + 1), *bi = malloc((size_t)N * G * esz + 1);
    for (int64_t i = 0; i < (int64_t)N * G; i++) {
        float s = (kn_test_rand(&seed) + 1.5f) * 0.02f, b = kn_test_rand(&seed) * 0.2f;
        if (sb == KN_DT_F32) memcpy(sc + i * 4, &s, 4), memcpy(bi + i * 4, &b, 4);
        else {
            uint16_t hs = sb == KN_DT_BF16 ? kn_f32_to_bf16(s) : kn_f32_to_f16(s);
            uint16_t hb = sb == KN_DT_BF16 ? kn_f32_to_bf16(b) : kn_f32_to_f16(b);
            memcpy(sc + i * 2, &hs, 2), memcpy(bi + i * 2, &hb, 2);
        }
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            uint32_t code = (uint32_t)((kn_test_rand(&seed) + 1.0f) * 0.5f * (float)(1 << bits)) & ((1u << bits) - 1);
            q[(n * K + k) / per] |= code << (bits * ((n * K + k) % per));
            int64_t g = n * G + k / gs;
            wd[n * K + k] = (double)kn_load_f32(sc, sb, g) * code + (double)kn_load_f32(bi, sb, g);
        }
    *h = (kn_quant_host){.rows = N, .cols = K, .bits = bits, .group_size = gs, .q = q, .scales = sc, .biases = bi,
                         .sb_dtype = sb};
    return q;
}

static void quant_host_free(kn_quant_host *h) {
    free((void *)h->q), free((void *)h->scales), free((void *)h->biases);
}

/* The CPU backend's decode fusions (fused_matmul's RMSNorm prologue and
 * SwiGLU epilogue, matmul_add's residual add, all inside the GEMV's row
 * stream) promise the bits of the separate ops: rms_norm, matmul, swiglu,
 * add. w: a loaded weight (dense or quantized) of N rows, K columns. */
static void check_fusions_bitwise(const char *what, const kn_weight *w, int M, int with_norm, int with_bias) {
    const int64_t N = w->rows, K = w->cols;
    const float eps = 1e-5f;
    float *x = malloc((size_t)M * K * 4), *g = malloc((size_t)K * 4), *bias = malloc((size_t)N * 4);
    float *xn = malloc((size_t)M * K * 4), *tmp = malloc((size_t)M * N * 4), *sep = malloc((size_t)M * N * 4);
    float *fused = malloc((size_t)M * N * 4);
    fill(x, (int64_t)M * K, 2.0f), fill(g, K, 1.0f), fill(bias, N, 0.5f);
    const float *nw = with_norm ? g : NULL, *b = with_bias ? bias : NULL;
    for (int epi = KN_EPI_NONE; epi <= KN_EPI_SWIGLU; epi++) {
        if (epi == KN_EPI_SWIGLU && N % 2) continue;
        const int64_t out_n = epi == KN_EPI_SWIGLU ? N / 2 : N;
        poison(fused, (int64_t)M * out_n);
        if (!be->vt->fused_matmul(be, x, M, nw, eps, w, b, fused, epi)) { /* quantized: a kernel set without its GEMV may */
            CHECK(w->bits, "%s: fused_matmul declined M=%d", what, M);
            continue;
        }
        const float *in = x;
        if (with_norm) be->vt->rms_norm(be, x, K, xn, K, M, 1, (int)K, g, eps), in = xn;
        be->vt->matmul(be, in, M, w, b, epi == KN_EPI_SWIGLU ? tmp : sep);
        if (epi == KN_EPI_SWIGLU) be->vt->swiglu(be, tmp, M, (int)out_n, sep);
        for (int64_t i = 0, bad = 0; i < (int64_t)M * out_n && bad < 3; i++)
            if (memcmp(&fused[i], &sep[i], 4)) {
                bad++;
                CHECK(0, "%s fused_matmul M=%d N=%lld K=%lld norm=%d epi=%d at %lld: %.9g, separate ops %.9g", what, M,
                      (long long)N, (long long)K, with_norm, epi, (long long)i, fused[i], sep[i]);
            }
    }
    fill(fused, (int64_t)M * N, 3.0f); /* the residual both ways */
    memcpy(sep, fused, (size_t)M * N * 4);
    const int added = be->vt->matmul_add(be, x, M, w, b, fused);
    CHECK(added || w->bits, "%s: matmul_add declined M=%d", what, M);
    be->vt->matmul(be, x, M, w, b, tmp);
    be->vt->add(be, sep, tmp, (int64_t)M * N);
    for (int64_t i = 0, bad = 0; i < (int64_t)M * N && bad < 3 && added; i++)
        if (memcmp(&fused[i], &sep[i], 4)) {
            bad++;
            CHECK(0, "%s matmul_add M=%d N=%lld K=%lld at %lld: %.9g, matmul + add %.9g", what, M, (long long)N,
                  (long long)K, (long long)i, fused[i], sep[i]);
        }
    free(x), free(g), free(bias), free(xn), free(tmp), free(sep), free(fused);
}

/* Where the CPU backend keeps a weight (kn_borrow): process memory is
 * used in place; a file mapping's weight of 2 MiB or more is copied into
 * huge pages while memory allows (kn_host_mem_available well above it here);
 * a smaller one is used in place; transient bytes are copied. The copy holds
 * the same bytes. */
static void test_cpu_weight_placement(void) {
    if (strcmp(be->vt->name, "cpu")) return; /* a CPU promise (other backends always copy) */
    const int64_t rows = 1024, cols = 2048; /* 4 MiB of bf16 */
    const size_t bytes = (size_t)rows * cols * 2;
    uint16_t *host = kn_host_alloc(bytes);
    CHECK(host != NULL, "placement: no memory");
    if (!host) return;
    for (size_t i = 0; i < bytes / 2; i++) host[i] = (uint16_t)(i * 2654435761u >> 16);
    kn_error err = {0};
    kn_weight w;
    CHECK(kn_be_weight_load(be, KN_DT_BF16, rows, cols, host, KN_BORROW_RESIDENT, &w, &err) == KN_OK &&
              w.data == host && !w.owned,
          "placement: resident bytes were not used in place");
    kn_be_weight_free(be, &w);
    const char *env = getenv("KILN_CPU_COPY_WEIGHTS");
    const int64_t avail = kn_host_mem_available();
    if (!(env && !strcmp(env, "0")) && avail > ((int64_t)8 << 30)) {
        CHECK(kn_be_weight_load(be, KN_DT_BF16, rows, cols, host, KN_BORROW_MAPPED, &w, &err) == KN_OK &&
                  w.data != host && w.owned && ((uintptr_t)w.data & (KN_HOST_HUGE_MIN - 1)) == 0 &&
                  !memcmp(w.data, host, bytes),
              "placement: a 4 MiB mapped weight was not copied whole into 2 MiB-aligned memory");
        kn_be_weight_free(be, &w);
    }
    CHECK(kn_be_weight_load(be, KN_DT_BF16, 64, 64, host, KN_BORROW_MAPPED, &w, &err) == KN_OK && w.data == host &&
              !w.owned,
          "placement: a small mapped weight was copied");
    kn_be_weight_free(be, &w);
    CHECK(kn_be_weight_load(be, KN_DT_BF16, rows, cols, host, KN_BORROW_NO, &w, &err) == KN_OK && w.data != host &&
              w.owned && !memcmp(w.data, host, bytes),
          "placement: transient bytes were not copied");
    kn_be_weight_free(be, &w);
    kn_host_free(host);
}

static void test_cpu_fusions(void) {
    if (strcmp(be->vt->name, "cpu")) return; /* a CPU promise; other backends are checked against float64 */
    const int Ms[] = {1, 2, 5, 16};
    for (int d = 0; d < 3; d++) { /* dense: 300 rows in one stream chunk (the residual add's sub-ranges), 4098 in many */
        const kn_dtype dt = d == 0 ? KN_DT_F32 : d == 1 ? KN_DT_BF16 : KN_DT_F16;
        const int shapes[][2] = {{300, 64}, {4098, 96}, {37, 1030}};
        for (size_t s = 0; s < 3; s++) {
            const int N = shapes[s][0], K = shapes[s][1];
            float *wf = malloc((size_t)N * K * 4);
            void *wraw = malloc((size_t)N * K * kn_dtype_size(dt));
            random_weight(dt, N, K, wraw, wf);
            kn_weight w;
            kn_error err = {0};
            CHECK(kn_be_weight_load(be, dt, N, K, wraw, 0, &w, &err) == KN_OK, "weight_load: %s", err.msg);
            for (int m = 0; m < 4; m++) check_fusions_bitwise(kn_dtype_name(dt), &w, Ms[m], (m + (int)s) % 2, m < 2);
            kn_be_weight_free(be, &w);
            free(wf), free(wraw);
        }
    }
    if (!be->vt->weight_load_quant) return;
    for (int bits = 4; bits <= 8; bits += 4) { /* quantized: the VNNI GEMV where present, else the generic path */
        const int N = 2 * 150, K = 256;
        double *wd = malloc((size_t)N * K * sizeof(double));
        kn_quant_host h;
        quant_random(bits, 64, N, K, KN_DT_BF16, wd, &h);
        kn_weight w;
        kn_error err = {0};
        CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_OK, "weight_load_quant: %s", err.msg);
        quant_host_free(&h);
        for (int m = 0; m < 4; m++) check_fusions_bitwise(bits == 4 ? "q4" : "q8", &w, Ms[m], m % 2, m >= 2);
        kn_be_weight_free(be, &w);
        free(wd);
    }
}

static void test_qmatmul(int bits, int gs, int M, int N, int K, int with_bias, kn_dtype sb) {
    double *wd = malloc((size_t)N * K * sizeof(double));
    kn_quant_host h;
    quant_random(bits, gs, N, K, sb, wd, &h);
    float *x = malloc((size_t)M * K * 4), *out = malloc((size_t)M * N * 4), *bias = malloc((size_t)N * 4);
    fill(x, (int64_t)M * K, 1.0f);
    fill(bias, N, 0.5f);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_OK, "weight_load_quant: %s", err.msg);
    quant_host_free(&h);
    for (int pass = 0; pass < (be->vt->matmul_add ? 2 : 1); pass++) {
        const float start = pass ? 1.5f : NAN;
        for (int64_t i = 0; i < (int64_t)M * N; i++) out[i] = start;
        float *dx = dev(x, (size_t)M * K * 4), *db = dev(bias, (size_t)N * 4), *dout = dev(out, (size_t)M * N * 4);
        int done = 1; /* matmul_add may decline (0) */
        if (pass) done = be->vt->matmul_add(be, dx, M, &w, with_bias ? db : NULL, dout);
        else be->vt->matmul(be, dx, M, &w, with_bias ? db : NULL, dout);
        back(out, dout, (size_t)M * N * 4);
        kn_be_free(be, dx), kn_be_free(be, db);
        int bad = 0;
        for (int m = 0; m < M && bad < 3 && done; m++)
            for (int n = 0; n < N && bad < 3; n++) {
                double ref = (pass ? 1.5 : 0.0) + (with_bias ? bias[n] : 0.0), mag = fabs(ref);
                for (int k = 0; k < K; k++) {
                    ref += (double)x[m * K + k] * wd[(int64_t)n * K + k];
                    mag += fabs((double)x[m * K + k] * wd[(int64_t)n * K + k]);
                }
                if (!close_to(out[(int64_t)m * N + n], ref, mag, 4e-6 * sqrt(K + 1.0))) {
                    bad++;
                    CHECK(0, "q%d g%d %s %s M=%d N=%d K=%d bias=%d at [%d,%d]: got %g want %g", bits, gs,
                          kn_dtype_name(sb), pass ? "matmul_add" : "matmul", M, N, K, with_bias, m, n,
                          out[(int64_t)m * N + n], ref);
                }
            }
    }
    kn_be_weight_free(be, &w);
    free(x), free(out), free(bias), free(wd);
}

/* fused_matmul over quantized weights (CUDA: the integer-dot GEMV with its
 * norm prologue and SwiGLU epilogue). x may be carried to
 * be->quant_x_rel_error of its group's max |x|: the bound adds that error
 * times sum |w| over each group. Skipped where the backend declines. */
static void test_fused_qmatmul(int bits, int gs, int M, int N, int K, int with_norm, int epi, int with_bias,
                               kn_dtype sb) {
    if (!be->vt->fused_matmul || !be->vt->weight_load_quant) return;
    const int out_n = epi == KN_EPI_SWIGLU ? N / 2 : N;
    const float eps = 1e-5f;
    double *wd = malloc((size_t)N * K * sizeof(double));
    kn_quant_host h;
    quant_random(bits, gs, N, K, sb, wd, &h);
    float *x = malloc((size_t)M * K * 4), *g = malloc((size_t)K * 4), *bias = malloc((size_t)N * 4);
    float *out = malloc((size_t)M * out_n * 4);
    fill(x, (int64_t)M * K, 2.0f);
    fill(g, K, 1.0f);
    fill(bias, N, 0.5f);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_OK, "weight_load_quant: %s", err.msg);
    quant_host_free(&h);
    poison(out, (int64_t)M * out_n);
    float *dx = dev(x, (size_t)M * K * 4), *dg = dev(g, (size_t)K * 4), *db = dev(bias, (size_t)N * 4);
    float *dout = dev(out, (size_t)M * out_n * 4);
    int done = be->vt->fused_matmul(be, dx, M, with_norm ? dg : NULL, eps, &w, with_bias ? db : NULL, dout, epi);
    back(out, dout, (size_t)M * out_n * 4);
    kn_be_free(be, dx), kn_be_free(be, dg), kn_be_free(be, db);
    if (done) {
        double *y = malloc((size_t)N * sizeof(double)), *mag = malloc((size_t)N * sizeof(double));
        float *xv = malloc((size_t)K * 4), *gmax = malloc((size_t)K * 4);
        int bad = 0;
        for (int m = 0; m < M && bad < 3; m++) {
            double ss = 0, inv = 1.0;
            for (int k = 0; k < K; k++) ss += (double)x[m * K + k] * x[m * K + k];
            if (with_norm) inv = 1.0 / sqrt(ss / K + eps);
            for (int k = 0; k < K; k++) xv[k] = with_norm ? g[k] * (float)(x[m * K + k] * (float)inv) : x[m * K + k];
            for (int k0 = 0; k0 < K; k0 += gs) {
                float mx = 0.0f;
                for (int k = k0; k < k0 + gs; k++) mx = fmaxf(mx, fabsf(xv[k]));
                for (int k = k0; k < k0 + gs; k++) gmax[k] = mx;
            }
            for (int n = 0; n < N; n++) {
                y[n] = with_bias ? bias[n] : 0.0, mag[n] = fabs(y[n]);
                double xerr = 0;
                for (int k = 0; k < K; k++) {
                    y[n] += (double)xv[k] * wd[(int64_t)n * K + k];
                    mag[n] += fabs((double)xv[k] * wd[(int64_t)n * K + k]);
                    xerr += fabs(wd[(int64_t)n * K + k]) * gmax[k];
                }
                mag[n] += xerr * be->quant_x_rel_error / (4e-6 * sqrt(K + 1.0)); /* in the units close_to scales */
            }
            double ref;
            const int n = fused_row_bad(out + (int64_t)m * out_n, y, mag, out_n, epi, 4e-6 * sqrt(K + 1.0),
                                        KN_DT_F32, &ref);
            if (n >= 0) {
                bad++;
                CHECK(0, "fused q%d g%d %s M=%d N=%d K=%d norm=%d epi=%d bias=%d at [%d,%d]: got %g want %g", bits, gs,
                      kn_dtype_name(sb), M, N, K, with_norm, epi, with_bias, m, n, out[(int64_t)m * out_n + n], ref);
            }
        }
        free(y), free(mag), free(xv), free(gmax);
    }
    kn_be_weight_free(be, &w);
    free(x), free(g), free(bias), free(out), free(wd);
}

static void test_qembed(int bits, int gs, int V, int D) {
    double *wd = malloc((size_t)V * D * sizeof(double));
    kn_quant_host h;
    quant_random(bits, gs, V, D, KN_DT_BF16, wd, &h);
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_OK, "weight_load_quant: %s", err.msg);
    quant_host_free(&h);
    int32_t ids[5] = {0, V - 1, V / 2, 3 % V, V - 1};
    float *out = malloc(5 * (size_t)D * 4);
    poison(out, 5 * (int64_t)D);
    int32_t *dids = dev(ids, sizeof ids);
    float *dout = dev(out, 5 * (size_t)D * 4);
    be->vt->embed(be, &w, dids, 5, dout);
    back(out, dout, 5 * (size_t)D * 4);
    kn_be_free(be, dids);
    int bad = 0;
    for (int i = 0; i < 5 && bad < 3; i++)
        for (int j = 0; j < D && bad < 3; j++) {
            double ref = wd[(int64_t)ids[i] * D + j];
            if (!close_to(out[(int64_t)i * D + j], ref, fabs(ref), 1e-6)) {
                bad++;
                CHECK(0, "q%d g%d embed V=%d D=%d id %d col %d: got %g want %g", bits, gs, V, D, ids[i], j,
                      out[(int64_t)i * D + j], ref);
            }
        }
    kn_be_weight_free(be, &w);
    free(out), free(wd);
}

static void test_quant_ops(void) {
    if (!be->vt->weight_load_quant) {
        printf("test_ops: quantized weights unsupported on %s\n", be->vt->name);
        return;
    }
    const int bits[] = {4, 8, 2}, gss[] = {32, 64, 128}, Ms[] = {1, 2, 3, 5, 9, 70}, Ns[] = {1, 17, 63, 100};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 3; g++)
            for (size_t m = 0; m < sizeof Ms / sizeof *Ms; m++)
                for (size_t n = 0; n < sizeof Ns / sizeof *Ns; n++) {
                    int K = gss[g] * (1 + (int)((m + n) % 3)) + (b == 0 && g == 0 ? 256 : 0); /* >1 KC block too */
                    kn_dtype sb = (m + n) % 3 == 0 ? KN_DT_BF16 : (m + n) % 3 == 1 ? KN_DT_F16 : KN_DT_F32;
                    test_qmatmul(bits[b], gss[g], Ms[m], Ns[n], K, (int)((m + n + b) % 2), sb);
                }
    test_qmatmul(4, 64, 130, 75, 640, 1, KN_DT_BF16); /* several KC blocks, M tiles, odd N */
    test_qmatmul(4, 64, 1, 300, 14336, 0, KN_DT_BF16); /* decode GEMV: several pieces per lane and row */
    test_qmatmul(8, 128, 2, 33, 4096, 1, KN_DT_F16);
    test_qmatmul(4, 32, 2, 71, 8192, 1, KN_DT_F32); /* CUDA bulk-copy GEMV with f32 scales, odd N */
    test_qmatmul(8, 64, 1, 129, 3072, 0, KN_DT_BF16); /* 8-bit, a partial last chunk per row */
    /* CUDA: more column sets than resident warps (several sets a warp) */
    test_qmatmul(4, 64, 1, 5000, 4096, 1, KN_DT_BF16);
    test_qmatmul(8, 64, 1, 4500, 2048, 0, KN_DT_F32);
    /* CUDA: ~6 and ~8 column sets a warp (stage buffers reused across sets) */
    test_qmatmul(4, 64, 1, 24000, 1024, 0, KN_DT_BF16);
    test_fused_qmatmul(8, 64, 1, 16000, 512, 1, KN_EPI_SWIGLU, 1, KN_DT_BF16);
    /* CUDA: two rows of x too wide for the bulk GEMV's 16-warp block (its
     * terms leave no room for the stages): the 8-warp form */
    test_qmatmul(4, 64, 2, 40, 24576, 1, KN_DT_BF16);
    for (int m = 1; m <= 2; m++) /* decode fusions over codes: norm prologue, SwiGLU epilogue */
        for (int b = 0; b < 2; b++) {
            const int bt = b ? 8 : 4;
            test_fused_qmatmul(bt, 64, m, 74, 1024, 1, KN_EPI_NONE, 1, KN_DT_BF16);
            test_fused_qmatmul(bt, 32, m, 90, 4096, 1, KN_EPI_SWIGLU, 0, KN_DT_F16);
            test_fused_qmatmul(bt, 128, m, 42, 768, 0, KN_EPI_SWIGLU, 1, KN_DT_F32);
            test_fused_qmatmul(bt, 64, m, 17, 6144, 1, KN_EPI_NONE, 0, KN_DT_BF16);
        }
    test_fused_qmatmul(4, 64, 1, 2200, 4096, 1, KN_EPI_SWIGLU, 0, KN_DT_BF16); /* several sets a warp */
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 3; g++) test_qembed(bits[b], gss[g], 37, gss[g] * 3);
    /* bad descriptions are refused, not run */
    kn_quant_host h = {.rows = 4, .cols = 96, .bits = 4, .group_size = 64, .sb_dtype = KN_DT_BF16};
    kn_weight w;
    kn_error err = {0};
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_ERR_FORMAT, "cols %% group_size accepted");
    h.cols = 128, h.bits = 3;
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_ERR_UNSUPPORTED, "3-bit accepted");
    h.bits = 4, h.group_size = 48;
    CHECK(kn_be_weight_load_quant(be, &h, &w, &err) == KN_ERR_UNSUPPORTED, "group 48 accepted");
}

static void test_rms_norm(int rows, int groups, int dim) {
    int64_t stride = (int64_t)groups * dim + 3; /* padded rows */
    float *x = malloc((size_t)(rows * stride) * 4), *out = malloc((size_t)(rows * stride) * 4), *w = malloc((size_t)dim * 4);
    fill(x, rows * stride, 3.0f);
    fill(w, dim, 1.0f);
    poison(out, rows * stride);
    float *dx = dev(x, (size_t)(rows * stride) * 4), *dw = dev(w, (size_t)dim * 4), *dout = dev(out, (size_t)(rows * stride) * 4);
    be->vt->rms_norm(be, dx, stride, dout, stride, rows, groups, dim, dw, 1e-5f);
    back(out, dout, (size_t)(rows * stride) * 4);
    kn_be_free(be, dx), kn_be_free(be, dw);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            double ss = 0;
            for (int j = 0; j < dim; j++) ss += (double)x[r * stride + g * dim + j] * x[r * stride + g * dim + j];
            double inv = 1.0 / sqrt(ss / dim + 1e-5);
            for (int j = 0; j < dim; j++) {
                double ref = w[j] * x[r * stride + g * dim + j] * inv;
                float got = out[r * stride + g * dim + j];
                if (!close_to(got, ref, fabs(ref), 1e-6)) {
                    CHECK(0, "rms_norm rows=%d groups=%d dim=%d: got %g want %g", rows, groups, dim, got, ref);
                    goto done;
                }
            }
        }
done:
    free(x), free(out), free(w);
}

static void test_rope(int n_tokens, int n_heads, int head_dim, int rot_dim, float scale) {
    int64_t stride = (int64_t)n_heads * head_dim + 5;
    float *x = malloc((size_t)(n_tokens * stride) * 4), *orig = malloc((size_t)(n_tokens * stride) * 4);
    float inv_freq[512];
    int32_t pos[64];
    for (int i = 0; i < rot_dim / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / rot_dim);
    for (int t = 0; t < n_tokens; t++) pos[t] = t * 37 % 1000;
    fill(x, n_tokens * stride, 1.0f);
    memcpy(orig, x, (size_t)(n_tokens * stride) * 4);
    float *dfreq = dev(inv_freq, sizeof inv_freq), *dx = dev(x, (size_t)(n_tokens * stride) * 4);
    int32_t *dpos = dev(pos, sizeof pos);
    kn_rope_table rt = {.rot_dim = rot_dim, .attn_scale = scale, .inv_freq = dfreq};
    be->vt->rope(be, dx, stride, n_tokens, n_heads, head_dim, dpos, &rt);
    back(x, dx, (size_t)(n_tokens * stride) * 4);
    kn_be_free(be, dfreq), kn_be_free(be, dpos);
    int half = rot_dim / 2;
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *o = orig + t * stride + h * head_dim;
            const float *g = x + t * stride + h * head_dim;
            for (int i = 0; i < head_dim; i++) {
                double ref;
                if (i < half) {
                    double f = (double)(float)((float)pos[t] * inv_freq[i]);
                    ref = scale * (o[i] * cos(f) - o[i + half] * sin(f));
                } else if (i < rot_dim) {
                    double f = (double)(float)((float)pos[t] * inv_freq[i - half]);
                    ref = scale * (o[i] * cos(f) + o[i - half] * sin(f));
                } else {
                    ref = o[i]; /* partial rotary: untouched */
                }
                if (!close_to(g[i], ref, 2.0, 2e-6)) {
                    CHECK(0, "rope tokens=%d heads=%d hd=%d rot=%d [t%d h%d i%d]: got %g want %g", n_tokens, n_heads,
                          head_dim, rot_dim, t, h, i, g[i], ref);
                    goto done;
                }
            }
        }
    /* padding between rows untouched */
    for (int t = 0; t < n_tokens; t++)
        for (int p = n_heads * head_dim; p < stride; p++)
            CHECK(x[t * stride + p] == orig[t * stride + p], "rope wrote outside its heads");
done:
    free(x), free(orig);
}

/* per-head RMSNorm weights [hd] for q and k, random, in backend memory */
static void random_head_norms(int hd, float **qn, float **kn) {
    float *w = calloc((size_t)hd, 4);
    fill(w, hd, 1.0f), *qn = dev(w, (size_t)hd * 4);
    fill(w, hd, 1.0f), *kn = dev(w, (size_t)hd * 4);
    free(w);
}

/* what rope_kv_write does, one op at a time: the heads' norms (with qn and
 * kn), rope over the nq query and nkv key heads at x, the cache write */
static void rope_kv_steps(float *x, const float *v, int64_t stride, int n, int nq, int nkv, int hd, const int32_t *pos,
                          const kn_rope_table *rt, const kn_kv_layer *kv, const int32_t *slots, const float *qn,
                          const float *kn, float eps) {
    if (qn) {
        be->vt->rms_norm(be, x, stride, x, stride, n, nq, hd, qn, eps);
        be->vt->rms_norm(be, x + (int64_t)nq * hd, stride, x + (int64_t)nq * hd, stride, n, nkv, hd, kn, eps);
    }
    be->vt->rope(be, x, stride, n, nq + nkv, hd, pos, rt);
    be->vt->kv_write(be, kv, x + (int64_t)nq * hd, v, stride, n, slots);
}

/* rope_kv_write (optional op) against rope followed by kv_write on the same
 * backend (with_norm: per-head q / k RMSNorm first, against rms_norm), into
 * a cache of format spec (a --kv string): the rotated q/k and the cache rows
 * must be identical. */
static void test_rope_kv_write(int n_tokens, int nq, int nkv, int hd, int rot_dim, const char *spec, int with_norm) {
    if (!be->vt->rope_kv_write) return;
    kn_kv_spec ks;
    kn_error err = {0};
    if (kn_kv_spec_parse(spec, 0, &ks, &err)) {
        CHECK(0, "rope_kv_write: %s", err.msg);
        return;
    }
    const int64_t stride = (int64_t)(nq + 2 * nkv) * hd + 3, nslots = 2 * (int64_t)n_tokens + 16;
    const int64_t n_blocks = (nslots + 15) / 16;
    const size_t xb = (size_t)(n_tokens * stride) * 4;
    const size_t kb = (size_t)(n_blocks * 16 * nkv) * kn_kv_row_bytes(ks.k_fmt, hd),
                 vb = (size_t)(n_blocks * 16 * nkv) * kn_kv_row_bytes(ks.v_fmt, hd), cb = kb + vb;
    float *x = malloc(xb), *xa = malloc(xb), *xf = malloc(xb), inv_freq[256];
    uint8_t *ca = calloc(1, cb), *cf = calloc(1, cb);
    int32_t pos[64], slots[64];
    for (int i = 0; i < rot_dim / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / rot_dim);
    for (int t = 0; t < n_tokens; t++) pos[t] = t * 29 % 500, slots[t] = (int32_t)((t * 7 + 3) % nslots);
    fill(x, n_tokens * stride, 1.0f);
    float *dfreq = dev(inv_freq, sizeof inv_freq);
    int32_t *dpos = dev(pos, sizeof pos), *dslots = dev(slots, sizeof slots);
    kn_rope_table rt = {.rot_dim = rot_dim, .attn_scale = 1.0f, .inv_freq = dfreq};
    float *qn = NULL, *kn = NULL;
    if (with_norm) random_head_norms(hd, &qn, &kn);
    const float eps = 1e-6f;
    for (int fused = 0; fused < 2; fused++) {
        float *dx = dev(x, xb);
        kn_kv_pool *pool = NULL;
        kn_kv_pool_params pp = {.n_layers = 1, .block_size = 16, .n_blocks = n_blocks, .n_kv_heads = &nkv,
                                .head_dim = &hd, .spec = &ks};
        if (kn_kv_pool_create_ex(be, &pp, &pool, &err)) {
            CHECK(0, "rope_kv_write %s: %s", spec, err.msg);
            kn_be_free(be, dx);
            break;
        }
        const kn_kv_layer kv = pool->layers[0];
        uint8_t *zero = calloc(1, cb);
        kn_be_upload(be, kv.k, zero, kb), kn_be_upload(be, kv.v, zero, vb);
        free(zero);
        const float *dv = dx + (int64_t)(nq + nkv) * hd;
        int done = 1;
        if (fused)
            done = be->vt->rope_kv_write(be, dx, dv, stride, n_tokens, nq, nkv, hd, dpos, &rt, &kv, dslots, qn, kn, eps);
        else {
            rope_kv_steps(dx, dv, stride, n_tokens, nq, nkv, hd, dpos, &rt, &kv, dslots, qn, kn, eps);
        }
        back(fused ? xf : xa, dx, xb);
        peek((fused ? cf : ca), kv.k, kb); /* the pool's rows: freed with it */
        peek((fused ? cf : ca) + kb, kv.v, vb);
        kn_kv_pool_destroy(pool);
        if (!done) { /* declined: nothing to compare */
            memcpy(xf, xa, xb), memcpy(cf, ca, cb);
            break;
        }
    }
    CHECK(!memcmp(xa, xf, xb), "rope_kv_write tokens=%d q=%d kv=%d hd=%d rot=%d norm=%d: q/k differ from rope",
          n_tokens, nq, nkv, hd, rot_dim, with_norm);
    CHECK(!memcmp(ca, cf, cb), "rope_kv_write tokens=%d q=%d kv=%d hd=%d rot=%d kv=%s norm=%d: cache differs from kv_write",
          n_tokens, nq, nkv, hd, rot_dim, spec, with_norm);
    if (with_norm) kn_be_free(be, qn), kn_be_free(be, kn);
    kn_be_free(be, dfreq), kn_be_free(be, dpos), kn_be_free(be, dslots);
    free(x), free(xa), free(xf), free(ca), free(cf);
}

/* rope_kv_attention (optional op; CUDA, forced on for every group size with
 * KILN_FUSED_ROPE_ATTN=1: by default only small groups take it) against
 * rope_kv_write (or its steps) followed by attention on the same backend:
 * n_seqs decode tokens, one per sequence, at positions ctx + 5 s over a
 * bf16 cache of random rows with scrambled block tables; bf16 compute. The
 * outputs and the new cache rows agree up to rounding (the fused norms and
 * rotations sum in another order, before q and the rows are rounded to
 * bf16); every other cache row is untouched. */
static void test_rope_kv_attention(int n_seqs, int nq, int nkv, int hd, int ctx, int window, int with_norm) {
    if (!be->vt->rope_kv_attention) return;
    setenv("KILN_FUSED_ROPE_ATTN", "1", 0); /* every case, not only the groups the default picks */
    kn_kv_spec ks;
    kn_error err = {0};
    if (kn_kv_spec_parse("bf16", 0, &ks, &err)) {
        CHECK(0, "rope_kv_attention: %s", err.msg);
        return;
    }
    const int bs = 16, n = n_seqs, max_pos = ctx + 5 * (n_seqs - 1);
    const int max_blocks = max_pos / bs + 1, n_blocks = n_seqs * max_blocks + 2;
    const int64_t stride = (int64_t)(nq + 2 * nkv) * hd + 5, slot_w = (int64_t)nkv * hd;
    const int64_t n_el = (int64_t)n_blocks * bs * slot_w;
    const size_t xb = (size_t)(n * stride) * 4, ob = (size_t)n * nq * hd * 4, kb = (size_t)n_el * 2;
    float *x = malloc(xb), *oa = malloc(ob), *of = malloc(ob), inv_freq[128], *rows = malloc((size_t)n_el * 4);
    uint16_t *k16 = malloc(kb), *v16 = malloc(kb), *ka = malloc(kb), *va = malloc(kb), *kf = malloc(kb),
             *vf = malloc(kb);
    int32_t pos[16], seq[16], slots[16], *bt = malloc((size_t)n_seqs * max_blocks * 4);
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / hd);
    for (int sq = 0; sq < n_seqs; sq++) /* block i of sequence sq: scrambled over the pool */
        for (int i = 0; i < max_blocks; i++) bt[sq * max_blocks + i] = (n_blocks - 1 - i * n_seqs - sq + 7 * n_blocks) % n_blocks;
    for (int t = 0; t < n; t++) {
        pos[t] = ctx + 5 * t, seq[t] = t;
        slots[t] = bt[t * max_blocks + pos[t] / bs] * bs + pos[t] % bs;
    }
    fill(x, n * stride, 1.0f);
    fill(rows, n_el, 1.0f);
    for (int64_t i = 0; i < n_el; i++) k16[i] = kn_f32_to_bf16(rows[i]);
    fill(rows, n_el, 1.0f);
    for (int64_t i = 0; i < n_el; i++) v16[i] = kn_f32_to_bf16(rows[i]);
    for (int t = 0; t < n; t++) /* the rows about to be written hold NaN: no path may read them stale */
        for (int64_t i = 0; i < slot_w; i++) k16[slots[t] * slot_w + i] = v16[slots[t] * slot_w + i] = 0x7fc0;
    float *dfreq = dev(inv_freq, sizeof inv_freq), *qn = NULL, *kn = NULL;
    int32_t *dpos = dev(pos, sizeof pos), *dseq = dev(seq, sizeof seq), *dslots = dev(slots, sizeof slots);
    int32_t *dbt = dev(bt, (size_t)n_seqs * max_blocks * 4);
    const kn_rope_table rt = {.rot_dim = hd, .attn_scale = 1.0f, .inv_freq = dfreq};
    if (with_norm) random_head_norms(hd, &qn, &kn);
    const float eps = 1e-6f;
    int done = 0;
    for (int fused = 0; fused < 2; fused++) {
        float *dx = dev(x, xb), *dout = dev(NULL, ob);
        kn_kv_layer kv = {.block_size = bs, .n_kv_heads = nkv, .head_dim = hd, .n_blocks = n_blocks,
                          .k_fmt = KN_KVF_BF16, .v_fmt = KN_KVF_BF16};
        kv.k = dev(k16, kb), kv.v = dev(v16, kb);
        const float *dv = dx + (int64_t)(nq + nkv) * hd;
        const kn_attention_args a = {.q = dx, .q_stride = stride, .out = dout, .n_tokens = n, .n_heads = nq,
                                     .scale = 1.0f / sqrtf((float)hd), .window = window, .pos = dpos, .seq = dseq,
                                     .block_tables = dbt, .max_blocks = max_blocks, .kv = &kv, .pos_host = pos,
                                     .seq_host = seq, .compute_dtype = KN_DT_BF16};
        const kn_rope_kv_args r = {dx, dv, stride, n, nq, nkv, hd, dpos, &rt, &kv, dslots, qn, kn, eps};
        if (fused) {
            done = be->vt->rope_kv_attention(be, &r, &a);
        } else {
            if (!(be->vt->rope_kv_write &&
                  be->vt->rope_kv_write(be, dx, dv, stride, n, nq, nkv, hd, dpos, &rt, &kv, dslots, qn, kn, eps))) {
                rope_kv_steps(dx, dv, stride, n, nq, nkv, hd, dpos, &rt, &kv, dslots, qn, kn, eps);
            }
            be->vt->attention(be, &a);
        }
        back(fused ? of : oa, dout, ob); /* back() frees the device buffer */
        back(fused ? kf : ka, kv.k, kb), back(fused ? vf : va, kv.v, kb);
        kn_be_free(be, dx);
        if (fused && !done) break;
    }
    if (done) {
        double mx = 0;
        for (int64_t i = 0; i < n * nq * hd; i++) mx = fabs(oa[i]) > mx ? fabs(oa[i]) : mx;
        for (int64_t i = 0; i < n * nq * hd; i++)
            if (!close_to(of[i], oa[i], mx, 2e-2)) {
                CHECK(0, "rope_kv_attention seqs=%d q=%d kv=%d hd=%d ctx=%d window=%d norm=%d: out[%lld] %g, separate ops %g",
                      n_seqs, nq, nkv, hd, ctx, window, with_norm, (long long)i, of[i], oa[i]);
                break;
            }
        for (int64_t i = 0; i < n_el; i++) {
            const int64_t slot = i / slot_w;
            int fresh = 0;
            for (int t = 0; t < n; t++) fresh |= slot == slots[t];
            const float fk = kn_bf16_to_f32(kf[i]), ak = kn_bf16_to_f32(ka[i]);
            const float fv = kn_bf16_to_f32(vf[i]), av = kn_bf16_to_f32(va[i]);
            const int same = fresh ? close_to(fk, ak, 4.0, 2e-2) && fv == av : kf[i] == ka[i] && vf[i] == va[i];
            if (!same) {
                CHECK(0, "rope_kv_attention seqs=%d hd=%d norm=%d: cache slot %lld (%s) k %g / %g, v %g / %g", n_seqs, hd,
                      with_norm, (long long)slot, fresh ? "new row" : "old row", fk, ak, fv, av);
                break;
            }
        }
    }
    if (with_norm) kn_be_free(be, qn), kn_be_free(be, kn);
    kn_be_free(be, dfreq), kn_be_free(be, dpos), kn_be_free(be, dseq), kn_be_free(be, dslots), kn_be_free(be, dbt);
    free(x), free(oa), free(of), free(rows), free(k16), free(v16), free(ka), free(va), free(kf), free(vf), free(bt);
}

/* Two sequences with shuffled block tables; tokens of both in one call. */
/* Queries: the last q0 positions of sequence 0 and the last 2 of sequence 1.
 * With host mirrors (q0 long enough) a backend may take its GEMM path, in
 * compute_dtype (BF16 rounds q/k/v/probabilities: looser tolerance). */
static void test_attention_q(int n_heads, int n_kv, int hd, int len0, int len1, int window, int q0, int compute_dtype,
                             float softcap, int kv_fmt) {
    const int bs = 16;
    int nb0 = (len0 + bs - 1) / bs, nb1 = (len1 + bs - 1) / bs, nblocks = nb0 + nb1 + 3;
    int max_blocks = nb0 > nb1 ? nb0 : nb1;
    int64_t slot_w = (int64_t)n_kv * hd;
    kn_kv_layer kv = {.block_size = bs, .n_kv_heads = n_kv, .head_dim = hd, .n_blocks = nblocks,
                      .k_fmt = kv_fmt, .v_fmt = kv_fmt};
    kv.k = malloc((size_t)nblocks * bs * slot_w * 4);
    kv.v = malloc((size_t)nblocks * bs * slot_w * 4);
    fill(kv.k, nblocks * bs * slot_w, 1.0f);
    fill(kv.v, nblocks * bs * slot_w, 1.0f);
    /* bf16 rows: the cache holds the rounded values, the reference reads them widened */
    const int64_t n_kv_el = (int64_t)nblocks * bs * slot_w;
    uint16_t *k16 = kv_fmt == KN_KVF_BF16 ? malloc((size_t)n_kv_el * 2) : NULL;
    uint16_t *v16 = kv_fmt == KN_KVF_BF16 ? malloc((size_t)n_kv_el * 2) : NULL;
    for (int64_t i = 0; k16 && i < n_kv_el; i++) {
        k16[i] = kn_f32_to_bf16(((float *)kv.k)[i]), ((float *)kv.k)[i] = kn_bf16_to_f32(k16[i]);
        v16[i] = kn_f32_to_bf16(((float *)kv.v)[i]), ((float *)kv.v)[i] = kn_bf16_to_f32(v16[i]);
    }
    int32_t *bt = calloc((size_t)2 * max_blocks, 4);
    /* blocks assigned in a scrambled order across both sequences */
    int next = nblocks - 1;
    for (int i = 0; i < max_blocks; i++) {
        if (i < nb0) bt[i] = next--;
        if (i < nb1) bt[max_blocks + i] = next--;
    }
    int n_tok = q0 + 2;
    int32_t *pos = malloc((size_t)n_tok * 4), *seq = malloc((size_t)n_tok * 4);
    for (int i = 0; i < q0; i++) pos[i] = len0 - q0 + i, seq[i] = 0;
    pos[q0] = len1 - 2, pos[q0 + 1] = len1 - 1, seq[q0] = seq[q0 + 1] = 1;
    int64_t qs = (int64_t)n_heads * hd + 7;
    float *q = malloc((size_t)(n_tok * qs) * 4), *out = malloc((size_t)n_tok * n_heads * hd * 4);
    fill(q, n_tok * qs, 1.0f);
    poison(out, (int64_t)n_tok * n_heads * hd);
    float scale = 1.0f / sqrtf((float)hd);
    size_t kvb = (size_t)nblocks * bs * slot_w * (k16 ? 2 : 4);
    kn_kv_layer dkv = kv;
    dkv.k = dev(k16 ? (void *)k16 : kv.k, kvb), dkv.v = dev(v16 ? (void *)v16 : kv.v, kvb);
    free(k16), free(v16);
    float *dq = dev(q, (size_t)(n_tok * qs) * 4), *dout = dev(out, (size_t)n_tok * n_heads * hd * 4);
    int32_t *dpos = dev(pos, (size_t)n_tok * 4), *dseq = dev(seq, (size_t)n_tok * 4), *dbt = dev(bt, (size_t)2 * max_blocks * 4);
    kn_attention_args a = {.q = dq, .q_stride = qs, .out = dout, .n_tokens = n_tok, .n_heads = n_heads, .scale = scale,
                           .window = window, .pos = dpos, .seq = dseq, .block_tables = dbt, .max_blocks = max_blocks, .kv = &dkv,
                           .pos_host = pos, .seq_host = seq, .compute_dtype = compute_dtype, .softcap = softcap};
    /* bf16 compute rounds q (and, on the GEMM paths, k/v) and the probabilities */
    const double tol = compute_dtype == KN_DT_F32 ? 1e-5 : kv_fmt == KN_KVF_BF16 ? 1e-2 : 3e-2;
    be->vt->attention(be, &a);
    back(out, dout, (size_t)n_tok * n_heads * hd * 4);
    kn_be_free(be, dkv.k), kn_be_free(be, dkv.v), kn_be_free(be, dq), kn_be_free(be, dpos), kn_be_free(be, dseq),
        kn_be_free(be, dbt);
    double *sc = malloc((size_t)(len0 > len1 ? len0 : len1) * sizeof(double));
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_heads; h++) {
            int kvh = h / (n_heads / n_kv), p = pos[t], lo = window ? (p - window + 1 > 0 ? p - window + 1 : 0) : 0;
            const int32_t *row = bt + seq[t] * max_blocks;
            double mx = -1e300, sum = 0;
            for (int j = lo; j <= p; j++) {
                const float *k = (const float *)kv.k + ((int64_t)row[j / bs] * bs + j % bs) * slot_w + kvh * hd;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[t * qs + h * hd + d] * k[d];
                sc[j] = s * scale;
                if (softcap > 0) sc[j] = softcap * tanh(sc[j] / softcap);
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = lo; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int d = 0; d < hd; d++) {
                double ref = 0;
                for (int j = lo; j <= p; j++)
                    ref += sc[j] / sum * ((const float *)kv.v)[((int64_t)row[j / bs] * bs + j % bs) * slot_w + kvh * hd + d];
                float got = out[((int64_t)t * n_heads + h) * hd + d];
                if (!close_to(got, ref, 1.0, tol)) {
                    CHECK(0, "attention heads=%d/%d hd=%d len=%d/%d window=%d q0=%d dt=%d softcap=%g kv=%d [t%d h%d d%d]: got %g want %g",
                          n_heads, n_kv, hd, len0, len1, window, q0, compute_dtype, softcap, kv_fmt, t, h, d, got, ref);
                    goto done;
                }
            }
        }
done:
    free(sc), free(kv.k), free(kv.v), free(bt), free(q), free(out), free(pos), free(seq);
}

static void test_attention(int n_heads, int n_kv, int hd, int len0, int len1, int window, float softcap) {
    test_attention_q(n_heads, n_kv, hd, len0, len1, window, 3, KN_DT_F32, softcap, KN_KVF_F32);
}

static void test_swiglu_softmax_embed(void) {
    int rows = 7, dim = 37;
    float *gu = malloc((size_t)rows * 2 * dim * 4), *out = malloc((size_t)rows * dim * 4);
    fill(gu, rows * 2 * dim, 6.0f);
    poison(out, rows * dim);
    float *dgu = dev(gu, (size_t)rows * 2 * dim * 4), *dout = dev(out, (size_t)rows * dim * 4);
    be->vt->swiglu(be, dgu, rows, dim, dout);
    back(out, dout, (size_t)rows * dim * 4);
    kn_be_free(be, dgu);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++) {
            double g = gu[r * 2 * dim + j], u = gu[r * 2 * dim + dim + j], ref = g / (1 + exp(-g)) * u;
            CHECK(close_to(out[r * dim + j], ref, fabs(ref), 1e-6), "swiglu [%d,%d]: got %g want %g", r, j,
                  out[r * dim + j], ref);
        }
    float sm[3 * 50];
    fill(sm, 150, 20.0f);
    float orig[150];
    memcpy(orig, sm, sizeof sm);
    float *dsm = dev(sm, sizeof sm);
    be->vt->softmax(be, dsm, 3, 50);
    back(sm, dsm, sizeof sm);
    for (int r = 0; r < 3; r++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < 50; j++) mx = orig[r * 50 + j] > mx ? orig[r * 50 + j] : mx;
        for (int j = 0; j < 50; j++) sum += exp(orig[r * 50 + j] - mx);
        for (int j = 0; j < 50; j++) {
            double ref = exp(orig[r * 50 + j] - mx) / sum;
            CHECK(close_to(sm[r * 50 + j], ref, ref, 1e-5), "softmax [%d,%d]: got %g want %g", r, j, sm[r * 50 + j], ref);
        }
    }
    /* embed from bf16 table, and ids out of range are zero rows, not reads out of bounds */
    uint16_t table[5 * 4];
    for (int i = 0; i < 20; i++) table[i] = kn_f32_to_bf16((float)i * 0.25f);
    kn_weight t;
    kn_error err = {0};
    CHECK(kn_be_weight_load(be, KN_DT_BF16, 5, 4, table, 0, &t, &err) == KN_OK, "embed table: %s", err.msg);
    int32_t ids[3] = {4, 0, 9};
    float e[12];
    poison(e, 12);
    int32_t *dids = dev(ids, sizeof ids);
    float *de = dev(e, sizeof e);
    be->vt->embed(be, &t, dids, 3, de);
    back(e, de, sizeof e);
    kn_be_free(be, dids);
    kn_be_weight_free(be, &t);
    for (int j = 0; j < 4; j++) {
        CHECK(e[j] == (16 + j) * 0.25f, "embed row 4");
        CHECK(e[4 + j] == j * 0.25f, "embed row 0");
        CHECK(e[8 + j] == 0.0f, "embed out-of-range id must give zeros");
    }
    free(gu), free(out);
}

static double gelu_ref(double v, int approx) {
    if (approx == KN_GELU_TANH) return 0.5 * v * (1 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    return 0.5 * v * (1 + erf(v / sqrt(2.0)));
}

static void test_layer_norm(int rows, int dim, int affine) {
    int64_t stride = dim + 5;
    size_t nb = (size_t)(rows * stride) * 4;
    float *x = malloc(nb), *out = malloc(nb), *w = malloc((size_t)dim * 4), *b = malloc((size_t)dim * 4);
    fill(x, rows * stride, 3.0f);
    for (int64_t i = 0; i < rows * stride; i++) x[i] += 2.0f; /* nonzero mean */
    fill(w, dim, 1.0f);
    fill(b, dim, 0.5f);
    poison(out, rows * stride);
    float *dx = dev(x, nb), *dout = dev(out, nb), *dw = dev(w, (size_t)dim * 4), *db = dev(b, (size_t)dim * 4);
    be->vt->layer_norm(be, dx, stride, dout, stride, rows, dim, affine ? dw : NULL, affine ? db : NULL, 1e-5f);
    back(out, dout, nb);
    kn_be_free(be, dx), kn_be_free(be, dw), kn_be_free(be, db);
    for (int r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int j = 0; j < dim; j++) mean += x[r * stride + j];
        mean /= dim;
        for (int j = 0; j < dim; j++) var += (x[r * stride + j] - mean) * (x[r * stride + j] - mean);
        var /= dim;
        for (int j = 0; j < dim; j++) {
            double v = (x[r * stride + j] - mean) / sqrt(var + 1e-5);
            double ref = affine ? w[j] * v + b[j] : v;
            if (!close_to(out[r * stride + j], ref, fabs(v) + 1, 2e-6)) {
                CHECK(0, "layer_norm rows=%d dim=%d affine=%d [%d,%d]: got %g want %g", rows, dim, affine, r, j,
                      out[r * stride + j], ref);
                goto done;
            }
        }
    }
done:
    free(x), free(out), free(w), free(b);
}

static void test_gelu_geglu(int approx) {
    int rows = 5, dim = 301;
    int64_t n = (int64_t)rows * dim;
    float *x = malloc((size_t)n * 2 * 4), *out = malloc((size_t)n * 4);
    fill(x, 2 * n, 8.0f);
    poison(out, n);
    float *dx = dev(x, (size_t)n * 2 * 4), *dout = dev(out, (size_t)n * 4);
    be->vt->gelu(be, dx, n, dout, approx);
    back(out, dout, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        double ref = gelu_ref(x[i], approx);
        if (!close_to(out[i], ref, fabs(x[i]), 1e-6)) {
            CHECK(0, "gelu approx=%d x=%g: got %g want %g", approx, x[i], out[i], ref);
            break;
        }
    }
    poison(out, n);
    dout = dev(out, (size_t)n * 4);
    be->vt->geglu(be, dx, rows, dim, dout, approx);
    back(out, dout, (size_t)n * 4);
    kn_be_free(be, dx);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++) {
            double g = x[r * 2 * dim + j], u = x[r * 2 * dim + dim + j], ref = gelu_ref(g, approx) * u;
            if (!close_to(out[r * dim + j], ref, fabs(g * u), 1e-6)) {
                CHECK(0, "geglu approx=%d [%d,%d]: got %g want %g", approx, r, j, out[r * dim + j], ref);
                r = rows;
                break;
            }
        }
    free(x), free(out);
}

static void test_argmax(void) {
    int rows = 6, dim = 1000;
    float *x = malloc((size_t)rows * dim * 4);
    fill(x, (int64_t)rows * dim, 5.0f);
    x[0 * dim + 999] = 50.0f;                       /* last element wins */
    x[1 * dim + 0] = 50.0f;                         /* first element wins */
    x[2 * dim + 400] = x[2 * dim + 700] = 50.0f;    /* tie: the lower index */
    x[3 * dim + 10] = NAN, x[3 * dim + 20] = 50.0f; /* NaN never wins */
    for (int j = 0; j < dim; j++) x[4 * dim + j] = -INFINITY;
    int32_t want[6] = {999, 0, 400, 20, 0, -1};
    {
        int best = 0;
        for (int j = 1; j < dim; j++)
            if (x[5 * dim + j] > x[5 * dim + best]) best = j;
        want[5] = best;
    }
    int32_t got[6] = {-7, -7, -7, -7, -7, -7};
    float *dx = dev(x, (size_t)rows * dim * 4);
    int32_t *dout = dev(got, sizeof got);
    be->vt->argmax_rows(be, dx, rows, dim, dout);
    kn_be_sync(be);
    kn_be_download(be, got, dout, sizeof got);
    kn_be_free(be, dx), kn_be_free(be, dout);
    for (int r = 0; r < rows; r++) CHECK(got[r] == want[r], "argmax row %d: got %d want %d", r, got[r], want[r]);
    free(x);
}

/* vocabulary-wide rows (CUDA: the split kernel, blocks of
 * 4,096, the rows' maxima in different blocks, a tie across blocks) */
static void test_argmax_wide(void) {
    const int rows = 4, dim = 151939; /* not a multiple of 4 or of a block */
    float *x = malloc((size_t)rows * dim * 4);
    fill(x, (int64_t)rows * dim, 5.0f);
    x[0 * (size_t)dim + dim - 1] = 60.0f;                          /* the last element */
    x[1 * (size_t)dim + 20000] = x[1 * (size_t)dim + 90000] = 60.0f; /* a tie across blocks: the lower */
    x[1 * (size_t)dim + 20001] = NAN;
    for (int j = 0; j < dim; j++) x[2 * (size_t)dim + j] = j % 7 == 0 ? NAN : -INFINITY;
    int32_t want[4] = {dim - 1, 20000, 0, 0};
    for (int j = 1; j < dim; j++)
        if (x[3 * (size_t)dim + j] > x[3 * (size_t)dim + want[3]]) want[3] = j;
    int32_t got[4] = {-7, -7, -7, -7};
    float *dx = dev(x, (size_t)rows * dim * 4);
    int32_t *dout = dev(got, sizeof got);
    for (int rep = 0; rep < 2; rep++) { /* twice: the split kernel's counts must be back at zero */
        be->vt->argmax_rows(be, dx, rows, dim, dout);
        kn_be_sync(be);
        kn_be_download(be, got, dout, sizeof got);
        for (int r = 0; r < rows; r++) CHECK(got[r] == want[r], "argmax wide row %d: got %d want %d", r, got[r], want[r]);
    }
    be->vt->argmax_rows(be, dx + dim, 1, dim, dout); /* one row */
    kn_be_sync(be);
    kn_be_download(be, got, dout, sizeof(int32_t));
    CHECK(got[0] == want[1], "argmax wide, one row: got %d want %d", got[0], want[1]);
    kn_be_free(be, dx), kn_be_free(be, dout);
    free(x);
}

/* ---- model families ops ---- */

static void test_softcap_scale_gate(void) {
    const int64_t n = 1001;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    fill(x, n, 20.0f);
    float *dx = dev(x, n * 4);
    be->vt->softcap(be, dx, n, 3.0f);
    back(y, dx, n * 4);
    for (int64_t i = 0; i < n; i++)
        if (!close_to(y[i], 3.0 * tanh(x[i] / 3.0), 3.0, 1e-6)) {
            CHECK(0, "softcap at %lld: got %g want %g", (long long)i, y[i], 3.0 * tanh(x[i] / 3.0));
            break;
        }
    dx = dev(x, n * 4);
    be->vt->scale(be, dx, n, 0.22f);
    back(y, dx, n * 4);
    for (int64_t i = 0; i < n; i++)
        if (!close_to(y[i], x[i] * (double)0.22f, fabs(x[i]), 1e-7)) {
            CHECK(0, "scale at %lld: got %g want %g", (long long)i, y[i], x[i] * 0.22);
            break;
        }
    const int rows = 7, dim = 33;
    float *yy = malloc(rows * dim * 4), *xx = malloc(rows * dim * 4), *g = malloc(rows * 4), *out = malloc(rows * dim * 4);
    fill(yy, rows * dim, 1.0f), fill(xx, rows * dim, 1.0f), fill(g, rows, 4.0f);
    float *dy = dev(yy, rows * dim * 4), *dxx = dev(xx, rows * dim * 4), *dg = dev(g, rows * 4);
    be->vt->sigmoid_gate_add(be, dy, dxx, dg, rows, dim);
    back(out, dy, rows * dim * 4);
    kn_be_free(be, dxx), kn_be_free(be, dg);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++) {
            double ref = yy[r * dim + j] + xx[r * dim + j] / (1.0 + exp(-(double)g[r]));
            if (!close_to(out[r * dim + j], ref, 2.0, 1e-6)) {
                CHECK(0, "sigmoid_gate_add [%d,%d]: got %g want %g", r, j, out[r * dim + j], ref);
                r = rows;
                break;
            }
        }
    free(x), free(y), free(yy), free(xx), free(g), free(out);
}

/* softmax over experts, top-k (descending), optional renormalisation */
static void ref_route(const float *l, int E, int k, int norm, int32_t *idx, double *w) {
    double mx = -1e300, sum = 0, p[1024];
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) sum += (p[e] = exp(l[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[j] = best, w[j] = p[best];
    }
    if (norm) {
        double s = 0;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
}

/* ties: logits rounded to integers, so many experts tie and the lower id must win */
static void test_moe_route(int rows, int E, int k, int norm, int scaled, int ties) {
    float *l = malloc((size_t)rows * E * 4), *w = malloc((size_t)rows * k * 4), *es = malloc((size_t)E * 4);
    int32_t *idx = malloc((size_t)rows * k * 4), ridx[64];
    double rw[64];
    fill(l, (int64_t)rows * E, 4.0f);
    if (ties)
        for (int64_t i = 0; i < (int64_t)rows * E; i++) l[i] = rintf(l[i]);
    for (int e = 0; e < E; e++) es[e] = 0.5f + fabsf(kn_test_rand(&seed));
    float *dl = dev(l, (size_t)rows * E * 4), *dw = dev(NULL, (size_t)rows * k * 4), *des = dev(es, (size_t)E * 4);
    int32_t *di = dev(NULL, (size_t)rows * k * 4);
    be->vt->moe_route(be, dl, rows, E, k, norm, scaled ? des : NULL, di, dw);
    back(w, dw, (size_t)rows * k * 4);
    back(idx, di, (size_t)rows * k * 4);
    kn_be_free(be, dl), kn_be_free(be, des);
    for (int r = 0; r < rows; r++) {
        ref_route(l + (size_t)r * E, E, k, norm, ridx, rw);
        if (scaled)
            for (int j = 0; j < k; j++) rw[j] *= es[ridx[j]];
        for (int j = 0; j < k; j++)
            if (idx[r * k + j] != ridx[j] || !close_to(w[r * k + j], rw[j], rw[j], 1e-5)) {
                CHECK(0, "moe_route rows=%d E=%d k=%d norm=%d [%d,%d]: got %d/%g want %d/%g", rows, E, k, norm, r, j,
                      idx[r * k + j], w[r * k + j], ridx[j], rw[j]);
                r = rows;
                break;
            }
    }
    free(l), free(w), free(idx), free(es);
}

static void test_mul_rows(void) {
    const int rows = 5, dim = 7, xs = 19;
    float *y = malloc(rows * dim * 4), *x = malloc(rows * xs * 4), *out = malloc(rows * dim * 4);
    fill(y, rows * dim, 2.0f), fill(x, rows * xs, 2.0f);
    float *dy = dev(y, rows * dim * 4), *dx = dev(x, rows * xs * 4);
    be->vt->mul_rows(be, dy, dx + 3, xs, rows, dim);
    back(out, dy, rows * dim * 4);
    kn_be_free(be, dx);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++)
            if (!close_to(out[r * dim + j], (double)y[r * dim + j] * x[r * xs + 3 + j], 4.0, 1e-7)) {
                CHECK(0, "mul_rows [%d,%d]: got %g", r, j, out[r * dim + j]);
                r = rows;
                break;
            }
    free(y), free(x), free(out);
}

/* gemma3n ops: AltUp stream mixing (every combination of weights / base /
 * w_add the model uses), magnitude matching, gaussian top-k */
static void test_gemma3n_ops(int rows, int dim) {
    const int K = 4;
    const int64_t ss = (int64_t)rows * dim + 5, tot = K * ss; /* streams padded apart */
    float *src = malloc(tot * 4), *base = malloc(tot * 4), *w = malloc((size_t)rows * K * K * 4), *out = malloc(tot * 4);
    fill(src, tot, 2.0f), fill(base, tot, 2.0f), fill(w, rows * K * K, 1.0f);
    static const struct { int n_src, n_out, has_w, has_base; float w_add; } cases[] = {
        {4, 4, 1, 1, 0.0f}, {1, 4, 1, 1, 1.0f}, {1, 1, 0, 1, -1.0f}, {1, 1, 0, 0, 1.0f}};
    for (int ci = 0; ci < 4; ci++) {
        const int ns = cases[ci].n_src, no = cases[ci].n_out;
        float *ds = dev(src, tot * 4), *db = dev(base, tot * 4), *dw = dev(w, (size_t)rows * K * K * 4);
        float *dout = dev(NULL, tot * 4);
        poison(out, tot);
        kn_be_upload(be, dout, out, tot * 4);
        be->vt->stream_mix(be, ds, ns, cases[ci].has_base ? db : NULL, dout, no, ss, cases[ci].has_w ? dw : NULL,
                           cases[ci].w_add, rows, dim);
        back(out, dout, tot * 4);
        kn_be_free(be, ds), kn_be_free(be, db), kn_be_free(be, dw);
        int bad = 0;
        for (int c = 0; c < no && !bad; c++)
            for (int t = 0; t < rows && !bad; t++)
                for (int j = 0; j < dim && !bad; j++) {
                    double ref = cases[ci].has_base ? base[c * ss + (int64_t)t * dim + j] : 0.0;
                    for (int a = 0; a < ns; a++)
                        ref += ((cases[ci].has_w ? (double)w[((int64_t)t * no + c) * ns + a] : 0.0) + cases[ci].w_add) *
                               src[a * ss + (int64_t)t * dim + j];
                    if (!close_to(out[c * ss + (int64_t)t * dim + j], ref, 16.0, 1e-6)) {
                        CHECK(0, "stream_mix case %d [%d,%d,%d]: got %g want %g", ci, c, t, j,
                              out[c * ss + (int64_t)t * dim + j], ref);
                        bad = 1;
                    }
                }
    }
    /* rms_match: rows of x rescaled to ref's rms; one row of tiny values hits the floor */
    float *x = malloc((size_t)rows * dim * 4), *ref = malloc((size_t)rows * dim * 4), *xo = malloc((size_t)rows * dim * 4);
    fill(x, rows * dim, 3.0f), fill(ref, rows * dim, 0.5f);
    for (int j = 0; j < dim; j++) x[j] *= 1e-4f;
    float *dx = dev(x, (size_t)rows * dim * 4), *dr = dev(ref, (size_t)rows * dim * 4);
    be->vt->rms_match(be, dx, dr, rows, dim, 1e-5f);
    back(xo, dx, (size_t)rows * dim * 4);
    kn_be_free(be, dr);
    for (int r = 0; r < rows; r++) {
        double sx = 0, sr = 0;
        for (int j = 0; j < dim; j++) sx += (double)x[r * dim + j] * x[r * dim + j], sr += (double)ref[r * dim + j] * ref[r * dim + j];
        double mag = sqrt(sx / dim > 1e-5 ? sx / dim : 1e-5), k = sqrt(sr / dim) / mag;
        for (int j = 0; j < dim; j++)
            if (!close_to(xo[r * dim + j], x[r * dim + j] * k, fabs(x[r * dim + j] * k) + 1e-3, 1e-5)) {
                CHECK(0, "rms_match [%d,%d]: got %g want %g", r, j, xo[r * dim + j], x[r * dim + j] * k);
                r = rows;
                break;
            }
    }
    /* gaussian_topk on the gate half of [rows, 2*dim] rows */
    float *g = malloc((size_t)rows * 2 * dim * 4), *go = malloc((size_t)rows * 2 * dim * 4);
    fill(g, (int64_t)rows * 2 * dim, 2.0f);
    const float mult = 1.6448536f; /* 0.95 quantile */
    float *dg = dev(g, (size_t)rows * 2 * dim * 4);
    be->vt->gaussian_topk(be, dg, 2 * (int64_t)dim, rows, dim, mult);
    back(go, dg, (size_t)rows * 2 * dim * 4);
    int kept = 0;
    for (int r = 0; r < rows; r++) {
        const float *gr = g + (int64_t)r * 2 * dim;
        double mean = 0, var = 0;
        for (int j = 0; j < dim; j++) mean += gr[j];
        mean /= dim;
        for (int j = 0; j < dim; j++) var += (gr[j] - mean) * (gr[j] - mean);
        double cut = mean + sqrt(var / dim) * mult;
        for (int j = 0; j < 2 * dim; j++) {
            double want = j < dim ? (gr[j] - cut > 0 ? gr[j] - cut : 0.0) : gr[j];
            kept += j < dim && want > 0;
            if (!close_to(go[(int64_t)r * 2 * dim + j], want, 4.0, 1e-6)) {
                CHECK(0, "gaussian_topk [%d,%d]: got %g want %g", r, j, go[(int64_t)r * 2 * dim + j], want);
                r = rows;
                break;
            }
        }
    }
    CHECK(kept > 0 && kept < rows * dim / 4, "gaussian_topk kept %d of %d gate values", kept, rows * dim);
    free(src), free(base), free(w), free(out), free(x), free(ref), free(xo), free(g), free(go);
}

static double act_ref(double g, int act) {
    if (act == KN_ACT_SILU) return g / (1.0 + exp(-g));
    return gelu_ref(g, act == KN_ACT_GELU_TANH ? KN_GELU_TANH : KN_GELU_ERF);
}

/* bits > 0: MLX-quantized expert stacks (scales/biases in dt; a stack whose
 * columns do not split into groups of gs stays float, as switch_mlp keeps it).
 * fuse: MOE_NORM the op applies the RMSNorm, MOE_ACC it adds into out
 * (MOE_ALIAS: out is x, the residual stream), MOE_ROUTE it routes router
 * logits itself (normalized top-k, expert scales) and writes idx / w */
enum { MOE_NORM = 1, MOE_ACC = 2, MOE_ALIAS = 4, MOE_ROUTE = 8 };
static void test_moe_ffn_f(kn_dtype dt, int n, int E, int k, int dim, int inter, int act, int bits, int gs, int fuse) {
    size_t esz = kn_dtype_size(dt);
    int64_t ngu = (int64_t)E * 2 * inter * dim, ndn = (int64_t)E * dim * inter;
    void *gu_raw = malloc((size_t)ngu * esz), *dn_raw = malloc((size_t)ndn * esz);
    float *guf = malloc((size_t)ngu * 4), *dnf = malloc((size_t)ndn * 4);
    for (int64_t i = 0; i < ngu + ndn; i++) {
        float v = kn_test_rand(&seed) * 0.3f;
        void *raw = i < ngu ? gu_raw : dn_raw;
        int64_t j = i < ngu ? i : i - ngu;
        if (dt == KN_DT_F32) ((float *)raw)[j] = v;
        else if (dt == KN_DT_BF16) ((uint16_t *)raw)[j] = kn_f32_to_bf16(v);
        else ((uint16_t *)raw)[j] = kn_f32_to_f16(v);
        (i < ngu ? guf : dnf)[j] = kn_load_f32(raw, dt, j);
    }
    kn_weight gu, dn;
    kn_error err = {0};
    const int q_gu = bits && dim % gs == 0, q_dn = bits && inter % gs == 0;
    for (int which = 0; which < 2; which++) {
        const int64_t rows = which ? (int64_t)E * dim : (int64_t)E * 2 * inter, cols = which ? inter : dim;
        kn_weight *dst = which ? &dn : &gu;
        if (which ? q_dn : q_gu) { /* the float reference becomes the dequantized values */
            double *wd = malloc((size_t)(rows * cols) * sizeof(double));
            kn_quant_host h;
            quant_random(bits, gs, (int)rows, (int)cols, dt, wd, &h);
            for (int64_t i = 0; i < rows * cols; i++) (which ? dnf : guf)[i] = (float)wd[i];
            CHECK(kn_be_weight_load_quant(be, &h, dst, &err) == KN_OK, "%s", err.msg);
            quant_host_free(&h);
            free(wd);
        } else {
            CHECK(kn_be_weight_load(be, dt, rows, cols, which ? dn_raw : gu_raw, 0, dst, &err) == KN_OK, "%s", err.msg);
        }
    }
    float *x = malloc((size_t)n * dim * 4), *w = malloc((size_t)n * k * 4), *out = malloc((size_t)n * dim * 4);
    float *out0 = malloc((size_t)n * dim * 4), *nw = malloc((size_t)dim * 4);
    double *xr = malloc((size_t)n * dim * sizeof(double)); /* what the experts see */
    int32_t *idx = malloc((size_t)n * k * 4);
    /* The random quantized weights are not centred (codes 0..2^bits-1 times
     * scales up to 0.05, plus biases of +-0.2: a mean near 3 at 8 bits), so at
     * unit-scale x the gate/up sums reach hundreds and their products ~1e5.
     * Where the down projection's weights are dense F16, x is rounded to F16
     * (max 65504) as an F16 model's would be: there x, and the norm weight
     * that sets x's scale after the RMSNorm, are scaled down so the
     * activations stay inside F16's range whatever the random draws. */
    const float xscale = dt == KN_DT_F16 && bits ? 0.1f : 1.0f;
    fill(x, (int64_t)n * dim, xscale);
    fill(nw, dim, 1.5f * xscale);
    const float eps = 1e-5f;
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int c = 0; c < dim; c++) ss += (double)x[t * dim + c] * x[t * dim + c];
        const double inv = 1.0 / sqrt(ss / dim + eps);
        for (int c = 0; c < dim; c++) xr[t * dim + c] = fuse & MOE_NORM ? x[t * dim + c] * inv * nw[c] : x[t * dim + c];
    }
    float *logits = malloc((size_t)n * E * 4), *es = malloc((size_t)E * 4);
    double *rw = malloc((size_t)k * sizeof(double));
    fill(logits, (int64_t)n * E, 4.0f);
    for (int e = 0; e < E; e++) es[e] = 0.5f + fabsf(kn_test_rand(&seed));
    for (int t = 0; t < n; t++) /* k distinct experts per token: scattered, or routed from the logits */
        for (int j = 0; j < k; j++) {
            if (fuse & MOE_ROUTE) {
                if (j == 0) ref_route(logits + (size_t)t * E, E, k, 1, idx + (size_t)t * k, rw);
                w[t * k + j] = (float)(rw[j] * es[idx[t * k + j]]);
                continue;
            }
            idx[t * k + j] = (t * 5 + j * 3 + (j * j)) % E;
            for (int i = 0; i < j; i++)
                if (idx[t * k + i] == idx[t * k + j]) { idx[t * k + j] = (idx[t * k + j] + 1) % E; i = -1; }
            w[t * k + j] = 0.1f + fabsf(kn_test_rand(&seed));
        }
    if (fuse & MOE_ALIAS) memcpy(out0, x, (size_t)n * dim * 4);
    else if (fuse & MOE_ACC) fill(out0, (int64_t)n * dim, 2.0f);
    else poison(out0, (int64_t)n * dim);
    float *dx = dev(x, (size_t)n * dim * 4), *dw = dev(w, (size_t)n * k * 4), *dnw = dev(nw, (size_t)dim * 4);
    float *dout = fuse & MOE_ALIAS ? dx : dev(out0, (size_t)n * dim * 4);
    float *dscr = dev(NULL, kn_moe_scratch_floats(n, dim, inter, k) * 4);
    int32_t *didx = dev(idx, (size_t)n * k * 4);
    float *dl = dev(logits, (size_t)n * E * 4), *des = dev(es, (size_t)E * 4);
    kn_moe_args a = {.x = dx, .out = dout, .n_tokens = n, .dim = dim, .inter = inter, .n_experts = E, .k = k,
                     .act = act, .idx = didx, .w = dw, .gate_up = &gu, .down = &dn, .scratch = dscr,
                     .norm_w = fuse & MOE_NORM ? dnw : NULL, .eps = eps, .accumulate = !!(fuse & MOE_ACC)};
    if (fuse & MOE_ROUTE) { /* idx / w become outputs: poisoned first */
        int32_t *bad = malloc((size_t)n * k * 4);
        float *badw = malloc((size_t)n * k * 4);
        for (int i = 0; i < n * k; i++) bad[i] = -1, badw[i] = NAN;
        kn_be_upload(be, didx, bad, (size_t)n * k * 4), kn_be_upload(be, dw, badw, (size_t)n * k * 4);
        free(bad), free(badw);
        a.logits = dl, a.norm_topk = 1, a.expert_scale = des;
    }
    be->vt->moe_ffn(be, &a);
    if (fuse & MOE_ROUTE) { /* the routing the op wrote */
        int32_t *gi = malloc((size_t)n * k * 4);
        float *gw = malloc((size_t)n * k * 4);
        back(gi, didx, (size_t)n * k * 4), back(gw, dw, (size_t)n * k * 4); /* frees both */
        didx = NULL, dw = NULL;
        for (int i = 0; i < n * k; i++)
            if (gi[i] != idx[i] || !close_to(gw[i], w[i], w[i], 1e-5)) {
                CHECK(0, "moe_ffn routing n=%d E=%d k=%d [%d]: got %d/%g want %d/%g", n, E, k, i, gi[i], gw[i], idx[i], w[i]);
                break;
            }
        free(gi), free(gw);
    }
    back(out, dout, (size_t)n * dim * 4); /* frees dout */
    if (dout != dx) kn_be_free(be, dx);
    if (dw) kn_be_free(be, dw);
    if (didx) kn_be_free(be, didx);
    kn_be_free(be, dnw), kn_be_free(be, dscr), kn_be_free(be, dl), kn_be_free(be, des);
    free(logits), free(es), free(rw);
    /* per token: each slot's activations h and their magnitudes hm (the
     * sums' magnitudes, so cancellation inside them is allowed for) */
    double *h = malloc((size_t)k * inter * sizeof(double)), *hm = malloc((size_t)k * inter * sizeof(double));
    for (int t = 0; t < n; t++) {
        for (int j = 0; j < k; j++) {
            const int e = idx[t * k + j];
            for (int i = 0; i < inter; i++) {
                double g = 0, u = 0, gm = 0, um = 0;
                for (int c = 0; c < dim; c++) {
                    const double pg = (double)guf[((int64_t)e * 2 * inter + i) * dim + c] * xr[t * dim + c];
                    const double pu = (double)guf[((int64_t)e * 2 * inter + inter + i) * dim + c] * xr[t * dim + c];
                    g += pg, u += pu, gm += fabs(pg), um += fabs(pu);
                }
                h[j * inter + i] = act_ref(g, act) * u;
                hm[j * inter + i] = (gm + fabs(g)) * (fabs(u) + um);
            }
        }
        for (int d = 0; d < dim; d++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < k; j++) {
                const int e = idx[t * k + j];
                const float *dr = dnf + ((int64_t)e * dim + d) * inter;
                double y = 0, ymag = 0;
                for (int i = 0; i < inter; i++) y += dr[i] * h[j * inter + i], ymag += fabs(dr[i]) * hm[j * inter + i];
                ref += w[t * k + j] * y;
                mag += fabs(w[t * k + j]) * ymag + 1.0;
            }
            if (fuse & MOE_ACC) ref += out0[t * dim + d], mag += fabs(out0[t * dim + d]);
            /* quantized: x may be carried to quant_x_rel_error of its group's max (CPU VNNI) */
            if (!close_to(out[t * dim + d], ref, mag, bits && be->quant_x_rel_error > 0 ? 1e-3 : 1e-5)) {
                CHECK(0, "moe_ffn %s q%d n=%d E=%d k=%d dim=%d inter=%d act=%d fuse=%d [%d,%d]: got %g want %g",
                      kn_dtype_name(dt), bits, n, E, k, dim, inter, act, fuse, t, d, out[t * dim + d], ref);
                t = n;
                break;
            }
        }
    }
    kn_be_weight_free(be, &gu), kn_be_weight_free(be, &dn);
    free(gu_raw), free(dn_raw), free(guf), free(dnf), free(x), free(w), free(out), free(idx), free(h);
    free(out0), free(nw), free(xr), free(hm);
}

static void test_moe_ffn_q(kn_dtype dt, int n, int E, int k, int dim, int inter, int act, int bits, int gs) {
    test_moe_ffn_f(dt, n, E, k, dim, inter, act, bits, gs, 0);
}
static void test_moe_ffn(kn_dtype dt, int n, int E, int k, int dim, int inter, int act) {
    test_moe_ffn_f(dt, n, E, k, dim, inter, act, 0, 0, 0);
}

/* whisper: im2col_1d in both input layouts ([c, t] mel and [t, c] rows) */
static void test_im2col(int t_in, int c_in, int k, int stride, int pad, int channel_major) {
    int t_out = (t_in + 2 * pad - k) / stride + 1;
    int64_t cols = (int64_t)c_in * k, n_in = (int64_t)t_in * c_in, n_out = t_out * cols;
    int64_t ts = channel_major ? 1 : c_in, cs = channel_major ? t_in : 1;
    float *x = malloc((size_t)n_in * 4), *out = malloc((size_t)n_out * 4);
    fill(x, n_in, 1.0f);
    poison(out, n_out);
    float *dx = dev(x, (size_t)n_in * 4), *dout = dev(out, (size_t)n_out * 4);
    be->vt->im2col_1d(be, dx, ts, cs, t_in, c_in, k, stride, pad, dout);
    back(out, dout, (size_t)n_out * 4);
    kn_be_free(be, dx);
    for (int t = 0; t < t_out; t++)
        for (int c = 0; c < c_in; c++)
            for (int j = 0; j < k; j++) {
                int src = t * stride + j - pad;
                float want = src >= 0 && src < t_in ? x[src * ts + c * cs] : 0.0f;
                float got = out[t * cols + c * k + j];
                if (!(got == want)) {
                    CHECK(0, "im2col t_in=%d c_in=%d k=%d s=%d p=%d cm=%d at [%d,%d,%d]: got %g want %g", t_in, c_in, k,
                          stride, pad, channel_major, t, c, j, got, want);
                    t = t_out, c = c_in;
                    break;
                }
            }
    free(x), free(out);
}

/* whisper: dense attention (encoder / cross / causal decoder cache) */
/* A kernel the backend cannot run (the CUDA dense attention keeps the scores
 * of one row in shared memory, so n_kv is bounded there) is kept as the
 * backend's error: take_error hands it out once, then reports none. The CPU
 * backend has no bound: it runs the op and keeps no error. */
static void test_launch_error(void) {
    const int n_kv = 9000, hd = 8;
    kn_error err = {0};
    CHECK(kn_be_take_error(be, &err) == KN_OK, "launch error: an error was pending before the check: %s", err.msg);
    float *dq = kn_be_alloc(be, (size_t)hd * 4), *dkv = kn_be_alloc(be, (size_t)n_kv * hd * 4);
    float *dout = kn_be_alloc(be, (size_t)hd * 4);
    kn_dense_attention_args a = {.q = dq, .k = dkv, .v = dkv, .q_stride = hd, .k_stride = hd, .v_stride = hd,
                                 .out = dout, .out_stride = hd, .n_q = 1, .n_kv = n_kv, .n_heads = 1,
                                 .head_dim = hd, .scale = 1.0f, .causal = 0, .q_pos0 = 0};
    be->vt->attention_dense(be, &a);
    kn_be_sync(be);
    const char *name = getenv("KILN_TEST_BACKEND");
    const int gpu = name && strcmp(name, "cuda") == 0;
    const kn_code rc = kn_be_take_error(be, &err);
    if (gpu)
        CHECK(rc == KN_ERR_BACKEND && strstr(err.msg, "attention_dense"),
              "launch error: the refused dense attention was not kept (rc %d: %s)", (int)rc, err.msg);
    else
        CHECK(rc == KN_OK, "launch error: the CPU backend kept an error: %s", err.msg);
    CHECK(kn_be_take_error(be, &err) == KN_OK, "launch error: handed out twice");
    kn_be_free(be, dq), kn_be_free(be, dkv), kn_be_free(be, dout);
}

static void test_attention_dense(int n_q, int n_kv, int n_heads, int hd, int causal, int q_pos0) {
    int D = n_heads * hd;
    int64_t qs = D + 3, ks = 2 * D + 5, vs = D + 1, os = D + 2; /* padded strides */
    float *q = malloc((size_t)n_q * qs * 4), *k = malloc((size_t)n_kv * ks * 4), *v = malloc((size_t)n_kv * vs * 4);
    float *out = malloc((size_t)n_q * os * 4);
    fill(q, n_q * qs, 1.0f), fill(k, n_kv * ks, 1.0f), fill(v, n_kv * vs, 1.0f);
    poison(out, n_q * os);
    float *dq = dev(q, (size_t)n_q * qs * 4), *dk = dev(k, (size_t)n_kv * ks * 4), *dv = dev(v, (size_t)n_kv * vs * 4);
    float *dout = dev(out, (size_t)n_q * os * 4);
    float scale = 1.0f / sqrtf((float)hd) * 2.0f;
    kn_dense_attention_args a = {.q = dq, .k = dk, .v = dv, .q_stride = qs, .k_stride = ks, .v_stride = vs,
                                 .out = dout, .out_stride = os, .n_q = n_q, .n_kv = n_kv, .n_heads = n_heads,
                                 .head_dim = hd, .scale = scale, .causal = causal, .q_pos0 = q_pos0};
    be->vt->attention_dense(be, &a);
    back(out, dout, (size_t)n_q * os * 4);
    kn_be_free(be, dq), kn_be_free(be, dk), kn_be_free(be, dv);
    double *p = malloc(sizeof(double) * (size_t)n_kv);
    int bad = 0;
    for (int i = 0; i < n_q && !bad; i++)
        for (int h = 0; h < n_heads && !bad; h++) {
            int len = causal && q_pos0 + i + 1 < n_kv ? q_pos0 + i + 1 : n_kv;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < len; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[i * qs + h * hd + d] * k[j * ks + h * hd + d];
                p[j] = s * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int j = 0; j < len; j++) sum += (p[j] = exp(p[j] - mx));
            for (int d = 0; d < hd && !bad; d++) {
                double ref = 0;
                for (int j = 0; j < len; j++) ref += p[j] / sum * v[j * vs + h * hd + d];
                if (!close_to(out[i * os + h * hd + d], ref, 1.0, 2e-5)) {
                    bad = 1;
                    CHECK(0, "attention_dense n_q=%d n_kv=%d H=%d hd=%d causal=%d pos0=%d [%d,%d,%d]: got %g want %g",
                          n_q, n_kv, n_heads, hd, causal, q_pos0, i, h, d, out[i * os + h * hd + d], ref);
                }
            }
        }
    free(p), free(q), free(k), free(v), free(out);
}

int main(void) {
    const int brc = kn_test_backend_open("test_ops", 2, &be);
    if (brc) return brc;
    printf("test_ops: backend %s\n", be->vt->name);
    const char *seed_env = getenv("KILN_TEST_SEED"); /* other random draws: the cases must not depend on them */
    if (seed_env && *seed_env) seed = strtoull(seed_env, NULL, 10), printf("test_ops: seed %llu\n", (unsigned long long)seed);
    kn_dtype dts[3] = {KN_DT_F32, KN_DT_BF16, KN_DT_F16};
    int Ms[] = {1, 2, 3, 5, 6, 7, 13, 64}, Ns[] = {1, 15, 16, 17, 64, 100}, Ks[] = {1, 7, 8, 64, 300};
    for (int d = 0; d < 3; d++)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++) test_matmul(dts[d], Ms[a], Ns[b], Ks[c], (a + b + c) % 2);
    test_matmul(KN_DT_BF16, 130, 300, 1030, 1); /* several KC blocks and M tiles */
    for (int d = 0; d < 3; d++) {
        const int rk[] = {8, 40, 96, 1000, 1024, 1030};
        for (size_t i = 0; i < sizeof rk / sizeof *rk; i++) test_matmul_rows_independent(dts[d], 3, 37, rk[i]);
        test_matmul_rows_independent(dts[d], 16, 64, 1000);
    }
    test_cpu_fusions();
    test_cpu_weight_placement();
    for (int m = 1; m <= 2; m++) { /* decode fusions (CUDA GEMV): norm prologue, SwiGLU epilogue, odd N */
        test_fused_matmul(KN_DT_BF16, m, 74, 1024, 1, KN_EPI_NONE, 1);
        test_fused_matmul(KN_DT_F32, m, 37, 520, 1, KN_EPI_NONE, 0);
        test_fused_matmul(KN_DT_F16, m, 90, 4096, 1, KN_EPI_SWIGLU, 0);
        test_fused_matmul(KN_DT_BF16, m, 42, 776, 0, KN_EPI_SWIGLU, 1);
        test_fused_matmul(KN_DT_BF16, m, 40, 12, 1, KN_EPI_NONE, 0); /* K % 8 != 0: may decline */
    }
    test_fused_matmul(KN_DT_BF16, 1, 40, 4096, 1, KN_EPI_NONE, 1); /* CUDA: a whole row's loads in flight */
    test_fused_matmul(KN_DT_F16, 1, 24, 6152, 0, KN_EPI_NONE, 0);
        test_fused_matmul(KN_DT_BF16, 5, 74, 1024, 1, KN_EPI_SWIGLU, 1); /* GEMM-shaped (CUDA: norm+round, cuBLAS) */
    test_fused_matmul(KN_DT_F16, 40, 96, 512, 1, KN_EPI_NONE, 0);
    test_mlp_swiglu_add(KN_DT_BF16, 5, 256, 344, 1, 1); /* prefill-shaped feed-forward (CUDA: bf16 activation) */
    test_mlp_swiglu_add(KN_DT_BF16, 67, 512, 1376, 1, 0);
    test_mlp_swiglu_add(KN_DT_F16, 40, 128, 200, 0, 1);
    test_quant_ops();
    test_rms_norm(1, 1, 64);
    test_rms_norm(5, 4, 32);
    test_rms_norm(3, 1, 4096);
    test_rope(7, 4, 64, 64, 1.0f);
    test_rope(3, 2, 128, 96, 1.2f);
    test_rope(5, 8, 256, 256, 1.0f);
    test_rope_kv_write(1, 32, 8, 128, 128, "bf16", 0); /* decode, GQA 4 */
    test_rope_kv_write(9, 6, 2, 64, 32, "f32", 0);     /* partial rotary, heads not a multiple of 4 */
    test_rope_kv_write(3, 4, 4, 256, 256, "bf16", 0);
    test_rope_kv_write(2, 4, 2, 64, 64, "q8", 0);           /* other formats: may decline */
    test_rope_kv_write(1, 32, 8, 128, 128, "k8v3", 0);      /* compressed decode: one warp per head */
    test_rope_kv_write(5, 8, 2, 64, 64, "tq4", 0);
    test_rope_kv_write(3, 4, 2, 256, 256, "k4v3", 0);
    test_rope_kv_write(4, 8, 2, 128, 64, "k8v3", 0);        /* partial rotary: declined */
    test_rope_kv_write(2, 8, 2, 128, 128, "k8v3", 1);       /* q/k norms: declined */
    test_rope_kv_write(1, 32, 4, 128, 128, "bf16", 1);      /* q/k norms (qwen3): rotary pairs in registers */
    test_rope_kv_write(3, 6, 2, 128, 128, "f32", 1);        /* the same, heads not a multiple of 4 */
    test_rope_kv_write(2, 4, 2, 128, 64, "bf16", 1);        /* partial rotary with norms: through x */
    test_rope_kv_write(2, 4, 2, 64, 64, "bf16", 1);
    test_rope_kv_write(1, 8, 2, 256, 256, "bf16", 1);
    test_rope_kv_attention(1, 32, 4, 128, 150, 0, 1);  /* Qwen3-30B-A3B: q/k norms, GQA 8, splits */
    test_rope_kv_attention(3, 32, 8, 128, 1030, 0, 0); /* Llama-3-8B: three sequences, longer context */
    test_rope_kv_attention(2, 8, 2, 64, 40, 24, 1);    /* head dim 64, a window */
    test_rope_kv_attention(1, 16, 1, 128, 7, 0, 0);    /* 16 heads on one KV head, a short context */
    test_rope_kv_attention(1, 8, 2, 128, 32, 0, 0);    /* the new row first in a warp's tile (the rest masked) */
    int gqa[][2] = {{4, 4}, {8, 2}, {8, 1}, {16, 2}};
    int hds[] = {64, 128, 256};
    for (size_t g = 0; g < 4; g++)
        for (size_t h = 0; h < 3; h++) {
            test_attention(gqa[g][0], gqa[g][1], hds[h], 37, 20, 0, 0.0f);
            test_attention(gqa[g][0], gqa[g][1], hds[h], 300, 17, 16, 0.0f);
        }
    test_attention(4, 2, 64, 2100, 5, 0, 0.0f); /* long context */
    test_attention(8, 2, 64, 37, 20, 0, 1.5f); /* gemma2 soft-capping */
    test_attention(4, 4, 256, 300, 17, 16, 50.0f);
    /* prefill-shaped runs (a backend's GEMM path): exact f32 and bf16 */
    test_attention_q(8, 2, 128, 300, 20, 0, 70, KN_DT_F32, 0.0f, KN_KVF_F32);
    test_attention_q(8, 2, 64, 300, 20, 100, 130, KN_DT_F32, 0.0f, KN_KVF_F32);
    test_attention_q(4, 4, 256, 90, 17, 0, 40, KN_DT_F32, 0.0f, KN_KVF_F32);
    test_attention_q(8, 1, 128, 200, 33, 0, 64, KN_DT_BF16, 0.0f, KN_KVF_F32);
    test_attention_q(16, 2, 64, 120, 5, 48, 100, KN_DT_F16, 0.0f, KN_KVF_F32);
    test_attention_q(8, 2, 64, 100, 20, 0, 50, KN_DT_F32, 1.5f, KN_KVF_F32); /* soft-capping on the GEMM path */
    /* fused tensor-core prefill (CUDA): several 64-query / 64-key tiles, GQA 4, hd 256 with window + softcap */
    test_attention_q(16, 4, 128, 400, 9, 0, 300, KN_DT_BF16, 0.0f, KN_KVF_F32);
    test_attention_q(4, 4, 256, 300, 17, 40, 100, KN_DT_BF16, 30.0f, KN_KVF_F32);
    test_attention_q(8, 2, 64, 300, 20, 100, 130, KN_DT_F16, 0.0f, KN_KVF_F32);
    test_swiglu_softmax_embed();
    test_layer_norm(1, 64, 1);
    test_layer_norm(6, 384, 1);
    test_layer_norm(3, 1280, 0);
    test_layer_norm(2, 5, 1);
    test_argmax();
    test_argmax_wide();
    test_gelu_geglu(KN_GELU_ERF);
    test_gelu_geglu(KN_GELU_TANH);
    test_softcap_scale_gate();
    test_moe_route(1, 8, 2, 1, 0, 0);
    test_moe_route(37, 60, 4, 0, 0, 0);
    test_moe_route(5, 128, 8, 1, 0, 0);
    test_moe_route(9, 4, 2, 1, 1, 0); /* gemma4 per-expert scale */
    test_moe_route(6, 64, 8, 1, 0, 1);
    test_moe_route(3, 256, 8, 1, 0, 0);
    test_moe_route(2, 1000, 16, 0, 0, 1);
    test_moe_route(1, 1024, 64, 1, 0, 0);
    test_mul_rows();
    test_gemma3n_ops(7, 64);
    test_gemma3n_ops(3, 2048);
    for (int d = 0; d < 3; d++) {
        test_moe_ffn(dts[d], 1, 8, 2, 64, 48, KN_ACT_SILU);  /* decode */
        test_moe_ffn(dts[d], 13, 6, 3, 40, 24, KN_ACT_SILU); /* several tokens per expert */
    }
    test_moe_ffn(KN_DT_F32, 9, 4, 2, 32, 16, KN_ACT_GELU_TANH);
    /* decode at real widths (CUDA: the fused gate/up and down+combine kernels, several pieces per lane) */
    test_moe_ffn(KN_DT_BF16, 1, 16, 8, 2048, 768, KN_ACT_SILU);
    test_moe_ffn(KN_DT_F16, 1, 12, 5, 520, 264, KN_ACT_GELU_TANH);
    /* k dividing 8 and inter a multiple of 256 (CUDA: the down kernel where a warp streams a slot's rows;
     * the 8-expert shape above runs it too, k = 5 and the next case the row kernel) */
    test_moe_ffn(KN_DT_F16, 1, 6, 2, 64, 512, KN_ACT_SILU);
    test_moe_ffn(KN_DT_BF16, 1, 8, 4, 128, 256, KN_ACT_SILU);
    test_moe_ffn(KN_DT_BF16, 1, 12, 8, 64, 1024, KN_ACT_SILU);     /* 4 pieces of 256 per row, 4 batches */
    test_moe_ffn(KN_DT_F16, 1, 5, 1, 40, 1024, KN_ACT_GELU_TANH); /* one slot: a warp per row */
    test_moe_ffn(KN_DT_F16, 1, 6, 4, 64, 1280, KN_ACT_SILU);       /* 5 pieces: activations in shared memory */
    /* CUDA gate/up: rows wider than a warp's 8 pieces per lane in flight (2,048 columns), the second pass partial */
    test_moe_ffn(KN_DT_F16, 1, 10, 8, 2312, 1000, KN_ACT_SILU);
    /* k x inter activations too wide for the CUDA down kernel's shared memory (172 KB): read in place */
    test_moe_ffn(KN_DT_BF16, 1, 9, 8, 24, 5384, KN_ACT_SILU);
    /* the layer's RMSNorm and residual add inside the op (decode: fused into the
     * CUDA kernels; several tokens: the separate paths), out apart and out = x */
    for (int f = 1; f < 8; f++) {
        if (f == MOE_ALIAS || f == (MOE_ALIAS | MOE_NORM)) continue; /* out = x only with accumulate */
        test_moe_ffn_f(KN_DT_BF16, 1, 16, 8, 2048, 768, KN_ACT_SILU, 0, 0, f);
        test_moe_ffn_f(KN_DT_F16, 3, 6, 3, 40, 24, KN_ACT_SILU, 0, 0, f);
        test_moe_ffn_f(KN_DT_F32, 1, 8, 2, 64, 48, KN_ACT_SILU, 0, 0, f);
        if (be->moe_quantized_experts) test_moe_ffn_f(KN_DT_BF16, 2, 8, 2, 128, 64, KN_ACT_SILU, 4, 64, f);
    }
    /* routing inside the op from router logits (CUDA: the routing kernel first) */
    test_moe_ffn_f(KN_DT_BF16, 1, 32, 8, 256, 64, KN_ACT_SILU, 0, 0, MOE_ROUTE | MOE_NORM | MOE_ACC);
    test_moe_ffn_f(KN_DT_F16, 1, 300, 4, 64, 32, KN_ACT_SILU, 0, 0, MOE_ROUTE); /* more experts than 8 per lane */
    test_moe_ffn_f(KN_DT_BF16, 5, 16, 2, 64, 48, KN_ACT_SILU, 0, 0, MOE_ROUTE | MOE_NORM); /* several tokens */
    if (be->moe_quantized_experts) test_moe_ffn_f(KN_DT_BF16, 1, 8, 2, 128, 64, KN_ACT_SILU, 4, 64, MOE_ROUTE);
    if (be->moe_quantized_experts) { /* MLX-quantized stacks: decode, prefill, a float down stack beside them */
        test_moe_ffn_q(KN_DT_BF16, 1, 8, 2, 128, 64, KN_ACT_SILU, 4, 64);
        test_moe_ffn_q(KN_DT_F16, 7, 6, 3, 96, 64, KN_ACT_SILU, 8, 32);
        test_moe_ffn_q(KN_DT_F32, 5, 4, 2, 64, 16, KN_ACT_GELU_TANH, 4, 32);
        test_moe_ffn_q(KN_DT_BF16, 3, 4, 2, 64, 32, KN_ACT_SILU, 2, 32);
        /* wider rows (CUDA: the 16-byte piece kernels; 1-3 pieces a lane, partial last pass, k < 8, 2 tokens) */
        test_moe_ffn_q(KN_DT_BF16, 1, 9, 8, 1024, 384, KN_ACT_SILU, 4, 64);
        test_moe_ffn_q(KN_DT_F16, 1, 9, 8, 1344, 320, KN_ACT_SILU, 8, 32);
        test_moe_ffn_q(KN_DT_BF16, 2, 4, 3, 256, 2048, KN_ACT_GELU_TANH, 4, 128);
        /* one token, SiLU, every chunk whole 16-byte units (CUDA: the streaming kernel of cuda_qgemv.cu for the
         * gate/up with the RMSNorm fused, and for the down where its rows split so): the Qwen3-30B-A3B expert
         * shape routed, normalized and added to the residual stream in place (the down's chunks cross slot rows
         * mid-row); 8-bit with a slot count that leaves the last warps' sets short; down stacks left float or
         * with groups that do not fill 16-byte units (the piece kernel after the streaming gate/up) */
        test_moe_ffn_f(KN_DT_BF16, 1, 16, 8, 2048, 768, KN_ACT_SILU, 4, 64, MOE_ROUTE | MOE_NORM | MOE_ACC | MOE_ALIAS);
        test_moe_ffn_f(KN_DT_F16, 1, 12, 5, 512, 256, KN_ACT_SILU, 8, 64, MOE_ACC);
        test_moe_ffn_f(KN_DT_F16, 1, 10, 3, 1024, 200, KN_ACT_SILU, 8, 64, MOE_NORM);
        test_moe_ffn_f(KN_DT_BF16, 1, 7, 5, 4096, 96, KN_ACT_SILU, 4, 128, 0);
        test_moe_ffn_f(KN_DT_BF16, 1, 8, 6, 1024, 320, KN_ACT_SILU, 4, 32, MOE_NORM);
    }
    /* whisper: conv1 (k 3, s 1, p 1) over a [c, t] mel, conv2 (s 2) over rows */
    test_im2col(30, 8, 3, 1, 1, 1);
    test_im2col(31, 5, 3, 2, 1, 0);
    test_im2col(3000, 80, 3, 1, 1, 1);
    test_im2col(7, 3, 1, 1, 0, 0);
    test_attention_dense(7, 7, 4, 16, 0, 0);   /* encoder self-attention */
    test_attention_dense(5, 300, 6, 64, 0, 0); /* cross-attention */
    test_attention_dense(9, 9, 2, 64, 1, 0);   /* decoder prompt */
    test_attention_dense(1, 12, 4, 64, 1, 11); /* decoder step over its cache */
    test_attention_dense(3, 20, 3, 40, 1, 5);  /* causal with cache beyond the rows */
    test_attention_dense(2, 1500, 20, 64, 0, 0);
    test_launch_error();
    /* bf16 caches, last so the random inputs of the checks above stay as
     * they were (CUDA, bf16 compute: the tensor-core decode kernel for
     * groups up to 16 heads, head dims 64/128; others the CUDA-core one) */
    test_attention_q(8, 2, 128, 300, 20, 0, 1, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    test_attention_q(8, 1, 64, 1500, 33, 0, 2, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    test_attention_q(16, 1, 128, 700, 40, 100, 1, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    test_attention_q(4, 4, 128, 77, 5, 0, 1, KN_DT_BF16, 20.0f, KN_KVF_BF16);
    test_attention_q(12, 4, 64, 3000, 9, 0, 2, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    test_attention_q(32, 1, 64, 100, 9, 0, 1, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    test_attention_q(8, 2, 128, 300, 20, 0, 1, KN_DT_F32, 0.0f, KN_KVF_BF16);
    test_attention_q(8, 2, 128, 300, 20, 0, 90, KN_DT_BF16, 0.0f, KN_KVF_BF16);
    /* per-head q / k norms fused into rope_kv_write (Qwen3, Gemma 3) */
    test_rope_kv_write(1, 32, 4, 128, 128, "bf16", 1);
    test_rope_kv_write(5, 6, 2, 64, 32, "f32", 1);
    test_rope_kv_write(2, 8, 4, 256, 256, "bf16", 1);
    kn_backend_destroy(be);
    return kn_test_done("test_ops");
}

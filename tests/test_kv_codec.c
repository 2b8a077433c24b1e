/* test_kv_codec.c — KV-cache formats (KV_FORMATS.md "Accuracy gates"):
 *  - codecs against float64: Lloyd-Max fixed point (1e-12) and the spec's
 *    constants, tq{b} distortion on random unit vectors within +-2% of the
 *    Lloyd-Max theory at D=128 and <= 1.1x on adversarial inputs, rotation
 *    orthogonality (1e-6), fp16/e4m3 conversions, every format's round trip;
 *  - kernels: kv_write (quantize on append) then attention on the backend,
 *    against float64 attention over the codes the backend stored: relative
 *    L2 <= 2e-3 for T in {1, 127, 4096}, D in {64, 128, 256}, GQA 1/4/8.
 * KILN_TEST_BACKEND=cuda runs the kernel part on the GPU; KILN_KV_TEST_LONG=1
 * adds T = 131072. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "base/kv_codec_tables.h"
#include "kv/kv_paged.h"
#include "test_backend.h"
#include "test_util.h"

static kn_backend *be;
static double worst_rel; /* largest attention rel L2 seen */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t seed = 7;

static double gauss(void) { /* Box-Muller on the test PRNG */
    double u = 0.5 * (kn_test_rand(&seed) + 1.0) + 1e-12, v = 0.5 * (kn_test_rand(&seed) + 1.0);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- codecs ---------------------------------------------------------------- */

static void test_lloyd_max(void) {
    const int dims[] = {0, 64, 128, 256, 512};
    for (int di = 0; di < 5; di++)
        for (int b = 2; b <= 4; b++) {
            double c[16], next[16];
            kn_lloyd_max(dims[di], b, c);
            double moved = kn_lloyd_max_step(dims[di], b, c, next);
            CHECK(moved <= 1e-12, "Lloyd-Max D=%d b=%d: not a fixed point (moves %g)", dims[di], b, moved);
            for (int i = 0; i + 1 < (1 << b); i++) CHECK(c[i] < c[i + 1], "Lloyd-Max D=%d b=%d: unsorted", dims[di], b);
        }
    /* the constants KV_FORMATS.md quotes for the 3-bit N(0,1) quantizer */
    const double cent[4] = {0.24509, 0.75601, 1.34391, 2.15195}, bnd[3] = {0.50055, 1.04996, 1.74793};
    double c[8];
    kn_lloyd_max(0, 3, c);
    for (int i = 0; i < 4; i++) {
        CHECK(fabs(c[4 + i] - cent[i]) < 6e-6 && fabs(c[3 - i] + cent[i]) < 6e-6, "3-bit centroid %d: %.6f vs %.5f", i,
              c[4 + i], cent[i]);
        if (i < 3) CHECK(fabs(0.5 * (c[4 + i] + c[5 + i]) - bnd[i]) < 6e-6, "3-bit boundary %d", i);
    }
    CHECK(fabs(0.5 * (c[3] + c[4])) < 1e-15, "3-bit middle boundary is 0");
    /* spec: D=128 distortion 0.0340 (3 bits), 0.0093 (4 bits) */
    double c3[8], c4[16];
    kn_lloyd_max(128, 3, c3), kn_lloyd_max(128, 4, c4);
    double m3 = kn_lloyd_max_mse(128, 3, c3), m4 = kn_lloyd_max_mse(128, 4, c4);
    CHECK(fabs(m3 - 0.0340) < 0.0340 * 0.01 && fabs(m4 - 0.0093) < 0.0093 * 0.01, "theory MSE D=128: %.5f %.5f", m3, m4);
}

static void test_rotation(void) {
    static float x[512], y[512], z[512], sg[512];
    for (int D = 64; D <= 512; D *= 2) {
        kn_kv_signs(KN_KV_SIGN_SEED, D, sg);
        int plus = 0;
        for (int i = 0; i < D; i++) plus += sg[i] > 0;
        CHECK(plus > D / 4 && plus < 3 * D / 4, "sign vector D=%d looks constant (%d plus)", D, plus);
        static float cols[512][512];
        for (int i = 0; i < D; i++) {
            memset(x, 0, sizeof x);
            x[i] = 1.0f;
            kn_kv_rotate(x, D, sg, cols[i]);
        }
        double worst = 0;
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) {
                double s = 0;
                for (int k = 0; k < D; k++) s += (double)cols[i][k] * cols[j][k];
                double e = fabs(s - (i == j));
                if (e > worst) worst = e;
            }
        CHECK(worst <= 1e-6, "rotation D=%d: |R^T R - I| = %g", D, worst);
        for (int i = 0; i < D; i++) x[i] = (float)gauss();
        kn_kv_rotate(x, D, sg, y);
        memcpy(z, y, sizeof(float) * D);
        kn_kv_unrotate(z, D, sg);
        double e = 0;
        for (int i = 0; i < D; i++) e = fmax(e, fabs(z[i] - x[i]));
        CHECK(e <= 1e-5, "unrotate(rotate(x)) D=%d: %g", D, e);
    }
}

static void test_scalars(void) {
    uint64_t s = 99;
    for (int i = 0; i < 200000; i++) {
        float f = kn_test_rand(&s) * (float)pow(2.0, (int)(kn_test_rand(&s) * 30)); /* 2^-30 .. 2^30 */
        CHECK(kn_kv_f32_to_f16(f) == kn_f32_to_f16(f), "f16 of %g", f);
        uint16_t h = (uint16_t)(s >> 20);
        float a = kn_kv_f16_to_f32(h), b = kn_f16_to_f32(h);
        CHECK((a != a && b != b) || memcmp(&a, &b, 4) == 0, "f16 %04x", h);
        if (kn_test_failures) return;
    }
    /* e4m3: every finite code round-trips; values between codes round to a neighbour */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        float v = kn_kv_e4m3_to_f32((uint8_t)c);
        uint8_t back = kn_kv_f32_to_e4m3(v);
        CHECK(back == c || (v == 0.0f && (back & 0x7f) == 0), "e4m3 %02x -> %g -> %02x", c, v, back);
    }
    CHECK(kn_kv_e4m3_to_f32(0x7e) == 448.0f && kn_kv_f32_to_e4m3(1e6f) == 0x7e && kn_kv_f32_to_e4m3(-1e6f) == 0xfe,
          "e4m3 saturates at 448");
    CHECK(kn_kv_e4m3_to_f32(0x01) == 0.001953125f, "e4m3 smallest subnormal 2^-9");
    for (int i = 0; i < 10000; i++) {
        float v = kn_test_rand(&s) * 400.0f, r = kn_kv_e4m3_to_f32(kn_kv_f32_to_e4m3(v));
        CHECK(fabsf(r - v) <= fabsf(v) * 0.0625f + 0.001f, "e4m3 rounding of %g: %g", v, r);
    }
}

/* relative squared error |x - dec(enc(x))|^2 / |x|^2 in float64 */
static double rel_err(int f, const float *x, int D, const kn_kv_aux *aux) {
    uint8_t row[4 * KN_KV_MAX_DIM];
    float tmp[KN_KV_MAX_DIM], out[KN_KV_MAX_DIM];
    kn_kv_encode(f, x, D, row, aux, tmp);
    kn_kv_decode(f, row, D, aux, out);
    double e = 0, n = 0;
    for (int i = 0; i < D; i++) e += ((double)out[i] - x[i]) * ((double)out[i] - x[i]), n += (double)x[i] * x[i];
    return n > 0 ? e / n : e;
}

static void test_tq_distortion(void) {
    const int D = 128;
    static float sg[512], tab[32], x[512];
    kn_kv_signs(KN_KV_SIGN_SEED, D, sg);
    const int fmts[2] = {KN_KVF_TQ3, KN_KVF_TQ4};
    for (int fi = 0; fi < 2; fi++) {
        const int f = fmts[fi], b = kn_kv_fmt_bits(f);
        kn_kv_fmt_table(f, D, tab);
        kn_kv_aux aux = {tab, sg, 1.0f};
        double c[16];
        kn_lloyd_max(D, b, c);
        const double theory = kn_lloyd_max_mse(D, b, c);
        double sum = 0;
        const int N = 4000;
        for (int n = 0; n < N; n++) {
            double nn = 0;
            for (int i = 0; i < D; i++) x[i] = (float)gauss(), nn += (double)x[i] * x[i];
            for (int i = 0; i < D; i++) x[i] = (float)(x[i] / sqrt(nn)); /* a random unit vector */
            sum += rel_err(f, x, D, &aux);
        }
        const double mse = sum / N;
        printf("  tq%d D=%d: MSE %.5f, theory %.5f (%+.2f%%)\n", b, D, mse, theory, 100 * (mse / theory - 1));
        CHECK(fabs(mse / theory - 1) <= 0.02, "tq%d MSE %.5f vs theory %.5f", b, mse, theory);
        /* adversarial: one-hot, constant, one large outlier */
        double worst = 0;
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < D; i++) x[i] = k == 0 ? (i == 5) : k == 1 ? 0.7f : (float)gauss() * 0.01f;
            if (k == 2) x[17] = 30.0f;
            double e = rel_err(f, x, D, &aux);
            worst = fmax(worst, e);
            CHECK(e <= 1.1 * theory, "tq%d adversarial input %d: relative MSE %.5f > 1.1 x %.5f", b, k, e, theory);
        }
        printf("  tq%d adversarial worst %.5f\n", b, worst);
    }
}

/* every format: round trip on Gaussian rows, with each format's error bound */
static void test_roundtrip(void) {
    static float sg[512], tab[32], x[512];
    const int dims[] = {16, 64, 128, 256, 512};
    /* generous per-format bounds on the relative MSE of N(0,1) rows */
    const double bound[KN_KVF_COUNT] = {0, 1e-5, 2e-3, 1e-4, 1e-4, 1e-4, 0.02, 0.03, 0.13, 0.04, 0.011, 0.04, 0.011};
    for (int f = 0; f < KN_KVF_COUNT; f++)
        for (int di = 0; di < 5; di++) {
            const int D = dims[di];
            if (!kn_kv_fmt_dim_ok(f, D)) {
                CHECK(kn_kv_fmt_rotated(f) || kn_kv_fmt_group(f, D) > D, "%s refuses D=%d", kn_kv_fmt_name(f), D);
                continue;
            }
            kn_kv_signs(KN_KV_SIGN_SEED, D, sg);
            kn_kv_fmt_table(f, D, tab);
            kn_kv_aux aux = {tab, sg, 1.0f};
            double sum = 0;
            for (int n = 0; n < 50; n++) {
                for (int i = 0; i < D; i++) x[i] = (float)gauss() * 3.0f;
                sum += rel_err(f, x, D, &aux);
            }
            CHECK(sum / 50 <= bound[f], "%s D=%d: relative MSE %.5f > %.5f", kn_kv_fmt_name(f), D, sum / 50, bound[f]);
            /* hostile rows: constants, zeros, a huge offset, non-finite values stay finite */
            for (int k = 0; k < 4; k++) {
                for (int i = 0; i < D; i++) x[i] = k == 0 ? 0.0f : k == 1 ? -2.5f : 1000.0f + 0.01f * (float)gauss();
                if (k == 3) x[3] = NAN, x[4] = INFINITY;
                uint8_t row[4 * KN_KV_MAX_DIM];
                float tmp[KN_KV_MAX_DIM], out[KN_KV_MAX_DIM];
                kn_kv_encode(f, x, D, row, &aux, tmp);
                kn_kv_decode(f, row, D, &aux, out);
                int ok = 1;
                for (int i = 0; i < D && k < 3; i++) ok &= isfinite(out[i]) != 0; /* row 3: only no UB / no crash */
                if (k < 3 && kn_kv_fmt_rotated(f)) {
                    double e = 0, nx = 0;
                    for (int i = 0; i < D; i++) e += (out[i] - x[i]) * (double)(out[i] - x[i]), nx += (double)x[i] * x[i];
                    ok &= e <= 1.5 * bound[f] * nx + 1e-12; /* adversarial rows: within 1.5x of the Gaussian bound */
                } else if (k < 3 && f != KN_KVF_FP8) {
                    double e = 0, nx = 0;
                    for (int i = 0; i < D; i++) e = fmax(e, fabs(out[i] - x[i])), nx = fmax(nx, fabs(x[i]));
                    ok &= e <= nx * (kn_kv_fmt_bits(f) >= 8 ? 0.01 : 0.2) + 1e-6;
                }
                CHECK(ok, "%s D=%d hostile row %d", kn_kv_fmt_name(f), D, k);
            }
        }
}

static void test_row_bytes(void) {
    /* KV_FORMATS.md table, D = 128 */
    CHECK(kn_kv_row_bytes(KN_KVF_BF16, 128) == 256 && kn_kv_row_bytes(KN_KVF_FP8, 128) == 128, "bf16/fp8 bytes");
    CHECK(kn_kv_row_bytes(KN_KVF_Q8S, 128) == 136 && kn_kv_row_bytes(KN_KVF_Q8A, 128) == 144, "q8 bytes");
    CHECK(kn_kv_row_bytes(KN_KVF_Q4, 128) == 80 && kn_kv_row_bytes(KN_KVF_TQV3, 128) == 56, "q4/tqv3 bytes");
    CHECK(kn_kv_row_bytes(KN_KVF_TQ4, 128) == 66 && kn_kv_row_bytes(KN_KVF_TQ3, 128) == 50, "tq bytes");
    kn_kv_spec s;
    kn_error err;
    CHECK(kn_kv_spec_parse("k8v3", -1, &s, &err) == KN_OK && s.boundary_layers == 2, "k8v3 keeps 2 boundary layers");
    int heads[8], dims[8];
    for (int l = 0; l < 8; l++) heads[l] = 1, dims[l] = 128;
    s.boundary_layers = 0;
    CHECK(kn_kv_spec_bytes_per_token(&s, 1, heads, dims) == 200, "k8v3: 200 B per token per head at D=128");
    CHECK(kn_kv_spec_parse("tq4", -1, &s, &err) == KN_OK && s.boundary_layers == 0, "tq4 has no boundary layers");
    CHECK(kn_kv_spec_parse("q8a:tqv2", -1, &s, &err) == KN_OK && s.k_fmt == KN_KVF_Q8A && s.v_fmt == KN_KVF_TQV2, "K:V");
    CHECK(kn_kv_spec_parse("q8:", -1, &s, &err) != KN_OK && kn_kv_spec_parse("", -1, &s, &err) != KN_OK, "bad names");
    dims[0] = 96;
    kn_kv_spec_parse("tq4", -1, &s, &err);
    CHECK(kn_kv_spec_check(&s, 8, dims, &err) == KN_ERR_UNSUPPORTED && strstr(err.msg, "head_dim"),
          "rotated formats refuse head_dim 96");
}

/* a 6-layer k8v3 pool: boundary layers bf16, memory per token from the formula, the header */
static void test_pool_formats(void) {
    kn_kv_spec spec;
    kn_error err = {0};
    kn_kv_spec_parse("k8v3", -1, &spec, &err);
    int heads[6] = {2, 2, 2, 2, 2, 2}, dims[6] = {128, 128, 128, 128, 128, 128};
    kn_kv_pool_params pp = {.n_layers = 6, .block_size = 16, .n_blocks = 4, .n_kv_heads = heads, .head_dim = dims,
                            .spec = &spec};
    kn_kv_pool *p;
    if (kn_kv_pool_create_ex(be, &pp, &p, &err)) {
        CHECK(0, "k8v3 pool: %s", err.msg);
        return;
    }
    CHECK(p->layers[0].k_fmt == KN_KVF_BF16 && p->layers[1].v_fmt == KN_KVF_BF16 && p->layers[5].k_fmt == KN_KVF_BF16,
          "boundary layers (first 2, last 2) stay bf16");
    CHECK(p->layers[2].k_fmt == KN_KVF_Q8A && p->layers[3].v_fmt == KN_KVF_TQV3, "middle layers: q8a keys, tqv3 values");
    CHECK(kn_kv_bytes_per_token(p) == 4 * 2 * 512 + 2 * 2 * 200, "bytes per token: 4 bf16 layers + 2 k8v3 layers");
    CHECK(kn_kv_bytes_per_token(p) == kn_kv_spec_bytes_per_token(&spec, 6, heads, dims), "pool matches the formula");
    CHECK(p->header.magic == KN_KV_MAGIC && p->header.spec.seed == KN_KV_SIGN_SEED && !strcmp(p->header.spec.name, "k8v3"),
          "cache header records the format and the sign seed");
    kn_kv_pool_destroy(p);
    /* delayed conversion accounting: staging blocks below kv_start, shadows returned on release */
    spec.kv_start = 32, spec.boundary_layers = 0;
    pp.spec = &spec, pp.n_blocks = 8, pp.n_stage_blocks = 2;
    if (kn_kv_pool_create_ex(be, &pp, &p, &err)) {
        CHECK(0, "staged pool: %s", err.msg);
        return;
    }
    kn_kv_seq a = {0}, b = {0};
    CHECK(kn_kv_seq_reserve(p, &a, 40, &err) == KN_OK && a.n_blocks == 3 && a.n_shadow == 2 && p->n_free == 5 &&
              p->n_stage_free == 0, "staged reserve: 2 staging + 2 shadow + 1 compressed block");
    CHECK(kn_kv_seq_reserve(p, &b, 10, &err) == KN_ERR_NOMEM && b.n_blocks == 0, "staging area exhausted: refused");
    a.n_tokens = 32;
    CHECK(kn_kv_seq_convert(p, &a, &err) == KN_OK && a.converted_at == 32 && a.blocks[0] < p->n_blocks &&
              p->n_stage_free == 2 && p->n_free == 5, "conversion swaps staging blocks for their shadows");
    kn_kv_seq_release(p, &a);
    CHECK(p->n_free == 8 && p->n_stage_free == 2, "all blocks back after release");
    kn_kv_pool_destroy(p);
}

/* ---- kernels ------------------------------------------------------------------ */

static void *dev(const void *host, size_t bytes) {
    void *d = kn_be_alloc(be, bytes);
    if (!d) {
        fprintf(stderr, "test_kv_codec: backend allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    if (host) kn_be_upload(be, d, host, bytes);
    return d;
}

/* One sequence of T tokens written through kv_write, n_q queries at the last
 * positions, attention on the backend vs float64 over the stored codes.
 * compute_dtype KN_DT_BF16 is a bf16 model's decode (CUDA: the tensor-core
 * kernel where the format has one, which rounds its operands to f16). */
static void test_attention_kv(kn_kv_pool *pool, const char *fmt, int G, int T, int window, float softcap,
                              int compute_dtype) {
    const kn_kv_spec spec = pool->header.spec;
    const int nkv = 2, D = pool->head_dim, H = nkv * G, bs = pool->block_size, n_q = T >= 4096 ? 2 : T >= 3 ? 3 : T;
    const int nblocks = (int)pool->n_blocks;
    if ((T + bs - 1) / bs > nblocks) {
        CHECK(0, "test pool too small for T=%d", T);
        return;
    }
    const kn_kv_layer *kv = &pool->layers[0];
    /* blocks in a scrambled order: block i of the sequence is pool block perm(i) */
    int32_t *bt = malloc((size_t)nblocks * 4), *slots = malloc((size_t)T * 4), *pos = malloc((size_t)n_q * 4),
            *seq = calloc((size_t)n_q, 4);
    for (int i = 0; i < nblocks; i++) bt[i] = (int32_t)((i * 7 + 3) % nblocks);
    for (int i = 0; i < nblocks; i++) /* make it a permutation when 7 and nblocks share factors */
        for (int j = 0; j < i; j++)
            if (bt[j] == bt[i]) bt[i] = (bt[i] + 1) % nblocks, j = -1;
    for (int t = 0; t < T; t++) slots[t] = bt[t / bs] * bs + t % bs;
    const int64_t kvw = (int64_t)nkv * D;
    float *k = malloc((size_t)T * kvw * 4), *v = malloc((size_t)T * kvw * 4);
    float *q = malloc((size_t)n_q * H * D * 4), *out = malloc((size_t)n_q * H * D * 4);
    for (int64_t i = 0; i < (int64_t)T * kvw; i++) k[i] = (float)gauss(), v[i] = (float)gauss();
    for (int64_t i = 0; i < (int64_t)n_q * H * D; i++) q[i] = (float)gauss();
    for (int i = 0; i < n_q; i++) pos[i] = T - n_q + i;
    /* write in chunks (prefill-like) */
    float *dk = dev(NULL, (size_t)T * kvw * 4), *dv = dev(NULL, (size_t)T * kvw * 4);
    int32_t *dslots = dev(slots, (size_t)T * 4);
    kn_be_upload(be, dk, k, (size_t)T * kvw * 4), kn_be_upload(be, dv, v, (size_t)T * kvw * 4);
    for (int t0 = 0; t0 < T; t0 += 512) {
        int n = T - t0 < 512 ? T - t0 : 512;
        be->vt->kv_write(be, kv, dk + (int64_t)t0 * kvw, dv + (int64_t)t0 * kvw, kvw, n, dslots + t0);
    }
    float *dq = dev(q, (size_t)n_q * H * D * 4), *dout = dev(NULL, (size_t)n_q * H * D * 4);
    int32_t *dpos = dev(pos, (size_t)n_q * 4), *dseq = dev(seq, (size_t)n_q * 4), *dbt = dev(bt, (size_t)nblocks * 4);
    kn_attention_args a = {.q = dq, .q_stride = (int64_t)H * D, .out = dout, .n_tokens = n_q, .n_heads = H,
                           .scale = 1.0f / sqrtf((float)D), .window = window, .pos = dpos, .seq = dseq,
                           .block_tables = dbt, .max_blocks = nblocks, .kv = kv, .pos_host = pos, .seq_host = seq,
                           .compute_dtype = compute_dtype, .softcap = softcap};
    be->vt->attention(be, &a);
    kn_be_sync(be);
    kn_be_download(be, out, dout, (size_t)n_q * H * D * 4);
    /* the stored codes, decoded on the host with the host's tables */
    const int64_t kb = kn_kv_row_bytes(kv->k_fmt, D), vb = kn_kv_row_bytes(kv->v_fmt, D);
    const size_t nslot = (size_t)nblocks * bs * nkv;
    uint8_t *kraw = malloc(nslot * kb), *vraw = malloc(nslot * vb);
    kn_be_download(be, kraw, kv->k, nslot * kb), kn_be_download(be, vraw, kv->v, nslot * vb);
    float sg[512], ktab[32], vtab[32];
    kn_kv_signs(spec.seed, D, sg);
    kn_kv_fmt_table(kv->k_fmt, D, ktab), kn_kv_fmt_table(kv->v_fmt, D, vtab);
    kn_kv_aux ak = {ktab, sg, 1.0f}, av = {vtab, sg, 1.0f};
    float *kd = malloc((size_t)T * kvw * 4), *vd = malloc((size_t)T * kvw * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nkv; h++) {
            kn_kv_decode(kv->k_fmt, kraw + ((int64_t)slots[t] * nkv + h) * kb, D, &ak, kd + (int64_t)t * kvw + h * D);
            kn_kv_decode(kv->v_fmt, vraw + ((int64_t)slots[t] * nkv + h) * vb, D, &av, vd + (int64_t)t * kvw + h * D);
        }
    double *p = malloc((size_t)T * sizeof(double)), num = 0, den = 0;
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < H; h++) {
            const int kvh = h / G, P = pos[i], lo = window > 0 && P - window + 1 > 0 ? P - window + 1 : 0;
            double mx = -1e300, sum = 0;
            for (int j = lo; j <= P; j++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[((int64_t)i * H + h) * D + d] * kd[(int64_t)j * kvw + kvh * D + d];
                s /= sqrt((double)D);
                if (softcap > 0) s = softcap * tanh(s / softcap);
                p[j] = s, mx = fmax(mx, s);
            }
            for (int j = lo; j <= P; j++) sum += (p[j] = exp(p[j] - mx));
            for (int d = 0; d < D; d++) {
                double r = 0;
                for (int j = lo; j <= P; j++) r += p[j] / sum * vd[(int64_t)j * kvw + kvh * D + d];
                double o = out[((int64_t)i * H + h) * D + d];
                num += (o - r) * (o - r), den += r * r;
            }
        }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    if (rel > worst_rel) worst_rel = rel;
    CHECK(rel <= 2e-3, "attention %s D=%d G=%d T=%d window=%d softcap=%g %s: rel L2 %.3g", fmt, D, G, T, window, softcap,
          compute_dtype == KN_DT_BF16 ? "bf16 model" : "f32 model", rel);
    free(p), free(kd), free(vd), free(kraw), free(vraw), free(k), free(v), free(q), free(out), free(bt), free(slots),
        free(pos), free(seq);
    kn_be_free(be, dk), kn_be_free(be, dv), kn_be_free(be, dslots), kn_be_free(be, dq), kn_be_free(be, dout),
        kn_be_free(be, dpos), kn_be_free(be, dseq), kn_be_free(be, dbt);
}

static kn_kv_pool *make_pool(const char *fmt, int D, int max_t) {
    kn_kv_spec spec;
    kn_error err = {0};
    kn_kv_pool *pool = NULL;
    int heads[1] = {2}, dims[1] = {D};
    kn_kv_pool_params pp = {.n_layers = 1, .block_size = 16, .n_blocks = max_t / 16 + 2, .n_kv_heads = heads,
                            .head_dim = dims, .spec = &spec};
    if (kn_kv_spec_parse(fmt, 0, &spec, &err) || kn_kv_pool_create_ex(be, &pp, &pool, &err)) CHECK(0, "pool %s D=%d: %s", fmt, D, err.msg);
    return pool;
}

int main(void) {
    const int brc = kn_test_backend_open("test_kv_codec", 2, &be);
    if (brc) return brc;
    printf("test_kv_codec: backend %s\n", be->vt->name);
    if (!strcmp(be->vt->name, "cpu")) { /* host-only codec checks once */
        double t0 = now();
        test_lloyd_max();
        test_rotation();
        test_scalars();
        test_row_bytes();
        test_pool_formats();
        test_roundtrip();
        test_tq_distortion();
        printf("  codec checks: %.1f s\n", now() - t0);
    }
    double t1 = now();
    const char *fmts[] = {"bf16", "fp8", "q8", "q8s", "q4", "k8v3", "tq4", "k4v3", "tq3", "q4g64", "q8a:tqv2", "f32:tqv4"};
    const int nf = sizeof fmts / sizeof *fmts, Ds[] = {64, 128, 256}, Gs[] = {1, 4, 8};
    int Ts[4] = {1, 127, 4096, 131072}, nT = getenv("KILN_KV_TEST_LONG") ? 4 : 3;
    for (int f = 0; f < nf; f++)
        for (int di = 0; di < 3; di++) {
            kn_kv_pool *pool = make_pool(fmts[f], Ds[di], Ts[nT - 1]);
            if (!pool) continue;
            for (int gi = 0; gi < 3; gi++)
                for (int ti = 0; ti < nT; ti++) {
                    /* the big cases for the presets only, keeping CI short */
                    const int rotated_preset = f == 5 || f == 6, one_combo = di == 1 && gi == 1;
                    if (Ts[ti] == 4096 && !(rotated_preset || (f <= 7 && one_combo))) continue;
                    if (Ts[ti] > 4096 && !(f <= 7 && di == 1 && gi == 2)) continue;
                    test_attention_kv(pool, fmts[f], Gs[gi], Ts[ti], 0, 0.0f, KN_DT_F32);
                    /* k8v3 as a bf16 model decodes it (head dims with a tensor-core kernel) */
                    if (f == 5 && di <= 1 && Ts[ti] <= 4096)
                        test_attention_kv(pool, fmts[f], Gs[gi], Ts[ti], 0, 0.0f, KN_DT_BF16);
                }
            if (di == 1 && f == 5) { /* k8v3, sliding window; 16 heads per KV head; soft-capped scores */
                test_attention_kv(pool, fmts[f], 4, 300, 64, 0.0f, KN_DT_F32);
                test_attention_kv(pool, fmts[f], 4, 300, 64, 0.0f, KN_DT_BF16);
                test_attention_kv(pool, fmts[f], 16, 1000, 0, 0.0f, KN_DT_BF16);
                test_attention_kv(pool, fmts[f], 4, 200, 0, 30.0f, KN_DT_BF16);
            }
            if (di == 0 && f == 5) test_attention_kv(pool, fmts[f], 2, 100, 0, 30.0f, KN_DT_BF16);
            if (di == 0 && f == 6) test_attention_kv(pool, fmts[f], 2, 100, 0, 30.0f, KN_DT_F32); /* tq4, soft-capped scores */
            kn_kv_pool_destroy(pool);
        }
    printf("  kernel checks: %.1f s, worst attention rel L2 %.2g (gate 2e-3)\n", now() - t1, worst_rel);
    kn_backend_destroy(be);
    return kn_test_done("test_kv_codec");
}

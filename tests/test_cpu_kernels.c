/* test_cpu_kernels.c — the CPU kernel set's vector math pieces against libm
 * in double: scale_max, exp_shift_sum and silu_mul where the selected set
 * has them (KILN_CPU_KERNELS picks the set), including -inf, NaN, underflow
 * and odd lengths; round_bf16 bit for bit against kn_f32_to_bf16 (ties,
 * subnormals, infinities, NaN) and sum_squares against a double loop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

#include "backend/cpu/cpu_kernels.h"
#include "test_util.h"

static uint64_t seed = 11;

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the decode GEMVs' x preparation pieces, where the set has them */
static void check_x_prep(const kn_cpu_kernels *k) {
    enum { N = 1100 };
    static float x[N];
    static uint16_t got[N + 16];
    if (k->round_bf16) {
        const uint32_t special[] = {0x00000001, 0x80000001, 0x00007fff, 0x00008000, 0x00018000, 0x007fffff, 0x00800000,
                                    0x3f808000, 0x3f818000, 0x3f80c000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
                                    0x7fc00000, 0x7f800001, 0xffa00000, 0x80000000, 0x00000000, 0x477fe000};
        const int ns = (int)(sizeof special / sizeof *special);
        for (int len = 1; len <= N; len = len * 2 + 3) {
            for (int i = 0; i < len; i++) {
                uint32_t u = (uint32_t)(kn_test_rand(&seed) * 2147483647.0f) * 2654435761u;
                if (i % 3 == 0) u = special[(i / 3) % ns];
                x[i] = from_bits(u);
            }
            for (int i = 0; i < len + 16; i++) got[i] = 0xabcd; /* past len stays untouched */
            k->round_bf16(x, len, got);
            int wrong = 0, past = 0;
            for (int i = 0; i < len; i++) wrong += got[i] != kn_f32_to_bf16(x[i]);
            for (int i = len; i < len + 16; i++) past += got[i] != 0xabcd;
            CHECK(wrong == 0 && past == 0, "round_bf16 len %d: %d values differ from kn_f32_to_bf16, %d written past n",
                  len, wrong, past);
        }
    }
    if (k->sum_squares) {
        for (int len = 1; len <= N; len = len * 2 + 1) {
            double want = 0;
            for (int i = 0; i < len; i++) {
                x[i] = kn_test_rand(&seed) * (i % 7 == 0 ? 1e3f : 1.0f);
                want += (double)x[i] * x[i];
            }
            const double got_sum = k->sum_squares(x, len);
            CHECK(fabs(got_sum - want) <= 1e-14 * want, "sum_squares len %d: %.17g vs %.17g", len, got_sum, want);
        }
    }
}

int main(void) {
    const kn_cpu_kernels *k = kn_cpu_kernels_select();
    check_x_prep(k);
    if (!k->exp_shift_sum || !k->scale_max || !k->silu_mul) {
        printf("test_cpu_kernels: the %s set has no vector softmax / SiLU pieces\n", k->name);
        return kn_test_done("test_cpu_kernels");
    }
    enum { N = 1000 };
    float s[N], o[N], g[N], u[N];
    double worst = 0;
    for (int len = 1; len <= N; len = len * 3 + 1) {
        for (int i = 0; i < len; i++) s[i] = (kn_test_rand(&seed) - 0.5f) * 220.0f; /* [-110, 110] */
        float want_max = -INFINITY;
        for (int i = 0; i < len; i++) want_max = fmaxf(want_max, s[i] * 0.5f);
        float got_max = k->scale_max(s, len, 0.5f);
        CHECK(got_max == want_max, "scale_max len %d: %g vs %g", len, got_max, want_max);
        float copy[N];
        for (int i = 0; i < len; i++) copy[i] = s[i];
        double want_sum = 0;
        float sum = k->exp_shift_sum(s, len, got_max);
        for (int i = 0; i < len; i++) {
            double e = exp((double)(float)(copy[i] - got_max)); /* the difference is rounded to f32 first, as in expf(s - m) */
            want_sum += e;
            double err = e > 1e-37 ? fabs(s[i] - e) / e : fabs(s[i] - e);
            if (e > 1e-37 && err > worst) worst = err;
            CHECK(err <= (e > 1e-37 ? 5e-7 : 1e-37), "exp(%g) = %g, want %g", copy[i] - got_max, s[i], e);
        }
        CHECK(fabs(sum - want_sum) <= 1e-6 * want_sum, "exp sum len %d: %g vs %g", len, sum, want_sum);
    }
    /* special values: -inf and deep underflow give 0, NaN stays NaN and is no maximum */
    float sp[5] = {-INFINITY, -200.0f, NAN, 0.0f, -1.0f};
    CHECK(k->scale_max(sp, 5, 1.0f) == 0.0f, "scale_max ignores NaN");
    k->exp_shift_sum(sp, 5, 0.0f);
    CHECK(sp[0] == 0.0f && sp[1] == 0.0f && isnan(sp[2]) && sp[3] == 1.0f && fabsf(sp[4] - 0.36787944f) < 1e-7f,
          "exp special values: %g %g %g %g %g", sp[0], sp[1], sp[2], sp[3], sp[4]);
    /* silu(g) * u */
    for (int i = 0; i < N; i++) g[i] = (kn_test_rand(&seed) - 0.5f) * 60.0f, u[i] = kn_test_rand(&seed) - 0.5f;
    g[3] = NAN;
    k->silu_mul(o, g, u, N - 3);
    for (int i = 0; i < N - 3; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        if (i == 3) {
            CHECK(isnan(o[i]), "silu of NaN");
            continue;
        }
        CHECK(fabs(o[i] - want) <= 1e-6 * fabs(want) + 1e-30, "silu_mul(%g, %g) = %g, want %g", g[i], u[i], o[i], want);
    }
    printf("test_cpu_kernels (%s): worst exp relative error %.2e\n", k->name, worst);
    return kn_test_done("test_cpu_kernels");
}

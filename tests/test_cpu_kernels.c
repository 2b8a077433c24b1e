/* test_cpu_kernels.c — the CPU kernel set's vector math pieces against libm
 * in double: scale_max, exp_shift_sum and silu_mul where the selected set
 * has them (KILN_CPU_KERNELS picks the set), including -inf, NaN, underflow
 * and odd lengths. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "test_util.h"

static uint64_t seed = 11;

int main(void) {
    const kn_cpu_kernels *k = kn_cpu_kernels_select();
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

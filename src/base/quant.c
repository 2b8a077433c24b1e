/* quant.c — see quant.h. */
#include "base/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

kn_code kn_quant_check(const char *what, int bits, int group_size, int64_t rows, int64_t cols, kn_error *err) {
    if (!kn_quant_bits_ok(bits))
        return kn_fail(err, KN_ERR_FORMAT, "%s: quantization bits %d (supported: 2, 3, 4, 5, 6, 8)", what, bits);
    if (!kn_quant_group_ok(group_size))
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: quantization group_size %d (supported: 32, 64, 128)", what,
                       group_size);
    if (rows <= 0 || cols <= 0 || cols % group_size != 0)
        return kn_fail(err, KN_ERR_FORMAT, "%s: shape [%lld, %lld] does not split into groups of %d columns", what,
                       (long long)rows, (long long)cols, group_size);
    return KN_OK;
}

kn_code kn_quant_check_compute(const char *what, int bits, int group_size, int64_t rows, int64_t cols, kn_error *err) {
    if (kn_quant_compute_bits(bits) != bits)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: %d-bit codes must be widened to %d bits before a backend holds them",
                       what, bits, kn_quant_compute_bits(bits));
    return kn_quant_check(what, bits, group_size, rows, cols, err);
}

void kn_quant_group(const float *w, int gs, int bits, uint32_t *packed, float *scale_out, float *bias_out) {
    const float eps = 1e-7f, n_bins = (float)((1 << bits) - 1);
    /* MLX seeds the max with 0 and the min with FLT_MAX (its kernels do) */
    float w_min = FLT_MAX, w_max = 0.0f;
    for (int i = 0; i < gs; i++) {
        w_min = fminf(w_min, w[i]);
        w_max = fmaxf(w_max, w[i]);
    }
    float scale = fmaxf((w_max - w_min) / n_bins, eps);
    const int side = fabsf(w_min) > fabsf(w_max);
    scale = side ? scale : -scale;
    const float edge = side ? w_min : w_max;
    const float q0 = roundf(edge / scale);
    const int at_zero = q0 == 0.0f;
    scale = at_zero ? scale : edge / q0;
    const float bias = at_zero ? 0.0f : edge;
    memset(packed, 0, (size_t)(gs * bits / 32) * sizeof(uint32_t));
    for (int i = 0; i < gs; i++) {
        float v = roundf((w[i] - bias) / scale);
        v = fminf(v, n_bins);
        uint32_t q = v > 0.0f ? (uint32_t)v : 0u; /* MLX converts to uint8; never negative in exact math */
        kn_quant_put(packed, i, bits, q);
    }
    *scale_out = scale;
    *bias_out = bias;
}

void kn_quant_dequant_row(const uint32_t *row, const float *scales, const float *biases, int64_t cols, int gs, int bits,
                          float *out) {
    for (int64_t c = 0; c < cols; c++) out[c] = scales[c / gs] * (float)kn_quant_code(row, c, bits) + biases[c / gs];
}

/* rope.c — see rope.h. Frequencies are computed in double and rounded once to
 * float; transformers computes them in float32, which agrees to ~1 ulp. */
#include "models/rope.h"

#include <math.h>

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static double yarn_correction_dim(double n_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

int kn_rope_length_dependent(const kn_rope_config *r) {
    return r->type == KN_ROPE_DYNAMIC || r->type == KN_ROPE_LONGROPE;
}

kn_code kn_rope_frequencies(const kn_model_config *cfg, int rot_dim, int seq_len, float *inv_freq, float *attn_scale,
                            kn_error *err) {
    const kn_rope_config *r = &cfg->rope;
    const int half = rot_dim / 2;
    double base = r->theta;
    *attn_scale = 1.0f;
    if (half > 256) return kn_fail(err, KN_ERR_UNSUPPORTED, "rotary dimension %d is larger than 512", rot_dim);
    if (r->type == KN_ROPE_DYNAMIC) {
        /* transformers' _compute_dynamic_ntk_parameters with seq_len a tensor
         * (float32 arithmetic): base * ((factor * L / max) - (factor - 1)) ** (dim / (dim - 2)) */
        const int max_pos = cfg->max_position_embeddings;
        const int L = seq_len > max_pos ? seq_len : max_pos;
        if (L > max_pos) {
            float t = (float)r->factor * (float)L / (float)max_pos - (float)(r->factor - 1.0);
            base = (float)((float)base * powf(t, (float)rot_dim / (float)(rot_dim - 2)));
        }
    }
    double f[512];
    for (int i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        float expo = (float)(2 * i) / (float)rot_dim;
        f[i] = 1.0 / (double)powf((float)base, expo);
    }
    switch (r->type) {
    case KN_ROPE_DEFAULT: break;
    case KN_ROPE_LINEAR:
        for (int i = 0; i < half; i++) f[i] /= r->factor;
        break;
    case KN_ROPE_LLAMA3: {
        double old_ctx = r->original_max_position_embeddings > 0 ? r->original_max_position_embeddings : 8192;
        double low_wl = old_ctx / r->low_freq_factor, high_wl = old_ctx / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double wl = 2.0 * M_PI / f[i];
            if (wl > low_wl) {
                f[i] = f[i] / r->factor;
            } else if (wl >= high_wl) { /* medium band: smooth interpolation */
                double smooth = (old_ctx / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f[i] = (1.0 - smooth) * f[i] / r->factor + smooth * f[i];
            }
        }
        break;
    }
    case KN_ROPE_YARN: {
        double factor = r->factor;
        double orig = r->original_max_position_embeddings > 0 ? r->original_max_position_embeddings
                                                               : cfg->max_position_embeddings;
        double af;
        if (r->has_attention_factor) af = r->attention_factor;
        else if (r->mscale != 0.0 && r->mscale_all_dim != 0.0)
            af = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
        else af = yarn_mscale(factor, 1.0);
        double low = yarn_correction_dim(r->beta_fast, rot_dim, base, orig);
        double high = yarn_correction_dim(r->beta_slow, rot_dim, base, orig);
        if (r->truncate) low = floor(low), high = ceil(high);
        if (low < 0) low = 0;
        if (high > rot_dim - 1) high = rot_dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1.0 - ramp; /* weight of the unscaled frequency */
            double inter = f[i] / factor;
            f[i] = inter * (1.0 - extrap) + f[i] * extrap;
        }
        *attn_scale = (float)af;
        break;
    }
    case KN_ROPE_PROPORTIONAL: {
        /* gemma4: rot_dim is the whole head; the first int(p * dim // 2)
         * frequencies rotate (exponents over the whole head), the rest are 0
         * (cos 1, sin 0: those dims pass through) */
        int angles = (int)floor(r->partial_rotary_factor * rot_dim / 2.0);
        for (int i = 0; i < half; i++) f[i] = i < angles ? f[i] / r->factor : 0.0;
        break;
    }
    case KN_ROPE_DYNAMIC: break; /* base rescaled above */
    case KN_ROPE_LONGROPE: {
        const int orig = r->original_max_position_embeddings;
        if (orig <= 0) return kn_fail(err, KN_ERR_FORMAT, "longrope needs original_max_position_embeddings");
        if (r->n_long_factor != half || r->n_short_factor != half)
            return kn_fail(err, KN_ERR_FORMAT, "longrope: long_factor / short_factor have %d / %d entries, the rotary "
                           "dimension %d needs %d", r->n_long_factor, r->n_short_factor, rot_dim, half);
        double factor = r->has_factor ? r->factor : (double)cfg->max_position_embeddings / orig;
        double af = r->has_attention_factor ? r->attention_factor
                    : factor <= 1.0           ? 1.0
                                              : sqrt(1.0 + log(factor) / log((double)orig));
        const double *ext = seq_len > orig ? r->long_factor : r->short_factor;
        for (int i = 0; i < half; i++) f[i] /= (float)ext[i];
        *attn_scale = (float)af;
        break;
    }
    }
    for (int i = 0; i < half; i++) inv_freq[i] = (float)f[i];
    return KN_OK;
}

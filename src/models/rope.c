/* rope.c — see rope.h. Frequencies are computed in double and rounded once to
 * float; transformers computes them in float32, which agrees to ~1 ulp. */
#include "models/rope.h"

#include <math.h>

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static double yarn_correction_dim(double n_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

kn_code kn_rope_frequencies(const kn_model_config *cfg, int rot_dim, float *inv_freq, float *attn_scale,
                            kn_error *err) {
    const kn_rope_config *r = &cfg->rope;
    const int half = rot_dim / 2;
    const double base = r->theta;
    *attn_scale = 1.0f;
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
    case KN_ROPE_DYNAMIC:
    case KN_ROPE_LONGROPE:
        return kn_fail(err, KN_ERR_UNSUPPORTED,
                       "rope type %s is not supported yet (its frequencies change with sequence length)",
                       r->type == KN_ROPE_DYNAMIC ? "dynamic" : "longrope");
    }
    for (int i = 0; i < half; i++) inv_freq[i] = (float)f[i];
    return KN_OK;
}

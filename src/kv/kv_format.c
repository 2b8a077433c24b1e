/* kv_format.c — KV storage choices (`--kv FORMAT`): presets, "K:V" pairs,
 * the boundary-layer policy, per-layer formats and the memory formula of
 * KV_FORMATS.md. The row codecs themselves live in base/kv_codec.h. */
#include <stdio.h>
#include <string.h>

#include "base/kv_codec_tables.h"
#include "kv/kv_paged.h"

static const struct {
    const char *name;
    int k, v;
} presets[] = {
    {"f32", KN_KVF_F32, KN_KVF_F32},   {"bf16", KN_KVF_BF16, KN_KVF_BF16}, {"fp8", KN_KVF_FP8, KN_KVF_FP8},
    {"q8", KN_KVF_Q8, KN_KVF_Q8},      {"q8s", KN_KVF_Q8S, KN_KVF_Q8S},    {"q4", KN_KVF_Q4, KN_KVF_Q4},
    {"q4g64", KN_KVF_Q4G64, KN_KVF_Q4G64}, {"tq3", KN_KVF_TQ3, KN_KVF_TQ3}, {"tq4", KN_KVF_TQ4, KN_KVF_TQ4},
    /* TurboQuant as mlx-bun ships it: affine 8-bit keys, 3-bit rotated values */
    {"k8v3", KN_KVF_Q8A, KN_KVF_TQV3}, {"k4v3", KN_KVF_TQ4, KN_KVF_TQV3},
};

static const char *const known = "f32, bf16, fp8, q8, q8s, q4, q4g64, tq3, tq4, k8v3, k4v3, or K:V with formats "
                                 "f32 bf16 fp8 q8 q8s q8a q4 q4g64 tqv2 tqv3 tqv4 tq3 tq4";

kn_kv_spec kn_kv_spec_default(kn_dtype dt) {
    kn_kv_spec s = {.k_fmt = KN_KVF_BF16, .v_fmt = KN_KVF_BF16, .boundary_fmt = KN_KVF_BF16, .seed = KN_KV_SIGN_SEED};
    if (dt == KN_DT_F32) s.k_fmt = s.v_fmt = KN_KVF_F32;
    snprintf(s.name, sizeof s.name, "%s", kn_kv_fmt_name(s.k_fmt));
    return s;
}

kn_code kn_kv_spec_parse(const char *str, int boundary, kn_kv_spec *out, kn_error *err) {
    kn_kv_spec s = kn_kv_spec_default(KN_DT_BF16);
    int found = 0;
    for (size_t i = 0; i < sizeof presets / sizeof *presets && !found; i++)
        if (!strcmp(str, presets[i].name)) s.k_fmt = presets[i].k, s.v_fmt = presets[i].v, found = 1;
    const char *colon = strchr(str, ':');
    if (!found && colon && colon - str < 16) {
        char kname[16];
        memcpy(kname, str, (size_t)(colon - str));
        kname[colon - str] = 0;
        found = !kn_kv_fmt_parse(kname, &s.k_fmt) && !kn_kv_fmt_parse(colon + 1, &s.v_fmt);
    }
    if (!found || strlen(str) >= sizeof s.name)
        return kn_fail(err, KN_ERR_INVALID_ARG, "--kv %s: unknown KV format (known: %s)", str, known);
    snprintf(s.name, sizeof s.name, "%s", str);
    const int low = kn_kv_fmt_bits(s.k_fmt) < 4 || kn_kv_fmt_bits(s.v_fmt) < 4;
    s.boundary_layers = boundary >= 0 ? boundary : low ? 2 : 0;
    *out = s;
    return KN_OK;
}

void kn_kv_spec_layer(const kn_kv_spec *s, int l, int n_layers, int *k_fmt, int *v_fmt) {
    const int b = s->boundary_layers;
    if (b > 0 && (l < b || l >= n_layers - b)) *k_fmt = *v_fmt = s->boundary_fmt;
    else *k_fmt = s->k_fmt, *v_fmt = s->v_fmt;
}

kn_code kn_kv_spec_check_ids(const kn_kv_spec *s, int n_layers, const int *ids, int model_layers, const int *head_dim,
                             kn_error *err) {
    for (int i = 0; i < n_layers; i++) {
        const int l = ids ? ids[i] : i;
        int f[2];
        kn_kv_spec_layer(s, l, ids ? model_layers : n_layers, &f[0], &f[1]);
        for (int j = 0; j < 2; j++) {
            if (kn_kv_fmt_dim_ok(f[j], head_dim[i])) continue;
            if (kn_kv_fmt_rotated(f[j]))
                return kn_fail(err, KN_ERR_UNSUPPORTED,
                               "--kv %s: the rotated format %s needs head_dim 64, 128, 256 or 512, layer %d has %d "
                               "(use q8 or fp8)", s->name, kn_kv_fmt_name(f[j]), l, head_dim[i]);
            return kn_fail(err, KN_ERR_UNSUPPORTED, "--kv %s: format %s cannot store head_dim %d (layer %d)", s->name,
                           kn_kv_fmt_name(f[j]), head_dim[i], l);
        }
    }
    return KN_OK;
}

kn_code kn_kv_spec_check(const kn_kv_spec *s, int n_layers, const int *head_dim, kn_error *err) {
    return kn_kv_spec_check_ids(s, n_layers, NULL, n_layers, head_dim, err);
}

int64_t kn_kv_spec_bytes_per_token(const kn_kv_spec *s, int n_layers, const int *n_kv_heads, const int *head_dim) {
    int64_t b = 0;
    for (int l = 0; l < n_layers; l++) {
        int kf, vf;
        kn_kv_spec_layer(s, l, n_layers, &kf, &vf);
        b += (int64_t)n_kv_heads[l] * (kn_kv_row_bytes(kf, head_dim[l]) + kn_kv_row_bytes(vf, head_dim[l]));
    }
    return b;
}

void kn_kv_spec_describe(const kn_kv_spec *s, int n_layers, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s (K %s, V %s", s->name, kn_kv_fmt_name(s->k_fmt), kn_kv_fmt_name(s->v_fmt));
    if (n > 0 && (size_t)n < cap && s->boundary_layers > 0)
        n += snprintf(out + n, cap - (size_t)n, "; first/last %d of %d layers %s", s->boundary_layers, n_layers,
                      kn_kv_fmt_name(s->boundary_fmt));
    if (n > 0 && (size_t)n < cap && (kn_kv_fmt_rotated(s->k_fmt) || kn_kv_fmt_rotated(s->v_fmt)))
        n += snprintf(out + n, cap - (size_t)n, "; sign seed 0x%016llx", (unsigned long long)s->seed);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ")");
}

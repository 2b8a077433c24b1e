/* kv_codec.h — the KV-cache row formats of KV_FORMATS.md: byte layouts,
 * per-row encoders and per-element decoders, shared verbatim by the CPU
 * backend, the CUDA kernels (everything here is host+device inline under
 * nvcc) and the tests, so every backend writes and reads the same bytes.
 *
 * A row is one token's key (or value) vector of one KV head, D = head_dim
 * floats. Groups run along D only, so rows are self-contained byte strings.
 * Layout of a row: metadata first (fp16 little-endian arrays), then codes.
 *   f32    D x f32                       bf16  D x bf16
 *   fp8    D x e4m3 (x = scale * e4m3; scale per (layer, KV head), kn_kv_aux)
 *   q8s    [ng] fp16 scale, D x int8     x = s * q           (symmetric, s = amax/127)
 *   q8a    [ng] fp16 scale, [ng] fp16 zero, D x int8   x = s * (q + z)
 *          (TurboQuant keys: s = (max-min)/254, z integer, q clipped to +-127)
 *   q8     [ng] fp16 scale, [ng] fp16 bias, D x uint8   x = s * q + b (MLX affine)
 *   q4     same with 4-bit codes, element 2i in the low nibble of byte i (MLX)
 *   tqv{b} [D/32] fp16 RMS scale, D*b/8 bytes of codes     (rotated domain)
 *          y = H(x*s)/sqrt(D); code = Lloyd-Max N(0,1) of y/rms; y^ = rms*c[code]
 *   tq{b}  fp16 gamma, D*b/8 bytes of codes                (rotated domain)
 *          u = y/|x|; code = Lloyd-Max of the unit-vector coordinate law;
 *          y^ = gamma*c[code] with gamma = |x| / |c|
 * ng = D / g groups of g = min(32, D) (q4g64: min(64, D)). Codes of b bits
 * are packed LSB-first: element i occupies bits [i*b, i*b + b) of the code
 * bytes. Rotated formats decode to the rotated domain; kn_kv_unrotate maps
 * back (H is the Walsh-Hadamard matrix, symmetric, H*H = D*I).
 *
 * Must not: allocate, or depend on anything outside this header (it is
 * compiled as CUDA too). Tables (centroids, boundaries, sign vectors) come
 * from kv_codec.c through kn_kv_aux. */
#ifndef KN_BASE_KV_CODEC_H
#define KN_BASE_KV_CODEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KN_HD static inline __host__ __device__
#else
#define KN_HD static inline
#endif

typedef enum {
    KN_KVF_F32 = 0, /* zero: a zero-initialised kn_kv_layer is today's float layout */
    KN_KVF_BF16,
    KN_KVF_FP8,
    KN_KVF_Q8S,
    KN_KVF_Q8A,
    KN_KVF_Q8,
    KN_KVF_Q4,
    KN_KVF_Q4G64,
    KN_KVF_TQV2,
    KN_KVF_TQV3,
    KN_KVF_TQV4,
    KN_KVF_TQ3,
    KN_KVF_TQ4,
    KN_KVF_COUNT
} kn_kv_fmt;

/* Largest head_dim a format other than f32 handles (codecs use a [D] scratch). */
#define KN_KV_MAX_DIM 512

/* Per-row side information a codec needs (all pointers into memory of the
 * side that runs the codec: host for the CPU, device for CUDA). */
typedef struct {
    const float *tab;   /* rotated formats: centroids [2^b], then boundaries [2^b - 1] */
    const float *signs; /* rotated formats: [D] +-1 sign flips */
    float scale;        /* fp8: the (layer, KV head) scale */
} kn_kv_aux;

KN_HD int kn_kv_fmt_rotated(int f) { return f >= KN_KVF_TQV2 && f <= KN_KVF_TQ4; }
KN_HD int kn_kv_fmt_is_tq(int f) { return f == KN_KVF_TQ3 || f == KN_KVF_TQ4; }
/* bits per element of the codes */
KN_HD int kn_kv_fmt_bits(int f) {
    switch (f) {
    case KN_KVF_F32: return 32;
    case KN_KVF_BF16: return 16;
    case KN_KVF_Q4: case KN_KVF_Q4G64: case KN_KVF_TQV4: case KN_KVF_TQ4: return 4;
    case KN_KVF_TQV2: return 2;
    case KN_KVF_TQV3: case KN_KVF_TQ3: return 3;
    default: return 8;
    }
}
/* group size along D of the grouped formats (0: none) */
KN_HD int kn_kv_fmt_group(int f, int D) {
    switch (f) {
    case KN_KVF_Q8S: case KN_KVF_Q8A: case KN_KVF_Q8: case KN_KVF_Q4: return D < 32 ? D : 32;
    case KN_KVF_Q4G64: return D < 64 ? D : 64;
    case KN_KVF_TQV2: case KN_KVF_TQV3: case KN_KVF_TQV4: return 32;
    default: return 0;
    }
}
/* bytes of one row */
KN_HD int64_t kn_kv_row_bytes(int f, int D) {
    const int g = kn_kv_fmt_group(f, D), ng = g ? D / g : 0;
    switch (f) {
    case KN_KVF_F32: return 4 * (int64_t)D;
    case KN_KVF_BF16: return 2 * (int64_t)D;
    case KN_KVF_FP8: return D;
    case KN_KVF_Q8S: return 2 * ng + D;
    case KN_KVF_Q8A: case KN_KVF_Q8: return 4 * ng + D;
    case KN_KVF_Q4: case KN_KVF_Q4G64: return 4 * ng + D / 2;
    case KN_KVF_TQV2: case KN_KVF_TQV3: case KN_KVF_TQV4: return 2 * ng + (int64_t)D * kn_kv_fmt_bits(f) / 8;
    case KN_KVF_TQ3: case KN_KVF_TQ4: return 2 + (int64_t)D * kn_kv_fmt_bits(f) / 8;
    default: return 0;
    }
}
/* offset of the codes inside a row */
KN_HD int kn_kv_code_offset(int f, int D) { return (int)(kn_kv_row_bytes(f, D) - (int64_t)D * kn_kv_fmt_bits(f) / 8); }

/* ---- scalar conversions (bit-exact on host and device) ---- */

KN_HD uint32_t kn_kv_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
KN_HD float kn_kv_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

KN_HD uint16_t kn_kv_f32_to_f16(float f) { /* round to nearest even; overflow -> inf */
    uint32_t x = kn_kv_f2u(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) {
        if (x < 0x33000000u) return (uint16_t)sign;
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(x >> 23);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), hf = 1u << (shift - 1);
        if (rem > hf || (rem == hf && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (x - 0x38000000u) >> 13, rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
KN_HD float kn_kv_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        return s ? -f : f;
    }
    if (e == 31) return kn_kv_u2f(s | 0x7f800000u | (m << 13));
    return kn_kv_u2f(s | ((e + 112u) << 23) | (m << 13));
}
/* fp16 of a non-negative scale, saturated at 65504 (never inf) */
KN_HD uint16_t kn_kv_scale_f16(float v) { return kn_kv_f32_to_f16(v < 65504.0f ? v : 65504.0f); }
KN_HD uint16_t kn_kv_f32_to_bf16(float f) {
    uint32_t u = kn_kv_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
KN_HD float kn_kv_bf16_to_f32(uint16_t h) { return kn_kv_u2f((uint32_t)h << 16); }

/* e4m3 (OCP "fn": bias 7, no infinities, max 448): round to nearest even,
 * saturating at +-448; NaN -> 0x7f */
KN_HD uint8_t kn_kv_f32_to_e4m3(float v) {
    const uint32_t sign = (kn_kv_f2u(v) >> 24) & 0x80u;
    float a = fabsf(v);
    if (!(a == a)) return 0x7f;
    if (a >= 448.0f) return (uint8_t)(sign | 0x7eu);
    if (a < 0.015625f) { /* below 2^-6: subnormal steps of 2^-9 (8 rounds up to the first normal) */
        int m = (int)rintf(a * 512.0f);
        return (uint8_t)(sign | (uint32_t)m);
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    int m = (int)rintf((fr * 2.0f - 1.0f) * 8.0f);
    if (m == 8) m = 0, e++;
    int E = e - 1 + 7;
    if (E > 15 || (E == 15 && m == 7)) return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | ((uint32_t)E << 3) | (uint32_t)m);
}
KN_HD float kn_kv_e4m3_to_f32(uint8_t b) {
    const int E = (b >> 3) & 15, m = b & 7;
    float v = E == 0 ? (float)m * 0.001953125f : ldexpf(1.0f + (float)m * 0.125f, E - 7);
    if ((b & 0x7f) == 0x7f) v = NAN;
    return (b & 0x80) ? -v : v;
}

KN_HD float kn_kv_half_at(const uint8_t *p, int i) { return kn_kv_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8))); }
KN_HD void kn_kv_half_put(uint8_t *p, int i, uint16_t h) { p[2 * i] = (uint8_t)(h & 0xff), p[2 * i + 1] = (uint8_t)(h >> 8); }

/* b-bit code of element i (LSB-first) */
KN_HD unsigned kn_kv_code(const uint8_t *p, int i, int b) {
    const int bit = i * b, o = bit & 7;
    unsigned v = (unsigned)p[bit >> 3] >> o;
    if (o + b > 8) v |= (unsigned)p[(bit >> 3) + 1] << (8 - o);
    return v & ((1u << b) - 1u);
}
/* p must be zeroed beforehand */
KN_HD void kn_kv_code_put(uint8_t *p, int i, int b, unsigned c) {
    const int bit = i * b, o = bit & 7;
    p[bit >> 3] |= (uint8_t)(c << o);
    if (o + b > 8) p[(bit >> 3) + 1] |= (uint8_t)(c >> (8 - o));
}

/* ---- rotation: y = H(x*s)/sqrt(D), x = s*H(y)/sqrt(D) ---- */

KN_HD void kn_fwht(float *x, int n) { /* unnormalised, in place; n a power of two */
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
}
KN_HD void kn_kv_rotate(const float *x, int D, const float *signs, float *y) {
    for (int i = 0; i < D; i++) y[i] = x[i] * signs[i];
    kn_fwht(y, D);
    const float r = 1.0f / sqrtf((float)D);
    for (int i = 0; i < D; i++) y[i] *= r;
}
KN_HD void kn_kv_unrotate(float *y, int D, const float *signs) { /* in place */
    kn_fwht(y, D);
    const float r = 1.0f / sqrtf((float)D);
    for (int i = 0; i < D; i++) y[i] *= r * signs[i];
}

/* Lloyd-Max code of v: the number of boundaries below it */
KN_HD unsigned kn_kv_lm_code(float v, const float *bounds, int n_levels) {
    unsigned c = 0;
    for (int i = 0; i < n_levels - 1; i++) c += v > bounds[i];
    return c;
}

/* ---- element decode ---- */

/* Element d of a row, in the rotated domain for rotated formats. */
KN_HD float kn_kv_elem(int f, const uint8_t *row, int d, int D, const kn_kv_aux *aux) {
    switch (f) {
    case KN_KVF_F32: { float v; memcpy(&v, row + 4 * d, 4); return v; }
    case KN_KVF_BF16: return kn_kv_bf16_to_f32((uint16_t)(row[2 * d] | (row[2 * d + 1] << 8)));
    case KN_KVF_FP8: return aux->scale * kn_kv_e4m3_to_f32(row[d]);
    case KN_KVF_Q8S: {
        const int g = kn_kv_fmt_group(f, D), ng = D / g;
        return kn_kv_half_at(row, d / g) * (float)(int8_t)row[2 * ng + d];
    }
    case KN_KVF_Q8A: {
        const int g = kn_kv_fmt_group(f, D), ng = D / g;
        return kn_kv_half_at(row, d / g) * ((float)(int8_t)row[4 * ng + d] + kn_kv_half_at(row, ng + d / g));
    }
    case KN_KVF_Q8: {
        const int g = kn_kv_fmt_group(f, D), ng = D / g;
        return kn_kv_half_at(row, d / g) * (float)row[4 * ng + d] + kn_kv_half_at(row, ng + d / g);
    }
    case KN_KVF_Q4: case KN_KVF_Q4G64: {
        const int g = kn_kv_fmt_group(f, D), ng = D / g;
        const unsigned q = (row[4 * ng + d / 2] >> (4 * (d & 1))) & 15u;
        return kn_kv_half_at(row, d / g) * (float)q + kn_kv_half_at(row, ng + d / g);
    }
    case KN_KVF_TQV2: case KN_KVF_TQV3: case KN_KVF_TQV4: {
        const int b = kn_kv_fmt_bits(f);
        return kn_kv_half_at(row, d / 32) * aux->tab[kn_kv_code(row + 2 * (D / 32), d, b)];
    }
    case KN_KVF_TQ3: case KN_KVF_TQ4: {
        const int b = kn_kv_fmt_bits(f);
        return kn_kv_half_at(row, 0) * aux->tab[kn_kv_code(row + 2, d, b)];
    }
    default: return 0.0f;
    }
}

/* Whole row into out[D] (rotated domain for rotated formats). */
KN_HD void kn_kv_decode_rot(int f, const uint8_t *row, int D, const kn_kv_aux *aux, float *out) {
    for (int d = 0; d < D; d++) out[d] = kn_kv_elem(f, row, d, D, aux);
}
/* Whole row into out[D] in the original domain. */
KN_HD void kn_kv_decode(int f, const uint8_t *row, int D, const kn_kv_aux *aux, float *out) {
    kn_kv_decode_rot(f, row, D, aux, out);
    if (kn_kv_fmt_rotated(f)) kn_kv_unrotate(out, D, aux->signs);
}

/* ---- row encode ---- */

/* MLX affine quantization of one group (as kn_quant_group in quant.h:
 * max seeded with 0, edge snapped, round half away from zero), codes as
 * bytes (bits 8) or LSB-first nibbles (bits 4); scale/bias stored fp16. */
KN_HD void kn_kv_affine_group(const float *w, int gs, int bits, uint8_t *codes, uint16_t *scale_h, uint16_t *bias_h) {
    const float n_bins = (float)((1 << bits) - 1);
    float w_min = 3.402823466e38f, w_max = 0.0f;
    for (int i = 0; i < gs; i++) w_min = fminf(w_min, w[i]), w_max = fmaxf(w_max, w[i]);
    float scale = fmaxf((w_max - w_min) / n_bins, 1e-7f);
    const int side = fabsf(w_min) > fabsf(w_max);
    scale = side ? scale : -scale;
    const float edge = side ? w_min : w_max, q0 = roundf(edge / scale);
    const int at_zero = q0 == 0.0f;
    scale = at_zero ? scale : edge / q0;
    const float bias = at_zero ? 0.0f : edge;
    for (int i = 0; i < gs; i++) {
        float v = fminf(roundf((w[i] - bias) / scale), n_bins);
        unsigned q = v > 0.0f ? (unsigned)v : 0u;
        if (bits == 8) codes[i] = (uint8_t)q;
        else codes[i / 2] |= (uint8_t)(q << (4 * (i & 1)));
    }
    *scale_h = kn_kv_f32_to_f16(scale), *bias_h = kn_kv_f32_to_f16(bias);
}

/* Encode x[D] into row (kn_kv_row_bytes(f, D) bytes). tmp: [D] scratch
 * (used by the rotated formats). Non-finite inputs give finite garbage,
 * never out-of-range codes. */
KN_HD void kn_kv_encode(int f, const float *x, int D, uint8_t *row, const kn_kv_aux *aux, float *tmp) {
    const int g = kn_kv_fmt_group(f, D), ng = g ? D / g : 0;
    switch (f) {
    case KN_KVF_F32: memcpy(row, x, 4 * (size_t)D); return;
    case KN_KVF_BF16:
        for (int d = 0; d < D; d++) {
            uint16_t h = kn_kv_f32_to_bf16(x[d]);
            row[2 * d] = (uint8_t)(h & 0xff), row[2 * d + 1] = (uint8_t)(h >> 8);
        }
        return;
    case KN_KVF_FP8: {
        const float inv = aux->scale > 0.0f ? 1.0f / aux->scale : 1.0f;
        for (int d = 0; d < D; d++) row[d] = kn_kv_f32_to_e4m3(x[d] * inv);
        return;
    }
    case KN_KVF_Q8S:
        for (int k = 0; k < ng; k++) {
            float amax = 0.0f;
            for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[k * g + i]));
            uint16_t sh = kn_kv_scale_f16(amax / 127.0f);
            float s = kn_kv_f16_to_f32(sh);
            kn_kv_half_put(row, k, sh);
            for (int i = 0; i < g; i++) {
                float q = s > 0.0f ? rintf(x[k * g + i] / s) : 0.0f;
                q = fminf(fmaxf(q, -127.0f), 127.0f);
                row[2 * ng + k * g + i] = (uint8_t)(int8_t)(q == q ? q : 0.0f);
            }
        }
        return;
    case KN_KVF_Q8A:
        for (int k = 0; k < ng; k++) {
            float mn = x[k * g], mx = x[k * g];
            for (int i = 1; i < g; i++) mn = fminf(mn, x[k * g + i]), mx = fmaxf(mx, x[k * g + i]);
            /* s >= |center| / 2048 keeps the integer zero exact in fp16 */
            float s = fmaxf((mx - mn) / 254.0f, fabsf(mx + mn) * 0.5f / 2048.0f);
            uint16_t sh = kn_kv_scale_f16(s);
            s = kn_kv_f16_to_f32(sh);
            float z = s > 0.0f ? rintf((mx + mn) * 0.5f / s) : 0.0f;
            z = z == z ? fminf(fmaxf(z, -2048.0f), 2048.0f) : 0.0f;
            kn_kv_half_put(row, k, sh);
            kn_kv_half_put(row, ng + k, kn_kv_f32_to_f16(z));
            for (int i = 0; i < g; i++) {
                float q = s > 0.0f ? rintf(x[k * g + i] / s) - z : 0.0f;
                q = fminf(fmaxf(q, -127.0f), 127.0f);
                row[4 * ng + k * g + i] = (uint8_t)(int8_t)(q == q ? q : 0.0f);
            }
        }
        return;
    case KN_KVF_Q8: case KN_KVF_Q4: case KN_KVF_Q4G64: {
        const int bits = kn_kv_fmt_bits(f);
        uint8_t *codes = row + 4 * ng;
        if (bits == 4) memset(codes, 0, (size_t)D / 2);
        for (int k = 0; k < ng; k++) {
            uint16_t sh, bh;
            kn_kv_affine_group(x + k * g, g, bits, codes + (bits == 8 ? k * g : k * g / 2), &sh, &bh);
            kn_kv_half_put(row, k, sh), kn_kv_half_put(row, ng + k, bh);
        }
        return;
    }
    case KN_KVF_TQV2: case KN_KVF_TQV3: case KN_KVF_TQV4: {
        const int b = kn_kv_fmt_bits(f), L = 1 << b;
        uint8_t *codes = row + 2 * (D / 32);
        memset(codes, 0, (size_t)D * b / 8);
        kn_kv_rotate(x, D, aux->signs, tmp);
        for (int k = 0; k < D / 32; k++) {
            float ss = 0.0f;
            for (int i = 0; i < 32; i++) ss += tmp[k * 32 + i] * tmp[k * 32 + i];
            uint16_t sh = kn_kv_scale_f16(sqrtf(ss / 32.0f));
            float s = kn_kv_f16_to_f32(sh), inv = s > 0.0f ? 1.0f / s : 0.0f;
            kn_kv_half_put(row, k, sh);
            for (int i = 0; i < 32; i++)
                kn_kv_code_put(codes, k * 32 + i, b, kn_kv_lm_code(tmp[k * 32 + i] * inv, aux->tab + L, L));
        }
        return;
    }
    case KN_KVF_TQ3: case KN_KVF_TQ4: {
        const int b = kn_kv_fmt_bits(f), L = 1 << b;
        uint8_t *codes = row + 2;
        memset(codes, 0, (size_t)D * b / 8);
        kn_kv_rotate(x, D, aux->signs, tmp);
        float ss = 0.0f;
        for (int i = 0; i < D; i++) ss += tmp[i] * tmp[i];
        const float n = sqrtf(ss), inv = n > 0.0f ? 1.0f / n : 0.0f;
        float cc = 0.0f;
        for (int i = 0; i < D; i++) {
            unsigned c = kn_kv_lm_code(tmp[i] * inv, aux->tab + L, L);
            kn_kv_code_put(codes, i, b, c);
            cc += aux->tab[c] * aux->tab[c];
        }
        kn_kv_half_put(row, 0, kn_kv_scale_f16(cc > 0.0f ? n / sqrtf(cc) : 0.0f));
        return;
    }
    default: memset(row, 0, (size_t)kn_kv_row_bytes(f, D)); return;
    }
}

#endif

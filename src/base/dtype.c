/* dtype.c — dtype sizes, names and the f16 conversions (see dtype.h). */
#include "base/dtype.h"

static const struct { const char *name; size_t size; } dtype_info[KN_DT_COUNT] = {
    [KN_DT_F32] = {"F32", 4},       [KN_DT_F16] = {"F16", 2},
    [KN_DT_BF16] = {"BF16", 2},     [KN_DT_F64] = {"F64", 8},
    [KN_DT_F8_E4M3] = {"F8_E4M3", 1}, [KN_DT_F8_E5M2] = {"F8_E5M2", 1},
    [KN_DT_I8] = {"I8", 1},         [KN_DT_U8] = {"U8", 1},
    [KN_DT_I16] = {"I16", 2},       [KN_DT_U16] = {"U16", 2},
    [KN_DT_I32] = {"I32", 4},       [KN_DT_U32] = {"U32", 4},
    [KN_DT_I64] = {"I64", 8},       [KN_DT_U64] = {"U64", 8},
    [KN_DT_BOOL] = {"BOOL", 1},
};

size_t kn_dtype_size(kn_dtype t) { return (unsigned)t < KN_DT_COUNT ? dtype_info[t].size : 0; }

const char *kn_dtype_name(kn_dtype t) { return (unsigned)t < KN_DT_COUNT ? dtype_info[t].name : "?"; }

int kn_dtype_parse(const char *s, kn_dtype *out) {
    for (int i = 0; i < KN_DT_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (kn_dtype)i;
            return 0;
        }
    }
    return -1;
}

float kn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kn_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) {                                     /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (113 - e) */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent */
    uint32_t out = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (out & 1))) out++;
    return (uint16_t)(sign | out);
}

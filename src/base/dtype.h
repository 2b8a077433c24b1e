/* dtype.h — element types of tensors on disk and in memory, and the scalar
 * conversions between them (bf16/f16 <-> f32). Conversions are exact where the
 * target can represent the value; f32 -> bf16/f16 rounds to nearest even. */
#ifndef KN_BASE_DTYPE_H
#define KN_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    KN_DT_F32 = 0,
    KN_DT_F16,
    KN_DT_BF16,
    KN_DT_F64,
    KN_DT_F8_E4M3,
    KN_DT_F8_E5M2,
    KN_DT_I8,
    KN_DT_U8,
    KN_DT_I16,
    KN_DT_U16,
    KN_DT_I32,
    KN_DT_U32,
    KN_DT_I64,
    KN_DT_U64,
    KN_DT_BOOL,
    KN_DT_COUNT
} kn_dtype;

/* Size of one element in bytes. */
size_t kn_dtype_size(kn_dtype t);
/* Name as safetensors spells it ("F32", "BF16", ...). */
const char *kn_dtype_name(kn_dtype t);
/* Parse a safetensors dtype string; returns 0 and sets *out, or -1 if unknown. */
int kn_dtype_parse(const char *s, kn_dtype *out);

static inline float kn_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t kn_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float kn_f16_to_f32(uint16_t h);
uint16_t kn_f32_to_f16(float f);

/* Element i of a float array of dtype dt (F32/BF16/F16) as float; 0 for other dtypes. */
/* p need not be aligned: safetensors data offsets carry no alignment promise. */
static inline float kn_load_f32(const void *p, kn_dtype dt, int64_t i) {
    const unsigned char *c = (const unsigned char *)p;
    float f;
    uint16_t h;
    switch (dt) {
    case KN_DT_F32: memcpy(&f, c + i * 4, 4); return f;
    case KN_DT_BF16: memcpy(&h, c + i * 2, 2); return kn_bf16_to_f32(h);
    case KN_DT_F16: memcpy(&h, c + i * 2, 2); return kn_f16_to_f32(h);
    default: return 0.0f;
    }
}

#endif

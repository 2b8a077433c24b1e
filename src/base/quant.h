/* quant.h — MLX affine weight quantization: the scheme's parameters, packing
 * layout and scalar reference math, shared by the loader, `kiln quantize`,
 * the backends' kernels (as the definition they must match) and the tests.
 *
 * A row of cols values is split into groups of group_size; each group has a
 * scale and a bias and each value a bits-bit code q:  w = scale * q + bias.
 * Codes are packed into little-endian uint32 words, 32/bits per word, value
 * c at bit offset bits * (c % (32/bits)) of word c / (32/bits) (MLX's layout
 * for bits 2, 4, 8; 3/5/6-bit layouts cross words and are not supported). */
#ifndef KN_BASE_QUANT_H
#define KN_BASE_QUANT_H

#include <stdint.h>

#include "base/status.h"

/* 1 if bits/group_size are a combination kiln reads and writes. */
static inline int kn_quant_bits_ok(int bits) { return bits == 2 || bits == 4 || bits == 8; }
static inline int kn_quant_group_ok(int gs) { return gs == 32 || gs == 64 || gs == 128; }

/* Validate a quantized matrix shape; the message names `what`. */
kn_code kn_quant_check(const char *what, int bits, int group_size, int64_t rows, int64_t cols, kn_error *err);

/* uint32 words per packed row. */
static inline int64_t kn_quant_row_words(int64_t cols, int bits) { return cols * bits / 32; }

/* Code of element c of a packed row. */
static inline uint32_t kn_quant_code(const uint32_t *row, int64_t c, int bits) {
    const int per = 32 / bits;
    return (row[c / per] >> (bits * (int)(c % per))) & ((1u << bits) - 1u);
}

/* Quantize one group of gs values exactly as MLX's affine_quantize (float32
 * math): scale = max((max(w, 0 seed) - min) / (2^bits - 1), 1e-7), signed
 * and snapped so that the larger-magnitude edge is exactly representable,
 * q = min(round((w - bias) / scale), 2^bits - 1) with round half away from
 * zero. Writes gs*bits/32 words to packed (gs a multiple of 32/bits) and the
 * float32 scale and bias (callers store them in the checkpoint's dtype). */
void kn_quant_group(const float *w, int gs, int bits, uint32_t *packed, float *scale, float *bias);

/* Dequantize one packed row into out[cols] (float32: scale * q + bias). */
void kn_quant_dequant_row(const uint32_t *row, const float *scales, const float *biases, int64_t cols, int gs, int bits,
                          float *out);

#endif

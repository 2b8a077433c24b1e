/* quant.h — MLX affine weight quantization: the scheme's parameters, packing
 * layout and scalar reference math, shared by the loader, `kiln quantize`,
 * the backends' kernels (as the definition they must match) and the tests.
 *
 * A row of cols values is split into groups of group_size; each group has a
 * scale and a bias and each value a bits-bit code q:  w = scale * q + bias.
 * Codes are packed as MLX packs them: a row is a little-endian bit stream
 * (uint32 words, least significant bit first) with code c at bits
 * [bits * c, bits * c + bits). For bits 2, 4, 8 that is 32/bits codes per
 * word; 3-bit codes come 8 to 3 bytes, 5-bit 8 to 5 bytes and 6-bit 4 to
 * 3 bytes, crossing word boundaries.
 *
 * Checkpoints may hold 2, 3, 4, 5, 6 or 8 bits; the backends compute with
 * 2, 4 and 8 (kn_quant_compute_bits): the loader widens 3-bit codes to 4 and
 * 5/6-bit codes to 8 with the same scales and biases, which is exact (the
 * codes fit) and costs the memory of the wider layout. */
#ifndef KN_BASE_QUANT_H
#define KN_BASE_QUANT_H

#include <stdint.h>

#include "base/status.h"

/* 1 if kiln reads and writes checkpoints with these bits / group size. */
static inline int kn_quant_bits_ok(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
/* The layout the backends compute with for checkpoint bits (see above). */
static inline int kn_quant_compute_bits(int bits) { return bits == 3 ? 4 : bits == 5 || bits == 6 ? 8 : bits; }
static inline int kn_quant_group_ok(int gs) { return gs == 32 || gs == 64 || gs == 128; }

/* Validate a quantized matrix shape; the message names `what`. */
kn_code kn_quant_check(const char *what, int bits, int group_size, int64_t rows, int64_t cols, kn_error *err);
/* The same for what a backend holds: bits 2, 4 or 8 only. */
kn_code kn_quant_check_compute(const char *what, int bits, int group_size, int64_t rows, int64_t cols, kn_error *err);

/* uint32 words per packed row. */
static inline int64_t kn_quant_row_words(int64_t cols, int bits) { return cols * bits / 32; }

/* Code of element c of a packed row. */
static inline uint32_t kn_quant_code(const uint32_t *row, int64_t c, int bits) {
    const uint64_t bit = (uint64_t)c * (uint64_t)bits, word = bit / 32;
    const unsigned off = (unsigned)(bit % 32);
    uint64_t v = row[word] >> off;
    if (off + (unsigned)bits > 32) v |= (uint64_t)row[word + 1] << (32 - off);
    return (uint32_t)v & ((1u << bits) - 1u);
}

/* OR code q (< 2^bits) into element c of a zeroed packed row. */
static inline void kn_quant_put(uint32_t *row, int64_t c, int bits, uint32_t q) {
    const uint64_t bit = (uint64_t)c * (uint64_t)bits, word = bit / 32;
    const unsigned off = (unsigned)(bit % 32);
    row[word] |= q << off;
    if (off + (unsigned)bits > 32) row[word + 1] |= q >> (32 - off);
}

/* Quantize one group of gs values exactly as MLX's affine_quantize (float32
 * math): scale = max((max(w, 0 seed) - min) / (2^bits - 1), 1e-7), signed
 * and snapped so that the larger-magnitude edge is exactly representable,
 * q = min(round((w - bias) / scale), 2^bits - 1) with round half away from
 * zero. Writes gs*bits/32 words to packed (gs*bits a multiple of 32) and the
 * float32 scale and bias (callers store them in the checkpoint's dtype). */
void kn_quant_group(const float *w, int gs, int bits, uint32_t *packed, float *scale, float *bias);

/* Dequantize one packed row into out[cols] (float32: scale * q + bias). */
void kn_quant_dequant_row(const uint32_t *row, const float *scales, const float *biases, int64_t cols, int gs, int bits,
                          float *out);

#endif

/* kv_codec_tables.h — host-side tables for the KV row formats (kv_codec.h):
 * names, head-dim rules, Lloyd-Max codebooks (float64 fixed-point
 * iteration) and the rotation's sign vectors. */
#ifndef KN_BASE_KV_CODEC_TABLES_H
#define KN_BASE_KV_CODEC_TABLES_H

#include <stdint.h>

#include "base/kv_codec.h"

/* Default seed of the rotation's sign vectors (recorded in the cache header). */
#define KN_KV_SIGN_SEED 0x6b696c6e2d747121ull

const char *kn_kv_fmt_name(int f);
/* "bf16", "q8", "tqv3", ... -> KN_KVF_*; 0 ok, -1 unknown */
int kn_kv_fmt_parse(const char *s, int *out);
/* 1 if format f stores head_dim D (rotated formats: 64/128/256/512) */
int kn_kv_fmt_dim_ok(int f, int D);

/* Lloyd-Max quantizer with 2^bits levels of N(0,1) (D = 0) or of
 * t = sqrt(D) * u_i, u uniform on the unit sphere of R^D (D >= 4; density
 * proportional to (1 - t^2/D)^((D-3)/2)). Centroids ascending into c[2^bits];
 * returns the iterations used (stops when no centroid moves by 1e-14). */
int kn_lloyd_max(int D, int bits, double *c);
/* One application of the Lloyd-Max map (centroids -> conditional means of
 * their cells); returns the largest move. */
double kn_lloyd_max_step(int D, int bits, const double *c, double *next);
/* E[(t - Q(t))^2] of the quantizer with centroids c. */
double kn_lloyd_max_mse(int D, int bits, const double *c);

/* floats of a rotated format's table (0 for others) and its contents:
 * centroids then boundaries, in the scale the codec uses (N(0,1) for tqv,
 * unit-vector coordinates for tq). */
int kn_kv_fmt_tab_len(int f);
void kn_kv_fmt_table(int f, int D, float *tab);
/* The +-1 sign vector of the rotation for head dim D from seed. */
void kn_kv_signs(uint64_t seed, int D, float *signs);

#endif

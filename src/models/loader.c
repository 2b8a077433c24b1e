/* loader.c — see loader.h. */
#include "models/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"

const kn_st_tensor *ld_find(const kn_tensor_source *src, const char *fmt, int layer) {
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    return src->find(src->ctx, name);
}

kn_code ld_check_shape(const kn_st_tensor *t, const char *name, int64_t rows, int64_t cols, kn_error *err) {
    int ok = cols ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) : (t->ndim == 1 && t->shape[0] == rows);
    if (ok) return KN_OK;
    char got[128] = "";
    int n = 0;
    for (int i = 0; i < t->ndim && n < (int)sizeof got - 24; i++)
        n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (cols)
        return kn_fail(err, KN_ERR_FORMAT, "tensor %s has shape [%s], expected [%lld, %lld] from config.json", name,
                       got, (long long)rows, (long long)cols);
    return kn_fail(err, KN_ERR_FORMAT, "tensor %s has shape [%s], expected [%lld] from config.json", name, got,
                   (long long)rows);
}

kn_code ld_check_float(const kn_st_tensor *t, const char *name, kn_error *err) {
    if (t->dtype == KN_DT_F32 || t->dtype == KN_DT_BF16 || t->dtype == KN_DT_F16) return KN_OK;
    return kn_fail(err, KN_ERR_UNSUPPORTED, "tensor %s has dtype %s (supported: F32, BF16, F16)", name,
                   kn_dtype_name(t->dtype));
}

kn_code ld_read_vec(const kn_tensor_source *src, const char *fmt, int layer, int64_t n, int required, float *host,
                    int *found, kn_error *err) {
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    const kn_st_tensor *t = src->find(src->ctx, name);
    *found = t != NULL;
    if (!t) return required ? kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name) : KN_OK;
    kn_code rc = ld_check_float(t, name, err);
    if (!rc) rc = ld_check_shape(t, name, n, 0, err);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) host[i] = kn_load_f32(t->data, t->dtype, i);
    return KN_OK;
}

kn_code ld_upload_vec(kn_model *m, const float *host, int64_t n, float **out, kn_error *err) {
    *out = kn_be_alloc(m->be, (size_t)n * sizeof(float));
    if (!*out) return kn_fail(err, KN_ERR_NOMEM, "out of memory for a %lld-float vector", (long long)n);
    kn_be_upload(m->be, *out, host, (size_t)n * sizeof(float));
    return KN_OK;
}

kn_code ld_load_vec(kn_model *m, const kn_tensor_source *src, const char *fmt, int layer, int64_t n, int required,
                    float offset, float **out, kn_error *err) {
    *out = NULL;
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    int found;
    kn_code rc = ld_read_vec(src, fmt, layer, n, required, host, &found, err);
    if (!rc && found && offset != 0.0f)
        for (int64_t i = 0; i < n; i++) host[i] = offset + host[i]; /* as transformers: (1.0 + w.float()) */
    if (!rc && found) rc = ld_upload_vec(m, host, n, out, err);
    free(host);
    return rc;
}

kn_code ld_permute_qk_rows(uint8_t *rows, size_t row_bytes, const ld_qk_perm *p, kn_error *err) {
    if (!p || p->rot_dim <= 0) return KN_OK;
    const int hd = p->head_dim, half = p->rot_dim / 2, heads = p->q_heads + p->kv_heads;
    uint8_t *tmp = malloc((size_t)p->rot_dim * row_bytes);
    if (!tmp) return kn_fail(err, KN_ERR_NOMEM, "out of memory permuting rotary rows");
    for (int h = 0; h < heads; h++) {
        uint8_t *head = rows + (size_t)h * hd * row_bytes;
        memcpy(tmp, head, (size_t)p->rot_dim * row_bytes);
        for (int i = 0; i < half; i++) {
            memcpy(head + (size_t)i * row_bytes, tmp + (size_t)(2 * i) * row_bytes, row_bytes);
            memcpy(head + (size_t)(half + i) * row_bytes, tmp + (size_t)(2 * i + 1) * row_bytes, row_bytes);
        }
    }
    free(tmp);
    return KN_OK;
}

/* The MLX-quantized form of weight `name` (HF name ending in ".weight"):
 * codes in `t` (U32 [rows, cols*bits/32]) plus <module>.scales/.biases
 * [rows, cols/group_size]; bits and group size follow from the shapes (so
 * per-module overrides need no lookup) and are checked against what kiln
 * supports. *found = 0 when the module has no scales (not quantized). */
typedef struct {
    const kn_st_tensor *q, *scales, *biases;
    int bits, group_size;
} ld_qpart;

/* rows of a tensor read as a matrix: the product of all but its last dim */
static int64_t lead_rows(const kn_st_tensor *t) {
    int64_t r = 1;
    for (int i = 0; i + 1 < t->ndim; i++) r *= t->shape[i];
    return r;
}

static kn_code ld_quant_part(const kn_tensor_source *src, const char *name, const kn_st_tensor *t, int64_t rows,
                             int64_t cols, ld_qpart *out, int *found, kn_error *err) {
    char base[256], sname[272], bname[272];
    size_t len = strlen(name);
    *found = 0;
    if (len < 7 || strcmp(name + len - 7, ".weight") != 0) return KN_OK;
    snprintf(base, sizeof base, "%.*s", (int)(len - 7), name);
    snprintf(sname, sizeof sname, "%s.scales", base);
    snprintf(bname, sizeof bname, "%s.biases", base);
    const kn_st_tensor *sc = src->find(src->ctx, sname);
    if (!sc) return KN_OK;
    *found = 1;
    const kn_st_tensor *bi = src->find(src->ctx, bname);
    if (!bi) return kn_fail(err, KN_ERR_FORMAT, "checkpoint has %s but no %s", sname, bname);
    const int last = t->ndim - 1;
    if (t->dtype != KN_DT_U32 || (t->ndim != 2 && t->ndim != 3) || lead_rows(t) != rows || t->shape[last] <= 0 ||
        (t->shape[last] * 32) % cols != 0)
        return kn_fail(err, KN_ERR_FORMAT,
                       "quantized tensor %s must be U32 [%lld, cols*bits/32] for %lld input columns (has dtype %s)",
                       name, (long long)rows, (long long)cols, kn_dtype_name(t->dtype));
    int bits = (int)(t->shape[last] * 32 / cols);
    kn_code rc = ld_check_float(sc, sname, err);
    if (!rc) rc = ld_check_float(bi, bname, err);
    if (rc) return rc;
    const int64_t sgroups = sc->ndim == t->ndim ? sc->shape[last] : 0;
    if (sc->ndim != t->ndim || lead_rows(sc) != rows || sgroups <= 0 || cols % sgroups != 0)
        return kn_fail(err, KN_ERR_FORMAT, "tensor %s must be [%lld, cols/group_size] for %lld columns", sname,
                       (long long)rows, (long long)cols);
    if (bi->dtype != sc->dtype || bi->ndim != sc->ndim || lead_rows(bi) != rows || bi->shape[last] != sgroups)
        return kn_fail(err, KN_ERR_FORMAT, "tensors %s and %s differ in dtype or shape", sname, bname);
    int64_t gs = cols / sgroups;
    if (gs > 1024) return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: quantization group size %lld", name, (long long)gs);
    if ((rc = kn_quant_check(name, bits, (int)gs, rows, cols, err))) return rc;
    *out = (ld_qpart){.q = t, .scales = sc, .biases = bi, .bits = bits, .group_size = (int)gs};
    return KN_OK;
}

/* Codes, scales and biases of `rows` rows (source bits sb, group size sg,
 * scale dtype sdt) rewritten for the layout (bits, gs, dt): each code as is
 * (bits >= sb), each group's scale and bias repeated over the gs-sized
 * groups it covers (gs <= sg), scales widened to f32 when dt is F32. Exact:
 * every weight keeps its value scale * q + bias. src: room for one source
 * row's words. */
static void ld_repack_quant(const uint8_t *q, const uint8_t *sc, const uint8_t *bi, int64_t rows, int64_t cols, int sb,
                            int sg, kn_dtype sdt, int bits, int gs, kn_dtype dt, uint8_t *oq, uint8_t *osc,
                            uint8_t *obi, uint32_t *src) {
    const int64_t sw = kn_quant_row_words(cols, sb), ow = kn_quant_row_words(cols, bits);
    const int64_t sG = cols / sg, oG = cols / gs;
    const size_t ssz = kn_dtype_size(sdt), osz = kn_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(src, q + r * sw * 4, (size_t)sw * 4); /* the checkpoint's bytes need not be 4-byte aligned */
        uint32_t *dst = (uint32_t *)(void *)oq + r * ow;
        memset(dst, 0, (size_t)ow * 4);
        for (int64_t c = 0; c < cols; c++) kn_quant_put(dst, c, bits, kn_quant_code(src, c, sb));
        for (int64_t g = 0; g < oG; g++) {
            const int64_t from = r * sG + g * gs / sg, to = r * oG + g;
            if (dt == sdt) {
                memcpy(osc + to * osz, sc + from * ssz, osz);
                memcpy(obi + to * osz, bi + from * ssz, osz);
            } else { /* dt is F32 */
                ((float *)(void *)osc)[to] = kn_load_f32(sc, sdt, from);
                ((float *)(void *)obi)[to] = kn_load_f32(bi, sdt, from);
            }
        }
    }
}

/* Row blocks (segments of parts) of quantized parts as one quantized
 * weight; rows of codes and of scales/biases move together. Parts quantized
 * differently (per-module overrides, e.g. mlx-lm's mixed recipes giving
 * v_proj more bits than q/k_proj) and 3/5/6-bit parts are rewritten exactly
 * into one layout the backends compute with: the widest compute bits, the
 * smallest group size, f32 scales if the parts' scale dtypes differ. */
typedef struct {
    int part;
    int64_t row0, rows;
} ld_seg;

static kn_code ld_load_quant_segs(kn_model *m, const char *label, const ld_qpart *qp, int n_parts, const ld_seg *segs,
                                  int n_segs, int64_t cols, const ld_qk_perm *perm, kn_weight *out, kn_error *err) {
    int64_t total = 0;
    int bits = 0, gs = qp[0].group_size, repack = 0;
    kn_dtype dt = qp[0].scales->dtype;
    for (int i = 0; i < n_parts; i++) {
        const int cb = kn_quant_compute_bits(qp[i].bits);
        bits = cb > bits ? cb : bits;
        gs = qp[i].group_size < gs ? qp[i].group_size : gs;
        if (qp[i].scales->dtype != dt) dt = KN_DT_F32;
    }
    for (int i = 0; i < n_parts; i++)
        repack |= qp[i].bits != bits || qp[i].group_size != gs || qp[i].scales->dtype != dt;
    for (int i = 0; i < n_segs; i++) total += segs[i].rows;
    const int permute = perm && perm->rot_dim > 0;
    kn_quant_host h = {.rows = total, .cols = cols, .bits = bits, .group_size = gs, .sb_dtype = dt};
    if (n_segs == 1 && segs[0].row0 == 0 && !permute && !repack) {
        const ld_qpart *p = &qp[segs[0].part];
        h.q = p->q->data, h.scales = p->scales->data, h.biases = p->biases->data;
        return kn_be_weight_load_quant(m->be, &h, out, err);
    }
    const size_t qrow = (size_t)kn_quant_row_words(cols, h.bits) * 4;
    const size_t srow = (size_t)(cols / h.group_size) * kn_dtype_size(h.sb_dtype);
    uint8_t *q = malloc((size_t)total * qrow), *sc = malloc((size_t)total * srow), *bi = malloc((size_t)total * srow);
    uint32_t *row = malloc((size_t)kn_quant_row_words(cols, 8) * 4); /* the widest source row */
    kn_code rc = KN_OK;
    if (!q || !sc || !bi || !row) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory loading %s", label);
    size_t off = 0;
    for (int i = 0; i < n_segs && !rc; i++) {
        const ld_qpart *p = &qp[segs[i].part];
        const int64_t rows = segs[i].rows;
        const size_t sq = (size_t)kn_quant_row_words(cols, p->bits) * 4; /* the part's own row sizes */
        const size_t ss = (size_t)(cols / p->group_size) * kn_dtype_size(p->scales->dtype);
        const uint8_t *pq = (const uint8_t *)p->q->data + (size_t)segs[i].row0 * sq;
        const uint8_t *ps = (const uint8_t *)p->scales->data + (size_t)segs[i].row0 * ss;
        const uint8_t *pb = (const uint8_t *)p->biases->data + (size_t)segs[i].row0 * ss;
        if (p->bits == bits && p->group_size == gs && p->scales->dtype == dt) {
            memcpy(q + off * qrow, pq, (size_t)rows * qrow);
            memcpy(sc + off * srow, ps, (size_t)rows * srow);
            memcpy(bi + off * srow, pb, (size_t)rows * srow);
        } else {
            ld_repack_quant(pq, ps, pb, rows, cols, p->bits, p->group_size, p->scales->dtype, bits, gs, dt,
                            q + off * qrow, sc + off * srow, bi + off * srow, row);
        }
        off += (size_t)rows;
    }
    if (!rc && permute) rc = ld_permute_qk_rows(q, qrow, perm, err);
    if (!rc && permute) rc = ld_permute_qk_rows(sc, srow, perm, err);
    if (!rc && permute) rc = ld_permute_qk_rows(bi, srow, perm, err);
    if (!rc) {
        h.q = q, h.scales = sc, h.biases = bi;
        rc = kn_be_weight_load_quant(m->be, &h, out, err);
    }
    free(q), free(sc), free(bi), free(row);
    return rc;
}

kn_code ld_load_fused(kn_model *m, const kn_tensor_source *src, int layer, const ld_part *parts, int n_parts,
                      int64_t cols, const ld_qk_perm *perm, kn_weight *out, kn_error *err) {
    const kn_st_tensor *ts[4] = {0};
    char name[4][256];
    ld_qpart qp[4] = {{0}};
    int n_quant = 0;
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        snprintf(name[i], sizeof name[i], parts[i].fmt, layer);
        ts[i] = src->find(src->ctx, name[i]);
        if (!ts[i]) return kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name[i]);
        int is_q = 0;
        kn_code rc = ld_quant_part(src, name[i], ts[i], parts[i].rows, cols, &qp[i], &is_q, err);
        if (rc) return rc;
        n_quant += is_q;
        if (is_q) continue;
        rc = ld_check_float(ts[i], name[i], err);
        if (!rc) rc = ld_check_shape(ts[i], name[i], parts[i].rows, cols, err);
        if (rc) return rc;
        if (ts[i]->dtype != ts[0]->dtype)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "tensors %s and %s have different dtypes", name[0], name[i]);
        total += parts[i].rows;
    }
    if (n_quant == n_parts) {
        ld_seg segs[4];
        for (int i = 0; i < n_parts; i++) segs[i] = (ld_seg){i, 0, parts[i].rows};
        return ld_load_quant_segs(m, name[0], qp, n_parts, segs, n_parts, cols, perm, out, err);
    }
    if (n_quant)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s and the tensors fused with it are only partly quantized", name[0]);
    int permute = perm && perm->rot_dim > 0;
    if (n_parts == 1 && !permute)
        return kn_be_weight_load(m->be, ts[0]->dtype, total, cols, ts[0]->data, src->borrow, out, err);
    size_t esz = kn_dtype_size(ts[0]->dtype);
    uint8_t *host = malloc((size_t)total * (size_t)cols * esz);
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory fusing %s", name[0]);
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        memcpy(host + off, ts[i]->data, ts[i]->nbytes);
        off += ts[i]->nbytes;
    }
    kn_code rc = permute ? ld_permute_qk_rows(host, (size_t)cols * esz, perm, err) : KN_OK;
    if (!rc) rc = kn_be_weight_load(m->be, ts[0]->dtype, total, cols, host, 0, out, err);
    free(host);
    return rc;
}

kn_code ld_load_fused_bias(kn_model *m, const kn_tensor_source *src, int layer, const ld_part *parts, int n_parts,
                           const ld_qk_perm *perm, float **out, kn_error *err) {
    *out = NULL;
    int present = 0;
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        present += ld_find(src, parts[i].fmt, layer) != NULL;
        total += parts[i].rows;
    }
    if (!present) return KN_OK;
    if (present != n_parts) {
        char name[256];
        snprintf(name, sizeof name, parts[0].fmt, layer);
        return kn_fail(err, KN_ERR_FORMAT, "some but not all biases next to %s are present", name);
    }
    float *host = malloc((size_t)total * sizeof(float));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory for biases");
    int64_t off = 0;
    kn_code rc = KN_OK;
    for (int i = 0; i < n_parts && !rc; i++) {
        int found;
        rc = ld_read_vec(src, parts[i].fmt, layer, parts[i].rows, 1, host + off, &found, err);
        off += parts[i].rows;
    }
    if (!rc) rc = ld_permute_qk_rows((uint8_t *)host, sizeof(float), perm, err);
    if (!rc) rc = ld_upload_vec(m, host, total, out, err);
    free(host);
    return rc;
}

kn_code ld_load_stacked(kn_model *m, const kn_tensor_source *src, const char *const *names, int n_parts, int64_t E,
                        const int64_t *rows, int64_t cols, kn_weight *out, kn_error *err) {
    const kn_st_tensor *ts[4] = {0};
    ld_qpart qp[4] = {{0}};
    int n_quant = 0;
    if (n_parts < 1 || n_parts > 4 || E < 1) return kn_fail(err, KN_ERR_INVALID_ARG, "ld_load_stacked: bad arguments");
    for (int i = 0; i < n_parts; i++) {
        if (!(ts[i] = src->find(src->ctx, names[i])))
            return kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", names[i]);
        int is_q = 0;
        kn_code rc = ld_quant_part(src, names[i], ts[i], E * rows[i], cols, &qp[i], &is_q, err);
        if (rc) return rc;
        n_quant += is_q;
        if (is_q) continue;
        if ((rc = ld_check_float(ts[i], names[i], err))) return rc;
        if (ts[i]->ndim != 3 || ts[i]->shape[0] != E || ts[i]->shape[1] != rows[i] || ts[i]->shape[2] != cols)
            return kn_fail(err, KN_ERR_FORMAT, "tensor %s must have shape [%lld, %lld, %lld] from config.json",
                           names[i], (long long)E, (long long)rows[i], (long long)cols);
        if (ts[i]->dtype != ts[0]->dtype)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "tensors %s and %s have different dtypes", names[0], names[i]);
    }
    if (n_quant && n_quant != n_parts)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s and the tensors stacked with it are only partly quantized", names[0]);
    int64_t per_expert = 0;
    for (int i = 0; i < n_parts; i++) per_expert += rows[i];
    if (n_quant) {
        ld_seg *segs = malloc((size_t)E * (size_t)n_parts * sizeof *segs);
        if (!segs) return kn_fail(err, KN_ERR_NOMEM, "out of memory loading %s", names[0]);
        for (int64_t e = 0; e < E; e++)
            for (int i = 0; i < n_parts; i++) segs[e * n_parts + i] = (ld_seg){i, e * rows[i], rows[i]};
        kn_code rc = ld_load_quant_segs(m, names[0], qp, n_parts, segs, (int)(E * n_parts), cols, NULL, out, err);
        free(segs);
        return rc;
    }
    const kn_dtype dt = ts[0]->dtype;
    if (n_parts == 1)
        return kn_be_weight_load(m->be, dt, E * rows[0], cols, ts[0]->data, src->borrow, out, err);
    const size_t esz = kn_dtype_size(dt);
    uint8_t *host = malloc((size_t)(E * per_expert) * (size_t)cols * esz), *dst = host;
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory stacking %s", names[0]);
    for (int64_t e = 0; e < E; e++)
        for (int i = 0; i < n_parts; i++) {
            const size_t bytes = (size_t)rows[i] * (size_t)cols * esz;
            memcpy(dst, (const uint8_t *)ts[i]->data + (size_t)e * bytes, bytes);
            dst += bytes;
        }
    kn_code rc = kn_be_weight_load(m->be, dt, E * per_expert, cols, host, 0, out, err);
    free(host);
    return rc;
}

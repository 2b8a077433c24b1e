/* loader.c — see loader.h. */
#include "models/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

kn_code ld_load_fused(kn_model *m, const kn_tensor_source *src, int layer, const ld_part *parts, int n_parts,
                      int64_t cols, const ld_qk_perm *perm, kn_weight *out, kn_error *err) {
    const kn_st_tensor *ts[4] = {0};
    char name[4][256];
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        snprintf(name[i], sizeof name[i], parts[i].fmt, layer);
        ts[i] = src->find(src->ctx, name[i]);
        if (!ts[i]) return kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name[i]);
        kn_code rc = ld_check_float(ts[i], name[i], err);
        if (!rc) rc = ld_check_shape(ts[i], name[i], parts[i].rows, cols, err);
        if (rc) return rc;
        if (ts[i]->dtype != ts[0]->dtype)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "tensors %s and %s have different dtypes", name[0], name[i]);
        total += parts[i].rows;
    }
    int permute = perm && perm->rot_dim > 0;
    if (n_parts == 1 && !permute)
        return kn_be_weight_load(m->be, ts[0]->dtype, total, cols, ts[0]->data, src->outlives_model, out, err);
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

/* st_writer.c — see st_writer.h. The header is built with jansson (names are
 * escaped correctly) and padded with spaces to a multiple of 8 bytes. */
#include "io/st_writer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kn_st_writer {
    FILE *f;
    char *path;
    size_t n, next;
    size_t *sizes;
};

kn_code kn_st_writer_open(const char *path, const kn_stw_desc *t, size_t n, const char *metadata_format,
                          kn_st_writer **out, kn_error *err) {
    *out = NULL;
    kn_st_writer *w = calloc(1, sizeof *w);
    json_t *hdr = json_object();
    char *text = NULL;
    kn_code rc = KN_OK;
    if (!w || !hdr || !(w->sizes = calloc(n + 1, sizeof *w->sizes)) || !(w->path = strdup(path))) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    w->n = n;
    if (metadata_format) {
        json_t *meta = json_object();
        json_object_set_new(meta, "format", json_string(metadata_format));
        json_object_set_new(hdr, "__metadata__", meta);
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].ndim < 0 || t[i].ndim > KN_STW_MAX_DIMS || !t[i].name || !t[i].name[0] ||
            json_object_get(hdr, t[i].name)) {
            rc = kn_fail(err, KN_ERR_INVALID_ARG, "safetensors writer: bad or duplicate tensor \"%s\"",
                         t[i].name ? t[i].name : "");
            goto done;
        }
        size_t bytes = kn_dtype_size(t[i].dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) {
            bytes *= (size_t)t[i].shape[d];
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(kn_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(hdr, t[i].name, e);
        w->sizes[i] = bytes;
        off += bytes;
    }
    text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for the safetensors header");
        goto done;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    w->f = fopen(path, "wb");
    if (!w->f) {
        rc = kn_fail(err, KN_ERR_IO, "cannot create %s", path);
        goto done;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(le, 1, 8, w->f) == 8 && fwrite(text, 1, len, w->f) == len;
    for (size_t i = len; i < padded && ok; i++) ok = fputc(' ', w->f) != EOF;
    if (!ok) rc = kn_fail(err, KN_ERR_IO, "write error on %s", path);
done:
    free(text);
    json_decref(hdr);
    if (rc) {
        kn_st_writer_abort(w);
        return rc;
    }
    *out = w;
    return KN_OK;
}

kn_code kn_st_writer_put(kn_st_writer *w, const void *data, size_t nbytes, kn_error *err) {
    if (w->next >= w->n || nbytes != w->sizes[w->next])
        return kn_fail(err, KN_ERR_INVALID_ARG, "safetensors writer: tensor %zu written with %zu bytes (declared %zu)",
                       w->next, nbytes, w->next < w->n ? w->sizes[w->next] : 0);
    if (nbytes && fwrite(data, 1, nbytes, w->f) != nbytes) return kn_fail(err, KN_ERR_IO, "write error on %s", w->path);
    w->next++;
    return KN_OK;
}

static void writer_free(kn_st_writer *w) {
    free(w->sizes);
    free(w->path);
    free(w);
}

kn_code kn_st_writer_close(kn_st_writer *w, kn_error *err) {
    kn_code rc = KN_OK;
    if (w->next != w->n) rc = kn_fail(err, KN_ERR_INVALID_ARG, "safetensors writer: %zu of %zu tensors written", w->next, w->n);
    if (fclose(w->f) != 0 && !rc) rc = kn_fail(err, KN_ERR_IO, "write error closing %s", w->path);
    if (rc) remove(w->path);
    writer_free(w);
    return rc;
}

void kn_st_writer_abort(kn_st_writer *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        if (w->path) remove(w->path);
    }
    writer_free(w);
}

/* safetensors.c — see safetensors.h.
 *
 * Invariants after a successful parse: every tensor has a known dtype, at
 * most KN_ST_MAX_DIMS non-negative dims whose product times the dtype size
 * equals its byte length without overflow, lies inside the data section, and
 * no two tensors overlap. Names are unique, non-empty, at most 4096 bytes.
 * A checkpoint's tensor array is sorted by name; each file is mapped once and
 * unmapped by kn_st_close. */
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file_util.h"

#define MAX_NAME 4096

typedef struct {
    void *map;
    size_t len;
} st_mapping;

struct kn_safetensors {
    kn_st_tensor *tensors; /* sorted by name */
    size_t n;
    st_mapping *maps;
    size_t n_maps;
};

void kn_st_tensors_free(kn_st_tensor *t, size_t n) {
    if (!t) return;
    for (size_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int cmp_offset(const void *a, const void *b) {
    const kn_st_tensor *x = a, *y = b;
    const uint8_t *p = x->data, *q = y->data;
    return (p > q) - (p < q);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const kn_st_tensor *)a)->name, ((const kn_st_tensor *)b)->name);
}

static int mul_overflows(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 1;
    *out = a * b;
    return 0;
}

/* Parse one entry; returns 0 or sets err. */
static kn_code parse_entry(const char *name, json_t *e, const uint8_t *data, size_t data_len, kn_st_tensor *t,
                           kn_error *err) {
    if (!json_is_object(e)) return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": entry is not an object", name);
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
           *offs = json_object_get(e, "data_offsets");
    if (!json_is_string(dt)) return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": missing or non-string dtype", name);
    if (kn_dtype_parse(json_string_value(dt), &t->dtype))
        return kn_fail(err, KN_ERR_FORMAT,
                       "tensor \"%.200s\": unknown dtype \"%.32s\" (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 "
                       "I16 I8 U64 U32 U16 U8 BOOL)", name, json_string_value(dt));
    if (!json_is_array(shape)) return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": missing or non-array shape", name);
    if (json_array_size(shape) > KN_ST_MAX_DIMS)
        return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": %zu dims (at most %d)", name, json_array_size(shape),
                       KN_ST_MAX_DIMS);
    size_t count = 1;
    t->ndim = (int)json_array_size(shape);
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": shape[%d] is not a non-negative integer", name, i);
        t->shape[i] = json_integer_value(d);
        if (mul_overflows(count, (size_t)t->shape[i], &count))
            return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": shape overflows", name);
    }
    size_t nbytes;
    if (mul_overflows(count, kn_dtype_size(t->dtype), &nbytes))
        return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": shape overflows", name);
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": data_offsets must be [begin, end]", name);
    json_int_t b = json_integer_value(json_array_get(offs, 0)), en = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || en < b) return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": data_offsets [%lld, %lld] are invalid", name, (long long)b, (long long)en);
    if ((unsigned long long)en > data_len)
        return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": data ends at %lld, past the data section (%zu bytes)",
                       name, (long long)en, data_len);
    if ((size_t)(en - b) != nbytes)
        return kn_fail(err, KN_ERR_FORMAT, "tensor \"%.200s\": %lld bytes stored but shape x %s needs %zu", name,
                       (long long)(en - b), kn_dtype_name(t->dtype), nbytes);
    t->nbytes = nbytes;
    t->data = data + b;
    return KN_OK;
}

kn_code kn_st_parse(const uint8_t *buf, size_t len, kn_st_tensor **tensors, size_t *n_tensors, kn_error *err) {
    *tensors = NULL;
    *n_tensors = 0;
    if (len < 8) return kn_fail(err, KN_ERR_FORMAT, "file is %zu bytes, shorter than the 8-byte header length", len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen == 0 || hlen > KN_ST_MAX_HEADER)
        return kn_fail(err, KN_ERR_FORMAT, "header length %llu is out of range (1..%u)", (unsigned long long)hlen,
                       KN_ST_MAX_HEADER);
    if (hlen > len - 8)
        return kn_fail(err, KN_ERR_FORMAT, "header length %llu exceeds the file (%zu bytes): truncated?",
                       (unsigned long long)hlen, len);
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kn_fail(err, KN_ERR_FORMAT, "header is not valid JSON: %s", je.text);
    kn_code rc = KN_OK;
    if (!json_is_object(root)) {
        json_decref(root);
        return kn_fail(err, KN_ERR_FORMAT, "header is not a JSON object");
    }
    const uint8_t *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen, cap = json_object_size(root), n = 0;
    kn_st_tensor *t = calloc(cap ? cap : 1, sizeof *t);
    if (!t) {
        json_decref(root);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory for %zu tensor entries", cap);
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) { rc = kn_fail(err, KN_ERR_FORMAT, "__metadata__ is not an object"); break; }
            continue;
        }
        size_t kl = strlen(key);
        if (kl == 0 || kl > MAX_NAME) { rc = kn_fail(err, KN_ERR_FORMAT, "tensor name is empty or longer than %d bytes", MAX_NAME); break; }
        if ((rc = parse_entry(key, val, data, data_len, &t[n], err))) break;
        if (!(t[n].name = strdup(key))) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); break; }
        n++;
    }
    json_decref(root);
    if (!rc && n > 1) {
        qsort(t, n, sizeof *t, cmp_offset);
        for (size_t i = 1; i < n && !rc; i++) {
            const uint8_t *prev_end = (const uint8_t *)t[i - 1].data + t[i - 1].nbytes;
            if ((const uint8_t *)t[i].data < prev_end)
                rc = kn_fail(err, KN_ERR_FORMAT, "tensors \"%.200s\" and \"%.200s\" overlap", t[i - 1].name, t[i].name);
        }
    }
    if (rc) {
        kn_st_tensors_free(t, n);
        return rc;
    }
    qsort(t, n, sizeof *t, cmp_name);
    *tensors = t;
    *n_tensors = n;
    return KN_OK;
}

/* ---- files ----------------------------------------------------------- */

static kn_code map_file(const char *path, st_mapping *m, kn_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kn_fail(err, errno == ENOENT ? KN_ERR_NOT_FOUND : KN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kn_fail(err, KN_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return kn_fail(err, KN_ERR_FORMAT, "%s: safetensors file is %lld bytes, too short", path, (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return kn_fail(err, KN_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    madvise(p, (size_t)st.st_size, MADV_WILLNEED);
    m->map = p;
    m->len = (size_t)st.st_size;
    return KN_OK;
}

void kn_st_close(kn_safetensors *st) {
    if (!st) return;
    kn_st_tensors_free(st->tensors, st->n);
    for (size_t i = 0; i < st->n_maps; i++) munmap(st->maps[i].map, st->maps[i].len);
    free(st->maps);
    free(st);
}

/* Map and parse one shard; appends its mapping to st. */
static kn_code open_shard(kn_safetensors *st, const char *path, kn_st_tensor **t, size_t *n, kn_error *err) {
    st_mapping m;
    kn_code rc = map_file(path, &m, err);
    if (rc) return rc;
    st_mapping *nm = realloc(st->maps, (st->n_maps + 1) * sizeof *nm);
    if (!nm) {
        munmap(m.map, m.len);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    st->maps = nm;
    st->maps[st->n_maps++] = m;
    rc = kn_st_parse(m.map, m.len, t, n, err);
    if (rc) return kn_fail_wrap(err, "%s: invalid safetensors", path);
    return KN_OK;
}

static kn_code open_single(kn_safetensors *st, const char *path, kn_error *err) {
    return open_shard(st, path, &st->tensors, &st->n, err);
}

static int valid_shard_name(const char *s) {
    return s && *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..") && strlen(s) < 1024;
}

static kn_code open_index(kn_safetensors *st, const char *dir, const char *index_path, kn_error *err) {
    char *text;
    size_t len;
    kn_code rc = kn_read_file(index_path, 64u << 20, &text, &len, err);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON: %s", index_path, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return kn_fail(err, KN_ERR_FORMAT, "%s: missing or empty \"weight_map\"", index_path);
    }
    /* distinct shard names, in first-seen order */
    const char **shards = calloc(json_object_size(wm), sizeof *shards);
    size_t n_shards = 0, total = 0;
    kn_st_tensor **per = NULL;
    size_t *per_n = NULL;
    const char *key;
    json_t *val;
    if (!shards) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto out; }
    json_object_foreach(wm, key, val) {
        const char *s = json_string_value(val);
        if (!valid_shard_name(s)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\" maps to an invalid shard name", index_path, key);
            goto out;
        }
        size_t i = 0;
        while (i < n_shards && strcmp(shards[i], s)) i++;
        if (i == n_shards) shards[n_shards++] = s;
    }
    per = calloc(n_shards, sizeof *per);
    per_n = calloc(n_shards, sizeof *per_n);
    if (!per || !per_n) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < n_shards; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, shards[i]);
        if ((rc = open_shard(st, path, &per[i], &per_n[i], err))) goto out;
    }
    st->tensors = calloc(json_object_size(wm), sizeof *st->tensors);
    if (!st->tensors) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto out; }
    json_object_foreach(wm, key, val) {
        const char *s = json_string_value(val);
        size_t i = 0;
        while (strcmp(shards[i], s)) i++;
        kn_st_tensor probe = {.name = (char *)key};
        kn_st_tensor *found = per_n[i] ? bsearch(&probe, per[i], per_n[i], sizeof probe, cmp_name) : NULL;
        if (!found) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s lists tensor \"%.200s\" in %s, which does not contain it", index_path, key, s);
            goto out;
        }
        st->tensors[total] = *found;
        if (!(st->tensors[total].name = strdup(key))) { rc = kn_fail(err, KN_ERR_NOMEM, "out of memory"); goto out; }
        total++;
        st->n = total;
    }
    qsort(st->tensors, st->n, sizeof *st->tensors, cmp_name);
out:
    if (per)
        for (size_t i = 0; i < n_shards; i++) kn_st_tensors_free(per[i], per_n[i]);
    free(per), free(per_n), free(shards);
    json_decref(root);
    return rc;
}

kn_code kn_st_open(const char *path, kn_safetensors **out, kn_error *err) {
    *out = NULL;
    kn_safetensors *st = calloc(1, sizeof *st);
    if (!st) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc;
    char p[4096];
    if (!kn_is_dir(path)) {
        rc = open_single(st, path, err);
    } else if (snprintf(p, sizeof p, "%s/model.safetensors.index.json", path), kn_is_file(p)) {
        rc = open_index(st, path, p, err);
    } else if (snprintf(p, sizeof p, "%s/model.safetensors", path), kn_is_file(p)) {
        rc = open_single(st, p, err);
    } else {
        /* exactly one *.safetensors file */
        DIR *d = opendir(path);
        int count = 0;
        char found[1024] = "";
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && l < sizeof found) {
                count++;
                memcpy(found, e->d_name, l + 1);
            }
        }
        if (d) closedir(d);
        if (count == 1) {
            snprintf(p, sizeof p, "%s/%s", path, found);
            rc = open_single(st, p, err);
        } else {
            rc = kn_fail(err, KN_ERR_NOT_FOUND,
                         count ? "%s holds %d .safetensors files but no model.safetensors.index.json"
                               : "%s has no model.safetensors (or index) file%.0d",
                         path, count);
        }
    }
    if (rc) {
        kn_st_close(st);
        return rc;
    }
    *out = st;
    return KN_OK;
}

size_t kn_st_count(const kn_safetensors *st) { return st->n; }

const kn_st_tensor *kn_st_at(const kn_safetensors *st, size_t i) { return i < st->n ? &st->tensors[i] : NULL; }

const kn_st_tensor *kn_st_find(const kn_safetensors *st, const char *name) {
    kn_st_tensor probe = {.name = (char *)name};
    return st->n ? bsearch(&probe, st->tensors, st->n, sizeof probe, cmp_name) : NULL;
}

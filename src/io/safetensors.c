/* safetensors.c — parse, validate and mmap safetensors checkpoints.
 *
 * This file turns untrusted bytes on disk into a table of kn_st_tensor whose
 * data pointers may be dereferenced without further checks. It is the only
 * place in kiln that reads a safetensors header.
 *
 * Layout of one file: an 8-byte little-endian u64 N, N bytes of JSON (an
 * object mapping tensor name -> {"dtype", "shape", "data_offsets"}, plus an
 * optional "__metadata__" object of strings, which is checked and skipped),
 * then the data section. data_offsets are [begin, end) relative to the start
 * of the data section.
 *
 * Invariants established before any tensor is handed out:
 *   - 0 < N <= KN_ST_MAX_HEADER and 8 + N <= file size;
 *   - the header is one JSON object without duplicate keys;
 *   - every name is 1..KN_ST_NAME_MAX bytes, unique, and not "__metadata__";
 *   - dtype is known; 0 <= ndim <= KN_ST_MAX_DIMS; every dim >= 0;
 *   - product(shape) * dtype size is computed with overflow checks and equals
 *     end - begin; begin <= end <= data section size;
 *   - no two tensors of non-zero size share a byte;
 *   - so [data, data + nbytes) lies inside the buffer or mapping.
 * Tensor tables are sorted by name (strcmp order), so lookups are binary
 * searches. A kn_safetensors owns its tensor table, every name in it, and
 * every mapping; kn_st_close releases all of them. There is no global state.
 *
 * Data pointers carry no alignment promise beyond what the file provides:
 * begin is whatever the writer chose (writers pad the header to 8 bytes, so
 * in practice data is 8-byte aligned relative to a page-aligned mapping). */
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

#define KN_ST_NAME_MAX 4096           /* longest tensor name accepted */
#define KN_ST_SHARD_NAME_MAX 255      /* longest shard file name (NAME_MAX) */
#define KN_ST_INDEX_MAX (64u << 20)   /* largest index.json accepted */
#define KN_ST_INDEX_NAME "model.safetensors.index.json"
#define KN_ST_SINGLE_NAME "model.safetensors"

/* One mapped file. */
typedef struct {
    void *addr;
    size_t len;
} st_map;

struct kn_safetensors {
    kn_st_tensor *tensors; /* sorted by name */
    size_t n;
    st_map *maps;
    size_t n_maps;
};

/* ---- helpers ----------------------------------------------------------- */

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const kn_st_tensor *)a)->name, ((const kn_st_tensor *)b)->name);
}

static int key_tensor_name(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const kn_st_tensor *)elem)->name);
}

static const kn_st_tensor *find_sorted(const kn_st_tensor *t, size_t n, const char *name) {
    if (!t || n == 0 || !name) return NULL;
    return bsearch(name, t, n, sizeof *t, key_tensor_name);
}

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return -1;
    *out = a * b;
    return 0;
}

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void kn_st_tensors_free(kn_st_tensor *tensors, size_t n) {
    if (!tensors) return;
    for (size_t i = 0; i < n; i++) free(tensors[i].name);
    free(tensors);
}

/* ---- header parsing ----------------------------------------------------- */

/* Byte range of one tensor, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    size_t idx;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Validate one header entry and fill *t (name excluded). `what` names the
 * file in messages. */
static kn_code parse_entry(const char *what, const char *name, json_t *v, const uint8_t *data,
                           uint64_t data_len, kn_st_tensor *t, uint64_t *begin_out, kn_error *err) {
    if (!json_is_object(v))
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": entry is not a JSON object", what, name);

    json_t *jd = json_object_get(v, "dtype");
    if (!jd) return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": missing \"dtype\"", what, name);
    if (!json_is_string(jd))
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": \"dtype\" is not a string", what, name);
    const char *ds = json_string_value(jd);
    if (strlen(ds) != json_string_length(jd) || kn_dtype_parse(ds, &t->dtype) != 0)
        return kn_fail(err, KN_ERR_FORMAT,
                       "%s: tensor \"%.200s\": unknown dtype \"%.32s\" (known: F32 F16 BF16 F64 F8_E4M3 "
                       "F8_E5M2 I8 U8 I16 U16 I32 U32 I64 U64 BOOL)",
                       what, name, ds);

    json_t *js = json_object_get(v, "shape");
    if (!js) return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": missing \"shape\"", what, name);
    if (!json_is_array(js))
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": \"shape\" is not an array", what, name);
    size_t nd = json_array_size(js);
    if (nd > KN_ST_MAX_DIMS)
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": %zu dims, at most %d supported", what, name,
                       nd, KN_ST_MAX_DIMS);
    uint64_t count = 1;
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *jv = json_array_get(js, d);
        if (!json_is_integer(jv))
            return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": shape[%zu] is not an integer", what,
                           name, d);
        json_int_t dim = json_integer_value(jv);
        if (dim < 0)
            return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": shape[%zu] = %lld, dims must be non-negative", what,
                           name, d, (long long)dim);
        t->shape[d] = (int64_t)dim;
        if (mul_u64(count, (uint64_t)dim, &count) != 0 || count > (uint64_t)INT64_MAX)
            return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": element count overflows", what, name);
    }
    for (size_t d = nd; d < KN_ST_MAX_DIMS; d++) t->shape[d] = 0;
    uint64_t want;
    if (mul_u64(count, kn_dtype_size(t->dtype), &want) != 0 || want > (uint64_t)SIZE_MAX)
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": byte size overflows", what, name);

    json_t *jo = json_object_get(v, "data_offsets");
    if (!jo) return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": missing \"data_offsets\"", what, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return kn_fail(err, KN_ERR_FORMAT,
                       "%s: tensor \"%.200s\": \"data_offsets\" is not an array of two integers", what, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < 0)
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": data_offsets [%lld, %lld] are invalid (negative)", what,
                       name, (long long)b, (long long)e);
    if (b > e)
        return kn_fail(err, KN_ERR_FORMAT, "%s: tensor \"%.200s\": data_offsets are invalid: begin %lld > end %lld", what,
                       name, (long long)b, (long long)e);
    uint64_t ub = (uint64_t)b, ue = (uint64_t)e;
    if (ue > data_len)
        return kn_fail(err, KN_ERR_FORMAT,
                       "%s: tensor \"%.200s\": data_offsets end %llu is past the data section (%llu bytes)",
                       what, name, (unsigned long long)ue, (unsigned long long)data_len);
    if (ue - ub != want)
        return kn_fail(err, KN_ERR_FORMAT,
                       "%s: tensor \"%.200s\": %llu bytes in data_offsets but dtype %s x shape needs %llu", what,
                       name, (unsigned long long)(ue - ub), kn_dtype_name(t->dtype), (unsigned long long)want);
    t->nbytes = (size_t)want;
    t->data = data + ub;
    *begin_out = ub;
    return KN_OK;
}

static kn_code check_metadata(const char *what, json_t *v, kn_error *err) {
    if (!json_is_object(v))
        return kn_fail(err, KN_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", what);
    const char *k;
    json_t *mv;
    json_object_foreach(v, k, mv) {
        if (!json_is_string(mv))
            return kn_fail(err, KN_ERR_FORMAT, "%s: \"__metadata__\" value for \"%.200s\" is not a string", what,
                           k);
    }
    return KN_OK;
}

/* Parse a whole file image. `what` labels messages (a path, or "safetensors
 * buffer"). On success the table is sorted by name. */
static kn_code parse_image(const uint8_t *buf, size_t len, const char *what, kn_st_tensor **tensors,
                           size_t *n_tensors, kn_error *err) {
    *tensors = NULL;
    *n_tensors = 0;
    if (!buf && len) return kn_fail(err, KN_ERR_INVALID_ARG, "%s: NULL buffer", what);
    if (len < 8)
        return kn_fail(err, KN_ERR_FORMAT, "%s: %zu bytes, too short for the 8-byte header length", what, len);
    uint64_t hlen = read_le64(buf);
    if (hlen == 0 || hlen > KN_ST_MAX_HEADER)
        return kn_fail(err, KN_ERR_FORMAT, "%s: header length %llu is out of range (limit 1..%u bytes)", what,
                       (unsigned long long)hlen, (unsigned)KN_ST_MAX_HEADER);
    if (hlen > (uint64_t)(len - 8))
        return kn_fail(err, KN_ERR_FORMAT, "%s: header length %llu exceeds the %zu bytes that follow it (truncated file?)",
                       what, (unsigned long long)hlen, len - 8);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = (uint64_t)(len - 8 - (size_t)hlen);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kn_fail(err, KN_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", what, jerr.text,
                       jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return kn_fail(err, KN_ERR_FORMAT, "%s: header is not a JSON object", what);
    }

    kn_code rc = KN_OK;
    size_t cap = json_object_size(root);
    kn_st_tensor *t = cap ? calloc(cap, sizeof *t) : NULL;
    st_range *r = cap ? calloc(cap, sizeof *r) : NULL;
    size_t n = 0;
    if (cap && (!t || !r)) {
        rc = kn_fail(err, KN_ERR_NOMEM, "%s: out of memory for %zu tensors", what, cap);
        goto done;
    }

    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = check_metadata(what, v, err))) goto done;
            continue;
        }
        size_t klen = strlen(key);
        if (klen == 0) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: tensor with an empty name", what);
            goto done;
        }
        if (klen > KN_ST_NAME_MAX) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: tensor name \"%.64s...\" is %zu bytes, longer than %d", what,
                         key, klen, KN_ST_NAME_MAX);
            goto done;
        }
        if (n >= cap) { /* cannot happen: n counts keys of root */
            rc = kn_fail(err, KN_ERR_INTERNAL, "%s: header object changed size while iterating", what);
            goto done;
        }
        kn_st_tensor *ti = &t[n];
        uint64_t begin = 0;
        if ((rc = parse_entry(what, key, v, data, data_len, ti, &begin, err))) goto done;
        ti->name = malloc(klen + 1);
        if (!ti->name) {
            rc = kn_fail(err, KN_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        memcpy(ti->name, key, klen + 1);
        r[n] = (st_range){.begin = begin, .end = begin + ti->nbytes, .idx = n};
        n++;
    }

    /* Overlap: sort by begin; each non-empty range must start at or after the
     * furthest end seen so far. */
    if (n > 1) {
        qsort(r, n, sizeof *r, cmp_range);
        uint64_t max_end = 0;
        size_t max_idx = 0;
        int have = 0;
        for (size_t i = 0; i < n; i++) {
            if (r[i].begin == r[i].end) continue; /* empty tensors occupy no bytes */
            if (have && r[i].begin < max_end) {
                rc = kn_fail(err, KN_ERR_FORMAT,
                             "%s: tensors \"%.150s\" [%llu, %llu) and \"%.150s\" [%llu, %llu) overlap", what,
                             t[max_idx].name, (unsigned long long)((const uint8_t *)t[max_idx].data - data),
                             (unsigned long long)((const uint8_t *)t[max_idx].data - data) + t[max_idx].nbytes, t[r[i].idx].name,
                             (unsigned long long)r[i].begin, (unsigned long long)r[i].end);
                goto done;
            }
            if (!have || r[i].end > max_end) max_end = r[i].end, max_idx = r[i].idx;
            have = 1;
        }
        qsort(t, n, sizeof *t, cmp_tensor_name);
        for (size_t i = 1; i < n; i++) {
            if (strcmp(t[i - 1].name, t[i].name) == 0) { /* JSON_REJECT_DUPLICATES already refuses this */
                rc = kn_fail(err, KN_ERR_FORMAT, "%s: duplicate tensor \"%.200s\"", what, t[i].name);
                goto done;
            }
        }
    }

done:
    free(r);
    json_decref(root);
    if (rc) {
        kn_st_tensors_free(t, n);
        return rc;
    }
    if (n == 0) { /* a header with only __metadata__ (or {}) is a valid, empty file */
        free(t);
        t = NULL;
    }
    *tensors = t;
    *n_tensors = n;
    return KN_OK;
}

kn_code kn_st_parse(const uint8_t *buf, size_t len, kn_st_tensor **tensors, size_t *n_tensors, kn_error *err) {
    if (!tensors || !n_tensors) return kn_fail(err, KN_ERR_INVALID_ARG, "kn_st_parse: NULL output pointer");
    return parse_image(buf, len, "safetensors buffer", tensors, n_tensors, err);
}

/* ---- files ------------------------------------------------------------- */

static kn_code map_file(const char *path, st_map *m, kn_error *err) {
    m->addr = NULL;
    m->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kn_fail(err, KN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kn_fail(err, KN_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kn_fail(err, KN_ERR_IO, "%s is not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return kn_fail(err, KN_ERR_FORMAT, "%s: %lld bytes, too short for the 8-byte header length", path,
                       (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return kn_fail(err, KN_ERR_IO, "%s: %lld bytes do not fit the address space", path, (long long)sb.st_size);
    }
    size_t len = (size_t)sb.st_size;
    void *addr = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED) return kn_fail(err, KN_ERR_IO, "cannot mmap %s: %s", path, strerror(e));
#ifdef MADV_WILLNEED
    (void)madvise(addr, len, MADV_WILLNEED); /* a hint; failure is harmless */
#endif
    m->addr = addr;
    m->len = len;
    return KN_OK;
}

static void unmap(st_map *m) {
    if (m->addr) munmap(m->addr, m->len);
    m->addr = NULL;
    m->len = 0;
}

void kn_st_close(kn_safetensors *st) {
    if (!st) return;
    kn_st_tensors_free(st->tensors, st->n);
    for (size_t i = 0; i < st->n_maps; i++) unmap(&st->maps[i]);
    free(st->maps);
    free(st);
}

/* Map and parse one file into st (which must have room for one map). */
static kn_code open_single(const char *path, kn_safetensors *st, kn_error *err) {
    kn_code rc = map_file(path, &st->maps[0], err);
    if (rc) return rc;
    st->n_maps = 1;
    return parse_image(st->maps[0].addr, st->maps[0].len, path, &st->tensors, &st->n, err);
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + 1 + b + 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a == 0 || dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

static kn_code read_small_file(const char *path, size_t max, char **out, size_t *out_len, kn_error *err) {
    *out = NULL;
    *out_len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kn_fail(err, KN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kn_fail(err, KN_ERR_IO, "%s is not a readable regular file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > max) {
        close(fd);
        return kn_fail(err, KN_ERR_FORMAT, "%s: %lld bytes, larger than the %zu-byte limit", path,
                       (long long)sb.st_size, max);
    }
    size_t len = (size_t)sb.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : 0;
            free(buf);
            close(fd);
            return kn_fail(err, KN_ERR_IO, "short read on %s%s%s", path, e ? ": " : "", e ? strerror(e) : "");
        }
        got += (size_t)k;
    }
    close(fd);
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return KN_OK;
}

typedef struct {
    const char *tensor, *shard; /* point into the index JSON */
    size_t shard_idx;
} st_entry;

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int valid_shard_name(const char *s, size_t jlen) {
    size_t n = strlen(s);
    return n > 0 && n == jlen && n <= KN_ST_SHARD_NAME_MAX && !strchr(s, '/') && !strchr(s, '\\') &&
           !strstr(s, "..");
}

static kn_code open_sharded(const char *dir, const char *index_path, kn_safetensors *st, kn_error *err) {
    char *text = NULL;
    size_t text_len = 0;
    kn_code rc = read_small_file(index_path, KN_ST_INDEX_MAX, &text, &text_len, err);
    if (rc) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return kn_fail(err, KN_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", index_path, jerr.text,
                       jerr.line, jerr.column);

    st_entry *ents = NULL;
    const char **shards = NULL;
    kn_st_tensor **parsed = NULL; /* per shard */
    size_t *n_parsed = NULL;
    size_t n_ents = 0, n_shards = 0;
    char *shard_path = NULL;

    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(root)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: not a JSON object", index_path);
        goto done;
    }
    if (!wm) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: missing \"weight_map\"", index_path);
        goto done;
    }
    if (!json_is_object(wm)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: \"weight_map\" is not a JSON object", index_path);
        goto done;
    }
    size_t cap = json_object_size(wm);
    if (cap == 0) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s: \"weight_map\" is empty", index_path);
        goto done;
    }
    ents = calloc(cap, sizeof *ents);
    shards = calloc(cap, sizeof *shards);
    if (!ents || !shards) {
        rc = kn_fail(err, KN_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        size_t klen = strlen(key);
        if (klen == 0 || klen > KN_ST_NAME_MAX) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s: weight_map has a tensor name of %zu bytes (must be 1..%d)",
                         index_path, klen, KN_ST_NAME_MAX);
            goto done;
        }
        if (!json_is_string(v) || !valid_shard_name(json_string_value(v), json_string_length(v))) {
            rc = kn_fail(err, KN_ERR_FORMAT,
                         "%s: weight_map[\"%.200s\"]: invalid shard name: shard must be a non-empty file name "
                         "without '/', '\\' or \"..\"",
                         index_path, key);
            goto done;
        }
        if (n_ents >= cap) {
            rc = kn_fail(err, KN_ERR_INTERNAL, "%s: weight_map changed size while iterating", index_path);
            goto done;
        }
        ents[n_ents].tensor = key;
        ents[n_ents].shard = json_string_value(v);
        shards[n_ents] = ents[n_ents].shard;
        n_ents++;
    }

    /* Distinct shards, sorted. */
    qsort(shards, n_ents, sizeof *shards, cmp_str_ptr);
    for (size_t i = 0; i < n_ents; i++)
        if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0) shards[n_shards++] = shards[i];
    for (size_t i = 0; i < n_ents; i++) {
        const char **hit = bsearch(&ents[i].shard, shards, n_shards, sizeof *shards, cmp_str_ptr);
        ents[i].shard_idx = (size_t)(hit - shards); /* always found */
    }

    st->maps = calloc(n_shards, sizeof *st->maps);
    parsed = calloc(n_shards, sizeof *parsed);
    n_parsed = calloc(n_shards, sizeof *n_parsed);
    st->tensors = calloc(n_ents, sizeof *st->tensors);
    if (!st->maps || !parsed || !n_parsed || !st->tensors) {
        rc = kn_fail(err, KN_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (size_t s = 0; s < n_shards; s++) {
        shard_path = join_path(dir, shards[s]);
        if (!shard_path) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((rc = map_file(shard_path, &st->maps[s], err))) goto done;
        st->n_maps = s + 1;
        if ((rc = parse_image(st->maps[s].addr, st->maps[s].len, shard_path, &parsed[s], &n_parsed[s], err)))
            goto done;
        free(shard_path);
        shard_path = NULL;
    }

    /* Move each listed tensor out of its shard's table. */
    for (size_t i = 0; i < n_ents; i++) {
        size_t s = ents[i].shard_idx;
        kn_st_tensor *src = (kn_st_tensor *)find_sorted(parsed[s], n_parsed[s], ents[i].tensor);
        if (!src || !src->name) {
            rc = kn_fail(err, KN_ERR_FORMAT, "%s lists tensor \"%.200s\" in shard %s, which does not contain it",
                         index_path, ents[i].tensor, shards[s]);
            goto done;
        }
        st->tensors[st->n++] = *src;
        /* keep src->name so later bsearches still work; ownership moves by
         * copying the name */
        st->tensors[st->n - 1].name = strdup(src->name);
        if (!st->tensors[st->n - 1].name) {
            st->n--;
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    qsort(st->tensors, st->n, sizeof *st->tensors, cmp_tensor_name);

done:
    free(shard_path);
    if (parsed)
        for (size_t s = 0; s < n_shards; s++) kn_st_tensors_free(parsed[s], n_parsed[s]);
    free(parsed);
    free(n_parsed);
    free(shards);
    free(ents);
    json_decref(root);
    return rc;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Resolve a directory without an index to its one safetensors file. */
static kn_code find_single(const char *dir, char **out, kn_error *err) {
    *out = NULL;
    char *p = join_path(dir, KN_ST_SINGLE_NAME);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    struct stat sb;
    if (stat(p, &sb) == 0) {
        *out = p;
        return KN_OK;
    }
    free(p);
    DIR *d = opendir(dir);
    if (!d) return kn_fail(err, KN_ERR_IO, "cannot read directory %s: %s", dir, strerror(errno));
    char *found = NULL;
    size_t count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors")) continue;
        count++;
        if (count == 1) {
            found = join_path(dir, de->d_name);
            if (!found) {
                closedir(d);
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            }
        }
    }
    closedir(d);
    if (count == 1) {
        *out = found;
        return KN_OK;
    }
    free(found);
    if (count == 0)
        return kn_fail(err, KN_ERR_NOT_FOUND, "%s: no " KN_ST_INDEX_NAME ", " KN_ST_SINGLE_NAME " or other .safetensors file",
                       dir);
    return kn_fail(err, KN_ERR_NOT_FOUND,
                   "%s: %zu .safetensors files but no " KN_ST_INDEX_NAME " saying how they fit together", dir,
                   count);
}

void kn_st_release_pages(kn_safetensors *st) {
    for (size_t i = 0; st && i < st->n_maps; i++)
        if (st->maps[i].addr) (void)madvise(st->maps[i].addr, st->maps[i].len, MADV_DONTNEED);
}

kn_code kn_st_open(const char *path, kn_safetensors **out, kn_error *err) {
    if (!out) return kn_fail(err, KN_ERR_INVALID_ARG, "kn_st_open: NULL output pointer");
    *out = NULL;
    if (!path || !*path) return kn_fail(err, KN_ERR_INVALID_ARG, "kn_st_open: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0) return kn_fail(err, KN_ERR_IO, "cannot open %s: %s", path, strerror(errno));

    kn_safetensors *st = calloc(1, sizeof *st);
    if (!st) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc;
    if (S_ISDIR(sb.st_mode)) {
        char *index = join_path(path, KN_ST_INDEX_NAME);
        if (!index) {
            kn_st_close(st);
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        struct stat ib;
        if (stat(index, &ib) == 0) {
            rc = open_sharded(path, index, st, err);
        } else {
            char *file = NULL;
            rc = find_single(path, &file, err);
            if (!rc) {
                st->maps = calloc(1, sizeof *st->maps);
                rc = st->maps ? open_single(file, st, err) : kn_fail(err, KN_ERR_NOMEM, "out of memory");
            }
            free(file);
        }
        free(index);
    } else {
        st->maps = calloc(1, sizeof *st->maps);
        rc = st->maps ? open_single(path, st, err) : kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    if (rc) {
        kn_st_close(st);
        return rc;
    }
    *out = st;
    return KN_OK;
}

size_t kn_st_count(const kn_safetensors *st) { return st ? st->n : 0; }

const kn_st_tensor *kn_st_at(const kn_safetensors *st, size_t i) {
    return st && i < st->n ? &st->tensors[i] : NULL;
}

const kn_st_tensor *kn_st_find(const kn_safetensors *st, const char *name) {
    return st ? find_sorted(st->tensors, st->n, name) : NULL;
}

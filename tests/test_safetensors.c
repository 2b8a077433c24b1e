/* test_safetensors.c — the safetensors reader on valid files, shards, and
 * hostile inputs: every malformed header gives KN_ERR_FORMAT (or IO/NOT_FOUND
 * for missing files) with a message, never a crash (run under ASan in CI). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test_util.h"

/* header JSON + data bytes -> a safetensors image */
static uint8_t *image(const char *hdr, const void *data, size_t dlen, size_t *len) {
    size_t h = strlen(hdr);
    uint8_t *b = malloc(8 + h + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    *len = 8 + h + dlen;
    return b;
}

static void write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void expect_bad(const char *hdr, size_t dlen, const char *needle) {
    uint8_t data[256] = {0};
    size_t len;
    uint8_t *b = image(hdr, data, dlen, &len);
    kn_st_tensor *t;
    size_t n;
    kn_error err = {0};
    kn_code rc = kn_st_parse(b, len, &t, &n, &err);
    CHECK(rc == KN_ERR_FORMAT, "expected a format error for %s (got %d)", hdr, rc);
    CHECK(strstr(err.msg, needle) != NULL, "message \"%s\" lacks \"%s\"", err.msg, needle);
    if (rc == KN_OK) kn_st_tensors_free(t, n);
    free(b);
}

static const char *VALID =
    "{\"__metadata__\": {\"format\": \"pt\"}, \"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}, "
    "\"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]}, \"c\": {\"dtype\": \"F16\", \"shape\": [], "
    "\"data_offsets\": [32, 34]}, \"d\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [36, 40]}, "
    "\"e\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [40, 40]}}";

/* ---- further cases: exact bytes, limits, ordering, file-level paths ---- */

static int parse_ok(const char *hdr, const void *data, size_t dlen, kn_st_tensor **t, size_t *n) {
    size_t len;
    uint8_t *b = image(hdr, data, dlen, &len);
    kn_error err = {0};
    kn_code rc = kn_st_parse(b, len, t, n, &err);
    CHECK(rc == KN_OK, "expected %s to parse: %s", hdr, err.msg);
    free(b); /* the tensors' data pointers are not used after this */
    return rc == KN_OK;
}

static void extra_parse_checks(void) {
    /* every dtype's bytes, shape and size come back exactly */
    uint8_t data[40];
    for (int i = 0; i < 40; i++) data[i] = (uint8_t)(i * 7 + 3);
    size_t len;
    uint8_t *b = image(VALID, data, 40, &len);
    kn_st_tensor *t;
    size_t n;
    kn_error err = {0};
    if (kn_st_parse(b, len, &t, &n, &err) == KN_OK && n == 5) {
        static const struct { const char *name; kn_dtype dt; int ndim; int64_t d0; size_t off, nbytes; } want[] = {
            {"a", KN_DT_F32, 2, 2, 0, 24}, {"b", KN_DT_BF16, 1, 4, 24, 8}, {"c", KN_DT_F16, 0, 0, 32, 2},
            {"d", KN_DT_I32, 1, 1, 36, 4}, {"e", KN_DT_U8, 1, 0, 40, 0},
        };
        for (size_t i = 0; i < 5; i++) {
            CHECK(!strcmp(t[i].name, want[i].name) && t[i].dtype == want[i].dt && t[i].ndim == want[i].ndim &&
                      (want[i].ndim == 0 || t[i].shape[0] == want[i].d0) && t[i].nbytes == want[i].nbytes &&
                      (const uint8_t *)t[i].data == b + len - 40 + want[i].off &&
                      !memcmp(t[i].data, data + want[i].off, want[i].nbytes),
                  "round trip of tensor %s", want[i].name);
        }
        kn_st_tensors_free(t, n);
    } else {
        CHECK(0, "valid image: %s", err.msg);
    }
    free(b);

    /* accepted edge cases */
    if (parse_ok("{\"__metadata__\": {\"k\": \"v\"}}   ", NULL, 0, &t, &n)) {
        CHECK(n == 0, "metadata-only header (with trailing spaces) has 0 tensors");
        kn_st_tensors_free(t, n);
    }
    if (parse_ok("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}, "
                 "\"z\": {\"dtype\": \"U8\", \"shape\": [0, 5], \"data_offsets\": [2, 2]}}",
                 data, 4, &t, &n)) {
        CHECK(n == 2 && t[1].nbytes == 0, "an empty tensor inside another's range occupies no bytes");
        kn_st_tensors_free(t, n);
    }
    if (parse_ok("{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", data, 1, &t,
                 &n)) {
        CHECK(n == 1 && t[0].ndim == KN_ST_MAX_DIMS, "exactly KN_ST_MAX_DIMS dims");
        kn_st_tensors_free(t, n);
    }

    /* sorted by name whatever the header order */
    char hdr[8192];
    size_t o = (size_t)snprintf(hdr, sizeof hdr, "{");
    for (int i = 49; i >= 0; i--)
        o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s\"w.%02d\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [%d, %d]}",
                              i == 49 ? "" : ", ", i, 49 - i, 50 - i);
    snprintf(hdr + o, sizeof hdr - o, "}");
    {
        uint8_t big[64] = {0};
        if (parse_ok(hdr, big, 50, &t, &n)) {
            int sorted = n == 50;
            for (size_t i = 1; i < n; i++) sorted &= strcmp(t[i - 1].name, t[i].name) < 0;
            CHECK(sorted, "tensors sorted by name");
            kn_st_tensors_free(t, n);
        }
    }

    /* names: 4096 bytes is the limit */
    char *name = malloc(4097 + 128);
    memset(name, 'n', 4097);
    name[4096] = 0;
    char *h2 = malloc(4097 + 128);
    snprintf(h2, 4097 + 128, "{\"%s\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", name);
    if (parse_ok(h2, data, 1, &t, &n)) kn_st_tensors_free(t, n);
    name[4096] = 'n';
    name[4097] = 0;
    snprintf(h2, 4097 + 128, "{\"%s\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", name);
    expect_bad(h2, 1, "longer than");
    free(h2);
    free(name);

    /* more hostile entries */
    expect_bad("{\"a\": {\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "dtype");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": 1, \"data_offsets\": [0, 1]}}", 1, "shape");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": 0}}", 1, "data_offsets");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1, 2]}}", 1, "data_offsets");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, \"1\"]}}", 1, "data_offsets");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 99999999999999999]}}", 1,
               "past the data");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]}}", 4,
               "overflow");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [9223372036854775807, 2], \"data_offsets\": [0, 4]}}", 4,
               "overflow");
    expect_bad("{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 3]}, "
               "\"b\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
               4, "overlap");
    expect_bad("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}, "
               "\"b\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}, "
               "\"c\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [3, 4]}}",
               4, "overlap");
    expect_bad("\"a string\"", 0, "JSON");
    expect_bad("{\"a\": 1} trailing", 0, "JSON");
    expect_bad("   ", 0, "JSON");

    /* header lengths at the limit */
    uint8_t lim[16] = {0, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    uint64_t h = (uint64_t)KN_ST_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++) lim[i] = (uint8_t)(h >> (8 * i));
    memset(&err, 0, sizeof err);
    CHECK(kn_st_parse(lim, 16, &t, &n, &err) == KN_ERR_FORMAT && err.msg[0], "header of KN_ST_MAX_HEADER + 1");
    h = KN_ST_MAX_HEADER;
    for (int i = 0; i < 8; i++) lim[i] = (uint8_t)(h >> (8 * i));
    CHECK(kn_st_parse(lim, 16, &t, &n, &err) == KN_ERR_FORMAT && err.msg[0], "header of KN_ST_MAX_HEADER, past end");
    CHECK(kn_st_parse(NULL, 0, &t, &n, &err) == KN_ERR_FORMAT, "empty buffer");
}

static void extra_file_checks(void) {
    char dir[] = "/tmp/kiln_st2_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char p[512], q[512];
    kn_safetensors *st = NULL;
    kn_error err = {0};
    uint8_t d8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t len;

    /* empty directory: nothing to open */
    CHECK(kn_st_open(dir, &st, &err) == KN_ERR_NOT_FOUND && err.msg[0] && !st, "empty dir: %s", err.msg);

    /* one arbitrarily named file is used */
    uint8_t *b = image("{\"only\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}", d8, 8, &len);
    snprintf(p, sizeof p, "%s/weights.safetensors", dir);
    write_file(p, b, len);
    CHECK(kn_st_open(dir, &st, &err) == KN_OK && kn_st_find(st, "only"), "single named file: %s", err.msg);
    kn_st_close(st);
    st = NULL;

    /* every truncation of that file fails cleanly through open+mmap, naming the file */
    for (size_t cut = 0; cut < len; cut++) {
        write_file(p, b, cut);
        memset(&err, 0, sizeof err);
        kn_code rc = kn_st_open(p, &st, &err);
        CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, p) && !st, "file cut at %zu: %d %s", cut, rc, err.msg);
        if (rc == KN_OK) kn_st_close(st), st = NULL;
    }
    write_file(p, b, len);
    free(b);

    /* model.safetensors wins over other files */
    b = image("{\"main\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}", d8, 2, &len);
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    write_file(q, b, len);
    free(b);
    CHECK(kn_st_open(dir, &st, &err) == KN_OK && kn_st_count(st) == 1 && kn_st_find(st, "main"),
          "model.safetensors preferred: %s", err.msg);
    kn_st_close(st);
    st = NULL;

    /* a hostile header through kn_st_open names the file */
    b = image("{\"a\": {\"dtype\": \"Q4\", \"shape\": [1], \"data_offsets\": [0, 1]}}", d8, 1, &len);
    write_file(q, b, len);
    free(b);
    CHECK(kn_st_open(q, &st, &err) == KN_ERR_FORMAT && strstr(err.msg, q) && strstr(err.msg, "Q4"),
          "bad file names path and dtype: %s", err.msg);
    unlink(q);

    /* shards: the index exposes exactly what it lists */
    b = image("{\"s.x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}, "
              "\"s.extra\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
              d8, 8, &len);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_file(p, b, len);
    free(b);
    b = image("{\"s.y\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}", d8, 8, &len);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_file(p, b, len);
    free(b);
    snprintf(q, sizeof q, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\": {\"total_size\": 12}, \"weight_map\": {\"s.y\": \"model-00002-of-00002.safetensors\", "
                      "\"s.x\": \"model-00001-of-00002.safetensors\"}}";
    write_file(q, idx, strlen(idx));
    CHECK(kn_st_open(dir, &st, &err) == KN_OK, "two shards: %s", err.msg);
    if (st) {
        const kn_st_tensor *x = kn_st_find(st, "s.x"), *y = kn_st_find(st, "s.y");
        CHECK(kn_st_count(st) == 2 && !kn_st_find(st, "s.extra"), "only listed tensors exposed");
        CHECK(x && x->dtype == KN_DT_U8 && x->nbytes == 4 && !memcmp(x->data, d8, 4), "shard 1 tensor");
        CHECK(y && y->dtype == KN_DT_BF16 && y->ndim == 2 && y->shape[1] == 2 && !memcmp(y->data, d8, 8),
              "shard 2 tensor");
        CHECK(kn_st_at(st, 0) && !strcmp(kn_st_at(st, 0)->name, "s.x"), "sharded tensors sorted");
        CHECK(!kn_st_find(st, "") && !kn_st_find(st, "s.z") && !kn_st_find(st, "a"), "absent names");
        kn_st_close(st);
        st = NULL;
    }

    /* hostile indexes */
    const char *bad[][2] = {
        {"{\"weight_map\": {\"s.x\": \"..\"}}", "shard"},
        {"{\"weight_map\": {\"s.x\": \"a..b.safetensors\"}}", "shard"},
        {"{\"weight_map\": {\"s.x\": \"sub\\\\x.safetensors\"}}", "shard"},
        {"{\"weight_map\": {\"s.x\": \"\"}}", "shard"},
        {"{\"weight_map\": {\"s.x\": \"/etc/passwd\"}}", "shard"},
        {"{\"weight_map\": {\"\": \"model-00001-of-00002.safetensors\"}}", "weight_map"},
        {"{\"weight_map\": [1]}", "weight_map"},
        {"{\"metadata\": {}}", "weight_map"},
        {"[1, 2]", "object"},
        {"{\"weight_map\": {\"s.x\": \"a\", \"s.x\": \"b\"}}", "JSON"},
        {"{\"weight_map\": {\"s.extra2\": \"model-00001-of-00002.safetensors\"}}", "s.extra2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(q, bad[i][0], strlen(bad[i][0]));
        memset(&err, 0, sizeof err);
        kn_code rc = kn_st_open(dir, &st, &err);
        CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, bad[i][1]) && !st, "bad index %zu (%s): %d %s", i, bad[i][0], rc,
              err.msg);
        if (rc == KN_OK) kn_st_close(st), st = NULL;
    }
    /* a listed shard that is itself corrupt: the error names the shard */
    write_file(p, "\x10\0\0\0\0\0\0\0{", 9);
    write_file(q, idx, strlen(idx));
    CHECK(kn_st_open(dir, &st, &err) == KN_ERR_FORMAT && strstr(err.msg, "model-00002-of-00002") && !st,
          "corrupt shard: %s", err.msg);
    /* a shard that is a directory */
    unlink(p);
    mkdir(p, 0700);
    CHECK(kn_st_open(dir, &st, &err) != KN_OK && err.msg[0] && !st, "shard is a directory: %s", err.msg);
    rmdir(p);
    CHECK(kn_st_open("", &st, &err) != KN_OK && !st, "empty path");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup 2");
}

int main(void) {
    uint8_t data[40];
    for (int i = 0; i < 40; i++) data[i] = (uint8_t)i;
    size_t len;
    uint8_t *b = image(VALID, data, 40, &len);
    kn_st_tensor *t;
    size_t n;
    kn_error err = {0};
    CHECK(kn_st_parse(b, len, &t, &n, &err) == KN_OK, "valid: %s", err.msg);
    CHECK(n == 5, "5 tensors (metadata skipped), got %zu", n);
    if (n == 5) {
        CHECK(!strcmp(t[0].name, "a") && t[0].dtype == KN_DT_F32 && t[0].ndim == 2 && t[0].shape[1] == 3 && t[0].nbytes == 24,
              "tensor a");
        CHECK(t[1].dtype == KN_DT_BF16 && !memcmp(t[1].data, data + 24, 8), "tensor b bytes");
        CHECK(t[2].ndim == 0 && t[2].nbytes == 2, "scalar tensor");
        CHECK(t[3].dtype == KN_DT_I32 && t[4].nbytes == 0, "int and empty tensors");
    }
    kn_st_tensors_free(t, n);
    /* every truncation of a valid file fails cleanly */
    for (size_t cut = 0; cut < len; cut++) {
        kn_error e2 = {0};
        kn_code rc = kn_st_parse(b, cut, &t, &n, &e2);
        CHECK(rc == KN_ERR_FORMAT && e2.msg[0], "truncated at %zu must fail with a message", cut);
        if (rc == KN_OK) kn_st_tensors_free(t, n);
    }
    /* header length fields */
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    CHECK(kn_st_parse(huge, 16, &t, &n, &err) == KN_ERR_FORMAT && strstr(err.msg, "limit"), "huge header");
    uint8_t past[12] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    CHECK(kn_st_parse(past, 12, &t, &n, &err) == KN_ERR_FORMAT && strstr(err.msg, "truncated"), "header past end");
    uint8_t zero[8] = {0};
    CHECK(kn_st_parse(zero, 8, &t, &n, &err) == KN_ERR_FORMAT, "zero header");
    free(b);

    expect_bad("{\"a\": ", 0, "JSON");
    expect_bad("[1, 2]", 0, "object");
    expect_bad("{\"a\": 5}", 0, "not a JSON object");
    expect_bad("{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "unknown dtype");
    expect_bad("{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "shape");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "data_offsets");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 8, "needs 8");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 2, "past the data");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8, "begin 8 > end 4");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 8, "negative");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
               8, "overlap");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
               8, "JSON");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, "negative");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "dims");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], \"data_offsets\": [0, 4]}}", 4, "overflow");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4, "shape");
    expect_bad("{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "empty");
    expect_bad("{\"__metadata__\": 3}", 0, "__metadata__");

    /* files: single, sharded index, hostile index */
    char dir[] = "/tmp/kiln_st_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char p[512];
    float f1[2] = {1, 2}, f2[1] = {3};
    b = image("{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", f1, 8, &len);
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_file(p, b, len);
    free(b);
    b = image("{\"y\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", f2, 4, &len);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_file(p, b, len);
    free(b);
    kn_safetensors *st;
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    CHECK(kn_st_open(p, &st, &err) == KN_OK && kn_st_count(st) == 1 && kn_st_find(st, "x") && !kn_st_find(st, "y"), "single file: %s", err.msg);
    kn_st_close(st);
    CHECK(kn_st_open(dir, &st, &err) == KN_ERR_NOT_FOUND && strstr(err.msg, "index"), "two files without index");
    const char *idx = "{\"metadata\": {}, \"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s2.safetensors\"}}";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, idx, strlen(idx));
    CHECK(kn_st_open(dir, &st, &err) == KN_OK, "sharded: %s", err.msg);
    if (st) {
        const kn_st_tensor *x = kn_st_find(st, "x"), *y = kn_st_find(st, "y");
        CHECK(x && y && kn_load_f32(x->data, x->dtype, 1) == 2.0f && kn_load_f32(y->data, y->dtype, 0) == 3.0f, "sharded data");
        CHECK(kn_st_count(st) == 2 && kn_st_at(st, 0) && !kn_st_at(st, 2), "count/at");
        kn_st_close(st);
    }
    const char *bad_idx[][2] = {
        {"{\"weight_map\": {\"x\": \"../s1.safetensors\"}}", "shard must be"},
        {"{\"weight_map\": {\"z\": \"s1.safetensors\"}}", "does not contain"},
        {"{\"weight_map\": {}}", "weight_map"},
        {"{\"weight_map\": {\"x\": 5}}", "shard must be"},
        {"not json", "JSON"},
    };
    for (size_t i = 0; i < sizeof bad_idx / sizeof *bad_idx; i++) {
        write_file(p, bad_idx[i][0], strlen(bad_idx[i][0]));
        memset(&err, 0, sizeof err);
        CHECK(kn_st_open(dir, &st, &err) == KN_ERR_FORMAT && strstr(err.msg, bad_idx[i][1]), "index %zu: %s", i, err.msg);
    }
    const char *missing = "{\"weight_map\": {\"x\": \"gone.safetensors\"}}";
    write_file(p, missing, strlen(missing));
    kn_code rc = kn_st_open(dir, &st, &err);
    CHECK((rc == KN_ERR_NOT_FOUND || rc == KN_ERR_IO) && strstr(err.msg, "gone.safetensors"), "missing shard: %s", err.msg);
    /* a short file */
    snprintf(p, sizeof p, "%s/short.safetensors", dir);
    write_file(p, "abc", 3);
    CHECK(kn_st_open(p, &st, &err) == KN_ERR_FORMAT, "3-byte file");
    CHECK(kn_st_open("/nonexistent/x.safetensors", &st, &err) != KN_OK, "missing file");
    kn_st_close(NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    extra_parse_checks();
    extra_file_checks();
    return kn_test_done("test_safetensors");
}

/* fuzz_tokenizer.c — libFuzzer target for tokenizer input (untrusted text
 * and ids). The first byte picks one of the small tokenizers in
 * tests/fuzz/tokenizers/ (or tiny_precompiled) and the flags; the rest is the text (often invalid
 * UTF-8, which must be an error, never a crash). Valid text is encoded,
 * decoded, and stream-decoded; the stream must equal the full decode, and the
 * raw bytes are also decoded as an id list. Run: make fuzz (bounded time). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

static const char *const files[] = {"tests/fuzz/tokenizers/bytelevel.json", "tests/fuzz/tokenizers/spm.json",
                                    "tests/fuzz/tokenizers/wordpiece.json", "tests/fuzz/tokenizers/unigram.json",
                                    "tests/fixtures/tokenizer/tiny/tiny_precompiled/tokenizer.json"};
#define N_TOK 5
static kn_tokenizer *toks[N_TOK];

static void load_all(void) {
    for (int i = 0; i < N_TOK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", KILN_SOURCE_DIR, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) abort();
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        kn_error err;
        if (kn_tokenizer_load_json(buf, n, NULL, &toks[i], &err)) {
            fprintf(stderr, "%s: %s\n", path, err.msg);
            abort();
        }
    }
}

static void stream_equals_decode(const kn_tokenizer *t, const int32_t *ids, int n, int skip) {
    char *full;
    size_t full_len;
    kn_error err;
    if (kn_tokenizer_decode(t, ids, n, skip, &full, &full_len, &err)) return;
    kn_detok_stream *s;
    if (kn_detok_stream_new(t, skip, &s, &err)) abort();
    char *acc = malloc(full_len + 1);
    size_t acc_len = 0;
    for (int i = 0; i <= n; i++) {
        char *d;
        size_t dl;
        kn_code rc = i < n ? kn_detok_stream_push(s, ids[i], &d, &dl, &err) : kn_detok_stream_flush(s, &d, &dl, &err);
        if (rc) abort();
        if (acc_len + dl > full_len) abort(); /* more text than the full decode */
        memcpy(acc + acc_len, d, dl);
        acc_len += dl;
        free(d);
    }
    if (acc_len != full_len || memcmp(acc, full, full_len)) abort();
    kn_detok_stream_free(s);
    free(acc);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!toks[0]) load_all();
    if (size < 1) return 0;
    const kn_tokenizer *t = toks[data[0] % N_TOK];
    int special = (data[0] >> 2) & 1, skip = (data[0] >> 3) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    int n;
    kn_error err;
    if (kn_tokenizer_encode(t, text, len, special, &ids, &n, &err) == KN_OK) {
        stream_equals_decode(t, ids, n, skip);
        free(ids);
    }
    /* the bytes as ids (pairs of bytes), including out-of-range ones */
    int m = (int)(len / 2);
    int32_t *raw = malloc(sizeof *raw * (size_t)(m + 1));
    int vs = kn_tokenizer_vocab_size(t);
    for (int i = 0; i < m; i++) raw[i] = (int32_t)(((uint32_t)data[1 + 2 * i] << 8 | data[2 + 2 * i]) % (uint32_t)(vs + 2));
    char *out;
    size_t olen;
    if (kn_tokenizer_decode(t, raw, m, skip, &out, &olen, &err) == KN_OK) {
        free(out);
        stream_equals_decode(t, raw, m, skip);
    }
    free(raw);
    return 0;
}

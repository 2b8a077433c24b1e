/* tok_check.h — shared by the tokenizer tests: compare a loaded tokenizer
 * with an expectations file written by tools/fixtures/gen_tokenizer.py
 * (encode with/without special tokens, the four decodes, random-id decodes)
 * and check streaming detokenization against the full decode. */
#ifndef KN_TOK_CHECK_H
#define KN_TOK_CHECK_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

static int fails_here;

static void show(const char *what, const char *s, size_t n) {
    fprintf(stderr, "    %s: \"", what);
    for (size_t i = 0; i < n && i < 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == '"') fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fprintf(stderr, "\"%s\n", n > 160 ? "..." : "");
}

static int ids_equal(const json_t *want, const int32_t *ids, int n) {
    if (!json_is_array(want) || (int)json_array_size(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != ids[i]) return 0;
    return 1;
}

static void show_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "    %s (%d):", what, n);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static int32_t *json_ids(const json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = malloc(sizeof *v * (size_t)(*n + 1));
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static void check_encode(const kn_tokenizer *t, const char *tname, const char *cname, const char *text, size_t len,
                         int special, const json_t *want) {
    int32_t *ids;
    int n;
    kn_error err = {0};
    if (kn_tokenizer_encode(t, text, len, special, &ids, &n, &err)) {
        CHECK(0, "%s/%s: encode(special=%d) failed: %s", tname, cname, special, err.msg);
        fails_here++;
        return;
    }
    if (!ids_equal(want, ids, n)) {
        CHECK(0, "%s/%s: encode(special=%d) differs", tname, cname, special);
        fails_here++;
        if (fails_here < 12) {
            show("text", text, len);
            show_ids("got ", ids, n);
            int wn;
            int32_t *w = json_ids(want, &wn);
            show_ids("want", w, wn);
            free(w);
        }
    }
    free(ids);
}

static char *decode_or_null(const kn_tokenizer *t, const int32_t *ids, int n, int skip, size_t *len) {
    char *s;
    kn_error err = {0};
    if (kn_tokenizer_decode(t, ids, n, skip, &s, len, &err)) {
        fprintf(stderr, "    decode failed: %s\n", err.msg);
        return NULL;
    }
    return s;
}

static void check_decode(const kn_tokenizer *t, const char *tname, const char *cname, const char *what,
                         const json_t *ids_j, int skip, const json_t *want, int take_half) {
    if (!json_is_string(want)) return;
    int n;
    int32_t *ids = json_ids(ids_j, &n);
    if (take_half) n /= 2;
    size_t len;
    char *s = decode_or_null(t, ids, n, skip, &len);
    int ok = s && len == json_string_length(want) && !memcmp(s, json_string_value(want), len);
    if (!ok) {
        CHECK(0, "%s/%s: %s differs", tname, cname, what);
        fails_here++;
        if (fails_here < 12 && s) {
            show("got ", s, len);
            show("want", json_string_value(want), json_string_length(want));
        }
    }
    free(s);
    free(ids);
}

/* Streaming: deltas concatenated == full decode, and no delta splits a UTF-8 character. */
static void check_stream(const kn_tokenizer *t, const char *tname, const char *cname, const json_t *ids_j, int skip) {
    int n;
    int32_t *ids = json_ids(ids_j, &n);
    size_t full_len;
    char *full = decode_or_null(t, ids, n, skip, &full_len);
    kn_detok_stream *s;
    kn_error err = {0};
    char *acc = calloc(1, full_len + 64);
    size_t acc_len = 0, acc_cap = full_len + 64;
    int ok = full != NULL && !kn_detok_stream_new(t, skip, &s, &err);
    for (int i = 0; ok && i <= n; i++) {
        char *d;
        size_t dl;
        kn_code rc = i < n ? kn_detok_stream_push(s, ids[i], &d, &dl, &err) : kn_detok_stream_flush(s, &d, &dl, &err);
        if (rc) {
            fprintf(stderr, "    stream error: %s\n", err.msg);
            ok = 0;
            break;
        }
        /* a delta must be valid UTF-8 on its own */
        for (size_t k = 0; k < dl;) {
            unsigned char c = (unsigned char)d[k];
            size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
            if (!l || k + l > dl) {
                ok = 0;
                fprintf(stderr, "    delta %d splits a UTF-8 character\n", i);
                break;
            }
            k += l;
        }
        if (acc_len + dl + 1 > acc_cap) {
            acc_cap = 2 * (acc_len + dl + 1);
            acc = realloc(acc, acc_cap);
        }
        memcpy(acc + acc_len, d, dl);
        acc_len += dl;
        free(d);
    }
    if (full) kn_detok_stream_free(s);
    if (ok && (acc_len != full_len || memcmp(acc, full, full_len))) {
        ok = 0;
        show("stream", acc, acc_len);
        show("decode", full, full_len);
    }
    CHECK(ok, "%s/%s: streaming detokenization (skip=%d) differs from decode", tname, cname, skip);
    if (!ok) fails_here++;
    free(acc);
    free(full);
    free(ids);
}

/* Check t against expectations exp (gen_tokenizer.py format) for the corpus
 * cases it lists (matched by name); require_all: every corpus case must be
 * there. Returns the number of failures. */
static int tok_check_all(const kn_tokenizer *t, const char *tname, const json_t *exp, const json_t *corpus,
                         int require_all) {
    fails_here = 0;
    const json_t *vs = json_object_get(exp, "vocab_size");
    if (json_is_integer(vs) && kn_tokenizer_vocab_size(t) != json_integer_value(vs)) {
        CHECK(0, "%s: vocab size %d, want %lld", tname, kn_tokenizer_vocab_size(t), (long long)json_integer_value(vs));
        fails_here++;
    }
    const json_t *cases = json_object_get(exp, "cases");
    const json_t *texts = json_object_get(corpus, "cases");
    if (require_all ? json_array_size(cases) != json_array_size(texts) : json_array_size(cases) < 10) {
        CHECK(0, "%s: %zu expectations for %zu corpus strings", tname, json_array_size(cases), json_array_size(texts));
        fails_here++;
    }
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i), *src = NULL;
        const char *cname = json_string_value(json_object_get(c, "name"));
        for (size_t k = 0; cname && k < json_array_size(texts) && !src; k++)
            if (!strcmp(cname, json_string_value(json_object_get(json_array_get(texts, k), "name"))))
                src = json_array_get(texts, k);
        if (!src) {
            CHECK(0, "%s: expectation %zu (%s) is not a corpus case", tname, i, cname ? cname : "?");
            fails_here++;
            continue;
        }
        const json_t *tx = json_object_get(src, "text");
        const char *text = json_string_value(tx);
        size_t len = json_string_length(tx);
        check_encode(t, tname, cname, text, len, 0, json_object_get(c, "ids"));
        check_encode(t, tname, cname, text, len, 1, json_object_get(c, "ids_special"));
        const json_t *ids_sp = json_object_get(c, "ids_special"), *ids = json_object_get(c, "ids");
        check_decode(t, tname, cname, "decode", ids_sp, 0, json_object_get(c, "decode"), 0);
        check_decode(t, tname, cname, "decode_skip", ids_sp, 1, json_object_get(c, "decode_skip"), 0);
        check_decode(t, tname, cname, "decode_plain", ids, 0, json_object_get(c, "decode_plain"), 0);
        check_decode(t, tname, cname, "decode_half", ids, 0, json_object_get(c, "decode_half"), 1);
        check_stream(t, tname, cname, ids_sp, 0);
        check_stream(t, tname, cname, ids_sp, 1);
    }
    const json_t *rnd = json_object_get(exp, "random_decode");
    for (size_t i = 0; i < json_array_size(rnd); i++) {
        const json_t *r = json_array_get(rnd, i);
        char cname[32];
        snprintf(cname, sizeof cname, "random%zu", i);
        check_decode(t, tname, cname, "decode", json_object_get(r, "ids"), 0, json_object_get(r, "decode"), 0);
        check_decode(t, tname, cname, "decode_skip", json_object_get(r, "ids"), 1, json_object_get(r, "decode_skip"), 0);
        check_stream(t, tname, cname, json_object_get(r, "ids"), 0);
        check_stream(t, tname, cname, json_object_get(r, "ids"), 1);
    }
    return fails_here;
}

static json_t *tok_load_corpus(void) {
    char cp[4096];
    json_error_t je;
    snprintf(cp, sizeof cp, "%s/tokenizer/corpus.json", kn_test_fixtures());
    json_t *c = json_load_file(cp, JSON_ALLOW_NUL, &je);
    if (!c) fprintf(stderr, "cannot read %s: %s\n", cp, je.text);
    return c;
}

#endif

/* test_tokenizer.c — tokenizer unit tests that need no download:
 *  - malformed / unsupported tokenizer.json: clear errors naming the problem;
 *  - API contract on a minimal byte-level tokenizer built here: invalid UTF-8
 *    rejected, ids out of range rejected (decode and streaming), round trip
 *    decode(encode(x)) == x, streaming deltas == full decode on random ids
 *    (including broken UTF-8 byte sequences);
 *  - the tiny tokenizers in tests/fixtures/tokenizer/tiny/ (built and
 *    evaluated with HF `tokenizers` by tools/fixtures/gen_tokenizer.py)
 *    against their recorded ids and decodes (tok_check.h). */
#include "tok_check.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer/tok_internal.h"

static kn_code load_str(const char *js, kn_tokenizer **t, kn_error *err) {
    return kn_tokenizer_load_json(js, strlen(js), NULL, t, err);
}

static void expect_error(const char *js, kn_code code, const char *needle) {
    kn_tokenizer *t = NULL;
    kn_error err = {0};
    kn_code rc = load_str(js, &t, &err);
    CHECK(rc == code, "load of %.60s: code %d, want %d (%s)", js, rc, code, err.msg);
    CHECK(strstr(err.msg, needle) != NULL, "error \"%s\" should mention \"%s\"", err.msg, needle);
    CHECK(t == NULL, "no tokenizer on error");
    kn_tokenizer_free(t);
}

#define BPE_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_errors(void) {
    expect_error("{", KN_ERR_FORMAT, "tokenizer.json");
    expect_error("[1, 2]", KN_ERR_FORMAT, "model");
    expect_error("{\"normalizer\": null}", KN_ERR_FORMAT, "model");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": {\"a\": 0}}}", KN_ERR_FORMAT, "Unigram");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]], \"unk_id\": 5}}", KN_ERR_FORMAT, "unk_id");
    expect_error("{\"model\": {\"type\": \"Frobnicate\", \"vocab\": {}}}", KN_ERR_UNSUPPORTED, "Frobnicate");
    expect_error("{" BPE_MODEL ", \"normalizer\": {\"type\": \"Fancy\"}}", KN_ERR_UNSUPPORTED, "Fancy");
    expect_error("{" BPE_MODEL ", \"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"!!\"}}",
                 KN_ERR_FORMAT, "base64");
    expect_error("{" BPE_MODEL ", \"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"AAAA\"}}",
                 KN_ERR_FORMAT, "Precompiled");
    expect_error("{" BPE_MODEL ", \"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"/////w==\"}}",
                 KN_ERR_FORMAT, "trie size");
    expect_error("{" BPE_MODEL ", \"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}}", KN_ERR_UNSUPPORTED, "UnicodeScripts");
    expect_error("{" BPE_MODEL ", \"decoder\": {\"type\": \"CTC\"}}", KN_ERR_UNSUPPORTED, "CTC");
    expect_error("{" BPE_MODEL ", \"post_processor\": {\"type\": \"Wobble\"}}", KN_ERR_UNSUPPORTED, "Wobble");
    expect_error("{" BPE_MODEL ", \"normalizer\": {\"kind\": \"NFC\"}}", KN_ERR_FORMAT, "type");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a zz\"]}}", KN_ERR_FORMAT,
                 "not in the vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                 KN_ERR_FORMAT, "merged token");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"abc\"]}}", KN_ERR_FORMAT,
                 "one space");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", KN_ERR_FORMAT, "merge 0");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", KN_ERR_FORMAT, "invalid id");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 900000000}, \"merges\": []}}", KN_ERR_FORMAT, "id");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 5000000}, \"merges\": []}}", KN_ERR_FORMAT,
                 "sparse");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": \"abc\", \"merges\": []}}", KN_ERR_FORMAT, "vocab");
    expect_error("{" BPE_MODEL ", \"added_tokens\": [{\"id\": \"x\", \"content\": \"q\"}]}", KN_ERR_FORMAT, "added_tokens");
    expect_error("{" BPE_MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, "
                 "\"behavior\": \"Isolated\"}}",
                 KN_ERR_UNSUPPORTED, "regex");
    expect_error("{" BPE_MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                 "\"behavior\": \"Sideways\"}}",
                 KN_ERR_UNSUPPORTED, "Sideways");
    expect_error("{" BPE_MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                 "[{\"SpecialToken\": {\"id\": \"<x>\", \"type_id\": 0}}], \"special_tokens\": {}}}",
                 KN_ERR_FORMAT, "<x>");
    expect_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", KN_ERR_FORMAT, "unk_token");

    /* directory checks */
    char tmp[] = "/tmp/kn_tok_test_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    kn_tokenizer *t = NULL;
    kn_error err = {0};
    CHECK(kn_tokenizer_load(tmp, &t, &err) == KN_ERR_NOT_FOUND && strstr(err.msg, "tokenizer.json"),
          "missing tokenizer.json: %s", err.msg);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.model", tmp);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    /* an empty tokenizer.model: refused by SentencePiece (FORMAT) or, in a build
     * without libsentencepiece, reported as unsupported; either way it names the file */
    kn_code rc = kn_tokenizer_load(tmp, &t, &err);
    CHECK((rc == KN_ERR_UNSUPPORTED || rc == KN_ERR_FORMAT) && strstr(err.msg, "tokenizer.model"),
          "tokenizer.model only: %d %s", rc, err.msg);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer.json", tmp);
    f = fopen(p, "w");
    if (f) {
        fputs("{\"model\": ", f);
        fclose(f);
    }
    CHECK(kn_tokenizer_load(tmp, &t, &err) == KN_ERR_FORMAT && strstr(err.msg, tmp), "truncated file: %s", err.msg);
    unlink(p);
    rmdir(tmp);
}

/* Added tokens get ids as HF add_tokens assigns them: the vocab's id when the
 * string is in the vocab, else the next id after the vocab, whatever the
 * JSON "id" says (HF only warns). */
static void test_added_ids(void) {
    const char *js = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
                     " \"added_tokens\": [{\"id\": 7, \"content\": \"<x>\", \"special\": true},"
                     " {\"id\": 9, \"content\": \"b\", \"special\": false},"
                     " {\"id\": 3, \"content\": \"<y>\", \"special\": false}]}";
    kn_tokenizer *t;
    kn_error err = {0};
    if (load_str(js, &t, &err)) {
        CHECK(0, "added ids: %s", err.msg);
        return;
    }
    CHECK(kn_tokenizer_token_id(t, "<x>") == 2 && kn_tokenizer_token_id(t, "b") == 1 &&
              kn_tokenizer_token_id(t, "<y>") == 3 && kn_tokenizer_vocab_size(t) == 4,
          "added ids: <x>=%d b=%d <y>=%d size=%d", kn_tokenizer_token_id(t, "<x>"), kn_tokenizer_token_id(t, "b"),
          kn_tokenizer_token_id(t, "<y>"), kn_tokenizer_vocab_size(t));
    kn_tokenizer_free(t);
}

/* A byte-level tokenizer with one id per byte, a few merges, a special token
 * and a BOS template; built here so the API tests need no files. */
static kn_tokenizer *byte_tokenizer(void) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char u[5] = {0};
        kn_utf8_encode(kn_byte_to_cp((uint8_t)b), u);
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "he", json_integer(256));
    json_object_set_new(vocab, "hel", json_integer(257));
    json_object_set_new(vocab, "\xC4\xA0t", json_integer(258)); /* "Ġt" */
    json_t *root = json_pack(
        "{s:{s:s, s:o, s:[s,s,s]}, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:{s:s, s:b, s:b}, s:{s:s}, "
        "s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}}",
        "model", "type", "BPE", "vocab", vocab, "merges", "h e", "he l", "\xC4\xA0 t", "added_tokens", "id", 259,
        "content", "<|s|>", "special", 1, "normalized", 0, "lstrip", 0, "rstrip", 0, "single_word", 0, "pre_tokenizer",
        "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1, "decoder", "type", "ByteLevel", "post_processor",
        "type", "TemplateProcessing", "single", "SpecialToken", "id", "<|s|>", "type_id", 0, "Sequence", "id", "A",
        "type_id", 0, "special_tokens", "<|s|>", "id", "<|s|>", "ids", 259, "tokens", "<|s|>");
    char *js = json_dumps(root, 0);
    json_decref(root);
    kn_tokenizer *t = NULL;
    kn_error err = {0};
    CHECK(js && load_str(js, &t, &err) == KN_OK, "byte tokenizer: %s", err.msg);
    free(js);
    return t;
}

static void test_api(void) {
    kn_tokenizer *t = byte_tokenizer();
    if (!t) return;
    kn_error err = {0};
    int32_t *ids;
    int n;
    CHECK(kn_tokenizer_vocab_size(t) == 260, "vocab size %d", kn_tokenizer_vocab_size(t));
    CHECK(kn_tokenizer_token_id(t, "<|s|>") == 259 && kn_tokenizer_is_special(t, 259) && !kn_tokenizer_is_special(t, 5),
          "special token lookup");
    CHECK(kn_tokenizer_token(t, 260) == NULL && kn_tokenizer_token(t, -1) == NULL, "token() out of range");
    for (int32_t id = 0; id < 260; id++)
        CHECK(kn_tokenizer_token_id(t, kn_tokenizer_token(t, id)) == id, "token_id(token(%d))", id);

    /* invalid UTF-8 is an error, never a crash */
    static const char *const bad[] = {"\xff", "abc\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "a\x80z"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kn_code rc = kn_tokenizer_encode(t, bad[i], strlen(bad[i]), 0, &ids, &n, &err);
        CHECK(rc == KN_ERR_INVALID_ARG && strstr(err.msg, "UTF-8"), "invalid UTF-8 case %zu: %d %s", i, rc, err.msg);
    }
    /* empty input: no ids, or only the template's */
    CHECK(kn_tokenizer_encode(t, "", 0, 0, &ids, &n, &err) == KN_OK && n == 0, "empty encode");
    free(ids);
    CHECK(kn_tokenizer_encode(t, "", 0, 1, &ids, &n, &err) == KN_OK && n == 1 && ids[0] == 259, "empty encode + special");
    free(ids);

    /* ids out of range */
    char *s;
    size_t len;
    int32_t badids[] = {1, 260};
    CHECK(kn_tokenizer_decode(t, badids, 2, 0, &s, &len, &err) == KN_ERR_INVALID_ARG &&
              strstr(err.msg, "outside the vocabulary"),
          "decode out of range: %s", err.msg);
    badids[1] = -3;
    CHECK(kn_tokenizer_decode(t, badids, 2, 0, &s, &len, &err) == KN_ERR_INVALID_ARG, "decode negative id");
    kn_detok_stream *st;
    CHECK(kn_detok_stream_new(t, 0, &st, &err) == KN_OK, "stream new");
    CHECK(kn_detok_stream_push(st, 99999, &s, &len, &err) == KN_ERR_INVALID_ARG, "stream out of range");
    kn_detok_stream_free(st);

    /* round trip on random valid UTF-8 (byte-level covers every byte) */
    uint64_t seed = 7;
    for (int iter = 0; iter < 300; iter++) {
        char text[256];
        size_t tl = 0;
        int nchars = (int)((kn_test_rand(&seed) + 1) * 30);
        for (int k = 0; k < nchars; k++) {
            float r = kn_test_rand(&seed);
            uint32_t cp = r < -0.3f ? (uint32_t)(32 + (kn_test_rand(&seed) + 1) * 47)
                          : r < 0.3f ? (uint32_t)((kn_test_rand(&seed) + 1) * 0x7ff)
                                     : (uint32_t)(0x10000 + (kn_test_rand(&seed) + 1) * 0x7fff);
            if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
            tl += (size_t)kn_utf8_encode(cp, text + tl);
        }
        if (kn_tokenizer_encode(t, text, tl, 0, &ids, &n, &err) != KN_OK) {
            CHECK(0, "encode: %s", err.msg);
            continue;
        }
        CHECK(kn_tokenizer_decode(t, ids, n, 0, &s, &len, &err) == KN_OK && len == tl && !memcmp(s, text, tl),
              "round trip %d", iter);
        free(s);
        free(ids);
    }

    /* streaming == full decode on random ids (broken UTF-8 sequences included) */
    for (int iter = 0; iter < 300; iter++) {
        int32_t r[40];
        int nr = 1 + (int)((kn_test_rand(&seed) + 1) * 19);
        for (int k = 0; k < nr; k++) {
            float x = kn_test_rand(&seed);
            r[k] = x < -0.6f ? 259 : x < 0.0f ? (int32_t)(0x80 + (kn_test_rand(&seed) + 1) * 0x3f)
                                               : (int32_t)((kn_test_rand(&seed) + 1) * 129.9f);
        }
        json_t *arr = json_array();
        for (int k = 0; k < nr; k++) json_array_append_new(arr, json_integer(r[k]));
        check_stream(t, "byte", "random", arr, iter & 1);
        json_decref(arr);
    }
    kn_tokenizer_free(t);
}

/* One kn_tokenizer shared by several threads gives every thread the ids a
 * single thread gets (the tokenizer is immutable; scratch is per call). */
typedef struct {
    const kn_tokenizer *t;
    const char *text;
    size_t len;
    const int32_t *want;
    int n_want;
    int ok;
} thread_job;

static void *thread_encode(void *arg) {
    thread_job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 50 && j->ok; r++) {
        int32_t *ids;
        int n;
        kn_error err;
        if (kn_tokenizer_encode(j->t, j->text, j->len, r & 1, &ids, &n, &err)) {
            j->ok = 0;
            break;
        }
        int off = r & 1; /* the template adds one id in front */
        j->ok = n == j->n_want + off && !memcmp(ids + off, j->want, sizeof *ids * (size_t)j->n_want);
        free(ids);
    }
    return NULL;
}

static void test_threads(void) {
    kn_tokenizer *t = byte_tokenizer();
    if (!t) return;
    static const char text[] = "the hello there, \xe4\xb8\xad\xe6\x96\x87 <|s|> text   with  spaces\n\n and more the the";
    int32_t *want;
    int n_want;
    kn_error err;
    if (kn_tokenizer_encode(t, text, sizeof text - 1, 0, &want, &n_want, &err)) {
        CHECK(0, "encode: %s", err.msg);
        kn_tokenizer_free(t);
        return;
    }
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, text, sizeof text - 1, want, n_want, 0};
        pthread_create(&th[i], NULL, thread_encode, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok, "thread %d got different ids", i);
    }
    free(want);
    kn_tokenizer_free(t);
}

static const char *const tiny_names[] = {"tiny_bytelevel", "tiny_spm", "tiny_legacy_spm", "tiny_suffix", "spm_bpe", "spm_unigram", "tiny_unigram",
                                         "tiny_split", "tiny_wordpiece", "tiny_wordlevel", "tiny_precompiled", "tiny_added_ids"};

static void test_tiny(void) {
    json_t *corpus = tok_load_corpus();
    if (!corpus) {
        CHECK(0, "corpus missing");
        return;
    }
    int found = 0;
    for (size_t i = 0; i < sizeof tiny_names / sizeof *tiny_names; i++) {
        char dir[4096], path[4200];
        snprintf(dir, sizeof dir, "%s/tokenizer/tiny/%s", kn_test_fixtures(), tiny_names[i]);
        struct stat sb;
        if (stat(dir, &sb) != 0) continue; /* not generated yet */
        found++;
        snprintf(path, sizeof path, "%s/tokenizer/%s.json", kn_test_fixtures(), tiny_names[i]);
        json_error_t je;
        json_t *exp = json_load_file(path, JSON_ALLOW_NUL, &je);
        CHECK(exp != NULL, "%s: expectations %s: %s", tiny_names[i], path, je.text);
        kn_tokenizer *t;
        kn_error err = {0};
        if (kn_tokenizer_load(dir, &t, &err)) {
            if (err.code == KN_ERR_UNSUPPORTED && strstr(err.msg, "libsentencepiece")) {
                printf("%-16s SKIP: this build has no libsentencepiece\n", tiny_names[i]);
                json_decref(exp);
                continue;
            }
            CHECK(0, "%s: %s", tiny_names[i], err.msg);
            json_decref(exp);
            continue;
        }
        if (exp) {
            int f = tok_check_all(t, tiny_names[i], exp, corpus, 0);
            printf("%-16s %zu cases, %d failures\n", tiny_names[i], json_array_size(json_object_get(exp, "cases")), f);
        }
        json_decref(exp);
        kn_tokenizer_free(t);
    }
    printf("tiny tokenizers tested: %d\n", found);
    json_decref(corpus);
}

int main(void) {
    test_errors();
    test_api();
    test_added_ids();
    test_threads();
    test_tiny();
    return kn_test_done("test_tokenizer");
}

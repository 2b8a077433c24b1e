/* bench_tokenizer.c — tokenizer speed: load time of a tokenizer.json and
 * single-thread encode/decode throughput on about 1 MB of mixed text (the
 * committed test corpus repeated; or a file given with --text FILE).
 *
 * usage: bench_tokenizer TOKENIZER_DIR... [--text FILE] [--mb N]
 * Results are recorded by hand in docs/PERF.md (tokenizer section). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: on a shared machine it excludes time spent descheduled */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *corpus_text(const char *path, double mb, size_t *len) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", path, je.text);
        return NULL;
    }
    size_t want = (size_t)(mb * 1e6), n = 0;
    char *buf = malloc(want + 65536);
    const json_t *cases = json_object_get(j, "cases");
    while (buf && n < want) {
        for (size_t i = 0; i < json_array_size(cases) && n < want; i++) {
            const json_t *t = json_object_get(json_array_get(cases, i), "text");
            size_t l = json_string_length(t);
            if (l > 60000) l = 0;
            memcpy(buf + n, json_string_value(t), l);
            n += l;
            buf[n++] = '\n';
        }
    }
    json_decref(j);
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    const char *text_file = NULL, *corpus = "tests/fixtures/tokenizer/corpus.json";
    double mb = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) text_file = argv[++i];
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc) corpus = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
    }
    size_t len = 0;
    char *text = NULL;
    if (text_file) {
        FILE *f = fopen(text_file, "rb");
        if (!f) return perror(text_file), 1;
        fseek(f, 0, SEEK_END);
        len = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc(len + 1);
        if (!text || fread(text, 1, len, f) != len) return fprintf(stderr, "read failed\n"), 1;
        fclose(f);
    } else text = corpus_text(corpus, mb, &len);
    if (!text) return 1;
    printf("%-40s %8s %8s %10s %10s %10s %8s %10s\n", "tokenizer", "load s", "load cpu", "tokens", "encode s",
           "enc cpu s", "MB/s", "decode s");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") || !strcmp(argv[i], "--corpus") || !strcmp(argv[i], "--mb")) {
            i++;
            continue;
        }
        kn_tokenizer *t;
        kn_error err = {0};
        double t0 = now(), c0 = cpu_now();
        if (kn_tokenizer_load(argv[i], &t, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double t1 = now(), c1 = cpu_now();
        int32_t *ids;
        int n;
        if (kn_tokenizer_encode(t, text, len, 0, &ids, &n, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double t2 = now(), c2 = cpu_now();
        char *out;
        size_t olen;
        if (kn_tokenizer_decode(t, ids, n, 0, &out, &olen, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double t3 = now();
        const char *name = strlen(argv[i]) > 40 ? argv[i] + strlen(argv[i]) - 40 : argv[i];
        printf("%-40s %8.3f %8.3f %10d %10.3f %10.3f %8.2f %10.3f\n", name, t1 - t0, c1 - c0, n, t2 - t1, c2 - c1,
               len / 1e6 / (c2 - c1), t3 - t2);
        free(out);
        free(ids);
        kn_tokenizer_free(t);
    }
    free(text);
    return 0;
}

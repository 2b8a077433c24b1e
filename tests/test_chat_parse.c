/* test_chat_parse.c — the streaming content / <think> / <tool_call>
 * splitter: for every way of cutting the text into two pushes, and for
 * byte-by-byte pushes, the collected content, reasoning and tool-call bodies
 * are the same as for one push, and equal the expected split. Plus the tool
 * call body parser (Qwen "arguments" and Llama 3 "parameters" spellings). */
#include <string.h>

#include "server/chat_parse.h"
#include "test_util.h"

typedef struct {
    kn_buf content, reasoning, tools; /* tool bodies joined with '|' */
} collected;

static void on_seg(kn_seg_kind k, const char *t, size_t n, void *u) {
    collected *c = u;
    if (k == KN_SEG_CONTENT) kn_buf_add(&c->content, t, n);
    else if (k == KN_SEG_REASONING) kn_buf_add(&c->reasoning, t, n);
    else {
        if (c->tools.len) kn_buf_add(&c->tools, "|", 1);
        kn_buf_add(&c->tools, t, n);
    }
}

static const char *s_(kn_buf *b) { return b->data ? b->data : ""; }

static void run(const char *text, const size_t *cuts, int n_cuts, int think, int tools, int start_reasoning,
                collected *c) {
    memset(c, 0, sizeof *c);
    kn_chat_split sp;
    kn_chat_split_init(&sp, think, tools, start_reasoning);
    size_t prev = 0, len = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        kn_chat_split_push(&sp, text + prev, end - prev, on_seg, c);
        prev = end;
    }
    kn_chat_split_finish(&sp, on_seg, c);
    kn_chat_split_free(&sp);
}

static void expect(const char *text, int think, int tools, int start_reasoning, const char *content,
                   const char *reasoning, const char *calls) {
    size_t len = strlen(text);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    for (size_t cut = 0; cut <= len + 1; cut++) {
        collected c;
        if (cut <= len) run(text, &cut, 1, think, tools, start_reasoning, &c); /* two pushes */
        else run(text, cuts, (int)len, think, tools, start_reasoning, &c);    /* byte by byte */
        CHECK(!strcmp(s_(&c.content), content), "cut %zu of \"%s\": content \"%s\", want \"%s\"", cut, text,
              s_(&c.content), content);
        CHECK(!strcmp(s_(&c.reasoning), reasoning), "cut %zu of \"%s\": reasoning \"%s\", want \"%s\"", cut, text,
              s_(&c.reasoning), reasoning);
        CHECK(!strcmp(s_(&c.tools), calls), "cut %zu of \"%s\": tools \"%s\", want \"%s\"", cut, text, s_(&c.tools),
              calls);
        kn_buf_free(&c.content), kn_buf_free(&c.reasoning), kn_buf_free(&c.tools);
    }
    free(cuts);
}

int main(void) {
    expect("Hello, world.", 1, 1, 0, "Hello, world.", "", "");
    expect("<think>\nTwo plus two is four.\n</think>\n\nThe answer is 4.", 1, 0, 0, "The answer is 4.",
           "Two plus two is four.", "");
    expect("Two plus two.\n</think>\n\nFour.", 1, 0, 1, "Four.", "Two plus two.", "");
    expect("<think>\n\n</think>\n\nThe answer is 4.", 1, 0, 0, "The answer is 4.", "", "");
    expect("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 1, 1, 0, "",
           "", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}");
    expect("<tool_call>\n{\"a\": 1}\n</tool_call>\n<tool_call>\n{\"b\": 2}\n</tool_call>", 1, 1, 0, "", "",
           "{\"a\": 1}|{\"b\": 2}");
    expect("Let me check.\n<tool_call>\n{\"a\": 1}\n</tool_call>", 1, 1, 0, "Let me check.", "", "{\"a\": 1}");
    /* tools not parsed: the tags are plain content */
    expect("x <tool_call>{}</tool_call>", 1, 0, 0, "x <tool_call>{}</tool_call>", "", "");
    /* unterminated call: shown as content */
    expect("<tool_call>\n{\"a\": 1", 1, 1, 0, "<tool_call>{\"a\": 1", "", "");
    /* a <think> after content is not a reasoning block */
    expect("ok <think>x</think>", 1, 0, 0, "ok <think>x</think>", "", "");
    /* near-miss tag prefixes are released */
    expect("a <tool b <thin c </", 1, 1, 0, "a <tool b <thin c </", "", "");
    /* reasoning that never closes (max_tokens hit) */
    expect("<think>\nstill thinking", 1, 0, 0, "", "still thinking", "");

    char *name, *args;
    CHECK(kn_parse_tool_call("{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}", 41, &name, &args) == 0 &&
              !strcmp(name, "f") && !strcmp(args, "{\"x\":[1,2]}"),
          "qwen tool call");
    free(name), free(args);
    const char *l3 = "{\"name\": \"g\", \"parameters\": {\"q\": \"v\"}}";
    CHECK(kn_parse_tool_call(l3, strlen(l3), &name, &args) == 0 && !strcmp(name, "g") && !strcmp(args, "{\"q\":\"v\"}"),
          "llama3 tool call");
    free(name), free(args);
    const char *noargs = "{\"name\": \"h\"}";
    CHECK(kn_parse_tool_call(noargs, strlen(noargs), &name, &args) == 0 && !strcmp(args, "{}"), "no arguments");
    free(name), free(args);
    const char *bad[] = {"{\"name\": 3}", "[1]", "{\"name\": \"x\", \"arguments\": 5}", "{not json", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(kn_parse_tool_call(bad[i], strlen(bad[i]), &name, &args) == -1 && !name && !args, "accepted %s", bad[i]);
    return kn_test_done("test_chat_parse");
}

/* fuzz_chat_template.c — libFuzzer target for the Jinja chat-template engine:
 * the input is template source (untrusted: it comes from a downloaded
 * tokenizer_config.json), compiled and rendered against a fixed conversation
 * with tools, tool calls and tool results. Small limits keep each run fast;
 * hitting a limit is a clean error. Run: make fuzz (bounded time). */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_internal.h"

static const char messages_json[] =
    "[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris? \\u00e9\\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"location\":\"Paris\",\"n\":[1,2.5,true,null]}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"name\":\"get_weather\",\"content\":\"22 C\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>x</think>It is 22 C.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"thanks\"},{\"type\":\"image\"}]}]";
static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"}},\"required\":[\"location\"]}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *messages, *tools, *kwargs;
    if (!messages) {
        messages = json_loads(messages_json, 0, NULL);
        tools = json_loads(tools_json, 0, NULL);
        kwargs = json_loads("{\"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", 0, NULL);
        if (!messages || !tools || !kwargs) abort();
    }
    jlimits lim = kn_jinja_default_limits;
    lim.max_ops = 200000;
    lim.max_loop = 20000;
    lim.max_output = 1 << 20;
    lim.max_arena = 64 << 20;
    kn_chat_template *t = NULL;
    kn_error err;
    if (kn_chat_template_compile((const char *)data, size, "fuzz", &t, &err) != KN_OK) return 0;
    char *out = NULL;
    size_t len;
    if (kn_chat_template_render_limited(t, messages, tools, 1, kwargs, &lim, &out, &len, &err) == KN_OK) {
        volatile char sink = 0;
        for (size_t i = 0; i < len; i++) sink ^= out[i];
        (void)sink;
    }
    free(out);
    kn_chat_template_free(t);
    return 0;
}

/* chat_parse.h — split generated chat text into content, reasoning
 * (<think>...</think>) and tool calls (<tool_call>...</tool_call>, the
 * Qwen/Hermes format), incrementally, for streaming.
 *
 * Text is pushed as it is detokenized; each piece is reported through a
 * callback as soon as it cannot change any more. A tail that could be the
 * start of a tag is held back, so a tag is never shown as content. Leading
 * whitespace after a tag and trailing whitespace before one are dropped
 * (the way chat UIs and vLLM's parsers present them). A tool call is
 * reported whole (its inner text, trimmed) when its closing tag arrives; an
 * unterminated one is reported as content at finish. Pure: no I/O. */
#ifndef KN_SERVER_CHAT_PARSE_H
#define KN_SERVER_CHAT_PARSE_H

#include <stddef.h>

#include "server/json_util.h"

typedef enum { KN_SEG_CONTENT, KN_SEG_REASONING, KN_SEG_TOOL_CALL } kn_seg_kind;

typedef void (*kn_seg_cb)(kn_seg_kind kind, const char *text, size_t len, void *user);

typedef struct {
    int mode; /* kn_seg_kind */
    int parse_think, parse_tools;
    int at_start; /* nothing emitted in this mode yet: leading whitespace is dropped */
    int n_tool_calls;
    int content_started; /* content was produced: a later <think> is plain text */
    kn_buf pending; /* held-back text of the current mode */
    kn_buf tool;    /* body of the open tool call */
} kn_chat_split;

/* start_reasoning: the prompt already opened a <think> block. */
void kn_chat_split_init(kn_chat_split *s, int parse_think, int parse_tools, int start_reasoning);
void kn_chat_split_push(kn_chat_split *s, const char *text, size_t len, kn_seg_cb cb, void *user);
void kn_chat_split_finish(kn_chat_split *s, kn_seg_cb cb, void *user);
void kn_chat_split_free(kn_chat_split *s);

/* Parse one tool call body: {"name": "...", "arguments": {...}} (or
 * "parameters", the Llama 3 spelling). *name is malloc'd; *arguments is the
 * arguments object serialized compactly (malloc'd, "{}" when absent).
 * Returns 0, or -1 when the text is not such an object. */
int kn_parse_tool_call(const char *text, size_t len, char **name, char **arguments);

#endif

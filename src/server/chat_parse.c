/* chat_parse.c — see chat_parse.h.
 *
 * State machine over three modes; in each mode a small set of tags is
 * active: CONTENT: <think> (only before any content, when parse_think) and
 * <tool_call> (when parse_tools); REASONING: </think>; TOOL_CALL:
 * </tool_call>. The buffer (pending + new text) is scanned for the earliest
 * active tag; text before it belongs to the current mode. Without a tag the
 * longest suffix that is a proper prefix of an active tag, plus trailing
 * whitespace, stays pending. */
#include "server/chat_parse.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char TAG_THINK[] = "<think>", TAG_END_THINK[] = "</think>", TAG_TOOL[] = "<tool_call>",
                  TAG_END_TOOL[] = "</tool_call>";

void kn_chat_split_init(kn_chat_split *s, int parse_think, int parse_tools, int start_reasoning) {
    memset(s, 0, sizeof *s);
    s->parse_think = parse_think, s->parse_tools = parse_tools;
    s->mode = parse_think && start_reasoning ? KN_SEG_REASONING : KN_SEG_CONTENT;
    s->at_start = 1;
}

void kn_chat_split_free(kn_chat_split *s) {
    kn_buf_free(&s->pending);
    kn_buf_free(&s->tool);
}

static int active_tags(const kn_chat_split *s, const char **tags, int *next_mode, int content_seen) {
    int n = 0;
    if (s->mode == KN_SEG_CONTENT) {
        if (s->parse_think && !content_seen) tags[n] = TAG_THINK, next_mode[n++] = KN_SEG_REASONING;
        if (s->parse_tools) tags[n] = TAG_TOOL, next_mode[n++] = KN_SEG_TOOL_CALL;
    } else if (s->mode == KN_SEG_REASONING) {
        tags[n] = TAG_END_THINK, next_mode[n++] = KN_SEG_CONTENT;
    } else {
        tags[n] = TAG_END_TOOL, next_mode[n++] = KN_SEG_CONTENT;
    }
    return n;
}

/* deliver text of the current mode (leading whitespace dropped at mode start) */
static void deliver(kn_chat_split *s, const char *t, size_t n, kn_seg_cb cb, void *user) {
    if (s->at_start)
        while (n && isspace((unsigned char)*t)) t++, n--;
    if (!n) return;
    s->at_start = 0;
    if (s->mode == KN_SEG_CONTENT) s->content_started = 1;
    if (s->mode == KN_SEG_TOOL_CALL) kn_buf_add(&s->tool, t, n);
    else cb((kn_seg_kind)s->mode, t, n, user);
}

static void trim(const char **t, size_t *n) {
    while (*n && isspace((unsigned char)**t)) (*t)++, (*n)--;
    while (*n && isspace((unsigned char)(*t)[*n - 1])) (*n)--;
}

void kn_chat_split_push(kn_chat_split *s, const char *text, size_t len, kn_seg_cb cb, void *user) {
    kn_buf_add(&s->pending, text, len);
    if (s->pending.oom) return;
    char *buf = s->pending.data;
    size_t n = s->pending.len, pos = 0;
    for (;;) {
        const char *tags[2];
        int next[2];
        int nt = active_tags(s, tags, next, s->content_started || s->n_tool_calls > 0);
        size_t best = (size_t)-1;
        int which = -1;
        for (int i = 0; i < nt; i++) {
            const char *hit = memmem(buf + pos, n - pos, tags[i], strlen(tags[i]));
            if (hit && (size_t)(hit - buf) < best) best = (size_t)(hit - buf), which = i;
        }
        if (which >= 0 && tags[which] == TAG_THINK) { /* only at the very start of the answer */
            int ws = 1;
            for (size_t i = pos; i < best && ws; i++) ws = isspace((unsigned char)buf[i]);
            if (!ws) {
                s->content_started = 1;
                continue;
            }
        }
        if (which < 0) {
            /* hold back a possible tag start and trailing whitespace */
            size_t keep = 0;
            for (int i = 0; i < nt; i++) {
                size_t tl = strlen(tags[i]), max = tl - 1 < n - pos ? tl - 1 : n - pos;
                for (size_t k = max; k > keep; k--)
                    if (!memcmp(buf + n - k, tags[i], k)) {
                        keep = k;
                        break;
                    }
            }
            if (s->mode != KN_SEG_TOOL_CALL)
                while (keep < n - pos && isspace((unsigned char)buf[n - keep - 1])) keep++;
            deliver(s, buf + pos, n - pos - keep, cb, user);
            memmove(buf, buf + n - keep, keep);
            s->pending.len = keep;
            buf[keep] = 0;
            return;
        }
        /* text before the tag: trailing whitespace dropped */
        const char *t = buf + pos;
        size_t tn = best - pos;
        while (tn && isspace((unsigned char)t[tn - 1])) tn--;
        deliver(s, t, tn, cb, user);
        if (s->mode == KN_SEG_TOOL_CALL) {
            const char *body = s->tool.data ? s->tool.data : "";
            size_t bl = s->tool.len;
            trim(&body, &bl);
            cb(KN_SEG_TOOL_CALL, body, bl, user);
            s->tool.len = 0;
            s->n_tool_calls++;
        }
        s->mode = next[which];
        s->at_start = 1;
        pos = best + strlen(tags[which]);
    }
}

void kn_chat_split_finish(kn_chat_split *s, kn_seg_cb cb, void *user) {
    const char *t = s->pending.data ? s->pending.data : "";
    size_t n = s->pending.len;
    if (s->mode == KN_SEG_TOOL_CALL) {
        /* unterminated tool call: show what was generated as content */
        kn_buf all = {0};
        kn_buf_puts(&all, TAG_TOOL);
        if (s->tool.len) kn_buf_add(&all, s->tool.data, s->tool.len);
        kn_buf_add(&all, t, n);
        s->mode = KN_SEG_CONTENT;
        if (all.len) cb(KN_SEG_CONTENT, all.data, all.len, user);
        kn_buf_free(&all);
    } else {
        while (n && isspace((unsigned char)t[n - 1])) n--;
        deliver(s, t, n, cb, user);
    }
    s->pending.len = 0;
}

int kn_parse_tool_call(const char *text, size_t len, char **name, char **arguments) {
    *name = NULL, *arguments = NULL;
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return -1;
    }
    json_t *nm = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
    if (!args) args = json_object_get(j, "parameters");
    if (!json_is_string(nm) || (args && !json_is_object(args) && !json_is_string(args))) {
        json_decref(j);
        return -1;
    }
    *name = strdup(json_string_value(nm));
    if (!args) *arguments = strdup("{}");
    else if (json_is_string(args)) *arguments = strdup(json_string_value(args));
    else *arguments = json_dumps(args, JSON_COMPACT);
    json_decref(j);
    if (!*name || !*arguments) {
        free(*name), free(*arguments);
        *name = *arguments = NULL;
        return -1;
    }
    return 0;
}

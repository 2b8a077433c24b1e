/* run_text.c — `kiln run` with text instead of ids: `-p PROMPT` encodes the
 * prompt with the model's tokenizer (BOS etc. as HF encode adds them);
 * `--chat` renders it as a user message through the model's chat template
 * (add_generation_prompt) first, and without -p holds a multi-turn chat on
 * stdin, one user line per turn. Generated text streams to stdout through
 * the streaming detokenizer; stats go to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kiln/kiln.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    kn_detok_stream *ds;
    char *reply; /* the assistant's text of this turn (for the chat history) */
    size_t reply_len;
    kn_error err;
    int failed;
} stream_state;

static int on_token(int32_t tok, void *user) {
    stream_state *st = user;
    char *delta = NULL;
    size_t len = 0;
    if (kn_detok_stream_push(st->ds, tok, &delta, &len, &st->err)) {
        st->failed = 1;
        return 1;
    }
    fwrite(delta, 1, len, stdout);
    fflush(stdout);
    char *grown = realloc(st->reply, st->reply_len + len + 1);
    if (grown) {
        memcpy(grown + st->reply_len, delta, len);
        st->reply_len += len;
        grown[st->reply_len] = 0;
        st->reply = grown;
    }
    free(delta);
    return 0;
}

/* Generate from text (already templated when chat); streams the reply. */
static kn_code generate_text(kn_model *m, const kn_tokenizer *tok, const char *text, int add_special,
                             const kn_sampling *s, char **reply, kn_error *err) {
    int32_t *ids = NULL;
    int n_ids = 0;
    kn_code rc = kn_tokenizer_encode(tok, text, strlen(text), add_special, &ids, &n_ids, err);
    if (rc) return rc;
    stream_state st = {0};
    if ((rc = kn_detok_stream_new(tok, 1, &st.ds, err))) {
        free(ids);
        return rc;
    }
    kn_generate_stats stats = {0};
    rc = kn_generate(m, ids, n_ids, s, on_token, &st, &stats, err);
    if (!rc && st.failed) rc = kn_fail(err, st.err.code, "%s", st.err.msg);
    char *tail = NULL;
    size_t tail_len = 0;
    if (!rc && !kn_detok_stream_flush(st.ds, &tail, &tail_len, err)) {
        fwrite(tail, 1, tail_len, stdout);
        free(tail);
    }
    printf("\n");
    if (!rc)
        fprintf(stderr, "kiln: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens (%.1f tok/s)\n",
                stats.n_prompt, stats.prefill_seconds,
                stats.prefill_seconds > 0 ? stats.n_prompt / stats.prefill_seconds : 0.0, stats.n_generated,
                stats.decode_seconds > 0 && stats.n_generated > 1 ? (stats.n_generated - 1) / stats.decode_seconds
                                                                  : 0.0);
    kn_detok_stream_free(st.ds);
    free(ids);
    if (reply) *reply = st.reply;
    else free(st.reply);
    return rc;
}

static kn_code chat_turn(kn_model *m, const kn_tokenizer *tok, const kn_chat_template *tmpl, json_t *messages,
                         const kn_sampling *s, kn_error *err) {
    char *text = NULL, *reply = NULL;
    size_t len = 0;
    kn_code rc = kn_chat_template_render(tmpl, messages, NULL, 1, NULL, &text, &len, err);
    if (rc) return rc;
    /* the template writes BOS and the other specials itself */
    rc = generate_text(m, tok, text, 0, s, &reply, err);
    free(text);
    if (!rc) json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "assistant", "content", reply ? reply : ""));
    free(reply);
    return rc;
}

int kn_run_text(kn_model *m, const char *dir, const char *prompt, int chat, const kn_sampling *s) {
    kn_error err = {0};
    kn_tokenizer *tok = NULL;
    kn_chat_template *tmpl = NULL;
    kn_code rc = kn_tokenizer_load(dir, &tok, &err);
    if (!rc && chat) rc = kn_chat_template_load(dir, NULL, &tmpl, &err);
    if (!rc && !chat) rc = generate_text(m, tok, prompt, 1, s, NULL, &err);
    if (!rc && chat) {
        json_t *messages = json_array();
        if (prompt) { /* one turn */
            json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
            rc = chat_turn(m, tok, tmpl, messages, s, &err);
        } else { /* interactive: a user line per turn until EOF */
            char line[16384];
            fprintf(stderr, "kiln: chat; one message per line, end with Ctrl-D\n> ");
            while (!rc && fgets(line, sizeof line, stdin)) {
                line[strcspn(line, "\n")] = 0;
                if (!line[0]) {
                    fprintf(stderr, "> ");
                    continue;
                }
                json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", line);
                if (!msg) { /* invalid UTF-8 from the terminal */
                    fprintf(stderr, "kiln: the message is not valid UTF-8\n> ");
                    continue;
                }
                json_array_append_new(messages, msg);
                rc = chat_turn(m, tok, tmpl, messages, s, &err);
                if (!rc) fprintf(stderr, "> ");
            }
        }
        json_decref(messages);
    }
    kn_chat_template_free(tmpl);
    kn_tokenizer_free(tok);
    return rc ? kn_cli_error(&err) : 0;
}

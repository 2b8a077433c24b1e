/* fuzz_server_request.c — libFuzzer target for the server's request mapping:
 * untrusted JSON bodies through the /v1/completions, /v1/chat/completions
 * and /v1/messages handlers (validation, template rendering, tokenization,
 * generation on a tiny model, response building, and streams drained to
 * the end). The first input byte picks the endpoint; the rest is the body.
 * Any crash, leak or sanitizer report is a finding; 4xx answers are fine.
 * The model comes from $KILN_FUZZ_MODEL (default tests/fixtures/llama; a
 * directory with tokenizer.json + chat template exercises the text paths). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/model.h"
#include "server/server_internal.h"

static kn_srv srv;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("KILN_FUZZ_MODEL");
    if (!dir) dir = "tests/fixtures/llama";
    kn_error err = {0};
    kn_model_options mo = {.max_seqs = 2, .n_threads = 1, .max_context = 512};
    if (kn_model_open(dir, &mo, &srv.model, &err)) {
        fprintf(stderr, "fuzz_server_request: %s\n", err.msg);
        exit(1);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0 && kn_tokenizer_load(dir, &srv.tok, &err) == KN_OK) {
        if (kn_chat_template_load(dir, NULL, &srv.tmpl, &err)) srv.tmpl = NULL;
    }
    kn_engine_options eo = {.max_batch = 2, .max_queue = 4};
    if (kn_engine_create(srv.model, &eo, &srv.engine, &err)) {
        fprintf(stderr, "fuzz_server_request: %s\n", err.msg);
        exit(1);
    }
    snprintf(srv.model_name, sizeof srv.model_name, "fuzz");
    srv.think_id = srv.end_think_id = -1;
    pthread_mutex_init(&srv.stats_mu, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 64 * 1024) return 0;
    json_t *req = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(req)) {
        json_decref(req);
        return 0;
    }
    /* keep each run short: cap generation length */
    json_t *mt = json_object_get(req, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) > 8) json_object_set_new(req, "max_tokens", json_integer(8));
    if (!mt) json_object_set_new(req, "max_tokens", json_integer(4));
    kn_api_reply rep = {.conn_fd = -1, .status = 200};
    switch (data[0] % 3) {
    case 0: kn_api_completions(&srv, req, &rep); break;
    case 1: kn_api_chat(&srv, req, &rep); break;
    default: kn_api_messages(&srv, req, &rep); break;
    }
    if (rep.stream) {
        kn_buf out = {0};
        while (rep.stream->next(rep.stream, &out, -1)) out.len = 0;
        rep.stream->free(rep.stream);
        kn_buf_free(&out);
    }
    /* every body is one JSON value (generated text may hold U+0000 from a
     * byte-fallback token: "\u0000" is valid JSON, so allow it here) */
    if (rep.body.len) {
        json_error_t je;
        json_t *check = json_loadb(rep.body.data, rep.body.len, JSON_ALLOW_NUL, &je);
        if (!check) {
            fprintf(stderr, "reply body is not JSON (%s at %d): %.*s\n", je.text, je.position, (int)rep.body.len, rep.body.data);
            abort();
        }
        json_decref(check);
    }
    kn_buf_free(&rep.body);
    json_decref(req);
    return 0;
}

/* server.h — `kiln serve`: an OpenAI- and Anthropic-compatible HTTP server
 * (libmicrohttpd) in front of the continuous-batching engine.
 *
 * Endpoints: POST /v1/completions, /v1/chat/completions, /v1/messages;
 * GET /v1/models, /health, /metrics. See docs/SERVER.md. */
#ifndef KN_SERVER_SERVER_H
#define KN_SERVER_SERVER_H

#include <stddef.h>

#include "base/status.h"

typedef struct {
    const char *model_dir;
    const char *synthetic;  /* instead of model_dir: random weights at CONFIG.json's shape (benchmarks; ids only) */
    const char *model_name; /* id reported by /v1/models; NULL = the directory's basename */
    const char *host;       /* default 127.0.0.1 */
    int port;               /* default 8080; 0 = any free port (printed) */
    int max_batch;          /* default 8 */
    int max_queue;          /* waiting requests before 429; default 64 */
    int max_context;        /* 0 = model default */
    const char *api_key;    /* NULL = no auth */
    const char *backend;    /* "cpu" | "cuda" */
    int n_threads;
    size_t max_body_bytes;  /* default 4 MiB */
    int max_connections;    /* default 256 */
    long prefix_cache_mb;   /* KV the prefix cache may keep; -1 = half the KV pool, 0 = off */
    const char *kv;         /* KV cache format (kiln.h kn_model_options.kv); NULL = the model's default */
    int kv_keep_layers;     /* as kn_model_options.kv_keep_layers */
    int kv_start;           /* as kn_model_options.kv_start (the model directory path only) */
    long kv_mb;             /* KV pool budget when max_context is 0: the context becomes
                               min(model's, budget / (max_batch x bytes per token)); 0 = a quarter of RAM */
} kn_server_options;

/* Load the model, start the engine and the HTTP daemon, serve until SIGINT /
 * SIGTERM, then stop accepting, cancel in-flight work and return. Prints
 * "kiln: listening on http://HOST:PORT" to stderr once ready. */
kn_code kn_server_run(const kn_server_options *o, kn_error *err);

#endif

/* cmd_serve.c — `kiln serve MODEL [--host H] [--port P] [--max-batch N]
 * [--max-queue N] [--ctx N] [--api-key KEY] [--max-body BYTES] [--prefix-cache-mb N] [--kv-mb N]
 * [--served-model-name NAME] [--backend cpu|cuda] [--threads N]`, or
 * `kiln serve --synthetic CONFIG.json ...` (random weights, for benchmarks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "io/hf_path.h"
#include "server/server.h"

int kn_cmd_serve(int argc, char **argv) {
    kn_cli_common common = {0};
    kn_server_options o = {.host = "127.0.0.1", .port = 8080, .max_batch = 8, .prefix_cache_mb = -1};
    const char *model = NULL;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = kn_cli_common_opt(&common, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = 0;
        kn_code rc = KN_OK;
        if (a[0] != '-') {
            if (model) return kn_cli_usage_error("serve: unexpected argument \"%s\"", a);
            model = a;
            continue;
        }
        if (!v) return kn_cli_usage_error("%s needs a value", a);
        if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) rc = kn_parse_int(a, v, 0, 65535, &n, &err), o.port = (int)n;
        else if (!strcmp(a, "--max-batch")) rc = kn_parse_int(a, v, 1, 256, &n, &err), o.max_batch = (int)n;
        else if (!strcmp(a, "--max-queue")) rc = kn_parse_int(a, v, 1, 1 << 20, &n, &err), o.max_queue = (int)n;
        else if (!strcmp(a, "--ctx")) rc = kn_parse_int(a, v, 16, 1 << 24, &n, &err), o.max_context = (int)n;
        else if (!strcmp(a, "--max-body")) rc = kn_parse_int(a, v, 1024, 1L << 30, &n, &err), o.max_body_bytes = (size_t)n;
        else if (!strcmp(a, "--api-key")) o.api_key = v;
        else if (!strcmp(a, "--kv-mb")) rc = kn_parse_int(a, v, 1, 1L << 30, &n, &err), o.kv_mb = n;
        else if (!strcmp(a, "--prefix-cache-mb")) rc = kn_parse_int(a, v, 0, 1L << 30, &n, &err), o.prefix_cache_mb = n;
        else if (!strcmp(a, "--served-model-name")) o.model_name = v;
        else if (!strcmp(a, "--synthetic")) o.synthetic = v;
        else return kn_cli_usage_error("serve: unknown option %s", a);
        if (rc) return kn_cli_error(&err);
        i++;
    }
    if (!model == !o.synthetic) return kn_cli_usage_error("serve needs a MODEL (or --synthetic CONFIG.json)");
    if (o.api_key && !o.api_key[0]) return kn_cli_usage_error("--api-key must not be empty");
    if (!o.api_key) o.api_key = getenv("KILN_API_KEY") && getenv("KILN_API_KEY")[0] ? getenv("KILN_API_KEY") : NULL;
    char dir[4096];
    if (model && kn_resolve_model_path(model, dir, sizeof dir, &err)) return kn_cli_error(&err);
    o.model_dir = model ? dir : NULL;
    o.backend = common.backend;
    o.n_threads = common.n_threads;
    o.kv = common.kv;
    o.kv_keep_layers = common.kv_keep;
    o.kv_start = common.kv_start;
    if (kn_server_run(&o, &err)) return kn_cli_error(&err);
    return 0;
}

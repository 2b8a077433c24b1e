/* cmd_run.c — `kiln run` and `kiln logits`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "io/hf_path.h"
#include "io/npy.h"
#include "kiln/kiln.h"
#include "models/whisper.h"

static int print_token(int32_t tok, void *user) {
    int *count = user;
    printf(*count ? " %d" : "%d", tok);
    fflush(stdout);
    ++*count;
    return 0;
}

static kn_code open_model_dir(const char *arg, const kn_cli_common *c, kn_model **m, char *dir, size_t dir_len,
                              kn_error *err) {
    kn_code rc = kn_resolve_model_path(arg, dir, dir_len, err);
    if (rc) return rc;
    kn_model_options o = {.backend = c->backend, .n_threads = c->n_threads, .gpu_memory = c->gpu_memory, .kv = c->kv,
                          .kv_keep_layers = c->kv_keep, .kv_start = c->kv_start};
    rc = kn_model_open(dir, &o, m, err);
    if (!rc && kn_model_notes(*m)[0]) fprintf(stderr, "kiln: note: %s\n", kn_model_notes(*m));
    return rc;
}

static kn_code open_model(const char *arg, const kn_cli_common *c, kn_model **m, kn_error *err) {
    char dir[4096];
    return open_model_dir(arg, c, m, dir, sizeof dir, err);
}

int kn_cmd_run(int argc, char **argv) {
    kn_cli_common common = {0};
    const char *model = NULL, *ids_arg = NULL, *prompt = NULL;
    int have_temp = 0, have_tk = 0, have_tp = 0, have_mp = 0, ignore_eos = 0, chat = 0;
    long n = 32, top_k = 0;
    double temp = 0, top_p = 1, min_p = 0;
    uint64_t seed = 0;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = kn_cli_common_opt(&common, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        kn_code rc = KN_OK;
        if (!strcmp(a, "--ids")) ids_arg = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) rc = kn_parse_int(a, v, 0, 1 << 24, &n, &err);
        else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) rc = kn_parse_float(a, v, 0, 100, &temp, &err), have_temp = 1;
        else if (!strcmp(a, "--top-p")) rc = kn_parse_float(a, v, 0, 1, &top_p, &err), have_tp = 1;
        else if (!strcmp(a, "--top-k")) rc = kn_parse_int(a, v, 0, 1 << 24, &top_k, &err), have_tk = 1;
        else if (!strcmp(a, "--min-p")) rc = kn_parse_float(a, v, 0, 1, &min_p, &err), have_mp = 1;
        else if (!strcmp(a, "--seed")) rc = kn_parse_u64(a, v, &seed, &err);
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1, takes = 0;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--chat")) chat = 1, takes = 0;
        else if (a[0] == '-') return kn_cli_usage_error("run: unknown option %s", a);
        else if (!model) model = a, takes = 0;
        else return kn_cli_usage_error("run: unexpected argument \"%s\"", a);
        if (takes && !v) return kn_cli_usage_error("%s needs a value", a);
        if (rc) return kn_cli_error(&err);
        i += takes;
    }
    if (!model) return kn_cli_usage_error("run: missing MODEL");
    if (ids_arg && (prompt || chat)) return kn_cli_usage_error("run: give either --ids or text (-p / --chat), not both");
    if (!ids_arg && !prompt && !chat) return kn_cli_usage_error("run: give a prompt: -p TEXT, --chat, or --ids 1,2,3");
    int32_t *ids = NULL;
    int n_ids = 0;
    if (ids_arg && kn_parse_ids(ids_arg, &ids, &n_ids, &err)) return kn_cli_error(&err);
    kn_model *m;
    char dir[4096];
    if (open_model_dir(model, &common, &m, dir, sizeof dir, &err)) {
        free(ids);
        return kn_cli_error(&err);
    }
    kn_sampling s = kn_sampling_defaults(m);
    s.max_new_tokens = (int)n;
    s.seed = seed;
    s.ignore_eos = ignore_eos;
    if (have_temp) s.temperature = (float)temp;
    if (have_tk) s.top_k = (int)top_k;
    if (have_tp) s.top_p = (float)top_p;
    if (have_mp) s.min_p = (float)min_p;
    if (!ids_arg) {
        int code = kn_run_text(m, dir, prompt, chat, &s);
        kn_model_close(m);
        return code;
    }
    int count = 0;
    kn_generate_stats st = {0};
    kn_code rc = n > 0 ? kn_generate(m, ids, n_ids, &s, print_token, &count, &st, &err) : KN_OK;
    printf("\n");
    if (!rc)
        fprintf(stderr, "kiln: %s\nkiln: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens (%.1f tok/s)\n",
                kn_model_describe(m), st.n_prompt, st.prefill_seconds,
                st.prefill_seconds > 0 ? st.n_prompt / st.prefill_seconds : 0.0, st.n_generated,
                st.decode_seconds > 0 && st.n_generated > 1 ? (st.n_generated - 1) / st.decode_seconds : 0.0);
    kn_model_close(m);
    free(ids);
    return rc ? kn_cli_error(&err) : 0;
}

/* Teacher-forced decoder logits of a Whisper model given a log-mel
 * [n_mels, 3000] (.npy). */
static kn_code whisper_logits(const char *dir, const kn_cli_common *c, const char *mel_path, const int32_t *ids,
                              int n_ids, const char *out, kn_error *err) {
    if (!kn_whisper_is_whisper_dir(dir))
        return kn_fail(err, KN_ERR_UNSUPPORTED, "--mel needs an encoder-decoder (whisper) model; %s is not one", dir);
    float *mel = NULL, *logits = NULL;
    int nd;
    int64_t shape[4];
    kn_code rc = kn_npy_read_f32(mel_path, &mel, &nd, shape, err);
    if (rc) return rc;
    kn_whisper *w = NULL;
    kn_whisper_options o = {.backend = c->backend, .n_threads = c->n_threads, .max_slots = 1};
    rc = kn_whisper_open(dir, &o, &w, err);
    if (!rc) {
        const kn_whisper_config *cfg = kn_whisper_cfg(w);
        if (nd != 2 || shape[0] != cfg->n_mels || shape[1] != 2 * cfg->max_source_positions)
            rc = kn_fail(err, KN_ERR_INVALID_ARG, "%s: expected a float32 mel [%d, %d] (kiln mel --n-mels %d)", mel_path,
                         cfg->n_mels, 2 * cfg->max_source_positions, cfg->n_mels);
    }
    if (!rc) rc = kn_whisper_encode(w, mel, err);
    if (!rc) {
        int V = kn_whisper_cfg(w)->vocab_size;
        logits = malloc((size_t)n_ids * (size_t)V * sizeof(float));
        rc = logits ? kn_whisper_decode(w, 1, n_ids, ids, 0, 1, logits, err) : kn_fail(err, KN_ERR_NOMEM, "out of memory");
        int64_t sh[2] = {n_ids, V};
        if (!rc) rc = kn_npy_write_f32(out, logits, 2, sh, err);
    }
    free(logits);
    free(mel);
    kn_whisper_close(w);
    return rc;
}

int kn_cmd_logits(int argc, char **argv) {
    kn_cli_common common = {0};
    const char *model = NULL, *ids_arg = NULL, *out = NULL, *mel = NULL;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = kn_cli_common_opt(&common, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ids") || !strcmp(a, "--out") || !strcmp(a, "--mel")) {
            if (!v) return kn_cli_usage_error("%s needs a value", a);
            if (!strcmp(a, "--mel")) mel = v;
            else if (!strcmp(a, "--ids")) ids_arg = v;
            else out = v;
            i++;
        } else if (a[0] == '-') return kn_cli_usage_error("logits: unknown option %s", a);
        else if (!model) model = a;
        else return kn_cli_usage_error("logits: unexpected argument \"%s\"", a);
    }
    if (!model) return kn_cli_usage_error("logits: missing MODEL");
    if (!ids_arg) return kn_cli_usage_error("logits: missing --ids");
    if (!out) return kn_cli_usage_error("logits: missing --out FILE.npy");
    int32_t *ids;
    int n_ids;
    if (kn_parse_ids(ids_arg, &ids, &n_ids, &err)) return kn_cli_error(&err);
    char dir[4096];
    if (kn_resolve_model_path(model, dir, sizeof dir, &err)) {
        free(ids);
        return kn_cli_error(&err);
    }
    if (mel || kn_whisper_is_whisper_dir(dir)) {
        kn_code rc = mel ? whisper_logits(dir, &common, mel, ids, n_ids, out, &err)
                         : kn_fail(&err, KN_ERR_INVALID_ARG, "%s is an encoder-decoder (whisper) model: give --mel FILE.npy", model);
        free(ids);
        return rc ? kn_cli_error(&err) : 0;
    }
    kn_model *m;
    if (open_model(model, &common, &m, &err)) {
        free(ids);
        return kn_cli_error(&err);
    }
    int V = kn_model_vocab_size(m);
    float *logits = malloc((size_t)n_ids * (size_t)V * sizeof(float));
    kn_code rc = logits ? kn_model_logits(m, ids, n_ids, logits, &err) : kn_fail(&err, KN_ERR_NOMEM, "out of memory");
    if (!rc) {
        int64_t shape[2] = {n_ids, V};
        rc = kn_npy_write_f32(out, logits, 2, shape, &err);
    }
    free(logits);
    free(ids);
    kn_model_close(m);
    return rc ? kn_cli_error(&err) : 0;
}

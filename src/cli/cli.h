/* cli.h — subcommands of the `kiln` binary. Each returns the process exit
 * code; errors are printed as one line on stderr by kn_cli_error. */
#ifndef KN_CLI_H
#define KN_CLI_H

#include "base/status.h"

int kn_cmd_run(int argc, char **argv);
int kn_cmd_logits(int argc, char **argv);
int kn_cmd_bench(int argc, char **argv);
int kn_cmd_mel(int argc, char **argv);
int kn_cmd_transcribe(int argc, char **argv);
int kn_cmd_tokenize(int argc, char **argv);
int kn_cmd_detokenize(int argc, char **argv);
int kn_cmd_template(int argc, char **argv);
int kn_cmd_quantize(int argc, char **argv);

/* `kiln run` with text (-p PROMPT / --chat) on an opened model; exit code. */
int kn_run_text(kn_model *m, const char *dir, const char *prompt, int chat, const kn_sampling *s);
int kn_cmd_serve(int argc, char **argv);

/* Print "kiln: <message>" and return 1. */
int kn_cli_error(const kn_error *err);
int kn_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Common model options shared by run/logits/bench. */
typedef struct {
    const char *backend;
    int n_threads;
    const char *kv;    /* --kv FORMAT (validated); NULL = the model's default */
    int kv_keep;       /* --kv-keep-layers N: 0 = the format's default, < 0 = none */
    int kv_start;      /* --kv-start N: delayed conversion; 0 = off */
    double gpu_memory; /* --gpu-memory fraction; 0 = the library default */
} kn_cli_common;

/* Try to consume a common option at argv[*i]; 1 = consumed, 0 = not ours, -1 = error printed. */
int kn_cli_common_opt(kn_cli_common *c, int argc, char **argv, int *i);

#endif

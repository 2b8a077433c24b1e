/* main.c — the `kiln` command: dispatch to subcommands (thin; the work is in
 * libkiln). See DESIGN.md "CLI contract". */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "kv/kv_paged.h"

static const char usage[] =
    "usage: kiln <command> [options]\n"
    "\n"
    "commands:\n"
    "  run MODEL -p TEXT | --chat [-p TEXT] | --ids 1,2,3 [-n N] [--temp T] [--top-p P] [--top-k K] [--min-p P] [--seed S] [--ignore-eos]\n"
    "        generate; with --ids the generated ids are printed to stdout, space-separated\n"
    "  logits MODEL --ids 1,2,3 [--mel FILE.npy] --out FILE.npy   teacher-forced float32 logits [n_ids, vocab]\n"
    "  mel AUDIO [--n-mels 80|128] [--backend cpu|cuda] --out FILE.npy   Whisper log-mel of the first 30 s, float32 [n_mels, 3000]\n"
    "        (cpu: kissfft on the host, the default; cuda: cuFFT on the GPU)\n"
    "  transcribe AUDIO --model WHISPER [--language L] [--task transcribe|translate] [--beam-size N] [--prompt TEXT]\n"
    "        [--format text|json|verbose_json|srt|vtt|tokens] [--no-timestamps] [--word-timestamps] [--temperature T] [--no-fallback]\n"
    "  bench MODEL|--synthetic CONFIG.json [--prompt N] [--gen N] [--batch B] [--reps R] [--floor-every N] [--dtype bf16|f16|f32] [--bits 4|8 [--group-size 64]] [--host-logits] [--json]\n"
    "  tokenize MODEL TEXT [--special] [--json]   ids of TEXT (\"-\": stdin); --special adds BOS/EOS etc.\n"
    "  detokenize MODEL IDS... [--skip-special]   text of the ids\n"
    "  quantize IN_DIR OUT_DIR [--bits 2|3|4|5|6|8] [--group-size 32|64|128] [--mixed mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6] [--force]\n"
    "        MLX affine-quantized copy (--mixed: mlx-lm's mixed-precision recipes)\n"
    "  template MODEL --messages F.json [--tools F.json] [--no-generation-prompt] [--kwargs JSON] [--variant NAME]\n"
    "        render the model's chat template (as transformers' apply_chat_template) to stdout\n"
    "  serve MODEL [--host 127.0.0.1] [--port 8080] [--max-batch 8] [--api-key KEY] [--ctx N]\n"
    "        OpenAI/Anthropic-compatible HTTP server (see docs/SERVER.md)\n"
    "\n"
    "common options: --backend cpu|cuda  --threads N  --gpu-memory FRACTION (of GPU memory; default 0.9)\n"
    "  --kv FORMAT   KV cache: bf16 f32 fp8 q8 q8s q4 q4g64 tq3 tq4 k8v3 k4v3, or K:V (e.g. q8a:tqv3);\n"
    "                default: the model's compute dtype (f32 weights: f32, else bf16)\n"
    "  --kv-keep-layers N   first/last N layers stay bf16 (default 2 for formats under 4 bits; 0 = none)\n"
    "  --kv-start N  delayed conversion: a sequence's cache stays bf16 until it holds N tokens (cpu backend)\n"
    "MODEL is a directory in Hugging Face layout or a repo id present in the HF cache.\n";

int kn_cli_error(const kn_error *err) {
    fprintf(stderr, "kiln: %s\n", err->msg[0] ? err->msg : kn_code_name(err->code));
    return 1;
}

int kn_cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see kiln --help)\n", stderr);
    va_end(ap);
    return 2;
}

int kn_cli_common_opt(kn_cli_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    kn_error err = {0};
    if (!strcmp(a, "--backend") || !strcmp(a, "--threads") || !strcmp(a, "--kv") || !strcmp(a, "--gpu-memory") ||
        !strcmp(a, "--kv-keep-layers") || !strcmp(a, "--kv-start")) {
        if (*i + 1 >= argc) {
            kn_cli_usage_error("%s needs a value", a);
            return -1;
        }
        const char *v = argv[++*i];
        if (!strcmp(a, "--backend")) c->backend = v;
        else if (!strcmp(a, "--gpu-memory")) {
            if (kn_parse_float(a, v, 0.05, 1.0, &c->gpu_memory, &err)) {
                kn_cli_error(&err);
                return -1;
            }
        } else if (!strcmp(a, "--kv")) {
            kn_kv_spec spec;
            if (kn_kv_spec_parse(v, -1, &spec, &err)) {
                kn_cli_usage_error("%s", err.msg);
                return -1;
            }
            c->kv = v;
        } else if (!strcmp(a, "--kv-start")) {
            long n;
            if (kn_parse_int(a, v, 0, 1L << 24, &n, &err)) {
                kn_cli_error(&err);
                return -1;
            }
            c->kv_start = (int)n;
        } else if (!strcmp(a, "--kv-keep-layers")) {
            long n;
            if (kn_parse_int(a, v, 0, 4096, &n, &err)) {
                kn_cli_error(&err);
                return -1;
            }
            c->kv_keep = n > 0 ? (int)n : -1;
        } else {
            long t;
            if (kn_parse_int("--threads", v, 0, 4096, &t, &err)) {
                kn_cli_error(&err);
                return -1;
            }
            c->n_threads = (int)t;
        }
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return kn_cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "logits")) return kn_cmd_logits(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return kn_cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return kn_cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "detokenize")) return kn_cmd_detokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "template")) return kn_cmd_template(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return kn_cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "mel")) return kn_cmd_mel(argc - 2, argv + 2);
    if (!strcmp(cmd, "transcribe")) return kn_cmd_transcribe(argc - 2, argv + 2);
    if (!strcmp(cmd, "quantize")) return kn_cmd_quantize(argc - 2, argv + 2);
    static const char *const later[] = {"pull", "ls", "fit"};
    for (size_t i = 0; i < sizeof later / sizeof *later; i++)
        if (!strcmp(cmd, later[i])) {
            fprintf(stderr, "kiln: command \"%s\" is not available in this build yet (available: run, logits, bench, serve, tokenize, detokenize, template, mel, transcribe, quantize)\n", cmd);
            return 2;
        }
    return kn_cli_usage_error("unknown command \"%s\"", cmd);
}

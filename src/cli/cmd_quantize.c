/* cmd_quantize.c — `kiln quantize IN_DIR OUT_DIR --bits 2|4|8
 * --group-size 32|64|128 [--force]`: write an MLX affine-quantized copy of a
 * bf16/f16/f32 checkpoint (io/quantize.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "io/quantize.h"

int kn_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    kn_quantize_opts o = {.bits = 4, .group_size = 64};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--bits") || !strcmp(a, "--group-size")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v <= 0 || v > 1024) return kn_cli_usage_error("quantize: %s needs a number, got \"%s\"", a, argv[i]);
            if (a[2] == 'b') o.bits = (int)v;
            else o.group_size = (int)v;
        } else if (!strcmp(a, "--force")) o.force = 1;
        else if (a[0] == '-' && a[1]) return kn_cli_usage_error("quantize: unknown or incomplete option %s", a);
        else if (!in) in = a;
        else if (!out) out = a;
        else return kn_cli_usage_error("quantize: unexpected argument \"%s\"", a);
    }
    if (!in || !out)
        return kn_cli_usage_error("usage: kiln quantize IN_DIR OUT_DIR [--bits 2|4|8] [--group-size 32|64|128] [--force]");
    kn_error err = {0};
    kn_quantize_stats s;
    if (kn_quantize_checkpoint(in, out, &o, &s, &err)) return kn_cli_error(&err);
    printf("quantized %d tensors to %d-bit g%d, kept %d; %.1f MiB -> %.1f MiB in %s\n", s.n_quantized, o.bits,
           o.group_size, s.n_kept, s.bytes_in / 1048576.0, s.bytes_out / 1048576.0, out);
    return 0;
}

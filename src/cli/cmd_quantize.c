/* cmd_quantize.c — `kiln quantize IN_DIR OUT_DIR [--bits 2|3|4|5|6|8]
 * [--group-size 32|64|128] [--mixed RECIPE] [--force]`: write an MLX
 * affine-quantized copy of a bf16/f16/f32 checkpoint (io/quantize.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "io/quantize.h"

int kn_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    kn_quantize_opts o = {.bits = 4, .group_size = 64};
    int bits_given = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--bits") || !strcmp(a, "--group-size")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v <= 0 || v > 1024) return kn_cli_usage_error("quantize: %s needs a number, got \"%s\"", a, argv[i]);
            if (a[2] == 'b') o.bits = (int)v, bits_given = 1;
            else o.group_size = (int)v;
        } else if (!strcmp(a, "--mixed") && i + 1 < argc) o.mixed = argv[++i];
        else if (!strcmp(a, "--force")) o.force = 1;
        else if (a[0] == '-' && a[1]) return kn_cli_usage_error("quantize: unknown or incomplete option %s", a);
        else if (!in) in = a;
        else if (!out) out = a;
        else return kn_cli_usage_error("quantize: unexpected argument \"%s\"", a);
    }
    if (!in || !out)
        return kn_cli_usage_error("usage: kiln quantize IN_DIR OUT_DIR [--bits 2|3|4|5|6|8] [--group-size 32|64|128] "
                                  "[--mixed mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6] [--force]");
    if (o.mixed && bits_given)
        return kn_cli_usage_error("quantize: --mixed %s sets the bits itself; leave out --bits", o.mixed);
    kn_error err = {0};
    kn_quantize_stats s;
    if (kn_quantize_checkpoint(in, out, &o, &s, &err)) return kn_cli_error(&err);
    if (o.mixed)
        printf("quantized %d tensors (%s: %d at %d-bit, %d at %d-bit) g%d, kept %d; %.1f MiB -> %.1f MiB in %s\n",
               s.n_quantized, o.mixed, s.n_quantized - s.n_high, s.low_bits, s.n_high, s.high_bits, o.group_size,
               s.n_kept, s.bytes_in / 1048576.0, s.bytes_out / 1048576.0, out);
    else
        printf("quantized %d tensors to %d-bit g%d, kept %d; %.1f MiB -> %.1f MiB in %s\n", s.n_quantized, o.bits,
               o.group_size, s.n_kept, s.bytes_in / 1048576.0, s.bytes_out / 1048576.0, out);
    return 0;
}

/* cmd_audio.c — `kiln mel` (dump Whisper's log-mel front end of an audio
 * file as .npy, for checking against transformers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "audio/mel.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "io/npy.h"

int kn_cmd_mel(int argc, char **argv) {
    const char *audio = NULL, *out = NULL;
    long n_mels = 80, n_threads = 0;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        kn_code rc = KN_OK;
        if (!strcmp(a, "--n-mels") || !strcmp(a, "--out") || !strcmp(a, "--threads")) {
            if (!v) return kn_cli_usage_error("%s needs a value", a);
            if (!strcmp(a, "--out")) out = v;
            else if (!strcmp(a, "--threads")) rc = kn_parse_int(a, v, 0, 4096, &n_threads, &err);
            else {
                rc = kn_parse_int(a, v, 1, 512, &n_mels, &err);
                if (!rc && n_mels != 80 && n_mels != 128)
                    return kn_cli_usage_error("--n-mels %ld: Whisper uses 80 or 128", n_mels);
            }
            if (rc) return kn_cli_error(&err);
            i++;
        } else if (a[0] == '-') return kn_cli_usage_error("mel: unknown option %s", a);
        else if (!audio) audio = a;
        else return kn_cli_usage_error("mel: unexpected argument \"%s\"", a);
    }
    if (!audio) return kn_cli_usage_error("mel: missing AUDIO");
    if (!out) return kn_cli_usage_error("mel: missing --out FILE.npy");
    float *pcm = NULL, *mel = NULL;
    int64_t n = 0;
    kn_mel *m = NULL;
    kn_code rc = kn_audio_load_file(audio, 0, &pcm, &n, &err);
    if (!rc) rc = kn_mel_create((int)n_mels, (int)n_threads, &m, &err);
    if (!rc) {
        mel = malloc(sizeof(float) * (size_t)n_mels * KN_MEL_WINDOW_FRAMES);
        rc = mel ? kn_mel_compute(m, pcm, n, KN_MEL_WINDOW_FRAMES, mel, &err)
                 : kn_fail(&err, KN_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        int64_t shape[2] = {n_mels, KN_MEL_WINDOW_FRAMES};
        rc = kn_npy_write_f32(out, mel, 2, shape, &err);
    }
    if (!rc && n > KN_MEL_WINDOW_SAMPLES)
        fprintf(stderr, "kiln: note: %s is %.1f s long; the mel holds its first 30 s\n", audio,
                (double)n / KN_AUDIO_RATE);
    free(mel);
    free(pcm);
    kn_mel_free(m);
    return rc ? kn_cli_error(&err) : 0;
}

/* cmd_audio.c — `kiln mel` (dump Whisper's log-mel front end of an audio
 * file as .npy, for checking against transformers) and `kiln transcribe`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "audio/mel.h"
#include "audio/mel_backend.h"
#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/transcribe.h"
#include "io/hf_path.h"
#include "io/npy.h"
#include "models/whisper.h"

/* --backend cpu (default) computes the mel with kissfft on the host; cuda
 * with cuFFT on the GPU (the backend's log_mel op). */
int kn_cmd_mel(int argc, char **argv) {
    const char *audio = NULL, *out = NULL, *backend = "cpu";
    long n_mels = 80, n_threads = 0;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        kn_code rc = KN_OK;
        if (!strcmp(a, "--n-mels") || !strcmp(a, "--out") || !strcmp(a, "--threads") || !strcmp(a, "--backend")) {
            if (!v) return kn_cli_usage_error("%s needs a value", a);
            if (!strcmp(a, "--out")) out = v;
            else if (!strcmp(a, "--backend")) backend = v;
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
    kn_backend *be = NULL; /* NULL: the host mel (kn_mel_compute) */
    kn_code rc = KN_OK;
    if (strcmp(backend, "cpu")) rc = kn_backend_create(backend, (int)n_threads, &be, &err);
    if (!rc) rc = kn_audio_load_file(audio, 0, &pcm, &n, &err);
    if (!rc) rc = kn_mel_create((int)n_mels, (int)n_threads, &m, &err);
    if (!rc) {
        mel = malloc(sizeof(float) * (size_t)n_mels * KN_MEL_WINDOW_FRAMES);
        rc = mel ? kn_mel_compute_on(m, be, pcm, n, KN_MEL_WINDOW_FRAMES, mel, &err)
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
    kn_backend_destroy(be);
    return rc ? kn_cli_error(&err) : 0;
}

/* ---- kiln transcribe ------------------------------------------------------- */

#include "tokenizer/tokenizer.h"
static kn_code detok_text(void *user, const int32_t *ids, int n, char **text, kn_error *err) {
    size_t len;
    return kn_tokenizer_decode(user, ids, n, 1, text, &len, err);
}

int kn_cmd_transcribe(int argc, char **argv) {
    const char *audio = NULL, *model = NULL, *format = "text", *backend = NULL, *task = "transcribe";
    const char *prompt_text = NULL;
    long n_threads = 0, beam = 1, max_new = 0;
    double temperature = -1;
    int no_fallback = 0, no_timestamps = 0;
    kn_decode_options o;
    kn_decode_options_default(&o);
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        kn_code rc = KN_OK;
        int takes = 1;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--language")) o.language = v;
        else if (!strcmp(a, "--task")) task = v;
        else if (!strcmp(a, "--prompt") || !strcmp(a, "--initial-prompt")) prompt_text = v;
        else if (!strcmp(a, "--format") || !strcmp(a, "--response-format")) format = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--threads")) rc = kn_parse_int(a, v, 0, 4096, &n_threads, &err);
        else if (!strcmp(a, "--beam-size")) rc = kn_parse_int(a, v, 1, 16, &beam, &err);
        else if (!strcmp(a, "--max-new-tokens")) rc = kn_parse_int(a, v, 1, 4096, &max_new, &err);
        else if (!strcmp(a, "--temperature")) rc = kn_parse_float(a, v, 0, 1, &temperature, &err);
        else if (!strcmp(a, "--no-fallback")) no_fallback = 1, takes = 0;
        else if (!strcmp(a, "--no-timestamps")) no_timestamps = 1, takes = 0;
        else if (!strcmp(a, "--word-timestamps")) o.word_timestamps = 1, takes = 0;
        else if (a[0] == '-') return kn_cli_usage_error("transcribe: unknown option %s", a);
        else if (!audio) audio = a, takes = 0;
        else return kn_cli_usage_error("transcribe: unexpected argument \"%s\"", a);
        if (takes && !v) return kn_cli_usage_error("%s needs a value", a);
        if (rc) return kn_cli_error(&err);
        i += takes;
    }
    if (!audio) return kn_cli_usage_error("transcribe: missing AUDIO");
    if (!model) return kn_cli_usage_error("transcribe: missing --model WHISPER");
    if (strcmp(task, "transcribe") && strcmp(task, "translate"))
        return kn_cli_usage_error("--task %s: use transcribe or translate", task);
    static const char *const formats[] = {"text", "json", "verbose_json", "srt", "vtt", "tokens"};
    int known = 0;
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) known |= !strcmp(format, formats[i]);
    if (!known) return kn_cli_usage_error("--format %s: use text, json, verbose_json, srt, vtt or tokens", format);
    if (o.word_timestamps && !strcmp(format, "tokens"))
        return kn_cli_usage_error("--word-timestamps needs a text format (verbose_json lists the words)");
    o.task = !strcmp(task, "translate") ? KN_TASK_TRANSLATE : KN_TASK_TRANSCRIBE;
    o.beam_size = (int)beam;
    o.max_new_tokens = (int)max_new;
    o.timestamps = !no_timestamps;
    if (temperature >= 0) o.n_temperatures = 1, o.temperatures[0] = (float)temperature;
    if (no_fallback) o.n_temperatures = 1;

    char dir[4096];
    if (kn_resolve_model_path(model, dir, sizeof dir, &err)) return kn_cli_error(&err);
    float *pcm = NULL;
    int64_t n = 0;
    kn_whisper *w = NULL;
    kn_transcript t = {0};
    char *text = NULL;
    kn_tokenizer *tok = NULL;
    kn_code rc = kn_audio_load_file(audio, 0, &pcm, &n, &err);
    kn_whisper_options wo = {.backend = backend, .n_threads = (int)n_threads, .max_slots = (int)beam};
    if (!rc && !kn_whisper_is_whisper_dir(dir))
        rc = kn_fail(&err, KN_ERR_UNSUPPORTED, "%s is not a whisper model (config.json model_type)", model);
    if (!rc) rc = kn_whisper_open(dir, &wo, &w, &err);
    if (!rc && (strcmp(format, "tokens") || prompt_text)) rc = kn_tokenizer_load(dir, &tok, &err);
    if (!rc && strcmp(format, "tokens")) {
        o.detok = detok_text;
        o.detok_user = tok;
    }
    int32_t *prompt_ids = NULL;
    if (!rc && prompt_text) {
        /* as openai-whisper: " " + the prompt, without special tokens */
        size_t pl = strlen(prompt_text);
        char *spaced = malloc(pl + 2);
        int n_prompt = 0;
        if (!spaced) rc = kn_fail(&err, KN_ERR_NOMEM, "out of memory");
        else {
            spaced[0] = ' ';
            memcpy(spaced + 1, prompt_text, pl + 1);
            rc = kn_tokenizer_encode(tok, spaced, pl + 1, 0, &prompt_ids, &n_prompt, &err);
            free(spaced);
        }
        o.initial_prompt = prompt_ids;
        o.n_initial_prompt = n_prompt;
    }
    if (!rc) rc = kn_transcribe(w, pcm, n, &o, &t, &err);
    if (!rc && !strcmp(format, "tokens")) {
        /* one line per segment: start end ids... */
        for (int s = 0; s < t.n_segments; s++) {
            printf("%.2f %.2f", t.segments[s].start, t.segments[s].end);
            for (int k = 0; k < t.segments[s].n_tokens; k++) printf(" %d", t.segments[s].tokens[k]);
            printf("\n");
        }
    } else if (!rc) {
        rc = kn_transcript_format(&t, format, task, &text, &err);
        if (!rc) fputs(text, stdout);
    }
    if (!rc)
        fprintf(stderr, "kiln: %s: %.1f s of audio, %d window(s), %d tokens; mel %.3f s, decode %.3f s (%s)\n", audio,
                t.duration, t.n_windows, t.n_decoded_tokens, t.mel_seconds, t.decode_seconds, kn_whisper_describe(w));
    kn_tokenizer_free(tok);
    free(prompt_ids);
    free(text);
    kn_transcript_free(&t);
    kn_whisper_close(w);
    free(pcm);
    return rc ? kn_cli_error(&err) : 0;
}

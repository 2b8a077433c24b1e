/* whisper_bench.c — Whisper timings: log-mel per 30 s window, encoder per
 * window, decoder per token (one sequence, greedy-style single-token steps
 * after a 4-token prompt), on a checkpoint directory or on a random model of
 * a published shape written to a temporary directory.
 *
 *   whisper_bench MODEL_DIR|--synthetic tiny|base|small|turbo|fixture [--backend cpu|cuda]
 *                 [--threads N] [--tokens N] [--windows N]
 *
 * Prints one JSON line. Shapes: tiny (d 384, 4+4 layers), base (512, 6+6),
 * small (768, 12+12), turbo (large-v3-turbo: 1280, 32 enc + 4 dec, 128
 * mels), fixture (the test fixture's 64-wide 2+2). Synthetic weights are f32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "audio/audio.h"
#include "audio/mel.h"
#include "audio/mel_backend.h"
#include "models/whisper.h"
#include "whisper_synth.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* CPU time of the process (all threads): on a shared machine, wall time
 * includes waiting for other tenants; with --threads 1 this is the time a
 * dedicated core would take. */
static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *model = NULL, *synthetic = NULL, *backend = "cpu";
    int threads = 0, tokens = 64, windows = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--synthetic") && i + 1 < argc) synthetic = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--windows") && i + 1 < argc) windows = atoi(argv[++i]);
        else if (argv[i][0] != '-') model = argv[i];
        else {
            fprintf(stderr, "whisper_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (tokens < 1 || tokens > 400 || windows < 1) {
        fprintf(stderr, "whisper_bench: --tokens 1..400, --windows >= 1\n");
        return 2;
    }
    char tmp[] = "/tmp/kiln_whisper_bench_XXXXXX";
    if (synthetic) {
        synth_whisper_shape sh = {.n_mels = 80, .n_ctx = 1500, .max_target = 448, .n_text = 51865 - 1512};
        if (!strcmp(synthetic, "tiny")) sh.d = 384, sh.heads = 6, sh.enc_layers = sh.dec_layers = 4;
        else if (!strcmp(synthetic, "base")) sh.d = 512, sh.heads = 8, sh.enc_layers = sh.dec_layers = 6;
        else if (!strcmp(synthetic, "small")) sh.d = 768, sh.heads = 12, sh.enc_layers = sh.dec_layers = 12;
        else if (!strcmp(synthetic, "turbo"))
            sh.d = 1280, sh.heads = 20, sh.enc_layers = 32, sh.dec_layers = 4, sh.n_mels = 128, sh.n_text = 51866 - 1512;
        else if (!strcmp(synthetic, "fixture")) sh.d = 64, sh.heads = 4, sh.enc_layers = sh.dec_layers = 2, sh.n_text = 500;
        else {
            fprintf(stderr, "whisper_bench: unknown shape %s\n", synthetic);
            return 2;
        }
        sh.ffn = synthetic[0] == 'f' ? 128 : 4 * sh.d;
        if (!mkdtemp(tmp) || synth_whisper_write(tmp, &sh, 1)) {
            fprintf(stderr, "whisper_bench: cannot write the synthetic model\n");
            return 1;
        }
        model = tmp;
    }
    if (!model) {
        fprintf(stderr, "usage: whisper_bench MODEL_DIR|--synthetic SHAPE [--backend B] [--threads N]\n");
        return 2;
    }
    kn_error err = {0};
    kn_whisper *w = NULL;
    kn_whisper_options o = {.backend = backend, .n_threads = threads, .max_slots = 1};
    int rc = kn_whisper_open(model, &o, &w, &err) != KN_OK;
    if (rc) fprintf(stderr, "whisper_bench: %s\n", err.msg);
    if (!rc) {
        const kn_whisper_config *c = kn_whisper_cfg(w);
        /* mel of 30 s of a synthetic signal */
        float *pcm = malloc(sizeof(float) * KN_MEL_WINDOW_SAMPLES);
        float *mel = malloc(sizeof(float) * (size_t)c->n_mels * KN_MEL_WINDOW_FRAMES);
        float *logits = malloc(sizeof(float) * (size_t)c->vocab_size * 4);
        uint64_t s = 1;
        for (int i = 0; i < KN_MEL_WINDOW_SAMPLES; i++) pcm[i] = 0.1f * kn_test_rand(&s);
        kn_mel *m = NULL;
        kn_mel_create(c->n_mels, threads, &m, &err);
        /* on the model's backend, as kn_transcribe (cuda: cuFFT, with the
         * upload of the audio and the download of the mel) */
        kn_backend *mbe = kn_whisper_backend(w);
        if (kn_mel_compute_on(m, mbe, pcm, KN_MEL_WINDOW_SAMPLES, KN_MEL_WINDOW_FRAMES, mel, &err)) /* warm-up */
            fprintf(stderr, "whisper_bench: mel: %s\n", err.msg);
        double t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < windows; i++)
            kn_mel_compute_on(m, mbe, pcm, KN_MEL_WINDOW_SAMPLES, KN_MEL_WINDOW_FRAMES, mel, &err);
        double t_mel = (now_s() - t0) / windows, c_mel = (cpu_s() - c0) / windows;
        kn_whisper_encode(w, mel, &err); /* warm-up */
        t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < windows; i++) kn_whisper_encode(w, mel, &err);
        double t_enc = (now_s() - t0) / windows, c_enc = (cpu_s() - c0) / windows;
        int32_t prompt[4] = {c->decoder_start_token_id, 0, 1, 2};
        kn_whisper_decode(w, 1, 4, prompt, 0, 0, logits, &err);
        t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < tokens && !rc; i++) {
            int32_t t = (int32_t)((i * 7919) % (c->eos_token_id > 0 ? c->eos_token_id : 100));
            rc = kn_whisper_decode(w, 1, 1, &t, 4 + i, 0, logits, &err) != KN_OK;
        }
        double t_dec = (now_s() - t0) / tokens, c_dec = (cpu_s() - c0) / tokens;
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"mel_ms_per_window\": %.2f, "
               "\"encoder_ms_per_window\": %.1f, \"decoder_ms_per_token\": %.2f, \"cpu_mel_ms\": %.2f, "
               "\"cpu_encoder_ms\": %.1f, \"cpu_decoder_ms_per_token\": %.2f, \"desc\": \"%s\"}\n",
               synthetic ? synthetic : model, backend, threads, t_mel * 1e3, t_enc * 1e3, t_dec * 1e3, c_mel * 1e3,
               c_enc * 1e3, c_dec * 1e3, kn_whisper_describe(w));
        free(pcm), free(mel), free(logits);
        kn_mel_free(m);
    }
    kn_whisper_close(w);
    if (synthetic) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd)) fprintf(stderr, "whisper_bench: cleanup of %s failed\n", tmp);
    }
    return rc;
}

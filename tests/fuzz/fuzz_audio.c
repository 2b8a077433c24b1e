/* fuzz_audio.c — libFuzzer target for the audio decoder path (untrusted
 * uploads): libsndfile over arbitrary bytes through kn_audio_load_memory,
 * then the log-mel front end over what decoded (bounded: 30 s of audio). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "audio/audio.h"
#include "audio/mel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    float *pcm;
    int64_t n;
    kn_error err;
    if (kn_audio_load_memory(data, size, 30.0, &pcm, &n, &err) != KN_OK) return 0;
    kn_mel *m;
    if (kn_mel_create(80, 1, &m, &err) == KN_OK) {
        float *mel = malloc(sizeof(float) * 80 * 64);
        if (mel) kn_mel_compute(m, pcm, n, 64, mel, &err);
        free(mel);
        kn_mel_free(m);
    }
    free(pcm);
    return 0;
}

/* mel.h — Whisper's log-mel spectrogram, numerically the same as transformers'
 * WhisperFeatureExtractor (and openai-whisper's log_mel_spectrogram):
 *
 *   STFT: n_fft 400, hop 160, periodic Hann window, centered frames with
 *         reflect padding of 200 samples at both ends (torch.stft center=True);
 *   power |X|^2 of the 201 bins; the last STFT frame is dropped;
 *   mel:  Slaney-scale, Slaney-normalized triangular filters, 0..8000 Hz;
 *   log10(max(mel, 1e-10)), clamped from below at (global max - 8),
 *   then (x + 4) / 4.
 *
 * The FFT is kissfft's real FFT (BSD-3, Debian libkissfft). A kn_mel holds the
 * window, the filter bank and one FFT plan per thread; it is immutable after
 * creation except for those per-thread scratch plans, so one kn_mel must not
 * be used by two calls at once. */
#ifndef KN_AUDIO_MEL_H
#define KN_AUDIO_MEL_H

#include <stdint.h>

#include "base/status.h"

#define KN_MEL_N_FFT 400
#define KN_MEL_HOP 160
#define KN_MEL_N_BINS (KN_MEL_N_FFT / 2 + 1)
#define KN_MEL_WINDOW_FRAMES 3000 /* 30 s at 16 kHz */
#define KN_MEL_WINDOW_SAMPLES (KN_MEL_WINDOW_FRAMES * KN_MEL_HOP)

typedef struct kn_mel kn_mel;

/* n_mels: 80 or 128 (any 1..512 works; those are Whisper's). n_threads 0 =
 * OpenMP default. */
kn_code kn_mel_create(int n_mels, int n_threads, kn_mel **out, kn_error *err);
void kn_mel_free(kn_mel *m);
int kn_mel_n_mels(const kn_mel *m);

/* The filter bank, [n_mels, 201] row-major (for tests). */
const float *kn_mel_filters(const kn_mel *m);

/* Log-mel of pcm (16 kHz mono) treated as a signal of exactly
 * n_frames * 160 samples: zero-padded or truncated to that length. out is
 * [n_mels, n_frames] row-major; the max-8 clamp uses the max over all
 * n_frames. n_frames 3000 gives WhisperFeatureExtractor's 30 s features;
 * n_samples/160 + 3000 gives openai-whisper's long-form spectrogram (audio
 * followed by 30 s of zeros). n_frames must be >= 2. */
kn_code kn_mel_compute(kn_mel *m, const float *pcm, int64_t n_samples, int64_t n_frames, float *out,
                       kn_error *err);

#endif

/* mel_backend.h — Whisper's log-mel on a compute backend: host PCM in, host
 * mel out, computed by the backend's log_mel op (backend.h; the CUDA backend's
 * is cuFFT) where it has one, else by kn_mel_compute on the host (the CPU
 * backend leaves log_mel NULL: audio/mel.c is its implementation).
 *
 * Kept apart from mel.c so that mel.c stays free of backend code (the
 * fuzz_audio target links it alone). */
#ifndef KN_AUDIO_MEL_BACKEND_H
#define KN_AUDIO_MEL_BACKEND_H

#include <stdint.h>

#include "audio/mel.h"
#include "base/status.h"

typedef struct kn_backend kn_backend;

/* kn_mel_compute (same arguments, same numbers within float rounding of the
 * FFT) through be's log_mel op: uploads pcm and m's filter bank, runs the
 * op, downloads out [n_mels, n_frames], and frees its device buffers before
 * returning. be NULL or without log_mel: kn_mel_compute(m, ...). The
 * backend's memory holds pcm and out at once (4 bytes per sample and per
 * mel value); running out of it is a KN_ERR_NOMEM, never a silent retry on
 * the host. Not for concurrent use of one m or one be. */
kn_code kn_mel_compute_on(kn_mel *m, kn_backend *be, const float *pcm, int64_t n_samples, int64_t n_frames,
                          float *out, kn_error *err);

#endif

/* audio.h — decode an audio file (WAV, FLAC, OGG/Vorbis/Opus, MP3: whatever
 * the system libsndfile reads) to mono float PCM at 16 kHz, the input rate of
 * Whisper.
 *
 * Decoding is libsndfile, downmixing is the mean of the channels (as ffmpeg's
 * -ac 1), resampling is libsoxr (high quality). Every input is untrusted: the
 * header's frame count is never trusted (frames are read until end of data),
 * the decoded length is bounded by max_seconds, and an unreadable, empty or
 * unsupported stream is a KN_ERR_FORMAT / KN_ERR_UNSUPPORTED with one line
 * saying why. Returned buffers are malloc'd and owned by the caller. */
#ifndef KN_AUDIO_AUDIO_H
#define KN_AUDIO_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KN_AUDIO_RATE 16000
#define KN_AUDIO_DEFAULT_MAX_SECONDS (4.0 * 3600.0)

/* Decode the file at path. max_seconds 0 = KN_AUDIO_DEFAULT_MAX_SECONDS;
 * longer audio is an error, not silently truncated. *pcm has *n samples at
 * 16 kHz in [-1, 1]. */
kn_code kn_audio_load_file(const char *path, double max_seconds, float **pcm, int64_t *n, kn_error *err);

/* The same from an in-memory file image (an upload). */
kn_code kn_audio_load_memory(const void *data, size_t len, double max_seconds, float **pcm, int64_t *n,
                             kn_error *err);

/* Resample mono PCM from rate_in to rate_out with libsoxr (HQ). *out has
 * *n_out samples, round(n_in * rate_out / rate_in). */
kn_code kn_audio_resample(const float *in, int64_t n_in, double rate_in, double rate_out, float **out,
                          int64_t *n_out, kn_error *err);

/* Comma-separated file extensions of the formats this libsndfile reads (for
 * messages), written into buf (truncated to cap). */
void kn_audio_formats(char *buf, size_t cap);

#endif

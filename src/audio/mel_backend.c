/* mel_backend.c — see mel_backend.h. */
#include "audio/mel_backend.h"

#include "backend/backend.h"

kn_code kn_mel_compute_on(kn_mel *m, kn_backend *be, const float *pcm, int64_t n_samples, int64_t n_frames,
                          float *out, kn_error *err) {
    if (!be || !be->vt->log_mel) return kn_mel_compute(m, pcm, n_samples, n_frames, out, err);
    if (n_frames < 2) return kn_fail(err, KN_ERR_INVALID_ARG, "mel: n_frames %lld < 2", (long long)n_frames);
    if (n_samples < 0 || (n_samples > 0 && !pcm)) return kn_fail(err, KN_ERR_INVALID_ARG, "mel: no samples");
    const int nm = kn_mel_n_mels(m);
    const size_t pcm_bytes = sizeof(float) * (size_t)n_samples;
    const size_t filt_bytes = sizeof(float) * (size_t)nm * KN_MEL_N_BINS;
    const size_t out_bytes = sizeof(float) * (size_t)nm * (size_t)n_frames;
    float *d_pcm = kn_be_alloc(be, pcm_bytes ? pcm_bytes : sizeof(float));
    float *d_filt = kn_be_alloc(be, filt_bytes);
    float *d_out = kn_be_alloc(be, out_bytes);
    kn_code rc = KN_OK;
    if (!d_pcm || !d_filt || !d_out) {
        rc = kn_fail(err, KN_ERR_NOMEM, "mel: out of %s memory for %.1f MB of audio and %.1f MB of spectrogram",
                     be->vt->name, pcm_bytes / 1e6, out_bytes / 1e6);
    } else {
        if (n_samples > 0) kn_be_upload(be, d_pcm, pcm, pcm_bytes);
        kn_be_upload(be, d_filt, kn_mel_filters(m), filt_bytes);
        rc = be->vt->log_mel(be, d_pcm, n_samples, n_frames, d_filt, nm, d_out, err);
        if (!rc) kn_be_download(be, out, d_out, out_bytes);
    }
    kn_be_free(be, d_pcm);
    kn_be_free(be, d_filt);
    kn_be_free(be, d_out);
    return rc;
}

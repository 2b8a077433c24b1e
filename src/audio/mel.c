/* mel.c — see mel.h. The filter bank is built in double precision exactly as
 * transformers' audio_utils.mel_filter_bank(norm="slaney", mel_scale="slaney")
 * does, then stored as float (as the feature extractor's torch path uses it).
 * Frames are independent, so they are split across OpenMP threads, each with
 * its own kissfft plan (a kiss_fftr plan carries scratch and is not
 * reentrant). Mel projections accumulate in double. */
#include "audio/mel.h"

#include <kiss_fftr.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct kn_mel {
    int n_mels, n_threads;
    float window[KN_MEL_N_FFT]; /* periodic Hann */
    float *filters;             /* [n_mels, KN_MEL_N_BINS] */
    int *f_lo, *f_hi;           /* nonzero bin range [lo, hi) of each filter */
    kiss_fftr_cfg *plans;       /* [n_threads] */
};

static double hz_to_mel_slaney(double hz) {
    const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = 27.0 / log(6.4);
    return hz >= min_log_hz ? min_log_mel + log(hz / min_log_hz) * logstep : 3.0 * hz / 200.0;
}

static double mel_to_hz_slaney(double mel) {
    const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = log(6.4) / 27.0;
    return mel >= min_log_mel ? min_log_hz * exp(logstep * (mel - min_log_mel)) : 200.0 * mel / 3.0;
}

/* transformers: mel_freqs = linspace(mel(0), mel(8000), n_mels + 2);
 * filter_freqs = hz(mel_freqs); fft_freqs = linspace(0, 8000, 201);
 * filter[b, m] = max(0, min(down, up)) * 2 / (f[m+2] - f[m]). */
static void build_filters(kn_mel *m) {
    const int nm = m->n_mels, nb = KN_MEL_N_BINS;
    double *ff = malloc(sizeof(double) * (size_t)(nm + 2));
    double mel_lo = hz_to_mel_slaney(0.0), mel_hi = hz_to_mel_slaney(8000.0);
    for (int i = 0; i < nm + 2; i++) {
        /* numpy linspace: start + i * step, the last point exactly stop */
        double mel = i == nm + 1 ? mel_hi : mel_lo + i * ((mel_hi - mel_lo) / (nm + 1));
        ff[i] = mel_to_hz_slaney(mel);
    }
    for (int j = 0; j < nm; j++) {
        double enorm = 2.0 / (ff[j + 2] - ff[j]);
        int lo = nb, hi = 0;
        for (int b = 0; b < nb; b++) {
            double fft_freq = b == nb - 1 ? 8000.0 : b * (8000.0 / (nb - 1));
            double down = -(ff[j] - fft_freq) / (ff[j + 1] - ff[j]);
            double up = (ff[j + 2] - fft_freq) / (ff[j + 2] - ff[j + 1]);
            double v = fmax(0.0, fmin(down, up)) * enorm;
            m->filters[(size_t)j * nb + b] = (float)v;
            if (v != 0.0) {
                if (b < lo) lo = b;
                hi = b + 1;
            }
        }
        m->f_lo[j] = lo < hi ? lo : 0;
        m->f_hi[j] = lo < hi ? hi : 0;
    }
    free(ff);
}

kn_code kn_mel_create(int n_mels, int n_threads, kn_mel **out, kn_error *err) {
    if (n_mels < 1 || n_mels > 512) return kn_fail(err, KN_ERR_INVALID_ARG, "mel: n_mels %d out of range", n_mels);
    kn_mel *m = calloc(1, sizeof *m);
    if (!m) return kn_fail(err, KN_ERR_NOMEM, "mel: out of memory");
    m->n_mels = n_mels;
    m->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (m->n_threads < 1) m->n_threads = 1;
    m->filters = malloc(sizeof(float) * (size_t)n_mels * KN_MEL_N_BINS);
    m->f_lo = malloc(sizeof(int) * (size_t)n_mels);
    m->f_hi = malloc(sizeof(int) * (size_t)n_mels);
    m->plans = calloc((size_t)m->n_threads, sizeof *m->plans);
    if (!m->filters || !m->f_lo || !m->f_hi || !m->plans) {
        kn_mel_free(m);
        return kn_fail(err, KN_ERR_NOMEM, "mel: out of memory");
    }
    for (int t = 0; t < m->n_threads; t++) {
        m->plans[t] = kiss_fftr_alloc(KN_MEL_N_FFT, 0, NULL, NULL);
        if (!m->plans[t]) {
            kn_mel_free(m);
            return kn_fail(err, KN_ERR_NOMEM, "mel: cannot allocate FFT plan");
        }
    }
    /* torch.hann_window(400) (periodic): 0.5 - 0.5 cos(2 pi n / 400) */
    for (int i = 0; i < KN_MEL_N_FFT; i++) m->window[i] = (float)(0.5 - 0.5 * cos(2.0 * M_PI * i / KN_MEL_N_FFT));
    build_filters(m);
    *out = m;
    return KN_OK;
}

void kn_mel_free(kn_mel *m) {
    if (!m) return;
    if (m->plans)
        for (int t = 0; t < m->n_threads; t++) kiss_fftr_free(m->plans[t]);
    free(m->plans);
    free(m->filters);
    free(m->f_lo);
    free(m->f_hi);
    free(m);
}

int kn_mel_n_mels(const kn_mel *m) { return m->n_mels; }
const float *kn_mel_filters(const kn_mel *m) { return m->filters; }

/* Sample i of the reflect-padded signal: the signal is pcm zero-padded (or
 * truncated) to len samples; indices outside [0, len) reflect about the ends
 * without repeating the edge sample (numpy/torch "reflect"). */
static inline float padded_sample(const float *pcm, int64_t n_samples, int64_t len, int64_t i) {
    if (i < 0) i = -i;
    if (i >= len) i = 2 * (len - 1) - i;
    return i < n_samples ? pcm[i] : 0.0f;
}

kn_code kn_mel_compute(kn_mel *m, const float *pcm, int64_t n_samples, int64_t n_frames, float *out,
                       kn_error *err) {
    if (n_frames < 2) return kn_fail(err, KN_ERR_INVALID_ARG, "mel: n_frames %lld < 2", (long long)n_frames);
    if (n_samples < 0 || (n_samples > 0 && !pcm)) return kn_fail(err, KN_ERR_INVALID_ARG, "mel: no samples");
    const int64_t len = n_frames * KN_MEL_HOP;
    const int nm = m->n_mels, half = KN_MEL_N_FFT / 2;
    float gmax = -INFINITY;
#pragma omp parallel num_threads(m->n_threads) reduction(max : gmax)
    {
        int tid = omp_get_thread_num();
        kiss_fftr_cfg plan = m->plans[tid];
        kiss_fft_scalar frame[KN_MEL_N_FFT];
        kiss_fft_cpx spec[KN_MEL_N_BINS];
        float power[KN_MEL_N_BINS];
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n_frames; t++) {
            const int64_t start = t * KN_MEL_HOP - half;
            if (start >= 0 && start + KN_MEL_N_FFT <= n_samples && start + KN_MEL_N_FFT <= len) {
                for (int i = 0; i < KN_MEL_N_FFT; i++) frame[i] = pcm[start + i] * m->window[i];
            } else {
                for (int i = 0; i < KN_MEL_N_FFT; i++)
                    frame[i] = padded_sample(pcm, n_samples, len, start + i) * m->window[i];
            }
            kiss_fftr(plan, frame, spec);
            for (int b = 0; b < KN_MEL_N_BINS; b++) power[b] = spec[b].r * spec[b].r + spec[b].i * spec[b].i;
            for (int j = 0; j < nm; j++) {
                const float *f = m->filters + (size_t)j * KN_MEL_N_BINS;
                double acc = 0;
                for (int b = m->f_lo[j]; b < m->f_hi[j]; b++) acc += (double)f[b] * power[b];
                float mel = (float)acc;
                float v = log10f(mel > 1e-10f ? mel : 1e-10f);
                out[(size_t)j * n_frames + t] = v;
                if (v > gmax) gmax = v;
            }
        }
    }
    const float floor_v = gmax - 8.0f;
    const size_t total = (size_t)nm * (size_t)n_frames;
    for (size_t i = 0; i < total; i++) {
        float v = out[i] > floor_v ? out[i] : floor_v;
        out[i] = (v + 4.0f) / 4.0f;
    }
    return KN_OK;
}

/* test_audio.c — audio decoding, resampling and Whisper's log-mel front end.
 *
 *  - jfk.wav decodes to the exact int16/32768 samples of its data chunk;
 *    the same audio written as FLAC decodes identically, as stereo downmixes
 *    to the channel mean, as OGG/Vorbis (lossy) stays close; memory decoding
 *    equals file decoding;
 *  - libsoxr resampling of a 44.1 kHz sine gives the same sine at 16 kHz;
 *  - empty, random, header-only and truncated files give clear errors (or a
 *    clean partial decode), never a crash;
 *  - log-mel of jfk.wav (80 and 128 bins) matches transformers'
 *    WhisperFeatureExtractor within 1e-4 absolute (fixtures from
 *    tools/fixtures/gen_whisper.py; a missing fixture is a failure);
 *  - the same through kn_mel_compute_on on the test's backend
 *    (KILN_TEST_BACKEND, test_backend.h): vs transformers and vs the host
 *    mel (kn_mel_compute) within 1e-4, plus silence, a signal shorter than
 *    one frame, truncation, the two-frame minimum, and 100 s of audio whose
 *    spectrogram spans several FFT chunks of the CUDA op, with the global
 *    max in a later chunk than clamped frames. With KILN_TEST_BACKEND=cuda
 *    (ctest test_audio_cuda) only these run, on the GPU, and the backend
 *    must have the log_mel op; unset or cpu, everything runs on the host
 *    (kn_mel_compute_on then is kn_mel_compute: results must be identical).
 */
#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "audio/audio.h"
#include "audio/mel.h"
#include "audio/mel_backend.h"
#include "backend/backend.h"
#include "io/npy.h"
#include "test_backend.h"
#include "test_util.h"

static char jfk_path[1024];

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, len, f);
    fclose(f);
}

/* The int16 samples of a canonical RIFF/WAVE file's data chunk, as floats. */
static size_t wav_data_offset;

static float *wav_reference(const unsigned char *b, size_t len, int64_t *n) {
    size_t p = 12;
    while (p + 8 <= len) {
        uint32_t sz = (uint32_t)b[p + 4] | (uint32_t)b[p + 5] << 8 | (uint32_t)b[p + 6] << 16 | (uint32_t)b[p + 7] << 24;
        if (!memcmp(b + p, "data", 4)) {
            wav_data_offset = p + 8;
            *n = sz / 2;
            float *o = malloc(sizeof(float) * (size_t)*n);
            for (int64_t i = 0; i < *n; i++) {
                int16_t s = (int16_t)(b[p + 8 + 2 * i] | b[p + 9 + 2 * i] << 8);
                o[i] = s / 32768.0f;
            }
            return o;
        }
        p += 8 + sz + (sz & 1);
    }
    return NULL;
}

static int write_sndfile(const char *path, int format, int channels, int rate, const float *interleaved,
                         int64_t frames) {
    SF_INFO info = {.samplerate = rate, .channels = channels, .format = format};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    if (!sf) return -1;
    sf_count_t w;
    if ((format & SF_FORMAT_SUBMASK) == SF_FORMAT_PCM_16) {
        /* exact int16 (libsndfile scales float writes by 32767, reads by 1/32768) */
        short *s16 = malloc(sizeof(short) * (size_t)frames * (size_t)channels);
        for (int64_t i = 0; i < frames * channels; i++) s16[i] = (short)lrintf(interleaved[i] * 32768.0f);
        w = sf_writef_short(sf, s16, frames);
        free(s16);
    } else {
        w = sf_writef_float(sf, interleaved, frames);
    }
    sf_close(sf);
    return w == frames ? 0 : -1;
}

static void test_decode(void) {
    size_t len;
    unsigned char *bytes = read_all(jfk_path, &len);
    CHECK(bytes, "cannot read %s", jfk_path);
    if (!bytes) return;
    int64_t n_ref = 0;
    float *ref = wav_reference(bytes, len, &n_ref);
    CHECK(ref && n_ref == 176000, "jfk.wav data chunk: %lld samples", (long long)n_ref);

    kn_error err = {0};
    float *pcm = NULL;
    int64_t n = 0;
    kn_code rc = kn_audio_load_file(jfk_path, 0, &pcm, &n, &err);
    CHECK(rc == KN_OK, "decode jfk.wav: %s", err.msg);
    if (rc == KN_OK && ref) {
        CHECK(n == n_ref, "jfk.wav: %lld samples, want %lld", (long long)n, (long long)n_ref);
        int same = 1;
        for (int64_t i = 0; i < n && i < n_ref; i++) same &= pcm[i] == ref[i];
        CHECK(same, "jfk.wav samples differ from int16/32768");
    }

    /* memory decode == file decode */
    float *pm = NULL;
    int64_t nm = 0;
    rc = kn_audio_load_memory(bytes, len, 0, &pm, &nm, &err);
    CHECK(rc == KN_OK && nm == n && pcm && !memcmp(pm, pcm, sizeof(float) * (size_t)n), "memory decode differs: %s",
          err.msg);
    free(pm);

    /* max_seconds bounds the work */
    rc = kn_audio_load_file(jfk_path, 5.0, &pm, &nm, &err);
    CHECK(rc == KN_ERR_INVALID_ARG && strstr(err.msg, "longer"), "11 s file with a 5 s limit: rc %d (%s)", rc, err.msg);

    if (rc == KN_OK) free(pm);
    if (!pcm || !ref) goto done;

    char tmp[] = "/tmp/kiln_audio_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char path[1200];

    /* FLAC (lossless, 16-bit): identical samples */
    snprintf(path, sizeof path, "%s/jfk.flac", tmp);
    if (write_sndfile(path, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 1, 16000, pcm, n) == 0) {
        err.msg[0] = 0;
        rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
        CHECK(rc == KN_OK && nm == n && !memcmp(pm, pcm, sizeof(float) * (size_t)n), "flac round trip: rc %d n %lld %s",
              rc, (long long)nm, err.msg);
        if (rc == KN_OK) free(pm);

        /* truncated FLAC: a clean partial decode or a clear error */
        size_t fl;
        unsigned char *fb = read_all(path, &fl);
        rc = kn_audio_load_memory(fb, fl / 2, 0, &pm, &nm, &err);
        CHECK(rc == KN_OK ? nm > 0 && nm < n : err.msg[0] != 0, "truncated flac: rc %d n %lld", rc, (long long)nm);
        if (rc == KN_OK) free(pm);
        free(fb);
    } else {
        CHECK(0, "this libsndfile cannot write FLAC");
    }

    /* stereo: mean of the channels */
    float *st = malloc(sizeof(float) * 2 * (size_t)n);
    for (int64_t i = 0; i < n; i++) st[2 * i] = pcm[i], st[2 * i + 1] = -0.5f * pcm[i];
    snprintf(path, sizeof path, "%s/stereo.wav", tmp);
    CHECK(write_sndfile(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 2, 16000, st, n) == 0, "write stereo wav");
    rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
    CHECK(rc == KN_OK && nm == n, "stereo decode: %s", err.msg);
    if (rc == KN_OK) {
        double md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(pm[i] - 0.25 * pcm[i]));
        CHECK(md < 1e-7, "stereo downmix max |d| %g", md);
        free(pm);
    }
    free(st);

    /* OGG/Vorbis (lossy): same length, close waveform */
    snprintf(path, sizeof path, "%s/jfk.ogg", tmp);
    if (write_sndfile(path, SF_FORMAT_OGG | SF_FORMAT_VORBIS, 1, 16000, pcm, n) == 0) {
        rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
        CHECK(rc == KN_OK && nm == n, "ogg decode: %s (n %lld)", err.msg, (long long)nm);
        if (rc == KN_OK) {
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; i++) num += (pm[i] - pcm[i]) * (double)(pm[i] - pcm[i]), den += pcm[i] * (double)pcm[i];
            CHECK(num / den < 0.05, "ogg relative error energy %g", num / den);
            free(pm);
        }
    } else {
        CHECK(0, "this libsndfile cannot write OGG/Vorbis");
    }

    /* MP3, where this libsndfile has an MPEG encoder */
    snprintf(path, sizeof path, "%s/jfk.mp3", tmp);
    if (write_sndfile(path, SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 1, 16000, pcm, n) == 0) {
        rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
        CHECK(rc == KN_OK && labs((long)(nm - n)) < 4000, "mp3 decode: %s (n %lld)", err.msg, (long long)nm);
        if (rc == KN_OK) free(pm);
    } else {
        printf("note: this libsndfile cannot write MP3; mp3 decode not exercised\n");
    }

    /* 44.1 kHz WAV goes through the resampler: 176000 * 44100/16000 frames */
    {
        kn_error e2 = {0};
        float *up = NULL;
        int64_t nup = 0;
        CHECK(kn_audio_resample(pcm, n, 16000, 44100, &up, &nup, &e2) == KN_OK, "upsample: %s", e2.msg);
        snprintf(path, sizeof path, "%s/jfk44.wav", tmp);
        CHECK(up && write_sndfile(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 1, 44100, up, nup) == 0, "write 44k");
        rc = kn_audio_load_file(path, 0, &pm, &nm, &e2);
        CHECK(rc == KN_OK && nm == n, "44.1k decode: %s (n %lld)", e2.msg, (long long)nm);
        if (rc == KN_OK) {
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; i++) num += (pm[i] - pcm[i]) * (double)(pm[i] - pcm[i]), den += pcm[i] * (double)pcm[i];
            CHECK(num / den < 1e-4, "16k->44.1k->16k relative error energy %g", num / den);
            free(pm);
        }
        free(up);
    }

    /* hostile inputs */
    snprintf(path, sizeof path, "%s/empty.wav", tmp);
    write_all(path, "", 0);
    rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
    CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, "empty"), "empty file: rc %d (%s)", rc, err.msg);
    snprintf(path, sizeof path, "%s/missing.wav", tmp);
    rc = kn_audio_load_file(path, 0, &pm, &nm, &err);
    CHECK(rc == KN_ERR_IO, "missing file: rc %d (%s)", rc, err.msg);
    unsigned char junk[4096];
    uint64_t s = 99;
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(kn_test_rand(&s) * 127 + 128);
    rc = kn_audio_load_memory(junk, sizeof junk, 0, &pm, &nm, &err);
    CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, "not a readable audio file"), "random bytes: rc %d (%s)", rc, err.msg);
    if (rc == KN_OK) free(pm);
    rc = kn_audio_load_memory(bytes, 44, 0, &pm, &nm, &err); /* header only */
    CHECK(rc == KN_ERR_FORMAT, "header-only wav: rc %d (%s)", rc, err.msg);
    if (rc == KN_OK) free(pm);
    rc = kn_audio_load_memory(bytes, 1000, 0, &pm, &nm, &err); /* truncated data: partial decode */
    CHECK(rc == KN_OK && nm == (int64_t)(1000 - wav_data_offset) / 2, "truncated wav: rc %d n %lld (%s)", rc, (long long)nm, err.msg);
    if (rc == KN_OK) free(pm);
    printf("error lines: \"%s\"\n", err.msg);

    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", tmp);
done:
    free(pcm);
    free(ref);
    free(bytes);
}

static void test_resample_sine(void) {
    const int n = 44100;
    float *x = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) x[i] = 0.5f * (float)sin(2 * M_PI * 1000.0 * i / 44100.0);
    float *y = NULL;
    int64_t ny = 0;
    kn_error err = {0};
    CHECK(kn_audio_resample(x, n, 44100, 16000, &y, &ny, &err) == KN_OK, "resample: %s", err.msg);
    CHECK(ny == 16000, "resampled length %lld", (long long)ny);
    double md = 0;
    for (int i = 1000; i < 15000 && y; i++) md = fmax(md, fabs(y[i] - 0.5 * sin(2 * M_PI * 1000.0 * i / 16000.0)));
    CHECK(md < 2e-3, "resampled sine max |d| %g", md);
    free(x);
    free(y);
}

static void test_mel_silence(void) {
    kn_mel *m = NULL;
    kn_error err = {0};
    CHECK(kn_mel_create(80, 0, &m, &err) == KN_OK, "mel create: %s", err.msg);
    if (!m) return;
    float *out = malloc(sizeof(float) * 80 * 3000);
    CHECK(kn_mel_compute(m, NULL, 0, 3000, out, &err) == KN_OK, "mel of silence: %s", err.msg);
    /* every bin log10(1e-10) = -10 -> clamp is a no-op -> (-10 + 4) / 4 */
    int ok = 1;
    for (int i = 0; i < 80 * 3000; i++) ok &= out[i] == -1.5f;
    CHECK(ok, "silence mel is not -1.5 everywhere");
    CHECK(kn_mel_compute(m, NULL, 0, 1, out, &err) == KN_ERR_INVALID_ARG, "1 frame accepted");
    free(out);
    kn_mel_free(m);
}

/* mel of jfk.wav vs WhisperFeatureExtractor: head frames from the fixture,
 * the rest equal to the fixture's tail column. */
static void test_mel_oracle(int n_mels) {
    const char *fx = kn_test_fixtures();
    char hp[1024], tp[1024];
    snprintf(hp, sizeof hp, "%s/whisper/mel%d_head.npy", fx, n_mels);
    snprintf(tp, sizeof tp, "%s/whisper/mel%d_tail.npy", fx, n_mels);
    kn_error err = {0};
    float *head = NULL, *tail = NULL;
    int nd;
    int64_t hs[4], ts[4];
    if (kn_npy_read_f32(hp, &head, &nd, hs, &err) || kn_npy_read_f32(tp, &tail, &nd, ts, &err)) {
        CHECK(0, "mel fixture: %s", err.msg);
        free(head);
        return;
    }
    CHECK(hs[0] == n_mels && ts[0] == n_mels && hs[1] <= 3000, "fixture shapes");
    float *pcm = NULL, *mel = NULL;
    int64_t n = 0;
    kn_mel *m = NULL;
    kn_code rc = kn_audio_load_file(jfk_path, 0, &pcm, &n, &err);
    if (!rc) rc = kn_mel_create(n_mels, 0, &m, &err);
    if (!rc) {
        mel = malloc(sizeof(float) * (size_t)n_mels * 3000);
        rc = kn_mel_compute(m, pcm, n, 3000, mel, &err);
    }
    CHECK(rc == KN_OK, "mel of jfk.wav: %s", err.msg);
    if (!rc) {
        double md = 0;
        int64_t H = hs[1];
        for (int j = 0; j < n_mels; j++)
            for (int t = 0; t < 3000; t++) {
                float want = t < H ? head[(size_t)j * H + t] : tail[j];
                md = fmax(md, fabs(mel[(size_t)j * 3000 + t] - want));
            }
        CHECK(md <= 1e-4, "mel%d max |d| %g > 1e-4", n_mels, md);
        printf("mel%d vs transformers: max |d| = %.3g\n", n_mels, md);
    }
    free(mel);
    free(pcm);
    free(head);
    free(tail);
    kn_mel_free(m);
}

/* ---- the mel through a backend (kn_mel_compute_on) ------------------------ */

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN counts as the largest */
    }
    return md;
}

/* Bound on backend vs host mel: identical where the backend has no log_mel
 * (the helper is kn_mel_compute itself), else 1e-4 (FFT rounding). */
static double be_tolerance(kn_backend *be) { return be->vt->log_mel ? 1e-4 : 0.0; }

/* The mel of pcm through be and on the host ([n_mels, frames] each, malloc'd
 * into *on_be / *on_host, NULL on failure); returns max |d| (INFINITY when
 * either failed). */
static double mel_be_vs_host(kn_backend *be, kn_mel *m, const float *pcm, int64_t n, int64_t frames, const char *what,
                             float **on_be, float **on_host) {
    const size_t total = (size_t)kn_mel_n_mels(m) * (size_t)frames;
    float *a = malloc(sizeof(float) * total), *b = malloc(sizeof(float) * total);
    kn_error err = {0};
    kn_code rc = a && b ? kn_mel_compute_on(m, be, pcm, n, frames, a, &err) : KN_ERR_NOMEM;
    CHECK(rc == KN_OK, "%s: mel on %s: %s", what, be->vt->name, err.msg);
    kn_code rh = rc ? rc : kn_mel_compute(m, pcm, n, frames, b, &err);
    CHECK(rh == KN_OK, "%s: host mel: %s", what, err.msg);
    double md = INFINITY;
    if (!rc && !rh) {
        md = max_abs_diff(a, b, total);
        CHECK(md <= be_tolerance(be), "%s (%d mels, %lld samples, %lld frames): %s vs host mel max |d| %g > %g", what,
              kn_mel_n_mels(m), (long long)n, (long long)frames, be->vt->name, md, be_tolerance(be));
        printf("mel %s (%d mels, %lld frames): %s vs host max |d| = %.3g\n", what, kn_mel_n_mels(m), (long long)frames,
               be->vt->name, md);
    }
    if (rc || rh) free(a), free(b), a = b = NULL;
    if (on_be) *on_be = a;
    else free(a);
    if (on_host) *on_host = b;
    else free(b);
    return md;
}

/* jfk.wav through be vs transformers' fixture (1e-4) and vs the host mel. */
static void test_mel_backend_oracle(kn_backend *be, int n_mels) {
    const char *fx = kn_test_fixtures();
    char hp[1024], tp[1024];
    snprintf(hp, sizeof hp, "%s/whisper/mel%d_head.npy", fx, n_mels);
    snprintf(tp, sizeof tp, "%s/whisper/mel%d_tail.npy", fx, n_mels);
    kn_error err = {0};
    float *head = NULL, *tail = NULL, *pcm = NULL, *mel = NULL;
    int nd;
    int64_t hs[4], ts[4], n = 0;
    kn_mel *m = NULL;
    if (kn_npy_read_f32(hp, &head, &nd, hs, &err) || kn_npy_read_f32(tp, &tail, &nd, ts, &err)) {
        CHECK(0, "mel fixture: %s", err.msg);
        goto done;
    }
    CHECK(hs[0] == n_mels && ts[0] == n_mels && hs[1] <= 3000, "fixture shapes");
    if (kn_audio_load_file(jfk_path, 0, &pcm, &n, &err) || kn_mel_create(n_mels, 0, &m, &err)) {
        CHECK(0, "jfk.wav mel setup: %s", err.msg);
        goto done;
    }
    mel_be_vs_host(be, m, pcm, n, 3000, "jfk.wav", &mel, NULL);
    if (mel) {
        double md = 0;
        const int64_t H = hs[1];
        for (int j = 0; j < n_mels; j++)
            for (int t = 0; t < 3000; t++) {
                float want = t < H ? head[(size_t)j * H + t] : tail[j];
                double d = fabs(mel[(size_t)j * 3000 + t] - want);
                if (!(d <= md)) md = d;
            }
        CHECK(md <= 1e-4, "mel%d on %s vs transformers: max |d| %g > 1e-4", n_mels, be->vt->name, md);
        printf("mel%d on %s vs transformers: max |d| = %.3g\n", n_mels, be->vt->name, md);
    }
done:
    free(mel);
    free(pcm);
    free(head);
    free(tail);
    kn_mel_free(m);
}

/* Silence, short, truncated and long signals through be vs the host. */
static void test_mel_backend_edges(kn_backend *be) {
    kn_error err = {0};
    kn_mel *m80 = NULL, *m128 = NULL;
    if (kn_mel_create(80, 0, &m80, &err) || kn_mel_create(128, 0, &m128, &err)) {
        CHECK(0, "mel create: %s", err.msg);
        kn_mel_free(m80);
        return;
    }
    uint64_t seed = 7;

    /* silence, with no samples and with explicit zeros: -1.5 everywhere */
    float *zeros = calloc(1000, sizeof(float)), *a = NULL;
    for (int k = 0; k < 2; k++) {
        mel_be_vs_host(be, m80, k ? zeros : NULL, k ? 1000 : 0, 3000, k ? "1000 zero samples" : "no samples", &a, NULL);
        if (a) {
            double md = 0;
            for (int i = 0; i < 80 * 3000; i++) md = fmax(md, fabs(a[i] + 1.5));
            CHECK(md <= 1e-6, "silence on %s: max |mel + 1.5| %g", be->vt->name, md);
        }
        free(a);
    }
    free(zeros);

    /* fewer samples than one frame; the 2-frame minimum (320 samples, reflect
     * padding reaching across the whole signal) */
    float shortsig[1000];
    for (int i = 0; i < 1000; i++) shortsig[i] = 0.5f * kn_test_rand(&seed);
    mel_be_vs_host(be, m80, shortsig, 100, 3000, "100 samples", NULL, NULL);
    mel_be_vs_host(be, m128, shortsig, 100, 2, "100 samples", NULL, NULL);
    mel_be_vs_host(be, m80, shortsig, 1000, 2, "1000 samples truncated", NULL, NULL);
    mel_be_vs_host(be, m80, shortsig, 399, 3, "399 samples", NULL, NULL);

    /* jfk.wav (176000 samples) truncated to 5 s, and cut exactly at its length */
    float *pcm = NULL;
    int64_t n = 0;
    if (kn_audio_load_file(jfk_path, 0, &pcm, &n, &err) == KN_OK) {
        mel_be_vs_host(be, m80, pcm, n, 500, "jfk.wav truncated to 5 s", NULL, NULL);
        mel_be_vs_host(be, m128, pcm, n, n / KN_MEL_HOP, "jfk.wav at its length", NULL, NULL);
        free(pcm);
    } else {
        CHECK(0, "jfk.wav: %s", err.msg);
    }

    /* 100 s: noise at 0.01 with 10 s of silence at 10-20 s, then noise at 1.0
     * from 85 s; long-form framing (audio + 30 s of zeros: 13000 frames), so
     * the CUDA op's FFT chunks (8192 frames) split it, silent frames of the
     * first chunk are clamped by the global max found in the second */
    const int64_t nl = 100 * 16000, frames = nl / KN_MEL_HOP + KN_MEL_WINDOW_FRAMES;
    float *lsig = malloc(sizeof(float) * (size_t)nl);
    for (int64_t i = 0; i < nl; i++) {
        float amp = i < 10 * 16000 ? 0.01f : i < 20 * 16000 ? 0.0f : i < 85 * 16000 ? 0.01f : 1.0f;
        lsig[i] = amp * kn_test_rand(&seed);
    }
    float *host = NULL;
    for (int k = 0; k < 2; k++) {
        kn_mel *m = k ? m128 : m80;
        const int nm = kn_mel_n_mels(m);
        mel_be_vs_host(be, m, lsig, nl, frames, "100 s noise + silence", NULL, &host);
        if (!host) continue;
        /* the signal does what it is meant to: the max in the second chunk,
         * clamped values (the minimum, max - 2 after (x+4)/4) in the first */
        float vmax = -INFINITY, vmin = INFINITY;
        int64_t tmax = -1, clamped_early = 0;
        for (int j = 0; j < nm; j++)
            for (int64_t t = 0; t < frames; t++) {
                const float v = host[(size_t)j * frames + t];
                if (v > vmax) vmax = v, tmax = t;
                if (v < vmin) vmin = v;
            }
        for (int j = 0; j < nm; j++)
            for (int64_t t = 0; t < 8192; t++) clamped_early += host[(size_t)j * frames + t] == vmin;
        CHECK(tmax >= 8192 && fabsf(vmin - (vmax - 2.0f)) < 1e-5f && clamped_early > 0,
              "long signal: max %g at frame %lld, min %g, %lld clamped values before frame 8192", vmax,
              (long long)tmax, vmin, (long long)clamped_early);
        free(host);
    }
    /* one frame past a full chunk */
    mel_be_vs_host(be, m80, lsig, nl, 8193, "100 s truncated to 8193 frames", NULL, NULL);
    free(lsig);

    /* the helper's own argument checks */
    float out[80 * 2];
    CHECK(kn_mel_compute_on(m80, be, shortsig, 100, 1, out, &err) == KN_ERR_INVALID_ARG, "1 frame accepted on %s",
          be->vt->name);
    CHECK(kn_mel_compute_on(m80, be, NULL, 100, 2, out, &err) == KN_ERR_INVALID_ARG, "NULL pcm accepted on %s",
          be->vt->name);
    kn_mel_free(m80);
    kn_mel_free(m128);
}

int main(void) {
    snprintf(jfk_path, sizeof jfk_path, "%s/audio/jfk.wav", kn_test_fixtures());
    const char *bn = getenv("KILN_TEST_BACKEND");
    const int host_only = !bn || !strcmp(bn, "cpu");
    kn_backend *be = NULL;
    int rc = kn_test_backend_open("test_audio", 0, &be);
    if (rc) return rc;
    if (host_only) {
        test_decode();
        test_resample_sine();
        test_mel_silence();
        test_mel_oracle(80);
        test_mel_oracle(128);
    } else {
        /* an accelerator backend is asked for: its mel is what is tested */
        CHECK(be->vt->log_mel, "the %s backend has no log_mel op", be->vt->name);
        printf("test_audio: mel on the %s backend\n", be->vt->name);
    }
    if (host_only || be->vt->log_mel) {
        test_mel_backend_oracle(be, 80);
        test_mel_backend_oracle(be, 128);
        test_mel_backend_edges(be);
    }
    kn_backend_destroy(be);
    return kn_test_done(host_only ? "test_audio" : "test_audio (backend mel)");
}

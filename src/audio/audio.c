/* audio.c — see audio.h. libsndfile decodes (from a path or from memory
 * through its virtual-I/O interface), we downmix while reading in fixed
 * chunks, and libsoxr resamples to 16 kHz in one shot. Nothing trusts the
 * header: the frame count may lie, so we read until libsndfile stops and
 * bound the total by max_seconds. */
#include "audio/audio.h"

#include <math.h>
#include <sndfile.h>
#include <soxr.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KN_AUDIO_MAX_CHANNELS 64
#define KN_AUDIO_MAX_RATE 768000
#define KN_AUDIO_CHUNK_FRAMES 8192

/* ---- in-memory file for sf_open_virtual ------------------------------- */
typedef struct {
    const unsigned char *data;
    sf_count_t len, pos;
} mem_file;

static sf_count_t mem_get_filelen(void *user) { return ((mem_file *)user)->len; }

static sf_count_t mem_seek(sf_count_t offset, int whence, void *user) {
    mem_file *m = user;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->len;
    sf_count_t p = base + offset;
    if (p < 0 || p > m->len) return -1;
    m->pos = p;
    return p;
}

static sf_count_t mem_read(void *ptr, sf_count_t count, void *user) {
    mem_file *m = user;
    if (count < 0) return 0;
    sf_count_t left = m->len - m->pos;
    if (count > left) count = left;
    memcpy(ptr, m->data + m->pos, (size_t)count);
    m->pos += count;
    return count;
}

static sf_count_t mem_write(const void *ptr, sf_count_t count, void *user) {
    (void)ptr, (void)count, (void)user;
    return 0;
}

static sf_count_t mem_tell(void *user) { return ((mem_file *)user)->pos; }

/* ---- decode ------------------------------------------------------------ */

/* Read every frame of an open stream, downmixed to mono at the native rate. */
static kn_code read_mono(SNDFILE *sf, const SF_INFO *info, double max_seconds, const char *what, float **out,
                         int64_t *n_out, kn_error *err) {
    if (info->channels < 1 || info->channels > KN_AUDIO_MAX_CHANNELS)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: %d channels (supported: 1..%d)", what, info->channels,
                       KN_AUDIO_MAX_CHANNELS);
    if (info->samplerate < 1 || info->samplerate > KN_AUDIO_MAX_RATE)
        return kn_fail(err, KN_ERR_FORMAT, "%s: sample rate %d Hz out of range (1..%d)", what, info->samplerate,
                       KN_AUDIO_MAX_RATE);
    const int ch = info->channels;
    const int64_t max_frames = (int64_t)(max_seconds * info->samplerate) + 1;
    float *chunk = malloc(sizeof(float) * KN_AUDIO_CHUNK_FRAMES * (size_t)ch);
    int64_t cap = 0, n = 0;
    float *pcm = NULL;
    if (!chunk) return kn_fail(err, KN_ERR_NOMEM, "%s: out of memory", what);
    for (;;) {
        sf_count_t got = sf_readf_float(sf, chunk, KN_AUDIO_CHUNK_FRAMES);
        if (got <= 0) break;
        if (n + got > max_frames) {
            free(chunk), free(pcm);
            return kn_fail(err, KN_ERR_INVALID_ARG, "%s: audio longer than the limit of %.0f s", what, max_seconds);
        }
        if (n + got > cap) {
            int64_t nc = cap ? cap * 2 : 16 * KN_AUDIO_CHUNK_FRAMES;
            while (nc < n + got) nc *= 2;
            if (nc > max_frames) nc = max_frames;
            float *p = realloc(pcm, sizeof(float) * (size_t)nc);
            if (!p) {
                free(chunk), free(pcm);
                return kn_fail(err, KN_ERR_NOMEM, "%s: out of memory", what);
            }
            pcm = p, cap = nc;
        }
        for (sf_count_t f = 0; f < got; f++) {
            const float *fr = chunk + f * ch;
            float s = 0;
            for (int c = 0; c < ch; c++) s += fr[c];
            float v = s / (float)ch;
            pcm[n + f] = isfinite(v) ? v : 0.0f; /* float files can hold NaN/Inf */
        }
        n += got;
    }
    free(chunk);
    int e = sf_error(sf);
    if (e != SF_ERR_NO_ERROR && n == 0) {
        free(pcm);
        return kn_fail(err, KN_ERR_FORMAT, "%s: %s", what, sf_error_number(e));
    }
    if (n == 0) {
        free(pcm);
        return kn_fail(err, KN_ERR_FORMAT, "%s: no audio samples (empty or truncated stream)", what);
    }
    *out = pcm;
    *n_out = n;
    return KN_OK;
}

/* Shared tail: read, resample to 16 kHz, close. */
static kn_code decode_open(SNDFILE *sf, SF_INFO *info, double max_seconds, const char *what, float **pcm,
                           int64_t *n, kn_error *err) {
    if (!sf) {
        char formats[256];
        kn_audio_formats(formats, sizeof formats);
        return kn_fail(err, KN_ERR_FORMAT, "%s: not a readable audio file (%s; readable formats: %s)", what,
                       sf_strerror(NULL), formats);
    }
    if (max_seconds <= 0) max_seconds = KN_AUDIO_DEFAULT_MAX_SECONDS;
    float *mono = NULL;
    int64_t n_mono = 0;
    kn_code rc = read_mono(sf, info, max_seconds, what, &mono, &n_mono, err);
    sf_close(sf);
    if (rc) return rc;
    if (info->samplerate == KN_AUDIO_RATE) {
        *pcm = mono;
        *n = n_mono;
        return KN_OK;
    }
    rc = kn_audio_resample(mono, n_mono, info->samplerate, KN_AUDIO_RATE, pcm, n, err);
    free(mono);
    if (rc) return kn_fail_wrap(err, "%s", what);
    return KN_OK;
}

kn_code kn_audio_load_file(const char *path, double max_seconds, float **pcm, int64_t *n, kn_error *err) {
    SF_INFO info;
    memset(&info, 0, sizeof info);
    FILE *probe = fopen(path, "rb");
    if (!probe) return kn_fail(err, KN_ERR_IO, "cannot open audio file %s", path);
    fseek(probe, 0, SEEK_END);
    long size = ftell(probe);
    fclose(probe);
    if (size == 0) return kn_fail(err, KN_ERR_FORMAT, "%s: empty file", path);
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    return decode_open(sf, &info, max_seconds, path, pcm, n, err);
}

kn_code kn_audio_load_memory(const void *data, size_t len, double max_seconds, float **pcm, int64_t *n,
                             kn_error *err) {
    if (!data || len == 0) return kn_fail(err, KN_ERR_FORMAT, "audio: empty file");
    mem_file m = {.data = data, .len = (sf_count_t)len, .pos = 0};
    SF_VIRTUAL_IO io = {mem_get_filelen, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&io, SFM_READ, &info, &m);
    return decode_open(sf, &info, max_seconds, "audio", pcm, n, err);
}

kn_code kn_audio_resample(const float *in, int64_t n_in, double rate_in, double rate_out, float **out,
                          int64_t *n_out, kn_error *err) {
    if (n_in <= 0 || rate_in <= 0 || rate_out <= 0)
        return kn_fail(err, KN_ERR_INVALID_ARG, "resample: bad arguments (%lld samples, %g -> %g Hz)",
                       (long long)n_in, rate_in, rate_out);
    double want = (double)n_in * rate_out / rate_in;
    size_t olen = (size_t)llround(want);
    if (olen == 0) olen = 1;
    float *o = malloc(sizeof(float) * olen);
    if (!o) return kn_fail(err, KN_ERR_NOMEM, "resample: out of memory");
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    size_t idone = 0, odone = 0;
    soxr_error_t e = soxr_oneshot(rate_in, rate_out, 1, in, (size_t)n_in, &idone, o, olen, &odone, NULL, &q, NULL);
    if (e) {
        free(o);
        return kn_fail(err, KN_ERR_INTERNAL, "resample %g -> %g Hz: %s", rate_in, rate_out, e);
    }
    for (size_t i = odone; i < olen; i++) o[i] = 0.0f; /* soxr may deliver one short */
    *out = o;
    *n_out = (int64_t)olen;
    return KN_OK;
}

void kn_audio_formats(char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    int count = 0;
    sf_command(NULL, SFC_GET_FORMAT_MAJOR_COUNT, &count, sizeof count);
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        SF_FORMAT_INFO fi = {.format = i};
        if (sf_command(NULL, SFC_GET_FORMAT_MAJOR, &fi, sizeof fi) != 0 || !fi.extension) continue;
        size_t el = strlen(fi.extension);
        const char *dup = strstr(buf, fi.extension); /* several majors share an extension (wav) */
        if (dup && (dup == buf || dup[-1] == ',') && (dup[el] == ',' || dup[el] == 0)) continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? "," : "", fi.extension);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
}

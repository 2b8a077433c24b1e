/* transcribe_loop.c — kn_transcribe: audio of any length through 30 s
 * windows, as openai-whisper's transcribe() (see transcribe.h), and the
 * output formats (text, json, verbose_json, srt, vtt).
 *
 * Audio up to 30 s is one window whose mel is the feature extractor's (audio
 * zero-padded to 30 s before the STFT), as transformers' short-form
 * generate. Longer audio gets one spectrogram of audio + 30 s of zeros
 * (global max-8 clamp), cut into windows of up to 3000 frames that are
 * zero-padded in mel space, as openai-whisper and transformers' long-form
 * generate. The seek advances to the last complete segment's end timestamp
 * (or a whole window when the window ends on a single timestamp or has no
 * timestamps). The spectrogram is computed once, on the model's backend
 * (audio/mel_backend.h: cuFFT on CUDA), and windows are cut from it on the
 * host. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "audio/audio.h"
#include "audio/mel.h"
#include "audio/mel_backend.h"
#include "engine/transcribe.h"
#include "engine/word_timing.h"

#define TIME_PRECISION 0.02 /* seconds per timestamp token */
#define INPUT_STRIDE 2      /* mel frames per encoder position */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void kn_transcript_free(kn_transcript *t) {
    if (!t) return;
    for (int i = 0; i < t->n_segments; i++) {
        free(t->segments[i].tokens);
        free(t->segments[i].text);
        for (int k = 0; k < t->segments[i].n_words; k++) free(t->segments[i].words[k].word);
        free(t->segments[i].words);
    }
    free(t->segments);
    free(t->text);
    memset(t, 0, sizeof *t);
}

typedef struct {
    int32_t *v;
    int n, cap;
} ids_vec;

static int ids_push(ids_vec *a, const int32_t *x, int n) {
    if (a->n + n > a->cap) {
        int nc = a->cap ? a->cap * 2 : 256;
        while (nc < a->n + n) nc *= 2;
        int32_t *p = realloc(a->v, sizeof(int32_t) * (size_t)nc);
        if (!p) return -1;
        a->v = p, a->cap = nc;
    }
    memcpy(a->v + a->n, x, sizeof(int32_t) * (size_t)n);
    a->n += n;
    return 0;
}

static kn_code add_segment(kn_transcript *t, const kn_decode_options *o, int eot, int64_t seek, double start,
                           double end, const int32_t *tokens, int n, const kn_decode_result *r, kn_error *err) {
    kn_segment *s = realloc(t->segments, sizeof(kn_segment) * (size_t)(t->n_segments + 1));
    if (!s) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    t->segments = s;
    kn_segment *g = &s[t->n_segments];
    memset(g, 0, sizeof *g);
    /* a timestamp past the end of the audio (padding) ends at the audio's end */
    if (end > t->duration) end = t->duration;
    if (start > end) start = end;
    g->id = t->n_segments;
    g->seek = seek;
    g->start = start;
    g->end = end;
    g->tokens = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!g->tokens) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    memcpy(g->tokens, tokens, sizeof(int32_t) * (size_t)n);
    g->n_tokens = n;
    g->temperature = r->temperature;
    g->avg_logprob = r->avg_logprob;
    g->compression_ratio = r->compression_ratio;
    g->no_speech_prob = r->no_speech_prob;
    t->n_segments++;
    if (o->detok) {
        /* text tokens only (below <|endoftext|>) */
        int32_t *txt = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        int m = 0;
        if (!txt) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++)
            if (tokens[i] < eot) txt[m++] = tokens[i];
        kn_code rc = o->detok(o->detok_user, txt, m, &g->text, err);
        free(txt);
        if (rc) return rc;
    }
    return KN_OK;
}

/* One window with the fallback ladder; *r is the accepted result. */
static kn_code decode_with_fallback(kn_whisper *w, const float *mel, const int32_t *prev, int n_prev,
                                    const kn_decode_options *o, kn_decode_result *r, kn_error *err) {
    int nt = o->n_temperatures > 0 ? o->n_temperatures : 1;
    for (int i = 0; i < nt; i++) {
        float temp = o->n_temperatures > 0 ? o->temperatures[i] : 0.0f;
        kn_code rc = kn_whisper_decode_window(w, i == 0 ? mel : NULL, prev, n_prev, o, temp, r, err); /* encode once */
        if (rc) return rc;
        int needs = 0;
        if (o->compression_ratio_threshold > 0 && r->compression_ratio > o->compression_ratio_threshold) needs = 1;
        if (!isnan(o->logprob_threshold) && r->avg_logprob < o->logprob_threshold) needs = 1;
        if (!isnan(o->no_speech_threshold) && r->no_speech_prob > o->no_speech_threshold &&
            !isnan(o->logprob_threshold) && r->avg_logprob < o->logprob_threshold)
            needs = 0; /* silence: no retry */
        if (!needs || i + 1 == nt) return KN_OK;
        kn_decode_result_free(r);
    }
    return KN_OK;
}

kn_code kn_transcribe(kn_whisper *w, const float *pcm, int64_t n_samples, const kn_decode_options *opts,
                      kn_transcript *out, kn_error *err) {
    memset(out, 0, sizeof *out);
    const kn_whisper_config *c = kn_whisper_cfg(w);
    if (n_samples <= 0) return kn_fail(err, KN_ERR_INVALID_ARG, "transcribe: no audio samples");
    kn_decode_options o = *opts;
    const int n_mels = c->n_mels, win = 2 * c->max_source_positions;
    if (win != KN_MEL_WINDOW_FRAMES)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "whisper: windows of %d frames are not supported", win);
    out->duration = (double)n_samples / KN_AUDIO_RATE;

    double t0 = now_s();
    int shortform = n_samples <= KN_MEL_WINDOW_SAMPLES;
    int64_t total_frames = shortform ? KN_MEL_WINDOW_FRAMES : (n_samples + KN_MEL_WINDOW_SAMPLES) / KN_MEL_HOP;
    int64_t content_frames = shortform ? KN_MEL_WINDOW_FRAMES : n_samples / KN_MEL_HOP;
    float *mel = malloc(sizeof(float) * (size_t)n_mels * (size_t)total_frames);
    float *window = malloc(sizeof(float) * (size_t)n_mels * KN_MEL_WINDOW_FRAMES);
    kn_mel *mm = NULL;
    ids_vec all = {0};
    kn_code rc = mel && window ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory for the spectrogram");
    if (!rc) rc = kn_mel_create(n_mels, 0, &mm, err);
    /* on the model's backend: cuFFT on CUDA, kissfft on the CPU */
    if (!rc) rc = kn_mel_compute_on(mm, kn_whisper_backend(w), pcm, n_samples, total_frames, mel, err);
    out->mel_seconds = now_s() - t0;
    if (rc) goto done;

    if (o.n_initial_prompt > 0 && o.initial_prompt && ids_push(&all, o.initial_prompt, o.n_initial_prompt)) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    int prompt_reset_since = 0;
    int64_t seek = 0;
    const int64_t audio_frames = n_samples / KN_MEL_HOP; /* frames of actual audio (word alignment) */
    double last_speech = 0.0;
    const int ts_begin = c->no_timestamps_token_id + 1, eot = c->eos_token_id;
    while (seek < content_frames) {
        const int64_t win_seek = seek;
        int64_t seg_frames = content_frames - seek < win ? content_frames - seek : win;
        double time_offset = (double)seek * KN_MEL_HOP / KN_AUDIO_RATE;
        double seg_duration = (double)seg_frames * KN_MEL_HOP / KN_AUDIO_RATE;
        for (int j = 0; j < n_mels; j++)
            for (int64_t f = 0; f < win; f++)
                window[(size_t)j * win + f] = f < seg_frames ? mel[(size_t)j * total_frames + seek + f] : 0.0f;
        int n_prev = all.n - prompt_reset_since;
        const int32_t *prev = n_prev > 0 ? all.v + prompt_reset_since : NULL;
        kn_decode_result r;
        double t1 = now_s();
        rc = decode_with_fallback(w, window, prev, n_prev, &o, &r, err);
        out->decode_seconds += now_s() - t1;
        out->n_windows++;
        if (rc) goto done;
        out->n_decoded_tokens += r.n_tokens;
        /* the first window fixes the language for the rest */
        if (!o.language && r.language_token >= 0) {
            for (int i = 0; i < c->n_langs; i++)
                if (c->lang_token_id[i] == r.language_token) {
                    snprintf(out->language, sizeof out->language, "%s", c->lang_code[i]);
                    o.language = out->language;
                }
        } else if (!out->language[0]) {
            snprintf(out->language, sizeof out->language, "%s", o.language ? o.language : "en");
        }
        int skip = 0;
        if (!isnan(o.no_speech_threshold) && r.no_speech_prob > o.no_speech_threshold) {
            skip = 1;
            if (!isnan(o.logprob_threshold) && r.avg_logprob > o.logprob_threshold) skip = 0;
        }
        if (skip) {
            seek += seg_frames;
            kn_decode_result_free(&r);
            continue;
        }
        /* tokens without eot */
        int n = r.n_tokens;
        if (n > 0 && r.tokens[n - 1] == eot) n--;
        const int32_t *tk = r.tokens;
        int first_new_segment = out->n_segments;
        int single_ending = n >= 2 ? tk[n - 2] < ts_begin && tk[n - 1] >= ts_begin : n == 1 && tk[0] >= ts_begin;
        int n_consec = 0, last_slice = 0;
        for (int i = 1; i < n; i++)
            if (o.timestamps && tk[i - 1] >= ts_begin && tk[i] >= ts_begin) n_consec++;
        if (o.timestamps && n_consec > 0) {
            for (int i = 1; i <= n && !rc; i++) {
                int is_cut = i < n && tk[i - 1] >= ts_begin && tk[i] >= ts_begin;
                if (!is_cut && !(i == n && single_ending)) continue;
                const int32_t *sl = tk + last_slice;
                int len = i - last_slice;
                double st = time_offset + (sl[0] - ts_begin) * TIME_PRECISION;
                double en = time_offset + (sl[len - 1] - ts_begin) * TIME_PRECISION;
                rc = add_segment(out, &o, eot, seek, st, en, sl, len, &r, err);
                last_slice = i;
            }
            if (single_ending) {
                seek += seg_frames;
            } else {
                int last_ts = tk[last_slice - 1] - ts_begin;
                /* the rules make this > 0; never stall on a model that breaks them */
                seek += last_ts > 0 ? (int64_t)last_ts * INPUT_STRIDE : seg_frames;
            }
        } else {
            double duration = seg_duration;
            for (int i = n - 1; o.timestamps && i >= 0; i--)
                if (tk[i] >= ts_begin) {
                    if (tk[i] != ts_begin) duration = (tk[i] - ts_begin) * TIME_PRECISION;
                    break;
                }
            if (n > 0) rc = add_segment(out, &o, eot, seek, time_offset, time_offset + duration, tk, n, &r, err);
            seek += seg_frames;
        }
        if (!rc && o.word_timestamps && out->n_segments > first_new_segment) {
            int64_t nf = audio_frames - win_seek < win ? audio_frames - win_seek : win;
            if (nf >= 2)
                rc = kn_add_word_timestamps(w, &o, out->language, out->segments + first_new_segment,
                                            out->n_segments - first_new_segment, (int)nf, time_offset, &last_speech,
                                            err);
            /* as openai-whisper: continue after the last word rather than the last timestamp */
            double last_end = -1;
            for (int s = first_new_segment; s < out->n_segments; s++)
                if (out->segments[s].n_words) last_end = out->segments[s].words[out->segments[s].n_words - 1].end;
            if (!rc && !single_ending && !shortform && last_end > time_offset) seek = llround(last_end * 100.0);
        }
        if (!rc && shortform) seek = content_frames; /* one window, as transformers' short-form */
        /* remember the text for conditioning; reset after a hot fallback */
        for (int s = first_new_segment; !rc && s < out->n_segments; s++)
            if (ids_push(&all, out->segments[s].tokens, out->segments[s].n_tokens))
                rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (!o.condition_on_previous_text || r.temperature > 0.5f) prompt_reset_since = all.n;
        kn_decode_result_free(&r);
        if (rc) goto done;
        int stop = 0;
        for (int s = first_new_segment; o.on_segment && !stop && s < out->n_segments; s++)
            if ((stop = o.on_segment(o.on_segment_user, &out->segments[s]))) {
                /* the transcript ends with the segment the caller stopped at */
                for (int k = s + 1; k < out->n_segments; k++) {
                    free(out->segments[k].tokens);
                    free(out->segments[k].text);
                }
                out->n_segments = s + 1;
            }
        if (stop) break;
    }
    if (o.detok) {
        size_t len = 0;
        for (int i = 0; i < out->n_segments; i++) len += out->segments[i].text ? strlen(out->segments[i].text) : 0;
        out->text = malloc(len + 1);
        if (!out->text) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        size_t p = 0;
        for (int i = 0; i < out->n_segments; i++)
            if (out->segments[i].text) {
                size_t l = strlen(out->segments[i].text);
                memcpy(out->text + p, out->segments[i].text, l);
                p += l;
            }
        out->text[p] = 0;
    }
done:
    free(mel);
    free(window);
    free(all.v);
    kn_mel_free(mm);
    if (rc) kn_transcript_free(out);
    return rc;
}

/* ---- formats ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->n + (size_t)w + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = nc;
    }
}

/* "HH:MM:SS,mmm" (srt) or "HH:MM:SS.mmm" (vtt) */
static void stamp(sbuf *b, double s, char sep) {
    long ms = lround(s * 1000.0);
    if (ms < 0) ms = 0;
    sb_printf(b, "%02ld:%02ld:%02ld%c%03ld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, sep, ms % 1000);
}

static const char *trimmed(const char *t, size_t *len) {
    if (!t) t = "";
    while (*t == ' ') t++;
    size_t l = strlen(t);
    while (l > 0 && (t[l - 1] == ' ' || t[l - 1] == '\n')) l--;
    *len = l;
    return t;
}

kn_code kn_transcript_format(const kn_transcript *t, const char *format, const char *task, char **out,
                             kn_error *err) {
    *out = NULL;
    sbuf b = {0};
    size_t tl;
    if (!strcmp(format, "text")) {
        const char *s = trimmed(t->text, &tl);
        sb_printf(&b, "%.*s\n", (int)tl, s);
    } else if (!strcmp(format, "srt") || !strcmp(format, "vtt")) {
        int vtt = format[0] == 'v';
        if (vtt) sb_printf(&b, "WEBVTT\n\n");
        for (int i = 0; i < t->n_segments; i++) {
            const kn_segment *g = &t->segments[i];
            if (!vtt) sb_printf(&b, "%d\n", i + 1);
            stamp(&b, g->start, vtt ? '.' : ',');
            sb_printf(&b, " --> ");
            stamp(&b, g->end, vtt ? '.' : ',');
            const char *s = trimmed(g->text, &tl);
            sb_printf(&b, "\n%.*s\n\n", (int)tl, s);
        }
    } else if (!strcmp(format, "json") || !strcmp(format, "verbose_json")) {
        json_t *j = json_object();
        json_object_set_new(j, "text", json_string(t->text ? t->text : ""));
        if (format[0] == 'v') {
            json_object_set_new(j, "task", json_string(task ? task : "transcribe"));
            json_object_set_new(j, "language", json_string(t->language));
            json_object_set_new(j, "duration", json_real(t->duration));
            json_t *segs = json_array();
            for (int i = 0; i < t->n_segments; i++) {
                const kn_segment *g = &t->segments[i];
                json_t *s = json_object(), *tk = json_array();
                for (int k = 0; k < g->n_tokens; k++) json_array_append_new(tk, json_integer(g->tokens[k]));
                json_object_set_new(s, "id", json_integer(g->id));
                json_object_set_new(s, "seek", json_integer(g->seek));
                json_object_set_new(s, "start", json_real(g->start));
                json_object_set_new(s, "end", json_real(g->end));
                json_object_set_new(s, "text", json_string(g->text ? g->text : ""));
                json_object_set_new(s, "tokens", tk);
                json_object_set_new(s, "temperature", json_real(round(g->temperature * 1e6) / 1e6)); /* 0.2f -> 0.2 */
                json_object_set_new(s, "avg_logprob", json_real(g->avg_logprob));
                json_object_set_new(s, "compression_ratio", json_real(g->compression_ratio));
                json_object_set_new(s, "no_speech_prob", json_real(g->no_speech_prob));
                json_array_append_new(segs, s);
            }
            json_object_set_new(j, "segments", segs);
            json_t *words = NULL;
            for (int i = 0; i < t->n_segments; i++)
                for (int k = 0; k < t->segments[i].n_words; k++) {
                    const kn_word *wd = &t->segments[i].words[k];
                    if (!words) words = json_array();
                    json_array_append_new(words, json_pack("{s:s, s:f, s:f, s:f}", "word", wd->word, "start",
                                                           wd->start, "end", wd->end, "probability",
                                                           round(wd->probability * 1e6) / 1e6));
                }
            if (words) json_object_set_new(j, "words", words);
        }
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10));
        json_decref(j);
        if (!s) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        sb_printf(&b, "%s\n", s);
        free(s);
    } else {
        return kn_fail(err, KN_ERR_INVALID_ARG, "unknown format \"%s\" (text, json, verbose_json, srt, vtt)", format);
    }
    if (b.oom || !b.p) {
        free(b.p);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return KN_OK;
}

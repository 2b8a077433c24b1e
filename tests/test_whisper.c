/* test_whisper.c — the Whisper model and its decoding.
 *
 * Against transformers (fixtures from tools/fixtures/gen_whisper.py; a
 * missing fixture is a failure, never a skip):
 *  - encoder output rows and teacher-forced decoder logits of the tiny random
 *    Whisper given the oracle mel of jfk.wav: max |Δ| <= 1e-4 x max|logit|;
 *  - decode cases (greedy with/without timestamps, translate, language
 *    detection, beam 5): identical tokens to transformers.
 * Without an oracle (random model written here):
 *  - token-by-token decoding through the self-attention cache equals the
 *    teacher-forced pass;
 *  - several slots decode independently, and reorder() moves caches.
 * KILN_TEST_BACKEND=cuda runs it all on the GPU (skips without one). */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/transcribe.h"
#include "engine/word_timing.h"
#include "io/npy.h"
#include "models/whisper.h"
#include "audio/audio.h"
#include "test_backend.h"
#include "test_util.h"
#include "whisper_synth.h"
#include "tokenizer/tokenizer.h"

static const char *backend_name;

static double max_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}
static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, isnan(a[i]) || isnan(b[i]) ? INFINITY : fabs(a[i] - b[i]));
    return m;
}

/* ---- no oracle: cache consistency on a random model --------------------- */
/* a stand-in detokenizer for the synthetic model: id k -> " w" every fifth id, else "x" */
static kn_code fake_detok(void *user, const int32_t *ids, int n, char **text, kn_error *err) {
    (void)user, (void)err;
    char *t = malloc((size_t)n * 2 + 1);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] % 5 == 0) t[k++] = ' ';
        t[k++] = ids[i] % 5 == 0 ? 'w' : 'x';
    }
    t[k] = 0;
    *text = t;
    return KN_OK;
}

static void test_cache_consistency(void) {
    char dir[] = "/tmp/kiln_whisper_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    synth_whisper_shape sh = {.d = 48, .heads = 3, .ffn = 96, .enc_layers = 2, .dec_layers = 2, .n_mels = 80,
                              .n_text = 300, .n_ctx = 1500, .max_target = 64};
    CHECK(synth_whisper_write(dir, &sh, 5) == 0, "write synthetic whisper");
    kn_whisper *w = NULL;
    kn_error err = {0};
    kn_whisper_options o = {.backend = backend_name, .n_threads = 2, .max_slots = 3};
    kn_code rc = kn_whisper_open(dir, &o, &w, &err);
    CHECK(rc == KN_OK, "open synthetic whisper: %s", err.msg);
    if (rc) return;
    const int V = kn_whisper_cfg(w)->vocab_size, n = 12;
    float *mel = malloc(sizeof(float) * 80 * 3000);
    uint64_t s = 3;
    for (int i = 0; i < 80 * 3000; i++) mel[i] = kn_test_rand(&s);
    CHECK(kn_whisper_encode(w, mel, &err) == KN_OK, "encode: %s", err.msg);
    int32_t ids[12];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    float *full = malloc(sizeof(float) * (size_t)n * V), *step = malloc(sizeof(float) * (size_t)n * V);
    CHECK(kn_whisper_decode(w, 1, n, ids, 0, 1, full, &err) == KN_OK, "teacher-forced: %s", err.msg);
    /* prompt of 4, then one token at a time */
    CHECK(kn_whisper_decode(w, 1, 4, ids, 0, 0, step + 3 * V, &err) == KN_OK, "prompt: %s", err.msg);
    for (int i = 4; i < n; i++) CHECK(kn_whisper_decode(w, 1, 1, ids + i, i, 0, step + (size_t)i * V, &err) == KN_OK, "step");
    double scale = max_abs(full, (int64_t)n * V);
    double md = max_diff(full + 3 * V, step + 3 * V, (int64_t)(n - 3) * V);
    CHECK(md <= 2e-5 * scale, "cached decode vs teacher-forced: max |d| %g (scale %g)", md, scale);

    /* three slots: slot k decodes ids shifted by k; reorder so slot 0 takes slot 2 */
    int32_t multi[3 * 4];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) multi[k * 4 + i] = (int32_t)((ids[i] + k * 11) % V);
    float *lg = malloc(sizeof(float) * 3 * V), *one = malloc(sizeof(float) * V);
    CHECK(kn_whisper_decode(w, 3, 4, multi, 0, 0, lg, &err) == KN_OK, "3 slots: %s", err.msg);
    int src[3] = {2, 1, 2};
    CHECK(kn_whisper_reorder(w, 3, src, 4, &err) == KN_OK, "reorder: %s", err.msg);
    int32_t next[3] = {7, 8, 9};
    CHECK(kn_whisper_decode(w, 3, 1, next, 4, 0, lg, &err) == KN_OK, "3 slots step: %s", err.msg);
    /* reference: slot-2 history + 7, alone */
    int32_t hist[5];
    memcpy(hist, multi + 8, 4 * sizeof(int32_t));
    hist[4] = 7;
    float *ref = malloc(sizeof(float) * 5 * V);
    CHECK(kn_whisper_decode(w, 1, 5, hist, 0, 1, ref, &err) == KN_OK, "single");
    md = max_diff(lg, ref + 4 * V, V);
    CHECK(md <= 2e-5 * scale, "reordered slot 0 vs single decode: max |d| %g", md);
    hist[4] = 9;
    CHECK(kn_whisper_decode(w, 1, 5, hist, 0, 1, ref, &err) == KN_OK, "single");
    md = max_diff(lg + 2 * V, ref + 4 * V, V);
    CHECK(md <= 2e-5 * scale, "slot 2 vs single decode: max |d| %g", md);
    memcpy(hist, multi + 4, 4 * sizeof(int32_t));
    hist[4] = 8;
    CHECK(kn_whisper_decode(w, 1, 5, hist, 0, 1, ref, &err) == KN_OK, "single");
    md = max_diff(lg + V, ref + 4 * V, V);
    CHECK(md <= 2e-5 * scale, "slot 1 vs single decode: max |d| %g", md);

    /* long-form: 71 s of audio (jfk.wav, repeated) through the seek loop */
    {
        char path[1200];
        snprintf(path, sizeof path, "%s/audio/jfk.wav", kn_test_fixtures());
        float *pcm = NULL;
        int64_t n_pcm = 0;
        CHECK(kn_audio_load_file(path, 0, &pcm, &n_pcm, &err) == KN_OK, "jfk.wav: %s", err.msg);
        if (pcm) {
            int64_t total = 7 * n_pcm - 100000;
            float *longpcm = malloc(sizeof(float) * (size_t)total);
            for (int64_t i = 0; i < total; i++) longpcm[i] = pcm[i % n_pcm];
            kn_decode_options opt;
            kn_decode_options_default(&opt);
            opt.language = "en";
            opt.max_new_tokens = 16;
            opt.n_temperatures = 2; /* one fallback step is enough to exercise it */
            kn_transcript t;
            kn_code lrc = kn_transcribe(w, longpcm, total, &opt, &t, &err);
            CHECK(lrc == KN_OK, "long-form transcribe: %s", err.msg);
            if (!lrc) {
                CHECK(t.n_windows >= 3 && t.n_windows <= 64, "long-form: %d windows", t.n_windows);
                CHECK(fabs(t.duration - total / 16000.0) < 1e-9, "duration %g", t.duration);
                for (int i = 0; i < t.n_segments; i++) {
                    const kn_segment *g = &t.segments[i];
                    CHECK(g->start >= g->seek * 0.01 - 1e-9 && g->start <= g->end && g->end <= t.duration + 1e-9 &&
                              (i == 0 || g->seek >= t.segments[i - 1].seek),
                          "segment %d: seek %lld, %g..%g", i, (long long)g->seek, g->start, g->end);
                }
                kn_transcript_free(&t);
            }
            /* the same with word timestamps (seek continues after the last word) */
            opt.word_timestamps = 1;
            opt.detok = fake_detok;
            lrc = kn_transcribe(w, longpcm, total, &opt, &t, &err);
            CHECK(lrc == KN_OK, "long-form transcribe with word timestamps: %s", err.msg);
            if (!lrc) {
                double prev = 0;
                int nw = 0;
                for (int i = 0; i < t.n_segments; i++)
                    for (int k = 0; k < t.segments[i].n_words; k++, nw++) {
                        const kn_word *wd = &t.segments[i].words[k];
                        CHECK(wd->start >= prev - 0.02 && wd->start <= wd->end && wd->end <= t.duration + 1e-9,
                              "long-form word %d: %g..%g after %g", nw, wd->start, wd->end, prev);
                        prev = wd->end;
                    }
                CHECK(t.n_windows >= 3 && nw > 0, "long-form words: %d windows, %d words", t.n_windows, nw);
                kn_transcript_free(&t);
            }
            free(longpcm);
            free(pcm);
        }
    }

    /* bad arguments are errors */
    CHECK(kn_whisper_decode(w, 4, 1, next, 0, 0, lg, &err) == KN_ERR_INVALID_ARG, "4 slots accepted");
    CHECK(kn_whisper_decode(w, 1, 1, next, 64, 0, lg, &err) == KN_ERR_INVALID_ARG, "position past the end accepted");
    int32_t bad = V;
    CHECK(kn_whisper_decode(w, 1, 1, &bad, 0, 0, lg, &err) == KN_ERR_INVALID_ARG, "token out of range accepted");
    free(mel), free(full), free(step), free(lg), free(one), free(ref);
    kn_whisper_close(w);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup failed\n");
}

/* ---- oracle: transformers ------------------------------------------------ */
typedef struct {
    json_t *ref;
    float *mel; /* [80, 3000] rebuilt from head + tail */
    char dir[1024];
} oracle;

static int oracle_load(oracle *o) {
    snprintf(o->dir, sizeof o->dir, "%s/whisper", kn_test_fixtures());
    char path[1200];
    snprintf(path, sizeof path, "%s/reference.json", o->dir);
    json_error_t je;
    o->ref = json_load_file(path, 0, &je);
    if (!o->ref) {
        CHECK(0, "cannot read %s: %s", path, je.text);
        return -1;
    }
    kn_error err = {0};
    float *head = NULL, *tail = NULL;
    int nd;
    int64_t hs[4], ts[4];
    snprintf(path, sizeof path, "%s/mel80_head.npy", o->dir);
    kn_code rc = kn_npy_read_f32(path, &head, &nd, hs, &err);
    snprintf(path, sizeof path, "%s/mel80_tail.npy", o->dir);
    if (!rc) rc = kn_npy_read_f32(path, &tail, &nd, ts, &err);
    if (rc || hs[0] != 80 || ts[0] != 80) {
        CHECK(0, "oracle mel: %s", err.msg);
        free(head), free(tail);
        return -1;
    }
    o->mel = malloc(sizeof(float) * 80 * 3000);
    for (int j = 0; j < 80; j++)
        for (int t = 0; t < 3000; t++) o->mel[j * 3000 + t] = t < hs[1] ? head[j * hs[1] + t] : tail[j];
    free(head), free(tail);
    return 0;
}

static int read_ids(json_t *arr, int32_t *out, int max) {
    int n = 0;
    for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr) && n < max; i++)
        out[n++] = (int32_t)json_integer_value(json_array_get(arr, i));
    return n;
}

static void test_oracle_logits(oracle *o, kn_whisper *w) {
    kn_error err = {0};
    char path[1200];
    float *enc_ref = NULL, *lg_ref = NULL;
    int nd;
    int64_t es[4], ls[4];
    snprintf(path, sizeof path, "%s/encoder_head.npy", o->dir);
    if (kn_npy_read_f32(path, &enc_ref, &nd, es, &err) == KN_OK) {
        const kn_whisper_config *c = kn_whisper_cfg(w);
        float *enc = malloc(sizeof(float) * (size_t)c->max_source_positions * c->d_model);
        kn_whisper_encoder_output(w, enc);
        double md = max_diff(enc, enc_ref, es[0] * es[1]), sc = max_abs(enc_ref, es[0] * es[1]);
        CHECK(es[1] == c->d_model && md <= 1e-4 * sc, "encoder output: max |d| %g (scale %g)", md, sc);
        printf("encoder vs transformers: max |d| = %.3g (max |x| %.3g)\n", md, sc);
        free(enc);
    } else {
        CHECK(0, "%s", err.msg);
    }
    snprintf(path, sizeof path, "%s/logits.npy", o->dir);
    int32_t ids[512];
    int n = read_ids(json_object_get(o->ref, "teacher_ids"), ids, 512);
    if (kn_npy_read_f32(path, &lg_ref, &nd, ls, &err) == KN_OK && n == ls[0]) {
        float *lg = malloc(sizeof(float) * (size_t)(ls[0] * ls[1]));
        kn_code rc = kn_whisper_decode(w, 1, n, ids, 0, 1, lg, &err);
        CHECK(rc == KN_OK, "teacher-forced decode: %s", err.msg);
        double md = max_diff(lg, lg_ref, ls[0] * ls[1]), sc = max_abs(lg_ref, ls[0] * ls[1]);
        CHECK(md <= 1e-4 * sc, "decoder logits: max |d| %g > 1e-4 x %g", md, sc);
        printf("logits vs transformers: max |d| = %.3g (max |logit| %.3g)\n", md, sc);
        free(lg);
    } else {
        CHECK(0, "logits fixture: %s (ids %d)", err.msg, n);
    }
    free(enc_ref), free(lg_ref);
}

/* Decode cases: kiln's decoder over the oracle mel gives transformers' tokens. */
static void test_oracle_decode(oracle *o, kn_whisper *w) {
    json_t *cases = json_object_get(o->ref, "cases");
    size_t i;
    json_t *cs;
    int n_checked = 0;
    json_array_foreach(cases, i, cs) {
        const char *name = json_string_value(json_object_get(cs, "name"));
        const char *lang = json_string_value(json_object_get(cs, "language"));
        const char *task = json_string_value(json_object_get(cs, "task"));
        int ts = json_is_true(json_object_get(cs, "timestamps"));
        int beams = (int)json_integer_value(json_object_get(cs, "num_beams"));
        int max_new = (int)json_integer_value(json_object_get(cs, "max_new_tokens"));
        int32_t want[512], prompt[64];
        int n_want, n_prompt = read_ids(json_object_get(cs, "prompt"), prompt, 64);
        json_t *toks = json_object_get(cs, "tokens");
        if (toks) {
            n_want = read_ids(toks, want, 512);
        } else {
            /* beam cases: transformers' generate output after the prompt, eot dropped */
            json_t *seq = json_object_get(json_object_get(cs, "hf_generate"), "sequences");
            if (!seq) {
                CHECK(0, "%s: no oracle tokens (%s)", name,
                      json_string_value(json_object_get(json_object_get(cs, "hf_generate"), "error")));
                continue;
            }
            int32_t all[600];
            int n_all = read_ids(seq, all, 600), k = 0;
            /* with or without the prompt (and its <|startofprev|> prefix) */
            int sot_at = 0;
            while (sot_at < n_prompt && prompt[sot_at] != kn_whisper_cfg(w)->decoder_start_token_id) sot_at++;
            if (n_all >= n_prompt && !memcmp(all, prompt, sizeof(int32_t) * (size_t)n_prompt)) k = n_prompt;
            else if (n_all >= n_prompt - sot_at &&
                     !memcmp(all, prompt + sot_at, sizeof(int32_t) * (size_t)(n_prompt - sot_at)))
                k = n_prompt - sot_at;
            n_want = 0;
            for (; k < n_all; k++) want[n_want++] = all[k];
        }
        kn_decode_options opt;
        kn_decode_options_default(&opt);
        opt.language = lang;
        opt.task = task && !strcmp(task, "translate") ? KN_TASK_TRANSLATE : KN_TASK_TRANSCRIBE;
        opt.timestamps = ts;
        opt.beam_size = beams;
        opt.max_new_tokens = max_new;
        int32_t prev[256];
        int n_prev = read_ids(json_object_get(cs, "prev"), prev, 256);
        kn_decode_result r;
        kn_error err = {0};
        kn_code rc = kn_whisper_decode_window(w, o->mel, n_prev ? prev : NULL, n_prev, &opt, 0.0f, &r, &err);
        CHECK(rc == KN_OK, "%s: %s", name, err.msg);
        if (rc) continue;
        /* compare generated tokens; eot counts when the oracle includes it */
        int n_got = r.n_tokens;
        int32_t got[600];
        memcpy(got, r.tokens, sizeof(int32_t) * (size_t)n_got);
        if (n_want > 0 && want[n_want - 1] != r.eot && n_got > 0 && got[n_got - 1] == r.eot) n_got--;
        if (n_want > 0 && want[n_want - 1] == r.eot && !(n_got > 0 && got[n_got - 1] == r.eot)) got[n_got++] = r.eot;
        int same = n_got == n_want && !memcmp(got, want, sizeof(int32_t) * (size_t)n_want);
        CHECK(same, "%s: tokens differ from transformers (got %d, want %d tokens)", name, n_got, n_want);
        if (!same) {
            fprintf(stderr, "  got :");
            for (int k = 0; k < n_got; k++) fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n  want:");
            for (int k = 0; k < n_want; k++) fprintf(stderr, " %d", want[k]);
            fprintf(stderr, "\n");
        }
        json_t *alp = json_object_get(cs, "avg_logprob");
        if (json_is_number(alp))
            CHECK(fabs(r.avg_logprob - json_number_value(alp)) <= 1e-4 * fabs(json_number_value(alp)) + 1e-5,
                  "%s: avg_logprob %g, transformers %g", name, r.avg_logprob, json_number_value(alp));
        if (!lang) {
            int want_lang = (int)json_integer_value(json_object_get(o->ref, "detected_language_id"));
            CHECK(r.language_token == want_lang, "%s: detected language token %d, want %d", name, r.language_token,
                  want_lang);
        }
        json_t *crt = json_object_get(cs, "compression_ratio_tokens");
        if (json_is_number(crt))
            CHECK(fabs(r.compression_ratio - json_number_value(crt)) <= 1e-9 * json_number_value(crt),
                  "%s: compression ratio %g, transformers %g", name, r.compression_ratio, json_number_value(crt));
        json_t *case_nsp = json_object_get(cs, "no_speech_prob");
        double nsp = json_number_value(case_nsp ? case_nsp : json_object_get(o->ref, "no_speech_prob"));
        CHECK(fabs(r.no_speech_prob - nsp) <= 1e-4 * nsp + 1e-6, "%s: no_speech_prob %g, want %g", name,
              r.no_speech_prob, nsp);
        kn_decode_result_free(&r);
        n_checked++;
    }
    CHECK(n_checked >= 6, "only %d decode cases checked", n_checked);
    printf("decode cases identical to transformers: %d\n", n_checked);
}

static kn_code detok(void *user, const int32_t *ids, int n, char **text, kn_error *err) {
    size_t len;
    return kn_tokenizer_decode(user, ids, n, 1, text, &len, err);
}

/* kn_transcribe end to end (audio -> kiln mel -> decode -> text) equals
 * transformers' greedy text for the no-timestamps case. */
static void test_oracle_text(oracle *o, kn_whisper *w) {
    kn_tokenizer *tk = NULL;
    kn_error err = {0};
    CHECK(kn_tokenizer_load(o->dir, &tk, &err) == KN_OK, "tokenizer: %s", err.msg);
    if (!tk) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/audio/jfk.wav", kn_test_fixtures());
    float *pcm = NULL;
    int64_t n = 0;
    CHECK(kn_audio_load_file(path, 0, &pcm, &n, &err) == KN_OK, "jfk.wav: %s", err.msg);
    json_t *cs = NULL, *c;
    size_t i;
    json_array_foreach(json_object_get(o->ref, "cases"), i, c) if (!strcmp(json_string_value(json_object_get(c, "name")),
                                                                           "greedy_en_notimestamps")) cs = c;
    if (pcm && cs) {
        kn_decode_options opt;
        kn_decode_options_default(&opt);
        opt.language = "en";
        opt.timestamps = 0;
        opt.n_temperatures = 1;
        opt.no_speech_threshold = NAN;
        opt.max_new_tokens = (int)json_integer_value(json_object_get(cs, "max_new_tokens"));
        opt.detok = detok;
        opt.detok_user = tk;
        kn_transcript t;
        kn_code rc = kn_transcribe(w, pcm, n, &opt, &t, &err);
        CHECK(rc == KN_OK, "transcribe: %s", err.msg);
        const char *want = json_string_value(json_object_get(cs, "text"));
        if (!rc) CHECK(want && t.text && !strcmp(t.text, want), "transcript text '%s', transformers '%s'", t.text, want);
        if (!rc) kn_transcript_free(&t);
    }
    free(pcm);
    kn_tokenizer_free(tk);
}

/* streaming: on_segment sees every segment in order; non-zero stops */
static int count_segments(void *user, const kn_segment *s) {
    int *c = user;
    if (s->id != c[0]) c[2] = 1; /* out of order */
    c[0]++;
    return c[1] > 0 && c[0] >= c[1];
}

static void test_segment_callback(kn_whisper *w) {
    char path[1200];
    snprintf(path, sizeof path, "%s/audio/jfk.wav", kn_test_fixtures());
    float *pcm = NULL;
    int64_t n = 0;
    kn_error err = {0};
    if (kn_audio_load_file(path, 0, &pcm, &n, &err)) {
        CHECK(0, "jfk.wav: %s", err.msg);
        return;
    }
    kn_decode_options opt;
    kn_decode_options_default(&opt);
    opt.language = "en";
    opt.n_temperatures = 1;
    opt.no_speech_threshold = NAN;
    opt.max_new_tokens = 24;
    int c[3] = {0, 0, 0};
    opt.on_segment = count_segments;
    opt.on_segment_user = c;
    kn_transcript t;
    kn_code rc = kn_transcribe(w, pcm, n, &opt, &t, &err);
    CHECK(rc == KN_OK && t.n_segments >= 2 && c[0] == t.n_segments && !c[2], "segment callbacks %d of %d segments: %s",
          c[0], rc ? -1 : t.n_segments, err.msg);
    for (int i = 0; !rc && i < t.n_segments; i++)
        CHECK(t.segments[i].start <= t.segments[i].end && t.segments[i].end <= t.duration + 1e-9 &&
                  (i == 0 || t.segments[i].start >= t.segments[i - 1].start),
              "segment %d times %g..%g", i, t.segments[i].start, t.segments[i].end);
    if (!rc) kn_transcript_free(&t);
    c[0] = 0, c[1] = 1;
    rc = kn_transcribe(w, pcm, n, &opt, &t, &err);
    CHECK(rc == KN_OK && t.n_segments == 1 && c[0] == 1, "stop after the first segment: %d segments", rc ? -1 : t.n_segments);
    if (!rc) kn_transcript_free(&t);
    free(pcm);
}

/* ---- word timestamps vs transformers ---------------------------------------- */

/* transformers' word (its text without the "<|endoftext|>" that its decode
 * writes for eot) equals kiln's */
static int same_word(const char *theirs, const char *ours) {
    char buf[1024];
    const char *e = strstr(theirs, "<|endoftext|>");
    if (e && strlen(theirs) < sizeof buf) {
        size_t k = (size_t)(e - theirs);
        memcpy(buf, theirs, k);
        strcpy(buf + k, e + 13);
        theirs = buf;
    }
    return !strcmp(theirs, ours);
}

static void test_oracle_words(oracle *o, kn_whisper *w) {
    json_t *wt = json_object_get(o->ref, "word_timestamps");
    if (!wt || json_object_get(wt, "error")) {
        CHECK(0, "reference.json has no word_timestamps oracle (%s)",
              wt ? json_string_value(json_object_get(wt, "error")) : "run tools/fixtures/gen_whisper.py");
        return;
    }
    kn_error err = {0};
    const kn_whisper_config *c = kn_whisper_cfg(w);
    /* alignment heads from generation_config */
    json_t *heads = json_object_get(wt, "alignment_heads");
    CHECK((int)json_array_size(heads) == c->n_align, "alignment heads: %d, generation_config has %zu", c->n_align,
          json_array_size(heads));
    for (int a = 0; a < c->n_align && a < (int)json_array_size(heads); a++)
        CHECK(c->align_layer[a] == json_integer_value(json_array_get(json_array_get(heads, a), 0)) &&
                  c->align_head[a] == json_integer_value(json_array_get(json_array_get(heads, a), 1)),
              "alignment head %d", a);
    /* 1. cross-attention weights of the alignment heads (softmax over all 1500 positions) */
    int32_t seq[512];
    int T = read_ids(json_object_get(wt, "teacher_sequence"), seq, 512);
    char path[1200];
    snprintf(path, sizeof path, "%s/cross_attn_align.npy", o->dir);
    float *want = NULL;
    int nd = 0;
    int64_t sh[4] = {0};
    kn_code rc = kn_npy_read_f32(path, &want, &nd, sh, &err);
    CHECK(rc == KN_OK && nd == 3 && sh[0] == c->n_align && sh[1] == T && sh[2] == 1500, "%s: %s", path, err.msg);
    if (!rc && nd == 3 && sh[0] == c->n_align && sh[1] == T && sh[2] == 1500) {
        float *qk = malloc(sizeof(float) * (size_t)c->n_align * T * 1500);
        CHECK(kn_whisper_encode(w, o->mel, &err) == KN_OK, "encode: %s", err.msg);
        rc = kn_whisper_cross_qk(w, seq, T, 1500, qk, NULL, &err);
        CHECK(rc == KN_OK, "cross qk: %s", err.msg);
        double md = 0, mx = 0;
        for (int64_t r = 0; !rc && r < (int64_t)c->n_align * T; r++) {
            float *x = qk + r * 1500;
            double m = x[0], s = 0;
            for (int f = 1; f < 1500; f++) m = x[f] > m ? x[f] : m;
            for (int f = 0; f < 1500; f++) s += exp(x[f] - m);
            for (int f = 0; f < 1500; f++) {
                double p = exp(x[f] - m) / s, d = fabs(p - want[r * 1500 + f]);
                md = d > md ? d : md;
                mx = p > mx ? p : mx;
            }
        }
        CHECK(!rc && md <= 1e-4 * mx, "alignment-head cross-attention: max |d| %g (max %g)", md, mx);
        printf("alignment-head cross-attention vs transformers: max |d| %.3g (max weight %.3g)\n", md, mx);
        free(qk);
    }
    free(want);
    /* 2. jump times (openai-whisper's find_alignment on the same tokens, via transformers' filters and DTW) */
    json_t *os = json_object_get(wt, "openai_style");
    int n_prompt = (int)json_integer_value(json_object_get(wt, "n_prompt"));
    int num_frames = (int)json_integer_value(json_object_get(wt, "num_frames"));
    json_t *jt = json_object_get(os, "jump_times");
    CHECK(os && jt && n_prompt == 4 && T > n_prompt + 1, "openai_style jump times missing");
    if (os && jt && n_prompt == 4 && T > n_prompt + 1) {
        int n_text = T - n_prompt - 1;
        double *jumps = malloc(sizeof(double) * (size_t)(n_text + 1)), *probs = malloc(sizeof(double) * (size_t)n_text);
        CHECK(kn_whisper_encode(w, o->mel, &err) == KN_OK, "encode: %s", err.msg);
        rc = kn_word_jump_times(w, seq, 3, seq + n_prompt, n_text, num_frames, jumps, probs, &err);
        CHECK(rc == KN_OK, "jump times: %s", err.msg);
        CHECK((int)json_array_size(jt) == n_text + 1, "oracle has %zu jump times, want %d", json_array_size(jt),
              n_text + 1);
        int bad = 0;
        for (int k = 0; !rc && k <= n_text && k < (int)json_array_size(jt); k++)
            bad += fabs(jumps[k] - json_number_value(json_array_get(jt, k))) > 1e-9;
        CHECK(!rc && bad == 0, "%d of %d jump times differ from transformers' DTW", bad, n_text + 1);
        printf("word jump times identical to transformers' DTW: %d\n", rc || bad ? 0 : n_text + 1);
        free(jumps), free(probs);
    }
    /* 3. word grouping + punctuation merging (transformers' copy of openai-whisper's) */
    kn_tokenizer *tk = NULL;
    CHECK(kn_tokenizer_load(o->dir, &tk, &err) == KN_OK, "tokenizer: %s", err.msg);
    json_t *ws = json_object_get(json_object_get(wt, "word_splits"), "cases");
    CHECK(json_array_size(ws) >= 8, "word split cases missing (%s)",
          json_string_value(json_object_get(wt, "word_splits_error")));
    size_t i;
    json_t *cs;
    int n_cases = 0;
    json_array_foreach(ws, i, cs) {
        if (!tk) break;
        int32_t toks[512];
        int n = read_ids(json_object_get(cs, "tokens"), toks, 512);
        int by_unicode = !strcmp(json_string_value(json_object_get(cs, "language")), "japanese");
        kn_word_span *sp = NULL;
        int ns = 0;
        rc = kn_word_split(detok, tk, c->eos_token_id, toks, n, by_unicode, &sp, &ns, &err);
        if (!rc) rc = kn_word_merge_punctuations(sp, ns, KN_PREPEND_PUNCTUATIONS, KN_APPEND_PUNCTUATIONS, &err);
        CHECK(rc == KN_OK, "word split case %zu: %s", i, err.msg);
        json_t *words = json_object_get(cs, "words"), *wtok = json_object_get(cs, "word_tokens");
        int k = 0, ok = !rc;
        for (size_t q = 0; ok && q < json_array_size(words); q++) {
            const char *theirs = json_string_value(json_array_get(words, q));
            while (k < ns && !sp[k].text[0]) k++;
            int32_t wt_ids[256];
            int nw = read_ids(json_array_get(wtok, q), wt_ids, 256);
            ok = k < ns && !strcmp(theirs, sp[k].text) && nw == sp[k].count &&
                 !memcmp(wt_ids, toks + sp[k].first, sizeof(int32_t) * (size_t)nw);
            if (!ok) CHECK(0, "word split case %zu (%s): word %zu '%s' vs kiln '%s'", i,
                           json_string_value(json_object_get(cs, "language")), q, theirs, k < ns ? sp[k].text : "-");
            k++;
        }
        while (ok && k < ns && !sp[k].text[0]) k++;
        if (ok) CHECK(k == ns, "word split case %zu: kiln has %d extra words", i, ns - k);
        n_cases += ok && k == ns;
        kn_word_spans_free(sp, ns);
    }
    printf("word split cases identical to transformers: %d\n", n_cases);
    /* 4. find_alignment (words with start / end) on several token lists vs transformers' pieces */
    json_t *ac = json_object_get(wt, "alignment_cases");
    CHECK(json_array_size(ac) >= 3, "alignment cases missing (%s)",
          json_string_value(json_object_get(wt, "alignment_cases_error")));
    int n_align_ok = 0;
    json_array_foreach(ac, i, cs) {
        if (!tk) break;
        int32_t text[512], sot3[3] = {seq[0], seq[1], seq[2]};
        int n = read_ids(json_object_get(cs, "text_tokens"), text, 512);
        CHECK(kn_whisper_encode(w, o->mel, &err) == KN_OK, "encode: %s", err.msg);
        kn_word_span *sp = NULL;
        int ns = 0;
        rc = kn_word_find_alignment(w, sot3, 3, text, n, num_frames, detok, tk, 0, &sp, &ns, &err);
        CHECK(rc == KN_OK, "find_alignment case %zu: %s", i, err.msg);
        json_t *words = json_object_get(cs, "words");
        int ok = !rc && ns == (int)json_array_size(words);
        for (int k = 0; ok && k < ns; k++) {
            json_t *wd = json_array_get(words, (size_t)k);
            int32_t wt_ids[256];
            int nw = read_ids(json_object_get(wd, "tokens"), wt_ids, 256);
            ok = same_word(json_string_value(json_object_get(wd, "word")), sp[k].text) && nw == sp[k].count &&
                 !memcmp(wt_ids, text + sp[k].first, sizeof(int32_t) * (size_t)nw) &&
                 fabs(sp[k].start - json_number_value(json_object_get(wd, "start"))) < 1e-9 &&
                 fabs(sp[k].end - json_number_value(json_object_get(wd, "end"))) < 1e-9;
            if (!ok)
                CHECK(0, "find_alignment case %zu word %d: kiln '%s' %.2f..%.2f, transformers '%s' %.2f..%.2f", i, k,
                      sp[k].text, sp[k].start, sp[k].end, json_string_value(json_object_get(wd, "word")),
                      json_number_value(json_object_get(wd, "start")), json_number_value(json_object_get(wd, "end")));
        }
        if (!rc && ns != (int)json_array_size(words))
            CHECK(0, "find_alignment case %zu: %d words, transformers %zu", i, ns, json_array_size(words));
        n_align_ok += ok;
        kn_word_spans_free(sp, ns);
    }
    printf("find_alignment word cases identical to transformers: %d\n", n_align_ok);
    /* 5. kn_transcribe with word timestamps: words in order, inside the audio, spelling the transcript */
    snprintf(path, sizeof path, "%s/audio/jfk.wav", kn_test_fixtures());
    float *pcm = NULL;
    int64_t n_pcm = 0;
    if (tk && kn_audio_load_file(path, 0, &pcm, &n_pcm, &err) == KN_OK) {
        kn_decode_options opt;
        kn_decode_options_default(&opt);
        opt.language = "en", opt.timestamps = 0, opt.n_temperatures = 1, opt.max_new_tokens = 24;
        opt.word_timestamps = 1, opt.detok = detok, opt.detok_user = tk;
        kn_transcript t;
        rc = kn_transcribe(w, pcm, n_pcm, &opt, &t, &err);
        CHECK(rc == KN_OK, "transcribe with word timestamps: %s", err.msg);
        if (!rc) {
            int ok = 1, nwords = 0;
            double prev_end = 0;
            char spelled[4096] = "";
            for (int s = 0; s < t.n_segments; s++)
                for (int q = 0; q < t.segments[s].n_words; q++, nwords++) {
                    const kn_word *wd = &t.segments[s].words[q];
                    ok &= wd->start <= wd->end && wd->start >= prev_end - 1e-9 && wd->end <= t.duration + 1e-9 &&
                          wd->word[0] && wd->probability > 0 && wd->probability <= 1;
                    prev_end = wd->end;
                    if (strlen(spelled) + strlen(wd->word) < sizeof spelled) strcat(spelled, wd->word);
                }
            CHECK(ok && nwords > 0 && t.text && !strcmp(spelled, t.text), "transcript words: %d words '%s' vs '%s'",
                  nwords, spelled, t.text ? t.text : "");
            kn_transcript_free(&t);
        }
    }
    free(pcm);
    kn_tokenizer_free(tk);
}

static void test_oracle(void) {
    oracle o = {0};
    if (oracle_load(&o)) return;
    kn_whisper *w = NULL;
    kn_error err = {0};
    kn_whisper_options opt = {.backend = backend_name, .n_threads = 2, .max_slots = 5};
    kn_code rc = kn_whisper_open(o.dir, &opt, &w, &err);
    CHECK(rc == KN_OK, "open fixture: %s", err.msg);
    if (!rc) {
        rc = kn_whisper_encode(w, o.mel, &err);
        CHECK(rc == KN_OK, "encode: %s", err.msg);
        if (!rc) test_oracle_logits(&o, w);
        test_oracle_decode(&o, w);
        test_segment_callback(w);
        test_oracle_text(&o, w);
        test_oracle_words(&o, w);
        kn_whisper_close(w);
    }
    free(o.mel);
    json_decref(o.ref);
}

/* ---- output formats (SubRip / WebVTT / OpenAI verbose_json layouts) -------- */
static void test_formats(void) {
    int32_t t0[] = {5, 6}, t1[] = {7};
    kn_segment segs[2] = {
        {.id = 0, .seek = 0, .start = 0.0, .end = 3.5, .tokens = t0, .n_tokens = 2, .text = " And so my fellow",
         .avg_logprob = -0.25, .compression_ratio = 1.5, .no_speech_prob = 0.01},
        {.id = 1, .seek = 0, .start = 3.5, .end = 3661.042, .tokens = t1, .n_tokens = 1, .text = " Americans.",
         .temperature = 0.2f, .avg_logprob = -0.5, .compression_ratio = 1.0, .no_speech_prob = 0.02},
    };
    kn_transcript t = {.segments = segs, .n_segments = 2, .language = "en", .text = " And so my fellow Americans.",
                       .duration = 11.0};
    char *out = NULL;
    kn_error err = {0};
    CHECK(kn_transcript_format(&t, "srt", "transcribe", &out, &err) == KN_OK, "srt: %s", err.msg);
    const char *srt = "1\n00:00:00,000 --> 00:00:03,500\nAnd so my fellow\n\n"
                      "2\n00:00:03,500 --> 01:01:01,042\nAmericans.\n\n";
    CHECK(out && !strcmp(out, srt), "srt output:\n%s", out ? out : "(null)");
    free(out);
    CHECK(kn_transcript_format(&t, "vtt", "transcribe", &out, &err) == KN_OK, "vtt: %s", err.msg);
    const char *vtt = "WEBVTT\n\n00:00:00.000 --> 00:00:03.500\nAnd so my fellow\n\n"
                      "00:00:03.500 --> 01:01:01.042\nAmericans.\n\n";
    CHECK(out && !strcmp(out, vtt), "vtt output:\n%s", out ? out : "(null)");
    free(out);
    CHECK(kn_transcript_format(&t, "text", "transcribe", &out, &err) == KN_OK && out &&
              !strcmp(out, "And so my fellow Americans.\n"), "text output: %s", out ? out : "(null)");
    free(out);
    CHECK(kn_transcript_format(&t, "json", "transcribe", &out, &err) == KN_OK && out &&
              !strcmp(out, "{\"text\":\" And so my fellow Americans.\"}\n"), "json output: %s", out ? out : "(null)");
    free(out);
    CHECK(kn_transcript_format(&t, "verbose_json", "translate", &out, &err) == KN_OK, "verbose_json: %s", err.msg);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECK(j != NULL, "verbose_json does not parse: %s", out ? out : "(null)");
    if (j) {
        json_t *s1 = json_array_get(json_object_get(j, "segments"), 1);
        CHECK(!strcmp(json_string_value(json_object_get(j, "task")), "translate") &&
                  !strcmp(json_string_value(json_object_get(j, "language")), "en") &&
                  json_real_value(json_object_get(j, "duration")) == 11.0 &&
                  json_array_size(json_object_get(j, "segments")) == 2 &&
                  json_integer_value(json_object_get(s1, "id")) == 1 &&
                  fabs(json_real_value(json_object_get(s1, "end")) - 3661.042) < 1e-9 &&
                  !strcmp(json_string_value(json_object_get(s1, "text")), " Americans.") &&
                  json_integer_value(json_array_get(json_object_get(s1, "tokens"), 0)) == 7 &&
                  fabs(json_real_value(json_object_get(s1, "temperature")) - 0.2) < 1e-6 &&
                  json_object_get(s1, "avg_logprob") && json_object_get(s1, "compression_ratio") &&
                  json_object_get(s1, "no_speech_prob") && json_object_get(s1, "seek"),
              "verbose_json fields: %s", out);
        json_decref(j);
    }
    free(out);
    CHECK(kn_transcript_format(&t, "docx", "transcribe", &out, &err) == KN_ERR_INVALID_ARG, "unknown format accepted");
}

int main(void) {
    backend_name = getenv("KILN_TEST_BACKEND");
    const int brc = kn_test_backend_probe("test_whisper");
    if (brc) return brc;
    test_formats();
    test_cache_consistency();
    test_oracle();
    return kn_test_done("test_whisper");
}

/* transcribe.h — Whisper decoding: the library API behind `kiln transcribe`
 * and /v1/audio/transcriptions.
 *
 * Two levels:
 *  - kn_whisper_decode_window: one 30 s log-mel window at one temperature:
 *    language detection, the SOT prompt (with optional previous-text
 *    prefix), logit rules (begin suppression, suppress_tokens, timestamp
 *    rules), greedy / beam search (transformers' semantics) / sampling.
 *  - kn_transcribe: audio of any length: log-mel, the seek loop over 30 s
 *    windows, the temperature fallback ladder (compression ratio, average
 *    log-probability), no-speech skipping, conditioning on previous text and
 *    segment timestamps, as openai-whisper's transcribe() does.
 * Text comes from a caller-supplied detokenizer (the tokenizer module), so
 * this layer needs only token ids. Results own their memory; free them with
 * the matching *_free. Not thread-safe per kn_whisper (one decode at a time).
 *
 * Usage (what /v1/audio/transcriptions needs):
 *   kn_whisper *w;  kn_whisper_open(dir, &(kn_whisper_options){.max_slots = 5}, &w, &err);
 *   float *pcm; int64_t n;  kn_audio_load_memory(upload, upload_len, 0, &pcm, &n, &err);
 *   kn_decode_options o;  kn_decode_options_default(&o);
 *   o.language = "en";  o.detok = my_detok;  o.detok_user = tokenizer;   (o.on_segment for SSE)
 *   kn_transcript t;  kn_transcribe(w, pcm, n, &o, &t, &err);
 *   char *body;  kn_transcript_format(&t, "verbose_json", "transcribe", &body, &err);
 *   free(body); kn_transcript_free(&t); free(pcm); kn_whisper_close(w); */
#ifndef KN_ENGINE_TRANSCRIBE_H
#define KN_ENGINE_TRANSCRIBE_H

#include <stdint.h>

#include "base/status.h"
#include "models/whisper.h"

typedef enum { KN_TASK_TRANSCRIBE = 0, KN_TASK_TRANSLATE = 1 } kn_whisper_task;

/* ids -> UTF-8 text (malloc'd, NUL-terminated); user is the caller's. */
typedef kn_code (*kn_detok_fn)(void *user, const int32_t *ids, int n_ids, char **text, kn_error *err);

#define KN_MAX_TEMPERATURES 16

struct kn_segment;

typedef struct {
    const char *language; /* "en", ...; NULL = detect from the first window */
    kn_whisper_task task;
    int timestamps;       /* 1: timestamp tokens (segment times); 0: <|notimestamps|> */
    int beam_size;        /* 1 = greedy; > 1 = beam search at temperature 0 */
    float length_penalty; /* beam score = sum logprob / generated_len^length_penalty (1.0) */
    int max_new_tokens;   /* per window; 0 = max_target_positions / 2 */
    /* fallback ladder: decode at temperatures[0]; on failure retry at the next */
    int n_temperatures;
    float temperatures[KN_MAX_TEMPERATURES];
    double compression_ratio_threshold; /* 2.4; 0 = off */
    double logprob_threshold;           /* -1.0; NAN = off */
    double no_speech_threshold;         /* 0.6; NAN = off */
    int condition_on_previous_text;     /* 1 */
    const int32_t *initial_prompt;      /* text token ids (may be NULL) */
    int n_initial_prompt;
    uint64_t seed;                      /* sampling at temperature > 0 */
    kn_detok_fn detok;                  /* NULL: segments carry tokens only */
    void *detok_user;
    /* called with each finished segment as it is produced (streaming, SSE);
     * return non-zero to stop transcribing (kn_transcribe then returns
     * KN_OK with the segments up to and including that one). May be NULL. */
    int (*on_segment)(void *user, const struct kn_segment *segment);
    void *on_segment_user;
    int word_timestamps;                /* 1: per-word times (cross-attention DTW) in each segment */
} kn_decode_options;

/* openai-whisper's defaults: greedy, timestamps on, ladder 0,0.2,..,1.0,
 * thresholds 2.4 / -1.0 / 0.6, conditioning on previous text. */
void kn_decode_options_default(kn_decode_options *o);

typedef struct {
    int32_t *tokens;        /* generated ids after the prompt (eot included if emitted) */
    int n_tokens;
    int eot;                /* the <|endoftext|> id */
    double sum_logprob;     /* over generated tokens except eot */
    double avg_logprob;     /* sum_logprob / (text-and-timestamp tokens + 1), as transformers */
    double no_speech_prob;  /* P(<|nospeech|>) at the <|startoftranscript|> position */
    double compression_ratio; /* zlib ratio of the tokens' bytes, as transformers */
    float temperature;
    int language_token;     /* the language token used (detected or given); -1 for English-only models */
} kn_decode_result;

void kn_decode_result_free(kn_decode_result *r);

/* Decode one window. mel is [n_mels, 3000] (host), or NULL to reuse the
 * encoder output of the previous call (a fallback retry); prev (may be NULL)
 * are earlier text/timestamp tokens for the <|startofprev|> prefix. */
kn_code kn_whisper_decode_window(kn_whisper *w, const float *mel, const int32_t *prev, int n_prev,
                                 const kn_decode_options *o, float temperature, kn_decode_result *r, kn_error *err);

/* One word with its time span (word timestamps). */
typedef struct {
    char *word;             /* text, with its leading space as decoded ("" never appears) */
    double start, end;      /* seconds, rounded to 0.01 */
    double probability;     /* mean probability of its tokens (teacher-forced) */
} kn_word;

typedef struct kn_segment {
    int id;
    int64_t seek;           /* first mel frame of the window */
    double start, end;      /* seconds */
    int32_t *tokens;        /* text + timestamp tokens of the segment */
    int n_tokens;
    char *text;             /* NULL without a detokenizer */
    float temperature;
    double avg_logprob, compression_ratio, no_speech_prob;
    kn_word *words;         /* word_timestamps only (NULL otherwise) */
    int n_words;
} kn_segment;

typedef struct {
    kn_segment *segments;
    int n_segments;
    char language[12];      /* detected or given ("" for English-only models: "en") */
    char *text;             /* all segments' text concatenated (NULL without a detokenizer) */
    double duration;        /* seconds of audio */
    /* timings for benchmarks */
    double mel_seconds, decode_seconds; /* decode includes each window's encoder pass */
    int n_windows, n_decoded_tokens;
} kn_transcript;

void kn_transcript_free(kn_transcript *t);

/* Transcribe (or translate) 16 kHz mono PCM. */
kn_code kn_transcribe(kn_whisper *w, const float *pcm, int64_t n_samples, const kn_decode_options *o,
                      kn_transcript *out, kn_error *err);

/* Output formats for a finished transcript: "text", "json", "verbose_json",
 * "srt", "vtt". *out is malloc'd. */
kn_code kn_transcript_format(const kn_transcript *t, const char *format, const char *task, char **out,
                             kn_error *err);

#endif

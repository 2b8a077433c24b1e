/* word_timing.h — word-level timestamps for Whisper, as openai-whisper's
 * timing.py computes them (and transformers copies):
 *
 *  1. a teacher-forced pass of <|sot|> <|lang|> <|task|> <|notimestamps|>
 *     text... <|endoftext|> records the cross-attention of the alignment
 *     heads (kn_whisper_cross_qk);
 *  2. softmax over the window's audio frames (num_frames / 2 encoder
 *     positions), standardise each frame over the tokens, median filter of
 *     width 7 along time, mean over heads; the rows of the text tokens and
 *     <|endoftext|> go through dynamic time warping; each row's first time
 *     step is its token's start ("jump times", 20 ms steps);
 *  3. tokens are grouped into words (split at a leading space, punctuation
 *     or special tokens; per character for zh/ja/th/lo/my/yue), words take
 *     the jump times of their first token and of the next word's;
 *  4. over-long words at sentence ends are truncated, punctuation is merged
 *     into neighbouring words, and the segments' bounds are reconciled with
 *     the words' (add_word_timestamps).
 * Python's semantics are kept where they matter: str.strip() whitespace,
 * substring tests for punctuation, U+FFFD handling of split UTF-8. */
#ifndef KN_ENGINE_WORD_TIMING_H
#define KN_ENGINE_WORD_TIMING_H

#include "engine/transcribe.h"

#define KN_PREPEND_PUNCTUATIONS "\"'\xe2\x80\x9c\xc2\xbf([{-"
#define KN_APPEND_PUNCTUATIONS "\"'.\xe3\x80\x82,\xef\xbc\x8c!\xef\xbc\x81?\xef\xbc\x9f:\xef\xbc\x9a\xe2\x80\x9d)]}\xe3\x80\x81"

/* A word as a span of the token list. */
typedef struct {
    char *text; /* malloc'd */
    int first, count;
    double start, end, probability;
} kn_word_span;

void kn_word_spans_free(kn_word_span *w, int n);

/* openai-whisper's Tokenizer.split_to_word_tokens: by_unicode for languages
 * without spaces. detok decodes ids (special tokens may decode to ""). A
 * trailing incomplete UTF-8 run that never completes is dropped (as there). */
kn_code kn_word_split(kn_detok_fn detok, void *user, int eot, const int32_t *tokens, int n, int by_unicode,
                      kn_word_span **out, int *n_out, kn_error *err);

/* merge_punctuations, in place: merged-away words get count 0 and text "". */
kn_code kn_word_merge_punctuations(kn_word_span *w, int n, const char *prepend, const char *append, kn_error *err);

/* Steps 1-2: jump_times[0..n_text] (seconds, rows of text tokens + eot) and
 * probs[0..n_text) (each text token's probability among text tokens). */
kn_code kn_word_jump_times(kn_whisper *w, const int32_t *sot_seq, int n_sot, const int32_t *text, int n_text,
                           int n_frames, double *jump_times, double *probs, kn_error *err);

/* Steps 1-3 (openai-whisper's find_alignment): the words of text (spans
 * into text) with start / end (seconds from the window start, before the
 * duration rules and punctuation merging) and mean token probability. */
kn_code kn_word_find_alignment(kn_whisper *w, const int32_t *sot_seq, int n_sot, const int32_t *text, int n_text,
                               int n_frames, kn_detok_fn detok, void *user, int by_unicode, kn_word_span **out,
                               int *n_out, kn_error *err);

/* Step 3-4 for the segments of one window: fills segs[i].words, adjusts
 * segs[i].start/end; time_offset is the window's start (s), n_frames the
 * window's audio frames, *last_speech the end of the previous speech. */
kn_code kn_add_word_timestamps(kn_whisper *w, const kn_decode_options *o, const char *language, kn_segment *segs,
                               int n_segs, int n_frames, double time_offset, double *last_speech, kn_error *err);

#endif

/* stop_match.h — stop strings on streamed text with hold-back.
 *
 * Text deltas (already final UTF-8 from the detokenizer) are pushed in order.
 * The matcher returns the text that is safe to send: everything except a
 * tail that could still grow into a stop string. When a stop string appears
 * (possibly spread over several deltas), the text before its first
 * occurrence is returned and the match reports stopped; the stop string and
 * anything after it are never emitted (OpenAI semantics). Pure: no engine,
 * no tokenizer, no threads. */
#ifndef KN_ENGINE_STOP_MATCH_H
#define KN_ENGINE_STOP_MATCH_H

#include <stddef.h>

#include "base/status.h"

#define KN_MAX_STOP_STRINGS 16

typedef struct {
    int n;
    char *stops[KN_MAX_STOP_STRINGS];
    size_t lens[KN_MAX_STOP_STRINGS];
    char *held; /* text received but not emitted yet (never contains a whole stop string) */
    size_t held_len, held_cap;
    int stopped;
    int matched; /* index of the stop string that matched (valid when stopped) */
} kn_stop_match;

/* Copy up to KN_MAX_STOP_STRINGS non-empty stop strings (empty ones are ignored). */
kn_code kn_stop_match_init(kn_stop_match *m, const char *const *stops, int n, kn_error *err);
void kn_stop_match_free(kn_stop_match *m);

/* Append text; *emit points into an internal buffer valid until the next
 * call (emit_len may be 0). After *stopped = 1 further pushes emit nothing. */
kn_code kn_stop_match_push(kn_stop_match *m, const char *text, size_t len, const char **emit, size_t *emit_len,
                           int *stopped, kn_error *err);
/* End of generation: the held tail (it can no longer become a stop string). */
void kn_stop_match_flush(kn_stop_match *m, const char **emit, size_t *emit_len);

#endif

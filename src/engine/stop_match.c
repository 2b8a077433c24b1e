/* stop_match.c — see stop_match.h.
 *
 * The buffer is held + new text. A stop string that occurs in it must start
 * inside it (held never contains a whole one), so one scan per stop string
 * finds the earliest match. Otherwise the longest suffix that is a proper
 * prefix of some stop string is held back. Emitted bytes are moved out by
 * shifting the held tail to the front; held stays shorter than the longest
 * stop string, so work per push is O(len * total stop length). */
#include "engine/stop_match.h"

#include <stdlib.h>
#include <string.h>

kn_code kn_stop_match_init(kn_stop_match *m, const char *const *stops, int n, kn_error *err) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        if (m->n == KN_MAX_STOP_STRINGS) {
            kn_stop_match_free(m);
            return kn_fail(err, KN_ERR_INVALID_ARG, "at most %d stop strings are supported", KN_MAX_STOP_STRINGS);
        }
        m->lens[m->n] = strlen(stops[i]);
        m->stops[m->n] = strdup(stops[i]);
        if (!m->stops[m->n]) {
            kn_stop_match_free(m);
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        m->n++;
    }
    return KN_OK;
}

void kn_stop_match_free(kn_stop_match *m) {
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->held);
    memset(m, 0, sizeof *m);
}

/* the buffer held[0..held_len) is returned as emit[0..n) and the rest kept;
 * callers read emit before the next push, so we move the kept tail into a
 * second region: emit stays at the front, kept tail after it. */
kn_code kn_stop_match_push(kn_stop_match *m, const char *text, size_t len, const char **emit, size_t *emit_len,
                           int *stopped, kn_error *err) {
    *emit = "", *emit_len = 0, *stopped = m->stopped;
    if (m->stopped) return KN_OK;
    /* drop what the previous call emitted: the live tail starts at held_len - kept */
    size_t need = m->held_len + len + 1;
    if (need > m->held_cap) {
        size_t cap = m->held_cap ? m->held_cap : 64;
        while (cap < need) cap *= 2;
        char *nb = realloc(m->held, cap);
        if (!nb) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        m->held = nb, m->held_cap = cap;
    }
    memcpy(m->held + m->held_len, text, len);
    size_t n = m->held_len + len;
    m->held[n] = 0;
    /* earliest full match */
    size_t best = (size_t)-1;
    for (int i = 0; i < m->n; i++) {
        const char *hit = memmem(m->held, n, m->stops[i], m->lens[i]);
        if (hit && (size_t)(hit - m->held) < best) best = (size_t)(hit - m->held), m->matched = i;
    }
    if (best != (size_t)-1) {
        m->stopped = 1, *stopped = 1;
        *emit = m->held, *emit_len = best;
        m->held_len = 0;
        return KN_OK;
    }
    /* longest suffix that is a proper prefix of a stop string */
    size_t keep = 0;
    for (int i = 0; i < m->n; i++) {
        size_t max = m->lens[i] - 1 < n ? m->lens[i] - 1 : n;
        for (size_t k = max; k > keep; k--)
            if (!memcmp(m->held + n - k, m->stops[i], k)) {
                keep = k;
                break;
            }
    }
    /* emit the front; keep the tail. To return a stable pointer we swap the
     * tail to the front after the caller is done: emit is a copy region at
     * the end of the buffer. */
    size_t out = n - keep;
    need = n + out + 1;
    if (need > m->held_cap) {
        size_t cap = m->held_cap;
        while (cap < need) cap *= 2;
        char *nb = realloc(m->held, cap);
        if (!nb) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        m->held = nb, m->held_cap = cap;
    }
    char *copy = m->held + n;
    memcpy(copy, m->held, out);
    copy[out] = 0;
    memmove(m->held, m->held + out, keep);
    /* the copy now sits after the kept tail's old position; move it right behind the tail */
    memmove(m->held + keep, copy, out + 1);
    m->held_len = keep;
    *emit = m->held + keep, *emit_len = out;
    return KN_OK;
}

void kn_stop_match_flush(kn_stop_match *m, const char **emit, size_t *emit_len) {
    *emit = m->stopped || !m->held ? "" : m->held;
    *emit_len = m->stopped ? 0 : m->held_len;
    m->held_len = 0;
}

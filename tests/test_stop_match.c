/* test_stop_match.c — stop strings over streamed deltas: every split of the
 * text into deltas gives the same emitted text as matching the whole string
 * at once, a partial stop string is never emitted, and the text after the
 * first stop is dropped. */
#include <string.h>

#include "engine/stop_match.h"
#include "test_util.h"

/* feed text in pieces of `step` bytes (0 = split at every position listed in
 * cuts); returns the concatenated emitted text and stopped flag */
static void run(const char *const *stops, int n_stops, const char *text, size_t step, char *out, int *stopped,
                int *leaked) {
    kn_stop_match m;
    kn_error err;
    kn_stop_match_init(&m, stops, n_stops, &err);
    size_t len = strlen(text), o = 0;
    *stopped = 0, *leaked = 0;
    for (size_t i = 0; i < len; i += step) {
        size_t n = i + step <= len ? step : len - i;
        const char *em;
        size_t el;
        int st;
        kn_stop_match_push(&m, text + i, n, &em, &el, &st, &err);
        memcpy(out + o, em, el);
        o += el;
        out[o] = 0;
        /* nothing emitted so far may end with a complete stop string */
        for (int k = 0; k < n_stops; k++)
            if (stops[k][0] && strstr(out, stops[k])) *leaked = 1;
        if (st) {
            *stopped = 1;
            break;
        }
    }
    if (!*stopped) {
        const char *em;
        size_t el;
        kn_stop_match_flush(&m, &em, &el);
        memcpy(out + o, em, el);
        o += el;
    }
    out[o] = 0;
    kn_stop_match_free(&m);
}

static void expect(const char *const *stops, int n, const char *text, const char *want, int want_stop) {
    char out[512];
    for (size_t step = 1; step <= strlen(text) + 1; step++) {
        int st, leaked;
        run(stops, n, text, step, out, &st, &leaked);
        CHECK(!strcmp(out, want), "step %zu on \"%s\": got \"%s\", want \"%s\"", step, text, out, want);
        CHECK(st == want_stop, "step %zu on \"%s\": stopped %d", step, text, st);
        CHECK(!leaked, "step %zu on \"%s\": a stop string was emitted", step, text);
    }
}

int main(void) {
    const char *s1[] = {"STOP"};
    expect(s1, 1, "hello world", "hello world", 0);
    expect(s1, 1, "hello STOP world", "hello ", 1);
    expect(s1, 1, "STOP", "", 1);
    expect(s1, 1, "STO", "STO", 0);          /* a partial at the end is flushed */
    expect(s1, 1, "SSTSTOSTOP!", "SSTSTO", 1); /* overlapping prefixes */
    const char *s2[] = {"\n\n", "end", "ending"};
    expect(s2, 3, "the ending\n\nx", "the ", 1); /* earliest match wins */
    expect(s2, 3, "a\nb\n\nc", "a\nb", 1);
    const char *s3[] = {"é!", ""};
    expect(s3, 2, "café au lait é!x", "café au lait ", 1); /* multi-byte, empty stop ignored */
    expect(NULL, 0, "no stops at all", "no stops at all", 0);
    /* hold-back: a prefix is not emitted until disambiguated */
    kn_stop_match m;
    kn_error err;
    const char *st[] = {"</s>"};
    kn_stop_match_init(&m, st, 1, &err);
    const char *em;
    size_t el;
    int stop;
    kn_stop_match_push(&m, "ab</", 4, &em, &el, &stop, &err);
    CHECK(el == 2 && !memcmp(em, "ab", 2), "held back wrong: %.*s", (int)el, em);
    kn_stop_match_push(&m, "x", 1, &em, &el, &stop, &err);
    CHECK(el == 3 && !memcmp(em, "</x", 3) && !stop, "release after mismatch: %.*s", (int)el, em);
    kn_stop_match_free(&m);
    const char *many[20];
    for (int i = 0; i < 20; i++) many[i] = "x";
    CHECK(kn_stop_match_init(&m, many, 20, &err) == KN_ERR_INVALID_ARG, "too many stops accepted");
    return kn_test_done("test_stop_match");
}

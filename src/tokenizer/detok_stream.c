/* detok_stream.c — incremental decoding for streaming (SSE): each pushed id
 * yields only the text that is final.
 *
 * State: a small window W of recent ids and P = decode(W), all of which has
 * been emitted. A push decodes W + new ids; when the result is longer than P,
 * starts with P and does not end in U+FFFD (an incomplete UTF-8 / byte-
 * fallback sequence that a later token may complete), the part after P is
 * emitted and the window restarts at the ids just emitted (so decoders with a
 * first-token rule — Metaspace, Strip after Fuse — see the same first token
 * in both decodes). While the last id is a byte-fallback token (<0xXX>) the
 * run may still become U+FFFDs (HF replaces a whole invalid run), so nothing
 * is emitted until a non-byte token or the flush. A window whose decode
 * would be empty is kept whole, so
 * the first-token rules never touch newly emitted text. Invariant: the
 * concatenation of all deltas and the flush equals kn_tokenizer_decode of all
 * pushed ids (tests check it on every corpus string and tokenizer). */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

struct kn_detok_stream {
    const kn_tokenizer *t;
    int skip_special;
    kn_ids win;       /* window ids */
    size_t n_emitted; /* the first n_emitted ids of win make up prefix */
    char *prefix;     /* decode(win[0..n_emitted)) */
    size_t prefix_len;
    int in_byte_run; /* the last id the decoder sees is a <0xXX> byte token */
};

kn_code kn_detok_stream_new(const kn_tokenizer *t, int skip_special, kn_detok_stream **out, kn_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return KN_OK;
}

void kn_detok_stream_free(kn_detok_stream *s) {
    if (!s) return;
    free(s->win.v);
    free(s->prefix);
    free(s);
}

static kn_code empty(char **delta, size_t *len, kn_error *err) {
    *delta = calloc(1, 1);
    if (len) *len = 0;
    return *delta ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory");
}

static int ends_incomplete(const char *s, size_t n) { return n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3); }

/* Emit text[prefix_len..] as *delta (taking ownership of text's tail). */
static kn_code emit_tail(kn_detok_stream *s, char *text, size_t n, char **delta, size_t *len, kn_error *err) {
    size_t d = n - s->prefix_len;
    char *out = malloc(d + 1);
    if (!out) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    memcpy(out, text + s->prefix_len, d);
    out[d] = 0;
    *delta = out;
    if (len) *len = d;
    return KN_OK;
}

kn_code kn_detok_stream_push(kn_detok_stream *s, int32_t id, char **delta, size_t *len, kn_error *err) {
    *delta = NULL;
    if (id < 0 || id >= s->t->n_ids)
        return kn_fail(err, KN_ERR_INVALID_ARG, "detokenize: id %d is outside the vocabulary (0..%d)", id,
                       s->t->n_ids - 1);
    if (kn_ids_push(&s->win, id)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    /* an open byte-fallback run may still turn into U+FFFDs: wait for its end
     * (ids the decoder never sees — skipped specials — do not end a run) */
    if (s->t->spm) {
#ifdef KILN_HAVE_SENTENCEPIECE
        if (!s->t->special[id]) s->in_byte_run = kn_spm_is_byte(s->t->spm, id);
#endif
    } else if (s->t->tok_len[id] != KN_TOK_NONE && !(s->skip_special && s->t->special[id]))
        s->in_byte_run = kn_decoder_pending_bytes(s->t->decoder, s->t->tok[id], s->t->tok_len[id]);
    if (s->in_byte_run) return empty(delta, len, err);
    char *text;
    size_t n;
    kn_code rc = kn_tokenizer_decode(s->t, s->win.v, (int)s->win.n, s->skip_special, &text, &n, err);
    if (rc) return rc;
    if (n <= s->prefix_len || ends_incomplete(text, n)) {
        free(text);
        return empty(delta, len, err);
    }
    if (s->prefix_len && memcmp(text, s->prefix, s->prefix_len)) {
        free(text);
        return kn_fail(err, KN_ERR_UNSUPPORTED, "streaming decode: this tokenizer's decoder rewrote earlier text");
    }
    rc = emit_tail(s, text, n, delta, len, err);
    if (rc) {
        free(text);
        return rc;
    }
    /* restart the window at the ids just emitted, unless they decode to nothing alone */
    size_t keep_from = s->n_emitted;
    char *np;
    size_t nn;
    rc = kn_tokenizer_decode(s->t, s->win.v + keep_from, (int)(s->win.n - keep_from), s->skip_special, &np, &nn, err);
    if (rc) {
        free(text);
        free(*delta);
        *delta = NULL;
        return rc;
    }
    free(s->prefix);
    if (nn == 0) {
        free(np);
        s->prefix = text;
        s->prefix_len = n;
    } else {
        free(text);
        memmove(s->win.v, s->win.v + keep_from, (s->win.n - keep_from) * sizeof *s->win.v);
        s->win.n -= keep_from;
        s->prefix = np;
        s->prefix_len = nn;
    }
    s->n_emitted = s->win.n;
    return KN_OK;
}

kn_code kn_detok_stream_flush(kn_detok_stream *s, char **delta, size_t *len, kn_error *err) {
    *delta = NULL;
    char *text;
    size_t n;
    kn_code rc = kn_tokenizer_decode(s->t, s->win.v, (int)s->win.n, s->skip_special, &text, &n, err);
    if (rc) return rc;
    int starts = !s->prefix_len || (n >= s->prefix_len && !memcmp(text, s->prefix, s->prefix_len));
    if (n > s->prefix_len && starts) rc = emit_tail(s, text, n, delta, len, err);
    else if (n != s->prefix_len || !starts)
        rc = kn_fail(err, KN_ERR_UNSUPPORTED, "streaming decode: this tokenizer's decoder rewrote earlier text");
    else rc = empty(delta, len, err);
    free(text);
    s->win.n = 0;
    s->n_emitted = 0;
    free(s->prefix);
    s->prefix = NULL;
    s->prefix_len = 0;
    s->in_byte_run = 0;
    return rc;
}

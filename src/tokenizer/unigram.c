/* unigram.c — the Unigram model of tokenizer.json (SentencePiece-style
 * unigram LM: T5, ALBERT, XLNet, many multilingual models), encoded as HF's
 * Unigram::encode_optimized does: a best-path (Viterbi) pass over byte
 * positions where every vocab piece starting at a position is found by
 * walking a byte trie (work per position bounded by the longest piece), an
 * unknown character costs min_score - 10, consecutive unknowns are fused,
 * and pieces missing from the vocab fall back to <0xXX> bytes or unk. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

#define UNK_PENALTY 10.0

kn_code kn_unigram_parse(const json_t *j, struct kn_tokenizer *t, kn_error *err) {
    kn_tokmodel *m = &t->model;
    m->type = KN_MODEL_UNIGRAM;
    const json_t *u = json_object_get(j, "unk_id");
    m->unk_id = -1;
    if (json_is_integer(u)) {
        if (json_integer_value(u) < 0 || json_integer_value(u) >= m->n_model)
            return kn_fail(err, KN_ERR_FORMAT, "Unigram model: unk_id %lld is not in the vocab",
                           (long long)json_integer_value(u));
        m->unk_id = (int32_t)json_integer_value(u);
    } else if (u && !json_is_null(u))
        return kn_fail(err, KN_ERR_FORMAT, "Unigram model: unk_id must be an integer or null");
    m->byte_fallback = json_is_true(json_object_get(j, "byte_fallback"));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_id[b] = kn_strmap_get(&m->vocab, name, 6);
    }
    if (kn_trie_init(&m->pieces, (size_t)m->n_model * 2))
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    m->has_pieces = 1;
    for (int32_t id = 0; id < m->n_model; id++)
        if (t->tok_len[id] != KN_TOK_NONE && t->tok_len[id] > 0 && kn_trie_insert(&m->pieces, t->tok[id], t->tok_len[id], id))
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    return KN_OK;
}

typedef struct {
    double score;
    int32_t start; /* -1: not reached */
    int32_t id;
} best_node;

static kn_code emit_piece(const kn_tokmodel *m, const char *s, size_t n, kn_ids *out, kn_error *err) {
    int32_t id = kn_strmap_get(&m->vocab, s, n);
    if (id < 0 && m->byte_fallback) {
        int ok = 1;
        for (size_t k = 0; k < n; k++) ok &= m->byte_id[(uint8_t)s[k]] >= 0;
        if (ok) {
            for (size_t k = 0; k < n; k++)
                if (kn_ids_push(out, m->byte_id[(uint8_t)s[k]])) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            return KN_OK;
        }
    }
    if (id < 0) id = m->unk_id;
    if (id < 0) return kn_fail(err, KN_ERR_FORMAT, "Unigram: text has a piece outside the vocab and there is no unk_id");
    return kn_ids_push(out, id) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
}

kn_code kn_unigram_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                        kn_error *err) {
    const kn_tokmodel *m = &t->model;
    if (n + 1 > c->uni_cap) {
        size_t cap = c->uni_cap ? c->uni_cap : 256;
        while (cap < n + 1) cap *= 2;
        void *p = realloc(c->uni, cap * sizeof(best_node));
        if (!p) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        c->uni = p;
        c->uni_cap = cap;
    }
    best_node *bn = c->uni;
    for (size_t i = 0; i <= n; i++) bn[i] = (best_node){0.0, -1, -1};
    const double unk_score = m->min_score - UNK_PENALTY;
    for (size_t pos = 0; pos < n;) {
        uint32_t cp;
        size_t mblen = (size_t)kn_utf8_decode(w + pos, n - pos, &cp);
        double base = bn[pos].score;
        int has_single = 0;
        uint64_t node = 0;
        for (size_t k = pos; k < n; k++) {
            uint64_t child;
            if (!kn_u64map_get(&m->pieces.edges, node << 8 | (uint8_t)w[k], &child)) break;
            node = child;
            int32_t id = m->pieces.term[node];
            if (id < 0) continue;
            size_t end = k + 1;
            double cand = m->scores[id] + base;
            if (bn[end].start < 0 || cand > bn[end].score) bn[end] = (best_node){cand, (int32_t)pos, id};
            if (end - pos == mblen) has_single = 1;
        }
        if (!has_single) {
            if (m->unk_id < 0)
                return kn_fail(err, KN_ERR_FORMAT, "Unigram: character outside the vocab and the model has no unk_id");
            size_t end = pos + mblen;
            double cand = unk_score + base;
            if (bn[end].start < 0 || cand > bn[end].score) bn[end] = (best_node){cand, (int32_t)pos, m->unk_id};
        }
        pos += mblen;
    }
    /* backtrack: collect [start, end) spans in reverse, fusing unknowns */
    size_t mark = out->n;
    kn_ids spans = {0}; /* pairs (start, end) in reverse order */
    size_t end = n, fuse_end = 0;
    int fusing = 0;
    kn_code rc = KN_OK;
    while (end > 0 && !rc) {
        const best_node *b = &bn[end];
        size_t start = (size_t)b->start;
        if (b->id == m->unk_id) {
            if (!fusing) fuse_end = end, fusing = 1;
        } else {
            if (fusing && (kn_ids_push(&spans, (int32_t)end) || kn_ids_push(&spans, (int32_t)fuse_end))) rc = KN_ERR_NOMEM;
            fusing = 0;
            if (kn_ids_push(&spans, (int32_t)start) || kn_ids_push(&spans, (int32_t)end)) rc = KN_ERR_NOMEM;
        }
        end = start;
    }
    if (!rc && fusing && (kn_ids_push(&spans, 0) || kn_ids_push(&spans, (int32_t)fuse_end))) rc = KN_ERR_NOMEM;
    if (rc) {
        free(spans.v);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    for (size_t i = spans.n; i >= 2 && !rc; i -= 2) {
        size_t s = (size_t)spans.v[i - 2], e = (size_t)spans.v[i - 1];
        rc = emit_piece(m, w + s, e - s, out, err);
    }
    free(spans.v);
    if (rc) out->n = mark;
    return rc;
}

/* added_tokens.c — added/special tokens are cut out of the text before the
 * model sees it, as HF's AddedVocabulary does: leftmost-longest matching over
 * all added-token strings (a byte trie; bounded work per input byte by the
 * longest token), then the lstrip / rstrip / single_word rules. Two tries
 * exist: tokens with normalized=false match the raw input, tokens with
 * normalized=true match (their normalized form) in the normalized text. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

static int trie_new_node(kn_added_trie *tr) {
    if (tr->n_nodes == tr->cap_nodes) {
        size_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 256;
        int32_t *t = realloc(tr->term, cap * sizeof *t);
        if (!t) return -1;
        tr->term = t;
        tr->cap_nodes = cap;
    }
    tr->term[tr->n_nodes] = -1;
    return (int)tr->n_nodes++;
}

int kn_trie_init(kn_added_trie *tr, size_t expected_nodes) {
    memset(tr, 0, sizeof *tr);
    if (kn_u64map_init(&tr->edges, expected_nodes) || trie_new_node(tr) < 0) {
        kn_added_trie_free(tr);
        return -1;
    }
    return 0;
}

int kn_trie_insert(kn_added_trie *tr, const char *s, size_t n, int32_t value) {
    uint64_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t key = node << 8 | (uint8_t)s[k], child;
        if (!kn_u64map_get(&tr->edges, key, &child)) {
            int c = trie_new_node(tr);
            if (c < 0 || kn_u64map_put(&tr->edges, key, (uint64_t)c)) return -1;
            child = (uint64_t)c;
        }
        node = child;
    }
    tr->term[node] = value;
    return 0;
}

kn_code kn_added_trie_build(kn_added_trie *tr, const kn_added_token *toks, size_t n, int normalized,
                            kn_error *err) {
    if (kn_trie_init(tr, 1024)) goto nomem;
    for (size_t i = 0; i < n; i++) {
        const kn_added_token *a = &toks[i];
        if (!a->normalized != !normalized || !a->pattern_len) continue;
        if (kn_trie_insert(tr, a->pattern, a->pattern_len, (int32_t)i)) goto nomem;
    }
    return KN_OK;
nomem:
    kn_added_trie_free(tr);
    return kn_fail(err, KN_ERR_NOMEM, "out of memory building the added-token matcher");
}

void kn_added_trie_free(kn_added_trie *tr) {
    kn_u64map_free(&tr->edges);
    free(tr->term);
    memset(tr, 0, sizeof *tr);
}

/* Longest pattern starting at s[i]; returns the token index or -1. */
static int32_t trie_longest(const kn_added_trie *tr, const char *s, size_t n, size_t i, size_t *end) {
    uint64_t node = 0;
    int32_t best = -1;
    for (size_t k = i; k < n; k++) {
        uint64_t child;
        if (!kn_u64map_get(&tr->edges, node << 8 | (uint8_t)s[k], &child)) break;
        node = child;
        if (tr->term[node] >= 0) {
            best = tr->term[node];
            *end = k + 1;
        }
    }
    return best;
}

static uint32_t char_before(const char *s, size_t i, size_t *start) {
    size_t j = i;
    do j--;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80);
    uint32_t cp;
    kn_utf8_decode(s + j, i - j, &cp);
    *start = j;
    return cp;
}

kn_code kn_added_split(const struct kn_tokenizer *t, const kn_added_trie *tr, const char *s, size_t len,
                       int at_origin, kn_pieces *out) {
    size_t start_offset = 0, i = 0;
    while (i < len) {
        size_t end = 0;
        int32_t k = (uint8_t)s[i] < 0x80 || ((uint8_t)s[i] & 0xC0) == 0xC0 ? trie_longest(tr, s, len, i, &end) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const kn_added_token *a = &t->added[k];
        size_t start = i, stop = end;
        i = end; /* the matcher resumes after this match whether or not it is kept */
        if (a->single_word) {
            uint32_t cp;
            size_t ps;
            int start_space = start == 0 || !kn_uni_is_word(char_before(s, start, &ps));
            int stop_space = stop == len || (kn_utf8_decode(s + stop, len - stop, &cp), !kn_uni_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t ps;
                uint32_t cp = char_before(s, ns, &ps);
                if (!kn_uni_is_whitespace(cp)) break;
                ns = ps;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                uint32_t cp;
                int l = kn_utf8_decode(s + stop, len - stop, &cp);
                if (!kn_uni_is_whitespace(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start && kn_pieces_push(out, s + start_offset, start - start_offset, -1,
                                                   at_origin && start_offset == 0))
            return KN_ERR_NOMEM;
        if (kn_pieces_push(out, s + start, stop - start, a->id, 0)) return KN_ERR_NOMEM;
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < len &&
        kn_pieces_push(out, s + start_offset, len - start_offset, -1, at_origin && start_offset == 0))
        return KN_ERR_NOMEM;
    return KN_OK;
}

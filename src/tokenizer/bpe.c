/* bpe.c — the tokenizer.json "model": BPE (byte-level and SentencePiece-style
 * with byte_fallback / unk / fuse_unk, ignore_merges, continuing_subword_prefix,
 * end_of_word_suffix), WordPiece and WordLevel.
 *
 * BPE merges one word in O(n log n): the symbols form a linked list, every
 * adjacent pair with a merge rule sits in a binary min-heap keyed by (rank,
 * position), stale heap entries are skipped when popped — the algorithm and
 * tie-breaking of HF's Word::merge_all. A per-call cache maps repeated words
 * to their ids. Merge rules: (left id, right id) -> (rank, merged id). */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

void kn_tokmodel_free(kn_tokmodel *m) {
    free(m->scores);
    if (m->has_pieces) kn_added_trie_free(&m->pieces);
    kn_strmap_free(&m->vocab);
    kn_u64map_free(&m->merges);
    free(m->unk_token);
    free(m->cont_prefix);
    free(m->eow_suffix);
}

static char *jstrdup(const json_t *v) {
    if (!json_is_string(v)) return NULL;
    size_t n = json_string_length(v);
    char *s = malloc(n + 1);
    if (s) memcpy(s, json_string_value(v), n + 1);
    return s;
}

static kn_code add_merge(struct kn_tokenizer *t, const char *a, size_t na, const char *b, size_t nb, uint32_t rank,
                         kn_tbuf *buf, kn_error *err) {
    kn_tokmodel *m = &t->model;
    int32_t ia = kn_strmap_get(&m->vocab, a, na), ib = kn_strmap_get(&m->vocab, b, nb);
    if (ia < 0 || ib < 0)
        return kn_fail(err, KN_ERR_FORMAT, "BPE merge %u: token \"%.*s\" is not in the vocab", rank,
                       (int)(ia < 0 ? (na > 60 ? 60 : na) : (nb > 60 ? 60 : nb)), ia < 0 ? a : b);
    size_t pl = m->cont_prefix ? strlen(m->cont_prefix) : 0;
    if (pl > nb) pl = nb;
    buf->n = 0;
    if (kn_tbuf_put(buf, a, na) || kn_tbuf_put(buf, b + pl, nb - pl)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    int32_t in = kn_strmap_get(&m->vocab, buf->p, buf->n);
    if (in < 0)
        return kn_fail(err, KN_ERR_FORMAT, "BPE merge %u: merged token \"%.*s\" is not in the vocab", rank,
                       (int)(buf->n > 60 ? 60 : buf->n), buf->p);
    if (kn_u64map_put(&m->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, (uint64_t)rank << 32 | (uint32_t)in))
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    return KN_OK;
}

static kn_code fast_merges(const kn_vocab_fast *f, struct kn_tokenizer *t, kn_error *err) {
    if (kn_u64map_init(&t->model.merges, f->n_merges)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_tbuf buf = {0};
    kn_code rc = KN_OK;
    const char *b = f->merge_bytes.p;
    for (size_t i = 0; i < f->n_merges && !rc; i++) {
        const uint32_t *q = f->merges + 4 * i;
        rc = add_merge(t, b + q[0], q[1], b + q[2], q[3], (uint32_t)i, &buf, err);
    }
    kn_tbuf_free(&buf);
    return rc;
}

static kn_code parse_merges(const json_t *merges, struct kn_tokenizer *t, kn_error *err) {
    if (!json_is_array(merges)) return kn_fail(err, KN_ERR_FORMAT, "BPE model: \"merges\" must be an array");
    size_t n = json_array_size(merges);
    if (kn_u64map_init(&t->model.merges, n)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_tbuf buf = {0};
    kn_code rc = KN_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *e = json_array_get(merges, i);
        if (json_is_string(e)) {
            /* legacy "a b": exactly one space */
            const char *s = json_string_value(e);
            size_t len = json_string_length(e);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                rc = kn_fail(err, KN_ERR_FORMAT, "BPE merge %zu: \"%.60s\" is not two tokens separated by one space",
                             i, s);
            else rc = add_merge(t, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s), (uint32_t)i, &buf, err);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            const json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
            rc = add_merge(t, json_string_value(a), json_string_length(a), json_string_value(b), json_string_length(b),
                           (uint32_t)i, &buf, err);
        } else rc = kn_fail(err, KN_ERR_FORMAT, "BPE merge %zu: expected \"a b\" or [\"a\", \"b\"]", i);
    }
    kn_tbuf_free(&buf);
    return rc;
}

kn_code kn_tokmodel_parse(const json_t *j, const kn_vocab_fast *fast, struct kn_tokenizer *t, kn_error *err) {
    kn_tokmodel *m = &t->model;
    const char *type = json_string_value(json_object_get(j, "type"));
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_id[b] = -1;
    if (!type) type = json_object_get(j, "merges") ? "BPE" : "";
    const json_t *unk = json_object_get(j, "unk_token");
    if (json_is_string(unk)) {
        m->unk_token = jstrdup(unk);
        if (!m->unk_token) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        m->unk_id = kn_strmap_get(&m->vocab, m->unk_token, strlen(m->unk_token));
    }
    if (!strcmp(type, "BPE")) {
        m->type = KN_MODEL_BPE;
        const json_t *d = json_object_get(j, "dropout");
        if (json_is_number(d) && json_number_value(d) > 0)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "BPE dropout %g is not supported (kiln encodes deterministically)",
                           json_number_value(d));
        m->byte_fallback = json_is_true(json_object_get(j, "byte_fallback"));
        m->fuse_unk = json_is_true(json_object_get(j, "fuse_unk"));
        m->ignore_merges = json_is_true(json_object_get(j, "ignore_merges"));
        const json_t *p = json_object_get(j, "continuing_subword_prefix"), *s = json_object_get(j, "end_of_word_suffix");
        if (json_is_string(p) && json_string_length(p) && !(m->cont_prefix = jstrdup(p)))
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (json_is_string(s) && json_string_length(s) && !(m->eow_suffix = jstrdup(s)))
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (m->unk_token && m->unk_id < 0)
            return kn_fail(err, KN_ERR_FORMAT, "BPE model: unk_token \"%.60s\" is not in the vocab", m->unk_token);
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            m->byte_id[b] = kn_strmap_get(&m->vocab, name, 6);
        }
        if (fast && fast->has_merges) return fast_merges(fast, t, err);
        return parse_merges(json_object_get(j, "merges"), t, err);
    }
    if (!strcmp(type, "WordPiece")) {
        m->type = KN_MODEL_WORDPIECE;
        const json_t *p = json_object_get(j, "continuing_subword_prefix");
        m->cont_prefix = strdup(json_is_string(p) ? json_string_value(p) : "##");
        const json_t *mx = json_object_get(j, "max_input_chars_per_word");
        m->max_input_chars_per_word = json_is_integer(mx) ? (int)json_integer_value(mx) : 100;
        if (!m->cont_prefix) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (m->unk_id < 0)
            return kn_fail(err, KN_ERR_FORMAT, "WordPiece model: unk_token \"%.60s\" is not in the vocab",
                           m->unk_token ? m->unk_token : "[UNK]");
        return KN_OK;
    }
    if (!strcmp(type, "WordLevel")) {
        m->type = KN_MODEL_WORDLEVEL;
        return KN_OK;
    }
    if (!strcmp(type, "Unigram")) return kn_unigram_parse(j, t, err);
    return kn_fail(err, KN_ERR_UNSUPPORTED,
                   "model type \"%s\" is not supported (supported: BPE, WordPiece, WordLevel, Unigram)", type);
}

/* ---- BPE word merge ------------------------------------------------------------ */

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* 0: merged away */
} symbol;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} merge_ent;

static int ent_less(merge_ent a, merge_ent b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

typedef struct {
    merge_ent *v;
    size_t n;
} heap;

static void heap_push(heap *h, merge_ent e) {
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(e, h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
}

static merge_ent heap_pop(heap *h) {
    merge_ent top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        merge_ent best = last;
        if (l < h->n && ent_less(h->v[l], best)) m = l, best = h->v[l];
        if (r < h->n && ent_less(h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static int ctx_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int sym_push(kn_tok_ctx *c, size_t *n, int32_t id, uint32_t len) {
    if (ctx_grow(&c->sym, &c->sym_cap, *n + 1, sizeof(symbol))) return -1;
    symbol *s = (symbol *)c->sym + *n;
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = (int32_t)*n + 1;
    (*n)++;
    return 0;
}

static kn_code bpe_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                        kn_error *err) {
    const kn_tokmodel *m = &t->model;
    size_t ns = 0;
    int32_t unk_pending = -1;
    uint32_t unk_len = 0;
    size_t pl = m->cont_prefix ? strlen(m->cont_prefix) : 0, sl = m->eow_suffix ? strlen(m->eow_suffix) : 0;
    kn_tbuf *tmp = &c->scratch[1];
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = (size_t)kn_utf8_decode(w + i, n - i, &cp);
        const char *s = w + i;
        size_t sn = l;
        if ((pl && i > 0) || (sl && i + l == n)) {
            tmp->n = 0;
            if ((pl && i > 0 && kn_tbuf_put(tmp, m->cont_prefix, pl)) || kn_tbuf_put(tmp, w + i, l) ||
                (sl && i + l == n && kn_tbuf_put(tmp, m->eow_suffix, sl)))
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            s = tmp->p;
            sn = tmp->n;
        }
        int32_t id = kn_strmap_get(&m->vocab, s, sn);
        if (id >= 0) {
            if (unk_pending >= 0 && sym_push(c, &ns, unk_pending, unk_len)) goto nomem;
            unk_pending = -1;
            if (sym_push(c, &ns, id, (uint32_t)l)) goto nomem;
        } else {
            int done = 0;
            if (m->byte_fallback) {
                int ok = 1;
                for (size_t k = 0; k < sn; k++) ok &= m->byte_id[(uint8_t)s[k]] >= 0;
                if (ok) {
                    for (size_t k = 0; k < sn; k++)
                        if (sym_push(c, &ns, m->byte_id[(uint8_t)s[k]], 1)) goto nomem;
                    done = 1; /* as HF: a pending unk is not flushed here */
                }
            }
            if (!done && m->unk_id >= 0) {
                if (unk_pending >= 0 && m->fuse_unk) unk_len += (uint32_t)l;
                else {
                    if (unk_pending >= 0 && sym_push(c, &ns, unk_pending, unk_len)) goto nomem;
                    unk_pending = m->unk_id;
                    unk_len = (uint32_t)l;
                }
            }
            /* no unk token: the character is dropped, as HF does */
        }
        i += l;
    }
    if (unk_pending >= 0 && sym_push(c, &ns, unk_pending, unk_len)) goto nomem;
    if (!ns) return KN_OK;
    symbol *sym = c->sym;
    sym[ns - 1].next = -1;

    /* merge */
    if (ns > 1) {
        if (ctx_grow(&c->heap, &c->heap_cap, 2 * ns + 8, sizeof(merge_ent))) goto nomem;
        heap h = {c->heap, 0};
        for (size_t i = 0; i + 1 < ns; i++) {
            uint64_t v;
            if (kn_u64map_get(&m->merges, (uint64_t)(uint32_t)sym[i].id << 32 | (uint32_t)sym[i + 1].id, &v))
                heap_push(&h, (merge_ent){(uint32_t)(v >> 32), (uint32_t)i, (int32_t)(uint32_t)v});
        }
        while (h.n) {
            merge_ent top = heap_pop(&h);
            symbol *a = &sym[top.pos];
            if (!a->len || a->next < 0) continue;
            symbol *b = &sym[a->next];
            uint64_t v;
            if (!kn_u64map_get(&m->merges, (uint64_t)(uint32_t)a->id << 32 | (uint32_t)b->id, &v) ||
                (int32_t)(uint32_t)v != top.new_id)
                continue;
            a->id = top.new_id;
            a->len += b->len;
            a->next = b->next;
            b->len = 0;
            if (a->next >= 0) sym[a->next].prev = (int32_t)top.pos;
            /* each merge adds at most two entries; keep room */
            if (h.n + 2 > c->heap_cap) {
                if (ctx_grow(&c->heap, &c->heap_cap, h.n + 2, sizeof(merge_ent))) goto nomem;
                h.v = c->heap;
            }
            if (a->prev >= 0 && kn_u64map_get(&m->merges, (uint64_t)(uint32_t)sym[a->prev].id << 32 | (uint32_t)a->id, &v))
                heap_push(&h, (merge_ent){(uint32_t)(v >> 32), (uint32_t)a->prev, (int32_t)(uint32_t)v});
            if (a->next >= 0 && kn_u64map_get(&m->merges, (uint64_t)(uint32_t)a->id << 32 | (uint32_t)sym[a->next].id, &v))
                heap_push(&h, (merge_ent){(uint32_t)(v >> 32), top.pos, (int32_t)(uint32_t)v});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (sym[i].len && kn_ids_push(out, sym[i].id)) goto nomem;
    return KN_OK;
nomem:
    return kn_fail(err, KN_ERR_NOMEM, "out of memory");
}

/* ---- per-call word cache ----------------------------------------------------------- */

#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES 65536

static int cache_get(kn_tok_ctx *c, const char *w, size_t n, uint64_t h, kn_ids *out, int *hit) {
    *hit = 0;
    if (!c->cache_cap) return 0;
    size_t j = (size_t)(h >> 32) & (c->cache_cap - 1);
    while (c->cache_slot[j]) {
        uint32_t e = (uint32_t)(c->cache_slot[j] & 0xffffffffu) - 1;
        uint32_t *ent = c->cache_entry + 4 * (size_t)e;
        if ((c->cache_slot[j] >> 32) == (h >> 32) && ent[1] == n && !memcmp(c->cache_keys.p + ent[0], w, n)) {
            *hit = 1;
            return kn_ids_append(out, c->cache_ids.v + ent[2], ent[3]);
        }
        j = (j + 1) & (c->cache_cap - 1);
    }
    return 0;
}

/* Grow the slot table (rehash) and the entry array; 0 on failure. */
static int cache_grow(kn_tok_ctx *c) {
    size_t cap = c->cache_cap ? c->cache_cap * 2 : 256;
    uint64_t *slot = calloc(cap, sizeof *slot);
    uint32_t *ent = realloc(c->cache_entry, 4 * sizeof *ent * (cap / 2));
    if (!slot || !ent) {
        free(slot);
        if (ent) c->cache_entry = ent;
        return 0;
    }
    c->cache_entry = ent;
    for (size_t i = 0; i < c->cache_cap; i++) {
        if (!c->cache_slot[i]) continue;
        size_t j = (size_t)(c->cache_slot[i] >> 32) & (cap - 1);
        while (slot[j]) j = (j + 1) & (cap - 1);
        slot[j] = c->cache_slot[i];
    }
    free(c->cache_slot);
    c->cache_slot = slot;
    c->cache_cap = cap;
    return 1;
}

static void cache_put(kn_tok_ctx *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t n_ids) {
    if (c->cache_n >= CACHE_MAX_ENTRIES) return;
    if ((c->cache_n + 1) * 2 > c->cache_cap && !cache_grow(c)) return;
    size_t koff = c->cache_keys.n, ioff = c->cache_ids.n;
    if (kn_tbuf_put(&c->cache_keys, w, n) || kn_ids_append(&c->cache_ids, ids, n_ids)) return;
    uint32_t e = (uint32_t)c->cache_n++;
    uint32_t *ent = c->cache_entry + 4 * (size_t)e;
    ent[0] = (uint32_t)koff;
    ent[1] = (uint32_t)n;
    ent[2] = (uint32_t)ioff;
    ent[3] = (uint32_t)n_ids;
    size_t j = (size_t)(h >> 32) & (c->cache_cap - 1);
    while (c->cache_slot[j]) j = (j + 1) & (c->cache_cap - 1);
    c->cache_slot[j] = (h & 0xffffffff00000000ull) | (e + 1);
}

/* ---- WordPiece / WordLevel ------------------------------------------------------------- */

static kn_code wordpiece_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                              kn_error *err) {
    const kn_tokmodel *m = &t->model;
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)w[i] & 0xC0) != 0x80;
    if ((long)chars > m->max_input_chars_per_word) return kn_ids_push(out, m->unk_id) ? KN_ERR_NOMEM : KN_OK;
    size_t mark = out->n, start = 0, pl = strlen(m->cont_prefix);
    kn_tbuf *tmp = &c->scratch[1];
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (start < end) {
            tmp->n = 0;
            if ((start > 0 && kn_tbuf_put(tmp, m->cont_prefix, pl)) || kn_tbuf_put(tmp, w + start, end - start))
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            found = kn_strmap_get(&m->vocab, tmp->p, tmp->n);
            if (found >= 0) break;
            do end--;
            while (end > start && ((unsigned char)w[end] & 0xC0) == 0x80);
        }
        if (found < 0) {
            out->n = mark;
            return kn_ids_push(out, m->unk_id) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
        }
        if (kn_ids_push(out, found)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        start = end;
    }
    return KN_OK;
}

kn_code kn_tokmodel_encode_word(const struct kn_tokenizer *t, kn_tok_ctx *c, const char *w, size_t n, kn_ids *out,
                             kn_error *err) {
    const kn_tokmodel *m = &t->model;
    if (!n) return KN_OK;
    if (m->type == KN_MODEL_WORDLEVEL) {
        int32_t id = kn_strmap_get(&m->vocab, w, n);
        if (id < 0) id = m->unk_id;
        if (id < 0) return kn_fail(err, KN_ERR_FORMAT, "WordLevel: \"%.40s\" is not in the vocab and there is no unk_token", w);
        return kn_ids_push(out, id) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
    }
    if (m->type == KN_MODEL_WORDPIECE) return wordpiece_word(t, c, w, n, out, err);
    if (m->type == KN_MODEL_BPE && m->ignore_merges) {
        int32_t id = kn_strmap_get(&m->vocab, w, n);
        if (id >= 0) return kn_ids_push(out, id) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
    }
    int cacheable = n < CACHE_MAX_WORD;
    uint64_t h = 0;
    if (cacheable) {
        int hit;
        h = kn_hash_bytes(w, n);
        if (cache_get(c, w, n, h, out, &hit)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (hit) return KN_OK;
    }
    size_t mark = out->n;
    kn_code rc = m->type == KN_MODEL_UNIGRAM ? kn_unigram_word(t, c, w, n, out, err) : bpe_word(t, c, w, n, out, err);
    if (!rc && cacheable) cache_put(c, w, n, h, out->v + mark, out->n - mark);
    return rc;
}

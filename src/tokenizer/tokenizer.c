/* tokenizer.c — load a Hugging Face tokenizer.json into a kn_tokenizer and
 * run the encode pipeline (added tokens -> normalizer -> added tokens in the
 * normalized text -> pre-tokenizer -> model -> post-processor) and decode
 * (ids -> token strings -> decoder), in the order and with the rules of the
 * `tokenizers` library. The stages live in their own files; this one owns
 * the vocabulary arrays and the public entry points. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/file_util.h"
#include "tokenizer/tok_internal.h"

#define MAX_TOKENIZER_JSON ((size_t)1 << 30)
#define MAX_IDS (1 << 24)

/* The extra map over every id (model vocab and added tokens) for
 * kn_tokenizer_token_id lives beside the tokenizer. */
typedef struct {
    struct kn_tokenizer t;
    kn_strmap all;
} tokenizer_box;

static void tokenizer_free_parts(kn_tokenizer *t) {
    kn_tokmodel_free(&t->model);
    kn_normalizer_free(t->normalizer);
    kn_pretok_free(t->pretok);
    kn_postproc_free(t->post);
    kn_decoder_free(t->decoder);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].pattern != t->added[i].content) free(t->added[i].pattern);
        free(t->added[i].content);
    }
    free(t->added);
    free(t->added_content);
    free(t->added_content_len);
    kn_strmap_free(&t->added_map);
    if (t->has_trie_raw) kn_added_trie_free(&t->trie_raw);
    if (t->has_trie_norm) kn_added_trie_free(&t->trie_norm);
    free(t->tok);
    free(t->tok_len);
    free(t->special);
    free(t->arena);
    free(t->bos_token);
    free(t->eos_token);
#ifdef KILN_HAVE_SENTENCEPIECE
    kn_spm_free(t->spm);
#endif
}

void kn_tokenizer_free(kn_tokenizer *t) {
    if (!t) return;
    tokenizer_box *b = (tokenizer_box *)t;
    kn_strmap_free(&b->all);
    tokenizer_free_parts(t);
    free(b);
}

static int jflag(const json_t *o, const char *k) { return json_is_true(json_object_get(o, k)); }

/* Allocate the id arrays for ids [0, max_id] and the model-vocab map. */
static kn_code alloc_ids(kn_tokenizer *t, int64_t max_id, size_t n_vocab, size_t n_added, kn_error *err) {
    if (max_id < 0) return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: empty vocabulary");
    if ((size_t)max_id > 16 * (n_vocab + n_added) + 65536)
        return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: ids are implausibly sparse (max id %lld for %zu tokens)",
                       (long long)max_id, n_vocab + n_added);
    /* added tokens outside the vocab get ids from n_vocab on (HF add_tokens), so
     * leave room for them; load_added sets the final n_ids */
    if ((int64_t)(n_vocab + n_added) > max_id + 1) max_id = (int64_t)(n_vocab + n_added) - 1;
    t->n_ids = (int32_t)max_id + 1;
    t->tok = calloc((size_t)t->n_ids, sizeof *t->tok);
    t->tok_len = malloc((size_t)t->n_ids * sizeof *t->tok_len);
    t->special = calloc((size_t)t->n_ids, 1);
    if (!t->tok || !t->tok_len || !t->special) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    memset(t->tok_len, 0xff, (size_t)t->n_ids * sizeof *t->tok_len);
    if (kn_strmap_init(&t->model.vocab, n_vocab, (const char *const *)t->tok, t->tok_len))
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    t->model.n_model = (int32_t)n_vocab;
    return KN_OK;
}

static kn_code max_added_id(const json_t *added, int64_t *max_id, kn_error *err) {
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_IDS)
            return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has an invalid id", i);
        if (json_integer_value(id) > *max_id) *max_id = json_integer_value(id);
    }
    return KN_OK;
}

static kn_code load_vocab_fast(kn_tokenizer *t, kn_vocab_fast *f, const json_t *added, kn_error *err) {
    int64_t max_id = -1;
    for (size_t i = 0; i < f->n_vocab; i++) {
        uint32_t id = f->vocab[3 * i + 2];
        if (id >= MAX_IDS) return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: vocab id %u is too large", id);
        if ((int64_t)id > max_id) max_id = id;
    }
    kn_code rc = max_added_id(added, &max_id, err);
    if (!rc) rc = alloc_ids(t, max_id, f->n_vocab, json_array_size(added), err);
    if (rc) return rc;
    t->arena = f->strings.p; /* take ownership of the strings */
    f->strings.p = NULL;
    f->strings.n = f->strings.cap = 0;
    for (size_t i = 0; i < f->n_vocab; i++) {
        const uint32_t *e = f->vocab + 3 * i;
        t->tok[e[2]] = t->arena + e[0];
        t->tok_len[e[2]] = e[1];
        if (kn_strmap_put(&t->model.vocab, (int32_t)e[2])) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    return KN_OK;
}

/* Unigram: vocab is [[piece, score], ...]; the id is the position. */
static kn_code load_vocab_unigram(kn_tokenizer *t, const json_t *vocab, const json_t *added, kn_error *err) {
    if (!json_is_array(vocab) || !json_array_size(vocab))
        return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: Unigram model.vocab must be a non-empty array");
    size_t n = json_array_size(vocab), bytes = 0;
    if (n >= MAX_IDS) return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: Unigram vocab too large");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(json_array_get(e, 0)) ||
            !json_is_number(json_array_get(e, 1)))
            return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: Unigram vocab entry %zu must be [piece, score]", i);
        bytes += json_string_length(json_array_get(e, 0)) + 1;
    }
    int64_t max_id = (int64_t)n - 1;
    kn_code rc = max_added_id(added, &max_id, err);
    if (!rc) rc = alloc_ids(t, max_id, n, json_array_size(added), err);
    if (rc) return rc;
    t->arena = malloc(bytes + 1);
    t->model.scores = malloc(n * sizeof *t->model.scores);
    if (!t->arena || !t->model.scores) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    char *p = t->arena;
    t->model.min_score = 1e300;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i), *str = json_array_get(e, 0);
        size_t l = json_string_length(str);
        memcpy(p, json_string_value(str), l + 1);
        t->tok[i] = p;
        t->tok_len[i] = (uint32_t)l;
        p += l + 1;
        double sc = json_number_value(json_array_get(e, 1));
        t->model.scores[i] = sc;
        if (sc < t->model.min_score) t->model.min_score = sc;
        if (kn_strmap_put(&t->model.vocab, (int32_t)i)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    return KN_OK;
}

static kn_code load_vocab(kn_tokenizer *t, const json_t *vocab, const json_t *added, kn_error *err) {
    if (!json_is_object(vocab)) return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: model.vocab must be an object");
    size_t n_vocab = json_object_size(vocab), bytes = 0;
    int64_t max_id = -1;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_IDS)
            return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: vocab entry \"%.60s\" has an invalid id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
        bytes += key_len + 1;
    }
    kn_code rc = max_added_id(added, &max_id, err);
    if (!rc) rc = alloc_ids(t, max_id, n_vocab, json_array_size(added), err);
    if (rc) return rc;
    t->arena = malloc(bytes + 1);
    if (!t->arena) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    char *p = t->arena;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        int32_t id = (int32_t)json_integer_value(val);
        memcpy(p, key, key_len);
        p[key_len] = 0;
        t->tok[id] = p;
        t->tok_len[id] = (uint32_t)key_len;
        p += key_len + 1;
        if (kn_strmap_put(&t->model.vocab, id)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    return KN_OK;
}

static kn_code load_added(kn_tokenizer *t, const json_t *added, kn_error *err) {
    size_t n = json_array_size(added);
    if (!n) return KN_OK;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_tok_ctx c;
    if (kn_tok_ctx_init(&c)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_tbuf norm = {0};
    t->added_content = calloc(n, sizeof *t->added_content);
    t->added_content_len = calloc(n, sizeof *t->added_content_len);
    if (!t->added_content || !t->added_content_len ||
        kn_strmap_init(&t->added_map, n, t->added_content, t->added_content_len)) {
        kn_tok_ctx_free(&c);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    int32_t next_id = t->model.n_model;
    kn_code rc = KN_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_string(content)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] needs a string \"content\"", i);
            break;
        }
        size_t len = json_string_length(content);
        if (!len) continue; /* HF ignores empty added tokens */
        kn_added_token *x = &t->added[t->n_added];
        x->content = malloc(len + 1);
        if (!x->content) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(x->content, json_string_value(content), len + 1);
        x->content_len = (uint32_t)len;
        x->special = (uint8_t)jflag(a, "special");
        x->normalized = (uint8_t)jflag(a, "normalized");
        x->lstrip = (uint8_t)jflag(a, "lstrip");
        x->rstrip = (uint8_t)jflag(a, "rstrip");
        x->single_word = (uint8_t)jflag(a, "single_word");
        /* ids as HF add_tokens assigns them: an earlier added token with this
         * string, else the model vocab's id, else the next id after the vocab
         * (the "id" field of tokenizer.json is not used, as in HF) */
        int32_t seen = kn_strmap_get(&t->added_map, x->content, len);
        int32_t vid = seen >= 0 ? t->added[seen].id : kn_strmap_get(&t->model.vocab, x->content, len);
        x->id = vid >= 0 ? vid : next_id++;
        if (x->id >= t->n_ids) {
            rc = kn_fail(err, KN_ERR_INTERNAL, "added token id %d beyond the id table", x->id);
            break;
        }
        x->pattern = x->content;
        x->pattern_len = x->content_len;
        t->n_added++;
        if (x->normalized && t->normalizer) {
            rc = kn_normalizer_apply(t->normalizer, &c, x->content, len, &norm, err);
            if (!rc && (norm.n != len || memcmp(norm.p, x->content, len))) {
                x->pattern = malloc(norm.n + 1);
                if (!x->pattern) {
                    x->pattern = x->content;
                    rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
                    break;
                }
                memcpy(x->pattern, norm.p, norm.n + 1);
                x->pattern_len = (uint32_t)norm.n;
            }
        }
        /* decode and id_to_token give a normalized token's normalized form (HF simple_id_to_token) */
        t->tok[x->id] = x->pattern;
        t->tok_len[x->id] = x->pattern_len;
        t->special[x->id] = x->special;
        size_t idx = t->n_added - 1;
        t->added_content[idx] = x->content;
        t->added_content_len[idx] = x->content_len;
        if (kn_strmap_put(&t->added_map, (int32_t)idx)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    kn_tbuf_free(&norm);
    kn_tok_ctx_free(&c);
    if (rc) return rc;
    int any_raw = 0, any_norm = 0;
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].normalized) any_norm = 1;
        else any_raw = 1;
    }
    if (any_raw) {
        if ((rc = kn_added_trie_build(&t->trie_raw, t->added, t->n_added, 0, err))) return rc;
        t->has_trie_raw = 1;
    }
    if (any_norm) {
        if ((rc = kn_added_trie_build(&t->trie_norm, t->added, t->n_added, 1, err))) return rc;
        t->has_trie_norm = 1;
    }
    return KN_OK;
}

static char *config_token(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

kn_code kn_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json, kn_tokenizer **out,
                               kn_error *err) {
    *out = NULL;
    json_error_t je;
    kn_vocab_fast fast;
    int use_fast = kn_vocab_fast_parse(tokenizer_json, len, &fast);
    json_t *root = use_fast ? json_loadb(fast.rest, fast.rest_len, JSON_ALLOW_NUL, &je)
                            : json_loadb(tokenizer_json, len, JSON_ALLOW_NUL, &je);
    if (!root) {
        if (use_fast) kn_vocab_fast_free(&fast);
        return kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    tokenizer_box *box = calloc(1, sizeof *box);
    if (!box) {
        json_decref(root);
        if (use_fast) kn_vocab_fast_free(&fast);
        return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    kn_tokenizer *t = &box->t;
    kn_code rc = KN_OK;
    const json_t *model = json_object_get(root, "model");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root) || !json_is_object(model)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: no \"model\" object");
        goto done;
    }
    if (added && !json_is_array(added) && !json_is_null(added)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "tokenizer.json: \"added_tokens\" must be an array");
        goto done;
    }
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") && strcmp(mtype, "WordPiece") && strcmp(mtype, "WordLevel") &&
        strcmp(mtype, "Unigram")) {
        rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                     "model type \"%s\" is not supported (supported: BPE, WordPiece, WordLevel, Unigram)", mtype);
        goto done;
    }
    if (mtype && !strcmp(mtype, "Unigram")) rc = load_vocab_unigram(t, json_object_get(model, "vocab"), added, err);
    else if (use_fast) rc = load_vocab_fast(t, &fast, added, err);
    else rc = load_vocab(t, json_object_get(model, "vocab"), added, err);
    if (rc) goto done;
    if ((rc = kn_tokmodel_parse(model, use_fast ? &fast : NULL, t, err))) goto done;
    if ((rc = kn_normalizer_parse(json_object_get(root, "normalizer"), &t->normalizer, err))) goto done;
    if ((rc = kn_pretok_parse(json_object_get(root, "pre_tokenizer"), &t->pretok, err))) goto done;
    if ((rc = kn_decoder_parse(json_object_get(root, "decoder"), &t->decoder, err))) goto done;
    if ((rc = load_added(t, added, err))) goto done;
    while (t->n_ids > 1 && t->tok_len[t->n_ids - 1] == KN_TOK_NONE) t->n_ids--; /* drop unused room */
    /* HF skips a token in decode when its string is a special added token's
     * content (is_special_token works on strings), which also catches other ids
     * with the same string */
    for (int32_t id = 0; t->n_added && id < t->n_ids; id++) {
        if (t->tok_len[id] == KN_TOK_NONE) continue;
        int32_t i = kn_strmap_get(&t->added_map, t->tok[id], t->tok_len[id]);
        t->special[id] = i >= 0 && t->added[i].special;
    }
    if ((rc = kn_postproc_parse(json_object_get(root, "post_processor"), t, &t->post, err))) goto done;
    if (config_json) {
        json_t *cfg = json_loads(config_json, JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg) {
            rc = kn_fail(err, KN_ERR_FORMAT, "tokenizer_config.json: %s (line %d)", je.text, je.line);
            goto done;
        }
        t->bos_token = config_token(cfg, "bos_token");
        t->eos_token = config_token(cfg, "eos_token");
        json_decref(cfg);
    }
done:
    json_decref(root);
    if (use_fast) kn_vocab_fast_free(&fast);
    if (rc) {
        kn_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return KN_OK;
}

static kn_code read_config(const char *dir, kn_tokenizer *t, kn_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!kn_is_file(path)) return KN_OK;
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) return kn_fail(err, KN_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    t->bos_token = config_token(cfg, "bos_token");
    t->eos_token = config_token(cfg, "eos_token");
    json_decref(cfg);
    return KN_OK;
}

#ifdef KILN_HAVE_SENTENCEPIECE
/* tokenizer.model only: SentencePiece does the work; the id arrays mirror its pieces. */
static kn_code load_spm(const char *dir, const char *path, kn_tokenizer **out, kn_error *err) {
    tokenizer_box *box = calloc(1, sizeof *box);
    if (!box) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_tokenizer *t = &box->t;
    char msg[400];
    kn_code rc = KN_OK;
    if (kn_spm_load(path, &t->spm, msg, sizeof msg)) {
        rc = kn_fail(err, KN_ERR_FORMAT, "%s", msg);
        goto done;
    }
    t->n_ids = kn_spm_piece_count(t->spm);
    t->tok = calloc((size_t)t->n_ids + 1, sizeof *t->tok);
    t->tok_len = malloc(((size_t)t->n_ids + 1) * sizeof *t->tok_len);
    t->special = calloc((size_t)t->n_ids + 1, 1);
    if (!t->tok || !t->tok_len || !t->special || t->n_ids <= 0 ||
        kn_strmap_init(&box->all, (size_t)t->n_ids, (const char *const *)t->tok, t->tok_len)) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int32_t id = 0; id < t->n_ids && !rc; id++) {
        size_t n;
        t->tok[id] = (char *)kn_spm_piece(t->spm, id, &n);
        t->tok_len[id] = (uint32_t)n;
        t->special[id] = (uint8_t)kn_spm_is_control(t->spm, id);
        if (kn_strmap_put(&box->all, id)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    if (!rc) rc = read_config(dir, t, err);
done:
    if (rc) {
        kn_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return KN_OK;
}
#endif

kn_code kn_tokenizer_load(const char *dir, kn_tokenizer **out, kn_error *err) {
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!kn_is_file(path)) {
        char spm[4096];
        snprintf(spm, sizeof spm, "%s/tokenizer.model", dir);
#ifdef KILN_HAVE_SENTENCEPIECE
        if (kn_is_file(spm)) return load_spm(dir, spm, out, err);
#else
        if (kn_is_file(spm))
            return kn_fail(err, KN_ERR_UNSUPPORTED,
                           "%s has only tokenizer.model (SentencePiece) and this build has no libsentencepiece; "
                           "kiln needs tokenizer.json",
                           dir);
#endif
        return kn_fail(err, KN_ERR_NOT_FOUND, "%s: no tokenizer.json", dir);
    }
    char *js = NULL, *cfg = NULL;
    size_t n, cn;
    kn_code rc = kn_read_file(path, MAX_TOKENIZER_JSON, &js, &n, err);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (kn_is_file(path) && (rc = kn_read_file(path, 64u << 20, &cfg, &cn, err))) {
        free(js);
        return rc;
    }
    rc = kn_tokenizer_load_json(js, n, cfg, out, err);
    if (rc) kn_fail_wrap(err, "%s", dir);
    free(js);
    free(cfg);
    return rc;
}

/* ---- encode ------------------------------------------------------------------ */

static kn_code encode(const kn_tokenizer *t, kn_tok_ctx *c, const char *text, size_t len, int add_special, kn_ids *ids,
                      kn_error *err) {
    kn_pieces a = {0}, b = {0};
    kn_code rc = KN_OK;
    /* 1. added tokens that match the raw text */
    if (t->has_trie_raw) rc = kn_added_split(t, &t->trie_raw, text, len, 1, &a);
    else if (len && kn_pieces_push(&a, text, len, -1, 1)) rc = KN_ERR_NOMEM;
    /* 2. normalize the rest, then added tokens that match normalized text */
    kn_tbuf *norm = &c->scratch[0];
    for (size_t i = 0; i < a.n && !rc; i++) {
        const kn_piece *x = &a.v[i];
        const char *s = a.text.p + x->off;
        if (x->added_id >= 0) {
            if (kn_pieces_push(&b, s, x->len, x->added_id, x->at_origin)) rc = KN_ERR_NOMEM;
            continue;
        }
        size_t n = x->len;
        if (t->normalizer) {
            if ((rc = kn_normalizer_apply(t->normalizer, c, s, n, norm, err))) goto done;
            s = norm->p;
            n = norm->n;
        }
        if (!n) continue;
        if (t->has_trie_norm) rc = kn_added_split(t, &t->trie_norm, s, n, x->at_origin, &b);
        else if (kn_pieces_push(&b, s, n, -1, x->at_origin)) rc = KN_ERR_NOMEM;
    }
    if (rc) goto done;
    /* 3. pre-tokenize */
    if (t->pretok && (rc = kn_pretok_apply(t->pretok, c, &b, err))) goto done;
    /* 4. model */
    for (size_t i = 0; i < b.n && !rc; i++) {
        const kn_piece *x = &b.v[i];
        if (x->added_id >= 0) rc = kn_ids_push(ids, x->added_id) ? KN_ERR_NOMEM : KN_OK;
        else rc = kn_tokmodel_encode_word(t, c, b.text.p + x->off, x->len, ids, err);
    }
    if (rc) goto done;
    /* 5. post-process */
    if (add_special && t->post) {
        kn_ids out = {0};
        rc = kn_postproc_apply(t->post, ids, &out, err);
        free(ids->v);
        *ids = out;
    }
done:
    kn_pieces_free(&a);
    kn_pieces_free(&b);
    if (rc == KN_ERR_NOMEM && !(err && err->code == KN_ERR_NOMEM)) return kn_fail(err, rc, "out of memory encoding text");
    return rc;
}

kn_code kn_tokenizer_encode(const kn_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                            int *n_ids, kn_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return kn_fail(err, KN_ERR_INVALID_ARG, "encode: NULL text");
    size_t ok = len ? kn_utf8_valid_prefix(text, len) : 0;
    if (ok != len) return kn_fail(err, KN_ERR_INVALID_ARG, "encode: input is not valid UTF-8 (byte %zu)", ok);
    if (len > (size_t)INT32_MAX / 2) return kn_fail(err, KN_ERR_INVALID_ARG, "encode: input too large (%zu bytes)", len);
#ifdef KILN_HAVE_SENTENCEPIECE
    if (t->spm) {
        char msg[400];
        if (kn_spm_encode(t->spm, text ? text : "", len, add_special, ids, n_ids, msg, sizeof msg))
            return kn_fail(err, KN_ERR_INTERNAL, "%s", msg);
        return KN_OK;
    }
#endif
    kn_tok_ctx c;
    if (kn_tok_ctx_init(&c)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_ids out = {0};
    kn_code rc = encode(t, &c, text ? text : "", len, add_special, &out, err);
    kn_tok_ctx_free(&c);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v) out.v = malloc(sizeof *out.v); /* never hand back NULL on success */
    if (!out.v) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    *ids = out.v;
    *n_ids = (int)out.n;
    return KN_OK;
}

/* ---- decode ------------------------------------------------------------------- */

kn_code kn_tokenizer_decode(const kn_tokenizer *t, const int32_t *ids, int n_ids, int skip_special, char **text,
                            size_t *len, kn_error *err) {
    *text = NULL;
    if (len) *len = 0;
    if (n_ids < 0 || (n_ids && !ids)) return kn_fail(err, KN_ERR_INVALID_ARG, "decode: bad id list");
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= t->n_ids)
            return kn_fail(err, KN_ERR_INVALID_ARG, "decode: id %d is outside the vocabulary (0..%d)", ids[i],
                           t->n_ids - 1);
#ifdef KILN_HAVE_SENTENCEPIECE
    if (t->spm) { /* SentencePiece always drops control symbols */
        char msg[400];
        size_t l;
        if (kn_spm_decode(t->spm, ids, n_ids, text, &l, msg, sizeof msg)) return kn_fail(err, KN_ERR_INTERNAL, "%s", msg);
        if (len) *len = l;
        return KN_OK;
    }
#endif
    kn_pieces p = {0};
    kn_tok_ctx c;
    if (kn_tok_ctx_init(&c)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    for (int i = 0; i < n_ids && !rc; i++) {
        int32_t id = ids[i];
        if (t->tok_len[id] == KN_TOK_NONE || (skip_special && t->special[id])) continue;
        if (kn_pieces_push(&p, t->tok[id], t->tok_len[id], -1, 0)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    if (!rc && t->decoder) rc = kn_decoder_apply(t->decoder, &c, &p, err);
    kn_tbuf out = {0};
    if (!rc && kn_tbuf_reserve(&out, 16)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < p.n && !rc; i++) {
        if ((!t->decoder && i && kn_tbuf_put(&out, " ", 1)) || kn_tbuf_put(&out, p.text.p + p.v[i].off, p.v[i].len))
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    }
    kn_pieces_free(&p);
    kn_tok_ctx_free(&c);
    if (rc) {
        kn_tbuf_free(&out);
        return rc;
    }
    out.p[out.n] = 0;
    *text = out.p;
    if (len) *len = out.n;
    return KN_OK;
}

/* ---- accessors ------------------------------------------------------------------ */

int kn_tokenizer_vocab_size(const kn_tokenizer *t) { return t->n_ids; }

int32_t kn_tokenizer_token_id(const kn_tokenizer *t, const char *token) {
    if (!token) return -1;
    size_t n = strlen(token);
    if (t->spm) return kn_strmap_get(&((const tokenizer_box *)t)->all, token, n);
    /* HF token_to_id: added tokens by content first, then the model vocab */
    int32_t i = t->n_added ? kn_strmap_get(&t->added_map, token, n) : -1;
    return i >= 0 ? t->added[i].id : kn_strmap_get(&t->model.vocab, token, n);
}

const char *kn_tokenizer_token(const kn_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] == KN_TOK_NONE) return NULL;
    return t->tok[id];
}

int kn_tokenizer_is_special(const kn_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *kn_tokenizer_bos_token(const kn_tokenizer *t) { return t->bos_token; }
const char *kn_tokenizer_eos_token(const kn_tokenizer *t) { return t->eos_token; }

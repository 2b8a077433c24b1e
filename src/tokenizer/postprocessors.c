/* postprocessors.c — tokenizer.json "post_processor" for one sequence with
 * add_special_tokens: TemplateProcessing (its "single" template), BERT
 * ([CLS] A [SEP]), RoBERTa (<s> A </s>), ByteLevel (offsets only: no ids
 * change) and Sequence. Pair templates are not needed by kiln (one text in,
 * ids out) and are ignored. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "tokenizer/tok_internal.h"

typedef enum { PP_TEMPLATE, PP_CLS_SEP, PP_NOOP, PP_SEQUENCE } pp_type;

/* one template item: the sequence itself (ids == NULL) or fixed special ids */
typedef struct {
    int32_t *ids;
    size_t n;
    int is_seq;
} pp_item;

struct kn_postproc {
    pp_type type;
    pp_item *items;
    size_t n_items;
    kn_postproc **child;
    size_t n_child;
};

void kn_postproc_free(kn_postproc *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_items; i++) free(p->items[i].ids);
    free(p->items);
    for (size_t i = 0; i < p->n_child; i++) kn_postproc_free(p->child[i]);
    free(p->child);
    free(p);
}

static kn_code add_item(kn_postproc *p, const int32_t *ids, size_t n, int is_seq, kn_error *err) {
    pp_item *v = realloc(p->items, (p->n_items + 1) * sizeof *v);
    if (!v) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    p->items = v;
    pp_item *it = &v[p->n_items++];
    memset(it, 0, sizeof *it);
    it->is_seq = is_seq;
    if (n) {
        it->ids = malloc(n * sizeof *ids);
        if (!it->ids) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        memcpy(it->ids, ids, n * sizeof *ids);
        it->n = n;
    }
    return KN_OK;
}

static kn_code template_special(kn_postproc *p, const json_t *special_tokens, const char *name,
                                const struct kn_tokenizer *t, kn_error *err) {
    const json_t *st = json_object_get(special_tokens, name);
    const json_t *ids = json_object_get(st, "ids");
    if (!json_is_array(ids))
        return kn_fail(err, KN_ERR_FORMAT, "post_processor TemplateProcessing: special token \"%.60s\" is not defined",
                       name);
    size_t n = json_array_size(ids);
    int32_t *v = malloc((n + 1) * sizeof *v);
    if (!v) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(ids, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= t->n_ids) {
            free(v);
            return kn_fail(err, KN_ERR_FORMAT, "post_processor TemplateProcessing: bad id for \"%.60s\"", name);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    kn_code rc = add_item(p, v, n, 0, err);
    free(v);
    return rc;
}

static kn_code cls_sep_id(const json_t *j, const char *key, const struct kn_tokenizer *t, int32_t *id, kn_error *err) {
    const json_t *a = json_object_get(j, key);
    const json_t *x = json_array_get(a, 1);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= t->n_ids)
        return kn_fail(err, KN_ERR_FORMAT, "post_processor: \"%s\" must be [token, id] with a valid id", key);
    *id = (int32_t)json_integer_value(x);
    return KN_OK;
}

kn_code kn_postproc_parse(const json_t *j, const struct kn_tokenizer *t, kn_postproc **out, kn_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return KN_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kn_fail(err, KN_ERR_FORMAT, "post_processor without a \"type\"");
    kn_postproc *p = calloc(1, sizeof *p);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        p->type = PP_TEMPLATE;
        const json_t *single = json_object_get(j, "single"), *sp = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "post_processor TemplateProcessing without a \"single\" array");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
            const json_t *it = json_array_get(single, i);
            const json_t *s = json_object_get(it, "SpecialToken"), *q = json_object_get(it, "Sequence");
            if (json_is_object(s) && json_is_string(json_object_get(s, "id")))
                rc = template_special(p, sp, json_string_value(json_object_get(s, "id")), t, err);
            else if (json_is_object(q)) rc = add_item(p, NULL, 0, 1, err);
            else if (json_is_string(it)) {
                /* piece syntax: "$A", "$0", "$A:1" or "[CLS]", "[CLS]:0" */
                const char *str = json_string_value(it);
                if (str[0] == '$') rc = add_item(p, NULL, 0, 1, err);
                else {
                    char name[256];
                    snprintf(name, sizeof name, "%s", str);
                    char *colon = strrchr(name, ':');
                    if (colon) *colon = 0;
                    rc = template_special(p, sp, name, t, err);
                }
            } else rc = kn_fail(err, KN_ERR_FORMAT, "post_processor TemplateProcessing: bad template item %zu", i);
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        p->type = PP_CLS_SEP;
        int32_t cls, sep;
        if ((rc = cls_sep_id(j, "cls", t, &cls, err)) || (rc = cls_sep_id(j, "sep", t, &sep, err))) goto done;
        if (!(rc = add_item(p, &cls, 1, 0, err)) && !(rc = add_item(p, NULL, 0, 1, err))) rc = add_item(p, &sep, 1, 0, err);
    } else if (!strcmp(type, "ByteLevel")) p->type = PP_NOOP;
    else if (!strcmp(type, "Sequence")) {
        p->type = PP_SEQUENCE;
        const json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a)) {
            rc = kn_fail(err, KN_ERR_FORMAT, "post_processor Sequence without a \"processors\" array");
            goto done;
        }
        p->child = calloc(json_array_size(a) + 1, sizeof *p->child);
        if (!p->child) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            kn_postproc *c;
            if (!(rc = kn_postproc_parse(json_array_get(a, i), t, &c, err)) && c) p->child[p->n_child++] = c;
        }
    } else
        rc = kn_fail(err, KN_ERR_UNSUPPORTED,
                     "post_processor type \"%s\" is not supported (supported: TemplateProcessing, BertProcessing, "
                     "RobertaProcessing, ByteLevel, Sequence)",
                     type);
done:
    if (rc) {
        kn_postproc_free(p);
        return rc;
    }
    *out = p;
    return KN_OK;
}

kn_code kn_postproc_apply(const kn_postproc *p, const kn_ids *in, kn_ids *out, kn_error *err) {
    out->n = 0;
    switch (p->type) {
    case PP_NOOP: return kn_ids_append(out, in->v, in->n) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
    case PP_TEMPLATE:
    case PP_CLS_SEP:
        for (size_t i = 0; i < p->n_items; i++) {
            const pp_item *it = &p->items[i];
            if (it->is_seq ? kn_ids_append(out, in->v, in->n) : kn_ids_append(out, it->ids, it->n))
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        return KN_OK;
    case PP_SEQUENCE: {
        kn_ids cur = {0};
        if (kn_ids_append(&cur, in->v, in->n)) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < p->n_child; i++) {
            kn_code rc = kn_postproc_apply(p->child[i], &cur, out, err);
            if (rc) {
                free(cur.v);
                return rc;
            }
            cur.n = 0;
            if (kn_ids_append(&cur, out->v, out->n)) {
                free(cur.v);
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            }
        }
        out->n = 0;
        kn_code rc = kn_ids_append(out, cur.v, cur.n) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
        free(cur.v);
        return rc;
    }
    }
    return kn_fail(err, KN_ERR_INTERNAL, "post_processor: bad type");
}

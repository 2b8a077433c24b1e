/* quantize.c — see quantize.h. Reads the input through the validating
 * safetensors reader, quantizes one tensor at a time (kn_quant_group, MLX's
 * arithmetic) and streams the output through st_writer; scales and biases
 * are stored in the input tensor's dtype (as mlx-lm does). */
#include "io/quantize.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include "base/quant.h"
#include "io/file_util.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/st_writer.h"

int kn_quantize_selects(const char *name, int ndim, const int64_t *shape, int group_size) {
    size_t len = strlen(name);
    if (ndim != 2 || len < 7 || strcmp(name + len - 7, ".weight") != 0) return 0;
    if (shape[1] % group_size != 0 || shape[0] < 16) return 0;
    static const char *const keep[] = {".experts.", "mlp.gate.weight", "shared_expert_gate.", "block_sparse_moe.gate.",
                                       "vision", "multi_modal_projector", "audio"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        if (strstr(name, keep[i])) return 0;
    return 1;
}

int kn_quantize_recipe(const char *recipe, int *low_bits, int *high_bits) {
    static const struct {
        const char *name;
        int low, high;
    } recipes[] = {{"mixed_2_6", 2, 6}, {"mixed_3_4", 3, 4}, {"mixed_3_6", 3, 6}, {"mixed_4_6", 4, 6}};
    for (size_t i = 0; recipe && i < sizeof recipes / sizeof *recipes; i++)
        if (!strcmp(recipe, recipes[i].name)) {
            *low_bits = recipes[i].low, *high_bits = recipes[i].high;
            return 1;
        }
    return 0;
}

/* the first all-digit component of a dotted tensor name (the layer), or 0 */
static int layer_index(const char *name) {
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '.');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        size_t d = 0;
        while (d < n && p[d] >= '0' && p[d] <= '9') d++;
        if (n > 0 && d == n && n < 9) return atoi(p);
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int kn_quantize_recipe_bits(const char *recipe, const char *tensor, int n_layers) {
    int low, high;
    if (!kn_quantize_recipe(recipe, &low, &high)) return 0;
    const int i = layer_index(tensor), eighth = n_layers / 8;
    const int more = i < eighth || i >= 7 * n_layers / 8 || (i - eighth) % 3 == 2;
    if (strstr(tensor, "lm_head")) return high;
    if (more && (strstr(tensor, "v_proj") || strstr(tensor, "v_a_proj") || strstr(tensor, "v_b_proj") ||
                 strstr(tensor, "down_proj")))
        return high;
    return low;
}

static kn_code copy_file(const char *src, const char *dst, kn_error *err) {
    char *buf;
    size_t len;
    kn_code rc = kn_read_file(src, 1u << 30, &buf, &len, err);
    if (rc) return rc;
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    free(buf);
    return ok ? KN_OK : kn_fail(err, KN_ERR_IO, "cannot write %s", dst);
}

/* tokenizer / generation / chat-template files travel with the weights */
static int is_side_file(const char *n) {
    static const char *const pre[] = {"tokenizer", "special_tokens_map", "generation_config", "vocab", "merges",
                                      "added_tokens", "chat_template"};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        if (!strncmp(n, pre[i], strlen(pre[i]))) return 1;
    return 0;
}

/* config.json with the quantization block: default bits/group size, and an
 * entry per module quantized with other bits (overrides[i] names a tensor
 * "<module>.weight" and its bits) */
static kn_code write_config(const char *in_dir, const char *out_dir, const kn_quantize_opts *o, int bits,
                            char *const *override_names, const int *override_bits, int n_overrides, kn_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", in_dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return kn_fail(err, KN_ERR_FORMAT, "%s: not a JSON object", path);
    }
    for (int i = 0; i < 2; i++) {
        json_t *q = json_object();
        json_object_set_new(q, "group_size", json_integer(o->group_size));
        json_object_set_new(q, "bits", json_integer(bits));
        json_object_set_new(q, "mode", json_string("affine"));
        for (int k = 0; k < n_overrides; k++) {
            json_t *m = json_object();
            json_object_set_new(m, "group_size", json_integer(o->group_size));
            json_object_set_new(m, "bits", json_integer(override_bits[k]));
            json_object_set_new(m, "mode", json_string("affine"));
            const size_t len = strlen(override_names[k]); /* minus ".weight": the module path */
            char path_key[512];
            snprintf(path_key, sizeof path_key, "%.*s", (int)(len - 7), override_names[k]);
            json_object_set_new(q, path_key, m);
        }
        json_object_set_new(root, i ? "quantization_config" : "quantization", q);
    }
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    int bad = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return bad ? kn_fail(err, KN_ERR_IO, "cannot write %s", path) : KN_OK;
}

/* quantize tensor t (rows x cols, float dtype) into q / sc / bi (sc, bi in t's dtype) */
static void quantize_tensor(const kn_st_tensor *t, int bits, int gs, uint32_t *q, void *sc, void *bi, float *row) {
    const int64_t rows = t->shape[0], cols = t->shape[1], G = cols / gs, words = kn_quant_row_words(cols, bits);
    const size_t esz = kn_dtype_size(t->dtype);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = kn_load_f32(t->data, t->dtype, r * cols + c);
        for (int64_t g = 0; g < G; g++) {
            float s, b;
            kn_quant_group(row + g * gs, gs, bits, q + r * words + g * gs * bits / 32, &s, &b);
            uint8_t *sp = (uint8_t *)sc + (size_t)(r * G + g) * esz, *bp = (uint8_t *)bi + (size_t)(r * G + g) * esz;
            if (t->dtype == KN_DT_F32) memcpy(sp, &s, 4), memcpy(bp, &b, 4);
            else {
                uint16_t hs = t->dtype == KN_DT_BF16 ? kn_f32_to_bf16(s) : kn_f32_to_f16(s);
                uint16_t hb = t->dtype == KN_DT_BF16 ? kn_f32_to_bf16(b) : kn_f32_to_f16(b);
                memcpy(sp, &hs, 2), memcpy(bp, &hb, 2);
            }
        }
    }
}

/* Per-expert weights "<p>.experts.<e>.<proj>.weight" (HF layouts; mixtral's
 * w1/w3/w2 = gate/up/down) are written as mlx-lm writes them: one stacked
 * tensor "<p>.switch_mlp.<proj>.weight" [E, rows, ...] per projection, its
 * experts in id order. A group is stacked only when experts 0..E-1 are all
 * there with one shape and float dtype; it is quantized when its columns
 * split into groups, else kept in its dtype (as mlx-lm does). */
typedef struct {
    char *name;      /* "<p>.switch_mlp.<proj>.weight" */
    size_t *members; /* input index of expert e */
    int64_t n_members, rows, cols;
    kn_dtype dtype;
    int ok, quant;
} xgroup;

/* 1 and the stacked name / expert id when name is a per-expert weight */
static int expert_member(const char *name, char *stacked, size_t cap, int64_t *expert) {
    static const char *const from[] = {"gate_proj", "up_proj", "down_proj", "w1", "w3", "w2"};
    static const char *const to[] = {"gate_proj", "up_proj", "down_proj", "gate_proj", "up_proj", "down_proj"};
    const char *x = strstr(name, ".experts.");
    if (!x) return 0;
    const char *d = x + 9, *e = d;
    while (*e >= '0' && *e <= '9') e++;
    if (e == d || e - d > 6 || *e != '.') return 0;
    for (size_t i = 0; i < sizeof from / sizeof *from; i++) {
        const size_t n = strlen(from[i]);
        if (!strncmp(e + 1, from[i], n) && !strcmp(e + 1 + n, ".weight")) {
            snprintf(stacked, cap, "%.*s.switch_mlp.%s.weight", (int)(x - name), name, to[i]);
            *expert = atoll(d);
            return 1;
        }
    }
    return 0;
}

/* the groups of per-expert weights in `in`; *member_of[i] = group of input i or -1 */
static kn_code find_expert_groups(const kn_safetensors *in, int gs, xgroup **out, size_t *n_out, long *member_of,
                                  kn_error *err) {
    const size_t n = kn_st_count(in);
    xgroup *g = NULL;
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        const kn_st_tensor *t = kn_st_at(in, i);
        char sname[512];
        int64_t e;
        member_of[i] = -1;
        if (!expert_member(t->name, sname, sizeof sname, &e)) continue;
        size_t j = 0;
        while (j < ng && strcmp(g[j].name, sname)) j++;
        if (j == ng) {
            xgroup *ng2 = realloc(g, (ng + 1) * sizeof *g);
            if (!ng2) goto nomem;
            g = ng2;
            g[ng] = (xgroup){.name = strdup(sname), .members = calloc(n, sizeof(size_t)), .rows = -1, .ok = 1};
            if (!g[ng].name || !g[ng].members) {
                ng++;
                goto nomem;
            }
            ng++;
        }
        xgroup *x = &g[j];
        const int is_float = t->dtype == KN_DT_F32 || t->dtype == KN_DT_BF16 || t->dtype == KN_DT_F16;
        if (x->rows < 0) x->rows = t->ndim == 2 ? t->shape[0] : 0, x->cols = t->ndim == 2 ? t->shape[1] : 0, x->dtype = t->dtype;
        if (!is_float || t->ndim != 2 || t->shape[0] != x->rows || t->shape[1] != x->cols || t->dtype != x->dtype ||
            e < 0 || e >= (int64_t)n || x->members[e])
            x->ok = 0;
        else
            x->members[e] = i + 1; /* 0 = absent */
        x->n_members = e + 1 > x->n_members ? e + 1 : x->n_members;
        member_of[i] = (long)j;
    }
    for (size_t j = 0; j < ng; j++) {
        for (int64_t e = 0; e < g[j].n_members; e++)
            if (!g[j].members[e]) g[j].ok = 0;
        g[j].quant = g[j].ok && g[j].cols % gs == 0;
    }
    *out = g, *n_out = ng;
    return KN_OK;
nomem:
    for (size_t j = 0; j < ng; j++) free(g[j].name), free(g[j].members);
    free(g);
    return kn_fail(err, KN_ERR_NOMEM, "out of memory");
}

kn_code kn_quantize_checkpoint(const char *in_dir, const char *out_dir, const kn_quantize_opts *o,
                               kn_quantize_stats *stats, kn_error *err) {
    kn_quantize_stats st0 = {0};
    if (stats) *stats = st0;
    int low = o->bits, high = o->bits;
    if (o->mixed && !kn_quantize_recipe(o->mixed, &low, &high))
        return kn_fail(err, KN_ERR_INVALID_ARG,
                       "kiln quantize: unknown mixed-precision recipe \"%s\" (mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6)",
                       o->mixed);
    kn_code rc = kn_quant_check("kiln quantize", low, o->group_size, 1, o->group_size, err);
    if (!rc) rc = kn_quant_check("kiln quantize", high, o->group_size, 1, o->group_size, err);
    if (rc) return rc;
    if (!kn_is_dir(in_dir)) return kn_fail(err, KN_ERR_IO, "%s: not a readable checkpoint directory", in_dir);
    kn_model_config cfg;
    if ((rc = kn_config_load(in_dir, &cfg, err))) return kn_fail_wrap(err, "%s", in_dir);
    if (cfg.quant_bits) return kn_fail(err, KN_ERR_UNSUPPORTED, "%s is already quantized (%d-bit)", in_dir, cfg.quant_bits);
    struct stat sb;
    if (stat(out_dir, &sb) == 0 && !o->force)
        return kn_fail(err, KN_ERR_INVALID_ARG, "%s already exists (use --force to overwrite)", out_dir);
    if (stat(out_dir, &sb) != 0 && mkdir(out_dir, 0777) != 0)
        return kn_fail(err, KN_ERR_IO, "cannot create %s: %s", out_dir, strerror(errno));
    if (!kn_is_dir(out_dir)) return kn_fail(err, KN_ERR_IO, "%s is not a directory", out_dir);
    kn_safetensors *in;
    if ((rc = kn_st_open(in_dir, &in, err))) return rc;
    const size_t n = kn_st_count(in);
    /* each input tensor becomes 1 (kept) or 3 (weight, scales, biases) outputs */
    kn_stw_desc *d = calloc(3 * n + 1, sizeof *d);
    char **names = calloc(3 * n + 1, sizeof *names);
    uint8_t *sel = calloc(n + 1, 1);
    int *tbits = calloc(n + 1, sizeof *tbits), *obits = calloc(n + 1, sizeof *obits), n_over = 0;
    char **onames = calloc(n + 1, sizeof *onames);
    long *member_of = calloc(n + 1, sizeof *member_of);
    xgroup *xg = NULL;
    size_t n_xg = 0;
    kn_st_writer *w = NULL;
    float *row = NULL;
    void *qbuf = NULL, *sbuf = NULL, *bbuf = NULL;
    size_t nd = 0, max_cols = 0, max_q = 0, max_s = 0, max_stack = 0;
    uint8_t *stack = NULL; /* a float expert stack being written */
    if (!d || !names || !sel || !tbits || !obits || !onames || !member_of) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    kn_quantize_stats s = st0;
    s.low_bits = low, s.high_bits = high;
    if ((rc = find_expert_groups(in, o->group_size, &xg, &n_xg, member_of, err))) goto done;
    for (size_t i = 0; i < n; i++) {
        const kn_st_tensor *t = kn_st_at(in, i);
        int is_float = t->dtype == KN_DT_F32 || t->dtype == KN_DT_BF16 || t->dtype == KN_DT_F16;
        const xgroup *x = member_of[i] >= 0 && xg[member_of[i]].ok ? &xg[member_of[i]] : NULL;
        if (x && x->members[0] != i + 1) { /* stacked with expert 0's output */
            sel[i] = 3, s.bytes_in += (double)t->nbytes;
            continue;
        }
        s.bytes_in += (double)t->nbytes;
        size_t len = strlen(t->name);
        if (len > 7 && !strcmp(t->name + len - 7, ".scales")) {
            rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: tensor %s: the checkpoint is already quantized", in_dir, t->name);
            goto done;
        }
        if (t->ndim == 2 && len > 7 && !strcmp(t->name + len - 7, ".weight") && !is_float) {
            rc = kn_fail(err, KN_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (supported: F32, BF16, F16)", in_dir,
                         t->name, kn_dtype_name(t->dtype));
            goto done;
        }
        sel[i] = x ? (x->quant ? 2 : 4) : is_float && kn_quantize_selects(t->name, t->ndim, t->shape, o->group_size);
        if (sel[i] == 4) { /* stacked, kept in its dtype */
            d[nd] = (kn_stw_desc){.name = x->name, .dtype = t->dtype, .ndim = 3};
            d[nd].shape[0] = x->n_members, d[nd].shape[1] = x->rows, d[nd].shape[2] = x->cols;
            nd++, s.n_kept += (int)x->n_members, s.bytes_out += (double)x->n_members * (double)t->nbytes;
            if ((size_t)x->n_members * t->nbytes > max_stack) max_stack = (size_t)x->n_members * t->nbytes;
            continue;
        }
        if (!sel[i]) {
            d[nd] = (kn_stw_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
            memcpy(d[nd].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
            nd++, s.n_kept++, s.bytes_out += (double)t->nbytes;
            continue;
        }
        const char *oname = x ? x->name : t->name; /* the output tensor's name */
        const int64_t E = x ? x->n_members : 1, rows = t->shape[0], cols = t->shape[1], G = cols / o->group_size;
        tbits[i] = o->mixed ? kn_quantize_recipe_bits(o->mixed, oname, cfg.n_layers) : o->bits;
        if (tbits[i] != low) onames[n_over] = (char *)oname, obits[n_over++] = tbits[i], s.n_high++;
        const int64_t words = kn_quant_row_words(cols, tbits[i]);
        char base[512];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(oname) - 7), oname);
        const char *suffix[3] = {".weight", ".scales", ".biases"};
        for (int k = 0; k < 3; k++) {
            size_t nl = strlen(base) + 8;
            if (!(names[nd] = malloc(nl))) {
                rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
                goto done;
            }
            snprintf(names[nd], nl, "%s%s", base, suffix[k]);
            d[nd] = (kn_stw_desc){.name = names[nd], .dtype = k ? t->dtype : KN_DT_U32, .ndim = x ? 3 : 2};
            if (x) d[nd].shape[0] = E, d[nd].shape[1] = rows, d[nd].shape[2] = k ? G : words;
            else d[nd].shape[0] = rows, d[nd].shape[1] = k ? G : words;
            nd++;
        }
        if ((size_t)cols > max_cols) max_cols = (size_t)cols;
        if ((size_t)(E * rows * words) > max_q) max_q = (size_t)(E * rows * words);
        if ((size_t)(E * rows * G) > max_s) max_s = (size_t)(E * rows * G);
        s.n_quantized += (int)E;
        s.bytes_out += (double)E * ((double)(rows * words * 4) + 2.0 * (double)(rows * G) * (double)kn_dtype_size(t->dtype));
    }
    row = malloc((max_cols + 1) * sizeof(float));
    if (max_stack && !(stack = malloc(max_stack))) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    qbuf = malloc((max_q + 1) * 4), sbuf = malloc((max_s + 1) * 4), bbuf = malloc((max_s + 1) * 4);
    if (!row || !qbuf || !sbuf || !bbuf) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((rc = kn_st_writer_open(path, d, nd, "mlx", &w, err))) goto done;
    for (size_t i = 0; i < n && !rc; i++) {
        const kn_st_tensor *t = kn_st_at(in, i);
        if (sel[i] == 3) continue; /* written with its group */
        if (sel[i] == 4) {
            const xgroup *x = &xg[member_of[i]];
            for (int64_t e = 0; e < x->n_members; e++)
                memcpy(stack + (size_t)e * t->nbytes, kn_st_at(in, x->members[e] - 1)->data, t->nbytes);
            rc = kn_st_writer_put(w, stack, (size_t)x->n_members * t->nbytes, err);
            continue;
        }
        if (!sel[i]) {
            rc = kn_st_writer_put(w, t->data, t->nbytes, err);
            continue;
        }
        const xgroup *x = sel[i] == 2 ? &xg[member_of[i]] : NULL;
        const int64_t E = x ? x->n_members : 1, rows = t->shape[0], cols = t->shape[1], G = cols / o->group_size;
        const int64_t words = kn_quant_row_words(cols, tbits[i]);
        const size_t sbytes = (size_t)(rows * G) * kn_dtype_size(t->dtype);
        for (int64_t e = 0; e < E; e++) /* expert by expert into the stacked buffers */
            quantize_tensor(x ? kn_st_at(in, x->members[e] - 1) : t, tbits[i], o->group_size,
                            (uint32_t *)qbuf + e * rows * words, (uint8_t *)sbuf + (size_t)e * sbytes,
                            (uint8_t *)bbuf + (size_t)e * sbytes, row);
        rc = kn_st_writer_put(w, qbuf, (size_t)(E * rows * words) * 4, err);
        if (!rc) rc = kn_st_writer_put(w, sbuf, (size_t)E * sbytes, err);
        if (!rc) rc = kn_st_writer_put(w, bbuf, (size_t)E * sbytes, err);
    }
    if (rc) goto done;
    rc = kn_st_writer_close(w, err);
    w = NULL;
    if (rc) goto done;
    if ((rc = write_config(in_dir, out_dir, o, low, onames, obits, n_over, err))) goto done;
    DIR *dir = opendir(in_dir);
    struct dirent *e;
    while (dir && !rc && (e = readdir(dir))) {
        if (!is_side_file(e->d_name)) continue;
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", in_dir, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", out_dir, e->d_name);
        if (kn_is_file(src)) rc = copy_file(src, dst, err);
    }
    if (dir) closedir(dir);
    if (!rc && stats) *stats = s;
done:
    kn_st_writer_abort(w);
    for (size_t i = 0; names && i < nd; i++) free(names[i]);
    free(names), free(d), free(sel), free(row), free(qbuf), free(sbuf), free(bbuf), free(tbits), free(obits),
        free(onames), free(member_of), free(stack);
    for (size_t j = 0; j < n_xg; j++) free(xg[j].name), free(xg[j].members);
    free(xg);
    kn_st_close(in);
    return rc;
}

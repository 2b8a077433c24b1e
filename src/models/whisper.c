/* whisper.c — Whisper encoder-decoder: config, weights from HF tensor names,
 * encoder, decoder with self-attention cache and cross-attention K/V computed
 * once per window. Matches transformers' modeling_whisper (pre-LN layers):
 *
 *   encoder: x = gelu(conv1(mel)); x = gelu(conv2(x)) (stride 2); x += pos
 *            per layer: x += out(attn(ln1(x)));  x += fc2(gelu(fc1(ln2(x))))
 *            x = ln_post(x)
 *   decoder: x = embed(tok) + pos[p]
 *            per layer: x += out(causal_self_attn(ln1(x)))
 *                       x += out(cross_attn(ln2(x), enc))
 *                       x += fc2(gelu(fc1(ln3(x))))
 *            logits = ln_post(x) @ embed^T   (proj_out is tied to embed)
 * Convolutions are im2col + matmul. k_proj has no bias (zeros here, so q|k|v
 * fuse into one matmul in the encoder; the decoder keeps q apart from k|v,
 * whose rows go to the cache). The self-attention cache is [max_slots,
 * max_target, 2*d] per layer (k | v per row), cross K/V [n_ctx, 2*d]. */
#include "models/whisper.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/file_util.h"
#include "io/safetensors.h"

typedef struct {
    kn_weight qkv, o, fc1, fc2;              /* self-attention: encoder q|k|v fused, decoder q only */
    kn_weight kv;                            /* decoder self-attention k|v [2d, d] */
    float *kv_b;                             /* [2d] (k has no bias) */
    kn_weight cq, ckv, co;                   /* cross-attention (decoder) */
    float *qkv_b, *o_b, *fc1_b, *fc2_b;      /* [3d], [d], [ffn], [d] */
    float *cq_b, *ckv_b, *co_b;              /* [d], [2d], [d] */
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;    /* attn / (decoder: cross) */
    float *ln3_w, *ln3_b;                    /* decoder mlp norm */
    float *kv_cache, *kv_spare;              /* [max_slots, max_target, 2d] */
    float *cross_kv;                         /* [n_ctx, 2d] */
} wlayer;

struct kn_whisper {
    kn_whisper_config cfg;
    kn_backend *be;
    kn_safetensors *st;
    kn_weight conv1, conv2, embed;
    float *conv1_b, *conv2_b, *enc_pos, *dec_pos; /* [d], [d], [n_ctx, d], [max_target, d] */
    float *enc_ln_w, *enc_ln_b, *dec_ln_w, *dec_ln_b;
    wlayer *enc, *dec;
    int n_ctx, max_slots, max_rows, d;
    /* scratch (backend memory) */
    float *mel, *cols;           /* [n_mels, 3000], im2col [3000, 3*max(n_mels, d)] */
    float *conv_out;             /* [3000, d] */
    float *x, *xn, *qkv, *attn, *ffn, *kvtmp; /* rows x (d, d, 3d, d, ffn, 2d) */
    float *last, *logits;        /* [max_slots, d], [max_logit_rows, V] */
    int max_logit_rows;
    int32_t *d_tokens, *d_iota, *d_idx; /* [max_rows], [max_rows], [max_slots * max_target] */
    int32_t *h_idx;
    /* kn_whisper_cross_qk capture (NULL when not recording) */
    float *qk_out, *qk_q, *qk_k; /* out [n_align, rows, frames]; host q [rows, d] and k [frames, 2d] */
    int qk_frames;
    char desc[256];
};

/* ---- config --------------------------------------------------------------- */

static int jint(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
        return (int)json_integer_value(json_array_get(v, 0)); /* eos_token_id may be a list */
    return dflt;
}

static int read_int_list(json_t *arr, int *out, int max) {
    if (!json_is_array(arr)) return 0;
    int n = 0;
    for (size_t i = 0; i < json_array_size(arr) && n < max; i++)
        if (json_is_integer(json_array_get(arr, i))) out[n++] = (int)json_integer_value(json_array_get(arr, i));
    return n;
}

int kn_whisper_is_whisper_dir(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) return 0;
    const char *mt = json_string_value(json_object_get(j, "model_type"));
    int yes = mt && !strcmp(mt, "whisper");
    json_decref(j);
    return yes;
}

/* openai-whisper without a per-model table: every head of the last half of
 * the decoder layers */
static kn_code default_alignment_heads(kn_whisper_config *c) {
    if (c->n_align > 0) return KN_OK;
    for (int l = c->dec_layers / 2; l < c->dec_layers; l++)
        for (int h = 0; h < c->dec_heads && c->n_align < KN_WHISPER_MAX_ALIGN_HEADS; h++)
            c->align_layer[c->n_align] = l, c->align_head[c->n_align++] = h;
    return KN_OK;
}

static kn_code parse_config(const char *dir, kn_whisper_config *c, kn_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    kn_code rc = kn_read_file(path, 1 << 20, &text, &len, err);
    if (rc) return rc;
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    free(text);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON (%s, line %d)", path, je.text, je.line);
    }
    memset(c, 0, sizeof *c);
    const char *mt = json_string_value(json_object_get(j, "model_type"));
    if (!mt || strcmp(mt, "whisper")) {
        json_decref(j);
        return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not whisper", path, mt ? mt : "(none)");
    }
    c->vocab_size = jint(j, "vocab_size", 0);
    c->n_mels = jint(j, "num_mel_bins", 80);
    c->d_model = jint(j, "d_model", 0);
    c->enc_layers = jint(j, "encoder_layers", 0);
    c->enc_heads = jint(j, "encoder_attention_heads", 0);
    c->enc_ffn = jint(j, "encoder_ffn_dim", 0);
    c->dec_layers = jint(j, "decoder_layers", 0);
    c->dec_heads = jint(j, "decoder_attention_heads", 0);
    c->dec_ffn = jint(j, "decoder_ffn_dim", 0);
    c->max_source_positions = jint(j, "max_source_positions", 1500);
    c->max_target_positions = jint(j, "max_target_positions", 448);
    c->decoder_start_token_id = jint(j, "decoder_start_token_id", -1);
    c->eos_token_id = jint(j, "eos_token_id", -1);
    char act_buf[64] = "gelu";
    const char *act = json_string_value(json_object_get(j, "activation_function"));
    if (act) snprintf(act_buf, sizeof act_buf, "%s", act);
    act = act_buf;
    int scale_embedding = json_is_true(json_object_get(j, "scale_embedding"));
    json_decref(j);

    if (!strcmp(act, "gelu")) c->gelu_approx = KN_GELU_ERF;
    else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh")) c->gelu_approx = KN_GELU_TANH;
    else return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: activation_function \"%s\" (supported: gelu, gelu_new)", path, act);
    if (scale_embedding) return kn_fail(err, KN_ERR_UNSUPPORTED, "%s: scale_embedding true is not supported", path);
    if (c->vocab_size <= 0 || c->d_model <= 0 || c->enc_layers <= 0 || c->dec_layers <= 0 || c->enc_heads <= 0 ||
        c->dec_heads <= 0 || c->enc_ffn <= 0 || c->dec_ffn <= 0 || c->n_mels <= 0 || c->n_mels > 512 ||
        c->d_model % c->enc_heads || c->d_model % c->dec_heads || c->max_source_positions <= 0 ||
        c->max_source_positions > 1500 || c->max_target_positions <= 0 || c->max_target_positions > 4096 ||
        c->enc_layers > 256 || c->dec_layers > 256 || c->vocab_size > (1 << 22) || c->d_model > 16384)
        return kn_fail(err, KN_ERR_FORMAT, "%s: invalid or missing whisper sizes", path);

    /* generation_config.json: optional, but decoding needs it */
    c->no_timestamps_token_id = c->prev_sot_token_id = c->transcribe_token_id = c->translate_token_id = -1;
    c->max_initial_timestamp_index = -1;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!kn_is_file(path)) return default_alignment_heads(c);
    rc = kn_read_file(path, 8 << 20, &text, &len, err);
    if (rc) return rc;
    j = json_loadb(text, len, 0, &je);
    free(text);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return kn_fail(err, KN_ERR_FORMAT, "%s: invalid JSON (%s, line %d)", path, je.text, je.line);
    }
    c->decoder_start_token_id = jint(j, "decoder_start_token_id", c->decoder_start_token_id);
    c->eos_token_id = jint(j, "eos_token_id", c->eos_token_id);
    c->no_timestamps_token_id = jint(j, "no_timestamps_token_id", -1);
    c->prev_sot_token_id = jint(j, "prev_sot_token_id", -1);
    c->max_initial_timestamp_index = jint(j, "max_initial_timestamp_index", -1);
    c->is_multilingual = json_is_true(json_object_get(j, "is_multilingual"));
    c->n_suppress = read_int_list(json_object_get(j, "suppress_tokens"), c->suppress_tokens, KN_WHISPER_MAX_SUPPRESS);
    c->n_begin_suppress = read_int_list(json_object_get(j, "begin_suppress_tokens"), c->begin_suppress_tokens,
                                        KN_WHISPER_MAX_SUPPRESS);
    json_t *task = json_object_get(j, "task_to_id");
    c->transcribe_token_id = jint(task, "transcribe", -1);
    c->translate_token_id = jint(task, "translate", -1);
    json_t *langs = json_object_get(j, "lang_to_id");
    const char *key;
    json_t *val;
    json_object_foreach(langs, key, val) {
        size_t kl = strlen(key);
        if (!json_is_integer(val) || c->n_langs >= KN_WHISPER_MAX_LANGS || kl < 5 || kl - 4 >= sizeof c->lang_code[0] ||
            strncmp(key, "<|", 2) || strcmp(key + kl - 2, "|>"))
            continue;
        memcpy(c->lang_code[c->n_langs], key + 2, kl - 4);
        c->lang_code[c->n_langs][kl - 4] = 0;
        c->lang_token_id[c->n_langs++] = (int)json_integer_value(val);
    }
    json_t *heads = json_object_get(j, "alignment_heads");
    for (size_t i = 0; json_is_array(heads) && i < json_array_size(heads); i++) {
        json_t *p = json_array_get(heads, i);
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 0)) ||
            !json_is_integer(json_array_get(p, 1)))
            continue;
        json_int_t l = json_integer_value(json_array_get(p, 0)), h = json_integer_value(json_array_get(p, 1));
        if (l < 0 || l >= c->dec_layers || h < 0 || h >= c->dec_heads || c->n_align >= KN_WHISPER_MAX_ALIGN_HEADS)
            continue;
        c->align_layer[c->n_align] = (int)l, c->align_head[c->n_align++] = (int)h;
    }
    json_decref(j);
    /* every id used for decoding must be a valid vocabulary index */
    int *ids[] = {&c->decoder_start_token_id, &c->eos_token_id, &c->no_timestamps_token_id, &c->prev_sot_token_id,
                  &c->transcribe_token_id, &c->translate_token_id};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        if (*ids[i] >= c->vocab_size) *ids[i] = -1;
    int n = 0;
    for (int i = 0; i < c->n_suppress; i++)
        if (c->suppress_tokens[i] >= 0 && c->suppress_tokens[i] < c->vocab_size) c->suppress_tokens[n++] = c->suppress_tokens[i];
    c->n_suppress = n;
    n = 0;
    for (int i = 0; i < c->n_begin_suppress; i++)
        if (c->begin_suppress_tokens[i] >= 0 && c->begin_suppress_tokens[i] < c->vocab_size)
            c->begin_suppress_tokens[n++] = c->begin_suppress_tokens[i];
    c->n_begin_suppress = n;
    n = 0;
    for (int i = 0; i < c->n_langs; i++)
        if (c->lang_token_id[i] >= 0 && c->lang_token_id[i] < c->vocab_size) {
            memmove(c->lang_code[n], c->lang_code[i], sizeof c->lang_code[0]);
            c->lang_token_id[n++] = c->lang_token_id[i];
        }
    c->n_langs = n;
    return default_alignment_heads(c);
}

/* ---- weights -------------------------------------------------------------- */

static const kn_st_tensor *tensor(kn_whisper *w, const char *name, int ndim, const int64_t *shape, int required,
                                  kn_error *err, kn_code *rc) {
    const kn_st_tensor *t = kn_st_find(w->st, name);
    if (!t) {
        if (required) *rc = kn_fail(err, KN_ERR_FORMAT, "checkpoint is missing tensor %s", name);
        return NULL;
    }
    if (t->dtype != KN_DT_F32 && t->dtype != KN_DT_BF16 && t->dtype != KN_DT_F16) {
        *rc = kn_fail(err, KN_ERR_UNSUPPORTED, "tensor %s has dtype %s (supported: F32, BF16, F16)", name,
                      kn_dtype_name(t->dtype));
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[96] = "", want[96] = "";
        size_t g = 0, w_ = 0;
        for (int i = 0; i < t->ndim && i < 4; i++)
            g += (size_t)snprintf(got + g, sizeof got - g, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++)
            w_ += (size_t)snprintf(want + w_, sizeof want - w_, "%s%lld", i ? ", " : "", (long long)shape[i]);
        *rc = kn_fail(err, KN_ERR_FORMAT, "tensor %s has shape [%s], expected [%s] from config.json", name, got, want);
        return NULL;
    }
    return t;
}

/* Vector(s) concatenated into new backend memory; absent optional parts are
 * zeros. names[i] may be NULL (zeros). */
static kn_code load_vecs(kn_whisper *w, const char *const *names, const int64_t *lens, int n_parts, int required,
                         float **out, kn_error *err) {
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) total += lens[i];
    float *host = calloc((size_t)total, sizeof(float));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    kn_code rc = KN_OK;
    int64_t off = 0;
    for (int i = 0; i < n_parts && !rc; i++) {
        if (names[i]) {
            const kn_st_tensor *t = tensor(w, names[i], 1, &lens[i], required, err, &rc);
            if (t)
                for (int64_t k = 0; k < lens[i]; k++) host[off + k] = kn_load_f32(t->data, t->dtype, k);
        }
        off += lens[i];
    }
    if (!rc) {
        *out = kn_be_alloc(w->be, (size_t)total * sizeof(float));
        if (!*out) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for weights");
        else kn_be_upload(w->be, *out, host, (size_t)total * sizeof(float));
    }
    free(host);
    return rc;
}

static kn_code load_vec(kn_whisper *w, const char *name, int64_t n, float **out, kn_error *err) {
    return load_vecs(w, &name, &n, 1, 1, out, err);
}

/* Matrices [rows_i, cols] of the same dtype stacked along rows as one weight;
 * a single part is borrowed from the mapping. ndim 3 for conv weights
 * [out, in, k] (cols = in * k). */
static kn_code load_mat(kn_whisper *w, const char *const *names, int n_parts, int64_t rows_each, int64_t cols, int ndim,
                        int64_t k, kn_weight *out, kn_error *err) {
    const kn_st_tensor *ts[3];
    kn_code rc = KN_OK;
    int64_t shape[3] = {rows_each, ndim == 3 ? cols / k : cols, k};
    for (int i = 0; i < n_parts; i++) {
        ts[i] = tensor(w, names[i], ndim, shape, 1, err, &rc);
        if (rc) return rc;
        if (ts[i]->dtype != ts[0]->dtype)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "tensors %s and %s have different dtypes", names[0], names[i]);
    }
    if (n_parts == 1) return kn_be_weight_load(w->be, ts[0]->dtype, rows_each, cols, ts[0]->data, KN_BORROW_MAPPED, out, err);
    size_t bytes = ts[0]->nbytes;
    uint8_t *host = malloc(bytes * (size_t)n_parts);
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory fusing %s", names[0]);
    for (int i = 0; i < n_parts; i++) memcpy(host + bytes * (size_t)i, ts[i]->data, bytes);
    rc = kn_be_weight_load(w->be, ts[0]->dtype, rows_each * n_parts, cols, host, 0, out, err);
    free(host);
    return rc;
}

/* A [rows, cols] table (positions) as f32 backend memory. */
static kn_code load_table(kn_whisper *w, const char *name, int64_t rows, int64_t cols, float **out, kn_error *err) {
    int64_t shape[2] = {rows, cols};
    kn_code rc = KN_OK;
    const kn_st_tensor *t = tensor(w, name, 2, shape, 1, err, &rc);
    if (!t) return rc;
    float *host = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!host) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < rows * cols; i++) host[i] = kn_load_f32(t->data, t->dtype, i);
    *out = kn_be_alloc(w->be, sizeof(float) * (size_t)(rows * cols));
    if (*out) kn_be_upload(w->be, *out, host, sizeof(float) * (size_t)(rows * cols));
    free(host);
    return *out ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory for %s", name);
}

static kn_code load_layer(kn_whisper *w, int dec, int l, wlayer *L, kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    const int64_t d = c->d_model, ffn = dec ? c->dec_ffn : c->enc_ffn;
    char p[96], n[8][160];
    snprintf(p, sizeof p, "model.%s.layers.%d", dec ? "decoder" : "encoder", l);
#define NM(i, suffix) (snprintf(n[i], sizeof n[i], "%s.%s", p, suffix), n[i])
    kn_code rc;
    if (!dec) {
        const char *qkv[3] = {NM(0, "self_attn.q_proj.weight"), NM(1, "self_attn.k_proj.weight"), NM(2, "self_attn.v_proj.weight")};
        if ((rc = load_mat(w, qkv, 3, d, d, 2, 1, &L->qkv, err))) return rc;
        const char *b[3] = {NM(3, "self_attn.q_proj.bias"), NULL, NM(4, "self_attn.v_proj.bias")};
        const int64_t lens[3] = {d, d, d};
        if ((rc = load_vecs(w, b, lens, 3, 1, &L->qkv_b, err))) return rc;
    } else {
        const char *q[1] = {NM(0, "self_attn.q_proj.weight")};
        if ((rc = load_mat(w, q, 1, d, d, 2, 1, &L->qkv, err))) return rc;
        if ((rc = load_vec(w, NM(1, "self_attn.q_proj.bias"), d, &L->qkv_b, err))) return rc;
        const char *kv[2] = {NM(2, "self_attn.k_proj.weight"), NM(3, "self_attn.v_proj.weight")};
        if ((rc = load_mat(w, kv, 2, d, d, 2, 1, &L->kv, err))) return rc;
        const char *b[2] = {NULL, NM(4, "self_attn.v_proj.bias")};
        const int64_t lens[2] = {d, d};
        if ((rc = load_vecs(w, b, lens, 2, 1, &L->kv_b, err))) return rc;
    }
    {
        const char *o[1] = {NM(5, "self_attn.out_proj.weight")};
        if ((rc = load_mat(w, o, 1, d, d, 2, 1, &L->o, err))) return rc;
        if ((rc = load_vec(w, NM(6, "self_attn.out_proj.bias"), d, &L->o_b, err))) return rc;
    }
    if ((rc = load_vec(w, NM(0, "self_attn_layer_norm.weight"), d, &L->ln1_w, err))) return rc;
    if ((rc = load_vec(w, NM(0, "self_attn_layer_norm.bias"), d, &L->ln1_b, err))) return rc;
    if (dec) {
        const char *q[1] = {NM(0, "encoder_attn.q_proj.weight")};
        if ((rc = load_mat(w, q, 1, d, d, 2, 1, &L->cq, err))) return rc;
        if ((rc = load_vec(w, NM(1, "encoder_attn.q_proj.bias"), d, &L->cq_b, err))) return rc;
        const char *kv[2] = {NM(2, "encoder_attn.k_proj.weight"), NM(3, "encoder_attn.v_proj.weight")};
        if ((rc = load_mat(w, kv, 2, d, d, 2, 1, &L->ckv, err))) return rc;
        const char *b[2] = {NULL, NM(4, "encoder_attn.v_proj.bias")};
        const int64_t lens[2] = {d, d};
        if ((rc = load_vecs(w, b, lens, 2, 1, &L->ckv_b, err))) return rc;
        const char *o[1] = {NM(5, "encoder_attn.out_proj.weight")};
        if ((rc = load_mat(w, o, 1, d, d, 2, 1, &L->co, err))) return rc;
        if ((rc = load_vec(w, NM(6, "encoder_attn.out_proj.bias"), d, &L->co_b, err))) return rc;
        if ((rc = load_vec(w, NM(0, "encoder_attn_layer_norm.weight"), d, &L->ln2_w, err))) return rc;
        if ((rc = load_vec(w, NM(0, "encoder_attn_layer_norm.bias"), d, &L->ln2_b, err))) return rc;
        if ((rc = load_vec(w, NM(0, "final_layer_norm.weight"), d, &L->ln3_w, err))) return rc;
        if ((rc = load_vec(w, NM(0, "final_layer_norm.bias"), d, &L->ln3_b, err))) return rc;
    } else {
        if ((rc = load_vec(w, NM(0, "final_layer_norm.weight"), d, &L->ln2_w, err))) return rc;
        if ((rc = load_vec(w, NM(0, "final_layer_norm.bias"), d, &L->ln2_b, err))) return rc;
    }
    const char *f1[1] = {NM(0, "fc1.weight")}, *f2[1] = {NM(1, "fc2.weight")};
    if ((rc = load_mat(w, f1, 1, ffn, d, 2, 1, &L->fc1, err))) return rc;
    if ((rc = load_vec(w, NM(2, "fc1.bias"), ffn, &L->fc1_b, err))) return rc;
    if ((rc = load_mat(w, f2, 1, d, ffn, 2, 1, &L->fc2, err))) return rc;
    if ((rc = load_vec(w, NM(3, "fc2.bias"), d, &L->fc2_b, err))) return rc;
#undef NM
    return KN_OK;
}

static kn_code load_weights(kn_whisper *w, kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    const int64_t d = c->d_model;
    kn_code rc;
    const char *c1[1] = {"model.encoder.conv1.weight"}, *c2[1] = {"model.encoder.conv2.weight"};
    if ((rc = load_mat(w, c1, 1, d, (int64_t)c->n_mels * 3, 3, 3, &w->conv1, err))) return rc;
    if ((rc = load_vec(w, "model.encoder.conv1.bias", d, &w->conv1_b, err))) return rc;
    if ((rc = load_mat(w, c2, 1, d, d * 3, 3, 3, &w->conv2, err))) return rc;
    if ((rc = load_vec(w, "model.encoder.conv2.bias", d, &w->conv2_b, err))) return rc;
    if ((rc = load_table(w, "model.encoder.embed_positions.weight", c->max_source_positions, d, &w->enc_pos, err)))
        return rc;
    if ((rc = load_table(w, "model.decoder.embed_positions.weight", c->max_target_positions, d, &w->dec_pos, err)))
        return rc;
    const char *emb[1] = {"model.decoder.embed_tokens.weight"};
    if ((rc = load_mat(w, emb, 1, c->vocab_size, d, 2, 1, &w->embed, err))) return rc;
    /* proj_out is tied to embed_tokens; an untied checkpoint must say so */
    const kn_st_tensor *po = kn_st_find(w->st, "proj_out.weight");
    if (po && (po->nbytes != ((const kn_st_tensor *)kn_st_find(w->st, emb[0]))->nbytes ||
               memcmp(po->data, kn_st_find(w->st, emb[0])->data, po->nbytes)))
        return kn_fail(err, KN_ERR_UNSUPPORTED, "proj_out.weight differs from embed_tokens (untied output projection)");
    if ((rc = load_vec(w, "model.encoder.layer_norm.weight", d, &w->enc_ln_w, err))) return rc;
    if ((rc = load_vec(w, "model.encoder.layer_norm.bias", d, &w->enc_ln_b, err))) return rc;
    if ((rc = load_vec(w, "model.decoder.layer_norm.weight", d, &w->dec_ln_w, err))) return rc;
    if ((rc = load_vec(w, "model.decoder.layer_norm.bias", d, &w->dec_ln_b, err))) return rc;
    w->enc = calloc((size_t)c->enc_layers, sizeof *w->enc);
    w->dec = calloc((size_t)c->dec_layers, sizeof *w->dec);
    if (!w->enc || !w->dec) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->enc_layers; l++)
        if ((rc = load_layer(w, 0, l, &w->enc[l], err))) return rc;
    for (int l = 0; l < c->dec_layers; l++)
        if ((rc = load_layer(w, 1, l, &w->dec[l], err))) return rc;
    return KN_OK;
}

/* ---- buffers ---------------------------------------------------------------- */

static kn_code alloc_f(kn_whisper *w, float **p, int64_t n, kn_error *err) {
    *p = kn_be_alloc(w->be, sizeof(float) * (size_t)(n > 0 ? n : 1));
    return *p ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory for whisper buffers (%lld floats)", (long long)n);
}

static kn_code alloc_buffers(kn_whisper *w, kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    const int64_t d = c->d_model, frames = 2 * (int64_t)c->max_source_positions, T = c->max_target_positions;
    const int64_t rows_enc = c->max_source_positions;
    const int64_t ffn = c->enc_ffn > c->dec_ffn ? c->enc_ffn : c->dec_ffn;
    w->max_rows = w->max_slots * c->max_target_positions;
    int64_t rows = w->max_rows > rows_enc ? w->max_rows : rows_enc;
    w->max_logit_rows = c->max_target_positions > w->max_slots ? c->max_target_positions : w->max_slots;
    int64_t cin = c->n_mels > d ? c->n_mels : d;
    kn_code rc;
    if ((rc = alloc_f(w, &w->mel, c->n_mels * frames, err)) || (rc = alloc_f(w, &w->cols, frames * cin * 3, err)) ||
        (rc = alloc_f(w, &w->conv_out, frames * d, err)) || (rc = alloc_f(w, &w->x, rows * d, err)) ||
        (rc = alloc_f(w, &w->xn, rows * d, err)) || (rc = alloc_f(w, &w->qkv, rows * 3 * d, err)) ||
        (rc = alloc_f(w, &w->attn, rows * d, err)) || (rc = alloc_f(w, &w->ffn, rows * ffn, err)) ||
        (rc = alloc_f(w, &w->kvtmp, rows * 2 * d, err)) || (rc = alloc_f(w, &w->last, rows * d, err)) ||
        (rc = alloc_f(w, &w->logits, (int64_t)w->max_logit_rows * c->vocab_size, err)))
        return rc;
    for (int l = 0; l < c->dec_layers; l++) {
        wlayer *L = &w->dec[l];
        if ((rc = alloc_f(w, &L->kv_cache, w->max_slots * T * 2 * d, err)) ||
            (rc = alloc_f(w, &L->kv_spare, w->max_slots * T * 2 * d, err)) ||
            (rc = alloc_f(w, &L->cross_kv, rows_enc * 2 * d, err)))
            return rc;
    }
    w->d_tokens = kn_be_alloc(w->be, sizeof(int32_t) * (size_t)w->max_rows);
    w->d_iota = kn_be_alloc(w->be, sizeof(int32_t) * (size_t)rows);
    w->d_idx = kn_be_alloc(w->be, sizeof(int32_t) * (size_t)(w->max_slots * T));
    w->h_idx = malloc(sizeof(int32_t) * (size_t)(rows > w->max_slots * T ? rows : w->max_slots * T));
    if (!w->d_tokens || !w->d_iota || !w->d_idx || !w->h_idx) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++) w->h_idx[i] = (int32_t)i;
    kn_be_upload(w->be, w->d_iota, w->h_idx, sizeof(int32_t) * (size_t)rows);
    return KN_OK;
}

/* ---- open / close ------------------------------------------------------------ */

static void free_layer(kn_backend *be, wlayer *L) {
    kn_weight *ws[] = {&L->qkv, &L->kv, &L->o, &L->fc1, &L->fc2, &L->cq, &L->ckv, &L->co};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) kn_be_weight_free(be, ws[i]);
    float *fs[] = {L->qkv_b, L->kv_b, L->o_b, L->fc1_b, L->fc2_b, L->cq_b, L->ckv_b, L->co_b, L->ln1_w, L->ln1_b, L->ln2_w,
                   L->ln2_b, L->ln3_w, L->ln3_b, L->kv_cache, L->kv_spare, L->cross_kv};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) kn_be_free(be, fs[i]);
}

void kn_whisper_close(kn_whisper *w) {
    if (!w) return;
    kn_backend *be = w->be;
    if (be) {
        if (w->enc)
            for (int l = 0; l < w->cfg.enc_layers; l++) free_layer(be, &w->enc[l]);
        if (w->dec)
            for (int l = 0; l < w->cfg.dec_layers; l++) free_layer(be, &w->dec[l]);
        kn_weight *ws[] = {&w->conv1, &w->conv2, &w->embed};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) kn_be_weight_free(be, ws[i]);
        float *fs[] = {w->conv1_b, w->conv2_b, w->enc_pos, w->dec_pos, w->enc_ln_w, w->enc_ln_b, w->dec_ln_w,
                       w->dec_ln_b, w->mel, w->cols, w->conv_out, w->x, w->xn, w->qkv, w->attn, w->ffn, w->kvtmp,
                       w->last, w->logits};
        for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) kn_be_free(be, fs[i]);
        kn_be_free(be, w->d_tokens);
        kn_be_free(be, w->d_iota);
        kn_be_free(be, w->d_idx);
        kn_backend_destroy(be);
    }
    free(w->enc);
    free(w->dec);
    free(w->h_idx);
    kn_st_close(w->st);
    free(w);
}

kn_code kn_whisper_open(const char *dir, const kn_whisper_options *o, kn_whisper **out, kn_error *err) {
    *out = NULL;
    kn_whisper_options opt = {0};
    if (o) opt = *o;
    kn_whisper *w = calloc(1, sizeof *w);
    if (!w) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    w->max_slots = opt.max_slots > 0 ? opt.max_slots : 5;
    kn_code rc = parse_config(dir, &w->cfg, err);
    if (!rc) rc = kn_st_open(dir, &w->st, err);
    if (!rc) rc = kn_backend_create(opt.backend, opt.n_threads, &w->be, err);
    if (!rc) {
        w->d = w->cfg.d_model;
        w->n_ctx = w->cfg.max_source_positions;
        rc = load_weights(w, err);
        if (rc) kn_fail_wrap(err, "%s", dir);
        else kn_st_release_pages(w->st); /* the copies are what is read from now on (as kn_model_open) */
    }
    if (!rc) rc = alloc_buffers(w, err);
    if (rc) {
        kn_whisper_close(w);
        return rc;
    }
    const kn_whisper_config *c = &w->cfg;
    snprintf(w->desc, sizeof w->desc, "whisper d_model %d, %d+%d layers, %d mels, vocab %d, %s, %s backend", c->d_model,
             c->enc_layers, c->dec_layers, c->n_mels, c->vocab_size, kn_dtype_name(w->embed.dtype), w->be->vt->name);
    *out = w;
    return KN_OK;
}

const kn_whisper_config *kn_whisper_cfg(const kn_whisper *w) { return &w->cfg; }
const char *kn_whisper_describe(const kn_whisper *w) { return w->desc; }
kn_backend *kn_whisper_backend(kn_whisper *w) { return w->be; }

/* ---- forward ------------------------------------------------------------------ */

/* x += in . W^T + b (the residual add fused where the backend has it) */
static void matmul_residual(kn_whisper *w, const float *in, int rows, const kn_weight *W, const float *b) {
    kn_backend *be = w->be;
    if (!(be->vt->matmul_add && be->vt->matmul_add(be, in, rows, W, b, w->x))) {
        be->vt->matmul(be, in, rows, W, b, w->xn);
        be->vt->add(be, w->x, w->xn, (int64_t)rows * w->d);
    }
}

/* x += out_proj(attn) ; the attention output is in w->attn */
static void residual_out(kn_whisper *w, const kn_weight *o, const float *ob, int rows) {
    matmul_residual(w, w->attn, rows, o, ob);
}

/* x += fc2(gelu(fc1(norm(x)))) */
static void mlp(kn_whisper *w, const wlayer *L, const float *ln_w, const float *ln_b, int rows, int ffn) {
    kn_backend *be = w->be;
    be->vt->layer_norm(be, w->x, w->d, w->xn, w->d, rows, w->d, ln_w, ln_b, 1e-5f);
    be->vt->matmul(be, w->xn, rows, &L->fc1, L->fc1_b, w->ffn);
    be->vt->gelu(be, w->ffn, (int64_t)rows * ffn, w->ffn, w->cfg.gelu_approx);
    matmul_residual(w, w->ffn, rows, &L->fc2, L->fc2_b);
}

kn_code kn_whisper_encode(kn_whisper *w, const float *mel, kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    kn_backend *be = w->be;
    const int d = w->d, frames = 2 * w->n_ctx, T = w->n_ctx, hd = d / c->enc_heads;
    if (!mel) return kn_fail(err, KN_ERR_INVALID_ARG, "whisper encode: no mel");
    kn_be_upload(be, w->mel, mel, sizeof(float) * (size_t)c->n_mels * (size_t)frames);
    /* conv1 over the [n_mels, frames] mel (channel-major), conv2 with stride 2 */
    be->vt->im2col_1d(be, w->mel, 1, frames, frames, c->n_mels, 3, 1, 1, w->cols);
    be->vt->matmul(be, w->cols, frames, &w->conv1, w->conv1_b, w->conv_out);
    be->vt->gelu(be, w->conv_out, (int64_t)frames * d, w->conv_out, c->gelu_approx);
    be->vt->im2col_1d(be, w->conv_out, d, 1, frames, d, 3, 2, 1, w->cols);
    be->vt->matmul(be, w->cols, T, &w->conv2, w->conv2_b, w->x);
    be->vt->gelu(be, w->x, (int64_t)T * d, w->x, c->gelu_approx);
    be->vt->add(be, w->x, w->enc_pos, (int64_t)T * d);
    for (int l = 0; l < c->enc_layers; l++) {
        const wlayer *L = &w->enc[l];
        be->vt->layer_norm(be, w->x, d, w->xn, d, T, d, L->ln1_w, L->ln1_b, 1e-5f);
        be->vt->matmul(be, w->xn, T, &L->qkv, L->qkv_b, w->qkv);
        kn_dense_attention_args a = {.q = w->qkv, .k = w->qkv + d, .v = w->qkv + 2 * d, .q_stride = 3 * d,
                                     .k_stride = 3 * d, .v_stride = 3 * d, .out = w->attn, .out_stride = d, .n_q = T,
                                     .n_kv = T, .n_heads = c->enc_heads, .head_dim = hd,
                                     .scale = 1.0f / sqrtf((float)hd)};
        be->vt->attention_dense(be, &a);
        residual_out(w, &L->o, L->o_b, T);
        mlp(w, L, L->ln2_w, L->ln2_b, T, c->enc_ffn);
    }
    /* encoder output (post-LN) into xn, then every decoder layer's cross K/V */
    be->vt->layer_norm(be, w->x, d, w->conv_out, d, T, d, w->enc_ln_w, w->enc_ln_b, 1e-5f);
    for (int l = 0; l < c->dec_layers; l++)
        be->vt->matmul(be, w->conv_out, T, &w->dec[l].ckv, w->dec[l].ckv_b, w->dec[l].cross_kv);
    kn_be_sync(be);
    return kn_be_take_error(be, err);
}

void kn_whisper_encoder_output(kn_whisper *w, float *out) {
    kn_be_sync(w->be);
    kn_be_download(w->be, out, w->conv_out, sizeof(float) * (size_t)w->n_ctx * (size_t)w->d);
}

/* Scaled q.k of layer l's alignment heads for rows 0..rows-1 (the q of the
 * cross-attention is in w->qkv) over the first qk_frames encoder positions. */
static void capture_qk(kn_whisper *w, int l, int rows) {
    const kn_whisper_config *c = &w->cfg;
    const int d = w->d, hd = d / c->dec_heads, nf = w->qk_frames;
    int any = 0;
    for (int a = 0; a < c->n_align; a++) any |= c->align_layer[a] == l;
    if (!any) return;
    kn_be_sync(w->be);
    kn_be_download(w->be, w->qk_q, w->qkv, sizeof(float) * (size_t)rows * (size_t)d);
    kn_be_download(w->be, w->qk_k, w->dec[l].cross_kv, sizeof(float) * (size_t)nf * 2 * (size_t)d);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int a = 0; a < c->n_align; a++) {
        if (c->align_layer[a] != l) continue;
        const int h = c->align_head[a];
        for (int i = 0; i < rows; i++) {
            const float *q = w->qk_q + (size_t)i * d + (size_t)h * hd;
            float *o = w->qk_out + ((size_t)a * rows + i) * nf;
            for (int f = 0; f < nf; f++) {
                const float *k = w->qk_k + (size_t)f * 2 * d + (size_t)h * hd;
                float s = 0.0f;
                for (int e = 0; e < hd; e++) s += q[e] * k[e];
                o[f] = s * scale;
            }
        }
    }
}

kn_code kn_whisper_cross_qk(kn_whisper *w, const int32_t *tokens, int n, int n_frames, float *qk, float *logits,
                            kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    if (n < 1 || n > c->max_target_positions || n_frames < 1 || n_frames > w->n_ctx || c->n_align < 1)
        return kn_fail(err, KN_ERR_INVALID_ARG, "whisper alignment: %d tokens, %d frames (limits %d, %d; %d heads)",
                       n, n_frames, c->max_target_positions, w->n_ctx, c->n_align);
    float *lg = logits ? logits : malloc(sizeof(float) * (size_t)n * (size_t)c->vocab_size);
    w->qk_q = malloc(sizeof(float) * (size_t)n * (size_t)w->d);
    w->qk_k = malloc(sizeof(float) * (size_t)n_frames * 2 * (size_t)w->d);
    kn_code rc;
    if (!lg || !w->qk_q || !w->qk_k) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for alignment scores");
    else {
        w->qk_out = qk;
        w->qk_frames = n_frames;
        rc = kn_whisper_decode(w, 1, n, tokens, 0, 1, lg, err);
    }
    w->qk_out = NULL;
    free(w->qk_q);
    free(w->qk_k);
    w->qk_q = w->qk_k = NULL;
    if (lg != logits) free(lg);
    return rc;
}

kn_code kn_whisper_decode(kn_whisper *w, int n_slots, int n_new, const int32_t *tokens, int pos0, int all_logits,
                          float *logits, kn_error *err) {
    const kn_whisper_config *c = &w->cfg;
    kn_backend *be = w->be;
    const int d = w->d, hd = d / c->dec_heads, T = c->max_target_positions, rows = n_slots * n_new;
    if (n_slots < 1 || n_slots > w->max_slots || n_new < 1 || pos0 < 0 || pos0 + n_new > T)
        return kn_fail(err, KN_ERR_INVALID_ARG,
                       "whisper decode: %d slots x %d tokens at position %d (limits: %d slots, %d positions)", n_slots,
                       n_new, pos0, w->max_slots, T);
    if (all_logits && n_slots != 1) return kn_fail(err, KN_ERR_INVALID_ARG, "whisper decode: all_logits needs one slot");
    for (int i = 0; i < rows; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return kn_fail(err, KN_ERR_INVALID_ARG, "token id %d out of range (vocab %d)", tokens[i], c->vocab_size);
    kn_be_upload(be, w->d_tokens, tokens, sizeof(int32_t) * (size_t)rows);
    be->vt->embed(be, &w->embed, w->d_tokens, rows, w->x);
    for (int s = 0; s < n_slots; s++)
        be->vt->add(be, w->x + (int64_t)s * n_new * d, w->dec_pos + (int64_t)pos0 * d, (int64_t)n_new * d);
    for (int l = 0; l < c->dec_layers; l++) {
        const wlayer *L = &w->dec[l];
        /* causal self-attention: new k|v rows into each slot's cache */
        be->vt->layer_norm(be, w->x, d, w->xn, d, rows, d, L->ln1_w, L->ln1_b, 1e-5f);
        be->vt->matmul(be, w->xn, rows, &L->qkv, L->qkv_b, w->qkv);
        be->vt->matmul(be, w->xn, rows, &L->kv, L->kv_b, w->kvtmp);
        for (int s = 0; s < n_slots; s++) {
            float *cache = L->kv_cache + (int64_t)s * T * 2 * d;
            be->vt->gather_rows(be, w->kvtmp, 2 * d, w->d_iota + s * n_new, n_new, cache + (int64_t)pos0 * 2 * d);
            kn_dense_attention_args a = {.q = w->qkv + (int64_t)s * n_new * d, .q_stride = d, .k = cache,
                                         .k_stride = 2 * d, .v = cache + d, .v_stride = 2 * d,
                                         .out = w->attn + (int64_t)s * n_new * d, .out_stride = d, .n_q = n_new,
                                         .n_kv = pos0 + n_new, .n_heads = c->dec_heads, .head_dim = hd,
                                         .scale = 1.0f / sqrtf((float)hd), .causal = 1, .q_pos0 = pos0};
            be->vt->attention_dense(be, &a);
        }
        residual_out(w, &L->o, L->o_b, rows);
        /* cross-attention over the window's encoder output */
        be->vt->layer_norm(be, w->x, d, w->xn, d, rows, d, L->ln2_w, L->ln2_b, 1e-5f);
        be->vt->matmul(be, w->xn, rows, &L->cq, L->cq_b, w->qkv);
        if (w->qk_out) capture_qk(w, l, rows);
        kn_dense_attention_args ca = {.q = w->qkv, .q_stride = d, .k = L->cross_kv, .k_stride = 2 * d,
                                      .v = L->cross_kv + d, .v_stride = 2 * d, .out = w->attn, .out_stride = d,
                                      .n_q = rows, .n_kv = w->n_ctx, .n_heads = c->dec_heads, .head_dim = hd,
                                      .scale = 1.0f / sqrtf((float)hd)};
        be->vt->attention_dense(be, &ca);
        residual_out(w, &L->co, L->co_b, rows);
        mlp(w, L, L->ln3_w, L->ln3_b, rows, c->dec_ffn);
    }
    /* logits of every row, or of each slot's last row */
    int n_out = all_logits ? rows : n_slots;
    const float *src = w->x;
    if (!all_logits) {
        for (int s = 0; s < n_slots; s++) w->h_idx[s] = s * n_new + n_new - 1;
        kn_be_upload(be, w->d_idx, w->h_idx, sizeof(int32_t) * (size_t)n_slots);
        be->vt->gather_rows(be, w->x, d, w->d_idx, n_slots, w->last);
        src = w->last;
    }
    be->vt->layer_norm(be, src, d, w->xn, d, n_out, d, w->dec_ln_w, w->dec_ln_b, 1e-5f);
    be->vt->matmul(be, w->xn, n_out, &w->embed, NULL, w->logits);
    kn_be_sync(be);
    kn_be_download(be, logits, w->logits, sizeof(float) * (size_t)n_out * (size_t)c->vocab_size);
    return kn_be_take_error(be, err);
}

kn_code kn_whisper_reorder(kn_whisper *w, int n_slots, const int *src, int len, kn_error *err) {
    const int T = w->cfg.max_target_positions, d = w->d;
    if (n_slots < 1 || n_slots > w->max_slots || len < 0 || len > T)
        return kn_fail(err, KN_ERR_INVALID_ARG, "whisper reorder: %d slots, length %d", n_slots, len);
    for (int s = 0; s < n_slots; s++)
        if (src[s] < 0 || src[s] >= w->max_slots)
            return kn_fail(err, KN_ERR_INVALID_ARG, "whisper reorder: source slot %d", src[s]);
    if (len == 0) return KN_OK;
    for (int s = 0; s < n_slots; s++)
        for (int j = 0; j < len; j++) w->h_idx[s * len + j] = src[s] * T + j;
    kn_be_upload(w->be, w->d_idx, w->h_idx, sizeof(int32_t) * (size_t)n_slots * (size_t)len);
    for (int l = 0; l < w->cfg.dec_layers; l++) {
        wlayer *L = &w->dec[l];
        for (int s = 0; s < n_slots; s++)
            w->be->vt->gather_rows(w->be, L->kv_cache, 2 * d, w->d_idx + s * len, len,
                                   L->kv_spare + (int64_t)s * T * 2 * d);
        float *t = L->kv_cache;
        L->kv_cache = L->kv_spare;
        L->kv_spare = t;
    }
    return KN_OK;
}

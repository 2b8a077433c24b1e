/* whisper_synth.h — write a random-weight Whisper checkpoint in HF layout
 * (config.json, generation_config.json, model.safetensors, f32) for tests
 * that need a model but no oracle: cache consistency, beam reordering, CLI
 * error paths. Token layout as Whisper's: n_text text tokens, then
 * <|endoftext|>, <|startoftranscript|>, 2 languages (en, de), translate,
 * transcribe, startoflm, startofprev, nospeech, notimestamps, 1501
 * timestamps. */
#ifndef KN_TEST_WHISPER_SYNTH_H
#define KN_TEST_WHISPER_SYNTH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct {
    int d, heads, ffn, enc_layers, dec_layers, n_mels, n_text, n_ctx, max_target;
} synth_whisper_shape;

static int synth_vocab(const synth_whisper_shape *s) { return s->n_text + 2 + 2 + 6 + 1501; }

typedef struct {
    char name[128];
    int64_t shape[3];
    int ndim;
    float *data;
    int64_t n;
} synth_tensor;

static int synth_add(synth_tensor *t, int *n, const char *name, int ndim, int64_t a, int64_t b, int64_t c, float scale,
                     float base, uint64_t *seed) {
    synth_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = ndim;
    x->shape[0] = a, x->shape[1] = b, x->shape[2] = c;
    x->n = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);
    x->data = malloc(sizeof(float) * (size_t)x->n);
    for (int64_t i = 0; i < x->n; i++) x->data[i] = base + scale * kn_test_rand(seed);
    return 0;
}

/* Writes dir/{config.json, generation_config.json, model.safetensors}. */
static int synth_whisper_write(const char *dir, const synth_whisper_shape *s, uint64_t seed) {
    const int V = synth_vocab(s), d = s->d;
    const int eot = s->n_text, sot = eot + 1, en = eot + 2, de = eot + 3, translate = eot + 4, transcribe = eot + 5;
    const int sotprev = eot + 7, nots = eot + 9;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"model_type\": \"whisper\", \"vocab_size\": %d, \"num_mel_bins\": %d, \"d_model\": %d,"
            " \"encoder_layers\": %d, \"encoder_attention_heads\": %d, \"encoder_ffn_dim\": %d,"
            " \"decoder_layers\": %d, \"decoder_attention_heads\": %d, \"decoder_ffn_dim\": %d,"
            " \"max_source_positions\": %d, \"max_target_positions\": %d, \"activation_function\": \"gelu\","
            " \"scale_embedding\": false, \"decoder_start_token_id\": %d, \"eos_token_id\": %d}\n",
            V, s->n_mels, d, s->enc_layers, s->heads, s->ffn, s->dec_layers, s->heads, s->ffn, s->n_ctx, s->max_target,
            sot, eot);
    fclose(f);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"decoder_start_token_id\": %d, \"eos_token_id\": %d, \"no_timestamps_token_id\": %d,"
            " \"prev_sot_token_id\": %d, \"max_initial_timestamp_index\": 50, \"is_multilingual\": true,"
            " \"lang_to_id\": {\"<|en|>\": %d, \"<|de|>\": %d}, \"task_to_id\": {\"transcribe\": %d, \"translate\": %d},"
            " \"suppress_tokens\": [1, 2, %d, %d], \"begin_suppress_tokens\": [220, %d]}\n",
            sot, eot, nots, sotprev, en, de, transcribe, translate, translate, transcribe, eot);
    fclose(f);

    synth_tensor *t = calloc(64 + 40 * (size_t)(s->enc_layers + s->dec_layers), sizeof *t);
    int n = 0;
    char nm[128];
    synth_add(t, &n, "model.encoder.conv1.weight", 3, d, s->n_mels, 3, 0.1f, 0, &seed);
    synth_add(t, &n, "model.encoder.conv1.bias", 1, d, 0, 0, 0.02f, 0, &seed);
    synth_add(t, &n, "model.encoder.conv2.weight", 3, d, d, 3, 0.1f, 0, &seed);
    synth_add(t, &n, "model.encoder.conv2.bias", 1, d, 0, 0, 0.02f, 0, &seed);
    synth_add(t, &n, "model.encoder.embed_positions.weight", 2, s->n_ctx, d, 0, 0.5f, 0, &seed);
    synth_add(t, &n, "model.encoder.layer_norm.weight", 1, d, 0, 0, 0.1f, 1, &seed);
    synth_add(t, &n, "model.encoder.layer_norm.bias", 1, d, 0, 0, 0.02f, 0, &seed);
    synth_add(t, &n, "model.decoder.embed_tokens.weight", 2, V, d, 0, 0.1f, 0, &seed);
    synth_add(t, &n, "model.decoder.embed_positions.weight", 2, s->max_target, d, 0, 0.1f, 0, &seed);
    synth_add(t, &n, "model.decoder.layer_norm.weight", 1, d, 0, 0, 0.1f, 1, &seed);
    synth_add(t, &n, "model.decoder.layer_norm.bias", 1, d, 0, 0, 0.02f, 0, &seed);
    for (int dec = 0; dec < 2; dec++)
        for (int l = 0; l < (dec ? s->dec_layers : s->enc_layers); l++) {
            const char *side = dec ? "decoder" : "encoder";
            const char *att[2] = {"self_attn", "encoder_attn"};
            for (int a = 0; a < (dec ? 2 : 1); a++) {
                const char *pr[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
                for (int p = 0; p < 4; p++) {
                    snprintf(nm, sizeof nm, "model.%s.layers.%d.%s.%s.weight", side, l, att[a], pr[p]);
                    synth_add(t, &n, nm, 2, d, d, 0, 0.15f, 0, &seed);
                    if (p != 1) {
                        snprintf(nm, sizeof nm, "model.%s.layers.%d.%s.%s.bias", side, l, att[a], pr[p]);
                        synth_add(t, &n, nm, 1, d, 0, 0, 0.02f, 0, &seed);
                    }
                }
                snprintf(nm, sizeof nm, "model.%s.layers.%d.%s_layer_norm.weight", side, l, att[a]);
                synth_add(t, &n, nm, 1, d, 0, 0, 0.1f, 1, &seed);
                snprintf(nm, sizeof nm, "model.%s.layers.%d.%s_layer_norm.bias", side, l, att[a]);
                synth_add(t, &n, nm, 1, d, 0, 0, 0.02f, 0, &seed);
            }
            snprintf(nm, sizeof nm, "model.%s.layers.%d.fc1.weight", side, l);
            synth_add(t, &n, nm, 2, s->ffn, d, 0, 0.1f, 0, &seed);
            snprintf(nm, sizeof nm, "model.%s.layers.%d.fc1.bias", side, l);
            synth_add(t, &n, nm, 1, s->ffn, 0, 0, 0.02f, 0, &seed);
            snprintf(nm, sizeof nm, "model.%s.layers.%d.fc2.weight", side, l);
            synth_add(t, &n, nm, 2, d, s->ffn, 0, 0.1f, 0, &seed);
            snprintf(nm, sizeof nm, "model.%s.layers.%d.fc2.bias", side, l);
            synth_add(t, &n, nm, 1, d, 0, 0, 0.02f, 0, &seed);
            snprintf(nm, sizeof nm, "model.%s.layers.%d.final_layer_norm.weight", side, l);
            synth_add(t, &n, nm, 1, d, 0, 0, 0.1f, 1, &seed);
            snprintf(nm, sizeof nm, "model.%s.layers.%d.final_layer_norm.bias", side, l);
            synth_add(t, &n, nm, 1, d, 0, 0, 0.02f, 0, &seed);
        }
    /* header JSON, padded to a multiple of 8 */
    size_t cap = 256 * (size_t)n + 64, hl = 0;
    char *h = malloc(cap);
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "", t[i].name);
        for (int k = 0; k < t[i].ndim; k++) hl += (size_t)snprintf(h + hl, cap - hl, "%s%lld", k ? "," : "", (long long)t[i].shape[k]);
        hl += (size_t)snprintf(h + hl, cap - hl, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                               (long long)(off + t[i].n * 4));
        off += t[i].n * 4;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) h[hl++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t hl64 = hl;
    fwrite(&hl64, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (int i = 0; i < n; i++) fwrite(t[i].data, 4, (size_t)t[i].n, f);
    fclose(f);
    for (int i = 0; i < n; i++) free(t[i].data);
    free(t);
    free(h);
    return 0;
}

#endif

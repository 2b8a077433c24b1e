/* transcribe.c — Whisper decoding of one window (this file) and the seek
 * loop over long audio (transcribe_loop.c). See transcribe.h.
 *
 * Logit rules, in transformers' order (WhisperGenerationMixin):
 *   1. begin suppression: at the first generated position, begin_suppress_tokens
 *      (blank " " and <|endoftext|>) are -inf;
 *   2. suppress_tokens are -inf everywhere;
 *   3. timestamp rules (timestamps mode): <|notimestamps|> never; after a
 *      timestamp that follows text only a timestamp or eot... (see
 *      apply_timestamp_rules); timestamps never decrease; the first token is
 *      a timestamp <= max_initial_timestamp_index; when the timestamps' total
 *      probability beats every single text token, text is -inf.
 * Greedy takes the argmax of the processed logits, its log-probability is
 * log_softmax of the processed logits (transformers' avg_logprob). Beam
 * search follows transformers' vectorised beam search: processed
 * log-softmax scores, 2*beams candidates, candidates ending in eot (or
 * reaching max length) among the top `beams` become finished hypotheses
 * scored sum/len^length_penalty, stop when no running beam can beat the
 * worst finished one. */
#include "engine/transcribe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- logit rules ------------------------------------------------------------ */

typedef struct {
    const kn_whisper_config *c;
    int timestamps;
    int ts_begin; /* first timestamp id */
    int eot;
} rules;

/* Apply rules to logits [V] for a sequence whose generated part (after the
 * prompt, i.e. from begin_index) is gen[0..n_gen). */
static void apply_rules(const rules *R, float *x, const int32_t *gen, int n_gen) {
    const kn_whisper_config *c = R->c;
    const int V = c->vocab_size;
    if (n_gen == 0)
        for (int i = 0; i < c->n_begin_suppress; i++) x[c->begin_suppress_tokens[i]] = -INFINITY;
    for (int i = 0; i < c->n_suppress; i++) x[c->suppress_tokens[i]] = -INFINITY;
    if (!R->timestamps) return;
    const int tb = R->ts_begin;
    x[c->no_timestamps_token_id] = -INFINITY;
    int last_ts = n_gen >= 1 && gen[n_gen - 1] >= tb;
    int penult_ts = n_gen < 2 || gen[n_gen - 2] >= tb;
    if (last_ts) {
        if (penult_ts)
            for (int i = tb; i < V; i++) x[i] = -INFINITY; /* has to be text */
        else
            for (int i = 0; i < R->eot; i++) x[i] = -INFINITY; /* cannot be text */
    }
    int last_stamp = -1;
    for (int i = n_gen - 1; i >= 0; i--)
        if (gen[i] >= tb) {
            last_stamp = gen[i];
            break;
        }
    if (last_stamp >= 0) {
        /* timestamps never decrease; a timestamp opening a segment may repeat
         * the one that closed the previous segment, otherwise strictly later */
        int upto = last_ts && !penult_ts ? last_stamp : last_stamp + 1;
        for (int i = tb; i < upto && i < V; i++) x[i] = -INFINITY;
    }
    if (n_gen == 0) {
        for (int i = 0; i < tb; i++) x[i] = -INFINITY;
        if (c->max_initial_timestamp_index >= 0)
            for (int i = tb + c->max_initial_timestamp_index + 1; i < V; i++) x[i] = -INFINITY;
    }
    /* total timestamp probability vs the best text token (on log_softmax) */
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) return;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += x[i] == -INFINITY ? 0.0 : exp((double)x[i] - mx);
    double lse = mx + log(sum);
    double ts_sum = 0;
    float ts_mx = -INFINITY;
    for (int i = tb; i < V; i++) ts_mx = x[i] > ts_mx ? x[i] : ts_mx;
    if (ts_mx == -INFINITY) return;
    for (int i = tb; i < V; i++) ts_sum += x[i] == -INFINITY ? 0.0 : exp((double)x[i] - ts_mx);
    double ts_logprob = ts_mx + log(ts_sum) - lse;
    float text_mx = -INFINITY;
    for (int i = 0; i < tb; i++) text_mx = x[i] > text_mx ? x[i] : text_mx;
    double text_logprob = (double)text_mx - lse;
    if (ts_logprob > text_logprob)
        for (int i = 0; i < tb; i++) x[i] = -INFINITY;
}

/* In place log_softmax (float output, double accumulation). */
static void log_softmax(float *x, int V) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += x[i] == -INFINITY ? 0.0 : exp((double)x[i] - mx);
    float lse = (float)(mx + log(s));
    for (int i = 0; i < V; i++) x[i] = x[i] - lse;
}

static int argmax(const float *x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ---- sampling --------------------------------------------------------------- */

static double rng_uniform(uint64_t *s) {
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static int sample(const float *x, int V, float temp, uint64_t *rng) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double total = 0;
    for (int i = 0; i < V; i++) total += x[i] == -INFINITY ? 0.0 : exp(((double)x[i] - mx) / temp);
    double u = rng_uniform(rng) * total, acc = 0;
    int last = argmax(x, V);
    for (int i = 0; i < V; i++) {
        if (x[i] == -INFINITY) continue;
        acc += exp(((double)x[i] - mx) / temp);
        last = i;
        if (acc >= u) return i;
    }
    return last;
}

/* ---- helpers ---------------------------------------------------------------- */

void kn_decode_options_default(kn_decode_options *o) {
    memset(o, 0, sizeof *o);
    o->timestamps = 1;
    o->beam_size = 1;
    o->length_penalty = 1.0f;
    o->n_temperatures = 6;
    for (int i = 0; i < 6; i++) o->temperatures[i] = 0.2f * (float)i;
    o->compression_ratio_threshold = 2.4;
    o->logprob_threshold = -1.0;
    o->no_speech_threshold = 0.6;
    o->condition_on_previous_text = 1;
    o->seed = 0x5eed;
}

void kn_decode_result_free(kn_decode_result *r) {
    if (!r) return;
    free(r->tokens);
    r->tokens = NULL;
    r->n_tokens = 0;
}

/* transformers' _retrieve_compression_ratio: token ids as little-endian
 * bytes (int(log2(V)/8)+1 each), raw length over zlib length. */
static double compression_ratio(const int32_t *t, int n, int vocab) {
    if (n <= 0) return 0.0;
    int width = (int)(log2((double)vocab) / 8) + 1;
    size_t len = (size_t)n * (size_t)width;
    unsigned char *raw = malloc(len);
    uLongf zl = compressBound((uLong)len);
    unsigned char *z = malloc(zl);
    double r = 0.0;
    if (raw && z) {
        for (int i = 0; i < n; i++)
            for (int b = 0; b < width; b++) raw[(size_t)i * width + b] = (unsigned char)((uint32_t)t[i] >> (8 * b));
        if (compress(z, &zl, raw, (uLong)len) == Z_OK && zl > 0) r = (double)len / (double)zl;
    }
    free(raw);
    free(z);
    return r;
}

static int lang_token(const kn_whisper_config *c, const char *code) {
    for (int i = 0; i < c->n_langs; i++)
        if (!strcmp(c->lang_code[i], code)) return c->lang_token_id[i];
    return -1;
}

/* Language detection: logits after <|startoftranscript|> alone, restricted to
 * the language tokens. */
static kn_code detect_language(kn_whisper *w, float *logits, int *out, kn_error *err) {
    const kn_whisper_config *c = kn_whisper_cfg(w);
    int32_t sot = c->decoder_start_token_id;
    kn_code rc = kn_whisper_decode(w, 1, 1, &sot, 0, 0, logits, err);
    if (rc) return rc;
    int best = -1;
    for (int i = 0; i < c->n_langs; i++)
        if (best < 0 || logits[c->lang_token_id[i]] > logits[best]) best = c->lang_token_id[i];
    *out = best;
    return KN_OK;
}

/* ---- greedy / sampling --------------------------------------------------------- */

static kn_code decode_greedy(kn_whisper *w, const rules *R, const float *first_logits, int n_prompt, int max_new,
                             float temperature, uint64_t *rng, kn_decode_result *r, float *logits, kn_error *err) {
    const int V = R->c->vocab_size;
    memcpy(logits, first_logits, sizeof(float) * (size_t)V);
    for (int step = 0; step < max_new; step++) {
        apply_rules(R, logits, r->tokens, r->n_tokens);
        int t = temperature > 0 ? sample(logits, V, temperature, rng) : argmax(logits, V);
        log_softmax(logits, V); /* of the untempered logits, as transformers' avg_logprob */
        r->tokens[r->n_tokens++] = t;
        if (t == R->eot) break;
        r->sum_logprob += logits[t];
        if (step + 1 == max_new) break;
        int32_t tok = t;
        kn_code rc = kn_whisper_decode(w, 1, 1, &tok, n_prompt + step, 0, logits, err);
        if (rc) return rc;
    }
    return KN_OK;
}

/* ---- beam search (transformers semantics) ------------------------------------- */

typedef struct {
    float score;
    int beam, token;
} cand;

static kn_code decode_beam(kn_whisper *w, const rules *R, const float *first_logits, int n_prompt, int max_new,
                           int nb, float length_penalty, kn_decode_result *r, kn_error *err) {
    const int V = R->c->vocab_size, K = 2 * nb, max_len = n_prompt + max_new;
    float *lp = malloc(sizeof(float) * (size_t)nb * V);
    float *run_score = malloc(sizeof(float) * (size_t)nb);
    int32_t *run_seq = calloc((size_t)nb * (size_t)(max_new + 1), sizeof(int32_t));
    int32_t *new_seq = calloc((size_t)nb * (size_t)(max_new + 1), sizeof(int32_t));
    int32_t *fin_seq = calloc((size_t)nb * (size_t)(max_new + 1), sizeof(int32_t));
    int *fin_len = calloc((size_t)nb, sizeof(int)), *fin_done = calloc((size_t)nb, sizeof(int));
    float *fin_score = malloc(sizeof(float) * (size_t)nb);
    cand *top = malloc(sizeof(cand) * (size_t)K), *merged = malloc(sizeof(cand) * (size_t)(nb + K));
    int *src = malloc(sizeof(int) * (size_t)nb);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)nb);
    kn_code rc = KN_OK;
    if (!lp || !run_score || !run_seq || !new_seq || !fin_seq || !fin_len || !fin_done || !fin_score || !top || !merged ||
        !src || !next) {
        rc = kn_fail(err, KN_ERR_NOMEM, "beam search: out of memory");
        goto done;
    }
    for (int b = 0; b < nb; b++) {
        memcpy(lp + (size_t)b * V, first_logits, sizeof(float) * (size_t)V);
        run_score[b] = b == 0 ? 0.0f : -1e9f;
        fin_score[b] = -1e9f;
    }
    int gen = 0; /* generated tokens so far (cur_len - n_prompt) */
    int early_unsat = 1;
    for (;;) {
        /* log_softmax then the rules on each running beam, plus its score */
        for (int b = 0; b < nb; b++) {
            float *x = lp + (size_t)b * V;
            log_softmax(x, V);
            apply_rules(R, x, run_seq + (size_t)b * (max_new + 1), gen);
            for (int i = 0; i < V; i++) x[i] += run_score[b];
        }
        /* top 2*nb over all beams x vocab (descending, ties by lower index) */
        int nt = 0;
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < V; i++) {
                float s = lp[(size_t)b * V + i];
                if (nt < K || s > top[nt - 1].score) {
                    int p = nt < K ? nt++ : K - 1;
                    while (p > 0 && top[p - 1].score < s) {
                        top[p] = top[p - 1];
                        p--;
                    }
                    top[p] = (cand){s, b, i};
                }
            }
        int hits[64];
        int all_hit = 1;
        for (int k = 0; k < nt; k++) {
            hits[k] = top[k].token == R->eot || n_prompt + gen + 1 >= max_len;
            all_hit &= hits[k];
        }
        /* finished hypotheses: eot candidates among the top nb */
        float denom = powf((float)(gen + 1), length_penalty);
        int nm = 0;
        for (int b = 0; b < nb; b++) merged[nm++] = (cand){fin_score[b], b, -1};
        for (int k = 0; k < nt; k++) {
            float s = top[k].score / denom;
            if (!early_unsat) s += -1e9f;
            if (!(hits[k] && k < nb)) s += -1e9f;
            merged[nm++] = (cand){s, k, -2};
        }
        /* stable order: torch.topk over [finished | candidates] */
        for (int i = 1; i < nm; i++) {
            cand x = merged[i];
            int j = i;
            while (j > 0 && merged[j - 1].score < x.score) {
                merged[j] = merged[j - 1];
                j--;
            }
            merged[j] = x;
        }
        {
            int32_t *tmp_seq = malloc(sizeof(int32_t) * (size_t)nb * (max_new + 1));
            int *tmp_len = malloc(sizeof(int) * (size_t)nb), *tmp_done = malloc(sizeof(int) * (size_t)nb);
            float *tmp_score = malloc(sizeof(float) * (size_t)nb);
            if (!tmp_seq || !tmp_len || !tmp_done || !tmp_score) {
                free(tmp_seq), free(tmp_len), free(tmp_done), free(tmp_score);
                rc = kn_fail(err, KN_ERR_NOMEM, "beam search: out of memory");
                goto done;
            }
            for (int j = 0; j < nb; j++) {
                cand m = merged[j];
                int32_t *dst = tmp_seq + (size_t)j * (max_new + 1);
                tmp_score[j] = m.score;
                if (m.token == -1) {
                    memcpy(dst, fin_seq + (size_t)m.beam * (max_new + 1), sizeof(int32_t) * (size_t)(max_new + 1));
                    tmp_len[j] = fin_len[m.beam];
                    tmp_done[j] = fin_done[m.beam];
                } else {
                    const cand *t = &top[m.beam];
                    memcpy(dst, run_seq + (size_t)t->beam * (max_new + 1), sizeof(int32_t) * (size_t)gen);
                    dst[gen] = t->token;
                    tmp_len[j] = gen + 1;
                    tmp_done[j] = hits[m.beam] && m.beam < nb;
                }
            }
            memcpy(fin_seq, tmp_seq, sizeof(int32_t) * (size_t)nb * (max_new + 1));
            memcpy(fin_len, tmp_len, sizeof(int) * (size_t)nb);
            memcpy(fin_done, tmp_done, sizeof(int) * (size_t)nb);
            memcpy(fin_score, tmp_score, sizeof(float) * (size_t)nb);
            free(tmp_seq), free(tmp_len), free(tmp_done), free(tmp_score);
        }
        /* running beams: best nb candidates, finished ones pushed down by -1e9 */
        cand run[64];
        for (int k = 0; k < nt; k++) run[k] = (cand){top[k].score + (hits[k] ? -1e9f : 0.0f), k, 0};
        for (int i = 1; i < nt; i++) { /* stable descending */
            cand x = run[i];
            int j = i;
            while (j > 0 && run[j - 1].score < x.score) {
                run[j] = run[j - 1];
                j--;
            }
            run[j] = x;
        }
        for (int b = 0; b < nb; b++) {
            const cand *t = &top[run[b].beam];
            src[b] = t->beam;
            next[b] = t->token;
            memcpy(new_seq + (size_t)b * (max_new + 1), run_seq + (size_t)t->beam * (max_new + 1),
                   sizeof(int32_t) * (size_t)gen);
            new_seq[(size_t)b * (max_new + 1) + gen] = t->token;
            run_score[b] = run[b].score;
        }
        memcpy(run_seq, new_seq, sizeof(int32_t) * (size_t)nb * (max_new + 1));
        gen++;
        /* early-stop heuristic (early_stopping False, length_penalty as given) */
        int all_done = 1;
        float worst = INFINITY;
        for (int b = 0; b < nb; b++) {
            all_done &= fin_done[b];
            if (fin_score[b] < worst) worst = fin_score[b];
        }
        float best_run = run_score[0] / powf((float)gen, length_penalty);
        if (!(best_run > (all_done ? worst : -1e9f))) early_unsat = 0;
        if (!early_unsat || all_hit) break;
        /* advance the running beams one token */
        if ((rc = kn_whisper_reorder(w, nb, src, n_prompt + gen - 1, err))) goto done;
        if ((rc = kn_whisper_decode(w, nb, 1, next, n_prompt + gen - 1, 0, lp, err))) goto done;
    }
    /* the best finished hypothesis */
    r->n_tokens = fin_len[0];
    memcpy(r->tokens, fin_seq, sizeof(int32_t) * (size_t)fin_len[0]);
done:
    free(lp), free(run_score), free(run_seq), free(new_seq), free(fin_seq), free(fin_len), free(fin_done);
    free(fin_score), free(top), free(merged), free(src), free(next);
    return rc;
}

/* ---- one window -------------------------------------------------------------------- */

kn_code kn_whisper_decode_window(kn_whisper *w, const float *mel, const int32_t *prev, int n_prev,
                                 const kn_decode_options *o, float temperature, kn_decode_result *r, kn_error *err) {
    const kn_whisper_config *c = kn_whisper_cfg(w);
    const int V = c->vocab_size, T = c->max_target_positions;
    memset(r, 0, sizeof *r);
    r->eot = c->eos_token_id;
    r->language_token = -1;
    r->temperature = temperature;
    if (c->decoder_start_token_id < 0 || c->eos_token_id < 0 || c->no_timestamps_token_id < 1)
        return kn_fail(err, KN_ERR_UNSUPPORTED,
                       "whisper: generation_config.json lacks decoder_start/eos/no_timestamps token ids");
    if (o->timestamps && c->no_timestamps_token_id + 1 >= V)
        return kn_fail(err, KN_ERR_UNSUPPORTED, "whisper: the vocabulary has no timestamp tokens");
    int multilingual = c->is_multilingual && c->n_langs > 0;
    if (o->task == KN_TASK_TRANSLATE && (!multilingual || c->translate_token_id < 0))
        return kn_fail(err, KN_ERR_UNSUPPORTED, "whisper: this model cannot translate (English-only)");
    int beams = o->beam_size > 1 && temperature == 0.0f ? o->beam_size : 1;
    if (beams > 32) return kn_fail(err, KN_ERR_INVALID_ARG, "beam size %d too large (max 32)", beams);
    int lang = -1;
    if (multilingual && o->language) {
        lang = lang_token(c, o->language);
        if (lang < 0) return kn_fail(err, KN_ERR_INVALID_ARG, "whisper: language \"%s\" is not in this model", o->language);
    }
    kn_code rc = mel ? kn_whisper_encode(w, mel, err) : KN_OK;
    if (rc) return rc;
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)(T > 64 ? T : 64));
    if (!logits) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (multilingual && lang < 0 && (rc = detect_language(w, logits, &lang, err))) goto fail;
    r->language_token = lang;

    /* prompt: [<|startofprev|> prev...] <|startoftranscript|> [lang task] [<|notimestamps|>] */
    int32_t prompt[512];
    int n = 0, max_prev = T / 2 - 1;
    if (prev && n_prev > 0 && c->prev_sot_token_id >= 0) {
        int k = n_prev > max_prev ? max_prev : n_prev;
        if (k > 256) k = 256;
        prompt[n++] = c->prev_sot_token_id;
        memcpy(prompt + n, prev + n_prev - k, sizeof(int32_t) * (size_t)k);
        n += k;
    }
    int sot_index = n;
    prompt[n++] = c->decoder_start_token_id;
    if (multilingual) {
        prompt[n++] = lang;
        prompt[n++] = o->task == KN_TASK_TRANSLATE ? c->translate_token_id : c->transcribe_token_id;
    }
    if (!o->timestamps) prompt[n++] = c->no_timestamps_token_id;
    int max_new = o->max_new_tokens > 0 ? o->max_new_tokens : T / 2;
    if (n + max_new > T) max_new = T - n;
    if (max_new < 1) {
        rc = kn_fail(err, KN_ERR_INVALID_ARG, "whisper: prompt of %d tokens leaves no room to decode", n);
        goto fail;
    }
    r->tokens = malloc(sizeof(int32_t) * (size_t)(max_new + 1));
    if (!r->tokens) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = kn_whisper_decode(w, 1, n, prompt, 0, 1, logits, err))) goto fail;
    /* no-speech probability at the <|startoftranscript|> row */
    {
        const float *row = logits + (size_t)sot_index * V;
        int ns = c->no_timestamps_token_id - 1;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double s = 0;
        for (int i = 0; i < V; i++) s += exp((double)row[i] - mx);
        r->no_speech_prob = exp((double)row[ns] - mx) / s;
    }
    rules R = {.c = c, .timestamps = o->timestamps, .ts_begin = c->no_timestamps_token_id + 1, .eot = c->eos_token_id};
    const float *first = logits + (size_t)(n - 1) * V;
    if (beams > 1) {
        float *first_copy = malloc(sizeof(float) * (size_t)V);
        int *zeros = calloc((size_t)beams, sizeof(int));
        if (!first_copy || !zeros) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        if (!rc) {
            memcpy(first_copy, first, sizeof(float) * (size_t)V);
            rc = kn_whisper_reorder(w, beams, zeros, n, err);
        }
        if (!rc) rc = decode_beam(w, &R, first_copy, n, max_new, beams, o->length_penalty, r, err);
        free(first_copy);
        free(zeros);
        if (!rc) {
            /* the chosen hypothesis' log-probabilities, by a teacher-forced pass */
            int32_t *full = malloc(sizeof(int32_t) * (size_t)(n + r->n_tokens));
            if (!full) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            else {
                memcpy(full, prompt, sizeof(int32_t) * (size_t)n);
                memcpy(full + n, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
                int m = n + r->n_tokens - 1;
                if (m > n - 1 && (rc = kn_whisper_decode(w, 1, m, full, 0, 1, logits, err)) == KN_OK) {
                    for (int i = 0; i < r->n_tokens; i++) {
                        float *x = logits + (size_t)(n - 1 + i) * V;
                        apply_rules(&R, x, r->tokens, i);
                        log_softmax(x, V);
                        if (r->tokens[i] != r->eot) r->sum_logprob += x[r->tokens[i]];
                    }
                }
                free(full);
            }
        }
    } else {
        uint64_t rng = o->seed ^ (uint64_t)(temperature * 1000.0f) * 0x9e3779b97f4a7c15ull;
        rc = decode_greedy(w, &R, first, n, max_new, temperature, &rng, r, logits, err);
    }
    if (rc) goto fail;
    int n_text = 0;
    for (int i = 0; i < r->n_tokens; i++) n_text += r->tokens[i] != r->eot;
    r->avg_logprob = r->sum_logprob / (n_text + 1);
    r->compression_ratio = compression_ratio(r->tokens, n_text, V);
    free(logits);
    return KN_OK;
fail:
    free(logits);
    kn_decode_result_free(r);
    return rc;
}

/* generate.c — single-sequence generation (kiln.h kn_generate): chunked
 * prefill of the prompt, then one decode step per token until max_new_tokens,
 * an EOS id from generation_config, the context limit, or the callback says
 * stop. The continuous-batching scheduler drives the same forward pass with
 * many sequences. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/sampler.h"
#include "models/model.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

kn_sampling kn_sampling_defaults(const kn_model *m) {
    const kn_model_config *c = &m->cfg;
    kn_sampling s = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0,
                     .max_new_tokens = 32, .ignore_eos = 0};
    if (c->gen_do_sample) {
        s.temperature = (float)c->gen_temperature;
        s.top_k = c->gen_top_k;
        s.top_p = (float)c->gen_top_p;
        s.min_p = (float)c->gen_min_p;
    }
    return s;
}

static int is_eos(const kn_model_config *c, int32_t tok) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == tok) return 1;
    return 0;
}

/* Forward ids[0..n) from position 0 in max_chunk pieces, capped by
 * kn_kv_max_append (length-dependent RoPE scaled for all n, as one
 * transformers forward); the last row's logits (or its greedy id, or the
 * id sampled on the backend under sample, into *next) come back. */
static kn_code prefill(kn_model *m, kn_kv_seq **seqs, const int32_t *ids, int n_ids, int32_t *pos, int32_t *sidx,
                       float *logits, int32_t *next, const kn_sample_params *sample, kn_error *err) {
    kn_code rc = KN_OK;
    const int32_t rope_len = n_ids;
    for (int c0 = 0, n = 0; !rc && c0 < n_ids; c0 += n) { /* delayed conversion: a chunk never straddles --kv-start */
        n = kn_kv_max_append(m->kv, seqs[0], c0, n_ids - c0 < m->max_chunk ? n_ids - c0 : m->max_chunk);
        for (int i = 0; i < n; i++) pos[i] = c0 + i;
        int32_t last = n - 1;
        int want = c0 + n == n_ids;
        kn_batch b = {.n_tokens = n, .tokens = ids + c0, .pos = pos, .seq = sidx, .n_seqs = 1, .seqs = seqs,
                      .n_logits = want, .logit_rows = &last, .argmax = next, .rope_len = &rope_len,
                      .sample = want ? sample : NULL};
        rc = kn_model_forward(m, &b, logits, err);
        seqs[0]->n_tokens = c0 + n;
    }
    return rc;
}

kn_code kn_generate(kn_model *m, const int32_t *prompt, int n_prompt, const kn_sampling *sp, kn_token_cb cb,
                    void *user, kn_generate_stats *stats, kn_error *err) {
    const int V = m->cfg.vocab_size;
    if (n_prompt <= 0) return kn_fail(err, KN_ERR_INVALID_ARG, "the prompt is empty");
    if (n_prompt >= m->max_context)
        return kn_fail(err, KN_ERR_INVALID_ARG, "prompt of %d tokens does not fit the context of %d", n_prompt,
                       m->max_context);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return kn_fail(err, KN_ERR_INVALID_ARG, "prompt token %d is outside the vocabulary (0..%d)", prompt[i],
                           V - 1);
    kn_generate_stats st = {.n_prompt = n_prompt};
    kn_kv_seq seq = {0};
    kn_kv_seq *seqs[1] = {&seq};
    kn_sampler_scratch scratch = {0};
    kn_rng rng;
    kn_rng_seed(&rng, sp->seed);
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *pos = malloc((size_t)m->max_chunk * 4), *sidx = calloc((size_t)m->max_chunk, 4);
    kn_code rc = (!logits || !pos || !sidx) ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
    if (!rc) rc = kn_sampler_scratch_init(&scratch, V, err);
    int limit = n_prompt + sp->max_new_tokens;
    if (limit > m->max_context) limit = m->max_context;
    if (!rc) rc = kn_kv_seq_reserve(m->kv, &seq, limit, err);

    /* greedy, or sampling where the backend has sample_rows: the backend picks the token and only its id
     * crosses to the host (the uniform of each sampled token drawn before its forward) */
    const int greedy = sp->temperature <= 0.0f || sp->top_k == 1;
    const int on_backend = greedy || kn_model_samples_on_backend(m);
    kn_sample_params sparams = {0};
    const kn_sample_params *sample = greedy || !on_backend ? NULL : &sparams;
    int32_t next = 0;
    double t0 = now_seconds();
    /* the token history (prompt + generated): longrope models recompute it at the switch to long factors */
    int32_t *hist = malloc((size_t)(limit > n_prompt ? limit : n_prompt) * sizeof *hist);
    if (!rc && !hist) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (hist) memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    const int switch_at = m->cfg.rope.type == KN_ROPE_LONGROPE ? m->cfg.rope.original_max_position_embeddings : -1;
    if (sample) sparams = kn_sample_params_draw(sp, &rng);
    if (!rc) rc = prefill(m, seqs, hist, n_prompt, pos, sidx, logits, on_backend ? &next : NULL, sample, err);
    double t1 = now_seconds();
    st.prefill_seconds = t1 - t0;
    int p = n_prompt;
    while (!rc && st.n_generated < sp->max_new_tokens) {
        int32_t tok = on_backend ? next : kn_sample(logits, V, sp, &rng, &scratch);
        st.n_generated++;
        int stop = cb ? cb(tok, user) : 0;
        if (stop || (!sp->ignore_eos && is_eos(&m->cfg, tok)) || st.n_generated >= sp->max_new_tokens ||
            p >= m->max_context)
            break;
        hist[p] = tok;
        if (sample) sparams = kn_sample_params_draw(sp, &rng);
        if (p == switch_at && n_prompt <= switch_at) {
            /* transformers' phi3 generate drops the cache when the sequence first outgrows
             * original_max_position_embeddings: everything is recomputed with the long factors */
            rc = prefill(m, seqs, hist, p + 1, pos, sidx, logits, on_backend ? &next : NULL, sample, err);
        } else {
            int32_t row = 0;
            kn_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &p, .seq = sidx, .n_seqs = 1, .seqs = seqs,
                          .n_logits = 1, .logit_rows = &row, .argmax = on_backend ? &next : NULL, .sample = sample};
            rc = kn_model_forward(m, &b, logits, err);
        }
        seq.n_tokens = ++p;
    }
    free(hist);
    st.decode_seconds = now_seconds() - t1;
    if (stats) *stats = st;
    kn_kv_seq_release(m->kv, &seq);
    kn_sampler_scratch_free(&scratch);
    free(logits), free(pos), free(sidx);
    return rc;
}

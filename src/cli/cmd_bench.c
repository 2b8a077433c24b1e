/* cmd_bench.c — `kiln bench`: prefill and decode throughput on a real
 * checkpoint or on synthetic weights at a real shape, next to the memory
 * read floor measured in the same run.
 *
 * Decode floor: every step reads all weights once plus the KV written so far;
 * floor tok/s = read bandwidth / bytes per step (per sequence-step for
 * batch > 1 the weights are shared, so the floor is batch x that).
 *
 * --floor-every N pairs the floor with the decode it judges, for machines
 * whose read rate moves during a run (shared VMs): the decode runs in
 * segments of N steps with the read probe before each segment and after the
 * last, each segment's fraction of the floor is taken against the mean of the
 * two probes around it, and the median over segments is reported beside the
 * single-probe fraction. Probe time is not decode time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/quant.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/synthetic.h"
#include "io/file_util.h"
#include "io/hf_path.h"
#include "models/model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    double read_gbs, prefill_tps, prefill_s, decode_tps, decode_s, weight_gb, active_gb, floor_tps, gflops_prefill, ttft_s;
    double prefill_tps_min, prefill_tps_max; /* over the repetitions; prefill_tps / ttft_s are their medians */
    int segments;                            /* --floor-every: decode segments, each between two probes */
    double paired_fraction, probe_gbs_min, probe_gbs_max; /* median segment fraction; the probes' range */
} bench_result;

#define BENCH_MAX_REPS 20

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* host_logits 0: decode as a greedy engine does, the backend picks each
 * token and only ids cross to the host; 1: every step's logits are copied to
 * the host (what a host-side sampler needs). */
/* every row under the same parameters, a fresh uniform per row and step (no-op without sampling) */
static void fill_sample_rows(kn_sample_params *rows, int batch, const kn_sample_params *sample, uint64_t *state) {
    for (int b = 0; rows && b < batch; b++)
        rows[b] = *sample, rows[b].u = (double)((*state = *state * 6364136223846793005ull + 1) >> 11) * 0x1.0p-53;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static kn_code run_bench(kn_model *m, int prompt, int gen, int batch, int reps, int host_logits, int floor_every,
                         const kn_sample_params *sample, bench_result *r, kn_error *err) {
    const int V = m->cfg.vocab_size;
    kn_kv_seq *seqs = calloc((size_t)batch, sizeof *seqs);
    kn_kv_seq **sp = calloc((size_t)batch, sizeof *sp);
    int32_t *tok = malloc((size_t)m->max_chunk * 4), *pos = malloc((size_t)m->max_chunk * 4),
            *sidx = malloc((size_t)m->max_chunk * 4), *rows = malloc((size_t)m->max_chunk * 4);
    float *logits = malloc((size_t)batch * V * sizeof(float));
    int32_t *next = malloc((size_t)batch * sizeof(int32_t));
    /* sampling on the backend (--temp > 0) */
    kn_sample_params *sp_rows = sample ? calloc((size_t)batch, sizeof *sp_rows) : NULL;
    uint64_t useed = 0x9e3779b97f4a7c15ull;
    kn_code rc = (!seqs || !sp || !tok || !pos || !sidx || !rows || !logits || !next || (sample && !sp_rows))
                     ? kn_fail(err, KN_ERR_NOMEM, "out of memory") : KN_OK;
    for (int b = 0; !rc && b < batch; b++) {
        sp[b] = &seqs[b];
        rc = kn_kv_seq_reserve(m->kv, &seqs[b], prompt + gen, err);
    }
    r->read_gbs = m->be->vt->read_bandwidth(m->be) / 1e9;
    /* warm-up, untimed: one prefill chunk (library initialization, GEMM
     * heuristics) and two decode steps at the first decode position (the
     * backend records its decode graph on the second); the timed runs below
     * overwrite the KV entries these write. */
    for (int i = 0; i < m->max_chunk && i < prompt; i++) tok[i] = (int32_t)(i % V), pos[i] = i, sidx[i] = 0;
    if (!rc) {
        kn_batch bt = {.n_tokens = prompt < m->max_chunk ? prompt : m->max_chunk, .tokens = tok, .pos = pos,
                       .seq = sidx, .n_seqs = 1, .seqs = &sp[0], .n_logits = 0, .logit_rows = rows};
        rc = kn_model_forward(m, &bt, logits, err);
    }
    for (int w = 0; !rc && w < 2; w++) {
        for (int b = 0; b < batch; b++) tok[b] = (int32_t)(b % V), pos[b] = prompt, sidx[b] = b, rows[b] = b;
        fill_sample_rows(sp_rows, batch, sample, &useed);
        kn_batch bt = {.n_tokens = batch, .tokens = tok, .pos = pos, .seq = sidx, .n_seqs = batch, .seqs = sp,
                       .n_logits = batch, .logit_rows = rows, .argmax = host_logits ? NULL : next, .sample = sp_rows};
        rc = kn_model_forward(m, &bt, logits, err);
    }
    /* prefill: each sequence's prompt, in chunks; reps times over the same
     * positions (each rewrites the KV entries of the one before) */
    double pre_s[BENCH_MAX_REPS], ttft[BENCH_MAX_REPS];
    for (int rep = 0; !rc && rep < reps; rep++) {
    double t0 = now_s();
    for (int b = 0; !rc && b < batch; b++) {
        for (int c0 = 0, n = 0; !rc && c0 < prompt; c0 += n) {
            n = kn_kv_max_append(m->kv, sp[b], c0, prompt - c0 < m->max_chunk ? prompt - c0 : m->max_chunk);
            for (int i = 0; i < n; i++) tok[i] = (int32_t)((c0 + i) * 7919 % V), pos[i] = c0 + i, sidx[i] = 0;
            int32_t last = n - 1;
            kn_batch bt = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = sidx, .n_seqs = 1, .seqs = &sp[b],
                           .n_logits = c0 + n == prompt, .logit_rows = &last, .argmax = host_logits ? NULL : next};
            rc = kn_model_forward(m, &bt, logits, err);
        }
        if (b == 0) ttft[rep] = now_s() - t0; /* first sequence: prompt in, first token out */
    }
    pre_s[rep] = now_s() - t0;
    }
    if (!rc) {
        r->prefill_s = median_of(pre_s, reps);
        r->ttft_s = median_of(ttft, reps);
        r->prefill_tps = (double)prompt * batch / r->prefill_s;
        r->prefill_tps_max = (double)prompt * batch / pre_s[0];
        r->prefill_tps_min = (double)prompt * batch / pre_s[reps - 1];
    }
    /* decode: all sequences advance one token per step; with floor_every,
     * in segments of that many steps, the read probe around each */
    const int seg_len = floor_every > 0 && floor_every < gen ? floor_every : gen;
    const int n_seg = (gen + seg_len - 1) / seg_len;
    double *seg_s = calloc((size_t)n_seg, sizeof *seg_s), *probe = calloc((size_t)n_seg + 1, sizeof *probe);
    if (!rc && (!seg_s || !probe)) rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (!rc && floor_every > 0) probe[0] = m->be->vt->read_bandwidth(m->be) / 1e9;
    r->decode_s = 0.0;
    for (int sg = 0; !rc && sg < n_seg; sg++) {
        const double t1 = now_s();
        for (int g = sg * seg_len; !rc && g < gen && g < (sg + 1) * seg_len; g++) {
            for (int b = 0; b < batch; b++)
                tok[b] = (int32_t)((g * 31 + b) % V), pos[b] = prompt + g, sidx[b] = b, rows[b] = b;
            fill_sample_rows(sp_rows, batch, sample, &useed);
            kn_batch bt = {.n_tokens = batch, .tokens = tok, .pos = pos, .seq = sidx, .n_seqs = batch, .seqs = sp,
                           .n_logits = batch, .logit_rows = rows, .argmax = host_logits ? NULL : next, .sample = sp_rows};
            rc = kn_model_forward(m, &bt, logits, err);
        }
        seg_s[sg] = now_s() - t1;
        r->decode_s += seg_s[sg];
        if (!rc && floor_every > 0) probe[sg + 1] = m->be->vt->read_bandwidth(m->be) / 1e9;
    }
    r->decode_tps = (double)gen * batch / r->decode_s;
    double wbytes = (double)kn_model_weight_bytes(m);
    r->weight_gb = (double)kn_model_total_weight_bytes(m) / 1e9;
    /* MoE: kn_model_weight_bytes counts the k experts one token selects; with
     * the router's choices spread evenly, batch B touches 1 - (1 - k/E)^B of
     * each layer's E experts: the active-parameter floor of the step */
    const int E = m->cfg.n_experts, k = m->cfg.n_experts_per_tok;
    if (E > 0 && k > 0 && batch > 1) {
        const double touched = E * (1.0 - pow(1.0 - (double)k / E, (double)batch));
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (m->layers[l].is_moe) {
                const kn_layer *L = &m->layers[l];
                const double per_expert =
                    (double)(kn_weight_bytes(&L->experts_gate_up) + kn_weight_bytes(&L->experts_down)) / E;
                wbytes += per_expert * (touched - k);
            }
    }
    r->active_gb = wbytes / 1e9;
    /* K/V read per step: every position of full-attention layers, the last window of ring layers */
    const double ctx = prompt + gen / 2.0, win = m->cfg.sliding_window < ctx ? m->cfg.sliding_window : ctx;
    const double ring_tok = m->kv->ring ? (double)kn_kv_bytes_per_token(m->kv->ring) : 0.0;
    double kv_per_step = ((double)(kn_kv_bytes_per_token(m->kv) - ring_tok) * ctx + ring_tok * win) * batch;
    const double tps_per_gbs = 1e9 / (wbytes + kv_per_step) * batch; /* floor tok/s per GB/s of reads */
    r->floor_tps = r->read_gbs * tps_per_gbs;
    r->segments = floor_every > 0 && !rc ? n_seg : 0;
    if (r->segments) { /* each segment against the probes on either side of it */
        r->probe_gbs_min = r->probe_gbs_max = probe[0];
        for (int sg = 0; sg < n_seg; sg++) {
            const int steps = (sg + 1) * seg_len < gen ? seg_len : gen - sg * seg_len;
            const double floor_tps = 0.5 * (probe[sg] + probe[sg + 1]) * tps_per_gbs;
            r->probe_gbs_min = fmin(r->probe_gbs_min, probe[sg + 1]);
            r->probe_gbs_max = fmax(r->probe_gbs_max, probe[sg + 1]);
            seg_s[sg] = (double)steps * batch / seg_s[sg] / floor_tps; /* now the segment's fraction */
        }
        r->paired_fraction = median_of(seg_s, n_seg);
    }
    free(seg_s), free(probe);
    /* matmul FLOPs of prefill: 2 x weight elements x tokens */
    double elems = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kn_layer *L = &m->layers[l];
        elems += (double)L->qkv.rows * L->qkv.cols + (double)L->o.rows * L->o.cols +
                 (double)L->gate_up.rows * L->gate_up.cols + (double)L->down.rows * L->down.cols;
    }
    r->gflops_prefill = 2.0 * elems * prompt * batch / r->prefill_s / 1e9;
    for (int b = 0; b < batch && seqs; b++) kn_kv_seq_release(m->kv, &seqs[b]);
    free(seqs), free(sp), free(tok), free(pos), free(sidx), free(rows), free(logits), free(next), free(sp_rows);
    return rc;
}

int kn_cmd_bench(int argc, char **argv) {
    kn_cli_common common = {0};
    const char *model = NULL, *synthetic = NULL, *dtype_arg = NULL;
    long prompt = 128, gen = 64, batch = 1, bits = 0, group_size = 64, reps = 1, floor_every = 0;
    int json = 0, host_logits = 0;
    double temp = 0.0, top_p = 1.0, min_p = 0.0;
    long top_k = 0;
    kn_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = kn_cli_common_opt(&common, argc, argv, &i);
        if (r < 0) return 2;
        if (r && common.kv_start) return kn_cli_usage_error("bench: --kv-start is not supported (bench measures one format)");
        if (r) continue;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        kn_code rc = KN_OK;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--host-logits")) { host_logits = 1; continue; }
        if (a[0] != '-') {
            if (model) return kn_cli_usage_error("bench: unexpected argument \"%s\"", a);
            model = a;
            continue;
        }
        if (!v) return kn_cli_usage_error("%s needs a value", a);
        if (!strcmp(a, "--synthetic")) synthetic = v;
        else if (!strcmp(a, "--prompt")) rc = kn_parse_int(a, v, 1, 1 << 20, &prompt, &err);
        else if (!strcmp(a, "--gen")) rc = kn_parse_int(a, v, 1, 1 << 20, &gen, &err);
        else if (!strcmp(a, "--batch")) rc = kn_parse_int(a, v, 1, 512, &batch, &err);
        else if (!strcmp(a, "--reps")) rc = kn_parse_int(a, v, 1, BENCH_MAX_REPS, &reps, &err);
        else if (!strcmp(a, "--floor-every")) rc = kn_parse_int(a, v, 1, 1 << 20, &floor_every, &err);
        else if (!strcmp(a, "--dtype")) dtype_arg = v;
        else if (!strcmp(a, "--bits")) rc = kn_parse_int(a, v, 0, 8, &bits, &err);
        else if (!strcmp(a, "--group-size")) rc = kn_parse_int(a, v, 32, 128, &group_size, &err);
        else if (!strcmp(a, "--temp")) rc = kn_parse_float(a, v, 0.0, 100.0, &temp, &err);
        else if (!strcmp(a, "--top-p")) rc = kn_parse_float(a, v, 0.0, 1.0, &top_p, &err);
        else if (!strcmp(a, "--min-p")) rc = kn_parse_float(a, v, 0.0, 1.0, &min_p, &err);
        else if (!strcmp(a, "--top-k")) rc = kn_parse_int(a, v, 0, 1 << 24, &top_k, &err);
        else return kn_cli_usage_error("bench: unknown option %s", a);
        if (rc) return kn_cli_error(&err);
        i++;
    }
    if (!model == !synthetic) return kn_cli_usage_error("bench: give either MODEL or --synthetic CONFIG.json");
    if (bits && !synthetic) return kn_cli_usage_error("bench: --bits applies to --synthetic weights (a quantized MODEL says its own)");
    if (bits && (!kn_quant_bits_ok((int)bits) || kn_quant_compute_bits((int)bits) != (int)bits || !kn_quant_group_ok((int)group_size)))
        return kn_cli_usage_error("bench: --bits must be 2, 4 or 8 and --group-size 32, 64 or 128");
    int ctx = (int)(prompt + gen);
    kn_model *m = NULL;
    kn_synthetic *syn = NULL;
    kn_backend *be = NULL;
    kn_model_config cfg;
    kn_code rc;
    char label[4096];
    if (synthetic) {
        char *text;
        size_t len;
        if ((rc = kn_read_file(synthetic, 1 << 20, &text, &len, &err))) return kn_cli_error(&err);
        rc = kn_config_parse(text, len, NULL, 0, synthetic, &cfg, &err);
        free(text);
        if (rc) return kn_cli_error(&err);
        kn_dtype dt = strstr(cfg.torch_dtype, "float32") ? KN_DT_F32 : strstr(cfg.torch_dtype, "float16") && !strstr(cfg.torch_dtype, "bfloat16") ? KN_DT_F16 : KN_DT_BF16;
        if (dtype_arg) {
            if (!strcmp(dtype_arg, "bf16")) dt = KN_DT_BF16;
            else if (!strcmp(dtype_arg, "f16")) dt = KN_DT_F16;
            else if (!strcmp(dtype_arg, "f32")) dt = KN_DT_F32;
            else return kn_cli_usage_error("--dtype must be bf16, f16 or f32");
        }
        if (bits && dt == KN_DT_F32) dt = KN_DT_BF16; /* scales/biases: bf16 like mlx-community checkpoints */
        if ((rc = kn_synthetic_create_quant(&cfg, dt, (int)bits, (int)group_size, 1234, common.n_threads, &syn, &err)))
            return kn_cli_error(&err);
        if ((rc = kn_backend_create(common.backend, common.n_threads, &be, &err))) {
            kn_synthetic_free(syn);
            return kn_cli_error(&err);
        }
        be->memory_fraction = common.gpu_memory;
        kn_tensor_source src = kn_synthetic_source(syn);
        kn_kv_spec kvs;
        if (common.kv && kn_kv_spec_parse(common.kv, common.kv_keep == 0 ? -1 : common.kv_keep < 0 ? 0 : common.kv_keep,
                                          &kvs, &err)) {
            kn_backend_destroy(be);
            kn_synthetic_free(syn);
            return kn_cli_error(&err);
        }
        if ((rc = kn_model_build_kv(&cfg, &src, be, ctx, (int)batch, common.kv ? &kvs : NULL, &m, &err))) {
            kn_synthetic_free(syn);
            return kn_cli_error(&err);
        }
        if (bits) snprintf(label, sizeof label, "synthetic %s (MLX affine %ld-bit, group %ld)", synthetic, bits, group_size);
        else snprintf(label, sizeof label, "synthetic %s", synthetic);
    } else {
        if (batch != 1) return kn_cli_usage_error("bench MODEL: --batch > 1 needs --synthetic in this build");
        char dir[4096];
        if ((rc = kn_resolve_model_path(model, dir, sizeof dir, &err))) return kn_cli_error(&err);
        kn_model_options o = {.backend = common.backend, .n_threads = common.n_threads, .max_context = ctx,
                              .gpu_memory = common.gpu_memory, .kv = common.kv, .kv_keep_layers = common.kv_keep};
        if ((rc = kn_model_open(dir, &o, &m, &err))) return kn_cli_error(&err);
        snprintf(label, sizeof label, "%s", dir);
    }
    bench_result r = {0};
    const kn_sample_params sparams = {.temperature = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p,
                                      .min_p = (float)min_p};
    const int sampled = temp > 0.0 && !host_logits && kn_model_samples_on_backend(m);
    if (temp > 0.0 && !sampled && !host_logits)
        fprintf(stderr, "bench: the %s backend cannot sample; decoding greedily\n", m->be->vt->name);
    const char *how = host_logits ? "host logits" : sampled ? "backend sampling" : "backend greedy";
    rc = run_bench(m, (int)prompt, (int)gen, (int)batch, (int)reps, host_logits, (int)floor_every,
                   sampled ? &sparams : NULL, &r, &err);
    if (!rc) {
        if (json)
            printf("{\"model\": \"%s\", \"desc\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"prompt\": %ld, "
                   "\"gen\": %ld, \"batch\": %ld, \"weight_gb\": %.4f, \"active_weight_gb\": %.4f, \"read_bandwidth_gbs\": %.2f, "
                   "\"prefill_tok_s\": %.2f, \"prefill_tok_s_min\": %.2f, \"prefill_tok_s_max\": %.2f, \"prefill_reps\": %ld, "
                   "\"prefill_gflops\": %.1f, \"decode_tok_s\": %.2f, "
                   "\"decode_floor_tok_s\": %.2f, \"decode_fraction_of_floor\": %.3f, \"ttft_ms\": %.2f, "
                   "\"sampling\": \"%s\"",
                   label, m->desc, m->be->vt->name, m->be->n_threads, prompt, gen, batch, r.weight_gb, r.active_gb, r.read_gbs,
                   r.prefill_tps, r.prefill_tps_min, r.prefill_tps_max, reps, r.gflops_prefill, r.decode_tps, r.floor_tps,
                   r.decode_tps / r.floor_tps, r.ttft_s * 1e3, how);
        if (json && r.segments)
            printf(", \"floor_segments\": %d, \"decode_fraction_paired\": %.3f, \"probe_gbs_min\": %.2f, "
                   "\"probe_gbs_max\": %.2f",
                   r.segments, r.paired_fraction, r.probe_gbs_min, r.probe_gbs_max);
        if (json) printf("}\n");
        else
            printf("model    %s\n         %s\nbackend  %s, %d threads\nweights  %.3f GB, %.3f GB read per decode step (active)\n"
                   "memory   %.1f GB/s read bandwidth (measured now)\n"
                   "prefill  %ld tokens x %ld: %.1f tok/s (%.1f GFLOP/s in matmuls; median of %ld, %.1f..%.1f)\n"
                   "decode   %ld tokens x %ld: %.2f tok/s; floor %.2f tok/s -> %.1f%% of the memory floor (%s)\n"
                   "ttft     %.2f ms (first sequence)\n",
                   label, m->desc, m->be->vt->name, m->be->n_threads, r.weight_gb, r.active_gb, r.read_gbs, prompt, batch,
                   r.prefill_tps, r.gflops_prefill, reps, r.prefill_tps_min, r.prefill_tps_max, gen, batch, r.decode_tps,
                   r.floor_tps,
                   100.0 * r.decode_tps / r.floor_tps, how,
                   r.ttft_s * 1e3);
        if (!json && r.segments)
            printf("paired   %.1f%% of the floor: median over %d decode segments, each against the read probes "
                   "around it (%.1f..%.1f GB/s)\n",
                   100.0 * r.paired_fraction, r.segments, r.probe_gbs_min, r.probe_gbs_max);
    }
    kn_model_close(m);
    kn_synthetic_free(syn);
    return rc ? kn_cli_error(&err) : 0;
}

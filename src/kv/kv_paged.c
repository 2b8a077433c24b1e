/* kv_paged.c — see kv_paged.h. */
#include "kv/kv_paged.h"

#include <stdlib.h>
#include <string.h>

#include "base/kv_codec_tables.h"

#define TAB_CACHE 8

struct tab_cache { /* host copies of Lloyd-Max tables computed so far (per format and head dim) */
    int n, fmt[TAB_CACHE], dim[TAB_CACHE];
    float tab[TAB_CACHE][32];
};

static const float *cached_table(struct tab_cache *tc, int f, int D) {
    for (int i = 0; i < tc->n; i++)
        if (tc->fmt[i] == f && tc->dim[i] == D) return tc->tab[i];
    if (tc->n == TAB_CACHE) tc->n = 0; /* recompute rather than grow: at most a few distinct pairs */
    int i = tc->n++;
    tc->fmt[i] = f, tc->dim[i] = D;
    kn_kv_fmt_table(f, D, tc->tab[i]);
    return tc->tab[i];
}

/* Backend memory behind one layer's side tables: k_tab, v_tab, signs,
 * k_scale, v_scale (whichever the formats need), one allocation. */
static kn_code layer_tables(kn_kv_pool *p, int l, const kn_kv_spec *spec, struct tab_cache *tc, kn_error *err) {
    kn_kv_layer *L = &p->layers[l];
    const int D = L->head_dim, H = L->n_kv_heads;
    const int kl = kn_kv_fmt_tab_len(L->k_fmt), vl = kn_kv_fmt_tab_len(L->v_fmt);
    const int rot = kl || vl, nk = L->k_fmt == KN_KVF_FP8 ? H : 0, nv = L->v_fmt == KN_KVF_FP8 ? H : 0;
    const size_t n = (size_t)kl + vl + (rot ? D : 0) + nk + nv;
    if (!n) return KN_OK;
    float *host = malloc(n * sizeof(float));
    float *dev = kn_be_alloc(p->be, n * sizeof(float));
    if (!host || !dev) {
        free(host);
        kn_be_free(p->be, dev);
        return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory for codec tables");
    }
    size_t o = 0;
    if (kl) memcpy(host + o, cached_table(tc, L->k_fmt, D), (size_t)kl * sizeof(float)), L->k_tab = dev + o, o += kl;
    if (vl) memcpy(host + o, cached_table(tc, L->v_fmt, D), (size_t)vl * sizeof(float)), L->v_tab = dev + o, o += vl;
    if (rot) kn_kv_signs(spec->seed, D, host + o), L->signs = dev + o, o += D;
    /* fp8: one scale per (layer, KV head); 1.0 until calibrated (e4m3 spans 2^-9 .. 448) */
    for (int h = 0; h < nk; h++) host[o + h] = 1.0f;
    if (nk) L->k_scale = dev + o, o += nk;
    for (int h = 0; h < nv; h++) host[o + h] = 1.0f;
    if (nv) L->v_scale = dev + o, o += nv;
    kn_be_upload(p->be, dev, host, n * sizeof(float));
    kn_be_sync(p->be);
    free(host);
    p->tables[l] = dev;
    return KN_OK;
}

/* A pool as kn_kv_pool_create_ex says; with delayed conversion, each
 * sequence stages at most stage_span blocks (kv_start / block_size for a
 * main pool, fewer for a ring), so n_stage_blocks must cover one such sequence. */
static kn_code pool_create(kn_backend *be, const kn_kv_pool_params *pp, int64_t stage_span, kn_kv_pool **out,
                           kn_error *err) {
    *out = NULL;
    const int n_layers = pp->n_layers, block_size = pp->block_size;
    const int64_t n_blocks = pp->n_blocks;
    if (n_layers < 0 || block_size <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX / block_size)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv pool: invalid geometry");
    /* formats follow model layer positions (boundary layers) where the pool holds some of a model's layers */
    const int model_layers = pp->layer_ids ? pp->model_layers : n_layers;
    for (int l = 0; l < n_layers; l++)
        if (pp->n_kv_heads[l] <= 0 || pp->head_dim[l] <= 0 ||
            (pp->layer_ids && (pp->layer_ids[l] < 0 || pp->layer_ids[l] >= model_layers)))
            return kn_fail(err, KN_ERR_INVALID_ARG, "kv pool: invalid geometry of layer %d", l);
    kn_kv_spec spec = pp->spec ? *pp->spec : kn_kv_spec_default(KN_DT_F32);
    kn_code rc = kn_kv_spec_check_ids(&spec, n_layers, pp->layer_ids, model_layers, pp->head_dim, err);
    if (rc) return rc;
    const int64_t n_stage = spec.kv_start > 0 ? pp->n_stage_blocks : 0;
    if (spec.kv_start > 0) {
        if (spec.kv_start % block_size || n_stage < stage_span || n_stage > INT32_MAX / block_size - n_blocks)
            return kn_fail(err, KN_ERR_INVALID_ARG, "kv pool: --kv-start %d needs a multiple of %d and staging blocks",
                           spec.kv_start, block_size);
        if (!be->vt->kv_convert)
            return kn_fail(err, KN_ERR_UNSUPPORTED, "--kv-start: the %s backend cannot convert KV caches yet (use the "
                           "cpu backend, or convert on write without --kv-start)", be->vt->name);
    }
    kn_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory");
    p->be = be;
    p->n_layers = n_layers;
    p->n_kv_heads = n_layers ? pp->n_kv_heads[0] : 0, p->head_dim = n_layers ? pp->head_dim[0] : 0;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->header = (kn_kv_header){.magic = KN_KV_MAGIC, .version = KN_KV_VERSION, .spec = spec, .n_layers = model_layers,
                               .block_size = block_size};
    p->layers = calloc((size_t)(n_layers ? n_layers : 1), sizeof *p->layers);
    p->tables = calloc((size_t)(n_layers ? n_layers : 1), sizeof *p->tables);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->refcount = calloc((size_t)(n_blocks + n_stage), sizeof *p->refcount);
    p->n_stage_blocks = n_stage;
    if (n_stage) {
        p->stage_free_list = malloc((size_t)n_stage * sizeof *p->stage_free_list);
        p->conv_host = malloc(2 * (size_t)spec.kv_start * sizeof *p->conv_host);
        p->conv_dev = kn_be_alloc(be, 2 * (size_t)spec.kv_start * sizeof *p->conv_dev);
        if (!p->stage_free_list || !p->conv_host || !p->conv_dev) goto oom_early;
    }
    struct tab_cache *tc = calloc(1, sizeof *tc);
    if (!p->layers || !p->tables || !p->free_list || !p->refcount || !tc) goto oom;
    for (int l = 0; l < n_layers; l++) {
        kn_kv_layer *L = &p->layers[l];
        L->block_size = block_size, L->n_kv_heads = pp->n_kv_heads[l], L->head_dim = pp->head_dim[l];
        L->n_blocks = n_blocks;
        kn_kv_spec_layer(&spec, pp->layer_ids ? pp->layer_ids[l] : l, model_layers, &L->k_fmt, &L->v_fmt);
        const size_t slots = (size_t)n_blocks * (size_t)block_size * (size_t)L->n_kv_heads;
        L->k = kn_be_alloc(be, slots * (size_t)kn_kv_row_bytes(L->k_fmt, L->head_dim));
        L->v = kn_be_alloc(be, slots * (size_t)kn_kv_row_bytes(L->v_fmt, L->head_dim));
        if (!L->k || !L->v) goto oom;
        if (n_stage) { /* staging rows: bf16 (the boundary format), never rotated */
            const size_t ss = (size_t)n_stage * (size_t)block_size * (size_t)L->n_kv_heads;
            L->s_fmt = spec.boundary_fmt;
            L->n_stage_blocks = n_stage;
            L->sk = kn_be_alloc(be, ss * (size_t)kn_kv_row_bytes(L->s_fmt, L->head_dim));
            L->sv = kn_be_alloc(be, ss * (size_t)kn_kv_row_bytes(L->s_fmt, L->head_dim));
            if (!L->sk || !L->sv) goto oom;
        }
        if ((rc = layer_tables(p, l, &spec, tc, err))) {
            free(tc);
            kn_kv_pool_destroy(p);
            return rc;
        }
    }
    free(tc);
    /* pop order 0, 1, 2, ...: sequences get ascending blocks */
    for (int64_t i = 0; i < n_blocks; i++) p->free_list[i] = (int32_t)(n_blocks - 1 - i);
    p->n_free = n_blocks;
    for (int64_t i = 0; i < n_stage; i++) p->stage_free_list[i] = (int32_t)(n_blocks + n_stage - 1 - i);
    p->n_stage_free = n_stage;
    *out = p;
    return KN_OK;
oom_early:
    tc = NULL;
oom:
    free(tc);
    kn_kv_pool_destroy(p);
    return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory for %lld blocks of %d tokens", (long long)n_blocks,
                   block_size);
}

kn_code kn_kv_pool_create_ex(kn_backend *be, const kn_kv_pool_params *pp, kn_kv_pool **out, kn_error *err) {
    return pool_create(be, pp, pp->block_size > 0 && pp->spec ? pp->spec->kv_start / pp->block_size : 0, out, err);
}

kn_code kn_kv_pool_create(kn_backend *be, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int64_t n_blocks, kn_kv_pool **out, kn_error *err) {
    *out = NULL;
    if (n_layers < 0 || n_layers > 4096 || n_kv_heads <= 0 || head_dim <= 0)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv pool: invalid geometry");
    int *geo = malloc((2 * (size_t)n_layers + 1) * sizeof *geo); /* n_layers 0: bookkeeping only */
    if (!geo) return kn_fail(err, KN_ERR_NOMEM, "kv pool: out of memory");
    for (int l = 0; l < n_layers; l++) geo[l] = n_kv_heads, geo[n_layers + l] = head_dim;
    kn_kv_pool_params pp = {.n_layers = n_layers, .block_size = block_size, .n_blocks = n_blocks,
                            .n_kv_heads = geo, .head_dim = geo + n_layers};
    kn_code rc = kn_kv_pool_create_ex(be, &pp, out, err);
    free(geo);
    return rc;
}

void kn_kv_pool_destroy(kn_kv_pool *p) {
    if (!p) return;
    if (p->layers)
        for (int l = 0; l < p->n_layers; l++) {
            kn_be_free(p->be, p->layers[l].k);
            kn_be_free(p->be, p->layers[l].v);
            kn_be_free(p->be, p->layers[l].sk);
            kn_be_free(p->be, p->layers[l].sv);
            if (p->tables) kn_be_free(p->be, p->tables[l]);
        }
    free(p->tables);
    free(p->stage_free_list);
    free(p->conv_host);
    kn_be_free(p->be, p->conv_dev);
    free(p->layers);
    free(p->free_list);
    free(p->refcount);
    kn_kv_pool_destroy(p->ring);
    free(p);
}

static int grow(int32_t **arr, int *cap, int need) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    int32_t *nb = realloc(*arr, (size_t)c * sizeof *nb);
    if (!nb) return 0;
    *arr = nb, *cap = c;
    return 1;
}

kn_code kn_kv_pool_add_ring_ex(kn_kv_pool *p, const kn_kv_pool_params *pp, int ring_blocks, kn_error *err) {
    if (p->ring || pp->n_layers <= 0 || pp->block_size != p->block_size || ring_blocks <= 0 || pp->n_blocks < ring_blocks)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv ring: invalid geometry");
    /* delayed conversion: both pools stage the same sequences up to the same
     * kv_start; ring entry i is first used by positions [i*bs, (i+1)*bs), so
     * it is a staging block while i < kv_start / bs (kn_kv_seq_reserve) */
    const int start = p->header.spec.kv_start, ring_start = pp->spec ? pp->spec->kv_start : 0;
    if (start != ring_start)
        return kn_fail(err, KN_ERR_INVALID_ARG, "kv ring: --kv-start %d differs from the main pool's %d", ring_start, start);
    const int64_t span = start > 0 ? (start / p->block_size < ring_blocks ? start / p->block_size : ring_blocks) : 0;
    kn_code rc = pool_create(p->be, pp, span, &p->ring, err);
    if (!rc) p->ring_blocks = ring_blocks;
    return rc;
}

kn_code kn_kv_pool_add_ring(kn_kv_pool *p, int n_layers, int n_kv_heads, int head_dim, int ring_blocks,
                            int64_t n_blocks, kn_error *err) {
    if (n_layers <= 0 || n_layers > 4096) return kn_fail(err, KN_ERR_INVALID_ARG, "kv ring: invalid geometry");
    int *geo = malloc(2 * (size_t)n_layers * sizeof *geo);
    if (!geo) return kn_fail(err, KN_ERR_NOMEM, "kv ring: out of memory");
    for (int l = 0; l < n_layers; l++) geo[l] = n_kv_heads, geo[n_layers + l] = head_dim;
    kn_kv_pool_params pp = {.n_layers = n_layers, .block_size = p->block_size, .n_blocks = n_blocks,
                            .n_kv_heads = geo, .head_dim = geo + n_layers};
    kn_code rc = kn_kv_pool_add_ring_ex(p, &pp, ring_blocks, err);
    free(geo);
    return rc;
}

void kn_kv_seq_ring_table(const kn_kv_pool *p, const kn_kv_seq *s, int32_t *row) {
    for (int i = 0; i < s->n_blocks; i++) row[i] = s->ring[i % p->ring_blocks];
}

/* K+V bytes of one position in this pool's own layers (its ring excluded):
 * row bytes of each layer's formats (KV_FORMATS.md memory formula) */
static int64_t own_bytes_per_token(const kn_kv_pool *p) {
    int64_t b = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const kn_kv_layer *L = &p->layers[l];
        b += (int64_t)L->n_kv_heads * (kn_kv_row_bytes(L->k_fmt, L->head_dim) + kn_kv_row_bytes(L->v_fmt, L->head_dim));
    }
    return b;
}

int64_t kn_kv_seq_bytes(const kn_kv_pool *p, int64_t n_tokens) {
    int64_t b = own_bytes_per_token(p) * n_tokens;
    if (p->ring) {
        int64_t cap = (int64_t)p->ring_blocks * p->block_size;
        b += kn_kv_bytes_per_token(p->ring) * (n_tokens < cap ? n_tokens : cap);
    }
    return b;
}

kn_code kn_kv_seq_reserve(kn_kv_pool *p, kn_kv_seq *s, int n_positions, kn_error *err) {
    int need = (n_positions + p->block_size - 1) / p->block_size;
    if (need <= s->n_blocks) return KN_OK;
    /* staged sequences take a bf16 block plus its future compressed block for
     * every block below kv_start */
    const int stage_to = kn_kv_seq_staged(p, s) ? p->header.spec.kv_start / p->block_size : 0;
    const int n_staged = (need < stage_to ? need : stage_to) - (s->n_blocks < stage_to ? s->n_blocks : stage_to);
    const int new_staged = n_staged > 0 ? n_staged : 0;
    if (need - s->n_blocks > p->n_free)
        return kn_fail(err, KN_ERR_NOMEM, "kv cache full: %d more blocks needed, %lld free", need - s->n_blocks,
                       (long long)p->n_free);
    if (new_staged > p->n_stage_free)
        return kn_fail(err, KN_ERR_NOMEM, "kv staging area full (--kv-start): %d more blocks needed, %lld free",
                       new_staged, (long long)p->n_stage_free);
    const int ring_need = p->ring ? (need < p->ring_blocks ? need : p->ring_blocks) : 0;
    /* ring entries [n_ring, ring_need) below stage_to stage too, each with its compressed block */
    const int ring_staged = ring_need > s->n_ring && stage_to > s->n_ring
                                ? (ring_need < stage_to ? ring_need : stage_to) - s->n_ring : 0;
    if (ring_need > s->n_ring) {
        if (ring_need - s->n_ring > p->ring->n_free) /* a staged entry's compressed block is its shadow */
            return kn_fail(err, KN_ERR_NOMEM, "kv cache full: %d more sliding-window blocks needed, %lld free",
                           ring_need - s->n_ring, (long long)p->ring->n_free);
        if (ring_staged > p->ring->n_stage_free)
            return kn_fail(err, KN_ERR_NOMEM, "kv staging area full (--kv-start): %d more sliding-window blocks "
                           "needed, %lld free", ring_staged, (long long)p->ring->n_stage_free);
        if (!s->ring && !(s->ring = malloc((size_t)p->ring_blocks * sizeof *s->ring)))
            return kn_fail(err, KN_ERR_NOMEM, "kv cache: out of memory for the ring table");
        if (ring_staged && !s->ring_shadow && !(s->ring_shadow = malloc((size_t)p->ring_blocks * sizeof *s->ring_shadow)))
            return kn_fail(err, KN_ERR_NOMEM, "kv cache: out of memory for the ring table");
    }
    int shadow_cap = s->n_shadow; /* the shadow array is sized exactly by n_shadow growth below */
    if (!grow(&s->blocks, &s->cap, need) || (new_staged && !grow(&s->shadow, &shadow_cap, s->n_blocks + new_staged + 8)))
        return kn_fail(err, KN_ERR_NOMEM, "kv cache: out of memory for block table");
    while (s->n_blocks < need) {
        int32_t b = p->free_list[--p->n_free];
        p->refcount[b] = 1;
        if (s->n_blocks < stage_to) { /* a staging block now, b once converted */
            int32_t sb = p->stage_free_list[--p->n_stage_free];
            p->refcount[sb] = 1;
            s->shadow[s->n_shadow++] = b;
            b = sb;
        }
        s->blocks[s->n_blocks++] = b;
    }
    while (s->n_ring < ring_need) {
        kn_kv_pool *r = p->ring;
        int32_t b = r->free_list[--r->n_free];
        r->refcount[b] = 1;
        if (s->n_ring < stage_to) { /* staging, as the main pool's blocks below kv_start */
            int32_t sb = r->stage_free_list[--r->n_stage_free];
            r->refcount[sb] = 1;
            s->ring_shadow[s->n_ring_shadow++] = b;
            b = sb;
        }
        s->ring[s->n_ring++] = b;
    }
    return KN_OK;
}

void kn_kv_block_unref(kn_kv_pool *p, int32_t b) {
    if (!p->refcount[b] || --p->refcount[b]) return;
    if (b >= p->n_blocks) p->stage_free_list[p->n_stage_free++] = b;
    else p->free_list[p->n_free++] = b;
}

void kn_kv_seq_release(kn_kv_pool *p, kn_kv_seq *s) {
    for (int i = s->n_ring - 1; i >= 0 && p->ring; i--) kn_kv_block_unref(p->ring, s->ring[i]);
    for (int i = s->n_ring_shadow - 1; i >= 0 && p->ring; i--) kn_kv_block_unref(p->ring, s->ring_shadow[i]);
    free(s->ring);
    free(s->ring_shadow);
    for (int i = s->n_blocks - 1; i >= 0; i--) kn_kv_block_unref(p, s->blocks[i]);
    for (int i = s->n_shadow - 1; i >= 0; i--) kn_kv_block_unref(p, s->shadow[i]);
    free(s->blocks);
    free(s->shadow);
    memset(s, 0, sizeof *s);
}

/* Re-encode the staging blocks among blocks[0, n) of pool p into their
 * shadows (every layer of p, one at a time) and put the shadows in their
 * place; a block already compressed (a shared prefix block) stays and its
 * unused shadow is returned. */
static void convert_blocks(kn_kv_pool *p, int32_t *blocks, const int32_t *shadow, int n_blk) {
    const int start = p->header.spec.kv_start, bs = p->block_size;
    int n = 0;
    for (int i = 0; i < n_blk; i++) {
        const int32_t b = blocks[i];
        if (b < p->n_blocks) continue;
        for (int o = 0; o < bs; o++) /* at most kv_start slots: staged blocks lie below kv_start */
            p->conv_host[n] = (int32_t)((b - p->n_blocks) * bs + o), p->conv_host[start + n] = shadow[i] * bs + o, n++;
    }
    if (n) {
        kn_be_upload(p->be, p->conv_dev, p->conv_host, 2 * (size_t)start * sizeof(int32_t));
        for (int l = 0; l < p->n_layers; l++) /* one layer at a time */
            p->be->vt->kv_convert(p->be, &p->layers[l], p->conv_dev, p->conv_dev + start, n);
        kn_be_sync(p->be); /* the staging rows are read before their blocks go back */
    }
    for (int i = 0; i < n_blk; i++) {
        const int32_t b = blocks[i];
        if (b >= p->n_blocks) blocks[i] = shadow[i], kn_kv_block_unref(p, b);
        else kn_kv_block_unref(p, shadow[i]);
    }
}

kn_code kn_kv_seq_convert(kn_kv_pool *p, kn_kv_seq *s, kn_error *err) {
    if (!kn_kv_seq_staged(p, s)) return KN_OK;
    const int start = p->header.spec.kv_start;
    if (s->n_tokens < start)
        return kn_fail(err, KN_ERR_INTERNAL, "kv convert: the sequence holds %d of the %d tokens", s->n_tokens, start);
    convert_blocks(p, s->blocks, s->shadow, s->n_shadow < s->n_blocks ? s->n_shadow : s->n_blocks);
    s->n_shadow = 0;
    if (p->ring) /* the ring's staged entries (the first ones) hold the last positions below kv_start */
        convert_blocks(p->ring, s->ring, s->ring_shadow, s->n_ring_shadow);
    s->n_ring_shadow = 0;
    s->converted_at = start;
    return KN_OK;
}

int64_t kn_kv_bytes_per_token(const kn_kv_pool *p) {
    return own_bytes_per_token(p) + (p->ring ? own_bytes_per_token(p->ring) : 0);
}

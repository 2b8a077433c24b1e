/* test_kv.c — paged KV pool: block accounting, slot mapping, exhaustion
 * leaves state unchanged, release returns every block; a sliding-window
 * ring beside the pool, with and without delayed conversion. */
#include <math.h>
#include <string.h>

#include "kv/kv_paged.h"
#include "test_util.h"

int main(void) {
    kn_backend *be;
    kn_error err = {0};
    if (kn_backend_create("cpu", 1, &be, &err)) return 1;
    kn_kv_pool *p;
    CHECK(kn_kv_pool_create(be, 2, 2, 8, 16, 10, &p, &err) == KN_OK, "create: %s", err.msg);
    kn_kv_seq a = {0}, b = {0};
    CHECK(kn_kv_seq_reserve(p, &a, 1, &err) == KN_OK && a.n_blocks == 1, "one position needs one block");
    CHECK(kn_kv_seq_reserve(p, &a, 16, &err) == KN_OK && a.n_blocks == 1, "16 positions fit one block");
    CHECK(kn_kv_seq_reserve(p, &a, 17, &err) == KN_OK && a.n_blocks == 2, "17 positions need two blocks");
    CHECK(kn_kv_seq_reserve(p, &b, 100, &err) == KN_OK && b.n_blocks == 7, "100 positions need 7 blocks");
    CHECK(p->n_free == 1, "free count %lld", (long long)p->n_free);
    /* slots are distinct across sequences and positions */
    int seen[160] = {0}, dup = 0;
    for (int i = 0; i < 32; i++) dup += seen[kn_kv_seq_slot(p, &a, i)]++;
    for (int i = 0; i < 100; i++) dup += seen[kn_kv_seq_slot(p, &b, i)]++;
    CHECK(dup == 0, "slots overlap");
    CHECK(kn_kv_seq_slot(p, &a, 17) == a.blocks[1] * 16 + 1, "slot mapping");
    /* exhaustion: error, nothing allocated */
    kn_kv_seq c = {0};
    CHECK(kn_kv_seq_reserve(p, &c, 33, &err) == KN_ERR_NOMEM && c.n_blocks == 0 && p->n_free == 1,
          "exhaustion must fail cleanly");
    kn_kv_seq_release(p, &b);
    CHECK(p->n_free == 8, "release returns blocks (free %lld)", (long long)p->n_free);
    kn_kv_seq_release(p, &b); /* twice is harmless */
    CHECK(p->n_free == 8, "double release");
    CHECK(kn_kv_seq_reserve(p, &c, 33, &err) == KN_OK, "reuse after release");
    kn_kv_seq_release(p, &a);
    kn_kv_seq_release(p, &c);
    CHECK(p->n_free == 10, "all blocks back");
    CHECK(kn_kv_bytes_per_token(p) == 2 * 2 * 2 * 8 * 4, "bytes per token");
    kn_kv_pool_destroy(p);

    /* sliding-window ring: 1 main layer, 1 ring layer of 3 blocks per sequence, 5 ring blocks in all */
    CHECK(kn_kv_pool_create(be, 1, 1, 4, 16, 20, &p, &err) == KN_OK, "create: %s", err.msg);
    CHECK(kn_kv_pool_add_ring(p, 1, 1, 4, 3, 5, &err) == KN_OK, "add ring: %s", err.msg);
    CHECK(kn_kv_pool_add_ring(p, 1, 1, 4, 3, 5, &err) == KN_ERR_INVALID_ARG, "a second ring is refused");
    kn_kv_seq r1 = {0}, r2 = {0};
    CHECK(kn_kv_seq_reserve(p, &r1, 20, &err) == KN_OK && r1.n_blocks == 2 && r1.n_ring == 2, "short: ring = blocks");
    CHECK(kn_kv_seq_reserve(p, &r1, 100, &err) == KN_OK && r1.n_blocks == 7 && r1.n_ring == 3, "long: ring capped");
    CHECK(p->ring->n_free == 2, "ring free %lld", (long long)p->ring->n_free);
    /* position p and p + 3*16 share a ring slot; positions within 48 of each other never do */
    CHECK(kn_kv_seq_ring_slot(p, &r1, 5) == kn_kv_seq_ring_slot(p, &r1, 53), "ring wraps every 48 positions");
    int rs[80] = {0}, rdup = 0;
    for (int i = 50; i < 98; i++) rdup += rs[kn_kv_seq_ring_slot(p, &r1, i)]++;
    CHECK(rdup == 0, "48 consecutive positions share a ring slot");
    int32_t row[8];
    kn_kv_seq_ring_table(p, &r1, row);
    CHECK(row[0] == r1.ring[0] && row[4] == r1.ring[1] && row[6] == r1.ring[0], "ring block table");
    /* ring short: error, nothing allocated in either pool */
    int64_t main_free = p->n_free;
    CHECK(kn_kv_seq_reserve(p, &r2, 60, &err) == KN_ERR_NOMEM && r2.n_blocks == 0 && r2.n_ring == 0 &&
              p->n_free == main_free && p->ring->n_free == 2,
          "ring exhaustion must fail cleanly");
    CHECK(kn_kv_seq_reserve(p, &r2, 30, &err) == KN_OK && r2.n_ring == 2 && p->ring->n_free == 0, "two fit");
    CHECK(kn_kv_seq_bytes(p, 1000) == 1000 * 2 * 4 * 4 + 48 * 2 * 4 * 4, "sequence bytes: ring capped at 48");
    kn_kv_seq_release(p, &r1), kn_kv_seq_release(p, &r2);
    CHECK(p->n_free == 20 && p->ring->n_free == 5, "all blocks back (main %lld, ring %lld)", (long long)p->n_free,
          (long long)p->ring->n_free);
    kn_kv_pool_destroy(p);
    /* delayed conversion (--kv-start 32) with a ring of 3 blocks per sequence: ring entries below
     * 32 / 16 = 2 stage (a staging block of the ring pool plus its compressed block), the third does not */
    kn_kv_spec ks;
    CHECK(kn_kv_spec_parse("q8", 0, &ks, &err) == KN_OK, "spec: %s", err.msg);
    ks.kv_start = 32;
    int hh[1] = {1}, hd[1] = {32};
    kn_kv_pool_params pp = {.n_layers = 1, .block_size = 16, .n_blocks = 20, .n_kv_heads = hh, .head_dim = hd,
                            .spec = &ks, .n_stage_blocks = 4};
    CHECK(kn_kv_pool_create_ex(be, &pp, &p, &err) == KN_OK, "staged pool: %s", err.msg);
    if (p) {
        CHECK(kn_kv_pool_add_ring(p, 1, 1, 32, 3, 6, &err) == KN_ERR_INVALID_ARG && !p->ring &&
                  strstr(err.msg, "--kv-start"),
              "a ring converting on write under a --kv-start pool is refused: %s", err.msg);
        kn_kv_pool_params rp = pp;
        rp.n_blocks = 6, rp.n_stage_blocks = 1;
        CHECK(kn_kv_pool_add_ring_ex(p, &rp, 3, &err) == KN_ERR_INVALID_ARG && !p->ring,
              "a ring with staging for less than one sequence is refused: %s", err.msg);
        rp.n_stage_blocks = 4;
        CHECK(kn_kv_pool_add_ring_ex(p, &rp, 3, &err) == KN_OK && p->ring, "staged ring: %s", err.msg);
    }
    if (p && p->ring) {
        kn_kv_pool *r = p->ring;
        kn_kv_seq s1 = {0}, s2 = {0}, s3 = {0};
        CHECK(kn_kv_seq_reserve(p, &s1, 100, &err) == KN_OK && s1.n_blocks == 7 && s1.n_ring == 3 &&
                  s1.n_ring_shadow == 2 && s1.ring[0] >= r->n_blocks && s1.ring[1] >= r->n_blocks &&
                  s1.ring[2] < r->n_blocks && r->n_free == 3 && r->n_stage_free == 2,
              "staged ring entries: %d of %d, ring free %lld, staging free %lld", s1.n_ring_shadow, s1.n_ring,
              (long long)r->n_free, (long long)r->n_stage_free);
        CHECK(kn_kv_seq_reserve(p, &s2, 20, &err) == KN_OK && s2.n_ring == 2 && s2.n_ring_shadow == 2 &&
                  r->n_free == 1 && r->n_stage_free == 0,
              "a short sequence stages its two ring entries");
        const int64_t free0 = p->n_free, stage_free = p->n_stage_free;
        CHECK(kn_kv_seq_reserve(p, &s3, 10, &err) == KN_ERR_NOMEM && s3.n_blocks == 0 && s3.n_ring == 0 &&
                  p->n_free == free0 && p->n_stage_free == stage_free && r->n_free == 1 && r->n_stage_free == 0,
              "ring staging exhaustion must fail cleanly: %s", err.msg);
        /* rows of positions 0..31 (ring: the first two entries) through the staging views, as the model
         * writes a staged sequence (slots rebased by the pools' block counts), then the conversion */
        float k[32], v[32];
        const kn_kv_layer mv = kn_kv_stage_view(&p->layers[0]), rv = kn_kv_stage_view(&r->layers[0]);
        for (int t = 0; t < 32; t++) {
            for (int d = 0; d < 32; d++) k[d] = 0.01f * (float)(t * 32 + d) - 5.0f, v[d] = -k[d];
            const int32_t ms = kn_kv_seq_slot(p, &s1, t) - (int32_t)p->n_blocks * 16;
            const int32_t rs2 = kn_kv_seq_ring_slot(p, &s1, t) - (int32_t)r->n_blocks * 16;
            CHECK(ms >= 0 && rs2 >= 0, "position %d of a staged sequence lies in staging blocks", t);
            if (ms >= 0 && rs2 >= 0) {
                be->vt->kv_write(be, &mv, k, v, 32, 1, &ms);
                be->vt->kv_write(be, &rv, k, v, 32, 1, &rs2);
            }
        }
        s1.n_tokens = 32;
        CHECK(kn_kv_seq_convert(p, &s1, &err) == KN_OK && s1.converted_at == 32 && s1.n_ring_shadow == 0 &&
                  s1.ring[0] < r->n_blocks && s1.ring[1] < r->n_blocks && r->n_stage_free == 2 && r->n_free == 1,
              "conversion moves the ring to its compressed blocks: %s", err.msg);
        double worst = 0;
        for (int t = 0; t < 32; t++) {
            const kn_kv_layer *L = &r->layers[0];
            const int64_t rb = kn_kv_row_bytes(L->k_fmt, 32);
            float got[32];
            kn_kv_aux none = {NULL, NULL, 1.0f};
            kn_kv_decode(L->k_fmt, (const uint8_t *)L->k + (int64_t)kn_kv_seq_ring_slot(p, &s1, t) * rb, 32, &none, got);
            for (int d = 0; d < 32; d++) {
                const double e = fabs((double)got[d] - (0.01 * (t * 32 + d) - 5.0));
                worst = e > worst ? e : worst;
            }
        }
        CHECK(worst < 0.05, "converted ring rows: worst |error| %.3g (q8 of bf16 rows; a neighbouring position is 0.32 away)", worst);
        kn_kv_seq_release(p, &s1), kn_kv_seq_release(p, &s2), kn_kv_seq_release(p, &s3);
        CHECK(p->n_free == 20 && p->n_stage_free == 4 && r->n_free == 6 && r->n_stage_free == 4,
              "all blocks back (main %lld + %lld staging, ring %lld + %lld staging)", (long long)p->n_free,
              (long long)p->n_stage_free, (long long)r->n_free, (long long)r->n_stage_free);
    }
    kn_kv_pool_destroy(p);
    /* all layers in the ring: the main pool only counts positions */
    CHECK(kn_kv_pool_create(be, 0, 1, 1, 16, 20, &p, &err) == KN_OK && kn_kv_bytes_per_token(p) == 0,
          "bookkeeping-only pool: %s", err.msg);
    kn_kv_pool_destroy(p);
    kn_backend_destroy(be);
    return kn_test_done("test_kv");
}

/* test_kv.c — paged KV pool: block accounting, slot mapping, exhaustion
 * leaves state unchanged, release returns every block. */
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
    /* delayed conversion (--kv-start) and a ring do not combine: refused, no ring built */
    kn_kv_spec ks;
    CHECK(kn_kv_spec_parse("q8", 0, &ks, &err) == KN_OK, "spec: %s", err.msg);
    ks.kv_start = 32;
    int hh[1] = {1}, hd[1] = {32};
    kn_kv_pool_params pp = {.n_layers = 1, .block_size = 16, .n_blocks = 20, .n_kv_heads = hh, .head_dim = hd,
                            .spec = &ks, .n_stage_blocks = 4};
    CHECK(kn_kv_pool_create_ex(be, &pp, &p, &err) == KN_OK, "staged pool: %s", err.msg);
    if (p) {
        CHECK(kn_kv_pool_add_ring(p, 1, 1, 32, 3, 5, &err) == KN_ERR_UNSUPPORTED && !p->ring &&
                  strstr(err.msg, "--kv-start"),
              "a ring on a --kv-start pool is refused: %s", err.msg);
        kn_kv_pool_destroy(p);
    }
    /* all layers in the ring: the main pool only counts positions */
    CHECK(kn_kv_pool_create(be, 0, 1, 1, 16, 20, &p, &err) == KN_OK && kn_kv_bytes_per_token(p) == 0,
          "bookkeeping-only pool: %s", err.msg);
    kn_kv_pool_destroy(p);
    kn_backend_destroy(be);
    return kn_test_done("test_kv");
}

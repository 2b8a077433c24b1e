/* test_kv.c — paged KV pool: block accounting, slot mapping, exhaustion
 * leaves state unchanged, release returns every block. */
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
    kn_backend_destroy(be);
    return kn_test_done("test_kv");
}

/* fuzz_config.c — libFuzzer target for config.json / generation_config.json
 * parsing (untrusted bytes from a downloaded checkpoint). The input is split
 * at its first NUL: config text before, generation config after (absent when
 * there is no NUL). An accepted config must satisfy the invariants the model
 * builder relies on. Run: make fuzz (bounded time). */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "io/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - text) : size;
    const char *gen = nul ? nul + 1 : NULL;
    size_t gen_len = nul ? size - len - 1 : 0;
    kn_model_config c;
    kn_error err;
    if (kn_config_parse(text, len, gen, gen_len, "fuzz", &c, &err) != KN_OK) return 0;
    assert(c.n_layers > 0 && c.n_layers <= KN_MAX_LAYERS);
    assert(c.n_heads % c.n_kv_heads == 0 && c.head_dim > 0 && c.head_dim <= 1024 && c.head_dim % 2 == 0);
    int rot = (int)(c.head_dim * c.rope.partial_rotary_factor);
    assert(rot > 0 && rot <= c.head_dim && rot % 2 == 0);
    assert(c.n_experts == 0 || (c.n_experts <= KN_MOE_MAX_EXPERTS && c.n_experts_per_tok >= 1 &&
                                c.n_experts_per_tok <= c.n_experts && c.moe_intermediate_size > 0));
    assert(c.attn_softcap >= 0 && c.final_softcap >= 0);
    return 0;
}

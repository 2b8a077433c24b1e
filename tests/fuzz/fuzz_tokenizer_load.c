/* fuzz_tokenizer_load.c — libFuzzer target for tokenizer.json loading
 * (untrusted bytes: a downloaded or hand-edited file). A document that loads
 * is used once: a fixed multilingual string is encoded and the ids decoded.
 * Seeds: tests/fuzz/tokenizers/*.json. Run: make fuzz (bounded time). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kn_tokenizer *t;
    kn_error err;
    if (kn_tokenizer_load_json((const char *)data, size, NULL, &t, &err) != KN_OK) return 0;
    static const char text[] = "Hello world, it's 12345!  \xe4\xb8\xad\xe6\x96\x87 <mask> [tool] word\n\t\xf0\x9f\x8d\x95";
    int32_t *ids;
    int n;
    if (kn_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n, &err) == KN_OK) {
        char *s;
        size_t len;
        if (kn_tokenizer_decode(t, ids, n, 0, &s, &len, &err) == KN_OK) free(s);
        free(ids);
    }
    kn_tokenizer_free(t);
    return 0;
}

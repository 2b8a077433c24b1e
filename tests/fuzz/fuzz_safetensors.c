/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser
 * (untrusted bytes). On success every tensor's bytes are read, so a bounds
 * bug surfaces under ASan. Run: make fuzz (bounded time). */
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kn_st_tensor *t;
    size_t n;
    kn_error err;
    if (kn_st_parse(data, size, &t, &n, &err) != KN_OK) return 0;
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < t[i].nbytes; j++) sum += ((const uint8_t *)t[i].data)[j];
    (void)sum;
    kn_st_tensors_free(t, n);
    return 0;
}

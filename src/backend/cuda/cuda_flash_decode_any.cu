/* cuda_flash_decode_any.cu — flash-decode instantiations for any format pair, decoded at run time (head_dim up to 512)
 * (cuda_flash_decode.cuh), a translation unit of their own so nvcc builds the
 * format families in parallel. */
#include "backend/cuda/cuda_flash_decode.cuh"

void kn_flash_decode_any(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    const int R = KVF_RUNTIME;
    if (ni <= 1) launch_gb<1, R, R>(be, a, gb, f);
    else if (ni <= 2) launch_gb<2, R, R>(be, a, gb, f);
    else if (ni <= 4) launch_gb<4, R, R>(be, a, gb, f);
    else if (ni <= 8) launch_gb<8, R, R>(be, a, gb, f);
    else launch_gb<16, R, R>(be, a, gb < 2 ? gb : 2, f); /* head_dim 512: registers allow 2 heads */
}

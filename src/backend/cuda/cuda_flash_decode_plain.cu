/* cuda_flash_decode_plain.cu — flash-decode instantiations for float32 and bf16 rows
 * (cuda_flash_decode.cuh), a translation unit of their own so nvcc builds the
 * format families in parallel. */
#include "backend/cuda/cuda_flash_decode.cuh"

int kn_flash_decode_plain(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    const int kf = a->kv->k_fmt, vf = a->kv->v_fmt;
    if (kf == KN_KVF_F32 && vf == KN_KVF_F32) launch_preset<KN_KVF_F32, KN_KVF_F32>(be, a, ni, gb, f);
    else if (kf == KN_KVF_BF16 && vf == KN_KVF_BF16) launch_preset<KN_KVF_BF16, KN_KVF_BF16>(be, a, ni, gb, f);
    else return 0;
    return 1;
}

/* cuda_flash_decode_quant.cu — flash-decode instantiations for the fp8 and affine-quantized presets (fp8, q8, q4)
 * (cuda_flash_decode.cuh), a translation unit of their own so nvcc builds the
 * format families in parallel. */
#include "backend/cuda/cuda_flash_decode.cuh"

int kn_flash_decode_quant(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    const int kf = a->kv->k_fmt, vf = a->kv->v_fmt;
    if (kf == KN_KVF_FP8 && vf == KN_KVF_FP8) launch_preset<KN_KVF_FP8, KN_KVF_FP8>(be, a, ni, gb, f);
    else if (kf == KN_KVF_Q8 && vf == KN_KVF_Q8) launch_preset<KN_KVF_Q8, KN_KVF_Q8>(be, a, ni, gb, f);
    else if (kf == KN_KVF_Q4 && vf == KN_KVF_Q4) launch_preset<KN_KVF_Q4, KN_KVF_Q4>(be, a, ni, gb, f);
    else return 0;
    return 1;
}

/* cuda_flash_decode_tq.cu — flash-decode instantiations for the TurboQuant presets (k8v3, tq4, k4v3)
 * (cuda_flash_decode.cuh), a translation unit of their own so nvcc builds the
 * format families in parallel. */
#include "backend/cuda/cuda_flash_decode.cuh"

int kn_flash_decode_tq(kn_backend *be, const kn_attention_args *a, int ni, int gb, flash_plan f) {
    const int kf = a->kv->k_fmt, vf = a->kv->v_fmt;
    if (kf == KN_KVF_Q8A && vf == KN_KVF_TQV3) launch_preset<KN_KVF_Q8A, KN_KVF_TQV3>(be, a, ni, gb, f);
    else if (kf == KN_KVF_TQ4 && vf == KN_KVF_TQ4) launch_preset<KN_KVF_TQ4, KN_KVF_TQ4>(be, a, ni, gb, f);
    else if (kf == KN_KVF_TQ4 && vf == KN_KVF_TQV3) launch_preset<KN_KVF_TQ4, KN_KVF_TQV3>(be, a, ni, gb, f);
    else return 0;
    return 1;
}

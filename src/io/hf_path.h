/* hf_path.h — resolve a MODEL argument: a directory in HF layout, or a repo id
 * ("org/name") found in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub,
 * or ~/.cache/huggingface/hub; snapshot named by refs/main). */
#ifndef KN_IO_HF_PATH_H
#define KN_IO_HF_PATH_H

#include <stddef.h>

#include "base/status.h"

kn_code kn_resolve_model_path(const char *arg, char *out, size_t out_len, kn_error *err);

#endif

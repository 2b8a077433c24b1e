/* logits_process.h — log-probabilities of a processed logits row (the
 * penalties and logit bias are edits of base/sampling.h, built by the
 * engine: repetition penalty as HF over prompt + output, OpenAI presence /
 * frequency penalties over output, logit_bias added). */
#ifndef KN_ENGINE_LOGITS_PROCESS_H
#define KN_ENGINE_LOGITS_PROCESS_H

#include <stdint.h>

#include "engine/engine.h"

/* ev->logprob = log softmax(row)[token]; the top n (<= KN_MAX_TOP_LOGPROBS)
 * alternatives by descending log-probability (ties by lower id). */
void kn_logits_logprobs(const float *row, int V, int32_t token, int top_n, kn_token_event *ev);

#endif

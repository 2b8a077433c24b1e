/* logits_process.h — per-row logits processing before sampling: repetition
 * penalty (HF: divide positive / multiply negative logits of every token seen
 * in prompt or output), OpenAI presence/frequency penalties (subtract
 * presence + frequency * count for tokens already generated), logit_bias
 * (added as is), and log-probabilities of the processed row. */
#ifndef KN_ENGINE_LOGITS_PROCESS_H
#define KN_ENGINE_LOGITS_PROCESS_H

#include <stdint.h>

#include "engine/engine.h"

/* counts[V]: times each token was generated (NULL when no presence/frequency
 * penalty); seen[V]: 1 for tokens in prompt or output (NULL when no
 * repetition penalty). */
void kn_logits_apply(float *row, int V, const kn_gen_params *p, const uint32_t *counts, const uint8_t *seen);

/* ev->logprob = log softmax(row)[token]; the top n (<= KN_MAX_TOP_LOGPROBS)
 * alternatives by descending log-probability (ties by lower id). */
void kn_logits_logprobs(const float *row, int V, int32_t token, int top_n, kn_token_event *ev);

#endif

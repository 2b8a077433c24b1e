/* gemma3n.h — the gemma3n text model's AltUp residual streams, Laurel
 * blocks and per-layer inputs (transformers 5.17 modeling_gemma3n.py,
 * Gemma3nTextModel); attention and the MLP come from the shared decoder. */
#ifndef KN_MODELS_GEMMA3N_H
#define KN_MODELS_GEMMA3N_H

#include "models/model.h"

/* Load the AltUp / Laurel weights (model-level and per layer) and the
 * scratch they need; the rest of each layer is loaded by llama.c. */
kn_code kn_gemma3n_load(kn_model *m, const kn_tensor_source *src, kn_error *err);
void kn_gemma3n_free(kn_model *m);
/* Embedding through the last layer and the stream merge: the final hidden
 * state (before the final norm) lands in m->x. */
void kn_gemma3n_forward(kn_model *m, const kn_batch *b);

#endif

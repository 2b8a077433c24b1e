/* chat_template.h — chat templates: the Jinja subset real Hugging Face chat
 * templates use, rendered with messages, tools and template kwargs the way
 * transformers' apply_chat_template does (trim_blocks, lstrip_blocks,
 * raise_exception, strftime_now, tojson with transformers' settings).
 *
 * A compiled kn_chat_template is immutable and thread-safe to render.
 * Rendering is bounded (output size, loop iterations, recursion depth), so a
 * hostile template gives an error, never a hang or a crash. */
#ifndef KN_CHAT_TEMPLATE_H
#define KN_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

#include "base/status.h"

typedef struct kn_chat_template kn_chat_template;

/* Compile template source (name is used in error messages). */
kn_code kn_chat_template_compile(const char *source, size_t len, const char *name, kn_chat_template **out,
                                 kn_error *err);

/* Load the model's template: DIR/chat_template.jinja when present, else
 * tokenizer_config.json's "chat_template" (a string, or a list of {name,
 * template} where "default" is chosen, or `variant` when non-NULL, e.g.
 * "tool_use"). Also reads bos_token/eos_token from tokenizer_config.json
 * (strings or AddedToken objects) to pass to the template. */
kn_code kn_chat_template_load(const char *dir, const char *variant, kn_chat_template **out, kn_error *err);
void kn_chat_template_free(kn_chat_template *t);

/* Render. messages: JSON array of message objects (borrowed). tools: JSON
 * array or NULL. kwargs: JSON object of extra template variables
 * (chat_template_kwargs, e.g. {"enable_thinking": false}) or NULL.
 * *out is malloc'd, NUL-terminated.
 * Errors: KN_ERR_INVALID_ARG when the template rejects the conversation via
 * raise_exception() (err->msg ends with the template's own message) or the
 * inputs are malformed; KN_ERR_FORMAT for any other template error, with
 * "NAME:LINE:" of the failing template line. */
kn_code kn_chat_template_render(const kn_chat_template *t, const json_t *messages, const json_t *tools,
                                int add_generation_prompt, const json_t *kwargs, char **out, size_t *len,
                                kn_error *err);

#endif

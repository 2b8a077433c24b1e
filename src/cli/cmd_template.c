/* cmd_template.c — `kiln template MODEL --messages F.json [--tools F.json]
 * [--no-generation-prompt] [--kwargs JSON] [--variant NAME]`: render the
 * model's chat template the way transformers' apply_chat_template(...,
 * tokenize=False) does and print the text to stdout exactly (no newline
 * added). MODEL needs only tokenizer_config.json or chat_template.jinja. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "io/hf_path.h"
#include "tokenizer/chat_template.h"

static json_t *load_json_file(const char *flag, const char *path, kn_error *err) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_DECODE_ANY, &je);
    if (!j) kn_fail(err, KN_ERR_FORMAT, "%s %s: line %d: %s", flag, path, je.line, je.text);
    return j;
}

int kn_cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages_path = NULL, *tools_path = NULL, *kwargs_text = NULL, *variant = NULL;
    int gen_prompt = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--messages") || !strcmp(a, "--tools") || !strcmp(a, "--kwargs") || !strcmp(a, "--variant")) {
            if (!has_val) return kn_cli_usage_error("%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--messages")) messages_path = v;
            else if (!strcmp(a, "--tools")) tools_path = v;
            else if (!strcmp(a, "--kwargs")) kwargs_text = v;
            else variant = v;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen_prompt = 0;
        } else if (a[0] == '-' && a[1]) {
            return kn_cli_usage_error("template: unknown option %s", a);
        } else if (!model) {
            model = a;
        } else {
            return kn_cli_usage_error("template: unexpected argument \"%s\"", a);
        }
    }
    if (!model) return kn_cli_usage_error("template: MODEL is required");
    if (!messages_path) return kn_cli_usage_error("template: --messages FILE.json is required");

    kn_error err = {0};
    char dir[4096];
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    kn_chat_template *t = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = 1;
    if (kn_resolve_model_path(model, dir, sizeof dir, &err)) goto fail;
    if (!(messages = load_json_file("--messages", messages_path, &err))) goto fail;
    if (!json_is_array(messages)) {
        kn_fail(&err, KN_ERR_FORMAT, "--messages %s: expected a JSON array of messages", messages_path);
        goto fail;
    }
    if (tools_path && !(tools = load_json_file("--tools", tools_path, &err))) goto fail;
    if (tools && !json_is_array(tools)) {
        kn_fail(&err, KN_ERR_FORMAT, "--tools %s: expected a JSON array of tools", tools_path);
        goto fail;
    }
    if (kwargs_text) {
        json_error_t je;
        kwargs = json_loads(kwargs_text, 0, &je);
        if (!json_is_object(kwargs)) {
            kn_fail(&err, KN_ERR_FORMAT, "--kwargs: expected a JSON object (%s)", kwargs ? "not an object" : je.text);
            goto fail;
        }
    }
    if (kn_chat_template_load(dir, variant, &t, &err)) goto fail;
    if (kn_chat_template_render(t, messages, tools, gen_prompt, kwargs, &text, &len, &err)) goto fail;
    if (fwrite(text, 1, len, stdout) != len || fflush(stdout)) {
        kn_fail(&err, KN_ERR_IO, "writing to stdout failed");
        goto fail;
    }
    rc = 0;
    goto done;
fail:
    kn_cli_error(&err);
done:
    free(text);
    kn_chat_template_free(t);
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return rc;
}

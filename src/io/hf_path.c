/* hf_path.c — see hf_path.h. */
#include "io/hf_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file_util.h"

static int hub_dir(char *out, size_t n) {
    const char *c = getenv("HF_HUB_CACHE");
    if (c && *c) return snprintf(out, n, "%s", c) < (int)n;
    c = getenv("HF_HOME");
    if (c && *c) return snprintf(out, n, "%s/hub", c) < (int)n;
    c = getenv("HOME");
    if (c && *c) return snprintf(out, n, "%s/.cache/huggingface/hub", c) < (int)n;
    return 0;
}

kn_code kn_resolve_model_path(const char *arg, char *out, size_t out_len, kn_error *err) {
    if (kn_is_dir(arg)) {
        if (snprintf(out, out_len, "%s", arg) >= (int)out_len) return kn_fail(err, KN_ERR_INVALID_ARG, "path too long");
        return KN_OK;
    }
    const char *slash = strchr(arg, '/');
    char hub[2048];
    if (slash && !strchr(slash + 1, '/') && slash != arg && slash[1] && !strstr(arg, "..") && hub_dir(hub, sizeof hub)) {
        char repo[1024], ref[4096], rev[128] = "";
        snprintf(repo, sizeof repo, "%.*s--%s", (int)(slash - arg), arg, slash + 1);
        snprintf(ref, sizeof ref, "%s/models--%s/refs/main", hub, repo);
        FILE *f = fopen(ref, "r");
        if (f) {
            if (!fgets(rev, sizeof rev, f)) rev[0] = 0;
            fclose(f);
            rev[strcspn(rev, "\r\n")] = 0;
        }
        if (rev[0] && !strchr(rev, '/')) {
            snprintf(out, out_len, "%s/models--%s/snapshots/%s", hub, repo, rev);
            if (kn_is_dir(out)) return KN_OK;
        }
        return kn_fail(err, KN_ERR_NOT_FOUND, "model \"%s\" is not a directory and not in the HF cache (%s)", arg, hub);
    }
    return kn_fail(err, KN_ERR_NOT_FOUND, "model directory \"%s\" does not exist", arg);
}

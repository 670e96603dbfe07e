/* model_file.c — see model_file.h. */
#include "model_file.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

const char *pt_model_path(void) {
    static char buf[4096];
    const char *p = getenv("PKV_MODEL");
    if (!p || !*p) {
        const char *cache = getenv("PKV_MODEL_CACHE"), *home = getenv("HOME");
        if (cache && *cache)
            snprintf(buf, sizeof buf, "%s/" MODEL_FILE, cache);
        else
            snprintf(buf, sizeof buf, "%s/.cache/pagedkv/models/" MODEL_FILE, home ? home : "/tmp");
        p = buf;
    }
    FILE *f = fopen(p, "rb");
    if (!f) cr_skip_test("model file %s is absent: run scripts/get-model.sh (scripts/test.sh "
                         "does) or set PKV_MODEL", p);
    fclose(f);
    return p;
}

/*
 * replay_main.c — main() of the corpus-replay build of a fuzz harness: runs
 * LLVMFuzzerTestOneInput once on every file named on the command line, or in a
 * directory named there (not recursive), in name order. This is how the meson
 * suite `fuzz-replay` runs the seed corpora and the regression inputs with gcc,
 * clang and ASan+UBSan, without libFuzzer. Exit 0 when every input ran; a failed
 * harness check or a sanitizer report aborts.
 */
#include "fuzz_common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static size_t run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(2);
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 1;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    size_t total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) continue; /* an optional directory that does not exist */
        if (!S_ISDIR(st.st_mode)) {
            total += run_file(argv[i]);
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) continue;
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                names = realloc(names, cap * sizeof *names);
                if (!names) abort();
            }
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
            total += run_file(path);
            free(names[k]);
        }
        free(names);
    }
    printf("%s: %zu inputs replayed\n", argv[0], total);
    if (total == 0) {
        fprintf(stderr, "no inputs found\n");
        return 1;
    }
    return 0;
}

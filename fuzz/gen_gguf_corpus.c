/*
 * gen_gguf_corpus.c — writes the seed inputs of fuzz_gguf into a directory: the
 * hand-built sample file of tests/gguf_build.c (every metadata type, tensors of
 * seven types) and tiny tokenizer files (256 byte tokens, merges, ChatML
 * specials and template), so the fuzzer starts from valid files and mutates.
 * scripts/fuzz.sh --regen-corpus runs it.
 *
 * usage: gen_gguf_corpus DIR
 */
#include "gguf_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static void put(const char *dir, const char *name, unsigned char *img, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(img, 1, len, f) != len || fclose(f)) {
        perror(path);
        exit(1);
    }
    free(img);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    mkdir(argv[1], 0755);
    static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r",
                                         "Ġw or", "Ġwor l", "Ġworl d", "Ġ Ġ", "a 1"};
    size_t len;
    unsigned char *img = gb_sample(NULL, &len);
    put(argv[1], "sample-v3.gguf", img, len);
    img = gb_sample(&(gb_knobs){.version = 2, .alignment = 64}, &len);
    put(argv[1], "sample-v2-align64.gguf", img, len);
    img = gb_tiny_tokenizer(merges, 11, "smollm", NULL, 1, &len);
    put(argv[1], "tokenizer-smollm.gguf", img, len);
    img = gb_tiny_tokenizer(merges, 4, "gpt2", NULL, 0, &len);
    put(argv[1], "tokenizer-gpt2.gguf", img, len);
    return 0;
}

/*
 * tierbench_model.h — pkv-tierbench's model mode (--model GGUF): the shared tier
 * with the reference model's real K/V (bench/tierbench_model.c).
 */
#ifndef PKV_TIERBENCH_MODEL_H
#define PKV_TIERBENCH_MODEL_H

#include "pagedkv.h"

#include <stdint.h>

typedef struct tbm_args {
    const char *nodes;       /* the Redis (cluster) seeds */
    const char *model;       /* the GGUF file */
    const char *prompt_file; /* the text whose tokens are the prompt */
    const char *base;        /* where the cache directories go */
    uint32_t blocks;         /* prompt length in 16-token blocks (capped by the text) */
    uint32_t runs;           /* imports per encoding, median reported */
    unsigned threads;        /* model threads */
    pkv_dtype dtype;         /* the caches' K/V type (f16 as pkv-demo, or f32, bf16) */
} tbm_args;

/* Run the model mode and print its report; 0, or 1 after a message on stderr. */
int tierbench_model(const tbm_args *a);

#endif

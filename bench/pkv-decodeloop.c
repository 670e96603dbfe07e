/*
 * pkv-decodeloop.c — the bare per-token decode loop, for profilers.
 *
 *   pkv-decodeloop DIR TOKENS [DURABILITY [PREFAULT [PAYLOAD [CAPACITY [STEP [FILL [BS [GEOM
 *                  [SEAL_THREADS [CKPT_BYTES]]]]]]]]]]
 *
 * Opens a fresh cache in DIR (which must not exist; it is left behind), geometry as
 * in pkv-bench (1 layer, 1 KV head, head_dim 8, f16, BS-token blocks (default 16;
 * a large BS such as 1024 leaves the per-token fast paths alone), CAPACITY
 * blocks, default 1048576; GEOM LxHxD sets layers, KV heads and head_dim instead,
 * e.g. 32x8x128 for a model's real block size, where the seal's payload checksum
 * dominates; SEAL_THREADS sets pkv_options.seal_threads; CKPT_BYTES sets
 * pkv_options.checkpoint_bytes, e.g. 1099511627776 to keep automatic checkpoints
 * out of a comparison), DURABILITY 0 group / 1
 * none / 2 always, PREFAULT 1:
 * PKV_OPEN_PREFAULT, then decodes TOKENS tokens on one sequence: per token
 * pkv_seq_append(1) + (PAYLOAD 1: write its K and V rows of layer 0, head 0; PAYLOAD
 * 2: of every layer and head, as a model does) + pkv_seq_commit(1), or
 * with STEP 1 one pkv_seq_commit_append(1, 1) per token, with STEP 2 one
 * pkv_seq_step_batch call per step of 64 sequences (TOKENS in all). FILL 1 first fills the
 * whole cache with cached blocks (one sequence prefilled and closed), so every block
 * the loop takes is an eviction, as on a cache in service. A pkv_sync before the
 * loop writes back what the fill left in flight. Prints wall-clock and
 * calling-thread CPU nanoseconds per token. Under valgrind --tool=callgrind
 * --instr-atstart=no only the loop is counted (when valgrind/callgrind.h exists).
 * Built with -DPKV_DECODELOOP_NO_STEP it runs against libraries without
 * pkv_seq_commit_append (before/after comparisons).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pagedkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

static uint64_t ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static unsigned long long arg(int argc, char **argv, int i, unsigned long long dflt) {
    return argc > i ? strtoull(argv[i], NULL, 10) : dflt;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR TOKENS [DURABILITY [PREFAULT [PAYLOAD [CAPACITY "
                        "[STEP [FILL [BS [LxHxD [SEAL_THREADS [CKPT_BYTES]]]]]]]]]]\n", argv[0]);
        return 2;
    }
    uint64_t ntok = arg(argc, argv, 2, 0);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = 8;
    o.dtype = PKV_F16;
    o.block_size = (uint32_t)arg(argc, argv, 9, 16);
    if (argc > 10 && sscanf(argv[10], "%ux%ux%u", &o.num_layers, &o.num_kv_heads,
                            &o.head_dim) != 3) {
        fprintf(stderr, "GEOM must be LAYERSxHEADSxHEAD_DIM, e.g. 32x8x128\n");
        return 2;
    }
    o.seal_threads = (uint32_t)arg(argc, argv, 11, 0);
    o.checkpoint_bytes = arg(argc, argv, 12, 0);
    o.durability = (pkv_durability)arg(argc, argv, 3, 0);
    if (arg(argc, argv, 4, 0)) o.flags |= PKV_OPEN_PREFAULT;
    int payload = (int)arg(argc, argv, 5, 0);
    o.capacity = arg(argc, argv, 6, 1u << 20);
    int step = (int)arg(argc, argv, 7, 0);
    o.model_id = "pkv-decodeloop/synthetic";
    pkv_cache *c;
    int rc = pkv_open(argv[1], &o, &c);
    if (rc || (rc = pkv_seq_open(c, 1, 0, NULL, 0, NULL))) {
        fprintf(stderr, "open: %s: %s\n", pkv_strerror(rc), pkv_last_error());
        return 1;
    }
    uint32_t x = 12345;
    if (arg(argc, argv, 8, 0)) { /* fill: every block cached, none free */
        uint32_t buf[512];
        pkv_slot sl[512];
        uint64_t left = o.capacity * o.block_size;
        rc = pkv_seq_open(c, 2, 0, NULL, 0, NULL);
        while (!rc && left) {
            size_t k = left < 512 ? (size_t)left : 512;
            for (size_t i = 0; i < k; i++) buf[i] = (x = x * 1103515245u + 12345u) >> 8;
            if (!(rc = pkv_seq_append(c, 2, buf, k, sl))) rc = pkv_seq_commit(c, 2, k);
            left -= k;
        }
        if (!rc) rc = pkv_seq_close(c, 2);
        if (rc) {
            fprintf(stderr, "fill: %s: %s\n", pkv_strerror(rc), pkv_last_error());
            return 1;
        }
    }
    enum { NB = 64 };
    pkv_step st[NB];
    for (uint64_t k = 0; step == 2 && k < NB && !rc; k++) {
        st[k].id = 100 + k;
        rc = pkv_seq_open(c, st[k].id, 0, NULL, 0, NULL);
    }
    if (!rc) rc = pkv_sync(c); /* nothing of the fill in flight during the loop */
    CALLGRIND_START_INSTRUMENTATION;
    uint64_t t0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint64_t i = 0; step == 2 && i < ntok / NB && !rc; i++) {
        for (int k = 0; k < NB; k++) {
            st[k].n_commit = i ? 1 : 0;
            st[k].token = (x = x * 1103515245u + 12345u) >> 8;
        }
        size_t done;
        rc = pkv_seq_step_batch(c, st, NB, &done);
    }
    if (step == 2) ntok = ntok / NB * NB;
    for (uint64_t i = 0; step != 2 && i < ntok && !rc; i++) {
        x = x * 1103515245u + 12345u;
        uint32_t tok = x >> 8;
        pkv_slot s;
#ifndef PKV_DECODELOOP_NO_STEP
        if (step) rc = pkv_seq_commit_append(c, 1, i ? 1 : 0, &tok, 1, &s);
        else
#endif
            rc = pkv_seq_append(c, 1, &tok, 1, &s);
        if (!rc && payload) /* 1: layer 0, head 0; 2: every layer and head */
            for (uint32_t l = 0; l < (payload == 2 ? o.num_layers : 1); l++)
                for (uint32_t h = 0; h < (payload == 2 ? o.num_kv_heads : 1); h++)
                    for (int k = 0; k < 2; k++) {
                        uint8_t *p = pkv_kv(c, s.block, l, (pkv_kind)k, h);
                        memset(p + (size_t)s.offset * o.head_dim * 2, (int)tok,
                               o.head_dim * 2u);
                    }
        if (!rc && !step) rc = pkv_seq_commit(c, 1, 1);
    }
    if (!rc && step == 1 && ntok) rc = pkv_seq_commit(c, 1, 1);
    uint64_t t1 = ns(CLOCK_MONOTONIC), c1 = ns(CLOCK_THREAD_CPUTIME_ID);
    CALLGRIND_STOP_INSTRUMENTATION;
    if (rc) {
        fprintf(stderr, "decode: %s: %s\n", pkv_strerror(rc), pkv_last_error());
        return 1;
    }
    printf("wall %.1f ns/token  cpu %.1f ns/token\n", (double)(t1 - t0) / (double)ntok,
           (double)(c1 - c0) / (double)ntok);
    pkv_close(c);
    return 0;
}

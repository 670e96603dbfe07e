/*
 * bench_util.h — small helpers shared by the single-file benchmarks
 * (pkv-ckptbench, pkv-reopenbench): a monotonic clock in ms, dying on a pagedkv
 * error with the program's name (BENCH_NAME, defined before the include), the
 * benchmarks' cache geometry, the removal of a flat cache directory, appending a sequence's tokens in chunks, and
 * the median of a few runs.
 */
#ifndef PKV_BENCH_UTIL_H
#define PKV_BENCH_UTIL_H

#include "pagedkv.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name, for messages) before including bench_util.h"
#endif

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline void die(const char *what, int rc) {
    fprintf(stderr, BENCH_NAME ": %s: %s (%s)\n", what, pkv_strerror(rc), pkv_last_error());
    exit(1);
}
#define OK(call)                                                                      \
    do {                                                                              \
        int rc_ = (call);                                                             \
        if (rc_) die(#call, rc_);                                                     \
    } while (0)

/* pkv-bench's geometry (1 layer, 1 KV head, head_dim 8, f16, 16-token blocks),
 * `cap` blocks (0: as stored), model id BENCH_NAME, and no automatic
 * checkpoint: only those the program asks for. */
static inline void bench_options(pkv_options *o, uint64_t cap) {
    pkv_options_init(o);
    o->num_layers = 1;
    o->num_kv_heads = 1;
    o->head_dim = 8;
    o->block_size = 16;
    o->dtype = PKV_F16;
    o->capacity = cap;
    o->model_id = BENCH_NAME;
    o->checkpoint_bytes = 1ull << 40;
}

/* Remove the files of a cache directory (it holds no subdirectory), then it. */
static inline void remove_cache_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* Append and commit n tokens (ids from *next) to sequence id, chunk (<= 4096) at a
 * time. */
static inline void feed(pkv_cache *c, uint64_t id, uint64_t n, uint32_t chunk, uint32_t *next) {
    static uint32_t t[4096];
    static pkv_slot s[4096];
    if (chunk > 4096) chunk = 4096;
    for (uint64_t done = 0; done < n;) {
        uint32_t k = n - done < chunk ? (uint32_t)(n - done) : chunk;
        for (uint32_t i = 0; i < k; i++) t[i] = (*next)++;
        OK(pkv_seq_append(c, id, t, k, s));
        OK(pkv_seq_commit(c, id, k));
        done += k;
    }
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif

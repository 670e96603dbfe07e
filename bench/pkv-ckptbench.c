/*
 * pkv-ckptbench.c — what a checkpoint costs on a large cache, delta or full.
 *
 *   pkv-ckptbench [--capacity N] [--rounds R] [--tokens T] [--full] [--dir DIR] [--keep]
 *   pkv-ckptbench [--tokens T] --reopen CACHE_DIR
 *
 * Opens a fresh cache (geometry of pkv-bench: 1 layer, 1 KV head, head_dim 8, f16,
 * 16-token blocks; N blocks, default 1048576; automatic checkpoints off), fills it
 * with cached blocks (prefilled sequences, closed), takes a checkpoint (always full:
 * the first of a new cache), then R rounds (default 8) of: decode T tokens (default
 * 160000, i.e. 10,000 new blocks, each by eviction) on a new sequence, close it,
 * pkv_sync, and time pkv_checkpoint: wall time, the process's CPU time during the
 * call (all threads), the file's size and kind. Then closes and times the reopen
 * (loading the chain), decodes T more tokens and times the first checkpoint of
 * that open (a delta since the open continues the chain; full with --full or
 * before 2026-12-01). --full opens with PKV_OPEN_FULL_CHECKPOINTS, so every
 * checkpoint is full: run both to compare. The cache directory is created under
 * DIR (default /tmp) and removed at exit (--keep: kept, and its path printed).
 * --reopen times a fresh process's pkv_open of such a kept directory (a restart),
 * then decodes T tokens and times that open's first checkpoint.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#define BENCH_NAME "pkv-ckptbench"
#include "bench_util.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BS 16u

static double cpu_ms(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

static char g_dir[4096];
static bool g_keep;

static void cleanup(void) {
    if (!g_dir[0] || g_keep) return;
    remove_cache_dir(g_dir);
    char *slash = strrchr(g_dir, '/');
    if (slash) { /* the mkdtemp directory above it */
        *slash = '\0';
        rmdir(g_dir);
    }
}

static uint64_t file_size(const char *pre, uint64_t lsn) {
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s%016llx", g_dir, pre, (unsigned long long)lsn);
    return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void options(pkv_options *o, uint64_t cap, bool full) {
    bench_options(o, cap);
    o->flags = full ? PKV_OPEN_FULL_CHECKPOINTS : 0;
}

static void print_reopen(pkv_cache *c, double ms) {
    pkv_recovery rec;
    OK(pkv_get_recovery(c, &rec));
    printf("reopen: %.1f ms (checkpoint load %.1f ms, %llu deltas applied, %llu records "
           "replayed)\n", ms, rec.ms_checkpoint, (unsigned long long)rec.checkpoint_deltas,
           (unsigned long long)rec.records_replayed);
}

/* Decode `tokens` new tokens on a new sequence `id`, close it, sync. */
static void decode_round(pkv_cache *c, uint64_t id, uint64_t tokens, uint32_t *next) {
    size_t hit;
    OK(pkv_seq_open(c, id, 0, next, 1, &hit));
    feed(c, id, tokens, 1, next);
    OK(pkv_seq_close(c, id));
    OK(pkv_sync(c));
}

/* Time one pkv_checkpoint of the cache in g_dir and print it, labelled `what`:
 * wall and process CPU ms, file MB. */
static void timed_checkpoint(pkv_cache *c, const char *what, double *wall, double *cpu,
                             double *mb) {
    pkv_stats s0, s1;
    OK(pkv_get_stats(c, &s0));
    double w0 = now_ms(), c0 = cpu_ms();
    OK(pkv_checkpoint(c));
    *wall = now_ms() - w0;
    *cpu = cpu_ms() - c0;
    OK(pkv_get_stats(c, &s1));
    bool delta = s1.checkpoint_deltas > s0.checkpoint_deltas;
    *mb = file_size(delta ? "delta-" : "ckpt-", s1.checkpoint_lsn) / 1e6;
    printf("%s checkpoint %-5s: %8.1f ms wall, %8.1f ms CPU (process), file %8.2f MB\n", what,
           delta ? "delta" : "full", *wall, *cpu, *mb);
    fflush(stdout);
}

/* A restart: open a kept directory in a fresh process, then decode `tokens`
 * tokens and time the first checkpoint of the open. */
static int reopen(const char *dir, uint64_t tokens) {
    pkv_options o;
    options(&o, 0, false);
    o.capacity = 0; /* the arena's */
    pkv_cache *c;
    double t0 = now_ms();
    OK(pkv_open(dir, &o, &c));
    print_reopen(c, now_ms() - t0);
    uint32_t next = 3000000000u; /* tokens no cached block holds */
    snprintf(g_dir, sizeof g_dir, "%s", dir); /* for file_size; not removed at exit */
    double w, cu, mb;
    decode_round(c, 1ull << 62, tokens, &next);
    timed_checkpoint(c, "after the reopen,", &w, &cu, &mb);
    pkv_close(c);
    return 0;
}

int main(int argc, char **argv) {
    uint64_t cap = 1048576, tokens = 160000;
    int rounds = 8;
    bool full = false;
    const char *base = "/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--capacity") && i + 1 < argc) cap = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--full")) full = true;
        else if (!strcmp(argv[i], "--keep")) g_keep = true;
        else if (!strcmp(argv[i], "--reopen") && i + 1 == argc - 1)
            return reopen(argv[i + 1], tokens);
        else {
            fprintf(stderr, "usage: pkv-ckptbench [--capacity N] [--rounds R] [--tokens T] "
                            "[--full] [--dir DIR] [--keep]\n"
                            "       pkv-ckptbench [--tokens T] --reopen CACHE_DIR\n");
            return 2;
        }
    }
    if (cap < 64 || cap > UINT32_MAX || rounds < 1 || rounds > 1000 || tokens == 0) {
        fprintf(stderr, "pkv-ckptbench: capacity 64..2^32-1, rounds 1..1000, tokens > 0\n");
        return 2;
    }
    snprintf(g_dir, sizeof g_dir, "%s/pkv-ckptbench-XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    strcat(g_dir, "/cache");
    atexit(cleanup);

    pkv_options o;
    options(&o, cap, full);
    pkv_cache *c;
    OK(pkv_open(g_dir, &o, &c));
    printf("pkv-ckptbench: capacity %llu blocks x %u tokens, %s checkpoints, %d rounds of "
           "%llu decoded tokens\n", (unsigned long long)cap, BS,
           full ? "full (PKV_OPEN_FULL_CHECKPOINTS)" : "delta", rounds,
           (unsigned long long)tokens);
    uint32_t next = 1;
    uint64_t id = 1, per_seq = 32768;
    double t0 = now_ms();
    for (uint64_t done = 0; done < cap * BS; done += per_seq, id++) {
        size_t hit;
        OK(pkv_seq_open(c, id, 0, &next, 1, &hit));
        feed(c, id, per_seq, 4096, &next);
        OK(pkv_seq_close(c, id));
    }
    OK(pkv_sync(c));
    printf("fill: %llu tokens in %.1f s\n", (unsigned long long)cap * BS, (now_ms() - t0) / 1e3);
    fflush(stdout);

    double *wall = calloc((size_t)rounds, sizeof *wall), *cpu = calloc((size_t)rounds, sizeof *cpu);
    double *mb = calloc((size_t)rounds, sizeof *mb);
    if (!wall || !cpu || !mb) return 1;
    double w, cu, sz;
    timed_checkpoint(c, "first", &w, &cu, &sz);
    for (int r = 0; r < rounds; r++) {
        decode_round(c, id++, tokens, &next);
        timed_checkpoint(c, "round", &wall[r], &cpu[r], &mb[r]);
    }
    printf("median of %d rounds: %.1f ms wall, %.1f ms CPU, %.2f MB per checkpoint\n", rounds,
           median(wall, rounds), median(cpu, rounds), median(mb, rounds));
    pkv_close(c);
    double o0 = now_ms();
    OK(pkv_open(g_dir, &o, &c));
    print_reopen(c, now_ms() - o0);
    decode_round(c, id, tokens, &next);
    timed_checkpoint(c, "after the reopen,", &w, &cu, &sz);
    pkv_close(c);
    if (g_keep) printf("kept: %s\n", g_dir);
    free(wall);
    free(cpu);
    free(mb);
    return 0;
}

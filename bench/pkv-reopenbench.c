/*
 * pkv-reopenbench.c — what a restart costs when live sequences hold long block
 * tables (long contexts, or many forks of one prompt).
 *
 *   pkv-reopenbench [--capacity N] [--seqs S] [--blocks L] [--forks] [--checkpoint]
 *                   [--runs R] [--dir DIR] [--keep]
 *
 * Opens a fresh cache (geometry of pkv-bench: 1 layer, 1 KV head, head_dim 8,
 * f16, 16-token blocks; N blocks, default 1048576; automatic checkpoints off)
 * and builds S live sequences (default 64) of L full blocks each (default
 * 16000, i.e. 256,000 tokens): distinct tokens, or with --forks one sequence of
 * L blocks and S-1 forks of it (S x L table entries over L blocks). The
 * sequences stay open, so recovery must rebuild every table. With --checkpoint
 * a checkpoint is taken before the close, so the reopens load the tables from
 * it instead of replaying the log. Then closes the cache and times R reopens (default 5): pkv_open's wall time and pkv_get_recovery's
 * split (checkpoint load, log replay, rebuild of tables/refcounts/index, payload
 * verification of held blocks), medians printed. pkv_check runs after the first
 * reopen. The cache directory is created under DIR (default /tmp) and removed
 * at exit (--keep: kept, and its path printed). Progress goes to stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#define BENCH_NAME "pkv-reopenbench"
#include "bench_util.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BS 16u
#define CHUNK 4096u /* tokens per append + commit while building */
#define MAX_RUNS 100

static char g_dir[4096];
static bool g_keep;

static void cleanup(void) {
    if (g_dir[0] && !g_keep) remove_cache_dir(g_dir);
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

static _Noreturn void usage(int code) {
    fprintf(code ? stderr : stdout,
            "usage: pkv-reopenbench [--capacity N] [--seqs S] [--blocks L] [--forks] [--checkpoint]\n"
            "                       [--runs R] [--dir DIR] [--keep]\n");
    exit(code);
}

int main(int argc, char **argv) {
    uint64_t cap = 1048576, seqs = 64, blocks = 16000, runs = 5;
    bool forks = false, ckpt = false;
    const char *base = "/tmp";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *num = !strcmp(a, "--capacity") ? &cap
                        : !strcmp(a, "--seqs")   ? &seqs
                        : !strcmp(a, "--blocks") ? &blocks
                        : !strcmp(a, "--runs")   ? &runs
                                                 : NULL;
        if (num) {
            if (i + 1 >= argc || !parse_u64(argv[i + 1], num)) {
                fprintf(stderr, "pkv-reopenbench: %s needs a number\n", a);
                usage(2);
            }
            i++;
        } else if (!strcmp(a, "--forks")) {
            forks = true;
        } else if (!strcmp(a, "--checkpoint")) {
            ckpt = true;
        } else if (!strcmp(a, "--keep")) {
            g_keep = true;
        } else if (!strcmp(a, "--dir") && i + 1 < argc) {
            base = argv[++i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(0);
        } else {
            fprintf(stderr, "pkv-reopenbench: unknown argument '%s'\n", a);
            usage(2);
        }
    }
    uint64_t distinct = forks ? blocks : seqs * blocks;
    if (!seqs || !blocks || !runs || runs > MAX_RUNS || blocks > UINT32_MAX / BS ||
        distinct > cap) {
        fprintf(stderr, "pkv-reopenbench: need seqs, blocks > 0, 1 <= runs <= %d, and the "
                        "%" PRIu64 " distinct blocks within --capacity %" PRIu64 "\n",
                MAX_RUNS, distinct, cap);
        return 2;
    }
    snprintf(g_dir, sizeof g_dir, "%s/pkv-reopenbench.XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        perror("pkv-reopenbench: mkdtemp");
        return 1;
    }
    atexit(cleanup);
    pkv_options o;
    bench_options(&o, cap);
    pkv_cache *c;
    OK(pkv_open(g_dir, &o, &c));

    double t0 = now_ms();
    uint32_t next = 1;
    for (uint64_t s = 0; s < seqs; s++) {
        uint64_t id = s + 1;
        if (forks && s > 0) {
            OK(pkv_seq_fork(c, 1, id));
        } else {
            OK(pkv_seq_open(c, id, 0, NULL, 0, NULL));
            feed(c, id, blocks * BS, CHUNK, &next);
        }
        if ((s + 1) % (seqs >= 4 ? seqs / 4 : 1) == 0)
            fprintf(stderr, "pkv-reopenbench: built %" PRIu64 " / %" PRIu64 " sequences (%.1f s)\n",
                    s + 1, seqs, (now_ms() - t0) / 1e3);
    }
    if (ckpt) OK(pkv_checkpoint(c));
    pkv_close(c);
    fprintf(stderr, "pkv-reopenbench: %" PRIu64 " sequences of %" PRIu64 " blocks (%s) built and "
                    "closed in %.1f s; timing %" PRIu64 " reopens\n",
            seqs, blocks, forks ? "forks of one" : "distinct", (now_ms() - t0) / 1e3, runs);

    double open_ms[MAX_RUNS], ck[MAX_RUNS], rp[MAX_RUNS], rb[MAX_RUNS], vf[MAX_RUNS];
    pkv_recovery rec;
    o.capacity = 0;
    for (uint64_t r = 0; r < runs; r++) {
        double a = now_ms();
        OK(pkv_open(g_dir, &o, &c));
        open_ms[r] = now_ms() - a;
        OK(pkv_get_recovery(c, &rec));
        if (rec.sequences != seqs || rec.sequences_cut || rec.blocks_dropped) {
            fprintf(stderr, "pkv-reopenbench: reopen %" PRIu64 " recovered %" PRIu64 " sequences "
                            "(%" PRIu64 " cut, %" PRIu64 " blocks dropped), expected %" PRIu64
                            " intact: %s\n", r + 1, rec.sequences, rec.sequences_cut,
                    rec.blocks_dropped, seqs, rec.note);
            return 1;
        }
        if (r == 0) {
            char why[512];
            OK(pkv_check(c, why, sizeof why));
        }
        ck[r] = rec.ms_checkpoint;
        rp[r] = rec.ms_replay;
        rb[r] = rec.ms_rebuild;
        vf[r] = rec.ms_verify;
        pkv_close(c);
        fprintf(stderr, "pkv-reopenbench: reopen %" PRIu64 ": %.1f ms\n", r + 1, open_ms[r]);
    }
    int n = (int)runs;
    printf("pkv-reopenbench: capacity %" PRIu64 ", %" PRIu64 " live sequences x %" PRIu64
           " blocks (%s; %" PRIu64 " table entries, %" PRIu64 " tokens each)\n",
           cap, seqs, blocks, forks ? "forks of one" : "distinct", seqs * blocks, blocks * BS);
    printf("  last reopen recovered from: checkpoint LSN %" PRIu64 ", %" PRIu64
           " log records replayed\n", rec.checkpoint_lsn, rec.records_replayed);
    printf("  pkv_open, median of %d: %.1f ms\n", n, median(open_ms, n));
    printf("    checkpoint %.1f ms, replay %.1f ms, rebuild %.1f ms, verify %.1f ms (medians)\n",
           median(ck, n), median(rp, n), median(rb, n), median(vf, n));
    if (g_keep) printf("  cache kept in %s\n", g_dir);
    return 0;
}

/*
 * pkv-pkvdbench — the cost of a metadata call through pkvd against the same call
 * on an embedded handle, in one run (docs/pkvd.md, docs/benchmarks.md).
 *
 * Usage: pkv-pkvdbench PKVD_BINARY SCRATCH_DIR [rounds]
 * Two caches of SmolLM2-135M's geometry (30 layers, 3 KV heads, head_dim 64, f16,
 * block 16, 4,096 blocks, group durability): one opened here, one served by a
 * pkvd started here. On each, 64 sequences of a 1,024-token prompt (64 blocks,
 * shared) decode; measured, alternating embedded and pkvd per round:
 *  - pkv_prefix_lookup of the 1,024-token prompt (63 cached blocks);
 *  - pkv_seq_step_batch of the 64 sequences (commit 1 + append 1 each).
 * K/V bytes are not written (a decode step's cost here is the metadata's).
 * Prints the median of each round's per-call mean, in microseconds.
 */
#include "pagedkv.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NSEQ 64
#define PROMPT 1024
#define CALLS 2000

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what, int rc) {
    fprintf(stderr, "pkv-pkvdbench: %s: %s (%s)\n", what, pkv_strerror(rc), pkv_last_error());
    exit(1);
}

static uint32_t prompt[PROMPT];

static void setup(pkv_cache *c) {
    pkv_slot *slots = malloc(PROMPT * sizeof *slots);
    for (uint64_t s = 0; s < NSEQ; s++) {
        size_t nc = 0;
        int rc = pkv_seq_open(c, s + 1, 0, prompt, PROMPT, &nc);
        if (rc) die("seq_open", rc);
        if ((rc = pkv_seq_append(c, s + 1, prompt + nc, PROMPT - nc, slots)) ||
            (rc = pkv_seq_commit(c, s + 1, PROMPT - nc)))
            die("prefill", rc);
        uint32_t t = 7;
        if ((rc = pkv_seq_append(c, s + 1, &t, 1, slots))) die("append", rc);
    }
    free(slots);
}

static double lookup_round(pkv_cache *c) {
    size_t nc = 0;
    double t0 = now_us();
    for (int i = 0; i < CALLS; i++) {
        int rc = pkv_prefix_lookup(c, 0, prompt, PROMPT, &nc);
        if (rc || nc != PROMPT - 16) die("lookup", rc ? rc : PKV_ECORRUPT);
    }
    return (now_us() - t0) / CALLS;
}

/* Decode steps; cutting the sequences back to the prompt (+ one pending token)
 * every 256 steps keeps them within the capacity (not timed). */
static double step_round(pkv_cache *c, int calls) {
    pkv_step st[NSEQ];
    double total = 0;
    for (int i = 0; i < calls; i++) {
        if (i % 256 == 0 && i) {
            for (uint64_t s = 0; s < NSEQ; s++) {
                uint32_t t = 7;
                pkv_slot sl;
                int rc = pkv_seq_truncate(c, s + 1, PROMPT);
                if (rc || (rc = pkv_seq_append(c, s + 1, &t, 1, &sl))) die("truncate", rc);
            }
        }
        for (int s = 0; s < NSEQ; s++)
            st[s] = (pkv_step){.id = (uint64_t)s + 1, .n_commit = 1, .token = (uint32_t)i};
        size_t done = 0;
        double t0 = now_us();
        int rc = pkv_seq_step_batch(c, st, NSEQ, &done);
        total += now_us() - t0;
        if (rc) die("step_batch", rc);
    }
    return total / calls;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: pkv-pkvdbench PKVD_BINARY SCRATCH_DIR [rounds]\n");
        return 2;
    }
    int rounds = argc > 3 ? atoi(argv[3]) : 7;
    if (rounds < 1 || rounds > 100) rounds = 7;
    for (int i = 0; i < PROMPT; i++) prompt[i] = 100 + (uint32_t)i * 13 % 40000;
    char emb[4096], srv[4096], sock[4096];
    snprintf(emb, sizeof emb, "%s/embedded", argv[2]);
    snprintf(srv, sizeof srv, "%s/served", argv[2]);
    snprintf(sock, sizeof sock, "%s/pkvd.sock", argv[2]);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = 30, o.num_kv_heads = 3, o.head_dim = 64, o.block_size = 16;
    o.dtype = PKV_F16, o.capacity = 4096, o.model_id = "pkvdbench";
    pkv_cache *e = NULL;
    int rc = pkv_open(emb, &o, &e);
    if (rc) die("pkv_open", rc);
    int p[2];
    if (pipe(p)) return 1;
    pid_t d = fork();
    if (d == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", p[1]);
        execl(argv[1], argv[1], "--dir", srv, "--socket", sock, "--ready-fd", fd, "--layers",
              "30", "--kv-heads", "3", "--head-dim", "64", "--block-size", "16", "--dtype",
              "f16", "--capacity", "4096", "--model-id", "pkvdbench", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char buf[8];
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    if (poll(&pf, 1, 30000) != 1 || read(p[0], buf, 6) != 6) {
        fprintf(stderr, "pkv-pkvdbench: pkvd did not start\n");
        return 1;
    }
    pkv_cache *r = NULL;
    if ((rc = pkv_connect(sock, &r))) die("pkv_connect", rc);
    setup(e);
    setup(r);
    double le[100], lr[100], se[100], sr[100];
    for (int k = 0; k < rounds; k++) { /* alternating, so drifts hit both */
        le[k] = lookup_round(e);
        lr[k] = lookup_round(r);
        se[k] = step_round(e, 512);
        sr[k] = step_round(r, 512);
    }
    qsort(le, rounds, sizeof *le, cmp);
    qsort(lr, rounds, sizeof *lr, cmp);
    qsort(se, rounds, sizeof *se, cmp);
    qsort(sr, rounds, sizeof *sr, cmp);
    int m = rounds / 2;
    printf("median of %d rounds, microseconds per call (embedded / pkvd / difference)\n",
           rounds);
    printf("prefix_lookup 1024 tokens   %8.2f %8.2f %8.2f\n", le[m], lr[m], lr[m] - le[m]);
    printf("step_batch 64 sequences     %8.2f %8.2f %8.2f\n", se[m], sr[m], sr[m] - se[m]);
    printf("  per sequence-step         %8.3f %8.3f\n", se[m] / NSEQ, sr[m] / NSEQ);
    pkv_close(r);
    pkv_close(e);
    kill(d, SIGTERM);
    waitpid(d, NULL, 0);
    return 0;
}

/*
 * pkv-pkvdbench — the cost of a metadata call through pkvd against the same call
 * on an embedded handle, in one run (docs/pkvd.md, docs/benchmarks.md).
 *
 * Usage: pkv-pkvdbench PKVD_BINARY SCRATCH_DIR [rounds [throughput_seconds]]
 * Two caches of SmolLM2-135M's geometry (30 layers, 3 KV heads, head_dim 64, f16,
 * block 16, 4,096 blocks, group durability): one opened here, one served by a
 * pkvd started here. On each, 64 sequences of a 1,024-token prompt (64 blocks,
 * shared) decode; after a warm-up of 1,024 steps on each (a fresh arena's first
 * touch of its pages costs about 8 times the CPU of later steps), measured,
 * alternating embedded and pkvd per round:
 *  - pkv_prefix_lookup of the 1,024-token prompt (63 cached blocks);
 *  - pkv_seq_step_batch of the 64 sequences (commit 1 + append 1 each), 512
 *    steps of each mode per round, alternating every 32 steps, with the CPU
 *    time of every thread involved (the daemon's and this process's) and their
 *    time spent runnable but waiting for a CPU: on a loaded machine the wall
 *    times mostly measure the scheduler (a thread that runs 32 steps without
 *    sleeping waits longer for a CPU than one woken for each step), the CPU
 *    times do not (docs/benchmarks.md);
 *  - a bare round trip of a 16-byte request and a 20-byte reply on a Unix
 *    socket pair to a forked echo process: the socket's own share.
 * Then throughput, 3 rounds alternating: 4 client processes of the pkvd, each
 * decoding 16 sequences of its own (a 16-step batch per call, as fast as it
 * can, for throughput_seconds, default 1), against one embedded process with
 * 4 threads doing the same work on its cache, with the CPU time per batch of
 * every process involved.
 * K/V bytes are not written. Most of a step's cost here is sealing: every 16th step
 * seals the 64 sequences' blocks (360 KiB each), whose checksums read them.
 * Prints the median of each round's per-call mean (wall and CPU), in microseconds, whether the
 * issue-25 target (pkvd step <= 2 x embedded + one socket round trip, that round
 * trip <= 15 us) is met, and the throughput medians in steps/s and tokens/s.
 */
#include "pagedkv.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NSEQ 64
#define PROMPT 1024
#define CALLS 2000
#define ROUND_STEPS 512 /* decode steps per mode per round */
#define CHUNK 32        /* steps of one mode before the other's (divides 256) */

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

/* A cache's decode state: steps done so far (the next step's token). */
typedef struct stepper {
    pkv_cache *c;
    uint64_t n;
} stepper;

/* Every 256 steps the sequences are cut back to the prompt (+ one pending
 * token), which keeps them within the capacity; called between measured
 * chunks, so neither mode's figures include it. */
static void step_cut(stepper *sp) {
    if (sp->n == 0 || sp->n % 256) return;
    for (uint64_t s = 0; s < NSEQ; s++) {
        uint32_t t = 7;
        pkv_slot sl;
        int rc = pkv_seq_truncate(sp->c, s + 1, PROMPT);
        if (rc || (rc = pkv_seq_append(sp->c, s + 1, &t, 1, &sl))) die("truncate", rc);
    }
}

/* `calls` decode steps of the 64 sequences (a divisor of 256, so a chunk never
 * crosses a cut): the wall time of the step_batch calls, in microseconds. */
static double step_chunk(stepper *sp, int calls) {
    pkv_step st[NSEQ];
    double total = 0;
    for (int i = 0; i < calls; i++, sp->n++) {
        for (int s = 0; s < NSEQ; s++)
            st[s] = (pkv_step){.id = (uint64_t)s + 1, .n_commit = 1, .token = (uint32_t)sp->n};
        size_t done = 0;
        double t0 = now_us();
        int rc = pkv_seq_step_batch(sp->c, st, NSEQ, &done);
        total += now_us() - t0;
        if (rc) die("step_batch", rc);
    }
    return total;
}

/* ---- What a round costs in CPU and page faults ------------------------------ */

/* CPU time and time spent runnable but waiting for a CPU of a process's live
 * threads (/proc/PID/task/N/schedstat, in ns): the first is independent of the
 * machine's load, the second is what the load adds. */
typedef struct use {
    double cpu_us, wait_us;
} use;

static use use_of(pid_t pid) {
    use u = {0, 0};
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    for (struct dirent *de; dir && (de = readdir(dir));) {
        if (de->d_name[0] == '.') continue;
        char sp[320];
        snprintf(sp, sizeof sp, "/proc/%d/task/%s/schedstat", (int)pid, de->d_name);
        FILE *f = fopen(sp, "r");
        unsigned long long ns = 0, wait = 0;
        if (f && fscanf(f, "%llu %llu", &ns, &wait) == 2) u.cpu_us += ns / 1e3, u.wait_us += wait / 1e3;
        if (f) fclose(f);
    }
    if (dir) closedir(dir);
    return u;
}

static void use_add(use *to, use d) {
    to->cpu_us += d.cpu_us, to->wait_us += d.wait_us;
}

static use use_diff(use a, use b) {
    return (use){b.cpu_us - a.cpu_us, b.wait_us - a.wait_us};
}

/* ---- The socket's own round trip ------------------------------------------ */

static int echo_fd = -1;

static void echo_start(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) exit(1);
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(sv[0]);
        uint8_t b[16], r[20] = {0};
        for (;;) {
            if (recv(sv[1], b, 16, MSG_WAITALL) != 16) _exit(0);
            if (send(sv[1], r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r) _exit(0);
        }
    }
    close(sv[1]);
    echo_fd = sv[0];
}

static double rtt_round(void) {
    uint8_t b[16] = {0}, r[20];
    double t0 = now_us();
    for (int i = 0; i < CALLS; i++)
        if (send(echo_fd, b, 16, MSG_NOSIGNAL) != 16 ||
            recv(echo_fd, r, sizeof r, MSG_WAITALL) != (ssize_t)sizeof r)
            die("echo", PKV_EIO);
    return (now_us() - t0) / CALLS;
}

/* ---- Throughput: 4 decoders of 16 sequences ---------------------------------- */

#define TP_DECODERS 4
#define TP_SEQS 16
static double tp_seconds = 1;

/* Open TP_SEQS sequences (ids base+1..) over the prompt, each with one pending
 * token. */
static void tp_setup(pkv_cache *c, uint64_t base) {
    pkv_slot *slots = malloc(PROMPT * sizeof *slots);
    for (uint64_t s = base + 1; s <= base + TP_SEQS; s++) {
        size_t nc = 0;
        uint32_t t = 7;
        int rc = pkv_seq_open(c, s, 0, prompt, PROMPT, &nc);
        if (!rc && nc < PROMPT && !(rc = pkv_seq_append(c, s, prompt + nc, PROMPT - nc, slots)))
            rc = pkv_seq_commit(c, s, PROMPT - nc);
        if (rc || (rc = pkv_seq_append(c, s, &t, 1, slots))) die("throughput setup", rc);
    }
    free(slots);
}

static void tp_teardown(pkv_cache *c, uint64_t base) {
    for (uint64_t s = base + 1; s <= base + TP_SEQS; s++) pkv_seq_close(c, s);
}

/* Decode until `until` (now_us), cutting back every 256 steps as step_cut
 * does; returns the batches done. */
static uint64_t tp_run(pkv_cache *c, uint64_t base, double until) {
    pkv_step st[TP_SEQS];
    uint64_t n = 0;
    while (now_us() < until) {
        if (n % 256 == 255) {
            for (uint64_t s = base + 1; s <= base + TP_SEQS; s++) {
                uint32_t t = 7;
                pkv_slot sl;
                int rc = pkv_seq_truncate(c, s, PROMPT);
                if (rc || (rc = pkv_seq_append(c, s, &t, 1, &sl))) die("tp truncate", rc);
            }
        }
        for (int s = 0; s < TP_SEQS; s++)
            st[s] = (pkv_step){.id = base + (uint64_t)s + 1, .n_commit = 1, .token = (uint32_t)n};
        size_t done = 0;
        int rc = pkv_seq_step_batch(c, st, TP_SEQS, &done);
        if (rc) die("tp step_batch", rc);
        n++;
    }
    return n;
}

typedef struct tp_thread {
    pkv_cache *c;
    uint64_t base, batches;
    double until;
} tp_thread;

static void *tp_main(void *arg) {
    tp_thread *t = arg;
    t->batches = tp_run(t->c, t->base, t->until);
    return NULL;
}

/* CPU time of a process's threads, exited ones included (/proc/PID/stat utime
 * + stime: clock ticks, so only for runs of a second or more). */
static double ticks_cpu_us(pid_t pid) {
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long ut = 0, st = 0;
    if (f && fgets(line, sizeof line, f)) {
        const char *q = strrchr(line, ')');
        /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt
         * majflt cmajflt utime stime */
        if (!q || sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                         &st) != 2)
            ut = st = 0;
    }
    if (f) fclose(f);
    return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

static double rusage_us(int who) {
    struct rusage ru;
    getrusage(who, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
           ru.ru_stime.tv_usec;
}

/* CPU microseconds per batch of the last tp_embedded / tp_served. */
static double tp_cpu_per_batch;

/* One embedded process, TP_DECODERS threads: batches per second. */
static double tp_embedded(pkv_cache *e) {
    tp_thread t[TP_DECODERS];
    pthread_t th[TP_DECODERS];
    for (int i = 0; i < TP_DECODERS; i++) tp_setup(e, 1000 + 100 * (uint64_t)i);
    double cpu0 = rusage_us(RUSAGE_SELF);
    double until = now_us() + tp_seconds * 1e6;
    for (int i = 0; i < TP_DECODERS; i++) {
        t[i] = (tp_thread){.c = e, .base = 1000 + 100 * (uint64_t)i, .until = until};
        if (pthread_create(&th[i], NULL, tp_main, &t[i])) die("pthread_create", PKV_ENOMEM);
    }
    uint64_t sum = 0;
    for (int i = 0; i < TP_DECODERS; i++) {
        pthread_join(th[i], NULL);
        sum += t[i].batches;
    }
    tp_cpu_per_batch = (rusage_us(RUSAGE_SELF) - cpu0) / (double)(sum ? sum : 1);
    for (int i = 0; i < TP_DECODERS; i++) tp_teardown(e, 1000 + 100 * (uint64_t)i);
    return (double)sum / tp_seconds;
}

/* TP_DECODERS client processes of the pkvd: batches per second. Each connects,
 * sets up, says so, waits for the start, decodes until a deadline it is sent,
 * and writes its batch count. */
static double tp_served(const char *sock, pid_t daemon) {
    int ready[2], go[2], res[2];
    if (pipe(ready) || pipe(go) || pipe(res)) die("pipe", PKV_EIO);
    pid_t kid[TP_DECODERS];
    for (int i = 0; i < TP_DECODERS; i++) {
        if ((kid[i] = fork()) == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            pkv_cache *c = NULL;
            int rc = pkv_connect(sock, &c);
            if (rc) die("tp connect", rc);
            tp_setup(c, 0);
            if (write(ready[1], "r", 1) != 1) _exit(1);
            double until;
            if (read(go[0], &until, sizeof until) != (ssize_t)sizeof until) _exit(1);
            uint64_t n = tp_run(c, 0, until);
            if (write(res[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(1);
            pkv_close(c);
            _exit(0);
        }
    }
    char r;
    for (int i = 0; i < TP_DECODERS; i++)
        if (read(ready[0], &r, 1) != 1) die("tp client start", PKV_EIO);
    /* the clients' CPU counts from their start (connect and setup included,
     * a small share of a run of a second), the daemon's from here */
    double kids0 = rusage_us(RUSAGE_CHILDREN), d0 = ticks_cpu_us(daemon);
    double until = now_us() + tp_seconds * 1e6; /* CLOCK_MONOTONIC is system-wide */
    for (int i = 0; i < TP_DECODERS; i++)
        if (write(go[1], &until, sizeof until) != (ssize_t)sizeof until) die("tp go", PKV_EIO);
    uint64_t sum = 0;
    for (int i = 0; i < TP_DECODERS; i++) {
        uint64_t n;
        if (read(res[0], &n, sizeof n) != (ssize_t)sizeof n) die("tp result", PKV_EIO);
        sum += n;
    }
    double d1 = ticks_cpu_us(daemon);
    for (int i = 0; i < TP_DECODERS; i++) waitpid(kid[i], NULL, 0);
    tp_cpu_per_batch = (rusage_us(RUSAGE_CHILDREN) - kids0 + d1 - d0) / (double)(sum ? sum : 1);
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]), close(res[0]), close(res[1]);
    return (double)sum / tp_seconds;
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
    if (argc > 4) tp_seconds = atof(argv[4]);
    if (!(tp_seconds > 0 && tp_seconds <= 60)) tp_seconds = 1;
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
    echo_start();
    /* Warm-up, not measured: the first ~1,000 steps of a fresh arena touch its
     * pages for the first time (a seal reads a whole block: page-cache pages
     * allocated and zeroed, faults), at about 8 times the CPU of later steps. */
    stepper ste = {e, 0}, str = {r, 0};
    for (int i = 0; i < 1024 / CHUNK; i++) {
        step_cut(&ste), step_chunk(&ste, CHUNK);
        step_cut(&str), step_chunk(&str, CHUNK);
    }
    double le[100], lr[100], se[100], sr[100], rt[100];
    double ce[100], cr[100], cc[100], we[100], wr[100];
    pid_t self = getpid();
    for (int k = 0; k < rounds; k++) { /* alternating, so drifts hit both */
        le[k] = lookup_round(e);
        lr[k] = lookup_round(r);
        /* 512 steps of each, alternating every CHUNK steps: a change of the
         * machine's load within the round hits both modes */
        use ue = {0, 0}, uc = {0, 0}, ud = {0, 0};
        se[k] = sr[k] = 0;
        for (int j = 0; j < ROUND_STEPS / CHUNK; j++) {
            step_cut(&ste);
            use u0 = use_of(self);
            se[k] += step_chunk(&ste, CHUNK);
            use_add(&ue, use_diff(u0, use_of(self)));
            step_cut(&str);
            /* reading the daemon's figures costs this process CPU: outside the
             * window of its own */
            use d0 = use_of(d), c0 = use_of(self);
            sr[k] += step_chunk(&str, CHUNK);
            use c1 = use_of(self), d1 = use_of(d);
            use_add(&uc, use_diff(c0, c1));
            use_add(&ud, use_diff(d0, d1));
        }
        se[k] /= ROUND_STEPS, sr[k] /= ROUND_STEPS;
        ce[k] = ue.cpu_us / ROUND_STEPS;
        cr[k] = (uc.cpu_us + ud.cpu_us) / ROUND_STEPS;
        cc[k] = uc.cpu_us / ROUND_STEPS;
        we[k] = ue.wait_us / ROUND_STEPS, wr[k] = (uc.wait_us + ud.wait_us) / ROUND_STEPS;
        rt[k] = rtt_round();
    }
    qsort(le, rounds, sizeof *le, cmp);
    qsort(lr, rounds, sizeof *lr, cmp);
    qsort(se, rounds, sizeof *se, cmp);
    qsort(sr, rounds, sizeof *sr, cmp);
    qsort(rt, rounds, sizeof *rt, cmp);
    qsort(ce, rounds, sizeof *ce, cmp);
    qsort(cr, rounds, sizeof *cr, cmp);
    qsort(cc, rounds, sizeof *cc, cmp);
    qsort(we, rounds, sizeof *we, cmp);
    qsort(wr, rounds, sizeof *wr, cmp);
    int m = rounds / 2;
    printf("median of %d rounds, microseconds per call (embedded / pkvd / difference)\n",
           rounds);
    printf("prefix_lookup 1024 tokens   %8.2f %8.2f %8.2f\n", le[m], lr[m], lr[m] - le[m]);
    printf("step_batch 64 sequences     %8.2f %8.2f %8.2f\n", se[m], sr[m], sr[m] - se[m]);
    printf("  per sequence-step         %8.3f %8.3f\n", se[m] / NSEQ, sr[m] / NSEQ);
    printf("  CPU per step, all threads %8.2f %8.2f  (pkvd: daemon + client; the client's "
           "%.2f)\n", ce[m], cr[m], cc[m]);
    printf("  waiting for a CPU / step  %8.2f %8.2f  (runnable, not running: the load's share)\n",
           we[m], wr[m]);
    printf("  CPU ratio pkvd / embedded %8.2f  (independent of the load; wall times are not)\n",
           cr[m] / ce[m]);
    printf("socket round trip (16 B / 20 B, socketpair, echo process)  %8.2f\n", rt[m]);
    double bound = 2 * se[m] + rt[m];
    printf("target: step_batch via pkvd <= 2 x embedded + one round trip = %.2f us: %s; "
           "round trip <= 15 us: %s\n", bound, sr[m] <= bound ? "met" : "NOT met",
           rt[m] <= 15 ? "met" : "NOT met");
    double te[3], tr[3], tce[3], tcr[3];
    for (int k = 0; k < 3; k++) {
        te[k] = tp_embedded(e);
        tce[k] = tp_cpu_per_batch;
        tr[k] = tp_served(sock, d);
        tcr[k] = tp_cpu_per_batch;
    }
    qsort(te, 3, sizeof *te, cmp);
    qsort(tr, 3, sizeof *tr, cmp);
    qsort(tce, 3, sizeof *tce, cmp);
    qsort(tcr, 3, sizeof *tcr, cmp);
    printf("throughput, %d decoders x %d sequences, %.1f s, median of 3 (steps/s, tokens/s)\n",
           TP_DECODERS, TP_SEQS, tp_seconds);
    printf("  embedded, 1 process x %d threads  %10.0f %12.0f\n", TP_DECODERS, te[1],
           te[1] * TP_SEQS);
    printf("  pkvd, %d client processes         %10.0f %12.0f  (%.2fx embedded)\n",
           TP_DECODERS, tr[1], tr[1] * TP_SEQS, tr[1] / te[1]);
    printf("  CPU per 16-step batch, all processes: embedded %.1f us, pkvd %.1f us "
           "(daemon + clients; %.2fx)\n", tce[1], tcr[1], tcr[1] / tce[1]);
    pkv_close(r);
    pkv_close(e);
    kill(d, SIGTERM);
    waitpid(d, NULL, 0);
    return 0;
}

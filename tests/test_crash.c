/* Crashes. The first law under test: pagedkv never serves K/V that is not the K/V of the
 * exact token prefix it stands for -- not after a crash, in any durability mode.
 *
 * (a) kill: a fork()ed child runs a seeded random workload on the cache and is killed
 *     with SIGKILL after 1-50 ms (half counted from the end of its open). Three tests,
 *     one driver (kill_test): GROUP, NONE and ALWAYS mode on a 48-block cache (4
 *     sequences of up to 32 tokens, so eviction and slot reuse never stop), plus the
 *     original GROUP test on a 256-block cache. The workload: opens with shared system
 *     prompts (the families), decode steps of 1-3 tokens (pkv_seq_commit_append),
 *     forks, truncations, closes, pkv_sync, checkpoints; the group commit is 2 ms or,
 *     in a quarter of the children, 20-100 ms; a third of the children open with
 *     PKV_OPEN_LIMBO_WAIT; a sync every 8 steps, or every 40 in a third of them.
 *     Before every open / fork / truncate / close the child appends an "intent" message
 *     to a file (and, before a close or truncation, the sequence's tokens as a prompt to
 *     recompute), and after every successful pkv_sync -- in ALWAYS mode after every
 *     step, since a call that returned is durable -- an "ack" with every sequence's
 *     committed tokens (plain write()s: the page cache survives a process kill; every
 *     message carries a checksum so a torn last one is ignored). The parent reopens
 *     the directory and checks pkv_check; the oracle of wu_oracle_check (acknowledged
 *     sequences survive unless closed/truncated later, nothing unannounced appears,
 *     every committed position of every recovered sequence holds the K/V of its
 *     prefix); the recompute probes (wu_recompute: the newest 64 prompts and every
 *     recovered sequence computed from scratch without a prefix attach -- block by
 *     block up to the first miss, then whole -- must read back their own K/V through
 *     the table the commits left); and the prefix probes (every prefix-hit position
 *     holds exactly the K/V of its prefix). A violation is counted, reported on stderr
 *     and the directory started afresh; otherwise the same directory carries over to
 *     the next iteration. PKV_KILL_ITERS=n per test for a longer run.
 * (d) deterministic windows (10 s group commit, the child kills itself): a stale
 *     recovered block reached by a seal's dedupe; a sealed block reused before its SEAL
 *     is durable while a durable COMMIT names it as an open tail; a forked child's open.
 * (b) power loss: a pkv_io_ops backend that forwards to the real files but remembers
 *     every write not yet made durable (file, offset, old bytes, new bytes) and the
 *     arena image as of its last successful fdatasync. At the N-th sync-type call
 *     (sync, write with sync, sync_dir) it "loses power": from then on every call
 *     fails with -EIO. After pkv_close each unsynced log/checkpoint write is kept,
 *     dropped (old bytes restored), torn (a prefix kept) or garbled (random bytes), and
 *     every arena sector that differs from the durable image is kept, restored or
 *     garbled -- the arena is written through mmap, which the backend cannot see, so
 *     the difference to the image taken at the start of the last successful arena
 *     fdatasync is exactly what may or may not have reached the disk. Then the cache
 *     is reopened with the default backend and checked as in (a), recompute probes
 *     included. 48-block cache (slot reuse throughout). Swept over N.
 * (c) fault injection: a backend that fails its k-th call with -EIO or -ENOSPC, swept
 *     over k: the failure surfaces as PKV_EFAILED / PKV_EIO / PKV_ENOSPC, after which
 *     every mutating call returns PKV_EFAILED; pkv_check passes; nothing crashes; a
 *     reopen with the default backend recovers the acknowledged state.
 *
 * The sweeps report every failing case at the end instead of stopping at the first.
 * Environment: PKV_SEED (kill test seed), PKV_KILL_ITERS (kill iterations per test,
 * default 100 GROUP / 100 NONE / 50 ALWAYS / 30 on 256 blocks),
 * PKV_POWER_N (crash points per power-loss sweep), PKV_FAULT_K (fault sweep limit),
 * PKV_KEEP_FAIL=1 (copy the directory of a failing kill / power-loss case to
 * /tmp/pkvkill.<pid> or /tmp/pkvfail.<pid>.<k>, with the oracle in pl-pre/oracle.txt),
 * PKV_TEST_EVICTION=leaf-slru (every test under leaf-first SLRU; one kill test always
 * runs under it: rule D3 walks its victim order). */
#include "wal_util.h"

#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(crash, .init = pt_setup, .fini = pt_teardown);

#define CAP 256u

static pkv_recovery recovery(pkv_cache *c)
{
    pkv_recovery r;
    WU_OK(pkv_get_recovery(c, &r));
    return r;
}

/* Every recovered sequence's committed tokens hit exactly their full blocks. */
static void probe_recovered(pkv_cache *c, const wu_model *m, const char *what)
{
    for (size_t i = 0; i < m->n; i++) {
        const wu_seq *s = &m->s[i];
        size_t nc = wu_probe(c, s->salt, s->tok, s->committed, what);
        WU_ASSERT(nc == pt_hit_cap(s->committed, WU_BS),
                  "%s: probing recovered seq %llu's %zu committed tokens hits %zu, expected %zu",
                  what, (unsigned long long)s->id, s->committed, nc,
                  pt_hit_cap(s->committed, WU_BS));
    }
}

/* ---- Sweeps that report every failing case -------------------------------------------- */

static pkv_cache *g_cache; /* the open cache of the running case (closed if it fails) */
static size_t g_recomputes; /* recompute probes made by verify_recovery */
static int g_pit_used;     /* reopens that needed PKV_OPEN_POINT_IN_TIME */

static pkv_cache *track(pkv_cache *c)
{
    g_cache = c;
    return c;
}

static void close_tracked(pkv_cache *c)
{
    if (g_cache == c) g_cache = NULL;
    pkv_close(c);
}

typedef struct sweep {
    int cases, failures;
    char msg[10][700];
} sweep;

/* Run one case; a WU_ failure inside it is recorded instead of ending the test. */
static void sweep_case(sweep *s, void (*fn)(void *arg, int k), void *arg, int k)
{
    jmp_buf jb;
    g_cache = NULL;
    s->cases++;
    if (setjmp(jb) == 0) {
        wu_catch = &jb;
        fn(arg, k);
        wu_catch = NULL;
        return;
    }
    wu_catch = NULL;
    if (g_cache) pkv_close(g_cache); /* its backend object is leaked on purpose */
    if (getenv("PKV_KEEP_FAIL")) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf /tmp/pkvfail.%d.%d && cp -a %s /tmp/pkvfail.%d.%d",
                 (int)getpid(), k, pt_dir, (int)getpid(), k);
        if (system(cmd)) {}
    }
    g_cache = NULL;
    if (s->failures < 10) snprintf(s->msg[s->failures], sizeof s->msg[0], "%.690s", wu_caught);
    s->failures++;
}

static void sweep_report(const sweep *s, const char *name)
{
    if (!s->failures) return;
    char all[8000];
    size_t o = 0;
    for (int i = 0; i < s->failures && i < 10; i++)
        o += (size_t)snprintf(all + o, sizeof all - o, "\n  - %s", s->msg[i]);
    cr_assert_fail("%s: %d of %d cases failed; the first %d:%s", name, s->failures, s->cases,
                   s->failures < 10 ? s->failures : 10, all);
}

/* ========================================================================================
 * (a) SIGKILL
 * ====================================================================================== */

static int msg_fd = -1;

static void msg_send(const uint8_t *body, size_t n)
{
    uint8_t buf[20000];
    WU_ASSERT(n + 16 <= sizeof buf, "message of %zu bytes", n);
    uint32_t len = (uint32_t)n;
    uint64_t sum = pt_mix(n);
    for (size_t i = 0; i < n; i++) sum = pt_mix(sum ^ body[i]);
    memcpy(buf, &len, 4);
    memcpy(buf + 4, &sum, 8);
    memcpy(buf + 12, body, n);
    ssize_t w = write(msg_fd, buf, n + 12);
    WU_ASSERT(w == (ssize_t)(n + 12), "message write: %s", strerror(errno));
}

typedef struct mbuf {
    uint8_t b[20000];
    size_t n;
} mbuf;

static void mb_put(mbuf *m, const void *p, size_t n)
{
    WU_ASSERT(m->n + n <= sizeof m->b, "message too long");
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void mb_u64(mbuf *m, uint64_t v) { mb_put(m, &v, 8); }

static void child_intent(void *ctx, char kind, uint64_t id, uint64_t arg, uint64_t salt,
                         const uint32_t *t, size_t n)
{
    /* A sequence about to be closed or cut: its tokens become a prompt for the parent's
     * recompute probes ('P', no oracle intent), so that the blocks it sealed -- the
     * cached blocks eviction takes first -- are reached by a recompute after the kill. */
    const wu_wl *w = ctx;
    const wu_seq *s = w && (kind == 'C' || kind == 'T') ? wu_model_find(&w->m, id) : NULL;
    if (s && s->len) {
        mbuf p = {.n = 0};
        char pk = 'P';
        mb_put(&p, &pk, 1);
        mb_u64(&p, id);
        mb_u64(&p, 0);
        mb_u64(&p, s->salt);
        mb_u64(&p, s->len);
        mb_put(&p, s->tok, s->len * 4);
        msg_send(p.b, p.n);
    }
    mbuf m = {.n = 0};
    mb_put(&m, &kind, 1);
    mb_u64(&m, id);
    mb_u64(&m, arg);
    mb_u64(&m, salt);
    mb_u64(&m, n);
    if (n) mb_put(&m, t, n * 4);
    msg_send(m.b, m.n);
}

static void child_ack(const wu_model *md)
{
    mbuf m = {.n = 0};
    char kind = 'A';
    mb_put(&m, &kind, 1);
    mb_u64(&m, md->n);
    for (size_t i = 0; i < md->n; i++) {
        const wu_seq *s = &md->s[i];
        mb_u64(&m, s->id);
        mb_u64(&m, s->salt);
        mb_u64(&m, s->committed);
        if (s->committed) mb_put(&m, s->tok, s->committed * 4);
    }
    msg_send(m.b, m.n);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One kill test: the durability mode, the cache and the workload's bounds. */
typedef struct kill_cfg {
    const char *name;
    pkv_durability mode;
    uint64_t cap;            /* blocks */
    size_t max_seqs, max_len; /* wu_wl bounds: max_seqs * max_len / WU_BS + the longest
                                 prompt must fit cap, so no call meets PKV_EFULL */
    uint64_t iters;          /* default iterations (PKV_KILL_ITERS overrides) */
    bool slru;               /* PKV_EVICT_LEAF_SLRU (else as PKV_TEST_EVICTION says) */
} kill_cfg;

static void kill_opts(pkv_options *o, const kill_cfg *k, uint32_t commit_us, uint32_t flags)
{
    wu_opts(o, WU_BS, k->cap, k->mode);
    if (k->slru) {
        o->eviction = PKV_EVICT_LEAF_SLRU;
        o->evict_protect_pct = 25; /* demotions are frequent on 48 blocks */
    }
    o->checkpoint_bytes = 48u << 10;
    o->group_commit_us = commit_us;
    o->flags = flags;
    /* the smallest segments: rotation and recycling happen all the time, and each
     * reopen scans 1 MiB after the log's end rather than up to 32 MiB */
    o->log_segment_bytes = 1u << 20;
}

/* A decode step as an engine makes it: commit the pending tokens (the K/V of the last
 * step, written) and append 1-3 new ones in one pkv_seq_commit_append; a sequence at
 * its length bound is closed or truncated instead. */
static void kill_decode(wu_wl *w)
{
    const wu_seq *s = &w->m.s[pt_below(&w->rng, (uint32_t)w->m.n)];
    uint64_t id = s->id;
    size_t k = 1 + pt_below(&w->rng, 3), pend = s->len - s->committed;
    if (s->len + k > w->max_len) {
        if (pt_below(&w->rng, 2)) WU_OK(wu_do_close(w, id));
        else WU_OK(wu_do_truncate(w, id, pt_below(&w->rng, (uint32_t)s->len + 1)));
        return;
    }
    uint32_t t[3];
    for (size_t i = 0; i < k; i++) t[i] = pt_below(&w->rng, 30000);
    /* now and then the pending tokens stay pending a step longer */
    size_t nc = pend && pt_below(&w->rng, 5) == 0 ? 0 : pend;
    WU_OK(wu_do_commit_append(w, id, nc, t, k));
}

/* A child that crashes prints where (the parent then fails: "stopped on its own"). */
static void child_crash_handler(int sig)
{
    void *bt[64];
    int n = backtrace(bt, 64);
    char m[64];
    int l = snprintf(m, sizeof m, "kill child %d: signal %d; backtrace:\n", (int)getpid(), sig);
    if (write(2, m, (size_t)l) < 0) {}
    backtrace_symbols_fd(bt, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static _Noreturn void kill_child(const kill_cfg *k, const char *dir, const char *msgs, int ready,
                                 uint64_t seed, unsigned iter, uint32_t commit_us, uint32_t flags)
{
    wu_in_child = true;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGSEGV, child_crash_handler);
    signal(SIGBUS, child_crash_handler);
    signal(SIGABRT, child_crash_handler);
    msg_fd = open(msgs, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    WU_ASSERT(msg_fd >= 0, "open %s: %s", msgs, strerror(errno));
    pkv_options o;
    kill_opts(&o, k, commit_us, flags);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, seed, NULL);
    w.max_seqs = k->max_seqs;
    w.max_len = k->max_len;
    uint64_t base = ((uint64_t)iter + 1) << 32;
    if (w.next_id < base) w.next_id = base;
    w.intent = child_intent;
    w.hctx = &w;
    w.allow_ckpt = true;
    /* the recovered state is durable: it came from the files */
    child_ack(&w.m);
    if (write(ready, "r", 1) != 1) _exit(5);
    bool always = k->mode == PKV_DURABLE_ALWAYS;
    /* a pkv_sync every 8 steps on average, in a third of the runs every 40 (each sync
     * is a group commit: fewer of them leave the unsynced windows open longer) */
    uint32_t sync_every = pt_below(&w.rng, 3) ? 8 : 40;
    for (uint64_t i = 0;; i++) {
        if (w.m.n && pt_below(&w.rng, 5) < 2) kill_decode(&w);
        else wu_step(&w);
        /* PKV_DURABLE_ALWAYS: a call that returned is durable, so the state after every
         * step (each of its calls returned) is acknowledged. Not after each call: the
         * model follows a call only once it returned, and an ack clears the intents
         * announced before it. */
        if (always) child_ack(&w.m);
        if (pt_below(&w.rng, sync_every) == 0) {
            WU_OK(pkv_sync(c));
            child_ack(&w.m);
        }
        if (w.m.n && pt_below(&w.rng, 16) == 0) {
            const wu_seq *s = &w.m.s[pt_below(&w.rng, (uint32_t)w.m.n)];
            wu_verify_seq(c, s, s->len, "child self-check");
        }
    }
}

/* Parse the child's messages into the oracle (which starts from `prev`, the state the
 * parent verified before the child ran), the prompt list (ps, opens) and the token lists
 * of sequences closed or truncated (pc). Returns the number of messages. */
static size_t parse_msgs(const char *path, wu_oracle *o, const wu_model *prev, wu_prompts *ps,
                         wu_prompts *pc, size_t *acks)
{
    wu_oracle_ack(o, prev);
    size_t len = 0, n = 0;
    uint8_t *b = wu_read_file(path, &len);
    *acks = 0;
    for (size_t off = 0; off + 12 <= len;) {
        uint32_t bl;
        uint64_t sum, want;
        memcpy(&bl, b + off, 4);
        memcpy(&sum, b + off + 4, 8);
        if (off + 12 + bl > len) break; /* torn last message */
        const uint8_t *p = b + off + 12;
        want = pt_mix(bl);
        for (size_t i = 0; i < bl; i++) want = pt_mix(want ^ p[i]);
        if (want != sum) break;
        off += 12 + bl;
        n++;
        char kind = (char)p[0];
        uint64_t v[4];
        if (kind == 'A') {
            uint64_t cnt;
            memcpy(&cnt, p + 1, 8);
            wu_model m = {0};
            size_t q = 9;
            for (uint64_t i = 0; i < cnt; i++) {
                uint64_t id, salt, com;
                memcpy(&id, p + q, 8);
                memcpy(&salt, p + q + 8, 8);
                memcpy(&com, p + q + 16, 8);
                q += 24;
                wu_seq *s = wu_model_add(&m, id, salt, NULL, 0, 0);
                wu_seq_reserve(s, com + 1);
                memcpy(s->tok, p + q, com * 4);
                s->len = s->committed = com;
                q += com * 4;
            }
            wu_oracle_ack(o, &m);
            wu_model_free(&m);
            (*acks)++;
            continue;
        }
        memcpy(v, p + 1, 32);
        if (kind != 'P') wu_oracle_intent(o, kind, v[0], v[1]);
        if (kind == 'O' || kind == 'P') {
            uint32_t *t = malloc(v[3] * 4 + 4);
            memcpy(t, p + 33, v[3] * 4);
            wu_prompts_add(kind == 'O' ? ps : pc, v[2], t, v[3]);
            free(t);
        }
    }
    free(b);
    return n;
}


typedef struct kill_totals {
    size_t kills, msgs, acks, probes, recomputes, recompute_full, violations;
    size_t where[4]; /* violations found by: recovery/oracle, recompute, prefix hit, other */
    char first[3][900];
} kill_totals;

static const char *kill_stage; /* the check running in the parent */

#define KILL_PROMPTS 48 /* newest prompts / closed sequences recomputed after each kill */

/* The newest KILL_PROMPTS entries of ps (a view: shares ps's arrays). */
static wu_prompts kill_window(const wu_prompts *ps)
{
    wu_prompts w = *ps;
    if (w.n > KILL_PROMPTS) {
        w.p += w.n - KILL_PROMPTS;
        w.n = KILL_PROMPTS;
    }
    return w;
}

/* The kill test: a child runs the workload on the cache in `dir` and is killed; the
 * parent reopens and checks (a) pkv_check, (b) the oracle: acknowledged state survived
 * (in ALWAYS mode every step's), nothing unannounced appeared, every committed position
 * of every recovered sequence holds the K/V of its prefix, (d) every prompt ever used and
 * every recovered sequence recomputed from scratch reads back its own K/V, (c) every
 * prefix hit of those serves its K/V. The recompute comes before the prefix probes,
 * which verify (and so mark bad) the blocks they reach. A violation is recorded and the
 * directory started afresh; the test fails at the end with the first ones. */
static void kill_test(const kill_cfg *k)
{
    uint64_t iters = pt_env_u64("PKV_KILL_ITERS", k->iters);
    uint64_t seed0 = pt_env_u64("PKV_SEED", 1);
    char dir[512], msgs[512];
    pt_path(dir, sizeof dir, "cache");
    pt_path(msgs, sizeof msgs, "msgs");
    wu_prompts ps = {0}, pc = {0};
    wu_model prev = {0};
    pt_rng r = {seed0 * 7919 + (uint64_t)k->mode};
    static kill_totals tt; /* static: read after a longjmp */
    static wu_model rec;   /* static: the recovered state, freed after a longjmp */
    static pt_syncio parent_io;
    pt_syncio_init(&parent_io);
    memset(&tt, 0, sizeof tt);
    double t0 = now_ms();
    for (uint64_t it = 0; it < iters; it++) {
        /* 2 ms mostly; sometimes 20-100 ms, so unsynced windows are wide */
        uint32_t commit_us = pt_below(&r, 4) ? 2000 : 20000 * (1 + pt_below(&r, 5));
        /* a third of the children wait for the log to release limbo blocks instead
         * of evicting (each such wait is a group commit, which closes the window) */
        uint32_t flags = pt_below(&r, 3) ? 0 : PKV_OPEN_LIMBO_WAIT;
        snprintf(pt_ctx, sizeof pt_ctx, "[%s iteration %llu, PKV_SEED=%llu, group commit %u us%s] ",
                 k->name, (unsigned long long)it, (unsigned long long)seed0, commit_us,
                 flags ? ", limbo wait" : "");
        int ready[2];
        cr_assert_eq(pipe(ready), 0);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            close(ready[0]);
            kill_child(k, dir, msgs, ready[1], seed0 * 1000003 + it + ((uint64_t)k->mode << 40),
                       (unsigned)it, commit_us, flags);
        }
        close(ready[1]);
        unsigned delay = 1 + pt_below(&r, 50);
        if (it % 2) { /* half the kills count from the end of the child's open */
            struct pollfd pf = {ready[0], POLLIN, 0};
            poll(&pf, 1, 10000);
        }
        usleep(delay * 1000);
        kill(pid, SIGKILL);
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        close(ready[0]);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
                  "%sthe child stopped on its own (exit status %d, signal %d); see its stderr",
                  pt_ctx, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                  WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        tt.kills++;

        wu_oracle orc;
        wu_oracle_init(&orc);
        size_t acks = 0;
        struct stat sb;
        if (stat(msgs, &sb) == 0) tt.msgs += parse_msgs(msgs, &orc, &prev, &ps, &pc, &acks);
        else wu_oracle_ack(&orc, &prev);
        tt.acks += acks;
        if (!getenv("PKV_KEEP_FAIL")) unlink(msgs);

        if (getenv("PKV_KEEP_FAIL")) { /* keep the directory as the child left it */
            char keep[600];
            snprintf(keep, sizeof keep, "%s/kept-%llu", pt_dir, (unsigned long long)it);
            wu_copy_dir(dir, keep);
        }
        pkv_options o;
        /* The checks: recovery does not depend on the mode, so they run in GROUP mode
         * (in ALWAYS mode each probe call would wait for an fdatasync), and evict rather
         * than wait for the log to release limbo blocks (each wait an fdatasync). */
        kill_opts(&o, k, 0, 0);
        o.durability = PKV_DURABLE_GROUP; /* (a child killed before it created the
                                             cache leaves none: this open creates it) */
        /* The synchronous backend, so this process keeps no io_uring ring for the
         * next child to inherit (the library now sets up its own ring in a child:
         * crash/a_forked_child_can_open_a_cache tests that separately). */
        o.io = &parent_io.ops;
        g_cache = NULL;
        jmp_buf jb;
        if (setjmp(jb)) {
            int w = !strcmp(kill_stage, "recovered") ? 0 : !strcmp(kill_stage, "recompute") ? 1
                    : !strcmp(kill_stage, "prefix hit") ? 2 : 3;
            tt.where[w]++;
            /* What recovery says it did (a cut, a torn tail) is the first clue to a
             * violation found at the "recovered" stage. */
            pkv_recovery rv;
            if (g_cache && pkv_get_recovery(g_cache, &rv) == 0 && rv.note[0])
                fprintf(stderr, "kill test: recovery's note: %s\n", rv.note);
            fprintf(stderr, "kill test violation: %s[%s] %s\n", pt_ctx, kill_stage, wu_caught);
            if (tt.violations < 3)
                snprintf(tt.first[tt.violations], sizeof tt.first[0], "%s[%s] %.700s", pt_ctx,
                         kill_stage, wu_caught);
            tt.violations++;
            if (getenv("PKV_KEEP_FAIL")) {
                char cmd[1400];
                snprintf(cmd, sizeof cmd, "rm -rf /tmp/pkvkill.%d.%llu && cp -a %s /tmp/pkvkill.%d.%llu",
                         (int)getpid(), (unsigned long long)it, pt_dir, (int)getpid(),
                         (unsigned long long)it);
                if (system(cmd)) {}
            }
            if (g_cache) pkv_close(g_cache);
            g_cache = NULL;
            wu_model_free(&rec);
            /* start afresh: the damaged state would fail every later iteration */
            pt_rmrf(dir);
            wu_model_free(&prev);
            wu_oracle_free(&orc);
            continue;
        }
        wu_catch = &jb;
        kill_stage = "open";
        pkv_cache *c = track(wu_open_ok(dir, &o));
        memset(&rec, 0, sizeof rec);
        kill_stage = "recovered";
        wu_oracle_check(&orc, c, false, &rec, "recovered after SIGKILL");
        /* Recomputed: the newest prompts and closed/cut sequences (the blocks a child
         * evicts came from them; bounded work) and every recovered sequence. Block by
         * block up to the first miss first (evicts almost nothing, so the probes reach
         * what recovery left cached), then each whole prompt in one append + commit. */
        wu_prompts wps = kill_window(&ps), wpc = kill_window(&pc);
        kill_stage = "recompute";
        wu_recompute_hits_all(c, &wpc, NULL, &tt.recomputes,
                              "recomputed block by block after SIGKILL");
        wu_recompute_hits_all(c, &wps, &rec, &tt.recomputes,
                              "recomputed block by block after SIGKILL");
        wu_recompute_all(c, &wpc, NULL, &tt.recomputes, &tt.recompute_full,
                         "recomputed from scratch after SIGKILL");
        wu_recompute_all(c, &wps, &rec, &tt.recomputes, &tt.recompute_full,
                         "recomputed from scratch after SIGKILL");
        /* prefix hits: every prompt ever opened, the newest closed sequences, every
         * recovered sequence */
        kill_stage = "prefix hit";
        wu_probe_all(c, &ps, NULL, NULL, "prompts after SIGKILL");
        wu_probe_all(c, &wpc, NULL, NULL, "closed sequences after SIGKILL");
        probe_recovered(c, &rec, "recovered sequences after SIGKILL");
        tt.probes += ps.n + wpc.n + rec.n;
        kill_stage = "final check";
        WU_CHECK(c, "after the probes");
        wu_catch = NULL;
        close_tracked(c);
        wu_model_free(&prev);
        prev = rec;
        wu_oracle_free(&orc);
    }
    wu_catch = NULL;
    pt_ctx[0] = 0;
    cr_log_info("kill test %s: %llu iterations, %zu kills, %zu messages, %zu acks, %zu prefix "
                "probes, %zu recompute probes (%zu skipped: cache full), %zu violations "
                "(recovered K/V / oracle %zu, recompute %zu, prefix hit %zu, other %zu), %.0f ms",
                k->name, (unsigned long long)iters, tt.kills, tt.msgs, tt.acks, tt.probes,
                tt.recomputes, tt.recompute_full, tt.violations, tt.where[0], tt.where[1],
                tt.where[2], tt.where[3], now_ms() - t0);
    cr_assert(tt.violations == 0,
              "%s: %zu of %llu kills broke the first law (recovered K/V / oracle %zu, recompute "
              "%zu, prefix hit %zu, other %zu); the first:\n  - %s%s%s%s%s", k->name,
              tt.violations, (unsigned long long)iters, tt.where[0], tt.where[1], tt.where[2],
              tt.where[3], tt.first[0], tt.violations > 1 ? "\n  - " : "",
              tt.violations > 1 ? tt.first[1] : "", tt.violations > 2 ? "\n  - " : "",
              tt.violations > 2 ? tt.first[2] : "");
    cr_assert(iters < 10 || tt.acks > iters / 2, "the children acknowledged only %zu states",
              tt.acks);
    cr_assert(tt.recompute_full * 10 <= tt.recomputes + 9,
              "%zu of %zu recompute probes found the cache full", tt.recompute_full, tt.recomputes);
    wu_model_free(&prev);
    wu_prompts_free(&ps);
    wu_prompts_free(&pc);
}

/* 48 blocks of 4 tokens: at most 4 sequences of 32 tokens (32 blocks) plus a recompute
 * probe (8 blocks) always fit, and the workload seals far more than 48 blocks per run,
 * so eviction and slot reuse never stop. */
#define KILL_SMALL(nm, md, it) {.name = nm, .mode = md, .cap = 48, .max_seqs = 4, .max_len = 32, .iters = it}

Test(crash, kill_group_serves_only_the_right_kv, .timeout = 3600)
{
    kill_cfg k = KILL_SMALL("GROUP", PKV_DURABLE_GROUP, 80);
    kill_test(&k);
}

Test(crash, kill_none_serves_only_the_right_kv, .timeout = 3600)
{
    kill_cfg k = KILL_SMALL("NONE", PKV_DURABLE_NONE, 80);
    kill_test(&k);
}

Test(crash, kill_always_serves_only_the_right_kv, .timeout = 3600)
{
    kill_cfg k = KILL_SMALL("ALWAYS", PKV_DURABLE_ALWAYS, 40);
    kill_test(&k);
}

Test(crash, kill_group_leaf_slru_serves_only_the_right_kv, .timeout = 3600)
{
    kill_cfg k = KILL_SMALL("GROUP leaf-slru", PKV_DURABLE_GROUP, 40);
    k.slru = true;
    kill_test(&k);
}

/* The original kill test: GROUP mode, a roomy cache (256 blocks, 8 sequences of up to 64
 * tokens), through the same driver and checks. */
Test(crash, kill_during_workload, .timeout = 3600)
{
    kill_cfg k = {.name = "GROUP cap 256", .mode = PKV_DURABLE_GROUP, .cap = CAP, .max_seqs = 8,
                  .max_len = 64, .iters = 20};
    kill_test(&k);
}

/* ========================================================================================
 * (b) power loss
 * ====================================================================================== */

typedef struct pl_write {
    uint64_t ino;
    uint64_t off;
    size_t n;
    uint8_t *old, *new_;
} pl_write;

typedef struct crashfs {
    pthread_mutex_t mu;
    int nsync;    /* sync-type calls so far */
    int crash_at; /* 0: never */
    bool crashed;
    pl_write *w;
    size_t nw, capw;
    uint64_t arena_ino;
    uint8_t *durable; /* arena image as of the last successful arena fdatasync */
    size_t arena_len;
    int arena_syncs, log_syncs;
    pkv_io_ops ops;
} crashfs;

static uint64_t fd_ino(int fd)
{
    struct stat st;
    return fstat(fd, &st) ? 0 : (uint64_t)st.st_ino;
}

static uint64_t path_ino(const char *p)
{
    struct stat st;
    return stat(p, &st) ? 0 : (uint64_t)st.st_ino;
}

static void forget_ino(crashfs *fs, uint64_t ino)
{
    size_t k = 0;
    for (size_t i = 0; i < fs->nw; i++) {
        if (fs->w[i].ino == ino) {
            free(fs->w[i].old);
            free(fs->w[i].new_);
        } else {
            fs->w[k++] = fs->w[i];
        }
    }
    fs->nw = k;
}

/* Called with the lock held: is this sync-type call the one that loses power? */
static bool sync_point(crashfs *fs)
{
    if (fs->crashed) return true;
    if (++fs->nsync == fs->crash_at) fs->crashed = true;
    return fs->crashed;
}

static long full_pread(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (long)done;
}

static int cf_open(void *ctx, const char *path, int flags, int mode)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    bool dead = fs->crashed;
    pthread_mutex_unlock(&fs->mu);
    if (dead) return -EIO;
    int fd = open(path, flags | O_CLOEXEC, mode);
    if (fd < 0) return -errno;
    if (flags & O_TRUNC) { /* truncation forgets what was written before */
        pthread_mutex_lock(&fs->mu);
        forget_ino(fs, fd_ino(fd));
        pthread_mutex_unlock(&fs->mu);
    }
    return fd;
}

static int cf_close(void *ctx, int fd)
{
    crashfs *fs = ctx;
    close(fd);
    pthread_mutex_lock(&fs->mu);
    bool dead = fs->crashed;
    pthread_mutex_unlock(&fs->mu);
    return dead ? -EIO : 0;
}

static long cf_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    bool dead = fs->crashed;
    pthread_mutex_unlock(&fs->mu);
    if (dead) return -EIO;
    return full_pread(fd, buf, n, off);
}

static int cf_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    if (fs->crashed) {
        pthread_mutex_unlock(&fs->mu);
        return -EIO;
    }
    bool crash_now = sync && sync_point(fs);
    pl_write pw = {fd_ino(fd), off, n, malloc(n), malloc(n)};
    WU_ASSERT(pw.old && pw.new_, "oom");
    memset(pw.old, 0, n);
    long r = full_pread(fd, pw.old, n, off);
    (void)r;
    memcpy(pw.new_, buf, n);
    size_t done = 0;
    while (done < n) {
        ssize_t k = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (k <= 0) {
            int e = errno;
            free(pw.old);
            free(pw.new_);
            pthread_mutex_unlock(&fs->mu);
            return -e;
        }
        done += (size_t)k;
    }
    if (sync && !crash_now) {
        fdatasync(fd);
        forget_ino(fs, pw.ino); /* everything written to this file is durable now */
        free(pw.old);
        free(pw.new_);
        fs->log_syncs++;
    } else {
        if (fs->nw == fs->capw) {
            fs->capw = fs->capw ? fs->capw * 2 : 64;
            fs->w = realloc(fs->w, fs->capw * sizeof *fs->w);
            WU_ASSERT(fs->w, "oom");
        }
        fs->w[fs->nw++] = pw;
    }
    pthread_mutex_unlock(&fs->mu);
    return crash_now ? -EIO : 0;
}

static int cf_sync(void *ctx, int fd)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    if (sync_point(fs)) {
        pthread_mutex_unlock(&fs->mu);
        return -EIO;
    }
    uint64_t ino = fd_ino(fd);
    if (ino == fs->arena_ino) {
        /* the image as of now is what this fdatasync makes durable; later mmap
         * writes may or may not be */
        uint8_t *img = malloc(fs->arena_len);
        WU_ASSERT(img, "oom");
        long r = full_pread(fd, img, fs->arena_len, 0);
        WU_ASSERT(r == (long)fs->arena_len, "arena read %ld", r);
        fdatasync(fd);
        free(fs->durable);
        fs->durable = img;
        fs->arena_syncs++;
    } else {
        fdatasync(fd);
        forget_ino(fs, ino);
        fs->log_syncs++;
    }
    pthread_mutex_unlock(&fs->mu);
    return 0;
}

static int cf_allocate(void *ctx, int fd, uint64_t len)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    bool dead = fs->crashed;
    pthread_mutex_unlock(&fs->mu);
    if (dead) return -EIO;
    int e = posix_fallocate(fd, 0, (off_t)len);
    return e ? -e : 0;
}

/* Directory operations are modelled as durable at once (a journaling file system
 * orders them before later data of the same files in practice); the library syncs the
 * directory where it matters, which counts as a sync point. */
static int cf_rename(void *ctx, const char *from, const char *to)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    if (fs->crashed) {
        pthread_mutex_unlock(&fs->mu);
        return -EIO;
    }
    uint64_t old = path_ino(to);
    int rc = rename(from, to) ? -errno : 0;
    if (!rc && old) forget_ino(fs, old);
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int cf_unlink(void *ctx, const char *path)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    if (fs->crashed) {
        pthread_mutex_unlock(&fs->mu);
        return -EIO;
    }
    uint64_t ino = path_ino(path);
    int rc = unlink(path) ? -errno : 0;
    if (!rc && ino) forget_ino(fs, ino);
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int cf_sync_dir(void *ctx, const char *dir)
{
    crashfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    bool dead = sync_point(fs);
    pthread_mutex_unlock(&fs->mu);
    if (dead) return -EIO;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

static void crashfs_init(crashfs *fs, const char *dir, int crash_at)
{
    memset(fs, 0, sizeof *fs);
    pthread_mutex_init(&fs->mu, NULL);
    fs->crash_at = crash_at;
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    fs->arena_ino = path_ino(arena);
    fs->durable = wu_read_file(arena, &fs->arena_len);
    fs->ops = (pkv_io_ops){fs,       cf_open,     cf_close,  cf_pread,  cf_write,
                           cf_sync,  cf_allocate, cf_rename, cf_unlink, cf_sync_dir, NULL};
}

static void crashfs_free(crashfs *fs)
{
    forget_ino(fs, 0);
    for (size_t i = 0; i < fs->nw; i++) {
        free(fs->w[i].old);
        free(fs->w[i].new_);
    }
    free(fs->w);
    free(fs->durable);
    pthread_mutex_destroy(&fs->mu);
}

static bool ino_path(const char *dir, uint64_t ino, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(d))) {
        snprintf(out, cap, "%s/%s", dir, e->d_name);
        found = path_ino(out) == ino;
    }
    closedir(d);
    return found;
}

typedef struct damage {
    size_t kept, dropped, torn, garbled;   /* unsynced log/checkpoint writes */
    size_t sec_kept, sec_restored, sec_garbled; /* arena sectors */
} damage;

/* Power is lost: resolve every write that was not durable. Runs after pkv_close, when
 * no library thread touches the files any more. */
/* force_log: -1 random, else the action for every unsynced write (0 keep, 1 drop);
 * force_arena: -1 random, 0 keep every changed sector, 1 restore every one. */
static void crashfs_apply_forced(crashfs *fs, const char *dir, pt_rng *r, damage *d,
                                 int force_log, int force_arena)
{
    memset(d, 0, sizeof *d);
    int *act = calloc(fs->nw + 1, sizeof *act);
    size_t *cut = calloc(fs->nw + 1, sizeof *cut);
    for (size_t i = 0; i < fs->nw; i++) {
        act[i] = force_log >= 0 ? force_log : (int)pt_below(r, 4);
        cut[i] = pt_below(r, (uint32_t)fs->w[i].n);
    }
    /* restores newest first, so overlapping writes unwind correctly */
    for (size_t i = fs->nw; i-- > 0;) {
        pl_write *w = &fs->w[i];
        char p[700];
        if (!ino_path(dir, w->ino, p, sizeof p)) continue;
        int fd = open(p, O_WRONLY);
        WU_ASSERT(fd >= 0, "open %s", p);
        if (act[i] == 1) {
            WU_ASSERT(pwrite(fd, w->old, w->n, (off_t)w->off) == (ssize_t)w->n, "restore");
            d->dropped++;
        } else if (act[i] == 2) {
            WU_ASSERT(pwrite(fd, w->old + cut[i], w->n - cut[i], (off_t)(w->off + cut[i])) ==
                          (ssize_t)(w->n - cut[i]),
                      "tear");
            d->torn++;
        } else if (act[i] == 0) {
            d->kept++;
        }
        close(fd);
    }
    for (size_t i = 0; i < fs->nw; i++) {
        if (act[i] != 3) continue;
        pl_write *w = &fs->w[i];
        char p[700];
        if (!ino_path(dir, w->ino, p, sizeof p)) continue;
        uint8_t *g = malloc(w->n);
        for (size_t k = 0; k < w->n; k++) g[k] = (uint8_t)pt_rand(r);
        int fd = open(p, O_WRONLY);
        WU_ASSERT(fd >= 0 && pwrite(fd, g, w->n, (off_t)w->off) == (ssize_t)w->n, "garble");
        close(fd);
        free(g);
        d->garbled++;
    }
    free(act);
    free(cut);
    /* the arena */
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    size_t len = 0;
    uint8_t *cur = wu_read_file(arena, &len);
    WU_ASSERT(len == fs->arena_len, "arena size changed %zu -> %zu", fs->arena_len, len);
    for (size_t off = 0; off < len; off += 512) {
        if (!memcmp(cur + off, fs->durable + off, 512)) continue;
        uint32_t a = force_arena == 0 ? 0 : force_arena == 1 ? 5 : pt_below(r, 10);
        if (a < 4) {
            d->sec_kept++;
        } else if (a < 8) {
            memcpy(cur + off, fs->durable + off, 512);
            d->sec_restored++;
        } else {
            for (size_t k = off; k < off + 512; k++)
                if (cur[k] != fs->durable[k]) cur[k] = (uint8_t)pt_rand(r);
            d->sec_garbled++;
        }
    }
    int fd = open(arena, O_WRONLY);
    WU_ASSERT(fd >= 0 && pwrite(fd, cur, len, 0) == (ssize_t)len, "arena write");
    close(fd);
    free(cur);
}

static void crashfs_apply(crashfs *fs, const char *dir, pt_rng *r, damage *d)
{
    crashfs_apply_forced(fs, dir, r, d, -1, -1);
}

/* ---- Shared by (b) and (c): the setup phase and the workload under a backend ----------- */

/* The cache and workload bounds of (b) and (c). The power-loss sweeps use a 48-block
 * cache (slot reuse all the time) and the recompute probes after recovery; the fault
 * sweep keeps the roomy 256-block cache. */
static struct {
    uint64_t cap;
    size_t max_seqs, max_len;
    bool recompute;
} g_geo = {CAP, 6, 64, false};

typedef struct phase1 {
    char dir[512];
    wu_model m; /* committed state at its clean close */
    wu_prompts ps;
} phase1;

static void phase1_build(phase1 *p, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    pt_path(p->dir, sizeof p->dir, "base");
    pkv_options o;
    wu_opts(&o, WU_BS, g_geo.cap, PKV_DURABLE_GROUP);
    pkv_cache *c = wu_open_ok(p->dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, seed, &p->ps);
    w.max_seqs = g_geo.max_seqs;
    w.max_len = g_geo.max_len;
    for (int i = 0; i < 40; i++) wu_step(&w);
    WU_OK(pkv_checkpoint(c));
    for (int i = 0; i < 15; i++) wu_step(&w);
    pkv_close(c);
    wu_model_drop_pending(&w.m);
    wu_model_copy(&p->m, &w.m);
    wu_model_sort(&p->m);
    wu_wl_free(&w);
}

static void phase1_free(phase1 *p)
{
    wu_model_free(&p->m);
    wu_prompts_free(&p->ps);
}

typedef struct run_ctx {
    wu_oracle *o;
    bool failed_seen; /* some call returned an error: every later mutating call fails */
} run_ctx;

static void oracle_intent(void *ctx, char kind, uint64_t id, uint64_t arg, uint64_t salt,
                          const uint32_t *t, size_t n)
{
    (void)salt;
    (void)t;
    (void)n;
    run_ctx *rc = ctx;
    wu_oracle_intent(rc->o, kind, id, arg);
}

static void after_ok(void *ctx, pkv_cache *c)
{
    (void)c;
    run_ctx *rc = ctx;
    WU_ASSERT(!rc->failed_seen, "a mutating call succeeded after the cache reported a failure");
}

static bool fail_code(int rc)
{
    return rc == PKV_EFAILED || rc == PKV_EIO || rc == PKV_ENOSPC;
}

/* Run the workload on an open cache under a failing backend. Every error must be one of
 * the failure codes; after the first, every mutating call must return PKV_EFAILED.
 * Acknowledges successful syncs to the oracle. Returns whether a failure was seen. */
static bool faulty_workload(pkv_cache *c, wu_oracle *o, wu_prompts *ps, uint64_t seed, int steps,
                            const char *what)
{
    run_ctx rc = {o, false};
    wu_wl w;
    wu_wl_init(&w, c, seed, ps);
    if (w.next_id < 1000000) w.next_id = 1000000; /* never an id of the setup phase */
    w.max_seqs = g_geo.max_seqs;
    w.max_len = g_geo.max_len;
    w.tolerant = true;
    w.allow_ckpt = true;
    w.hctx = &rc;
    w.intent = oracle_intent;
    w.after_call = after_ok;
    for (int i = 0; i < steps; i++) {
        int e = wu_step(&w);
        /* A checkpoint that finds no space (or memory) is discarded and the cache
         * keeps serving from the log (format.md, "The failed state"): not a failure. */
        if ((e == PKV_ENOSPC || e == PKV_ENOMEM) && strcmp(w.err_call, "pkv_checkpoint") == 0 &&
            !rc.failed_seen)
            continue;
        if (e) {
            WU_ASSERT(fail_code(e), "%s: %s -> %d (%s: %s), expected an I/O failure code", what,
                      w.err_call, e, pkv_strerror(e), pkv_last_error());
            if (rc.failed_seen)
                WU_ASSERT(e == PKV_EFAILED, "%s: %s after the failure -> %d, expected PKV_EFAILED",
                          what, w.err_call, e);
            rc.failed_seen = true;
        }
        if (i % 4 == 3) {
            int s = pkv_sync(c);
            if (s == 0) {
                WU_ASSERT(!rc.failed_seen, "%s: pkv_sync succeeded after a failure", what);
                wu_oracle_ack(o, &w.m);
            } else {
                WU_ASSERT(fail_code(s), "%s: pkv_sync -> %d (%s)", what, s, pkv_strerror(s));
                if (rc.failed_seen)
                    WU_ASSERT(s == PKV_EFAILED, "%s: pkv_sync after the failure -> %d", what, s);
                rc.failed_seen = true;
            }
        }
    }
    if (rc.failed_seen) {
        /* every mutating call is refused now */
        size_t nc;
        pkv_slot sl[1];
        uint32_t t = 1;
        uint64_t id = w.m.n ? w.m.s[0].id : 12345;
        int e;
        WU_ASSERT((e = pkv_seq_open(c, 1ull << 60, 0, &t, 1, &nc)) == PKV_EFAILED, "%s: open %d", what, e);
        WU_ASSERT((e = pkv_seq_append(c, id, &t, 1, sl)) == PKV_EFAILED, "%s: append %d", what, e);
        WU_ASSERT((e = pkv_seq_commit(c, id, 1)) == PKV_EFAILED, "%s: commit %d", what, e);
        WU_ASSERT((e = pkv_seq_fork(c, id, 1ull << 61)) == PKV_EFAILED, "%s: fork %d", what, e);
        WU_ASSERT((e = pkv_seq_truncate(c, id, 0)) == PKV_EFAILED, "%s: truncate %d", what, e);
        WU_ASSERT((e = pkv_seq_close(c, id)) == PKV_EFAILED, "%s: close %d", what, e);
        WU_ASSERT((e = pkv_sync(c)) == PKV_EFAILED, "%s: sync %d", what, e);
        WU_ASSERT((e = pkv_checkpoint(c)) == PKV_EFAILED, "%s: checkpoint %d", what, e);
    }
    /* the in-memory state is intact and consistent: failed calls changed nothing */
    WU_CHECK(c, what);
    wu_verify_model(c, &w.m, what);
    wu_wl_free(&w);
    return rc.failed_seen;
}

/* Reopen with the default backend and check everything. */
/* A power loss restarts the machine: the reopen's I/O backend is the default one on
 * another boot (pkv_io_ops.boot_id), so recovery knows the page cache may be lost. */
static int rebooted_boot_id(void *ctx, char *out, size_t cap)
{
    (void)ctx;
    snprintf(out, cap, "pkv-test-after-power-loss");
    return 0;
}

static const pkv_io_ops *rebooted_io(void)
{
    static pkv_io_ops ops;
    ops = *pkv_io_default();
    ops.boot_id = rebooted_boot_id;
    return &ops;
}

static void verify_recovery(const char *dir, pkv_durability mode, const wu_oracle *o,
                            const wu_prompts *ps, bool allow_pit, bool second_open,
                            const char *what)
{
    pkv_options op;
    wu_opts(&op, WU_BS, 0 /* as stored */, mode);
    op.io = rebooted_io();
    pkv_cache *c = NULL;
    int rc = wu_open(dir, &op, &c);
    track(c);
    if (rc == PKV_ECORRUPT && allow_pit) {
        /* PKV_DURABLE_NONE hands frames to the OS without fdatasync: after a power loss
         * an earlier frame may be garbled or missing while a later one reached the disk.
         * That is a log corrupted in the middle, and point-in-time recovery is the
         * documented way to open it. */
        op.flags = PKV_OPEN_POINT_IN_TIME;
        rc = wu_open(dir, &op, &c);
        track(c);
        g_pit_used++;
    }
    WU_ASSERT(rc == 0, "%s: reopen -> %d (%s: %s)", what, rc, pkv_strerror(rc),
              pkv_last_error());
    WU_CHECK(c, what);
    wu_model m;
    wu_oracle_check(o, c, mode == PKV_DURABLE_NONE, &m, what);
    if (g_geo.recompute) {
        /* every prompt and recovered sequence recomputed from scratch reads back its own
         * K/V (before the prefix probes, which verify and so disarm what they reach) */
        char w2[400];
        snprintf(w2, sizeof w2, "%s, recomputed", what);
        wu_recompute_hits_all(c, ps, &m, &g_recomputes, w2);
        wu_recompute_all(c, ps, &m, &g_recomputes, NULL, w2);
    }
    wu_probe_all(c, ps, NULL, NULL, what);
    probe_recovered(c, &m, what);
    close_tracked(c);
    if (!second_open) {
        wu_model_free(&m);
        return;
    }
    /* the repaired state is the new base: a plain reopen recovers it unchanged */
    op.flags = 0;
    c = track(wu_open_ok(dir, &op));
    pkv_recovery rec = recovery(c);
    WU_ASSERT(rec.corrupt_lsn == 0 && rec.torn_bytes == 0,
              "%s: second reopen still finds damage (torn %llu, corrupt %llu): %s", what,
              (unsigned long long)rec.torn_bytes, (unsigned long long)rec.corrupt_lsn, rec.note);
    wu_verify_model(c, &m, what);
    close_tracked(c);
    wu_model_free(&m);
}

/* ---- (b) the sweep ------------------------------------------------------------------------- */

typedef struct pl_stats {
    int runs, crashed, open_failed, pit, arena_garbled;
    size_t log_damage;
} pl_stats;

static void power_loss_run(const phase1 *p1, pkv_durability mode, int crash_at, uint32_t commit_us,
                           pl_stats *ps_out, int *nsync_out)
{
    char dir[512], what[160];
    pt_path(dir, sizeof dir, "pl");
    pt_rmrf(dir);
    wu_copy_dir(p1->dir, dir);
    snprintf(what, sizeof what, "power loss at sync call %d (mode %d, group commit %u us)",
             crash_at, (int)mode, commit_us);
    crashfs *fsp = malloc(sizeof *fsp); /* leaked if the case fails: the cache uses it */
#define fs (*fsp)
    crashfs_init(&fs, dir, crash_at);
    wu_oracle o;
    wu_oracle_init(&o);
    wu_oracle_ack(&o, &p1->m);
    wu_prompts ps = {0};
    for (size_t i = 0; i < p1->ps.n; i++)
        wu_prompts_add(&ps, p1->ps.p[i].salt, p1->ps.p[i].tok, p1->ps.p[i].n);
    pkv_options op;
    wu_opts(&op, WU_BS, g_geo.cap, mode);
    op.io = &fs.ops;
    op.checkpoint_bytes = 24u << 10;
    op.group_commit_us = commit_us;
    pkv_cache *c = NULL;
    int rc = wu_open(dir, &op, &c);
    track(c);
    if (rc) {
        WU_ASSERT(fs.crashed && fail_code(rc), "%s: open -> %d (%s: %s)", what, rc,
                  pkv_strerror(rc), pkv_last_error());
        ps_out->open_failed++;
    } else {
        faulty_workload(c, &o, &ps, 1000 + (uint64_t)crash_at % 7, 48, what);
        close_tracked(c);
    }
    if (nsync_out) *nsync_out = fs.nsync;
    pt_rng r = {(uint64_t)crash_at * 31 + (uint64_t)mode};
    damage d;
    crashfs_apply(&fs, dir, &r, &d);
    ps_out->runs++;
    ps_out->crashed += fs.crashed;
    ps_out->log_damage += d.dropped + d.torn + d.garbled;
    ps_out->arena_garbled += d.sec_garbled > 0;
    char w2[300];
    snprintf(w2, sizeof w2, "%s [unsynced log writes: %zu kept %zu dropped %zu torn %zu garbled; "
             "arena sectors: %zu kept %zu restored %zu garbled]", what, d.kept, d.dropped, d.torn,
             d.garbled, d.sec_kept, d.sec_restored, d.sec_garbled);
    if (getenv("PKV_KEEP_FAIL")) { /* the damaged directory and the oracle, before recovery */
        char keep[600], path[700];
        snprintf(keep, sizeof keep, "%s/pl-pre", pt_dir);
        pt_rmrf(keep);
        wu_copy_dir(dir, keep);
        snprintf(path, sizeof path, "%s/oracle.txt", keep);
        FILE *f = fopen(path, "w");
        if (f) {
            for (size_t i = 0; i < o.ack.n; i++) {
                fprintf(f, "ack %llu salt %llu committed %zu:", (unsigned long long)o.ack.s[i].id,
                        (unsigned long long)o.ack.s[i].salt, o.ack.s[i].committed);
                for (size_t j = 0; j < o.ack.s[i].committed; j++) fprintf(f, " %u", o.ack.s[i].tok[j]);
                fprintf(f, "\n");
            }
            for (size_t i = 0; i < o.nit; i++)
                fprintf(f, "intent %c %llu %llu\n", o.it[i].kind, (unsigned long long)o.it[i].id,
                        (unsigned long long)o.it[i].arg);
            fclose(f);
        }
    }
    verify_recovery(dir, mode, &o, &ps, mode == PKV_DURABLE_NONE, crash_at % 4 == 1, w2);
    crashfs_free(&fs);
#undef fs
    free(fsp);
    wu_oracle_free(&o);
    wu_prompts_free(&ps);
}

typedef struct pl_sweep {
    const phase1 *p1;
    pkv_durability mode;
    uint32_t commit_us;
    pl_stats st;
} pl_sweep;

static void pl_case(void *arg, int k)
{
    pl_sweep *s = arg;
    power_loss_run(s->p1, s->mode, k, s->commit_us, &s->st, NULL);
}

static void power_loss_sweep(pkv_durability mode, uint32_t commit_us, int max_n)
{
    /* 48 blocks: at most 4 sequences of 32 tokens, eviction and slot reuse throughout */
    g_geo.cap = 48;
    g_geo.max_seqs = 4;
    g_geo.max_len = 32;
    g_geo.recompute = true;
    phase1 p1;
    phase1_build(&p1, 500 + (uint64_t)mode);
    pl_sweep ps = {&p1, mode, commit_us, {0}};
    int total = 0;
    power_loss_run(&p1, mode, 0, commit_us, &ps.st, &total); /* no crash: count sync calls */
    int n = total < max_n ? total : max_n;
    sweep sw = {0};
    for (int k = 1; k <= n; k++) sweep_case(&sw, pl_case, &ps, k);
    cr_log_info("power loss mode %d: %d sync calls, %d runs, %d crashed, %d failed open, "
                "%zu damaged log writes, %d runs garbled arena sectors, %d point-in-time "
                "reopens, %zu recompute probes, %d failing cases",
                (int)mode, total, ps.st.runs, ps.st.crashed, ps.st.open_failed,
                ps.st.log_damage, ps.st.arena_garbled, g_pit_used, g_recomputes, sw.failures);
    sweep_report(&sw, "power loss");
    cr_assert(total >= 8, "the workload made only %d sync calls", total);
    cr_assert(ps.st.crashed >= n / 2, "only %d of %d runs crashed", ps.st.crashed, n);
    phase1_free(&p1);
}

Test(crash, power_loss_group)
{
    /* 10 s group commit: the log is written only at pkv_sync, checkpoints and when
     * freed blocks are needed, so the N-th sync call is the same call in every run */
    power_loss_sweep(PKV_DURABLE_GROUP, 10000000, (int)pt_env_u64("PKV_POWER_N", 40));
}

Test(crash, power_loss_group_async_flush)
{
    power_loss_sweep(PKV_DURABLE_GROUP, 100, (int)pt_env_u64("PKV_POWER_N", 20));
}

Test(crash, power_loss_none)
{
    /* a 50 us group commit: many frames reach the OS unsynced between pkv_sync calls */
    power_loss_sweep(PKV_DURABLE_NONE, 50, (int)pt_env_u64("PKV_POWER_N", 24));
}

/* ========================================================================================
 * (c) fault injection
 * ====================================================================================== */

enum { OP_OPEN, OP_CLOSE, OP_PREAD, OP_WRITE, OP_SYNC, OP_ALLOC, OP_RENAME, OP_UNLINK, OP_SYNCDIR };
static const char *op_name[] = {"open", "close", "pread", "write", "sync", "allocate",
                                "rename", "unlink", "sync_dir"};

typedef struct faultfs {
    pthread_mutex_t mu;
    int calls, fail_at, err;
    int fired_op; /* -1: not yet */
    pkv_io_ops ops;
} faultfs;

static bool ff_fail(faultfs *fs, int op)
{
    pthread_mutex_lock(&fs->mu);
    bool f = ++fs->calls == fs->fail_at;
    if (f) fs->fired_op = op;
    pthread_mutex_unlock(&fs->mu);
    return f;
}

static int ff_open(void *ctx, const char *path, int flags, int mode)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_OPEN)) return -fs->err;
    int fd = open(path, flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
}

static int ff_close(void *ctx, int fd)
{
    faultfs *fs = ctx;
    bool f = ff_fail(fs, OP_CLOSE);
    close(fd); /* the descriptor is gone either way */
    return f ? -fs->err : 0;
}

static long ff_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_PREAD)) return -fs->err;
    return full_pread(fd, buf, n, off);
}

static int ff_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_WRITE)) return -fs->err;
    size_t done = 0;
    while (done < n) {
        ssize_t k = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (k <= 0) return -errno;
        done += (size_t)k;
    }
    if (sync && fdatasync(fd)) return -errno;
    return 0;
}

static int ff_sync(void *ctx, int fd)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_SYNC)) return -fs->err;
    return fdatasync(fd) ? -errno : 0;
}

static int ff_allocate(void *ctx, int fd, uint64_t len)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_ALLOC)) return -fs->err;
    int e = posix_fallocate(fd, 0, (off_t)len);
    return e ? -e : 0;
}

static int ff_rename(void *ctx, const char *from, const char *to)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_RENAME)) return -fs->err;
    return rename(from, to) ? -errno : 0;
}

static int ff_unlink(void *ctx, const char *path)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_UNLINK)) return -fs->err;
    return unlink(path) ? -errno : 0;
}

static int ff_sync_dir(void *ctx, const char *dir)
{
    faultfs *fs = ctx;
    if (ff_fail(fs, OP_SYNCDIR)) return -fs->err;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

static void faultfs_init(faultfs *fs, int fail_at, int err)
{
    memset(fs, 0, sizeof *fs);
    pthread_mutex_init(&fs->mu, NULL);
    fs->fail_at = fail_at;
    fs->err = err;
    fs->fired_op = -1;
    fs->ops = (pkv_io_ops){fs,       ff_open,     ff_close,  ff_pread,  ff_write,
                           ff_sync,  ff_allocate, ff_rename, ff_unlink, ff_sync_dir, NULL};
}

/* Calls whose failure the library may legitimately tolerate: closing, deleting an old
 * file, renaming a segment to a spare (it falls back to deleting or creating). */
static bool tolerable(int op)
{
    return op == OP_CLOSE || op == OP_UNLINK || op == OP_RENAME;
}

static void fault_run(const phase1 *p1, int k, int err, int *calls_out)
{
    char dir[512], what[160];
    pt_path(dir, sizeof dir, "fi");
    pt_rmrf(dir);
    wu_copy_dir(p1->dir, dir);
    faultfs *fsp = malloc(sizeof *fsp); /* leaked if the case fails: the cache uses it */
#define fs (*fsp)
    faultfs_init(&fs, k, err);
    snprintf(what, sizeof what, "I/O call %d fails with %s", k, err == EIO ? "EIO" : "ENOSPC");
    wu_oracle o;
    wu_oracle_init(&o);
    wu_oracle_ack(&o, &p1->m);
    wu_prompts ps = {0};
    for (size_t i = 0; i < p1->ps.n; i++)
        wu_prompts_add(&ps, p1->ps.p[i].salt, p1->ps.p[i].tok, p1->ps.p[i].n);
    pkv_options op;
    wu_opts(&op, WU_BS, CAP, PKV_DURABLE_GROUP);
    op.io = &fs.ops;
    op.group_commit_us = 10000000; /* deterministic: I/O only at syncs and checkpoints */
    op.checkpoint_bytes = 16u << 10;
    pkv_cache *c = NULL;
    int rc = wu_open(dir, &op, &c);
    track(c);
    char w2[260];
    snprintf(w2, sizeof w2, "%s", what);
    if (rc) {
        WU_ASSERT(fs.fired_op >= 0, "%s: open failed (%d: %s) before any injected error", what,
                  rc, pkv_last_error());
        snprintf(w2, sizeof w2, "%s (%s, during open)", what, op_name[fs.fired_op]);
        WU_ASSERT(rc == PKV_EIO || rc == PKV_ENOSPC,
                  "%s: open -> %d (%s: %s), expected PKV_EIO or PKV_ENOSPC", w2, rc,
                  pkv_strerror(rc), pkv_last_error());
    } else {
        if (fs.fired_op >= 0) {
            snprintf(w2, sizeof w2, "%s (%s, during open)", what, op_name[fs.fired_op]);
            /* the open survived the error: then it must have recovered everything */
            wu_verify_model(c, &p1->m, w2);
        }
        bool failed = faulty_workload(c, &o, &ps, 2000 + (uint64_t)k, 40, what);
        snprintf(w2, sizeof w2, "%s (%s)", what, fs.fired_op >= 0 ? op_name[fs.fired_op] : "-");
        /* a checkpoint without space is discarded and counted, the cache serves on */
        pkv_stats st;
        WU_OK(pkv_get_stats(c, &st));
        bool discarded = err == ENOSPC && st.checkpoint_failures > 0;
        if (fs.fired_op >= 0 && !tolerable(fs.fired_op))
            WU_ASSERT(failed || discarded, "%s: the injected failure of a %s call was never "
                      "reported", w2, op_name[fs.fired_op]);
        if (fs.fired_op < 0) WU_ASSERT(!failed, "%s: a failure without an injected error", w2);
        close_tracked(c);
    }
    if (calls_out) *calls_out = fs.calls;
    verify_recovery(dir, PKV_DURABLE_GROUP, &o, &ps, false, k % 3 == 1, w2);
    wu_oracle_free(&o);
    wu_prompts_free(&ps);
    pthread_mutex_destroy(&fs.mu);
#undef fs
    free(fsp);
}

static void fault_case(void *arg, int k)
{
    fault_run(arg, k, k % 2 ? EIO : ENOSPC, NULL);
}

Test(crash, fault_injection)
{
    phase1 p1;
    phase1_build(&p1, 600);
    int total = 0;
    fault_run(&p1, 0, EIO, &total);
    cr_assert(total > 20, "only %d I/O calls", total);
    int maxk = (int)pt_env_u64("PKV_FAULT_K", 400);
    sweep sw = {0};
    for (int k = 1; k <= total + 2 && k <= maxk; k++) sweep_case(&sw, fault_case, &p1, k);
    cr_log_info("fault injection: %d I/O calls swept", total);
    sweep_report(&sw, "fault injection");
    phase1_free(&p1);
}

/* ---- pkv_sync's promise in PKV_DURABLE_NONE ---------------------------------------------
 * pkv_sync: "returns once every mutation made before the call is durable ... in every
 * durability mode". A sequence with 21 committed tokens (5 full blocks + 1 token in a
 * partial block) is synced. Then 3 more tokens fill the partial block, which is sealed;
 * in NONE mode the flusher hands that frame (SEAL + COMMIT) to the OS without syncing
 * the arena first. Power is lost: the frame happens to reach the disk, the new K/V of the
 * block does not. Recovery verifies the sealed block, finds its payload checksum wrong,
 * and cuts the sequence before the block -- dropping token 20, which pkv_sync had made
 * durable. (GROUP and ALWAYS sync the arena before each frame, so it cannot happen
 * there.) */
Test(crash, none_mode_sync_survives_a_later_seal)
{
    char dir[512];
    pt_path(dir, sizeof dir, "none");
    pkv_options o;
    wu_opts(&o, WU_BS, 64, PKV_DURABLE_NONE);
    pkv_cache *c = wu_open_ok(dir, &o); /* create the files */
    pkv_close(c);
    crashfs *fs = calloc(1, sizeof *fs);
    crashfs_init(fs, dir, 0);
    o.io = &fs->ops;
    o.group_commit_us = 1000;
    c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 3, NULL);
    uint32_t a[21];
    for (int i = 0; i < 21; i++) a[i] = 300 + (uint32_t)i;
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, a, 21, 0, &id));
    WU_OK(pkv_sync(c)); /* 21 committed tokens are durable now */
    uint32_t t[3] = {900, 901, 902};
    WU_OK(wu_do_append(&w, id, t, 3, true)); /* block 5 full: SEAL + COMMIT */
    for (int i = 0; i < 200; i++) { /* the flusher writes the frame (unsynced) */
        pthread_mutex_lock(&fs->mu);
        bool written = fs->nw > 0;
        pthread_mutex_unlock(&fs->mu);
        if (written) break;
        usleep(1000);
    }
    pthread_mutex_lock(&fs->mu);
    size_t nw = fs->nw;
    fs->crash_at = fs->nsync + 1; /* the next sync-type call loses power */
    pthread_mutex_unlock(&fs->mu);
    cr_assert(nw > 0, "the flusher did not write the frame within 200 ms");
    int rc = pkv_sync(c);
    cr_assert_neq(rc, 0, "pkv_sync after the power loss returned 0");
    pkv_close(c);
    pt_rng r = {1};
    damage d;
    crashfs_apply_forced(fs, dir, &r, &d, 0 /* the frame reached the disk */,
                         1 /* the block's new K/V did not */);
    /* With the arena flushed before every frame that seals (log.c), nothing of the
     * block's K/V is left unsynced here (d.sec_restored == 0); without that flush
     * the new K/V is lost while the frame survives. Either way the synced tokens
     * must come back. */
    (void)d;
    o.io = NULL;
    o.group_commit_us = 0;
    c = wu_open_ok(dir, &o);
    pkv_seq_info si;
    WU_OK(pkv_seq_get_info(c, id, &si));
    pkv_recovery rec = recovery(c);
    pkv_close(c);
    crashfs_free(fs);
    free(fs);
    wu_wl_free(&w);
    cr_assert(si.committed >= 21,
              "PKV_DURABLE_NONE: a sequence synced with 21 committed tokens comes back with %llu "
              "after a power loss (seq_blocks_bad %llu: the block sealed after the sync failed "
              "verification and took the synced token with it)",
              (unsigned long long)si.committed, (unsigned long long)rec.seq_blocks_bad);
}

/* ========================================================================================
 * (d) deterministic windows: SIGKILL with a 10 s group commit
 *
 * With group_commit_us = 10 s the flusher writes nothing between a pkv_sync and the kill
 * (the next group is due 10 s after the sync), so exactly the records before the sync are
 * durable and everything after it is lost -- while the arena, written through the shared
 * mapping, keeps every byte written up to the kill. The child ends itself with SIGKILL.
 * ====================================================================================== */

#define DET_CAP 8u

static void det_opts(pkv_options *o)
{
    wu_opts(o, WU_BS, DET_CAP, PKV_DURABLE_GROUP);
    o->group_commit_us = 10000000; /* the longest allowed: no group commit before the kill */
}

/* Run fn(dir, arg) in a forked child that then kills itself with SIGKILL; a WU_ failure
 * in the child ends it with status 3 instead, which fails the test here. */
static void det_child(const char *dir, void (*fn)(const char *dir, int arg), int arg)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        wu_in_child = true;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        fn(dir, arg);
        raise(SIGKILL);
        _exit(4);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
              "the child did not reach its SIGKILL (exit status %d, signal %d); see its stderr",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Append toks[0..n) to sequence id in one call and write their K/V (as the sequence's
 * prefix hashes say), then commit them. */
static void det_fill(wu_wl *w, uint64_t id, const uint32_t *toks, size_t n)
{
    WU_OK(wu_do_append(w, id, toks, n, true));
    WU_CHECK(w->c, "after an append + commit");
}

static bool det_table_has(pkv_cache *c, uint64_t id, uint32_t b)
{
    uint32_t tab[64];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 64, &nb));
    for (size_t i = 0; i < nb; i++)
        if (tab[i] == b) return true;
    return false;
}

static uint32_t det_block(pkv_cache *c, uint64_t id, size_t i)
{
    uint32_t tab[64];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 64, &nb));
    WU_ASSERT(i < nb, "seq %llu has %zu blocks", (unsigned long long)id, nb);
    return tab[i];
}

static const uint32_t det_a[4] = {4101, 4102, 4103, 4104};

/* Child of seal_dedupe_never_attaches_a_stale_recovered_block: block A (the one full
 * block of prompt det_a) sealed, its sequence closed, pkv_sync; then sequence B takes
 * every block of the cache, so A (the only cached block) is evicted and its slot
 * rewritten with B's K/V. The EVICT record is not durable when the child dies. */
static void child_stale_dedupe(const char *dir, int arg)
{
    (void)arg;
    pkv_options o;
    det_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 41, NULL);
    uint64_t a = 0, b = 0;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &a));
    det_fill(&w, a, det_a, 4); /* seals A */
    uint32_t blk = det_block(c, a, 0);
    WU_OK(wu_do_close(&w, a)); /* A cached */
    WU_OK(pkv_sync(c));        /* SEAL(A) and the close are durable */
    WU_CHECK(c, "A cached and synced");
    uint32_t bt[4 * DET_CAP];
    for (uint32_t i = 0; i < 4 * DET_CAP; i++) bt[i] = 5200 + i;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &b));
    det_fill(&w, b, bt, 4 * DET_CAP); /* every block: A's slot reused */
    WU_ASSERT(det_table_has(c, b, blk), "A's slot %u was not reused by B", blk);
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    WU_ASSERT(st.evictions == 1 && st.durable_lsn < st.last_lsn,
              "evictions %llu, durable LSN %llu, last %llu", (unsigned long long)st.evictions,
              (unsigned long long)st.durable_lsn, (unsigned long long)st.last_lsn);
}

/* Violation (1): a seal that dedupes onto a recovered (unverified) block must verify
 * its payload first. After the kill, recovery finds A sealed (its EVICT was lost) with
 * B's K/V in its slot. The prompt recomputed from scratch (no prefix attach, so nothing
 * verifies A first) seals an identical block: the table it ends up with must name A's
 * correct K/V. */
Test(crash, seal_dedupe_never_attaches_a_stale_recovered_block)
{
    char dir[512];
    pt_path(dir, sizeof dir, "stale");
    det_child(dir, child_stale_dedupe, 0);
    pkv_options o;
    det_opts(&o);
    o.group_commit_us = 0;
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_stats st0 = pt_stats(c);
    pkv_recovery rec = recovery(c);
    cr_assert_geq(rec.blocks_sealed, 1, "A's SEAL was synced: it must be recovered (blocks_sealed %llu)",
                  (unsigned long long)rec.blocks_sealed);
    wu_recompute(c, 0, det_a, 4, "block A recomputed after the kill");
    pkv_stats st1 = pt_stats(c);
    cr_log_info("stale dedupe: verify_failures %llu -> %llu, dedupes %llu -> %llu",
                (unsigned long long)st0.verify_failures, (unsigned long long)st1.verify_failures,
                (unsigned long long)st0.dedupes, (unsigned long long)st1.dedupes);
    /* the prefix-attach path is right already (it verifies): it must stay right */
    wu_probe(c, 0, det_a, 5, "prompt A + 1 attached after the recompute");
    WU_CHECK(c, "after the probes");
    pkv_close(c);
    c = wu_open_ok(dir, &o); /* and once more after a clean close */
    wu_recompute(c, 0, det_a, 4, "block A recomputed after a further reopen");
    wu_probe(c, 0, det_a, 5, "prompt A + 1 after a further reopen");
    pkv_close(c);
}

/* Child of a_sealed_block_is_not_reused_before_its_seal_is_durable. Sequence S commits
 * 2 tokens into block b; pkv_sync makes the COMMIT naming b as S's open tail durable.
 * Then (nothing more durable) S fills b (seal), b is released -- S closed (variant 0) or
 * truncated to 1 token, which copies the cut sealed block (variant 1) -- so b is cached,
 * and sequence T takes every obtainable block, evicting b and writing its own K/V into
 * the slot. */
static const uint32_t det_s[4] = {6101, 6102, 6103, 6104};

static void child_seal_reuse(const char *dir, int variant)
{
    pkv_options o;
    det_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 43, NULL);
    uint64_t s = 0, t = 0;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &s));
    det_fill(&w, s, det_s, 2);
    uint32_t b = det_block(c, s, 0);
    WU_OK(pkv_sync(c)); /* COMMIT(S: 2 tokens, tail block b) is durable */
    det_fill(&w, s, det_s + 2, 2); /* b full: sealed (SEAL + COMMIT, not durable) */
    if (variant == 0) WU_OK(wu_do_close(&w, s));
    else WU_OK(wu_do_truncate(&w, s, 1));
    WU_CHECK(c, variant ? "S truncated" : "S closed");
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    WU_ASSERT(st.blocks_cached == 1, "b is not cached after the %s (cached %llu)",
              variant ? "truncation" : "close", (unsigned long long)st.blocks_cached);
    uint32_t n = (uint32_t)(st.blocks_free + st.blocks_cached) * WU_BS;
    uint32_t tt[4 * DET_CAP];
    for (uint32_t i = 0; i < n; i++) tt[i] = 7300 + i;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &t));
    det_fill(&w, t, tt, n); /* evicts b, writes T's K/V over S's */
    WU_ASSERT(det_table_has(c, t, b), "b (slot %u) was not reused by T", b);
    WU_OK(pkv_get_stats(c, &st));
    WU_ASSERT(st.durable_lsn < st.last_lsn, "durable LSN %llu, last %llu: the window closed",
              (unsigned long long)st.durable_lsn, (unsigned long long)st.last_lsn);
}

/* The checks after a deterministic child: S (wu_wl's first id, 1000) was acknowledged
 * with ack_n committed tokens of toks, then closed ('C') or truncated to `to` ('T'),
 * and a sequence 1001 opened. The recovered state must follow the oracle (S's length,
 * every committed position's K/V); toks[0, n) recomputed, every recovered sequence
 * recomputed, and toks[0, n) attached, must read back their own K/V. */
static void det_recovery_check(const char *dir, const char *what, const uint32_t *toks,
                               size_t ack_n, size_t n, char kind, size_t to)
{
    wu_oracle orc;
    wu_oracle_init(&orc);
    wu_model ack = {0};
    wu_model_add(&ack, 1000, 0, toks, ack_n, ack_n);
    wu_oracle_ack(&orc, &ack);
    wu_oracle_intent(&orc, kind, 1000, to);
    wu_oracle_intent(&orc, 'O', 1001, 0);
    pkv_options o;
    det_opts(&o);
    o.group_commit_us = 0;
    pkv_cache *c = track(wu_open_ok(dir, &o));
    wu_model rec;
    wu_oracle_check(&orc, c, false, &rec, what);
    cr_log_info("%s: %zu sequence(s) recovered%s", what, rec.n,
                rec.n && rec.s[0].id == 1000 ? ", S among them" : "");
    wu_recompute(c, 0, toks, n, what);
    wu_recompute_all(c, NULL, &rec, NULL, NULL, what);
    wu_probe(c, 0, toks, n, what);
    WU_CHECK(c, what);
    close_tracked(c);
    wu_model_free(&rec);
    wu_model_free(&ack);
    wu_oracle_free(&orc);
}

static void seal_reuse_case(void *arg, int variant)
{
    (void)arg;
    char dir[512], what[200];
    snprintf(what, sizeof what, "S %s after sealing b", variant ? "truncated to 1 token" : "closed");
    pt_path(dir, sizeof dir, variant ? "reuse-trunc" : "reuse-close");
    det_child(dir, child_seal_reuse, variant);
    det_recovery_check(dir, what, det_s, 2, 4, variant ? 'T' : 'C', 1);
}

/* Violation (2) (issue 28): an open block that a durable COMMIT names as a sequence's
 * partial tail is sealed, released and -- being sealed and cached -- evicted and reused
 * at once, before its SEAL is durable. Recovery then restores the sequence with that
 * block still open (no payload checksum to catch it), holding the new owner's K/V. The
 * recovered sequence's committed tokens must hold their own K/V. */
Test(crash, a_sealed_block_is_not_reused_before_its_seal_is_durable)
{
    sweep sw = {0};
    for (int v = 0; v < 2; v++) sweep_case(&sw, seal_reuse_case, NULL, v);
    sweep_report(&sw, "sealed block reused before its SEAL was durable");
}

/* Child of a_truncated_sequence_keeps_its_blocks_until_the_truncation_is_safe. Sequence
 * S commits 8 tokens (blocks b0, b1, both sealed); pkv_sync makes that durable. S is
 * truncated inside a sealed block, which is copied: to 5 tokens (variant & 1; b1 cut) or
 * to 1 (b0 cut, b1 released whole); the TRUNC is not durable yet, and the released blocks
 * are cached. Then T takes every obtainable block, evicting them and writing its own K/V
 * into their slots. variant >> 1 picks the durability mode (GROUP, NONE, ALWAYS). */
static const uint32_t det_r[8] = {8101, 8102, 8103, 8104, 8105, 8106, 8107, 8108};
static const pkv_durability det_modes[3] = {PKV_DURABLE_GROUP, PKV_DURABLE_NONE,
                                            PKV_DURABLE_ALWAYS};

static void child_trunc_reuse(const char *dir, int variant)
{
    pkv_options o;
    det_opts(&o);
    o.durability = det_modes[variant >> 1];
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 47, NULL);
    uint64_t s = 0, t = 0;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &s));
    det_fill(&w, s, det_r, 8);
    uint32_t b1 = det_block(c, s, 1);
    WU_OK(pkv_sync(c)); /* COMMIT(S: 8 tokens, b0 b1 sealed) is durable */
    WU_OK(wu_do_truncate(&w, s, variant & 1 ? 5 : 1));
    WU_CHECK(c, "S truncated");
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    WU_ASSERT(st.blocks_cached == (variant & 1 ? 1u : 2u),
              "the released blocks are not cached after the truncation (cached %llu)",
              (unsigned long long)st.blocks_cached);
    uint32_t n = (uint32_t)(st.blocks_free + st.blocks_cached) * WU_BS;
    uint32_t tt[4 * DET_CAP];
    for (uint32_t i = 0; i < n; i++) tt[i] = 9300 + i;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &t));
    det_fill(&w, t, tt, n); /* evicts b1, writes T's K/V over S's */
    WU_ASSERT(det_table_has(c, t, b1), "b1 (slot %u) was not reused by T", b1);
    /* GROUP and NONE: T's allocation waited for the TRUNC (rule D3); ALWAYS is the
     * control: the truncation returned with its TRUNC durable, nothing to wait for. */
    pkv_stats st2;
    WU_OK(pkv_get_stats(c, &st2));
    if (o.durability != PKV_DURABLE_ALWAYS)
        WU_ASSERT(st2.waits_seal > st.waits_seal, "T evicted without waiting for the TRUNC "
                  "(waits_seal %llu)", (unsigned long long)st2.waits_seal);
}

static void trunc_reuse_case(void *arg, int variant)
{
    (void)arg;
    static const char *mode[3] = {"GROUP", "NONE", "ALWAYS"};
    char dir[512], what[200];
    size_t to = variant & 1 ? 5 : 1;
    snprintf(what, sizeof what, "%s: S (8 tokens, synced) truncated to %zu, its blocks reused",
             mode[variant >> 1], to);
    snprintf(dir, sizeof dir, "%s/trunc-reuse-%d", pt_dir, variant);
    det_child(dir, child_trunc_reuse, variant);
    /* Recovery must give S before the truncation (8 tokens) or after it, never less. */
    det_recovery_check(dir, what, det_r, 8, 8, 'T', to);
}

/* A sealed block that a durable table still names is not rewritten before the record
 * that took it out of the table is safe (rule D3). Truncating below a synced commit
 * releases sealed blocks; were one evicted and rewritten before the TRUNC is safe, a
 * crash would recover the table from before the truncation with a block failing its
 * checksum, cut at that block: shorter than both the acknowledged state and the
 * truncated one. Every durability mode; the cut in the first block and in the second. */
Test(crash, a_truncated_sequence_keeps_its_blocks_until_the_truncation_is_safe)
{
    sweep sw = {0};
    for (int v = 0; v < 6; v++) sweep_case(&sw, trunc_reuse_case, NULL, v);
    sweep_report(&sw, "sealed block released by a truncation reused before the TRUNC was safe");
}

/* ---- fork after use ----------------------------------------------------------------------
 * A process that used a cache and then forks: the child must be able to open a cache.
 * The default backend writes the log through an io_uring ring per thread (src/wal/io.c,
 * thread_ring), kept in a pthread key; a forked child inherits the forking thread's
 * ring -- its mappings are shared with the parent, its user-space head and tail copied.
 * Once one child has submitted through it, the copies the parent and later children
 * hold are stale: io_uring_get_sqe sees the ring full and returns NULL, and the next
 * write through it (the log segment header a fresh cache's open writes) dereferences
 * NULL. Here: the parent creates a cache (one write through its main thread's ring);
 * child 1 creates another and exits; child 2 creates a third. */
static void fork_open_child(const char *dir, int arg)
{
    (void)arg;
    pkv_options o;
    wu_opts(&o, WU_BS, 16, PKV_DURABLE_GROUP);
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_close(c);
    _exit(0);
}

Test(crash, a_forked_child_can_open_a_cache)
{
    char d0[512], d1[512], d2[512];
    pt_path(d0, sizeof d0, "fork0");
    pt_path(d1, sizeof d1, "fork1");
    pt_path(d2, sizeof d2, "fork2");
    pkv_options o;
    wu_opts(&o, WU_BS, 16, PKV_DURABLE_GROUP);
    pkv_close(wu_open_ok(d0, &o)); /* this thread's ring exists now */
    for (int i = 0; i < 2; i++) {
        fflush(NULL);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            wu_in_child = true;
            fork_open_child(i ? d2 : d1, 0);
        }
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "child %d, forked after this process used a cache, failed to create one "
                  "(exit status %d, signal %d)", i + 1, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                  WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
}

/* ---- Rule D8: the unsynced marker ------------------------------------------------------------ */

static bool marker_exists(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/unsynced", dir);
    return access(p, F_OK) == 0;
}

/* A NONE-mode writer that dies holding a sequence with 2 committed tokens in an open tail
 * (and 4 in a sealed block before it). */
static void none_writer_dies(const char *dir)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        wu_in_child = true;
        pkv_options o;
        wu_opts(&o, WU_BS, 64, PKV_DURABLE_NONE);
        pkv_cache *c = wu_open_ok(dir, &o);
        wu_wl w;
        wu_wl_init(&w, c, 5, NULL);
        uint32_t t[6] = {40, 41, 42, 43, 44, 45};
        uint64_t id = 0;
        WU_OK(wu_do_open(&w, 0, t, 6, 0, &id));
        WU_OK(pkv_sync(c));
        _exit(0); /* no pkv_close: the marker stays */
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the NONE-mode writer failed");
}

/* A NONE-mode writer leaves the marker while it runs; recovery on the same boot keeps
 * the open tails (a process crash loses nothing of the page cache), recovery on
 * another boot cuts them, says so in the note, and the repaired state stays; a clean
 * close removes the marker, and a writer in another mode writes none. */
Test(crash, open_tails_of_a_none_writer_are_cut_after_a_restart)
{
    char dir[512];
    pt_path(dir, sizeof dir, "marker");
    none_writer_dies(dir);
    cr_assert(marker_exists(dir), "a NONE-mode writer that died left no marker");
    /* same boot: read-only view keeps the 6 committed tokens */
    pkv_options o;
    wu_opts(&o, WU_BS, 0, PKV_DURABLE_GROUP);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *c = wu_open_ok(dir, &o);
    uint64_t ids[4];
    size_t n = 0;
    WU_OK(pkv_seq_list(c, ids, 4, &n));
    cr_assert_eq(n, 1);
    pkv_seq_info si;
    WU_OK(pkv_seq_get_info(c, ids[0], &si));
    cr_assert_eq(si.committed, 6, "same boot: %llu committed", (unsigned long long)si.committed);
    pkv_close(c);
    /* another boot: the tail is cut (a read-only view, then a writer) */
    o.io = rebooted_io();
    for (int k = 0; k < 2; k++) {
        o.flags = k ? 0 : PKV_OPEN_RDONLY;
        c = wu_open_ok(dir, &o);
        WU_OK(pkv_seq_get_info(c, ids[0], &si));
        cr_assert_eq(si.committed, 4, "after a restart: %llu committed, the tail of 2 kept",
                     (unsigned long long)si.committed);
        pkv_recovery rec = recovery(c);
        cr_assert_eq(rec.sequences_cut, 1);
        cr_assert(strstr(rec.note, "rule D8"), "note: %s", rec.note);
        pkv_close(c);
    }
    cr_assert(!marker_exists(dir), "a GROUP-mode writer kept the marker");
    o.io = NULL;
    c = wu_open_ok(dir, &o);
    WU_OK(pkv_seq_get_info(c, ids[0], &si));
    cr_assert_eq(si.committed, 4, "the cut is persisted");
    pkv_close(c);
    /* a clean close of a NONE-mode writer removes its marker */
    wu_opts(&o, WU_BS, 0, PKV_DURABLE_NONE);
    c = wu_open_ok(dir, &o);
    cr_assert(marker_exists(dir), "a running NONE-mode writer has no marker");
    pkv_close(c);
    cr_assert(!marker_exists(dir), "a clean close left the marker");
}

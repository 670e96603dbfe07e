/* pkvd and pkv_connect (docs/pkvd.md), against the real daemon: the binary named
 * by $PKVD, started as a child process on a socket in the test's temp directory.
 *
 * Specifications checked here:
 *  - two client processes share a prefix: the second attaches the first's blocks
 *    (the same block ids) and reads its K/V in place through its own mapping of
 *    the arena, equal to the K/V of the exact prefix;
 *  - four client processes share a system prompt: every open after the first
 *    attaches it, and through decode steps, forks, truncations inside a block
 *    and new continuations every sequence's tokens and K/V stay those of its
 *    exact prefix; afterwards the blocks used are back where they were;
 *  - the sequence calls on a connected handle behave as on a local one (open,
 *    append, commit, commit_append, step_batch, fork, truncate, info, blocks,
 *    tokens, stats, sync, lookup), K/V verified after each;
 *  - a client killed with SIGKILL at random points releases everything: the
 *    daemon's used blocks and sequences return to their values before it
 *    connected, other clients are unaffected, and pkv_check of the directory
 *    is clean afterwards;
 *  - a killed daemon gives PKV_EDISCONNECTED on the next call and every later
 *    one; a restarted daemon recovers the directory: the committed prefix is
 *    found again and its K/V is the prefix's;
 *  - malformed frames (bad magic, version, length, op, payload size, no HELLO,
 *    HELLO twice, a truncated frame) get an error reply and end only their own
 *    connection; well-formed hostile requests (another client's ids, a
 *    sequence twice in a batch) get the documented errors;
 *  - peers of another protocol version are refused with PKV_EVERSION and
 *    "protocol version X, expected Y" on both sides, never misparsed
 *    (docs/pkvd.md, "Versions").
 * K/V follows pkv_test.h's convention: a pure function of (salt, prefix). */
#include "http_get.h"
#include "pkv_test.h"

#include <arpa/inet.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

TestSuite(pkvd, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
#define CAP 64u

static char sock_path[300], dir_path[300];
/* Options that replace the default geometry of the next daemon_start (NULL-ended). */
static const char *const *geometry;

static void daemon_paths(void)
{
    pt_path(dir_path, sizeof dir_path, "cache");
    pt_path(sock_path, sizeof sock_path, "pkvd.sock");
}

/* Start pkvd on dir_path / sock_path (extra arguments: up to 4, NULL-ended),
 * its stderr to `log` (NULL: the test's). *ready: the read end of its
 * --ready-fd pipe. */
static pid_t daemon_spawn(const char *x1, const char *x2, const char *x3, const char *x4,
                          const char *log, int *ready)
{
    const char *bin = getenv("PKVD");
    cr_assert(bin && bin[0], "$PKVD (the daemon binary) is not set");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no daemon behind */
        close(p[0]);
        if (log) {
            int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (lf < 0 || dup2(lf, 2) < 0) _exit(126);
            close(lf);
        }
        char fd[16], cap[16], bs[16];
        snprintf(fd, sizeof fd, "%d", p[1]);
        snprintf(cap, sizeof cap, "%u", CAP);
        snprintf(bs, sizeof bs, "%u", BS);
        const char *argv[40] = {bin, "--dir", dir_path, "--socket", sock_path, "--ready-fd", fd,
              "--layers", "2", "--kv-heads", "2", "--head-dim", "4", "--block-size", bs,
              "--dtype", "f32", "--capacity", cap, "--model-id", PT_MODEL};
        size_t na = 21;
        for (size_t i = 0; geometry && geometry[i]; i++) argv[na++] = geometry[i]; /* later wins */
        const char *x[4] = {x1, x2, x3, x4};
        for (size_t i = 0; i < 4 && x[i]; i++) argv[na++] = x[i];
        argv[na] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    *ready = p[0];
    return pid;
}

/* Wait up to ms for the READY line on `ready`: 1 ready, 0 not yet, -1 the pipe
 * closed without it (pkvd exited). */
static int wait_ready(int ready, int ms)
{
    struct pollfd pf = {.fd = ready, .events = POLLIN};
    if (poll(&pf, 1, ms) != 1) return 0;
    char buf[8] = "";
    return read(ready, buf, 6) == 6 && !memcmp(buf, "READY\n", 6) ? 1 : -1;
}

/* daemon_spawn and wait for its READY line. */
static pid_t daemon_start_with(const char *x1, const char *x2, const char *x3,
                               const char *x4)
{
    int ready;
    pid_t pid = daemon_spawn(x1, x2, x3, x4, NULL, &ready);
    int r = wait_ready(ready, 20000);
    close(ready);
    cr_assert(r != 0, "pkvd did not get ready in 20 s");
    cr_assert(r == 1, "pkvd exited before it was ready");
    return pid;
}

static pid_t daemon_start(void)
{
    return daemon_start_with(NULL, NULL, NULL, NULL);
}

static void daemon_stop(pid_t pid, int sig)
{
    cr_assert_eq(kill(pid, sig), 0);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (sig == SIGTERM)
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pkvd ended with status 0x%x", st);
}

static pkv_cache *connect_ok(void)
{
    pkv_cache *c = NULL;
    int r = pkv_connect(sock_path, &c);
    cr_assert_eq(r, 0, "pkv_connect -> %d (%s: %s)", r, pkv_strerror(r), pkv_last_error());
    return c;
}

/* Append all[len..len+n) to id, write the K/V of each slot, commit them all.
 * Works on connected handles (PT_APPEND runs pkv_check, a local-only call). */
static void add_commit(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *all,
                       size_t len, size_t n)
{
    pkv_cache_info inf = pt_info(c);
    pkv_slot slots[64];
    cr_assert(n <= 64);
    PT_OK(pkv_seq_append(c, id, all + len, n, slots));
    uint64_t h = pt_hprefix(salt, all, len);
    for (size_t i = 0; i < n; i++) {
        h = pt_hstep(h, all[len + i]);
        pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
    }
    PT_OK(pkv_seq_commit(c, id, n));
}

/* pkv_seq_open asserting success (PT_SEQ_OPEN runs pkv_check, a local-only call). */
static size_t sopen_at(int line, pkv_cache *c, uint64_t id, const uint32_t *p, size_t n)
{
    size_t nc = 12345;
    int r = pkv_seq_open(c, id, 0, p, n, &nc);
    cr_assert_eq(r, 0, "line %d: pkv_seq_open -> %d (%s: %s)", line, r, pkv_strerror(r),
                 pkv_last_error());
    return nc;
}
#define SOPEN(c, id, p, n) sopen_at(__LINE__, (c), (id), (p), (n))

/* Open id with prompt p (salt 0), add and commit what was not cached. */
static size_t open_fill(pkv_cache *c, uint64_t id, const uint32_t *p, size_t n)
{
    size_t nc = SOPEN(c, id, p, n);
    if (n > nc) add_commit(c, id, 0, p, nc, n - nc);
    PT_VERIFY(c, id, 0, p, n, n);
    return nc;
}

/* Check the directory offline (the daemon stopped): pkv_check and no sequence. */
static void offline_check(void)
{
    pkv_options o;
    pt_opts(&o, 2, 2, 4, BS, PKV_F32, CAP);
    pkv_cache *c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pt_close(c);
}

static void prompt(uint32_t *p, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++) p[i] = base + (uint32_t)i * 7;
}

/* The daemon releases a closed connection's sequences as soon as it sees the
 * end of the stream, which a client's pkv_close or death does not wait for:
 * poll (a second at most) until the daemon holds `n` sequences. */
static pkv_stats wait_sequences(pkv_cache *obs, uint64_t n)
{
    pkv_stats s = pt_stats(obs);
    for (int t = 0; t < 1000 && s.sequences != n; t++) {
        struct timespec w = {0, 1000000L};
        nanosleep(&w, NULL);
        s = pt_stats(obs);
    }
    return s;
}

/* ---- Two processes, one prefix ---------------------------------------------------- */

Test(pkvd, two_processes_share_a_prefix_and_read_its_kv_in_place)
{
    daemon_paths();
    pid_t d = daemon_start();
    uint32_t p[25];
    prompt(p, 25, 500);
    pkv_cache *a = connect_ok();
    cr_assert_eq(open_fill(a, 1, p, 25), 0);
    uint32_t tab_a[8];
    cr_assert_eq(PT_BLOCKS(a, 1, tab_a, 8), 7);
    /* The second client, a process of its own: its sequence 1 is its own (ids
     * are per connection), it attaches A's six sealed blocks and reads A's K/V in
     * its own mapping. It reports through its exit status. */
    int rp[2];
    cr_assert_eq(pipe(rp), 0);
    pid_t b = fork();
    cr_assert(b >= 0);
    if (b == 0) {
        close(rp[0]);
        pkv_cache *c = NULL;
        uint32_t tab[8];
        size_t nc = 0, nb = 0, looked = 0;
        int ok = pkv_connect(sock_path, &c) == 0 &&
                 pkv_prefix_lookup(c, 0, p, 25, &looked) == 0 && looked == 24 &&
                 pkv_seq_open(c, 1, 0, p, 25, &nc) == 0 && nc == 24 &&
                 pkv_seq_blocks(c, 1, tab, 8, &nb) == 0 && nb == 6 &&
                 memcmp(tab, tab_a, 6 * sizeof *tab) == 0;
        pkv_cache_info inf;
        char err[256];
        uint64_t h = pt_h0(0);
        for (size_t t = 0; ok && t < 24; t++) {
            h = pt_hstep(h, p[t]);
            ok = pkv_info(c, &inf) == 0 &&
                 pt_token_ok(c, &inf, tab[t / BS], (uint32_t)(t % BS), h, err, sizeof err);
        }
        ssize_t w = write(rp[1], &ok, sizeof ok);
        (void)w;
        pkv_close(c);
        _exit(ok ? 0 : 1);
    }
    close(rp[1]);
    int st = 0, ok = 0;
    cr_assert_eq(read(rp[0], &ok, sizeof ok), (ssize_t)sizeof ok);
    cr_assert_eq(waitpid(b, &st, 0), b);
    cr_assert(ok && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the second process did not attach and read the first's K/V (status 0x%x)", st);
    pkv_stats s = wait_sequences(a, 1);
    cr_assert_eq(s.sequences, 1, "the second client's sequence was released at its exit");
    cr_assert_eq(s.hit_blocks, 6);
    pkv_close(a);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- Four processes, one system prompt ------------------------------------------------ */

#define FOUR_SYS 16u /* the shared system prompt: four full blocks */
#define FOUR_MAX 64u /* tokens a sequence of the four-client test reaches at most */

/* What a four-client test client knows of one of its sequences: the tokens it
 * put there and how many of them it committed. */
typedef struct four_seq {
    uint64_t id;
    uint32_t t[FOUR_MAX];
    size_t len, committed;
} four_seq;

/* A client's counts, sent to the test at its end: they must equal the daemon's
 * hit and miss counters. */
typedef struct four_report {
    uint64_t opens, hit, miss;
} four_report;

static char four_who[64]; /* the client and iteration, for failure messages */

/* A failing call ends the client with status 2, after saying which. */
#define FOUR_TRY(expr)                                                                   \
    do {                                                                                 \
        int r_ = (expr);                                                                 \
        if (r_) {                                                                        \
            fprintf(stderr, "four: %s: line %d: %s -> %d (%s: %s)\n", four_who, __LINE__, \
                    #expr, r_, pkv_strerror(r_), pkv_last_error());                      \
            _exit(2);                                                                    \
        }                                                                                \
    } while (0)

static void four_sys(uint32_t *p)
{
    for (uint32_t i = 0; i < FOUR_SYS; i++) p[i] = 1000 + 3 * i;
}

/* Whether the daemon's view of s (info, tokens, block table) is the client's and
 * every position holds the K/V of its exact prefix, read in place through the
 * client's mapping. Says what differs on stderr: a forked client must not
 * cr_assert, it reports through its exit status. */
static bool four_seq_ok(pkv_cache *c, const pkv_cache_info *inf, const four_seq *s,
                        const char *step)
{
    pkv_seq_info si;
    uint32_t toks[FOUR_MAX + 1], tab[FOUR_MAX / BS + 2];
    size_t nt = 0, nb = 0, want_nb = (s->len + BS - 1) / BS;
    char err[256] = "";
    int rc = pkv_seq_get_info(c, s->id, &si);
    if (!rc && (si.len != s->len || si.committed != s->committed || si.n_blocks != want_nb ||
                si.salt != 0))
        snprintf(err, sizeof err, "info: len %llu committed %llu blocks %llu salt %llu, "
                 "expected %zu %zu %zu 0", (unsigned long long)si.len,
                 (unsigned long long)si.committed, (unsigned long long)si.n_blocks,
                 (unsigned long long)si.salt, s->len, s->committed, want_nb);
    if (!rc && !err[0]) {
        rc = pkv_seq_tokens(c, s->id, toks, FOUR_MAX + 1, &nt);
        if (!rc && (nt != s->len || memcmp(toks, s->t, nt * sizeof *toks)))
            snprintf(err, sizeof err, "tokens differ (%zu of %zu)", nt, s->len);
    }
    if (!rc && !err[0]) {
        rc = pkv_seq_blocks(c, s->id, tab, FOUR_MAX / BS + 2, &nb);
        if (!rc && nb != want_nb)
            snprintf(err, sizeof err, "%zu blocks, expected %zu", nb, want_nb);
    }
    uint64_t h = pt_h0(0);
    for (size_t p = 0; !rc && !err[0] && p < s->len; p++) {
        h = pt_hstep(h, s->t[p]);
        char why[200];
        if (!pt_token_ok(c, inf, tab[p / BS], (uint32_t)(p % BS), h, why, sizeof why))
            snprintf(err, sizeof err, "position %zu of %zu (committed %zu): %s", p, s->len,
                     s->committed, why);
    }
    if (rc) snprintf(err, sizeof err, "reading it back -> %d (%s)", rc, pkv_strerror(rc));
    if (!err[0]) return true;
    fprintf(stderr, "four: %s: sequence %llu after %s: %s\n", four_who,
            (unsigned long long)s->id, step, err);
    return false;
}

#define FOUR_CHECK(s, step)                                                              \
    do {                                                                                 \
        if (!four_seq_ok(c, &inf, (s), (step))) _exit(1);                                \
    } while (0)

/* Write the K/V of s->t[from..from+n) into the slots the daemon handed out. */
static void four_fill(pkv_cache *c, const pkv_cache_info *inf, const four_seq *s,
                      size_t from, const pkv_slot *slots, size_t n)
{
    uint64_t h = pt_hprefix(0, s->t, from);
    for (size_t i = 0; i < n; i++) {
        h = pt_hstep(h, s->t[from + i]);
        pt_write_token(c, inf, slots[i].block, slots[i].offset, h);
    }
}

/* One of the four clients: `iters` times, open the system prompt plus a tail of
 * its own (the first four tail tokens from a 2-letter alphabet, so clients also
 * meet on tail blocks), check the attached K/V, write and commit the rest, decode
 * 2-5 steps, fork, one more step of the parent (into the block it shares with the
 * fork), one time in four close the parent, truncate the fork into the middle of
 * a block, give it another continuation, one step batch over both, close both;
 * every sequence checked after every step. Client 0 writes 3 bytes to go_w once its first prompt is
 * committed; the others wait for one before their first open, so each of their
 * opens, and every later one of client 0, must attach the whole system prompt.
 * Exit status: 0 done (report written), 1 wrong K/V or state, 2 a call failed,
 * 3 the system prompt missed, 4 never got to go. */
static _Noreturn void four_client(uint32_t client, int go_r, int go_w, int report,
                                  uint32_t iters)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    snprintf(four_who, sizeof four_who, "client %u", client);
    close(client > 0 ? go_w : go_r); /* so a reader sees EOF if client 0 dies */
    pkv_cache *c = NULL;
    FOUR_TRY(pkv_connect(sock_path, &c));
    pkv_cache_info inf;
    FOUR_TRY(pkv_info(c, &inf));
    if (client > 0) {
        char g;
        if (read(go_r, &g, 1) != 1) {
            fprintf(stderr, "four: client %u: client 0 never committed the system prompt\n",
                    client);
            _exit(4);
        }
    }
    pt_rng r = {.s = 0xf00du + client};
    four_report rep = {0};
    static four_seq a, b;
    pkv_slot slots[FOUR_MAX];
    for (uint32_t it = 0; it < iters; it++) {
        snprintf(four_who, sizeof four_who, "client %u iteration %u", client, it);
        bool first = client == 0 && it == 0;
        a.id = 2 * (uint64_t)it + 1;
        size_t n = FOUR_SYS + 2 + pt_below(&r, 11);
        four_sys(a.t);
        for (size_t j = FOUR_SYS; j < n; j++)
            a.t[j] = j < FOUR_SYS + 4 ? 7000 + pt_below(&r, 2) : 40000 + pt_below(&r, 1u << 20);
        size_t looked = 0, nc = 0;
        FOUR_TRY(pkv_prefix_lookup(c, 0, a.t, n, &looked));
        FOUR_TRY(pkv_seq_open(c, a.id, 0, a.t, n, &nc));
        rep.opens++, rep.hit += nc, rep.miss += n - nc;
        /* No eviction (the test sizes the capacity for that): what a lookup
         * found is still there at the open. */
        if (first ? nc != 0 || looked != 0
                  : nc < FOUR_SYS || looked < FOUR_SYS || looked > nc || nc % BS || nc >= n) {
            fprintf(stderr, "four: %s: open of %zu tokens attached %zu, lookup found %zu; "
                    "expected %s\n", four_who, n, nc, looked,
                    first ? "0 (the first open)" : "the system prompt at least");
            _exit(3);
        }
        a.len = a.committed = nc;
        FOUR_CHECK(&a, "open");
        FOUR_TRY(pkv_seq_append(c, a.id, a.t + nc, n - nc, slots));
        four_fill(c, &inf, &a, nc, slots, n - nc);
        a.len = n;
        FOUR_CHECK(&a, "append");
        FOUR_TRY(pkv_seq_commit(c, a.id, n - nc));
        a.committed = n;
        FOUR_CHECK(&a, "commit");
        if (first && write(go_w, "ggg", 3) != 3) _exit(2);
        /* decode: commit the last token and append the next, one call a step */
        uint32_t steps = 2 + pt_below(&r, 4);
        for (uint32_t d = 0; d < steps; d++) {
            size_t pend = a.len - a.committed;
            a.t[a.len] = 20000 + pt_below(&r, 1000);
            pkv_slot sl;
            if ((d + it) % 2) {
                FOUR_TRY(pkv_seq_commit_append(c, a.id, pend, &a.t[a.len], 1, &sl));
            } else {
                pkv_step st = {.id = a.id, .n_commit = (uint32_t)pend, .token = a.t[a.len]};
                size_t done = 0;
                FOUR_TRY(pkv_seq_step_batch(c, &st, 1, &done));
                if (done != 1) _exit(2);
                sl = st.slot;
            }
            a.committed = a.len++;
            four_fill(c, &inf, &a, a.len - 1, &sl, 1);
            FOUR_CHECK(&a, "a decode step");
        }
        FOUR_TRY(pkv_seq_commit(c, a.id, 1));
        a.committed = a.len;
        FOUR_CHECK(&a, "the last decode commit");
        /* fork, then cut the fork inside a block (shared with the parent, so it
         * is copied) and continue it differently */
        b = a;
        b.id = a.id + 1;
        FOUR_TRY(pkv_seq_fork(c, a.id, b.id));
        FOUR_CHECK(&a, "fork (parent)");
        FOUR_CHECK(&b, "fork (child)");
        /* the parent decodes into the partial block it shares with the fork */
        pkv_slot sl;
        a.t[a.len] = 20000 + pt_below(&r, 1000);
        FOUR_TRY(pkv_seq_commit_append(c, a.id, 0, &a.t[a.len], 1, &sl));
        a.len++;
        four_fill(c, &inf, &a, a.len - 1, &sl, 1);
        FOUR_CHECK(&a, "a step after the fork (parent)");
        FOUR_CHECK(&b, "a step after the fork (child)");
        FOUR_TRY(pkv_seq_commit(c, a.id, 1));
        a.committed = a.len;
        /* One time in four the parent goes first: the fork's cut block is then
         * sealed but no longer shared. */
        bool both = pt_below(&r, 4) != 0;
        if (!both) {
            FOUR_TRY(pkv_seq_close(c, a.id));
            FOUR_CHECK(&b, "closing the parent");
        }
#define FOUR_CHECK_BOTH(step)                                                            \
    do {                                                                                 \
        if (both) FOUR_CHECK(&a, step " (parent)");                                      \
        FOUR_CHECK(&b, step " (fork)");                                                  \
    } while (0)
        size_t cut = 1 + pt_below(&r, (uint32_t)b.len - 1);
        if (cut % BS == 0) cut--;
        FOUR_TRY(pkv_seq_truncate(c, b.id, cut));
        b.len = b.committed = cut;
        FOUR_CHECK_BOTH("truncating the fork");
        size_t m = 1 + pt_below(&r, 2 * BS);
        for (size_t j = 0; j < m; j++)
            b.t[cut + j] = j == 0 ? a.t[cut] + 1 : 30000 + pt_below(&r, 1000);
        FOUR_TRY(pkv_seq_append(c, b.id, b.t + cut, m, slots));
        four_fill(c, &inf, &b, cut, slots, m);
        b.len = cut + m;
        FOUR_CHECK_BOTH("the fork's continuation");
        /* one decode step of both in one batch, committing the continuation */
        pkv_step st[2] = {{.id = b.id, .n_commit = (uint32_t)m,
                           .token = 60000 + pt_below(&r, 1000)},
                          {.id = a.id, .token = 50000 + pt_below(&r, 1000)}};
        b.t[b.len] = st[0].token;
        a.t[a.len] = st[1].token;
        size_t done = 0, nst = both ? 2 : 1;
        FOUR_TRY(pkv_seq_step_batch(c, st, nst, &done));
        if (done != nst) _exit(2);
        b.committed = b.len++;
        four_fill(c, &inf, &b, b.len - 1, &st[0].slot, 1);
        FOUR_TRY(pkv_seq_commit(c, b.id, 1));
        b.committed = b.len;
        if (both) {
            a.len++;
            four_fill(c, &inf, &a, a.len - 1, &st[1].slot, 1);
            FOUR_TRY(pkv_seq_commit(c, a.id, 1));
            a.committed = a.len;
        }
        FOUR_CHECK_BOTH("the step batch and its commit");
#undef FOUR_CHECK_BOTH
        if (both && pt_below(&r, 2)) {
            FOUR_TRY(pkv_seq_close(c, a.id));
            both = false;
            FOUR_CHECK(&b, "closing the parent");
        }
        FOUR_TRY(pkv_seq_close(c, b.id));
        if (both) {
            FOUR_CHECK(&a, "closing the fork");
            FOUR_TRY(pkv_seq_close(c, a.id));
        }
    }
    pkv_close(c);
    if (write(report, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(2);
    _exit(0);
}

Test(pkvd, four_processes_share_a_system_prompt_fork_and_truncate_with_exact_kv)
{
    uint32_t iters = (uint32_t)pt_env_u64("PKV_PKVD_FOUR_ITERS", 100);
    cr_assert(iters >= 1 && iters <= 100000, "PKV_PKVD_FOUR_ITERS %u (1 to 100000)", iters);
    /* Room for every block the run leaves cached (at most 16 per client and
     * iteration), so nothing is evicted and every hit below is exact. */
    uint64_t cap = 64 + (uint64_t)iters * 4 * 16;
    char capstr[24];
    snprintf(capstr, sizeof capstr, "%llu", (unsigned long long)cap);
    const char *const big[] = {"--capacity", capstr, NULL};
    daemon_paths();
    geometry = big;
    pid_t d = daemon_start();
    geometry = NULL;
    pkv_cache *obs = connect_ok();
    pkv_stats s0 = pt_stats(obs);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    pid_t cl[4];
    int rep[4];
    for (uint32_t i = 0; i < 4; i++) {
        int rp[2];
        cr_assert_eq(pipe(rp), 0);
        cl[i] = fork();
        cr_assert(cl[i] >= 0);
        if (cl[i] == 0) {
            close(rp[0]);
            four_client(i, go[0], go[1], rp[1], iters);
        }
        close(rp[1]);
        rep[i] = rp[0];
    }
    close(go[0]), close(go[1]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st[4];
    uint64_t peak = 0; /* the most sequences seen open at once: how much the clients overlap */
    for (int i = 0; i < 4; i++) {
        pid_t got = 0;
        for (long t = 0; t < (60 + (long)iters) * 100; t++) {
            if ((got = waitpid(cl[i], &st[i], WNOHANG)) != 0) break;
            pkv_stats x;
            if (pkv_get_stats(obs, &x) == 0 && x.sequences > peak) peak = x.sequences;
            usleep(10000);
        }
        if (got != cl[i])
            for (int j = 0; j < 4; j++) kill(cl[j], SIGKILL); /* none outlives the test */
        cr_assert_eq(got, cl[i], "client %d did not finish %u iterations in %u s", i, iters,
                     60 + iters);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    four_report sum = {0};
    for (int i = 0; i < 4; i++) {
        cr_assert(WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == 0,
                  "client %d: status 0x%x (1: wrong K/V or state, 2: a call failed, 3: the "
                  "system prompt missed, 4: never started; its stderr says more)", i, st[i]);
        four_report one;
        cr_assert_eq(read(rep[i], &one, sizeof one), (ssize_t)sizeof one);
        close(rep[i]);
        sum.opens += one.opens, sum.hit += one.hit, sum.miss += one.miss;
    }
    cr_assert_eq(sum.opens, 4 * (uint64_t)iters);
    /* The daemon releases each client's sequences when it sees the stream end. */
    pkv_stats s = wait_sequences(obs, s0.sequences);
    for (int t = 0; t < 1000 && s.blocks_used != s0.blocks_used; t++) {
        usleep(1000);
        s = pt_stats(obs);
    }
    cr_assert(s.sequences == s0.sequences && s.blocks_used == s0.blocks_used,
              "after the clients: %llu sequences, %llu blocks used; %llu and %llu before",
              (unsigned long long)s.sequences, (unsigned long long)s.blocks_used,
              (unsigned long long)s0.sequences, (unsigned long long)s0.blocks_used);
    cr_assert_eq(s.capacity, s.blocks_free + s.blocks_cached + s.blocks_used);
    cr_assert_eq(s.evictions, s0.evictions, "evictions make the hit checks inexact");
    cr_assert_eq(s.hit_tokens - s0.hit_tokens, sum.hit, "the daemon counted %llu hit tokens, "
                 "the clients attached %llu", (unsigned long long)(s.hit_tokens - s0.hit_tokens),
                 (unsigned long long)sum.hit);
    cr_assert_eq(s.miss_tokens - s0.miss_tokens, sum.miss);
    cr_assert(sum.hit >= (sum.opens - 1) * FOUR_SYS);
    cr_assert(s.cow_copies - s0.cow_copies >= sum.opens, "each truncation of a fork copies "
              "its cut block: %llu copies", (unsigned long long)(s.cow_copies - s0.cow_copies));
    /* After it all, the system prompt is still cached with its K/V. */
    uint32_t p[FOUR_SYS + 1];
    four_sys(p);
    p[FOUR_SYS] = 1;
    cr_assert_eq(open_fill(obs, 1, p, FOUR_SYS + 1), FOUR_SYS);
    PT_OK(pkv_seq_close(obs, 1));
    pkv_close(obs);
    daemon_stop(d, SIGTERM);
    pkv_options o;
    pt_opts(&o, 2, 2, 4, BS, PKV_F32, cap);
    pkv_cache *c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pt_close(c);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_log_info("4 clients x %u iterations in %.2f s: %llu hit tokens, %llu missed, %llu "
                "copies, at most %llu sequences open at once (of 8)", iters, secs,
                (unsigned long long)sum.hit, (unsigned long long)sum.miss,
                (unsigned long long)(s.cow_copies - s0.cow_copies), (unsigned long long)peak);
}

/* ---- The calls through a connected handle ---------------------------------------- */

Test(pkvd, sequence_calls_behave_as_on_a_local_handle)
{
    daemon_paths();
    pid_t d = daemon_start();
    pkv_cache *c = connect_ok();
    pkv_cache_info inf = pt_info(c);
    cr_assert(inf.block_size == BS && inf.capacity == CAP && !strcmp(inf.model_id, PT_MODEL));
    uint32_t p[40];
    prompt(p, 40, 9000);
    size_t nc = 9;
    PT_OK(pkv_prefix_lookup(c, 0, p, 13, &nc));
    cr_assert_eq(nc, 0);
    open_fill(c, 1, p, 13);
    /* commit_append: the decode step */
    pkv_slot sl;
    uint64_t h = pt_hprefix(0, p, 13);
    PT_OK(pkv_seq_commit_append(c, 1, 0, &p[13], 1, &sl));
    pt_write_token(c, &inf, sl.block, sl.offset, pt_hstep(h, p[13]));
    PT_OK(pkv_seq_commit_append(c, 1, 1, &p[14], 1, &sl));
    pt_write_token(c, &inf, sl.block, sl.offset, pt_hstep(pt_hprefix(0, p, 14), p[14]));
    PT_OK(pkv_seq_commit(c, 1, 1));
    PT_VERIFY(c, 1, 0, p, 15, 15);
    /* fork, then a step batch over both */
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_ERR(pkv_seq_fork(c, 1, 2), PKV_EEXIST);
    uint32_t q[40];
    memcpy(q, p, sizeof q);
    q[15] = 77777;
    pkv_step steps[2] = {{.id = 1, .token = p[15]}, {.id = 2, .token = q[15]}};
    size_t done = 0;
    PT_OK(pkv_seq_step_batch(c, steps, 2, &done));
    cr_assert_eq(done, 2);
    pt_write_token(c, &inf, steps[0].slot.block, steps[0].slot.offset,
                   pt_hprefix(0, p, 16));
    pt_write_token(c, &inf, steps[1].slot.block, steps[1].slot.offset,
                   pt_hprefix(0, q, 16));
    pkv_step again[2] = {{.id = 1, .n_commit = 1, .token = p[16]}, {.id = 99, .token = 1}};
    PT_ERR(pkv_seq_step_batch(c, again, 2, &done), PKV_ENOSEQ);
    cr_assert_eq(done, 1, "the batch stops at the unknown sequence");
    pt_write_token(c, &inf, again[0].slot.block, again[0].slot.offset, pt_hprefix(0, p, 17));
    PT_OK(pkv_seq_commit(c, 1, 1));
    PT_OK(pkv_seq_commit(c, 2, 1));
    PT_VERIFY(c, 1, 0, p, 17, 17);
    PT_VERIFY(c, 2, 0, q, 16, 16);
    /* truncate, tokens with a short buffer, info */
    PT_OK(pkv_seq_truncate(c, 1, 10));
    PT_VERIFY(c, 1, 0, p, 10, 10);
    PT_ERR(pkv_seq_truncate(c, 1, 11), PKV_ERANGE);
    uint32_t out[4];
    size_t n = 0;
    PT_ERR(pkv_seq_tokens(c, 2, out, 4, &n), PKV_ERANGE);
    cr_assert(n == 16 && out[0] == q[0] && out[3] == q[3]);
    pkv_seq_info si = PT_SEQ_INFO(c, 2);
    cr_assert(si.len == 16 && si.committed == 16 && si.n_blocks == 4);
    /* errors as documented, messages included */
    PT_ERR(pkv_seq_open(c, 1, 0, p, 3, NULL), PKV_EEXIST);
    PT_ERR(pkv_seq_commit(c, 1, 5), PKV_ESTATE);
    PT_ERR(pkv_seq_close(c, 42), PKV_ENOSEQ);
    cr_assert(strstr(pkv_last_error(), "42"), "message '%s'", pkv_last_error());
    PT_ERR(pkv_seq_append(c, 1, p, 0, &sl), PKV_EINVAL);
    PT_ERR(pkv_check(c, NULL, 0), PKV_ENOTSUP);
    PT_ERR(pkv_checkpoint(c), PKV_ENOTSUP);
    PT_OK(pkv_sync(c));
    PT_OK(pkv_seq_close(c, 2));
    pkv_stats s = pt_stats(c);
    cr_assert(s.sequences == 1 && s.capacity == CAP);
    pkv_close(c);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- Client death ---------------------------------------------------------------------- */

/* A client that opens sequences over a shared prefix, appends (pending), commits
 * part, forks, forever, until killed. It writes one byte to `ready` once its first
 * sequence is open. */
static void busy_client(uint32_t seed, int ready)
{
    pkv_cache *c = NULL;
    if (pkv_connect(sock_path, &c)) _exit(3);
    pt_rng r = {.s = seed};
    uint32_t p[32];
    pkv_slot slots[32];
    for (uint64_t id = 1;; id++) {
        size_t n = 5 + pt_below(&r, 20), nc = 0;
        for (size_t i = 0; i < n; i++) p[i] = i < 8 ? 1000 + (uint32_t)i : pt_below(&r, 3);
        if (pkv_seq_open(c, id, 0, p, n, &nc)) continue;
        if (ready >= 0) {
            ssize_t w = write(ready, "r", 1);
            (void)w;
            close(ready);
            ready = -1;
        }
        if (nc < n && pkv_seq_append(c, id, p + nc, n - nc, slots) == 0 && pt_below(&r, 2)) {
            pkv_cache_info inf;
            pkv_info(c, &inf);
            uint64_t h = pt_hprefix(0, p, nc);
            for (size_t i = 0; i < n - nc; i++) {
                h = pt_hstep(h, p[nc + i]);
                pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
            }
            pkv_seq_commit(c, id, n - nc);
            if (pt_below(&r, 2)) pkv_seq_fork(c, id, id + 1000000);
        }
        if (pt_below(&r, 3) == 0) pkv_seq_close(c, id);
    }
}

Test(pkvd, a_killed_client_releases_everything)
{
    daemon_paths();
    pid_t d = daemon_start();
    pkv_cache *obs = connect_ok();
    uint32_t p[13];
    prompt(p, 13, 4242);
    open_fill(obs, 1, p, 13); /* the other client's sequence must be unaffected */
    pkv_stats s0 = pt_stats(obs);
    pt_rng r = {.s = 0xdeadu};
    int kills = (int)pt_env_u64("PKV_PKVD_KILLS", 300), holding = 0;
    for (int k = 0; k < kills; k++) {
        int rp[2];
        cr_assert_eq(pipe(rp), 0);
        pid_t b = fork();
        cr_assert(b >= 0);
        if (b == 0) {
            close(rp[0]);
            busy_client((uint32_t)k + 1, rp[1]);
        }
        close(rp[1]);
        /* Killed while it works: after its first open, 0-5 ms into its calls. */
        struct pollfd pf = {.fd = rp[0], .events = POLLIN};
        cr_assert_eq(poll(&pf, 1, 10000), 1, "kill %d: the client never got going", k);
        close(rp[0]);
        struct timespec ts = {0, (long)pt_below(&r, 5000) * 1000L};
        nanosleep(&ts, NULL);
        holding += pt_stats(obs).sequences > s0.sequences;
        cr_assert_eq(kill(b, SIGKILL), 0);
        int st;
        cr_assert_eq(waitpid(b, &st, 0), b);
        /* The daemon notices the end of the stream and closes the client's
         * sequences: wait for it (milliseconds; 30 s at most, for a loaded
         * machine). */
        pkv_stats s;
        for (int t = 0; t < 30000; t++) {
            s = pt_stats(obs);
            if (s.sequences == s0.sequences && s.blocks_used == s0.blocks_used) break;
            struct timespec w = {0, 1000000L};
            nanosleep(&w, NULL);
        }
        cr_assert(s.sequences == s0.sequences && s.blocks_used == s0.blocks_used,
                  "kill %d: %llu sequences, %llu blocks used; %llu and %llu before", k,
                  (unsigned long long)s.sequences, (unsigned long long)s.blocks_used,
                  (unsigned long long)s0.sequences, (unsigned long long)s0.blocks_used);
        cr_assert_eq(s.capacity, s.blocks_free + s.blocks_cached + s.blocks_used);
    }
    cr_log_info("%d kills, %d found the client holding sequences", kills, holding);
    cr_assert(holding >= kills / 2, "only %d of %d kills found the client holding sequences",
              holding, kills);
    PT_VERIFY(obs, 1, 0, p, 13, 13);
    pkv_close(obs);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- Daemon death ---------------------------------------------------------------------- */

/* A daemon serving an arena of format version 1 (page-sized slots for the 512-byte
 * blocks a new arena packs eight to a page): the client maps it at the stride the
 * daemon reports, and two connections share a prefix with exact K/V, which is
 * also at its version-1 place when the directory is opened locally afterwards.
 * Without the client's acceptance of the stored stride, connect fails with
 * PKV_EGEOMETRY. */
Test(pkvd, a_version_1_arena_is_mapped_at_its_page_stride)
{
    daemon_paths();
    pkv_options o;
    pt_opts(&o, 2, 2, 4, BS, PKV_F32, CAP);
    pkv_cache *c = pt_open_sub("cache", &o);
    pkv_cache_info inf = pt_info(c);
    cr_assert_eq(inf.slot_bytes, 512, "the daemon's geometry packs 8 blocks to a page");
    pt_close(c);
    char arena[400];
    snprintf(arena, sizeof arena, "%s/arena", dir_path);
    int fd = open(arena, O_RDWR);
    cr_assert(fd >= 0);
    uint8_t h[4096];
    cr_assert_eq(pread(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    uint32_t ver = 1;
    uint64_t slot = 4096;
    memcpy(h + 8, &ver, 4);
    memcpy(h + 56, &slot, 8);
    uint64_t sum = XXH3_64bits(h, 4088);
    memcpy(h + 4088, &sum, 8);
    cr_assert_eq(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    cr_assert_eq(ftruncate(fd, (off_t)(4096 + CAP * 4096ull)), 0);
    close(fd);

    pid_t d = daemon_start();
    uint32_t p[25];
    prompt(p, 25, 4711);
    c = connect_ok();
    cr_assert_eq(pt_info(c).slot_bytes, 4096, "the client maps the daemon's stride");
    open_fill(c, 1, p, 25);
    PT_OK(pkv_sync(c));
    pkv_cache *c2 = connect_ok();
    cr_assert_eq(SOPEN(c2, 2, p, 25), 24, "the second connection attaches the prefix");
    PT_VERIFY(c2, 2, 0, p, 24, 24);
    pkv_close(c2);
    pkv_close(c);
    daemon_stop(d, SIGTERM);

    c = pt_open_sub("cache", &o);
    inf = pt_info(c);
    cr_assert_eq(inf.slot_bytes, 4096);
    cr_assert_eq(SOPEN(c, 3, p, 25), 24);
    PT_VERIFY(c, 3, 0, p, 24, 24);
    uint32_t tab[8];
    PT_BLOCKS(c, 3, tab, 8);
    uint8_t *kv = pkv_kv(c, tab[0], 0, PKV_K, 0);
    cr_assert_eq((uint64_t)(kv - (uint8_t *)pkv_kv(c, 0, 0, PKV_K, 0)), tab[0] * 4096ull);
    PT_CHECK(c);
    pt_close(c);
    struct stat st;
    cr_assert_eq(stat(arena, &st), 0);
    cr_assert_eq((uint64_t)st.st_size, 4096 + CAP * 4096ull, "the arena keeps its size");
}

Test(pkvd, a_killed_daemon_disconnects_and_a_restart_recovers)
{
    daemon_paths();
    pid_t d = daemon_start();
    uint32_t p[25];
    prompt(p, 25, 31337);
    pkv_cache *c = connect_ok();
    open_fill(c, 1, p, 25);
    PT_OK(pkv_sync(c)); /* acknowledged and durable */
    daemon_stop(d, SIGKILL);
    size_t nc = 0;
    PT_ERR(pkv_prefix_lookup(c, 0, p, 25, &nc), PKV_EDISCONNECTED);
    PT_ERR(pkv_seq_commit(c, 1, 1), PKV_EDISCONNECTED);
    pkv_stats s;
    PT_ERR(pkv_get_stats(c, &s), PKV_EDISCONNECTED);
    pkv_close(c);
    pkv_cache *x = NULL;
    PT_ERR(pkv_connect(sock_path, &x), PKV_EDISCONNECTED);
    cr_assert_null(x);
    d = daemon_start(); /* recovers; the old connection's sequence is closed */
    c = connect_ok();
    s = pt_stats(c);
    cr_assert_eq(s.sequences, 0);
    PT_OK(pkv_prefix_lookup(c, 0, p, 25, &nc));
    cr_assert_eq(nc, 24, "the committed prefix survives the daemon's death");
    cr_assert_eq(SOPEN(c, 7, p, 25), 24);
    PT_VERIFY(c, 7, 0, p, 24, 24);
    pkv_close(c);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* Whether the file at path contains needle. */
static bool file_has(const char *path, const char *needle)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* Rule W3 (docs/pkvd.md): a client of a killed daemon still maps the arena and
 * may still write the open blocks it was handed; a restarted pkvd must not
 * recover (and reuse) them before that client closes. */
Test(pkvd, a_restarted_daemon_waits_for_the_clients_of_the_killed_one)
{
    daemon_paths();
    char log[300];
    pt_path(log, sizeof log, "pkvd.log");
    uint32_t p[25];
    prompt(p, 25, 4242);
    pid_t d = daemon_start();
    pkv_cache *c = connect_ok();
    open_fill(c, 1, p, 25);
    PT_OK(pkv_sync(c));
    pkv_slot sl[3];
    PT_OK(pkv_seq_append(c, 1, p, 3, sl)); /* an open block, uncommitted */
    daemon_stop(d, SIGKILL);
    int ready;
    d = daemon_spawn("--client-wait", "30", NULL, NULL, log, &ready);
    cr_assert_eq(wait_ready(ready, 1500), 0, "pkvd got ready while a client of the killed "
                 "one still maps the arena");
    cr_assert(file_has(log, "waiting for the clients of a previous pkvd"));
    pkv_close(c); /* unmaps, then closes */
    cr_assert_eq(wait_ready(ready, 20000), 1, "pkvd did not get ready once the client closed");
    close(ready);
    c = connect_ok();
    pkv_stats s = pt_stats(c);
    cr_assert_eq(s.sequences, 0);
    size_t nc = 0;
    PT_OK(pkv_prefix_lookup(c, 0, p, 25, &nc));
    cr_assert_eq(nc, 24);
    PT_OK(pkv_seq_open(c, 1, 0, p, 25, &nc));
    /* The same with a short --client-wait: pkvd gives up with a clear error. */
    daemon_stop(d, SIGKILL);
    d = daemon_spawn("--client-wait", "1", NULL, NULL, log, &ready);
    cr_assert_eq(wait_ready(ready, 20000), -1, "pkvd should exit, not get ready");
    close(ready);
    int st = 0;
    cr_assert_eq(waitpid(d, &st, 0), d);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "pkvd ended with status 0x%x", st);
    cr_assert(file_has(log, "--client-wait"), "the log names the bound it ran past");
    pkv_close(c);
    d = daemon_start();
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- Malformed frames -------------------------------------------------------------------- */

/* The protocol version this build speaks (PKVD_VERSION, src/wire.h): written here
 * as a peer of this build writes it. */
#define WIRE_V 3u

static int raw_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void hdr(uint8_t *h, uint32_t magic, uint16_t ver, uint16_t op, uint32_t len)
{
    put32(h, magic);
    h[4] = (uint8_t)ver, h[5] = (uint8_t)(ver >> 8);
    h[6] = (uint8_t)op, h[7] = (uint8_t)(op >> 8);
    put32(h + 8, len);
    put32(h + 12, 1);
}

/* Read one reply: its rc (or 1 at end of stream); drains the payload. */
static int read_reply(int fd)
{
    uint8_t h[16];
    size_t got = 0;
    while (got < 16) {
        ssize_t k = recv(fd, h + got, 16 - got, 0);
        if (k <= 0) return 1;
        got += (size_t)k;
    }
    uint32_t len = h[8] | h[9] << 8 | h[10] << 16 | (uint32_t)h[11] << 24;
    cr_assert(len >= 4 && len < 4096, "reply length %u", len);
    uint8_t b[4096];
    for (got = 0; got < len;) {
        ssize_t k = recv(fd, b + got, len - got, 0);
        cr_assert(k > 0);
        got += (size_t)k;
    }
    return (int)(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24);
}

/* Send `n` bytes of frame; expect an error reply `rc` and then the end. */
static void refused(const uint8_t *frame, size_t n, bool hello_first, int rc, const char *what)
{
    int fd = raw_connect();
    if (hello_first) {
        uint8_t hello[24];
        hdr(hello, 0x44564B50u, WIRE_V, 1, 8);
        memset(hello + 16, 0, 8);
        hello[16] = WIRE_V, hello[18] = WIRE_V;
        cr_assert_eq(send(fd, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
        cr_assert_eq(read_reply(fd), 0, "%s: HELLO refused", what);
    }
    cr_assert_eq(send(fd, frame, n, MSG_NOSIGNAL), (ssize_t)n);
    int got = read_reply(fd);
    cr_assert_eq(got, rc, "%s: reply %d, expected %d", what, got, rc);
    cr_assert_eq(read_reply(fd), 1, "%s: the connection should end", what);
    close(fd);
}

/* One reply into b (its payload, rc first): the rc, the header's version and
 * the payload length. */
static int read_reply_v(int fd, uint8_t *b, size_t cap, uint16_t *ver, uint32_t *len)
{
    uint8_t h[16];
    size_t got = 0;
    while (got < 16) {
        ssize_t k = recv(fd, h + got, 16 - got, 0);
        cr_assert(k > 0, "the connection ended");
        got += (size_t)k;
    }
    *ver = (uint16_t)(h[4] | h[5] << 8);
    *len = h[8] | h[9] << 8 | h[10] << 16 | (uint32_t)h[11] << 24;
    cr_assert(*len >= 4 && *len <= cap, "reply length %u", *len);
    for (got = 0; got < *len;) {
        ssize_t k = recv(fd, b + got, *len - got, 0);
        cr_assert(k > 0);
        got += (size_t)k;
    }
    return (int)(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24);
}

/* The STATS reply carries every pkv_stats field (wire.h PKVD_STATS_FIELDS, version 3:
 * 55, the wait, limbo and tier counters included), each a u64 after the rc. */
Test(pkvd, the_stats_reply_carries_every_counter)
{
    daemon_paths();
    pid_t d = daemon_start();
    int fd = raw_connect();
    uint8_t f[24], b[1024];
    hdr(f, 0x44564B50u, WIRE_V, 1, 8); /* HELLO offering exactly this version */
    memset(f + 16, 0, 8);
    f[16] = WIRE_V, f[18] = WIRE_V;
    cr_assert_eq(send(fd, f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
    uint16_t ver;
    uint32_t len;
    cr_assert_eq(read_reply_v(fd, b, sizeof b, &ver, &len), 0, "HELLO refused");
    cr_assert_eq(ver, WIRE_V);
    hdr(f, 0x44564B50u, WIRE_V, 14, 0); /* STATS */
    cr_assert_eq(send(fd, f, 16, MSG_NOSIGNAL), 16);
    cr_assert_eq(read_reply_v(fd, b, sizeof b, &ver, &len), 0);
    cr_assert_eq(ver, WIRE_V);
    cr_assert_eq(len, 4 + 55u * 8, "STATS of %u bytes", len);
    close(fd);
    daemon_stop(d, SIGTERM);
}

Test(pkvd, malformed_frames_are_refused_and_end_only_their_connection)
{
    daemon_paths();
    pid_t d = daemon_start();
    pkv_cache *c = connect_ok();
    uint32_t p[13];
    prompt(p, 13, 77);
    open_fill(c, 1, p, 13);
    uint8_t f[64];
    memset(f, 0, sizeof f);
    hdr(f, 0x12345678u, WIRE_V, 2, 0);
    refused(f, 16, false, PKV_EINVAL, "bad magic");
    hdr(f, 0x44564B50u, WIRE_V + 1, 14, 0);
    refused(f, 16, true, PKV_EVERSION, "another version after HELLO");
    hdr(f, 0x44564B50u, WIRE_V, 14, 0);
    refused(f, 16, false, PKV_EINVAL, "no HELLO first");
    hdr(f, 0x44564B50u, WIRE_V, 1, 8);
    f[16] = WIRE_V, f[18] = WIRE_V;
    refused(f, 24, true, PKV_EINVAL, "HELLO twice");
    hdr(f, 0x44564B50u, WIRE_V, 99, 0);
    refused(f, 16, true, PKV_EINVAL, "unknown op");
    hdr(f, 0x44564B50u, WIRE_V, 0x8002, 0);
    refused(f, 16, true, PKV_EINVAL, "a reply op");
    hdr(f, 0x44564B50u, WIRE_V, 2, 0xFFFFFFF0u);
    refused(f, 16, true, PKV_EINVAL, "a huge length");
    /* LOOKUP: salt, n = 3, but 2 tokens */
    hdr(f, 0x44564B50u, WIRE_V, 2, 8 + 4 + 8);
    memset(f + 16, 0, 20);
    put32(f + 24, 3);
    refused(f, 36, true, PKV_EINVAL, "a count the length does not hold");
    /* LOOKUP: salt, n = 1, but 2 tokens */
    put32(f + 24, 1);
    refused(f, 36, true, PKV_EINVAL, "bytes beyond the count");
    /* LOOKUP: n above the limit, length consistent with nothing */
    put32(f + 24, 0xFFFFFFFFu);
    refused(f, 36, true, PKV_EINVAL, "a count over the limit");
    /* CLOSE with 4 bytes instead of 8 */
    hdr(f, 0x44564B50u, WIRE_V, 10, 4);
    refused(f, 20, true, PKV_EINVAL, "a short fixed part");
    /* a truncated frame, then the client goes away */
    int fd = raw_connect();
    hdr(f, 0x44564B50u, WIRE_V, 1, 8);
    cr_assert_eq(send(fd, f, 20, MSG_NOSIGNAL), 20);
    close(fd);
    /* Well-formed but hostile: another connection's ids, one id twice in a batch. */
    pkv_cache *e = connect_ok();
    PT_ERR(pkv_seq_close(e, 1), PKV_ENOSEQ);
    PT_ERR(pkv_seq_blocks(e, 1, NULL, 0, NULL), PKV_ENOSEQ);
    size_t nc = 0;
    cr_assert_eq(SOPEN(e, 1, p, 13), 12); /* its own id 1 */
    pkv_step twice[2] = {{.id = 1, .token = 5}, {.id = 1, .token = 6}};
    size_t done = 9;
    PT_ERR(pkv_seq_step_batch(e, twice, 2, &done), PKV_EINVAL);
    cr_assert_eq(done, 1);
    pkv_close(e);
    /* The daemon still serves, and the first client's sequence is intact. */
    PT_OK(pkv_prefix_lookup(c, 0, p, 13, &nc));
    cr_assert_eq(nc, 12);
    PT_VERIFY(c, 1, 0, p, 13, 13);
    cr_assert_eq(kill(d, 0), 0, "pkvd is alive");
    pkv_close(c);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* Rule W1 (docs/pkvd.md): when the daemon ends a connection whose client lives
 * (here: a malformed frame on its socket), the client's other threads may still
 * write the slots it was handed, so its sequences and blocks stay held until
 * the client closes its end. */
Test(pkvd, a_connection_the_daemon_ends_keeps_its_blocks_until_the_client_closes)
{
    daemon_paths();
    pid_t d = daemon_start();
    pkv_cache *obs = connect_ok();
    pkv_stats base = pt_stats(obs);
    int sfd = dup(0); /* pkv_connect's socket takes the lowest free descriptor */
    cr_assert(sfd >= 0);
    close(sfd);
    pkv_cache *c = connect_ok();
    struct sockaddr_un peer;
    socklen_t pl = sizeof peer;
    cr_assert_eq(getpeername(sfd, (struct sockaddr *)&peer, &pl), 0, "descriptor %d", sfd);
    cr_assert_str_eq(peer.sun_path, sock_path, "descriptor %d is the handle's socket", sfd);
    uint32_t p[13];
    prompt(p, 13, 9191);
    cr_assert_eq(SOPEN(c, 1, p, 0), 0);
    pkv_slot sl[13];
    PT_OK(pkv_seq_append(c, 1, p, 13, sl)); /* open blocks, nothing committed */
    pkv_stats held = pt_stats(obs);
    cr_assert_eq(held.sequences, base.sequences + 1);
    cr_assert(held.blocks_used > base.blocks_used);
    uint8_t f[16];
    hdr(f, 0x12345678u, WIRE_V, 2, 0); /* bad magic: the daemon ends the connection */
    cr_assert_eq(send(sfd, f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
    cr_assert_eq(read_reply(sfd), PKV_EINVAL);
    cr_assert_eq(read_reply(sfd), 1, "the daemon shows the end of the connection");
    PT_ERR(pkv_seq_commit(c, 1, 13), PKV_EDISCONNECTED);
    struct timespec w = {0, 50 * 1000000L};
    nanosleep(&w, NULL);
    pkv_stats s = pt_stats(obs);
    cr_assert_eq(s.sequences, held.sequences, "released while the client may still write");
    cr_assert_eq(s.blocks_used, held.blocks_used);
    pkv_close(c);
    s = wait_sequences(obs, base.sequences);
    cr_assert_eq(s.sequences, base.sequences, "released once the client closed");
    cr_assert_eq(s.blocks_used, base.blocks_used);
    pkv_close(obs);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- pkv_connect's own errors --------------------------------------------------------- */

Test(pkvd, connect_checks_its_arguments)
{
    daemon_paths();
    pkv_cache *c = (pkv_cache *)&c;
    PT_ERR(pkv_connect(NULL, &c), PKV_EINVAL);
    cr_assert_null(c, "*out is NULL on failure");
    PT_ERR(pkv_connect(sock_path, NULL), PKV_EINVAL);
    PT_ERR(pkv_connect("", &c), PKV_EINVAL);
    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    PT_ERR(pkv_connect(longp, &c), PKV_EINVAL);
    c = (pkv_cache *)&c;
    PT_ERR(pkv_connect(sock_path, &c), PKV_EDISCONNECTED); /* nothing listens */
    cr_assert_null(c);
    cr_assert(pkv_last_error()[0], "a message");
}

/* ---- Permissions ----------------------------------------------------------------------- */

/* pkv_connect's result in a child running as uid `uid` (needs root to switch). */
static int connect_as(uid_t uid)
{
    pid_t ch = fork();
    cr_assert(ch >= 0);
    if (ch == 0) {
        if (setgid(uid) || setuid(uid)) _exit(100);
        pkv_cache *c = NULL;
        int r = pkv_connect(sock_path, &c);
        pkv_close(c);
        _exit(r == 0 ? 0 : r == PKV_EDISCONNECTED ? 1 : 2);
    }
    int st = 0;
    cr_assert_eq(waitpid(ch, &st, 0), ch);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 100, "the child could not switch uid");
    return WEXITSTATUS(st);
}

Test(pkvd, only_allowed_uids_connect)
{
    if (geteuid() != 0) cr_skip_test("needs root to run a client as another uid");
    daemon_paths();
    pid_t d = daemon_start();
    struct stat st;
    cr_assert_eq(stat(sock_path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "the socket is 0%o", st.st_mode & 0777);
    cr_assert_eq(connect_as(65534), 1, "another uid is refused (socket mode)");
    daemon_stop(d, SIGTERM);
    /* A world-writable socket that other uids can reach (the test directory is
     * 0700): now SO_PEERCRED alone refuses, until the uid is allowed. */
    cr_assert_eq(chmod(pt_dir, 0711), 0);
    d = daemon_start_with("--socket-mode", "666", NULL, NULL);
    cr_assert_eq(stat(sock_path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0666);
    cr_assert_eq(connect_as(65534), 1, "another uid is refused (peer credentials)");
    pkv_cache *c = connect_ok(); /* the daemon's own uid still connects */
    pkv_close(c);
    daemon_stop(d, SIGTERM);
    d = daemon_start_with("--socket-mode", "666", "--allow-uid", "65534");
    cr_assert_eq(connect_as(65534), 0, "an allowed uid connects");
    daemon_stop(d, SIGTERM);
}

/* ---- Daemon death under load ----------------------------------------------------------- */

/* A client that, until its daemon is gone, opens sequences over a few shared
 * stems, checks that every attached token holds the K/V of its exact prefix,
 * appends and writes the rest, commits, syncs now and then, closes. Exit 0 when
 * the daemon went away (PKV_EDISCONNECTED), 1 on wrong K/V, 2 on an
 * undocumented error. */
static void checking_client(uint32_t seed)
{
    pkv_cache *c = NULL;
    if (pkv_connect(sock_path, &c)) _exit(0); /* the daemon died first */
    pkv_cache_info inf;
    pkv_info(c, &inf);
    pt_rng r = {.s = seed};
    uint32_t p[40];
    pkv_slot slots[40];
    char err[256];
    for (uint64_t id = 1;; id++) {
        size_t n = 2 + pt_below(&r, 37), nc = 0;
        uint32_t stem = pt_below(&r, 4);
        for (size_t i = 0; i < n; i++) p[i] = i < 12 ? 100 * stem + (uint32_t)i : pt_below(&r, 3);
        int rc = pkv_seq_open(c, id, 0, p, n, &nc);
        if (rc == PKV_EDISCONNECTED) _exit(0);
        if (rc) _exit(2);
        uint32_t tab[16];
        size_t nb = 0;
        rc = pkv_seq_blocks(c, id, tab, 16, &nb);
        if (rc == PKV_EDISCONNECTED) _exit(0);
        uint64_t h = pt_h0(0);
        for (size_t t = 0; !rc && t < nc; t++) {
            h = pt_hstep(h, p[t]);
            if (!pt_token_ok(c, &inf, tab[t / BS], (uint32_t)(t % BS), h, err, sizeof err)) {
                fprintf(stderr, "client %u: wrong K/V at %zu of %zu: %s\n", seed, t, nc, err);
                _exit(1);
            }
        }
        rc = pkv_seq_append(c, id, p + nc, n - nc, slots);
        if (rc == 0) {
            for (size_t i = 0; i < n - nc; i++) {
                h = pt_hstep(h, p[nc + i]);
                pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
            }
            rc = pkv_seq_commit(c, id, n - nc);
        }
        if (rc == 0 && pt_below(&r, 8) == 0) rc = pkv_sync(c);
        if (rc == 0) rc = pkv_seq_close(c, id);
        if (rc == PKV_EDISCONNECTED) _exit(0);
        if (rc && rc != PKV_EFULL) _exit(2);
    }
}

Test(pkvd, killing_the_daemon_under_load_never_serves_wrong_kv)
{
    daemon_paths();
    pt_rng r = {.s = 0x5eedu};
    int rounds = (int)pt_env_u64("PKV_PKVD_DAEMON_KILLS", 20);
    for (int k = 0; k < rounds; k++) {
        pid_t d = daemon_start();
        pid_t cl[2];
        for (int i = 0; i < 2; i++) {
            cl[i] = fork();
            cr_assert(cl[i] >= 0);
            if (cl[i] == 0) checking_client((uint32_t)(k * 2 + i + 1));
        }
        struct timespec ts = {0, (long)(2 + pt_below(&r, 40)) * 1000000L};
        nanosleep(&ts, NULL);
        daemon_stop(d, SIGKILL);
        for (int i = 0; i < 2; i++) {
            int st = 0;
            cr_assert_eq(waitpid(cl[i], &st, 0), cl[i]);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "round %d, client %d: status 0x%x (1: wrong K/V, 2: an undocumented "
                      "error)", k, i, st);
        }
    }
    offline_check(); /* the directory the last kill left recovers clean */
}

/* ---- Salts: the tenant boundary ----------------------------------------------------------- */

static size_t sopen_salt(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t nc = 0;
    PT_OK(pkv_seq_open(c, id, salt, p, n, &nc));
    return nc;
}

Test(pkvd, a_client_uses_only_its_allowed_salts)
{
    daemon_paths();
    char rule[64];
    snprintf(rule, sizeof rule, "%u=1,2", (unsigned)getuid());
    pid_t d = daemon_start_with("--salts", rule, NULL, NULL);
    pkv_cache *c = connect_ok();
    uint32_t p[13];
    prompt(p, 13, 600);
    size_t nc = 5;
    PT_ERR(pkv_prefix_lookup(c, 0, p, 13, &nc), PKV_EINVAL);
    cr_assert(strstr(pkv_last_error(), "salt 0"), "message '%s'", pkv_last_error());
    cr_assert_eq(nc, 0);
    PT_ERR(pkv_seq_open(c, 1, 3, p, 13, &nc), PKV_EINVAL);
    cr_assert_eq(sopen_salt(c, 1, 2, p, 13), 0);
    add_commit(c, 1, 2, p, 0, 13);
    PT_OK(pkv_seq_fork(c, 1, 2)); /* inherits salt 2 */
    PT_OK(pkv_prefix_lookup(c, 2, p, 13, &nc));
    cr_assert_eq(nc, 12);
    PT_OK(pkv_prefix_lookup(c, 1, p, 13, &nc));
    cr_assert_eq(nc, 0, "salt 1 is another domain");
    pkv_stats s = pt_stats(c);
    cr_assert_eq(s.sequences, 2, "the refused open created nothing");
    pkv_close(c);
    daemon_stop(d, SIGTERM);
    /* Malformed rules stop the daemon before it listens (status 2). */
    const char *bad[] = {"x", "=1", "0=", "0=1,", "0=a", "99999999999=1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pid_t b = fork();
        cr_assert(b >= 0);
        if (b == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            dup2(devnull, 2);
            execl(getenv("PKVD"), "pkvd", "--salts", bad[i], "--dir", dir_path, "--socket",
                  sock_path, (char *)NULL);
            _exit(127);
        }
        int st = 0;
        cr_assert_eq(waitpid(b, &st, 0), b);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--salts %s: status 0x%x", bad[i], st);
    }
}

/* ---- The example client ------------------------------------------------------------------ */

/* Run $PKVD_EXAMPLE for `user`; its one line of output into out. */
static int run_example(const char *user, char *out, size_t cap)
{
    const char *bin = getenv("PKVD_EXAMPLE");
    cr_assert(bin && bin[0], "$PKVD_EXAMPLE is not set");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s", bin, sock_path, user);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    out[0] = '\0';
    if (!fgets(out, (int)cap, f)) out[0] = '\0';
    return pclose(f);
}

Test(pkvd, the_example_client_shares_the_system_prompt)
{
    daemon_paths();
    pid_t d = daemon_start();
    char line[512];
    cr_assert_eq(run_example("1", line, sizeof line), 0, "first run: %s", line);
    cr_assert(strstr(line, "0 of 208 prompt tokens cached"), "first run: %s", line);
    cr_assert_eq(run_example("2", line, sizeof line), 0, "second run: %s", line);
    cr_assert(strstr(line, "200 of 208 prompt tokens cached (lookup said 200)"),
              "second run: %s", line);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* ---- pkvd --status ------------------------------------------------------------------------ */

Test(pkvd, status_lists_the_connections_and_their_sequences)
{
    daemon_paths();
    pid_t d = daemon_start();
    pkv_cache *a = connect_ok(), *b = connect_ok();
    uint32_t p[13];
    prompt(p, 13, 900);
    open_fill(a, 1, p, 13);
    open_fill(b, 1, p, 13);
    PT_OK(pkv_seq_fork(b, 1, 2));
    pkv_cache *ro = NULL;
    PT_OK(pkv_connect_rdonly(sock_path, &ro));
    cr_assert_eq(SOPEN(ro, 77, p, 13), 12);
    char cmd[1024], out[4096] = "";
    snprintf(cmd, sizeof cmd, "'%s' --status --socket '%s'", getenv("PKVD"), sock_path);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    cr_assert_eq(pclose(f), 0, "pkvd --status failed: %s", out);
    char want1[64], want2[64];
    snprintf(want1, sizeof want1, "uid %u pid %d sequences 1\n", (unsigned)getuid(), (int)getpid());
    snprintf(want2, sizeof want2, "uid %u pid %d sequences 2\n", (unsigned)getuid(), (int)getpid());
    char want3[80];
    snprintf(want3, sizeof want3, "uid %u pid %d sequences 1 read-only\n", (unsigned)getuid(),
             (int)getpid());
    cr_assert(strstr(out, "4 connections (this one included)\n") && strstr(out, want1) &&
                  strstr(out, want2) && strstr(out, want3) &&
                  strstr(out, "  sequence 2 (pkvd's ") &&
                  strstr(out, "): 13 tokens, 13 committed\n") &&
                  strstr(out, "  sequence 77 (pkvd's ") &&
                  strstr(out, "): 12 tokens, 12 committed\n"),
              "pkvd --status printed:\n%s", out);
    pkv_close(ro);
    pkv_close(a);
    pkv_close(b);
    daemon_stop(d, SIGTERM);
}

/* ---- Metrics (docs/metrics.md) ----------------------------------------------------- */

/* A loopback TCP port free a moment ago (the daemon binds it right after). */
static int free_port(void)
{
    const int port = ht_free_port();
    cr_assert(port > 0, "no free loopback port");
    return port;
}

/* The value of the unlabelled sample `name` in a text exposition, or -1. */
static double sample_of(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, name, n) && l[n] == ' ') return strtod(l + n + 1, NULL);
    return -1;
}

/* pkvd --metrics serves the cache's metrics, which count what the clients did
 * (a client's prefix hits appear in the daemon's pagedkv_prefix_cache_hits_total);
 * a connected handle has no counters of its own and refuses to render them. */
Test(pkvd, the_daemon_serves_the_metrics_of_its_clients)
{
    if (!PKV_WITH_MICROHTTPD) cr_skip_test("built without libmicrohttpd (meson option metrics_http)");
    daemon_paths();
    char addr[64];
    const int port = free_port();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pid_t d = daemon_start_with("--metrics", addr, NULL, NULL);
    uint32_t p[25];
    prompt(p, 25, 700);
    pkv_cache *a = connect_ok();
    cr_assert_eq(open_fill(a, 1, p, 25), 0);
    PT_OK(pkv_seq_close(a, 1));
    cr_assert_eq(SOPEN(a, 2, p, 25), 24);
    pkv_stats st;
    PT_OK(pkv_get_stats(a, &st));
    cr_assert_eq(st.hit_tokens, 24);
    char txt[64], *body = malloc(1 << 20);
    size_t need = 0;
    cr_assert_not_null(body);
    cr_assert_eq(pkv_metrics_text(a, txt, sizeof txt, &need), PKV_ENOTSUP);
    const int code = ht_request(port, "GET", "/metrics", body, 1 << 20, NULL, 10000);
    cr_assert_eq(code, 200, "GET /metrics from pkvd -> %d", code);
    cr_assert_eq(sample_of(body, "pagedkv_prefix_cache_hits_total"), (double)st.hit_tokens,
                 "pkvd's hits %g, the client's pkv_get_stats %llu",
                 sample_of(body, "pagedkv_prefix_cache_hits_total"),
                 (unsigned long long)st.hit_tokens);
    cr_assert_eq(sample_of(body, "pagedkv_sequences"), 1.0);
    free(body);
    pkv_close(a);
    daemon_stop(d, SIGTERM);
}

/* ---- Reply sizes ------------------------------------------------------------------------ */

/* The largest append a client may send must have a reply (8 bytes of slot per
 * token) that fits in a frame: otherwise the daemon carries out the append, cannot
 * send its reply and drops the connection, and with it every sequence of the
 * client. 2 Mi + 8 tokens is within the request limit (4 Mi tokens) and its reply
 * (16 MiB + 68 bytes) is over the frame limit (16 MiB + 64). */
Test(pkvd, an_append_too_large_for_its_reply_is_refused_and_the_connection_lives)
{
    static const char *const small[] = {"--layers", "1", "--kv-heads", "1", "--head-dim", "1",
                                        "--dtype", "f16", "--block-size", "1024",
                                        "--capacity", "2056", NULL};
    daemon_paths();
    geometry = small;
    pid_t d = daemon_start();
    geometry = NULL;
    pkv_cache *c = connect_ok();
    const size_t n = (2u << 20) + 8;
    uint32_t *t = malloc(n * sizeof *t);
    pkv_slot *s = malloc(n * sizeof *s);
    cr_assert(t && s);
    prompt(t, n, 5);
    PT_OK(pkv_seq_open(c, 1, 0, NULL, 0, NULL));
    int rc = pkv_seq_append(c, 1, t, n, s);
    cr_assert(rc == 0 || rc == PKV_ERANGE, "append of %zu tokens -> %d (%s)", n, rc,
              pkv_last_error());
    /* the connection and its sequence are still there */
    pkv_seq_info si = PT_SEQ_INFO(c, 1);
    cr_assert(si.len == (rc ? 0 : n), "len %llu", (unsigned long long)si.len);
    PT_OK(pkv_seq_append(c, 1, t, 1000, s));
    free(t);
    free(s);
    pkv_close(c);
    daemon_stop(d, SIGTERM);
}

/* ---- Shutdown --------------------------------------------------------------------------- */

/* A SIGTERM ends the daemon even while a client keeps asking for the connection
 * list (pkvd --status): the shutdown, which joins each connection's thread,
 * must not hold the lock that the list's request waits for. Client B polls
 * CLIENTS in a loop; client A, newer (so joined first), holds many sequences.
 * (Their release at shutdown once gave B's requests time to arrive; since rule
 * W2 shutdown releases nothing, so the window is only the joins.) */
Test(pkvd, shutdown_ends_while_a_client_polls_the_status)
{
    daemon_paths();
    pid_t d = daemon_start();
    int b = raw_connect();
    uint8_t hello[24];
    hdr(hello, 0x44564B50u, WIRE_V, 1, 8);
    memset(hello + 16, 0, 8);
    hello[16] = WIRE_V, hello[18] = WIRE_V;
    cr_assert_eq(send(b, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
    cr_assert_eq(read_reply(b), 0);
    pid_t poller = fork();
    cr_assert(poller >= 0);
    if (poller == 0) { /* CLIENTS, its reply, again, until the daemon is gone */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        uint8_t f[16], r[4096];
        hdr(f, 0x44564B50u, WIRE_V, 16, 0);
        for (;;) {
            if (send(b, f, sizeof f, MSG_NOSIGNAL) != (ssize_t)sizeof f) _exit(0);
            ssize_t k = recv(b, r, sizeof r, 0); /* a small reply: one read holds it */
            if (k <= 0) _exit(0);
        }
    }
    pkv_cache *a = connect_ok();
    for (uint64_t id = 1; id <= 20000; id++) PT_OK(pkv_seq_open(a, id, 0, NULL, 0, NULL));
    cr_assert_eq(kill(d, SIGTERM), 0);
    int st = 0;
    pid_t got = 0;
    for (int i = 0; i < 2000 && (got = waitpid(d, &st, WNOHANG)) == 0; i++) usleep(10000);
    if (got == 0) {
        kill(d, SIGKILL);
        waitpid(d, &st, 0);
    }
    kill(poller, SIGKILL);
    waitpid(poller, NULL, 0);
    close(b);
    pkv_close(a);
    cr_assert(got == d, "pkvd did not end within 20 s of SIGTERM");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pkvd ended with status 0x%x", st);
}

/* ---- A hostile daemon ------------------------------------------------------------------- */

static size_t put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
    return (size_t)n;
}

/* Whether the fake daemon's HELLO names the other legal slot stride than its
 * arena file's (set before fake_start: the child inherits it). */
static bool fake_stride_lie;

/* A fake pkvd on sock_path for `conns` connections: HELLO is answered with a
 * consistent geometry (1 layer, 1 head, head_dim 4, BS tokens, f32, 2 blocks)
 * and a file of the right size; every later request is answered rc 0 with one
 * slot (block, offset) per connection, taken from bad[]. */
static void fake_daemon(int conns, const uint32_t (*bad)[2], int ready)
{
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 4)) _exit(2);
    /* A real arena of that geometry (its header is checked by the client),
     * made long enough for either stride. */
    char dir[320], path[400];
    snprintf(dir, sizeof dir, "%s.d", sock_path);
    pkv_options o;
    pt_opts(&o, 1, 1, 4, BS, PKV_F32, 2);
    o.model_id = "m";
    pkv_cache *made = NULL;
    if (pkv_open(dir, &o, &made)) _exit(3);
    pkv_close(made);
    snprintf(path, sizeof path, "%s/arena", dir);
    int afd = open(path, O_RDWR);
    uint8_t hd[64];
    if (afd < 0 || pread(afd, hd, sizeof hd, 0) != (ssize_t)sizeof hd ||
        ftruncate(afd, 4096 + 2 * 4096))
        _exit(3);
    uint64_t stride = 0;
    for (int i = 7; i >= 0; i--) stride = stride << 8 | hd[56 + i];
    if (fake_stride_lie) stride = stride == 4096 ? 128 : 4096; /* the other legal stride */
    if (write(ready, "r", 1) != 1) _exit(4);
    for (int c = 0; c < conns; c++) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0) _exit(5);
        for (int first = 1;; first = 0) {
            uint8_t h[16], in[4096], out[256];
            if (recv(fd, h, 16, MSG_WAITALL) != 16) break;
            uint32_t len = h[8] | h[9] << 8 | h[10] << 16 | (uint32_t)h[11] << 24;
            if (len > sizeof in || (len && recv(fd, in, len, MSG_WAITALL) != (ssize_t)len)) break;
            size_t n = 16;
            n += put_le(out + n, 0, 4);
            if (first) {
                n += put_le(out + n, WIRE_V, 2);
                n += put_le(out + n, 1, 4), n += put_le(out + n, 1, 4);
                n += put_le(out + n, 4, 4), n += put_le(out + n, BS, 4);
                n += put_le(out + n, (uint32_t)PKV_F32, 4), n += put_le(out + n, 4, 4);
                n += put_le(out + n, 2, 8), n += put_le(out + n, 2 * BS * 16, 8);
                n += put_le(out + n, stride, 8), n += put_le(out + n, BS * 16, 8);
                n += put_le(out + n, 1, 2);
                out[n++] = 'm';
                n += put_le(out + n, 4096, 8);
            } else {
                n += put_le(out + n, bad[c][0], 4), n += put_le(out + n, bad[c][1], 4);
            }
            memcpy(out, h, 16);
            out[7] |= 0x80; /* the reply to the op, the request number echoed */
            put_le(out + 8, n - 16, 4);
            struct iovec iov = {.iov_base = out, .iov_len = n};
            union {
                struct cmsghdr hd;
                char b[CMSG_SPACE(sizeof(int))];
            } cm;
            memset(&cm, 0, sizeof cm);
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
            if (first) {
                m.msg_control = cm.b;
                m.msg_controllen = sizeof cm.b;
                struct cmsghdr *ch = CMSG_FIRSTHDR(&m);
                ch->cmsg_level = SOL_SOCKET, ch->cmsg_type = SCM_RIGHTS;
                ch->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(ch), &afd, sizeof afd);
            }
            if (sendmsg(fd, &m, MSG_NOSIGNAL) != (ssize_t)n) break;
        }
        close(fd);
    }
    _exit(0);
}

/* Fork a fake daemon: run(ready, arg) in a child that dies with this process and
 * writes a byte to `ready` once it listens; returns when it does. */
static pid_t fake_start(void (*run)(int ready, const void *arg), const void *arg)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t f = fork();
    cr_assert(f >= 0);
    if (f == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        run(p[1], arg);
        _exit(0);
    }
    close(p[1]);
    char r;
    cr_assert_eq(read(p[0], &r, 1), 1, "the fake daemon did not start");
    close(p[0]);
    return f;
}

static void slot_daemon(int ready, const void *arg)
{
    fake_daemon(2, arg, ready);
}

static void slot_daemon1(int ready, const void *arg)
{
    fake_daemon(1, arg, ready);
}

/* A slot the daemon hands out is where the client writes K/V (pkv_kv of its
 * block plus its offset): one outside the arena's geometry is a malformed
 * reply, so a hostile or broken daemon cannot make the client write outside
 * its mapping or across blocks. */
Test(pkvd, a_slot_outside_the_geometry_from_the_daemon_is_refused)
{
    daemon_paths();
    static const uint32_t bad[2][2] = {{0, BS}, {2, 0}}; /* offset = block size; block = capacity */
    pid_t f = fake_start(slot_daemon, bad);
    for (int i = 0; i < 2; i++) {
        pkv_cache *c = connect_ok();
        pkv_cache_info inf = pt_info(c);
        cr_assert(inf.capacity == 2 && inf.block_size == BS);
        uint32_t t = 7;
        pkv_slot s = {0, 0};
        int rc = pkv_seq_append(c, 1, &t, 1, &s);
        cr_assert_eq(rc, PKV_EDISCONNECTED, "slot (%u, %u) -> %d, slot (%u, %u)", bad[i][0],
                     bad[i][1], rc, s.block, s.offset);
        pkv_close(c);
    }
    int st = 0;
    cr_assert_eq(waitpid(f, &st, 0), f);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fake daemon status 0x%x", st);
}

/* The slot stride every K/V address is computed from is the arena file's own:
 * a daemon whose HELLO names the other legal stride (a version mix-up, a bug,
 * a hostile peer) is refused at connect, before any slot is handed out, so a
 * client can never write into, or read, another block's payload. */
Test(pkvd, a_daemon_naming_another_stride_than_its_file_is_refused)
{
    daemon_paths();
    static const uint32_t none[1][2] = {{0, 0}};
    fake_stride_lie = true;
    pid_t f = fake_start(slot_daemon1, none);
    pkv_cache *c = NULL;
    int rc = pkv_connect(sock_path, &c);
    cr_assert_eq(rc, PKV_EGEOMETRY, "connect -> %d (%s)", rc, pkv_last_error());
    cr_assert_null(c);
    cr_assert(strstr(pkv_last_error(), "slot stride"), "%s", pkv_last_error());
    kill(f, SIGKILL);
    waitpid(f, NULL, 0);
}

/* ---- Protocol versions (docs/pkvd.md, "Versions") ------------------------------------- */

/* One HELLO with header version `hv` and range vmin..vmax on a new raw connection:
 * the reply's header version, its rc, and (rc != 0) its message in msg. */
static int hello_v(uint16_t hv, uint16_t vmin, uint16_t vmax, uint16_t *rv, char *msg,
                   size_t cap, uint16_t *payload_ver)
{
    int fd = raw_connect();
    uint8_t f[24] = {0};
    hdr(f, 0x44564B50u, hv, 1, 8);
    f[16] = (uint8_t)vmin, f[17] = (uint8_t)(vmin >> 8);
    f[18] = (uint8_t)vmax, f[19] = (uint8_t)(vmax >> 8);
    cr_assert_eq(send(fd, f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
    uint8_t h[16], b[4096];
    cr_assert_eq(recv(fd, h, 16, MSG_WAITALL), 16, "no reply header");
    uint32_t len = h[8] | h[9] << 8 | h[10] << 16 | (uint32_t)h[11] << 24;
    cr_assert(len >= 4 && len < sizeof b, "reply length %u", len);
    cr_assert_eq(recv(fd, b, len, MSG_WAITALL), (ssize_t)len);
    cr_assert(h[6] == 1 && h[7] == 0x80, "not a reply to HELLO");
    *rv = (uint16_t)(h[4] | h[5] << 8);
    int rc = (int)(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24);
    msg[0] = '\0';
    if (rc) {
        size_t ml = (size_t)(b[4] | b[5] << 8);
        cr_assert(6 + ml <= len && ml < cap);
        memcpy(msg, b + 6, ml);
        msg[ml] = '\0';
        cr_assert_eq(read_reply(fd), 1, "a refused HELLO ends the connection");
    } else {
        *payload_ver = (uint16_t)(b[4] | b[5] << 8);
    }
    close(fd);
    return rc;
}

/* The daemon's side: a client of another version (a HELLO whose range does not
 * hold this build's version) is refused with PKV_EVERSION and "protocol version
 * X, expected Y", in the version of its own HELLO's header, so that the client
 * (which reads only replies of its own version) can read the refusal; a client
 * whose range holds this version is served in it. */
Test(pkvd, a_client_of_another_protocol_version_is_refused_in_its_own_version)
{
    daemon_paths();
    pid_t d = daemon_start();
    char msg[300], want[80];
    uint16_t rv = 0, pv = 0;
    /* exactly what a client of the version before sends */
    int rc = hello_v(WIRE_V - 1, WIRE_V - 1, WIRE_V - 1, &rv, msg, sizeof msg, &pv);
    cr_assert_eq(rc, PKV_EVERSION, "a version-%u HELLO -> %d (%s)", WIRE_V - 1, rc, msg);
    cr_assert_eq(rv, WIRE_V - 1, "the refusal is written in version %u", rv);
    snprintf(want, sizeof want, "protocol version %u, expected %u", WIRE_V - 1, WIRE_V);
    cr_assert(strstr(msg, want), "message: %s", msg);
    /* a later client that speaks only later versions */
    rc = hello_v(WIRE_V + 3, WIRE_V + 1, WIRE_V + 3, &rv, msg, sizeof msg, &pv);
    cr_assert_eq(rc, PKV_EVERSION);
    cr_assert_eq(rv, WIRE_V + 3);
    snprintf(want, sizeof want, "protocol versions %u..%u, expected %u", WIRE_V + 1, WIRE_V + 3,
             WIRE_V);
    cr_assert(strstr(msg, want), "message: %s", msg);
    /* a later client that also speaks this version gets it */
    rc = hello_v(WIRE_V + 1, WIRE_V - 1, WIRE_V + 1, &rv, msg, sizeof msg, &pv);
    cr_assert_eq(rc, 0, "HELLO %u..%u refused: %s", WIRE_V - 1, WIRE_V + 1, msg);
    cr_assert(rv == WIRE_V && pv == WIRE_V, "agreed on %u / %u", rv, pv);
    /* and the daemon serves on */
    pkv_cache *c = connect_ok();
    pkv_close(c);
    daemon_stop(d, SIGTERM);
}

/* A fake pkvd of the version before on sock_path for `conns` connections. Each
 * connection's first frame is answered in version WIRE_V - 1 as that daemon
 * answers it: `answer` false, refused as a frame of an unknown version (rc
 * PKV_EINVAL and its message); `answer` true, as if the versions matched (rc 0 and a HELLO
 * result naming version WIRE_V - 1: a daemon that checked nothing). */
static void old_daemon(int conns, bool answer, int ready)
{
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 4)) _exit(2);
    if (write(ready, "r", 1) != 1) _exit(4);
    for (int c = 0; c < conns; c++) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0) _exit(5);
        uint8_t h[16], in[64], out[256];
        if (recv(fd, h, 16, MSG_WAITALL) != 16) _exit(6);
        uint32_t len = h[8] | h[9] << 8 | h[10] << 16 | (uint32_t)h[11] << 24;
        if (len > sizeof in || (len && recv(fd, in, len, MSG_WAITALL) != (ssize_t)len)) _exit(7);
        char m[64];
        int ml = snprintf(m, sizeof m, "protocol version %u, not %u", h[4] | h[5] << 8,
                          WIRE_V - 1);
        size_t n = 16;
        if (answer) {
            n += put_le(out + n, 0, 4);
            n += put_le(out + n, WIRE_V - 1, 2);
            for (int i = 0; i < 10; i++) n += put_le(out + n, 1, 8); /* whatever v1 said */
        } else {
            n += put_le(out + n, (uint32_t)PKV_EINVAL, 4);
            n += put_le(out + n, (uint64_t)ml, 2);
            memcpy(out + n, m, (size_t)ml);
            n += (size_t)ml;
        }
        memcpy(out, h, 16);
        put_le(out + 4, WIRE_V - 1, 2);
        out[7] |= 0x80;
        put_le(out + 8, n - 16, 4);
        if (send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n) _exit(8);
        close(fd);
    }
    _exit(0);
}

static void old_daemon_refusing(int ready, const void *arg)
{
    (void)arg;
    old_daemon(2, false, ready);
}

static void old_daemon_answering(int ready, const void *arg)
{
    (void)arg;
    old_daemon(2, true, ready);
}

/* pkvd --status against this socket: its exit status, its stdout and stderr. */
static int status_run(char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --status --socket '%s' 2>&1", getenv("PKVD"), sock_path);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t got = fread(out, 1, cap - 1, f);
    out[got] = '\0';
    return pclose(f);
}

/* The client's side: pkv_connect and pkvd --status against a daemon of the
 * version before get PKV_EVERSION / exit 1 with "protocol version X, expected
 * Y", whether that daemon refuses the HELLO or answers it: nothing of a reply
 * of another version is parsed. */
Test(pkvd, a_daemon_of_another_protocol_version_is_refused_clearly)
{
    daemon_paths();
    char want[80], out[4096];
    snprintf(want, sizeof want, "protocol version %u, expected %u", WIRE_V - 1, WIRE_V);
    for (int answer = 0; answer < 2; answer++) {
        pid_t f = fake_start(answer ? old_daemon_answering : old_daemon_refusing, NULL);
        pkv_cache *c = (pkv_cache *)&c;
        int rc = pkv_connect(sock_path, &c);
        cr_assert_eq(rc, PKV_EVERSION, "pkv_connect -> %d (%s)", rc, pkv_last_error());
        cr_assert_null(c);
        cr_assert(strstr(pkv_last_error(), want), "pkv_connect: %s", pkv_last_error());
        int st = status_run(out, sizeof out);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "pkvd --status: 0x%x: %s", st, out);
        cr_assert(strstr(out, want) && !strstr(out, "connections"), "pkvd --status: %s", out);
        cr_assert_eq(waitpid(f, &st, 0), f);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fake daemon status 0x%x", st);
        unlink(sock_path);
    }
}

/* ---- Read-only clients ---------------------------------------------------------------- */

/* The descriptors of this process that name the arena of dir_path, as a bit set. */
static uint64_t arena_fds(void)
{
    char want[320], link[400], path[64];
    snprintf(want, sizeof want, "%s/arena", dir_path);
    uint64_t set = 0;
    for (int fd = 0; fd < 64; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = '\0';
        if (!strcmp(link, want)) set |= 1ull << fd;
    }
    return set;
}

/* The kernel enforces a reader's read-only access: its arena descriptor is
 * O_RDONLY, so it cannot be mapped writable, written, or the handle's mapping made
 * writable; a store through pkv_kv faults. The daemon refuses every call that
 * hands out slots or changes a sequence with PKV_ERDONLY (a step batch with
 * done 0), and what a reader needs works: lookup, open (attach), read K/V in place,
 * info, blocks, tokens, stats, close. */
Test(pkvd, a_read_only_client_cannot_write_the_arena_and_gets_erdonly)
{
    daemon_paths();
    pid_t d = daemon_start();
    uint32_t p[25];
    prompt(p, 25, 1717);
    pkv_cache *w = connect_ok();
    open_fill(w, 1, p, 25);
    pkv_stats s0 = pt_stats(w);
    uint64_t before = arena_fds();
    pkv_cache *ro = NULL;
    int rc = pkv_connect_rdonly(sock_path, &ro);
    cr_assert_eq(rc, 0, "pkv_connect_rdonly -> %d (%s)", rc, pkv_last_error());
    uint64_t mine = arena_fds() & ~before;
    cr_assert(mine && !(mine & (mine - 1)), "one new arena descriptor (set 0x%llx)",
              (unsigned long long)mine);
    int afd = __builtin_ctzll(mine);
    cr_assert_eq(fcntl(afd, F_GETFL) & O_ACCMODE, O_RDONLY, "the reader's arena is O_RDONLY");
    pkv_cache_info inf = pt_info(ro);
    void *m = mmap(NULL, 4096 + inf.slot_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
    cr_assert(m == MAP_FAILED && errno == EACCES, "a writable shared mapping of it failed");
    cr_assert(write(afd, "x", 1) < 0 && errno == EBADF, "a write through it failed");
    cr_assert(ftruncate(afd, 0) < 0, "so did a truncate");
    /* the reader's work: lookup, attach, read the K/V in place */
    size_t nc = 0;
    PT_OK(pkv_prefix_lookup(ro, 0, p, 25, &nc));
    cr_assert_eq(nc, 24);
    cr_assert_eq(SOPEN(ro, 1, p, 25), 24);
    uint32_t tab[8];
    cr_assert_eq(PT_BLOCKS(ro, 1, tab, 8), 6);
    char err[256];
    uint64_t h = pt_h0(0);
    for (size_t t = 0; t < 24; t++) {
        h = pt_hstep(h, p[t]);
        cr_assert(pt_token_ok(ro, &inf, tab[t / BS], (uint32_t)(t % BS), h, err, sizeof err),
                  "token %zu: %s", t, err);
    }
    uint8_t *kv = pkv_kv(ro, tab[0], 0, PKV_K, 0);
    cr_assert_not_null(kv);
    uint8_t *page = (uint8_t *)((uintptr_t)kv & ~(uintptr_t)4095);
    cr_assert(mprotect(page, 4096, PROT_READ | PROT_WRITE) < 0 && errno == EACCES,
              "the handle's mapping cannot be made writable");
    pid_t ch = fork();
    cr_assert(ch >= 0);
    if (ch == 0) {
        signal(SIGSEGV, SIG_DFL);
        *(volatile uint8_t *)kv ^= 1; /* must fault */
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(ch, &st, 0), ch);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "a store through pkv_kv "
              "faulted (status 0x%x)", st);
    /* the calls that would hand out slots or change a sequence */
    pkv_slot sl[2];
    PT_ERR(pkv_seq_append(ro, 1, &p[24], 1, sl), PKV_ERDONLY);
    PT_ERR(pkv_seq_commit(ro, 1, 1), PKV_ERDONLY);
    PT_ERR(pkv_seq_commit_append(ro, 1, 0, &p[24], 1, sl), PKV_ERDONLY);
    pkv_step one = {.id = 1, .token = p[24]};
    size_t done = 7;
    PT_ERR(pkv_seq_step_batch(ro, &one, 1, &done), PKV_ERDONLY);
    cr_assert_eq(done, 0);
    PT_ERR(pkv_seq_fork(ro, 1, 2), PKV_ERDONLY);
    PT_ERR(pkv_seq_truncate(ro, 1, 4), PKV_ERDONLY);
    PT_ERR(pkv_sync(ro), PKV_ERDONLY);
    cr_assert(strstr(pkv_last_error(), "read-only"), "message '%s'", pkv_last_error());
    pkv_seq_info si = PT_SEQ_INFO(ro, 1);
    cr_assert(si.len == 24 && si.committed == 24, "the refused calls changed nothing");
    pkv_stats s = pt_stats(ro);
    cr_assert_eq(s.sequences, s0.sequences + 1);
    PT_OK(pkv_seq_close(ro, 1));
    pkv_close(ro);
    s = wait_sequences(w, s0.sequences);
    cr_assert(s.sequences == s0.sequences && s.blocks_used == s0.blocks_used);
    PT_VERIFY(w, 1, 0, p, 25, 25);
    pkv_close(w);
    daemon_stop(d, SIGTERM);
    offline_check();
}

/* --allow-uid-ro: every connection of that uid is read-only, with no request from
 * it; and since that uid cannot open the 0600 arena itself, it cannot reopen its
 * descriptor writable either (/proc/self/fd). A uid that can already write the
 * arena (the daemon's own) is refused as a read-only uid, at startup. */
Test(pkvd, a_read_only_uid_gets_only_a_read_only_arena)
{
    daemon_paths();
    char own[32];
    snprintf(own, sizeof own, "%u", (unsigned)getuid());
    pid_t b = fork();
    cr_assert(b >= 0);
    if (b == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execl(getenv("PKVD"), "pkvd", "--allow-uid-ro", own, "--dir", dir_path, "--socket",
              sock_path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    cr_assert_eq(waitpid(b, &st, 0), b);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--allow-uid-ro of its own uid: 0x%x", st);
    if (geteuid() != 0) cr_skip_test("needs root to run a client as another uid");
    cr_assert_eq(chmod(pt_dir, 0711), 0);
    pid_t d = daemon_start_with("--socket-mode", "666", "--allow-uid-ro", "65534");
    uint32_t p[13];
    prompt(p, 13, 3131);
    pkv_cache *w = connect_ok();
    open_fill(w, 1, p, 13);
    pid_t ch = fork();
    cr_assert(ch >= 0);
    if (ch == 0) {
        if (setgid(65534) || setuid(65534)) _exit(100);
        uint64_t before = arena_fds();
        pkv_cache *c = NULL;
        if (pkv_connect(sock_path, &c)) _exit(1); /* a plain connect */
        uint64_t mine = arena_fds() & ~before;
        if (!mine) _exit(2);
        int afd = __builtin_ctzll(mine);
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", afd);
        if ((fcntl(afd, F_GETFL) & O_ACCMODE) != O_RDONLY) _exit(3);
        if (open(path, O_RDWR) >= 0 || errno != EACCES) _exit(4); /* no way back to write */
        size_t nc = 0;
        pkv_slot sl;
        if (pkv_prefix_lookup(c, 0, p, 13, &nc) || nc != 12) _exit(5);
        if (pkv_seq_open(c, 1, 0, p, 13, &nc) || nc != 12) _exit(6);
        if (pkv_seq_append(c, 1, &p[12], 1, &sl) != PKV_ERDONLY) _exit(7);
        pkv_close(c);
        _exit(0);
    }
    cr_assert_eq(waitpid(ch, &st, 0), ch);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the read-only uid's client: status 0x%x "
              "(100: no setuid; 1: connect; 2-4: descriptor; 5-7: calls)", st);
    pkv_close(w);
    daemon_stop(d, SIGTERM);
}

/* ---- Daemon death under load: what each durability mode keeps ------------------------- */

/* What a client reports to the test, one record per acknowledged call, written
 * after the reply (a pipe write this small is atomic, and ordered per client). */
typedef struct ack {
    uint32_t client, conn; /* conn: the client's connection (one daemon life) */
    uint32_t iter, n;      /* iter's prompt has n tokens, all committed */
    uint32_t kind;         /* ACK_COMMIT, ACK_SYNC (everything before it on conn) */
} ack;
enum { ACK_COMMIT = 1, ACK_SYNC = 2 };

/* The prompt of (client, iter): one of four stems of 12 tokens, then a tail of
 * tokens from {0, 1, 2}, 2 to 38 tokens in all. A pure function, so the test
 * regenerates what a client committed. A client's prompts repeat after 512
 * (later rounds attach what earlier ones committed), which bounds the blocks the
 * run needs (2 x 512 x 10) below the capacity: nothing is evicted, so a prefix
 * not found again was lost, not evicted. */
static size_t ack_prompt(uint32_t client, uint32_t iter, uint32_t *p)
{
    iter %= 512;
    pt_rng r = {.s = ((uint64_t)client << 32 | iter) * 0x9E3779B97F4A7C15ull + 1};
    size_t n = 2 + pt_below(&r, 37);
    uint32_t stem = pt_below(&r, 4);
    for (size_t i = 0; i < n; i++) p[i] = i < 12 ? 100 * stem + (uint32_t)i : pt_below(&r, 3);
    return n;
}

/* Check the K/V of every attached token of `id` (prompt p, nc cached): 0, 1 and
 * a message on the first wrong one, or pkv_seq_blocks' error. */
static int attached_check(pkv_cache *c, const pkv_cache_info *inf, uint64_t id,
                          const uint32_t *p, size_t nc, char *err, size_t cap)
{
    uint32_t tab[16];
    size_t nb = 0;
    int rc = pkv_seq_blocks(c, id, tab, 16, &nb);
    if (rc) {
        snprintf(err, cap, "pkv_seq_blocks: %s", pkv_last_error());
        return rc;
    }
    uint64_t h = pt_h0(0);
    for (size_t t = 0; t < nc; t++) {
        h = pt_hstep(h, p[t]);
        if (!pt_token_ok(c, inf, tab[t / BS], (uint32_t)(t % BS), h, err, cap)) return 1;
    }
    return 0;
}

/* A client that works across daemon restarts until *stop: it opens a prompt,
 * checks the K/V of every attached token, appends and writes the rest, commits,
 * now and then syncs, closes; it reports each acknowledged commit and sync on
 * `acks`. On PKV_EDISCONNECTED it closes its handle (rule W3: the restarted
 * daemon waits for that) and connects again, for 30 s at most. Exit 0 when
 * stopped, 1 on wrong K/V, 2 on an undocumented error, 3 when no daemon came
 * back. */
static void reconnecting_client(uint32_t id, int acks, const volatile int *stop)
{
    uint32_t p[40], conn = 0, iter = 0;
    pkv_slot slots[40];
    char err[256];
    while (!*stop) {
        pkv_cache *c = NULL;
        for (int t = 0; pkv_connect(sock_path, &c); t++) {
            if (*stop) _exit(0);
            if (t > 15000) _exit(3);
            struct timespec w = {0, 2000000L};
            nanosleep(&w, NULL);
        }
        conn++;
        pkv_cache_info inf;
        pkv_info(c, &inf);
        int rc = 0;
        for (; !*stop; iter++) {
            size_t n = ack_prompt(id, iter, p), nc = 0;
            if ((rc = pkv_seq_open(c, 1, 0, p, n, &nc))) break;
            if ((rc = attached_check(c, &inf, 1, p, nc, err, sizeof err)) == 1) {
                fprintf(stderr, "client %u: wrong K/V (%zu attached): %s\n", id, nc, err);
                _exit(1);
            }
            if (rc) break;
            uint64_t h = pt_hprefix(0, p, nc);
            if (n > nc && !(rc = pkv_seq_append(c, 1, p + nc, n - nc, slots))) {
                for (size_t i = 0; i < n - nc; i++) {
                    h = pt_hstep(h, p[nc + i]);
                    pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
                }
                rc = pkv_seq_commit(c, 1, n - nc);
            }
            if (rc) break;
            ack a = {id, conn, iter, (uint32_t)n, ACK_COMMIT};
            if (write(acks, &a, sizeof a) != (ssize_t)sizeof a) _exit(2);
            if (iter % 5 == 4) {
                if ((rc = pkv_sync(c))) break;
                a.kind = ACK_SYNC;
                if (write(acks, &a, sizeof a) != (ssize_t)sizeof a) _exit(2);
            }
            if ((rc = pkv_seq_close(c, 1))) break;
        }
        pkv_close(c);
        if (rc && rc != PKV_EDISCONNECTED) {
            fprintf(stderr, "client %u: %s (%s)\n", id, pkv_strerror(rc), pkv_last_error());
            _exit(2);
        }
    }
    _exit(0);
}

/* The test's record of the acknowledged commits: which are guaranteed to
 * survive a daemon crash in `mode` (always: every one; group and none: those a
 * later sync of the same connection acknowledged), and which of those were
 * checked after the last restart. */
typedef struct ack_book {
    ack *a;
    bool *sure, *checked;
    size_t n, cap;
    size_t nsure; /* how many of a[] are sure */
} ack_book;

static void book_drain(ack_book *b, int fd, bool always)
{
    ack x;
    while (read(fd, &x, sizeof x) == (ssize_t)sizeof x) {
        if (x.kind == ACK_SYNC) { /* makes this connection's earlier commits sure */
            for (size_t i = b->n; i-- > 0;)
                if (b->a[i].client == x.client && b->a[i].conn == x.conn && !b->sure[i]) {
                    b->sure[i] = true;
                    b->nsure++;
                }
            continue;
        }
        if (b->n == b->cap) {
            b->cap = b->cap ? 2 * b->cap : 1024;
            b->a = realloc(b->a, b->cap * sizeof *b->a);
            b->sure = realloc(b->sure, b->cap);
            b->checked = realloc(b->checked, b->cap);
            cr_assert(b->a && b->sure && b->checked);
        }
        b->a[b->n] = x;
        b->sure[b->n] = always;
        b->checked[b->n] = false;
        b->n++;
        b->nsure += always;
    }
}

/* Drain until the book holds at least `want` sure commits: the clients' progress
 * since the last restart decides when that is, which a loaded machine makes
 * slow, so the wait is bounded by 60 s, not by a fixed share of a kill's
 * interval. Fails early, naming it, when a client ended. */
static void book_wait_sure(ack_book *b, int fd, bool always, size_t want, const pid_t cl[2],
                           const char *mode, int round)
{
    for (int t = 0; t < 30000; t++) {
        book_drain(b, fd, always);
        if (b->nsure >= want) return;
        for (int i = 0; i < 2; i++) {
            int st = 0;
            cr_assert_eq(waitpid(cl[i], &st, WNOHANG), 0, "%s, kill %d: client %d ended, "
                         "status 0x%x (1: wrong K/V, 2: an undocumented error, 3: no daemon)",
                         mode, round, i, st);
        }
        usleep(2000);
    }
    cr_assert(false, "%s, kill %d: %zu promised commits after 60 s, waiting for %zu", mode,
              round, b->nsure, want);
}

/* After a restart: every sure commit not yet checked (all: every sure one) is
 * found again by prefix, with its K/V. Returns how many were checked. */
static size_t book_check(ack_book *b, bool all, const char *mode, int round)
{
    pkv_cache *c = connect_ok();
    pkv_cache_info inf = pt_info(c);
    uint32_t p[40];
    char err[256];
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (!b->sure[i] || (b->checked[i] && !all)) continue;
        size_t n = ack_prompt(b->a[i].client, b->a[i].iter, p), nc = 0;
        cr_assert_eq(n, b->a[i].n);
        size_t want = (n - 1) / BS * BS; /* whole sealed blocks, n-1 cap */
        /* The side-effect-free lookup for each (an open and a close are two
         * durable records in `always`: two syncs each); the K/V of every 8th
         * read back (the clients check it on every open). */
        if (k++ % 8) {
            PT_OK(pkv_prefix_lookup(c, 0, p, n, &nc));
            cr_assert(nc >= want, "%s, round %d: client %u's acknowledged commit %u (%zu "
                      "tokens, connection %u) lost: %zu cached, %zu expected", mode, round,
                      b->a[i].client, b->a[i].iter, n, b->a[i].conn, nc, want);
            b->checked[i] = true;
            continue;
        }
        PT_OK(pkv_seq_open(c, 1, 0, p, n, &nc));
        cr_assert(nc >= want, "%s, round %d: client %u's acknowledged commit %u (%zu tokens, "
                  "connection %u) lost: %zu cached, %zu expected", mode, round, b->a[i].client,
                  b->a[i].iter, n, b->a[i].conn, nc, want);
        cr_assert_eq(attached_check(c, &inf, 1, p, nc, err, sizeof err), 0, "%s, round %d: %s",
                     mode, round, err);
        PT_OK(pkv_seq_close(c, 1));
        b->checked[i] = true;
    }
    pkv_stats s = pt_stats(c);
    cr_assert_eq(s.evictions, 0, "%s: evictions make the check inexact (raise --capacity)", mode);
    pkv_close(c);
    return k;
}

/* Start the daemon in `mode`, draining the acknowledgements while it gets
 * ready (it waits for both clients to notice the kill and close, rule W3:
 * seconds on a loaded machine); on no READY in 60 s, say where each client is
 * (its wchan). */
static pid_t restart_draining(const char *mode, ack_book *b, int acks, bool always,
                              const pid_t cl[2])
{
    int ready;
    pid_t d = daemon_spawn("--durability", mode, NULL, NULL, NULL, &ready);
    int r = 0;
    for (int t = 0; t < 1200 && r == 0; t++) {
        book_drain(b, acks, always);
        r = wait_ready(ready, 50);
    }
    close(ready);
    if (r != 1) {
        for (int i = 0; i < 2; i++) {
            char path[64], w[128] = "?";
            snprintf(path, sizeof path, "/proc/%d/wchan", (int)cl[i]);
            FILE *f = fopen(path, "r");
            if (f) {
                size_t n = fread(w, 1, sizeof w - 1, f);
                w[n] = '\0';
                fclose(f);
            }
            cr_log_info("%s: client %d (pid %d) waits in %s", mode, i, (int)cl[i], w);
        }
    }
    cr_assert(r != 0, "%s: pkvd did not get ready in 60 s (clients: see the log)", mode);
    cr_assert(r == 1, "%s: pkvd exited before it was ready", mode);
    return d;
}

/* pkvd SIGKILLed at random points (1-30 ms into the work) under two client
 * processes that reconnect after each restart, in each durability mode: no
 * client ever attaches K/V that is not its prefix's (checked on every open), and
 * every acknowledged commit the mode promises survives (always: every one;
 * group, none: every one before an acknowledged pkv_sync of its connection), found
 * by prefix after the restart with its K/V. PKV_PKVD_MODE_KILLS kills per mode
 * (20). */
Test(pkvd, killing_the_daemon_keeps_what_its_durability_mode_promises)
{
    static const char *const big[] = {"--capacity", "12288", NULL};
    static const char *const modes[] = {"always", "group", "none"};
    int kills = (int)pt_env_u64("PKV_PKVD_MODE_KILLS", 20);
    pt_rng r = {.s = 0xacdcu};
    volatile int *stop = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
    cr_assert(stop != MAP_FAILED);
    for (size_t m = 0; m < 3; m++) {
        char sub[32];
        snprintf(sub, sizeof sub, "cache-%s", modes[m]);
        pt_path(dir_path, sizeof dir_path, sub);
        pt_path(sock_path, sizeof sock_path, "pkvd.sock");
        geometry = big;
        bool always = m == 0;
        *stop = 0;
        int ap[2];
        cr_assert_eq(pipe(ap), 0);
        cr_assert_eq(fcntl(ap[0], F_SETFL, O_NONBLOCK), 0);
        fcntl(ap[0], F_SETPIPE_SZ, 1 << 20); /* best effort: fewer waits on a full pipe */
        pid_t d = daemon_start_with("--durability", modes[m], NULL, NULL);
        pid_t cl[2];
        for (int i = 0; i < 2; i++) {
            cl[i] = fork();
            cr_assert(cl[i] >= 0);
            if (cl[i] == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                close(ap[0]);
                reconnecting_client((uint32_t)i + 1, ap[1], stop);
            }
        }
        close(ap[1]);
        ack_book b = {0};
        size_t checked = 0;
        for (int k = 0; k < kills; k++) {
            /* Kill k comes 1-30 ms after the run holds k + 1 promised commits (at
             * once on a quiet machine, where the clients are ahead), so the end's
             * count below is met however slowly a loaded machine runs them. */
            book_wait_sure(&b, ap[0], always, (size_t)k + 1, cl, modes[m], k);
            struct timespec ts = {0, (long)(1 + pt_below(&r, 30)) * 1000000L};
            nanosleep(&ts, NULL);
            daemon_stop(d, SIGKILL);
            for (int i = 0; i < 2; i++) {
                int st = 0;
                cr_assert_eq(waitpid(cl[i], &st, WNOHANG), 0, "%s, kill %d: client %d ended, "
                             "status 0x%x (1: wrong K/V, 2: an undocumented error)",
                             modes[m], k, i, st);
            }
            /* Ready only once both clients closed their handles (rule W3), so
             * every acknowledgement of the killed daemon is in the pipe; it is
             * drained while the daemon waits, so a client never blocks on a full
             * pipe with its handle open. */
            d = restart_draining(modes[m], &b, ap[0], always, cl);
            checked += book_check(&b, false, modes[m], k);
        }
        *stop = 1;
        for (int i = 0; i < 2; i++) { /* draining: a client may wait on a full pipe */
            int st = 0;
            pid_t got = 0;
            for (int t = 0; t < 6000 && (got = waitpid(cl[i], &st, WNOHANG)) == 0; t++) {
                book_drain(&b, ap[0], always);
                usleep(10000);
            }
            cr_assert_eq(got, cl[i], "%s: client %d did not stop in 60 s", modes[m], i);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: client %d status 0x%x",
                      modes[m], i, st);
        }
        /* Once more, a last kill with no client: every sure commit of the mode's
         * whole run is still there after all those crashes. */
        daemon_stop(d, SIGKILL);
        d = daemon_start_with("--durability", modes[m], NULL, NULL);
        book_drain(&b, ap[0], always);
        size_t sure = book_check(&b, true, modes[m], kills);
        cr_log_info("%s: %d kills, %zu acknowledged commits, %zu of them promised and "
                    "checked at their restart, %zu re-checked at the end", modes[m], kills, b.n,
                    checked, sure);
        cr_assert(sure >= (size_t)kills && sure == b.nsure,
                  "%s: %zu promised commits checked (%zu in the book), fewer than the %d kills",
                  modes[m], sure, b.nsure, kills);
        daemon_stop(d, SIGTERM);
        geometry = NULL;
        close(ap[0]);
        free(b.a), free(b.sure), free(b.checked);
        pkv_options o;
        pt_opts(&o, 2, 2, 4, BS, PKV_F32, 12288);
        pkv_cache *c = pt_open_sub(sub, &o);
        PT_CHECK(c);
        pt_close(c);
        cr_assert_eq(pt_rmrf(dir_path), 0); /* 48 MiB of arena per mode */
    }
    munmap((void *)stop, 4096);
}

/* ---- Limits ------------------------------------------------------------------------------ */

/* --max-clients: a connection past the limit gets PKV_EBUSY from pkv_connect at
 * once, with a message naming the option, not a hang; once a client closes, a new
 * one is served. */
Test(pkvd, a_client_past_max_clients_is_refused_clearly)
{
    daemon_paths();
    pid_t d = daemon_start_with("--max-clients", "2", NULL, NULL);
    pkv_cache *a = connect_ok(), *b = connect_ok(), *x = (pkv_cache *)&x;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    PT_ERR(pkv_connect(sock_path, &x), PKV_EBUSY);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_null(x);
    cr_assert(strstr(pkv_last_error(), "--max-clients"), "message '%s'", pkv_last_error());
    cr_assert(t1.tv_sec - t0.tv_sec < 2, "the refusal took %ld s", (long)(t1.tv_sec - t0.tv_sec));
    uint32_t p[13];
    prompt(p, 13, 4545);
    open_fill(b, 1, p, 13); /* the served ones are unaffected */
    pkv_close(a);
    int rc = PKV_EBUSY;
    for (int t = 0; t < 2000 && rc == PKV_EBUSY; t++) { /* the daemon sees a's close */
        rc = pkv_connect(sock_path, &x);
        if (rc == PKV_EBUSY) usleep(1000);
    }
    cr_assert_eq(rc, 0, "a client after one closed: %d (%s)", rc, pkv_last_error());
    size_t nc = 0;
    PT_OK(pkv_prefix_lookup(x, 0, p, 13, &nc));
    cr_assert_eq(nc, 12);
    pkv_close(x);
    pkv_close(b);
    daemon_stop(d, SIGTERM);
}

/* --client-timeout: a client that stops in the middle of a frame gets an error
 * reply naming the option and its connection ends, within about the timeout; a
 * client that only rests between frames is not affected. */
Test(pkvd, a_client_stalled_mid_frame_is_ended_after_the_timeout)
{
    daemon_paths();
    pid_t d = daemon_start_with("--client-timeout", "1", NULL, NULL);
    pkv_cache *idle = connect_ok();
    int fd = raw_connect();
    struct timeval tv = {.tv_sec = 15}; /* fail, not hang, if the daemon never ends it */
    cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    uint8_t f[64];
    hdr(f, 0x44564B50u, WIRE_V, 1, 8);
    memset(f + 16, 0, 8);
    f[16] = WIRE_V, f[18] = WIRE_V;
    cr_assert_eq(send(fd, f, 24, MSG_NOSIGNAL), 24);
    cr_assert_eq(read_reply(fd), 0);
    hdr(f, 0x44564B50u, WIRE_V, 2, 8 + 4 + 4 * 100); /* a LOOKUP of 100 tokens, 3 sent */
    memset(f + 16, 0, 24);
    put32(f + 24, 100);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(send(fd, f, 16 + 12 + 12, MSG_NOSIGNAL), 40);
    cr_assert_eq(read_reply(fd), PKV_EINVAL, "the stalled frame's error reply");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert(s >= 0.9 && s < 10, "ended after %.2f s (timeout 1 s)", s);
    cr_assert_eq(read_reply(fd), 1, "the connection ends");
    close(fd);
    sleep(2); /* longer than the timeout, between frames */
    uint32_t p[13];
    prompt(p, 13, 8080);
    size_t nc = 9;
    PT_OK(pkv_prefix_lookup(idle, 0, p, 13, &nc));
    cr_assert_eq(nc, 0);
    pkv_close(idle);
    daemon_stop(d, SIGTERM);
}

/* --socket-group NAME: the socket file gets that group and mode 0660; an unknown
 * group stops the daemon before it listens (status 2). */
Test(pkvd, socket_group_sets_the_group_and_mode_0660)
{
    daemon_paths();
    struct group *g = getgrgid(getgid()); /* one this process may chgrp to */
    cr_assert_not_null(g);
    char name[64];
    snprintf(name, sizeof name, "%s", g->gr_name);
    pid_t d = daemon_start_with("--socket-group", name, NULL, NULL);
    struct stat st;
    cr_assert_eq(stat(sock_path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0660, "the socket is 0%o", st.st_mode & 0777);
    cr_assert_eq(st.st_gid, getgid());
    pkv_close(connect_ok());
    daemon_stop(d, SIGTERM);
    if (geteuid() == 0 && getgrnam("nogroup")) { /* another group than the daemon's */
        d = daemon_start_with("--socket-group", "nogroup", NULL, NULL);
        cr_assert_eq(stat(sock_path, &st), 0);
        cr_assert_eq(st.st_gid, getgrnam("nogroup")->gr_gid);
        cr_assert_eq(st.st_mode & 0777, 0660);
        daemon_stop(d, SIGTERM);
    }
    pid_t b = fork();
    cr_assert(b >= 0);
    if (b == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execl(getenv("PKVD"), "pkvd", "--socket-group", "no-such-group-pkvd", "--dir",
              dir_path, "--socket", sock_path, (char *)NULL);
        _exit(127);
    }
    int stt = 0;
    cr_assert_eq(waitpid(b, &stt, 0), b);
    cr_assert(WIFEXITED(stt) && WEXITSTATUS(stt) == 2, "unknown group: status 0x%x", stt);
}

/* ---- pkv-demo against a pkvd ---------------------------------------------------------- */

/* Run $PKV_DEMO with the tiny workload and `extra` (a shell fragment); its
 * stdout and stderr into out. Returns its exit status. */
static int run_demo(const char *extra, char *out, size_t cap)
{
    const char *bin = getenv("PKV_DEMO");
    cr_assert(bin && bin[0], "$PKV_DEMO is not set");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' --preset tiny --users 2 --turns 1 --samples 1 "
             "--system-tokens 64 --message-tokens 16-32 --answer-tokens 4 --quiet %s 2>&1", bin,
             extra);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The two-command way of docs/pkvd.md: pkvd started with the options
 * `pkv-demo --pkvd-args` prints, then `pkv-demo --socket`: both runs are client
 * processes of the daemon, the second finds the first's prompts cached, their
 * outputs are identical, and nothing stays open. A demo of another model is
 * refused with a message that says how to start the right pkvd. */
Test(pkvd, the_demo_runs_against_a_pkvd_started_with_the_options_it_prints)
{
    daemon_paths();
    static char line[1024];
    char *out = malloc(1 << 16);
    cr_assert_not_null(out);
    cr_assert_eq(run_demo("--pkvd-args", line, sizeof line), 0, "--pkvd-args: %s", line);
    static const char *args[32];
    size_t na = 0;
    for (char *save = NULL, *t = strtok_r(line, " \n", &save); t && na < 31;
         t = strtok_r(NULL, " \n", &save))
        args[na++] = t;
    args[na] = NULL;
    cr_assert(na >= 16 && !strcmp(args[na - 2], "--model-id"), "--pkvd-args printed %zu words", na);
    geometry = args;
    pid_t d = daemon_start();
    geometry = NULL;
    char sock[400];
    snprintf(sock, sizeof sock, "--socket '%s'", sock_path);
    int rc = run_demo(sock, out, 1 << 16);
    cr_assert_eq(rc, 0, "pkv-demo --socket: status %d\n%s", rc, out);
    cr_assert(strstr(out, "cold run: new client process of pkvd") &&
                  strstr(out, "warm run: another new client process of pkvd") &&
                  strstr(out, "identical in both runs: yes"),
              "pkv-demo --socket printed:\n%s", out);
    /* the first run found a new cache: it computed prompt tokens, the second far fewer */
    unsigned cold_n = 0, warm_n = 0;
    const char *pc = strstr(out, "prompt tokens"), *pw = pc ? strstr(pc + 1, "prompt tokens") : NULL;
    cr_assert(pc && pw && sscanf(pc, "prompt tokens %u computed", &cold_n) == 1 &&
                  sscanf(pw, "prompt tokens %u computed", &warm_n) == 1,
              "no prompt-token lines:\n%s", out);
    cr_assert(cold_n > 0 && warm_n < cold_n, "computed %u cold, %u warm", cold_n, warm_n);
    pkv_cache *c = connect_ok();
    pkv_stats s = wait_sequences(c, 0);
    cr_assert_eq(s.sequences, 0, "the demo's sequences were released");
    cr_assert(s.hit_tokens > 0);
    pkv_close(c);
    char other[512];
    snprintf(other, sizeof other, "--socket '%s' --seed 2", sock_path); /* other weights */
    rc = run_demo(other, out, 1 << 16);
    cr_assert_eq(rc, 1, "a demo of another model: status %d\n%s", rc, out);
    cr_assert(strstr(out, "another geometry or model") && strstr(out, "--pkvd-args"),
              "the refusal says how to start the right pkvd:\n%s", out);
    free(out);
    daemon_stop(d, SIGTERM);
}

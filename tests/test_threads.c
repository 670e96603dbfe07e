/* Several threads drive their own sequences on one cache at once, sharing prefixes,
 * forking, truncating and forcing evictions; K/V is written into appended slots
 * without any lock. Every hit must still be a true prefix with the right K/V. */
#include "pkv_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

TestSuite(threads, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
enum { THREADS = 4, ITERS = 250, PLEN = 30 };

typedef struct {
    pkv_cache *c;
    pkv_cache_info inf;
    int tid;
    atomic_int *failed;
    char msg[512];
} worker;

#define WFAIL(w, ...)                                                               \
    do {                                                                            \
        snprintf((w)->msg, sizeof (w)->msg, __VA_ARGS__);                           \
        atomic_store((w)->failed, 1);                                               \
        return false;                                                               \
    } while (0)

/* Thread-safe verification of one sequence (no Criterion asserts off the main
 * thread). */
static bool wverify(worker *w, uint64_t id, const uint32_t *t, size_t len, size_t committed)
{
    pkv_seq_info si;
    int r = pkv_seq_get_info(w->c, id, &si);
    if (r)
        WFAIL(w, "seq_info(%llu) -> %d", (unsigned long long)id, r);
    if (si.len != len || si.committed != committed)
        WFAIL(w, "seq %llu: len %llu committed %llu, expected %zu %zu", (unsigned long long)id,
              (unsigned long long)si.len, (unsigned long long)si.committed, len, committed);
    uint32_t toks[PLEN + 8], tab[PLEN / BS + 4];
    size_t nt = 0, nb = 0;
    if ((r = pkv_seq_tokens(w->c, id, toks, PLEN + 8, &nt)) || nt != len)
        WFAIL(w, "seq_tokens(%llu) -> %d, %zu tokens", (unsigned long long)id, r, nt);
    if (memcmp(toks, t, len * sizeof *t) != 0)
        WFAIL(w, "seq %llu: wrong token ids", (unsigned long long)id);
    if ((r = pkv_seq_blocks(w->c, id, tab, PLEN / BS + 4, &nb)) || nb != (len + BS - 1) / BS)
        WFAIL(w, "seq_blocks(%llu) -> %d, %zu blocks", (unsigned long long)id, r, nb);
    uint64_t h = pt_h0(0);
    char err[256];
    for (size_t p = 0; p < len; p++) {
        h = pt_hstep(h, t[p]);
        if (!pt_token_ok(w->c, &w->inf, tab[p / BS], (uint32_t)(p % BS), h, err, sizeof err))
            WFAIL(w, "seq %llu position %zu: %s", (unsigned long long)id, p, err);
    }
    return true;
}

static bool wappend(worker *w, uint64_t id, const uint32_t *t, size_t len, size_t n)
{
    pkv_slot slots[PLEN];
    int r = pkv_seq_append(w->c, id, t + len, n, slots);
    if (r)
        WFAIL(w, "append(%llu, %zu) -> %d (%s)", (unsigned long long)id, n, r, pkv_last_error());
    uint64_t h = pt_hprefix(0, t, len);
    for (size_t i = 0; i < n; i++) {
        h = pt_hstep(h, t[len + i]);
        pt_write_token(w->c, &w->inf, slots[i].block, slots[i].offset, h);
    }
    return true;
}

static bool run_worker(worker *w)
{
    pt_rng rng = {0x7417EADull * (uint64_t)(w->tid + 1)};
    for (int it = 0; it < ITERS && !atomic_load(w->failed); it++) {
        /* Prompts share one of 8 stems across all threads, then diverge. */
        uint32_t t[PLEN], u[PLEN];
        uint32_t stem = pt_below(&rng, 8);
        size_t n = 5 + pt_below(&rng, PLEN - 5);
        for (size_t i = 0; i < n; i++)
            t[i] = i < 12 ? stem * 100 + (uint32_t)i : pt_below(&rng, 3);
        uint64_t id = (uint64_t)w->tid * 1000000 + (uint64_t)it * 2;
        size_t nc = 0;
        int r = pkv_seq_open(w->c, id, 0, t, n, &nc);
        if (r)
            WFAIL(w, "seq_open -> %d", r);
        if (nc % BS || nc > pt_hit_cap(n, BS))
            WFAIL(w, "n_cached %zu for %zu tokens", nc, n);
        if (!wverify(w, id, t, nc, nc))
            return false;
        if (!wappend(w, id, t, nc, n - nc))
            return false;
        if ((r = pkv_seq_commit(w->c, id, n - nc)))
            WFAIL(w, "commit -> %d", r);
        if (!wverify(w, id, t, n, n))
            return false;
        /* Fork, diverge the child, cut the parent back. */
        if ((r = pkv_seq_fork(w->c, id, id + 1)))
            WFAIL(w, "fork -> %d", r);
        memcpy(u, t, n * sizeof *t);
        size_t m = n + 1 + pt_below(&rng, (uint32_t)(PLEN - n));
        if (m > PLEN)
            m = PLEN;
        for (size_t i = n; i < m; i++)
            u[i] = 1000 + pt_below(&rng, 5);
        if (m > n && !wappend(w, id + 1, u, n, m - n))
            return false;
        size_t cut = pt_below(&rng, (uint32_t)n + 1);
        if ((r = pkv_seq_truncate(w->c, id, cut)))
            WFAIL(w, "truncate -> %d", r);
        if (!wverify(w, id, t, cut, cut) || !wverify(w, id + 1, u, m, n))
            return false;
        if (m > n && (r = pkv_seq_commit(w->c, id + 1, m - n)))
            WFAIL(w, "commit child -> %d", r);
        if (!wverify(w, id + 1, u, m, m))
            return false;
        /* Decode both together, a batched step (pkv_seq_step_batch) per token. */
        size_t k = 1 + pt_below(&rng, 4);
        if (cut + k <= PLEN && m + k <= PLEN) {
            for (size_t j = 0; j < k; j++) {
                pkv_step st[2] = {{.id = id, .n_commit = j ? 1 : 0, .token = 7},
                                  {.id = id + 1, .n_commit = j ? 1 : 0, .token = 8}};
                size_t done = 0;
                if ((r = pkv_seq_step_batch(w->c, st, 2, &done)) || done != 2)
                    WFAIL(w, "step batch -> %d, done %zu (%s)", r, done, pkv_last_error());
                uint32_t *arr[2] = {t, u};
                size_t pos[2] = {cut + j, m + j};
                for (int q = 0; q < 2; q++) {
                    arr[q][pos[q]] = st[q].token;
                    uint64_t h = pt_hstep(pt_hprefix(0, arr[q], pos[q]), st[q].token);
                    pt_write_token(w->c, &w->inf, st[q].slot.block, st[q].slot.offset, h);
                }
            }
            if ((r = pkv_seq_commit(w->c, id, 1)) || (r = pkv_seq_commit(w->c, id + 1, 1)))
                WFAIL(w, "commit after decode -> %d", r);
            cut += k;
            m += k;
            if (!wverify(w, id, t, cut, cut) || !wverify(w, id + 1, u, m, m))
                return false;
        }
        if (it % 16 == 0) {
            char why[256] = "";
            if ((r = pkv_check(w->c, why, sizeof why)))
                WFAIL(w, "pkv_check: %s", why);
        }
        if ((r = pkv_seq_close(w->c, id)) || (r = pkv_seq_close(w->c, id + 1)))
            WFAIL(w, "close -> %d", r);
    }
    return true;
}

static void *worker_main(void *arg)
{
    run_worker(arg);
    return NULL;
}

Test(threads, concurrent_sequences_share_prefixes)
{
    /* Small enough to evict all the time, big enough that no call can hit EFULL:
     * each thread holds at most 2 * (PLEN / BS + 1) blocks. */
    pkv_cache *c = pt_open(BS, 96);
    atomic_int failed = 0;
    worker w[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].c = c;
        w[i].inf = pt_info(c);
        w[i].tid = i;
        w[i].failed = &failed;
        cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(w[i].msg[0], '\0', "thread %d: %s", i, w[i].msg);
    cr_assert_eq(atomic_load(&failed), 0);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.sequences, 0);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert(st.hit_blocks > 0, "no prefix was ever shared");
    cr_assert(st.evictions > 0, "no eviction happened");
}

/* ---- Seal checksums computed ahead of a batch on helper threads ------------------ */

enum { SA_SEQS = 8, SA_BS = 16 };

static void sa_fill(uint32_t *t, uint64_t id)
{
    for (uint32_t k = 0; k < SA_BS + 1; k++) t[k] = (uint32_t)(id * 1000u + k);
}

/* With seal_threads 4 and 256 KiB blocks, a pkv_seq_step_batch checksums the blocks
 * its commits will seal on helper threads first, and seal() uses those sums: the
 * internal check in seal() compares each with the checksum of the payload, and a
 * reopen verifies every sealed block of every sequence against the logged sum.
 * A batch that stops at an unknown sequence leaves no block marked (pkv_check
 * I10), and its later steps' blocks then seal with sums computed as usual. */
Test(threads, batch_seal_sums_ahead)
{
    pkv_options o;
    pt_opts(&o, 8, 4, 64, SA_BS, PKV_F32, 64); /* 8*2*4*16*64*4 B = 256 KiB a block */
    o.seal_threads = 4;
    pkv_cache *c = pt_open_sub("ahead", &o);
    pkv_cache_info inf = pt_info(c);
    cr_assert_eq(inf.block_bytes, 256u << 10);
    uint32_t tok[SA_SEQS + 1][SA_BS + 1];
    for (uint64_t id = 1; id <= SA_SEQS; id++) {
        sa_fill(tok[id], id);
        PT_OK(pkv_seq_open(c, id, 0, NULL, 0, NULL));
        PT_APPEND(c, id, 0, tok[id], 0, SA_BS); /* K/V written */
        PT_OK(pkv_seq_commit(c, id, SA_BS - 1)); /* the block's last token pending */
    }
    PT_CHECK(c);
    /* Steps 1-4 seal their block; the unknown sequence stops the batch before 5-8. */
    pkv_step st[SA_SEQS + 1];
    for (size_t i = 0, id = 1; i <= SA_SEQS; i++) {
        st[i].id = i == 4 ? 999 : id++;
        st[i].n_commit = 1;
        st[i].token = 7;
    }
    size_t done = 0;
    PT_ERR(pkv_seq_step_batch(c, st, SA_SEQS + 1, &done), PKV_ENOSEQ);
    cr_assert_eq(done, 4);
    PT_CHECK(c); /* I10: no block still marked */
    pkv_stats s1 = pt_stats(c);
    cr_assert_eq(s1.seal_sums_ahead, SA_SEQS, "%llu sums computed ahead",
                 (unsigned long long)s1.seal_sums_ahead);
    cr_assert_eq(s1.seals, SA_SEQS / 2);
    /* The rest: two of them in a batch (computed ahead again), two one by one. */
    pkv_step st2[2] = {{.id = 5, .n_commit = 1, .token = 7}, {.id = 6, .n_commit = 1, .token = 7}};
    PT_OK(pkv_seq_step_batch(c, st2, 2, &done));
    PT_OK(pkv_seq_commit(c, 7, 1));
    PT_OK(pkv_seq_commit(c, 8, 1));
    PT_CHECK(c);
    pkv_stats s2 = pt_stats(c);
    cr_assert_eq(s2.seal_sums_ahead, SA_SEQS + 2);
    cr_assert_eq(s2.seals, SA_SEQS);
    pt_close(c);
    /* Recovery verifies each sequence's sealed blocks against the logged sums. */
    c = pt_open_sub("ahead", &o);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.seq_blocks_bad, 0);
    cr_assert_eq(rec.sequences, SA_SEQS);
    for (uint64_t id = 1; id <= SA_SEQS; id++) PT_VERIFY(c, id, 0, tok[id], SA_BS, SA_BS);
    PT_CHECK(c);
    pt_close(c);
}

/* seal_threads above the limit is refused at open. */
Test(threads, seal_threads_limit)
{
    pkv_options o;
    pt_opts(&o, 1, 1, 4, 4, PKV_F32, 8);
    o.seal_threads = 65;
    char path[512];
    pt_path(path, sizeof path, "limit");
    pkv_cache *c = NULL;
    PT_ERR(pkv_open(path, &o, &c), PKV_EINVAL);
    cr_assert_null(c);
    o.seal_threads = 64;
    c = pt_open_sub("limit", &o);
    pt_close(c);
}

/* A single commit that seals several blocks (a prefill) checksums them on the
 * seal_threads threads too; one that seals a single block does not. */
Test(threads, commit_seal_sums_ahead)
{
    pkv_options o;
    pt_opts(&o, 8, 4, 64, SA_BS, PKV_F32, 64); /* 256 KiB a block */
    o.seal_threads = 3;
    pkv_cache *c = pt_open_sub("prefill", &o);
    enum { N = 5 * SA_BS + 3 };
    uint32_t t[N + SA_BS];
    for (uint32_t k = 0; k < N + SA_BS; k++) t[k] = 50000u + k;
    PT_OK(pkv_seq_open(c, 1, 0, NULL, 0, NULL));
    PT_APPEND(c, 1, 0, t, 0, N);
    PT_OK(pkv_seq_commit(c, 1, N)); /* seals 5 blocks */
    PT_CHECK(c);
    pkv_stats s1 = pt_stats(c);
    cr_assert_eq(s1.seals, 5);
    cr_assert_eq(s1.seal_sums_ahead, 5, "%llu sums computed ahead",
                 (unsigned long long)s1.seal_sums_ahead);
    PT_APPEND(c, 1, 0, t, N, SA_BS);
    PT_OK(pkv_seq_commit(c, 1, SA_BS)); /* seals 1 block: computed by seal() */
    pkv_stats s2 = pt_stats(c);
    cr_assert_eq(s2.seals, 6);
    cr_assert_eq(s2.seal_sums_ahead, 5);
    PT_CHECK(c);
    pt_close(c);
    c = pt_open_sub("prefill", &o);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.seq_blocks_bad, 0);
    PT_VERIFY(c, 1, 0, t, N + SA_BS, N + SA_BS);
    PT_CHECK(c);
    pt_close(c);
}

/* ---- A batch that waits with the lock released ------------------------------------- */

typedef struct {
    pkv_cache *c;
    atomic_int stop, bad, checks;
    char why[256];
} check_loop_arg;

/* Syncs that take 20 ms, so a step that waits for the log leaves the lock free long
 * enough for another thread to come in; while the batch runs, each counts whether a
 * pkv_check finished during it (the flusher syncs without the lock, the batch waits
 * on a condition variable: the lock is free then). */
static pt_syncio slow_io;
static pkv_io_ops slow_ops;
static check_loop_arg *slow_checks; /* the checker's, while the batch runs */
static atomic_int checks_in_sync;

static void slow_pause(void)
{
    check_loop_arg *a = __atomic_load_n(&slow_checks, __ATOMIC_ACQUIRE);
    int before = a ? atomic_load(&a->checks) : 0;
    usleep(20000);
    if (a && atomic_load(&a->checks) > before) atomic_fetch_add(&checks_in_sync, 1);
}

static int slow_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    if (sync) slow_pause();
    return slow_io.ops.write(ctx, fd, buf, n, off, sync);
}

static int slow_sync(void *ctx, int fd)
{
    slow_pause();
    return slow_io.ops.sync(ctx, fd);
}

static void *check_loop(void *arg)
{
    check_loop_arg *a = arg;
    while (!atomic_load(&a->stop)) {
        char why[256] = "";
        if (pkv_check(a->c, why, sizeof why)) {
            snprintf(a->why, sizeof a->why, "%s", why);
            atomic_store(&a->bad, 1);
            break;
        }
        atomic_fetch_add(&a->checks, 1);
    }
    return NULL;
}

/* A pkv_seq_step_batch marks the blocks its commits will seal with checksums
 * computed ahead (sealsum.c); a later step that needs a block held in limbo waits
 * for the log with the lock released. A pkv_check on another thread during that
 * wait must not report the batch's marks as strays (I10), and the blocks sealed
 * after the wait must verify at reopen (their sums are their payload's). */
Test(threads, a_check_during_a_batch_wait_sees_no_stray_mark)
{
    pt_syncio_init(&slow_io);
    slow_ops = slow_io.ops;
    slow_ops.write = slow_write;
    slow_ops.sync = slow_sync;
    pkv_options o;
    pt_opts(&o, 8, 4, 64, SA_BS, PKV_F32, 8); /* 256 KiB a block, 8 blocks */
    o.seal_threads = 2;
    o.group_commit_us = 10000000; /* flushed only when someone waits */
    o.io = &slow_ops;
    pkv_cache *c = pt_open_sub("wait", &o);
    uint32_t p[SA_BS + 1], r[SA_BS + 1], f[1];
    for (uint32_t k = 0; k <= SA_BS; k++) {
        p[k] = 70000u + k;
        r[k] = 80000u + k;
    }
    /* 1: a full block of pending tokens, which the batch's second step seals */
    PT_OK(pkv_seq_open(c, 1, 0, NULL, 0, NULL));
    PT_APPEND(c, 1, 0, p, 0, SA_BS);
    /* 2: a sealed block; its next token needs a new block */
    PT_OK(pkv_seq_open(c, 2, 0, NULL, 0, NULL));
    PT_APPEND(c, 2, 0, r, 0, SA_BS);
    PT_OK(pkv_seq_commit(c, 2, SA_BS));
    PT_OK(pkv_sync(c));
    /* six open blocks holding a committed token each, freed into limbo: their
     * SEQ_CLOSE records wait for the next group commit (10 s away) */
    for (uint64_t id = 10; id < 16; id++) {
        f[0] = 90000u + (uint32_t)id;
        PT_OK(pkv_seq_open(c, id, 0, NULL, 0, NULL));
        PT_APPEND(c, id, 0, f, 0, 1);
        PT_OK(pkv_seq_commit(c, id, 1));
        PT_OK(pkv_seq_close(c, id));
    }
    pkv_stats s0 = pt_stats(c);
    cr_assert_eq(s0.blocks_used, 2);
    check_loop_arg a = {.c = c};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, check_loop, &a), 0);
    while (atomic_load(&a.checks) == 0) usleep(100);
    __atomic_store_n(&slow_checks, &a, __ATOMIC_RELEASE);
    /* step 1 (sequence 2) waits for limbo; step 2's block is marked meanwhile */
    pkv_step st[2] = {{.id = 2, .n_commit = 0, .token = r[SA_BS]},
                      {.id = 1, .n_commit = SA_BS, .token = p[SA_BS]}};
    size_t done = 0;
    PT_OK(pkv_seq_step_batch(c, st, 2, &done));
    cr_assert_eq(done, 2);
    __atomic_store_n(&slow_checks, NULL, __ATOMIC_RELEASE);
    atomic_store(&a.stop, 1);
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&a.bad), 0, "pkv_check during the batch: %s", a.why);
    cr_assert(atomic_load(&checks_in_sync) > 0,
              "no pkv_check ran while the batch waited for the log: the test saw nothing");
    pkv_stats s1 = pt_stats(c);
    cr_assert_eq(s1.seal_sums_ahead, 1, "%llu sums computed ahead",
                 (unsigned long long)s1.seal_sums_ahead);
    PT_CHECK(c);
    pkv_cache_info inf = pt_info(c);
    pt_write_token(c, &inf, st[0].slot.block, st[0].slot.offset, pt_hprefix(0, r, SA_BS + 1));
    pt_write_token(c, &inf, st[1].slot.block, st[1].slot.offset, pt_hprefix(0, p, SA_BS + 1));
    PT_OK(pkv_seq_commit(c, 2, 1));
    PT_OK(pkv_seq_commit(c, 1, 1));
    pt_close(c);
    c = pt_open_sub("wait", &o);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.seq_blocks_bad, 0);
    PT_VERIFY(c, 1, 0, p, SA_BS + 1, SA_BS + 1);
    PT_VERIFY(c, 2, 0, r, SA_BS + 1, SA_BS + 1);
    PT_CHECK(c);
    pt_close(c);
}

/* Multi-threaded stress on one shared cache, written to run under ThreadSanitizer.
 *
 * WORKERS threads each open sequences whose prompts share one of a few stems (so
 * blocks are shared through prefix hits, forks and dedupes), append in chunks and
 * decode-style one token at a time, commit, fork, truncate (pending tokens only,
 * and below the committed length), and close them; each also keeps up to two
 * long-lived sequences that grow and shrink. The capacity is small enough that
 * cached blocks are evicted all the time (the cache starts full of cached blocks
 * no worker can hit), and large enough that no call can fail with PKV_EFULL.
 * Meanwhile a maintenance thread loops over pkv_get_stats (I1: free + cached + used =
 * capacity) and pkv_seq_list + pkv_seq_get_info, with a pkv_sync every 8th, a
 * pkv_checkpoint every 32nd and a pkv_check every 64th loop. Every thread checks
 * each of its sequences against its own model: info, token ids, and the K/V of
 * every position (written without a lock into the slots appends return, following
 * pkv_test.h's prefix-hash convention, so a wrong prefix hit, copy or dedupe
 * shows).
 * At the end: pkv_check, every kept sequence verified, close, reopen, pkv_check,
 * and the kept sequences come back with exactly their committed tokens.
 *
 * Time-bounded: each test runs PKV_STRESS_MS milliseconds (default 1500) and at
 * least PKV_STRESS_MIN_ITERS iterations per worker (default 10). The log goes
 * through the default io_uring backend (which gives TSan no false reports), or
 * through the synchronous test backend pt_syncio with PKV_STRESS_SYNCIO=1.
 * Built with Criterion normally and with tests/nocriterion under TSan. */
#include "pkv_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(stress, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
enum {
    WORKERS = 6,
    MAXL = 48,          /* tokens per sequence at most */
    STEMS = 6,
    STEMLEN = 16,       /* 4 full blocks shared by every prompt of a stem */
    KEEP = 2,           /* long-lived sequences per worker */
    /* per worker at most KEEP + 2 sequences of ceil(MAXL / BS) blocks, +1 copy each */
    CAP = WORKERS * (KEEP + 2) * (MAXL / BS + 1) + 64,
};

typedef struct tseq {
    uint64_t id, salt;
    uint32_t tok[MAXL];
    size_t len, committed;
} tseq;

typedef struct worker {
    pkv_cache *c;
    pkv_cache_info inf;
    int tid;
    uint64_t next_id;
    pt_rng rng;
    const uint32_t (*stems)[STEMLEN];
    tseq kept[KEEP];
    size_t n_kept;
    uint64_t iters, appends, forks, truncs, hits;
    atomic_int *failed;
    atomic_int *stop;
    struct timespec deadline;
    uint64_t min_iters;
    char msg[512];
} worker;

#define WFAIL(w, ...)                                                                   \
    do {                                                                                \
        if (!(w)->msg[0])                                                               \
            snprintf((w)->msg, sizeof (w)->msg, __VA_ARGS__);                           \
        atomic_store((w)->failed, 1);                                                   \
        return false;                                                                   \
    } while (0)

static bool past(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

/* Info, token ids, table, and the K/V of positions [0, kv_upto) of sequence s. */
static bool wverify(worker *w, const tseq *s, const char *what)
{
    pkv_seq_info si;
    int r = pkv_seq_get_info(w->c, s->id, &si);
    if (r)
        WFAIL(w, "%s: seq_info(%llx) -> %d (%s)", what, (unsigned long long)s->id, r,
              pkv_last_error());
    if (si.len != s->len || si.committed != s->committed || si.salt != s->salt)
        WFAIL(w, "%s: seq %llx: len %llu committed %llu salt %llu, expected %zu %zu %llu", what,
              (unsigned long long)s->id, (unsigned long long)si.len,
              (unsigned long long)si.committed, (unsigned long long)si.salt, s->len,
              s->committed, (unsigned long long)s->salt);
    uint32_t toks[MAXL + 1], tab[MAXL / BS + 2];
    size_t nt = 0, nb = 0;
    if ((r = pkv_seq_tokens(w->c, s->id, toks, MAXL + 1, &nt)) || nt != s->len)
        WFAIL(w, "%s: seq_tokens(%llx) -> %d, %zu tokens", what, (unsigned long long)s->id, r, nt);
    if (memcmp(toks, s->tok, s->len * sizeof *toks) != 0)
        WFAIL(w, "%s: seq %llx: wrong token ids", what, (unsigned long long)s->id);
    if ((r = pkv_seq_blocks(w->c, s->id, tab, MAXL / BS + 2, &nb)) ||
        nb != (s->len + BS - 1) / BS)
        WFAIL(w, "%s: seq_blocks(%llx) -> %d, %zu blocks", what, (unsigned long long)s->id, r, nb);
    uint64_t h = pt_h0(s->salt);
    char err[256];
    for (size_t p = 0; p < s->len; p++) {
        h = pt_hstep(h, s->tok[p]);
        if (tab[p / BS] >= w->inf.capacity)
            WFAIL(w, "%s: seq %llx: block id %u out of range", what, (unsigned long long)s->id,
                  tab[p / BS]);
        if (!pt_token_ok(w->c, &w->inf, tab[p / BS], (uint32_t)(p % BS), h, err, sizeof err))
            WFAIL(w, "%s: seq %llx position %zu: %s", what, (unsigned long long)s->id, p, err);
    }
    return true;
}

/* Append t[0..n) to s (its model gets them as pending) and write their K/V. */
static bool wappend(worker *w, tseq *s, const uint32_t *t, size_t n)
{
    pkv_slot slots[MAXL];
    int r = pkv_seq_append(w->c, s->id, t, n, slots);
    if (r)
        WFAIL(w, "append(%llx, %zu) at %zu -> %d (%s)", (unsigned long long)s->id, n, s->len, r,
              pkv_last_error());
    uint64_t h = pt_hprefix(s->salt, s->tok, s->len);
    for (size_t i = 0; i < n; i++) {
        if (slots[i].block >= w->inf.capacity || slots[i].offset >= BS)
            WFAIL(w, "append(%llx): slot %zu = {%u, %u}", (unsigned long long)s->id, i,
                  slots[i].block, slots[i].offset);
        s->tok[s->len + i] = t[i];
        h = pt_hstep(h, t[i]);
        pt_write_token(w->c, &w->inf, slots[i].block, slots[i].offset, h);
    }
    s->len += n;
    w->appends++;
    return true;
}

static bool wcommit(worker *w, tseq *s, size_t n)
{
    int r = pkv_seq_commit(w->c, s->id, n);
    if (r)
        WFAIL(w, "commit(%llx, %zu) -> %d (%s)", (unsigned long long)s->id, n, r, pkv_last_error());
    s->committed += n;
    return true;
}

static bool wtrunc(worker *w, tseq *s, size_t new_len)
{
    int r = pkv_seq_truncate(w->c, s->id, new_len);
    if (r)
        WFAIL(w, "truncate(%llx, %zu) of %zu -> %d (%s)", (unsigned long long)s->id, new_len,
              s->len, r, pkv_last_error());
    s->len = new_len;
    if (s->committed > new_len)
        s->committed = new_len;
    w->truncs++;
    return true;
}

static bool wclose(worker *w, const tseq *s)
{
    int r = pkv_seq_close(w->c, s->id);
    if (r)
        WFAIL(w, "close(%llx) -> %d (%s)", (unsigned long long)s->id, r, pkv_last_error());
    return true;
}

static uint32_t rand_tok(worker *w)
{
    return 1000 + pt_below(&w->rng, 3); /* a small alphabet: tails repeat, dedupes happen */
}

/* One iteration: a new sequence from a prompt, chunked prefill with a speculative
 * tail, a fork with a diverging child, truncations, and a close or a keep. */
static bool one_iteration(worker *w)
{
    tseq *s = calloc(2, sizeof *s);
    if (!s)
        WFAIL(w, "calloc");
    tseq *p = &s[0], *ch = &s[1];
    bool ok = false;
    uint32_t prompt[MAXL];
    size_t n = 2 + pt_below(&w->rng, MAXL - 12);
    const uint32_t *stem = w->stems[pt_below(&w->rng, STEMS)];
    for (size_t i = 0; i < n; i++)
        prompt[i] = i < STEMLEN ? stem[i] : rand_tok(w);
    p->salt = pt_below(&w->rng, 8) == 0 ? 1 : 0;
    p->id = w->next_id++;
    size_t nc = 0;
    int r = pkv_seq_open(w->c, p->id, p->salt, prompt, n, &nc);
    if (r) {
        snprintf(w->msg, sizeof w->msg, "seq_open(%llx, %zu) -> %d (%s)",
                 (unsigned long long)p->id, n, r, pkv_last_error());
        atomic_store(w->failed, 1);
        goto out;
    }
    if (nc % BS || nc > pt_hit_cap(n, BS)) {
        snprintf(w->msg, sizeof w->msg, "n_cached %zu for %zu tokens", nc, n);
        atomic_store(w->failed, 1);
        goto out;
    }
    w->hits += nc / BS;
    memcpy(p->tok, prompt, nc * sizeof *prompt);
    p->len = p->committed = nc;
    if (!wverify(w, p, "after open"))
        goto out;
    /* Chunked prefill; each chunk committed, sometimes in two steps. */
    while (p->len < n) {
        size_t k = 1 + pt_below(&w->rng, (uint32_t)(n - p->len));
        if (!wappend(w, p, prompt + p->len, k))
            goto out;
        size_t c1 = pt_below(&w->rng, (uint32_t)k + 1);
        if (c1 && !wcommit(w, p, c1))
            goto out;
        if (c1 < k && !wcommit(w, p, k - c1))
            goto out;
    }
    /* Speculative tail: append 1-4 drafts, keep some, drop the rest (pending only). */
    size_t room = MAXL - p->len;
    if (room > 8) {
        uint32_t d[4];
        size_t nd = 1 + pt_below(&w->rng, 4);
        for (size_t i = 0; i < nd; i++)
            d[i] = rand_tok(w);
        if (!wappend(w, p, d, nd))
            goto out;
        size_t acc = pt_below(&w->rng, (uint32_t)nd + 1);
        if (!wtrunc(w, p, p->committed + acc) || (acc && !wcommit(w, p, acc)))
            goto out;
    }
    if (!wverify(w, p, "after prefill"))
        goto out;
    /* Fork; the child diverges (its first append copies a shared partial block). */
    ch->id = w->next_id++;
    ch->salt = p->salt;
    if ((r = pkv_seq_fork(w->c, p->id, ch->id))) {
        snprintf(w->msg, sizeof w->msg, "fork -> %d (%s)", r, pkv_last_error());
        atomic_store(w->failed, 1);
        goto out;
    }
    w->forks++;
    memcpy(ch->tok, p->tok, p->len * sizeof *p->tok);
    ch->len = ch->committed = p->len;
    size_t m = pt_below(&w->rng, (uint32_t)(MAXL - ch->len) + 1);
    for (size_t i = 0; i < m; i++) { /* decode-style: 1 token at a time */
        uint32_t t = rand_tok(w);
        if (!wappend(w, ch, &t, 1) || !wcommit(w, ch, 1))
            goto out;
    }
    /* Cut the parent anywhere (below committed: logged, copies a cut block). */
    if (!wtrunc(w, p, pt_below(&w->rng, (uint32_t)p->len + 1)))
        goto out;
    if (!wverify(w, p, "parent after cut") || !wverify(w, ch, "child"))
        goto out;
    if (pt_below(&w->rng, 3) == 0 && ch->len &&
        !wtrunc(w, ch, pt_below(&w->rng, (uint32_t)ch->len)))
        goto out;
    if (!wverify(w, ch, "child after cut"))
        goto out;
    /* Keep the child as a long-lived sequence now and then (closing the oldest). */
    if (!wclose(w, p))
        goto out;
    if (pt_below(&w->rng, 4) == 0) {
        if (w->n_kept == KEEP) {
            if (!wclose(w, &w->kept[0]))
                goto out;
            w->kept[0] = w->kept[1];
            w->n_kept--;
        }
        w->kept[w->n_kept++] = *ch;
    } else if (!wclose(w, ch)) {
        goto out;
    }
    ok = true;
out:
    free(s);
    return ok;
}

/* The long-lived sequences grow by a few decoded tokens, or shrink when full. */
static bool grow_kept(worker *w)
{
    for (size_t i = 0; i < w->n_kept; i++) {
        tseq *s = &w->kept[i];
        if (s->len + 4 > MAXL) {
            if (!wtrunc(w, s, pt_below(&w->rng, (uint32_t)s->len)))
                return false;
        } else {
            uint32_t t[4];
            size_t k = 1 + pt_below(&w->rng, 4);
            for (size_t j = 0; j < k; j++)
                t[j] = rand_tok(w);
            if (!wappend(w, s, t, k) || !wcommit(w, s, k))
                return false;
        }
        if (!wverify(w, s, "kept"))
            return false;
    }
    return true;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    while (!atomic_load(w->failed) && (w->iters < w->min_iters || !past(&w->deadline))) {
        if (!one_iteration(w) || !grow_kept(w))
            break;
        w->iters++;
    }
    /* Leave one pending token on the first kept sequence: a reopen must drop it. */
    if (!atomic_load(w->failed) && w->n_kept && w->kept[0].len < MAXL) {
        uint32_t t = 4242;
        wappend(w, &w->kept[0], &t, 1);
    }
    return NULL;
}

typedef struct maint {
    pkv_cache *c;
    atomic_int *failed, *stop;
    uint64_t loops, checkpoints, syncs, checks;
    bool do_checkpoint;
    char msg[512];
} maint;

static void *maint_main(void *arg)
{
    maint *m = arg;
    uint64_t ids[256];
    while (!atomic_load(m->stop) && !atomic_load(m->failed)) {
        int r;
        /* Every loop: stats and the sequence list; every 8th a sync, every 32nd a
         * checkpoint, every 64th a full pkv_check. */
        if (m->do_checkpoint && m->loops % 32 == 0) {
            if ((r = pkv_checkpoint(m->c))) {
                snprintf(m->msg, sizeof m->msg, "pkv_checkpoint -> %d (%s)", r, pkv_last_error());
                break;
            }
            m->checkpoints++;
        }
        if (m->loops % 8 == 0) {
            if ((r = pkv_sync(m->c))) {
                snprintf(m->msg, sizeof m->msg, "pkv_sync -> %d (%s)", r, pkv_last_error());
                break;
            }
            m->syncs++;
        }
        pkv_stats st;
        if ((r = pkv_get_stats(m->c, &st))) {
            snprintf(m->msg, sizeof m->msg, "pkv_get_stats -> %d", r);
            break;
        }
        if (st.blocks_free + st.blocks_cached + st.blocks_used != st.capacity) {
            snprintf(m->msg, sizeof m->msg, "I1: %llu free + %llu cached + %llu used != %llu",
                     (unsigned long long)st.blocks_free, (unsigned long long)st.blocks_cached,
                     (unsigned long long)st.blocks_used, (unsigned long long)st.capacity);
            break;
        }
        size_t n = 0;
        r = pkv_seq_list(m->c, ids, 256, &n);
        if (r) {
            snprintf(m->msg, sizeof m->msg, "pkv_seq_list -> %d (%zu sequences)", r, n);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            pkv_seq_info si;
            r = pkv_seq_get_info(m->c, ids[i], &si);
            if (r && r != PKV_ENOSEQ) { /* closed meanwhile: fine */
                snprintf(m->msg, sizeof m->msg, "pkv_seq_get_info -> %d", r);
                break;
            }
            if (!r && (si.committed > si.len || si.len > MAXL)) {
                snprintf(m->msg, sizeof m->msg, "seq %llx: committed %llu len %llu",
                         (unsigned long long)ids[i], (unsigned long long)si.committed,
                         (unsigned long long)si.len);
                break;
            }
        }
        if (m->msg[0])
            break;
        if (m->loops % 64 == 0) {
            char why[256] = "";
            if ((r = pkv_check(m->c, why, sizeof why))) {
                snprintf(m->msg, sizeof m->msg, "pkv_check: %s", why);
                break;
            }
            m->checks++;
        }
        m->loops++;
        usleep(200);
    }
    if (m->msg[0])
        atomic_store(m->failed, 1);
    return NULL;
}

static void run_stress(pkv_durability mode, bool do_checkpoint)
{
    bool syncio = pt_env_u64("PKV_STRESS_SYNCIO", 0) != 0;
    uint64_t ms = pt_env_u64("PKV_STRESS_MS", 1500);
    uint64_t min_iters = pt_env_u64("PKV_STRESS_MIN_ITERS", 10);
    pt_syncio *io = malloc(sizeof *io);
    cr_assert_not_null(io);
    pt_syncio_init(io);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.durability = mode;
    o.group_commit_us = 500;
    o.checkpoint_bytes = 64u << 10; /* automatic checkpoints too */
    if (syncio)
        o.io = &io->ops;
    pkv_cache *c = pt_open_sub("cache", &o);

    /* Fill the cache with cached (sealed, unreferenced) blocks that no worker can
     * hit (salt 2), so that evictions start at once, however short the run. */
    pkv_cache_info inf = pt_info(c);
    uint32_t fill[MAXL];
    uint64_t filled = 0;
    for (uint64_t id = 1; filled + MAXL / BS <= CAP - 16; id++, filled += MAXL / BS) {
        for (uint32_t i = 0; i < MAXL; i++)
            fill[i] = (uint32_t)(id * MAXL + i);
        PT_SEQ_OPEN(c, id, 2, NULL, 0);
        pkv_slot slots[MAXL];
        PT_OK(pkv_seq_append(c, id, fill, MAXL, slots));
        uint64_t h = pt_h0(2);
        for (uint32_t i = 0; i < MAXL; i++) {
            h = pt_hstep(h, fill[i]);
            pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
        }
        PT_OK(pkv_seq_commit(c, id, MAXL));
        PT_OK(pkv_seq_close(c, id));
    }
    cr_assert(pt_stats(c).blocks_cached >= CAP - 16 - MAXL / BS);

    static uint32_t stems[STEMS][STEMLEN];
    for (uint32_t s = 0; s < STEMS; s++)
        for (uint32_t i = 0; i < STEMLEN; i++)
            stems[s][i] = s * 100 + i;
    atomic_int failed = 0, stop = 0;
    worker *w = calloc(WORKERS, sizeof *w);
    cr_assert_not_null(w);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(ms / 1000);
    deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    maint mt = {.c = c, .failed = &failed, .stop = &stop, .do_checkpoint = do_checkpoint};
    pthread_t mth, th[WORKERS];
    cr_assert_eq(pthread_create(&mth, NULL, maint_main, &mt), 0);
    for (int i = 0; i < WORKERS; i++) {
        w[i].c = c;
        w[i].inf = pt_info(c);
        w[i].tid = i;
        w[i].next_id = ((uint64_t)i + 1) << 40;
        w[i].rng.s = 0x57E55ull * (uint64_t)(i + 1) + (uint64_t)mode;
        w[i].stems = (const uint32_t(*)[STEMLEN])stems;
        w[i].failed = &failed;
        w[i].stop = &stop;
        w[i].deadline = deadline;
        w[i].min_iters = min_iters;
        cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(mth, NULL);
    uint64_t iters = 0, forks = 0, truncs = 0, hits = 0;
    for (int i = 0; i < WORKERS; i++) {
        cr_assert_eq(w[i].msg[0], '\0', "worker %d: %s", i, w[i].msg);
        iters += w[i].iters;
        forks += w[i].forks;
        truncs += w[i].truncs;
        hits += w[i].hits;
    }
    cr_assert_eq(mt.msg[0], '\0', "maintenance thread: %s", mt.msg);
    cr_assert_eq(atomic_load(&failed), 0);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_log_info("stress (%s, %s backend): %llu iterations, %llu forks, %llu truncations, "
                "%llu hit blocks, %llu evictions, %llu dedupes, %llu cow copies, "
                "%llu checkpoints (%llu explicit), %llu maintenance loops, %llu syncs, %llu checks",
                mode == PKV_DURABLE_ALWAYS ? "always" : "group", syncio ? "sync" : "io_uring",
                (unsigned long long)iters, (unsigned long long)forks,
                (unsigned long long)truncs, (unsigned long long)hits,
                (unsigned long long)st.evictions, (unsigned long long)st.dedupes,
                (unsigned long long)st.cow_copies, (unsigned long long)st.checkpoints,
                (unsigned long long)mt.checkpoints, (unsigned long long)mt.loops,
                (unsigned long long)mt.syncs,
                (unsigned long long)mt.checks);
    cr_assert(iters >= (uint64_t)WORKERS * min_iters);
    cr_assert(st.hit_blocks > 0, "no prefix was ever shared");
    cr_assert(st.evictions > 0, "no eviction happened (capacity %u)", (unsigned)CAP);
    cr_assert(st.cow_copies > 0, "no copy-on-write happened");
    cr_assert(!do_checkpoint || mt.checkpoints > 0, "no explicit checkpoint");
    cr_assert(mt.syncs > 0);
    /* Every kept sequence, from the main thread, then close and reopen. */
    size_t kept = 0;
    for (int i = 0; i < WORKERS; i++) {
        for (size_t k = 0; k < w[i].n_kept; k++) {
            cr_assert(wverify(&w[i], &w[i].kept[k], "end"), "worker %d: %s", i, w[i].msg);
            kept++;
        }
    }
    cr_assert_eq(st.sequences, kept);
    pt_close(c);
    o.io = NULL;
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.sequences, kept, "%llu sequences recovered, %zu kept",
                 (unsigned long long)rec.sequences, kept);
    cr_assert_eq(rec.blocks_dropped + rec.sequences_dropped + rec.seq_blocks_bad +
                     rec.sequences_cut, 0, "recovery dropped something: %s", rec.note);
    for (int i = 0; i < WORKERS; i++) {
        w[i].c = c;
        for (size_t k = 0; k < w[i].n_kept; k++) {
            tseq *s = &w[i].kept[k];
            s->len = s->committed; /* pending tokens are not persistent */
            cr_assert(wverify(&w[i], s, "after reopen"), "worker %d: %s", i, w[i].msg);
        }
    }
    free(w);
    free(io); /* the first handle, its only user, is closed */
}

Test(stress, group_commit_with_checkpoints, .timeout = 600)
{
    run_stress(PKV_DURABLE_GROUP, true);
}

Test(stress, durable_always_with_syncs, .timeout = 600)
{
    run_stress(PKV_DURABLE_ALWAYS, false);
}

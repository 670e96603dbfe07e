/* The per-token decode path: COMMIT records coalesced in the unflushed log buffer
 * (wal/record.c) and pkv_seq_commit_append (one call per decode step).
 *
 * Coalescing must not change what recovery yields: a COMMIT that a later commit of
 * the same sequence extends in place keeps its LSN, and a frame is recovered whole
 * or not at all, so the state after every frame is the state after the last call
 * whose records it holds. The sweep below checks exactly that, for a random
 * decode-heavy workload (small blocks, a small vocabulary so seals dedupe, forks,
 * truncations of pending and of committed tokens, closes, evictions, waits for
 * limbo): at every pkv_sync the directory is copied (a crash image: everything it
 * holds is synced) and each image is recovered intact and with its last frame torn
 * at several offsets; the result must equal the committed state after the last call
 * of the frames that survive, K/V bytes included.
 * Environment: PKV_SEED (first seed), PKV_DECODE_SEEDS (seeds of the sweep). */
#include "wal_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(decode, .init = pt_setup, .fini = pt_teardown);

#define CAP 64u

static pkv_stats stats(pkv_cache *c)
{
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    return st;
}

/* Group commit on its longest timer and no automatic checkpoints: frames end at
 * pkv_sync (or where a call waits for limbo), or 10 s after the last one. */
static void opts(pkv_options *o, uint64_t cap)
{
    wu_opts(o, WU_BS, cap, PKV_DURABLE_GROUP);
    o->group_commit_us = 10000000;
    o->checkpoint_bytes = 1ull << 40;
}

/* The record counts the tests below check hold when no frame ends inside the part
 * they count: a COMMIT in a written frame no longer grows. The group-commit timer
 * (10 s, the longest allowed) still ends one on its own when that part runs so long,
 * as a loaded machine can make it. So each test counts on a fresh cache and, where
 * the log wrote a frame the test did not ask for (wal_frames moved), gives that run
 * up (returns false) and RUN_QUIET runs it again; the counts are checked on a run
 * without one. A change that ends frames by itself fails QUIET_TRIES runs in a row. */
enum { QUIET_TRIES = 3 };
#define RUN_QUIET(call, what)                                                             \
    do {                                                                                  \
        int t_ = 1;                                                                       \
        while (!(call))                                                                   \
            cr_assert(t_++ < QUIET_TRIES, "%s: a frame the test did not ask for ended "   \
                      "inside its counted part in %d runs in a row", (what), QUIET_TRIES); \
    } while (0)

/* The log wrote a frame since wal_frames was f0: give the run up (closing c). */
static bool unasked_frame(pkv_cache *c, wu_wl *w, uint64_t f0)
{
    if (stats(c).wal_frames == f0) return false;
    cr_log_info("a frame ended inside a counted part (%llu, then %llu): run again",
                (unsigned long long)f0, (unsigned long long)stats(c).wal_frames);
    pkv_close(c);
    wu_wl_free(w);
    return true;
}

/* ---- The committed state after every call ------------------------------------------ */

typedef struct snap {
    uint64_t lsn;
    uint64_t lo; /* a batch (pkv_seq_step_batch): the LSN before it, else lsn */
    wu_model m;  /* committed state, pending tokens dropped, sorted */
} snap;

typedef struct hist {
    snap *s;
    size_t n, cap;
} hist;

static void hist_add(hist *h, pkv_cache *c, const wu_model *m, bool batch)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 256;
        h->s = realloc(h->s, h->cap * sizeof *h->s);
        cr_assert_not_null(h->s);
    }
    snap *x = &h->s[h->n++];
    x->lsn = stats(c).last_lsn;
    x->lo = batch && h->n > 1 ? h->s[h->n - 2].lsn : x->lsn;
    wu_model_copy(&x->m, m);
    wu_model_drop_pending(&x->m);
    wu_model_sort(&x->m);
}

/* The state after the last call that ended at LSN <= lsn. Calls that logged nothing,
 * or whose COMMIT was coalesced into the one before, share an LSN with the call
 * before them; the last of them is the one whose effects the record holds. */
static const wu_model *hist_at(const hist *h, uint64_t lsn)
{
    const wu_model *m = NULL;
    for (size_t i = 0; i < h->n; i++)
        if (h->s[i].lsn <= lsn) m = &h->s[i].m;
    cr_assert_not_null(m, "no state at LSN %llu", (unsigned long long)lsn);
    return m;
}

/* A batch is atomic per step, not as a whole: where one waited for limbo (and so let
 * a frame end), an LSN strictly inside its records names a state between two of its
 * steps, which the history does not hold. */
static bool hist_inside_batch(const hist *h, uint64_t lsn)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->s[i].lo < lsn && lsn < h->s[i].lsn) return true;
    return false;
}

static void hist_free(hist *h)
{
    for (size_t i = 0; i < h->n; i++) wu_model_free(&h->s[i].m);
    free(h->s);
}

/* ---- A decode-heavy random workload ------------------------------------------------- */

typedef struct dw {
    wu_wl w;
    pt_rng r;
    uint64_t ids[4];
    size_t nids;
    size_t cur;
    uint64_t commits; /* calls that committed tokens */
    bool batch;       /* the last step was a pkv_seq_step_batch */
    uint64_t batches; /* of more than one step */
} dw;

static uint32_t tok(dw *d) { return 1 + pt_below(&d->r, 2); } /* tiny vocabulary: dedupes */

static void dw_open(dw *d)
{
    uint32_t prompt[9];
    size_t n = pt_below(&d->r, 10);
    for (size_t i = 0; i < n; i++) prompt[i] = tok(d);
    uint64_t id;
    WU_OK(wu_do_open(&d->w, 0, n ? prompt : NULL, n, n ? pt_below(&d->r, 2) : 0, &id));
    d->ids[d->nids++] = id;
}

static void dw_close(dw *d, size_t i)
{
    WU_OK(wu_do_close(&d->w, d->ids[i]));
    d->ids[i] = d->ids[--d->nids];
    if (d->cur >= d->nids) d->cur = 0;
}

/* One call (or a fork/close/open), biased to decode steps on the current sequence. */
static void dw_step(dw *d)
{
    wu_wl *w = &d->w;
    if (d->nids == 0) dw_open(d);
    if (pt_below(&d->r, 16) == 0) d->cur = pt_below(&d->r, (uint32_t)d->nids);
    uint64_t id = d->ids[d->cur];
    wu_seq *s = wu_model_find(&w->m, id);
    size_t pend = s->len - s->committed;
    uint32_t t[6];
    for (int i = 0; i < 6; i++) t[i] = tok(d);
    uint32_t op = pt_below(&d->r, 100);
    d->batch = false;
    if (s->len >= 40) { /* keep sequences short: the cache holds 64 blocks of 4 */
        if (d->nids > 1 && op < 50) dw_close(d, d->cur);
        else WU_OK(wu_do_truncate(w, id, pt_below(&d->r, 12)));
        return;
    }
    if (op < 10) { /* a batched decode step over every sequence short enough */
        uint64_t ids[4];
        uint32_t nc[4], bt[4];
        size_t n = 0;
        for (size_t i = 0; i < d->nids; i++) {
            wu_seq *x = wu_model_find(&w->m, d->ids[i]);
            if (x->len >= 40) continue;
            size_t p = x->len - x->committed;
            ids[n] = d->ids[i];
            nc[n] = p ? (pt_below(&d->r, 4) ? 1 : (uint32_t)p) : 0;
            bt[n] = tok(d);
            d->commits += nc[n] ? 1 : 0;
            n++;
        }
        if (n) {
            WU_OK(wu_do_step_batch(w, ids, nc, bt, n, NULL));
            d->batch = true;
            d->batches += n > 1;
        }
    } else if (op < 45) { /* decode step in one call */
        WU_OK(wu_do_commit_append(w, id, pend ? 1 : 0, t, 1));
        d->commits += pend ? 1 : 0;
    } else if (op < 65) { /* decode step in two calls */
        WU_OK(wu_do_append(w, id, t, 1, true));
        d->commits++;
    } else if (op < 72) { /* commit some pending tokens */
        if (pend) {
            WU_OK(wu_do_commit(w, id, 1 + pt_below(&d->r, (uint32_t)pend)));
            d->commits++;
        }
    } else if (op < 78) { /* append a few, commit later */
        WU_OK(wu_do_append(w, id, t, 1 + pt_below(&d->r, 6), false));
    } else if (op < 82) { /* commit several and append several in one call */
        size_t k = pt_below(&d->r, 4);
        size_t nc = pend ? pt_below(&d->r, (uint32_t)pend + 1) : 0;
        if (nc + k) {
            WU_OK(wu_do_commit_append(w, id, nc, t, k));
            d->commits += nc ? 1 : 0;
        }
    } else if (op < 86) { /* cut pending tokens only: logs nothing */
        if (pend) WU_OK(wu_do_truncate(w, id, s->committed + pt_below(&d->r, (uint32_t)pend)));
    } else if (op < 89) { /* cut committed tokens */
        if (s->committed) WU_OK(wu_do_truncate(w, id, pt_below(&d->r, (uint32_t)s->committed)));
    } else if (op < 94) { /* fork (needs no pending tokens) */
        if (pend) {
            WU_OK(wu_do_commit(w, id, pend));
            d->commits++;
        } else if (d->nids < 4) {
            uint64_t ch;
            WU_OK(wu_do_fork(w, id, &ch));
            d->ids[d->nids++] = ch;
        }
    } else if (op < 97) {
        if (d->nids > 1) dw_close(d, pt_below(&d->r, (uint32_t)d->nids));
    } else if (d->nids < 4) {
        dw_open(d);
    }
}

/* ---- Crash images ------------------------------------------------------------------ */

static void patch_zero(const char *path, uint64_t off, size_t n)
{
    uint8_t *z = calloc(1, n);
    cr_assert_not_null(z);
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(pwrite(fd, z, n, (off_t)off), (ssize_t)n);
    close(fd);
    free(z);
}

/* Open a crash image (or a damaged copy of it) and compare it with `want`. */
static void recover_check(const char *dir, const pkv_options *o, const wu_model *want,
                          uint64_t want_lsn, const char *what)
{
    pkv_cache *c = NULL;
    int rc = wu_open(dir, o, &c);
    cr_assert_eq(rc, 0, "%s: open -> %d (%s: %s)", what, rc, pkv_strerror(rc),
                 pkv_last_error());
    WU_CHECK(c, what);
    pkv_recovery rec;
    WU_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.last_lsn, want_lsn, "%s: recovered up to LSN %llu, expected %llu", what,
                 (unsigned long long)rec.last_lsn, (unsigned long long)want_lsn);
    cr_assert(rec.seq_blocks_bad == 0 && rec.sequences_cut == 0 && rec.blocks_dropped == 0,
              "%s: bad %llu cut %llu dropped %llu (%s)", what,
              (unsigned long long)rec.seq_blocks_bad, (unsigned long long)rec.sequences_cut,
              (unsigned long long)rec.blocks_dropped, rec.note);
    wu_verify_model(c, want, what);
    pkv_close(c);
}

static void sweep(uint64_t seed, int steps)
{
    char dir[512], img[600], what[256];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    pkv_cache *c = wu_open_ok(dir, &o);
    dw d;
    memset(&d, 0, sizeof d);
    wu_wl_init(&d.w, c, seed, NULL);
    d.w.check_each = false;
    d.r.s = seed * 0x9E3779B97F4A7C15ull + 1;
    hist h = {0};
    hist_add(&h, c, &d.w.m, false);
    size_t nimg = 0;
    uint64_t *img_lsn = calloc((size_t)steps + 1, sizeof *img_lsn);
    cr_assert_not_null(img_lsn);
    for (int i = 0; i < steps; i++) {
        dw_step(&d);
        hist_add(&h, c, &d.w.m, d.batch);
        if (pt_below(&d.r, 12) == 0 || i + 1 == steps) {
            WU_OK(pkv_sync(c));
            WU_CHECK(c, "after sync");
            snprintf(img, sizeof img, "%s-img%zu", dir, nimg);
            wu_copy_dir(dir, img);
            img_lsn[nimg++] = stats(c).last_lsn;
        }
    }
    pkv_stats st = stats(c);
    cr_assert(st.last_lsn < d.commits + st.seals,
              "seed %llu: %llu records for %llu committing calls and %llu seals: no COMMIT "
              "was coalesced", (unsigned long long)seed, (unsigned long long)st.last_lsn,
              (unsigned long long)d.commits, (unsigned long long)st.seals);
    cr_assert(d.batches > 0, "seed %llu: no batch of several steps", (unsigned long long)seed);
    pkv_close(c);
    wu_wl_free(&d.w);

    for (size_t k = 0; k < nimg; k++) {
        snprintf(img, sizeof img, "%s-img%zu", dir, k);
        char copy[700];
        snprintf(copy, sizeof copy, "%s-t", img);

        /* Tear the image's last frame (if it has one of its own): in its header, in
         * the middle, in its last record's checksum (two of the three per image). */
        char seg[600];
        cr_assert(wu_newest_seg(img, seg, sizeof seg));
        wu_frame fr[4096];
        size_t nf = wu_frames(seg, fr, 4096);
        const wu_frame *last = nf ? &fr[nf - 1] : NULL;
        if (last && last->first_lsn + last->nrec - 1 == img_lsn[k] &&
            !hist_inside_batch(&h, last->first_lsn - 1)) {
            uint64_t before = last->first_lsn - 1;
            uint64_t fo = last->off, fend = last->off + 32 + last->bytes;
            uint64_t cuts[] = {fo + 8, fo + 32 + last->bytes / 2, fend - 4};
            for (size_t j = 0; j < sizeof cuts / sizeof *cuts; j++) {
                if (j == k % 3) continue;
                pt_rmrf(copy);
                wu_copy_dir(img, copy);
                char sp[1200];
                snprintf(sp, sizeof sp, "%s%s", copy, strrchr(seg, '/'));
                patch_zero(sp, cuts[j], (size_t)(fend - cuts[j]));
                snprintf(what, sizeof what,
                         "seed %llu, image %zu, last frame (LSN %llu-%llu, %u records) torn at "
                         "offset %llu of %llu", (unsigned long long)seed, k,
                         (unsigned long long)last->first_lsn, (unsigned long long)img_lsn[k],
                         last->nrec, (unsigned long long)(cuts[j] - fo),
                         (unsigned long long)(fend - fo));
                recover_check(copy, &o, hist_at(&h, before), before, what);
                pt_rmrf(copy);
            }
        }

        /* The image itself, intact. */
        snprintf(what, sizeof what, "seed %llu, image %zu (LSN %llu), intact",
                 (unsigned long long)seed, k, (unsigned long long)img_lsn[k]);
        recover_check(img, &o, hist_at(&h, img_lsn[k]), img_lsn[k], what);
        pt_rmrf(img);
    }
    free(img_lsn);
    hist_free(&h);
}

Test(decode, coalesced_commits_crash_sweep)
{
    uint64_t first = pt_env_u64("PKV_SEED", 1), n = pt_env_u64("PKV_DECODE_SEEDS", 3);
    for (uint64_t s = first; s < first + n; s++) {
        sweep(s, 240);
        char dir[512];
        pt_path(dir, sizeof dir, "cache");
        pt_rmrf(dir);
    }
}

/* One sequence decoded token by token logs one COMMIT per block (plus its SEAL), not
 * one per token, and reopens with every token. */
static bool one_commit_run(const char *dir, const pkv_options *o, int mode)
{
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 7, NULL);
    uint64_t id;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &id));
    pkv_stats s0 = stats(c);
    uint64_t before = s0.last_lsn;
    const int ntok = 64; /* 16 blocks of 4 */
    for (int i = 0; i < ntok; i++) {
        uint32_t t = 100 + (uint32_t)i;
        if (mode == 0) WU_OK(wu_do_append(&w, id, &t, 1, true));
        else WU_OK(wu_do_commit_append(&w, id, i ? 1 : 0, &t, 1));
    }
    if (mode == 1) WU_OK(wu_do_commit(&w, id, 1));
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    pkv_stats st = stats(c);
    uint64_t recs = st.last_lsn - before, blocks = ntok / WU_BS;
    cr_assert_eq(st.seals, blocks);
    /* per block: its SEAL, the sealing COMMIT (which the next block's commits
     * then extend) */
    cr_assert(recs <= 2 * blocks + 1, "mode %d: %llu records for %d commits of %llu blocks",
              mode, (unsigned long long)recs, ntok, (unsigned long long)blocks);
    WU_CHECK(c, "decoded");
    pkv_close(c);
    c = wu_open_ok(dir, o);
    wu_wl_reattach(&w, c);
    wu_verify_model(c, &w.m, "after reopen");
    pkv_close(c);
    wu_wl_free(&w);
    return true;
}

Test(decode, one_commit_record_per_block)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    for (int mode = 0; mode < 2; mode++)
        RUN_QUIET(one_commit_run(dir, &o, mode), "one COMMIT per block");
}

/* A generation repeated token for token (the same prompt and greedy decoding again)
 * seals no block of its own: each one dedupes onto the cached block of the first
 * run, so nothing but its COMMIT is logged, and each commit that crosses a block
 * boundary merges into that one record, which grows by the new table entries only
 * (the entries before its last are left as they are; internal checks compare them).
 * It stays one record for the whole run, and the crash image recovers every token. */
static bool repeated_run(const char *dir, const pkv_options *o, int mode)
{
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 11, NULL);
    const int ntok = 30 * (int)WU_BS + 2; /* 30 full blocks and a partial one */
    uint64_t first, again;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &first));
    for (int i = 0; i < ntok; i++) {
        uint32_t t = 500 + (uint32_t)(i * 7 % 13);
        WU_OK(wu_do_append(&w, first, &t, 1, true));
    }
    WU_OK(wu_do_close(&w, first));
    WU_OK(pkv_sync(c)); /* the repeat starts a frame of its own */
    WU_CHECK(c, "first run");
    pkv_stats st0 = stats(c);
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &again));
    uint64_t lsn0 = stats(c).last_lsn;
    for (int i = 0; i < ntok; i++) {
        uint32_t t = 500 + (uint32_t)(i * 7 % 13);
        if (mode == 0) WU_OK(wu_do_append(&w, again, &t, 1, true));
        else WU_OK(wu_do_commit_append(&w, again, i ? 1 : 0, &t, 1));
        if (i % 16 == 0) WU_CHECK(c, "repeat");
    }
    if (mode == 1) WU_OK(wu_do_commit(&w, again, 1));
    if (unasked_frame(c, &w, st0.wal_frames)) return false;
    pkv_stats st = stats(c);
    cr_assert_eq(st.dedupes - st0.dedupes, (uint64_t)ntok / WU_BS, "mode %d", mode);
    cr_assert_eq(st.seals, st0.seals, "mode %d: the repeat sealed a block of its own", mode);
    cr_assert_eq(st.last_lsn - lsn0, 1, "mode %d: %llu records for the repeat, not one COMMIT",
                 mode, (unsigned long long)(st.last_lsn - lsn0));
    WU_CHECK(c, "repeated");
    wu_crash_image_recovers(c, &w, dir, o, UINT64_MAX, 0, "repeated generation");
    return true;
}

Test(decode, repeated_generation_dedupes_into_one_commit)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    for (int mode = 0; mode < 2; mode++)
        RUN_QUIET(repeated_run(dir, &o, mode), "repeated generation");
}

static bool interleaved_run(const char *dir, const pkv_options *o, int mode)
{
    enum { NS = 4, NTOK = 32 }; /* 8 blocks of 4 each */
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 9, NULL);
    uint64_t ids[NS];
    for (int k = 0; k < NS; k++) WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &ids[k]));
    pkv_stats s0 = stats(c);
    uint64_t before = s0.last_lsn;
    for (int i = 0; i < NTOK; i++) {
        uint32_t t[NS], nc[NS];
        for (int k = 0; k < NS; k++) {
            t[k] = 1000 * (uint32_t)k + (uint32_t)i;
            nc[k] = i ? 1 : 0;
        }
        if (mode == 0)
            for (int k = 0; k < NS; k++) WU_OK(wu_do_commit_append(&w, ids[k], nc[k], &t[k], 1));
        else
            WU_OK(wu_do_step_batch(&w, ids, nc, t, NS, NULL));
    }
    for (int k = 0; k < NS; k++) WU_OK(wu_do_commit(&w, ids[k], 1));
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    pkv_stats st = stats(c);
    uint64_t recs = st.last_lsn - before, blocks = NS * (NTOK / WU_BS);
    cr_assert_eq(st.seals, blocks);
    /* per block: its SEAL, the sealing COMMIT and the one its next token starts
     * (which the rest of that block's commits grow) */
    cr_assert(recs <= 3 * blocks + NS, "mode %d: %llu records for %d commits of %llu blocks",
              mode, (unsigned long long)recs, NS * NTOK, (unsigned long long)blocks);
    WU_CHECK(c, "decoded");
    WU_OK(pkv_sync(c)); /* one frame, slack squeezed out */
    pkv_close(c);
    c = wu_open_ok(dir, o);
    wu_wl_reattach(&w, c);
    wu_verify_model(c, &w.m, "after reopen");
    pkv_close(c);
    wu_wl_free(&w);
    return true;
}

/* Sequences decoded interleaved, one token each in turn (single calls, or one batch
 * per turn), still log about one COMMIT per block each: a sequence's COMMIT grows in
 * place while other records follow it in the same buffer. Without that every token
 * would log one. */
Test(decode, interleaved_decode_coalesces)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    for (int mode = 0; mode < 2; mode++)
        RUN_QUIET(interleaved_run(dir, &o, mode), "interleaved decode");
}

/* A checkpoint covers the LSN of the COMMIT it saw: a later commit must log a new
 * record, not extend that one (replay skips it). */
static bool ckpt_ends_run(const char *dir, const pkv_options *o)
{
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 9, NULL);
    uint64_t id;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &id));
    uint32_t t[3] = {5, 6, 7};
    WU_OK(wu_do_append(&w, id, t, 1, true));
    WU_OK(pkv_checkpoint(c));
    pkv_stats s0 = stats(c);
    uint64_t ck = s0.checkpoint_lsn;
    cr_assert_eq(ck, s0.last_lsn);
    WU_OK(wu_do_append(&w, id, t + 1, 1, true));
    cr_assert_eq(stats(c).last_lsn, ck + 1, "the commit after the checkpoint logged no record");
    WU_OK(wu_do_commit_append(&w, id, 0, t + 2, 1));
    WU_OK(wu_do_commit(&w, id, 1));
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    cr_assert_eq(stats(c).last_lsn, ck + 1, "the next commit was not coalesced");
    wu_crash_image_recovers(c, &w, dir, o, ck, 1, "crash image after a checkpoint");
    return true;
}

Test(decode, checkpoint_ends_coalescing)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    RUN_QUIET(ckpt_ends_run(dir, &o), "a checkpoint ends coalescing");
}

/* A decode commit only notes that the sequence's COMMIT lags (deferred growth,
 * wal/record.c). A checkpoint must bring every lagging COMMIT up to date before it
 * fixes its LSN: after it, the sequence's next commit logs a new record, and a
 * crash image holds every commit. Without the settling the sequence would stay
 * marked lagging under a generation that can no longer grow, and its later
 * commits would never reach the log. */
static bool ckpt_settles_run(const char *dir, const pkv_options *o)
{
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 9, NULL);
    uint64_t id;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &id));
    uint32_t t[3] = {5, 6, 7};
    pkv_stats s0 = stats(c);
    WU_OK(wu_do_append(&w, id, t, 1, true)); /* logs the COMMIT */
    uint64_t lsn = stats(c).last_lsn;
    WU_OK(wu_do_append(&w, id, t + 1, 1, true)); /* lags: no record */
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    cr_assert_eq(stats(c).last_lsn, lsn, "the second commit was not coalesced");
    WU_CHECK(c, "a lagging COMMIT");
    WU_OK(pkv_checkpoint(c));
    uint64_t ck = stats(c).checkpoint_lsn;
    WU_CHECK(c, "after the checkpoint");
    WU_OK(wu_do_append(&w, id, t + 2, 1, true));
    cr_assert_eq(stats(c).last_lsn, ck + 1, "the commit after the checkpoint logged no record");
    wu_crash_image_recovers(c, &w, dir, o, ck, 1,
                         "crash image after a checkpoint over a lagging COMMIT");
    return true;
}

Test(decode, checkpoint_settles_deferred_commits)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    RUN_QUIET(ckpt_settles_run(dir, &o), "a checkpoint settles deferred commits");
}

/* Closing a sequence whose COMMIT lags settles it and takes it off the list of
 * lagging sequences before it is freed (pkv_check names a stale entry; ASan a use
 * after free when the flusher later settles the list). The other sequence's
 * lagging commits still reach the log. */
static bool close_lagging_run(const char *dir, const pkv_options *o)
{
    pt_rmrf(dir);
    pkv_cache *c = wu_open_ok(dir, o);
    wu_wl w;
    wu_wl_init(&w, c, 9, NULL);
    uint64_t a, b;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &a));
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &b));
    pkv_stats s0 = stats(c);
    uint64_t lsn = 0;
    for (uint32_t i = 0; i < 2; i++) { /* both lag after their second commit */
        uint32_t ta = 100 + i, tb = 200 + i;
        WU_OK(wu_do_append(&w, a, &ta, 1, true));
        WU_OK(wu_do_append(&w, b, &tb, 1, true));
        if (i == 0) lsn = stats(c).last_lsn;
    }
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    cr_assert_eq(stats(c).last_lsn, lsn, "the later commits were not coalesced");
    WU_CHECK(c, "two lagging sequences");
    WU_OK(wu_do_close(&w, a));
    WU_CHECK(c, "closed a lagging sequence");
    uint32_t tb = 300;
    WU_OK(wu_do_append(&w, b, &tb, 1, true)); /* b's third token of 4: still lags */
    if (unasked_frame(c, &w, s0.wal_frames)) return false;
    cr_assert_eq(stats(c).last_lsn, lsn + 1, "only the CLOSE was logged: %llu records",
                 (unsigned long long)(stats(c).last_lsn - lsn));
    /* the sync settles b, and would touch a if it were still listed */
    wu_crash_image_recovers(c, &w, dir, o, UINT64_MAX, 0,
                         "crash image after closing a lagging sequence");
    return true;
}

Test(decode, close_of_a_lagging_sequence)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, CAP);
    RUN_QUIET(close_lagging_run(dir, &o), "closing a lagging sequence");
}

/* pkv_seq_commit_append does what pkv_seq_commit + pkv_seq_append do, and fails
 * without changing anything. */
Test(decode, commit_append_equals_two_calls)
{
    char d1[512], d2[512];
    pt_path(d1, sizeof d1, "one");
    pt_path(d2, sizeof d2, "two");
    pkv_options o;
    opts(&o, CAP);
    pkv_cache *a = wu_open_ok(d1, &o), *b = wu_open_ok(d2, &o);
    uint32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    WU_OK(pkv_seq_open(a, 1, 0, prompt, 6, NULL));
    WU_OK(pkv_seq_open(b, 1, 0, prompt, 6, NULL));
    pkv_slot sa[8], sb[8];
    WU_OK(pkv_seq_append(a, 1, prompt, 6, sa));
    WU_OK(pkv_seq_append(b, 1, prompt, 6, sb));
    pt_rng r = {3};
    for (int i = 0; i < 200; i++) {
        pkv_seq_info ia;
        WU_OK(pkv_seq_get_info(a, 1, &ia));
        size_t pend = ia.len - ia.committed;
        size_t nc = pend ? pt_below(&r, (uint32_t)pend + 1) : 0, n = pt_below(&r, 4);
        if (nc + n == 0) n = 1;
        uint32_t t[4];
        for (int k = 0; k < 4; k++) t[k] = pt_below(&r, 3);
        if (ia.len > 30 && nc == pend) { /* keep it short: close and start again */
            WU_OK(pkv_seq_close(a, 1));
            WU_OK(pkv_seq_close(b, 1));
            WU_OK(pkv_seq_open(a, 1, 0, prompt, 6, NULL));
            WU_OK(pkv_seq_open(b, 1, 0, prompt, 6, NULL));
            continue;
        }
        WU_OK(pkv_seq_commit_append(a, 1, nc, n ? t : NULL, n, n ? sa : NULL));
        if (nc) WU_OK(pkv_seq_commit(b, 1, nc));
        if (n) WU_OK(pkv_seq_append(b, 1, t, n, sb));
        for (size_t k = 0; k < n; k++)
            cr_assert(sa[k].block == sb[k].block && sa[k].offset == sb[k].offset,
                      "step %d: slot %zu differs", i, k);
        pkv_seq_info ib;
        WU_OK(pkv_seq_get_info(b, 1, &ib));
        WU_OK(pkv_seq_get_info(a, 1, &ia));
        cr_assert(ia.len == ib.len && ia.committed == ib.committed && ia.n_blocks == ib.n_blocks);
        uint32_t ta[64], tb[64];
        size_t na, nb;
        WU_OK(pkv_seq_blocks(a, 1, ta, 64, &na));
        WU_OK(pkv_seq_blocks(b, 1, tb, 64, &nb));
        cr_assert(na == nb && memcmp(ta, tb, na * sizeof *ta) == 0, "step %d: tables differ", i);
    }
    pkv_stats x = stats(a), y = stats(b);
    cr_assert(x.seals == y.seals && x.dedupes == y.dedupes && x.blocks_used == y.blocks_used &&
              x.blocks_cached == y.blocks_cached && x.evictions == y.evictions);
    WU_CHECK(a, "commit_append");

    /* Errors change nothing. */
    pkv_seq_info before, after;
    WU_OK(pkv_seq_get_info(a, 1, &before));
    uint32_t t1 = 9;
    pkv_slot s1;
    cr_assert_eq(pkv_seq_commit_append(a, 1, 0, NULL, 0, NULL), PKV_EINVAL);
    cr_assert_eq(pkv_seq_commit_append(a, 1, 0, NULL, 1, &s1), PKV_EINVAL);
    cr_assert_eq(pkv_seq_commit_append(a, 1, 0, &t1, 1, NULL), PKV_EINVAL);
    cr_assert_eq(pkv_seq_commit_append(a, 2, 0, &t1, 1, &s1), PKV_ENOSEQ);
    cr_assert_eq(pkv_seq_commit_append(a, 1, before.len - before.committed + 1, &t1, 1, &s1),
                 PKV_ESTATE);
    cr_assert_eq(pkv_seq_commit_append(NULL, 1, 0, &t1, 1, &s1), PKV_EINVAL);
    WU_OK(pkv_seq_get_info(a, 1, &after));
    cr_assert(before.len == after.len && before.committed == after.committed &&
              before.n_blocks == after.n_blocks);
    pkv_close(a);
    pkv_close(b);
}

/* All-or-nothing on PKV_EFULL: a cache whose every block is held by a sequence. */
Test(decode, commit_append_full_cache)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, 4);
    pkv_cache *c = wu_open_ok(dir, &o);
    uint32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 50 + (uint32_t)i;
    pkv_slot s[16];
    WU_OK(pkv_seq_open(c, 1, 0, NULL, 0, NULL));
    WU_OK(pkv_seq_append(c, 1, t, 15, s)); /* 4 blocks, the last one with 3 of 4 */
    pkv_seq_info before, after;
    WU_OK(pkv_seq_get_info(c, 1, &before));
    /* commit all 15 (seals 3 blocks) and append 2 (needs a 5th block): EFULL */
    cr_assert_eq(pkv_seq_commit_append(c, 1, 15, t, 2, s), PKV_EFULL);
    WU_OK(pkv_seq_get_info(c, 1, &after));
    cr_assert(before.len == after.len && before.committed == after.committed &&
              before.n_blocks == after.n_blocks, "a failed call changed the sequence");
    cr_assert_eq(stats(c).seals, 0);
    /* one token fits in the last block */
    WU_OK(pkv_seq_commit_append(c, 1, 15, t, 1, s));
    WU_OK(pkv_seq_get_info(c, 1, &after));
    cr_assert(after.len == 16 && after.committed == 15);
    WU_CHECK(c, "full cache");
    pkv_close(c);
}

/* pkv_seq_step_batch does what pkv_seq_commit_append does for each step in turn:
 * the same slots, tables, lengths and counters, and the same state after a reopen. */
Test(decode, step_batch_equals_single_steps)
{
    char d1[512], d2[512];
    pt_path(d1, sizeof d1, "batch");
    pt_path(d2, sizeof d2, "single");
    pkv_options o;
    opts(&o, CAP);
    pkv_cache *a = wu_open_ok(d1, &o), *b = wu_open_ok(d2, &o);
    enum { NS = 6 };
    pt_rng r = {11};
    for (uint64_t id = 1; id <= NS; id++) {
        uint32_t prompt[5] = {1, 2, 1, 2, (uint32_t)id};
        WU_OK(pkv_seq_open(a, id, 0, prompt, 5, NULL));
        WU_OK(pkv_seq_open(b, id, 0, prompt, 5, NULL));
    }
    uint64_t pend[NS + 1] = {0};
    for (int round = 0; round < 300; round++) {
        pkv_step st[NS];
        size_t n = 0;
        for (uint64_t id = 1; id <= NS; id++) {
            if (pt_below(&r, 4) == 0) continue; /* not every sequence every step */
            uint32_t nc = pend[id] ? (pt_below(&r, 3) ? 1 : (uint32_t)pend[id]) : 0;
            st[n++] = (pkv_step){.id = id, .n_commit = nc, .token = 1 + pt_below(&r, 2)};
        }
        if (!n) continue;
        size_t done = 99;
        WU_OK(pkv_seq_step_batch(a, st, n, &done));
        cr_assert_eq(done, n);
        for (size_t i = 0; i < n; i++) {
            pkv_slot s;
            WU_OK(pkv_seq_commit_append(b, st[i].id, st[i].n_commit, &st[i].token, 1, &s));
            cr_assert(s.block == st[i].slot.block && s.offset == st[i].slot.offset,
                      "round %d, step %zu: slot (%u, %u), single call (%u, %u)", round, i,
                      st[i].slot.block, st[i].slot.offset, s.block, s.offset);
            pend[st[i].id] += 1 - (uint64_t)st[i].n_commit;
        }
        for (uint64_t id = 1; id <= NS; id++) {
            pkv_seq_info ia, ib;
            WU_OK(pkv_seq_get_info(a, id, &ia));
            WU_OK(pkv_seq_get_info(b, id, &ib));
            cr_assert(ia.len == ib.len && ia.committed == ib.committed &&
                      ia.n_blocks == ib.n_blocks, "round %d: sequence %llu differs", round,
                      (unsigned long long)id);
            if (ia.len > 24) { /* keep them short: cut back (pending tokens go) */
                WU_OK(pkv_seq_truncate(a, id, 7));
                WU_OK(pkv_seq_truncate(b, id, 7));
                pend[id] = 0;
            }
        }
        WU_CHECK(a, "after a batch");
    }
    pkv_stats x = stats(a), y = stats(b);
    cr_assert(x.seals == y.seals && x.dedupes == y.dedupes && x.blocks_used == y.blocks_used &&
              x.blocks_cached == y.blocks_cached && x.evictions == y.evictions &&
              x.last_lsn == y.last_lsn, "counters differ");
    cr_assert(x.seals > 50 && x.dedupes > 0, "the batches sealed %llu blocks, deduped %llu",
              (unsigned long long)x.seals, (unsigned long long)x.dedupes);
    /* The committed state survives a reopen identically. */
    pkv_close(a);
    pkv_close(b);
    a = wu_open_ok(d1, &o);
    b = wu_open_ok(d2, &o);
    for (uint64_t id = 1; id <= NS; id++) {
        uint32_t ta[256], tb[256];
        size_t na, nb;
        WU_OK(pkv_seq_blocks(a, id, ta, 256, &na));
        WU_OK(pkv_seq_blocks(b, id, tb, 256, &nb));
        cr_assert(na == nb && memcmp(ta, tb, na * sizeof *ta) == 0,
                  "sequence %llu: recovered tables differ", (unsigned long long)id);
        WU_OK(pkv_seq_tokens(a, id, ta, 256, &na));
        WU_OK(pkv_seq_tokens(b, id, tb, 256, &nb));
        cr_assert(na == nb && memcmp(ta, tb, na * sizeof *ta) == 0,
                  "sequence %llu: recovered tokens differ", (unsigned long long)id);
    }
    WU_CHECK(a, "reopened");
    pkv_close(a);
    pkv_close(b);
}

/* A batch stops at the first step that fails: the steps before it took effect, that
 * step and the ones after it changed nothing, and *done says where it stopped. */
Test(decode, step_batch_stops_at_first_failure)
{
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_options o;
    opts(&o, 4);
    pkv_cache *c = wu_open_ok(dir, &o);
    uint32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 70 + (uint32_t)i;
    pkv_slot s[16];
    WU_OK(pkv_seq_open(c, 1, 0, NULL, 0, NULL));
    WU_OK(pkv_seq_open(c, 2, 0, NULL, 0, NULL));
    WU_OK(pkv_seq_append(c, 1, t, 5, s));     /* 2 blocks, the second with 1 of 4 */
    WU_OK(pkv_seq_append(c, 2, t + 5, 6, s)); /* 2 blocks, the second with 2 of 4 */

    /* An unknown sequence in the middle. */
    pkv_step st[3] = {{.id = 1, .n_commit = 5, .token = 1},
                      {.id = 9, .n_commit = 0, .token = 2},
                      {.id = 2, .n_commit = 6, .token = 3}};
    size_t done = 99;
    cr_assert_eq(pkv_seq_step_batch(c, st, 3, &done), PKV_ENOSEQ);
    cr_assert_eq(done, 1);
    pkv_seq_info i1, i2;
    WU_OK(pkv_seq_get_info(c, 1, &i1));
    WU_OK(pkv_seq_get_info(c, 2, &i2));
    cr_assert(i1.len == 6 && i1.committed == 5, "step 0 took effect: %llu/%llu",
              (unsigned long long)i1.len, (unsigned long long)i1.committed);
    cr_assert(st[0].slot.block < 4 && st[0].slot.offset == 1);
    cr_assert(i2.len == 6 && i2.committed == 0, "step 2 changed nothing");
    WU_CHECK(c, "after ENOSEQ");

    /* Committing more than is pending. */
    pkv_step e[2] = {{.id = 2, .n_commit = 6, .token = 4}, {.id = 1, .n_commit = 2, .token = 5}};
    cr_assert_eq(pkv_seq_step_batch(c, e, 2, &done), PKV_ESTATE);
    cr_assert_eq(done, 1);
    WU_OK(pkv_seq_get_info(c, 1, &i1));
    WU_OK(pkv_seq_get_info(c, 2, &i2));
    cr_assert(i2.len == 7 && i2.committed == 6 && i1.len == 6 && i1.committed == 5);

    /* A full cache: every one of the 4 blocks is held; sequence 1's step fits in its
     * last block, sequence 2's next token does not (its block is full). */
    WU_OK(pkv_seq_append(c, 2, t, 1, s)); /* sequence 2: 8 tokens, 2 full blocks */
    pkv_step f[2] = {{.id = 1, .n_commit = 1, .token = 6}, {.id = 2, .n_commit = 2, .token = 7}};
    cr_assert_eq(pkv_seq_step_batch(c, f, 2, &done), PKV_EFULL);
    cr_assert_eq(done, 1);
    WU_OK(pkv_seq_get_info(c, 1, &i1));
    WU_OK(pkv_seq_get_info(c, 2, &i2));
    cr_assert(i1.len == 7 && i1.committed == 6);
    cr_assert(i2.len == 8 && i2.committed == 6 && i2.n_blocks == 2, "step 1 changed nothing");
    WU_CHECK(c, "after EFULL");

    /* Bad arguments. */
    cr_assert_eq(pkv_seq_step_batch(c, NULL, 1, &done), PKV_EINVAL);
    cr_assert_eq(done, 0);
    cr_assert_eq(pkv_seq_step_batch(c, f, 0, &done), PKV_EINVAL);
    cr_assert_eq(pkv_seq_step_batch(NULL, f, 1, NULL), PKV_EINVAL);
    pkv_close(c);
}

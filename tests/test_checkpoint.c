/* Delta checkpoints (src/wal/checkpoint.c, docs/format.md "Checkpoints"): a chain
 * of a full checkpoint ckpt-<lsn> and delta-<lsn> files holding only the blocks
 * that changed since the file before.
 *
 * "The same state" after a reopen means: the same sealed blocks, each with the same
 * parent, salt, hash, payload checksum and token ids (read from the block pool
 * under the lock), and the workload's model (sequences, tokens, K/V through the
 * block table; wal_util.h). pkv_check after every reopen. */
#include "internal.h"
#include "wal_util.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(checkpoint, .init = pt_setup, .fini = pt_teardown);

/* ---- The sealed blocks of a cache ---------------------------------------------- */

typedef struct sealed {
    uint32_t block, parent;
    uint64_t salt, hlo, hhi, sum;
    uint32_t tok[16];
    uint64_t rel_lsn; /* compared only between two recovered caches (the rebuild
                         adjusts it) */
} sealed;

typedef struct sealed_set {
    sealed *b;
    size_t n;
} sealed_set;

static sealed_set sealed_take(pkv_cache *c) {
    sealed_set s = {0};
    pkv_lock(c);
    const pkv_pool *p = &c->pool;
    cr_assert(p->block_size <= 16);
    s.b = calloc(p->capacity, sizeof *s.b);
    cr_assert(s.b);
    for (uint32_t i = 0; i < p->capacity; i++) {
        const pkv_block *x = &p->b[i];
        if (x->state != BLK_SEALED) continue;
        sealed *e = &s.b[s.n++];
        *e = (sealed){i, x->parent, x->salt, x->hash.lo, x->hash.hi, x->payload_sum, {0},
                      x->rel_lsn};
        memcpy(e->tok, pkv_pool_tokens(p, i), 4ull * p->block_size);
    }
    pkv_unlock(c);
    return s;
}

static void sealed_same_as(const sealed_set *a, pkv_cache *c, bool lsn, const char *what) {
    sealed_set b = sealed_take(c);
    cr_assert_eq(a->n, b.n, "%s: %zu sealed blocks, %zu before", what, b.n, a->n);
    for (size_t i = 0; i < a->n; i++)
        cr_assert(!memcmp(&a->b[i], &b.b[i], offsetof(sealed, rel_lsn)) &&
                      (!lsn || a->b[i].rel_lsn == b.b[i].rel_lsn),
                  "%s: sealed block %u differs (now block %u)", what, a->b[i].block,
                  b.b[i].block);
    free(b.b);
}
static void sealed_same(const sealed_set *a, pkv_cache *c, const char *what) {
    sealed_same_as(a, c, false, what);
}

/* ---- Helpers ------------------------------------------------------------------- */

static pkv_stats stats(pkv_cache *c) {
    pkv_stats st;
    PT_OK(pkv_get_stats(c, &st));
    return st;
}

static pkv_recovery recovery(pkv_cache *c) {
    pkv_recovery r;
    PT_OK(pkv_get_recovery(c, &r));
    return r;
}

/* Recovery found nothing to repair: a stale block a chain wrongly brought back
 * would be dropped by the rebuild's hash check and show here. */
static void clean_recovery(pkv_cache *c, const char *what) {
    pkv_recovery r = recovery(c);
    cr_assert(r.blocks_dropped == 0 && r.sequences_dropped == 0 && r.sequences_cut == 0 &&
                  r.seq_blocks_bad == 0 && !r.repaired,
              "%s: recovery repaired something (dropped %llu blocks, %llu sequences; "
              "cut %llu): %s", what, (unsigned long long)r.blocks_dropped,
              (unsigned long long)r.sequences_dropped, (unsigned long long)r.sequences_cut,
              r.note);
}

/* Sync c and open a crash image of its directory (a copy into "<dir>-<suffix>": no
 * close-time work), which must recover from the checkpoint chain alone. */
static pkv_cache *open_image(pkv_cache *c, const char *dir, const char *suffix,
                             const pkv_options *o) {
    char img[600];
    snprintf(img, sizeof img, "%s-%s", dir, suffix);
    PT_OK(pkv_sync(c));
    wu_copy_dir(dir, img);
    pkv_cache *ci = wu_open_ok(img, o);
    cr_assert_eq(recovery(ci).records_replayed, 0, "%s: records replayed", img);
    return ci;
}

static uint64_t file_size(const char *dir, const char *pre, uint64_t lsn) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s%016llx", dir, pre, (unsigned long long)lsn);
    size_t n = 0;
    free(wu_read_file(path, &n));
    return n;
}

/* Checkpoint now; returns whether the file written was a delta. */
static bool checkpoint(pkv_cache *c) {
    uint64_t d0 = stats(c).checkpoint_deltas, n0 = stats(c).checkpoints;
    PT_OK(pkv_checkpoint(c));
    pkv_stats st = stats(c);
    cr_assert_eq(st.checkpoints, n0 + 1, "pkv_checkpoint wrote no file");
    return st.checkpoint_deltas == d0 + 1;
}

/* A cached prompt of `nb` full blocks + 1 token, all of it committed, then closed. */
static void prompt_cached(pkv_cache *c, uint64_t id, uint32_t seed, uint32_t nb,
                          uint32_t bs) {
    uint32_t n = nb * bs + 1, t[16 * 64 + 1];
    cr_assert(n <= sizeof t / sizeof t[0]);
    for (uint32_t k = 0; k < n; k++) t[k] = seed * 7919u + k * 31u + 1;
    size_t hit = 0;
    PT_OK(pkv_seq_open(c, id, 0, t, n, &hit));
    pkv_slot slots[16 * 64 + 1];
    if (n > hit) {
        PT_OK(pkv_seq_append(c, id, t + hit, n - hit, slots));
        PT_OK(pkv_seq_commit(c, id, n - hit));
    }
    PT_OK(pkv_seq_close(c, id));
}

static void opts(pkv_options *o, uint64_t cap) {
    wu_opts(o, 16, cap, PKV_DURABLE_GROUP);
    o->flags = PKV_OPEN_LIMBO_WAIT; /* block counts that do not depend on flush timing */
}

/* A new cache of `cap` blocks (opts) in pt_path(sub). */
static pkv_cache *open_new(char *dir, size_t dcap, const char *sub, pkv_options *o,
                           uint64_t cap) {
    pt_path(dir, dcap, sub);
    opts(o, cap);
    return wu_open_ok(dir, o);
}

/* open_new, then n cached prompts of 2 blocks each and the first checkpoint (full;
 * its sync also empties limbo). */
static pkv_cache *open_filled(char *dir, size_t dcap, const char *sub, pkv_options *o,
                              uint64_t cap, uint32_t n) {
    pkv_cache *c = open_new(dir, dcap, sub, o, cap);
    for (uint32_t i = 0; i < n; i++) prompt_cached(c, i + 1, i, 2, 16);
    cr_assert(!checkpoint(c), "the first checkpoint of a new cache must be full");
    return c;
}

/* A 512-block cache in pt_path(sub) with a chain: a full checkpoint, then ndeltas
 * deltas, each after a new 4-block prompt. lsn[0] receives the full checkpoint's
 * LSN, lsn[k] the k-th delta's (lsn may be NULL). Returns the open cache. */
static pkv_cache *open_with_chain(char *dir, size_t dcap, const char *sub, pkv_options *o,
                                  unsigned ndeltas, uint64_t *lsn) {
    pkv_cache *c = open_new(dir, dcap, sub, o, 512);
    for (unsigned k = 0; k <= ndeltas; k++) {
        prompt_cached(c, 1 + k, 1 + k, 4, 16);
        cr_assert_eq(checkpoint(c), k > 0, "checkpoint %u of the chain", k);
        if (lsn) lsn[k] = stats(c).checkpoint_lsn;
    }
    return c;
}

/* ---- Tests --------------------------------------------------------------------- */

Test(checkpoint, a_delta_holds_only_the_changed_blocks)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_filled(dir, sizeof dir, "small", &o, 3040, 1500); /* 3000 blocks */
    uint64_t base = stats(c).checkpoint_lsn, full = file_size(dir, "ckpt-", base);
    /* 40 new prompts: 80 new blocks, 40 of them by eviction. */
    uint64_t ev0 = stats(c).evictions;
    for (uint32_t i = 0; i < 40; i++) prompt_cached(c, 5000 + i, 100000 + i, 2, 16);
    cr_assert(stats(c).evictions > ev0, "nothing evicted: the test lost its point");
    cr_assert(checkpoint(c), "a small change after a full checkpoint must give a delta");
    uint64_t d1 = stats(c).checkpoint_lsn, dsz = file_size(dir, "delta-", d1);
    cr_assert(dsz > 0 && dsz * 10 < full, "delta of %llu bytes against a full checkpoint "
              "of %llu", (unsigned long long)dsz, (unsigned long long)full);
    cr_assert_eq(wu_count(dir, "ckpt-"), 1);
    cr_assert_eq(wu_count(dir, "delta-"), 1);
    PT_CHECK(c);
    sealed_set want = sealed_take(c);
    pt_close(c);
    c = wu_open_ok(dir, &o);
    pkv_recovery r = recovery(c);
    cr_assert_eq(r.checkpoint_lsn, d1);
    cr_assert_eq(r.checkpoint_deltas, 1);
    sealed_same(&want, c, "reopened on ckpt + delta");
    clean_recovery(c, "reopened on ckpt + delta");
    free(want.b);
    pt_close(c);
}

/* Blocks evicted and not sealed again (free, or the open tail of a sequence) must
 * not come back from the full checkpoint below the delta. */
Test(checkpoint, an_evicted_block_stays_evicted)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_filled(dir, sizeof dir, "evicted", &o, 96, 60);
    uint64_t ev0 = stats(c).evictions, sealed0 = stats(c).blocks_sealed;
    uint64_t nfree = stats(c).blocks_free;
    cr_assert(ev0 > 0 && nfree < 4, "the fill left %llu blocks free",
              (unsigned long long)nfree);
    /* 4 + nfree open sequences of 10 committed tokens: the last four took evicted
     * blocks, now open; one of those is then closed, so its block is free. */
    uint32_t t[10];
    pkv_slot slots[10];
    const uint64_t last = 100 + 4 + nfree;
    for (uint64_t id = 100; id < last; id++) {
        for (uint32_t k = 0; k < 10; k++) t[k] = (uint32_t)(id * 100 + k);
        size_t hit;
        PT_OK(pkv_seq_open(c, id, 0, t, 10, &hit));
        PT_OK(pkv_seq_append(c, id, t, 10, slots));
        PT_OK(pkv_seq_commit(c, id, 10));
    }
    PT_OK(pkv_seq_close(c, last - 1));
    cr_assert_eq(stats(c).evictions, ev0 + 4);
    cr_assert_eq(stats(c).blocks_sealed, sealed0 - 4);
    cr_assert(checkpoint(c));
    sealed_set want = sealed_take(c);
    pkv_cache *ci = open_image(c, dir, "img", &o);
    clean_recovery(ci, "crash image");
    sealed_same(&want, ci, "crash image");
    for (uint64_t id = 100; id < last - 1; id++) {
        pkv_seq_info si = PT_SEQ_INFO(ci, id);
        cr_assert(si.committed == 10, "seq %llu: %llu committed", (unsigned long long)id,
                  (unsigned long long)si.committed);
    }
    free(want.b);
    pt_close(ci);
    pt_close(c);
}

/* The chain alone must carry the state: a crash image taken right after a delta
 * recovers from it with nothing replayed, to exactly the workload's model. */
Test(checkpoint, the_chain_alone_recovers_the_workload)
{
    char dir[512];
    pt_path(dir, sizeof dir, "chain");
    pkv_options o;
    wu_opts(&o, WU_BS, 160, PKV_DURABLE_GROUP); /* small: the workload evicts */
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 11, NULL);
    w.max_seqs = 4;
    w.max_len = 40;
    unsigned deltas = 0;
    for (unsigned round = 0; round < 12; round++) {
        for (unsigned i = 0; i < 40; i++) wu_step(&w);
        deltas += checkpoint(c);
    }
    cr_assert(deltas >= 6, "only %u of 12 checkpoints were deltas", deltas);
    cr_assert(stats(c).evictions > 0, "nothing evicted: the test lost its point");
    sealed_set want = sealed_take(c);
    uint64_t ck = stats(c).checkpoint_lsn;
    pkv_cache *ci = open_image(c, dir, "img", &o);
    cr_assert_eq(recovery(ci).checkpoint_lsn, ck);
    cr_assert(recovery(ci).checkpoint_deltas >= 1);
    sealed_same(&want, ci, "crash image");
    clean_recovery(ci, "crash image");
    wu_model m = {0};
    wu_model_copy(&m, &w.m);
    wu_model_drop_pending(&m);
    wu_verify_model(ci, &m, "crash image of the chain");
    /* A full checkpoint of the same state recovers to exactly the same blocks,
     * release LSNs (the LRU order) included. */
    sealed_set chain = sealed_take(ci);
    pt_close(ci);
    pkv_lock(c);
    c->wal.chain_ok = false; /* the next checkpoint is full */
    pkv_unlock(c);
    cr_assert(!checkpoint(c));
    cr_assert_eq(stats(c).checkpoint_lsn, ck);
    cr_assert_eq(wu_count(dir, "delta-"), 0);
    ci = open_image(c, dir, "img2", &o);
    cr_assert_eq(recovery(ci).checkpoint_deltas, 0);
    sealed_same_as(&chain, ci, true, "full checkpoint against the chain");
    wu_verify_model(ci, &m, "crash image of the full checkpoint");
    wu_model_free(&m);
    free(chain.b);
    pt_close(ci);
    free(want.b);
    pt_close(c);
    wu_wl_free(&w);
}

/* Sequences come from the newest file of the chain only: one closed after the full
 * checkpoint stays closed, one opened after it is there. */
Test(checkpoint, sequences_come_from_the_newest_file)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_new(dir, sizeof dir, "seqs", &o, 256);
    uint32_t t[40];
    for (uint32_t k = 0; k < 40; k++) t[k] = 500 + k;
    pkv_slot slots[40];
    size_t hit;
    PT_OK(pkv_seq_open(c, 1, 0, t, 20, &hit));
    PT_OK(pkv_seq_append(c, 1, t, 20, slots));
    PT_OK(pkv_seq_commit(c, 1, 20));
    cr_assert(!checkpoint(c));
    PT_OK(pkv_seq_close(c, 1));
    PT_OK(pkv_seq_open(c, 2, 9, t, 37, &hit));
    PT_OK(pkv_seq_append(c, 2, t, 37, slots));
    PT_OK(pkv_seq_commit(c, 2, 37));
    cr_assert(checkpoint(c));
    pkv_cache *ci = open_image(c, dir, "img", &o);
    clean_recovery(ci, "crash image");
    uint64_t ids[4];
    size_t n = 0;
    PT_OK(pkv_seq_list(ci, ids, 4, &n));
    cr_assert(n == 1 && ids[0] == 2, "%zu sequences recovered, first %llu", n,
              (unsigned long long)(n ? ids[0] : 0));
    pkv_seq_info si = PT_SEQ_INFO(ci, 2);
    cr_assert(si.len == 37 && si.committed == 37 && si.salt == 9);
    uint32_t got[40];
    PT_OK(pkv_seq_tokens(ci, 2, got, 40, &n));
    cr_assert(n == 37 && !memcmp(got, t, 37 * 4), "tokens of the recovered sequence");
    pt_close(ci);
    pt_close(c);
}

Test(checkpoint, a_checkpoint_with_nothing_new_writes_no_file)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_new(dir, sizeof dir, "idle", &o, 256);
    prompt_cached(c, 1, 1, 3, 16);
    cr_assert(!checkpoint(c));
    prompt_cached(c, 2, 2, 3, 16);
    cr_assert(checkpoint(c));
    pkv_stats st = stats(c);
    PT_OK(pkv_checkpoint(c)); /* nothing logged since: succeeds, writes nothing */
    cr_assert_eq(stats(c).checkpoints, st.checkpoints);
    cr_assert_eq(stats(c).checkpoint_lsn, st.checkpoint_lsn);
    cr_assert_eq(wu_count(dir, "delta-"), 1);
    prompt_cached(c, 3, 3, 3, 16);
    cr_assert(checkpoint(c), "the chain goes on after a checkpoint that wrote nothing");
    cr_assert_eq(wu_count(dir, "delta-"), 2);
    pt_close(c);
    c = wu_open_ok(dir, &o);
    cr_assert_eq(recovery(c).checkpoint_deltas, 2);
    pt_close(c);
}

/* A full checkpoint ends the chain: after DELTA_CHAIN_MAX deltas and when the
 * deltas would outgrow the full checkpoint. It deletes the chain's deltas. */
Test(checkpoint, a_full_checkpoint_ends_the_chain)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_filled(dir, sizeof dir, "ends", &o, 4096, 200);
    /* By count. */
    for (unsigned k = 0; k < DELTA_CHAIN_MAX; k++) {
        prompt_cached(c, 1000 + k, 1000 + k, 1, 16);
        cr_assert(checkpoint(c), "checkpoint %u of the chain was not a delta", k + 1);
    }
    cr_assert_eq(wu_count(dir, "delta-"), DELTA_CHAIN_MAX);
    prompt_cached(c, 2000, 2000, 1, 16);
    cr_assert(!checkpoint(c), "delta number %u", DELTA_CHAIN_MAX + 1);
    cr_assert_eq(wu_count(dir, "delta-"), 0);
    cr_assert_eq(wu_count(dir, "ckpt-"), 1);
    /* By size: 600 new blocks, where the full checkpoint holds 465 (the budget's
     * 1 MiB floor lowered for the test). */
    pkv_lock(c);
    c->wal.delta_floor = 0;
    pkv_unlock(c);
    prompt_cached(c, 3000, 3000, 1, 16);
    cr_assert(checkpoint(c));
    for (uint32_t i = 0; i < 300; i++) prompt_cached(c, 4000 + i, 4000 + i, 2, 16);
    cr_assert(!checkpoint(c), "a delta larger than the full checkpoint was written");
    cr_assert_eq(wu_count(dir, "delta-"), 0);
    pt_close(c);
}

/* An open continues the chain it recovered: the blocks the log's replay changed
 * are dirty, the others clean (those a recovered sequence holds too, although
 * recovery verifies them), and the first checkpoint is a delta holding them. A
 * crash image right after it recovers from the chain alone, to the same state,
 * release LSNs included, as a full checkpoint of that state gives. */
Test(checkpoint, the_chain_continues_across_an_open)
{
    char dir[512], img[600];
    pkv_options o;
    uint64_t lsn[3];
    pkv_cache *c = open_with_chain(dir, sizeof dir, "across", &o, 2, lsn);
    /* Into the chain: the cache filled to 465 of its 512 blocks. */
    for (uint32_t k = 0; k < 7; k++) prompt_cached(c, 100 + k, 100 + k, 63, 16);
    cr_assert(checkpoint(c));
    /* Changes the log alone holds: a sequence holding 63 of the chain's blocks
     * (a prefix hit, kept open), a chain prompt hit again and closed (new release
     * LSNs), and 80 new blocks, 33 of them by eviction. */
    uint32_t held_t[63 * 16 + 1];
    for (uint32_t k = 0; k < 63 * 16 + 1; k++) held_t[k] = 100 * 7919u + k * 31u + 1;
    size_t hit = 0;
    PT_OK(pkv_seq_open(c, 900, 0, held_t, 63 * 16 + 1, &hit));
    cr_assert_eq(hit, 63 * 16, "the held prompt was not a full hit");
    prompt_cached(c, 901, 1, 4, 16);
    prompt_cached(c, 902, 500, 40, 16);
    prompt_cached(c, 903, 501, 40, 16);
    cr_assert(stats(c).evictions > 0, "nothing evicted: the test lost its point");
    sealed_set want = sealed_take(c);
    PT_OK(pkv_sync(c));
    snprintf(img, sizeof img, "%s-crash", dir);
    wu_copy_dir(dir, img); /* a crash: the open below replays the log */
    pt_close(c);
    c = wu_open_ok(img, &o);
    pkv_recovery r = recovery(c);
    cr_assert_eq(r.checkpoint_deltas, 3);
    cr_assert(r.records_replayed > 0);
    clean_recovery(c, "crash image");
    sealed_same(&want, c, "crash image");
    uint32_t held[64];
    size_t nheld = 0;
    PT_OK(pkv_seq_blocks(c, 900, held, 64, &nheld));
    cr_assert_eq(nheld, 63);
    pkv_lock(c);
    for (size_t i = 0; i < nheld; i++)
        cr_assert(!(c->pool.ckdirty[held[i] >> 6] >> (held[i] & 63) & 1),
                  "block %u of the recovered sequence is dirty, unchanged", held[i]);
    pkv_unlock(c);
    cr_assert(checkpoint(c), "the first checkpoint after the open was full");
    cr_assert_eq(wu_count(img, "delta-"), 4);
    /* The new delta holds what the replay changed: the chain alone gives it back. */
    sealed_set chain_state = sealed_take(c);
    pkv_cache *ci = open_image(c, img, "chain", &o);
    cr_assert_eq(recovery(ci).checkpoint_deltas, 4);
    clean_recovery(ci, "chain image");
    sealed_same_as(&chain_state, ci, false, "chain image");
    sealed_set from_chain = sealed_take(ci);
    pt_close(ci);
    /* The same state from a full checkpoint, release LSNs included. */
    pkv_lock(c);
    c->wal.chain_ok = false;
    pkv_unlock(c);
    cr_assert(!checkpoint(c));
    ci = open_image(c, img, "full", &o);
    cr_assert_eq(recovery(ci).checkpoint_deltas, 0);
    sealed_same_as(&from_chain, ci, true, "full checkpoint against the continued chain");
    pt_close(ci);
    /* With nothing replayed, an open has nothing to add: no file. */
    pt_close(c);
    c = wu_open_ok(img, &o);
    cr_assert_eq(recovery(c).records_replayed, 0);
    PT_OK(pkv_checkpoint(c));
    cr_assert_eq(stats(c).checkpoints, 0, "a checkpoint of nothing new after an open");
    pt_close(c);
    free(from_chain.b);
    free(chain_state.b);
    free(want.b);
}

/* The log before the newest file may be recycled, so a chain with a file missing
 * cannot be recovered: the open fails and changes nothing. */
Test(checkpoint, a_broken_chain_fails_the_open_and_changes_nothing)
{
    char dir[512];
    pkv_options o;
    uint64_t lsn[3];
    pkv_cache *c = open_with_chain(dir, sizeof dir, "broken", &o, 2, lsn);
    const uint64_t base = lsn[0], d1 = lsn[1];
    pt_close(c);
    char path[600], keep[600];
    /* The middle delta missing. */
    snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)d1);
    snprintf(keep, sizeof keep, "%s/../kept-delta", dir);
    cr_assert_eq(rename(path, keep), 0);
    wu_dirsnap snap;
    wu_dirsnap_take(&snap, dir);
    cr_assert_eq(wu_open(dir, &o, &c), PKV_ECORRUPT);
    cr_assert(strstr(pkv_last_error(), "chain"), "error: %s", pkv_last_error());
    wu_dirsnap_same(&snap, dir, "after the failed open");
    wu_dirsnap_free(&snap);
    cr_assert_eq(rename(keep, path), 0);
    /* The full checkpoint missing. */
    snprintf(path, sizeof path, "%s/ckpt-%016llx", dir, (unsigned long long)base);
    cr_assert_eq(rename(path, keep), 0);
    cr_assert_eq(wu_open(dir, &o, &c), PKV_ECORRUPT);
    cr_assert_eq(rename(keep, path), 0);
    /* The full checkpoint renamed: its header covers another LSN than its name. */
    snprintf(keep, sizeof keep, "%s/ckpt-%016llx", dir, (unsigned long long)base - 1);
    cr_assert_eq(rename(path, keep), 0);
    wu_dirsnap_take(&snap, dir);
    cr_assert_eq(wu_open(dir, &o, &c), PKV_ECORRUPT);
    cr_assert(strstr(pkv_last_error(), "not the one its name says"), "error: %s",
              pkv_last_error());
    wu_dirsnap_same(&snap, dir, "after the failed open (renamed full checkpoint)");
    wu_dirsnap_free(&snap);
    cr_assert_eq(rename(keep, path), 0);
    /* Whole again: opens. */
    c = wu_open_ok(dir, &o);
    cr_assert_eq(recovery(c).checkpoint_deltas, 2);
    pt_close(c);
}

/* A delta left over from an older chain (a crash between a full checkpoint's
 * rename and its deletion of the old chain) is ignored, and deleted by the next
 * writable open. */
Test(checkpoint, a_delta_of_an_older_chain_is_ignored)
{
    char dir[512];
    pkv_options o;
    uint64_t lsn[2];
    pkv_cache *c = open_with_chain(dir, sizeof dir, "stale", &o, 1, lsn);
    const uint64_t d1 = lsn[1];
    char path[600], old[600];
    snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)d1);
    snprintf(old, sizeof old, "%s/../old-delta", dir);
    wu_copy_dir(dir, old); /* keeps a copy of delta-<d1> */
    pt_close(c);
    c = wu_open_ok(dir, &o);
    prompt_cached(c, 3, 3, 4, 16);
    pkv_lock(c);
    c->wal.chain_ok = false; /* a full checkpoint (the chain would continue) */
    pkv_unlock(c);
    cr_assert(!checkpoint(c)); /* full: deletes delta-<d1> */
    cr_assert_eq(wu_count(dir, "delta-"), 0);
    sealed_set want = sealed_take(c);
    pt_close(c);
    char from[700];
    snprintf(from, sizeof from, "%s/delta-%016llx", old, (unsigned long long)d1);
    size_t n = 0;
    uint8_t *b = wu_read_file(from, &n);
    wu_write_file(path, b, n);
    free(b);
    c = wu_open_ok(dir, &o);
    cr_assert_eq(recovery(c).checkpoint_deltas, 0);
    /* and the open deletes it (the full checkpoint's clean-up it missed) */
    cr_assert_eq(wu_count(dir, "delta-"), 0, "the stale delta outlived a writable open");
    sealed_same(&want, c, "with a stale delta beside the chain");
    clean_recovery(c, "with a stale delta beside the chain");
    free(want.b);
    pt_close(c);
}

/* PKV_OPEN_FULL_CHECKPOINTS: no delta is written, and a chain an earlier open
 * left is replaced by a full checkpoint at open. */
Test(checkpoint, the_full_checkpoints_flag_writes_no_delta)
{
    char dir[512];
    pkv_options o;
    pkv_cache *c = open_with_chain(dir, sizeof dir, "fullonly", &o, 1, NULL);
    pt_close(c);
    o.flags |= PKV_OPEN_FULL_CHECKPOINTS;
    c = wu_open_ok(dir, &o);
    cr_assert_eq(recovery(c).checkpoint_deltas, 1); /* a chain opens with the flag */
    /* ... and is replaced by a full checkpoint at once. */
    cr_assert_eq(wu_count(dir, "delta-"), 0);
    cr_assert_eq(stats(c).checkpoints, 1);
    for (uint32_t k = 0; k < 3; k++) {
        prompt_cached(c, 10 + k, 10 + k, 1, 16);
        cr_assert(!checkpoint(c), "checkpoint %u was a delta", k);
        cr_assert_eq(wu_count(dir, "delta-"), 0);
    }
    pt_close(c);
}

/* A delta of another arena on top of this arena's checkpoint is a stray file, not
 * a replaced arena: the open fails and changes nothing (it used to take the
 * "arena replaced" path and drop the whole cache). */
Test(checkpoint, a_delta_of_another_arena_fails_the_open)
{
    char a[512], b[512];
    pt_path(a, sizeof a, "arena-a");
    pt_path(b, sizeof b, "arena-b");
    pkv_options o;
    opts(&o, 512);
    pkv_cache *ca = wu_open_ok(a, &o), *cb = wu_open_ok(b, &o);
    prompt_cached(ca, 1, 1, 4, 16);
    prompt_cached(cb, 1, 1, 4, 16);
    cr_assert(!checkpoint(ca));
    cr_assert(!checkpoint(cb));
    for (uint32_t k = 0; k < 8; k++) prompt_cached(cb, 10 + k, 10 + k, 4, 16);
    cr_assert(checkpoint(cb));
    uint64_t lb = stats(cb).checkpoint_lsn;
    cr_assert(lb > stats(ca).checkpoint_lsn);
    pt_close(ca);
    pt_close(cb);
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/delta-%016llx", b, (unsigned long long)lb);
    snprintf(to, sizeof to, "%s/delta-%016llx", a, (unsigned long long)lb);
    size_t n = 0;
    uint8_t *buf = wu_read_file(from, &n);
    wu_write_file(to, buf, n);
    free(buf);
    wu_dirsnap snap;
    wu_dirsnap_take(&snap, a);
    pkv_cache *c = NULL;
    cr_assert_eq(wu_open(a, &o, &c), PKV_ECORRUPT);
    cr_assert(strstr(pkv_last_error(), "another arena"), "error: %s", pkv_last_error());
    wu_dirsnap_same(&snap, a, "after the failed open");
    wu_dirsnap_free(&snap);
}

/* With nothing logged since the newest file, a due automatic checkpoint writes no
 * file and must reset the trigger: log frames flushed after a checkpoint fixed its
 * LSN count toward the next one although that one covers their records, and a
 * trigger left due made the checkpoint thread loop forever holding the cache lock
 * (every later call hung; alarm() turns that into a failure). */
Test(checkpoint, a_due_checkpoint_with_nothing_new_does_not_spin)
{
    char dir[512];
    pt_path(dir, sizeof dir, "spin");
    pkv_options o;
    opts(&o, 256);
    o.checkpoint_bytes = 1; /* every frame makes one due */
    pkv_cache *c = wu_open_ok(dir, &o);
    alarm(60);
    for (uint32_t round = 0; round < 10; round++) {
        /* Calls as fast as possible while checkpoints run, so that one ends with
         * frames of records it covers flushed after its LSN; then stop. */
        for (uint32_t k = 0; k < 300; k++) prompt_cached(c, 1000 * round + k, k % 97, 1, 16);
        nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);
        (void)stats(c); /* hangs while the thread spins */
    }
    /* The automatic checkpoints did run (they are asynchronous: under a sanitizer
     * the first may come after the first round). */
    for (int i = 0; i < 250 && stats(c).checkpoints == 0; i++)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    cr_assert(stats(c).checkpoints > 0, "no automatic checkpoint: the test lost its point");
    alarm(0);
    pt_close(c);
}

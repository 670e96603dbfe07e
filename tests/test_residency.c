/*
 * test_residency.c — the CPU-side logic of the CUDA layer, in every build (no GPU
 * needed): the residency map and slot LRU with pinning (src/cuda/residency.c),
 * batch plans and device block tables, block content tags read from the engine
 * (src/cuda/glue.c), the attention launch plan (src/cuda/attn_plan.c), and the
 * CUDA API's behaviour without a device.
 *
 * The "simulated device" suite runs the whole paging logic against a host buffer
 * standing in for the device pool: every planned copy is a memcpy from the arena,
 * the pool starts NaN-filled, and after each page-in the CPU attention over the
 * pool (through the plan's slot tables) must equal, bit for bit, the CPU attention
 * over the arena (through the sequences' block tables). A stale or missing slot
 * -- a block whose contents changed without a re-copy, an evicted slot still in a
 * table -- changes the result or makes it NaN.
 */
#include "pkv_test.h"

#include "cuda/attn_plan.h"
#include "cuda/glue.h"
#include "cuda/residency.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(residency, .init = pt_setup, .fini = pt_teardown);

/* ---- Helpers ---------------------------------------------------------------- */

#define RES_OK(r)                                                                   \
    do {                                                                            \
        char why_[256];                                                             \
        int rc_ = pkv_res_check((r), why_, sizeof why_);                            \
        cr_assert_eq(rc_, 0, "%s:%d: pkv_res_check: %s", __FILE__, __LINE__, why_); \
    } while (0)

static pkv_res_seq rseq(const uint32_t *blocks, uint32_t nb, uint32_t len, const uint64_t *tags) {
    return (pkv_res_seq){.blocks = blocks, .tags = tags, .n_blocks = nb, .len = len,
                         .need = len, .stable = len};
}

static void plan_ok(pkv_res *r, const pkv_res_seq *s, size_t n, pkv_res_plan *p) {
    int rc = pkv_res_plan_batch(r, s, n, p);
    cr_assert_eq(rc, 0, "plan -> %d (%s)", rc, pkv_last_error());
    RES_OK(r);
}

/* Plan one sequence over blocks[0..nb) (full blocks, tags 0) and release it. */
static void touch(pkv_res *r, const uint32_t *blocks, uint32_t nb) {
    pkv_res_plan p;
    pkv_res_seq s = rseq(blocks, nb, nb * r->block_size, NULL);
    plan_ok(r, &s, 1, &p);
    pkv_res_release(r, &p);
    RES_OK(r);
}

static void lru_is(const pkv_res *r, const uint32_t *want, size_t n) {
    uint32_t got[64];
    size_t k = pkv_res_lru_blocks(r, got, 64);
    cr_assert_eq(k, n, "LRU holds %zu blocks, expected %zu", k, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "LRU position %zu: block %u, expected %u", i, got[i], want[i]);
}

/* Everything observable about r, for "a failed call changed nothing". */
typedef struct res_snap {
    pkv_res_counts c;
    uint32_t lru[256];
    size_t n_lru;
    uint32_t slot_of[256];
    uint64_t tag_of[256];
    uint32_t valid_of[256];
    uint32_t pins[256];
} res_snap;

static void snap(const pkv_res *r, res_snap *s) {
    memset(s, 0, sizeof *s);
    pkv_res_counts_get(r, &s->c);
    s->n_lru = pkv_res_lru_blocks(r, s->lru, 256);
    for (uint32_t b = 0; b < r->n_blocks && b < 256; b++)
        s->slot_of[b] = pkv_res_lookup(r, b, &s->tag_of[b], &s->valid_of[b]);
    for (uint32_t i = 0; i < r->n_slots && i < 256; i++) s->pins[i] = r->slots[i].pins;
}

static void snap_same(const pkv_res *r, const res_snap *a) {
    res_snap b;
    snap(r, &b);
    cr_assert_eq(memcmp(&a->c, &b.c, sizeof a->c), 0, "slot counts changed");
    cr_assert_eq(a->n_lru, b.n_lru, "LRU length changed");
    cr_assert_eq(memcmp(a->lru, b.lru, sizeof a->lru), 0, "LRU order changed");
    cr_assert_eq(memcmp(a->slot_of, b.slot_of, sizeof a->slot_of), 0, "residency map changed");
    cr_assert_eq(memcmp(a->tag_of, b.tag_of, sizeof a->tag_of), 0, "tags changed");
    cr_assert_eq(memcmp(a->valid_of, b.valid_of, sizeof a->valid_of), 0, "valid counts changed");
    cr_assert_eq(memcmp(a->pins, b.pins, sizeof a->pins), 0, "pins changed");
}

/* ---- Residency map, LRU, pinning ----------------------------------------------- */

Test(residency, init_rejects_bad_sizes) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 0, 10, 4), PKV_EINVAL);
    cr_assert_eq(pkv_res_init(&r, 4, 0, 4), PKV_EINVAL);
    cr_assert_eq(pkv_res_init(&r, 4, 10, 0), PKV_EINVAL);
    cr_assert_eq(pkv_res_init(&r, 4, 10, 4), 0);
    RES_OK(&r);
    pkv_res_counts c;
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.free, 4);
    cr_assert_eq(c.resident, 0);
    pkv_res_free(&r);
}

Test(residency, plan_copies_missing_blocks_and_builds_tables) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 8, 100, 4), 0);
    const uint32_t b0[] = {7, 3, 42}, b1[] = {7, 3, 9, 11, 50};
    pkv_res_seq s[2] = {rseq(b0, 3, 10, NULL), rseq(b1, 5, 17, NULL)};
    pkv_res_plan p;
    plan_ok(&r, s, 2, &p);
    cr_assert_eq(p.n_seqs, 2);
    cr_assert_eq(p.table_stride, 5);
    cr_assert_eq(p.max_len, 17);
    cr_assert_eq(p.lens[0], 10);
    cr_assert_eq(p.lens[1], 17);
    cr_assert_eq(p.n_blocks, 6, "distinct blocks 7 3 42 9 11 50");
    cr_assert_eq(p.n_copies, 6);
    cr_assert_eq(p.n_pinned, 6);
    /* Shared blocks 7 and 3 map to one slot in both rows; padding is NONE. */
    cr_assert_eq(p.tables[0], p.tables[5 + 0]);
    cr_assert_eq(p.tables[1], p.tables[5 + 1]);
    cr_assert_eq(p.tables[3], PKV_RES_NONE);
    cr_assert_eq(p.tables[4], PKV_RES_NONE);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(pkv_res_lookup(&r, b0[i], NULL, NULL), p.tables[i]);
    for (uint32_t i = 0; i < 5; i++)
        cr_assert_eq(pkv_res_lookup(&r, b1[i], NULL, NULL), p.tables[5 + i]);
    /* Every copy names a block and the slot the tables use for it. */
    for (uint32_t i = 0; i < p.n_copies; i++)
        cr_assert_eq(pkv_res_lookup(&r, p.copies[i].block, NULL, NULL), p.copies[i].slot);
    pkv_res_counts c;
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.pinned, 6);
    cr_assert_eq(c.free, 2);
    pkv_res_release(&r, &p);
    RES_OK(&r);
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.pinned, 0);
    cr_assert_eq(c.lru, 6);
    cr_assert_eq(c.resident, 6);
    pkv_res_free(&r);
}

Test(residency, second_plan_hits) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 8, 100, 4), 0);
    const uint32_t b[] = {1, 2, 3};
    const uint64_t tags[] = {11, 22, 33};
    pkv_res_seq s = rseq(b, 3, 12, tags);
    pkv_res_plan p;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 3);
    uint32_t slots[3];
    memcpy(slots, p.tables, sizeof slots);
    pkv_res_release(&r, &p);
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 0);
    cr_assert_eq(p.hits, 3);
    cr_assert_eq(memcmp(slots, p.tables, sizeof slots), 0, "hits keep their slots");
    pkv_res_release(&r, &p);
    cr_assert_eq(r.st.hits, 3);
    cr_assert_eq(r.st.copies, 3);
    pkv_res_free(&r);
}

Test(residency, changed_tag_or_more_tokens_recopies_in_place) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t b[] = {5, 6};
    uint64_t tags[] = {1, 2};
    pkv_res_seq s = rseq(b, 2, 6, tags); /* block 6 holds 2 tokens */
    pkv_res_plan p;
    plan_ok(&r, &s, 1, &p);
    const uint32_t slot6 = p.tables[1];
    pkv_res_release(&r, &p);
    uint32_t valid;
    cr_assert_eq(pkv_res_lookup(&r, 6, NULL, &valid), slot6);
    cr_assert_eq(valid, 2);
    /* A third token, written on the host, not committed: need 3 > valid 2. */
    s.len = s.need = 7;
    s.stable = 6;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 1);
    cr_assert_eq(p.copies[0].block, 6);
    cr_assert_eq(p.copies[0].slot, slot6, "an unpinned stale slot is reused in place");
    pkv_res_release(&r, &p);
    cr_assert_eq(pkv_res_lookup(&r, 6, NULL, &valid), slot6);
    cr_assert_eq(valid, 2, "pending tokens are never counted as valid");
    /* Same length, but the block's content changed (freed and reused). */
    s.len = s.need = s.stable = 6;
    tags[1] = 99;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 1);
    cr_assert_eq(p.copies[0].block, 6);
    pkv_res_release(&r, &p);
    uint64_t tag;
    pkv_res_lookup(&r, 6, &tag, &valid);
    cr_assert_eq(tag, 99);
    cr_assert_eq(valid, 2);
    cr_assert_eq(r.st.recopies, 2);
    pkv_res_free(&r);
}

Test(residency, lru_order_and_eviction) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 1), 0);
    const uint32_t a[] = {10, 11}, b[] = {12, 13}, c[] = {14}, d[] = {11}, e[] = {15};
    touch(&r, a, 2);
    touch(&r, b, 2);
    const uint32_t o1[] = {10, 11, 12, 13};
    lru_is(&r, o1, 4);
    touch(&r, c, 1); /* evicts 10, the least recently released */
    const uint32_t o2[] = {11, 12, 13, 14};
    lru_is(&r, o2, 4);
    cr_assert_eq(pkv_res_lookup(&r, 10, NULL, NULL), PKV_RES_NONE);
    cr_assert_eq(r.st.evictions, 1);
    touch(&r, d, 1); /* a hit moves 11 to the most recent end */
    const uint32_t o3[] = {12, 13, 14, 11};
    lru_is(&r, o3, 4);
    touch(&r, e, 1); /* evicts 12 */
    const uint32_t o4[] = {13, 14, 11, 15};
    lru_is(&r, o4, 4);
    cr_assert_eq(r.st.evictions, 2);
    pkv_res_free(&r);
}

Test(residency, pinned_slots_are_never_evicted) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 1), 0);
    const uint32_t a[] = {0, 1, 2}, b[] = {3}, c[] = {4}, d[] = {5, 6};
    pkv_res_plan pa;
    pkv_res_seq sa = rseq(a, 3, 3, NULL);
    plan_ok(&r, &sa, 1, &pa); /* in flight */
    uint32_t slots[3];
    memcpy(slots, pa.tables, sizeof slots);
    touch(&r, b, 1);
    touch(&r, c, 1); /* the only unpinned slot is 3's: it goes */
    cr_assert_eq(pkv_res_lookup(&r, 3, NULL, NULL), PKV_RES_NONE);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pkv_res_lookup(&r, a[i], NULL, NULL), slots[i], "pinned block %u moved", a[i]);
    /* Two blocks need two slots; one is obtainable: refused, nothing changes. */
    res_snap before;
    snap(&r, &before);
    const uint64_t failed = r.st.plans_failed;
    pkv_res_plan pd;
    pkv_res_seq sd = rseq(d, 2, 2, NULL);
    cr_assert_eq(pkv_res_plan_batch(&r, &sd, 1, &pd), PKV_EFULL);
    cr_assert_eq(pd.tables, NULL);
    cr_assert_eq(pd.n_pinned, 0);
    RES_OK(&r);
    snap_same(&r, &before);
    cr_assert_eq(r.st.plans_failed, failed + 1);
    pkv_res_release(&r, &pa);
    RES_OK(&r);
    plan_ok(&r, &sd, 1, &pd); /* now it fits */
    pkv_res_release(&r, &pd);
    pkv_res_free(&r);
}

Test(residency, batch_larger_than_pool_fails_cleanly) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 2), 0);
    const uint32_t warm[] = {40, 41};
    touch(&r, warm, 2);
    res_snap before;
    snap(&r, &before);
    const uint32_t big[] = {1, 2, 3, 4, 5};
    pkv_res_seq s = rseq(big, 5, 10, NULL);
    pkv_res_plan p;
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_EFULL);
    RES_OK(&r);
    snap_same(&r, &before);
    /* Split across two sequences of one batch: the same. */
    pkv_res_seq two[2] = {rseq(big, 3, 6, NULL), rseq(big + 3, 2, 4, NULL)};
    cr_assert_eq(pkv_res_plan_batch(&r, two, 2, &p), PKV_EFULL);
    snap_same(&r, &before);
    /* Exactly the pool: fits, evicting both warm blocks. */
    s = rseq(big, 4, 8, NULL);
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(r.st.evictions, 2);
    pkv_res_release(&r, &p);
    pkv_res_free(&r);
}

Test(residency, invalid_batches_change_nothing) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t warm[] = {1};
    touch(&r, warm, 1);
    res_snap before;
    snap(&r, &before);
    const uint32_t b[] = {1, 2, 100};
    pkv_res_plan p;
    pkv_res_seq s = rseq(b, 2, 12, NULL); /* 12 tokens need 3 entries */
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_ERANGE);
    s = rseq(b, 3, 12, NULL); /* block 100 >= 100 blocks */
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_ERANGE);
    s = rseq(b, 2, 0, NULL);
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_EINVAL);
    s = rseq(b, 2, 5, NULL);
    s.stable = 6;
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_EINVAL);
    s = rseq(b, 2, 5, NULL);
    s.need = 6;
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_EINVAL);
    s = rseq(NULL, 2, 5, NULL);
    cr_assert_eq(pkv_res_plan_batch(&r, &s, 1, &p), PKV_EINVAL);
    RES_OK(&r);
    snap_same(&r, &before);
    pkv_res_free(&r);
}

Test(residency, recopy_of_a_block_pinned_elsewhere_moves_it) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t b[] = {8};
    uint64_t t1 = 1, t2 = 2;
    pkv_res_seq s1 = rseq(b, 1, 2, &t1);
    pkv_res_plan p1, p2;
    plan_ok(&r, &s1, 1, &p1); /* in flight, reading slot X */
    const uint32_t x = p1.tables[0];
    pkv_res_seq s2 = rseq(b, 1, 3, &t2); /* the block changed on the host */
    plan_ok(&r, &s2, 1, &p2);
    const uint32_t y = p2.tables[0];
    cr_assert_neq(x, y, "slot X is pinned by batch 1: the new copy goes elsewhere");
    cr_assert_eq(p2.n_copies, 1);
    cr_assert_eq(pkv_res_lookup(&r, 8, NULL, NULL), y);
    pkv_res_counts c;
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.orphans, 1);
    cr_assert_eq(c.pinned, 2);
    pkv_res_release(&r, &p1); /* the orphan is freed, not cached */
    RES_OK(&r);
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.orphans, 0);
    cr_assert_eq(c.free, 3);
    pkv_res_release(&r, &p2);
    RES_OK(&r);
    pkv_res_free(&r);
}

Test(residency, invalidation_of_freed_or_reused_blocks) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t b[] = {3, 4};
    touch(&r, b, 2);
    pkv_res_invalidate(&r, 3); /* unpinned: straight to the free list */
    RES_OK(&r);
    cr_assert_eq(pkv_res_lookup(&r, 3, NULL, NULL), PKV_RES_NONE);
    pkv_res_counts c;
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.free, 3);
    pkv_res_invalidate(&r, 77); /* not resident: nothing */
    RES_OK(&r);
    /* Pinned: becomes an orphan, freed at release; the block is placed anew. */
    pkv_res_plan p, q;
    pkv_res_seq s = rseq(b + 1, 1, 4, NULL);
    plan_ok(&r, &s, 1, &p);
    const uint32_t old = p.tables[0];
    pkv_res_invalidate(&r, 4);
    RES_OK(&r);
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.orphans, 1);
    plan_ok(&r, &s, 1, &q);
    cr_assert_neq(q.tables[0], old);
    cr_assert_eq(q.n_copies, 1);
    pkv_res_release(&r, &p);
    pkv_res_release(&r, &q);
    RES_OK(&r);
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.resident, 1);
    cr_assert_eq(c.free, 3);
    cr_assert_eq(r.st.invalidations, 2);
    pkv_res_drop_unpinned(&r);
    RES_OK(&r);
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.free, 4);
    pkv_res_free(&r);
}

Test(residency, abort_forgets_planned_copies) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t warm[] = {1};
    touch(&r, warm, 1);
    const uint32_t b[] = {1, 2};
    pkv_res_seq s = rseq(b, 2, 8, NULL);
    pkv_res_plan p;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 1);
    pkv_res_abort(&r, &p);
    RES_OK(&r);
    cr_assert_neq(pkv_res_lookup(&r, 1, NULL, NULL), PKV_RES_NONE, "the hit stays resident");
    cr_assert_eq(pkv_res_lookup(&r, 2, NULL, NULL), PKV_RES_NONE, "the copy never happened");
    pkv_res_free(&r);
}

Test(residency, gpu_append_needs_no_copy_and_writeback_marks_valid) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t b[] = {20, 21};
    uint64_t tags[] = {5, 6};
    /* 5 committed tokens, 1 pending produced on the GPU: block 21 holds 1
     * committed token (copied), the pending one is written on the device. */
    pkv_res_seq s = {.blocks = b, .tags = tags, .n_blocks = 2, .len = 6, .need = 5, .stable = 5};
    pkv_res_plan p;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 2);
    pkv_res_release(&r, &p);
    /* Write-back of token 5, then its commit: the block's tag for 2 tokens. */
    cr_assert_eq(pkv_res_set_valid(&r, 21, 7, 2), 0);
    cr_assert_eq(pkv_res_set_valid(&r, 99, 7, 2), PKV_ERANGE);
    tags[1] = 7;
    s.len = 7;
    s.need = s.stable = 6;
    plan_ok(&r, &s, 1, &p);
    cr_assert_eq(p.n_copies, 0, "the written-back tokens are valid on the device");
    pkv_res_release(&r, &p);
    /* Tokens 6 and 7 produced and written back the same way; then token 8 opens
     * a fresh block, placed without a copy. */
    cr_assert_eq(pkv_res_set_valid(&r, 21, 9, 4), 0);
    const uint32_t b3[] = {20, 21, 22};
    uint64_t t3[] = {5, 9, 8};
    pkv_res_seq s3 = {.blocks = b3, .tags = t3, .n_blocks = 3, .len = 9, .need = 8, .stable = 8};
    plan_ok(&r, &s3, 1, &p);
    cr_assert_eq(p.n_copies, 0);
    cr_assert_neq(p.tables[2], PKV_RES_NONE);
    pkv_res_release(&r, &p);
    pkv_res_free(&r);
}

Test(residency, conflicting_tags_copy_and_trust_nothing) {
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 100, 4), 0);
    const uint32_t b[] = {1};
    const uint64_t ta = 1, tb = 2;
    pkv_res_seq s[2] = {rseq(b, 1, 4, &ta), rseq(b, 1, 4, &tb)};
    pkv_res_plan p;
    plan_ok(&r, s, 2, &p);
    cr_assert_eq(p.n_copies, 1);
    cr_assert_eq(p.tables[0], p.tables[1]);
    pkv_res_release(&r, &p);
    uint32_t valid = 9;
    pkv_res_lookup(&r, 1, NULL, &valid);
    cr_assert_eq(valid, 0);
    plan_ok(&r, s, 1, &p);
    cr_assert_eq(p.n_copies, 1, "nothing was trusted: copied again");
    pkv_res_release(&r, &p);
    pkv_res_free(&r);
}

/* Random plans, releases and invalidations against a model of what must hold: the
 * invariants, the LRU order (a list kept here), and that a block of an in-flight
 * batch keeps its slot unless it is invalidated or re-copied. */
Test(residency, random_operations_keep_invariants) {
    pt_rng rng = {.s = pt_env_u64("PKV_SEED", 12345)};
    enum { SLOTS = 16, BLOCKS = 40, INFLIGHT = 4 };
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, SLOTS, BLOCKS, 4), 0);
    pkv_res_plan fl[INFLIGHT];
    int live[INFLIGHT] = {0};
    uint32_t lru[BLOCKS];
    size_t n_lru = 0;
    uint64_t tag_now[BLOCKS] = {0};
    for (int step = 0; step < 20000; step++) {
        const uint32_t op = pt_below(&rng, 10);
        if (op < 5) { /* plan a batch of 1..3 sequences */
            int k = 0;
            while (k < INFLIGHT && live[k]) k++;
            if (k == INFLIGHT) continue;
            uint32_t blocks[3][6];
            uint64_t tags[3][6];
            pkv_res_seq s[3];
            const uint32_t ns = 1 + pt_below(&rng, 3);
            for (uint32_t q = 0; q < ns; q++) {
                const uint32_t nb = 1 + pt_below(&rng, 6);
                for (uint32_t i = 0; i < nb; i++) {
                    uint32_t x;
                    int dup;
                    do { /* distinct within a table */
                        x = pt_below(&rng, BLOCKS);
                        dup = 0;
                        for (uint32_t j = 0; j < i; j++) dup |= blocks[q][j] == x;
                    } while (dup);
                    blocks[q][i] = x;
                    tags[q][i] = tag_now[x];
                }
                s[q] = rseq(blocks[q], nb, nb * 4 - pt_below(&rng, 4), tags[q]);
            }
            res_snap before;
            snap(&r, &before);
            const int rc = pkv_res_plan_batch(&r, s, ns, &fl[k]);
            RES_OK(&r);
            if (rc) {
                cr_assert_eq(rc, PKV_EFULL, "step %d: plan -> %d", step, rc);
                snap_same(&r, &before);
                continue;
            }
            live[k] = 1;
            /* Tables agree with the map; hits were resident before. */
            for (uint32_t q = 0; q < ns; q++)
                for (uint32_t i = 0; i < s[q].n_blocks; i++)
                    cr_assert_eq(pkv_res_lookup(&r, blocks[q][i], NULL, NULL),
                                 fl[k].tables[q * fl[k].table_stride + i]);
            /* Model LRU: blocks taken by the batch leave it; evicted ones too. */
            size_t w = 0;
            for (size_t i = 0; i < n_lru; i++) {
                uint32_t sl = pkv_res_lookup(&r, lru[i], NULL, NULL);
                if (sl != PKV_RES_NONE && r.slots[sl].pins == 0) lru[w++] = lru[i];
            }
            /* Evictions come from the head: the survivors are a suffix. */
            n_lru = w;
        } else if (op < 8) { /* release one */
            int k = (int)pt_below(&rng, INFLIGHT);
            if (!live[k]) continue;
            /* Slots whose pin drops to 0 join the LRU tail in plan order. */
            for (uint32_t i = 0; i < fl[k].n_pinned; i++) {
                const uint32_t sl = fl[k].pinned[i];
                if (r.slots[sl].pins == 1 && r.slots[sl].block != PKV_RES_NONE)
                    lru[n_lru++] = r.slots[sl].block;
            }
            pkv_res_release(&r, &fl[k]);
            live[k] = 0;
            RES_OK(&r);
        } else if (op < 9) { /* a block's contents change */
            const uint32_t x = pt_below(&rng, BLOCKS);
            tag_now[x]++;
            if (pt_below(&rng, 2)) {
                const uint32_t sl = pkv_res_lookup(&r, x, NULL, NULL);
                if (sl != PKV_RES_NONE && r.slots[sl].pins == 0) {
                    size_t w = 0;
                    for (size_t i = 0; i < n_lru; i++)
                        if (lru[i] != x) lru[w++] = lru[i];
                    n_lru = w;
                }
                pkv_res_invalidate(&r, x);
                RES_OK(&r);
            }
        } else { /* drop the cache */
            pkv_res_drop_unpinned(&r);
            n_lru = 0;
            RES_OK(&r);
        }
        uint32_t got[SLOTS];
        const size_t k = pkv_res_lru_blocks(&r, got, SLOTS);
        cr_assert_eq(k, n_lru, "step %d: LRU has %zu blocks, model %zu", step, k, n_lru);
        for (size_t i = 0; i < k; i++)
            cr_assert_eq(got[i], lru[i], "step %d: LRU position %zu", step, i);
    }
    for (int k = 0; k < INFLIGHT; k++)
        if (live[k]) pkv_res_release(&r, &fl[k]);
    RES_OK(&r);
    pkv_res_counts c;
    pkv_res_counts_get(&r, &c);
    cr_assert_eq(c.pinned, 0);
    cr_assert_eq(c.orphans, 0);
    pkv_res_free(&r);
}

/* ---- Content tags from the engine ---------------------------------------------- */

/* Small K/V values that are a pure function of (salt, token prefix). */
static void write_kv(pkv_cache *c, uint32_t block, uint32_t off, uint64_t h) {
    pkv_cache_info inf = pt_info(c);
    for (uint32_t l = 0; l < inf.num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < inf.num_kv_heads; hd++) {
                float *row = (float *)pkv_kv(c, block, l, (pkv_kind)k, hd) + (size_t)off * inf.head_dim;
                for (uint32_t d = 0; d < inf.head_dim; d++)
                    row[d] = (float)((int)(pt_val(h, l, k, hd, d) % 2001u) - 1000) / 1000.0f;
            }
}

typedef struct tseq {
    uint64_t id, salt;
    uint32_t toks[512];
    size_t len, committed;
} tseq;

/* Append n tokens to s (continuing its token stream) and write their K/V. */
static void tappend(pkv_cache *c, tseq *s, const uint32_t *toks, size_t n) {
    pkv_slot slots[64];
    cr_assert(n <= 64 && s->len + n <= 512);
    memcpy(s->toks + s->len, toks, n * sizeof *toks);
    PT_OK(pkv_seq_append(c, s->id, toks, n, slots));
    uint64_t h = pt_hprefix(s->salt, s->toks, s->len);
    for (size_t i = 0; i < n; i++) {
        h = pt_hstep(h, toks[i]);
        write_kv(c, slots[i].block, slots[i].offset, h);
    }
    s->len += n;
}

static void tcommit(pkv_cache *c, tseq *s) {
    if (s->len > s->committed) PT_OK(pkv_seq_commit(c, s->id, s->len - s->committed));
    s->committed = s->len;
}

static void topen(pkv_cache *c, tseq *s, uint64_t id, uint64_t salt) {
    memset(s, 0, sizeof *s);
    s->id = id;
    s->salt = salt;
    PT_OK(pkv_seq_open(c, id, salt, NULL, 0, NULL));
}

static void collect1(pkv_cache *c, uint64_t id, unsigned flags, pkv_glue_batch *gb) {
    PT_OK(pkv_glue_collect(c, &id, 1, flags, gb));
    cr_assert_eq(gb->n, 1);
}

Test(residency, tags_identify_block_contents) {
    pkv_cache *c = pt_open(4, 32);
    tseq a, b;
    topen(c, &a, 1, 0);
    const uint32_t t[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    tappend(c, &a, t, 10);
    tcommit(c, &a);
    pkv_glue_batch g1;
    collect1(c, 1, 0, &g1);
    const pkv_res_seq *s = &g1.seqs[0];
    cr_assert_eq(s->n_blocks, 3);
    cr_assert_eq(s->len, 10);
    cr_assert_eq(s->need, 10);
    cr_assert_eq(s->stable, 10);
    cr_assert_neq(s->tags[0], s->tags[1]);
    cr_assert_neq(s->tags[1], s->tags[2]);
    /* The same tokens and salt share the sealed blocks and their tags. */
    topen(c, &b, 2, 0);
    tappend(c, &b, t, 9);
    tcommit(c, &b);
    pkv_glue_batch g2;
    collect1(c, 2, 0, &g2);
    cr_assert_eq(g2.seqs[0].blocks[0], s->blocks[0]);
    cr_assert_eq(g2.seqs[0].blocks[1], s->blocks[1]);
    cr_assert_eq(g2.seqs[0].tags[0], s->tags[0]);
    cr_assert_eq(g2.seqs[0].tags[1], s->tags[1]);
    cr_assert_neq(g2.seqs[0].blocks[2], s->blocks[2], "partial blocks are not shared");
    cr_assert_neq(g2.seqs[0].tags[2], s->tags[2], "1 token vs 2 tokens");
    pkv_glue_free(&g2);
    /* Another salt: different tags for the same tokens. */
    tseq d;
    topen(c, &d, 3, 77);
    tappend(c, &d, t, 8);
    tcommit(c, &d);
    collect1(c, 3, 0, &g2);
    cr_assert_neq(g2.seqs[0].tags[0], s->tags[0]);
    pkv_glue_free(&g2);
    pkv_glue_free(&g1);
}

Test(residency, tags_follow_commits_not_pending_tokens) {
    pkv_cache *c = pt_open(4, 32);
    tseq a;
    topen(c, &a, 1, 0);
    const uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tappend(c, &a, t, 5);
    tcommit(c, &a);
    pkv_glue_batch g0, g1, g2, g3;
    collect1(c, 1, 0, &g0);
    tappend(c, &a, t + 5, 1); /* pending */
    collect1(c, 1, 0, &g1);
    cr_assert_eq(g1.seqs[0].len, 6);
    cr_assert_eq(g1.seqs[0].need, 6);
    cr_assert_eq(g1.seqs[0].stable, 5);
    cr_assert_eq(g1.seqs[0].tags[1], g0.seqs[0].tags[1], "pending tokens do not enter the tag");
    collect1(c, 1, PKV_GLUE_GPU_APPEND, &g2);
    cr_assert_eq(g2.seqs[0].need, 5, "GPU append: the pending token is not copied");
    /* As if committed: equals the tag after the commit. */
    collect1(c, 1, PKV_GLUE_AS_COMMITTED, &g3);
    cr_assert_eq(g3.seqs[0].stable, 6);
    cr_assert_neq(g3.seqs[0].tags[1], g1.seqs[0].tags[1]);
    tcommit(c, &a);
    pkv_glue_batch g4;
    collect1(c, 1, 0, &g4);
    cr_assert_eq(g4.seqs[0].tags[1], g3.seqs[0].tags[1]);
    pkv_glue_free(&g4);
    /* A block filled by pending tokens gets, as if committed, the tag it has once
     * sealed. */
    pkv_glue_free(&g3);
    tappend(c, &a, t + 6, 2); /* block 1 full, pending */
    collect1(c, 1, PKV_GLUE_AS_COMMITTED, &g3);
    tcommit(c, &a);
    collect1(c, 1, 0, &g4);
    cr_assert_eq(g4.seqs[0].blocks[1], g3.seqs[0].blocks[1]);
    cr_assert_eq(g4.seqs[0].tags[1], g3.seqs[0].tags[1], "open full == sealed");
    pkv_glue_free(&g0);
    pkv_glue_free(&g1);
    pkv_glue_free(&g2);
    pkv_glue_free(&g3);
    pkv_glue_free(&g4);
}

Test(residency, collect_errors) {
    pkv_cache *c = pt_open(4, 32);
    tseq a;
    topen(c, &a, 1, 0);
    pkv_glue_batch gb;
    uint64_t id = 1;
    cr_assert_eq(pkv_glue_collect(c, &id, 1, 0, &gb), PKV_EINVAL, "empty sequence");
    id = 9;
    cr_assert_eq(pkv_glue_collect(c, &id, 1, 0, &gb), PKV_ENOSEQ);
    cr_assert_eq(gb.seqs, NULL);
    cr_assert_eq(pkv_glue_collect(c, &id, 1, 0x80, &gb), PKV_EINVAL);
}

Test(residency, reused_block_gets_a_new_tag) {
    /* Capacity 2: the blocks of a closed sequence are reused by the next one. */
    pkv_cache *c = pt_open(4, 2);
    tseq a, b;
    topen(c, &a, 1, 0);
    const uint32_t ta[3] = {1, 2, 3}, tb[3] = {9, 9, 9};
    tappend(c, &a, ta, 3);
    tcommit(c, &a);
    pkv_glue_batch g1, g2;
    collect1(c, 1, 0, &g1);
    PT_OK(pkv_seq_close(c, 1));
    topen(c, &b, 2, 0);
    tappend(c, &b, tb, 3);
    tcommit(c, &b);
    collect1(c, 2, 0, &g2);
    /* Whether or not the id is the same, the residency must not take B's block
     * for A's: same id => different tag. */
    if (g2.seqs[0].blocks[0] == g1.seqs[0].blocks[0])
        cr_assert_neq(g2.seqs[0].tags[0], g1.seqs[0].tags[0]);
    pkv_res r;
    cr_assert_eq(pkv_res_init(&r, 4, 2, 4), 0);
    pkv_res_plan p;
    plan_ok(&r, g1.seqs, 1, &p);
    pkv_res_release(&r, &p);
    plan_ok(&r, g2.seqs, 1, &p);
    cr_assert_eq(p.n_copies, 1, "B's block is copied, never served from A's copy");
    pkv_res_release(&r, &p);
    pkv_res_free(&r);
    pkv_glue_free(&g1);
    pkv_glue_free(&g2);
}

/* ---- The whole paging logic against a simulated device pool ------------------- */

typedef struct simdev {
    pkv_cache *c;
    pkv_cache_info inf;
    pkv_kv_view arena;
    pkv_res r;
    uint8_t *pool; /* n_slots * slot_bytes, NaN-filled at start */
    uint32_t n_slots;
} simdev;

static void sim_init(simdev *d, pkv_cache *c, uint32_t n_slots) {
    d->c = c;
    d->inf = pt_info(c);
    PT_OK(pkv_kv_view_of(c, &d->arena));
    cr_assert_eq(pkv_res_init(&d->r, n_slots, (uint32_t)d->inf.capacity, d->inf.block_size), 0);
    d->n_slots = n_slots;
    const size_t n = (size_t)n_slots * d->inf.slot_bytes / sizeof(float);
    float *f = malloc(n * sizeof *f);
    cr_assert_not_null(f);
    for (size_t i = 0; i < n; i++) f[i] = NAN;
    d->pool = (uint8_t *)f;
}

static void sim_free(simdev *d) {
    pkv_res_free(&d->r);
    free(d->pool);
}

/* Page in ids (flags 0: everything comes from the arena), check attention on the
 * pool against attention on the arena, release. Returns the plan's copies or -1
 * when the batch did not fit. */
static int sim_step(simdev *d, const uint64_t *ids, size_t n, pt_rng *rng) {
    pkv_glue_batch gb;
    PT_OK(pkv_glue_collect(d->c, ids, n, 0, &gb));
    pkv_res_plan p;
    int rc = pkv_res_plan_batch(&d->r, gb.seqs, n, &p);
    RES_OK(&d->r);
    if (rc == PKV_EFULL) {
        pkv_glue_free(&gb);
        return -1;
    }
    cr_assert_eq(rc, 0, "plan -> %d (%s)", rc, pkv_last_error());
    for (uint32_t i = 0; i < p.n_copies; i++)
        memcpy(d->pool + (size_t)p.copies[i].slot * d->inf.slot_bytes,
               pkv_kv(d->c, p.copies[i].block, 0, PKV_K, 0), d->inf.block_bytes);
    const uint32_t nq = d->inf.num_kv_heads * 2, D = d->inf.head_dim;
    float *q = malloc(n * nq * D * sizeof *q), *o1 = malloc(n * nq * D * sizeof *o1),
          *o2 = malloc(n * nq * D * sizeof *o2);
    cr_assert(q && o1 && o2);
    for (size_t i = 0; i < n * nq * D; i++) q[i] = (float)((int)pt_below(rng, 2001) - 1000) / 700.0f;
    pkv_attn_seq as[16], ps[16];
    cr_assert(n <= 16);
    for (size_t s = 0; s < n; s++) {
        as[s] = (pkv_attn_seq){gb.seqs[s].blocks, gb.seqs[s].n_blocks, gb.seqs[s].len};
        ps[s] = (pkv_attn_seq){p.tables + s * p.table_stride, p.table_stride, p.lens[s]};
    }
    pkv_kv_view pv = d->arena;
    pv.base = d->pool;
    pv.num_blocks = d->n_slots;
    for (uint32_t layer = 0; layer < d->inf.num_layers; layer++) {
        pkv_attn_params ap = {.layer = layer, .num_q_heads = nq, .scale = 0.5f};
        PT_OK(pkv_attn_decode(&d->arena, &ap, as, n, q, o1));
        PT_OK(pkv_attn_decode(&pv, &ap, ps, n, q, o2));
        for (size_t i = 0; i < n * nq * D; i++)
            cr_assert(o1[i] == o2[i], "layer %u, element %zu: arena %g, device pool %g", layer, i,
                      (double)o1[i], (double)o2[i]);
    }
    const int copies = (int)p.n_copies;
    pkv_res_release(&d->r, &p);
    RES_OK(&d->r);
    free(q);
    free(o1);
    free(o2);
    pkv_glue_free(&gb);
    return copies;
}

Test(residency, simulated_decode_loop_matches_the_arena) {
    pt_rng rng = {.s = pt_env_u64("PKV_SEED", 777)};
    pkv_options o;
    pt_opts(&o, 2, 2, 8, 4, PKV_F32, 64);
    pkv_cache *c = pt_open_sub("cache", &o);
    simdev d;
    sim_init(&d, c, 24);
    enum { NS = 6 };
    tseq s[NS];
    uint64_t next_id = 1;
    const uint32_t common[8] = {100, 101, 102, 103, 104, 105, 106, 107};
    for (int i = 0; i < NS; i++) {
        topen(c, &s[i], next_id++, i % 2);
        tappend(c, &s[i], common, 1 + pt_below(&rng, 8)); /* shared prefixes */
        tcommit(c, &s[i]);
    }
    int copies = 0, refused = 0, hits_seen = 0;
    for (int step = 0; step < 600; step++) {
        const uint32_t op = pt_below(&rng, 10);
        tseq *x = &s[pt_below(&rng, NS)];
        if (op < 5) { /* decode: append 1-3 tokens, maybe commit */
            uint32_t t[3];
            const uint32_t k = 1 + pt_below(&rng, 3);
            if (x->len + k > 40) continue;
            for (uint32_t i = 0; i < k; i++) t[i] = pt_below(&rng, 4);
            pkv_stats st = pt_stats(c);
            if (st.blocks_free + st.blocks_cached < 3) continue;
            tappend(c, x, t, k);
            if (pt_below(&rng, 3)) tcommit(c, x);
        } else if (op < 6) { /* a conversation ends, another starts */
            PT_OK(pkv_seq_close(c, x->id));
            topen(c, x, next_id++, pt_below(&rng, 2));
            uint32_t t[4];
            for (int i = 0; i < 4; i++) t[i] = pt_below(&rng, 4);
            tappend(c, x, pt_below(&rng, 2) ? common : t, 1 + pt_below(&rng, 4));
            tcommit(c, x);
        } else { /* page in a batch and check */
            uint64_t ids[NS];
            size_t n = 0;
            for (int i = 0; i < NS; i++)
                if (s[i].len && pt_below(&rng, 2)) ids[n++] = s[i].id;
            if (!n) continue;
            const int r = sim_step(&d, ids, n, &rng);
            if (r < 0) refused++;
            else copies += r;
            hits_seen = (int)d.r.st.hits;
        }
    }
    cr_assert_gt(copies, 0);
    cr_assert_gt(hits_seen, 0, "the pool served repeated blocks without copying");
    (void)refused;
    sim_free(&d);
}

/* ---- Attention launch plan ------------------------------------------------------ */

Test(residency, attention_plan_variants) {
    pkv_attn_plan p;
    cr_assert_eq(pkv_attn_plan_make(128, 1, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.variant, PKV_ATTN_VARIANT_FAST);
    cr_assert_eq(p.ht, 1);
    cr_assert_eq(pkv_attn_plan_make(128, 2, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.ht, 4);
    cr_assert_eq(p.tiles, 1);
    cr_assert_eq(pkv_attn_plan_make(64, 4, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.ht, 4);
    cr_assert_eq(pkv_attn_plan_make(256, 5, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.ht, 8);
    cr_assert_eq(p.tiles, 1);
    cr_assert_eq(pkv_attn_plan_make(128, 16, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.tiles, 2);
    cr_assert_eq(p.grid_y, 16);
    cr_assert_eq(pkv_attn_plan_make(96, 4, 8, 4, 1000, 0, 132, 1, &p), 0);
    cr_assert_eq(p.variant, PKV_ATTN_VARIANT_GENERIC);
    cr_assert_eq(p.ht, 1);
    cr_assert_eq(p.tiles, 4);
    cr_assert_eq(pkv_attn_plan_make(128, 4, 8, 4, 1000, 0, 132, 0, &p), 0);
    cr_assert_eq(p.variant, PKV_ATTN_VARIANT_GENERIC, "unaligned rows");
    cr_assert_eq(pkv_attn_plan_make(1024, 1, 1, 1, 10, 0, 132, 0, &p), 0);
    cr_assert_eq(pkv_attn_plan_make(1025, 1, 1, 1, 10, 0, 132, 0, &p), PKV_ENOTSUP);
    cr_assert_eq(pkv_attn_plan_make(128, 1, 1, 1, 0, 0, 132, 1, &p), PKV_EINVAL);
    cr_assert_eq(pkv_attn_plan_make(128, 1, 70000, 1, 10, 0, 132, 1, &p), PKV_ENOTSUP);
}

Test(residency, attention_plan_splits) {
    pkv_attn_plan p;
    /* Few, long sequences: split until the device is busy, never below 256. */
    for (uint32_t len = 1; len < 300000; len = len * 3 + 7) {
        for (uint64_t ns = 1; ns <= 256; ns *= 4) {
            cr_assert_eq(pkv_attn_plan_make(128, 4, 8, ns, len, 0, 132, 1, &p), 0);
            cr_assert_geq((uint64_t)p.n_splits * p.split_len, len);
            cr_assert_lt((uint64_t)(p.n_splits - 1) * p.split_len, len);
            cr_assert_leq(p.n_splits, (len + PKV_ATTN_MIN_SPLIT - 1) / PKV_ATTN_MIN_SPLIT + 1);
            cr_assert(p.split_len == len || p.split_len % PKV_ATTN_SPLIT_ALIGN == 0);
            cr_assert_eq(p.grid_x, ns * p.n_splits);
            if (p.n_splits > 1) {
                cr_assert_eq(p.ws_bytes, (size_t)(ns * 32 * p.n_splits * (128 + 2) * 4));
                cr_assert_eq(p.ws_acc_floats, (size_t)(ns * 32 * p.n_splits * 128));
            } else {
                cr_assert_eq(p.ws_bytes, 0);
            }
        }
    }
    /* 32k context, batch 16, 660 slots (132 SMs x 5): one full wave, not 1.6. */
    cr_assert_eq(pkv_attn_plan_make(128, 4, 8, 16, 32768, 0, 660, 1, &p), 0);
    cr_assert_leq(p.grid_x * p.grid_y, 660);
    cr_assert_geq(p.grid_x * p.grid_y, 600);
    /* Whatever the batch, the chosen grid keeps the device busy: the last wave
     * is at least 3/4 full, or the batch cannot fill one wave even split as finely
     * as allowed. */
    for (uint32_t len = 1; len < 300000; len = len * 2 + 77)
        for (uint64_t ns = 1; ns <= 512; ns *= 2) {
            cr_assert_eq(pkv_attn_plan_make(128, 4, 8, ns, len, 0, 660, 1, &p), 0);
            const uint64_t ctas = p.grid_x * p.grid_y, waves = (ctas + 659) / 660;
            const uint64_t finest = ns * 8 * ((len + PKV_ATTN_MIN_SPLIT - 1) / PKV_ATTN_MIN_SPLIT);
            cr_assert(ctas * 4 >= waves * 660 * 3 || finest < 660,
                      "len %u x %llu sequences: %llu blocks in %llu waves", len,
                      (unsigned long long)ns, (unsigned long long)ctas, (unsigned long long)waves);
        }
    /* One long sequence: split until the device is busy. */
    cr_assert_eq(pkv_attn_plan_make(128, 4, 8, 1, 131072, 0, 660, 1, &p), 0);
    cr_assert_geq(p.grid_x * p.grid_y, 600);
    cr_assert_leq(p.grid_x * p.grid_y, 660);
    /* Forced split length. */
    cr_assert_eq(pkv_attn_plan_make(128, 4, 8, 3, 1000, 100, 132, 1, &p), 0);
    cr_assert_eq(p.split_len, 100);
    cr_assert_eq(p.n_splits, 10);
}

/* ---- The API without a device ----------------------------------------------------- */

Test(residency, cuda_api_without_a_device_says_why) {
    char why[256] = "";
    const int rc = pkv_cuda_probe(0, why, sizeof why);
    if (rc == 0) {
        cr_log_info("a CUDA device is present: nothing to check here");
        return;
    }
    cr_assert_eq(rc, PKV_ENOTSUP);
    cr_assert_neq(why[0], '\0', "the reason is given");
    pkv_cache *c = pt_open(4, 8);
    pkv_cuda *g = (pkv_cuda *)1;
    cr_assert_eq(pkv_cuda_open(c, NULL, &g), PKV_ENOTSUP);
    cr_assert_eq(g, NULL);
    cr_assert_neq(pkv_last_error()[0], '\0');
    pkv_cuda_close(NULL);
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_STAGING), "staging");
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_REGISTERED_RO), "registered-ro");
    cr_assert_str_eq(pkv_cuda_mode_name((pkv_cuda_mode)42), "?");
}

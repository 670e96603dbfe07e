/* pkv_seq_truncate: cuts inside shared partial blocks, inside sealed blocks, at block
 * boundaries, to 0, through pending tokens, and beyond the length. */
#include "pkv_test.h"

#include <string.h>

TestSuite(truncate, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

static void fill(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

static bool in_table(const uint32_t *tab, size_t n, uint32_t b)
{
    for (size_t i = 0; i < n; i++)
        if (tab[i] == b)
            return true;
    return false;
}

static void build(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *t, size_t n)
{
    PT_SEQ_OPEN(c, id, salt, NULL, 0);
    PT_APPEND(c, id, salt, t, 0, n);
    PT_OK(pkv_seq_commit(c, id, n));
    PT_CHECK(c);
    PT_VERIFY(c, id, salt, t, n, n);
}

Test(truncate, inside_shared_partial_block)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[8], b[8];
    fill(a, 8, 10);
    memcpy(b, a, sizeof b);
    fill(b + 5, 3, 300);
    build(c, 1, 0, a, 7); /* [sealed 4][partial 3] */
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    uint32_t t1[4], t2[4];
    PT_BLOCKS(c, 1, t1, 4);

    pkv_stats before = pt_stats(c);
    PT_OK(pkv_seq_truncate(c, 2, 5));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, before.cow_copies + 1, "cut shared block must be copied");
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 4), 2);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert_neq(t2[1], t1[1]);
    PT_VERIFY(c, 2, 0, a, 5, 5);
    PT_VERIFY(c, 1, 0, a, 7, 7);

    /* The child's block is now private: further appends copy nothing. */
    PT_APPEND(c, 2, 0, b, 5, 3);
    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.cow_copies, before.cow_copies + 1);
    PT_VERIFY(c, 2, 0, b, 8, 8);
    PT_VERIFY(c, 1, 0, a, 7, 7);
    uint32_t t1b[4];
    PT_BLOCKS(c, 1, t1b, 4);
    cr_assert(memcmp(t1, t1b, 2 * sizeof *t1) == 0, "parent's table unchanged");
}

Test(truncate, unshared_partial_block_in_place)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[8];
    fill(a, 8, 10);
    build(c, 1, 0, a, 5);
    PT_APPEND(c, 1, 0, a, 5, 2); /* [sealed 4][1 committed + 2 pending] */
    uint32_t t[4], u[4];
    PT_BLOCKS(c, 1, t, 4);
    /* Cutting pending tokens of a private open block copies nothing. */
    PT_OK(pkv_seq_truncate(c, 1, 6));
    PT_CHECK(c);
    cr_assert_eq(pt_stats(c).cow_copies, 0);
    cr_assert_eq(PT_BLOCKS(c, 1, u, 4), 2);
    cr_assert(memcmp(t, u, 2 * sizeof *t) == 0);
    PT_VERIFY(c, 1, 0, a, 6, 5);
    /* Same length is a no-op. */
    PT_OK(pkv_seq_truncate(c, 1, 6));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 6, 5);
    cr_assert_eq(pt_stats(c).cow_copies, 0);
    /* Cutting committed tokens of a private open block: the header neither requires
     * nor forbids a copy, so only the result is checked. */
    PT_OK(pkv_seq_truncate(c, 1, 5));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 5, 5);
    PT_BLOCKS(c, 1, u, 4);
    cr_assert_eq(u[0], t[0], "the sealed block before the cut is kept");
    PT_APPEND(c, 1, 0, a, 5, 3);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 8, 8);
}

Test(truncate, inside_sealed_block_shared_with_live_sequence)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[14];
    fill(a, 14, 500);
    build(c, 1, 0, a, 14); /* 3 sealed + partial */
    uint32_t t1[4], t2[4];
    PT_BLOCKS(c, 1, t1, 4);
    cr_assert_eq(PT_SEQ_OPEN(c, 2, 0, a, 13), 12);
    pkv_stats before = pt_stats(c);
    PT_OK(pkv_seq_truncate(c, 2, 6));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, before.cow_copies + 1);
    cr_assert_eq(st.blocks_sealed, before.blocks_sealed, "sealed blocks stay indexed");
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 4), 2);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert(!in_table(t1, 4, t2[1]), "the cut sealed block must be copied");
    PT_VERIFY(c, 2, 0, a, 6, 6);
    PT_VERIFY(c, 1, 0, a, 14, 14);

    /* Re-appending the same tokens re-seals identical blocks: dedupe to seq 1's. */
    PT_APPEND(c, 2, 0, a, 6, 6);
    PT_OK(pkv_seq_commit(c, 2, 6));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, before.dedupes + 2);
    PT_BLOCKS(c, 2, t2, 4);
    cr_assert(memcmp(t1, t2, 3 * sizeof *t1) == 0);
    PT_VERIFY(c, 2, 0, a, 12, 12);
    PT_VERIFY(c, 1, 0, a, 14, 14);
}

Test(truncate, inside_sealed_block_cached_and_exclusive)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[13], b[13];
    fill(a, 13, 70);
    memcpy(b, a, sizeof b);
    fill(b + 9, 4, 9000);
    build(c, 1, 0, a, 12); /* 3 sealed blocks, refcount 1 */
    uint32_t t1[4], t[4];
    PT_BLOCKS(c, 1, t1, 4);

    /* Cut inside the exclusive sealed block 2: copied, never changed in place. */
    PT_OK(pkv_seq_truncate(c, 1, 9));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 1);
    cr_assert_eq(st.blocks_sealed, 3);
    cr_assert_eq(st.blocks_cached, 1, "the old sealed block is cached, not freed");
    cr_assert_eq(PT_BLOCKS(c, 1, t, 4), 3);
    cr_assert_eq(t[0], t1[0]);
    cr_assert_eq(t[1], t1[1]);
    cr_assert_neq(t[2], t1[2]);
    PT_VERIFY(c, 1, 0, a, 9, 9);

    /* Diverge after the cut; the original chain still hits in full. */
    PT_APPEND(c, 1, 0, b, 9, 4);
    PT_OK(pkv_seq_commit(c, 1, 4));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, b, 13, 13);
    cr_assert_eq(PT_SEQ_OPEN(c, 2, 0, a, 13), 12);
    PT_VERIFY(c, 2, 0, a, 12, 12);
    PT_BLOCKS(c, 2, t, 4);
    cr_assert(memcmp(t, t1, 3 * sizeof *t) == 0);

    /* Cut inside a sealed block shared with seq 1: seq 2 cuts block 1. */
    PT_OK(pkv_seq_truncate(c, 2, 5));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, a, 5, 5);
    PT_VERIFY(c, 1, 0, b, 13, 13);
    cr_assert_eq(pt_stats(c).cow_copies, 2);
}

Test(truncate, at_block_boundary)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[14];
    fill(a, 14, 1);
    build(c, 1, 0, a, 14);
    uint32_t t1[4], t[4];
    PT_BLOCKS(c, 1, t1, 4);
    pkv_stats before = pt_stats(c);
    PT_OK(pkv_seq_truncate(c, 1, 8));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 0, "boundary cut copies nothing");
    cr_assert_eq(st.blocks_used, 2);
    cr_assert_eq(st.blocks_cached, before.blocks_cached + 1, "dropped sealed block cached");
    cr_assert_eq(st.blocks_free, before.blocks_free + 1, "dropped partial block freed");
    cr_assert_eq(PT_BLOCKS(c, 1, t, 4), 2);
    cr_assert(memcmp(t, t1, 2 * sizeof *t) == 0);
    PT_VERIFY(c, 1, 0, a, 8, 8);
    /* The dropped sealed block is still found by a prompt. */
    cr_assert_eq(PT_SEQ_OPEN(c, 2, 0, a, 14), 12);
    PT_VERIFY(c, 2, 0, a, 12, 12);
    /* Extending seq 1 again with the same tokens dedupes to the cached block. */
    PT_APPEND(c, 1, 0, a, 8, 4);
    PT_OK(pkv_seq_commit(c, 1, 4));
    PT_CHECK(c);
    PT_BLOCKS(c, 1, t, 4);
    cr_assert_eq(t[2], t1[2]);
    cr_assert_eq(pt_stats(c).dedupes, before.dedupes + 1);
}

Test(truncate, to_zero)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[10], b[6];
    fill(a, 10, 1);
    fill(b, 6, 600);
    build(c, 1, 0, a, 10);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_OK(pkv_seq_truncate(c, 2, 0));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, a, 0, 0);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 0);
    cr_assert_eq(st.blocks_used, 3);
    PT_APPEND(c, 2, 0, b, 0, 6);
    PT_OK(pkv_seq_commit(c, 2, 6));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, b, 6, 6);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    PT_OK(pkv_seq_truncate(c, 1, 0));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 0, 0);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, 2);
    cr_assert_eq(st.blocks_used, 2);
    /* Truncating an empty sequence to 0 is fine. */
    PT_OK(pkv_seq_truncate(c, 1, 0));
    PT_CHECK(c);
}

Test(truncate, drops_pending_tokens)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[16];
    fill(a, 16, 1);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 11);
    PT_OK(pkv_seq_commit(c, 1, 5));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 11, 5);
    /* Cut inside the pending tokens: committed unchanged. */
    PT_OK(pkv_seq_truncate(c, 1, 8));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 8, 5);
    PT_ERR(pkv_seq_commit(c, 1, 4), PKV_ESTATE);
    PT_CHECK(c);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 8, 8);
    cr_assert_eq(pt_stats(c).blocks_sealed, 2);
    /* Cut below the committed count with pending tokens present. */
    PT_APPEND(c, 1, 0, a, 8, 6);
    PT_OK(pkv_seq_truncate(c, 1, 3));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 3, 3);
    PT_ERR(pkv_seq_commit(c, 1, 1), PKV_ESTATE);
    PT_CHECK(c);
    /* Refill and commit: both blocks dedupe back to the cached ones. */
    PT_APPEND(c, 1, 0, a, 3, 13);
    PT_OK(pkv_seq_commit(c, 1, 13));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 16, 16);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_sealed, 4);
    /* Block 0 was cut (copied; the original stays cached) and block 1 dropped
     * (cached): re-sealing both finds the cached originals. */
    cr_assert_eq(st.dedupes, 2);
}

Test(truncate, beyond_length_is_an_error)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[8];
    fill(a, 8, 1);
    build(c, 1, 0, a, 6);
    PT_APPEND(c, 1, 0, a, 6, 1);
    const uint64_t id = 1;
    pt_snap s;
    pt_snap_take(&s, c, &id, 1);
    int r = pkv_seq_truncate(c, 1, 8);
    cr_assert(r == PKV_ERANGE,
              "truncate beyond length -> %d (%s), expected PKV_ERANGE", r,
              pkv_strerror(r));
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "truncate beyond length");
    r = pkv_seq_truncate(c, 1, (size_t)-1);
    cr_assert(r == PKV_ERANGE, "truncate to SIZE_MAX -> %d", r);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "truncate to SIZE_MAX");
    PT_ERR(pkv_seq_truncate(c, 77, 0), PKV_ENOSEQ);
    PT_CHECK(c);
    PT_ERR(pkv_seq_truncate(NULL, 1, 0), PKV_EINVAL);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "truncate errors");
    pt_snap_free(&s);
    PT_OK(pkv_seq_truncate(c, 1, 7)); /* exactly the length (pending included) */
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 7, 6);
}

Test(truncate, other_sequences_kv_unchanged_bf16)
{
    pkv_options o;
    pt_opts(&o, 3, 1, 8, BS, PKV_BF16, 64);
    pkv_cache *c = pt_open_sub("bf16", &o);
    uint32_t a[21];
    fill(a, 21, 3);
    build(c, 1, 0, a, 21);
    for (uint64_t k = 2; k <= 6; k++) {
        PT_OK(pkv_seq_fork(c, 1, k));
        PT_CHECK(c);
    }
    /* Cut every child at a different place, then grow each with its own tokens. */
    const size_t cut[5] = {19, 16, 11, 3, 0};
    uint32_t t[5][21];
    for (int k = 0; k < 5; k++) {
        memcpy(t[k], a, sizeof a);
        PT_OK(pkv_seq_truncate(c, 2 + (uint64_t)k, cut[k]));
        PT_CHECK(c);
        PT_VERIFY(c, 2 + (uint64_t)k, 0, a, cut[k], cut[k]);
        fill(t[k] + cut[k], 21 - cut[k], 10000u * (uint32_t)(k + 1));
    }
    for (int k = 0; k < 5; k++) {
        PT_APPEND(c, 2 + (uint64_t)k, 0, t[k], cut[k], 21 - cut[k]);
        PT_OK(pkv_seq_commit(c, 2 + (uint64_t)k, 21 - cut[k]));
        PT_CHECK(c);
    }
    PT_VERIFY(c, 1, 0, a, 21, 21);
    for (int k = 0; k < 5; k++)
        PT_VERIFY(c, 2 + (uint64_t)k, 0, t[k], 21, 21);
    /* cuts at 19, 11 and 3 fall inside blocks (shared partial / sealed): 3 copies. */
    cr_assert_eq(pt_stats(c).cow_copies, 3);
}

/* Fork and copy-on-write. */
#include "pkv_test.h"

#include <string.h>

TestSuite(cow, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

static void fill(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

static pkv_cache *open_dtype(pkv_dtype dt, uint64_t cap)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, dt, cap);
    return pt_open_sub("cache", &o);
}

Test(cow, fork_shares_every_block_including_partial)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t p[6];
    fill(p, 6, 10);
    PT_SEQ_OPEN(c, 1, 5, NULL, 0);
    PT_APPEND(c, 1, 5, p, 0, 6);
    PT_OK(pkv_seq_commit(c, 1, 6));
    PT_CHECK(c);
    pkv_stats before = pt_stats(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_used, before.blocks_used, "fork allocates nothing");
    cr_assert_eq(st.blocks_free, before.blocks_free);
    cr_assert_eq(st.cow_copies, 0);
    cr_assert_eq(st.sequences, 2);
    uint32_t t1[4], t2[4];
    cr_assert_eq(PT_BLOCKS(c, 1, t1, 4), 2);
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 4), 2);
    cr_assert(memcmp(t1, t2, sizeof t1[0] * 2) == 0, "child must share both blocks");
    PT_VERIFY(c, 2, 5, p, 6, 6); /* salt inherited */
    PT_VERIFY(c, 1, 5, p, 6, 6);

    /* Closing the parent leaves the child intact. */
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 5, p, 6, 6);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 2);
    cr_assert_eq(st.sequences, 1);
}

Test(cow, parent_and_child_diverge)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[12], b[12];
    fill(a, 12, 100);
    memcpy(b, a, sizeof b);
    fill(b + 6, 6, 700);

    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 6);
    PT_OK(pkv_seq_commit(c, 1, 6));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    uint32_t t1[4], t2[4];
    PT_BLOCKS(c, 1, t1, 4);
    uint32_t shared_partial = t1[1];

    /* Child appends into the shared partial block: it gets a copy. */
    PT_APPEND(c, 2, 0, b, 6, 3);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 1);
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 4), 3);
    cr_assert_eq(t2[0], t1[0], "full sealed block stays shared");
    cr_assert_neq(t2[1], shared_partial, "child writes into its own copy");
    PT_BLOCKS(c, 1, t1, 4);
    cr_assert_eq(t1[1], shared_partial, "parent keeps the original");
    PT_VERIFY(c, 1, 0, a, 6, 6);
    PT_VERIFY(c, 2, 0, b, 9, 6);

    /* Parent appends: its partial block is now exclusive, no copy. */
    PT_APPEND(c, 1, 0, a, 6, 3);
    st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 1);
    PT_BLOCKS(c, 1, t1, 4);
    cr_assert_eq(t1[1], shared_partial);
    PT_VERIFY(c, 1, 0, a, 9, 6);
    PT_VERIFY(c, 2, 0, b, 9, 6);

    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    PT_APPEND(c, 1, 0, a, 9, 3);
    PT_APPEND(c, 2, 0, b, 9, 3);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 12, 12);
    PT_VERIFY(c, 2, 0, b, 12, 12);
    st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 1);
    cr_assert_eq(st.blocks_sealed, 5);
    cr_assert_eq(st.blocks_used, 5);
}

Test(cow, parent_appends_first)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[8], b[8];
    fill(a, 8, 1);
    memcpy(b, a, sizeof b);
    fill(b + 5, 3, 50);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 5);
    PT_OK(pkv_seq_commit(c, 1, 5));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    uint32_t orig[2], t[2];
    PT_BLOCKS(c, 2, orig, 2);
    PT_APPEND(c, 1, 0, a, 5, 3);
    cr_assert_eq(pt_stats(c).cow_copies, 1);
    PT_BLOCKS(c, 2, t, 2);
    cr_assert(memcmp(t, orig, sizeof t) == 0, "child still holds the original blocks");
    PT_BLOCKS(c, 1, t, 2);
    cr_assert_neq(t[1], orig[1]);
    PT_VERIFY(c, 2, 0, b, 5, 5);
    PT_APPEND(c, 2, 0, b, 5, 3);
    cr_assert_eq(pt_stats(c).cow_copies, 1);
    PT_VERIFY(c, 1, 0, a, 8, 5);
    PT_VERIFY(c, 2, 0, b, 8, 5);
}

Test(cow, fork_at_block_boundary_needs_no_copy)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[12], b[12];
    fill(a, 12, 1);
    memcpy(b, a, sizeof b);
    fill(b + 8, 4, 90);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 8);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_APPEND(c, 2, 0, b, 8, 2);
    PT_APPEND(c, 1, 0, a, 8, 2);
    cr_assert_eq(pt_stats(c).cow_copies, 0);
    PT_VERIFY(c, 1, 0, a, 10, 8);
    PT_VERIFY(c, 2, 0, b, 10, 8);
}

Test(cow, fork_chain_three_way)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t t[3][8];
    for (int i = 0; i < 3; i++) {
        fill(t[i], 8, 1);
        fill(t[i] + 2, 6, 1000 * (uint32_t)(i + 1));
    }
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, t[0], 0, 2);
    PT_OK(pkv_seq_commit(c, 1, 2));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 2, 3)); /* fork of a fork */
    PT_CHECK(c);
    cr_assert_eq(pt_stats(c).blocks_used, 1);
    for (uint64_t id = 1; id <= 3; id++)
        PT_VERIFY(c, id, 0, t[0], 2, 2);
    /* refcount 3 -> copy, 2 -> copy, 1 -> in place */
    PT_APPEND(c, 3, 0, t[2], 2, 3);
    cr_assert_eq(pt_stats(c).cow_copies, 1);
    PT_APPEND(c, 1, 0, t[0], 2, 3);
    cr_assert_eq(pt_stats(c).cow_copies, 2);
    PT_APPEND(c, 2, 0, t[1], 2, 3);
    cr_assert_eq(pt_stats(c).cow_copies, 2);
    for (uint64_t id = 1; id <= 3; id++) {
        PT_VERIFY(c, id, 0, t[id - 1], 5, 2);
        PT_OK(pkv_seq_commit(c, id, 3));
        PT_CHECK(c);
    }
    for (uint64_t id = 1; id <= 3; id++)
        PT_VERIFY(c, id, 0, t[id - 1], 5, 5);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 6);
}

Test(cow, many_children_diverge)
{
    pkv_cache *c = pt_open(BS, 128);
    enum { KIDS = 12, LEN = 23 };
    uint32_t t[KIDS + 1][LEN];
    for (int k = 0; k <= KIDS; k++) {
        fill(t[k], LEN, 7);
        for (int i = 7; i < LEN; i++)
            t[k][i] = (uint32_t)(k * 131 + i * 7) % 5; /* small alphabet, often equal */
    }
    PT_SEQ_OPEN(c, 100, 3, NULL, 0);
    PT_APPEND(c, 100, 3, t[0], 0, 7);
    PT_OK(pkv_seq_commit(c, 100, 7));
    PT_CHECK(c);
    for (int k = 1; k <= KIDS; k++) {
        memcpy(t[k], t[0], 7 * sizeof t[0][0]);
        PT_OK(pkv_seq_fork(c, 100, 100 + (uint64_t)k));
        PT_CHECK(c);
    }
    /* Interleave appends of the children and the parent. */
    for (size_t pos = 7; pos < LEN; pos += 4) {
        size_t n = pos + 4 <= LEN ? 4 : LEN - pos;
        for (int k = 0; k <= KIDS; k++) {
            PT_APPEND(c, 100 + (uint64_t)k, 3, t[k], pos, n);
            if (k % 2 == 0) {
                PT_OK(pkv_seq_commit(c, 100 + (uint64_t)k, n));
                PT_CHECK(c);
            }
        }
    }
    for (int k = 0; k <= KIDS; k++)
        PT_VERIFY(c, 100 + (uint64_t)k, 3, t[k], LEN, k % 2 == 0 ? LEN : 7);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.cow_copies, KIDS, "the shared partial block is copied once per sharer but the last");
}

static void diverge_dtype(pkv_dtype dt, uint32_t elem)
{
    pkv_cache *c = open_dtype(dt, 32);
    pkv_cache_info inf = pt_info(c);
    cr_assert_eq(inf.elem_size, elem);
    uint32_t a[10], b[10];
    fill(a, 10, 5);
    memcpy(b, a, sizeof b);
    fill(b + 3, 7, 555);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 3);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_APPEND(c, 2, 0, b, 3, 7);
    PT_APPEND(c, 1, 0, a, 3, 7);
    cr_assert_eq(pt_stats(c).cow_copies, 1);
    PT_VERIFY(c, 1, 0, a, 10, 3);
    PT_VERIFY(c, 2, 0, b, 10, 3);
}

Test(cow, diverge_f16)
{
    diverge_dtype(PKV_F16, 2);
}

Test(cow, diverge_bf16)
{
    diverge_dtype(PKV_BF16, 2);
}

Test(cow, fork_errors)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[8];
    fill(a, 8, 1);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 5);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_CHECK(c);
    const uint64_t ids[2] = {1, 3};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);

    PT_ERR(pkv_seq_fork(c, 1, 2), PKV_ESTATE); /* 2 pending tokens */
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "fork with pending tokens");
    PT_ERR(pkv_seq_get_info(c, 2, &(pkv_seq_info){0}), PKV_ENOSEQ);

    PT_ERR(pkv_seq_fork(c, 3, 1), PKV_EEXIST);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "fork to an existing id");
    PT_ERR(pkv_seq_fork(c, 3, 3), PKV_EEXIST);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "fork to itself");
    PT_ERR(pkv_seq_fork(c, 42, 43), PKV_ENOSEQ);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "fork of an unknown id");
    PT_ERR(pkv_seq_fork(NULL, 1, 2), PKV_EINVAL);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "fork on NULL cache");
    pt_snap_free(&s);

    /* After committing the pending tokens the fork works. */
    PT_OK(pkv_seq_commit(c, 1, 2));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, a, 5, 5);

    /* Empty sequence forks to an empty sequence. */
    PT_OK(pkv_seq_fork(c, 3, 4));
    PT_CHECK(c);
    PT_VERIFY(c, 4, 0, a, 0, 0);
    PT_APPEND(c, 4, 0, a, 0, 2);
    PT_VERIFY(c, 4, 0, a, 2, 0);
    PT_VERIFY(c, 3, 0, a, 0, 0);
}

Test(cow, fork_of_hit_sequence_and_close_order)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t a[11];
    fill(a, 11, 40);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 11);
    PT_OK(pkv_seq_commit(c, 1, 11));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    size_t nc = PT_SEQ_OPEN(c, 2, 0, a, 11);
    cr_assert_eq(nc, 8);
    PT_OK(pkv_seq_fork(c, 2, 3));
    PT_CHECK(c);
    PT_VERIFY(c, 3, 0, a, 8, 8);
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 2);
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert_eq(st.blocks_cached, 2);
}

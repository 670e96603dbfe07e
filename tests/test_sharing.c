/* Prefix sharing: common full blocks are shared, nothing else; salts separate trust
 * domains; the n-1 cap; hit/miss statistics; dedupe on commit. */
#include "pkv_test.h"

#include <string.h>

TestSuite(sharing, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

static void seq_tokens(uint32_t *t, size_t n, uint32_t base)
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

/* Open, append everything after the hit, commit, verify. Returns n_cached. */
static size_t open_fill(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t nc = PT_SEQ_OPEN(c, id, salt, p, n);
    PT_VERIFY(c, id, salt, p, nc, nc);
    if (n > nc) {
        PT_APPEND(c, id, salt, p, nc, n - nc);
        PT_VERIFY(c, id, salt, p, n, nc);
        PT_OK(pkv_seq_commit(c, id, n - nc));
        PT_CHECK(c);
    }
    PT_VERIFY(c, id, salt, p, n, n);
    return nc;
}

Test(sharing, common_prefix_shares_exactly_the_common_full_blocks)
{
    pkv_cache *c = pt_open(BS, 64);
    PT_CHECK(c);
    uint32_t p1[14], p2[14];
    seq_tokens(p1, 14, 100);
    memcpy(p2, p1, 9 * sizeof *p1); /* common: 9 tokens = 2 full blocks + 1 */
    seq_tokens(p2 + 9, 5, 900);

    cr_assert_eq(open_fill(c, 1, 0, p1, 14), 0);
    uint32_t t1[8], t2[8];
    cr_assert_eq(PT_BLOCKS(c, 1, t1, 8), 4);

    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 4);
    cr_assert_eq(st.blocks_sealed, 3);
    cr_assert_eq(st.seals, 3);

    /* The second prompt hits exactly the 2 common full blocks. */
    size_t nc = PT_SEQ_OPEN(c, 2, 0, p2, 14);
    cr_assert_eq(nc, 8, "n_cached %zu, expected 8", nc);
    PT_VERIFY(c, 2, 0, p2, 8, 8);
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 8), 2);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert_eq(t2[1], t1[1]);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 4, "hit blocks are shared, not copied");

    PT_APPEND(c, 2, 0, p2, 8, 6);
    PT_OK(pkv_seq_commit(c, 2, 6));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, p2, 14, 14);
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 8), 4);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert_eq(t2[1], t1[1]);
    cr_assert(!in_table(t1, 4, t2[2]), "divergent block shared");
    cr_assert(!in_table(t1, 4, t2[3]), "divergent partial block shared");
    PT_VERIFY(c, 1, 0, p1, 14, 14); /* seq 1 unaffected */
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 6);
    cr_assert_eq(st.blocks_sealed, 4);

    /* Close seq 1: its third sealed block becomes cached, its partial one free. */
    pkv_stats before = pt_stats(c);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 4);
    cr_assert_eq(st.blocks_cached, before.blocks_cached + 1);
    cr_assert_eq(st.blocks_free, before.blocks_free + 1);
    cr_assert_eq(st.blocks_sealed, 4);
    PT_VERIFY(c, 2, 0, p2, 14, 14);

    /* The full first prompt (plus one token) now hits all 3 blocks of seq 1. */
    uint32_t p3[13];
    memcpy(p3, p1, 12 * sizeof *p1);
    p3[12] = 7;
    nc = PT_SEQ_OPEN(c, 3, 0, p3, 13);
    cr_assert_eq(nc, 12);
    PT_VERIFY(c, 3, 0, p3, 12, 12);
    uint32_t t3[8];
    cr_assert_eq(PT_BLOCKS(c, 3, t3, 8), 3);
    cr_assert(memcmp(t3, t1, 3 * sizeof *t3) == 0, "cached blocks keep their identity");
    st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, before.blocks_cached);
    cr_assert_eq(st.blocks_used, 5);
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert_eq(st.blocks_cached, 4);
    cr_assert_eq(st.sequences, 0);
}

Test(sharing, same_tokens_after_different_prefix_share_nothing)
{
    pkv_cache *c = pt_open(BS, 64);
    uint32_t p1[13], p2[13];
    seq_tokens(p1, 13, 10);
    memcpy(p2, p1, sizeof p1);
    p2[0] = 9999; /* only the very first token differs */
    cr_assert_eq(open_fill(c, 1, 0, p1, 13), 0);
    cr_assert_eq(open_fill(c, 2, 0, p2, 13), 0, "no block of p2 has p1's parent chain");
    uint32_t t1[8], t2[8];
    cr_assert_eq(PT_BLOCKS(c, 1, t1, 8), 4);
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 8), 4);
    for (size_t i = 0; i < 4; i++)
        cr_assert(!in_table(t1, 4, t2[i]), "block %u shared across different prefixes", t2[i]);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.dedupes, 0);
    cr_assert_eq(st.blocks_sealed, 6);

    /* A block-aligned suffix of p1 as its own prompt shares nothing either. */
    uint32_t p3[9];
    memcpy(p3, p1 + 4, 9 * sizeof *p3);
    cr_assert_eq(open_fill(c, 3, 0, p3, 9), 0);
    uint32_t t3[8];
    cr_assert_eq(PT_BLOCKS(c, 3, t3, 8), 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert(!in_table(t1, 4, t3[i]));
        cr_assert(!in_table(t2, 4, t3[i]));
    }
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 0);

    /* Each prompt still hits its own chain. */
    for (uint64_t id = 1; id <= 3; id++) {
        PT_OK(pkv_seq_close(c, id));
        PT_CHECK(c);
    }
    size_t nc = PT_SEQ_OPEN(c, 11, 0, p1, 13);
    cr_assert_eq(nc, 12);
    PT_VERIFY(c, 11, 0, p1, 12, 12);
    uint32_t t[8];
    PT_BLOCKS(c, 11, t, 8);
    cr_assert(memcmp(t, t1, 3 * sizeof *t) == 0);
    nc = PT_SEQ_OPEN(c, 12, 0, p2, 13);
    cr_assert_eq(nc, 12);
    PT_VERIFY(c, 12, 0, p2, 12, 12);
    PT_BLOCKS(c, 12, t, 8);
    cr_assert(memcmp(t, t2, 3 * sizeof *t) == 0);
    nc = PT_SEQ_OPEN(c, 13, 0, p3, 9);
    cr_assert_eq(nc, 8);
    PT_VERIFY(c, 13, 0, p3, 8, 8);
    PT_BLOCKS(c, 13, t, 8);
    cr_assert(memcmp(t, t3, 2 * sizeof *t) == 0);
}

Test(sharing, different_salts_share_nothing)
{
    pkv_cache *c = pt_open(BS, 64);
    uint32_t p[13];
    seq_tokens(p, 13, 40);
    cr_assert_eq(open_fill(c, 1, 0, p, 13), 0);
    cr_assert_eq(open_fill(c, 2, 7, p, 13), 0, "salt 7 must not hit salt 0 blocks");
    cr_assert_eq(open_fill(c, 3, 8, p, 13), 0, "salt 8 must not hit salt 0/7 blocks");
    uint32_t t[3][8];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(PT_BLOCKS(c, (uint64_t)i + 1, t[i], 8), 4);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            if (i != j)
                for (int k = 0; k < 4; k++)
                    cr_assert(!in_table(t[j], 4, t[i][k]), "salts %d/%d share block %u", i, j,
                              t[i][k]);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.dedupes, 0, "identical tokens under another salt are not duplicates");
    cr_assert_eq(st.blocks_sealed, 9);
    cr_assert_eq(st.hit_tokens, 0);

    /* Same-salt empty sequence committing the same tokens dedupes only within its salt. */
    PT_SEQ_OPEN(c, 4, 7, NULL, 0);
    PT_APPEND(c, 4, 7, p, 0, 8);
    PT_OK(pkv_seq_commit(c, 4, 8));
    PT_CHECK(c);
    uint32_t t4[4];
    cr_assert_eq(PT_BLOCKS(c, 4, t4, 4), 2);
    cr_assert_eq(t4[0], t[1][0]);
    cr_assert_eq(t4[1], t[1][1]);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 2);
    PT_VERIFY(c, 4, 7, p, 8, 8);

    /* Hits go to the salt's own blocks, and their K/V is that salt's K/V. */
    for (uint64_t id = 1; id <= 4; id++) {
        PT_OK(pkv_seq_close(c, id));
        PT_CHECK(c);
    }
    const uint64_t salts[3] = {0, 7, 8};
    for (int i = 0; i < 3; i++) {
        uint64_t id = 20 + (uint64_t)i;
        size_t nc = PT_SEQ_OPEN(c, id, salts[i], p, 13);
        cr_assert_eq(nc, 12);
        PT_VERIFY(c, id, salts[i], p, 12, 12);
        uint32_t tt[4];
        PT_BLOCKS(c, id, tt, 4);
        cr_assert(memcmp(tt, t[i], 3 * sizeof *tt) == 0, "salt %llu hit foreign blocks",
                  (unsigned long long)salts[i]);
    }
    size_t nc = PT_SEQ_OPEN(c, 30, 9, p, 13);
    cr_assert_eq(nc, 0, "unseen salt hits nothing");
}

Test(sharing, hit_is_capped_at_n_minus_1)
{
    pkv_cache *c = pt_open(BS, 64);
    uint32_t p[13];
    seq_tokens(p, 13, 1000);
    cr_assert_eq(open_fill(c, 1, 0, p, 12), 0);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);

    static const struct {
        size_t n, want;
    } cases[] = {
        {0, 0}, {1, 0}, {2, 0}, {4, 0}, {5, 4}, {7, 4}, {8, 4}, {9, 8}, {12, 8}, {13, 12},
    };
    uint64_t id = 100;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, id++) {
        const uint32_t *prompt = cases[i].n ? p : NULL;
        pkv_stats before = pt_stats(c);
        size_t nc = PT_SEQ_OPEN(c, id, 0, prompt, cases[i].n);
        cr_assert_eq(nc, cases[i].want, "prompt of %zu tokens: n_cached %zu, expected %zu",
                     cases[i].n, nc, cases[i].want);
        PT_VERIFY(c, id, 0, p, nc, nc);
        pkv_stats st = pt_stats(c);
        cr_assert_eq(st.hit_tokens - before.hit_tokens, nc);
        cr_assert_eq(st.miss_tokens - before.miss_tokens, cases[i].n - nc);
        cr_assert_eq(st.hit_blocks - before.hit_blocks, nc / BS);
        /* miss_blocks counts the full blocks within the cap that were not found
         * (docs/api.md), so the capped-off block of a 12-token prompt is no miss. */
        size_t capb = pt_hit_cap(cases[i].n, BS) / BS;
        cr_assert_eq(st.miss_blocks - before.miss_blocks, capb - nc / BS,
                     "prompt of %zu tokens: miss_blocks +%llu, expected +%zu", cases[i].n,
                     (unsigned long long)(st.miss_blocks - before.miss_blocks), capb - nc / BS);
        /* Compute the rest of the prompt: the hit blocks are not touched. */
        if (cases[i].n > nc) {
            PT_APPEND(c, id, 0, p, nc, cases[i].n - nc);
            PT_OK(pkv_seq_commit(c, id, cases[i].n - nc));
            PT_CHECK(c);
            PT_VERIFY(c, id, 0, p, cases[i].n, cases[i].n);
        }
        PT_OK(pkv_seq_close(c, id));
        PT_CHECK(c);
    }
    /* n_cached may be NULL. */
    PT_OK(pkv_seq_open(c, 500, 0, p, 13, NULL));
    PT_CHECK(c);
    PT_VERIFY(c, 500, 0, p, 12, 12);
}

Test(sharing, hit_and_miss_stats)
{
    pkv_cache *c = pt_open(BS, 64);
    pkv_stats z = pt_stats(c);
    cr_assert_eq(z.hit_tokens, 0);
    cr_assert_eq(z.miss_tokens, 0);
    cr_assert_eq(z.hit_blocks, 0);
    cr_assert_eq(z.miss_blocks, 0);
    cr_assert_eq(z.seals, 0);
    cr_assert_eq(z.capacity, 64);
    cr_assert_eq(z.blocks_free, 64);

    uint32_t p[14], q[14];
    seq_tokens(p, 14, 5);
    memcpy(q, p, sizeof q);
    q[6] = 77777; /* q shares 1 full block with p */

    /* Cold prompt of 14 tokens: 3 full blocks, all missed. */
    cr_assert_eq(open_fill(c, 1, 0, p, 14), 0);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.hit_tokens, 0);
    cr_assert_eq(st.miss_tokens, 14);
    cr_assert_eq(st.hit_blocks, 0);
    cr_assert_eq(st.miss_blocks, 3);
    cr_assert_eq(st.seals, 3);

    /* Warm: 3 of 3 full blocks hit. */
    size_t nc = PT_SEQ_OPEN(c, 2, 0, p, 14);
    cr_assert_eq(nc, 12);
    st = pt_stats(c);
    cr_assert_eq(st.hit_tokens, 12);
    cr_assert_eq(st.miss_tokens, 16);
    cr_assert_eq(st.hit_blocks, 3);
    cr_assert_eq(st.miss_blocks, 3);

    /* Partial: 1 of 3 full blocks. */
    nc = PT_SEQ_OPEN(c, 3, 0, q, 14);
    cr_assert_eq(nc, 4);
    st = pt_stats(c);
    cr_assert_eq(st.hit_tokens, 16);
    cr_assert_eq(st.miss_tokens, 26);
    cr_assert_eq(st.hit_blocks, 4);
    cr_assert_eq(st.miss_blocks, 5);

    /* Short prompt without full blocks. */
    nc = PT_SEQ_OPEN(c, 4, 0, p, 3);
    cr_assert_eq(nc, 0);
    st = pt_stats(c);
    cr_assert_eq(st.hit_tokens, 16);
    cr_assert_eq(st.miss_tokens, 29);
    cr_assert_eq(st.hit_blocks, 4);
    cr_assert_eq(st.miss_blocks, 5);
    cr_assert_eq(st.sequences, 4);
    cr_assert_eq(st.seals, 3);
}

Test(sharing, dedupe_on_commit)
{
    pkv_cache *c = pt_open(BS, 64);
    uint32_t p[10];
    seq_tokens(p, 10, 300);

    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, p, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 10));
    PT_CHECK(c);
    uint32_t t1[4];
    cr_assert_eq(PT_BLOCKS(c, 1, t1, 4), 3);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.dedupes, 0);
    cr_assert_eq(st.seals, 2);
    cr_assert_eq(st.blocks_used, 3);

    /* Seq 2 computes the same tokens itself (short prompt -> no hit). */
    size_t nc = PT_SEQ_OPEN(c, 2, 0, p, 4);
    cr_assert_eq(nc, 0);
    PT_APPEND(c, 2, 0, p, 0, 10);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 6);
    uint32_t t2[4];
    cr_assert_eq(PT_BLOCKS(c, 2, t2, 4), 3);
    for (int i = 0; i < 3; i++)
        cr_assert(!in_table(t1, 3, t2[i]), "pending blocks must be private");

    /* Commit one block at a time: each sealed block is replaced by seq 1's. */
    PT_OK(pkv_seq_commit(c, 2, 4));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 1);
    cr_assert_eq(st.blocks_used, 5, "the duplicate block is freed");
    cr_assert_eq(st.blocks_sealed, 2);
    PT_BLOCKS(c, 2, t2, 4);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert(!in_table(t1, 3, t2[1]));
    PT_VERIFY(c, 2, 0, p, 10, 4);

    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 1, "block 1 not full yet");
    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 2);
    cr_assert_eq(st.blocks_used, 4);
    cr_assert_eq(st.blocks_sealed, 2);
    PT_BLOCKS(c, 2, t2, 4);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert_eq(t2[1], t1[1]);
    cr_assert_neq(t2[2], t1[2], "partial blocks are never deduped");
    PT_VERIFY(c, 2, 0, p, 10, 10);
    PT_VERIFY(c, 1, 0, p, 10, 10);

    /* Dedupe against a cached (refcount 0) block. */
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, 2);
    cr_assert_eq(st.blocks_used, 0);
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    PT_APPEND(c, 3, 0, p, 0, 8);
    PT_OK(pkv_seq_commit(c, 3, 8));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.dedupes, 4);
    cr_assert_eq(st.blocks_cached, 0);
    cr_assert_eq(st.blocks_used, 2);
    cr_assert_eq(st.blocks_sealed, 2);
    uint32_t t3[4];
    cr_assert_eq(PT_BLOCKS(c, 3, t3, 4), 2);
    cr_assert_eq(t3[0], t1[0]);
    cr_assert_eq(t3[1], t1[1]);
    PT_VERIFY(c, 3, 0, p, 8, 8);
    cr_assert_eq(st.blocks_free + st.blocks_cached + st.blocks_used, st.capacity);
}

Test(sharing, hit_holds_reference_independent_of_owner)
{
    pkv_cache *c = pt_open(BS, 32);
    uint32_t p[9];
    seq_tokens(p, 9, 60);
    open_fill(c, 1, 0, p, 9);
    size_t nc = PT_SEQ_OPEN(c, 2, 0, p, 9);
    cr_assert_eq(nc, 8);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_used, 2, "seq 2 still references the 2 hit blocks");
    cr_assert_eq(st.blocks_cached, 0);
    PT_VERIFY(c, 2, 0, p, 8, 8);
    /* Continue seq 2 past the hit; the chain it builds extends the hit chain. */
    uint32_t q[14];
    memcpy(q, p, 8 * sizeof *q);
    seq_tokens(q + 8, 6, 5000);
    PT_APPEND(c, 2, 0, q, 8, 6);
    PT_OK(pkv_seq_commit(c, 2, 6));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    nc = PT_SEQ_OPEN(c, 3, 0, q, 14);
    cr_assert_eq(nc, 12);
    PT_VERIFY(c, 3, 0, q, 12, 12);
}

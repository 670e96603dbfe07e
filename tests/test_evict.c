/* Eviction: leaf-first LRU order, parents outlive their cached children, and
 * exhaustion (PKV_EFULL leaves the cache unchanged). */
#include "pkv_test.h"

#include <stdio.h>
#include <string.h>

TestSuite(evict, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

/* ---- A tiny model of the prefix tree and of leaf-first LRU ------------------ */

enum { R, A1, A2, B1, S, C1, C2, NNODES };
static const int parent_of[NNODES] = {-1, R, A1, R, -1, S, C1};
static const char *const node_name[NNODES] = {"R", "A1", "A2", "B1", "S", "C1", "C2"};
/* Paths (root first). */
static const int path_p1[] = {R, A1, A2};
static const int path_p2[] = {R, B1};
static const int path_p3[] = {S, C1, C2};

typedef struct {
    const int *nodes;
    size_t len;
} path_t;
static const path_t paths[3] = {{path_p1, 3}, {path_p2, 2}, {path_p3, 3}};

typedef struct {
    pkv_cache *c;
    uint64_t clock;
    uint64_t stamp[NNODES];
    bool cached[NNODES]; /* sealed and alive (refcount 0 between operations) */
    uint64_t next_id;
} world;

static void path_tokens(const path_t *p, size_t nblocks, uint32_t *out)
{
    for (size_t b = 0; b < nblocks; b++)
        for (uint32_t i = 0; i < BS; i++)
            out[b * BS + i] = 100u * (uint32_t)(p->nodes[b] + 1) + i;
}

/* Release nodes tail-first, as pkv_seq_close does. */
static void release(world *w, const path_t *p, size_t nblocks)
{
    for (size_t b = nblocks; b-- > 0;)
        w->stamp[p->nodes[b]] = ++w->clock;
}

/* Commit the first nblocks blocks of path p in a fresh sequence, then close it. */
static void commit_path(world *w, const path_t *p, size_t nblocks)
{
    uint32_t t[16];
    path_tokens(p, nblocks, t);
    uint64_t id = w->next_id++;
    size_t n = nblocks * BS;
    size_t nc = PT_SEQ_OPEN(w->c, id, 0, t, n);
    size_t want = 0;
    while (want + 1 < nblocks && w->cached[p->nodes[want]])
        want++;
    cr_assert_eq(nc, want * BS);
    PT_APPEND(w->c, id, 0, t, nc, n - nc);
    PT_OK(pkv_seq_commit(w->c, id, n - nc));
    PT_CHECK(w->c);
    PT_VERIFY(w->c, id, 0, t, n, n);
    PT_OK(pkv_seq_close(w->c, id));
    PT_CHECK(w->c);
    for (size_t b = 0; b < nblocks; b++)
        w->cached[p->nodes[b]] = true;
    release(w, p, nblocks);
}

/* Open the first nblocks of p plus one token: returns the hit in blocks; closes it. */
static size_t probe(world *w, const path_t *p, size_t nblocks)
{
    uint32_t t[17];
    path_tokens(p, nblocks, t);
    t[nblocks * BS] = 7;
    uint64_t id = w->next_id++;
    size_t nc = PT_SEQ_OPEN(w->c, id, 0, t, nblocks * BS + 1);
    cr_assert_eq(nc % BS, 0);
    PT_VERIFY(w->c, id, 0, t, nc, nc);
    PT_OK(pkv_seq_close(w->c, id));
    PT_CHECK(w->c);
    release(w, p, nc / BS);
    return nc / BS;
}

/* Leaf-first LRU victim among the model's cached nodes. */
static int model_victim(const world *w)
{
    int best = -1;
    for (int i = 0; i < NNODES; i++) {
        if (!w->cached[i])
            continue;
        bool has_child = false;
        for (int j = 0; j < NNODES; j++)
            if (w->cached[j] && parent_of[j] == i)
                has_child = true;
        if (has_child)
            continue;
        if (best < 0 || w->stamp[i] < w->stamp[best])
            best = i;
    }
    return best;
}

typedef void (*scenario_fn)(world *w);

static void scenario1(world *w)
{
    commit_path(w, &paths[0], 3);
    commit_path(w, &paths[1], 2);
    commit_path(w, &paths[2], 3);
    cr_assert_eq(probe(w, &paths[1], 2), 2);
}

static void scenario2(world *w)
{
    scenario1(w);
    cr_assert_eq(probe(w, &paths[0], 3), 3);
}

static void scenario3(world *w)
{
    commit_path(w, &paths[2], 3);
    commit_path(w, &paths[0], 3);
    commit_path(w, &paths[1], 2);
    cr_assert_eq(probe(w, &paths[2], 2), 2); /* refresh S, C1 but not the leaf C2 */
    cr_assert_eq(probe(w, &paths[0], 1), 1); /* refresh R only */
}

static void run_scenario(int sn, scenario_fn fn, const char *expect_order)
{
    const uint64_t cap = 10;
    for (int e = 0; e <= NNODES; e++) {
        snprintf(pt_ctx, sizeof pt_ctx, "[scenario %d, %d evictions] ", sn, e);
        char sub[32];
        snprintf(sub, sizeof sub, "s%d_e%d", sn, e);
        pkv_options o;
        pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, cap);
        world w;
        memset(&w, 0, sizeof w);
        w.c = pt_open_sub(sub, &o);
        w.next_id = 1;
        fn(&w);
        pkv_stats st = pt_stats(w.c);
        cr_assert_eq(st.blocks_cached, NNODES);
        cr_assert_eq(st.blocks_used, 0);
        cr_assert_eq(st.evictions, 0);

        /* The model's full eviction order must be the documented one. */
        if (e == 0) {
            world m = w;
            char order[64] = "";
            for (int v; (v = model_victim(&m)) >= 0;) {
                m.cached[v] = false;
                strcat(order, node_name[v]);
                strcat(order, " ");
            }
            cr_assert_str_eq(order, expect_order, "model order differs: %s", order);
        }

        /* Fill the free blocks, then force e evictions, one block at a time. */
        uint32_t filler[64];
        for (uint32_t i = 0; i < 64; i++)
            filler[i] = 50000 + i;
        const uint64_t fid = 999;
        PT_SEQ_OPEN(w.c, fid, 0, NULL, 0);
        size_t flen = 0;
        uint64_t free0 = st.blocks_free;
        for (uint64_t k = 0; k < free0 + (uint64_t)e; k++) {
            PT_APPEND(w.c, fid, 0, filler, flen, BS);
            flen += BS;
            st = pt_stats(w.c);
            uint64_t want_ev = k + 1 > free0 ? k + 1 - free0 : 0;
            cr_assert_eq(st.evictions, want_ev, "%sevictions %llu, expected %llu", pt_ctx,
                         (unsigned long long)st.evictions, (unsigned long long)want_ev);
            if (k + 1 > free0) {
                int v = model_victim(&w);
                cr_assert(v >= 0);
                w.cached[v] = false;
            }
            cr_assert_eq(st.blocks_cached, (uint64_t)(NNODES - (int)want_ev));
        }
        PT_VERIFY(w.c, fid, 0, filler, flen, 0);

        /* Observe which prefixes still hit; no probe allocates. The survivors
         * reachable through prompts must be all the cached blocks (no orphans). */
        size_t reachable = 0;
        bool seen[NNODES] = {false};
        for (int pi = 0; pi < 3; pi++) {
            const path_t *p = &paths[pi];
            size_t want = 0;
            while (want < p->len && w.cached[p->nodes[want]])
                want++;
            size_t got = probe(&w, p, p->len);
            cr_assert_eq(got, want, "%spath %d: %zu blocks hit, expected %zu", pt_ctx, pi,
                         got, want);
            for (size_t b = 0; b < got; b++)
                if (!seen[p->nodes[b]])
                    seen[p->nodes[b]] = true, reachable++;
        }
        st = pt_stats(w.c);
        cr_assert_eq(st.blocks_cached, reachable, "%s%llu cached blocks but %zu reachable",
                     pt_ctx, (unsigned long long)st.blocks_cached, reachable);
        cr_assert_eq(st.evictions, (uint64_t)e);
        PT_VERIFY(w.c, fid, 0, filler, flen, 0);
        pt_close(w.c);
    }
    pt_ctx[0] = '\0';
}

Test(evict, leaf_first_lru_order)
{
    run_scenario(1, scenario1, "A2 A1 C2 C1 S B1 R ");
}

Test(evict, lru_refreshed_by_hits)
{
    run_scenario(2, scenario2, "C2 C1 S B1 A2 A1 R ");
}

Test(evict, parent_outlives_cached_children)
{
    run_scenario(3, scenario3, "C2 A2 A1 B1 C1 S R ");
}

/* A wide tree: one root block with many cached children. The root must be the
 * very last block evicted, however old it is relative to the children. */
Test(evict, root_with_many_children)
{
    const uint64_t cap = 24;
    pkv_cache *c = pt_open(BS, cap);
    enum { KIDS = 10 };
    uint32_t t[KIDS][8];
    for (int k = 0; k < KIDS; k++) {
        for (uint32_t i = 0; i < BS; i++)
            t[k][i] = 1 + i;
        for (uint32_t i = 0; i < BS; i++)
            t[k][BS + i] = 1000u * (uint32_t)(k + 1) + i;
        uint64_t id = (uint64_t)k + 1;
        size_t nc = PT_SEQ_OPEN(c, id, 0, t[k], 2 * BS);
        cr_assert_eq(nc, k == 0 ? 0 : BS);
        PT_APPEND(c, id, 0, t[k], nc, 2 * BS - nc);
        PT_OK(pkv_seq_commit(c, id, 2 * BS - nc));
        PT_CHECK(c);
    }
    for (int k = 0; k < KIDS; k++) {
        PT_OK(pkv_seq_close(c, (uint64_t)k + 1));
        PT_CHECK(c);
    }
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, KIDS + 1);
    uint64_t free0 = st.blocks_free;
    uint32_t filler[4 * 24];
    for (uint32_t i = 0; i < 4 * 24; i++)
        filler[i] = 77000 + i;
    PT_SEQ_OPEN(c, 500, 0, NULL, 0);
    size_t flen = 0;
    for (uint64_t k = 0; k < free0 + KIDS; k++) {
        PT_APPEND(c, 500, 0, filler, flen, BS);
        flen += BS;
    }
    st = pt_stats(c);
    cr_assert_eq(st.evictions, KIDS);
    cr_assert_eq(st.blocks_cached, 1);
    /* The survivor is the root: a prompt through it hits one block. */
    uint32_t p[BS + 1] = {1, 2, 3, 4, 9};
    cr_assert_eq(PT_SEQ_OPEN(c, 600, 0, p, BS + 1), BS);
    PT_VERIFY(c, 600, 0, p, BS, BS);
    for (int k = 0; k < KIDS; k++) {
        uint32_t q[2 * BS + 1];
        memcpy(q, t[k], sizeof t[k]);
        q[2 * BS] = 3;
        uint64_t id = 700 + (uint64_t)k;
        cr_assert_eq(PT_SEQ_OPEN(c, id, 0, q, 2 * BS + 1), BS, "child %d must be gone", k);
        PT_OK(pkv_seq_close(c, id));
        PT_CHECK(c);
    }
    PT_VERIFY(c, 500, 0, filler, flen, 0);
}

/* ---- Exhaustion -------------------------------------------------------------- */

static void fill(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

#define EXPECT_FULL(c, expr, snap, what)                                            \
    do {                                                                            \
        PT_ERR(expr, PKV_EFULL);                                                    \
        PT_CHECK(c);                                                                \
        PT_SNAP_SAME(snap, c, what);                                                \
    } while (0)

Test(evict, efull_on_append_when_everything_is_referenced)
{
    pkv_cache *c = pt_open(BS, 8);
    uint32_t a[24], b[12], x[12];
    fill(a, 24, 1);
    fill(b, 12, 200);
    fill(x, 12, 900);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 20);
    PT_OK(pkv_seq_commit(c, 1, 20));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, b, 0, 10);
    PT_OK(pkv_seq_commit(c, 2, 10));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free, 0);
    cr_assert_eq(st.blocks_cached, 0);

    /* Fork needs no block. */
    PT_OK(pkv_seq_fork(c, 2, 4));
    PT_CHECK(c);
    const uint64_t ids[4] = {1, 2, 3, 4};
    pt_snap s;
    pt_snap_take(&s, c, ids, 4);
    pkv_slot slots[12];
    EXPECT_FULL(c, pkv_seq_append(c, 3, x, 1, slots), &s, "append to empty sequence");
    EXPECT_FULL(c, pkv_seq_append(c, 1, x, 1, slots), &s, "append at block boundary");
    EXPECT_FULL(c, pkv_seq_append(c, 2, x, 1, slots), &s, "append into shared partial (cow)");
    EXPECT_FULL(c, pkv_seq_append(c, 4, x, 1, slots), &s, "append into shared partial (cow)");
    EXPECT_FULL(c, pkv_seq_append(c, 4, x, 12, slots), &s, "append of many tokens");
    pt_snap_free(&s);

    /* Prompts that need no new block still open: a hit on referenced blocks, and a
     * miss (the appends will need blocks, not the open). */
    uint32_t q[21];
    memcpy(q, a, 20 * sizeof *q);
    q[20] = 5;
    cr_assert_eq(PT_SEQ_OPEN(c, 5, 0, q, 21), 20);
    PT_VERIFY(c, 5, 0, q, 20, 20);
    cr_assert_eq(PT_SEQ_OPEN(c, 6, 0, x, 9), 0);
    const uint64_t ids2[6] = {1, 2, 3, 4, 5, 6};
    pt_snap_take(&s, c, ids2, 6);
    EXPECT_FULL(c, pkv_seq_append(c, 6, x, 9, slots), &s, "append after a cold open");
    EXPECT_FULL(c, pkv_seq_append(c, 5, x, 1, slots), &s, "append after a warm open");
    pt_snap_free(&s);

    /* Commit needs no block either; closing frees room and appends work again. */
    PT_OK(pkv_seq_close(c, 4));
    PT_CHECK(c);
    PT_APPEND(c, 2, 0, b, 10, 2); /* no longer shared: in place */
    PT_OK(pkv_seq_commit(c, 2, 2));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, b, 12, 12);
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, 3);
    PT_APPEND(c, 6, 0, x, 0, 9);
    st = pt_stats(c);
    cr_assert_eq(st.evictions, 3);
    PT_VERIFY(c, 6, 0, x, 9, 0);
    PT_VERIFY(c, 1, 0, a, 20, 20);
    PT_VERIFY(c, 5, 0, q, 20, 20);
}

Test(evict, efull_when_too_few_blocks_are_evictable)
{
    pkv_cache *c = pt_open(BS, 8);
    uint32_t a[9], f[24], x[12];
    fill(a, 9, 1);
    fill(f, 24, 300);
    fill(x, 12, 900);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 8);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, f, 0, 24); /* 6 blocks, pending */
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free, 0);
    cr_assert_eq(st.blocks_cached, 2);

    const uint64_t ids[2] = {2, 3};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    pkv_slot slots[12];
    /* 3 blocks needed, 2 evictable: all-or-nothing, nothing is evicted. */
    EXPECT_FULL(c, pkv_seq_append(c, 3, x, 12, slots), &s, "append needing 3 of 2 blocks");
    EXPECT_FULL(c, pkv_seq_append(c, 3, x, 9, slots), &s, "append needing 3 of 2 blocks");
    pt_snap_free(&s);
    /* Both cached blocks are still there ... */
    cr_assert_eq(PT_SEQ_OPEN(c, 4, 0, a, 9), 8);
    PT_VERIFY(c, 4, 0, a, 8, 8);
    PT_OK(pkv_seq_close(c, 4));
    PT_CHECK(c);
    /* ... and 2 blocks can be had by evicting them. */
    PT_APPEND(c, 3, 0, x, 0, 8);
    st = pt_stats(c);
    cr_assert_eq(st.evictions, 2);
    cr_assert_eq(st.blocks_cached, 0);
    cr_assert_eq(PT_SEQ_OPEN(c, 5, 0, a, 9), 0);
    PT_VERIFY(c, 3, 0, x, 8, 0);
    PT_VERIFY(c, 2, 0, f, 24, 0);
}

Test(evict, seq_open_attaches_cached_blocks_when_nothing_is_free)
{
    pkv_cache *c = pt_open(BS, 8);
    uint32_t a[9], f[24];
    fill(a, 9, 1);
    fill(f, 24, 300);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 8);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, f, 0, 24);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free, 0);
    cr_assert_eq(st.blocks_cached, 2);
    /* The open takes the cached blocks over instead of evicting anything. */
    cr_assert_eq(PT_SEQ_OPEN(c, 3, 0, a, 9), 8);
    PT_VERIFY(c, 3, 0, a, 8, 8);
    st = pt_stats(c);
    cr_assert_eq(st.evictions, 0);
    cr_assert_eq(st.blocks_cached, 0);
    cr_assert_eq(st.blocks_used, 8);
    /* Now every block is referenced: the rest of the prompt cannot be appended. */
    const uint64_t ids[2] = {2, 3};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    pkv_slot slot;
    EXPECT_FULL(c, pkv_seq_append(c, 3, a + 8, 1, &slot), &s, "append after attaching");
    pt_snap_free(&s);
    /* Truncating the pending tokens of seq 2 at a boundary frees room. */
    PT_OK(pkv_seq_truncate(c, 2, 20));
    PT_CHECK(c);
    PT_APPEND(c, 3, 0, a, 8, 1);
    PT_VERIFY(c, 3, 0, a, 9, 8);
    PT_VERIFY(c, 2, 0, f, 20, 0);
}

Test(evict, efull_on_truncate_copy)
{
    pkv_cache *c = pt_open(BS, 6);
    uint32_t a[12], f[12];
    fill(a, 12, 1);
    fill(f, 12, 400);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 12);
    PT_OK(pkv_seq_commit(c, 1, 12));
    PT_CHECK(c);
    PT_OK(pkv_seq_fork(c, 1, 2));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    PT_APPEND(c, 3, 0, f, 0, 12); /* pending, unshared */
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free, 0);
    cr_assert_eq(st.blocks_cached, 0);

    const uint64_t ids[3] = {1, 2, 3};
    pt_snap s;
    pt_snap_take(&s, c, ids, 3);
    EXPECT_FULL(c, pkv_seq_truncate(c, 2, 10), &s, "cut inside a shared sealed block");
    EXPECT_FULL(c, pkv_seq_truncate(c, 2, 5), &s, "cut inside a shared sealed block");
    EXPECT_FULL(c, pkv_seq_truncate(c, 2, 1), &s, "cut inside a shared sealed block");
    pt_snap_free(&s);

    /* Cuts that need no copy still work: at a boundary, or in a private unsealed block. */
    PT_OK(pkv_seq_truncate(c, 2, 8));
    PT_CHECK(c);
    PT_VERIFY(c, 2, 0, a, 8, 8);
    PT_OK(pkv_seq_truncate(c, 3, 10));
    PT_CHECK(c);
    PT_VERIFY(c, 3, 0, f, 10, 0);
    st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 0);
    cr_assert_eq(st.blocks_free, 0);

    pt_snap_take(&s, c, ids, 3);
    EXPECT_FULL(c, pkv_seq_truncate(c, 2, 6), &s, "cut inside a shared sealed block");
    pt_snap_free(&s);

    /* Free a block (boundary cut of seq 3's pending tokens): now the copy works. */
    PT_OK(pkv_seq_truncate(c, 3, 8));
    PT_CHECK(c);
    PT_OK(pkv_seq_truncate(c, 2, 6));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.cow_copies, 1);
    PT_VERIFY(c, 2, 0, a, 6, 6);
    PT_VERIFY(c, 1, 0, a, 12, 12);
    PT_VERIFY(c, 3, 0, f, 8, 0);
}

Test(evict, evicted_prefix_recomputed_hits_again)
{
    pkv_cache *c = pt_open(BS, 6);
    uint32_t a[13], f[24];
    fill(a, 13, 1);
    fill(f, 24, 800);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 12);
    PT_OK(pkv_seq_commit(c, 1, 12));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    /* 4 filler blocks: 3 free + 1 eviction (the leaf). */
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, f, 0, 16);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.blocks_cached, 2);
    cr_assert_eq(PT_SEQ_OPEN(c, 3, 0, a, 13), 8);
    PT_VERIFY(c, 3, 0, a, 8, 8);
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    /* 2 more: the rest of the chain goes, leaf first. */
    PT_APPEND(c, 2, 0, f, 16, 8);
    st = pt_stats(c);
    cr_assert_eq(st.evictions, 3);
    cr_assert_eq(st.blocks_cached, 0);
    cr_assert_eq(st.blocks_free, 0);
    PT_VERIFY(c, 2, 0, f, 24, 0); /* reused slots hold the filler's K/V */
    PT_OK(pkv_seq_close(c, 2));
    PT_CHECK(c);
    st = pt_stats(c);
    cr_assert_eq(st.blocks_free, 6, "unsealed blocks return to the free list");
    cr_assert_eq(PT_SEQ_OPEN(c, 4, 0, a, 13), 0);
    PT_APPEND(c, 4, 0, a, 0, 13);
    PT_OK(pkv_seq_commit(c, 4, 13));
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 4));
    PT_CHECK(c);
    cr_assert_eq(PT_SEQ_OPEN(c, 5, 0, a, 13), 12);
    PT_VERIFY(c, 5, 0, a, 12, 12);
}

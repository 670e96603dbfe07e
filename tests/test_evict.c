/* Eviction: leaf-first LRU order, parents outlive their cached children, and
 * exhaustion (PKV_EFULL leaves the cache unchanged); leaf-first SLRU's scan
 * resistance, demotion, protection of prefixes and recovery. */
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

/* ---- Leaf-first SLRU (PKV_EVICT_LEAF_SLRU) ------------------------------------ */

static pkv_cache *open_policy(const char *sub, pkv_eviction ev, uint32_t pct, uint64_t cap)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, cap);
    o.eviction = ev;
    o.evict_protect_pct = pct;
    return pt_open_sub(sub, &o);
}

/* Commit tokens t[0..n) (whole blocks) in a fresh sequence `id` and close it. */
static void commit_close(pkv_cache *c, uint64_t id, const uint32_t *t, size_t n)
{
    size_t nc = PT_SEQ_OPEN(c, id, 0, t, n);
    PT_APPEND(c, id, 0, t, nc, n - nc);
    PT_OK(pkv_seq_commit(c, id, n - nc));
    PT_OK(pkv_seq_close(c, id));
    PT_CHECK(c);
}

/* Blocks of t[0..n) a prompt of t plus one token finds cached; closes at once. */
static size_t hit_blocks(pkv_cache *c, uint64_t id, const uint32_t *t, size_t n)
{
    uint32_t q[64];
    cr_assert(n < 64);
    memcpy(q, t, n * sizeof *q);
    q[n] = 99999;
    size_t nc = PT_SEQ_OPEN(c, id, 0, q, n + 1);
    PT_VERIFY(c, id, 0, q, nc, nc);
    PT_OK(pkv_seq_close(c, id));
    PT_CHECK(c);
    return nc / BS;
}

/* A 2-block prefix used twice, then a scan of one-time prompts that overflows
 * the cache: returns how many of the prefix's blocks still hit. */
static size_t scan_survivors(const char *sub, pkv_eviction ev)
{
    const uint64_t cap = 12;
    pkv_cache *c = open_policy(sub, ev, 50, cap);
    uint32_t a[2 * BS], s[BS];
    fill(a, 2 * BS, 1);
    commit_close(c, 1, a, 2 * BS);
    cr_assert_eq(hit_blocks(c, 2, a, 2 * BS), 2); /* the reuse */
    for (uint32_t k = 0; k < cap; k++) {          /* 12 one-block prompts: 2 evictions */
        fill(s, BS, 1000 + 100 * k);
        commit_close(c, 10 + k, s, BS);
    }
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.evictions, 2);
    size_t hit = hit_blocks(c, 100, a, 2 * BS);
    pt_close(c);
    return hit;
}

Test(evict, slru_reused_prefix_survives_a_one_time_scan)
{
    /* Leaf-first LRU evicts the reused prefix (released before the scan) ... */
    cr_assert_eq(scan_survivors("lru", PKV_EVICT_LEAF_LRU), 0);
    /* ... leaf-first SLRU protects it and evicts the scan's oldest blocks. */
    cr_assert_eq(scan_survivors("slru", PKV_EVICT_LEAF_SLRU), 2);
}

/* State for the demotion test: A (3 blocks) and B committed, A reused, then C
 * committed; then e evictions. Returns the blocks of A, B and C that still hit. */
static void demotion_after(pkv_eviction ev, uint64_t e, size_t hits[3])
{
    char sub[32];
    snprintf(sub, sizeof sub, "demote_%d_%llu", (int)ev, (unsigned long long)e);
    pkv_cache *c = open_policy(sub, ev, 10, 10); /* 10% of 10: 1 protected block */
    uint32_t a[3 * BS], b[BS], cc[BS], f[10 * BS];
    fill(a, 3 * BS, 1);
    fill(b, BS, 500);
    fill(cc, BS, 600);
    fill(f, 10 * BS, 7000);
    commit_close(c, 1, a, 3 * BS);
    commit_close(c, 2, b, BS);
    cr_assert_eq(hit_blocks(c, 3, a, 3 * BS), 3); /* A1 A2 A3 reused */
    commit_close(c, 4, cc, BS);
    PT_SEQ_OPEN(c, 5, 0, NULL, 0);
    uint64_t n = pt_stats(c).blocks_free + e;
    PT_APPEND(c, 5, 0, f, 0, n * BS);
    cr_assert_eq(pt_stats(c).evictions, e);
    PT_CHECK(c);
    hits[0] = hit_blocks(c, 6, a, 3 * BS);
    hits[1] = hit_blocks(c, 7, b, BS);
    hits[2] = hit_blocks(c, 8, cc, BS);
    pt_close(c);
}

/* Over the protected quota the oldest protected blocks lose their protection and
 * join the unprotected ones, still leaf first. A reused 3-block chain A1-A2-A3
 * with room for 1 protected block: released A3, A2, A1, so A3 and A2 are demoted
 * behind B, A1 stays protected, and C (never reused) comes after them: victims B,
 * A3, A2, C, A1, never an extension stranded. Leaf-first LRU takes A1 before C. */
Test(evict, slru_demotion_and_eviction_stay_leaf_first)
{
    static const size_t want[6][3] = {
        {3, 1, 1}, {3, 0, 1}, {2, 0, 1}, {1, 0, 1}, {1, 0, 0}, {0, 0, 0}};
    for (uint64_t e = 0; e <= 5; e++) {
        size_t h[3];
        demotion_after(PKV_EVICT_LEAF_SLRU, e, h);
        for (int k = 0; k < 3; k++)
            cr_assert_eq(h[k], want[e][k], "after %llu evictions: %c hits %zu, expected %zu",
                         (unsigned long long)e, "ABC"[k], h[k], want[e][k]);
    }
    size_t h[3];
    demotion_after(PKV_EVICT_LEAF_LRU, 4, h);
    cr_assert(h[0] == 0 && h[2] == 1, "leaf-first LRU: A %zu C %zu", h[0], h[2]);
}

/* A block reused while its parent was held by another sequence (so the parent was
 * never acquired from refcount 0) still protects the parent: released after it,
 * the parent must not stand before its protected child in the victim order
 * (pkv_check's I7), and the two go child first. */
Test(evict, slru_parent_of_reused_block_is_protected_too)
{
    pkv_cache *c = open_policy("prefix", PKV_EVICT_LEAF_SLRU, 50, 8);
    uint32_t a[2 * BS], f[8 * BS];
    fill(a, 2 * BS, 1);
    fill(f, 8 * BS, 4000);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 2 * BS);
    PT_OK(pkv_seq_commit(c, 1, 2 * BS));
    PT_OK(pkv_seq_truncate(c, 1, BS));            /* X keeps R; A1 cached */
    PT_CHECK(c);
    cr_assert_eq(hit_blocks(c, 2, a, 2 * BS), 2); /* A1 reused from ref 0, R not */
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 1));                   /* R released last */
    PT_CHECK(c);
    /* Victims: the 2 cached blocks, A1 first; after one eviction R still hits. */
    PT_SEQ_OPEN(c, 4, 0, NULL, 0);
    PT_APPEND(c, 4, 0, f, 0, (pt_stats(c).blocks_free + 1) * BS);
    cr_assert_eq(pt_stats(c).evictions, 1);
    PT_CHECK(c);
    cr_assert_eq(hit_blocks(c, 5, a, 2 * BS), 1);
}

/* A restart keeps the cached blocks and their leaf-first order, but not the
 * protection (docs/design.md): the recovered blocks are evicted least recently
 * released first, like leaf-first LRU's, and the policy may change at the reopen. */
Test(evict, slru_recovery_rebuilds_leaf_first_without_protection)
{
    pkv_cache *c = open_policy("rec", PKV_EVICT_LEAF_SLRU, 50, 8);
    uint32_t a[2 * BS], b[2 * BS], f[8 * BS];
    fill(a, 2 * BS, 1);
    fill(b, 2 * BS, 300);
    fill(f, 8 * BS, 9000);
    commit_close(c, 1, a, 2 * BS);
    cr_assert_eq(hit_blocks(c, 2, a, 2 * BS), 2); /* A protected */
    commit_close(c, 3, b, 2 * BS);                /* B on probation, released later */
    pt_close(c);
    for (int reopen = 0; reopen < 2; reopen++) {
        pkv_eviction ev = reopen ? PKV_EVICT_LEAF_LRU : PKV_EVICT_LEAF_SLRU;
        c = open_policy("rec", ev, 50, 0);
        PT_CHECK(c);
        pkv_stats st = pt_stats(c);
        cr_assert_eq(st.blocks_cached, 4);
        /* Two evictions take A (released first), leaf first; B still hits whole. */
        PT_SEQ_OPEN(c, 10, 0, NULL, 0);
        PT_APPEND(c, 10, 0, f, 0, (st.blocks_free + 2) * BS);
        cr_assert_eq(pt_stats(c).evictions - st.evictions, 2);
        PT_CHECK(c);
        cr_assert_eq(hit_blocks(c, 11, b, 2 * BS), 2);
        cr_assert_eq(hit_blocks(c, 12, a, 2 * BS), 0);
        PT_OK(pkv_seq_close(c, 10));
        pt_close(c);
        if (!reopen) { /* start the second round from the same state */
            char path[512];
            pt_path(path, sizeof path, "rec");
            pt_rmrf(path);
            c = open_policy("rec", PKV_EVICT_LEAF_SLRU, 50, 8);
            commit_close(c, 1, a, 2 * BS);
            cr_assert_eq(hit_blocks(c, 2, a, 2 * BS), 2);
            commit_close(c, 3, b, 2 * BS);
            pt_close(c);
        }
    }
}

Test(evict, bad_eviction_options_are_einval)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 8);
    char path[512];
    pt_path(path, sizeof path, "bad");
    pkv_cache *c = NULL;
    o.eviction = (pkv_eviction)2;
    PT_ERR(pkv_open(path, &o, &c), PKV_EINVAL);
    cr_assert_null(c);
    o.eviction = PKV_EVICT_LEAF_SLRU;
    o.evict_protect_pct = 101;
    PT_ERR(pkv_open(path, &o, &c), PKV_EINVAL);
    cr_assert_null(c);
}

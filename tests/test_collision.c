/* Hash collisions: linked against pagedkv_h8 (block hashes truncated to 8 bits), so
 * prefix-index lookups constantly meet blocks with equal hashes. A hit must still
 * only ever return blocks whose whole prefix (tokens, parent chain, salt) matches. */
#include "pkv_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(collision, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

/* Exact reference: the set of (salt, full-block prefix) that were committed. With
 * enough capacity nothing is evicted, so a prefix is cached iff it is in the set. */
static size_t ref_hit(const pt_set *sealed, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t cap = pt_hit_cap(n, BS), hit = 0;
    for (size_t k = BS; k <= cap; k += BS) {
        if (!pt_set_has(sealed, pt_prefix_key(salt, p, k)))
            break;
        hit = k;
    }
    return hit;
}

typedef struct {
    uint64_t id, salt;
    uint32_t tok[64];
    size_t n;
} live_seq;

typedef struct {
    uint64_t salt;
    uint32_t tok[64];
    size_t n;
} pool_entry;

/* No Criterion .timeout: a fixed wall-clock deadline (it was 280 s) does not
 * stretch with meson's timeout_multiplier in the sanitizer setups or with the
 * machine's load; meson's timeout (300 s times that multiplier) still bounds it. */
Test(collision, random_prompts_small_alphabet)
{
    uint64_t seed = pt_env_u64("PKV_SEED", 0xC0111510ull);
    size_t rounds = (size_t)pt_env_u64("PKV_COLLISION_PROMPTS", 3000);
    const uint64_t capacity = 8192;
    snprintf(pt_ctx, sizeof pt_ctx, "[seed %llu] ", (unsigned long long)seed);
    pt_rng rng = {seed};

    pkv_cache *c = pt_open(BS, capacity);
    PT_CHECK(c);
    pt_set sealed;
    pt_set_init(&sealed);
    enum { POOL = 512, LIVE = 4 };
    pool_entry *pool = calloc(POOL, sizeof *pool);
    cr_assert_not_null(pool);
    size_t npool = 0;
    live_seq live[LIVE];
    size_t nlive = 0;
    uint64_t next_id = 1;
    uint64_t exp_hit_tokens = 0, exp_miss_tokens = 0, exp_hit_blocks = 0, exp_dedupes = 0;
    size_t total_hits = 0;

    for (size_t it = 0; it < rounds; it++) {
        snprintf(pt_ctx, sizeof pt_ctx, "[seed %llu, prompt %zu] ", (unsigned long long)seed, it);
        /* Build a prompt: mostly an old prompt's prefix plus fresh tokens over a
         * 3-letter alphabet, sometimes under another salt. */
        uint32_t p[64];
        size_t n;
        uint64_t salt = pt_below(&rng, 8) == 0 ? 1 + pt_below(&rng, 2) : 0;
        if (npool && pt_below(&rng, 4) != 0) {
            const pool_entry *src = &pool[pt_below(&rng, (uint32_t)npool)];
            if (pt_below(&rng, 6) != 0)
                salt = src->salt;
            size_t cut = pt_below(&rng, (uint32_t)src->n + 1);
            if (pt_below(&rng, 2))
                cut = (cut / BS) * BS;
            memcpy(p, src->tok, cut * sizeof *p);
            n = cut + pt_below(&rng, 3 * BS);
            if (n > 6 * BS + 3)
                n = 6 * BS + 3;
            for (size_t i = cut; i < n; i++)
                p[i] = pt_below(&rng, 3);
        } else {
            n = pt_below(&rng, 6 * BS + 4);
            for (size_t i = 0; i < n; i++)
                p[i] = pt_below(&rng, 3);
        }
        /* Keep the distinct prefixes well below capacity so nothing is evicted. */
        if (sealed.n + n / BS + 64 > capacity)
            break;

        size_t want = ref_hit(&sealed, salt, p, n);
        uint64_t id = next_id++;
        size_t nc = PT_SEQ_OPEN(c, id, salt, n ? p : NULL, n);
        cr_assert_eq(nc, want, "%sprompt of %zu tokens (salt %llu): n_cached %zu, reference %zu",
                     pt_ctx, n, (unsigned long long)salt, nc, want);
        exp_hit_tokens += nc;
        exp_miss_tokens += n - nc;
        exp_hit_blocks += nc / BS;
        total_hits += nc ? 1 : 0;
        /* Tokens and K/V of the hit blocks are exactly this prompt's. */
        PT_VERIFY(c, id, salt, p, nc, nc);

        if (n > nc) {
            PT_APPEND(c, id, salt, p, nc, n - nc);
            size_t first = pt_below(&rng, (uint32_t)(n - nc)) + 1;
            PT_OK(pkv_seq_commit(c, id, first));
            PT_CHECK(c);
            if (nc + first < n) {
                PT_OK(pkv_seq_commit(c, id, n - nc - first));
                PT_CHECK(c);
            }
            for (size_t k = (nc / BS + 1) * BS; k <= n; k += BS)
                if (!pt_set_add(&sealed, pt_prefix_key(salt, p, k)))
                    exp_dedupes++;
        }
        PT_VERIFY(c, id, salt, p, n, n);

        pkv_stats st = pt_stats(c);
        cr_assert_eq(st.dedupes, exp_dedupes, "%sdedupes %llu, reference %llu", pt_ctx,
                     (unsigned long long)st.dedupes, (unsigned long long)exp_dedupes);
        cr_assert_eq(st.blocks_sealed, sealed.n, "%sblocks_sealed %llu, reference %zu",
                     pt_ctx, (unsigned long long)st.blocks_sealed, sealed.n);
        cr_assert_eq(st.evictions, 0);

        /* Remember the prompt; keep a few sequences alive so hits also land on
         * referenced blocks. */
        pool_entry *pe = &pool[npool < POOL ? npool++ : pt_below(&rng, POOL)];
        pe->salt = salt;
        pe->n = n;
        memcpy(pe->tok, p, n * sizeof *p);
        if (nlive == LIVE) {
            size_t victim = pt_below(&rng, LIVE);
            PT_VERIFY(c, live[victim].id, live[victim].salt, live[victim].tok, live[victim].n,
                      live[victim].n);
            PT_OK(pkv_seq_close(c, live[victim].id));
            PT_CHECK(c);
            live[victim] = live[--nlive];
        }
        if (pt_below(&rng, 3) == 0) {
            live[nlive].id = id;
            live[nlive].salt = salt;
            live[nlive].n = n;
            memcpy(live[nlive].tok, p, n * sizeof *p);
            nlive++;
        } else {
            PT_OK(pkv_seq_close(c, id));
            PT_CHECK(c);
        }
    }
    pkv_stats st = pt_stats(c);
    cr_log_info("%zu distinct blocks of %llu, %zu prompts hit; most blocks in limbo at an "
                "eviction: %llu", sealed.n, (unsigned long long)capacity, total_hits,
                (unsigned long long)st.limbo_evict_max);
    cr_assert_eq(st.hit_tokens, exp_hit_tokens);
    cr_assert_eq(st.miss_tokens, exp_miss_tokens);
    cr_assert_eq(st.hit_blocks, exp_hit_blocks);
    cr_assert_eq(st.evictions, 0);
    cr_assert(total_hits > rounds / 4, "test too weak: only %zu prompts hit", total_hits);
    cr_assert(sealed.n > 512, "test too weak: only %zu distinct blocks (8-bit hash)", sealed.n);
    pt_set_free(&sealed);
    free(pool);
}

/* Every single-block prompt over a 3-letter alphabet under 3 salts: 243 sealed blocks
 * in 256 hash buckets, then child blocks with identical tokens under many parents. */
Test(collision, exhaustive_single_blocks_and_parent_check)
{
    pkv_cache *c = pt_open(BS, 1024);
    const uint64_t salts[3] = {0, 1, 99};
    uint32_t blk[81][BS];
    for (uint32_t v = 0; v < 81; v++)
        for (uint32_t i = 0, x = v; i < BS; i++, x /= 3)
            blk[v][i] = x % 3;

    uint64_t id = 1;
    /* Seal [A_v] for every v and salt; for v < 40 also [A_v, X] with a fixed X. */
    const uint32_t X[BS] = {2, 0, 1, 2};
    for (int s = 0; s < 3; s++)
        for (uint32_t v = 0; v < 81; v++, id++) {
            uint32_t p[2 * BS];
            memcpy(p, blk[v], sizeof blk[v]);
            memcpy(p + BS, X, sizeof X);
            size_t n = v < 40 ? 2 * BS : BS;
            size_t nc = PT_SEQ_OPEN(c, id, salts[s], p, n);
            /* [A_v] alone was never committed before [A_v, X] (cap n-1). */
            cr_assert_eq(nc, 0);
            PT_APPEND(c, id, salts[s], p, 0, n);
            PT_OK(pkv_seq_commit(c, id, n));
            PT_CHECK(c);
            PT_OK(pkv_seq_close(c, id));
            PT_CHECK(c);
        }
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_sealed, 3 * 81 + 3 * 40);
    cr_assert_eq(st.dedupes, 0);
    cr_assert_eq(st.evictions, 0);

    /* Probe [A_v, X, t]: hit 8 tokens iff v < 40, else exactly 4 -- although
     * (A_v, X) hashes collide with some committed (A_w, X) all the time. Probe
     * [A_v, A_v', t] (never committed) -> 4. And unknown salt -> 0. */
    for (int s = 0; s < 3; s++)
        for (uint32_t v = 0; v < 81; v++) {
            uint32_t p[2 * BS + 1];
            memcpy(p, blk[v], sizeof blk[v]);
            memcpy(p + BS, X, sizeof X);
            p[2 * BS] = 1;
            size_t nc = PT_SEQ_OPEN(c, id, salts[s], p, 2 * BS + 1);
            cr_assert_eq(nc, v < 40 ? 2 * BS : BS, "salt %llu block %u: n_cached %zu",
                         (unsigned long long)salts[s], v, nc);
            PT_VERIFY(c, id, salts[s], p, nc, nc);
            PT_OK(pkv_seq_close(c, id));
            PT_CHECK(c);
            id++;

            memcpy(p + BS, blk[(v * 7 + 1) % 81], sizeof blk[0]);
            bool is_x = memcmp(p + BS, X, sizeof X) == 0;
            nc = PT_SEQ_OPEN(c, id, salts[s], p, 2 * BS + 1);
            cr_assert_eq(nc, (is_x && v < 40) ? 2 * BS : BS, "salt %llu block %u: n_cached %zu",
                         (unsigned long long)salts[s], v, nc);
            PT_VERIFY(c, id, salts[s], p, nc, nc);
            PT_OK(pkv_seq_close(c, id));
            PT_CHECK(c);
            id++;

            nc = PT_SEQ_OPEN(c, id, 12345, p, 2 * BS + 1);
            cr_assert_eq(nc, 0);
            PT_OK(pkv_seq_close(c, id));
            PT_CHECK(c);
            id++;
        }

    /* Dedupe under collisions: recomputing [A_v, X] for every v dedupes only the
     * existing blocks -- exactly 81 + 40 per salt -- and never a collision. */
    uint64_t d0 = pt_stats(c).dedupes;
    for (uint32_t v = 0; v < 81; v++, id++) {
        uint32_t p[2 * BS];
        memcpy(p, blk[v], sizeof blk[v]);
        memcpy(p + BS, X, sizeof X);
        PT_SEQ_OPEN(c, id, 1, NULL, 0);
        PT_APPEND(c, id, 1, p, 0, 2 * BS);
        PT_OK(pkv_seq_commit(c, id, 2 * BS));
        PT_CHECK(c);
        PT_VERIFY(c, id, 1, p, 2 * BS, 2 * BS);
        PT_OK(pkv_seq_close(c, id));
        PT_CHECK(c);
    }
    st = pt_stats(c);
    cr_assert_eq(st.dedupes - d0, 81 + 40);
    cr_assert_eq(st.blocks_sealed, 3 * 81 + 3 * 40 + 41);
}

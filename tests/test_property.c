/* Property test: seeded random operation sequences (open / append / commit / fork /
 * truncate / close) checked against a reference model after every step.
 *
 * The model keeps, per live sequence, its salt, token ids and committed count (the
 * K/V of every position is a function of (salt, tokens[0..p]), see pkv_test.h), and
 * the set of every (salt, full-block prefix) ever sealed.
 *
 *  - exact variant: capacity is kept large enough that nothing is ever evicted, so
 *    every hit length, dedupe count and blocks_sealed is predicted exactly;
 *  - small variants: a tiny capacity makes eviction and PKV_EFULL common; hits must
 *    lie between what live sequences guarantee and what was ever sealed, EFULL must
 *    happen exactly when too few blocks are free or evictable, and must change
 *    nothing at all; pkv_check (every 4 steps) holds each policy to leaf-first
 *    order. Once under leaf-first LRU, once under leaf-first SLRU with a random
 *    protected share (1-100%).
 *
 * Reproduce a failure with PKV_SEED=<seed printed> PKV_ROUNDS=1.
 */
#include "pkv_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(property, .init = pt_setup, .fini = pt_teardown);

enum { MAXSEQ = 6, MAXLEN = 48, POOL = 64 };

typedef struct {
    bool live;
    uint64_t id, salt;
    uint32_t tok[MAXLEN];
    size_t len, committed;
} mseq;

typedef struct {
    pkv_cache *c;
    uint32_t bs;
    uint64_t cap;
    bool exact;
    bool limbo_wait; /* PKV_OPEN_LIMBO_WAIT: evictions exactly predictable */
    pt_rng rng;
    mseq s[MAXSEQ];
    pt_set sealed;
    uint64_t next_id;
    /* expected counters */
    uint64_t hit_tokens, miss_tokens, hit_blocks, dedupes, cow;
    uint32_t pool[POOL][MAXLEN];
    size_t pool_len[POOL];
    uint64_t pool_salt[POOL];
    size_t npool;
    uint32_t alphabet;
    /* statistics of the run, to make sure the test exercises things */
    uint64_t n_hits, n_efull, n_cow, n_evict, n_dedupe_ops;
} model;

#define PA(cond, ...)                                                               \
    do {                                                                            \
        if (!(cond)) {                                                              \
            char msg_[512];                                                         \
            snprintf(msg_, sizeof msg_, __VA_ARGS__);                               \
            cr_assert(0, "%s%s (%s)", pt_ctx, msg_, #cond);                        \
        }                                                                           \
    } while (0)

static size_t nblocks(size_t len, uint32_t bs)
{
    return (len + bs - 1) / bs;
}

static size_t nlive(const model *m)
{
    size_t n = 0;
    for (int i = 0; i < MAXSEQ; i++)
        n += m->s[i].live;
    return n;
}

static int pick_live(model *m)
{
    size_t n = nlive(m);
    if (!n)
        return -1;
    size_t k = pt_below(&m->rng, (uint32_t)n);
    for (int i = 0; i < MAXSEQ; i++)
        if (m->s[i].live && k-- == 0)
            return i;
    return -1;
}

static int free_slot(const model *m)
{
    for (int i = 0; i < MAXSEQ; i++)
        if (!m->s[i].live)
            return i;
    return -1;
}

static size_t get_table(model *m, int si, uint32_t *tab)
{
    return PT_BLOCKS(m->c, m->s[si].id, tab, MAXLEN + 1);
}

static bool block_shared(model *m, int si, uint32_t blk)
{
    uint32_t tab[MAXLEN + 1];
    for (int j = 0; j < MAXSEQ; j++) {
        if (j == si || !m->s[j].live)
            continue;
        size_t n = get_table(m, j, tab);
        for (size_t i = 0; i < n; i++)
            if (tab[i] == blk)
                return true;
    }
    return false;
}

static void live_ids(const model *m, uint64_t *ids, size_t *n)
{
    *n = 0;
    for (int i = 0; i < MAXSEQ; i++)
        if (m->s[i].live)
            ids[(*n)++] = m->s[i].id;
}

static void verify_seq(model *m, int si)
{
    const mseq *q = &m->s[si];
    PT_VERIFY(m->c, q->id, q->salt, q->tok, q->len, q->committed);
}

static void check_stats(model *m)
{
    pkv_stats st = pt_stats(m->c);
    PA(st.sequences == nlive(m), "sequences %llu, model %zu", (unsigned long long)st.sequences,
       nlive(m));
    PA(st.capacity == m->cap, "capacity %llu", (unsigned long long)st.capacity);
    PA(st.blocks_free + st.blocks_cached + st.blocks_used == m->cap, "block counts don't add up");
    PA(st.hit_tokens == m->hit_tokens, "hit_tokens %llu, model %llu",
       (unsigned long long)st.hit_tokens, (unsigned long long)m->hit_tokens);
    PA(st.miss_tokens == m->miss_tokens, "miss_tokens %llu, model %llu",
       (unsigned long long)st.miss_tokens, (unsigned long long)m->miss_tokens);
    PA(st.hit_blocks == m->hit_blocks, "hit_blocks %llu, model %llu",
       (unsigned long long)st.hit_blocks, (unsigned long long)m->hit_blocks);
    PA(st.cow_copies == m->cow, "cow_copies %llu, model %llu", (unsigned long long)st.cow_copies,
       (unsigned long long)m->cow);
    if (m->exact) {
        PA(st.evictions == 0, "eviction in the exact variant");
        PA(st.dedupes == m->dedupes, "dedupes %llu, model %llu", (unsigned long long)st.dedupes,
           (unsigned long long)m->dedupes);
        PA(st.blocks_sealed == m->sealed.n, "blocks_sealed %llu, model %zu",
           (unsigned long long)st.blocks_sealed, m->sealed.n);
    } else {
        PA(st.blocks_sealed <= m->sealed.n, "blocks_sealed %llu > ever sealed %zu",
           (unsigned long long)st.blocks_sealed, m->sealed.n);
    }
}

/* Pairwise structure: a physical block appears at most once per table; shared
 * blocks sit at the same index, hold the same prefix and no pending token; sealed
 * prefixes that two live sequences (same salt) both committed are the same blocks. */
static void check_sharing(model *m)
{
    static uint32_t tab[MAXSEQ][MAXLEN + 1];
    size_t nt[MAXSEQ] = {0};
    const uint32_t bs = m->bs;
    for (int i = 0; i < MAXSEQ; i++)
        if (m->s[i].live)
            nt[i] = get_table(m, i, tab[i]);
    for (int a = 0; a < MAXSEQ; a++) {
        if (!m->s[a].live)
            continue;
        for (int b = a + 1; b < MAXSEQ; b++) {
            if (!m->s[b].live)
                continue;
            const mseq *A = &m->s[a], *B = &m->s[b];
            for (size_t i = 0; i < nt[a]; i++)
                for (size_t j = 0; j < nt[b]; j++) {
                    if (tab[a][i] != tab[b][j])
                        continue;
                    PA(i == j, "block %u at index %zu of seq %llu and %zu of seq %llu",
                       tab[a][i], i, (unsigned long long)A->id, j, (unsigned long long)B->id);
                    PA(A->salt == B->salt, "block %u shared across salts", tab[a][i]);
                    size_t la = A->len < (i + 1) * bs ? A->len : (i + 1) * bs;
                    size_t lb = B->len < (i + 1) * bs ? B->len : (i + 1) * bs;
                    PA(la == lb, "shared block %u holds %zu vs %zu tokens", tab[a][i], la, lb);
                    PA(memcmp(A->tok, B->tok, la * sizeof A->tok[0]) == 0,
                       "shared block %u under different prefixes", tab[a][i]);
                    PA(A->committed >= la && B->committed >= lb,
                       "shared block %u holds pending tokens", tab[a][i]);
                }
            if (A->salt != B->salt)
                continue;
            size_t ca = A->committed / bs, cb = B->committed / bs;
            size_t k = ca < cb ? ca : cb;
            for (size_t i = 0; i < k; i++) {
                if (memcmp(A->tok, B->tok, (i + 1) * bs * sizeof A->tok[0]) != 0)
                    break;
                PA(tab[a][i] == tab[b][i],
                   "identical sealed prefix of %zu blocks not shared by seqs %llu/%llu (block %zu)",
                   i + 1, (unsigned long long)A->id, (unsigned long long)B->id, i);
            }
        }
    }
}

static void verify_all(model *m)
{
    for (int i = 0; i < MAXSEQ; i++)
        if (m->s[i].live)
            verify_seq(m, i);
    check_sharing(m);
    check_stats(m);
}

static void random_tokens(model *m, uint32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = pt_below(&m->rng, m->alphabet);
}

static void pool_add(model *m, uint64_t salt, const uint32_t *t, size_t n)
{
    size_t k = m->npool < POOL ? m->npool++ : pt_below(&m->rng, POOL);
    memcpy(m->pool[k], t, n * sizeof *t);
    m->pool_len[k] = n;
    m->pool_salt[k] = salt;
}

/* Reference hit bounds for a prompt. */
static void hit_bounds(model *m, uint64_t salt, const uint32_t *p, size_t n, size_t *lo,
                       size_t *hi)
{
    size_t cap = pt_hit_cap(n, m->bs);
    *hi = 0;
    for (size_t k = m->bs; k <= cap; k += m->bs) {
        if (!pt_set_has(&m->sealed, pt_prefix_key(salt, p, k)))
            break;
        *hi = k;
    }
    *lo = 0;
    for (int i = 0; i < MAXSEQ; i++) {
        const mseq *q = &m->s[i];
        if (!q->live || q->salt != salt)
            continue;
        size_t lim = (q->committed / m->bs) * m->bs;
        if (lim > cap)
            lim = cap;
        size_t k = 0;
        while (k + m->bs <= lim && memcmp(q->tok + k, p + k, m->bs * sizeof *p) == 0)
            k += m->bs;
        if (k > *lo)
            *lo = k;
    }
}

/* Exact variant: refuse operations that could need more than the free blocks. */
static bool room_for(model *m, uint64_t blocks)
{
    if (!m->exact)
        return true;
    return pt_stats(m->c).blocks_free >= blocks + 1;
}

static bool do_append(model *m, int si, const uint32_t *t, size_t n)
{
    mseq *q = &m->s[si];
    if (n == 0 || q->len + n > MAXLEN)
        return false;
    const uint32_t bs = m->bs;
    bool cow = false;
    if (q->len % bs) {
        uint32_t tab[MAXLEN + 1];
        size_t nb = get_table(m, si, tab);
        cow = block_shared(m, si, tab[nb - 1]);
    }
    uint64_t need = nblocks(q->len + n, bs) - nblocks(q->len, bs) + (cow ? 1 : 0);
    if (!room_for(m, need))
        return false;
    pkv_stats st = pt_stats(m->c);
    pt_snap snap;
    uint64_t ids[MAXSEQ];
    size_t nids;
    bool full = need > st.blocks_free + st.blocks_cached;
    if (full) {
        live_ids(m, ids, &nids);
        pt_snap_take(&snap, m->c, ids, nids);
    }
    pkv_slot slots[MAXLEN];
    int r = pkv_seq_append(m->c, q->id, t, n, slots);
    PT_CHECK(m->c);
    if (full) {
        PA(r == PKV_EFULL, "append of %zu needing %llu blocks (%llu free, %llu cached) -> %d",
           n, (unsigned long long)need, (unsigned long long)st.blocks_free,
           (unsigned long long)st.blocks_cached, r);
        PT_SNAP_SAME(&snap, m->c, "append -> PKV_EFULL");
        pt_snap_free(&snap);
        m->n_efull++;
        return false;
    }
    PA(r == 0, "append of %zu needing %llu blocks (%llu free, %llu cached) -> %d (%s)", n,
       (unsigned long long)need, (unsigned long long)st.blocks_free,
       (unsigned long long)st.blocks_cached, r, pkv_strerror(r));
    pkv_stats st2 = pt_stats(m->c);
    /* Limbo blocks are used before evicting with PKV_OPEN_LIMBO_WAIT; by default
     * eviction comes first, and limbo only drains to the free list when the
     * flusher gets there, so up to blocks_limbo more may be evicted. */
    uint64_t want_ev = need > st.blocks_free ? need - st.blocks_free : 0;
    uint64_t nolimbo = st.blocks_free - st.blocks_limbo;
    uint64_t most_ev = m->limbo_wait ? want_ev : need > nolimbo ? need - nolimbo : 0;
    uint64_t ev = st2.evictions - st.evictions;
    PA(ev >= want_ev && ev <= most_ev, "append evicted %llu blocks, expected %llu..%llu",
       (unsigned long long)ev, (unsigned long long)want_ev, (unsigned long long)most_ev);
    m->n_evict += ev;
    /* Slots follow the block table and take the K/V. */
    pkv_cache_info inf = pt_info(m->c);
    uint32_t tab[MAXLEN + 1];
    size_t nb = get_table(m, si, tab);
    PA(nb == nblocks(q->len + n, bs), "table of %zu blocks after append", nb);
    uint64_t h = pt_hprefix(q->salt, q->tok, q->len);
    for (size_t i = 0; i < n; i++) {
        size_t p = q->len + i;
        PA(slots[i].block == tab[p / bs] && slots[i].offset == p % bs,
           "slot %zu = (%u,%u), table says (%u,%zu)", i, slots[i].block, slots[i].offset,
           tab[p / bs], p % bs);
        h = pt_hstep(h, t[i]);
        pt_write_token(m->c, &inf, slots[i].block, slots[i].offset, h);
        q->tok[p] = t[i];
    }
    q->len += n;
    if (cow) {
        m->cow++;
        m->n_cow++;
    }
    verify_seq(m, si);
    check_stats(m);
    return true;
}

static void do_commit(model *m, int si, size_t n)
{
    mseq *q = &m->s[si];
    size_t pending = q->len - q->committed;
    if (n == 0 || n > pending) {
        pkv_stats st = pt_stats(m->c);
        int r = pkv_seq_commit(m->c, q->id, n);
        PT_CHECK(m->c);
        PA(r == (n == 0 ? PKV_EINVAL : PKV_ESTATE), "commit %zu of %zu pending -> %d", n,
           pending, r);
        pkv_stats st2 = pt_stats(m->c);
        PT_STATS_EQ(&st, &st2, "failed commit");
        verify_seq(m, si);
        return;
    }
    int r = pkv_seq_commit(m->c, q->id, n);
    PT_CHECK(m->c);
    PA(r == 0, "commit %zu of %zu pending -> %d (%s)", n, pending, r, pkv_strerror(r));
    for (size_t k = (q->committed / m->bs + 1) * m->bs; k <= q->committed + n; k += m->bs) {
        if (!pt_set_add(&m->sealed, pt_prefix_key(q->salt, q->tok, k))) {
            m->dedupes++;
            m->n_dedupe_ops++;
        }
    }
    q->committed += n;
    verify_seq(m, si);
    check_stats(m);
}

static void do_open(model *m)
{
    int si = free_slot(m);
    if (si < 0)
        return;
    uint32_t p[MAXLEN];
    size_t n;
    uint64_t salt = pt_below(&m->rng, 5) == 0 ? 1 : 0;
    uint32_t r = pt_below(&m->rng, 10);
    int src = pick_live(m);
    if (r < 7 && (m->npool || src >= 0)) {
        const uint32_t *st;
        size_t sn;
        uint64_t ssalt;
        if (src >= 0 && (m->npool == 0 || pt_below(&m->rng, 2))) {
            st = m->s[src].tok;
            sn = m->s[src].len;
            ssalt = m->s[src].salt;
        } else {
            size_t k = pt_below(&m->rng, (uint32_t)m->npool);
            st = m->pool[k];
            sn = m->pool_len[k];
            ssalt = m->pool_salt[k];
        }
        if (pt_below(&m->rng, 6) != 0)
            salt = ssalt;
        size_t cut = pt_below(&m->rng, (uint32_t)sn + 1);
        if (pt_below(&m->rng, 2))
            cut = sn;
        memcpy(p, st, cut * sizeof *p);
        n = cut + pt_below(&m->rng, 2 * m->bs + 1);
        if (n > MAXLEN)
            n = MAXLEN;
        random_tokens(m, p + cut, n - cut);
    } else {
        n = pt_below(&m->rng, 4 * m->bs + 1);
        random_tokens(m, p, n);
    }
    size_t lo, hi;
    hit_bounds(m, salt, p, n, &lo, &hi);
    uint64_t id = m->next_id++;
    size_t nc = (size_t)-1;
    int rc = pkv_seq_open(m->c, id, salt, n ? p : NULL, n, &nc);
    PT_CHECK(m->c);
    PA(rc == 0, "seq_open(n %zu) -> %d (%s)", n, rc, pkv_strerror(rc));
    PA(nc % m->bs == 0 && nc <= pt_hit_cap(n, m->bs), "n_cached %zu for a prompt of %zu", nc, n);
    if (m->exact)
        PA(nc == hi, "n_cached %zu, reference %zu (prompt %zu tokens, salt %llu)", nc, hi, n,
           (unsigned long long)salt);
    else
        PA(lo <= nc && nc <= hi, "n_cached %zu outside [%zu, %zu] (prompt %zu, salt %llu)", nc,
           lo, hi, n, (unsigned long long)salt);
    mseq *q = &m->s[si];
    q->live = true;
    q->id = id;
    q->salt = salt;
    memcpy(q->tok, p, nc * sizeof *p);
    q->len = q->committed = nc;
    m->hit_tokens += nc;
    m->miss_tokens += n - nc;
    m->hit_blocks += nc / m->bs;
    if (nc)
        m->n_hits++;
    verify_seq(m, si);
    check_stats(m);
    pool_add(m, salt, p, n);
    /* Usually go on computing the prompt right away. */
    if (n > nc && pt_below(&m->rng, 4) != 0) {
        if (do_append(m, si, p + nc, n - nc) && pt_below(&m->rng, 4) != 0)
            do_commit(m, si, q->len - q->committed);
    }
}

static void do_fork(model *m, int si)
{
    mseq *q = &m->s[si];
    int ci = free_slot(m);
    pkv_stats st = pt_stats(m->c);
    if ((ci < 0 || pt_below(&m->rng, 8) == 0) && q->len == q->committed) {
        /* Fork onto an existing id (only without pending tokens: which of
         * PKV_EEXIST / PKV_ESTATE wins is not specified). */
        int other = pick_live(m);
        int r = pkv_seq_fork(m->c, q->id, m->s[other].id);
        PT_CHECK(m->c);
        PA(r == PKV_EEXIST, "fork onto existing id -> %d", r);
        pkv_stats st2 = pt_stats(m->c);
        PT_STATS_EQ(&st, &st2, "fork onto existing id");
        return;
    }
    if (ci < 0)
        return;
    uint64_t id = m->next_id++;
    int r = pkv_seq_fork(m->c, q->id, id);
    PT_CHECK(m->c);
    if (q->len != q->committed) {
        PA(r == PKV_ESTATE, "fork with %zu pending -> %d", q->len - q->committed, r);
        pkv_stats st2 = pt_stats(m->c);
        PT_STATS_EQ(&st, &st2, "fork with pending tokens");
        PT_ERR(pkv_seq_get_info(m->c, id, &(pkv_seq_info){0}), PKV_ENOSEQ);
        return;
    }
    PA(r == 0, "fork -> %d (%s)", r, pkv_strerror(r));
    m->s[ci] = *q;
    m->s[ci].id = id;
    pkv_stats st2 = pt_stats(m->c);
    PA(st2.blocks_free == st.blocks_free && st2.blocks_used == st.blocks_used &&
           st2.blocks_cached == st.blocks_cached,
       "fork changed block counts");
    uint32_t ta[MAXLEN + 1], tb[MAXLEN + 1];
    size_t na = get_table(m, si, ta), nb = get_table(m, ci, tb);
    PA(na == nb && memcmp(ta, tb, na * sizeof *ta) == 0, "fork child does not share the table");
    verify_seq(m, ci);
    check_stats(m);
}

static void do_truncate(model *m, int si)
{
    mseq *q = &m->s[si];
    const uint32_t bs = m->bs;
    uint64_t ids[MAXSEQ];
    size_t nids;
    pt_snap snap;
    if (pt_below(&m->rng, 16) == 0) {
        live_ids(m, ids, &nids);
        pt_snap_take(&snap, m->c, ids, nids);
        int r = pkv_seq_truncate(m->c, q->id, q->len + 1 + pt_below(&m->rng, 3));
        PT_CHECK(m->c);
        PA(r == PKV_ERANGE, "truncate beyond length -> %d", r);
        PT_SNAP_SAME(&snap, m->c, "truncate beyond length");
        pt_snap_free(&snap);
        return;
    }
    size_t new_len = pt_below(&m->rng, (uint32_t)q->len + 1);
    if (pt_below(&m->rng, 3) == 0)
        new_len = (new_len / bs) * bs;
    /* A cut inside a shared or sealed block must copy it. A cut through committed
     * tokens of a private open block may copy it too (the header allows it; the
     * write-ahead-log build does, for durability); cutting only pending tokens of
     * a private open block copies nothing. */
    bool need_copy = false, may_copy = false, cut_shared = false;
    if (new_len < q->len && new_len % bs) {
        uint32_t tab[MAXLEN + 1];
        get_table(m, si, tab);
        size_t bi = new_len / bs;
        bool sealed = q->committed >= (bi + 1) * bs;
        cut_shared = block_shared(m, si, tab[bi]);
        need_copy = sealed || cut_shared;
        may_copy = need_copy || new_len < q->committed;
    }
    if (!room_for(m, may_copy ? 1 : 0))
        return;
    pkv_stats st = pt_stats(m->c);
    bool maybe_full = may_copy && st.blocks_free + st.blocks_cached == 0;
    /* Nothing dropped and the cut block stays referenced: no block can come free. */
    bool must_full = maybe_full && need_copy && cut_shared &&
                     nblocks(new_len, bs) == nblocks(q->len, bs);
    if (maybe_full) {
        live_ids(m, ids, &nids);
        pt_snap_take(&snap, m->c, ids, nids);
    }
    int r = pkv_seq_truncate(m->c, q->id, new_len);
    PT_CHECK(m->c);
    if (maybe_full) {
        /* Whether blocks this very call drops may serve the copy is the
         * implementation's choice; either way the outcome must be clean. */
        PA(r == PKV_EFULL || (r == 0 && !must_full),
           "truncate %zu -> %zu with no block free -> %d (%s)", q->len, new_len, r,
           pkv_strerror(r));
        if (r == PKV_EFULL) {
            PT_SNAP_SAME(&snap, m->c, "truncate -> PKV_EFULL");
            m->n_efull++;
        }
        pt_snap_free(&snap);
        if (r)
            return;
    } else {
        PA(r == 0, "truncate %zu -> %zu (copy %d/%d, %llu free, %llu cached) -> %d (%s)",
           q->len, new_len, need_copy, may_copy, (unsigned long long)st.blocks_free,
           (unsigned long long)st.blocks_cached, r, pkv_strerror(r));
    }
    uint64_t copies = pt_stats(m->c).cow_copies - st.cow_copies;
    PA(copies == (need_copy ? 1u : 0u) || (may_copy && copies == 1),
       "truncate %zu -> %zu made %llu copies (required %d, allowed %d)", q->len, new_len,
       (unsigned long long)copies, need_copy, may_copy);
    m->cow += copies;
    m->n_cow += copies;
    q->len = new_len;
    if (q->committed > new_len)
        q->committed = new_len;
    verify_seq(m, si);
    check_stats(m);
}

static void do_close(model *m, int si)
{
    mseq *q = &m->s[si];
    if (pt_below(&m->rng, 10) == 0) {
        pkv_stats st = pt_stats(m->c);
        PT_ERR(pkv_seq_close(m->c, m->next_id + 1000), PKV_ENOSEQ);
        PT_CHECK(m->c);
        pkv_stats st2 = pt_stats(m->c);
        PT_STATS_EQ(&st, &st2, "close of unknown id");
    }
    PT_OK(pkv_seq_close(m->c, q->id));
    PT_CHECK(m->c);
    pool_add(m, q->salt, q->tok, q->len);
    q->live = false;
    PT_ERR(pkv_seq_get_info(m->c, q->id, &(pkv_seq_info){0}), PKV_ENOSEQ);
    check_stats(m);
}

static void run_round(uint64_t seed, int variant, size_t nops, model *m)
{
    memset(m, 0, sizeof *m);
    m->rng.s = seed;
    m->exact = variant == 0;
    static const uint32_t bss[3] = {2, 3, 4};
    m->bs = m->exact ? 4 : bss[pt_below(&m->rng, 3)];
    m->cap = m->exact ? 320 : 6 + pt_below(&m->rng, 14);
    m->alphabet = 2 + pt_below(&m->rng, 4);
    m->next_id = 1 + pt_below(&m->rng, 1000) * 1000;
    pt_set_init(&m->sealed);

    pkv_options o;
    pt_opts(&o, 2, 1 + pt_below(&m->rng, 2), 1 + pt_below(&m->rng, 4), m->bs, PKV_F32, m->cap);
    if (variant == 1)
        o.eviction = PKV_EVICT_LEAF_LRU;
    if (variant == 2) {
        o.eviction = PKV_EVICT_LEAF_SLRU;
        o.evict_protect_pct = 1 + pt_below(&m->rng, 100);
    }
    /* the exact variant never evicts: limbo blocks must be waited for */
    m->limbo_wait = m->exact || pt_below(&m->rng, 2);
    o.flags = m->limbo_wait ? PKV_OPEN_LIMBO_WAIT : 0;
    m->c = pt_open_sub("round", &o);
    PT_CHECK(m->c);

    for (size_t step = 0; step < nops; step++) {
        snprintf(pt_ctx, sizeof pt_ctx, "[seed %llu variant %d step %zu] ",
                 (unsigned long long)seed, variant, step);
        uint32_t op = pt_below(&m->rng, 100);
        int si = pick_live(m);
        if (si < 0 || op < 18) {
            do_open(m);
        } else if (op < 48) {
            uint32_t t[MAXLEN];
            size_t n = 1 + pt_below(&m->rng, 2 * m->bs);
            random_tokens(m, t, n);
            do_append(m, si, t, n);
        } else if (op < 68) {
            mseq *q = &m->s[si];
            size_t pending = q->len - q->committed;
            size_t n;
            if (pt_below(&m->rng, 10) == 0)
                n = pt_below(&m->rng, 2) ? 0 : pending + 1;
            else
                n = pending ? 1 + pt_below(&m->rng, (uint32_t)pending) : 1;
            if (pending && pt_below(&m->rng, 2))
                n = pending;
            do_commit(m, si, n);
        } else if (op < 78) {
            do_fork(m, si);
        } else if (op < 90) {
            do_truncate(m, si);
        } else {
            do_close(m, si);
        }
        if (step % 4 == 3)
            verify_all(m);
    }
    verify_all(m);
    /* Close everything: all blocks become free or cached. */
    for (int i = 0; i < MAXSEQ; i++)
        if (m->s[i].live)
            do_close(m, i);
    pkv_stats st = pt_stats(m->c);
    PA(st.blocks_used == 0, "%llu blocks used with no sequence", (unsigned long long)st.blocks_used);
    PA(st.blocks_cached == st.blocks_sealed, "cached %llu != sealed %llu",
       (unsigned long long)st.blocks_cached, (unsigned long long)st.blocks_sealed);
    pt_close(m->c);
    char path[512];
    pt_path(path, sizeof path, "round");
    pt_rmrf(path);
    pt_set_free(&m->sealed);
    pt_ctx[0] = '\0';
}

static void run_variant(int variant, uint64_t default_seed, size_t default_rounds)
{
    uint64_t seed0 = pt_env_u64("PKV_SEED", default_seed);
    size_t rounds = (size_t)pt_env_u64("PKV_ROUNDS", default_rounds);
    size_t nops = (size_t)pt_env_u64("PKV_OPS", 80);
    model *m = calloc(1, sizeof *m);
    cr_assert_not_null(m);
    uint64_t hits = 0, efull = 0, cow = 0, evict = 0, dd = 0;
    for (size_t r = 0; r < rounds; r++) {
        run_round(seed0 + r, variant, nops, m);
        hits += m->n_hits;
        efull += m->n_efull;
        cow += m->n_cow;
        evict += m->n_evict;
        dd += m->n_dedupe_ops;
    }
    /* The generator must actually exercise the interesting paths. */
    if (rounds >= 100) {
        cr_assert(hits > rounds, "too few hits: %llu", (unsigned long long)hits);
        cr_assert(cow > rounds / 4, "too few copies: %llu", (unsigned long long)cow);
        cr_assert(dd > rounds / 4, "too few dedupes: %llu", (unsigned long long)dd);
        if (variant != 0) {
            cr_assert(efull > rounds / 4, "too few PKV_EFULL: %llu", (unsigned long long)efull);
            cr_assert(evict > rounds, "too few evictions: %llu", (unsigned long long)evict);
        }
    }
    cr_log_info("variant %d: %zu rounds x %zu ops from seed %llu: %llu hits, %llu copies, "
                "%llu dedupes, %llu EFULL, %llu evictions",
                variant, rounds, nops, (unsigned long long)seed0, (unsigned long long)hits,
                (unsigned long long)cow, (unsigned long long)dd, (unsigned long long)efull,
                (unsigned long long)evict);
    free(m);
}

Test(property, exact_no_eviction, .timeout = 280)
{
    run_variant(0, 1000000, 1000);
}

Test(property, small_capacity_leaf_lru, .timeout = 280)
{
    run_variant(1, 2000000, 1000);
}

Test(property, small_capacity_leaf_slru, .timeout = 280)
{
    run_variant(2, 3000000, 1000);
}

/*
 * seq.c — sequences: the public calls that create, grow, seal, share, cut and
 * release block tables.
 *
 * A sequence holds `len` tokens in ceil(len / B) blocks (B = block_size), of which
 * the first `committed` have their K/V written. Invariants (docs/design.md, I8-I10):
 *  - blocks [0, committed / B) are sealed, each the chain child of the one before;
 *  - every other block is open (unsealed); when the sequence has pending tokens
 *    (len > committed) the blocks from index committed / B on are owned by it alone
 *    (ref 1); a sequence without pending tokens may share its partial last block
 *    (after a fork);
 *  - a block appears at most once in a table.
 * Decode steps (one token appended into the sequence's own partial block, commits
 * within it) take fast paths that skip the planning and change the same state; see
 * docs/design.md "The decode path".
 * Writes never touch a shared or sealed block: append copies a shared partial last
 * block first, truncate copies a shared or sealed block it cuts (copy-on-write).
 *
 * Every call validates and reserves everything it may need (blocks, table room,
 * map room, log room) before its first mutation, so a failing call changes nothing.
 * Blocks are released tail-first, which keeps the policy's leaf-first order (evict.c).
 *
 * Logging (wal/): every change to the committed part of a table is logged with
 * absolute values — SEQ_SET (open, fork), SEAL + COMMIT (commit), SEQ_BLOCK (a
 * copy-on-write of a committed partial block at append), TRUNC (cutting committed
 * tokens), SEQ_CLOSE — plus EVICT for each eviction. Pending (appended, not yet
 * committed) tokens are never logged. Truncating below the committed length
 * always copies the cut block, so bytes the durable state still names are never
 * overwritten; freed open blocks wait in limbo until the freeing record is safe.
 */
#include "internal.h"
#include "tier.h"

#include <stdlib.h>

#define LOCKED_ENTRY(c)                                                         \
    do {                                                                        \
        if (!(c)) return pkv_err(PKV_EINVAL, "cache is NULL");                  \
        pkv_lock(c);                                                            \
    } while (0)

/* The sequence named `id`, or NULL with *rc = PKV_ENOSEQ. */
static pkv_seq *find_seq(pkv_cache *c, uint64_t id, int *rc) {
    pkv_seq *s = pkv_seqmap_get(&c->seqs, id);
    if (!s) *rc = pkv_err(PKV_ENOSEQ, "no sequence %llu", (unsigned long long)id);
    return s;
}

/* Mutating calls: also refuse a read-only or failed cache. */
#define MUTATING_ENTRY(c)                                                       \
    do {                                                                        \
        LOCKED_ENTRY(c);                                                        \
        pkv_wal_throttle(c);                                                    \
        int wrc_ = pkv_wal_writable(c);                                         \
        if (wrc_) {                                                             \
            pkv_unlock(c);                                                      \
            return wrc_;                                                        \
        }                                                                       \
    } while (0)

/* End of a mutating call that changed something: stamp freed blocks with the
 * call's last LSN, then wait for durability if the mode says so. */
static inline int finish(pkv_cache *c) {
    if (c->limbo.tail != PKV_NONE) pkv_limbo_stamp(c);
    return pkv_wal_commit_point(c);
}

/* pkv_wal_wait, counted in *n and *ns when it has to wait (pkv_get_stats). */
static int timed_wait(pkv_cache *c, uint64_t lsn, uint64_t *n, uint64_t *ns) {
    if (pkv_wal_safe_lsn(&c->wal) >= lsn) return pkv_wal_wait(c, lsn);
    uint64_t t0 = pkv_now_ns();
    int rc = pkv_wal_wait(c, lsn);
    ++*n;
    *ns += pkv_now_ns() - t0;
    return rc;
}

/* Need `need` blocks. Free blocks come first, then eviction of cached blocks;
 * blocks in limbo (freed, their freeing record not yet safe, rule D2) only when
 * eviction cannot supply enough, after waiting for the log. So no allocation
 * waits for the disk while a cached block can be evicted, except for rule D3:
 * before evicting a block whose SEAL, or the TRUNC that released it, is not yet
 * safe it waits for that record (pkv_evict_wait_lsn). Under leaf-LRU the victims'
 * release LSNs ascend, so that wait comes only when fewer cached blocks than the
 * call needs have both safe.
 * Which blocks are evicted
 * then depends on flush timing (a limbo block drained in time saves an
 * eviction); the cost is bounded: a cache holds at most limbo_evict_max fewer
 * cached blocks than one that waits (docs/design.md, "Free list, limbo"). With
 * PKV_OPEN_LIMBO_WAIT, limbo comes before eviction, after waiting for the log,
 * which keeps eviction independent of flush timing. 0: go ahead; 1: the caller
 * waited (the lock was released) and must retry; PKV_EFULL: never. */
static int ensure_blocks(pkv_cache *c, uint64_t need, const char *what) {
    uint64_t nfree = c->pool.free.count;
    if (need <= nfree) return 0;
    if (c->limbo.count > 0 && (c->limbo_wait || need > pkv_available(c))) {
        /* Wait only for the records that freed the limbo blocks this call needs
         * (by default, only those eviction cannot replace): limbo is in release
         * order, so their stamps ascend from the head (rule D2). */
        uint64_t k = c->limbo_wait ? need - nfree : need - pkv_available(c), target = 0;
        for (uint32_t b = c->limbo.head; b != PKV_NONE && k > 0; b = c->pool.b[b].next, k--)
            target = c->pool.b[b].rel_lsn;
        if (target > c->wal.next_lsn - 1) target = c->wal.next_lsn - 1;
        int rc = timed_wait(c, target, &c->ctr.waits_limbo, &c->ctr.wait_limbo_ns);
        if (rc) return rc;
        pkv_limbo_drain(c, pkv_wal_safe_lsn(&c->wal));
        return 1;
    }
    if (need > pkv_available(c))
        return pkv_err(PKV_EFULL, "%s needs %llu blocks, %llu obtainable", what,
                       (unsigned long long)need, (unsigned long long)pkv_available(c));
    uint64_t target =
        c->wal.running ? pkv_evict_wait_lsn(c, need - nfree, pkv_wal_safe_lsn(&c->wal)) : 0;
    if (target) {
        int rc = timed_wait(c, target, &c->ctr.waits_seal, &c->ctr.wait_seal_ns);
        return rc ? rc : 1;
    }
    /* Each limbo block now is at most one eviction more than a cache that waited
     * for it would make (pkv_get_stats().limbo_evict_max). */
    if (c->limbo.count > c->ctr.limbo_evict_max) c->ctr.limbo_evict_max = c->limbo.count;
    return 0;
}

static inline uint64_t blocks_for(uint64_t tokens, uint32_t bs) {
    return (tokens + bs - 1) / bs;
}

static int table_reserve(pkv_seq *s, uint64_t n) {
    if (n <= s->cap) return 0;
    if (n > UINT32_MAX) return pkv_err(PKV_EFULL, "sequence of %llu blocks is too long",
                                       (unsigned long long)n);
    uint64_t cap = s->cap ? s->cap : 4;
    while (cap < n) cap *= 2;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    uint32_t *nb = realloc(s->blocks, cap * sizeof *nb);
    if (!nb) return pkv_err(PKV_ENOMEM, "block table of %llu entries",
                            (unsigned long long)cap);
    s->blocks = nb;
    s->cap = (uint32_t)cap;
    return 0;
}

static pkv_seq *seq_alloc(uint64_t id, uint64_t salt, uint64_t table_cap) {
    pkv_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->id = id;
    s->salt = salt;
    if (table_reserve(s, table_cap ? table_cap : 4)) {
        free(s);
        return NULL;
    }
    return s;
}

static void seq_free(pkv_seq *s) {
    free(s->blocks);
    free(s);
}

/* Rule S1: is sealed block b fit to serve? A recovered block is checked against
 * its payload checksum the first time; one that fails is BAD from then on, and the
 * verdict is logged (the caller reserved room for one BAD record). */
static bool verified(pkv_cache *c, uint32_t b) {
    pkv_verdict v = pkv_block_verify(c, b);
    if (v == PKV_VERIFY_FAILED && c->wal.running) pkv_log_bad(c, b);
    return v == PKV_VERIFY_OK;
}

/* A block for a table: free, or evicted (logged; the caller reserved room for an
 * EVICT per block it takes and waited for rule D3 in ensure_blocks). */
static uint32_t take_block(pkv_cache *c) {
    bool evicted;
    uint32_t b = pkv_block_alloc(c, &evicted);
    if (evicted && c->wal.running) pkv_log_evict(c, b);
    return b;
}

/* Find the longest chain of cached blocks matching prompt[0 .. maxb*B). Hashes are
 * computed a window ahead and their index slots prefetched, so the probes of one
 * window overlap their memory latency. A hit is exact (rule S2, pkv_index_find),
 * and a block recovered from disk is verified against its payload checksum
 * before it is first served (rule S1). Returns the number matched; their blocks
 * go to out[] unless out is NULL. pkv_seq_open records a failed verification
 * (BAD, logged); pkv_prefix_lookup (quiet) leaves that to the next open. */
uint32_t pkv_prefix_match(pkv_cache *c, uint64_t salt, const uint32_t *prompt, uint64_t maxb,
                          uint32_t *out, bool quiet) {
    enum { W = 16 };
    const uint32_t bs = c->pool.block_size;
    const uint64_t secret = c->arena.secret;
    pkv_h128 h = pkv_hash_root(secret, salt), hs[W];
    uint32_t parent = PKV_NONE;
    for (uint64_t base = 0; base < maxb; base += W) {
        uint64_t m = maxb - base < W ? maxb - base : W;
        for (uint64_t k = 0; k < m; k++) {
            h = pkv_hash_block(secret, h, prompt + (base + k) * bs, bs);
            hs[k] = h;
            pkv_index_prefetch(&c->index, h.lo);
        }
        for (uint64_t k = 0; k < m; k++)
            pkv_index_prefetch_entry(&c->index, c->pool.b, c->pool.tokens, bs, hs[k].lo);
        for (uint64_t k = 0; k < m; k++) {
            uint32_t b = pkv_index_find(&c->index, &c->pool, hs[k], parent, salt,
                                        prompt + (base + k) * bs);
            if (b == PKV_NONE || !(quiet ? pkv_block_verify_quiet(c, b) : verified(c, b)))
                return (uint32_t)(base + k);
            if (out) out[base + k] = b;
            parent = b;
        }
    }
    return (uint32_t)maxb;
}

static int tier_import(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *prompt,
                       const pkv_tier_got *got);
static int pkv_seq_open_local(pkv_cache *c, uint64_t id, uint64_t salt,
                              const uint32_t *prompt, size_t n, size_t *n_cached);

int pkv_seq_open(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *prompt,
                 size_t n, size_t *n_cached) {
    if (n && !prompt) return pkv_err(PKV_EINVAL, "prompt is NULL with n = %zu", n);
    PKV_REMOTE(c, pkv_remote_seq_open(c, id, salt, prompt, n, n_cached));
    if (pkv_likely(!c || c->tier == NULL || n < 2))
        return pkv_seq_open_local(c, id, salt, prompt, n, n_cached);
    /* The shared tier (docs/remote.md, rule T1) is asked without the lock; what
     * it brought is imported under the lock, after matching again. The fetch,
     * the local open and the import all read one private copy of the prompt:
     * the caller's buffer may change while the lock is released (another
     * thread, a zero-copy Python buffer), and the records were verified
     * against exactly these tokens. */
    uint32_t *own = malloc(n * sizeof *own);
    if (!own) return pkv_seq_open_local(c, id, salt, prompt, n, n_cached);
    memcpy(own, prompt, n * sizeof *own);
    pkv_tier_got got = {0};
    pkv_tier_fetch(c, salt, own, n, &got);
    int rc = pkv_seq_open_local(c, id, salt, own, n, n_cached);
    if (!rc && got.n != 0) {
        /* The sequence exists now: a failed import is a miss, never an error
         * of this call (all-or-nothing: the open took effect). */
        pkv_lock(c);
        (void)tier_import(c, id, salt, own, &got);
        pkv_seq *s = pkv_seqmap_get(&c->seqs, id);
        if (n_cached && s) *n_cached = s->committed;
        pkv_unlock(c);
    }
    pkv_tier_got_free(&got);
    free(own);
    return rc;
}

static int pkv_seq_open_local(pkv_cache *c, uint64_t id, uint64_t salt,
                              const uint32_t *prompt, size_t n, size_t *n_cached) {
    MUTATING_ENTRY(c);
    int rc = 0;
    const uint32_t bs = c->pool.block_size;
    uint64_t maxb = n ? (n - 1) / bs : 0;
    if (maxb > c->pool.capacity) maxb = c->pool.capacity; /* more cannot be cached */
    pkv_seq *s = NULL;
    if (pkv_seqmap_get(&c->seqs, id)) {
        rc = pkv_err(PKV_EEXIST, "sequence %llu already exists", (unsigned long long)id);
        goto out;
    }
    if ((rc = pkv_seqmap_reserve(&c->seqs)) ||
        (rc = pkv_wal_reserve(c, pkv_log_seq_set_size(maxb, bs) + pkv_log_bad_size())))
        goto out;
    if (!(s = seq_alloc(id, salt, maxb))) {
        rc = pkv_err(PKV_ENOMEM, "sequence %llu", (unsigned long long)id);
        goto out;
    }
    uint32_t hit = pkv_prefix_match(c, salt, prompt, maxb, s->blocks, false);
    for (uint32_t i = 0; i < hit; i++) {
        /* a cached block leaves its list: its neighbours' records are written */
        if (i + 4 < hit) {
            const pkv_block *y = &c->pool.b[s->blocks[i + 4]];
            if (y->prev != PKV_NONE) pkv_prefetch(&c->pool.b[y->prev]);
            if (y->next != PKV_NONE) pkv_prefetch(&c->pool.b[y->next]);
        }
        pkv_block_acquire(c, s->blocks[i]);
    }
    if (pkv_unlikely(c->tier != NULL)) pkv_tier_on_hit(c, s->blocks, hit); /* rule T2 */
    s->nblocks = hit;
    s->len = s->committed = (uint64_t)hit * bs;
    pkv_seqmap_insert(&c->seqs, s);
    c->ctr.hit_blocks += hit;
    c->ctr.miss_blocks += maxb - hit;
    c->ctr.hit_tokens += s->len;
    c->ctr.miss_tokens += n - s->len;
    if (n_cached) *n_cached = s->len;
    pkv_log_seq_set(c, s);
    rc = finish(c);
out:
    pkv_unlock(c);
    return rc;
}

/* Give a sequence whose last block `i` is shared a private copy of its first
 * `fill` tokens (K/V and ids), so appends never write a shared slot (rules D4,
 * S4). The caller has checked pkv_available(). */
static void cow_last(pkv_cache *c, pkv_seq *s, uint32_t i, uint32_t fill) {
    uint32_t old = s->blocks[i];
    uint32_t nb = take_block(c);
    pkv_arena_copy_tokens(&c->arena, nb, old, fill);
    memcpy(pkv_pool_tokens(&c->pool, nb), pkv_pool_tokens(&c->pool, old),
           (size_t)fill * sizeof(uint32_t));
    s->blocks[i] = nb;
    pkv_block_release(c, old);
    c->ctr.cow_copies++;
    c->wal.arena_dirty = true;
}

/* An append, validated and planned before anything changes (see append_plan). */
typedef struct append_plan {
    uint64_t total;  /* table entries after the append */
    uint64_t need;   /* blocks to take: new ones, plus a copy-on-write copy */
    uint32_t off;    /* offset of the sequence's end in its last block */
    bool cow;        /* the partial last block is shared: copy it first */
    size_t log;      /* log bytes to reserve */
} append_plan;

/* Validate an append of n tokens to s and make sure its blocks can be had, with
 * `spare` more obtainable besides. 0; 1: the caller must retry (the lock was
 * released while waiting for limbo); or an error. Changes nothing durable. */
static int append_plan_make(pkv_cache *c, pkv_seq *s, size_t n, uint64_t spare,
                            append_plan *ap) {
    pkv_pool *p = &c->pool;
    if (n > (uint64_t)p->capacity * p->block_size)
        return pkv_err(PKV_EFULL, "%zu tokens exceed the whole cache", n);
    uint64_t len = s->len, have = s->nblocks;
    ap->total = pkv_bceil(p, len + n);
    ap->off = pkv_bmod(p, len);
    /* a partial block is never sealed; a shared one is copied first (rule S4) */
    ap->cow = ap->off && p->b[s->blocks[have - 1]].ref > 1;
    ap->need = ap->total - have + (ap->cow ? 1 : 0);
    /* spare blocks matter only to an append that takes blocks */
    int rc = ensure_blocks(c, ap->need ? ap->need + spare : 0, "append");
    if (rc) return rc;
    ap->log = pkv_log_seq_block_size(p->block_size) + ap->need * pkv_log_evict_size();
    return table_reserve(s, ap->total);
}

/* Prefetching a run of allocations: a cursor AHEAD allocations in front of the
 * next one follows the order pkv_alloc_order_* gives; each step loads the record
 * of the block after it and what taking the cursor's block will touch, so the
 * misses of an eviction (record, index slot, parent, token ids) overlap the
 * allocations before it instead of stalling each. A wrong guess costs only
 * prefetches. */
enum { ALLOC_AHEAD = 4 };
typedef struct alloc_ahead {
    uint32_t cur;  /* the next block to prefetch for, its record requested */
    uint64_t left; /* allocations of the run not yet prefetched for */
} alloc_ahead;

static void alloc_ahead_step(const pkv_cache *c, alloc_ahead *aa) {
    if (aa->cur == PKV_NONE || aa->left == 0) return;
    pkv_alloc_prefetch_block(c, aa->cur);
    aa->left--;
    aa->cur = pkv_alloc_order_next(c, aa->cur);
    if (aa->cur != PKV_NONE) pkv_prefetch(&c->pool.b[aa->cur]);
}

static void alloc_ahead_init(const pkv_cache *c, alloc_ahead *aa, uint64_t need) {
    aa->left = need;
    aa->cur = need > 1 ? pkv_alloc_order_first(c) : PKV_NONE;
    for (int k = 0; k < ALLOC_AHEAD; k++) alloc_ahead_step(c, aa);
}

/* Carry out a planned append (its blocks and log room are there). */
static void append_apply(pkv_cache *c, pkv_seq *s, const uint32_t *tokens, size_t n,
                         pkv_slot *slots, const append_plan *ap) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    uint32_t have = s->nblocks, off = ap->off;
    s->pf_ok = false; /* its last block's tokens may change */
    if (ap->cow) {
        /* The copied part is committed (a shared block has no pending tokens),
         * so the durable table must follow the switch. */
        cow_last(c, s, have - 1, off);
        pkv_log_seq_block(c, s, have - 1, off);
    }
    uint32_t blk = off ? s->blocks[have - 1] : PKV_NONE;
    if (pkv_likely(n == 1 && blk != PKV_NONE)) { /* decode: one token, same block */
        p->tokens[(uint64_t)blk * bs + off] = tokens[0];
        slots[0].block = blk;
        slots[0].offset = off;
    } else {
        /* A run of tokens per block: one copy of the ids and a slot loop the
         * compiler vectorizes, instead of a block test per token (a prefill
         * appends thousands). */
        size_t i = 0;
        if (blk == PKV_NONE) off = bs; /* the end is on a block boundary */
        alloc_ahead aa;
        alloc_ahead_init(c, &aa, ap->need - (ap->cow ? 1 : 0));
        /* The blocks evicted, logged PKV_LOG_RUN_MAX to a record (take_block's
         * EVICT, in runs: nothing else is logged in this loop). */
        uint32_t run[PKV_LOG_RUN_MAX], nrun = 0;
        const bool logging = c->wal.running;
        while (i < n) {
            if (off == bs) {
                bool evicted;
                blk = pkv_block_alloc(c, &evicted);
                if (evicted && logging) {
                    run[nrun++] = blk;
                    if (nrun == PKV_LOG_RUN_MAX) {
                        pkv_log_evicts(c, run, nrun);
                        nrun = 0;
                    }
                }
                alloc_ahead_step(c, &aa);
                s->blocks[s->nblocks++] = blk;
                off = 0;
            }
            uint32_t k = n - i < bs - off ? (uint32_t)(n - i) : bs - off;
            memcpy(p->tokens + (uint64_t)blk * bs + off, tokens + i, (size_t)k * sizeof *tokens);
            pkv_slot *sl = slots + i;
            for (uint32_t j = 0; j < k; j++) {
                sl[j].block = blk;
                sl[j].offset = off + j;
            }
            i += k;
            off += k;
        }
        if (nrun) pkv_log_evicts(c, run, nrun);
    }
    s->len += n;
    c->ctr.tokens_appended += n;
}

/* The block s's last token just filled will be sealed by the commit of that token:
 * hash it now, keep the hash for the seal (pf_*) and start loading its prefix-index
 * slot, the seal's likely miss. Only when the parent is already sealed, as in
 * decoding. */
static void seal_prefetch(const pkv_cache *c, pkv_seq *s) {
    const pkv_pool *p = &c->pool;
    uint32_t i = s->nblocks - 1;
    pkv_h128 ph;
    if (i == 0) ph = pkv_hash_root(c->arena.secret, s->salt);
    else if (p->b[s->blocks[i - 1]].state == BLK_SEALED) ph = p->b[s->blocks[i - 1]].hash;
    else return;
    pkv_h128 h = pkv_hash_block(c->arena.secret, ph, pkv_pool_tokens(p, s->blocks[i]),
                                p->block_size);
    s->pf_hash = h;
    s->pf_blk = s->blocks[i];
    s->pf_ok = true;
    pkv_index_prefetch(&c->index, h.lo);
}

/* The decode fast path of append: one token into the sequence's partial last
 * block when that block is its own (ref 1, so no copy-on-write, and open, since a
 * partial block is never sealed). It takes no block and logs nothing, so it needs
 * no plan. append_fast_ok() changes nothing; append_fast() cannot fail. */
static inline bool append_fast_ok(const pkv_cache *c, const pkv_seq *s) {
    return pkv_bmod(&c->pool, s->len) != 0 && c->pool.b[s->blocks[s->nblocks - 1]].ref == 1;
}

static inline void append_fast(pkv_cache *c, pkv_seq *s, uint32_t token, pkv_slot *slot) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    uint32_t off = pkv_bmod(p, s->len), blk = s->blocks[s->nblocks - 1];
    p->tokens[(uint64_t)blk * bs + off] = token;
    slot->block = blk;
    slot->offset = off;
    s->len++;
    c->ctr.tokens_appended++;
    /* A few tokens before the block fills, start loading what its seal and the
     * next block's allocation will touch, so those misses overlap decoding. */
    if (pkv_unlikely(off + 5 >= bs) && bs >= 8) {
        if (off + 5 == bs) {
            pkv_alloc_prefetch(c, 0);
        } else if (off + 3 == bs) {
            pkv_alloc_prefetch(c, 1);
            if (c->arena.geo.block_bytes <= 4096) /* the seal's checksum reads it */
                for (uint64_t k = 0; k < c->arena.geo.block_bytes; k += 64)
                    pkv_prefetch(pkv_arena_block(&c->arena, blk) + k);
        } else if (off + 1 == bs) {
            seal_prefetch(c, s);
        }
    }
}

/* Seal the full block at table index i, whose chained hash is h (seal_run): enter
 * it in the prefix index or, if an identical block is already sealed, switch to
 * that one. true: it was sealed, and the caller logs its SEAL (seal_run, in a
 * run); false: deduped, nothing to log. */
static bool seal(pkv_cache *c, pkv_seq *s, uint32_t i, pkv_h128 h) {
    pkv_pool *p = &c->pool;
    uint32_t b = s->blocks[i];
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_OPEN && x->ref == 1);
    uint32_t parent = i ? s->blocks[i - 1] : PKV_NONE;
    const uint32_t *toks = pkv_pool_tokens(p, b);
    pkv_assert(pkv_h128_eq(h, pkv_hash_block(c->arena.secret,
                                             i ? p->b[parent].hash
                                               : pkv_hash_root(c->arena.secret, s->salt),
                                             toks, p->block_size)));
    uint64_t sum; /* computed ahead by the batch (sealsum.c), or now */
    if (x->flags & BLKF_PRESUM) {
        sum = x->payload_sum;
        pkv_assert(sum == pkv_arena_sum(&c->arena, b));
    } else {
        sum = pkv_arena_sum(&c->arena, b);
    }
    uint32_t e = pkv_index_find(&c->index, p, h, parent, s->salt, toks);
    /* Rule S1 (docs/format.md): a recovered block is verified before it is served,
     * by every path. A twin that fails is marked BAD (the caller reserved room for
     * its record) and this block is sealed as the good copy. */
    if (e != PKV_NONE && verified(c, e)) {
        pkv_block_acquire(c, e);
        s->blocks[i] = e;
        pkv_block_release(c, b);
        c->ctr.dedupes++;
        return false;
    }
    pkv_block_seal(c, b, h, parent, s->salt, sum);
    c->wal.seal_dirty = true;
    if (pkv_unlikely(c->tier != NULL)) pkv_tier_on_seal(c, b, i); /* rule T2 */
    return true;
}

/* Start loading block b's payload, the seal's checksum input, when it is small
 * enough to be worth it (a large one streams through the hardware prefetcher). */
static inline void payload_prefetch(const pkv_cache *c, uint32_t b) {
    uint64_t n = c->arena.geo.block_bytes;
    if (n > 4096) return;
    const uint8_t *q = pkv_arena_block(&c->arena, b);
    for (uint64_t k = 0; k < n; k += 64) pkv_prefetch(q + k);
}

/* Seal the full blocks [first, full) of s's table. A window of them is hashed
 * first, each chained on the hash of the one before (the hash a seal leaves at
 * that table index: a dedupe switches to a block with the same hash), and their
 * index slots start loading; then each is sealed while the payload of the block
 * two ahead loads for its checksum. The hash the decode path computed ahead
 * (seal_prefetch) is used for its block. */
static void seal_run(pkv_cache *c, pkv_seq *s, uint64_t first, uint64_t full) {
    enum { W = 8 };
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    const uint64_t secret = c->arena.secret;
    pkv_h128 h = first ? p->b[s->blocks[first - 1]].hash : pkv_hash_root(secret, s->salt);
    pkv_h128 hs[W];
    /* The blocks sealed, logged PKV_LOG_RUN_MAX to a record. A seal only reads
     * and changes the pool and the index: a BAD record for a failing dedupe twin
     * (seal -> verified) may thus precede SEALs of blocks sealed before it, which
     * changes no replayed state (BAD flags a block sealed before this call, the
     * SEALs open blocks of this table), and all are in the call's frame. */
    uint32_t run[PKV_LOG_RUN_MAX], nrun = 0;
    for (uint64_t i = first; i < full && i < first + 2; i++) payload_prefetch(c, s->blocks[i]);
    for (uint64_t base = first; base < full; base += W) {
        uint64_t m = full - base < W ? full - base : W;
        for (uint64_t k = 0; k < m; k++) {
            uint32_t b = s->blocks[base + k];
            if (s->pf_ok && s->pf_blk == b) { /* its index slot is loading already */
                h = s->pf_hash;
            } else {
                h = pkv_hash_block(secret, h, pkv_pool_tokens(p, b), bs);
                pkv_index_prefetch(&c->index, h.lo);
            }
            hs[k] = h;
        }
        for (uint64_t k = 0; k < m; k++) {
            if (base + k + 2 < full) payload_prefetch(c, s->blocks[base + k + 2]);
            uint32_t b = s->blocks[base + k];
            if (seal(c, s, (uint32_t)(base + k), hs[k])) {
                run[nrun++] = b;
                if (nrun == PKV_LOG_RUN_MAX) {
                    pkv_log_seals(c, run, nrun);
                    nrun = 0;
                }
            }
        }
    }
    if (nrun) pkv_log_seals(c, run, nrun);
    if (first < full) s->pf_ok = false;
}

/* A commit, validated before anything changes. */
typedef struct commit_plan {
    uint64_t old, newc;  /* committed length before and after */
    uint64_t first, full; /* blocks [first, full) become full and are sealed */
    size_t log;          /* log bytes to reserve */
} commit_plan;

static int commit_plan_make(pkv_cache *c, const pkv_seq *s, size_t n, commit_plan *cp) {
    if (n > s->len - s->committed)
        return pkv_err(PKV_ESTATE, "commit of %zu tokens, only %llu pending", n,
                       (unsigned long long)(s->len - s->committed));
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    cp->old = s->committed;
    cp->newc = cp->old + n;
    cp->first = pkv_bdiv(p, cp->old);
    cp->full = pkv_bdiv(p, cp->newc);
    uint64_t touched = pkv_bceil(p, cp->newc) - cp->first;
    /* each seal logs a SEAL, or a BAD for a dedupe twin that fails verification */
    cp->log = (cp->full - cp->first) * (pkv_log_seal_size(bs) + pkv_log_bad_size()) +
              pkv_log_commit_size(touched, bs);
    return 0;
}

static void commit_apply(pkv_cache *c, pkv_seq *s, const commit_plan *cp) {
    seal_run(c, s, cp->first, cp->full);
    s->committed = cp->newc;
    pkv_log_commit(c, s, cp->old);
    c->wal.arena_dirty = true; /* the caller wrote the K/V it commits */
}

/* The decode fast path of commit: n pending tokens that continue the partial tail
 * block without filling it, when the sequence's latest COMMIT is still in the
 * unflushed buffer and can grow: nothing is sealed and that record will grow in
 * place by their ids (deferred: pkv_log_commit_defer, settled before anything else
 * changes the sequence). The same state and log bytes as commit_apply.
 * false: nothing changed, take the general path (which also reports errors). */
static inline bool commit_fast(pkv_cache *c, pkv_seq *s, size_t n) {
    const pkv_pool *p = &c->pool;
    uint64_t old = s->committed, newc = old + n;
    if (n > s->len - old || pkv_bdiv(p, newc) != pkv_bdiv(p, old) || pkv_bmod(p, old) == 0 ||
        (!s->mc_stale && !pkv_log_commit_defer(c, s, old))) /* lagging already: */
        return false;                                         /* it lags further */
    s->committed = newc;
    c->wal.arena_dirty = true; /* the caller wrote the K/V it commits */
    return true;
}

/* The decode fast paths: true when they did the whole step. The append needs no
 * plan and the commit leaves len and the table as they are, so checking the
 * append first and then trying the commit keeps all-or-nothing. */
static pkv_always_inline bool step_fast(pkv_cache *c, pkv_seq *s, size_t n_commit,
                                        const uint32_t *tokens, size_t n, pkv_slot *slots) {
    if ((n == 0 || (n == 1 && append_fast_ok(c, s))) &&
        (n_commit == 0 || commit_fast(c, s, n_commit))) {
        if (n) append_fast(c, s, tokens[0], slots);
        return true;
    }
    return false;
}

/* step_locked's general path, out of line so that the fast path stays small. */
static pkv_noinline int step_general(pkv_cache *c, uint64_t id, size_t n_commit,
                                     const uint32_t *tokens, size_t n, pkv_slot *slots) {
    int rc = 0;
    pkv_seq *s;
    commit_plan cp = {0};
    append_plan ap = {0};
    bool waited = false;
retry:
    s = find_seq(c, id, &rc);
    if (!s) return rc;
    /* The inline fast path failed; after a limbo wait it may not. */
    if (waited && step_fast(c, s, n_commit, tokens, n, slots)) return 0;
    pkv_log_settle(c, s); /* the general paths log from the settled COMMIT */
    if (n_commit && (rc = commit_plan_make(c, s, n_commit, &cp))) return rc;
    /* Planned on the table before the commit, which is valid: the commit seals only
     * full blocks, so the partial last block the append writes into is unchanged, and
     * nothing is shared once pending tokens exist. Each seal may dedupe onto a cached
     * block, taking it off the LRU: that many spare blocks are required. */
    if (n && (rc = append_plan_make(c, s, n, cp.full - cp.first, &ap)) == 1) {
        waited = true; /* for limbo, with the lock released */
        goto retry;
    }
    if (rc || (rc = pkv_wal_reserve(c, cp.log + ap.log))) return rc;
    if (n_commit) {
        if (pkv_unlikely(c->seal_threads > 1) && cp.full - cp.first > 1)
            pkv_seal_sums_range(c, s, cp.first, cp.full); /* on helper threads */
        commit_apply(c, s, &cp);
    }
    if (n) append_apply(c, s, tokens, n, slots, &ap);
    if (c->limbo.tail != PKV_NONE) pkv_limbo_stamp(c);
    return 0;
}

/* Commit n_commit pending tokens of sequence `id`, then append n (either may be 0,
 * not both): the body of pkv_seq_commit, pkv_seq_append, pkv_seq_commit_append and
 * each step of pkv_seq_step_batch, with the cache lock held and the cache writable.
 * All-or-nothing. Freed blocks are stamped; the caller reaches the commit point.
 * Inlined into each caller, so their constant counts prune what they never do;
 * only the fast paths are inline, the general path (step_general) is a call. */
static pkv_always_inline int step_locked(pkv_cache *c, uint64_t id, size_t n_commit,
                                         const uint32_t *tokens, size_t n, pkv_slot *slots) {
    pkv_seq *s = pkv_seqmap_get(&c->seqs, id);
    if (pkv_likely(s != NULL) && step_fast(c, s, n_commit, tokens, n, slots)) return 0;
    return step_general(c, id, n_commit, tokens, n, slots);
}

static void release_from(pkv_cache *c, pkv_seq *s, uint32_t keep);

/* Rule T1 (docs/remote.md), second half, with the lock held: import the
 * verified records of a tier fetch into sequence id, just opened, as if its
 * caller had appended those tokens, written their K/V and committed them: the
 * blocks are taken, filled and sealed (deduped, logged, checksummed) by the
 * same code as any commit. Only a run that continues the sequence's local hit
 * at exactly the depth the records were verified for is imported; the local
 * state may have changed while the lock was released for the fetch. Returns
 * 0 (nothing imported is not an error: the caller computes the rest) or the
 * commit point's error. */
static int tier_import(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *prompt,
                       const pkv_tier_got *got) {
    const uint32_t bs = c->pool.block_size;
    pkv_seq *s = pkv_seqmap_get(&c->seqs, id);
    if (!s || pkv_wal_writable(c) || s->len != s->committed ||
        s->len != (uint64_t)s->nblocks * bs || s->salt != salt)
        return 0;
    /* The lock was released since the local open: another thread may have
     * closed and reopened this id, or truncated and refilled it. The records
     * continue exactly prompt[0, at * bs) under `salt`, so the sequence must
     * hold exactly those tokens. */
    for (uint32_t i = 0; i < s->nblocks; i++)
        if (memcmp(pkv_pool_tokens(&c->pool, s->blocks[i]), prompt + (uint64_t)i * bs,
                   bs * sizeof *prompt) != 0)
            return 0;
    uint64_t at = s->nblocks;
    if (at < got->first || at >= (uint64_t)got->first + got->n) return 0;
    uint64_t k = (uint64_t)got->first + got->n - at, nt = k * bs;
    pkv_slot *slots = malloc(nt * sizeof *slots);
    if (!slots) return 0;
    int rc = step_general(c, id, 0, prompt + at * bs, nt, slots);
    free(slots);
    s = pkv_seqmap_get(&c->seqs, id);
    if (rc || !s) return 0;
    if (s->committed != at * bs || s->len != (at + k) * bs) return 0; /* raced */
    for (uint64_t i = 0; i < k; i++)
        memcpy(pkv_arena_block(&c->arena, s->blocks[at + i]),
               got->payloads[at - got->first + i], c->arena.geo.block_bytes);
    pkv_tier_importing(c, true); /* not published back */
    rc = step_general(c, id, nt, NULL, 0, NULL);
    pkv_tier_importing(c, false);
    if (rc) { /* drop the appended blocks: open, never logged, so simply freed */
        release_from(c, s, (uint32_t)at);
        s->len = s->committed;
        s->pf_ok = false;
        int frc = finish(c);
        return frc ? frc : 0;
    }
    pkv_tier_count_imported(c, k);
    return finish(c);
}

int pkv_seq_append(pkv_cache *c, uint64_t id, const uint32_t *tokens, size_t n,
                   pkv_slot *slots) {
    if (!tokens || !slots || n == 0)
        return pkv_err(PKV_EINVAL, "append needs tokens, slots and n > 0");
    PKV_REMOTE(c, pkv_remote_commit_append(c, id, 0, tokens, n, slots));
    MUTATING_ENTRY(c);
    int rc = step_locked(c, id, 0, tokens, n, slots);
    if (!rc) rc = pkv_wal_commit_point(c);
    pkv_unlock(c);
    return rc;
}

int pkv_seq_commit(pkv_cache *c, uint64_t id, size_t n) {
    if (n == 0) return pkv_err(PKV_EINVAL, "commit of 0 tokens");
    PKV_REMOTE(c, pkv_remote_commit_append(c, id, n, NULL, 0, NULL));
    MUTATING_ENTRY(c);
    int rc = step_locked(c, id, n, NULL, 0, NULL);
    if (!rc) rc = pkv_wal_commit_point(c);
    pkv_unlock(c);
    return rc;
}

int pkv_seq_commit_append(pkv_cache *c, uint64_t id, size_t n_commit, const uint32_t *tokens,
                          size_t n, pkv_slot *slots) {
    if (n && (!tokens || !slots))
        return pkv_err(PKV_EINVAL, "append of %zu tokens needs tokens and slots", n);
    if (n_commit == 0 && n == 0) return pkv_err(PKV_EINVAL, "nothing to commit or append");
    PKV_REMOTE(c, pkv_remote_commit_append(c, id, n_commit, tokens, n, slots));
    MUTATING_ENTRY(c);
    int rc = step_locked(c, id, n_commit, tokens, n, slots);
    if (!rc) rc = pkv_wal_commit_point(c);
    pkv_unlock(c);
    return rc;
}

/* The steps run in order, each exactly as pkv_seq_commit_append would (the log
 * throttle and the writability check included), under one lock acquisition; the
 * freed blocks of each step are stamped before the next, so a later step can wait
 * for them like a later call. Durability is waited for once, after the last. */
int pkv_seq_step_batch(pkv_cache *c, pkv_step *steps, size_t n, size_t *done) {
    if (done) *done = 0;
    if (!steps || n == 0) return pkv_err(PKV_EINVAL, "a batch needs steps and n > 0");
    PKV_REMOTE(c, pkv_remote_step_batch(c, steps, n, done));
    MUTATING_ENTRY(c);
    int rc = 0;
    size_t i = 0;
    uint32_t *ahead = NULL; /* blocks checksummed ahead (seal_threads > 1) */
    size_t nahead = pkv_seal_sums_ahead(c, steps, n, &ahead);
    for (; i < n; i++) {
        pkv_step *st = &steps[i];
        if (i) {
            pkv_wal_throttle(c);
            if ((rc = pkv_wal_writable(c))) break;
        }
        if ((rc = step_locked(c, st->id, st->n_commit, &st->token, 1, &st->slot))) break;
    }
    if (nahead) pkv_seal_sums_done(c, ahead, nahead);
    if (i) {
        int wrc = pkv_wal_commit_point(c);
        if (!rc) rc = wrc;
    }
    if (done) *done = i;
    pkv_unlock(c);
    return rc;
}

int pkv_seq_fork(pkv_cache *c, uint64_t parent, uint64_t child) {
    PKV_REMOTE(c, pkv_remote_fork(c, parent, child));
    MUTATING_ENTRY(c);
    int rc = 0;
    pkv_seq *p = find_seq(c, parent, &rc), *s;
    if (!p) goto out;
    if (pkv_seqmap_get(&c->seqs, child)) {
        rc = pkv_err(PKV_EEXIST, "sequence %llu already exists", (unsigned long long)child);
        goto out;
    }
    if (p->len != p->committed) {
        rc = pkv_err(PKV_ESTATE, "sequence %llu has %llu pending tokens; commit first",
                     (unsigned long long)parent,
                     (unsigned long long)(p->len - p->committed));
        goto out;
    }
    if ((rc = pkv_seqmap_reserve(&c->seqs)) ||
        (rc = pkv_wal_reserve(c, pkv_log_seq_set_size(p->nblocks, c->pool.block_size))))
        goto out;
    if (!(s = seq_alloc(child, p->salt, p->nblocks))) {
        rc = pkv_err(PKV_ENOMEM, "sequence %llu", (unsigned long long)child);
        goto out;
    }
    /* An empty parent may have no table at all: memcpy from NULL is undefined
     * even for 0 bytes. */
    if (p->nblocks) memcpy(s->blocks, p->blocks, (size_t)p->nblocks * sizeof *s->blocks);
    s->nblocks = p->nblocks;
    for (uint32_t i = 0; i < s->nblocks; i++) pkv_block_acquire(c, s->blocks[i]);
    s->len = p->len;
    s->committed = p->committed;
    pkv_seqmap_insert(&c->seqs, s);
    pkv_log_seq_set(c, s);
    rc = finish(c);
out:
    pkv_unlock(c);
    return rc;
}

static void release_from(pkv_cache *c, pkv_seq *s, uint32_t keep) {
    enum { AHEAD = 8 };
    while (s->nblocks > keep) {
        if (s->nblocks > keep + AHEAD)
            pkv_prefetch(&c->pool.b[s->blocks[s->nblocks - 1 - AHEAD]]);
        pkv_block_release(c, s->blocks[--s->nblocks]);
    }
}

int pkv_seq_truncate(pkv_cache *c, uint64_t id, size_t new_len) {
    PKV_REMOTE(c, pkv_remote_truncate(c, id, new_len));
    MUTATING_ENTRY(c);
    int rc = 0;
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    pkv_seq *s;
retry:
    s = find_seq(c, id, &rc);
    if (!s) goto out;
    if (new_len > s->len) {
        rc = pkv_err(PKV_ERANGE, "truncate to %zu beyond length %llu", new_len,
                     (unsigned long long)s->len);
        goto out;
    }
    if (new_len == s->len) goto out;
    pkv_log_settle(c, s);
    uint32_t keep = (uint32_t)blocks_for(new_len, bs);
    uint32_t off = (uint32_t)(new_len % bs);
    uint32_t cut = off ? s->blocks[keep - 1] : PKV_NONE;
    /* Copy a cut block that is shared or sealed, and one whose committed tokens
     * are cut (the durable state may still name them until TRUNC is safe: rule D4;
     * the original goes to limbo, rule D2). */
    bool copy = off && (p->b[cut].ref > 1 || p->b[cut].state == BLK_SEALED ||
                        new_len < s->committed);
    if (copy && (rc = ensure_blocks(c, 1, "truncate")) == 1) goto retry;
    if (rc) goto out;
    if ((rc = pkv_wal_reserve(c, pkv_log_trunc_size(bs) + pkv_log_evict_size()))) goto out;
    uint32_t nb = PKV_NONE;
    if (copy) {
        nb = take_block(c);
        pkv_arena_copy_tokens(&c->arena, nb, cut, off);
        memcpy(pkv_pool_tokens(p, nb), pkv_pool_tokens(p, cut), (size_t)off * sizeof(uint32_t));
        c->ctr.cow_copies++;
        c->wal.arena_dirty = true;
    }
    /* A batch's checksum computed ahead (sealsum.c) no longer holds for a block
     * whose cut slots a later append may rewrite. */
    if (off && !copy) p->b[cut].flags &= (uint8_t)~BLKF_PRESUM;
    /* Cutting committed tokens: until the TRUNC is safe the durable table names
     * the sealed blocks released here, so they are marked NAMED (rule D3 keeps
     * their slots until the records before their release are safe) and the TRUNC
     * goes first (the release LSN is the next one). */
    if (new_len < s->committed) {
        for (uint32_t i = keep - (copy ? 1 : 0); i < s->nblocks; i++)
            if (p->b[s->blocks[i]].state == BLK_SEALED) p->b[s->blocks[i]].flags |= BLKF_NAMED;
        s->committed = new_len;
        pkv_log_trunc(c, s, nb);
    }
    release_from(c, s, keep); /* tail-first: children before parents */
    if (copy) {
        s->blocks[keep - 1] = nb;
        pkv_block_release(c, cut);
    }
    s->len = new_len;
    s->pf_ok = false;
    rc = finish(c);
out:
    pkv_unlock(c);
    return rc;
}

int pkv_seq_close(pkv_cache *c, uint64_t id) {
    PKV_REMOTE(c, pkv_remote_seq_close(c, id));
    MUTATING_ENTRY(c);
    int rc = 0;
    pkv_seq *s = find_seq(c, id, &rc);
    if (!s) goto out;
    pkv_log_settle(c, s); /* off the lagging list before it is freed */
    if ((rc = pkv_wal_reserve(c, pkv_log_close_size()))) goto out;
    pkv_log_close(c, id);
    release_from(c, s, 0);
    pkv_seqmap_remove(&c->seqs, id);
    seq_free(s);
    rc = finish(c);
out:
    pkv_unlock(c);
    return rc;
}

int pkv_seq_get_info(pkv_cache *c, uint64_t id, pkv_seq_info *out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    PKV_REMOTE(c, pkv_remote_get_info(c, id, out));
    LOCKED_ENTRY(c);
    int rc = 0;
    pkv_seq *s = find_seq(c, id, &rc);
    if (s) {
        out->len = s->len;
        out->committed = s->committed;
        out->n_blocks = s->nblocks;
        out->salt = s->salt;
    }
    pkv_unlock(c);
    return rc;
}

int pkv_seq_blocks(pkv_cache *c, uint64_t id, uint32_t *out, size_t cap, size_t *n) {
    if (cap && !out) return pkv_err(PKV_EINVAL, "out is NULL with cap = %zu", cap);
    PKV_REMOTE(c, pkv_remote_list(c, false, id, out, cap, n));
    LOCKED_ENTRY(c);
    int rc = 0;
    pkv_seq *s = find_seq(c, id, &rc);
    if (!s) goto out;
    if (n) *n = s->nblocks;
    size_t m = s->nblocks < cap ? s->nblocks : cap;
    if (m) memcpy(out, s->blocks, m * sizeof *out);
    if (cap < s->nblocks)
        rc = pkv_err(PKV_ERANGE, "block table has %u entries, buffer %zu", s->nblocks, cap);
out:
    pkv_unlock(c);
    return rc;
}

int pkv_seq_tokens(pkv_cache *c, uint64_t id, uint32_t *out, size_t cap, size_t *n) {
    if (cap && !out) return pkv_err(PKV_EINVAL, "out is NULL with cap = %zu", cap);
    PKV_REMOTE(c, pkv_remote_list(c, true, id, out, cap, n));
    LOCKED_ENTRY(c);
    int rc = 0;
    const uint32_t bs = c->pool.block_size;
    pkv_seq *s = find_seq(c, id, &rc);
    if (!s) goto out;
    if (n) *n = s->len;
    uint64_t m = s->len < cap ? s->len : cap;
    for (uint64_t i = 0; i < m; i += bs) {
        uint64_t k = m - i < bs ? m - i : bs;
        memcpy(out + i, pkv_pool_tokens(&c->pool, s->blocks[i / bs]), k * sizeof *out);
    }
    if (cap < s->len)
        rc = pkv_err(PKV_ERANGE, "sequence has %llu tokens, buffer %zu",
                     (unsigned long long)s->len, cap);
out:
    pkv_unlock(c);
    return rc;
}

int pkv_seq_list(pkv_cache *c, uint64_t *ids, size_t cap, size_t *n) {
    if (cap && !ids) return pkv_err(PKV_EINVAL, "ids is NULL with cap = %zu", cap);
    PKV_LOCAL_ONLY(c, "pkv_seq_list");
    LOCKED_ENTRY(c);
    size_t k = 0;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        const pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        if (k < cap) ids[k] = s->id;
        k++;
    }
    if (n) *n = k;
    int rc = k > cap ? pkv_err(PKV_ERANGE, "%zu sequences, buffer %zu", k, cap) : 0;
    pkv_unlock(c);
    return rc;
}

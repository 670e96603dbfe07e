/*
 * blockpool.c — the block life cycle: per-block metadata, token ids, the intrusive
 * lists, and every transition of a block's state, each performed by one function
 * here (the eviction policy, evict.c, only chooses and orders; the layers above
 * decide when and log what they did: this file writes no log record; it reads
 * the log's LSN clock, next_lsn and the safe LSN, to stamp releases).
 *
 *     FREE    --pkv_block_alloc------------------> OPEN, ref 1
 *     CACHED  --pkv_block_alloc (evicts the policy's victim; *evicted = true,
 *               the caller logs EVICT; rule D3 holds: ensure_blocks waited)--> OPEN, ref 1
 *     OPEN    --pkv_block_acquire (fork)----------> OPEN, ref + 1
 *     OPEN    --pkv_block_seal (ref 1; the caller logs SEAL)--> USED (sealed, ref 1)
 *     CACHED  --pkv_block_acquire------------------> USED (leaves the policy's lists)
 *     USED    --pkv_block_release (ref -> 0)-------> CACHED (on the policy's lists)
 *     OPEN    --pkv_block_release (ref -> 0)-------> FREE, or LIMBO if a record named
 *               it (BLKF_NAMED, rule D2)
 *     LIMBO   --pkv_limbo_stamp, then pkv_limbo_drain (its freeing record safe)--> FREE
 *     SEALED, UNVERIFIED --pkv_block_verify--> SEALED verified, or BAD (the caller
 *               logs BAD; PKV_VERIFY_FAILED says it just failed)
 *     SEALED, UNVERIFIED --pkv_block_verify_quiet (lookup)--> SEALED verified on a
 *               pass; unchanged on a failure (the next serving path marks it BAD)
 *     any     --pkv_pool_rebuild (recovery)--------> the state the recovered tables
 *               and sealed blocks imply: refcounts, lists, index, flags
 *
 * CACHED = SEALED with ref 0, USED = ref > 0. Invariants (docs/design.md, I1-I4,
 * I11): ref = number of block-table entries naming the block; a FREE block is on
 * the free list or in limbo; on the policy's lists iff SEALED with ref 0; free + limbo +
 * cached + used = capacity, where used counts ref > 0; a block enters a table only
 * verified (rule S1, asserted in pkv_block_acquire).
 * Limbo (FIFO) holds open blocks freed while the log's durable state may still
 * name them, so a crash can never find a recovered sequence's slot reused. Only
 * blocks some record named (BLKF_NAMED, set by wal/record.c) need that; one that
 * only ever held pending tokens goes straight to the free list.
 * Lists are doubly linked through pkv_block.prev/next (block indices), so every
 * operation is O(1) and allocation-free. Also the depth of every sealed block in
 * its chain (pkv_pool_depths), for recovery and kvdump.
 */
#include "internal.h"

#include <stdlib.h>

static size_t pool_token_bytes(const pkv_pool *p) {
    return (size_t)p->capacity * p->block_size * sizeof(uint32_t);
}

int pkv_pool_init(pkv_pool *p, uint32_t capacity, uint32_t block_size) {
    memset(p, 0, sizeof *p);
    p->capacity = capacity;
    p->block_size = block_size;
    p->bs_shift = (block_size & (block_size - 1)) ? -1 : __builtin_ctz(block_size);
    size_t meta_bytes = (size_t)capacity * sizeof(pkv_block);
    p->b = pkv_huge_alloc(meta_bytes);
    p->tokens = pkv_huge_alloc(pool_token_bytes(p));
    p->ckdirty = calloc(((size_t)capacity + 63) / 64, sizeof *p->ckdirty);
    if (PKV_INTERNAL_CHECKS) p->ckshadow = calloc(capacity, sizeof *p->ckshadow);
    if (!p->b || !p->tokens || !p->ckdirty || (PKV_INTERNAL_CHECKS && !p->ckshadow)) {
        pkv_pool_free(p);
        return pkv_err(PKV_ENOMEM, "block metadata for %u blocks", capacity);
    }
    p->free.head = p->free.tail = PKV_NONE;
    pkv_evict_init(&p->pol, PKV_EVICT_LEAF_LRU, 50, capacity);
    for (uint32_t i = 0; i < capacity; i++) {
        p->b[i].parent = PKV_NONE;
        p->b[i].state = BLK_FREE;
        pkv_list_push_tail(p, &p->free, LIST_FREE, i);
    }
    return 0;
}

void pkv_pool_free(pkv_pool *p) {
    pkv_huge_free(p->b, (size_t)p->capacity * sizeof(pkv_block));
    pkv_huge_free(p->tokens, pool_token_bytes(p));
    free(p->ckdirty);
    free(p->ckshadow);
    p->ckshadow = NULL;
    p->b = NULL;
    p->tokens = NULL;
    p->ckdirty = NULL;
}

void pkv_list_push_tail(pkv_pool *p, pkv_list *l, uint8_t which, uint32_t b) {
    pkv_block *x = &p->b[b];
    pkv_assert(x->list == LIST_NONE);
    x->list = which;
    x->next = PKV_NONE;
    x->prev = l->tail;
    if (l->tail != PKV_NONE) p->b[l->tail].next = b;
    else l->head = b;
    l->tail = b;
    l->count++;
}

void pkv_list_push_head(pkv_pool *p, pkv_list *l, uint8_t which, uint32_t b) {
    pkv_block *x = &p->b[b];
    pkv_assert(x->list == LIST_NONE);
    x->list = which;
    x->prev = PKV_NONE;
    x->next = l->head;
    if (l->head != PKV_NONE) p->b[l->head].prev = b;
    else l->tail = b;
    l->head = b;
    l->count++;
}

void pkv_list_remove(pkv_pool *p, pkv_list *l, uint32_t b) {
    pkv_block *x = &p->b[b];
    pkv_assert(x->list != LIST_NONE && l->count > 0);
    if (x->prev != PKV_NONE) p->b[x->prev].next = x->next;
    else l->head = x->next;
    if (x->next != PKV_NONE) p->b[x->next].prev = x->prev;
    else l->tail = x->prev;
    x->prev = x->next = PKV_NONE;
    x->list = LIST_NONE;
    l->count--;
}

/* CACHED -> FREE: the block leaves the index and its parent's child count. Its
 * slot is reused at once by the allocation that evicts it: a crash before the
 * EVICT record is durable finds the block still sealed (its SEAL is safe, rule
 * D3), and its payload checksum turns the stale slot into a miss once verified
 * (rule S1). */
static uint32_t evict(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint32_t b = pkv_evict_victim(c);
    if (b == PKV_NONE) return PKV_NONE;
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_SEALED && x->ref == 0 && x->nchild == 0);
    /* rule D3: the caller waited until the records before its release (its SEAL,
     * the TRUNC that released it) are safe (seq.c ensure_blocks) */
    pkv_assert(!c->wal.running || !(x->flags & BLKF_NAMED) ||
               x->rel_lsn <= pkv_wal_safe_lsn(&c->wal) + 1);
    pkv_index_remove(&c->index, x->hash.lo, b);
    if (x->parent != PKV_NONE) {
        pkv_assert(p->b[x->parent].nchild > 0);
        p->b[x->parent].nchild--;
    }
    x->state = BLK_FREE;
    x->parent = PKV_NONE;
    x->flags = 0;
    pkv_ckpt_touch(p, b);
    p->n_sealed--;
    c->ctr.evictions++;
    return b;
}

uint32_t pkv_block_alloc(pkv_cache *c, bool *evicted) {
    pkv_pool *p = &c->pool;
    uint32_t b = p->free.head;
    *evicted = b == PKV_NONE;
    if (b != PKV_NONE) pkv_list_remove(p, &p->free, b);
    else b = evict(c);
    pkv_assert(b != PKV_NONE); /* callers check pkv_available() first */
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_FREE && x->ref == 0 && x->nchild == 0);
    x->state = BLK_OPEN;
    x->ref = 1;
    x->parent = PKV_NONE;
    p->n_used++;
    p->ref_total++;
    return b;
}

void pkv_block_acquire(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    pkv_assert(x->state != BLK_FREE);
    /* rule S1: only a verified block enters a table (callers verify first) */
    pkv_assert(!(x->flags & (BLKF_BAD | BLKF_UNVERIFIED)));
    c->pool.ref_total++;
    if (x->ref++ == 0) {
        pkv_assert(x->state == BLK_SEALED);
        pkv_evict_on_referenced(c, b);
        c->pool.n_used++;
    }
}

void pkv_block_release(pkv_cache *c, uint32_t b) {
    pkv_pool *p = &c->pool;
    pkv_block *x = &p->b[b];
    pkv_assert(x->ref > 0 && x->state != BLK_FREE);
    pkv_evict_on_release(c, b);
    p->ref_total--;
    if (--x->ref > 0) return;
    p->n_used--;
    if (x->state == BLK_SEALED) {
        x->rel_lsn = c->wal.next_lsn; /* recency, for the policy's order at recovery */
        pkv_ckpt_touch(p, b);
        pkv_evict_on_unreferenced(c, b);
        return;
    }
    bool named = x->flags & BLKF_NAMED;
    x->state = BLK_FREE;
    x->flags = 0;
    if (c->wal.running && named) {
        /* The durable state may still name this block until the record of the
         * call that freed it is safe: park it in limbo until then (rule D2). A block no
         * record ever named (it only held pending tokens: rejected draft tokens
         * that spilled into a new block, a tail never committed) cannot be in any
         * durable state, so it is free at once and nothing waits for the log. */
        x->rel_lsn = PKV_LSN_PENDING;
        pkv_list_push_tail(p, &c->limbo, LIST_LIMBO, b);
    } else {
        pkv_list_push_tail(p, &p->free, LIST_FREE, b);
    }
}

void pkv_block_seal(pkv_cache *c, uint32_t b, pkv_h128 h, uint32_t parent, uint64_t salt,
                    uint64_t sum) {
    pkv_pool *p = &c->pool;
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_OPEN && x->ref == 1);
    x->state = BLK_SEALED;
    x->hash = h;
    x->parent = parent;
    x->salt = salt;
    x->flags &= BLKF_NAMED; /* rule D3: its slot waits for this SEAL to be safe */
    x->payload_sum = sum;
    pkv_ckpt_touch(p, b);
    pkv_index_insert(&c->index, h.lo, b);
    p->n_sealed++;
    if (parent != PKV_NONE) p->b[parent].nchild++;
    c->ctr.seals++;
}

void pkv_limbo_stamp(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint64_t lsn = c->wal.next_lsn - 1;
    for (uint32_t b = c->limbo.tail; b != PKV_NONE && p->b[b].rel_lsn == PKV_LSN_PENDING;
         b = p->b[b].prev)
        p->b[b].rel_lsn = lsn;
}

void pkv_limbo_drain(pkv_cache *c, uint64_t safe) {
    pkv_pool *p = &c->pool;
    while (c->limbo.head != PKV_NONE && p->b[c->limbo.head].rel_lsn <= safe) {
        uint32_t b = c->limbo.head;
        pkv_list_remove(p, &c->limbo, b);
        pkv_list_push_tail(p, &p->free, LIST_FREE, b);
    }
}

/* Rule S1 (docs/format.md): every path that serves a recovered block calls this
 * first (attach, dedupe, recovered tables). */
pkv_verdict pkv_block_verify(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->flags & BLKF_BAD) return PKV_VERIFY_BAD;
    if (!(x->flags & BLKF_UNVERIFIED)) return PKV_VERIFY_OK;
    uint64_t sum = pkv_arena_sum(&c->arena, b);
    if (sum == x->payload_sum) {
        /* No dirty bit: a checkpoint entry's UNVERIFIED flag changes nothing,
         * since recovery marks every sealed block unverified anyway
         * (pkv_ckpt_digest leaves it out). */
        x->flags &= (uint8_t)~BLKF_UNVERIFIED;
        return PKV_VERIFY_OK;
    }
    x->flags = BLKF_BAD;
    pkv_ckpt_touch(&c->pool, b);
    c->ctr.verify_failures++;
    return PKV_VERIFY_FAILED;
}

bool pkv_block_verify_quiet(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->flags & BLKF_BAD) return false;
    if (!(x->flags & BLKF_UNVERIFIED)) return true;
    if (pkv_arena_sum(&c->arena, b) != x->payload_sum) return false;
    x->flags &= (uint8_t)~BLKF_UNVERIFIED; /* as pkv_block_verify: no dirty bit */
    return true;
}

/* Recovery's bulk transition. wal/replay.c has decided which sealed blocks and
 * which table entries survive; this gives every block the state that implies:
 * a sealed block is indexed and UNVERIFIED until its payload is checked (rule
 * S1); an open block a recovered table names is OPEN and NAMED, since the log
 * names it (rule D2); every other block is FREE. Refcounts come from the tables,
 * child counts from the chains, and the cached blocks go on the eviction
 * policy's lists in its order (pkv_evict_rebuild). d, stack: scratch for
 * pkv_pool_depths(). PKV_ENOMEM without scratch memory (the open fails). */
int pkv_pool_rebuild(pkv_cache *c, uint32_t *d, uint32_t *stack) {
    pkv_pool *p = &c->pool;
    const uint32_t cap = p->capacity;
    for (uint32_t b = 0; b < cap; b++) {
        p->b[b].ref = p->b[b].nchild = 0;
        p->b[b].list = LIST_NONE;
        p->b[b].prev = p->b[b].next = PKV_NONE;
    }
    p->ref_total = 0;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        pkv_seq *s = c->seqs.slots[i];
        if (s) {
            for (uint32_t j = 0; j < s->nblocks; j++) p->b[s->blocks[j]].ref++;
            p->ref_total += s->nblocks;
        }
    }
    p->free.head = p->free.tail = PKV_NONE;
    p->free.count = 0;
    pkv_evict_clear(&p->pol);
    p->n_used = p->n_sealed = 0;
    for (uint32_t b = 0; b < cap; b++) {
        pkv_block *x = &p->b[b];
        /* The index inserts are random accesses: start the miss some blocks ahead. */
        if (b + 16 < cap && p->b[b + 16].state == BLK_SEALED)
            pkv_index_prefetch(&c->index, p->b[b + 16].hash.lo);
        if (x->state == BLK_SEALED) {
            p->n_sealed++;
            x->flags |= BLKF_UNVERIFIED;
            if (x->parent != PKV_NONE) p->b[x->parent].nchild++;
            pkv_index_insert(&c->index, x->hash.lo, b);
        } else if (x->ref > 0) {
            x->state = BLK_OPEN; /* in a recovered table: the log names it */
            x->parent = PKV_NONE;
            x->flags = BLKF_NAMED;
        } else {
            x->state = BLK_FREE;
            x->parent = PKV_NONE;
            x->flags = 0;
            pkv_list_push_tail(p, &p->free, LIST_FREE, b);
        }
        if (x->ref > 0) p->n_used++;
    }
    pkv_pool_depths(p, d, stack);
    return pkv_evict_rebuild(c, d);
}

/* Depth of every sealed block (0 = root), iteratively; UINT32_MAX if its chain is
 * broken (a parent not sealed or of another salt) or cyclic. Recovery drops broken
 * chains with it (wal/replay.c); kvdump draws depths with it. Each block is walked
 * once: the blocks of the current walk are marked, so reaching one is a cycle (a
 * walk that ran on until it had taken capacity steps cost O(capacity) per cycle,
 * O(capacity²) for a forged checkpoint of self-parented blocks). */
void pkv_pool_depths(const pkv_pool *p, uint32_t *d, uint32_t *stack) {
    const uint32_t UNK = UINT32_MAX - 1, BAD = UINT32_MAX, WALK = UINT32_MAX - 3;
    for (uint32_t b = 0; b < p->capacity; b++) d[b] = UNK;
    for (uint32_t b = 0; b < p->capacity; b++) {
        if (p->b[b].state != BLK_SEALED || d[b] != UNK) continue;
        uint32_t n = 0, x = b, base;
        for (;;) {
            if (d[x] == WALK) { base = BAD; break; } /* cycle */
            if (d[x] != UNK) { base = d[x]; break; }
            pkv_assert(n <= p->capacity);
            d[x] = WALK;
            stack[n++] = x;
            uint32_t par = p->b[x].parent;
            if (par == PKV_NONE) { base = UINT32_MAX - 2; break; } /* root: depth -1 + 1 */
            if (par >= p->capacity || p->b[par].state != BLK_SEALED ||
                p->b[par].salt != p->b[x].salt) { base = BAD; break; }
            x = par;
        }
        while (n--) {
            uint32_t y = stack[n];
            if (base == BAD) d[y] = BAD;
            else d[y] = base = (base == UINT32_MAX - 2 ? 0 : base + 1);
        }
    }
}

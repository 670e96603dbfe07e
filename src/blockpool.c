/*
 * blockpool.c — per-block metadata, token ids, the intrusive lists, and the
 * refcount transitions of a block's life:
 *
 *     FREE --alloc--> OPEN (ref 1) --seal (seq.c)--> SEALED
 *     OPEN, ref -> 0:   back to FREE (free list)
 *     SEALED, ref -> 0: cached (eviction policy, evict.c) --evict--> FREE
 *
 * Invariants (docs/design.md, I1-I4): ref = number of block-table entries naming
 * the block; a FREE block is on the free list or in limbo; on the LRU iff SEALED
 * with ref 0; free + limbo + cached + used = capacity, where used counts ref > 0.
 * Limbo (FIFO) holds open blocks freed while the log's durable state may still
 * name them; the flusher moves them to the free list once the freeing record is
 * safe (wal/log.c), so a crash can never find a recovered sequence's slot reused.
 * Only blocks some record named (BLKF_NAMED, set by wal/record.c) need that; one
 * that only ever held pending tokens goes straight to the free list.
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
    p->lru.head = p->lru.tail = PKV_NONE;
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

uint32_t pkv_block_alloc(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint32_t b = p->free.head;
    if (b != PKV_NONE) pkv_list_remove(p, &p->free, b);
    else b = pkv_evict_one(c);
    pkv_assert(b != PKV_NONE); /* callers check pkv_available() first */
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_FREE && x->ref == 0 && x->nchild == 0);
    x->state = BLK_OPEN;
    x->ref = 1;
    x->parent = PKV_NONE;
    p->n_used++;
    return b;
}

void pkv_block_acquire(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    pkv_assert(x->state != BLK_FREE);
    /* rule S1: only a verified block enters a table (callers verify first) */
    pkv_assert(!(x->flags & (BLKF_BAD | BLKF_UNVERIFIED)));
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
    if (--x->ref > 0) return;
    p->n_used--;
    if (x->state == BLK_SEALED) {
        x->rel_lsn = c->wal.next_lsn; /* recency, for the LRU order at recovery */
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

void pkv_limbo_stamp(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint64_t lsn = c->wal.next_lsn - 1;
    for (uint32_t b = c->limbo.tail; b != PKV_NONE && p->b[b].rel_lsn == PKV_LSN_PENDING;
         b = p->b[b].prev)
        p->b[b].rel_lsn = lsn;
}

/* Rule S1 (docs/format.md): every path that serves a recovered block calls this
 * first (attach, dedupe, recovered tables). */
bool pkv_block_verify(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->flags & BLKF_BAD) return false;
    if (!(x->flags & BLKF_UNVERIFIED)) return true;
    uint64_t sum = pkv_arena_sum(&c->arena, b);
    if (sum == x->payload_sum) {
        /* No dirty bit: a checkpoint entry's UNVERIFIED flag changes nothing,
         * since recovery marks every sealed block unverified anyway
         * (pkv_ckpt_digest leaves it out). */
        x->flags &= (uint8_t)~BLKF_UNVERIFIED;
        return true;
    }
    x->flags = BLKF_BAD;
    pkv_ckpt_touch(&c->pool, b);
    c->ctr.verify_failures++;
    /* Persist the verdict, so no later recovery serves or indexes it again
     * (callers that can verify while the log runs reserve room for this). */
    if (c->wal.running) pkv_log_bad(c, b);
    return false;
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

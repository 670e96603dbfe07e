/*
 * evict.c — leaf-first LRU eviction of cached blocks (sealed, refcount 0).
 *
 * One intrusive list holds every cached block in the order its refcount last
 * dropped to 0 (head = oldest). Sequences release their blocks tail-first
 * (seq.c), and a block can only be referenced together with its parent, so a
 * block's cached children always sit before it in this list (invariant I7 of
 * docs/design.md). Hence the head is always a leaf: it has no cached children,
 * and evicting it is exactly "the least recently used unreferenced leaf", in
 * O(1), without ever stranding an extension behind an evicted prefix.
 *
 * Evicting a block logs an EVICT record (callers reserve log room for one per
 * block they may allocate), removes it from the prefix index and decrements its
 * parent's child count; the parent stays where it is in the list and becomes a leaf when
 * its last cached child is gone.
 */
#include "internal.h"

void pkv_evict_on_unreferenced(pkv_cache *c, uint32_t b) {
    pkv_list_push_tail(&c->pool, &c->pool.lru, LIST_LRU, b);
}

void pkv_evict_on_referenced(pkv_cache *c, uint32_t b) {
    pkv_list_remove(&c->pool, &c->pool.lru, b);
}

/* The next pkv_block_alloc takes the free list's head or, with none free, evicts
 * the LRU head: its record, its LRU successor and parent records and its index slot
 * are then written, each a likely cache miss on a large cache. A decoder calls this
 * a few tokens before its block fills: stage 0 prefetches the head records, stage 1
 * (a token later, the head record now cached) the lines that record points to. */
void pkv_alloc_prefetch(const pkv_cache *c, int stage) {
    const pkv_pool *p = &c->pool;
    if (p->free.head != PKV_NONE) {
        if (stage == 0) pkv_prefetch(&p->b[p->free.head]);
        else pkv_prefetch(pkv_pool_tokens(p, p->free.head));
        return;
    }
    uint32_t b = p->lru.head;
    if (b == PKV_NONE) return;
    const pkv_block *x = &p->b[b];
    if (stage == 0) {
        pkv_prefetch(x);
        return;
    }
    if (x->next != PKV_NONE) pkv_prefetch(&p->b[x->next]);
    if (x->parent != PKV_NONE) pkv_prefetch(&p->b[x->parent]);
    pkv_index_prefetch(&c->index, x->hash.lo);
    pkv_prefetch(pkv_pool_tokens(p, b));
}

uint32_t pkv_evict_one(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint32_t b = p->lru.head;
    if (b == PKV_NONE) return PKV_NONE;
    pkv_block *x = &p->b[b];
    pkv_assert(x->state == BLK_SEALED && x->ref == 0 && x->nchild == 0);
    /* rule D3: the caller waited until its SEAL is safe (seq.c ensure_blocks) */
    pkv_assert(!c->wal.running || !(x->flags & BLKF_NAMED) ||
               x->rel_lsn <= pkv_wal_safe_lsn(&c->wal) + 1);
    pkv_list_remove(p, &p->lru, b);
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
    /* Reused at once: a crash before this record is durable finds the block
     * still sealed (its SEAL is safe, rule D3), and its payload checksum turns the
     * stale slot into a miss once verified (rule S1). */
    if (c->wal.running) pkv_log_evict(c, b);
    c->ctr.evictions++;
    return b;
}

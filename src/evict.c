/*
 * evict.c — the eviction policy: leaf-first LRU over the cached blocks (sealed,
 * refcount 0). It decides which cached block goes next and in what order the
 * cached blocks stand; the block pool (blockpool.c) performs every state change
 * and calls in here: on a release to ref 0 (pkv_evict_on_unreferenced), on an
 * acquire from ref 0 (pkv_evict_on_referenced), to take a victim
 * (pkv_evict_victim), and at recovery to order the cached blocks
 * (pkv_evict_rebuild). Nothing here writes a log record.
 *
 * One intrusive list holds every cached block in the order its refcount last
 * dropped to 0 (head = oldest). Sequences release their blocks tail-first
 * (seq.c), and a block can only be referenced together with its parent, so a
 * block's cached children always sit before it in this list (invariant I7 of
 * docs/design.md). Hence the head is always a leaf: it has no cached children,
 * and evicting it is exactly "the least recently used unreferenced leaf", in
 * O(1), without ever stranding an extension behind an evicted prefix.
 */
#include "internal.h"

#include <stdlib.h>

/* A release is stamped with next_lsn, which only grows, and goes behind every
 * block recovery put on the list: so among the blocks released since the open
 * (the only ones that can carry BLKF_NAMED) release LSNs ascend, and the tail is
 * the newest of them, which rule D3's check in seq.c (evict_wait_lsn) relies on.
 * (A forged log can give recovered blocks larger LSNs; they are never NAMED.) */
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
        pkv_prefetch(&p->b[p->lru.tail]); /* rule D3's check reads the newest release */
        return;
    }
    if (x->next != PKV_NONE) pkv_prefetch(&p->b[x->next]);
    if (x->parent != PKV_NONE) pkv_prefetch(&p->b[x->parent]);
    pkv_index_prefetch(&c->index, x->hash.lo);
    pkv_prefetch(pkv_pool_tokens(p, b));
}

/* Always the LRU head: rule D3's wait (seq.c evict_wait_lsn) checks the blocks
 * from the head on; a policy that chooses otherwise must tell it which. */
uint32_t pkv_evict_victim(pkv_cache *c) {
    uint32_t b = c->pool.lru.head;
    if (b != PKV_NONE) pkv_list_remove(&c->pool, &c->pool.lru, b);
    return b;
}

/* ---- Recovery: the order of the cached blocks ------------------------------ */

typedef struct lru_ent {
    uint64_t rel;
    uint32_t depth, block;
} lru_ent;

/* Sort into LRU order: release LSN ascending, then depth descending (children
 * first), then block ascending. The entries arrive in block order, so a stable
 * LSD radix sort by depth descending and then by release LSN gives exactly that
 * order; byte positions where every key agrees are skipped. O(n), where qsort was
 * the largest single item of a 1M-block rebuild. PKV_ENOMEM without scratch memory
 * (the open fails). */
static int sort_lru(lru_ent *a, size_t n) {
    if (n < 2) return 0;
    lru_ent *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return pkv_err(PKV_ENOMEM, "recovery scratch");
    pkv_hint_huge(tmp, n * sizeof *tmp);
    static const int NB = 12; /* 4 bytes of ~depth, then 8 bytes of the LSN */
    size_t (*cnt)[256] = calloc((size_t)NB, sizeof *cnt);
    if (!cnt) {
        free(tmp);
        return pkv_err(PKV_ENOMEM, "recovery scratch");
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t d = ~a[i].depth;
        uint64_t r = a[i].rel;
        for (int b = 0; b < 4; b++) cnt[b][(d >> (8 * b)) & 255]++;
        for (int b = 0; b < 8; b++) cnt[4 + b][(r >> (8 * b)) & 255]++;
    }
    lru_ent *src = a, *dst = tmp;
    for (int b = 0; b < NB; b++) {
        size_t *h = cnt[b], sum = 0;
        bool trivial = false;
        for (int v = 0; v < 256; v++) {
            if (h[v] == n) trivial = true;
            size_t k = h[v];
            h[v] = sum;
            sum += k;
        }
        if (trivial) continue;
        for (size_t i = 0; i < n; i++) {
            unsigned v = b < 4 ? (~src[i].depth >> (8 * b)) & 255
                               : (unsigned)(src[i].rel >> (8 * (b - 4))) & 255;
            dst[h[v]++] = src[i];
        }
        lru_ent *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
    free(cnt);
    free(tmp);
    return 0;
}

int pkv_evict_rebuild(pkv_cache *c, const uint32_t *d) {
    pkv_pool *p = &c->pool;
    const uint32_t cap = p->capacity;
    lru_ent *lru = malloc((size_t)cap * sizeof *lru);
    if (!lru) return pkv_err(PKV_ENOMEM, "recovery scratch");
    pkv_hint_huge(lru, (size_t)cap * sizeof *lru);
    /* Leaf-first (I7) must hold whatever release LSNs the log or checkpoint
     * holds: a correct writer never releases a child after its parent, but a
     * forged or damaged file can, and sorting by release LSN alone would then put
     * a parent ahead of its cached child. Raise each block's release LSN to the
     * largest of its descendants', deepest blocks first (sort_lru with equal keys
     * orders by depth, deepest first), so the LRU sort below is leaf-first in
     * every case. */
    size_t ns = 0;
    for (uint32_t b = 0; b < cap; b++)
        if (p->b[b].state == BLK_SEALED) lru[ns++] = (lru_ent){0, d[b], b};
    int rc = sort_lru(lru, ns);
    if (rc) {
        free(lru);
        return rc;
    }
    for (size_t i = 0; i < ns; i++) {
        const pkv_block *x = &p->b[lru[i].block];
        if (x->parent != PKV_NONE && p->b[x->parent].rel_lsn < x->rel_lsn)
            p->b[x->parent].rel_lsn = x->rel_lsn;
    }
    size_t nl = 0;
    for (uint32_t b = 0; b < cap; b++) {
        const pkv_block *x = &p->b[b];
        if (x->state == BLK_SEALED && x->ref == 0) lru[nl++] = (lru_ent){x->rel_lsn, d[b], b};
    }
    rc = sort_lru(lru, nl);
    if (!rc)
        for (size_t i = 0; i < nl; i++) pkv_list_push_tail(p, &p->lru, LIST_LRU, lru[i].block);
    free(lru);
    return rc;
}

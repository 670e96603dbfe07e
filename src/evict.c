/*
 * evict.c — the eviction policy: which cached block (sealed, refcount 0) goes next
 * and in what order the cached blocks stand. The block pool (blockpool.c) performs
 * every state change and calls in here: on each release of a sealed block
 * (pkv_evict_on_release, internal.h), when its refcount drops to 0
 * (pkv_evict_on_unreferenced) or rises from 0 (pkv_evict_on_referenced), to take a
 * victim (pkv_evict_victim) and at recovery (pkv_evict_rebuild); seq.c asks which
 * LSN the next victims need safe (pkv_evict_wait_lsn, rule D3). Nothing here writes
 * a log record. The policy's data is pkv_policy (internal.h); pkv_options.eviction
 * picks the policy at each open (it is not stored: a reopen may pick another).
 *
 * PKV_EVICT_LEAF_LRU: one list, pol.lru, of every cached block in the order its
 * refcount last dropped to 0 (head = oldest). Sequences release their blocks
 * tail-first (seq.c), and a block can only be referenced together with its
 * parent, so a block's cached children always sit before it (invariant I7 of
 * docs/design.md). Hence the head is always a leaf, and evicting it is exactly
 * "the least recently used unreferenced leaf", in O(1), without ever stranding an
 * extension behind an evicted prefix.
 *
 * PKV_EVICT_LEAF_SLRU: the same order on two levels. A block acquired from
 * refcount 0 (a hit or a dedupe) is marked BLKF_REUSED, and each release of a
 * reused block marks its parent, so a parent is reused whenever a child is. At
 * refcount 0 a reused block goes to the protected list (pol.prot), others to
 * probation (pol.lru). prot holds at most prot_max blocks: beyond that its head
 * loses the mark and moves to the probation tail. Victims come from the probation
 * head, then the protected head. Leaf-first still holds, in the victim order
 * "probation, then protected": within each list children precede parents as under
 * leaf-LRU; a cached child in prot has its cached parent in prot (marked, and
 * demoted only after the child, which precedes it); demoting prot's head keeps
 * both. bench/trace_sim.c's leaf-slru with no ghosts is this algorithm, block for
 * block (pkv-trace --engine-policy leaf-slru checks it). The marks are not saved:
 * recovery puts every cached block on probation.
 */
#include "internal.h"

#include <stdlib.h>

void pkv_evict_clear(pkv_policy *e) {
    e->lru = (pkv_list){PKV_NONE, PKV_NONE, 0};
    e->prot = (pkv_list){PKV_NONE, PKV_NONE, 0};
}

void pkv_evict_init(pkv_policy *e, int kind, uint32_t protect_pct, uint32_t capacity) {
    pkv_evict_clear(e);
    e->kind = kind;
    e->prot_max = (uint64_t)capacity * protect_pct / 100;
    e->newest = 0;
}

/* Over its quota, prot's head (a leaf of prot: its cached children went before
 * it) loses its mark and joins probation behind every probation block, which is
 * where it stood in the victim order anyway. */
static void demote(pkv_pool *p) {
    pkv_policy *e = &p->pol;
    while (e->prot.count > e->prot_max) {
        uint32_t h = e->prot.head;
        pkv_list_remove(p, &e->prot, h);
        p->b[h].flags &= (uint8_t)~BLKF_REUSED;
        pkv_list_push_tail(p, &e->lru, LIST_LRU, h);
    }
}

/* Out of line: leaf-LRU's path stays a tail call. */
static pkv_noinline void protect(pkv_pool *p, uint32_t b) {
    pkv_list_push_tail(p, &p->pol.prot, LIST_PROT, b);
    demote(p);
}

/* A release is stamped with next_lsn, which only grows: newest bounds the release
 * LSN of every block released since the open (the only ones that can carry
 * BLKF_NAMED), which rule D3's check reads first. */
void pkv_evict_on_unreferenced(pkv_cache *c, uint32_t b) {
    pkv_pool *p = &c->pool;
    uint64_t rel = p->b[b].rel_lsn;
    if (rel > p->pol.newest) p->pol.newest = rel;
    if (pkv_unlikely(p->b[b].flags & BLKF_REUSED)) protect(p, b);
    else pkv_list_push_tail(p, &p->pol.lru, LIST_LRU, b);
}

void pkv_evict_on_referenced(pkv_cache *c, uint32_t b) {
    pkv_pool *p = &c->pool;
    pkv_block *x = &p->b[b];
    if (p->pol.kind == PKV_EVICT_LEAF_SLRU) x->flags |= BLKF_REUSED;
    pkv_list_remove(p, x->list == LIST_PROT ? &p->pol.prot : &p->pol.lru, b);
}

/* The block the next eviction takes: probation's head, else prot's. */
static inline uint32_t next_victim(const pkv_policy *e) {
    return e->lru.head != PKV_NONE ? e->lru.head : e->prot.head;
}

/* The next pkv_block_alloc takes the free list's head or, with none free, evicts
 * the policy's next victim: its record, its list successor and parent records and
 * its index slot are then written, each a likely cache miss on a large cache. A
 * decoder calls this a few tokens before its block fills: stage 0 prefetches the
 * head records, stage 1 (a token later, the head record now cached) the lines that
 * record points to. */
void pkv_alloc_prefetch(const pkv_cache *c, int stage) {
    const pkv_pool *p = &c->pool;
    if (p->free.head != PKV_NONE) {
        if (stage == 0) pkv_prefetch(&p->b[p->free.head]);
        else pkv_prefetch(pkv_pool_tokens(p, p->free.head));
        return;
    }
    uint32_t b = next_victim(&p->pol);
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

/* The order in which allocations take blocks: the free list from its head, then
 * the victims (probation from its head, then prot from its head). Between the
 * allocations of one append nothing joins these lists, so the order holds for the
 * whole run; it is only a prefetch hint, never a decision. */
uint32_t pkv_alloc_order_first(const pkv_cache *c) {
    const pkv_pool *p = &c->pool;
    return p->free.head != PKV_NONE ? p->free.head : next_victim(&p->pol);
}

uint32_t pkv_alloc_order_next(const pkv_cache *c, uint32_t b) {
    const pkv_pool *p = &c->pool;
    const pkv_block *x = &p->b[b];
    if (x->next != PKV_NONE) return x->next;
    if (x->list == LIST_FREE) return next_victim(&p->pol);
    if (x->list == LIST_LRU) return p->pol.prot.head;
    return PKV_NONE;
}

/* What taking block b will touch besides its record (loaded by the caller): for
 * a cached block, its index slot and its parent's record (eviction) and its token
 * ids (rewritten by the append). */
void pkv_alloc_prefetch_block(const pkv_cache *c, uint32_t b) {
    const pkv_pool *p = &c->pool;
    const pkv_block *x = &p->b[b];
    if (x->state == BLK_SEALED) {
        pkv_index_prefetch(&c->index, x->hash.lo);
        if (x->parent != PKV_NONE) pkv_prefetch(&p->b[x->parent]);
    }
    pkv_prefetch(pkv_pool_tokens(p, b));
}

uint32_t pkv_evict_victim(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    uint32_t b = next_victim(&p->pol);
    if (b != PKV_NONE)
        pkv_list_remove(p, p->b[b].list == LIST_PROT ? &p->pol.prot : &p->pol.lru, b);
    return b;
}

/* Rule D3 (docs/format.md): a sealed block marked BLKF_NAMED may still be named
 * by the durable state until the records before its release are safe: as an
 * open tail (some record named it while it was open) until its SEAL is safe,
 * with no checksum to catch a rewrite; as a table entry (a truncation released
 * it) until the TRUNC is safe, which would otherwise recover the table from
 * before the truncation cut at this block's checksum. Both records precede the
 * release, whose LSN (rel_lsn) is the next one then. When the newest release is
 * safe, all are (the usual case, no walk: pkv_evict_wait_lsn, internal.h); else
 * walk the next k victims in the order pkv_evict_victim takes them. That order
 * holds until the allocations it covers: between them seq.c caches no block (a
 * block cached onto probation could come before protected victims), and a
 * demotion moves prot's head to where it already stood. */
uint64_t pkv_evict_wait_walk(const pkv_cache *c, uint64_t k, uint64_t safe) {
    const pkv_pool *p = &c->pool;
    uint64_t target = 0;
    const pkv_list *l[2] = {&p->pol.lru, &p->pol.prot};
    for (int i = 0; i < 2; i++)
        for (uint32_t b = l[i]->head; b != PKV_NONE && k > 0; b = p->b[b].next, k--)
            if ((p->b[b].flags & BLKF_NAMED) && p->b[b].rel_lsn > target + 1)
                target = p->b[b].rel_lsn - 1;
    return target > safe ? target : 0;
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
    for (uint32_t b = 0; b < cap; b++) {
        p->b[b].flags &= (uint8_t)~BLKF_REUSED; /* every cached block starts on probation */
        if (p->b[b].state == BLK_SEALED) lru[ns++] = (lru_ent){0, d[b], b};
    }
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
        for (size_t i = 0; i < nl; i++) pkv_list_push_tail(p, &p->pol.lru, LIST_LRU, lru[i].block);
    free(lru);
    return rc;
}

/*
 * check.c — pkv_check(): verify every invariant of docs/design.md and name the
 * first one broken. O(capacity * block_size + index slots + sequence-map slots +
 * total block-table length), as every sealed block is rehashed and looked up; meant
 * for tests, debugging and kvdump, not for hot paths.
 *
 *  I1  free + cached + used = capacity; n_used and n_sealed match the states
 *  I2  ref(b) = number of block-table entries naming b; no table names b twice
 *  I3  the free list and limbo hold exactly the FREE blocks (ref 0, no children)
 *  I4  the eviction policy's lists hold exactly the sealed blocks with ref 0
 *  I5  the prefix index holds each sealed block once, under its hash, reachable
 *      from its home slot
 *  I6  nchild(b) = number of sealed blocks whose parent is b; a sealed block's
 *      parent is sealed and of the same salt
 *  I7  leaf-first order: every cached block comes after its cached children in
 *      the policy's victim order (probation, then protected: so the next victim is
 *      a leaf); a referenced sealed block's parent is referenced
 *  I8  hash(b) = H(hash(parent) or root(salt), tokens(b))
 *  I9  no two sealed blocks have the same parent, salt and tokens
 *  I10 block tables: ceil(len/B) entries; committed <= len; entries below
 *      committed/B are sealed and chained (parent = previous entry, salt = the
 *      sequence's); the others are open; with pending tokens, the entries from
 *      committed/B on are referenced by this sequence only; outside the call
 *      that set it no open block carries BLKF_PRESUM (sealsum.c)
 *  I11 every sealed block a table names is verified: neither BAD nor UNVERIFIED
 *      (rule S1 of docs/format.md: verified before it is served, by every path)
 */
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>

typedef struct checker {
    char *why;
    size_t why_len;
} checker;

__attribute__((format(printf, 2, 3))) static int broken(checker *k, const char *fmt,
                                                       ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k->why && k->why_len) snprintf(k->why, k->why_len, "%s", msg);
    return pkv_err(PKV_ECORRUPT, "pkv_check: %s", msg);
}

/* Walk a list; record each member's position in pos[]; check links and membership. */
static int check_list(checker *k, const pkv_pool *p, const pkv_list *l, uint8_t which,
                      const char *name, uint32_t *pos, uint64_t base) {
    uint64_t n = 0;
    uint32_t prev = PKV_NONE;
    for (uint32_t b = l->head; b != PKV_NONE; b = p->b[b].next) {
        if (b >= p->capacity) return broken(k, "%s list: bad link %u", name, b);
        if (n >= l->count) return broken(k, "%s list longer than its count %llu", name,
                                         (unsigned long long)l->count);
        if (p->b[b].list != which)
            return broken(k, "%s list: block %u tagged as list %u", name, b, p->b[b].list);
        if (p->b[b].prev != prev)
            return broken(k, "%s list: block %u has prev %u, expected %u", name, b,
                          p->b[b].prev, prev);
        pos[b] = (uint32_t)(base + n++);
        prev = b;
    }
    if (n != l->count)
        return broken(k, "%s list has %llu members, count says %llu", name,
                      (unsigned long long)n, (unsigned long long)l->count);
    if (l->tail != prev) return broken(k, "%s list: tail %u, last member %u", name,
                                       l->tail, prev);
    return 0;
}

static int check_blocks(checker *k, pkv_cache *c, uint32_t *pos) {
    const pkv_pool *p = &c->pool;
    uint64_t used = 0, sealed = 0, nfree = 0, cached = 0;
    for (uint32_t b = 0; b < p->capacity; b++) pos[b] = PKV_NONE;
    int rc;
    if ((rc = check_list(k, p, &p->free, LIST_FREE, "free", pos, 0))) return rc;
    if ((rc = check_list(k, p, &p->pol.lru, LIST_LRU, "LRU", pos, 0))) return rc;
    if ((rc = check_list(k, p, &p->pol.prot, LIST_PROT, "protected", pos,
                         p->pol.lru.count)))
        return rc;
    if ((rc = check_list(k, p, &c->limbo, LIST_LIMBO, "limbo", pos, 0))) return rc;
    for (uint32_t b = 0; b < p->capacity; b++) {
        const pkv_block *x = &p->b[b];
        used += x->ref > 0;
        switch (x->state) {
        case BLK_FREE:
            nfree++;
            if ((x->list != LIST_FREE && x->list != LIST_LIMBO) || x->ref || x->nchild)
                return broken(k, "I3: free block %u: list %u ref %u nchild %u", b,
                              x->list, x->ref, x->nchild);
            break;
        case BLK_OPEN:
            if (x->list != LIST_NONE || x->ref == 0 || x->nchild)
                return broken(k, "I3: open block %u: list %u ref %u nchild %u", b,
                              x->list, x->ref, x->nchild);
            break;
        case BLK_SEALED:
            sealed++;
            if ((x->ref == 0) != (x->list == LIST_LRU || x->list == LIST_PROT))
                return broken(k, "I4: sealed block %u with ref %u is %son the policy's lists",
                              b, x->ref, x->ref ? "" : "not ");
            cached += x->ref == 0;
            break;
        default:
            return broken(k, "block %u has bad state %u", b, x->state);
        }
    }
    if (nfree != p->free.count + c->limbo.count || cached != pkv_evict_count(&p->pol))
        return broken(k, "I3/I4: %llu free blocks, lists hold %llu + %llu; %llu cached, "
                      "LRU holds %llu", (unsigned long long)nfree,
                      (unsigned long long)p->free.count, (unsigned long long)c->limbo.count,
                      (unsigned long long)cached,
                      (unsigned long long)pkv_evict_count(&p->pol));
    if (nfree + cached + used != p->capacity)
        return broken(k, "I1: free %llu + cached %llu + used %llu != capacity %u",
                      (unsigned long long)nfree, (unsigned long long)cached,
                      (unsigned long long)used, p->capacity);
    if (used != p->n_used || sealed != p->n_sealed)
        return broken(k, "I1: counted used %llu sealed %llu, recorded %llu %llu",
                      (unsigned long long)used, (unsigned long long)sealed,
                      (unsigned long long)p->n_used, (unsigned long long)p->n_sealed);
    return 0;
}

static int check_sealed(checker *k, pkv_cache *c, const uint32_t *pos, uint32_t *cnt) {
    const pkv_pool *p = &c->pool;
    for (uint32_t b = 0; b < p->capacity; b++) cnt[b] = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        const pkv_block *x = &p->b[b];
        if (x->state != BLK_SEALED) continue;
        pkv_h128 ph;
        if (x->parent == PKV_NONE) {
            ph = pkv_hash_root(c->arena.secret, x->salt);
        } else {
            if (x->parent >= p->capacity || p->b[x->parent].state != BLK_SEALED)
                return broken(k, "I6: sealed block %u has unsealed parent %u", b,
                              x->parent);
            const pkv_block *y = &p->b[x->parent];
            if (y->salt != x->salt)
                return broken(k, "I6: block %u salt differs from its parent's", b);
            if (x->ref > 0 && y->ref == 0)
                return broken(k, "I7: referenced block %u has unreferenced parent %u", b,
                              x->parent);
            if (x->ref == 0 && y->ref == 0 && pos[b] >= pos[x->parent])
                return broken(k, "I7: cached block %u is not before its parent %u in the "
                              "victim order",
                              b, x->parent);
            cnt[x->parent]++;
            ph = y->hash;
        }
        const uint32_t *toks = pkv_pool_tokens(p, b);
        if (!pkv_h128_eq(x->hash, pkv_hash_block(c->arena.secret, ph, toks, p->block_size)))
            return broken(k, "I8: block %u hash does not match its chain", b);
        uint32_t f = pkv_index_find(&c->index, p, x->hash, x->parent, x->salt, toks);
        if (f != b && !(x->flags & BLKF_BAD))
            return broken(k, "I9/I5: index lookup of block %u content finds %u", b, f);
    }
    for (uint32_t b = 0; b < p->capacity; b++)
        if (p->b[b].nchild != cnt[b])
            return broken(k, "I6: block %u records %u children, has %u", b,
                          p->b[b].nchild, cnt[b]);
    uint32_t v = p->pol.lru.head != PKV_NONE ? p->pol.lru.head : p->pol.prot.head;
    if (v != PKV_NONE && p->b[v].nchild)
        return broken(k, "I7: next victim %u is not a leaf", v);
    return 0;
}

static int check_index(checker *k, pkv_cache *c) {
    const pkv_index *ix = &c->index;
    const pkv_pool *p = &c->pool;
    uint64_t n = 0;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        const pkv_index_slot *s = &ix->slots[i];
        if (s->block == PKV_NONE) continue;
        n++;
        if (s->block >= p->capacity || p->b[s->block].state != BLK_SEALED ||
            p->b[s->block].hash.lo != s->key)
            return broken(k, "I5: index slot %llu names block %u wrongly",
                          (unsigned long long)i, s->block);
        for (uint64_t j = pkv_index_home(ix, s->key); j != i; j = (j + 1) & ix->mask)
            if (ix->slots[j].block == PKV_NONE)
                return broken(k, "I5: index entry %llu unreachable from its home",
                              (unsigned long long)i);
    }
    if (n != ix->count || n != p->n_sealed)
        return broken(k, "I5: index holds %llu entries, count %llu, sealed %llu",
                      (unsigned long long)n, (unsigned long long)ix->count,
                      (unsigned long long)p->n_sealed);
    return 0;
}

static int check_seq(checker *k, pkv_cache *c, const pkv_seq *s, uint32_t *refs,
                     uint64_t *seen, uint64_t tag) {
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    if (s->committed > s->len || s->nblocks != (s->len + bs - 1) / bs ||
        s->nblocks > s->cap)
        return broken(k, "I10: seq %llu len %llu committed %llu blocks %u",
                      (unsigned long long)s->id, (unsigned long long)s->len,
                      (unsigned long long)s->committed, s->nblocks);
    uint64_t nsealed = s->committed / bs;
    bool pending = s->len > s->committed;
    for (uint32_t i = 0; i < s->nblocks; i++) {
        uint32_t b = s->blocks[i];
        if (b >= p->capacity)
            return broken(k, "I10: seq %llu entry %u names block %u",
                          (unsigned long long)s->id, i, b);
        if (seen[b] == tag)
            return broken(k, "I2: seq %llu names block %u twice", (unsigned long long)s->id, b);
        seen[b] = tag;
        refs[b]++;
        const pkv_block *x = &p->b[b];
        if (i < nsealed) {
            uint32_t want = i ? s->blocks[i - 1] : PKV_NONE;
            if (x->state != BLK_SEALED || x->parent != want || x->salt != s->salt)
                return broken(k, "I10: seq %llu block %u (entry %u) not sealed in chain",
                              (unsigned long long)s->id, b, i);
            if (x->flags & (BLKF_BAD | BLKF_UNVERIFIED))
                return broken(k, "I11: seq %llu entry %u (block %u) is %s: a table names "
                              "only verified blocks (rule S1)", (unsigned long long)s->id, i,
                              b, (x->flags & BLKF_BAD) ? "BAD" : "unverified");
        } else {
            if (x->state != BLK_OPEN)
                return broken(k, "I10: seq %llu entry %u (block %u) beyond committed "
                              "blocks is not open", (unsigned long long)s->id, i, b);
            if (pending && x->ref != 1)
                return broken(k, "I10: seq %llu has pending tokens in shared block %u",
                              (unsigned long long)s->id, b);
            if ((uint64_t)i * bs < s->committed && !(x->flags & BLKF_NAMED))
                return broken(k, "I10: seq %llu entry %u (block %u) holds committed tokens "
                              "but is not marked as named by the log (it would skip limbo)",
                              (unsigned long long)s->id, i, b);
            if ((x->flags & BLKF_PRESUM) && c->presum_calls == 0) /* set and cleared
                                                                     inside one call */
                return broken(k, "I10: seq %llu entry %u (block %u) keeps a seal checksum "
                              "computed ahead outside the call that computed it",
                              (unsigned long long)s->id, i, b);
        }
    }
    return 0;
}

static int check_all(checker *k, pkv_cache *c, uint32_t *a, uint32_t *bcnt,
                     uint64_t *seen) {
    int rc;
    if ((rc = check_blocks(k, c, a))) return rc;
    if ((rc = check_sealed(k, c, a, bcnt))) return rc;
    if ((rc = check_index(k, c))) return rc;
    const pkv_pool *p = &c->pool;
    for (uint32_t b = 0; b < p->capacity; b++) {
        a[b] = 0;
        seen[b] = 0;
    }
    uint64_t nseq = 0, nstale = 0;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        const pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        nseq++;
        if (s->mc_stale) { /* deferred COMMIT growth (wal/record.c) */
            nstale++;
            if (s->mc_stale_ix >= c->wal.nstale || c->wal.stale[s->mc_stale_ix] != s ||
                s->mc_gen != c->wal.gen)
                return broken(k, "log: seq %llu lags its COMMIT but is not listed as lagging",
                              (unsigned long long)s->id);
        }
        if (pkv_seqmap_get(&c->seqs, s->id) != s)
            return broken(k, "sequence map: %llu unreachable", (unsigned long long)s->id);
        if ((rc = check_seq(k, c, s, a, seen, nseq))) return rc;
    }
    if (nseq != c->seqs.count)
        return broken(k, "sequence map holds %llu, count %llu", (unsigned long long)nseq,
                      (unsigned long long)c->seqs.count);
    if (nstale != c->wal.nstale)
        return broken(k, "log: %u sequences listed as lagging, %llu lag", c->wal.nstale,
                      (unsigned long long)nstale);
    uint64_t refs = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        if (a[b] != p->b[b].ref)
            return broken(k, "I2: block %u has ref %u, named by %u table entries", b,
                          p->b[b].ref, a[b]);
        refs += a[b];
    }
    if (refs != p->ref_total)
        return broken(k, "I2: %llu table entries, refcount total %llu",
                      (unsigned long long)refs, (unsigned long long)p->ref_total);
    return 0;
}

int pkv_check(pkv_cache *c, char *why, size_t why_len) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    PKV_LOCAL_ONLY(c, "pkv_check (run it in pkvd)");
    if (why && why_len) why[0] = '\0';
    checker k = {why, why_len};
    uint32_t cap = c->pool.capacity;
    uint32_t *a = malloc((size_t)cap * sizeof *a);
    uint32_t *bcnt = malloc((size_t)cap * sizeof *bcnt);
    uint64_t *seen = malloc((size_t)cap * sizeof *seen);
    int rc;
    if (!a || !bcnt || !seen) {
        rc = pkv_err(PKV_ENOMEM, "pkv_check scratch for %u blocks", cap);
    } else {
        pkv_lock(c);
        rc = check_all(&k, c, a, bcnt, seen);
        pkv_unlock(c);
    }
    free(a);
    free(bcnt);
    free(seen);
    return rc;
}

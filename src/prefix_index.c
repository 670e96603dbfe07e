/*
 * prefix_index.c — the prefix index: an open-addressing (linear probing) multimap
 * from a sealed block's hash to the block.
 *
 * Slots hold (hash.lo, block); PKV_NONE marks an empty slot. The table has at least
 * 2 * capacity slots, so the load factor stays <= 0.5 and no resize is ever needed.
 * Deletion shifts later entries of the run back (no tombstones), so the invariant
 * "every entry is reachable from its home slot without crossing an empty slot"
 * (I5) always holds.
 *
 * It is a multimap: several sealed blocks may share a hash (always in the 8-bit
 * test build; with 128 bits only by a collision). A lookup therefore verifies each
 * candidate exactly — full hash, stored parent, salt and token ids — so a collision
 * can only cost a miss, never serve another prefix's K/V (rule S2 of
 * docs/format.md). Content is unique among
 * sealed blocks (dedupe on seal, seq.c), so at most one candidate matches.
 * Blocks whose payload failed verification after recovery (BLKF_BAD) never match.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

int pkv_index_init(pkv_index *ix, uint32_t capacity) {
    uint64_t n = 16;
    while (n < 2ull * capacity) n <<= 1;
    ix->slots = pkv_huge_alloc(n * sizeof *ix->slots);
    if (!ix->slots) return pkv_err(PKV_ENOMEM, "prefix index of %llu slots",
                                   (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        ix->slots[i].key = 0;
        ix->slots[i].block = PKV_NONE;
        ix->slots[i].pad = 0;
    }
    ix->mask = n - 1;
    ix->count = 0;
    return 0;
}

void pkv_index_free(pkv_index *ix) {
    pkv_huge_free(ix->slots, (size_t)(ix->mask + 1) * sizeof *ix->slots);
    ix->slots = NULL;
}

/* The block other than `skip` with this hash, parent, salt and tokens whose BAD
 * flag is `bad`, or PKV_NONE. */
static inline uint32_t find_as(const pkv_index *ix, const pkv_pool *p, pkv_h128 h,
                               uint32_t parent, uint64_t salt, const uint32_t *tokens,
                               uint8_t bad, uint32_t skip) {
    size_t tbytes = (size_t)p->block_size * sizeof(uint32_t);
    for (uint64_t i = pkv_index_home(ix, h.lo);; i = (i + 1) & ix->mask) {
        const pkv_index_slot *s = &ix->slots[i];
        if (s->block == PKV_NONE) return PKV_NONE;
        if (s->key != h.lo || s->block == skip) continue;
        const pkv_block *x = &p->b[s->block];
        if (x->hash.hi == h.hi && x->parent == parent && x->salt == salt &&
            (x->flags & BLKF_BAD) == bad &&
            memcmp(pkv_pool_tokens(p, s->block), tokens, tbytes) == 0)
            return s->block;
    }
}

uint32_t pkv_index_find(const pkv_index *ix, const pkv_pool *p, pkv_h128 h,
                        uint32_t parent, uint64_t salt, const uint32_t *tokens) {
    return find_as(ix, p, h, parent, salt, tokens, 0, PKV_NONE);
}

uint32_t pkv_index_find_twin(const pkv_index *ix, const pkv_pool *p, uint32_t b) {
    const pkv_block *y = &p->b[b];
    return find_as(ix, p, y->hash, y->parent, y->salt, pkv_pool_tokens(p, b),
                   y->flags & BLKF_BAD, b);
}

void pkv_index_insert(pkv_index *ix, uint64_t key, uint32_t block) {
    pkv_assert(ix->count < ix->mask); /* never full: capacity <= slots / 2 */
    uint64_t i = pkv_index_home(ix, key);
    while (ix->slots[i].block != PKV_NONE) i = (i + 1) & ix->mask;
    ix->slots[i].key = key;
    ix->slots[i].block = block;
    ix->count++;
}

void pkv_index_remove(pkv_index *ix, uint64_t key, uint32_t block) {
    uint64_t i = pkv_index_home(ix, key);
    while (ix->slots[i].block != block) {
        pkv_assert(ix->slots[i].block != PKV_NONE); /* the entry must exist */
        i = (i + 1) & ix->mask;
    }
    /* Backward-shift deletion: pull later run members into the hole unless their
     * home lies cyclically in (hole, j]. */
    for (uint64_t j = i;;) {
        j = (j + 1) & ix->mask;
        if (ix->slots[j].block == PKV_NONE) break;
        uint64_t k = pkv_index_home(ix, ix->slots[j].key);
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        ix->slots[i] = ix->slots[j];
        i = j;
    }
    ix->slots[i].block = PKV_NONE;
    ix->slots[i].key = 0;
    ix->count--;
}

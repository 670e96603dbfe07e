/*
 * residency.c — device slot bookkeeping of the CUDA layer (see residency.h).
 *
 * Structures: an array of slots; a map block -> slot (open addressing, linear
 * probing, backward-shift deletion, sized to twice the slots); a free list (a
 * stack through `next`); an LRU list of the unpinned resident slots, doubly
 * linked, head = least recently released. Pinned slots and orphans that are
 * still pinned are on no list.
 *
 * Planning runs in two phases so that a failure changes nothing: phase 1 reads
 * only (collects the distinct blocks of the batch in a private set, classifies
 * each as hit / re-copy in place / re-copy elsewhere / missing, and checks that
 * enough slots can be had), phase 2 cannot fail (every allocation was made in
 * phase 1).
 */
#include "cuda/residency.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

enum { RES_LIST_NONE = 0, RES_LIST_FREE = 1, RES_LIST_LRU = 2 };

/* ---- Map block -> slot ---------------------------------------------------- */

static inline uint32_t hash_block(uint32_t b, uint32_t mask) {
    return (uint32_t)(((uint64_t)b * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static uint32_t map_get(const pkv_res *r, uint32_t block) {
    for (uint32_t i = hash_block(block, r->map_mask);; i = (i + 1) & r->map_mask) {
        if (r->map_key[i] == block) return r->map_val[i];
        if (r->map_key[i] == PKV_RES_NONE) return PKV_RES_NONE;
    }
}

static void map_put(pkv_res *r, uint32_t block, uint32_t slot) {
    uint32_t i = hash_block(block, r->map_mask);
    while (r->map_key[i] != PKV_RES_NONE && r->map_key[i] != block) i = (i + 1) & r->map_mask;
    r->map_key[i] = block;
    r->map_val[i] = slot;
}

static void map_del(pkv_res *r, uint32_t block) {
    const uint32_t mask = r->map_mask;
    uint32_t i = hash_block(block, mask);
    while (r->map_key[i] != block) {
        if (r->map_key[i] == PKV_RES_NONE) return;
        i = (i + 1) & mask;
    }
    /* Backward shift: move later entries of the probe run into the hole when their
     * home does not lie cyclically in (hole, j]. */
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & mask; r->map_key[j] != PKV_RES_NONE; j = (j + 1) & mask) {
        const uint32_t home = hash_block(r->map_key[j], mask);
        const int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (in_range) continue;
        r->map_key[hole] = r->map_key[j];
        r->map_val[hole] = r->map_val[j];
        hole = j;
    }
    r->map_key[hole] = PKV_RES_NONE;
    r->map_val[hole] = PKV_RES_NONE;
}

/* ---- Lists ------------------------------------------------------------------ */

static void free_push(pkv_res *r, uint32_t s) {
    pkv_res_slot *x = &r->slots[s];
    x->list = RES_LIST_FREE;
    x->prev = PKV_RES_NONE;
    x->next = r->free_head;
    x->block = PKV_RES_NONE;
    x->tag = 0;
    x->valid = 0;
    r->free_head = s;
    r->free_count++;
}

static uint32_t free_pop(pkv_res *r) {
    const uint32_t s = r->free_head;
    pkv_res_slot *x = &r->slots[s];
    r->free_head = x->next;
    r->free_count--;
    x->list = RES_LIST_NONE;
    x->next = PKV_RES_NONE;
    return s;
}

static void lru_push_tail(pkv_res *r, uint32_t s) {
    pkv_res_slot *x = &r->slots[s];
    x->list = RES_LIST_LRU;
    x->next = PKV_RES_NONE;
    x->prev = r->lru_tail;
    if (r->lru_tail != PKV_RES_NONE) r->slots[r->lru_tail].next = s;
    else r->lru_head = s;
    r->lru_tail = s;
    r->lru_count++;
}

static void lru_remove(pkv_res *r, uint32_t s) {
    pkv_res_slot *x = &r->slots[s];
    if (x->prev != PKV_RES_NONE) r->slots[x->prev].next = x->next;
    else r->lru_head = x->next;
    if (x->next != PKV_RES_NONE) r->slots[x->next].prev = x->prev;
    else r->lru_tail = x->prev;
    x->prev = x->next = PKV_RES_NONE;
    x->list = RES_LIST_NONE;
    r->lru_count--;
}

static void pin(pkv_res *r, uint32_t s) {
    pkv_res_slot *x = &r->slots[s];
    if (x->pins++ == 0) {
        if (x->list == RES_LIST_LRU) lru_remove(r, s);
        r->pinned_count++;
    }
}

static void unpin(pkv_res *r, uint32_t s) {
    pkv_res_slot *x = &r->slots[s];
    pkv_assert(x->pins > 0);
    if (--x->pins) return;
    r->pinned_count--;
    if (x->block == PKV_RES_NONE) free_push(r, s);
    else lru_push_tail(r, s);
}

/* ---- Set-up ----------------------------------------------------------------- */

int pkv_res_init(pkv_res *r, uint32_t n_slots, uint32_t n_blocks, uint32_t block_size) {
    if (!r) return pkv_err(PKV_EINVAL, "residency is NULL");
    memset(r, 0, sizeof *r);
    if (!n_slots || n_slots > (1u << 30) || !n_blocks || n_blocks == PKV_RES_NONE ||
        !block_size)
        return pkv_err(PKV_EINVAL, "residency: %u slots, %u blocks, block size %u", n_slots,
                       n_blocks, block_size);
    uint32_t cap = 16;
    while (cap < 2 * n_slots) cap *= 2;
    r->slots = calloc(n_slots, sizeof *r->slots);
    r->map_key = malloc((size_t)cap * sizeof *r->map_key);
    r->map_val = malloc((size_t)cap * sizeof *r->map_val);
    if (!r->slots || !r->map_key || !r->map_val) {
        pkv_res_free(r);
        return pkv_err(PKV_ENOMEM, "residency map for %u slots", n_slots);
    }
    memset(r->map_key, 0xff, (size_t)cap * sizeof *r->map_key);
    memset(r->map_val, 0xff, (size_t)cap * sizeof *r->map_val);
    r->map_mask = cap - 1;
    r->n_slots = n_slots;
    r->n_blocks = n_blocks;
    r->block_size = block_size;
    r->free_head = r->lru_head = r->lru_tail = PKV_RES_NONE;
    for (uint32_t s = n_slots; s-- > 0;) free_push(r, s); /* slot 0 on top */
    return 0;
}

void pkv_res_free(pkv_res *r) {
    if (!r) return;
    free(r->slots);
    free(r->map_key);
    free(r->map_val);
    memset(r, 0, sizeof *r);
}

uint32_t pkv_res_lookup(const pkv_res *r, uint32_t block, uint64_t *tag, uint32_t *valid) {
    const uint32_t s = map_get(r, block);
    if (s != PKV_RES_NONE) {
        if (tag) *tag = r->slots[s].tag;
        if (valid) *valid = r->slots[s].valid;
    }
    return s;
}

/* ---- Planning --------------------------------------------------------------- */

enum { U_HIT = 0, U_RECOPY_HERE = 1, U_RECOPY_MOVE = 2, U_MISSING = 3 };

typedef struct ublock {
    uint32_t block;
    uint32_t need, stable; /* tokens of this block, max over occurrences */
    uint64_t tag;
    uint32_t slot;         /* resident slot at phase 1, final slot after phase 2 */
    uint8_t conflict;      /* occurrences disagreed on the tag */
    uint8_t cls;
} ublock;

typedef struct uset {
    uint32_t *idx; /* open addressing: index into u[], PKV_RES_NONE empty */
    uint32_t mask;
    ublock *u;
    uint32_t n;
} uset;

static void uset_free(uset *s) {
    free(s->idx);
    free(s->u);
    memset(s, 0, sizeof *s);
}

static ublock *uset_get(uset *s, uint32_t block) {
    uint32_t i = hash_block(block, s->mask);
    for (;; i = (i + 1) & s->mask) {
        const uint32_t k = s->idx[i];
        if (k == PKV_RES_NONE) break;
        if (s->u[k].block == block) return &s->u[k];
    }
    s->idx[i] = s->n;
    ublock *x = &s->u[s->n++];
    memset(x, 0, sizeof *x);
    x->block = block;
    x->slot = PKV_RES_NONE;
    x->cls = 0xff; /* new */
    return x;
}

static uint32_t clamp_tok(uint32_t tokens, uint64_t first, uint32_t bs) {
    if (tokens <= first) return 0;
    const uint64_t t = tokens - first;
    return t > bs ? bs : (uint32_t)t;
}

void pkv_res_plan_free(pkv_res_plan *plan) {
    if (!plan) return;
    free(plan->tables);
    free(plan->lens);
    free(plan->copies);
    free(plan->pinned);
    memset(plan, 0, sizeof *plan);
}

int pkv_res_plan_batch(pkv_res *r, const pkv_res_seq *seqs, size_t n, pkv_res_plan *plan) {
    if (!r || !plan) return pkv_err(PKV_EINVAL, "residency or plan is NULL");
    memset(plan, 0, sizeof *plan);
    if (n && !seqs) return pkv_err(PKV_EINVAL, "seqs is NULL");
    if (n > UINT32_MAX) return pkv_err(PKV_EINVAL, "batch of %zu sequences", n);
    const uint32_t bs = r->block_size;

    /* Validate; size the batch. */
    uint64_t entries = 0;
    uint32_t stride = 1, max_len = 0;
    for (size_t s = 0; s < n; s++) {
        const pkv_res_seq *q = &seqs[s];
        if (!q->len) return pkv_err(PKV_EINVAL, "sequence %zu: len is 0", s);
        if (q->need > q->len || q->stable > q->need)
            return pkv_err(PKV_EINVAL, "sequence %zu: need %u, stable %u, len %u (want "
                           "stable <= need <= len)", s, q->need, q->stable, q->len);
        if (!q->blocks) return pkv_err(PKV_EINVAL, "sequence %zu: blocks is NULL", s);
        const uint32_t nb = (uint32_t)((q->len + (uint64_t)bs - 1) / bs);
        if (q->n_blocks < nb)
            return pkv_err(PKV_ERANGE, "sequence %zu: len %u needs %u blocks, table has %u", s,
                           q->len, nb, q->n_blocks);
        for (uint32_t i = 0; i < nb; i++)
            if (q->blocks[i] >= r->n_blocks)
                return pkv_err(PKV_ERANGE, "sequence %zu: block table entry %u is %u >= %u", s,
                               i, q->blocks[i], r->n_blocks);
        entries += nb;
        if (nb > stride) stride = nb;
        if (q->len > max_len) max_len = q->len;
    }
    r->st.plans++;
    if (!n) return 0;
    if (entries > (1u << 30) || (uint64_t)n * stride > (1u << 30)) {
        r->st.plans_failed++;
        return pkv_err(PKV_ENOMEM, "batch of %llu block entries", (unsigned long long)entries);
    }

    /* Phase 1: the distinct blocks, their classes, the slots they need. */
    uset set = {0};
    uint32_t cap = 16;
    while (cap < 2 * entries) cap *= 2;
    set.idx = malloc((size_t)cap * sizeof *set.idx);
    set.u = malloc((size_t)entries * sizeof *set.u);
    plan->tables = malloc((size_t)n * stride * sizeof *plan->tables);
    plan->lens = malloc(n * sizeof *plan->lens);
    if (!set.idx || !set.u || !plan->tables || !plan->lens) goto nomem;
    memset(set.idx, 0xff, (size_t)cap * sizeof *set.idx);
    set.mask = cap - 1;
    for (size_t s = 0; s < n; s++) {
        const pkv_res_seq *q = &seqs[s];
        const uint32_t nb = (uint32_t)((q->len + (uint64_t)bs - 1) / bs);
        for (uint32_t i = 0; i < nb; i++) {
            const uint64_t first = (uint64_t)i * bs;
            const uint32_t need = clamp_tok(q->need, first, bs);
            const uint32_t stable = clamp_tok(q->stable, first, bs);
            const uint64_t tag = q->tags ? q->tags[i] : 0;
            ublock *x = uset_get(&set, q->blocks[i]);
            if (x->cls == 0xff) {
                x->cls = 0;
                x->need = need;
                x->stable = stable;
                x->tag = tag;
            } else {
                if (x->tag != tag || x->stable != stable) x->conflict = 1;
                if (need > x->need) x->need = need;
                if (stable > x->stable) x->stable = stable;
            }
        }
    }
    uint32_t want_new = 0, unpinned_here = 0, n_copies = 0, hits = 0;
    for (uint32_t k = 0; k < set.n; k++) {
        ublock *x = &set.u[k];
        x->slot = map_get(r, x->block);
        if (x->slot == PKV_RES_NONE) {
            x->cls = U_MISSING;
        } else {
            const pkv_res_slot *e = &r->slots[x->slot];
            if (!x->conflict && e->tag == x->tag && e->valid >= x->need) x->cls = U_HIT;
            else if (e->pins == 0) x->cls = U_RECOPY_HERE;
            else x->cls = U_RECOPY_MOVE;
            if (e->pins == 0) unpinned_here++;
        }
        if (x->cls == U_RECOPY_MOVE || x->cls == U_MISSING) want_new++;
        if (x->cls == U_HIT) hits++;
        else if (x->need > 0 || x->conflict) n_copies++;
    }
    const uint64_t can = (uint64_t)r->free_count + r->lru_count - unpinned_here;
    if (want_new > can) {
        const uint32_t nu = set.n;
        uset_free(&set);
        pkv_res_plan_free(plan);
        r->st.plans_failed++;
        return pkv_err(PKV_EFULL,
                       "device pool too small for the batch: %u distinct blocks, %u to place, "
                       "%llu slots obtainable (%u slots, %u pinned by other batches)",
                       nu, want_new, (unsigned long long)can, r->n_slots, r->pinned_count);
    }
    plan->copies = malloc((n_copies ? n_copies : 1) * sizeof *plan->copies);
    plan->pinned = malloc((size_t)set.n * sizeof *plan->pinned);
    if (!plan->copies || !plan->pinned) goto nomem;

    /* Phase 2: cannot fail. Pin what stays, then place the rest. */
    r->epoch++;
    for (uint32_t k = 0; k < set.n; k++) {
        ublock *x = &set.u[k];
        if (x->cls == U_HIT || x->cls == U_RECOPY_HERE) {
            pin(r, x->slot);
            r->slots[x->slot].mark = r->epoch;
            plan->pinned[plan->n_pinned++] = x->slot;
        }
    }
    for (uint32_t k = 0; k < set.n; k++) {
        ublock *x = &set.u[k];
        if (x->cls == U_RECOPY_MOVE) { /* the old slot stays with its other batches */
            map_del(r, x->block);
            r->slots[x->slot].block = PKV_RES_NONE;
            r->st.orphans++;
            x->slot = PKV_RES_NONE;
        }
        if (x->cls == U_RECOPY_MOVE || x->cls == U_MISSING) {
            uint32_t s;
            if (r->free_count) {
                s = free_pop(r);
            } else {
                s = r->lru_head;
                pkv_assert(s != PKV_RES_NONE && r->slots[s].mark != r->epoch);
                lru_remove(r, s);
                map_del(r, r->slots[s].block);
                r->st.evictions++;
            }
            pkv_res_slot *e = &r->slots[s];
            e->block = x->block;
            e->tag = 0;
            e->valid = 0;
            e->pins = 0;
            map_put(r, x->block, s);
            pin(r, s);
            e->mark = r->epoch;
            plan->pinned[plan->n_pinned++] = s;
            x->slot = s;
        }
        if (x->cls != U_HIT) {
            pkv_res_slot *e = &r->slots[x->slot];
            if (x->need > 0 || x->conflict) {
                plan->copies[plan->n_copies++] = (pkv_res_copy){x->block, x->slot};
                r->st.copies++;
                if (x->cls == U_RECOPY_HERE || x->cls == U_RECOPY_MOVE) r->st.recopies++;
            }
            e->tag = x->tag;
            e->valid = x->conflict ? 0 : x->stable;
        }
    }
    r->st.hits += hits;

    /* Device block tables. */
    for (size_t s = 0; s < n; s++) {
        const pkv_res_seq *q = &seqs[s];
        const uint32_t nb = (uint32_t)((q->len + (uint64_t)bs - 1) / bs);
        uint32_t *row = plan->tables + s * stride;
        for (uint32_t i = 0; i < nb; i++) row[i] = uset_get(&set, q->blocks[i])->slot;
        for (uint32_t i = nb; i < stride; i++) row[i] = PKV_RES_NONE;
        plan->lens[s] = q->len;
    }
    plan->n_seqs = (uint32_t)n;
    plan->table_stride = stride;
    plan->max_len = max_len;
    plan->n_blocks = set.n;
    plan->hits = hits;
    pkv_assert(plan->n_copies == n_copies);
    uset_free(&set);
    return 0;
nomem:
    uset_free(&set);
    pkv_res_plan_free(plan);
    r->st.plans_failed++;
    return pkv_err(PKV_ENOMEM, "residency plan for %zu sequences", n);
}

void pkv_res_release(pkv_res *r, pkv_res_plan *plan) {
    if (!r || !plan) return;
    for (uint32_t i = 0; i < plan->n_pinned; i++) unpin(r, plan->pinned[i]);
    pkv_res_plan_free(plan);
}

void pkv_res_abort(pkv_res *r, pkv_res_plan *plan) {
    if (!r || !plan) return;
    for (uint32_t i = 0; i < plan->n_copies; i++) {
        const pkv_res_copy *c = &plan->copies[i];
        if (r->slots[c->slot].block == c->block) {
            map_del(r, c->block);
            r->slots[c->slot].block = PKV_RES_NONE;
            r->slots[c->slot].tag = 0;
            r->slots[c->slot].valid = 0;
        }
    }
    pkv_res_release(r, plan);
}

int pkv_res_set_valid(pkv_res *r, uint32_t block, uint64_t tag, uint32_t valid) {
    const uint32_t s = map_get(r, block);
    if (s == PKV_RES_NONE)
        return pkv_err(PKV_ERANGE, "block %u is not resident on the device", block);
    r->slots[s].tag = tag;
    r->slots[s].valid = valid > r->block_size ? r->block_size : valid;
    return 0;
}

void pkv_res_invalidate(pkv_res *r, uint32_t block) {
    const uint32_t s = map_get(r, block);
    if (s == PKV_RES_NONE) return;
    map_del(r, block);
    pkv_res_slot *x = &r->slots[s];
    x->block = PKV_RES_NONE;
    x->tag = 0;
    x->valid = 0;
    r->st.invalidations++;
    if (x->pins == 0) {
        lru_remove(r, s);
        free_push(r, s);
    } else {
        r->st.orphans++;
    }
}

void pkv_res_drop_unpinned(pkv_res *r) {
    while (r->lru_head != PKV_RES_NONE) {
        const uint32_t s = r->lru_head;
        lru_remove(r, s);
        map_del(r, r->slots[s].block);
        free_push(r, s);
    }
}

size_t pkv_res_lru_blocks(const pkv_res *r, uint32_t *out, size_t cap) {
    size_t k = 0;
    for (uint32_t s = r->lru_head; s != PKV_RES_NONE && k < cap; s = r->slots[s].next)
        out[k++] = r->slots[s].block;
    return k;
}

void pkv_res_counts_get(const pkv_res *r, pkv_res_counts *out) {
    memset(out, 0, sizeof *out);
    out->free = r->free_count;
    out->lru = r->lru_count;
    out->pinned = r->pinned_count;
    for (uint32_t s = 0; s < r->n_slots; s++) {
        if (r->slots[s].block != PKV_RES_NONE) out->resident++;
        else if (r->slots[s].pins) out->orphans++;
    }
}

/* ---- Invariants --------------------------------------------------------------- */

#define BAD(...)                                                                  \
    do {                                                                          \
        if (why && len) snprintf(why, len, __VA_ARGS__);                          \
        return PKV_ECORRUPT;                                                      \
    } while (0)

int pkv_res_check(const pkv_res *r, char *why, size_t len) {
    if (why && len) why[0] = '\0';
    uint32_t resident = 0, pinned = 0, nfree = 0, nlru = 0;
    for (uint32_t s = 0; s < r->n_slots; s++) {
        const pkv_res_slot *x = &r->slots[s];
        if (x->block != PKV_RES_NONE) {
            resident++;
            if (x->block >= r->n_blocks) BAD("slot %u holds block %u >= %u", s, x->block, r->n_blocks);
            if (map_get(r, x->block) != s)
                BAD("slot %u holds block %u but the map says %u", s, x->block,
                    map_get(r, x->block));
            if (x->valid > r->block_size) BAD("slot %u: valid %u > block size", s, x->valid);
        }
        if (x->pins) {
            pinned++;
            if (x->list != RES_LIST_NONE) BAD("pinned slot %u is on list %u", s, x->list);
        } else if (x->block != PKV_RES_NONE) {
            if (x->list != RES_LIST_LRU) BAD("unpinned resident slot %u not on the LRU", s);
        } else if (x->list != RES_LIST_FREE) {
            BAD("unpinned empty slot %u not on the free list", s);
        }
    }
    for (uint32_t s = r->free_head; s != PKV_RES_NONE; s = r->slots[s].next) {
        if (++nfree > r->n_slots) BAD("free list has a cycle");
        if (r->slots[s].list != RES_LIST_FREE) BAD("free list holds slot %u of list %u", s,
                                                    r->slots[s].list);
    }
    uint32_t prev = PKV_RES_NONE;
    for (uint32_t s = r->lru_head; s != PKV_RES_NONE; s = r->slots[s].next) {
        if (++nlru > r->n_slots) BAD("LRU list has a cycle");
        if (r->slots[s].list != RES_LIST_LRU) BAD("LRU list holds slot %u of list %u", s,
                                                   r->slots[s].list);
        if (r->slots[s].prev != prev) BAD("LRU back link of slot %u broken", s);
        prev = s;
    }
    if (prev != r->lru_tail) BAD("LRU tail is %u, last element %u", r->lru_tail, prev);
    if (nfree != r->free_count) BAD("free count %u, list holds %u", r->free_count, nfree);
    if (nlru != r->lru_count) BAD("LRU count %u, list holds %u", r->lru_count, nlru);
    if (pinned != r->pinned_count) BAD("pinned count %u, slots say %u", r->pinned_count, pinned);
    if (nfree + nlru + pinned != r->n_slots)
        BAD("free %u + lru %u + pinned %u != %u slots", nfree, nlru, pinned, r->n_slots);
    uint32_t mapped = 0;
    for (uint32_t i = 0; i <= r->map_mask; i++) {
        if (r->map_key[i] == PKV_RES_NONE) continue;
        mapped++;
        const uint32_t s = r->map_val[i];
        if (s >= r->n_slots || r->slots[s].block != r->map_key[i])
            BAD("map entry block %u -> slot %u does not match the slot", r->map_key[i], s);
    }
    if (mapped != resident) BAD("map holds %u blocks, %u slots are resident", mapped, resident);
    return 0;
}

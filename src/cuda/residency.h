/*
 * residency.h — the CPU-side bookkeeping of the CUDA layer: which arena blocks
 * live in which device block slot, which slots an in-flight batch pins, the LRU
 * order of the others, and the per-batch plan (copies to issue, device block
 * tables). Plain C, no CUDA: compiled into every build and unit-tested on the CPU
 * (tests/test_residency.c). src/cuda/cuda.c drives it under its own mutex; this
 * module does no locking.
 *
 * Model (docs/cuda.md, "Residency"):
 *  - A slot holds one arena block, or nothing. A resident slot carries the
 *    block's content tag (a 64-bit identity of the block's first `valid` tokens,
 *    computed by the caller, see glue.c) and `valid`, the number of leading
 *    tokens whose device copy is final.
 *  - A batch asks, per sequence, for `need` tokens to be valid on the device and
 *    says that the first `stable` of them are final on the host (covered by the
 *    tags it passes). A resident block is a hit when its tag equals the one asked
 *    for and valid >= need; otherwise it is copied again (the whole block), after
 *    which valid = stable.
 *  - Planning is all-or-nothing: either every block of the batch gets a slot (and
 *    every slot of the batch is pinned) or nothing at all changes (PKV_EFULL when
 *    the pool cannot hold the batch next to the slots pinned by other batches).
 *  - Slots pinned by any batch are never evicted and never overwritten: a block
 *    that must be re-copied while another batch pins its slot moves to a new slot
 *    and the old one becomes an orphan, freed when its last pin goes.
 *  - Eviction takes the least recently released unpinned slot (LRU head); free
 *    slots are used first.
 */
#ifndef PKV_CUDA_RESIDENCY_H
#define PKV_CUDA_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#define PKV_RES_NONE UINT32_MAX

typedef struct pkv_res_slot {
    uint32_t block;      /* arena block held, or PKV_RES_NONE (free or orphan) */
    uint32_t pins;       /* in-flight batches using the slot */
    uint32_t prev, next; /* links of the free list or the LRU list */
    uint64_t tag;        /* content tag of the block's first `valid` tokens */
    uint32_t valid;      /* leading tokens final on the device */
    uint8_t list;        /* RES_LIST_* */
    uint8_t pad[3];
    uint64_t mark;       /* planning epoch that last visited the slot */
} pkv_res_slot;

typedef struct pkv_res_stats {
    uint64_t plans, plans_failed;
    uint64_t hits;       /* distinct blocks of a batch already valid on the device */
    uint64_t copies;     /* blocks copied host -> device */
    uint64_t recopies;   /* of which were resident but stale or too short */
    uint64_t evictions;  /* resident blocks evicted to make room */
    uint64_t orphans;    /* slots orphaned (re-copy while pinned, invalidation) */
    uint64_t invalidations;
} pkv_res_stats;

typedef struct pkv_res {
    uint32_t n_slots;
    uint32_t n_blocks;   /* valid block ids are 0 .. n_blocks-1 */
    uint32_t block_size; /* tokens per block */
    pkv_res_slot *slots;
    /* map block -> slot: open addressing, linear probing, backward-shift delete */
    uint32_t *map_key, *map_val;
    uint32_t map_mask;
    uint32_t free_head, free_count;
    uint32_t lru_head, lru_tail, lru_count; /* head = least recently released */
    uint32_t pinned_count;                  /* slots with pins > 0 */
    uint64_t epoch;
    pkv_res_stats st;
} pkv_res;

/* One sequence of a batch. Block i holds tokens [i*B, (i+1)*B). */
typedef struct pkv_res_seq {
    const uint32_t *blocks; /* the sequence's block table */
    const uint64_t *tags;   /* tags[i]: tag of block i's first min(B, stable - i*B)
                               tokens (NULL: all 0) */
    uint32_t n_blocks;      /* entries, >= ceil(len / B) */
    uint32_t len;           /* tokens the kernel attends (>= 1) */
    uint32_t need;          /* tokens that must be valid from the host, <= len */
    uint32_t stable;        /* tokens final on the host (committed), <= need */
} pkv_res_seq;

/* A host -> device copy to issue: the whole block into the slot. */
typedef struct pkv_res_copy {
    uint32_t block, slot;
} pkv_res_copy;

typedef struct pkv_res_plan {
    uint32_t n_seqs;
    uint32_t table_stride; /* entries per row of tables, >= 1 */
    uint32_t max_len;
    uint32_t *tables;      /* [n_seqs][table_stride] slot ids, PKV_RES_NONE padded */
    uint32_t *lens;        /* [n_seqs] */
    pkv_res_copy *copies;
    uint32_t n_copies;
    uint32_t *pinned;      /* the distinct slots this plan pinned */
    uint32_t n_pinned;
    uint32_t n_blocks;     /* distinct blocks of the batch */
    uint32_t hits;
} pkv_res_plan;

/* n_slots >= 1, n_blocks >= 1, block_size >= 1. PKV_EINVAL / PKV_ENOMEM. */
int pkv_res_init(pkv_res *r, uint32_t n_slots, uint32_t n_blocks, uint32_t block_size);
void pkv_res_free(pkv_res *r);

/* Plan a batch: give every block a slot, pin the batch's slots, choose the copies
 * and build the device block tables. All-or-nothing: on any error nothing in `r`
 * changed and *plan is empty. Errors: PKV_EINVAL (bad argument: len 0, need >
 * len, stable > need, NULL table), PKV_ERANGE (a table shorter than len needs, a
 * block id >= n_blocks), PKV_EFULL (the pool
 * cannot hold the batch beside the slots other batches pin), PKV_ENOMEM. A block
 * may appear in several sequences (shared prefixes): it gets one slot, copied at
 * most once, with the largest need of its occurrences. */
int pkv_res_plan_batch(pkv_res *r, const pkv_res_seq *seqs, size_t n, pkv_res_plan *plan);

/* The batch is done with its slots (its kernels are enqueued): unpin them; a slot
 * whose last pin goes becomes the most recently used (or free, if orphaned). The
 * plan's arrays are freed and *plan zeroed. */
void pkv_res_release(pkv_res *r, pkv_res_plan *plan);

/* The copies of a plan could not be issued: forget the blocks they were to bring
 * (their slots hold nothing valid) and release the plan. */
void pkv_res_abort(pkv_res *r, pkv_res_plan *plan);

/* Free a plan's arrays without touching `r` (for a plan that failed). */
void pkv_res_plan_free(pkv_res_plan *plan);

/* A resident block's device copy now holds `valid` final tokens with tag `tag`
 * (after GPU-produced K/V was written back). PKV_ERANGE if the block is not
 * resident. */
int pkv_res_set_valid(pkv_res *r, uint32_t block, uint64_t tag, uint32_t valid);

/* The block's contents changed or it was freed: drop it from the device pool (its
 * slot becomes free, or an orphan while pinned). No-op if not resident. */
void pkv_res_invalidate(pkv_res *r, uint32_t block);

/* Drop every resident block that no batch pins (they become free). */
void pkv_res_drop_unpinned(pkv_res *r);

/* Slot of a resident block (PKV_RES_NONE if none); tag / valid may be NULL. */
uint32_t pkv_res_lookup(const pkv_res *r, uint32_t block, uint64_t *tag, uint32_t *valid);

/* Blocks of the unpinned resident slots, least recently used first (cap at
 * most); returns their number. */
size_t pkv_res_lru_blocks(const pkv_res *r, uint32_t *out, size_t cap);

typedef struct pkv_res_counts {
    uint32_t free, lru, pinned, orphans, resident;
} pkv_res_counts;
void pkv_res_counts_get(const pkv_res *r, pkv_res_counts *out);

/* Verify every invariant (map <-> slots, lists, counts). 0 or PKV_ECORRUPT with
 * the first broken one in why[0..len). */
int pkv_res_check(const pkv_res *r, char *why, size_t len);

#endif /* PKV_CUDA_RESIDENCY_H */

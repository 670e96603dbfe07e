/*
 * trace_sim.h — a block-level simulator of pagedkv's cache accounting, for
 * comparing eviction policies on a trace (pkv-trace, tests/test_trace.c).
 *
 * It replays the same operations the engine replay makes, block by block, with
 * exactly the engine's capacity accounting:
 *  - a request opens with its prompt: the longest chain of cached blocks matching
 *    the prompt's first maxb = (n - 1) / bs blocks (the last prompt token is always
 *    computed) is attached (pinned); hit/miss tokens and blocks are counted as
 *    pkv_get_stats counts them;
 *  - the rest of the prompt and then the output are appended and committed in
 *    batches of `batch` tokens: each append takes the blocks it needs (a free one,
 *    else an eviction), each commit seals the blocks it fills; a sealed block whose
 *    content is already cached under the same parent replaces it (dedupe, the open
 *    copy is freed) — this only happens to the last prompt block when the prompt is
 *    a multiple of bs long and fully cached;
 *  - the close releases the table; sealed blocks become cached (evictable), open
 *    ones free. Blocks of the running request count against capacity.
 * Physical block identities are simulated like the engine's (a block hits only
 * under the very parent it was sealed under), so a policy that evicts a parent
 * before its children strands them: they stay in the cache, unusable, until they
 * are evicted in turn.
 *
 * Policies (all O(1) per operation except Belady, O(log n)):
 *  leaf-lru   the engine's: one LRU list in release order, released tail-first
 *             (children before parents), evict the head (always a leaf);
 *  lru        plain LRU over all cached blocks, released in table order (a parent
 *             before its children), evict the head even if it has cached children;
 *  belady     evict the cached block whose next use as a hit candidate lies
 *             furthest in the future (clairvoyant), deeper block first on ties;
 *             blocks never used again go first;
 *  leaf-slru  leaf-first segmented LRU: a block reused while cached (hit or
 *             dedupe) is protected, others are on probation; protected blocks may
 *             fill `protect` of the capacity, beyond that the protected LRU head is
 *             demoted to the probation tail; evict the probation head (or, with
 *             probation empty, the protected head). With a ghost window (`ghost` >
 *             0), a block sealed again within `ghost` x capacity evictions of its
 *             eviction counts as reused (protected), as in 2Q/ARC. With no ghosts
 *             it is the engine's PKV_EVICT_LEAF_SLRU, block for block (pkv-trace
 *             --engine-policy leaf-slru checks it);
 *  leaf-mq    the same with four levels by reuse count (0, 1, 2-3, 4+): evict from
 *             the lowest level, demote the head of the lowest protected level.
 * Why the segmented policies stay leaf-first in O(1): a parent is counted at least
 * as often as each child (enforced at release), so levels never increase towards
 * the leaves; within a level children are released, hence queued, before their
 * parents. The head of the lowest non-empty level is therefore a leaf, and
 * demoting a level's head keeps both properties. strands == 0 checks it.
 */
#ifndef PKV_TRACE_SIM_H
#define PKV_TRACE_SIM_H

#include "trace_data.h"

typedef enum sim_policy {
    SIM_LEAF_LRU = 0,
    SIM_LRU,
    SIM_BELADY,
    SIM_LEAF_SLRU,
    SIM_LEAF_MQ,
    SIM_NPOLICIES
} sim_policy;

const char *sim_policy_name(sim_policy p);
/* -1 if unknown */
int sim_policy_parse(const char *name);

typedef struct sim_params {
    uint64_t capacity;  /* blocks */
    uint32_t batch;     /* tokens per append + commit (as the engine replay) */
    sim_policy policy;
    double protect;     /* leaf-slru, leaf-mq: protected share of capacity (0..1];
                           0 = 0.5 */
    uint64_t protect_blocks; /* if > 0: the most blocks protected, instead of
                           protect x capacity (the engine's percent, exactly) */
    double ghost;       /* leaf-slru, leaf-mq: ghost window in evictions as a multiple
                           of capacity; 0 = no ghosts */
    size_t limit;       /* replay only the first `limit` requests (0 = all) */
} sim_params;

typedef struct sim_result {
    uint64_t requests;
    uint64_t hit_tokens, miss_tokens; /* as pkv_get_stats */
    uint64_t hit_blocks, miss_blocks;
    uint64_t evictions, seals, dedupes;
    uint64_t strands;      /* evictions of a block that had cached children */
    uint64_t dead_evicted; /* evictions of blocks that could not hit any more */
    int64_t failed_request; /* -1, or the request that needed more than capacity */
    double seconds;
} sim_result;

/* 0, or -1 (out of memory, or a request larger than the capacity: then
 * failed_request says which and the counters cover the requests before it). */
int sim_run(const trace *t, const trace_blocks *tb, const sim_params *p, sim_result *out);

#endif /* PKV_TRACE_SIM_H */

/*
 * sealsum.c — seal checksums computed ahead, on helper threads: for a
 * pkv_seq_step_batch call, and for a commit that seals several blocks.
 *
 * Sealing a block checksums its whole K/V payload (seq.c seal(), pkv_arena_sum):
 * at a model's real block size, ~150 us for 2 MiB on one core at memory speed. A
 * scheduler thread stepping 256 sequences seals ~16 blocks per step, so the
 * checksums alone took it ~2.4 ms per step, and committing a 4k-token prefill
 * seals 256 blocks at once (~38 ms). With pkv_options.seal_threads > 1, a batch
 * first finds the blocks its commits will seal and checksums them on up to that
 * many threads (the calling thread is one of them), then runs its steps as
 * before; a single commit that seals two blocks or more does the same for them
 * just before it seals (pkv_seal_sums_range); seal() takes the sum computed
 * ahead instead of computing it.
 *
 * Invariants. The cache lock is held throughout; the helpers only read payload.
 * A block computed ahead is BLK_OPEN and carries BLKF_PRESUM with the sum in
 * payload_sum (unused while a block is open). The sum stays right while the flag
 * is set: nothing in the library writes an open block's payload (a copy-on-write
 * writes a new block), the caller must have written a block's K/V before it
 * commits it, freeing a block clears its flags, and pkv_seq_truncate clears the
 * flag of the block it cuts into (a later append may rewrite those slots). The
 * batch clears every flag it set before it returns (pkv_seal_sums_done), and a
 * single commit seals every block it marked right away, so no block carries one
 * outside the call that set it (pkv_check I10).
 *
 * The prediction uses each sequence's state before the batch; a sequence that
 * appears twice in a batch may seal other blocks than predicted. That costs only
 * a checksum computed in vain or one computed by seal() as before, never a wrong
 * sum: a sum belongs to a block's payload, not to a step.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

/* Below this payload size a checksum costs less than starting a thread. */
#define SEALSUM_MIN_BYTES (256u << 10)

typedef struct sum_job {
    const pkv_arena *arena;
    const uint32_t *blocks;
    uint64_t *sums;
    size_t n, first, stride;
} sum_job;

static void *sum_worker(void *arg) {
    sum_job *j = arg;
    for (size_t i = j->first; i < j->n; i += j->stride)
        j->sums[i] = pkv_arena_sum(j->arena, j->blocks[i]);
    return NULL;
}

/* The open blocks the batch's commits will seal, from each sequence's current
 * state; each at most once. Returns the count (0 on an allocation failure). */
static size_t predict(pkv_cache *c, const pkv_step *steps, size_t n, uint32_t **out) {
    const pkv_pool *p = &c->pool;
    size_t cap = 0, k = 0;
    uint32_t *list = NULL;
    for (size_t i = 0; i < n; i++) {
        const pkv_seq *s = pkv_seqmap_get(&c->seqs, steps[i].id);
        uint64_t nc = steps[i].n_commit;
        if (!s || nc == 0 || nc > s->len - s->committed) continue;
        uint64_t first = pkv_bdiv(p, s->committed), full = pkv_bdiv(p, s->committed + nc);
        for (uint64_t j = first; j < full; j++) {
            uint32_t b = s->blocks[j];
            pkv_block *x = &c->pool.b[b];
            if (x->state != BLK_OPEN || (x->flags & BLKF_PRESUM)) continue;
            if (k == cap) {
                cap = cap ? 2 * cap : 32;
                uint32_t *nl = realloc(list, cap * sizeof *nl);
                if (!nl) { /* only an optimization: seal() computes them */
                    for (size_t m = 0; m < k; m++) c->pool.b[list[m]].flags &= (uint8_t)~BLKF_PRESUM;
                    free(list);
                    return 0;
                }
                list = nl;
            }
            x->flags |= BLKF_PRESUM; /* marks it listed; the sum follows */
            list[k++] = b;
        }
    }
    *out = list;
    return k;
}

/* Checksum list[0..k) (open blocks, marked BLKF_PRESUM) on up to seal_threads
 * threads, the calling one included, and store each sum in its block. */
static void compute(pkv_cache *c, const uint32_t *list, size_t k) {
    uint64_t *sums = malloc(k * sizeof *sums);
    if (!sums) { /* only an optimization: seal() computes them */
        for (size_t i = 0; i < k; i++) c->pool.b[list[i]].flags &= (uint8_t)~BLKF_PRESUM;
        return;
    }
    size_t nt = c->seal_threads < k ? c->seal_threads : k;
    if (nt == 0) nt = 1;
    sum_job jobs[PKV_SEAL_THREADS_MAX] = {{0}};
    pthread_t thr[PKV_SEAL_THREADS_MAX];
    bool started[PKV_SEAL_THREADS_MAX] = {false};
    for (size_t t = 0; t < nt; t++)
        jobs[t] = (sum_job){&c->arena, list, sums, k, t, nt};
    /* Helpers take jobs 1..nt-1; a helper that cannot start leaves its share
     * to the calling thread, which runs job 0 meanwhile. */
    for (size_t t = 1; t < nt; t++)
        started[t] = pthread_create(&thr[t], NULL, sum_worker, &jobs[t]) == 0;
    sum_worker(&jobs[0]);
    for (size_t t = 1; t < nt; t++) {
        if (started[t]) pthread_join(thr[t], NULL);
        else sum_worker(&jobs[t]);
    }
    for (size_t i = 0; i < k; i++) {
        pkv_block *x = &c->pool.b[list[i]];
        pkv_assert(x->state == BLK_OPEN && (x->flags & BLKF_PRESUM));
        x->payload_sum = sums[i];
    }
    free(sums);
    c->seal_sums_ahead += k;
}

size_t pkv_seal_sums_ahead(pkv_cache *c, const pkv_step *steps, size_t n, uint32_t **listp) {
    *listp = NULL;
    if (c->seal_threads < 2 || c->arena.geo.block_bytes < SEALSUM_MIN_BYTES) return 0;
    uint32_t *list = NULL;
    size_t k = predict(c, steps, n, &list);
    if (k == 0) return 0;
    compute(c, list, k);
    *listp = list;
    return k;
}

void pkv_seal_sums_range(pkv_cache *c, const pkv_seq *s, uint64_t first, uint64_t full) {
    if (c->seal_threads < 2 || full - first < 2 ||
        c->arena.geo.block_bytes < SEALSUM_MIN_BYTES)
        return;
    uint32_t *list = malloc((size_t)(full - first) * sizeof *list);
    if (!list) return; /* only an optimization */
    size_t k = 0;
    for (uint64_t j = first; j < full; j++) {
        pkv_block *x = &c->pool.b[s->blocks[j]];
        if (x->state != BLK_OPEN || (x->flags & BLKF_PRESUM)) continue; /* (a batch's) */
        x->flags |= BLKF_PRESUM;
        list[k++] = s->blocks[j];
    }
    if (k >= 2) compute(c, list, k);
    else if (k == 1) c->pool.b[list[0]].flags &= (uint8_t)~BLKF_PRESUM;
    free(list);
}

void pkv_seal_sums_done(pkv_cache *c, uint32_t *list, size_t k) {
    for (size_t i = 0; i < k; i++) {
        pkv_block *x = &c->pool.b[list[i]];
        if (x->state == BLK_OPEN) x->flags &= (uint8_t)~BLKF_PRESUM; /* not sealed */
    }
    free(list);
}

/*
 * sealsum.c — seal checksums computed ahead, on helper threads: for a
 * pkv_seq_step_batch call, and for a commit that seals several blocks.
 *
 * Sealing a block checksums its whole K/V payload (seq.c seal(), pkv_arena_sum),
 * which at a real model's block size (megabytes) is memory-bound work that a
 * scheduler thread stepping hundreds of sequences, or a long prefill sealing
 * hundreds of blocks at once, would otherwise do serially. With
 * pkv_options.seal_threads > 1, a batch first finds the blocks its commits will seal and checksums them on up to that
 * many threads (the calling thread is one of them), then runs its steps as
 * before; a single commit that seals two blocks or more does the same for them
 * just before it seals (pkv_seal_sums_range); seal() takes the sum computed
 * ahead instead of computing it.
 *
 * Invariants. The helpers only read payload, while the calling thread holds the
 * cache lock. A block computed ahead is BLK_OPEN and carries BLKF_PRESUM with the
 * sum in payload_sum (unused while a block is open). The sum stays right while
 * the flag is set, also while a batch step waits for the log with the lock
 * released (throttle, limbo): nothing in the library writes an open block's
 * payload (a copy-on-write writes a new block), the caller must have written a
 * block's K/V before it commits it and no other caller is handed its slots
 * (rule S4), freeing a block clears its flags, and pkv_seq_truncate clears the
 * flag of the block it cuts into (a later append may rewrite those slots). The
 * batch clears every flag it set before it returns (pkv_seal_sums_done), and a
 * single commit seals every block it marked right away, so no block carries one
 * while no call that set one is running: c->presum_calls counts those calls, so
 * a pkv_check that runs while a batch waits does not take its marks for strays
 * (I10).
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

/* A growable list of the blocks marked BLKF_PRESUM by one call. */
typedef struct marks {
    uint32_t *b;
    size_t n, cap;
    bool oom; /* growing failed: the call computes nothing ahead */
} marks;

static void unmark(pkv_cache *c, const uint32_t *list, size_t k) {
    for (size_t i = 0; i < k; i++) c->pool.b[list[i]].flags &= (uint8_t)~BLKF_PRESUM;
}

/* Mark and list the open blocks of s->blocks[first, full) not marked yet (a
 * block already marked belongs to an enclosing batch). */
static void mark_range(pkv_cache *c, const pkv_seq *s, uint64_t first, uint64_t full,
                       marks *m) {
    for (uint64_t j = first; j < full && !m->oom; j++) {
        uint32_t b = s->blocks[j];
        pkv_block *x = &c->pool.b[b];
        if (x->state != BLK_OPEN || (x->flags & BLKF_PRESUM)) continue;
        if (m->n == m->cap) {
            size_t cap = m->cap ? 2 * m->cap : 32;
            uint32_t *nb = realloc(m->b, cap * sizeof *nb);
            if (!nb) { /* only an optimization: seal() computes them */
                m->oom = true;
                break;
            }
            m->b = nb;
            m->cap = cap;
        }
        x->flags |= BLKF_PRESUM; /* the sum follows (compute) */
        m->b[m->n++] = b;
    }
}

/* Checksum list[0..k) (open blocks, marked BLKF_PRESUM) on up to seal_threads
 * threads, the calling one included, and store each sum in its block. */
static void compute(pkv_cache *c, const uint32_t *list, size_t k) {
    uint64_t *sums = malloc(k * sizeof *sums);
    if (!sums) { /* only an optimization: seal() computes them */
        unmark(c, list, k);
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

/* Mark, then compute when there are at least `min` blocks; else unmark. Returns
 * the count computed (m->b stays the caller's to free). */
static size_t finish_marks(pkv_cache *c, marks *m, size_t min) {
    if (m->oom || m->n < min) {
        unmark(c, m->b, m->n);
        return 0;
    }
    compute(c, m->b, m->n);
    return m->n;
}

static bool worth_it(const pkv_cache *c) {
    return c->seal_threads >= 2 && c->arena.geo.block_bytes >= SEALSUM_MIN_BYTES;
}

size_t pkv_seal_sums_ahead(pkv_cache *c, const pkv_step *steps, size_t n, uint32_t **listp) {
    *listp = NULL;
    if (!worth_it(c)) return 0;
    marks m = {0};
    const pkv_pool *p = &c->pool;
    for (size_t i = 0; i < n; i++) { /* the blocks each step's commit will seal */
        const pkv_seq *s = pkv_seqmap_get(&c->seqs, steps[i].id);
        uint64_t nc = steps[i].n_commit;
        if (s && nc && nc <= s->len - s->committed)
            mark_range(c, s, pkv_bdiv(p, s->committed), pkv_bdiv(p, s->committed + nc), &m);
    }
    size_t k = finish_marks(c, &m, 1);
    if (k) {
        *listp = m.b;
        c->presum_calls++; /* until pkv_seal_sums_done: its steps may wait unlocked */
    } else {
        free(m.b);
    }
    return k;
}

void pkv_seal_sums_range(pkv_cache *c, const pkv_seq *s, uint64_t first, uint64_t full) {
    if (!worth_it(c)) return;
    marks m = {0};
    mark_range(c, s, first, full, &m);
    finish_marks(c, &m, 2); /* one block: no thread to share it with */
    free(m.b);
}

void pkv_seal_sums_done(pkv_cache *c, uint32_t *list, size_t k) {
    unmark(c, list, k); /* those not sealed (sealing and freeing clear the flags) */
    free(list);
    pkv_assert(c->presum_calls > 0);
    c->presum_calls--;
}

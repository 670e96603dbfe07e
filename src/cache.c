/*
 * cache.c — the cache handle: opening and closing, geometry, payload addresses,
 * statistics.
 *
 * A handle owns the arena mapping, the block pool, the prefix index and the
 * sequence map; one mutex serializes every call that reads or writes them
 * (pkv_kv is pure arithmetic on immutable geometry and takes no lock).
 * Opening recovers the metadata from the newest checkpoint and the log
 * (wal/replay.c), then starts the log flusher (wal/log.c); closing flushes and
 * syncs the log before it unmaps anything.
 */
#include "internal.h"
#include "tier.h"

#include <stdlib.h>

void pkv_options_init(pkv_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->dtype = PKV_F16;
    opt->block_size = 16;
}

static int wal_init(pkv_cache *c, const char *dir, const pkv_options *opt) {
    pkv_wal *w = &c->wal;
    w->io = opt->io ? opt->io : pkv_io_default();
    w->dir = strdup(dir);
    if (!w->dir) return pkv_err(PKV_ENOMEM, "directory name");
    w->mode = opt->durability; /* validated by check_options */
    w->interval_us = opt->group_commit_us ? opt->group_commit_us : 2000;
    w->ckpt_bytes = opt->checkpoint_bytes ? opt->checkpoint_bytes : 64ull << 20;
    w->ckpt_adaptive = opt->checkpoint_bytes == 0;
    w->delta_floor = DELTA_FLOOR;
    w->full_only = opt->flags & PKV_OPEN_FULL_CHECKPOINTS;
    w->seg_size = opt->log_segment_bytes ? opt->log_segment_bytes : SEG_SIZE_DEFAULT;
    /* A frame larger than a segment gets a file of its own size: keep a busy log's
     * frames within small segments (pkv_options.log_segment_bytes). */
    w->kick = w->seg_size / 4 < PKV_WAL_KICK ? (size_t)(w->seg_size / 4) : PKV_WAL_KICK;
    w->backlog = w->seg_size / 2 < PKV_WAL_BACKLOG ? (size_t)(w->seg_size / 2) : PKV_WAL_BACKLOG;
    w->arena_secret = c->arena.secret;
    w->arena_fd = c->arena.fd;
    w->seg_fd = -1;
    return 0;
}

/* Every check of `opt` (and `dir`) that needs no file, so that an invalid option
 * fails before the open creates or locks anything. pkv_arena_open repeats the
 * geometry and model_id checks for its own callers. */
static int check_options(const char *dir, const pkv_options *opt) {
    if (opt->flags & ~(PKV_OPEN_RDONLY | PKV_OPEN_POINT_IN_TIME | PKV_OPEN_PREFAULT |
                       PKV_OPEN_NO_LIMBO_WAIT | PKV_OPEN_FULL_CHECKPOINTS |
                       PKV_OPEN_LIMBO_WAIT))
        return pkv_err(PKV_EINVAL, "unknown flags 0x%x", opt->flags);
    if ((opt->flags & PKV_OPEN_LIMBO_WAIT) && (opt->flags & PKV_OPEN_NO_LIMBO_WAIT))
        return pkv_err(PKV_EINVAL, "PKV_OPEN_LIMBO_WAIT and PKV_OPEN_NO_LIMBO_WAIT together");
    pkv_geometry g;
    int rc = pkv_geometry_from_options(opt, &g);
    if (rc) return rc;
    if (!opt->model_id || !opt->model_id[0] || strlen(opt->model_id) > PKV_MODEL_ID_MAX)
        return pkv_err(PKV_EINVAL, "model_id must be 1..%u bytes", PKV_MODEL_ID_MAX);
    if (!dir || !dir[0]) return pkv_err(PKV_EINVAL, "directory is NULL or empty");
    if ((unsigned)opt->durability > PKV_DURABLE_ALWAYS)
        return pkv_err(PKV_EINVAL, "unknown durability mode %d", (int)opt->durability);
    if ((unsigned)opt->eviction > PKV_EVICT_LEAF_SLRU)
        return pkv_err(PKV_EINVAL, "unknown eviction policy %d", (int)opt->eviction);
    if (opt->evict_protect_pct > 100)
        return pkv_err(PKV_EINVAL, "evict_protect_pct %u exceeds 100", opt->evict_protect_pct);
    if (opt->group_commit_us > 10000000)
        return pkv_err(PKV_EINVAL, "group_commit_us %u exceeds 10 s", opt->group_commit_us);
    if (opt->seal_threads > PKV_SEAL_THREADS_MAX)
        return pkv_err(PKV_EINVAL, "seal_threads %u exceeds %u", opt->seal_threads,
                       PKV_SEAL_THREADS_MAX);
    /* A segment must hold its header and the largest record of fixed size (a SEAL of
     * PKV_BLOCK_SIZE_MAX tokens, ~4 KiB) with room to spare, and recovery reads no
     * segment larger than 16 GiB (docs/format.md); larger frames get a segment of
     * their own size (log.c seg_create). */
    if (opt->log_segment_bytes &&
        (opt->log_segment_bytes < PKV_LOG_SEGMENT_MIN ||
         opt->log_segment_bytes > PKV_LOG_SEGMENT_MAX))
        return pkv_err(PKV_EINVAL, "log_segment_bytes %llu outside %llu..%llu (0: 32 MiB)",
                       (unsigned long long)opt->log_segment_bytes,
                       (unsigned long long)PKV_LOG_SEGMENT_MIN,
                       (unsigned long long)PKV_LOG_SEGMENT_MAX);
    const pkv_io_ops *io = opt->io;
    if (io && (!io->open || !io->close || !io->pread || !io->write || !io->sync ||
               !io->allocate || !io->rename || !io->unlink || !io->sync_dir))
        return pkv_err(PKV_EINVAL, "the I/O backend has a NULL member");
    return 0;
}

int pkv_open(const char *dir, const pkv_options *opt, pkv_cache **out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    *out = NULL;
    pkv_err_clear();
    if (!opt) return pkv_err(PKV_EINVAL, "options are NULL");
    int rc0 = check_options(dir, opt);
    if (rc0) return rc0;
    /* Register for membarrier now, outside the lock: the first grant of the lock's
     * bias would otherwise do it with the lock held, and in a process with more
     * than one thread registration waits for an RCU grace period (ms). */
    (void)pkv_mutex_bias_available();
    /* 64-byte aligned: the lock has a cache line of its own (internal.h) */
    pkv_cache *c = aligned_alloc(_Alignof(pkv_cache), sizeof *c);
    if (!c) return pkv_err(PKV_ENOMEM, "cache handle");
    memset(c, 0, sizeof *c);
    /* c->lock and the log's condition variables are ready zeroed (lock.c) */
    c->rdonly = opt->flags & PKV_OPEN_RDONLY;
    c->limbo_wait = opt->flags & PKV_OPEN_LIMBO_WAIT;
    c->seal_threads = opt->seal_threads;
    c->limbo.head = c->limbo.tail = PKV_NONE;
    c->wal.seg_fd = -1;
    int rc = pkv_arena_open(&c->arena, dir, opt, c->rdonly);
    if (rc) {
        free(c);
        return rc;
    }
    const pkv_geometry *g = &c->arena.geo;
    uint64_t next_lsn = 1, next_seg = 1;
    if ((rc = pkv_pool_init(&c->pool, (uint32_t)g->capacity, g->block_size))) goto fail;
    pkv_evict_init(&c->pool.pol, opt->eviction,
                   opt->evict_protect_pct ? opt->evict_protect_pct : 50, (uint32_t)g->capacity);
    if ((rc = pkv_index_init(&c->index, (uint32_t)g->capacity)) ||
        (rc = pkv_seqmap_init(&c->seqs)) || (rc = wal_init(c, dir, opt)) ||
        (rc = pkv_recover(c, dir, opt->flags, &next_lsn, &next_seg)))
        goto fail;
    c->ctr_at_open = c->ctr;
    if (!c->rdonly) {
        if ((rc = pkv_wal_start(c, next_lsn, next_seg))) goto fail;
        /* After cutting a damaged log, or dropping lost blocks, make the repaired
         * state the new base at once so the damage is never read again. With
         * PKV_OPEN_FULL_CHECKPOINTS, a chain of deltas is replaced by a full
         * checkpoint at once too, so the directory is one older builds read. */
        if (c->rec.repaired || (c->wal.full_only && c->rec.checkpoint_deltas)) {
            pkv_lock(c);
            rc = pkv_wal_checkpoint(c);
            pkv_unlock(c);
            if (rc) goto fail;
        }
        /* Rule D8: from here on, a NONE-mode writer's records and payload may sit
         * in the page cache only; the marker tells recovery after a restart. */
        if ((rc = pkv_unsynced_begin(c))) goto fail;
    }
    *out = c;
    return 0;
fail: {
        char why[512];
        snprintf(why, sizeof why, "%s", pkv_last_error());
        pkv_close(c);
        return pkv_err(rc, "%s", why);
    }
}

void pkv_close(pkv_cache *c) {
    if (!c) return;
    if (c->remote) {
        pkv_remote_close(c);
        return;
    }
    pkv_metrics_detach_all(c);
    pkv_tier_detach(c); /* its publisher takes the lock: before anything is freed */
    /* flushes and syncs what is left; a clean end removes the unsynced marker */
    if (pkv_wal_stop(c) == 0) pkv_unsynced_end(c);
    pkv_wal_free(&c->wal);
    pkv_seqmap_free(&c->seqs);
    pkv_index_free(&c->index);
    pkv_pool_free(&c->pool);
    pkv_arena_close(&c->arena);
    free(c);
}

int pkv_sync(pkv_cache *c) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    PKV_REMOTE(c, pkv_remote_sync(c));
    pkv_lock(c);
    int rc = pkv_wal_writable(c);
    if (!rc) rc = pkv_wal_sync(c);
    pkv_unlock(c);
    return rc;
}

int pkv_checkpoint(pkv_cache *c) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    PKV_LOCAL_ONLY(c, "pkv_checkpoint");
    pkv_lock(c);
    int rc = pkv_wal_writable(c);
    if (!rc) rc = pkv_wal_checkpoint(c);
    pkv_unlock(c);
    return rc;
}

int pkv_get_recovery(pkv_cache *c, pkv_recovery *out) {
    if (!c || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    PKV_LOCAL_ONLY(c, "pkv_get_recovery");
    pkv_lock(c);
    *out = c->rec;
    pkv_unlock(c);
    return 0;
}

int pkv_info(const pkv_cache *c, pkv_cache_info *out) {
    if (!c || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    const pkv_geometry *g = &c->arena.geo;
    memset(out, 0, sizeof *out);
    out->num_layers = g->num_layers;
    out->num_kv_heads = g->num_kv_heads;
    out->head_dim = g->head_dim;
    out->block_size = g->block_size;
    out->dtype = (pkv_dtype)g->dtype;
    out->elem_size = g->elem_size;
    out->capacity = g->capacity;
    out->block_bytes = g->block_bytes;
    out->slot_bytes = g->slot_bytes;
    out->run_bytes = g->run_bytes;
    memcpy(out->model_id, c->arena.model_id, sizeof out->model_id);
    return 0;
}

void *pkv_kv(const pkv_cache *c, uint32_t block, uint32_t layer, pkv_kind kind,
             uint32_t head) {
    if (!c) return NULL;
    const pkv_geometry *g = &c->arena.geo;
    uint64_t nblocks = c->arena.rdonly ? c->arena.valid_blocks : g->capacity;
    if (block >= nblocks || layer >= g->num_layers || head >= g->num_kv_heads ||
        (kind != PKV_K && kind != PKV_V))
        return NULL;
    return pkv_arena_run(&c->arena, block, layer, (uint32_t)kind, head);
}

int pkv_get_stats(pkv_cache *c, pkv_stats *out) {
    if (!c || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    PKV_REMOTE(c, pkv_remote_stats(c, out));
    pkv_lock(c);
    pkv_stats_locked(c, out);
    pkv_unlock(c);
    return 0;
}

void pkv_stats_locked(const pkv_cache *c, pkv_stats *out) {
    const pkv_pool *p = &c->pool;
    memset(out, 0, sizeof *out);
    out->capacity = p->capacity;
    out->blocks_free = p->free.count + c->limbo.count;
    out->blocks_cached = pkv_evict_count(&p->pol);
    out->blocks_used = p->n_used;
    out->blocks_sealed = p->n_sealed;
    out->sequences = c->seqs.count;
    out->hit_tokens = c->ctr.hit_tokens;
    out->miss_tokens = c->ctr.miss_tokens;
    out->hit_blocks = c->ctr.hit_blocks;
    out->miss_blocks = c->ctr.miss_blocks;
    out->evictions = c->ctr.evictions;
    out->cow_copies = c->ctr.cow_copies;
    out->dedupes = c->ctr.dedupes;
    out->seals = c->ctr.seals;
    out->verify_failures = c->ctr.verify_failures;
    const pkv_wal *w = &c->wal;
    out->wal_records = w->records;
    out->wal_frames = w->frames;
    out->wal_syncs = w->syncs;
    out->wal_bytes = w->bytes;
    out->last_lsn = w->next_lsn ? w->next_lsn - 1 : 0;
    out->durable_lsn = w->durable_lsn;
    out->checkpoints = w->checkpoints;
    out->checkpoint_deltas = w->ckpt_deltas;
    out->checkpoint_lsn = w->ckpt_lsn;
    out->cuda_handles = c->cuda_handles;
    out->cuda_mode = c->cuda_mode;
    out->seal_sums_ahead = c->seal_sums_ahead;
    out->wal_max_delay_us = w->max_delay_ns / 1000u;
    out->checkpoint_failures = w->ckpt_failures;
    out->checkpoint_error = w->ckpt_err;
    out->checkpoint_backoff_ms = w->ckpt_backoff_ms;
    out->waits_limbo = c->ctr.waits_limbo;
    out->waits_seal = c->ctr.waits_seal;
    out->waits_backlog = c->ctr.waits_backlog;
    out->wait_limbo_us = c->ctr.wait_limbo_ns / 1000u;
    out->wait_seal_us = c->ctr.wait_seal_ns / 1000u;
    out->wait_backlog_us = c->ctr.wait_backlog_ns / 1000u;
    out->limbo_evict_max = c->ctr.limbo_evict_max;
    out->blocks_limbo = c->limbo.count;
    pkv_tier_stats(c, out);
}

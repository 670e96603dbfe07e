/*
 * wal/log.c — appending records, group commit, segments, the flusher thread.
 *
 * Segment file wal-<seg no, 16 hex digits>, little-endian:
 *     0  "PKVWAL\0\0"          8  u32 version (1)      12  u32 epoch (random)
 *    16  u64 segment number   24  u64 first LSN it may hold
 *    32  u64 arena secret (which arena the log describes)
 *    40  u64 allocated size   48  u64 zero           56  u64 XXH3-64 of [0, 56)
 *    64  frames ...
 * Frame (one group commit, one write + fdatasync):
 *     0  u32 magic "PKVF"      4  u32 epoch           8  u64 first LSN
 *    16  u32 record count     20  u32 record bytes   24  u64 XXH3-64(seed epoch)
 *                                                        of [0, 24) + records
 *    32  records (wal/record.c), each checksummed with the same epoch
 *
 * A recycled segment gets a fresh random epoch, so frames left in it from its
 * previous life fail their checksums and end the log there.
 *
 * Concurrency: records are appended to w->buf under the cache lock. The flusher
 * thread alone writes segment files: it swaps w->buf with its own buffer under
 * the lock, releases the lock, flushes the arena if payload was written (payload
 * before the records that seal it), writes the frame with a linked fdatasync,
 * and publishes written_lsn / durable_lsn under the lock. Waiters sleep on
 * cv_done with the cache lock released. A second thread takes checkpoints
 * (do_checkpoint): it copies the snapshot under the lock in slices, waits on
 * cv_done until the flusher made everything the snapshot shows durable, writes
 * the checkpoint without the lock, and under the lock renames covered segments
 * into spares (which is why the flusher claims a spare under the lock too).
 * Any write or sync error of the log or the arena is final: the cache enters its
 * failed state (w->failed) and every later mutation fails. A checkpoint that runs
 * out of memory or space while only its temporary file was written does not: the
 * file is discarded, the log still holds everything, and automatic attempts back
 * off (ckpt_discarded).
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

int pkv_wal_path(const pkv_wal *w, char *out, size_t n, const char *prefix, uint64_t no) {
    int k = snprintf(out, n, "%s/%s%016llx", w->dir, prefix, (unsigned long long)no);
    return k < 0 || (size_t)k >= n ? pkv_err(PKV_EINVAL, "path too long") : 0;
}

bool pkv_wal_name_no(const char *name, const char *prefix, uint64_t *no) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0 || strlen(name) != pl + 16) return false;
    uint64_t n = 0;
    for (const char *q = name + pl; *q; q++) {
        unsigned d;
        if (*q >= '0' && *q <= '9') d = (unsigned)(*q - '0');
        else if (*q >= 'a' && *q <= 'f') d = (unsigned)(*q - 'a') + 10;
        else return false;
        n = n << 4 | d;
    }
    *no = n;
    return true;
}

int pkv_wal_grow(pkv_cache *c, size_t bytes) {
    pkv_wal *w = &c->wal;
    if (w->cap - w->len >= bytes) return 0;
    size_t cap = w->cap ? w->cap : 1u << 16;
    while (cap - w->len < bytes) cap *= 2;
    uint8_t *nb = realloc(w->buf, cap);
    if (!nb) return pkv_err(PKV_ENOMEM, "log buffer of %zu bytes", cap);
    w->buf = nb;
    w->cap = cap;
    return 0;
}

int pkv_wal_too_big(pkv_cache *c, size_t bytes) {
    (void)c;
    if (bytes >= PKV_REC_TOO_BIG)
        return pkv_err(PKV_ERANGE, "a log record of this call would exceed %u bytes "
                       "(REC_MAX_BYTES; a sequence table of about %u blocks); nothing changed",
                       pkv_rec_max, pkv_rec_max / 4);
    return pkv_err(PKV_ERANGE, "the log records of this call would take %zu bytes, more "
                   "than %llu; nothing changed", bytes, (unsigned long long)PKV_WAL_CALL_MAX);
}

_Static_assert(REC_TRAILER == 8, "append() clears the trailer as one word");

/* pkv_wal_append and pkv_wal_append_filled: `zero` says whether the payload is
 * zeroed here (else the caller writes every byte of it). */
static pkv_always_inline uint8_t *append(pkv_cache *c, unsigned type, size_t payload,
                                         bool zero) {
    pkv_wal *w = &c->wal;
    size_t total = pkv_rec_size(payload);
    /* REC_MAX_BYTES: the caller's reserve refused larger records (pkv_wal_reserve) */
    pkv_assert(total <= REC_MAX_BYTES);
    if (w->tail_end > w->len) { /* keep the last COMMIT's slot: slack (record.c) */
        size_t k = w->tail_end - w->len;
        pkv_assert(k >= 8 && k % 8 == 0 && w->cap - w->len >= k);
        pkv_put_u32(w->buf + w->len, 0);
        pkv_put_u32(w->buf + w->len + 4, (uint32_t)k);
        w->len += k;
        w->slack += k;
    }
    w->tail_end = 0;
    pkv_assert(w->cap - w->len >= total);
    uint8_t *r = w->buf + w->len;
    if (zero) {
        memset(r + REC_HDR, 0, total - REC_HDR);
    } else {
        /* The padding and trailer: the word the payload ends in and the last one
         * (total is REC_HDR + payload + REC_TRAILER rounded up to 8), cleared
         * before the caller writes the payload over the first one's head. */
        pkv_put_u64(r + ((REC_HDR + payload) & ~(size_t)7), 0);
        pkv_put_u64(r + total - 8, 0);
    }
    pkv_put_u32(r, (uint32_t)total);
    pkv_put_u32(r + 4, type);
    pkv_put_u64(r + 8, w->next_lsn);
    if (w->nrec++ == 0) {
        w->buf_first_lsn = w->next_lsn;
        w->buf_first_ns = pkv_now_ns(); /* once per group */
    }
    w->next_lsn++;
    w->len += total;
    w->records++;
    if (pkv_unlikely(w->len >= w->kick) && !w->kicked) { /* big group: go */
        w->kicked = true;
        pkv_cond_signal(&w->cv_work);
    }
    return r + REC_HDR;
}

uint8_t *pkv_wal_append(pkv_cache *c, unsigned type, size_t payload) {
    return append(c, type, payload, true);
}

uint8_t *pkv_wal_append_filled(pkv_cache *c, unsigned type, size_t payload) {
    return append(c, type, payload, false);
}

uint8_t *pkv_wal_reappend(pkv_cache *c, size_t off, unsigned type, size_t payload,
                          size_t keep) {
    pkv_wal *w = &c->wal;
    size_t total = pkv_rec_size(payload);
    uint8_t *r = w->buf + off;
    pkv_assert(w->nrec > 0 && off >= FRAME_HDR && off < w->len &&
               off + pkv_get_u32(r) == w->len && pkv_get_u64(r + 8) == w->next_lsn - 1);
    pkv_assert(w->cap - off >= total && keep <= payload &&
               REC_HDR + keep <= pkv_get_u32(r) - REC_TRAILER);
    uint64_t lsn = pkv_get_u64(r + 8);
    memset(r + REC_HDR + keep, 0, total - REC_HDR - keep);
    pkv_put_u32(r, (uint32_t)total);
    pkv_put_u32(r + 4, type);
    pkv_put_u64(r + 8, lsn);
    w->len = off + total;
    return r + REC_HDR;
}

static int io_fail(pkv_cache *c, int neg_errno, const char *what) {
    int e = -neg_errno;
    int code = (e == ENOSPC || e == EDQUOT) ? PKV_ENOSPC : PKV_EIO;
    pkv_err(code, "%s: %s", what, strerror(e));
    if (!c->wal.failed) { /* first failure wins; never retried (rule D7, fsyncgate) */
        c->wal.failed = code;
        snprintf(c->wal.fail_msg, sizeof c->wal.fail_msg, "%s: %s", what, strerror(e));
    }
    return code;
}

/* Remember a live segment (flusher or open; cache lock held). */
int pkv_wal_seg_push(pkv_wal *w, uint64_t no, uint64_t start) {
    if (w->nsegs == w->segs_cap) {
        size_t cap = w->segs_cap ? w->segs_cap * 2 : 8;
        struct pkv_seg *ns = realloc(w->segs, cap * sizeof *ns);
        if (!ns) return pkv_err(PKV_ENOMEM, "segment list");
        w->segs = ns;
        w->segs_cap = cap;
    }
    w->segs[w->nsegs].no = no;
    w->segs[w->nsegs].start_lsn = start;
    w->nsegs++;
    return 0;
}

/* Create (or recycle a spare into) segment `no` starting at LSN `start`, write its
 * header durably, make it current. Called by the flusher, or at open before the
 * threads start, without the cache lock: it takes the lock only to claim a spare
 * (the checkpoint thread renames segments into spares under it; a spare that fails
 * to be renamed into place is unlinked there too) and to install the new segment,
 * so callers are not blocked while the segment is allocated and its header and
 * directory entry are synced. Returns 0, or -errno with *what set; the
 * caller enters the failed state. */
static int seg_create(pkv_cache *c, uint64_t no, uint64_t start, uint64_t min_size,
                      const char **what) {
    pkv_wal *w = &c->wal;
    const pkv_io_ops *io = w->io;
    char path[4200], spare[4200];
    *what = "create log segment";
    if (pkv_wal_path(w, path, sizeof path, "wal-", no)) return -ENAMETOOLONG;
    uint64_t size = w->seg_size > min_size + SEG_HDR ? w->seg_size : min_size + SEG_HDR;
    bool recycled = false;
    pkv_lock(c);
    if (w->nspare > 0 && size == w->seg_size) {
        pkv_wal_path(w, spare, sizeof spare, "wal-spare-", w->nspare - 1);
        if (io->rename(io->ctx, spare, path) == 0) recycled = true;
        /* Forgotten below, so do not leave it on disk. Under the lock, although an
         * unlink of 32 MiB can take tens of ms (rare: a rename just failed): once
         * the lock is released, a checkpoint may retire a segment under this very
         * name (wal-spare-<nspare>), and the unlink would delete that good spare. */
        else (void)io->unlink(io->ctx, spare);
        w->nspare--;
    }
    pkv_unlock(c);
    int fd = io->open(io->ctx, path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return fd;
    int rc;
    if (!recycled && (rc = io->allocate(io->ctx, fd, size)) < 0) {
        io->close(io->ctx, fd);
        io->unlink(io->ctx, path);
        *what = "preallocate log segment";
        return rc;
    }
    uint32_t epoch;
    if (getrandom(&epoch, sizeof epoch, 0) != (ssize_t)sizeof epoch)
        epoch = (uint32_t)time(NULL) ^ (uint32_t)no * 2654435761u;
    uint8_t h[SEG_HDR];
    memset(h, 0, sizeof h);
    memcpy(h, SEG_MAGIC, 8);
    pkv_put_u32(h + 8, WAL_VERSION);
    pkv_put_u32(h + 12, epoch);
    pkv_put_u64(h + 16, no);
    pkv_put_u64(h + 24, start);
    pkv_put_u64(h + 32, w->arena_secret);
    pkv_put_u64(h + 40, size);
    pkv_put_u64(h + 56, XXH3_64bits(h, 56));
    if ((rc = io->write(io->ctx, fd, h, SEG_HDR, 0, 1)) < 0 ||
        (rc = io->sync_dir(io->ctx, w->dir)) < 0) {
        io->close(io->ctx, fd);
        *what = "write log segment header";
        return rc;
    }
    /* In NONE mode the old segment's frames were written unsynced, and a later
     * pkv_sync syncs only the current segment: sync them before leaving it (the
     * arena was flushed before, flush_once). */
    if (w->seg_fd >= 0 && w->mode == PKV_DURABLE_NONE &&
        (rc = io->sync(io->ctx, w->seg_fd)) < 0) {
        io->close(io->ctx, fd);
        *what = "fdatasync log";
        return rc;
    }
    pkv_lock(c);
    int old = w->seg_fd;
    w->seg_fd = fd;
    w->seg_no = no;
    w->epoch = epoch;
    w->seg_off = SEG_HDR;
    w->seg_cap = size;
    rc = pkv_wal_seg_push(w, no, start);
    pkv_unlock(c);
    if (old >= 0) io->close(io->ctx, old);
    if (rc) {
        *what = "rotate log segment";
        return -ENOMEM;
    }
    return 0;
}

/* Finish checksums of the records in buf[FRAME_HDR, len) and the frame header. */
static void frame_seal(uint8_t *buf, size_t len, uint32_t epoch, uint64_t first,
                       uint32_t nrec) {
    for (size_t off = FRAME_HDR; off < len;) {
        uint32_t rl = pkv_get_u32(buf + off);
        pkv_put_u64(buf + off + rl - REC_TRAILER,
                    XXH3_64bits_withSeed(buf + off, rl - REC_TRAILER, epoch));
        off += rl;
    }
    pkv_put_u32(buf, FRAME_MAGIC);
    pkv_put_u32(buf + 4, epoch);
    pkv_put_u64(buf + 8, first);
    pkv_put_u32(buf + 16, nrec);
    pkv_put_u32(buf + 20, (uint32_t)(len - FRAME_HDR));
    XXH3_state_t st;
    memset(&st, 0, sizeof st); /* reset_withSeed reads st.seed (xxHash 0.8.1) */
    XXH3_64bits_reset_withSeed(&st, epoch);
    XXH3_64bits_update(&st, buf, 24);
    XXH3_64bits_update(&st, buf + FRAME_HDR, len - FRAME_HDR);
    pkv_put_u64(buf + 24, XXH3_64bits_digest(&st));
}

/* Squeeze the slack left behind growable COMMITs (record.c) out of the records in
 * buf[FRAME_HDR, len): a slack run starts with a u32 0 (no record has length 0)
 * and its u32 size. Returns the new length. */
static size_t frame_squeeze(uint8_t *buf, size_t len) {
    size_t dst = FRAME_HDR;
    for (size_t off = FRAME_HDR; off < len;) {
        uint32_t rl = pkv_get_u32(buf + off);
        if (rl == 0) {
            off += pkv_get_u32(buf + off + 4);
            continue;
        }
        if (dst != off) memmove(buf + dst, buf + off, rl);
        dst += rl;
        off += rl;
    }
    return dst;
}

/* One group commit. Lock held on entry and exit; released during I/O. */
static void flush_once(pkv_cache *c, bool hard) {
    pkv_wal *w = &c->wal;
    const pkv_io_ops *io = w->io;
    if (w->failed) return;
    pkv_log_settle_all(c); /* the buffer leaves: every COMMIT in it up to date */
    bool sync = hard || w->mode != PKV_DURABLE_NONE;
    size_t len = w->len;
    uint32_t nrec = w->nrec;
    uint64_t first = w->buf_first_lsn, last = w->next_lsn - 1;
    uint64_t first_ns = w->buf_first_ns;
    bool dirty = w->arena_dirty;
    /* The arena is flushed before a frame that seals blocks in every mode: in NONE
     * mode too, or a frame reaching the disk ahead of the payload it checksums
     * would turn blocks (and the synced tokens in them) into verification misses. */
    /* Rule D1: payload durable before the record that names it, whenever a record
     * is made durable: in NONE mode, leaving a full segment fdatasyncs it (seg_create), which
     * makes the COMMITs of partial tails in it durable, so the arena goes first then
     * too. (w->seg_off and seg_cap are the flusher's; len before squeezing is an
     * upper bound, so no rotation is missed.) */
    bool leaving = nrec && w->seg_fd >= 0 && w->seg_off + len > w->seg_cap;
    bool arena_sync = dirty && (sync || w->seal_dirty || leaving);
    if (nrec == 0 && (!sync || w->durable_lsn >= w->written_lsn) && !(hard && dirty))
        return;
    /* Swap buffers: appenders continue into the other one. Every record of a call
     * was appended under one lock hold, so it is all in this frame (rule D5). */
    uint8_t *fb = w->buf;
    size_t fcap = w->cap;
    w->buf = w->fbuf;
    w->cap = w->fcap;
    w->fbuf = fb;
    w->fcap = fcap;
    w->len = FRAME_HDR;
    w->nrec = 0;
    w->kicked = false;
    bool slack = w->slack != 0;
    w->slack = 0;
    pkv_wal_no_coalesce(w); /* the records taken are final */
    if (arena_sync) w->arena_dirty = w->seal_dirty = false;
    pkv_unlock(c);

    if (slack) len = frame_squeeze(fb, len);
    /* The frame's u32 length: PKV_WAL_CALL_MAX and the backlog throttle keep a
     * frame far below it, so this cannot happen; if it did, fail loudly rather
     * than write a length cut to 32 bits. */
    if (len - FRAME_HDR > UINT32_MAX) {
        pkv_lock(c);
        io_fail(c, -EFBIG, "log frame over 4 GiB");
        pkv_cond_broadcast(&w->cv_done);
        return;
    }

    int rc = 0;
    const char *what = NULL;
    if (arena_sync && w->arena_fd >= 0 && (rc = io->sync(io->ctx, w->arena_fd)) < 0)
        what = "flush arena";
    if (!rc && nrec) {
        if (w->seg_off + len > w->seg_cap)
            rc = seg_create(c, w->seg_no + 1, first, len, &what);
        if (!rc) {
            frame_seal(fb, len, w->epoch, first, nrec);
            uint64_t t0 = sync ? pkv_now_ns() : 0;
            if ((rc = io->write(io->ctx, w->seg_fd, fb, len, w->seg_off, sync)) < 0)
                what = sync ? "write+fdatasync log" : "write log";
            else if (sync)
                pkv_hist_observe(&w->sync_hist, &pkv_hist_latency, pkv_now_ns() - t0);
        }
    } else if (!rc && sync && w->seg_fd >= 0 && w->durable_lsn < w->written_lsn) {
        uint64_t t0 = pkv_now_ns();
        if ((rc = io->sync(io->ctx, w->seg_fd)) < 0) what = "fdatasync log";
        else pkv_hist_observe(&w->sync_hist, &pkv_hist_latency, pkv_now_ns() - t0);
    }

    pkv_lock(c);
    if (rc < 0) {
        if (!w->failed) io_fail(c, rc, what);
    } else {
        if (nrec) {
            w->seg_off += len;
            w->frames++;
            w->bytes += len;
            w->bytes_since_ckpt += len;
            w->written_lsn = last;
        }
        if (sync) {
            w->syncs++;
            w->durable_lsn = w->written_lsn;
            /* The group's oldest record waited from its append until now, when a
             * waiter can first see it durable (pkv_get_stats().wal_max_delay_us). In
             * NONE mode only pkv_sync syncs, and earlier frames it makes durable
             * were written unsynced: not measured. */
            uint64_t waited = nrec && w->mode != PKV_DURABLE_NONE ? pkv_now_ns() - first_ns : 0;
            if (waited > w->max_delay_ns) w->max_delay_ns = waited;
            if (nrec && w->mode != PKV_DURABLE_NONE)
                pkv_hist_observe(&w->delay_hist, &pkv_hist_latency, waited);
        }
    }
    pkv_cond_broadcast(&w->cv_done);
}

static bool ckpt_due(const pkv_wal *w);

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The group-commit cycle. A group starts every interval_us, counted from the
 * start of the previous one, not from its end: records that arrived while a
 * write + fdatasync took longer than the interval have waited long enough and are
 * flushed at once. So a record waits at most about two cycles of
 * max(interval, write + fdatasync), where sleeping a full interval after each
 * flush made it three. With nothing buffered the flusher sleeps an interval (or
 * until a sync is requested). */
static void *flusher_main(void *arg) {
    pkv_cache *c = arg;
    pkv_wal *w = &c->wal;
    const uint64_t interval_ns = (uint64_t)w->interval_us * 1000u;
    uint64_t started = realtime_ns(); /* start of the last group (or of the thread) */
    pkv_lock(c);
    for (;;) {
        /* (a buffer past w->kick goes at once: its wake-up may have come
         * while this thread was busy, and it is sent once per buffer) */
        if (!w->stop && !w->sync_req && (w->len < w->kick || w->failed)) {
            uint64_t now = realtime_ns();
            uint64_t due = w->nrec == 0 ? now + interval_ns : started + interval_ns;
            if (due > now) {
                struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
                pkv_cond_timedwait(&w->cv_work, &c->lock, &ts);
            }
        }
        bool hard = w->hard_req || w->stop;
        w->sync_req = w->hard_req = false;
        started = realtime_ns();
        flush_once(c, hard);
        pkv_limbo_drain(c, pkv_wal_safe_lsn(w)); /* rule D2 */
        /* A checkpoint is due: the checkpoint thread takes it, off this thread, so
         * group commits go on while it is compressed and written. */
        if (!w->failed && !w->ckpt_busy && ckpt_due(w))
            pkv_cond_signal(&w->cv_ckpt);
        if (w->stop && (w->nrec == 0 || w->failed)) break;
    }
    pkv_unlock(c);
    return NULL;
}


/* Is an automatic checkpoint due? With an explicit checkpoint_bytes, when that
 * much log has been written since the last one. By default (checkpoint_bytes 0)
 * when the log since the last one reaches 64 MiB or the raw size a full snapshot
 * of the metadata had at the last one (ckpt_raw, also after a delta), whichever is
 * larger: recovery then replays at most about as much log as it loads checkpoint,
 * and a full checkpoint costs at most about one byte per byte of log (a delta,
 * far less; wal/checkpoint.c). */
static bool ckpt_due(const pkv_wal *w) {
    if (w->ckpt_retry_ns && pkv_now_ns() < w->ckpt_retry_ns) return false; /* backing off */
    uint64_t t = w->ckpt_bytes;
    if (w->ckpt_adaptive && w->ckpt_raw > t) t = w->ckpt_raw;
    return w->bytes_since_ckpt >= t;
}

/* A checkpoint failed before its file became visible, for lack of memory or space
 * (lock held): the temporary file is gone and the log still holds every record, so
 * the cache keeps serving. The failure is kept for pkv_checkpoint and pkv_get_stats,
 * and automatic attempts back off (a full disk would otherwise be handed a whole
 * snapshot every group commit). */
static void ckpt_discarded(pkv_wal *w, int rc) {
    w->ckpt_failures++;
    w->ckpt_err = rc;
    snprintf(w->ckpt_msg, sizeof w->ckpt_msg, "%s", pkv_last_error());
    uint32_t b = w->ckpt_backoff_ms ? 2 * w->ckpt_backoff_ms : CKPT_BACKOFF_MIN_MS;
    w->ckpt_backoff_ms = b < CKPT_BACKOFF_MAX_MS ? b : CKPT_BACKOFF_MAX_MS;
    w->ckpt_retry_ns = pkv_now_ns() + (uint64_t)w->ckpt_backoff_ms * 1000000u;
}

/* One checkpoint, on the checkpoint thread; lock held on entry and exit. The
 * snapshot is copied under the lock in slices (wal/checkpoint.c); compression,
 * the write and its fdatasync run with the lock released, while the flusher keeps
 * committing groups. Crash safety: the checkpoint file becomes visible (rename,
 * directory fsync) only after everything the snapshot reflects is durable in the
 * log, and segments are recycled only after that. Returns true when written. */
static bool do_checkpoint(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    if (w->failed) return false;
    /* Nothing logged since the newest checkpoint file: it still holds the state
     * (changes without a record, such as a block verified, are ones recovery
     * redoes anyway), and a second file of the same LSN would break the chain. */
    if (w->chain_ok && w->next_lsn - 1 == w->prev_lsn) {
        /* The log bytes counted since (frames flushed after that checkpoint fixed
         * its LSN) hold only records it covers: none is due, or the automatic
         * trigger would call this again at once, forever. */
        w->bytes_since_ckpt = 0;
        w->ckpt_ok++;
        return true;
    }
    /* A delta when the chain allows one and it stays within the budget. */
    uint64_t budget = w->base_raw > w->delta_floor ? w->base_raw : w->delta_floor;
    bool delta = !w->full_only && w->chain_ok && w->chain_len < DELTA_CHAIN_MAX &&
                 w->chain_raw + pkv_ckpt_delta_estimate(c) <= budget;
    const uint64_t t_start = pkv_now_ns();
    w->ckpt_busy = true;
    w->chain_ok = false; /* until this file is written: dirty bits get cleared */
    uint64_t since = w->bytes_since_ckpt;
    uint8_t *raw = NULL;
    size_t rawlen = 0;
    uint64_t lsn = 0, end = 0, sum = 0, full_len = 0;
    if (pkv_ckpt_serialize(c, delta, &raw, &rawlen, &lsn, &end, &full_len)) { /* out of memory: */
        w->ckpt_busy = false;                  /* the log stays valid, try again */
        ckpt_discarded(w, PKV_ENOMEM);         /* later (with a full checkpoint) */
        return false;
    }
    /* The snapshot may show records up to `end` (and the payload they checksum):
     * wait until the log holds them durably, the arena flushed before them. */
    while (!w->failed && w->durable_lsn < end) {
        w->sync_req = w->hard_req = true;
        pkv_cond_signal(&w->cv_work);
        pkv_cond_wait(&w->cv_done, &c->lock);
    }
    if (w->failed) {
        free(raw);
        w->ckpt_busy = false;
        return false;
    }
    pkv_unlock(c);
    bool renamed;
    int rc = pkv_ckpt_write(w, delta, lsn, end, raw, rawlen, &sum, &renamed);
    free(raw);
    pkv_lock(c);
    w->ckpt_busy = false;
    /* Out of space (or quota) while only the temporary file was written: nothing
     * visible changed, the log (preallocated) still holds it all, and space may
     * return, so the cache goes on. Any other error -- an EIO from the device, or
     * one at or after the rename, where the directory's state is unknown -- fails
     * the cache as a log error would (the temporary file was unlinked either way). */
    if (rc == PKV_ENOSPC && !renamed) {
        ckpt_discarded(w, rc);
        return false;
    }
    if (rc) {
        io_fail(c, rc == PKV_ENOSPC ? -ENOSPC : -EIO, "write checkpoint");
        return false;
    }
    w->ckpt_err = 0;
    w->ckpt_backoff_ms = 0;
    w->ckpt_retry_ns = 0;
    if (delta) {
        w->chain_len++;
        w->chain_raw += rawlen;
        w->ckpt_deltas++;
    } else {
        w->chain_len = 0;
        w->chain_raw = 0;
        w->base_raw = rawlen;
    }
    w->ckpt_raw = full_len;
    w->chain_ok = true;
    w->prev_lsn = lsn;
    w->prev_sum = sum;
    /* Segments wholly covered by the checkpoint become spares. The log keeps
     * going while a checkpoint is taken, so more segments may be live than with
     * a checkpoint that stopped the log; spares are then kept only while live
     * segments and spares together stay within four files. */
    size_t keep = 0;
    while (keep + 1 < w->nsegs && w->segs[keep + 1].start_lsn <= lsn + 1) keep++;
    const pkv_io_ops *io = w->io;
    const size_t live = w->nsegs - keep;
    /* Segments to delete are unlinked once the lock is released, because
     * unlinking a large preallocated file can take milliseconds and every caller
     * would wait for it. They are out of w->segs by then, and segment numbers are
     * never reused, so nothing can open them meanwhile. Without memory for the
     * list they are unlinked here, under the lock. */
    uint64_t *dead = keep ? malloc(keep * sizeof *dead) : NULL;
    size_t ndead = 0;
    for (size_t i = 0; i < keep; i++) {
        char from[4200], to[4200];
        pkv_wal_path(w, from, sizeof from, "wal-", w->segs[i].no);
        if (w->nspare < 2 && live + w->nspare < 4 && w->segs[i].no != w->seg_no) {
            pkv_wal_path(w, to, sizeof to, "wal-spare-", w->nspare);
            if (io->rename(io->ctx, from, to) == 0) {
                w->nspare++;
                continue;
            }
        }
        if (dead) dead[ndead++] = w->segs[i].no;
        else io->unlink(io->ctx, from);
    }
    memmove(w->segs, w->segs + keep, (w->nsegs - keep) * sizeof *w->segs);
    w->nsegs -= keep;
    w->ckpt_lsn = lsn;
    /* Log written while the checkpoint was taken counts toward the next one. */
    w->bytes_since_ckpt = w->bytes_since_ckpt > since ? w->bytes_since_ckpt - since : 0;
    w->checkpoints++;
    w->ckpt_ok++;
    pkv_hist_observe(&w->ckpt_hist, &pkv_hist_long, pkv_now_ns() - t_start);
    if (ndead) {
        pkv_unlock(c);
        for (size_t i = 0; i < ndead; i++) {
            char path[4200];
            pkv_wal_path(w, path, sizeof path, "wal-", dead[i]);
            io->unlink(io->ctx, path);
        }
        pkv_lock(c);
    }
    free(dead);
    return true;
}

static void *ckpt_main(void *arg) {
    pkv_cache *c = arg;
    pkv_wal *w = &c->wal;
    bool last_failed = false; /* the previous automatic attempt wrote nothing */
    pkv_lock(c);
    for (;;) {
        bool due = !w->failed && ckpt_due(w);
        if (w->ckpt_req) {
            w->ckpt_req = false;
            do_checkpoint(c);
            w->ckpt_gen++; /* failed or done: wake the requester either way */
            pkv_cond_broadcast(&w->cv_done);
            continue;
        }
        if (w->ckpt_stop) {
            /* Closing: a due checkpoint is still taken, as the flusher used to. */
            if (due && !last_failed) do_checkpoint(c);
            break;
        }
        if (due && !last_failed) {
            last_failed = !do_checkpoint(c);
            continue;
        }
        /* Woken by the flusher (each cycle while a checkpoint is due, so a failed
         * attempt is retried once its back-off has passed: ckpt_due), a request,
         * or pkv_close. */
        pkv_cond_wait(&w->cv_ckpt, &c->lock);
        last_failed = false;
    }
    pkv_unlock(c);
    return NULL;
}

/* Spare segments outside the run 0..nspare-1 that seg_create recycles from the
 * top would never be reused. One is left when recycling a spare failed and so did
 * the unlink after it (or by a version before that unlink), and the process ended
 * before a checkpoint renamed a retired segment over it: delete them, best
 * effort. They hold no records; a failed unlink is retried at the next open. */
static void drop_stray_spares(pkv_wal *w) {
    if (!w->stray_spares) return;
    DIR *d = opendir(w->dir); /* again: recovery kept only whether any is there */
    if (!d) return;
    struct dirent *e;
    uint64_t k;
    while ((e = readdir(d))) {
        char path[4200];
        if (pkv_wal_name_no(e->d_name, "wal-spare-", &k) && k >= w->nspare &&
            !pkv_wal_path(w, path, sizeof path, "wal-spare-", k))
            (void)w->io->unlink(w->io->ctx, path);
    }
    closedir(d);
    w->stray_spares = false;
}

/* Spares are recycled by rename without being reallocated, so each must have the
 * size this open gives new segments (pkv_options.log_segment_bytes, which a reopen
 * may change; a segment written with one frame larger than the segment size is
 * larger too). A spare's header is still that of its previous life and says its
 * allocated size: when a spare's size differs, or its header cannot be read,
 * every spare is deleted (the run must stay 0..nspare-1; there are at most two),
 * and new segments are allocated instead. Best effort, like drop_stray_spares. */
static void drop_misfit_spares(pkv_wal *w) {
    const pkv_io_ops *io = w->io;
    bool misfit = false;
    for (uint64_t k = 0; k < w->nspare && !misfit; k++) {
        char path[4200];
        uint8_t h[SEG_HDR];
        if (pkv_wal_path(w, path, sizeof path, "wal-spare-", k)) return;
        int fd = io->open(io->ctx, path, O_RDONLY, 0);
        long r = fd >= 0 ? io->pread(io->ctx, fd, h, SEG_HDR, 0) : -EIO;
        if (fd >= 0) io->close(io->ctx, fd);
        misfit = r != (long)SEG_HDR || memcmp(h, SEG_MAGIC, 8) != 0 ||
                 !pkv_sum_ok(pkv_get_u64(h + 56), XXH3_64bits(h, 56)) ||
                 pkv_get_u64(h + 40) != w->seg_size;
    }
    if (!misfit) return;
    for (uint64_t k = 0; k < w->nspare; k++) {
        char path[4200];
        if (!pkv_wal_path(w, path, sizeof path, "wal-spare-", k))
            (void)io->unlink(io->ctx, path);
    }
    w->nspare = 0;
}

/* Recovery read records that may be only in the page cache: a NONE-mode writer
 * syncs neither its frames nor the arena until a sync point, and a process crash
 * leaves them there. pkv_wal_start marks every recovered record durable, after
 * which this open (in any mode) reports durability -- pkv_sync returns, limbo
 * drains -- for them, so make them durable first: the arena, then every live
 * segment (payload before the records that name it). Whether the last writer
 * closed cleanly is not recorded, so this runs at every writable open that
 * recovered a segment; on files with nothing dirty the syncs cost little. A
 * failed sync fails the open and is not retried (fsyncgate). */
static int sync_recovered(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    const pkv_io_ops *io = w->io;
    if (w->nsegs == 0) return 0;
    int rc;
    if (w->arena_fd >= 0 && (rc = io->sync(io->ctx, w->arena_fd)) < 0)
        return io_fail(c, rc, "flush arena at open");
    for (size_t i = 0; i < w->nsegs; i++) {
        char path[4200];
        if ((rc = pkv_wal_path(w, path, sizeof path, "wal-", w->segs[i].no))) return rc;
        int fd = io->open(io->ctx, path, O_RDONLY, 0);
        if (fd < 0) return io_fail(c, fd, "open recovered log segment");
        rc = io->sync(io->ctx, fd);
        io->close(io->ctx, fd);
        if (rc < 0) return io_fail(c, rc, "fdatasync recovered log segment");
    }
    return 0;
}

int pkv_wal_start(pkv_cache *c, uint64_t next_lsn, uint64_t next_seg) {
    pkv_wal *w = &c->wal;
    drop_stray_spares(w);
    drop_misfit_spares(w);
    int rc = sync_recovered(c);
    if (rc) return rc;
    w->next_lsn = next_lsn;
    w->written_lsn = w->durable_lsn = next_lsn - 1; /* synced just above */
    w->buf = malloc(1u << 16);
    w->fbuf = malloc(1u << 16);
    if (!w->buf || !w->fbuf) return pkv_err(PKV_ENOMEM, "log buffers");
    w->cap = w->fcap = 1u << 16;
    w->len = FRAME_HDR; /* each buffer starts with room for its frame header */
    pkv_wal_no_coalesce(w);
    if (w->tail_ok) { /* the log ended cleanly: keep appending to its last segment */
        char path[4200];
        if ((rc = pkv_wal_path(w, path, sizeof path, "wal-", w->tail_no))) return rc;
        int fd = w->io->open(w->io->ctx, path, O_RDWR, 0);
        if (fd < 0) return io_fail(c, fd, "open log segment");
        w->seg_fd = fd;
        w->seg_no = w->tail_no;
        w->epoch = w->tail_epoch;
        w->seg_off = w->tail_off;
        w->seg_cap = w->tail_size;
    } else {
        const char *what = NULL;
        if ((rc = seg_create(c, next_seg, next_lsn, 0, &what)) < 0) return io_fail(c, rc, what);
    }
    if (pthread_create(&w->thr, NULL, flusher_main, c))
        return pkv_err(PKV_ENOMEM, "cannot start the log flusher thread");
    w->running = true;
    if (pthread_create(&w->ckpt_thr, NULL, ckpt_main, c))
        return pkv_err(PKV_ENOMEM, "cannot start the checkpoint thread");
    w->ckpt_running = true;
    return 0;
}

int pkv_wal_unwritable(pkv_cache *c) {
    if (c->rdonly) return pkv_err(PKV_ERDONLY, "cache opened read-only");
    if (c->wal.failed)
        return pkv_err(PKV_EFAILED, "cache failed after an I/O error (%s); reopen it "
                       "to recover from the log", c->wal.fail_msg);
    return 0;
}

void pkv_wal_backlog_wait(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    if (w->len < w->backlog || w->failed || w->stop) return;
    uint64_t t0 = pkv_now_ns();
    while (w->len >= w->backlog && !w->failed && !w->stop) {
        pkv_cond_signal(&w->cv_work);
        pkv_cond_wait(&w->cv_done, &c->lock);
    }
    c->ctr.waits_backlog++;
    c->ctr.wait_backlog_ns += pkv_now_ns() - t0;
}

int pkv_wal_wait(pkv_cache *c, uint64_t lsn) {
    pkv_wal *w = &c->wal;
    while (pkv_wal_safe_lsn(w) < lsn && !w->failed) {
        w->sync_req = true;
        pkv_cond_signal(&w->cv_work);
        pkv_cond_wait(&w->cv_done, &c->lock);
    }
    if (w->failed) return pkv_wal_writable(c);
    return 0;
}

int pkv_wal_sync(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    uint64_t target = w->next_lsn - 1;
    w->arena_dirty = true; /* a barrier also covers payload written without records */
    uint64_t syncs = w->syncs;
    while ((w->durable_lsn < target || w->syncs == syncs) && !w->failed) {
        w->sync_req = w->hard_req = true;
        pkv_cond_signal(&w->cv_work);
        pkv_cond_wait(&w->cv_done, &c->lock);
    }
    return w->failed ? pkv_wal_writable(c) : 0;
}

int pkv_wal_checkpoint(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    uint64_t gen = w->ckpt_gen, before = w->ckpt_ok;
    w->ckpt_req = true;
    pkv_cond_signal(&w->cv_ckpt);
    while (w->ckpt_gen == gen) pkv_cond_wait(&w->cv_done, &c->lock);
    if (w->failed) return pkv_wal_writable(c);
    if (w->ckpt_ok == before)
        return pkv_err(w->ckpt_err ? w->ckpt_err : PKV_EIO,
                       "checkpoint not written (%s); the cache goes on from the log",
                       w->ckpt_err ? w->ckpt_msg : "no reason recorded");
    return 0;
}

/* Raise *stop under the lock, wake the thread and join it, if it runs. */
static void stop_thread(pkv_cache *c, bool *running, bool *stop, pkv_cond *cv,
                        pthread_t thr) {
    if (!*running) return;
    pkv_lock(c);
    *stop = true;
    pkv_cond_signal(cv);
    pkv_unlock(c);
    pthread_join(thr, NULL);
    *running = false;
}

int pkv_wal_stop(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    /* The checkpoint thread first, while the flusher still serves its waits. */
    stop_thread(c, &w->ckpt_running, &w->ckpt_stop, &w->cv_ckpt, w->ckpt_thr);
    if (!w->running) return 0;
    stop_thread(c, &w->running, &w->stop, &w->cv_work, w->thr);
    return w->failed;
}

void pkv_wal_free(pkv_wal *w) {
    if (w->seg_fd >= 0 && w->io) w->io->close(w->io->ctx, w->seg_fd);
    w->seg_fd = -1;
    free(w->buf);
    free(w->fbuf);
    free(w->segs);
    free(w->dir);
    free(w->stale);
    w->stale = NULL;
    w->nstale = w->stale_cap = 0;
    w->buf = w->fbuf = NULL;
    w->segs = NULL;
    w->dir = NULL;
}

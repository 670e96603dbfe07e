/*
 * wal/wal.h — the write-ahead log, checkpoints and recovery: private interface.
 *
 * Files in a cache directory (all mode 0600; docs/format.md has every byte):
 *   arena               header page + block slots (arena.c)
 *   LOCK                flock()ed by the one writer
 *   wal-<seg 16 hex>    log segments: a 64-byte header, then frames
 *   ckpt-<lsn 16 hex>   the newest full checkpoint (LZ4-compressed metadata snapshot)
 *   delta-<lsn 16 hex>  delta checkpoints on top of it: the blocks changed since
 *                       the checkpoint file before (a chain; docs/format.md)
 *
 * Writers append records to an in-memory buffer under the cache lock; a single
 * flusher thread swaps the buffer out, flushes the arena (so payload reaches disk
 * before the records that seal it), writes the buffer as one frame with a linked
 * fdatasync, and publishes durable_lsn. One frame = one group commit. A
 * checkpoint thread takes checkpoints without stopping group commit.
 */
#ifndef PKV_WAL_H
#define PKV_WAL_H

#include "pagedkv.h"
#include "histogram.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Record types (docs/format.md). Payload fields are little-endian. */
enum {
    REC_SEAL = 1,      /* u32 block, u32 parent, u64 salt, u64 hash lo, u64 hash hi,
                          u64 payload xxh3, u32 ntok, u32 0, u32 tokens[ntok]        */
    REC_EVICT = 2,     /* u32 block, u32 0                                           */
    REC_SEQ_SET = 3,   /* u64 seq, u64 salt, u64 committed, u32 nblocks, u32 ntail,
                          u32 blocks[nblocks], u32 tail tokens[ntail]               */
    REC_COMMIT = 4,    /* u64 seq, u64 committed, u32 first, u32 nblocks, u32 tail_off,
                          u32 ntail, u32 blocks[nblocks], u32 tokens[ntail]         */
    REC_SEQ_BLOCK = 5, /* u64 seq, u32 index, u32 block, u32 ntok, u32 0,
                          u32 tokens[ntok]                                          */
    REC_TRUNC = 6,     /* u64 seq, u64 committed, u32 tail block, u32 ntail,
                          u32 tokens[ntail]                                         */
    REC_SEQ_CLOSE = 7, /* u64 seq                                                    */
    REC_BAD = 8,       /* u32 block, u32 0: payload failed its checksum, never serve  */
    REC_SEAL_RUN = 9,  /* u32 n, u32 ntok, u64 salt, n entries of SEAL_RUN_ENTRY(ntok)
                          bytes: u32 block, u32 parent, u64 hash lo, u64 hash hi,
                          u64 payload xxh3, u32 tokens[ntok], zero-padded to 8    */
    REC_EVICT_RUN = 10,/* u32 n, u32 0, u32 blocks[n]                                */
    REC_TYPE_MAX = 10,
};

#define REC_HDR 16u     /* u32 len, u16 type, u16 0, u64 lsn */
/* Bytes of one SEAL_RUN entry for blocks of bs tokens (a multiple of 8). */
#define SEAL_RUN_ENTRY(bs) ((32ull + 4ull * (bs) + 7) & ~7ull)
/* The most blocks one SEAL_RUN or EVICT_RUN record holds (the writer's chunk;
 * the reader accepts any count the record's length covers). */
#define PKV_LOG_RUN_MAX 64u
#define REC_TRAILER 8u  /* u64 XXH3-64(seed epoch) of header + payload */
#define FRAME_HDR 32u   /* u32 magic, u32 epoch, u64 first lsn, u32 nrec, u32 bytes,
                           u64 XXH3-64(seed epoch) of header[0,24) + records */
#define FRAME_MAGIC 0x46564b50u /* "PKVF" */
#define SEG_HDR 64u
#define SEG_MAGIC "PKVWAL\0\0"
#define CKPT_MAGIC "PKVCKPT\0"
#define DELTA_MAGIC "PKVDELT\0"
/* A delta chain ends (the next checkpoint is full) when it would hold more than
 * DELTA_CHAIN_MAX files, or more raw bytes than the full checkpoint it starts from
 * or DELTA_FLOOR (pkv_wal.delta_floor), whichever is larger: below that, a full
 * checkpoint is cheap anyway, and recovery reads at most that much more. */
#define DELTA_CHAIN_MAX 64u
#define CKPT_BACKOFF_MIN_MS 1000u
#define CKPT_BACKOFF_MAX_MS 60000u
#define DELTA_FLOOR (1ull << 20)
#define CKPT_HDR 64u
#define WAL_VERSION 1u
#ifdef PKV_FUZZING
/* The fuzzing variant (internal.h, pkv_sum_ok) uses small segments, so that the
 * harnesses stay fast and segment rotation is reached. */
#define SEG_SIZE_DEFAULT (32ull << 10)
#else
#define SEG_SIZE_DEFAULT (32ull << 20)
#endif
/* The largest record, header and trailer included. Enforced where records are
 * built (a call whose record would be larger fails with PKV_ERANGE before it
 * changes anything: pkv_wal_reserve) and where they are read (pkv_rec_decode). */
#define REC_MAX_BYTES (256u << 20)
/* The most log bytes one call may reserve. With the backlog throttle (a call
 * starts only below PKV_WAL_BACKLOG unflushed bytes) a frame stays far below the
 * 4 GiB its u32 length field can say. */
#define PKV_WAL_CALL_MAX (1ull << 30)
/* The limit the builders check: REC_MAX_BYTES, lowered by tests (one 256 MiB
 * record needs a table of 64 million blocks). Read under the cache lock. */
extern uint32_t pkv_rec_max;
/* What a *_size function below returns for a record above pkv_rec_max: larger than
 * PKV_WAL_CALL_MAX, so pkv_wal_reserve refuses the call, and small enough that a
 * caller's sum of a few sizes cannot wrap. */
#define PKV_REC_TOO_BIG ((size_t)1 << 40)
static inline size_t pkv_rec_size_checked(uint64_t payload) {
    uint64_t total = (REC_HDR + payload + REC_TRAILER + 7) & ~(uint64_t)7;
    return total <= pkv_rec_max ? (size_t)total : PKV_REC_TOO_BIG;
}

const char *pkv_rec_type_name(unsigned type);

/* A decoded record: pointers into the (validated) buffer. */
typedef struct pkv_rec {
    unsigned type;
    uint64_t lsn;
    uint64_t seq, salt, committed, hash_lo, hash_hi, payload_sum;
    uint32_t block, parent, index, first, nblocks, tail_off, ntok;
    /* nblocks little-endian u32; SEAL_RUN: nblocks entries of SEAL_RUN_ENTRY(ntok)
     * bytes each (wal.h above; docs/format.md) */
    const uint8_t *blocks;
    const uint8_t *tokens; /* ntok little-endian u32 */
} pkv_rec;

/* Decode and bounds-check one record body of `len` bytes (checksum already
 * verified). 0, or PKV_ECORRUPT with a message. */
int pkv_rec_decode(const uint8_t *p, size_t len, uint32_t block_size, pkv_rec *out);

typedef struct pkv_wal {
    const pkv_io_ops *io;
    char *dir;
    pkv_durability mode;
    uint32_t interval_us;
    uint64_t ckpt_bytes;  /* checkpoint_bytes, or 64 MiB when it was 0 */
    bool ckpt_adaptive;   /* checkpoint_bytes was 0: see pkv_wal_ckpt_due */
    uint64_t ckpt_raw;    /* raw bytes a full snapshot took at the newest checkpoint (a
                             delta's, and at open: an estimate from the counts); the
                             adaptive threshold (0: none) */
    uint64_t base_raw;    /* raw bytes of the chain's full checkpoint: the budget of
                             its deltas */
    /* The checkpoint chain on disk: the newest full checkpoint and the deltas
     * after it. chain_ok: the pool's dirty bits (pkv_pool.ckdirty) hold every
     * change since the newest file of the chain, so the next checkpoint may be a
     * delta; false after a recovery that found no chain or repaired something
     * (one that repaired nothing continues the chain: replay.c chain_continue),
     * and after a checkpoint that failed once it had begun clearing bits.
     * prev_lsn / prev_sum: that newest file's LSN and the XXH3-64 of its body,
     * which a delta names to chain onto it. */
    bool chain_ok;
    uint32_t chain_len;   /* deltas after the full checkpoint */
    uint64_t chain_raw;   /* their raw bytes */
    uint64_t prev_lsn, prev_sum;
    uint64_t delta_floor; /* DELTA_FLOOR (tests lower it) */
    bool full_only;       /* PKV_OPEN_FULL_CHECKPOINTS */
    bool marked;          /* this NONE-mode writer wrote the unsynced marker */
    uint64_t ckpt_deltas; /* delta checkpoints written since open */
    uint64_t ckpt_ok;     /* checkpoints that succeeded: written, or the newest file
                             already held everything (pkv_wal_checkpoint) */
    /* Checkpoints that failed before anything became visible for lack of memory
     * or space (ENOSPC, EDQUOT writing or syncing the temporary file) do not fail
     * the cache: the log still holds everything. ckpt_err / ckpt_msg: the latest attempt's error (0: it
     * succeeded), which pkv_checkpoint returns; automatic attempts then back off
     * (ckpt_backoff_ms, doubling from CKPT_BACKOFF_MIN_MS to CKPT_BACKOFF_MAX_MS)
     * until ckpt_retry_ns (CLOCK_MONOTONIC). */
    uint64_t ckpt_failures;
    int ckpt_err;
    char ckpt_msg[256];
    uint32_t ckpt_backoff_ms;
    uint64_t ckpt_retry_ns;
    uint64_t seg_size;
    uint64_t arena_secret;
    int arena_fd;

    /* The segment being written (flusher only after open). */
    int seg_fd;
    uint64_t seg_no;
    uint32_t epoch;
    uint64_t seg_off;
    uint64_t seg_cap; /* bytes allocated for this segment */
    struct pkv_seg { uint64_t no, start_lsn; } *segs; /* live segments, oldest first */
    size_t nsegs, segs_cap;
    uint64_t nspare; /* recyclable segment files named wal-spare-<k>, k < nspare */
    bool stray_spares; /* wal-spare-<k> files outside that run were found at open */
    /* Where recovery found the log to end cleanly (tail_ok): writing resumes there. */
    bool tail_ok;
    uint64_t tail_no, tail_off, tail_size;
    uint32_t tail_epoch;

    /* Records not yet handed to the flusher (cache lock). */
    uint8_t *buf;
    size_t len, cap;
    uint32_t nrec;
    uint64_t buf_first_lsn;
    uint64_t buf_first_ns; /* CLOCK_MONOTONIC when its first record was appended */
    uint64_t max_delay_ns; /* longest append-to-durable wait of a group's first
                              record (flush_once), since open */
    uint8_t *fbuf; /* the flusher's swapped-out buffer */
    size_t fcap;

    /* COMMIT coalescing (record.c, docs/format.md). gen names the current buffer's
     * generation: a sequence's latest COMMIT (pkv_seq.mc_*) may still grow in place
     * while its mc_gen equals it. It changes when the flusher takes the buffer and
     * when a checkpoint fixes an LSN (pkv_wal_no_coalesce: replay after the snapshot
     * skips the records up to it, so they must not change any more). tail_end: when
     * the last record is such a COMMIT, the end of its slot; the next record appended
     * behind it leaves the unused part as slack (pkv_wal_reserve counts it). slack:
     * slack bytes in buf, squeezed out by the flusher before it writes the frame. */
    uint64_t gen;
    size_t tail_end;
    size_t slack;
    /* Sequences whose COMMIT lags their committed length (deferred growth,
     * record.c): settled before anything reads or ends those records. */
    struct pkv_seq **stale;
    uint32_t nstale, stale_cap;

    uint64_t next_lsn;    /* next LSN to assign (cache lock) */
    uint64_t written_lsn; /* handed to the OS (survives a process crash) */
    uint64_t durable_lsn; /* synced (survives a power loss) */
    uint64_t ckpt_lsn;
    bool arena_dirty;     /* payload written since the last arena flush */
    bool seal_dirty;      /* ... and blocks sealed since then */

    pthread_t thr;
    bool running, stop, sync_req, hard_req, ckpt_req;
    bool kicked; /* the buffer reached `kick` and the flusher was woken */
    size_t kick;    /* PKV_WAL_KICK, or a quarter of a smaller segment, and */
    size_t backlog; /* PKV_WAL_BACKLOG, or half of a smaller segment: so that the
                       frames of a busy log fit small segments */
    uint64_t ckpt_gen; /* incremented when a requested checkpoint finished */
    pkv_cond cv_work, cv_done;
    /* The checkpoint thread: snapshots under the lock in short slices, then
     * compresses and writes with the lock released, while the flusher goes on
     * committing groups. */
    pthread_t ckpt_thr;
    bool ckpt_running, ckpt_stop, ckpt_busy;
    pkv_cond cv_ckpt;
    int failed; /* 0 or the error that put the cache in its failed state */
    char fail_msg[256]; /* what failed, for every later PKV_EFAILED */
    uint64_t bytes_since_ckpt;

    uint64_t records, frames, syncs, bytes, checkpoints;
    /* Metrics since open (src/metrics.c, docs/metrics.md). delay_hist: each
     * synced group's first record, append to durable (as max_delay_ns). sync_hist:
     * each log write+fdatasync (one linked I/O) or lone fdatasync of the flusher.
     * ckpt_hist: each checkpoint written, from its start to the rename's
     * directory sync. ckpt_file_bytes: bytes of the checkpoint files written
     * (compressed, header included), added by pkv_ckpt_write outside the lock. */
    pkv_hist delay_hist, sync_hist, ckpt_hist;
    _Atomic uint64_t ckpt_file_bytes;
} pkv_wal;

/* ---- wal/log.c ---- */
/* pkv_wal_reserve (internal.h): room for `bytes` more record bytes, so appends
 * made next cannot fail; pkv_wal_grow is its slow path. */
int pkv_wal_grow(pkv_cache *c, size_t bytes);
/* pkv_wal_reserve of more than PKV_WAL_CALL_MAX bytes: PKV_ERANGE with a message. */
int pkv_wal_too_big(pkv_cache *c, size_t bytes);
/* Append a record header for a payload of `payload` bytes (reserved before);
 * returns the payload to fill. Cache lock held. */
uint8_t *pkv_wal_append(pkv_cache *c, unsigned type, size_t payload);
/* The same for a caller that writes every payload byte itself (its zero fields
 * included): only the padding and the trailer are cleared. For the records
 * written per block (SEAL, EVICT). */
uint8_t *pkv_wal_append_filled(pkv_cache *c, unsigned type, size_t payload);
/* Rewrite the last record appended, at offset `off` of the unflushed buffer, as
 * a record of `type` with `payload` bytes and the same LSN (COMMIT coalescing);
 * the first `keep` payload bytes stay as they are, the rest is zeroed. Returns the
 * payload to fill. Room: the old record's bytes plus the reserve. */
uint8_t *pkv_wal_reappend(pkv_cache *c, size_t off, unsigned type, size_t payload,
                          size_t keep);
static inline size_t pkv_rec_size(size_t payload) {
    return (REC_HDR + payload + REC_TRAILER + 7) & ~(size_t)7;
}
/* End every COMMIT run: no record now in the buffer may change (see pkv_wal.gen).
 * Deferred growth must be settled first (pkv_log_settle_all). */
static inline void pkv_wal_no_coalesce(pkv_wal *w) {
    pkv_assert(w->nstale == 0);
    w->gen++;
    w->tail_end = 0;
}
/* Record a live segment (recovery and rotation). */
int pkv_wal_seg_push(pkv_wal *w, uint64_t no, uint64_t start);
/* Start the flusher with an open segment after recovery. */
int pkv_wal_start(pkv_cache *c, uint64_t next_lsn, uint64_t next_seg);
/* Stop the flusher after flushing everything (pkv_close). */
int pkv_wal_stop(pkv_cache *c);
/* With the cache lock held: wait until `lsn` is durable (or the cache failed). */
int pkv_wal_wait(pkv_cache *c, uint64_t lsn);
/* pkv_wal_writable (internal.h), with the cache lock held: 0, or the error code
 * of the failed / read-only state; pkv_wal_unwritable is its slow path. */
int pkv_wal_unwritable(pkv_cache *c);
/* Backpressure: a mutating call entering while the unflushed log buffer holds
 * PKV_WAL_BACKLOG bytes or more waits (lock released) until the flusher has taken
 * it, so a producer faster than the disk cannot grow the buffer, or the log
 * between two checkpoints, without bound. Called before the call looks at any
 * state; pkv_wal_throttle (internal.h) is the inline test. With segments smaller
 * than 16 MiB, half the segment size (pkv_wal.backlog). */
#define PKV_WAL_BACKLOG (8u << 20)
/* A buffer this full is flushed at once, not at the end of the group interval:
 * the append that crosses it wakes the flusher (once per buffer). With segments
 * smaller than 4 MiB, a quarter of the segment size (pkv_wal.kick). */
#define PKV_WAL_KICK (1u << 20)
void pkv_wal_backlog_wait(pkv_cache *c);
/* pkv_wal_commit_point (internal.h): after a mutating call appended its records
 * (lock held), in ALWAYS mode wait until they are durable. */
/* LSN up to which freed blocks may be reused (written in NONE mode, else synced). */
static inline uint64_t pkv_wal_safe_lsn(const pkv_wal *w) {
    return w->mode == PKV_DURABLE_NONE ? w->written_lsn : w->durable_lsn;
}
/* Barrier: flush and sync everything appended so far (lock held). */
int pkv_wal_sync(pkv_cache *c);
/* Run a checkpoint on the checkpoint thread and wait for it (lock held). */
int pkv_wal_checkpoint(pkv_cache *c);
void pkv_wal_free(pkv_wal *w);
int pkv_wal_path(const pkv_wal *w, char *out, size_t n, const char *prefix, uint64_t no);
/* The inverse for a directory entry: true (and *no) only for `prefix` followed by
 * exactly the 16 lowercase hex digits pkv_wal_path writes. Anything else (a
 * backup copy, "0x", a sign or blank, upper case) is not a log file. */
bool pkv_wal_name_no(const char *name, const char *prefix, uint64_t *no);
/* Spare segments: given bit k set for each wal-spare-<k> (k < 63; recovery sets bit
 * 63 for any larger number, kvdump counts those apart), the length of
 * the run wal-spare-0, 1, ... that the log recycles from the top, and the others
 * (strays, which a writable open deletes). recovery and kvdump count them alike. */
static inline uint64_t pkv_wal_spare_run(uint64_t mask) {
    uint64_t run = ~mask ? (uint64_t)__builtin_ctzll(~mask) : 64;
    return run < 63 ? run : 63; /* recovery's bit 63 also stands for larger numbers */
}
static inline uint64_t pkv_wal_spare_strays(uint64_t mask) {
    uint64_t run = pkv_wal_spare_run(mask); /* at most 63 */
    return mask >> run << run;
}

/* ---- wal/record.c: encoders (cache lock held, room reserved) ---- */
/* The *_size functions give the most bytes the matching encoder appends; those of
 * records whose length grows with a table (SEQ_SET, COMMIT) give PKV_REC_TOO_BIG
 * above pkv_rec_max. The others are bounded by the block size (a SEAL of
 * PKV_BLOCK_SIZE_MAX tokens is about 4 KiB). */
struct pkv_seq;
static inline size_t pkv_log_seal_size(uint32_t bs) { return pkv_rec_size(48 + 4ull * bs); }
void pkv_log_seal(pkv_cache *c, uint32_t b);
static inline size_t pkv_log_evict_size(void) { return pkv_rec_size(8); }
void pkv_log_evict(pkv_cache *c, uint32_t b);
/* A run of n >= 1 seals of one sequence's commit (blocks b[0..n), in table order,
 * one salt) or of n evictions of one append, as one record: a SEAL or EVICT when
 * n is 1, else a SEAL_RUN or EVICT_RUN, which replay applies as the n single
 * records (docs/format.md). Appends at most n * pkv_log_seal_size(bs) or
 * n * pkv_log_evict_size() bytes; n <= PKV_LOG_RUN_MAX. */
void pkv_log_seals(pkv_cache *c, const uint32_t *b, uint32_t n);
void pkv_log_evicts(pkv_cache *c, const uint32_t *b, uint32_t n);
/* The most blocks the writer puts in one run (PKV_LOG_RUN_MAX; tests set 1 to
 * log every seal and eviction as a single record). Read under the cache lock. */
extern uint32_t pkv_log_run_max;
/* The committed part of a sequence's table, and its partial tail. */
static inline size_t pkv_log_seq_set_size(uint64_t nblocks, uint32_t bs) {
    return pkv_rec_size_checked(32 + 4 * nblocks + 4ull * bs);
}
void pkv_log_seq_set(pkv_cache *c, struct pkv_seq *s);
static inline size_t pkv_log_commit_size(uint64_t nblocks, uint32_t bs) {
    return pkv_rec_size_checked(32 + 4 * nblocks + 4ull * bs);
}
/* Log a commit from old_committed to s->committed; coalesced into the sequence's
 * latest COMMIT while that record is still in the buffer (record.c). */
void pkv_log_commit(pkv_cache *c, struct pkv_seq *s, uint64_t old_committed);
/* When s's latest COMMIT is still in the buffer and [old, newc) continues its
 * partial tail block within its slot, grow it by those tokens (their ids are in
 * the pool) and return true; otherwise change nothing and return false.
 * pkv_log_commit tries it first; pkv_log_settle uses it to catch up. */
bool pkv_log_commit_grow(pkv_cache *c, struct pkv_seq *s, uint64_t old, uint64_t newc);
/* The decode fast path of a commit from `old` that stays inside s's partial tail
 * block (the caller checked that), s not lagging yet: when s's latest COMMIT is
 * still in the buffer and ends at `old`, leave it as is and remember that it lags
 * (pkv_seq.mc_stale); true. The caller then sets s->committed. Otherwise change
 * nothing and return false. */
bool pkv_log_commit_defer(pkv_cache *c, struct pkv_seq *s, uint64_t old);
/* Bring s's lagging COMMIT up to s->committed (nothing if it does not lag).
 * Called before any other change to s, and for all (settle_all) before the
 * buffer is taken or a checkpoint fixes an LSN. Cannot fail. */
void pkv_log_settle(pkv_cache *c, struct pkv_seq *s);
void pkv_log_settle_all(pkv_cache *c);
static inline size_t pkv_log_seq_block_size(uint32_t bs) { return pkv_rec_size(24 + 4ull * bs); }
void pkv_log_seq_block(pkv_cache *c, struct pkv_seq *s, uint32_t idx, uint32_t ntok);
static inline size_t pkv_log_trunc_size(uint32_t bs) { return pkv_rec_size(24 + 4ull * bs); }
void pkv_log_trunc(pkv_cache *c, struct pkv_seq *s, uint32_t tail_block);
static inline size_t pkv_log_close_size(void) { return pkv_rec_size(8); }
void pkv_log_close(pkv_cache *c, uint64_t id);
static inline size_t pkv_log_bad_size(void) { return pkv_rec_size(8); }
void pkv_log_bad(pkv_cache *c, uint32_t b);

/* ---- wal/checkpoint.c ---- */
/* Serialize all metadata into a malloc'd buffer. Cache lock held on entry and on
 * exit; it is released between slices of blocks (and while buffers grow). Counters
 * and sequences are exact at *lsn (the LSN the checkpoint covers); each sealed
 * block is copied under the lock at some point between *lsn and *end_lsn, so the
 * block section may already show records in (lsn, end_lsn]: replaying the log
 * from lsn + 1 reapplies them (every record sets absolute values). The snapshot
 * may replace the log only once end_lsn is durable. */
/* *full_len: the raw bytes a full snapshot would have taken (= *len if full).
 * delta: only the blocks whose dirty bit is set (sealed ones in full, the others
 * as "no longer sealed"), chained onto w->prev_lsn / w->prev_sum; otherwise every
 * sealed block. Either way the copied blocks' dirty bits are cleared. */
int pkv_ckpt_serialize(pkv_cache *c, bool delta, uint8_t **out, size_t *len,
                       uint64_t *lsn, uint64_t *end_lsn, uint64_t *full_len);
/* Bytes a delta would take now (an upper bound), and a full snapshot (cache lock
 * held, or recovery). */
uint64_t pkv_ckpt_delta_estimate(const pkv_cache *c);
uint64_t pkv_ckpt_full_estimate(const pkv_cache *c);
/* What a checkpoint entry of block k brings back at recovery, as a digest (0: not
 * sealed). Equal digests: a delta need not carry the block. */
uint64_t pkv_ckpt_digest(const pkv_pool *p, uint32_t k);
/* Delete the checkpoint files the chain on ckpt-<base> does not use: older full
 * checkpoints and deltas at or below base (what a crash during a full
 * checkpoint's clean-up leaves behind). */
void pkv_ckpt_remove_stale(pkv_wal *w, uint64_t base);
/* Compress and write ckpt-<lsn> (or delta-<lsn>) atomically (no lock needed);
 * *body_sum receives the XXH3-64 of the file's body, which the next delta names.
 * A full checkpoint then deletes every older checkpoint and delta file. On an
 * error, *renamed says whether it came at the rename or after (the directory may
 * then hold the new file: the caller fails the cache) or before, while only the
 * temporary file was written (it is unlinked: nothing on disk changed). */
int pkv_ckpt_write(pkv_wal *w, bool delta, uint64_t lsn, uint64_t end_lsn,
                   const uint8_t *raw, size_t len, uint64_t *body_sum, bool *renamed);
/* What a raw snapshot says about itself (pkv_ckpt_info). */
typedef struct pkv_ckpt_meta {
    bool delta;
    uint64_t prev_lsn, prev_sum; /* delta: the file it applies on */
} pkv_ckpt_meta;
int pkv_ckpt_info(const uint8_t *raw, size_t len, pkv_ckpt_meta *out);
/* Load the metadata of a raw snapshot into the cache (recovery): its counters and
 * blocks (a delta's on top of what is loaded), and, with seqs, its sequences (only
 * the newest file of a chain is given seqs; the others' are checked, not applied). */
int pkv_ckpt_load(pkv_cache *c, const uint8_t *raw, size_t len, bool seqs);
/* pkv_ckpt_load's checks without loading, against an arena of block_size and
 * capacity (the log reader's look at a delta): 0 and what it holds, or
 * PKV_ECORRUPT with load's message. */
typedef struct pkv_ckpt_counts {
    uint64_t sealed;    /* blocks it holds sealed */
    uint64_t freed;     /* a delta's blocks no longer sealed */
    uint64_t sequences;
} pkv_ckpt_counts;
int pkv_ckpt_check(const uint8_t *raw, size_t len, uint32_t block_size, uint64_t capacity,
                   pkv_ckpt_counts *n);
/* Read and decompress a checkpoint or delta file (magic: CKPT_MAGIC or
 * DELTA_MAGIC); *body_sum: the XXH3-64 of its body (may be NULL). */
int pkv_ckpt_read(const pkv_io_ops *io, const char *path, const char *magic,
                  uint64_t *secret, uint64_t *lsn, uint64_t *end_lsn, uint8_t **raw,
                  size_t *len, uint64_t *body_sum);

/* ---- wal/reader.c: the one reader of a directory's log and checkpoints ----
 * Recovery (replay.c) and the inspection API (include/pagedkv_log.h, kvdump) both
 * read through it, so each reading rule of docs/format.md exists once. It never
 * writes: it reports what it finds, and recovery decides what to do with it. */

/* The log files of a directory (pkv_rd_list). */
typedef struct pkv_rd_dir {
    uint64_t *segs;       /* wal-<n>, sorted */
    size_t nsegs;
    uint64_t *deltas;     /* delta-<n>, sorted */
    size_t ndeltas;
    bool have_ckpt;
    uint64_t ckpt;        /* the newest ckpt-<n> */
    size_t nckpt;         /* ckpt-* files (normally 0 or 1) */
    uint64_t spares;      /* bit k: wal-spare-<k> exists, k < 64 */
    size_t spares_big;    /* wal-spare-<k>, k >= 64 (no writer makes them) */
    bool arena_tmp, ckpt_tmp;
} pkv_rd_dir;
/* List dir. A segment number >= 2^63 is PKV_ECORRUPT (its successor would wrap
 * to 0 and sort before the log it continues); else PKV_EIO, PKV_ENOMEM. On an
 * error *d holds what was listed before it (pkv_rd_dir_free it). */
int pkv_rd_list(const char *dir, pkv_rd_dir *d);
void pkv_rd_dir_free(pkv_rd_dir *d);
/* The spare mask as the writer keeps it: bit 63 also stands for every k >= 63. */
static inline uint64_t pkv_rd_spare_mask(const pkv_rd_dir *d) {
    return d->spares | (d->spares_big ? 1ull << 63 : 0);
}

/* Why a segment header is not usable (pkv_rd_seg.hdr). */
enum {
    PKV_SEGH_OK = 0,
    PKV_SEGH_SHORT,   /* shorter than SEG_HDR */
    PKV_SEGH_MAGIC,
    PKV_SEGH_SUM,
    PKV_SEGH_VERSION, /* hdr_val: the version */
    PKV_SEGH_NUMBER,  /* hdr_val: the number the header names */
    PKV_SEGH_SIZE,    /* hdr_val: the implausible size */
    PKV_SEGH_FOREIGN, /* valid, written for another arena */
};

typedef struct pkv_rd_buf {
    uint8_t *p;
    size_t cap;
} pkv_rd_buf;

/* A segment being read. Frames are read through a window of the file (a buffer
 * reused from segment to segment), so recovery reads each byte once into memory
 * already faulted in. */
typedef struct pkv_rd_seg {
    uint64_t no, start, size;
    uint32_t epoch;
    bool valid;        /* header valid and of this arena */
    int hdr;           /* PKV_SEGH_* */
    uint64_t hdr_val;
    const pkv_io_ops *io;
    int fd;
    char path[4200];
    uint64_t len;      /* bytes the file holds, at most size */
    pkv_rd_buf *rb;    /* the window: file bytes [base, base + wlen) */
    uint64_t base;
    size_t wlen;
    int err;           /* a read failed (message set) */
} pkv_rd_seg;

/* Open segment `no` of dir and read its header; unless header_only (or the
 * header is not valid), keep it open and find how many bytes it holds. 0 (the
 * verdict in s->hdr / s->valid), or PKV_EIO (open or read failed), PKV_ENOMEM. */
int pkv_rd_seg_open(const pkv_io_ops *io, const char *dir, uint64_t no, uint64_t secret,
                    pkv_rd_seg *s, pkv_rd_buf *rb, bool header_only);
void pkv_rd_seg_close(pkv_rd_seg *s);
/* Bytes [off, off + n) of the segment, or NULL if the file ends before (or a read
 * failed: s->err). Valid until the next call. */
const uint8_t *pkv_rd_at(pkv_rd_seg *s, uint64_t off, size_t n);
/* Is there a valid frame at off (rule D5: checksum over header and records)? */
bool pkv_rd_frame_ok(pkv_rd_seg *s, uint64_t off, uint64_t *first, uint32_t *nrec,
                     uint32_t *bytes);

/* Why the records of a valid frame are not all valid (pkv_rd_records). */
enum {
    PKV_RECBAD_NONE = 0,
    PKV_RECBAD_SHORT,    /* too short for its next record */
    PKV_RECBAD_LEN,      /* a record length out of bounds */
    PKV_RECBAD_LSN,      /* a record LSN not following the frame's */
    PKV_RECBAD_SUM,      /* a record checksum */
    PKV_RECBAD_DECODE,   /* pkv_rec_decode refused it */
    PKV_RECBAD_RANGE,    /* a committed length out of range */
    PKV_RECBAD_TRAILING, /* bytes after the last record */
};
/* One record of a frame: its place and, when decoded, its fields. */
typedef struct pkv_rd_rec {
    uint64_t off;     /* in the segment file */
    uint32_t len;     /* header and trailer included */
    bool decoded;     /* r holds it (always for LSN > after) */
    pkv_rec r;
} pkv_rd_rec;
typedef int (*pkv_rd_rec_fn)(void *ctx, const pkv_rd_rec *r);
/* The records of the valid frame at off: each one's length, LSN and checksum
 * checked, the ones with LSN > after decoded and range-checked (decode_all: the
 * others too, where they decode), and fn called for each in order. 0, fn's error,
 * or PKV_ECORRUPT with recovery's message, *bad the reason and *bad_lsn the LSN. */
int pkv_rd_records(pkv_rd_seg *s, uint64_t off, uint64_t first, uint32_t nrec,
                   uint32_t bytes, uint64_t after, uint32_t block_size, bool decode_all,
                   pkv_rd_rec_fn fn, void *ctx, int *bad, uint64_t *bad_lsn);

/* Recovery's scan for a valid frame after a damaged or missing one (scan_frames
 * in reader.c): holding false, a frame with an LSN >= lsn; true, one whose LSNs
 * include lsn. FOUND sets *first and *at. TOO_MUCH: candidates would cost more
 * checksumming than PKV_SCAN_BUDGET(bytes after from), so whether one is valid is
 * unknown (treated like FOUND). */
typedef enum pkv_scan_res { PKV_SCAN_NONE, PKV_SCAN_FOUND, PKV_SCAN_TOO_MUCH } pkv_scan_res;
#define PKV_SCAN_BUDGET(bytes) (4 * (uint64_t)(bytes) + (1u << 20))
pkv_scan_res pkv_rd_scan(pkv_rd_seg *s, uint64_t from, uint64_t lsn, bool holding,
                         uint64_t *first, uint64_t *at);

/* Where and why the valid log ends (values as PKV_LOG_END_* in pagedkv_log.h). */
enum {
    PKV_END_NONE = 0,   /* no segment was read */
    PKV_END_CLEAN,      /* only zeros follow */
    PKV_END_EOF,        /* the segment file ends (too few bytes for a frame) */
    PKV_END_STALE,      /* a frame of another epoch (the segment's previous life) */
    PKV_END_GARBAGE,    /* bytes that are not a frame header */
    PKV_END_TORN,       /* a frame of this epoch that is not valid: cut */
    PKV_END_NOT_NEXT,   /* a valid frame that does not continue the log: cut */
    PKV_END_CORRUPT,    /* damage followed by valid frames (or too many candidates) */
    PKV_END_GAP,        /* a later segment starts after a hole in the LSNs */
    PKV_END_BAD_RECORD, /* an invalid record inside a valid frame (the caller's
                           verdict on pkv_rd_records failing: recovery fails) */
    PKV_END_IN_PROGRESS,/* a frame at the end changed while it was watched */
};
typedef struct pkv_rd_end {
    int reason;          /* PKV_END_* */
    uint64_t seg, off;   /* where (GAP: the segment after the hole, at SEG_HDR) */
    uint64_t expect;     /* the first LSN missing */
    bool covered;        /* TORN: among frames the checkpoint covers (harmless) */
    bool too_much;       /* CORRUPT / GAP: too many candidates to tell */
    uint64_t next_lsn;   /* CORRUPT: first LSN of the valid frame after (0: unknown);
                            NOT_NEXT: the frame's; GAP: the segment's start */
    uint64_t next_off;   /* CORRUPT: that frame's offset; IN_PROGRESS: its LSN */
    uint32_t val;        /* STALE: the epoch found; TORN: the frame's length field */
    uint32_t nrec;       /* TORN: the frame's record count field */
    uint64_t torn_bytes; /* TORN / NOT_NEXT after frames it applied: bytes cut */
    bool zero;           /* only zeros from off: writing may resume there */
    uint64_t seg_len, seg_size; /* of the segment where the log ends */
    uint32_t seg_epoch;
} pkv_rd_end;

/* Reading the log after the checkpoint chain: what the caller is told, and how
 * a frame at the end is re-read before it is called damaged. */
typedef struct pkv_rd_log {
    const pkv_io_ops *io;
    const char *dir;
    uint64_t secret;
    uint32_t block_size;
    bool decode_all;     /* decode covered records too (inspection) */
    /* A writer may be appending (read-only opens): a frame at the end is read
     * afresh before it is called damaged, and read on if it continues the log.
     * polls > 0 (inspection): watched that many times 2 ms apart; bytes that
     * change meanwhile end the log IN_PROGRESS. eager: also re-read before the
     * scan for later frames. vanish_ok: a segment gone since the listing was
     * recycled by that writer, not an error. */
    bool recheck, eager, vanish_ok;
    int polls;
    void *ctx;
    /* Each segment header (all listed segments, before reading). */
    int (*on_header)(void *ctx, const pkv_rd_seg *s);
    /* Each valid frame read: covered (wholly at or before the chain's LSN, not
     * applied) or continuing the log. Nonzero stops the read with that code. */
    int (*on_frame)(void *ctx, pkv_rd_seg *s, uint64_t off, uint64_t first, uint32_t nrec,
                    uint32_t bytes, bool covered, uint64_t after);
    /* A segment's reading is over: how its frames end (also skipped segments,
     * with reason PKV_END_NONE, and vanished ones with err -1). */
    void (*on_seg_end)(void *ctx, const pkv_rd_seg *s, const pkv_rd_end *e);
    uint64_t skipped_bytes; /* damaged bytes among covered frames, skipped */
    uint64_t torn_bytes;    /* all segments */
    uint64_t last_lsn;      /* last valid LSN */
} pkv_rd_log;
/* Read segments nos[0..n) after LSN `after` with recovery's rules: from the last
 * valid segment starting at or before after + 1; invalid headers skipped; a gap
 * before a segment holding valid frames ends the log (GAP); within a segment,
 * damaged frames the checkpoint covers skipped to the one holding after + 1; the
 * frames continuing the log handed to on_frame; at the first frame that does not,
 * the end classified (torn tail cut, or CORRUPT if valid frames follow), and
 * reading goes on in the next segment unless it is CORRUPT. *end: the last
 * classification (reason PKV_END_NONE if no segment was read). 0, or an I/O
 * error, or on_frame's. */
int pkv_rd_log_read(pkv_rd_log *L, const uint64_t *nos, size_t n, uint64_t after,
                    pkv_rd_end *end);

/* The checks of one file of the checkpoint chain after it was read, in recovery's
 * order (load_chain): its header LSN against its name, a delta's arena identity,
 * then (raw given) its kind and link onto the file before it (prev_lsn /
 * prev_sum). PKV_LINK_*, or pkv_ckpt_info's error (negative, message set); *m
 * filled once raw was decoded. */
enum {
    PKV_LINK_OK = 0,
    PKV_LINK_NAME,       /* header LSN differs from the name's */
    PKV_LINK_ARENA,      /* a delta of another arena than the chain before it */
    PKV_LINK_FOREIGN,    /* the full checkpoint describes another arena */
    PKV_LINK_KIND,       /* a full checkpoint named delta, or the reverse */
    PKV_LINK_PREV_LSN,   /* applies on another LSN than the file before it */
    PKV_LINK_PREV_SUM,   /* applies on another file of that LSN (replaced) */
};
int pkv_rd_link(bool is_base, uint64_t no, uint64_t lsn, uint64_t secret, uint64_t arena,
                const uint8_t *raw, size_t len, uint64_t prev_lsn, uint64_t prev_sum,
                pkv_ckpt_meta *m);

/* ---- wal/replay.c ---- */
/* Recover the cache from directory `dir` (checkpoint + log). */
int pkv_recover(pkv_cache *c, const char *dir, uint32_t flags, uint64_t *next_lsn,
                uint64_t *next_seg);
/* Apply one decoded record to the recovering state. */
int pkv_replay_apply(pkv_cache *c, const pkv_rec *r);
/* For the fuzz harnesses (fuzz/): the reader's frame reading as recovery uses it
 * (reader.c), on a segment image in memory (data[0, len), frames from offset
 * SEG_HDR), and the rebuild + verification that ends recovery. */
bool pkv_replay_frame_ok(const uint8_t *data, size_t len, uint32_t epoch, size_t off,
                         uint64_t *first, uint32_t *nrec, uint32_t *bytes);
int pkv_replay_frame_apply(pkv_cache *c, const uint8_t *data, size_t len, uint32_t epoch,
                           size_t off, uint64_t first, uint32_t nrec, uint32_t bytes,
                           uint64_t after, uint64_t *applied);
/* The scan of pkv_rd_scan on a segment image in memory. */
pkv_scan_res pkv_replay_scan(const uint8_t *data, size_t len, uint32_t epoch, size_t from,
                             uint64_t lsn, bool holding, uint64_t *first, size_t *at);
int pkv_replay_rebuild(pkv_cache *c);

/* A failed file call of the checkpoint or marker files (-errno `neg`) as PKV_ENOSPC
 * (ENOSPC, EDQUOT) or PKV_EIO, with a message naming what and path. */
int pkv_io_err(int neg, const char *what, const char *path);

/* ---- wal/unsynced.c: the marker of a writer without syncs ---- */
/* Did a NONE-mode writer run on another (or an unknown) boot of the machine since
 * the files were last synced? 1: recovery cuts every open tail (rule D8); 0: no;
 * PKV_EIO / PKV_ENOSPC when the marker cannot be read. */
int pkv_unsynced_restarted(const pkv_io_ops *io, const char *dir);
/* Writable open, after recovery synced what it recovered: a NONE-mode writer
 * writes the marker, any other removes a stale one. PKV_EIO / PKV_ENOSPC. */
int pkv_unsynced_begin(pkv_cache *c);
/* Clean close of a NONE-mode writer, after its last synced flush: remove it. */
void pkv_unsynced_end(pkv_cache *c);

#endif /* PKV_WAL_H */

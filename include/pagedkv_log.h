/*
 * pagedkv_log.h — read-only inspection of a cache directory's log and checkpoints.
 *
 * Reads the write-ahead log segments (wal-*), the full checkpoint (ckpt-*) and the
 * delta checkpoints (delta-*) of a cache directory with exactly the rules
 * recovery uses (they exist once, in src/wal/reader.c; docs/format.md, "Reading
 * the log"), and reports what it finds: the files, the checkpoint chain and where
 * it breaks, every record with its position, and where and why the valid log
 * ends. It never writes, takes no lock and applies nothing, so it may run beside
 * a live writer (see PKV_LOG_LIVE). kvdump (docs/kvdump.md) is its first user.
 *
 * Conventions as in pagedkv.h: the handle is opaque; every call that can fail
 * returns 0 or a negative PKV_E* code, with a message in pkv_last_error(); the
 * caller owns the buffers it passes in. A pkv_logview is used by one thread at a
 * time. "Blocks: I/O": the call reads files.
 */
#ifndef PAGEDKV_LOG_H
#define PAGEDKV_LOG_H

#include "pagedkv.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility push(default)
#endif

typedef struct pkv_logview pkv_logview;

/* What the reader needs of the arena the log belongs to, as its header says
 * (docs/format.md, "The arena header"). */
typedef struct pkv_log_arena {
    uint64_t secret;     /* the arena's identity: files naming another are foreign */
    uint32_t block_size; /* tokens per block: records are decoded with it */
    uint64_t capacity;   /* blocks: a delta checkpoint of another geometry is broken */
} pkv_log_arena;

/* pkv_logview_open flags. A writer may be appending to the log: the frame where the
 * log seems to end is read again (PKV_LOG_LIVE: watched for ~200 ms, MAYBE: ~20 ms)
 * before it is called damaged, and reading goes on if it completed; a segment or
 * checkpoint that vanishes meanwhile was recycled by the writer, not an error. */
#define PKV_LOG_LIVE 1u
#define PKV_LOG_MAYBE_LIVE 2u

/* List `dir` and read its checkpoint chain (the full checkpoint and every delta
 * in full, to check them and their links, as recovery does). The log itself is
 * read by pkv_logview_read. The handle is freed by pkv_logview_close.
 * Errors: PKV_EINVAL (NULL argument, unknown flag), PKV_EIO (the directory cannot
 * be listed), PKV_ECORRUPT (a segment number >= 2^63, which recovery refuses too),
 * PKV_ENOMEM; on failure *out is NULL. A damaged or broken chain is not an
 * error: pkv_logview_get_chain says so. Blocks: I/O. */
int pkv_logview_open(const char *dir, const pkv_log_arena *arena, uint32_t flags,
                     pkv_logview **out);
/* Free the handle (NULL: nothing). Never fails, never blocks. */
void pkv_logview_close(pkv_logview *log);

/* ---- The files --------------------------------------------------------------- */

typedef struct pkv_log_dir {
    size_t segments;        /* wal-<n> files */
    size_t checkpoints;     /* ckpt-<n> files (recovery reads only the newest) */
    size_t deltas;          /* delta-<n> files */
    uint64_t spare_mask;    /* bit k: wal-spare-<k> exists (k < 64) */
    size_t spares;          /* the run wal-spare-0.. the writer recycles */
    size_t spares_stray;    /* others below 64: the next writable open deletes them */
    size_t spares_ignored;  /* wal-spare-<k>, k >= 64: no writer makes them */
    int arena_tmp, ckpt_tmp;/* arena.tmp / ckpt.tmp left by an interrupted write */
} pkv_log_dir;
/* Never fails (NULL arguments: nothing), never blocks. */
void pkv_logview_get_dir(const pkv_logview *log, pkv_log_dir *out);
/* Of the wal-spare-<k> files of spare_mask (bit k, as pkv_log_dir.spare_mask),
 * those outside the run the writer recycles: the strays a writable open deletes.
 * Never fails, never blocks. */
uint64_t pkv_logview_spare_strays(uint64_t spare_mask);

/* ---- The checkpoint chain -------------------------------------------------------
 * Recovery loads the newest full checkpoint ckpt-<base>, then every delta-<n>
 * with n > base in order, each of which must name the LSN and body checksum of
 * the file before it; the log is read after the newest file it loads. */

typedef struct pkv_log_chain {
    int have_checkpoint;    /* a ckpt-* file exists */
    int checkpoint_ok;      /* it reads and names its own LSN */
    int checkpoint_foreign; /* it describes another arena (recovery drops all) */
    uint64_t checkpoint_no; /* the newest ckpt-<no> */
    uint64_t checkpoint_lsn, checkpoint_secret, checkpoint_file_bytes,
        checkpoint_raw_bytes, checkpoint_body_sum, checkpoint_mtime_ns;
    char checkpoint_error[200];
    int ok;                 /* recovery can load the chain; else error says why */
    char error[400];
    uint64_t newest_lsn;    /* the newest file loaded: the log is read after it */
    size_t applied;         /* deltas applied */
    size_t stale;           /* deltas at or below the checkpoint: ignored */
    uint64_t applied_raw_bytes;
} pkv_log_chain;
/* Never fails (NULL arguments: nothing), never blocks. */
void pkv_logview_get_chain(const pkv_logview *log, pkv_log_chain *out);

/* A delta file's place in the chain. */
enum {
    PKV_LOG_DELTA_APPLIED = 0, /* links onto the file before it: recovery applies it */
    PKV_LOG_DELTA_STALE,       /* at or below the full checkpoint: an older chain's */
    PKV_LOG_DELTA_BROKEN,      /* the chain breaks here: recovery fails */
    PKV_LOG_DELTA_UNREACHED,   /* after the break, or the checkpoint is unreadable */
};
typedef struct pkv_log_delta {
    uint64_t no;          /* the LSN its name says */
    int state;            /* PKV_LOG_DELTA_* */
    uint64_t lsn;         /* the LSN its header says */
    uint64_t secret, file_bytes, mtime_ns, raw_bytes, body_sum;
    uint64_t prev_lsn, prev_sum; /* the file it applies on */
    int decoded;          /* it reads and decodes: the three counts below hold */
    uint64_t sealed;      /* changed blocks sealed now */
    uint64_t freed;       /* changed blocks no longer sealed */
    uint64_t sequences;   /* all sequences at its LSN */
    char error[300];      /* broken: why */
} pkv_log_delta;
/* Delta i in name order, i < pkv_log_dir.deltas. Errors: PKV_EINVAL (NULL),
 * PKV_ERANGE (i too large). Never blocks. */
int pkv_logview_get_delta(const pkv_logview *log, size_t i, pkv_log_delta *out);

/* ---- The log ------------------------------------------------------------------ */

/* Record types (docs/format.md, "Records"). */
enum {
    PKV_LOG_SEAL = 1,
    PKV_LOG_EVICT,
    PKV_LOG_SEQ_SET,
    PKV_LOG_COMMIT,
    PKV_LOG_SEQ_BLOCK,
    PKV_LOG_TRUNC,
    PKV_LOG_SEQ_CLOSE,
    PKV_LOG_BAD,
    PKV_LOG_SEAL_RUN,  /* since 2026-12-05: the SEALs of one commit, one record */
    PKV_LOG_EVICT_RUN, /* since 2026-12-05: the EVICTs of one append, one record */
    PKV_LOG_TYPE_MAX = PKV_LOG_EVICT_RUN,
};
/* "SEAL", "EVICT", ... ("UNKNOWN" for another type). Never fails, never blocks. */
const char *pkv_logview_type_name(unsigned type);

/* One record, decoded; which fields mean something depends on the type
 * (docs/format.md). blocks and tokens point at nblocks / ntok little-endian
 * 32-bit values, valid during the callback only. A block or parent of
 * PKV_LOG_NONE is none (a root block, a truncation without a tail block).
 * SEAL_RUN: salt, nblocks entries of entry_bytes bytes each at blocks, each
 * u32 block, u32 parent, u64 hash lo, u64 hash hi, u64 payload sum, then ntok
 * u32 token ids (little-endian; format.md); EVICT_RUN: nblocks blocks. */
#define PKV_LOG_NONE 0xffffffffu
typedef struct pkv_log_rec {
    uint64_t lsn;
    uint64_t segment, offset; /* the segment file's number, the byte offset in it */
    uint32_t len;             /* bytes, header and trailer included */
    int in_checkpoint;        /* LSN at or before the chain's: recovery skips it */
    unsigned type;            /* PKV_LOG_* */
    uint64_t seq, salt, committed, hash_lo, hash_hi, payload_sum;
    uint32_t block, parent, index, first, tail_off, nblocks, ntok;
    const uint8_t *blocks, *tokens;
    uint32_t entry_bytes;     /* SEAL_RUN: bytes per entry; else 0 */
} pkv_log_rec;
/* Called for each record read, in LSN order; nonzero stops the read. */
typedef int (*pkv_log_rec_fn)(void *ctx, const pkv_log_rec *r);

/* Read the log after the chain's newest LSN as recovery does, calling fn (may be
 * NULL) for every valid record of the segments read, those the checkpoint covers
 * included (marked). Once per handle. 0 (where and why the log ends:
 * pkv_logview_get_end, also when recovery would fail), fn's nonzero return, or
 * PKV_EIO, PKV_ENOMEM; PKV_ESTATE if called twice. Blocks: I/O. */
int pkv_logview_read(pkv_logview *log, pkv_log_rec_fn fn, void *ctx);

/* Why a segment header is not usable. */
enum {
    PKV_LOG_SEG_OK = 0,
    PKV_LOG_SEG_SHORT,    /* shorter than its 64-byte header (or unreadable) */
    PKV_LOG_SEG_MAGIC,
    PKV_LOG_SEG_SUM,      /* header checksum mismatch */
    PKV_LOG_SEG_VERSION,  /* value: the version */
    PKV_LOG_SEG_NUMBER,   /* value: the number the header names */
    PKV_LOG_SEG_SIZE,     /* value: the implausible size */
    PKV_LOG_SEG_FOREIGN,  /* written for another arena */
    PKV_LOG_SEG_VANISHED, /* gone since the listing (recycled by a live writer) */
};
/* Where and why the valid log ends, in a segment or in all. */
enum {
    PKV_LOG_END_NONE = 0,    /* no log segment was read */
    PKV_LOG_END_CLEAN,       /* only zeros follow the last frame */
    PKV_LOG_END_EOF,         /* the segment file ends (too few bytes for a frame) */
    PKV_LOG_END_STALE,       /* a frame of the segment's previous life (another epoch) */
    PKV_LOG_END_GARBAGE,     /* bytes that are not a frame header */
    PKV_LOG_END_TORN,        /* a frame of this epoch that fails its length or checksum */
    PKV_LOG_END_NOT_NEXT,    /* a valid frame that does not continue the log */
    PKV_LOG_END_CORRUPT,     /* damage followed by valid frames: recovery fails */
    PKV_LOG_END_GAP,         /* a later segment starts after a hole in the LSNs */
    PKV_LOG_END_BAD_RECORD,  /* an invalid record inside a valid frame: recovery fails */
    PKV_LOG_END_IN_PROGRESS, /* a frame at the end changed while watched (live writer) */
};
typedef struct pkv_log_end {
    int reason;           /* PKV_LOG_END_* */
    uint64_t segment, offset;
    uint64_t last_lsn;    /* the last valid LSN (the chain's if the log adds none) */
    uint64_t missing_lsn; /* the LSN the log would continue with (CORRUPT, GAP,
                             BAD_RECORD: the first one recovery lacks) */
    uint64_t next_lsn;    /* CORRUPT: first LSN of the valid frame after the damage
                             (0: too many candidates to tell); GAP: the segment's
                             start; NOT_NEXT: the frame's first LSN */
    uint64_t next_offset; /* CORRUPT: that frame's offset */
    int covered;          /* TORN: among frames the checkpoint covers (harmless) */
    uint32_t value;       /* STALE: the epoch found; TORN: the frame's length field */
    uint32_t nrec;        /* TORN: the frame's record count field */
    int too_much;         /* CORRUPT, GAP: too many overlapping frame candidates
                             to tell whether a valid frame follows */
    uint64_t seg_len;     /* bytes the segment file holds (at most its size) */
    int bad;              /* BAD_RECORD: PKV_LOG_BAD_* */
    char error[300];      /* BAD_RECORD: the decoder's message */
} pkv_log_end;
/* Why a record inside a valid frame is invalid (BAD_RECORD). */
enum {
    PKV_LOG_BAD_NONE = 0,
    PKV_LOG_BAD_SHORT,    /* the frame is too short for its next record */
    PKV_LOG_BAD_LEN,      /* a record length out of bounds */
    PKV_LOG_BAD_LSN,      /* a record LSN does not follow the frame's */
    PKV_LOG_BAD_SUM,      /* a record checksum mismatch */
    PKV_LOG_BAD_DECODE,   /* the record does not decode (error says why) */
    PKV_LOG_BAD_RANGE,    /* a committed length out of range */
    PKV_LOG_BAD_TRAILING, /* bytes after the frame's last record */
};

typedef struct pkv_log_segment {
    uint64_t no;
    uint64_t file_bytes;
    int header;           /* PKV_LOG_SEG_*; OK: valid and of this arena */
    uint64_t value;       /* see PKV_LOG_SEG_* */
    uint32_t epoch;       /* OK or FOREIGN: the header's fields */
    uint64_t first_lsn, size;
    int read;             /* recovery reads it (after pkv_logview_read) */
    uint64_t frames, records;
    pkv_log_end end;      /* read: where its valid frames end; a segment skipped
                             after a hole: reason NONE, next_lsn its start */
} pkv_log_segment;
/* Segment i in number order, i < pkv_log_dir.segments (its read fields after
 * pkv_logview_read). Errors: PKV_EINVAL (NULL), PKV_ERANGE. Never blocks. */
int pkv_logview_get_segment(const pkv_logview *log, size_t i, pkv_log_segment *out);

/* Totals of pkv_logview_read. */
typedef struct pkv_log_stats {
    uint64_t first_lsn;      /* first record LSN read (0: none) */
    uint64_t frames, records, record_bytes;
    uint64_t replay_records, replay_bytes; /* after the chain: recovery applies them */
    uint64_t used_bytes;     /* bytes up to the end of the valid frames, read segments */
    uint64_t torn_bytes;     /* torn frames recovery cuts */
    uint64_t skipped_bytes;  /* damaged bytes among covered frames, skipped */
} pkv_log_stats;
/* The end of the whole log and the totals, after pkv_logview_read (before: zeros).
 * Never fails (NULL arguments: nothing), never blocks. */
void pkv_logview_get_end(const pkv_logview *log, pkv_log_end *end, pkv_log_stats *stats);

#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_LOG_H */

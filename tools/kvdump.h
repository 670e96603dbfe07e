/*
 * kvdump.h — shared declarations of the kvdump tool (tools/kvdump*.c).
 *
 * kvdump reaches a cache through its documented interfaces only: pagedkv.h and
 * the read-only inspection API of pagedkv_inspect.h, after a read-only open
 * (PKV_OPEN_RDONLY: no lock, nothing written, the arena mapped PROT_READ). It
 * reads the arena header itself (docs/format.md), and so does the bundle code
 * (kvdump_bundle.c) with bundles; import goes through the public API like any
 * writer. The log scanner (kvdump_wal.c) reads the checkpoint chain (full
 * checkpoint + delta checkpoints) and the log through the read-only log reader
 * of pagedkv_log.h (recovery's own rules, src/wal/reader.c), so that it can show
 * every delta and record and say why the chain breaks or where the valid log
 * ends. docs/kvdump.md is the reference.
 */
#ifndef KVDUMP_H
#define KVDUMP_H

#include "pagedkv.h"
#include "pagedkv_inspect.h"
#include "pagedkv_log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- Little-endian fields of the files kvdump reads and writes --------------- */

#define KD_PAGE 4096u /* the arena header page (docs/format.md) */

static inline uint32_t kd_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kd_get_u64(const uint8_t *p) {
    return (uint64_t)kd_get_u32(p) | (uint64_t)kd_get_u32(p + 4) << 32;
}
static inline void kd_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kd_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A checksum read from a file against the one computed from its bytes. The
 * fuzzing build of kvdump's code (fuzz/, PKV_FUZZING) accepts every one, as the
 * library's pkv_sum_ok does, so that fuzz inputs reach the parsers behind them. */
static inline bool kd_sum_ok(uint64_t stored, uint64_t computed) {
#ifdef PKV_FUZZING
    (void)stored;
    (void)computed;
    return true;
#else
    return stored == computed;
#endif
}

/* Exit codes (docs/kvdump.md). */
enum {
    KD_OK = 0,       /* success; verify: no problem found */
    KD_PROBLEMS = 1, /* verify found problems */
    KD_USAGE = 2,    /* usage error, or an input that cannot be read (missing,
                        truncated, corrupted, hostile directory or bundle) */
    KD_FAILED = 3,   /* the operation could not be carried out (export: nothing to
                        export or the bundle cannot be written; import: the cache
                        is busy, full or cannot be written) */
};

#define KD_SCHEMA 1 /* "kvdump" member of every JSON document */

/* ---- JSON writer (kvdump_out.c) ------------------------------------------ */

typedef struct kj {
    FILE *f;
    int depth;
    bool first[64];
    int inline_from; /* depth from which containers print on one line (0: none) */
} kj;

void kj_init(kj *j, FILE *f);
/* key is NULL inside an array. `inl`: print this container on one line. */
void kj_obj(kj *j, const char *key, bool inl);
void kj_arr(kj *j, const char *key, bool inl);
void kj_end_obj(kj *j);
void kj_end_arr(kj *j);
void kj_u64(kj *j, const char *key, uint64_t v);
void kj_i64(kj *j, const char *key, int64_t v);
void kj_dbl(kj *j, const char *key, double v); /* non-finite: null */
void kj_bool(kj *j, const char *key, bool v);
void kj_null(kj *j, const char *key);
void kj_str(kj *j, const char *key, const char *s);
void kj_strf(kj *j, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kj_hex64(kj *j, const char *key, uint64_t v); /* "0x%016llx" string */
void kj_block(kj *j, const char *key, uint32_t b);  /* number, or null for PKV_NO_BLOCK */
/* Start / end the document: { "kvdump": 1, "command": cmd, ... } */
void kj_begin_doc(kj *j, const char *cmd);
void kj_end_doc(kj *j);

/* ---- Arena header, read by kvdump itself ------------------------------------ */

typedef struct kd_hdr {
    uint32_t version, header_bytes;
    uint32_t num_layers, num_kv_heads, head_dim, block_size, dtype, elem_size;
    uint64_t capacity, block_bytes, slot_bytes, data_offset, secret, created_ns;
    uint32_t model_len;
    char model_id[PKV_MODEL_ID_MAX + 1];
    uint64_t file_size;
} kd_hdr;

/* ---- The context of one invocation --------------------------------------- */

typedef struct kd_ctx {
    const char *cmd;
    bool json;
    bool pit;          /* --point-in-time */
    kj j;
    bool doc_open;     /* the JSON document has been started on stdout */
    const char *dir;
    kd_hdr hdr;
    pkv_cache *c;
    double open_ms;
    int retries;       /* reopens because a live writer changed the directory */
} kd_ctx;

/* Print an error (stderr; with --json also an error document on stdout unless one
 * was started) and return `code`. */
int kd_fail(kd_ctx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Print a warning to stderr (never to stdout). */
void kd_warn(kd_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read and validate the arena header of dir: 0, or KD_USAGE with a message in
 * why (the directory is not a readable cache) or KD_PROBLEMS (it is one, but its
 * header is damaged or of an unsupported version). */
int kd_read_header(const char *dir, kd_hdr *h, char *why, size_t why_len);
/* 0, or PKV_ENOMEM with a message if the library's metadata for `capacity`
 * blocks would need more than half of the machine's memory (a forged header). */
int kd_check_memory(uint64_t capacity, uint32_t block_size, char *why, size_t wl);
/* Read the header and open the cache read-only (retrying while a live writer
 * changes the directory underneath). 0, or an exit code after kd_fail. */
int kd_open(kd_ctx *x);
/* Same, but return the library error code and message instead of failing. */
int kd_open_quiet(kd_ctx *x, uint32_t extra_flags, char *why, size_t why_len);
void kd_close(kd_ctx *x);

const char *kd_dtype_name(uint32_t dtype);
/* Human-readable byte count ("1.5 MiB") into buf. */
const char *kd_bytes(char *buf, size_t n, uint64_t v);
/* UTC time "2025-11-29 20:37:00" of Unix nanoseconds into buf. */
const char *kd_time(char *buf, size_t n, uint64_t ns);
/* A copy of s safe to print on a terminal (control bytes become '?'). */
const char *kd_printable(const char *s, char *buf, size_t n);
/* Strict unsigned parse (decimal or 0x hex); false on garbage or overflow. */
bool kd_parse_u64(const char *s, uint64_t *out);

/* State of a block as kvdump reports it. */
const char *kd_block_state(const pkv_block_info *x); /* "free" "cached" "used" */
/* Its kind: "sealed", "open" or "free". */
const char *kd_block_kind(const pkv_block_info *x);

/* ---- What the commands read of an opened cache (kvdump_out.c) ------------- */

typedef struct kd_seqv {
    uint64_t id;
    pkv_seq_info inf;
    uint32_t *blocks; /* its block table: inf.n_blocks entries */
} kd_seqv;

typedef struct kd_state {
    pkv_cache_info inf;
    pkv_arena_info arena;
    uint32_t cap;          /* blocks (inf.capacity) */
    pkv_block_info *blk;   /* per block */
    uint32_t *depth;       /* per block: 1 for a chain's first block, 0 for a block
                              not sealed or of a broken chain */
    /* Per block, the number of its tokens known from the tables: B for a sealed
     * block, the committed tokens in it for an open one, 0 for a free one. */
    uint32_t *ntok;
    kd_seqv *seq;          /* every sequence, by id */
    size_t nseq;
    uint64_t sealed;       /* sealed blocks */
} kd_state;

/* Read the blocks, depths and sequences of x->c into s. 0, or a negative PKV_E*
 * code with s empty (out of memory, or the cache failed a call). */
int kd_state_load(pkv_cache *c, kd_state *s);
void kd_state_free(kd_state *s);
/* The sequence with this id in s, or NULL. */
const kd_seqv *kd_state_seq(const kd_state *s, uint64_t id);

/* Convert one element to float. */
float kd_elem(const uint8_t *p, uint32_t dtype);

/* SIGBUS (a mapped file shrank under us): a clean error instead of a crash. */
void kd_install_sigbus(void);

/* ---- Command-line parsing ------------------------------------------------- */

typedef struct kd_opt {
    const char *name; /* "--state" */
    bool has_arg;
    const char *val;  /* set by kd_parse: the argument, or "" for a flag */
} kd_opt;

/* Parse argv[first..] into positional arguments (pos, at most maxpos) and the
 * options of `opts` (NULL-terminated by name). --json, --help and
 * --point-in-time are handled here. Returns -1 on --help (usage printed), the
 * number of positionals, or -2 after a usage error (message printed). */
int kd_parse(kd_ctx *x, int argc, char **argv, int first, kd_opt *opts, const char **pos,
             int maxpos, const char *usage);
const char *kd_optval(const kd_opt *opts, const char *name);

/* ---- Log scanner (kvdump_wal.c) -------------------------------------------- */

/* End reasons: PKV_LOG_END_* of pagedkv_log.h. */
const char *kd_end_name(int reason);

typedef struct kd_seg {
    uint64_t no;
    uint64_t file_size;
    bool valid;        /* header valid and of this arena */
    bool foreign;      /* header valid, another arena's secret */
    char why[96];      /* why the header is invalid */
    uint32_t epoch;
    uint64_t start, size;
    bool read;         /* recovery reads this segment */
    uint64_t frames, records;
    uint64_t end_off;  /* where the valid frames end (read segments) */
    int end_reason;
    char end_detail[200];
} kd_seg;

/* One record the scan read (its decoded form is the scanner's: kvdump_wal.c). */
typedef struct kd_logrec kd_logrec;

/* One delta checkpoint file, delta-<no> (docs/format.md). Its place in the chain
 * that recovery loads (pkv_rd_link in src/wal/reader.c): */
enum kd_delta_state {
    KD_DELTA_APPLIED = 0, /* links onto the file before it: recovery applies it */
    KD_DELTA_STALE,       /* no <= the full checkpoint's LSN: left from an older chain
                             (a crash before a full checkpoint deleted it); ignored */
    KD_DELTA_BROKEN,      /* the chain breaks here: recovery fails */
    KD_DELTA_UNREACHED,   /* after the break (or the full checkpoint is unreadable) */
};
const char *kd_delta_state_name(int state);

typedef struct kd_delta {
    uint64_t no;          /* the LSN its name says */
    int state;            /* enum kd_delta_state */
    int fail;             /* 0, or where reading it failed (kvdump_wal.c) */
    uint64_t lsn;         /* the LSN its header says */
    uint64_t secret, file_size, mtime_ns, raw, body_sum;
    uint64_t prev_lsn, prev_sum; /* the file it applies on */
    uint64_t sealed;      /* changed blocks that are sealed now */
    uint64_t freed;       /* changed blocks no longer sealed */
    uint64_t sequences;   /* all sequences at its LSN */
    char err[300];        /* fail, or broken: why */
} kd_delta;

typedef struct kd_log {
    bool have_ckpt, ckpt_ok;
    uint64_t ckpt_no;      /* the newest ckpt-<no> (the name; ckpt_lsn: its header) */
    uint64_t ckpt_lsn, ckpt_secret, ckpt_file_size, ckpt_raw, ckpt_body;
    uint64_t ckpt_sum;     /* the full checkpoint's body XXH3-64 (header offset 48) */
    uint64_t ckpt_mtime_ns;
    char ckpt_err[200];
    size_t nckpt_files;    /* ckpt-* files (normally 0 or 1) */
    /* The checkpoint chain: every delta-* file, by number, each with its state.
     * chain_lsn: the LSN of the newest file recovery loads (the full checkpoint's
     * without deltas); the log is read from there. chain_ok: recovery can load the
     * chain (false: chain_err says why; a damaged full checkpoint is ckpt_err). */
    kd_delta *deltas;
    size_t ndeltas;
    size_t nchain;         /* deltas applied */
    size_t nstale;         /* stale deltas */
    uint64_t chain_lsn;
    bool chain_ok;
    char chain_err[400];
    uint64_t chain_raw;    /* raw bytes of the applied deltas */
    kd_seg *segs;
    size_t nsegs;
    size_t nspare;         /* spares the library recycles: the run wal-spare-0..n-1 */
    uint64_t spare_mask;   /* bit k: wal-spare-<k> exists (k < 64) */
    size_t nspare_stray;   /* others below 64: the next writable open deletes them */
    size_t nspare_ignored; /* wal-spare-<k>, k >= 64: no writer makes them; ignored */
    bool arena_tmp, ckpt_tmp;
    uint64_t seg_bytes;    /* allocated bytes of every wal-* file */
    uint64_t used_bytes;   /* bytes up to the end of the valid frames, read segments */
    uint64_t first_lsn;    /* first record LSN read (0: none) */
    uint64_t last_lsn;     /* last valid LSN (chain_lsn if the log adds none) */
    uint64_t frames, records, rec_bytes;
    uint64_t replay_records, replay_bytes; /* after the checkpoint chain */
    uint64_t torn_bytes;
    uint64_t skipped_bytes; /* damaged frames the checkpoint chain covers, skipped */
    uint64_t corrupt_lsn, corrupt_next_lsn; /* corruption: LSN missing, next valid (0: unknown) */
    int end_reason;
    uint64_t end_seg, end_off;
    char end_detail[256];
} kd_log;

typedef int (*kd_rec_cb)(void *ctx, const kd_log *L, const kd_logrec *r);
/* Scan the directory's checkpoint chain and log like recovery does; call cb for
 * every record read (in LSN order). The full checkpoint and every delta are read
 * in full (to check them and their links, and count a delta's changes); the log
 * is read from the newest file of the chain that loads. 0, or an error from cb, or a
 * negative PKV_E* code with a message in why (directory unreadable, out of
 * memory). */
int kd_log_scan(const char *dir, const kd_hdr *h, kd_log *L, kd_rec_cb cb, void *ctx,
                char *why, size_t why_len);
void kd_log_free(kd_log *L);
/* The wal-spare-<k> files of spare_mask that lie outside the run the log
 * recycles (strays), as a mask of the same kind. */
uint64_t kd_spare_strays(uint64_t spare_mask);

/* ---- Commands -------------------------------------------------------------- */

int kd_cmd_wal(kd_ctx *x, int argc, char **argv);
int kd_cmd_export(kd_ctx *x, int argc, char **argv);
int kd_cmd_import(kd_ctx *x, int argc, char **argv);

#endif /* KVDUMP_H */

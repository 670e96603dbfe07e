/*
 * kvdump_wal.c — the log scanner and `kvdump wal`.
 *
 * kd_log_scan() reads the checkpoint chain and the log segments of a directory
 * with exactly the rules of pkv_recover() (src/wal/replay.c, docs/format.md
 * "Recovery"): the same file names; the chain of load_chain() (the newest
 * ckpt-<base>, then every delta-<n> with n > base in order, each naming the LSN
 * and body checksum of the file before it; deltas with n <= base are stale); the
 * log read from the newest file of the chain; segment header validity, start
 * segment, frame validity, record checks, torn-tail and corruption tests. Unlike
 * recovery it applies nothing: it reads the full checkpoint's header only, reads
 * and decodes each delta to check its link and count what it changes, hands
 * every record to a callback, and records where and why the chain breaks and the
 * valid log ends. The frame test and the scan for a valid frame after the end
 * are recovery's own (pkv_replay_frame_ok, pkv_replay_scan). Every length and
 * offset read from disk is checked against the bytes actually read before it is
 * used.
 */
#include "internal.h" /* the log's internals (wal/wal.h), for this scanner only */
#include "kvdump.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

struct kd_logrec {
    uint64_t seg, off;  /* segment number, byte offset of the record in its file */
    uint32_t len;       /* record bytes, header and trailer included */
    bool in_ckpt;       /* LSN <= the chain's newest LSN: recovery skips it */
    pkv_rec r;          /* decoded */
};

uint64_t kd_spare_strays(uint64_t spare_mask) { return pkv_wal_spare_strays(spare_mask); }

const char *kd_end_name(int r) {
    switch (r) {
    case KD_END_NONE:       return "no_log";
    case KD_END_CLEAN:      return "clean";
    case KD_END_EOF:        return "end_of_segment";
    case KD_END_STALE:      return "stale_frame";
    case KD_END_GARBAGE:    return "garbage";
    case KD_END_TORN:       return "torn_frame";
    case KD_END_NOT_NEXT:   return "not_continuation";
    case KD_END_CORRUPT:    return "corrupt";
    case KD_END_GAP:        return "gap";
    case KD_END_BAD_RECORD: return "bad_record";
    case KD_END_IN_PROGRESS: return "in_progress";
    default:                return "unknown";
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The segment being read: its bytes [0, len). */
typedef struct segdata {
    const uint8_t *d;
    size_t len;
    uint32_t epoch;
} segdata;

/* Recovery's own frame test (replay.c, frame_ok): header, length, checksum. */
static bool frame_ok(const segdata *s, size_t off, uint64_t *first, uint32_t *nrec,
                     uint32_t *bytes) {
    return pkv_replay_frame_ok(s->d, s->len, s->epoch, off, first, nrec, bytes);
}

/* Recovery's own scan (replay.c, pkv_replay_scan) for a valid frame after
 * `from`: with an LSN >= want (later_valid), or holding lsn (frame_holding). */
static pkv_scan_res later_valid(const segdata *s, size_t from, uint64_t want, uint64_t *lsn,
                                size_t *at) {
    return pkv_replay_scan(s->d, s->len, s->epoch, from, want, false, lsn, at);
}

static bool frame_holding(const segdata *s, size_t from, uint64_t lsn, size_t *at) {
    uint64_t first;
    return pkv_replay_scan(s->d, s->len, s->epoch, from, lsn, true, &first, at) ==
           PKV_SCAN_FOUND;
}

/* Did the name go away (ENOENT, and the name itself is gone)? A dangling symbolic
 * link also fails with ENOENT but stays: it is unreadable, not vanished, or the
 * scan would list and re-read the directory 50 times for nothing. */
static bool gone(const char *path) {
    struct stat st;
    return errno == ENOENT && lstat(path, &st) && errno == ENOENT;
}

/* *vanished: the file was listed but is gone (a live writer's newer checkpoint
 * removed it): the caller lists the directory again. */
static void read_ckpt_header(const char *dir, kd_log *L, bool *vanished) {
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt-%016llx", dir, (unsigned long long)L->ckpt_lsn);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (gone(path)) *vanished = true;
        errno = e;
        snprintf(L->ckpt_err, sizeof L->ckpt_err, "cannot open ckpt-%016llx: %s",
                 (unsigned long long)L->ckpt_lsn, strerror(errno));
        return;
    }
    struct stat st;
    if (!fstat(fd, &st)) {
        L->ckpt_file_size = (uint64_t)st.st_size;
        L->ckpt_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    }
    uint8_t h[CKPT_HDR];
    ssize_t r = pread(fd, h, CKPT_HDR, 0);
    close(fd);
    if (r != (ssize_t)CKPT_HDR || memcmp(h, CKPT_MAGIC, 8) ||
        !pkv_sum_ok(pkv_get_u64(h + 56), XXH3_64bits(h, 56))) {
        snprintf(L->ckpt_err, sizeof L->ckpt_err, "ckpt-%016llx: bad checkpoint header",
                 (unsigned long long)L->ckpt_lsn);
        return;
    }
    if (pkv_get_u32(h + 8) != WAL_VERSION) {
        snprintf(L->ckpt_err, sizeof L->ckpt_err, "ckpt-%016llx: checkpoint version %u",
                 (unsigned long long)L->ckpt_lsn, pkv_get_u32(h + 8));
        return;
    }
    if (pkv_get_u64(h + 16) != L->ckpt_lsn) { /* as recovery: load_chain() */
        snprintf(L->ckpt_err, sizeof L->ckpt_err,
                 "ckpt-%016llx: covers LSN %llu, not the one its name says",
                 (unsigned long long)L->ckpt_lsn, (unsigned long long)pkv_get_u64(h + 16));
        return;
    }
    L->ckpt_secret = pkv_get_u64(h + 24);
    L->ckpt_raw = pkv_get_u64(h + 32);
    L->ckpt_body = pkv_get_u64(h + 40);
    L->ckpt_sum = pkv_get_u64(h + 48);
    L->ckpt_ok = true;
}

/* ---- Delta checkpoints --------------------------------------------------------- */

const char *kd_delta_state_name(int state) {
    switch (state) {
    case KD_DELTA_APPLIED:   return "applied";
    case KD_DELTA_STALE:     return "stale";
    case KD_DELTA_BROKEN:    return "broken";
    case KD_DELTA_UNREACHED: return "unreached";
    default:                 return "unknown";
    }
}

/* Where reading a delta failed (kd_delta.fail), in the order load_chain() tests. */
enum {
    DF_READ = 1, /* missing, unreadable, bad header, body checksum, LZ4 (pkv_ckpt_read) */
    DF_HEAD,     /* the raw snapshot's head: version, kind (pkv_ckpt_info) */
    DF_BODY,     /* the rest, with the checks of pkv_ckpt_load */
};

static void delta_fail(kd_delta *d, int stage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void delta_fail(kd_delta *d, int stage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof d->err, fmt, ap);
    va_end(ap);
    d->fail = stage;
}

/* A library message about `path`, without the directory (the file name stays). */
static const char *strip_dir(const char *msg, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(msg, dir, n) && msg[n] == '/' ? msg + n + 1 : msg;
}

/* Decode a delta's raw snapshot (docs/format.md) with the checks pkv_ckpt_load
 * makes, counting its changed sealed and freed blocks and its sequences. */
static void parse_delta(const uint8_t *raw, size_t len, const kd_hdr *h, kd_delta *d) {
    pkv_ckpt_meta m;
    if (pkv_ckpt_info(raw, len, &m)) {
        delta_fail(d, DF_HEAD, "%s", pkv_last_error());
        return;
    }
    if (!m.delta) {
        delta_fail(d, DF_HEAD, "holds a full checkpoint");
        return;
    }
    d->prev_lsn = m.prev_lsn;
    d->prev_sum = m.prev_sum;
    const uint32_t bs = pkv_get_u32(raw + 4), cap = pkv_get_u32(raw + 8);
    if (bs != h->block_size || cap != h->capacity) {
        delta_fail(d, DF_BODY, "geometry (block size %u, capacity %u) differs from the "
                   "arena's (%u, %llu)", bs, cap, h->block_size,
                   (unsigned long long)h->capacity);
        return;
    }
    const size_t per = 56 + 4ull * bs;
    size_t off = 32 + 8 * 8; /* head with the link, counters */
    if (len < off + 8) goto truncated; /* from here on off <= len */
    uint64_t ns = pkv_get_u64(raw + off);
    off += 8;
    if (ns > cap || ns * per > len - off) {
        delta_fail(d, DF_BODY, "bad sealed block count %llu", (unsigned long long)ns);
        return;
    }
    for (uint64_t i = 0; i < ns; i++, off += per) {
        uint32_t blk = pkv_get_u32(raw + off), parent = pkv_get_u32(raw + off + 4);
        if (blk >= cap || (parent != PKV_NONE && parent >= cap)) {
            delta_fail(d, DF_BODY, "block %u / parent %u out of range", blk, parent);
            return;
        }
    }
    if (len - off < 8) goto truncated;
    uint64_t nf = pkv_get_u64(raw + off);
    off += 8;
    if (nf > cap || nf * 4 > len - off) {
        delta_fail(d, DF_BODY, "bad freed block count %llu", (unsigned long long)nf);
        return;
    }
    for (uint64_t i = 0; i < nf; i++, off += 4)
        if (pkv_get_u32(raw + off) >= cap) {
            delta_fail(d, DF_BODY, "freed block %u out of range", pkv_get_u32(raw + off));
            return;
        }
    if (len - off < 8) goto truncated;
    uint64_t nq = pkv_get_u64(raw + off);
    off += 8;
    for (uint64_t i = 0; i < nq; i++) {
        if (len - off < 32) goto truncated;
        uint32_t nb = pkv_get_u32(raw + off + 24), ntail = pkv_get_u32(raw + off + 28);
        off += 32;
        if (ntail >= bs || 4ull * nb + 4ull * ntail > len - off) {
            delta_fail(d, DF_BODY, "sequence %llu malformed", (unsigned long long)i);
            return;
        }
        off += 4ull * nb + 4ull * ntail;
    }
    if (off != len) {
        delta_fail(d, DF_BODY, "%zu trailing bytes", len - off);
        return;
    }
    d->sealed = ns;
    d->freed = nf;
    d->sequences = nq;
    return;
truncated:
    delta_fail(d, DF_BODY, "truncated");
}

/* Read delta-<d->no> in full (pkv_ckpt_read: header, body checksum, LZ4) and
 * decode it. *vanished as for read_ckpt_header. */
static void read_delta(const char *dir, const kd_hdr *h, kd_delta *d, bool *vanished) {
    char path[4200];
    snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)d->no);
    struct stat st;
    if (stat(path, &st)) {
        int e = errno;
        if (gone(path)) *vanished = true;
        errno = e;
        delta_fail(d, DF_READ, "cannot open: %s", strerror(errno));
        return;
    }
    d->file_size = (uint64_t)st.st_size;
    d->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    uint8_t *raw = NULL;
    size_t len = 0;
    uint64_t end = 0;
    if (pkv_ckpt_read(pkv_io_default(), path, DELTA_MAGIC, &d->secret, &d->lsn, &end, &raw,
                      &len, &d->body_sum)) {
        if (stat(path, &st) && gone(path)) *vanished = true;
        delta_fail(d, DF_READ, "%s", strip_dir(pkv_last_error(), dir));
        return;
    }
    d->raw = len;
    parse_delta(raw, len, h, d);
    free(raw);
}

/* The file before a delta in the chain, for messages: "ckpt-..." or "delta-...". */
static void prev_name(const kd_log *L, size_t i, char *out, size_t n) {
    if (i == 0 || L->deltas[i - 1].state != KD_DELTA_APPLIED)
        snprintf(out, n, "ckpt-%016llx", (unsigned long long)L->ckpt_no);
    else
        snprintf(out, n, "delta-%016llx", (unsigned long long)L->deltas[i - 1].no);
}

/* Whether delta i links onto the file before it (LSN prev_lsn, body checksum
 * prev_sum), with the tests of load_chain() in its order. Sets the state. */
static void link_delta(kd_log *L, size_t i, uint64_t prev_lsn, uint64_t prev_sum,
                       uint64_t secret) {
    kd_delta *d = &L->deltas[i];
    char before[40];
    prev_name(L, i, before, sizeof before);
    char why[512];
    why[0] = '\0';
    if (d->fail == DF_READ) {
        snprintf(why, sizeof why, "unreadable: %s", d->err);
    } else if (d->lsn != d->no) {
        snprintf(why, sizeof why, "covers LSN %llu, not the one its name says",
                 (unsigned long long)d->lsn);
    } else if (d->secret != secret) {
        snprintf(why, sizeof why, "the checkpoint chain is broken: the delta describes "
                 "another arena than the checkpoints before it");
    } else if (d->fail == DF_HEAD) {
        snprintf(why, sizeof why, "%s", d->err);
    } else if (d->prev_lsn != prev_lsn) {
        bool present = d->prev_lsn == L->ckpt_no;
        for (size_t k = 0; k < L->ndeltas; k++) present |= L->deltas[k].no == d->prev_lsn;
        snprintf(why, sizeof why, "the checkpoint chain is broken: it applies on the file of "
                 "LSN %llu%s; the file before it is %s (LSN %llu)",
                 (unsigned long long)d->prev_lsn,
                 present ? "" : ", which is not in the directory", before,
                 (unsigned long long)prev_lsn);
    } else if (d->prev_sum != prev_sum) {
        snprintf(why, sizeof why, "the checkpoint chain is broken: it applies on a file of "
                 "LSN %llu with body checksum %016llx, but %s has %016llx (replaced)",
                 (unsigned long long)prev_lsn, (unsigned long long)d->prev_sum, before,
                 (unsigned long long)prev_sum);
    } else if (d->fail == DF_BODY) {
        snprintf(why, sizeof why, "does not decode: %s", d->err);
    }
    if (!why[0]) {
        d->state = KD_DELTA_APPLIED;
        return;
    }
    d->state = KD_DELTA_BROKEN;
    snprintf(d->err, sizeof d->err, "%.*s", (int)sizeof d->err - 1, why);
}

/* Place every delta in the chain recovery loads, as load_chain() does, and set
 * chain_lsn: where the log is read from. */
static void link_chain(kd_log *L, uint64_t secret) {
    L->chain_ok = true;
    L->chain_lsn = L->ckpt_ok ? L->ckpt_lsn : 0;
    uint64_t prev_lsn = L->ckpt_lsn, prev_sum = L->ckpt_sum;
    bool stop = false;
    for (size_t i = 0; i < L->ndeltas; i++) {
        kd_delta *d = &L->deltas[i];
        if (L->have_ckpt && d->no <= L->ckpt_no) {
            d->state = KD_DELTA_STALE;
            L->nstale++;
            continue;
        }
        if (!L->have_ckpt && !stop) {
            d->state = KD_DELTA_BROKEN;
            snprintf(d->err, sizeof d->err, "no full checkpoint (ckpt-*) to apply it on");
        } else if (stop || !L->ckpt_ok) {
            d->state = KD_DELTA_UNREACHED;
            continue;
        } else {
            link_delta(L, i, prev_lsn, prev_sum, secret);
        }
        stop = d->state != KD_DELTA_APPLIED;
        if (d->state == KD_DELTA_BROKEN) {
            L->chain_ok = false;
            snprintf(L->chain_err, sizeof L->chain_err, "delta-%016llx: %s",
                     (unsigned long long)d->no, d->err);
        } else {
            L->nchain++;
            L->chain_raw += d->raw;
            L->chain_lsn = prev_lsn = d->lsn;
            prev_sum = d->body_sum;
        }
    }
}

/* Read the chain's files: the full checkpoint's header, every delta. */
static void read_chain(const char *dir, const kd_hdr *h, kd_log *L, bool *vanished) {
    L->ckpt_no = L->ckpt_lsn;
    if (L->have_ckpt) read_ckpt_header(dir, L, vanished);
    for (size_t i = 0; i < L->ndeltas; i++) read_delta(dir, h, &L->deltas[i], vanished);
}

static void load_seg_header(const char *dir, const kd_hdr *h, kd_seg *s) {
    char path[4200];
    snprintf(path, sizeof path, "%s/wal-%016llx", dir, (unsigned long long)s->no);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(s->why, sizeof s->why, "cannot open: %s", strerror(errno));
        return;
    }
    struct stat st;
    if (!fstat(fd, &st)) s->file_size = (uint64_t)st.st_size;
    uint8_t b[SEG_HDR];
    ssize_t r = pread(fd, b, SEG_HDR, 0);
    close(fd);
    if (r != (ssize_t)SEG_HDR) {
        snprintf(s->why, sizeof s->why, "shorter than its 64-byte header");
        return;
    }
    if (memcmp(b, SEG_MAGIC, 8)) {
        snprintf(s->why, sizeof s->why, "bad magic");
        return;
    }
    if (!pkv_sum_ok(pkv_get_u64(b + 56), XXH3_64bits(b, 56))) {
        snprintf(s->why, sizeof s->why, "header checksum mismatch");
        return;
    }
    if (pkv_get_u32(b + 8) != WAL_VERSION) {
        snprintf(s->why, sizeof s->why, "version %u", pkv_get_u32(b + 8));
        return;
    }
    if (pkv_get_u64(b + 16) != s->no) {
        snprintf(s->why, sizeof s->why, "header names segment %llu",
                 (unsigned long long)pkv_get_u64(b + 16));
        return;
    }
    if (pkv_get_u64(b + 40) > (16ull << 30)) {
        snprintf(s->why, sizeof s->why, "implausible size %llu",
                 (unsigned long long)pkv_get_u64(b + 40));
        return;
    }
    s->epoch = pkv_get_u32(b + 12);
    s->start = pkv_get_u64(b + 24);
    s->size = pkv_get_u64(b + 40);
    if (pkv_get_u64(b + 32) != h->secret) {
        s->foreign = true;
        snprintf(s->why, sizeof s->why, "written for another arena (secret differs)");
        return;
    }
    s->valid = true;
}

/* A new zeroed element at the end of the array *arrp (of `size`-byte elements,
 * *n in use, *cap allocated), growing it; NULL when out of memory. */
static void *push_zeroed(void *arrp, size_t *n, size_t *cap, size_t size) {
    uint8_t *a;
    memcpy(&a, arrp, sizeof a);
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        uint8_t *na = realloc(a, nc * size);
        if (!na) return NULL;
        a = na;
        memcpy(arrp, &a, sizeof a);
        *cap = nc;
    }
    uint8_t *e = a + (*n)++ * size;
    memset(e, 0, size);
    return e;
}

static int list_dir(const char *dir, kd_log *L, char *why, size_t wl) {
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, wl, "open directory %s: %s", dir, strerror(errno));
        return PKV_EIO;
    }
    size_t cap = 0, dcap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        uint64_t n;
        /* The same name rules as list_dir() in replay.c. */
        if (pkv_wal_name_no(e->d_name, "wal-", &n)) {
            kd_seg *s = push_zeroed(&L->segs, &L->nsegs, &cap, sizeof *s);
            if (!s) {
                snprintf(why, wl, "out of memory listing %s", dir);
                rc = PKV_ENOMEM;
                break;
            }
            s->no = n;
        } else if (pkv_wal_name_no(e->d_name, "ckpt-", &n)) {
            if (!L->have_ckpt || n > L->ckpt_lsn) L->ckpt_lsn = n;
            L->have_ckpt = true;
            L->nckpt_files++;
        } else if (pkv_wal_name_no(e->d_name, "delta-", &n)) {
            kd_delta *x = push_zeroed(&L->deltas, &L->ndeltas, &dcap, sizeof *x);
            if (!x) {
                snprintf(why, wl, "out of memory listing %s", dir);
                rc = PKV_ENOMEM;
                break;
            }
            x->no = n;
        } else if (pkv_wal_name_no(e->d_name, "wal-spare-", &n)) {
            if (n < 64) L->spare_mask |= 1ull << n;
            else L->nspare_ignored++;
        } else if (!strcmp(e->d_name, "arena.tmp")) {
            L->arena_tmp = true;
        } else if (!strcmp(e->d_name, "ckpt.tmp")) {
            L->ckpt_tmp = true;
        }
    }
    closedir(d);
    /* As the library counts them (wal.h): the run from 0 is recycled, the rest of
     * those below 64 are strays. */
    L->nspare = (size_t)pkv_wal_spare_run(L->spare_mask);
    L->nspare_stray = (size_t)__builtin_popcountll(pkv_wal_spare_strays(L->spare_mask));
    if (!rc && L->nsegs) {
        /* Sort by number (kd_seg starts with its number). */
        uint64_t *nos = malloc(L->nsegs * sizeof *nos);
        if (!nos) {
            snprintf(why, wl, "out of memory");
            return PKV_ENOMEM;
        }
        for (size_t i = 0; i < L->nsegs; i++) nos[i] = L->segs[i].no;
        qsort(nos, L->nsegs, sizeof *nos, cmp_u64);
        for (size_t i = 0; i < L->nsegs; i++) {
            memset(&L->segs[i], 0, sizeof L->segs[i]);
            L->segs[i].no = nos[i];
        }
        free(nos);
    }
    /* Deltas by number (kd_delta starts with it). */
    if (!rc && L->ndeltas) qsort(L->deltas, L->ndeltas, sizeof *L->deltas, cmp_u64);
    return rc;
}

static void set_end(kd_log *L, kd_seg *s, int reason, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_end(kd_log *L, kd_seg *s, int reason, uint64_t off, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->end_detail, sizeof s->end_detail, fmt, ap);
    va_end(ap);
    s->end_reason = reason;
    s->end_off = off;
    L->end_reason = reason;
    L->end_seg = s->no;
    L->end_off = off;
    snprintf(L->end_detail, sizeof L->end_detail, "%s", s->end_detail);
}

/* Records of one valid frame. `strict`: recovery applies this frame, so a bad
 * record is fatal (KD_END_BAD_RECORD); otherwise it is covered by the checkpoint
 * and recovery never looks inside. Returns 1 on a fatal record, a callback
 * error, or 0. */
static int frame_records(const segdata *sd, kd_seg *s, kd_log *L, size_t off, uint64_t first,
                         uint32_t nrec, uint32_t bytes, uint64_t covered, bool strict,
                         uint32_t bs, kd_rec_cb cb, void *ctx, int *cbrc) {
    const uint8_t *base = sd->d + off + FRAME_HDR;
    size_t pos = 0;
    const char *bad = NULL;
    uint64_t bad_lsn = first;
    for (uint32_t i = 0; i < nrec; i++) {
        bad_lsn = first + i;
        if (bytes - pos < REC_HDR + REC_TRAILER) {
            bad = "frame truncated: too short for its next record";
            break;
        }
        const uint8_t *p = base + pos;
        uint32_t rl = pkv_get_u32(p);
        uint64_t lsn = pkv_get_u64(p + 8);
        if (rl < REC_HDR + REC_TRAILER || (rl & 7) || rl > bytes - pos) {
            bad = "record length out of bounds";
            break;
        }
        if (lsn != first + i) {
            bad = "record LSN does not follow the frame's";
            break;
        }
        if (!pkv_sum_ok(pkv_get_u64(p + rl - REC_TRAILER),
                        XXH3_64bits_withSeed(p, rl - REC_TRAILER, sd->epoch))) {
            bad = "record checksum mismatch";
            break;
        }
        kd_logrec r;
        memset(&r, 0, sizeof r);
        int drc = pkv_rec_decode(p, rl - REC_HDR - REC_TRAILER, bs, &r.r);
        if (drc) {
            bad = "record does not decode";
            break;
        }
        if ((r.r.type == REC_SEQ_SET || r.r.type == REC_COMMIT || r.r.type == REC_TRUNC) &&
            r.r.committed > (uint64_t)UINT32_MAX * bs) {
            bad = "committed length out of range";
            break;
        }
        r.seg = s->no;
        r.off = off + FRAME_HDR + pos;
        r.len = rl;
        r.in_ckpt = lsn <= covered;
        s->records++;
        L->records++;
        L->rec_bytes += rl;
        if (!r.in_ckpt) {
            L->replay_records++;
            L->replay_bytes += rl;
        }
        if (!L->first_lsn) L->first_lsn = lsn;
        if (cb) {
            int rc = cb(ctx, L, &r);
            if (rc) {
                *cbrc = rc;
                return 1;
            }
        }
        pos += rl;
    }
    if (!bad && pos != bytes) bad = "frame has trailing bytes after its last record";
    if (!bad) return 0;
    if (!strict) return 0; /* recovery never reads inside a frame it skips */
    char last[300];
    snprintf(last, sizeof last, "%s", pkv_last_error());
    set_end(L, s, KD_END_BAD_RECORD, off,
            "record at LSN %llu invalid inside a valid frame (%s%s%s): recovery fails "
            "(a writer bug or a forged frame)", (unsigned long long)bad_lsn, bad,
            !strcmp(bad, "record does not decode") ? ": " : "",
            !strcmp(bad, "record does not decode") ? last : "");
    L->corrupt_lsn = bad_lsn;
    return 1;
}

/* ---- A live writer's frame in flight ------------------------------------------
 * The segment is mapped, so with a live writer its bytes change while the scan
 * reads them: the frame at the log's end may be appended, or completed, between
 * two of classify_end's tests (a valid frame then "did not continue the log" at
 * the very LSN expected), and a frame caught half copied looks torn, which
 * verify calls a crash-cut write. Frames are written in order and never change
 * once complete, so a frame that continues the log stays valid, and any valid
 * frame further on means the one at the end is complete. Before calling the end
 * damaged, classify_end therefore watches it: still not a valid continuation,
 * and unchanged, for a while (~200 ms if a writer holds the directory, ~20 ms
 * if that is unknown, not at all if none does, so a dead directory's torn tail
 * costs no waiting). */

/* Whether a writer holds the directory: a FLOCK in /proc/locks on the inode of
 * the directory or of its LOCK file. 1 yes, 0 no, -1 unknown. Reading
 * /proc/locks takes no lock, so a writer opening meanwhile is never refused.
 * Only inode numbers are compared: a lock on a same-numbered file elsewhere
 * costs a longer watch, never a wrong verdict. */
static int writer_live(const char *dir) {
    struct stat sd, sl;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    if (stat(dir, &sd)) return -1;
    bool have_lock = stat(lock, &sl) == 0;
    FILE *f = fopen("/proc/locks", "re");
    if (!f) return -1;
    char line[256];
    int live = 0;
    while (!live && fgets(line, sizeof line, f)) {
        if (!strstr(line, "FLOCK")) continue;
        char *save = NULL;
        for (char *t = strtok_r(line, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) {
            char *c2 = strchr(t, ':');
            if (!c2 || !(c2 = strchr(c2 + 1, ':'))) continue;
            unsigned long long ino = strtoull(c2 + 1, NULL, 10);
            live = ino == (unsigned long long)sd.st_ino ||
                   (have_lock && ino == (unsigned long long)sl.st_ino);
            break;
        }
    }
    fclose(f);
    return live;
}

/* Is the frame at off a valid continuation of the log (it holds `expect`)? */
static bool continues_at(const segdata *sd, size_t off, uint64_t expect, uint64_t *first) {
    uint32_t nrec, bytes;
    return frame_ok(sd, off, first, &nrec, &bytes) && *first <= expect &&
           *first + nrec - 1 >= expect;
}

#define WATCH_BYTES (64u << 10)

static void end_completed(kd_log *L, kd_seg *s, size_t off, uint64_t first) {
    set_end(L, s, KD_END_IN_PROGRESS, off, "a frame starting at LSN %llu was completed while "
            "it was read (a live writer); a later read includes it", (unsigned long long)first);
}

/* The frame at off is (or becomes, within the watch) a valid continuation, or
 * its bytes change meanwhile: end the segment as in progress and return true.
 * `wait`: watch (else test once); *live: writer_live(), computed on first use
 * (-2 before). */
static bool in_flight(const segdata *sd, kd_seg *s, kd_log *L, size_t off, uint64_t expect,
                      bool wait, const char *dir, int *live) {
    uint64_t first;
    bool done = continues_at(sd, off, expect, &first), changed = false;
    if (!done && wait && off < sd->len) {
        if (*live == -2) *live = writer_live(dir);
        const int polls = *live > 0 ? 100 : *live < 0 ? 10 : 0;
        size_t n = sd->len - off < WATCH_BYTES ? sd->len - off : WATCH_BYTES;
        uint8_t *was = polls ? malloc(n) : NULL;
        if (was) {
            memcpy(was, sd->d + off, n);
            for (int i = 0; i < polls && !done && !changed; i++) {
                struct timespec ts = {0, 2 * 1000 * 1000};
                nanosleep(&ts, NULL);
                done = continues_at(sd, off, expect, &first);
                changed = !done && memcmp(was, sd->d + off, n) != 0;
            }
            free(was);
        }
    }
    if (done)
        end_completed(L, s, off, first);
    else if (changed)
        set_end(L, s, KD_END_IN_PROGRESS, off, "a frame at offset %zu was being written while "
                "it was read (a live writer); a later read includes it", off);
    return done || changed;
}

/* Why the frames of a read segment stop at `off`. Mirrors the torn-tail /
 * corruption decision of replay_log(). Returns true if recovery stops here for
 * good (corruption). Every verdict of damage is first checked by in_flight()
 * (see above); dir and *live serve it. */
static bool classify_end(const segdata *sd, kd_seg *s, kd_log *L, size_t off, uint64_t expect,
                         bool reached, const char *dir, int *live) {
    if (in_flight(sd, s, L, off, expect, false, dir, live)) return false;
    uint64_t f = 0;
    size_t at = 0;
    pkv_scan_res later = off <= sd->len && sd->len - off >= FRAME_HDR
                             ? later_valid(sd, off, expect, &f, &at)
                             : PKV_SCAN_NONE;
    if (later != PKV_SCAN_NONE && in_flight(sd, s, L, off, expect, true, dir, live)) return false;
    if (later == PKV_SCAN_FOUND) {
        L->corrupt_lsn = expect;
        L->corrupt_next_lsn = f;
        set_end(L, s, KD_END_CORRUPT, off,
                "damaged at LSN %llu, but a valid frame with LSN %llu follows at offset %zu: "
                "recovery fails unless opened point-in-time (--point-in-time), which stops "
                "before LSN %llu", (unsigned long long)expect, (unsigned long long)f, at,
                (unsigned long long)expect);
        return true;
    }
    if (later == PKV_SCAN_TOO_MUCH) {
        L->corrupt_lsn = expect;
        L->corrupt_next_lsn = 0; /* unknown */
        set_end(L, s, KD_END_CORRUPT, off,
                "damaged at LSN %llu, followed by more overlapping frame candidates than "
                "recovery checks (a forged or damaged segment): recovery fails unless opened "
                "point-in-time (--point-in-time), which stops before LSN %llu",
                (unsigned long long)expect, (unsigned long long)expect);
        return true;
    }
    if (off > sd->len || sd->len - off < FRAME_HDR) {
        if (off >= sd->len)
            set_end(L, s, KD_END_EOF, off, "end of the segment file%s",
                    sd->len < s->size ? " (the file is shorter than its allocated size)" : "");
        else
            set_end(L, s, KD_END_EOF, off, "%zu bytes left, too few for a frame header",
                    sd->len - off);
        return false;
    }
    bool zero = true;
    for (size_t o = off; zero && o < sd->len; o++) zero = sd->d[o] == 0;
    if (zero) {
        set_end(L, s, KD_END_CLEAN, off, "only zeros follow (clean end)");
        return false;
    }
    const uint8_t *p = sd->d + off;
    if (pkv_get_u32(p) != FRAME_MAGIC) {
        set_end(L, s, KD_END_GARBAGE, off, "bytes that are not a frame header follow "
                "(ignored)");
        return false;
    }
    if (pkv_get_u32(p + 4) != sd->epoch) {
        set_end(L, s, KD_END_STALE, off, "a frame of epoch %08x from the segment's previous "
                "life follows (ignored)", pkv_get_u32(p + 4));
        return false;
    }
    uint32_t nb = pkv_get_u32(p + 20);
    uint64_t first;
    uint32_t nrec, bytes;
    if (!reached) {
        set_end(L, s, KD_END_TORN, off, "a damaged frame among those the checkpoint covers "
                "(harmless: recovery needs none of them)");
        return false;
    }
    /* A frame of this epoch that is not valid: torn, or a live writer's frame
     * half copied. Zeros, garbage and an older epoch's frames (a recycled
     * segment) end the log without a verdict of damage, so they are not
     * watched: a live writer's recycled tail would cost every scan the watch. */
    if (in_flight(sd, s, L, off, expect, true, dir, live)) return false;
    /* One frame test decides both: a frame completed since the watch (a writer
     * stalled beyond it) continues the log and is no damage. */
    const bool valid = frame_ok(sd, off, &first, &nrec, &bytes);
    if (valid && first <= expect && first + nrec - 1 >= expect) {
        end_completed(L, s, off, first);
        return false;
    }
    L->torn_bytes += FRAME_HDR + (nb < sd->len - off ? nb : sd->len - off);
    if (nb > sd->len - off - FRAME_HDR || (nb & 7))
        set_end(L, s, KD_END_TORN, off, "torn frame: its length %u runs past the file or is "
                "not a multiple of 8; recovery cuts it", nb);
    else if (valid)
        set_end(L, s, KD_END_NOT_NEXT, off, "a valid frame starting at LSN %llu does not "
                "continue the log (expected LSN %llu); recovery cuts it",
                (unsigned long long)first, (unsigned long long)expect);
    else if (pkv_get_u32(p + 16) == 0)
        set_end(L, s, KD_END_TORN, off, "frame holds no records; recovery cuts it");
    else
        set_end(L, s, KD_END_TORN, off, "torn frame: checksum mismatch (a write cut short); "
                "recovery cuts it");
    return false;
}

int kd_log_scan(const char *dir, const kd_hdr *h, kd_log *L, kd_rec_cb cb, void *ctx,
                char *why, size_t wl) {
    int rc;
    /* A live writer's full checkpoint removes the older ckpt-* and every delta-*
     * file: when a listed one is gone, list again. */
    for (int attempt = 0;; attempt++) {
        memset(L, 0, sizeof *L);
        rc = list_dir(dir, L, why, wl);
        if (rc) {
            kd_log_free(L);
            return rc;
        }
        bool vanished = false;
        read_chain(dir, h, L, &vanished);
        if (!vanished || attempt == 49) break;
        kd_log_free(L);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    link_chain(L, h->secret);
    uint64_t after = L->chain_lsn;
    uint64_t expect = after + 1;
    L->last_lsn = after;
    size_t i0 = 0;
    for (size_t i = 0; i < L->nsegs; i++) {
        kd_seg *s = &L->segs[i];
        load_seg_header(dir, h, s);
        L->seg_bytes += s->file_size;
        if (s->valid && s->start <= expect) i0 = i;
    }
    uint8_t *buf = NULL;
    size_t buflen = 0;
    int cbrc = 0, live = -2; /* live: writer_live(), once needed */
    bool stop = false;
    for (size_t i = i0; i < L->nsegs && !stop; i++) {
        kd_seg *s = &L->segs[i];
        if (!s->valid) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/wal-%016llx", dir, (unsigned long long)s->no);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            /* Renamed or removed since the listing: a live writer recycled a
             * segment that a newer checkpoint covers. */
            s->valid = false;
            snprintf(s->why, sizeof s->why, "vanished while being read (recycled by a live writer)");
            continue;
        }
        if (fd < 0) {
            snprintf(why, wl, "open %s: %s", path, strerror(errno));
            rc = PKV_EIO;
            break;
        }
        /* Map rather than read: a 32 MiB segment is mostly zeros, and faulting in
         * fresh anonymous memory for a copy costs far more than mapping the
         * page cache. A file truncated while mapped raises SIGBUS, which
         * kd_install_sigbus() turns into a clean error. */
        size_t want = (size_t)(s->size < s->file_size ? s->size : s->file_size);
        if (buf) munmap(buf, buflen);
        buf = NULL;
        buflen = 0;
        size_t got = 0;
        if (want) {
            void *m = mmap(NULL, want, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m == MAP_FAILED) {
                snprintf(why, wl, "map %s: %s", path, strerror(errno));
                close(fd);
                rc = PKV_EIO;
                break;
            }
            madvise(m, want, MADV_SEQUENTIAL);
            buf = m;
            buflen = got = want;
        }
        close(fd);
        segdata sd = {buf, got, s->epoch};
        if (s->start > expect) { /* a gap */
            uint64_t f;
            size_t at;
            pkv_scan_res gap_scan = later_valid(&sd, SEG_HDR - 8, 0, &f, &at);
            if (gap_scan == PKV_SCAN_NONE) {
                snprintf(s->end_detail, sizeof s->end_detail, "skipped: starts at LSN %llu "
                         "after a hole (expected %llu) and holds no valid frame",
                         (unsigned long long)s->start, (unsigned long long)expect);
                continue;
            }
            s->read = true;
            L->corrupt_lsn = expect;
            L->corrupt_next_lsn = s->start;
            set_end(L, s, KD_END_GAP, SEG_HDR, "records from LSN %llu are missing: segment "
                    "%llu starts at LSN %llu and holds %s; recovery fails unless "
                    "opened point-in-time (--point-in-time)", (unsigned long long)expect,
                    (unsigned long long)s->no, (unsigned long long)s->start,
                    gap_scan == PKV_SCAN_FOUND ? "valid frames"
                                               : "more overlapping frame candidates than "
                                                 "recovery checks");
            break;
        }
        s->read = true;
        size_t off = SEG_HDR;
        bool reached = s->start >= expect;
        for (;;) {
            uint64_t first;
            uint32_t nrec, bytes;
            if (!frame_ok(&sd, off, &first, &nrec, &bytes)) {
                /* Damage among frames the checkpoint covers is harmless: recovery
                 * skips to the valid frame holding the first LSN it needs. */
                size_t o2;
                if (!reached && frame_holding(&sd, off, expect, &o2)) {
                    L->skipped_bytes += o2 - off;
                    off = o2;
                    continue;
                }
                break;
            }
            if (first + nrec - 1 < expect) { /* wholly before: recovery skips it */
                s->frames++;
                L->frames++;
                if (frame_records(&sd, s, L, off, first, nrec, bytes, expect - 1, false,
                                  h->block_size, cb, ctx, &cbrc)) {
                    stop = true;
                    break;
                }
                off += FRAME_HDR + bytes;
                continue;
            }
            if (first > expect) break;
            reached = true;
            s->frames++;
            L->frames++;
            if (frame_records(&sd, s, L, off, first, nrec, bytes, expect - 1, true,
                              h->block_size, cb, ctx, &cbrc)) {
                stop = true;
                break;
            }
            expect = first + nrec;
            off += FRAME_HDR + bytes;
        }
        L->used_bytes += off;
        if (stop) break;
        if (classify_end(&sd, s, L, off, expect, reached, dir, &live)) break;
    }
    if (buf) munmap(buf, buflen);
    L->last_lsn = expect - 1;
    if (cbrc) return cbrc;
    return rc;
}

void kd_log_free(kd_log *L) {
    free(L->segs);
    free(L->deltas);
    L->segs = NULL;
    L->deltas = NULL;
}

/* ---- kvdump wal ---------------------------------------------------------------- */

static const char wal_usage[] =
    "usage: kvdump wal DIR [--from LSN] [--to LSN] [--type T[,T...]] [--stats] [--json]\n"
    "\n"
    "Print the records of the log one per line, in LSN order, as recovery reads them\n"
    "(from the segment that holds LSN + 1 of the newest file of the checkpoint chain:\n"
    "the full checkpoint, or the last delta checkpoint on it), then the LSN where the\n"
    "valid log ends and why. Records covered by the checkpoint chain are marked.\n"
    "\n"
    "  --from LSN   only records with LSN >= LSN\n"
    "  --to LSN     only records with LSN <= LSN\n"
    "  --type T     only records of these types: seal, evict, seq_set, commit,\n"
    "               seq_block, trunc, seq_close, bad (or their numbers)\n"
    "  --stats      per-type counts and bytes instead of the records\n"
    "  --json       one JSON document (see docs/kvdump.md)\n";

typedef struct walctx {
    kd_ctx *x;
    uint64_t from, to;
    uint32_t types; /* bit per type; 0 = all */
    bool stats;
    uint64_t count[REC_TYPE_MAX + 1], bytes[REC_TYPE_MAX + 1];
    uint64_t shown;
} walctx;

static bool parse_types(const char *s, uint32_t *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        for (char *q = t; *q; q++) *q = (char)(*q == '-' ? '_' : toupper((unsigned char)*q));
        unsigned k = 0;
        for (unsigned i = 1; i <= REC_TYPE_MAX; i++)
            if (!strcmp(t, pkv_rec_type_name(i))) k = i;
        uint64_t n;
        if (!k && kd_parse_u64(t, &n) && n >= 1 && n <= REC_TYPE_MAX) k = (unsigned)n;
        if (!k) return false;
        *mask |= 1u << k;
    }
    return *mask != 0;
}

static void print_list(const uint8_t *p, uint32_t n) {
    enum { SHOW = 16 };
    putchar('[');
    for (uint32_t i = 0; i < n && i < SHOW; i++)
        printf(i ? " %u" : "%u", pkv_get_u32(p + 4ull * i));
    if (n > SHOW) printf(" ...+%u", n - SHOW);
    putchar(']');
}

static void json_list(kj *j, const char *key, const uint8_t *p, uint32_t n) {
    kj_arr(j, key, true);
    for (uint32_t i = 0; i < n; i++) kj_u64(j, NULL, pkv_get_u32(p + 4ull * i));
    kj_end_arr(j);
}

static int wal_rec(void *vctx, const kd_log *L, const kd_logrec *lr) {
    (void)L;
    walctx *w = vctx;
    const pkv_rec *r = &lr->r;
    if (r->lsn < w->from || r->lsn > w->to) return 0;
    if (w->types && !(w->types & (1u << r->type))) return 0;
    if (r->type <= REC_TYPE_MAX) {
        w->count[r->type]++;
        w->bytes[r->type] += lr->len;
    }
    w->shown++;
    if (w->stats) return 0;
    kd_ctx *x = w->x;
    if (x->json) {
        kj *j = &x->j;
        kj_obj(j, NULL, true);
        kj_u64(j, "lsn", r->lsn);
        kj_u64(j, "segment", lr->seg);
        kj_u64(j, "offset", lr->off);
        kj_u64(j, "len", lr->len);
        kj_str(j, "type", pkv_rec_type_name(r->type));
        kj_bool(j, "in_checkpoint", lr->in_ckpt);
        switch (r->type) {
        case REC_SEAL:
            kj_u64(j, "block", r->block);
            kj_block(j, "parent", r->parent);
            kj_u64(j, "salt", r->salt);
            kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)r->hash_hi,
                    (unsigned long long)r->hash_lo);
            kj_hex64(j, "payload_sum", r->payload_sum);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case REC_EVICT:
        case REC_BAD:
            kj_u64(j, "block", r->block);
            break;
        case REC_SEQ_SET:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "salt", r->salt);
            kj_u64(j, "committed", r->committed);
            json_list(j, "blocks", r->blocks, r->nblocks);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case REC_COMMIT:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "committed", r->committed);
            kj_u64(j, "first", r->first);
            json_list(j, "blocks", r->blocks, r->nblocks);
            kj_u64(j, "tail_off", r->tail_off);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case REC_SEQ_BLOCK:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "index", r->index);
            kj_u64(j, "block", r->block);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case REC_TRUNC:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "committed", r->committed);
            kj_block(j, "tail_block", r->block);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case REC_SEQ_CLOSE:
            kj_u64(j, "seq", r->seq);
            break;
        default:
            break;
        }
        kj_end_obj(j);
        return 0;
    }
    printf("lsn %-8llu seg %llu off 0x%-6llx len %-5u %-9s ", (unsigned long long)r->lsn,
           (unsigned long long)lr->seg, (unsigned long long)lr->off, lr->len,
           pkv_rec_type_name(r->type));
    switch (r->type) {
    case REC_SEAL:
        printf("block %u parent ", r->block);
        if (r->parent == PKV_NONE) printf("-");
        else printf("%u", r->parent);
        printf(" salt %llu hash %016llx%016llx sum %016llx tokens ", (unsigned long long)r->salt,
               (unsigned long long)r->hash_hi, (unsigned long long)r->hash_lo,
               (unsigned long long)r->payload_sum);
        print_list(r->tokens, r->ntok);
        break;
    case REC_EVICT:
    case REC_BAD:
        printf("block %u", r->block);
        break;
    case REC_SEQ_SET:
        printf("seq %llu salt %llu committed %llu blocks ", (unsigned long long)r->seq,
               (unsigned long long)r->salt, (unsigned long long)r->committed);
        print_list(r->blocks, r->nblocks);
        printf(" tail ");
        print_list(r->tokens, r->ntok);
        break;
    case REC_COMMIT:
        printf("seq %llu committed %llu first %u blocks ", (unsigned long long)r->seq,
               (unsigned long long)r->committed, r->first);
        print_list(r->blocks, r->nblocks);
        printf(" tail_off %u tail ", r->tail_off);
        print_list(r->tokens, r->ntok);
        break;
    case REC_SEQ_BLOCK:
        printf("seq %llu index %u block %u tokens ", (unsigned long long)r->seq, r->index,
               r->block);
        print_list(r->tokens, r->ntok);
        break;
    case REC_TRUNC:
        printf("seq %llu committed %llu tail_block ", (unsigned long long)r->seq,
               (unsigned long long)r->committed);
        if (r->block == PKV_NONE) printf("-");
        else printf("%u", r->block);
        printf(" tail ");
        print_list(r->tokens, r->ntok);
        break;
    case REC_SEQ_CLOSE:
        printf("seq %llu", (unsigned long long)r->seq);
        break;
    default:
        break;
    }
    if (lr->in_ckpt) printf("  (in checkpoint)");
    putchar('\n');
    return ferror(stdout) ? KD_FAILED : 0;
}

int kd_cmd_wal(kd_ctx *x, int argc, char **argv) {
    kd_opt opts[] = {{"--from", true, NULL}, {"--to", true, NULL}, {"--type", true, NULL},
                     {"--stats", false, NULL}, {NULL, false, NULL}};
    const char *pos[1];
    int np = kd_parse(x, argc, argv, 2, opts, pos, 1, wal_usage);
    if (np == -1) return KD_OK;
    if (np < 0) return KD_USAGE;
    if (np != 1) return kd_fail(x, KD_USAGE, "missing DIR (see kvdump wal --help)");
    x->dir = pos[0];
    walctx w;
    memset(&w, 0, sizeof w);
    w.x = x;
    w.to = UINT64_MAX;
    const char *v;
    if ((v = kd_optval(opts, "--from")) && !kd_parse_u64(v, &w.from))
        return kd_fail(x, KD_USAGE, "--from: '%s' is not an LSN", v);
    if ((v = kd_optval(opts, "--to")) && !kd_parse_u64(v, &w.to))
        return kd_fail(x, KD_USAGE, "--to: '%s' is not an LSN", v);
    if ((v = kd_optval(opts, "--type")) && !parse_types(v, &w.types))
        return kd_fail(x, KD_USAGE, "--type: '%s' is not a list of record types", v);
    w.stats = kd_optval(opts, "--stats") != NULL;
    char why[1024];
    int rc = kd_read_header(x->dir, &x->hdr, why, sizeof why);
    if (rc) return kd_fail(x, KD_USAGE, "%s", why);

    kd_log L;
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "wal");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        if (!w.stats) kj_arr(j, "records", false);
    }
    rc = kd_log_scan(x->dir, &x->hdr, &L, wal_rec, &w, why, sizeof why);
    if (x->json && !w.stats) kj_end_arr(j);
    if (rc) {
        kd_log_free(&L);
        if (rc == KD_FAILED) {
            if (x->json) kj_end_doc(j);
            return kd_fail(x, KD_FAILED, "writing the output failed");
        }
        if (x->json) {
            kj_obj(j, "error", false);
            kj_i64(j, "exit", KD_USAGE);
            kj_str(j, "message", why);
            kj_end_obj(j);
            kj_end_doc(j);
        }
        return kd_fail(x, KD_USAGE, "%s", why);
    }
    uint64_t tot_n = 0, tot_b = 0;
    for (unsigned t = 1; t <= REC_TYPE_MAX; t++) {
        tot_n += w.count[t];
        tot_b += w.bytes[t];
    }
    if (x->json) {
        if (L.have_ckpt || L.ndeltas) {
            kj_obj(j, "checkpoint", false);
            if (L.have_ckpt) kj_u64(j, "lsn", L.ckpt_lsn);
            else kj_null(j, "lsn");
            kj_bool(j, "ok", L.ckpt_ok);
            kj_str(j, "error", L.ckpt_ok ? NULL : L.have_ckpt ? L.ckpt_err : "no full checkpoint");
            kj_u64(j, "deltas", L.nchain);
            kj_u64(j, "chain_lsn", L.chain_lsn);
            kj_bool(j, "chain_ok", L.chain_ok);
            kj_str(j, "chain_error", L.chain_ok ? NULL : L.chain_err);
            kj_end_obj(j);
        } else {
            kj_null(j, "checkpoint");
        }
        kj_arr(j, "segments", false);
        for (size_t i = 0; i < L.nsegs; i++) {
            const kd_seg *s = &L.segs[i];
            kj_obj(j, NULL, true);
            kj_u64(j, "no", s->no);
            kj_u64(j, "file_bytes", s->file_size);
            kj_bool(j, "valid", s->valid);
            kj_bool(j, "foreign", s->foreign);
            kj_str(j, "invalid_why", s->valid ? NULL : s->why);
            if (s->valid || s->foreign) {
                kj_strf(j, "epoch", "%08x", s->epoch);
                kj_u64(j, "first_lsn", s->start);
                kj_u64(j, "size", s->size);
            }
            kj_bool(j, "read", s->read);
            if (s->read) {
                kj_u64(j, "frames", s->frames);
                kj_u64(j, "records", s->records);
                kj_u64(j, "end_offset", s->end_off);
                kj_str(j, "end_reason", kd_end_name(s->end_reason));
                kj_str(j, "end_detail", s->end_detail);
            }
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_obj(j, "stats", false);
        kj_u64(j, "records", tot_n);
        kj_u64(j, "bytes", tot_b);
        kj_u64(j, "frames", L.frames);
        kj_obj(j, "by_type", false);
        for (unsigned t = 1; t <= REC_TYPE_MAX; t++) {
            kj_obj(j, pkv_rec_type_name(t), true);
            kj_u64(j, "count", w.count[t]);
            kj_u64(j, "bytes", w.bytes[t]);
            kj_end_obj(j);
        }
        kj_end_obj(j);
        kj_end_obj(j);
        kj_obj(j, "end", false);
        kj_u64(j, "last_lsn", L.last_lsn);
        if (L.end_reason != KD_END_NONE) {
            kj_u64(j, "segment", L.end_seg);
            kj_u64(j, "offset", L.end_off);
        } else {
            kj_null(j, "segment");
            kj_null(j, "offset");
        }
        kj_str(j, "reason", kd_end_name(L.end_reason));
        kj_str(j, "detail", L.end_reason == KD_END_NONE ? "no log segment to read" : L.end_detail);
        kj_u64(j, "torn_bytes", L.torn_bytes);
        if (L.corrupt_lsn) kj_u64(j, "corrupt_lsn", L.corrupt_lsn);
        else kj_null(j, "corrupt_lsn");
        kj_end_obj(j);
        kj_end_doc(j);
    } else {
        size_t nread = 0;
        for (size_t i = 0; i < L.nsegs; i++) nread += L.segs[i].read;
        if (w.stats) {
            printf("%-10s %10s %12s %8s\n", "type", "records", "bytes", "avg");
            for (unsigned t = 1; t <= REC_TYPE_MAX; t++)
                printf("%-10s %10llu %12llu %8.1f\n", pkv_rec_type_name(t),
                       (unsigned long long)w.count[t], (unsigned long long)w.bytes[t],
                       w.count[t] ? (double)w.bytes[t] / (double)w.count[t] : 0.0);
            printf("%-10s %10llu %12llu %8.1f\n", "total", (unsigned long long)tot_n,
                   (unsigned long long)tot_b, tot_n ? (double)tot_b / (double)tot_n : 0.0);
            printf("frames %llu (%.1f records per frame), segments %zu read of %zu\n",
                   (unsigned long long)L.frames,
                   L.frames ? (double)L.records / (double)L.frames : 0.0,
                   nread, L.nsegs);
        }
        if (L.have_ckpt && !L.ckpt_ok) printf("checkpoint: %s\n", L.ckpt_err);
        if (!L.chain_ok) printf("checkpoint chain: %s\n", L.chain_err);
        if (L.nchain)
            printf("checkpoint chain: full checkpoint LSN %llu + %zu delta%s, the log is read "
                   "after LSN %llu\n", (unsigned long long)L.ckpt_lsn, L.nchain,
                   L.nchain == 1 ? "" : "s", (unsigned long long)L.chain_lsn);
        if (L.end_reason == KD_END_NONE)
            printf("end of log: no log segment to read; last LSN %llu%s\n",
                   (unsigned long long)L.last_lsn,
                   !L.have_ckpt ? "" : L.nchain ? " (from the checkpoint chain)"
                                                : " (from the checkpoint)");
        else
            printf("end of log: last valid LSN %llu (segment %llu, offset 0x%llx): %s\n",
                   (unsigned long long)L.last_lsn, (unsigned long long)L.end_seg,
                   (unsigned long long)L.end_off, L.end_detail);
    }
    kd_log_free(&L);
    fflush(stdout);
    if (ferror(stdout)) return kd_fail(x, KD_FAILED, "writing the output failed");
    return KD_OK;
}

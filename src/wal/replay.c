/*
 * wal/replay.c — recovery on open: newest checkpoint, then the log after it,
 * then a rebuild of everything derived (refcounts, states, lists, prefix index,
 * child counts), then verification of the blocks that recovered sequences hold.
 *
 * Log reading rules (docs/format.md):
 *  - Segments are read in number order, from the one holding checkpoint LSN + 1.
 *    A segment's header must be valid and name the same arena (secret).
 *  - Frames must have the segment's epoch, a valid checksum, and LSNs continuing
 *    exactly where the previous frame ended; each record's checksum, length and
 *    LSN are checked too.
 *  - At the first invalid frame the log ends. If nothing valid follows (in that
 *    segment, or in a later segment not starting exactly at the expected LSN) it
 *    was a torn tail and is cut off. If valid frames with later LSNs follow, the
 *    log is corrupt: open fails naming the LSN, unless PKV_OPEN_POINT_IN_TIME asks
 *    to recover up to it.
 *
 * Replay works on the raw state: block states SEALED/FREE from SEAL/EVICT records
 * and sequence tables (committed part only) from the others. Everything else is
 * derived afterwards by rebuild(), which also checks that the result is
 * consistent (a chain of sealed blocks under every committed full block, etc.).
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- Applying records --------------------------------------------------- */

static int table_len(pkv_seq *s, uint64_t n) {
    if (n > s->cap) {
        uint64_t cap = s->cap ? s->cap : 4;
        while (cap < n) cap *= 2;
        if (cap > UINT32_MAX) return pkv_err(PKV_ECORRUPT, "block table too long");
        uint32_t *nb = realloc(s->blocks, cap * sizeof *nb);
        if (!nb) return pkv_err(PKV_ENOMEM, "block table");
        s->blocks = nb;
        s->cap = (uint32_t)cap;
    }
    return 0;
}

static void dropped(pkv_cache *c, uint32_t b, uint64_t lsn) {
    if (b < c->pool.capacity) c->pool.b[b].rel_lsn = lsn;
}

static int bad_rec(const pkv_rec *r, const char *why) {
    return pkv_err(PKV_ECORRUPT, "%s record at LSN %llu: %s", pkv_rec_type_name(r->type),
                   (unsigned long long)r->lsn, why);
}

static int set_tokens(pkv_cache *c, uint32_t b, uint32_t off, const uint8_t *t, uint32_t n) {
    uint32_t *dst = pkv_pool_tokens(&c->pool, b);
    for (uint32_t i = 0; i < n; i++) dst[off + i] = pkv_get_u32(t + 4ull * i);
    return 0;
}

static int check_blocks(pkv_cache *c, const pkv_rec *r) {
    for (uint32_t i = 0; i < r->nblocks; i++)
        if (pkv_get_u32(r->blocks + 4ull * i) >= c->pool.capacity)
            return bad_rec(r, "block index out of range");
    return 0;
}

int pkv_replay_apply(pkv_cache *c, const pkv_rec *r) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    pkv_seq *s = NULL;
    int rc;
    if (r->type != REC_SEAL && r->type != REC_EVICT && r->type != REC_BAD)
        s = pkv_seqmap_get(&c->seqs, r->seq);
    /* A committed length whose ceil(committed / B) overflows would index a block
     * table at -1 (a damaged or forged record that still passed its checksum). */
    if ((r->type == REC_SEQ_SET || r->type == REC_COMMIT || r->type == REC_TRUNC) &&
        r->committed > (uint64_t)UINT32_MAX * bs)
        return bad_rec(r, "committed length out of range");
    switch (r->type) {
    case REC_SEAL: {
        if (r->block >= p->capacity || (r->parent != PKV_NONE && r->parent >= p->capacity) ||
            r->parent == r->block)
            return bad_rec(r, "block or parent out of range");
        pkv_block *x = &p->b[r->block];
        x->state = BLK_SEALED;
        x->parent = r->parent;
        x->salt = r->salt;
        x->hash.lo = r->hash_lo;
        x->hash.hi = r->hash_hi;
        x->payload_sum = r->payload_sum;
        x->rel_lsn = r->lsn;
        x->flags = 0;
        return set_tokens(c, r->block, 0, r->tokens, bs);
    }
    case REC_EVICT:
        if (r->block >= p->capacity) return bad_rec(r, "block out of range");
        p->b[r->block].state = BLK_FREE;
        return 0;
    case REC_BAD:
        if (r->block >= p->capacity) return bad_rec(r, "block out of range");
        if (p->b[r->block].state == BLK_SEALED) p->b[r->block].flags |= BLKF_BAD;
        return 0;
    case REC_SEQ_SET: {
        if (r->nblocks != (r->committed + bs - 1) / bs || r->ntok != r->committed % bs)
            return bad_rec(r, "table length does not match committed tokens");
        if ((rc = check_blocks(c, r))) return rc;
        if (!s) {
            if ((rc = pkv_seqmap_reserve(&c->seqs))) return rc;
            if (!(s = calloc(1, sizeof *s))) return pkv_err(PKV_ENOMEM, "sequence");
            s->id = r->seq;
            pkv_seqmap_insert(&c->seqs, s);
        }
        for (uint32_t i = 0; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        if ((rc = table_len(s, r->nblocks))) return rc;
        for (uint32_t i = 0; i < r->nblocks; i++) s->blocks[i] = pkv_get_u32(r->blocks + 4ull * i);
        s->nblocks = r->nblocks;
        s->salt = r->salt;
        s->len = s->committed = r->committed;
        if (r->ntok) set_tokens(c, s->blocks[s->nblocks - 1], 0, r->tokens, r->ntok);
        return 0;
    }
    case REC_COMMIT: {
        if (!s) return bad_rec(r, "unknown sequence");
        uint64_t n = (r->committed + bs - 1) / bs;
        uint32_t tail = (uint32_t)(r->committed % bs);
        if (r->first > s->nblocks || (uint64_t)r->first + r->nblocks != n ||
            (tail ? r->tail_off + r->ntok != tail : r->ntok != 0) || r->tail_off > bs)
            return bad_rec(r, "inconsistent table range");
        if ((rc = check_blocks(c, r))) return rc;
        if ((rc = table_len(s, n))) return rc;
        for (uint32_t k = 0; k < r->nblocks; k++) {
            uint32_t i = r->first + k, b = pkv_get_u32(r->blocks + 4ull * k);
            if (i < s->nblocks && s->blocks[i] != b) dropped(c, s->blocks[i], r->lsn);
            s->blocks[i] = b;
        }
        for (uint64_t i = n; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        s->nblocks = (uint32_t)n;
        s->len = s->committed = r->committed;
        if (r->ntok) set_tokens(c, s->blocks[n - 1], r->tail_off, r->tokens, r->ntok);
        return 0;
    }
    case REC_SEQ_BLOCK:
        if (!s) return bad_rec(r, "unknown sequence");
        if (r->index >= s->nblocks || r->block >= p->capacity || r->ntok > bs)
            return bad_rec(r, "index or block out of range");
        if (s->blocks[r->index] != r->block) dropped(c, s->blocks[r->index], r->lsn);
        s->blocks[r->index] = r->block;
        return set_tokens(c, r->block, 0, r->tokens, r->ntok);
    case REC_TRUNC: {
        if (!s) return bad_rec(r, "unknown sequence");
        uint64_t n = (r->committed + bs - 1) / bs;
        if (n > s->nblocks || r->ntok != (r->block == PKV_NONE ? 0 : r->committed % bs) ||
            (r->block != PKV_NONE && (r->block >= p->capacity || n == 0)))
            return bad_rec(r, "inconsistent truncation");
        for (uint64_t i = n; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        s->nblocks = (uint32_t)n;
        s->len = s->committed = r->committed;
        if (r->block != PKV_NONE) {
            if (s->blocks[n - 1] != r->block) dropped(c, s->blocks[n - 1], r->lsn);
            s->blocks[n - 1] = r->block;
            set_tokens(c, r->block, 0, r->tokens, r->ntok);
        }
        return 0;
    }
    case REC_SEQ_CLOSE:
        if (!s) return 0; /* idempotent */
        for (uint32_t i = 0; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        pkv_seqmap_remove(&c->seqs, r->seq);
        free(s->blocks);
        free(s);
        return 0;
    default:
        return bad_rec(r, "unknown type");
    }
}

/* ---- Reading the log ---------------------------------------------------- */

typedef struct segfile {
    uint64_t no;
} segfile;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A segment being read. Frames are read through a window of the file (a buffer
 * reused from segment to segment), so recovery reads each byte once into memory
 * that is already faulted in, instead of allocating and filling a buffer the size
 * of the whole preallocated segment. */
#define WINDOW (4u << 20)

typedef struct rdbuf {
    uint8_t *p;
    size_t cap;
} rdbuf;

typedef struct seg {
    uint64_t no, start, size;
    uint32_t epoch;
    bool valid;
    const pkv_io_ops *io;
    int fd;
    char path[4200];
    uint64_t len;      /* bytes the file holds, at most size */
    rdbuf *rb;         /* the window: file bytes [base, base + wlen) */
    uint64_t base;
    size_t wlen;
    int err;           /* a read failed (message set): recovery fails */
} seg;

static void seg_close(seg *s) {
    if (s->fd >= 0) s->io->close(s->io->ctx, s->fd);
    s->fd = -1;
}

/* Bytes [off, off + n) of the segment, or NULL if the file ends before (or a read
 * failed: s->err). The pointer is valid until the next call. */
static const uint8_t *seg_at(seg *s, uint64_t off, size_t n) {
    if (off > s->len || n > s->len - off) return NULL;
    if (off >= s->base && off + n <= s->base + s->wlen) return s->rb->p + (off - s->base);
    if (s->err) return NULL;
    size_t want = n > WINDOW ? n : WINDOW;
    if (want > s->len - off) want = (size_t)(s->len - off);
    if (s->rb->cap < want) {
        size_t cap = want > WINDOW ? want : WINDOW;
        uint8_t *np = realloc(s->rb->p, cap);
        if (!np) {
            s->err = pkv_err(PKV_ENOMEM, "reading %s", s->path);
            return NULL;
        }
        s->rb->p = np;
        s->rb->cap = cap;
    }
    s->wlen = 0;
    long r = s->io->pread(s->io->ctx, s->fd, s->rb->p, want, off);
    if (r < 0) {
        s->err = pkv_err(PKV_EIO, "read %s: %s", s->path, strerror((int)-r));
        return NULL;
    }
    s->base = off;
    s->wlen = (size_t)r;
    if ((size_t)r < want) s->len = off + (uint64_t)r; /* shorter than it said */
    return n <= s->wlen ? s->rb->p : NULL;
}

/* Open segment `no` and read its header; unless header_only, keep it open for
 * reading and find how many bytes the file holds (up to its allocated size). */
static int seg_open(pkv_cache *c, const char *dir, uint64_t no, seg *s, rdbuf *rb,
                    bool header_only) {
    const pkv_io_ops *io = c->wal.io;
    memset(s, 0, sizeof *s);
    s->no = no;
    s->io = io;
    s->rb = rb;
    s->fd = -1;
    snprintf(s->path, sizeof s->path, "%s/wal-%016llx", dir, (unsigned long long)no);
    int fd = io->open(io->ctx, s->path, O_RDONLY, 0);
    if (fd < 0) return pkv_err(PKV_EIO, "open %s: %s", s->path, strerror(-fd));
    s->fd = fd;
    uint8_t h[SEG_HDR];
    long r = io->pread(io->ctx, fd, h, SEG_HDR, 0);
    if (r < 0) {
        seg_close(s);
        return pkv_err(PKV_EIO, "read %s: %s", s->path, strerror((int)-r));
    }
    if (r == (long)SEG_HDR && !memcmp(h, SEG_MAGIC, 8) &&
        pkv_sum_ok(pkv_get_u64(h + 56), XXH3_64bits(h, 56)) && pkv_get_u32(h + 8) == WAL_VERSION &&
        pkv_get_u64(h + 16) == no && pkv_get_u64(h + 40) <= (16ull << 30)) {
        s->epoch = pkv_get_u32(h + 12);
        s->start = pkv_get_u64(h + 24);
        s->size = pkv_get_u64(h + 40);
        s->valid = true;
        if (pkv_get_u64(h + 32) != c->arena.secret) {
            s->valid = false;
            c->arena.foreign_log = true;
        }
    }
    if (!s->valid || header_only) {
        seg_close(s);
        return 0;
    }
    /* Usually the file holds all `size` bytes; if not, read to its end. */
    s->len = s->size;
    s->base = s->size; /* empty window */
    uint8_t last;
    r = s->size ? io->pread(io->ctx, fd, &last, 1, s->size - 1) : 1;
    if (r < 0) {
        seg_close(s);
        return pkv_err(PKV_EIO, "read %s: %s", s->path, strerror((int)-r));
    }
    if (r != 1) {
        uint64_t off = 0;
        while (off < s->len && seg_at(s, off, 1)) off = s->base + s->wlen;
        if (s->err) {
            seg_close(s);
            return s->err;
        }
    }
    return 0;
}

/* Is there a valid frame at `off` (checksum included)? Sets its LSN range. A frame
 * is applied whole or not at all, so recovery ends between calls (rule D5). On true
 * the whole frame is in the window (seg_at(s, off, FRAME_HDR + bytes) is cheap). */
static bool frame_ok(seg *s, uint64_t off, uint64_t *first, uint32_t *nrec,
                     uint32_t *bytes) {
    const uint8_t *f = seg_at(s, off, FRAME_HDR);
    if (!f || pkv_get_u32(f) != FRAME_MAGIC || pkv_get_u32(f + 4) != s->epoch) return false;
    uint32_t nb = pkv_get_u32(f + 20);
    if (nb > s->len - off - FRAME_HDR || (nb & 7)) return false;
    if (!(f = seg_at(s, off, FRAME_HDR + (size_t)nb))) return false;
    XXH3_state_t st;
    memset(&st, 0, sizeof st); /* reset_withSeed reads st.seed (xxHash 0.8.1) */
    XXH3_64bits_reset_withSeed(&st, s->epoch);
    XXH3_64bits_update(&st, f, 24);
    XXH3_64bits_update(&st, f + FRAME_HDR, nb);
    if (!pkv_sum_ok(pkv_get_u64(f + 24), XXH3_64bits_digest(&st))) return false;
    *first = pkv_get_u64(f + 8);
    *nrec = pkv_get_u32(f + 16);
    *bytes = nb;
    return *nrec > 0;
}

/* Apply the records of a valid frame (just checked by frame_ok) with LSN > after. */
static int frame_apply(pkv_cache *c, seg *s, uint64_t off, uint64_t first,
                       uint32_t nrec, uint32_t bytes, uint64_t after, uint64_t *applied) {
    const uint8_t *f = seg_at(s, off, FRAME_HDR + (size_t)bytes);
    if (!f) return s->err ? s->err : pkv_err(PKV_EIO, "frame vanished in %s", s->path);
    const uint8_t *p = f + FRAME_HDR, *end = p + bytes;
    for (uint32_t i = 0; i < nrec; i++) {
        if (end - p < (long)(REC_HDR + REC_TRAILER))
            return pkv_err(PKV_ECORRUPT, "frame at LSN %llu truncated",
                           (unsigned long long)first);
        uint32_t rl = pkv_get_u32(p);
        uint64_t lsn = pkv_get_u64(p + 8);
        if (rl < REC_HDR + REC_TRAILER || (rl & 7) || rl > end - p || lsn != first + i ||
            !pkv_sum_ok(pkv_get_u64(p + rl - REC_TRAILER),
                        XXH3_64bits_withSeed(p, rl - REC_TRAILER, s->epoch)))
            return pkv_err(PKV_ECORRUPT, "record at LSN %llu invalid inside a valid frame",
                           (unsigned long long)(first + i));
        if (lsn > after) {
            pkv_rec r;
            int rc = pkv_rec_decode(p, rl - REC_HDR - REC_TRAILER, c->pool.block_size, &r);
            if (!rc) rc = pkv_replay_apply(c, &r);
            if (rc) return rc;
            (*applied)++;
        }
        p += rl;
    }
    return p == end ? 0 : pkv_err(PKV_ECORRUPT, "frame at LSN %llu has trailing bytes",
                                  (unsigned long long)first);
}

/* Scan the 8-byte aligned offsets after `from` for a valid frame: with holding
 * false, one with an LSN >= lsn; with holding true, one whose LSNs include lsn.
 * *first and *at: the frame's first LSN and its offset.
 *
 * Every candidate (magic and epoch at an aligned offset, a length that fits)
 * costs a checksum over its claimed length, and candidates can overlap: a
 * segment of repeated [magic][epoch] words makes every offset one, O(len²) in
 * all (a forged 32 MiB segment: half an hour). A writer's frames of one epoch
 * never overlap, so a real log checksums each byte at most about twice (a torn
 * frame, then the frames after it). The scan therefore stops with
 * PKV_SCAN_TOO_MUCH once its checksums would pass PKV_SCAN_BUDGET(bytes after
 * from): it cannot tell whether a valid frame follows, and the callers treat
 * that like one that does (recovery refuses, or stops point-in-time). */
static pkv_scan_res scan_frames(seg *s, uint64_t from, uint64_t lsn, bool holding,
                                uint64_t *first, uint64_t *at) {
    uint64_t o = (from + 8) & ~(uint64_t)7;
    uint64_t budget = PKV_SCAN_BUDGET(s->len > from ? s->len - from : 0);
    while (o + FRAME_HDR <= s->len) {
        size_t n = s->len - o < WINDOW ? (size_t)(s->len - o) : WINDOW;
        const uint8_t *w = seg_at(s, o, n);
        if (!w) return PKV_SCAN_NONE;
        /* Candidates start with the magic's first byte at an 8-aligned offset;
         * memchr skips zeros and other bytes fast. */
        size_t k = 0;
        while (k + FRAME_HDR <= n) {
            const uint8_t *m = memchr(w + k, FRAME_MAGIC & 0xff, n - FRAME_HDR + 1 - k);
            if (!m) {
                k = ((n - FRAME_HDR) | 7) + 1; /* past the last candidate */
                break;
            }
            k = (size_t)(m - w);
            if ((k & 7) == 0 && pkv_get_u32(w + k) == FRAME_MAGIC) break;
            k = (k | 7) + 1;
        }
        o += k;
        if (k + FRAME_HDR > n) continue; /* nothing in this window */
        if (pkv_get_u32(w + k + 4) == s->epoch) {
            uint64_t nb = pkv_get_u32(w + k + 20);
            if (nb <= s->len - o - FRAME_HDR && !(nb & 7)) { /* frame_ok will hash it */
                if (24 + nb > budget) return PKV_SCAN_TOO_MUCH;
                budget -= 24 + nb;
            }
        }
        uint64_t f;
        uint32_t nr, b;
        if (frame_ok(s, o, &f, &nr, &b) &&
            (holding ? f <= lsn && lsn <= f + nr - 1 : f + nr - 1 >= lsn)) {
            *first = f;
            *at = o;
            return PKV_SCAN_FOUND;
        }
        o += 8;
    }
    return PKV_SCAN_NONE;
}

/* Look for a valid frame with LSN >= want anywhere after `from` in s. */
static pkv_scan_res later_valid(seg *s, uint64_t from, uint64_t want, uint64_t *lsn,
                                uint64_t *at) {
    return scan_frames(s, from, want, false, lsn, at);
}

/* Find a valid frame after `from` whose LSNs include `lsn`. */
static bool frame_holding(seg *s, uint64_t from, uint64_t lsn, uint64_t *at) {
    uint64_t first;
    return scan_frames(s, from, lsn, true, &first, at) == PKV_SCAN_FOUND;
}

/* Are all bytes from `off` (8-aligned) to the end zero? A last partial word counts
 * as zero. */
static bool zero_from(seg *s, uint64_t off) {
    uint64_t o = off;
    while (o + 8 <= s->len) {
        size_t n = s->len - o < WINDOW ? (size_t)(s->len - o) : WINDOW;
        const uint8_t *w = seg_at(s, o, n);
        if (!w) return false;
        size_t k = 0;
        uint64_t acc = 0;
        for (; k + 64 <= n && !acc; k += 64) {
            uint64_t x[8];
            memcpy(x, w + k, 64);
            acc = x[0] | x[1] | x[2] | x[3] | x[4] | x[5] | x[6] | x[7];
        }
        if (acc) return false;
        for (; k + 8 <= n; k += 8)
            if (pkv_get_u64(w + k)) return false;
        o += k;
    }
    return true;
}

static int push_u64(uint64_t **v, size_t *n, size_t *cap, uint64_t x) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        uint64_t *nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return pkv_err(PKV_ENOMEM, "directory listing");
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return 0;
}

/* List the log directory: segment numbers (sorted), the newest checkpoint, the
 * delta checkpoints (sorted), and the spare segments: *spares has bit k set for
 * each wal-spare-<k> (bit 63 for any k >= 63), *nspare is the length of the run
 * 0, 1, ... that seg_create recycles from the top. */
static int list_dir(const char *dir, uint64_t **segs, size_t *nsegs, uint64_t *ckpt,
                    bool *have_ckpt, uint64_t **deltas, size_t *ndeltas,
                    uint64_t *nspare, uint64_t *spares) {
    DIR *d = opendir(dir);
    if (!d) return pkv_err(PKV_EIO, "open directory %s: %s", dir, strerror(errno));
    size_t cap = 0, dcap = 0;
    *segs = NULL;
    *nsegs = 0;
    *deltas = NULL;
    *ndeltas = 0;
    *have_ckpt = false;
    *nspare = 0;
    *spares = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        uint64_t n;
        if (pkv_wal_name_no(e->d_name, "wal-", &n)) {
            /* A correct writer numbers segments up from 1 and never gets near
             * 2^63. A larger number (a forged or stray file) would make the next
             * segment's number wrap to 0 and sort before the log it continues,
             * losing it at the next open (found by fuzz/fuzz_recover.c). */
            if (n >= 1ull << 63) {
                rc = pkv_err(PKV_ECORRUPT, "%s/%s: segment number out of range", dir,
                             e->d_name);
                break;
            }
            if ((rc = push_u64(segs, nsegs, &cap, n))) break;
        } else if (pkv_wal_name_no(e->d_name, "ckpt-", &n)) {
            if (!*have_ckpt || n > *ckpt) *ckpt = n;
            *have_ckpt = true;
        } else if (pkv_wal_name_no(e->d_name, "delta-", &n)) {
            if ((rc = push_u64(deltas, ndeltas, &dcap, n))) break;
        } else if (pkv_wal_name_no(e->d_name, "wal-spare-", &n)) {
            /* a writer makes only 0 and 1; bit 63 also stands for every larger
             * number, all strays (the run cannot reach 63) */
            *spares |= 1ull << (n < 63 ? n : 63);
        }
    }
    closedir(d);
    *nspare = pkv_wal_spare_run(*spares);
    if (!rc && *nsegs) qsort(*segs, *nsegs, sizeof **segs, cmp_u64);
    if (!rc && *ndeltas) qsort(*deltas, *ndeltas, sizeof **deltas, cmp_u64);
    return rc;
}

/* Read one segment (open, valid, not after a gap) from *expect on. *stop: the log
 * ends for good here (point-in-time recovery before a corruption). */
static int replay_seg(pkv_cache *c, seg *s, uint64_t *expect_io, uint32_t flags,
                      bool *stop) {
    pkv_recovery *rec = &c->rec;
    uint64_t expect = *expect_io;
    uint64_t off = SEG_HDR;
    bool reached = s->start >= expect;
    int rc;
again:
    for (;;) {
        uint64_t first;
        uint32_t nrec, bytes;
        if (!frame_ok(s, off, &first, &nrec, &bytes)) {
            /* Damage in frames the checkpoint already covers is harmless: skip
             * to the valid frame holding the first LSN still needed. */
            uint64_t o2;
            if (!reached && frame_holding(s, off, expect, &o2)) {
                off = o2;
                continue;
            }
            break;
        }
        if (first + nrec - 1 < expect) { /* wholly before: already in checkpoint */
            off += FRAME_HDR + bytes;
            continue;
        }
        if (first > expect) break; /* not a continuation: treat as invalid */
        reached = true;
        rc = frame_apply(c, s, off, first, nrec, bytes, expect - 1, &rec->records_replayed);
        if (rc) return rc;
        expect = first + nrec;
        off += FRAME_HDR + bytes;
        c->wal.bytes_since_ckpt += FRAME_HDR + bytes;
    }
    *expect_io = expect;
    if (s->err) return s->err;
    /* The log ends at `off` in this segment, unless the next segment continues. */
    uint64_t f, at;
    const uint8_t *h;
    pkv_scan_res later = off + FRAME_HDR <= s->len ? later_valid(s, off, expect, &f, &at)
                                                   : PKV_SCAN_NONE;
    const bool torn_hdr = (later == PKV_SCAN_NONE || c->rdonly) && !s->err &&
                          (reached || s->start >= expect) &&
                          (h = seg_at(s, off, FRAME_HDR)) && pkv_get_u32(h) == FRAME_MAGIC &&
                          pkv_get_u32(h + 4) == s->epoch;
    /* A read-only open may run beside a live writer, whose next frame can land
     * at `off` between the reads above: the frame test read a window from
     * before it, later_valid or the header test one from after (or caught it
     * half copied). Frames are written in order and never change once complete,
     * so read the frame at `off` afresh before calling the log damaged or torn
     * there; if it continues the log now, read on. */
    if (c->rdonly && !s->err && (later != PKV_SCAN_NONE || torn_hdr)) {
        uint64_t first;
        uint32_t nrec, bytes;
        s->wlen = 0; /* the window is stale: read it again */
        if (frame_ok(s, off, &first, &nrec, &bytes) && first <= expect &&
            first + nrec - 1 >= expect)
            goto again;
    }
    if (later != PKV_SCAN_NONE) {
        rec->corrupt_lsn = expect;
        if (!(flags & PKV_OPEN_POINT_IN_TIME) && later == PKV_SCAN_FOUND)
            return pkv_err(PKV_ECORRUPT, "log corrupted at LSN %llu (segment %llu "
                           "offset %llu) and followed by valid records from LSN %llu; "
                           "open with PKV_OPEN_POINT_IN_TIME to recover up to LSN %llu",
                           (unsigned long long)expect, (unsigned long long)s->no,
                           (unsigned long long)off, (unsigned long long)f,
                           (unsigned long long)(expect - 1));
        if (!(flags & PKV_OPEN_POINT_IN_TIME))
            return pkv_err(PKV_ECORRUPT, "log ends before LSN %llu (segment %llu offset %llu) "
                           "before more overlapping frame candidates than recovery checks "
                           "(a forged or damaged segment); whether valid records follow is "
                           "unknown: open with PKV_OPEN_POINT_IN_TIME to recover up to LSN %llu",
                           (unsigned long long)expect, (unsigned long long)s->no,
                           (unsigned long long)off, (unsigned long long)(expect - 1));
        *stop = true;
    } else if (torn_hdr && (h = seg_at(s, off, FRAME_HDR))) {
        uint32_t nb = pkv_get_u32(h + 20);
        rec->torn_bytes += FRAME_HDR + (nb < s->len - off ? nb : s->len - off);
    }
    if (s->err) return s->err;
    /* Resume writing here only if nothing at all follows the end. */
    bool clean = !rec->torn_bytes && !*stop && zero_from(s, off);
    if (s->err) return s->err;
    c->wal.tail_ok = clean && s->len == s->size;
    c->wal.tail_no = s->no;
    c->wal.tail_off = off;
    c->wal.tail_size = s->size;
    c->wal.tail_epoch = s->epoch;
    return 0;
}

/* Read the log after `after`; sets *last to the last LSN applied or skipped. */
static int replay_log(pkv_cache *c, const char *dir, const uint64_t *nos, size_t n,
                      uint64_t after, uint32_t flags, uint64_t *last) {
    pkv_recovery *rec = &c->rec;
    uint64_t expect = after + 1;
    size_t i0 = 0;
    rdbuf rb = {NULL, 0};
    int rc = 0;
    /* Start at the last segment whose start LSN is <= after + 1. */
    seg s;
    for (size_t i = 0; i < n; i++) {
        if ((rc = seg_open(c, dir, nos[i], &s, &rb, true))) return rc;
        if (s.valid && s.start <= expect) i0 = i;
        if (s.valid && (rc = pkv_wal_seg_push(&c->wal, s.no, s.start))) return rc;
    }
    for (size_t i = i0; i < n; i++) {
        if ((rc = seg_open(c, dir, nos[i], &s, &rb, false))) break;
        if (!s.valid) {
            seg_close(&s);
            continue; /* a segment whose header never became durable: nothing in it */
        }
        if (s.start > expect) { /* a gap: records between are missing */
            uint64_t f, at; /* too many candidates to check counts as a valid frame */
            bool any = later_valid(&s, SEG_HDR - 8, 0, &f, &at) != PKV_SCAN_NONE;
            seg_close(&s);
            if (s.err) {
                rc = s.err;
                break;
            }
            if (!any) continue;
            rec->corrupt_lsn = expect;
            if (flags & PKV_OPEN_POINT_IN_TIME) break;
            rc = pkv_err(PKV_ECORRUPT, "log records from LSN %llu are missing (segment "
                         "%llu starts at %llu); open with PKV_OPEN_POINT_IN_TIME to "
                         "recover up to LSN %llu", (unsigned long long)expect,
                         (unsigned long long)s.no, (unsigned long long)s.start,
                         (unsigned long long)(expect - 1));
            break;
        }
        bool stop = false;
        rc = replay_seg(c, &s, &expect, flags, &stop);
        seg_close(&s);
        if (rc || stop) break;
    }
    free(rb.p);
    if (rc) return rc;
    *last = expect - 1;
    return 0;
}

/* ---- Rebuilding derived state ------------------------------------------- */

static void drop_block(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->state == BLK_SEALED) c->rec.blocks_dropped++;
    x->state = BLK_FREE;
}

/* Truncate a sequence's table before entry i (its K/V must be recomputed);
 * `why` says what was wrong with the block there. The first cut is kept for the
 * recovery note, which otherwise would not say which sequence lost what. */
static void seq_cut(pkv_cache *c, pkv_seq *s, uint32_t i, const char *why) {
    if (c->rec.sequences_cut++ == 0) {
        c->first_cut.seq = s->id;
        c->first_cut.index = i;
        c->first_cut.block = s->blocks[i];
        c->first_cut.why = why;
    }
    s->nblocks = i;
    s->len = s->committed = (uint64_t)i * c->pool.block_size;
}

/* Drop every sealed block whose chain is broken (parent not sealed, another
 * salt, a cycle); d and stack are scratch for pkv_pool_depths(). */
static void drop_broken_chains(pkv_cache *c, uint32_t *d, uint32_t *stack) {
    pkv_pool *p = &c->pool;
    pkv_pool_depths(p, d, stack);
    for (uint32_t b = 0; b < p->capacity; b++)
        if (p->b[b].state == BLK_SEALED && d[b] == UINT32_MAX) drop_block(c, b);
}

/* Cut each sequence's table at its first entry that is out of place: a block
 * beyond the arena file, a full block that is not sealed in this chain and
 * salt, a pending one that is sealed, or a block the table already names. For
 * the last test each block holds the ordinal of the table that named it last
 * (stamp: capacity entries of scratch), one look-up per entry: a scan of the
 * table so far made recovery quadratic in a sequence's length. With cut_tails,
 * also at an open tail that holds committed tokens (rule D8). */
static void cut_tables(pkv_cache *c, uint64_t valid_blocks, bool cut_tails, uint32_t *stamp) {
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    pkv_assert(valid_blocks <= p->capacity);
    memset(stamp, 0, (size_t)p->capacity * sizeof *stamp);
    uint32_t q = 0;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        if (++q == 0) { /* 2^32 tables: start the stamps again */
            memset(stamp, 0, (size_t)p->capacity * sizeof *stamp);
            q = 1;
        }
        uint64_t full = s->committed / bs;
        for (uint32_t j = 0; j < s->nblocks; j++) {
            uint32_t b = s->blocks[j];
            const char *why = NULL;
            if (b >= valid_blocks) why = "was lost: it lies beyond the arena file's end";
            else if (stamp[b] == q) why = "is named twice by the table";
            else if (j < full) {
                const pkv_block *x = &p->b[b];
                if (!(x->state == BLK_SEALED && x->salt == s->salt &&
                      x->parent == (j ? s->blocks[j - 1] : PKV_NONE)))
                    why = "was lost: it is not sealed in the sequence's chain";
            } else if (p->b[b].state == BLK_SEALED)
                why = "is sealed, but the table holds it as pending";
            else if (cut_tails && s->committed % bs)
                why = "holds committed tokens of a partial block, which a writer without "
                      "syncs (PKV_DURABLE_NONE) may not have written before the machine "
                      "restarted (rule D8)";
            if (why) {
                seq_cut(c, s, j, why);
                break;
            }
            stamp[b] = q;
        }
    }
}

/* Step 5 of recovery (docs/format.md): decide which sealed blocks and which table
 * entries survive (replay wrote block records and tables as the log said, marking
 * nothing else), then let the pool give every block the state that implies
 * (pkv_pool_rebuild). drop_block() and seq_cut() only mark what does not survive. */
static int rebuild(pkv_cache *c, uint64_t valid_blocks, bool drop_all, bool cut_tails) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size, cap = p->capacity;
    uint32_t *d = malloc((size_t)cap * sizeof *d), *stack = malloc((size_t)(cap + 1) * sizeof *stack);
    if (!d || !stack) {
        free(d);
        free(stack);
        return pkv_err(PKV_ENOMEM, "recovery scratch");
    }
    pkv_hint_huge(d, (size_t)cap * sizeof *d);
    pkv_hint_huge(stack, (size_t)(cap + 1) * sizeof *stack);
    /* Blocks the arena no longer holds, and everything chained below them. */
    for (uint32_t b = 0; b < cap; b++)
        if (drop_all || b >= valid_blocks) drop_block(c, b);
    drop_broken_chains(c, d, stack);
    /* A sealed block's hash is not recomputed by replay, and nothing stops a log
     * or checkpoint that passed its checksums (a forged file, or one written by
     * a buggy version) from holding a hash that does not match the block's chain,
     * or two identical sealed blocks. Either would leave the cache violating I8 /
     * I9 (pkv_check fails, the prefix index names the wrong content), so both are
     * dropped here like a broken chain, with everything chained below them
     * (found by fuzz/fuzz_record.c). */
    {
        bool any = false;
        for (uint32_t b = 0; b < cap; b++) {
            pkv_block *x = &p->b[b];
            if (x->state != BLK_SEALED) continue;
            pkv_h128 ph = x->parent == PKV_NONE ? pkv_hash_root(c->arena.secret, x->salt)
                                                : p->b[x->parent].hash;
            if (!pkv_h128_eq(x->hash, pkv_hash_block(c->arena.secret, ph,
                                                     pkv_pool_tokens(p, b), bs))) {
                d[b] = UINT32_MAX; /* drop after the pass: children compare to it */
                any = true;
            }
        }
        for (uint32_t b = 0; any && b < cap; b++)
            if (p->b[b].state == BLK_SEALED && d[b] == UINT32_MAX) drop_block(c, b);
        if (any) drop_broken_chains(c, d, stack);
        pkv_index dup;
        if (pkv_index_init(&dup, cap)) {
            free(d);
            free(stack);
            return pkv_err(PKV_ENOMEM, "recovery scratch");
        }
        /* At most one copy of each content, and one BAD copy beside it (a block
         * found bad and then recomputed): k identical BAD blocks kept would share
         * one index run, and so would their children (O(k²) to build and check). */
        any = false;
        for (uint32_t b = 0; b < cap; b++) {
            pkv_block *x = &p->b[b];
            if (x->state != BLK_SEALED) continue;
            if (pkv_index_find_twin(&dup, p, b) != PKV_NONE) {
                drop_block(c, b);
                any = true;
            } else {
                pkv_index_insert(&dup, x->hash.lo, b);
            }
        }
        pkv_index_free(&dup);
        if (any) drop_broken_chains(c, d, stack);
    }
    if (!drop_all) {
        cut_tables(c, valid_blocks, cut_tails, d);
    } else {
        c->rec.sequences_dropped = c->seqs.count;
        pkv_seqmap_free(&c->seqs);
        int rc = pkv_seqmap_init(&c->seqs);
        if (rc) {
            free(d);
            free(stack);
            return rc;
        }
    }
    /* Refcounts, states, lists and the index (blockpool.c). */
    int rc = pkv_pool_rebuild(c, d, stack);
    free(d);
    free(stack);
    return rc;
}

/* Verify the payload of every sealed block a recovered sequence holds, and cut
 * the table at the first that fails (rule S1: a fork or any later use of the
 * table then holds only verified blocks, I11). */
static void verify_seqs(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        for (uint32_t j = 0; j < s->nblocks; j++) {
            uint32_t b = s->blocks[j];
            if (p->b[b].state != BLK_SEALED || pkv_block_verify(c, b) == PKV_VERIFY_OK)
                continue;
            c->rec.seq_blocks_bad++;
            /* Give back the references beyond the cut; they stay cached or free. */
            for (uint32_t k = s->nblocks; k-- > j;) pkv_block_release(c, s->blocks[k]);
            seq_cut(c, s, j, "failed its payload checksum");
            break;
        }
    }
}

/* The chain load_chain() loaded, for continuing it (chain_continue). */
typedef struct chain_info {
    uint64_t base_raw;  /* raw bytes of the full checkpoint */
    uint64_t chain_raw; /* of the deltas applied on it */
    uint64_t last_sum;  /* body checksum of the newest file */
} chain_info;

/* Load the checkpoint chain: the full checkpoint ckpt-<base>, then every
 * delta-<n> with n > base in order, each of which must name the file before it
 * (LSN and body checksum): the log before the newest may be recycled, so a chain
 * with a file missing or replaced cannot be recovered and is an error. Deltas
 * with n <= base belong to an older chain (a crash before their deletion) and are
 * ignored. *after / *reach: the newest file's LSN and reach. */
static int load_chain(pkv_cache *c, const char *dir, uint64_t base, const uint64_t *deltas,
                      size_t ndeltas, uint64_t *after, uint64_t *reach, bool *drop_all,
                      chain_info *ch) {
    pkv_recovery *rec = &c->rec;
    size_t first = 0;
    while (first < ndeltas && deltas[first] <= base) first++;
    uint64_t prev_lsn = 0, prev_sum = 0;
    for (size_t i = first; i <= ndeltas; i++) {
        bool is_base = i == first;
        uint64_t no = is_base ? base : deltas[i - 1];
        const char *pre = is_base ? "ckpt-" : "delta-";
        char path[4200];
        snprintf(path, sizeof path, "%s/%s%016llx", dir, pre, (unsigned long long)no);
        uint8_t *raw = NULL;
        size_t len = 0;
        uint64_t secret = 0, lsn = 0, end = 0, sum = 0;
        int rc = pkv_ckpt_read(c->wal.io, path, is_base ? CKPT_MAGIC : DELTA_MAGIC, &secret,
                               &lsn, &end, &raw, &len, &sum);
        pkv_ckpt_meta m;
        /* A file whose header disagrees with its name was renamed or copied by
         * hand: which checkpoint is newest, and which deltas follow it, are
         * decided by names, so the directory cannot be trusted. */
        if (!rc && lsn != no)
            rc = pkv_err(PKV_ECORRUPT, "%s: covers LSN %llu, not the one its name says",
                         path, (unsigned long long)lsn);
        if (!rc && !is_base && secret != c->arena.secret)
            rc = pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: the delta "
                         "describes another arena than the checkpoints before it", path);
        if (!rc && secret != c->arena.secret) {
            free(raw);
            *after = lsn;
            *reach = end;
            *drop_all = true; /* describes another arena: load nothing from it */
            snprintf(rec->note, sizeof rec->note, "arena was replaced or recreated (the "
                     "checkpoint describes another arena); its blocks and sequences "
                     "were dropped");
            return 0;
        }
        if (!rc) rc = pkv_ckpt_info(raw, len, &m);
        if (!rc && m.delta != !is_base)
            rc = pkv_err(PKV_ECORRUPT, "%s: holds a %s checkpoint", path,
                         m.delta ? "delta" : "full");
        if (!rc && !is_base && m.prev_lsn != prev_lsn)
            rc = pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: it applies on "
                         "the checkpoint of LSN %llu, but the file before it is LSN %llu "
                         "(a file of the chain is missing)", path,
                         (unsigned long long)m.prev_lsn, (unsigned long long)prev_lsn);
        else if (!rc && !is_base && m.prev_sum != prev_sum)
            rc = pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: the file of "
                         "LSN %llu before it is not the one it was written on (replaced)",
                         path, (unsigned long long)prev_lsn);
        if (!rc) rc = pkv_ckpt_load(c, raw, len, i == ndeltas);
        free(raw);
        if (rc) return rc;
        if (!is_base) rec->checkpoint_deltas++;
        if (is_base) ch->base_raw = len;
        else ch->chain_raw += len;
        ch->last_sum = sum;
        prev_lsn = lsn;
        prev_sum = sum;
        *after = lsn;
        *reach = end;
    }
    rec->checkpoint_lsn = *after;
    return 0;
}

/* What the chain just loaded holds for each block (pkv_ckpt_digest), or NULL when
 * this open will not continue the chain (read-only, full checkpoints only, out of
 * memory: the first checkpoint is then full, as it always was). */
static uint64_t *chain_digests(pkv_cache *c) {
    if (c->rdonly || c->wal.full_only) return NULL;
    const pkv_pool *p = &c->pool;
    uint64_t *dig = malloc((size_t)p->capacity * sizeof *dig);
    if (!dig) return NULL;
    for (uint32_t k = 0; k < p->capacity; k++) dig[k] = pkv_ckpt_digest(p, k);
    return dig;
}

/* Let the first checkpoint of this open be a delta on the chain it loaded (on
 * ckpt-<base>). Every
 * block whose recovered state differs from what the chain holds (changed by the
 * log's replay, or by the rebuild) gets its dirty bit, as if the change had been
 * made at run time; the others are clean, which is what a delta assumes. Only
 * after a recovery that repaired nothing: a repair is written as a full
 * checkpoint at open (cache.c). */
static void chain_continue(pkv_cache *c, uint64_t base, const uint64_t *dig,
                           const chain_info *ch) {
    pkv_pool *p = &c->pool;
    /* Bits recovery set on its way (verification of the recovered sequences'
     * blocks) are redone by the comparison, which covers all an entry restores. */
    memset(p->ckdirty, 0, ((size_t)p->capacity + 63) / 64 * sizeof *p->ckdirty);
    for (uint32_t k = 0; k < p->capacity; k++)
        if (pkv_ckpt_digest(p, k) != dig[k]) pkv_ckpt_touch(p, k);
    if (PKV_INTERNAL_CHECKS && p->ckshadow) /* the shadow is the chain's state */
        memcpy(p->ckshadow, dig, (size_t)p->capacity * sizeof *dig);
    pkv_wal *w = &c->wal;
    w->chain_ok = true;
    w->prev_lsn = c->rec.checkpoint_lsn;
    w->prev_sum = ch->last_sum;
    w->chain_len = (uint32_t)c->rec.checkpoint_deltas;
    w->chain_raw = ch->chain_raw;
    w->base_raw = ch->base_raw;
    /* The full checkpoint that would have come next used to delete leftovers of
     * an interrupted clean-up (older ckpt- files, stale deltas); do it now. */
    pkv_ckpt_remove_stale(w, base);
}

int pkv_recover(pkv_cache *c, const char *dir, uint32_t flags, uint64_t *next_lsn,
                uint64_t *next_seg) {
    pkv_recovery *rec = &c->rec;
    uint64_t *nos = NULL, *deltas = NULL, ckpt = 0, nspare = 0, spares = 0;
    size_t n = 0, ndeltas = 0;
    bool have_ckpt = false;
    double t0 = now_ms();
    int rc = list_dir(dir, &nos, &n, &ckpt, &have_ckpt, &deltas, &ndeltas, &nspare, &spares);
    if (rc) {
        free(nos); /* the names listed before the failure */
        free(deltas);
        return rc;
    }
    c->wal.nspare = nspare;
    c->wal.stray_spares = pkv_wal_spare_strays(spares) != 0;
    uint64_t after = 0, reach = 0;
    bool drop_all = false;
    chain_info chain = {0};
    uint64_t *chain_dig = NULL;
    if (have_ckpt) {
        rc = load_chain(c, dir, ckpt, deltas, ndeltas, &after, &reach, &drop_all, &chain);
        if (rc) goto out;
        if (!drop_all) chain_dig = chain_digests(c);
    } else if (ndeltas) {
        rc = pkv_err(PKV_ECORRUPT, "%s: delta checkpoint delta-%016llx but no full "
                     "checkpoint to apply it on", dir, (unsigned long long)deltas[0]);
        goto out;
    }
    double t1 = now_ms();
    rec->ms_checkpoint = t1 - t0;
    uint64_t last = after;
    if ((rc = replay_log(c, dir, nos, n, after, flags, &last))) goto out;
    /* The checkpoint's block section may already show records up to `reach`
     * (they were durable before it was written): a point-in-time stop before
     * them cannot give the state as of that point. */
    if (rec->corrupt_lsn && rec->corrupt_lsn <= reach && !drop_all) {
        rc = pkv_err(PKV_ECORRUPT, "log corrupted at LSN %llu, but checkpoint %llu already "
                     "reflects records up to LSN %llu: cannot recover to a point before "
                     "them", (unsigned long long)rec->corrupt_lsn,
                     (unsigned long long)after, (unsigned long long)reach);
        goto out;
    }
    rec->last_lsn = last;
    double t2 = now_ms();
    rec->ms_replay = t2 - t1;
    if (c->arena.foreign_log && !drop_all) {
        drop_all = true;
        snprintf(rec->note, sizeof rec->note, "arena was replaced or recreated (the log "
                 "describes another arena); its blocks and sequences were dropped");
    }
    if (drop_all && !c->rdonly) {
        /* The old log and checkpoints describe another arena: remove them so they
         * are never read again (the repair checkpoint becomes the new base). */
        char path[4200];
        /* Deltas first, made durable before the full checkpoint goes: deltas
         * without a full checkpoint would fail every later open. */
        for (size_t i = 0; i < ndeltas; i++) {
            snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)deltas[i]);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        if (ndeltas) c->wal.io->sync_dir(c->wal.io->ctx, dir);
        for (size_t i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/wal-%016llx", dir, (unsigned long long)nos[i]);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        if (have_ckpt) {
            snprintf(path, sizeof path, "%s/ckpt-%016llx", dir, (unsigned long long)ckpt);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        c->wal.nsegs = 0;
        c->wal.tail_ok = false;
        c->wal.io->sync_dir(c->wal.io->ctx, dir);
    }
    /* Rule D8: after a writer without syncs and a restart of the machine, open
     * tails may name K/V that never reached the disk. */
    int restarted = pkv_unsynced_restarted(c->wal.io, dir);
    if (restarted < 0) {
        rc = restarted;
        goto out;
    }
    rc = rebuild(c, c->arena.valid_blocks, drop_all, restarted == 1);
    if (rc) goto out;
    /* The adaptive threshold: what a full snapshot of the recovered state takes
     * (as after a checkpoint at run time), not the chain's bytes. */
    if (have_ckpt && !drop_all) c->wal.ckpt_raw = pkv_ckpt_full_estimate(c);
    c->wal.ckpt_lsn = rec->checkpoint_lsn;
    if (!drop_all && c->arena.valid_blocks < c->pool.capacity && rec->note[0] == '\0')
        snprintf(rec->note, sizeof rec->note,
                 "arena file was short: blocks from %llu on were dropped",
                 (unsigned long long)c->arena.valid_blocks);
    double t3 = now_ms();
    rec->ms_rebuild = t3 - t2;
    verify_seqs(c);
    rec->ms_verify = now_ms() - t3;
    rec->blocks_sealed = c->pool.n_sealed;
    rec->sequences = c->seqs.count;
    /* After a replaced or short arena (whose note explains the cuts), before a
     * torn tail or a point-in-time stop: a cut sequence is lost K/V that its
     * owner will miss, which neither of those notes would mention. */
    if (rec->sequences_cut && rec->note[0] == '\0') {
        const uint64_t bs = c->pool.block_size;
        snprintf(rec->note, sizeof rec->note,
                 "cut %llu sequence%s: sequence %llu at entry %u of its block table (block "
                 "%u %s), so its tokens from %llu on must be recomputed",
                 (unsigned long long)rec->sequences_cut, rec->sequences_cut == 1 ? "" : "s",
                 (unsigned long long)c->first_cut.seq, c->first_cut.index,
                 c->first_cut.block, c->first_cut.why,
                 (unsigned long long)c->first_cut.index * bs);
    }
    if (rec->torn_bytes && rec->note[0] == '\0')
        snprintf(rec->note, sizeof rec->note, "cut a torn log tail of %llu bytes after LSN %llu",
                 (unsigned long long)rec->torn_bytes, (unsigned long long)last);
    if (rec->corrupt_lsn && !rec->note[0])
        snprintf(rec->note, sizeof rec->note, "point-in-time recovery stopped before "
                 "corrupted LSN %llu", (unsigned long long)rec->corrupt_lsn);
    /* Anything repaired (dropped, cut, torn, corrupt) becomes durable at once
     * through a checkpoint at open, so the damage is never read again. */
    rec->repaired = drop_all || rec->torn_bytes || rec->corrupt_lsn ||
                    rec->blocks_dropped || rec->sequences_cut ||
                    c->arena.valid_blocks < c->pool.capacity;
    if (chain_dig && !drop_all && !rec->repaired) chain_continue(c, ckpt, chain_dig, &chain);
    *next_lsn = last + 1;
    *next_seg = n ? nos[n - 1] + 1 : 1;
out:
    free(chain_dig);
    free(nos);
    free(deltas);
    return rc;
}

/* ---- Entry points for the fuzz harnesses (fuzz/fuzz_record.c) ----------------
 * Thin wrappers that run the frame and record reading above on a segment image in
 * memory, and the rebuild + verification that ends recovery, so a harness can
 * drive them without files. Nothing in the library calls them. */

bool pkv_replay_frame_ok(const uint8_t *data, size_t len, uint32_t epoch, size_t off,
                         uint64_t *first, uint32_t *nrec, uint32_t *bytes) {
    rdbuf rb = {(uint8_t *)data, len};
    seg s = {.epoch = epoch, .valid = true, .fd = -1, .len = len, .rb = &rb, .wlen = len};
    return frame_ok(&s, off, first, nrec, bytes);
}

int pkv_replay_frame_apply(pkv_cache *c, const uint8_t *data, size_t len, uint32_t epoch,
                           size_t off, uint64_t first, uint32_t nrec, uint32_t bytes,
                           uint64_t after, uint64_t *applied) {
    rdbuf rb = {(uint8_t *)data, len};
    seg s = {.epoch = epoch, .valid = true, .fd = -1, .len = len, .rb = &rb, .wlen = len};
    return frame_apply(c, &s, off, first, nrec, bytes, after, applied);
}

pkv_scan_res pkv_replay_scan(const uint8_t *data, size_t len, uint32_t epoch, size_t from,
                             uint64_t lsn, bool holding, uint64_t *first, size_t *at) {
    rdbuf rb = {(uint8_t *)data, len};
    seg s = {.epoch = epoch, .valid = true, .fd = -1, .len = len, .rb = &rb, .wlen = len};
    uint64_t o = 0;
    pkv_scan_res r = scan_frames(&s, from, lsn, holding, first, &o);
    if (r == PKV_SCAN_FOUND) *at = (size_t)o;
    return r;
}

int pkv_replay_rebuild(pkv_cache *c) {
    int rc = rebuild(c, c->arena.valid_blocks, false, false);
    if (!rc) verify_seqs(c);
    return rc;
}

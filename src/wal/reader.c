/*
 * wal/reader.c — the one reader of a cache directory's log and checkpoint chain.
 *
 * Owns every reading rule of docs/format.md ("Reading the log"): which file names
 * are log files (and that a segment number below 2^63 is the only plausible one),
 * when a segment header is valid and of this arena, when a frame is valid (rule
 * D5), what a valid frame's records must satisfy, the start segment, the skip
 * over damaged frames the checkpoint covers, and where and why the valid log
 * ends (clean end, torn tail, a gap, or damage followed by valid frames), and
 * the link checks of the checkpoint chain.
 *
 * It reads and reports; it never writes, and never decides. Recovery (replay.c)
 * applies the records it hands over and acts on its verdicts (cut a torn tail,
 * fail naming the LSN, or stop point-in-time); the inspection API (logview.c,
 * include/pagedkv_log.h, used by kvdump) shows them. Every length read from disk
 * is checked against the bytes actually read before it is used.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define WINDOW (4u << 20)
#define WATCH_BYTES (64u << 10)

/* ---- The directory listing ------------------------------------------------ */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
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

void pkv_rd_dir_free(pkv_rd_dir *d) {
    free(d->segs);
    free(d->deltas);
    d->segs = d->deltas = NULL;
    d->nsegs = d->ndeltas = 0;
}

/* One directory entry into the listing. */
static int list_entry(const char *dir, const char *name, pkv_rd_dir *d, size_t *cap,
                      size_t *dcap) {
    uint64_t n;
    if (pkv_wal_name_no(name, "wal-", &n)) {
        /* A correct writer numbers segments up from 1 and never gets near 2^63. A
         * larger number (a forged or stray file) would make the next segment's
         * number wrap to 0 and sort before the log it continues, losing it at the
         * next open. */
        if (n >= 1ull << 63)
            return pkv_err(PKV_ECORRUPT, "%s/%s: segment number out of range", dir, name);
        return push_u64(&d->segs, &d->nsegs, cap, n);
    }
    if (pkv_wal_name_no(name, "ckpt-", &n)) {
        if (!d->have_ckpt || n > d->ckpt) d->ckpt = n;
        d->have_ckpt = true;
        d->nckpt++;
    } else if (pkv_wal_name_no(name, "delta-", &n)) {
        return push_u64(&d->deltas, &d->ndeltas, dcap, n);
    } else if (pkv_wal_name_no(name, "wal-spare-", &n)) {
        if (n < 64) d->spares |= 1ull << n;
        else d->spares_big++;
    } else if (!strcmp(name, "arena.tmp")) {
        d->arena_tmp = true;
    } else if (!strcmp(name, "ckpt.tmp")) {
        d->ckpt_tmp = true;
    }
    return 0;
}

int pkv_rd_list(const char *dir, pkv_rd_dir *d) {
    memset(d, 0, sizeof *d);
    DIR *dh = opendir(dir);
    if (!dh) return pkv_err(PKV_EIO, "open directory %s: %s", dir, strerror(errno));
    size_t cap = 0, dcap = 0;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(dh))) rc = list_entry(dir, e->d_name, d, &cap, &dcap);
    closedir(dh);
    if (!rc && d->nsegs) qsort(d->segs, d->nsegs, sizeof *d->segs, cmp_u64);
    if (!rc && d->ndeltas) qsort(d->deltas, d->ndeltas, sizeof *d->deltas, cmp_u64);
    return rc;
}

/* ---- Segments --------------------------------------------------------------- */

void pkv_rd_seg_close(pkv_rd_seg *s) {
    if (s->fd >= 0) s->io->close(s->io->ctx, s->fd);
    s->fd = -1;
}

const uint8_t *pkv_rd_at(pkv_rd_seg *s, uint64_t off, size_t n) {
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

/* The header verdict (PKV_SEGH_*) of the SEG_HDR bytes h (r of them read). */
static int seg_header(pkv_rd_seg *s, const uint8_t *h, long r, uint64_t secret) {
    if (r != (long)SEG_HDR) return PKV_SEGH_SHORT;
    if (memcmp(h, SEG_MAGIC, 8)) return PKV_SEGH_MAGIC;
    if (!pkv_sum_ok(pkv_get_u64(h + 56), XXH3_64bits(h, 56))) return PKV_SEGH_SUM;
    if (pkv_get_u32(h + 8) != WAL_VERSION) return s->hdr_val = pkv_get_u32(h + 8), PKV_SEGH_VERSION;
    if (pkv_get_u64(h + 16) != s->no) return s->hdr_val = pkv_get_u64(h + 16), PKV_SEGH_NUMBER;
    if (pkv_get_u64(h + 40) > (16ull << 30)) return s->hdr_val = pkv_get_u64(h + 40), PKV_SEGH_SIZE;
    s->epoch = pkv_get_u32(h + 12);
    s->start = pkv_get_u64(h + 24);
    s->size = pkv_get_u64(h + 40);
    return pkv_get_u64(h + 32) == secret ? PKV_SEGH_OK : PKV_SEGH_FOREIGN;
}

int pkv_rd_seg_open(const pkv_io_ops *io, const char *dir, uint64_t no, uint64_t secret,
                    pkv_rd_seg *s, pkv_rd_buf *rb, bool header_only) {
    memset(s, 0, sizeof *s);
    s->no = no;
    s->io = io;
    s->rb = rb;
    s->fd = -1;
    snprintf(s->path, sizeof s->path, "%s/wal-%016llx", dir, (unsigned long long)no);
    int fd = io->open(io->ctx, s->path, O_RDONLY, 0);
    if (fd < 0) {
        s->hdr = PKV_SEGH_SHORT;
        s->err = fd; /* -errno: a caller may tell a vanished file from others */
        return pkv_err(PKV_EIO, "open %s: %s", s->path, strerror(-fd));
    }
    s->fd = fd;
    uint8_t h[SEG_HDR];
    long r = io->pread(io->ctx, fd, h, SEG_HDR, 0);
    if (r < 0) {
        pkv_rd_seg_close(s);
        return pkv_err(PKV_EIO, "read %s: %s", s->path, strerror((int)-r));
    }
    s->hdr = seg_header(s, h, r, secret);
    s->valid = s->hdr == PKV_SEGH_OK;
    if (!s->valid || header_only) {
        pkv_rd_seg_close(s);
        return 0;
    }
    /* Usually the file holds all `size` bytes; if not, read to its end. */
    s->len = s->size;
    s->base = s->size; /* empty window */
    uint8_t last;
    r = s->size ? io->pread(io->ctx, fd, &last, 1, s->size - 1) : 1;
    if (r < 0) {
        pkv_rd_seg_close(s);
        return pkv_err(PKV_EIO, "read %s: %s", s->path, strerror((int)-r));
    }
    if (r != 1) {
        uint64_t off = 0;
        while (off < s->len && pkv_rd_at(s, off, 1)) off = s->base + s->wlen;
        if (s->err) {
            pkv_rd_seg_close(s);
            return s->err;
        }
    }
    return 0;
}

/* ---- Frames and records ------------------------------------------------------ */

/* A frame is applied whole or not at all, so recovery ends between calls (rule
 * D5). On true the whole frame is in the window. */
bool pkv_rd_frame_ok(pkv_rd_seg *s, uint64_t off, uint64_t *first, uint32_t *nrec,
                     uint32_t *bytes) {
    const uint8_t *f = pkv_rd_at(s, off, FRAME_HDR);
    if (!f || pkv_get_u32(f) != FRAME_MAGIC || pkv_get_u32(f + 4) != s->epoch) return false;
    uint32_t nb = pkv_get_u32(f + 20);
    if (nb > s->len - off - FRAME_HDR || (nb & 7)) return false;
    if (!(f = pkv_rd_at(s, off, FRAME_HDR + (size_t)nb))) return false;
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

/* A decoded record's lengths that replay could not index with (pkv_replay_apply
 * checks the same): a committed length whose ceil(committed / B) overflows. */
static bool rec_range_ok(const pkv_rec *r, uint32_t bs) {
    return !((r->type == REC_SEQ_SET || r->type == REC_COMMIT || r->type == REC_TRUNC) &&
             r->committed > (uint64_t)UINT32_MAX * bs);
}

static int rec_bad(int *bad, uint64_t *bad_lsn, int why, uint64_t lsn, int rc) {
    *bad = why;
    *bad_lsn = lsn;
    return rc;
}

int pkv_rd_records(pkv_rd_seg *s, uint64_t off, uint64_t first, uint32_t nrec,
                   uint32_t bytes, uint64_t after, uint32_t block_size, bool decode_all,
                   pkv_rd_rec_fn fn, void *ctx, int *bad, uint64_t *bad_lsn) {
    *bad = PKV_RECBAD_NONE;
    const uint8_t *f = pkv_rd_at(s, off, FRAME_HDR + (size_t)bytes);
    if (!f) return s->err ? s->err : pkv_err(PKV_EIO, "frame vanished in %s", s->path);
    const uint8_t *p = f + FRAME_HDR, *end = p + bytes;
    for (uint32_t i = 0; i < nrec; i++) {
        const uint64_t want = first + i;
        if (end - p < (long)(REC_HDR + REC_TRAILER))
            return rec_bad(bad, bad_lsn, PKV_RECBAD_SHORT, want,
                           pkv_err(PKV_ECORRUPT, "frame at LSN %llu truncated",
                                   (unsigned long long)first));
        uint32_t rl = pkv_get_u32(p);
        uint64_t lsn = pkv_get_u64(p + 8);
        int why = rl < REC_HDR + REC_TRAILER || (rl & 7) || rl > end - p ? PKV_RECBAD_LEN
                  : lsn != want                                         ? PKV_RECBAD_LSN
                  : !pkv_sum_ok(pkv_get_u64(p + rl - REC_TRAILER),
                                XXH3_64bits_withSeed(p, rl - REC_TRAILER, s->epoch))
                      ? PKV_RECBAD_SUM
                      : PKV_RECBAD_NONE;
        if (why)
            return rec_bad(bad, bad_lsn, why, want,
                           pkv_err(PKV_ECORRUPT, "record at LSN %llu invalid inside a valid "
                                   "frame", (unsigned long long)want));
        pkv_rd_rec rr;
        rr.off = (uint64_t)(p - f) + off;
        rr.len = rl;
        rr.decoded = false;
        if (lsn > after || decode_all) {
            int rc = pkv_rec_decode(p, rl - REC_HDR - REC_TRAILER, block_size, &rr.r);
            if (!rc && !rec_range_ok(&rr.r, block_size))
                rc = rec_bad(bad, bad_lsn, PKV_RECBAD_RANGE, lsn,
                             pkv_err(PKV_ECORRUPT, "%s record at LSN %llu: committed length "
                                     "out of range", pkv_rec_type_name(rr.r.type),
                                     (unsigned long long)lsn));
            else if (rc)
                rec_bad(bad, bad_lsn, PKV_RECBAD_DECODE, lsn, rc);
            if (rc && lsn > after) return rc;
            rr.decoded = !rc; /* one recovery skips need not decode */
        }
        if (fn) {
            int rc = fn(ctx, &rr);
            if (rc) return rc;
        }
        p += rl;
    }
    if (p != end)
        return rec_bad(bad, bad_lsn, PKV_RECBAD_TRAILING, first,
                       pkv_err(PKV_ECORRUPT, "frame at LSN %llu has trailing bytes",
                               (unsigned long long)first));
    *bad = PKV_RECBAD_NONE;
    return 0;
}

/* ---- Looking past the end ------------------------------------------------------
 * Every candidate (magic and epoch at an aligned offset, a length that fits)
 * costs a checksum over its claimed length, and candidates can overlap: a
 * segment of repeated [magic][epoch] words makes every offset one, O(len²) in
 * all. A writer's frames of one epoch never overlap, so a real log checksums each
 * byte at most about twice (a torn frame, then the frames after it). The scan
 * therefore stops with PKV_SCAN_TOO_MUCH once its checksums would pass
 * PKV_SCAN_BUDGET(bytes after from): it cannot tell whether a valid frame
 * follows, and the callers treat that like one that does. */
pkv_scan_res pkv_rd_scan(pkv_rd_seg *s, uint64_t from, uint64_t lsn, bool holding,
                         uint64_t *first, uint64_t *at) {
    uint64_t o = (from + 8) & ~(uint64_t)7;
    uint64_t budget = PKV_SCAN_BUDGET(s->len > from ? s->len - from : 0);
    while (o + FRAME_HDR <= s->len) {
        size_t n = s->len - o < WINDOW ? (size_t)(s->len - o) : WINDOW;
        const uint8_t *w = pkv_rd_at(s, o, n);
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
        if (pkv_rd_frame_ok(s, o, &f, &nr, &b) &&
            (holding ? f <= lsn && lsn <= f + nr - 1 : f + nr - 1 >= lsn)) {
            *first = f;
            *at = o;
            return PKV_SCAN_FOUND;
        }
        o += 8;
    }
    return PKV_SCAN_NONE;
}

/* Are all bytes from `off` (8-aligned) to the end zero? A last partial word counts
 * as zero. */
static bool zero_from(pkv_rd_seg *s, uint64_t off) {
    uint64_t o = off;
    while (o + 8 <= s->len) {
        size_t n = s->len - o < WINDOW ? (size_t)(s->len - o) : WINDOW;
        const uint8_t *w = pkv_rd_at(s, o, n);
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

/* ---- A writer appending meanwhile ------------------------------------------------
 * A read-only reader may run beside a live writer, whose next frame can land at
 * the end between two reads: the frame test read a window from before it, the
 * scan or the header test one from after (or caught it half copied). Frames are
 * written in order and never change once complete, so before the frame at the
 * end is called damaged it is read afresh (and, with polls, watched); if it
 * continues the log now, reading goes on. */

static bool continues_at(pkv_rd_seg *s, uint64_t off, uint64_t expect) {
    uint64_t first;
    uint32_t nrec, bytes;
    s->wlen = 0; /* the window is stale: read it again */
    return pkv_rd_frame_ok(s, off, &first, &nrec, &bytes) && first <= expect &&
           first + nrec - 1 >= expect;
}

/* 1: the frame at off continues the log now; 2: its bytes changed while watched
 * (a frame being written); 0: neither. */
static int watch_end(const pkv_rd_log *L, pkv_rd_seg *s, uint64_t off, uint64_t expect) {
    if (continues_at(s, off, expect)) return 1;
    if (L->polls <= 0 || off >= s->len || s->err) return 0;
    size_t n = s->len - off < WATCH_BYTES ? (size_t)(s->len - off) : WATCH_BYTES;
    const uint8_t *p = pkv_rd_at(s, off, n);
    uint8_t *was = p ? malloc(n) : NULL;
    if (!was) return 0;
    memcpy(was, p, n);
    int r = 0;
    for (int i = 0; i < L->polls && !r && !s->err; i++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (continues_at(s, off, expect)) r = 1;
        else if ((p = pkv_rd_at(s, off, n)) && memcmp(was, p, n)) r = 2;
    }
    free(was);
    return r;
}

/* ---- Reading the log ------------------------------------------------------------ */

/* Why the frames of segment s stop at off (nothing valid continues there). */
static void classify(pkv_rd_seg *s, uint64_t off, uint64_t expect, bool reached,
                     pkv_scan_res later, uint64_t f, uint64_t at, pkv_rd_end *e) {
    e->off = off;
    e->expect = expect;
    if (later != PKV_SCAN_NONE) {
        e->reason = PKV_END_CORRUPT;
        e->too_much = later == PKV_SCAN_TOO_MUCH;
        e->next_lsn = later == PKV_SCAN_FOUND ? f : 0;
        e->next_off = at;
        return;
    }
    const uint8_t *h = pkv_rd_at(s, off, FRAME_HDR);
    if (reached && h && pkv_get_u32(h) == FRAME_MAGIC && pkv_get_u32(h + 4) == s->epoch) {
        /* A frame of this epoch that is not a valid continuation: a torn tail. */
        uint32_t nb = pkv_get_u32(h + 20), nr = pkv_get_u32(h + 16);
        e->val = nb;
        e->nrec = nr;
        e->torn_bytes = FRAME_HDR + (nb < s->len - off ? nb : s->len - off);
        uint64_t first;
        uint32_t nrec, bytes;
        e->reason = PKV_END_TORN;
        if (pkv_rd_frame_ok(s, off, &first, &nrec, &bytes)) {
            e->reason = PKV_END_NOT_NEXT;
            e->next_lsn = first;
        }
        return;
    }
    /* Nothing recovery cuts: only zeros (writing may resume here), the file's
     * end, bytes of no frame, or damage among frames the checkpoint covers. */
    e->zero = !s->err && zero_from(s, off);
    h = s->err ? NULL : pkv_rd_at(s, off, FRAME_HDR);
    if (off + FRAME_HDR > s->len) {
        e->reason = PKV_END_EOF;
    } else if (e->zero) {
        e->reason = PKV_END_CLEAN;
    } else if (!h || pkv_get_u32(h) != FRAME_MAGIC) {
        e->reason = PKV_END_GARBAGE;
    } else if (pkv_get_u32(h + 4) != s->epoch) {
        e->reason = PKV_END_STALE;
        e->val = pkv_get_u32(h + 4);
    } else {
        e->reason = PKV_END_TORN;
        e->covered = true;
        e->val = pkv_get_u32(h + 20);
        e->nrec = pkv_get_u32(h + 16);
    }
}

/* Read one segment (open, valid, not after a gap) from *expect on. */
static int seg_read(pkv_rd_log *L, pkv_rd_seg *s, uint64_t *expect_io, pkv_rd_end *e) {
    uint64_t expect = *expect_io;
    uint64_t off = SEG_HDR;
    bool reached = s->start >= expect;
    int rc;
    memset(e, 0, sizeof *e);
    e->seg = s->no;
    e->seg_size = s->size;
    e->seg_epoch = s->epoch;
again:
    for (;;) {
        uint64_t first;
        uint32_t nrec, bytes;
        if (!pkv_rd_frame_ok(s, off, &first, &nrec, &bytes)) {
            /* Damage in frames the checkpoint already covers is harmless: skip
             * to the valid frame holding the first LSN still needed. */
            uint64_t f0, o2;
            if (!reached && pkv_rd_scan(s, off, expect, true, &f0, &o2) == PKV_SCAN_FOUND) {
                L->skipped_bytes += o2 - off;
                off = o2;
                continue;
            }
            break;
        }
        bool covered = first + nrec - 1 < expect; /* wholly in the checkpoint */
        if (!covered && first > expect) break;    /* not a continuation: invalid */
        if (L->on_frame &&
            (rc = L->on_frame(L->ctx, s, off, first, nrec, bytes, covered, expect - 1))) {
            *expect_io = expect;
            return rc;
        }
        if (!covered) {
            reached = true;
            expect = first + nrec;
        }
        off += FRAME_HDR + bytes;
    }
    *expect_io = expect;
    if (s->err) return s->err;
    if (L->eager && L->recheck && continues_at(s, off, expect)) goto again;
    if (s->err) return s->err;
    /* The log ends at `off` in this segment, unless the next segment continues. */
    uint64_t f = 0, at = 0;
    pkv_scan_res later = off + FRAME_HDR <= s->len ? pkv_rd_scan(s, off, expect, false, &f, &at)
                                                   : PKV_SCAN_NONE;
    const uint8_t *h;
    const bool torn_hdr = (later == PKV_SCAN_NONE || L->recheck) && !s->err && reached &&
                          (h = pkv_rd_at(s, off, FRAME_HDR)) &&
                          pkv_get_u32(h) == FRAME_MAGIC && pkv_get_u32(h + 4) == s->epoch;
    if (L->recheck && !s->err && (later != PKV_SCAN_NONE || torn_hdr)) {
        int w = watch_end(L, s, off, expect);
        if (w == 1) goto again;
        if (w == 2) {
            e->reason = PKV_END_IN_PROGRESS;
            e->off = off;
            e->expect = expect;
            e->seg_len = s->len;
            return s->err;
        }
    }
    if (s->err) return s->err;
    classify(s, off, expect, reached, later, f, at, e);
    e->seg_len = s->len;
    return s->err;
}

static void seg_end(pkv_rd_log *L, const pkv_rd_seg *s, const pkv_rd_end *e) {
    if (L->on_seg_end) L->on_seg_end(L->ctx, s, e);
}

/* A segment that starts after a hole: *gap set when it holds a valid frame (or
 * too many candidates to tell), so records are missing before it. */
static int gap_check(pkv_rd_seg *s, uint64_t expect, pkv_rd_end *e, bool *gap) {
    uint64_t f, at;
    pkv_scan_res r = pkv_rd_scan(s, SEG_HDR - 8, 0, false, &f, &at);
    memset(e, 0, sizeof *e);
    e->seg = s->no;
    e->expect = expect;
    e->next_lsn = s->start;
    *gap = r != PKV_SCAN_NONE && !s->err;
    if (*gap) {
        e->reason = PKV_END_GAP;
        e->off = SEG_HDR;
        e->too_much = r == PKV_SCAN_TOO_MUCH;
        e->seg_len = s->len;
        e->seg_size = s->size;
        e->seg_epoch = s->epoch;
    }
    return s->err;
}

int pkv_rd_log_read(pkv_rd_log *L, const uint64_t *nos, size_t n, uint64_t after,
                    pkv_rd_end *end) {
    uint64_t expect = after + 1;
    size_t i0 = 0;
    pkv_rd_buf rb = {NULL, 0};
    pkv_rd_seg s;
    int rc = 0;
    memset(end, 0, sizeof *end);
    L->last_lsn = after;
    /* Start at the last segment whose start LSN is <= after + 1. */
    for (size_t i = 0; i < n && !rc; i++) {
        rc = pkv_rd_seg_open(L->io, L->dir, nos[i], L->secret, &s, &rb, true);
        if (rc && L->vanish_ok && s.err == -ENOENT) rc = 0; /* recycled meanwhile */
        if (!rc && s.valid && s.start <= expect) i0 = i;
        if (!rc && L->on_header) rc = L->on_header(L->ctx, &s);
    }
    for (size_t i = i0; i < n && !rc; i++) {
        pkv_rd_end e;
        rc = pkv_rd_seg_open(L->io, L->dir, nos[i], L->secret, &s, &rb, false);
        if (rc && L->vanish_ok && s.err == -ENOENT) {
            memset(&e, 0, sizeof e);
            e.seg = s.no;
            seg_end(L, &s, &e);
            rc = 0;
            continue;
        }
        if (rc) break;
        if (!s.valid) continue; /* a header that never became durable: nothing in it */
        if (s.start > expect) { /* a gap: records between are missing */
            bool gap;
            rc = gap_check(&s, expect, &e, &gap);
            pkv_rd_seg_close(&s);
            if (rc) break;
            seg_end(L, &s, &e);
            if (!gap) continue;
            *end = e;
            break;
        }
        rc = seg_read(L, &s, &expect, &e);
        pkv_rd_seg_close(&s);
        if (rc) break;
        L->torn_bytes += e.torn_bytes;
        seg_end(L, &s, &e);
        *end = e;
        if (e.reason == PKV_END_CORRUPT) break;
    }
    free(rb.p);
    L->last_lsn = expect - 1;
    return rc;
}

/* ---- The checkpoint chain ----------------------------------------------------- */

int pkv_rd_link(bool is_base, uint64_t no, uint64_t lsn, uint64_t secret, uint64_t arena,
                const uint8_t *raw, size_t len, uint64_t prev_lsn, uint64_t prev_sum,
                pkv_ckpt_meta *m) {
    /* A file whose header disagrees with its name was renamed or copied by hand:
     * which checkpoint is newest, and which deltas follow it, are decided by
     * names, so the directory cannot be trusted. */
    if (lsn != no) return PKV_LINK_NAME;
    if (secret != arena) return is_base ? PKV_LINK_FOREIGN : PKV_LINK_ARENA;
    if (!raw) return PKV_LINK_OK;
    int rc = pkv_ckpt_info(raw, len, m);
    if (rc) return rc;
    if (m->delta != !is_base) return PKV_LINK_KIND;
    if (!is_base && m->prev_lsn != prev_lsn) return PKV_LINK_PREV_LSN;
    if (!is_base && m->prev_sum != prev_sum) return PKV_LINK_PREV_SUM;
    return PKV_LINK_OK;
}

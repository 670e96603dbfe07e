/*
 * wal/logview.c — the public face of the log reader (include/pagedkv_log.h).
 *
 * Owns a pkv_logview: a directory's listing, its checkpoint chain as recovery would
 * load it (each file's state and, where it breaks, why), and after pkv_logview_read
 * every segment's verdict and where and why the log ends. All reading rules are
 * wal/reader.c's (the listing, segment headers, frames, records, the end of the
 * log, the chain's link checks) and checkpoint.c's (a checkpoint file's header,
 * checksum and decompression, and the checks of loading one: pkv_ckpt_check);
 * this file only gathers what they report into the structures of the header.
 *
 * Unlike recovery it may run beside a live writer: a chain file that vanishes
 * while read (a newer full checkpoint removed it) makes it list again, and the
 * frame at the log's end is re-read, or watched, before it is called damaged.
 */
#include "internal.h"
#include "pagedkv_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

/* The public enums are the reader's values (compared as int: distinct enums). */
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(PKV_LOG_END_IN_PROGRESS, PKV_END_IN_PROGRESS) &&
                   SAME(PKV_LOG_END_BAD_RECORD, PKV_END_BAD_RECORD) &&
                   SAME(PKV_LOG_END_CORRUPT, PKV_END_CORRUPT) &&
                   SAME(PKV_LOG_END_CLEAN, PKV_END_CLEAN),
               "end reasons");
_Static_assert(SAME(PKV_LOG_SEG_FOREIGN, PKV_SEGH_FOREIGN) &&
                   SAME(PKV_LOG_SEG_SIZE, PKV_SEGH_SIZE),
               "segment header verdicts");
_Static_assert(PKV_LOG_NONE == PKV_NONE, "no block");
_Static_assert(SAME(PKV_LOG_BAD_TRAILING, PKV_RECBAD_TRAILING) && SAME(PKV_LOG_BAD, REC_BAD) &&
                   SAME(PKV_LOG_SEAL_RUN, REC_SEAL_RUN) &&
                   SAME(PKV_LOG_EVICT_RUN, REC_EVICT_RUN) &&
                   SAME(PKV_LOG_TYPE_MAX, REC_TYPE_MAX),
               "record verdicts and types");

/* Where reading a delta failed. */
enum { DF_READ = 1, DF_BODY };

typedef struct delta {
    pkv_log_delta pub;
    int fail;
} delta;

struct pkv_logview {
    char *dir;
    pkv_log_arena arena;
    uint32_t flags;
    pkv_rd_dir d;
    pkv_log_chain chain;
    delta *deltas;
    pkv_log_segment *segs;
    bool was_read;
    pkv_log_end end;
    pkv_log_stats st;
    /* during pkv_logview_read */
    pkv_log_rec_fn fn;
    void *ctx;
    int cbrc;
    bool bad_stop;
    pkv_log_segment *cur;
    uint64_t after; /* the frame being read: LSNs up to it are in the chain */
};

const char *pkv_logview_type_name(unsigned type) { return pkv_rec_type_name(type); }

/* Did the name go away (ENOENT, and the name itself is gone)? A dangling symbolic
 * link also fails with ENOENT but stays: unreadable, not vanished. */
static bool gone(const char *path) {
    struct stat st;
    return errno == ENOENT && lstat(path, &st) && errno == ENOENT;
}

/* A library message about a file of dir, without the directory. */
static const char *strip_dir(const char *msg, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(msg, dir, n) && msg[n] == '/' ? msg + n + 1 : msg;
}

static uint64_t mtime_ns(const struct stat *st) {
    return (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec;
}

/* ---- The checkpoint chain ----------------------------------------------------- */

/* Read ckpt-<no> in full as recovery does (pkv_ckpt_read) and check it names its
 * own LSN and holds a full checkpoint. */
static void read_ckpt(pkv_logview *g, bool *vanished) {
    pkv_log_chain *ch = &g->chain;
    ch->have_checkpoint = g->d.have_ckpt;
    ch->checkpoint_no = ch->checkpoint_lsn = g->d.ckpt;
    if (!g->d.have_ckpt) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt-%016llx", g->dir, (unsigned long long)g->d.ckpt);
    struct stat st;
    if (stat(path, &st)) {
        int e = errno;
        if (gone(path)) *vanished = true;
        snprintf(ch->checkpoint_error, sizeof ch->checkpoint_error,
                 "cannot open ckpt-%016llx: %s", (unsigned long long)g->d.ckpt, strerror(e));
        return;
    }
    ch->checkpoint_file_bytes = (uint64_t)st.st_size;
    ch->checkpoint_mtime_ns = mtime_ns(&st);
    uint8_t *raw = NULL;
    size_t len = 0;
    uint64_t secret = 0, lsn = 0, end = 0, sum = 0;
    if (pkv_ckpt_read(pkv_io_default(), path, CKPT_MAGIC, &secret, &lsn, &end, &raw, &len,
                      &sum)) {
        if (stat(path, &st) && gone(path)) *vanished = true;
        snprintf(ch->checkpoint_error, sizeof ch->checkpoint_error, "%s",
                 strip_dir(pkv_last_error(), g->dir));
        return;
    }
    pkv_ckpt_meta m;
    int link = pkv_rd_link(true, g->d.ckpt, lsn, secret, g->arena.secret, raw, len, 0, 0, &m);
    free(raw);
    ch->checkpoint_secret = secret;
    ch->checkpoint_raw_bytes = len;
    ch->checkpoint_body_sum = sum;
    if (link == PKV_LINK_NAME)
        snprintf(ch->checkpoint_error, sizeof ch->checkpoint_error,
                 "ckpt-%016llx: covers LSN %llu, not the one its name says",
                 (unsigned long long)g->d.ckpt, (unsigned long long)lsn);
    else if (link == PKV_LINK_KIND)
        snprintf(ch->checkpoint_error, sizeof ch->checkpoint_error,
                 "ckpt-%016llx: holds a delta checkpoint", (unsigned long long)g->d.ckpt);
    else if (link < 0)
        snprintf(ch->checkpoint_error, sizeof ch->checkpoint_error, "ckpt-%016llx: %s",
                 (unsigned long long)g->d.ckpt, pkv_last_error());
    else
        ch->checkpoint_ok = 1;
    ch->checkpoint_foreign = link == PKV_LINK_FOREIGN;
}

static void delta_fail(delta *d, int stage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void delta_fail(delta *d, int stage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->pub.error, sizeof d->pub.error, fmt, ap);
    va_end(ap);
    d->fail = stage;
}

/* The file before delta i in the chain, for messages. */
static void prev_name(const pkv_logview *g, size_t i, char *out, size_t n) {
    if (i == 0 || g->deltas[i - 1].pub.state != PKV_LOG_DELTA_APPLIED)
        snprintf(out, n, "ckpt-%016llx", (unsigned long long)g->chain.checkpoint_no);
    else
        snprintf(out, n, "delta-%016llx", (unsigned long long)g->deltas[i - 1].pub.no);
}

/* Whether delta i (raw: its snapshot, NULL if unreadable) links onto the file
 * before it, with recovery's checks (pkv_rd_link) in recovery's order. */
static void link_delta(pkv_logview *g, size_t i, const uint8_t *raw, size_t len,
                       uint64_t prev_lsn, uint64_t prev_sum) {
    delta *d = &g->deltas[i];
    pkv_log_delta *p = &d->pub;
    char before[40], why[512];
    prev_name(g, i, before, sizeof before);
    why[0] = '\0';
    pkv_ckpt_meta m = {0};
    int link = d->fail == DF_READ ? PKV_LINK_OK
                                  : pkv_rd_link(false, p->no, p->lsn, p->secret,
                                                g->arena.secret, raw, len, prev_lsn, prev_sum, &m);
    if (d->fail == DF_READ) {
        snprintf(why, sizeof why, "unreadable: %s", p->error);
    } else if (link == PKV_LINK_NAME) {
        snprintf(why, sizeof why, "covers LSN %llu, not the one its name says",
                 (unsigned long long)p->lsn);
    } else if (link == PKV_LINK_ARENA) {
        snprintf(why, sizeof why, "the checkpoint chain is broken: the delta describes "
                 "another arena than the checkpoints before it");
    } else if (link < 0) {
        snprintf(why, sizeof why, "%s", pkv_last_error());
    } else if (link == PKV_LINK_KIND) {
        snprintf(why, sizeof why, "holds a full checkpoint");
    } else if (link == PKV_LINK_PREV_LSN) {
        bool present = p->prev_lsn == g->chain.checkpoint_no;
        for (size_t k = 0; k < g->d.ndeltas; k++) present |= g->deltas[k].pub.no == p->prev_lsn;
        snprintf(why, sizeof why, "the checkpoint chain is broken: it applies on the file of "
                 "LSN %llu%s; the file before it is %s (LSN %llu)",
                 (unsigned long long)p->prev_lsn,
                 present ? "" : ", which is not in the directory", before,
                 (unsigned long long)prev_lsn);
    } else if (link == PKV_LINK_PREV_SUM) {
        snprintf(why, sizeof why, "the checkpoint chain is broken: it applies on a file of "
                 "LSN %llu with body checksum %016llx, but %s has %016llx (replaced)",
                 (unsigned long long)prev_lsn, (unsigned long long)p->prev_sum, before,
                 (unsigned long long)prev_sum);
    } else if (d->fail == DF_BODY) {
        snprintf(why, sizeof why, "does not decode: %s", p->error);
    }
    if (!why[0]) {
        p->state = PKV_LOG_DELTA_APPLIED;
        return;
    }
    p->state = PKV_LOG_DELTA_BROKEN;
    snprintf(p->error, sizeof p->error, "%.*s", (int)sizeof p->error - 1, why);
}

/* Read delta i in full (pkv_ckpt_read: header, body checksum, LZ4); *raw keeps
 * its snapshot (NULL if unreadable) for link_delta. */
static void read_delta(pkv_logview *g, size_t i, uint8_t **raw, size_t *len, bool *vanished) {
    delta *d = &g->deltas[i];
    pkv_log_delta *p = &d->pub;
    char path[4200];
    snprintf(path, sizeof path, "%s/delta-%016llx", g->dir, (unsigned long long)p->no);
    *raw = NULL;
    *len = 0;
    struct stat st;
    if (stat(path, &st)) {
        int e = errno;
        if (gone(path)) *vanished = true;
        delta_fail(d, DF_READ, "cannot open: %s", strerror(e));
        return;
    }
    p->file_bytes = (uint64_t)st.st_size;
    p->mtime_ns = mtime_ns(&st);
    uint64_t end = 0;
    if (pkv_ckpt_read(pkv_io_default(), path, DELTA_MAGIC, &p->secret, &p->lsn, &end, raw, len,
                      &p->body_sum)) {
        if (stat(path, &st) && gone(path)) *vanished = true;
        delta_fail(d, DF_READ, "%s", strip_dir(pkv_last_error(), g->dir));
        *raw = NULL;
        return;
    }
    p->raw_bytes = *len;
    pkv_ckpt_meta m;
    if (!pkv_ckpt_info(*raw, *len, &m) && m.delta) {
        p->prev_lsn = m.prev_lsn;
        p->prev_sum = m.prev_sum;
        pkv_ckpt_counts n;
        if (pkv_ckpt_check(*raw, *len, g->arena.block_size, g->arena.capacity, &n)) {
            delta_fail(d, DF_BODY, "%s", pkv_last_error());
        } else {
            p->decoded = 1;
            p->sealed = n.sealed;
            p->freed = n.freed;
            p->sequences = n.sequences;
        }
    }
}

/* Read the chain's files and place every delta in the chain recovery loads: the
 * newest ckpt-<base>, then every delta-<n> with n > base in order; deltas with
 * n <= base are stale; the chain stops at the first that does not link. */
static void read_chain(pkv_logview *g, bool *vanished) {
    pkv_log_chain *ch = &g->chain;
    read_ckpt(g, vanished);
    ch->ok = 1;
    ch->newest_lsn = ch->checkpoint_ok ? ch->checkpoint_no : 0;
    uint64_t prev_lsn = ch->checkpoint_no, prev_sum = ch->checkpoint_body_sum;
    bool stop = ch->checkpoint_foreign; /* recovery loads nothing after it */
    for (size_t i = 0; i < g->d.ndeltas; i++) {
        delta *d = &g->deltas[i];
        pkv_log_delta *p = &d->pub;
        p->no = g->d.deltas[i];
        uint8_t *raw;
        size_t len;
        read_delta(g, i, &raw, &len, vanished);
        if (ch->have_checkpoint && p->no <= ch->checkpoint_no) {
            p->state = PKV_LOG_DELTA_STALE;
            ch->stale++;
        } else if (!ch->have_checkpoint && !stop) {
            p->state = PKV_LOG_DELTA_BROKEN;
            snprintf(p->error, sizeof p->error, "no full checkpoint (ckpt-*) to apply it on");
        } else if (stop || !ch->checkpoint_ok) {
            p->state = PKV_LOG_DELTA_UNREACHED;
        } else {
            link_delta(g, i, raw, len, prev_lsn, prev_sum);
        }
        free(raw);
        if (p->state == PKV_LOG_DELTA_STALE || p->state == PKV_LOG_DELTA_UNREACHED) continue;
        stop = p->state != PKV_LOG_DELTA_APPLIED;
        if (p->state == PKV_LOG_DELTA_BROKEN) {
            ch->ok = 0;
            snprintf(ch->error, sizeof ch->error, "delta-%016llx: %s", (unsigned long long)p->no,
                     p->error);
        } else {
            ch->applied++;
            ch->applied_raw_bytes += p->raw_bytes;
            ch->newest_lsn = prev_lsn = p->lsn;
            prev_sum = p->body_sum;
        }
    }
}

/* ---- Opening ---------------------------------------------------------------------- */

static void free_files(pkv_logview *g) {
    pkv_rd_dir_free(&g->d);
    free(g->deltas);
    free(g->segs);
    g->deltas = NULL;
    g->segs = NULL;
    memset(&g->chain, 0, sizeof g->chain);
}

/* List the directory and read the chain; *vanished: a listed chain file is gone
 * (a live writer's newer full checkpoint removed it). */
static int list_and_read(pkv_logview *g, bool *vanished) {
    int rc = pkv_rd_list(g->dir, &g->d);
    if (rc) return rc;
    g->deltas = calloc(g->d.ndeltas ? g->d.ndeltas : 1, sizeof *g->deltas);
    g->segs = calloc(g->d.nsegs ? g->d.nsegs : 1, sizeof *g->segs);
    if (!g->deltas || !g->segs) return pkv_err(PKV_ENOMEM, "listing %s", g->dir);
    read_chain(g, vanished);
    for (size_t i = 0; i < g->d.nsegs; i++) {
        pkv_log_segment *s = &g->segs[i];
        char path[4200];
        struct stat st;
        s->no = g->d.segs[i];
        snprintf(path, sizeof path, "%s/wal-%016llx", g->dir, (unsigned long long)s->no);
        if (!stat(path, &st)) s->file_bytes = (uint64_t)st.st_size;
    }
    return 0;
}

int pkv_logview_open(const char *dir, const pkv_log_arena *arena, uint32_t flags,
                     pkv_logview **out) {
    if (out) *out = NULL;
    if (!dir || !arena || !out || (flags & ~(PKV_LOG_LIVE | PKV_LOG_MAYBE_LIVE)))
        return pkv_err(PKV_EINVAL, "pkv_logview_open: NULL argument or unknown flag");
    pkv_logview *g = calloc(1, sizeof *g);
    if (!g || !(g->dir = strdup(dir))) {
        free(g);
        return pkv_err(PKV_ENOMEM, "pkv_logview_open");
    }
    g->arena = *arena;
    g->flags = flags;
    for (int attempt = 0;; attempt++) {
        bool vanished = false;
        int rc = list_and_read(g, &vanished);
        if (rc) {
            pkv_logview_close(g);
            return rc;
        }
        if (!vanished || attempt == 49) break;
        free_files(g);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *out = g;
    return 0;
}

void pkv_logview_close(pkv_logview *g) {
    if (!g) return;
    free_files(g);
    free(g->dir);
    free(g);
}

/* ---- Reading the log ---------------------------------------------------------------- */

static pkv_log_segment *seg_of(pkv_logview *g, uint64_t no) {
    size_t lo = 0, hi = g->d.nsegs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->segs[mid].no < no) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->d.nsegs && g->segs[lo].no == no ? &g->segs[lo] : NULL;
}

static int view_header(void *ctx, const pkv_rd_seg *s) {
    pkv_logview *g = ctx;
    pkv_log_segment *p = seg_of(g, s->no);
    if (!p) return 0;
    p->header = s->err == -ENOENT ? PKV_LOG_SEG_VANISHED : s->hdr;
    p->value = s->hdr_val;
    if (s->hdr == PKV_SEGH_OK || s->hdr == PKV_SEGH_FOREIGN) {
        p->epoch = s->epoch;
        p->first_lsn = s->start;
        p->size = s->size;
    }
    return 0;
}

static void to_public(const pkv_rd_end *e, pkv_log_end *p) {
    memset(p, 0, sizeof *p);
    p->reason = e->reason;
    p->segment = e->seg;
    p->offset = e->off;
    p->missing_lsn = e->expect;
    p->too_much = e->too_much;
    p->seg_len = e->seg_len;
    p->next_lsn = e->next_lsn;
    p->next_offset = e->next_off;
    p->covered = e->covered;
    p->value = e->val;
    p->nrec = e->nrec;
}

static int view_rec(void *ctx, const pkv_rd_rec *rr) {
    pkv_logview *g = ctx;
    const pkv_rec *r = &rr->r;
    if (!rr->decoded) return 0; /* recovery skips it without decoding */
    pkv_log_stats *st = &g->st;
    g->cur->records++;
    st->records++;
    st->record_bytes += rr->len;
    const bool in = r->lsn <= g->after;
    if (!in) {
        st->replay_records++;
        st->replay_bytes += rr->len;
    }
    if (!st->first_lsn) st->first_lsn = r->lsn;
    if (!g->fn) return 0;
    pkv_log_rec p = {
        .lsn = r->lsn, .segment = g->cur->no, .offset = rr->off, .len = rr->len,
        .in_checkpoint = in, .type = r->type, .seq = r->seq, .salt = r->salt,
        .committed = r->committed, .hash_lo = r->hash_lo, .hash_hi = r->hash_hi,
        .payload_sum = r->payload_sum, .block = r->block, .parent = r->parent,
        .index = r->index, .first = r->first, .tail_off = r->tail_off,
        .nblocks = r->nblocks, .ntok = r->ntok, .blocks = r->blocks, .tokens = r->tokens,
        .entry_bytes = r->type == REC_SEAL_RUN ? (uint32_t)SEAL_RUN_ENTRY(r->ntok) : 0,
    };
    int rc = g->fn(g->ctx, &p);
    if (rc) g->cbrc = rc;
    return rc;
}

static int view_frame(void *ctx, pkv_rd_seg *s, uint64_t off, uint64_t first, uint32_t nrec,
                      uint32_t bytes, bool covered, uint64_t after) {
    pkv_logview *g = ctx;
    if (!(g->cur = seg_of(g, s->no))) return 0;
    g->cur->frames++;
    g->st.frames++;
    g->after = after;
    int bad;
    uint64_t bad_lsn;
    int rc = pkv_rd_records(s, off, first, nrec, bytes, after, g->arena.block_size, true,
                            view_rec, g, &bad, &bad_lsn);
    if (g->cbrc) return g->cbrc;
    if (!rc || (covered && bad)) return 0; /* recovery never reads inside those */
    if (!bad) return rc;
    /* Recovery fails here: the end of the log for good. */
    pkv_log_end *e = &g->end;
    memset(e, 0, sizeof *e);
    e->reason = PKV_LOG_END_BAD_RECORD;
    e->segment = s->no;
    e->offset = off;
    e->missing_lsn = bad_lsn;
    e->bad = bad;
    snprintf(e->error, sizeof e->error, "%s", pkv_last_error());
    g->cur->end = *e;
    g->cur->read = 1;
    g->st.used_bytes += off;
    g->bad_stop = true;
    return PKV_ECORRUPT;
}

static void view_seg_end(void *ctx, const pkv_rd_seg *s, const pkv_rd_end *e) {
    pkv_logview *g = ctx;
    pkv_log_segment *p = seg_of(g, s->no);
    if (!p) return;
    if (e->reason == PKV_END_NONE && s->err == -ENOENT) {
        p->header = PKV_LOG_SEG_VANISHED;
        return;
    }
    to_public(e, &p->end);
    if (e->reason == PKV_END_NONE) return; /* skipped after a hole */
    p->read = 1;
    if (e->reason != PKV_END_GAP) g->st.used_bytes += e->off;
}

int pkv_logview_read(pkv_logview *g, pkv_log_rec_fn fn, void *ctx) {
    if (!g) return pkv_err(PKV_EINVAL, "pkv_logview_read: NULL handle");
    if (g->was_read) return pkv_err(PKV_ESTATE, "pkv_logview_read: the log was read already");
    g->was_read = true;
    g->fn = fn;
    g->ctx = ctx;
    const int polls = g->flags & PKV_LOG_LIVE ? 100 : g->flags & PKV_LOG_MAYBE_LIVE ? 10 : 0;
    pkv_rd_log L = {
        .io = pkv_io_default(),
        .dir = g->dir,
        .secret = g->arena.secret,
        .block_size = g->arena.block_size,
        .decode_all = true,
        .recheck = true,
        .eager = true,
        .vanish_ok = true,
        .polls = polls,
        .ctx = g,
        .on_header = view_header,
        .on_frame = view_frame,
        .on_seg_end = view_seg_end,
    };
    pkv_rd_end e;
    const uint64_t after = g->chain.newest_lsn;
    int rc = pkv_rd_log_read(&L, g->d.segs, g->d.nsegs, after, &e);
    g->st.torn_bytes = L.torn_bytes;
    g->st.skipped_bytes = L.skipped_bytes;
    if (g->cbrc) return g->cbrc;
    if (g->bad_stop) {
        g->end.last_lsn = L.last_lsn;
        return 0;
    }
    if (rc) return rc;
    to_public(&e, &g->end);
    g->end.last_lsn = L.last_lsn;
    return 0;
}

/* ---- Accessors ---------------------------------------------------------------- */

void pkv_logview_get_dir(const pkv_logview *g, pkv_log_dir *out) {
    if (!g || !out) return;
    memset(out, 0, sizeof *out);
    out->segments = g->d.nsegs;
    out->checkpoints = g->d.nckpt;
    out->deltas = g->d.ndeltas;
    out->spare_mask = g->d.spares;
    /* As the writer counts them (wal.h): the run from 0 is recycled, the rest of
     * those below 64 are strays. */
    out->spares = (size_t)pkv_wal_spare_run(g->d.spares);
    out->spares_stray = (size_t)__builtin_popcountll(pkv_wal_spare_strays(g->d.spares));
    out->spares_ignored = g->d.spares_big;
    out->arena_tmp = g->d.arena_tmp;
    out->ckpt_tmp = g->d.ckpt_tmp;
}

uint64_t pkv_logview_spare_strays(uint64_t spare_mask) {
    return pkv_wal_spare_strays(spare_mask);
}

void pkv_logview_get_chain(const pkv_logview *g, pkv_log_chain *out) {
    if (g && out) *out = g->chain;
}

int pkv_logview_get_delta(const pkv_logview *g, size_t i, pkv_log_delta *out) {
    if (!g || !out) return pkv_err(PKV_EINVAL, "pkv_logview_get_delta: NULL argument");
    if (i >= g->d.ndeltas) return pkv_err(PKV_ERANGE, "pkv_logview_get_delta: no delta %zu", i);
    *out = g->deltas[i].pub;
    return 0;
}

int pkv_logview_get_segment(const pkv_logview *g, size_t i, pkv_log_segment *out) {
    if (!g || !out) return pkv_err(PKV_EINVAL, "pkv_logview_get_segment: NULL argument");
    if (i >= g->d.nsegs) return pkv_err(PKV_ERANGE, "pkv_logview_get_segment: no segment %zu", i);
    *out = g->segs[i];
    return 0;
}

void pkv_logview_get_end(const pkv_logview *g, pkv_log_end *end, pkv_log_stats *stats) {
    if (!g) return;
    if (end) *end = g->end;
    if (stats) *stats = g->st;
}

/*
 * kvdump_wal.c — the log scanner and `kvdump wal`.
 *
 * kd_log_scan() reads the checkpoint chain and the log segments of a directory
 * through the library's read-only log reader (include/pagedkv_log.h), which
 * applies recovery's own rules (src/wal/reader.c, docs/format.md "Reading the
 * log"): kvdump implements none of them. What stays here is presentation: the
 * kd_log summary the other commands print, the words for each verdict, the
 * judgement of whether a writer holds the directory (so the reader watches a
 * frame at the log's end before calling it damaged), and the `wal` command's
 * text and JSON output with its filters.
 */
#include "kvdump.h"
#include "pagedkv.h"
#include "pagedkv_log.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct kd_logrec {
    uint64_t seg, off;  /* segment number, byte offset of the record in its file */
    uint32_t len;       /* record bytes, header and trailer included */
    bool in_ckpt;       /* LSN <= the chain's newest LSN: recovery skips it */
    pkv_log_rec r;      /* decoded */
};

uint64_t kd_spare_strays(uint64_t spare_mask) { return pkv_logview_spare_strays(spare_mask); }

const char *kd_end_name(int r) {
    switch (r) {
    case PKV_LOG_END_NONE:       return "no_log";
    case PKV_LOG_END_CLEAN:      return "clean";
    case PKV_LOG_END_EOF:        return "end_of_segment";
    case PKV_LOG_END_STALE:      return "stale_frame";
    case PKV_LOG_END_GARBAGE:    return "garbage";
    case PKV_LOG_END_TORN:       return "torn_frame";
    case PKV_LOG_END_NOT_NEXT:   return "not_continuation";
    case PKV_LOG_END_CORRUPT:    return "corrupt";
    case PKV_LOG_END_GAP:        return "gap";
    case PKV_LOG_END_BAD_RECORD: return "bad_record";
    case PKV_LOG_END_IN_PROGRESS: return "in_progress";
    default:                return "unknown";
    }
}

const char *kd_delta_state_name(int state) {
    switch (state) {
    case KD_DELTA_APPLIED:   return "applied";
    case KD_DELTA_STALE:     return "stale";
    case KD_DELTA_BROKEN:    return "broken";
    case KD_DELTA_UNREACHED: return "unreached";
    default:                 return "unknown";
    }
}

_Static_assert((int)KD_DELTA_UNREACHED == (int)PKV_LOG_DELTA_UNREACHED &&
                   (int)KD_DELTA_APPLIED == (int)PKV_LOG_DELTA_APPLIED,
               "kvdump's delta states are the reader's");

/* ---- Whether a writer holds the directory ----------------------------------------
 * The reader re-reads the frame where the log seems to end before calling it
 * damaged (a live writer's frame may land there meanwhile); how long it watches
 * it depends on whether a writer is there: ~200 ms if one holds the directory,
 * ~20 ms if that is unknown, not at all if none does, so a dead directory's torn
 * tail costs no waiting. */

/* A FLOCK in /proc/locks on the inode of the directory or of its LOCK file: 1
 * yes, 0 no, -1 unknown. Reading /proc/locks takes no lock, so a writer opening
 * meanwhile is never refused. Only inode numbers are compared: a lock on a
 * same-numbered file elsewhere costs a longer watch, never a wrong verdict. */
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

/* ---- Words for the reader's verdicts ------------------------------------------------ */

static void seg_why(const pkv_log_segment *p, char *out, size_t n) {
    switch (p->header) {
    case PKV_LOG_SEG_OK:      out[0] = '\0'; break;
    case PKV_LOG_SEG_SHORT:   snprintf(out, n, "shorter than its 64-byte header"); break;
    case PKV_LOG_SEG_MAGIC:   snprintf(out, n, "bad magic"); break;
    case PKV_LOG_SEG_SUM:     snprintf(out, n, "header checksum mismatch"); break;
    case PKV_LOG_SEG_VERSION: snprintf(out, n, "version %llu", (unsigned long long)p->value); break;
    case PKV_LOG_SEG_NUMBER:
        snprintf(out, n, "header names segment %llu", (unsigned long long)p->value);
        break;
    case PKV_LOG_SEG_SIZE:
        snprintf(out, n, "implausible size %llu", (unsigned long long)p->value);
        break;
    case PKV_LOG_SEG_FOREIGN:
        snprintf(out, n, "written for another arena (secret differs)");
        break;
    case PKV_LOG_SEG_VANISHED:
        snprintf(out, n, "vanished while being read (recycled by a live writer)");
        break;
    default:                  snprintf(out, n, "unusable header"); break;
    }
}

static const char *bad_words(int bad) {
    switch (bad) {
    case PKV_LOG_BAD_SHORT:    return "frame truncated: too short for its next record";
    case PKV_LOG_BAD_LEN:      return "record length out of bounds";
    case PKV_LOG_BAD_LSN:      return "record LSN does not follow the frame's";
    case PKV_LOG_BAD_SUM:      return "record checksum mismatch";
    case PKV_LOG_BAD_DECODE:   return "record does not decode";
    case PKV_LOG_BAD_RANGE:    return "committed length out of range";
    case PKV_LOG_BAD_TRAILING: return "frame has trailing bytes after its last record";
    default:                   return "invalid record";
    }
}

/* Words into a buffer that may be short: cut, never overrun. */
static void say(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

/* Why the valid frames of a segment (of allocated size `size`) end where they do. */
static void end_words(const pkv_log_end *e, uint64_t size, char *out, size_t n) {
    const unsigned long long x = e->missing_lsn;
    const uint64_t left = e->seg_len > e->offset ? e->seg_len - e->offset : 0;
    switch (e->reason) {
    case PKV_LOG_END_CLEAN:
        say(out, n, "only zeros follow (clean end)");
        break;
    case PKV_LOG_END_EOF:
        if (!left)
            say(out, n, "end of the segment file%s",
                     e->seg_len < size ? " (the file is shorter than its allocated size)" : "");
        else
            say(out, n, "%llu bytes left, too few for a frame header",
                     (unsigned long long)left);
        break;
    case PKV_LOG_END_GARBAGE:
        say(out, n, "bytes that are not a frame header follow (ignored)");
        break;
    case PKV_LOG_END_STALE:
        say(out, n, "a frame of epoch %08x from the segment's previous life follows "
                 "(ignored)", e->value);
        break;
    case PKV_LOG_END_TORN:
        if (e->covered)
            say(out, n, "a damaged frame among those the checkpoint covers (harmless: "
                     "recovery needs none of them)");
        else if (e->value > left - 32 || (e->value & 7))
            say(out, n, "torn frame: its length %u runs past the file or is not a "
                     "multiple of 8; recovery cuts it", e->value);
        else if (e->nrec == 0)
            say(out, n, "frame holds no records; recovery cuts it");
        else
            say(out, n, "torn frame: checksum mismatch (a write cut short); recovery "
                     "cuts it");
        break;
    case PKV_LOG_END_NOT_NEXT:
        say(out, n, "a valid frame starting at LSN %llu does not continue the log "
                 "(expected LSN %llu); recovery cuts it", (unsigned long long)e->next_lsn, x);
        break;
    case PKV_LOG_END_CORRUPT:
        if (!e->too_much)
            say(out, n, "damaged at LSN %llu, but a valid frame with LSN %llu follows at "
                     "offset %llu: recovery fails unless opened point-in-time "
                     "(--point-in-time), which stops before LSN %llu", x,
                     (unsigned long long)e->next_lsn, (unsigned long long)e->next_offset, x);
        else
            say(out, n, "damaged at LSN %llu, followed by more overlapping frame "
                     "candidates than recovery checks (a forged or damaged segment): "
                     "recovery fails unless opened point-in-time (--point-in-time), which "
                     "stops before LSN %llu", x, x);
        break;
    case PKV_LOG_END_GAP:
        say(out, n, "records from LSN %llu are missing: segment %llu starts at LSN %llu "
                 "and holds %s; recovery fails unless opened point-in-time "
                 "(--point-in-time)", x, (unsigned long long)e->segment,
                 (unsigned long long)e->next_lsn,
                 e->too_much ? "more overlapping frame candidates than recovery checks"
                             : "valid frames");
        break;
    case PKV_LOG_END_BAD_RECORD: {
        bool dec = e->bad == PKV_LOG_BAD_DECODE;
        say(out, n, "record at LSN %llu invalid inside a valid frame (%s%s%s): recovery "
                 "fails (a writer bug or a forged frame)", x, bad_words(e->bad),
                 dec ? ": " : "", dec ? e->error : "");
        break;
    }
    case PKV_LOG_END_IN_PROGRESS:
        say(out, n, "a frame at offset %llu was being written while it was read (a live "
                 "writer); a later read includes it", (unsigned long long)e->offset);
        break;
    default:
        say(out, n, "skipped: starts at LSN %llu after a hole (expected %llu) and holds "
                 "no valid frame", (unsigned long long)e->next_lsn, x);
        break;
    }
}

/* ---- The scan ---------------------------------------------------------------------- */

static int copy_chain(const pkv_logview *v, kd_log *L) {
    pkv_log_dir d;
    pkv_log_chain ch;
    pkv_logview_get_dir(v, &d);
    pkv_logview_get_chain(v, &ch);
    L->have_ckpt = ch.have_checkpoint;
    L->ckpt_ok = ch.checkpoint_ok;
    L->ckpt_no = ch.checkpoint_no;
    L->ckpt_lsn = ch.checkpoint_lsn;
    L->ckpt_secret = ch.checkpoint_secret;
    L->ckpt_file_size = ch.checkpoint_file_bytes;
    L->ckpt_raw = ch.checkpoint_raw_bytes;
    L->ckpt_body = ch.checkpoint_file_bytes > 64 ? ch.checkpoint_file_bytes - 64 : 0;
    L->ckpt_sum = ch.checkpoint_body_sum;
    L->ckpt_mtime_ns = ch.checkpoint_mtime_ns;
    snprintf(L->ckpt_err, sizeof L->ckpt_err, "%s", ch.checkpoint_error);
    L->nckpt_files = d.checkpoints;
    L->chain_ok = ch.ok;
    snprintf(L->chain_err, sizeof L->chain_err, "%s", ch.error);
    L->chain_lsn = ch.newest_lsn;
    L->nchain = ch.applied;
    L->nstale = ch.stale;
    L->chain_raw = ch.applied_raw_bytes;
    L->nspare = d.spares;
    L->spare_mask = d.spare_mask;
    L->nspare_stray = d.spares_stray;
    L->nspare_ignored = d.spares_ignored;
    L->arena_tmp = d.arena_tmp;
    L->ckpt_tmp = d.ckpt_tmp;
    L->deltas = calloc(d.deltas ? d.deltas : 1, sizeof *L->deltas);
    L->segs = calloc(d.segments ? d.segments : 1, sizeof *L->segs);
    if (!L->deltas || !L->segs) return PKV_ENOMEM;
    L->ndeltas = d.deltas;
    L->nsegs = d.segments;
    for (size_t i = 0; i < d.deltas; i++) {
        pkv_log_delta p;
        kd_delta *x = &L->deltas[i];
        if (pkv_logview_get_delta(v, i, &p)) return PKV_ENOMEM;
        x->no = p.no;
        x->state = p.state;
        x->lsn = p.lsn;
        x->secret = p.secret;
        x->file_size = p.file_bytes;
        x->mtime_ns = p.mtime_ns;
        x->raw = p.raw_bytes;
        x->body_sum = p.body_sum;
        x->prev_lsn = p.prev_lsn;
        x->prev_sum = p.prev_sum;
        x->fail = !p.decoded;
        x->sealed = p.sealed;
        x->freed = p.freed;
        x->sequences = p.sequences;
        snprintf(x->err, sizeof x->err, "%s", p.error);
    }
    return 0;
}

static void copy_log(const pkv_logview *v, kd_log *L) {
    for (size_t i = 0; i < L->nsegs; i++) {
        pkv_log_segment p;
        kd_seg *s = &L->segs[i];
        if (pkv_logview_get_segment(v, i, &p)) continue;
        s->no = p.no;
        s->file_size = p.file_bytes;
        s->valid = p.header == PKV_LOG_SEG_OK;
        s->foreign = p.header == PKV_LOG_SEG_FOREIGN;
        seg_why(&p, s->why, sizeof s->why);
        s->epoch = p.epoch;
        s->start = p.first_lsn;
        s->size = p.size;
        s->read = p.read;
        s->frames = p.frames;
        s->records = p.records;
        s->end_off = p.end.offset;
        s->end_reason = p.end.reason;
        if (p.read || p.end.next_lsn) end_words(&p.end, p.size, s->end_detail, sizeof s->end_detail);
        L->seg_bytes += s->file_size;
    }
    pkv_log_end e;
    pkv_log_stats st;
    pkv_logview_get_end(v, &e, &st);
    L->used_bytes = st.used_bytes;
    L->first_lsn = st.first_lsn;
    L->last_lsn = e.last_lsn;
    L->frames = st.frames;
    L->records = st.records;
    L->rec_bytes = st.record_bytes;
    L->replay_records = st.replay_records;
    L->replay_bytes = st.replay_bytes;
    L->torn_bytes = st.torn_bytes;
    L->skipped_bytes = st.skipped_bytes;
    L->end_reason = e.reason;
    if (e.reason == PKV_LOG_END_CORRUPT || e.reason == PKV_LOG_END_GAP ||
        e.reason == PKV_LOG_END_BAD_RECORD)
        L->corrupt_lsn = e.missing_lsn;
    if (e.reason == PKV_LOG_END_CORRUPT || e.reason == PKV_LOG_END_GAP)
        L->corrupt_next_lsn = e.next_lsn;
    if (e.reason != PKV_LOG_END_NONE) {
        L->end_seg = e.segment;
        L->end_off = e.offset;
        const kd_seg *s = NULL;
        for (size_t i = 0; i < L->nsegs && !s; i++)
            if (L->segs[i].no == e.segment) s = &L->segs[i];
        end_words(&e, s ? s->size : 0, L->end_detail, sizeof L->end_detail);
    }
}

typedef struct scanctx {
    kd_log *L;
    kd_rec_cb cb;
    void *ctx;
} scanctx;

static int scan_rec(void *vctx, const pkv_log_rec *r) {
    scanctx *sc = vctx;
    kd_logrec lr;
    lr.seg = r->segment;
    lr.off = r->offset;
    lr.len = r->len;
    lr.in_ckpt = r->in_checkpoint;
    lr.r = *r;
    return sc->cb(sc->ctx, sc->L, &lr);
}

int kd_log_scan(const char *dir, const kd_hdr *h, kd_log *L, kd_rec_cb cb, void *ctx,
                char *why, size_t wl) {
    memset(L, 0, sizeof *L);
    const pkv_log_arena a = {h->secret, h->block_size, h->capacity};
    const int live = writer_live(dir);
    pkv_logview *v;
    int rc = pkv_logview_open(dir, &a, live > 0 ? PKV_LOG_LIVE : live < 0 ? PKV_LOG_MAYBE_LIVE : 0,
                              &v);
    if (rc) {
        snprintf(why, wl, "%s", pkv_last_error());
        return rc;
    }
    if ((rc = copy_chain(v, L))) {
        snprintf(why, wl, "out of memory");
        pkv_logview_close(v);
        return rc;
    }
    L->last_lsn = L->chain_lsn;
    scanctx sc = {L, cb, ctx};
    rc = pkv_logview_read(v, cb ? scan_rec : NULL, &sc);
    if (rc < 0) /* the library's error (the callback's are positive) */
        snprintf(why, wl, "%s", pkv_last_error());
    copy_log(v, L);
    pkv_logview_close(v);
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
    "               seq_block, trunc, seq_close, bad, seal_run, evict_run (or\n"
    "               their numbers)\n"
    "  --stats      per-type counts and bytes instead of the records\n"
    "  --json       one JSON document (see docs/kvdump.md)\n";

typedef struct walctx {
    kd_ctx *x;
    uint64_t from, to;
    uint32_t types; /* bit per type; 0 = all */
    bool stats;
    uint64_t count[PKV_LOG_TYPE_MAX + 1], bytes[PKV_LOG_TYPE_MAX + 1];
    uint64_t shown;
} walctx;

static bool parse_types(const char *s, uint32_t *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        for (char *q = t; *q; q++) *q = (char)(*q == '-' ? '_' : toupper((unsigned char)*q));
        unsigned k = 0;
        for (unsigned i = 1; i <= PKV_LOG_TYPE_MAX; i++)
            if (!strcmp(t, pkv_logview_type_name(i))) k = i;
        uint64_t n;
        if (!k && kd_parse_u64(t, &n) && n >= 1 && n <= PKV_LOG_TYPE_MAX) k = (unsigned)n;
        if (!k) return false;
        *mask |= 1u << k;
    }
    return *mask != 0;
}

static void print_list(const uint8_t *p, uint32_t n) {
    enum { SHOW = 16 };
    putchar('[');
    for (uint32_t i = 0; i < n && i < SHOW; i++)
        printf(i ? " %u" : "%u", kd_get_u32(p + 4ull * i));
    if (n > SHOW) printf(" ...+%u", n - SHOW);
    putchar(']');
}

static void json_list(kj *j, const char *key, const uint8_t *p, uint32_t n) {
    kj_arr(j, key, true);
    for (uint32_t i = 0; i < n; i++) kj_u64(j, NULL, kd_get_u32(p + 4ull * i));
    kj_end_arr(j);
}

static int wal_rec(void *vctx, const kd_log *L, const kd_logrec *lr) {
    (void)L;
    walctx *w = vctx;
    const pkv_log_rec *r = &lr->r;
    if (r->lsn < w->from || r->lsn > w->to) return 0;
    if (w->types && !(w->types & (1u << r->type))) return 0;
    if (r->type <= PKV_LOG_TYPE_MAX) {
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
        kj_str(j, "type", pkv_logview_type_name(r->type));
        kj_bool(j, "in_checkpoint", lr->in_ckpt);
        switch (r->type) {
        case PKV_LOG_SEAL:
            kj_u64(j, "block", r->block);
            kj_block(j, "parent", r->parent);
            kj_u64(j, "salt", r->salt);
            kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)r->hash_hi,
                    (unsigned long long)r->hash_lo);
            kj_hex64(j, "payload_sum", r->payload_sum);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case PKV_LOG_EVICT:
        case PKV_LOG_BAD:
            kj_u64(j, "block", r->block);
            break;
        case PKV_LOG_SEAL_RUN:
            kj_u64(j, "salt", r->salt);
            kj_arr(j, "seals", false);
            for (uint32_t i = 0; i < r->nblocks; i++) {
                const uint8_t *e = r->blocks + (size_t)i * r->entry_bytes;
                kj_obj(j, NULL, true);
                kj_u64(j, "block", kd_get_u32(e));
                kj_block(j, "parent", kd_get_u32(e + 4));
                kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)kd_get_u64(e + 16),
                        (unsigned long long)kd_get_u64(e + 8));
                kj_hex64(j, "payload_sum", kd_get_u64(e + 24));
                json_list(j, "tokens", e + 32, r->ntok);
                kj_end_obj(j);
            }
            kj_end_arr(j);
            break;
        case PKV_LOG_EVICT_RUN:
            json_list(j, "blocks", r->blocks, r->nblocks);
            break;
        case PKV_LOG_SEQ_SET:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "salt", r->salt);
            kj_u64(j, "committed", r->committed);
            json_list(j, "blocks", r->blocks, r->nblocks);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case PKV_LOG_COMMIT:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "committed", r->committed);
            kj_u64(j, "first", r->first);
            json_list(j, "blocks", r->blocks, r->nblocks);
            kj_u64(j, "tail_off", r->tail_off);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case PKV_LOG_SEQ_BLOCK:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "index", r->index);
            kj_u64(j, "block", r->block);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case PKV_LOG_TRUNC:
            kj_u64(j, "seq", r->seq);
            kj_u64(j, "committed", r->committed);
            kj_block(j, "tail_block", r->block);
            json_list(j, "tokens", r->tokens, r->ntok);
            break;
        case PKV_LOG_SEQ_CLOSE:
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
           pkv_logview_type_name(r->type));
    switch (r->type) {
    case PKV_LOG_SEAL:
        printf("block %u parent ", r->block);
        if (r->parent == PKV_LOG_NONE) printf("-");
        else printf("%u", r->parent);
        printf(" salt %llu hash %016llx%016llx sum %016llx tokens ", (unsigned long long)r->salt,
               (unsigned long long)r->hash_hi, (unsigned long long)r->hash_lo,
               (unsigned long long)r->payload_sum);
        print_list(r->tokens, r->ntok);
        break;
    case PKV_LOG_EVICT:
    case PKV_LOG_BAD:
        printf("block %u", r->block);
        break;
    case PKV_LOG_SEAL_RUN: { /* block<-parent per entry (a root: the block alone);
                                hashes, sums and ids: --json */
        enum { SHOW = 16 };
        printf("salt %llu %u blocks [", (unsigned long long)r->salt, r->nblocks);
        for (uint32_t i = 0; i < r->nblocks && i < SHOW; i++) {
            const uint8_t *e = r->blocks + (size_t)i * r->entry_bytes;
            printf(i ? " %u" : "%u", kd_get_u32(e));
            if (kd_get_u32(e + 4) != PKV_LOG_NONE) printf("<-%u", kd_get_u32(e + 4));
        }
        if (r->nblocks > SHOW) printf(" ...+%u", r->nblocks - SHOW);
        putchar(']');
        break;
    }
    case PKV_LOG_EVICT_RUN:
        printf("blocks ");
        print_list(r->blocks, r->nblocks);
        break;
    case PKV_LOG_SEQ_SET:
        printf("seq %llu salt %llu committed %llu blocks ", (unsigned long long)r->seq,
               (unsigned long long)r->salt, (unsigned long long)r->committed);
        print_list(r->blocks, r->nblocks);
        printf(" tail ");
        print_list(r->tokens, r->ntok);
        break;
    case PKV_LOG_COMMIT:
        printf("seq %llu committed %llu first %u blocks ", (unsigned long long)r->seq,
               (unsigned long long)r->committed, r->first);
        print_list(r->blocks, r->nblocks);
        printf(" tail_off %u tail ", r->tail_off);
        print_list(r->tokens, r->ntok);
        break;
    case PKV_LOG_SEQ_BLOCK:
        printf("seq %llu index %u block %u tokens ", (unsigned long long)r->seq, r->index,
               r->block);
        print_list(r->tokens, r->ntok);
        break;
    case PKV_LOG_TRUNC:
        printf("seq %llu committed %llu tail_block ", (unsigned long long)r->seq,
               (unsigned long long)r->committed);
        if (r->block == PKV_LOG_NONE) printf("-");
        else printf("%u", r->block);
        printf(" tail ");
        print_list(r->tokens, r->ntok);
        break;
    case PKV_LOG_SEQ_CLOSE:
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
    for (unsigned t = 1; t <= PKV_LOG_TYPE_MAX; t++) {
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
        for (unsigned t = 1; t <= PKV_LOG_TYPE_MAX; t++) {
            kj_obj(j, pkv_logview_type_name(t), true);
            kj_u64(j, "count", w.count[t]);
            kj_u64(j, "bytes", w.bytes[t]);
            kj_end_obj(j);
        }
        kj_end_obj(j);
        kj_end_obj(j);
        kj_obj(j, "end", false);
        kj_u64(j, "last_lsn", L.last_lsn);
        if (L.end_reason != PKV_LOG_END_NONE) {
            kj_u64(j, "segment", L.end_seg);
            kj_u64(j, "offset", L.end_off);
        } else {
            kj_null(j, "segment");
            kj_null(j, "offset");
        }
        kj_str(j, "reason", kd_end_name(L.end_reason));
        kj_str(j, "detail", L.end_reason == PKV_LOG_END_NONE ? "no log segment to read" : L.end_detail);
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
            for (unsigned t = 1; t <= PKV_LOG_TYPE_MAX; t++)
                printf("%-10s %10llu %12llu %8.1f\n", pkv_logview_type_name(t),
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
        if (L.end_reason == PKV_LOG_END_NONE)
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

/*
 * test_logview.c — include/pagedkv_log.h, the read-only log reader, through the
 * public API only: it sees the log as recovery does (every record recovery
 * replays, where and why the log ends, the same corrupt LSN), and its calls fail
 * as documented. The arena's identity and geometry come from the arena header
 * (docs/format.md, "Header page"), as a tool outside the library reads them.
 */
#include "pagedkv_log.h"
#include "pkv_test.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(logview, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
#define CAP 64u

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static pkv_log_arena arena_of(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/arena", dir);
    uint8_t h[96];
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    cr_assert_eq(pread(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    close(fd);
    pkv_log_arena a = {le(h + 72, 8), (uint32_t)le(h + 28, 4), le(h + 40, 8)};
    return a;
}

/* A cache with n sequences opened and closed, one sync (one frame) each. */
static void build(const char *sub, char *dir, size_t dirlen, int n, pkv_stats *st)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    pt_path(dir, dirlen, sub);
    pkv_cache *c = pt_open_sub(sub, &o);
    uint32_t t[8];
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 8; k++) t[k] = (uint32_t)(1000 * i + k);
        PT_SEQ_OPEN(c, (uint64_t)i + 1, 0, t, 8);
        PT_OK(pkv_seq_close(c, (uint64_t)i + 1));
        PT_OK(pkv_sync(c));
    }
    *st = pt_stats(c);
    pt_close(c);
}

typedef struct seen {
    uint64_t n, last, first_seg_off[64], lsn_at[64];
    uint64_t seg;
    int ordered;
} seen;

static int count(void *ctx, const pkv_log_rec *r)
{
    seen *s = ctx;
    if (s->n && r->lsn != s->last + 1) s->ordered = 0;
    if (s->n < 64) {
        s->first_seg_off[s->n] = r->offset;
        s->lsn_at[s->n] = r->lsn;
    }
    s->seg = r->segment;
    s->last = r->lsn;
    s->n++;
    return 0;
}

Test(logview, reads_every_record_recovery_replays)
{
    char dir[512];
    pkv_stats st;
    build("a", dir, sizeof dir, 5, &st);
    pkv_log_arena a = arena_of(dir);
    pkv_logview *v = NULL;
    PT_OK(pkv_logview_open(dir, &a, 0, &v));
    seen s = {.ordered = 1};
    PT_OK(pkv_logview_read(v, count, &s));
    cr_assert(s.ordered, "records not in LSN order");
    cr_assert_eq(s.last, st.last_lsn);
    pkv_log_end e;
    pkv_log_stats ls;
    pkv_logview_get_end(v, &e, &ls);
    cr_assert_eq(e.reason, PKV_LOG_END_CLEAN);
    cr_assert_eq(e.last_lsn, st.last_lsn);
    cr_assert_eq(ls.records, s.n);
    cr_assert_eq(ls.torn_bytes, 0);
    pkv_log_dir d;
    pkv_logview_get_dir(v, &d);
    cr_assert(d.segments >= 1);
    pkv_log_segment sg;
    PT_OK(pkv_logview_get_segment(v, 0, &sg));
    cr_assert_eq(sg.header, PKV_LOG_SEG_OK);
    cr_assert(sg.read);
    /* Errors as documented. */
    PT_ERR(pkv_logview_read(v, count, &s), PKV_ESTATE);
    PT_ERR(pkv_logview_get_segment(v, d.segments, &sg), PKV_ERANGE);
    pkv_log_delta dl;
    PT_ERR(pkv_logview_get_delta(v, d.deltas, &dl), PKV_ERANGE);
    PT_ERR(pkv_logview_get_segment(v, 0, NULL), PKV_EINVAL);
    pkv_logview_close(v);
    PT_ERR(pkv_logview_open(dir, &a, 0x80, &v), PKV_EINVAL);
    cr_assert_null(v);
}

/* Damage inside one frame with valid frames after it: recovery fails naming an
 * LSN; the reader says corrupt at that LSN, and a point-in-time open stops there. */
Test(logview, names_the_corrupt_lsn_recovery_names)
{
    char dir[512];
    pkv_stats st;
    build("b", dir, sizeof dir, 6, &st);
    pkv_log_arena a = arena_of(dir);
    pkv_logview *v = NULL;
    PT_OK(pkv_logview_open(dir, &a, 0, &v));
    seen s = {.ordered = 1};
    PT_OK(pkv_logview_read(v, count, &s));
    pkv_logview_close(v);
    cr_assert(s.n >= 6);
    /* A byte inside a record in the middle of the log: its frame fails its checksum. */
    uint64_t k = s.n / 2, bad = s.lsn_at[k];
    char seg[600];
    snprintf(seg, sizeof seg, "%s/wal-%016llx", dir, (unsigned long long)s.seg);
    int fd = open(seg, O_RDWR);
    cr_assert(fd >= 0);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)s.first_seg_off[k] + 8), 1);
    b ^= 0x40;
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)s.first_seg_off[k] + 8), 1);
    close(fd);

    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *c = NULL;
    PT_ERR(pkv_open(dir, &o, &c), PKV_ECORRUPT);
    o.flags = PKV_OPEN_RDONLY | PKV_OPEN_POINT_IN_TIME;
    PT_OK(pkv_open(dir, &o, &c));
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    pkv_close(c);
    cr_assert(rec.corrupt_lsn > 0 && rec.corrupt_lsn <= bad);

    PT_OK(pkv_logview_open(dir, &a, 0, &v));
    PT_OK(pkv_logview_read(v, NULL, NULL));
    pkv_log_end e;
    pkv_logview_get_end(v, &e, NULL);
    cr_assert_eq(e.reason, PKV_LOG_END_CORRUPT, "end reason %d", e.reason);
    cr_assert_eq(e.missing_lsn, rec.corrupt_lsn);
    cr_assert_eq(e.last_lsn, rec.last_lsn);
    cr_assert(e.next_lsn > e.missing_lsn);
    pkv_logview_close(v);
}

/* Where the SEAL and EVICT records, and their runs, of a log lie (segment,
 * offset, length). */
typedef struct per_block_recs {
    uint64_t seg[4096], off[4096];
    uint32_t len[4096];
    unsigned type[4096];
    size_t n, seals, evicts, seal_runs, evict_runs;
} per_block_recs;

static int collect_per_block(void *ctx, const pkv_log_rec *r)
{
    per_block_recs *p = ctx;
    if (r->type != PKV_LOG_SEAL && r->type != PKV_LOG_EVICT && r->type != PKV_LOG_SEAL_RUN &&
        r->type != PKV_LOG_EVICT_RUN)
        return 0;
    if (p->n == 4096) return 0;
    p->seg[p->n] = r->segment;
    p->off[p->n] = r->offset;
    p->len[p->n] = r->len;
    p->type[p->n] = r->type;
    p->n++;
    if (r->type == PKV_LOG_SEAL) p->seals++;
    else if (r->type == PKV_LOG_EVICT) p->evicts++;
    else if (r->type == PKV_LOG_SEAL_RUN) p->seal_runs++;
    else p->evict_runs++;
    return 0;
}

/* The records written per block (SEAL, EVICT, and their runs SEAL_RUN,
 * EVICT_RUN) are encoded without clearing their payload first: their reserved
 * words ("u32 0", docs/format.md) and the padding (before the trailer, and in
 * each SEAL_RUN entry) must still be zero, also where the log buffer is reused
 * and held other records' bytes (many frames, evictions). Block size 5 gives SEAL
 * and each SEAL_RUN entry 4 bytes of padding, an odd EVICT_RUN 4 more. Every
 * other request commits block by block (single records), the rest at once (runs). */
Test(logview, per_block_records_keep_reserved_words_and_padding_zero)
{
    const uint32_t bs = 5;
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, bs, PKV_F32, 16);
    char dir[512];
    pt_path(dir, sizeof dir, "z");
    pkv_cache *c = pt_open_sub("z", &o);
    uint32_t t[4 * 5 + 1];
    pkv_slot sl[4 * 5 + 1];
    for (uint32_t i = 0; i < 60; i++) {
        for (uint32_t k = 0; k < 4 * bs + 1; k++) t[k] = 0xA5A5A500u + 977u * i + k;
        PT_SEQ_OPEN(c, i + 1, 0, t, 0);
        if (i % 2) {
            for (uint32_t k = 0; k < 4 * bs + 1; k += bs) {
                uint32_t m = 4 * bs + 1 - k < bs ? 4 * bs + 1 - k : bs;
                PT_OK(pkv_seq_append(c, i + 1, t + k, m, sl));
                PT_OK(pkv_seq_commit(c, i + 1, m));
            }
        } else {
            PT_OK(pkv_seq_append(c, i + 1, t, 4 * bs + 1, sl));
            PT_OK(pkv_seq_commit(c, i + 1, 4 * bs + 1));
        }
        PT_OK(pkv_seq_close(c, i + 1));
        if (i % 3 == 2) PT_OK(pkv_sync(c));
    }
    pkv_stats st = pt_stats(c);
    cr_assert(st.evictions > 100, "the workload evicts (%llu)", (unsigned long long)st.evictions);
    pt_close(c);

    pkv_log_arena a = arena_of(dir);
    pkv_logview *v = NULL;
    PT_OK(pkv_logview_open(dir, &a, 0, &v));
    per_block_recs *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    PT_OK(pkv_logview_read(v, collect_per_block, p));
    pkv_logview_close(v);
    cr_assert(p->seals > 100 && p->evicts > 50 && p->seal_runs > 20 && p->evict_runs > 20,
              "%zu SEAL, %zu EVICT, %zu SEAL_RUN, %zu EVICT_RUN records", p->seals, p->evicts,
              p->seal_runs, p->evict_runs);
    const size_t ent = 56; /* SEAL_RUN entry: 32 + 4 * 5 rounded up to 8 */
    for (size_t i = 0; i < p->n; i++) {
        char seg[600];
        snprintf(seg, sizeof seg, "%s/wal-%016llx", dir, (unsigned long long)p->seg[i]);
        int fd = open(seg, O_RDONLY);
        cr_assert(fd >= 0);
        uint8_t r[1024];
        cr_assert(p->len[i] <= sizeof r);
        cr_assert_eq(pread(fd, r, p->len[i], (off_t)p->off[i]), (ssize_t)p->len[i]);
        close(fd);
        /* payload from byte 16; the trailer is the last 8 bytes */
        size_t reserved = 0, end = 0, n = le(r + 16, 4);
        switch (p->type[i]) {
        case PKV_LOG_SEAL: reserved = 16 + 44; end = 16 + 48 + 4 * bs; break;
        case PKV_LOG_EVICT: reserved = 16 + 4; end = 16 + 8; break;
        case PKV_LOG_EVICT_RUN: reserved = 16 + 4; end = 16 + 8 + 4 * n; break;
        default: /* SEAL_RUN: no reserved word; each entry's padding */
            end = 16 + 16 + n * ent;
            cr_assert(n >= 2 && end + 8 <= p->len[i]);
            for (size_t e = 0; e < n; e++)
                cr_assert_eq(le(r + 32 + e * ent + 32 + 4 * bs, 4), 0,
                             "SEAL_RUN at offset %llu: entry %zu padding",
                             (unsigned long long)p->off[i], e);
        }
        if (reserved)
            cr_assert_eq(le(r + reserved, 4), 0, "%s at offset %llu: reserved word %#llx",
                         pkv_logview_type_name(p->type[i]), (unsigned long long)p->off[i],
                         (unsigned long long)le(r + reserved, 4));
        for (size_t k = end; k < p->len[i] - 8; k++)
            cr_assert_eq(r[k], 0, "%s at offset %llu: padding byte %zu is %#x",
                         pkv_logview_type_name(p->type[i]), (unsigned long long)p->off[i],
                         k, r[k]);
    }
    free(p);
}

/* Damaged cache directories: torn log tails, corrupted log frames (point-in-time
 * recovery), corrupted checkpoints, a deleted or truncated arena, overwritten block
 * payloads, recycled log segments holding stale frames.
 *
 * Most tests build a history in which every workload step ends with pkv_sync and the
 * flusher never runs on its own (group_commit_us = 10 s), so the log is a sequence of
 * frames whose boundaries are known step boundaries; the committed state after every
 * step is remembered together with stats.last_lsn, so "the state up to LSN x" is known
 * exactly. Damage is applied to a copy of the directory. */
#include "wal_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "pagedkv_inspect.h"

TestSuite(corrupt, .init = pt_setup, .fini = pt_teardown);

#define CAP 128u

static pkv_stats stats(pkv_cache *c)
{
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    return st;
}

static pkv_recovery recovery(pkv_cache *c)
{
    pkv_recovery r;
    WU_OK(pkv_get_recovery(c, &r));
    return r;
}

static void opts(pkv_options *o, uint64_t cap)
{
    wu_opts(o, WU_BS, cap, PKV_DURABLE_GROUP);
    o->group_commit_us = 10000000;
}

/* ---- A history with known step boundaries ------------------------------------------ */

typedef struct snap {
    uint64_t lsn; /* stats.last_lsn after the step */
    wu_model m;   /* committed state */
} snap;

typedef struct history {
    char dir[512];
    pkv_options o;
    snap *s;
    size_t n;
    wu_prompts ps;
    uint64_t ckpt_lsn; /* 0: no checkpoint */
    uint64_t final_lsn;
} history;

static void hist_record(history *h, pkv_cache *c, const wu_model *m)
{
    h->s = realloc(h->s, (h->n + 1) * sizeof *h->s);
    cr_assert_not_null(h->s);
    h->s[h->n].lsn = stats(c).last_lsn;
    wu_model_copy(&h->s[h->n].m, m);
    wu_model_drop_pending(&h->s[h->n].m);
    wu_model_sort(&h->s[h->n].m);
    h->n++;
}

/* The committed state after the last step that ended at LSN <= lsn. */
static const wu_model *hist_at(const history *h, uint64_t lsn)
{
    const wu_model *m = NULL;
    for (size_t i = 0; i < h->n; i++)
        if (h->s[i].lsn <= lsn) m = &h->s[i].m;
    cr_assert_not_null(m, "no state recorded at LSN %llu", (unsigned long long)lsn);
    return m;
}

static bool hist_boundary(const history *h, uint64_t lsn)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->s[i].lsn == lsn) return true;
    return false;
}

/* steps random steps, each followed by pkv_sync; a checkpoint after ckpt_at steps
 * (0: none); finally one decode step on an existing sequence, so the last frame holds
 * exactly one operation. */
static void hist_build(history *h, const char *sub, uint64_t seed, int steps, int ckpt_at)
{
    memset(h, 0, sizeof *h);
    pt_path(h->dir, sizeof h->dir, sub);
    opts(&h->o, CAP);
    pkv_cache *c = wu_open_ok(h->dir, &h->o);
    wu_wl w;
    wu_wl_init(&w, c, seed, &h->ps);
    w.max_seqs = 5;
    w.max_len = 48;
    hist_record(h, c, &w.m);
    for (int i = 0; i < steps; i++) {
        wu_step(&w);
        WU_OK(pkv_sync(c));
        hist_record(h, c, &w.m);
        if (i + 1 == ckpt_at) {
            WU_OK(pkv_checkpoint(c));
            h->ckpt_lsn = stats(c).checkpoint_lsn;
        }
    }
    /* the final operation: append + commit 3 tokens to the first sequence (or open one) */
    uint32_t t[3] = {4242, 4243, 4244};
    if (w.m.n) {
        wu_seq *s = &w.m.s[0];
        if (s->len > w.max_len) WU_OK(wu_do_truncate(&w, s->id, s->committed));
        WU_OK(wu_do_append(&w, w.m.s[0].id, t, 3, true));
    } else {
        WU_OK(wu_do_open(&w, 0, t, 3, 0, NULL));
    }
    WU_OK(pkv_sync(c));
    hist_record(h, c, &w.m);
    h->final_lsn = stats(c).last_lsn;
    pkv_close(c);
    wu_wl_free(&w);
}

static void hist_free(history *h)
{
    for (size_t i = 0; i < h->n; i++) wu_model_free(&h->s[i].m);
    free(h->s);
    wu_prompts_free(&h->ps);
}

static void scratch(char *out, size_t cap, const char *name)
{
    pt_path(out, cap, name);
    pt_rmrf(out);
}

/* Segment path inside a scratch copy named like the original's newest segment. */
static void seg_in(char *out, size_t cap, const char *dir, const char *orig_seg)
{
    const char *base = strrchr(orig_seg, '/');
    snprintf(out, cap, "%s%s", dir, base);
}

static void patch(const char *path, uint64_t off, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(pwrite(fd, bytes, n, (off_t)off), (ssize_t)n);
    close(fd);
}

static uint8_t read_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    uint8_t b = 0;
    cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1);
    close(fd);
    return b;
}

/* After recovery from damage: the state is `want`, the repaired state was made the new
 * base (a normal reopen reports nothing and recovers the same), and the cache keeps
 * working across another close/reopen. */
static void after_repair(pkv_cache *c, const char *dir, const pkv_options *o,
                         const wu_model *want, const wu_prompts *ps, uint64_t seed,
                         bool full, const char *what)
{
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s: recovered state", what);
    wu_verify_model(c, want, ctx);
    wu_probe_all(c, ps, want, NULL, ctx);
    pkv_close(c);
    pkv_options plain = *o;
    plain.flags = 0;
    c = wu_open_ok(dir, &plain);
    pkv_recovery rec = recovery(c);
    snprintf(ctx, sizeof ctx, "%s: normal reopen after repair", what);
    cr_assert(rec.torn_bytes == 0 && rec.corrupt_lsn == 0,
              "%s: torn %llu corrupt %llu (note: %s)", ctx, (unsigned long long)rec.torn_bytes,
              (unsigned long long)rec.corrupt_lsn, rec.note);
    wu_verify_model(c, want, ctx);
    if (!full) {
        pkv_close(c);
        return;
    }
    wu_wl w;
    wu_wl_init(&w, c, seed, NULL);
    w.max_seqs = 5;
    w.max_len = 48;
    for (int i = 0; i < 15; i++) wu_step(&w);
    pkv_close(c);
    wu_model_drop_pending(&w.m);
    c = wu_open_ok(dir, &plain);
    snprintf(ctx, sizeof ctx, "%s: after more work and another reopen", what);
    wu_verify_model(c, &w.m, ctx);
    rec = recovery(c);
    cr_assert(rec.torn_bytes == 0 && rec.corrupt_lsn == 0 && rec.note[0] == 0,
              "%s: torn %llu corrupt %llu note %s", ctx, (unsigned long long)rec.torn_bytes,
              (unsigned long long)rec.corrupt_lsn, rec.note);
    pkv_close(c);
    wu_wl_free(&w);
}

/* ---- (a) torn tail -------------------------------------------------------------------- */

Test(corrupt, torn_tail)
{
    history h;
    hist_build(&h, "hist", 101, 40, 15);
    char seg[600];
    cr_assert(wu_newest_seg(h.dir, seg, sizeof seg));
    wu_frame fr[1024];
    size_t nf = wu_frames(seg, fr, 1024);
    cr_assert(nf >= 3, "only %zu frames", nf);
    const wu_frame *last = &fr[nf - 1];
    cr_assert_eq(last->first_lsn + last->nrec - 1, h.final_lsn,
                 "the last frame does not end the log");
    uint64_t before = last->first_lsn - 1;
    cr_assert(hist_boundary(&h, before), "last frame does not start at a step boundary");
    const wu_model *want = hist_at(&h, before);
    uint64_t fo = last->off, fend = last->off + 32 + last->bytes;
    /* inside the header, just after it, inside the first record, mid-frame, inside
     * the last record's checksum */
    uint64_t cuts[] = {fo + 1, fo + 24, fo + 31, fo + 32, fo + 48, fo + 32 + last->bytes / 2,
                       fend - 8, fend - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++)
        for (int zero = 0; zero < 2; zero++) {
            char dir[512], sp[700], what[128];
            snprintf(what, sizeof what, "torn tail: %s at frame offset %llu of %llu",
                     zero ? "zeroed" : "truncated", (unsigned long long)(cuts[k] - fo),
                     (unsigned long long)(fend - fo));
            scratch(dir, sizeof dir, "torn");
            wu_copy_dir(h.dir, dir);
            seg_in(sp, sizeof sp, dir, seg);
            if (zero) {
                size_t n = (size_t)(fend - cuts[k]);
                uint8_t *z = calloc(1, n), *old = calloc(1, n);
                FILE *f = fopen(sp, "rb");
                cr_assert(f && fseek(f, (long)cuts[k], SEEK_SET) == 0 &&
                          fread(old, 1, n, f) == n);
                fclose(f);
                bool same = memcmp(old, z, n) == 0; /* e.g. a checksum byte already 0 */
                if (!same) patch(sp, cuts[k], z, n);
                free(z);
                free(old);
                if (same) { /* nothing torn: the frame is intact, skip this cut */
                    pt_rmrf(dir);
                    continue;
                }
            } else {
                cr_assert_eq(truncate(sp, (off_t)cuts[k]), 0);
            }
            pkv_cache *c = NULL;
            int rc = wu_open(dir, &h.o, &c);
            cr_assert_eq(rc, 0, "%s: open -> %d (%s: %s)", what, rc, pkv_strerror(rc),
                         pkv_last_error());
            WU_CHECK(c, what);
            pkv_recovery rec = recovery(c);
            cr_assert_eq(rec.last_lsn, before, "%s: recovered up to LSN %llu, expected %llu",
                         what, (unsigned long long)rec.last_lsn, (unsigned long long)before);
            cr_assert(rec.torn_bytes > 0 || cuts[k] < fo + 32,
                      "%s: the frame header is intact, yet torn_bytes is 0", what);
            cr_assert_eq(rec.corrupt_lsn, 0, "%s: corrupt_lsn %llu", what,
                         (unsigned long long)rec.corrupt_lsn);
            cr_assert_eq(rec.checkpoint_lsn, h.ckpt_lsn);
            after_repair(c, dir, &h.o, want, &h.ps, 7 + k, k % 4 == 0, what);
        }
    hist_free(&h);
}

/* The whole last frame missing (never written): nothing torn, just fewer records. */
Test(corrupt, lost_last_frame)
{
    history h;
    hist_build(&h, "hist", 102, 20, 0);
    char seg[600];
    cr_assert(wu_newest_seg(h.dir, seg, sizeof seg));
    wu_frame fr[1024];
    size_t nf = wu_frames(seg, fr, 1024);
    cr_assert(nf >= 3);
    for (size_t drop = 1; drop <= 3; drop++) {
        const wu_frame *f = &fr[nf - drop];
        char dir[512], sp[700], what[64];
        snprintf(what, sizeof what, "last %zu frames never written", drop);
        scratch(dir, sizeof dir, "lost");
        wu_copy_dir(h.dir, dir);
        seg_in(sp, sizeof sp, dir, seg);
        size_t len = 0;
        uint8_t *b = wu_read_file(sp, &len);
        memset(b + f->off, 0, len - f->off);
        wu_write_file(sp, b, len);
        free(b);
        pkv_cache *c = wu_open_ok(dir, &h.o);
        pkv_recovery rec = recovery(c);
        cr_assert(rec.last_lsn == f->first_lsn - 1 && rec.torn_bytes == 0 && rec.corrupt_lsn == 0,
                  "%s: last %llu torn %llu corrupt %llu", what, (unsigned long long)rec.last_lsn,
                  (unsigned long long)rec.torn_bytes, (unsigned long long)rec.corrupt_lsn);
        if (hist_boundary(&h, f->first_lsn - 1))
            after_repair(c, dir, &h.o, hist_at(&h, f->first_lsn - 1), &h.ps, 3, drop == 1, what);
        else
            pkv_close(c);
    }
    hist_free(&h);
}

/* ---- (b) a corrupted frame followed by valid ones ------------------------------------- */

static void corrupt_frame_case(const history *h, const char *seg, const wu_frame *f, uint64_t at,
                               bool full, const char *label)
{
    char dir[512], sp[700], what[160];
    snprintf(what, sizeof what, "%s: byte %llu of the frame at LSN %llu flipped", label,
             (unsigned long long)(at - f->off), (unsigned long long)f->first_lsn);
    scratch(dir, sizeof dir, "cf");
    wu_copy_dir(h->dir, dir);
    seg_in(sp, sizeof sp, dir, seg);
    uint8_t b = read_byte(sp, at) ^ 0x5a;
    patch(sp, at, &b, 1);

    /* a normal open refuses, naming the LSN */
    pkv_cache *c = NULL;
    int rc = wu_open(dir, &h->o, &c);
    cr_assert_eq(rc, PKV_ECORRUPT, "%s: open -> %d (%s: %s), expected PKV_ECORRUPT", what, rc,
                 pkv_strerror(rc), pkv_last_error());
    cr_assert_null(c);
    char lsn[64];
    snprintf(lsn, sizeof lsn, "LSN %llu", (unsigned long long)f->first_lsn);
    cr_assert(strstr(pkv_last_error(), lsn), "%s: error message does not name %s: %s", what, lsn,
              pkv_last_error());
    /* read-only too, and it changes nothing */
    wu_dirsnap ds;
    wu_dirsnap_take(&ds, dir);
    pkv_options ro = h->o;
    ro.flags = PKV_OPEN_RDONLY;
    rc = wu_open(dir, &ro, &c);
    cr_assert_eq(rc, PKV_ECORRUPT, "%s: read-only open -> %d", what, rc);
    ro.flags = PKV_OPEN_RDONLY | PKV_OPEN_POINT_IN_TIME;
    const wu_model *want = hist_at(h, f->first_lsn - 1);
    c = wu_open_ok(dir, &ro);
    cr_assert_eq(recovery(c).corrupt_lsn, f->first_lsn);
    wu_verify_model(c, want, what);
    pkv_close(c);
    wu_dirsnap_same(&ds, dir, "read-only point-in-time open");
    wu_dirsnap_free(&ds);

    /* point-in-time recovery */
    pkv_options pit = h->o;
    pit.flags = PKV_OPEN_POINT_IN_TIME;
    rc = wu_open(dir, &pit, &c);
    cr_assert_eq(rc, 0, "%s: PKV_OPEN_POINT_IN_TIME -> %d (%s: %s)", what, rc, pkv_strerror(rc),
                 pkv_last_error());
    WU_CHECK(c, what);
    pkv_recovery rec = recovery(c);
    cr_assert_eq(rec.corrupt_lsn, f->first_lsn, "%s: corrupt_lsn %llu", what,
                 (unsigned long long)rec.corrupt_lsn);
    cr_assert_eq(rec.last_lsn, f->first_lsn - 1, "%s: last_lsn %llu", what,
                 (unsigned long long)rec.last_lsn);
    cr_assert(rec.note[0], "%s: no recovery note", what);
    after_repair(c, dir, &h->o, want, &h->ps, 11, full, what);
}

Test(corrupt, corrupted_frame_point_in_time)
{
    history h;
    hist_build(&h, "hist", 103, 40, 10);
    char seg[600];
    cr_assert(wu_newest_seg(h.dir, seg, sizeof seg));
    wu_frame fr[1024];
    size_t nf = wu_frames(seg, fr, 1024);
    cr_assert(nf >= 6, "only %zu frames", nf);
    /* frames after the checkpoint, starting at a step boundary, not the last one */
    size_t cand[1024], nc = 0;
    for (size_t i = 0; i + 1 < nf; i++)
        if (fr[i].first_lsn > h.ckpt_lsn && hist_boundary(&h, fr[i].first_lsn - 1))
            cand[nc++] = i;
    cr_assert(nc >= 3, "only %zu candidate frames", nc);
    size_t picks[3] = {cand[0], cand[nc / 2], cand[nc - 1]};
    pt_rng r = {5};
    for (size_t k = 0; k < 3; k++) {
        const wu_frame *f = &fr[picks[k]];
        uint64_t end = f->off + 32 + f->bytes;
        /* magic, LSN, byte count, header checksum, a record header, last byte, random */
        uint64_t spots[] = {f->off + 1, f->off + 9, f->off + 21, f->off + 26, f->off + 40,
                            end - 1, f->off + 32 + pt_below(&r, f->bytes)};
        size_t ns = sizeof spots / sizeof *spots;
        for (size_t j = 0; j < ns; j++)
            if ((k == 1 && j % 2 == 0) || (k != 1 && j % 3 == 1))
                corrupt_frame_case(&h, seg, f, spots[j], j == 0, "corrupted frame");
    }
    hist_free(&h);
}

/* A corrupted frame whose records are all covered by the checkpoint: recovery does not
 * need them (it starts after the checkpoint LSN), so the open should succeed with the
 * full state -- failing, or point-in-time recovery discarding every intact record after
 * the checkpoint, loses committed work for nothing. */
Test(corrupt, corruption_before_checkpoint_is_harmless)
{
    history h;
    hist_build(&h, "hist", 104, 30, 20);
    char seg[600];
    cr_assert(wu_newest_seg(h.dir, seg, sizeof seg));
    wu_frame fr[1024];
    size_t nf = wu_frames(seg, fr, 1024);
    size_t k = 0; /* frames wholly covered by the checkpoint come first */
    while (k < nf && fr[k].first_lsn + fr[k].nrec - 1 <= h.ckpt_lsn) k++;
    cr_assert(k >= 2, "no frame before the checkpoint");
    const wu_frame *f = &fr[k / 2];
    char dir[512], sp[700];
    scratch(dir, sizeof dir, "cb");
    wu_copy_dir(h.dir, dir);
    seg_in(sp, sizeof sp, dir, seg);
    uint8_t b = read_byte(sp, f->off + 40) ^ 0x5a;
    patch(sp, f->off + 40, &b, 1);
    pkv_cache *c = NULL;
    int rc = wu_open(dir, &h.o, &c);
    cr_assert_eq(rc, 0,
                 "a flipped byte in the frame at LSN %llu..%llu, wholly covered by the checkpoint "
                 "(LSN %llu), makes the open fail: %d (%s: %s)",
                 (unsigned long long)f->first_lsn,
                 (unsigned long long)(f->first_lsn + f->nrec - 1),
                 (unsigned long long)h.ckpt_lsn, rc, pkv_strerror(rc), pkv_last_error());
    wu_verify_model(c, hist_at(&h, h.final_lsn), "corruption before the checkpoint");
    pkv_close(c);
    hist_free(&h);
}

/* ---- (c) corrupted checkpoint ---------------------------------------------------------- */

static bool newest_ckpt(const char *dir, char *out, size_t cap)
{
    char name[64] = "";
    size_t n = wu_count(dir, "ckpt-");
    if (!n) return false;
    /* one checkpoint file is kept */
    FILE *p;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s | grep '^ckpt-' | sort | tail -1", dir);
    p = popen(cmd, "r");
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(name, sizeof name, p));
    pclose(p);
    name[strcspn(name, "\n")] = 0;
    snprintf(out, cap, "%s/%s", dir, name);
    return true;
}

Test(corrupt, corrupted_checkpoint)
{
    history h;
    hist_build(&h, "hist", 105, 40, 30);
    char ck[700];
    cr_assert(newest_ckpt(h.dir, ck, sizeof ck));
    size_t len = 0;
    uint8_t *orig = wu_read_file(ck, &len);
    cr_assert(len > 64, "checkpoint of %zu bytes", len);
    pkv_options ro = h.o;
    ro.flags = PKV_OPEN_RDONLY;
    pkv_options pit = h.o;
    pit.flags = PKV_OPEN_POINT_IN_TIME;
    uint8_t *buf = malloc(len);
    cr_assert_not_null(buf);
    size_t tried = 0;
    for (size_t off = 0; off < len; off += off < 64 ? 1 : 5) {
        memcpy(buf, orig, len);
        buf[off] ^= (uint8_t)(1u << (off % 8));
        wu_write_file(ck, buf, len);
        const pkv_options *os[3] = {&h.o, &ro, &pit};
        for (int k = 0; k < 3; k++) {
            pkv_cache *c = NULL;
            int rc = wu_open(h.dir, os[k], &c);
            cr_assert_eq(rc, PKV_ECORRUPT,
                         "checkpoint with bit %zu of byte %zu flipped (%s open): %d (%s: %s)",
                         off % 8, off, k == 0 ? "normal" : k == 1 ? "read-only" : "point-in-time",
                         rc, pkv_strerror(rc), pkv_last_error());
            cr_assert_null(c);
        }
        tried++;
    }
    size_t cuts[] = {0, 1, 8, 56, 63, 64, 65, 72, len / 2, len - 8, len - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        wu_write_file(ck, orig, cuts[k]);
        pkv_cache *c = NULL;
        int rc = wu_open(h.dir, &h.o, &c);
        cr_assert_eq(rc, PKV_ECORRUPT, "checkpoint truncated to %zu of %zu bytes: %d (%s: %s)",
                     cuts[k], len, rc, pkv_strerror(rc), pkv_last_error());
        rc = wu_open(h.dir, &ro, &c);
        cr_assert_eq(rc, PKV_ECORRUPT, "read-only, checkpoint truncated to %zu: %d", cuts[k], rc);
    }
    /* restored: everything is back */
    wu_write_file(ck, orig, len);
    pkv_cache *c = wu_open_ok(h.dir, &h.o);
    cr_assert_eq(recovery(c).checkpoint_lsn, h.ckpt_lsn);
    wu_verify_model(c, hist_at(&h, h.final_lsn), "restored checkpoint");
    wu_probe_all(c, &h.ps, NULL, NULL, "restored checkpoint");
    pkv_close(c);
    free(buf);
    free(orig);
    hist_free(&h);
    cr_assert(tried > 64);
}

/* ---- (d) arena deleted ------------------------------------------------------------------- */

static void arena_deleted_case(bool with_ckpt)
{
    history h;
    hist_build(&h, with_ckpt ? "hist-ck" : "hist", 106, 30, with_ckpt ? 20 : 0);
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", h.dir);
    cr_assert_eq(unlink(arena), 0);
    pkv_cache *c = wu_open_ok(h.dir, &h.o);
    pkv_recovery rec = recovery(c);
    cr_assert(rec.note[0], "arena deleted: recovery note is empty");
    wu_model none = {0};
    wu_verify_model(c, &none, "arena deleted");
    pkv_stats st = stats(c);
    cr_assert(st.sequences == 0 && st.blocks_sealed == 0 && st.blocks_used == 0 &&
                  st.blocks_free == st.capacity,
              "arena deleted: %llu sequences, %llu sealed, %llu used, %llu free",
              (unsigned long long)st.sequences, (unsigned long long)st.blocks_sealed,
              (unsigned long long)st.blocks_used, (unsigned long long)st.blocks_free);
    for (size_t i = 0; i < h.ps.n; i++) {
        size_t nc = wu_probe(c, h.ps.p[i].salt, h.ps.p[i].tok, h.ps.p[i].n, "arena deleted");
        cr_assert_eq(nc, 0, "arena deleted: prompt %zu still hits %zu tokens", i, nc);
    }
    /* new work in the recreated arena survives reopens */
    wu_prompts ps = {0};
    wu_wl w;
    wu_wl_init(&w, c, 61, &ps);
    w.max_seqs = 5;
    w.max_len = 48;
    for (int i = 0; i < 40; i++) wu_step(&w);
    pkv_close(c);
    wu_model_drop_pending(&w.m);
    for (int round = 0; round < 2; round++) {
        char what[96];
        snprintf(what, sizeof what, "work after the arena was recreated, reopen %d", round + 1);
        c = wu_open_ok(h.dir, &h.o);
        rec = recovery(c);
        cr_assert(rec.sequences_dropped == 0 && rec.blocks_dropped == 0,
                  "%s: recovery dropped %llu sequences and %llu blocks again (note: %s)", what,
                  (unsigned long long)rec.sequences_dropped, (unsigned long long)rec.blocks_dropped,
                  rec.note);
        wu_verify_model(c, &w.m, what);
        pkv_close(c);
    }
    wu_wl_free(&w);
    wu_prompts_free(&ps);
    hist_free(&h);
}

Test(corrupt, arena_deleted) { arena_deleted_case(false); }
Test(corrupt, arena_deleted_with_checkpoint) { arena_deleted_case(true); }

/* ---- (e) arena truncated ------------------------------------------------------------------ */

/* Expected state when slots >= valid are lost: each sequence is cut before its first
 * block >= valid. */
static void cut_model(wu_model *m, pkv_cache *c_before_close, uint32_t valid, uint32_t bs)
{
    for (size_t i = 0; i < m->n; i++) {
        wu_seq *s = &m->s[i];
        uint32_t tab[256];
        size_t nb = 0;
        WU_OK(pkv_seq_blocks(c_before_close, s->id, tab, 256, &nb));
        size_t ncb = (s->committed + bs - 1) / bs;
        for (size_t j = 0; j < ncb; j++)
            if (tab[j] >= valid) {
                if (s->committed > j * bs) s->committed = j * bs;
                break;
            }
        s->len = s->committed;
    }
}

static void arena_truncated_case(uint64_t seed, bool open_tail_only)
{
    char dir[512];
    pt_path(dir, sizeof dir, "trunc");
    pt_rmrf(dir);
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_prompts ps = {0};
    wu_wl w;
    wu_wl_init(&w, c, seed, &ps);
    w.max_seqs = 3;
    w.max_len = 40;
    uint32_t valid;
    if (open_tail_only) {
        /* A: 17 tokens = blocks 0..3 sealed + block 4 holding 1 committed token;
         * B: 6 tokens = block 5 sealed + block 6 holding 2 committed tokens.
         * Cutting the arena after slot 5 loses only B's open tail block. */
        uint32_t a[17], b[6];
        for (int i = 0; i < 17; i++) a[i] = 500 + i;
        for (int i = 0; i < 6; i++) b[i] = 900 + i;
        WU_OK(wu_do_open(&w, 0, a, 17, 0, NULL));
        WU_OK(wu_do_open(&w, 0, b, 6, 0, NULL));
        valid = 6;
        uint32_t tab[4];
        size_t nb = 0;
        WU_OK(pkv_seq_blocks(c, w.m.s[1].id, tab, 4, &nb));
        cr_assert(nb == 2 && tab[1] == 6, "B's blocks are %u, %u", tab[0], tab[1]);
    } else {
        for (int i = 0; i < 120; i++) wu_step(&w);
        valid = 20 + (uint32_t)(seed % 20);
    }
    WU_OK(pkv_sync(c));
    wu_model want;
    wu_model_copy(&want, &w.m);
    cut_model(&want, c, valid, WU_BS);
    wu_model_sort(&want);
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    pkv_close(c);
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    cr_assert_eq(truncate(arena, (off_t)(4096 + (uint64_t)valid * inf.slot_bytes)), 0);

    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    cr_assert(rec.note[0], "arena cut after slot %u: no recovery note", valid);
    /* The short arena explains any sequence it cut: its note is the one kept. */
    cr_assert(!strncmp(rec.note, "arena file was short", 20), "arena cut after slot %u: note '%s'",
              valid, rec.note);
    wu_verify_model(c, &want, "arena truncated");
    /* no hit returns a lost slot: its K/V would be zeros, never a valid value */
    wu_probe_all(c, &ps, &want, NULL, "arena truncated");
    pkv_close(c);
    for (int round = 0; round < 2; round++) {
        c = wu_open_ok(dir, &o);
        wu_verify_model(c, &want, "reopen after recovering from a short arena");
        wu_probe_all(c, &ps, &want, NULL, "reopen after recovering from a short arena");
        pkv_close(c);
    }
    wu_model_free(&want);
    wu_wl_free(&w);
    wu_prompts_free(&ps);
}

Test(corrupt, arena_truncated)
{
    for (uint64_t s = 1; s <= 4; s++) arena_truncated_case(s, false);
}

Test(corrupt, arena_truncated_open_tail_only)
{
    arena_truncated_case(0, true);
}

/* ---- (f) overwritten payload of a sealed block --------------------------------------------- */

static void smash_block(const char *dir, uint32_t block, const pkv_cache_info *inf)
{
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    uint8_t junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0xC3 ^ i);
    patch(arena, 4096 + (uint64_t)block * inf->slot_bytes + inf->block_bytes / 3, junk, 64);
}

Test(corrupt, cached_block_payload_overwritten)
{
    char dir[512];
    pt_path(dir, sizeof dir, "smash");
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 7, NULL);
    uint32_t a[33];
    for (int i = 0; i < 33; i++) a[i] = 7000 + i;
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, a, 33, 0, &id));
    uint32_t tab[16];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 16, &nb));
    cr_assert_eq(nb, 9);
    WU_OK(wu_do_close(&w, id));
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    pkv_close(c);
    smash_block(dir, tab[5], &inf);

    c = wu_open_ok(dir, &o);
    cr_assert_eq(stats(c).verify_failures, 0, "blocks are verified lazily, on their first hit");
    size_t nc = wu_probe(c, 0, a, 33, "smashed block");
    cr_assert_eq(nc, 5 * WU_BS, "the hit must stop before the overwritten block (5 blocks), got %zu "
                 "tokens", nc);
    cr_assert_eq(stats(c).verify_failures, 1, "verify_failures %llu",
                 (unsigned long long)stats(c).verify_failures);
    nc = wu_probe(c, 0, a, 33, "smashed block, second probe");
    cr_assert_eq(nc, 5 * WU_BS);
    cr_assert_eq(stats(c).verify_failures, 1, "a bad block is verified once");
    /* a prompt sharing only the first 3 blocks is unaffected */
    nc = wu_probe(c, 0, a, 13, "prefix before the smashed block");
    cr_assert_eq(nc, 12);
    pkv_close(c);
    wu_wl_free(&w);
}

/* The block a live sequence holds fails verification at recovery: the sequence is cut
 * before it, the repaired state is checkpointed. */
Test(corrupt, sequence_block_payload_overwritten)
{
    char dir[512];
    pt_path(dir, sizeof dir, "smash2");
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 8, NULL);
    uint32_t a[30];
    for (int i = 0; i < 30; i++) a[i] = 8000 + i;
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, a, 30, 0, &id));
    uint32_t tab[16];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 16, &nb));
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    pkv_close(c);
    smash_block(dir, tab[4], &inf);
    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    cr_assert_eq(rec.seq_blocks_bad, 1);
    wu_model want;
    wu_model_copy(&want, &w.m);
    want.s[0].committed = want.s[0].len = 4 * WU_BS;
    wu_verify_model(c, &want, "sequence cut before its bad block");
    cr_assert_eq(wu_probe(c, 0, a, 30, "bad block"), 4 * WU_BS);
    pkv_close(c);
    c = wu_open_ok(dir, &o);
    wu_verify_model(c, &want, "reopen after the cut");
    pkv_close(c);
    wu_model_free(&want);
    wu_wl_free(&w);
}

/* The recovery note is empty only when nothing odd happened: a sequence cut at
 * recovery is named there (how many, which sequence, where, why). */
Test(corrupt, a_cut_sequence_is_named_in_the_recovery_note)
{
    char dir[512];
    pt_path(dir, sizeof dir, "smashnote");
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 8, NULL);
    uint32_t a[30];
    for (int i = 0; i < 30; i++) a[i] = 9000 + i;
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, a, 30, 0, &id));
    uint32_t tab[16];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 16, &nb));
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    pkv_close(c);
    smash_block(dir, tab[3], &inf);
    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    cr_assert_eq(rec.sequences_cut, 1);
    cr_assert(rec.note[0], "a sequence was cut, but the recovery note is empty");
    char want[128];
    snprintf(want, sizeof want, "cut 1 sequence: sequence %llu at entry 3 ",
             (unsigned long long)id);
    cr_assert(strstr(rec.note, want), "note '%s' does not say '%s'", rec.note, want);
    snprintf(want, sizeof want, "block %u failed its payload checksum", tab[3]);
    cr_assert(strstr(rec.note, want), "note '%s' does not say '%s'", rec.note, want);
    pkv_close(c);
    /* The cut was checkpointed: the next open has nothing to say. */
    c = wu_open_ok(dir, &o);
    rec = recovery(c);
    cr_assert(rec.note[0] == 0 && rec.sequences_cut == 0, "second open: note '%s'", rec.note);
    pkv_close(c);
    wu_wl_free(&w);
}

/* After a bad block was found, the prompt is recomputed: a new block with the same
 * content is sealed beside the bad one. Both are in the log as sealed; after the next
 * reopen the cache must still be consistent (pkv_check) and serve the good copy. */
Test(corrupt, recomputed_bad_block_survives_reopen)
{
    char dir[512];
    pt_path(dir, sizeof dir, "smash3");
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 9, NULL);
    uint32_t a[33];
    for (int i = 0; i < 33; i++) a[i] = 9000 + i;
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, a, 33, 0, &id));
    uint32_t tab[16];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 16, &nb));
    WU_OK(wu_do_close(&w, id));
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    pkv_close(c);
    smash_block(dir, tab[5], &inf);
    c = wu_open_ok(dir, &o);
    wu_wl_reattach(&w, c);
    WU_OK(wu_do_open(&w, 0, a, 33, 0, &id)); /* hits 5 blocks, recomputes the rest */
    cr_assert_eq(stats(c).verify_failures, 1);
    WU_CHECK(c, "after recomputing");
    WU_OK(wu_do_close(&w, id));
    pkv_close(c);
    pkv_cache *c2 = NULL;
    int rc = wu_open(dir, &o, &c2);
    cr_assert_eq(rc, 0);
    char why[512] = "";
    rc = pkv_check(c2, why, sizeof why);
    cr_assert_eq(rc, 0, "reopen after a bad block was recomputed: pkv_check: %s", why);
    cr_assert_eq(wu_probe(c2, 0, a, 33, "recomputed"), 32);
    pkv_close(c2);
    wu_wl_free(&w);
}

/* The same content goes bad twice: a block fails verification, its recomputed
 * copy fails too, and a third copy is sealed. The log then names two identical
 * BAD blocks. Recovery keeps one BAD copy beside the good one and drops the
 * other, with the blocks chained below it. k identical BAD blocks kept would
 * share one prefix-index run, and so would their children, so both the rebuild
 * and pkv_check would cost O(k²). */
Test(corrupt, a_second_bad_copy_is_dropped_at_recovery)
{
    char dir[512];
    pt_path(dir, sizeof dir, "smash4");
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 10, NULL);
    uint32_t a[33];
    for (int i = 0; i < 33; i++) a[i] = 9500 + i;
    uint64_t id = 0;
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    for (int round = 0; round < 2; round++) {
        WU_OK(wu_do_open(&w, 0, a, 33, 0, &id)); /* round 1: hits 5 blocks, recomputes */
        uint32_t tab[16];
        size_t nb = 0;
        WU_OK(pkv_seq_blocks(c, id, tab, 16, &nb));
        cr_assert_eq(nb, 9);
        WU_OK(wu_do_close(&w, id));
        pkv_close(c);
        smash_block(dir, tab[5], &inf);
        c = wu_open_ok(dir, &o);
        wu_wl_reattach(&w, c);
    }
    WU_OK(wu_do_open(&w, 0, a, 33, 0, &id)); /* finds the second copy bad, seals a third */
    cr_assert_eq(stats(c).verify_failures, 1);
    WU_OK(wu_do_close(&w, id));
    uint64_t sealed = stats(c).blocks_sealed;
    pkv_close(c);
    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    /* One of the two BAD copies, and its two full children. */
    cr_assert_eq(rec.blocks_dropped, 3, "dropped %llu", (unsigned long long)rec.blocks_dropped);
    cr_assert_eq(stats(c).blocks_sealed, sealed - 3);
    WU_CHECK(c, "one BAD copy kept");
    cr_assert_eq(wu_probe(c, 0, a, 33, "third copy"), 32);
    pkv_close(c);
    wu_wl_free(&w);
}

/* ---- (g) recycled segments with stale frames ------------------------------------------- */

static uint64_t newest_seg_no(const char *dir)
{
    char p[600];
    if (!wu_newest_seg(dir, p, sizeof p)) return 0;
    return strtoull(strrchr(p, '-') + 1, NULL, 16);
}

/* Does the newest segment hold frames of an earlier life (another epoch)? */
static bool newest_has_stale_frames(const char *dir)
{
    char p[600];
    if (!wu_newest_seg(dir, p, sizeof p)) return false;
    size_t len = 0;
    uint8_t *b = wu_read_file(p, &len);
    bool stale = false;
    uint32_t epoch, magic, e;
    memcpy(&epoch, b + 12, 4);
    for (size_t off = 64; off + 8 <= len && !stale; off += 8) {
        memcpy(&magic, b + off, 4);
        memcpy(&e, b + off + 4, 4);
        stale = magic == 0x46564b50u && e != epoch;
    }
    free(b);
    return stale;
}

/* Segments are recycled after checkpoints (renamed to wal-spare-*, then reused with a
 * new epoch and a new header), so the segment being written often still holds frames
 * of its previous life after the valid tail. Reopening then must neither replay them
 * nor take them for a torn tail or corruption. */
Test(corrupt, stale_recycled_segments)
{
    char dir[512];
    pt_path(dir, sizeof dir, "stale");
    pkv_options o;
    wu_opts(&o, WU_BS, 512, PKV_DURABLE_GROUP);
    o.checkpoint_bytes = 6u << 20;
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_prompts ps = {0};
    wu_wl w;
    wu_wl_init(&w, c, 71, &ps);
    for (int i = 0; i < 30; i++) wu_step(&w);
    static uint32_t longp[1201];
    pt_rng r = {98};
    for (size_t i = 0; i < 1201; i++) longp[i] = pt_below(&r, 30000);
    uint64_t lid = 0;
    WU_OK(wu_do_open(&w, 0, longp, 1201, 0, &lid));
    w.next_id += 2;
    w.keep_id = lid;
    uint64_t reopened_at = 0;
    int stale_reopens = 0;
    for (int k = 0; k < 80 && stale_reopens < 3; k++) {
        wu_churn(c, lid, 4u << 20);
        for (int i = 0; i < 3; i++) wu_step(&w);
        uint64_t now = newest_seg_no(dir);
        if (now == reopened_at || !newest_has_stale_frames(dir)) continue;
        char what[96];
        snprintf(what, sizeof what, "reopen with stale frames in the current segment %llu",
                 (unsigned long long)now);
        WU_CHECK(c, what);
        wu_model_sort(&w.m);
        size_t np = ps.n + w.m.n;
        size_t *h1 = calloc(np + 1, sizeof *h1), *h2 = calloc(np + 1, sizeof *h2);
        wu_probe_all(c, &ps, &w.m, h1, what);
        pkv_close(c);
        c = wu_open_ok(dir, &o);
        wu_wl_reattach(&w, c);
        pkv_recovery rec = recovery(c);
        cr_assert(rec.torn_bytes == 0 && rec.corrupt_lsn == 0 && rec.note[0] == 0,
                  "%s: torn %llu corrupt %llu note '%s'", what, (unsigned long long)rec.torn_bytes,
                  (unsigned long long)rec.corrupt_lsn, rec.note);
        wu_verify_model(c, &w.m, what);
        wu_probe_all(c, &ps, &w.m, h2, what);
        for (size_t i = 0; i < np; i++)
            cr_assert_eq(h1[i], h2[i], "%s: probe %zu hits %zu, before %zu", what, i, h2[i], h1[i]);
        free(h1);
        free(h2);
        stale_reopens++;
        reopened_at = now;
        cr_assert(wu_count(dir, "wal-") <= 5, "%zu log files", wu_count(dir, "wal-"));
    }
    cr_assert(stale_reopens >= 2, "only %d reopens with stale frames in the current segment",
              stale_reopens);
    pkv_close(c);
    wu_wl_free(&w);
    wu_prompts_free(&ps);
}

/* ---- Stray files named almost like log segments or checkpoints ------------------------ */

/* Only `wal-` or `ckpt-` followed by exactly 16 lowercase hex digits, as the library
 * writes them, are log segments and checkpoints. A backup copy, a hand-renamed file or
 * any other look-alike in the directory must be left alone: before, sscanf's %16llx
 * accepted "0x", a sign, leading blanks and a non-hex tail, so "ckpt-fffffffffffff.xx"
 * named the newest checkpoint, one that does not exist, and the open failed. */
Test(corrupt, stray_lookalike_names_are_ignored)
{
    char dir[512];
    pt_path(dir, sizeof dir, "stray");
    pkv_options o;
    opts(&o, CAP);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_prompts ps = {0};
    wu_wl w;
    wu_wl_init(&w, c, 81, &ps);
    for (int i = 0; i < 40; i++) wu_step(&w);
    WU_OK(pkv_checkpoint(c));
    for (int i = 0; i < 40; i++) wu_step(&w);
    wu_model_drop_pending(&w.m);
    pkv_close(c);
    static const char *const stray[] = {
        "wal-0x00000000000001",  /* hex prefix: was segment 1 again */
        "wal-00000000000001.b",  /* a backup suffix: was segment 1 */
        "wal- 000000000000002",  /* a blank: was segment 2 */
        "wal-+000000000000003",  /* a sign: was segment 3 */
        "wal-000000000000000G",  /* not hex */
        "wal-000000000000000A",  /* upper case: not a name the library writes */
        "ckpt-fffffffffffff.xx", /* was the newest checkpoint */
        "ckpt-0x00000000ffffff", /* was checkpoint 0xffffff */
        "ckpt-00000000000000zz", /* was checkpoint 0 */
    };
    char path[1024];
    for (size_t i = 0; i < sizeof stray / sizeof *stray; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, stray[i]);
        wu_write_file(path, (const uint8_t *)"not a pagedkv file\n", 19);
    }
    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    cr_assert(rec.note[0] == 0 && !rec.repaired && rec.checkpoint_lsn > 0,
              "note '%s', repaired %d, checkpoint %llu", rec.note, rec.repaired,
              (unsigned long long)rec.checkpoint_lsn);
    wu_wl_reattach(&w, c);
    wu_verify_model(c, &w.m, "reopened beside stray files");
    WU_CHECK(c, "reopened beside stray files");
    for (int i = 0; i < 20; i++) wu_step(&w);
    WU_OK(pkv_checkpoint(c)); /* deletes older checkpoints, and nothing else */
    pkv_close(c);
    for (size_t i = 0; i < sizeof stray / sizeof *stray; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, stray[i]);
        size_t len = 0;
        uint8_t *b = wu_read_file(path, &len);
        cr_assert(b && len == 19 && !memcmp(b, "not a pagedkv file\n", 19), "%s was changed",
                  stray[i]);
        free(b);
    }
    c = wu_open_ok(dir, &o);
    wu_wl_reattach(&w, c);
    wu_verify_model(c, &w.m, "second reopen");
    pkv_close(c);
    wu_wl_free(&w);
    wu_prompts_free(&ps);
}

/* ---- (h) a segment of overlapping frame candidates -------------------------------------- */

/* After the valid log, recovery scans for a valid frame to tell a torn tail from
 * corruption, and checksums each candidate (frame magic and epoch at an aligned
 * offset) over its claimed length. A segment of repeated [magic][epoch] words,
 * the epoch read as each candidate's length, makes every offset one: O(len²)
 * to rule them all out, and then the open would cut it silently as a torn tail. The scan stops at a budget
 * no real log reaches; the open refuses (PKV_ECORRUPT: whether valid records
 * follow is unknown) and point-in-time recovers everything before it. */
Test(corrupt, overlapping_frame_candidates_are_bounded)
{
    char dir[512];
    pt_path(dir, sizeof dir, "overlap");
    pkv_options o;
    opts(&o, CAP);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 91, NULL);
    for (int i = 0; i < 60; i++) wu_step(&w);
    wu_model_drop_pending(&w.m);
    WU_OK(pkv_sync(c));
    uint64_t last = stats(c).last_lsn;
    pkv_close(c);

    /* The next segment, continuing the log at last + 1 with a valid header. */
    char newest[600], path[700];
    cr_assert(wu_newest_seg(dir, newest, sizeof newest));
    size_t hlen = 0;
    uint8_t *h = wu_read_file(newest, &hlen);
    cr_assert(h && hlen >= 64);
    uint64_t no = strtoull(strrchr(newest, '-') + 1, NULL, 16) + 1;
    const size_t len = 1u << 20;
    const uint32_t epoch = (uint32_t)(len / 2) & ~7u;
    uint8_t *s = calloc(1, len);
    cr_assert(s);
    memcpy(s, h, 64); /* magic, version, secret, reserved */
    free(h);
    memcpy(s + 12, &epoch, 4);
    memcpy(s + 16, &no, 8);
    uint64_t start = last + 1, size = len;
    memcpy(s + 24, &start, 8);
    memcpy(s + 40, &size, 8);
    uint64_t sum = XXH3_64bits(s, 56);
    memcpy(s + 56, &sum, 8);
    const uint32_t magic = 0x46564b50u; /* "PKVF" */
    for (size_t off = 64; off + 8 <= len; off += 8) {
        memcpy(s + off, &magic, 4);
        memcpy(s + off + 4, &epoch, 4);
    }
    snprintf(path, sizeof path, "%s/wal-%016llx", dir, (unsigned long long)no);
    wu_write_file(path, s, len);
    free(s);

    c = NULL;
    int rc = wu_open(dir, &o, &c);
    cr_assert_eq(rc, PKV_ECORRUPT, "open -> %d (%s)", rc, rc ? pkv_last_error() : "opened");
    cr_assert(strstr(pkv_last_error(), "overlapping frame candidates"), "%s", pkv_last_error());
    o.flags |= PKV_OPEN_POINT_IN_TIME;
    c = wu_open_ok(dir, &o);
    pkv_recovery rec = recovery(c);
    cr_assert_eq(rec.corrupt_lsn, last + 1);
    cr_assert_eq(rec.last_lsn, last);
    wu_wl_reattach(&w, c);
    wu_verify_model(c, &w.m, "point-in-time before the candidates");
    pkv_close(c);
    wu_wl_free(&w);
}

/* ---- The slot stride (arena format versions 1 and 2) ------------------------------- */

/* Rewrite an arena's header as version `ver` with slot stride `slot` (checksum fixed),
 * and set the file to `size` bytes when size > 0. */
static void restride(const char *arena, uint32_t ver, uint64_t slot, uint64_t size)
{
    size_t len = 0;
    uint8_t *f = wu_read_file(arena, &len);
    cr_assert(f && len >= 4096);
    uint8_t h[4096];
    memcpy(h, f, sizeof h);
    free(f);
    memcpy(h + 8, &ver, 4);
    memcpy(h + 56, &slot, 8);
    uint64_t sum = XXH3_64bits(h, 4088);
    memcpy(h + 4088, &sum, 8);
    patch(arena, 0, h, sizeof h);
    if (size) cr_assert_eq(truncate(arena, (off_t)size), 0, "resize %s", arena);
}

/* A cache created before version 2 (page-sized slots for its 512-byte blocks) keeps
 * its stride across opens: its K/V sits at 4096 + block * 4096 in the file, is
 * verified (rule S1) and served after a reopen, and the header still says version 1.
 * Without the stored stride the open refuses the file or reads K/V from the wrong
 * offsets, and the verification (or the model's K/V check) fails. */
Test(corrupt, a_version_1_arena_keeps_its_page_sized_slots)
{
    char dir[512], arena[600];
    pt_path(dir, sizeof dir, "v1");
    snprintf(arena, sizeof arena, "%s/arena", dir);
    pkv_options o;
    opts(&o, 64);
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    cr_assert_eq(inf.block_bytes, 512, "the test's geometry changed");
    cr_assert_eq(inf.slot_bytes, 512, "a new arena of 512-byte blocks packs 8 to a page");
    cr_assert_eq(read_byte(arena, 8), 2, "a dense arena is version 2");
    pkv_close(c);
    /* What the previous library wrote for the same geometry. */
    restride(arena, 1, 4096, 4096 + 64ull * 4096);

    c = wu_open_ok(dir, &o);
    WU_OK(pkv_info(c, &inf));
    cr_assert_eq(inf.slot_bytes, 4096, "the stored stride is kept");
    wu_prompts ps = {0};
    wu_wl w;
    wu_wl_init(&w, c, 77, &ps);
    w.max_seqs = 4;
    w.max_len = 40;
    for (int i = 0; i < 60; i++) wu_step(&w); /* 64 blocks: slots reused */
    WU_OK(pkv_sync(c));
    /* A sealed block's K/V is in the file at the version-1 offset. */
    uint32_t sealed = UINT32_MAX;
    for (uint32_t b = 0; b < 64 && sealed == UINT32_MAX; b++) {
        pkv_block_info bi;
        if (pkv_inspect_block(c, b, &bi) == 0 && bi.state == PKV_BLOCK_SEALED) sealed = b;
    }
    cr_assert_neq(sealed, UINT32_MAX, "no sealed block after the workload");
    uint8_t *kv = pkv_kv(c, sealed, 0, PKV_K, 0);
    uint8_t *want = malloc(inf.block_bytes);
    memcpy(want, kv, inf.block_bytes);
    pkv_close(c);
    wu_model_drop_pending(&w.m);
    size_t len = 0;
    uint8_t *f = wu_read_file(arena, &len);
    cr_assert_eq(len, 4096 + 64ull * 4096, "the arena's size changed: %zu", len);
    cr_assert_eq(f[8], 1, "the header was rewritten");
    cr_assert(!memcmp(f + 4096 + (uint64_t)sealed * 4096, want, inf.block_bytes),
              "block %u's K/V is not at its version-1 offset", sealed);
    free(f);
    free(want);

    c = wu_open_ok(dir, &o);
    WU_OK(pkv_info(c, &inf));
    cr_assert_eq(inf.slot_bytes, 4096);
    wu_verify_model(c, &w.m, "reopened version-1 arena");
    size_t *hits = calloc(ps.n + w.m.n + 1, sizeof *hits), total = 0;
    wu_probe_all(c, &ps, &w.m, hits, "reopened version-1 arena");
    for (size_t i = 0; i < ps.n + w.m.n; i++) total += hits[i];
    cr_assert_gt(total, 0, "no prefix hit to check");
    free(hits);
    WU_CHECK(c, "reopened version-1 arena");
    pkv_close(c);
    wu_wl_free(&w);
    wu_prompts_free(&ps);
}

/* A stride that is not the one its version stands for, or a version after 2, is
 * refused (the file is left as it is): a reader must never address blocks at a
 * stride the writer did not use. */
Test(corrupt, a_stride_that_disagrees_with_its_version_is_refused)
{
    char dir[512], arena[600];
    pt_path(dir, sizeof dir, "stride");
    snprintf(arena, sizeof arena, "%s/arena", dir);
    pkv_options o;
    opts(&o, 64);
    pkv_close(wu_open_ok(dir, &o));
    size_t len0 = 0;
    uint8_t *orig = wu_read_file(arena, &len0);
    const struct {
        uint32_t ver;
        uint64_t slot;
        int err;
    } bad[] = {
        {1, 512, PKV_ECORRUPT},  /* version 1 is page-sized */
        {2, 4096, PKV_ECORRUPT}, /* version 2 is the dense stride */
        {2, 1024, PKV_ECORRUPT}, /* neither */
        {2, 0, PKV_ECORRUPT},    {1, 8192, PKV_ECORRUPT},
        {3, 512, PKV_EVERSION},  {0, 512, PKV_EVERSION},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        restride(arena, bad[i].ver, bad[i].slot, 0);
        size_t len = 0;
        uint8_t *before = wu_read_file(arena, &len);
        pkv_cache *c = NULL;
        int rc = wu_open(dir, &o, &c);
        cr_assert_eq(rc, bad[i].err, "version %u stride %llu: open gave %d (%s)", bad[i].ver,
                     (unsigned long long)bad[i].slot, rc, pkv_last_error());
        cr_assert_null(c);
        size_t len2 = 0;
        uint8_t *after = wu_read_file(arena, &len2);
        cr_assert(len == len2 && !memcmp(before, after, len), "case %zu changed the arena", i);
        free(before);
        free(after);
    }
    patch(arena, 0, orig, 4096);
    free(orig);
    pkv_close(wu_open_ok(dir, &o));
}

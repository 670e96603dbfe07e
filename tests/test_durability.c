/*
 * test_durability.c — durability rules of the log (src/wal/log.c) that need an
 * I/O backend which watches or fails calls, or the library's internals:
 *  - log_segment_bytes: small segments, reopened with another size;
 *  - in NONE mode, leaving a full segment syncs the arena before the segment, so
 *    no COMMIT becomes durable ahead of the K/V it names (power-loss backend);
 *  - an open after an unclean end syncs the recovered log and the arena before the
 *    first durability claim;
 *  - a checkpoint that runs out of space leaves the cache serving;
 *  - REC_MAX_BYTES is enforced when records are built and when they are read.
 */
#include "wal_util.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(durability, .init = pt_setup, .fini = pt_teardown);

static pkv_stats_t stats(pkv_cache *c)
{
    pkv_stats_t st;
    WU_OK(pkv_stats(c, &st));
    return st;
}

/* A long committed sequence (so each fork logs a big SEQ_SET) in workload w. */
static uint64_t long_seq(wu_wl *w, size_t n, uint64_t seed)
{
    uint32_t *p = malloc(n * sizeof *p);
    cr_assert(p);
    pt_rng r = {seed};
    for (size_t i = 0; i < n; i++) p[i] = pt_below(&r, 30000);
    uint64_t id = 0;
    WU_OK(wu_do_open(w, 0, p, n, 0, &id));
    w->next_id += 2; /* wu_churn uses id + 1 */
    w->keep_id = id;
    free(p);
    return id;
}

/* Every wal-<n> file of dir: its size, and the allocated size its header gives. */
static size_t seg_sizes(const char *dir, uint64_t *file, uint64_t *hdr, size_t max)
{
    size_t n = 0;
    for (uint64_t no = 1; no < 4096 && n < max; no++) {
        char p[600];
        snprintf(p, sizeof p, "%s/wal-%016llx", dir, (unsigned long long)no);
        struct stat st;
        if (stat(p, &st)) continue;
        size_t len = 0;
        uint8_t *b = wu_read_file(p, &len);
        cr_assert(len >= 64);
        file[n] = (uint64_t)st.st_size;
        hdr[n] = pkv_get_u64(b + 40);
        free(b);
        n++;
    }
    return n;
}

/* ---- log_segment_bytes ------------------------------------------------------------ */

Test(durability, small_segments_recover_with_another_size)
{
    char dir[512];
    pt_path(dir, sizeof dir, "small");
    pkv_options o;
    wu_opts(&o, WU_BS, 512, PKV_DURABLE_GROUP);
    o.log_segment_bytes = 1u << 20;
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 7, NULL);
    for (int i = 0; i < 40; i++) wu_step(&w);
    uint64_t lid = long_seq(&w, 1201, 5);
    wu_churn(c, lid, 6u << 20); /* five or more 1 MiB segments of log */
    for (int i = 0; i < 20; i++) wu_step(&w);
    WU_OK(pkv_sync(c));
    uint64_t fs[64], hs[64];
    size_t n = seg_sizes(dir, fs, hs, 64);
    cr_assert(n >= 5, "%zu segments for 6 MiB of log in 1 MiB segments", n);
    /* a frame larger than 1 MiB would get a segment of its own size: the flusher
     * takes the buffer at a quarter segment, so none is */
    for (size_t i = 0; i < n; i++)
        cr_assert(fs[i] == 1u << 20 && hs[i] == 1u << 20, "segment %zu: file %llu, header %llu",
                  i, (unsigned long long)fs[i], (unsigned long long)hs[i]);
    cr_assert(stats(c).checkpoints == 0, "no checkpoint: recovery reads every segment");
    /* a crash image (no close-time checkpoint), reopened with the default size:
     * every 1 MiB segment is read at the size its header gives */
    pkv_options o2 = o;
    o2.log_segment_bytes = 0;
    uint64_t last = stats(c).last_lsn; /* every record is replayed, none from a checkpoint */
    wu_crash_image_recovers(c, &w, dir, &o2, 0, last, "1 MiB segments, default on reopen");

    /* the directory itself, reopened with the default: the tail segment keeps its
     * 1 MiB, the next one is 32 MiB */
    c = wu_open_ok(dir, &o2);
    wu_churn(c, lid, 2u << 20);
    WU_OK(pkv_sync(c));
    n = seg_sizes(dir, fs, hs, 64);
    cr_assert(fs[n - 1] == 32u << 20 && hs[n - 1] == 32u << 20, "newest segment %llu / %llu",
              (unsigned long long)fs[n - 1], (unsigned long long)hs[n - 1]);
    cr_assert(hs[n - 2] == 1u << 20);
    WU_OK(pkv_checkpoint(c)); /* retires the 1 MiB segments: spares of 1 MiB */
    cr_assert(wu_count(dir, "wal-spare-") >= 1);
    pkv_close(c);
    /* a reopen with 1 MiB segments keeps them (they fit) ... */
    c = wu_open_ok(dir, &o);
    size_t spares = wu_count(dir, "wal-spare-");
    cr_assert(spares >= 1, "1 MiB spares kept by a 1 MiB open");
    pkv_close(c);
    /* ... one with 32 MiB deletes them instead of recycling a 1 MiB file as a
     * 32 MiB segment */
    c = wu_open_ok(dir, &o2);
    cr_assert(wu_count(dir, "wal-spare-") == 0, "%zu spares of the wrong size kept",
              wu_count(dir, "wal-spare-"));
    pkv_close(c);
}

Test(durability, log_segment_bytes_out_of_range)
{
    const uint64_t bad[] = {1, 4096, (1u << 20) - 1, (16ull << 30) + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char dir[512];
        pt_path(dir, sizeof dir, "bad");
        pkv_options o;
        wu_opts(&o, WU_BS, 16, PKV_DURABLE_GROUP);
        o.log_segment_bytes = bad[i];
        pkv_cache *c = (pkv_cache *)1;
        int rc = pkv_open(dir, &o, &c);
        cr_assert(rc == PKV_EINVAL && c == NULL, "log_segment_bytes %llu: %d",
                  (unsigned long long)bad[i], rc);
        cr_assert(strstr(pkv_last_error(), "log_segment_bytes"), "%s", pkv_last_error());
        struct stat st;
        cr_assert(stat(dir, &st) != 0, "nothing created");
    }
    /* the bounds themselves are fine */
    char dir[512];
    pt_path(dir, sizeof dir, "min");
    pkv_options o;
    wu_opts(&o, WU_BS, 16, PKV_DURABLE_GROUP);
    o.log_segment_bytes = PKV_LOG_SEGMENT_MIN;
    pkv_close(wu_open_ok(dir, &o));
}

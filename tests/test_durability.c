/*
 * test_durability.c — durability rules of the log (src/wal/log.c) that need an
 * I/O backend which watches or fails calls, or the library's internals:
 *  - log_segment_bytes: small segments, reopened with another size;
 *  - in NONE mode, leaving a full segment syncs the arena before the segment, so
 *    no COMMIT becomes durable ahead of the K/V it names (power-loss backend);
 *  - an open after an unclean end syncs the recovered log and the arena before the
 *    first durability claim;
 *  - a checkpoint that runs out of space leaves the cache serving;
 *  - REC_MAX_BYTES is enforced when records are built and when they are read;
 *  - runs of seals and evictions (SEAL_RUN, EVICT_RUN) recover as the single
 *    records would (pkv_log_run_max = 1 writes those).
 */
#include "wal_util.h"
#include "internal.h"
#include "pagedkv_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(durability, .init = pt_setup, .fini = pt_teardown);

static pkv_stats stats(pkv_cache *c)
{
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
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

/* ---- A power-loss backend ---------------------------------------------------------
 * Passes every call through and remembers what a power loss would undo: each log or
 * checkpoint write not yet fdatasynced (its file's old bytes), and the arena as of
 * its last fdatasync (the arena is written through the mapping, so its image is
 * read at each sync). plfs_image() writes a directory as a power loss at that
 * moment would leave it. With `image_at_log_sync`, the first fdatasync of a log
 * segment (not a write with a linked sync: NONE mode does that only when the log
 * leaves a full segment) takes that image right after it returns. A smaller cousin
 * of tests/test_crash.c's crashfs. */

typedef struct pl_undo {
    uint64_t ino, off;
    size_t n;
    uint8_t *old;
} pl_undo;

typedef struct plfs {
    pthread_mutex_t mu;
    char dir[512], img[512];
    uint64_t arena_ino;
    uint8_t *durable; /* arena image as of the last fdatasync */
    size_t arena_len;
    pl_undo *u;
    size_t nu, capu;
    bool image_at_log_sync, imaged;
    int log_syncs, arena_syncs;
    pkv_io_ops ops;
} plfs;

static uint64_t fd_ino(int fd)
{
    struct stat st;
    return fstat(fd, &st) ? 0 : (uint64_t)st.st_ino;
}

static uint64_t path_ino(const char *p)
{
    struct stat st;
    return stat(p, &st) ? 0 : (uint64_t)st.st_ino;
}

static void pl_forget(plfs *fs, uint64_t ino)
{
    size_t k = 0;
    for (size_t i = 0; i < fs->nu; i++) {
        if (fs->u[i].ino == ino) free(fs->u[i].old);
        else fs->u[k++] = fs->u[i];
    }
    fs->nu = k;
}

static long pl_full_pread(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) return -errno;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (long)done;
}

/* The directory as a power loss now would leave it, in fs->img (lock held). */
static void plfs_image(plfs *fs)
{
    pt_rmrf(fs->img);
    wu_copy_dir(fs->dir, fs->img);
    char p[1100];
    snprintf(p, sizeof p, "%s/arena", fs->img);
    wu_write_file(p, fs->durable, fs->arena_len);
    /* undo unsynced writes, newest first, in the copies of their files */
    for (size_t i = fs->nu; i-- > 0;) {
        DIR *d = opendir(fs->dir);
        WU_ASSERT(d, "opendir");
        struct dirent *e;
        while ((e = readdir(d))) {
            char src[1100], dst[1100];
            snprintf(src, sizeof src, "%s/%s", fs->dir, e->d_name);
            if (e->d_name[0] == '.' || path_ino(src) != fs->u[i].ino) continue;
            snprintf(dst, sizeof dst, "%s/%s", fs->img, e->d_name);
            int fd = open(dst, O_WRONLY);
            WU_ASSERT(fd >= 0, "open %s", dst);
            WU_ASSERT(pwrite(fd, fs->u[i].old, fs->u[i].n, (off_t)fs->u[i].off) ==
                          (ssize_t)fs->u[i].n, "undo");
            close(fd);
        }
        closedir(d);
    }
    fs->imaged = true;
}

static int pl_open(void *ctx, const char *path, int flags, int mode)
{
    (void)ctx;
    int fd = open(path, flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
}

static int pl_close(void *ctx, int fd)
{
    (void)ctx;
    return close(fd) ? -errno : 0;
}

static long pl_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off)
{
    (void)ctx;
    return pl_full_pread(fd, buf, n, off);
}

static int pl_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    plfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    pl_undo u = {fd_ino(fd), off, n, calloc(1, n ? n : 1)};
    WU_ASSERT(u.old, "oom");
    (void)pl_full_pread(fd, u.old, n, off);
    int rc = pwrite(fd, buf, n, (off_t)off) == (ssize_t)n ? 0 : -EIO;
    if (!rc && sync) {
        fdatasync(fd);
        pl_forget(fs, u.ino);
        free(u.old);
    } else if (!rc) {
        if (fs->nu == fs->capu) {
            fs->capu = fs->capu ? 2 * fs->capu : 64;
            fs->u = realloc(fs->u, fs->capu * sizeof *fs->u);
            WU_ASSERT(fs->u, "oom");
        }
        fs->u[fs->nu++] = u;
    } else {
        free(u.old);
    }
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int pl_sync(void *ctx, int fd)
{
    plfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    uint64_t ino = fd_ino(fd);
    if (ino == fs->arena_ino) {
        uint8_t *img = malloc(fs->arena_len);
        WU_ASSERT(img, "oom");
        WU_ASSERT(pl_full_pread(fd, img, fs->arena_len, 0) == (long)fs->arena_len, "arena");
        fdatasync(fd);
        free(fs->durable);
        fs->durable = img;
        fs->arena_syncs++;
    } else {
        fdatasync(fd);
        pl_forget(fs, ino);
        fs->log_syncs++;
        if (fs->image_at_log_sync && !fs->imaged) plfs_image(fs);
    }
    pthread_mutex_unlock(&fs->mu);
    return 0;
}

static int pl_allocate(void *ctx, int fd, uint64_t len)
{
    (void)ctx;
    int e = posix_fallocate(fd, 0, (off_t)len);
    return e ? -e : 0;
}

static int pl_rename(void *ctx, const char *from, const char *to)
{
    plfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    uint64_t old = path_ino(to);
    int rc = rename(from, to) ? -errno : 0;
    if (!rc && old) pl_forget(fs, old);
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int pl_unlink(void *ctx, const char *path)
{
    plfs *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    uint64_t ino = path_ino(path);
    int rc = unlink(path) ? -errno : 0;
    if (!rc && ino) pl_forget(fs, ino);
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int pl_sync_dir(void *ctx, const char *dir)
{
    (void)ctx;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

/* Plain rename and unlink, for the backends below that keep no undo list (pl_rename
 * and pl_unlink update a plfs's). */
static int pass_rename(void *ctx, const char *from, const char *to)
{
    (void)ctx;
    return rename(from, to) ? -errno : 0;
}

static int pass_unlink(void *ctx, const char *path)
{
    (void)ctx;
    return unlink(path) ? -errno : 0;
}

/* For a cache that exists in dir and is closed (so all of it is durable). */
static void plfs_init(plfs *fs, const char *dir, const char *img)
{
    memset(fs, 0, sizeof *fs);
    pthread_mutex_init(&fs->mu, NULL);
    snprintf(fs->dir, sizeof fs->dir, "%s", dir);
    snprintf(fs->img, sizeof fs->img, "%s", img);
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    fs->arena_ino = path_ino(arena);
    fs->durable = wu_read_file(arena, &fs->arena_len);
    fs->ops = (pkv_io_ops){fs,      pl_open,     pl_close,  pl_pread,  pl_write,
                           pl_sync, pl_allocate, pl_rename, pl_unlink, pl_sync_dir, NULL};
}

static void plfs_free(plfs *fs)
{
    for (size_t i = 0; i < fs->nu; i++) free(fs->u[i].old);
    free(fs->u);
    free(fs->durable);
    pthread_mutex_destroy(&fs->mu);
}

/* ---- NONE mode: leaving a full segment ---------------------------------------------
 * Leaving a full segment fdatasyncs it in NONE mode, which makes the COMMITs in it
 * durable; a COMMIT into a partial tail block names K/V that has no checksum, so the
 * arena must be flushed before that sync, or a power loss right after it recovers a
 * committed tail whose K/V never reached the disk. The sequence below commits a
 * partial tail (no seal, so no arena flush for it), then grows the log with records
 * that write no payload until the segment is left, and takes the power-loss image
 * right after that segment's fdatasync. */
Test(durability, none_mode_segment_rotation_flushes_the_arena_first)
{
    char dir[512], img[512];
    pt_path(dir, sizeof dir, "rot");
    pt_path(img, sizeof img, "rot-img");
    pkv_options o;
    wu_opts(&o, WU_BS, 512, PKV_DURABLE_NONE);
    o.log_segment_bytes = 1u << 20;
    o.group_commit_us = 500;
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 3, NULL);
    uint64_t lid = long_seq(&w, 1201, 4);
    pkv_close(c);
    wu_wl_free(&w);

    plfs *fs = malloc(sizeof *fs); /* leaked if the case fails: the cache uses it */
    cr_assert(fs);
    plfs_init(fs, dir, img);
    o.io = &fs->ops;
    c = wu_open_ok(dir, &o);
    WU_OK(pkv_sync(c)); /* everything so far is durable */
    wu_wl_init(&w, c, 9, NULL);
    w.next_id = 50000;
    /* a sequence of 2 tokens in blocks of 4: a committed partial tail */
    uint32_t prompt[2] = {17, 23};
    uint64_t sid = 0;
    WU_OK(wu_do_open(&w, 5, prompt, 2, 0, &sid));
    pthread_mutex_lock(&fs->mu);
    fs->image_at_log_sync = true;
    pthread_mutex_unlock(&fs->mu);
    /* forks and closes log records but write no payload, until the segment is left */
    for (int k = 0; k < 64; k++) {
        wu_churn(c, lid, 64u << 10);
        pthread_mutex_lock(&fs->mu);
        bool done = fs->imaged;
        pthread_mutex_unlock(&fs->mu);
        if (done) break;
    }
    cr_assert(fs->imaged, "the log never left its segment");
    wu_seq want = *wu_model_find(&w.m, sid);
    want.tok = malloc(want.len * sizeof *want.tok);
    memcpy(want.tok, wu_model_find(&w.m, sid)->tok, want.len * sizeof *want.tok);
    pkv_close(c);
    wu_wl_free(&w);
    plfs_free(fs);
    free(fs);

    /* the power-loss image: the COMMIT of the tail is durable (its segment was
     * synced), so the K/V of both tokens must be too */
    o.io = NULL;
    c = wu_open_ok(img, &o);
    pkv_seq_info si;
    WU_OK(pkv_seq_get_info(c, sid, &si));
    cr_assert(si.committed == 2, "the tail's COMMIT was in the synced segment: %llu",
              (unsigned long long)si.committed);
    wu_verify_seq(c, &want, 2, "tail committed before the segment was left");
    pkv_close(c);
    free(want.tok);
}

/* ---- The open after an unclean end ------------------------------------------------
 * A backend that passes everything through and records each fdatasync: 'A' for the
 * arena, the file name for others, in order. */

typedef struct recfs {
    pthread_mutex_t mu;
    uint64_t arena_ino;
    char log[8192];
    pkv_io_ops ops;
} recfs;

static int rf_sync(void *ctx, int fd)
{
    recfs *fs = ctx;
    char link[64], path[1024] = "?";
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    if (k > 0) path[k] = '\0';
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    pthread_mutex_lock(&fs->mu);
    size_t n = strlen(fs->log);
    snprintf(fs->log + n, sizeof fs->log - n, "%s ", fd_ino(fd) == fs->arena_ino ? "A" : name);
    pthread_mutex_unlock(&fs->mu);
    return fdatasync(fd) ? -errno : 0;
}

static int rf_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) return -EIO;
    return sync ? rf_sync(ctx, fd) : 0;
}

static void recfs_init(recfs *fs, const char *dir)
{
    memset(fs, 0, sizeof *fs);
    pthread_mutex_init(&fs->mu, NULL);
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    fs->arena_ino = path_ino(arena);
    fs->ops = (pkv_io_ops){fs,      pl_open,     pl_close,  pl_pread,  rf_write,
                           rf_sync, pl_allocate, pass_rename, pass_unlink, pl_sync_dir, NULL};
}

/* A NONE-mode writer ends without pkv_close (a process crash: its frames and
 * payload may be in the page cache only); the next open, in GROUP mode, marks every
 * recovered record durable. Before it does, the arena and each recovered segment
 * must have been fdatasynced, the arena first. */
Test(durability, open_after_unclean_end_syncs_recovered_log_and_arena)
{
    char dir[512];
    pt_path(dir, sizeof dir, "unclean");
    pkv_options o;
    wu_opts(&o, WU_BS, 256, PKV_DURABLE_NONE);
    o.log_segment_bytes = 1u << 20;
    pkv_close(wu_open_ok(dir, &o)); /* created, closed cleanly */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        wu_in_child = true;
        pkv_cache *c = wu_open_ok(dir, &o);
        wu_wl w;
        wu_wl_init(&w, c, 21, NULL);
        for (int i = 0; i < 60; i++) wu_step(&w);
        uint64_t lid = long_seq(&w, 801, 22);
        wu_churn(c, lid, 1536u << 10); /* into a second segment */
        for (int i = 0; i < 20; i++) wu_step(&w);
        usleep(20000); /* the flusher hands the last groups to the OS, unsynced */
        _exit(0);      /* a process crash: no pkv_close */
    }
    int status = 0;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    size_t nseg = wu_count(dir, "wal-0");
    cr_assert(nseg >= 2, "%zu segments", nseg);

    recfs *fs = malloc(sizeof *fs); /* leaked if the case fails: the cache uses it */
    cr_assert(fs);
    recfs_init(fs, dir);
    o.durability = PKV_DURABLE_GROUP;
    o.io = &fs->ops;
    pkv_cache *c = wu_open_ok(dir, &o);
    pthread_mutex_lock(&fs->mu);
    char seen[8192];
    snprintf(seen, sizeof seen, "%s", fs->log);
    pthread_mutex_unlock(&fs->mu);
    pkv_stats st = stats(c);
    cr_assert(st.durable_lsn > 0 && st.durable_lsn == st.last_lsn);
    /* every segment the child wrote was fdatasynced during the open, after the
     * arena */
    const char *arena = strstr(seen, "A ");
    cr_assert(arena, "no arena fdatasync during the open: '%s'", seen);
    for (uint64_t no = 1; no < 64; no++) {
        char name[64], p[700];
        snprintf(name, sizeof name, "wal-%016llx", (unsigned long long)no);
        snprintf(p, sizeof p, "%s/%s", dir, name);
        struct stat sb;
        if (stat(p, &sb)) continue;
        const char *at = strstr(seen, name);
        cr_assert(at, "%s not fdatasynced before the open claimed durable_lsn %llu: '%s'",
                  name, (unsigned long long)st.durable_lsn, seen);
        cr_assert(arena < at, "%s synced before the arena: '%s'", name, seen);
    }
    pkv_close(c);
    pthread_mutex_destroy(&fs->mu);
    free(fs);
}

/* ---- A checkpoint out of space ------------------------------------------------------
 * A pass-through backend whose writes to ckpt.tmp fail with ENOSPC while `full` is
 * set (the log's writes succeed: it had room). */

typedef struct nospc {
    pthread_mutex_t mu;
    bool full;
    bool log_eio;  /* writes to log segments fail with EIO */
    bool ckpt_eio; /* writes to ckpt.tmp fail with EIO */
    int failed_writes;
    pkv_io_ops ops;
} nospc;

static bool fd_named(int fd, const char *name)
{
    char link[64], path[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    if (k <= 0) return false;
    path[k] = '\0';
    const char *b = strrchr(path, '/');
    return b && strcmp(b + 1, name) == 0;
}

static int ns_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    nospc *fs = ctx;
    pthread_mutex_lock(&fs->mu);
    bool fail = fs->full && fd_named(fd, "ckpt.tmp");
    if (fail) fs->failed_writes++;
    bool ckpt_eio = fs->ckpt_eio && fd_named(fd, "ckpt.tmp");
    char link[64], path[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = fs->log_eio ? readlink(link, path, sizeof path - 1) : -1;
    if (k > 0) path[k] = '\0';
    bool eio = k > 0 && strstr(path, "/wal-") != NULL;
    pthread_mutex_unlock(&fs->mu);
    if (fail) return -ENOSPC;
    if (eio || ckpt_eio) return -EIO;
    if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) return -errno;
    return sync && fdatasync(fd) ? -errno : 0;
}

static int ns_sync(void *ctx, int fd)
{
    (void)ctx;
    return fdatasync(fd) ? -errno : 0;
}

static void ns_set(nospc *fs, bool full)
{
    pthread_mutex_lock(&fs->mu);
    fs->full = full;
    pthread_mutex_unlock(&fs->mu);
}

Test(durability, checkpoint_out_of_space_keeps_the_cache_serving)
{
    char dir[512];
    pt_path(dir, sizeof dir, "nospc");
    nospc *fs = calloc(1, sizeof *fs); /* leaked if the case fails: the cache uses it */
    cr_assert(fs);
    pthread_mutex_init(&fs->mu, NULL);
    fs->ops = (pkv_io_ops){fs,      pl_open,     pl_close,  pl_pread,  ns_write,
                           ns_sync, pl_allocate, pass_rename, pass_unlink, pl_sync_dir, NULL};
    pkv_options o;
    wu_opts(&o, WU_BS, 512, PKV_DURABLE_GROUP);
    o.io = &fs->ops;
    o.log_segment_bytes = 1u << 20;
    o.checkpoint_bytes = 256u << 10; /* automatic checkpoints come often */
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 31, NULL);
    for (int i = 0; i < 40; i++) wu_step(&w);
    WU_OK(pkv_checkpoint(c));

    ns_set(fs, true);
    for (int i = 0; i < 20; i++) wu_step(&w);
    int rc = pkv_checkpoint(c);
    cr_assert(rc == PKV_ENOSPC, "pkv_checkpoint on a full disk: %d (%s)", rc, pkv_last_error());
    cr_assert(strstr(pkv_last_error(), "ckpt.tmp"), "%s", pkv_last_error());
    cr_assert(wu_count(dir, "ckpt.tmp") == 0, "the temporary file is cleaned up");
    pkv_stats st = stats(c);
    cr_assert(st.checkpoint_failures == 1 && st.checkpoint_error == PKV_ENOSPC &&
                  st.checkpoint_backoff_ms == 1000,
              "stats: %llu failures, error %d, back-off %u ms",
              (unsigned long long)st.checkpoint_failures, (int)st.checkpoint_error,
              st.checkpoint_backoff_ms);
    /* still serving: appends, commits, forks, sync; 2 MiB more log passes the
     * automatic threshold eight times, but the back-off holds the attempts off */
    uint64_t lid = long_seq(&w, 601, 32);
    wu_churn(c, lid, 2u << 20);
    for (int i = 0; i < 40; i++) WU_OK(wu_step(&w));
    WU_OK(pkv_sync(c));
    st = stats(c);
    cr_assert(st.checkpoint_failures <= 4, "%llu failed attempts: no back-off",
              (unsigned long long)st.checkpoint_failures);
    cr_assert(st.durable_lsn == st.last_lsn);
    WU_CHECK(c, "serving after a failed checkpoint");

    /* space returns: a checkpoint goes through, the back-off ends */
    ns_set(fs, false);
    uint64_t before = st.checkpoints;
    WU_OK(pkv_checkpoint(c));
    st = stats(c);
    cr_assert(st.checkpoints == before + 1 && st.checkpoint_error == 0 &&
              st.checkpoint_backoff_ms == 0);
    for (int i = 0; i < 20; i++) WU_OK(wu_step(&w));
    WU_OK(pkv_sync(c));
    wu_model want;
    wu_model_copy(&want, &w.m);
    wu_model_drop_pending(&want);
    pkv_close(c);
    o.io = NULL;
    c = wu_open_ok(dir, &o);
    wu_verify_model(c, &want, "reopened after a failed checkpoint");
    pkv_close(c);
    wu_model_free(&want);
    wu_wl_free(&w);
    pthread_mutex_destroy(&fs->mu);
    free(fs);
}

/* An EIO writing the checkpoint is a failing device, not a full one: the cache
 * fails as for a log error (and the temporary file is still removed). */
Test(durability, checkpoint_eio_fails_the_cache)
{
    char dir[512];
    pt_path(dir, sizeof dir, "ckpt-eio");
    nospc *fs = calloc(1, sizeof *fs); /* leaked if the case fails: the cache uses it */
    cr_assert(fs);
    pthread_mutex_init(&fs->mu, NULL);
    fs->ops = (pkv_io_ops){fs,      pl_open,     pl_close,  pl_pread,  ns_write,
                           ns_sync, pl_allocate, pass_rename, pass_unlink, pl_sync_dir, NULL};
    pkv_options o;
    wu_opts(&o, WU_BS, 64, PKV_DURABLE_GROUP);
    o.io = &fs->ops;
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 61, NULL);
    for (int i = 0; i < 20; i++) wu_step(&w);
    pthread_mutex_lock(&fs->mu);
    fs->ckpt_eio = true;
    pthread_mutex_unlock(&fs->mu);
    int rc = pkv_checkpoint(c);
    cr_assert(rc == PKV_EFAILED, "checkpoint EIO: %d (%s)", rc, pkv_last_error());
    cr_assert(wu_count(dir, "ckpt.tmp") == 0);
    cr_assert(stats(c).checkpoint_failures == 0, "not a discarded checkpoint");
    pkv_close(c);
    wu_wl_free(&w);
    pthread_mutex_destroy(&fs->mu);
    free(fs);
}

/* ---- REC_MAX_BYTES ------------------------------------------------------------------
 * A record at the limit takes a table of 64 million blocks; the builders check
 * pkv_rec_max, which the test lowers to 2 KiB: with blocks of 4 tokens a SEQ_SET
 * then holds at most (2048 - 24 - 32 - 16) / 4 = 494 blocks. */

static void commit_tokens(wu_wl *w, uint64_t id, size_t n, uint32_t base)
{
    uint32_t *t = malloc(n * sizeof *t);
    cr_assert(t);
    for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
    for (size_t i = 0; i < n; i += 128) /* then one commit: one COMMIT record */
        WU_OK(wu_do_append(w, id, t + i, n - i < 128 ? n - i : 128, false));
    WU_OK(wu_do_commit(w, id, n));
    free(t);
}

Test(durability, record_limit_enforced_when_building)
{
    char dir[512];
    pt_path(dir, sizeof dir, "recmax");
    pkv_options o;
    wu_opts(&o, WU_BS, 2048, PKV_DURABLE_GROUP);
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_rec_max = 2048;
    wu_wl w;
    wu_wl_init(&w, c, 41, NULL);
    w.next_id = 100;
    uint64_t a = 0;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &a));
    commit_tokens(&w, a, 400 * WU_BS, 1000); /* one COMMIT of 400 blocks: 1.7 KiB */
    uint64_t b = 0;
    WU_OK(wu_do_fork(&w, a, &b)); /* SEQ_SET of 400 blocks: fits */
    commit_tokens(&w, a, 200 * WU_BS, 5000); /* a is 600 blocks long now */
    WU_OK(pkv_sync(c));
    pkv_stats before = stats(c);

    /* a fork's SEQ_SET of 600 blocks (2.5 KiB) */
    int rc = pkv_seq_fork(c, a, 999);
    cr_assert(rc == PKV_ERANGE, "fork of a 600-block table: %d (%s)", rc, pkv_last_error());
    cr_assert(strstr(pkv_last_error(), "REC_MAX_BYTES"), "%s", pkv_last_error());
    pkv_seq_info si;
    cr_assert(pkv_seq_get_info(c, 999, &si) == PKV_ENOSEQ, "no child after the failed fork");
    /* an open whose prompt could hit 600 blocks: its SEQ_SET may need them all */
    uint32_t *prompt = malloc(600 * WU_BS * sizeof *prompt);
    cr_assert(prompt);
    for (size_t i = 0; i < 600 * WU_BS; i++) prompt[i] = (uint32_t)i;
    size_t cached = 77;
    rc = pkv_seq_open(c, 998, 0, prompt, 600 * WU_BS, &cached);
    cr_assert(rc == PKV_ERANGE && cached == 77, "open of a 600-block prompt: %d", rc);
    cr_assert(pkv_seq_get_info(c, 998, &si) == PKV_ENOSEQ);
    /* one commit of 600 blocks: a COMMIT naming all of them */
    uint64_t d = 0;
    WU_OK(wu_do_open(&w, 0, NULL, 0, 0, &d));
    pkv_slot *slots = malloc(600 * WU_BS * sizeof *slots);
    cr_assert(slots);
    WU_OK(pkv_seq_append(c, d, prompt, 600 * WU_BS, slots));
    WU_OK(pkv_seq_get_info(c, d, &si));
    rc = pkv_seq_commit(c, d, 600 * WU_BS);
    cr_assert(rc == PKV_ERANGE, "commit of 600 blocks at once: %d", rc);
    pkv_seq_info si2;
    WU_OK(pkv_seq_get_info(c, d, &si2));
    cr_assert(si2.committed == 0 && si2.len == si.len, "the failed commit changed nothing");
    pkv_stats after = stats(c);
    cr_assert(after.last_lsn == before.last_lsn + 1, "only d's SEQ_SET was logged");
    WU_CHECK(c, "after refused records");
    WU_OK(wu_do_close(&w, d));

    /* the same calls pass with the real limit; everything recovers */
    pkv_rec_max = REC_MAX_BYTES;
    uint64_t e = 0;
    WU_OK(wu_do_fork(&w, a, &e));
    WU_OK(pkv_sync(c));
    wu_model want;
    wu_model_copy(&want, &w.m);
    wu_model_drop_pending(&want);
    pkv_close(c);
    c = wu_open_ok(dir, &o);
    wu_verify_model(c, &want, "reopened");
    pkv_close(c);
    wu_model_free(&want);
    wu_wl_free(&w);
    free(prompt);
    free(slots);
}

/* The reader: a SEQ_SET whose checksums would hold but which is larger than any
 * writer makes is refused (256 MiB of zeros, untouched but for the header). */
Test(durability, record_limit_enforced_when_reading)
{
    size_t payload = REC_MAX_BYTES; /* record = payload + 24 > REC_MAX_BYTES */
    uint8_t *p = calloc(1, REC_HDR + payload + REC_TRAILER);
    cr_assert(p);
    pkv_put_u32(p, (uint32_t)(REC_HDR + payload + REC_TRAILER));
    pkv_put_u32(p + 4, REC_SEQ_SET);
    pkv_put_u64(p + 8, 5);
    uint8_t *q = p + REC_HDR;
    pkv_put_u64(q, 1);                                    /* seq */
    pkv_put_u64(q + 16, (uint64_t)(payload - 32) / 4 * 4); /* committed */
    pkv_put_u32(q + 24, (uint32_t)((payload - 32) / 4));  /* nblocks */
    pkv_put_u32(q + 28, 0);                               /* ntail */
    pkv_rec r;
    int rc = pkv_rec_decode(p, payload, 4, &r);
    cr_assert(rc == PKV_ECORRUPT, "decode of a record over REC_MAX_BYTES: %d", rc);
    cr_assert(strstr(pkv_last_error(), "REC_MAX_BYTES"), "%s", pkv_last_error());
    /* the largest allowed one decodes */
    payload = REC_MAX_BYTES - REC_HDR - REC_TRAILER;
    pkv_put_u64(q + 16, (uint64_t)(payload - 32) / 4 * 4);
    pkv_put_u32(q + 24, (uint32_t)((payload - 32) / 4));
    WU_OK(pkv_rec_decode(p, payload, 4, &r));
    free(p);
}

/* ---- PKV_DURABLE_ALWAYS: the cache fails while a call waits for durability ----------
 * pkv_seq_commit_append (and each mutating call) is all-or-nothing, with one
 * exception that pagedkv.h and api.md name: in ALWAYS mode, a call that applied its
 * change and then finds the cache failed while it waits for its records returns
 * PKV_EFAILED with the change applied in memory, not durable. A call made once the
 * cache has failed changes nothing. */
static nospc *eio_fs(void)
{
    nospc *fs = calloc(1, sizeof *fs);
    cr_assert(fs);
    pthread_mutex_init(&fs->mu, NULL);
    fs->ops = (pkv_io_ops){fs,      pl_open,     pl_close,  pl_pread,  ns_write,
                           ns_sync, pl_allocate, pass_rename, pass_unlink, pl_sync_dir, NULL};
    return fs;
}

Test(durability, always_mode_efailed_while_waiting_applies_the_change)
{
    char dir[512];
    pt_path(dir, sizeof dir, "always");
    nospc *fs = eio_fs(); /* leaked if the case fails: the cache uses it */
    pkv_options o;
    wu_opts(&o, WU_BS, 64, PKV_DURABLE_ALWAYS);
    o.io = &fs->ops;
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 51, NULL);
    uint32_t prompt[3] = {5, 6, 7};
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, prompt, 3, 1, &id)); /* 2 committed, 1 pending */
    pkv_seq_info a, b;
    WU_OK(pkv_seq_get_info(c, id, &a));
    cr_assert(a.len == 3 && a.committed == 2);

    pthread_mutex_lock(&fs->mu);
    fs->log_eio = true;
    pthread_mutex_unlock(&fs->mu);
    uint32_t next = 8;
    pkv_slot slot = {0, 0};
    int rc = pkv_seq_commit_append(c, id, 1, &next, 1, &slot);
    cr_assert(rc == PKV_EFAILED, "commit_append while the log fails: %d", rc);
    WU_OK(pkv_seq_get_info(c, id, &b));
    cr_assert(b.committed == 3 && b.len == 4, "the change is applied in memory: %llu/%llu",
              (unsigned long long)b.committed, (unsigned long long)b.len);
    cr_assert(slot.block < 64 && slot.offset == 3, "its slot was handed out");
    /* the cache has failed: the next call changes nothing */
    rc = pkv_seq_commit_append(c, id, 1, &next, 1, &slot);
    cr_assert(rc == PKV_EFAILED);
    WU_OK(pkv_seq_get_info(c, id, &a));
    cr_assert(a.committed == b.committed && a.len == b.len);
    pkv_close(c);
    wu_wl_free(&w);
    /* not durable: the reopen has the state before the call */
    o.io = NULL;
    c = wu_open_ok(dir, &o);
    WU_OK(pkv_seq_get_info(c, id, &a));
    cr_assert(a.committed == 2 && a.len == 2, "recovered %llu/%llu",
              (unsigned long long)a.committed, (unsigned long long)a.len);
    pkv_close(c);
    pthread_mutex_destroy(&fs->mu);
    free(fs);

    /* a batch: every step was carried out (*done = n) and took effect in memory */
    pt_path(dir, sizeof dir, "always-batch");
    fs = eio_fs();
    o.io = &fs->ops;
    c = wu_open_ok(dir, &o);
    wu_wl_init(&w, c, 52, NULL);
    uint64_t ids[2];
    WU_OK(wu_do_open(&w, 0, prompt, 3, 1, &ids[0]));
    WU_OK(wu_do_open(&w, 0, prompt, 3, 1, &ids[1]));
    pthread_mutex_lock(&fs->mu);
    fs->log_eio = true;
    pthread_mutex_unlock(&fs->mu);
    pkv_step steps[2] = {{ids[0], 1, 9, {0, 0}}, {ids[1], 1, 9, {0, 0}}};
    size_t done = 99;
    rc = pkv_seq_step_batch(c, steps, 2, &done);
    cr_assert(rc == PKV_EFAILED && done == 2, "batch: %d, done %zu", rc, done);
    for (int i = 0; i < 2; i++) {
        WU_OK(pkv_seq_get_info(c, ids[i], &a));
        cr_assert(a.committed == 3 && a.len == 4);
    }
    pkv_close(c);
    wu_wl_free(&w);
    pthread_mutex_destroy(&fs->mu);
    free(fs);
}

/* ---- Runs of seals and evictions (REC_SEAL_RUN, REC_EVICT_RUN) ----------------------
 * One workload, logged in runs (the default) and record by record
 * (pkv_log_run_max = 1). Each log must hold the records it claims, and the caches
 * recovered from the two must be the same cache: the same prefixes cached after
 * the reopen, and the same ones after more traffic evicts in the recovered LRU
 * order. Limbo waits keep eviction independent of flush timing. */

enum { RUN_REQS = 60, RUN_MORE = 30, RUN_CAP = 160, RUN_TOK = 512 };

/* Request i: one of 4 shared heads (3 blocks), then 2..8 blocks of its own (every
 * tenth: 100, more than a run holds) and one more token. Every third request
 * commits block by block (SEALs, one block per commit), the others in one commit
 * (SEAL_RUNs). */
static size_t run_prompt(uint32_t i, uint32_t *t)
{
    size_t n = 0;
    for (uint32_t k = 0; k < 3 * WU_BS; k++) t[n++] = 7000000u + (i % 4) * 100u + k;
    uint32_t own = (i % 10 == 5 ? 100 : 2 + i % 7) * WU_BS + 1;
    for (uint32_t k = 0; k < own; k++) t[n++] = i * 1000u + k;
    return n;
}

static void run_requests(pkv_cache *c, uint32_t from, uint32_t to)
{
    uint32_t t[RUN_TOK];
    pkv_slot sl[RUN_TOK];
    for (uint32_t i = from; i < to; i++) {
        size_t n = run_prompt(i, t), hit = 0;
        WU_OK(pkv_seq_open(c, i + 1, 0, t, n, &hit));
        if (i % 3 == 0) {
            for (size_t k = hit; k < n; k += WU_BS) {
                size_t m = n - k < WU_BS ? n - k : WU_BS;
                WU_OK(pkv_seq_append(c, i + 1, t + k, m, sl));
                WU_OK(pkv_seq_commit(c, i + 1, m));
            }
        } else {
            WU_OK(pkv_seq_append(c, i + 1, t + hit, n - hit, sl));
            WU_OK(pkv_seq_commit(c, i + 1, n - hit));
        }
        WU_OK(pkv_seq_close(c, i + 1));
    }
}

/* Tokens of every request's prompt cached now, request by request. */
static void run_probe(pkv_cache *c, uint32_t n, size_t *hits)
{
    uint32_t t[RUN_TOK];
    for (uint32_t i = 0; i < n; i++) {
        size_t len = run_prompt(i, t);
        WU_OK(pkv_prefix_lookup(c, 0, t, len, &hits[i]));
    }
}

typedef struct run_recs {
    uint64_t seal, evict, seal_run, evict_run, run_seals, run_evicts, full_runs;
} run_recs;

static int count_run_recs(void *ctx, const pkv_log_rec *r)
{
    run_recs *k = ctx;
    if (r->type == PKV_LOG_SEAL) k->seal++;
    if (r->type == PKV_LOG_EVICT) k->evict++;
    if (r->type == PKV_LOG_SEAL_RUN) {
        k->seal_run++;
        k->run_seals += r->nblocks;
        k->full_runs += r->nblocks == PKV_LOG_RUN_MAX;
        cr_assert(r->nblocks >= 2 && r->entry_bytes == 32 + 4 * WU_BS);
    }
    if (r->type == PKV_LOG_EVICT_RUN) {
        k->evict_run++;
        k->run_evicts += r->nblocks;
        k->full_runs += r->nblocks == PKV_LOG_RUN_MAX;
    }
    return 0;
}

/* Run the workload in dir, logged with runs of at most run_max blocks, close
 * (no checkpoint: the reopen replays every record), count the records, reopen. */
static pkv_cache *run_logged(const char *sub, char *dir, size_t dirlen, uint32_t run_max,
                             run_recs *k, pkv_stats *before)
{
    pt_path(dir, dirlen, sub);
    pkv_options o;
    wu_opts(&o, WU_BS, RUN_CAP, PKV_DURABLE_GROUP);
    o.flags = PKV_OPEN_LIMBO_WAIT;
    o.checkpoint_bytes = 1ull << 40;
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_log_run_max = run_max;
    run_requests(c, 0, RUN_REQS);
    pkv_log_run_max = PKV_LOG_RUN_MAX;
    WU_CHECK(c, "after the workload");
    *before = stats(c);
    cr_assert_eq(before->checkpoints, 0);
    pkv_close(c);

    char path[600];
    snprintf(path, sizeof path, "%s/arena", dir);
    size_t len = 0;
    uint8_t *h = wu_read_file(path, &len);
    cr_assert(h && len >= 96);
    pkv_log_arena a = {pkv_get_u64(h + 72), pkv_get_u32(h + 28), pkv_get_u64(h + 40)};
    free(h);
    pkv_logview *v = NULL;
    WU_OK(pkv_logview_open(dir, &a, 0, &v));
    memset(k, 0, sizeof *k);
    WU_OK(pkv_logview_read(v, count_run_recs, k));
    pkv_logview_close(v);

    c = wu_open_ok(dir, &o);
    pkv_recovery rec;
    WU_OK(pkv_get_recovery(c, &rec));
    cr_assert(rec.checkpoint_lsn == 0 && rec.records_replayed == before->last_lsn &&
                  rec.blocks_dropped == 0 && rec.corrupt_lsn == 0,
              "%s: recovery replayed %llu of %llu records, dropped %llu blocks (note: %s)", sub,
              (unsigned long long)rec.records_replayed, (unsigned long long)before->last_lsn,
              (unsigned long long)rec.blocks_dropped, rec.note);
    WU_CHECK(c, "reopened");
    return c;
}

Test(durability, seal_and_evict_runs_recover_as_their_single_records)
{
    char d1[512], d2[512];
    run_recs k1, k2;
    pkv_stats s1, s2;
    pkv_cache *c1 = run_logged("runs", d1, sizeof d1, PKV_LOG_RUN_MAX, &k1, &s1);
    pkv_cache *c2 = run_logged("singles", d2, sizeof d2, 1, &k2, &s2);
    /* the logs: runs where a call seals or evicts several blocks, singles else */
    cr_assert(k1.seal_run > 10 && k1.evict_run > 10 && k1.seal > 10 && k1.evict > 10,
              "runs log: %llu SEAL_RUN, %llu EVICT_RUN, %llu SEAL, %llu EVICT",
              (unsigned long long)k1.seal_run, (unsigned long long)k1.evict_run,
              (unsigned long long)k1.seal, (unsigned long long)k1.evict);
    cr_assert(k1.full_runs > 4, "%llu runs of PKV_LOG_RUN_MAX blocks",
              (unsigned long long)k1.full_runs);
    cr_assert(k2.seal_run == 0 && k2.evict_run == 0);
    cr_assert_eq(k1.seal + k1.run_seals, k2.seal, "the same seals, %llu + %llu vs %llu",
                 (unsigned long long)k1.seal, (unsigned long long)k1.run_seals,
                 (unsigned long long)k2.seal);
    cr_assert_eq(k1.evict + k1.run_evicts, k2.evict);
    cr_assert_eq(s1.evictions, s2.evictions);
    cr_assert(s1.evictions > 100, "the workload evicts (%llu)", (unsigned long long)s1.evictions);
    cr_assert(s1.last_lsn < s2.last_lsn);
    /* the recovered caches: the same blocks cached, then the same victims */
    size_t h1[RUN_REQS + RUN_MORE], h2[RUN_REQS + RUN_MORE];
    pkv_stats r1 = stats(c1), r2 = stats(c2);
    cr_assert_eq(r1.blocks_sealed, s1.blocks_sealed);
    cr_assert_eq(r2.blocks_sealed, r1.blocks_sealed);
    run_probe(c1, RUN_REQS, h1);
    run_probe(c2, RUN_REQS, h2);
    size_t cached = 0;
    for (uint32_t i = 0; i < RUN_REQS; i++) {
        cr_assert_eq(h1[i], h2[i], "request %u: %zu tokens cached from runs, %zu from singles",
                     i, h1[i], h2[i]);
        cached += h1[i];
    }
    cr_assert(cached > 0);
    run_requests(c1, RUN_REQS, RUN_REQS + RUN_MORE);
    run_requests(c2, RUN_REQS, RUN_REQS + RUN_MORE);
    run_probe(c1, RUN_REQS + RUN_MORE, h1);
    run_probe(c2, RUN_REQS + RUN_MORE, h2);
    for (uint32_t i = 0; i < RUN_REQS + RUN_MORE; i++)
        cr_assert_eq(h1[i], h2[i], "after more traffic, request %u: %zu vs %zu tokens", i,
                     h1[i], h2[i]);
    cr_assert_eq(stats(c1).evictions - r1.evictions, stats(c2).evictions - r2.evictions);
    WU_CHECK(c1, "runs, after more traffic");
    WU_CHECK(c2, "singles, after more traffic");
    pkv_close(c1);
    pkv_close(c2);
}

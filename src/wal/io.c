/*
 * wal/io.c — the default I/O backend: plain syscalls for open/read/rename, and
 * io_uring for the log's write + fdatasync pair.
 *
 * A write that must be durable is submitted as two linked SQEs (IOSQE_IO_LINK):
 * the write, then fsync(IORING_FSYNC_DATASYNC), so the sync is ordered after the
 * write and covers it. A short write breaks the link: the sync completes with
 * -ECANCELED, and we resubmit the rest (write + sync again) until all bytes are
 * written or a real error occurs. Errors are returned, never retried: a failed
 * fdatasync is final (fsyncgate), the caller enters its failed state.
 *
 * Rings are per thread (the log flusher is the only thread that writes), created
 * on first use and torn down at thread exit. A ring is not inherited through
 * fork(): the child's copy shares the parent's ring memory but not its view of
 * the queue heads, so a child that used it would corrupt both. Each ring carries
 * the fork generation it was made in (bumped in every child by pthread_atfork),
 * and a thread that finds one of an earlier generation sets up its own.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct thread_ring_t {
    struct io_uring u;
    unsigned gen; /* fork_gen when it was set up */
} thread_ring_t;

static pthread_key_t ring_key;
static pthread_once_t ring_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned fork_gen;

static void ring_destroy(void *p) {
    io_uring_queue_exit(&((thread_ring_t *)p)->u);
    free(p);
}
static void after_fork_in_child(void) { atomic_fetch_add(&fork_gen, 1); }
static void ring_key_init(void) {
    pthread_key_create(&ring_key, ring_destroy);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static struct io_uring *thread_ring(int *err) {
    pthread_once(&ring_once, ring_key_init);
    thread_ring_t *r = pthread_getspecific(ring_key);
    unsigned gen = atomic_load(&fork_gen);
    if (r && r->gen == gen) return &r->u;
    if (r) { /* inherited through fork(): unmap and close this process's copy */
        pthread_setspecific(ring_key, NULL);
        ring_destroy(r);
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        *err = -ENOMEM;
        return NULL;
    }
    int rc = io_uring_queue_init(8, &r->u, 0);
    if (rc < 0) {
        free(r);
        *err = rc;
        return NULL;
    }
    r->gen = gen;
    pthread_setspecific(ring_key, r);
    return &r->u;
}

static int d_open(void *ctx, const char *path, int flags, int mode) {
    (void)ctx;
    int fd = open(path, flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
}
static int d_close(void *ctx, int fd) {
    (void)ctx;
    return close(fd) ? -errno : 0;
}
static long d_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off) {
    (void)ctx;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (long)done;
}

/* One round: write (and linked datasync). Returns bytes written (>= 0) or -errno. */
static long uring_round(struct io_uring *r, int fd, const void *buf, size_t n,
                        uint64_t off, int sync, int *sync_res) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(r);
    if (!sqe) return -EIO; /* every round is reaped before the next: a broken ring */
    io_uring_prep_write(sqe, fd, buf, (unsigned)n, off);
    sqe->user_data = 1;
    if (sync) {
        sqe->flags |= IOSQE_IO_LINK;
        sqe = io_uring_get_sqe(r);
        if (!sqe) return -EIO;
        io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
        sqe->user_data = 2;
    }
    int want = sync ? 2 : 1;
    int rc = io_uring_submit_and_wait(r, want);
    if (rc < 0) return rc;
    long wres = -EIO;
    *sync_res = 0;
    for (int got = 0; got < want; got++) {
        struct io_uring_cqe *cqe;
        rc = io_uring_wait_cqe(r, &cqe);
        if (rc < 0) return rc;
        if (cqe->user_data == 1) wres = cqe->res;
        else *sync_res = cqe->res;
        io_uring_cqe_seen(r, cqe);
    }
    return wres;
}

/* Unsynced writes (durability NONE): once WB_HINT bytes of a file are written
 * since the last hint, start their writeback (SYNC_FILE_RANGE_WRITE waits for
 * no I/O to finish). The log syncs a segment before it leaves it, and that
 * fdatasync then finds at most WB_HINT bytes left to write, instead of a whole
 * segment's worth while no frame can be written. Per thread: only the flusher
 * writes log frames. Only a hint, so a reused fd number or an error here is
 * harmless: errors surface at the fdatasync. */
#define WB_HINT (4u << 20)
static _Thread_local int wb_fd = -1;
static _Thread_local uint64_t wb_from;
static void writeback_hint(int fd, uint64_t end) {
    if (fd != wb_fd || end < wb_from) {
        wb_fd = fd;
        wb_from = 0;
    }
    if (end - wb_from < WB_HINT) return;
    (void)sync_file_range(fd, (off64_t)wb_from, (off64_t)(end - wb_from), SYNC_FILE_RANGE_WRITE);
    wb_from = end;
}

static int d_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync) {
    (void)ctx;
    int err = 0;
    struct io_uring *r = thread_ring(&err);
    if (!r) return err;
    size_t done = 0;
    const size_t chunk = 1u << 30; /* one SQE writes at most this much */
    for (;;) {
        size_t len = n - done < chunk ? n - done : chunk;
        int sres = 0;
        bool last = done + len == n;
        long w = uring_round(r, fd, (const char *)buf + done, len, off + done,
                             sync && last, &sres);
        if (w < 0) return (int)w;
        if (w == 0 && len) return -EIO; /* no progress: device refuses */
        done += (size_t)w;
        if ((size_t)w < len) continue; /* short write: the linked sync was cancelled */
        if (sync && last) {
            if (sres == -ECANCELED) continue; /* cannot happen after a full write */
            if (sres < 0) return sres;
        }
        if (done == n) break;
    }
    if (!sync) writeback_hint(fd, off + n);
    return 0;
}

static int d_sync(void *ctx, int fd) {
    (void)ctx;
    return fdatasync(fd) ? -errno : 0;
}
static int d_allocate(void *ctx, int fd, uint64_t len) {
    (void)ctx;
    int e = posix_fallocate(fd, 0, (off_t)len);
    return e ? -e : 0;
}
static int d_rename(void *ctx, const char *from, const char *to) {
    (void)ctx;
    return rename(from, to) ? -errno : 0;
}
static int d_unlink(void *ctx, const char *path) {
    (void)ctx;
    return unlink(path) ? -errno : 0;
}
static int d_sync_dir(void *ctx, const char *dir) {
    (void)ctx;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

static int d_boot_id(void *ctx, char *out, size_t cap) {
    (void)ctx;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t n = read(fd, out, cap - 1);
    int e = errno;
    close(fd);
    if (n <= 0) return n < 0 ? -e : -ENODATA;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ')) n--;
    out[n] = '\0';
    return n > 0 ? 0 : -ENODATA;
}

static const pkv_io_ops default_ops = {
    .ctx = NULL,
    .open = d_open,
    .close = d_close,
    .pread = d_pread,
    .write = d_write,
    .sync = d_sync,
    .allocate = d_allocate,
    .rename = d_rename,
    .unlink = d_unlink,
    .sync_dir = d_sync_dir,
    .boot_id = d_boot_id,
};

const pkv_io_ops *pkv_io_default(void) { return &default_ops; }

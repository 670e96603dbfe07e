/*
 * wal/unsynced.c — the unsynced marker: the file `unsynced` in the cache
 * directory, which says that a writer running without syncs (PKV_DURABLE_NONE)
 * may have left records and payload only in the page cache, and on which boot of
 * the machine.
 *
 * Why. In NONE mode the log's frames and the arena's pages reach the disk in
 * whatever order the kernel writes them back. After a process crash that does
 * not matter: the page cache survives, and the next open sees every write. After
 * a power loss or a kernel crash it does: a COMMIT can be on disk while the K/V it
 * names is not, or a freeing record can be lost while its block's slot was
 * reused. A sealed block is caught by its payload checksum (rule S1); the
 * committed tokens of a sequence's partial last block (an open tail) have none
 * (rule S3), so they are cut instead (rule D8 of docs/format.md).
 *
 * The life of the marker:
 *   - a writable open in NONE mode writes it (pkv_unsynced_begin), after
 *     recovery has synced what it recovered: "boot <id>", written to a temporary
 *     file, synced, renamed and the directory synced;
 *   - a clean pkv_close of that writer, after its last synced flush, removes it
 *     (pkv_unsynced_end); a writable open in another mode removes one it finds,
 *     since the open synced everything first;
 *   - recovery (pkv_unsynced_restarted) reads it: a marker of another boot, or of
 *     an unknown one, means the page cache may have been lost since the writer
 *     ran, and recovery cuts every open tail of a recovered table.
 * Every file operation goes through the log's I/O backend, and the boot identity
 * comes from it (pkv_io_ops.boot_id), so a test backend can simulate a restart.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#define MARKER "unsynced"
#define MARKER_MAX 128

static void boot_of(const pkv_io_ops *io, char *out, size_t cap) {
    const pkv_io_ops *src = io->boot_id ? io : pkv_io_default(); /* boot_id is optional */
    if (src->boot_id(src->ctx, out, cap) < 0) out[0] = '\0';    /* unknown */
}

static int marker_path(const char *dir, const char *name, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? pkv_err(PKV_EINVAL, "cache path too long") : 0;
}

int pkv_unsynced_restarted(const pkv_io_ops *io, const char *dir) {
    char path[4200], buf[MARKER_MAX + 1], now[MARKER_MAX];
    int rc = marker_path(dir, MARKER, path, sizeof path);
    if (rc) return rc;
    int fd = io->open(io->ctx, path, O_RDONLY, 0);
    if (fd == -ENOENT) return 0; /* no marker: the last writer synced, or was not NONE */
    if (fd < 0) return pkv_io_err(fd, "open", path);
    long n = io->pread(io->ctx, fd, buf, MARKER_MAX, 0);
    io->close(io->ctx, fd);
    if (n < 0) return pkv_io_err((int)n, "read", path);
    if (n <= 5 || memcmp(buf, "boot ", 5) != 0) return 1; /* damaged: assume the worst */
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    boot_of(io, now, sizeof now);
    return now[0] == '\0' || strcmp(buf + 5, now) != 0;
}

int pkv_unsynced_begin(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    const pkv_io_ops *io = w->io;
    char path[4200], tmp[4200];
    int rc;
    if ((rc = marker_path(w->dir, MARKER, path, sizeof path)) ||
        (rc = marker_path(w->dir, MARKER ".tmp", tmp, sizeof tmp)))
        return rc;
    if (w->mode != PKV_DURABLE_NONE) {
        /* the open synced what it recovered: nothing is left unsynced */
        rc = io->unlink(io->ctx, path);
        if (rc == -ENOENT) return 0;
        if (rc < 0) return pkv_io_err(rc, "remove", path);
        if ((rc = io->sync_dir(io->ctx, w->dir)) < 0) return pkv_io_err(rc, "fsync", w->dir);
        return 0;
    }
    char body[MARKER_MAX + 8], id[MARKER_MAX - 8];
    boot_of(io, id, sizeof id);
    int len = snprintf(body, sizeof body, "boot %s\n", id);
    int fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return pkv_io_err(fd, "create", tmp);
    rc = io->write(io->ctx, fd, body, (size_t)len, 0, 1);
    io->close(io->ctx, fd);
    if (rc >= 0) rc = io->rename(io->ctx, tmp, path);
    if (rc >= 0) rc = io->sync_dir(io->ctx, w->dir);
    if (rc < 0) {
        io->unlink(io->ctx, tmp);
        return pkv_io_err(rc, "write", path);
    }
    w->marked = true;
    return 0;
}

void pkv_unsynced_end(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    char path[4200];
    if (!w->marked || marker_path(w->dir, MARKER, path, sizeof path)) return;
    w->marked = false;
    /* Best effort: a marker left behind costs only the open tails, after a restart. */
    if (w->io->unlink(w->io->ctx, path) == 0) w->io->sync_dir(w->io->ctx, w->dir);
}

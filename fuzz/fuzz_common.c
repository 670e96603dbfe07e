/*
 * fuzz_common.c — scratch directories, file writing, the cheap I/O backend and
 * the input splitter shared by the fuzz harnesses (fuzz_common.h).
 */
#include "fuzz_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A copy of the original stderr, taken before libFuzzer's -close_fd_mask=2
 * closes fd 2 (which keeps kvdump's messages out of the logs), so a failed
 * harness check still says why. */
static int err_fd = 2;
__attribute__((constructor)) static void save_stderr(void) {
    int fd = dup(2);
    if (fd >= 0) err_fd = fd;
}

_Noreturn void fz_fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(msg, sizeof msg, "fuzz harness check failed: ");
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(msg);
    if (len < sizeof msg - 1) msg[len++] = '\n';
    if (write(err_fd, msg, len) < 0) { /* nothing more to do */ }
    abort();
}

static char base[256];

void fz_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (!lstat(path, &st) && S_ISDIR(st.st_mode)) fz_rmdir(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void cleanup(void) {
    if (base[0]) fz_rmdir(base);
}

const char *fz_base(void) {
    if (base[0]) return base;
    struct stat st;
    const char *root = !stat("/dev/shm", &st) && S_ISDIR(st.st_mode) &&
                               !access("/dev/shm", W_OK) ? "/dev/shm" : "/tmp";
    snprintf(base, sizeof base, "%s/pkvfuzz-XXXXXX", root);
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        abort();
    }
    atexit(cleanup);
    return base;
}

const char *fz_dir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", fz_base(), name);
    fz_rmdir(path);
    if (mkdir(path, 0700)) {
        perror(path);
        abort();
    }
    return path;
}

int fz_write(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    const uint8_t *b = p;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, b + done, n - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    close(fd);
    return 0;
}

static int cheap_allocate(void *ctx, int fd, uint64_t len) {
    (void)ctx;
    struct stat st;
    if (fstat(fd, &st)) return -errno;
    if ((uint64_t)st.st_size >= len) return 0;
    return ftruncate(fd, (off_t)len) ? -errno : 0;
}

const pkv_io_ops *fz_io(void) {
    static pkv_io_ops ops;
    if (!ops.open) {
        ops = *pkv_io_default();
        ops.allocate = cheap_allocate;
    }
    return &ops;
}

void fz_check(pkv_cache *c, const char *when) {
    char why[512];
    int rc = pkv_check(c, why, sizeof why);
    if (rc) fz_fail("pkv_check after %s: %s", when, why);
}

size_t fz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len,
                size_t max) {
    size_t n = 0, start = 0;
    if (max == 0) return 0;
    for (size_t i = 0; n + 1 < max && i + 8 <= size;) {
        if (!memcmp(data + i, FZ_SEP, 8)) {
            part[n] = data + start;
            len[n++] = i - start;
            i += 8;
            start = i;
        } else {
            i++;
        }
    }
    part[n] = data + start;
    len[n++] = size - start;
    return n;
}

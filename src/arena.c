/*
 * arena.c — the arena file: one header page, then `capacity` block slots of
 * slot_bytes each, preallocated and mapped MAP_SHARED; plus the directory's LOCK file.
 * Version 1 slots are whole pages; version 2 (small blocks only) packs several
 * to a page at a power-of-two stride (pkv_slot_bytes_dense, internal.h). An
 * existing arena keeps the stride its header stores.
 *
 * Header page (little-endian, 4096 bytes; docs/format.md):
 *     0  magic "PAGEDKV\0"        8   u32 version (1|2)   12  u32 header bytes (4096)
 *    16  u32 num_layers          20  u32 num_kv_heads    24  u32 head_dim
 *    28  u32 block_size          32  u32 dtype           36  u32 elem_size
 *    40  u64 capacity            48  u64 block_bytes     56  u64 slot_bytes
 *    64  u64 data_offset         72  u64 hash secret     80  u64 created (unix ns)
 *    88  u32 model_id length     92  model_id, 256 bytes, NUL padded
 *   348  zero ...              4088  u64 XXH3-64 of bytes [0, 4088)
 *
 * Invariants: the file is never shorter than data_offset + capacity*slot_bytes
 * while mapped (it is created full size with posix_fallocate, so a full disk fails
 * at creation, never as SIGBUS later), never truncated, and the header is written
 * once, at creation, through a temporary file renamed into place. Opening never
 * writes to an existing arena. A writable handle flock()s the cache directory
 * itself and its LOCK file for the handle's life (take_lock says why both).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
/* libxxhash's runtime-dispatched XXH3 (AVX2 or AVX-512 where the CPU has them;
 * the same function, so the same sums, as the SSE2 build XXH3_64bits is). */
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define PKV_XXH3_WIDE XXH3_64bits_dispatch
#define PKV_XXH3_DISPATCHED 1
#endif
#endif
#ifndef PKV_XXH3_WIDE
#define PKV_XXH3_WIDE XXH3_64bits
#endif

#define HDR_MAGIC "PAGEDKV"
#define HDR_VERSION_MAX 2u
#define HDR_SUM_OFF 4088u
#define HDR_MODEL_OFF 92u
#define HDR_MODEL_BYTES 256u

static const char *dtype_name(uint32_t d) {
    switch (d) {
    case PKV_F32:  return "f32";
    case PKV_F16:  return "f16";
    case PKV_BF16: return "bf16";
    default:       return "?";
    }
}

int pkv_geometry_from_options(const pkv_options *opt, pkv_geometry *geo) {
    if (!opt) return pkv_err(PKV_EINVAL, "options are NULL");
    if (!opt->num_layers || !opt->num_kv_heads || !opt->head_dim)
        return pkv_err(PKV_EINVAL, "num_layers, num_kv_heads and head_dim must be > 0");
    if (opt->num_layers > 4096 || opt->num_kv_heads > 4096 || opt->head_dim > 65536)
        return pkv_err(PKV_EINVAL, "num_layers/num_kv_heads/head_dim out of range");
    if (opt->block_size == 0 || opt->block_size > PKV_BLOCK_SIZE_MAX)
        return pkv_err(PKV_EINVAL, "block_size %u not in 1..%u", opt->block_size,
                       PKV_BLOCK_SIZE_MAX);
    uint32_t elem;
    switch (opt->dtype) {
    case PKV_F32:  elem = 4; break;
    case PKV_F16:
    case PKV_BF16: elem = 2; break;
    default: return pkv_err(PKV_EINVAL, "unknown dtype %d", (int)opt->dtype);
    }
    if (opt->capacity > (1ull << 31))
        return pkv_err(PKV_EINVAL, "capacity %llu blocks exceeds 2^31",
                       (unsigned long long)opt->capacity);
    geo->num_layers = opt->num_layers;
    geo->num_kv_heads = opt->num_kv_heads;
    geo->head_dim = opt->head_dim;
    geo->block_size = opt->block_size;
    geo->dtype = (uint32_t)opt->dtype;
    geo->elem_size = elem;
    geo->capacity = opt->capacity;
    geo->run_bytes = (uint64_t)opt->block_size * opt->head_dim * elem;
    geo->block_bytes = geo->run_bytes * 2 * opt->num_kv_heads * opt->num_layers;
    geo->slot_bytes = pkv_slot_bytes_dense(geo->block_bytes); /* an existing arena's
                                                                  header may say otherwise */
    if (geo->capacity && geo->slot_bytes > (UINT64_MAX / 2) / geo->capacity)
        return pkv_err(PKV_EINVAL, "arena size overflows");
    return 0;
}

static void header_encode(uint8_t *h, const pkv_arena *a, uint64_t created) {
    const pkv_geometry *g = &a->geo;
    memset(h, 0, PKV_PAGE);
    memcpy(h, HDR_MAGIC, 8);
    pkv_put_u32(h + 8, pkv_arena_version(g->block_bytes, g->slot_bytes));
    pkv_put_u32(h + 12, PKV_PAGE);
    pkv_put_u32(h + 16, g->num_layers);
    pkv_put_u32(h + 20, g->num_kv_heads);
    pkv_put_u32(h + 24, g->head_dim);
    pkv_put_u32(h + 28, g->block_size);
    pkv_put_u32(h + 32, g->dtype);
    pkv_put_u32(h + 36, g->elem_size);
    pkv_put_u64(h + 40, g->capacity);
    pkv_put_u64(h + 48, g->block_bytes);
    pkv_put_u64(h + 56, g->slot_bytes);
    pkv_put_u64(h + 64, a->data_offset);
    pkv_put_u64(h + 72, a->secret);
    pkv_put_u64(h + 80, created);
    size_t mlen = strlen(a->model_id);
    pkv_put_u32(h + 88, (uint32_t)mlen);
    memcpy(h + HDR_MODEL_OFF, a->model_id, mlen);
    pkv_put_u64(h + HDR_SUM_OFF, XXH3_64bits(h, HDR_SUM_OFF));
}

/* Decode and validate a header page read from disk into a->geo etc. */
static int header_decode(const uint8_t *h, pkv_arena *a, const char *path) {
    if (memcmp(h, HDR_MAGIC, 8) != 0)
        return pkv_err(PKV_ECORRUPT, "%s: not a pagedkv arena (bad magic)", path);
    uint32_t version = pkv_get_u32(h + 8);
    if (version == 0 || version > HDR_VERSION_MAX)
        return pkv_err(PKV_EVERSION, "%s: format version %u, this library reads 1 to %u",
                       path, version, HDR_VERSION_MAX);
    if (!pkv_sum_ok(pkv_get_u64(h + HDR_SUM_OFF), XXH3_64bits(h, HDR_SUM_OFF)))
        return pkv_err(PKV_ECORRUPT, "%s: header checksum mismatch", path);
    pkv_options o;
    memset(&o, 0, sizeof o);
    o.num_layers = pkv_get_u32(h + 16);
    o.num_kv_heads = pkv_get_u32(h + 20);
    o.head_dim = pkv_get_u32(h + 24);
    o.block_size = pkv_get_u32(h + 28);
    o.dtype = (pkv_dtype)pkv_get_u32(h + 32);
    o.capacity = pkv_get_u64(h + 40);
    int rc = pkv_geometry_from_options(&o, &a->geo);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", pkv_last_error());
        return pkv_err(PKV_ECORRUPT, "%s: invalid geometry in header: %s", path, why);
    }
    uint32_t mlen = pkv_get_u32(h + 88);
    if (pkv_get_u32(h + 12) != PKV_PAGE || pkv_get_u64(h + 64) != PKV_PAGE ||
        pkv_get_u32(h + 36) != a->geo.elem_size ||
        pkv_get_u64(h + 48) != a->geo.block_bytes ||
        !pkv_slot_bytes_legal(version, a->geo.block_bytes, pkv_get_u64(h + 56)) ||
        a->geo.capacity == 0 ||
        mlen == 0 || mlen > PKV_MODEL_ID_MAX || memchr(h + HDR_MODEL_OFF, 0, mlen))
        return pkv_err(PKV_ECORRUPT, "%s: inconsistent header fields", path);
    a->geo.slot_bytes = pkv_get_u64(h + 56); /* the stride it was created with */
    if (a->geo.slot_bytes > (UINT64_MAX / 2) / a->geo.capacity)
        return pkv_err(PKV_ECORRUPT, "%s: arena size overflows", path);
    a->data_offset = PKV_PAGE;
    a->secret = pkv_get_u64(h + 72);
    memcpy(a->model_id, h + HDR_MODEL_OFF, mlen);
    a->model_id[mlen] = '\0';
    return 0;
}

/* A mapping of an arena file received from elsewhere (pkvd's descriptor):
 * its own header must decode and describe exactly the geometry, stride and
 * model a has been given, or every slot address computed from a would land
 * in another block's payload (docs/format.md, "Header page"). */
int pkv_arena_check_header(const pkv_arena *a, const uint8_t *hdr, const char *what) {
    pkv_arena *f = calloc(1, sizeof *f);
    if (!f) return pkv_err(PKV_ENOMEM, "out of memory");
    int rc = header_decode(hdr, f, what);
    if (!rc) {
        const pkv_geometry *x = &f->geo, *y = &a->geo;
        if (x->num_layers != y->num_layers || x->num_kv_heads != y->num_kv_heads ||
            x->head_dim != y->head_dim || x->block_size != y->block_size ||
            x->dtype != y->dtype || x->capacity != y->capacity ||
            x->block_bytes != y->block_bytes || x->slot_bytes != y->slot_bytes ||
            f->data_offset != a->data_offset || strcmp(f->model_id, a->model_id) != 0)
            rc = pkv_err(PKV_EGEOMETRY, "%s: the file's header (slot stride %llu, capacity "
                         "%llu) is not what it was described as (stride %llu, capacity %llu)",
                         what, (unsigned long long)x->slot_bytes,
                         (unsigned long long)x->capacity, (unsigned long long)y->slot_bytes,
                         (unsigned long long)y->capacity);
    }
    free(f);
    return rc;
}

static int os_err(int e, const char *what, const char *path) {
    int code = (e == ENOSPC || e == EDQUOT) ? PKV_ENOSPC : PKV_EIO;
    return pkv_err(code, "%s %s: %s", what, path, strerror(e));
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return os_err(errno, "open directory", dir);
    int rc = fsync(fd) ? os_err(errno, "fsync directory", dir) : 0;
    close(fd);
    return rc;
}

/* Write a new arena to `path`.tmp, preallocate it, then rename it into `path`
 * and fsync `fdir`, the directory holding it. */
static int arena_create(pkv_arena *a, const char *fdir, const char *path) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return pkv_err(PKV_EINVAL, "arena path too long");
    if (getrandom(&a->secret, sizeof a->secret, 0) != (ssize_t)sizeof a->secret)
        return os_err(errno, "getrandom for", path);
    a->data_offset = PKV_PAGE;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return os_err(errno, "create", tmp);
    uint8_t hdr[PKV_PAGE];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    header_encode(hdr, a, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    uint64_t total = a->data_offset + a->geo.capacity * a->geo.slot_bytes;
    int rc = 0, e;
    ssize_t w = 0;
    if ((e = posix_fallocate(fd, 0, (off_t)total)) != 0)
        rc = os_err(e, "preallocate", tmp);
    else if ((w = pwrite(fd, hdr, PKV_PAGE, 0)) != PKV_PAGE)
        rc = os_err(w < 0 ? errno : EIO, "write header of", tmp);
    else if (fsync(fd))
        rc = os_err(errno, "fsync", tmp);
    else if (rename(tmp, path))
        rc = os_err(errno, "rename to", path);
    else
        rc = fsync_dir(fdir);
    if (rc) {
        close(fd);
        unlink(tmp);
        return rc;
    }
    a->fd = fd;
    return 0;
}

/* ---- Where the arena file is ----------------------------------------------
 * Without arena_dir the arena is the regular file dir/arena. With arena_dir it
 * is a file in that directory (named pkv-arena-<random>, so several caches can
 * share one arena_dir) and dir/arena is a symbolic link holding its absolute
 * path; kvdump and read-only opens just follow the link. The link is written
 * before the file: a crash in between leaves a dangling link, and the next open
 * with arena_dir creates the file the link names (recovery then finds an arena
 * created afresh and drops the blocks the log describes), so no orphan file is
 * ever left in arena_dir except a .tmp that the same name overwrites. */

typedef enum { LOC_EXISTS, LOC_CREATE, LOC_CREATE_LINKED } arena_loc;

/* realpath() of `d` into out (PATH_MAX bytes); `d` must be a directory (checked
 * before any link naming a file in it is written). */
static int real_dir(const char *d, char *out, const char *what) {
    if (!realpath(d, out))
        return pkv_err(errno == ENOENT ? PKV_EINVAL : PKV_EIO, "%s %s: %s", what, d,
                       strerror(errno));
    struct stat st;
    if (stat(out, &st)) return os_err(errno, "stat", out);
    if (!S_ISDIR(st.st_mode)) return pkv_err(PKV_EINVAL, "%s %s is not a directory", what, d);
    return 0;
}

/* Decide where the arena is and whether it must be created; fills a->path and,
 * for LOC_CREATE_LINKED, `fdir` (the directory that will hold the file). */
static int arena_locate(pkv_arena *a, const char *dir, const char *adir, char *fdir,
                        arena_loc *loc) {
    char link[4200];
    if (snprintf(link, sizeof link, "%s/arena", dir) >= (int)sizeof a->path)
        return pkv_err(PKV_EINVAL, "directory path too long");
    strcpy(fdir, dir);
    struct stat st;
    if (lstat(link, &st)) {
        if (errno != ENOENT) return os_err(errno, "stat", link);
        if (a->rdonly) return pkv_err(PKV_EIO, "%s: no arena file (nothing to inspect)", link);
        if (!adir) {
            strcpy(a->path, link);
            *loc = LOC_CREATE;
            return 0;
        }
        char real[PATH_MAX];
        uint64_t r;
        int rc = real_dir(adir, real, "arena_dir");
        if (rc) return rc;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) return os_err(errno, "getrandom for", link);
        if (snprintf(a->path, sizeof a->path, "%s/pkv-arena-%016llx", real,
                     (unsigned long long)r) >= (int)sizeof a->path)
            return pkv_err(PKV_EINVAL, "arena_dir path too long");
        strcpy(fdir, real);
        *loc = LOC_CREATE_LINKED;
        return 0;
    }
    if (S_ISREG(st.st_mode)) {
        if (adir)
            return pkv_err(PKV_EINVAL, "%s is a file in the cache directory; a cache cannot "
                           "move its arena to arena_dir %s (open it without arena_dir)", link, adir);
        strcpy(a->path, link);
        *loc = LOC_EXISTS;
        return 0;
    }
    if (!S_ISLNK(st.st_mode)) return pkv_err(PKV_ECORRUPT, "%s: not a regular file", link);
    ssize_t n = readlink(link, a->path, sizeof a->path - 1);
    if (n < 0) return os_err(errno, "read link", link);
    if (n == 0 || (size_t)n >= sizeof a->path - 1 || a->path[0] != '/')
        return pkv_err(PKV_ECORRUPT, "%s: the link does not hold an absolute arena path", link);
    a->path[n] = '\0';
    a->linked = true;
    /* The link's directory part, checked against arena_dir when one is given. */
    char *slash = strrchr(a->path, '/');
    char ldir[4200];
    snprintf(ldir, sizeof ldir, "%.*s", slash == a->path ? 1 : (int)(slash - a->path), a->path);
    if (adir) {
        char want[PATH_MAX], have[PATH_MAX];
        int rc = real_dir(adir, want, "arena_dir");
        if (rc) return rc;
        if (!realpath(ldir, have) || strcmp(want, have) != 0)
            return pkv_err(PKV_EINVAL, "%s links to %s, which is not in arena_dir %s", link,
                           a->path, adir);
    }
    if (stat(a->path, &st) == 0) {
        *loc = LOC_EXISTS;
        return 0;
    }
    if (errno != ENOENT) return os_err(errno, "stat", a->path);
    if (a->rdonly) return pkv_err(PKV_EIO, "%s: the arena file %s is missing", link, a->path);
    if (!adir)
        return pkv_err(PKV_EINVAL, "the arena file %s that %s links to is missing; open "
                       "with arena_dir to create it again there", a->path, link);
    strcpy(fdir, ldir);
    *loc = LOC_CREATE;
    return 0;
}

/* Point dir/arena at a->path: a link written to a temporary name, renamed into
 * place, the directory fsynced. */
static int arena_link(const pkv_arena *a, const char *dir) {
    char link[4200], tmp[4200];
    snprintf(link, sizeof link, "%s/arena", dir);
    snprintf(tmp, sizeof tmp, "%s/arena.link.tmp", dir);
    unlink(tmp);
    if (symlink(a->path, tmp)) return os_err(errno, "create link", tmp);
    if (rename(tmp, link)) {
        int rc = os_err(errno, "rename to", link);
        unlink(tmp);
        return rc;
    }
    return fsync_dir(dir);
}

static int check_matches(const pkv_arena *a, const pkv_geometry *want,
                         const pkv_options *opt) {
    const pkv_geometry *g = &a->geo;
    /* The identity first: a cache of another model is refused as that, whatever its
     * geometry, so the caller learns the cause rather than a size that follows from it. */
    if (strcmp(a->model_id, opt->model_id) != 0)
        return pkv_err(PKV_EMODEL, "cache holds KV of model \"%s\", requested \"%s\"",
                       a->model_id, opt->model_id);
#define SAME(f)                                                                 \
    if (g->f != want->f)                                                        \
        return pkv_err(PKV_EGEOMETRY, "cache has " #f " %llu, requested %llu",   \
                       (unsigned long long)g->f, (unsigned long long)want->f);
    SAME(num_layers) SAME(num_kv_heads) SAME(head_dim) SAME(block_size)
#undef SAME
    if (g->dtype != want->dtype)
        return pkv_err(PKV_EGEOMETRY, "cache has dtype %s, requested %s",
                       dtype_name(g->dtype), dtype_name(want->dtype));
    if (want->capacity && g->capacity != want->capacity)
        return pkv_err(PKV_EGEOMETRY, "cache has capacity %llu blocks, requested %llu",
                       (unsigned long long)g->capacity,
                       (unsigned long long)want->capacity);
    return 0;
}

static int arena_open_existing(pkv_arena *a, int fd, const char *path,
                               const pkv_geometry *want, const pkv_options *opt) {
    /* The file may be shorter than the header says (lost or truncated): recovery
     * drops the blocks whose slots are missing; a writer extends it again. */
    struct stat st;
    if (fstat(fd, &st)) return os_err(errno, "stat", path);
    if (!S_ISREG(st.st_mode)) return pkv_err(PKV_ECORRUPT, "%s: not a regular file", path);
    uint8_t hdr[PKV_PAGE];
    if (st.st_size < (off_t)PKV_PAGE)
        return pkv_err(PKV_ECORRUPT, "%s: %lld bytes, shorter than its header", path,
                       (long long)st.st_size);
    ssize_t r = pread(fd, hdr, PKV_PAGE, 0);
    if (r != PKV_PAGE) return os_err(r < 0 ? errno : EIO, "read", path);
    int rc = header_decode(hdr, a, path);
    if (rc) return rc;
    if ((rc = check_matches(a, want, opt))) return rc;
    uint64_t need = a->data_offset + a->geo.capacity * a->geo.slot_bytes;
    a->valid_blocks = a->geo.capacity;
    if ((uint64_t)st.st_size < need) {
        a->valid_blocks = ((uint64_t)st.st_size - a->data_offset) / a->geo.slot_bytes;
        if (!a->rdonly) {
            int e = posix_fallocate(fd, 0, (off_t)need);
            if (e) return os_err(e, "extend short arena", path);
        }
    }
    a->fd = fd;
    return 0;
}

/* A writer holds two exclusive flocks: on the directory (an O_DIRECTORY fd) and
 * on dir/LOCK. The LOCK file alone can be defeated: after `rm dir/LOCK` (or
 * `rm dir/...`) a second opener creates a new LOCK inode, locks it and gets in
 * while the first writer still runs. The directory's inode cannot be replaced
 * while the directory is in use under its name, so its lock holds. LOCK stays
 * for older library versions, which lock only it. A file system that refuses
 * flock on a directory (EBADF, ENOLCK, EOPNOTSUPP, EINVAL: some NFS setups) is
 * left with the LOCK file alone (docs/format.md, "LOCK"). */
static int take_lock(pkv_arena *a, const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/LOCK", dir) >= (int)sizeof path)
        return pkv_err(PKV_EINVAL, "directory path too long");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return os_err(errno, "open directory", dir);
    if (flock(dfd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(dfd);
        dfd = -1;
        if (e == EWOULDBLOCK)
            return pkv_err(PKV_EBUSY, "%s is open elsewhere (the directory is locked "
                           "by another writable handle)", dir);
        if (!(e == EBADF || e == ENOLCK || e == EOPNOTSUPP || e == EINVAL))
            return os_err(e, "lock directory", dir);
        /* no directory locks on this file system: LOCK alone guards */
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        int rc = os_err(errno, "open", path);
        if (dfd >= 0) close(dfd);
        return rc;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(fd);
        if (dfd >= 0) close(dfd);
        if (e == EWOULDBLOCK)
            return pkv_err(PKV_EBUSY, "%s is open elsewhere (locked)", dir);
        return os_err(e, "lock", path);
    }
    a->lock_fd = fd;
    a->dir_fd = dfd;
    return 0;
}

int pkv_arena_open(pkv_arena *a, const char *dir, const pkv_options *opt, bool rdonly) {
    memset(a, 0, sizeof *a);
    a->fd = a->lock_fd = a->dir_fd = -1;
    a->rdonly = rdonly;
    pkv_geometry want;
    int rc = pkv_geometry_from_options(opt, &want);
    if (rc) return rc;
    if (!opt->model_id || !opt->model_id[0] || strlen(opt->model_id) > PKV_MODEL_ID_MAX)
        return pkv_err(PKV_EINVAL, "model_id must be 1..%u bytes", PKV_MODEL_ID_MAX);
    if (!dir || !dir[0]) return pkv_err(PKV_EINVAL, "directory is NULL or empty");
    if (!rdonly && mkdir(dir, 0700) && errno != EEXIST)
        return os_err(errno, "create directory", dir);
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return pkv_err(rdonly ? PKV_EIO : PKV_EINVAL, "%s is not a directory", dir);
    if (!rdonly && (rc = take_lock(a, dir))) return rc;

    const char *adir = opt->arena_dir && opt->arena_dir[0] ? opt->arena_dir : NULL;
    if (adir && !rdonly && mkdir(adir, 0700) && errno != EEXIST) {
        rc = os_err(errno, "create arena directory", adir);
        goto fail;
    }
    char fdir[4200];
    arena_loc loc = LOC_EXISTS;
    if ((rc = arena_locate(a, dir, adir, fdir, &loc))) goto fail;
    const char *path = a->path;
    if (loc == LOC_EXISTS) {
        int fd = open(path, (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
        if (fd < 0) {
            rc = os_err(errno, "open", path);
            goto fail;
        }
        rc = arena_open_existing(a, fd, path, &want, opt);
        if (rc) close(fd);
    } else {
        if (!opt->capacity) {
            rc = pkv_err(PKV_EINVAL, "capacity must be > 0 to create %s", path);
            goto fail;
        }
        a->geo = want;
        memcpy(a->model_id, opt->model_id, strlen(opt->model_id) + 1);
        if (loc == LOC_CREATE_LINKED) {
            a->linked = true;
            rc = arena_link(a, dir);
        }
        if (!rc) rc = arena_create(a, fdir, path);
        a->created = true;
        a->valid_blocks = a->geo.capacity;
    }
    if (rc) goto fail;

    a->map_len = a->data_offset +
                 (rdonly ? a->valid_blocks : a->geo.capacity) * a->geo.slot_bytes;
    int mflags = MAP_SHARED | ((opt->flags & PKV_OPEN_PREFAULT) ? MAP_POPULATE : 0);
    void *m = mmap(NULL, a->map_len, rdonly ? PROT_READ : PROT_READ | PROT_WRITE, mflags,
                   a->fd, 0);
    if (m == MAP_FAILED) {
        rc = pkv_err(errno == ENOMEM ? PKV_ENOMEM : PKV_EIO, "mmap %s (%llu bytes): %s",
                     path, (unsigned long long)a->map_len, strerror(errno));
        close(a->fd);
        a->fd = -1;
        goto fail;
    }
    a->map = m;
    /* Blocks are touched in no particular order; kernel readahead around a fault
     * would fill the page cache with neighbouring slots nobody asked for. */
    madvise(m, a->map_len, MADV_RANDOM);
    return 0;
fail:
    if (a->lock_fd >= 0) close(a->lock_fd);
    if (a->dir_fd >= 0) close(a->dir_fd);
    a->lock_fd = a->dir_fd = -1;
    return rc;
}

void pkv_arena_close(pkv_arena *a) {
    if (a->map) munmap(a->map, a->map_len);
    if (a->fd >= 0) close(a->fd);
    if (a->lock_fd >= 0) close(a->lock_fd); /* releases the flocks */
    if (a->dir_fd >= 0) close(a->dir_fd);
    a->map = NULL;
    a->fd = a->lock_fd = a->dir_fd = -1;
}

void pkv_arena_copy_tokens(const pkv_arena *a, uint32_t dst, uint32_t src, uint32_t n) {
    const pkv_geometry *g = &a->geo;
    size_t bytes = (size_t)n * g->head_dim * g->elem_size;
    uint64_t runs = 2ull * g->num_layers * g->num_kv_heads;
    uint8_t *d = pkv_arena_block(a, dst), *s = pkv_arena_block(a, src);
    for (uint64_t r = 0; r < runs; r++)
        memcpy(d + r * g->run_bytes, s + r * g->run_bytes, bytes);
}

/* libxxhash's AVX2 and AVX-512 paths (0.8.1, Debian 12) return with the upper
 * halves of the vector registers dirty: the dispatched functions end without a
 * vzeroupper. Until something clears them, every legacy-SSE instruction that
 * runs next, in this library (built for baseline x86-64) and in libc, pays the
 * SSE/AVX transition cost, and on Intel the core keeps its wide-vector power
 * licence: a sealing commit's small checksum then costs several times its clean
 * cost (docs/benchmarks-history.md, "A biased cache lock, adopted, and the
 * payload checksum's dirty vector state"). So clear them after
 * each sum, where the CPU and the OS support AVX (vzeroupper is an AVX
 * instruction; without AVX the dispatcher never used those paths). */
#if defined(PKV_XXH3_DISPATCHED) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
static bool g_clear_upper; /* set once, before any thread of the caller runs */

__attribute__((constructor)) static void detect_avx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned need = (1u << 27) | (1u << 28); /* OSXSAVE, AVX */
    if ((c & need) != need) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    g_clear_upper = (lo & 6u) == 6u; /* the OS saves XMM and YMM state */
}

__attribute__((target("avx"))) static void clear_upper(void) {
    __builtin_ia32_vzeroupper();
}

uint64_t pkv_arena_sum(const pkv_arena *a, uint32_t b) {
    uint64_t sum = PKV_XXH3_WIDE(pkv_arena_block(a, b), a->geo.block_bytes);
    if (g_clear_upper) clear_upper();
    return sum;
}
#else
uint64_t pkv_arena_sum(const pkv_arena *a, uint32_t b) {
    return PKV_XXH3_WIDE(pkv_arena_block(a, b), a->geo.block_bytes);
}
#endif

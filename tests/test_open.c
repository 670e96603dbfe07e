/* Opening, reopening and validating caches; error strings; pkv_kv bounds and layout. */
#include "pkv_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(open, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
#define CAP 16u

/* The slot stride a new arena gets: several small blocks to a page (the smallest
 * power of two of at least 64 bytes that holds one), whole pages for blocks over
 * half a page (docs/format.md, "Arena file"). */
static uint64_t want_stride(uint64_t block_bytes)
{
    if (block_bytes > 2048) return (block_bytes + 4095) / 4096 * 4096;
    uint64_t s = 64;
    while (s < block_bytes) s *= 2;
    return s;
}

static void default_opts(pkv_options *o)
{
    pt_opts(o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
}

/* Whole-file fingerprint: size, mode, mtime and every byte. */
typedef struct {
    struct stat st;
    uint8_t *bytes;
    size_t len;
} file_fp;

static void fp_take(file_fp *fp, const char *path)
{
    memset(fp, 0, sizeof *fp);
    cr_assert_eq(stat(path, &fp->st), 0, "stat(%s): %s", path, strerror(errno));
    fp->len = (size_t)fp->st.st_size;
    fp->bytes = malloc(fp->len ? fp->len : 1);
    cr_assert_not_null(fp->bytes);
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    size_t got = 0;
    while (got < fp->len) {
        ssize_t r = read(fd, fp->bytes + got, fp->len - got);
        cr_assert(r > 0, "read(%s): %s", path, strerror(errno));
        got += (size_t)r;
    }
    close(fd);
}

static void fp_same(const file_fp *a, const char *path, const char *what)
{
    file_fp b;
    fp_take(&b, path);
    cr_assert_eq(b.len, a->len, "%s: arena size changed %zu -> %zu", what, a->len, b.len);
    cr_assert_eq(b.st.st_mode, a->st.st_mode, "%s: arena mode changed", what);
    cr_assert(b.st.st_mtim.tv_sec == a->st.st_mtim.tv_sec &&
                  b.st.st_mtim.tv_nsec == a->st.st_mtim.tv_nsec,
              "%s: arena mtime changed", what);
    cr_assert(memcmp(a->bytes, b.bytes, a->len) == 0, "%s: arena bytes changed", what);
    free(b.bytes);
}

static void fp_free(file_fp *fp)
{
    free(fp->bytes);
}

static int try_open(const char *sub, const pkv_options *o, pkv_cache **out)
{
    char path[512];
    pt_path(path, sizeof path, sub);
    *out = NULL;
    return pkv_open(path, o, out);
}

Test(open, create_layout_and_modes)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    char dir[512], arena[600];
    pt_path(dir, sizeof dir, "cache");
    snprintf(arena, sizeof arena, "%s/arena", dir);
    struct stat sd, sa;
    cr_assert_eq(stat(dir, &sd), 0);
    cr_assert(S_ISDIR(sd.st_mode));
    cr_assert_eq(sd.st_mode & 0777, 0700, "cache dir mode %o", sd.st_mode & 0777);
    cr_assert_eq(stat(arena, &sa), 0, "arena file missing: %s", strerror(errno));
    cr_assert(S_ISREG(sa.st_mode));
    cr_assert_eq(sa.st_mode & 0777, 0600, "arena mode %o", sa.st_mode & 0777);

    pkv_cache_info inf = pt_info(c);
    cr_assert_eq(inf.num_layers, PT_LAYERS);
    cr_assert_eq(inf.num_kv_heads, PT_HEADS);
    cr_assert_eq(inf.head_dim, PT_HDIM);
    cr_assert_eq(inf.block_size, BS);
    cr_assert_eq(inf.dtype, PKV_F32);
    cr_assert_eq(inf.elem_size, 4);
    cr_assert_eq(inf.capacity, CAP);
    cr_assert_eq(inf.run_bytes, (uint64_t)BS * PT_HDIM * 4);
    cr_assert_eq(inf.block_bytes, (uint64_t)PT_LAYERS * 2 * PT_HEADS * inf.run_bytes);
    cr_assert_eq(inf.slot_bytes, want_stride(inf.block_bytes));
    cr_assert_eq(inf.slot_bytes, 512, "the test's 512-byte blocks pack 8 to a page");
    cr_assert_str_eq(inf.model_id, PT_MODEL);
    cr_assert_eq((uint64_t)sa.st_size, 4096 + CAP * inf.slot_bytes, "arena size %lld",
                 (long long)sa.st_size);

    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.capacity, CAP);
    cr_assert_eq(st.blocks_free, CAP);
    cr_assert_eq(st.blocks_used + st.blocks_cached + st.blocks_sealed + st.sequences, 0);

    /* Payload layout: [layer][K|V][head][token][dim] inside slots of slot_bytes after
     * a 4096-byte header page (512-byte blocks here: 8 to a page). */
    uint8_t *base = pkv_kv(c, 0, 0, PKV_K, 0);
    cr_assert_not_null(base);
    cr_assert_eq((uintptr_t)base % 4096, 0, "slot 0 not page aligned");
    for (uint32_t b = 0; b < CAP; b++)
        for (uint32_t l = 0; l < PT_LAYERS; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t h = 0; h < PT_HEADS; h++) {
                    uint8_t *p = pkv_kv(c, b, l, (pkv_kind)k, h);
                    uint64_t want = b * inf.slot_bytes + ((l * 2 + k) * PT_HEADS + h) * inf.run_bytes;
                    cr_assert_eq((uint64_t)(p - base), want, "pkv_kv(%u,%u,%u,%u)", b, l, k, h);
                }

    /* Written K/V lands in the arena file at that offset. */
    uint8_t *run = pkv_kv(c, 5, 1, PKV_V, 1);
    for (uint32_t i = 0; i < inf.run_bytes; i++)
        run[i] = (uint8_t)(i * 7 + 3);
    uint64_t off = 4096 + 5 * inf.slot_bytes + ((1 * 2 + 1) * PT_HEADS + 1) * inf.run_bytes;
    pt_close(c);
    file_fp fp;
    fp_take(&fp, arena);
    for (uint32_t i = 0; i < inf.run_bytes; i++)
        cr_assert_eq(fp.bytes[off + i], (uint8_t)(i * 7 + 3), "arena byte %llu",
                     (unsigned long long)(off + i));
    fp_free(&fp);
}

Test(open, existing_empty_directory)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = NULL;
    int r = pkv_open(pt_dir, &o, &c); /* mkdtemp's directory already exists */
    cr_assert_eq(r, 0, "pkv_open on an existing empty dir -> %d (%s)", r, pkv_last_error());
    PT_CHECK(c);
    pkv_close(c);
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", pt_dir);
    struct stat sa;
    cr_assert_eq(stat(arena, &sa), 0);
}

Test(open, reopen_same_options)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    uint32_t a[10];
    for (int i = 0; i < 10; i++)
        a[i] = (uint32_t)i;
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 10));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, a, 0, 6);
    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
    pt_close(c); /* closing with live sequences is fine */

    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.capacity, CAP);
    cr_assert_eq(st.blocks_free + st.blocks_cached + st.blocks_used, CAP);
    pkv_cache_info inf = pt_info(c);
    cr_assert_str_eq(inf.model_id, PT_MODEL);
    if (st.sequences == 0) {
        /* Metadata in memory only (version 0.1): the cache starts empty. */
        cr_assert_eq(st.blocks_free, CAP);
        cr_assert_eq(st.blocks_sealed, 0);
        PT_ERR(pkv_seq_get_info(c, 1, &(pkv_seq_info){0}), PKV_ENOSEQ);
        PT_ERR(pkv_seq_get_info(c, 2, &(pkv_seq_info){0}), PKV_ENOSEQ);
    } else {
        /* Metadata persisted (write-ahead log): the open sequences come back with
         * their committed tokens and K/V; pending tokens were never durable. */
        cr_assert_eq(st.sequences, 2);
        PT_VERIFY(c, 1, 0, a, 10, 10);
        PT_VERIFY(c, 2, 0, a, 3, 3);
        cr_assert_eq(st.blocks_sealed, 2);
    }
    /* The cache is usable. */
    PT_SEQ_OPEN(c, 3, 0, NULL, 0);
    PT_APPEND(c, 3, 0, a, 0, 10);
    PT_OK(pkv_seq_commit(c, 3, 10));
    PT_CHECK(c);
    PT_VERIFY(c, 3, 0, a, 10, 10);
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    pt_close(c);

    /* capacity 0 means "as stored". */
    o.capacity = 0;
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    inf = pt_info(c);
    cr_assert_eq(inf.capacity, CAP);
    st = pt_stats(c);
    cr_assert_eq(st.capacity, CAP);
    cr_assert_eq(st.blocks_free + st.blocks_cached + st.blocks_used, CAP);
    pt_close(c);
}

Test(open, reopen_with_different_geometry_or_model_fails_and_leaves_file_intact)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    pt_close(c);
    char arena[600];
    pt_path(arena, sizeof arena, "cache/arena");
    file_fp fp;
    fp_take(&fp, arena);
    usleep(20000); /* make an mtime change observable */

    struct {
        const char *what;
        pkv_options o;
        int want;
    } cases[10];
    size_t n = 0;
#define CASE(WHAT, FIELD, VALUE, WANT)                                               \
    do {                                                                           \
        cases[n].what = WHAT;                                                      \
        cases[n].o = o;                                                            \
        cases[n].o.FIELD = VALUE;                                                  \
        cases[n].want = WANT;                                                      \
        n++;                                                                       \
    } while (0)
    CASE("num_layers", num_layers, PT_LAYERS + 1, PKV_EGEOMETRY);
    CASE("num_kv_heads", num_kv_heads, PT_HEADS + 1, PKV_EGEOMETRY);
    CASE("head_dim", head_dim, PT_HDIM * 2, PKV_EGEOMETRY);
    CASE("block_size", block_size, BS * 2, PKV_EGEOMETRY);
    CASE("block_size smaller", block_size, BS - 1, PKV_EGEOMETRY);
    CASE("dtype", dtype, PKV_F16, PKV_EGEOMETRY);
    CASE("dtype bf16", dtype, PKV_BF16, PKV_EGEOMETRY);
    CASE("capacity", capacity, CAP + 1, PKV_EGEOMETRY);
    CASE("model_id", model_id, "another-model", PKV_EMODEL);
    CASE("model_id prefix", model_id, "pagedkv-test-model/v", PKV_EMODEL);
#undef CASE
    for (size_t i = 0; i < n; i++) {
        pkv_cache *c2 = NULL;
        int r = try_open("cache", &cases[i].o, &c2);
        cr_assert_eq(r, cases[i].want, "reopen with different %s -> %d (%s), expected %d",
                     cases[i].what, r, pkv_strerror(r), cases[i].want);
        if (r == 0)
            pkv_close(c2);
        cr_assert(pkv_last_error()[0] != '\0', "no detailed message after %s mismatch",
                  cases[i].what);
        fp_same(&fp, arena, cases[i].what);
    }
    /* And the original options still open it. */
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pt_close(c);
    fp_free(&fp);
}

Test(open, second_open_is_busy)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    pkv_cache *c2 = NULL;
    PT_ERR(try_open("cache", &o, &c2), PKV_EBUSY);
    PT_CHECK(c);
    /* Another process is refused too. */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        pkv_cache *c3 = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/cache", pt_dir);
        int r = pkv_open(path, &o, &c3);
        _exit(r == PKV_EBUSY ? 0 : 10 + (-r));
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "open from another process: exit status %d (10 + -error)", WEXITSTATUS(status));
    /* The first handle is still fine, and after closing it the dir opens again. */
    uint32_t a[3] = {1, 2, 3};
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 3);
    PT_VERIFY(c, 1, 0, a, 3, 0);
    pt_close(c);
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
}

/* In a forked child: open pt_dir/cache with `flags`; exit 0 if the result is `want`,
 * else 10 + -result. The child shares no open file description with the parent's
 * locks (each open makes its own), as another process would. */
static void open_in_child_expect(const pkv_options *base, uint32_t flags, int want,
                                 const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        pkv_options o = *base;
        o.flags |= flags;
        pkv_cache *c = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/cache", pt_dir);
        int r = pkv_open(path, &o, &c);
        if (r == 0 && flags & PKV_OPEN_RDONLY) {
            pkv_seq_info si;
            if (pkv_seq_get_info(c, 1, &si) || si.committed != 3) r = PKV_ECORRUPT;
        }
        _exit(r == want ? 0 : 10 + (-r));
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s: exit status %d (10 + -error; expected error %d)", what,
              WEXITSTATUS(status), want);
}

Test(open, a_held_cache_stays_locked_when_its_files_are_removed)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    uint32_t a[3] = {1, 2, 3};
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 3);
    PT_OK(pkv_seq_commit(c, 1, 3));
    PT_OK(pkv_sync(c));
    /* A reader still gets in beside the writer. */
    open_in_child_expect(&o, PKV_OPEN_RDONLY, 0, "read-only open beside a writer");
    /* `rm DIR/LOCK`: a second writer must not lock a new LOCK file and get in. */
    char path[1024];
    snprintf(path, sizeof path, "%s/cache/LOCK", pt_dir);
    cr_assert_eq(unlink(path), 0, "unlink %s: %s", path, strerror(errno));
    open_in_child_expect(&o, 0, PKV_EBUSY, "writable open after rm LOCK");
    /* Every file removed (rm DIR/...): the directory itself is still held. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cache", pt_dir);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            cr_assert_eq(unlink(path), 0, "unlink %s: %s", path, strerror(errno));
        }
    closedir(d);
    open_in_child_expect(&o, 0, PKV_EBUSY, "writable open after rm DIR/*");
    pkv_cache *c2 = NULL;
    PT_ERR(try_open("cache", &o, &c2), PKV_EBUSY);
    /* Closing the first handle frees the directory. */
    pt_close(c);
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
}

Test(open, invalid_options)
{
    pkv_options good;
    default_opts(&good);
    char long_id[PKV_MODEL_ID_MAX + 2];
    memset(long_id, 'm', sizeof long_id);
    long_id[PKV_MODEL_ID_MAX + 1] = '\0'; /* 256 bytes */

    struct {
        const char *what;
        pkv_options o;
    } cases[16];
    size_t n = 0;
#define CASE(WHAT, FIELD, VALUE)                                                     \
    do {                                                                           \
        cases[n].what = WHAT;                                                      \
        cases[n].o = good;                                                         \
        cases[n].o.FIELD = VALUE;                                                  \
        n++;                                                                       \
    } while (0)
    CASE("num_layers 0", num_layers, 0);
    CASE("num_kv_heads 0", num_kv_heads, 0);
    CASE("head_dim 0", head_dim, 0);
    CASE("block_size 0", block_size, 0);
    CASE("block_size > max", block_size, PKV_BLOCK_SIZE_MAX + 1);
    CASE("capacity 0 on create", capacity, 0);
    CASE("capacity > 2^31", capacity, (UINT64_C(1) << 31) + 1);
    CASE("model_id NULL", model_id, NULL);
    CASE("model_id empty", model_id, "");
    CASE("model_id 256 bytes", model_id, long_id);
    CASE("dtype out of range", dtype, (pkv_dtype)7);
    CASE("limbo wait and no limbo wait", flags, PKV_OPEN_LIMBO_WAIT | PKV_OPEN_NO_LIMBO_WAIT);
#undef CASE
    for (size_t i = 0; i < n; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "bad%zu", i);
        pkv_cache *c = NULL;
        int r = try_open(sub, &cases[i].o, &c);
        cr_assert_eq(r, PKV_EINVAL, "%s -> %d (%s), expected PKV_EINVAL", cases[i].what, r,
                     pkv_strerror(r));
        if (r == 0)
            pkv_close(c);
        cr_assert(pkv_last_error()[0] != '\0', "no detailed message after %s", cases[i].what);
    }
    pkv_cache *c = NULL;
    char path[512];
    pt_path(path, sizeof path, "x");
    PT_ERR(pkv_open(NULL, &good, &c), PKV_EINVAL);
    PT_ERR(pkv_open(path, NULL, &c), PKV_EINVAL);
    PT_ERR(pkv_open(path, &good, NULL), PKV_EINVAL);
    PT_ERR(pkv_open("", &good, &c), PKV_EINVAL);

    /* Boundary values that are valid. */
    pkv_options ok = good;
    ok.block_size = PKV_BLOCK_SIZE_MAX;
    ok.capacity = 2;
    ok.model_id = long_id + 1; /* exactly 255 bytes */
    cr_assert_eq(strlen(ok.model_id), PKV_MODEL_ID_MAX);
    pkv_cache *c2 = pt_open_sub("max", &ok);
    PT_CHECK(c2);
    pkv_cache_info inf = pt_info(c2);
    cr_assert_str_eq(inf.model_id, long_id + 1);
    cr_assert_eq(inf.block_size, PKV_BLOCK_SIZE_MAX);
    ok.block_size = 1;
    ok.model_id = "m";
    pkv_cache *c3 = pt_open_sub("min", &ok);
    PT_CHECK(c3);
    uint32_t a[3] = {4, 5, 6};
    PT_SEQ_OPEN(c3, 1, 0, NULL, 0);
    PT_APPEND(c3, 1, 0, a, 0, 2);
    PT_OK(pkv_seq_commit(c3, 1, 2));
    PT_CHECK(c3);
    PT_OK(pkv_seq_close(c3, 1));
    PT_CHECK(c3);
    cr_assert_eq(PT_SEQ_OPEN(c3, 2, 0, a, 3), 2, "block_size 1: n-1 cap");
}

Test(open, open_on_a_regular_file_fails)
{
    char path[512];
    pt_path(path, sizeof path, "file");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("not a directory", f);
    fclose(f);
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = NULL;
    PT_ERR(pkv_open(path, &o, &c), PKV_EINVAL); /* docs/api.md: not a directory */
    cr_assert_null(c, "*out is set to NULL on failure");
}

Test(open, truncated_arena_is_rejected)
{
    pkv_options o;
    default_opts(&o);
    pkv_cache *c = pt_open_sub("cache", &o);
    pt_close(c);
    char arena[600];
    pt_path(arena, sizeof arena, "cache/arena");
    cr_assert_eq(truncate(arena, 100), 0);
    pkv_cache *c2 = NULL;
    int r = try_open("cache", &o, &c2);
    cr_assert_eq(r, PKV_ECORRUPT, "truncated arena -> %d (%s)", r, pkv_strerror(r));
    cr_assert_null(c2);
}

Test(open, close_null_and_options_init)
{
    pkv_close(NULL);
    pkv_options o;
    memset(&o, 0xAB, sizeof o);
    pkv_options_init(&o);
    cr_assert_eq(o.dtype, PKV_F16);
    cr_assert_eq(o.block_size, 16);
}

Test(open, strerror_for_every_code)
{
    const int codes[] = {PKV_OK,     PKV_EINVAL, PKV_ENOMEM,    PKV_EFULL,   PKV_ENOSEQ,
                         PKV_EEXIST, PKV_ERANGE, PKV_ESTATE,    PKV_EIO,     PKV_ENOSPC,
                         PKV_EGEOMETRY, PKV_EMODEL, PKV_ECORRUPT, PKV_EBUSY, PKV_EVERSION,
                         PKV_ENOTSUP};
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = pkv_strerror(codes[i]);
        cr_assert_not_null(s, "code %d", codes[i]);
        cr_assert(s[0] != '\0', "empty string for %d", codes[i]);
        cr_assert_str_neq(s, "unknown error", "code %d reported unknown", codes[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(s, pkv_strerror(codes[j]), "codes %d and %d share \"%s\"",
                              codes[i], codes[j], s);
    }
    const int unknown[] = {1, 7, -100, -1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        cr_assert_str_eq(pkv_strerror(unknown[i]), "unknown error", "code %d", unknown[i]);
}

Test(open, last_error)
{
    const char *e = pkv_last_error();
    cr_assert_not_null(e);
    cr_assert_str_eq(e, "", "no call failed yet on this thread");
    pkv_cache *c = NULL;
    cr_assert_eq(pkv_open(NULL, NULL, &c), PKV_EINVAL);
    e = pkv_last_error();
    cr_assert_not_null(e);
    cr_assert(e[0] != '\0', "detailed message expected after a failure");
}

Test(open, kv_out_of_range_is_null)
{
    pkv_cache *c = pt_open(BS, CAP);
    cr_assert_not_null(pkv_kv(c, CAP - 1, PT_LAYERS - 1, PKV_V, PT_HEADS - 1));
    cr_assert_null(pkv_kv(c, CAP, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, UINT32_MAX, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, 0, PT_LAYERS, PKV_K, 0));
    cr_assert_null(pkv_kv(c, 0, 0, (pkv_kind)2, 0));
    cr_assert_null(pkv_kv(c, 0, 0, PKV_K, PT_HEADS));
    cr_assert_null(pkv_kv(NULL, 0, 0, PKV_K, 0));
    PT_CHECK(c);
    PT_ERR(pkv_info(NULL, &(pkv_cache_info){0}), PKV_EINVAL);
    PT_ERR(pkv_info(c, NULL), PKV_EINVAL);
}

Test(open, geometry_variants)
{
    static const struct {
        uint32_t layers, heads, hdim, bs;
        pkv_dtype dt;
        uint32_t elem;
    } g[] = {
        {1, 1, 1, 1, PKV_F32, 4},   {3, 4, 64, 16, PKV_F16, 2}, {2, 8, 128, 16, PKV_BF16, 2},
        {1, 2, 3, 5, PKV_F32, 4},   {4, 1, 2, 32, PKV_F16, 2},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        pkv_options o;
        pt_opts(&o, g[i].layers, g[i].heads, g[i].hdim, g[i].bs, g[i].dt, 8);
        char sub[16];
        snprintf(sub, sizeof sub, "g%zu", i);
        pkv_cache *c = pt_open_sub(sub, &o);
        pkv_cache_info inf = pt_info(c);
        cr_assert_eq(inf.elem_size, g[i].elem);
        cr_assert_eq(inf.run_bytes, (uint64_t)g[i].bs * g[i].hdim * g[i].elem);
        cr_assert_eq(inf.block_bytes, (uint64_t)g[i].layers * 2 * g[i].heads * inf.run_bytes);
        cr_assert_eq(inf.slot_bytes, want_stride(inf.block_bytes), "geometry %zu: stride %llu",
                     i, (unsigned long long)inf.slot_bytes);
        /* A sequence spanning several blocks round-trips. */
        uint32_t t[40];
        for (int k = 0; k < 40; k++)
            t[k] = (uint32_t)(k * 3 + 1);
        size_t n = 3 * g[i].bs + 1 <= 40 ? 3 * g[i].bs + 1 : 40;
        PT_SEQ_OPEN(c, 1, 0, NULL, 0);
        PT_APPEND(c, 1, 0, t, 0, n);
        PT_OK(pkv_seq_commit(c, 1, n));
        PT_CHECK(c);
        PT_VERIFY(c, 1, 0, t, n, n);
        pt_close(c);
    }
}

/* ---- The arena in another directory (pkv_options.arena_dir) --------------- */

/* Fill seq 1 with 10 committed tokens and seq 2 with 3 of 6. */
static void fill_two(pkv_cache *c, const uint32_t *a)
{
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 10));
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    PT_APPEND(c, 2, 0, a, 0, 6);
    PT_OK(pkv_seq_commit(c, 2, 3));
    PT_CHECK(c);
}

/* The one file in `d` whose name starts with pkv-arena-, into out; the count. */
static int arena_files(const char *d, char *out, size_t cap)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -1 %s", d);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "pkv-arena-", 10) == 0) {
            n++;
            snprintf(out, cap, "%s/%s", d, line);
        }
    }
    pclose(p);
    return n;
}

Test(open, arena_dir_holds_the_arena_and_the_cache_dir_links_to_it)
{
    uint32_t a[10];
    for (int i = 0; i < 10; i++)
        a[i] = (uint32_t)(100 + i);
    char adir[512], link[512], file[1024], target[1024];
    pt_path(adir, sizeof adir, "shm/arenas"); /* created on demand (its parent must exist) */
    pt_path(link, sizeof link, "shm");
    cr_assert_eq(mkdir(link, 0700), 0);
    pkv_options o;
    default_opts(&o);
    o.arena_dir = adir;
    pkv_cache *c = pt_open_sub("cache", &o);
    fill_two(c, a);
    pt_close(c);

    /* dir/arena is a symbolic link to the one arena file in arena_dir; the log
     * stays in the cache directory. */
    pt_path(link, sizeof link, "cache/arena");
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "cache/arena is not a link");
    cr_assert_eq(arena_files(adir, file, sizeof file), 1);
    ssize_t n = readlink(link, target, sizeof target - 1);
    cr_assert(n > 0);
    target[n] = '\0';
    char real[PATH_MAX];
    cr_assert_not_null(realpath(file, real));
    cr_assert_str_eq(target, real);
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    char cache[512];
    pt_path(cache, sizeof cache, "cache");
    cr_assert_eq(arena_files(cache, file, sizeof file), 0);

    /* Reopen with the same arena_dir, and without one (the link is followed):
     * the sequences come back with their K/V. */
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    PT_VERIFY(c, 2, 0, a, 3, 3);
    pt_close(c);
    o.arena_dir = NULL;
    c = pt_open_sub("cache", &o);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    pt_close(c);

    /* Read-only opens follow the link too. */
    o.flags = PKV_OPEN_RDONLY;
    o.capacity = 0;
    pkv_cache *r = NULL;
    PT_OK(pkv_open(cache, &o, &r));
    PT_VERIFY(r, 2, 0, a, 3, 3);
    pkv_close(r);

    /* A second cache may share the arena directory: its own file. */
    default_opts(&o);
    o.arena_dir = adir;
    c = pt_open_sub("cache2", &o);
    pt_close(c);
    cr_assert_eq(arena_files(adir, file, sizeof file), 2);
}

Test(open, arena_dir_mismatch_is_refused_and_changes_nothing)
{
    uint32_t a[10];
    for (int i = 0; i < 10; i++)
        a[i] = (uint32_t)(7 * i);
    char adir[512], other[512], arena[512], file[1024], afile[1024];
    pt_path(adir, sizeof adir, "adir");
    pt_path(other, sizeof other, "other");
    cr_assert_eq(mkdir(other, 0700), 0);
    pkv_options o;
    default_opts(&o);
    o.arena_dir = adir;
    pkv_cache *c = pt_open_sub("linked", &o);
    fill_two(c, a);
    pt_close(c);
    cr_assert_eq(arena_files(adir, afile, sizeof afile), 1);
    file_fp fp;
    fp_take(&fp, afile);

    /* Another arena_dir than the one the link points into. */
    o.arena_dir = other;
    pkv_cache *x = NULL;
    PT_ERR(try_open("linked", &o, &x), PKV_EINVAL);
    cr_assert_null(x);
    cr_assert(strstr(pkv_last_error(), "not in arena_dir"), "%s", pkv_last_error());
    cr_assert_eq(arena_files(other, file, sizeof file), 0);
    fp_same(&fp, afile, "wrong arena_dir");
    fp_free(&fp);

    /* A cache whose arena is a file in its own directory cannot move it. */
    default_opts(&o);
    c = pt_open_sub("plain", &o);
    pt_close(c);
    pt_path(arena, sizeof arena, "plain/arena");
    fp_take(&fp, arena);
    o.arena_dir = other;
    PT_ERR(try_open("plain", &o, &x), PKV_EINVAL);
    cr_assert(strstr(pkv_last_error(), "cannot move"), "%s", pkv_last_error());
    fp_same(&fp, arena, "arena_dir for an in-directory arena");
    cr_assert_eq(arena_files(other, file, sizeof file), 0);
    fp_free(&fp);

    /* The original cache still opens with its own arena_dir. */
    o.arena_dir = adir;
    c = pt_open_sub("linked", &o);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    pt_close(c);
}

Test(open, lost_arena_in_arena_dir_is_recreated_and_its_blocks_dropped)
{
    /* tmpfs emptied by a reboot: the log survives in the cache directory, the
     * arena does not. Without arena_dir the open is refused (no silent move into
     * the cache directory); with it a new arena is created where the link points
     * and recovery drops every block the log describes. */
    uint32_t a[10];
    for (int i = 0; i < 10; i++)
        a[i] = (uint32_t)(3 * i + 1);
    char adir[512], file[1024], link[512], target[1024];
    pt_path(adir, sizeof adir, "adir");
    pkv_options o;
    default_opts(&o);
    o.arena_dir = adir;
    pkv_cache *c = pt_open_sub("cache", &o);
    fill_two(c, a);
    PT_OK(pkv_sync(c));
    pt_close(c);
    cr_assert_eq(arena_files(adir, file, sizeof file), 1);
    cr_assert_eq(unlink(file), 0);

    o.arena_dir = NULL;
    pkv_cache *x = NULL;
    PT_ERR(try_open("cache", &o, &x), PKV_EINVAL);
    cr_assert(strstr(pkv_last_error(), "missing"), "%s", pkv_last_error());
    o.flags = PKV_OPEN_RDONLY;
    o.capacity = 0;
    PT_ERR(try_open("cache", &o, &x), PKV_EIO);

    default_opts(&o);
    o.arena_dir = adir;
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free, CAP);
    cr_assert_eq(st.blocks_sealed, 0);
    PT_ERR(pkv_seq_get_info(c, 1, &(pkv_seq_info){0}), PKV_ENOSEQ);
    /* Same file name as before: the link was kept. */
    pt_path(link, sizeof link, "cache/arena");
    ssize_t n = readlink(link, target, sizeof target - 1);
    cr_assert(n > 0);
    target[n] = '\0';
    char real[PATH_MAX];
    cr_assert_eq(arena_files(adir, file, sizeof file), 1);
    cr_assert_not_null(realpath(file, real));
    cr_assert_str_eq(target, real);
    /* And it works. */
    PT_SEQ_OPEN(c, 5, 0, NULL, 0);
    PT_APPEND(c, 5, 0, a, 0, 10);
    PT_OK(pkv_seq_commit(c, 5, 10));
    pt_close(c);
    c = pt_open_sub("cache", &o);
    PT_VERIFY(c, 5, 0, a, 10, 10);
    pt_close(c);
}

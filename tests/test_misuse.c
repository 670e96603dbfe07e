/* API misuse: every public call of include/pagedkv.h, with every class of bad
 * argument that applies to it -- NULL pointers, unknown and duplicate ids,
 * out-of-range indices and enum values, zero and huge lengths, a read-only handle
 * for mutating calls, a handle in the failed state -- returns the code that
 * docs/api.md (or docs/cuda.md and pagedkv.h for the CUDA layer) lists, leaves
 * its own message in pkv_last_error(), changes nothing (statistics, the sequence
 * list, every block table, token list and block payload, the log position), and
 * leaves pkv_check() passing.
 *
 * "Closed cache": pkv_close() frees the handle and docs/api.md says the handle
 * must not be used afterwards, so a call on a closed handle is undefined by
 * contract and is not tested (it would be a use-after-free). What the contract
 * does define is tested instead: a NULL handle, for every call that takes one,
 * and pkv_close(NULL) / pkv_cuda_close(NULL) as no-ops.
 *
 * Error precedence, where several errors apply to one mutating call (documented
 * in docs/api.md): PKV_EINVAL for a bad argument first, then PKV_ERDONLY, then
 * PKV_EFAILED, then the errors that depend on the cache's contents (PKV_ENOSEQ,
 * PKV_EEXIST, PKV_ESTATE, PKV_ERANGE, PKV_EFULL).
 *
 * The CUDA-layer calls are checked in whatever this build is: without the layer
 * every call is PKV_ENOTSUP; with it but without a usable device, calls with
 * valid arguments are PKV_ENOTSUP and NULL handles PKV_EINVAL; with a device
 * (tests/gpu/run.sh machines) a real handle and batch are misused too. */
#include "pkv_test.h"
#include "pkv_config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(misuse, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
#define CAP 16u

/* ---- Checking one failing call ---------------------------------------------------- */

/* Put a message no call under test can produce into pkv_last_error(), so that a
 * failing call that forgets to set its own message is caught. */
static void sentinel(void)
{
    float f = 0;
    uint16_t h = 0;
    cr_assert_eq(pkv_kv_load((pkv_dtype)424242, &f, &h, 1), PKV_EINVAL);
    cr_assert(strstr(pkv_last_error(), "424242"), "sentinel message not set: '%s'",
              pkv_last_error());
}

static void msg_ok_at(const char *file, int line, const char *expr, int code)
{
    const char *m = pkv_last_error();
    cr_assert(m != NULL, "%s:%d: %s: pkv_last_error() is NULL", file, line, expr);
    cr_assert(m[0] != '\0', "%s:%d: %s -> %d but pkv_last_error() is empty", file, line,
              expr, code);
    cr_assert(strstr(m, "424242") == NULL,
              "%s:%d: %s -> %d (%s) left the previous message: '%s'", file, line, expr, code,
              pkv_strerror(code), m);
    cr_assert(strcmp(pkv_strerror(code), "unknown error") != 0,
              "%s:%d: %s -> %d, a code pkv_strerror does not know", file, line, expr, code);
}

/* expr must return `code` and leave its own message. */
#define MS_ERR(expr, code)                                                              \
    do {                                                                                \
        sentinel();                                                                     \
        int r_ = (expr);                                                                \
        cr_assert_eq(r_, (code), "%s:%d: %s -> %d (%s: %s), expected %d (%s)", __FILE__, \
                     __LINE__, #expr, r_, pkv_strerror(r_), pkv_last_error(), (int)(code), \
                     pkv_strerror(code));                                               \
        msg_ok_at(__FILE__, __LINE__, #expr, r_);                                       \
    } while (0)

/* Whole-cache snapshot: pt_snap (stats, tables, tokens, payload of every block) plus
 * the sequence list and the log position, so a failing call that logged a record
 * is caught too. */
typedef struct ms_snap {
    pt_snap s;
    uint64_t ids[16];
    size_t n_ids;
    uint64_t last_lsn, wal_records;
} ms_snap;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t list_ids(pkv_cache *c, uint64_t *ids, size_t cap)
{
    size_t n = 0;
    PT_OK(pkv_seq_list(c, ids, cap, &n));
    qsort(ids, n, sizeof *ids, cmp_u64);
    return n;
}

static void ms_take(ms_snap *m, pkv_cache *c)
{
    memset(m, 0, sizeof *m);
    m->n_ids = list_ids(c, m->ids, 16);
    pt_snap_take(&m->s, c, m->ids, m->n_ids);
    pkv_stats st = pt_stats(c);
    m->last_lsn = st.last_lsn;
    m->wal_records = st.wal_records;
}

static void ms_same_at(const char *file, int line, const ms_snap *m, pkv_cache *c,
                       const char *what)
{
    uint64_t ids[16];
    size_t n = list_ids(c, ids, 16);
    cr_assert(n == m->n_ids && memcmp(ids, m->ids, n * sizeof *ids) == 0,
              "%s:%d: %s: the sequence list changed (%zu -> %zu sequences)", file, line, what,
              m->n_ids, n);
    pt_snap_same_at(file, line, &m->s, c, what);
    pkv_stats st = pt_stats(c);
    cr_assert(st.last_lsn == m->last_lsn && st.wal_records == m->wal_records,
              "%s:%d: %s: a failing call logged something (last_lsn %llu -> %llu)", file, line,
              what, (unsigned long long)m->last_lsn, (unsigned long long)st.last_lsn);
}

static void ms_free(ms_snap *m)
{
    pt_snap_free(&m->s);
}

/* A failing call on cache c: the code, a message, pkv_check passes, nothing changed. */
#define MS_BAD(c, snap, expr, code)                                                     \
    do {                                                                                \
        MS_ERR(expr, code);                                                             \
        PT_CHECK(c);                                                                    \
        ms_same_at(__FILE__, __LINE__, (snap), (c), #expr);                             \
    } while (0)

/* ---- The cache every test misuses --------------------------------------------------
 * seq 1: 10 tokens, 8 committed (2 sealed blocks + 1 open block with 2 pending);
 * seq 2: empty;
 * seq 4: 6 committed tokens (shares seq 1's first block, 1 open block);
 * seq 3: a fork of seq 4 (shares both its blocks);
 * plus 2 cached blocks left by a closed sequence 5. */
static uint32_t A[16], B[8];

static void populate(pkv_cache *c)
{
    for (uint32_t i = 0; i < 16; i++)
        A[i] = 10 + i;
    for (uint32_t i = 0; i < 8; i++)
        B[i] = 500 + i;
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, A, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    size_t nc = PT_SEQ_OPEN(c, 4, 0, A, 6);
    cr_assert_eq(nc, 4);
    PT_APPEND(c, 4, 0, A, 4, 2);
    PT_OK(pkv_seq_commit(c, 4, 2));
    PT_OK(pkv_seq_fork(c, 4, 3));
    PT_SEQ_OPEN(c, 5, 7, NULL, 0);
    PT_APPEND(c, 5, 7, B, 0, 8);
    PT_OK(pkv_seq_commit(c, 5, 8));
    PT_OK(pkv_seq_close(c, 5));
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.sequences, 4);
    cr_assert_eq(st.blocks_cached, 2);
}

static pkv_cache *make_cache(void)
{
    pkv_cache *c = pt_open(BS, CAP);
    populate(c);
    return c;
}

/* ---- Errors and messages ------------------------------------------------------------ */

static void *last_error_in_thread(void *arg)
{
    (void)arg;
    const char *m = pkv_last_error();
    return (void *)(m && m[0] == '\0' ? m : NULL);
}

Test(misuse, strerror_and_last_error)
{
    /* PKV_OK, then every code of the documented range, each with its own text */
    enum { N = PKV_ERR_FIRST - PKV_ERR_LAST + 2 };
    const char *seen[N];
    for (int i = 0; i < N; i++) {
        int code = i == 0 ? PKV_OK : PKV_ERR_FIRST - (i - 1);
        const char *s = pkv_strerror(code);
        cr_assert(s && s[0], "pkv_strerror(%d) is NULL or empty", code);
        cr_assert(strcmp(s, "unknown error") != 0, "pkv_strerror(%d) unknown", code);
        for (int k = 0; k < i; k++)
            cr_assert(strcmp(seen[k], s) != 0, "two codes share '%s' (%d)", s, code);
        seen[i] = s;
    }
    cr_assert_eq(PKV_EINVAL, PKV_ERR_FIRST);
    cr_assert_eq(PKV_EDISCONNECTED, PKV_ERR_LAST);
    /* below the range: -errno values of an I/O backend are not pkv codes */
    const int unknown[] = {1, 2, -1, -5, -17, -28, -4095, PKV_ERR_FIRST + 1,
                           PKV_ERR_LAST - 1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++)
        cr_assert_str_eq(pkv_strerror(unknown[i]), "unknown error");
    /* Fresh thread: "" (not NULL). A successful call leaves the message alone. */
    pthread_t th;
    void *res = NULL;
    cr_assert_eq(pthread_create(&th, NULL, last_error_in_thread, NULL), 0);
    pthread_join(th, &res);
    cr_assert_not_null(res, "pkv_last_error() in a new thread is not \"\"");
    sentinel();
    float f[2] = {1, 2}, g[2];
    PT_OK(pkv_kv_load(PKV_F32, g, f, 2));
    cr_assert(strstr(pkv_last_error(), "424242"), "a successful call changed the message");
}

/* ---- Opening -------------------------------------------------------------------------- */

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* pkv_open(dir, o) must fail with code, set *out to NULL and (for an invalid option)
 * create nothing. */
static void open_fails_at(int line, const char *dir, const pkv_options *o, int code,
                          bool creates_nothing)
{
    pkv_cache *c = (pkv_cache *)&c; /* not NULL: the call must reset it */
    sentinel();
    int r = pkv_open(dir, o, &c);
    cr_assert_eq(r, code, "line %d: pkv_open -> %d (%s: %s), expected %d (%s)", line, r,
                 pkv_strerror(r), pkv_last_error(), code, pkv_strerror(code));
    msg_ok_at(__FILE__, line, "pkv_open", r);
    cr_assert_null(c, "line %d: *out not NULL after a failed open", line);
    if (creates_nothing && dir)
        cr_assert(!exists(dir), "line %d: a failed open (%s) created %s", line,
                  pkv_strerror(code), dir);
}
#define OPEN_FAILS(dir, o, code, nothing) open_fails_at(__LINE__, (dir), (o), (code), (nothing))

static int io_open_stub(void *ctx, const char *p, int f, int m)
{
    (void)ctx, (void)p, (void)f, (void)m;
    return -EIO;
}

Test(misuse, options_and_open_arguments)
{
    pkv_options_init(NULL); /* ignored */
    pkv_options o;
    memset(&o, 0xAB, sizeof o);
    pkv_options_init(&o);
    cr_assert(o.dtype == PKV_F16 && o.block_size == 16 && o.num_layers == 0 &&
              o.capacity == 0 && o.model_id == NULL && o.flags == 0 && o.io == NULL &&
              o.durability == PKV_DURABLE_GROUP && o.group_commit_us == 0 &&
              o.checkpoint_bytes == 0);

    char dir[512];
    pt_path(dir, sizeof dir, "new");
    pkv_options good;
    pt_opts(&good, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);

    /* NULL out: EINVAL, nothing created. */
    sentinel();
    cr_assert_eq(pkv_open(dir, &good, NULL), PKV_EINVAL);
    msg_ok_at(__FILE__, __LINE__, "pkv_open(out NULL)", PKV_EINVAL);
    cr_assert(!exists(dir));
    OPEN_FAILS(dir, NULL, PKV_EINVAL, true);
    OPEN_FAILS(NULL, &good, PKV_EINVAL, false);
    OPEN_FAILS("", &good, PKV_EINVAL, false);

    /* Every option field out of range: EINVAL before anything is created, also on
     * a read-only open. */
#define BAD_OPT(stmt)                                                                   \
    do {                                                                                \
        pkv_options b_ = good;                                                          \
        stmt;                                                                           \
        OPEN_FAILS(dir, &b_, PKV_EINVAL, true);                                         \
        b_.flags |= PKV_OPEN_RDONLY;                                                    \
        OPEN_FAILS(dir, &b_, PKV_EINVAL, true);                                         \
    } while (0)
    BAD_OPT(b_.num_layers = 0);
    BAD_OPT(b_.num_layers = 4097);
    BAD_OPT(b_.num_kv_heads = 0);
    BAD_OPT(b_.num_kv_heads = 4097);
    BAD_OPT(b_.head_dim = 0);
    BAD_OPT(b_.head_dim = 65537);
    BAD_OPT(b_.block_size = 0);
    BAD_OPT(b_.block_size = PKV_BLOCK_SIZE_MAX + 1);
    BAD_OPT(b_.dtype = (pkv_dtype)3);
    BAD_OPT(b_.dtype = (pkv_dtype)-1);
    BAD_OPT(b_.capacity = (UINT64_C(1) << 31) + 1);
    BAD_OPT(b_.capacity = UINT64_MAX);
    /* capacity * slot_bytes overflows: 2^31 slots of 2^53 bytes. */
    BAD_OPT((b_.num_layers = 4096, b_.num_kv_heads = 4096, b_.head_dim = 65536,
             b_.block_size = PKV_BLOCK_SIZE_MAX, b_.capacity = UINT64_C(1) << 31));
    BAD_OPT(b_.model_id = NULL);
    BAD_OPT(b_.model_id = "");
    char longid[PKV_MODEL_ID_MAX + 2];
    memset(longid, 'm', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    BAD_OPT(b_.model_id = longid);
    BAD_OPT(b_.flags = 0x40u); /* the first bit after PKV_OPEN_LIMBO_WAIT */
    BAD_OPT(b_.flags = 0x80000000u);
    BAD_OPT(b_.durability = (pkv_durability)3);
    BAD_OPT(b_.durability = (pkv_durability)-1);
    BAD_OPT(b_.group_commit_us = 10000001);
    BAD_OPT(b_.group_commit_us = UINT32_MAX);
    /* An I/O backend with a NULL member. */
    pkv_io_ops io = *pkv_io_default();
    io.sync_dir = NULL;
    BAD_OPT(b_.io = &io);
    io = *pkv_io_default();
    io.open = NULL;
    BAD_OPT(b_.io = &io);
#undef BAD_OPT
    /* The longest valid model_id is fine (used from here on). */
    longid[PKV_MODEL_ID_MAX] = '\0';
    good.model_id = longid;
    /* capacity 0 on create: EINVAL. */
    pkv_options z = good;
    z.capacity = 0;
    OPEN_FAILS(dir, &z, PKV_EINVAL, false);
    /* A directory whose LOCK and arena paths do not fit in 4096 bytes (the directory
     * itself does: its parents are created here, the last component by pkv_open). */
    char *deep = malloc(4200);
    cr_assert_not_null(deep);
    snprintf(deep, 4200, "%s", pt_dir);
    while (strlen(deep) < 4093 - 101) {
        size_t l = strlen(deep);
        deep[l] = '/';
        memset(deep + l + 1, 'd', 100);
        deep[l + 101] = '\0';
        cr_assert(mkdir(deep, 0700) == 0 || errno == EEXIST, "mkdir: %s", strerror(errno));
    }
    size_t dl = strlen(deep);
    deep[dl++] = '/';
    while (dl < 4093)
        deep[dl++] = 'e';
    deep[dl] = '\0';
    OPEN_FAILS(deep, &good, PKV_EINVAL, false);
    free(deep);
    /* dir is a file: EINVAL (writable), EIO (read-only); a missing dir read-only: EIO. */
    char file[512];
    pt_path(file, sizeof file, "plainfile");
    FILE *fp = fopen(file, "w");
    cr_assert_not_null(fp);
    fclose(fp);
    OPEN_FAILS(file, &good, PKV_EINVAL, false);
    pkv_options ro = good;
    ro.flags = PKV_OPEN_RDONLY;
    OPEN_FAILS(file, &ro, PKV_EIO, false);
    char missing[512];
    pt_path(missing, sizeof missing, "missing");
    OPEN_FAILS(missing, &ro, PKV_EIO, true); /* read-only creates nothing */

    /* Backend failure during open (the first segment cannot be created): EIO. */
    io = *pkv_io_default();
    io.open = io_open_stub;
    pkv_options bio = good;
    bio.io = &io;
    OPEN_FAILS(dir, &bio, PKV_EIO, false);

    /* arena_dir that is a regular file, or whose parent is missing: the open fails,
     * *out is NULL, and the cache directory is left usable (no arena, no link). */
    char adir_dir[512], adir_missing[600];
    pt_path(adir_dir, sizeof adir_dir, "adir-cache");
    pkv_options ad = good;
    ad.arena_dir = file; /* a regular file */
    OPEN_FAILS(adir_dir, &ad, PKV_EINVAL, false);
    snprintf(adir_missing, sizeof adir_missing, "%s/no/such/parent", pt_dir);
    ad.arena_dir = adir_missing;
    OPEN_FAILS(adir_dir, &ad, PKV_EIO, false);
    char link[700];
    snprintf(link, sizeof link, "%s/arena", adir_dir);
    struct stat lst;
    cr_assert(lstat(link, &lst) != 0, "a failed open with a bad arena_dir left %s", link);
    pt_close(pt_open_sub("adir-cache", &good)); /* and the directory still works */

    /* Finally the good options open; the directory exists now. */
    pkv_cache *c = pt_open_sub("new", &good);
    PT_CHECK(c);
    pkv_cache_info inf = pt_info(c);
    cr_assert_str_eq(inf.model_id, longid);
}

Test(misuse, open_mismatch_busy_and_close_null)
{
    pkv_close(NULL); /* a no-op */
    pkv_options good;
    pt_opts(&good, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    pkv_cache *c = pt_open_sub("cache", &good);
    populate(c);
    ms_snap m;
    ms_take(&m, c);
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    /* Second writable open of the same directory, this process: EBUSY. */
    OPEN_FAILS(dir, &good, PKV_EBUSY, false);
    ms_same_at(__FILE__, __LINE__, &m, c, "second open");
    ms_free(&m);
    pt_close(c);
    /* Geometry / model mismatches on reopen: EGEOMETRY / EMODEL, also read-only. */
    for (int ronly = 0; ronly < 2; ronly++) {
#define MISMATCH(stmt, code)                                                            \
    do {                                                                                \
        pkv_options b_ = good;                                                          \
        b_.flags = ronly ? PKV_OPEN_RDONLY : 0;                                         \
        stmt;                                                                           \
        OPEN_FAILS(dir, &b_, code, false);                                              \
    } while (0)
        MISMATCH(b_.num_layers = PT_LAYERS + 1, PKV_EGEOMETRY);
        MISMATCH(b_.num_kv_heads = PT_HEADS + 1, PKV_EGEOMETRY);
        MISMATCH(b_.head_dim = PT_HDIM * 2, PKV_EGEOMETRY);
        MISMATCH(b_.block_size = BS * 2, PKV_EGEOMETRY);
        MISMATCH(b_.dtype = PKV_F16, PKV_EGEOMETRY);
        MISMATCH(b_.capacity = CAP + 1, PKV_EGEOMETRY);
        MISMATCH(b_.model_id = "another-model", PKV_EMODEL);
#undef MISMATCH
    }
    /* Nothing changed: the reopened cache (capacity 0 = as stored) has it all. */
    pkv_options re = good;
    re.capacity = 0;
    c = pt_open_sub("cache", &re);
    PT_CHECK(c);
    uint64_t ids[8];
    size_t n = list_ids(c, ids, 8);
    cr_assert_eq(n, 4);
    PT_VERIFY(c, 1, 0, A, 8, 8);
    PT_VERIFY(c, 3, 0, A, 6, 6);
    PT_VERIFY(c, 4, 0, A, 6, 6);
    PT_VERIFY(c, 2, 0, A, 0, 0);
    cr_assert_eq(pt_stats(c).blocks_cached, 2);
}

/* ---- Geometry and payload addresses ------------------------------------------------ */

Test(misuse, info_kv_and_view)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    pkv_cache_info inf;
    MS_BAD(c, &m, pkv_info(NULL, &inf), PKV_EINVAL);
    MS_BAD(c, &m, pkv_info(c, NULL), PKV_EINVAL);
    pkv_kv_view v;
    memset(&v, 0x5A, sizeof v);
    MS_BAD(c, &m, pkv_kv_view_of(NULL, &v), PKV_EINVAL);
    MS_BAD(c, &m, pkv_kv_view_of(c, NULL), PKV_EINVAL);
    inf = pt_info(c);
    /* pkv_kv: NULL for anything out of range, an address for the last valid one. */
    cr_assert_null(pkv_kv(NULL, 0, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, CAP, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, UINT32_MAX, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, 0, PT_LAYERS, PKV_K, 0));
    cr_assert_null(pkv_kv(c, 0, UINT32_MAX, PKV_V, 0));
    cr_assert_null(pkv_kv(c, 0, 0, PKV_K, PT_HEADS));
    cr_assert_null(pkv_kv(c, 0, 0, PKV_V, UINT32_MAX));
    cr_assert_null(pkv_kv(c, 0, 0, (pkv_kind)2, 0));
    cr_assert_null(pkv_kv(c, 0, 0, (pkv_kind)-1, 0));
    uint8_t *first = pkv_kv(c, 0, 0, PKV_K, 0);
    uint8_t *last = pkv_kv(c, CAP - 1, PT_LAYERS - 1, PKV_V, PT_HEADS - 1);
    cr_assert(first && last);
    cr_assert_eq((uint64_t)(last - first),
                 (CAP - 1) * inf.slot_bytes + inf.block_bytes - inf.run_bytes);
    PT_OK(pkv_kv_view_of(c, &v));
    cr_assert(v.base == first && v.num_blocks == CAP && v.block_stride == inf.slot_bytes);
    PT_CHECK(c);
    ms_same_at(__FILE__, __LINE__, &m, c, "pkv_kv");
    ms_free(&m);
}

/* ---- Sequences ------------------------------------------------------------------------ */

Test(misuse, seq_open)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    size_t nc = 777;
    MS_BAD(c, &m, pkv_seq_open(NULL, 9, 0, A, 5, &nc), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_open(NULL, 9, 0, NULL, 0, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, NULL, 5, &nc), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, NULL, SIZE_MAX, &nc), PKV_EINVAL);
    /* Duplicate ids, whatever the prompt and salt. */
    MS_BAD(c, &m, pkv_seq_open(c, 1, 0, A, 10, &nc), PKV_EEXIST);
    MS_BAD(c, &m, pkv_seq_open(c, 2, 0, NULL, 0, &nc), PKV_EEXIST);
    MS_BAD(c, &m, pkv_seq_open(c, 3, 99, B, 8, NULL), PKV_EEXIST);
    cr_assert_eq(nc, 777, "n_cached written by a failing call");
    ms_free(&m);
    /* Huge prompts are fine: the hit is capped at capacity blocks and n - 1. */
    size_t big = (size_t)CAP * BS * 64;
    uint32_t *p = malloc(big * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < big; i++)
        p[i] = i < 8 ? A[i] : 7;
    PT_OK(pkv_seq_open(c, 9, 0, p, big, &nc));
    cr_assert_eq(nc, 8, "n_cached %zu, expected the 2 cached blocks of seq 1", nc);
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 9));
    free(p);
    PT_CHECK(c);
}

Test(misuse, seq_append)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    pkv_slot slots[8];
    memset(slots, 0xEE, sizeof slots);
    MS_BAD(c, &m, pkv_seq_append(NULL, 1, A, 1, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, NULL, 1, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 1, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 0, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 2, A, 0, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 99, A, 1, slots), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_append(c, UINT64_MAX, A, 1, slots), PKV_ENOSEQ);
    /* Huge n: more than the whole cache holds (the token buffer is not read). */
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, (size_t)CAP * BS + 1, slots), PKV_EFULL);
    MS_BAD(c, &m, pkv_seq_append(c, 2, A, SIZE_MAX, slots), PKV_EFULL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, SIZE_MAX / 2 + 1, slots), PKV_EFULL);
    for (size_t i = 0; i < 8; i++)
        cr_assert(slots[i].block == 0xEEEEEEEEu && slots[i].offset == 0xEEEEEEEEu,
                  "a failing append wrote slot %zu", i);
    ms_free(&m);
}

Test(misuse, seq_append_and_truncate_when_full)
{
    /* capacity 4: seq 1 holds 3 blocks (2 sealed + 1 open with pending tokens), seq 3
     * forks seq 4 = 1 more; nothing is free or evictable. */
    pkv_cache *c = pt_open(BS, 4);
    for (uint32_t i = 0; i < 16; i++)
        A[i] = 10 + i;
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, A, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_SEQ_OPEN(c, 4, 0, NULL, 0);
    PT_APPEND(c, 4, 0, B, 0, 2);
    PT_OK(pkv_seq_commit(c, 4, 2));
    PT_OK(pkv_seq_fork(c, 4, 3));
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_free + st.blocks_cached, 0);
    ms_snap m;
    ms_take(&m, c);
    pkv_slot slots[8];
    /* seq 1 has room for 2 more tokens in its open block; 3 need a new block. */
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 3, slots), PKV_EFULL);
    /* seq 3 shares its partial block: appending needs a copy. */
    MS_BAD(c, &m, pkv_seq_append(c, 3, A, 1, slots), PKV_EFULL);
    /* Cutting inside a sealed block needs a copy: EFULL, nothing changed (the copy is
     * allocated before the dropped blocks are released). */
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 5), PKV_EFULL);
    /* Cutting a shared partial block (seq 3 / seq 4) needs a copy too. */
    MS_BAD(c, &m, pkv_seq_truncate(c, 3, 1), PKV_EFULL);
    ms_free(&m);
    /* Cutting on a block boundary needs none. */
    PT_OK(pkv_seq_truncate(c, 1, 4));
    PT_CHECK(c);
}

Test(misuse, seq_commit)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_seq_commit(NULL, 1, 1), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit(c, 1, 0), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit(c, 99, 1), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_commit(c, 1, 3), PKV_ESTATE);        /* 2 pending */
    MS_BAD(c, &m, pkv_seq_commit(c, 1, SIZE_MAX), PKV_ESTATE);
    MS_BAD(c, &m, pkv_seq_commit(c, 2, 1), PKV_ESTATE);        /* empty */
    MS_BAD(c, &m, pkv_seq_commit(c, 3, 1), PKV_ESTATE);        /* nothing pending */
    ms_free(&m);
}

Test(misuse, seq_commit_append_and_step_batch)
{
    pkv_cache *c = make_cache(); /* seq 1: 10 tokens, 2 of them pending */
    ms_snap m;
    ms_take(&m, c);
    pkv_slot slots[4];
    memset(slots, 0xEE, sizeof slots);
    MS_BAD(c, &m, pkv_seq_commit_append(NULL, 1, 1, A, 1, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 0, NULL, 0, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 0, NULL, 1, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 0, A, 1, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 99, 0, A, 1, slots), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 3, A, 1, slots), PKV_ESTATE);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, SIZE_MAX, A, 1, slots), PKV_ESTATE);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 2, A, SIZE_MAX, slots), PKV_EFULL);
    for (size_t i = 0; i < 4; i++)
        cr_assert(slots[i].block == 0xEEEEEEEEu, "a failing step wrote slot %zu", i);
    pkv_step st[2] = {{.id = 1, .n_commit = 2, .token = 5, .slot = {0xEEEEEEEEu, 0xEEEEEEEEu}},
                      {.id = 99, .n_commit = 0, .token = 6, .slot = {0xEEEEEEEEu, 0xEEEEEEEEu}}};
    size_t done = 77;
    MS_BAD(c, &m, pkv_seq_step_batch(NULL, st, 2, &done), PKV_EINVAL);
    cr_assert_eq(done, 0);
    MS_BAD(c, &m, pkv_seq_step_batch(c, NULL, 2, &done), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_step_batch(c, st, 0, &done), PKV_EINVAL);
    cr_assert_eq(done, 0);
    /* The first step fails: nothing changed, done = 0, its slot untouched. */
    MS_BAD(c, &m, pkv_seq_step_batch(c, st + 1, 1, &done), PKV_ENOSEQ);
    cr_assert_eq(done, 0);
    st[0].n_commit = 3;
    MS_BAD(c, &m, pkv_seq_step_batch(c, st, 2, NULL), PKV_ESTATE);
    cr_assert(st[0].slot.block == 0xEEEEEEEEu && st[1].slot.block == 0xEEEEEEEEu);
    ms_free(&m);
}

Test(misuse, seq_fork)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_seq_fork(NULL, 4, 9), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_fork(c, 99, 9), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_fork(c, 99, 1), PKV_ENOSEQ); /* unknown parent first */
    MS_BAD(c, &m, pkv_seq_fork(c, 4, 3), PKV_EEXIST);
    MS_BAD(c, &m, pkv_seq_fork(c, 4, 4), PKV_EEXIST);  /* child == parent */
    MS_BAD(c, &m, pkv_seq_fork(c, 1, 9), PKV_ESTATE);  /* 2 pending tokens */
    MS_BAD(c, &m, pkv_seq_fork(c, 1, 2), PKV_EEXIST);  /* EEXIST before ESTATE */
    ms_free(&m);
}

Test(misuse, seq_truncate)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_seq_truncate(NULL, 1, 0), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_truncate(c, 99, 0), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 11), PKV_ERANGE);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, SIZE_MAX), PKV_ERANGE);
    MS_BAD(c, &m, pkv_seq_truncate(c, 2, 1), PKV_ERANGE);
    MS_BAD(c, &m, pkv_seq_truncate(c, 3, 7), PKV_ERANGE);
    ms_free(&m);
    /* new_len == len changes nothing and succeeds. */
    ms_take(&m, c);
    PT_OK(pkv_seq_truncate(c, 1, 10));
    PT_OK(pkv_seq_truncate(c, 2, 0));
    ms_same_at(__FILE__, __LINE__, &m, c, "truncate to the length");
    ms_free(&m);
}

Test(misuse, seq_close)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_seq_close(NULL, 1), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_close(c, 99), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_close(c, 5), PKV_ENOSEQ); /* closed before */
    ms_free(&m);
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_seq_close(c, 3), PKV_ENOSEQ); /* double close */
    ms_free(&m);
}

Test(misuse, seq_reads)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    /* seq_info: *out untouched on error. */
    pkv_seq_info si, keep;
    memset(&si, 0x3C, sizeof si);
    keep = si;
    MS_BAD(c, &m, pkv_seq_get_info(NULL, 1, &si), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_get_info(c, 1, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_get_info(c, 99, &si), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_get_info(c, 5, &si), PKV_ENOSEQ);
    cr_assert(memcmp(&si, &keep, sizeof si) == 0, "seq_info wrote *out on error");
    /* seq_blocks / seq_tokens / seq_list. */
    uint32_t out[32];
    uint64_t ids[8];
    size_t n = 4242;
    MS_BAD(c, &m, pkv_seq_blocks(NULL, 1, out, 32, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_blocks(c, 1, NULL, 1, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_blocks(c, 1, NULL, SIZE_MAX, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_blocks(c, 99, out, 32, &n), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_tokens(NULL, 1, out, 32, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_tokens(c, 1, NULL, 1, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_tokens(c, 99, out, 32, &n), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_seq_list(NULL, ids, 8, &n), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_list(c, NULL, 1, &n), PKV_EINVAL);
    cr_assert_eq(n, 4242, "*n written by a call that failed with EINVAL or ENOSEQ");
    /* prefix_lookup: *n_cached is 0 on error. */
    MS_BAD(c, &m, pkv_prefix_lookup(NULL, 0, A, 9, &n), PKV_EINVAL);
    cr_assert_eq(n, 0, "prefix_lookup left *n_cached set on error");
    n = 4242;
    MS_BAD(c, &m, pkv_prefix_lookup(c, 0, NULL, 9, &n), PKV_EINVAL);
    cr_assert_eq(n, 0);
    MS_BAD(c, &m, pkv_prefix_lookup(c, 0, A, 9, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_prefix_lookup(c, 0, A, 0, &n), PKV_EINVAL);
    PT_OK(pkv_prefix_lookup(c, 0, A, 9, &n));
    cr_assert_eq(n, 8);
    n = 4242;
    /* Short buffers: ERANGE, *n = full length, only cap entries written. */
    for (size_t i = 0; i < 32; i++)
        out[i] = 0xA5A5A5A5u;
    MS_BAD(c, &m, pkv_seq_tokens(c, 1, out, 3, &n), PKV_ERANGE);
    cr_assert_eq(n, 10);
    cr_assert(out[0] == A[0] && out[2] == A[2] && out[3] == 0xA5A5A5A5u);
    MS_BAD(c, &m, pkv_seq_blocks(c, 1, NULL, 0, &n), PKV_ERANGE);
    cr_assert_eq(n, 3);
    MS_BAD(c, &m, pkv_seq_list(c, ids, 3, &n), PKV_ERANGE);
    cr_assert_eq(n, 4);
    MS_BAD(c, &m, pkv_seq_list(c, NULL, 0, NULL), PKV_ERANGE);
    /* A huge cap with a buffer big enough for the content is fine. */
    PT_OK(pkv_seq_tokens(c, 1, out, SIZE_MAX, &n));
    cr_assert_eq(n, 10);
    PT_OK(pkv_seq_blocks(c, 3, out, SIZE_MAX, &n));
    cr_assert_eq(n, 2);
    PT_OK(pkv_seq_list(c, ids, SIZE_MAX, &n));
    cr_assert_eq(n, 4);
    ms_same_at(__FILE__, __LINE__, &m, c, "reads");
    ms_free(&m);
}

Test(misuse, stats_check_recovery)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    pkv_stats st;
    pkv_recovery rec;
    MS_BAD(c, &m, pkv_get_stats(NULL, &st), PKV_EINVAL);
    MS_BAD(c, &m, pkv_get_stats(c, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_get_recovery(NULL, &rec), PKV_EINVAL);
    MS_BAD(c, &m, pkv_get_recovery(c, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_check(NULL, NULL, 0), PKV_EINVAL);
    char why[8] = "xyzxyzx";
    MS_BAD(c, &m, pkv_check(NULL, why, sizeof why), PKV_EINVAL);
    /* why NULL with a length, a zero length, a 1-byte buffer: all fine. */
    PT_OK(pkv_check(c, NULL, 100));
    PT_OK(pkv_check(c, why, 0));
    cr_assert_str_eq(why, "xyzxyzx", "why_len 0: nothing may be written");
    PT_OK(pkv_check(c, why, 1));
    cr_assert_eq(why[0], '\0');
    ms_same_at(__FILE__, __LINE__, &m, c, "check");
    ms_free(&m);
}

Test(misuse, sync_and_checkpoint_null)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    MS_BAD(c, &m, pkv_sync(NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_checkpoint(NULL), PKV_EINVAL);
    ms_free(&m);
    const pkv_io_ops *io = pkv_io_default();
    cr_assert_not_null(io);
    cr_assert(io->open && io->close && io->pread && io->write && io->sync && io->allocate &&
              io->rename && io->unlink && io->sync_dir);
    cr_assert_eq(pkv_io_default(), io, "pkv_io_default() is not one static backend");
}

/* ---- Read-only handle -------------------------------------------------------------------
 * Every mutating call, pkv_sync and pkv_checkpoint: PKV_ERDONLY (after the argument
 * checks, before any id lookup); every read works. */
Test(misuse, read_only_cache)
{
    pkv_cache *w = make_cache();
    pt_close(w); /* recovered: seq 1 = 8 committed, 2 empty, 3 and 4 = 6 */
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    ms_snap m;
    ms_take(&m, c);
    cr_assert_eq(m.n_ids, 4);
    pkv_slot slots[4];
    size_t nc = 0;
    /* Valid arguments: ERDONLY. */
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, A, 9, &nc), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, NULL, 0, NULL), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 1, slots), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_commit(c, 1, 1), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 1, A, 1, slots), PKV_ERDONLY);
    pkv_step one = {.id = 1, .n_commit = 0, .token = 3};
    size_t done = 77;
    MS_BAD(c, &m, pkv_seq_step_batch(c, &one, 1, &done), PKV_ERDONLY);
    cr_assert_eq(done, 0);
    MS_BAD(c, &m, pkv_seq_fork(c, 1, 9), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 3), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 8), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_seq_close(c, 1), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_sync(c), PKV_ERDONLY);
    MS_BAD(c, &m, pkv_checkpoint(c), PKV_ERDONLY);
    /* Precedence: ERDONLY before the errors that depend on the contents ... */
    MS_BAD(c, &m, pkv_seq_open(c, 1, 0, NULL, 0, NULL), PKV_ERDONLY); /* not EEXIST */
    MS_BAD(c, &m, pkv_seq_append(c, 99, A, 1, slots), PKV_ERDONLY);   /* not ENOSEQ */
    MS_BAD(c, &m, pkv_seq_commit(c, 2, 5), PKV_ERDONLY);              /* not ESTATE */
    MS_BAD(c, &m, pkv_seq_fork(c, 1, 2), PKV_ERDONLY);                /* not EEXIST */
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 99), PKV_ERDONLY);           /* not ERANGE */
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, SIZE_MAX, slots), PKV_ERDONLY); /* not EFULL */
    MS_BAD(c, &m, pkv_seq_close(c, 99), PKV_ERDONLY);                 /* not ENOSEQ */
    /* ... and after the argument checks. */
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, NULL, 3, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 0, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_commit(c, 1, 0), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_close(NULL, 1), PKV_EINVAL);
    /* Reads work, lookups included. */
    PT_VERIFY(c, 1, 0, A, 8, 8);
    PT_VERIFY(c, 3, 0, A, 6, 6);
    PT_OK(pkv_prefix_lookup(c, 0, A, 9, &nc));
    cr_assert_eq(nc, 8, "a read-only handle answers lookups");
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.sequences, 4);
    pkv_stats st = pt_stats(c);
    cr_assert(st.wal_records == 0 && st.wal_syncs == 0, "a read-only handle logged");
    pkv_kv_view v;
    PT_OK(pkv_kv_view_of(c, &v));
    ms_same_at(__FILE__, __LINE__, &m, c, "reads on a read-only handle");
    ms_free(&m);
    pt_close(c);
    /* The writable reopen still sees the same state. */
    o.flags = 0;
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, A, 8, 8);
    cr_assert_eq(pt_stats(c).sequences, 4);
}

/* ---- Failed state -------------------------------------------------------------------------
 * A synchronous backend that starts failing every call with EIO (or ENOSPC): the next
 * pkv_sync puts the cache into its failed state. Then every mutating call, pkv_sync
 * and pkv_checkpoint return PKV_EFAILED with a message naming the original error, the
 * reads still work, nothing changes, and a reopen with the default backend recovers
 * exactly the state of the last successful pkv_sync. */
static void failed_state(int err)
{
    pt_syncio *io = malloc(sizeof *io); /* must outlive the handle */
    cr_assert_not_null(io);
    pt_syncio_init(io);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.io = &io->ops;
    o.group_commit_us = 10000000; /* no I/O but at syncs: deterministic */
    pkv_cache *c = pt_open_sub("cache", &o);
    populate(c);
    PT_OK(pkv_sync(c));
    PT_OK(pkv_seq_commit(c, 1, 2)); /* not durable: lost with the failure */
    cr_assert(io->calls > 0, "the backend was never used");
    pt_syncio_fail(io, err);
    MS_ERR(pkv_sync(c), PKV_EFAILED);
    cr_assert(io->failed > 0);
    const char *want = strerror(err); /* the original error, not just "I/O error" */
    cr_assert(strstr(pkv_last_error(), want), "the message does not name the error: %s",
              pkv_last_error());
    PT_CHECK(c);
    ms_snap m;
    ms_take(&m, c);
    cr_assert_eq(m.n_ids, 4);
    pkv_slot slots[4];
    size_t nc = 0;
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, A, 9, &nc), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_open(c, 9, 0, NULL, 0, NULL), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_append(c, 1, A, 1, slots), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_append(c, 3, A, 1, slots), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_commit_append(c, 1, 0, A, 1, slots), PKV_EFAILED);
    pkv_step one = {.id = 1, .n_commit = 0, .token = 3};
    size_t done = 77;
    MS_BAD(c, &m, pkv_seq_step_batch(c, &one, 1, &done), PKV_EFAILED);
    cr_assert_eq(done, 0);
    MS_BAD(c, &m, pkv_seq_fork(c, 1, 9), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 3), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_truncate(c, 4, 0), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_close(c, 1), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_close(c, 2), PKV_EFAILED);
    MS_BAD(c, &m, pkv_sync(c), PKV_EFAILED);
    MS_BAD(c, &m, pkv_checkpoint(c), PKV_EFAILED);
    cr_assert(strstr(pkv_last_error(), want), "EFAILED message: %s", pkv_last_error());
    /* Precedence: EFAILED before contents-dependent errors, after argument errors. */
    MS_BAD(c, &m, pkv_seq_open(c, 1, 0, NULL, 0, NULL), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_append(c, 99, A, 1, slots), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_commit(c, 2, 1), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_fork(c, 99, 9), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_truncate(c, 1, 99), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_close(c, 99), PKV_EFAILED);
    MS_BAD(c, &m, pkv_seq_commit(c, 1, 0), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_append(c, 1, NULL, 1, slots), PKV_EINVAL);
    MS_BAD(c, &m, pkv_seq_truncate(NULL, 1, 0), PKV_EINVAL);
    /* Reads work. */
    PT_VERIFY(c, 1, 0, A, 10, 10);
    PT_VERIFY(c, 4, 0, A, 6, 6);
    PT_OK(pkv_prefix_lookup(c, 0, A, 9, &nc));
    cr_assert_eq(nc, 8, "a failed cache still answers lookups");
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    uint64_t ids[8];
    cr_assert_eq(list_ids(c, ids, 8), 4);
    ms_same_at(__FILE__, __LINE__, &m, c, "reads in the failed state");
    ms_free(&m);
    /* Close (its last flush fails too and is reported on stderr), reopen with the
     * default backend: the state of the last successful pkv_sync. */
    pt_close(c);
    free(io);
    o.io = NULL;
    o.group_commit_us = 0;
    c = pt_open_sub("cache", &o);
    PT_CHECK(c);
    cr_assert_eq(list_ids(c, ids, 8), 4);
    PT_VERIFY(c, 1, 0, A, 8, 8);
    PT_VERIFY(c, 2, 0, A, 0, 0);
    PT_VERIFY(c, 3, 0, A, 6, 6);
    PT_VERIFY(c, 4, 0, A, 6, 6);
    /* And it is writable again. */
    PT_APPEND(c, 1, 0, A, 8, 2);
    PT_OK(pkv_seq_commit(c, 1, 2));
    PT_OK(pkv_sync(c));
    PT_CHECK(c);
}

Test(misuse, failed_cache_eio)
{
    failed_state(EIO);
}

Test(misuse, failed_cache_enospc)
{
    failed_state(ENOSPC);
}

/* ---- Element conversion --------------------------------------------------------------- */

Test(misuse, kv_store_load)
{
    float src[4] = {1.5f, -2.0f, 0.25f, 65504.0f}, dst[4];
    /* h is large enough for 4 f32 too, so a wrong write stays inside it */
    uint16_t h[8], keep[8] = {0x1111, 0x2222, 0x3333, 0x4444, 5, 6, 7, 8};
    for (int load = 0; load < 2; load++) {
#define CONV(dt, d, s, n) \
    (load ? pkv_kv_load((dt), (float *)(d), (s), (n)) : pkv_kv_store((dt), (d), (const float *)(s), (n)))
        memcpy(h, keep, sizeof h);
        MS_ERR(CONV((pkv_dtype)3, h, src, 4), PKV_EINVAL);
        MS_ERR(CONV((pkv_dtype)-1, h, src, 0), PKV_EINVAL);
        MS_ERR(CONV(PKV_F16, NULL, src, 1), PKV_EINVAL);
        MS_ERR(CONV(PKV_BF16, h, NULL, 1), PKV_EINVAL);
        MS_ERR(CONV(PKV_F32, NULL, NULL, 4), PKV_EINVAL);
        cr_assert(memcmp(h, keep, sizeof h) == 0, "a failing conversion wrote its output");
        /* n == 0 with NULL buffers: nothing to do. */
        PT_OK(CONV(PKV_F16, NULL, NULL, 0));
        PT_OK(CONV(PKV_F32, NULL, NULL, 0));
#undef CONV
    }
    PT_OK(pkv_kv_store(PKV_F16, h, src, 4));
    PT_OK(pkv_kv_load(PKV_F16, dst, h, 4));
    cr_assert(memcmp(dst, src, sizeof src) == 0);
    /* Non-finite inputs are values, not errors. */
    cr_assert(isnan(pkv_f16_to_f32(pkv_f32_to_f16(NAN))));
    cr_assert(isinf(pkv_f16_to_f32(pkv_f32_to_f16(1e30f))));
    cr_assert(isnan(pkv_bf16_to_f32(pkv_f32_to_bf16(-NAN))));
    cr_assert(isinf(pkv_bf16_to_f32(pkv_f32_to_bf16(-INFINITY))));
}

/* ---- CPU attention ------------------------------------------------------------------------ */

enum { AL = 2, AH = 2, AD = 4, ABS = 4, ANB = 3, AQ = 4 };

typedef struct attn_case {
    float *buf;
    pkv_kv_view v;
    pkv_attn_params p;
    uint32_t table[ANB];
    pkv_attn_seq s[2];
    float q[2 * AQ * AD], out[2 * AQ * AD];
} attn_case;

static void attn_init(attn_case *a)
{
    memset(a, 0, sizeof *a);
    size_t nf = (size_t)ANB * AL * 2 * AH * ABS * AD;
    a->buf = malloc(nf * sizeof *a->buf);
    cr_assert_not_null(a->buf);
    for (size_t i = 0; i < nf; i++)
        a->buf[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    a->v = (pkv_kv_view){.base = a->buf, .dtype = PKV_F32, .num_layers = AL,
                         .num_kv_heads = AH, .head_dim = AD, .block_size = ABS,
                         .num_blocks = ANB};
    a->v.token_stride = AD * sizeof(float);
    a->v.head_stride = ABS * a->v.token_stride;
    a->v.kind_stride = AH * a->v.head_stride;
    a->v.layer_stride = 2 * a->v.kind_stride;
    a->v.block_stride = AL * a->v.layer_stride;
    a->p = (pkv_attn_params){.layer = 1, .num_q_heads = AQ, .scale = 0.5f};
    for (uint32_t i = 0; i < ANB; i++)
        a->table[i] = ANB - 1 - i;
    a->s[0] = (pkv_attn_seq){a->table, ANB, 9};
    a->s[1] = (pkv_attn_seq){a->table, 1, 3};
    for (size_t i = 0; i < sizeof a->q / sizeof *a->q; i++)
        a->q[i] = (float)i / 10.0f;
}

/* a = *a0 with the sequences pointing at a's own table. */
static void attn_copy(attn_case *a, const attn_case *a0)
{
    *a = *a0;
    a->s[0].blocks = a->s[1].blocks = a->table;
}

static int attn_run(attn_case *a)
{
    return pkv_attn_decode(&a->v, &a->p, a->s, 2, a->q, a->out);
}

Test(misuse, attn_decode)
{
    attn_case a0, a;
    attn_init(&a0);
    PT_OK(attn_run(&a0));
    /* num_threads 256 and PKV_ATTN_PORTABLE are valid, out == q too. */
    attn_copy(&a, &a0);
    a.p.num_threads = 256;
    a.p.flags = PKV_ATTN_PORTABLE;
    PT_OK(attn_run(&a));
    PT_OK(pkv_attn_decode(&a.v, &a.p, a.s, 2, a.q, a.q));
    /* NULL arguments. */
    attn_copy(&a, &a0);
    MS_ERR(pkv_attn_decode(NULL, &a.p, a.s, 2, a.q, a.out), PKV_EINVAL);
    MS_ERR(pkv_attn_decode(&a.v, NULL, a.s, 2, a.q, a.out), PKV_EINVAL);
    MS_ERR(pkv_attn_decode(&a.v, &a.p, NULL, 2, a.q, a.out), PKV_EINVAL);
    MS_ERR(pkv_attn_decode(&a.v, &a.p, a.s, 2, NULL, a.out), PKV_EINVAL);
    MS_ERR(pkv_attn_decode(&a.v, &a.p, a.s, 2, a.q, NULL), PKV_EINVAL);
    /* n_seqs == 0: 0 after checking view and params; the NULL arrays are not read. */
    PT_OK(pkv_attn_decode(&a.v, &a.p, NULL, 0, NULL, NULL));
    MS_ERR(pkv_attn_decode(NULL, &a.p, NULL, 0, NULL, NULL), PKV_EINVAL);
    MS_ERR(pkv_attn_decode(&a.v, NULL, NULL, 0, NULL, NULL), PKV_EINVAL);
#define BAD_ATTN(stmt, code)                                                            \
    do {                                                                                \
        attn_copy(&a, &a0);                                                             \
        stmt;                                                                           \
        MS_ERR(attn_run(&a), code);                                                     \
    } while (0)
    /* A bad view. */
    BAD_ATTN(a.v.base = NULL, PKV_EINVAL);
    BAD_ATTN(a.v.dtype = (pkv_dtype)3, PKV_EINVAL);
    BAD_ATTN(a.v.num_layers = 0, PKV_EINVAL);
    BAD_ATTN(a.v.num_kv_heads = 0, PKV_EINVAL);
    BAD_ATTN(a.v.head_dim = 0, PKV_EINVAL);
    BAD_ATTN(a.v.block_size = 0, PKV_EINVAL);
    BAD_ATTN(a.v.num_blocks = 0, PKV_EINVAL);
    BAD_ATTN(a.v.base = (const char *)a.buf + 2, PKV_EINVAL);
    BAD_ATTN(a.v.block_stride += 2, PKV_EINVAL);
    BAD_ATTN(a.v.layer_stride += 1, PKV_EINVAL);
    BAD_ATTN(a.v.kind_stride += 2, PKV_EINVAL);
    BAD_ATTN(a.v.head_stride += 3, PKV_EINVAL);
    BAD_ATTN(a.v.token_stride = AD * sizeof(float) - 4, PKV_EINVAL);
    BAD_ATTN(a.v.token_stride = 0, PKV_EINVAL);
    BAD_ATTN((a.v.num_blocks = UINT64_C(1) << 62), PKV_EINVAL);       /* range overflows */
    BAD_ATTN((a.v.block_stride = SIZE_MAX / 4 * 4, a.v.num_blocks = 8), PKV_EINVAL);
    BAD_ATTN(a.v.token_stride = SIZE_MAX / 4 * 4, PKV_EINVAL);
    BAD_ATTN((a.v.block_size = UINT32_MAX, a.v.token_stride = SIZE_MAX / 8 * 4), PKV_EINVAL);
    /* Bad params. */
    BAD_ATTN(a.p.layer = AL, PKV_EINVAL);
    BAD_ATTN(a.p.layer = UINT32_MAX, PKV_EINVAL);
    BAD_ATTN(a.p.num_q_heads = 0, PKV_EINVAL);
    BAD_ATTN(a.p.num_q_heads = 3, PKV_EINVAL);
    BAD_ATTN(a.p.scale = NAN, PKV_EINVAL);
    BAD_ATTN(a.p.scale = INFINITY, PKV_EINVAL);
    BAD_ATTN(a.p.scale = -INFINITY, PKV_EINVAL);
    BAD_ATTN(a.p.flags = 0x2, PKV_EINVAL);
    BAD_ATTN(a.p.num_threads = 257, PKV_EINVAL);
    BAD_ATTN(a.p.num_threads = UINT32_MAX, PKV_EINVAL);
    /* Bad sequences. */
    BAD_ATTN(a.s[1].len = 0, PKV_EINVAL);
    BAD_ATTN(a.s[1].blocks = NULL, PKV_EINVAL);
    BAD_ATTN(a.s[0].n_blocks = 2, PKV_ERANGE);                 /* 9 tokens need 3 */
    BAD_ATTN(a.s[1].n_blocks = 0, PKV_ERANGE);
    BAD_ATTN(a.table[0] = ANB, PKV_ERANGE);                    /* block id out of range */
    BAD_ATTN(a.table[2] = UINT32_MAX, PKV_ERANGE);
    BAD_ATTN(a.s[0].len = SIZE_MAX, PKV_ERANGE);               /* huge length */
    BAD_ATTN(a.s[0].len = (size_t)ANB * ABS + 1, PKV_ERANGE);
#undef BAD_ATTN
    /* Entries beyond ceil(len / block_size) are never read: garbage there is fine. */
    attn_copy(&a, &a0);
    a.s[1].n_blocks = ANB;
    a.table[1] = UINT32_MAX;
    a.s[0].len = 4;
    PT_OK(attn_run(&a));
    free(a0.buf);
}

/* ---- CUDA layer ------------------------------------------------------------------------------ */

Test(misuse, cuda_common)
{
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_NONE), "none");
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_REGISTERED), "registered");
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_REGISTERED_RO), "registered-ro");
    cr_assert_str_eq(pkv_cuda_mode_name(PKV_CUDA_MODE_STAGING), "staging");
    cr_assert_str_eq(pkv_cuda_mode_name((pkv_cuda_mode)4), "?");
    cr_assert_str_eq(pkv_cuda_mode_name((pkv_cuda_mode)-1), "?");
    pkv_cuda_options_init(NULL);
    pkv_cuda_options co;
    memset(&co, 0x77, sizeof co);
    pkv_cuda_options_init(&co);
    cr_assert(co.device == 0 && co.pool_blocks == 0 && co.flags == 0 && co.staging_bytes == 0 &&
              co.register_chunk_bytes == 0 && co.staging_threads == 0);
    pkv_cuda_close(NULL);
    /* A device that cannot exist: ENOTSUP with a reason, in every build. */
    char why[128];
    const int nodev[] = {-1, 1 << 20, INT_MIN};
    for (size_t i = 0; i < sizeof nodev / sizeof *nodev; i++) {
        why[0] = '\0';
        MS_ERR(pkv_cuda_probe(nodev[i], why, sizeof why), PKV_ENOTSUP);
        cr_assert(why[0], "probe(%d): no reason given", nodev[i]);
        MS_ERR(pkv_cuda_probe(nodev[i], NULL, 0), PKV_ENOTSUP);
        MS_ERR(pkv_cuda_probe(nodev[i], NULL, 64), PKV_ENOTSUP);
        strcpy(why, "keep");
        MS_ERR(pkv_cuda_probe(nodev[i], why, 0), PKV_ENOTSUP);
        cr_assert_str_eq(why, "keep", "probe wrote why with len 0");
        MS_ERR(pkv_cuda_probe(nodev[i], why, 1), PKV_ENOTSUP);
        cr_assert_eq(why[0], '\0');
    }
}

/* The CUDA calls on a cache; what they must return depends on the build and device. */
Test(misuse, cuda_calls)
{
    pkv_cache *c = make_cache();
    ms_snap m;
    ms_take(&m, c);
    char why[256] = "";
    int probe = pkv_cuda_probe(0, why, sizeof why);
    if (!PKV_WITH_CUDA)
        cr_assert_eq(probe, PKV_ENOTSUP, "a build without the CUDA layer found a device");
    cr_assert(probe == 0 || probe == PKV_ENOTSUP);
    const bool dev = probe == 0;
    cr_log_info("CUDA layer %s; device 0: %s", PKV_WITH_CUDA ? "built" : "not built",
                dev ? "usable" : why);
    pkv_cuda_options co;
    pkv_cuda_options_init(&co);
    pkv_cuda *g = (pkv_cuda *)&g;
    pkv_cuda_batch *b = (pkv_cuda_batch *)&b;
    pkv_cuda_stats gs;
    pkv_cuda_batch_info bi;
    size_t wb = 99;
    const uint64_t ids[2] = {1, 4};
    attn_case a;
    attn_init(&a);
    uint32_t lens[1] = {9};
    pkv_cuda_seqs cs = {.tables = a.table, .table_stride = ANB, .lens = lens, .n_seqs = 1,
                        .max_len = 9};
    /* Calls without a handle. "none": ENOTSUP without the layer. */
    const int none = PKV_WITH_CUDA ? PKV_EINVAL : PKV_ENOTSUP;
    const int nodev = dev ? PKV_EINVAL : PKV_ENOTSUP; /* valid args, bad pointers */
    MS_BAD(c, &m, pkv_cuda_open(NULL, &co, &g), none);
    cr_assert_null(g, "pkv_cuda_open: *out not NULL after a failure");
    MS_BAD(c, &m, pkv_cuda_open(c, &co, NULL), none);
    MS_BAD(c, &m, pkv_cuda_get_stats(NULL, &gs), none);
    MS_BAD(c, &m, pkv_cuda_metrics_text(NULL, why, sizeof why, NULL), none);
    b = (pkv_cuda_batch *)&b;
    MS_BAD(c, &m, pkv_cuda_page_in(NULL, ids, 2, 0, NULL, &b), none);
    cr_assert_null(b, "pkv_cuda_page_in: *out not NULL after a failure");
    MS_BAD(c, &m, pkv_cuda_batch_get_info(NULL, &bi), none);
    MS_BAD(c, &m, pkv_cuda_writeback(NULL, NULL, NULL), none);
    MS_BAD(c, &m, pkv_cuda_release(NULL, NULL, NULL), none);
    MS_BAD(c, &m, pkv_cuda_attn(NULL, NULL, &a.p, a.q, a.out, NULL), none);
    MS_BAD(c, &m, pkv_cuda_attn_workspace(&a.v, &a.p, &cs, NULL), none);
    /* Device-independent argument errors of the kernel entry points: ENOTSUP without a
     * device (checked first), EINVAL with one. */
    MS_BAD(c, &m, pkv_cuda_attn_workspace(NULL, &a.p, &cs, &wb), nodev);
    MS_BAD(c, &m, pkv_cuda_attn_decode(NULL, &a.p, &cs, a.q, a.out, NULL, 0, NULL), nodev);
    MS_BAD(c, &m, pkv_cuda_attn_decode(&a.v, NULL, &cs, a.q, a.out, NULL, 0, NULL), nodev);
    MS_BAD(c, &m, pkv_cuda_attn_decode(&a.v, &a.p, NULL, a.q, a.out, NULL, 0, NULL), nodev);
    if (!dev) {
        /* Valid arguments, no device: ENOTSUP. */
        g = (pkv_cuda *)&g;
        MS_BAD(c, &m, pkv_cuda_open(c, &co, &g), PKV_ENOTSUP);
        cr_assert_null(g);
        MS_BAD(c, &m, pkv_cuda_open(c, NULL, &g), PKV_ENOTSUP);
        MS_BAD(c, &m, pkv_cuda_attn_workspace(&a.v, &a.p, &cs, &wb), PKV_ENOTSUP);
        cr_assert_eq(wb, 0, "attn_workspace: *work_bytes not 0 after a failure");
        MS_BAD(c, &m, pkv_cuda_attn_decode(&a.v, &a.p, &cs, a.q, a.out, NULL, 0, NULL),
               PKV_ENOTSUP);
        ms_free(&m);
        free(a.buf);
        return;
    }
    /* ---- A usable device: misuse a real handle and batch. ---- */
    co.flags = 0x80;
    MS_BAD(c, &m, pkv_cuda_open(c, &co, &g), PKV_EINVAL);
    co.flags = 0;
    co.device = 1 << 20;
    MS_BAD(c, &m, pkv_cuda_open(c, &co, &g), PKV_ENOTSUP);
    co.device = 0;
    co.pool_blocks = 8;
    PT_OK(pkv_cuda_open(c, &co, &g));
    MS_BAD(c, &m, pkv_cuda_get_stats(g, NULL), PKV_EINVAL);
    PT_OK(pkv_cuda_get_stats(g, &gs));
    {
        static char mt[1 << 14];
        size_t need = 0;
        MS_BAD(c, &m, pkv_cuda_metrics_text(g, NULL, 8, &need), PKV_EINVAL);
        MS_BAD(c, &m, pkv_cuda_metrics_text(g, mt, 8, &need), PKV_ERANGE);
        PT_OK(pkv_cuda_metrics_text(g, mt, sizeof mt, &need));
        cr_assert_eq(need, strlen(mt) + 1);
        cr_assert_not_null(strstr(mt, "\npagedkv_gpu_pool_blocks 8\n"), "%s", mt);
    }
    b = (pkv_cuda_batch *)&b;
    MS_BAD(c, &m, pkv_cuda_page_in(g, ids, 2, 0, NULL, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_page_in(g, ids, 0, 0, NULL, &b), PKV_EINVAL);
    cr_assert_null(b);
    MS_BAD(c, &m, pkv_cuda_page_in(g, NULL, 2, 0, NULL, &b), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_page_in(g, ids, 2, 0x10, NULL, &b), PKV_EINVAL);
    const uint64_t unknown[2] = {1, 99}, empty[1] = {2};
    MS_BAD(c, &m, pkv_cuda_page_in(g, unknown, 2, 0, NULL, &b), PKV_ENOSEQ);
    MS_BAD(c, &m, pkv_cuda_page_in(g, empty, 1, 0, NULL, &b), PKV_EINVAL);
    pkv_cuda_stats gs2;
    PT_OK(pkv_cuda_get_stats(g, &gs2));
    cr_assert_eq(gs2.slots_pinned, 0, "a failed page-in pinned slots");
    PT_OK(pkv_cuda_page_in(g, ids, 2, 0, NULL, &b));
    MS_BAD(c, &m, pkv_cuda_batch_get_info(b, NULL), PKV_EINVAL);
    PT_OK(pkv_cuda_batch_get_info(b, &bi));
    MS_BAD(c, &m, pkv_cuda_writeback(g, NULL, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_release(g, NULL, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_attn(g, NULL, &a.p, a.q, a.out, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_attn(g, b, NULL, a.q, a.out, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_attn(g, b, &a.p, NULL, a.out, NULL), PKV_EINVAL);
    pkv_attn_params bp = a.p;
    bp.layer = 0;
    bp.num_q_heads = 3;
    MS_BAD(c, &m, pkv_cuda_attn(g, b, &bp, a.q, a.out, NULL), PKV_EINVAL);
    /* The kernel entry points on a device view with bad arguments. */
    pkv_kv_view dv = bi.view;
    pkv_attn_params dp = {.layer = 0, .num_q_heads = PT_HEADS, .scale = 0.5f};
    pkv_cuda_seqs ds = bi.seqs;
    MS_BAD(c, &m, pkv_cuda_attn_workspace(&dv, &dp, &ds, NULL), PKV_EINVAL);
    pkv_cuda_seqs bs = ds;
    bs.max_len = 0;
    MS_BAD(c, &m, pkv_cuda_attn_workspace(&dv, &dp, &bs, &wb), PKV_EINVAL);
    bs = ds;
    bs.table_stride = 0;
    MS_BAD(c, &m, pkv_cuda_attn_workspace(&dv, &dp, &bs, &wb), PKV_ERANGE);
    bs = ds;
    bs.tables = NULL;
    MS_BAD(c, &m, pkv_cuda_attn_decode(&dv, &dp, &bs, a.q, a.out, NULL, 0, NULL), PKV_EINVAL);
    pkv_kv_view bv = dv;
    bv.base = NULL;
    MS_BAD(c, &m, pkv_cuda_attn_decode(&bv, &dp, &ds, a.q, a.out, NULL, 0, NULL), PKV_EINVAL);
    bv = dv;
    bv.dtype = (pkv_dtype)7;
    MS_BAD(c, &m, pkv_cuda_attn_workspace(&bv, &dp, &ds, &wb), PKV_EINVAL);
    pkv_attn_params bp2 = dp;
    bp2.scale = NAN;
    MS_BAD(c, &m, pkv_cuda_attn_decode(&dv, &bp2, &ds, a.q, a.out, NULL, 0, NULL), PKV_EINVAL);
    MS_BAD(c, &m, pkv_cuda_attn_decode(&dv, &dp, &ds, NULL, a.out, NULL, 0, NULL), PKV_EINVAL);
    PT_OK(pkv_cuda_release(g, b, NULL));
    pkv_cuda_close(g);
    PT_CHECK(c);
    ms_same_at(__FILE__, __LINE__, &m, c, "CUDA calls");
    ms_free(&m);
    /* Write-back into a read-only cache: ERDONLY. */
    pt_close(c);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.flags = PKV_OPEN_RDONLY;
    c = pt_open_sub("cache", &o);
    co.pool_blocks = 8;
    PT_OK(pkv_cuda_open(c, &co, &g));
    PT_OK(pkv_cuda_page_in(g, ids, 2, 0, NULL, &b));
    MS_ERR(pkv_cuda_writeback(g, b, NULL), PKV_ERDONLY);
    PT_OK(pkv_cuda_release(g, b, NULL));
    pkv_cuda_close(g);
    PT_CHECK(c);
    /* Write-back into a cache in the failed state: PKV_EFAILED, as every mutating
     * call (sequence 1 gets pending tokens, so a write-back would copy them). */
    pt_close(c);
    pt_syncio *io = malloc(sizeof *io); /* must outlive the handle */
    cr_assert_not_null(io);
    pt_syncio_init(io);
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    o.io = &io->ops;
    o.group_commit_us = 10000000; /* no I/O but at syncs */
    c = pt_open_sub("cache", &o);
    PT_APPEND(c, 1, 0, A, 8, 2); /* pending tokens are not recovered: again */
    PT_OK(pkv_cuda_open(c, &co, &g));
    PT_OK(pkv_cuda_page_in(g, ids, 2, 0, NULL, &b));
    pt_syncio_fail(io, EIO);
    PT_OK(pkv_seq_open(c, 77, 0, NULL, 0, NULL)); /* a record for the sync to write */
    MS_ERR(pkv_sync(c), PKV_EFAILED);
    MS_ERR(pkv_cuda_writeback(g, b, NULL), PKV_EFAILED);
    PT_OK(pkv_cuda_release(g, b, NULL));
    pkv_cuda_close(g);
    pt_close(c);
    free(io);
    free(a.buf);
}

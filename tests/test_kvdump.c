/* kvdump: the offline inspection tool, run as a separate process (the path comes
 * from $KVDUMP) on caches these tests build with the library, including damaged,
 * truncated and forged ones. Every run's exit status is checked and a death by a
 * signal fails the test (under ASan+UBSan an out-of-bounds read aborts). JSON
 * output is parsed with a small strict parser and compared with what the library
 * reports through its public API. Export -> import into a fresh directory must
 * make the same prompt hit with byte-identical K/V. */
#include "pkv_test.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

extern char **environ;

TestSuite(kvdump, .init = pt_setup, .fini = pt_teardown, .timeout = 240);

/* ---- Files ------------------------------------------------------------------ */

static uint8_t *rd_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    struct stat st;
    cr_assert(fstat(fd, &st) == 0);
    size_t n = (size_t)st.st_size;
    uint8_t *b = malloc(n + 1);
    cr_assert_not_null(b);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        cr_assert(r > 0, "read %s", path);
        got += (size_t)r;
    }
    b[n] = 0;
    close(fd);
    *len = n;
    return b;
}

static void wr_file(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0, "create %s: %s", path, strerror(errno));
    cr_assert(write(fd, buf, len) == (ssize_t)len, "write %s", path);
    close(fd);
}

static void patch(const char *path, uint64_t off, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    cr_assert(pwrite(fd, buf, len, (off_t)off) == (ssize_t)len, "pwrite %s", path);
    close(fd);
}

static void flip(const char *path, uint64_t off)
{
    uint8_t b;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert(fd >= 0);
    cr_assert(pread(fd, &b, 1, (off_t)off) == 1, "read %s at %llu", path, (unsigned long long)off);
    b ^= 0x5a;
    cr_assert(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
}

static void copy_dir(const char *src, const char *dst)
{
    cr_assert(mkdir(dst, 0700) == 0 || errno == EEXIST);
    DIR *d = opendir(src);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", src, e->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
        size_t n;
        uint8_t *buf = rd_file(a, &n);
        wr_file(b, buf, n);
        free(buf);
    }
    closedir(d);
}

/* A fingerprint of every file in a directory: names, sizes, bytes, modes. */
static uint64_t dir_print(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    uint64_t h = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        cr_assert(stat(p, &st) == 0);
        size_t n;
        uint8_t *b = rd_file(p, &n);
        h += XXH3_64bits_withSeed(b, n, XXH3_64bits(e->d_name, strlen(e->d_name)) ^ st.st_mode);
        free(b);
    }
    closedir(d);
    return h;
}

/* ---- Running kvdump ----------------------------------------------------------- */

typedef struct kres {
    int code; /* exit status; -1 if killed */
    char *out, *err;
    size_t outlen;
} kres;

static void kres_free(kres *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

static const char *kvdump_path(void)
{
    const char *p = getenv("KVDUMP");
    cr_assert(p && *p, "KVDUMP is not set (meson sets it to the built tools/kvdump)");
    return p;
}

static kres run_kd(const char *const *args)
{
    char op[512], ep[512];
    pt_path(op, sizeof op, "kd.out");
    pt_path(ep, sizeof ep, "kd.err");
    const char *argv[64];
    size_t n = 0;
    argv[n++] = kvdump_path();
    for (size_t i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, op, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(e, 0, "spawn %s: %s", argv[0], strerror(e));
    int st;
    cr_assert(waitpid(pid, &st, 0) == pid);
    kres r;
    size_t el;
    r.out = (char *)rd_file(op, &r.outlen);
    r.err = (char *)rd_file(ep, &el);
    char cmd[1024] = "";
    for (size_t i = 1; i < n; i++) {
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 2);
        strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    }
    cr_assert(WIFEXITED(st), "kvdump %s died of signal %d; stderr:\n%s", cmd,
              WIFSIGNALED(st) ? WTERMSIG(st) : 0, r.err);
    r.code = WEXITSTATUS(st);
    return r;
}

#define KD(...) run_kd((const char *const[]){__VA_ARGS__, NULL})

#define KD_EXPECT(r, want)                                                                \
    cr_assert_eq((r).code, (want), "exit %d, expected %d\nstdout:\n%s\nstderr:\n%s", (r).code, \
                 (want), (r).out, (r).err)

/* ---- A small strict JSON parser ------------------------------------------------ */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jv {
    jtype t;
    bool b;
    double num;
    uint64_t u;    /* exact value of a non-negative integer */
    bool is_uint;
    char *s;
    struct jv **items; /* array items or object values */
    char **keys;       /* object keys */
    size_t n;
} jv;

typedef struct jp {
    const char *p, *end;
    bool bad;
    int depth;
} jp;

static void jws(jp *q)
{
    while (q->p < q->end && (*q->p == ' ' || *q->p == '\n' || *q->p == '\t' || *q->p == '\r')) q->p++;
}

static jv *jparse_val(jp *q);

static char *jparse_str(jp *q)
{
    if (q->p >= q->end || *q->p != '"') {
        q->bad = true;
        return NULL;
    }
    q->p++;
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    while (q->p < q->end && *q->p != '"') {
        char c = *q->p++;
        if ((unsigned char)c < 0x20) q->bad = true;
        if (c == '\\') {
            if (q->p >= q->end) break;
            char e = *q->p++;
            switch (e) {
            case '"': c = '"'; break;
            case '\\': c = '\\'; break;
            case '/': c = '/'; break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    if (q->p >= q->end || !isxdigit((unsigned char)*q->p)) {
                        q->bad = true;
                        break;
                    }
                    char h = *q->p++;
                    v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                c = v < 0x80 ? (char)v : '?';
                break;
            }
            default: q->bad = true;
            }
        }
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = c;
    }
    if (q->p >= q->end) q->bad = true;
    else q->p++;
    s[n] = 0;
    return s;
}

static jv *jparse_val(jp *q)
{
    jws(q);
    jv *v = calloc(1, sizeof *v);
    if (q->p >= q->end || ++q->depth > 64) {
        q->bad = true;
        return v;
    }
    char c = *q->p;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->t = obj ? J_OBJ : J_ARR;
        q->p++;
        jws(q);
        if (q->p < q->end && *q->p == (obj ? '}' : ']')) {
            q->p++;
        } else {
            for (;;) {
                char *k = NULL;
                if (obj) {
                    jws(q);
                    k = jparse_str(q);
                    jws(q);
                    if (q->p >= q->end || *q->p != ':') {
                        q->bad = true;
                        free(k);
                        break;
                    }
                    q->p++;
                }
                jv *it = jparse_val(q);
                v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
                v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
                v->items[v->n] = it;
                v->keys[v->n] = k;
                v->n++;
                jws(q);
                if (q->bad || q->p >= q->end) {
                    q->bad = true;
                    break;
                }
                if (*q->p == ',') {
                    q->p++;
                    continue;
                }
                if (*q->p == (obj ? '}' : ']')) {
                    q->p++;
                    break;
                }
                q->bad = true;
                break;
            }
        }
    } else if (c == '"') {
        v->t = J_STR;
        v->s = jparse_str(q);
    } else if (!strncmp(q->p, "true", 4)) {
        v->t = J_BOOL;
        v->b = true;
        q->p += 4;
    } else if (!strncmp(q->p, "false", 5)) {
        v->t = J_BOOL;
        q->p += 5;
    } else if (!strncmp(q->p, "null", 4)) {
        v->t = J_NULL;
        q->p += 4;
    } else if (c == '-' || isdigit((unsigned char)c)) {
        v->t = J_NUM;
        const char *st = q->p;
        if (*q->p == '-') q->p++;
        bool frac = false;
        while (q->p < q->end && (isdigit((unsigned char)*q->p) || *q->p == '.' || *q->p == 'e' ||
                                 *q->p == 'E' || *q->p == '+' || *q->p == '-')) {
            if (!isdigit((unsigned char)*q->p)) frac = true;
            q->p++;
        }
        char buf[64];
        size_t l = (size_t)(q->p - st);
        if (l == 0 || l >= sizeof buf) q->bad = true;
        else {
            memcpy(buf, st, l);
            buf[l] = 0;
            v->num = strtod(buf, NULL);
            if (!frac && buf[0] != '-') {
                v->u = strtoull(buf, NULL, 10);
                v->is_uint = true;
            }
        }
    } else {
        q->bad = true;
    }
    q->depth--;
    return v;
}

static void jfree(jv *v)
{
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

/* Parse a whole document: exactly one value and trailing whitespace. */
static jv *jparse(const char *text)
{
    jp q = {text, text + strlen(text), false, 0};
    jv *v = jparse_val(&q);
    jws(&q);
    cr_assert(!q.bad && q.p == q.end, "invalid JSON near byte %ld:\n%s", (long)(q.p - text), text);
    return v;
}

/* Path lookup: "a.b.3.c" (numbers index arrays). NULL if absent. */
static jv *jget(jv *v, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    for (char *t = strtok_r(buf, ".", &save); t && v; t = strtok_r(NULL, ".", &save)) {
        if (v->t == J_OBJ) {
            jv *f = NULL;
            for (size_t i = 0; i < v->n; i++)
                if (!strcmp(v->keys[i], t)) f = v->items[i];
            v = f;
        } else if (v->t == J_ARR && isdigit((unsigned char)t[0])) {
            size_t i = strtoul(t, NULL, 10);
            v = i < v->n ? v->items[i] : NULL;
        } else {
            v = NULL;
        }
    }
    return v;
}

static uint64_t ju(jv *root, const char *path)
{
    jv *v = jget(root, path);
    cr_assert(v && v->t == J_NUM && v->is_uint, "JSON %s is not an unsigned number", path);
    return v->u;
}

static const char *js(jv *root, const char *path)
{
    jv *v = jget(root, path);
    cr_assert(v && v->t == J_STR, "JSON %s is not a string", path);
    return v->s;
}

static bool jb(jv *root, const char *path)
{
    jv *v = jget(root, path);
    cr_assert(v && v->t == J_BOOL, "JSON %s is not a boolean", path);
    return v->b;
}

static size_t jcount(jv *root, const char *path)
{
    jv *v = jget(root, path);
    cr_assert(v && (v->t == J_ARR || v->t == J_OBJ), "JSON %s is not an array", path);
    return v->n;
}

static bool jnull(jv *root, const char *path)
{
    jv *v = jget(root, path);
    return v && v->t == J_NULL;
}

/* Run with --json, check the exit code, parse and check the envelope. */
static jv *kd_json_at(int want, const char *cmd, const char *const *args)
{
    const char *a[40];
    size_t n = 0;
    for (size_t i = 0; args[i] && n < 38; i++) a[n++] = args[i];
    a[n++] = "--json";
    a[n] = NULL;
    kres r = run_kd(a);
    KD_EXPECT(r, want);
    jv *v = jparse(r.out);
    cr_assert_eq(ju(v, "kvdump"), 1);
    cr_assert_str_eq(js(v, "command"), cmd);
    kres_free(&r);
    return v;
}
#define KDJ(want, cmd, ...) kd_json_at((want), (cmd), (const char *const[]){cmd, __VA_ARGS__, NULL})

/* ---- Building caches -------------------------------------------------------------- */

#define BS 4u
#define CAP 64u

static void opts(pkv_options *o, pkv_dtype dt, pkv_durability mode)
{
    pt_opts(o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, dt, CAP);
    o->durability = mode;
}

/* Open a sequence with prompt[0..n), append and commit the rest. */
static void seq_full(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t nc = PT_SEQ_OPEN(c, id, salt, p, n);
    if (nc < n) {
        PT_APPEND(c, id, salt, p, nc, n - nc);
        PT_OK(pkv_seq_commit(c, id, n - nc));
    }
}

/* The reference cache: 4 sequences over shared prefixes, one closed (its blocks
 * cached), one truncated; block size 4.
 *   seq 1: P[0..22)                    seq 2: P[0..25)
 *   seq 3: P[0..20) + 1001... (cut to 10)  seq 4 (closed): P[0..20) + 1002...
 * tokens P[i] = 100 + i. */
static uint32_t P[64];

static pkv_cache *build_ref(const char *sub, pkv_dtype dt, pkv_durability mode, char *dir,
                            size_t dirlen)
{
    for (int i = 0; i < 64; i++) P[i] = 100u + (uint32_t)i;
    pkv_options o;
    opts(&o, dt, mode);
    pt_path(dir, dirlen, sub);
    pkv_cache *c = pt_open_sub(sub, &o);
    seq_full(c, 1, 0, P, 22);
    seq_full(c, 2, 0, P, 25);
    uint32_t q[32];
    memcpy(q, P, sizeof q);
    q[20] = 1001;
    seq_full(c, 3, 0, q, 28);
    q[20] = 1002;
    seq_full(c, 4, 0, q, 31);
    PT_OK(pkv_seq_close(c, 4));
    PT_OK(pkv_seq_truncate(c, 3, 10));
    PT_OK(pkv_sync(c));
    PT_CHECK(c);
    return c;
}

/* ---- Usage and errors ----------------------------------------------------------------- */

Test(kvdump, help_and_usage_errors)
{
    const char *cmds[] = {"summary", "blocks", "block", "seqs", "seq", "prefixes",
                          "wal", "verify", "export", "import"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        kres r = KD(cmds[i], "--help");
        KD_EXPECT(r, 0);
        cr_assert(strstr(r.out, "usage: kvdump"), "%s --help: %s", cmds[i], r.out);
        kres_free(&r);
    }
    kres r = KD("--help");
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "exit status"));
    kres_free(&r);
    r = KD("frobnicate", "x");
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "unknown command"));
    kres_free(&r);
    r = KD("summary");
    KD_EXPECT(r, 2);
    kres_free(&r);
    r = KD("blocks", pt_dir, "--state", "bogus");
    KD_EXPECT(r, 2);
    kres_free(&r);
    r = KD("blocks", pt_dir, "--limit");
    KD_EXPECT(r, 2);
    kres_free(&r);
    r = KD("wal", pt_dir, "--type", "nonsense");
    KD_EXPECT(r, 2);
    kres_free(&r);
    r = KD("summary", pt_dir, "--no-such-option");
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "unknown option"));
    kres_free(&r);
    r = KD("export", pt_dir, "--seq", "1");
    KD_EXPECT(r, 2); /* no -o */
    kres_free(&r);
    /* Usage errors in JSON mode still produce one JSON document. */
    jv *v = KDJ(2, "seq", pt_dir, "notanumber");
    cr_assert(jget(v, "error.message"));
    cr_assert_eq(ju(v, "error.exit"), 2);
    jfree(v);
}

Test(kvdump, missing_and_foreign_directories)
{
    char p[512], f[512];
    pt_path(p, sizeof p, "nope");
    const char *cmds[] = {"summary", "blocks", "seqs", "prefixes", "wal", "verify"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        kres r = KD(cmds[i], p);
        KD_EXPECT(r, 2);
        cr_assert(strstr(r.err, "error"), "%s: %s", cmds[i], r.err);
        kres_free(&r);
        /* An empty directory: not a cache. */
        r = KD(cmds[i], pt_dir);
        KD_EXPECT(r, 2);
        cr_assert(strstr(r.err, "no arena file"), "%s: %s", cmds[i], r.err);
        kres_free(&r);
    }
    /* A regular file instead of a directory. */
    pt_path(f, sizeof f, "file");
    wr_file(f, "hello", 5);
    kres r = KD("summary", f);
    KD_EXPECT(r, 2);
    kres_free(&r);
    /* An arena of garbage. */
    pt_path(p, sizeof p, "garbage");
    mkdir(p, 0700);
    pt_path(f, sizeof f, "garbage/arena");
    uint8_t junk[8192];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
    wr_file(f, junk, sizeof junk);
    r = KD("verify", p);
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "bad magic"));
    kres_free(&r);
    jv *v = KDJ(2, "summary", p);
    cr_assert(strstr(js(v, "error.message"), "not a pagedkv arena"));
    jfree(v);
}

/* ---- Reading a healthy cache ---------------------------------------------------------- */

Test(kvdump, summary_matches_the_library)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F16, PKV_DURABLE_GROUP, dir, sizeof dir);
    pkv_stats st = pt_stats(c);
    pt_close(c);
    /* Reopen read-only with the library for the reference numbers. */
    pkv_options o;
    opts(&o, PKV_F16, PKV_DURABLE_GROUP);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *r = NULL;
    PT_OK(pkv_open(dir, &o, &r));
    pkv_stats rs = pt_stats(r);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(r, &rec));
    pkv_close(r);

    jv *v = KDJ(0, "summary", dir);
    cr_assert_str_eq(js(v, "model_id"), PT_MODEL);
    cr_assert_eq(ju(v, "geometry.num_layers"), PT_LAYERS);
    cr_assert_eq(ju(v, "geometry.num_kv_heads"), PT_HEADS);
    cr_assert_eq(ju(v, "geometry.head_dim"), PT_HDIM);
    cr_assert_eq(ju(v, "geometry.block_size"), BS);
    cr_assert_str_eq(js(v, "geometry.dtype"), "f16");
    cr_assert_eq(ju(v, "geometry.capacity"), CAP);
    cr_assert_eq(ju(v, "blocks.free"), rs.blocks_free);
    cr_assert_eq(ju(v, "blocks.cached"), rs.blocks_cached);
    cr_assert_eq(ju(v, "blocks.used"), rs.blocks_used);
    cr_assert_eq(ju(v, "blocks.sealed"), st.blocks_sealed);
    cr_assert_eq(ju(v, "blocks.free") + ju(v, "blocks.cached") + ju(v, "blocks.used"), CAP);
    cr_assert_eq(ju(v, "sequences.count"), 3);
    cr_assert_eq(ju(v, "sequences.committed_tokens"), 22 + 25 + 10);
    cr_assert_eq(ju(v, "log.last_lsn"), st.last_lsn);
    cr_assert_eq(ju(v, "log.first_lsn"), 1);
    cr_assert_str_eq(js(v, "log.end_reason"), "clean");
    cr_assert(jnull(v, "checkpoint"));
    cr_assert_eq(ju(v, "recovery.records_replayed"), rec.records_replayed);
    cr_assert_eq(ju(v, "recovery.last_lsn"), st.last_lsn);
    jfree(v);

    kres t = KD("summary", dir);
    KD_EXPECT(t, 0);
    cr_assert(strstr(t.out, PT_MODEL) && strstr(t.out, "f16") && strstr(t.out, "clean end"),
              "%s", t.out);
    kres_free(&t);
}

Test(kvdump, blocks_block_seqs_seq)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    uint32_t tab[16];
    size_t n1 = PT_BLOCKS(c, 1, tab, 16);
    cr_assert_eq(n1, 6);
    pkv_stats st = pt_stats(c);
    pt_close(c);

    jv *v = KDJ(0, "blocks", dir);
    cr_assert_eq(ju(v, "matched"), st.blocks_cached + st.blocks_used);
    size_t nb = jcount(v, "blocks");
    cr_assert_eq(nb, st.blocks_cached + st.blocks_used);
    for (size_t i = 0; i < nb; i++) {
        char k[64];
        snprintf(k, sizeof k, "blocks.%zu.state", i);
        cr_assert_str_neq(js(v, k), "free");
    }
    jfree(v);
    v = KDJ(0, "blocks", dir, "--state", "cached");
    cr_assert_eq(jcount(v, "blocks"), st.blocks_cached);
    jfree(v);
    v = KDJ(0, "blocks", dir, "--state", "all", "--limit", "5");
    cr_assert_eq(jcount(v, "blocks"), 5);
    cr_assert_eq(ju(v, "matched"), CAP);
    jfree(v);

    /* The first block of seq 1 is shared by seqs 1, 2, 3. */
    char id[16];
    snprintf(id, sizeof id, "%u", tab[0]);
    v = KDJ(0, "block", dir, id, "--payload");
    cr_assert_str_eq(js(v, "state"), "used");
    cr_assert_str_eq(js(v, "kind"), "sealed");
    cr_assert_eq(ju(v, "ref"), 3);
    cr_assert(jnull(v, "parent"));
    cr_assert_eq(ju(v, "depth"), 1);
    cr_assert_eq(jcount(v, "children"), 1);
    cr_assert_eq(ju(v, "children.0"), tab[1]);
    cr_assert(jb(v, "payload_ok"));
    cr_assert_eq(jcount(v, "tokens"), BS);
    for (uint32_t i = 0; i < BS; i++) {
        char k[32];
        snprintf(k, sizeof k, "tokens.%u", i);
        cr_assert_eq(ju(v, k), P[i]);
    }
    cr_assert_eq(jcount(v, "sequences"), 3);
    cr_assert_eq(jcount(v, "payload.layers"), PT_LAYERS);
    /* f32 values are pt_val() < 2^24, odd: min >= 1, no NaN. */
    jv *mn = jget(v, "payload.layers.0.k.min");
    cr_assert(mn && mn->t == J_NUM && mn->num >= 1.0);
    cr_assert_eq(ju(v, "payload.layers.1.v.nan"), 0);
    jfree(v);

    /* The open last block of seq 1 (22 tokens: 2 in the last block). */
    snprintf(id, sizeof id, "%u", tab[5]);
    v = KDJ(0, "block", dir, id);
    cr_assert_str_eq(js(v, "kind"), "open");
    cr_assert_eq(jcount(v, "tokens"), 2);
    cr_assert(!jget(v, "payload_sum"));
    jfree(v);

    kres r = KD("block", dir, "64");
    KD_EXPECT(r, 2);
    kres_free(&r);

    v = KDJ(0, "seqs", dir);
    cr_assert_eq(ju(v, "count"), 3);
    cr_assert_eq(ju(v, "sequences.0.id"), 1);
    cr_assert_eq(ju(v, "sequences.0.len"), 22);
    cr_assert_eq(ju(v, "sequences.0.blocks"), 6);
    cr_assert_eq(ju(v, "sequences.0.sealed_blocks"), 5);
    cr_assert_eq(ju(v, "sequences.2.id"), 3);
    cr_assert_eq(ju(v, "sequences.2.committed"), 10);
    jfree(v);

    v = KDJ(0, "seq", dir, "1");
    cr_assert_eq(ju(v, "committed"), 22);
    cr_assert_eq(jcount(v, "table"), 6);
    for (size_t i = 0; i < 6; i++) {
        char k[32];
        snprintf(k, sizeof k, "table.%zu.block", i);
        cr_assert_eq(ju(v, k), tab[i]);
    }
    cr_assert_str_eq(js(v, "table.5.kind"), "open");
    cr_assert_eq(jcount(v, "tokens"), 22);
    cr_assert_eq(ju(v, "tokens.21"), P[21]);
    jfree(v);
    r = KD("seq", dir, "4"); /* closed */
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "no sequence 4"));
    kres_free(&r);

    r = KD("seq", dir, "2");
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "sequence 2") && strstr(r.out, "(shared)"), "%s", r.out);
    kres_free(&r);
}

Test(kvdump, prefix_tree)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    jv *v = KDJ(0, "prefixes", dir);
    /* Blocks 0-1 (P[0..8)) are used by seqs 1, 2, 3; blocks 2-4 by seqs 1, 2. */
    cr_assert_eq(ju(v, "trees"), 1);
    cr_assert_eq(ju(v, "top.0.users"), 3);
    cr_assert_eq(ju(v, "top.0.depth"), 2);
    cr_assert_eq(ju(v, "top.0.tokens"), 8);
    cr_assert_eq(ju(v, "top.1.users"), 2);
    cr_assert_eq(ju(v, "top.1.depth"), 5);
    cr_assert_eq(ju(v, "top.1.fanout"), 3); /* P[20..24), 1001.., 1002.. */
    cr_assert_eq(jcount(v, "top.1.path"), 5);
    /* Segments cover every sealed block exactly once. */
    size_t ns = jcount(v, "segments"), tot = 0;
    for (size_t i = 0; i < ns; i++) {
        char k[48];
        snprintf(k, sizeof k, "segments.%zu.blocks", i);
        tot += jcount(v, k);
    }
    cr_assert_eq(tot, ju(v, "sealed_blocks"));
    jfree(v);
    v = KDJ(0, "prefixes", dir, "--top", "1");
    cr_assert_eq(jcount(v, "top"), 1);
    cr_assert_eq(jcount(v, "segments"), 1);
    jfree(v);
    kres r = KD("prefixes", dir);
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "used by 3 seqs") && strstr(r.out, "`-- "), "%s", r.out);
    kres_free(&r);
}

Test(kvdump, wal_records_and_filters)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    pkv_stats st = pt_stats(c);
    pt_close(c);
    jv *v = KDJ(0, "wal", dir);
    size_t n = jcount(v, "records");
    cr_assert_eq(n, st.last_lsn);
    for (size_t i = 0; i < n; i++) {
        char k[48];
        snprintf(k, sizeof k, "records.%zu.lsn", i);
        cr_assert_eq(ju(v, k), i + 1);
    }
    cr_assert_str_eq(js(v, "records.0.type"), "SEQ_SET");
    cr_assert_eq(ju(v, "end.last_lsn"), st.last_lsn);
    cr_assert_str_eq(js(v, "end.reason"), "clean");
    cr_assert_eq(ju(v, "stats.records"), n);
    cr_assert(ju(v, "stats.frames") > 1); /* ALWAYS: a frame per call */
    /* a commit sealing one block logs a SEAL, one sealing more a SEAL_RUN */
    uint64_t seals = ju(v, "stats.by_type.SEAL.count");
    uint64_t runs = ju(v, "stats.by_type.SEAL_RUN.count");
    cr_assert(seals > 0 && runs > 0, "%llu SEAL, %llu SEAL_RUN", (unsigned long long)seals,
              (unsigned long long)runs);
    cr_assert_eq(ju(v, "stats.by_type.SEQ_CLOSE.count"), 1);
    cr_assert_eq(ju(v, "stats.by_type.TRUNC.count"), 1);
    jfree(v);

    v = KDJ(0, "wal", dir, "--type", "seal");
    cr_assert_eq(jcount(v, "records"), seals);
    cr_assert_str_eq(js(v, "records.0.type"), "SEAL");
    cr_assert_eq(jcount(v, "records.0.tokens"), BS);
    jfree(v);
    v = KDJ(0, "wal", dir, "--type", "seal-run");
    cr_assert_eq(jcount(v, "records"), runs);
    cr_assert_str_eq(js(v, "records.0.type"), "SEAL_RUN");
    cr_assert(jnull(v, "records.0.seals.0.parent")); /* the first commit starts a chain */
    cr_assert_eq(ju(v, "records.0.seals.1.parent"), ju(v, "records.0.seals.0.block"));
    cr_assert_eq(jcount(v, "records.0.seals.0.tokens"), BS);
    uint64_t in_runs = 0;
    for (size_t i = 0; i < runs; i++) {
        char k[48];
        snprintf(k, sizeof k, "records.%zu.seals", i);
        in_runs += jcount(v, k);
    }
    cr_assert_eq(seals + in_runs, st.seals, "%llu SEALs + %llu in runs, %llu seals",
                 (unsigned long long)seals, (unsigned long long)in_runs,
                 (unsigned long long)st.seals);
    jfree(v);
    v = KDJ(0, "wal", dir, "--from", "3", "--to", "5");
    cr_assert_eq(jcount(v, "records"), 3);
    cr_assert_eq(ju(v, "records.0.lsn"), 3);
    jfree(v);
    v = KDJ(0, "wal", dir, "--stats");
    cr_assert(!jget(v, "records"));
    cr_assert_eq(ju(v, "stats.records"), n);
    jfree(v);

    kres r = KD("wal", dir, "--type", "trunc,seq_close");
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "TRUNC") && strstr(r.out, "SEQ_CLOSE") && !strstr(r.out, "SEAL "),
              "%s", r.out);
    cr_assert(strstr(r.out, "end of log: last valid LSN"), "%s", r.out);
    kres_free(&r);
}

Test(kvdump, wal_after_checkpoint)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    PT_OK(pkv_checkpoint(c));
    pkv_stats st0 = pt_stats(c);
    PT_OK(pkv_seq_close(c, 2));
    PT_OK(pkv_sync(c));
    pkv_stats st = pt_stats(c);
    pt_close(c);
    jv *v = KDJ(0, "wal", dir);
    cr_assert_eq(ju(v, "checkpoint.lsn"), st0.checkpoint_lsn);
    cr_assert_eq(ju(v, "end.last_lsn"), st.last_lsn);
    size_t n = jcount(v, "records");
    cr_assert(n >= 1);
    char k[48];
    snprintf(k, sizeof k, "records.%zu.type", n - 1);
    cr_assert_str_eq(js(v, k), "SEQ_CLOSE");
    snprintf(k, sizeof k, "records.%zu.in_checkpoint", n - 1);
    cr_assert(!jb(v, k));
    jfree(v);
    v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "checkpoint.lsn"), st0.checkpoint_lsn);
    cr_assert_eq(ju(v, "recovery.checkpoint_lsn"), st0.checkpoint_lsn);
    cr_assert_eq(ju(v, "sequences.count"), 2);
    jfree(v);
    v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"));
    jfree(v);
}

/* ---- verify ------------------------------------------------------------------------- */

Test(kvdump, verify_clean_and_payload_damage)
{
    char dir[512], arena[600];
    pkv_cache *c = build_ref("cache", PKV_BF16, PKV_DURABLE_GROUP, dir, sizeof dir);
    pkv_cache_info inf = pt_info(c);
    uint32_t tab[16];
    PT_BLOCKS(c, 2, tab, 16);
    pt_close(c);
    jv *v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"));
    cr_assert_eq(jcount(v, "problems"), 0);
    cr_assert(ju(v, "checked.payloads") >= 6);
    cr_assert_eq(ju(v, "checked.payloads"), ju(v, "checked.sealed_blocks"));
    cr_assert(jb(v, "checked.invariants"));
    jfree(v);

    /* Damage the payload of a cached block (not held by a sequence) and of one a
     * sequence holds (entry 2 of seq 2). */
    v = KDJ(0, "blocks", dir, "--state", "cached");
    cr_assert(jcount(v, "blocks") >= 1);
    uint32_t cached = (uint32_t)ju(v, "blocks.0.block");
    jfree(v);
    snprintf(arena, sizeof arena, "%s/arena", dir);
    flip(arena, 4096 + (uint64_t)cached * inf.slot_bytes + 3);
    flip(arena, 4096 + (uint64_t)tab[2] * inf.slot_bytes + inf.block_bytes - 1);
    uint64_t before = dir_print(dir);
    v = KDJ(1, "verify", dir);
    cr_assert(!jb(v, "ok"));
    bool saw_cached = false, saw_held = false, saw_cut = false;
    for (size_t i = 0; i < jcount(v, "problems"); i++) {
        char k[48];
        snprintf(k, sizeof k, "problems.%zu.kind", i);
        const char *kind = js(v, k);
        snprintf(k, sizeof k, "problems.%zu.block", i);
        if (!strcmp(kind, "payload_checksum")) {
            uint64_t b = ju(v, k);
            saw_cached |= b == cached;
            saw_held |= b == tab[2];
        }
        saw_cut |= !strcmp(kind, "sequence_cut_payload");
    }
    cr_assert(saw_cached && saw_held && saw_cut, "problems: cached %d held %d cut %d", saw_cached,
              saw_held, saw_cut);
    jfree(v);
    kres r = KD("verify", dir);
    KD_EXPECT(r, 1);
    cr_assert(strstr(r.out, "problem: payload_checksum"), "%s", r.out);
    kres_free(&r);
    /* kvdump never writes: the damage is still there, nothing else changed. */
    cr_assert_eq(dir_print(dir), before);
    /* block ID shows the mismatch. */
    char id[16];
    snprintf(id, sizeof id, "%u", cached);
    v = KDJ(0, "block", dir, id);
    cr_assert(!jb(v, "payload_ok"));
    jfree(v);
}

/* Forge a frame with valid checksums: records of (type, payload) appended after
 * the last valid frame of a segment. */
typedef struct frec {
    uint16_t type;
    uint8_t payload[256];
    size_t len;
} frec;

static void seg_path(const char *dir, char *out, size_t n)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    out[0] = 0;
    char best[64] = "";
    while ((e = readdir(d)))
        if (strlen(e->d_name) == 20 && !strncmp(e->d_name, "wal-", 4) && strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    cr_assert(best[0], "no segment in %s", dir);
    snprintf(out, n, "%s/%s", dir, best);
}

/* Offsets of the frames of a segment (walking the headers, no checksum check). */
static size_t frames_of(const char *path, uint64_t *off, uint64_t *first, uint32_t *epoch, size_t max)
{
    size_t len;
    uint8_t *b = rd_file(path, &len);
    *epoch = (uint32_t)b[12] | (uint32_t)b[13] << 8 | (uint32_t)b[14] << 16 | (uint32_t)b[15] << 24;
    size_t n = 0;
    uint64_t o = 64;
    while (n < max && o + 32 <= len) {
        uint32_t magic, ep, nb;
        memcpy(&magic, b + o, 4);
        memcpy(&ep, b + o + 4, 4);
        memcpy(&nb, b + o + 20, 4);
        if (magic != 0x46564b50u || ep != *epoch) break;
        off[n] = o;
        memcpy(&first[n], b + o + 8, 8);
        n++;
        o += 32 + nb;
    }
    off[n] = o; /* end */
    free(b);
    return n;
}

static void forge_frame(const char *path, uint64_t at, uint32_t epoch, uint64_t lsn,
                        const frec *recs, size_t nrec)
{
    uint8_t buf[4096];
    size_t o = 32;
    for (size_t i = 0; i < nrec; i++) {
        size_t rl = (16 + recs[i].len + 8 + 7) & ~(size_t)7;
        cr_assert(o + rl <= sizeof buf);
        memset(buf + o, 0, rl);
        uint32_t l32 = (uint32_t)rl;
        memcpy(buf + o, &l32, 4);
        memcpy(buf + o + 4, &recs[i].type, 2);
        uint64_t L = lsn + i;
        memcpy(buf + o + 8, &L, 8);
        memcpy(buf + o + 16, recs[i].payload, recs[i].len);
        uint64_t sum = XXH3_64bits_withSeed(buf + o, rl - 8, epoch);
        memcpy(buf + o + rl - 8, &sum, 8);
        o += rl;
    }
    uint32_t magic = 0x46564b50u, n32 = (uint32_t)nrec, bytes = (uint32_t)(o - 32);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &epoch, 4);
    memcpy(buf + 8, &lsn, 8);
    memcpy(buf + 16, &n32, 4);
    memcpy(buf + 20, &bytes, 4);
    XXH3_state_t st;
    memset(&st, 0, sizeof st); /* XXH3_INITSTATE: a seeded reset reads the old seed */
    XXH3_64bits_reset_withSeed(&st, epoch);
    XXH3_64bits_update(&st, buf, 24);
    XXH3_64bits_update(&st, buf + 32, bytes);
    uint64_t fs = XXH3_64bits_digest(&st);
    memcpy(buf + 24, &fs, 8);
    patch(path, at, buf, o);
}

/* An arena of format version 1 (page-sized slots for blocks a new arena packs
 * several to a page): kvdump reads its stored stride. The same directory, its
 * payloads moved to their version-1 offsets, verifies clean; a byte flipped at a
 * cached block's version-1 offset is found (reading at the dense stride would
 * see neither the moved payloads nor the flip where it is). */
Test(kvdump, a_version_1_arena_is_read_at_its_page_stride)
{
    char dir[512], arena[600];
    pkv_cache *c = build_ref("cache", PKV_BF16, PKV_DURABLE_GROUP, dir, sizeof dir);
    pkv_cache_info inf = pt_info(c);
    pt_close(c);
    const uint64_t page = (inf.block_bytes + 4095) / 4096 * 4096;
    cr_assert(inf.slot_bytes < page, "the test needs blocks a new arena packs densely");
    snprintf(arena, sizeof arena, "%s/arena", dir);
    size_t len = 0;
    uint8_t *f = rd_file(arena, &len);
    cr_assert_eq(len, 4096 + inf.capacity * inf.slot_bytes);
    uint8_t *g = calloc(1, 4096 + inf.capacity * page);
    memcpy(g, f, 4096);
    for (uint64_t b = 0; b < inf.capacity; b++)
        memcpy(g + 4096 + b * page, f + 4096 + b * inf.slot_bytes, inf.block_bytes);
    uint32_t ver = 1;
    memcpy(g + 8, &ver, 4);
    memcpy(g + 56, &page, 8);
    uint64_t sum = XXH3_64bits(g, 4088);
    memcpy(g + 4088, &sum, 8);
    cr_assert_eq(truncate(arena, (off_t)(4096 + inf.capacity * page)), 0);
    patch(arena, 0, g, 4096 + inf.capacity * page);
    free(f);
    free(g);

    jv *v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "geometry.slot_bytes"), page);
    jfree(v);
    v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"));
    cr_assert(ju(v, "checked.payloads") >= 6);
    jfree(v);
    v = KDJ(0, "blocks", dir, "--state", "cached");
    cr_assert(jcount(v, "blocks") >= 1);
    uint32_t cached = (uint32_t)ju(v, "blocks.0.block");
    jfree(v);
    flip(arena, 4096 + (uint64_t)cached * page + 3);
    v = KDJ(1, "verify", dir);
    cr_assert(!jb(v, "ok"));
    jfree(v);
}

Test(kvdump, log_torn_tail_and_corruption)
{
    char dir[512], seg[600];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    pkv_stats st = pt_stats(c);
    pt_close(c);
    seg_path(dir, seg, sizeof seg);
    uint64_t off[256], first[256];
    uint32_t epoch;
    size_t nf = frames_of(seg, off, first, &epoch, 255);
    cr_assert(nf >= 6, "only %zu frames", nf);

    /* A torn tail: damage the last frame. Recovery cuts it; not a problem. */
    char torn[512];
    pt_path(torn, sizeof torn, "torn");
    copy_dir(dir, torn);
    char tseg[600];
    seg_path(torn, tseg, sizeof tseg);
    flip(tseg, off[nf - 1] + 40);
    jv *v = KDJ(0, "wal", torn);
    cr_assert_str_eq(js(v, "end.reason"), "torn_frame");
    cr_assert_eq(ju(v, "end.last_lsn"), first[nf - 1] - 1);
    cr_assert(ju(v, "end.torn_bytes") > 0);
    cr_assert_eq(ju(v, "end.offset"), off[nf - 1]);
    jfree(v);
    v = KDJ(0, "verify", torn);
    cr_assert(jb(v, "ok"));
    cr_assert_str_eq(js(v, "notes.0.kind"), "torn_tail");
    jfree(v);
    v = KDJ(0, "summary", torn);
    cr_assert_eq(ju(v, "recovery.last_lsn"), first[nf - 1] - 1);
    cr_assert(ju(v, "log.torn_bytes") > 0);
    jfree(v);

    /* Corruption: a damaged frame in the middle, valid frames after it. */
    char bad[512], bseg[600];
    pt_path(bad, sizeof bad, "bad");
    copy_dir(dir, bad);
    seg_path(bad, bseg, sizeof bseg);
    size_t k = nf / 2;
    flip(bseg, off[k] + 33);
    uint64_t before = dir_print(bad);
    v = KDJ(0, "wal", bad);
    cr_assert_str_eq(js(v, "end.reason"), "corrupt");
    cr_assert_eq(ju(v, "end.corrupt_lsn"), first[k]);
    cr_assert_eq(ju(v, "end.last_lsn"), first[k] - 1);
    cr_assert_eq(jcount(v, "records"), first[k] - 1);
    jfree(v);
    v = KDJ(1, "verify", bad);
    cr_assert_str_eq(js(v, "problems.0.kind"), "log_corrupt");
    cr_assert(jb(v, "checked.recovered")); /* read up to the damage */
    jfree(v);
    kres r = KD("summary", bad);
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "--point-in-time"), "%s", r.err);
    kres_free(&r);
    v = KDJ(0, "summary", bad, "--point-in-time");
    cr_assert_eq(ju(v, "recovery.corrupt_lsn"), first[k]);
    cr_assert_eq(ju(v, "recovery.last_lsn"), first[k] - 1);
    jfree(v);
    cr_assert_eq(dir_print(bad), before);

    /* A gap: a later segment that does not continue the log. */
    char gap[512], gseg[600];
    pt_path(gap, sizeof gap, "gap");
    copy_dir(dir, gap);
    seg_path(gap, gseg, sizeof gseg);
    size_t len;
    uint8_t *b = rd_file(gseg, &len);
    /* Segment 2 starting at last + 5, holding one valid frame. */
    uint64_t no = 2, start = st.last_lsn + 5;
    memcpy(b + 16, &no, 8);
    memcpy(b + 24, &start, 8);
    uint64_t hs = XXH3_64bits(b, 56);
    memcpy(b + 56, &hs, 8);
    memset(b + 64, 0, len - 64);
    char g2[600];
    snprintf(g2, sizeof g2, "%s/wal-0000000000000002", gap);
    wr_file(g2, b, len);
    free(b);
    frec cl = {7, {0}, 8};
    uint64_t sid = 99;
    memcpy(cl.payload, &sid, 8);
    forge_frame(g2, 64, epoch, start, &cl, 1);
    v = KDJ(0, "wal", gap);
    cr_assert_str_eq(js(v, "end.reason"), "gap");
    cr_assert_eq(ju(v, "end.corrupt_lsn"), st.last_lsn + 1);
    jfree(v);
    v = KDJ(1, "verify", gap);
    cr_assert_str_eq(js(v, "problems.0.kind"), "log_gap");
    jfree(v);
}

Test(kvdump, forged_records_never_crash)
{
    char dir[512], seg[600];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    pkv_stats st = pt_stats(c);
    pt_close(c);
    seg_path(dir, seg, sizeof seg);
    uint64_t off[256], first[256];
    uint32_t epoch;
    size_t nf = frames_of(seg, off, first, &epoch, 255);
    /* Records that pass every checksum but carry hostile values. */
    frec recs[16];
    size_t nr = 0;
    uint64_t u;
    uint32_t w;
    /* SEQ_SET with committed = 2^64 - 1 (ceil(committed / B) overflows). */
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 3;
    u = 77;
    memcpy(recs[nr].payload, &u, 8);
    u = UINT64_MAX;
    memcpy(recs[nr].payload + 16, &u, 8);
    w = 0;
    memcpy(recs[nr].payload + 24, &w, 4);
    w = (uint32_t)(UINT64_MAX % BS);
    memcpy(recs[nr].payload + 28, &w, 4);
    recs[nr].len = 32 + 4 * BS;
    nr++;
    /* COMMIT of seq 1 with committed = 2^64 - 1. */
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 4;
    u = 1;
    memcpy(recs[nr].payload, &u, 8);
    u = UINT64_MAX;
    memcpy(recs[nr].payload + 8, &u, 8);
    w = (uint32_t)(UINT64_MAX % BS);
    memcpy(recs[nr].payload + 28, &w, 4);
    recs[nr].len = 32 + 4 * BS;
    nr++;
    /* SEAL of a block out of range, EVICT out of range, unknown type, huge counts. */
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 1;
    w = 0xFFFFFF00u;
    memcpy(recs[nr].payload, &w, 4);
    w = BS;
    memcpy(recs[nr].payload + 40, &w, 4);
    recs[nr].len = 48 + 4 * BS;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 2;
    w = 0xFFFFFFF0u;
    memcpy(recs[nr].payload, &w, 4);
    recs[nr].len = 8;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 42;
    recs[nr].len = 8;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 3;
    w = 0x40000000u;
    memcpy(recs[nr].payload + 24, &w, 4);
    recs[nr].len = 32;
    nr++;
    /* SEAL_RUN: a count no length covers, a block out of range; EVICT_RUN: a
     * block out of range after a good one, no block. */
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 9;
    w = 0xFFFFFFFFu;
    memcpy(recs[nr].payload, &w, 4);
    w = BS;
    memcpy(recs[nr].payload + 4, &w, 4);
    recs[nr].len = 16 + 32 + 4 * BS;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 9;
    w = 1;
    memcpy(recs[nr].payload, &w, 4);
    w = BS;
    memcpy(recs[nr].payload + 4, &w, 4);
    w = 0xFFFFFF00u;
    memcpy(recs[nr].payload + 16, &w, 4);
    recs[nr].len = 16 + 32 + 4 * BS;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 10;
    w = 2;
    memcpy(recs[nr].payload, &w, 4);
    w = 0xFFFFFFF0u;
    memcpy(recs[nr].payload + 12, &w, 4);
    recs[nr].len = 16;
    nr++;
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 10;
    recs[nr].len = 8;
    nr++;
    /* TRUNC of seq 1 to 2^64 - 1 with no tail block. */
    memset(&recs[nr], 0, sizeof recs[nr]);
    recs[nr].type = 6;
    u = 1;
    memcpy(recs[nr].payload, &u, 8);
    u = UINT64_MAX - (UINT64_MAX % BS);
    memcpy(recs[nr].payload + 8, &u, 8);
    w = 0xFFFFFFFFu;
    memcpy(recs[nr].payload + 16, &w, 4);
    recs[nr].len = 24;
    nr++;
    for (size_t i = 0; i < nr; i++) {
        char d2[512], s2[600];
        snprintf(d2, sizeof d2, "%s/forged%zu", pt_dir, i);
        copy_dir(dir, d2);
        seg_path(d2, s2, sizeof s2);
        forge_frame(s2, off[nf], epoch, st.last_lsn + 1, &recs[i], 1);
        const char *cmds[] = {"summary", "blocks", "seqs", "prefixes", "wal", "verify"};
        for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
            kres r = KD(cmds[k], d2);
            cr_assert(r.code == 0 || r.code == 1 || r.code == 2, "record %zu, %s: exit %d", i,
                      cmds[k], r.code);
            kres_free(&r);
        }
        kres r = KD("verify", d2);
        cr_assert(r.code == 1 || r.code == 0, "record %zu: verify exit %d: %s%s", i, r.code,
                  r.out, r.err);
        kres_free(&r);
    }
}

Test(kvdump, damaged_files_never_crash)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F16, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    PT_OK(pkv_checkpoint(c));
    PT_OK(pkv_seq_close(c, 1));
    uint32_t q[12] = {7, 7, 7, 7, 8, 8, 8, 8, 9, 9, 9, 9};
    seq_full(c, 9, 5, q, 12);
    PT_OK(pkv_checkpoint(c)); /* a delta on the full checkpoint */
    cr_assert_eq(pt_stats(c).checkpoint_deltas, 1);
    PT_OK(pkv_seq_close(c, 9));
    PT_OK(pkv_sync(c));
    pt_close(c);
    /* Every file, damaged at spread offsets and truncated at several lengths. */
    const char *files[4] = {"arena", NULL, NULL, NULL};
    char segname[64] = "", ckname[64] = "", dname[64] = "";
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strncmp(e->d_name, "wal-", 4) && strlen(e->d_name) == 20)
            snprintf(segname, sizeof segname, "%s", e->d_name);
        if (!strncmp(e->d_name, "ckpt-", 5)) snprintf(ckname, sizeof ckname, "%s", e->d_name);
        if (!strncmp(e->d_name, "delta-", 6)) snprintf(dname, sizeof dname, "%s", e->d_name);
    }
    closedir(d);
    cr_assert(segname[0] && ckname[0] && dname[0]);
    files[1] = segname;
    files[2] = ckname;
    files[3] = dname;
    pt_rng rng = {12345};
    int runs = 0;
    for (int f = 0; f < 4; f++) {
        char src[600];
        snprintf(src, sizeof src, "%s/%s", dir, files[f]);
        struct stat sst;
        cr_assert(stat(src, &sst) == 0);
        uint64_t size = (uint64_t)sst.st_size;
        /* Interesting region: the header / used part of the file. */
        uint64_t span = f == 0 ? 4096 + 8 * 4096 : f == 1 ? 4096 : size;
        if (span > size) span = size;
        for (int t = 0; t < 10; t++) {
            char d2[512], p2[700];
            snprintf(d2, sizeof d2, "%s/dmg-%d-%d", pt_dir, f, t);
            copy_dir(dir, d2);
            snprintf(p2, sizeof p2, "%s/%s", d2, files[f]);
            if (t < 7) {
                for (int k = 0; k < 1 + t; k++) flip(p2, pt_below(&rng, (uint32_t)span));
            } else {
                uint64_t cut = t == 7 ? 3 : t == 8 ? span / 2 : span - 1;
                cr_assert(truncate(p2, (off_t)cut) == 0);
            }
            const char *cmds[] = {"summary", "blocks", "seqs", "prefixes", "wal", "verify"};
            for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
                kres r = KD(cmds[k], d2);
                cr_assert(r.code >= 0 && r.code <= 2, "%s %s: exit %d", cmds[k], p2, r.code);
                if (r.code == 2) cr_assert(strstr(r.err, "error"), "%s: %s", cmds[k], r.err);
                kres_free(&r);
                runs++;
            }
            /* verify reports damage to the arena header, checkpoint or delta as
             * problems. */
            if (f != 1 && t < 7) {
                kres r = KD("verify", d2);
                cr_assert(r.code != 0 || f == 0, "verify passed a damaged %s: %s", files[f], r.out);
                kres_free(&r);
            }
            pt_rmrf(d2);
        }
    }
    cr_assert(runs > 100);
}

/* The top-level usage names --version, and does not claim that every command
 * leaves the directory alone (import writes to it). */
Test(kvdump, help_names_version_and_that_import_writes)
{
    kres r = KD("--help");
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "--version"), "kvdump --help does not name --version:\n%s", r.out);
    cr_assert(strstr(r.out, "import writes"), "kvdump --help does not say import writes:\n%s",
              r.out);
    kres_free(&r);
    r = KD("--version");
    KD_EXPECT(r, 0);
    cr_assert(!strncmp(r.out, "kvdump (pagedkv ", 16), "%s", r.out);
    kres_free(&r);
}

/* ---- Live writer --------------------------------------------------------------------- */

Test(kvdump, reads_beside_a_live_writer_without_the_lock)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    pkv_stats st = pt_stats(c);
    /* The writer holds LOCK. kvdump reads anyway and changes nothing. */
    uint64_t before = dir_print(dir);
    jv *v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "recovery.last_lsn"), st.last_lsn);
    cr_assert_eq(ju(v, "sequences.count"), 3);
    jfree(v);
    v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"));
    jfree(v);
    kres r = KD("wal", dir);
    KD_EXPECT(r, 0);
    kres_free(&r);
    cr_assert_eq(dir_print(dir), before);
    /* The writer still owns the directory: another writable open is refused. */
    pkv_options o;
    opts(&o, PKV_F32, PKV_DURABLE_ALWAYS);
    pkv_cache *c2 = NULL;
    PT_ERR(pkv_open(dir, &o, &c2), PKV_EBUSY);
    /* And keeps working. */
    uint32_t q[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    seq_full(c, 50, 0, q, 9);
    v = KDJ(0, "seq", dir, "50");
    cr_assert_eq(ju(v, "committed"), 9);
    jfree(v);
    /* import needs the lock: refused with exit 3, nothing changed. */
    char bundle[512];
    pt_path(bundle, sizeof bundle, "b.pkvb");
    r = KD("export", dir, "--seq", "50", "-o", bundle);
    KD_EXPECT(r, 0);
    kres_free(&r);
    r = KD("import", dir, bundle);
    KD_EXPECT(r, 3);
    cr_assert(strstr(r.err, "lock"), "%s", r.err);
    kres_free(&r);
    pt_close(c);
}

Test(kvdump, consistent_snapshots_while_a_writer_runs)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* The writer: open, append, commit, close, checkpoint, for about 2 s. */
        pkv_options o;
        opts(&o, PKV_F32, PKV_DURABLE_GROUP);
        o.group_commit_us = 500;
        pkv_cache *w = NULL;
        if (pkv_open(dir, &o, &w)) _exit(10);
        pkv_cache_info inf;
        pkv_info(w, &inf);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        uint64_t id = 1000;
        pt_rng rng = {7};
        for (int it = 0;; it++) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > 2000) break;
            uint32_t q[24];
            uint32_t fam = pt_below(&rng, 3);
            for (int i = 0; i < 24; i++) q[i] = i < 12 ? fam * 100 + (uint32_t)i : pt_below(&rng, 50);
            size_t nc = 0;
            if (pkv_seq_open(w, id, 0, q, 24, &nc)) _exit(11);
            pkv_slot sl[24];
            if (pkv_seq_append(w, id, q + nc, 24 - nc, sl) == 0) {
                uint64_t h = pt_hprefix(0, q, nc);
                for (size_t i = nc; i < 24; i++) {
                    h = pt_hstep(h, q[i]);
                    for (uint32_t l = 0; l < inf.num_layers; l++)
                        for (uint32_t k = 0; k < 2; k++)
                            for (uint32_t hd = 0; hd < inf.num_kv_heads; hd++) {
                                float *run = pkv_kv(w, sl[i - nc].block, l, (pkv_kind)k, hd);
                                for (uint32_t dd = 0; dd < inf.head_dim; dd++)
                                    run[sl[i - nc].offset * inf.head_dim + dd] = (float)pt_val(h, l, k, hd, dd);
                            }
                }
                pkv_seq_commit(w, id, 24 - nc);
            }
            if (it % 2) pkv_seq_close(w, id);
            if (id >= 1003) pkv_seq_close(w, id - 3); /* keep a few open */
            if (it % 25 == 24) pkv_checkpoint(w);
            id++;
        }
        pkv_close(w);
        _exit(0);
    }
    /* Meanwhile: every read sees a consistent state. */
    int runs = 0;
    for (;;) {
        int st;
        pid_t done = waitpid(pid, &st, WNOHANG);
        const char *cmds[] = {"summary", "verify", "wal", "prefixes", "seqs"};
        for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
            kres r = KD(cmds[k], dir);
            cr_assert_eq(r.code, 0, "%s beside a writer: exit %d\n%s\n%s", cmds[k], r.code, r.out,
                         r.err);
            kres_free(&r);
            runs++;
        }
        if (done == pid) {
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer failed: %d", st);
            break;
        }
    }
    cr_assert(runs >= 5);
    jv *v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"));
    jfree(v);
}

/* A writer in a forked child that appends, commits and closes short sequences
 * until it is killed; every commit is a log frame of its own (durability
 * always), so the log's end moves all the time. Returns the child's pid. */
static pid_t start_appender(const char *dir)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid) return pid;
    pkv_options o;
    opts(&o, PKV_F32, PKV_DURABLE_ALWAYS);
    pkv_cache *w = NULL;
    if (pkv_open(dir, &o, &w)) _exit(10);
    pt_rng rng = {11};
    for (uint64_t id = 5000;; id++) {
        uint32_t q[10];
        for (int i = 0; i < 10; i++) q[i] = pt_below(&rng, 1u << 20);
        size_t nc = 0;
        pkv_slot sl[10];
        if (pkv_seq_open(w, id, 0, q, 10, &nc) || pkv_seq_append(w, id, q + nc, 10 - nc, sl) ||
            pkv_seq_commit(w, id, 10 - nc) || pkv_seq_close(w, id))
            _exit(11);
    }
}

/* kvdump reads a live writer's log: the frame the writer is writing when the
 * scan reaches the log's end is being written, not torn or cut, and neither
 * summary nor verify may call it damage. */
Test(kvdump, a_live_writers_frame_in_flight_is_not_reported_as_damage)
{
    char dir[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_ALWAYS, dir, sizeof dir);
    pt_close(c);
    pid_t pid = start_appender(dir);
    int bad = 0;
    char first[1024] = "";
    for (int run = 0; run < 30; run++) {
        jv *v = KDJ(0, "summary", dir);
        const char *end = js(v, "log.end_reason"), *detail = js(v, "log.end_detail");
        if (strcmp(end, "clean") && strcmp(end, "in_progress") && strcmp(end, "end_of_segment")) {
            if (!bad++) snprintf(first, sizeof first, "summary run %d: %s: %s", run, end, detail);
        }
        if (ju(v, "log.torn_bytes") && !bad++)
            snprintf(first, sizeof first, "summary run %d: recovery cuts a torn tail of %llu bytes",
                     run, (unsigned long long)ju(v, "log.torn_bytes"));
        jfree(v);
        v = KDJ(0, "verify", dir);
        for (size_t i = 0; i < jcount(v, "notes"); i++) {
            char k[64];
            snprintf(k, sizeof k, "notes.%zu.kind", i);
            if (!strcmp(js(v, k), "torn_tail")) {
                snprintf(k, sizeof k, "notes.%zu.message", i);
                if (!bad++) snprintf(first, sizeof first, "verify run %d: %s", run, js(v, k));
            }
        }
        if (!jb(v, "ok") && !bad++) snprintf(first, sizeof first, "verify run %d: not ok", run);
        jfree(v);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the writer stopped early: status %d", st);
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert_eq(bad, 0, "%d of 60 runs beside a live writer reported damage; the first: %s", bad,
                 first);
}

/* ---- export / import ----------------------------------------------------------------- */

/* K/V bytes of every hit position of `prompt` in cache `dir`: open it, seq_open,
 * check n_cached == want, and compare each position's K/V with pt_val(). */
static void check_hits_kv(const char *dir, pkv_dtype dt, uint64_t salt, uint64_t kv_salt,
                          const uint32_t *prompt, size_t n, size_t want)
{
    pkv_options o;
    opts(&o, dt, PKV_DURABLE_GROUP);
    o.capacity = 0;
    pkv_cache *c = NULL;
    PT_OK(pkv_open(dir, &o, &c));
    pkv_cache_info inf = pt_info(c);
    size_t nc = 0;
    PT_OK(pkv_seq_open(c, 777, salt, prompt, n, &nc));
    cr_assert_eq(nc, want, "prompt hits %zu tokens in %s, expected %zu", nc, dir, want);
    uint32_t tab[64];
    size_t nb = 0;
    PT_OK(pkv_seq_blocks(c, 777, tab, 64, &nb));
    uint64_t h = pt_hprefix(kv_salt, prompt, 0);
    for (size_t p = 0; p < nc; p++) {
        h = pt_hstep(h, prompt[p]);
        char err[256];
        cr_assert(pt_token_ok(c, &inf, tab[p / BS], (uint32_t)(p % BS), h, err, sizeof err),
                  "%s: position %zu: %s", dir, p, err);
    }
    PT_CHECK(c);
    PT_OK(pkv_seq_close(c, 777));
    pkv_close(c);
}

static void check_hits(const char *dir, pkv_dtype dt, uint64_t salt, const uint32_t *prompt,
                       size_t n, size_t want)
{
    check_hits_kv(dir, dt, salt, salt, prompt, n, want);
}

static void round_trip(pkv_dtype dt, const char *shuffle)
{
    char dir[512], b1[512], b2[512], fresh[512], pfile[512];
    pkv_cache *c = build_ref("cache", dt, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    pt_path(b1, sizeof b1, "seq2.pkvb");
    pt_path(b2, sizeof b2, "prompt.pkvb");
    pt_path(fresh, sizeof fresh, "fresh");
    pt_path(pfile, sizeof pfile, "prompt.txt");
    /* seq 2 holds P[0..25): 6 full blocks. */
    jv *v = KDJ(0, "export", dir, "--seq", "2", "-o", b1, "--shuffle", shuffle);
    cr_assert_eq(ju(v, "blocks"), 6);
    cr_assert_eq(ju(v, "tokens"), 24);
    uint64_t src_bundle = ju(v, "bundle_bytes");
    jfree(v);
    struct stat sb;
    cr_assert(stat(b1, &sb) == 0 && (uint64_t)sb.st_size == src_bundle);

    /* Import into a directory that does not exist yet. */
    v = KDJ(0, "import", fresh, b1);
    cr_assert(jb(v, "created"));
    cr_assert_eq(ju(v, "imported"), 6);
    cr_assert_eq(ju(v, "present"), 0);
    cr_assert_eq(ju(v, "hit_blocks"), 6);
    jfree(v);
    /* The same prompt hits with identical K/V: P[0..25) hits 24 tokens. */
    check_hits(fresh, dt, 0, P, 25, 24);
    check_hits(dir, dt, 0, P, 25, 24);
    v = KDJ(0, "verify", fresh);
    cr_assert(jb(v, "ok"));
    jfree(v);

    /* Importing again skips everything. */
    v = KDJ(0, "import", fresh, b1);
    cr_assert_eq(ju(v, "present"), 6);
    cr_assert_eq(ju(v, "imported"), 0);
    jfree(v);

    /* --prompt: P[0..20) then 1001 ... (the closed/truncated branch, cached). */
    FILE *f = fopen(pfile, "w");
    cr_assert_not_null(f);
    fprintf(f, "[");
    uint32_t q[28];
    memcpy(q, P, sizeof q);
    q[20] = 1001;
    for (int i = 0; i < 28; i++) fprintf(f, "%s%u", i ? ", " : "", q[i]);
    fprintf(f, "]\n");
    fclose(f);
    v = KDJ(0, "export", dir, "--prompt", pfile, "-o", b2);
    cr_assert_eq(ju(v, "blocks"), 7);
    jfree(v);
    v = KDJ(0, "import", fresh, b2);
    cr_assert_eq(ju(v, "present"), 5); /* P[0..20) came with the first bundle */
    cr_assert_eq(ju(v, "imported"), 2);
    jfree(v);
    /* Blocks for q were written by seq 3 with its own prefix hashes. */
    check_hits(fresh, dt, 0, q, 28, 24);
    check_hits(fresh, dt, 0, P, 25, 24);
}

Test(kvdump, export_import_round_trip_f32) { round_trip(PKV_F32, "auto"); }
Test(kvdump, export_import_round_trip_f16_shuffled) { round_trip(PKV_F16, "on"); }
Test(kvdump, export_import_round_trip_bf16_plain) { round_trip(PKV_BF16, "off"); }

Test(kvdump, import_checks_geometry_model_and_salt)
{
    char dir[512], bundle[512], other[512];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    pt_path(bundle, sizeof bundle, "b.pkvb");
    kres r = KD("export", dir, "--seq", "1", "-o", bundle);
    KD_EXPECT(r, 0);
    kres_free(&r);
    /* Another geometry (f16). */
    pkv_options o;
    opts(&o, PKV_F16, PKV_DURABLE_GROUP);
    pt_path(other, sizeof other, "f16");
    pkv_cache *x = pt_open_sub("f16", &o);
    pt_close(x);
    uint64_t before = dir_print(other);
    r = KD("import", other, bundle);
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "geometry mismatch"), "%s", r.err);
    kres_free(&r);
    cr_assert_eq(dir_print(other), before);
    /* Another model. */
    opts(&o, PKV_F32, PKV_DURABLE_GROUP);
    o.model_id = "another-model";
    pt_path(other, sizeof other, "model");
    x = pt_open_sub("model", &o);
    pt_close(x);
    r = KD("import", other, bundle);
    KD_EXPECT(r, 2);
    cr_assert(strstr(r.err, "model mismatch"), "%s", r.err);
    kres_free(&r);
    /* Under another salt the prefix lands in another trust domain. */
    char fresh[512];
    pt_path(fresh, sizeof fresh, "salted");
    jv *v = KDJ(0, "import", fresh, bundle, "--salt", "9", "--keep-seq", "5");
    cr_assert_eq(ju(v, "salt"), 9);
    cr_assert_eq(ju(v, "seq"), 5);
    jfree(v);
    check_hits_kv(fresh, PKV_F32, 9, 0, P, 22, 20); /* the K/V computed under salt 0 */
    check_hits(fresh, PKV_F32, 0, P, 22, 0);
    v = KDJ(0, "seq", fresh, "5");
    cr_assert_eq(ju(v, "committed"), 20);
    cr_assert_eq(ju(v, "salt"), 9);
    jfree(v);
    /* A cache too small for the bundle: partial import, exit 3. */
    char small[512];
    pkv_options so;
    pt_opts(&so, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 2);
    pt_path(small, sizeof small, "small");
    x = pt_open_sub("small", &so);
    pt_close(x);
    r = KD("import", small, bundle);
    KD_EXPECT(r, 3);
    kres_free(&r);
    v = KDJ(0, "verify", small);
    cr_assert(jb(v, "ok"));
    jfree(v);
    /* Nothing to export. */
    r = KD("export", dir, "--seq", "12345", "-o", bundle);
    KD_EXPECT(r, 3);
    kres_free(&r);
    char pf[512];
    pt_path(pf, sizeof pf, "p.txt");
    wr_file(pf, "5 6 7 8 9", 9);
    r = KD("export", dir, "--prompt", pf, "-o", bundle);
    KD_EXPECT(r, 3);
    kres_free(&r);
    wr_file(pf, "5 six", 5);
    r = KD("export", dir, "--prompt", pf, "-o", bundle);
    KD_EXPECT(r, 2);
    kres_free(&r);
}

Test(kvdump, hostile_bundles_are_rejected)
{
    char dir[512], bundle[512];
    pkv_cache *c = build_ref("cache", PKV_F16, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    pt_path(bundle, sizeof bundle, "b.pkvb");
    kres r = KD("export", dir, "--seq", "2", "-o", bundle);
    KD_EXPECT(r, 0);
    kres_free(&r);
    size_t len;
    uint8_t *orig = rd_file(bundle, &len);
    char bad[512], target[512];
    pt_path(bad, sizeof bad, "bad.pkvb");
    pt_path(target, sizeof target, "target");
    pt_rng rng = {99};
    /* Truncations at every length class, byte flips everywhere, a length field set
     * to huge values. The import must refuse each with exit 2 and create nothing. */
    for (int t = 0; t < 60; t++) {
        uint8_t *b = malloc(len);
        memcpy(b, orig, len);
        size_t blen = len;
        if (t < 20) {
            blen = t < 10 ? (size_t)t * 57 % len : len - 1 - pt_below(&rng, (uint32_t)(len / 2));
        } else if (t < 50) {
            size_t at = t < 30 ? pt_below(&rng, 512) : pt_below(&rng, (uint32_t)len);
            b[at] ^= (uint8_t)(1u << (t % 8));
        } else {
            /* Forge: huge block count / stored length with a fixed-up header checksum. */
            uint64_t huge = t % 2 ? 0xFFFFFFFFull : 0x7FFFFFFFFFFFull;
            if (t < 55) {
                uint32_t nb = (uint32_t)huge;
                memcpy(b + 56, &nb, 4);
            } else {
                memcpy(b + 512 + 6 * BS * 4 + 8, &huge, 8); /* first entry's stored bytes */
            }
            uint64_t hs = XXH3_64bits(b, 504);
            memcpy(b + 504, &hs, 8);
        }
        wr_file(bad, b, blen);
        free(b);
        r = KD("import", target, bad);
        cr_assert_eq(r.code, 2, "case %d: exit %d\n%s%s", t, r.code, r.out, r.err);
        cr_assert(strstr(r.err, "error"));
        kres_free(&r);
        struct stat st;
        cr_assert(stat(target, &st) != 0, "case %d: the import created the target", t);
    }
    free(orig);
    r = KD("import", target, dir); /* a directory is not a bundle */
    KD_EXPECT(r, 2);
    kres_free(&r);
}

/* Payload statistics of f16 values with NaN and Inf, through block --payload. */
Test(kvdump, payload_statistics_f16)
{
    pkv_options o;
    opts(&o, PKV_F16, PKV_DURABLE_GROUP);
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pkv_cache *c = pt_open_sub("cache", &o);
    pkv_cache_info inf = pt_info(c);
    uint32_t t[5] = {1, 2, 3, 4, 5};
    PT_SEQ_OPEN(c, 1, 0, t, 5);
    pkv_slot sl[5];
    PT_OK(pkv_seq_append(c, 1, t, 5, sl));
    /* Every element 1.0 (0x3C00), except layer 1 K: one NaN, one -Inf, one -2.0. */
    for (int i = 0; i < 5; i++)
        for (uint32_t l = 0; l < inf.num_layers; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t h = 0; h < inf.num_kv_heads; h++) {
                    uint16_t *run = pkv_kv(c, sl[i].block, l, (pkv_kind)k, h);
                    for (uint32_t d = 0; d < inf.head_dim; d++) run[sl[i].offset * inf.head_dim + d] = 0x3C00;
                    if (i == 0 && l == 1 && k == 0 && h == 0) {
                        run[0] = 0x7E00; /* NaN */
                        run[1] = 0xFC00; /* -Inf */
                        run[2] = 0xC000; /* -2.0 */
                    }
                }
    PT_OK(pkv_seq_commit(c, 1, 5));
    uint32_t tab[4];
    PT_BLOCKS(c, 1, tab, 4);
    PT_OK(pkv_sync(c));
    char id[16];
    snprintf(id, sizeof id, "%u", tab[0]);
    jv *v = KDJ(0, "block", dir, id, "--payload");
    cr_assert_eq(ju(v, "payload.tokens"), BS);
    jv *x = jget(v, "payload.layers.0.k.min");
    cr_assert(x && x->num == 1.0);
    cr_assert_eq(ju(v, "payload.layers.1.k.nan"), 1);
    cr_assert_eq(ju(v, "payload.layers.1.k.inf"), 1);
    x = jget(v, "payload.layers.1.k.min");
    cr_assert(x && x->num == -2.0, "min %g", x ? x->num : 0);
    x = jget(v, "payload.layers.1.k.mean");
    double n = (double)BS * PT_HEADS * PT_HDIM - 2; /* finite values */
    cr_assert(x && fabs(x->num - ((n - 1) * 1.0 - 2.0) / n) < 1e-6, "mean %g", x ? x->num : 0);
    cr_assert_eq(ju(v, "payload.layers.1.v.nan"), 0);
    jfree(v);
}

/* A forged arena header (valid checksum) that claims an absurd capacity or an
 * inconsistent geometry: refused with a message, never an allocation storm. */
Test(kvdump, forged_arena_header)
{
    char dir[512], arena[600];
    pkv_cache *c = build_ref("cache", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    snprintf(arena, sizeof arena, "%s/arena", dir);
    size_t len;
    uint8_t *orig = rd_file(arena, &len);
    for (int t = 0; t < 4; t++) {
        uint8_t h[4096];
        memcpy(h, orig, sizeof h);
        if (t == 0) {
            uint64_t cap = 1ull << 31;
            memcpy(h + 40, &cap, 8);
        } else if (t == 1) {
            uint32_t bs = 1024;
            memcpy(h + 28, &bs, 4); /* block_bytes no longer matches */
        } else if (t == 2) {
            uint32_t ml = 300;
            memcpy(h + 88, &ml, 4);
        } else {
            uint32_t v = 3;
            memcpy(h + 8, &v, 4); /* another format version */
        }
        uint64_t sum = XXH3_64bits(h, 4088);
        memcpy(h + 4088, &sum, 8);
        patch(arena, 0, h, sizeof h);
        const char *cmds[] = {"summary", "verify", "wal", "blocks"};
        for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
            kres r = KD(cmds[k], dir);
            /* verify: damage found; wal needs no per-block metadata. */
            int want = t < 3 && !strcmp(cmds[k], "verify") ? 1
                       : t == 0 && !strcmp(cmds[k], "wal") ? 0 : 2;
            cr_assert_eq(r.code, want, "case %d %s: exit %d\n%s%s", t, cmds[k], r.code, r.out, r.err);
            cr_assert(r.code != 2 || strstr(r.err, "error"), "case %d %s: %s", t, cmds[k], r.err);
            kres_free(&r);
        }
    }
    free(orig);
}

Test(kvdump, summary_reports_arena_place_and_gpu_attach)
{
    /* The arena in another directory (pkv_options.arena_dir): kvdump follows the
     * link, says where the file is and on what file system, and reports the mode
     * the CUDA layer last obtained from cuda.status (written by src/cuda/cuda.c;
     * faked here in its documented format since CI has no GPU). */
    for (int i = 0; i < 64; i++) P[i] = 100u + (uint32_t)i;
    char dir[512], adir[512], target[1024];
    pt_path(adir, sizeof adir, "arenas");
    pkv_options o;
    opts(&o, PKV_F32, PKV_DURABLE_GROUP);
    o.arena_dir = adir;
    pt_path(dir, sizeof dir, "linked");
    pkv_cache *c = pt_open_sub("linked", &o);
    seq_full(c, 1, 0, P, 22);
    cr_assert_eq(pt_stats(c).cuda_handles, 0);
    cr_assert_eq(pt_stats(c).cuda_mode, 0);
    pt_close(c);
    char link[600];
    snprintf(link, sizeof link, "%s/arena", dir);
    ssize_t n = readlink(link, target, sizeof target - 1);
    cr_assert(n > 0);
    target[n] = '\0';

    jv *v = KDJ(0, "summary", dir);
    cr_assert(jb(v, "arena.linked"));
    cr_assert_str_eq(js(v, "arena.path"), target);
    cr_assert(strlen(js(v, "arena.filesystem")) > 0);
    cr_assert(!jb(v, "cuda.attached_ever"));
    cr_assert_eq(ju(v, "sequences.count"), 1);
    jfree(v);
    kres t = KD("summary", dir);
    KD_EXPECT(t, 0);
    cr_assert(strstr(t.out, target) && strstr(t.out, "links to it") && strstr(t.out, "never attached"),
              "%s", t.out);
    kres_free(&t);

    char st[600];
    snprintf(st, sizeof st, "%s/cuda.status", dir);
    const char *txt = "mode registered-ro\ndevice 0 NVIDIA H200 (sm_90)\npid 4242\ntime 1796000000\n"
                      "note read-write registration: refused\n";
    wr_file(st, txt, strlen(txt));
    v = KDJ(0, "summary", dir);
    cr_assert(jb(v, "cuda.attached_ever"));
    cr_assert_str_eq(js(v, "cuda.mode"), "registered-ro");
    cr_assert_str_eq(js(v, "cuda.device"), "0 NVIDIA H200 (sm_90)");
    cr_assert_str_eq(js(v, "cuda.note"), "read-write registration: refused");
    cr_assert_eq(ju(v, "cuda.pid"), 4242);
    jfree(v);
    t = KD("summary", dir);
    KD_EXPECT(t, 0);
    cr_assert(strstr(t.out, "mode registered-ro") && strstr(t.out, "pid 4242"), "%s", t.out);
    kres_free(&t);
    /* The other commands read the linked arena too; verify finds it clean. */
    v = KDJ(0, "verify", dir);
    jfree(v);
    t = KD("seq", dir, "1");
    KD_EXPECT(t, 0);
    kres_free(&t);
}

/* A spare segment outside the run wal-spare-0..n-1 (a recycling that failed) is
 * reported: counted in the summary, a stray_file note in verify; kvdump deletes
 * nothing (the next writable open does, test_wal.c). */
Test(kvdump, a_stray_spare_is_reported)
{
    char dir[512], stray[600];
    pkv_cache *c = build_ref("spare", PKV_F16, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    jv *v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "log.spares_stray"), 0u);
    jfree(v);
    snprintf(stray, sizeof stray, "%s/wal-spare-%016llx", dir, 3ull);
    FILE *f = fopen(stray, "w");
    cr_assert_not_null(f);
    fclose(f);
    uint64_t before = dir_print(dir);
    v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "log.spares"), 0u);
    cr_assert_eq(ju(v, "log.spares_stray"), 1u);
    jfree(v);
    v = KDJ(0, "verify", dir);
    cr_assert(jb(v, "ok"), "a stray spare is a note, not a problem");
    bool noted = false;
    for (size_t i = 0; i < jcount(v, "notes"); i++) {
        char k[48];
        snprintf(k, sizeof k, "notes.%zu.kind", i);
        const char *kind = js(v, k);
        snprintf(k, sizeof k, "notes.%zu.message", i);
        noted |= !strcmp(kind, "stray_file") && strstr(js(v, k), "wal-spare-0000000000000003");
    }
    cr_assert(noted, "no stray_file note names the stray spare");
    jfree(v);
    kres r = KD("summary", dir);
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "spares      0 to recycle, 1 stray"), "%s", r.out);
    kres_free(&r);
    cr_assert_eq(dir_print(dir), before, "kvdump changed the directory");
}

/* A segment numbered 2^63 or more: recovery refuses the directory (the next
 * segment's number would wrap to 0 and sort before the log it continues), and
 * kvdump, reading through the same listing, says the same instead of reading
 * the log as if the file were not there. */
Test(kvdump, a_segment_number_recovery_refuses_is_refused_too)
{
    char dir[512], big[600];
    pkv_cache *c = build_ref("bigseg", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    pt_close(c);
    snprintf(big, sizeof big, "%s/wal-%016llx", dir, 1ull << 63);
    FILE *f = fopen(big, "w");
    cr_assert_not_null(f);
    fclose(f);
    uint64_t before = dir_print(dir);
    pkv_options o;
    opts(&o, PKV_F32, PKV_DURABLE_GROUP);
    o.flags |= PKV_OPEN_RDONLY;
    pkv_cache *r = NULL;
    PT_ERR(pkv_open(dir, &o, &r), PKV_ECORRUPT);
    cr_assert(strstr(pkv_last_error(), "segment number out of range"), "%s", pkv_last_error());
    kres k = KD("wal", dir);
    KD_EXPECT(k, 2);
    cr_assert(strstr(k.err, "wal-8000000000000000: segment number out of range"), "%s", k.err);
    kres_free(&k);
    jv *v = KDJ(2, "wal", dir);
    cr_assert(strstr(js(v, "error.message"), "segment number out of range"));
    jfree(v);
    v = KDJ(1, "verify", dir);
    cr_assert(!jb(v, "ok"));
    bool found = false;
    for (size_t i = 0; i < jcount(v, "problems"); i++) {
        char key[48];
        snprintf(key, sizeof key, "problems.%zu.kind", i);
        const char *kind = js(v, key);
        snprintf(key, sizeof key, "problems.%zu.message", i);
        found |= !strcmp(kind, "log_unreadable") &&
                 strstr(js(v, key), "segment number out of range") != NULL;
    }
    cr_assert(found, "verify does not report the segment recovery refuses");
    jfree(v);
    cr_assert_eq(dir_print(dir), before, "kvdump changed the directory");
    /* One below 2^63 is a segment like any other (its header is invalid). */
    unlink(big);
    snprintf(big, sizeof big, "%s/wal-%016llx", dir, (1ull << 63) - 1);
    f = fopen(big, "w");
    cr_assert_not_null(f);
    fclose(f);
    v = KDJ(0, "wal", dir);
    cr_assert_str_eq(js(v, "end.reason"), "clean");
    jfree(v);
    unlink(big);
}

/* A full checkpoint whose header is intact but whose body is damaged: recovery
 * reads it in full and fails; kvdump, reading it with recovery's reader, calls
 * it unreadable too rather than trusting its header. */
Test(kvdump, a_checkpoint_with_a_damaged_body_is_refused_as_recovery_refuses_it)
{
    char dir[512], ck[600];
    pkv_cache *c = build_ref("ckbody", PKV_F32, PKV_DURABLE_GROUP, dir, sizeof dir);
    PT_OK(pkv_checkpoint(c));
    pkv_stats st = pt_stats(c);
    pt_close(c);
    snprintf(ck, sizeof ck, "%s/ckpt-%016llx", dir, (unsigned long long)st.checkpoint_lsn);
    size_t n;
    free(rd_file(ck, &n));
    cr_assert(n > 64 + 16);
    flip(ck, 64 + (n - 64) / 2);
    pkv_options o;
    opts(&o, PKV_F32, PKV_DURABLE_GROUP);
    o.flags |= PKV_OPEN_RDONLY;
    pkv_cache *r = NULL;
    cr_assert(pkv_open(dir, &o, &r) < 0, "recovery accepted a damaged checkpoint");
    jv *v = KDJ(0, "wal", dir);
    cr_assert(!jb(v, "checkpoint.ok"), "kvdump trusted the checkpoint's header alone");
    cr_assert(!jnull(v, "checkpoint.error"));
    jfree(v);
    v = KDJ(1, "verify", dir);
    bool found = false;
    for (size_t i = 0; i < jcount(v, "problems"); i++) {
        char key[48];
        snprintf(key, sizeof key, "problems.%zu.kind", i);
        found |= !strcmp(js(v, key), "checkpoint");
    }
    cr_assert(found, "verify does not report the damaged checkpoint");
    jfree(v);
}

/* ---- Delta checkpoints ----------------------------------------------------------------- */

/* A chain: the reference cache, a full checkpoint (the first after an open always
 * is), then two delta checkpoints. Delta 1: a new prompt of 3 blocks, closed (3
 * sealed blocks changed, none freed). Delta 2: a prompt long enough to evict
 * cached blocks, one of which becomes its open tail (so some changed blocks are
 * no longer sealed). lsn[0..2]: the three files' LSNs. Then a record after the
 * chain (the log replayed after it). The cache is closed. */
static void build_chain(const char *sub, char *dir, size_t dirlen, uint64_t lsn[3])
{
    pkv_cache *c = build_ref(sub, PKV_F16, PKV_DURABLE_GROUP, dir, dirlen);
    PT_OK(pkv_checkpoint(c));
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.checkpoint_deltas, 0, "the first checkpoint after an open is full");
    lsn[0] = st.checkpoint_lsn;
    uint32_t q[CAP * BS];
    for (uint32_t i = 0; i < 12; i++) q[i] = 5000 + i;
    seq_full(c, 101, 0, q, 12);
    PT_OK(pkv_seq_close(c, 101));
    PT_OK(pkv_checkpoint(c));
    st = pt_stats(c);
    cr_assert_eq(st.checkpoint_deltas, 1);
    lsn[1] = st.checkpoint_lsn;
    uint32_t n = (uint32_t)(st.blocks_free + 2) * BS + 2; /* evicts 3 cached blocks */
    for (uint32_t i = 0; i < n; i++) q[i] = 7000 + i;
    seq_full(c, 102, 0, q, n);
    PT_OK(pkv_checkpoint(c));
    st = pt_stats(c);
    cr_assert_eq(st.checkpoint_deltas, 2);
    cr_assert(st.evictions >= 3, "%llu evictions", (unsigned long long)st.evictions);
    lsn[2] = st.checkpoint_lsn;
    cr_assert(lsn[0] < lsn[1] && lsn[1] < lsn[2]);
    PT_OK(pkv_seq_close(c, 3));
    PT_OK(pkv_sync(c));
    pt_close(c);
}

static void delta_path(const char *dir, uint64_t lsn, char *out, size_t n)
{
    snprintf(out, n, "%s/delta-%016llx", dir, (unsigned long long)lsn);
}

/* The kinds of verify's problems (or notes) joined by spaces, messages after. */
static void vkinds(jv *v, const char *list, char *out, size_t n)
{
    out[0] = '\0';
    for (size_t i = 0; i < jcount(v, list); i++) {
        char k[64];
        snprintf(k, sizeof k, "%s.%zu.kind", list, i);
        strncat(out, js(v, k), n - strlen(out) - 1);
        snprintf(k, sizeof k, "%s.%zu.message", list, i);
        strncat(out, ": ", n - strlen(out) - 1);
        strncat(out, js(v, k), n - strlen(out) - 1);
        strncat(out, "\n", n - strlen(out) - 1);
    }
}

/* Without delta support, kvdump would report the newest delta's LSN as the full
 * checkpoint's (recovery's checkpoint_lsn), have no checkpoint_chain member and
 * mark only the records up to the full checkpoint as covered. */
Test(kvdump, delta_chain_summary_wal_and_verify)
{
    char dir[512];
    uint64_t lsn[3];
    build_chain("chain", dir, sizeof dir, lsn);
    uint64_t before = dir_print(dir);
    jv *v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "checkpoint.lsn"), lsn[0], "the full checkpoint's LSN");
    cr_assert(jb(v, "checkpoint_chain.ok"));
    cr_assert(jnull(v, "checkpoint_chain.error"));
    cr_assert_eq(ju(v, "checkpoint_chain.base_lsn"), lsn[0]);
    cr_assert_eq(ju(v, "checkpoint_chain.newest_lsn"), lsn[2]);
    cr_assert_eq(ju(v, "checkpoint_chain.deltas"), 2);
    cr_assert_eq(ju(v, "checkpoint_chain.stale"), 0);
    cr_assert_eq(jcount(v, "checkpoint_chain.files"), 2);
    uint64_t raw = 0;
    for (int i = 0; i < 2; i++) {
        char k[64];
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.lsn", i);
        cr_assert_eq(ju(v, k), lsn[i + 1]);
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.state", i);
        cr_assert_str_eq(js(v, k), "applied");
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.prev_lsn", i);
        cr_assert_eq(ju(v, k), lsn[i]);
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.file_bytes", i);
        char p[600];
        delta_path(dir, lsn[i + 1], p, sizeof p);
        struct stat sb;
        cr_assert(stat(p, &sb) == 0);
        cr_assert_eq(ju(v, k), (uint64_t)sb.st_size);
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.raw_bytes", i);
        raw += ju(v, k);
        snprintf(k, sizeof k, "checkpoint_chain.files.%d.sequences", i);
        cr_assert_eq(ju(v, k), 3 + (uint64_t)i, "3 sequences, then 4");
    }
    cr_assert_eq(ju(v, "checkpoint_chain.delta_raw_bytes"), raw);
    /* Delta 1: the 3 blocks of the new prompt. Delta 2: its blocks, among them
     * evicted ones; its open tail block was sealed before and no longer is. */
    cr_assert_eq(ju(v, "checkpoint_chain.files.0.sealed_blocks"), 3);
    cr_assert_eq(ju(v, "checkpoint_chain.files.0.freed_blocks"), 0);
    cr_assert(ju(v, "checkpoint_chain.files.1.sealed_blocks") > 40);
    cr_assert(ju(v, "checkpoint_chain.files.1.freed_blocks") >= 1);
    cr_assert_eq(ju(v, "recovery.checkpoint_lsn"), lsn[2]);
    cr_assert_eq(ju(v, "recovery.checkpoint_deltas"), 2);
    cr_assert_eq(ju(v, "recovery.records_replayed"), 1, "only the SEQ_CLOSE after the chain");
    cr_assert_eq(ju(v, "sequences.count"), 3);
    jfree(v);

    kres t = KD("summary", dir);
    KD_EXPECT(t, 0);
    char want[128];
    snprintf(want, sizeof want, "checkpoint  LSN %llu,", (unsigned long long)lsn[0]);
    cr_assert(strstr(t.out, want), "%s", t.out);
    snprintf(want, sizeof want, "delta       LSN %llu,", (unsigned long long)lsn[1]);
    cr_assert(strstr(t.out, want), "%s", t.out);
    cr_assert(strstr(t.out, ": 3 sealed blocks changed, 0 freed, 3 sequences"), "%s", t.out);
    snprintf(want, sizeof want, "delta       LSN %llu,", (unsigned long long)lsn[2]);
    cr_assert(strstr(t.out, want), "%s", t.out);
    snprintf(want, sizeof want, "full checkpoint + 2 deltas (raw");
    cr_assert(strstr(t.out, want), "%s", t.out);
    snprintf(want, sizeof want, "the log is replayed after LSN %llu\n", (unsigned long long)lsn[2]);
    cr_assert(strstr(t.out, want), "%s", t.out);
    cr_assert(!strstr(t.out, "stale"), "%s", t.out);
    kres_free(&t);

    /* wal: the records the chain covers are marked; the one after it is not. */
    v = KDJ(0, "wal", dir);
    cr_assert_eq(ju(v, "checkpoint.lsn"), lsn[0]);
    cr_assert_eq(ju(v, "checkpoint.chain_lsn"), lsn[2]);
    cr_assert_eq(ju(v, "checkpoint.deltas"), 2);
    cr_assert(jb(v, "checkpoint.chain_ok"));
    size_t n = jcount(v, "records");
    cr_assert(n >= 2);
    for (size_t i = 0; i < n; i++) {
        char k[48];
        snprintf(k, sizeof k, "records.%zu.lsn", i);
        uint64_t l = ju(v, k);
        snprintf(k, sizeof k, "records.%zu.in_checkpoint", i);
        cr_assert_eq(jb(v, k), l <= lsn[2], "record LSN %llu", (unsigned long long)l);
    }
    jfree(v);

    v = KDJ(0, "verify", dir);
    char kinds[4096];
    vkinds(v, "problems", kinds, sizeof kinds);
    cr_assert(jb(v, "ok"), "%s", kinds);
    vkinds(v, "notes", kinds, sizeof kinds);
    cr_assert_eq(jcount(v, "notes"), 0, "%s", kinds);
    cr_assert_eq(ju(v, "checked.checkpoint_deltas"), 2);
    jfree(v);
    t = KD("verify", dir);
    KD_EXPECT(t, 0);
    snprintf(want, sizeof want, "  checkpoint  LSN %llu + 2 deltas, the log read after LSN %llu\n",
             (unsigned long long)lsn[0], (unsigned long long)lsn[2]);
    cr_assert(strstr(t.out, want), "%s", t.out);
    kres_free(&t);
    cr_assert_eq(dir_print(dir), before, "kvdump changed the directory");
}

/* verify on dir exits 1 with a problem of this kind whose message holds `what`. */
static void expect_problem(const char *dir, const char *kind, const char *what)
{
    jv *v = KDJ(1, "verify", dir);
    cr_assert(!jb(v, "ok"));
    char kinds[4096];
    vkinds(v, "problems", kinds, sizeof kinds);
    bool found = false;
    for (size_t i = 0; i < jcount(v, "problems"); i++) {
        char k[48];
        snprintf(k, sizeof k, "problems.%zu.kind", i);
        bool same = !strcmp(js(v, k), kind);
        snprintf(k, sizeof k, "problems.%zu.message", i);
        found |= same && strstr(js(v, k), what);
    }
    cr_assert(found, "no %s problem with '%s' in:\n%s", kind, what, kinds);
    jfree(v);
}

/* verify on a chain broken in dir (a copy): exit 1 and a checkpoint_chain problem
 * whose message holds `what`; the reading commands exit 2 (recovery fails). */
static void expect_broken(const char *dir, const char *what)
{
    expect_problem(dir, "checkpoint_chain", what);
    kres r = KD("verify", dir);
    KD_EXPECT(r, 1);
    cr_assert(strstr(r.out, "problem: checkpoint_chain: "), "%s", r.out);
    kres_free(&r);
    r = KD("summary", dir);
    KD_EXPECT(r, 2);
    kres_free(&r);
    jv *v = KDJ(0, "wal", dir);
    cr_assert(!jb(v, "checkpoint.chain_ok"));
    cr_assert(strstr(js(v, "checkpoint.chain_error"), what), "%s", js(v, "checkpoint.chain_error"));
    jfree(v);
}

/* Without delta support, verify would see only the library's recovery failure
 * (kind "recovery"), never a checkpoint_chain problem naming the file. */
Test(kvdump, delta_chain_missing_middle_delta)
{
    char dir[512], d2[512], p[600], want[160];
    uint64_t lsn[3];
    build_chain("chain", dir, sizeof dir, lsn);
    pt_path(d2, sizeof d2, "nomiddle");
    copy_dir(dir, d2);
    delta_path(d2, lsn[1], p, sizeof p);
    cr_assert(unlink(p) == 0);
    snprintf(want, sizeof want, "delta-%016llx: the checkpoint chain is broken: it applies on "
             "the file of LSN %llu, which is not in the directory", (unsigned long long)lsn[2],
             (unsigned long long)lsn[1]);
    expect_broken(d2, want);
    /* The library agrees: the chain cannot be opened. */
    pkv_options o;
    opts(&o, PKV_F16, PKV_DURABLE_GROUP);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *r = NULL;
    PT_ERR(pkv_open(d2, &o, &r), PKV_ECORRUPT);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A well-formed delta file (docs/format.md) that changes nothing: no block, no
 * sequence, applying on (prev_lsn, prev_sum). Its body is one LZ4 block of
 * literals only (valid LZ4, no compressor needed). */
static void forge_delta(const char *path, uint64_t lsn, uint64_t secret, uint64_t prev_lsn,
                        uint64_t prev_sum)
{
    uint8_t raw[120] = {0}; /* 32 head and link, 64 counters, 3 zero counts */
    put32(raw, 1);
    put32(raw + 4, BS);
    put32(raw + 8, CAP);
    put32(raw + 12, 1);
    put64(raw + 16, prev_lsn);
    put64(raw + 24, prev_sum);
    /* 8 counters, sealed count, freed count, sequence count: zero */
    const size_t rl = sizeof raw;
    uint8_t f[64 + 8 + 2 + sizeof raw] = {0};
    uint8_t *body = f + 64;
    put32(body, (uint32_t)rl);
    body[8] = 0xf0; /* 15 + the next byte literals, no match */
    body[9] = (uint8_t)(rl - 15);
    memcpy(body + 10, raw, rl);
    const size_t bl = 8 + 2 + rl;
    put32(body + 4, (uint32_t)(bl - 8));
    memcpy(f, "PKVDELT\0", 8);
    put32(f + 8, 1);
    put64(f + 16, lsn);
    put64(f + 24, secret);
    put64(f + 32, rl);
    put64(f + 40, bl);
    put64(f + 48, XXH3_64bits(body, bl));
    put64(f + 56, XXH3_64bits(f, 56));
    wr_file(path, f, 64 + bl);
}

/* A full checkpoint whose header covers another LSN than its name was renamed by
 * hand: recovery refuses the directory, and verify says why. */
Test(kvdump, a_renamed_full_checkpoint_is_a_problem)
{
    char dir[512], d2[512], p[600], q[600], want[200];
    uint64_t lsn[3];
    build_chain("chain-base", dir, sizeof dir, lsn);
    pt_path(d2, sizeof d2, "renamed-base");
    copy_dir(dir, d2);
    snprintf(p, sizeof p, "%s/ckpt-%016llx", d2, (unsigned long long)lsn[0]);
    snprintf(q, sizeof q, "%s/ckpt-%016llx", d2, (unsigned long long)lsn[0] - 1);
    cr_assert(rename(p, q) == 0);
    snprintf(want, sizeof want, "ckpt-%016llx: covers LSN %llu, not the one its name says",
             (unsigned long long)lsn[0] - 1, (unsigned long long)lsn[0]);
    expect_problem(d2, "checkpoint", want);
    cr_assert(pt_rmrf(d2) == 0);
}

/* Replaced, renamed, damaged and base-less deltas: each breaks the chain. */
Test(kvdump, delta_chain_replaced_renamed_damaged_or_without_base)
{
    char dir[512], d2[512], p[600], q[600], want[200];
    uint64_t lsn[3];
    build_chain("chain", dir, sizeof dir, lsn);
    char base[600];
    snprintf(base, sizeof base, "%s/ckpt-%016llx", dir, (unsigned long long)lsn[0]);
    size_t bl;
    uint8_t *bh = rd_file(base, &bl);
    const uint64_t secret = get64(bh + 24), base_sum = get64(bh + 48);
    free(bh);

    /* Replaced: delta 1 is another delta of the same LSN (and arena) on the same
     * base; delta 2 names the body checksum of the one it was written on. A forged
     * one first stands in for the real one on its own: the chain holds. */
    pt_path(d2, sizeof d2, "replaced");
    copy_dir(dir, d2);
    delta_path(d2, lsn[2], q, sizeof q);
    cr_assert(unlink(q) == 0);
    delta_path(d2, lsn[1], p, sizeof p);
    forge_delta(p, lsn[1], secret, lsn[0], base_sum);
    jv *v = KDJ(0, "verify", d2);
    char kinds[4096];
    vkinds(v, "problems", kinds, sizeof kinds);
    cr_assert(jb(v, "ok"), "a forged but well-linked delta: %s", kinds);
    jfree(v);
    delta_path(dir, lsn[2], p, sizeof p);
    size_t n;
    uint8_t *b = rd_file(p, &n);
    wr_file(q, b, n);
    free(b);
    snprintf(want, sizeof want, "delta-%016llx: the checkpoint chain is broken: it applies on a "
             "file of LSN %llu with body checksum", (unsigned long long)lsn[2],
             (unsigned long long)lsn[1]);
    expect_broken(d2, want);
    cr_assert(pt_rmrf(d2) == 0);

    /* Renamed: the header's LSN differs from the name's. */
    pt_path(d2, sizeof d2, "renamed");
    copy_dir(dir, d2);
    delta_path(d2, lsn[2], p, sizeof p);
    delta_path(d2, lsn[2] + 1, q, sizeof q);
    cr_assert(rename(p, q) == 0);
    snprintf(want, sizeof want, "delta-%016llx: covers LSN %llu, not the one its name says",
             (unsigned long long)lsn[2] + 1, (unsigned long long)lsn[2]);
    expect_broken(d2, want);
    cr_assert(pt_rmrf(d2) == 0);

    /* Damaged: a byte of delta 1's body; delta 2 is then not applied either. */
    pt_path(d2, sizeof d2, "damaged");
    copy_dir(dir, d2);
    delta_path(d2, lsn[1], p, sizeof p);
    flip(p, 64 + 12);
    snprintf(want, sizeof want, "delta-%016llx: unreadable: delta-%016llx: checkpoint body "
             "truncated or checksum mismatch", (unsigned long long)lsn[1],
             (unsigned long long)lsn[1]);
    expect_broken(d2, want);
    v = KDJ(1, "verify", d2);
    vkinds(v, "problems", kinds, sizeof kinds);
    cr_assert(strstr(kinds, "1 later delta cannot be applied either"), "%s", kinds);
    jfree(v);
    cr_assert(pt_rmrf(d2) == 0);

    /* No full checkpoint under the deltas. */
    pt_path(d2, sizeof d2, "nobase");
    copy_dir(dir, d2);
    snprintf(p, sizeof p, "%s/ckpt-%016llx", d2, (unsigned long long)lsn[0]);
    cr_assert(unlink(p) == 0);
    snprintf(want, sizeof want, "delta-%016llx: no full checkpoint (ckpt-*) to apply it on",
             (unsigned long long)lsn[1]);
    expect_broken(d2, want);
}

/* Deltas left from an older chain (a crash between a full checkpoint's rename
 * and its deletion of the deltas) are ignored by recovery: notes, not problems,
 * and counted apart in the summary. Without delta support kvdump would not see
 * them at all (no note, no "stale" member). */
/* A delta that does not read or decode shows no counts (null), not zeros. */
Test(kvdump, an_unreadable_deltas_counts_are_null)
{
    char dir[512], src[600], dst[600];
    uint64_t lsn[3];
    build_chain("nulldelta", dir, sizeof dir, lsn);
    cr_assert(lsn[0] > 1);
    delta_path(dir, lsn[1], src, sizeof src);
    delta_path(dir, lsn[0] - 1, dst, sizeof dst); /* below the base: stale */
    size_t n;
    uint8_t *b = rd_file(src, &n);
    cr_assert(n > 80);
    b[n - 1] ^= 0x5a; /* its body checksum fails */
    wr_file(dst, b, n);
    free(b);
    jv *v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "checkpoint_chain.files.0.lsn"), lsn[0] - 1);
    cr_assert_str_eq(js(v, "checkpoint_chain.files.0.state"), "stale");
    cr_assert(jnull(v, "checkpoint_chain.files.0.sealed_blocks"),
              "an unreadable delta's counts are shown as zeros");
    cr_assert(!jnull(v, "checkpoint_chain.files.1.sealed_blocks"));
    jfree(v);
}

Test(kvdump, stale_deltas_are_notes)
{
    char dir[512], p[600];
    uint64_t lsn[3];
    build_chain("chain", dir, sizeof dir, lsn);
    uint8_t *saved[2];
    size_t len[2];
    for (int i = 0; i < 2; i++) {
        delta_path(dir, lsn[i + 1], p, sizeof p);
        saved[i] = rd_file(p, &len[i]);
    }
    /* A full checkpoint deletes every delta: with PKV_OPEN_FULL_CHECKPOINTS the
     * open writes one at once (a plain open continues the chain). */
    pkv_options o;
    opts(&o, PKV_F16, PKV_DURABLE_GROUP);
    o.flags |= PKV_OPEN_FULL_CHECKPOINTS;
    pkv_cache *c = pt_open_sub("chain", &o);
    PT_OK(pkv_seq_close(c, 2));
    PT_OK(pkv_checkpoint(c));
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.checkpoint_deltas, 0);
    uint64_t base = st.checkpoint_lsn;
    pt_close(c);
    for (int i = 0; i < 2; i++) {
        delta_path(dir, lsn[i + 1], p, sizeof p);
        struct stat sb;
        cr_assert(stat(p, &sb) != 0, "the full checkpoint kept %s", p);
        wr_file(p, saved[i], len[i]); /* as if the crash came before the deletion */
        free(saved[i]);
    }
    jv *v = KDJ(0, "verify", dir);
    char kinds[4096];
    vkinds(v, "problems", kinds, sizeof kinds);
    cr_assert(jb(v, "ok"), "stale deltas are not problems: %s", kinds);
    size_t stale = 0;
    for (size_t i = 0; i < jcount(v, "notes"); i++) {
        char k[48];
        snprintf(k, sizeof k, "notes.%zu.kind", i);
        if (strcmp(js(v, k), "stale_delta")) continue;
        snprintf(k, sizeof k, "notes.%zu.message", i);
        char want[64];
        snprintf(want, sizeof want, "delta-%016llx:", (unsigned long long)lsn[1 + stale]);
        cr_assert(strstr(js(v, k), want), "%s", js(v, k));
        stale++;
    }
    cr_assert_eq(stale, 2);
    jfree(v);
    v = KDJ(0, "summary", dir);
    cr_assert_eq(ju(v, "checkpoint.lsn"), base);
    cr_assert(jb(v, "checkpoint_chain.ok"));
    cr_assert_eq(ju(v, "checkpoint_chain.deltas"), 0);
    cr_assert_eq(ju(v, "checkpoint_chain.stale"), 2);
    cr_assert_eq(ju(v, "checkpoint_chain.newest_lsn"), base);
    cr_assert_str_eq(js(v, "checkpoint_chain.files.0.state"), "stale");
    cr_assert_str_eq(js(v, "checkpoint_chain.files.1.state"), "stale");
    cr_assert_eq(ju(v, "recovery.checkpoint_deltas"), 0);
    jfree(v);
    kres r = KD("summary", dir);
    KD_EXPECT(r, 0);
    char want[160];
    snprintf(want, sizeof want, "stale       2 deltas from an older chain, ignored (LSN <= %llu): "
             "%llu %llu\n", (unsigned long long)base, (unsigned long long)lsn[1],
             (unsigned long long)lsn[2]);
    cr_assert(strstr(r.out, want), "%s", r.out);
    cr_assert(!strstr(r.out, "delta       "), "stale deltas are not listed as the chain's: %s",
              r.out);
    kres_free(&r);
    r = KD("verify", dir);
    KD_EXPECT(r, 0);
    cr_assert(strstr(r.out, "note: stale_delta: "), "%s", r.out);
    cr_assert(strstr(r.out, ", 2 stale deltas\n"), "%s", r.out);
    kres_free(&r);
}

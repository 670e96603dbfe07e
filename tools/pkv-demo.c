/*
 * pkv-demo.c — the main job: a restarted inference process serves the same chat
 * requests faster, with identical output, because its KV cache survived on disk.
 *
 * One command runs a scripted multi-user chat workload twice, each time in a new
 * process (the demo re-executes itself) on the same pagedkv cache directory (by
 * default a new one under $TMPDIR, removed after a successful run):
 *   1. cold: the cache directory is emptied first; the process computes every
 *      prompt token it cannot find in the cache (the shared system prompt once,
 *      then whatever each conversation adds);
 *   2. warm: a new process opens the same directory, recovers the cache and runs
 *      the same requests, which now find almost all of their prompts cached.
 * The model is the reference Llama-style transformer of src/model/ (weights from a
 * seed, byte-level tokens), run the way an inference engine runs one on pagedkv:
 * pkv_seq_open attaches the cached prefix, the rest of the prompt is appended, each
 * layer's K/V is written into the returned slots and committed; decode is batched
 * over every open sequence; one request samples several answers in parallel
 * (pkv_seq_fork). Then it prints per run: requests, prompt tokens computed vs
 * reused, hit rate, time to first token (median, p90) and total time; then the
 * warm/cold TTFT ratio and whether every generated token sequence of the warm run
 * equals the cold run's. See docs/demo.md.
 *
 * Exit status: 0 when both runs succeed and their outputs are identical, 1 on an
 * error or a mismatch, 2 on a bad command line.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "model.h"
#include "pagedkv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Options ------------------------------------------------------------------ */

enum { RUN_BOTH = 0, RUN_COLD = 1, RUN_WARM = 2 };

static struct opts {
    char cache_dir[PATH_MAX - 64];
    const char *preset;
    uint32_t users, turns, samples, answer, sys_tokens, msg_min, msg_max, block_size;
    uint32_t threads;
    uint64_t seed, capacity;
    const char *prompt_file;
    const char *arena_dir;
    pkv_durability durability;
    pkv_dtype kv;
    bool json, quiet;
    bool own_dir; /* cache_dir was created by this run (no --cache-dir) */
    int run;
    int result_fd;
} opt = {
    .preset = "default",
    .users = 4,
    .turns = 3,
    .samples = 3,
    .answer = 32,
    .sys_tokens = 2400,
    .msg_min = 256,
    .msg_max = 768,
    .block_size = 16,
    .threads = 1,
    .seed = 1,
    .durability = PKV_DURABLE_GROUP,
    .kv = PKV_F16,
    .run = RUN_BOTH,
    .result_fd = -1,
};

static const char *prog = "pkv-demo";

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-demo [options]\n"
            "Runs a scripted multi-user chat workload twice on one pagedkv cache directory,\n"
            "cold (emptied first) and then as a warm restart in a new process, and compares\n"
            "time to first token and the generated tokens. See docs/demo.md.\n"
            "\n"
            "  --cache-dir DIR       cache directory (default: a new one under $TMPDIR or /tmp,\n"
            "                        removed after a successful run); the cold run empties it,\n"
            "                        and refuses if it holds non-pagedkv files or another\n"
            "                        process has it open\n"
            "  --arena-dir DIR       keep the arena file in DIR (e.g. /dev/shm), the log in the\n"
            "                        cache directory (pkv_options.arena_dir)\n"
            "  --preset NAME         model: %s (default default)\n"
            "  --users N             conversations (default 4)\n"
            "  --turns N             turns per conversation (default 3)\n"
            "  --samples N           parallel samples of the forked request (default 3; 1: none)\n"
            "  --answer-tokens N     tokens generated per answer at most (default 32)\n"
            "  --system-tokens N     length of the generated system prompt (default 2400)\n"
            "  --prompt-file FILE    use FILE's bytes as the system prompt instead\n"
            "  --message-tokens A-B  user message length range (default 256-768)\n"
            "  --durability MODE     group, none or always (default group)\n"
            "  --kv-dtype TYPE       f16, bf16 or f32 K/V storage (default f16)\n"
            "  --block-size N        tokens per cache block (default 16)\n"
            "  --capacity N          cache blocks (default: sized for the workload)\n"
            "  --threads N           compute threads per process (default 1)\n"
            "  --seed N              model weights and workload text (default 1)\n"
            "  --run cold|warm       run one pass only, in this process\n"
            "  --json                print the summary as JSON on stdout\n"
            "  --quiet               no progress on stderr\n"
            "  --help                this text\n",
            pkvm_preset_names());
}

static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    usage(stderr);
    exit(2);
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static uint64_t parse_num(const char *s, const char *what, uint64_t lo, uint64_t hi) {
    char *end;
    errno = 0;
    if (!s[0] || s[0] == '-' || s[0] == '+') bad_usage("bad %s '%s'", what, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        bad_usage("bad %s '%s' (expected %" PRIu64 "..%" PRIu64 ")", what, s, lo, hi);
    return v;
}

static void parse_args(int argc, char **argv) {
    static const struct option lo[] = {
        {"cache-dir", 1, 0, 'c'},      {"preset", 1, 0, 'p'},        {"users", 1, 0, 'u'},
        {"turns", 1, 0, 't'},          {"samples", 1, 0, 's'},       {"answer-tokens", 1, 0, 'a'},
        {"system-tokens", 1, 0, 'S'},  {"prompt-file", 1, 0, 'f'},   {"message-tokens", 1, 0, 'm'},
        {"durability", 1, 0, 'd'},     {"kv-dtype", 1, 0, 'k'},      {"block-size", 1, 0, 'b'},
        {"capacity", 1, 0, 'C'},       {"threads", 1, 0, 'T'},       {"seed", 1, 0, 'e'},
        {"run", 1, 0, 'r'},            {"json", 0, 0, 'j'},          {"quiet", 0, 0, 'q'},
        {"result-fd", 1, 0, 'R'},      {"help", 0, 0, 'h'},          {"arena-dir", 1, 0, 'A'},
        {0, 0, 0, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case 'c':
            if (!optarg[0] || strlen(optarg) >= sizeof opt.cache_dir)
                bad_usage("bad --cache-dir '%s'", optarg);
            snprintf(opt.cache_dir, sizeof opt.cache_dir, "%s", optarg);
            break;
        case 'p': {
            pkvm_config cfg;
            if (pkvm_preset(optarg, &cfg)) bad_usage("unknown --preset '%s'", optarg);
            opt.preset = optarg;
            break;
        }
        case 'u': opt.users = (uint32_t)parse_num(optarg, "--users", 1, 64); break;
        case 't': opt.turns = (uint32_t)parse_num(optarg, "--turns", 1, 64); break;
        case 's': opt.samples = (uint32_t)parse_num(optarg, "--samples", 1, 16); break;
        case 'a': opt.answer = (uint32_t)parse_num(optarg, "--answer-tokens", 1, 4096); break;
        case 'S': opt.sys_tokens = (uint32_t)parse_num(optarg, "--system-tokens", 2, 1u << 20); break;
        case 'f': opt.prompt_file = optarg; break;
        case 'A':
            if (!optarg[0]) bad_usage("bad --arena-dir ''");
            opt.arena_dir = optarg;
            break;
        case 'm': {
            const char *dash = strchr(optarg, '-');
            char a[32];
            if (!dash || (size_t)(dash - optarg) >= sizeof a)
                bad_usage("bad --message-tokens '%s' (expected A-B)", optarg);
            memcpy(a, optarg, (size_t)(dash - optarg));
            a[dash - optarg] = '\0';
            opt.msg_min = (uint32_t)parse_num(a, "--message-tokens", 1, 1u << 16);
            opt.msg_max = (uint32_t)parse_num(dash + 1, "--message-tokens", 1, 1u << 16);
            if (opt.msg_max < opt.msg_min) bad_usage("bad --message-tokens '%s'", optarg);
            break;
        }
        case 'd':
            if (!strcmp(optarg, "group")) opt.durability = PKV_DURABLE_GROUP;
            else if (!strcmp(optarg, "none")) opt.durability = PKV_DURABLE_NONE;
            else if (!strcmp(optarg, "always")) opt.durability = PKV_DURABLE_ALWAYS;
            else bad_usage("bad --durability '%s' (group, none or always)", optarg);
            break;
        case 'k':
            if (!strcmp(optarg, "f16")) opt.kv = PKV_F16;
            else if (!strcmp(optarg, "bf16")) opt.kv = PKV_BF16;
            else if (!strcmp(optarg, "f32")) opt.kv = PKV_F32;
            else bad_usage("bad --kv-dtype '%s' (f16, bf16 or f32)", optarg);
            break;
        case 'b': opt.block_size = (uint32_t)parse_num(optarg, "--block-size", 1, PKV_BLOCK_SIZE_MAX); break;
        case 'C': opt.capacity = parse_num(optarg, "--capacity", 1, 1u << 31); break;
        case 'T': opt.threads = (uint32_t)parse_num(optarg, "--threads", 1, 64); break;
        case 'e': opt.seed = parse_num(optarg, "--seed", 0, UINT64_MAX); break;
        case 'r':
            if (!strcmp(optarg, "cold")) opt.run = RUN_COLD;
            else if (!strcmp(optarg, "warm")) opt.run = RUN_WARM;
            else bad_usage("bad --run '%s' (cold or warm)", optarg);
            break;
        case 'j': opt.json = true; break;
        case 'q': opt.quiet = true; break;
        case 'R': opt.result_fd = (int)parse_num(optarg, "--result-fd", 3, 1 << 20); break;
        case 'h': usage(stdout); exit(0);
        case ':': bad_usage("option '%s' needs a value", argv[optind - 1]);
        default: bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) bad_usage("unexpected argument '%s'", argv[optind]);
    if (!opt.cache_dir[0] && opt.run == RUN_WARM)
        bad_usage("--run warm needs --cache-dir DIR, the directory of an earlier --run cold");
}

/* ---- Small helpers ----------------------------------------------------------------- */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

#define PKV(call)                                                                          \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) die("%s failed: %s (%s)", #call, pkv_strerror(rc_), pkv_last_error());     \
    } while (0)

#define PKVM(call)                                                                         \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) die("%s failed: %s (%s)", #call, pkv_strerror(rc_), pkvm_last_error());    \
    } while (0)

/* A growable token list. */
typedef struct toks {
    uint32_t *t;
    size_t n, cap;
} toks;

static void tpush(toks *a, uint32_t v) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->t = xrealloc(a->t, a->cap * sizeof *a->t);
    }
    a->t[a->n++] = v;
}

static void tappend(toks *a, const uint32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) tpush(a, v[i]);
}

static void tbytes(toks *a, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) tpush(a, (uint8_t)s[i]);
}

static char *fmt_int(char *buf, uint64_t v) { /* 1234567 -> "1,234,567" */
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), o = 0;
    for (int i = 0; i < n; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i < n - 1) buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

static char *fmt_time(char *buf, double ns) {
    if (ns >= 1e9) snprintf(buf, 32, "%.2f s", ns / 1e9);
    else if (ns >= 1e6) snprintf(buf, 32, "%.1f ms", ns / 1e6);
    else snprintf(buf, 32, "%.0f us", ns / 1e3);
    return buf;
}

/* ---- The workload ------------------------------------------------------------------ */

static uint64_t wl_state;
static uint32_t wl_below(uint32_t n) {
    uint64_t z = (wl_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) % n);
}

static const char *WORDS[] = {
    "the", "cache", "block", "token", "prompt", "answer", "user", "model", "always",
    "never", "please", "reply", "clearly", "with", "short", "sentences", "and", "cite",
    "sources", "when", "asked", "about", "memory", "disk", "restart", "prefix", "page",
    "sequence", "attention", "layer", "head", "value", "key", "fast", "slow", "latency",
    "throughput", "policy", "rule", "must", "should", "may", "not", "explain", "code",
    "examples", "in", "of", "to", "a", "is", "are", "for", "each", "every", "request",
    "system", "assistant", "conversation", "history", "turn", "sample", "fork", "commit"};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* About `len` bytes of sentence-like text (exactly len bytes). */
static void gen_text(toks *out, size_t len) {
    char buf[64];
    size_t done = 0;
    int start = 1;
    while (done < len) {
        const char *w = WORDS[wl_below(N_WORDS)];
        int n = snprintf(buf, sizeof buf, "%s%c%s", start ? "" : " ",
                         start ? (char)(w[0] - 32) : w[0], w + 1);
        start = 0;
        if (wl_below(9) == 0) {
            buf[n++] = '.';
            start = 1;
        }
        for (int i = 0; i < n && done < len; i++, done++) tpush(out, (uint8_t)buf[i]);
    }
}

typedef struct workload {
    toks system;    /* BOS SYSTEM text */
    toks *msg;      /* [turn * users + user]: USER text ASSISTANT */
    uint32_t fork_user, fork_turn;
} workload;

static void build_workload(workload *w) {
    memset(w, 0, sizeof *w);
    wl_state = opt.seed * 0x2545F4914F6CDD1Dull + 17;
    tpush(&w->system, PKVM_BOS);
    tpush(&w->system, PKVM_SYSTEM);
    if (opt.prompt_file) {
        FILE *f = fopen(opt.prompt_file, "rb");
        if (!f) die("cannot open --prompt-file %s: %s", opt.prompt_file, strerror(errno));
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            tbytes(&w->system, buf, n);
            if (w->system.n > (1u << 22)) die("--prompt-file %s is too large", opt.prompt_file);
        }
        if (ferror(f)) die("cannot read --prompt-file %s", opt.prompt_file);
        fclose(f);
        if (w->system.n == 2) die("--prompt-file %s is empty", opt.prompt_file);
    } else {
        static const char intro[] =
            "You are Pagey, the assistant of the pagedkv demo. Follow every rule below in "
            "every conversation. ";
        tbytes(&w->system, intro, sizeof intro - 1);
        if (opt.sys_tokens > w->system.n) gen_text(&w->system, opt.sys_tokens - w->system.n);
    }
    w->msg = calloc((size_t)opt.users * opt.turns, sizeof *w->msg);
    if (!w->msg) die("out of memory");
    for (uint32_t t = 0; t < opt.turns; t++)
        for (uint32_t u = 0; u < opt.users; u++) {
            toks *m = &w->msg[t * opt.users + u];
            char head[64];
            int n = snprintf(head, sizeof head, "User %u, turn %u: ", u + 1, t + 1);
            tpush(m, PKVM_USER);
            tbytes(m, head, (size_t)n);
            gen_text(m, opt.msg_min + wl_below(opt.msg_max - opt.msg_min + 1));
            tpush(m, PKVM_ASSISTANT);
        }
    /* The request with parallel samples: the first user's second turn (or first). */
    w->fork_user = 0;
    w->fork_turn = opt.turns > 1 ? 1 : 0;
}

/* ---- One pass (cold or warm) ----------------------------------------------------- */

typedef struct req_rec {
    uint32_t user, turn, prompt, cached, samples;
    uint64_t ttft_ns;
} req_rec;

typedef struct gen_rec {
    uint32_t user, turn, sample;
    toks tok;
} gen_rec;

typedef struct pass_result {
    char name[8];
    long pid;
    uint64_t total_ns, model_ns, open_ns, decode_ns, decode_tokens;
    uint64_t rec_blocks, rec_seqs, rec_records, leftover;
    double rec_ms;
    uint64_t hit_tokens, miss_tokens, sealed;
    req_rec *req;
    size_t n_req;
    gen_rec *gen;
    size_t n_gen;
} pass_result;

static _Noreturn void die_busy(const char *dir, const char *what) {
    die("the cache directory %s is in use: another process has it open for writing "
        "(PKV_EBUSY: %s). Wait for that process to finish, or run without --cache-dir "
        "(each run then gets a new directory under $TMPDIR), or choose another --cache-dir",
        dir, what);
}

/* Take the flocks a pagedkv writer holds (on the directory itself and on its
 * LOCK file), or stop with PKV_EBUSY's meaning: emptying a directory that a live
 * process has open deletes that process's files under it, and the LOCK created
 * next would be another file, so two writers would share the path. Held while
 * the directory is emptied, so that no writer opens it meanwhile; closed before
 * this process opens it. A file system without flock on directories leaves the
 * LOCK file's lock alone to go by. */
static void lock_or_refuse(const char *dir, int fds[2]) {
    fds[0] = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds[0] >= 0 && flock(fds[0], LOCK_EX | LOCK_NB)) {
        if (errno == EWOULDBLOCK) die_busy(dir, "its directory lock is held");
        close(fds[0]);
        fds[0] = -1;
    }
    char lock[PATH_MAX];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    fds[1] = open(lock, O_RDONLY | O_CLOEXEC); /* never created here */
    if (fds[1] >= 0 && flock(fds[1], LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK)
        die_busy(dir, "its LOCK file is held");
}

/* Empty the cache directory; refuse if it holds anything but pagedkv's files,
 * or if another process has it open. */
static void wipe_cache_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return;
        die("cannot open the cache directory %s: %s", dir, strerror(errno));
    }
    int locks[2];
    lock_or_refuse(dir, locks);
    static const char *exact[] = {"arena", "arena.tmp", "LOCK", "ckpt.tmp", "arena.link.tmp",
                                  "cuda.status", "cuda.status.tmp"};
    static const char *prefix[] = {"wal-", "ckpt-", "delta-"};
    char (*names)[256] = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool ok = false;
        for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) ok |= !strcmp(e->d_name, exact[i]);
        for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
            ok |= !strncmp(e->d_name, prefix[i], strlen(prefix[i]));
        if (!ok || strlen(e->d_name) >= 256) {
            closedir(d);
            die("refusing to empty %s: it holds '%s', which is not a pagedkv file "
                "(choose another --cache-dir)", dir, e->d_name);
        }
        names = xrealloc(names, (n + 1) * sizeof *names);
        snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        /* An arena kept elsewhere (--arena-dir): remove the file the link names. */
        char target[PATH_MAX];
        ssize_t tl = strcmp(names[i], "arena") ? -1 : readlink(path, target, sizeof target - 1);
        if (tl > 0) {
            target[tl] = '\0';
            if (unlink(target) && errno != ENOENT) die("cannot remove %s: %s", target, strerror(errno));
        }
        if (unlink(path) && errno != ENOENT) die("cannot remove %s: %s", path, strerror(errno));
    }
    free(names);
    for (int i = 0; i < 2; i++)
        if (locks[i] >= 0) close(locks[i]); /* releases the flocks */
}

static bool own_dir_done; /* the run succeeded and removed its directory */

/* At exit after a failure (die() included): a directory this run created is
 * removed if it holds no arena yet (at most the LOCK a failed pkv_open leaves),
 * else kept and named, so that a failed run neither leaves litter nor hides
 * what it left. Never dies: it runs inside exit(). */
static void own_dir_at_exit(void) {
    if (!opt.own_dir || own_dir_done) return;
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/arena", opt.cache_dir);
    if (lstat(path, &st) && errno == ENOENT) {
        snprintf(path, sizeof path, "%s/LOCK", opt.cache_dir);
        unlink(path);
        if (rmdir(opt.cache_dir) == 0) return;
    }
    fprintf(stderr, "%s: the cache directory %s is kept for inspection (kvdump summary %s; "
            "rm -r it when done)\n", prog, opt.cache_dir, opt.cache_dir);
}

/* No --cache-dir: a new directory per run, so that two demos never share one. */
static void make_own_dir(void) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0]) tmp = "/tmp";
    if (snprintf(opt.cache_dir, sizeof opt.cache_dir, "%s/pkv-demo-XXXXXX", tmp) >=
        (int)sizeof opt.cache_dir)
        die("TMPDIR %s is too long for a cache directory path (pass --cache-dir)", tmp);
    if (!mkdtemp(opt.cache_dir))
        die("cannot create a cache directory under %s: %s (set TMPDIR or pass --cache-dir)",
            tmp, strerror(errno));
    opt.own_dir = true;
    atexit(own_dir_at_exit);
}

typedef struct progress_ctx {
    const char *name;
    uint32_t user, turn;
    size_t cached, prompt;
} progress_ctx;

static void on_progress(void *arg, size_t done, size_t total) {
    const progress_ctx *p = arg;
    if (opt.quiet || total <= 256 || !isatty(2)) return;
    fprintf(stderr, "\r  [%s] turn %u/%u, user %u/%u: computing prompt %zu/%zu tokens ",
            p->name, p->turn + 1, opt.turns, p->user + 1, opt.users, done, total);
    fflush(stderr);
}

typedef struct active {
    uint64_t id;
    uint32_t next;
    gen_rec *out;
    bool done;
} active;

static uint64_t cache_capacity(const workload *w) {
    if (opt.capacity) return opt.capacity;
    uint64_t tokens = w->system.n;
    for (size_t i = 0; i < (size_t)opt.users * opt.turns; i++) tokens += w->msg[i].n + opt.answer + 2;
    tokens += (uint64_t)opt.samples * opt.turns * (opt.answer + 2) + 64;
    return tokens / opt.block_size * 2 + 64;
}

static void run_pass(int which, const workload *w, pass_result *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", which == RUN_COLD ? "cold" : "warm");
    r->pid = (long)getpid();
    const uint64_t t_start = now_ns();
    if (which == RUN_COLD) wipe_cache_dir(opt.cache_dir);

    pkvm_config cfg;
    PKVM(pkvm_preset(opt.preset, &cfg));
    cfg.seed = opt.seed;
    pkvm_model *m;
    PKVM(pkvm_create(&cfg, &m));
    pkvm_set_threads(m, opt.threads);
    r->model_ns = now_ns() - t_start;

    char model_id[PKV_MODEL_ID_MAX + 1];
    pkvm_model_id(m, opt.kv, model_id, sizeof model_id);
    pkv_options o;
    pkv_options_init(&o);
    pkvm_cache_geometry(m, &o);
    o.block_size = opt.block_size;
    o.dtype = opt.kv;
    o.capacity = which == RUN_COLD ? cache_capacity(w) : 0;
    o.model_id = model_id;
    o.durability = opt.durability;
    o.arena_dir = opt.arena_dir;
    if (which == RUN_WARM) { /* do not create anything: there must be a cache */
        char arena[PATH_MAX];
        struct stat sb;
        snprintf(arena, sizeof arena, "%s/arena", opt.cache_dir);
        if (stat(arena, &sb))
            die("no cache in %s to restart from (run the cold pass first)", opt.cache_dir);
    }
    const uint64_t t_open = now_ns();
    pkv_cache *c;
    int rc = pkv_open(opt.cache_dir, &o, &c);
    if (rc == PKV_EBUSY) die_busy(opt.cache_dir, pkv_last_error());
    if (rc) die("pkv_open(%s): %s (%s)", opt.cache_dir, pkv_strerror(rc), pkv_last_error());
    r->open_ns = now_ns() - t_open;
    pkv_recovery rec;
    PKV(pkv_get_recovery(c, &rec));
    pkv_stats st0;
    PKV(pkv_get_stats(c, &st0));
    r->rec_blocks = rec.blocks_sealed;
    r->rec_seqs = rec.sequences;
    r->rec_records = rec.records_replayed;
    r->rec_ms = rec.ms_checkpoint + rec.ms_replay + rec.ms_rebuild + rec.ms_verify;
    if (!opt.quiet) {
        char a[32], b[32];
        fprintf(stderr, "  [%s] pid %ld: model ready in %s; cache %s opened in %s", r->name,
                r->pid, fmt_time(a, (double)r->model_ns), opt.cache_dir,
                fmt_time(b, (double)r->open_ns));
        if (rec.blocks_sealed || rec.records_replayed || rec.checkpoint_lsn)
            fprintf(stderr, ", recovered %" PRIu64 " cached blocks (%" PRIu64
                            " log records replayed)", rec.blocks_sealed, rec.records_replayed);
        fputc('\n', stderr);
        if (rec.note[0]) fprintf(stderr, "  [%s] recovery: %s\n", r->name, rec.note);
    }
    /* Sequences left open by an interrupted earlier run: an engine would resume or
     * drop them; this workload drops them. */
    {
        size_t n = 0;
        rc = pkv_seq_list(c, NULL, 0, &n);
        if (rc && rc != PKV_ERANGE) die("pkv_seq_list: %s", pkv_strerror(rc));
        if (n) {
            uint64_t *ids = xmalloc(n * sizeof *ids);
            PKV(pkv_seq_list(c, ids, n, &n));
            for (size_t i = 0; i < n; i++) PKV(pkv_seq_close(c, ids[i]));
            free(ids);
            r->leftover = n;
        }
    }

    pkvm_engine *e;
    PKVM(pkvm_engine_create(m, c, &e));
    progress_ctx pc = {.name = r->name};
    pkvm_engine_set_progress(e, on_progress, &pc);

    const uint32_t U = opt.users, V = cfg.vocab;
    toks *hist = calloc(U, sizeof *hist);
    active *act = xmalloc(((size_t)U + opt.samples) * sizeof *act);
    float *logits = xmalloc(((size_t)U + opt.samples) * V * sizeof(float));
    uint64_t *ids = xmalloc(((size_t)U + opt.samples) * sizeof *ids);
    uint32_t *next = xmalloc(((size_t)U + opt.samples) * sizeof *next);
    size_t *map = xmalloc(((size_t)U + opt.samples) * sizeof *map);
    if (!hist) die("out of memory");
    r->req = xmalloc((size_t)U * opt.turns * sizeof *r->req);
    r->gen = calloc((size_t)U * opt.turns + opt.samples, sizeof *r->gen);
    if (!r->gen) die("out of memory");
    toks prompt = {0};

    for (uint32_t t = 0; t < opt.turns; t++) {
        size_t nact = 0;
        for (uint32_t u = 0; u < U; u++) {
            /* The request: the conversation so far plus the new user message. */
            prompt.n = 0;
            if (t == 0) tappend(&hist[u], w->system.t, w->system.n);
            tappend(&prompt, hist[u].t, hist[u].n);
            const toks *msg = &w->msg[t * U + u];
            tappend(&prompt, msg->t, msg->n);
            const bool fork = u == w->fork_user && t == w->fork_turn && opt.samples > 1;
            const uint64_t id = ((uint64_t)(t * U + u) << 8);
            pc.user = u, pc.turn = t, pc.prompt = prompt.n;

            const uint64_t t0 = now_ns();
            size_t cached = 0;
            PKVM(pkvm_prefill(e, id, 0, prompt.t, prompt.n, logits, &cached));
            const uint32_t first = pkvm_argmax(logits, V);
            const uint64_t ttft = now_ns() - t0;

            req_rec *q = &r->req[r->n_req++];
            *q = (req_rec){u, t, (uint32_t)prompt.n, (uint32_t)cached, fork ? opt.samples : 1,
                           ttft};
            if (!opt.quiet) {
                char a[32], b[32], d[32], f[32];
                fprintf(stderr,
                        "%s  [%s] turn %u/%u, user %u/%u: prompt %s tokens, %s reused, %s "
                        "computed; first token after %s%s\n",
                        isatty(2) ? "\r\033[K" : "", r->name, t + 1, opt.turns, u + 1, U,
                        fmt_int(a, prompt.n), fmt_int(b, cached), fmt_int(d, prompt.n - cached),
                        fmt_time(f, (double)ttft), fork ? " (+ parallel samples)" : "");
            }
            const uint32_t ns = fork ? opt.samples : 1;
            for (uint32_t s = 0; s < ns; s++) {
                if (s) PKV(pkv_seq_fork(c, id, id + s));
                gen_rec *g = &r->gen[r->n_gen++];
                g->user = u, g->turn = t, g->sample = s;
                /* Sample s starts from the s-th most likely first token. */
                const uint32_t tok = s ? pkvm_rank(logits, V, s) : first;
                tpush(&g->tok, tok);
                act[nact++] = (active){id + s, tok, g, tok == PKVM_EOS || opt.answer == 1};
            }
            /* The history continues with the prompt (sample 0's answer follows). */
            tappend(&hist[u], msg->t, msg->n);
        }

        /* Batched greedy decode of every sequence of this turn. */
        const uint64_t td = now_ns();
        for (;;) {
            size_t n = 0;
            for (size_t i = 0; i < nact; i++)
                if (!act[i].done) ids[n] = act[i].id, next[n] = act[i].next, map[n++] = i;
            if (!n) break;
            PKVM(pkvm_step(e, ids, next, n, logits));
            r->decode_tokens += n;
            for (size_t k = 0; k < n; k++) {
                active *a = &act[map[k]];
                const uint32_t tok = pkvm_argmax(logits + k * V, V);
                tpush(&a->out->tok, tok);
                a->next = tok;
                if (tok == PKVM_EOS || a->out->tok.n >= opt.answer) a->done = true;
            }
        }
        r->decode_ns += now_ns() - td;
        if (!opt.quiet) {
            char a[32];
            fprintf(stderr, "  [%s] turn %u/%u: decoded %zu answers in one batch in %s\n",
                    r->name, t + 1, opt.turns, nact, fmt_time(a, (double)(now_ns() - td)));
        }
        for (size_t i = 0; i < nact; i++) {
            PKV(pkv_seq_close(c, act[i].id));
            if (act[i].out->sample == 0) {
                toks *h = &hist[act[i].out->user];
                tappend(h, act[i].out->tok.t, act[i].out->tok.n);
                if (act[i].out->tok.t[act[i].out->tok.n - 1] != PKVM_EOS) tpush(h, PKVM_EOS);
            }
        }
    }

    pkv_stats st;
    PKV(pkv_get_stats(c, &st));
    r->hit_tokens = st.hit_tokens - st0.hit_tokens;
    r->miss_tokens = st.miss_tokens - st0.miss_tokens;
    r->sealed = st.blocks_sealed;
    pkvm_engine_free(e);
    pkv_close(c); /* makes everything durable */
    r->total_ns = now_ns() - t_start;
    pkvm_free(m);
    for (uint32_t u = 0; u < U; u++) free(hist[u].t);
    free(hist), free(act), free(logits), free(ids), free(next), free(map), free(prompt.t);
}

/* ---- Results between processes ---------------------------------------------------- */

static void write_result(FILE *f, const pass_result *r) {
    fprintf(f, "pass %s %ld\n", r->name, r->pid);
    fprintf(f, "time %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r->total_ns,
            r->model_ns, r->open_ns, r->decode_ns, r->decode_tokens);
    fprintf(f, "recovery %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.6f\n", r->rec_blocks,
            r->rec_seqs, r->rec_records, r->leftover, r->rec_ms);
    fprintf(f, "stats %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r->hit_tokens, r->miss_tokens,
            r->sealed);
    for (size_t i = 0; i < r->n_req; i++) {
        const req_rec *q = &r->req[i];
        fprintf(f, "req %u %u %u %u %u %" PRIu64 "\n", q->user, q->turn, q->prompt, q->cached,
                q->samples, q->ttft_ns);
    }
    for (size_t i = 0; i < r->n_gen; i++) {
        const gen_rec *g = &r->gen[i];
        fprintf(f, "gen %u %u %u %zu", g->user, g->turn, g->sample, g->tok.n);
        for (size_t k = 0; k < g->tok.n; k++) fprintf(f, " %u", g->tok.t[k]);
        fputc('\n', f);
    }
    fprintf(f, "end\n");
}

static bool read_result(FILE *f, pass_result *r) {
    memset(r, 0, sizeof *r);
    char *line = NULL;
    size_t cap = 0;
    bool end = false;
    size_t req_cap = 0, gen_cap = 0;
    while (getline(&line, &cap, f) > 0) {
        char *p = line;
        if (!strncmp(p, "pass ", 5)) {
            if (sscanf(p + 5, "%7s %ld", r->name, &r->pid) != 2) break;
        } else if (!strncmp(p, "time ", 5)) {
            if (sscanf(p + 5, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                       &r->total_ns, &r->model_ns, &r->open_ns, &r->decode_ns,
                       &r->decode_tokens) != 5)
                break;
        } else if (!strncmp(p, "recovery ", 9)) {
            if (sscanf(p + 9, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %lf",
                       &r->rec_blocks, &r->rec_seqs, &r->rec_records, &r->leftover,
                       &r->rec_ms) != 5)
                break;
        } else if (!strncmp(p, "stats ", 6)) {
            if (sscanf(p + 6, "%" SCNu64 " %" SCNu64 " %" SCNu64, &r->hit_tokens,
                       &r->miss_tokens, &r->sealed) != 3)
                break;
        } else if (!strncmp(p, "req ", 4)) {
            if (r->n_req == req_cap) {
                req_cap = req_cap ? 2 * req_cap : 16;
                r->req = xrealloc(r->req, req_cap * sizeof *r->req);
            }
            req_rec *q = &r->req[r->n_req];
            if (sscanf(p + 4, "%u %u %u %u %u %" SCNu64, &q->user, &q->turn, &q->prompt,
                       &q->cached, &q->samples, &q->ttft_ns) != 6)
                break;
            r->n_req++;
        } else if (!strncmp(p, "gen ", 4)) {
            if (r->n_gen == gen_cap) {
                gen_cap = gen_cap ? 2 * gen_cap : 16;
                r->gen = xrealloc(r->gen, gen_cap * sizeof *r->gen);
            }
            gen_rec *g = &r->gen[r->n_gen];
            memset(g, 0, sizeof *g);
            size_t n;
            int used = 0;
            if (sscanf(p + 4, "%u %u %u %zu%n", &g->user, &g->turn, &g->sample, &n, &used) != 4)
                break;
            p += 4 + used;
            for (size_t k = 0; k < n; k++) {
                char *endp;
                unsigned long v = strtoul(p, &endp, 10);
                if (endp == p) break;
                tpush(&g->tok, (uint32_t)v);
                p = endp;
            }
            if (g->tok.n != n) break;
            r->n_gen++;
        } else if (!strncmp(p, "end", 3)) {
            end = true;
            break;
        } else {
            break;
        }
    }
    free(line);
    return end;
}

static void free_result(pass_result *r) {
    for (size_t i = 0; i < r->n_gen; i++) free(r->gen[i].tok.t);
    free(r->gen);
    free(r->req);
}

/* Run one pass as a new process (this program, re-executed) and read its result. */
static void run_child(int which, char **argv, int argc, pass_result *r) {
    int fds[2];
    if (pipe(fds)) die("pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
        char **av = calloc((size_t)argc + 8, sizeof *av);
        if (!av) _exit(1);
        int k = 0;
        av[k++] = argv[0];
        for (int i = 1; i < argc; i++) av[k++] = argv[i];
        av[k++] = "--cache-dir"; /* the last one given wins: this run's directory */
        av[k++] = opt.cache_dir;
        av[k++] = "--run";
        av[k++] = which == RUN_COLD ? "cold" : "warm";
        av[k++] = "--result-fd";
        av[k++] = fdarg;
        av[k] = NULL;
        execv("/proc/self/exe", av);
        fprintf(stderr, "%s: exec /proc/self/exe: %s\n", prog, strerror(errno));
        _exit(1);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    if (!f) die("fdopen: %s", strerror(errno));
    const bool ok = read_result(f, r);
    fclose(f);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFSIGNALED(status))
            die("the %s run (pid %ld) was killed by signal %d", which == RUN_COLD ? "cold" : "warm",
                (long)pid, WTERMSIG(status));
        die("the %s run (pid %ld) failed with status %d", which == RUN_COLD ? "cold" : "warm",
            (long)pid, WEXITSTATUS(status));
    }
    if (!ok) die("the %s run (pid %ld) sent an unreadable result", which == RUN_COLD ? "cold" : "warm",
                 (long)pid);
}

/* ---- Report ----------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double pct_u64(const uint64_t *v, size_t n, double p) {
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    if (k < 1) k = 1;
    return (double)v[k - 1];
}

typedef struct summary {
    uint64_t computed, reused, prompt;
    double ttft_med, ttft_p90, total, first_ttft;
    size_t n_gen, gen_tokens;
} summary;

static void summarize(const pass_result *r, summary *s) {
    memset(s, 0, sizeof *s);
    uint64_t *t = xmalloc(r->n_req * sizeof *t);
    for (size_t i = 0; i < r->n_req; i++) {
        s->computed += r->req[i].prompt - r->req[i].cached;
        s->reused += r->req[i].cached;
        s->prompt += r->req[i].prompt;
        t[i] = r->req[i].ttft_ns;
    }
    s->first_ttft = r->n_req ? (double)r->req[0].ttft_ns : 0;
    qsort(t, r->n_req, sizeof *t, cmp_u64);
    s->ttft_med = r->n_req ? pct_u64(t, r->n_req, 50) : 0;
    s->ttft_p90 = r->n_req ? pct_u64(t, r->n_req, 90) : 0;
    s->total = (double)r->total_ns;
    s->n_gen = r->n_gen;
    for (size_t i = 0; i < r->n_gen; i++) s->gen_tokens += r->gen[i].tok.n;
    free(t);
}

static void print_pass(FILE *f, const pass_result *r, const summary *s, const char *title) {
    char a[32], b[32], d[32];
    size_t forked = 0;
    for (size_t i = 0; i < r->n_req; i++) forked += r->req[i].samples > 1;
    fprintf(f, "%s (pid %ld)\n", title, r->pid);
    if (!strcmp(r->name, "warm"))
        fprintf(f, "  recovered           %s cached blocks, %s log records replayed, in %.1f ms%s\n",
                fmt_int(a, r->rec_blocks), fmt_int(b, r->rec_records), r->rec_ms,
                r->leftover ? " (open sequences from an earlier run dropped)" : "");
    fprintf(f, "  requests            %zu (%u users x %u turns", r->n_req, opt.users, opt.turns);
    if (forked) fprintf(f, "; %zu with %u parallel samples", forked, opt.samples);
    fprintf(f, ")\n");
    fprintf(f, "  prompt tokens       %s computed, %s reused: hit rate %.1f%%\n",
            fmt_int(a, s->computed), fmt_int(b, s->reused),
            s->prompt ? 100.0 * (double)s->reused / (double)s->prompt : 0.0);
    fprintf(f, "  time to first token median %s, p90 %s (first request: %s)\n",
            fmt_time(a, s->ttft_med), fmt_time(b, s->ttft_p90), fmt_time(d, s->first_ttft));
    fprintf(f, "  decode              %s tokens in %s (%zu answers, batched)\n",
            fmt_int(a, r->decode_tokens), fmt_time(b, (double)r->decode_ns), s->n_gen);
    fprintf(f, "  total time          %s (model weights %s, cache open %s)\n",
            fmt_time(a, s->total), fmt_time(b, (double)r->model_ns),
            fmt_time(d, (double)r->open_ns));
}

/* Do both runs generate the same tokens? Returns the number of mismatching answers. */
static size_t compare_gen(const pass_result *a, const pass_result *b, char *why, size_t cap) {
    size_t bad = 0;
    why[0] = '\0';
    if (a->n_gen != b->n_gen) {
        snprintf(why, cap, "%zu answers vs %zu", a->n_gen, b->n_gen);
        return a->n_gen > b->n_gen ? a->n_gen : b->n_gen;
    }
    for (size_t i = 0; i < a->n_gen; i++) {
        const gen_rec *x = &a->gen[i], *y = &b->gen[i];
        bool same = x->user == y->user && x->turn == y->turn && x->sample == y->sample &&
                    x->tok.n == y->tok.n &&
                    !memcmp(x->tok.t, y->tok.t, x->tok.n * sizeof *x->tok.t);
        if (!same && !bad++)
            snprintf(why, cap, "first difference: user %u, turn %u, sample %u", x->user + 1,
                     x->turn + 1, x->sample);
    }
    return bad;
}

static const char *dur_name(void) {
    return opt.durability == PKV_DURABLE_GROUP ? "group"
           : opt.durability == PKV_DURABLE_NONE ? "none" : "always";
}
static const char *kv_name(void) {
    return opt.kv == PKV_F32 ? "f32" : opt.kv == PKV_F16 ? "f16" : "bf16";
}

static void json_pass(FILE *f, const pass_result *r, const summary *s) {
    fprintf(f,
            "{\"pid\": %ld, \"requests\": %zu, \"prompt_tokens\": %" PRIu64
            ", \"computed_tokens\": %" PRIu64 ", \"reused_tokens\": %" PRIu64
            ", \"hit_rate\": %.4f, \"ttft_median_ms\": %.3f, \"ttft_p90_ms\": %.3f, "
            "\"ttft_first_request_ms\": %.3f, \"decode_tokens\": %" PRIu64
            ", \"decode_ms\": %.3f, \"total_ms\": %.3f, \"model_ms\": %.3f, \"open_ms\": %.3f, "
            "\"recovered_blocks\": %" PRIu64 ", \"recovered_records\": %" PRIu64
            ", \"recovery_ms\": %.3f, \"ttft_ms\": [",
            r->pid, r->n_req, s->prompt, s->computed, s->reused,
            s->prompt ? (double)s->reused / (double)s->prompt : 0.0, s->ttft_med / 1e6,
            s->ttft_p90 / 1e6, s->first_ttft / 1e6, r->decode_tokens, (double)r->decode_ns / 1e6,
            s->total / 1e6, (double)r->model_ns / 1e6, (double)r->open_ns / 1e6, r->rec_blocks,
            r->rec_records, r->rec_ms);
    for (size_t i = 0; i < r->n_req; i++)
        fprintf(f, "%s%.3f", i ? ", " : "", (double)r->req[i].ttft_ns / 1e6);
    fprintf(f, "]}");
}

#define TARGET_RATIO 20.0

/* A JSON string literal. */
static void json_str(FILE *f, const char *v) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static size_t g_sys_tokens; /* length of the system prompt, BOS and SYSTEM included */

static int report(const pass_result *cold, const pass_result *warm) {
    summary sc, sw;
    summarize(cold, &sc);
    summarize(warm, &sw);
    /* Per request: cold TTFT / warm TTFT of the same request. */
    const size_t n = cold->n_req < warm->n_req ? cold->n_req : warm->n_req;
    double *ratio = xmalloc((n ? n : 1) * sizeof *ratio);
    for (size_t i = 0; i < n; i++)
        ratio[i] = (double)cold->req[i].ttft_ns / (double)(warm->req[i].ttft_ns ? warm->req[i].ttft_ns : 1);
    const double first_ratio = n ? ratio[0] : 0;
    qsort(ratio, n, sizeof *ratio, cmp_dbl);
    const double med_ratio = n ? ratio[(n - 1) / 2] : 0, min_ratio = n ? ratio[0] : 0;
    const double ratio_of_medians = sw.ttft_med > 0 ? sc.ttft_med / sw.ttft_med : 0;
    char why[128];
    const size_t bad = compare_gen(cold, warm, why, sizeof why);
    const bool met = ratio_of_medians >= TARGET_RATIO;

    if (opt.json) {
        FILE *f = stdout;
        fprintf(f, "{\n  \"config\": {\"preset\": \"%s\", \"users\": %u, \"turns\": %u, "
                   "\"samples\": %u, \"answer_tokens\": %u, \"system_prompt_tokens\": %zu, "
                   "\"message_tokens\": [%u, %u], \"block_size\": %u, \"kv_dtype\": \"%s\", "
                   "\"durability\": \"%s\", \"threads\": %u, \"seed\": %" PRIu64
                   ", \"cache_dir\": ",
                opt.preset, opt.users, opt.turns, opt.samples, opt.answer, g_sys_tokens,
                opt.msg_min, opt.msg_max, opt.block_size, kv_name(), dur_name(), opt.threads,
                opt.seed);
        json_str(f, opt.cache_dir);
        fprintf(f, "},\n");
        fprintf(f, "  \"cold\": ");
        json_pass(f, cold, &sc);
        fprintf(f, ",\n  \"warm\": ");
        json_pass(f, warm, &sw);
        fprintf(f,
                ",\n  \"ttft_speedup_median\": %.3f, \"ttft_speedup_per_request_median\": %.3f, "
                "\"ttft_speedup_per_request_min\": %.3f, \"ttft_speedup_first_request\": %.3f, "
                "\"target_speedup\": %.1f, \"target_met\": %s,\n  \"answers\": %zu, "
                "\"answers_identical\": %s, \"mismatches\": %zu\n}\n",
                ratio_of_medians, med_ratio, min_ratio, first_ratio, TARGET_RATIO,
                met ? "true" : "false", cold->n_gen, bad ? "false" : "true", bad);
    } else {
        char a[32], b[32];
        printf("\n");
        print_pass(stdout, cold, &sc, "cold run: new process, empty cache");
        printf("\n");
        print_pass(stdout, warm, &sw, "warm run: new process, restarted on the same cache");
        printf("\nwarm vs cold\n");
        printf("  TTFT median         %s vs %s: %.1fx faster (target >= %.0fx: %s)\n",
               fmt_time(a, sw.ttft_med), fmt_time(b, sc.ttft_med), ratio_of_medians,
               TARGET_RATIO, met ? "met" : "NOT met");
        printf("  TTFT per request    median %.1fx, min %.1fx faster\n", med_ratio, min_ratio);
        printf("  first request       %s vs %s: %.1fx faster (its system prompt was computed "
               "cold, restored warm)\n",
               fmt_time(a, sw.first_ttft), fmt_time(b, sc.first_ttft), first_ratio);
        printf("  total time          %s vs %s\n", fmt_time(a, sw.total), fmt_time(b, sc.total));
        if (!bad)
            printf("  generated tokens    identical in both runs: yes (%zu answers, %zu tokens)\n",
                   sc.n_gen, sc.gen_tokens);
        else
            printf("  generated tokens    identical in both runs: NO (%zu of %zu answers differ; "
                   "%s)\n", bad, sc.n_gen, why);
    }
    free(ratio);
    return bad ? 1 : 0;
}

static void free_workload(workload *w) {
    for (size_t i = 0; i < (size_t)opt.users * opt.turns; i++) free(w->msg[i].t);
    free(w->msg);
    free(w->system.t);
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    if (!opt.cache_dir[0]) make_own_dir();
    workload w;
    build_workload(&w);
    g_sys_tokens = w.system.n;

    if (opt.run != RUN_BOTH) { /* one pass, in this process */
        pass_result r;
        run_pass(opt.run, &w, &r);
        if (opt.result_fd >= 0) {
            FILE *f = fdopen(opt.result_fd, "w");
            if (!f) die("fdopen(%d): %s", opt.result_fd, strerror(errno));
            write_result(f, &r);
            if (fclose(f)) die("writing the result: %s", strerror(errno));
        } else {
            summary s;
            summarize(&r, &s);
            print_pass(stdout, &r, &s, opt.run == RUN_COLD ? "cold run" : "warm run");
        }
        if (opt.own_dir) { /* a new directory, kept for the warm run to come */
            own_dir_done = true;
            fflush(stdout);
            fprintf(stderr, "%s: the cache is in %s (restart on it with --run warm "
                    "--cache-dir %s)\n", prog, opt.cache_dir, opt.cache_dir);
        }
        free_result(&r);
        free_workload(&w);
        return 0;
    }

    pkvm_config cfg;
    pkvm_preset(opt.preset, &cfg);
    pkvm_model *m;
    cfg.seed = opt.seed;
    PKVM(pkvm_create(&cfg, &m));
    const uint64_t params = pkvm_params(m);
    pkvm_free(m);
    char a[32], b[32];
    FILE *info = opt.json ? stderr : stdout;
    if (!opt.quiet || !opt.json) {
        fprintf(info,
                "pkv-demo: %s model (%u layers, width %u, %u query / %u K/V heads, %s "
                "parameters), K/V %s in blocks of %u tokens, durability %s\n",
                opt.preset, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
                fmt_int(a, params), kv_name(), opt.block_size, dur_name());
        fprintf(info,
                "workload: %u users x %u turns sharing a %s-token system prompt, user "
                "messages of %u-%u tokens, answers of up to %u tokens, %u parallel samples on "
                "one request\n",
                opt.users, opt.turns, fmt_int(b, w.system.n), opt.msg_min, opt.msg_max,
                opt.answer, opt.samples);
        fprintf(info, "cache directory: %s%s\n\n", opt.cache_dir,
                opt.own_dir ? " (new for this run)" : "");
        fflush(info);
    }
    pass_result cold, warm;
    if (!opt.quiet) fprintf(stderr, "cold run: a new process on an emptied cache directory\n");
    run_child(RUN_COLD, argv, argc, &cold);
    if (!opt.quiet)
        fprintf(stderr, "\nwarm run: a new process restarted on the same cache directory\n");
    run_child(RUN_WARM, argv, argc, &warm);
    const int rc = report(&cold, &warm);
    fflush(stdout); /* the summary before what follows on stderr */
    if (opt.own_dir && rc == 0) {
        wipe_cache_dir(opt.cache_dir);
        if (rmdir(opt.cache_dir)) die("cannot remove %s: %s", opt.cache_dir, strerror(errno));
        own_dir_done = true;
        if (!opt.quiet)
            fprintf(stderr, "removed the cache directory %s (pass --cache-dir DIR to keep "
                    "one, e.g. for kvdump)\n", opt.cache_dir);
    }
    free_result(&cold);
    free_result(&warm);
    free_workload(&w);
    return rc;
}

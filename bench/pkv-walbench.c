/*
 * pkv-walbench.c — durability and recovery benchmark of pagedkv.
 *
 * Geometry as in pkv-bench: blocks of 16 tokens, 1 layer, 1 KV head, head_dim 8,
 * f16, so one block slot is one 4 KiB page and a 1M-block arena is 4 GiB of
 * preallocated file under --dir (default /tmp). Two parts:
 *
 *  1. Durable mutation throughput. A decode-like workload on a fresh cache: per
 *     thread 64 sequences decoded round-robin, append(1) + commit(1) per token (a
 *     seal every 16 tokens), each sequence closed after 256 tokens and replaced by
 *     a new, empty one. A "call" is one mutating pkv_* call (open, append, commit,
 *     close). Configurations, each a fresh cache per run:
 *       - PKV_DURABLE_NONE, 1 thread (reference: the log is written, never synced);
 *       - PKV_DURABLE_GROUP, 1 thread and --threads threads (different sequences);
 *       - PKV_DURABLE_ALWAYS, 1 thread, a bounded number of calls (--always-calls):
 *         every call that logs something waits for its own fdatasync.
 *     Each run lasts --seconds (ALWAYS: the call bound), then pkv_sync() makes
 *     everything durable; throughput = calls / (loop time + that final sync).
 *     Log counters (records, frames, fdatasyncs = stats.wal_syncs, bytes,
 *     checkpoints) are deltas over the run. In GROUP mode the latency to durable is
 *     sampled: every 256 calls thread 0 records (time, stats.last_lsn); a poller
 *     thread reads stats.durable_lsn every 0.2 ms, and thread 0 reads it with each
 *     sample; a sample's delay ends at the first such observation that finds its LSN
 *     durable (so it is rounded up by at most the gap between observations).
 *     After the timed part, one explicit pkv_checkpoint() is timed, to show what a
 *     checkpoint of that cache costs (the flusher makes no group commit meanwhile).
 *  2. Recovery. Builds a cache of --capacity blocks: sequences prefilled with one
 *     append + commit of up to 16k tokens each (1024 blocks sealed per commit) until
 *     every slot holds a sealed block; pkv_checkpoint(); then about --records log
 *     records of decode traffic on the full cache (64 sequences at a time, each
 *     opened on a cached 1024-token prefix, decoded 256 tokens, closed; their new
 *     blocks come from eviction), leaving 64 sequences open; pkv_close(). The build
 *     runs in PKV_DURABLE_NONE (same log format; pkv_close syncs) with automatic
 *     checkpoints off. Then --runs times: pkv_open() (page cache warm: the files
 *     were just written and are read back from memory), pkv_get_recovery()'s split, and
 *     pkv_close().
 *
 * Figures are medians over --runs runs (min and max alongside). Targets: GROUP with
 * 1 thread >= 1M calls/s with every sampled delay to durable <= 10 ms (judged on the
 * max over all runs), open <= 1 s and replay >= 5M records/s (medians); judged only
 * with the default group commit and checkpoint settings, 1M blocks and 1M records.
 * The temporary
 * directory under --dir is removed at the end, on an error and on SIGINT/SIGTERM.
 * Any pkv_* error ends the program with status 1 naming the call and
 * pkv_strerror()/pkv_last_error(); a bad command line gives the usage and status 2.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pagedkv.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- Workload shape ------------------------------------------------------ */

#define BLOCK_SIZE      16u
#define VOCAB           128256u /* token ids are drawn uniformly below this */
#define MODEL_ID        "pkv-walbench/synthetic-1L-1H-d8-f16"

/* Throughput phase */
#define TP_SEQS         64u   /* sequences per thread, decoded round-robin */
#define TP_SEQ_TOKENS   256u  /* tokens decoded before a sequence is closed (16 blocks) */
#define SAMPLE_CALLS    256u  /* thread 0 samples (time, last_lsn) every this many calls */
#define POLL_NS         200000u /* the durable_lsn poller's period: 0.2 ms */
#define MAX_SAMPLES     (1u << 20)

/* Recovery phase */
#define FILL_BLOCKS     1024u /* blocks per prefilled sequence (one append+commit) */
#define RC_SEQS         64u   /* sequences decoded at a time after the checkpoint */
#define RC_PREFIX       1024u /* cached prefix each of them opens on (64 blocks) ... */
#define RC_SEQ_TOKENS   1280u /* ... then decodes to this length (80 blocks) and closes */
#define MIN_CAPACITY    16384u

/* ---- Command line ---------------------------------------------------------- */

enum { PH_ALL = 0, PH_THROUGHPUT = 1, PH_RECOVERY = 2 };

static struct config {
    const char *dir;
    uint32_t runs, seconds_x1000, threads, group_commit_us;
    uint64_t capacity, records, always_calls, seed, ckpt_bytes;
    int phase;
    bool json, payload, prefault;
} cfg = {
    .dir = "/tmp",
    .runs = 5,
    .seconds_x1000 = 5000,
    .threads = 2,
    .capacity = 1u << 20,
    .records = 1000000,
    .always_calls = 2000,
    .seed = 1,
};

/* ---- Global state for errors and clean-up -------------------------------- */

static pkv_cache *g_cache;  /* the open cache, closed by cleanup() */
/* The targets are set for the defaults: group_commit_us and checkpoint_bytes as the
 * library sets them (part 1), a 1M-block cache and 1M records (part 2). */
static bool g_judge_tp, g_judge_rc;
static bool g_threads_live; /* threads still use g_cache: do not close it on exit */
static char g_root[PATH_MAX - 64]; /* our temporary directory (mkdtemp) */
static char g_phase[160] = "start-up";
static volatile sig_atomic_t g_stop;

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "pkv-walbench: warning: cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

static void remove_tree(const char *path) {
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void cleanup(void) {
    if (g_cache && !g_threads_live) pkv_close(g_cache);
    g_cache = NULL;
    if (g_root[0]) {
        remove_tree(g_root);
        g_root[0] = '\0';
    }
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-walbench: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cleanup();
    exit(1);
}

static _Noreturn void die_pkv_msg(int rc, const char *call, int line, const char *detail) {
    fprintf(stderr,
            "pkv-walbench: error during %s: %s failed (pkv-walbench.c:%d): %s (%d)%s%s\n",
            g_phase, call, line, pkv_strerror(rc), rc, detail[0] ? ": " : "", detail);
    if (rc == PKV_EFULL)
        fprintf(stderr, "pkv-walbench: hint: --capacity %" PRIu64 " blocks is too small\n",
                cfg.capacity);
    if (rc == PKV_ENOSPC)
        fprintf(stderr, "pkv-walbench: hint: the arena needs %.1f GiB under --dir %s\n",
                (double)cfg.capacity * 512.0 / (1024.0 * 1024 * 1024), cfg.dir);
    cleanup();
    exit(1);
}

static _Noreturn void die_pkv(int rc, const char *call, int line) {
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", pkv_last_error()); /* before any other call */
    die_pkv_msg(rc, call, line, detail);
}

#define PKV(call)                                                              \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (__builtin_expect(rc_ < 0, 0)) die_pkv(rc_, #call, __LINE__);       \
    } while (0)

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void check_stop(void) {
    if (g_stop) {
        fprintf(stderr, "pkv-walbench: interrupted; removing %s\n", g_root);
        cleanup();
        exit(130);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

/* ---- Time and randomness ------------------------------------------------- */

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One independent xoshiro256** stream per (seed, purpose). */
static void rng_init(rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static inline uint32_t rng_token(rng *r) {
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)VOCAB) >> 32);
}

static void fill_tokens(rng *r, uint32_t *t, size_t n) {
    for (size_t i = 0; i < n; i++) t[i] = rng_token(r);
}

/* Cost of one clock reading: the median gap between back-to-back readings. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double clock_overhead_ns(void) {
    enum { N = 2001 };
    static uint64_t d[N];
    uint64_t prev = now_ns();
    for (int i = 0; i < N; i++) {
        uint64_t t = now_ns();
        d[i] = t - prev;
        prev = t;
    }
    qsort(d, N, sizeof d[0], cmp_u64);
    return (double)d[N / 2];
}

/* ---- Opening caches ------------------------------------------------------- */

static void options(pkv_options *opt, pkv_durability mode, uint64_t ckpt_bytes) {
    pkv_options_init(opt);
    opt->num_layers = 1;
    opt->num_kv_heads = 1;
    opt->head_dim = 8;
    opt->dtype = PKV_F16;
    opt->block_size = BLOCK_SIZE;
    opt->capacity = cfg.capacity;
    opt->model_id = MODEL_ID;
    opt->durability = mode;
    opt->group_commit_us = cfg.group_commit_us;
    opt->checkpoint_bytes = ckpt_bytes;
    opt->flags = cfg.prefault ? PKV_OPEN_PREFAULT : 0;
}

/* Write a recognizable K and V row for one token through pkv_kv(). */
static int write_payload(pkv_cache *c, const pkv_cache_info *in, pkv_slot slot, uint32_t tok) {
    uint64_t row = (uint64_t)in->head_dim * in->elem_size;
    for (int k = 0; k < 2; k++) {
        uint8_t *p = pkv_kv(c, slot.block, 0, (pkv_kind)k, 0);
        if (!p) return -1;
        p += (uint64_t)slot.offset * row;
        for (uint64_t j = 0; j < row; j++) p[j] = (uint8_t)(tok * 31u + j + (uint32_t)k * 7u);
    }
    return 0;
}

static const char *mode_name(pkv_durability m) {
    return m == PKV_DURABLE_NONE ? "NONE" : m == PKV_DURABLE_GROUP ? "GROUP" : "ALWAYS";
}

/* ---- Metrics --------------------------------------------------------------- */

enum { T_NONE = 0, T_MIN_MED, T_MAX_MED, T_MAX_MAX }; /* how a target is judged */

typedef struct metric_def {
    const char *key;   /* JSON key */
    const char *label; /* text report */
    const char *unit;
    int judge;         /* T_*: median >= target, median <= target, max <= target */
    double target;
} metric_def;

typedef struct summary {
    double med, min, max; /* NAN when not measurable */
} summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* v[0..n) with stride `stride` doubles. */
static summary summarize(const double *v0, size_t stride, unsigned n) {
    summary s = {NAN, NAN, NAN};
    double *v = xmalloc(n * sizeof *v);
    for (unsigned i = 0; i < n; i++) {
        v[i] = v0[i * stride];
        if (isnan(v[i])) {
            free(v);
            return s;
        }
    }
    qsort(v, n, sizeof *v, cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    free(v);
    return s;
}

/* -1: no target; else 1 met, 0 missed. */
static int judged(const metric_def *d, summary s) {
    switch (d->judge) {
    case T_MIN_MED: return !isnan(s.med) && s.med >= d->target;
    case T_MAX_MED: return !isnan(s.med) && s.med <= d->target;
    case T_MAX_MAX: return !isnan(s.max) && s.max <= d->target;
    default: return -1;
    }
}

static void fmt_num(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "n/a");
    else if (fabs(v) >= 1e6) snprintf(buf, n, "%.3g", v);
    else if (fabs(v) >= 1000) snprintf(buf, n, "%.0f", v);
    else if (fabs(v) >= 100) snprintf(buf, n, "%.1f", v);
    else if (fabs(v) >= 1 || v == 0) snprintf(buf, n, "%.2f", v);
    else snprintf(buf, n, "%.3g", v);
}

static void fmt_target(char *buf, size_t n, const metric_def *d, int met) {
    const char *verdict = met < 0 ? "" : met ? "  met" : "  MISSED";
    char t[32];
    fmt_num(t, sizeof t, d->target);
    switch (d->judge) {
    case T_MIN_MED: snprintf(buf, n, ">= %s%s", t, verdict); break;
    case T_MAX_MED: snprintf(buf, n, "<= %s%s", t, verdict); break;
    case T_MAX_MAX: snprintf(buf, n, "max <= %s%s", t, verdict); break;
    default: buf[0] = '\0';
    }
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v)) fputs("null", f);
    else fprintf(f, "%.6g", v);
}

/* ---- Part 1: throughput ---------------------------------------------------- */

enum {
    TP_CALLS_PER_S,      /* calls / (loop + final sync) */
    TP_CALLS_PER_S_LOOP, /* calls / loop */
    TP_RECORDS_PER_S,
    TP_US_PER_CALL,
    TP_SYNC_MS,
    TP_SECONDS,
    TP_CALLS,
    TP_RECORDS_PER_CALL,
    TP_SYNCS,
    TP_SYNCS_PER_CALL,
    TP_CALLS_PER_SYNC,
    TP_MS_PER_SYNC,
    TP_FRAMES,
    TP_BYTES_PER_CALL,
    TP_CHECKPOINTS,
    TP_SEALS,
    TP_EVICTIONS,
    TP_LAT_MED_MS,
    TP_LAT_P99_MS,
    TP_LAT_MAX_MS,
    TP_LAT_SAMPLES,
    TP_POLL_GAP_MAX_MS,
    TP_LAT_CKPT_PCT,
    TP_LAT_MAX_NOCKPT_MS,
    TP_WAL_DELAY_MAX_MS,
    TP_CKPT_MS,
    TP_COUNT
};

static metric_def tp_defs[TP_COUNT] = {
    [TP_CALLS_PER_S] = {"calls_per_s", "mutating calls, final pkv_sync included", "calls/s",
                        T_NONE, 0},
    [TP_CALLS_PER_S_LOOP] = {"calls_per_s_loop", "    same, loop only (no final sync)",
                             "calls/s", T_NONE, 0},
    [TP_RECORDS_PER_S] = {"records_per_s", "log records, final sync included", "records/s",
                          T_NONE, 0},
    [TP_US_PER_CALL] = {"us_per_call", "wall time per call, final sync included", "us/call",
                        T_NONE, 0},
    [TP_SYNC_MS] = {"final_sync_ms", "final pkv_sync()", "ms", T_NONE, 0},
    [TP_SECONDS] = {"loop_seconds", "loop wall time", "s", T_NONE, 0},
    [TP_CALLS] = {"calls", "mutating calls", "calls", T_NONE, 0},
    [TP_RECORDS_PER_CALL] = {"records_per_call", "log records per call", "rec/call", T_NONE, 0},
    [TP_SYNCS] = {"wal_syncs", "fdatasync groups (stats.wal_syncs)", "syncs", T_NONE, 0},
    [TP_SYNCS_PER_CALL] = {"syncs_per_call", "    per call", "syncs/call", T_NONE, 0},
    [TP_CALLS_PER_SYNC] = {"calls_per_sync", "    calls per sync (group size)", "calls/sync",
                           T_NONE, 0},
    [TP_MS_PER_SYNC] = {"ms_per_sync", "    wall time per sync group", "ms/sync", T_NONE, 0},
    [TP_FRAMES] = {"wal_frames", "log frames written (stats.wal_frames)", "frames", T_NONE, 0},
    [TP_BYTES_PER_CALL] = {"log_bytes_per_call", "log bytes per call", "B/call", T_NONE, 0},
    [TP_CHECKPOINTS] = {"checkpoints", "automatic checkpoints (every checkpoint_bytes of log)",
                        "ckpts", T_NONE, 0},
    [TP_SEALS] = {"seals", "blocks sealed", "blocks", T_NONE, 0},
    [TP_EVICTIONS] = {"evictions", "blocks evicted", "blocks", T_NONE, 0},
    [TP_LAT_MED_MS] = {"durable_delay_median_ms", "delay to durable: median", "ms", T_NONE, 0},
    [TP_LAT_P99_MS] = {"durable_delay_p99_ms", "delay to durable: p99", "ms", T_NONE, 0},
    [TP_LAT_MAX_MS] = {"durable_delay_max_ms", "delay to durable: max", "ms", T_NONE, 0},
    [TP_LAT_SAMPLES] = {"durable_delay_samples", "    samples", "samples", T_NONE, 0},
    [TP_LAT_CKPT_PCT] = {"durable_delay_ckpt_pct",
                         "    samples whose wait saw a checkpoint complete", "%", T_NONE, 0},
    [TP_LAT_MAX_NOCKPT_MS] = {"durable_delay_max_no_ckpt_ms",
                              "    max delay of the other samples", "ms", T_NONE, 0},
    [TP_WAL_DELAY_MAX_MS] = {"wal_max_delay_ms",
                             "delay to durable: max, measured by the library", "ms", T_NONE, 0},
    [TP_CKPT_MS] = {"checkpoint_ms", "pkv_checkpoint() after the run (not in the throughput)",
                    "ms", T_NONE, 0},
    [TP_POLL_GAP_MAX_MS] = {"poll_gap_max_ms", "    largest gap between durable_lsn polls",
                            "ms", T_NONE, 0},
};

typedef struct tp_result {
    double m[TP_COUNT];
} tp_result;

typedef struct tp_config {
    const char *key, *title;
    pkv_durability mode;
    unsigned threads;
    uint64_t max_calls; /* per run, all threads together; 0: --seconds */
    bool target;        /* the >= 1M calls/s, <= 10 ms target applies */
    tp_result *res;     /* cfg.runs */
} tp_config;

/* A latency sample: stats.last_lsn read at time t (stats.checkpoints was ckpts);
 * `seen` is the earliest observation (by thread 0 itself or by the poller) that
 * found stats.durable_lsn >= lsn, packed as (ns since the run's base time + 1) << 16
 * | (stats.checkpoints at that observation & 0xffff), so that the minimum by time
 * also carries its checkpoint count. */
typedef struct sample {
    uint64_t t, lsn, ckpts;
    _Atomic uint64_t seen; /* 0: not yet */
} sample;

static inline uint64_t seen_pack(uint64_t t, uint64_t base, uint64_t ckpts) {
    return ((t - base + 1) << 16) | (ckpts & 0xffff);
}

/* Resolve samples [*head, n) whose LSN is durable as of an observation at time t. */
static void resolve(sample *smp, size_t *head, size_t n, const pkv_stats *st, uint64_t t,
                    uint64_t base) {
    t = seen_pack(t, base, st->checkpoints);
    uint64_t durable = st->durable_lsn;
    while (*head < n && smp[*head].lsn <= durable) {
        _Atomic uint64_t *seen = &smp[(*head)++].seen;
        uint64_t cur = atomic_load_explicit(seen, memory_order_relaxed);
        while ((cur == 0 || t < cur) &&
               !atomic_compare_exchange_weak_explicit(seen, &cur, t, memory_order_relaxed,
                                                      memory_order_relaxed)) {
        }
    }
}

typedef struct worker worker;

typedef struct tp_ctx {
    pkv_cache *c;
    pkv_cache_info info;
    unsigned nthreads;
    uint64_t deadline; /* ns, CLOCK_MONOTONIC; 0 = none */
    uint64_t max_calls; /* per thread; 0 = none */
    pthread_barrier_t start;
    atomic_bool abort; /* a thread failed (or a signal came): everybody stops */
    /* latency to durable */
    bool sampling;
    sample *samples;
    atomic_size_t nsamples;
    atomic_bool poll_stop;
    uint64_t poll_gap_max;
    uint64_t base; /* ns: observation times are packed relative to it */
    worker *w;
} tp_ctx;

struct worker {
    pthread_t thr;
    unsigned idx;
    tp_ctx *ctx;
    uint64_t calls, t_end;
    /* the first failing call */
    int rc, line;
    const char *call;
    char msg[768];
};

#define PKVW(expr)                                                             \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (__builtin_expect(rc_ < 0, 0)) {                                    \
            w->rc = rc_;                                                       \
            w->call = #expr;                                                   \
            w->line = __LINE__;                                                \
            snprintf(w->msg, sizeof w->msg, "%s", pkv_last_error());           \
            goto fail;                                                         \
        }                                                                      \
    } while (0)

static void *tp_worker(void *arg) {
    worker *w = arg;
    tp_ctx *x = w->ctx;
    pkv_cache *c = x->c;
    rng r;
    rng_init(&r, cfg.seed, 100 + w->idx);
    uint64_t ids[TP_SEQS];
    uint32_t len[TP_SEQS];
    uint64_t next_id = ((uint64_t)w->idx + 1) << 40;
    uint64_t calls = 0, next_sample = SAMPLE_CALLS;
    size_t head = 0; /* first sample thread 0 has not seen durable */
    const bool sampler = x->sampling && w->idx == 0;
    const bool payload = cfg.payload;
    const uint64_t max_calls = x->max_calls ? x->max_calls : UINT64_MAX;
    pkv_slot slot;

    pthread_barrier_wait(&x->start);
    for (unsigned s = 0; s < TP_SEQS; s++) {
        ids[s] = next_id++;
        len[s] = 0;
        PKVW(pkv_seq_open(c, ids[s], 0, NULL, 0, NULL));
        calls++;
    }
    for (;;) {
        for (unsigned s = 0; s < TP_SEQS && calls < max_calls; s++) {
            uint32_t tok = rng_token(&r);
            PKVW(pkv_seq_append(c, ids[s], &tok, 1, &slot));
            if (payload && write_payload(c, &x->info, slot, tok)) {
                w->rc = PKV_EINVAL;
                w->call = "pkv_kv()";
                w->line = __LINE__;
                snprintf(w->msg, sizeof w->msg, "returned NULL for block %" PRIu32, slot.block);
                goto fail;
            }
            PKVW(pkv_seq_commit(c, ids[s], 1));
            calls += 2;
            if (++len[s] == TP_SEQ_TOKENS) {
                PKVW(pkv_seq_close(c, ids[s]));
                ids[s] = next_id++;
                len[s] = 0;
                PKVW(pkv_seq_open(c, ids[s], 0, NULL, 0, NULL));
                calls += 2;
            }
            if (sampler && calls >= next_sample) {
                next_sample = calls + SAMPLE_CALLS;
                size_t n = atomic_load_explicit(&x->nsamples, memory_order_relaxed);
                if (n < MAX_SAMPLES) {
                    pkv_stats st;
                    uint64_t t = now_ns();
                    PKVW(pkv_get_stats(c, &st));
                    uint64_t t_obs = now_ns();
                    x->samples[n].t = t;
                    x->samples[n].lsn = st.last_lsn;
                    x->samples[n].ckpts = st.checkpoints;
                    atomic_store_explicit(&x->samples[n].seen, 0, memory_order_relaxed);
                    atomic_store_explicit(&x->nsamples, n + 1, memory_order_release);
                    /* This thread observes durability too, so a starved poller does
                     * not inflate the delays. */
                    resolve(x->samples, &head, n + 1, &st, t_obs, x->base);
                }
            }
        }
        if (calls >= max_calls || (x->deadline && now_ns() >= x->deadline) ||
            atomic_load_explicit(&x->abort, memory_order_relaxed) || g_stop)
            break;
    }
    w->calls = calls;
    w->t_end = now_ns();
    return NULL;
fail:
    w->calls = calls;
    w->t_end = now_ns();
    atomic_store(&x->abort, true);
    return NULL;
}

/* Reads stats.durable_lsn every POLL_NS and resolves the samples it has passed. */
static void *tp_poller(void *arg) {
    tp_ctx *x = arg;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* 1 us instead of the default 50 us */
    size_t head = 0;
    uint64_t next = now_ns(), prev = 0;
    for (;;) {
        bool last = atomic_load(&x->poll_stop);
        size_t n = atomic_load_explicit(&x->nsamples, memory_order_acquire);
        pkv_stats st;
        if (pkv_get_stats(x->c, &st) < 0) break; /* cannot fail on a valid handle */
        uint64_t t = now_ns();
        if (prev && t - prev > x->poll_gap_max) x->poll_gap_max = t - prev;
        prev = t;
        resolve(x->samples, &head, n, &st, t, x->base);
        if (last) break;
        next += POLL_NS;
        if (next < t) next = t + POLL_NS / 4; /* fell behind: catch up, but do not spin */
        struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
    return NULL;
}

static double pctile(const uint64_t *v, size_t n, double p) {
    if (!n) return NAN;
    size_t i = (size_t)ceil(p * (double)n) - 1;
    if (i >= n) i = n - 1;
    return (double)v[i];
}

static void tp_run(const tp_config *tc, unsigned run, tp_result *res, FILE *info) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s-%u", g_root, tc->key, run);
    snprintf(g_phase, sizeof g_phase, "%s, run %u: pkv_open", tc->title, run);
    pkv_options opt;
    options(&opt, tc->mode, cfg.ckpt_bytes);
    PKV(pkv_open(dir, &opt, &g_cache));
    pkv_cache *c = g_cache;

    tp_ctx x;
    memset(&x, 0, sizeof x);
    x.c = c;
    PKV(pkv_info(c, &x.info));
    x.nthreads = tc->threads;
    x.max_calls = tc->max_calls ? (tc->max_calls + tc->threads - 1) / tc->threads : 0;
    x.sampling = tc->mode == PKV_DURABLE_GROUP;
    x.base = now_ns();
    atomic_init(&x.abort, false);
    atomic_init(&x.nsamples, 0);
    atomic_init(&x.poll_stop, false);
    if (x.sampling) {
        x.samples = xmalloc(MAX_SAMPLES * sizeof *x.samples);
    }
    x.w = xcalloc(tc->threads, sizeof *x.w);
    pkv_stats st0, st1;
    PKV(pkv_get_stats(c, &st0));

    snprintf(g_phase, sizeof g_phase, "%s, run %u", tc->title, run);
    if (pthread_barrier_init(&x.start, NULL, tc->threads + 1)) die("pthread_barrier_init failed");
    pthread_t poller;
    g_threads_live = true;
    if (x.sampling && pthread_create(&poller, NULL, tp_poller, &x))
        die("cannot start the poller thread");
    for (unsigned i = 0; i < tc->threads; i++) {
        x.w[i].idx = i;
        x.w[i].ctx = &x;
        if (pthread_create(&x.w[i].thr, NULL, tp_worker, &x.w[i]))
            die("cannot start worker thread %u", i);
    }
    /* Set before the barrier, which publishes it to the workers. */
    x.deadline = tc->max_calls ? 0 : now_ns() + (uint64_t)cfg.seconds_x1000 * 1000000u;
    pthread_barrier_wait(&x.start);
    uint64_t t0 = now_ns();
    uint64_t t_end = t0, calls = 0;
    for (unsigned i = 0; i < tc->threads; i++) {
        pthread_join(x.w[i].thr, NULL);
        if (x.w[i].t_end > t_end) t_end = x.w[i].t_end;
        calls += x.w[i].calls;
    }
    int sync_rc = 0;
    uint64_t ts0 = now_ns(), ts1 = ts0;
    bool failed = false;
    for (unsigned i = 0; i < tc->threads; i++) failed = failed || x.w[i].rc;
    if (!failed && !g_stop) {
        sync_rc = pkv_sync(c);
        ts1 = now_ns();
    }
    char sync_msg[1024];
    snprintf(sync_msg, sizeof sync_msg, "%s", sync_rc ? pkv_last_error() : "");
    atomic_store(&x.poll_stop, true);
    if (x.sampling) pthread_join(poller, NULL);
    g_threads_live = false;
    pthread_barrier_destroy(&x.start);
    for (unsigned i = 0; i < tc->threads; i++)
        if (x.w[i].rc) {
            snprintf(g_phase, sizeof g_phase, "%s, run %u, thread %u", tc->title, run, i);
            die_pkv_msg(x.w[i].rc, x.w[i].call, x.w[i].line, x.w[i].msg);
        }
    check_stop();
    if (sync_rc) die_pkv_msg(sync_rc, "pkv_sync(c)", __LINE__, sync_msg);
    PKV(pkv_get_stats(c, &st1));
    snprintf(g_phase, sizeof g_phase, "%s, run %u: pkv_checkpoint after the run", tc->title, run);
    uint64_t tc0 = now_ns();
    PKV(pkv_checkpoint(c));
    res->m[TP_CKPT_MS] = (double)(now_ns() - tc0) / 1e6;
    if (st1.durable_lsn != st1.last_lsn)
        die("after pkv_sync, durable_lsn %" PRIu64 " != last_lsn %" PRIu64, st1.durable_lsn,
            st1.last_lsn);

    double loop_s = (double)(t_end - t0) / 1e9, sync_s = (double)(ts1 - ts0) / 1e9;
    double total_s = loop_s + sync_s;
    uint64_t recs = st1.wal_records - st0.wal_records, syncs = st1.wal_syncs - st0.wal_syncs;
    double *m = res->m;
    m[TP_CALLS_PER_S] = (double)calls / total_s;
    m[TP_CALLS_PER_S_LOOP] = (double)calls / loop_s;
    m[TP_RECORDS_PER_S] = (double)recs / total_s;
    m[TP_US_PER_CALL] = total_s * 1e6 / (double)calls;
    m[TP_SYNC_MS] = sync_s * 1e3;
    m[TP_SECONDS] = loop_s;
    m[TP_CALLS] = (double)calls;
    m[TP_RECORDS_PER_CALL] = (double)recs / (double)calls;
    m[TP_SYNCS] = (double)syncs;
    m[TP_SYNCS_PER_CALL] = (double)syncs / (double)calls;
    m[TP_CALLS_PER_SYNC] = syncs ? (double)calls / (double)syncs : NAN;
    m[TP_MS_PER_SYNC] = syncs ? total_s * 1e3 / (double)syncs : NAN;
    m[TP_FRAMES] = (double)(st1.wal_frames - st0.wal_frames);
    m[TP_BYTES_PER_CALL] = (double)(st1.wal_bytes - st0.wal_bytes) / (double)calls;
    m[TP_CHECKPOINTS] = (double)(st1.checkpoints - st0.checkpoints);
    m[TP_SEALS] = (double)(st1.seals - st0.seals);
    m[TP_EVICTIONS] = (double)(st1.evictions - st0.evictions);
    /* the cache is new each run: its maximum is this run's (final sync included) */
    m[TP_WAL_DELAY_MAX_MS] = tc->mode == PKV_DURABLE_NONE ? NAN
                                                          : (double)st1.wal_max_delay_us / 1e3;
    m[TP_LAT_MED_MS] = m[TP_LAT_P99_MS] = m[TP_LAT_MAX_MS] = NAN;
    m[TP_LAT_SAMPLES] = m[TP_POLL_GAP_MAX_MS] = m[TP_LAT_CKPT_PCT] = NAN;
    m[TP_LAT_MAX_NOCKPT_MS] = NAN;
    if (x.sampling) {
        size_t ns = atomic_load(&x.nsamples);
        uint64_t *delays = xmalloc(ns * sizeof *delays), max_plain = 0, n_ckpt = 0;
        for (size_t i = 0; i < ns; i++) {
            uint64_t seen = atomic_load(&x.samples[i].seen);
            if (!seen)
                die("latency sample %zu (LSN %" PRIu64 ") was never seen durable (durable_lsn %"
                    PRIu64 ")", i, x.samples[i].lsn, st1.durable_lsn);
            uint64_t t_seen = (seen >> 16) - 1 + x.base;
            delays[i] = t_seen - x.samples[i].t;
            if ((seen & 0xffff) != (x.samples[i].ckpts & 0xffff)) n_ckpt++;
            else if (delays[i] > max_plain) max_plain = delays[i];
        }
        m[TP_LAT_CKPT_PCT] = ns ? 100.0 * (double)n_ckpt / (double)ns : NAN;
        m[TP_LAT_MAX_NOCKPT_MS] = n_ckpt < ns ? (double)max_plain / 1e6 : NAN;
        qsort(delays, ns, sizeof *delays, cmp_u64);
        m[TP_LAT_MED_MS] = pctile(delays, ns, 0.5) / 1e6;
        m[TP_LAT_P99_MS] = pctile(delays, ns, 0.99) / 1e6;
        m[TP_LAT_MAX_MS] = pctile(delays, ns, 1.0) / 1e6;
        m[TP_LAT_SAMPLES] = (double)ns;
        m[TP_POLL_GAP_MAX_MS] = (double)x.poll_gap_max / 1e6;
        free(delays);
    }
    free(x.samples);
    free(x.w);

    snprintf(g_phase, sizeof g_phase, "%s, run %u: pkv_close", tc->title, run);
    pkv_close(g_cache);
    g_cache = NULL;
    remove_tree(dir);

    fprintf(info, "%s run %u/%u: %.3g calls/s (final sync %.2f ms), %.0f syncs (%.1f calls/sync)",
            tc->title, run, cfg.runs, m[TP_CALLS_PER_S], m[TP_SYNC_MS], m[TP_SYNCS],
            m[TP_CALLS_PER_SYNC]);
    if (x.sampling)
        fprintf(info, ", delay to durable median %.2f / p99 %.2f / max %.2f ms (library: max %.2f)",
                m[TP_LAT_MED_MS], m[TP_LAT_P99_MS], m[TP_LAT_MAX_MS], m[TP_WAL_DELAY_MAX_MS]);
    fprintf(info, ", %.0f checkpoints; a checkpoint after it took %.0f ms\n", m[TP_CHECKPOINTS],
            m[TP_CKPT_MS]);
    fflush(info);
}

/* ---- Part 2: recovery ------------------------------------------------------ */

enum {
    RC_OPEN_MS,
    RC_CKPT_MS,
    RC_REPLAY_MS,
    RC_REBUILD_MS,
    RC_VERIFY_MS,
    RC_OTHER_MS,
    RC_REPLAY_RATE,
    RC_CLOSE_MS,
    RC_COUNT
};

static metric_def rc_defs[RC_COUNT] = {
    [RC_OPEN_MS] = {"open_ms", "pkv_open (checkpoint + log replay + rebuild + verify)", "ms",
                    T_MAX_MED, 1000},
    [RC_CKPT_MS] = {"ms_checkpoint", "    ms_checkpoint: read + load the checkpoint", "ms",
                    T_NONE, 0},
    [RC_REPLAY_MS] = {"ms_replay", "    ms_replay: read + apply the log after it", "ms", T_NONE,
                      0},
    [RC_REBUILD_MS] = {"ms_rebuild", "    ms_rebuild: refcounts, lists, prefix index", "ms",
                       T_NONE, 0},
    [RC_VERIFY_MS] = {"ms_verify", "    ms_verify: payload checksums of open sequences", "ms",
                      T_NONE, 0},
    [RC_OTHER_MS] = {"ms_other", "    rest of pkv_open (arena map, pool, flusher)", "ms",
                     T_NONE, 0},
    [RC_REPLAY_RATE] = {"replay_records_per_s", "replay rate (records_replayed / ms_replay)",
                        "records/s", T_MIN_MED, 5e6},
    [RC_CLOSE_MS] = {"close_ms", "pkv_close after the open", "ms", T_NONE, 0},
};

typedef struct rc_result {
    double m[RC_COUNT];
} rc_result;

typedef struct rc_build {
    double create_ms, fill_s, ckpt_s, records_s, close_ms;
    uint64_t fill_seqs, fill_calls, sealed, ckpt_lsn, records, last_lsn, log_bytes, calls;
    uint64_t evictions, open_seqs, ckpt_file_bytes, log_files, log_file_bytes;
    pkv_recovery rec; /* of the first timed open */
    pkv_stats st;     /* after the first timed open */
} rc_build;

static void dir_sizes(const char *dir, rc_build *b) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[PATH_MAX + 300];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) || !S_ISREG(sb.st_mode)) continue;
        /* The checkpoint chain: the full checkpoint and any delta checkpoints. */
        if (!strncmp(e->d_name, "ckpt-", 5) || !strncmp(e->d_name, "delta-", 6))
            b->ckpt_file_bytes += (uint64_t)sb.st_size;
        else if (!strncmp(e->d_name, "wal-", 4)) {
            b->log_files++;
            b->log_file_bytes += (uint64_t)sb.st_size;
        }
    }
    closedir(d);
}

static void recovery(rc_result *res, rc_build *b, FILE *info) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/recovery", g_root);
    pkv_options opt;
    /* Build in NONE mode (pkv_close syncs at the end); the log format is the same.
     * No automatic checkpoint: the one pkv_checkpoint() below is the base. */
    options(&opt, PKV_DURABLE_NONE, UINT64_MAX / 2);
    snprintf(g_phase, sizeof g_phase, "recovery build: pkv_open (create)");
    uint64_t t0 = now_ns();
    PKV(pkv_open(dir, &opt, &g_cache));
    pkv_cache *c = g_cache;
    b->create_ms = (double)(now_ns() - t0) / 1e6;

    /* 1. Fill every slot with sealed blocks: one append + commit per sequence. */
    const uint64_t cap = cfg.capacity;
    const size_t chunk = (size_t)FILL_BLOCKS * BLOCK_SIZE;
    uint32_t *tok = xmalloc(chunk * sizeof *tok);
    pkv_slot *slots = xmalloc(chunk * sizeof *slots);
    uint32_t (*prompt)[RC_PREFIX + 1] = xcalloc(RC_SEQS, sizeof *prompt);
    const uint64_t nfill = (cap + FILL_BLOCKS - 1) / FILL_BLOCKS;
    { /* prompts no fill sequence provides (small capacities) are random */
        rng r;
        rng_init(&r, cfg.seed, 8);
        for (unsigned s = 0; s < RC_SEQS; s++) fill_tokens(&r, prompt[s], RC_PREFIX + 1);
    }
    uint64_t filled = 0, id = 1, next_report = nfill / 4;
    snprintf(g_phase, sizeof g_phase, "recovery build: filling %" PRIu64 " blocks", cap);
    fprintf(stderr, "pkv-walbench: recovery: filling %" PRIu64 " blocks (%" PRIu64
                    " sequences of up to %u blocks)...\n", cap, nfill, FILL_BLOCKS);
    t0 = now_ns();
    for (uint64_t i = 0; i < nfill; i++) {
        uint64_t nb = cap - filled < FILL_BLOCKS ? cap - filled : FILL_BLOCKS;
        size_t n = (size_t)nb * BLOCK_SIZE;
        rng r;
        rng_init(&r, cfg.seed, 1000 + i);
        fill_tokens(&r, tok, n);
        PKV(pkv_seq_open(c, id, 0, NULL, 0, NULL));
        PKV(pkv_seq_append(c, id, tok, n, slots));
        PKV(pkv_seq_commit(c, id, n));
        PKV(pkv_seq_close(c, id));
        id++;
        b->fill_calls += 4;
        filled += nb;
        /* The newest RC_SEQS sequences give the prompts decoded after the checkpoint
         * (the oldest blocks are the first evicted). */
        if (i + RC_SEQS >= nfill) {
            uint32_t *p = prompt[i % RC_SEQS];
            size_t k = n < RC_PREFIX ? n : RC_PREFIX;
            memcpy(p, tok, k * sizeof *p);
            fill_tokens(&r, p + k, RC_PREFIX + 1 - k);
        }
        if (i + 1 == next_report && i + 1 < nfill) {
            fprintf(stderr, "pkv-walbench: recovery: filled %" PRIu64 " / %" PRIu64
                            " blocks (%.1f s)\n", filled, cap, (double)(now_ns() - t0) / 1e9);
            next_report += nfill / 4;
        }
        check_stop();
    }
    b->fill_s = (double)(now_ns() - t0) / 1e9;
    b->fill_seqs = nfill;
    pkv_stats st;
    PKV(pkv_get_stats(c, &st));
    b->sealed = st.blocks_sealed;
    fprintf(stderr, "pkv-walbench: recovery: %" PRIu64 " blocks sealed in %.1f s; "
                    "checkpoint...\n", st.blocks_sealed, b->fill_s);

    /* 2. The checkpoint. */
    snprintf(g_phase, sizeof g_phase, "recovery build: pkv_checkpoint");
    t0 = now_ns();
    PKV(pkv_checkpoint(c));
    b->ckpt_s = (double)(now_ns() - t0) / 1e9;
    PKV(pkv_get_stats(c, &st));
    b->ckpt_lsn = st.checkpoint_lsn;
    const uint64_t bytes0 = st.wal_bytes, ev0 = st.evictions;
    if (st.last_lsn != b->ckpt_lsn)
        die("the checkpoint covers LSN %" PRIu64 " but the last LSN is %" PRIu64, b->ckpt_lsn,
            st.last_lsn);

    /* 3. About cfg.records records of decode traffic after it. */
    fprintf(stderr, "pkv-walbench: recovery: checkpoint at LSN %" PRIu64 " in %.2f s; logging "
                    "%" PRIu64 " records...\n", b->ckpt_lsn, b->ckpt_s, cfg.records);
    snprintf(g_phase, sizeof g_phase, "recovery build: logging records after the checkpoint");
    uint64_t ids[RC_SEQS];
    uint32_t len[RC_SEQS];
    bool open[RC_SEQS] = {false};
    uint64_t opened = 0, calls = 0, target = b->ckpt_lsn + cfg.records;
    uint64_t report = cfg.records / 4;
    rng r;
    rng_init(&r, cfg.seed, 7);
    pkv_slot slot;
    t0 = now_ns();
    for (;;) {
        for (unsigned s = 0; s < RC_SEQS; s++) {
            if (!open[s]) { /* open on a cached prefix, compute the rest of the prompt */
                size_t n_cached = 0;
                const uint32_t *p = prompt[opened % RC_SEQS];
                ids[s] = id++;
                PKV(pkv_seq_open(c, ids[s], 0, p, RC_PREFIX + 1, &n_cached));
                size_t rest = RC_PREFIX + 1 - n_cached;
                PKV(pkv_seq_append(c, ids[s], p + n_cached, rest, slots));
                PKV(pkv_seq_commit(c, ids[s], rest));
                calls += 3;
                len[s] = RC_PREFIX + 1;
                open[s] = true;
                opened++;
                continue;
            }
            uint32_t t = rng_token(&r);
            PKV(pkv_seq_append(c, ids[s], &t, 1, &slot));
            PKV(pkv_seq_commit(c, ids[s], 1));
            calls += 2;
            if (++len[s] == RC_SEQ_TOKENS) { /* a block boundary: nothing goes to limbo */
                PKV(pkv_seq_close(c, ids[s]));
                calls++;
                open[s] = false;
            }
        }
        PKV(pkv_get_stats(c, &st));
        if (st.last_lsn >= target) break;
        if (st.last_lsn - b->ckpt_lsn >= report) {
            fprintf(stderr, "pkv-walbench: recovery: %" PRIu64 " records logged (%.1f s)\n",
                    st.last_lsn - b->ckpt_lsn, (double)(now_ns() - t0) / 1e9);
            report += cfg.records / 4;
        }
        check_stop();
    }
    b->records_s = (double)(now_ns() - t0) / 1e9;
    b->calls = calls;
    b->last_lsn = st.last_lsn;
    b->records = st.last_lsn - b->ckpt_lsn;
    b->log_bytes = st.wal_bytes - bytes0;
    b->evictions = st.evictions - ev0;
    b->open_seqs = st.sequences;
    if (st.checkpoint_lsn != b->ckpt_lsn)
        die("an automatic checkpoint ran during the build (LSN %" PRIu64 ")", st.checkpoint_lsn);
    free(tok);
    free(slots);
    free(prompt);

    snprintf(g_phase, sizeof g_phase, "recovery build: pkv_close");
    t0 = now_ns();
    pkv_close(g_cache);
    g_cache = NULL;
    b->close_ms = (double)(now_ns() - t0) / 1e6;
    dir_sizes(dir, b);
    fprintf(stderr, "pkv-walbench: recovery: %" PRIu64 " records (%.1f MB of log) in %.1f s; "
                    "%" PRIu64 " sequences left open; timing %u opens...\n",
            b->records, (double)b->log_bytes / 1e6, b->records_s, b->open_seqs, cfg.runs);

    /* 4. Timed opens. Nothing is logged between them, so each replays the same log. */
    options(&opt, PKV_DURABLE_GROUP, UINT64_MAX / 2);
    for (unsigned run = 1; run <= cfg.runs; run++) {
        snprintf(g_phase, sizeof g_phase, "recovery, open %u: pkv_open", run);
        t0 = now_ns();
        PKV(pkv_open(dir, &opt, &g_cache));
        uint64_t t1 = now_ns();
        pkv_recovery rec;
        PKV(pkv_get_recovery(g_cache, &rec));
        PKV(pkv_get_stats(g_cache, &st));
        if (run == 1) {
            b->rec = rec;
            b->st = st;
        }
        if (rec.records_replayed != b->records || rec.checkpoint_lsn != b->ckpt_lsn ||
            rec.last_lsn != b->last_lsn)
            die("open %u replayed %" PRIu64 " records after checkpoint LSN %" PRIu64
                " up to LSN %" PRIu64 "; expected %" PRIu64 " after %" PRIu64 " up to %" PRIu64
                " (%s)", run, rec.records_replayed, rec.checkpoint_lsn, rec.last_lsn,
                b->records, b->ckpt_lsn, b->last_lsn, rec.note);
        if (rec.note[0])
            fprintf(stderr, "pkv-walbench: warning: open %u: recovery note: %s\n", run, rec.note);
        snprintf(g_phase, sizeof g_phase, "recovery, open %u: pkv_close", run);
        uint64_t t2 = now_ns();
        pkv_close(g_cache);
        g_cache = NULL;
        uint64_t t3 = now_ns();
        double *m = res[run - 1].m;
        m[RC_OPEN_MS] = (double)(t1 - t0) / 1e6;
        m[RC_CKPT_MS] = rec.ms_checkpoint;
        m[RC_REPLAY_MS] = rec.ms_replay;
        m[RC_REBUILD_MS] = rec.ms_rebuild;
        m[RC_VERIFY_MS] = rec.ms_verify;
        m[RC_OTHER_MS] =
            m[RC_OPEN_MS] - rec.ms_checkpoint - rec.ms_replay - rec.ms_rebuild - rec.ms_verify;
        m[RC_REPLAY_RATE] =
            rec.ms_replay > 0 ? (double)rec.records_replayed / (rec.ms_replay / 1e3) : NAN;
        m[RC_CLOSE_MS] = (double)(t3 - t2) / 1e6;
        fprintf(info, "recovery open %u/%u: %.1f ms (checkpoint %.1f, replay %.1f, rebuild %.1f, "
                      "verify %.1f, other %.1f); replay %.3g records/s\n",
                run, cfg.runs, m[RC_OPEN_MS], m[RC_CKPT_MS], m[RC_REPLAY_MS], m[RC_REBUILD_MS],
                m[RC_VERIFY_MS], m[RC_OTHER_MS], m[RC_REPLAY_RATE]);
        fflush(info);
        check_stop();
    }
    remove_tree(dir);
}

/* ---- Reporting ------------------------------------------------------------ */

typedef struct machine {
    char os[3 * 65 + 4];
    char cpu[256];
    char load[64]; /* /proc/loadavg: 1, 5 and 15 minute averages */
    long nproc;
    double mem_gib;
    char fs[PATH_MAX + 400]; /* file system type of --dir */
} machine;

static void loadavg(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double l1, l5, l15;
    if (fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3)
        snprintf(buf, n, "%.2f %.2f %.2f", l1, l5, l15);
    fclose(f);
}

/* The mount (longest matching mount point in /proc/mounts) holding `path`. */
static void fs_of(const char *path, char *out, size_t n) {
    snprintf(out, n, "unknown");
    char real[PATH_MAX];
    if (!realpath(path, real)) return;
    FILE *f = fopen("/proc/mounts", "r");
    if (!f) return;
    char dev[256], mnt[PATH_MAX], type[64];
    size_t best = 0;
    while (fscanf(f, "%255s %4095s %63s %*[^\n]", dev, mnt, type) == 3) {
        size_t l = strlen(mnt);
        bool under = !strncmp(real, mnt, l) && (real[l] == '/' || real[l] == '\0' || l == 1);
        if (under && l >= best) {
            best = l;
            snprintf(out, n, "%s on %s (%s)", type, mnt, dev);
        }
    }
    fclose(f);
}

static void machine_get(machine *m) {
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(m->os, sizeof m->os, "%s %s %s", u.sysname, u.release, u.machine);
    else
        snprintf(m->os, sizeof m->os, "unknown");
    snprintf(m->cpu, sizeof m->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) && strncmp(line, "Model", 5) &&
                strncmp(line, "cpu model", 9) && strncmp(line, "Hardware", 8))
                continue;
            char *colon = strchr(line, ':');
            if (!colon) continue;
            colon++;
            while (*colon == ' ' || *colon == '\t') colon++;
            colon[strcspn(colon, "\n")] = '\0';
            if (*colon) {
                snprintf(m->cpu, sizeof m->cpu, "%s", colon);
                break;
            }
        }
        fclose(f);
    }
    loadavg(m->load, sizeof m->load);
    m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    m->mem_gib = pages > 0 && psz > 0 ? (double)pages * (double)psz / (1024.0 * 1024 * 1024) : 0;
    fs_of(cfg.dir, m->fs, sizeof m->fs);
}

static char *command_line(int argc, char **argv) {
    size_t len = 1;
    for (int i = 0; i < argc; i++) len += 3 + 4 * strlen(argv[i]);
    char *s = xmalloc(len), *p = s;
    for (int i = 0; i < argc; i++) {
        if (i) *p++ = ' ';
        bool quote = argv[i][0] == '\0' || strpbrk(argv[i], " \t\"'\\$`") != NULL;
        if (!quote) {
            p = stpcpy(p, argv[i]);
            continue;
        }
        *p++ = '\'';
        for (const char *q = argv[i]; *q; q++) {
            if (*q == '\'') p = stpcpy(p, "'\\''");
            else *p++ = *q;
        }
        *p++ = '\'';
    }
    *p = '\0';
    return s;
}

/* Metrics shown per throughput configuration (all in JSON). */
static const int tp_order_group[] = {
    TP_CALLS_PER_S, TP_CALLS_PER_S_LOOP, TP_RECORDS_PER_S, TP_SYNC_MS, TP_CALLS,
    TP_RECORDS_PER_CALL, TP_SYNCS, TP_SYNCS_PER_CALL, TP_CALLS_PER_SYNC, TP_MS_PER_SYNC,
    TP_BYTES_PER_CALL, TP_CHECKPOINTS, TP_LAT_MED_MS, TP_LAT_P99_MS, TP_LAT_MAX_MS,
    TP_LAT_SAMPLES, TP_POLL_GAP_MAX_MS, TP_LAT_CKPT_PCT, TP_LAT_MAX_NOCKPT_MS,
    TP_WAL_DELAY_MAX_MS, TP_CKPT_MS,
};
static const int tp_order_other[] = {
    TP_CALLS_PER_S, TP_CALLS_PER_S_LOOP, TP_RECORDS_PER_S, TP_US_PER_CALL, TP_SYNC_MS,
    TP_CALLS, TP_RECORDS_PER_CALL, TP_SYNCS, TP_SYNCS_PER_CALL, TP_CALLS_PER_SYNC,
    TP_MS_PER_SYNC, TP_BYTES_PER_CALL, TP_CHECKPOINTS, TP_WAL_DELAY_MAX_MS, TP_CKPT_MS,
};

/* The targets apply to GROUP mode with one thread. */
static metric_def tp_def_for(const tp_config *tc, int m) {
    metric_def d = tp_defs[m];
    if (tc->target && g_judge_tp && m == TP_CALLS_PER_S) {
        d.judge = T_MIN_MED;
        d.target = 1e6;
    } else if (tc->target && g_judge_tp && m == TP_LAT_MAX_MS) {
        d.judge = T_MAX_MAX;
        d.target = 10;
    }
    return d;
}

static void print_row(FILE *f, const metric_def *d, summary s, int met) {
    char a[32], b[32], c[32], t[48];
    fmt_num(a, sizeof a, s.med);
    fmt_num(b, sizeof b, s.min);
    fmt_num(c, sizeof c, s.max);
    fmt_target(t, sizeof t, d, met);
    fprintf(f, "  %-54s %10s %10s %10s  %-10s %s\n", d->label, a, b, c, d->unit, t);
}

static bool report_text(const tp_config *tcs, unsigned ntc, const rc_result *rr,
                        const rc_build *b) {
    FILE *f = stdout;
    bool all_met = true;
    int n_judged = 0;
    fprintf(f, "\nMedian over %u run%s (min and max alongside).\n", cfg.runs,
            cfg.runs == 1 ? "" : "s");
    if (ntc) {
        fprintf(f, "\n1. Durable mutation throughput: decode-like, %u sequences per thread, "
                   "append(1)+commit(1) per token,\n   a seal every %u tokens, close + reopen "
                   "every %u tokens; throughput includes the final pkv_sync().\n",
                TP_SEQS, BLOCK_SIZE, TP_SEQ_TOKENS);
    }
    double group1 = NAN, always1 = NAN;
    for (unsigned k = 0; k < ntc; k++) {
        const tp_config *tc = &tcs[k];
        fprintf(f, "\n%s\n", tc->title);
        fprintf(f, "  %-54s %10s %10s %10s  %-10s %s\n", "", "median", "min", "max", "unit",
                "target");
        bool grp = tc->mode == PKV_DURABLE_GROUP;
        const int *order = grp ? tp_order_group : tp_order_other;
        size_t n = grp ? sizeof tp_order_group / sizeof *tp_order_group
                       : sizeof tp_order_other / sizeof *tp_order_other;
        for (size_t i = 0; i < n; i++) {
            metric_def d = tp_def_for(tc, order[i]);
            summary s = summarize(&tc->res[0].m[order[i]], TP_COUNT, cfg.runs);
            int met = judged(&d, s);
            if (met == 0) all_met = false;
            if (met >= 0) n_judged++;
            print_row(f, &d, s, met);
            if (order[i] == TP_CALLS_PER_S && tc->target) group1 = s.med;
            if (order[i] == TP_CALLS_PER_S && tc->mode == PKV_DURABLE_ALWAYS) always1 = s.med;
        }
    }
    if (!isnan(group1) && !isnan(always1))
        fprintf(f, "\n  GROUP (1 thread) / ALWAYS (1 thread) throughput: %.0fx\n",
                group1 / always1);
    if (rr) {
        fprintf(f, "\n2. Recovery of a %" PRIu64 "-block cache: checkpoint + %" PRIu64
                   " log records after it; page cache warm (files just written).\n",
                cfg.capacity, b->records);
        fprintf(f, "  build: create %.0f ms; fill %" PRIu64 " blocks (%" PRIu64
                   " sequences, %" PRIu64 " calls) %.1f s; pkv_checkpoint %.2f s\n"
                   "         (checkpoint file %.1f MB, covers LSN %" PRIu64 "); %" PRIu64
                   " records after it in %.1f s (%" PRIu64 " calls, %" PRIu64 " evictions,\n"
                   "         %.1f MB of log in %" PRIu64 " segment files); %" PRIu64
                   " sequences left open; pkv_close %.0f ms\n",
                b->create_ms, b->sealed, b->fill_seqs, b->fill_calls, b->fill_s, b->ckpt_s,
                (double)b->ckpt_file_bytes / 1e6, b->ckpt_lsn, b->records, b->records_s,
                b->calls, b->evictions, (double)b->log_bytes / 1e6, b->log_files, b->open_seqs,
                b->close_ms);
        fprintf(f, "  recovered (first open): %" PRIu64 " records replayed, %" PRIu64
                   " sealed blocks, %" PRIu64 " sequences, %" PRIu64 " blocks dropped, %" PRIu64
                   " bad; note: \"%s\"\n\n",
                b->rec.records_replayed, b->rec.blocks_sealed, b->rec.sequences,
                b->rec.blocks_dropped, b->rec.seq_blocks_bad, b->rec.note);
        fprintf(f, "  %-54s %10s %10s %10s  %-10s %s\n", "", "median", "min", "max", "unit",
                "target");
        for (int m = 0; m < RC_COUNT; m++) {
            summary s = summarize(&rr[0].m[m], RC_COUNT, cfg.runs);
            int met = judged(&rc_defs[m], s);
            if (met == 0) all_met = false;
            if (met >= 0) n_judged++;
            print_row(f, &rc_defs[m], s, met);
        }
    }
    if ((ntc && !g_judge_tp) || (rr && !g_judge_rc))
        fprintf(f, "\nnot judged: %s%s%s (the targets are set for the defaults)\n",
                ntc && !g_judge_tp ? "part 1 (--group-commit-us/--checkpoint-mib changed)" : "",
                ntc && !g_judge_tp && rr && !g_judge_rc ? "; " : "",
                rr && !g_judge_rc ? "part 2 (--capacity/--records changed)" : "");
    fprintf(f, "\ntargets: %s\n",
            !n_judged ? "none judged" : all_met ? "all met" : "MISSED (see above)");
    return all_met;
}

static void json_metric(FILE *f, const metric_def *d, const double *v0, size_t stride,
                        bool *all_met, int *n_judged, bool comma) {
    summary s = summarize(v0, stride, cfg.runs);
    fprintf(f, "      \"%s\": {\"median\": ", d->key);
    json_num(f, s.med);
    fputs(", \"min\": ", f);
    json_num(f, s.min);
    fputs(", \"max\": ", f);
    json_num(f, s.max);
    fprintf(f, ", \"unit\": \"%s\", \"runs\": [", d->unit);
    for (unsigned i = 0; i < cfg.runs; i++) {
        if (i) fputs(", ", f);
        json_num(f, v0[i * stride]);
    }
    fputs("]", f);
    int met = judged(d, s);
    if (met >= 0) {
        *all_met = *all_met && met;
        (*n_judged)++;
        fprintf(f, ", \"target\": %.6g, \"judged_on\": \"%s\", \"met\": %s", d->target,
                d->judge == T_MAX_MAX ? "max" : "median", met ? "true" : "false");
    }
    fprintf(f, "}%s\n", comma ? "," : "");
}

static void report_json(const machine *mc, const char *cmd, double clock_ns, const char *load_end,
                        const tp_config *tcs, unsigned ntc, const rc_result *rr,
                        const rc_build *b) {
    FILE *f = stdout;
    bool all_met = true;
    int n_judged = 0;
    fprintf(f, "{\n  \"benchmark\": \"pkv-walbench\",\n  \"pagedkv_version\": \"%d.%d\",\n",
            PKV_VERSION_MAJOR, PKV_VERSION_MINOR);
    fputs("  \"command\": ", f);
    json_str(f, cmd);
    fputs(",\n  \"machine\": {\"os\": ", f);
    json_str(f, mc->os);
    fputs(", \"cpu\": ", f);
    json_str(f, mc->cpu);
    fputs(", \"loadavg_start\": ", f);
    json_str(f, mc->load);
    fputs(", \"loadavg_end\": ", f);
    json_str(f, load_end);
    fputs(", \"fs\": ", f);
    json_str(f, mc->fs);
    fprintf(f, ", \"nproc\": %ld, \"mem_gib\": %.1f, \"clock_overhead_ns\": %.0f},\n", mc->nproc,
            mc->mem_gib, clock_ns);
    fprintf(f, "  \"config\": {\"capacity\": %" PRIu64 ", \"block_size\": %u, \"runs\": %u, "
               "\"seconds\": %.3f, \"threads\": %u, \"always_calls\": %" PRIu64
               ", \"records\": %" PRIu64 ", \"group_commit_us\": %u, \"checkpoint_bytes\": %"
               PRIu64 ", \"payload\": %s, \"prefault\": %s, \"seed\": %" PRIu64 ", \"dir\": ",
            cfg.capacity, BLOCK_SIZE, cfg.runs, cfg.seconds_x1000 / 1000.0, cfg.threads,
            cfg.always_calls, cfg.records, cfg.group_commit_us ? cfg.group_commit_us : 2000,
            cfg.ckpt_bytes ? cfg.ckpt_bytes : (uint64_t)64 << 20,
            cfg.payload ? "true" : "false", cfg.prefault ? "true" : "false", cfg.seed);
    json_str(f, cfg.dir);
    fputs("},\n  \"throughput\": [\n", f);
    for (unsigned k = 0; k < ntc; k++) {
        const tp_config *tc = &tcs[k];
        fprintf(f, "    {\"config\": \"%s\", \"mode\": \"%s\", \"threads\": %u, "
                   "\"max_calls\": %" PRIu64 ",\n",
                tc->key, mode_name(tc->mode), tc->threads, tc->max_calls);
        for (int m = 0; m < TP_COUNT; m++) {
            metric_def d = tp_def_for(tc, m);
            json_metric(f, &d, &tc->res[0].m[m], TP_COUNT, &all_met, &n_judged,
                        m + 1 < TP_COUNT);
        }
        fprintf(f, "    }%s\n", k + 1 < ntc ? "," : "");
    }
    fputs("  ],\n  \"recovery\": ", f);
    if (!rr) {
        fputs("null,\n", f);
    } else {
        fprintf(f, "{\n    \"build\": {\"create_ms\": %.1f, \"fill_s\": %.3f, \"fill_sequences\": "
                   "%" PRIu64 ", \"fill_calls\": %" PRIu64 ", \"blocks_sealed\": %" PRIu64
                   ", \"checkpoint_s\": %.3f, \"checkpoint_lsn\": %" PRIu64
                   ", \"checkpoint_file_bytes\": %" PRIu64 ", \"records\": %" PRIu64
                   ", \"records_s\": %.3f, \"record_calls\": %" PRIu64 ", \"evictions\": %" PRIu64
                   ", \"log_bytes\": %" PRIu64 ", \"log_files\": %" PRIu64
                   ", \"open_sequences\": %" PRIu64 ", \"close_ms\": %.1f},\n",
                b->create_ms, b->fill_s, b->fill_seqs, b->fill_calls, b->sealed, b->ckpt_s,
                b->ckpt_lsn, b->ckpt_file_bytes, b->records, b->records_s, b->calls, b->evictions,
                b->log_bytes, b->log_files, b->open_seqs, b->close_ms);
        fprintf(f, "    \"recovered\": {\"records_replayed\": %" PRIu64 ", \"checkpoint_lsn\": %"
                   PRIu64 ", \"last_lsn\": %" PRIu64 ", \"blocks_sealed\": %" PRIu64
                   ", \"sequences\": %" PRIu64 ", \"blocks_dropped\": %" PRIu64
                   ", \"seq_blocks_bad\": %" PRIu64 ", \"note\": ",
                b->rec.records_replayed, b->rec.checkpoint_lsn, b->rec.last_lsn,
                b->rec.blocks_sealed, b->rec.sequences, b->rec.blocks_dropped,
                b->rec.seq_blocks_bad);
        json_str(f, b->rec.note);
        fputs("},\n    \"page_cache\": \"warm\",\n    \"metrics\": {\n", f);
        for (int m = 0; m < RC_COUNT; m++)
            json_metric(f, &rc_defs[m], &rr[0].m[m], RC_COUNT, &all_met, &n_judged,
                        m + 1 < RC_COUNT);
        fputs("    }\n  },\n", f);
    }
    fprintf(f, "  \"targets_judged\": {\"throughput\": %s, \"recovery\": %s},\n",
            ntc && g_judge_tp ? "true" : "false", rr && g_judge_rc ? "true" : "false");
    fprintf(f, "  \"targets_met\": %s\n}\n", !n_judged ? "null" : all_met ? "true" : "false");
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-walbench [options]\n"
            "Measures durable mutation throughput (group commit vs one fdatasync per call),\n"
            "the delay until a mutation is durable, and recovery time of a large cache.\n"
            "\n"
            "  --dir DIR           where to create the temporary directory (default /tmp);\n"
            "                      it is removed at the end (each arena is capacity x 4 KiB)\n"
            "  --runs N            runs per configuration and timed opens (default 5)\n"
            "  --seconds S         length of each throughput run (default 5; decimals allowed)\n"
            "  --threads N         also run GROUP mode with N threads (default 2; 1: skip)\n"
            "  --capacity N        cache capacity in blocks (default 1048576, min %u)\n"
            "  --records N         log records after the checkpoint (default 1000000)\n"
            "  --always-calls N    calls per ALWAYS-mode run (default 2000)\n"
            "  --group-commit-us N pkv_options.group_commit_us (default 0: the library's 2000)\n"
            "  --checkpoint-mib N  pkv_options.checkpoint_bytes in MiB for part 1 (default 0:\n"
            "                      the library's 64 MiB)\n"
            "  --payload           also write each token's K/V row through pkv_kv()\n"
            "  --prefault          open every cache with PKV_OPEN_PREFAULT\n"
            "  --only WHAT         run only 'throughput' or 'recovery'\n"
            "  --seed N            token seed (default 1)\n"
            "  --json              print a JSON summary instead of the text report\n"
            "  -h, --help          print this message\n",
            MIN_CAPACITY);
}

static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-walbench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    usage(stderr);
    exit(2);
}

static uint64_t parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max) {
    errno = 0;
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        bad_usage("%s: expected a number, got '%s'", opt, s ? s : "");
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0') bad_usage("%s: expected a number, got '%s'", opt, s);
    if (v < min || v > max)
        bad_usage("%s: %s is out of range [%" PRIu64 ", %" PRIu64 "]", opt, s, min, max);
    return (uint64_t)v;
}

static uint32_t parse_seconds(const char *s) {
    errno = 0;
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        bad_usage("--seconds: expected a number, got '%s'", s ? s : "");
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !(v >= 0.01 && v <= 3600))
        bad_usage("--seconds: expected a number of seconds in [0.01, 3600], got '%s'", s);
    return (uint32_t)(v * 1000 + 0.5);
}

int main(int argc, char **argv) {
    enum { O_DIR = 256, O_RUNS, O_SECONDS, O_THREADS, O_CAPACITY, O_RECORDS, O_ALWAYS_CALLS,
           O_GROUP_US, O_CKPT_MIB, O_PAYLOAD, O_PREFAULT, O_ONLY, O_SEED, O_JSON };
    static const struct option longopts[] = {
        {"dir", required_argument, NULL, O_DIR},
        {"runs", required_argument, NULL, O_RUNS},
        {"seconds", required_argument, NULL, O_SECONDS},
        {"threads", required_argument, NULL, O_THREADS},
        {"capacity", required_argument, NULL, O_CAPACITY},
        {"records", required_argument, NULL, O_RECORDS},
        {"always-calls", required_argument, NULL, O_ALWAYS_CALLS},
        {"group-commit-us", required_argument, NULL, O_GROUP_US},
        {"checkpoint-mib", required_argument, NULL, O_CKPT_MIB},
        {"payload", no_argument, NULL, O_PAYLOAD},
        {"prefault", no_argument, NULL, O_PREFAULT},
        {"only", required_argument, NULL, O_ONLY},
        {"seed", required_argument, NULL, O_SEED},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (o) {
        case O_DIR:
            if (!optarg[0]) bad_usage("--dir: empty path");
            cfg.dir = optarg;
            break;
        case O_RUNS: cfg.runs = (uint32_t)parse_u64("--runs", optarg, 1, 1000); break;
        case O_SECONDS: cfg.seconds_x1000 = parse_seconds(optarg); break;
        case O_THREADS: cfg.threads = (uint32_t)parse_u64("--threads", optarg, 1, 64); break;
        case O_CAPACITY:
            cfg.capacity = parse_u64("--capacity", optarg, MIN_CAPACITY, 1ull << 31);
            break;
        case O_RECORDS: cfg.records = parse_u64("--records", optarg, 1, 1000000000); break;
        case O_ALWAYS_CALLS:
            cfg.always_calls = parse_u64("--always-calls", optarg, 1, 100000000);
            break;
        case O_GROUP_US:
            cfg.group_commit_us = (uint32_t)parse_u64("--group-commit-us", optarg, 0, 10000000);
            break;
        case O_CKPT_MIB:
            cfg.ckpt_bytes = parse_u64("--checkpoint-mib", optarg, 0, 1ull << 30) << 20;
            break;
        case O_PAYLOAD: cfg.payload = true; break;
        case O_PREFAULT: cfg.prefault = true; break;
        case O_ONLY:
            if (!strcmp(optarg, "throughput")) cfg.phase = PH_THROUGHPUT;
            else if (!strcmp(optarg, "recovery")) cfg.phase = PH_RECOVERY;
            else bad_usage("--only: expected 'throughput' or 'recovery', got '%s'", optarg);
            break;
        case O_SEED: cfg.seed = parse_u64("--seed", optarg, 0, UINT64_MAX); break;
        case O_JSON: cfg.json = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2; /* getopt has named the problem */
        }
    }
    if (optind < argc) bad_usage("unexpected argument '%s'", argv[optind]);
    /* Each throughput thread holds up to TP_SEQS sequences of TP_SEQ_TOKENS tokens. */
    const uint64_t tp_blocks = (uint64_t)cfg.threads * TP_SEQS * (TP_SEQ_TOKENS / BLOCK_SIZE);
    if (cfg.phase != PH_RECOVERY && cfg.capacity < 2 * tp_blocks)
        bad_usage("--capacity %" PRIu64 " is too small for %u threads: at least %" PRIu64
                  " blocks are needed", cfg.capacity, cfg.threads, 2 * tp_blocks);

    g_judge_tp = (cfg.group_commit_us == 0 || cfg.group_commit_us == 2000) &&
                 (cfg.ckpt_bytes == 0 || cfg.ckpt_bytes == 64ull << 20);
    g_judge_rc = cfg.capacity == 1u << 20 && cfg.records == 1000000;
    if (!g_judge_rc)
        for (int m = 0; m < RC_COUNT; m++) rc_defs[m].judge = T_NONE;

    machine mc;
    machine_get(&mc);
    const double clock_ns = clock_overhead_ns();
    char *cmd = command_line(argc, argv);
    FILE *info = cfg.json ? stderr : stdout; /* per-run lines go to stderr with --json */

    int n = snprintf(g_root, sizeof g_root, "%s/pkv-walbench-XXXXXX", cfg.dir);
    if (n < 0 || (size_t)n >= sizeof g_root) {
        g_root[0] = '\0';
        die("--dir path too long");
    }
    if (!mkdtemp(g_root)) {
        int e = errno;
        g_root[0] = '\0';
        die("cannot create a directory under %s: %s", cfg.dir, strerror(e));
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* 512-byte blocks: a new arena packs them eight to a page (docs/format.md) */
    const double arena_gib = (4096.0 + 512.0 * (double)cfg.capacity) / (1024.0 * 1024 * 1024);
    const uint32_t gc_us = cfg.group_commit_us ? cfg.group_commit_us : 2000;
    if (!cfg.json) {
        printf("pkv-walbench (pagedkv %d.%d durability and recovery)\n", PKV_VERSION_MAJOR,
               PKV_VERSION_MINOR);
        printf("command:  %s\n", cmd);
        printf("machine:  %s; CPU: %s; %ld CPUs online; %.1f GiB RAM; load average %s\n", mc.os,
               mc.cpu, mc.nproc, mc.mem_gib, mc.load);
        printf("storage:  %s under %s: %s (removed at exit)\n", mc.fs, cfg.dir, g_root);
        printf("geometry: capacity %" PRIu64 " blocks x %u tokens; 1 layer, 1 KV head, head_dim "
               "8, f16; 512 B payload in a 512 B slot; arena %.2f GiB; payload %s\n",
               cfg.capacity, BLOCK_SIZE, arena_gib,
               cfg.payload ? "written through pkv_kv" : "not written");
        if (cfg.ckpt_bytes)
            printf("log:      group_commit_us %u; checkpoint_bytes %" PRIu64 " MiB in part 1; %s\n",
                   gc_us, cfg.ckpt_bytes >> 20, cfg.prefault ? "PKV_OPEN_PREFAULT" : "no prefault");
        else
            printf("log:      group_commit_us %u; checkpoint_bytes default (64 MiB) in part 1; "
                   "%s\n", gc_us, cfg.prefault ? "PKV_OPEN_PREFAULT" : "no prefault");
        printf("runs:     %u; throughput runs of %.2f s (ALWAYS: %" PRIu64
               " calls); clock_gettime costs ~%.0f ns\n\n",
               cfg.runs, cfg.seconds_x1000 / 1000.0, cfg.always_calls, clock_ns);
        fflush(stdout);
    } else {
        fprintf(stderr, "pkv-walbench: working in %s (removed at exit)\n", g_root);
    }

    /* Part 1. */
    tp_config tcs[4];
    unsigned ntc = 0;
    if (cfg.phase != PH_RECOVERY) {
        static char t_group1[96], t_groupn[96];
        snprintf(t_group1, sizeof t_group1, "GROUP (group_commit_us %u), 1 thread", gc_us);
        snprintf(t_groupn, sizeof t_groupn, "GROUP (group_commit_us %u), %u threads", gc_us,
                 cfg.threads);
        tcs[ntc++] = (tp_config){"none-1", "NONE (reference: never synced), 1 thread",
                                 PKV_DURABLE_NONE, 1, 0, false, NULL};
        tcs[ntc++] = (tp_config){"group-1", t_group1, PKV_DURABLE_GROUP, 1, 0, true, NULL};
        if (cfg.threads > 1)
            tcs[ntc++] = (tp_config){"group-n", t_groupn, PKV_DURABLE_GROUP, cfg.threads, 0,
                                     false, NULL};
        tcs[ntc++] = (tp_config){"always-1", "ALWAYS (one fdatasync per call), 1 thread",
                                 PKV_DURABLE_ALWAYS, 1, cfg.always_calls, false, NULL};
        for (unsigned k = 0; k < ntc; k++) tcs[k].res = xcalloc(cfg.runs, sizeof(tp_result));
        /* Interleave the configurations so slow drift of the machine hits all alike. */
        for (unsigned run = 1; run <= cfg.runs; run++)
            for (unsigned k = 0; k < ntc; k++) tp_run(&tcs[k], run, &tcs[k].res[run - 1], info);
    }

    /* Part 2. */
    rc_result *rr = NULL;
    rc_build build;
    memset(&build, 0, sizeof build);
    if (cfg.phase != PH_THROUGHPUT) {
        rr = xcalloc(cfg.runs, sizeof *rr);
        recovery(rr, &build, info);
    }

    char load_end[64];
    loadavg(load_end, sizeof load_end);
    if (cfg.json) {
        report_json(&mc, cmd, clock_ns, load_end, tcs, ntc, rr, &build);
    } else {
        report_text(tcs, ntc, rr, &build);
        printf("load average at the end: %s\n", load_end);
    }

    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s", g_root);
    cleanup();
    if (!cfg.json) printf("removed %s\n", root);
    for (unsigned k = 0; k < ntc; k++) free(tcs[k].res);
    free(rr);
    free(cmd);
    return 0;
}

/*
 * pkv-bench.c — core-engine benchmark of pagedkv.
 *
 * Each run creates a fresh cache (default 1M blocks of 16 tokens, a tiny geometry:
 * 1 layer, 1 KV head, head_dim 8, f16, so one block slot is one 4 KiB page and the
 * arena is 4 GiB of preallocated file under /tmp), then:
 *
 *  0. times decode (append 1 + commit 1 per token) on the empty cache, for reference,
 *     and the same tokens again (a repeated generation: every block dedupes);
 *  1. replays a seeded synthetic multi-turn chat workload: 8 shared system prompts
 *     of 1k-4k tokens picked with a Zipf skew; conversations whose every turn
 *     re-opens the whole history as the prompt (hitting the cached prefix),
 *     prefills the uncached tail and the new user message in 512-token calls,
 *     decodes the answer one token at a time (append 1 + commit 1) and closes; one
 *     turn in 8 forks 2-4 parallel samples after the prompt and decodes each;
 *  2. on the cache the workload left behind (full, so new blocks come from
 *     eviction), times the core operations, each amortized over many calls per
 *     clock reading: prefix lookup+attach of a fully cached 32k-token prompt, its
 *     close, decode, speculative decode (4 drafts, 2 accepted) and prefill
 *     append+commit, the commit that seals a block, fork,
 *     the copy-on-write append after a fork, and the close of a forked child;
 *  3. times pkv_metrics_text (the Prometheus text a scraper fetches) on that cache.
 * With --scrape-ms N a thread calls pkv_metrics_text every N ms while the cache is
 * open, as a Prometheus scraping the endpoint would (compare the decode rows).
 * With --tier-nodes HOST:PORT a shared tier (docs/remote.md) on that Redis is
 * attached for decode loops (append+commit, and one call per step) with
 * publishing on, and the same loops run without a tier on the same cache, in
 * an ABBA order (bench/tier-decode.sh starts a server).
 *
 * Every cost printed is the median over --runs runs (min and max are shown too).
 * The cache directory is created under --dir (default /tmp) and removed at the end.
 * Any pkv_* error ends the program with status 1 and pkv_strerror()/pkv_last_error();
 * a bad command line gives the usage and status 2.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pagedkv.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- Workload shape ------------------------------------------------------ */

#define VOCAB          128256u /* token ids are drawn uniformly below this */
#define N_SYS_PROMPTS  8
#define SYS_MIN        1024u
#define SYS_MAX        4096u
#define USER_MIN       16u   /* tokens of a user message */
#define USER_MAX       256u
#define GEN_MIN        32u   /* tokens of a generated answer */
#define GEN_MAX        512u
#define FORK_ONE_IN    8u    /* one turn in 8 samples in parallel ... */
#define SAMPLES_MIN    2u    /* ... 2 to 4 samples */
#define SAMPLES_MAX    4u
#define CONCURRENCY    512u  /* conversations in flight; new users replace finished ones */
#define PREFILL_CHUNK  512u  /* tokens per append/commit call in prefill */

/* ---- Micro-benchmark sizes ------------------------------------------------ */

#define LONG_PROMPT    32768u /* the "32k-token prompt" */
#define ATTACH_REPS    256u   /* open+close pairs of the cached 32k prompt */
#define DECODE_TOKENS  (1u << 20)
#define PREFILL_TOKENS (1u << 21)
#define BATCH_SEQS     64u    /* sequences decoded round-robin in the seal split */
#define BATCH_BLOCKS   64u    /* blocks each of them grows per batch */
#define BATCH_ROUNDS   16u
#define FORK_CHILDREN  256u
#define FORK_EXTRA     8u     /* decoded tokens after the 32k prompt before forking */

/* ---- Command line ---------------------------------------------------------- */

static struct config {
    uint64_t capacity;
    uint32_t block_size;
    uint64_t seed;
    const char *dir;
    uint32_t users, turns, runs;
    bool payload, json, check;
    pkv_durability durability; /* --durability (default: the library's, GROUP) */
    bool prefault;             /* --prefault: open with PKV_OPEN_PREFAULT */
    bool decode_only;          /* --only decode: just the decode micro-benchmarks */
    uint32_t scrape_ms;        /* --scrape-ms: a scraper thread's period (0: none) */
    const char *tier_nodes;    /* --tier-nodes: decode with a tier publishing (NULL: not) */
    uint32_t tier_max_depth;   /* --tier-max-depth: its publish_max_depth */
    bool tier_on_hit;          /* --tier-on-hit: PKV_TIER_PUBLISH_ON_HIT */
} cfg = {
    .capacity = 1u << 20,
    .block_size = 16,
    .seed = 1,
    .dir = "/tmp",
    .users = 3000,
    .turns = 16,
    .runs = 5,
    .durability = PKV_DURABLE_GROUP,
};

static const char *durability_name(pkv_durability d) {
    switch (d) {
    case PKV_DURABLE_GROUP: return "group";
    case PKV_DURABLE_NONE: return "none";
    case PKV_DURABLE_ALWAYS: return "always";
    }
    return "?";
}

/* ---- Global state for errors and clean-up -------------------------------- */

static pkv_cache *g_cache;
static char g_root[PATH_MAX - 16]; /* our temporary directory (mkdtemp) */
static char g_cachedir[PATH_MAX]; /* g_root/cache: the pagedkv cache directory */
static char g_phase[160] = "start-up";
static volatile sig_atomic_t g_stop;

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "pkv-bench: warning: cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

static void remove_tree(const char *path) {
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void cleanup(void) {
    if (g_cache) {
        pkv_close(g_cache);
        g_cache = NULL;
    }
    if (g_root[0]) {
        remove_tree(g_root);
        g_root[0] = '\0';
    }
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-bench: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cleanup();
    exit(1);
}

static _Noreturn void die_pkv(int rc, const char *call, int line) {
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", pkv_last_error()); /* before any other call */
    fprintf(stderr, "pkv-bench: error during %s: %s failed (pkv-bench.c:%d): %s (%d)%s%s\n",
            g_phase, call, line, pkv_strerror(rc), rc, detail[0] ? ": " : "", detail);
    if (rc == PKV_EFULL)
        fprintf(stderr, "pkv-bench: hint: --capacity %" PRIu64 " blocks is too small\n",
                cfg.capacity);
    cleanup();
    exit(1);
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
        fprintf(stderr, "pkv-bench: interrupted; removing %s\n", g_root);
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

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
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

/* Uniform in [0, n). */
static inline uint32_t rng_below(rng *r, uint32_t n) {
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* Uniform in [lo, hi]. */
static inline uint32_t rng_range(rng *r, uint32_t lo, uint32_t hi) {
    return lo + rng_below(r, hi - lo + 1);
}

static inline uint32_t rng_token(rng *r) { return rng_below(r, VOCAB); }

/* Cost of one clock reading: the median gap between back-to-back readings. */
static double clock_overhead_ns(void) {
    enum { N = 2001 };
    static uint64_t d[N];
    uint64_t prev = now_ns();
    for (int i = 0; i < N; i++) {
        uint64_t t = now_ns();
        d[i] = t - prev;
        prev = t;
    }
    for (int i = 1; i < N; i++) /* insertion sort: small and run once */
        for (int j = i; j > 0 && d[j - 1] > d[j]; j--) {
            uint64_t x = d[j];
            d[j] = d[j - 1];
            d[j - 1] = x;
        }
    return (double)d[N / 2];
}

static void fill_tokens(rng *r, uint32_t *t, size_t n) {
    for (size_t i = 0; i < n; i++) t[i] = rng_token(r);
}

/* ---- The benchmark context -------------------------------------------------- */

typedef struct bench {
    pkv_cache *c;
    pkv_cache_info info;
    uint64_t next_id; /* sequence ids are never reused within a run */
    uint64_t calls;   /* pkv_* calls made by the workload */
    pkv_slot *slots;  /* PREFILL_CHUNK entries */
} bench;

/* Write a recognizable K and V row for each slot through pkv_kv(). */
static void write_payload(bench *b, const pkv_slot *slots, const uint32_t *tokens, size_t n) {
    const pkv_cache_info *in = &b->info;
    uint64_t row = (uint64_t)in->head_dim * in->elem_size;
    uint8_t buf[4096];
    for (size_t i = 0; i < n; i++) {
        for (uint32_t l = 0; l < in->num_layers; l++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < in->num_kv_heads; h++) {
                    uint8_t *p = pkv_kv(b->c, slots[i].block, l, (pkv_kind)k, h);
                    if (!p)
                        die("pkv_kv(block %" PRIu32 ", layer %" PRIu32 ", head %" PRIu32
                            ") returned NULL during %s",
                            slots[i].block, l, h, g_phase);
                    p += (uint64_t)slots[i].offset * row;
                    uint64_t done = 0;
                    while (done < row) {
                        uint64_t len = row - done < sizeof buf ? row - done : sizeof buf;
                        for (uint64_t j = 0; j < len; j++)
                            buf[j] = (uint8_t)(tokens[i] * 31u + j + (uint32_t)k * 7u + l + h);
                        memcpy(p + done, buf, len);
                        done += len;
                    }
                }
    }
}

/* Append and commit tokens[0..n) to sequence id in calls of at most PREFILL_CHUNK. */
static void prefill(bench *b, uint64_t id, const uint32_t *tokens, size_t n, bool payload) {
    while (n > 0) {
        size_t k = n < PREFILL_CHUNK ? n : PREFILL_CHUNK;
        PKV(pkv_seq_append(b->c, id, tokens, k, b->slots));
        if (payload) write_payload(b, b->slots, tokens, k);
        PKV(pkv_seq_commit(b->c, id, k));
        b->calls += 2;
        tokens += k;
        n -= k;
    }
}

/* One decode step: append one token, (write its K/V,) commit it. */
static inline void decode_step(bench *b, uint64_t id, uint32_t tok, bool payload) {
    pkv_slot slot;
    PKV(pkv_seq_append(b->c, id, &tok, 1, &slot));
    if (payload) write_payload(b, &slot, &tok, 1);
    PKV(pkv_seq_commit(b->c, id, 1));
}

static void run_check(bench *b, const char *when) {
    char why[512] = "";
    int rc = pkv_check(b->c, why, sizeof why);
    if (rc < 0) {
        snprintf(g_phase, sizeof g_phase, "pkv_check %s", when);
        fprintf(stderr, "pkv-bench: pkv_check %s: %s\n", when, why);
        die_pkv(rc, "pkv_check(cache, why, sizeof why)", __LINE__);
    }
}

/* ---- Metrics ------------------------------------------------------------------ */

enum {
    M_OPEN_CREATE_MS,
    M_WL_SECONDS,
    M_WL_TURNS_PER_S,
    M_WL_TOKENS_PER_S,
    M_WL_CALLS_PER_S,
    M_ATTACH_NS_BLOCK,
    M_ATTACH_US_CALL,
    M_CLOSE_NS_BLOCK,
    M_DECODE_NS_TOKEN,
    M_STEP_FULL_NS_TOKEN,
    M_DECODE_EMPTY_NS_TOKEN,
    M_DECODE_REPEAT_NS_TOKEN,
    M_DECODE_KV_NS_TOKEN,
    M_STEP_NS_TOKEN,
    M_STEP_KV_NS_TOKEN,
    M_SPEC_NS_TOKEN,
    M_PREFILL_NS_TOKEN,
    M_BATCH_NS_TOKEN,
    M_STEP_BATCH_NS_TOKEN,
    M_APPEND_NS,
    M_APPEND_ALLOC_NS,
    M_COMMIT_NS,
    M_COMMIT_SEAL_NS,
    M_SEAL_NS_BLOCK,
    M_FORK_US_CALL,
    M_FORK_NS_BLOCK,
    M_COW_APPEND_NS,
    M_CLOSE_CHILD_NS_BLOCK,
    M_METRICS_TEXT_US,
    M_DECODE_NOTIER_NS_TOKEN,
    M_DECODE_TIER_NS_TOKEN,
    M_STEP_NOTIER_NS_TOKEN,
    M_STEP_TIER_NS_TOKEN,
    M_COUNT
};

typedef struct metric_def {
    const char *key;   /* JSON key */
    const char *label; /* text report */
    const char *unit;
    double target;     /* upper bound; 0: none */
} metric_def;

static const metric_def metric_defs[M_COUNT] = {
    [M_OPEN_CREATE_MS] = {"open_create_ms", "pkv_open: create + preallocate the arena", "ms", 0},
    [M_WL_SECONDS] = {"workload_seconds", "workload: wall time", "s", 0},
    [M_WL_TURNS_PER_S] = {"workload_turns_per_s", "workload: turns", "turns/s", 0},
    [M_WL_TOKENS_PER_S] = {"workload_tokens_per_s",
                           "workload: tokens appended+committed (prefill+decode)", "tokens/s", 0},
    [M_WL_CALLS_PER_S] = {"workload_calls_per_s", "workload: pkv_* calls", "calls/s", 0},
    [M_ATTACH_NS_BLOCK] = {"prefix_attach_ns_per_block",
                           "(a) prefix lookup+attach, cached 32k prompt (pkv_seq_open)",
                           "ns/block", 100},
    [M_ATTACH_US_CALL] = {"prefix_attach_us_per_call", "    same, per pkv_seq_open call", "us/call",
                          0},
    [M_CLOSE_NS_BLOCK] = {"close_ns_per_block", "(e) close after attach (ref 1->0, now cached)",
                          "ns/block", 0},
    [M_DECODE_NS_TOKEN] = {"decode_ns_per_token",
                           "(b) decode append(1)+commit(1), one sequence", "ns/token", 50},
    [M_STEP_FULL_NS_TOKEN] = {"decode_step_ns_per_token",
                              "    same in one call per step, pkv_seq_commit_append(1, 1)",
                              "ns/token", 0},
    [M_DECODE_EMPTY_NS_TOKEN] = {"decode_empty_cache_ns_per_token",
                                 "    same, on the empty cache before the workload", "ns/token",
                                 0},
    [M_DECODE_REPEAT_NS_TOKEN] = {"decode_repeat_empty_cache_ns_per_token",
                                  "    same tokens again, empty cache: every block dedupes",
                                  "ns/token", 0},
    [M_DECODE_KV_NS_TOKEN] = {"decode_kv_empty_cache_ns_per_token",
                              "    same, empty cache, K/V row written between append and commit",
                              "ns/token", 0},
    [M_STEP_NS_TOKEN] = {"decode_step_empty_cache_ns_per_token",
                         "    decode step in one call, pkv_seq_commit_append(1, 1), empty cache",
                         "ns/token", 0},
    [M_STEP_KV_NS_TOKEN] = {"decode_step_kv_empty_cache_ns_per_token",
                            "    same, K/V row written before each step's commit",
                            "ns/token", 0},
    [M_SPEC_NS_TOKEN] = {"spec_decode_ns_per_token",
                         "(b) speculative decode: append 4 drafts, commit 2, truncate 2",
                         "ns/token", 0},
    [M_PREFILL_NS_TOKEN] = {"prefill_ns_per_token", "(b) prefill append(512)+commit(512)",
                            "ns/token", 0},
    [M_BATCH_NS_TOKEN] = {"decode_batch_ns_per_token",
                          "(c) decode append(1)+commit(1), 64 seqs round-robin", "ns/token", 0},
    [M_STEP_BATCH_NS_TOKEN] = {"decode_step_batch_ns_per_token",
                               "(c) decode step, 64 seqs in one pkv_seq_step_batch call",
                               "ns/token", 0},
    [M_APPEND_NS] = {"append_ns", "    append(1) within a block", "ns/call", 0},
    [M_APPEND_ALLOC_NS] = {"append_alloc_ns", "    append(1) that takes a new block",
                           "ns/call", 0},
    [M_COMMIT_NS] = {"commit_ns", "    commit(1) that does not seal", "ns/call", 0},
    [M_COMMIT_SEAL_NS] = {"commit_seal_ns", "    commit(1) that seals the block", "ns/call",
                          0},
    [M_SEAL_NS_BLOCK] = {"seal_ns_per_block", "(c) seal (sealing commit - plain commit)",
                         "ns/block", 0},
    [M_FORK_US_CALL] = {"fork_us_per_call", "(d) fork of a 32k+8-token sequence", "us/call", 0},
    [M_FORK_NS_BLOCK] = {"fork_ns_per_block", "    same, per block shared", "ns/block", 0},
    [M_COW_APPEND_NS] = {"cow_append_ns", "    first append(1) of a child (copy-on-write)",
                         "ns/call", 0},
    [M_CLOSE_CHILD_NS_BLOCK] = {"close_child_ns_per_block",
                                "(e) close of a forked child (ref 2->1)", "ns/block", 0},
    [M_METRICS_TEXT_US] = {"metrics_text_us_per_call",
                           "(f) pkv_metrics_text, the Prometheus text (~12 KB)", "us/call", 50},
    [M_DECODE_NOTIER_NS_TOKEN] = {"decode_notier_ns_per_token",
                                  "(b) decode append(1)+commit(1), no tier (--tier-nodes pair)",
                                  "ns/token", 0},
    [M_DECODE_TIER_NS_TOKEN] = {"decode_tier_ns_per_token",
                                "    same, tier attached, publishing", "ns/token", 0},
    [M_STEP_NOTIER_NS_TOKEN] = {"decode_step_notier_ns_per_token",
                                "    decode step in one call, no tier", "ns/token", 0},
    [M_STEP_TIER_NS_TOKEN] = {"decode_step_tier_ns_per_token",
                              "    same, tier attached, publishing", "ns/token", 0},
};

typedef struct workload_counts {
    uint64_t turns, forks, samples;
    uint64_t prompt_tokens, cached_tokens; /* over all pkv_seq_open calls */
    uint64_t prefill_tokens, decode_tokens;
    uint64_t calls;
} workload_counts;

typedef struct run_result {
    double m[M_COUNT];
    workload_counts wl;
    pkv_stats st_workload; /* right after the workload */
    pkv_stats st_final;    /* at the end of the run */
    pkv_stats st_tier;     /* --tier-nodes: before the tier's detach (its counters) */
    uint64_t attach_blocks;  /* blocks attached per 32k open */
} run_result;

/* ---- The workload ------------------------------------------------------------ */

typedef struct conv {
    uint32_t *hist; /* system prompt + every user message and chosen answer so far */
    size_t len, cap;
    uint32_t turns_left;
    uint32_t user;
} conv;

static void conv_reserve(conv *cv, size_t extra) {
    if (cv->len + extra <= cv->cap) return;
    size_t cap = cv->cap ? cv->cap : 4096;
    while (cap < cv->len + extra) cap *= 2;
    cv->hist = xrealloc(cv->hist, cap * sizeof *cv->hist);
    cv->cap = cap;
}

typedef struct sys_prompts {
    uint32_t *tok[N_SYS_PROMPTS];
    uint32_t len[N_SYS_PROMPTS];
    double cdf[N_SYS_PROMPTS]; /* Zipf(1) popularity */
} sys_prompts;

static void sys_prompts_make(sys_prompts *sp, uint64_t seed) {
    rng r;
    rng_init(&r, seed, 1);
    double sum = 0;
    for (int i = 0; i < N_SYS_PROMPTS; i++) sum += 1.0 / (i + 1);
    double acc = 0;
    for (int i = 0; i < N_SYS_PROMPTS; i++) {
        sp->len[i] = rng_range(&r, SYS_MIN, SYS_MAX);
        sp->tok[i] = xmalloc(sp->len[i] * sizeof(uint32_t));
        fill_tokens(&r, sp->tok[i], sp->len[i]);
        acc += 1.0 / (i + 1) / sum;
        sp->cdf[i] = acc;
    }
    sp->cdf[N_SYS_PROMPTS - 1] = 1.0;
}

static void sys_prompts_free(sys_prompts *sp) {
    for (int i = 0; i < N_SYS_PROMPTS; i++) free(sp->tok[i]);
}

static uint32_t sys_pick(const sys_prompts *sp, rng *r) {
    double u = (double)(rng_next(r) >> 11) * 0x1.0p-53;
    for (uint32_t i = 0; i < N_SYS_PROMPTS; i++)
        if (u < sp->cdf[i]) return i;
    return N_SYS_PROMPTS - 1;
}

static void conv_start(conv *cv, const sys_prompts *sp, rng *r, uint32_t user) {
    uint32_t s = sys_pick(sp, r);
    cv->len = 0;
    conv_reserve(cv, sp->len[s]);
    memcpy(cv->hist, sp->tok[s], sp->len[s] * sizeof(uint32_t));
    cv->len = sp->len[s];
    cv->turns_left = cfg.turns;
    cv->user = user;
}

/* One turn: re-open the whole history plus the new user message as the prompt,
 * prefill what is not cached, optionally fork parallel samples, decode, close. */
static void do_turn(bench *b, conv *cv, rng *r, workload_counts *wc) {
    uint32_t ulen = rng_range(r, USER_MIN, USER_MAX);
    conv_reserve(cv, ulen + GEN_MAX);
    fill_tokens(r, cv->hist + cv->len, ulen);
    cv->len += ulen;

    uint64_t ids[SAMPLES_MAX];
    uint32_t glen[SAMPLES_MAX];
    uint32_t ns = 1;
    if (rng_below(r, FORK_ONE_IN) == 0) ns = rng_range(r, SAMPLES_MIN, SAMPLES_MAX);
    for (uint32_t s = 0; s < ns; s++) glen[s] = rng_range(r, GEN_MIN, GEN_MAX);

    size_t n = cv->len, n_cached = 0;
    ids[0] = b->next_id++;
    PKV(pkv_seq_open(b->c, ids[0], 0, cv->hist, n, &n_cached));
    b->calls++;
    if (n_cached > n) die("pkv_seq_open reported %zu cached tokens of a %zu-token prompt", n_cached, n);
    wc->prompt_tokens += n;
    wc->cached_tokens += n_cached;
    wc->prefill_tokens += n - n_cached;
    prefill(b, ids[0], cv->hist + n_cached, n - n_cached, cfg.payload);

    for (uint32_t s = 1; s < ns; s++) {
        ids[s] = b->next_id++;
        PKV(pkv_seq_fork(b->c, ids[0], ids[s]));
        b->calls++;
    }
    if (ns > 1) {
        wc->forks++;
        wc->samples += ns;
    }

    /* Decode the samples round-robin, as a batched decoder would; sample 0 is the
     * answer kept in the history. */
    uint32_t maxlen = 0;
    for (uint32_t s = 0; s < ns; s++) maxlen = glen[s] > maxlen ? glen[s] : maxlen;
    for (uint32_t step = 0; step < maxlen; step++) {
        for (uint32_t s = 0; s < ns; s++) {
            if (step >= glen[s]) continue;
            uint32_t tok = rng_token(r);
            if (s == 0) cv->hist[cv->len++] = tok;
            decode_step(b, ids[s], tok, cfg.payload);
            b->calls += 2;
            wc->decode_tokens++;
        }
    }
    for (uint32_t s = 0; s < ns; s++) {
        PKV(pkv_seq_close(b->c, ids[s]));
        b->calls++;
    }
    wc->turns++;
}

static void run_workload(bench *b, unsigned run, run_result *res) {
    sys_prompts sp;
    sys_prompts_make(&sp, cfg.seed);
    rng r;
    rng_init(&r, cfg.seed, 2);

    uint32_t conc = cfg.users < CONCURRENCY ? cfg.users : CONCURRENCY;
    conv *active = xcalloc(conc, sizeof *active);
    uint32_t n_active = 0, next_user = 0;
    for (; n_active < conc; n_active++) conv_start(&active[n_active], &sp, &r, next_user++);

    workload_counts wc = {0};
    b->calls = 0;
    uint64_t t0 = now_ns();
    while (n_active > 0) {
        uint32_t i = rng_below(&r, n_active);
        conv *cv = &active[i];
        snprintf(g_phase, sizeof g_phase, "run %u workload, turn %" PRIu64 " (user %" PRIu32
                 ", turn %" PRIu32 ")", run, wc.turns + 1, cv->user, cfg.turns - cv->turns_left + 1);
        do_turn(b, cv, &r, &wc);
        if (--cv->turns_left == 0) {
            if (next_user < cfg.users) {
                conv_start(cv, &sp, &r, next_user++);
            } else { /* swap the finished conversation out */
                conv tmp = *cv;
                *cv = active[n_active - 1];
                active[n_active - 1] = tmp;
                n_active--;
            }
        }
        check_stop();
    }
    uint64_t t1 = now_ns();
    wc.calls = b->calls;

    double secs = (double)(t1 - t0) / 1e9;
    res->wl = wc;
    res->m[M_WL_SECONDS] = secs;
    res->m[M_WL_TURNS_PER_S] = (double)wc.turns / secs;
    res->m[M_WL_TOKENS_PER_S] = (double)(wc.prefill_tokens + wc.decode_tokens) / secs;
    res->m[M_WL_CALLS_PER_S] = (double)wc.calls / secs;

    for (uint32_t i = 0; i < conc; i++) free(active[i].hist);
    free(active);
    sys_prompts_free(&sp);
}

/* ---- Micro-benchmarks ------------------------------------------------------ */

/* Blocks a micro-benchmark may hold at once: a quarter of the cache. */
static uint64_t micro_block_budget(void) { return cfg.capacity / 4; }

/* (a) prefix lookup+attach and (e) close, on a fully cached 32k-token prompt;
 * then (d) fork of that sequence, the copy-on-write append, and the child's close. */
static void micro_prefix_fork(bench *b, unsigned run, run_result *res) {
    rng r;
    rng_init(&r, cfg.seed, 3);
    const size_t n = LONG_PROMPT;
    uint32_t *prompt = xmalloc((n + FORK_EXTRA) * sizeof *prompt);
    fill_tokens(&r, prompt, n + FORK_EXTRA);
    const uint32_t bs = cfg.block_size;
    const size_t full = (n - 1) / bs * bs; /* what a fully cached prompt attaches */

    /* First time: compute and commit the whole prompt, then close. */
    snprintf(g_phase, sizeof g_phase, "run %u, caching the 32k-token prompt", run);
    size_t n_cached = 0;
    uint64_t id = b->next_id++;
    PKV(pkv_seq_open(b->c, id, 0, prompt, n, &n_cached));
    prefill(b, id, prompt + n_cached, n - n_cached, false);
    PKV(pkv_seq_close(b->c, id));

    /* Then open+close it again and again; each call is long (thousands of blocks), so
     * one clock reading per call is negligible. */
    snprintf(g_phase, sizeof g_phase, "run %u, (a) prefix attach of the cached 32k prompt", run);
    uint64_t t_open = 0, t_close = 0;
    size_t attached = 0;
    for (unsigned i = 0; i < ATTACH_REPS; i++) {
        id = b->next_id++;
        uint64_t t0 = now_ns();
        PKV(pkv_seq_open(b->c, id, 0, prompt, n, &n_cached));
        uint64_t t1 = now_ns();
        PKV(pkv_seq_close(b->c, id));
        uint64_t t2 = now_ns();
        t_open += t1 - t0;
        t_close += t2 - t1;
        if (i == 0) attached = n_cached;
        if (n_cached != attached) die("the cached prefix changed between opens (%zu then %zu tokens)", attached, n_cached);
    }
    if (attached != full)
        fprintf(stderr, "pkv-bench: warning: run %u: the 32k prompt attached %zu cached tokens, "
                        "expected %zu; costs are per attached block\n", run, attached, full);
    if (attached == 0) die("the 32k-token prompt was not cached at all; cannot time the attach");
    uint64_t blocks = attached / bs;
    res->attach_blocks = blocks;
    res->m[M_ATTACH_NS_BLOCK] = (double)t_open / ((double)ATTACH_REPS * (double)blocks);
    res->m[M_ATTACH_US_CALL] = (double)t_open / ATTACH_REPS / 1e3;
    res->m[M_CLOSE_NS_BLOCK] = (double)t_close / ((double)ATTACH_REPS * (double)blocks);
    check_stop();

    /* (d) The parent: the prompt, its last tokens computed, FORK_EXTRA decoded tokens
     * so its last block is partial and shared by every child. */
    snprintf(g_phase, sizeof g_phase, "run %u, (d) fork", run);
    uint64_t parent = b->next_id++;
    PKV(pkv_seq_open(b->c, parent, 0, prompt, n, &n_cached));
    prefill(b, parent, prompt + n_cached, n - n_cached, false);
    for (unsigned i = 0; i < FORK_EXTRA; i++) decode_step(b, parent, prompt[n + i], false);
    pkv_seq_info pi;
    PKV(pkv_seq_get_info(b->c, parent, &pi));

    uint64_t kids = FORK_CHILDREN;
    if (kids > micro_block_budget() / 2) kids = micro_block_budget() / 2;
    if (kids == 0) kids = 1;
    uint64_t *child = xmalloc(kids * sizeof *child);
    for (uint64_t k = 0; k < kids; k++) child[k] = b->next_id++;

    uint64_t t0 = now_ns();
    for (uint64_t k = 0; k < kids; k++) PKV(pkv_seq_fork(b->c, parent, child[k]));
    uint64_t t1 = now_ns();
    /* Each child's first append copies the shared partial block. */
    uint32_t tok = rng_token(&r);
    pkv_slot slot;
    for (uint64_t k = 0; k < kids; k++) PKV(pkv_seq_append(b->c, child[k], &tok, 1, &slot));
    uint64_t t2 = now_ns();
    for (uint64_t k = 0; k < kids; k++) PKV(pkv_seq_commit(b->c, child[k], 1));
    uint64_t t3 = now_ns();
    for (uint64_t k = 0; k < kids; k++) PKV(pkv_seq_close(b->c, child[k]));
    uint64_t t4 = now_ns();
    PKV(pkv_seq_close(b->c, parent));

    res->m[M_FORK_US_CALL] = (double)(t1 - t0) / (double)kids / 1e3;
    res->m[M_FORK_NS_BLOCK] = (double)(t1 - t0) / ((double)kids * (double)pi.n_blocks);
    res->m[M_COW_APPEND_NS] = (double)(t2 - t1) / (double)kids;
    res->m[M_CLOSE_CHILD_NS_BLOCK] = (double)(t4 - t3) / ((double)kids * (double)pi.n_blocks);
    free(child);
    free(prompt);
    check_stop();
}

/* (b) decode: one sequence, one append(1) + one commit(1) per token; with `payload`
 * the token's K/V row is written through pkv_kv() between the two, as a model does.
 * With `step`, one pkv_seq_commit_append(1, 1) per token instead (it commits the
 * previous token and appends the next; a final commit ends the loop). The tokens
 * come from `stream`; a call with the stream of the call before it (`repeat`)
 * decodes the same tokens again, so every block it fills dedupes (checked). */
static void micro_decode(bench *b, unsigned run, double *out, const char *when,
                         uint64_t stream, bool payload, bool step, bool repeat) {
    snprintf(g_phase, sizeof g_phase, "run %u, (b) decode %s", run, when);
    rng r;
    rng_init(&r, cfg.seed, stream); /* distinct streams: no dedupe */
    uint64_t ntok = DECODE_TOKENS;
    if (ntok > micro_block_budget() * cfg.block_size) ntok = micro_block_budget() * cfg.block_size;
    uint32_t *tok = xmalloc(ntok * sizeof *tok);
    fill_tokens(&r, tok, ntok);
    uint64_t id = b->next_id++;
    PKV(pkv_seq_open(b->c, id, 0, NULL, 0, NULL));
    /* Start with nothing of the previous loop in flight: its log and the arena
     * pages it dirtied are written back here, not during this loop. */
    PKV(pkv_sync(b->c));
    pkv_stats st0, st1;
    PKV(pkv_get_stats(b->c, &st0));
    uint64_t t0 = now_ns();
    if (step) {
        pkv_slot slot;
        for (uint64_t i = 0; i < ntok; i++) {
            PKV(pkv_seq_commit_append(b->c, id, i ? 1 : 0, &tok[i], 1, &slot));
            if (payload) write_payload(b, &slot, &tok[i], 1);
        }
        PKV(pkv_seq_commit(b->c, id, 1));
    } else {
        for (uint64_t i = 0; i < ntok; i++) decode_step(b, id, tok[i], payload);
    }
    uint64_t t1 = now_ns();
    PKV(pkv_get_stats(b->c, &st1));
    PKV(pkv_seq_close(b->c, id));
    if (repeat && st1.dedupes - st0.dedupes != ntok / cfg.block_size) {
        fprintf(stderr, "pkv-bench: %s: %llu of %llu blocks deduped\n", g_phase,
                (unsigned long long)(st1.dedupes - st0.dedupes),
                (unsigned long long)(ntok / cfg.block_size));
        exit(1);
    }
    *out = (double)(t1 - t0) / (double)ntok;
    free(tok);
    check_stop();
}

/* (b) speculative decoding on the cache the workload left (full): per step, append
 * SPEC_DRAFTS draft tokens (writing their K/V with --payload), commit the first
 * SPEC_ACCEPT and truncate the rejected rest, as an engine verifying a draft model's
 * tokens does. Drafts regularly spill into a new block that the truncation frees
 * again. Cost per committed token. */
#define SPEC_DRAFTS 4u
#define SPEC_ACCEPT 2u
static void micro_spec(bench *b, unsigned run, run_result *res) {
    snprintf(g_phase, sizeof g_phase, "run %u, (b) speculative decode", run);
    rng r;
    rng_init(&r, cfg.seed, 11);
    uint64_t steps = DECODE_TOKENS / 8;
    if (steps * SPEC_ACCEPT > micro_block_budget() * cfg.block_size)
        steps = micro_block_budget() * cfg.block_size / SPEC_ACCEPT;
    uint32_t *tok = xmalloc(steps * SPEC_DRAFTS * sizeof *tok);
    fill_tokens(&r, tok, steps * SPEC_DRAFTS);
    uint64_t id = b->next_id++;
    PKV(pkv_seq_open(b->c, id, 0, NULL, 0, NULL));
    PKV(pkv_sync(b->c));
    pkv_slot slots[SPEC_DRAFTS];
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < steps; i++) {
        const uint32_t *d = tok + i * SPEC_DRAFTS;
        PKV(pkv_seq_append(b->c, id, d, SPEC_DRAFTS, slots));
        if (cfg.payload) write_payload(b, slots, d, SPEC_DRAFTS);
        PKV(pkv_seq_commit(b->c, id, SPEC_ACCEPT));
        PKV(pkv_seq_truncate(b->c, id, (i + 1) * SPEC_ACCEPT));
    }
    uint64_t t1 = now_ns();
    PKV(pkv_seq_close(b->c, id));
    res->m[M_SPEC_NS_TOKEN] = (double)(t1 - t0) / (double)(steps * SPEC_ACCEPT);
    free(tok);
    check_stop();
}

/* (b) prefill: append(512) + commit(512) calls; a new sequence every 64 calls. */
static void micro_prefill(bench *b, unsigned run, run_result *res) {
    snprintf(g_phase, sizeof g_phase, "run %u, (b) prefill", run);
    rng r;
    rng_init(&r, cfg.seed, 5);
    const uint64_t per_seq = 64 * PREFILL_CHUNK;
    uint64_t seq_tokens = per_seq;
    if (seq_tokens > micro_block_budget() * cfg.block_size)
        seq_tokens = micro_block_budget() * cfg.block_size / PREFILL_CHUNK * PREFILL_CHUNK;
    if (seq_tokens < PREFILL_CHUNK) seq_tokens = PREFILL_CHUNK;
    uint32_t *tok = xmalloc(seq_tokens * sizeof *tok);
    bool payload = cfg.payload;
    uint64_t total = 0, t = 0;
    while (total < PREFILL_TOKENS) {
        fill_tokens(&r, tok, seq_tokens);
        uint64_t id = b->next_id++;
        PKV(pkv_seq_open(b->c, id, 0, NULL, 0, NULL));
        uint64_t t0 = now_ns();
        for (uint64_t off = 0; off < seq_tokens; off += PREFILL_CHUNK) {
            PKV(pkv_seq_append(b->c, id, tok + off, PREFILL_CHUNK, b->slots));
            if (payload) write_payload(b, b->slots, tok + off, PREFILL_CHUNK);
            PKV(pkv_seq_commit(b->c, id, PREFILL_CHUNK));
        }
        t += now_ns() - t0;
        total += seq_tokens;
        PKV(pkv_seq_close(b->c, id));
        check_stop();
    }
    res->m[M_PREFILL_NS_TOKEN] = (double)t / (double)total;
    free(tok);
}

/* The (c) batch: BATCH_SEQS sequences growing BATCH_BLOCKS blocks each, fewer of
 * both for big blocks or a small cache. */
static void batch_size(uint64_t *nseq, uint64_t *nblk) {
    uint64_t ns = BATCH_SEQS, nb = BATCH_BLOCKS;
    while (nb > 1 && ns * nb * cfg.block_size > (1u << 18)) nb /= 2; /* big blocks: fewer */
    while (ns * nb > micro_block_budget() && nb > 1) nb /= 2;
    while (ns * nb > micro_block_budget() && ns > 1) ns /= 2;
    *nseq = ns;
    *nblk = nb;
}

/* (c) seal, split: BATCH_SEQS sequences decoded round-robin; each position within
 * a block is timed over all sequences at once, appends and commits separately. */
static void micro_seal(bench *b, unsigned run, run_result *res) {
    snprintf(g_phase, sizeof g_phase, "run %u, (c) seal split", run);
    rng r;
    rng_init(&r, cfg.seed, 6);
    const uint32_t bs = cfg.block_size;
    uint64_t nseq, nblk;
    batch_size(&nseq, &nblk);

    uint64_t ids[BATCH_SEQS];
    pkv_slot slots[BATCH_SEQS];
    uint32_t *tok = xmalloc(nseq * bs * sizeof *tok);
    PKV(pkv_sync(b->c)); /* as in micro_decode */
    uint64_t t_app = 0, t_app_alloc = 0, t_com = 0, t_com_seal = 0;
    uint64_t n_app = 0, n_app_alloc = 0, n_com = 0, n_com_seal = 0;
    for (unsigned round = 0; round < BATCH_ROUNDS; round++) {
        for (uint64_t s = 0; s < nseq; s++) {
            ids[s] = b->next_id++;
            PKV(pkv_seq_open(b->c, ids[s], 0, NULL, 0, NULL));
        }
        for (uint64_t blk = 0; blk < nblk; blk++) {
            fill_tokens(&r, tok, nseq * bs);
            for (uint32_t pos = 0; pos < bs; pos++) {
                uint64_t t0 = now_ns();
                for (uint64_t s = 0; s < nseq; s++)
                    PKV(pkv_seq_append(b->c, ids[s], &tok[s * bs + pos], 1, &slots[s]));
                uint64_t t1 = now_ns();
                for (uint64_t s = 0; s < nseq; s++) PKV(pkv_seq_commit(b->c, ids[s], 1));
                uint64_t t2 = now_ns();
                if (pos == 0) {
                    t_app_alloc += t1 - t0;
                    n_app_alloc += nseq;
                } else {
                    t_app += t1 - t0;
                    n_app += nseq;
                }
                if (pos == bs - 1) {
                    t_com_seal += t2 - t1;
                    n_com_seal += nseq;
                } else {
                    t_com += t2 - t1;
                    n_com += nseq;
                }
            }
        }
        for (uint64_t s = 0; s < nseq; s++) PKV(pkv_seq_close(b->c, ids[s]));
        check_stop();
    }
    free(tok);
    res->m[M_BATCH_NS_TOKEN] = (double)(t_app + t_app_alloc + t_com + t_com_seal) /
                               (double)(n_app + n_app_alloc);
    res->m[M_APPEND_NS] = n_app ? (double)t_app / (double)n_app : NAN;
    res->m[M_APPEND_ALLOC_NS] = (double)t_app_alloc / (double)n_app_alloc;
    res->m[M_COMMIT_NS] = n_com ? (double)t_com / (double)n_com : NAN;
    res->m[M_COMMIT_SEAL_NS] = (double)t_com_seal / (double)n_com_seal;
    res->m[M_SEAL_NS_BLOCK] = n_com ? res->m[M_COMMIT_SEAL_NS] - res->m[M_COMMIT_NS] : NAN;
}

/* (c) batched decode: BATCH_SEQS sequences, one pkv_seq_step_batch call per step
 * of the whole batch (each step commits the token before and appends the next), as
 * a batched decoder would call it; sized like the seal split. */
static void micro_step_batch(bench *b, unsigned run, run_result *res) {
    snprintf(g_phase, sizeof g_phase, "run %u, (c) step batch", run);
    rng r;
    rng_init(&r, cfg.seed, 11);
    const uint32_t bs = cfg.block_size;
    uint64_t nseq, nblk;
    batch_size(&nseq, &nblk);
    pkv_step st[BATCH_SEQS];
    uint32_t *tok = xmalloc(nseq * sizeof *tok);
    uint64_t t = 0, n = 0;
    PKV(pkv_sync(b->c)); /* as in micro_decode */
    for (unsigned round = 0; round < BATCH_ROUNDS; round++) {
        for (uint64_t s = 0; s < nseq; s++) {
            st[s].id = b->next_id++;
            PKV(pkv_seq_open(b->c, st[s].id, 0, NULL, 0, NULL));
        }
        for (uint64_t pos = 0; pos < nblk * bs; pos++) {
            fill_tokens(&r, tok, nseq);
            for (uint64_t s = 0; s < nseq; s++) {
                st[s].n_commit = pos ? 1 : 0;
                st[s].token = tok[s];
            }
            size_t done;
            uint64_t t0 = now_ns();
            PKV(pkv_seq_step_batch(b->c, st, nseq, &done));
            t += now_ns() - t0;
            n += nseq;
            if (cfg.payload)
                for (uint64_t s = 0; s < nseq; s++) write_payload(b, &st[s].slot, &tok[s], 1);
        }
        for (uint64_t s = 0; s < nseq; s++) {
            PKV(pkv_seq_commit(b->c, st[s].id, 1));
            PKV(pkv_seq_close(b->c, st[s].id));
        }
        check_stop();
    }
    free(tok);
    res->m[M_STEP_BATCH_NS_TOKEN] = (double)t / (double)n;
}

/* ---- One run ----------------------------------------------------------------- */

static void open_cache(bench *b, unsigned run, run_result *res) {
    pkv_options opt;
    pkv_options_init(&opt);
    opt.num_layers = 1;
    opt.num_kv_heads = 1;
    opt.head_dim = 8;
    opt.dtype = PKV_F16;
    opt.block_size = cfg.block_size;
    opt.capacity = cfg.capacity;
    opt.model_id = "pkv-bench/synthetic-1L-1H-d8-f16";
    opt.durability = cfg.durability;
    if (cfg.prefault) opt.flags |= PKV_OPEN_PREFAULT;
    snprintf(g_phase, sizeof g_phase, "run %u, pkv_open of the cache directory", run);
    uint64_t t0 = now_ns();
    PKV(pkv_open(g_cachedir, &opt, &g_cache));
    res->m[M_OPEN_CREATE_MS] = (double)(now_ns() - t0) / 1e6;
    b->c = g_cache;
    PKV(pkv_info(b->c, &b->info));
    b->next_id = 1;
}

/* (f) the metrics a scraper fetches, on whatever the cache holds now. */
static void micro_metrics(bench *b, unsigned run, run_result *res) {
    snprintf(g_phase, sizeof g_phase, "run %u, (f) metrics text", run);
    static char text[1 << 16];
    enum { CALLS = 2000 };
    PKV(pkv_metrics_text(b->c, text, sizeof text, NULL));
    uint64_t t0 = now_ns();
    for (int i = 0; i < CALLS; i++) PKV(pkv_metrics_text(b->c, text, sizeof text, NULL));
    res->m[M_METRICS_TEXT_US] = (double)(now_ns() - t0) / CALLS / 1e3;
    check_stop();
}

/* --scrape-ms: a thread rendering the metrics every period while the cache is
 * open (a Prometheus scraping pkv_metrics_serve's endpoint costs this plus HTTP). */
static pthread_t scraper;
static atomic_bool scraper_stop;
static atomic_ulong scrapes;

static void *scraper_main(void *arg) {
    pkv_cache *c = arg;
    static char text[1 << 16];
    const struct timespec period = {cfg.scrape_ms / 1000, (long)(cfg.scrape_ms % 1000) * 1000000L};
    while (!atomic_load(&scraper_stop)) {
        nanosleep(&period, NULL);
        if (pkv_metrics_text(c, text, sizeof text, NULL) == 0) atomic_fetch_add(&scrapes, 1);
    }
    return NULL;
}

static void scraper_start(bench *b) {
    if (!cfg.scrape_ms) return;
    atomic_store(&scraper_stop, false);
    if (pthread_create(&scraper, NULL, scraper_main, b->c)) {
        fprintf(stderr, "pkv-bench: cannot start the scraper thread\n");
        exit(1);
    }
}

static void scraper_end(void) {
    if (!cfg.scrape_ms) return;
    atomic_store(&scraper_stop, true);
    pthread_join(scraper, NULL);
}

/* --tier-nodes: the decode pair with a tier attached, publishing (rule T2: each
 * seal queued, copied under the cache lock by the publishing thread), and
 * without, on the same cache. Each is timed twice per run in an ABBA order
 * (with, without, without, with; the mirror in even runs), so that a drift
 * within the run or a penalty on whichever loop comes first (seen on the
 * loaded test VM) weighs on both sides alike; each metric is the mean of its
 * two loops. Distinct token streams: no dedupes. The tier is attached for each
 * "with" loop and detached after it; res->st_tier sums its counters. */
static void micro_decode_tier(bench *b, unsigned run, run_result *res) {
    static const char secret[] = "pkv-bench tier secret, not a real one";
    static const bool abba[2][4] = {{false, true, true, false}, {true, false, false, true}};
    res->m[M_DECODE_TIER_NS_TOKEN] = res->m[M_DECODE_NOTIER_NS_TOKEN] = 0;
    res->m[M_STEP_TIER_NS_TOKEN] = res->m[M_STEP_NOTIER_NS_TOKEN] = 0;
    memset(&res->st_tier, 0, sizeof res->st_tier);
    for (int k = 0; k < 4; k++) {
        const bool with = abba[run % 2][k];
        if (with) {
            pkv_tier_options t;
            memset(&t, 0, sizeof t);
            t.nodes = cfg.tier_nodes;
            t.secret = secret;
            t.secret_len = sizeof secret - 1;
            t.publish_max_depth = cfg.tier_max_depth;
            t.flags = PKV_TIER_NO_FETCH | (cfg.tier_on_hit ? PKV_TIER_PUBLISH_ON_HIT : 0);
            snprintf(g_phase, sizeof g_phase, "run %u, pkv_tier_attach %s", run, cfg.tier_nodes);
            PKV(pkv_tier_attach(b->c, &t));
        }
        double v;
        micro_decode(b, run, &v, with ? "with a tier publishing" : "without a tier",
                     13 + 2 * (uint64_t)k, cfg.payload, false, false);
        res->m[with ? M_DECODE_TIER_NS_TOKEN : M_DECODE_NOTIER_NS_TOKEN] += v / 2;
        micro_decode(b, run, &v,
                     with ? "in one call per step, a tier publishing"
                          : "in one call per step, without a tier",
                     14 + 2 * (uint64_t)k, cfg.payload, true, false);
        res->m[with ? M_STEP_TIER_NS_TOKEN : M_STEP_NOTIER_NS_TOKEN] += v / 2;
        if (with) {
            pkv_stats st;
            PKV(pkv_get_stats(b->c, &st));
            res->st_tier.tier_published += st.tier_published;
            res->st_tier.tier_publish_dropped += st.tier_publish_dropped;
            res->st_tier.tier_publish_errors += st.tier_publish_errors;
            pkv_tier_detach(b->c); /* what is still queued is dropped */
        }
    }
}

static void close_cache(bench *b) {
    pkv_close(g_cache);
    g_cache = NULL;
    b->c = NULL;
    remove_tree(g_cachedir);
}

static void do_run(bench *b, unsigned run, run_result *res) {
    for (int m = 0; m < M_COUNT; m++) res->m[m] = NAN; /* not measured (--only) */
    open_cache(b, run, res);
    scraper_start(b);
    micro_decode(b, run, &res->m[M_DECODE_EMPTY_NS_TOKEN], "on the empty cache", 4,
                 cfg.payload, false, false);
    micro_decode(b, run, &res->m[M_DECODE_REPEAT_NS_TOKEN], "repeating it, empty cache", 4,
                 cfg.payload, false, true);
    micro_decode(b, run, &res->m[M_DECODE_KV_NS_TOKEN], "on the empty cache, K/V written", 8,
                 true, false, false);
    micro_decode(b, run, &res->m[M_STEP_NS_TOKEN], "in one call per step, empty cache", 9,
                 cfg.payload, true, false);
    micro_decode(b, run, &res->m[M_STEP_KV_NS_TOKEN],
                 "in one call per step, empty cache, K/V written", 10, true, true, false);
    if (cfg.tier_nodes) micro_decode_tier(b, run, res);
    if (cfg.decode_only) {
        micro_metrics(b, run, res);
        scraper_end();
        PKV(pkv_get_stats(b->c, &res->st_workload));
        PKV(pkv_get_stats(b->c, &res->st_final));
        close_cache(b);
        return;
    }
    run_workload(b, run, res);
    snprintf(g_phase, sizeof g_phase, "run %u, after the workload", run);
    PKV(pkv_get_stats(b->c, &res->st_workload));
    if (cfg.check) run_check(b, "after the workload");
    micro_prefix_fork(b, run, res);
    micro_decode(b, run, &res->m[M_DECODE_NS_TOKEN], "on the cache the workload left", 7,
                 cfg.payload, false, false);
    micro_decode(b, run, &res->m[M_STEP_FULL_NS_TOKEN],
                 "in one call per step, on the cache the workload left", 12, cfg.payload, true,
                 false);
    micro_spec(b, run, res);
    micro_prefill(b, run, res);
    micro_seal(b, run, res);
    micro_step_batch(b, run, res);
    micro_metrics(b, run, res);
    scraper_end();
    PKV(pkv_get_stats(b->c, &res->st_final));
    if (cfg.check) run_check(b, "after the micro-benchmarks");
    close_cache(b);
}

/* ---- Reporting ------------------------------------------------------------ */

typedef struct machine {
    char os[3 * 65 + 4];
    char cpu[256];
    char load[64]; /* /proc/loadavg: 1, 5 and 15 minute averages */
    long nproc;
    double mem_gib;
} machine;

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
    snprintf(m->load, sizeof m->load, "unknown");
    if ((f = fopen("/proc/loadavg", "r"))) {
        double l1, l5, l15;
        if (fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3)
            snprintf(m->load, sizeof m->load, "%.2f %.2f %.2f", l1, l5, l15);
        fclose(f);
    }
    m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    m->mem_gib = pages > 0 && psz > 0 ? (double)pages * (double)psz / (1024.0 * 1024 * 1024) : 0;
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    double med, min, max; /* NAN when not measurable */
} summary;

static summary summarize(const run_result *res, unsigned runs, int m) {
    double *v = xmalloc(runs * sizeof *v);
    summary s = {NAN, NAN, NAN};
    for (unsigned i = 0; i < runs; i++) {
        v[i] = res[i].m[m];
        if (isnan(v[i])) {
            free(v);
            return s;
        }
    }
    qsort(v, runs, sizeof *v, cmp_double);
    s.min = v[0];
    s.max = v[runs - 1];
    s.med = runs % 2 ? v[runs / 2] : (v[runs / 2 - 1] + v[runs / 2]) / 2;
    free(v);
    return s;
}

static void fmt_num(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "n/a");
    else if (fabs(v) >= 1e6) snprintf(buf, n, "%.3g", v);
    else if (fabs(v) >= 1000) snprintf(buf, n, "%.0f", v);
    else if (fabs(v) >= 100) snprintf(buf, n, "%.1f", v);
    else snprintf(buf, n, "%.2f", v);
}

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0; }

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

static void print_stats_text(FILE *f, const char *title, const pkv_stats *st) {
    fprintf(f, "%s\n", title);
    fprintf(f, "  prompt hit rate   %.2f%% of tokens (%" PRIu64 " hit, %" PRIu64
               " miss), %.2f%% of full blocks (%" PRIu64 " hit, %" PRIu64 " miss)\n",
            pct(st->hit_tokens, st->hit_tokens + st->miss_tokens), st->hit_tokens,
            st->miss_tokens, pct(st->hit_blocks, st->hit_blocks + st->miss_blocks),
            st->hit_blocks, st->miss_blocks);
    fprintf(f, "  seals %" PRIu64 ", evictions %" PRIu64 ", dedupes %" PRIu64
               ", cow copies %" PRIu64 "\n",
            st->seals, st->evictions, st->dedupes, st->cow_copies);
    fprintf(f, "  blocks: %" PRIu64 " free, %" PRIu64 " cached, %" PRIu64 " used, %" PRIu64
               " sealed (capacity %" PRIu64 "); %" PRIu64 " sequences open\n",
            st->blocks_free, st->blocks_cached, st->blocks_used, st->blocks_sealed,
            st->capacity, st->sequences);
}

static void json_stats(FILE *f, const pkv_stats *st) {
    fprintf(f,
            "{\"capacity\": %" PRIu64 ", \"blocks_free\": %" PRIu64 ", \"blocks_cached\": %" PRIu64
            ", \"blocks_used\": %" PRIu64 ", \"blocks_sealed\": %" PRIu64 ", \"sequences\": %" PRIu64
            ", \"hit_tokens\": %" PRIu64 ", \"miss_tokens\": %" PRIu64 ", \"hit_blocks\": %" PRIu64
            ", \"miss_blocks\": %" PRIu64 ", \"evictions\": %" PRIu64 ", \"cow_copies\": %" PRIu64
            ", \"dedupes\": %" PRIu64 ", \"seals\": %" PRIu64 ", \"token_hit_rate\": ",
            st->capacity, st->blocks_free, st->blocks_cached, st->blocks_used, st->blocks_sealed,
            st->sequences, st->hit_tokens, st->miss_tokens, st->hit_blocks, st->miss_blocks,
            st->evictions, st->cow_copies, st->dedupes, st->seals);
    json_num(f, pct(st->hit_tokens, st->hit_tokens + st->miss_tokens) / 100);
    fputs("}", f);
}

static const int metric_order[] = {
    M_ATTACH_NS_BLOCK,  M_ATTACH_US_CALL,  M_CLOSE_NS_BLOCK,
    M_DECODE_NS_TOKEN,  M_STEP_FULL_NS_TOKEN, M_DECODE_EMPTY_NS_TOKEN, M_DECODE_REPEAT_NS_TOKEN, M_DECODE_KV_NS_TOKEN,
    M_STEP_NS_TOKEN,    M_STEP_KV_NS_TOKEN, M_DECODE_NOTIER_NS_TOKEN, M_DECODE_TIER_NS_TOKEN,
    M_STEP_NOTIER_NS_TOKEN, M_STEP_TIER_NS_TOKEN, M_SPEC_NS_TOKEN,   M_PREFILL_NS_TOKEN,
    M_BATCH_NS_TOKEN,   M_APPEND_NS,       M_APPEND_ALLOC_NS, M_COMMIT_NS,
    M_COMMIT_SEAL_NS,   M_SEAL_NS_BLOCK,   M_STEP_BATCH_NS_TOKEN,
    M_FORK_US_CALL,     M_FORK_NS_BLOCK,   M_COW_APPEND_NS,   M_CLOSE_CHILD_NS_BLOCK,
    M_METRICS_TEXT_US,
    M_OPEN_CREATE_MS,   M_WL_SECONDS,      M_WL_TURNS_PER_S,  M_WL_TOKENS_PER_S,
    M_WL_CALLS_PER_S,
};

static void report_text(const run_result *res, unsigned runs, bool deterministic) {
    FILE *f = stdout;
    const run_result *last = &res[runs - 1];
    fprintf(f, "\nMedian over %u run%s (min and max alongside); (a)-(e) ran on the cache the "
               "workload left behind.\n\n", runs, runs == 1 ? "" : "s");
    fprintf(f, "%-58s %10s %10s %10s  %-9s %s\n", "operation", "median", "min", "max", "unit",
            "target");
    bool all_met = true;
    for (size_t i = 0; i < sizeof metric_order / sizeof metric_order[0]; i++) {
        int m = metric_order[i];
        const metric_def *d = &metric_defs[m];
        summary s = summarize(res, runs, m);
        bool tier_row = m == M_DECODE_NOTIER_NS_TOKEN || m == M_DECODE_TIER_NS_TOKEN ||
                        m == M_STEP_NOTIER_NS_TOKEN || m == M_STEP_TIER_NS_TOKEN;
        if ((cfg.decode_only || (tier_row && !cfg.tier_nodes)) && isnan(s.med))
            continue; /* not measured */
        char a[32], b[32], c[32], t[48] = "";
        fmt_num(a, sizeof a, s.med);
        fmt_num(b, sizeof b, s.min);
        fmt_num(c, sizeof c, s.max);
        if (d->target > 0 && cfg.block_size != 16) {
            snprintf(t, sizeof t, "(<= %.0f at block size 16)", d->target);
        } else if (d->target > 0 && cfg.decode_only) {
            snprintf(t, sizeof t, "(<= %.0f on the full cache)", d->target);
        } else if (d->target > 0) {
            bool met = !isnan(s.med) && s.med <= d->target;
            all_met = all_met && met;
            snprintf(t, sizeof t, "<= %.0f  %s", d->target, met ? "met" : "MISSED");
        }
        if (m == M_OPEN_CREATE_MS) fputc('\n', f);
        fprintf(f, "%-58s %10s %10s %10s  %-9s %s\n", d->label, a, b, c, d->unit, t);
    }
    if (cfg.decode_only) {
        fprintf(f, "\n--only decode: the decode loops ran on the empty cache; targets not "
                   "judged.\n");
        return;
    }
    fprintf(f, "\n(a) attaches %" PRIu64 " blocks per open; (c) seal = commit(1) that seals - "
               "commit(1) that does not.\n", last->attach_blocks);

    const workload_counts *w = &last->wl;
    fprintf(f, "\nWorkload (per run): %" PRIu64 " turns, %" PRIu64 " with parallel samples (%" PRIu64
               " samples); prompts %" PRIu64 " tokens, of which %" PRIu64
               " cached (%.2f%%);\n  prefilled %" PRIu64 " tokens, decoded %" PRIu64
               " tokens; %" PRIu64 " pkv_* calls\n",
            w->turns, w->forks, w->samples, w->prompt_tokens, w->cached_tokens,
            pct(w->cached_tokens, w->prompt_tokens), w->prefill_tokens, w->decode_tokens,
            w->calls);
    fputc('\n', f);
    print_stats_text(f, "pkv_get_stats after the workload (last run):", &last->st_workload);
    print_stats_text(f, "pkv_get_stats at the end of the run, micro-benchmarks included (last run):",
                     &last->st_final);
    if (!deterministic)
        fprintf(f, "\nnote: pkv_get_stats after the workload differed between runs (the workload "
                   "itself is deterministic)\n");
    if (cfg.block_size != 16)
        fprintf(f, "\ntargets: not judged (they are set for 16-token blocks)\n");
    else
        fprintf(f, "\ntargets: %s\n", all_met ? "all met" : "MISSED (see above)");
}

static void report_json(const machine *mc, const char *cmd, const run_result *res, unsigned runs,
                        bool deterministic, uint64_t slot_bytes, double clock_ns) {
    FILE *f = stdout;
    const run_result *last = &res[runs - 1];
    fprintf(f, "{\n  \"benchmark\": \"pkv-bench\",\n  \"pagedkv_version\": \"%d.%d\",\n",
            PKV_VERSION_MAJOR, PKV_VERSION_MINOR);
    fputs("  \"command\": ", f);
    json_str(f, cmd);
    fputs(",\n  \"machine\": {\"os\": ", f);
    json_str(f, mc->os);
    fputs(", \"cpu\": ", f);
    json_str(f, mc->cpu);
    fputs(", \"loadavg\": ", f);
    json_str(f, mc->load);
    fprintf(f, ", \"nproc\": %ld, \"mem_gib\": %.1f, \"clock_overhead_ns\": %.0f},\n", mc->nproc,
            mc->mem_gib, clock_ns);
    fprintf(f, "  \"config\": {\"capacity\": %" PRIu64 ", \"block_size\": %" PRIu32
               ", \"seed\": %" PRIu64 ", \"users\": %" PRIu32 ", \"turns\": %" PRIu32
               ", \"runs\": %u, \"payload\": %s, \"check\": %s, \"durability\": \"%s\", "
               "\"prefault\": %s, \"only_decode\": %s, \"scrape_ms\": %" PRIu32 ", \"num_layers\": 1, "
               "\"num_kv_heads\": 1, \"head_dim\": 8, \"dtype\": \"f16\", \"slot_bytes\": %" PRIu64
               ", \"arena_bytes\": %" PRIu64 ", \"dir\": ",
            cfg.capacity, cfg.block_size, cfg.seed, cfg.users, cfg.turns, runs,
            cfg.payload ? "true" : "false", cfg.check ? "true" : "false",
            durability_name(cfg.durability), cfg.prefault ? "true" : "false",
            cfg.decode_only ? "true" : "false", cfg.scrape_ms, slot_bytes,
            4096 + slot_bytes * cfg.capacity);
    json_str(f, cfg.dir);
    fputs("},\n  \"metrics\": {\n", f);
    bool all_met = true;
    for (int m = 0; m < M_COUNT; m++) {
        const metric_def *d = &metric_defs[m];
        summary s = summarize(res, runs, m);
        fprintf(f, "    \"%s\": {\"median\": ", d->key);
        json_num(f, s.med);
        fputs(", \"min\": ", f);
        json_num(f, s.min);
        fputs(", \"max\": ", f);
        json_num(f, s.max);
        fprintf(f, ", \"unit\": \"%s\", \"runs\": [", d->unit);
        for (unsigned i = 0; i < runs; i++) {
            if (i) fputs(", ", f);
            json_num(f, res[i].m[m]);
        }
        fputs("]", f);
        if (d->target > 0) {
            /* the targets are for 16-token blocks and the full cache */
            bool judged = cfg.block_size == 16 && !cfg.decode_only;
            bool met = !isnan(s.med) && s.med <= d->target;
            all_met = all_met && (met || !judged);
            fprintf(f, ", \"target\": %.0f, \"met\": %s", d->target,
                    !judged ? "null" : met ? "true" : "false");
        }
        fprintf(f, "}%s\n", m + 1 < M_COUNT ? "," : "");
    }
    const workload_counts *w = &last->wl;
    fprintf(f, "  },\n  \"prefix_attach_blocks\": %" PRIu64 ",\n", last->attach_blocks);
    fprintf(f, "  \"workload\": {\"turns\": %" PRIu64 ", \"forks\": %" PRIu64 ", \"samples\": %" PRIu64
               ", \"prompt_tokens\": %" PRIu64 ", \"cached_tokens\": %" PRIu64
               ", \"prefill_tokens\": %" PRIu64 ", \"decode_tokens\": %" PRIu64
               ", \"calls\": %" PRIu64 "},\n",
            w->turns, w->forks, w->samples, w->prompt_tokens, w->cached_tokens, w->prefill_tokens,
            w->decode_tokens, w->calls);
    fputs("  \"stats_after_workload\": ", f);
    json_stats(f, &last->st_workload);
    fputs(",\n  \"stats_final\": ", f);
    json_stats(f, &last->st_final);
    fprintf(f, ",\n  \"deterministic\": %s,\n  \"targets_met\": %s\n}\n",
            deterministic ? "true" : "false",
            cfg.block_size != 16 || cfg.decode_only ? "null" : all_met ? "true" : "false");
}

/* The counters a deterministic workload must reproduce exactly (timing-dependent
 * ones, such as log writes, are left out). */
static bool same_core_stats(const pkv_stats *a, const pkv_stats *b) {
    return a->blocks_free == b->blocks_free && a->blocks_cached == b->blocks_cached &&
           a->blocks_used == b->blocks_used && a->blocks_sealed == b->blocks_sealed &&
           a->hit_tokens == b->hit_tokens && a->miss_tokens == b->miss_tokens &&
           a->hit_blocks == b->hit_blocks && a->miss_blocks == b->miss_blocks &&
           a->evictions == b->evictions && a->cow_copies == b->cow_copies &&
           a->dedupes == b->dedupes && a->seals == b->seals;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-bench [options]\n"
            "Replays a seeded synthetic multi-turn chat workload on a fresh pagedkv cache and\n"
            "prints the cost of each core operation (median over runs).\n"
            "\n"
            "  --capacity N     cache capacity in blocks (default 1048576)\n"
            "  --block-size N   tokens per block, 1..%u (default 16)\n"
            "  --seed N         workload seed (default 1)\n"
            "  --dir DIR        where to create the temporary cache directory (default /tmp);\n"
            "                   it is removed at the end\n"
            "  --users N        conversations in the workload (default 3000)\n"
            "  --turns N        turns per conversation (default 16)\n"
            "  --runs N         runs; costs are medians over runs (default 5)\n"
            "  --payload        also write K/V through pkv_kv() (workload, decode, prefill)\n"
            "  --check          run pkv_check() after the workload and at the end of each run\n"
            "  --durability M   group (the library default), none or always\n"
            "  --prefault       open the cache with PKV_OPEN_PREFAULT (arena populated at open,\n"
            "                   so first touches of block slots do not page-fault in timed loops)\n"
            "  --only decode    run only the decode micro-benchmarks on the empty cache\n"
            "                   (and the metrics text)\n"
            "  --scrape-ms N    a thread calls pkv_metrics_text every N ms meanwhile, as a\n"
            "                   Prometheus scraper would\n"
            "  --tier-nodes H:P also time two decode loops with a shared tier on that Redis\n"
            "                   attached and publishing, against the same without a tier\n"
            "                   (docs/remote.md; bench/tier-decode.sh starts a server)\n"
            "  --tier-max-depth N  the tier's publish_max_depth (default 0: every block)\n"
            "  --tier-on-hit    the tier publishes on hit (PKV_TIER_PUBLISH_ON_HIT)\n"
            "  --json           print a JSON summary instead of the text report\n"
            "  -h, --help       print this message\n",
            PKV_BLOCK_SIZE_MAX);
}

static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-bench: ", stderr);
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

int main(int argc, char **argv) {
    enum { O_CAPACITY = 256, O_BLOCK_SIZE, O_SEED, O_DIR, O_TURNS, O_USERS, O_RUNS, O_PAYLOAD,
           O_JSON, O_CHECK, O_DURABILITY, O_PREFAULT, O_ONLY, O_SCRAPE, O_TIER_NODES,
           O_TIER_DEPTH, O_TIER_ON_HIT };
    static const struct option longopts[] = {
        {"capacity", required_argument, NULL, O_CAPACITY},
        {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"seed", required_argument, NULL, O_SEED},
        {"dir", required_argument, NULL, O_DIR},
        {"turns", required_argument, NULL, O_TURNS},
        {"users", required_argument, NULL, O_USERS},
        {"runs", required_argument, NULL, O_RUNS},
        {"payload", no_argument, NULL, O_PAYLOAD},
        {"json", no_argument, NULL, O_JSON},
        {"check", no_argument, NULL, O_CHECK},
        {"durability", required_argument, NULL, O_DURABILITY},
        {"prefault", no_argument, NULL, O_PREFAULT},
        {"only", required_argument, NULL, O_ONLY},
        {"scrape-ms", required_argument, NULL, O_SCRAPE},
        {"tier-nodes", required_argument, NULL, O_TIER_NODES},
        {"tier-max-depth", required_argument, NULL, O_TIER_DEPTH},
        {"tier-on-hit", no_argument, NULL, O_TIER_ON_HIT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (o) {
        case O_CAPACITY: cfg.capacity = parse_u64("--capacity", optarg, 1, 1ull << 31); break;
        case O_BLOCK_SIZE:
            cfg.block_size = (uint32_t)parse_u64("--block-size", optarg, 1, PKV_BLOCK_SIZE_MAX);
            break;
        case O_SEED: cfg.seed = parse_u64("--seed", optarg, 0, UINT64_MAX); break;
        case O_DIR:
            if (!optarg[0]) bad_usage("--dir: empty path");
            cfg.dir = optarg;
            break;
        case O_TURNS: cfg.turns = (uint32_t)parse_u64("--turns", optarg, 1, 1000000); break;
        case O_USERS: cfg.users = (uint32_t)parse_u64("--users", optarg, 1, 100000000); break;
        case O_RUNS: cfg.runs = (uint32_t)parse_u64("--runs", optarg, 1, 1000); break;
        case O_PAYLOAD: cfg.payload = true; break;
        case O_JSON: cfg.json = true; break;
        case O_CHECK: cfg.check = true; break;
        case O_DURABILITY:
            if (!strcmp(optarg, "group")) cfg.durability = PKV_DURABLE_GROUP;
            else if (!strcmp(optarg, "none")) cfg.durability = PKV_DURABLE_NONE;
            else if (!strcmp(optarg, "always")) cfg.durability = PKV_DURABLE_ALWAYS;
            else bad_usage("--durability: expected group, none or always, got '%s'", optarg);
            break;
        case O_PREFAULT: cfg.prefault = true; break;
        case O_ONLY:
            if (strcmp(optarg, "decode")) bad_usage("--only: expected decode, got '%s'", optarg);
            cfg.decode_only = true;
            break;
        case O_SCRAPE: cfg.scrape_ms = (uint32_t)parse_u64("--scrape-ms", optarg, 1, 60000); break;
        case O_TIER_NODES:
            if (!optarg[0]) bad_usage("--tier-nodes: empty node list");
            cfg.tier_nodes = optarg;
            break;
        case O_TIER_DEPTH:
            cfg.tier_max_depth = (uint32_t)parse_u64("--tier-max-depth", optarg, 0, UINT32_MAX);
            break;
        case O_TIER_ON_HIT: cfg.tier_on_hit = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2; /* getopt has named the problem */
        }
    }
    if (optind < argc) bad_usage("unexpected argument '%s'", argv[optind]);

    /* The micro-benchmarks keep a 32k-token prompt (and a fork of it) resident and
     * allow themselves a quarter of the cache; the longest conversation is also held. */
    const uint64_t long_blocks = (LONG_PROMPT + FORK_EXTRA + cfg.block_size - 1) / cfg.block_size;
    const uint64_t max_conv = SYS_MAX + (uint64_t)cfg.turns * (USER_MAX + GEN_MAX);
    const uint64_t conv_blocks = (max_conv + cfg.block_size - 1) / cfg.block_size + SAMPLES_MAX;
    uint64_t min_cap = 4 * long_blocks;
    if (min_cap < 2 * conv_blocks) min_cap = 2 * conv_blocks;
    if (cfg.capacity < min_cap)
        bad_usage("--capacity %" PRIu64 " is too small for block size %" PRIu32
                  " and %" PRIu32 " turns: at least %" PRIu64 " blocks are needed",
                  cfg.capacity, cfg.block_size, cfg.turns, min_cap);

    machine mc;
    machine_get(&mc);
    const double clock_ns = clock_overhead_ns();
    char *cmd = command_line(argc, argv);
    FILE *info = cfg.json ? stderr : stdout; /* progress goes to stderr with --json */

    /* Our own directory under --dir; the cache directory is created by pkv_open. */
    int n = snprintf(g_root, sizeof g_root, "%s/pkv-bench-XXXXXX", cfg.dir);
    if (n < 0 || (size_t)n >= sizeof g_root) {
        g_root[0] = '\0';
        die("--dir path too long");
    }
    if (!mkdtemp(g_root)) {
        int e = errno;
        g_root[0] = '\0';
        die("cannot create a directory under %s: %s", cfg.dir, strerror(e));
    }
    snprintf(g_cachedir, sizeof g_cachedir, "%s/cache", g_root);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* 1 layer x (K, V) x 1 head x block_size tokens x head_dim 8 x 2 bytes, in a slot
     * of a new arena's stride: a power of two >= 64 up to 2 KiB, else rounded up to
     * the page (docs/format.md; pkv_info() confirms it once the cache is open). */
    uint64_t block_bytes = 2ull * cfg.block_size * 8 * 2;
    uint64_t slot = (block_bytes + 4095) / 4096 * 4096;
    if (block_bytes <= 2048)
        for (slot = 64; slot < block_bytes; slot *= 2) {}
    double arena_gib = (4096.0 + (double)slot * (double)cfg.capacity) / (1024.0 * 1024 * 1024);

    if (!cfg.json) {
        printf("pkv-bench (pagedkv %d.%d core engine)\n", PKV_VERSION_MAJOR, PKV_VERSION_MINOR);
        printf("command:  %s\n", cmd);
        printf("machine:  %s; CPU: %s; %ld CPUs online; %.1f GiB RAM; load average %s\n", mc.os,
               mc.cpu, mc.nproc, mc.mem_gib, mc.load);
        printf("cache:    %s (removed at exit)\n", g_cachedir);
        printf("geometry: capacity %" PRIu64 " blocks x %" PRIu32 " tokens; 1 layer, 1 KV head, "
               "head_dim 8, f16; %" PRIu64 " B payload in a %" PRIu64 " B slot; arena %.2f GiB\n",
               cfg.capacity, cfg.block_size, block_bytes, slot, arena_gib);
        printf("log:      write-ahead log on, durability %s%s; arena %s\n",
               durability_name(cfg.durability),
               cfg.durability == PKV_DURABLE_GROUP ? " (the default)" : "",
               cfg.prefault ? "prefaulted at open (PKV_OPEN_PREFAULT)"
                            : "not prefaulted: the first touch of each block slot page-faults "
                              "inside the timed loops");
        printf("workload: seed %" PRIu64 "; %" PRIu32 " users x %" PRIu32 " turns, %u in flight; "
               "%d system prompts of %u-%u tokens (Zipf);\n"
               "          user messages %u-%u tokens, answers %u-%u tokens decoded 1 by 1; "
               "1 turn in %u forks %u-%u samples; payload %s\n",
               cfg.seed, cfg.users, cfg.turns, cfg.users < CONCURRENCY ? cfg.users : CONCURRENCY,
               N_SYS_PROMPTS, SYS_MIN, SYS_MAX, USER_MIN, USER_MAX, GEN_MIN, GEN_MAX, FORK_ONE_IN,
               SAMPLES_MIN, SAMPLES_MAX, cfg.payload ? "written through pkv_kv" : "not written");
        if (cfg.scrape_ms)
            printf("scraper:  a thread calls pkv_metrics_text every %" PRIu32 " ms while the "
                   "cache is open\n", cfg.scrape_ms);
        if (cfg.tier_nodes)
            printf("tier:     %s, publishing %s, publish_max_depth %" PRIu32 " (0: all), "
                   "fetch off; decode loops with it and without, ABBA\n", cfg.tier_nodes,
                   cfg.tier_on_hit ? "on hit" : "at every seal", cfg.tier_max_depth);
        printf("runs:     %" PRIu32 "; clock_gettime(CLOCK_MONOTONIC) costs ~%.0f ns; every timed "
               "region spans >= 64 calls or >= 1 us\n\n", cfg.runs, clock_ns);
        fflush(stdout);
    } else {
        fprintf(stderr, "pkv-bench: cache in %s (removed at exit)\n", g_cachedir);
    }

    bench b;
    memset(&b, 0, sizeof b);
    b.slots = xmalloc(PREFILL_CHUNK * sizeof *b.slots);
    run_result *res = xcalloc(cfg.runs, sizeof *res);
    bool deterministic = true;
    for (unsigned run = 1; run <= cfg.runs; run++) {
        uint64_t t0 = now_ns();
        do_run(&b, run, &res[run - 1]);
        double secs = (double)(now_ns() - t0) / 1e9;
        const run_result *r = &res[run - 1];
        if (run > 1 && !same_core_stats(&r->st_workload, &res[0].st_workload))
            deterministic = false;
        if (cfg.decode_only)
            fprintf(info, "run %u/%u: %.1f s; decode on the empty cache %.1f ns/token (%.1f "
                          "with K/V written); in one call per step %.1f (%.1f)\n", run,
                    cfg.runs, secs, r->m[M_DECODE_EMPTY_NS_TOKEN], r->m[M_DECODE_KV_NS_TOKEN],
                    r->m[M_STEP_NS_TOKEN], r->m[M_STEP_KV_NS_TOKEN]);
        else
            fprintf(info, "run %u/%u: %.1f s; workload %.2f s (%.0f turns/s, %.3g tokens/s, "
                          "hit %.1f%%); attach %.1f ns/block; decode %.1f ns/token\n",
                    run, cfg.runs, secs, r->m[M_WL_SECONDS], r->m[M_WL_TURNS_PER_S],
                    r->m[M_WL_TOKENS_PER_S],
                    pct(r->st_workload.hit_tokens,
                        r->st_workload.hit_tokens + r->st_workload.miss_tokens),
                    r->m[M_ATTACH_NS_BLOCK], r->m[M_DECODE_NS_TOKEN]);
        if (cfg.tier_nodes)
            fprintf(info, "  tier pair: decode %.1f ns/token with, %.1f without; step %.1f "
                          "with, %.1f without; tier: %" PRIu64 " published, %" PRIu64
                          " dropped, %" PRIu64 " failed\n",
                    r->m[M_DECODE_TIER_NS_TOKEN], r->m[M_DECODE_NOTIER_NS_TOKEN],
                    r->m[M_STEP_TIER_NS_TOKEN], r->m[M_STEP_NOTIER_NS_TOKEN],
                    r->st_tier.tier_published, r->st_tier.tier_publish_dropped,
                    r->st_tier.tier_publish_errors);
        fflush(info);
    }

    if (cfg.json) report_json(&mc, cmd, res, cfg.runs, deterministic, slot, clock_ns);
    else report_text(res, cfg.runs, deterministic);

    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s", g_root);
    cleanup();
    if (!cfg.json) printf("removed %s\n", root);
    free(res);
    free(b.slots);
    free(cmd);
    return 0;
}

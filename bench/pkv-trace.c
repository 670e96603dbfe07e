/*
 * pkv-trace.c — replay request traces (Mooncake JSONL format, or a seeded
 * synthetic one) through pagedkv and through a block-level policy simulator, and
 * report prefix-cache hit rates per capacity against Belady's offline optimum.
 *
 * For each capacity of the sweep:
 *  - the engine (the real library, with its leaf-first LRU or, with
 *    --engine-policy leaf-slru, its leaf-first SLRU) replays the whole trace: each
 *    request opens a sequence with its prompt (hash ids mapped to deterministic
 *    512-token runs, cut into the cache's blocks), appends and commits the rest of
 *    the prompt and then the request's output tokens in batches, and closes. The
 *    cache is opened with PKV_DURABLE_NONE and a tiny geometry (1 layer, 1 KV
 *    head, head_dim 8, f16), and K/V payload is not written unless --payload: what
 *    is measured is the metadata path (lookup, block tables, refcounts, hashing,
 *    prefix index, LRU, log records and checkpoints) and the first touch of each
 *    arena slot. Hit rates come from pkv_get_stats();
 *  - the simulator (trace_sim.c) replays the same operations for each policy:
 *    leaf-first LRU, plain LRU, Belady, and the frequency-aware leaf policies; the
 *    one the engine runs must reproduce the engine's counters exactly (checked
 *    and reported). Each policy's share of the leaf-LRU-to-Belady gap is shown.
 * Output: a table on stdout, and with --csv FILE one row per (capacity, policy)
 * for scripts/plot-trace.sh. See docs/trace.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pagedkv.h"
#include "trace_data.h"
#include "trace_replay.h"
#include "trace_sim.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Command line ----------------------------------------------------------- */

#define MAX_CAPS 64

static struct config {
    const char *trace_path;
    bool synthetic;
    trace_synth_opts syn;
    const char *write_trace;
    uint64_t seed;
    uint32_t block_size;
    uint32_t batch;
    const char *capacities;
    const char *policies;
    uint64_t engine_max;
    bool no_engine, no_sim;
    bool payload, prefault, check, limbo_wait;
    int durability;           /* pkv_durability */
    uint32_t layers, kv_heads, head_dim;
    uint64_t checkpoint_mib;
    const char *dir;
    const char *arena_dir;
    const char *csv;
    const char *label;
    size_t limit;
    double protect, ghost;
    sim_policy engine_policy;
} cfg = {
    .seed = 1,
    .block_size = 16,
    .batch = 8192,
    .engine_max = 2u << 20,
    .dir = "/tmp",
    .protect = 0.5,
    .ghost = 2.0,
    .engine_policy = SIM_LEAF_LRU,
    .durability = PKV_DURABLE_NONE,
    .layers = 1,
    .kv_heads = 1,
    .head_dim = 8,
};

static const char *durability_name(int d) {
    return d == PKV_DURABLE_NONE ? "NONE" : d == PKV_DURABLE_GROUP ? "GROUP" : "ALWAYS";
}

static const char *default_capacities =
    "1%,2%,3%,5%,7.5%,10%,15%,20%,30%,2M,40%,50%,70%,100%";
static const char *default_policies = "leaf-lru,lru,belady,leaf-slru";

static void usage(FILE *f) {
    fprintf(f,
"usage: pkv-trace (--trace FILE | --synthetic) [options]\n"
"  --trace FILE         replay a JSONL trace (Mooncake format)\n"
"  --synthetic          generate a seeded synthetic trace instead\n"
"  --requests N         synthetic: requests (default 12000)\n"
"  --syn KEY=V          synthetic: set a generator knob (repeatable): sys-prompts,\n"
"                       zipf, sys-min, sys-max (system prompt tokens), user-min,\n"
"                       user-max, out-min, out-max, turns (mean per session),\n"
"                       max-prompt, doc-share, doc-min, doc-max, concurrency\n"
"                       (sessions in flight: the reuse distance), gap-ms\n"
"  --write-trace FILE   write the trace replayed (after --limit) as JSONL\n"
"  --seed N             token ids and synthetic trace (default 1)\n"
"  --block-size N       tokens per block, a divisor of 512 (default 16)\n"
"  --batch N            tokens per append+commit call (default 8192)\n"
"  --capacities LIST    comma-separated capacities: N blocks (k/M suffixes: 2M =\n"
"                       2*2^20), or P%% of the trace's distinct blocks\n"
"                       (default %s)\n"
"  --policies LIST      simulated policies (default %s;\n"
"                       also leaf-mq)\n"
"  --protect F          leaf-slru, leaf-mq: protected share of capacity (default 0.5)\n"
"  --ghost F            leaf-slru, leaf-mq: ghost window in evictions, as a multiple\n"
"                       of capacity (default 2; 0 = no ghosts)\n"
"  --engine-policy P    the engine's eviction: leaf-lru (default) or leaf-slru\n"
"                       (needs --ghost 0 and a protect of whole percent: the\n"
"                       engine keeps no ghosts); checked against the simulated P\n"
"  --engine-max N       replay the engine only at capacities <= N blocks\n"
"                       (default 2M; 0 = every capacity)\n"
"  --no-engine          simulator only        --no-sim   engine only\n"
"  --limit N            replay only the first N requests\n"
"  --payload            also write K/V through pkv_kv() (off: metadata path only)\n"
"  --geometry L,H,D     layers, KV heads, head_dim of the f16 K/V (default 1,1,8: 32\n"
"                       bytes of K/V per token; 30,3,64 is SmolLM2-135M's 23,040)\n"
"  --durability MODE    none (default), group (the library's default) or always\n"
"  --prefault           open the cache with PKV_OPEN_PREFAULT\n"
"  --limbo-wait         open the cache with PKV_OPEN_LIMBO_WAIT (wait for the log to\n"
"                       release freed blocks rather than evict): the engine must\n"
"                       then equal the simulator exactly. Without it the engine\n"
"                       may evict up to limbo_evict_max blocks more, and its hits\n"
"                       must lie between the simulator's at capacity C - that and\n"
"                       at C (checked under leaf-lru, reported under leaf-slru)\n"
"  --no-limbo-wait      the default (accepted for older command lines)\n"
"  --checkpoint-mib N   exact log size that triggers a checkpoint (default: the\n"
"                       engine's: 64 MiB or the newest snapshot's size)\n"
"  --check              pkv_check() after each engine replay\n"
"  --dir DIR            where the temporary cache directory goes (default /tmp);\n"
"                       it is removed after each capacity\n"
"  --arena-dir DIR      put the arena file in a temporary directory under DIR\n"
"                       (pkv_options.arena_dir, e.g. /dev/shm; default: in the\n"
"                       cache directory); removed after each capacity too\n"
"  --csv FILE           write one row per (capacity, policy) for plot-trace.sh\n"
"  --label NAME         trace name in the CSV (default: file name or 'synthetic')\n",
            default_capacities, default_policies);
}

/* --syn KEY=V: one field of trace_synth_opts. */
static bool parse_synth_knob(const char *arg, trace_synth_opts *o) {
    static const struct {
        const char *key;
        size_t off;
        bool real;
    } knobs[] = {
        {"sys-prompts", offsetof(trace_synth_opts, sys_prompts), false},
        {"zipf", offsetof(trace_synth_opts, zipf_s), true},
        {"sys-min", offsetof(trace_synth_opts, sys_min), false},
        {"sys-max", offsetof(trace_synth_opts, sys_max), false},
        {"user-min", offsetof(trace_synth_opts, user_min), false},
        {"user-max", offsetof(trace_synth_opts, user_max), false},
        {"out-min", offsetof(trace_synth_opts, out_min), false},
        {"out-max", offsetof(trace_synth_opts, out_max), false},
        {"turns", offsetof(trace_synth_opts, mean_turns), true},
        {"max-prompt", offsetof(trace_synth_opts, max_prompt), false},
        {"doc-share", offsetof(trace_synth_opts, doc_share), true},
        {"doc-min", offsetof(trace_synth_opts, doc_min), false},
        {"doc-max", offsetof(trace_synth_opts, doc_max), false},
        {"concurrency", offsetof(trace_synth_opts, concurrency), false},
        {"gap-ms", offsetof(trace_synth_opts, mean_gap_ms), true},
    };
    const char *eq = strchr(arg, '=');
    if (!eq) return false;
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++) {
        if (strlen(knobs[i].key) != (size_t)(eq - arg) ||
            strncmp(arg, knobs[i].key, (size_t)(eq - arg)) != 0)
            continue;
        char *end;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (errno || end == eq + 1 || *end || v < 0) return false;
        if (knobs[i].real) {
            *(double *)(void *)((char *)o + knobs[i].off) = v;
            return true;
        }
        if (v != (double)(uint32_t)v) return false;
        *(uint32_t *)(void *)((char *)o + knobs[i].off) = (uint32_t)v;
        return true;
    }
    return false;
}

/* ---- Errors and clean-up ------------------------------------------------------ */

static pkv_cache *g_cache;
static char g_root[PATH_MAX - 16];
static char g_aroot[PATH_MAX - 16]; /* --arena-dir: the arena's temporary directory */
static volatile sig_atomic_t g_stop;

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "pkv-trace: warning: cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

static void cleanup(void) {
    if (g_cache) {
        pkv_close(g_cache);
        g_cache = NULL;
    }
    if (g_root[0]) {
        nftw(g_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        g_root[0] = '\0';
    }
    if (g_aroot[0]) {
        nftw(g_aroot, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        g_aroot[0] = '\0';
    }
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-trace: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cleanup();
    exit(1);
}

static _Noreturn void die_pkv(int rc, const char *call, int line, size_t req) {
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", pkv_last_error());
    fprintf(stderr, "pkv-trace: error at request %zu: %s failed (pkv-trace.c:%d): %s (%d)%s%s\n",
            req, call, line, pkv_strerror(rc), rc, detail[0] ? ": " : "", detail);
    cleanup();
    exit(1);
}

#define PKV(call, req)                                                          \
    do {                                                                        \
        int rc_ = (call);                                                       \
        if (__builtin_expect(rc_ < 0, 0)) die_pkv(rc_, #call, __LINE__, (req)); \
    } while (0)

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void check_stop(void) {
    if (g_stop) {
        fprintf(stderr, "pkv-trace: interrupted\n");
        cleanup();
        exit(130);
    }
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Parsing ----------------------------------------------------------------- */

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* "123", "2M", "64k", "5%", "7.5%"; percentages resolve against `distinct`. */
static bool parse_capacity(const char *s, uint64_t distinct, uint64_t *out, double *pct) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0 || s[0] == '-') return false;
    *pct = -1;
    if (strcmp(end, "%") == 0) {
        *pct = v;
        *out = (uint64_t)llround(v / 100.0 * (double)distinct);
    } else if (*end == '\0') {
        if (v != floor(v)) return false;
        *out = (uint64_t)v;
    } else if (strcmp(end, "k") == 0 || strcmp(end, "K") == 0) {
        *out = (uint64_t)llround(v * 1024);
    } else if (strcmp(end, "M") == 0) {
        *out = (uint64_t)llround(v * 1048576);
    } else {
        return false;
    }
    return *out > 0 && *out < (1ull << 31);
}

/* ---- Engine replay ------------------------------------------------------------ */

typedef struct engine_result {
    pkv_stats st;
    trace_replay_stats rs;
    double open_s, close_s;
    int64_t storage_bytes; /* written to storage by the process during the replay; -1 unknown */
} engine_result;

/* Bytes this process has caused to be written to storage (write_bytes of
 * /proc/self/io: page-cache pages dirtied, mmap'd arena pages included, and
 * direct writes such as the log's), or -1 if the kernel does not say. */
static int64_t storage_written(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "write_bytes: %lld", &v) == 1) break;
    fclose(f);
    return v;
}

static void engine_replay(const trace *t, uint64_t capacity, engine_result *er) {
    memset(er, 0, sizeof *er);
    int k = snprintf(g_root, sizeof g_root, "%s/pkv-trace-XXXXXX", cfg.dir);
    if (k < 0 || (size_t)k >= sizeof g_root) die("--dir path too long");
    if (!mkdtemp(g_root)) {
        int e = errno;
        g_root[0] = '\0';
        die("mkdtemp under %s: %s", cfg.dir, strerror(e));
    }
    char cachedir[PATH_MAX];
    snprintf(cachedir, sizeof cachedir, "%s/cache", g_root);
    if (cfg.arena_dir) {
        k = snprintf(g_aroot, sizeof g_aroot, "%s/pkv-trace-XXXXXX", cfg.arena_dir);
        if (k < 0 || (size_t)k >= sizeof g_aroot) die("--arena-dir path too long");
        if (!mkdtemp(g_aroot)) {
            int e = errno;
            g_aroot[0] = '\0';
            die("mkdtemp under %s: %s", cfg.arena_dir, strerror(e));
        }
    }

    pkv_options opt;
    pkv_options_init(&opt);
    opt.num_layers = cfg.layers;
    opt.num_kv_heads = cfg.kv_heads;
    opt.head_dim = cfg.head_dim;
    opt.block_size = cfg.block_size;
    opt.dtype = PKV_F16;
    opt.capacity = capacity;
    char model_id[64];
    snprintf(model_id, sizeof model_id, "pkv-trace/%uL-%uH-d%u-f16", cfg.layers, cfg.kv_heads,
             cfg.head_dim);
    opt.model_id = model_id;
    opt.durability = (pkv_durability)cfg.durability;
    opt.checkpoint_bytes = cfg.checkpoint_mib << 20;
    opt.flags = (cfg.prefault ? PKV_OPEN_PREFAULT : 0) |
                (cfg.limbo_wait ? PKV_OPEN_LIMBO_WAIT : 0);
    opt.arena_dir = cfg.arena_dir ? g_aroot : NULL;
    opt.eviction = cfg.engine_policy == SIM_LEAF_SLRU ? PKV_EVICT_LEAF_SLRU : PKV_EVICT_LEAF_LRU;
    opt.evict_protect_pct = (uint32_t)lround(cfg.protect * 100.0);
    double t0 = now_s();
    PKV(pkv_open(cachedir, &opt, &g_cache), 0);
    er->open_s = now_s() - t0;

    trace_replay_opts ro = {.seed = cfg.seed, .batch = cfg.batch, .payload = cfg.payload,
                            .limit = cfg.limit, .stop = &g_stop};
    int64_t io0 = storage_written();
    int rc = trace_replay(g_cache, t, &ro, &er->rs);
    int64_t io1 = storage_written();
    er->storage_bytes = io0 >= 0 && io1 >= 0 ? io1 - io0 : -1;
    if (rc == 1) check_stop();
    if (rc < 0) {
        fprintf(stderr, "pkv-trace: error at request %zu: %s failed: %s (%d)%s%s\n",
                er->rs.failed_request, er->rs.failed_call, pkv_strerror(rc), rc,
                er->rs.error[0] ? ": " : "", er->rs.error);
        cleanup();
        exit(1);
    }
    PKV(pkv_get_stats(g_cache, &er->st), er->rs.requests);
    if (cfg.check) {
        char why[512];
        rc = pkv_check(g_cache, why, sizeof why);
        if (rc) die("pkv_check after the replay at capacity %" PRIu64 ": %s", capacity, why);
    }
    t0 = now_s();
    pkv_close(g_cache);
    g_cache = NULL;
    er->close_s = now_s() - t0;
    cleanup(); /* removes the directory */
}

/* ---- Report -------------------------------------------------------------------- */

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

static FILE *g_csv;

static void csv_row(const char *label, uint64_t cap, double share, const char *policy,
                    uint64_t ht, uint64_t mt, uint64_t hb, uint64_t mb, uint64_t ev,
                    uint64_t strands, uint64_t dead, double secs, uint64_t calls) {
    if (!g_csv) return;
    fprintf(g_csv,
            "%s,%u,%" PRIu64 ",%.4f,%s,%.4f,%.4f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
            ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%.3f,%" PRIu64 "\n",
            label, cfg.block_size, cap, share, policy, pct(ht, ht + mt), pct(hb, hb + mb), ht, mt,
            hb, mb, ev, strands, dead, secs, calls);
    fflush(g_csv);
}

/* The share of the leaf-LRU-to-Belady gap a hit rate closes ("-" without both). */
static const char *gap_closed(double base, double best, double th) {
    static char buf[16];
    if (isnan(base) || isnan(best) || best - base < 1e-9) return "-";
    snprintf(buf, sizeof buf, "%6.1f%%", 100.0 * (th - base) / (best - base));
    return buf;
}

static bool sim_equals_engine(const sim_result *s, const pkv_stats *e) {
    return s->hit_tokens == e->hit_tokens && s->miss_tokens == e->miss_tokens &&
           s->hit_blocks == e->hit_blocks && s->miss_blocks == e->miss_blocks &&
           s->evictions == e->evictions && s->seals == e->seals && s->dedupes == e->dedupes;
}

int main(int argc, char **argv) {
    trace_synth_defaults(&cfg.syn);
    enum {
        O_TRACE = 256, O_SYN, O_REQ, O_WRITE, O_SEED, O_BS, O_BATCH, O_CAPS, O_POL, O_EMAX,
        O_NOENG, O_NOSIM, O_LIMIT, O_PAYLOAD, O_PREFAULT, O_LIMBO, O_NOLIMBO, O_GEOM, O_DURAB, O_CKPT, O_CHECK, O_DIR, O_ADIR, O_CSV,
        O_LABEL, O_PROTECT, O_GHOST, O_EPOL, O_SYNK, O_HELP
    };
    static const struct option longopts[] = {
        {"trace", required_argument, 0, O_TRACE},
        {"synthetic", no_argument, 0, O_SYN},
        {"requests", required_argument, 0, O_REQ},
        {"write-trace", required_argument, 0, O_WRITE},
        {"seed", required_argument, 0, O_SEED},
        {"block-size", required_argument, 0, O_BS},
        {"batch", required_argument, 0, O_BATCH},
        {"capacities", required_argument, 0, O_CAPS},
        {"policies", required_argument, 0, O_POL},
        {"engine-max", required_argument, 0, O_EMAX},
        {"no-engine", no_argument, 0, O_NOENG},
        {"no-sim", no_argument, 0, O_NOSIM},
        {"limit", required_argument, 0, O_LIMIT},
        {"payload", no_argument, 0, O_PAYLOAD},
        {"prefault", no_argument, 0, O_PREFAULT},
        {"geometry", required_argument, 0, O_GEOM},
        {"durability", required_argument, 0, O_DURAB},
        {"limbo-wait", no_argument, 0, O_LIMBO},
        {"no-limbo-wait", no_argument, 0, O_NOLIMBO},
        {"checkpoint-mib", required_argument, 0, O_CKPT},
        {"check", no_argument, 0, O_CHECK},
        {"dir", required_argument, 0, O_DIR},
        {"arena-dir", required_argument, 0, O_ADIR},
        {"csv", required_argument, 0, O_CSV},
        {"label", required_argument, 0, O_LABEL},
        {"protect", required_argument, 0, O_PROTECT},
        {"ghost", required_argument, 0, O_GHOST},
        {"engine-policy", required_argument, 0, O_EPOL},
        {"syn", required_argument, 0, O_SYNK},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    int o;
    uint64_t v;
    while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case O_TRACE: cfg.trace_path = optarg; break;
        case O_SYN: cfg.synthetic = true; break;
        case O_REQ:
            ok = parse_u64(optarg, &v) && v > 0 && v <= UINT32_MAX;
            cfg.syn.requests = (uint32_t)v;
            break;
        case O_WRITE: cfg.write_trace = optarg; break;
        case O_SEED: ok = parse_u64(optarg, &cfg.seed); break;
        case O_BS:
            ok = parse_u64(optarg, &v) && v > 0 && TRACE_HASH_TOKENS % v == 0;
            cfg.block_size = (uint32_t)v;
            break;
        case O_BATCH:
            ok = parse_u64(optarg, &v) && v > 0 && v <= (1u << 24);
            cfg.batch = (uint32_t)v;
            break;
        case O_CAPS: cfg.capacities = optarg; break;
        case O_POL: cfg.policies = optarg; break;
        case O_EMAX: ok = parse_u64(optarg, &cfg.engine_max); break;
        case O_NOENG: cfg.no_engine = true; break;
        case O_NOSIM: cfg.no_sim = true; break;
        case O_LIMIT:
            ok = parse_u64(optarg, &v) && v > 0;
            cfg.limit = (size_t)v;
            break;
        case O_PAYLOAD: cfg.payload = true; break;
        case O_PREFAULT: cfg.prefault = true; break;
        case O_GEOM: {
            unsigned l, h, d;
            char end;
            ok = sscanf(optarg, "%u,%u,%u%c", &l, &h, &d, &end) == 3 && l >= 1 && l <= 4096 &&
                 h >= 1 && h <= 4096 && d >= 1 && d <= 4096;
            cfg.layers = l, cfg.kv_heads = h, cfg.head_dim = d;
            break;
        }
        case O_DURAB:
            if (!strcmp(optarg, "none")) cfg.durability = PKV_DURABLE_NONE;
            else if (!strcmp(optarg, "group")) cfg.durability = PKV_DURABLE_GROUP;
            else if (!strcmp(optarg, "always")) cfg.durability = PKV_DURABLE_ALWAYS;
            else ok = false;
            break;
        case O_LIMBO: cfg.limbo_wait = true; break;
        case O_NOLIMBO: cfg.limbo_wait = false; break;
        case O_CKPT:
            ok = parse_u64(optarg, &cfg.checkpoint_mib) && cfg.checkpoint_mib < (1ull << 40);
            break;
        case O_CHECK: cfg.check = true; break;
        case O_DIR: cfg.dir = optarg; break;
        case O_ADIR: cfg.arena_dir = optarg; break;
        case O_CSV: cfg.csv = optarg; break;
        case O_LABEL: cfg.label = optarg; break;
        case O_PROTECT: ok = parse_double(optarg, 1e-6, 1.0, &cfg.protect); break;
        case O_GHOST: ok = parse_double(optarg, 0.0, 64.0, &cfg.ghost); break;
        case O_SYNK: ok = parse_synth_knob(optarg, &cfg.syn); break;
        case O_EPOL: {
            int p = sim_policy_parse(optarg);
            ok = p == SIM_LEAF_LRU || p == SIM_LEAF_SLRU;
            cfg.engine_policy = (sim_policy)p;
            break;
        }
        case O_HELP: usage(stdout); return 0;
        default: ok = false; break;
        }
        if (!ok) {
            if (o != '?') fprintf(stderr, "pkv-trace: bad value for option: %s\n", optarg ? optarg : "");
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || (!cfg.trace_path == !cfg.synthetic)) {
        fprintf(stderr, "pkv-trace: give exactly one of --trace FILE and --synthetic\n");
        usage(stderr);
        return 2;
    }
    bool pol_on[SIM_NPOLICIES];
    for (int i = 0; i < SIM_NPOLICIES; i++) pol_on[i] = false;
    {
        char *list = strdup(cfg.policies ? cfg.policies : default_policies), *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int p = sim_policy_parse(tok);
            if (p < 0) {
                fprintf(stderr, "pkv-trace: unknown policy '%s'\n", tok);
                usage(stderr);
                return 2;
            }
            pol_on[p] = true;
        }
        free(list);
    }
    /* The engine comparison needs the simulator's policy of the same name; the gap
     * figures need leaf-lru. */
    if (!cfg.no_engine) pol_on[cfg.engine_policy] = pol_on[SIM_LEAF_LRU] = true;
    uint32_t engine_pct = (uint32_t)lround(cfg.protect * 100.0);
    if (!cfg.no_engine && cfg.engine_policy == SIM_LEAF_SLRU &&
        (cfg.ghost != 0.0 || engine_pct < 1 || fabs(engine_pct / 100.0 - cfg.protect) > 1e-9)) {
        fprintf(stderr, "pkv-trace: --engine-policy leaf-slru needs --ghost 0 and a --protect "
                        "of whole percent (the engine's evict_protect_pct)\n");
        return 2;
    }
    if (cfg.no_sim)
        for (int i = 0; i < SIM_NPOLICIES; i++) pol_on[i] = false;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* The trace. */
    trace t;
    double t0 = now_s();
    if (cfg.synthetic) {
        cfg.syn.seed = cfg.seed;
        if (trace_synthesize(&t, &cfg.syn)) die("synthetic trace: %s", t.err);
    } else if (trace_load(&t, cfg.trace_path)) {
        die("%s", t.err);
    }
    if (cfg.limit && cfg.limit < t.n && trace_truncate(&t, cfg.limit)) die("%s", t.err);
    double load_s = now_s() - t0;
    if (cfg.write_trace && trace_write(&t, cfg.write_trace)) die("%s", t.err);
    const char *label = cfg.label;
    if (!label) {
        if (cfg.synthetic) {
            label = "synthetic";
        } else {
            const char *sl = strrchr(cfg.trace_path, '/');
            label = sl ? sl + 1 : cfg.trace_path;
        }
    }
    trace_blocks tb;
    char err[256];
    t0 = now_s();
    if (trace_blocks_build(&t, cfg.block_size, &tb, err, sizeof err)) die("%s", err);
    double view_s = now_s() - t0;
    uint64_t distinct = trace_distinct_blocks(&tb);
    uint64_t inf_hits = tb.candidate_refs - tb.cold_candidate_refs;

    printf("pkv-trace: %s%s: %zu requests over %.1f min, %" PRIu64
           " prompt tokens (max %u), %" PRIu64 " output tokens\n",
           label, cfg.synthetic ? " (seeded)" : "", t.n,
           t.n ? (double)t.req[t.n - 1].ts / 60000.0 : 0.0, t.prompt_tokens, t.max_in,
           t.output_tokens);
    printf("  %u prefix nodes (512-token blocks), %" PRIu64 " distinct hash ids; loaded in %.2f s\n",
           t.nnodes, t.distinct_ids, load_s);
    printf("  %u-token blocks: %" PRIu64 " distinct prompt blocks + %" PRIu64
           " output blocks = %" PRIu64 " distinct; %" PRIu64
           " hit candidates (block view %.2f s)\n",
           cfg.block_size, tb.distinct_prompt, tb.unique_blocks, distinct, tb.candidate_refs,
           view_s);
    printf("  infinite cache: %.2f%% of prompt tokens, %.2f%% of candidate blocks hit; "
           "largest request holds %" PRIu64 " blocks\n",
           pct(inf_hits * cfg.block_size, t.prompt_tokens), pct(inf_hits, tb.candidate_refs),
           tb.max_req_blocks);
    char ckpt[96];
    if (cfg.checkpoint_mib)
        snprintf(ckpt, sizeof ckpt, "every %" PRIu64 " MiB of log", cfg.checkpoint_mib);
    else
        snprintf(ckpt, sizeof ckpt, "the engine's default (64 MiB of log or the snapshot's size)");
    printf("  engine: %s, durability %s, payload %s (%u layers x %u KV heads x head_dim %u, "
           "f16), prefault %s, limbo wait %s, batch %u tokens, checkpoints %s, arena under %s\n",
           cfg.no_engine ? "off" : "on", durability_name(cfg.durability),
           cfg.payload ? "on" : "off", cfg.layers, cfg.kv_heads, cfg.head_dim,
           cfg.prefault ? "on" : "off",
           cfg.limbo_wait ? "on" : "off", cfg.batch, ckpt,
           cfg.arena_dir ? cfg.arena_dir : cfg.dir);

    if (cfg.csv) {
        g_csv = fopen(cfg.csv, "w");
        if (!g_csv) die("%s: %s", cfg.csv, strerror(errno));
        fprintf(g_csv, "trace,block_size,capacity,share_pct,policy,token_hit_pct,block_hit_pct,"
                       "hit_tokens,miss_tokens,hit_blocks,miss_blocks,evictions,strands,"
                       "dead_evicted,seconds,calls\n");
        csv_row(label, distinct, 100.0, "infinite", inf_hits * cfg.block_size,
                t.prompt_tokens - inf_hits * cfg.block_size, inf_hits, tb.cold_candidate_refs, 0,
                0, 0, 0, 0);
    }

    /* Capacities. */
    uint64_t caps[MAX_CAPS];
    double shares[MAX_CAPS];
    size_t ncaps = 0;
    {
        char *list = strdup(cfg.capacities ? cfg.capacities : default_capacities), *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            double p;
            if (ncaps == MAX_CAPS) die("more than %d capacities", MAX_CAPS);
            if (!parse_capacity(tok, distinct, &caps[ncaps], &p)) {
                fprintf(stderr, "pkv-trace: bad capacity '%s'\n", tok);
                usage(stderr);
                return 2;
            }
            if (caps[ncaps] < tb.max_req_blocks) {
                fprintf(stderr,
                        "pkv-trace: capacity %s = %" PRIu64 " blocks is below the largest "
                        "request (%" PRIu64 " blocks); skipped\n",
                        tok, caps[ncaps], tb.max_req_blocks);
                continue;
            }
            shares[ncaps] = 100.0 * (double)caps[ncaps] / (double)distinct;
            ncaps++;
        }
        free(list);
    }

    printf("\n%10s %7s  %-16s %8s %8s %7s %10s %8s %8s %7s\n", "capacity", "share", "policy",
           "tok-hit", "blk-hit", "gap-pp", "evictions", "strands", "time-s", "closed");
    bool all_match = true;
    for (size_t ci = 0; ci < ncaps; ci++) {
        uint64_t cap = caps[ci];
        sim_result res[SIM_NPOLICIES];
        bool have[SIM_NPOLICIES] = {0};
        for (int p = 0; p < SIM_NPOLICIES; p++) {
            if (!pol_on[p]) continue;
            check_stop();
            sim_params sp = {.capacity = cap, .batch = cfg.batch, .policy = (sim_policy)p,
                             .protect = cfg.protect, .ghost = cfg.ghost, .limit = cfg.limit};
            /* the engine's quota, in whole percent of the capacity */
            if (p == SIM_LEAF_SLRU && !cfg.no_engine && cfg.engine_policy == SIM_LEAF_SLRU)
                sp.protect_blocks = cap * engine_pct / 100;
            if (sim_run(&t, &tb, &sp, &res[p]) != 0) {
                if (res[p].failed_request >= 0)
                    die("simulator: request %" PRId64 " does not fit in %" PRIu64 " blocks",
                        res[p].failed_request, cap);
                die("simulator: out of memory at capacity %" PRIu64, cap);
            }
            have[p] = true;
        }
        double best = have[SIM_BELADY] ? pct(res[SIM_BELADY].hit_tokens,
                                             res[SIM_BELADY].hit_tokens + res[SIM_BELADY].miss_tokens)
                                       : NAN;
        double base = have[SIM_LEAF_LRU] ? pct(res[SIM_LEAF_LRU].hit_tokens,
                                               res[SIM_LEAF_LRU].hit_tokens +
                                                   res[SIM_LEAF_LRU].miss_tokens)
                                         : NAN;
        bool first = true;
        for (int p = 0; p < SIM_NPOLICIES; p++) {
            if (!have[p]) continue;
            const sim_result *s = &res[p];
            double th = pct(s->hit_tokens, s->hit_tokens + s->miss_tokens);
            if (first) printf("%10" PRIu64 " %6.2f%%  ", cap, shares[ci]);
            else printf("%10s %7s  ", "", "");
            first = false;
            printf("%-16s %7.2f%% %7.2f%% %7.2f %10" PRIu64 " %8" PRIu64 " %8.2f %s\n",
                   sim_policy_name((sim_policy)p), th,
                   pct(s->hit_blocks, s->hit_blocks + s->miss_blocks),
                   isnan(best) ? 0.0 : best - th, s->evictions, s->strands, s->seconds,
                   gap_closed(base, best, th));
            csv_row(label, cap, shares[ci], sim_policy_name((sim_policy)p), s->hit_tokens,
                    s->miss_tokens, s->hit_blocks, s->miss_blocks, s->evictions, s->strands,
                    s->dead_evicted, s->seconds, 0);
        }
        if (!cfg.no_engine && (cfg.engine_max == 0 || cap <= cfg.engine_max)) {
            engine_result er;
            fflush(stdout);
            engine_replay(&t, cap, &er);
            const pkv_stats *st = &er.st;
            double th = pct(st->hit_tokens, st->hit_tokens + st->miss_tokens);
            if (first) printf("%10" PRIu64 " %6.2f%%  ", cap, shares[ci]);
            else printf("%10s %7s  ", "", "");
            const trace_replay_stats *rs = &er.rs;
            char ename[24];
            snprintf(ename, sizeof ename, "engine %s", sim_policy_name(cfg.engine_policy));
            printf("%-16s %7.2f%% %7.2f%% %7.2f %10" PRIu64 " %8s %8.2f %s\n", ename, th,
                   pct(st->hit_blocks, st->hit_blocks + st->miss_blocks),
                   isnan(best) ? 0.0 : best - th,
                   st->evictions, "-", rs->seconds, gap_closed(base, best, th));
            char verdict[256] = "";
            const int ep = cfg.engine_policy;
            const char *en = sim_policy_name(cfg.engine_policy);
            if (have[ep]) {
                bool eq = sim_equals_engine(&res[ep], st);
                /* Without limbo waits the engine may have evicted up to L =
                 * limbo_evict_max blocks more than the simulator at any time; under
                 * leaf-LRU its cached blocks are then the newest of the simulator's,
                 * so its hits lie between those at capacity C - L and at C
                 * (docs/design.md, "Free list, limbo"). */
                bool bracket = false;
                sim_result lo;
                uint64_t L = st->limbo_evict_max;
                if (!eq && !cfg.limbo_wait && L > 0 && L < cap) {
                    sim_params sp = {.capacity = cap - L, .batch = cfg.batch,
                                     .policy = (sim_policy)ep, .protect = cfg.protect,
                                     .ghost = cfg.ghost, .limit = cfg.limit};
                    if (ep == SIM_LEAF_SLRU) sp.protect_blocks = cap * engine_pct / 100;
                    if (sim_run(&t, &tb, &sp, &lo) != 0)
                        die("simulator: capacity %" PRIu64 " - %" PRIu64 " failed", cap, L);
                    bracket = lo.hit_tokens <= st->hit_tokens &&
                              st->hit_tokens <= res[ep].hit_tokens &&
                              lo.hit_blocks <= st->hit_blocks &&
                              st->hit_blocks <= res[ep].hit_blocks;
                }
                bool ok = eq || bracket || (!cfg.limbo_wait && ep != SIM_LEAF_LRU);
                all_match = all_match && ok;
                if (eq)
                    snprintf(verdict, sizeof verdict, "engine == simulated %s (hits, misses, "
                             "evictions, seals, dedupes)", en);
                else if (bracket)
                    snprintf(verdict, sizeof verdict, "engine hits within simulated %s's at "
                             "capacity - %" PRIu64 " (%.4f%%) and at capacity (limbo: "
                             "%" PRIu64 " blocks at most)", en, L,
                             pct(lo.hit_tokens, lo.hit_tokens + lo.miss_tokens), L);
                else if (ok)
                    snprintf(verdict, sizeof verdict, "differs from simulated %s (no bound "
                             "claimed for this policy without --limbo-wait)", en);
                else
                    snprintf(verdict, sizeof verdict, "MISMATCH with simulated %s", en);
                if (!eq) {
                    const sim_result *s = &res[ep];
                    fprintf(stderr,
                            "pkv-trace: capacity %" PRIu64 ": engine hit/miss tokens %" PRIu64
                            "/%" PRIu64 " blocks %" PRIu64 "/%" PRIu64 " evictions %" PRIu64
                            " seals %" PRIu64 " dedupes %" PRIu64 "; simulator %" PRIu64
                            "/%" PRIu64 " %" PRIu64 "/%" PRIu64 " %" PRIu64 " %" PRIu64
                            " %" PRIu64 "\n",
                            cap, st->hit_tokens, st->miss_tokens, st->hit_blocks,
                            st->miss_blocks, st->evictions, st->seals, st->dedupes,
                            s->hit_tokens, s->miss_tokens, s->hit_blocks, s->miss_blocks,
                            s->evictions, s->seals, s->dedupes);
                }
            }
            double wall = er.open_s + rs->seconds + er.close_s;
            printf("%20s engine: open %.2f s + replay %.2f s (%.2f s of it generating token "
                   "ids) + close %.2f s = %.2f s; replay CPU %.2f s on the request thread; "
                   "%.0f calls/s, %.0f requests/s, %.2f M "
                   "appended tokens/s; %" PRIu64 " seals, %" PRIu64 " dedupes; log: %" PRIu64
                   " records, %.0f MiB in %" PRIu64 " writes, %" PRIu64 " checkpoints\n%20s %s\n",
                   "", er.open_s, rs->seconds, rs->gen_seconds, er.close_s, wall, rs->cpu_seconds,
                   (double)rs->calls / rs->seconds, (double)rs->requests / rs->seconds,
                   (double)rs->appended / rs->seconds / 1e6, st->seals, st->dedupes,
                   st->wal_records, (double)st->wal_bytes / 1048576.0, st->wal_frames,
                   st->checkpoints, "", verdict);
            /* Where the request thread's time went: wall against its own CPU time
             * (user + system), the waits for the log the library counted, and the
             * payload's write rate over the replay's wall time. */
            uint64_t refs = st->hit_blocks + st->miss_blocks;
            double rwall = rs->seconds - rs->gen_seconds, rcpu = rs->cpu_seconds - rs->gen_seconds;
            /* Off CPU = blocked (sleeping: the library's waits, page faults that
             * wait for I/O, lock hand-offs) + runnable but not running (the
             * machine's load). On a loaded machine the second inflates wall time
             * by itself, so both are shown: wall less run-queue time over CPU is
             * the ratio the library is answerable for. */
            double rq = rs->runq_seconds, blocked = rq >= 0 ? rwall - rcpu - rq : NAN;
            printf("%20s request thread: wall %.2f s, CPU %.2f s (wall/CPU %.2f; token "
                   "generation excluded), run-queue wait %.2f s, blocked %.2f s ((wall - "
                   "run-queue)/CPU %.2f); %.0f ns wall, %.0f ns CPU per full block reference; "
                   "%" PRIu64 " major faults, %" PRIu64 " voluntary switches\n"
                   "%20s waits for the log: limbo %" PRIu64 " (%.2f s), SEAL before eviction "
                   "(D3) %" PRIu64 " (%.2f s), backlog %" PRIu64 " (%.2f s); %" PRIu64 " syncs\n",
                   "", rwall, rcpu, rcpu > 0 ? rwall / rcpu : 0.0, rq, blocked,
                   rcpu > 0 && rq >= 0 ? (rwall - rq) / rcpu : NAN,
                   refs ? 1e9 * rwall / (double)refs : 0.0, refs ? 1e9 * rcpu / (double)refs : 0.0,
                   rs->major_faults, rs->vol_switches,
                   "", st->waits_limbo, (double)st->wait_limbo_us / 1e6, st->waits_seal,
                   (double)st->wait_seal_us / 1e6, st->waits_backlog,
                   (double)st->wait_backlog_us / 1e6, st->wal_syncs);
            if (rs->payload_bytes)
                printf("%20s payload: %.1f MiB of K/V written, %.1f MiB/s over the replay's "
                       "wall time; storage writes %.1f MiB (%.1f MiB/s: arena pages and log)\n",
                       "", (double)rs->payload_bytes / 1048576.0,
                       (double)rs->payload_bytes / 1048576.0 / rs->seconds,
                       (double)er.storage_bytes / 1048576.0,
                       (double)er.storage_bytes / 1048576.0 / rs->seconds);
            csv_row(label, cap, shares[ci],
                    cfg.engine_policy == SIM_LEAF_LRU ? "engine" : "engine-leaf-slru",
                    st->hit_tokens, st->miss_tokens,
                    st->hit_blocks, st->miss_blocks, st->evictions, 0, 0, wall, rs->calls);
        }
        fflush(stdout);
    }
    if (g_csv) fclose(g_csv);
    trace_blocks_free(&tb);
    trace_free(&t);
    if (!all_match) {
        fprintf(stderr, "pkv-trace: the engine and the simulated %s differ\n",
                sim_policy_name(cfg.engine_policy));
        return 3;
    }
    return 0;
}

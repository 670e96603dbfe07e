/*
 * pkv-attnbench.c — bandwidth of the CPU paged decode attention (src/attention.c).
 *
 * For each storage type and context length it builds a batch of sequences whose
 * K/V together fill a working set much larger than the last-level cache, with
 * random (non-contiguous) block tables over a real pagedkv arena (or anonymous
 * memory with --mem), runs pkv_attn_decode for one layer, and reports the bytes
 * of K/V read per second. In the same run it measures memcpy() over a buffer of
 * the same size, and prints attention bytes/s divided by memcpy bytes/s (bytes
 * copied per second: each byte is read once and written once).
 *
 * Geometry (default): a Llama-3-8B layer: 8 K/V heads, 32 query heads (GQA 4),
 * head_dim 128, block_size 16; one query token per sequence.
 *
 * Usage: pkv-attnbench [--dtype f32|f16|bf16|all] [--contexts 4096,8192,...]
 *        [--kv-heads N] [--q-heads N] [--head-dim N] [--block-size N]
 *        [--threads N] [--working-set MIB] [--reps N] [--mem] [--portable]
 *        [--dir DIR] [--json]
 * A bad option prints the usage and exits 2; an error exits 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pagedkv.h"

#include <errno.h>
#include <ftw.h>
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CTX 16

static struct {
    int dtypes[3];
    int n_dtypes;
    size_t ctx[MAX_CTX];
    int n_ctx;
    uint32_t kv_heads, q_heads, head_dim, block_size, threads, reps;
    size_t ws_mib;
    bool mem, portable, json;
    const char *dir;
} cfg = {
    .dtypes = {PKV_F32, PKV_F16, PKV_BF16},
    .n_dtypes = 3,
    .ctx = {4096, 8192, 16384, 32768},
    .n_ctx = 4,
    .kv_heads = 8,
    .q_heads = 32,
    .head_dim = 128,
    .block_size = 16,
    .threads = 1,
    .reps = 7,
    .ws_mib = 256,
    .dir = "/tmp",
};

static char g_root[PATH_MAX - 32];

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

static void cleanup(void) {
    if (g_root[0]) nftw(g_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_root[0] = '\0';
}

static _Noreturn __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-attnbench: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cleanup();
    exit(1);
}

#define PKV(call)                                                                        \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_) die("%s: %s (%s)", #call, pkv_strerror(rc_), pkv_last_error());         \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) { /* CPU time of the process (all threads) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rs = 0x1234;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float frand(void) { return (float)((double)(rnd() >> 40) / (double)(1 << 24) * 2.0 - 1.0); }

static const char *dname(int dt) { return dt == PKV_F32 ? "f32" : dt == PKV_F16 ? "f16" : "bf16"; }

static _Noreturn void usage(int code) {
    fprintf(code ? stderr : stdout,
            "usage: pkv-attnbench [options]\n"
            "  --dtype f32|f16|bf16|all   storage types to measure (default all)\n"
            "  --contexts N,N,...         context lengths (default 4096,8192,16384,32768)\n"
            "  --kv-heads N               K/V heads (default 8)\n"
            "  --q-heads N                query heads, a multiple of kv-heads (default 32)\n"
            "  --head-dim N               (default 128)\n"
            "  --block-size N             tokens per block (default 16)\n"
            "  --threads N                attention threads (default 1)\n"
            "  --working-set MIB          K/V bytes per measurement (default 256)\n"
            "  --reps N                   timed repetitions, best is reported (default 7)\n"
            "  --mem                      anonymous memory instead of a pagedkv arena\n"
            "  --portable                 force the portable C path (PKV_ATTN_PORTABLE)\n"
            "  --dir DIR                  where the temporary cache goes (default /tmp)\n"
            "  --json                     JSON summary on stdout\n");
    exit(code);
}

static uint64_t parse_u64(const char *s, const char *what, uint64_t lo, uint64_t hi) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "pkv-attnbench: bad %s '%s' (%" PRIu64 "..%" PRIu64 ")\n", what, s, lo,
                hi);
        usage(2);
    }
    return v;
}

static void parse_args(int argc, char **argv) {
    static const struct option opts[] = {
        {"dtype", 1, 0, 'd'},       {"contexts", 1, 0, 'c'},   {"kv-heads", 1, 0, 'k'},
        {"q-heads", 1, 0, 'q'},     {"head-dim", 1, 0, 'h'},   {"block-size", 1, 0, 'b'},
        {"threads", 1, 0, 't'},     {"working-set", 1, 0, 'w'}, {"reps", 1, 0, 'r'},
        {"mem", 0, 0, 'm'},         {"portable", 0, 0, 'p'},   {"dir", 1, 0, 'D'},
        {"json", 0, 0, 'j'},        {"help", 0, 0, 'H'},       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (!strcmp(optarg, "all")) cfg.n_dtypes = 3;
            else if (!strcmp(optarg, "f32")) cfg.dtypes[0] = PKV_F32, cfg.n_dtypes = 1;
            else if (!strcmp(optarg, "f16")) cfg.dtypes[0] = PKV_F16, cfg.n_dtypes = 1;
            else if (!strcmp(optarg, "bf16")) cfg.dtypes[0] = PKV_BF16, cfg.n_dtypes = 1;
            else {
                fprintf(stderr, "pkv-attnbench: bad --dtype '%s'\n", optarg);
                usage(2);
            }
            break;
        case 'c': {
            cfg.n_ctx = 0;
            char *s = strdup(optarg), *save = NULL;
            if (!s) die("out of memory");
            for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (cfg.n_ctx == MAX_CTX) {
                    fprintf(stderr, "pkv-attnbench: at most %d contexts\n", MAX_CTX);
                    usage(2);
                }
                cfg.ctx[cfg.n_ctx++] = parse_u64(tok, "context", 1, 1u << 24);
            }
            free(s);
            if (!cfg.n_ctx) usage(2);
            break;
        }
        case 'k': cfg.kv_heads = (uint32_t)parse_u64(optarg, "--kv-heads", 1, 256); break;
        case 'q': cfg.q_heads = (uint32_t)parse_u64(optarg, "--q-heads", 1, 4096); break;
        case 'h': cfg.head_dim = (uint32_t)parse_u64(optarg, "--head-dim", 1, 1024); break;
        case 'b': cfg.block_size = (uint32_t)parse_u64(optarg, "--block-size", 1, PKV_BLOCK_SIZE_MAX); break;
        case 't': cfg.threads = (uint32_t)parse_u64(optarg, "--threads", 1, 256); break;
        case 'w': cfg.ws_mib = parse_u64(optarg, "--working-set", 1, 1u << 20); break;
        case 'r': cfg.reps = (uint32_t)parse_u64(optarg, "--reps", 1, 1000); break;
        case 'm': cfg.mem = true; break;
        case 'p': cfg.portable = true; break;
        case 'D': cfg.dir = optarg; break;
        case 'j': cfg.json = true; break;
        case 'H': usage(0);
        default: usage(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "pkv-attnbench: unexpected argument '%s'\n", argv[optind]);
        usage(2);
    }
    if (cfg.q_heads % cfg.kv_heads) {
        fprintf(stderr, "pkv-attnbench: --q-heads must be a multiple of --kv-heads\n");
        usage(2);
    }
}

static void sort_dbl(double *r, uint32_t n) { /* insertion sort */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && r[j] < r[j - 1]; j--) {
            double t = r[j];
            r[j] = r[j - 1], r[j - 1] = t;
        }
}

/* The memcpy buffers: as large as the K/V working set, touched once. */
static uint8_t *mc_a, *mc_b;
static size_t mc_bytes;

/* Bytes copied per second by one memcpy of the whole buffer. */
static double memcpy_once(uint32_t i) {
    uint64_t t0 = now_ns();
    memcpy(i & 1 ? mc_a : mc_b, i & 1 ? mc_b : mc_a, mc_bytes);
    uint64_t t1 = now_ns();
    __asm__ volatile("" : : "r"(mc_a), "r"(mc_b) : "memory"); /* keep the copy */
    return (double)mc_bytes / ((double)(t1 - t0) * 1e-9);
}

typedef struct result {
    int dtype;
    size_t ctx, n_seqs;
    double kv_bytes, best_bps, median_bps, ms_best, cpu_bps, mc_best, mc_median;
} result;

int main(int argc, char **argv) {
    parse_args(argc, argv);
    const size_t ws = cfg.ws_mib << 20;
    const uint32_t H = cfg.kv_heads, D = cfg.head_dim, bs = cfg.block_size, nq = cfg.q_heads;

    mc_bytes = ws;
    mc_a = xmalloc(ws);
    mc_b = xmalloc(ws);
    memset(mc_a, 1, ws);
    memset(mc_b, 2, ws);
    if (!cfg.json)
        printf("pkv-attnbench: %u kv heads, %u query heads, head_dim %u, block_size %u, "
               "%u thread%s, %zu MiB of K/V per measurement, %s%s\n"
               "each row: %u attention runs interleaved with %u memcpy runs of %zu MiB; best "
               "of each\n\n"
               "%-5s %8s %6s %10s %10s %12s %12s %11s %9s %12s\n",
               H, nq, D, bs, cfg.threads, cfg.threads == 1 ? "" : "s", cfg.ws_mib,
               cfg.mem ? "anonymous memory" : "pagedkv arena",
               cfg.portable ? ", portable path" : "", cfg.reps, cfg.reps, cfg.ws_mib, "dtype",
               "context", "seqs", "K/V MiB", "best ms", "best GB/s", "median GB/s",
               "memcpy GB/s", "vs memcpy", "GB/CPU-s");
    result res[3 * MAX_CTX];
    int n_res = 0;
    for (int di = 0; di < cfg.n_dtypes; di++) {
        const int dt = cfg.dtypes[di];
        const size_t es = dt == PKV_F32 ? 4 : 2;
        const size_t tok_bytes = (size_t)2 * H * D * es; /* K and V of one token, one layer */
        size_t max_ctx = 0;
        for (int i = 0; i < cfg.n_ctx; i++) max_ctx = cfg.ctx[i] > max_ctx ? cfg.ctx[i] : max_ctx;
        size_t blocks = ws / (tok_bytes * bs);
        const size_t need = (max_ctx + bs - 1) / bs;
        if (blocks < need) blocks = need;

        /* The K/V store: a pagedkv arena (1 layer) or anonymous memory, same layout. */
        pkv_cache *cache = NULL;
        pkv_kv_view view;
        void *anon = NULL;
        size_t anon_bytes = 0;
        if (cfg.mem) {
            const size_t run = (size_t)bs * D * es, block = run * H * 2;
            anon_bytes = block * blocks;
            anon = mmap(NULL, anon_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
            if (anon == MAP_FAILED) die("mmap %zu bytes: %s", anon_bytes, strerror(errno));
            if (getenv("PKV_BENCH_HUGE")) madvise(anon, anon_bytes, MADV_HUGEPAGE);
            view = (pkv_kv_view){.base = anon, .dtype = dt, .num_layers = 1, .num_kv_heads = H,
                                 .head_dim = D, .block_size = bs, .num_blocks = blocks,
                                 .block_stride = block, .layer_stride = block,
                                 .kind_stride = run * H, .head_stride = run,
                                 .token_stride = (size_t)D * es};
        } else {
            snprintf(g_root, sizeof g_root, "%s/pkv-attnbench.XXXXXX", cfg.dir);
            if (!mkdtemp(g_root)) die("mkdtemp %s: %s", g_root, strerror(errno));
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/cache", g_root);
            pkv_options o;
            pkv_options_init(&o);
            o.num_layers = 1, o.num_kv_heads = H, o.head_dim = D, o.block_size = bs;
            o.dtype = dt;
            o.capacity = blocks;
            o.model_id = "pkv-attnbench";
            o.durability = PKV_DURABLE_NONE;
            PKV(pkv_open(path, &o, &cache));
            PKV(pkv_kv_view_of(cache, &view));
        }
        /* Random K/V in every block (this also faults the pages in). */
        {
            float row[1024];
            uint8_t tmp[4096];
            for (size_t b = 0; b < blocks; b++)
                for (int k = 0; k < 2; k++)
                    for (uint32_t h = 0; h < H; h++)
                        for (uint32_t t = 0; t < bs; t++) {
                            for (uint32_t d = 0; d < D && d < 1024; d++) row[d] = frand();
                            uint8_t *dst = (uint8_t *)(uintptr_t)view.base + b * view.block_stride +
                                           (size_t)k * view.kind_stride + h * view.head_stride +
                                           t * view.token_stride;
                            PKV(pkv_kv_store(dt, tmp, row, D <= 1024 ? D : 1024));
                            memcpy(dst, tmp, (size_t)(D <= 1024 ? D : 1024) * es);
                        }
        }
        uint32_t *perm = xmalloc(blocks * sizeof *perm);
        for (size_t i = 0; i < blocks; i++) perm[i] = (uint32_t)i;
        for (size_t i = blocks - 1; i > 0; i--) {
            size_t j = rnd() % (i + 1);
            uint32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }

        for (int ci = 0; ci < cfg.n_ctx; ci++) {
            const size_t ctx = cfg.ctx[ci], nb = (ctx + bs - 1) / bs;
            size_t n_seqs = blocks / nb;
            if (n_seqs < 1) n_seqs = 1;
            pkv_attn_seq *seqs = xmalloc(n_seqs * sizeof *seqs);
            for (size_t s = 0; s < n_seqs; s++)
                seqs[s] = (pkv_attn_seq){perm + s * nb, nb, ctx};
            float *q = xmalloc(n_seqs * nq * D * sizeof(float));
            float *out = xmalloc(n_seqs * nq * D * sizeof(float));
            for (size_t i = 0; i < n_seqs * nq * D; i++) q[i] = frand();
            pkv_attn_params p = {.layer = 0, .num_q_heads = nq,
                                 .scale = 1.0f / sqrtf((float)D), .num_threads = cfg.threads,
                                 .flags = cfg.portable ? PKV_ATTN_PORTABLE : 0};
            PKV(pkv_attn_decode(&view, &p, seqs, n_seqs, q, out)); /* warm-up */
            double *r = xmalloc(cfg.reps * sizeof(double)), *mr = xmalloc(cfg.reps * sizeof(double));
            const double bytes = (double)n_seqs * (double)ctx * (double)tok_bytes;
            double best = 0, best_ms = 0, cpu_best = 0, mc_best = 0;
            for (uint32_t i = 0; i < cfg.reps; i++) {
                mr[i] = memcpy_once(i);
                if (mr[i] > mc_best) mc_best = mr[i];
                uint64_t c0 = cpu_ns(), t0 = now_ns();
                PKV(pkv_attn_decode(&view, &p, seqs, n_seqs, q, out));
                uint64_t t1 = now_ns(), c1 = cpu_ns();
                r[i] = bytes / ((double)(t1 - t0) * 1e-9);
                if (r[i] > best) best = r[i], best_ms = (double)(t1 - t0) * 1e-6;
                const double cb = bytes / ((double)(c1 - c0 ? c1 - c0 : 1) * 1e-9);
                if (cb > cpu_best) cpu_best = cb;
            }
            sort_dbl(r, cfg.reps);
            sort_dbl(mr, cfg.reps);
            for (size_t i = 0; i < n_seqs * nq * D; i++)
                if (!isfinite(out[i])) die("non-finite attention output");
            res[n_res] = (result){dt,       ctx,      n_seqs, bytes, best, r[cfg.reps / 2],
                                  best_ms, cpu_best, mc_best, mr[cfg.reps / 2]};
            if (!cfg.json)
                printf("%-5s %8zu %6zu %10.1f %10.2f %12.2f %12.2f %11.2f %9.2f %12.2f\n",
                       dname(dt), ctx, n_seqs, bytes / 1048576.0, best_ms, best / 1e9,
                       r[cfg.reps / 2] / 1e9, mc_best / 1e9, best / mc_best, cpu_best / 1e9);
            fflush(stdout);
            free(mr);
            n_res++;
            free(r);
            free(q);
            free(out);
            free(seqs);
        }
        free(perm);
        if (cache) pkv_close(cache);
        if (anon) munmap(anon, anon_bytes);
        cleanup();
    }
    if (cfg.json) {
        printf("{\n  \"config\": {\"kv_heads\": %u, \"q_heads\": %u, \"head_dim\": %u, "
               "\"block_size\": %u, \"threads\": %u, \"working_set_mib\": %zu, \"memory\": \"%s\", "
               "\"portable\": %s, \"reps\": %u},\n  \"results\": [\n",
               H, nq, D, bs, cfg.threads, cfg.ws_mib, cfg.mem ? "anonymous" : "arena",
               cfg.portable ? "true" : "false", cfg.reps);
        for (int i = 0; i < n_res; i++)
            printf("    {\"dtype\": \"%s\", \"context\": %zu, \"seqs\": %zu, \"kv_bytes\": %.0f, "
                   "\"best_ms\": %.3f, \"best_gbps\": %.3f, \"median_gbps\": %.3f, "
                   "\"memcpy_best_gbps\": %.3f, \"memcpy_median_gbps\": %.3f, "
                   "\"ratio_to_memcpy\": %.3f, \"gb_per_cpu_second\": %.3f}%s\n",
                   dname(res[i].dtype), res[i].ctx, res[i].n_seqs, res[i].kv_bytes,
                   res[i].ms_best, res[i].best_bps / 1e9, res[i].median_bps / 1e9,
                   res[i].mc_best / 1e9, res[i].mc_median / 1e9, res[i].best_bps / res[i].mc_best,
                   res[i].cpu_bps / 1e9, i + 1 < n_res ? "," : "");
        printf("  ]\n}\n");
    }
    free(mc_a);
    free(mc_b);
    return 0;
}

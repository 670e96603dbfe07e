/*
 * pkv-tierbench — the shared Redis tier (docs/remote.md): how fast a cold node
 * imports a published prompt, and what an empty tier adds to a local miss.
 *
 * usage: pkv-tierbench --nodes HOST:PORT[,...] [--blocks N] [--runs R] [--dir D]
 *                      [--model GGUF [--threads T] [--prompt-file F] [--dtype f16|f32|bf16]]
 * Needs a running Redis (standalone or cluster) it may write pkv:* keys to.
 * For two geometries, 16-token f16 blocks:
 *   smollm2  SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64 (368,640 B/block)
 *   llama8b  Llama-3-8B:   32 layers, 8 KV heads, head_dim 128 (2 MiB/block)
 * node A computes (writes) an N-block prompt and publishes it; then, R times, a
 * fresh node B opens the prompt and imports it (timed: pkv_seq_open, which
 * fetches, verifies and imports; deadline 60 s so nothing is cut). Reported:
 * median blocks/s and GB/s of payload over wall time, and blocks per CPU
 * second of the importing process (Redis's own CPU not included), which a
 * loaded machine distorts less. Then the empty-tier cost: 200 opens of
 * distinct 64-block prompts that nobody published, with the tier attached and
 * without (same cache settings), median microseconds each.
 * With --model, the model mode instead (bench/tierbench_model.c): the reference
 * model's real K/V of the demo's system prompt, its recompute rate against the
 * import rate, and the record bytes with and without PKV_TIER_LZ4.
 */
#define BENCH_NAME "pkv-tierbench"
#include "bench_util.h"
#include "tierbench_model.h"

#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

/* user + system CPU seconds of this process (its publisher thread is idle on B) */
static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static const char SECRET[] = "pkv-tierbench-secret-0123456789";

typedef struct geo {
    const char *name;
    uint32_t layers, heads, hdim;
} geo;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void rmrf(const char *d) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, BENCH_NAME ": could not remove %s\n", d);
}

static pkv_cache *open_cache(const char *dir, const geo *g, uint64_t cap) {
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = g->layers;
    o.num_kv_heads = g->heads;
    o.head_dim = g->hdim;
    o.block_size = 16;
    o.dtype = PKV_F16;
    o.capacity = cap;
    o.model_id = g->name;
    o.durability = PKV_DURABLE_NONE;
    pkv_cache *c = NULL;
    OK(pkv_open(dir, &o, &c));
    return c;
}

static pkv_tier_options topts(const char *nodes, uint32_t deadline_ms, uint32_t flags) {
    pkv_tier_options t;
    memset(&t, 0, sizeof t);
    t.nodes = nodes;
    t.secret = SECRET;
    t.secret_len = sizeof SECRET - 1;
    t.fetch_deadline_ms = deadline_ms;
    t.fetch_max_blocks = 4096;
    t.queue_blocks = 4096;
    t.connect_timeout_ms = 1000;
    t.flags = flags;
    return t;
}

int main(int argc, char **argv) {
    const char *nodes = NULL, *base = "/tmp", *model = NULL,
               *prompt_file = PKV_TIERBENCH_DATA_DIR "/system-prompt.md";
    uint32_t nblocks = 64, runs = 3, threads = 2;
    pkv_dtype dtype = PKV_F16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nodes") && i + 1 < argc) nodes = argv[++i];
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) nblocks = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt-file") && i + 1 < argc) prompt_file = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            if (!strcmp(d, "f32")) dtype = PKV_F32;
            else if (!strcmp(d, "f16")) dtype = PKV_F16;
            else if (!strcmp(d, "bf16")) dtype = PKV_BF16;
            else {
                fprintf(stderr, BENCH_NAME ": --dtype: f16, f32 or bf16, not '%s'\n", d);
                return 2;
            }
        }
        else {
            fprintf(stderr, "usage: %s --nodes HOST:PORT[,...] [--blocks N] [--runs R] [--dir D]\n"
                            "       [--model GGUF [--threads T] [--prompt-file F] [--dtype f16|f32|bf16]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!nodes || nblocks == 0 || runs == 0 || runs > 99 || threads == 0 || threads > 64) {
        fprintf(stderr, BENCH_NAME ": --nodes is required (a Redis to write pkv:* keys to); "
                        "--blocks, --runs (<= 99) and --threads (<= 64) are positive\n");
        return 2;
    }
    if (model) {
        const tbm_args ma = {nodes, model, prompt_file, base, nblocks, runs, threads, dtype};
        return tierbench_model(&ma);
    }
    const geo geos[2] = {{"smollm2-135m", 30, 3, 64}, {"llama3-8b", 32, 8, 128}};
    char dir[1024];
    const size_t n = (size_t)nblocks * 16 + 1;
    uint32_t *prompt = malloc(n * sizeof *prompt);
    pkv_slot *slots = malloc(n * sizeof *slots);
    if (!prompt || !slots) return 1;
    srand((unsigned)time(NULL));
    uint32_t salt = (uint32_t)rand(); /* fresh keys each run */
    printf("%-13s %8s %12s %10s %10s %14s\n", "geometry", "blocks", "block bytes", "blocks/s",
           "GB/s", "blocks/CPU-s");
    for (int gi = 0; gi < 2; gi++) {
        const geo *g = &geos[gi];
        for (size_t i = 0; i < n; i++) prompt[i] = (uint32_t)(i * 2654435761u % 50000u);
        snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-a", base, (int)getpid());
        rmrf(dir);
        pkv_cache *a = open_cache(dir, g, nblocks + 8);
        pkv_tier_options ta = topts(nodes, 60000, 0);
        OK(pkv_tier_attach(a, &ta));
        size_t got;
        OK(pkv_seq_open(a, 1, salt, prompt, n, &got));
        OK(pkv_seq_append(a, 1, prompt, n, slots));
        pkv_cache_info inf;
        OK(pkv_info(a, &inf));
        for (uint32_t b = 0; b <= nblocks; b++) {
            uint8_t *p = pkv_kv(a, slots[(size_t)b * 16 < n ? (size_t)b * 16 : n - 1].block, 0,
                                PKV_K, 0);
            memset(p, (int)(b * 37 + 1), inf.block_bytes); /* the whole block */
        }
        OK(pkv_seq_commit(a, 1, n - 1));
        OK(pkv_tier_flush(a, 120000));
        pkv_stats st;
        OK(pkv_get_stats(a, &st));
        if (st.tier_published != nblocks) {
            fprintf(stderr, BENCH_NAME ": published %llu of %u blocks (errors %llu)\n",
                    (unsigned long long)st.tier_published, nblocks,
                    (unsigned long long)st.tier_publish_errors);
            return 1;
        }
        pkv_close(a);
        rmrf(dir);
        double t[100], cpu[100];
        for (uint32_t r = 0; r < runs; r++) {
            snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-b", base, (int)getpid());
            rmrf(dir);
            pkv_cache *b = open_cache(dir, g, nblocks + 8);
            pkv_tier_options tb = topts(nodes, 60000, PKV_TIER_NO_PUBLISH);
            OK(pkv_tier_attach(b, &tb));
            double t0 = now_ms(), c0 = cpu_s();
            OK(pkv_seq_open(b, 1, salt, prompt, n, &got));
            t[r] = now_ms() - t0;
            cpu[r] = cpu_s() - c0;
            if (got != (size_t)nblocks * 16) {
                OK(pkv_get_stats(b, &st));
                fprintf(stderr, BENCH_NAME ": imported %zu of %u tokens (rejected %llu, errors %llu)\n",
                        got, nblocks * 16, (unsigned long long)st.tier_rejected,
                        (unsigned long long)st.tier_errors);
                return 1;
            }
            pkv_close(b);
            rmrf(dir);
        }
        qsort(t, runs, sizeof *t, cmp_d);
        qsort(cpu, runs, sizeof *cpu, cmp_d);
        double med = t[runs / 2];
        printf("%-13s %8u %12llu %10.0f %10.2f %14.0f\n", g->name, nblocks,
               (unsigned long long)inf.block_bytes, nblocks / (med / 1e3),
               (double)nblocks * inf.block_bytes / (med / 1e3) / 1e9, nblocks / cpu[runs / 2]);
    }
    /* the empty tier: distinct prompts nobody published */
    const geo *g = &geos[0];
    const uint32_t opens = 200, pb = 64;
    const size_t pn = (size_t)pb * 16 + 1;
    uint32_t *q = malloc(pn * sizeof *q);
    double with[200], without[200];
    for (int mode = 0; mode < 2; mode++) {
        snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-e%d", base, (int)getpid(), mode);
        rmrf(dir);
        pkv_cache *c = open_cache(dir, g, 256);
        if (mode == 0) {
            pkv_tier_options te = topts(nodes, 20, PKV_TIER_NO_PUBLISH);
            OK(pkv_tier_attach(c, &te));
        }
        for (uint32_t i = 0; i < opens; i++) {
            for (size_t k = 0; k < pn; k++) q[k] = (uint32_t)((k + 1) * 7919u + i * 104729u + salt);
            size_t got;
            double t0 = now_ms();
            OK(pkv_seq_open(c, i + 1, salt + 1, q, pn, &got));
            (mode == 0 ? with : without)[i] = now_ms() - t0;
            OK(pkv_seq_close(c, i + 1));
        }
        pkv_close(c);
        rmrf(dir);
    }
    qsort(with, opens, sizeof *with, cmp_d);
    qsort(without, opens, sizeof *without, cmp_d);
    printf("empty tier, %u-block prompt miss: %.1f us with the tier, %.1f us without "
           "(median of %u; p90 %.1f / %.1f us)\n",
           pb, with[opens / 2] * 1e3, without[opens / 2] * 1e3, opens,
           with[opens * 9 / 10] * 1e3, without[opens * 9 / 10] * 1e3);
    free(q);
    free(prompt);
    free(slots);
    return 0;
}

/*
 * tierbench_model.c — pkv-tierbench --model GGUF: the shared Redis tier with the
 * reference model's real K/V (docs/remote.md, docs/benchmarks.md "Shared Redis
 * tier"). Owns nothing beyond one run: its caches live under --dir and are
 * removed; its records use a fresh random salt, so runs never see each other's.
 *
 * 1. Recompute: the model (src/model/, the q8 kernel and, by default, f16 K/V,
 *    as pkv-demo and pkv-modelbench run it; --dtype f32|bf16) prefills the first N blocks of the demo's
 *    system prompt on a cold cache with no tier (pkvm_prefill, timed): the rate
 *    at which a node without the tier produces these blocks.
 * 2. Publish: the computed blocks are copied, byte for byte, into two publisher
 *    caches, one plain and one with PKV_TIER_LZ4, under two salts, and flushed;
 *    every record is then read back from Redis (keys computed as the tier does,
 *    through the library's internals) and decoded, which gives the record bytes
 *    each form takes and whether the publisher kept LZ4 (only when smaller);
 *    and LZ4_compress_default over each computed block directly, as the
 *    publisher compresses it, gives the ratio even when it keeps the plain form.
 * 3. Import: R times per form, a fresh node B with a cold cache opens the
 *    prompt (pkv_seq_open: fetch, rule T1's checks, LZ4 unpacking, import,
 *    seal), timed in wall and in B's CPU seconds; the first run's blocks are
 *    compared with the computed ones byte for byte.
 * The copy in step 2 rather than a tier attached while computing keeps the
 * publisher's thread out of the recompute timing.
 */
#define BENCH_NAME "pkv-tierbench"
#include "bench_util.h"
#include "tierbench_model.h"

#include "gguf.h"
#include "model.h"
#include "tier.h"
#include "tokenizer.h"

#include <lz4.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

static const char SECRET[] = "pkv-tierbench-secret-0123456789";

static double cpu_now_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static int fail(const char *what, const char *detail) {
    fprintf(stderr, BENCH_NAME ": %s: %s\n", what, detail);
    return 1;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 20);
    size_t n = b ? fread(b, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (b) b[n] = '\0';
    return b;
}

static pkv_cache *open_cache(const char *dir, const pkvm_model *m, const char *id, pkv_dtype dt,
                             uint64_t cap) {
    pkv_options o;
    pkv_options_init(&o);
    pkvm_cache_geometry(m, &o);
    o.block_size = 16;
    o.dtype = dt;
    o.capacity = cap;
    o.model_id = id;
    o.durability = PKV_DURABLE_NONE;
    remove_cache_dir(dir);
    pkv_cache *c = NULL;
    OK(pkv_open(dir, &o, &c));
    return c;
}

static pkv_tier_options tier_opts(const char *nodes, uint32_t flags) {
    pkv_tier_options t;
    memset(&t, 0, sizeof t);
    t.nodes = nodes;
    t.secret = SECRET;
    t.secret_len = sizeof SECRET - 1;
    t.fetch_deadline_ms = 60000; /* nothing cut: the rate, not the deadline */
    t.fetch_max_blocks = 4096;
    t.queue_blocks = 4096;
    t.connect_timeout_ms = 1000;
    t.flags = flags;
    return t;
}

/* Bytes of the records of the prompt's nb blocks under salt as Redis holds
 * them (sum of the values' lengths); *lz4 counts the LZ4-encoded ones. */
static int record_bytes(const tbm_args *a, const pkv_cache_info *inf, const char *id,
                        uint64_t salt, const uint32_t *prompt, uint32_t nb, uint64_t *bytes,
                        uint32_t *lz4) {
    pkv_tier_keys k;
    pkv_tier_keys_derive(&k, SECRET, sizeof SECRET - 1);
    pkv_geometry g;
    memset(&g, 0, sizeof g);
    g.num_layers = inf->num_layers;
    g.num_kv_heads = inf->num_kv_heads;
    g.head_dim = inf->head_dim;
    g.block_size = inf->block_size;
    g.dtype = a->dtype;
    pkv_rc_conf conf;
    memset(&conf, 0, sizeof conf);
    snprintf(conf.nodes, sizeof conf.nodes, "%s", a->nodes);
    conf.connect_timeout_ms = 1000;
    int err = 0;
    pkv_rc *rc = pkv_rc_new(&conf, &err);
    if (!rc) return fail("pkv_rc_new", pkv_strerror(err));
    char (*keys)[PKV_TIER_KEY_LEN + 1] = calloc(nb, sizeof *keys);
    pkv_rc_cmd *cmds = calloc(nb, sizeof *cmds);
    if (!keys || !cmds) return fail("record_bytes", "out of memory");
    pkv_h128 h = pkv_hash_root(k.seed, salt);
    for (uint32_t b = 0; b < nb; b++) {
        h = pkv_hash_block(k.seed, h, prompt + (size_t)b * 16, 16);
        pkv_tier_key(&k, h, &g, id, keys[b]);
        cmds[b].key = keys[b];
    }
    size_t answered = pkv_rc_run(rc, cmds, nb, pkv_now_ns() + 60000000000ull, NULL);
    int ret = answered == nb ? 0 : fail("reading the records back", "not every GET answered");
    *bytes = 0;
    *lz4 = 0;
    for (uint32_t b = 0; b < nb; b++) {
        pkv_tier_rec r;
        if (!ret && (!cmds[b].out || pkv_tier_decode(&k, cmds[b].out, cmds[b].out_len, &r)))
            ret = fail("reading the records back", "a record is missing or does not decode");
        if (!ret) {
            *bytes += cmds[b].out_len;
            *lz4 += r.encoding == PKV_TIER_ENC_LZ4;
        }
        free(cmds[b].out);
    }
    free(cmds);
    free(keys);
    pkv_rc_free(rc);
    return ret;
}

int tierbench_model(const tbm_args *a) {
    pkv_gguf *g;
    pkv_tok *tok;
    pkvm_model *m;
    if (pkv_gguf_open(a->model, &g)) return fail(a->model, pkv_gguf_last_error());
    if (pkv_tok_load(g, &tok)) return fail("tokenizer", pkv_tok_last_error());
    if (pkvm_create_gguf(g, &m)) return fail("pkvm_create_gguf", pkvm_last_error());
    pkvm_set_kernel(m, PKVM_KERNEL_Q8);
    pkvm_set_threads(m, a->threads);
    char id[PKV_MODEL_ID_MAX + 1];
    if (pkv_tok_model_id(g, tok, id, sizeof id)) return fail("model id", pkv_tok_last_error());
    size_t idl = strlen(id);
    snprintf(id + idl, sizeof id - idl, ";kernel=q8");

    /* the prompt: the system turn as the chat template renders it */
    char *text = read_text(a->prompt_file), *chat;
    if (!text) return fail(a->prompt_file, "cannot read");
    const pkv_chat_msg msg = {"system", text};
    size_t len, avail;
    uint32_t *prompt;
    if (pkv_tok_chat(tok, &msg, 1, 0, &chat, &len) ||
        pkv_tok_encode(tok, chat, len, 1, &prompt, &avail))
        return fail("tokenizing", pkv_tok_last_error());
    free(chat);
    free(text);
    uint32_t nb = a->blocks;
    if ((size_t)nb * 16 + 1 > avail) nb = (uint32_t)((avail - 1) / 16);
    const size_t n = (size_t)nb * 16 + 1; /* one more: every full block attaches */

    /* 1. recompute on a cold cache */
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-m", a->base, (int)getpid());
    pkv_cache *src = open_cache(dir, m, id, a->dtype, nb + 8);
    pkvm_engine *e;
    if (pkvm_engine_create(m, src, &e)) return fail("pkvm_engine_create", pkvm_last_error());
    pkvm_engine_set_chunk(e, 512);
    float *logits = malloc(pkvm_config_of(m)->vocab * sizeof *logits);
    size_t got = 0;
    double t0 = now_ms(), c0 = cpu_now_s();
    if (!logits || pkvm_prefill(e, 1, 0, prompt, n, logits, &got))
        return fail("pkvm_prefill", pkvm_last_error());
    const double t_comp = (now_ms() - t0) / 1e3, c_comp = cpu_now_s() - c0;
    pkvm_engine_free(e);
    free(logits);
    pkv_cache_info inf;
    OK(pkv_info(src, &inf));
    uint32_t *sb = malloc((nb + 1) * sizeof *sb);
    size_t nsb = 0;
    OK(pkv_seq_blocks(src, 1, sb, nb + 1, &nsb));
    if (nsb < nb) return fail("pkv_seq_blocks", "fewer blocks than computed");
    const double comp_bps = n / t_comp / 16; /* tokens/s in blocks */
    static const char *const dtn[] = {"f32", "f16", "bf16"};
    printf("model: %s, kernel q8, %u threads, %s K/V, 16-token blocks of %llu bytes\n",
           a->model, a->threads, (unsigned)a->dtype < 3 ? dtn[a->dtype] : "?",
           (unsigned long long)inf.block_bytes);
    printf("prompt: %zu tokens of %s (%u blocks)\n", n, a->prompt_file, nb);
    printf("recompute (pkvm_prefill, cold cache, no tier): %.2f s, %.1f tokens/s = %.2f "
           "blocks/s (%.2f blocks per CPU-second)\n",
           t_comp, n / t_comp, comp_bps, n / c_comp / 16);

    /* LZ4 over each computed block as the publisher compresses it */
    const int zcap = LZ4_compressBound((int)inf.block_bytes);
    char *zbuf = malloc((size_t)zcap);
    uint64_t zsum = 0;
    for (uint32_t b = 0; zbuf && b < nb; b++) {
        int zn = LZ4_compress_default(pkv_kv(src, sb[b], 0, PKV_K, 0), zbuf,
                                      (int)inf.block_bytes, zcap);
        zsum += zn > 0 ? (uint64_t)zn : inf.block_bytes;
    }
    free(zbuf);
    printf("LZ4 over the computed K/V (LZ4_compress_default per block): %.4f of its size\n",
           (double)zsum / ((double)nb * inf.block_bytes));

    /* 2. publish the computed blocks, plain and LZ4 */
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    const uint64_t salt0 = ((uint64_t)rand() << 20) | 1u;
    pkv_slot *slots = malloc(n * sizeof *slots);
    if (!slots) return fail("publish", "out of memory");
    uint64_t rbytes[2];
    uint32_t nlz4[2];
    for (int lz = 0; lz < 2; lz++) {
        snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-p%d", a->base, (int)getpid(), lz);
        pkv_cache *p = open_cache(dir, m, id, a->dtype, nb + 8);
        pkv_tier_options tp = tier_opts(a->nodes, lz ? PKV_TIER_LZ4 : 0);
        OK(pkv_tier_attach(p, &tp));
        OK(pkv_seq_open(p, 1, salt0 + lz, prompt, n, &got));
        OK(pkv_seq_append(p, 1, prompt, (size_t)nb * 16, slots));
        for (uint32_t b = 0; b < nb; b++) /* a block is one contiguous run of block_bytes */
            memcpy(pkv_kv(p, slots[(size_t)b * 16].block, 0, PKV_K, 0),
                   pkv_kv(src, sb[b], 0, PKV_K, 0), inf.block_bytes);
        OK(pkv_seq_commit(p, 1, (size_t)nb * 16));
        OK(pkv_tier_flush(p, 120000));
        pkv_stats st;
        OK(pkv_get_stats(p, &st));
        if (st.tier_published != nb)
            return fail("publish", "not every block was published (Redis full or down?)");
        pkv_close(p);
        remove_cache_dir(dir);
        if (record_bytes(a, &inf, id, salt0 + lz, prompt, nb, &rbytes[lz], &nlz4[lz])) return 1;
    }
    printf("records in the tier: plain %.0f bytes/block, LZ4 %.0f bytes/block (%.3f of plain; "
           "%u of %u records LZ4-encoded)\n",
           (double)rbytes[0] / nb, (double)rbytes[1] / nb, (double)rbytes[1] / rbytes[0],
           nlz4[1], nb);

    /* 3. import into cold nodes */
    printf("%-8s %10s %10s %14s %14s\n", "import", "blocks/s", "MB/s", "blocks/CPU-s",
           "x recompute");
    for (int lz = 0; lz < 2; lz++) {
        double t[100], cpu[100];
        for (uint32_t r = 0; r < a->runs; r++) {
            snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-b", a->base, (int)getpid());
            pkv_cache *b = open_cache(dir, m, id, a->dtype, nb + 8);
            pkv_tier_options tb = tier_opts(a->nodes, PKV_TIER_NO_PUBLISH);
            OK(pkv_tier_attach(b, &tb));
            double w0 = now_ms(), u0 = cpu_now_s();
            OK(pkv_seq_open(b, 1, salt0 + lz, prompt, n, &got));
            t[r] = (now_ms() - w0) / 1e3;
            cpu[r] = cpu_now_s() - u0;
            if (got != (size_t)nb * 16) return fail("import", "not every block was imported");
            if (r == 0) {
                OK(pkv_seq_blocks(b, 1, sb, nb + 1, &nsb));
                uint32_t *cb = malloc((nb + 1) * sizeof *cb);
                size_t ncb = 0;
                OK(pkv_seq_blocks(src, 1, cb, nb + 1, &ncb));
                for (uint32_t k = 0; k < nb; k++)
                    if (memcmp(pkv_kv(b, sb[k], 0, PKV_K, 0), pkv_kv(src, cb[k], 0, PKV_K, 0),
                               inf.block_bytes))
                        return fail("import", "an imported block differs from the computed one");
                free(cb);
            }
            pkv_close(b);
            remove_cache_dir(dir);
        }
        double tw = median(t, (int)a->runs), tc = median(cpu, (int)a->runs);
        printf("%-8s %10.1f %10.1f %14.1f %14.1f\n", lz ? "LZ4" : "plain", nb / tw,
               (double)nb * inf.block_bytes / tw / 1e6, nb / tc, nb / tw / comp_bps);
    }
    pkv_close(src);
    snprintf(dir, sizeof dir, "%s/pkv-tierbench-%d-m", a->base, (int)getpid());
    remove_cache_dir(dir);
    free(slots);
    free(sb);
    free(prompt);
    pkvm_free(m);
    pkv_tok_free(tok);
    pkv_gguf_close(g);
    return 0;
}

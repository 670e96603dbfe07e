/*
 * gpu_paging.c — the CUDA layer on a real cache: registration modes, page-in of
 * batches into the device pool, device block tables, eviction and pinning,
 * write-back of K/V produced on the device, and attention through the pool
 * (pkv_cuda_attn) against the CPU reference on the arena (pkv_attn_decode).
 *
 * Scenarios: the arena on tmpfs (PKV_GPU_SHM, default /dev/shm: read-write
 * registration expected), on disk (PKV_GPU_DISK, default the working directory:
 * whatever the kernel grants), the read-only view forced, staging forced, the
 * gather kernel forced, small registration chunks, small staging buffers, and a
 * cache opened read-only. Each prints "RESULT mode_<scenario> <mode>".
 *
 * Exit 77 without the CUDA layer, a driver or a device.
 */
#include "gpu_util.h"

#if !PKV_WITH_CUDA
int main(void) {
    gpu_start("gpu_paging"); /* exits 77 */
    return GPU_SKIP;
}
#else

#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define LAYERS 2u
#define KVH 2u
#define HD 128u
#define BS 16u
#define NQ (KVH * 4u)
#define MODEL "pagedkv-gpu-test"


static int cmp_id(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The `max` smallest sequence ids of c into ids (pkv_seq_list's order varies
 * between processes); how many. */
static size_t first_ids(pkv_cache *c, uint64_t *ids, size_t max) {
    size_t n = 0;
    if (pkv_seq_list(c, NULL, 0, &n) != PKV_ERANGE && n == 0) return 0;
    uint64_t *all = malloc((n ? n : 1) * sizeof *all);
    if (!all || pkv_seq_list(c, all, n, &n)) {
        free(all);
        return 0;
    }
    qsort(all, n, sizeof *all, cmp_id);
    if (n > max) n = max;
    memcpy(ids, all, n * sizeof *ids);
    free(all);
    return n;
}
static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* K/V of a token: a pure function of (salt, token prefix), small values. */
static void token_kv(uint64_t h, uint32_t l, uint32_t k, uint32_t hd, float *row) {
    uint64_t x = mix(h ^ (((uint64_t)l << 40) | ((uint64_t)k << 32) | hd));
    for (uint32_t d = 0; d < HD; d++) {
        x = mix(x + d + 1);
        row[d] = (float)((int)(x % 2001u) - 1000) / 1000.0f;
    }
}

typedef struct seq {
    uint64_t id, salt;
    uint32_t toks[1024];
    size_t len, committed;
    uint64_t h; /* hash of the prefix toks[0..len) */
} seq;

static uint64_t step_hash(uint64_t h, uint32_t tok) { return mix(h ^ (tok + 0x9E3779B97F4A7C15ull)); }

static int rm_cb(const char *p, const struct stat *sb, int t, struct FTW *f) {
    (void)sb, (void)t, (void)f;
    return remove(p);
}
static void rmrf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int dir_usable(const char *d, uint64_t need) {
    struct statvfs sv;
    if (access(d, W_OK) || statvfs(d, &sv)) return 0;
    return (uint64_t)sv.f_bavail * sv.f_frsize > need;
}

typedef struct ctx {
    pkv_cache *c;
    pkv_cuda *g;
    cudaStream_t st;
    seq s[6];
    int n;
    uint64_t next_id;
    float *d_q, *d_out;
} ctx;

/* Append n tokens; write their K/V on the CPU unless gpu (then the caller writes
 * them on the device). */
static int append(ctx *x, seq *s, const uint32_t *toks, size_t n, int gpu) {
    pkv_slot slots[64];
    int rc = pkv_seq_append(x->c, s->id, toks, n, slots);
    if (rc) return rc;
    float row[HD];
    for (size_t i = 0; i < n; i++) {
        s->toks[s->len] = toks[i];
        s->h = step_hash(s->h, toks[i]);
        s->len++;
        if (gpu) continue;
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t hd = 0; hd < KVH; hd++) {
                    token_kv(s->h, l, k, hd, row);
                    uint8_t *p = (uint8_t *)pkv_kv(x->c, slots[i].block, l, (pkv_kind)k, hd) +
                                 (size_t)slots[i].offset * HD * 2;
                    pkv_kv_store(PKV_F16, p, row, HD);
                }
    }
    return 0;
}

static int commit(ctx *x, seq *s) {
    int rc = s->len > s->committed ? pkv_seq_commit(x->c, s->id, s->len - s->committed) : 0;
    if (!rc) s->committed = s->len;
    return rc;
}

static int open_seq(ctx *x, seq *s, uint64_t salt, uint32_t ntok, int share) {
    memset(s, 0, sizeof *s);
    s->id = x->next_id++;
    s->salt = salt;
    s->h = mix(salt + 12345);
    int rc = pkv_seq_open(x->c, s->id, salt, NULL, 0, NULL);
    if (rc) return rc;
    uint32_t t[64];
    for (uint32_t done = 0; done < ntok;) {
        uint32_t k = ntok - done < 64 ? ntok - done : 64;
        for (uint32_t i = 0; i < k; i++) t[i] = share ? (done + i) % 97 : gu_below(1000);
        if ((rc = append(x, s, t, k, 0))) return rc;
        done += k;
    }
    return commit(x, s);
}

/* Attention on the device pool for the batch vs the CPU on the arena. */
static void check_attention(ctx *x, pkv_cuda_batch *b, const uint64_t *ids, size_t n,
                            const char *what) {
    float *q = malloc(n * NQ * HD * 4), *ref = malloc(n * NQ * HD * 4), *got = malloc(n * NQ * HD * 4);
    pkv_attn_seq as[8];
    uint32_t tabs[8][80];
    for (size_t i = 0; i < n * NQ * HD; i++) q[i] = gu_frand(1.0f);
    for (size_t i = 0; i < n; i++) {
        size_t nb = 0;
        pkv_seq_info inf;
        if (pkv_seq_blocks(x->c, ids[i], tabs[i], 80, &nb) || pkv_seq_get_info(x->c, ids[i], &inf)) {
            gu_fail("%s: sequence %llu: %s", what, (unsigned long long)ids[i], pkv_last_error());
            goto out;
        }
        as[i] = (pkv_attn_seq){tabs[i], nb, (size_t)inf.len};
    }
    pkv_kv_view v;
    if (pkv_kv_view_of(x->c, &v)) {
        gu_fail("%s: view: %s", what, pkv_last_error());
        goto out;
    }
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        pkv_attn_params ap = {.layer = layer, .num_q_heads = NQ, .scale = 0.3f, .num_threads = 4};
        int rc = pkv_attn_decode(&v, &ap, as, n, q, ref);
        if (rc) {
            gu_fail("%s: CPU attention: %s", what, pkv_last_error());
            goto out;
        }
        cudaMemcpyAsync(x->d_q, q, n * NQ * HD * 4, cudaMemcpyHostToDevice, x->st);
        cudaMemsetAsync(x->d_out, 0xff, n * NQ * HD * 4, x->st);
        rc = pkv_cuda_attn(x->g, b, &ap, x->d_q, x->d_out, x->st);
        if (rc) {
            gu_fail("%s: pkv_cuda_attn: %d %s", what, rc, pkv_last_error());
            goto out;
        }
        cudaMemcpyAsync(got, x->d_out, n * NQ * HD * 4, cudaMemcpyDeviceToHost, x->st);
        cudaError_t e = cudaStreamSynchronize(x->st);
        if (e != cudaSuccess) {
            gu_fail("%s: %s", what, cudaGetErrorString(e));
            goto out;
        }
        size_t bad = 0;
        const double err = gu_compare(got, ref, n * NQ, HD, &bad);
        GU_CHECK(err <= 1e-3, "%s: layer %u: error %.3g (row %zu: gpu %g cpu %g)", what, layer, err,
                 bad, (double)got[bad * HD], (double)ref[bad * HD]);
    }
out:
    free(q);
    free(ref);
    free(got);
}

static void batch_all(ctx *x, const char *what, uint32_t flags) {
    uint64_t ids[8];
    size_t n = 0;
    for (int i = 0; i < x->n; i++)
        if (x->s[i].len) ids[n++] = x->s[i].id;
    pkv_cuda_batch *b = NULL;
    int rc = pkv_cuda_page_in(x->g, ids, n, flags, x->st, &b);
    if (rc) {
        gu_fail("%s: page-in -> %d (%s)", what, rc, pkv_last_error());
        return;
    }
    check_attention(x, b, ids, n, what);
    GU_OK(pkv_cuda_release(x->g, b, x->st));
}

/* Device-side write of the K/V of sequence s's token t (pending) through the
 * batch's tables, on the stream (ordered after the page-in's copies). */
static void gpu_write_token(ctx *x, pkv_cuda_batch *b, size_t row_in_batch, const seq *s, size_t t) {
    pkv_cuda_batch_info bi;
    GU_OK(pkv_cuda_batch_get_info(b, &bi));
    uint32_t slot = 0;
    /* On the stream: the table upload is ordered before it, not before the
     * legacy default stream. */
    GU_CUDA(cudaMemcpyAsync(&slot, bi.seqs.tables + row_in_batch * bi.seqs.table_stride + t / BS, 4,
                            cudaMemcpyDeviceToHost, x->st));
    GU_CUDA(cudaStreamSynchronize(x->st));
    static uint16_t rows[LAYERS * 2 * KVH][HD];
    float row[HD];
    int r = 0;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < KVH; hd++, r++) {
                token_kv(s->h, l, k, hd, row);
                pkv_kv_store(PKV_F16, rows[r], row, HD);
                uint8_t *dst = (uint8_t *)bi.view.base + (size_t)slot * bi.view.block_stride +
                               l * bi.view.layer_stride + k * bi.view.kind_stride +
                               hd * bi.view.head_stride + (t % BS) * bi.view.token_stride;
                GU_CUDA(cudaMemcpyAsync(dst, rows[r], HD * 2, cudaMemcpyHostToDevice, x->st));
            }
    GU_CUDA(cudaStreamSynchronize(x->st));
}

static void gpu_append_and_writeback(ctx *x, const char *what) {
    seq *s = &x->s[0];
    const uint32_t tok = gu_below(1000);
    GU_OK(append(x, s, &tok, 1, 1)); /* K/V not written on the host */
    uint64_t id = s->id;
    pkv_cuda_batch *b = NULL;
    GU_OK(pkv_cuda_page_in(x->g, &id, 1, PKV_CUDA_GPU_APPEND, x->st, &b));
    gpu_write_token(x, b, 0, s, s->len - 1);
    int rc = pkv_cuda_writeback(x->g, b, x->st);
    GU_CHECK(rc == 0, "%s: write-back -> %d (%s)", what, rc, pkv_last_error());
    /* The arena holds the device's K/V now. */
    uint32_t tab[80];
    size_t nb = 0;
    GU_OK(pkv_seq_blocks(x->c, id, tab, 80, &nb));
    float row[HD], back[HD];
    int same = 1;
    const size_t t = s->len - 1;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < KVH; hd++) {
                token_kv(s->h, l, k, hd, row);
                const uint8_t *p = (const uint8_t *)pkv_kv(x->c, tab[t / BS], l, (pkv_kind)k, hd) +
                                   (t % BS) * HD * 2;
                pkv_kv_load(PKV_F16, back, p, HD);
                for (uint32_t d = 0; d < HD; d++) {
                    uint16_t a = pkv_f32_to_f16(row[d]), c = pkv_f32_to_f16(back[d]);
                    same &= a == c;
                }
            }
    GU_CHECK(same, "%s: write-back did not store the device's K/V in the arena", what);
    check_attention(x, b, &id, 1, what);
    GU_OK(pkv_cuda_release(x->g, b, x->st));
    GU_OK(commit(x, s));
    pkv_cuda_stats before, after;
    GU_OK(pkv_cuda_get_stats(x->g, &before));
    GU_OK(pkv_cuda_page_in(x->g, &id, 1, 0, x->st, &b));
    GU_OK(pkv_cuda_get_stats(x->g, &after));
    GU_CHECK(after.blocks_copied == before.blocks_copied,
             "%s: after write-back and commit nothing should be re-copied (%llu copies)", what,
             (unsigned long long)(after.blocks_copied - before.blocks_copied));
    check_attention(x, b, &id, 1, what);
    GU_OK(pkv_cuda_release(x->g, b, x->st));
}

static void pool_limits(pkv_cache *c, const char *what) {
    pkv_cuda_options o;
    pkv_cuda_options_init(&o);
    o.pool_blocks = 8;
    pkv_cuda *g = NULL;
    GU_OK(pkv_cuda_open(c, &o, &g));
    ctx x = {.c = c, .g = g, .next_id = 1000};
    GU_OK(open_seq(&x, &x.s[0], 5, 5 * BS, 0));
    GU_OK(open_seq(&x, &x.s[1], 6, 5 * BS, 0));
    GU_OK(open_seq(&x, &x.s[2], 7, 10 * BS, 0));
    pkv_cuda_batch *a = NULL, *b = NULL;
    uint64_t id = x.s[2].id;
    int rc = pkv_cuda_page_in(g, &id, 1, 0, NULL, &b);
    GU_CHECK(rc == PKV_EFULL, "%s: a batch larger than the pool must fail with PKV_EFULL (got %d)", what, rc);
    pkv_cuda_stats st;
    GU_OK(pkv_cuda_get_stats(g, &st));
    GU_CHECK(st.slots_pinned == 0 && st.blocks_copied == 0 && st.slots_free == 8,
             "%s: a failed page-in must leave no state (pinned %u copied %llu free %u)", what,
             st.slots_pinned, (unsigned long long)st.blocks_copied, st.slots_free);
    id = x.s[0].id;
    GU_OK(pkv_cuda_page_in(g, &id, 1, 0, NULL, &a));
    id = x.s[1].id;
    rc = pkv_cuda_page_in(g, &id, 1, 0, NULL, &b);
    GU_CHECK(rc == PKV_EFULL, "%s: slots pinned by an in-flight batch are not evictable (got %d)", what, rc);
    GU_OK(pkv_cuda_release(g, a, NULL));
    rc = pkv_cuda_page_in(g, &id, 1, 0, NULL, &b);
    GU_CHECK(rc == 0, "%s: after the release the batch fits (got %d %s)", what, rc, pkv_last_error());
    if (!rc) pkv_cuda_release(g, b, NULL);
    GU_OK(pkv_cuda_get_stats(g, &st));
    GU_CHECK(st.evictions >= 2, "%s: evictions %llu", what, (unsigned long long)st.evictions);
    for (int i = 0; i < 3; i++) pkv_seq_close(c, x.s[i].id);
    pkv_cuda_close(g);
}

/* `adir`: pkv_options.arena_dir (the arena there, the log in `dir`), or NULL. */
static void scenario_in(const char *name, const char *dir, const char *adir, uint32_t flags,
                        uint64_t chunk, uint64_t staging, int expect) {
    char path[512], apath[512];
    snprintf(path, sizeof path, "%s/pkv-gpu-paging-%d-%s", dir, (int)getpid(), name);
    rmrf(path);
    if (adir) {
        snprintf(apath, sizeof apath, "%s/pkv-gpu-arenas-%d-%s", adir, (int)getpid(), name);
        rmrf(apath);
    }
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = LAYERS;
    o.num_kv_heads = KVH;
    o.head_dim = HD;
    o.block_size = BS;
    o.dtype = PKV_F16;
    o.capacity = 128;
    o.model_id = MODEL;
    o.durability = PKV_DURABLE_NONE;
    o.arena_dir = adir ? apath : NULL;
    ctx x = {.next_id = 1};
    int rc = pkv_open(path, &o, &x.c);
    if (rc) {
        gu_fail("%s: pkv_open(%s): %s", name, path, pkv_last_error());
        return;
    }
    pkv_cuda_options co;
    pkv_cuda_options_init(&co);
    co.pool_blocks = 100;
    co.flags = flags;
    co.register_chunk_bytes = chunk;
    co.staging_bytes = staging;
    rc = pkv_cuda_open(x.c, &co, &x.g);
    if (rc) {
        gu_fail("%s: pkv_cuda_open: %d %s", name, rc, pkv_last_error());
        pkv_close(x.c);
        rmrf(path);
        return;
    }
    pkv_cuda_stats st;
    pkv_cuda_get_stats(x.g, &st);
    printf("# %-14s arena %s: mode %s, %s copies, %u chunk(s), %.1f ms to register%s%s\n", name, dir,
           st.mode_name, st.batched_copy ? "batched" : "gather-kernel", st.register_chunks,
           st.register_ms, st.mode_note[0] ? "; " : "", st.mode_note);
    printf("RESULT mode_%s %s\n", name, st.mode_name);
    if (expect >= 0)
        GU_CHECK((int)st.mode == expect, "%s: mode %s, expected %s", name, st.mode_name,
                 pkv_cuda_mode_name((pkv_cuda_mode)expect));
    {   /* The cache's own stats report the attached handle and its mode. */
        pkv_stats cs;
        GU_OK(pkv_get_stats(x.c, &cs));
        GU_CHECK(cs.cuda_handles == 1 && cs.cuda_mode == (uint32_t)st.mode,
                 "%s: pkv_get_stats says %u handle(s), mode %u; pkv_cuda_get_stats mode %u", name,
                 cs.cuda_handles, cs.cuda_mode, (unsigned)st.mode);
        char sp[600];
        snprintf(sp, sizeof sp, "%s/cuda.status", path);
        GU_CHECK(access(sp, R_OK) == 0, "%s: %s was not written", name, sp);
    }
    GU_CHECK(cudaStreamCreate(&x.st) == cudaSuccess, "stream");
    GU_CHECK(cudaMalloc((void **)&x.d_q, 8 * NQ * HD * 4) == cudaSuccess, "q");
    GU_CHECK(cudaMalloc((void **)&x.d_out, 8 * NQ * HD * 4) == cudaSuccess, "out");
    /* Four sequences, two sharing a prefix. */
    x.n = 4;
    for (int i = 0; i < x.n && !gu_failures; i++) {
        rc = open_seq(&x, &x.s[i], i == 1 ? 0 : (uint64_t)i, 1 + gu_below(200), i <= 1);
        GU_CHECK(rc == 0, "%s: open_seq: %s", name, pkv_last_error());
    }
    char what[128];
    for (int step = 0; step < 40 && !gu_failures; step++) {
        snprintf(what, sizeof what, "%s step %d", name, step);
        batch_all(&x, what, 0);
        seq *s = &x.s[gu_below((uint32_t)x.n)];
        const uint32_t op = gu_below(6);
        if (op < 4 && s->len + 4 < 1024) { /* decode on the CPU */
            uint32_t t[3];
            const uint32_t k = 1 + gu_below(3);
            for (uint32_t i = 0; i < k; i++) t[i] = gu_below(1000);
            rc = append(&x, s, t, k, 0);
            if (rc == PKV_EFULL) continue;
            GU_CHECK(rc == 0, "%s: append: %s", what, pkv_last_error());
            if (gu_below(2)) GU_CHECK(commit(&x, s) == 0, "%s: commit", what);
        } else { /* a conversation ends; its blocks get reused */
            pkv_seq_close(x.c, s->id);
            rc = open_seq(&x, s, gu_below(3), 1 + gu_below(150), gu_below(2));
            GU_CHECK(rc == 0 || rc == PKV_EFULL, "%s: open_seq: %s", what, pkv_last_error());
            if (rc == PKV_EFULL) s->len = 0;
        }
    }
    for (int i = 0; i < x.n; i++)
        if (x.s[i].len > x.s[i].committed) commit(&x, &x.s[i]);
    if (!gu_failures && x.s[0].len) gpu_append_and_writeback(&x, name);
    pkv_cuda_get_stats(x.g, &st);
    printf("# %-14s %llu page-ins, %llu blocks copied (%llu re-copied), %llu hits, %llu evictions, "
           "%.1f MB H2D, %llu write-backs\n",
           name, (unsigned long long)st.page_ins, (unsigned long long)st.blocks_copied,
           (unsigned long long)st.blocks_recopied, (unsigned long long)st.blocks_hit,
           (unsigned long long)st.evictions, (double)st.bytes_h2d / 1e6,
           (unsigned long long)st.writebacks);
    GU_CHECK(st.blocks_hit > 0, "%s: no block was ever served from the pool", name);
    cudaFree(x.d_q);
    cudaFree(x.d_out);
    cudaStreamDestroy(x.st);
    pkv_cuda_close(x.g);
    {
        pkv_stats cs;
        GU_OK(pkv_get_stats(x.c, &cs));
        GU_CHECK(cs.cuda_handles == 0 && cs.cuda_mode == 0, "%s: after pkv_cuda_close pkv_get_stats "
                 "says %u handle(s), mode %u", name, cs.cuda_handles, cs.cuda_mode);
    }
    if (!strcmp(name, "disk")) pool_limits(x.c, name);
    pkv_close(x.c);
    /* Read-only open of the same cache: registered read-only, no write-back. */
    if (!strcmp(name, "disk")) {
        o.flags = PKV_OPEN_RDONLY;
        o.capacity = 0;
        ctx y = {.next_id = 1};
        if (pkv_open(path, &o, &y.c) == 0) {
            if (pkv_cuda_open(y.c, &co, &y.g) == 0) {
                pkv_cuda_get_stats(y.g, &st);
                printf("# read-only cache: mode %s%s%s\n", st.mode_name, st.mode_note[0] ? "; " : "",
                       st.mode_note);
                GU_CHECK(st.mode != PKV_CUDA_MODE_REGISTERED, "a read-only cache cannot be registered read-write");
                uint64_t ids[8];
                size_t n = first_ids(y.c, ids, 8);
                if (n) {
                    cudaStreamCreate(&y.st);
                    cudaMalloc((void **)&y.d_q, 8 * NQ * HD * 4);
                    cudaMalloc((void **)&y.d_out, 8 * NQ * HD * 4);
                    pkv_cuda_batch *b = NULL;
                    if (pkv_cuda_page_in(y.g, ids, n, 0, y.st, &b) == 0) {
                        check_attention(&y, b, ids, n, "read-only cache");
                        GU_CHECK(pkv_cuda_writeback(y.g, b, y.st) == PKV_ERDONLY,
                                 "write-back on a read-only cache must be PKV_ERDONLY");
                        pkv_cuda_release(y.g, b, y.st);
                    } else {
                        gu_fail("read-only cache: page-in: %s", pkv_last_error());
                    }
                    cudaFree(y.d_q);
                    cudaFree(y.d_out);
                    cudaStreamDestroy(y.st);
                }
                pkv_cuda_close(y.g);
            } else {
                gu_fail("read-only cache: pkv_cuda_open: %s", pkv_last_error());
            }
            pkv_close(y.c);
        }
    }
    rmrf(path);
    if (adir) rmrf(apath);
}

static void scenario(const char *name, const char *dir, uint32_t flags, uint64_t chunk,
                     uint64_t staging, int expect) {
    scenario_in(name, dir, NULL, flags, chunk, staging, expect);
}

int main(void) {
    gpu_start("gpu_paging");
    gu_seed();
    const char *shm = getenv("PKV_GPU_SHM") ? getenv("PKV_GPU_SHM") : "/dev/shm";
    const char *disk = getenv("PKV_GPU_DISK") ? getenv("PKV_GPU_DISK") : ".";
    const uint64_t need = 64ull << 20;
    if (dir_usable(shm, need))
        scenario("tmpfs", shm, 0, 0, 0, PKV_CUDA_MODE_REGISTERED);
    else
        printf("# %s not usable (missing, read-only or < 64 MiB free): tmpfs scenario skipped\n", shm);
    /* The log on disk, the arena on tmpfs (pkv_options.arena_dir): registered. */
    if (dir_usable(shm, need))
        scenario_in("split", disk, shm, 0, 0, 0, PKV_CUDA_MODE_REGISTERED);
    scenario("disk", disk, 0, 0, 0, -1);
    scenario("disk-ro", disk, PKV_CUDA_NO_RW_REGISTER, 0, 0, -1);
    scenario("staging", disk, PKV_CUDA_NO_REGISTER, 0, 0, PKV_CUDA_MODE_STAGING);
    scenario("gather", dir_usable(shm, need) ? shm : disk, PKV_CUDA_GATHER_KERNEL, 0, 0, -1);
    scenario("chunks", dir_usable(shm, need) ? shm : disk, 0, 1u << 20, 0, -1);
    scenario("staging-small", disk, PKV_CUDA_NO_REGISTER | PKV_CUDA_GATHER_KERNEL, 0, 3 * 32768, PKV_CUDA_MODE_STAGING);
    return gpu_finish();
}
#endif

/*
 * gpu_bench.c — the numbers of tests/gpu/run.sh's final table.
 *
 *  - host -> device bandwidth: pinned memory (cudaMemcpyAsync of one buffer),
 *    pageable memory, and paging from the arena through pkv_cuda_page_in in each
 *    registration mode (2 MiB blocks, batches of 512 blocks = 1 GiB, alternating
 *    two sequences through a 1 GiB pool so every page-in copies everything);
 *  - device-to-device copy bandwidth (cudaMemcpy, counted as bytes read +
 *    written: the HBM traffic a copy makes);
 *  - the paged decode-attention kernel at 4k / 32k / 128k context (f16, 8 kv
 *    heads, 32 query heads, head_dim 128, block size 16, random block tables),
 *    plus 32k with 64 query heads: time per call and K/V bytes read per second,
 *    as a fraction of the copy bandwidth.
 *
 * Prints "RESULT <key> <value>" lines for run.sh. Environment: PKV_GPU_SHM (tmpfs
 * directory, default /dev/shm), PKV_GPU_DISK (disk directory, default .),
 * PKV_GPUBENCH_ATTN_ONLY (copies and attention only).
 * Exit 77 without the CUDA layer, a driver or a device.
 */
#include "gpu_util.h"

#if !PKV_WITH_CUDA
int main(void) {
    gpu_start("gpu_bench"); /* exits 77 */
    return GPU_SKIP;
}
#else

#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

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

static double d2d_traffic_gbs;

/* Best of `reps` timed copies of `bytes` from src to dst on a stream. */
static double copy_gbs(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, int reps) {
    cudaStream_t st;
    cudaEvent_t a, b;
    cudaStreamCreate(&st);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a, st);
        cudaMemcpyAsync(dst, src, bytes, kind, st);
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        const double gbs = (double)bytes / (ms * 1e-3) / 1e9;
        if (gbs > best) best = gbs;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(st);
    return best;
}

static void bench_copies(void) {
    const size_t sz = 1ull << 30;
    void *dev = NULL, *dev2 = NULL, *pinned = NULL;
    GU_CUDA(cudaMalloc(&dev, 2 * sz));
    GU_CUDA(cudaMalloc(&dev2, 2 * sz));
    GU_CUDA(cudaHostAlloc(&pinned, sz, cudaHostAllocDefault));
    memset(pinned, 1, sz);
    uint8_t *pageable = malloc(sz);
    if (!pageable) {
        gu_fail("malloc 1 GiB");
        return;
    }
    memset(pageable, 1, sz);
    const double pin = copy_gbs(dev, pinned, sz, cudaMemcpyHostToDevice, 5);
    const double pag = copy_gbs(dev, pageable, sz, cudaMemcpyHostToDevice, 3);
    GU_CUDA(cudaMemset(dev, 0, 2 * sz));
    const double d2d = copy_gbs(dev2, dev, 2 * sz, cudaMemcpyDeviceToDevice, 5);
    d2d_traffic_gbs = 2 * d2d;
    printf("RESULT h2d_pinned_gbs %.1f\nRESULT h2d_pageable_gbs %.1f\n", pin, pag);
    printf("RESULT d2d_copy_gbs %.1f\nRESULT d2d_traffic_gbs %.1f\n", d2d, 2 * d2d);
    printf("# H2D pinned %.1f GB/s, pageable %.1f GB/s; D2D copy %.1f GB/s (%.1f GB/s of HBM traffic)\n",
           pin, pag, d2d, 2 * d2d);
    free(pageable);
    cudaFreeHost(pinned);
    cudaFree(dev);
    cudaFree(dev2);
}

/* ---- Paging from the arena ----------------------------------------------------------- */

#define PG_LAYERS 32u
#define PG_KVH 8u
#define PG_HD 128u
#define PG_BS 16u
#define PG_BLOCKS 512u /* per batch: 512 x 2 MiB = 1 GiB */

static void bench_paging(const char *label, const char *dir, uint32_t flags) {
    char path[512];
    snprintf(path, sizeof path, "%s/pkv-gpu-bench-%d-%s", dir, (int)getpid(), label);
    rmrf(path);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = PG_LAYERS;
    o.num_kv_heads = PG_KVH;
    o.head_dim = PG_HD;
    o.block_size = PG_BS;
    o.dtype = PKV_F16;
    o.capacity = 2 * PG_BLOCKS + 8;
    o.model_id = "pagedkv-gpu-bench";
    o.durability = PKV_DURABLE_NONE;
    pkv_cache *c = NULL;
    if (pkv_open(path, &o, &c)) {
        gu_fail("paging %s: pkv_open(%s): %s", label, path, pkv_last_error());
        return;
    }
    pkv_cache_info inf;
    pkv_info(c, &inf);
    /* Two sequences of 512 full, committed blocks; payload touched. */
    uint64_t ids[2] = {1, 2};
    uint32_t *toks = malloc(PG_BLOCKS * PG_BS * 4);
    pkv_slot *slots = malloc(PG_BLOCKS * PG_BS * sizeof *slots);
    for (int s = 0; s < 2; s++) {
        for (uint32_t i = 0; i < PG_BLOCKS * PG_BS; i++) toks[i] = (uint32_t)(s * 7919 + i);
        if (pkv_seq_open(c, ids[s], 0, NULL, 0, NULL) ||
            pkv_seq_append(c, ids[s], toks, PG_BLOCKS * PG_BS, slots)) {
            gu_fail("paging %s: sequences: %s", label, pkv_last_error());
            goto out;
        }
        for (uint32_t i = 0; i < PG_BLOCKS * PG_BS; i += PG_BS)
            memset(pkv_kv(c, slots[i].block, 0, PKV_K, 0), 0x3c + s, inf.block_bytes);
        if (pkv_seq_commit(c, ids[s], PG_BLOCKS * PG_BS)) {
            gu_fail("paging %s: commit: %s", label, pkv_last_error());
            goto out;
        }
    }
    pkv_cuda_options co;
    pkv_cuda_options_init(&co);
    co.pool_blocks = PG_BLOCKS;
    co.flags = flags;
    pkv_cuda *g = NULL;
    if (pkv_cuda_open(c, &co, &g)) {
        gu_fail("paging %s: pkv_cuda_open: %s", label, pkv_last_error());
        goto out;
    }
    pkv_cuda_stats st;
    pkv_cuda_get_stats(g, &st);
    cudaStream_t strm;
    cudaStreamCreate(&strm);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pkv_cuda_batch *b = NULL;
        cudaStreamSynchronize(strm);
        const double t0 = gu_now();
        int rc = pkv_cuda_page_in(g, &ids[r & 1], 1, 0, strm, &b);
        if (rc) {
            gu_fail("paging %s: page-in: %s", label, pkv_last_error());
            break;
        }
        cudaStreamSynchronize(strm);
        const double dt = gu_now() - t0;
        pkv_cuda_batch_info bi;
        pkv_cuda_batch_get_info(b, &bi);
        const double gbs = (double)bi.blocks_copied * inf.block_bytes / dt / 1e9;
        if (r > 0 && gbs > best) best = gbs; /* r == 0: first touch, warm-up */
        pkv_cuda_release(g, b, strm);
    }
    cudaStreamDestroy(strm);
    pkv_cuda_get_stats(g, &st);
    printf("RESULT paging_%s_gbs %.1f\nRESULT paging_%s_mode %s\nRESULT paging_%s_copy %s\n", label,
           best, label, st.mode_name, label, st.batched_copy ? "batched" : "gather-kernel");
    printf("# paging %-8s arena %s: mode %s (%s copies, registered %.2f GB in %.0f ms): %.1f GB/s%s%s\n",
           label, dir, st.mode_name, st.batched_copy ? "batched" : "gather-kernel",
           (double)st.registered_bytes / 1e9, st.register_ms, best, st.mode_note[0] ? "; " : "",
           st.mode_note);
    pkv_cuda_close(g);
out:
    free(toks);
    free(slots);
    pkv_close(c);
    rmrf(path);
}

/* ---- Attention --------------------------------------------------------------------------- */

/* cuda_cores: force the CUDA-core kernel (PKV_CUDA_ATTN_NO_MMA) where the
 * tensor-core one would run (f16, GQA), for the comparison. */
static void bench_attention(uint32_t ctx, uint32_t batch, uint32_t g, int cuda_cores) {
    const uint32_t nkv = 8, nq = nkv * g, D = 128, bs = 16;
    const size_t row = D * 2, head_stride = bs * row, kind_stride = nkv * head_stride;
    const size_t block_stride = 2 * kind_stride;
    const uint32_t per_seq = (ctx + bs - 1) / bs, nblocks = per_seq * batch;
    const size_t bytes = (size_t)nblocks * block_stride;
    void *kv = NULL, *work = NULL;
    uint32_t *d_tab = NULL, *d_len = NULL;
    float *d_q = NULL, *d_out = NULL;
    GU_CUDA(cudaMalloc(&kv, bytes));
    /* Random f16 in [-1, 1]: 64 MiB from the host, replicated on the device. */
    const size_t chunk = 64ull << 20;
    uint16_t *h = malloc(chunk);
    float tmp[256];
    for (size_t i = 0; i < chunk / 2; i += 256) {
        for (int k = 0; k < 256; k++) tmp[k] = gu_frand(1.0f);
        pkv_kv_store(PKV_F16, h + i, tmp, 256);
    }
    for (size_t off = 0; off < bytes; off += chunk)
        GU_CUDA(cudaMemcpy((uint8_t *)kv + off, h, bytes - off < chunk ? bytes - off : chunk,
                           cudaMemcpyHostToDevice));
    free(h);
    uint32_t *perm = malloc(nblocks * 4), *lens = malloc(batch * 4);
    for (uint32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (uint32_t i = nblocks; i > 1; i--) {
        const uint32_t j = gu_below(i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    for (uint32_t s = 0; s < batch; s++) lens[s] = ctx;
    GU_CUDA(cudaMalloc((void **)&d_tab, nblocks * 4));
    GU_CUDA(cudaMalloc((void **)&d_len, batch * 4));
    GU_CUDA(cudaMemcpy(d_tab, perm, nblocks * 4, cudaMemcpyHostToDevice));
    GU_CUDA(cudaMemcpy(d_len, lens, batch * 4, cudaMemcpyHostToDevice));
    free(perm);
    free(lens);
    GU_CUDA(cudaMalloc((void **)&d_q, (size_t)batch * nq * D * 4));
    GU_CUDA(cudaMalloc((void **)&d_out, (size_t)batch * nq * D * 4));
    GU_CUDA(cudaMemset(d_q, 0, (size_t)batch * nq * D * 4));
    pkv_kv_view v = {.base = kv, .dtype = PKV_F16, .num_layers = 1, .num_kv_heads = nkv,
                     .head_dim = D, .block_size = bs, .num_blocks = nblocks,
                     .block_stride = block_stride, .layer_stride = block_stride,
                     .kind_stride = kind_stride, .head_stride = head_stride, .token_stride = row};
    pkv_attn_params ap = {.layer = 0, .num_q_heads = nq, .scale = 0.088f};
    pkv_cuda_seqs sq = {.tables = d_tab, .table_stride = per_seq, .lens = d_len, .n_seqs = batch,
                        .max_len = ctx};
    size_t wb = 0;
    if (cuda_cores) setenv("PKV_CUDA_ATTN_NO_MMA", "1", 1); /* before the plan: it sizes the workspace */
    GU_OK(pkv_cuda_attn_workspace(&v, &ap, &sq, &wb));
    if (wb) GU_CUDA(cudaMalloc(&work, wb));
    cudaStream_t st;
    cudaEvent_t a, b;
    cudaStreamCreate(&st);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) GU_OK(pkv_cuda_attn_decode(&v, &ap, &sq, d_q, d_out, work, wb, st));
    const int iters = 20;
    cudaEventRecord(a, st);
    for (int i = 0; i < iters; i++) GU_OK(pkv_cuda_attn_decode(&v, &ap, &sq, d_q, d_out, work, wb, st));
    cudaEventRecord(b, st);
    GU_CUDA(cudaEventSynchronize(b));
    if (cuda_cores) unsetenv("PKV_CUDA_ATTN_NO_MMA");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double t = ms / iters * 1e-3;
    const double kvb = (double)batch * ctx * nkv * D * 2 * 2;
    const double gbs = kvb / t / 1e9;
    const double frac = d2d_traffic_gbs > 0 ? gbs / d2d_traffic_gbs : 0;
    char key[32];
    if (g == 4) snprintf(key, sizeof key, "%u%s", ctx, cuda_cores ? "cc" : "");
    else snprintf(key, sizeof key, "%ug%u%s", ctx, g, cuda_cores ? "cc" : "");
    printf("RESULT attn_%s_us %.1f\nRESULT attn_%s_gbs %.1f\nRESULT attn_%s_frac %.3f\nRESULT attn_%s_batch %u\n",
           key, t * 1e6, key, gbs, key, frac, key, batch);
    printf("# attention ctx %6u x %2u seqs, %u query heads per kv head%s: %8.1f us, %7.1f GB/s of K/V = "
           "%.0f%% of the D2D copy traffic\n", ctx, batch, g, cuda_cores ? " (CUDA cores)" : "", t * 1e6,
           gbs, frac * 100);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(st);
    cudaFree(kv);
    cudaFree(work);
    cudaFree(d_tab);
    cudaFree(d_len);
    cudaFree(d_q);
    cudaFree(d_out);
}

int main(void) {
    gpu_start("gpu_bench");
    gu_seed();
    const char *shm = getenv("PKV_GPU_SHM") ? getenv("PKV_GPU_SHM") : "/dev/shm";
    const char *disk = getenv("PKV_GPU_DISK") ? getenv("PKV_GPU_DISK") : ".";
    bench_copies();
    if (getenv("PKV_GPUBENCH_ATTN_ONLY")) { /* kernel tuning runs */
        bench_attention(4096, 64, 4, 0);
        bench_attention(32768, 16, 4, 0);
        bench_attention(131072, 4, 4, 0);
        bench_attention(4096, 64, 8, 0);
        bench_attention(32768, 16, 8, 0);
        bench_attention(131072, 4, 8, 0);
        bench_attention(32768, 16, 4, 1);
        bench_attention(32768, 16, 8, 1);
        return gpu_finish();
    }
    const uint64_t arena = (2ull * PG_BLOCKS + 8) * (2ull << 20) + (256ull << 20);
    const int have_shm = dir_usable(shm, arena);
    if (have_shm) bench_paging("tmpfs", shm, 0);
    else printf("# %s: not usable or < %.1f GB free: no tmpfs paging run\n", shm, (double)arena / 1e9);
    if (dir_usable(disk, arena)) {
        bench_paging("disk", disk, 0);
        bench_paging("disk-ro", disk, PKV_CUDA_NO_RW_REGISTER);
        bench_paging("staging", disk, PKV_CUDA_NO_REGISTER);
    } else {
        printf("# %s: < %.1f GB free: no disk paging runs\n", disk, (double)arena / 1e9);
    }
    if (have_shm) bench_paging("gather", shm, PKV_CUDA_GATHER_KERNEL);
    bench_attention(4096, 64, 4, 0);
    bench_attention(32768, 16, 4, 0);
    bench_attention(131072, 4, 4, 0);
    bench_attention(32768, 16, 8, 0); /* GQA 8:1 (e.g. 64 query heads, 8 kv heads) */
    bench_attention(32768, 16, 4, 1); /* the CUDA-core kernel, for comparison */
    bench_attention(32768, 16, 8, 1);
    return gpu_finish();
}
#endif

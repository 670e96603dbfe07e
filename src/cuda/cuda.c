/*
 * cuda.c — host side of the CUDA layer (built only with the CUDA layer; the API
 * is documented in pagedkv.h, the design in docs/cuda.md).
 *
 *  - Registration with honest fallback. The arena mapping is registered in
 *    chunks (<= 64 GiB, whole slots) through the driver API (cuMemHostRegister,
 *    reached with cudaGetDriverEntryPointByVersion, so that a refusal leaves no
 *    sticky runtime error and no link-time dependency on libcuda): read-write
 *    first; if the kernel refuses (long-term pins of a writable shared file
 *    mapping on ext4/xfs, Linux >= 6.5), a second PROT_READ mapping of the file is
 *    registered read-only; if that fails too, two pinned staging buffers carry
 *    the blocks (filled by up to 8 CPU threads while the other buffer is in
 *    flight). The mode and why better ones failed are in pkv_cuda_stats.
 *  - One copy stream of our own. A page-in plans the batch (residency.c), then
 *    issues all its block copies at once: cudaMemcpyBatchAsync (CUDA >= 12.8;
 *    probed at open) or one gather kernel reading the registered (or staging)
 *    memory through device-mapped pointers. The caller's stream waits on an event
 *    recorded after the copies. A release records an event on the caller's
 *    stream and makes the copy stream wait on it, so a slot is never overwritten
 *    before the kernels that read it (enqueued before the release) are done.
 *  - Write-back: a pack kernel gathers the rows of the pending tokens into a
 *    device buffer, one D2H copy brings them to pinned memory, the CPU stores
 *    them in the arena; the device copies are then marked valid.
 *
 * Locking: g->mu guards the handle. The cache lock is taken only inside glue.c:
 * page-in collects (cache lock) before it takes g->mu; write-back collects while
 * holding g->mu. The order is thus g->mu -> cache lock, never the reverse.
 */
#include "cuda/attn_plan.h"
#include "cuda/glue.h"
#include "cuda/kernels.h"
#include "cuda/residency.h"
#include "internal.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_CHUNK   (64ull << 30)
#define DEFAULT_STAGING (64ull << 20)
#define WB_BYTES        (64ull << 20) /* write-back buffers */
#define BATCH_COPIES    4096u         /* copies per cudaMemcpyBatchAsync call */

/* ---- Driver API entry points ---------------------------------------------- */

typedef CUresult (*pfn_register)(void *p, size_t bytes, unsigned int flags);
typedef CUresult (*pfn_unregister)(void *p);
typedef CUresult (*pfn_devptr)(CUdeviceptr *d, void *p, unsigned int flags);
typedef CUresult (*pfn_errstr)(CUresult e, const char **s);

static struct {
    pfn_register reg;
    pfn_unregister unreg;
    pfn_devptr devptr;
    pfn_errstr errstr;
    char why[160];
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *entry(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        if (!drv.why[0])
            snprintf(drv.why, sizeof drv.why, "driver entry point %s not found (%s)", name,
                     e != cudaSuccess ? cudaGetErrorString(e) : "symbol or version");
        return NULL;
    }
    return fn;
}

static void drv_load(void) {
    void *p;
    if ((p = entry("cuMemHostRegister"))) memcpy(&drv.reg, &p, sizeof p);
    if ((p = entry("cuMemHostUnregister"))) memcpy(&drv.unreg, &p, sizeof p);
    if ((p = entry("cuMemHostGetDevicePointer"))) memcpy(&drv.devptr, &p, sizeof p);
    if ((p = entry("cuGetErrorString"))) memcpy(&drv.errstr, &p, sizeof p);
}

static const char *cu_str(CUresult r) {
    const char *s = NULL;
    if (drv.errstr && drv.errstr(r, &s) == CUDA_SUCCESS && s) return s;
    return "unknown driver error";
}

/* ---- Errors and device scope ----------------------------------------------- */

static int cuda_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError(); /* clear a non-sticky error */
    const int code = e == cudaErrorMemoryAllocation ? PKV_ENOMEM : PKV_EIO;
    return pkv_err(code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CK(expr, what)                                                              \
    do {                                                                            \
        cudaError_t e_ = (expr);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            rc = cuda_fail(e_, what);                                               \
            goto out;                                                               \
        }                                                                           \
    } while (0)

/* Make `dev` current for the call and restore the caller's device after. */
typedef struct dev_scope {
    int prev;
    int changed;
} dev_scope;

static int dev_enter(dev_scope *s, int dev) {
    s->changed = 0;
    if (cudaGetDevice(&s->prev) != cudaSuccess) s->prev = -1;
    if (s->prev != dev) {
        cudaError_t e = cudaSetDevice(dev);
        if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
        s->changed = 1;
    }
    return 0;
}

static void dev_leave(dev_scope *s) {
    if (s->changed && s->prev >= 0) cudaSetDevice(s->prev);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- Probe ------------------------------------------------------------------ */

int pkv_cuda_probe(int device, char *why, size_t len) {
    char msg[256] = "";
    int n = 0, rt = 0, dv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaDriverGetVersion(&dv);
        if (e == cudaErrorInsufficientDriver)
            snprintf(msg, sizeof msg,
                     dv ? "CUDA driver %d.%d is older than the runtime %d.%d"
                        : "no CUDA driver (libcuda.so.1 not found; runtime %d.%d)",
                     dv ? dv / 1000 : rt / 1000, dv ? dv % 1000 / 10 : rt % 1000 / 10,
                     rt / 1000, rt % 1000 / 10);
        else if (e == cudaErrorNoDevice)
            snprintf(msg, sizeof msg, "no CUDA device (driver present)");
        else
            snprintf(msg, sizeof msg, "CUDA unavailable: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
    } else if (n == 0) {
        snprintf(msg, sizeof msg, "no CUDA device");
    } else if (device < 0 || device >= n) {
        snprintf(msg, sizeof msg, "no CUDA device %d (%d present)", device, n);
    } else {
        if (why && len) why[0] = '\0';
        return 0;
    }
    if (why && len) snprintf(why, len, "%s", msg);
    return pkv_err(PKV_ENOTSUP, "%s", msg);
}

/* ---- The handle ------------------------------------------------------------- */

typedef struct reg_chunk {
    uint8_t *host;
    uint64_t len;
    uint8_t *dev; /* device-mapped address of host */
} reg_chunk;

typedef struct desc_buf {   /* pinned, device-mapped descriptors for a kernel */
    void *host;
    void *dev;
    size_t bytes;
    cudaEvent_t ev;         /* recorded after the kernel that read them */
    int used;
} desc_buf;

struct pkv_cuda_batch {
    pkv_cuda_batch *next_free;
    pkv_cuda_batch *next_all; /* every batch object of the handle */
    pkv_res_plan plan;
    pkv_glue_batch glue;    /* ids' tables, lengths, committed counts at page-in */
    uint64_t *ids;
    size_t n, cap_seqs;
    uint32_t *h_buf;        /* pinned: tables then lens */
    uint32_t *d_buf;        /* device: tables then lens */
    size_t buf_words;
    cudaEvent_t ev_up;      /* upload of h_buf done */
    int up_pending;
    void *ws;               /* attention workspace */
    size_t ws_bytes;
    pkv_cuda_batch_info info;
};

struct pkv_cuda {
    pkv_cache *cache;
    pthread_mutex_t mu;
    int device, sm_count;
    char device_name[300];
    pkv_cuda_mode mode;
    char note[512];
    bool counted;           /* counted in cache->cuda_handles */
    /* the arena */
    uint8_t *map;           /* the cache's mapping */
    uint64_t map_len, data_offset, slot_bytes, block_bytes;
    uint32_t capacity;
    uint8_t *ro_map;        /* read-only second mapping (registered-ro) */
    uint8_t *src;           /* mapping copies read from */
    reg_chunk *chunks;
    uint32_t n_chunks;
    uint64_t blocks_per_chunk;
    uint64_t registered_bytes;
    double register_ms;
    /* device pool */
    uint8_t *pool;
    uint64_t dslot_bytes;
    uint32_t n_slots;
    pkv_res res;
    /* copies */
    cudaStream_t copy;
    cudaEvent_t ev_done, ev_rel, ev_user;
    int have_batch;
    struct cudaMemcpyAttributes battr; /* the attributes the probe found accepted */
    void **b_src, **b_dst;
    size_t *b_size;
    size_t b_cap;
    desc_buf desc[2];
    int desc_next;
    uint8_t *stage[2];
    cudaEvent_t stage_ev[2];
    int stage_used[2];
    uint64_t stage_bytes;
    uint32_t stage_threads;
    /* write-back */
    uint8_t *wb_dev, *wb_host;
    size_t wb_bytes;
    /* batches */
    pkv_cuda_batch *free_batches;
    pkv_cuda_batch *all_batches; /* free or in flight; freed at close */
    /* stats */
    uint64_t page_ins, page_in_failures, bytes_h2d, writebacks, tok_wb, bytes_d2h;
};

static inline uint8_t *pool_slot(const pkv_cuda *g, uint32_t s) {
    return g->pool + (uint64_t)s * g->dslot_bytes;
}
static inline uint8_t *arena_block(const pkv_cuda *g, const uint8_t *base, uint32_t b) {
    return (uint8_t *)base + g->data_offset + (uint64_t)b * g->slot_bytes;
}
/* Device-mapped address of block b in the registered mapping. */
static inline uint8_t *reg_block(const pkv_cuda *g, uint32_t b) {
    const reg_chunk *c = &g->chunks[b / g->blocks_per_chunk];
    return c->dev + (arena_block(g, g->src, b) - c->host);
}

static void unregister_all(pkv_cuda *g) {
    for (uint32_t i = 0; i < g->n_chunks; i++)
        if (drv.unreg) drv.unreg(g->chunks[i].host);
    free(g->chunks);
    g->chunks = NULL;
    g->n_chunks = 0;
    g->registered_bytes = 0;
}

/* Register [base, base + map_len) in chunks of whole slots; on failure undo and
 * describe the failure in err. */
static int register_map(pkv_cuda *g, uint8_t *base, uint64_t chunk_bytes, unsigned flags,
                        char *err, size_t errlen) {
    if (!drv.reg || !drv.unreg || !drv.devptr) {
        snprintf(err, errlen, "%s", drv.why[0] ? drv.why : "driver entry points missing");
        return -1;
    }
    uint64_t bpc = chunk_bytes / g->slot_bytes;
    if (bpc < 1) bpc = 1;
    /* Chunks start on page boundaries, so no page is registered twice: with slots
     * smaller than a page (a version-2 arena), whole pages of them. With page-sized
     * slots, as every arena of blocks over 2 KiB has, this changes nothing. */
    const uint64_t spp = g->slot_bytes < 4096 ? 4096 / g->slot_bytes : 1;
    bpc = (bpc + spp - 1) / spp * spp;
    const uint32_t n = (uint32_t)((g->capacity + bpc - 1) / bpc);
    g->chunks = calloc(n, sizeof *g->chunks);
    if (!g->chunks) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    g->blocks_per_chunk = bpc;
    const double t0 = now_ms();
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t b0 = (uint64_t)i * bpc, b1 = b0 + bpc < g->capacity ? b0 + bpc : g->capacity;
        uint8_t *lo = i ? base + g->data_offset + b0 * g->slot_bytes : base;
        uint8_t *hi = base + g->data_offset + b1 * g->slot_bytes;
        if (b1 == g->capacity) /* to the end of the mapping's last page (a no-op with page slots) */
            hi = base + ((uint64_t)(hi - base) + 4095) / 4096 * 4096;
        CUresult r = drv.reg(lo, (size_t)(hi - lo), flags);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "cuMemHostRegister(%llu bytes at chunk %u/%u) failed: %s",
                     (unsigned long long)(hi - lo), i, n, cu_str(r));
            unregister_all(g);
            return -1;
        }
        g->chunks[i].host = lo;
        g->chunks[i].len = (uint64_t)(hi - lo);
        g->n_chunks = i + 1;
        g->registered_bytes += (uint64_t)(hi - lo);
        CUdeviceptr d = 0;
        r = drv.devptr(&d, lo, 0);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "cuMemHostGetDevicePointer failed: %s", cu_str(r));
            unregister_all(g);
            return -1;
        }
        g->chunks[i].dev = (uint8_t *)(uintptr_t)d;
    }
    g->register_ms = now_ms() - t0;
    return 0;
}

static void note_add(pkv_cuda *g, const char *what, const char *why) {
    size_t l = strlen(g->note);
    snprintf(g->note + l, sizeof g->note - l, "%s%s: %s", l ? "; " : "", what, why);
}

/* Make descriptor buffer i hold at least `bytes`; waits for its last reader. */
static int desc_get(pkv_cuda *g, size_t bytes, desc_buf **out) {
    desc_buf *d = &g->desc[g->desc_next];
    g->desc_next ^= 1;
    int rc = 0;
    if (d->used) CK(cudaEventSynchronize(d->ev), "waiting for a descriptor buffer");
    d->used = 0;
    if (d->bytes < bytes) {
        if (d->host) cudaFreeHost(d->host);
        d->host = d->dev = NULL;
        d->bytes = 0;
        size_t nb = bytes < 65536 ? 65536 : bytes;
        CK(cudaHostAlloc(&d->host, nb, cudaHostAllocMapped | cudaHostAllocPortable),
           "cudaHostAlloc (descriptors)");
        d->bytes = nb;
        CK(cudaHostGetDevicePointer(&d->dev, d->host, 0), "cudaHostGetDevicePointer");
    }
    *out = d;
out:
    return rc;
}

static int scratch_reserve(pkv_cuda *g, size_t n) {
    if (g->b_cap >= n) return 0;
    size_t cap = g->b_cap ? g->b_cap : 256;
    while (cap < n) cap *= 2;
    void **s = realloc(g->b_src, cap * sizeof *s);
    if (s) g->b_src = s;
    void **d = realloc(g->b_dst, cap * sizeof *d);
    if (d) g->b_dst = d;
    size_t *z = realloc(g->b_size, cap * sizeof *z);
    if (z) g->b_size = z;
    if (!s || !d || !z) return pkv_err(PKV_ENOMEM, "copy lists of %zu entries", cap);
    g->b_cap = cap;
    return 0;
}

/* n copies of `bytes` each, srcs (host-registered or pinned addresses for the
 * batch API; dev_srcs device-mapped ones for the gather kernel) -> dsts. */
static int copy_blocks(pkv_cuda *g, void **srcs, void **dev_srcs, void **dsts, uint32_t n,
                       size_t bytes) {
    int rc = 0;
    if (!n) return 0;
    if (g->have_batch) {
        struct cudaMemcpyAttributes attr = g->battr;
        for (size_t i = 0; i < n; i++) g->b_size[i] = bytes;
        for (uint32_t i = 0; i < n; i += BATCH_COPIES) {
            const size_t k = n - i < BATCH_COPIES ? n - i : BATCH_COPIES;
            size_t idx = 0;
            CK(cudaMemcpyBatchAsync(dsts + i, (const void *const *)(srcs + i), g->b_size + i, k,
                                    &attr, &idx, 1, g->copy),
               "cudaMemcpyBatchAsync");
        }
    } else {
        desc_buf *d;
        if ((rc = desc_get(g, (size_t)n * sizeof(pkv_cuk_copy), &d))) return rc;
        pkv_cuk_copy *c = d->host;
        for (uint32_t i = 0; i < n; i++) c[i] = (pkv_cuk_copy){dev_srcs[i], dsts[i]};
        CK((cudaError_t)pkv_cuk_gather_launch(d->dev, n, bytes, g->copy), "gather kernel launch");
        CK(cudaEventRecord(d->ev, g->copy), "cudaEventRecord");
        d->used = 1;
    }
out:
    return rc;
}

/* One CPU thread's share of filling a staging buffer. */
typedef struct stage_job {
    const pkv_cuda *g;
    const pkv_res_copy *cp;
    uint8_t *buf;
    uint32_t lo, hi; /* blocks [lo, hi) of cp / buf */
    pthread_t tid;
} stage_job;

static void *stage_fill(void *arg) {
    const stage_job *j = arg;
    const size_t bb = (size_t)j->g->block_bytes;
    for (uint32_t i = j->lo; i < j->hi; i++)
        memcpy(j->buf + (size_t)i * bb, arena_block(j->g, j->g->src, j->cp[i].block), bb);
    return NULL;
}

/* Fill buf with blocks cp[0..m) on up to g->stage_threads threads. */
static void stage_fill_all(const pkv_cuda *g, const pkv_res_copy *cp, uint32_t m, uint8_t *buf) {
    enum { MAXT = 64 };
    stage_job j[MAXT];
    uint32_t nt = g->stage_threads < MAXT ? g->stage_threads : MAXT;
    if (nt > m) nt = m;
    if (nt < 1) nt = 1;
    uint32_t started = 1;
    for (uint32_t t = 0; t < nt; t++)
        j[t] = (stage_job){.g = g, .cp = cp, .buf = buf, .lo = (uint32_t)((uint64_t)m * t / nt),
                           .hi = (uint32_t)((uint64_t)m * (t + 1) / nt)};
    for (uint32_t t = 1; t < nt; t++) {
        if (pthread_create(&j[t].tid, NULL, stage_fill, &j[t])) break;
        started++;
    }
    for (uint32_t t = started; t < nt; t++) stage_fill(&j[t]); /* could not start: do it here */
    stage_fill(&j[0]);
    for (uint32_t t = 1; t < started; t++) pthread_join(j[t].tid, NULL);
}

static int issue_copies(pkv_cuda *g, const pkv_res_copy *cp, uint32_t n) {
    int rc;
    if (!n) return 0;
    if ((rc = scratch_reserve(g, n))) return rc;
    const size_t bb = (size_t)g->block_bytes;
    if (g->mode != PKV_CUDA_MODE_STAGING) {
        void **dev_srcs = g->b_src; /* reuse: fill per path */
        if (g->have_batch) {
            for (uint32_t i = 0; i < n; i++) {
                g->b_src[i] = arena_block(g, g->src, cp[i].block);
                g->b_dst[i] = pool_slot(g, cp[i].slot);
            }
        } else {
            for (uint32_t i = 0; i < n; i++) {
                dev_srcs[i] = reg_block(g, cp[i].block);
                g->b_dst[i] = pool_slot(g, cp[i].slot);
            }
        }
        rc = copy_blocks(g, g->b_src, dev_srcs, g->b_dst, n, bb);
        if (!rc) g->bytes_h2d += (uint64_t)n * bb;
        return rc;
    }
    /* Staging: fill a pinned buffer on the CPU, copy it out, alternate buffers. */
    const uint32_t per = (uint32_t)(g->stage_bytes / bb);
    for (uint32_t i = 0, k = 0; i < n; i += per, k ^= 1) {
        const uint32_t m = n - i < per ? n - i : per;
        if (g->stage_used[k]) {
            cudaError_t e = cudaEventSynchronize(g->stage_ev[k]);
            if (e != cudaSuccess) return cuda_fail(e, "waiting for a staging buffer");
            g->stage_used[k] = 0;
        }
        void *dev_stage = NULL;
        cudaError_t e = cudaHostGetDevicePointer(&dev_stage, g->stage[k], 0);
        if (e != cudaSuccess) return cuda_fail(e, "cudaHostGetDevicePointer (staging)");
        void **hs = g->b_src + i, **ds = g->b_dst + i;
        stage_fill_all(g, cp + i, m, g->stage[k]);
        for (uint32_t j = 0; j < m; j++) {
            uint8_t *buf = g->stage[k] + (size_t)j * bb;
            hs[j] = g->have_batch ? (void *)buf : (void *)((uint8_t *)dev_stage + (size_t)j * bb);
            ds[j] = pool_slot(g, cp[i + j].slot);
        }
        if ((rc = copy_blocks(g, hs, hs, ds, m, bb))) return rc;
        e = cudaEventRecord(g->stage_ev[k], g->copy);
        if (e != cudaSuccess) return cuda_fail(e, "cudaEventRecord");
        g->stage_used[k] = 1;
        g->bytes_h2d += (uint64_t)m * bb;
    }
    return 0;
}

/* Can cudaMemcpyBatchAsync copy from our source memory? Try one small copy, with
 * location hints (host -> this device), then without. */
static void probe_batch(pkv_cuda *g) {
    g->have_batch = 0;
    void *src = g->mode == PKV_CUDA_MODE_STAGING ? (void *)g->stage[0] : (void *)arena_block(g, g->src, 0);
    void *dst = g->pool;
    size_t sz = 256 < g->block_bytes ? 256 : (size_t)g->block_bytes;
    cudaError_t e = cudaSuccess;
    for (int hints = 1; hints >= 0; hints--) {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        if (hints) {
            attr.srcLocHint.type = cudaMemLocationTypeHost;
            attr.dstLocHint.type = cudaMemLocationTypeDevice;
            attr.dstLocHint.id = g->device;
        }
        size_t idx = 0;
        e = cudaMemcpyBatchAsync(&dst, (const void *const *)&src, &sz, 1, &attr, &idx, 1, g->copy);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->copy);
        if (e == cudaSuccess) {
            g->have_batch = 1;
            g->battr = attr;
            return;
        }
        (void)cudaGetLastError();
    }
    note_add(g, "cudaMemcpyBatchAsync unavailable, using the gather kernel", cudaGetErrorString(e));
}

static void batch_destroy(pkv_cuda_batch *b) {
    if (!b) return;
    if (b->up_pending) cudaEventSynchronize(b->ev_up);
    if (b->ev_up) cudaEventDestroy(b->ev_up);
    if (b->h_buf) cudaFreeHost(b->h_buf);
    if (b->d_buf) cudaFree(b->d_buf);
    if (b->ws) cudaFree(b->ws);
    pkv_res_plan_free(&b->plan);
    pkv_glue_free(&b->glue);
    free(b->ids);
    free(b);
}

/* Count the handle in the cache's stats (pkv_stats.cuda_mode) and, for a
 * writable cache, leave the mode obtained in <dir>/cuda.status for operators
 * (kvdump summary prints it): text lines "key value", written to a temporary
 * file and renamed, not fsynced (it is a report, not state; recovery never
 * reads it). A failure to write it is not an error of the open. */
static void attach_publish(pkv_cuda *g) {
    pkv_cache *c = g->cache;
    pkv_lock(c);
    c->cuda_handles++;
    c->cuda_mode = (uint32_t)g->mode;
    pkv_unlock(c);
    g->counted = true;
    if (c->rdonly || !c->wal.dir) return;
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/cuda.status", c->wal.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "mode %s\ndevice %d %s\npid %ld\ntime %lld\nnote %s\n",
            pkv_cuda_mode_name(g->mode), g->device, g->device_name, (long)getpid(),
            (long long)time(NULL), g->note[0] ? g->note : "-");
    if (fclose(f) == 0) {
        if (rename(tmp, path)) unlink(tmp);
    } else {
        unlink(tmp);
    }
}

void pkv_cuda_close(pkv_cuda *g) {
    if (!g) return;
    if (g->counted) {
        pkv_lock(g->cache);
        if (--g->cache->cuda_handles == 0) g->cache->cuda_mode = PKV_CUDA_MODE_NONE;
        pkv_unlock(g->cache);
    }
    dev_scope ds;
    const int entered = dev_enter(&ds, g->device) == 0;
    if (g->copy) cudaStreamSynchronize(g->copy);
    /* Batches not released are freed too (their handles become invalid). */
    while (g->all_batches) {
        pkv_cuda_batch *b = g->all_batches;
        g->all_batches = b->next_all;
        batch_destroy(b);
    }
    g->free_batches = NULL;
    unregister_all(g);
    if (g->ro_map) munmap(g->ro_map, g->map_len);
    for (int i = 0; i < 2; i++) {
        if (g->stage[i]) cudaFreeHost(g->stage[i]);
        if (g->stage_ev[i]) cudaEventDestroy(g->stage_ev[i]);
        if (g->desc[i].host) cudaFreeHost(g->desc[i].host);
        if (g->desc[i].ev) cudaEventDestroy(g->desc[i].ev);
    }
    if (g->wb_dev) cudaFree(g->wb_dev);
    if (g->wb_host) cudaFreeHost(g->wb_host);
    if (g->pool) cudaFree(g->pool);
    if (g->ev_done) cudaEventDestroy(g->ev_done);
    if (g->ev_rel) cudaEventDestroy(g->ev_rel);
    if (g->ev_user) cudaEventDestroy(g->ev_user);
    if (g->copy) cudaStreamDestroy(g->copy);
    pkv_res_free(&g->res);
    free(g->b_src);
    free(g->b_dst);
    free(g->b_size);
    pthread_mutex_destroy(&g->mu);
    if (entered) dev_leave(&ds);
    free(g);
}

int pkv_cuda_open(pkv_cache *cache, const pkv_cuda_options *opt, pkv_cuda **out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    *out = NULL;
    if (!cache) return pkv_err(PKV_EINVAL, "cache is NULL");
    PKV_LOCAL_ONLY(cache, "pkv_cuda_open");
    pkv_cuda_options o;
    pkv_cuda_options_init(&o);
    if (opt) o = *opt;
    if (o.flags & ~(PKV_CUDA_NO_REGISTER | PKV_CUDA_NO_RW_REGISTER | PKV_CUDA_GATHER_KERNEL))
        return pkv_err(PKV_EINVAL, "unknown pkv_cuda flags 0x%x", o.flags);
    int rc = pkv_cuda_probe(o.device, NULL, 0);
    if (rc) return rc;
    pthread_once(&drv_once, drv_load);
    dev_scope ds;
    if ((rc = dev_enter(&ds, o.device))) return rc;
    pkv_cuda *g = calloc(1, sizeof *g);
    if (!g) {
        dev_leave(&ds);
        return pkv_err(PKV_ENOMEM, "pkv_cuda handle");
    }
    pthread_mutex_init(&g->mu, NULL);
    g->cache = cache;
    g->device = o.device;
    const pkv_arena *a = &cache->arena;
    g->map = a->map;
    g->map_len = a->map_len;
    g->data_offset = a->data_offset;
    g->slot_bytes = a->geo.slot_bytes;
    g->block_bytes = a->geo.block_bytes;
    g->capacity = (uint32_t)((a->map_len - a->data_offset) / a->geo.slot_bytes);
    if (!g->capacity) {
        rc = pkv_err(PKV_EINVAL, "the arena maps no block");
        goto out;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    snprintf(g->device_name, sizeof g->device_name, "%.200s (sm_%d%d)", prop.name, prop.major, prop.minor);
    g->sm_count = prop.multiProcessorCount;
    CK(cudaFree(NULL), "CUDA context creation");
    CK(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking), "cudaStreamCreate");
    CK(cudaEventCreateWithFlags(&g->ev_done, cudaEventDisableTiming), "cudaEventCreate");
    CK(cudaEventCreateWithFlags(&g->ev_rel, cudaEventDisableTiming), "cudaEventCreate");
    CK(cudaEventCreateWithFlags(&g->ev_user, cudaEventDisableTiming), "cudaEventCreate");
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&g->stage_ev[i], cudaEventDisableTiming), "cudaEventCreate");
        CK(cudaEventCreateWithFlags(&g->desc[i].ev, cudaEventDisableTiming), "cudaEventCreate");
    }

    /* Registration, best mode first. */
    const uint64_t chunk = o.register_chunk_bytes ? o.register_chunk_bytes : DEFAULT_CHUNK;
    char err[256];
    const unsigned base_flags = CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE;
    if (o.flags & PKV_CUDA_NO_REGISTER) {
        note_add(g, "registration", "skipped (PKV_CUDA_NO_REGISTER)");
    } else {
        if (cache->rdonly) {
            note_add(g, "read-write registration", "skipped (cache opened read-only)");
        } else if (o.flags & PKV_CUDA_NO_RW_REGISTER) {
            note_add(g, "read-write registration", "skipped (PKV_CUDA_NO_RW_REGISTER)");
        } else if (register_map(g, g->map, chunk, base_flags, err, sizeof err) == 0) {
            g->mode = PKV_CUDA_MODE_REGISTERED;
            g->src = g->map;
        } else {
            note_add(g, "read-write registration", err);
        }
        if (!g->mode) {
            int ro_ok = 0;
            cudaDeviceGetAttribute(&ro_ok, cudaDevAttrHostRegisterReadOnlySupported, o.device);
            (void)cudaGetLastError();
            if (!ro_ok) {
                note_add(g, "read-only registration", "not supported by this device/driver");
            } else {
                void *m = mmap(NULL, g->map_len, PROT_READ, MAP_SHARED, a->fd, 0);
                if (m == MAP_FAILED) {
                    snprintf(err, sizeof err, "mmap PROT_READ: %s", strerror(errno));
                    note_add(g, "read-only registration", err);
                } else {
                    g->ro_map = m;
                    if (register_map(g, g->ro_map, chunk, base_flags | CU_MEMHOSTREGISTER_READ_ONLY,
                                     err, sizeof err) == 0) {
                        g->mode = PKV_CUDA_MODE_REGISTERED_RO;
                        g->src = g->ro_map;
                    } else {
                        note_add(g, "read-only registration", err);
                        munmap(g->ro_map, g->map_len);
                        g->ro_map = NULL;
                    }
                }
            }
        }
    }
    if (!g->mode) {
        g->mode = PKV_CUDA_MODE_STAGING;
        g->src = g->map;
        g->stage_bytes = o.staging_bytes ? o.staging_bytes : DEFAULT_STAGING;
        if (g->stage_bytes < g->block_bytes) g->stage_bytes = g->block_bytes;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        g->stage_threads = o.staging_threads ? o.staging_threads
                           : (uint32_t)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
        for (int i = 0; i < 2; i++)
            CK(cudaHostAlloc((void **)&g->stage[i], g->stage_bytes,
                             cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc (staging buffers)");
    }

    /* The device pool. */
    g->dslot_bytes = (g->block_bytes + 255) / 256 * 256;
    uint64_t want = o.pool_blocks;
    if (!want) {
        size_t fr = 0, tot = 0;
        CK(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
        want = (fr / 2) / g->dslot_bytes;
        if (want > g->capacity) want = g->capacity;
        if (!want) {
            rc = pkv_err(PKV_ENOMEM, "half the free device memory (%zu bytes) holds no block of %llu bytes",
                         fr / 2, (unsigned long long)g->dslot_bytes);
            goto out;
        }
    }
    if (want > (1u << 30)) want = 1u << 30;
    g->n_slots = (uint32_t)want;
    CK(cudaMalloc((void **)&g->pool, (size_t)g->n_slots * g->dslot_bytes), "cudaMalloc (device pool)");
    if ((rc = pkv_res_init(&g->res, g->n_slots, g->capacity, a->geo.block_size))) goto out;
    if (!(o.flags & PKV_CUDA_GATHER_KERNEL)) probe_batch(g);
    else note_add(g, "cudaMemcpyBatchAsync", "skipped (PKV_CUDA_GATHER_KERNEL)");
    if (!g->have_batch && g->mode != PKV_CUDA_MODE_STAGING && !g->chunks) {
        rc = pkv_err(PKV_EIO, "no way to copy blocks");
        goto out;
    }
out:
    if (rc) {
        dev_leave(&ds);
        pkv_cuda_close(g);
        return rc;
    }
    dev_leave(&ds);
    attach_publish(g);
    *out = g;
    return 0;
}

int pkv_cuda_get_stats(pkv_cuda *g, pkv_cuda_stats *out) {
    if (!g || !out) return pkv_err(PKV_EINVAL, "handle or out is NULL");
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&g->mu);
    out->mode = g->mode;
    snprintf(out->mode_name, sizeof out->mode_name, "%s", pkv_cuda_mode_name(g->mode));
    snprintf(out->mode_note, sizeof out->mode_note, "%s", g->note);
    snprintf(out->device_name, sizeof out->device_name, "%.127s", g->device_name);
    out->device = g->device;
    out->batched_copy = g->have_batch;
    out->registered_bytes = g->registered_bytes;
    out->register_chunks = g->n_chunks;
    out->register_ms = g->register_ms;
    out->pool_blocks = g->n_slots;
    out->slot_bytes = g->dslot_bytes;
    pkv_res_counts c;
    pkv_res_counts_get(&g->res, &c);
    out->slots_free = c.free;
    out->slots_cached = c.lru;
    out->slots_pinned = c.pinned;
    out->page_ins = g->page_ins;
    out->page_in_failures = g->page_in_failures;
    out->blocks_hit = g->res.st.hits;
    out->blocks_copied = g->res.st.copies;
    out->blocks_recopied = g->res.st.recopies;
    out->evictions = g->res.st.evictions;
    out->bytes_h2d = g->bytes_h2d;
    out->writebacks = g->writebacks;
    out->tokens_written_back = g->tok_wb;
    out->bytes_d2h = g->bytes_d2h;
    pthread_mutex_unlock(&g->mu);
    return 0;
}

/* ---- Batches ---------------------------------------------------------------- */

static pkv_kv_view pool_view(const pkv_cuda *g) {
    const pkv_geometry *geo = &g->cache->arena.geo;
    pkv_kv_view v;
    memset(&v, 0, sizeof v);
    v.base = g->pool;
    v.dtype = (pkv_dtype)geo->dtype;
    v.num_layers = geo->num_layers;
    v.num_kv_heads = geo->num_kv_heads;
    v.head_dim = geo->head_dim;
    v.block_size = geo->block_size;
    v.num_blocks = g->n_slots;
    v.block_stride = (size_t)g->dslot_bytes;
    v.head_stride = (size_t)geo->run_bytes;
    v.kind_stride = (size_t)geo->run_bytes * geo->num_kv_heads;
    v.layer_stride = v.kind_stride * 2;
    v.token_stride = (size_t)geo->head_dim * geo->elem_size;
    return v;
}

/* A batch object able to hold n sequences and `words` table words. */
static int batch_get(pkv_cuda *g, size_t n, size_t words, pkv_cuda_batch **out) {
    pkv_cuda_batch *b = NULL, **pp = &g->free_batches;
    for (; *pp; pp = &(*pp)->next_free)
        if ((*pp)->cap_seqs >= n && (*pp)->buf_words >= words) break;
    int rc = 0;
    if (*pp) {
        b = *pp;
        *pp = b->next_free;
        b->next_free = NULL;
    } else {
        b = calloc(1, sizeof *b);
        if (!b) return pkv_err(PKV_ENOMEM, "batch");
        size_t w = words < 1024 ? 1024 : words;
        size_t c = n < 64 ? 64 : n;
        b->ids = malloc(c * sizeof *b->ids);
        if (!b->ids) {
            free(b);
            return pkv_err(PKV_ENOMEM, "batch ids");
        }
        b->cap_seqs = c;
        CK(cudaEventCreateWithFlags(&b->ev_up, cudaEventDisableTiming), "cudaEventCreate");
        CK(cudaHostAlloc((void **)&b->h_buf, w * 4, cudaHostAllocPortable), "cudaHostAlloc (tables)");
        CK(cudaMalloc((void **)&b->d_buf, w * 4), "cudaMalloc (tables)");
        b->buf_words = w;
        b->next_all = g->all_batches;
        g->all_batches = b;
    }
    if (b->up_pending) CK(cudaEventSynchronize(b->ev_up), "waiting for a table upload");
    b->up_pending = 0;
out:
    if (rc) {
        if (b->buf_words) { /* on the handle's list: back to the free list */
            b->next_free = g->free_batches;
            g->free_batches = b;
        } else {
            batch_destroy(b);
        }
        return rc;
    }
    *out = b;
    return 0;
}

static void batch_put(pkv_cuda *g, pkv_cuda_batch *b) {
    pkv_res_plan_free(&b->plan);
    pkv_glue_free(&b->glue);
    b->n = 0;
    b->next_free = g->free_batches;
    g->free_batches = b;
}

int pkv_cuda_page_in(pkv_cuda *g, const uint64_t *ids, size_t n, uint32_t flags, void *stream,
                     pkv_cuda_batch **out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    *out = NULL;
    if (!g) return pkv_err(PKV_EINVAL, "handle is NULL");
    if (!n) return pkv_err(PKV_EINVAL, "empty batch");
    if (!ids) return pkv_err(PKV_EINVAL, "ids is NULL");
    if (flags & ~PKV_CUDA_GPU_APPEND) return pkv_err(PKV_EINVAL, "unknown page-in flags 0x%x", flags);
    pkv_glue_batch gb;
    int rc = pkv_glue_collect(g->cache, ids, n, (flags & PKV_CUDA_GPU_APPEND) ? PKV_GLUE_GPU_APPEND : 0, &gb);
    if (rc) return rc;
    dev_scope ds;
    if ((rc = dev_enter(&ds, g->device))) {
        pkv_glue_free(&gb);
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    pkv_res_plan plan;
    pkv_cuda_batch *b = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    rc = pkv_res_plan_batch(&g->res, gb.seqs, n, &plan);
    if (rc) {
        g->page_in_failures++;
        pkv_glue_free(&gb);
        goto unlock;
    }
    const size_t tw = (size_t)plan.n_seqs * plan.table_stride;
    if ((rc = batch_get(g, n, tw + n, &b))) goto abort;
    if ((rc = issue_copies(g, plan.copies, plan.n_copies))) goto abort;
    memcpy(b->h_buf, plan.tables, tw * 4);
    memcpy(b->h_buf + tw, plan.lens, n * 4);
    CK(cudaMemcpyAsync(b->d_buf, b->h_buf, (tw + n) * 4, cudaMemcpyHostToDevice, g->copy),
       "table upload");
    CK(cudaEventRecord(b->ev_up, g->copy), "cudaEventRecord");
    b->up_pending = 1;
    CK(cudaEventRecord(g->ev_done, g->copy), "cudaEventRecord");
    CK(cudaStreamWaitEvent(st, g->ev_done, 0), "cudaStreamWaitEvent");
    memcpy(b->ids, ids, n * sizeof *ids);
    b->n = n;
    b->plan = plan;
    b->glue = gb;
    memset(&b->info, 0, sizeof b->info);
    b->info.view = pool_view(g);
    b->info.seqs.tables = b->d_buf;
    b->info.seqs.table_stride = plan.table_stride;
    b->info.seqs.lens = b->d_buf + tw;
    b->info.seqs.n_seqs = n;
    b->info.seqs.max_len = plan.max_len;
    b->info.blocks = plan.n_blocks;
    b->info.blocks_hit = plan.hits;
    b->info.blocks_copied = plan.n_copies;
    g->page_ins++;
    *out = b;
    goto unlock;
out:  /* a CUDA call failed after the copies were issued */
abort:
    pkv_res_abort(&g->res, &plan);
    pkv_glue_free(&gb);
    if (b) batch_put(g, b);
    g->page_in_failures++;
unlock:
    pthread_mutex_unlock(&g->mu);
    dev_leave(&ds);
    return rc;
}

int pkv_cuda_batch_get_info(const pkv_cuda_batch *b, pkv_cuda_batch_info *out) {
    if (!b || !out) return pkv_err(PKV_EINVAL, "batch or out is NULL");
    *out = b->info;
    return 0;
}

int pkv_cuda_release(pkv_cuda *g, pkv_cuda_batch *b, void *stream) {
    if (!g || !b) return pkv_err(PKV_EINVAL, "handle or batch is NULL");
    dev_scope ds;
    int rc = dev_enter(&ds, g->device);
    if (rc) return rc;
    pthread_mutex_lock(&g->mu);
    /* Copies into these slots must wait for the work enqueued so far on `stream`. */
    cudaError_t e = cudaEventRecord(g->ev_rel, (cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->copy, g->ev_rel, 0);
    if (e != cudaSuccess) {
        rc = cuda_fail(e, "ordering the release after the batch's work");
        cudaStreamSynchronize((cudaStream_t)stream); /* order it the slow way */
        cudaDeviceSynchronize();
    }
    pkv_res_release(&g->res, &b->plan);
    batch_put(g, b);
    pthread_mutex_unlock(&g->mu);
    dev_leave(&ds);
    return rc;
}

/* ---- Write-back ------------------------------------------------------------- */

int pkv_cuda_writeback(pkv_cuda *g, pkv_cuda_batch *b, void *stream) {
    if (!g || !b) return pkv_err(PKV_EINVAL, "handle or batch is NULL");
    if (g->cache->rdonly) return pkv_err(PKV_ERDONLY, "write-back to a cache opened read-only");
    /* A failed cache refuses every change (wal/log.c), this one too: its log
     * stopped, so nothing written now could be committed. The flag is set under
     * the cache lock, so it is read under it. */
    pkv_lock(g->cache);
    int rc = pkv_wal_writable(g->cache);
    pkv_unlock(g->cache);
    if (rc) return rc;
    const pkv_geometry *geo = &g->cache->arena.geo;
    const uint32_t bs = geo->block_size;
    const uint32_t runs = 2 * geo->num_layers * geo->num_kv_heads;
    const size_t row = (size_t)geo->head_dim * geo->elem_size;
    const size_t tok_bytes = (size_t)runs * row;
    uint64_t n_tok = 0;
    for (size_t s = 0; s < b->n; s++) n_tok += b->glue.seqs[s].len - b->glue.committed[s];
    if (!n_tok) return 0;
    uint32_t *arena_blk = NULL, *arena_off = NULL;
    dev_scope ds;
    if ((rc = dev_enter(&ds, g->device))) return rc;
    pthread_mutex_lock(&g->mu);
    if (!g->wb_dev) {
        g->wb_bytes = WB_BYTES > tok_bytes ? WB_BYTES : tok_bytes;
        CK(cudaMalloc((void **)&g->wb_dev, g->wb_bytes), "cudaMalloc (write-back)");
        CK(cudaHostAlloc((void **)&g->wb_host, g->wb_bytes, cudaHostAllocPortable),
           "cudaHostAlloc (write-back)");
    }
    CK(cudaEventRecord(g->ev_user, (cudaStream_t)stream), "cudaEventRecord");
    CK(cudaStreamWaitEvent(g->copy, g->ev_user, 0), "cudaStreamWaitEvent");
    const uint32_t per = (uint32_t)(g->wb_bytes / tok_bytes);
    size_t s = 0;
    uint64_t t = b->n ? b->glue.committed[0] : 0;
    arena_blk = malloc((size_t)per * sizeof *arena_blk);
    arena_off = malloc((size_t)per * sizeof *arena_off);
    if (!arena_blk || !arena_off) {
        rc = pkv_err(PKV_ENOMEM, "write-back lists");
        goto out;
    }
    for (uint64_t done = 0; done < n_tok;) {
        desc_buf *d;
        const uint32_t m = n_tok - done < per ? (uint32_t)(n_tok - done) : per;
        if ((rc = desc_get(g, (size_t)m * sizeof(pkv_cuk_tok), &d))) goto out;
        pkv_cuk_tok *tk = d->host;
        for (uint32_t i = 0; i < m; i++) {
            while (t >= b->glue.seqs[s].len) t = b->glue.committed[++s];
            const uint32_t bi = (uint32_t)(t / bs);
            tk[i].slot = b->plan.tables[s * b->plan.table_stride + bi];
            tk[i].offset = (uint32_t)(t % bs);
            arena_blk[i] = b->glue.seqs[s].blocks[bi];
            arena_off[i] = tk[i].offset;
            t++;
        }
        CK((cudaError_t)pkv_cuk_pack_launch(g->pool, (size_t)g->dslot_bytes, d->dev, m, runs,
                                            (size_t)geo->run_bytes, row, g->wb_dev, g->copy),
           "pack kernel launch");
        CK(cudaEventRecord(d->ev, g->copy), "cudaEventRecord");
        d->used = 1;
        CK(cudaMemcpyAsync(g->wb_host, g->wb_dev, (size_t)m * tok_bytes, cudaMemcpyDeviceToHost, g->copy),
           "write-back copy");
        CK(cudaStreamSynchronize(g->copy), "write-back");
        for (uint32_t i = 0; i < m; i++) {
            uint8_t *dst = arena_block(g, g->map, arena_blk[i]) + (size_t)arena_off[i] * row;
            const uint8_t *src = g->wb_host + (size_t)i * tok_bytes;
            for (uint32_t r = 0; r < runs; r++)
                memcpy(dst + (size_t)r * geo->run_bytes, src + (size_t)r * row, row);
        }
        done += m;
        g->bytes_d2h += (uint64_t)m * tok_bytes;
    }
    g->writebacks++;
    g->tok_wb += n_tok;
    /* The device copies now equal the arena up to len: mark them so, with the tags
     * the blocks will have once those tokens are committed. */
    pkv_glue_batch now;
    if (pkv_glue_collect(g->cache, b->ids, b->n, PKV_GLUE_AS_COMMITTED, &now) == 0) {
        for (size_t q = 0; q < b->n; q++) {
            const pkv_res_seq *was = &b->glue.seqs[q], *is = &now.seqs[q];
            if (is->len != was->len || is->n_blocks < (was->len + bs - 1) / bs) continue;
            for (uint32_t i = (uint32_t)(b->glue.committed[q] / bs); i < (was->len + bs - 1) / bs; i++) {
                if (is->blocks[i] != was->blocks[i]) continue;
                const uint32_t slot = b->plan.tables[q * b->plan.table_stride + i];
                if (pkv_res_lookup(&g->res, is->blocks[i], NULL, NULL) != slot) continue;
                const uint64_t first = (uint64_t)i * bs;
                const uint32_t fin = was->len - first >= bs ? bs : (uint32_t)(was->len - first);
                pkv_res_set_valid(&g->res, is->blocks[i], is->tags[i], fin);
            }
        }
        pkv_glue_free(&now);
    }
    pkv_err_clear();
out:
    free(arena_blk);
    free(arena_off);
    pthread_mutex_unlock(&g->mu);
    dev_leave(&ds);
    return rc;
}

/* ---- Attention -------------------------------------------------------------- */

static int attn_prepare(const pkv_kv_view *v, const pkv_attn_params *p, const pkv_cuda_seqs *s,
                        int sm_count, pkv_attn_plan *plan, pkv_cuk_attn *k) {
    if (!v || !p || !s) return pkv_err(PKV_EINVAL, "view, params or seqs is NULL");
    if (!v->base) return pkv_err(PKV_EINVAL, "view->base is NULL");
    if (v->dtype != PKV_F32 && v->dtype != PKV_F16 && v->dtype != PKV_BF16)
        return pkv_err(PKV_EINVAL, "view: unknown dtype %d", (int)v->dtype);
    if (!v->num_layers || !v->num_kv_heads || !v->head_dim || !v->block_size || !v->num_blocks)
        return pkv_err(PKV_EINVAL, "view: zero geometry");
    const size_t es = v->dtype == PKV_F32 ? 4 : 2;
    if ((uintptr_t)v->base % es || v->block_stride % es || v->layer_stride % es ||
        v->kind_stride % es || v->head_stride % es || v->token_stride % es)
        return pkv_err(PKV_EINVAL, "view: base or a stride is not a multiple of %zu bytes", es);
    if (v->token_stride < (size_t)v->head_dim * es)
        return pkv_err(PKV_EINVAL, "view: token_stride %zu < head_dim * elem_size", v->token_stride);
    if (p->flags & ~PKV_ATTN_PORTABLE) return pkv_err(PKV_EINVAL, "unknown attention flags 0x%x", p->flags);
    if (p->layer >= v->num_layers)
        return pkv_err(PKV_EINVAL, "layer %u >= num_layers %u", p->layer, v->num_layers);
    if (!p->num_q_heads || p->num_q_heads % v->num_kv_heads)
        return pkv_err(PKV_EINVAL, "num_q_heads %u is not a positive multiple of num_kv_heads %u",
                       p->num_q_heads, v->num_kv_heads);
    if (!isfinite(p->scale)) return pkv_err(PKV_EINVAL, "scale is not finite");
    if (!s->n_seqs) return 0;
    if (!s->tables || !s->lens) return pkv_err(PKV_EINVAL, "seqs: tables or lens is NULL");
    if (!s->max_len) return pkv_err(PKV_EINVAL, "seqs: max_len is 0");
    if (s->n_seqs > UINT32_MAX) return pkv_err(PKV_EINVAL, "too many sequences");
    const uint64_t need = ((uint64_t)s->max_len + v->block_size - 1) / v->block_size;
    if (s->table_stride < need)
        return pkv_err(PKV_ERANGE, "table_stride %zu < %llu blocks max_len needs", s->table_stride,
                       (unsigned long long)need);
    const int al = (((uintptr_t)v->base | v->block_stride | v->layer_stride | v->kind_stride |
                     v->head_stride | v->token_stride) % 16) == 0;
    const uint32_t g = p->num_q_heads / v->num_kv_heads;
    /* Plan once to learn the kernel, ask how many of its blocks an SM holds, then
     * plan the splits for that many slots. */
    int rc = pkv_attn_plan_make(v->head_dim, g, v->num_kv_heads, s->n_seqs, s->max_len,
                                s->split_len, 1, al, plan);
    if (rc) return rc;
    pkv_cuk_attn probe;
    memset(&probe, 0, sizeof probe);
    probe.dtype = (uint32_t)v->dtype;
    probe.head_dim = v->head_dim;
    probe.variant = plan->variant;
    probe.ht = plan->ht;
    int per_sm = 0;
    if (pkv_cuk_attn_blocks_per_sm(&probe, &per_sm) != cudaSuccess || per_sm < 1) {
        (void)cudaGetLastError();
        per_sm = 1;
    }
    rc = pkv_attn_plan_make(v->head_dim, g, v->num_kv_heads, s->n_seqs, s->max_len, s->split_len,
                            (uint32_t)sm_count * (uint32_t)per_sm, al, plan);
    if (rc) return rc;
    memset(k, 0, sizeof *k);
    k->base = v->base;
    k->block_stride = v->block_stride;
    k->layer_off = (size_t)p->layer * v->layer_stride;
    k->kind_stride = v->kind_stride;
    k->head_stride = v->head_stride;
    k->token_stride = v->token_stride;
    k->num_blocks = v->num_blocks;
    k->dtype = (uint32_t)v->dtype;
    k->block_size = v->block_size;
    k->head_dim = v->head_dim;
    k->num_q_heads = p->num_q_heads;
    k->num_kv_heads = v->num_kv_heads;
    k->g = g;
    k->tables = s->tables;
    k->table_stride = s->table_stride;
    k->lens = s->lens;
    k->n_seqs = (uint32_t)s->n_seqs;
    k->max_len = s->max_len;
    k->scale_log2 = p->scale * 1.4426950408889634f;
    k->variant = plan->variant;
    k->ht = plan->ht;
    k->tiles = plan->tiles;
    k->n_splits = plan->n_splits;
    k->split_len = plan->split_len;
    k->ws_acc_floats = plan->ws_acc_floats;
    return 0;
}

static int current_sm_count(int *out) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return cuda_fail(e, "querying the device");
    return 0;
}

int pkv_cuda_attn_workspace(const pkv_kv_view *view, const pkv_attn_params *params,
                            const pkv_cuda_seqs *seqs, size_t *work_bytes) {
    if (!work_bytes) return pkv_err(PKV_EINVAL, "work_bytes is NULL");
    *work_bytes = 0;
    int rc = pkv_cuda_probe(0, NULL, 0), sm = 0;
    if (rc) return rc;
    if ((rc = current_sm_count(&sm))) return rc;
    pkv_attn_plan plan;
    pkv_cuk_attn k;
    if ((rc = attn_prepare(view, params, seqs, sm, &plan, &k))) return rc;
    if (seqs->n_seqs) *work_bytes = plan.ws_bytes;
    return 0;
}

int pkv_cuda_attn_decode(const pkv_kv_view *view, const pkv_attn_params *params,
                         const pkv_cuda_seqs *seqs, const float *q, float *out, void *work,
                         size_t work_bytes, void *stream) {
    int sm = 0;
    int rc = pkv_cuda_probe(0, NULL, 0);
    if (rc) return rc;
    if ((rc = current_sm_count(&sm))) return rc;
    pkv_attn_plan plan;
    pkv_cuk_attn k;
    if ((rc = attn_prepare(view, params, seqs, sm, &plan, &k))) return rc;
    if (!seqs->n_seqs) return 0;
    if (!q || !out) return pkv_err(PKV_EINVAL, "q or out is NULL");
    if (plan.ws_bytes && (!work || work_bytes < plan.ws_bytes))
        return pkv_err(PKV_EINVAL, "workspace of %zu bytes needed, %zu given", plan.ws_bytes,
                       work ? work_bytes : 0);
    k.q = q;
    k.out = out;
    k.ws = work;
    cudaError_t e = (cudaError_t)pkv_cuk_attn_launch(&k, stream);
    if (e != cudaSuccess) return cuda_fail(e, "attention kernel launch");
    return 0;
}

int pkv_cuda_attn(pkv_cuda *g, pkv_cuda_batch *b, const pkv_attn_params *params,
                  const float *q, float *out, void *stream) {
    if (!g || !b) return pkv_err(PKV_EINVAL, "handle or batch is NULL");
    dev_scope ds;
    int rc = dev_enter(&ds, g->device);
    if (rc) return rc;
    pkv_attn_plan plan;
    pkv_cuk_attn k;
    if ((rc = attn_prepare(&b->info.view, params, &b->info.seqs, g->sm_count, &plan, &k))) goto out;
    if (!q || !out) {
        rc = pkv_err(PKV_EINVAL, "q or out is NULL");
        goto out;
    }
    if (plan.ws_bytes > b->ws_bytes) {
        if (b->ws) cudaFree(b->ws); /* synchronizes: the old one is idle after */
        b->ws = NULL;
        b->ws_bytes = 0;
        CK(cudaMalloc(&b->ws, plan.ws_bytes), "cudaMalloc (attention workspace)");
        b->ws_bytes = plan.ws_bytes;
    }
    k.q = q;
    k.out = out;
    k.ws = b->ws;
    CK((cudaError_t)pkv_cuk_attn_launch(&k, stream), "attention kernel launch");
out:
    dev_leave(&ds);
    return rc;
}

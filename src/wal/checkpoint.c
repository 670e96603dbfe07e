/*
 * wal/checkpoint.c — checkpoints: a compact, LZ4-compressed snapshot of all
 * durable metadata, written atomically, after which older log segments are
 * recycled.
 *
 * File ckpt-<lsn, 16 hex digits> (little-endian):
 *     0  "PKVCKPT\0"           8  u32 version (1)      12  u32 zero
 *    16  u64 LSN covered      24  u64 arena secret    32  u64 raw length
 *    40  u64 body length      48  u64 XXH3-64 of body 56  u64 XXH3-64 of [0, 56)
 *    64  body: chunks of [u32 raw bytes][u32 compressed bytes][LZ4 block]
 * Raw snapshot:
 *     u32 version, u32 block_size, u32 capacity, u32 kind (0 full, 1 delta)
 *     delta only: u64 LSN and u64 body XXH3-64 of the file it applies on
 *     8 x u64 counters (hit/miss tokens, hit/miss blocks, evictions, cow, dedupes,
 *                       seals)
 *     u64 sealed count, then per sealed block (delta: per changed sealed block):
 *         u32 block, u32 parent, u64 salt, u64 hash lo, u64 hash hi,
 *         u64 payload xxh3, u64 release LSN, u32 flags, u32 zero, u32 tokens[B]
 *     delta only: u64 count, u32 blocks[count]: changed blocks no longer sealed
 *     u64 sequence count, then per sequence (committed part only):
 *         u64 id, u64 salt, u64 committed, u32 nblocks, u32 ntail,
 *         u32 blocks[nblocks], u32 tail tokens[ntail]
 *
 * Delta checkpoints (delta-<lsn>, magic "PKVDELT\0", same header): the blocks
 * whose checkpointed state changed since the previous file of the chain (the
 * pool's dirty bits), and all sequences and counters. Recovery loads ckpt-<lsn>,
 * then each later delta in LSN order, each naming the file before it. The chain
 * ends (the next checkpoint is full) after DELTA_CHAIN_MAX deltas, when the
 * deltas would outgrow the full checkpoint, after a recovery that repaired
 * something (an open that repaired nothing continues the chain: recovery sets
 * the dirty bits of what it changed, wal/replay.c chain_continue), and after a
 * checkpoint that failed once it had begun clearing dirty bits.
 *
 * Atomicity (rule D6 of docs/format.md): write ckpt.tmp, fdatasync it, rename to
 * ckpt-<lsn>, fsync the directory, then delete older checkpoints. A crash at any point leaves either
 * the old or the new checkpoint complete. Loading checks every count and length
 * against the bytes present before reading them.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <xxhash.h>

#define CHUNK (8u << 20)
#define CKPT_PIECE ((size_t)2 << 20) /* bytes written per synced write */
/* LZ4 acceleration above the default trades no size on snapshots (they are mostly
 * sorted integers) for speed; the LZ4 block format, and so the file, is unchanged. */
#define CKPT_LZ4_ACCEL 4

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static int wb_room(wbuf *b, size_t n) {
    if (b->cap - b->len >= n) return 0;
    size_t cap = b->cap ? b->cap : 1u << 16;
    while (cap - b->len < n) cap *= 2;
    uint8_t *np = realloc(b->p, cap);
    if (!np) return PKV_ENOMEM;
    b->p = np;
    b->cap = cap;
    return 0;
}
static void wb_u32(wbuf *b, uint32_t v) {
    pkv_put_u32(b->p + b->len, v);
    b->len += 4;
}
static void wb_u64(wbuf *b, uint64_t v) {
    pkv_put_u64(b->p + b->len, v);
    b->len += 8;
}

/* Blocks copied per hold of the cache lock (a few hundred microseconds). */
#define SLICE_BLOCKS 4096u

/* Make room for n more bytes and touch them, so that the page faults of a fresh
 * buffer are taken here (with the cache lock released), not while copying. */
static int wb_room_touched(wbuf *b, size_t n, size_t *touched) {
    if (wb_room(b, n)) return PKV_ENOMEM;
    size_t from = *touched > b->len ? *touched : b->len;
    if (from < b->len + n) memset(b->p + from, 0, b->len + n - from);
    if (*touched < b->len + n) *touched = b->len + n;
    return 0;
}

static void put_seqs(pkv_cache *c, wbuf *q) {
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    wb_u64(q, c->seqs.count);
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        const pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        uint32_t nb = (uint32_t)((s->committed + bs - 1) / bs);
        uint32_t ntail = (uint32_t)(s->committed % bs);
        wb_u64(q, s->id);
        wb_u64(q, s->salt);
        wb_u64(q, s->committed);
        wb_u32(q, nb);
        wb_u32(q, ntail);
        for (uint32_t j = 0; j < nb; j++) wb_u32(q, s->blocks[j]);
        if (ntail) {
            const uint32_t *t = pkv_pool_tokens(p, s->blocks[nb - 1]);
            for (uint32_t j = 0; j < ntail; j++) wb_u32(q, t[j]);
        }
    }
}

static size_t seqs_size(const pkv_cache *c) {
    const uint32_t bs = c->pool.block_size;
    size_t n = 8;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        const pkv_seq *s = c->seqs.slots[i];
        if (s) n += 32 + 4 * ((s->committed + bs - 1) / bs) + 4 * (s->committed % bs);
    }
    return n;
}

/* Bytes of one sealed block's record. */
static inline uint64_t entry_bytes(uint32_t bs) { return 56 + 4ull * bs; }

/* One sealed block's record (entry_bytes). */
static void put_block(wbuf *b, const pkv_pool *p, uint32_t i) {
    const pkv_block *x = &p->b[i];
    wb_u32(b, i);
    wb_u32(b, x->parent);
    wb_u64(b, x->salt);
    wb_u64(b, x->hash.lo);
    wb_u64(b, x->hash.hi);
    wb_u64(b, x->payload_sum);
    wb_u64(b, x->rel_lsn);
    wb_u32(b, x->flags & (BLKF_UNVERIFIED | BLKF_BAD)); /* the rest are run-time only */
    wb_u32(b, 0);
    const uint32_t *t = pkv_pool_tokens(p, i);
    for (uint32_t j = 0; j < p->block_size; j++) wb_u32(b, t[j]);
}

/* What recovery restores of block k from a checkpoint entry, as a digest: 0 if it
 * is not sealed. Of the flags only BAD counts: the loader keeps no other, and
 * every recovered sealed block is marked UNVERIFIED whatever the entry says. */
uint64_t pkv_ckpt_digest(const pkv_pool *p, uint32_t k) {
    const pkv_block *x = &p->b[k];
    if (x->state != BLK_SEALED) return 0;
    uint64_t f[7] = {x->parent, x->salt, x->hash.lo, x->hash.hi, x->payload_sum,
                     x->rel_lsn, x->flags & BLKF_BAD};
    return XXH3_64bits_withSeed(pkv_pool_tokens(p, k), 4ull * p->block_size,
                                XXH3_64bits(f, sizeof f)) | 1;
}

#if PKV_INTERNAL_CHECKS
/* Blocks [i, end) are being copied: a delta's clean blocks must be as the chain
 * holds them; then every copied block's digest becomes the chain's. A full
 * checkpoint digests every block; a delta its dirty ones and, of the clean ones,
 * all on a test-sized cache (up to 64Ki blocks) and a rotating 1/stride of them
 * on a larger one, so that the check stays a small part of a delta's time. */
static void ck_shadow(pkv_pool *p, bool delta, uint32_t i, uint32_t end, uint64_t phase) {
    uint32_t stride = 1;
    while ((uint64_t)stride << 16 < p->capacity) stride <<= 1;
    for (uint32_t k = i; k < end; k++) {
        bool dirty = p->ckdirty[k >> 6] >> (k & 63) & 1;
        if (delta && !dirty) {
            if ((k & (stride - 1)) == (phase & (stride - 1)))
                pkv_assert(pkv_ckpt_digest(p, k) == p->ckshadow[k]);
            continue;
        }
        p->ckshadow[k] = pkv_ckpt_digest(p, k);
    }
}
#endif

/* Copy blocks [i, end) (lock held; room reserved): every sealed one, or with
 * delta only the dirty ones, the unsealed of those into *fr. Clears their bits. */
static uint64_t put_slice(pkv_pool *p, bool delta, uint32_t i, uint32_t end, wbuf *b,
                          wbuf *fr, uint64_t phase) {
    uint64_t n = 0;
#if PKV_INTERNAL_CHECKS
    ck_shadow(p, delta, i, end, phase);
#else
    (void)phase;
#endif
    if (!delta) {
        for (uint32_t k = i; k < end; k++)
            if (p->b[k].state == BLK_SEALED) put_block(b, p, k), n++;
    } else {
        for (uint32_t w = i >> 6; w < (end + 63) >> 6; w++) {
            uint64_t m = p->ckdirty[w];
            while (m) {
                uint32_t k = (w << 6) + (uint32_t)__builtin_ctzll(m);
                m &= m - 1;
                if (p->b[k].state == BLK_SEALED) put_block(b, p, k), n++;
                else wb_u32(fr, k);
            }
        }
    }
    memset(p->ckdirty + (i >> 6), 0, (((size_t)end + 63) / 64 - (i >> 6)) * 8);
    return n;
}

static uint64_t dirty_count(const pkv_pool *p) {
    uint64_t n = 0;
    for (size_t w = 0; w < ((size_t)p->capacity + 63) / 64; w++)
        n += (uint64_t)__builtin_popcountll(p->ckdirty[w]);
    return n;
}

uint64_t pkv_ckpt_full_estimate(const pkv_cache *c) {
    return 16 + 8 * 8 + 8 + c->pool.n_sealed * entry_bytes(c->pool.block_size) +
           seqs_size(c);
}

uint64_t pkv_ckpt_delta_estimate(const pkv_cache *c) {
    return 16 + 16 + 8 * 8 + 16 + dirty_count(&c->pool) * entry_bytes(c->pool.block_size) +
           seqs_size(c);
}

int pkv_ckpt_serialize(pkv_cache *c, bool delta, uint8_t **out, size_t *outlen,
                       uint64_t *lsn_out, uint64_t *end_out, uint64_t *full_len) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size, cap = p->capacity;
    const size_t per = entry_bytes(bs);
    wbuf b = {0}, q = {0}, fr = {0};
    /* Size the buffer for the blocks sealed now, or dirty now (plus slack) with
     * the lock released; it grows between slices if more get sealed meanwhile. */
    uint64_t nb = delta ? dirty_count(p) : p->n_sealed;
    size_t est = 16 + 16 + 8 * 8 + 8 + (nb + nb / 16 + SLICE_BLOCKS) * per;
    pkv_unlock(c);
    int rc = wb_room(&b, est);
    pkv_lock(c);
    if (rc) goto nomem;
    /* Counters and sequences: exact at the checkpoint LSN (one hold of the lock). */
    for (;;) {
        size_t need = seqs_size(c);
        if (q.cap >= need) break;
        pkv_unlock(c);
        rc = wb_room(&q, need);
        pkv_lock(c);
        if (rc) goto nomem;
    }
    const uint64_t lsn = c->wal.next_lsn - 1;
    pkv_log_settle_all(c);        /* the records up to lsn show what the snapshot */
    pkv_wal_no_coalesce(&c->wal); /* shows, and are final: replay skips them */
    *full_len = pkv_ckpt_full_estimate(c);
    wb_u32(&b, WAL_VERSION);
    wb_u32(&b, bs);
    wb_u32(&b, cap);
    wb_u32(&b, delta ? 1 : 0);
    if (delta) {
        wb_u64(&b, c->wal.prev_lsn);
        wb_u64(&b, c->wal.prev_sum);
    }
    const pkv_counters *k = &c->ctr;
    uint64_t ctr[8] = {k->hit_tokens, k->miss_tokens, k->hit_blocks, k->miss_blocks,
                       k->evictions, k->cow_copies, k->dedupes, k->seals};
    for (int i = 0; i < 8; i++) wb_u64(&b, ctr[i]);
    size_t count_at = b.len;
    wb_u64(&b, 0); /* sealed count, patched at the end */
    put_seqs(c, &q);
    /* Blocks, a slice per hold of the lock. */
    uint64_t nsealed = 0;
    size_t touched = 0;
    for (uint32_t i = 0; i < cap;) {
        uint32_t end = cap - i < SLICE_BLOCKS ? cap : i + SLICE_BLOCKS;
        size_t need = (size_t)(end - i) * per;
        pkv_unlock(c); /* let waiting callers in; fault in the next slice's room */
        rc = wb_room_touched(&b, need, &touched);
        if (!rc && delta) rc = wb_room(&fr, 4ull * (end - i));
        pkv_lock(c);
        if (rc) goto nomem;
        nsealed += put_slice(p, delta, i, end, &b, &fr, lsn);
        i = end;
    }
    *lsn_out = lsn;
    *end_out = c->wal.next_lsn - 1;
    pkv_put_u64(b.p + count_at, nsealed);
    pkv_unlock(c);
    rc = wb_room(&b, (delta ? 8 + fr.len : 0) + q.len);
    if (!rc) {
        if (delta) {
            wb_u64(&b, fr.len / 4);
            memcpy(b.p + b.len, fr.p, fr.len);
            b.len += fr.len;
        }
        memcpy(b.p + b.len, q.p, q.len);
        b.len += q.len;
    }
    pkv_lock(c);
    if (rc) goto nomem;
    free(q.p);
    free(fr.p);
    *out = b.p;
    *outlen = b.len;
    if (!delta) *full_len = b.len;
    return 0;
nomem:
    free(b.p);
    free(q.p);
    free(fr.p);
    return pkv_err(PKV_ENOMEM, "checkpoint snapshot");
}

int pkv_io_err(int neg, const char *what, const char *path) {
    int e = -neg;
    return pkv_err(e == ENOSPC || e == EDQUOT ? PKV_ENOSPC : PKV_EIO, "%s %s: %s", what,
                   path, strerror(e));
}

/* Delete every checkpoint file but ckpt-<keep>: after a new full checkpoint no
 * chain needs them. With keep_chain, also keep the deltas after it (the chain on
 * top of it). */
static void remove_old(pkv_wal *w, uint64_t keep, bool keep_chain) {
    DIR *d = opendir(w->dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t n;
        const char *pre = pkv_wal_name_no(e->d_name, "ckpt-", &n)    ? "ckpt-"
                          : pkv_wal_name_no(e->d_name, "delta-", &n) ? "delta-"
                                                                     : NULL;
        if (!pre || (n == keep && pre[0] == 'c') || (keep_chain && pre[0] == 'd' && n > keep))
            continue;
        char path[4200];
        pkv_wal_path(w, path, sizeof path, pre, n);
        w->io->unlink(w->io->ctx, path);
    }
    closedir(d);
}

void pkv_ckpt_remove_stale(pkv_wal *w, uint64_t base) { remove_old(w, base, true); }

int pkv_ckpt_write(pkv_wal *w, bool delta, uint64_t lsn, uint64_t end_lsn,
                   const uint8_t *raw, size_t len, uint64_t *body_sum, bool *renamed) {
    const pkv_io_ops *io = w->io;
    *renamed = false;
    size_t nchunks = (len + CHUNK - 1) / CHUNK;
    size_t bound = CKPT_HDR + nchunks * 8 + (size_t)LZ4_compressBound(CHUNK) * nchunks;
    if (nchunks == 0) bound = CKPT_HDR;
    uint8_t *out = malloc(bound);
    if (!out) return pkv_err(PKV_ENOMEM, "checkpoint buffer of %zu bytes", bound);
    size_t o = CKPT_HDR;
    for (size_t off = 0; off < len; off += CHUNK) {
        int n = (int)(len - off < CHUNK ? len - off : CHUNK);
        int cl = LZ4_compress_fast((const char *)raw + off, (char *)out + o + 8, n,
                                   LZ4_compressBound(n), CKPT_LZ4_ACCEL);
        if (cl <= 0) {
            free(out);
            return pkv_err(PKV_EIO, "LZ4 compression failed");
        }
        pkv_put_u32(out + o, (uint32_t)n);
        pkv_put_u32(out + o + 4, (uint32_t)cl);
        o += 8 + (size_t)cl;
    }
    uint8_t *h = out;
    memset(h, 0, CKPT_HDR);
    memcpy(h, delta ? DELTA_MAGIC : CKPT_MAGIC, 8);
    pkv_put_u32(h + 8, WAL_VERSION);
    /* How far past `lsn` the block section may reach (saturating). */
    pkv_put_u32(h + 12, end_lsn - lsn >= UINT32_MAX ? UINT32_MAX : (uint32_t)(end_lsn - lsn));
    pkv_put_u64(h + 16, lsn);
    pkv_put_u64(h + 24, w->arena_secret);
    pkv_put_u64(h + 32, len);
    pkv_put_u64(h + 40, o - CKPT_HDR);
    *body_sum = XXH3_64bits(out + CKPT_HDR, o - CKPT_HDR);
    pkv_put_u64(h + 48, *body_sum);
    pkv_put_u64(h + 56, XXH3_64bits(h, 56));

    char tmp[4200], path[4200];
    snprintf(tmp, sizeof tmp, "%s/ckpt.tmp", w->dir);
    int rc = pkv_wal_path(w, path, sizeof path, delta ? "delta-" : "ckpt-", lsn);
    if (rc) {
        free(out);
        return rc;
    }
    int fd = io->open(io->ctx, tmp, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        free(out);
        (void)io->unlink(io->ctx, tmp); /* O_CREAT may have made it */
        return pkv_io_err(fd, "create", tmp);
    }
    /* Written and synced a piece at a time where the log is synced too (GROUP,
     * ALWAYS): the log's fdatasyncs, which the flusher keeps issuing meanwhile,
     * then never queue behind more than one piece of checkpoint data (ext4
     * commits a file's journal together with the ordered data of others). In
     * NONE mode nothing waits for the log, so one write and one sync is best. */
    const size_t piece = w->mode == PKV_DURABLE_NONE ? o : CKPT_PIECE;
    rc = 0;
    for (size_t off = 0; off < o && rc >= 0; off += piece)
        rc = io->write(io->ctx, fd, out + off, o - off < piece ? o - off : piece, off, 1);
    io->close(io->ctx, fd);
    free(out);
    if (rc < 0) { /* the temporary file is discarded, never synced again (fsyncgate) */
        io->unlink(io->ctx, tmp);
        return pkv_io_err(rc, "write", tmp);
    }
    *renamed = true; /* from here on a failure leaves the directory uncertain */
    if ((rc = io->rename(io->ctx, tmp, path)) < 0) return pkv_io_err(rc, "rename", path);
    if ((rc = io->sync_dir(io->ctx, w->dir)) < 0) return pkv_io_err(rc, "fsync", w->dir);
    atomic_fetch_add_explicit(&w->ckpt_file_bytes, o, memory_order_relaxed);
    if (!delta) remove_old(w, lsn, false);
    return 0;
}

/* The body is read a chunk at a time into one reused buffer and decompressed
 * straight into the raw snapshot (no buffer the size of the whole file), hashing
 * as it goes; the raw snapshot is used only if the whole body's checksum holds. */
/* Read n body bytes at body offset *bo into buf, hash them into st and advance
 * *bo. 0, 1 if the file ends first, or a negative error (message set). */
static int read_hashed(const pkv_io_ops *io, int fd, const char *path, uint8_t *buf,
                       size_t n, uint64_t *bo, XXH3_state_t *st) {
    long r = io->pread(io->ctx, fd, buf, n, CKPT_HDR + *bo);
    if (r < 0) return pkv_io_err((int)r, "read", path);
    if ((size_t)r != n) return 1;
    XXH3_64bits_update(st, buf, n);
    *bo += n;
    return 0;
}

int pkv_ckpt_read(const pkv_io_ops *io, const char *path, const char *magic,
                  uint64_t *secret, uint64_t *lsn, uint64_t *end_lsn, uint8_t **raw_out,
                  size_t *len_out, uint64_t *body_sum) {
    uint8_t h[CKPT_HDR];
    int fd = io->open(io->ctx, path, O_RDONLY, 0);
    if (fd < 0) return pkv_io_err(fd, "open", path);
    uint8_t *cbuf = NULL, *raw = NULL;
    XXH3_state_t *st = NULL;
    int rc;
    long r = io->pread(io->ctx, fd, h, CKPT_HDR, 0);
    if (r < 0) {
        rc = pkv_io_err((int)r, "read", path);
        goto out;
    }
    if (r != (long)CKPT_HDR || memcmp(h, magic, 8) ||
        !pkv_sum_ok(pkv_get_u64(h + 56), XXH3_64bits(h, 56))) {
        rc = pkv_err(PKV_ECORRUPT, "%s: bad checkpoint header", path);
        goto out;
    }
    if (pkv_get_u32(h + 8) != WAL_VERSION) {
        rc = pkv_err(PKV_EVERSION, "%s: checkpoint version %u", path, pkv_get_u32(h + 8));
        goto out;
    }
    *lsn = pkv_get_u64(h + 16);
    *secret = pkv_get_u64(h + 24);
    uint32_t reach = pkv_get_u32(h + 12);
    *end_lsn = reach == UINT32_MAX ? UINT64_MAX : *lsn + reach;
    uint64_t rawlen = pkv_get_u64(h + 32), bodylen = pkv_get_u64(h + 40);
    if (rawlen > (1ull << 40) || bodylen > (1ull << 40) ||
        bodylen > rawlen / 8 + (rawlen / CHUNK + 1) * (LZ4_compressBound(CHUNK) + 8)) {
        rc = pkv_err(PKV_ECORRUPT, "%s: implausible lengths", path);
        goto out;
    }
    /* Lengths against the bytes present before allocating for them: a header
     * that claims a body longer than the file, or more raw bytes than LZ4 can
     * expand the body to (255 bytes out per byte in, at best), would otherwise
     * make a small damaged or forged file allocate up to a terabyte. */
    uint8_t probe;
    if (bodylen && (r = io->pread(io->ctx, fd, &probe, 1, CKPT_HDR + bodylen - 1)) != 1) {
        rc = r < 0 ? pkv_io_err((int)r, "read", path)
                   : pkv_err(PKV_ECORRUPT, "%s: checkpoint body truncated", path);
        goto out;
    }
    if (rawlen / 255 > bodylen) {
        rc = pkv_err(PKV_ECORRUPT, "%s: implausible lengths", path);
        goto out;
    }
    const size_t ccap = (size_t)LZ4_compressBound(CHUNK) + 8;
    cbuf = malloc(ccap);
    raw = malloc(rawlen ? rawlen : 1);
    st = XXH3_createState();
    if (!cbuf || !raw || !st) {
        rc = pkv_err(PKV_ENOMEM, "checkpoint of %llu bytes", (unsigned long long)rawlen);
        goto out;
    }
    pkv_hint_huge(raw, rawlen);
    XXH3_64bits_reset(st);
    uint64_t bo = 0, ro = 0;
    bool bad = false, shortread = false;
    while (bo < bodylen) {
        /* A chunk: [u32 raw bytes][u32 compressed bytes][LZ4 block]. Once the
         * structure is bad, the rest is only hashed (to tell damage from a bug). */
        size_t want = 8;
        uint32_t n = 0, cl = 0;
        if (!bad) {
            if (bodylen - bo < 8) bad = true;
        }
        if (bad) want = bodylen - bo < ccap ? (size_t)(bodylen - bo) : ccap;
        if ((rc = read_hashed(io, fd, path, cbuf, want, &bo, st)) < 0) goto out;
        if (rc) {
            shortread = true;
            break;
        }
        if (bad) continue;
        n = pkv_get_u32(cbuf);
        cl = pkv_get_u32(cbuf + 4);
        if (n > CHUNK || n > rawlen - ro || cl > bodylen - bo || cl > ccap) {
            bad = true;
            continue;
        }
        if ((rc = read_hashed(io, fd, path, cbuf, cl, &bo, st)) < 0) goto out;
        if (rc) {
            shortread = true;
            break;
        }
        int d = LZ4_decompress_safe((const char *)cbuf, (char *)raw + ro, (int)cl, (int)n);
        if (d != (int)n) {
            bad = true;
            continue;
        }
        ro += n;
    }
    if (shortread || !pkv_sum_ok(pkv_get_u64(h + 48), XXH3_64bits_digest(st))) {
        rc = pkv_err(PKV_ECORRUPT, "%s: checkpoint body truncated or checksum mismatch",
                     path);
        goto out;
    }
    if (bad || ro != rawlen) {
        rc = pkv_err(PKV_ECORRUPT, "%s: checkpoint body does not decompress", path);
        goto out;
    }
    *raw_out = raw;
    *len_out = rawlen;
    if (body_sum) *body_sum = pkv_get_u64(h + 48);
    raw = NULL;
    rc = 0;
out:
    io->close(io->ctx, fd);
    if (st) XXH3_freeState(st);
    free(cbuf);
    free(raw);
    return rc;
}

/* Bounds-checked reader. */
typedef struct rbuf {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} rbuf;
static uint32_t rb_u32(rbuf *b) {
    if (b->len - b->off < 4) { b->bad = true; return 0; }
    uint32_t v = pkv_get_u32(b->p + b->off);
    b->off += 4;
    return v;
}
static uint64_t rb_u64(rbuf *b) {
    if (b->len - b->off < 8) { b->bad = true; return 0; }
    uint64_t v = pkv_get_u64(b->p + b->off);
    b->off += 8;
    return v;
}

/* The raw snapshot's fixed head: version, geometry, kind and (delta) the file it
 * applies on. Leaves b after it. */
static int read_head(rbuf *b, uint32_t *bs, uint32_t *cap, pkv_ckpt_meta *m) {
    uint32_t ver = rb_u32(b);
    *bs = rb_u32(b);
    *cap = rb_u32(b);
    uint32_t kind = rb_u32(b);
    if (b->bad || ver != WAL_VERSION || kind > 1)
        return pkv_err(PKV_ECORRUPT, "checkpoint: version %u, kind %u", ver, kind);
    memset(m, 0, sizeof *m);
    m->delta = kind == 1;
    if (m->delta) {
        m->prev_lsn = rb_u64(b);
        m->prev_sum = rb_u64(b);
        if (b->bad) return pkv_err(PKV_ECORRUPT, "checkpoint truncated");
    }
    return 0;
}

int pkv_ckpt_info(const uint8_t *raw, size_t len, pkv_ckpt_meta *out) {
    rbuf b = {raw, len, 0, false};
    uint32_t bs, cap;
    return read_head(&b, &bs, &cap, out);
}

/* Load a raw snapshot into c, or with c NULL only check it (against geometry
 * bs / capacity) and count what it holds: one walk, so the checks exist once. */
static int ckpt_walk(pkv_cache *c, uint32_t bs, uint64_t capacity, const uint8_t *raw,
                     size_t len, bool seqs, pkv_ckpt_counts *n) {
    pkv_pool *p = c ? &c->pool : NULL;
    rbuf b = {raw, len, 0, false};
    uint32_t cbs, cap;
    pkv_ckpt_meta m;
    int rc = read_head(&b, &cbs, &cap, &m);
    if (rc) return rc;
    if (cbs != bs || cap != capacity)
        return pkv_err(PKV_ECORRUPT, "checkpoint geometry (block size %u, capacity %u) "
                       "differs from the arena's (%u, %llu)", cbs, cap, bs,
                       (unsigned long long)capacity);
    for (int i = 0; i < 8; i++) {
        uint64_t v = rb_u64(&b);
        if (!c) continue;
        pkv_counters *k = &c->ctr;
        uint64_t *ctr[8] = {&k->hit_tokens, &k->miss_tokens, &k->hit_blocks, &k->miss_blocks,
                            &k->evictions, &k->cow_copies, &k->dedupes, &k->seals};
        *ctr[i] = v;
    }
    uint64_t ns = rb_u64(&b);
    if (b.bad || ns > cap || ns * entry_bytes(bs) > len - b.off)
        return pkv_err(PKV_ECORRUPT, "checkpoint: bad sealed block count %llu",
                       (unsigned long long)ns);
    /* The count check above covers all ns records: decode them without
     * per-field bounds checks (the largest item of loading a 1M-block snapshot). */
    const size_t per = entry_bytes(bs);
    const uint8_t *q = raw + b.off;
    for (uint64_t i = 0; i < ns; i++, q += per) {
        uint32_t blk = pkv_get_u32(q), parent = pkv_get_u32(q + 4);
        if (blk >= cap || (parent != PKV_NONE && parent >= cap))
            return pkv_err(PKV_ECORRUPT, "checkpoint: block %u / parent %u out of range",
                           blk, parent);
        if (!c) continue;
        pkv_block *x = &p->b[blk];
        x->state = BLK_SEALED;
        x->parent = parent;
        x->salt = pkv_get_u64(q + 8);
        x->hash.lo = pkv_get_u64(q + 16);
        x->hash.hi = pkv_get_u64(q + 24);
        x->payload_sum = pkv_get_u64(q + 32);
        x->rel_lsn = pkv_get_u64(q + 40);
        x->flags = (uint8_t)(pkv_get_u32(q + 48) & (BLKF_UNVERIFIED | BLKF_BAD));
        uint32_t *t = pkv_pool_tokens(p, blk);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(t, q + 56, 4ull * bs);
#else
        for (uint32_t j = 0; j < bs; j++) t[j] = pkv_get_u32(q + 56 + 4ull * j);
#endif
    }
    b.off += ns * per;
    uint64_t nf = 0;
    if (m.delta) {
        /* Blocks sealed in the chain before, no longer sealed now. */
        nf = rb_u64(&b);
        if (b.bad || nf > cap || nf * 4 > len - b.off)
            return pkv_err(PKV_ECORRUPT, "checkpoint: bad freed block count %llu",
                           (unsigned long long)nf);
        for (uint64_t i = 0; i < nf; i++) {
            uint32_t blk = rb_u32(&b);
            if (blk >= cap)
                return pkv_err(PKV_ECORRUPT, "checkpoint: freed block %u out of range", blk);
            if (!c) continue;
            pkv_block *x = &p->b[blk];
            x->state = BLK_FREE;
            x->parent = PKV_NONE;
            x->flags = 0;
        }
    }
    uint64_t nq = rb_u64(&b);
    if (b.bad) return pkv_err(PKV_ECORRUPT, "checkpoint truncated");
    for (uint64_t i = 0; i < nq; i++) {
        pkv_rec r;
        memset(&r, 0, sizeof r);
        r.type = REC_SEQ_SET;
        r.seq = rb_u64(&b);
        r.salt = rb_u64(&b);
        r.committed = rb_u64(&b);
        r.nblocks = rb_u32(&b);
        r.ntok = rb_u32(&b);
        if (b.bad || r.ntok >= bs || 4ull * r.nblocks + 4ull * r.ntok > len - b.off)
            return pkv_err(PKV_ECORRUPT, "checkpoint: sequence %llu malformed",
                           (unsigned long long)i);
        r.blocks = raw + b.off;
        r.tokens = r.blocks + 4ull * r.nblocks;
        b.off += 4ull * r.nblocks + 4ull * r.ntok;
        if (!c || !seqs) continue; /* an older file of the chain: the newest one's apply */
        rc = pkv_replay_apply(c, &r);
        if (rc) return rc;
    }
    if (b.off != len) return pkv_err(PKV_ECORRUPT, "checkpoint: %zu trailing bytes",
                                     len - b.off);
    if (n) {
        n->sealed = ns;
        n->freed = nf;
        n->sequences = nq;
    }
    return 0;
}

int pkv_ckpt_load(pkv_cache *c, const uint8_t *raw, size_t len, bool seqs) {
    return ckpt_walk(c, c->pool.block_size, c->pool.capacity, raw, len, seqs, NULL);
}

int pkv_ckpt_check(const uint8_t *raw, size_t len, uint32_t block_size, uint64_t capacity,
                   pkv_ckpt_counts *n) {
    return ckpt_walk(NULL, block_size, capacity, raw, len, false, n);
}

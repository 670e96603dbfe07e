/*
 * wal/record.c — the log record format: one typed, length-prefixed, checksummed
 * record per mutation of the durable state, or per run of them (a commit's
 * seals, an append's evictions: SEAL_RUN, EVICT_RUN, replayed as the single
 * records would be).
 *
 * Record, little-endian, 8-byte aligned (docs/format.md):
 *     0  u32 len        total bytes, header and checksum included, multiple of 8
 *     4  u16 type       REC_* (wal/wal.h)
 *     6  u16 zero
 *     8  u64 lsn        log sequence number; consecutive, starting at 1
 *    16  payload        per type, zero-padded to the 8-byte boundary
 * len-8  u64 checksum   XXH3-64, seeded with the segment epoch, of bytes [0, len-8)
 *
 * Records hold absolute new values (a table entry, a length, a sealed block's
 * whole content), so applying one twice is harmless (redo is idempotent).
 * Refcounts are not logged: they are a function of the block tables and are
 * recomputed at recovery. Decoding checks every length against the record size
 * and the block size before anything reads past it.
 */
#include "internal.h"

#include <stdlib.h>

const char *pkv_rec_type_name(unsigned type) {
    switch (type) {
    case REC_SEAL:      return "SEAL";
    case REC_EVICT:     return "EVICT";
    case REC_SEQ_SET:   return "SEQ_SET";
    case REC_COMMIT:    return "COMMIT";
    case REC_SEQ_BLOCK: return "SEQ_BLOCK";
    case REC_TRUNC:     return "TRUNC";
    case REC_SEQ_CLOSE: return "SEQ_CLOSE";
    case REC_BAD:       return "BAD";
    case REC_SEAL_RUN:  return "SEAL_RUN";
    case REC_EVICT_RUN: return "EVICT_RUN";
    default:            return "UNKNOWN";
    }
}

#define NEED(n)                                                                   \
    do {                                                                          \
        if ((size_t)(n) > len)                                                    \
            return pkv_err(PKV_ECORRUPT, "%s record at LSN %llu: %zu bytes, needs %zu", \
                           pkv_rec_type_name(r->type), (unsigned long long)r->lsn, \
                           len, (size_t)(n));                                     \
    } while (0)

uint32_t pkv_rec_max = REC_MAX_BYTES;
uint32_t pkv_log_run_max = PKV_LOG_RUN_MAX;

int pkv_rec_decode(const uint8_t *p, size_t len, uint32_t bs, pkv_rec *r) {
    /* p points at the record start; len is its payload length (without header
     * and trailer, padding included). */
    memset(r, 0, sizeof *r);
    r->type = pkv_get_u32(p + 4) & 0xffff;
    r->lsn = pkv_get_u64(p + 8);
    /* REC_MAX_BYTES: no writer makes a larger record, so one is damage or forgery */
    if (len > REC_MAX_BYTES - REC_HDR - REC_TRAILER)
        return pkv_err(PKV_ECORRUPT, "%s record at LSN %llu: %zu bytes, more than "
                       "REC_MAX_BYTES (%u)", pkv_rec_type_name(r->type),
                       (unsigned long long)r->lsn, len + REC_HDR + REC_TRAILER,
                       REC_MAX_BYTES);
    const uint8_t *q = p + REC_HDR;
    switch (r->type) {
    case REC_SEAL:
        NEED(48);
        r->block = pkv_get_u32(q);
        r->parent = pkv_get_u32(q + 4);
        r->salt = pkv_get_u64(q + 8);
        r->hash_lo = pkv_get_u64(q + 16);
        r->hash_hi = pkv_get_u64(q + 24);
        r->payload_sum = pkv_get_u64(q + 32);
        r->ntok = pkv_get_u32(q + 40);
        if (r->ntok != bs)
            return pkv_err(PKV_ECORRUPT, "SEAL at LSN %llu has %u tokens, block size %u",
                           (unsigned long long)r->lsn, r->ntok, bs);
        NEED(48 + 4ull * r->ntok);
        r->tokens = q + 48;
        break;
    case REC_EVICT:
    case REC_BAD:
        NEED(8);
        r->block = pkv_get_u32(q);
        break;
    case REC_SEAL_RUN:
        NEED(16);
        r->nblocks = pkv_get_u32(q);
        r->ntok = pkv_get_u32(q + 4);
        r->salt = pkv_get_u64(q + 8);
        if (r->nblocks == 0 || r->ntok != bs)
            return pkv_err(PKV_ECORRUPT, "SEAL_RUN at LSN %llu: %u blocks of %u tokens, "
                           "block size %u", (unsigned long long)r->lsn, r->nblocks, r->ntok, bs);
        NEED(16 + (uint64_t)r->nblocks * SEAL_RUN_ENTRY(bs));
        r->blocks = q + 16;
        break;
    case REC_EVICT_RUN:
        NEED(8);
        r->nblocks = pkv_get_u32(q);
        if (r->nblocks == 0)
            return pkv_err(PKV_ECORRUPT, "EVICT_RUN at LSN %llu names no block",
                           (unsigned long long)r->lsn);
        NEED(8 + 4ull * r->nblocks);
        r->blocks = q + 8;
        break;
    case REC_SEQ_SET:
        NEED(32);
        r->seq = pkv_get_u64(q);
        r->salt = pkv_get_u64(q + 8);
        r->committed = pkv_get_u64(q + 16);
        r->nblocks = pkv_get_u32(q + 24);
        r->ntok = pkv_get_u32(q + 28);
        NEED(32 + 4ull * r->nblocks + 4ull * r->ntok);
        r->blocks = q + 32;
        r->tokens = r->blocks + 4ull * r->nblocks;
        break;
    case REC_COMMIT:
        NEED(32);
        r->seq = pkv_get_u64(q);
        r->committed = pkv_get_u64(q + 8);
        r->first = pkv_get_u32(q + 16);
        r->nblocks = pkv_get_u32(q + 20);
        r->tail_off = pkv_get_u32(q + 24);
        r->ntok = pkv_get_u32(q + 28);
        NEED(32 + 4ull * r->nblocks + 4ull * r->ntok);
        r->blocks = q + 32;
        r->tokens = r->blocks + 4ull * r->nblocks;
        break;
    case REC_SEQ_BLOCK:
        NEED(24);
        r->seq = pkv_get_u64(q);
        r->index = pkv_get_u32(q + 8);
        r->block = pkv_get_u32(q + 12);
        r->ntok = pkv_get_u32(q + 16);
        NEED(24 + 4ull * r->ntok);
        r->tokens = q + 24;
        break;
    case REC_TRUNC:
        NEED(24);
        r->seq = pkv_get_u64(q);
        r->committed = pkv_get_u64(q + 8);
        r->block = pkv_get_u32(q + 16);
        r->ntok = pkv_get_u32(q + 20);
        NEED(24 + 4ull * r->ntok);
        r->tokens = q + 24;
        break;
    case REC_SEQ_CLOSE:
        NEED(8);
        r->seq = pkv_get_u64(q);
        break;
    default:
        return pkv_err(PKV_ECORRUPT, "unknown record type %u at LSN %llu", r->type,
                       (unsigned long long)r->lsn);
    }
    if (r->ntok > bs && r->type != REC_SEAL && r->type != REC_SEAL_RUN)
        return pkv_err(PKV_ECORRUPT, "%s at LSN %llu carries %u tail tokens > block size",
                       pkv_rec_type_name(r->type), (unsigned long long)r->lsn, r->ntok);
    return 0;
}

/* ---- Encoding (cache lock held; space reserved with pkv_wal_reserve) ----- */

/* A record names block b in a sequence's table: if b is open, freeing it must now
 * wait in limbo until the freeing record is safe (blockpool.c). Sealed blocks need
 * no mark: they are never reused while the log may name them unverified. */
static inline void named(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->state == BLK_OPEN) x->flags |= BLKF_NAMED;
}

static uint8_t *put_tokens(uint8_t *q, const uint32_t *t, uint32_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(q, t, (size_t)n * 4);
    return q + (size_t)n * 4;
#else
    for (uint32_t i = 0; i < n; i++, q += 4) pkv_put_u32(q, t[i]);
    return q;
#endif
}

void pkv_log_seal(pkv_cache *c, uint32_t b) {
    const pkv_block *x = &c->pool.b[b];
    uint32_t bs = c->pool.block_size;
    uint8_t *q = pkv_wal_append_filled(c, REC_SEAL, 48 + 4ull * bs);
    pkv_put_u32(q, b);
    pkv_put_u32(q + 4, x->parent);
    pkv_put_u64(q + 8, x->salt);
    pkv_put_u64(q + 16, x->hash.lo);
    pkv_put_u64(q + 24, x->hash.hi);
    pkv_put_u64(q + 32, x->payload_sum);
    pkv_put_u32(q + 40, bs);
    pkv_put_u32(q + 44, 0);
    put_tokens(q + 48, pkv_pool_tokens(&c->pool, b), bs);
}

void pkv_log_evict(pkv_cache *c, uint32_t b) {
    uint8_t *q = pkv_wal_append_filled(c, REC_EVICT, 8);
    pkv_put_u32(q, b);
    pkv_put_u32(q + 4, 0);
}

/* Runs (docs/format.md, REC_SEAL_RUN / REC_EVICT_RUN): one header, one checksum
 * and one LSN for a commit's seals or an append's evictions, instead of one
 * record each (a SEAL_RUN entry is 96 bytes at 16-token blocks where a SEAL is
 * 136; an eviction 4 bytes where an EVICT is 32). */
void pkv_log_seals(pkv_cache *c, const uint32_t *b, uint32_t n) {
    pkv_assert(n >= 1 && n <= PKV_LOG_RUN_MAX);
    if (n == 1 || pkv_log_run_max < 2) {
        for (uint32_t i = 0; i < n; i++) pkv_log_seal(c, b[i]);
        return;
    }
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    const size_t ent = SEAL_RUN_ENTRY(bs);
    uint8_t *q = pkv_wal_append_filled(c, REC_SEAL_RUN, 16 + n * ent);
    const uint64_t salt = p->b[b[0]].salt;
    pkv_put_u32(q, n);
    pkv_put_u32(q + 4, bs);
    pkv_put_u64(q + 8, salt);
    q += 16;
    for (uint32_t i = 0; i < n; i++, q += ent) {
        const pkv_block *x = &p->b[b[i]];
        pkv_assert(x->state == BLK_SEALED && x->salt == salt);
        pkv_put_u32(q, b[i]);
        pkv_put_u32(q + 4, x->parent);
        pkv_put_u64(q + 8, x->hash.lo);
        pkv_put_u64(q + 16, x->hash.hi);
        pkv_put_u64(q + 24, x->payload_sum);
        uint8_t *e = put_tokens(q + 32, pkv_pool_tokens(p, b[i]), bs);
        if (e < q + ent) pkv_put_u32(e, 0); /* an odd block size: 4 bytes of padding */
    }
}

void pkv_log_evicts(pkv_cache *c, const uint32_t *b, uint32_t n) {
    pkv_assert(n >= 1 && n <= PKV_LOG_RUN_MAX);
    if (n == 1 || pkv_log_run_max < 2) {
        for (uint32_t i = 0; i < n; i++) pkv_log_evict(c, b[i]);
        return;
    }
    uint8_t *q = pkv_wal_append_filled(c, REC_EVICT_RUN, 8 + 4ull * n);
    pkv_put_u32(q, n);
    pkv_put_u32(q + 4, 0);
    put_tokens(q + 8, b, n); /* block indices: u32 little-endian, as token ids */
}

/* The committed part of a sequence's table, and its partial tail. */
void pkv_log_seq_set(pkv_cache *c, pkv_seq *s) {
    pkv_assert(!s->mc_stale);
    s->mc_gen = 0; /* a new table: no COMMIT to continue */
    uint32_t bs = c->pool.block_size;
    uint32_t nb = (uint32_t)((s->committed + bs - 1) / bs);
    uint32_t ntail = (uint32_t)(s->committed % bs);
    uint8_t *q = pkv_wal_append(c, REC_SEQ_SET, 32 + 4ull * nb + 4ull * ntail);
    pkv_put_u64(q, s->id);
    pkv_put_u64(q + 8, s->salt);
    pkv_put_u64(q + 16, s->committed);
    pkv_put_u32(q + 24, nb);
    pkv_put_u32(q + 28, ntail);
    q += 32;
    for (uint32_t i = 0; i < nb; i++, q += 4) pkv_put_u32(q, s->blocks[i]);
    if (nb) named(c, s->blocks[nb - 1]); /* only the last can be open */
    if (ntail) put_tokens(q, pkv_pool_tokens(&c->pool, s->blocks[nb - 1]), ntail);
}

/* COMMIT: entries [old/B, ceil(new/B)) and the tokens committed into the partial
 * tail.
 *
 * Coalescing. A COMMIT holds absolute values: the committed length, the table
 * entries from old/B on, the tail tokens from old on. Two commits of a sequence,
 * old -> c1 and then c1 -> c2, therefore replay exactly like the single commit
 * old -> c2 written with the table and tokens as they are after the second,
 * provided no other record about the sequence came between them (a SEAL of its
 * block, a copy-on-write, a truncation: each is logged, and ends the run) and the
 * table entries below c1/B did not change without a record (they cannot). Records
 * about other sequences and blocks in between do not matter: none of them depends
 * on this sequence's committed length, and while the COMMIT still sits in the
 * unflushed buffer it is in the same frame as they are, and a frame is recovered
 * whole or not at all, so no state the log can recover to is lost or invented.
 *
 * So each sequence remembers its latest COMMIT while that record is in the
 * current buffer (pkv_seq.mc_*, valid while mc_gen == wal.gen; the generation
 * changes when the flusher takes the buffer and when a checkpoint fixes an LSN),
 * and a later commit that continues it within the same tail block grows it in
 * place, keeping its LSN. A decode loop then logs one COMMIT per block (plus its
 * SEAL) instead of one per token, and so does a batched decoder interleaving many
 * sequences. To grow while other records follow it, a COMMIT that ends inside a
 * block owns a slot: room for the ids of the rest of that block. When another
 * record is appended behind it, the unused part of the slot is left as slack (a
 * u32 0, then the slack's u32 size) that later growth eats into; the flusher
 * squeezes slack out before it checksums and writes the frame (log.c), so the
 * bytes on disk are exactly the records. */

/* s's latest COMMIT, if it is still in the buffer and ends at committed length
 * `old` (so a commit from old continues it); else NULL. */
static uint8_t *live_commit(const pkv_wal *w, const pkv_seq *s, uint64_t old) {
    if (s->mc_gen != w->gen) return NULL;
    uint8_t *r = w->buf + s->mc_off;
    return pkv_get_u64(r + REC_HDR + 8) == old ? r : NULL;
}

/* live_commit, and its last table entry is s's block at `old` (old inside a block):
 * a commit from old within that block may grow it. */
static uint8_t *tail_commit(const pkv_cache *c, const pkv_seq *s, uint64_t old) {
    uint8_t *r = live_commit(&c->wal, s, old);
    if (!r) return NULL;
    const uint8_t *q = r + REC_HDR;
    uint32_t nb = pkv_get_u32(q + 20);
    pkv_assert(nb > 0 && pkv_get_u64(q) == s->id);
    return pkv_get_u32(q + 32 + 4 * (nb - 1)) == s->blocks[pkv_bdiv(&c->pool, old)] ? r : NULL;
}

bool pkv_log_commit_grow(pkv_cache *c, pkv_seq *s, uint64_t old, uint64_t newc) {
    pkv_wal *w = &c->wal;
    const pkv_pool *p = &c->pool;
    uint64_t bi = pkv_bdiv(p, old);
    if (pkv_bmod(p, old) == 0 || pkv_bdiv(p, newc) != bi) return false;
    uint8_t *r = tail_commit(c, s, old);
    if (!r) return false;
    uint8_t *q = r + REC_HDR;
    uint32_t nb = pkv_get_u32(q + 20), ntail = pkv_get_u32(q + 28);
    uint32_t k = (uint32_t)(newc - old), off = pkv_bmod(p, old);
    size_t payload = 32 + 4ull * nb + 4ull * (ntail + k);
    size_t total = pkv_rec_size(payload), end = REC_HDR + payload;
    size_t cur = pkv_get_u32(r);
    bool last = s->mc_off + cur == w->len;
    if (s->mc_off + total > s->mc_end) return false; /* beyond its slot */
    pkv_assert(w->cap - s->mc_off >= total);
    const uint32_t *t = pkv_pool_tokens(p, s->blocks[bi]) + off;
    uint8_t *dst = q + 32 + 4ull * nb + 4ull * ntail;
    if (k == 1) pkv_put_u32(dst, *t); /* decode: one token, no memcpy call */
    else put_tokens(dst, t, k);
    if (total - end > REC_TRAILER) pkv_put_u32(r + end, 0); /* padding (4 bytes or none) */
    pkv_put_u64(r + total - REC_TRAILER, 0);                  /* checksum, set at flush */
    pkv_put_u64(q + 8, newc);
    pkv_put_u32(q + 28, ntail + k);
    pkv_put_u32(r, (uint32_t)total);
    if (last) {
        w->len = s->mc_off + total;
    } else if (total > cur) { /* eat into the slack behind it */
        size_t left = s->mc_end - (s->mc_off + total);
        if (left) {
            pkv_put_u32(r + total, 0);
            pkv_put_u32(r + total + 4, (uint32_t)left);
        }
        pkv_assert(w->slack >= total - cur);
        w->slack -= total - cur;
    }
    return true;
}

/* Deferred growth. A decode loop commits one token at a time, and growing the
 * record by one id per call costs as much as the rest of the commit. So the fast
 * path only notes that the sequence's live COMMIT lags (pkv_log_commit_defer) and
 * the record is grown by all the ids at once when it is settled: before any other
 * change to the sequence (seq.c settles it before every general path), and for
 * every lagging sequence before the flusher takes the buffer and before a
 * checkpoint fixes an LSN (pkv_log_settle_all, then pkv_wal_no_coalesce). So no
 * record leaves the buffer, and none is read, while it lags; the bytes written are
 * exactly those of growing it at every commit, and the LSNs the same. Room: the
 * slot (mc_end) must lie inside the buffer (mc_end <= cap) when the lag starts,
 * and the buffer only grows until it is taken, which settles first. */
bool pkv_log_commit_defer(pkv_cache *c, pkv_seq *s, uint64_t old) {
    pkv_wal *w = &c->wal;
    pkv_assert(!s->mc_stale); /* a lagging one lags further: seq.c does not call */
    if (s->mc_end > w->cap || !tail_commit(c, s, old)) return false;
    if (w->nstale == w->stale_cap) {
        uint32_t cap = w->stale_cap ? 2 * w->stale_cap : 64;
        pkv_seq **ns = realloc(w->stale, cap * sizeof *ns);
        if (!ns) return false; /* the general path logs it now */
        w->stale = ns;
        w->stale_cap = cap;
    }
    s->mc_stale = true;
    s->mc_stale_ix = w->nstale;
    w->stale[w->nstale++] = s;
    return true;
}

void pkv_log_settle(pkv_cache *c, pkv_seq *s) {
    if (!s->mc_stale) return;
    pkv_wal *w = &c->wal;
    pkv_assert(s->mc_gen == w->gen && s->mc_stale_ix < w->nstale && w->stale[s->mc_stale_ix] == s);
    uint64_t written = pkv_get_u64(w->buf + s->mc_off + REC_HDR + 8);
    bool grown = pkv_log_commit_grow(c, s, written, s->committed);
    pkv_assert(grown && "a lagging COMMIT always fits its slot");
    (void)grown;
    pkv_seq *last = w->stale[--w->nstale];
    w->stale[s->mc_stale_ix] = last;
    last->mc_stale_ix = s->mc_stale_ix;
    s->mc_stale = false;
}

void pkv_log_settle_all(pkv_cache *c) {
    pkv_wal *w = &c->wal;
    while (w->nstale) pkv_log_settle(c, w->stale[w->nstale - 1]);
}

void pkv_log_commit(pkv_cache *c, pkv_seq *s, uint64_t old) {
    pkv_wal *w = &c->wal;
    pkv_assert(!s->mc_stale);
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    if (pkv_log_commit_grow(c, s, old, s->committed)) return;
    /* The last record is this sequence's COMMIT and we continue it, but not within
     * its tail block: rewrite it as one commit from where it started. Only its
     * last table entry and what follows change: the entries before it are full
     * blocks, sealed before it was written, and a block that is neither copied nor
     * truncated (each logged, ending the run) keeps its table entry; the last
     * one may since have been sealed and replaced by an identical cached block
     * (a dedupe logs no record). Rewriting the rest too would cost O(record) per
     * block, O(n^2) in a run of blocks that dedupe, where nothing else is logged
     * and the run only ends when the flusher takes the buffer. */
    const uint8_t *r = live_commit(w, s, old);
    bool merge = r && s->mc_off + pkv_get_u32(r) == w->len;
    uint32_t kept = 0; /* table entries the merge leaves as they are */
    if (merge) {
        old = s->mc_old;
        kept = pkv_get_u32(r + REC_HDR + 20) - 1;
        pkv_assert(pkv_get_u32(r + REC_HDR + 16) == pkv_bdiv(p, old));
    }
    uint64_t first = pkv_bdiv(p, old), n = pkv_bceil(p, s->committed);
    uint32_t tail = pkv_bmod(p, s->committed);
    uint64_t tail_start = s->committed - tail; /* first position of the tail block */
    uint32_t tail_off = tail ? (uint32_t)((old > tail_start ? old : tail_start) - tail_start) : 0;
    uint32_t ntail = tail ? tail - tail_off : 0;
    size_t payload = 32 + 4 * (n - first) + 4ull * ntail;
    uint8_t *q = merge ? pkv_wal_reappend(c, s->mc_off, REC_COMMIT, payload, 32 + 4ull * kept)
                       : pkv_wal_append(c, REC_COMMIT, payload); /* after any slack */
    size_t off = (size_t)(q - REC_HDR - w->buf);
    s->mc_gen = w->gen;
    s->mc_off = off;
    if (!merge) s->mc_old = old;
    /* Its slot: room to grow by the ids of the rest of its tail block. */
    size_t grow = tail ? 4ull * (bs - 1 - tail) : 0;
    s->mc_end = off + pkv_rec_size(payload + grow);
    w->tail_end = s->mc_end;
    pkv_put_u64(q, s->id);
    pkv_put_u64(q + 8, s->committed);
    pkv_put_u32(q + 16, (uint32_t)first);
    pkv_put_u32(q + 20, (uint32_t)(n - first));
    pkv_put_u32(q + 24, tail_off);
    pkv_put_u32(q + 28, ntail);
    q += 32;
    pkv_assert(first + kept < n);
    for (uint64_t i = first; i < first + kept; i++, q += 4)
        pkv_assert(pkv_get_u32(q) == s->blocks[i]);
    for (uint64_t i = first + kept; i < n; i++, q += 4) pkv_put_u32(q, s->blocks[i]);
    named(c, s->blocks[n - 1]); /* only the last can be open */
    if (ntail) put_tokens(q, pkv_pool_tokens(&c->pool, s->blocks[n - 1]) + tail_off, ntail);
}

void pkv_log_seq_block(pkv_cache *c, pkv_seq *s, uint32_t idx, uint32_t ntok) {
    pkv_assert(!s->mc_stale);
    s->mc_gen = 0; /* ends its COMMIT run */
    uint8_t *q = pkv_wal_append(c, REC_SEQ_BLOCK, 24 + 4ull * ntok);
    pkv_put_u64(q, s->id);
    pkv_put_u32(q + 8, idx);
    pkv_put_u32(q + 12, s->blocks[idx]);
    named(c, s->blocks[idx]);
    pkv_put_u32(q + 16, ntok);
    put_tokens(q + 24, pkv_pool_tokens(&c->pool, s->blocks[idx]), ntok);
}

void pkv_log_trunc(pkv_cache *c, pkv_seq *s, uint32_t tail_block) {
    pkv_assert(!s->mc_stale);
    s->mc_gen = 0; /* ends its COMMIT run */
    uint32_t bs = c->pool.block_size;
    uint32_t ntok = tail_block == PKV_NONE ? 0 : (uint32_t)(s->committed % bs);
    uint8_t *q = pkv_wal_append(c, REC_TRUNC, 24 + 4ull * ntok);
    pkv_put_u64(q, s->id);
    pkv_put_u64(q + 8, s->committed);
    pkv_put_u32(q + 16, tail_block);
    if (tail_block != PKV_NONE) named(c, tail_block);
    pkv_put_u32(q + 20, ntok);
    if (ntok) put_tokens(q + 24, pkv_pool_tokens(&c->pool, tail_block), ntok);
}

void pkv_log_close(pkv_cache *c, uint64_t id) {
    uint8_t *q = pkv_wal_append(c, REC_SEQ_CLOSE, 8);
    pkv_put_u64(q, id);
}

void pkv_log_bad(pkv_cache *c, uint32_t b) {
    uint8_t *q = pkv_wal_append(c, REC_BAD, 8);
    pkv_put_u32(q, b);
}

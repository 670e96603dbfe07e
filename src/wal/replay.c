/*
 * wal/replay.c — recovery on open: newest checkpoint, then the log after it,
 * then a rebuild of everything derived (refcounts, states, lists, prefix index,
 * child counts), then verification of the blocks that recovered sequences hold.
 *
 * The log and the checkpoint chain are read by wal/reader.c, which holds every
 * reading rule (docs/format.md, "Reading the log"); this file applies the records
 * it hands over and acts on where and why it says the log ends: a torn tail is
 * cut, a gap or damage followed by valid frames fails the open naming the LSN,
 * unless PKV_OPEN_POINT_IN_TIME asks to recover up to it.
 *
 * Replay works on the raw state: block states SEALED/FREE from SEAL/EVICT records
 * (and their runs, SEAL_RUN/EVICT_RUN, applied entry by entry as those)
 * and sequence tables (committed part only) from the others. Everything else is
 * derived afterwards by rebuild(), which also checks that the result is
 * consistent (a chain of sealed blocks under every committed full block, etc.).
 */
#include "internal.h"

#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- Applying records --------------------------------------------------- */

static int table_len(pkv_seq *s, uint64_t n) {
    if (n > s->cap) {
        uint64_t cap = s->cap ? s->cap : 4;
        while (cap < n) cap *= 2;
        if (cap > UINT32_MAX) return pkv_err(PKV_ECORRUPT, "block table too long");
        uint32_t *nb = realloc(s->blocks, cap * sizeof *nb);
        if (!nb) return pkv_err(PKV_ENOMEM, "block table");
        s->blocks = nb;
        s->cap = (uint32_t)cap;
    }
    return 0;
}

static void dropped(pkv_cache *c, uint32_t b, uint64_t lsn) {
    if (b < c->pool.capacity) c->pool.b[b].rel_lsn = lsn;
}

static int bad_rec(const pkv_rec *r, const char *why) {
    return pkv_err(PKV_ECORRUPT, "%s record at LSN %llu: %s", pkv_rec_type_name(r->type),
                   (unsigned long long)r->lsn, why);
}

static int set_tokens(pkv_cache *c, uint32_t b, uint32_t off, const uint8_t *t, uint32_t n) {
    uint32_t *dst = pkv_pool_tokens(&c->pool, b);
    for (uint32_t i = 0; i < n; i++) dst[off + i] = pkv_get_u32(t + 4ull * i);
    return 0;
}

static int check_blocks(pkv_cache *c, const pkv_rec *r) {
    for (uint32_t i = 0; i < r->nblocks; i++)
        if (pkv_get_u32(r->blocks + 4ull * i) >= c->pool.capacity)
            return bad_rec(r, "block index out of range");
    return 0;
}

int pkv_replay_apply(pkv_cache *c, const pkv_rec *r) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    pkv_seq *s = NULL;
    int rc;
    if (r->type != REC_SEAL && r->type != REC_EVICT && r->type != REC_BAD &&
        r->type != REC_SEAL_RUN && r->type != REC_EVICT_RUN)
        s = pkv_seqmap_get(&c->seqs, r->seq);
    /* A committed length whose ceil(committed / B) overflows would index a block
     * table at -1 (a damaged or forged record that still passed its checksum). */
    if ((r->type == REC_SEQ_SET || r->type == REC_COMMIT || r->type == REC_TRUNC) &&
        r->committed > (uint64_t)UINT32_MAX * bs)
        return bad_rec(r, "committed length out of range");
    switch (r->type) {
    case REC_SEAL: {
        if (r->block >= p->capacity || (r->parent != PKV_NONE && r->parent >= p->capacity) ||
            r->parent == r->block)
            return bad_rec(r, "block or parent out of range");
        pkv_block *x = &p->b[r->block];
        x->state = BLK_SEALED;
        x->parent = r->parent;
        x->salt = r->salt;
        x->hash.lo = r->hash_lo;
        x->hash.hi = r->hash_hi;
        x->payload_sum = r->payload_sum;
        x->rel_lsn = r->lsn;
        x->flags = 0;
        return set_tokens(c, r->block, 0, r->tokens, bs);
    }
    case REC_EVICT:
        if (r->block >= p->capacity) return bad_rec(r, "block out of range");
        p->b[r->block].state = BLK_FREE;
        return 0;
    case REC_SEAL_RUN: {
        /* As nblocks SEALs in entry order. Their provisional release LSN is this
         * record's for all: a table then names them, and the record that takes
         * them out of it stamps them all alike (dropped); among themselves the
         * LRU rebuild orders equal LSNs children first, as leaf-first needs. */
        const size_t ent = SEAL_RUN_ENTRY(bs);
        for (uint32_t i = 0; i < r->nblocks; i++) {
            const uint8_t *e = r->blocks + i * ent;
            uint32_t b = pkv_get_u32(e), par = pkv_get_u32(e + 4);
            if (b >= p->capacity || (par != PKV_NONE && par >= p->capacity) || par == b)
                return bad_rec(r, "block or parent out of range");
        }
        for (uint32_t i = 0; i < r->nblocks; i++) {
            const uint8_t *e = r->blocks + i * ent;
            uint32_t b = pkv_get_u32(e);
            pkv_block *x = &p->b[b];
            x->state = BLK_SEALED;
            x->parent = pkv_get_u32(e + 4);
            x->salt = r->salt;
            x->hash.lo = pkv_get_u64(e + 8);
            x->hash.hi = pkv_get_u64(e + 16);
            x->payload_sum = pkv_get_u64(e + 24);
            x->rel_lsn = r->lsn;
            x->flags = 0;
            set_tokens(c, b, 0, e + 32, bs);
        }
        return 0;
    }
    case REC_EVICT_RUN:
        if ((rc = check_blocks(c, r))) return rc;
        for (uint32_t i = 0; i < r->nblocks; i++)
            p->b[pkv_get_u32(r->blocks + 4ull * i)].state = BLK_FREE;
        return 0;
    case REC_BAD:
        if (r->block >= p->capacity) return bad_rec(r, "block out of range");
        if (p->b[r->block].state == BLK_SEALED) p->b[r->block].flags |= BLKF_BAD;
        return 0;
    case REC_SEQ_SET: {
        if (r->nblocks != (r->committed + bs - 1) / bs || r->ntok != r->committed % bs)
            return bad_rec(r, "table length does not match committed tokens");
        if ((rc = check_blocks(c, r))) return rc;
        if (!s) {
            if ((rc = pkv_seqmap_reserve(&c->seqs))) return rc;
            if (!(s = calloc(1, sizeof *s))) return pkv_err(PKV_ENOMEM, "sequence");
            s->id = r->seq;
            pkv_seqmap_insert(&c->seqs, s);
        }
        for (uint32_t i = 0; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        if ((rc = table_len(s, r->nblocks))) return rc;
        for (uint32_t i = 0; i < r->nblocks; i++) s->blocks[i] = pkv_get_u32(r->blocks + 4ull * i);
        s->nblocks = r->nblocks;
        s->salt = r->salt;
        s->len = s->committed = r->committed;
        if (r->ntok) set_tokens(c, s->blocks[s->nblocks - 1], 0, r->tokens, r->ntok);
        return 0;
    }
    case REC_COMMIT: {
        if (!s) return bad_rec(r, "unknown sequence");
        uint64_t n = (r->committed + bs - 1) / bs;
        uint32_t tail = (uint32_t)(r->committed % bs);
        if (r->first > s->nblocks || (uint64_t)r->first + r->nblocks != n ||
            (tail ? r->tail_off + r->ntok != tail : r->ntok != 0) || r->tail_off > bs)
            return bad_rec(r, "inconsistent table range");
        if ((rc = check_blocks(c, r))) return rc;
        if ((rc = table_len(s, n))) return rc;
        for (uint32_t k = 0; k < r->nblocks; k++) {
            uint32_t i = r->first + k, b = pkv_get_u32(r->blocks + 4ull * k);
            if (i < s->nblocks && s->blocks[i] != b) dropped(c, s->blocks[i], r->lsn);
            s->blocks[i] = b;
        }
        for (uint64_t i = n; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        s->nblocks = (uint32_t)n;
        s->len = s->committed = r->committed;
        if (r->ntok) set_tokens(c, s->blocks[n - 1], r->tail_off, r->tokens, r->ntok);
        return 0;
    }
    case REC_SEQ_BLOCK:
        if (!s) return bad_rec(r, "unknown sequence");
        if (r->index >= s->nblocks || r->block >= p->capacity || r->ntok > bs)
            return bad_rec(r, "index or block out of range");
        if (s->blocks[r->index] != r->block) dropped(c, s->blocks[r->index], r->lsn);
        s->blocks[r->index] = r->block;
        return set_tokens(c, r->block, 0, r->tokens, r->ntok);
    case REC_TRUNC: {
        if (!s) return bad_rec(r, "unknown sequence");
        uint64_t n = (r->committed + bs - 1) / bs;
        if (n > s->nblocks || r->ntok != (r->block == PKV_NONE ? 0 : r->committed % bs) ||
            (r->block != PKV_NONE && (r->block >= p->capacity || n == 0)))
            return bad_rec(r, "inconsistent truncation");
        for (uint64_t i = n; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        s->nblocks = (uint32_t)n;
        s->len = s->committed = r->committed;
        if (r->block != PKV_NONE) {
            if (s->blocks[n - 1] != r->block) dropped(c, s->blocks[n - 1], r->lsn);
            s->blocks[n - 1] = r->block;
            set_tokens(c, r->block, 0, r->tokens, r->ntok);
        }
        return 0;
    }
    case REC_SEQ_CLOSE:
        if (!s) return 0; /* idempotent */
        for (uint32_t i = 0; i < s->nblocks; i++) dropped(c, s->blocks[i], r->lsn);
        pkv_seqmap_remove(&c->seqs, r->seq);
        free(s->blocks);
        free(s);
        return 0;
    default:
        return bad_rec(r, "unknown type");
    }
}

/* ---- Reading the log ----------------------------------------------------
 * The reading rules are reader.c's; replay applies what it hands over and acts
 * on where and why it says the log ends. */

typedef struct applying {
    pkv_cache *c;
    uint64_t *applied;
} applying;

static int apply_rec(void *ctx, const pkv_rd_rec *r) {
    applying *a = ctx;
    if (!r->decoded) return 0; /* at or before the checkpoint's LSN */
    int rc = pkv_replay_apply(a->c, &r->r);
    if (!rc) (*a->applied)++;
    return rc;
}

static int replay_header(void *ctx, const pkv_rd_seg *s) {
    pkv_cache *c = ctx;
    if (s->hdr == PKV_SEGH_FOREIGN) c->arena.foreign_log = true;
    return s->valid ? pkv_wal_seg_push(&c->wal, s->no, s->start) : 0;
}

static int replay_frame(void *ctx, pkv_rd_seg *s, uint64_t off, uint64_t first, uint32_t nrec,
                        uint32_t bytes, bool covered, uint64_t after) {
    pkv_cache *c = ctx;
    if (covered) return 0;
    applying a = {c, &c->rec.records_replayed};
    int bad;
    uint64_t bad_lsn;
    int rc = pkv_rd_records(s, off, first, nrec, bytes, after, c->pool.block_size, false,
                            apply_rec, &a, &bad, &bad_lsn);
    if (!rc) c->wal.bytes_since_ckpt += FRAME_HDR + bytes;
    return rc;
}

/* Where a read segment's frames end: writing resumes there only if nothing at
 * all follows (no torn tail anywhere, no corruption, only zeros). */
static void replay_seg_end(void *ctx, const pkv_rd_seg *s, const pkv_rd_end *e) {
    pkv_cache *c = ctx;
    if (e->reason == PKV_END_NONE || e->reason == PKV_END_GAP) return;
    c->rec.torn_bytes += e->torn_bytes;
    bool clean = !c->rec.torn_bytes && e->reason != PKV_END_CORRUPT && e->zero;
    c->wal.tail_ok = clean && s->len == s->size;
    c->wal.tail_no = s->no;
    c->wal.tail_off = e->off;
    c->wal.tail_size = s->size;
    c->wal.tail_epoch = s->epoch;
}

/* Where the reader says the log ends: a gap or corruption fails the open naming
 * the LSN, unless PKV_OPEN_POINT_IN_TIME asks to recover up to it. */
static int replay_end(pkv_cache *c, const pkv_rd_end *e, uint32_t flags) {
    const bool pit = flags & PKV_OPEN_POINT_IN_TIME;
    const unsigned long long x = e->expect;
    if (e->reason == PKV_END_GAP) {
        c->rec.corrupt_lsn = e->expect;
        if (pit) return 0;
        return pkv_err(PKV_ECORRUPT, "log records from LSN %llu are missing (segment "
                       "%llu starts at %llu); open with PKV_OPEN_POINT_IN_TIME to "
                       "recover up to LSN %llu", x, (unsigned long long)e->seg,
                       (unsigned long long)e->next_lsn, x - 1);
    }
    if (e->reason != PKV_END_CORRUPT) return 0;
    c->rec.corrupt_lsn = e->expect;
    if (pit) return 0;
    if (!e->too_much)
        return pkv_err(PKV_ECORRUPT, "log corrupted at LSN %llu (segment %llu "
                       "offset %llu) and followed by valid records from LSN %llu; "
                       "open with PKV_OPEN_POINT_IN_TIME to recover up to LSN %llu",
                       x, (unsigned long long)e->seg, (unsigned long long)e->off,
                       (unsigned long long)e->next_lsn, x - 1);
    return pkv_err(PKV_ECORRUPT, "log ends before LSN %llu (segment %llu offset %llu) "
                   "before more overlapping frame candidates than recovery checks "
                   "(a forged or damaged segment); whether valid records follow is "
                   "unknown: open with PKV_OPEN_POINT_IN_TIME to recover up to LSN %llu",
                   x, (unsigned long long)e->seg, (unsigned long long)e->off, x - 1);
}

/* Read the log after `after`; sets *last to the last LSN applied or skipped. */
static int replay_log(pkv_cache *c, const char *dir, const uint64_t *nos, size_t n,
                      uint64_t after, uint32_t flags, uint64_t *last) {
    pkv_rd_log L = {
        .io = c->wal.io,
        .dir = dir,
        .secret = c->arena.secret,
        .block_size = c->pool.block_size,
        .recheck = c->rdonly, /* a read-only open may run beside a live writer */
        .ctx = c,
        .on_header = replay_header,
        .on_frame = replay_frame,
        .on_seg_end = replay_seg_end,
    };
    pkv_rd_end e;
    int rc = pkv_rd_log_read(&L, nos, n, after, &e);
    if (!rc) rc = replay_end(c, &e, flags);
    if (rc) return rc;
    *last = L.last_lsn;
    return 0;
}

/* ---- Rebuilding derived state ------------------------------------------- */

static void drop_block(pkv_cache *c, uint32_t b) {
    pkv_block *x = &c->pool.b[b];
    if (x->state == BLK_SEALED) c->rec.blocks_dropped++;
    x->state = BLK_FREE;
}

/* Truncate a sequence's table before entry i (its K/V must be recomputed);
 * `why` says what was wrong with the block there. The first cut is kept for the
 * recovery note, which otherwise would not say which sequence lost what. */
static void seq_cut(pkv_cache *c, pkv_seq *s, uint32_t i, const char *why) {
    if (c->rec.sequences_cut++ == 0) {
        c->first_cut.seq = s->id;
        c->first_cut.index = i;
        c->first_cut.block = s->blocks[i];
        c->first_cut.why = why;
    }
    s->nblocks = i;
    s->len = s->committed = (uint64_t)i * c->pool.block_size;
}

/* Drop every sealed block whose chain is broken (parent not sealed, another
 * salt, a cycle); d and stack are scratch for pkv_pool_depths(). */
static void drop_broken_chains(pkv_cache *c, uint32_t *d, uint32_t *stack) {
    pkv_pool *p = &c->pool;
    pkv_pool_depths(p, d, stack);
    for (uint32_t b = 0; b < p->capacity; b++)
        if (p->b[b].state == BLK_SEALED && d[b] == UINT32_MAX) drop_block(c, b);
}

/* Cut each sequence's table at its first entry that is out of place: a block
 * beyond the arena file, a full block that is not sealed in this chain and
 * salt, a pending one that is sealed, or a block the table already names. For
 * the last test each block holds the ordinal of the table that named it last
 * (stamp: capacity entries of scratch), one look-up per entry: a scan of the
 * table so far made recovery quadratic in a sequence's length. With cut_tails,
 * also at an open tail that holds committed tokens (rule D8). */
static void cut_tables(pkv_cache *c, uint64_t valid_blocks, bool cut_tails, uint32_t *stamp) {
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    pkv_assert(valid_blocks <= p->capacity);
    memset(stamp, 0, (size_t)p->capacity * sizeof *stamp);
    uint32_t q = 0;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        if (++q == 0) { /* 2^32 tables: start the stamps again */
            memset(stamp, 0, (size_t)p->capacity * sizeof *stamp);
            q = 1;
        }
        uint64_t full = s->committed / bs;
        for (uint32_t j = 0; j < s->nblocks; j++) {
            uint32_t b = s->blocks[j];
            const char *why = NULL;
            if (b >= valid_blocks) why = "was lost: it lies beyond the arena file's end";
            else if (stamp[b] == q) why = "is named twice by the table";
            else if (j < full) {
                const pkv_block *x = &p->b[b];
                if (!(x->state == BLK_SEALED && x->salt == s->salt &&
                      x->parent == (j ? s->blocks[j - 1] : PKV_NONE)))
                    why = "was lost: it is not sealed in the sequence's chain";
            } else if (p->b[b].state == BLK_SEALED)
                why = "is sealed, but the table holds it as pending";
            else if (cut_tails && s->committed % bs)
                why = "holds committed tokens of a partial block, which a writer without "
                      "syncs (PKV_DURABLE_NONE) may not have written before the machine "
                      "restarted (rule D8)";
            if (why) {
                seq_cut(c, s, j, why);
                break;
            }
            stamp[b] = q;
        }
    }
}

/* Step 5 of recovery (docs/format.md): decide which sealed blocks and which table
 * entries survive (replay wrote block records and tables as the log said, marking
 * nothing else), then let the pool give every block the state that implies
 * (pkv_pool_rebuild). drop_block() and seq_cut() only mark what does not survive. */
static int rebuild(pkv_cache *c, uint64_t valid_blocks, bool drop_all, bool cut_tails) {
    pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size, cap = p->capacity;
    uint32_t *d = malloc((size_t)cap * sizeof *d), *stack = malloc((size_t)(cap + 1) * sizeof *stack);
    if (!d || !stack) {
        free(d);
        free(stack);
        return pkv_err(PKV_ENOMEM, "recovery scratch");
    }
    pkv_hint_huge(d, (size_t)cap * sizeof *d);
    pkv_hint_huge(stack, (size_t)(cap + 1) * sizeof *stack);
    /* Blocks the arena no longer holds, and everything chained below them. */
    for (uint32_t b = 0; b < cap; b++)
        if (drop_all || b >= valid_blocks) drop_block(c, b);
    drop_broken_chains(c, d, stack);
    /* A sealed block's hash is not recomputed by replay, and nothing stops a log
     * or checkpoint that passed its checksums (a forged file, or one written by
     * a buggy version) from holding a hash that does not match the block's chain,
     * or two identical sealed blocks. Either would leave the cache violating I8 /
     * I9 (pkv_check fails, the prefix index names the wrong content), so both are
     * dropped here like a broken chain, with everything chained below them. */
    {
        bool any = false;
        for (uint32_t b = 0; b < cap; b++) {
            pkv_block *x = &p->b[b];
            if (x->state != BLK_SEALED) continue;
            pkv_h128 ph = x->parent == PKV_NONE ? pkv_hash_root(c->arena.secret, x->salt)
                                                : p->b[x->parent].hash;
            if (!pkv_h128_eq(x->hash, pkv_hash_block(c->arena.secret, ph,
                                                     pkv_pool_tokens(p, b), bs))) {
                d[b] = UINT32_MAX; /* drop after the pass: children compare to it */
                any = true;
            }
        }
        for (uint32_t b = 0; any && b < cap; b++)
            if (p->b[b].state == BLK_SEALED && d[b] == UINT32_MAX) drop_block(c, b);
        if (any) drop_broken_chains(c, d, stack);
        pkv_index dup;
        if (pkv_index_init(&dup, cap)) {
            free(d);
            free(stack);
            return pkv_err(PKV_ENOMEM, "recovery scratch");
        }
        /* At most one copy of each content, and one BAD copy beside it (a block
         * found bad and then recomputed): k identical BAD blocks kept would share
         * one index run, and so would their children (O(k²) to build and check). */
        any = false;
        for (uint32_t b = 0; b < cap; b++) {
            pkv_block *x = &p->b[b];
            if (x->state != BLK_SEALED) continue;
            if (pkv_index_find_twin(&dup, p, b) != PKV_NONE) {
                drop_block(c, b);
                any = true;
            } else {
                pkv_index_insert(&dup, x->hash.lo, b);
            }
        }
        pkv_index_free(&dup);
        if (any) drop_broken_chains(c, d, stack);
    }
    if (!drop_all) {
        cut_tables(c, valid_blocks, cut_tails, d);
    } else {
        c->rec.sequences_dropped = c->seqs.count;
        pkv_seqmap_free(&c->seqs);
        int rc = pkv_seqmap_init(&c->seqs);
        if (rc) {
            free(d);
            free(stack);
            return rc;
        }
    }
    /* Refcounts, states, lists and the index (blockpool.c). */
    int rc = pkv_pool_rebuild(c, d, stack);
    free(d);
    free(stack);
    return rc;
}

/* Verify the payload of every sealed block a recovered sequence holds, and cut
 * the table at the first that fails (rule S1: a fork or any later use of the
 * table then holds only verified blocks, I11). */
static void verify_seqs(pkv_cache *c) {
    pkv_pool *p = &c->pool;
    for (uint64_t i = 0; i <= c->seqs.mask; i++) {
        pkv_seq *s = c->seqs.slots[i];
        if (!s) continue;
        for (uint32_t j = 0; j < s->nblocks; j++) {
            uint32_t b = s->blocks[j];
            if (p->b[b].state != BLK_SEALED || pkv_block_verify(c, b) == PKV_VERIFY_OK)
                continue;
            c->rec.seq_blocks_bad++;
            /* Give back the references beyond the cut; they stay cached or free. */
            for (uint32_t k = s->nblocks; k-- > j;) pkv_block_release(c, s->blocks[k]);
            seq_cut(c, s, j, "failed its payload checksum");
            break;
        }
    }
}

/* The chain load_chain() loaded, for continuing it (chain_continue). */
typedef struct chain_info {
    uint64_t base_raw;  /* raw bytes of the full checkpoint */
    uint64_t chain_raw; /* of the deltas applied on it */
    uint64_t last_sum;  /* body checksum of the newest file */
} chain_info;

/* Recovery's message for a chain file that does not link (pkv_rd_link). */
static int link_err(int link, const char *path, uint64_t lsn, const pkv_ckpt_meta *m,
                    uint64_t prev_lsn) {
    switch (link) {
    case PKV_LINK_NAME:
        return pkv_err(PKV_ECORRUPT, "%s: covers LSN %llu, not the one its name says", path,
                       (unsigned long long)lsn);
    case PKV_LINK_ARENA:
        return pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: the delta "
                       "describes another arena than the checkpoints before it", path);
    case PKV_LINK_KIND:
        return pkv_err(PKV_ECORRUPT, "%s: holds a %s checkpoint", path,
                       m->delta ? "delta" : "full");
    case PKV_LINK_PREV_LSN:
        return pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: it applies on "
                       "the checkpoint of LSN %llu, but the file before it is LSN %llu "
                       "(a file of the chain is missing)", path,
                       (unsigned long long)m->prev_lsn, (unsigned long long)prev_lsn);
    case PKV_LINK_PREV_SUM:
        return pkv_err(PKV_ECORRUPT, "%s: the checkpoint chain is broken: the file of "
                       "LSN %llu before it is not the one it was written on (replaced)",
                       path, (unsigned long long)prev_lsn);
    default:
        return link; /* pkv_ckpt_info's error */
    }
}

/* Load the checkpoint chain: the full checkpoint ckpt-<base>, then every
 * delta-<n> with n > base in order, each of which must name the file before it
 * (LSN and body checksum): the log before the newest may be recycled, so a chain
 * with a file missing or replaced cannot be recovered and is an error. Deltas
 * with n <= base belong to an older chain (a crash before their deletion) and are
 * ignored. *after / *reach: the newest file's LSN and reach. */
static int load_chain(pkv_cache *c, const char *dir, uint64_t base, const uint64_t *deltas,
                      size_t ndeltas, uint64_t *after, uint64_t *reach, bool *drop_all,
                      chain_info *ch) {
    pkv_recovery *rec = &c->rec;
    size_t first = 0;
    while (first < ndeltas && deltas[first] <= base) first++;
    uint64_t prev_lsn = 0, prev_sum = 0;
    for (size_t i = first; i <= ndeltas; i++) {
        bool is_base = i == first;
        uint64_t no = is_base ? base : deltas[i - 1];
        const char *pre = is_base ? "ckpt-" : "delta-";
        char path[4200];
        snprintf(path, sizeof path, "%s/%s%016llx", dir, pre, (unsigned long long)no);
        uint8_t *raw = NULL;
        size_t len = 0;
        uint64_t secret = 0, lsn = 0, end = 0, sum = 0;
        int rc = pkv_ckpt_read(c->wal.io, path, is_base ? CKPT_MAGIC : DELTA_MAGIC, &secret,
                               &lsn, &end, &raw, &len, &sum);
        pkv_ckpt_meta m;
        int link = rc ? PKV_LINK_OK
                      : pkv_rd_link(is_base, no, lsn, secret, c->arena.secret, raw, len,
                                    prev_lsn, prev_sum, &m);
        if (link == PKV_LINK_FOREIGN) {
            free(raw);
            *after = lsn;
            *reach = end;
            *drop_all = true; /* describes another arena: load nothing from it */
            snprintf(rec->note, sizeof rec->note, "arena was replaced or recreated (the "
                     "checkpoint describes another arena); its blocks and sequences "
                     "were dropped");
            return 0;
        }
        if (link) rc = link_err(link, path, lsn, &m, prev_lsn);
        if (!rc) rc = pkv_ckpt_load(c, raw, len, i == ndeltas);
        free(raw);
        if (rc) return rc;
        if (!is_base) rec->checkpoint_deltas++;
        if (is_base) ch->base_raw = len;
        else ch->chain_raw += len;
        ch->last_sum = sum;
        prev_lsn = lsn;
        prev_sum = sum;
        *after = lsn;
        *reach = end;
    }
    rec->checkpoint_lsn = *after;
    return 0;
}

/* What the chain just loaded holds for each block (pkv_ckpt_digest), or NULL when
 * this open will not continue the chain (read-only, full checkpoints only, out of
 * memory: the first checkpoint is then full, as it always was). */
static uint64_t *chain_digests(pkv_cache *c) {
    if (c->rdonly || c->wal.full_only) return NULL;
    const pkv_pool *p = &c->pool;
    uint64_t *dig = malloc((size_t)p->capacity * sizeof *dig);
    if (!dig) return NULL;
    for (uint32_t k = 0; k < p->capacity; k++) dig[k] = pkv_ckpt_digest(p, k);
    return dig;
}

/* Let the first checkpoint of this open be a delta on the chain it loaded (on
 * ckpt-<base>). Every
 * block whose recovered state differs from what the chain holds (changed by the
 * log's replay, or by the rebuild) gets its dirty bit, as if the change had been
 * made at run time; the others are clean, which is what a delta assumes. Only
 * after a recovery that repaired nothing: a repair is written as a full
 * checkpoint at open (cache.c). */
static void chain_continue(pkv_cache *c, uint64_t base, const uint64_t *dig,
                           const chain_info *ch) {
    pkv_pool *p = &c->pool;
    /* Bits recovery set on its way (verification of the recovered sequences'
     * blocks) are redone by the comparison, which covers all an entry restores. */
    memset(p->ckdirty, 0, ((size_t)p->capacity + 63) / 64 * sizeof *p->ckdirty);
    for (uint32_t k = 0; k < p->capacity; k++)
        if (pkv_ckpt_digest(p, k) != dig[k]) pkv_ckpt_touch(p, k);
    if (PKV_INTERNAL_CHECKS && p->ckshadow) /* the shadow is the chain's state */
        memcpy(p->ckshadow, dig, (size_t)p->capacity * sizeof *dig);
    pkv_wal *w = &c->wal;
    w->chain_ok = true;
    w->prev_lsn = c->rec.checkpoint_lsn;
    w->prev_sum = ch->last_sum;
    w->chain_len = (uint32_t)c->rec.checkpoint_deltas;
    w->chain_raw = ch->chain_raw;
    w->base_raw = ch->base_raw;
    /* A full checkpoint deletes the leftovers of an interrupted clean-up (older
     * ckpt- files, stale deltas); the chain continues instead, so delete them now. */
    pkv_ckpt_remove_stale(w, base);
}

int pkv_recover(pkv_cache *c, const char *dir, uint32_t flags, uint64_t *next_lsn,
                uint64_t *next_seg) {
    pkv_recovery *rec = &c->rec;
    pkv_rd_dir d;
    double t0 = now_ms();
    int rc = pkv_rd_list(dir, &d);
    if (rc) {
        pkv_rd_dir_free(&d); /* the names listed before the failure */
        return rc;
    }
    const uint64_t *nos = d.segs, *deltas = d.deltas, ckpt = d.ckpt;
    const size_t n = d.nsegs, ndeltas = d.ndeltas;
    const bool have_ckpt = d.have_ckpt;
    c->wal.nspare = pkv_wal_spare_run(pkv_rd_spare_mask(&d));
    c->wal.stray_spares = pkv_wal_spare_strays(pkv_rd_spare_mask(&d)) != 0;
    uint64_t after = 0, reach = 0;
    bool drop_all = false;
    chain_info chain = {0};
    uint64_t *chain_dig = NULL;
    if (have_ckpt) {
        rc = load_chain(c, dir, ckpt, deltas, ndeltas, &after, &reach, &drop_all, &chain);
        if (rc) goto out;
        if (!drop_all) chain_dig = chain_digests(c);
    } else if (ndeltas) {
        rc = pkv_err(PKV_ECORRUPT, "%s: delta checkpoint delta-%016llx but no full "
                     "checkpoint to apply it on", dir, (unsigned long long)deltas[0]);
        goto out;
    }
    double t1 = now_ms();
    rec->ms_checkpoint = t1 - t0;
    uint64_t last = after;
    if ((rc = replay_log(c, dir, nos, n, after, flags, &last))) goto out;
    /* The checkpoint's block section may already show records up to `reach`
     * (they were durable before it was written): a point-in-time stop before
     * them cannot give the state as of that point. */
    if (rec->corrupt_lsn && rec->corrupt_lsn <= reach && !drop_all) {
        rc = pkv_err(PKV_ECORRUPT, "log corrupted at LSN %llu, but checkpoint %llu already "
                     "reflects records up to LSN %llu: cannot recover to a point before "
                     "them", (unsigned long long)rec->corrupt_lsn,
                     (unsigned long long)after, (unsigned long long)reach);
        goto out;
    }
    rec->last_lsn = last;
    double t2 = now_ms();
    rec->ms_replay = t2 - t1;
    if (c->arena.foreign_log && !drop_all) {
        drop_all = true;
        snprintf(rec->note, sizeof rec->note, "arena was replaced or recreated (the log "
                 "describes another arena); its blocks and sequences were dropped");
    }
    if (drop_all && !c->rdonly) {
        /* The old log and checkpoints describe another arena: remove them so they
         * are never read again (the repair checkpoint becomes the new base). */
        char path[4200];
        /* Deltas first, made durable before the full checkpoint goes: deltas
         * without a full checkpoint would fail every later open. */
        for (size_t i = 0; i < ndeltas; i++) {
            snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)deltas[i]);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        if (ndeltas) c->wal.io->sync_dir(c->wal.io->ctx, dir);
        for (size_t i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/wal-%016llx", dir, (unsigned long long)nos[i]);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        if (have_ckpt) {
            snprintf(path, sizeof path, "%s/ckpt-%016llx", dir, (unsigned long long)ckpt);
            c->wal.io->unlink(c->wal.io->ctx, path);
        }
        c->wal.nsegs = 0;
        c->wal.tail_ok = false;
        c->wal.io->sync_dir(c->wal.io->ctx, dir);
    }
    /* Rule D8: after a writer without syncs and a restart of the machine, open
     * tails may name K/V that never reached the disk. */
    int restarted = pkv_unsynced_restarted(c->wal.io, dir);
    if (restarted < 0) {
        rc = restarted;
        goto out;
    }
    rc = rebuild(c, c->arena.valid_blocks, drop_all, restarted == 1);
    if (rc) goto out;
    /* The adaptive threshold: what a full snapshot of the recovered state takes
     * (as after a checkpoint at run time), not the chain's bytes. */
    if (have_ckpt && !drop_all) c->wal.ckpt_raw = pkv_ckpt_full_estimate(c);
    c->wal.ckpt_lsn = rec->checkpoint_lsn;
    if (!drop_all && c->arena.valid_blocks < c->pool.capacity && rec->note[0] == '\0')
        snprintf(rec->note, sizeof rec->note,
                 "arena file was short: blocks from %llu on were dropped",
                 (unsigned long long)c->arena.valid_blocks);
    double t3 = now_ms();
    rec->ms_rebuild = t3 - t2;
    verify_seqs(c);
    rec->ms_verify = now_ms() - t3;
    rec->blocks_sealed = c->pool.n_sealed;
    rec->sequences = c->seqs.count;
    /* After a replaced or short arena (whose note explains the cuts), before a
     * torn tail or a point-in-time stop: a cut sequence is lost K/V that its
     * owner will miss, which neither of those notes would mention. */
    if (rec->sequences_cut && rec->note[0] == '\0') {
        const uint64_t bs = c->pool.block_size;
        snprintf(rec->note, sizeof rec->note,
                 "cut %llu sequence%s: sequence %llu at entry %u of its block table (block "
                 "%u %s), so its tokens from %llu on must be recomputed",
                 (unsigned long long)rec->sequences_cut, rec->sequences_cut == 1 ? "" : "s",
                 (unsigned long long)c->first_cut.seq, c->first_cut.index,
                 c->first_cut.block, c->first_cut.why,
                 (unsigned long long)c->first_cut.index * bs);
    }
    if (rec->torn_bytes && rec->note[0] == '\0')
        snprintf(rec->note, sizeof rec->note, "cut a torn log tail of %llu bytes after LSN %llu",
                 (unsigned long long)rec->torn_bytes, (unsigned long long)last);
    if (rec->corrupt_lsn && !rec->note[0])
        snprintf(rec->note, sizeof rec->note, "point-in-time recovery stopped before "
                 "corrupted LSN %llu", (unsigned long long)rec->corrupt_lsn);
    /* Anything repaired (dropped, cut, torn, corrupt) becomes durable at once
     * through a checkpoint at open, so the damage is never read again. */
    rec->repaired = drop_all || rec->torn_bytes || rec->corrupt_lsn ||
                    rec->blocks_dropped || rec->sequences_cut ||
                    c->arena.valid_blocks < c->pool.capacity;
    if (chain_dig && !drop_all && !rec->repaired) chain_continue(c, ckpt, chain_dig, &chain);
    *next_lsn = last + 1;
    *next_seg = n ? nos[n - 1] + 1 : 1;
out:
    free(chain_dig);
    pkv_rd_dir_free(&d);
    return rc;
}

/* ---- Entry points for the fuzz harnesses (fuzz/fuzz_record.c) ----------------
 * Thin wrappers that run the frame and record reading above on a segment image in
 * memory, and the rebuild + verification that ends recovery, so a harness can
 * drive them without files. Nothing in the library calls them. */

/* A segment image in memory, read through the reader as if from its file. */
static pkv_rd_seg mem_seg(pkv_rd_buf *rb, const uint8_t *data, size_t len, uint32_t epoch) {
    rb->p = (uint8_t *)data;
    rb->cap = len;
    pkv_rd_seg s = {.epoch = epoch, .valid = true, .fd = -1, .len = len, .rb = rb, .wlen = len};
    return s;
}

bool pkv_replay_frame_ok(const uint8_t *data, size_t len, uint32_t epoch, size_t off,
                         uint64_t *first, uint32_t *nrec, uint32_t *bytes) {
    pkv_rd_buf rb;
    pkv_rd_seg s = mem_seg(&rb, data, len, epoch);
    return pkv_rd_frame_ok(&s, off, first, nrec, bytes);
}

int pkv_replay_frame_apply(pkv_cache *c, const uint8_t *data, size_t len, uint32_t epoch,
                           size_t off, uint64_t first, uint32_t nrec, uint32_t bytes,
                           uint64_t after, uint64_t *applied) {
    pkv_rd_buf rb;
    pkv_rd_seg s = mem_seg(&rb, data, len, epoch);
    applying a = {c, applied};
    int bad;
    uint64_t bad_lsn;
    return pkv_rd_records(&s, off, first, nrec, bytes, after, c->pool.block_size, false,
                          apply_rec, &a, &bad, &bad_lsn);
}

pkv_scan_res pkv_replay_scan(const uint8_t *data, size_t len, uint32_t epoch, size_t from,
                             uint64_t lsn, bool holding, uint64_t *first, size_t *at) {
    pkv_rd_buf rb;
    pkv_rd_seg s = mem_seg(&rb, data, len, epoch);
    uint64_t o = 0;
    pkv_scan_res r = pkv_rd_scan(&s, from, lsn, holding, first, &o);
    if (r == PKV_SCAN_FOUND) *at = (size_t)o;
    return r;
}

int pkv_replay_rebuild(pkv_cache *c) {
    int rc = rebuild(c, c->arena.valid_blocks, false, false);
    if (!rc) verify_seqs(c);
    return rc;
}

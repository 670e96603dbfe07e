/*
 * inspect.c — the read-only inspection API (include/pagedkv_inspect.h): block
 * metadata, token ids, recomputed checksums and chain hashes, chain depths, the
 * prefix a prompt would hit, arena facts, geometry from options.
 *
 * Owns nothing: every call reads the block pool, the prefix index or the arena
 * under the cache lock (arena facts and geometry are fixed at open and need
 * none) and copies what it read into the caller's structures, translating the
 * internal block states and flags into the public enum and bits. Nothing here
 * writes to the cache: a mismatch found by pkv_inspect_check_block is reported,
 * never flagged (that is recovery's and the serving paths' job, rule S1).
 */
#include "internal.h"
#include "pagedkv_inspect.h"

#include <stdlib.h>

/* Every public state and flag has the internal value it names. */
_Static_assert((int)PKV_BLOCK_FREE == (int)BLK_FREE && (int)PKV_BLOCK_OPEN == (int)BLK_OPEN &&
                   (int)PKV_BLOCK_SEALED == (int)BLK_SEALED, "block states");
_Static_assert(PKV_NO_BLOCK == PKV_NONE, "no block");

/* Lock the cache if block b exists; PKV_EINVAL (unlocked) otherwise. */
static int lock_block(pkv_cache *c, uint32_t b) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    PKV_LOCAL_ONLY(c, "the inspection API");
    if (b >= c->pool.capacity)
        return pkv_err(PKV_EINVAL, "block %u is out of range (capacity %u)", b, c->pool.capacity);
    pkv_lock(c);
    return 0;
}

static uint32_t public_flags(uint8_t f) {
    return ((f & BLKF_UNVERIFIED) ? PKV_BLOCK_UNVERIFIED : 0u) | ((f & BLKF_BAD) ? PKV_BLOCK_BAD : 0u);
}

int pkv_inspect_block(pkv_cache *c, uint32_t b, pkv_block_info *out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    int rc = lock_block(c, b);
    if (rc) return rc;
    const pkv_block *x = &c->pool.b[b];
    memset(out, 0, sizeof *out);
    out->state = (pkv_block_state)x->state;
    out->ref = x->ref;
    out->parent = PKV_NO_BLOCK;
    if (x->state == BLK_SEALED) {
        out->flags = public_flags(x->flags);
        out->parent = x->parent;
        out->children = x->nchild;
        out->salt = x->salt;
        out->hash_hi = x->hash.hi;
        out->hash_lo = x->hash.lo;
        out->payload_sum = x->payload_sum;
        if (x->ref == 0) out->release_lsn = x->rel_lsn; /* cached */
    }
    pkv_unlock(c);
    return 0;
}

int pkv_inspect_block_tokens(pkv_cache *c, uint32_t b, uint32_t *out, size_t cap, size_t *n) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    int rc = lock_block(c, b);
    if (rc) return rc;
    const uint32_t bs = c->pool.block_size;
    if (n) *n = bs;
    if (cap < bs) rc = pkv_err(PKV_ERANGE, "%u token ids, buffer %zu", bs, cap);
    else memcpy(out, pkv_pool_tokens(&c->pool, b), (size_t)bs * sizeof *out);
    pkv_unlock(c);
    return rc;
}

/* The hash block b's parent hands down: the root's for a first block. false if
 * the parent is not a sealed block of b's salt (the chain is broken). */
static bool parent_hash(const pkv_cache *c, const pkv_block *x, pkv_h128 *ph) {
    const pkv_pool *p = &c->pool;
    if (x->parent == PKV_NONE) {
        *ph = pkv_hash_root(c->arena.secret, x->salt);
        return true;
    }
    if (x->parent >= p->capacity || p->b[x->parent].state != BLK_SEALED ||
        p->b[x->parent].salt != x->salt)
        return false;
    *ph = p->b[x->parent].hash;
    return true;
}

int pkv_inspect_check_block(pkv_cache *c, uint32_t b, pkv_block_check *out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    int rc = lock_block(c, b);
    if (rc) return rc;
    const pkv_block *x = &c->pool.b[b];
    memset(out, 0, sizeof *out);
    if (x->state != BLK_SEALED) {
        pkv_unlock(c);
        return pkv_err(PKV_ESTATE, "block %u is not sealed", b);
    }
    pkv_h128 ph;
    out->chain_ok = parent_hash(c, x, &ph);
    if (out->chain_ok) {
        pkv_h128 h = pkv_hash_block(c->arena.secret, ph, pkv_pool_tokens(&c->pool, b),
                                    c->pool.block_size);
        out->hash_ok = pkv_h128_eq(h, x->hash);
        out->hash_hi_actual = h.hi;
        out->hash_lo_actual = h.lo;
    }
    /* a writable open extends a short file; a read-only one maps it as it is */
    out->in_file = b < (c->arena.rdonly ? c->arena.valid_blocks : c->pool.capacity);
    if (out->in_file) {
        out->payload_sum_actual = pkv_arena_sum(&c->arena, b);
        out->payload_ok = out->payload_sum_actual == x->payload_sum;
    }
    pkv_unlock(c);
    return 0;
}

int pkv_inspect_depths(pkv_cache *c, uint32_t *out, size_t cap) {
    if (!c || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    PKV_LOCAL_ONLY(c, "pkv_inspect_depths");
    const uint32_t n = c->pool.capacity;
    if (cap < n) return pkv_err(PKV_ERANGE, "%u blocks, buffer %zu", n, cap);
    uint32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);
    if (!stack) return pkv_err(PKV_ENOMEM, "scratch for %u blocks", n);
    pkv_lock(c);
    pkv_pool_depths(&c->pool, out, stack);
    pkv_unlock(c);
    free(stack);
    /* the pool's depths count from 0 and mark other blocks near UINT32_MAX */
    for (uint32_t b = 0; b < n; b++) out[b] = out[b] >= UINT32_MAX - 1 ? 0 : out[b] + 1;
    return 0;
}

int pkv_inspect_prefix(pkv_cache *c, uint64_t salt, const uint32_t *tokens, size_t n,
                       uint32_t *out, size_t cap, size_t *nblocks) {
    if (!c || !nblocks) return pkv_err(PKV_EINVAL, "cache or nblocks is NULL");
    if (n && !tokens) return pkv_err(PKV_EINVAL, "tokens is NULL with n = %zu", n);
    if (cap && !out) return pkv_err(PKV_EINVAL, "out is NULL with cap = %zu", cap);
    PKV_LOCAL_ONLY(c, "pkv_inspect_prefix");
    pkv_lock(c);
    const uint32_t bs = c->pool.block_size;
    pkv_h128 h = pkv_hash_root(c->arena.secret, salt);
    uint32_t parent = PKV_NONE;
    size_t k = 0;
    for (size_t i = 0; i < n / bs && k < cap; i++) {
        const uint32_t *t = tokens + i * bs;
        h = pkv_hash_block(c->arena.secret, h, t, bs);
        uint32_t b = pkv_index_find(&c->index, &c->pool, h, parent, salt, t);
        if (b == PKV_NONE) break;
        out[k++] = parent = b;
    }
    pkv_unlock(c);
    *nblocks = k;
    return 0;
}

int pkv_inspect_arena(const pkv_cache *c, pkv_arena_info *out) {
    if (!c || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    memset(out, 0, sizeof *out);
    _Static_assert(sizeof out->path == sizeof c->arena.path, "arena path length");
    memcpy(out->path, c->arena.path, sizeof out->path);
    out->linked = c->arena.linked;
    out->valid_blocks = c->arena.valid_blocks;
    return 0;
}

int pkv_inspect_geometry(const pkv_options *opt, pkv_cache_info *out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    pkv_geometry g;
    int rc = pkv_geometry_from_options(opt, &g);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->num_layers = g.num_layers;
    out->num_kv_heads = g.num_kv_heads;
    out->head_dim = g.head_dim;
    out->block_size = g.block_size;
    out->dtype = (pkv_dtype)g.dtype;
    out->elem_size = g.elem_size;
    out->capacity = g.capacity;
    out->block_bytes = g.block_bytes;
    out->slot_bytes = g.slot_bytes;
    out->run_bytes = g.run_bytes;
    if (opt->model_id) snprintf(out->model_id, sizeof out->model_id, "%s", opt->model_id);
    return 0;
}

/*
 * glue.c — block tables, lengths and content tags of a batch of sequences, read
 * from the engine under its lock (see glue.h for the tag definition).
 *
 * This is the only file of src/cuda/ that reads the engine's private structures
 * (internal.h: the sequence map, block states and stored hashes, token ids).
 */
#include "cuda/glue.h"

#include "internal.h"

#include <stdlib.h>

static inline uint64_t tag_of(pkv_h128 h) {
    return h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull) ^ (h.hi >> 29);
}

void pkv_glue_free(pkv_glue_batch *b) {
    if (!b) return;
    free(b->seqs);
    free(b->committed);
    free(b->salt);
    free(b->blocks);
    free(b->tags);
    memset(b, 0, sizeof *b);
}

int pkv_glue_collect(pkv_cache *c, const uint64_t *ids, size_t n, unsigned flags,
                     pkv_glue_batch *out) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    memset(out, 0, sizeof *out);
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    if (n && !ids) return pkv_err(PKV_EINVAL, "ids is NULL");
    if (flags & ~(PKV_GLUE_GPU_APPEND | PKV_GLUE_AS_COMMITTED))
        return pkv_err(PKV_EINVAL, "unknown flags 0x%x", flags);
    out->seqs = calloc(n ? n : 1, sizeof *out->seqs);
    out->committed = calloc(n ? n : 1, sizeof *out->committed);
    out->salt = calloc(n ? n : 1, sizeof *out->salt);
    if (!out->seqs || !out->committed || !out->salt) {
        pkv_glue_free(out);
        return pkv_err(PKV_ENOMEM, "batch of %zu sequences", n);
    }
    out->n = n;
    int rc = 0;
    pkv_lock(c);
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    const uint64_t secret = c->arena.secret;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        pkv_seq *s = pkv_seqmap_get(&c->seqs, ids[i]);
        if (!s) {
            rc = pkv_err(PKV_ENOSEQ, "no sequence %llu", (unsigned long long)ids[i]);
            goto out;
        }
        if (!s->len) {
            rc = pkv_err(PKV_EINVAL, "sequence %llu is empty", (unsigned long long)ids[i]);
            goto out;
        }
        if (s->len > UINT32_MAX) {
            rc = pkv_err(PKV_ERANGE, "sequence %llu: %llu tokens (at most 2^32 - 1 on the GPU)",
                         (unsigned long long)ids[i], (unsigned long long)s->len);
            goto out;
        }
        total += s->nblocks;
    }
    out->blocks = malloc((total ? total : 1) * sizeof *out->blocks);
    out->tags = malloc((total ? total : 1) * sizeof *out->tags);
    if (!out->blocks || !out->tags) {
        rc = pkv_err(PKV_ENOMEM, "tables of %llu blocks", (unsigned long long)total);
        goto out;
    }
    out->total_blocks = total;
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        pkv_seq *s = pkv_seqmap_get(&c->seqs, ids[i]);
        const uint64_t stable =
            (flags & PKV_GLUE_AS_COMMITTED) ? s->len : s->committed;
        const uint64_t need =
            (flags & PKV_GLUE_AS_COMMITTED) ? s->len
            : (flags & PKV_GLUE_GPU_APPEND) ? s->committed : s->len;
        uint32_t *blocks = out->blocks + at;
        uint64_t *tags = out->tags + at;
        memcpy(blocks, s->blocks, (size_t)s->nblocks * sizeof *blocks);
        pkv_h128 parent = pkv_hash_root(secret, s->salt);
        for (uint32_t k = 0; k < s->nblocks; k++) {
            const uint32_t b = s->blocks[k];
            const pkv_block *x = &p->b[b];
            const uint64_t first = (uint64_t)k * bs;
            const uint32_t fin = stable <= first ? 0
                                 : stable - first >= bs ? bs : (uint32_t)(stable - first);
            /* Sealed: the stored hash. Open: the hash of its final tokens under the
             * parent's; for an open block whose tokens are all final this is the
             * hash the engine gives it when it seals it. A block with final tokens
             * follows only blocks whose tokens are all final, so `parent` is then
             * always a full block's hash. */
            const pkv_h128 h = x->state == BLK_SEALED
                                   ? x->hash
                                   : pkv_hash_block(secret, parent, pkv_pool_tokens(p, b), fin);
            tags[k] = tag_of(h);
            parent = h;
        }
        out->seqs[i] = (pkv_res_seq){
            .blocks = blocks,
            .tags = tags,
            .n_blocks = s->nblocks,
            .len = (uint32_t)s->len,
            .need = (uint32_t)need,
            .stable = (uint32_t)stable,
        };
        out->committed[i] = s->committed;
        out->salt[i] = s->salt;
        at += s->nblocks;
    }
out:
    pkv_unlock(c);
    if (rc) pkv_glue_free(out);
    return rc;
}

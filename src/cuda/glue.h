/*
 * glue.h — what the CUDA layer reads from the engine: for a batch of sequence
 * ids, their block tables, lengths and the content tag of every block (plain C,
 * compiled into every build, unit-tested on the CPU by tests/test_residency.c).
 *
 * Content tags. The device pool must notice when an arena block's bytes are no
 * longer those it copied (the block was freed and reused, or a partial block
 * grew). Without an engine hook (see docs/cuda.md, "Engine hooks") the tag is
 * derived from the engine's chained block hashes, which identify a block's
 * content by its salt and token prefix -- the assumption prefix sharing already
 * makes (K/V is a function of the token prefix):
 *   - a sealed block's tag is its stored hash (O(1));
 *   - an open block with k final tokens gets pkv_hash_block(secret, parent hash,
 *     its first k tokens), the parent hash being the stored one or, for an open
 *     full block, the hash the engine will give it when sealed (O(block_size)).
 * A full block therefore has the same tag open and sealed, and a tag covers
 * exactly k tokens (the hash input length differs with k).
 */
#ifndef PKV_CUDA_GLUE_H
#define PKV_CUDA_GLUE_H

#include "cuda/residency.h"
#include "pagedkv.h"

/* pkv_glue_collect flags */
#define PKV_GLUE_GPU_APPEND   0x1u /* pending tokens are produced on the device:
                                      need = committed (they are not copied) */
#define PKV_GLUE_AS_COMMITTED 0x2u /* tags as if every pending token were
                                      committed (after a write-back) */

typedef struct pkv_glue_batch {
    size_t n;
    pkv_res_seq *seqs;    /* [n], pointing into blocks / tags */
    uint64_t *committed;  /* [n] committed tokens at collection */
    uint64_t *salt;       /* [n] */
    uint32_t *blocks;     /* all tables, back to back */
    uint64_t *tags;       /* one per table entry */
    uint64_t total_blocks;
} pkv_glue_batch;

/* Collect ids[0..n) under the cache lock. PKV_ENOSEQ (unknown id), PKV_EINVAL (an
 * empty sequence, NULL arguments), PKV_ERANGE (a sequence longer than 2^32 - 1
 * tokens), PKV_ENOMEM. On error *out is empty. */
int pkv_glue_collect(pkv_cache *c, const uint64_t *ids, size_t n, unsigned flags,
                     pkv_glue_batch *out);
void pkv_glue_free(pkv_glue_batch *b);

#endif /* PKV_CUDA_GLUE_H */

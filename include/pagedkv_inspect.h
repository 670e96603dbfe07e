/*
 * pagedkv_inspect.h — read-only inspection of an open cache, for tools.
 *
 * What a tool (kvdump, a metrics exporter, a server's debug endpoint) may read of
 * a cache beyond pagedkv.h: one block's metadata and token ids, a recomputation
 * of its chain hash and payload checksum, the depth of every block in its chain,
 * the sealed chain that a prompt would hit, the arena file's facts, and the
 * geometry that options describe. Nothing here changes the cache or its files.
 * Sequences are read with pagedkv.h's pkv_seq_list, pkv_seq_get_info,
 * pkv_seq_blocks and pkv_seq_tokens; payload bytes with pkv_kv.
 *
 * Conventions are pagedkv.h's: 0 or a negative PKV_E* code, pkv_last_error()
 * for the detail, "Errors:" and "Blocks:" on every call. Every call on a cache
 * takes the cache's lock itself, so each result is consistent in itself; two
 * calls see one state only on a cache that does not change between them: a
 * handle opened with PKV_OPEN_RDONLY (which kvdump uses), or one whose writers
 * are quiet. Blocks are named by their index, 0 .. capacity-1.
 */
#ifndef PAGEDKV_INSPECT_H
#define PAGEDKV_INSPECT_H

#include "pagedkv.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility push(default)
#endif

/* "No block": the parent of the first block of a chain. */
#define PKV_NO_BLOCK UINT32_MAX

typedef enum pkv_block_state {
    PKV_BLOCK_FREE   = 0, /* holds nothing anyone refers to */
    PKV_BLOCK_OPEN   = 1, /* being filled by the one sequence that holds it */
    PKV_BLOCK_SEALED = 2, /* full, immutable, in the prefix index; cached when ref is 0 */
} pkv_block_state;

/* pkv_block_info.flags (sealed blocks only) */
#define PKV_BLOCK_UNVERIFIED 0x1u /* recovered; its payload is checked against its
                                     checksum when it is first served */
#define PKV_BLOCK_BAD        0x2u /* its payload failed its checksum: never served */

typedef struct pkv_block_info {
    pkv_block_state state;
    uint32_t ref;          /* block-table entries that name it (0: free or cached) */
    uint32_t flags;        /* PKV_BLOCK_* */
    /* Sealed blocks only (0, or PKV_NO_BLOCK for parent, otherwise): */
    uint32_t parent;       /* the previous block of its chain, or PKV_NO_BLOCK */
    uint32_t children;     /* sealed blocks whose parent it is */
    uint64_t salt;         /* the trust domain of its chain */
    uint64_t hash_hi, hash_lo; /* its chained hash (keyed: meaningful only within
                                  this cache) */
    uint64_t payload_sum;  /* XXH3-64 of its payload, recorded when it was sealed */
    uint64_t release_lsn;  /* cached: LSN of the release that left it unreferenced
                              (eviction order after a restart); else 0 */
} pkv_block_info;

/* Block b's metadata.
 * Errors: PKV_EINVAL (cache or out NULL, b >= capacity). Blocks: lock. */
int pkv_inspect_block(pkv_cache *cache, uint32_t b, pkv_block_info *out);

/* The block_size token ids stored in block b's slot into out[0 .. block_size) (a
 * free block's are stale; an open block's are valid up to its sequence's
 * length). *n (may be NULL) receives block_size.
 * Errors: PKV_EINVAL (cache NULL, out NULL, b >= capacity), PKV_ERANGE (cap <
 * block_size; nothing copied). Blocks: lock. */
int pkv_inspect_block_tokens(pkv_cache *cache, uint32_t b, uint32_t *out, size_t cap,
                             size_t *n);

/* What pkv_inspect_check_block recomputes of a sealed block. */
typedef struct pkv_block_check {
    int in_file;          /* its slot is in the arena file: always, except on a
                             read-only handle of a file cut short, which maps only
                             the first pkv_arena_info.valid_blocks slots (recovery
                             drops the sealed blocks past them) */
    int payload_ok;       /* in_file and payload_sum_actual == the sealed sum */
    uint64_t payload_sum_actual; /* XXH3-64 of the slot's payload now (0 if !in_file) */
    int chain_ok;         /* no parent, or the parent is a sealed block of the same
                             salt */
    int hash_ok;          /* chain_ok and the hash recomputed from the parent's hash
                             and the token ids equals the stored one */
    uint64_t hash_hi_actual, hash_lo_actual; /* that recomputed hash (0 if !chain_ok) */
} pkv_block_check;

/* Recompute sealed block b's payload checksum and chain hash (what recovery and
 * the prefix lookup rely on) without changing anything: a mismatch is reported,
 * not acted on (the block is not flagged).
 * Errors: PKV_EINVAL (cache or out NULL, b >= capacity), PKV_ESTATE (b is not
 * sealed). Blocks: lock, held while it reads the block's payload (its pages may
 * fault in from the file). */
int pkv_inspect_check_block(pkv_cache *cache, uint32_t b, pkv_block_check *out);

/* The depth of every block in its chain into out[0 .. capacity): 1 for the first
 * block of a chain, its parent's + 1 for a sealed block below it, 0 for a block
 * that is not sealed or whose chain is broken (a parent that is not a sealed
 * block of its salt, or a cycle). O(capacity).
 * Errors: PKV_EINVAL (cache NULL, out NULL), PKV_ERANGE (cap < capacity; nothing
 * written), PKV_ENOMEM (scratch). Blocks: lock, held for the whole walk. */
int pkv_inspect_depths(pkv_cache *cache, uint32_t *out, size_t cap);

/* The longest chain of sealed, not BAD blocks that the full blocks of
 * tokens[0 .. n) hit under salt (exact, as pkv_seq_open matches: hash, parent,
 * salt and token ids), into out[0 .. *nblocks), in chain order. Every full block
 * counts, where pkv_seq_open attaches at most (n - 1) / block_size of them (it
 * leaves the last token to compute). It
 * changes nothing: no sequence, no refcount, no LRU order, no payload check
 * (pkv_inspect_check_block does that). Stops after cap blocks.
 * Errors: PKV_EINVAL (cache NULL, nblocks NULL, tokens NULL with n > 0, out NULL
 * with cap > 0). Blocks: lock. */
int pkv_inspect_prefix(pkv_cache *cache, uint64_t salt, const uint32_t *tokens, size_t n,
                       uint32_t *out, size_t cap, size_t *nblocks);

/* Facts about the arena file of an open cache. */
typedef struct pkv_arena_info {
    char path[4096];       /* the arena file: dir/arena, or the file it links to */
    int linked;            /* dir/arena is a symbolic link (pkv_options.arena_dir) */
    uint64_t valid_blocks; /* block slots the file held at open: capacity, or fewer
                              for a file cut short (the payload of the others was
                              lost; a writable open extends the file, a read-only
                              one maps only these) */
} pkv_arena_info;

/* Errors: PKV_EINVAL (cache or out NULL). Blocks: never (no lock: fixed at open). */
int pkv_inspect_arena(const pkv_cache *cache, pkv_arena_info *out);

/* The geometry pkv_open derives from opt (capacity, dtype and the sizes; model_id
 * is copied when set, else ""), without opening anything: to check a stored
 * header or a bundle against the library's rules. slot_bytes is the stride a new
 * arena gets (format version 2 where it is below a page); an existing version-1
 * arena of small blocks stores the page stride instead (docs/format.md).
 * Errors: PKV_EINVAL (opt or out NULL; the geometry is invalid, as pkv_open would
 * say: a field zero or out of range, unknown dtype, capacity > 2^31, an
 * overflowing arena size). Blocks: never. */
int pkv_inspect_geometry(const pkv_options *opt, pkv_cache_info *out);

#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* PAGEDKV_INSPECT_H */

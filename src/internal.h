/*
 * internal.h — the engine's private data structures and the functions the layers
 * (arena, block pool, prefix index, eviction, sequences) offer each other.
 *
 * Layering, bottom up:
 *   error.c        thread-local detailed error messages
 *   arena.c        the arena file: header page, preallocation, mapping, lock file
 *   hash.c         chained XXH3-128 block hashes
 *   blockpool.c    per-block metadata (struct-of-records, one cache line each),
 *                  token ids, intrusive free list, refcount transitions
 *   evict.c        the eviction policy: orders the cached blocks, picks victims
 *   prefix_index.c open-addressing multimap hash -> sealed block
 *   seqmap.c       open-addressing map sequence id -> struct pkv_seq
 *   seq.c          the public sequence calls (open, append, commit, fork, ...)
 *   cache.c        pkv_open/pkv_close, info, stats, payload addresses
 *   check.c        pkv_check: every invariant of docs/design.md, verified
 *
 * Blocks are named by their index (uint32_t) everywhere; PKV_NONE is "no block".
 * Indices, not pointers, so metadata can later be persisted as is.
 */
#ifndef PKV_INTERNAL_H
#define PKV_INTERNAL_H

#include "pagedkv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- Internal assertions (mimalloc's mi_assert_internal) ----------------- */

#ifndef PKV_INTERNAL_CHECKS
#define PKV_INTERNAL_CHECKS 0 /* also usable in plain `if`s */
#endif
#if PKV_INTERNAL_CHECKS
#define pkv_assert(expr)                                                        \
    ((expr) ? (void)0 : pkv_assert_fail(#expr, __FILE__, __LINE__, __func__))
#else
#define pkv_assert(expr) ((void)0)
#endif
_Noreturn void pkv_assert_fail(const char *expr, const char *file, int line,
                               const char *func);

#define PKV_NONE UINT32_MAX
#define PKV_PAGE 4096u

#if defined(__GNUC__)
#define pkv_likely(x)   __builtin_expect(!!(x), 1)
#define pkv_unlikely(x) __builtin_expect(!!(x), 0)
#define pkv_prefetch(p) __builtin_prefetch(p)
#define pkv_always_inline inline __attribute__((always_inline))
#define pkv_noinline __attribute__((noinline))
#else
#define pkv_likely(x)   (x)
#define pkv_unlikely(x) (x)
#define pkv_prefetch(p) ((void)(p))
#define pkv_always_inline inline
#define pkv_noinline
#endif

/* ---- Checksum comparisons ------------------------------------------------ */

/* Every comparison of a checksum stored on disk with the one computed from the
 * bytes goes through pkv_sum_ok(). The fuzzing variant of the library
 * (libpagedkv_fuzz, built only for fuzz/; docs/testing-fuzz.md) is compiled with
 * PKV_FUZZING, which makes every such comparison accept (the checksum is still
 * computed), so that fuzz inputs reach the parsers behind the checks. Payload
 * checksums of K/V blocks (pkv_block_verify) are not affected: they decide what
 * is served, not what is parsed. The production library and every other variant
 * are compiled with PKV_PRODUCTION_BUILD, and the two together are an error, so
 * PKV_FUZZING cannot leak into them through CFLAGS. */
#if defined(PKV_FUZZING) && defined(PKV_PRODUCTION_BUILD)
#error "PKV_FUZZING disables checksum checks; it must never reach a production build"
#endif
static inline bool pkv_sum_ok(uint64_t stored, uint64_t computed) {
#ifdef PKV_FUZZING
    (void)stored;
    (void)computed;
    return true;
#else
    return stored == computed;
#endif
}

/* ---- Errors (error.c) ---------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t pkv_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Record a detailed message for pkv_last_error() and return `code`. */
int pkv_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pkv_err_clear(void);

/* ---- Little-endian encoding for on-disk structures ---------------------- */

/* On little-endian hosts one unaligned load or store each (the byte loops are not
 * always merged by the compiler, and log records are encoded on the per-token
 * path). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline void pkv_put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void pkv_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t pkv_get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t pkv_get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#else
static inline void pkv_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void pkv_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t pkv_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t pkv_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
#endif

/* ---- Arena (arena.c) ----------------------------------------------------- */

typedef struct pkv_geometry {
    uint32_t num_layers, num_kv_heads, head_dim, block_size;
    uint32_t dtype, elem_size;
    uint64_t capacity;
    uint64_t run_bytes;   /* block_size * head_dim * elem_size */
    uint64_t block_bytes; /* num_layers * 2 * num_kv_heads * run_bytes */
    uint64_t slot_bytes;  /* the stride of the slots: pkv_slot_bytes_dense() for a new
                             arena, the stored value (dense or page) for an existing one */
} pkv_geometry;

/* The two legal slot strides (docs/format.md, "Arena file"). A version-1 arena
 * rounds block_bytes up to whole pages; a version-2 one, written since
 * 2026-12-06, packs small blocks several to a page: the smallest power of two,
 * at least a cache line, that holds block_bytes. Being a divisor of the page, it
 * keeps every block inside one page and every run aligned as a page-sized slot
 * would (to run_bytes's largest power-of-two factor); blocks over half a page
 * get the page stride either way, so version 2 differs only for them. */
static inline uint64_t pkv_slot_bytes_page(uint64_t block_bytes) {
    return (block_bytes + PKV_PAGE - 1) / PKV_PAGE * PKV_PAGE;
}
static inline uint64_t pkv_slot_bytes_dense(uint64_t block_bytes) {
    if (block_bytes > PKV_PAGE / 2) return pkv_slot_bytes_page(block_bytes);
    uint64_t s = 64;
    while (s < block_bytes) s <<= 1;
    return s;
}
/* The arena header's format version for a stride: 1 for the page stride (so a
 * library from before version 2 still opens every arena of large blocks), 2 for
 * a dense one. */
static inline uint32_t pkv_arena_version(uint64_t block_bytes, uint64_t slot_bytes) {
    return slot_bytes == pkv_slot_bytes_page(block_bytes) ? 1u : 2u;
}
/* Whether a stored (version, slot_bytes) pair is one a writer produces. */
static inline bool pkv_slot_bytes_legal(uint32_t version, uint64_t block_bytes,
                                        uint64_t slot_bytes) {
    return (version == 1 || version == 2) && slot_bytes != 0 &&
           (slot_bytes == pkv_slot_bytes_page(block_bytes) ||
            slot_bytes == pkv_slot_bytes_dense(block_bytes)) &&
           pkv_arena_version(block_bytes, slot_bytes) == version;
}

typedef struct pkv_arena {
    int fd;           /* the arena file */
    int lock_fd;      /* the LOCK file, flock()ed exclusively while open */
    uint8_t *map;     /* MAP_SHARED mapping of the whole file */
    uint64_t map_len;
    uint64_t data_offset; /* == PKV_PAGE: first block slot */
    uint64_t secret;      /* per-cache random hash seed */
    pkv_geometry geo;
    char model_id[PKV_MODEL_ID_MAX + 1];
    bool rdonly;          /* opened read-only: no lock, PROT_READ mapping */
    bool created;         /* this open created the arena file */
    bool foreign_log;     /* recovery met log files written for another arena */
    bool linked;          /* dir/arena is a symbolic link to a file in another
                             directory (pkv_options.arena_dir) */
    char path[4096];      /* the arena file: dir/arena, or the link's target */
    int dir_fd;           /* the cache directory, flock()ed exclusively while open
                             (beside lock_fd; here it fills padding) */
    uint64_t valid_blocks; /* slots the file held before any repair (recovery
                              drops blocks at or beyond it) */
} pkv_arena;

/* Validate options and derive the geometry. */
int pkv_geometry_from_options(const pkv_options *opt, pkv_geometry *geo);
/* Create or open `dir`/arena (or, with opt->arena_dir, a file there that
 * `dir`/arena links to), lock the directory (unless read-only), map the file.
 * A file shorter than its header says is extended (read-only: mapped as it is)
 * and valid_blocks tells recovery which slots were lost. */
int pkv_arena_open(pkv_arena *a, const char *dir, const pkv_options *opt, bool rdonly);
/* Check that the header page hdr of an arena file decodes and matches a's
 * geometry, stride, data offset and model id. Errors: PKV_ECORRUPT,
 * PKV_EVERSION (the header itself), PKV_EGEOMETRY (a mismatch), PKV_ENOMEM. */
int pkv_arena_check_header(const pkv_arena *a, const uint8_t *hdr, const char *what);
void pkv_arena_close(pkv_arena *a);

static inline uint8_t *pkv_arena_block(const pkv_arena *a, uint32_t b) {
    return a->map + a->data_offset + (uint64_t)b * a->geo.slot_bytes;
}
static inline uint8_t *pkv_arena_run(const pkv_arena *a, uint32_t b, uint32_t layer,
                                     uint32_t kind, uint32_t head) {
    const pkv_geometry *g = &a->geo;
    uint64_t run = ((uint64_t)layer * 2 + kind) * g->num_kv_heads + head;
    return pkv_arena_block(a, b) + run * g->run_bytes;
}
/* Copy the K/V of the first n tokens of block src to block dst (all runs). */
void pkv_arena_copy_tokens(const pkv_arena *a, uint32_t dst, uint32_t src, uint32_t n);
/* XXH3-64 of block b's K/V payload (its slot's block_bytes): the sum a SEAL
 * records and recovery and kvdump verify. */
uint64_t pkv_arena_sum(const pkv_arena *a, uint32_t b);

/* ---- Hashing (hash.c) ---------------------------------------------------- */

typedef struct pkv_h128 {
    uint64_t lo, hi;
} pkv_h128;

static inline bool pkv_h128_eq(pkv_h128 a, pkv_h128 b) {
    return a.lo == b.lo && a.hi == b.hi;
}
/* Hash standing in for the parent of a sequence's first block. */
pkv_h128 pkv_hash_root(uint64_t secret, uint64_t salt);
/* Chained hash of a block: H(secret; parent hash || token ids). */
pkv_h128 pkv_hash_block(uint64_t secret, pkv_h128 parent, const uint32_t *tokens,
                        uint32_t block_size);

/* ---- Block pool (blockpool.c) ------------------------------------------- */

enum { BLK_FREE = 0, BLK_OPEN = 1, BLK_SEALED = 2 };
enum { LIST_NONE = 0, LIST_FREE = 1, LIST_LRU = 2, LIST_LIMBO = 3, LIST_PROT = 4 };
enum { BLKF_UNVERIFIED = 1, /* recovered: payload not yet checked against its sum */
       BLKF_BAD = 2,        /* payload failed its checksum: never served again */
       BLKF_NAMED = 4,      /* a record named it while it was open (it held committed
                               tokens), so the durable state may name it open: freed
                               open, it waits in limbo (rule D2); sealed, its slot is
                               not rewritten before its SEAL is safe (rule D3). Also
                               set on a sealed block a truncation releases: its slot
                               waits for the TRUNC (rule D3) */
       BLKF_PRESUM = 8,     /* open, only inside the call that set it: payload_sum
                               holds its checksum, computed ahead (sealsum.c) */
       BLKF_REUSED = 16,    /* leaf-SLRU: it or a descendant was reused while cached
                               (evict.c); never saved, so lost at a restart */
       BLKF_OFFERED = 32 }; /* sealed: offered to the shared tier once already (queued
                               for publishing, or imported from it), so
                               PKV_TIER_PUBLISH_ON_HIT does not queue it again
                               (tier.c); cleared by a seal and a free, never
                               saved, so lost at a restart */
#define PKV_LSN_PENDING UINT64_MAX /* limbo stamp until the op's record exists */

/* Metadata of one block; exactly one cache line. */
typedef struct pkv_block {
    pkv_h128 hash;     /* sealed only */
    uint64_t salt;     /* sealed only: the trust domain of its chain */
    uint32_t parent;   /* sealed only: previous block of the chain, or PKV_NONE */
    uint32_t ref;      /* number of block-table entries naming this block */
    uint32_t nchild;   /* sealed blocks whose parent is this one */
    uint32_t prev, next; /* links of the list named by `list` */
    uint8_t state;     /* BLK_* */
    uint8_t list;      /* LIST_* */
    uint8_t flags;     /* BLKF_* */
    uint8_t pad;
    uint64_t payload_sum; /* sealed only: XXH3-64 of the block's K/V payload */
    uint64_t rel_lsn;  /* cached: LSN of the release that left ref 0 (LRU order at
                          recovery); limbo: LSN that must be safe before reuse */
} pkv_block;
_Static_assert(sizeof(pkv_block) == 64, "pkv_block is one cache line");

typedef struct pkv_list {
    uint32_t head, tail; /* head = oldest */
    uint64_t count;
} pkv_list;

/* The eviction policy's data (evict.c owns it; pkv_check reads it). Both lists are
 * oldest first; the victim order is lru from its head, then prot from its head. */
typedef struct pkv_policy {
    pkv_list lru;      /* leaf-LRU: every cached block; leaf-SLRU: probation */
    pkv_list prot;     /* leaf-SLRU: protected (reused) blocks; empty under leaf-LRU */
    uint64_t prot_max; /* leaf-SLRU: the most blocks prot may hold */
    uint64_t newest;   /* the largest release LSN given to a cached block since the
                          open: bounds every NAMED cached block's (rule D3) */
    int kind;          /* pkv_eviction */
} pkv_policy;

typedef struct pkv_pool {
    uint32_t capacity;
    uint32_t block_size;
    int bs_shift;      /* log2(block_size) when it is a power of two, else -1 */
    pkv_block *b;      /* capacity entries, 64-byte aligned */
    uint32_t *tokens;  /* capacity * block_size token ids */
    pkv_list free;     /* BLK_FREE blocks */
    pkv_policy pol;    /* sealed blocks with ref 0, in the policy's lists */
    uint64_t n_used;   /* blocks with ref > 0 */
    uint64_t ref_total; /* sum of the refcounts = block-table entries (I2; metrics) */
    uint64_t n_sealed; /* blocks in BLK_SEALED state */
    /* Bit b: block b's checkpointed state (sealed or not; if sealed its parent,
     * salt, hash, payload sum, release LSN, flags, tokens) may differ from what the
     * newest checkpoint file holds. Set by every such change (pkv_ckpt_touch),
     * cleared as a checkpoint copies the block; a delta checkpoint holds exactly
     * the blocks whose bit is set (wal/checkpoint.c). */
    uint64_t *ckdirty;
    /* Internal-checks builds only (NULL otherwise; the field is always there, so
     * that code including this header with other settings sees one layout): per
     * block, a digest of what the newest checkpoint file that copied it holds; a
     * delta asserts that every block whose bit is clear still matches it, so a
     * change that forgot pkv_ckpt_touch fails the first checkpoint after it. */
    uint64_t *ckshadow;
} pkv_pool;

static inline void pkv_ckpt_touch(pkv_pool *p, uint32_t b) {
    p->ckdirty[b >> 6] |= 1ull << (b & 63);
}

int pkv_pool_init(pkv_pool *p, uint32_t capacity, uint32_t block_size);
void pkv_pool_free(pkv_pool *p);

/* Token position -> block index / offset; shifts for power-of-two block sizes
 * (64-bit division is a measurable part of the per-token path). */
static inline uint64_t pkv_bdiv(const pkv_pool *p, uint64_t x) {
    return p->bs_shift >= 0 ? x >> p->bs_shift : x / p->block_size;
}
static inline uint32_t pkv_bmod(const pkv_pool *p, uint64_t x) {
    return (uint32_t)(p->bs_shift >= 0 ? x & (p->block_size - 1) : x % p->block_size);
}
static inline uint64_t pkv_bceil(const pkv_pool *p, uint64_t x) {
    return pkv_bdiv(p, x + p->block_size - 1);
}

static inline uint32_t *pkv_pool_tokens(const pkv_pool *p, uint32_t b) {
    return p->tokens + (uint64_t)b * p->block_size;
}

/* Depth of every sealed block into d[0, capacity) (0 = a root; UINT32_MAX: a
 * broken or cyclic chain; other blocks: UINT32_MAX - 1); stack: capacity + 1
 * entries of scratch. O(capacity): each block is walked once. */
void pkv_pool_depths(const pkv_pool *p, uint32_t *d, uint32_t *stack);
void pkv_list_push_tail(pkv_pool *p, pkv_list *l, uint8_t which, uint32_t b);
void pkv_list_push_head(pkv_pool *p, pkv_list *l, uint8_t which, uint32_t b);
void pkv_list_remove(pkv_pool *p, pkv_list *l, uint32_t b);

/* ---- Prefix index (prefix_index.c) -------------------------------------- */

typedef struct pkv_index_slot {
    uint64_t key;   /* hash.lo of the block */
    uint32_t block; /* PKV_NONE: empty */
    uint32_t pad;
} pkv_index_slot;

typedef struct pkv_index {
    pkv_index_slot *slots;
    uint64_t mask;  /* number of slots - 1 (power of two, >= 2 * capacity) */
    uint64_t count;
} pkv_index;

int pkv_index_init(pkv_index *ix, uint32_t capacity);
void pkv_index_free(pkv_index *ix);
static inline uint64_t pkv_index_home(const pkv_index *ix, uint64_t key) {
    /* Fibonacci scrambling keeps truncated (test) hashes from clustering less
     * than they must; real XXH3 output is already uniform. */
    return (key * 0x9E3779B97F4A7C15ull >> 20) & ix->mask;
}
static inline void pkv_index_prefetch(const pkv_index *ix, uint64_t key) {
    pkv_prefetch(&ix->slots[pkv_index_home(ix, key)]);
}
/* The second stage of a probe's prefetch, the slot loaded (or loading): start
 * loading the record and token ids of the block in the key's home slot, which a
 * hit compares (a hint: other slots of the run are left to the probe). */
static inline void pkv_index_prefetch_entry(const pkv_index *ix, const pkv_block *b,
                                            const uint32_t *tokens, uint32_t block_size,
                                            uint64_t key) {
    const pkv_index_slot *s = &ix->slots[pkv_index_home(ix, key)];
    if (s->key == key && s->block != PKV_NONE) {
        pkv_prefetch(&b[s->block]);
        pkv_prefetch(tokens + (uint64_t)s->block * block_size);
    }
}
/* The sealed, not BAD block with this hash, parent, salt and tokens, or
 * PKV_NONE. The match is exact: hash equality alone never suffices. */
uint32_t pkv_index_find(const pkv_index *ix, const pkv_pool *p, pkv_h128 h,
                        uint32_t parent, uint64_t salt, const uint32_t *tokens);
/* Another block in the index identical to sealed block b (hash, parent, salt,
 * tokens) with the same BAD flag, or PKV_NONE (recovery's duplicate test). */
uint32_t pkv_index_find_twin(const pkv_index *ix, const pkv_pool *p, uint32_t b);
void pkv_index_insert(pkv_index *ix, uint64_t key, uint32_t block);
void pkv_index_remove(pkv_index *ix, uint64_t key, uint32_t block);

/* ---- Sequences (seqmap.c, seq.c) ----------------------------------------- */

typedef struct pkv_seq {
    uint64_t id;
    uint64_t salt;
    uint64_t len;       /* tokens, pending included */
    uint64_t committed; /* tokens whose K/V is committed */
    uint32_t *blocks;   /* block table: ceil(len / block_size) entries */
    uint32_t nblocks, cap;
    /* Its latest COMMIT record while it may still grow in place (wal/record.c):
     * valid while mc_gen == wal.gen (0: none); at buf + mc_off, its slot ending at
     * mc_end, written from committed length mc_old. */
    uint64_t mc_gen;
    size_t mc_off, mc_end;
    uint64_t mc_old;
    /* mc_stale: commits since that record was last written are not in it yet
     * (deferred growth, record.c); it is entry mc_stale_ix of wal.stale. */
    bool mc_stale;
    uint32_t mc_stale_ix;
    /* The hash of block pf_blk, its last, computed when the decode fast append
     * filled it (seq.c seal_prefetch), for the seal to reuse; valid while pf_ok.
     * Any other change to its tokens or table (append_apply, truncate) clears it. */
    pkv_h128 pf_hash;
    uint32_t pf_blk;
    bool pf_ok;
} pkv_seq;

typedef struct pkv_seqmap {
    pkv_seq **slots; /* NULL: empty */
    uint64_t mask;
    uint64_t count;
    pkv_seq *last;   /* the most recently found sequence (decode loops repeat it) */
} pkv_seqmap;

int pkv_seqmap_init(pkv_seqmap *m);
void pkv_seqmap_free(pkv_seqmap *m); /* frees the sequences too */
pkv_seq *pkv_seqmap_find(pkv_seqmap *m, uint64_t id);
static inline pkv_seq *pkv_seqmap_get(pkv_seqmap *m, uint64_t id) {
    pkv_seq *s = m->last;
    return s && s->id == id ? s : pkv_seqmap_find(m, id);
}
/* Make room for one more entry, so the following insert cannot fail. */
int pkv_seqmap_reserve(pkv_seqmap *m);
void pkv_seqmap_insert(pkv_seqmap *m, pkv_seq *s);
void pkv_seqmap_remove(pkv_seqmap *m, uint64_t id);

/* ---- Large arrays (hugemem.c) ---------------------------------------------- */

/* n zeroed bytes, 2 MiB-aligned with transparent huge pages advised when
 * n >= 2 MiB (else 64-byte aligned heap memory). NULL when out of memory. */
void *pkv_huge_alloc(size_t n);
/* Free what pkv_huge_alloc(n) returned (NULL is fine). */
void pkv_huge_free(void *p, size_t n);
/* Advise MADV_HUGEPAGE for the 2 MiB pages wholly inside [p, p + n). */
void pkv_hint_huge(void *p, size_t n);

/* ---- The cache lock (lock.c) ------------------------------------------- */

/* The cache lock: a futex mutex (v: 0 free, 1 held, 2 held and perhaps waited
 * on) that can be biased to one thread, which then takes and releases it with
 * plain stores to a word of its own (its pkv_lockrec's busy) instead of atomic
 * read-modify-writes; any other thread takes v and revokes the bias first (lock.c
 * has the protocol). Zero-initialized is unlocked and unbiased; nothing to
 * destroy. fast and the fields after bias are touched only by the holder. */
typedef struct pkv_mutex {
    _Alignas(64) _Atomic uint32_t v; /* a cache line of its own */
    uintptr_t fast;             /* the holder came in by the fast path: its
                                   pkv_lockrec (the unlock needs no TLS load), or 0 */
    _Atomic uintptr_t bias;     /* the pkv_lockrec of the thread the lock is biased
                                   to, or 0 */
    uintptr_t last;             /* thread (pkv_self) of the latest acquisitions of v */
    uint32_t streak;            /* consecutive acquisitions of v by `last` */
    uint32_t grant_shift;       /* bias after a streak of 256 << grant_shift */
    uint64_t fast_uses;         /* fast acquisitions since the bias was granted */
    uint64_t revoked_ns;        /* CLOCK_MONOTONIC time of the latest revocation */
    uint64_t forget_ns;         /* grant_shift back to 0 this long after it (0:
                                   the default, lock.c; tests set others) */
    uint64_t revocations;       /* (tests and benchmarks) */
} pkv_mutex;
/* A condition variable for pkv_mutex (spurious wake-ups possible). Zeroed is ready. */
typedef struct pkv_cond {
    _Atomic uint32_t seq, waiters;
} pkv_cond;

/* A thread's record for the bias (lock.c): made when the thread is first granted
 * a bias, handed to a later thread when it exits, never freed (a revoker may read
 * it at any time). busy is written only by its thread; a revoker waits on it. */
typedef struct pkv_lockrec {
    _Alignas(64) _Atomic uint32_t busy; /* 1 while its thread is inside a pkv_mutex
                                           by the fast path (one at a time) */
    _Atomic uint32_t waiting;   /* revokers asleep on busy (each counts itself) */
    struct pkv_lockrec *next;   /* in the list of unused records */
} pkv_lockrec;

/* This thread's pkv_lockrec, or PKV_NO_LOCKREC (never a bias) before its first
 * grant. Initial-exec TLS: no call, just a load of its offset (from the GOT, in
 * the shared library) and an fs-relative load; a dlopen of the library needs a
 * few bytes of the static TLS reserve, which glibc keeps for this. */
#define PKV_NO_LOCKREC ((uintptr_t)1)
extern _Thread_local uintptr_t pkv_lock_me __attribute__((tls_model("initial-exec")));

/* This thread's identity for streaks: its thread pointer (unique among live
 * threads, one instruction to read). */
static inline uintptr_t pkv_self(void) {
#if defined(__x86_64__) || defined(__aarch64__)
    return (uintptr_t)__builtin_thread_pointer();
#else
    return (uintptr_t)pthread_self();
#endif
}

void pkv_mutex_lock_slow(pkv_mutex *m);
void pkv_mutex_wake(pkv_mutex *m);
void pkv_lockrec_wake(pkv_lockrec *r);
void pkv_mutex_took_v_slow(pkv_mutex *m, uintptr_t me);
void pkv_mutex_streak(pkv_mutex *m);
/* Can locks be biased in this process (membarrier registered)? */
bool pkv_mutex_bias_available(void);
/* Is m biased to the calling thread? */
static inline bool pkv_mutex_biased_to_me(pkv_mutex *m) {
    return atomic_load_explicit(&m->bias, memory_order_relaxed) == pkv_lock_me;
}
/* Leave the fast path (or a failed try of it): this thread's busy back to 0,
 * waking revokers that sleep on it. Their membarrier orders the store before
 * the load of `waiting` (lock.c). */
static inline void pkv_lockrec_leave(pkv_lockrec *r) {
    atomic_store_explicit(&r->busy, 0, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    if (pkv_unlikely(atomic_load_explicit(&r->waiting, memory_order_relaxed)))
        pkv_lockrec_wake(r);
}
/* Just took v: revoke another thread's bias, count this thread's streak. */
static inline void pkv_mutex_took_v(pkv_mutex *m, uintptr_t me) {
    if (pkv_likely(atomic_load_explicit(&m->bias, memory_order_relaxed) == 0 && m->last == me))
        m->streak++;
    else
        pkv_mutex_took_v_slow(m, me);
}
/* tests/test_lock.c defines this before it includes this header, to stall a
 * thread between the fast path's first load of bias and its store of busy (the
 * window a thread can be preempted in); in every other file it is nothing. */
#ifndef PKV_LOCK_TEST_PAUSE
#define PKV_LOCK_TEST_PAUSE(m) ((void)0)
#endif
static inline void pkv_mutex_lock(pkv_mutex *m) {
    uintptr_t me = pkv_lock_me;
    if (pkv_likely(atomic_load_explicit(&m->bias, memory_order_relaxed) == me)) {
        PKV_LOCK_TEST_PAUSE(m);
        pkv_lockrec *r = (pkv_lockrec *)me;
        /* a thread is inside one pkv_mutex at a time: busy says nothing of which */
        pkv_assert(atomic_load_explicit(&r->busy, memory_order_relaxed) == 0);
        atomic_store_explicit(&r->busy, 1, memory_order_relaxed);
        /* busy is stored before bias is loaded again: the compiler keeps the
         * order, a revoker's membarrier makes the CPU keep it (lock.c) */
        atomic_signal_fence(memory_order_seq_cst);
        if (pkv_likely(atomic_load_explicit(&m->bias, memory_order_acquire) == me)) {
            m->fast = me;
            m->fast_uses++;
            return;
        }
        pkv_lockrec_leave(r); /* revoked meanwhile: queue on v */
    }
    uint32_t free_ = 0;
    if (pkv_unlikely(!atomic_compare_exchange_strong_explicit(
            &m->v, &free_, 1, memory_order_acquire, memory_order_relaxed)))
        pkv_mutex_lock_slow(m); /* takes v, then calls took_v itself */
    else
        pkv_mutex_took_v(m, pkv_self());
}
/* Release v, waking a sleeper if it was marked waited on. */
static inline void pkv_mutex_unlock_v(pkv_mutex *m) {
    if (pkv_unlikely(atomic_exchange_explicit(&m->v, 0, memory_order_release) == 2))
        pkv_mutex_wake(m);
}
static inline void pkv_mutex_unlock(pkv_mutex *m) {
    uintptr_t fast = m->fast;
    if (pkv_likely(fast)) {
        m->fast = 0;
        pkv_lockrec_leave((pkv_lockrec *)fast);
        return;
    }
    /* every 256 acquisitions of a streak: is it long enough for the bias? (lock.c) */
    if (pkv_unlikely((m->streak & 255u) == 0 && m->streak != 0)) pkv_mutex_streak(m);
    pkv_mutex_unlock_v(m);
}
/* Unlock m, sleep until signalled (or, with abs, until that CLOCK_REALTIME
 * deadline: ETIMEDOUT), lock m again. Returns 0 or ETIMEDOUT. */
int pkv_cond_timedwait(pkv_cond *cv, pkv_mutex *m, const struct timespec *abs);
void pkv_cond_wait(pkv_cond *cv, pkv_mutex *m);
void pkv_cond_signal(pkv_cond *cv);    /* wake one waiter */
void pkv_cond_broadcast(pkv_cond *cv); /* wake all */

/* ---- The cache (cache.c) ------------------------------------------------- */

#include "wal/wal.h"

typedef struct pkv_counters {
    uint64_t hit_tokens, miss_tokens, hit_blocks, miss_blocks;
    uint64_t evictions, cow_copies, dedupes, seals;
    uint64_t verify_failures;
    /* calls that waited for the log, and for how long (pkv_get_stats) */
    uint64_t waits_limbo, waits_seal, waits_backlog;
    uint64_t wait_limbo_ns, wait_seal_ns, wait_backlog_ns;
    uint64_t limbo_evict_max; /* most limbo blocks at an allocation that evicted */
    uint64_t tokens_appended; /* by append (and the decode steps): the denominator
                                 of copy-on-write copies per token (metrics) */
} pkv_counters;

struct pkv_cache {
    pkv_mutex lock; /* guards everything below (lock.c) */
    pkv_arena arena;
    pkv_pool pool;
    pkv_index index;
    pkv_seqmap seqs;
    pkv_counters ctr;
    pkv_wal wal;
    pkv_recovery rec;
    bool rdonly;
    bool limbo_wait; /* PKV_OPEN_LIMBO_WAIT: wait for limbo rather than evict */
    uint32_t cuda_handles, cuda_mode; /* set by src/cuda/cuda.c (pkv_get_stats) */
    pkv_list limbo; /* freed blocks waiting until the freeing record is safe */
    uint32_t seal_threads;   /* pkv_options.seal_threads (0 and 1: none) */
    uint64_t seal_sums_ahead; /* checksums sealsum.c computed (pkv_get_stats) */
    uint32_t presum_calls;    /* calls whose BLKF_PRESUM marks are out (sealsum.c) */
    /* Recovery's first sequence cut, for the recovery note (replay.c); last, so
     * that the hot fields above keep their offsets. */
    struct {
        uint64_t seq;
        uint32_t index, block;
        const char *why;
    } first_cut;
    /* The checkpointed counters (pkv_counters' first eight) as recovery loaded
     * them: metrics.c reports counts since this open as ctr minus these, and the
     * carried totals apart (docs/metrics.md). */
    pkv_counters ctr_at_open;
    /* A connected handle (pkv_connect, remote.c; rdonly is set too): only the
     * arena part above is filled; the calls forward to pkvd (PKV_REMOTE) or
     * refuse (PKV_LOCAL_ONLY). */
    struct pkv_remote *remote;
    /* The /metrics servers of this cache (metrics_http.c), linked under the
     * lock; pkv_close detaches them so a late request cannot reach a freed cache. */
    struct pkv_metrics_server *metrics_servers;
    /* The shared prefix tier (tier.c, docs/remote.md), NULL without one; set
     * and cleared under the lock by pkv_tier_attach / pkv_tier_detach, which
     * must not race other calls on the cache (as pkv_close). */
    struct pkv_tier *tier;
};

/* ---- Connected handles (remote.c, docs/pkvd.md) --------------------------- */

typedef struct pkv_remote pkv_remote;
/* First statement of a public call with a remote form, after its argument
 * checks: forward it when the handle is connected. A connected handle is also
 * marked rdonly, which every mutating call reads anyway, so a local handle's
 * decode path pays no extra cache line for this test. */
#define PKV_REMOTE(c, call)                                                     \
    do {                                                                        \
        if (pkv_unlikely((c) != NULL && (c)->rdonly && (c)->remote != NULL))     \
            return (call);                                                      \
    } while (0)
/* Calls without a remote form: PKV_ENOTSUP on a connected handle. */
#define PKV_LOCAL_ONLY(c, what)                                                 \
    do {                                                                        \
        if (pkv_unlikely((c) != NULL && (c)->rdonly && (c)->remote != NULL))     \
            return pkv_err(PKV_ENOTSUP, "%s is not available on a pkv_connect "   \
                           "handle", what);                                     \
    } while (0)
void pkv_remote_close(pkv_cache *c);
/* pkv_close: detach every /metrics server of c (they answer 503 from then on;
 * pkv_metrics_stop still frees them). Takes the lock, then each server's mutex. */
void pkv_metrics_detach_all(pkv_cache *c);
int pkv_remote_lookup(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                      size_t *n_cached);
int pkv_remote_seq_open(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *prompt,
                        size_t n, size_t *n_cached);
/* append (n_commit 0), commit (n 0) and commit_append */
int pkv_remote_commit_append(pkv_cache *c, uint64_t id, size_t n_commit,
                             const uint32_t *tokens, size_t n, pkv_slot *slots);
int pkv_remote_step_batch(pkv_cache *c, pkv_step *steps, size_t n, size_t *done);
int pkv_remote_fork(pkv_cache *c, uint64_t parent, uint64_t child);
int pkv_remote_truncate(pkv_cache *c, uint64_t id, size_t new_len);
int pkv_remote_seq_close(pkv_cache *c, uint64_t id);
int pkv_remote_get_info(pkv_cache *c, uint64_t id, pkv_seq_info *out);
int pkv_remote_list(pkv_cache *c, bool tokens, uint64_t id, uint32_t *out, size_t cap,
                    size_t *n);
int pkv_remote_stats(pkv_cache *c, pkv_stats *out);
int pkv_remote_sync(pkv_cache *c);

/* ---- Seal checksums computed ahead (sealsum.c) --------------------------- */

#define PKV_SEAL_THREADS_MAX 64u
/* With the lock held, before a pkv_seq_step_batch runs its steps: checksum the
 * open blocks its commits will seal, on up to seal_threads threads, and mark
 * them BLKF_PRESUM. Returns how many (*list: them, for pkv_seal_sums_done). */
size_t pkv_seal_sums_ahead(pkv_cache *c, const pkv_step *steps, size_t n, uint32_t **list);
/* After the steps: clear the marks the batch did not consume; frees list. */
void pkv_seal_sums_done(pkv_cache *c, uint32_t *list, size_t k);
/* With the lock held, just before a commit seals s->blocks[first, full), two
 * blocks or more: checksum them the same way (seal() consumes the marks). */
void pkv_seal_sums_range(pkv_cache *c, const pkv_seq *s, uint64_t first, uint64_t full);

/* pkv_get_stats's copy, with the cache lock held (cache.c; metrics.c uses it
 * too, so one lock hold gives a consistent set). */
void pkv_stats_locked(const pkv_cache *c, pkv_stats *out);

static inline void pkv_lock(pkv_cache *c) { pkv_mutex_lock(&c->lock); }
static inline void pkv_unlock(pkv_cache *c) { pkv_mutex_unlock(&c->lock); }

/* Fast paths of the log calls every mutation makes (wal/log.c has the rest). */
static inline int pkv_wal_reserve(pkv_cache *c, size_t bytes) {
    /* REC_MAX_BYTES and PKV_WAL_CALL_MAX (wal.h): refused before any change */
    if (pkv_unlikely(bytes > PKV_WAL_CALL_MAX)) return pkv_wal_too_big(c, bytes);
    /* the next record may first leave the last COMMIT's unused slot as slack */
    if (c->wal.tail_end > c->wal.len) bytes += c->wal.tail_end - c->wal.len;
    return pkv_likely(c->wal.cap - c->wal.len >= bytes) ? 0 : pkv_wal_grow(c, bytes);
}
static inline int pkv_wal_writable(pkv_cache *c) {
    return pkv_likely(!c->rdonly && !c->wal.failed) ? 0 : pkv_wal_unwritable(c);
}
static inline void pkv_wal_throttle(pkv_cache *c) {
    if (pkv_unlikely(c->wal.len >= c->wal.backlog)) pkv_wal_backlog_wait(c);
}
static inline int pkv_wal_commit_point(pkv_cache *c) {
    if (c->wal.mode != PKV_DURABLE_ALWAYS) return 0;
    return pkv_wal_wait(c, c->wal.next_lsn - 1);
}

/* ---- Block life cycle (blockpool.c, evict.c) ----------------------------- */

/* Blocks obtainable without failing: free + evictable. */
static inline uint64_t pkv_available(const pkv_cache *c) {
    return c->pool.free.count + c->pool.pol.lru.count + c->pool.pol.prot.count;
}
/* Take a free block, or evict the policy's victim if none is free (*evicted: the
 * caller logs EVICT), as BLK_OPEN, ref 1. The caller has checked
 * pkv_available() > 0 and waited for rule D3 (seq.c ensure_blocks). */
uint32_t pkv_block_alloc(pkv_cache *c, bool *evicted);
/* One more reference to a block (a cached one leaves the policy's lists). */
void pkv_block_acquire(pkv_cache *c, uint32_t b);
/* One reference less; at zero a sealed block becomes cached, an open one free or
 * (named by a record) in limbo. */
void pkv_block_release(pkv_cache *c, uint32_t b);
/* OPEN (ref 1) -> SEALED with this hash, parent, salt and payload checksum: in
 * the prefix index, counted in its parent's children. The caller logs SEAL. */
void pkv_block_seal(pkv_cache *c, uint32_t b, pkv_h128 h, uint32_t parent, uint64_t salt,
                    uint64_t sum);
/* Check a recovered sealed block's payload against its checksum once. FAILED: it
 * just failed and is now BAD (never served again); the caller logs BAD while the
 * log runs, so no later recovery serves or indexes it. */
typedef enum { PKV_VERIFY_OK, PKV_VERIFY_BAD, PKV_VERIFY_FAILED } pkv_verdict;
pkv_verdict pkv_block_verify(pkv_cache *c, uint32_t b);
/* Rule S1 for a path that serves nothing and must record nothing
 * (pkv_prefix_lookup): true when sealed block b would pass pkv_block_verify. A
 * pass is kept exactly as pkv_block_verify keeps it (UNVERIFIED cleared, nothing
 * logged or counted); a failure changes nothing, so the serving path that next
 * reaches the block marks it BAD, counts and logs it. */
bool pkv_block_verify_quiet(pkv_cache *c, uint32_t b);
/* seq.c: with the lock held, the longest chain of cached blocks matching
 * prompt[0 .. maxb*B) (rules S2, S1); blocks to out[] unless NULL. pkv_seq_open
 * records a failed verification; quiet (pkv_prefix_lookup) changes nothing. */
uint32_t pkv_prefix_match(pkv_cache *c, uint64_t salt, const uint32_t *prompt, uint64_t maxb,
                          uint32_t *out, bool quiet);
/* Stamp blocks freed by the current call with the LSN of its last record. */
void pkv_limbo_stamp(pkv_cache *c);
/* Move limbo blocks whose stamp is at or below `safe` to the free list. */
void pkv_limbo_drain(pkv_cache *c, uint64_t safe);
/* Recovery: every block's state, refcount, list and index entry from the
 * surviving sealed blocks and tables (d, stack: capacity + 1 entries of scratch). */
int pkv_pool_rebuild(pkv_cache *c, uint32_t *d, uint32_t *stack);

/* The eviction policy (evict.c), called by the pool (seq.c asks it for rule D3): */
/* Empty lists, policy `kind` (pkv_eviction, validated by the caller), protected
 * share `protect_pct` (1..100) of `capacity`. */
void pkv_evict_init(pkv_policy *e, int kind, uint32_t protect_pct, uint32_t capacity);
/* Empty the lists, keeping the policy and its settings (recovery). */
void pkv_evict_clear(pkv_policy *e);
/* Cached blocks: on the policy's lists. */
static inline uint64_t pkv_evict_count(const pkv_policy *e) {
    return e->lru.count + e->prot.count;
}
/* Prefetch what the next pkv_block_alloc will touch (stage 0, then 1). */
void pkv_alloc_prefetch(const pkv_cache *c, int stage);
/* The block the next pkv_block_alloc takes (PKV_NONE: none), and the one the
 * allocation after the one taking b takes, as long as nothing else changes the
 * free list or the policy's lists: for prefetching a run of allocations ahead. */
uint32_t pkv_alloc_order_first(const pkv_cache *c);
uint32_t pkv_alloc_order_next(const pkv_cache *c, uint32_t b);
/* Prefetch what taking block b will touch, its record already loaded. */
void pkv_alloc_prefetch_block(const pkv_cache *c, uint32_t b);
/* A block loses one reference (before the count drops): under leaf-SLRU a reused
 * (so sealed) block marks its parent reused, so a parent is never on a lower level
 * than its cached children (evict.c). Inline: on every release's path. */
static inline void pkv_evict_on_release(pkv_cache *c, uint32_t b) {
    const pkv_block *x = &c->pool.b[b];
    if (pkv_unlikely(x->flags & BLKF_REUSED) && x->parent != PKV_NONE)
        c->pool.b[x->parent].flags |= BLKF_REUSED;
}
/* A sealed block's refcount dropped to 0 / rose from 0. */
void pkv_evict_on_unreferenced(pkv_cache *c, uint32_t b);
void pkv_evict_on_referenced(pkv_cache *c, uint32_t b);
/* The cached leaf to evict next, taken off the policy's list; PKV_NONE if none. */
uint32_t pkv_evict_victim(pkv_cache *c);
/* Rule D3: the LSN that must be safe before the next `k` victims' slots may be
 * rewritten, given the log's safe LSN `safe` (the caller reads it: the policy
 * does not reach into the log); 0 if none (seq.c ensure_blocks waits for it).
 * Inline: the usual answer, every cached block's release safe, reads one field;
 * the walk is not. */
uint64_t pkv_evict_wait_walk(const pkv_cache *c, uint64_t k, uint64_t safe);
static inline uint64_t pkv_evict_wait_lsn(const pkv_cache *c, uint64_t k, uint64_t safe) {
    /* (rel_lsn - 1 <= safe, written so that a recovered rel_lsn of 0 cannot wrap) */
    if (c->pool.pol.newest <= safe + 1) return 0;
    return pkv_evict_wait_walk(c, k, safe);
}
/* Recovery: put the cached blocks in the policy's order (d: depths). */
int pkv_evict_rebuild(pkv_cache *c, const uint32_t *d);

#endif /* PKV_INTERNAL_H */

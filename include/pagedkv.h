/*
 * pagedkv.h — a persistent, mmap-backed paged KV cache for LLM inference.
 *
 * The whole public API. Conventions:
 *  - Handles are opaque. Every function that can fail returns 0 or a negative
 *    PKV_E* code; pkv_strerror() explains a code and pkv_last_error() gives the
 *    detailed message of the last failure on the calling thread.
 *  - The caller owns every buffer it passes in; pagedkv never keeps a pointer to
 *    one after the call returns (except pkv_options.io, the I/O backend, which
 *    must outlive the handle).
 *  - Token ids are uint32_t; sequence ids are caller-chosen uint64_t.
 *  - A pkv_cache may be used from several threads at once: every call takes the
 *    cache's internal lock, except pkv_kv() and pkv_info(), which read only
 *    immutable geometry, and pkv_close(), which must not run concurrently with any
 *    other call on the same handle. Writing K/V into appended slots needs no lock
 *    (each slot belongs to exactly one sequence until it is committed).
 *  - "Errors:" lists the codes a call returns (docs/api.md says when). The
 *    mutating calls (pkv_seq_open, _append, _commit, _commit_append, _step_batch,
 *    _fork, _truncate, _close) can all also return PKV_ERDONLY (read-only handle),
 *    PKV_EFAILED (the cache failed; reopen), PKV_ENOMEM (the log buffer cannot
 *    grow) and PKV_ERANGE (their log records would exceed 256 MiB); "mutating" in
 *    an Errors: line stands for these four. Argument checks come first, then
 *    PKV_ERDONLY, then PKV_EFAILED, then the errors that depend on the contents.
 *  - "Blocks:" says what a call may wait for. "lock": the cache's lock, which
 *    other calls hold briefly (longest: a commit checksumming the blocks it seals,
 *    pkv_check, a checkpoint's snapshot slice). "log": the log flusher, with the
 *    lock released -- every mutating call first waits while 8 MiB of records (or
 *    half a log segment) are unflushed (backpressure), and under
 *    PKV_DURABLE_ALWAYS returns only once its records are durable (a log write and
 *    fdatasync). "I/O": file I/O in the call itself. "never": returns without
 *    waiting for anything.
 *
 * Arena layout (see docs/design.md): one file "arena" in the cache directory; a
 * 4096-byte header page, then `capacity` block slots, each rounded up to the page
 * size. Inside a slot the payload is laid out [layer][K|V][kv_head][token][head_dim],
 * so the run of one (layer, kind, head) is block_size * head_dim contiguous elements.
 */
#ifndef PAGEDKV_H
#define PAGEDKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared in this header is the library's exported interface; the
 * library is built with hidden visibility, so nothing else is exported. */
#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility push(default)
#endif

/* The version of this header; pkv_version() gives the library's. The major
 * version is the shared library's soname (libpagedkv.so.MAJOR): it changes when
 * the ABI does. The on-disk format has a version of its own (docs/format.md). */
#define PKV_VERSION_MAJOR 0
#define PKV_VERSION_MINOR 1
#define PKV_VERSION_PATCH 0
#define PKV_VERSION_STRING "0.1.0"

/* The library's version as "MAJOR.MINOR.PATCH"; each pointer may be NULL. Never
 * fails, never blocks. */
const char *pkv_version(int *major, int *minor, int *patch);

/* ---- Errors ------------------------------------------------------------- */

/* Error codes lie in [PKV_ERR_LAST, PKV_ERR_FIRST], a range of their own: an I/O
 * backend (pkv_io_ops) returns -errno values in [-4095, -1], and neither range
 * meets the other, so a code says unambiguously which one it is. */
#define PKV_ERR_FIRST (-31001)
#define PKV_ERR_LAST  (-31018)
enum {
    PKV_OK        =      0,
    PKV_EINVAL    = -31001, /* bad argument (NULL, zero or out-of-range value)      */
    PKV_ENOMEM    = -31002, /* host memory allocation failed                         */
    PKV_EFULL     = -31003, /* no free block and nothing evictable; cache unchanged  */
    PKV_ENOSEQ    = -31004, /* unknown sequence id                                    */
    PKV_EEXIST    = -31005, /* sequence id already in use                             */
    PKV_ERANGE    = -31006, /* index out of range, output buffer too small, or a log
                                 record of the call would exceed 256 MiB (a table of
                                 ~67M blocks); nothing changed                        */
    PKV_ESTATE    = -31007, /* call not valid in the sequence's current state         */
    PKV_EIO       = -31008, /* an operating-system I/O call failed                    */
    PKV_ENOSPC    = -31009, /* no space left on the device                            */
    PKV_EGEOMETRY = -31010, /* on-disk geometry differs from the requested one        */
    PKV_EMODEL    = -31011, /* on-disk model identity differs from the requested one  */
    PKV_ECORRUPT  = -31012, /* a file or an in-memory invariant is corrupted          */
    PKV_EBUSY     = -31013, /* the cache directory is open elsewhere (LOCK is held);
                                 pkv_connect: pkvd is at its --max-clients         */
    PKV_EVERSION  = -31014, /* on-disk format version not supported;
                                 pkv_connect: pkvd speaks another protocol version */
    PKV_ENOTSUP   = -31015, /* feature not supported by this build or this file       */
    PKV_ERDONLY   = -31016, /* mutating call on a cache opened read-only              */
    PKV_EFAILED   = -31017, /* the cache hit an I/O error and refuses changes; reopen */
    PKV_EDISCONNECTED = -31018, /* a connected handle (pkv_connect) lost its daemon:
                                   every later call fails too; pkv_close it and
                                   connect again */
};

/* Static description of an error code ("unknown error" for unknown codes). Never
 * fails, never blocks. */
const char *pkv_strerror(int err);

/* Detailed message of the last failing call on this thread ("" if none). The
 * string stays valid until the next pagedkv call on the same thread. Never fails,
 * never blocks. */
const char *pkv_last_error(void);

/* ---- Opening and closing ------------------------------------------------ */

typedef enum pkv_dtype {
    PKV_F32  = 0,
    PKV_F16  = 1,
    PKV_BF16 = 2,
} pkv_dtype;

typedef enum pkv_kind { PKV_K = 0, PKV_V = 1 } pkv_kind;

/* When a mutation becomes durable (survives a crash or power loss). */
typedef enum pkv_durability {
    PKV_DURABLE_GROUP  = 0, /* default: a background flusher makes every mutation
                               durable within group_commit_us (one fdatasync per
                               group) */
    PKV_DURABLE_NONE   = 1, /* the log is handed to the OS within group_commit_us and
                               synced only by pkv_sync(), checkpoints, pkv_close()
                               and when a log segment is full (each of these syncs
                               the arena first): survives a process crash; a power
                               loss keeps only what was synced */
    PKV_DURABLE_ALWAYS = 2, /* each mutating call returns once durable (concurrent
                               callers still share fdatasyncs) */
} pkv_durability;

/* pkv_options.eviction: which cached block (sealed, unreferenced) an allocation
 * evicts when no block is free. Both only ever evict a leaf (a block with no
 * cached extension) and are O(1) per operation. Chosen at each open, not stored:
 * a reopen may choose another; the order of the recovered cached blocks is the
 * same for both (least recently released first, every block unprotected). */
typedef enum pkv_eviction {
    PKV_EVICT_LEAF_LRU = 0,  /* the least recently released leaf (the default) */
    PKV_EVICT_LEAF_SLRU = 1  /* segmented LRU: a block hit again while cached (or
                                the prefix of one) is protected and evicted only
                                when no unprotected block is left; protected blocks
                                fill at most evict_protect_pct of the capacity, the
                                least recent beyond that lose their protection.
                                Resists scans of one-time prompts; see
                                docs/benchmarks.md for when it helps */
} pkv_eviction;

/* pkv_options.flags */
#define PKV_OPEN_RDONLY        0x1u /* inspect only: no lock, no writes, no changes */
#define PKV_OPEN_POINT_IN_TIME 0x2u /* on a corrupted log record followed by valid
                                       ones, recover up to it instead of failing */
#define PKV_OPEN_PREFAULT      0x4u /* populate the whole arena mapping at open
                                       (MAP_POPULATE), so first touches of block
                                       slots do not page-fault later */
#define PKV_OPEN_NO_LIMBO_WAIT 0x8u /* the default since 2026-12-02 (accepted,
                                       no effect): an allocation short of free
                                       blocks evicts cached ones rather than wait
                                       for the log to release freed blocks from
                                       limbo; it waits only for what eviction
                                       cannot supply, and before evicting a block
                                       sealed after a commit named it open, until
                                       that seal is safe (docs/format.md, rule D3) */
#define PKV_OPEN_FULL_CHECKPOINTS 0x10u /* every checkpoint full, no delta files
                                       (so builds before deltas can open the
                                       directory; each checkpoint then costs the
                                       whole metadata) */
#define PKV_OPEN_LIMBO_WAIT    0x20u /* the former default: an allocation short of
                                       free blocks first waits for the log to
                                       release freed blocks from limbo, and evicts
                                       only then, so which blocks are evicted never
                                       depends on flush timing (deterministic
                                       replays: bench/pkv-trace's simulator check).
                                       Costs a log write (an fdatasync in GROUP
                                       mode) on the first allocation after most
                                       closes on a full cache. Not with
                                       PKV_OPEN_NO_LIMBO_WAIT */

struct pkv_io_ops; /* I/O backend for log and checkpoint files (testing) */

#define PKV_MODEL_ID_MAX   255u  /* bytes, excluding the terminating NUL */
#define PKV_BLOCK_SIZE_MAX 1024u /* tokens per block */

typedef struct pkv_options {
    uint32_t num_layers;   /* 1..4096 */
    uint32_t num_kv_heads; /* 1..4096 */
    uint32_t head_dim;     /* 1..65536 */
    uint32_t block_size;   /* tokens per block, 1..PKV_BLOCK_SIZE_MAX */
    pkv_dtype dtype;
    uint64_t capacity;     /* blocks in the arena, > 0 (2^31 at most); on reopen 0
                              means "as stored" */
    const char *model_id;  /* model + tokenizer identity, 1..PKV_MODEL_ID_MAX bytes */
    pkv_durability durability;
    uint32_t group_commit_us;  /* bound on group-commit delay; 0 = 2000 (2 ms) */
    uint64_t checkpoint_bytes; /* checkpoint when the log grows past this; 0 = adaptive:
                                  64 MiB or the newest snapshot's size, the larger */
    uint32_t flags;            /* PKV_OPEN_* */
    const struct pkv_io_ops *io; /* NULL = the default (io_uring) backend */
    const char *arena_dir; /* NULL = the arena file lives in the cache directory.
                              Else it is created in this directory (e.g. on tmpfs, so
                              the CUDA layer can register it) and `dir`/arena is a
                              symbolic link to it; the log stays in `dir`. Reopens
                              must pass the same directory (docs/api.md). */
    uint32_t seal_threads; /* 0 or 1: the calling thread checksums the blocks it seals.
                              N (at most 64): a pkv_seq_step_batch call, and a commit
                              that seals 2+ blocks, checksum them on up to N threads,
                              the caller's included (blocks of 256 KiB or more) */
    uint64_t log_segment_bytes; /* size of each new log segment file, preallocated;
                              0 = 32 MiB. PKV_LOG_SEGMENT_MIN..PKV_LOG_SEGMENT_MAX.
                              Per open, not stored: each segment records its own
                              size, so a reopen may use another value (a frame
                              larger than a segment gets a segment of its own) */
    pkv_eviction eviction; /* PKV_EVICT_*; 0 = PKV_EVICT_LEAF_LRU. Per open, not
                              stored. Another value: PKV_EINVAL */
    uint32_t evict_protect_pct; /* PKV_EVICT_LEAF_SLRU: the most blocks protected,
                              in percent of the capacity, 1..100; 0 = 50. Above
                              100: PKV_EINVAL. Ignored by PKV_EVICT_LEAF_LRU */
} pkv_options;

#define PKV_LOG_SEGMENT_MIN (1ull << 20) /* 1 MiB */
#define PKV_LOG_SEGMENT_MAX (16ull << 30) /* 16 GiB: the most recovery reads */

typedef struct pkv_cache pkv_cache;

/* Fill `opt` with defaults (dtype f16, block_size 16); the caller
 * must still set the geometry, capacity and model_id. NULL is ignored. Never
 * blocks. */
void pkv_options_init(pkv_options *opt);

/* Create the cache directory `dir` (mode 0700) and its arena file (mode 0600) or
 * open an existing one. A writable open fdatasyncs the arena and the recovered log
 * before it counts the recovered records durable (a NONE-mode writer that crashed
 * may have left them in the page cache only). On reopen the stored model identity
 * and geometry must equal `opt`'s, else PKV_EMODEL (checked first: another model
 * whatever its sizes) / PKV_EGEOMETRY, and nothing on disk changes.
 * The arena is preallocated, so a full disk fails here with PKV_ENOSPC. A second
 * writable open of the same directory, in this or another process, fails with
 * PKV_EBUSY (PKV_OPEN_RDONLY opens take no lock). On failure *out is NULL.
 * Errors: PKV_EINVAL (bad options or dir, found before anything is created; an
 * arena_dir that does not match dir/arena), PKV_EBUSY, PKV_EGEOMETRY, PKV_EMODEL,
 * PKV_ECORRUPT, PKV_EVERSION, PKV_ENOSPC, PKV_EIO, PKV_ENOMEM, PKV_EFAILED (the
 * repair checkpoint hit an I/O error).
 * Blocks: I/O (creates and preallocates the arena, loads the checkpoint, replays
 * the log, fdatasyncs, may write a repair checkpoint); never waits for another
 * writer (PKV_EBUSY instead). */
int pkv_open(const char *dir, const pkv_options *opt, pkv_cache **out);

/* Connect to the pkvd daemon listening on the Unix socket `socket_path` (docs/pkvd.md)
 * and return a handle on which the sequence calls, pkv_prefix_lookup,
 * pkv_get_stats, pkv_sync, pkv_info, pkv_kv and pkv_kv_view_of behave as
 * documented for a handle of pkv_open, the daemon's cache (its geometry and
 * durability mode); the arena file is mapped into this process, so pkv_kv
 * addresses are this process's own and K/V never crosses the socket. Each call is
 * one round trip (pkv_seq_step_batch: one per batch); the handle's calls are
 * serialized by a mutex of its own. Sequences belong to the connection: pkvd
 * closes them when the handle is closed or the process dies, not before (even
 * after PKV_EDISCONNECTED the handle's blocks stay held until pkv_close, which
 * unmaps the arena before it closes the socket), and a restarted pkvd waits for
 * the handles of the one before to be closed (docs/pkvd.md, rules W1, W3). pkv_check,
 * pkv_checkpoint, pkv_get_recovery, pkv_seq_list, the inspection API and
 * pkv_cuda_open return PKV_ENOTSUP on it. Once the daemon is gone every call
 * returns PKV_EDISCONNECTED (pkv_close the handle, connect again); pointers from
 * pkv_kv must not be read after that. At most 4 Mi tokens per call, 2 Mi appended
 * tokens per append (PKV_ERANGE).
 * Errors: PKV_EINVAL (NULL or too long a path, out NULL), PKV_EDISCONNECTED (no
 * daemon, or it closed the connection), PKV_EBUSY (the daemon serves its
 * --max-clients connections already), PKV_EVERSION (a pkvd of another pagedkv
 * release: its protocol version differs, the message says "protocol version X,
 * expected Y"; nothing of its reply is parsed), PKV_EGEOMETRY (a geometry this library
 * derives differently), PKV_ECORRUPT (the arena file is short), PKV_ENOMEM,
 * PKV_EIO. On failure *out is NULL.
 * Blocks: connects and waits for the daemon's first reply; maps the arena. */
int pkv_connect(const char *socket_path, pkv_cache **out);

/* pkv_connect for a reader: pkvd passes the arena opened O_RDONLY, mapped here
 * PROT_READ, so this process cannot write K/V (a store through pkv_kv faults; a
 * writable mapping of the descriptor fails). pkv_prefix_lookup, pkv_seq_open
 * (attaching cached blocks), pkv_seq_close, pkv_seq_get_info, pkv_seq_blocks,
 * pkv_seq_tokens, pkv_get_stats, pkv_info and pkv_kv work; append,
 * commit, commit_append, step_batch, fork, truncate and pkv_sync return
 * PKV_ERDONLY (from the daemon, which enforces it). A plain pkv_connect from a uid
 * that pkvd names with --allow-uid-ro gets the same read-only handle.
 * Errors and blocking: as pkv_connect. */
int pkv_connect_rdonly(const char *socket_path, pkv_cache **out);

/* Unmap and close. Every pointer returned by pkv_kv() becomes invalid. NULL is fine.
 * Cannot fail: an I/O error of its last flush is lost, as in a crash. Blocks: log
 * and I/O (a last group commit, synced in every mode; a checkpoint if one is
 * due), then joins the background threads. */
void pkv_close(pkv_cache *cache);

/* ---- Geometry and payload addresses ------------------------------------- */

typedef struct pkv_cache_info {
    uint32_t num_layers, num_kv_heads, head_dim, block_size;
    pkv_dtype dtype;
    uint32_t elem_size;   /* bytes per element: 4, 2 or 2 */
    uint64_t capacity;    /* blocks */
    uint64_t block_bytes; /* payload bytes of one block (all layers, K and V) */
    uint64_t slot_bytes;  /* the slots' stride: block_bytes rounded up to the page
                             size, or (blocks <= 2 KiB, arenas created since
                             2026-12-06) a power of two >= max(64, block_bytes) */
    uint64_t run_bytes;   /* bytes of one (layer, kind, head) run: block_size*head_dim*elem */
    char model_id[PKV_MODEL_ID_MAX + 1];
} pkv_cache_info;

/* Errors: PKV_EINVAL (cache or out NULL). Blocks: never (no lock). */
int pkv_info(const pkv_cache *cache, pkv_cache_info *out);

/* Address of the contiguous run [token][head_dim] of (block, layer, kind, head)
 * inside the mapped arena, or NULL if an argument is out of range. Valid until
 * pkv_close(). Its bytes are stable while the block is referenced; once a block is
 * freed or evicted the slot may be reused for other K/V. Writing to a sealed block,
 * or to a slot pkv_seq_append() did not hand out, is undefined. Blocks: never (no
 * lock, pure address arithmetic). */
void *pkv_kv(const pkv_cache *cache, uint32_t block, uint32_t layer, pkv_kind kind,
             uint32_t head);

/* ---- Sequences ---------------------------------------------------------- */

/* Where one appended token's K/V goes: token `offset` of physical `block`. */
typedef struct pkv_slot {
    uint32_t block;
    uint32_t offset;
} pkv_slot;

/* Create sequence `id` and attach the longest cached prefix of `prompt` made of
 * full blocks, capped at the largest multiple of block_size <= n-1 so the last
 * prompt token is always computed. `*n_cached` (may be NULL) receives the number
 * of prompt tokens already cached; the new sequence holds exactly those tokens,
 * committed. The caller then appends prompt[*n_cached..n). n may be 0 (an empty
 * sequence; prompt may then be NULL). Sequences with different `salt` never share
 * a block (salt 0 is the default trust domain).
 * Errors: mutating, PKV_EINVAL (cache NULL, or prompt NULL with n > 0),
 * PKV_EEXIST, PKV_ENOMEM (the sequence). Never PKV_EFULL: it takes no block
 * (with a shared tier attached, blocks imported from it are taken like an
 * append's; when none can be had nothing is imported and the call succeeds).
 * Blocks: lock, log; reads the payload of a recovered block it hits first (its
 * checksum). With a shared tier (pkv_tier_attach) and a local miss: network
 * I/O up to fetch_deadline_ms without the lock, then the import under it. */
int pkv_seq_open(pkv_cache *cache, uint64_t id, uint64_t salt, const uint32_t *prompt,
                 size_t n, size_t *n_cached);

/* How many tokens of `prompt` a pkv_seq_open(cache, id, salt, prompt, n, ...) made
 * in its place would attach: the same prompt cap (a multiple of block_size, at
 * most n-1), the same exact match under `salt`, the same payload check of a
 * recovered block (rules S1, S2 of docs/format.md). Side-effect free: attaches
 * nothing, leaves the eviction order (LRU recency, SLRU protection), every
 * pkv_stats counter and the log as they were, so it may be called any number of
 * times per request. Works on read-only handles (answering for the state
 * recovered at their open) and on failed caches. The answer is advice: blocks
 * may be evicted before a later pkv_seq_open, whose *n_cached is what counts.
 * A recovered block it reaches is checksummed; a pass is remembered (later
 * lookups and opens do not checksum it again), a failure ends the count and is
 * left for pkv_seq_open to record (BAD, verify_failures, log).
 * With a shared tier attached with PKV_TIER_LOOKUP, a local miss also asks the
 * tier which blocks of the chain's continuation it holds (EXISTS of their keys,
 * at most fetch_max_blocks, within fetch_deadline_ms, without the lock) and
 * adds those in a row: what the open's fetch would import if every record
 * passed rule T1. Still side-effect free on the cache (nothing is read,
 * imported or evicted); only the tier_lookup* (and, for lost probes,
 * tier_errors, tier_deadline_misses, tier_redirects) counters move. That part
 * is a promise the open may not keep (a value failing verification, an
 * expiry): the open then attaches less and computes the rest. A pkv_connect
 * handle's lookup runs in pkvd, so it asks pkvd's tier (pkvd --tier-lookup).
 * *n_cached is 0 on error.
 * Errors: PKV_EINVAL (cache, prompt or n_cached NULL; n == 0).
 * Blocks: lock; reads the payload of a recovered block it reaches first; with
 * PKV_TIER_LOOKUP and a local miss, network I/O up to fetch_deadline_ms
 * without the lock. */
int pkv_prefix_lookup(pkv_cache *cache, uint64_t salt, const uint32_t *prompt, size_t n,
                      size_t *n_cached);

/* Reserve room for n > 0 new tokens after the sequence's current end and write, for
 * each, its slot to slots[0..n) (the caller's array). If the last block is shared it
 * is first copied (copy-on-write). All-or-nothing: on PKV_EFULL nothing changed.
 * Appends may be repeated before a commit; they accumulate as pending tokens.
 * Errors: mutating, PKV_EINVAL (cache, tokens or slots NULL; n == 0),
 * PKV_ENOSEQ, PKV_EFULL (also n > capacity * block_size, or a table past 2^32
 * entries), PKV_ENOMEM (the block table).
 * Blocks: lock, log; short of free blocks it evicts cached ones, and waits for the
 * log only for freed blocks in limbo that eviction cannot replace (with
 * PKV_OPEN_LIMBO_WAIT: for every limbo block it takes, before evicting), and
 * before evicting a block whose SEAL, or the truncation that released it, is not
 * yet safe (rule D3). */
int pkv_seq_append(pkv_cache *cache, uint64_t id, const uint32_t *tokens, size_t n,
                   pkv_slot *slots);

/* Declare the K/V of the next n > 0 pending tokens written. Each block that becomes
 * full is sealed: immutable, hashed and entered in the prefix index; if an identical
 * sealed block exists the sequence switches to it and frees its own copy (dedupe).
 * Errors: mutating, PKV_EINVAL (cache NULL, n == 0), PKV_ENOSEQ, PKV_ESTATE (n
 * exceeds the pending tokens). Takes no block, so never PKV_EFULL.
 * Blocks: lock (held while it checksums the blocks it seals), log. */
int pkv_seq_commit(pkv_cache *cache, uint64_t id, size_t n);

/* A decode step in one call (one lock acquisition instead of two): commit the next
 * n_commit pending tokens (as pkv_seq_commit; 0: commit nothing), then append n
 * tokens (as pkv_seq_append, slots to slots[0..n); 0: append nothing, tokens and
 * slots may then be NULL). A decoder that has written the K/V of its last token
 * calls pkv_seq_commit_append(c, id, 1, &next, 1, &slot). All-or-nothing: on any
 * error nothing changed, with one exception (as for every mutating call): under
 * PKV_DURABLE_ALWAYS, PKV_EFAILED returned because the cache failed while the call
 * waited for its records to become durable means the commit and append were
 * applied in memory (the slots are set) but are not durable and are gone after the
 * reopen; a call that finds the cache already failed changes nothing. When the append takes new blocks it needs one more
 * obtainable block per block the commit seals (a seal that dedupes takes a cached
 * block off the LRU), so with a cache that full it fails with PKV_EFULL where the
 * two separate calls might succeed.
 * Errors: mutating, PKV_EINVAL (cache NULL; both counts 0; n > 0 with tokens or
 * slots NULL), PKV_ENOSEQ, PKV_ESTATE, PKV_EFULL, PKV_ENOMEM (the block table).
 * Blocks: as pkv_seq_append (lock, log, limbo and rule D3 waits). */
int pkv_seq_commit_append(pkv_cache *cache, uint64_t id, size_t n_commit,
                          const uint32_t *tokens, size_t n, pkv_slot *slots);

/* One sequence's part of a batched decode step (pkv_seq_step_batch). */
typedef struct pkv_step {
    uint64_t id;       /* the sequence */
    uint32_t n_commit; /* pending tokens to commit first, as pkv_seq_commit (0: none) */
    uint32_t token;    /* the token to append after the commit */
    pkv_slot slot;     /* out: where that token's K/V goes */
} pkv_step;

/* A decode step for a batch of sequences in one call: for i = 0, 1, ... n-1 in order,
 * pkv_seq_commit_append(cache, steps[i].id, steps[i].n_commit, &steps[i].token, 1,
 * &steps[i].slot), under one lock acquisition. Each step is all-or-nothing; the
 * batch stops at the first step that fails and returns that error, with *done (may
 * be NULL) the number of steps carried out: steps [0, *done) took effect and have
 * their slots, steps [*done, n) changed nothing. Name a sequence at most once per
 * batch. Under PKV_DURABLE_ALWAYS it waits once, after the last step; if the cache
 * fails during that wait it returns PKV_EFAILED (unless a step failed first: that
 * error) with *done still the steps carried out, which took effect in memory but
 * are not durable.
 * Errors: mutating, PKV_EINVAL (cache or steps NULL, n == 0; *done = 0), else
 * the first failing step's, as pkv_seq_commit_append.
 * Blocks: lock (once; released while a step waits for the log), log
 * (backpressure before each step, limbo and rule D3 waits, one ALWAYS wait at
 * the end); with
 * seal_threads > 1, starts and joins checksum threads. */
int pkv_seq_step_batch(pkv_cache *cache, pkv_step *steps, size_t n, size_t *done);

/* Create sequence `child` sharing every block of `parent`, the partial last block
 * included, with the parent's salt. The parent must have no pending tokens
 * (PKV_ESTATE otherwise).
 * Errors: mutating, PKV_EINVAL (cache NULL), PKV_ENOSEQ (no parent), PKV_EEXIST
 * (child exists, also child == parent), PKV_ESTATE, PKV_ENOMEM (the sequence).
 * Blocks: lock, log. */
int pkv_seq_fork(pkv_cache *cache, uint64_t parent, uint64_t child);

/* Drop tokens from the end so the sequence holds new_len <= its length (pending
 * tokens count). The block cut by new_len (new_len not a multiple of block_size) is
 * copied, never changed in place, when it is shared, sealed, or loses committed
 * tokens (the log may name them until the truncation is durable); cutting only
 * pending tokens copies nothing. A copy needs a block, so this can fail with
 * PKV_EFULL (and then changes nothing).
 * Errors: mutating, PKV_EINVAL (cache NULL), PKV_ENOSEQ, PKV_ERANGE (new_len
 * above the length), PKV_EFULL.
 * Blocks: lock, log; a copy may wait for limbo or rule D3 as pkv_seq_append does. */
int pkv_seq_truncate(pkv_cache *cache, uint64_t id, size_t new_len);

/* Release the sequence. Its sealed blocks whose refcount drops to 0 stay cached
 * and become evictable; its other blocks return to the free list.
 * Errors: mutating, PKV_EINVAL (cache NULL), PKV_ENOSEQ. Blocks: lock, log. */
int pkv_seq_close(pkv_cache *cache, uint64_t id);

typedef struct pkv_seq_info {
    uint64_t len;       /* tokens, pending included */
    uint64_t committed; /* tokens whose K/V is committed */
    uint64_t n_blocks;  /* entries in the block table */
    uint64_t salt;
} pkv_seq_info;

/* Errors: PKV_EINVAL (cache or out NULL), PKV_ENOSEQ; *out untouched on error.
 * Blocks: lock. */
int pkv_seq_get_info(pkv_cache *cache, uint64_t id, pkv_seq_info *out);

/* Copy the block table (cap entries at most) to out; *n (may be NULL) receives its
 * length. PKV_ERANGE when cap is too small (the first cap entries are copied).
 * Errors: PKV_EINVAL (cache NULL, out NULL with cap > 0), PKV_ENOSEQ, PKV_ERANGE.
 * Blocks: lock. */
int pkv_seq_blocks(pkv_cache *cache, uint64_t id, uint32_t *out, size_t cap, size_t *n);

/* Same for the sequence's token ids (pending tokens included); same errors. */
int pkv_seq_tokens(pkv_cache *cache, uint64_t id, uint32_t *out, size_t cap, size_t *n);

/* ---- Introspection ------------------------------------------------------ */

typedef struct pkv_stats {
    uint64_t capacity;
    uint64_t blocks_free;   /* free: on the free list, or in limbo until the log
                               record that freed them is durable */
    uint64_t blocks_cached; /* sealed, refcount 0: evictable in leaf order */
    uint64_t blocks_used;   /* refcount > 0 */
    uint64_t blocks_sealed; /* in the prefix index (cached + used sealed) */
    uint64_t sequences;
    uint64_t hit_tokens, miss_tokens; /* over all pkv_seq_open calls */
    uint64_t hit_blocks, miss_blocks; /* full prompt blocks found / not found */
    uint64_t evictions;
    uint64_t cow_copies;  /* blocks copied by append or truncate */
    uint64_t dedupes;     /* sealed blocks replaced by an identical cached one */
    uint64_t seals;
    uint64_t verify_failures; /* recovered blocks whose payload checksum failed */
    /* write-ahead log */
    uint64_t wal_records;     /* records appended since open */
    uint64_t wal_frames;      /* group writes issued */
    uint64_t wal_syncs;       /* fdatasync calls on the log */
    uint64_t wal_bytes;       /* bytes written to the log since open */
    uint64_t last_lsn;        /* last LSN assigned */
    uint64_t durable_lsn;     /* every record up to this LSN is durable */
    uint64_t checkpoints;     /* checkpoints written since open, deltas included */
    uint64_t checkpoint_deltas; /* of which delta checkpoints (changed blocks only) */
    uint64_t checkpoint_lsn;  /* LSN covered by the newest checkpoint */
    /* CUDA layer */
    uint32_t cuda_handles;    /* pkv_cuda handles open on this cache */
    uint32_t cuda_mode;       /* pkv_cuda_mode of the newest open handle (how the
                                 GPU reaches the arena); 0 = none open */
    uint64_t seal_sums_ahead; /* seal checksums computed ahead on seal_threads (a
                                 batch's, a multi-block commit's), since open */
    uint64_t wal_max_delay_us; /* longest wait of a record from its append until it
                                  was durable (the first record of each group
                                  commit), since open; 0 in NONE mode */
    /* Failed checkpoints. A checkpoint that runs out of space (or quota) writing
     * or syncing its temporary file, or out of memory, is discarded and the cache
     * keeps serving from the log; automatic attempts then back off. (An EIO, a
     * failure at the rename, or one of the log fails the cache.) */
    uint64_t checkpoint_failures;    /* discarded checkpoint attempts since open */
    int32_t checkpoint_error;        /* the latest attempt's error (PKV_ENOSPC or
                                        PKV_ENOMEM), 0 if it succeeded or none was
                                        made */
    uint32_t checkpoint_backoff_ms;  /* after failures: the delay before the next
                                        automatic attempt (1 s doubling to 60 s);
                                        0 when the latest attempt succeeded */
    /* Waits for the log inside mutating calls, since open (each a wait with the
     * lock released until the log's safe LSN reached what the call needed):
     * an allocation waiting for limbo blocks (rule D2 of docs/format.md), an
     * allocation waiting before it evicts a block whose SEAL, or the truncation
     * that released it, is not yet safe (rule D3), a call held back while the log's buffer is over its backlog.
     * Their total wall time in microseconds. */
    uint64_t waits_limbo, waits_seal, waits_backlog;
    uint64_t wait_limbo_us, wait_seal_us, wait_backlog_us;
    /* The most blocks in limbo at once when an allocation evicted, since open:
     * a cache that waited for limbo instead (PKV_OPEN_LIMBO_WAIT) would hold at
     * most this many more cached blocks at any time (docs/design.md, "Free
     * list, limbo"); 0 with PKV_OPEN_LIMBO_WAIT. */
    uint64_t limbo_evict_max;
    uint64_t blocks_limbo; /* of blocks_free, those in limbo now (the flusher moves
                              them to the free list once their freeing record is
                              safe) */
    /* The shared prefix tier (pkv_tier_attach, docs/remote.md), since attach; all
     * 0 without one. */
    uint64_t tier_published;      /* blocks written to the tier (SET answered OK) */
    uint64_t tier_publish_dropped; /* seals (or, with PKV_TIER_PUBLISH_ON_HIT,
                                      first hits) not published: queue full, block
                                      gone before it was copied, or policy depth */
    uint64_t tier_publish_errors; /* SETs that failed (error reply, I/O, timeout) */
    uint64_t tier_fetches;        /* pkv_seq_open calls that asked the tier */
    uint64_t tier_fetch_blocks;   /* records requested (GETs) */
    uint64_t tier_fetch_found;    /* of which answered with a value in time */
    uint64_t tier_imported;       /* verified records imported as sealed blocks */
    uint64_t tier_rejected;       /* values that failed verification (rule T1):
                                     never imported */
    uint64_t tier_errors;         /* GETs (and lookup probes) lost to errors,
                                     timeouts, nodes down */
    uint64_t tier_deadline_misses; /* fetches (and lookup probes) that reached
                                      their deadline */
    uint64_t tier_redirects;      /* MOVED and ASK answers followed */
    uint64_t tier_deleted;        /* rejected values deleted from the tier (the
                                     server still held the same bytes) */
    uint64_t tier_delete_failed;  /* rejected values whose deletion was dropped
                                     (queue full) or failed (error reply, I/O) */
    /* pkv_prefix_lookup asking the tier (PKV_TIER_LOOKUP), since attach. Its
     * lost probes count in tier_errors, its deadlines in tier_deadline_misses. */
    uint64_t tier_lookups;        /* lookups that asked the tier (a local miss) */
    uint64_t tier_lookup_blocks;  /* keys probed (EXISTS) */
    uint64_t tier_lookup_found;   /* of which existed in time */
} pkv_stats;

/* Errors: PKV_EINVAL (cache or out NULL). Blocks: lock. */
int pkv_get_stats(pkv_cache *cache, pkv_stats *out);

/* Verify every invariant (refcounts equal block-table references, free + cached +
 * used = capacity, lists, prefix index, child counts, chained hashes, block tables).
 * Returns 0, or PKV_ECORRUPT with the first broken invariant named in why[0..why_len)
 * (why may be NULL). Rehashes every sealed block: O(capacity * block_size + total
 * block-table length). Errors: PKV_EINVAL (cache NULL), PKV_ENOMEM (scratch),
 * PKV_ECORRUPT. Blocks: lock, held for the whole walk. */
int pkv_check(pkv_cache *cache, char *why, size_t why_len);

/* ---- Durability and recovery -------------------------------------------- */

/* Barrier: returns once every mutation made before the call is durable (arena
 * payload flushed, log records synced), in every durability mode.
 * Errors: PKV_EINVAL (cache NULL), PKV_ERDONLY, PKV_EFAILED.
 * Blocks: lock, log (an arena and a log fdatasync, with the lock released). */
int pkv_sync(pkv_cache *cache);

/* Write a checkpoint now (LZ4-compressed snapshot of all metadata, atomically
 * renamed into place) and recycle the log segments it covers. PKV_ENOSPC (no
 * space or quota for the checkpoint file) or PKV_ENOMEM: the checkpoint was
 * discarded and the cache keeps serving from the log (pkv_get_stats counts it; retry
 * later). PKV_EFAILED: the cache failed (an I/O error, also of the checkpoint).
 * Errors: PKV_EINVAL (cache NULL), PKV_ERDONLY, PKV_EFAILED, PKV_ENOSPC,
 * PKV_ENOMEM. Blocks: lock (per snapshot slice), log (the snapshot's records
 * made durable), I/O (the checkpoint thread writes and renames the file; the
 * call waits for it). */
int pkv_checkpoint(pkv_cache *cache);

/* The ids of all open sequences, recovered ones included (cap entries at most);
 * *n (may be NULL) receives their number. PKV_ERANGE when cap is too small.
 * Errors: PKV_EINVAL (cache NULL, ids NULL with cap > 0), PKV_ERANGE.
 * Blocks: lock. */
int pkv_seq_list(pkv_cache *cache, uint64_t *ids, size_t cap, size_t *n);

/* What the last pkv_open recovered. */
typedef struct pkv_recovery {
    uint64_t checkpoint_lsn;     /* 0: no checkpoint */
    uint64_t checkpoint_deltas;  /* delta checkpoints applied on the full one */
    uint64_t records_replayed;   /* log records applied after the checkpoint */
    uint64_t last_lsn;           /* last valid LSN found */
    uint64_t torn_bytes;         /* bytes of torn log tail cut off */
    uint64_t corrupt_lsn;        /* point-in-time recovery stopped before this LSN */
    uint64_t blocks_sealed;      /* sealed blocks recovered */
    uint64_t sequences;          /* sequences recovered */
    uint64_t blocks_dropped;     /* dropped: arena lost, replaced or short */
    uint64_t sequences_dropped;
    uint64_t seq_blocks_bad;     /* sealed blocks of sequences failing verification */
    uint64_t sequences_cut;      /* sequences shortened: a block they held was lost
                                    or failed verification */
    int repaired;                /* nonzero: damage was repaired and a checkpoint
                                    written at open (read-only: not written) */
    double ms_checkpoint, ms_replay, ms_rebuild, ms_verify; /* time split */
    char note[256];              /* what happened, for humans ("" if nothing odd) */
} pkv_recovery;

/* Errors: PKV_EINVAL (cache or out NULL). Blocks: lock. */
int pkv_get_recovery(pkv_cache *cache, pkv_recovery *out);

/* ---- Metrics (src/metrics.c, src/metrics_http.c, docs/metrics.md) ------- */

/* The cache's metrics in the Prometheus text exposition format 0.0.4: every
 * family named pagedkv_*, with # HELP and # TYPE lines, counters ending in
 * _total, units in the names (_seconds, _bytes, _blocks). docs/metrics.md lists
 * them. The counters cover this open of the cache (they restart at 0 at each
 * pkv_open; Prometheus's rate() handles the reset); the recovery gauges describe
 * that open. The values are read under one hold of the cache lock, so they are
 * consistent with each other and with pkv_get_stats at that instant.
 * Writes the text and a terminating NUL to buf[0..cap); *needed (may be NULL)
 * receives the bytes that took or would take (text length + 1). Allocates
 * nothing; O(1) in the cache's size and sequences. The text's length changes
 * with the values (at most a few hundred bytes between calls), so a caller
 * sizing a buffer from *needed should add slack.
 * Errors: PKV_EINVAL (cache NULL; buf NULL with cap > 0), PKV_ERANGE (cap <
 * *needed: buf holds an empty string when cap > 0), PKV_ENOTSUP (a pkv_connect
 * handle: pkvd --metrics serves the cache's). Blocks: lock (a short copy). */
int pkv_metrics_text(pkv_cache *cache, char *buf, size_t cap, size_t *needed);

typedef struct pkv_metrics_server pkv_metrics_server;
struct pkv_cuda; /* pkv_cuda, the CUDA layer's handle (below) */

/* Serve GET /metrics (pkv_metrics_text, plus pkv_cuda_metrics_text of a handle
 * given to pkv_metrics_serve_cuda) over HTTP on `addr`, "IPV4:PORT" (e.g.
 * "127.0.0.1:9464"; port 0 picks a free one, see pkv_metrics_port), from a
 * thread of libmicrohttpd. Other paths: 404; other methods: 405. Stop the
 * server before closing the cache; one still running after pkv_close answers
 * 503 and must still be freed with pkv_metrics_stop.
 * Errors: PKV_EINVAL (cache, addr or out NULL; addr not IPV4:PORT), PKV_ENOTSUP
 * (built without libmicrohttpd: meson option `metrics_http`; a pkv_connect
 * handle), PKV_EIO (the address cannot be bound), PKV_ENOMEM. On failure *out is NULL (when out is
 * not NULL). Blocks: never (starts a thread; the socket is bound on return). */
int pkv_metrics_serve(pkv_cache *cache, const char *addr, pkv_metrics_server **out);
/* The TCP port the server listens on; PKV_EINVAL when srv is NULL. Never blocks. */
int pkv_metrics_port(const pkv_metrics_server *srv);
/* Stop serving: waits for a request in progress, closes the socket, frees srv.
 * NULL is fine. Blocks: joins the server thread. */
void pkv_metrics_stop(pkv_metrics_server *srv);
/* Add the metrics of CUDA handle g (pkv_cuda_metrics_text) to what srv serves
 * (NULL: none again). Call pkv_metrics_serve_cuda(srv, NULL) before
 * pkv_cuda_close(g). Errors: PKV_EINVAL (srv NULL), PKV_ENOTSUP (built without
 * libmicrohttpd). Blocks: waits for a request in progress. */
int pkv_metrics_serve_cuda(pkv_metrics_server *srv, struct pkv_cuda *g);

/* ---- Shared prefix tier (docs/remote.md) -------------------------------- */

/* A second, shared, content-addressed tier of sealed blocks on a Redis (7.0,
 * cluster or standalone) reached through hiredis. Sealed blocks are published in
 * the background; a pkv_seq_open whose prompt misses locally asks the tier for
 * the chain's continuation and imports what arrives in time and passes every
 * check of rule T1 (docs/remote.md): geometry, model identity, salt, parent
 * hash, the whole prefix's token ids equal the prompt's, an HMAC-SHA-256 tag.
 * A value that fails them is counted and deleted from the tier in the
 * background if the server still holds the same bytes.
 * pkv_prefix_lookup stays local unless PKV_TIER_LOOKUP. No TLS (hiredis 0.14
 * has none). */
typedef struct pkv_tier_options {
    /* Seed nodes "HOST:PORT[,HOST:PORT...]" (IPv4 or a name); the slot map is
     * read from the first that answers CLUSTER SLOTS (a standalone server: all
     * slots on it). Required. */
    const char *nodes;
    const char *user;      /* Redis ACL user, or NULL (AUTH with password only) */
    const char *password;  /* NULL: no AUTH */
    /* The cluster secret: 16..256 bytes every node of one deployment shares. It
     * keys the record names and the record tag (HMAC-SHA-256); see docs/remote.md's trust
     * model. Required. */
    const void *secret;
    size_t secret_len;
    uint32_t connect_timeout_ms; /* 0: 100 */
    uint32_t fetch_deadline_ms;  /* a fetch's whole budget; 0: 20 */
    uint32_t fetch_max_blocks;   /* records asked per open; 0: 256 */
    uint32_t max_inflight;       /* concurrent fetches (connections); 0: 4; a
                                    fetch finding all busy is skipped */
    uint32_t queue_blocks;       /* publish queue bound; 0: 1024 */
    uint32_t publish_max_depth;  /* publish only blocks at chain depth < this
                                    (0: all); with PKV_TIER_PUBLISH_ON_HIT too */
    uint32_t ttl_s;              /* expiry of published records; 0: 86400 */
    uint32_t flags;              /* PKV_TIER_* */
} pkv_tier_options;

enum {
    PKV_TIER_NO_PUBLISH = 1u, /* fetch only */
    PKV_TIER_NO_FETCH = 2u,   /* publish only */
    PKV_TIER_LZ4 = 4u,        /* publish payloads LZ4-compressed (when smaller);
                                 readers accept both forms whatever their flags */
    PKV_TIER_LOOKUP = 8u,     /* pkv_prefix_lookup asks the tier on a local miss
                                 (see it); without, lookups stay local */
    PKV_TIER_PUBLISH_ON_HIT = 16u, /* publish a sealed block not at its seal but
                                 at the first pkv_seq_open that attaches it from
                                 the local cache: only prefixes reused at least
                                 once reach the tier. At most once per block
                                 while it stays sealed and the tier attached (a
                                 full queue leaves it for its next hit); not
                                 remembered across a restart or a re-attach,
                                 where a block hit again is published again */
};

/* Attach the tier to an open, writable cache. Connects to nothing yet beyond
 * reading the slot map (a seed that does not answer is skipped; none
 * answering is not an error: the tier reconnects with backoff). Starts the
 * publishing thread. One tier per cache. Like pkv_close, pkv_tier_attach and
 * pkv_tier_detach must not run while any other call on the same cache runs
 * (attach before the cache is shared between threads, detach after they
 * stopped); each tier holds max_inflight + 1 connections with a 1 MiB
 * receive buffer each.
 * Errors: PKV_EINVAL (cache or opt NULL, nodes or secret missing or malformed,
 * secret_len outside 16..256, unknown flags), PKV_EEXIST (a tier is attached), PKV_ERDONLY (a
 * read-only or pkv_connect handle), PKV_ENOTSUP (built without hiredis: meson
 * option `remote_tier`), PKV_ENOMEM. Blocks: lock; up to connect_timeout_ms
 * per seed while reading the slot map. */
int pkv_tier_attach(pkv_cache *cache, const pkv_tier_options *opt);
/* Wait until the publish queue is empty and no SET is outstanding, or
 * timeout_ms passed (PKV_EBUSY then). Errors: PKV_EINVAL (cache NULL),
 * PKV_ESTATE (no tier attached), PKV_EBUSY. Blocks: up to timeout_ms. */
int pkv_tier_flush(pkv_cache *cache, uint32_t timeout_ms);
/* Stop publishing (what is queued is dropped), join the thread, close the
 * connections. pkv_close does it too. NULL or no tier: nothing. Blocks: joins
 * the publishing thread (at most one batch's I/O timeout). */
void pkv_tier_detach(pkv_cache *cache);

/* ---- I/O backend (for fault injection and crash simulation in tests) ----- */

/* Every log, checkpoint and arena-flush I/O goes through these calls. All return
 * 0 (or a byte count / fd) on success and -errno on failure. */
typedef struct pkv_io_ops {
    void *ctx;
    int (*open)(void *ctx, const char *path, int flags, int mode);
    int (*close)(void *ctx, int fd);
    long (*pread)(void *ctx, int fd, void *buf, size_t n, uint64_t off);
    /* Write all n bytes at off; if sync, also make them durable (fdatasync),
     * ordered after the write. */
    int (*write)(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync);
    int (*sync)(void *ctx, int fd); /* fdatasync */
    int (*allocate)(void *ctx, int fd, uint64_t len);
    int (*rename)(void *ctx, const char *from, const char *to);
    int (*unlink)(void *ctx, const char *path);
    int (*sync_dir)(void *ctx, const char *dir);
    /* Optional (NULL: the default's). An identity of the machine's current boot,
     * NUL-terminated in out[0..cap), or a negative errno if unknown. The default
     * reads /proc/sys/kernel/random/boot_id. A new boot means the page cache may
     * have been lost (docs/format.md, "The unsynced marker"); a test backend
     * simulates a restart with it. */
    int (*boot_id)(void *ctx, char *out, size_t cap);
} pkv_io_ops;

/* The default backend (writes and syncs through io_uring, linked). Never fails,
 * never blocks. */
const pkv_io_ops *pkv_io_default(void);

/* ==== CPU paged decode attention (src/attention.c) ======================== */
/* A reference attention over the paged K/V (docs/api.md, "Attention"). Exact and
 * simple: f32 arithmetic, max-subtracted softmax, results independent of the
 * block size, the block table and the thread count. */

/* f32 <-> storage element conversion. Round to nearest even; NaN stays NaN
 * (quieted), f16 overflow gives +-inf, subnormals are kept. Never fail, never
 * block. */
uint16_t pkv_f32_to_f16(float x);
float    pkv_f16_to_f32(uint16_t h);
uint16_t pkv_f32_to_bf16(float x);
float    pkv_bf16_to_f32(uint16_t h);

/* Convert n elements between f32 and `dtype` storage (PKV_F32 copies).
 * Errors: PKV_EINVAL (unknown dtype, or a NULL buffer with n > 0). Blocks: never. */
int pkv_kv_store(pkv_dtype dtype, void *dst, const float *src, size_t n);
int pkv_kv_load(pkv_dtype dtype, float *dst, const void *src, size_t n);

/* Where paged K/V lives: geometry and byte strides. The head_dim elements of one
 * token row are contiguous; the row of (block b, layer l, kind k, head h, token t) is
 *   base + b*block_stride + l*layer_stride + k*kind_stride + h*head_stride
 *        + t*token_stride.
 * pkv_kv_view_of() describes a cache's arena; a caller may describe its own buffer,
 * e.g. a contiguous KV buffer as a single block of block_size = max context. */
typedef struct pkv_kv_view {
    const void *base;
    pkv_dtype dtype;
    uint32_t num_layers, num_kv_heads, head_dim;
    uint32_t block_size;  /* tokens per block, >= 1 (not capped at PKV_BLOCK_SIZE_MAX) */
    uint64_t num_blocks;  /* valid block ids are 0..num_blocks-1 */
    size_t block_stride, layer_stride, kind_stride, head_stride, token_stride;
} pkv_kv_view;

/* Describe the arena of `cache` (valid until pkv_close). Errors: PKV_EINVAL
 * (cache or out NULL). Blocks: never (no lock). */
int pkv_kv_view_of(const pkv_cache *cache, pkv_kv_view *out);

/* One sequence of a batch: token t (0 <= t < len) lives at offset t % block_size of
 * block blocks[t / block_size]. */
typedef struct pkv_attn_seq {
    const uint32_t *blocks; /* the block table (e.g. from pkv_seq_blocks) */
    size_t n_blocks;        /* its entries, >= ceil(len / block_size) */
    size_t len;             /* context length: tokens attended, >= 1 */
} pkv_attn_seq;

/* pkv_attn_params.flags */
#define PKV_ATTN_PORTABLE 0x1u /* use the portable C path even where the CPU has
                                  AVX2+FMA+F16C (results then depend on nothing
                                  but the inputs) */

typedef struct pkv_attn_params {
    uint32_t layer;        /* < view->num_layers */
    uint32_t num_q_heads;  /* a multiple of num_kv_heads; query head h reads kv head
                              h / (num_q_heads / num_kv_heads) */
    float scale;           /* finite; usually 1 / sqrt(head_dim) */
    uint32_t num_threads;  /* 0 or 1: the calling thread only; at most 256 */
    uint32_t flags;        /* PKV_ATTN_* */
} pkv_attn_params;

/* Batched decode attention: one query token per sequence. For sequence s and query
 * head h, with g = num_q_heads / num_kv_heads and kv head j = h / g:
 *   out[s][h] = sum_t softmax_t(scale * q[s][h] . K_j[t]) * V_j[t],  t < seqs[s].len
 * q and out are f32 [n_seqs][num_q_heads][head_dim]; out may equal q but must not
 * overlap it otherwise. Reads only the len token rows of each sequence, nothing
 * else. n_seqs == 0 does nothing. Returns 0, PKV_EINVAL (NULL pointer, bad view,
 * params or len 0), PKV_ERANGE (a table shorter than len needs, or a block id
 * >= num_blocks) or PKV_ENOMEM; out is unspecified after an error. Blocks: never
 * (no lock; the caller keeps the blocks referenced); num_threads > 1 starts and
 * joins that many threads. */
int pkv_attn_decode(const pkv_kv_view *view, const pkv_attn_params *params,
                    const pkv_attn_seq *seqs, size_t n_seqs, const float *q,
                    float *out);

/* ==== end of CPU paged decode attention ==================================== */

/* ==== CUDA layer (src/cuda/, docs/cuda.md) ================================ */
/* A device pool of block slots filled from the arena on demand (the arena
 * registered for DMA when the kernel allows it, else copied through pinned
 * staging buffers), device block tables for a batch of sequences, write-back of
 * K/V produced on the GPU, and a paged decode-attention kernel with the contract
 * of pkv_attn_decode.
 *
 * Every function below exists in every build. In a build without the CUDA layer
 * (meson option `cuda`; pkv_config.h says PKV_WITH_CUDA 0) every call that
 * returns an int returns PKV_ENOTSUP, whatever its arguments. In a build with it,
 * on a machine without a usable CUDA driver or device, the calls return
 * PKV_ENOTSUP too, except that the checks of arguments that need no device may
 * come first: a NULL handle, batch or output pointer, unknown flags (PKV_EINVAL).
 * pkv_last_error() says which. A pkv_cuda or pkv_cuda_batch handle is freed by
 * pkv_cuda_close / pkv_cuda_release; using it afterwards is undefined. Streams are cudaStream_t values passed as void *
 * (NULL: the legacy default stream). "Device pointer": an address in device
 * memory. A pkv_cuda handle must be closed before its cache. */

/* 0 if this build has the CUDA layer and CUDA device `device` is usable, else
 * PKV_ENOTSUP with the reason in why[0..len) (why may be NULL): built without
 * CUDA, no driver, driver older than the runtime, no device, ...
 * Blocks: initializes the CUDA runtime on first use (can take seconds). */
int pkv_cuda_probe(int device, char *why, size_t len);

/* How the device reaches the arena, best first. */
typedef enum pkv_cuda_mode {
    PKV_CUDA_MODE_NONE          = 0, /* no handle / not attached */
    PKV_CUDA_MODE_REGISTERED    = 1, /* the arena mapping is registered (pinned,
                                        device-mapped): blocks are DMAed from it */
    PKV_CUDA_MODE_REGISTERED_RO = 2, /* a second, read-only mapping of the arena file
                                        is registered read-only and DMAed from */
    PKV_CUDA_MODE_STAGING       = 3, /* registration refused: the CPU copies blocks
                                        into pinned staging buffers, DMAed from there */
} pkv_cuda_mode;

/* "none", "registered", "registered-ro", "staging" ("?" for other values). Never
 * fails, never blocks. */
const char *pkv_cuda_mode_name(pkv_cuda_mode mode);

/* pkv_cuda_options.flags */
#define PKV_CUDA_NO_REGISTER    0x1u /* do not register the arena: staging mode */
#define PKV_CUDA_NO_RW_REGISTER 0x2u /* skip the read-write registration */
#define PKV_CUDA_GATHER_KERNEL  0x4u /* copy blocks with a gather kernel even where
                                        cudaMemcpyBatchAsync works */

typedef struct pkv_cuda_options {
    int device;                    /* CUDA device ordinal */
    uint32_t pool_blocks;          /* device block slots; 0: min(capacity, as many as
                                      half the free device memory holds) */
    uint32_t flags;                /* PKV_CUDA_* */
    uint64_t staging_bytes;        /* staging mode: bytes of each of the two pinned
                                      buffers; 0: 64 MiB (at least one block) */
    uint64_t register_chunk_bytes; /* registration chunk; 0: 64 GiB (whole slots) */
    uint32_t staging_threads;      /* staging mode: CPU threads filling a buffer;
                                      0: min(8, online CPUs) */
} pkv_cuda_options;

/* Defaults: device 0, every other field 0. Never blocks. */
void pkv_cuda_options_init(pkv_cuda_options *opt);

typedef struct pkv_cuda pkv_cuda;

/* Attach device opt->device to `cache` (any open mode; a read-only cache cannot
 * take write-backs): register the arena (read-write, else a read-only view, else
 * staging; see pkv_cuda_stats.mode_note for why a better mode failed), allocate
 * the device pool (one cudaMalloc). PKV_ENOTSUP, PKV_ENOMEM (device or pinned
 * memory), PKV_EIO (another CUDA error), PKV_EINVAL (NULL cache or out, unknown
 * flags, an arena that maps no block). On failure *out is NULL (when out is not
 * NULL). Blocks: takes the cache lock briefly; CUDA device setup and registration
 * of the arena (seconds for a large one); I/O (writes dir/cuda.status). */
int pkv_cuda_open(pkv_cache *cache, const pkv_cuda_options *opt, pkv_cuda **out);
/* Wait for the handle's work, release everything. NULL is fine. Blocks: waits for
 * the handle's device work; takes the cache lock briefly. */
void pkv_cuda_close(pkv_cuda *g);

typedef struct pkv_cuda_stats {
    pkv_cuda_mode mode;
    char mode_name[16];
    char mode_note[512];      /* why better modes were not obtained ("" if none) */
    char device_name[128];
    int device;
    int batched_copy;         /* 1: blocks move by cudaMemcpyBatchAsync; 0: gather kernel */
    uint64_t registered_bytes;
    uint32_t register_chunks;
    double register_ms;       /* time spent registering at open */
    uint32_t pool_blocks;     /* device slots */
    uint64_t slot_bytes;      /* device bytes per slot */
    uint32_t slots_free, slots_cached, slots_pinned; /* cached: resident, evictable */
    uint64_t page_ins, page_in_failures;
    uint64_t blocks_hit;      /* distinct blocks of a batch already valid on the device */
    uint64_t blocks_copied, blocks_recopied, evictions;
    uint64_t bytes_h2d;
    uint64_t writebacks, tokens_written_back, bytes_d2h;
} pkv_cuda_stats;

/* Errors: PKV_EINVAL (g or out NULL). Blocks: the handle's own mutex, never the
 * cache lock. */
int pkv_cuda_get_stats(pkv_cuda *g, pkv_cuda_stats *out);

typedef struct pkv_cuda_batch pkv_cuda_batch;

/* pkv_cuda_page_in flags */
#define PKV_CUDA_GPU_APPEND 0x1u /* the K/V of pending (appended, uncommitted) tokens
                                    is written on the device by the caller: only
                                    committed tokens are copied from the arena */

/* Page in sequences ids[0..n): give every block of theirs a device slot (free
 * slots first, else the least recently used slot no in-flight batch pins), copy
 * the blocks not already valid on the device -- asynchronously, in one batched
 * copy (or gather kernel) per call -- and upload device block tables. Work
 * enqueued on `stream` after the call sees the blocks and tables. The batch pins
 * its slots until pkv_cuda_release. All-or-nothing: PKV_EFULL when the pool cannot
 * hold the batch beside the slots other batches pin (nothing changes);
 * PKV_ENOSEQ, PKV_EINVAL (NULL g, ids or out, n == 0, unknown flags, an empty
 * sequence), PKV_ERANGE (a sequence of 2^32 tokens or more), PKV_ENOMEM (host,
 * pinned or device memory), PKV_EIO; on failure *out is NULL (when out is not
 * NULL). Blocks: the cache lock while it reads the tables, the handle's mutex;
 * the copies are asynchronous (staging mode: the CPU fills staging buffers). The
 * sequences must not change (append, commit, truncate, close) until the batch is
 * released, except as pkv_cuda_writeback allows. */
int pkv_cuda_page_in(pkv_cuda *g, const uint64_t *ids, size_t n, uint32_t flags, void *stream,
                     pkv_cuda_batch **out);

/* Sequences for the device kernel: all arrays are device pointers. Token t of
 * sequence s lives at offset t % block_size of block tables[s*table_stride +
 * t / block_size]. */
typedef struct pkv_cuda_seqs {
    const uint32_t *tables;
    size_t table_stride;   /* >= ceil(max_len / block_size) */
    const uint32_t *lens;  /* n_seqs context lengths, each 1..max_len */
    size_t n_seqs;
    uint32_t max_len;      /* host-side bound on every len (sizes the grid) */
    uint32_t split_len;    /* tokens per context split; 0: chosen for the device */
} pkv_cuda_seqs;

typedef struct pkv_cuda_batch_info {
    pkv_kv_view view;      /* the device pool: base is a device pointer, block ids
                              are slot ids, num_blocks = pool slots */
    pkv_cuda_seqs seqs;    /* the batch's device tables and lengths, ids order */
    uint64_t blocks;       /* distinct blocks */
    uint64_t blocks_hit, blocks_copied;
} pkv_cuda_batch_info;

/* Errors: PKV_EINVAL (b or out NULL). Blocks: never. */
int pkv_cuda_batch_get_info(const pkv_cuda_batch *b, pkv_cuda_batch_info *out);

/* Write the K/V of every token each sequence of the batch had pending at page-in
 * (tokens committed..len) from the device slots to the arena, after the work
 * enqueued on `stream` before the call; returns once it is in the arena, so the
 * caller may then pkv_seq_commit (which seals and checksums the arena bytes). The
 * device copies stay valid (no re-copy on the next page-in). Errors: PKV_EINVAL
 * (g or b NULL), PKV_ERDONLY, PKV_EFAILED (the cache failed; as for the mutating
 * calls, checked after PKV_ERDONLY), PKV_ENOMEM (host memory), PKV_EIO. Blocks:
 * waits for `stream`'s work and the device-to-host copies; takes the cache lock
 * only briefly (the failed-state check, and reading the tables afterwards). */
int pkv_cuda_writeback(pkv_cuda *g, pkv_cuda_batch *b, void *stream);

/* The batch's kernels are enqueued on `stream`: unpin its slots (they become
 * evictable once that work is done) and free the batch. PKV_EINVAL when g or b is
 * NULL; PKV_EIO when the release could not be ordered after the stream's work (the
 * call then synchronizes instead; the batch is freed either way). Blocks: never
 * waits for the device, except in that PKV_EIO case; takes the handle's mutex. */
int pkv_cuda_release(pkv_cuda *g, pkv_cuda_batch *b, void *stream);

/* pkv_attn_decode on the device pool for the batch: q and out are device pointers
 * to f32 [n][num_q_heads][head_dim] (ids order); out may equal q. Asynchronous on
 * `stream`. params->num_threads and PKV_ATTN_PORTABLE are ignored. PKV_EINVAL (g, b,
 * params, q or out NULL, params invalid for the pool's view as in
 * pkv_attn_decode), PKV_ENOMEM / PKV_EIO (workspace allocation, launch).
 * Blocks: never (asynchronous), except that growing the batch's workspace
 * (cudaFree, cudaMalloc) synchronizes the device. */
int pkv_cuda_attn(pkv_cuda *g, pkv_cuda_batch *b, const pkv_attn_params *params,
                  const float *q, float *out, void *stream);

/* The kernel on any device-resident paged K/V (view->base a device pointer, the
 * same layout rules as pkv_attn_decode): batch, one query per sequence, GQA,
 * f16/bf16/f32, any length, the context split across thread blocks with a
 * reduction. Needs *work_bytes of device workspace (0 when nothing is split),
 * given by pkv_cuda_attn_workspace for the same arguments. Asynchronous on
 * `stream`; a block id >= view->num_blocks or a length of 0 or above max_len
 * yields NaN for that sequence (never a stray read). PKV_EINVAL, PKV_ERANGE
 * (seqs->table_stride < ceil(max_len / block_size)), PKV_ENOTSUP
 * (head_dim above 1024 when rows are not 16-byte aligned or head_dim is not 64,
 * 128 or 256), PKV_EIO (launch failure). Blocks: never (no lock; asynchronous).
 * pkv_cuda_attn_workspace: the same argument errors; it launches nothing. */
int pkv_cuda_attn_workspace(const pkv_kv_view *view, const pkv_attn_params *params,
                            const pkv_cuda_seqs *seqs, size_t *work_bytes);
int pkv_cuda_attn_decode(const pkv_kv_view *view, const pkv_attn_params *params,
                         const pkv_cuda_seqs *seqs, const float *q, float *out, void *work,
                         size_t work_bytes, void *stream);

/* The handle's pkv_cuda_get_stats as Prometheus text (pagedkv_gpu_* families,
 * docs/metrics.md), which a server appends to the cache's text; the same buffer
 * rules as pkv_metrics_text. Counters cover the handle's lifetime.
 * Errors: PKV_EINVAL (g NULL; buf NULL with cap > 0), PKV_ERANGE. Blocks: the
 * handle's mutex. */
int pkv_cuda_metrics_text(pkv_cuda *g, char *buf, size_t cap, size_t *needed);
/* ==== end of CUDA layer =================================================== */

#if defined(__GNUC__) && !defined(PKV_NO_VISIBILITY)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* PAGEDKV_H */

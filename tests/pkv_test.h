/*
 * Shared helpers for the pagedkv Criterion tests.
 *
 * Every test suite uses pt_setup/pt_teardown as its fixture: pt_setup creates a
 * private temp directory (pt_dir) with mkdtemp, pt_teardown closes every cache
 * opened through pt_open*() and removes the directory.
 *
 * K/V payload convention: the value stored for element (layer, kind, head, dim) of
 * sequence position p is a pure function of (salt, tokens[0..p]) -- the "prefix
 * hash" -- so any block reached through sharing, a prefix hit, a dedupe or a
 * copy-on-write must hold exactly the values the reading sequence would have
 * written itself.
 */
#ifndef PKV_TEST_H
#define PKV_TEST_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pagedkv.h"

extern char pt_dir[256];
/* Free-form context prepended to every helper failure message (e.g. the seed of a
 * property test). Empty by default. */
extern char pt_ctx[256];

void pt_setup(void);
void pt_teardown(void);
int pt_rmrf(const char *path);
void pt_path(char *buf, size_t cap, const char *sub);

/* Default test geometry: 2 layers, 2 kv heads, head_dim 4. */
#define PT_LAYERS 2u
#define PT_HEADS  2u
#define PT_HDIM   4u
#define PT_MODEL  "pagedkv-test-model/v1"

/* The eviction policy the option helpers (pt_opts, wu_opts) select: leaf-SLRU when
 * PKV_TEST_EVICTION=leaf-slru, else the default; so every suite can be run under
 * either policy. */
static inline pkv_eviction pt_eviction(void)
{
    const char *e = getenv("PKV_TEST_EVICTION");
    return e && strcmp(e, "leaf-slru") == 0 ? PKV_EVICT_LEAF_SLRU : PKV_EVICT_LEAF_LRU;
}

void pt_opts(pkv_options *o, uint32_t layers, uint32_t heads, uint32_t hdim,
             uint32_t bs, pkv_dtype dt, uint64_t cap);
/* Open (asserting success) the cache in pt_dir/sub and remember it for teardown. */
pkv_cache *pt_open_sub(const char *sub, const pkv_options *o);
/* Default geometry, f32, in pt_dir/"cache". */
pkv_cache *pt_open(uint32_t bs, uint64_t cap);
void pt_close(pkv_cache *c);

/* ---- Assertions ---------------------------------------------------------- */

#define PT_CHECK(c)                                                                 \
    do {                                                                            \
        char why_[512] = "";                                                        \
        int r_ = pkv_check((c), why_, sizeof why_);                                 \
        cr_assert_eq(r_, 0, "%s%s:%d: pkv_check failed (%d %s): %s", pt_ctx,        \
                     __FILE__, __LINE__, r_, pkv_strerror(r_), why_);               \
    } while (0)

#define PT_OK(expr)                                                                 \
    do {                                                                            \
        int r_ = (expr);                                                            \
        cr_assert_eq(r_, 0, "%s%s:%d: %s -> %d (%s: %s)", pt_ctx, __FILE__,         \
                     __LINE__, #expr, r_, pkv_strerror(r_), pkv_last_error());     \
    } while (0)

#define PT_ERR(expr, code)                                                          \
    do {                                                                            \
        int r_ = (expr);                                                            \
        cr_assert_eq(r_, (code), "%s%s:%d: %s -> %d (%s), expected %d (%s)",        \
                     pt_ctx, __FILE__, __LINE__, #expr, r_, pkv_strerror(r_),       \
                     (int)(code), pkv_strerror(code));                              \
    } while (0)

/* ---- Deterministic K/V values ---------------------------------------------- */

uint64_t pt_mix(uint64_t x);
uint64_t pt_h0(uint64_t salt);
uint64_t pt_hstep(uint64_t h, uint32_t tok);
/* Hash of the prefix tokens[0..n) under salt (n == 0 -> pt_h0(salt)). */
uint64_t pt_hprefix(uint64_t salt, const uint32_t *tokens, size_t n);
/* Value (< 2^24, so exact in f32) of one element. */
uint32_t pt_val(uint64_t h, uint32_t layer, uint32_t kind, uint32_t head, uint32_t d);

/* Write / compare the K/V of one token slot for position hash h. */
void pt_write_token(pkv_cache *c, const pkv_cache_info *inf, uint32_t block,
                    uint32_t off, uint64_t h);
bool pt_token_ok(pkv_cache *c, const pkv_cache_info *inf, uint32_t block,
                 uint32_t off, uint64_t h, char *err, size_t errlen);

pkv_cache_info pt_info(pkv_cache *c);

/* Append all[len..len+n) to sequence id (asserting success), check the returned
 * slots, write their K/V and run pkv_check. */
void pt_append_at(const char *file, int line, pkv_cache *c, uint64_t id,
                  uint64_t salt, const uint32_t *all, size_t len, size_t n);
#define PT_APPEND(c, id, salt, all, len, n) \
    pt_append_at(__FILE__, __LINE__, (c), (id), (salt), (all), (len), (n))

/* Check seq_info (len, committed, n_blocks, salt), tokens, table sanity and the K/V
 * of every position. */
void pt_verify_at(const char *file, int line, pkv_cache *c, uint64_t id, uint64_t salt,
                  const uint32_t *tokens, size_t len, size_t committed);
#define PT_VERIFY(c, id, salt, toks, len, committed) \
    pt_verify_at(__FILE__, __LINE__, (c), (id), (salt), (toks), (len), (committed))

/* Block table of id into out (cap entries), asserting success; returns its length. */
size_t pt_blocks_at(const char *file, int line, pkv_cache *c, uint64_t id,
                    uint32_t *out, size_t cap);
#define PT_BLOCKS(c, id, out, cap) pt_blocks_at(__FILE__, __LINE__, (c), (id), (out), (cap))

pkv_stats pt_stats(pkv_cache *c);
pkv_seq_info pt_seq_info_at(const char *file, int line, pkv_cache *c, uint64_t id);
#define PT_SEQ_INFO(c, id) pt_seq_info_at(__FILE__, __LINE__, (c), (id))

/* Open `id` with `prompt`, assert success and return n_cached. */
size_t pt_seq_open_at(const char *file, int line, pkv_cache *c, uint64_t id,
                      uint64_t salt, const uint32_t *prompt, size_t n);
#define PT_SEQ_OPEN(c, id, salt, prompt, n) \
    pt_seq_open_at(__FILE__, __LINE__, (c), (id), (salt), (prompt), (n))

/* Compare two stats structs field by field (`what` names the situation). */
void pt_stats_eq_at(const char *file, int line, const pkv_stats *a,
                    const pkv_stats *b, const char *what);
#define PT_STATS_EQ(a, b, what) pt_stats_eq_at(__FILE__, __LINE__, (a), (b), (what))

/* ---- Whole-cache snapshots (for "failed call changed nothing") -------------- */

typedef struct pt_snap_seq {
    uint64_t id;
    pkv_seq_info info;
    uint32_t *blocks;
    size_t n_blocks;
    uint32_t *tokens;
    size_t n_tokens;
} pt_snap_seq;

typedef struct pt_snap {
    pkv_stats st;
    size_t n;
    pt_snap_seq *seq;
    uint8_t *payload; /* every block's payload, capacity * block_bytes */
    size_t payload_len;
} pt_snap;

void pt_snap_take(pt_snap *s, pkv_cache *c, const uint64_t *ids, size_t n);
void pt_snap_same_at(const char *file, int line, const pt_snap *s, pkv_cache *c,
                     const char *what);
#define PT_SNAP_SAME(s, c, what) pt_snap_same_at(__FILE__, __LINE__, (s), (c), (what))
void pt_snap_free(pt_snap *s);

/* ---- Random numbers and a set of 64-bit keys -------------------------------- */

typedef struct pt_rng {
    uint64_t s;
} pt_rng;

uint64_t pt_rand(pt_rng *r);
uint32_t pt_below(pt_rng *r, uint32_t n); /* uniform in [0, n), n > 0 */

typedef struct pt_set {
    uint64_t *keys; /* 0 = empty slot; keys are forced non-zero */
    size_t cap, n;
} pt_set;

void pt_set_init(pt_set *s);
bool pt_set_has(const pt_set *s, uint64_t key);
bool pt_set_add(pt_set *s, uint64_t key); /* true if newly added */
void pt_set_free(pt_set *s);

/* Key of a full-block prefix (salt, tokens[0..n)), n a multiple of block_size. */
uint64_t pt_prefix_key(uint64_t salt, const uint32_t *tokens, size_t n);

/* Largest multiple of bs that is <= n-1 (0 for n <= 1). */
size_t pt_hit_cap(size_t n, uint32_t bs);

uint64_t pt_env_u64(const char *name, uint64_t dflt);

/* ---- A synchronous I/O backend (pkv_io_ops) --------------------------------------
 * Plain pread/pwrite/fdatasync/fallocate/rename/unlink, no io_uring: for tests that
 * run under ThreadSanitizer (which cannot see the kernel's side of io_uring's shared
 * rings) and for fault injection. Once `fail` is set (pt_syncio_fail), every call that
 * can fail (all but close) fails with -err. Use from any thread. */
typedef struct pt_syncio {
    pkv_io_ops ops; /* ops.ctx points at this struct: pass &io->ops in pkv_options.io */
    int fail;       /* atomic; read with __atomic builtins */
    int err;        /* errno to fail with (EIO by default) */
    unsigned long calls;  /* atomic: calls made */
    unsigned long failed; /* atomic: calls failed */
} pt_syncio;

void pt_syncio_init(pt_syncio *io);
void pt_syncio_fail(pt_syncio *io, int err); /* err 0: stop failing */

#endif

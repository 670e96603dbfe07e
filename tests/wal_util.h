/*
 * Helpers shared by the write-ahead-log / crash-recovery suites (test_wal.c,
 * test_corrupt.c, test_crash.c), on top of pkv_test.h.
 *
 *  - wu_fail / WU_ASSERT: assertions that work both in the Criterion test process and
 *    in a fork()ed child (where they print and _exit(3) instead of reporting to
 *    Criterion, which must not be used from the child).
 *  - wu_model: the expected committed state (per sequence: id, salt, tokens, len,
 *    committed) and its comparison with an open cache: pkv_seq_list ids, pkv_seq_get_info,
 *    pkv_seq_tokens, the block table and the K/V bytes of every position read
 *    through it. K/V values follow pkv_test.h: position p of a sequence with salt s
 *    holds pt_val(pt_hprefix(s, tokens, p + 1), layer, kind, head, dim).
 *  - wu_wl: a seeded random workload (seq_open with shared prefixes, append + write
 *    K/V + commit, pending tokens, fork, truncate, close, checkpoint) that keeps a
 *    wu_model in step and can report "intents" (open/fork/truncate/close about to
 *    happen) and every K/V slot it writes to hooks.
 *  - wu_probe: the prefix-hit check. Opens a fresh sequence with a prompt, checks
 *    n_cached and that EVERY hit position holds exactly the K/V of its prefix, runs
 *    pkv_check and closes it again.
 *  - wu_oracle: what a crash must preserve: the state acknowledged by the last
 *    successful pkv_sync, relaxed by the truncate/close intents issued after it.
 *  - files: segment frames, directory copies and snapshots.
 */
#ifndef WAL_UTIL_H
#define WAL_UTIL_H

#include "pkv_test.h"

#include <stdarg.h>

/* ---- Assertions usable in a fork()ed child --------------------------------- */

extern bool wu_in_child;
/* Sweeps: while wu_catch is set, a WU_ failure copies its message to wu_caught and
 * longjmp()s there instead of ending the test, so one run can report every failing
 * case. */
#include <setjmp.h>
extern jmp_buf *wu_catch;
extern char wu_caught[2048];
_Noreturn void wu_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define WU_FAIL(...) wu_fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define WU_ASSERT(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) WU_FAIL(__VA_ARGS__);                                            \
    } while (0)
#define WU_OK(expr)                                                                   \
    do {                                                                              \
        int r_ = (expr);                                                              \
        if (r_)                                                                       \
            WU_FAIL("%s -> %d (%s: %s)", #expr, r_, pkv_strerror(r_), pkv_last_error()); \
    } while (0)
#define WU_CHECK(c, what) wu_check_at(__FILE__, __LINE__, (c), (what))
void wu_check_at(const char *file, int line, pkv_cache *c, const char *what);

/* ---- Options ------------------------------------------------------------------ */

#define WU_BS 4u
void wu_opts(pkv_options *o, uint32_t bs, uint64_t cap, pkv_durability mode);
/* pkv_open(dir) without asserting; returns the code. */
int wu_open(const char *dir, const pkv_options *o, pkv_cache **out);
/* pkv_open asserting success; pkv_check after it. */
pkv_cache *wu_open_ok(const char *dir, const pkv_options *o);

/* ---- Expected state ------------------------------------------------------------ */

typedef struct wu_seq {
    uint64_t id, salt;
    uint32_t *tok;
    size_t len, committed, cap;
} wu_seq;

typedef struct wu_model {
    wu_seq *s;
    size_t n, cap;
} wu_model;

wu_seq *wu_model_find(const wu_model *m, uint64_t id);
wu_seq *wu_model_add(wu_model *m, uint64_t id, uint64_t salt, const uint32_t *tok,
                     size_t len, size_t committed);
void wu_model_remove(wu_model *m, uint64_t id);
void wu_seq_reserve(wu_seq *s, size_t n);
void wu_model_copy(wu_model *dst, const wu_model *src);
void wu_model_free(wu_model *m);
/* What a reopen keeps: len = committed. */
void wu_model_drop_pending(wu_model *m);
/* Read every sequence of an open cache (pkv_seq_list, info, tokens), sorted by id. */
void wu_model_read(wu_model *m, pkv_cache *c);
void wu_model_sort(wu_model *m);

/* ---- Verification -------------------------------------------------------------- */

void wu_kv_write(pkv_cache *c, const pkv_cache_info *inf, uint32_t block, uint32_t off,
                 uint64_t h);
bool wu_kv_ok(pkv_cache *c, const pkv_cache_info *inf, uint32_t block, uint32_t off,
              uint64_t h, char *err, size_t errlen);
/* Sequence s->id in c: info (len, committed, n_blocks, salt), tokens, block table
 * (in range, distinct) and the K/V of positions [0, kv_upto). */
void wu_verify_seq(pkv_cache *c, const wu_seq *s, size_t kv_upto, const char *what);
/* pkv_seq_list of c equals the ids of m, and every sequence verifies (all positions). */
void wu_verify_model(pkv_cache *c, const wu_model *m, const char *what);

/* ---- Prompts and prefix-hit probes --------------------------------------------- */

typedef struct wu_prompt {
    uint64_t salt;
    uint32_t *tok;
    size_t n;
} wu_prompt;

typedef struct wu_prompts {
    wu_prompt *p;
    size_t n, cap;
    pt_set keys;
    bool init;
} wu_prompts;

void wu_prompts_add(wu_prompts *ps, uint64_t salt, const uint32_t *t, size_t n);
void wu_prompts_free(wu_prompts *ps);

#define WU_PROBE_ID 0x7fff000000000000ull
/* Open a fresh sequence with (salt, t[0..n)); check that n_cached is a multiple of the
 * block size, <= the hit cap, and that every hit position holds the K/V of its
 * prefix; pkv_check; close it. Returns n_cached. */
size_t wu_probe(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, const char *what);
/* Probe every prompt of ps, then the committed tokens of every sequence of m (if m);
 * hits[] receives ps->n (+ m->n) results (may be NULL). */
void wu_probe_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m, size_t *hits,
                  const char *what);

/* The recompute probe: the prompt (salt, t[0..n)) computed from scratch, as an engine
 * does when it does not look the prefix up. Opens a fresh sequence with no prompt
 * (n = 0: nothing is attached), appends all n tokens, writes the K/V of each for its
 * exact prefix, commits them all (every full block is sealed, and deduped when an
 * identical sealed block is indexed), then reads the K/V of EVERY position back through
 * the block table (pkv_seq_blocks) and requires it to be the K/V just written: a seal
 * that switched to a block holding other K/V shows as a mismatch. pkv_check; close.
 * Returns 0, or PKV_EFULL when the cache had no room for the n tokens (nothing is
 * checked then; the probe sequence is closed). */
int wu_recompute(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, const char *what);
/* The same, `step` tokens per append + write + commit (0: all n at once). Block by block
 * (step = block size) a prefix the cache holds costs one free block at a time (each
 * sealed copy dedupes and is freed at once), so a probe evicts almost nothing -- the
 * blocks a probe should reach are not pushed out by the probes before it. */
int wu_recompute_step(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, size_t step,
                      const char *what);
/* wu_recompute of every prompt of ps, then of the committed tokens of every sequence of
 * m (if m). Adds the probes made to *probes and those skipped for PKV_EFULL to *full
 * (either may be NULL). */
void wu_recompute_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m, size_t *probes,
                      size_t *full, const char *what);
/* The recompute probe block by block, stopping after the first full block that did not
 * dedupe (a miss): it seals at most one new block, and each copy that dedupes is freed
 * at once, so it evicts at most one block or two -- a run of these reaches the blocks
 * recovery left cached before any probe pushes them out. The committed blocks are read
 * back as in wu_recompute. Returns the blocks that deduped. */
size_t wu_recompute_hits(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n,
                         const char *what);
/* wu_recompute_hits over ps (newest first) and m's committed tokens; *probes += count. */
void wu_recompute_hits_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m,
                           size_t *probes, const char *what);

/* ---- Random workload ------------------------------------------------------------ */

#define WU_FAMILIES 4
#define WU_FAMLEN 48

typedef struct wu_wl {
    pkv_cache *c;
    pkv_cache_info inf;
    pt_rng rng;
    wu_model m;
    wu_prompts *prompts; /* prompts used are recorded here (NULL: not recorded) */
    uint64_t next_id;
    uint32_t fam[WU_FAMILIES][WU_FAMLEN]; /* shared prefixes */
    size_t max_seqs, max_len;
    bool tolerant;    /* calls may fail (I/O faults): return the error, do not assert */
    bool check_each;  /* pkv_check after every step */
    bool allow_ckpt;  /* occasional pkv_checkpoint */
    uint64_t keep_id; /* random steps never touch this sequence (0: none) */
    void *hctx;
    /* kind 'O' (id, salt, prompt), 'F' (id = child, arg = parent), 'T' (id, arg =
     * new_len), 'C' (id): called before the call is made. */
    void (*intent)(void *hctx, char kind, uint64_t id, uint64_t arg, uint64_t salt,
                   const uint32_t *t, size_t n);
    void (*written)(void *hctx, uint32_t block, uint32_t off); /* K/V slot written */
    void (*after_call)(void *hctx, pkv_cache *c); /* after each successful mutating call */
    int err;        /* tolerant: the error of the failed call */
    const char *err_call;
    uint64_t calls; /* mutating calls made */
} wu_wl;

void wu_wl_init(wu_wl *w, pkv_cache *c, uint64_t seed, wu_prompts *prompts);
/* After a reopen: the model keeps only committed tokens. */
void wu_wl_reattach(wu_wl *w, pkv_cache *c);
void wu_wl_free(wu_wl *w);
/* One random operation. 0, or (tolerant mode) the error of the failing call. */
int wu_step(wu_wl *w);
/* Deterministic operations through the workload's model (hooks included). wu_do_open
 * appends prompt[n_cached..n) and commits all of it but `pending` tokens; it returns
 * the call's error (tolerant mode) and the new id in *id. */
int wu_do_open(wu_wl *w, uint64_t salt, const uint32_t *prompt, size_t n, size_t pending,
               uint64_t *id);
int wu_do_append(wu_wl *w, uint64_t id, const uint32_t *t, size_t k, bool commit);
int wu_do_commit(wu_wl *w, uint64_t id, size_t n);
/* pkv_seq_commit_append(id, nc, t, k): commit nc pending tokens, append t[0..k) and
 * write their K/V (all-or-nothing, so the model changes only on success). */
int wu_do_commit_append(wu_wl *w, uint64_t id, size_t nc, const uint32_t *t, size_t k);
/* pkv_seq_step_batch over steps (ids[i], nc[i], t[i]), i < n <= 64: the model takes
 * steps [0, *done) (done may be NULL) and their K/V is written. */
int wu_do_step_batch(wu_wl *w, const uint64_t *ids, const uint32_t *nc, const uint32_t *t,
                     size_t n, size_t *done);
int wu_do_fork(wu_wl *w, uint64_t parent, uint64_t *child);
int wu_do_truncate(wu_wl *w, uint64_t id, size_t new_len);
int wu_do_close(wu_wl *w, uint64_t id);
/* Grow the log by about `bytes` quickly: fork and close sequence `id` (which must have
 * no pending tokens; the longer, the bigger each record) again and again. */
void wu_churn(pkv_cache *c, uint64_t id, uint64_t bytes);

/* ---- Crash oracle --------------------------------------------------------------- */

typedef struct wu_intent {
    char kind;
    uint64_t id, arg;
} wu_intent;

typedef struct wu_oracle {
    wu_model ack; /* committed state at the last acknowledged pkv_sync */
    wu_intent *it;
    size_t nit, capit;
} wu_oracle;

void wu_oracle_init(wu_oracle *o);
void wu_oracle_free(wu_oracle *o);
/* A successful pkv_sync: the committed part of m is durable. */
void wu_oracle_ack(wu_oracle *o, const wu_model *m);
void wu_oracle_intent(wu_oracle *o, char kind, uint64_t id, uint64_t arg);
/* Check a recovered cache against the oracle:
 *  - every acknowledged sequence not closed afterwards exists with the same salt and
 *    at least its acknowledged committed tokens (cut to the smallest truncation
 *    issued afterwards), and a closed one, if present, agrees on that prefix;
 *  - every other recovered sequence was opened or forked after the acknowledgement;
 *  - K/V: every committed position of every recovered sequence holds the K/V of its
 *    prefix (the first law, in every mode);
 *  - tails_lost (a power loss after PKV_DURABLE_NONE, which cuts open tails: rule
 *    D8 of docs/format.md): acknowledged prefixes are only required down to a
 *    block boundary.
 * Returns the recovered model in *out if out != NULL. */
void wu_oracle_check(const wu_oracle *o, pkv_cache *c, bool tails_lost, wu_model *out,
                     const char *what);

/* ---- Files ---------------------------------------------------------------------- */

typedef struct wu_frame {
    uint64_t off, first_lsn;
    uint32_t nrec, bytes; /* records bytes (frame = 32 + bytes) */
} wu_frame;

/* Path of the highest-numbered wal-<16 hex> segment in dir; false if none. */
bool wu_newest_seg(const char *dir, char *out, size_t cap);
/* Parse consecutive frames of a segment from offset 64 (no checksum verification).
 * Returns the number found (at most max). */
size_t wu_frames(const char *path, wu_frame *out, size_t max);
/* Number of directory entries whose name starts with prefix. */
size_t wu_count(const char *dir, const char *prefix);
/* Copy every regular file of src into dst (created); all-zero 64 KiB runs are left
 * as holes. */
void wu_copy_dir(const char *src, const char *dst);
/* Sync c, take a crash image of `dir` (a copy into a fresh "img" directory: no
 * close-time checkpoint), close c, and check that the image recovers to w's model;
 * with ck != UINT64_MAX also that recovery started from checkpoint ck and replayed
 * `replayed` records. Frees w. */
void wu_crash_image_recovers(pkv_cache *c, wu_wl *w, const char *dir, const pkv_options *o,
                             uint64_t ck, uint64_t replayed, const char *what);
uint8_t *wu_read_file(const char *path, size_t *len);
void wu_write_file(const char *path, const uint8_t *buf, size_t len);

/* Every regular file of a directory: names and contents. */
typedef struct wu_dirsnap {
    size_t n;
    char **name;
    uint8_t **data;
    size_t *len;
} wu_dirsnap;
void wu_dirsnap_take(wu_dirsnap *s, const char *dir);
void wu_dirsnap_same(const wu_dirsnap *s, const char *dir, const char *what);
void wu_dirsnap_free(wu_dirsnap *s);

#endif

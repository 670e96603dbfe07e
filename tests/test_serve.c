/* Serving a damaged block: every path that can hand a sealed block to a sequence.
 *
 * A prompt's blocks are sealed, the cache is closed cleanly, and part of one block's
 * K/V is overwritten in the arena file (a damaged disk, a torn write, a stale slot).
 * After the reopen the block is sealed, indexed and unverified, exactly as recovery
 * leaves every sealed block. Then it is reached through each path that can put a
 * sealed block into a block table:
 *   (a) prefix attach (pkv_seq_open with the prompt),
 *   (b) commit dedupe (the prompt recomputed from scratch: append, K/V, commit -- at
 *       once, block by block, decoding with pkv_seq_commit_append, in a
 *       pkv_seq_step_batch),
 *   (c) fork (of a recovered sequence that held the block, cut by recovery; and of one
 *       that grows into the damaged prefix afterwards),
 *   (d) bundle import (kvdump import of a bundle whose block payload is damaged; and of
 *       an intact bundle into a cache holding a damaged copy of its prefix).
 * Each test reads the K/V back through the block table the sequence ends up with and
 * requires it to be the K/V of the exact prefix (pkv_test.h's convention), runs
 * pkv_check, and checks the verify_failures counter where the damage must be noticed.
 * The kvdump tool is the binary named by $KVDUMP (meson sets it). */
#include "wal_util.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

extern char **environ;

TestSuite(serve, .init = pt_setup, .fini = pt_teardown);

#define SV_CAP 64u
#define SV_N 25u /* prompt tokens: 6 full blocks + 1 */

static void sv_opts(pkv_options *o)
{
    wu_opts(o, WU_BS, SV_CAP, PKV_DURABLE_GROUP);
}

static void sv_prompt(uint32_t *p, uint32_t base)
{
    for (uint32_t i = 0; i < SV_N; i++) p[i] = base + i * 7;
}

static pkv_stats sv_stats(pkv_cache *c)
{
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    return st;
}

/* Build a cache in dir holding prompt p (salt 0) committed: the sequence is closed
 * (its 6 sealed blocks cached) unless keep (then it stays open, recovered at the next
 * open). Returns its table in tab (7 entries) and the sequence id. */
static uint64_t sv_build(const char *dir, const uint32_t *p, bool keep, uint32_t *tab,
                         pkv_cache_info *inf)
{
    pkv_options o;
    sv_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    wu_wl w;
    wu_wl_init(&w, c, 5, NULL);
    uint64_t id = 0;
    WU_OK(wu_do_open(&w, 0, p, SV_N, 0, &id));
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 8, &nb));
    WU_ASSERT(nb == 7, "the prompt has %zu blocks", nb);
    WU_OK(pkv_info(c, inf));
    if (!keep) WU_OK(wu_do_close(&w, id));
    WU_CHECK(c, "built");
    pkv_close(c);
    wu_wl_free(&w);
    return id;
}

/* Overwrite 64 bytes in the middle of block b's payload in the arena file. */
static void sv_smash(const char *dir, uint32_t b, const pkv_cache_info *inf)
{
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    int fd = open(arena, O_WRONLY | O_CLOEXEC);
    cr_assert(fd >= 0, "open %s: %s", arena, strerror(errno));
    uint8_t junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0x5A ^ (i * 29));
    off_t off = (off_t)(4096 + (uint64_t)b * inf->slot_bytes + inf->block_bytes / 3);
    cr_assert_eq(pwrite(fd, junk, sizeof junk, off), (ssize_t)sizeof junk);
    close(fd);
}

static bool sv_names(pkv_cache *c, uint64_t id, uint32_t b)
{
    uint32_t tab[64];
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, id, tab, 64, &nb));
    for (size_t i = 0; i < nb; i++)
        if (tab[i] == b) return true;
    return false;
}

/* Every committed position of sequence id holds the K/V of its prefix of p (salt 0),
 * and its tokens are p's. */
static void sv_verify(pkv_cache *c, uint64_t id, const uint32_t *p, const char *what)
{
    pkv_seq_info si;
    WU_OK(pkv_seq_get_info(c, id, &si));
    wu_seq s = {.id = id, .salt = 0, .tok = (uint32_t *)p, .len = si.len,
                .committed = si.committed};
    wu_verify_seq(c, &s, si.committed, what);
}

/* Run each case, recording a WU_ failure instead of ending the test, so that one run
 * reports every path that fails. */
typedef struct sv_sweep {
    int cases, failures;
    char msg[8][800];
} sv_sweep;

static void sv_case(sv_sweep *s, void (*fn)(int k), int k)
{
    jmp_buf jb;
    s->cases++;
    if (setjmp(jb) == 0) {
        wu_catch = &jb;
        fn(k);
        wu_catch = NULL;
        return;
    }
    wu_catch = NULL;
    if (s->failures < 8) snprintf(s->msg[s->failures], sizeof s->msg[0], "%.790s", wu_caught);
    s->failures++;
}

static void sv_report(const sv_sweep *s, const char *name)
{
    if (!s->failures) return;
    char all[7000];
    size_t o = 0;
    for (int i = 0; i < s->failures && i < 8; i++)
        o += (size_t)snprintf(all + o, sizeof all - o, "\n  - %s", s->msg[i]);
    cr_assert_fail("%s: %d of %d cases failed:%s", name, s->failures, s->cases, all);
}

/* ---- (a) prefix attach ------------------------------------------------------------ */

static void attach_case(int k)
{
    /* the damaged block: the first of the prompt (k 0) or the fourth (k 1) */
    uint32_t dmg = k ? 3 : 0;
    char dir[512], what[128];
    snprintf(what, sizeof what, "prefix attach, block %u of 6 damaged", dmg);
    pt_path(dir, sizeof dir, k ? "attach3" : "attach0");
    uint32_t p[SV_N], tab[8];
    sv_prompt(p, 1000);
    pkv_cache_info inf;
    sv_build(dir, p, false, tab, &inf);
    sv_smash(dir, tab[dmg], &inf);
    pkv_options o;
    sv_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    uint64_t vf0 = sv_stats(c).verify_failures;
    /* wu_probe checks the K/V of every position it attached */
    size_t nc = wu_probe(c, 0, p, SV_N, what);
    WU_ASSERT(nc == dmg * WU_BS, "%s: the attach covered %zu tokens, expected %u (it must stop "
              "before the damaged block)", what, nc, dmg * WU_BS);
    WU_ASSERT(sv_stats(c).verify_failures == vf0 + 1, "%s: verify_failures %llu -> %llu", what,
              (unsigned long long)vf0, (unsigned long long)sv_stats(c).verify_failures);
    /* attached and kept: the table holds only verified blocks */
    size_t n2 = 0;
    WU_OK(pkv_seq_open(c, 77, 0, p, SV_N, &n2));
    WU_ASSERT(!sv_names(c, 77, tab[dmg]), "%s: the attached table names the damaged block %u",
              what, tab[dmg]);
    sv_verify(c, 77, p, what);
    WU_CHECK(c, what);
    WU_OK(pkv_seq_close(c, 77));
    pkv_close(c);
}

Test(serve, prefix_attach_never_serves_a_damaged_block)
{
    sv_sweep s = {0};
    for (int k = 0; k < 2; k++) sv_case(&s, attach_case, k);
    sv_report(&s, "prefix attach");
}

/* ---- (b) commit dedupe ------------------------------------------------------------ */

static const char *const dedupe_how[] = {
    "one append + one commit of the whole prompt",
    "block by block (append + commit per block)",
    "decoding: pkv_seq_commit_append of one token per step",
    "decoding: pkv_seq_step_batch of one step per call",
};

/* Recompute p from scratch in sequence id (opened empty) the k-th way. */
static void dedupe_recompute(pkv_cache *c, uint64_t id, const uint32_t *p, int k)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    size_t n_cached = 1;
    WU_OK(pkv_seq_open(c, id, 0, NULL, 0, &n_cached));
    WU_ASSERT(n_cached == 0, "an empty open attached %zu tokens", n_cached);
    pkv_slot sl[SV_N];
    uint64_t h = pt_h0(0);
    if (k == 0) {
        WU_OK(pkv_seq_append(c, id, p, SV_N, sl));
        for (uint32_t i = 0; i < SV_N; i++) {
            h = pt_hstep(h, p[i]);
            wu_kv_write(c, &inf, sl[i].block, sl[i].offset, h);
        }
        WU_OK(pkv_seq_commit(c, id, SV_N));
        return;
    }
    if (k == 1) {
        for (uint32_t d = 0; d < SV_N; d += WU_BS) {
            uint32_t n = SV_N - d < WU_BS ? SV_N - d : WU_BS;
            WU_OK(pkv_seq_append(c, id, p + d, n, sl));
            for (uint32_t i = 0; i < n; i++) {
                h = pt_hstep(h, p[d + i]);
                wu_kv_write(c, &inf, sl[i].block, sl[i].offset, h);
            }
            WU_OK(pkv_seq_commit(c, id, n));
        }
        return;
    }
    for (uint32_t i = 0; i < SV_N; i++) {
        pkv_slot s1;
        if (k == 2) {
            WU_OK(pkv_seq_commit_append(c, id, i ? 1 : 0, &p[i], 1, &s1));
        } else {
            pkv_step st = {.id = id, .n_commit = i ? 1 : 0, .token = p[i]};
            size_t done = 0;
            WU_OK(pkv_seq_step_batch(c, &st, 1, &done));
            WU_ASSERT(done == 1, "step batch did %zu steps", done);
            s1 = st.slot;
        }
        h = pt_hstep(h, p[i]);
        wu_kv_write(c, &inf, s1.block, s1.offset, h);
    }
    WU_OK(pkv_seq_commit(c, id, 1));
}

static char g_dedupe_base[512];
static uint32_t g_dedupe_tab[8];
static uint32_t g_dedupe_p[SV_N];

static void dedupe_case(int k)
{
    char dir[512], what[200];
    snprintf(what, sizeof what, "commit dedupe, block 3 of 6 damaged, recomputed by %s",
             dedupe_how[k]);
    char sub[32];
    snprintf(sub, sizeof sub, "dedupe%d", k);
    pt_path(dir, sizeof dir, sub);
    wu_copy_dir(g_dedupe_base, dir);
    pkv_options o;
    sv_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    uint64_t vf0 = sv_stats(c).verify_failures, dd0 = sv_stats(c).dedupes;
    dedupe_recompute(c, 88, g_dedupe_p, k);
    WU_CHECK(c, what);
    pkv_stats st = sv_stats(c);
    WU_ASSERT(!sv_names(c, 88, g_dedupe_tab[3]),
              "%s: the table names the damaged block %u (dedupes %llu -> %llu, verify_failures "
              "%llu -> %llu)", what, g_dedupe_tab[3], (unsigned long long)dd0,
              (unsigned long long)st.dedupes, (unsigned long long)vf0,
              (unsigned long long)st.verify_failures);
    sv_verify(c, 88, g_dedupe_p, what);
    WU_ASSERT(st.verify_failures == vf0 + 1,
              "%s: verify_failures %llu -> %llu: the damaged block was never checked",
              what, (unsigned long long)vf0, (unsigned long long)st.verify_failures);
    /* the recomputed prompt is what later prompts attach */
    WU_OK(pkv_seq_close(c, 88));
    size_t nc = wu_probe(c, 0, g_dedupe_p, SV_N, what);
    WU_ASSERT(nc == 6 * WU_BS, "%s: after the recompute a prompt attaches %zu tokens, expected "
              "24", what, nc);
    WU_CHECK(c, what);
    pkv_close(c);
    /* and after a reopen */
    c = wu_open_ok(dir, &o);
    nc = wu_probe(c, 0, g_dedupe_p, SV_N, what);
    WU_ASSERT(nc == 6 * WU_BS, "%s: after a reopen a prompt attaches %zu tokens", what, nc);
    pkv_close(c);
}

/* The seal of a recomputed block must not switch the sequence to an identical sealed
 * block whose payload is damaged. Fails on main for every path: seal() dedupes onto the
 * unverified block without pkv_block_verify. */
Test(serve, commit_dedupe_never_names_a_damaged_block)
{
    pt_path(g_dedupe_base, sizeof g_dedupe_base, "dedupe-base");
    sv_prompt(g_dedupe_p, 2000);
    pkv_cache_info inf;
    sv_build(g_dedupe_base, g_dedupe_p, false, g_dedupe_tab, &inf);
    sv_smash(g_dedupe_base, g_dedupe_tab[3], &inf);
    sv_sweep s = {0};
    for (int k = 0; k < 4; k++) sv_case(&s, dedupe_case, k);
    sv_report(&s, "commit dedupe");
}

/* ---- (c) fork ------------------------------------------------------------------------- */

/* k 0: the recovered sequence S held the damaged block (its 4th): recovery verifies S's
 * sealed blocks and cuts S before it; S's fork must hold only verified K/V, and growing
 * the fork back to the whole prompt must not pick the damaged block up again.
 * k 1: S holds only the first 2 blocks of the prompt (another, closed sequence sealed
 * the rest, which stays cached, its 4th block damaged); the fork of S grows into the
 * damaged prefix by recomputing it. */
static void fork_case(int k)
{
    char dir[512], what[200];
    snprintf(what, sizeof what, "fork of a recovered sequence %s",
             k ? "growing into a cached damaged prefix" : "that held a damaged block");
    pt_path(dir, sizeof dir, k ? "fork1" : "fork0");
    uint32_t p[SV_N], tab[8];
    sv_prompt(p, 3000);
    pkv_cache_info inf;
    uint64_t sid;
    if (k == 0) {
        sid = sv_build(dir, p, true, tab, &inf);
    } else {
        sv_build(dir, p, false, tab, &inf);
        pkv_options o;
        sv_opts(&o);
        pkv_cache *c = wu_open_ok(dir, &o);
        size_t nc = 0;
        sid = 55;
        WU_OK(pkv_seq_open(c, sid, 0, p, 2 * WU_BS + 1, &nc)); /* attaches 2 blocks */
        WU_ASSERT(nc == 2 * WU_BS, "attached %zu", nc);
        pkv_close(c);
    }
    sv_smash(dir, tab[3], &inf);
    pkv_options o;
    sv_opts(&o);
    pkv_cache *c = wu_open_ok(dir, &o);
    pkv_seq_info si;
    WU_OK(pkv_seq_get_info(c, sid, &si));
    if (k == 0)
        WU_ASSERT(si.committed == 3 * WU_BS, "%s: recovery left S %llu committed tokens, "
                  "expected 12 (cut before the damaged block)", what,
                  (unsigned long long)si.committed);
    sv_verify(c, sid, p, what);
    uint64_t vf0 = sv_stats(c).verify_failures;
    WU_OK(pkv_seq_fork(c, sid, 99));
    WU_ASSERT(!sv_names(c, 99, tab[3]), "%s: the fork names the damaged block", what);
    sv_verify(c, 99, p, what);
    WU_CHECK(c, what);
    /* the fork grows to the whole prompt by recomputing the rest */
    pkv_slot sl[SV_N];
    size_t have = (size_t)si.committed;
    WU_OK(pkv_seq_append(c, 99, p + have, SV_N - have, sl));
    uint64_t h = pt_hprefix(0, p, have);
    for (size_t i = have; i < SV_N; i++) {
        h = pt_hstep(h, p[i]);
        wu_kv_write(c, &inf, sl[i - have].block, sl[i - have].offset, h);
    }
    WU_OK(pkv_seq_commit(c, 99, SV_N - have));
    WU_CHECK(c, what);
    WU_ASSERT(!sv_names(c, 99, tab[3]),
              "%s: the fork, grown to the whole prompt, names the damaged block %u "
              "(verify_failures %llu -> %llu)", what, tab[3], (unsigned long long)vf0,
              (unsigned long long)sv_stats(c).verify_failures);
    sv_verify(c, 99, p, what);
    /* a fork of the grown fork shares what it holds: all of it right */
    WU_OK(pkv_seq_fork(c, 99, 100));
    sv_verify(c, 100, p, what);
    WU_CHECK(c, what);
    pkv_close(c);
}

Test(serve, fork_never_serves_a_damaged_block)
{
    sv_sweep s = {0};
    for (int k = 0; k < 2; k++) sv_case(&s, fork_case, k);
    sv_report(&s, "fork");
}

/* ---- (d) bundle import ---------------------------------------------------------------- */

static int sv_kvdump(const char *const *args, char *err, size_t errlen)
{
    const char *kd = getenv("KVDUMP");
    cr_assert(kd && *kd, "KVDUMP is not set (meson sets it to the built tools/kvdump)");
    char op[512], ep[512];
    pt_path(op, sizeof op, "kd.out");
    pt_path(ep, sizeof ep, "kd.err");
    const char *argv[16];
    size_t n = 0;
    argv[n++] = kd;
    for (size_t i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, op, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(e, 0, "spawn %s: %s", argv[0], strerror(e));
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "kvdump %s died (signal %d)", args[0],
              WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    size_t len = 0;
    uint8_t *b = wu_read_file(ep, &len);
    snprintf(err, errlen, "%.*s", (int)(len < errlen ? len : errlen - 1), (const char *)b);
    free(b);
    return WEXITSTATUS(st);
}

static void sv_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t sv_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Damage the stored payload of bundle entry `which` and make every checksum but the
 * payload checksum (entry field 16) agree again: the entry checksum and the file
 * checksum in the trailer. Only a reader that checks the payload against its
 * checksum can refuse it. Returns the entry's codec. */
static uint32_t sv_damage_bundle(const char *path, uint32_t which)
{
    size_t len = 0;
    uint8_t *b = wu_read_file(path, &len);
    uint32_t bs, nblocks;
    memcpy(&bs, b + 28, 4);
    memcpy(&nblocks, b + 56, 4);
    cr_assert(which < nblocks, "bundle of %u blocks", nblocks);
    size_t off = 512 + (size_t)nblocks * bs * 4;
    for (uint32_t i = 0; i < which; i++) off += 32 + sv_get64(b + off + 8);
    uint32_t codec;
    memcpy(&codec, b + off, 4);
    uint64_t stored = sv_get64(b + off + 8);
    cr_assert(off + 32 + stored + 24 <= len, "entry %u out of the file", which);
    for (uint64_t i = stored / 3; i < stored / 3 + 16 && i < stored; i++) b[off + 32 + i] ^= 0xA5;
    XXH3_state_t es;
    memset(&es, 0, sizeof es);
    XXH3_64bits_reset(&es);
    XXH3_64bits_update(&es, b + off, 24);
    XXH3_64bits_update(&es, b + off + 32, (size_t)stored);
    sv_put64(b + off + 24, XXH3_64bits_digest(&es));
    sv_put64(b + len - 8, XXH3_64bits(b, len - 24));
    wu_write_file(path, b, len);
    free(b);
    return codec;
}

/* k 0: a bundle whose 3rd block payload is damaged (every other checksum consistent) is
 * refused (exit 2) and the target cache serves none of it. k 1: an intact bundle
 * imported into a cache that holds a damaged copy of the same prefix (sealed, cached,
 * unverified): the imported prefix must read back right. */
static void import_case(int k)
{
    char src[512], dst[512], bundle[512], pfile[512], err[2048], what[160];
    snprintf(what, sizeof what, "import %s", k ? "of an intact bundle over a damaged copy"
                                               : "of a bundle with a damaged payload");
    pt_path(src, sizeof src, k ? "imp-src1" : "imp-src0");
    pt_path(dst, sizeof dst, k ? "imp-dst1" : "imp-dst0");
    pt_path(bundle, sizeof bundle, k ? "b1.pkvb" : "b0.pkvb");
    pt_path(pfile, sizeof pfile, "prompt.u32");
    uint32_t p[SV_N], tab[8], dtab[8];
    sv_prompt(p, 4000);
    pkv_cache_info inf;
    sv_build(src, p, false, tab, &inf);
    wu_write_file(pfile, (const uint8_t *)p, sizeof p);
    int rc = sv_kvdump((const char *const[]){"export", src, "--prompt-u32", pfile, "-o", bundle,
                                             "--shuffle", "off", NULL},
                       err, sizeof err);
    WU_ASSERT(rc == 0, "%s: kvdump export -> %d: %s", what, rc, err);
    if (k == 0) {
        pkv_options o;
        sv_opts(&o);
        pkv_close(wu_open_ok(dst, &o)); /* an empty cache of the same geometry */
        uint32_t codec = sv_damage_bundle(bundle, 2);
        rc = sv_kvdump((const char *const[]){"import", dst, bundle, NULL}, err, sizeof err);
        WU_ASSERT(rc == 2, "%s (codec %u): kvdump import -> %d, expected 2 (refused): %s", what,
                  codec, rc, err);
        cr_log_info("%s (codec %u) refused: %s", what, codec, err);
    } else {
        sv_build(dst, p, false, dtab, &inf);
        sv_smash(dst, dtab[3], &inf);
        rc = sv_kvdump((const char *const[]){"import", dst, bundle, NULL}, err, sizeof err);
        WU_ASSERT(rc == 0, "%s: kvdump import -> %d: %s", what, rc, err);
    }
    pkv_options o;
    sv_opts(&o);
    pkv_cache *c = wu_open_ok(dst, &o);
    /* recomputed from scratch first (the attach below verifies what it reaches) */
    WU_ASSERT(wu_recompute(c, 0, p, SV_N, what) == 0, "%s: no room to recompute", what);
    size_t nc = wu_probe(c, 0, p, SV_N, what);
    if (k == 1)
        WU_ASSERT(nc == 6 * WU_BS, "%s: the imported prefix attaches %zu tokens, expected 24",
                  what, nc);
    WU_CHECK(c, what);
    pkv_close(c);
}

Test(serve, import_never_serves_a_damaged_block, .timeout = 120)
{
    sv_sweep s = {0};
    for (int k = 0; k < 2; k++) sv_case(&s, import_case, k);
    sv_report(&s, "bundle import");
}

/*
 * fuzz_recover.c — libFuzzer target for whole-directory recovery (pkv_open):
 * the arena header (src/arena.c), checkpoint selection and loading (the full
 * checkpoint and its chain of delta checkpoints, load_chain), segment headers,
 * the log walk with torn-tail / corruption / gap decisions (src/wal/replay.c),
 * rebuild, verification and the repair checkpoint.
 *
 * Input: a cache directory as built by fuzz_dir.c (format in fuzz_dir.h).
 * Flags: 1 read-only open first; 2 short arena; 4 PKV_OPEN_POINT_IN_TIME.
 * A writable open that succeeds is checked (pkv_check, read-back), given one
 * more committed token on a new sequence, closed and reopened: the reopen must
 * succeed and recover exactly the sequences and committed tokens it had.
 * Built against libpagedkv_fuzz, so every on-disk checksum matches.
 */
#include "fuzz_dir.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct snap {
    size_t n;
    uint64_t *ids;
    uint64_t *len;
    uint32_t **tok;
} snap;

static void snap_take(pkv_cache *c, snap *s) {
    memset(s, 0, sizeof *s);
    size_t n = 0;
    pkv_seq_list(c, NULL, 0, &n);
    s->ids = calloc(n + 1, sizeof *s->ids);
    s->len = calloc(n + 1, sizeof *s->len);
    s->tok = calloc(n + 1, sizeof *s->tok);
    FZ_ASSERT(s->ids && s->len && s->tok, "oom");
    FZ_ASSERT(pkv_seq_list(c, s->ids, n + 1, &s->n) == 0, "pkv_seq_list");
    for (size_t i = 0; i < s->n; i++) {
        pkv_seq_info si;
        FZ_ASSERT(pkv_seq_get_info(c, s->ids[i], &si) == 0, "pkv_seq_get_info");
        s->len[i] = si.committed;
        s->tok[i] = malloc((si.len + 1) * sizeof **s->tok);
        FZ_ASSERT(s->tok[i], "oom");
        size_t nt;
        FZ_ASSERT(pkv_seq_tokens(c, s->ids[i], s->tok[i], si.len + 1, &nt) == 0, "tokens");
    }
}

static void snap_free(snap *s) {
    for (size_t i = 0; i < s->n; i++) free(s->tok[i]);
    free(s->ids);
    free(s->len);
    free(s->tok);
}

static void snap_same(const snap *a, const snap *b) {
    FZ_ASSERT(a->n == b->n, "reopen recovered %zu sequences, %zu were open", b->n, a->n);
    for (size_t i = 0; i < a->n; i++) {
        size_t j = 0;
        while (j < b->n && b->ids[j] != a->ids[i]) j++;
        FZ_ASSERT(j < b->n, "sequence %llu lost by close + reopen",
                  (unsigned long long)a->ids[i]);
        FZ_ASSERT(a->len[i] == b->len[j], "sequence %llu: %llu committed tokens, %llu after "
                  "reopen", (unsigned long long)a->ids[i], (unsigned long long)a->len[i],
                  (unsigned long long)b->len[j]);
        FZ_ASSERT(!memcmp(a->tok[i], b->tok[j], a->len[i] * sizeof(uint32_t)),
                  "sequence %llu: tokens differ after reopen", (unsigned long long)a->ids[i]);
    }
}

/* Things an open that failed may legitimately return for damaged input. */
static bool open_error_ok(int rc) {
    return rc == PKV_ECORRUPT || rc == PKV_EVERSION || rc == PKV_EGEOMETRY ||
           rc == PKV_EMODEL || rc == PKV_EINVAL || rc == PKV_ENOMEM || rc == PKV_EIO;
}

static void exercise(pkv_cache *c, const char *what) {
    fz_check(c, what);
    pkv_stats st;
    FZ_ASSERT(pkv_get_stats(c, &st) == 0, "pkv_get_stats");
    FZ_ASSERT(st.blocks_free + st.blocks_cached + st.blocks_used == st.capacity,
              "stats do not add up after %s", what);
    snap s;
    snap_take(c, &s);
    for (size_t i = 0; i < s.n; i++) {
        pkv_seq_info si;
        FZ_ASSERT(pkv_seq_get_info(c, s.ids[i], &si) == 0 && si.len == si.committed,
                  "recovered sequence with pending tokens");
        uint32_t *blk = malloc((si.n_blocks + 1) * sizeof *blk);
        size_t nb;
        FZ_ASSERT(blk && pkv_seq_blocks(c, s.ids[i], blk, si.n_blocks + 1, &nb) == 0, "blocks");
        for (size_t k = 0; k < nb; k++) {
            /* Touch the K/V of every block a recovered sequence holds: a slot
             * mapped beyond the end of the file would raise SIGBUS. */
            const volatile uint8_t *kv = pkv_kv(c, blk[k], 0, PKV_K, 0);
            if (kv) (void)kv[0];
        }
        free(blk);
    }
    snap_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_cachedir cd;
    if (!fz_cachedir_build(&cd, "recover", data, size)) return 0;
    const unsigned flags = cd.flags;
    const char *dir = cd.dir;
    pkv_options o = cd.o;

    pkv_cache *c = NULL;
    int rc;
    if (flags & 1) {
        pkv_options r = o;
        r.flags = PKV_OPEN_RDONLY | ((flags & 4) ? PKV_OPEN_POINT_IN_TIME : 0);
        r.capacity = 0;
        rc = pkv_open(dir, &r, &c);
        FZ_ASSERT(rc == 0 || open_error_ok(rc), "read-only open: %d %s", rc, pkv_last_error());
        if (!rc) exercise(c, "a read-only open");
        pkv_close(c);
        c = NULL;
    }
    o.flags = (flags & 4) ? PKV_OPEN_POINT_IN_TIME : 0;
    o.capacity = 0;
    rc = pkv_open(dir, &o, &c);
    FZ_ASSERT(rc == 0 || open_error_ok(rc), "open: %d %s", rc, pkv_last_error());
    if (rc) return 0;
    exercise(c, "recovery");
    /* The log resumes: one committed token on a fresh sequence. */
    uint64_t id = 0xF0F0F0F0ull;
    uint32_t tok = 7;
    pkv_slot slot;
    if (pkv_seq_open(c, id, 0, NULL, 0, NULL) == 0 && pkv_seq_append(c, id, &tok, 1, &slot) == 0)
        FZ_ASSERT(pkv_seq_commit(c, id, 1) == 0, "commit after recovery: %s", pkv_last_error());
    fz_check(c, "appending after recovery");
    snap before;
    snap_take(c, &before);
    pkv_close(c);
    c = NULL;
    rc = pkv_open(dir, &o, &c);
    FZ_ASSERT(rc == 0, "reopen after a clean close failed: %d %s", rc, pkv_last_error());
    exercise(c, "reopen");
    snap after;
    snap_take(c, &after);
    snap_same(&before, &after);
    snap_free(&before);
    snap_free(&after);
    pkv_close(c);
    return 0;
}

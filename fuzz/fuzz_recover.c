/*
 * fuzz_recover.c — libFuzzer target for whole-directory recovery (pkv_open):
 * the arena header (src/arena.c), checkpoint selection and loading, segment
 * headers, the log walk with torn-tail / corruption / gap decisions
 * (src/wal/replay.c), rebuild, verification and the repair checkpoint.
 *
 * Input: byte 0 holds flags; the rest is split at the separator "PKVFZSEP" into
 *   part 0  the arena header page (zero-padded or cut to 4096 bytes), followed
 *           in the file by zeroed block slots (all of them, or half with flag 2);
 *   part 1  a checkpoint file, named ckpt-<LSN at offset 16> (absent if empty);
 *   part 2+ log segments, each named wal-<number at offset 16>.
 * The options passed to pkv_open are those of the header (so the open gets past
 * the geometry check), except with flag 8, which passes a fixed geometry.
 * Flags: 1 read-only open first; 2 short arena; 4 PKV_OPEN_POINT_IN_TIME.
 * A writable open that succeeds is checked (pkv_check, read-back), given one
 * more committed token on a new sequence, closed and reopened: the reopen must
 * succeed and recover exactly the sequences and committed tokens it had.
 * Built against libpagedkv_fuzz, so every on-disk checksum matches.
 */
#include "fuzz_common.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_PARTS 6

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
        pkv_seq_info_t si;
        FZ_ASSERT(pkv_seq_info(c, s->ids[i], &si) == 0, "pkv_seq_info");
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
    pkv_stats_t st;
    FZ_ASSERT(pkv_stats(c, &st) == 0, "pkv_stats");
    FZ_ASSERT(st.blocks_free + st.blocks_cached + st.blocks_used == st.capacity,
              "stats do not add up after %s", what);
    snap s;
    snap_take(c, &s);
    for (size_t i = 0; i < s.n; i++) {
        pkv_seq_info_t si;
        FZ_ASSERT(pkv_seq_info(c, s.ids[i], &si) == 0 && si.len == si.committed,
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
    if (size < 1) return 0;
    unsigned flags = data[0];
    const uint8_t *part[MAX_PARTS];
    size_t plen[MAX_PARTS];
    size_t np = fz_split(data + 1, size - 1, part, plen, MAX_PARTS);

    uint8_t hdr[PKV_PAGE];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, part[0], plen[0] < PKV_PAGE ? plen[0] : PKV_PAGE);
    /* Options from the header, bounded so one input cannot ask for gigabytes. */
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = pkv_get_u32(hdr + 16);
    o.num_kv_heads = pkv_get_u32(hdr + 20);
    o.head_dim = pkv_get_u32(hdr + 24);
    o.block_size = pkv_get_u32(hdr + 28);
    o.dtype = (pkv_dtype)pkv_get_u32(hdr + 32);
    o.capacity = pkv_get_u64(hdr + 40);
    char model[PKV_MODEL_ID_MAX + 1];
    uint32_t ml = pkv_get_u32(hdr + 88);
    if (ml > PKV_MODEL_ID_MAX) ml = PKV_MODEL_ID_MAX;
    memcpy(model, hdr + 92, ml);
    model[ml] = 0;
    o.model_id = model[0] ? model : "fuzz-model";
    if (flags & 8) {
        o.num_layers = o.num_kv_heads = 1;
        o.head_dim = 2;
        o.block_size = 4;
        o.dtype = PKV_F32;
        o.capacity = 8;
    }
    pkv_geometry g;
    if (pkv_geometry_from_options(&o, &g)) return 0;
    if (g.capacity > 4096 || g.slot_bytes > (1u << 20) || g.capacity * g.slot_bytes > (16u << 20))
        return 0;
    o.io = fz_io();
    o.durability = PKV_DURABLE_NONE;
    o.group_commit_us = 1000000; /* the harness's own calls flush */

    const char *dir = fz_dir("recover");
    char name[64];
    /* The arena: header page, then zeroed slots (sparse). */
    if (fz_write(dir, "arena", hdr, sizeof hdr)) fz_fail("write arena");
    {
        char path[600];
        snprintf(path, sizeof path, "%s/arena", dir);
        uint64_t slots = (flags & 2) ? g.capacity / 2 : g.capacity;
        if (truncate(path, (off_t)(PKV_PAGE + slots * g.slot_bytes))) fz_fail("truncate");
    }
    if (np > 1 && plen[1] > 0) {
        uint64_t lsn = plen[1] >= 24 ? pkv_get_u64(part[1] + 16) : 0;
        snprintf(name, sizeof name, "ckpt-%016llx", (unsigned long long)lsn);
        if (fz_write(dir, name, part[1], plen[1])) fz_fail("write ckpt");
    }
    for (size_t i = 2; i < np; i++) {
        uint64_t no = plen[i] >= 24 ? pkv_get_u64(part[i] + 16) : i - 1;
        snprintf(name, sizeof name, "wal-%016llx", (unsigned long long)no);
        if (fz_write(dir, name, part[i], plen[i])) fz_fail("write segment");
    }

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

/*
 * fuzz_template.c — the template caches of fuzz_template.h and the read-back
 * every harness runs after a successful recovery.
 */
#include "fuzz_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const uint32_t fz_geo_bs[FZ_NGEO] = {4, 16, 1, 3};
const uint32_t fz_geo_cap[FZ_NGEO] = {8, 32, 4, 16};

void fz_geo_opts(pkv_options *o, unsigned geo) {
    pkv_options_init(o);
    o->num_layers = 1;
    o->num_kv_heads = 1;
    o->head_dim = 2;
    o->dtype = PKV_F32;
    o->block_size = fz_geo_bs[geo % FZ_NGEO];
    o->capacity = fz_geo_cap[geo % FZ_NGEO];
    o->model_id = FZ_MODEL;
    o->io = fz_io();
}

static char tdir[FZ_NGEO][512];

pkv_cache *fz_template_open(unsigned geo) {
    geo %= FZ_NGEO;
    pkv_options o;
    fz_geo_opts(&o, geo);
    pkv_cache *c = NULL;
    if (!tdir[geo][0]) {
        char name[32];
        snprintf(name, sizeof name, "template-%u", geo);
        snprintf(tdir[geo], sizeof tdir[geo], "%s", fz_dir(name));
        int rc = pkv_open(tdir[geo], &o, &c);
        if (rc) fz_fail("creating template %u: %s", geo, pkv_last_error());
        pkv_close(c);
        /* Keep only the arena: no log, no checkpoint. */
        char path[600];
        for (unsigned i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/wal-%016x", tdir[geo], i);
            remove(path);
        }
        c = NULL;
    }
    o.flags = PKV_OPEN_RDONLY;
    o.capacity = 0;
    int rc = pkv_open(tdir[geo], &o, &c);
    if (rc) fz_fail("opening template %u: %s", geo, pkv_last_error());
    return c;
}

void fz_exercise(pkv_cache *c, const char *what) {
    fz_check(c, what);
    pkv_cache_info inf;
    FZ_ASSERT(pkv_info(c, &inf) == 0, "pkv_info");
    pkv_stats st;
    FZ_ASSERT(pkv_get_stats(c, &st) == 0, "pkv_get_stats");
    FZ_ASSERT(st.blocks_free + st.blocks_cached + st.blocks_used == st.capacity,
              "stats do not add up after %s", what);
    size_t n = 0;
    int rc = pkv_seq_list(c, NULL, 0, &n);
    FZ_ASSERT(rc == 0 || rc == PKV_ERANGE, "pkv_seq_list: %d", rc);
    uint64_t *ids = calloc(n + 1, sizeof *ids);
    FZ_ASSERT(ids, "oom");
    size_t n2 = 0;
    FZ_ASSERT(pkv_seq_list(c, ids, n + 1, &n2) == 0 && n2 == n, "pkv_seq_list twice");
    for (size_t i = 0; i < n; i++) {
        pkv_seq_info si;
        FZ_ASSERT(pkv_seq_get_info(c, ids[i], &si) == 0, "pkv_seq_get_info of a listed sequence");
        /* After recovery a sequence holds exactly its committed tokens. */
        FZ_ASSERT(si.len == si.committed, "recovered sequence %llu: len %llu != committed %llu",
                  (unsigned long long)ids[i], (unsigned long long)si.len,
                  (unsigned long long)si.committed);
        FZ_ASSERT(si.n_blocks == (si.len + inf.block_size - 1) / inf.block_size,
                  "sequence %llu: %llu blocks for %llu tokens", (unsigned long long)ids[i],
                  (unsigned long long)si.n_blocks, (unsigned long long)si.len);
        uint32_t *tok = malloc((si.len + 1) * sizeof *tok);
        uint32_t *blk = malloc((si.n_blocks + 1) * sizeof *blk);
        FZ_ASSERT(tok && blk, "oom");
        size_t nt = 0, nb = 0;
        FZ_ASSERT(pkv_seq_tokens(c, ids[i], tok, si.len + 1, &nt) == 0 && nt == si.len,
                  "pkv_seq_tokens");
        FZ_ASSERT(pkv_seq_blocks(c, ids[i], blk, si.n_blocks + 1, &nb) == 0 &&
                      nb == si.n_blocks, "pkv_seq_blocks");
        for (size_t k = 0; k < nb; k++) {
            FZ_ASSERT(blk[k] < inf.capacity, "block %u out of range", blk[k]);
            /* The arena holds every recovered slot of a writable open; a read-only
             * open of a short arena maps fewer (pkv_kv NULL there), never more. */
            const volatile uint8_t *kv = pkv_kv(c, blk[k], 0, PKV_K, 0);
            if (kv) (void)kv[0]; /* a slot mapped beyond the file would fault */
        }
        free(tok);
        free(blk);
    }
    free(ids);
    pkv_recovery r;
    FZ_ASSERT(pkv_get_recovery(c, &r) == 0, "pkv_get_recovery");
}

/*
 * fuzz_dir.c — builds a cache directory from fuzz input (format in fuzz_dir.h).
 */
#include "fuzz_dir.h"
#include "internal.h"

#include <stdio.h>
#include <unistd.h>

#define MAX_PARTS 6

/* Split part 1 at each FZ_DELTA marker: piece 0 is the full checkpoint, pieces
 * 1.. the deltas (u64 name, then the file); the last piece takes the rest. */
static size_t split_deltas(const uint8_t *p, size_t n, const uint8_t **piece, size_t *len) {
    size_t np = 0, start = 0;
    for (size_t i = 0; np < FZ_MAX_DELTAS && i + 8 <= n;) {
        if (!memcmp(p + i, FZ_DELTA, 8)) {
            piece[np] = p + start;
            len[np++] = i - start;
            i += 8;
            start = i;
        } else {
            i++;
        }
    }
    piece[np] = p + start;
    len[np++] = n - start;
    return np;
}

/* Whether a geometry stays small enough for one fuzz input (fuzz_dir.h); a
 * geometry the library refuses passes (it costs nothing: the open fails). */
static bool geometry_in_bounds(const pkv_options *o) {
    pkv_geometry g;
    if (pkv_geometry_from_options(o, &g)) return true;
    return g.capacity <= 4096 && g.slot_bytes <= (1u << 20) &&
           g.capacity * g.slot_bytes <= (16u << 20);
}

bool fz_cachedir_build(fz_cachedir *cd, const char *name, const uint8_t *data, size_t size) {
    if (size < 1) return false;
    cd->flags = data[0];
    const uint8_t *part[MAX_PARTS];
    size_t plen[MAX_PARTS];
    size_t np = fz_split(data + 1, size - 1, part, plen, MAX_PARTS);

    uint8_t hdr[PKV_PAGE];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, part[0], plen[0] < PKV_PAGE ? plen[0] : PKV_PAGE);
    pkv_options *o = &cd->o;
    pkv_options_init(o);
    o->num_layers = pkv_get_u32(hdr + 16);
    o->num_kv_heads = pkv_get_u32(hdr + 20);
    o->head_dim = pkv_get_u32(hdr + 24);
    o->block_size = pkv_get_u32(hdr + 28);
    o->dtype = (pkv_dtype)pkv_get_u32(hdr + 32);
    o->capacity = pkv_get_u64(hdr + 40);
    uint32_t ml = pkv_get_u32(hdr + 88);
    if (ml > PKV_MODEL_ID_MAX) ml = PKV_MODEL_ID_MAX;
    memcpy(cd->model, hdr + 92, ml);
    cd->model[ml] = 0;
    o->model_id = cd->model[0] ? cd->model : "fuzz-model";
    /* The bounds hold for the header's own geometry too: kvdump opens with the
     * geometry the header states (capacity "as stored"), whatever flag 8 gives
     * the harness, so a 112-byte input claiming 2.9M blocks made one kvdump run
     * take 4-8 s under ASan (linear in the claimed capacity, up to half the
     * machine's memory: a libFuzzer slow unit, and on CI a failed run). */
    if (!geometry_in_bounds(o)) return false;
    if (cd->flags & 8) {
        o->num_layers = o->num_kv_heads = 1;
        o->head_dim = 2;
        o->block_size = 4;
        o->dtype = PKV_F32;
        o->capacity = 8;
    }
    pkv_geometry g;
    if (pkv_geometry_from_options(o, &g)) return false; /* bounded: checked above or fixed */
    o->io = fz_io();
    o->durability = PKV_DURABLE_NONE;
    o->group_commit_us = 1000000; /* the harness's own calls flush */

    cd->dir = fz_dir(name);
    char fname[64];
    /* The arena: header page, then zeroed slots (sparse). */
    if (fz_write(cd->dir, "arena", hdr, sizeof hdr)) fz_fail("write arena");
    {
        char path[600];
        snprintf(path, sizeof path, "%s/arena", cd->dir);
        uint64_t slots = (cd->flags & 2) ? g.capacity / 2 : g.capacity;
        if (truncate(path, (off_t)(PKV_PAGE + slots * g.slot_bytes))) fz_fail("truncate");
    }
    if (np > 1) {
        /* The checkpoint chain: the full checkpoint, then the deltas. */
        const uint8_t *ck[FZ_MAX_DELTAS + 1];
        size_t cklen[FZ_MAX_DELTAS + 1];
        size_t nck = split_deltas(part[1], plen[1], ck, cklen);
        if (cklen[0] > 0) {
            uint64_t lsn = cklen[0] >= 24 ? pkv_get_u64(ck[0] + 16) : 0;
            snprintf(fname, sizeof fname, "ckpt-%016llx", (unsigned long long)lsn);
            if (fz_write(cd->dir, fname, ck[0], cklen[0])) fz_fail("write ckpt");
        }
        for (size_t i = 1; i < nck; i++) {
            uint8_t no[8] = {0};
            size_t k = cklen[i] < 8 ? cklen[i] : 8;
            memcpy(no, ck[i], k);
            snprintf(fname, sizeof fname, "delta-%016llx",
                     (unsigned long long)pkv_get_u64(no));
            if (fz_write(cd->dir, fname, ck[i] + k, cklen[i] - k)) fz_fail("write delta");
        }
    }
    for (size_t i = 2; i < np; i++) {
        uint64_t no = plen[i] >= 24 ? pkv_get_u64(part[i] + 16) : i - 1;
        snprintf(fname, sizeof fname, "wal-%016llx", (unsigned long long)no);
        if (fz_write(cd->dir, fname, part[i], plen[i])) fz_fail("write segment");
    }
    return true;
}

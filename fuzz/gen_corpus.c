/*
 * gen_corpus.c — writes the seed corpora of the fuzz targets from real files:
 * it builds caches with the library (the fuzzing variant, so log segments are
 * small), runs a workload of every kind of call, and copies out the log
 * segments, checkpoints and delta checkpoints (as files and as raw snapshots),
 * arena headers, whole directories with their checkpoint chains (for
 * fuzz_recover and fuzz_kvdump) and kvdump bundles (through kd_cmd_export, as
 * `kvdump export` writes them). The fuzz_api seeds are op strings from a fixed
 * PRNG. Usage: gen_corpus OUTDIR (writes OUTDIR/<target>/seed-*).
 * scripts/fuzz.sh --regen-corpus runs it and then minimizes with -merge=1.
 */
#include "fuzz_dir.h"
#include "fuzz_template.h"
#include "internal.h"
#include "kvdump.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static const char *out;
static int nfile;

static void emit(const char *target, const char *tag, const uint8_t *pre, size_t npre,
                 const uint8_t *p, size_t n) {
    char dir[600], name[500];
    snprintf(dir, sizeof dir, "%s/%s", out, target);
    mkdir(dir, 0755);
    uint8_t *b = malloc(npre + n + 1);
    if (!b) abort();
    if (npre) memcpy(b, pre, npre);
    memcpy(b + npre, p, n);
    snprintf(name, sizeof name, "seed-%s", tag);
    if (fz_write(dir, name, b, npre + n)) fz_fail("write %s/%s", dir, name);
    free(b);
    nfile++;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) fz_fail("read %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* A segment without its zero tail (kept 8-aligned, at least the header). */
static size_t trimmed(const uint8_t *p, size_t n) {
    while (n > SEG_HDR && !p[n - 1]) n--;
    return n < SEG_HDR ? n : (n + 7) & ~(size_t)7;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* A workload on cache c: prompts with shared prefixes, appends, commits,
 * pending tokens, forks, truncations, closes, enough to evict. K/V is left
 * zero (so payload sums match fuzz_recover's zeroed arena) unless kv is set. */
static void workload(pkv_cache *c, uint32_t bs, int steps, bool kv) {
    uint32_t tok[64];
    pkv_slot slot[64];
    for (int s = 0; s < steps; s++) {
        uint64_t id = 1 + rnd(5);
        pkv_seq_info si;
        bool open = pkv_seq_get_info(c, id, &si) == 0;
        switch (rnd(7)) {
        case 0: {
            size_t n = rnd(3 * bs + 2), hit;
            for (size_t i = 0; i < n; i++) tok[i] = rnd(3);
            pkv_seq_open(c, id, rnd(4) == 0, tok, n, &hit);
            break;
        }
        case 1: case 2: {
            size_t n = 1 + rnd(2 * bs);
            for (size_t i = 0; i < n; i++) tok[i] = rnd(3);
            if (open && pkv_seq_append(c, id, tok, n, slot) == 0) {
                if (kv)
                    for (size_t i = 0; i < n; i++) {
                        uint8_t *k = pkv_kv(c, slot[i].block, 0, PKV_K, 0);
                        pkv_cache_info inf;
                        pkv_info(c, &inf);
                        for (uint64_t j = 0; j < inf.block_bytes / 2 / inf.num_layers; j++)
                            k[j] = (uint8_t)(rnd(7) == 0 ? rnd(256) : j & 1 ? 0x3c : 0);
                    }
                pkv_seq_commit(c, id, n - rnd(2));
            }
            break;
        }
        case 3:
            if (open && si.len > si.committed) pkv_seq_commit(c, id, si.len - si.committed);
            break;
        case 4:
            pkv_seq_fork(c, id, 1 + rnd(5));
            break;
        case 5:
            if (open) pkv_seq_truncate(c, id, rnd((uint32_t)si.len + 1));
            break;
        default:
            if (rnd(2)) pkv_seq_close(c, id);
            break;
        }
    }
}

static int name_cmp(const void *a, const void *b) { return strcmp(a, b); }

/* The files of dir whose names start with prefix (not spares), sorted. */
static void list_files(const char *dir, const char *prefix, char names[][300], int *n) {
    DIR *d = opendir(dir);
    struct dirent *e;
    *n = 0;
    while (d && (e = readdir(d)) && *n < 16)
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && strncmp(e->d_name, "wal-spare", 9))
            snprintf(names[(*n)++], 300, "%.250s", e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)*n, sizeof names[0], name_cmp);
}

/* Checkpoint file at path: as a fuzz_checkpoint seed in mode 0 (the file) and
 * mode 1 (arena secret + raw snapshot); magic CKPT_MAGIC or DELTA_MAGIC. */
static void emit_ckpt(unsigned geo, const char *tagbase, const char *path, const char *magic) {
    char tag[400];
    uint8_t pre = (uint8_t)geo;
    size_t n;
    uint8_t *b = slurp(path, &n);
    if (!b) fz_fail("read %s", path);
    snprintf(tag, sizeof tag, "%s-file", tagbase);
    emit("checkpoint", tag, &pre, 1, b, n);
    free(b);
    uint64_t secret, lsn, reach;
    uint8_t *raw;
    size_t rl;
    if (!pkv_ckpt_read(pkv_io_default(), path, magic, &secret, &lsn, &reach, &raw, &rl, NULL)) {
        uint8_t p1[9];
        p1[0] = (uint8_t)(geo | 4);
        pkv_put_u64(p1 + 1, secret);
        snprintf(tag, sizeof tag, "%s-raw", tagbase);
        emit("checkpoint", tag, p1, 9, raw, rl);
        free(raw);
    } else {
        fz_fail("gen_corpus: %s does not read back: %s", path, pkv_last_error());
    }
}

/* Growing byte buffer for the directory images. */
typedef struct obuf {
    uint8_t *p;
    size_t n, cap;
} obuf;
static void ob_put(obuf *b, const void *p, size_t n) {
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap - b->n < n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void ob_delta(obuf *b, uint64_t no, const uint8_t *p, size_t n) {
    uint8_t u[8];
    pkv_put_u64(u, no);
    ob_put(b, FZ_DELTA, 8);
    ob_put(b, u, 8);
    ob_put(b, p, n);
}

/* Directory image for fuzz_recover / fuzz_kvdump (fuzz_dir.h): a byte of flags
 * (0 here), the arena header page, then the checkpoint chain (the full
 * checkpoint unless skip_ckpt; each delta unless its index is skip_delta), then
 * the segments. */
static void dir_image(obuf *r, const uint8_t *arena, const uint8_t *ck, size_t cn,
                      bool skip_ckpt, int nd, uint64_t *dno, uint8_t **dd, size_t *dl,
                      int skip_delta, int ns, uint8_t **sd, size_t *sl) {
    r->n = 0;
    ob_put(r, "", 1);
    ob_put(r, arena, PKV_PAGE);
    ob_put(r, FZ_SEP, 8);
    if (ck && !skip_ckpt) ob_put(r, ck, cn);
    for (int i = 0; i < nd; i++)
        if (i != skip_delta) ob_delta(r, dno[i], dd[i], dl[i]);
    for (int i = 0; i < ns; i++) {
        ob_put(r, FZ_SEP, 8);
        ob_put(r, sd[i], sl[i]);
    }
}

/* Variants of one geometry: 0 log only; 1 a checkpoint and log; 2 a
 * checkpoint and a delta; 3 a checkpoint, two deltas and log after them;
 * 4 a checkpoint and four deltas over short workloads (few changed blocks). */
#define NVARIANT 5
static const int var_deltas[NVARIANT] = {0, 0, 1, 2, 4};

/* One geometry: log-only, checkpoint+log and checkpoint-chain+log directories. */
static void gen_geo(unsigned geo) {
    pkv_options o;
    fz_geo_opts(&o, geo);
    o.durability = PKV_DURABLE_NONE;
    for (int variant = 0; variant < NVARIANT; variant++) {
        char name[64], tag[400], path[1400];
        snprintf(name, sizeof name, "gen-%u-%d", geo, variant);
        const char *dir = fz_dir(name);
        char d[600];
        snprintf(d, sizeof d, "%s", dir);
        pkv_cache *c;
        if (pkv_open(d, &o, &c)) fz_fail("open: %s", pkv_last_error());
        workload(c, fz_geo_bs[geo], 40, false);
        if (variant == 1 || variant == 2) {
            pkv_checkpoint(c);
            workload(c, fz_geo_bs[geo], 25, false);
            if (variant == 2) pkv_checkpoint(c); /* a delta: the second since the open */
        } else if (variant >= 3) {
            /* The first checkpoint of a new cache is full, the later ones deltas;
             * a checkpoint with nothing logged since the last writes no file, so
             * the workload between them goes on until something was logged. */
            pkv_checkpoint(c);
            for (int k = 0; k < var_deltas[variant]; k++) {
                pkv_stats st0, st1;
                pkv_get_stats(c, &st0);
                do {
                    workload(c, fz_geo_bs[geo], variant == 3 ? 25 : 6, false);
                    pkv_get_stats(c, &st1);
                } while (st1.last_lsn == st0.last_lsn);
                pkv_checkpoint(c);
            }
            workload(c, fz_geo_bs[geo], variant == 3 ? 20 : 6, false);
        }
        pkv_stats st;
        pkv_get_stats(c, &st);
        if (st.checkpoint_deltas != (uint64_t)var_deltas[variant])
            fz_fail("gen_corpus: geometry %u variant %d wrote %llu delta checkpoints, not %d",
                    geo, variant, (unsigned long long)st.checkpoint_deltas,
                    var_deltas[variant]);
        pkv_close(c);
        uint8_t pre = (uint8_t)geo;
        char segs[16][300], ckpts[16][300], deltas[16][300];
        int ns, nc, nd;
        list_files(d, "wal-", segs, &ns);
        list_files(d, "ckpt-", ckpts, &nc);
        list_files(d, "delta-", deltas, &nd);
        if (nd != var_deltas[variant])
            fz_fail("gen_corpus: geometry %u variant %d left %d delta files, not %d", geo,
                    variant, nd, var_deltas[variant]);
        /* fuzz_record: every segment, read after no checkpoint (variant 0) or
         * after the checkpoint's LSN (bits 2-3 of byte 0 approximate it). */
        for (int i = 0; i < ns; i++) {
            size_t n;
            snprintf(path, sizeof path, "%.500s/%.250s", d, segs[i]);
            uint8_t *b = slurp(path, &n);
            snprintf(tag, sizeof tag, "g%u-v%d-%.250s", geo, variant, segs[i]);
            emit("record", tag, &pre, 1, b, trimmed(b, n));
            free(b);
        }
        /* fuzz_checkpoint: each file of the chain (mode 0) and its raw snapshot
         * (mode 1); the magic tells fuzz_checkpoint a delta from a full one. */
        size_t cn = 0;
        uint8_t *ck = NULL;
        if (nc) {
            snprintf(path, sizeof path, "%.500s/%.250s", d, ckpts[0]);
            ck = slurp(path, &cn);
            snprintf(tag, sizeof tag, "g%u-v%d", geo, variant);
            emit_ckpt(geo, tag, path, CKPT_MAGIC);
        }
        uint8_t *ddata[16];
        size_t dlen[16];
        uint64_t dno[16];
        for (int i = 0; i < nd; i++) {
            snprintf(path, sizeof path, "%.500s/%.250s", d, deltas[i]);
            ddata[i] = slurp(path, &dlen[i]);
            dno[i] = strtoull(deltas[i] + 6, NULL, 16);
            snprintf(tag, sizeof tag, "g%u-v%d-delta%d", geo, variant, i);
            emit_ckpt(geo, tag, path, DELTA_MAGIC);
        }
        /* fuzz_recover: flags, arena header, SEP, checkpoint chain, SEP, segments. */
        size_t an;
        snprintf(path, sizeof path, "%s/arena", d);
        uint8_t *arena = slurp(path, &an);
        uint8_t *segdata[16];
        size_t seglen[16];
        for (int i = 0; i < ns; i++) {
            snprintf(path, sizeof path, "%.500s/%.250s", d, segs[i]);
            size_t n;
            segdata[i] = slurp(path, &n);
            seglen[i] = trimmed(segdata[i], n);
        }
        /* One directory image; byte 0 (the flags) varies per seed. */
        obuf r = {0};
        dir_image(&r, arena, ck, cn, false, nd, dno, ddata, dlen, -1, ns, segdata, seglen);
        static const uint8_t fl[3] = {0, 1, 5};
        for (int flags = 0; flags < 3; flags++) {
            r.p[0] = fl[flags];
            snprintf(tag, sizeof tag, "g%u-v%d-f%d", geo, variant, fl[flags]);
            emit("recover", tag, NULL, 0, r.p, r.n);
        }
        /* fuzz_kvdump: bits 4-6 pick the command, bit 7 --json (fuzz_kvdump.c). */
        for (int cmd = 0; cmd < 8; cmd++) {
            r.p[0] = (uint8_t)(cmd << 4 | (cmd & 1 ? 0x80 : 0));
            snprintf(tag, sizeof tag, "g%u-v%d-c%d", geo, variant, cmd);
            emit("kvdump", tag, NULL, 0, r.p, r.n);
        }
        /* Broken chains (the open fails with PKV_ECORRUPT; kvdump reports
         * them): deltas without their full checkpoint, and a chain missing its
         * first delta. Flags 1 (read-only open first) and kvdump's summary and
         * verify (JSON). */
        if (nd) {
            for (int broken = 0; broken < (nd > 1 ? 2 : 1); broken++) {
                dir_image(&r, arena, ck, cn, broken == 0, nd, dno, ddata, dlen,
                          broken == 0 ? -1 : 0, ns, segdata, seglen);
                const char *what = broken == 0 ? "no-ckpt" : "missing-delta";
                r.p[0] = 1;
                snprintf(tag, sizeof tag, "g%u-v%d-%s-f1", geo, variant, what);
                emit("recover", tag, NULL, 0, r.p, r.n);
                r.p[0] = 0x80;
                snprintf(tag, sizeof tag, "g%u-v%d-%s-c0", geo, variant, what);
                emit("kvdump", tag, NULL, 0, r.p, r.n);
                r.p[0] = 0xf0;
                snprintf(tag, sizeof tag, "g%u-v%d-%s-c7", geo, variant, what);
                emit("kvdump", tag, NULL, 0, r.p, r.n);
            }
        }
        free(r.p);
        for (int i = 0; i < ns; i++) free(segdata[i]);
        for (int i = 0; i < nd; i++) free(ddata[i]);
        free(arena);
        free(ck);
    }
}

static void gen_bundles(void) {
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = 2;
    o.num_kv_heads = 1;
    o.head_dim = 4;
    o.block_size = 4;
    o.capacity = 16;
    o.model_id = "fuzz-bundle";
    o.io = fz_io();
    for (int dt = 0; dt < 3; dt++) {
        o.dtype = (pkv_dtype)dt;
        char name[64], d[600], outp[700], tag[128];
        snprintf(name, sizeof name, "bundle-%d", dt);
        snprintf(d, sizeof d, "%s", fz_dir(name));
        pkv_cache *c;
        if (pkv_open(d, &o, &c)) fz_fail("open: %s", pkv_last_error());
        uint32_t tok[12];
        pkv_slot slot[12];
        for (int i = 0; i < 12; i++) tok[i] = (uint32_t)(i * 7 + dt);
        if (pkv_seq_open(c, 9, 0, NULL, 0, NULL) || pkv_seq_append(c, 9, tok, 12, slot))
            fz_fail("bundle workload: %s", pkv_last_error());
        for (int i = 0; i < 12; i++)
            for (uint32_t l = 0; l < 2; l++)
                for (int k = 0; k < 2; k++) {
                    uint8_t *p = pkv_kv(c, slot[i].block, l, (pkv_kind)k, 0);
                    size_t rowb = 4 * (dt == 0 ? 4 : 2);
                    for (size_t j = 0; j < rowb; j++)
                        p[slot[i].offset * rowb + j] =
                            (uint8_t)(i < 4 ? (j % 2 ? 0x3c : 0) : i < 8 ? rnd(256) : 0);
                }
        if (pkv_seq_commit(c, 9, 12)) fz_fail("commit: %s", pkv_last_error());
        pkv_close(c);
        static const char *const shuf[3] = {"auto", "on", "off"};
        for (int s = 0; s < 3; s++) {
            snprintf(outp, sizeof outp, "%s/out.bundle", fz_base());
            kd_ctx x;
            memset(&x, 0, sizeof x);
            x.cmd = "export";
            char *argv[] = {"kvdump", "export", d, "--seq", "9", "-o", outp, "--shuffle",
                            (char *)shuf[s], NULL};
            if (kd_cmd_export(&x, 9, argv)) fz_fail("kvdump export failed");
            size_t n;
            uint8_t *b = slurp(outp, &n);
            snprintf(tag, sizeof tag, "dtype%d-shuffle-%s", dt, shuf[s]);
            emit("bundle", tag, NULL, 0, b, n);
            free(b);
        }
    }
}

static void gen_api(void) {
    for (int i = 0; i < 24; i++) {
        uint8_t b[160];
        size_t n = 40 + rnd(120);
        for (size_t k = 0; k < n; k++) b[k] = (uint8_t)rnd(256);
        /* Bias towards the productive ops: open, append, commit. */
        for (size_t k = 1; k + 3 < n; k += 3 + rnd(4)) b[k] = (uint8_t)((rnd(6) << 4) | rnd(7));
        char tag[32];
        snprintf(tag, sizeof tag, "prng-%02d", i);
        emit("api", tag, NULL, 0, b, n);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
        return 2;
    }
    out = argv[1];
    mkdir(out, 0755);
    for (unsigned g = 0; g < FZ_NGEO; g++) gen_geo(g);
    gen_bundles();
    gen_api();
    printf("wrote %d seed files under %s\n", nfile, out);
    return 0;
}

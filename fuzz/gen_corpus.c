/*
 * gen_corpus.c — writes the seed corpora of the fuzz targets from real files:
 * it builds caches with the library (the fuzzing variant, so log segments are
 * small), runs a workload of every kind of call, and copies out the log
 * segments, checkpoints (as files and as raw snapshots), arena headers, whole
 * directories (for fuzz_recover) and kvdump bundles (through kd_cmd_export, as
 * `kvdump export` writes them). The fuzz_api seeds are op strings from a fixed
 * PRNG. Usage: gen_corpus OUTDIR (writes OUTDIR/<target>/seed-*).
 * scripts/fuzz.sh --regen-corpus runs it and then minimizes with -merge=1.
 */
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
        pkv_seq_info_t si;
        bool open = pkv_seq_info(c, id, &si) == 0;
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

static void list_files(const char *dir, const char *prefix, char names[][300], int *n) {
    DIR *d = opendir(dir);
    struct dirent *e;
    *n = 0;
    while (d && (e = readdir(d)) && *n < 16)
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && strncmp(e->d_name, "wal-spare", 9))
            snprintf(names[(*n)++], 300, "%.250s", e->d_name);
    if (d) closedir(d);
}

/* One geometry: log-only and checkpoint+log directories. */
static void gen_geo(unsigned geo) {
    pkv_options o;
    fz_geo_opts(&o, geo);
    o.durability = PKV_DURABLE_NONE;
    for (int variant = 0; variant < 3; variant++) {
        char name[64], tag[400], path[1400];
        snprintf(name, sizeof name, "gen-%u-%d", geo, variant);
        const char *dir = fz_dir(name);
        char d[600];
        snprintf(d, sizeof d, "%s", dir);
        pkv_cache *c;
        if (pkv_open(d, &o, &c)) fz_fail("open: %s", pkv_last_error());
        workload(c, fz_geo_bs[geo], 40, false);
        if (variant >= 1) {
            pkv_checkpoint(c);
            workload(c, fz_geo_bs[geo], 25, false);
        }
        if (variant == 2) pkv_checkpoint(c);
        pkv_close(c);
        uint8_t pre = (uint8_t)geo;
        char segs[16][300], ckpts[16][300];
        int ns, nc;
        list_files(d, "wal-", segs, &ns);
        list_files(d, "ckpt-", ckpts, &nc);
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
        /* fuzz_checkpoint: the file (mode 0) and its raw snapshot (mode 1). */
        size_t cn = 0;
        uint8_t *ck = NULL;
        if (nc) {
            snprintf(path, sizeof path, "%.500s/%.250s", d, ckpts[0]);
            ck = slurp(path, &cn);
            snprintf(tag, sizeof tag, "g%u-v%d-file", geo, variant);
            emit("checkpoint", tag, &pre, 1, ck, cn);
            uint64_t secret, lsn, reach;
            uint8_t *raw;
            size_t rl;
            if (!pkv_ckpt_read(pkv_io_default(), path, CKPT_MAGIC, &secret, &lsn, &reach, &raw,
                               &rl, NULL)) {
                uint8_t p1[9];
                p1[0] = (uint8_t)(geo | 4);
                pkv_put_u64(p1 + 1, secret);
                snprintf(tag, sizeof tag, "g%u-v%d-raw", geo, variant);
                emit("checkpoint", tag, p1, 9, raw, rl);
                free(raw);
            }
        }
        /* fuzz_recover: flags, arena header, SEP, checkpoint, SEP, segments. */
        size_t an;
        snprintf(path, sizeof path, "%s/arena", d);
        uint8_t *arena = slurp(path, &an);
        size_t cap = 1 + PKV_PAGE + 8 + cn + 16 * (8 + (32u << 20));
        (void)cap;
        size_t total = 1 + PKV_PAGE + 8 + cn;
        uint8_t *segdata[16];
        size_t seglen[16];
        for (int i = 0; i < ns; i++) {
            snprintf(path, sizeof path, "%.500s/%.250s", d, segs[i]);
            size_t n;
            segdata[i] = slurp(path, &n);
            seglen[i] = trimmed(segdata[i], n);
            total += 8 + seglen[i];
        }
        /* One directory image; byte 0 (the flags) varies per seed. */
        uint8_t *r = malloc(total), *q = r;
        *q++ = 0;
        memcpy(q, arena, PKV_PAGE), q += PKV_PAGE;
        memcpy(q, FZ_SEP, 8), q += 8;
        if (ck) memcpy(q, ck, cn), q += cn;
        for (int i = 0; i < ns; i++) {
            memcpy(q, FZ_SEP, 8), q += 8;
            memcpy(q, segdata[i], seglen[i]), q += seglen[i];
        }
        static const uint8_t fl[3] = {0, 1, 5};
        for (int flags = 0; flags < 3; flags++) {
            r[0] = fl[flags];
            snprintf(tag, sizeof tag, "g%u-v%d-f%d", geo, variant, fl[flags]);
            emit("recover", tag, NULL, 0, r, (size_t)(q - r));
        }
        /* fuzz_kvdump: bits 4-6 pick the command, bit 7 --json (fuzz_kvdump.c). */
        for (int cmd = 0; cmd < 8; cmd++) {
            r[0] = (uint8_t)(cmd << 4 | (cmd & 1 ? 0x80 : 0));
            snprintf(tag, sizeof tag, "g%u-v%d-c%d", geo, variant, cmd);
            emit("kvdump", tag, NULL, 0, r, (size_t)(q - r));
        }
        free(r);
        for (int i = 0; i < ns; i++) free(segdata[i]);
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

/*
 * kvdump_bundle.c — `kvdump export` and `kvdump import`: a portable, versioned,
 * checksummed, LZ4-compressed bundle of the blocks of one cached prefix.
 *
 * Bundle format version 1 (little-endian; docs/kvdump.md has the tables):
 *
 *   header, 512 bytes
 *       0  "PKVBUNDL"            8  u32 version (1)     12  u32 header bytes (512)
 *      16  u32 num_layers       20  u32 num_kv_heads   24  u32 head_dim
 *      28  u32 block_size       32  u32 dtype          36  u32 elem_size
 *      40  u64 block_bytes      48  u64 salt           56  u32 nblocks
 *      60  u32 model_id length  64  256 bytes model_id, NUL-padded
 *     320  u64 created (Unix ns) 328 u64 XXH3-64 of the token section
 *     336  zero ...             504 u64 XXH3-64 of header bytes [0, 504)
 *   tokens: nblocks * block_size u32 token ids (the prefix)
 *   nblocks block entries, in chain order:
 *       0  u32 codec (0 raw, 1 LZ4, 2 byte-shuffle + LZ4)   4  u32 zero
 *       8  u64 stored bytes S   16  u64 XXH3-64 of the raw payload (block_bytes)
 *      24  u64 XXH3-64 of entry bytes [0, 24) and the S stored bytes
 *      32  S stored bytes
 *   trailer, 24 bytes: "PKVBEND\0", u64 nblocks, u64 XXH3-64 of every byte before it
 *
 * The raw payload is the block's arena payload, [layer][K|V][head][token][dim];
 * its checksum equals the payload checksum a SEAL record carries, so it does not
 * depend on the source cache (whose hash secret is never exported). Byte shuffle:
 * for elements of e bytes, byte k of element i goes to plane k, position i, so the
 * sign/exponent bytes of f16/bf16 values sit together. Import checks every length
 * against the file size before allocating or reading, every checksum, the geometry
 * and the model identity, and then feeds the prefix through the public API
 * (pkv_seq_open / append / pkv_kv / commit / close) so the blocks are sealed,
 * hashed and indexed exactly as if they had been computed locally.
 */
#include "kvdump.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define BN_MAGIC "PKVBUNDL"
#define BN_END "PKVBEND\0"
#define BN_VERSION 1u
#define BN_HDR 512u
#define BN_ENTRY 32u
#define BN_TRAILER 24u
#define BN_MAX_BLOCK ((uint64_t)LZ4_MAX_INPUT_SIZE)

enum { CODEC_RAW = 0, CODEC_LZ4 = 1, CODEC_SHUF_LZ4 = 2 };

static void shuffle(uint8_t *dst, const uint8_t *src, size_t n, uint32_t e) {
    size_t m = n / e;
    for (uint32_t k = 0; k < e; k++)
        for (size_t i = 0; i < m; i++) dst[k * m + i] = src[i * e + k];
}

static void unshuffle(uint8_t *dst, const uint8_t *src, size_t n, uint32_t e) {
    size_t m = n / e;
    for (uint32_t k = 0; k < e; k++)
        for (size_t i = 0; i < m; i++) dst[i * e + k] = src[k * m + i];
}

/* ---- Finding a cached chain (read-only) ------------------------------------ */

/* The longest chain of sealed, not BAD blocks matching tokens[0 .. nb*B) under
 * salt, like pkv_seq_open's prefix match but without changing anything. With
 * check_payload, the chain also stops at the first block whose payload does not
 * match its checksum (*bad_block). Returns the number of blocks, written to out
 * (nb entries). */
static uint32_t chain_lookup(pkv_cache *c, uint32_t bs, uint64_t salt, const uint32_t *tokens,
                             uint64_t nb, uint32_t *out, bool check_payload, uint32_t *bad_block) {
    size_t n = 0;
    *bad_block = PKV_NO_BLOCK;
    if (pkv_inspect_prefix(c, salt, tokens, (size_t)(nb * bs), out, (size_t)nb, &n)) return 0;
    for (size_t i = 0; check_payload && i < n; i++) {
        pkv_block_check chk;
        if (pkv_inspect_check_block(c, out[i], &chk) || !chk.payload_ok) {
            *bad_block = out[i];
            return (uint32_t)i;
        }
    }
    return (uint32_t)n;
}

/* ---- Prompt files ---------------------------------------------------------- */

static int read_file(const char *path, uint8_t **out, size_t *len, char *why, size_t wl) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, wl, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > (off_t)(1ull << 30)) {
        snprintf(why, wl, "%s: not a regular file of at most 1 GiB", path);
        close(fd);
        return -1;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *b = malloc(n + 1);
    if (!b) {
        close(fd);
        snprintf(why, wl, "%s: out of memory", path);
        return -1;
    }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    b[got] = 0;
    *out = b;
    *len = got;
    return 0;
}

/* Text: decimal token ids separated by whitespace, commas or brackets (so a JSON
 * array works too). Binary (u32): little-endian u32 ids. */
static int read_prompt(const char *path, bool u32, uint32_t **tok, size_t *n, char *why,
                       size_t wl) {
    uint8_t *b;
    size_t len;
    if (read_file(path, &b, &len, why, wl)) return -1;
    uint32_t *t = malloc((len / (u32 ? 4 : 1) + 1) * sizeof *t);
    size_t k = 0;
    if (!t) {
        free(b);
        snprintf(why, wl, "out of memory");
        return -1;
    }
    if (u32) {
        if (len % 4) {
            snprintf(why, wl, "%s: %zu bytes, not a whole number of u32 token ids", path, len);
            goto bad;
        }
        for (size_t i = 0; i < len; i += 4) t[k++] = kd_get_u32(b + i);
    } else {
        for (size_t i = 0; i < len;) {
            unsigned char ch = b[i];
            if (ch >= '0' && ch <= '9') {
                uint64_t v = 0;
                while (i < len && b[i] >= '0' && b[i] <= '9') {
                    v = v * 10 + (uint64_t)(b[i++] - '0');
                    if (v > UINT32_MAX) {
                        snprintf(why, wl, "%s: token id too large at byte %zu", path, i);
                        goto bad;
                    }
                }
                t[k++] = (uint32_t)v;
            } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == ',' ||
                       ch == '[' || ch == ']') {
                i++;
            } else {
                snprintf(why, wl, "%s: unexpected character '%c' at byte %zu (expected decimal "
                         "token ids; use --prompt-u32 for a binary file)", path,
                         ch >= 0x20 && ch < 0x7f ? ch : '?', i);
                goto bad;
            }
        }
    }
    free(b);
    *tok = t;
    *n = k;
    return 0;
bad:
    free(b);
    free(t);
    return -1;
}

/* ---- Writing ----------------------------------------------------------------- */

typedef struct wout {
    int fd;
    uint64_t off;
    XXH3_state_t *st;
    int err;
} wout;

static void w_put(wout *w, const void *p, size_t n) {
    if (w->err) return;
    XXH3_64bits_update(w->st, p, n);
    const uint8_t *q = p;
    while (n) {
        ssize_t r = pwrite(w->fd, q, n, (off_t)w->off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            w->err = r < 0 ? errno : EIO;
            return;
        }
        q += r;
        n -= (size_t)r;
        w->off += (uint64_t)r;
    }
}

static const char export_usage[] =
    "usage: kvdump export DIR (--seq ID | --prompt FILE | --prompt-u32 FILE) -o BUNDLE\n"
    "                     [--salt S] [--shuffle auto|on|off] [--json]\n"
    "\n"
    "Write the sealed blocks of one prefix to a bundle: a portable, versioned,\n"
    "checksummed, LZ4-compressed file that `kvdump import` loads into another cache\n"
    "of the same geometry and model.\n"
    "\n"
    "  --seq ID          the full (sealed) blocks of sequence ID\n"
    "  --prompt FILE     the longest cached prefix of the token ids in FILE (decimal,\n"
    "                    separated by spaces, newlines or commas; a JSON array works)\n"
    "  --prompt-u32 FILE the same, FILE holding little-endian u32 token ids\n"
    "  --salt S          the salt (trust domain) of --prompt (default 0)\n"
    "  -o BUNDLE         the output file (written to BUNDLE.tmp, then renamed)\n"
    "  --shuffle MODE    byte-shuffle the elements before LZ4: auto (default: per\n"
    "                    block, whichever is smaller), on, off\n";

/* What `kvdump export` was asked for. */
typedef struct export_req {
    const char *vseq, *prompt_path, *outp;
    bool prompt_u32;
    int mode;              /* --shuffle: 0 auto, 1 on, 2 off */
    uint64_t seq_id, salt;
} export_req;

/* 0, or an exit code after kd_fail (-1: --help printed). */
static int export_parse(kd_ctx *x, int argc, char **argv, export_req *q) {
    kd_opt opts[] = {{"--seq", true, NULL},     {"--prompt", true, NULL},
                     {"--prompt-u32", true, NULL}, {"--salt", true, NULL},
                     {"-o", true, NULL},        {"--output", true, NULL},
                     {"--shuffle", true, NULL}, {NULL, false, NULL}};
    const char *pos[1];
    int np = kd_parse(x, argc, argv, 2, opts, pos, 1, export_usage);
    if (np == -1) return -1;
    if (np < 0) return KD_USAGE;
    if (np != 1) return kd_fail(x, KD_USAGE, "missing DIR (see kvdump export --help)");
    x->dir = pos[0];
    memset(q, 0, sizeof *q);
    const char *vp = kd_optval(opts, "--prompt"), *vpu = kd_optval(opts, "--prompt-u32"),
               *vs = kd_optval(opts, "--salt"), *vsh = kd_optval(opts, "--shuffle");
    q->vseq = kd_optval(opts, "--seq");
    q->outp = kd_optval(opts, "-o");
    if (!q->outp) q->outp = kd_optval(opts, "--output");
    if (((q->vseq != NULL) + (vp != NULL) + (vpu != NULL)) != 1)
        return kd_fail(x, KD_USAGE, "give exactly one of --seq, --prompt, --prompt-u32");
    if (!q->outp || !*q->outp) return kd_fail(x, KD_USAGE, "missing -o BUNDLE");
    if (vs && q->vseq) return kd_fail(x, KD_USAGE, "--salt goes with --prompt (a sequence has its own)");
    if (vsh) {
        if (!strcmp(vsh, "auto")) q->mode = 0;
        else if (!strcmp(vsh, "on")) q->mode = 1;
        else if (!strcmp(vsh, "off")) q->mode = 2;
        else return kd_fail(x, KD_USAGE, "--shuffle must be auto, on or off");
    }
    if (q->vseq && !kd_parse_u64(q->vseq, &q->seq_id))
        return kd_fail(x, KD_USAGE, "--seq: '%s' is not an id", q->vseq);
    if (vs && !kd_parse_u64(vs, &q->salt)) return kd_fail(x, KD_USAGE, "--salt: '%s' is not a number", vs);
    q->prompt_path = vp ? vp : vpu;
    q->prompt_u32 = vpu != NULL;
    return 0;
}

/* The blocks to export and their token ids (chain order). */
typedef struct export_src {
    uint32_t *chain, n;
    uint32_t *tokens; /* n * block_size */
} export_src;

/* The full (sealed) blocks of sequence q->seq_id, all of them passing their
 * payload checksum; q->salt becomes the sequence's. 0, or an exit code. */
static int export_from_seq(kd_ctx *x, uint32_t bs, export_req *q, export_src *e) {
    pkv_seq_info si;
    if (pkv_seq_get_info(x->c, q->seq_id, &si))
        return kd_fail(x, KD_FAILED, "no sequence %llu in %s", (unsigned long long)q->seq_id, x->dir);
    q->salt = si.salt;
    uint64_t full = si.committed / bs;
    uint32_t *table = malloc((si.n_blocks + 1) * sizeof *table);
    e->chain = malloc((full + 1) * sizeof *e->chain);
    e->tokens = malloc((full * bs + 1) * sizeof *e->tokens);
    int rc = 0;
    if (!table || !e->chain || !e->tokens || pkv_seq_blocks(x->c, q->seq_id, table, si.n_blocks, NULL))
        rc = kd_fail(x, KD_FAILED, "out of memory");
    for (uint64_t k = 0; !rc && k < full; k++) {
        uint32_t b = table[k];
        pkv_block_info bk;
        pkv_block_check chk;
        if (pkv_inspect_block(x->c, b, &bk) || bk.state != PKV_BLOCK_SEALED) break;
        if (pkv_inspect_check_block(x->c, b, &chk) || !chk.payload_ok) {
            rc = kd_fail(x, KD_FAILED, "block %u (entry %llu of sequence %llu) fails its payload "
                         "checksum; not exported (kvdump verify lists the damage)", b,
                         (unsigned long long)k, (unsigned long long)q->seq_id);
            break;
        }
        pkv_inspect_block_tokens(x->c, b, e->tokens + k * bs, bs, NULL);
        e->chain[e->n++] = b;
    }
    free(table);
    if (!rc && !e->n)
        rc = kd_fail(x, KD_FAILED, "sequence %llu has no full (sealed) block to export "
                     "(%llu committed tokens, %u per block)", (unsigned long long)q->seq_id,
                     (unsigned long long)si.committed, bs);
    return rc;
}

/* The cached chain the prompt hits under q->salt, up to the first block that
 * fails its payload checksum. Takes over the prompt. 0, or an exit code. */
static int export_from_prompt(kd_ctx *x, uint32_t bs, const export_req *q, uint32_t *prompt,
                              size_t nprompt, export_src *e) {
    uint64_t nb = nprompt / bs;
    uint32_t bad = PKV_NO_BLOCK;
    e->tokens = prompt;
    e->chain = malloc((nb + 1) * sizeof *e->chain);
    if (!e->chain) return kd_fail(x, KD_FAILED, "out of memory");
    e->n = chain_lookup(x->c, bs, q->salt, prompt, nb, e->chain, true, &bad);
    if (bad != PKV_NO_BLOCK)
        kd_warn(x, "block %u (prefix block %u) fails its payload checksum: the export stops "
                "before it", bad, e->n);
    if (!e->n)
        return kd_fail(x, KD_FAILED, "no cached block matches the prompt (%zu tokens, %u per "
                       "block, salt %llu)", nprompt, bs, (unsigned long long)q->salt);
    return 0;
}

/* The bundle being written, and what it measured. */
typedef struct bwriter {
    wout w;
    size_t bb;                 /* block_bytes */
    int bound, mode;
    uint8_t *raw, *shuf, *c1, *c2;
    uint64_t by_codec[3], stored_total, plain_total, shuf_total;
} bwriter;

/* The 512-byte header and the token section (bundle format version 1). false:
 * out of memory. */
static bool write_header(bwriter *bw, const pkv_cache_info *g, uint64_t salt,
                         const export_src *e) {
    uint8_t h[BN_HDR];
    memset(h, 0, sizeof h);
    memcpy(h, BN_MAGIC, 8);
    kd_put_u32(h + 8, BN_VERSION);
    kd_put_u32(h + 12, BN_HDR);
    kd_put_u32(h + 16, g->num_layers);
    kd_put_u32(h + 20, g->num_kv_heads);
    kd_put_u32(h + 24, g->head_dim);
    kd_put_u32(h + 28, g->block_size);
    kd_put_u32(h + 32, (uint32_t)g->dtype);
    kd_put_u32(h + 36, g->elem_size);
    kd_put_u64(h + 40, g->block_bytes);
    kd_put_u64(h + 48, salt);
    kd_put_u32(h + 56, e->n);
    size_t ml = strlen(g->model_id);
    kd_put_u32(h + 60, (uint32_t)ml);
    memcpy(h + 64, g->model_id, ml);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    kd_put_u64(h + 320, (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec);
    size_t ntok = (size_t)e->n * g->block_size, tbytes = ntok * 4;
    uint8_t *tsec = malloc(tbytes);
    if (!tsec) return false;
    for (size_t i = 0; i < ntok; i++) kd_put_u32(tsec + 4 * i, e->tokens[i]);
    kd_put_u64(h + 328, XXH3_64bits(tsec, tbytes));
    kd_put_u64(h + 504, XXH3_64bits(h, 504));
    w_put(&bw->w, h, sizeof h);
    w_put(&bw->w, tsec, tbytes);
    free(tsec);
    return true;
}

/* One block entry: the smallest of raw, LZ4 and shuffle+LZ4 (as --shuffle
 * allows) of bw->raw, whose checksum is rsum. */
static void write_entry(bwriter *bw, uint32_t elem, uint64_t rsum) {
    const size_t bb = bw->bb;
    int l1 = -1, l2 = -1;
    if (bw->mode != 1) l1 = LZ4_compress_default((const char *)bw->raw, (char *)bw->c1, (int)bb, bw->bound);
    if (bw->mode != 2) {
        shuffle(bw->shuf, bw->raw, bb, elem);
        l2 = LZ4_compress_default((const char *)bw->shuf, (char *)bw->c2, (int)bb, bw->bound);
    }
    bw->plain_total += l1 > 0 ? (uint64_t)l1 : bb;
    bw->shuf_total += l2 > 0 ? (uint64_t)l2 : bb;
    uint32_t codec = CODEC_RAW;
    const uint8_t *data = bw->raw;
    uint64_t len = bb;
    if (l1 > 0 && (uint64_t)l1 < len && (l2 <= 0 || l1 <= l2)) {
        codec = CODEC_LZ4;
        data = bw->c1;
        len = (uint64_t)l1;
    } else if (l2 > 0 && (uint64_t)l2 < len) {
        codec = CODEC_SHUF_LZ4;
        data = bw->c2;
        len = (uint64_t)l2;
    }
    uint8_t e[BN_ENTRY];
    memset(e, 0, sizeof e);
    kd_put_u32(e, codec);
    kd_put_u64(e + 8, len);
    kd_put_u64(e + 16, rsum);
    XXH3_state_t es;
    memset(&es, 0, sizeof es);
    XXH3_64bits_reset(&es);
    XXH3_64bits_update(&es, e, 24);
    XXH3_64bits_update(&es, data, len);
    kd_put_u64(e + 24, XXH3_64bits_digest(&es));
    w_put(&bw->w, e, sizeof e);
    w_put(&bw->w, data, len);
    bw->by_codec[codec]++;
    bw->stored_total += len;
}

/* The entries of every block, each read from the arena and checked against its
 * sealed checksum. 0, or an exit code. */
static int write_entries(kd_ctx *x, bwriter *bw, uint32_t elem, const export_src *e) {
    for (uint32_t i = 0; i < e->n && !bw->w.err; i++) {
        pkv_block_info bk;
        const void *slot = pkv_kv(x->c, e->chain[i], 0, PKV_K, 0); /* the payload starts there */
        if (slot) memcpy(bw->raw, slot, bw->bb);
        uint64_t rsum = XXH3_64bits(bw->raw, bw->bb);
        if (!slot || pkv_inspect_block(x->c, e->chain[i], &bk) ||
            rsum != bk.payload_sum) /* changed under us (live writer) */
            return kd_fail(x, KD_FAILED, "block %u changed while it was exported (a live writer "
                           "evicted it); try again", e->chain[i]);
        write_entry(bw, elem, rsum);
    }
    return 0;
}

/* The trailer, then fsync. The trailer's own bytes are not covered by the file
 * checksum. */
static void write_trailer(bwriter *bw, uint32_t n) {
    uint8_t tr[BN_TRAILER];
    memcpy(tr, BN_END, 8);
    kd_put_u64(tr + 8, n);
    kd_put_u64(tr + 16, XXH3_64bits_digest(bw->w.st));
    if (!bw->w.err) {
        ssize_t r = pwrite(bw->w.fd, tr, sizeof tr, (off_t)bw->w.off);
        if (r != (ssize_t)sizeof tr) bw->w.err = r < 0 ? errno : EIO;
        else bw->w.off += sizeof tr;
    }
    if (!bw->w.err && fsync(bw->w.fd)) bw->w.err = errno;
}

static void bwriter_free(bwriter *bw) {
    if (bw->w.fd >= 0) close(bw->w.fd);
    if (bw->w.st) XXH3_freeState(bw->w.st);
    free(bw->raw);
    free(bw->shuf);
    free(bw->c1);
    free(bw->c2);
}

/* Write the bundle to q->outp (through outp.tmp, renamed into place). 0, or an
 * exit code; bw keeps the measurements. */
static int write_bundle(kd_ctx *x, const pkv_cache_info *g, const export_req *q,
                        const export_src *e, bwriter *bw) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", q->outp);
    bw->bb = (size_t)g->block_bytes;
    bw->bound = LZ4_compressBound((int)bw->bb);
    bw->mode = q->mode;
    bw->w.st = XXH3_createState();
    bw->w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (bw->w.fd < 0) return kd_fail(x, KD_FAILED, "create %s: %s", tmp, strerror(errno));
    bw->raw = malloc(bw->bb);
    bw->shuf = malloc(bw->bb);
    bw->c1 = malloc((size_t)bw->bound + 1);
    bw->c2 = malloc((size_t)bw->bound + 1);
    int rc = 0;
    if (!bw->raw || !bw->shuf || !bw->c1 || !bw->c2 || !bw->w.st) {
        rc = kd_fail(x, KD_FAILED, "out of memory");
    } else {
        XXH3_64bits_reset(bw->w.st);
        if (!write_header(bw, g, q->salt, e)) rc = kd_fail(x, KD_FAILED, "out of memory");
        if (!rc) rc = write_entries(x, bw, g->elem_size, e);
        if (!rc) write_trailer(bw, e->n);
        if (!rc && bw->w.err) rc = kd_fail(x, KD_FAILED, "write %s: %s", tmp, strerror(bw->w.err));
    }
    if (!rc) {
        close(bw->w.fd);
        bw->w.fd = -1;
        if (rename(tmp, q->outp))
            rc = kd_fail(x, KD_FAILED, "rename %s to %s: %s", tmp, q->outp, strerror(errno));
    }
    if (rc) unlink(tmp);
    return rc;
}

static void export_json(kd_ctx *x, const export_req *q, const export_src *e, uint32_t bs,
                        const bwriter *bw) {
    uint64_t rawtot = (uint64_t)e->n * bw->bb;
    kj *j = &x->j;
    kj_init(j, stdout);
    kj_begin_doc(j, "export");
    x->doc_open = true;
    kj_str(j, "dir", x->dir);
    kj_str(j, "bundle", q->outp);
    kj_u64(j, "blocks", e->n);
    kj_u64(j, "tokens", (uint64_t)e->n * bs);
    kj_u64(j, "salt", q->salt);
    kj_arr(j, "source_blocks", true);
    for (uint32_t i = 0; i < e->n; i++) kj_u64(j, NULL, e->chain[i]);
    kj_end_arr(j);
    kj_u64(j, "raw_bytes", rawtot);
    kj_u64(j, "stored_bytes", bw->stored_total);
    kj_u64(j, "bundle_bytes", bw->w.off);
    kj_dbl(j, "ratio", bw->stored_total ? (double)rawtot / (double)bw->stored_total : 0.0);
    kj_obj(j, "codecs", true);
    kj_u64(j, "raw", bw->by_codec[CODEC_RAW]);
    kj_u64(j, "lz4", bw->by_codec[CODEC_LZ4]);
    kj_u64(j, "shuffle_lz4", bw->by_codec[CODEC_SHUF_LZ4]);
    kj_end_obj(j);
    if (q->mode != 1) kj_u64(j, "lz4_only_bytes", bw->plain_total);
    else kj_null(j, "lz4_only_bytes");
    if (q->mode != 2) kj_u64(j, "shuffle_only_bytes", bw->shuf_total);
    else kj_null(j, "shuffle_only_bytes");
    kj_end_doc(j);
}

static void export_text(const export_req *q, const export_src *e, uint32_t bs,
                        const bwriter *bw) {
    uint64_t rawtot = (uint64_t)e->n * bw->bb;
    char b1[32], b2[32];
    printf("exported %u block%s (%llu tokens, salt %llu) to %s\n", e->n, e->n == 1 ? "" : "s",
           (unsigned long long)e->n * bs, (unsigned long long)q->salt, q->outp);
    printf("payload %s -> %s stored (ratio %.3f); codecs: %llu shuffle+lz4, %llu lz4, %llu raw\n",
           kd_bytes(b1, sizeof b1, rawtot), kd_bytes(b2, sizeof b2, bw->stored_total),
           bw->stored_total ? (double)rawtot / (double)bw->stored_total : 0.0,
           (unsigned long long)bw->by_codec[CODEC_SHUF_LZ4],
           (unsigned long long)bw->by_codec[CODEC_LZ4], (unsigned long long)bw->by_codec[CODEC_RAW]);
    if (q->mode == 0)
        printf("measured: lz4 alone %llu bytes (ratio %.3f), shuffle+lz4 alone %llu bytes "
               "(ratio %.3f)\n", (unsigned long long)bw->plain_total,
               bw->plain_total ? (double)rawtot / (double)bw->plain_total : 0.0,
               (unsigned long long)bw->shuf_total,
               bw->shuf_total ? (double)rawtot / (double)bw->shuf_total : 0.0);
}

int kd_cmd_export(kd_ctx *x, int argc, char **argv) {
    export_req q;
    int rc = export_parse(x, argc, argv, &q);
    if (rc) return rc < 0 ? KD_OK : rc;
    char why[1024];
    uint32_t *prompt = NULL;
    size_t nprompt = 0;
    if (q.prompt_path && read_prompt(q.prompt_path, q.prompt_u32, &prompt, &nprompt, why, sizeof why))
        return kd_fail(x, KD_USAGE, "%s", why);
    if ((rc = kd_open(x))) {
        free(prompt);
        return rc;
    }
    pkv_cache_info g;
    pkv_info(x->c, &g);
    export_src e = {NULL, 0, NULL};
    bwriter bw;
    memset(&bw, 0, sizeof bw);
    bw.w.fd = -1;
    if (g.block_bytes > BN_MAX_BLOCK)
        rc = kd_fail(x, KD_FAILED, "blocks of %llu bytes are too large for a bundle (at most %llu)",
                     (unsigned long long)g.block_bytes, (unsigned long long)BN_MAX_BLOCK);
    else if (q.vseq)
        rc = export_from_seq(x, g.block_size, &q, &e);
    else
        rc = export_from_prompt(x, g.block_size, &q, prompt, nprompt, &e);
    if (e.tokens != prompt) free(prompt); /* else e owns it */
    if (!rc) rc = write_bundle(x, &g, &q, &e, &bw);
    if (!rc && x->json) export_json(x, &q, &e, g.block_size, &bw);
    else if (!rc) export_text(&q, &e, g.block_size, &bw);
    bwriter_free(&bw);
    free(e.chain);
    free(e.tokens);
    kd_close(x);
    if (rc == KD_OK) {
        fflush(stdout);
        if (ferror(stdout)) return kd_fail(x, KD_FAILED, "writing the output failed");
    }
    return rc;
}

/* ---- Reading a bundle ------------------------------------------------------------ */

typedef struct bundle {
    const char *path;
    int fd;
    uint64_t size;
    uint32_t num_layers, num_kv_heads, head_dim, block_size, dtype, elem_size, nblocks;
    uint64_t block_bytes, salt, created_ns;
    char model_id[PKV_MODEL_ID_MAX + 1];
    uint32_t *tokens;     /* nblocks * block_size */
    uint64_t *entry_off;  /* nblocks */
    uint64_t stored_bytes, codecs[3];
    uint8_t *raw, *shuf;  /* block_bytes each */
    uint8_t *comp;        /* LZ4_compressBound(block_bytes) */
} bundle;

static int bread(const bundle *b, void *p, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(b->fd, (uint8_t *)p + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

/* Read entry i at *off into b->raw (decompressed, unshuffled, checked).
 * st (may be NULL) accumulates the file checksum. 0, or -1 with why. */
static int read_entry(bundle *b, uint32_t i, uint64_t *off, XXH3_state_t *st, char *why, size_t wl) {
    uint8_t e[BN_ENTRY];
    uint64_t o = *off;
    if (b->size - o < BN_ENTRY + BN_TRAILER || bread(b, e, sizeof e, o)) {
        snprintf(why, wl, "%s: truncated at block entry %u (offset %llu)", b->path, i,
                 (unsigned long long)o);
        return -1;
    }
    uint32_t codec = kd_get_u32(e), zero = kd_get_u32(e + 4);
    uint64_t len = kd_get_u64(e + 8), rsum = kd_get_u64(e + 16), esum = kd_get_u64(e + 24);
    uint64_t bb = b->block_bytes;
    if (codec > CODEC_SHUF_LZ4 || zero) {
        snprintf(why, wl, "%s: block entry %u has an unknown codec %u", b->path, i, codec);
        return -1;
    }
    if ((codec == CODEC_RAW && len != bb) ||
        (codec != CODEC_RAW && (len == 0 || len > (uint64_t)LZ4_compressBound((int)bb))) ||
        len > b->size - o - BN_ENTRY - BN_TRAILER) {
        snprintf(why, wl, "%s: block entry %u: stored length %llu is impossible (block %llu bytes, "
                 "%llu bytes left in the file)", b->path, i, (unsigned long long)len,
                 (unsigned long long)bb, (unsigned long long)(b->size - o - BN_ENTRY));
        return -1;
    }
    uint8_t *dst = codec == CODEC_RAW ? b->raw : b->comp;
    if (bread(b, dst, (size_t)len, o + BN_ENTRY)) {
        snprintf(why, wl, "%s: cannot read block entry %u", b->path, i);
        return -1;
    }
    XXH3_state_t es;
    memset(&es, 0, sizeof es);
    XXH3_64bits_reset(&es);
    XXH3_64bits_update(&es, e, 24);
    XXH3_64bits_update(&es, dst, (size_t)len);
    if (!kd_sum_ok(esum, XXH3_64bits_digest(&es))) {
        snprintf(why, wl, "%s: block entry %u: checksum mismatch (the file is damaged)", b->path, i);
        return -1;
    }
    if (st) {
        XXH3_64bits_update(st, e, sizeof e);
        XXH3_64bits_update(st, dst, (size_t)len);
    }
    if (codec != CODEC_RAW) {
        uint8_t *out = codec == CODEC_LZ4 ? b->raw : b->shuf;
        int d = LZ4_decompress_safe((const char *)b->comp, (char *)out, (int)len, (int)bb);
        if (d != (int)bb) {
            snprintf(why, wl, "%s: block entry %u does not decompress to %llu bytes", b->path, i,
                     (unsigned long long)bb);
            return -1;
        }
        if (codec == CODEC_SHUF_LZ4) unshuffle(b->raw, b->shuf, (size_t)bb, b->elem_size);
    }
    if (!kd_sum_ok(rsum, XXH3_64bits(b->raw, (size_t)bb))) {
        snprintf(why, wl, "%s: block entry %u: payload checksum mismatch after decompression",
                 b->path, i);
        return -1;
    }
    if (st) {
        b->codecs[codec]++;
        b->stored_bytes += len;
    }
    *off = o + BN_ENTRY + len;
    return 0;
}

static void bundle_close(bundle *b) {
    if (b->fd >= 0) close(b->fd);
    free(b->tokens);
    free(b->entry_off);
    free(b->raw);
    free(b->shuf);
    free(b->comp);
    b->fd = -1;
    b->tokens = NULL;
    b->entry_off = NULL;
    b->raw = b->shuf = b->comp = NULL;
}

/* Open and validate a whole bundle (every length, checksum and block). 0, or -1
 * with a message. */
static int bundle_open(bundle *b, const char *path, char *why, size_t wl) {
    memset(b, 0, sizeof *b);
    b->fd = -1;
    b->path = path;
    b->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (b->fd < 0) {
        snprintf(why, wl, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(b->fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(why, wl, "%s: not a regular file", path);
        return -1;
    }
    b->size = (uint64_t)st.st_size;
    uint8_t h[BN_HDR];
    if (b->size < BN_HDR + BN_TRAILER || bread(b, h, sizeof h, 0)) {
        snprintf(why, wl, "%s: %llu bytes, too short for a bundle", path, (unsigned long long)b->size);
        return -1;
    }
    if (memcmp(h, BN_MAGIC, 8)) {
        snprintf(why, wl, "%s: not a kvdump bundle (bad magic)", path);
        return -1;
    }
    uint32_t ver = kd_get_u32(h + 8);
    if (ver != BN_VERSION) {
        snprintf(why, wl, "%s: bundle format version %u is not supported (this kvdump reads %u)",
                 path, ver, BN_VERSION);
        return -1;
    }
    if (!kd_sum_ok(kd_get_u64(h + 504), XXH3_64bits(h, 504))) {
        snprintf(why, wl, "%s: header checksum mismatch (the file is damaged)", path);
        return -1;
    }
    b->num_layers = kd_get_u32(h + 16);
    b->num_kv_heads = kd_get_u32(h + 20);
    b->head_dim = kd_get_u32(h + 24);
    b->block_size = kd_get_u32(h + 28);
    b->dtype = kd_get_u32(h + 32);
    b->elem_size = kd_get_u32(h + 36);
    b->block_bytes = kd_get_u64(h + 40);
    b->salt = kd_get_u64(h + 48);
    b->nblocks = kd_get_u32(h + 56);
    uint32_t ml = kd_get_u32(h + 60);
    b->created_ns = kd_get_u64(h + 320);
    pkv_options o;
    memset(&o, 0, sizeof o);
    o.num_layers = b->num_layers;
    o.num_kv_heads = b->num_kv_heads;
    o.head_dim = b->head_dim;
    o.block_size = b->block_size;
    o.dtype = (pkv_dtype)b->dtype;
    o.capacity = 1;
    pkv_cache_info g;
    if (kd_get_u32(h + 12) != BN_HDR || pkv_inspect_geometry(&o, &g) ||
        g.elem_size != b->elem_size || g.block_bytes != b->block_bytes ||
        b->block_bytes > BN_MAX_BLOCK || ml == 0 || ml > PKV_MODEL_ID_MAX ||
        memchr(h + 64, 0, ml) || b->nblocks == 0) {
        snprintf(why, wl, "%s: inconsistent header (geometry %u x %u x %u, block %u, dtype %u, "
                 "%llu-byte blocks, %u blocks, model id length %u)", path, b->num_layers,
                 b->num_kv_heads, b->head_dim, b->block_size, b->dtype,
                 (unsigned long long)b->block_bytes, b->nblocks, ml);
        return -1;
    }
    memcpy(b->model_id, h + 64, ml);
    b->model_id[ml] = '\0';
    /* Lengths against the file before allocating anything. */
    uint64_t tbytes = (uint64_t)b->nblocks * b->block_size * 4;
    uint64_t minimal = BN_HDR + tbytes + (uint64_t)b->nblocks * (BN_ENTRY + 1) + BN_TRAILER;
    if (minimal > b->size || b->block_bytes / 256 > b->size) {
        snprintf(why, wl, "%s: %llu bytes cannot hold %u blocks of %u tokens (truncated?)", path,
                 (unsigned long long)b->size, b->nblocks, b->block_size);
        return -1;
    }
    uint8_t *tsec = malloc((size_t)tbytes);
    b->tokens = malloc((size_t)tbytes);
    b->entry_off = malloc((size_t)b->nblocks * sizeof *b->entry_off);
    b->raw = malloc((size_t)b->block_bytes);
    b->shuf = malloc((size_t)b->block_bytes);
    b->comp = malloc((size_t)LZ4_compressBound((int)b->block_bytes));
    XXH3_state_t *xs = XXH3_createState();
    int rc = -1;
    if (!tsec || !b->tokens || !b->entry_off || !b->raw || !b->shuf || !b->comp || !xs) {
        snprintf(why, wl, "%s: out of memory", path);
        goto out;
    }
    if (bread(b, tsec, (size_t)tbytes, BN_HDR) || !kd_sum_ok(kd_get_u64(h + 328), XXH3_64bits(tsec, (size_t)tbytes))) {
        snprintf(why, wl, "%s: token section unreadable or checksum mismatch", path);
        goto out;
    }
    for (uint64_t i = 0; i < tbytes / 4; i++) b->tokens[i] = kd_get_u32(tsec + 4 * i);
    XXH3_64bits_reset(xs);
    XXH3_64bits_update(xs, h, sizeof h);
    XXH3_64bits_update(xs, tsec, (size_t)tbytes);
    uint64_t off = BN_HDR + tbytes;
    for (uint32_t i = 0; i < b->nblocks; i++) {
        b->entry_off[i] = off;
        if (read_entry(b, i, &off, xs, why, wl)) goto out;
    }
    uint8_t tr[BN_TRAILER];
    if (b->size - off != BN_TRAILER || bread(b, tr, sizeof tr, off)) {
        snprintf(why, wl, "%s: %llu unexpected bytes after the last block (expected a %u-byte "
                 "trailer)", path, (unsigned long long)(b->size - off), BN_TRAILER);
        goto out;
    }
    if (memcmp(tr, BN_END, 8) || kd_get_u64(tr + 8) != b->nblocks ||
        !kd_sum_ok(kd_get_u64(tr + 16), XXH3_64bits_digest(xs))) {
        snprintf(why, wl, "%s: trailer missing or file checksum mismatch", path);
        goto out;
    }
    rc = 0;
out:
    free(tsec);
    if (xs) XXH3_freeState(xs);
    return rc;
}

/* ---- import ------------------------------------------------------------------------- */

static const char import_usage[] =
    "usage: kvdump import DIR BUNDLE [--capacity N] [--salt S] [--keep-seq ID] [--json]\n"
    "\n"
    "Load the prefix of a bundle into the cache in DIR (created if it has no arena).\n"
    "The bundle is checked completely first (lengths, checksums, every block); then\n"
    "the cache's geometry and model identity must equal the bundle's. Blocks the\n"
    "cache already holds are skipped; the others are appended, written and committed\n"
    "through the public API, so they are sealed, hashed and indexed like locally\n"
    "computed K/V and later prompts hit them. Needs the writer's lock: the cache must\n"
    "not be open elsewhere.\n"
    "\n"
    "  --capacity N    blocks of a new cache (default: max(1024, 2 x bundle blocks))\n"
    "  --salt S        import under salt S instead of the bundle's\n"
    "  --keep-seq ID   leave the prefix held by an open sequence ID (pinned, never\n"
    "                  evicted) instead of closing it (cached, evictable)\n";

/* What `kvdump import` was asked for. */
typedef struct import_req {
    const char *bundle_path;
    uint64_t capacity, salt, keep;
    bool have_salt, have_keep;
} import_req;

/* 0, or an exit code after kd_fail (-1: --help printed). */
static int import_parse(kd_ctx *x, int argc, char **argv, import_req *q) {
    kd_opt opts[] = {{"--capacity", true, NULL}, {"--salt", true, NULL},
                     {"--keep-seq", true, NULL}, {NULL, false, NULL}};
    const char *pos[2];
    int np = kd_parse(x, argc, argv, 2, opts, pos, 2, import_usage);
    if (np == -1) return -1;
    if (np < 0) return KD_USAGE;
    if (np != 2) return kd_fail(x, KD_USAGE, "expected DIR and BUNDLE (see kvdump import --help)");
    x->dir = pos[0];
    memset(q, 0, sizeof *q);
    q->bundle_path = pos[1];
    const char *v;
    if ((v = kd_optval(opts, "--capacity")) && (!kd_parse_u64(v, &q->capacity) || !q->capacity))
        return kd_fail(x, KD_USAGE, "--capacity: '%s' is not a positive number", v);
    if ((v = kd_optval(opts, "--salt"))) {
        if (!kd_parse_u64(v, &q->salt)) return kd_fail(x, KD_USAGE, "--salt: '%s' is not a number", v);
        q->have_salt = true;
    }
    if ((v = kd_optval(opts, "--keep-seq"))) {
        if (!kd_parse_u64(v, &q->keep)) return kd_fail(x, KD_USAGE, "--keep-seq: '%s' is not an id", v);
        q->have_keep = true;
    }
    return 0;
}

/* The target: an existing cache must match the bundle's geometry and model; a
 * missing one is created (q->capacity: its size, or 0 for an existing one).
 * *blocks: the capacity to budget memory for. 0, or an exit code. */
static int import_target(kd_ctx *x, const bundle *b, import_req *q, bool *created,
                         uint64_t *blocks) {
    char why[1024];
    kd_hdr h;
    *created = false;
    if (kd_read_header(x->dir, &h, why, sizeof why) == 0) {
        if (h.num_layers != b->num_layers || h.num_kv_heads != b->num_kv_heads ||
            h.head_dim != b->head_dim || h.block_size != b->block_size || h.dtype != b->dtype)
            return kd_fail(x, KD_USAGE, "geometry mismatch: the bundle holds %u layers x %u kv heads "
                           "x head_dim %u, %s, %u tokens per block; the cache %u x %u x %u, %s, %u",
                           b->num_layers, b->num_kv_heads, b->head_dim, kd_dtype_name(b->dtype),
                           b->block_size, h.num_layers, h.num_kv_heads, h.head_dim,
                           kd_dtype_name(h.dtype), h.block_size);
        if (strcmp(h.model_id, b->model_id)) {
            char m1[PKV_MODEL_ID_MAX + 1], m2[PKV_MODEL_ID_MAX + 1];
            kd_printable(b->model_id, m1, sizeof m1);
            kd_printable(h.model_id, m2, sizeof m2);
            return kd_fail(x, KD_USAGE, "model mismatch: the bundle holds K/V of model \"%s\", the "
                           "cache of \"%s\"", m1, m2);
        }
        if (q->capacity) kd_warn(x, "--capacity ignored: the cache exists");
        q->capacity = 0;
        *blocks = h.capacity;
        return 0;
    }
    char apath[4200];
    struct stat st;
    snprintf(apath, sizeof apath, "%s/arena", x->dir);
    if (!(stat(apath, &st) && errno == ENOENT)) return kd_fail(x, KD_USAGE, "%s", why);
    if (!q->capacity) q->capacity = b->nblocks * 2ull < 1024 ? 1024 : b->nblocks * 2ull;
    *created = true;
    *blocks = q->capacity;
    return 0;
}

/* Open (or create) the target for writing. 0, or an exit code. */
static int import_open(kd_ctx *x, const bundle *b, const import_req *q, uint64_t blocks,
                       pkv_cache **c) {
    char why[1024];
    if (kd_check_memory(blocks, b->block_size, why, sizeof why))
        return kd_fail(x, KD_USAGE, "%s", why);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = b->num_layers;
    o.num_kv_heads = b->num_kv_heads;
    o.head_dim = b->head_dim;
    o.block_size = b->block_size;
    o.dtype = (pkv_dtype)b->dtype;
    o.capacity = q->capacity;
    o.model_id = b->model_id;
    o.durability = PKV_DURABLE_NONE; /* one pkv_sync at the end makes it all durable */
    int rc = pkv_open(x->dir, &o, c);
    if (!rc) return 0;
    return kd_fail(x, rc == PKV_EGEOMETRY || rc == PKV_EMODEL || rc == PKV_ECORRUPT ||
                   rc == PKV_EVERSION ? KD_USAGE : KD_FAILED,
                   "cannot open %s for writing: %s: %s%s", x->dir, pkv_strerror(rc),
                   pkv_last_error(), rc == PKV_EBUSY ? " (import needs the writer's lock; "
                   "stop the process that holds the cache)" : "");
}

/* An import in progress: the sequence that carries the prefix in. */
typedef struct importer {
    pkv_cache *c;
    bundle *b;
    uint64_t id, salt, ntok;
    uint32_t *prompt;     /* the bundle's tokens and one more */
    pkv_slot *slots;      /* block_size */
    bool opened;
    uint32_t present, imported;
} importer;

/* Copy the K/V of bundle block b->raw into the slots of the appended block. */
static int import_payload(kd_ctx *x, importer *im) {
    const bundle *b = im->b;
    const uint64_t tokb = (uint64_t)b->head_dim * b->elem_size, run = b->block_size * tokb;
    for (uint32_t t = 0; t < b->block_size; t++)
        for (uint32_t l = 0; l < b->num_layers; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t hh = 0; hh < b->num_kv_heads; hh++) {
                    uint8_t *dst = pkv_kv(im->c, im->slots[t].block, l, (pkv_kind)k, hh);
                    const uint8_t *src = b->raw + (((uint64_t)l * 2 + k) * b->num_kv_heads + hh) * run;
                    if (!dst) return kd_fail(x, KD_FAILED, "pkv_kv returned no address");
                    memcpy(dst + im->slots[t].offset * tokb, src + t * tokb, (size_t)tokb);
                }
    return 0;
}

/* Append, fill and commit bundle block i. 0, or an exit code. */
static int import_block(kd_ctx *x, importer *im, uint32_t i) {
    bundle *b = im->b;
    const uint32_t bs = b->block_size;
    char why[1024];
    uint64_t off = b->entry_off[i];
    if (read_entry(b, i, &off, NULL, why, sizeof why)) /* changed since validated */
        return kd_fail(x, KD_USAGE, "%s", why);
    int rc = pkv_seq_append(im->c, im->id, im->prompt + (uint64_t)i * bs, bs, im->slots);
    if (rc)
        return kd_fail(x, KD_FAILED, "after %u of %u blocks: pkv_seq_append: %s: %s", im->imported,
                       b->nblocks - im->present, pkv_strerror(rc), pkv_last_error());
    if ((rc = import_payload(x, im))) return rc;
    rc = pkv_seq_commit(im->c, im->id, bs);
    if (rc)
        return kd_fail(x, KD_FAILED, "after %u blocks: pkv_seq_commit: %s: %s", im->imported,
                       pkv_strerror(rc), pkv_last_error());
    im->imported++;
    return 0;
}

/* Open a sequence on the bundle's prompt (the blocks already cached attach),
 * import the others, close it unless --keep-seq, sync. 0, or an exit code. */
static int import_blocks(kd_ctx *x, importer *im, const import_req *q) {
    const uint32_t bs = im->b->block_size;
    size_t n_cached = 0;
    int rc;
    for (int tries = 0;; tries++) {
        rc = pkv_seq_open(im->c, im->id, im->salt, im->prompt, im->ntok + 1, &n_cached);
        if (rc != PKV_EEXIST || q->have_keep || tries > 100) break;
        im->id++;
    }
    if (rc) return kd_fail(x, KD_FAILED, "pkv_seq_open: %s: %s", pkv_strerror(rc), pkv_last_error());
    im->opened = true;
    im->present = (uint32_t)(n_cached / bs);
    for (uint32_t i = im->present; i < im->b->nblocks; i++)
        if ((rc = import_block(x, im, i))) return rc;
    if (!q->have_keep) {
        rc = pkv_seq_close(im->c, im->id);
        im->opened = false;
        if (rc) return kd_fail(x, KD_FAILED, "pkv_seq_close: %s: %s", pkv_strerror(rc), pkv_last_error());
    }
    rc = pkv_sync(im->c);
    if (rc) return kd_fail(x, KD_FAILED, "pkv_sync: %s: %s", pkv_strerror(rc), pkv_last_error());
    return 0;
}

static void import_json(kd_ctx *x, const importer *im, const import_req *q, bool created,
                        uint32_t hit) {
    const bundle *b = im->b;
    kj *j = &x->j;
    kj_init(j, stdout);
    kj_begin_doc(j, "import");
    x->doc_open = true;
    kj_str(j, "dir", x->dir);
    kj_str(j, "bundle", b->path);
    kj_bool(j, "created", created);
    kj_str(j, "model_id", b->model_id);
    kj_u64(j, "blocks", b->nblocks);
    kj_u64(j, "tokens", im->ntok);
    kj_u64(j, "salt", im->salt);
    kj_u64(j, "present", im->present);
    kj_u64(j, "imported", im->imported);
    kj_u64(j, "hit_blocks", hit);
    if (q->have_keep) kj_u64(j, "seq", im->id);
    else kj_null(j, "seq");
    kj_u64(j, "stored_bytes", b->stored_bytes);
    kj_obj(j, "codecs", true);
    kj_u64(j, "raw", b->codecs[CODEC_RAW]);
    kj_u64(j, "lz4", b->codecs[CODEC_LZ4]);
    kj_u64(j, "shuffle_lz4", b->codecs[CODEC_SHUF_LZ4]);
    kj_end_obj(j);
    kj_end_doc(j);
}

static void import_text(const kd_ctx *x, const importer *im, const import_req *q, bool created,
                        uint32_t hit) {
    const bundle *b = im->b;
    char pm[PKV_MODEL_ID_MAX + 1];
    printf("imported %u block%s, skipped %u already present (%u blocks, %llu tokens, salt "
           "%llu, model \"%s\") into %s%s\n", im->imported, im->imported == 1 ? "" : "s",
           im->present, b->nblocks, (unsigned long long)im->ntok, (unsigned long long)im->salt,
           kd_printable(b->model_id, pm, sizeof pm), x->dir, created ? " (created)" : "");
    printf("a prompt starting with these %llu tokens now hits %u of %u blocks\n",
           (unsigned long long)im->ntok, hit, b->nblocks);
    if (q->have_keep) printf("the blocks are held by sequence %llu\n", (unsigned long long)im->id);
}

/* Import into the opened cache and report. 0, or an exit code. */
static int import_run(kd_ctx *x, importer *im, const import_req *q, bool created) {
    const bundle *b = im->b;
    uint32_t *chain = malloc(((size_t)b->nblocks + 1) * sizeof *chain);
    im->prompt = malloc((im->ntok + 1) * sizeof *im->prompt);
    im->slots = malloc((size_t)b->block_size * sizeof *im->slots);
    int rc = 0;
    if (!im->prompt || !im->slots || !chain) {
        rc = kd_fail(x, KD_FAILED, "out of memory");
    } else {
        memcpy(im->prompt, b->tokens, im->ntok * sizeof *im->prompt);
        im->prompt[im->ntok] = 0; /* one more token, so the whole prefix may hit */
        rc = import_blocks(x, im, q);
    }
    if (!rc) {
        /* What a prompt now finds (read-only lookup, no counters touched). */
        uint32_t bad, hit = chain_lookup(im->c, b->block_size, im->salt, im->prompt, b->nblocks,
                                         chain, false, &bad);
        if (x->json) import_json(x, im, q, created, hit);
        else import_text(x, im, q, created, hit);
        if (hit != b->nblocks)
            rc = kd_fail(x, KD_FAILED, "only %u of %u imported blocks are found by a prefix lookup",
                         hit, b->nblocks);
    }
    if (im->opened && !q->have_keep) pkv_seq_close(im->c, im->id);
    free(chain);
    free(im->prompt);
    free(im->slots);
    return rc;
}

int kd_cmd_import(kd_ctx *x, int argc, char **argv) {
    import_req q;
    int rc = import_parse(x, argc, argv, &q);
    if (rc) return rc < 0 ? KD_OK : rc;
    char why[1024];
    bundle b;
    if (bundle_open(&b, q.bundle_path, why, sizeof why)) {
        bundle_close(&b);
        return kd_fail(x, KD_USAGE, "%s", why);
    }
    bool created = false;
    uint64_t blocks = 0;
    importer im;
    memset(&im, 0, sizeof im);
    rc = import_target(x, &b, &q, &created, &blocks);
    if (!rc) rc = import_open(x, &b, &q, blocks, &im.c);
    if (!rc) {
        im.b = &b;
        im.salt = q.have_salt ? q.salt : b.salt;
        im.ntok = (uint64_t)b.nblocks * b.block_size;
        im.id = q.have_keep ? q.keep : 0xF000000000000000ull | ((uint64_t)getpid() << 16);
        rc = import_run(x, &im, &q, created);
        pkv_close(im.c);
    }
    bundle_close(&b);
    if (rc == KD_OK) {
        fflush(stdout);
        if (ferror(stdout)) return kd_fail(x, KD_FAILED, "writing the output failed");
    }
    return rc;
}

/*
 * fuzz_checkpoint.c — libFuzzer target for checkpoint decoding
 * (src/wal/checkpoint.c): the file header, the LZ4 chunk stream
 * (pkv_ckpt_read) and the raw snapshot (pkv_ckpt_load, which applies the
 * sequences through pkv_replay_apply), then the rebuild and verification that
 * end recovery, pkv_check and a full read-back.
 *
 * Input: byte 0 selects the template geometry (bits 0-1) and the mode (bit 2):
 *   0  the rest is a checkpoint file (ckpt-*), read through an in-memory I/O
 *      backend by pkv_ckpt_read and, if it decodes, loaded;
 *   1  the rest is a u64 arena secret and a raw (decompressed) snapshot,
 *      loaded directly, so the fuzzer mutates the snapshot, not LZ4 bytes.
 * The template cache takes the checkpoint's arena secret (the seed of the block
 * hashes), as if loading into the arena that wrote it.
 * Built against libpagedkv_fuzz, so the header and body checksums always match.
 */
#include "fuzz_template.h"
#include "internal.h"

#include <errno.h>
#include <stdlib.h>

typedef struct membuf {
    const uint8_t *p;
    size_t n;
} membuf;

static int m_open(void *ctx, const char *path, int flags, int mode) {
    (void)ctx, (void)path, (void)flags, (void)mode;
    return 1000;
}
static int m_close(void *ctx, int fd) {
    (void)ctx, (void)fd;
    return 0;
}
static long m_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off) {
    const membuf *m = ctx;
    (void)fd;
    if (off >= m->n) return 0;
    size_t k = m->n - off < n ? m->n - off : n;
    memcpy(buf, m->p + off, k);
    return (long)k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned geo = data[0] & 3, mode = (data[0] >> 2) & 1;
    data++;
    size--;
    uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees overreads */
    if (!copy) return 0;
    memcpy(copy, data, size);
    uint8_t *raw = NULL;
    size_t rawlen = 0;
    uint64_t secret = 0;
    int rc;
    if (mode == 0) {
        membuf m = {copy, size};
        pkv_io_ops io = {.ctx = &m, .open = m_open, .close = m_close, .pread = m_pread};
        uint64_t lsn = 0;
        uint64_t end_lsn = 0;
        /* a full checkpoint or a delta, whichever the input's magic names */
        const char *magic = size >= 8 && !memcmp(copy, DELTA_MAGIC, 8) ? DELTA_MAGIC
                                                                       : CKPT_MAGIC;
        rc = pkv_ckpt_read(&io, "fuzz-ckpt", magic, &secret, &lsn, &end_lsn, &raw, &rawlen,
                           NULL);
        FZ_ASSERT(rc == 0 || rc == PKV_ECORRUPT || rc == PKV_EVERSION || rc == PKV_ENOMEM,
                  "pkv_ckpt_read: %d", rc);
        if (rc) {
            free(copy);
            return 0;
        }
    } else {
        if (size < 8) {
            free(copy);
            return 0;
        }
        secret = pkv_get_u64(copy);
        raw = malloc(size - 8 ? size - 8 : 1);
        if (!raw) {
            free(copy);
            return 0;
        }
        memcpy(raw, copy + 8, size - 8);
        rawlen = size - 8;
    }
    pkv_cache *c = fz_template_open(geo);
    c->arena.secret = secret;
    rc = pkv_ckpt_load(c, raw, rawlen, true);
    FZ_ASSERT(rc == 0 || rc == PKV_ECORRUPT || rc == PKV_ENOMEM, "pkv_ckpt_load: %d", rc);
    if (!rc) {
        rc = pkv_replay_rebuild(c);
        FZ_ASSERT(rc == 0 || rc == PKV_ENOMEM, "rebuild: %d", rc);
        if (!rc) fz_exercise(c, "loading a fuzzed checkpoint");
    }
    pkv_close(c);
    free(raw);
    free(copy);
    return 0;
}

/*
 * fuzz_record.c — libFuzzer target for log frame and record parsing: the frame
 * checks of src/wal/replay.c (frame_ok, frame_apply, later_valid, through the
 * pkv_replay_* wrappers), record decoding (pkv_rec_decode, src/wal/record.c),
 * applying records to the raw recovery state (pkv_replay_apply), and the rebuild
 * and verification that end recovery; then pkv_check and a full read-back.
 *
 * Input: byte 0 selects the template geometry (bits 0-1) and the checkpoint LSN
 * the log continues from (bits 2-3: 0, 1, 5 or 20); the rest is a segment image
 * (64-byte header, frames from offset 64), as in a wal-* file. Only the epoch
 * (offset 12) and the arena secret (offset 32, the seed of the block hashes) are
 * taken from the header; header validation is fuzz_recover's job.
 * Built against libpagedkv_fuzz, so frame and record checksums always match.
 */
#include "fuzz_template.h"
#include "internal.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned geo = data[0] & 3;
    static const uint64_t afters[4] = {0, 1, 5, 20};
    uint64_t after = afters[(data[0] >> 2) & 3];
    data++;
    size--;
    if (size < SEG_HDR) return 0;
    /* The frame reader expects a buffer it may scan to the end; give it a copy
     * so ASan catches reads past the input. */
    uint8_t *img = malloc(size);
    if (!img) return 0;
    memcpy(img, data, size);
    uint32_t epoch = pkv_get_u32(img + 12);

    pkv_cache *c = fz_template_open(geo);
    /* Block hashes are seeded with the arena secret, which the segment header
     * repeats (offset 32): replay as if into the arena that wrote the log. */
    c->arena.secret = pkv_get_u64(img + 32);
    uint64_t expect = after + 1, applied = 0;
    size_t off = SEG_HDR;
    int rc = 0;
    for (;;) {
        uint64_t first;
        uint32_t nrec, bytes;
        if (!pkv_replay_frame_ok(img, size, epoch, off, &first, &nrec, &bytes)) break;
        /* What frame_ok accepted must lie inside the image. */
        FZ_ASSERT(off + FRAME_HDR + bytes <= size, "frame_ok accepted a frame past the end");
        if (first + nrec - 1 < expect) {
            off += FRAME_HDR + bytes;
            continue;
        }
        if (first > expect) break;
        rc = pkv_replay_frame_apply(c, img, size, epoch, off, first, nrec, bytes, expect - 1,
                                    &applied);
        if (rc) {
            /* Recovery refuses the log; the state is discarded with the handle. */
            FZ_ASSERT(rc == PKV_ECORRUPT || rc == PKV_ENOMEM, "frame_apply: %d", rc);
            break;
        }
        expect = first + nrec;
        off += FRAME_HDR + bytes;
    }
    if (!rc) {
        uint64_t lsn;
        size_t at;
        (void)pkv_replay_scan(img, size, epoch, off, expect, false, &lsn, &at);
        rc = pkv_replay_rebuild(c);
        FZ_ASSERT(rc == 0 || rc == PKV_ENOMEM, "rebuild: %d", rc);
        if (!rc) fz_exercise(c, "replaying a fuzzed segment");
    }
    pkv_close(c);
    free(img);
    return 0;
}

/*
 * fuzz_wire.c — pkvd's frame decoder (src/wire.c), the daemon's one entry for
 * untrusted bytes. The input is a stream of frames, as a client would send
 * them; each is decoded exactly as pkvd does (pkvd_hdr_get, then
 * pkvd_req_decode on the payload) until one is refused or the input ends.
 * Checks: nothing reads outside the input (ASan), and every accepted payload
 * re-encodes, field by field in the order docs/pkvd.md gives, to exactly the
 * bytes it came from (so the decoder accepts only the documented layout, with
 * counts that match the length and stay within the limits).
 */
#include "fuzz_common.h"
#include "wire.h"

#include <string.h>

static void encode(const pkvd_req *r, pkvd_wr *w) {
    switch (r->op) {
    case PKVD_HELLO:
        pkvd_put_u16(w, r->vmin);
        pkvd_put_u16(w, r->vmax);
        pkvd_put_u32(w, r->flags);
        return;
    case PKVD_LOOKUP:
        pkvd_put_u64(w, r->salt);
        break;
    case PKVD_SEQ_OPEN:
        pkvd_put_u64(w, r->id);
        pkvd_put_u64(w, r->salt);
        break;
    case PKVD_APPEND:
        pkvd_put_u64(w, r->id);
        break;
    case PKVD_COMMIT_APPEND:
        pkvd_put_u64(w, r->id);
        pkvd_put_u64(w, r->count);
        break;
    case PKVD_STEP_BATCH:
        FZ_ASSERT(r->n <= PKVD_MAX_STEPS, "%u steps", r->n);
        pkvd_put_u32(w, r->n);
        pkvd_put_bytes(w, r->steps, (size_t)r->n * PKVD_STEP_BYTES);
        return;
    case PKVD_COMMIT:
    case PKVD_TRUNCATE:
        pkvd_put_u64(w, r->id);
        pkvd_put_u64(w, r->count);
        return;
    case PKVD_FORK:
        pkvd_put_u64(w, r->id);
        pkvd_put_u64(w, r->id2);
        return;
    case PKVD_CLOSE:
    case PKVD_INFO:
        pkvd_put_u64(w, r->id);
        return;
    case PKVD_BLOCKS:
    case PKVD_TOKENS:
        FZ_ASSERT(r->n <= PKVD_MAX_LIST, "cap %u", r->n);
        pkvd_put_u64(w, r->id);
        pkvd_put_u32(w, r->n);
        return;
    case PKVD_STATS:
    case PKVD_SYNC:
    case PKVD_CLIENTS:
        return;
    default:
        fz_fail("accepted unknown op %u", r->op);
    }
    /* the ops with tokens */
    FZ_ASSERT(r->n <= (r->op == PKVD_APPEND || r->op == PKVD_COMMIT_APPEND ? PKVD_MAX_SLOTS
                                                                          : PKVD_MAX_TOKENS),
              "%u tokens", r->n);
    pkvd_put_u32(w, r->n);
    pkvd_put_bytes(w, r->tokens, (size_t)r->n * 4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    while (size >= PKVD_HDR) {
        pkvd_hdr h;
        if (pkvd_hdr_get(data, &h, false, 0)) return 0; /* refused: pkvd hangs up */
        FZ_ASSERT(h.len <= PKVD_MAX_PAYLOAD && h.op > 0 && h.op < PKVD_OP_END,
                  "accepted header: op %u, %u bytes", h.op, h.len);
        /* another version passes only in a HELLO, whose frame every version shares
         * (pkvd then refuses it with PKV_EVERSION unless its range holds ours) */
        FZ_ASSERT(h.version == PKVD_VERSION || h.op == PKVD_HELLO,
                  "accepted version %u in op %u", h.version, h.op);
        data += PKVD_HDR, size -= PKVD_HDR;
        if (h.len > size) return 0; /* truncated: pkvd waits, then sees the end */
        pkvd_req r;
        if (pkvd_req_decode(h.op, data, h.len, &r) == 0) {
            FZ_ASSERT(r.op == h.op, "op %u decoded as %u", h.op, r.op);
            pkvd_wr w = {0};
            encode(&r, &w);
            FZ_ASSERT(!w.oom, "out of memory");
            FZ_ASSERT(w.len == h.len && (h.len == 0 || memcmp(w.p, data, h.len) == 0),
                      "op %u: accepted %u bytes that re-encode as %zu other bytes", h.op,
                      h.len, w.len);
            pkvd_wr_free(&w);
        } else {
            return 0; /* refused: pkvd answers and hangs up */
        }
        data += h.len, size -= h.len;
    }
    return 0;
}

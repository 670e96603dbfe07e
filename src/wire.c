/*
 * wire.c — encoding and decoding of pkvd frames (wire.h, docs/pkvd.md).
 *
 * Owns no state. Every reader is bounds-checked against the bytes it was
 * given; pkvd_req_decode is the daemon's one entry for untrusted payloads and
 * accepts a payload only when its length equals the op's fixed part plus its
 * counted part, every count within the limits (fuzz/fuzz_wire.c).
 */
#include "wire.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void pkvd_hdr_put(uint8_t out[PKVD_HDR], uint16_t op, uint32_t len, uint32_t req) {
    pkvd_hdr_put_v(out, PKVD_VERSION, op, len, req);
}

void pkvd_hdr_put_v(uint8_t out[PKVD_HDR], uint16_t version, uint16_t op, uint32_t len,
                    uint32_t req) {
    put_le(out, PKVD_MAGIC, 4);
    put_le(out + 4, version, 2);
    put_le(out + 6, op, 2);
    put_le(out + 8, len, 4);
    put_le(out + 12, req, 4);
}

int pkvd_hdr_get(const uint8_t in[PKVD_HDR], pkvd_hdr *h, bool reply, uint16_t want_op) {
    h->magic = pkvd_le32(in);
    h->version = (uint16_t)(in[4] | in[5] << 8);
    h->op = (uint16_t)(in[6] | in[7] << 8);
    h->len = pkvd_le32(in + 8);
    h->req = pkvd_le32(in + 12);
    if (h->magic != PKVD_MAGIC) return pkv_err(PKV_EINVAL, "bad frame magic 0x%08x", h->magic);
    if (h->len > PKVD_MAX_PAYLOAD)
        return pkv_err(PKV_EINVAL, "frame payload of %u bytes exceeds %u", h->len,
                       PKVD_MAX_PAYLOAD);
    if (reply ? h->op != (want_op | PKVD_REPLY)
              : (h->op == 0 || h->op >= PKVD_OP_END))
        return pkv_err(PKV_EINVAL, "unexpected op 0x%x", h->op);
    /* HELLO's frame is the same in every version: its version is the caller's to
     * check, with a clear refusal (wire.h) */
    if (h->version != PKVD_VERSION && (h->op & ~PKVD_REPLY) != PKVD_HELLO)
        return pkv_err(PKV_EVERSION, "protocol version %u, expected %u", h->version,
                       PKVD_VERSION);
    return 0;
}

uint16_t pkvd_get_u16(pkvd_rd *r) {
    const uint8_t *p = pkvd_get_bytes(r, 2);
    return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}
uint32_t pkvd_get_u32(pkvd_rd *r) {
    const uint8_t *p = pkvd_get_bytes(r, 4);
    return p ? pkvd_le32(p) : 0;
}
uint64_t pkvd_get_u64(pkvd_rd *r) {
    const uint8_t *p = pkvd_get_bytes(r, 8);
    return p ? pkvd_le64(p) : 0;
}
const uint8_t *pkvd_get_bytes(pkvd_rd *r, size_t n) {
    if (r->bad || n > r->left) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

static uint8_t *wr_room(pkvd_wr *w, size_t n) {
    if (w->oom) return NULL;
    if (w->cap - w->len < n) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len < n) cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            w->oom = true;
            return NULL;
        }
        w->p = p;
        w->cap = cap;
    }
    uint8_t *at = w->p + w->len;
    w->len += n;
    return at;
}
void pkvd_put_u16(pkvd_wr *w, uint16_t v) {
    uint8_t *p = wr_room(w, 2);
    if (p) put_le(p, v, 2);
}
void pkvd_put_u32(pkvd_wr *w, uint32_t v) {
    uint8_t *p = wr_room(w, 4);
    if (p) put_le(p, v, 4);
}
void pkvd_put_u64(pkvd_wr *w, uint64_t v) {
    uint8_t *p = wr_room(w, 8);
    if (p) put_le(p, v, 8);
}
void pkvd_put_bytes(pkvd_wr *w, const void *b, size_t n) {
    uint8_t *p = wr_room(w, n);
    if (p && n) memcpy(p, b, n);
}
void pkvd_wr_free(pkvd_wr *w) {
    free(w->p);
    memset(w, 0, sizeof *w);
}

/* The op's fixed part, then `n` counted items of `item` bytes; the length must
 * match exactly. */
static int counted(pkvd_rd *rd, pkvd_req *r, uint32_t limit, size_t item,
                   const uint8_t **items, const char *what) {
    r->n = pkvd_get_u32(rd);
    if (rd->bad) return pkv_err(PKV_EINVAL, "op %u: payload too short", r->op);
    if (r->n > limit)
        return pkv_err(PKV_EINVAL, "op %u: %u %s exceed the limit %u", r->op, r->n, what, limit);
    if (rd->left != (size_t)r->n * item)
        return pkv_err(PKV_EINVAL, "op %u: %u %s need %zu bytes, the payload has %zu", r->op,
                       r->n, what, (size_t)r->n * item, rd->left);
    *items = pkvd_get_bytes(rd, rd->left);
    return 0;
}

int pkvd_req_decode(uint16_t op, const uint8_t *payload, size_t len, pkvd_req *r) {
    memset(r, 0, sizeof *r);
    r->op = op;
    pkvd_rd rd = {.p = payload, .left = len};
    int rc = 0;
    switch (op) {
    case PKVD_HELLO:
        r->vmin = pkvd_get_u16(&rd);
        r->vmax = pkvd_get_u16(&rd);
        r->flags = pkvd_get_u32(&rd);
        break;
    case PKVD_LOOKUP:
        r->salt = pkvd_get_u64(&rd);
        return counted(&rd, r, PKVD_MAX_TOKENS, 4, &r->tokens, "tokens");
    case PKVD_SEQ_OPEN:
        r->id = pkvd_get_u64(&rd);
        r->salt = pkvd_get_u64(&rd);
        return counted(&rd, r, PKVD_MAX_TOKENS, 4, &r->tokens, "tokens");
    case PKVD_APPEND:
        r->id = pkvd_get_u64(&rd);
        return counted(&rd, r, PKVD_MAX_SLOTS, 4, &r->tokens, "tokens");
    case PKVD_COMMIT_APPEND:
        r->id = pkvd_get_u64(&rd);
        r->count = pkvd_get_u64(&rd);
        return counted(&rd, r, PKVD_MAX_SLOTS, 4, &r->tokens, "tokens");
    case PKVD_STEP_BATCH:
        return counted(&rd, r, PKVD_MAX_STEPS, PKVD_STEP_BYTES, &r->steps, "steps");
    case PKVD_COMMIT:
    case PKVD_TRUNCATE:
        r->id = pkvd_get_u64(&rd);
        r->count = pkvd_get_u64(&rd);
        break;
    case PKVD_FORK:
        r->id = pkvd_get_u64(&rd);
        r->id2 = pkvd_get_u64(&rd);
        break;
    case PKVD_CLOSE:
    case PKVD_INFO:
        r->id = pkvd_get_u64(&rd);
        break;
    case PKVD_BLOCKS:
    case PKVD_TOKENS:
        r->id = pkvd_get_u64(&rd);
        r->n = pkvd_get_u32(&rd);
        if (r->n > PKVD_MAX_LIST)
            rc = pkv_err(PKV_EINVAL, "op %u: cap %u exceeds %u", op, r->n, PKVD_MAX_LIST);
        break;
    case PKVD_STATS:
    case PKVD_SYNC:
    case PKVD_CLIENTS:
        break;
    default:
        return pkv_err(PKV_EINVAL, "unknown op %u", op);
    }
    if (rc) return rc;
    if (rd.bad || rd.left)
        return pkv_err(PKV_EINVAL, "op %u: payload of %zu bytes, not the op's size", op, len);
    return 0;
}

void pkvd_put_stats(pkvd_wr *w, const pkv_stats *st) {
#define PUT(f) pkvd_put_u64(w, (uint64_t)(int64_t)st->f);
    PKVD_STATS_FIELDS(PUT)
#undef PUT
}

bool pkvd_get_stats(pkvd_rd *rd, pkv_stats *st) {
    memset(st, 0, sizeof *st);
#define GET(f) st->f = (__typeof__(st->f))pkvd_get_u64(rd);
    PKVD_STATS_FIELDS(GET)
#undef GET
    return !rd->bad && !rd->left;
}

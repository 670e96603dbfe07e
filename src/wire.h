/*
 * wire.h — pkvd's wire protocol, version 3 (docs/pkvd.md): the frame header,
 * the ops, the limits, and bounds-checked readers and a growing writer for
 * payloads. Shared by the client (remote.c, in libpagedkv) and the daemon
 * (tools/pkvd/), so both sides encode and decode with the same code.
 *
 * Invariants: every integer is little-endian; a reader never reads past the
 * payload it was given (a short read sets `bad` and yields zeros);
 * pkvd_req_decode accepts a payload only when its length is exactly what the
 * op's fixed part and counts imply, with every count within the limits below,
 * so a daemon that allocates from a decoded count allocates at most
 * PKVD_MAX_PAYLOAD-proportional memory. The decoder checks form only; ids,
 * salts and values are checked by the daemon (ids, salts) and the library.
 */
#ifndef PKV_WIRE_H
#define PKV_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PKVD_MAGIC 0x44564B50u /* "PKVD" little-endian */
/* Any change to any payload's layout bumps this (docs/pkvd.md, "Versions"). 1: the
 * first; 2: CLIENTS lists each connection's flags and sequences, HELLO flags, STATS
 * carries every pkv_stats field (the wait, limbo and tier counters); 3: STATS
 * carries the tier's lookup counters (tier_lookups to tier_lookup_found). What
 * never changes, so that peers of different versions can tell each other so: the
 * frame header, HELLO's request payload and an error reply's rc and message. */
#define PKVD_VERSION 3u
#define PKVD_REPLY 0x8000u
#define PKVD_HDR 16u
#define PKVD_MAX_TOKENS (4u << 20)  /* tokens in one request */
#define PKVD_MAX_STEPS 65536u       /* steps in one batch */
#define PKVD_MAX_PAYLOAD ((16u << 20) + 64u)
#define PKVD_MAX_MSG 255u           /* error message bytes in a reply */
/* The counts whose replies grow with them are bounded so that the largest reply
 * fits in a frame: a request the daemon accepts and carries out must never have
 * a reply it cannot send (it would end the connection, and with it every
 * sequence of the client, after the call took effect). */
#define PKVD_MAX_SLOTS (2u << 20)   /* APPEND, COMMIT_APPEND: 8-byte slot each */
#define PKVD_MAX_LIST ((4u << 20) - 64u) /* BLOCKS, TOKENS: 4 bytes each, with an ERANGE message */
_Static_assert(4 + 8ull * PKVD_MAX_SLOTS <= PKVD_MAX_PAYLOAD, "APPEND reply fits a frame");
_Static_assert(4 + 2 + PKVD_MAX_MSG + 8 + 4ull * PKVD_MAX_LIST <= PKVD_MAX_PAYLOAD,
               "BLOCKS/TOKENS reply fits a frame");
_Static_assert(4 + 2 + PKVD_MAX_MSG + 4 + 8ull * PKVD_MAX_STEPS <= PKVD_MAX_PAYLOAD,
               "STEP_BATCH reply fits a frame");

enum pkvd_op {
    PKVD_HELLO = 1,
    PKVD_LOOKUP = 2,
    PKVD_SEQ_OPEN = 3,
    PKVD_APPEND = 4,
    PKVD_COMMIT = 5,
    PKVD_COMMIT_APPEND = 6,
    PKVD_STEP_BATCH = 7,
    PKVD_FORK = 8,
    PKVD_TRUNCATE = 9,
    PKVD_CLOSE = 10,
    PKVD_INFO = 11,
    PKVD_BLOCKS = 12,
    PKVD_TOKENS = 13,
    PKVD_STATS = 14,
    PKVD_SYNC = 15,
    PKVD_CLIENTS = 16, /* pkvd --status: the connections and their sequences */
    PKVD_OP_END
};

typedef struct pkvd_hdr {
    uint32_t magic;
    uint16_t version, op;
    uint32_t len, req;
} pkvd_hdr;

void pkvd_hdr_put(uint8_t out[PKVD_HDR], uint16_t op, uint32_t len, uint32_t req);
/* pkvd_hdr_put with another version in the header: the daemon answers a HELLO it
 * refuses in the version of the HELLO's header, so that a peer of another version
 * can read the refusal. */
void pkvd_hdr_put_v(uint8_t out[PKVD_HDR], uint16_t version, uint16_t op, uint32_t len,
                    uint32_t req);
/* Decode and check a header: magic, version, length limit, and an op that is a
 * known request (reply == false) or a reply to `want_op` (reply == true).
 * The version must be PKVD_VERSION, except in a HELLO and its reply, whose
 * header and payload are the same in every version: there the caller checks
 * h->version itself and refuses a mismatch with PKV_EVERSION ("protocol version
 * X, expected Y"). 0, PKV_EVERSION (another version outside HELLO) or PKV_EINVAL
 * (message set). */
int pkvd_hdr_get(const uint8_t in[PKVD_HDR], pkvd_hdr *h, bool reply, uint16_t want_op);

typedef struct pkvd_rd {
    const uint8_t *p;
    size_t left;
    bool bad; /* a read ran past the end */
} pkvd_rd;

uint16_t pkvd_get_u16(pkvd_rd *r);
uint32_t pkvd_get_u32(pkvd_rd *r);
uint64_t pkvd_get_u64(pkvd_rd *r);
/* n bytes, or NULL (bad set) if fewer are left. */
const uint8_t *pkvd_get_bytes(pkvd_rd *r, size_t n);

typedef struct pkvd_wr {
    uint8_t *p;
    size_t len, cap;
    bool oom; /* a put could not grow the buffer; the content is incomplete */
} pkvd_wr;

void pkvd_put_u16(pkvd_wr *w, uint16_t v);
void pkvd_put_u32(pkvd_wr *w, uint32_t v);
void pkvd_put_u64(pkvd_wr *w, uint64_t v);
void pkvd_put_bytes(pkvd_wr *w, const void *b, size_t n);
void pkvd_wr_free(pkvd_wr *w);

/* A decoded request. Fields an op does not carry are 0. tokens/steps point
 * into the payload (raw little-endian; use pkvd_token / pkvd_step_at). */
typedef struct pkvd_req {
    uint16_t op;
    uint16_t vmin, vmax;  /* HELLO */
    uint32_t flags;       /* HELLO */
    uint64_t id, id2;     /* the sequence; FORK: parent, child */
    uint64_t salt;
    uint64_t count;       /* COMMIT n, TRUNCATE new_len, COMMIT_APPEND n_commit */
    uint32_t n;           /* tokens, steps, or BLOCKS/TOKENS cap */
    const uint8_t *tokens; /* n x u32 */
    const uint8_t *steps;  /* n x (u64 id, u32 n_commit, u32 token) */
} pkvd_req;

#define PKVD_STEP_BYTES 16u

/* HELLO flags. RDONLY: the client asks for a read-only connection (its arena
 * descriptor is opened O_RDONLY and the calls that hand out slots are refused
 * with PKV_ERDONLY); pkvd --allow-uid-ro makes every connection of a uid one.
 * Other bits are refused. */
#define PKVD_HELLO_RDONLY 1u

/* Decode the payload of request `op` (a checked header's). 0 or PKV_EINVAL
 * with the reason in the message: wrong length for the op, counts over the
 * limits, unknown op. */
int pkvd_req_decode(uint16_t op, const uint8_t *payload, size_t len, pkvd_req *r);

/* pkv_stats on the wire (STATS reply): every field in declaration order, each
 * widened to u64 (signed ones sign-extended). A field added to pkv_stats is
 * added here, at the end, with a version bump. */
#define PKVD_STATS_FIELDS(X)                                                        \
    X(capacity) X(blocks_free) X(blocks_cached) X(blocks_used) X(blocks_sealed)     \
    X(sequences) X(hit_tokens) X(miss_tokens) X(hit_blocks) X(miss_blocks)          \
    X(evictions) X(cow_copies) X(dedupes) X(seals) X(verify_failures)               \
    X(wal_records) X(wal_frames) X(wal_syncs) X(wal_bytes) X(last_lsn)              \
    X(durable_lsn) X(checkpoints) X(checkpoint_deltas) X(checkpoint_lsn)            \
    X(cuda_handles) X(cuda_mode) X(seal_sums_ahead) X(wal_max_delay_us)             \
    X(checkpoint_failures) X(checkpoint_error) X(checkpoint_backoff_ms)             \
    X(waits_limbo) X(waits_seal) X(waits_backlog) X(wait_limbo_us) X(wait_seal_us)  \
    X(wait_backlog_us) X(limbo_evict_max) X(blocks_limbo) X(tier_published)         \
    X(tier_publish_dropped) X(tier_publish_errors) X(tier_fetches)                  \
    X(tier_fetch_blocks) X(tier_fetch_found) X(tier_imported) X(tier_rejected)      \
    X(tier_errors) X(tier_deadline_misses) X(tier_redirects) X(tier_deleted)        \
    X(tier_delete_failed) X(tier_lookups) X(tier_lookup_blocks) X(tier_lookup_found)

struct pkv_stats;
/* The STATS reply's payload after its rc: every PKVD_STATS_FIELDS field. The
 * reader is true only for a payload of exactly those fields (*st zeroed first). */
void pkvd_put_stats(pkvd_wr *w, const struct pkv_stats *st);
bool pkvd_get_stats(pkvd_rd *rd, struct pkv_stats *st);

static inline uint32_t pkvd_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t pkvd_le64(const uint8_t *p) {
    return (uint64_t)pkvd_le32(p) | (uint64_t)pkvd_le32(p + 4) << 32;
}

#endif

/*
 * tier.h — the shared prefix tier's private interface (docs/remote.md): the
 * record format (tier_record.c), the cluster client (tier_redis.c) and the
 * publish/fetch engine (tier.c) offer each other these.
 *
 * The record is the unit stored in the tier: one sealed block with everything
 * needed to prove, without trusting the store, that its K/V stands for the exact
 * token prefix a reader asks for (rule T1). It names the whole prefix's token
 * ids, not only the block's, so the proof is exact and relies on no hash.
 */
#ifndef PKV_TIER_H
#define PKV_TIER_H

#include "hmac.h"
#include "internal.h"

#define PKV_TIER_MAGIC 0x54564B50u /* "PKVT" */
#define PKV_TIER_VERSION 2u         /* 1: keyed XXH3 tag (read as a rejection) */
#define PKV_TIER_HDR 96u            /* fixed part before the model id */
#define PKV_TIER_TAG 32u            /* HMAC-SHA-256 at the end */
#define PKV_TIER_SECRET 192u        /* XXH3 secret of the key names */
#define PKV_TIER_MAX_DEPTH (1u << 20) /* blocks of prefix a record may name */
#define PKV_TIER_MAX_PAYLOAD (1ull << 30)
#define PKV_TIER_KEY_LEN 36u        /* "pkv:" + 32 hex digits */

/* How the payload is stored. */
enum { PKV_TIER_ENC_RAW = 0, PKV_TIER_ENC_LZ4 = 1 };

/* The cluster-wide keys: derived from the shared secret, never from the cache's.
 * Each purpose has its own HMAC-derived key, so what the key names could ever
 * reveal (they are XXH3, not a PRF one may lean on) says nothing of the MAC key. */
typedef struct pkv_tier_keys {
    pkv_hmac_key mac;                /* the record tag */
    uint8_t secret[PKV_TIER_SECRET]; /* XXH3 secret of the key names */
    uint64_t seed;                   /* chained-hash seed (pkv_hash_root/block) */
} pkv_tier_keys;

void pkv_tier_keys_derive(pkv_tier_keys *k, const void *secret, size_t len);

/* A decoded record: pointers into the buffer it was decoded from. */
typedef struct pkv_tier_rec {
    uint32_t num_layers, num_kv_heads, head_dim, block_size, dtype, depth;
    uint64_t salt;
    pkv_h128 parent, hash;
    const char *model;
    uint32_t model_len;
    const uint8_t *tokens; /* (depth + 1) * block_size little-endian u32 */
    uint64_t payload_len;  /* the K/V's length (block_bytes) */
    uint32_t encoding;     /* PKV_TIER_ENC_RAW or PKV_TIER_ENC_LZ4 */
    const uint8_t *payload; /* as stored: stored_len bytes */
    uint64_t stored_len;    /* RAW: payload_len; LZ4: the compressed length */
} pkv_tier_rec;

/* Size of the record for these parameters (0 if out of the format's limits). */
uint64_t pkv_tier_rec_size(uint32_t model_len, uint32_t depth, uint32_t bs,
                           uint64_t stored_len);
/* Encode into out (pkv_tier_rec_size bytes): r's fields, tokens as host u32,
 * r->payload as stored (compressed by the caller when r->encoding says so). */
void pkv_tier_encode(const pkv_tier_keys *k, const pkv_tier_rec *r, const uint32_t *tokens,
                     uint8_t *out);
/* Strict decoder: exact length, limits, version, encoding, tag. 0 or
 * PKV_ECORRUPT / PKV_EVERSION with a message. */
int pkv_tier_decode(const pkv_tier_keys *k, const uint8_t *buf, size_t len,
                    pkv_tier_rec *out);
/* The K/V of a decoded record into out (r->payload_len bytes): a copy, or an
 * LZ4 decompression that must fill exactly payload_len bytes. 0 or
 * PKV_ECORRUPT. */
int pkv_tier_unpack(const pkv_tier_rec *r, uint8_t *out);
/* Whether a value that failed decoding may be deleted from the tier: true
 * unless it is a record of a newer version than this build reads (a newer
 * node's, during a rolling upgrade). */
bool pkv_tier_deletable(const uint8_t *buf, size_t len);

/* What a reader expects of the record at chain depth `depth` (rule T1). */
typedef struct pkv_tier_want {
    const pkv_geometry *geo;
    const char *model;
    uint64_t salt;
    uint32_t depth;
    pkv_h128 parent, hash;
    const uint32_t *prompt; /* at least (depth + 1) * block_size tokens */
} pkv_tier_want;
/* 0, or PKV_ECORRUPT naming the first field that differs. */
int pkv_tier_verify(const pkv_tier_rec *r, const pkv_tier_want *w);

/* The key of the block whose tier chain hash is h for model `model` in
 * geometry g (layers, KV heads, head_dim, block size, dtype): caches of one
 * model in two dtypes never share a key, so neither takes the other's record
 * for a bad one and deletes it. */
void pkv_tier_key(const pkv_tier_keys *k, pkv_h128 h, const pkv_geometry *g, const char *model,
                  char out[PKV_TIER_KEY_LEN + 1]);

/* ---- The cluster client (tier_redis.c) ---------------------------------- */

typedef struct pkv_rc pkv_rc; /* one client: its connections and slot map; one
                                 thread at a time */
typedef struct pkv_rc_conf {
    char nodes[1024];
    char user[128], password[256];
    uint32_t connect_timeout_ms;
} pkv_rc_conf;

/* One command of a pipeline. GET: val NULL. SET key val PX ttl_ms. With
 * del_if_equal: delete key only if its value is still val, atomically on the
 * server (a Lua script: GET, compare, DEL). */
typedef struct pkv_rc_cmd {
    const char *key;
    const uint8_t *val;
    size_t val_len;
    uint64_t ttl_ms;
    bool del_if_equal;
    bool exists; /* EXISTS key (val NULL): integer 1 or 0, no value read */
    /* results */
    int status;       /* 0: answered (value, nil, OK or an integer), <0: error/timeout/node down */
    uint8_t *out;     /* GET: malloc'ed value (NULL: nil or error) */
    size_t out_len;
    long long integer; /* del_if_equal: 1 deleted, 0 the value had changed or gone;
                          exists: 1 the key exists, 0 not */
} pkv_rc_cmd;

typedef struct pkv_rc_stats {
    uint64_t redirects;
} pkv_rc_stats;

/* NULL with *err set (PKV_EINVAL: a malformed node list; PKV_ENOMEM). */
pkv_rc *pkv_rc_new(const pkv_rc_conf *conf, int *err);
void pkv_rc_free(pkv_rc *rc);
/* Run cmds (GETs or SETs) grouped by node, pipelined, until deadline_ns
 * (CLOCK_MONOTONIC). Follows MOVED and ASK once. Never blocks past the deadline
 * (by more than the 1 ms floor of a socket timeout). Returns how many commands
 * were answered. */
size_t pkv_rc_run(pkv_rc *rc, pkv_rc_cmd *cmds, size_t n, uint64_t deadline_ns,
                  pkv_rc_stats *st);
/* The Redis cluster slot of a key (CRC16 XMODEM mod 16384, hash tags). */
uint32_t pkv_rc_slot(const char *key, size_t len);

/* ---- The engine (tier.c) -------------------------------------------------- */

typedef struct pkv_tier pkv_tier;
/* seq.c, after a seal that entered the index (not a dedupe), lock held; b is
 * at chain depth `depth` (its index in the sequence's table). */
void pkv_tier_on_seal(pkv_cache *c, uint32_t b, uint32_t depth);
/* seq.c, pkv_seq_open with the lock held, after it attached blocks[0, n) of a
 * chain (blocks[i] at depth i): with PKV_TIER_PUBLISH_ON_HIT, each one not yet
 * offered to the tier is queued for publishing (rule T2 applies as at a seal). */
void pkv_tier_on_hit(pkv_cache *c, const uint32_t *blocks, uint32_t n);
/* Whether a tier is attached whose flags make pkv_prefix_lookup ask it
 * (PKV_TIER_LOOKUP without PKV_TIER_NO_FETCH); lock held. */
bool pkv_tier_lookup_on(const pkv_cache *c);
/* pkv_prefix_lookup, without the lock: how many of the prompt's blocks
 * [hit, maxb) the tier holds in a row from `hit` (at most fetch_max_blocks),
 * by pipelined EXISTS of their keys before the fetch deadline. Reads no value
 * and changes nothing in the cache (docs/remote.md, "Lookup"). */
uint64_t pkv_tier_probe(pkv_cache *c, uint64_t salt, const uint32_t *prompt, uint64_t hit,
                        uint64_t maxb);
/* What a fetch brought: the verified records of blocks [first, first + n) of the
 * prompt, a run continuing the local hit as it was before the fetch. */
typedef struct pkv_tier_got {
    uint32_t first, n;
    uint8_t **bufs;            /* the values, to free */
    const uint8_t **payloads;  /* each record's K/V payload (block_bytes) */
} pkv_tier_got;
/* pkv_seq_open, without the lock: fetch and verify (rule T1). */
void pkv_tier_fetch(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                    pkv_tier_got *got);
void pkv_tier_got_free(pkv_tier_got *g);
void pkv_tier_count_imported(pkv_cache *c, uint64_t n);
/* seq.c, lock held: seals made while importing are not published back. */
void pkv_tier_importing(pkv_cache *c, bool on);
/* pkv_stats_locked: the tier's counters (nothing without a tier). */
void pkv_tier_stats(const pkv_cache *c, pkv_stats *out);

#endif /* PKV_TIER_H */

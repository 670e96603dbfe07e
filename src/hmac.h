/*
 * hmac.h — HMAC-SHA-256 (RFC 2104, with SHA-256 as in RFC 4231) over
 * src/model/sha256.c's incremental SHA-256.
 *
 * Owns nothing but the key schedule a caller keeps: the SHA-256 states after
 * the key block XOR ipad and XOR opad, so each MAC costs the message plus two
 * compressions. The shared tier (src/tier_record.c) tags its records with it
 * and derives its per-purpose keys from the cluster secret with it.
 */
#ifndef PKV_HMAC_H
#define PKV_HMAC_H

#include <stddef.h>
#include <stdint.h>

#include "model/sha256.h"

#define PKV_HMAC_LEN 32u

typedef struct pkv_hmac_key {
    pkv_sha256_ctx inner, outer; /* after K ^ ipad, K ^ opad */
} pkv_hmac_key;

typedef struct pkv_hmac_ctx {
    pkv_sha256_ctx inner;
    const pkv_hmac_key *key;
} pkv_hmac_ctx;

/* The key schedule of key[0..len) (any length: a key over 64 bytes is hashed
 * first, as RFC 2104 says). */
void pkv_hmac_key_init(pkv_hmac_key *k, const void *key, size_t len);
/* A MAC over a message given in pieces. */
void pkv_hmac_begin(pkv_hmac_ctx *x, const pkv_hmac_key *k);
void pkv_hmac_update(pkv_hmac_ctx *x, const void *buf, size_t len);
void pkv_hmac_end(pkv_hmac_ctx *x, uint8_t out[PKV_HMAC_LEN]);
/* One call: HMAC-SHA-256(key, msg). */
void pkv_hmac_sha256(const void *key, size_t klen, const void *msg, size_t len,
                     uint8_t out[PKV_HMAC_LEN]);
/* Compare two MACs in time independent of where they differ: 0 if equal, else
 * nonzero. */
uint64_t pkv_hmac_diff(const uint8_t *a, const uint8_t *b, size_t len);

#endif

/*
 * hmac.c — HMAC-SHA-256 (see hmac.h): H((K ^ opad) || H((K ^ ipad) || m)),
 * K the key padded with zeros to SHA-256's 64-byte block (or its digest when
 * longer). No state of its own; tests/test_hmac.c checks RFC 4231's vectors.
 */
#include "hmac.h"

#include <string.h>

void pkv_hmac_key_init(pkv_hmac_key *k, const void *key, size_t len) {
    uint8_t kb[64] = {0}, pad[64];
    if (len > sizeof kb) pkv_sha256(key, len, kb);
    else if (len) memcpy(kb, key, len);
    for (int i = 0; i < 64; i++) pad[i] = kb[i] ^ 0x36;
    pkv_sha256_init(&k->inner);
    pkv_sha256_update(&k->inner, pad, sizeof pad);
    for (int i = 0; i < 64; i++) pad[i] = kb[i] ^ 0x5c;
    pkv_sha256_init(&k->outer);
    pkv_sha256_update(&k->outer, pad, sizeof pad);
    /* the key's bytes do not outlive the schedule on the stack */
    explicit_bzero(kb, sizeof kb);
    explicit_bzero(pad, sizeof pad);
}

void pkv_hmac_begin(pkv_hmac_ctx *x, const pkv_hmac_key *k) {
    x->inner = k->inner;
    x->key = k;
}

void pkv_hmac_update(pkv_hmac_ctx *x, const void *buf, size_t len) {
    pkv_sha256_update(&x->inner, buf, len);
}

void pkv_hmac_end(pkv_hmac_ctx *x, uint8_t out[PKV_HMAC_LEN]) {
    uint8_t ih[32];
    pkv_sha256_final(&x->inner, ih);
    pkv_sha256_ctx o = x->key->outer;
    pkv_sha256_update(&o, ih, sizeof ih);
    pkv_sha256_final(&o, out);
}

void pkv_hmac_sha256(const void *key, size_t klen, const void *msg, size_t len,
                     uint8_t out[PKV_HMAC_LEN]) {
    pkv_hmac_key k;
    pkv_hmac_ctx x;
    pkv_hmac_key_init(&k, key, klen);
    pkv_hmac_begin(&x, &k);
    pkv_hmac_update(&x, msg, len);
    pkv_hmac_end(&x, out);
}

uint64_t pkv_hmac_diff(const uint8_t *a, const uint8_t *b, size_t len) {
    uint8_t d = 0;
    for (size_t i = 0; i < len; i++) d |= (uint8_t)(a[i] ^ b[i]);
    return d;
}

/*
 * sha256.h — SHA-256 (FIPS 180-4) of a byte buffer.
 *
 * Owns: the digest that names a model file (the GGUF's sha256 is part of the
 * model identity pagedkv stores, see tokenizer.h). Plain C, and the x86 SHA
 * extensions where the CPU has them; no dependency.
 */
#ifndef PKV_SHA256_H
#define PKV_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* The digest of buf[0..len). */
void pkv_sha256(const void *buf, size_t len, uint8_t out[32]);
/* The digest with the SHA extensions (shani != 0; only when
 * pkv_sha256_cpu_shani()) or in plain C: for the tests, which compare them. */
void pkv_sha256_with(const void *buf, size_t len, uint8_t out[32], int shani);
int pkv_sha256_cpu_shani(void);
/* Incremental form, for a message in pieces (HMAC, src/hmac.c, hashes a key
 * block and then a record without copying them together): init, update any
 * number of times, final. The same compression as pkv_sha256. */
typedef struct pkv_sha256_ctx {
    uint32_t h[8];
    uint8_t buf[64];
    uint64_t len; /* bytes so far */
    int shani;
} pkv_sha256_ctx;
void pkv_sha256_init(pkv_sha256_ctx *x);
void pkv_sha256_update(pkv_sha256_ctx *x, const void *buf, size_t len);
void pkv_sha256_final(pkv_sha256_ctx *x, uint8_t out[32]);
/* The digest as 64 lowercase hex digits and a NUL. */
void pkv_sha256_hex(const void *buf, size_t len, char out[65]);

#endif

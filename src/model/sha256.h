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
/* The digest as 64 lowercase hex digits and a NUL. */
void pkv_sha256_hex(const void *buf, size_t len, char out[65]);

#endif

/*
 * test_hmac.c — HMAC-SHA-256 (src/hmac.c), the shared tier's record tag: the
 * seven test cases of RFC 4231 (section 4), the message fed in pieces of every
 * split giving the same MAC, and SHA-256's incremental form against the
 * one-call digest across the padding boundaries.
 */
#include "hmac.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static void hex(const uint8_t *d, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect(const void *key, size_t klen, const void *msg, size_t len, const char *want) {
    uint8_t d[32];
    char h[65];
    pkv_hmac_sha256(key, klen, msg, len, d);
    hex(d, 32, h);
    /* test case 5 gives the first 128 bits only */
    cr_assert(strncmp(h, want, strlen(want)) == 0, "key of %zu bytes, message of %zu: %s, "
              "RFC 4231 says %s", klen, len, h, want);
}

Test(hmac, gives_the_rfc_4231_test_vectors) {
    uint8_t k[131], m[50];
    memset(k, 0x0b, 20);
    expect(k, 20, "Hi There", 8,
           "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    expect("Jefe", 4, "what do ya want for nothing?", 28,
           "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(m, 0xdd, 50);
    expect(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++) k[i] = (uint8_t)(i + 1);
    memset(m, 0xcd, 50);
    expect(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0x0c, 20);
    expect(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b");
    memset(k, 0xaa, 131);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    expect(k, 131, m6, strlen(m6),
           "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *m7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    expect(k, 131, m7, strlen(m7),
           "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

Test(hmac, a_message_in_pieces_gives_the_same_mac) {
    uint8_t buf[300], whole[32], parts[32];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 7 + 3);
    pkv_hmac_key k;
    pkv_hmac_key_init(&k, "a key", 5);
    pkv_hmac_sha256("a key", 5, buf, sizeof buf, whole);
    for (size_t a = 0; a <= sizeof buf; a += 13)
        for (size_t b = a; b <= sizeof buf; b += 29) {
            pkv_hmac_ctx x;
            pkv_hmac_begin(&x, &k);
            pkv_hmac_update(&x, buf, a);
            pkv_hmac_update(&x, buf + a, b - a);
            pkv_hmac_update(&x, buf + b, sizeof buf - b);
            pkv_hmac_end(&x, parts);
            cr_assert(pkv_hmac_diff(whole, parts, 32) == 0, "split at %zu and %zu", a, b);
        }
    parts[31] ^= 1;
    cr_assert(pkv_hmac_diff(whole, parts, 32) != 0);
}

Test(hmac, incremental_sha256_equals_the_one_call_digest) {
    uint8_t buf[200];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 31 + 1);
    for (size_t len = 0; len <= sizeof buf; len++) {
        uint8_t a[32], b[32];
        pkv_sha256(buf, len, a);
        pkv_sha256_ctx x;
        pkv_sha256_init(&x);
        for (size_t i = 0; i < len; i += 1 + i % 5) /* uneven pieces */
            pkv_sha256_update(&x, buf + i, (1 + i % 5) < len - i ? 1 + i % 5 : len - i);
        pkv_sha256_final(&x, b);
        cr_assert(!memcmp(a, b, 32), "length %zu", len);
    }
}

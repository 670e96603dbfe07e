/*
 * test_sha256.c — SHA-256 (src/model/sha256.c), the digest in the model identity:
 * the FIPS 180-4 examples, and the SHA-extension and plain-C compressions giving
 * the same digest for every length around the padding boundaries.
 */
#include "sha256.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t d[32], char out[65]) {
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect(const void *buf, size_t len, const char *want) {
    for (int s = 0; s <= pkv_sha256_cpu_shani(); s++) {
        uint8_t d[32];
        char h[65];
        pkv_sha256_with(buf, len, d, s);
        hex(d, h);
        cr_assert_str_eq(h, want, "length %zu, SHA extensions %d", len, s);
    }
}

Test(sha256, gives_the_fips_180_4_digests) {
    expect("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    cr_assert_not_null(million);
    memset(million, 'a', 1000000);
    expect(million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

Test(sha256, both_compressions_agree_at_every_length) {
    if (!pkv_sha256_cpu_shani()) cr_skip_test("no SHA extensions on this CPU");
    unsigned char buf[1100];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 23);
    for (size_t len = 0; len <= 1024; len++) {
        uint8_t a[32], b[32];
        pkv_sha256_with(buf + len % 7, len, a, 1);
        pkv_sha256_with(buf + len % 7, len, b, 0);
        cr_assert(!memcmp(a, b, 32), "length %zu: the digests differ", len);
    }
}

/*
 * sha256.c — SHA-256 (see sha256.h): the FIPS 180-4 compression function over
 * 64-byte blocks, the message padded with 0x80, zeros and its bit length. The
 * compression runs on the x86 SHA extensions when the CPU has them (about 6
 * times faster: hashing the model file is most of a warm restart's start-up),
 * else in plain C; both compute the same function (tests/test_sha256.c).
 * Compiled into the model library and into libpagedkv, whose HMAC (src/hmac.c)
 * authenticates the shared tier's records.
 */
#include "sha256.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define SHA_X86 0
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

static void blocks_c(uint32_t h[8], const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) block(h, p + 64 * i);
}

#if SHA_X86
int pkv_sha256_cpu_shani(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1)) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & (1u << 29)) != 0; /* CPUID.7.0:EBX.SHA */
}

/* n blocks with the SHA extensions. The state is kept as the instructions want
 * it (ABEF, CDGH); each group of 4 message words is
 * msg2(msg1(W[t-16..], W[t-12..]) + W[t-7..t-4], W[t-4..t-1]). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t h[8],
                                                                     const uint8_t *p, size_t n) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(const void *)h), 0xB1);
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(const void *)(h + 4)), 0x1B);
    __m128i s0 = _mm_alignr_epi8(t, s1, 8); /* ABEF */
    s1 = _mm_blend_epi16(s1, t, 0xF0);      /* CDGH */
    for (size_t i = 0; i < n; i++, p += 64) {
        const __m128i abef = s0, cdgh = s1;
        __m128i g[4];
        for (int k = 0; k < 16; k++) {
            if (k < 4)
                g[k] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k)),
                                        bswap);
            else
                g[k % 4] = _mm_sha256msg2_epu32(
                    _mm_add_epi32(_mm_sha256msg1_epu32(g[k % 4], g[(k + 1) % 4]),
                                  _mm_alignr_epi8(g[(k + 3) % 4], g[(k + 2) % 4], 4)),
                    g[(k + 3) % 4]);
            const __m128i m =
                _mm_add_epi32(g[k % 4], _mm_loadu_si128((const __m128i *)(const void *)(K + 4 * k)));
            s1 = _mm_sha256rnds2_epu32(s1, s0, m);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    t = _mm_shuffle_epi32(s0, 0x1B);  /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1); /* DCHG */
    _mm_storeu_si128((__m128i *)(void *)h, _mm_blend_epi16(t, s1, 0xF0));   /* DCBA */
    _mm_storeu_si128((__m128i *)(void *)(h + 4), _mm_alignr_epi8(s1, t, 8)); /* HGFE */
}
#else
int pkv_sha256_cpu_shani(void) { return 0; }
#endif

static void init_with(pkv_sha256_ctx *x, int shani) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(x->h, iv, sizeof iv);
    x->len = 0;
    x->shani = shani;
}

static void run_blocks(const pkv_sha256_ctx *x, uint32_t h[8], const uint8_t *p, size_t n) {
#if SHA_X86
    if (x->shani) {
        blocks_shani(h, p, n);
        return;
    }
#endif
    (void)x;
    blocks_c(h, p, n);
}

void pkv_sha256_update(pkv_sha256_ctx *x, const void *buf, size_t len) {
    if (len == 0) return; /* buf may be NULL */
    const uint8_t *p = buf;
    size_t have = (size_t)(x->len % 64);
    x->len += len;
    if (have) { /* complete the buffered block first */
        size_t k = 64 - have < len ? 64 - have : len;
        memcpy(x->buf + have, p, k);
        p += k;
        len -= k;
        if (have + k < 64) return;
        run_blocks(x, x->h, x->buf, 1);
    }
    size_t full = len / 64;
    if (full) run_blocks(x, x->h, p, full);
    if (len % 64) memcpy(x->buf, p + 64 * full, len % 64);
}

void pkv_sha256_final(pkv_sha256_ctx *x, uint8_t out[32]) {
    uint8_t tail[128] = {0};
    size_t rest = (size_t)(x->len % 64);
    memcpy(tail, x->buf, rest);
    tail[rest] = 0x80;
    size_t tl = rest < 56 ? 64 : 128;
    uint64_t bits = x->len * 8;
    for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    run_blocks(x, x->h, tail, tl / 64);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(x->h[i] >> (24 - 8 * j));
}

void pkv_sha256_with(const void *buf, size_t len, uint8_t out[32], int shani) {
    pkv_sha256_ctx x;
    init_with(&x, shani);
    pkv_sha256_update(&x, buf, len);
    pkv_sha256_final(&x, out);
}

static int cpu_shani(void) {
    static int shani = -1; /* every thread computes the same value */
    int s = __atomic_load_n(&shani, __ATOMIC_RELAXED);
    if (s < 0) {
        s = pkv_sha256_cpu_shani();
        __atomic_store_n(&shani, s, __ATOMIC_RELAXED);
    }
    return s;
}

void pkv_sha256_init(pkv_sha256_ctx *x) { init_with(x, cpu_shani()); }

void pkv_sha256(const void *buf, size_t len, uint8_t out[32]) {
    pkv_sha256_with(buf, len, out, cpu_shani());
}

void pkv_sha256_hex(const void *buf, size_t len, char out[65]) {
    uint8_t d[32];
    pkv_sha256(buf, len, d);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

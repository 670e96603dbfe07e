/*
 * hash.c — chained block hashes.
 *
 * hash(block) = XXH3-128(seed = cache secret; bytes = parent hash (lo, hi as two
 * little-endian u64) || token ids as little-endian u32). The first block's parent
 * hash is root(salt) = XXH3-128(seed = secret; salt as little-endian u64), so
 * chains of different trust domains (salts) never meet. The secret is random per
 * cache and kept in the arena header (mode 0600), so hashes are not predictable
 * from outside (vLLM CVE-2025-25183).
 *
 * The hash is an index, never the truth: a hit is verified against the stored
 * tokens and parent (prefix_index.c). A build with PKV_HASH_BITS=8 keeps only 8
 * bits so that tests can force collisions.
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#ifndef PKV_HASH_BITS
#define PKV_HASH_BITS 128
#endif

static inline pkv_h128 finish(XXH128_hash_t x) {
    pkv_h128 h = {x.low64, x.high64};
#if PKV_HASH_BITS == 8
    h.lo &= 0xff;
    h.hi = 0;
#elif PKV_HASH_BITS != 128
#error "PKV_HASH_BITS must be 128 or 8"
#endif
    return h;
}

pkv_h128 pkv_hash_root(uint64_t secret, uint64_t salt) {
    uint8_t b[8];
    pkv_put_u64(b, salt);
    return finish(XXH3_128bits_withSeed(b, sizeof b, secret));
}

pkv_h128 pkv_hash_block(uint64_t secret, pkv_h128 parent, const uint32_t *tokens,
                        uint32_t block_size) {
    uint8_t buf[16 + 4 * PKV_BLOCK_SIZE_MAX];
    pkv_put_u64(buf, parent.lo);
    pkv_put_u64(buf + 8, parent.hi);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (block_size == 16) { /* the usual size: a constant length inlines the copy and
                               XXH3's length dispatch (same bytes, same hash) */
        memcpy(buf + 16, tokens, 64);
        return finish(XXH3_128bits_withSeed(buf, 80, secret));
    }
    memcpy(buf + 16, tokens, (size_t)block_size * 4);
#else
    for (uint32_t i = 0; i < block_size; i++) pkv_put_u32(buf + 16 + 4 * i, tokens[i]);
#endif
    return finish(XXH3_128bits_withSeed(buf, 16 + (size_t)block_size * 4, secret));
}

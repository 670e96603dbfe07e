/*
 * test_arena_sum.c — the payload checksum (src/arena.c, pkv_arena_sum).
 *
 * A SEAL record stores XXH3-64 of the block's K/V bytes, and recovery and kvdump
 * verify it. pkv_arena_sum computes it with libxxhash's runtime-dispatched XXH3
 * (AVX2 or AVX-512 where the CPU has them). The format defines the sum as plain
 * XXH3-64, so caches written before, or on another CPU, must verify: the
 * dispatched sum must equal XXH3_64bits bit for bit, for payloads of every shape
 * (sizes that are and are not multiples of the vector stripes).
 *
 * libxxhash's AVX2/AVX-512 paths return with the upper halves of the vector
 * registers dirty, which slows every legacy-SSE instruction after them; the sum
 * must leave them clean (checked through XGETBV's XINUSE where the CPU has it).
 */
#include "pkv_test.h"

#include "internal.h"

#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <cpuid.h>
#include <xxh_x86dispatch.h>
#define HAVE_XINUSE_TEST 1
#endif
#endif

TestSuite(arena_sum, .init = pt_setup, .fini = pt_teardown);

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A new 8-block cache of this geometry. */
static pkv_cache *open_geometry(uint32_t layers, uint32_t heads, uint32_t dim, pkv_dtype dt,
                                uint32_t bs) {
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    pt_rmrf(dir);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = layers;
    o.num_kv_heads = heads;
    o.head_dim = dim;
    o.dtype = dt;
    o.block_size = bs;
    o.capacity = 8;
    o.model_id = "arena-sum-test";
    pkv_cache *c = NULL;
    PT_OK(pkv_open(dir, &o, &c));
    return c;
}

static void check_geometry(uint32_t layers, uint32_t heads, uint32_t dim, pkv_dtype dt,
                           uint32_t bs) {
    pkv_cache *c = open_geometry(layers, heads, dim, dt, bs);
    const pkv_arena *a = &c->arena;
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ a->geo.block_bytes;
    for (uint32_t b = 0; b < 8; b++) {
        uint8_t *p = pkv_arena_block(a, b);
        for (uint64_t i = 0; i < a->geo.block_bytes; i++) p[i] = (uint8_t)rng(&seed);
        uint64_t want = XXH3_64bits(p, a->geo.block_bytes);
        cr_assert_eq(pkv_arena_sum(a, b), want,
                     "block %u of %llu bytes: dispatched sum differs from XXH3_64bits", b,
                     (unsigned long long)a->geo.block_bytes);
        p[a->geo.block_bytes - 1] ^= 1; /* the sum covers the last byte too */
        cr_assert_neq(pkv_arena_sum(a, b), want, "block %u: last byte not covered", b);
    }
    pkv_close(c);
}

Test(arena_sum, equals_plain_xxh3_for_every_payload_shape) {
    check_geometry(1, 1, 8, PKV_F16, 16);     /* 512 bytes */
    check_geometry(1, 1, 1, PKV_F16, 1);      /* 4 bytes: the short-input path */
    check_geometry(1, 1, 3, PKV_F32, 5);      /* 120 bytes */
    check_geometry(2, 3, 40, PKV_F32, 7);     /* 13,440: not a multiple of 64 */
    check_geometry(4, 2, 128, PKV_BF16, 16);  /* 65,536 */
    check_geometry(3, 5, 72, PKV_F16, 13);    /* 56,160 */
}

#ifdef HAVE_XINUSE_TEST
/* XGETBV with ECX = 1 reads XINUSE: the state components not in their initial
 * configuration. Bit 2: the upper halves of YMM0-15; bit 6: the upper 256 bits
 * of ZMM0-15. vzeroupper returns both to their initial configuration. */
#define XINUSE_UPPER ((1u << 2) | (1u << 6))

static bool xinuse_readable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned need = (1u << 27) | (1u << 28); /* OSXSAVE, AVX */
    if ((c & need) != need || __get_cpuid_max(0, NULL) < 0xD) return false;
    __cpuid_count(0xD, 1, a, b, c, d);
    return (a >> 2) & 1u; /* XGETBV with ECX = 1 */
}

static unsigned xinuse(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return lo;
}

__attribute__((target("avx"), noinline)) static void test_vzeroupper(void) {
    __builtin_ia32_vzeroupper();
}

Test(arena_sum, leaves_the_upper_vector_state_clean) {
    if (!xinuse_readable()) cr_skip_test("this CPU has no AVX or no XGETBV(1)");
    /* That vzeroupper clears these XINUSE bits is what CPUs do, not what the
     * architecture promises: check it here first. */
    test_vzeroupper();
    if (xinuse() & XINUSE_UPPER)
        cr_skip_test("XINUSE %#x right after a vzeroupper: this CPU or hypervisor does "
                     "not report the upper state's return to its initial configuration",
                     xinuse());
    pkv_cache *c = open_geometry(1, 1, 8, PKV_F16, 16); /* 512 bytes: the vector path */
    const pkv_arena *a = &c->arena;
    memset(pkv_arena_block(a, 1), 0x5A, a->geo.block_bytes);
    /* What the dispatched XXH3 itself leaves: dirty where it used AVX2/AVX-512
     * without a vzeroupper (libxxhash 0.8.1); reported, not required. */
    uint64_t direct = XXH3_64bits_dispatch(pkv_arena_block(a, 1), a->geo.block_bytes);
    unsigned after_dispatch = xinuse();
    cr_log_info("XINUSE after XXH3_64bits_dispatch: %#x (upper state %s)", after_dispatch,
                after_dispatch & XINUSE_UPPER ? "dirty" : "clean");
    for (int i = 0; i < 3; i++) {
        uint64_t sum = pkv_arena_sum(a, 1);
        unsigned after = xinuse();
        cr_assert_eq(sum, direct);
        cr_assert_eq(after & XINUSE_UPPER, 0u,
                     "pkv_arena_sum left the upper vector state dirty (XINUSE %#x)", after);
    }
    pkv_close(c);
}
#endif

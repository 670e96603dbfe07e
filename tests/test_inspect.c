/*
 * The read-only inspection API (include/pagedkv_inspect.h, src/inspect.c): each
 * call reports what the cache holds -- states, refcounts, chains, tokens,
 * checksums, depths, the prefix a prompt hits, the arena, the geometry --
 * changes nothing, and rejects bad arguments with the documented codes.
 */
#include "pagedkv_inspect.h"
#include "pkv_test.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

TestSuite(inspect, .init = pt_setup, .fini = pt_teardown);

#define BS 4u
#define CAP 16u

static uint32_t toks[64];

static void init_toks(void) {
    for (uint32_t i = 0; i < 64; i++) toks[i] = 100 + i;
}

/* Sequence id holding toks[0 .. n), committed. */
static void make_seq(pkv_cache *c, uint64_t id, uint64_t salt, size_t n) {
    size_t hit = PT_SEQ_OPEN(c, id, salt, toks, n);
    if (n > hit) {
        PT_APPEND(c, id, salt, toks, hit, n - hit);
        PT_OK(pkv_seq_commit(c, id, n - hit));
    }
}

static pkv_block_info block(pkv_cache *c, uint32_t b) {
    pkv_block_info bi;
    PT_OK(pkv_inspect_block(c, b, &bi));
    return bi;
}

Test(inspect, block_reports_state_refs_and_chain) {
    init_toks();
    pkv_cache *c = pt_open(BS, CAP);
    make_seq(c, 1, 7, 10); /* two sealed blocks and an open one */
    uint32_t t[4];
    cr_assert_eq(PT_BLOCKS(c, 1, t, 4), 3);
    pkv_block_info b0 = block(c, t[0]), b1 = block(c, t[1]), b2 = block(c, t[2]);
    cr_assert_eq(b0.state, PKV_BLOCK_SEALED);
    cr_assert_eq(b0.ref, 1);
    cr_assert_eq(b0.parent, PKV_NO_BLOCK);
    cr_assert_eq(b0.children, 1);
    cr_assert_eq(b0.salt, 7);
    cr_assert_eq(b0.flags, 0);
    cr_assert(b0.hash_lo || b0.hash_hi);
    cr_assert_eq(b1.state, PKV_BLOCK_SEALED);
    cr_assert_eq(b1.parent, t[0]);
    cr_assert_eq(b1.children, 0);
    cr_assert(b1.hash_lo != b0.hash_lo || b1.hash_hi != b0.hash_hi);
    cr_assert_eq(b2.state, PKV_BLOCK_OPEN);
    cr_assert_eq(b2.ref, 1);
    cr_assert_eq(b2.parent, PKV_NO_BLOCK, "an open block has no chain yet");
    cr_assert_eq(b2.salt, 0);
    cr_assert_eq(b2.payload_sum, 0);
    /* a block no table names is free */
    uint32_t free_b = 0;
    while (free_b == t[0] || free_b == t[1] || free_b == t[2]) free_b++;
    pkv_block_info bf = block(c, free_b);
    cr_assert_eq(bf.state, PKV_BLOCK_FREE);
    cr_assert_eq(bf.ref, 0);
    /* shared, then cached */
    PT_OK(pkv_seq_fork(c, 1, 2));
    cr_assert_eq(block(c, t[0]).ref, 2);
    cr_assert_eq(block(c, t[0]).release_lsn, 0, "a referenced block has no release");
    PT_OK(pkv_seq_close(c, 1));
    PT_OK(pkv_seq_close(c, 2));
    pkv_block_info cached = block(c, t[1]);
    cr_assert_eq(cached.state, PKV_BLOCK_SEALED);
    cr_assert_eq(cached.ref, 0);
    cr_assert_gt(cached.release_lsn, 0);
    cr_assert_eq(block(c, t[2]).state, PKV_BLOCK_FREE, "the open block was freed");
}

Test(inspect, block_tokens_are_the_ids_the_block_holds) {
    init_toks();
    pkv_cache *c = pt_open(BS, CAP);
    make_seq(c, 1, 0, 9);
    uint32_t t[3], out[BS + 1];
    size_t n = 0;
    cr_assert_eq(PT_BLOCKS(c, 1, t, 3), 3);
    for (uint32_t k = 0; k < 2; k++) {
        PT_OK(pkv_inspect_block_tokens(c, t[k], out, BS + 1, &n));
        cr_assert_eq(n, BS);
        cr_assert_arr_eq(out, toks + k * BS, BS * sizeof *out);
    }
    PT_OK(pkv_inspect_block_tokens(c, t[2], out, BS, NULL));
    cr_assert_eq(out[0], toks[8], "an open block's ids up to its sequence's length");
    memset(out, 0xab, sizeof out);
    PT_ERR(pkv_inspect_block_tokens(c, t[0], out, BS - 1, &n), PKV_ERANGE);
    cr_assert_eq(n, BS);
    cr_assert_eq(out[0], 0xabababab, "nothing copied on PKV_ERANGE");
}

Test(inspect, check_block_recomputes_and_reports_damage_without_flagging) {
    init_toks();
    pkv_cache *c = pt_open(BS, CAP);
    make_seq(c, 1, 3, 10);
    uint32_t t[3];
    PT_BLOCKS(c, 1, t, 3);
    pkv_block_check k;
    for (uint32_t i = 0; i < 2; i++) {
        PT_OK(pkv_inspect_check_block(c, t[i], &k));
        cr_assert(k.in_file && k.payload_ok && k.chain_ok && k.hash_ok, "block %u", t[i]);
        pkv_block_info bi = block(c, t[i]);
        cr_assert_eq(k.payload_sum_actual, bi.payload_sum);
        cr_assert_eq(k.hash_lo_actual, bi.hash_lo);
        cr_assert_eq(k.hash_hi_actual, bi.hash_hi);
    }
    PT_ERR(pkv_inspect_check_block(c, t[2], &k), PKV_ESTATE); /* open */
    /* one element of the sealed second block changes (as damage would) */
    float *kv = pkv_kv(c, t[1], 1, PKV_V, 1);
    cr_assert_not_null(kv);
    kv[2] += 1.0f;
    PT_OK(pkv_inspect_check_block(c, t[1], &k));
    cr_assert(k.in_file && !k.payload_ok && k.hash_ok);
    cr_assert_neq(k.payload_sum_actual, block(c, t[1]).payload_sum);
    cr_assert_eq(block(c, t[1]).flags, 0, "a check reports, it never flags");
}

Test(inspect, depths_count_from_the_chain_root) {
    init_toks();
    pkv_cache *c = pt_open(BS, CAP);
    make_seq(c, 1, 0, 14); /* three sealed blocks, one open */
    uint32_t t[4], d[CAP];
    cr_assert_eq(PT_BLOCKS(c, 1, t, 4), 4);
    PT_OK(pkv_inspect_depths(c, d, CAP));
    for (uint32_t k = 0; k < 3; k++) cr_assert_eq(d[t[k]], k + 1, "entry %u", k);
    cr_assert_eq(d[t[3]], 0, "an open block has no depth");
    for (uint32_t b = 0; b < CAP; b++)
        if (block(c, b).state == PKV_BLOCK_FREE) cr_assert_eq(d[b], 0, "free block %u", b);
    PT_ERR(pkv_inspect_depths(c, d, CAP - 1), PKV_ERANGE);
}

Test(inspect, prefix_finds_the_chain_a_prompt_hits_and_changes_nothing) {
    init_toks();
    pkv_cache *c = pt_open(BS, CAP);
    make_seq(c, 1, 5, 13); /* three sealed blocks */
    PT_OK(pkv_seq_close(c, 1)); /* cached: a lookup must not take them off the LRU */
    pkv_stats before = pt_stats(c);
    uint32_t out[8];
    size_t n = 99;
    PT_OK(pkv_inspect_prefix(c, 5, toks, 14, out, 8, &n));
    cr_assert_eq(n, 3);
    cr_assert_eq(block(c, out[0]).parent, PKV_NO_BLOCK);
    cr_assert_eq(block(c, out[1]).parent, out[0]);
    cr_assert_eq(block(c, out[2]).parent, out[1]);
    for (uint32_t k = 0; k < 3; k++) cr_assert_eq(block(c, out[k]).ref, 0);
    pkv_stats after = pt_stats(c);
    PT_STATS_EQ(&before, &after, "after pkv_inspect_prefix");
    PT_OK(pkv_inspect_prefix(c, 5, toks, 14, out, 2, &n));
    cr_assert_eq(n, 2, "at most cap blocks");
    PT_OK(pkv_inspect_prefix(c, 5, toks, 7, out, 8, &n));
    cr_assert_eq(n, 1, "full blocks only");
    PT_OK(pkv_inspect_prefix(c, 6, toks, 14, out, 8, &n));
    cr_assert_eq(n, 0, "another salt shares nothing");
    uint32_t other[8];
    memcpy(other, toks, sizeof other);
    other[5] = 1;
    PT_OK(pkv_inspect_prefix(c, 5, other, 8, out, 8, &n));
    cr_assert_eq(n, 1, "the chain stops at the first differing block");
    PT_OK(pkv_inspect_prefix(c, 5, NULL, 0, NULL, 0, &n));
    cr_assert_eq(n, 0);
    PT_CHECK(c);
}

Test(inspect, arena_reports_the_file) {
    pkv_cache *c = pt_open(BS, CAP);
    pkv_arena_info a;
    PT_OK(pkv_inspect_arena(c, &a));
    char want[512];
    pt_path(want, sizeof want, "cache/arena");
    cr_assert_str_eq(a.path, want);
    cr_assert_eq(a.linked, 0);
    cr_assert_eq(a.valid_blocks, CAP);
}

Test(inspect, geometry_is_what_open_derives) {
    pkv_options o;
    pt_opts(&o, 3, 2, 24, 16, PKV_BF16, 40);
    pkv_cache_info g;
    PT_OK(pkv_inspect_geometry(&o, &g));
    pkv_cache *c = pt_open_sub("g", &o);
    pkv_cache_info inf = pt_info(c);
    cr_assert_eq(memcmp(&g, &inf, sizeof g), 0, "pkv_inspect_geometry == pkv_info");
    o.head_dim = 0;
    PT_ERR(pkv_inspect_geometry(&o, &g), PKV_EINVAL);
    pt_opts(&o, 3, 2, 24, 16, (pkv_dtype)9, 40);
    PT_ERR(pkv_inspect_geometry(&o, &g), PKV_EINVAL);
    pt_opts(&o, 3, 2, 24, PKV_BLOCK_SIZE_MAX + 1, PKV_F16, 40);
    PT_ERR(pkv_inspect_geometry(&o, &g), PKV_EINVAL);
}

Test(inspect, bad_arguments_are_rejected) {
    pkv_cache *c = pt_open(BS, CAP);
    pkv_block_info bi;
    pkv_block_check k;
    pkv_arena_info a;
    pkv_cache_info g;
    pkv_options o;
    uint32_t out[CAP];
    size_t n;
    PT_ERR(pkv_inspect_block(NULL, 0, &bi), PKV_EINVAL);
    PT_ERR(pkv_inspect_block(c, 0, NULL), PKV_EINVAL);
    PT_ERR(pkv_inspect_block(c, CAP, &bi), PKV_EINVAL);
    PT_ERR(pkv_inspect_block(c, UINT32_MAX, &bi), PKV_EINVAL);
    PT_ERR(pkv_inspect_block_tokens(NULL, 0, out, CAP, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_block_tokens(c, 0, NULL, CAP, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_block_tokens(c, CAP, out, CAP, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_check_block(NULL, 0, &k), PKV_EINVAL);
    PT_ERR(pkv_inspect_check_block(c, 0, NULL), PKV_EINVAL);
    PT_ERR(pkv_inspect_check_block(c, CAP, &k), PKV_EINVAL);
    PT_ERR(pkv_inspect_check_block(c, 0, &k), PKV_ESTATE); /* free */
    PT_ERR(pkv_inspect_depths(NULL, out, CAP), PKV_EINVAL);
    PT_ERR(pkv_inspect_depths(c, NULL, CAP), PKV_EINVAL);
    PT_ERR(pkv_inspect_prefix(NULL, 0, out, 0, out, 1, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_prefix(c, 0, out, 0, out, 1, NULL), PKV_EINVAL);
    PT_ERR(pkv_inspect_prefix(c, 0, NULL, 4, out, 1, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_prefix(c, 0, out, 4, NULL, 1, &n), PKV_EINVAL);
    PT_ERR(pkv_inspect_arena(NULL, &a), PKV_EINVAL);
    PT_ERR(pkv_inspect_arena(c, NULL), PKV_EINVAL);
    pt_opts(&o, 2, 2, 4, 4, PKV_F32, 8);
    PT_ERR(pkv_inspect_geometry(NULL, &g), PKV_EINVAL);
    PT_ERR(pkv_inspect_geometry(&o, NULL), PKV_EINVAL);
    cr_assert_neq(pkv_last_error()[0], '\0', "a detailed message");
}

Test(inspect, read_only_handle_reports_recovered_blocks_and_a_short_file) {
    init_toks();
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, CAP);
    pkv_cache *c = pt_open_sub("ro", &o);
    make_seq(c, 1, 0, 8);
    uint32_t t[2];
    PT_BLOCKS(c, 1, t, 2);
    PT_OK(pkv_sync(c));
    pt_close(c);
    o.flags = PKV_OPEN_RDONLY;
    c = pt_open_sub("ro", &o);
    for (uint32_t k = 0; k < 2; k++) {
        pkv_block_info bi = block(c, t[k]);
        cr_assert_eq(bi.state, PKV_BLOCK_SEALED);
        cr_assert_eq(bi.ref, 1);
        cr_assert_eq(bi.flags & PKV_BLOCK_BAD, 0);
        pkv_block_check k2;
        PT_OK(pkv_inspect_check_block(c, t[k], &k2));
        cr_assert(k2.in_file && k2.payload_ok && k2.hash_ok);
    }
    pt_close(c);
    /* the file loses the slot of the block with the highest index */
    uint32_t last = t[0] > t[1] ? t[0] : t[1];
    pkv_cache_info inf;
    PT_OK(pkv_inspect_geometry(&o, &inf));
    char arena[512];
    pt_path(arena, sizeof arena, "ro/arena");
    cr_assert_eq(truncate(arena, (off_t)(4096 + (uint64_t)last * inf.slot_bytes)), 0);
    c = pt_open_sub("ro", &o);
    pkv_arena_info a;
    PT_OK(pkv_inspect_arena(c, &a));
    cr_assert_eq(a.valid_blocks, last);
    pkv_block_check k3;
    pkv_block_info bi;
    PT_OK(pkv_inspect_block(c, last, &bi));
    cr_assert_neq(bi.state, PKV_BLOCK_SEALED, "recovery drops a sealed block whose slot is lost");
    PT_ERR(pkv_inspect_check_block(c, last, &k3), PKV_ESTATE);
    pkv_recovery rec;
    PT_OK(pkv_get_recovery(c, &rec));
    cr_assert_eq(rec.blocks_dropped, 1);
}

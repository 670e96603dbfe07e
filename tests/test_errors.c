/* Every public call with bad arguments: the right code, nothing changed, and the
 * invariants still hold. */
#include "pkv_test.h"

#include <string.h>

TestSuite(errors, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

/* Build: seq 1 = 10 tokens (8 committed), seq 2 = empty. */
static pkv_cache *setup_cache(uint32_t *a)
{
    pkv_cache *c = pt_open(BS, 32);
    for (uint32_t i = 0; i < 16; i++)
        a[i] = 10 + i;
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    PT_APPEND(c, 1, 0, a, 0, 10);
    PT_OK(pkv_seq_commit(c, 1, 8));
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 2, 0, NULL, 0);
    return c;
}

#define EXPECT(c, snap, expr, code)                                                 \
    do {                                                                            \
        PT_ERR(expr, code);                                                         \
        PT_CHECK(c);                                                                \
        PT_SNAP_SAME(snap, c, #expr);                                               \
    } while (0)

Test(errors, seq_open)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    size_t nc = 12345;
    EXPECT(c, &s, pkv_seq_open(NULL, 3, 0, a, 4, &nc), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_open(c, 3, 0, NULL, 4, &nc), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_open(c, 1, 0, a, 4, &nc), PKV_EEXIST);
    EXPECT(c, &s, pkv_seq_open(c, 2, 0, NULL, 0, &nc), PKV_EEXIST);
    EXPECT(c, &s, pkv_seq_open(c, 1, 0, a, 9, NULL), PKV_EEXIST);
    pt_snap_free(&s);
    PT_ERR(pkv_seq_get_info(c, 3, &(pkv_seq_info){0}), PKV_ENOSEQ);

    /* n = 0 with a non-NULL prompt is an empty sequence too. */
    PT_OK(pkv_seq_open(c, 3, 0, a, 0, &nc));
    PT_CHECK(c);
    cr_assert_eq(nc, 0);
    PT_VERIFY(c, 3, 0, a, 0, 0);
    /* Ids can be reused after close. */
    PT_OK(pkv_seq_close(c, 3));
    PT_CHECK(c);
    PT_OK(pkv_seq_open(c, 3, 9, NULL, 0, NULL));
    PT_CHECK(c);
    PT_VERIFY(c, 3, 9, a, 0, 0);
}

Test(errors, any_id_and_salt_value_is_valid)
{
    pkv_cache *c = pt_open(BS, 32);
    const uint64_t ids[] = {0, 1, UINT64_MAX, UINT64_MAX - 1, UINT64_C(1) << 63,
                            0xDEADBEEFCAFEBABEull};
    uint32_t a[6] = {1, 2, 3, 4, 5, 6};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint64_t salt = ids[sizeof ids / sizeof ids[0] - 1 - i];
        PT_SEQ_OPEN(c, ids[i], salt, NULL, 0);
        PT_APPEND(c, ids[i], salt, a, 0, 6);
        PT_OK(pkv_seq_commit(c, ids[i], 6));
        PT_CHECK(c);
    }
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint64_t salt = ids[sizeof ids / sizeof ids[0] - 1 - i];
        PT_VERIFY(c, ids[i], salt, a, 6, 6);
        PT_ERR(pkv_seq_open(c, ids[i], 0, NULL, 0, NULL), PKV_EEXIST);
    }
    cr_assert_eq(pt_stats(c).sequences, sizeof ids / sizeof ids[0]);
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        PT_OK(pkv_seq_close(c, ids[i]));
        PT_CHECK(c);
        PT_ERR(pkv_seq_close(c, ids[i]), PKV_ENOSEQ);
    }
    cr_assert_eq(pt_stats(c).sequences, 0);
}

Test(errors, seq_append)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    pkv_slot slots[8];
    EXPECT(c, &s, pkv_seq_append(NULL, 1, a, 1, slots), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_append(c, 99, a, 1, slots), PKV_ENOSEQ);
    EXPECT(c, &s, pkv_seq_append(c, 1, NULL, 1, slots), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_append(c, 1, a, 1, NULL), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_append(c, 1, a, 0, slots), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_append(c, 2, a, 0, slots), PKV_EINVAL);
    pt_snap_free(&s);
}

Test(errors, seq_commit)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    EXPECT(c, &s, pkv_seq_commit(NULL, 1, 1), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_commit(c, 99, 1), PKV_ENOSEQ);
    EXPECT(c, &s, pkv_seq_commit(c, 1, 0), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_commit(c, 1, 3), PKV_ESTATE); /* 2 pending */
    EXPECT(c, &s, pkv_seq_commit(c, 1, (size_t)-1), PKV_ESTATE);
    EXPECT(c, &s, pkv_seq_commit(c, 2, 1), PKV_ESTATE); /* nothing pending */
    pt_snap_free(&s);
    PT_OK(pkv_seq_commit(c, 1, 2));
    PT_CHECK(c);
    PT_VERIFY(c, 1, 0, a, 10, 10);
    PT_ERR(pkv_seq_commit(c, 1, 1), PKV_ESTATE);
    PT_CHECK(c);
}

Test(errors, seq_fork)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    EXPECT(c, &s, pkv_seq_fork(NULL, 2, 3), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_fork(c, 99, 3), PKV_ENOSEQ);
    EXPECT(c, &s, pkv_seq_fork(c, 2, 1), PKV_EEXIST);
    EXPECT(c, &s, pkv_seq_fork(c, 1, 3), PKV_ESTATE);
    pt_snap_free(&s);
}

Test(errors, seq_truncate)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    EXPECT(c, &s, pkv_seq_truncate(NULL, 1, 0), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_truncate(c, 99, 0), PKV_ENOSEQ);
    int r = pkv_seq_truncate(c, 1, 11);
    cr_assert(r == PKV_ERANGE, "truncate beyond length -> %d (%s)", r,
              pkv_strerror(r));
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "truncate beyond length");
    r = pkv_seq_truncate(c, 2, 1);
    cr_assert(r == PKV_ERANGE, "truncate empty seq to 1 -> %d (%s)", r,
              pkv_strerror(r));
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "truncate empty beyond length");
    pt_snap_free(&s);
}

Test(errors, seq_close)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    EXPECT(c, &s, pkv_seq_close(NULL, 1), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_close(c, 99), PKV_ENOSEQ);
    pt_snap_free(&s);
    /* A sequence with pending tokens can be closed. */
    PT_OK(pkv_seq_close(c, 1));
    PT_CHECK(c);
    PT_ERR(pkv_seq_close(c, 1), PKV_ENOSEQ);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    cr_assert_eq(st.blocks_cached, 2);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert_eq(st.sequences, 1);
}

Test(errors, seq_info_and_stats)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    pkv_seq_info si;
    pkv_stats st;
    EXPECT(c, &s, pkv_seq_get_info(NULL, 1, &si), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_get_info(c, 1, NULL), PKV_EINVAL);
    EXPECT(c, &s, pkv_seq_get_info(c, 99, &si), PKV_ENOSEQ);
    EXPECT(c, &s, pkv_get_stats(NULL, &st), PKV_EINVAL);
    EXPECT(c, &s, pkv_get_stats(c, NULL), PKV_EINVAL);
    pkv_cache_info inf;
    EXPECT(c, &s, pkv_info(NULL, &inf), PKV_EINVAL);
    EXPECT(c, &s, pkv_info(c, NULL), PKV_EINVAL);
    pt_snap_free(&s);
    si = PT_SEQ_INFO(c, 1);
    cr_assert_eq(si.len, 10);
    cr_assert_eq(si.committed, 8);
    cr_assert_eq(si.n_blocks, 3);
    cr_assert_eq(si.salt, 0);
}

static void table_errors(bool tokens)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    const uint64_t ids[2] = {1, 2};
    pt_snap s;
    pt_snap_take(&s, c, ids, 2);
    int (*fn)(pkv_cache *, uint64_t, uint32_t *, size_t, size_t *) =
        tokens ? pkv_seq_tokens : pkv_seq_blocks;
    const size_t full = tokens ? 10 : 3;
    uint32_t want[16], out[16];
    size_t n = 0;
    PT_OK(fn(c, 1, want, 16, &n));
    cr_assert_eq(n, full);
    if (tokens)
        cr_assert(memcmp(want, a, 10 * sizeof *a) == 0);

    EXPECT(c, &s, fn(NULL, 1, out, 16, &n), PKV_EINVAL);
    EXPECT(c, &s, fn(c, 99, out, 16, &n), PKV_ENOSEQ);
    EXPECT(c, &s, fn(c, 1, NULL, 16, &n), PKV_EINVAL);

    /* Too small: ERANGE, *n set to the full length, the first cap entries copied. */
    for (size_t cap = 0; cap < full; cap++) {
        for (size_t i = 0; i < 16; i++)
            out[i] = 0xA5A5A5A5u;
        n = 0;
        PT_ERR(fn(c, 1, out, cap, &n), PKV_ERANGE);
        PT_CHECK(c);
        cr_assert_eq(n, full, "cap %zu: n %zu, expected %zu", cap, n, full);
        cr_assert(memcmp(out, want, cap * sizeof *out) == 0, "cap %zu: prefix not copied", cap);
        for (size_t i = cap; i < 16; i++)
            cr_assert_eq(out[i], 0xA5A5A5A5u, "cap %zu: wrote beyond cap at %zu", cap, i);
        PT_ERR(fn(c, 1, out, cap, NULL), PKV_ERANGE);
        PT_CHECK(c);
    }
    PT_SNAP_SAME(&s, c, "too-small buffers");
    /* Exact fit, larger buffer, n NULL. */
    n = 0;
    PT_OK(fn(c, 1, out, full, &n));
    cr_assert_eq(n, full);
    cr_assert(memcmp(out, want, full * sizeof *out) == 0);
    PT_OK(fn(c, 1, out, 16, NULL));
    cr_assert(memcmp(out, want, full * sizeof *out) == 0);
    /* Empty sequence: length 0 with any buffer. */
    n = 77;
    PT_OK(fn(c, 2, out, 16, &n));
    cr_assert_eq(n, 0);
    n = 77;
    PT_OK(fn(c, 2, out, 0, &n));
    cr_assert_eq(n, 0);
    PT_CHECK(c);
    PT_SNAP_SAME(&s, c, "table reads");
    pt_snap_free(&s);
}

Test(errors, seq_blocks)
{
    table_errors(false);
}

Test(errors, seq_tokens)
{
    table_errors(true);
}

/* Size query idiom: out may be NULL when cap is 0 (nothing is copied). */
Test(errors, null_buffer_with_zero_cap_queries_length)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    size_t n = 0;
    PT_ERR(pkv_seq_blocks(c, 1, NULL, 0, &n), PKV_ERANGE);
    cr_assert_eq(n, 3);
    n = 0;
    PT_ERR(pkv_seq_tokens(c, 1, NULL, 0, &n), PKV_ERANGE);
    cr_assert_eq(n, 10);
    n = 5;
    PT_OK(pkv_seq_blocks(c, 2, NULL, 0, &n));
    cr_assert_eq(n, 0);
    n = 5;
    PT_OK(pkv_seq_tokens(c, 2, NULL, 0, &n));
    cr_assert_eq(n, 0);
    PT_CHECK(c);
}

Test(errors, check_and_kv)
{
    uint32_t a[16];
    pkv_cache *c = setup_cache(a);
    PT_ERR(pkv_check(NULL, NULL, 0), PKV_EINVAL);
    PT_OK(pkv_check(c, NULL, 0));
    PT_OK(pkv_check(c, NULL, 100));
    char why[4] = "xyz";
    PT_OK(pkv_check(c, why, 0));
    cr_assert_str_eq(why, "xyz", "why_len 0: nothing written");
    PT_OK(pkv_check(c, why, 1));
    cr_assert_null(pkv_kv(NULL, 0, 0, PKV_K, 0));
    cr_assert_null(pkv_kv(c, 32, 0, PKV_K, 0));
    PT_CHECK(c);
}

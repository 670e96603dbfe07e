/*
 * test_seqmap.c — the sequence map (src/seqmap.c): id -> sequence, linear probing.
 *
 * Sequence ids come from callers and from files a forger can write, so the slot
 * of an id must not be predictable: ids chosen to share a home slot under the
 * unkeyed hash (the splitmix64 finalizer, inverted) must spread out like any
 * others, or every look-up walks one cluster and an open with n such sequences
 * costs n². And whatever the slots, find, insert and remove must agree with a
 * plain reference model.
 */
#include "pkv_test.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

TestSuite(seqmap, .init = pt_setup, .fini = pt_teardown);

/* The inverse of the splitmix64 finalizer: unmix(k) is the id whose unkeyed hash
 * is k. */
static uint64_t unmix(uint64_t x) {
    x ^= x >> 31 ^ x >> 62;
    x *= 0x319642b2d24d8ec3ull;
    x ^= x >> 27 ^ x >> 54;
    x *= 0x96de1b173f119089ull;
    x ^= x >> 30 ^ x >> 60;
    return x;
}

static uint64_t fwd(uint64_t x) { /* splitmix64 finalizer, to check unmix */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static pkv_seq *new_seq(uint64_t id) {
    pkv_seq *s = calloc(1, sizeof *s);
    cr_assert(s);
    s->id = id;
    return s;
}

static void put(pkv_seqmap *m, uint64_t id) {
    cr_assert_eq(pkv_seqmap_reserve(m), 0);
    pkv_seqmap_insert(m, new_seq(id));
}

/* The longest run of occupied slots (wrapping). */
static uint64_t longest_run(const pkv_seqmap *m) {
    uint64_t best = 0, run = 0;
    for (uint64_t i = 0; i <= 2 * m->mask + 1; i++) {
        run = m->slots[i & m->mask] ? run + 1 : 0;
        if (run > best) best = run;
    }
    return best > m->mask + 1 ? m->mask + 1 : best;
}

Test(seqmap, ids_chosen_to_collide_spread_out) {
    cr_assert_eq(fwd(unmix(0x123456789abcdef0ull)), 0x123456789abcdef0ull);
    pkv_seqmap m;
    cr_assert_eq(pkv_seqmap_init(&m), 0);
    const uint64_t n = 4096;
    /* Unkeyed, every one of these hashes to slot 0 of any table below 2^32 slots. */
    for (uint64_t k = 1; k <= n; k++) put(&m, unmix(k << 32));
    cr_assert_eq(m.count, n);
    uint64_t run = longest_run(&m);
    /* 4096 keys in >= 8192 slots at random: the longest run is a few dozen; one
     * shared home slot makes it 4096. */
    cr_assert_lt(run, 128, "longest probe run %llu of %llu slots", (unsigned long long)run,
                 (unsigned long long)(m.mask + 1));
    for (uint64_t k = 1; k <= n; k++) {
        pkv_seq *s = pkv_seqmap_find(&m, unmix(k << 32));
        cr_assert(s && s->id == unmix(k << 32));
    }
    pkv_seqmap_free(&m);
}

/* Random inserts, removes and finds against a flat array of ids. */
Test(seqmap, agrees_with_a_reference_model) {
    pkv_seqmap m;
    cr_assert_eq(pkv_seqmap_init(&m), 0);
    enum { IDS = 512, STEPS = 20000 };
    bool in[IDS] = {false};
    uint64_t r = 88172645463325252ull, live = 0;
    for (int step = 0; step < STEPS; step++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        uint64_t k = r % IDS, id = unmix((k & 7) << 32 | k); /* clustered when unkeyed */
        if ((r >> 20) % 3 == 0) {
            pkv_seq *s = pkv_seqmap_get(&m, id);
            cr_assert_eq(s != NULL, in[k], "step %d: find %llu", step, (unsigned long long)k);
            if (s) cr_assert_eq(s->id, id);
        } else if (!in[k]) {
            put(&m, id);
            in[k] = true;
            live++;
        } else {
            pkv_seq *s = pkv_seqmap_find(&m, id);
            cr_assert(s);
            pkv_seqmap_remove(&m, id);
            free(s);
            in[k] = false;
            live--;
        }
        cr_assert_eq(m.count, live);
    }
    for (uint64_t k = 0; k < IDS; k++)
        cr_assert_eq(pkv_seqmap_find(&m, unmix((k & 7) << 32 | k)) != NULL, in[k]);
    pkv_seqmap_free(&m);
}

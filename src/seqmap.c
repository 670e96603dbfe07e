/*
 * seqmap.c — sequence id -> struct pkv_seq, an open-addressing (linear probing)
 * table of pointers that doubles at load 1/2 and deletes by backward shift.
 *
 * Growth happens only in pkv_seqmap_reserve(), which callers invoke before they
 * mutate anything, so an out-of-memory failure leaves the cache unchanged.
 * A one-entry cache of the last sequence found serves decode loops, which call
 * append and commit on the same id; removal clears it.
 *
 * Ids come from callers (an engine may pass request ids from its clients) and
 * from the log and checkpoint (which a forger writes), so the slot of an id is
 * keyed with a random seed drawn once per process: with a fixed hash, ids chosen
 * to share a home slot would make every look-up walk one cluster (an open
 * quadratic in the number of sequences). Iteration order is therefore not stable
 * between processes (pkv_seq_list promises none). Fuzzing builds use a fixed
 * seed, so that an input replays the same way. Where getrandom fails the seed is
 * derived from the clock and the pid instead. The seed is a process global, not
 * a field of the map: 8 more bytes in struct pkv_cache move its hot fields
 * across cache lines, which the decode loop pays for on every token.
 */
#include "internal.h"

#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

static inline uint64_t mix(uint64_t key, uint64_t id) { /* splitmix64 finalizer */
    uint64_t x = id ^ key;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t g_seed; /* set once (seed_init), then only read */
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void seed_init(void) {
#ifdef PKV_FUZZING
    g_seed = 0x9e3779b97f4a7c15ull;
#else
    if (getrandom(&g_seed, sizeof g_seed, GRND_NONBLOCK) != (ssize_t)sizeof g_seed)
        g_seed = mix((uint64_t)getpid() << 32, pkv_now_ns());
#endif
}

int pkv_seqmap_init(pkv_seqmap *m) {
    pthread_once(&seed_once, seed_init);
    m->slots = calloc(64, sizeof *m->slots);
    if (!m->slots) return pkv_err(PKV_ENOMEM, "sequence map");
    m->mask = 63;
    m->count = 0;
    m->last = NULL;
    return 0;
}

void pkv_seqmap_free(pkv_seqmap *m) {
    if (!m->slots) return;
    for (uint64_t i = 0; i <= m->mask; i++) {
        if (m->slots[i]) {
            free(m->slots[i]->blocks);
            free(m->slots[i]);
        }
    }
    free(m->slots);
    m->slots = NULL;
}

/* The slow path of pkv_seqmap_get (internal.h), which tries `last` first. */
pkv_seq *pkv_seqmap_find(pkv_seqmap *m, uint64_t id) {
    for (uint64_t i = mix(g_seed, id) & m->mask;; i = (i + 1) & m->mask) {
        pkv_seq *s = m->slots[i];
        if (!s || s->id == id) {
            if (s) m->last = s;
            return s;
        }
    }
}

static void place(pkv_seq **slots, uint64_t mask, pkv_seq *s) {
    uint64_t i = mix(g_seed, s->id) & mask;
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = s;
}

int pkv_seqmap_reserve(pkv_seqmap *m) {
    if ((m->count + 1) * 2 <= m->mask + 1) return 0;
    uint64_t n = (m->mask + 1) * 2;
    pkv_seq **ns = calloc(n, sizeof *ns);
    if (!ns) return pkv_err(PKV_ENOMEM, "sequence map of %llu slots",
                            (unsigned long long)n);
    for (uint64_t i = 0; i <= m->mask; i++)
        if (m->slots[i]) place(ns, n - 1, m->slots[i]);
    free(m->slots);
    m->slots = ns;
    m->mask = n - 1;
    return 0;
}

void pkv_seqmap_insert(pkv_seqmap *m, pkv_seq *s) {
    pkv_assert((m->count + 1) * 2 <= m->mask + 1);
    place(m->slots, m->mask, s);
    m->count++;
}

void pkv_seqmap_remove(pkv_seqmap *m, uint64_t id) {
    uint64_t i = mix(g_seed, id) & m->mask;
    while (m->slots[i]->id != id) i = (i + 1) & m->mask;
    for (uint64_t j = i;;) {
        j = (j + 1) & m->mask;
        if (!m->slots[j]) break;
        uint64_t k = mix(g_seed, m->slots[j]->id) & m->mask;
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        m->slots[i] = m->slots[j];
        i = j;
    }
    m->slots[i] = NULL;
    m->count--;
    m->last = NULL;
}

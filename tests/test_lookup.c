/* pkv_prefix_lookup: the count pkv_seq_open would attach, and nothing else.
 *
 * Specifications checked here:
 *  - the count equals an independent reference (the longest run of full-block
 *    prefixes ever committed under the salt, capped at a multiple of block_size
 *    <= n-1) and the n_cached of the pkv_seq_open that follows it, on random
 *    prompts that share stems, under several salts, with and without eviction;
 *  - many lookups leave the eviction order alone (leaf-LRU recency and SLRU
 *    protection): a cache that was looked up evicts exactly what its twin that
 *    was not does;
 *  - lookups change no pkv_stats counter and write nothing: every file of the
 *    cache directory is byte-identical before and after;
 *  - a recovered block is checksummed, and a damaged one ends the count without
 *    being marked BAD, counted or logged (pkv_seq_open then does all three);
 *  - a read-only handle answers;
 *  - bad arguments give PKV_EINVAL and *n_cached = 0; another salt sees nothing.
 * K/V follows pkv_test.h's convention (a pure function of salt and prefix), and
 * the attached prefixes are read back after each open. */
#include "pkv_test.h"
#include "pagedkv_inspect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

TestSuite(lookup, .init = pt_setup, .fini = pt_teardown);

#define BS 4u

static size_t lookup_ok(pkv_cache *c, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t nc = 77;
    int r = pkv_prefix_lookup(c, salt, p, n, &nc);
    cr_assert_eq(r, 0, "%spkv_prefix_lookup(n=%zu) -> %d (%s: %s)", pt_ctx, n, r,
                 pkv_strerror(r), pkv_last_error());
    cr_assert(nc % BS == 0 && (nc == 0 || nc <= n - 1), "%slookup gave %zu of %zu", pt_ctx,
              nc, n);
    return nc;
}

/* Open sequence id with prompt p (salt), require it to attach `expect` tokens,
 * append and commit the rest with its K/V, verify the whole sequence. */
static void fill_expect(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n,
                        size_t expect)
{
    size_t nc = PT_SEQ_OPEN(c, id, salt, p, n);
    cr_assert_eq(nc, expect, "%sseq_open attached %zu tokens, the lookup said %zu", pt_ctx,
                 nc, expect);
    PT_VERIFY(c, id, salt, p, nc, nc); /* the attached K/V is the prefix's */
    if (n > nc) {
        PT_APPEND(c, id, salt, p, nc, n - nc);
        PT_OK(pkv_seq_commit(c, id, n - nc));
    }
    PT_VERIFY(c, id, salt, p, n, n);
}

static void fill(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n)
{
    size_t nc = PT_SEQ_OPEN(c, id, salt, p, n);
    if (n > nc) {
        PT_APPEND(c, id, salt, p, nc, n - nc);
        PT_OK(pkv_seq_commit(c, id, n - nc));
    }
}

/* ---- Equal to the reference and to pkv_seq_open ------------------------------------- */

#define STEMS 6
#define MAXP 48

typedef struct rnd_prompt {
    uint32_t t[MAXP];
    size_t n;
    uint64_t salt;
} rnd_prompt;

/* A stem (shared by many prompts, so hits are common) plus a random tail over a
 * four-token alphabet (so tails collide too); salts 0..2. */
static void make_prompt(pt_rng *r, uint32_t stems[STEMS][24], rnd_prompt *p)
{
    const uint32_t *stem = stems[pt_below(r, STEMS)];
    size_t ns = pt_below(r, 25), nt = 1 + pt_below(r, 20);
    for (size_t i = 0; i < ns; i++) p->t[i] = stem[i];
    for (size_t i = 0; i < nt; i++) p->t[ns + i] = pt_below(r, 4);
    p->n = ns + nt;
    p->salt = pt_below(r, 3);
}

/* The reference: the longest k*BS <= n-1 whose every full-block prefix was
 * committed under the salt (no eviction happens where it is used). */
static size_t ref_cached(const pt_set *sealed, const rnd_prompt *p)
{
    size_t cap = pt_hit_cap(p->n, BS), k = 0;
    while (k + BS <= cap && pt_set_has(sealed, pt_prefix_key(p->salt, p->t, k + BS))) k += BS;
    return k;
}

Test(lookup, equals_reference_and_what_seq_open_attaches)
{
    pt_rng r = {.s = pt_env_u64("PKV_TEST_SEED", 0x10c4u)};
    snprintf(pt_ctx, sizeof pt_ctx, "seed 0x%llx: ", (unsigned long long)r.s);
    uint32_t stems[STEMS][24];
    for (int s = 0; s < STEMS; s++)
        for (int i = 0; i < 24; i++) stems[s][i] = 100 + pt_below(&r, 1000);
    /* Roomy: nothing is ever evicted, so the reference is exact. */
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 4096);
    pkv_cache *c = pt_open_sub("roomy", &o);
    pt_set sealed;
    pt_set_init(&sealed);
    uint64_t open_ids[8];
    size_t n_open = 0;
    size_t hits = 0, multiple = 0;
    static rnd_prompt hist[300];
    for (uint64_t it = 1; it <= 300; it++) {
        rnd_prompt p;
        make_prompt(&r, stems, &p);
        if (it > 1 && pt_below(&r, 3) == 0) { /* a prefix of an earlier prompt */
            p = hist[pt_below(&r, (uint32_t)it - 1)];
            p.n = 1 + pt_below(&r, (uint32_t)p.n);
        }
        hist[it - 1] = p;
        size_t ref = ref_cached(&sealed, &p);
        size_t got = lookup_ok(c, p.salt, p.t, p.n);
        cr_assert_eq(got, ref, "%sprompt %llu (n %zu, salt %llu): lookup %zu, reference %zu",
                     pt_ctx, (unsigned long long)it, p.n, (unsigned long long)p.salt, got, ref);
        cr_assert_eq(lookup_ok(c, p.salt, p.t, p.n), got, "%sa second lookup differs", pt_ctx);
        hits += got > 0;
        multiple += got > 0 && p.n % BS == 0 && got == p.n - BS;
        fill_expect(c, it, p.salt, p.t, p.n, got);
        for (size_t k = BS; k <= p.n; k += BS) pt_set_add(&sealed, pt_prefix_key(p.salt, p.t, k));
        /* keep a few sequences open (their blocks shared), close the rest */
        if (n_open < 8 && pt_below(&r, 4) == 0) {
            open_ids[n_open++] = it;
        } else {
            PT_OK(pkv_seq_close(c, it));
        }
    }
    cr_assert(hits > 100 && multiple > 3, "%sthe prompts should hit often (%zu) and hit "
              "the n-1 cap of a whole-block prompt (%zu)", pt_ctx, hits, multiple);
    PT_CHECK(c);
    for (size_t i = 0; i < n_open; i++) PT_OK(pkv_seq_close(c, open_ids[i]));
    pt_set_free(&sealed);

    /* Tight: 24 blocks, so opens and appends evict; the lookup still equals what
     * the open attaches. */
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 24);
    c = pt_open_sub("tight", &o);
    for (uint64_t it = 1; it <= 300; it++) {
        rnd_prompt p;
        make_prompt(&r, stems, &p);
        p.n = p.n > 40 ? 40 : p.n; /* 10 blocks: fits beside an open sequence */
        size_t got = lookup_ok(c, p.salt, p.t, p.n);
        fill_expect(c, it, p.salt, p.t, p.n, got);
        PT_OK(pkv_seq_close(c, it));
    }
    cr_assert(pt_stats(c).evictions > 50, "%sthe tight cache should evict", pt_ctx);
    PT_CHECK(c);
}

/* ---- The eviction order ------------------------------------------------------------- */

/* Three prompts of 3 full blocks + 1 token, committed and closed in order 0, 1, 2
 * (so prompt 0 is the least recently released), in a 12-block cache: 9 cached
 * blocks, 3 free. */
static pkv_cache *build_three(const char *sub, pkv_eviction ev, uint32_t p[3][13])
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 12);
    o.eviction = ev;
    /* The closed tails wait in limbo; with the limbo wait the 3 free blocks are
     * theirs, so the victims below do not depend on flush timing. */
    o.flags = PKV_OPEN_LIMBO_WAIT;
    pkv_cache *c = pt_open_sub(sub, &o);
    for (uint64_t i = 0; i < 3; i++) {
        fill(c, 1 + i, 0, p[i], 13);
        PT_OK(pkv_seq_close(c, 1 + i));
    }
    pkv_stats st = pt_stats(c);
    cr_assert(st.blocks_cached == 9 && st.blocks_free == 3, "cached %llu free %llu",
              (unsigned long long)st.blocks_cached, (unsigned long long)st.blocks_free);
    return c;
}

Test(lookup, leaves_the_eviction_order_alone)
{
    for (int pol = 0; pol < 2; pol++) {
        pkv_eviction ev = pol ? PKV_EVICT_LEAF_SLRU : PKV_EVICT_LEAF_LRU;
        snprintf(pt_ctx, sizeof pt_ctx, "%s: ", pol ? "leaf-slru" : "leaf-lru");
        uint32_t p[3][13], q[25];
        for (uint32_t i = 0; i < 3; i++)
            for (uint32_t k = 0; k < 13; k++) p[i][k] = 1000 * (i + 1) + k;
        for (uint32_t k = 0; k < 25; k++) q[k] = 9000 + k;
        char a_name[16], b_name[16];
        snprintf(a_name, sizeof a_name, "twin-a%d", pol);
        snprintf(b_name, sizeof b_name, "twin-b%d", pol);
        pkv_cache *a = build_three(a_name, ev, p), *b = build_three(b_name, ev, p);
        /* b: prompt 0 (the eviction candidate) looked up 1,000 times, the others
         * too; a leaf-LRU refresh or an SLRU "hit again" would save prompt 0. */
        for (int k = 0; k < 1000; k++)
            for (int i = 0; i < 3; i++) cr_assert_eq(lookup_ok(b, 0, p[i], 13), 12);
        /* The same work on both: a 25-token prompt takes 7 blocks (3 free + 4
         * evicted), then every prompt is looked up and every block compared. */
        fill(a, 10, 0, q, 25);
        fill(b, 10, 0, q, 25);
        size_t got[3];
        for (int i = 0; i < 3; i++) {
            got[i] = lookup_ok(a, 0, p[i], 13);
            cr_assert_eq(lookup_ok(b, 0, p[i], 13), got[i],
                         "%sprompt %d: %zu cached after lookups, %zu without", pt_ctx, i,
                         lookup_ok(b, 0, p[i], 13), got[i]);
        }
        /* Leaf-first, least recent first: prompt 0's 3 blocks, then prompt 1's leaf. */
        cr_assert(got[0] == 0 && got[1] == 8 && got[2] == 12,
                  "%sevicted the wrong blocks: %zu %zu %zu cached", pt_ctx, got[0], got[1],
                  got[2]);
        for (uint32_t blk = 0; blk < 12; blk++) {
            pkv_block_info x, y;
            PT_OK(pkv_inspect_block(a, blk, &x));
            PT_OK(pkv_inspect_block(b, blk, &y));
            cr_assert(x.state == y.state && x.ref == y.ref && x.flags == y.flags &&
                          x.parent == y.parent && x.release_lsn == y.release_lsn,
                      "%sblock %u differs between the twins", pt_ctx, blk);
        }
        PT_CHECK(a);
        PT_CHECK(b);
        pt_close(a);
        pt_close(b);
    }
}

/* ---- No counter, no write ----------------------------------------------------------- */

typedef struct dir_image {
    size_t n;
    char name[32][64];
    uint8_t *bytes[32];
    size_t len[32];
} dir_image;

static void dir_take(dir_image *im, const char *dir)
{
    memset(im, 0, sizeof *im);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "opendir %s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        cr_assert(im->n < 32 && strlen(e->d_name) < 64, "too many or long names in %s", dir);
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0);
        if (!S_ISREG(st.st_mode)) continue;
        size_t i = im->n++;
        memcpy(im->name[i], e->d_name, strlen(e->d_name) + 1); /* < 64, checked */
        im->len[i] = (size_t)st.st_size;
        im->bytes[i] = malloc(im->len[i] ? im->len[i] : 1);
        cr_assert_not_null(im->bytes[i]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        cr_assert(fd >= 0);
        cr_assert_eq(pread(fd, im->bytes[i], im->len[i], 0), (ssize_t)im->len[i]);
        close(fd);
    }
    closedir(d);
}

static void dir_same(const dir_image *a, const dir_image *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: %zu files before, %zu after", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        size_t j = 0;
        while (j < b->n && strcmp(a->name[i], b->name[j])) j++;
        cr_assert(j < b->n, "%s: %s is gone", what, a->name[i]);
        cr_assert(a->len[i] == b->len[j] && memcmp(a->bytes[i], b->bytes[j], a->len[i]) == 0,
                  "%s: %s changed", what, a->name[i]);
    }
}

static void dir_free(dir_image *im)
{
    for (size_t i = 0; i < im->n; i++) free(im->bytes[i]);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

Test(lookup, changes_no_counter_and_writes_nothing)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 64);
    pkv_cache *c = pt_open_sub("cache", &o);
    uint32_t p[4][21];
    for (uint32_t i = 0; i < 4; i++)
        for (uint32_t k = 0; k < 21; k++) p[i][k] = (k < 8 ? 5 : 100 * i) + k;
    for (uint64_t i = 0; i < 4; i++) fill(c, 1 + i, i == 3 ? 7 : 0, p[i], 21);
    PT_OK(pkv_seq_close(c, 1));
    PT_OK(pkv_seq_close(c, 2));
    PT_OK(pkv_sync(c)); /* nothing left to flush */
    sleep_ms(20);
    pkv_stats before = pt_stats(c);
    char dir[512];
    pt_path(dir, sizeof dir, "cache");
    dir_image im0, im1;
    dir_take(&im0, dir);
    size_t total = 0;
    for (int k = 0; k < 1000; k++) {
        int i = k % 4;
        total += lookup_ok(c, i == 3 ? 7 : 0, p[i], 21 - (size_t)(k % 13)); /* hits */
        total += lookup_ok(c, 1, p[i], 21);                                  /* salt: misses */
    }
    cr_assert(total > 1000 * 8, "the lookups should mostly hit (%zu tokens)", total);
    sleep_ms(20); /* two group-commit intervals: a record would have been written */
    pkv_stats after = pt_stats(c);
    PT_STATS_EQ(&before, &after, "1,000 lookups");
    dir_take(&im1, dir);
    dir_same(&im0, &im1, "1,000 lookups");
    dir_free(&im0);
    dir_free(&im1);
    PT_CHECK(c);
}

/* ---- Recovered blocks ----------------------------------------------------------------- */

/* Overwrite 64 bytes in the middle of block b's payload in the arena file. */
static void smash(const char *dir, uint32_t b, const pkv_cache_info *inf)
{
    char arena[600];
    snprintf(arena, sizeof arena, "%s/arena", dir);
    int fd = open(arena, O_WRONLY | O_CLOEXEC);
    cr_assert(fd >= 0, "open %s: %s", arena, strerror(errno));
    uint8_t junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0xA5 ^ (i * 31));
    off_t off = (off_t)(4096 + (uint64_t)b * inf->slot_bytes + inf->block_bytes / 3);
    cr_assert_eq(pwrite(fd, junk, sizeof junk, off), (ssize_t)sizeof junk);
    close(fd);
}

/* A closed cache in pt_dir/sub holding prompt p (25 tokens: 6 full blocks) sealed and
 * cached, block 3 of it damaged in the file when `damage`. Returns its table. */
static void build_recovered(const char *sub, const uint32_t *p, bool damage, uint32_t tab[7])
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 32);
    pkv_cache *c = pt_open_sub(sub, &o);
    fill(c, 1, 0, p, 25);
    cr_assert_eq(PT_BLOCKS(c, 1, tab, 7), 7);
    pkv_cache_info inf = pt_info(c);
    PT_OK(pkv_seq_close(c, 1));
    pt_close(c);
    char dir[512];
    pt_path(dir, sizeof dir, sub);
    if (damage) smash(dir, tab[3], &inf);
}

static uint32_t block_flags(pkv_cache *c, uint32_t b)
{
    pkv_block_info x;
    PT_OK(pkv_inspect_block(c, b, &x));
    return x.flags;
}

Test(lookup, checks_recovered_payload_and_records_nothing)
{
    uint32_t p[25], tab[7];
    for (uint32_t k = 0; k < 25; k++) p[k] = 40 + 3 * k;
    build_recovered("cache", p, true, tab);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 32);
    pkv_cache *c = pt_open_sub("cache", &o);
    PT_OK(pkv_sync(c));
    cr_assert(block_flags(c, tab[0]) & PKV_BLOCK_UNVERIFIED, "recovered blocks start unverified");
    pkv_stats before = pt_stats(c);
    for (int k = 0; k < 100; k++)
        cr_assert_eq(lookup_ok(c, 0, p, 25), 3 * BS, "the damaged block 3 ends the count");
    /* A pass is remembered; the failure is not recorded (no BAD, no counter). */
    cr_assert_eq(block_flags(c, tab[2]) & PKV_BLOCK_UNVERIFIED, 0u, "block 2 passed");
    cr_assert_eq(block_flags(c, tab[3]), PKV_BLOCK_UNVERIFIED, "block 3 left to seq_open");
    sleep_ms(20);
    pkv_stats after = pt_stats(c);
    PT_STATS_EQ(&before, &after, "lookups of a recovered, damaged prefix");
    /* pkv_seq_open attaches the same count and records the failure. */
    size_t nc = PT_SEQ_OPEN(c, 5, 0, p, 25);
    cr_assert_eq(nc, 3 * BS);
    PT_VERIFY(c, 5, 0, p, nc, nc);
    pkv_stats opened = pt_stats(c);
    cr_assert_eq(opened.verify_failures, 1);
    cr_assert(block_flags(c, tab[3]) & PKV_BLOCK_BAD, "seq_open marks it BAD");
    cr_assert_eq(lookup_ok(c, 0, p, 25), 3 * BS);
    PT_CHECK(c);
}

/* ---- Read-only handles ---------------------------------------------------------------- */

Test(lookup, works_on_a_read_only_handle)
{
    uint32_t p[25], q[25], tab[7];
    for (uint32_t k = 0; k < 25; k++) p[k] = 40 + 3 * k, q[k] = 7 + k;
    build_recovered("cache", p, false, tab);
    build_recovered("damaged", p, true, tab);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F32, 32);
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *c = pt_open_sub("cache", &o);
    pkv_stats before = pt_stats(c);
    cr_assert_eq(lookup_ok(c, 0, p, 25), 24);
    cr_assert_eq(lookup_ok(c, 0, p, 24), 20); /* the n-1 cap */
    cr_assert_eq(lookup_ok(c, 0, p, 10), 8);
    cr_assert_eq(lookup_ok(c, 0, q, 25), 0);
    cr_assert_eq(lookup_ok(c, 3, p, 25), 0);
    size_t nc = 0;
    PT_ERR(pkv_seq_open(c, 9, 0, p, 25, &nc), PKV_ERDONLY);
    pkv_stats after = pt_stats(c);
    PT_STATS_EQ(&before, &after, "lookups on a read-only handle");
    PT_CHECK(c);
    pkv_cache *d = pt_open_sub("damaged", &o);
    cr_assert_eq(lookup_ok(d, 0, p, 25), 12, "a damaged block ends a read-only count too");
    cr_assert_eq(pt_stats(d).verify_failures, 0);
    PT_CHECK(d);
}

/* ---- Arguments and salts -------------------------------------------------------------- */

Test(lookup, rejects_bad_arguments_and_keeps_salts_apart)
{
    pkv_cache *c = pt_open(BS, 16);
    uint32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    fill(c, 1, 0, p, 9);
    size_t nc = 77;
    PT_ERR(pkv_prefix_lookup(NULL, 0, p, 9, &nc), PKV_EINVAL);
    cr_assert_eq(nc, 0, "*n_cached is 0 on error");
    cr_assert(pkv_last_error()[0], "an error message");
    nc = 77;
    PT_ERR(pkv_prefix_lookup(c, 0, NULL, 9, &nc), PKV_EINVAL);
    cr_assert_eq(nc, 0);
    PT_ERR(pkv_prefix_lookup(c, 0, p, 9, NULL), PKV_EINVAL);
    nc = 77;
    PT_ERR(pkv_prefix_lookup(c, 0, p, 0, &nc), PKV_EINVAL);
    cr_assert_eq(nc, 0);
    PT_ERR(pkv_prefix_lookup(c, 0, NULL, 0, &nc), PKV_EINVAL);
    /* n == 1 leaves its one token to compute; the cap makes 8 of 9, 4 of 8. */
    cr_assert_eq(lookup_ok(c, 0, p, 1), 0);
    cr_assert_eq(lookup_ok(c, 0, p, 9), 8);
    cr_assert_eq(lookup_ok(c, 0, p, 8), 4);
    /* Salts are trust domains: the same tokens under another salt are not cached. */
    cr_assert_eq(lookup_ok(c, 1, p, 9), 0);
    cr_assert_eq(lookup_ok(c, UINT64_MAX, p, 9), 0);
    fill(c, 2, 1, p, 9);
    cr_assert_eq(lookup_ok(c, 1, p, 9), 8);
    PT_CHECK(c);
}

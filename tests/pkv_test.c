#include "pkv_test.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char pt_dir[256];
char pt_ctx[256];

#define PT_MAX_OPEN 64
static pkv_cache *pt_open_caches[PT_MAX_OPEN];

void pt_setup(void)
{
    snprintf(pt_dir, sizeof pt_dir, "/tmp/pkvtest.XXXXXX");
    pt_ctx[0] = '\0';
    memset(pt_open_caches, 0, sizeof pt_open_caches);
    cr_assert_not_null(mkdtemp(pt_dir), "mkdtemp: %s", strerror(errno));
}

static int pt_rm_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(path);
}

int pt_rmrf(const char *path)
{
    return nftw(path, pt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

void pt_teardown(void)
{
    for (size_t i = 0; i < PT_MAX_OPEN; i++) {
        if (pt_open_caches[i]) {
            pkv_close(pt_open_caches[i]);
            pt_open_caches[i] = NULL;
        }
    }
    if (pt_dir[0])
        pt_rmrf(pt_dir);
}

void pt_path(char *buf, size_t cap, const char *sub)
{
    int n = snprintf(buf, cap, "%s/%s", pt_dir, sub);
    cr_assert(n > 0 && (size_t)n < cap, "path too long");
}

void pt_opts(pkv_options *o, uint32_t layers, uint32_t heads, uint32_t hdim,
             uint32_t bs, pkv_dtype dt, uint64_t cap)
{
    memset(o, 0, sizeof *o);
    pkv_options_init(o);
    o->num_layers = layers;
    o->num_kv_heads = heads;
    o->head_dim = hdim;
    o->block_size = bs;
    o->dtype = dt;
    o->capacity = cap;
    o->model_id = PT_MODEL;
    o->eviction = pt_eviction();
}

pkv_cache *pt_open_sub(const char *sub, const pkv_options *o)
{
    char path[512];
    pt_path(path, sizeof path, sub);
    pkv_cache *c = NULL;
    int r = pkv_open(path, o, &c);
    cr_assert_eq(r, 0, "%spkv_open(%s) -> %d (%s: %s)", pt_ctx, path, r, pkv_strerror(r),
                 pkv_last_error());
    cr_assert_not_null(c, "pkv_open returned 0 but no cache");
    size_t i;
    for (i = 0; i < PT_MAX_OPEN; i++) {
        if (!pt_open_caches[i]) {
            pt_open_caches[i] = c;
            break;
        }
    }
    cr_assert(i < PT_MAX_OPEN, "too many open caches in one test");
    return c;
}

pkv_cache *pt_open(uint32_t bs, uint64_t cap)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, bs, PKV_F32, cap);
    return pt_open_sub("cache", &o);
}

void pt_close(pkv_cache *c)
{
    for (size_t i = 0; i < PT_MAX_OPEN; i++)
        if (pt_open_caches[i] == c)
            pt_open_caches[i] = NULL;
    pkv_close(c);
}

/* ---- Values ------------------------------------------------------------------ */

uint64_t pt_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t pt_h0(uint64_t salt)
{
    return pt_mix(salt ^ 0x5A17C0FFEEull);
}

uint64_t pt_hstep(uint64_t h, uint32_t tok)
{
    return pt_mix(h ^ pt_mix((uint64_t)tok + 0x1000003ull));
}

uint64_t pt_hprefix(uint64_t salt, const uint32_t *tokens, size_t n)
{
    uint64_t h = pt_h0(salt);
    for (size_t i = 0; i < n; i++)
        h = pt_hstep(h, tokens[i]);
    return h;
}

uint32_t pt_val(uint64_t h, uint32_t layer, uint32_t kind, uint32_t head, uint32_t d)
{
    uint64_t k = ((uint64_t)layer << 48) ^ ((uint64_t)kind << 40) ^ ((uint64_t)head << 24) ^ d;
    return (uint32_t)(pt_mix(h ^ pt_mix(k)) & 0xFFFFFFu) | 1u;
}

static void pt_encode(const pkv_cache_info *inf, uint32_t v, uint8_t *out)
{
    if (inf->elem_size == 4) {
        float f = (float)v;
        memcpy(out, &f, 4);
    } else {
        uint16_t u = (uint16_t)(v ^ (v >> 16));
        memcpy(out, &u, 2);
    }
}

pkv_cache_info pt_info(pkv_cache *c)
{
    pkv_cache_info inf;
    memset(&inf, 0, sizeof inf);
    int r = pkv_info(c, &inf);
    cr_assert_eq(r, 0, "pkv_info -> %d", r);
    return inf;
}

void pt_write_token(pkv_cache *c, const pkv_cache_info *inf, uint32_t block,
                    uint32_t off, uint64_t h)
{
    for (uint32_t l = 0; l < inf->num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < inf->num_kv_heads; hd++) {
                uint8_t *run = pkv_kv(c, block, l, (pkv_kind)k, hd);
                cr_assert_not_null(run, "%spkv_kv(%u,%u,%u,%u) NULL", pt_ctx, block, l, k, hd);
                uint8_t *p = run + (size_t)off * inf->head_dim * inf->elem_size;
                for (uint32_t d = 0; d < inf->head_dim; d++)
                    pt_encode(inf, pt_val(h, l, k, hd, d), p + (size_t)d * inf->elem_size);
            }
}

bool pt_token_ok(pkv_cache *c, const pkv_cache_info *inf, uint32_t block,
                 uint32_t off, uint64_t h, char *err, size_t errlen)
{
    for (uint32_t l = 0; l < inf->num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < inf->num_kv_heads; hd++) {
                const uint8_t *run = pkv_kv(c, block, l, (pkv_kind)k, hd);
                if (!run) {
                    snprintf(err, errlen, "pkv_kv(block %u, layer %u, kind %u, head %u) NULL",
                             block, l, k, hd);
                    return false;
                }
                const uint8_t *p = run + (size_t)off * inf->head_dim * inf->elem_size;
                for (uint32_t d = 0; d < inf->head_dim; d++) {
                    uint8_t want[4];
                    pt_encode(inf, pt_val(h, l, k, hd, d), want);
                    if (memcmp(want, p + (size_t)d * inf->elem_size, inf->elem_size) != 0) {
                        snprintf(err, errlen,
                                 "K/V mismatch at block %u offset %u layer %u kind %u head %u dim %u",
                                 block, off, l, k, hd, d);
                        return false;
                    }
                }
            }
    return true;
}

/* ---- Sequence helpers -------------------------------------------------------- */

pkv_stats pt_stats(pkv_cache *c)
{
    pkv_stats st;
    memset(&st, 0, sizeof st);
    int r = pkv_get_stats(c, &st);
    cr_assert_eq(r, 0, "pkv_get_stats -> %d", r);
    return st;
}

pkv_seq_info pt_seq_info_at(const char *file, int line, pkv_cache *c, uint64_t id)
{
    pkv_seq_info si;
    memset(&si, 0, sizeof si);
    int r = pkv_seq_get_info(c, id, &si);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_seq_get_info(%llu) -> %d (%s)", pt_ctx, file, line,
                 (unsigned long long)id, r, pkv_strerror(r));
    return si;
}

size_t pt_blocks_at(const char *file, int line, pkv_cache *c, uint64_t id,
                    uint32_t *out, size_t cap)
{
    size_t n = (size_t)-1;
    int r = pkv_seq_blocks(c, id, out, cap, &n);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_seq_blocks(%llu, cap %zu) -> %d (%s), n=%zu", pt_ctx,
                 file, line, (unsigned long long)id, cap, r, pkv_strerror(r), n);
    cr_assert(n <= cap, "%s%s:%d: table length %zu > cap %zu", pt_ctx, file, line, n, cap);
    return n;
}

size_t pt_seq_open_at(const char *file, int line, pkv_cache *c, uint64_t id,
                      uint64_t salt, const uint32_t *prompt, size_t n)
{
    size_t nc = (size_t)-1;
    int r = pkv_seq_open(c, id, salt, prompt, n, &nc);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_seq_open(id %llu, n %zu) -> %d (%s: %s)", pt_ctx, file,
                 line, (unsigned long long)id, n, r, pkv_strerror(r), pkv_last_error());
    char why[512] = "";
    r = pkv_check(c, why, sizeof why);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_check after seq_open: %s", pt_ctx, file, line, why);
    return nc;
}

void pt_append_at(const char *file, int line, pkv_cache *c, uint64_t id,
                  uint64_t salt, const uint32_t *all, size_t len, size_t n)
{
    pkv_cache_info inf = pt_info(c);
    pkv_slot *slots = calloc(n ? n : 1, sizeof *slots);
    cr_assert_not_null(slots);
    for (size_t i = 0; i < n; i++)
        slots[i] = (pkv_slot){0xFFFFFFFFu, 0xFFFFFFFFu};
    int r = pkv_seq_append(c, id, all + len, n, slots);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_seq_append(id %llu, len %zu, n %zu) -> %d (%s: %s)",
                 pt_ctx, file, line, (unsigned long long)id, len, n, r, pkv_strerror(r),
                 pkv_last_error());
    char why[512] = "";
    r = pkv_check(c, why, sizeof why);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_check after append: %s", pt_ctx, file, line, why);

    /* Slots must be where the block table says positions len..len+n live. */
    size_t cap = (len + n) / inf.block_size + 2;
    uint32_t *tab = calloc(cap, sizeof *tab);
    cr_assert_not_null(tab);
    size_t nb = pt_blocks_at(file, line, c, id, tab, cap);
    uint64_t h = pt_hprefix(salt, all, len);
    for (size_t i = 0; i < n; i++) {
        size_t p = len + i;
        cr_assert(p / inf.block_size < nb, "%s%s:%d: position %zu beyond table (%zu blocks)",
                  pt_ctx, file, line, p, nb);
        cr_assert_eq(slots[i].block, tab[p / inf.block_size],
                     "%s%s:%d: slot %zu block %u, table says %u", pt_ctx, file, line, i,
                     slots[i].block, tab[p / inf.block_size]);
        cr_assert_eq(slots[i].offset, (uint32_t)(p % inf.block_size),
                     "%s%s:%d: slot %zu offset %u, expected %zu", pt_ctx, file, line, i,
                     slots[i].offset, p % inf.block_size);
        cr_assert(slots[i].block < inf.capacity, "%s%s:%d: slot block %u >= capacity",
                  pt_ctx, file, line, slots[i].block);
        h = pt_hstep(h, all[p]);
        pt_write_token(c, &inf, slots[i].block, slots[i].offset, h);
    }
    free(tab);
    free(slots);
}

void pt_verify_at(const char *file, int line, pkv_cache *c, uint64_t id, uint64_t salt,
                  const uint32_t *tokens, size_t len, size_t committed)
{
    pkv_cache_info inf = pt_info(c);
    uint32_t bs = inf.block_size;
    pkv_seq_info si = pt_seq_info_at(file, line, c, id);
    size_t want_blocks = (len + bs - 1) / bs;
    cr_assert_eq(si.len, (uint64_t)len, "%s%s:%d: seq %llu len %llu, expected %zu", pt_ctx,
                 file, line, (unsigned long long)id, (unsigned long long)si.len, len);
    cr_assert_eq(si.committed, (uint64_t)committed,
                 "%s%s:%d: seq %llu committed %llu, expected %zu", pt_ctx, file, line,
                 (unsigned long long)id, (unsigned long long)si.committed, committed);
    cr_assert_eq(si.n_blocks, (uint64_t)want_blocks,
                 "%s%s:%d: seq %llu n_blocks %llu, expected %zu", pt_ctx, file, line,
                 (unsigned long long)id, (unsigned long long)si.n_blocks, want_blocks);
    cr_assert_eq(si.salt, salt, "%s%s:%d: seq %llu salt %llu, expected %llu", pt_ctx, file,
                 line, (unsigned long long)id, (unsigned long long)si.salt,
                 (unsigned long long)salt);

    size_t tcap = len + 1;
    uint32_t *toks = calloc(tcap, sizeof *toks);
    cr_assert_not_null(toks);
    size_t nt = (size_t)-1;
    int r = pkv_seq_tokens(c, id, toks, tcap, &nt);
    cr_assert_eq(r, 0, "%s%s:%d: pkv_seq_tokens -> %d", pt_ctx, file, line, r);
    cr_assert_eq(nt, len, "%s%s:%d: seq %llu has %zu tokens, expected %zu", pt_ctx, file,
                 line, (unsigned long long)id, nt, len);
    for (size_t i = 0; i < len; i++)
        cr_assert_eq(toks[i], tokens[i], "%s%s:%d: seq %llu token %zu is %u, expected %u",
                     pt_ctx, file, line, (unsigned long long)id, i, toks[i], tokens[i]);
    free(toks);

    size_t bcap = want_blocks + 1;
    uint32_t *tab = calloc(bcap, sizeof *tab);
    cr_assert_not_null(tab);
    size_t nb = pt_blocks_at(file, line, c, id, tab, bcap);
    cr_assert_eq(nb, want_blocks, "%s%s:%d: seq %llu table has %zu blocks, expected %zu",
                 pt_ctx, file, line, (unsigned long long)id, nb, want_blocks);
    for (size_t i = 0; i < nb; i++) {
        cr_assert(tab[i] < inf.capacity, "%s%s:%d: block %u >= capacity", pt_ctx, file,
                  line, tab[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(tab[i], tab[j], "%s%s:%d: block %u twice in table of seq %llu",
                          pt_ctx, file, line, tab[i], (unsigned long long)id);
    }
    uint64_t h = pt_h0(salt);
    char err[256];
    for (size_t p = 0; p < len; p++) {
        h = pt_hstep(h, tokens[p]);
        bool ok = pt_token_ok(c, &inf, tab[p / bs], (uint32_t)(p % bs), h, err, sizeof err);
        cr_assert(ok, "%s%s:%d: seq %llu position %zu: %s", pt_ctx, file, line,
                  (unsigned long long)id, p, err);
    }
    free(tab);
}

#define PT_STAT_FIELDS(X)                                                              \
    X(capacity) X(blocks_free) X(blocks_cached) X(blocks_used) X(blocks_sealed)       \
    X(sequences) X(hit_tokens) X(miss_tokens) X(hit_blocks) X(miss_blocks)            \
    X(evictions) X(cow_copies) X(dedupes) X(seals)

void pt_stats_eq_at(const char *file, int line, const pkv_stats *a,
                    const pkv_stats *b, const char *what)
{
#define PT_CMP(f)                                                                      \
    cr_assert_eq(a->f, b->f, "%s%s:%d: %s: stats." #f " %llu -> %llu", pt_ctx, file,  \
                 line, what, (unsigned long long)a->f, (unsigned long long)b->f);
    PT_STAT_FIELDS(PT_CMP)
#undef PT_CMP
}

/* ---- Snapshots ----------------------------------------------------------------- */

void pt_snap_take(pt_snap *s, pkv_cache *c, const uint64_t *ids, size_t n)
{
    memset(s, 0, sizeof *s);
    s->st = pt_stats(c);
    s->n = n;
    s->seq = calloc(n ? n : 1, sizeof *s->seq);
    cr_assert_not_null(s->seq);
    for (size_t i = 0; i < n; i++) {
        pt_snap_seq *q = &s->seq[i];
        q->id = ids[i];
        q->info = pt_seq_info_at(__FILE__, __LINE__, c, ids[i]);
        q->blocks = calloc(q->info.n_blocks + 1, sizeof *q->blocks);
        q->tokens = calloc(q->info.len + 1, sizeof *q->tokens);
        cr_assert(q->blocks && q->tokens);
        PT_OK(pkv_seq_blocks(c, ids[i], q->blocks, q->info.n_blocks + 1, &q->n_blocks));
        PT_OK(pkv_seq_tokens(c, ids[i], q->tokens, q->info.len + 1, &q->n_tokens));
    }
    pkv_cache_info inf = pt_info(c);
    s->payload_len = (size_t)(inf.capacity * inf.block_bytes);
    s->payload = malloc(s->payload_len ? s->payload_len : 1);
    cr_assert_not_null(s->payload);
    for (uint64_t b = 0; b < inf.capacity; b++) {
        const void *p = pkv_kv(c, (uint32_t)b, 0, PKV_K, 0);
        cr_assert_not_null(p);
        memcpy(s->payload + b * inf.block_bytes, p, inf.block_bytes);
    }
}

void pt_snap_same_at(const char *file, int line, const pt_snap *s, pkv_cache *c,
                     const char *what)
{
    pkv_stats st = pt_stats(c);
    pt_stats_eq_at(file, line, &s->st, &st, what);
    for (size_t i = 0; i < s->n; i++) {
        const pt_snap_seq *q = &s->seq[i];
        pkv_seq_info si = pt_seq_info_at(file, line, c, q->id);
        cr_assert(si.len == q->info.len && si.committed == q->info.committed &&
                      si.n_blocks == q->info.n_blocks && si.salt == q->info.salt,
                  "%s%s:%d: %s: seq %llu info changed (len %llu->%llu committed %llu->%llu "
                  "blocks %llu->%llu)",
                  pt_ctx, file, line, what, (unsigned long long)q->id,
                  (unsigned long long)q->info.len, (unsigned long long)si.len,
                  (unsigned long long)q->info.committed, (unsigned long long)si.committed,
                  (unsigned long long)q->info.n_blocks, (unsigned long long)si.n_blocks);
        uint32_t *b = calloc(q->n_blocks + 1, sizeof *b);
        uint32_t *t = calloc(q->n_tokens + 1, sizeof *t);
        cr_assert(b && t);
        size_t nb = 0, nt = 0;
        PT_OK(pkv_seq_blocks(c, q->id, b, q->n_blocks + 1, &nb));
        PT_OK(pkv_seq_tokens(c, q->id, t, q->n_tokens + 1, &nt));
        cr_assert(nb == q->n_blocks && memcmp(b, q->blocks, nb * sizeof *b) == 0,
                  "%s%s:%d: %s: block table of seq %llu changed", pt_ctx, file, line, what,
                  (unsigned long long)q->id);
        cr_assert(nt == q->n_tokens && memcmp(t, q->tokens, nt * sizeof *t) == 0,
                  "%s%s:%d: %s: tokens of seq %llu changed", pt_ctx, file, line, what,
                  (unsigned long long)q->id);
        free(b);
        free(t);
    }
    pkv_cache_info inf = pt_info(c);
    for (uint64_t blk = 0; blk < inf.capacity; blk++) {
        const void *p = pkv_kv(c, (uint32_t)blk, 0, PKV_K, 0);
        cr_assert_not_null(p);
        cr_assert(memcmp(s->payload + blk * inf.block_bytes, p, inf.block_bytes) == 0,
                  "%s%s:%d: %s: payload of block %llu changed", pt_ctx, file, line, what,
                  (unsigned long long)blk);
    }
}

void pt_snap_free(pt_snap *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->seq[i].blocks);
        free(s->seq[i].tokens);
    }
    free(s->seq);
    free(s->payload);
    memset(s, 0, sizeof *s);
}

/* ---- RNG and set ---------------------------------------------------------------- */

uint64_t pt_rand(pt_rng *r)
{
    r->s += 0x9E3779B97F4A7C15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint32_t pt_below(pt_rng *r, uint32_t n)
{
    return (uint32_t)(pt_rand(r) % n);
}

void pt_set_init(pt_set *s)
{
    s->cap = 1024;
    s->n = 0;
    s->keys = calloc(s->cap, sizeof *s->keys);
    cr_assert_not_null(s->keys);
}

static size_t pt_set_slot(const pt_set *s, uint64_t key)
{
    size_t i = (size_t)(pt_mix(key) & (s->cap - 1));
    while (s->keys[i] && s->keys[i] != key)
        i = (i + 1) & (s->cap - 1);
    return i;
}

bool pt_set_has(const pt_set *s, uint64_t key)
{
    key |= 1;
    return s->keys[pt_set_slot(s, key)] == key;
}

bool pt_set_add(pt_set *s, uint64_t key)
{
    key |= 1;
    if ((s->n + 1) * 2 > s->cap) {
        pt_set old = *s;
        s->cap *= 2;
        s->n = 0;
        s->keys = calloc(s->cap, sizeof *s->keys);
        cr_assert_not_null(s->keys);
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i])
                s->keys[pt_set_slot(s, old.keys[i])] = old.keys[i], s->n++;
        free(old.keys);
    }
    size_t i = pt_set_slot(s, key);
    if (s->keys[i] == key)
        return false;
    s->keys[i] = key;
    s->n++;
    return true;
}

void pt_set_free(pt_set *s)
{
    free(s->keys);
    memset(s, 0, sizeof *s);
}

uint64_t pt_prefix_key(uint64_t salt, const uint32_t *tokens, size_t n)
{
    return pt_mix(pt_hprefix(salt, tokens, n) ^ ((uint64_t)n * 0xD6E8FEB86659FD93ull));
}

size_t pt_hit_cap(size_t n, uint32_t bs)
{
    if (n <= 1)
        return 0;
    return ((n - 1) / bs) * bs;
}

uint64_t pt_env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    return strtoull(v, NULL, 0);
}

/* ---- Synchronous I/O backend ---------------------------------------------------- */

static int sio_fails(void *ctx)
{
    pt_syncio *io = ctx;
    __atomic_add_fetch(&io->calls, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&io->fail, __ATOMIC_ACQUIRE))
        return 0;
    __atomic_add_fetch(&io->failed, 1, __ATOMIC_RELAXED);
    return -__atomic_load_n(&io->err, __ATOMIC_RELAXED);
}

static int sio_open(void *ctx, const char *path, int flags, int mode)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    int fd = open(path, flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
}

static int sio_close(void *ctx, int fd)
{
    (void)ctx;
    return close(fd) ? -errno : 0;
}

static long sio_pread(void *ctx, int fd, void *buf, size_t n, uint64_t off)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            break;
        done += (size_t)k;
    }
    return (long)done;
}

static int sio_write(void *ctx, int fd, const void *buf, size_t n, uint64_t off, int sync)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    size_t done = 0;
    while (done < n) {
        ssize_t k = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        done += (size_t)k;
    }
    if (sync && fdatasync(fd))
        return -errno;
    return 0;
}

static int sio_sync(void *ctx, int fd)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    return fdatasync(fd) ? -errno : 0;
}

static int sio_allocate(void *ctx, int fd, uint64_t len)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    int e = posix_fallocate(fd, 0, (off_t)len);
    return e ? -e : 0;
}

static int sio_rename(void *ctx, const char *from, const char *to)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    return rename(from, to) ? -errno : 0;
}

static int sio_unlink(void *ctx, const char *path)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    return unlink(path) ? -errno : 0;
}

static int sio_sync_dir(void *ctx, const char *dir)
{
    int rc = sio_fails(ctx);
    if (rc)
        return rc;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

void pt_syncio_init(pt_syncio *io)
{
    memset(io, 0, sizeof *io);
    io->err = EIO;
    io->ops = (pkv_io_ops){io,       sio_open,     sio_close,  sio_pread,  sio_write,
                           sio_sync, sio_allocate, sio_rename, sio_unlink, sio_sync_dir, NULL};
}

void pt_syncio_fail(pt_syncio *io, int err)
{
    if (err)
        __atomic_store_n(&io->err, err, __ATOMIC_RELAXED);
    __atomic_store_n(&io->fail, err != 0, __ATOMIC_RELEASE);
}

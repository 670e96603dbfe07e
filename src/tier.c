/*
 * tier.c — the shared prefix tier's engine (docs/remote.md): attach/detach,
 * the publishing thread and its bounded queue (blocks queued at their seal, or
 * with PKV_TIER_PUBLISH_ON_HIT at their first local hit), the fetch that
 * pkv_seq_open makes on a local miss (the import itself is in seq.c), and the
 * probe (EXISTS, no value read) that pkv_prefix_lookup makes with
 * PKV_TIER_LOOKUP.
 *
 * Owns struct pkv_tier: the derived cluster keys, the publish queue, the
 * queue of rejected values to delete (both sent by the publishing thread), the
 * publisher's cluster client, a pool of fetch clients, the counters.
 * Invariants:
 *  - the cache lock is never held across network I/O: the publisher copies a
 *    block under the lock and sends it after unlocking; a fetch reads the local
 *    hit under the lock, fetches and verifies without it, and seq.c imports
 *    under the lock after matching again (rule T1);
 *  - lock order: cache lock, then the queue mutex (seal enqueues with the
 *    cache lock held); a fetch's client mutex, then the queue mutex (a
 *    rejected value is queued for deletion); the publisher never takes the
 *    cache lock while it holds the queue mutex;
 *  - a rejected value is deleted only if the server still holds its bytes
 *    (a compare-and-delete script), so a deletion can cost at most a record
 *    nobody could serve, never a good one written since;
 *  - a full queue drops the seal (counted): publishing never blocks a call;
 *  - rule T2: a record's payload is copied under the cache lock while the
 *    block is SEALED with the hash and salt the queue entry names, and neither
 *    BAD nor UNVERIFIED; a sealed block's slot is never written while it stays
 *    sealed (docs/design.md, block life cycle), so the record holds exactly the
 *    bytes whose checksum the seal recorded, and the prefix tokens are read
 *    from the same chain under the same hold.
 * Without hiredis (meson option remote_tier) the public calls return
 * PKV_ENOTSUP and nothing else is compiled.
 */
#include "tier.h"

#include <lz4.h>
#include <stdlib.h>

#if PKV_WITH_HIREDIS

typedef struct tier_qent {
    uint32_t b;
    uint64_t salt;
    pkv_h128 h;
} tier_qent;

/* A value that failed verification, to delete if it is still the same bytes. */
typedef struct tier_del {
    char key[PKV_TIER_KEY_LEN + 1];
    uint8_t *val;
    size_t len;
} tier_del;

/* Bounds of the deletion queue: bad values are rare; a flood of them is dropped
 * (counted), never buffered without limit. */
enum { DEL_MAX = 64 };
#define DEL_MAX_BYTES (64ull << 20)

typedef struct tier_fetcher {
    pthread_mutex_t m;
    pkv_rc *rc;
} tier_fetcher;

struct pkv_tier {
    pkv_cache *c;
    pkv_tier_keys keys;
    pkv_rc_conf conf;
    uint32_t deadline_ms, max_blocks, max_depth, ttl_s, flags;
    char model[PKV_MODEL_ID_MAX + 1];
    /* publishing */
    pthread_mutex_t qm;
    pthread_cond_t qcv, idle;
    tier_qent *q;
    uint32_t qcap, qhead, qn;
    bool stop, busy;
    tier_del dq[DEL_MAX]; /* under qm */
    uint32_t dn;
    uint64_t dbytes;
    pthread_t thr;
    bool thr_started;
    pkv_rc *pub;
    /* fetching */
    tier_fetcher *fetch;
    uint32_t nfetch;
    bool importing; /* under the cache lock: seq.c is importing (no publish) */
    /* counters */
    _Atomic uint64_t published, dropped, pub_errors, fetches, fetch_blocks, found, imported,
        rejected, errors, deadline_misses, redirects, deleted, delete_failed, lookups,
        lookup_blocks, lookup_found;
};

#define BUMP(t, f, n) atomic_fetch_add_explicit(&(t)->f, (n), memory_order_relaxed)
#define READ(t, f) atomic_load_explicit(&(t)->f, memory_order_relaxed)

/* Queue sealed block b for publishing (cache lock held). false: the queue is
 * full or stopping (counted as dropped): publishing never blocks a call. */
static bool enqueue(pkv_tier *t, uint32_t b, const pkv_block *x) {
    pthread_mutex_lock(&t->qm);
    if (t->qn == t->qcap || t->stop) {
        pthread_mutex_unlock(&t->qm);
        BUMP(t, dropped, 1);
        return false;
    }
    t->q[(t->qhead + t->qn) % t->qcap] = (tier_qent){b, x->salt, x->hash};
    if (t->qn++ == 0) pthread_cond_signal(&t->qcv);
    pthread_mutex_unlock(&t->qm);
    return true;
}

void pkv_tier_on_seal(pkv_cache *c, uint32_t b, uint32_t depth) {
    pkv_tier *t = c->tier;
    pkv_block *x = &c->pool.b[b];
    if (t->importing) { /* it came from the tier: never offered back */
        x->flags |= BLKF_OFFERED;
        return;
    }
    /* PKV_TIER_PUBLISH_ON_HIT: offered at its first local hit (pkv_tier_on_hit) */
    if (t->flags & (PKV_TIER_NO_PUBLISH | PKV_TIER_PUBLISH_ON_HIT)) return;
    /* the depth comes from the seal (the block's table index): walking up to
     * max_depth parents here cost every decode seal that many cache misses */
    if (t->max_depth && depth >= t->max_depth) {
        BUMP(t, dropped, 1);
        return;
    }
    (void)enqueue(t, b, x);
}

void pkv_tier_on_hit(pkv_cache *c, const uint32_t *blocks, uint32_t n) {
    pkv_tier *t = c->tier;
    if ((t->flags & (PKV_TIER_NO_PUBLISH | PKV_TIER_PUBLISH_ON_HIT)) != PKV_TIER_PUBLISH_ON_HIT)
        return;
    for (uint32_t i = 0; i < n; i++) {
        pkv_block *x = &c->pool.b[blocks[i]];
        if (x->flags & BLKF_OFFERED) continue;
        /* blocks[i] is at depth i. One past the depth policy is counted once, as
         * a seal it refuses is; one the full queue refused is tried again at its
         * next hit (at most one record per block is ever queued). */
        if (t->max_depth && i >= t->max_depth) BUMP(t, dropped, 1);
        else if (!enqueue(t, blocks[i], x)) continue;
        x->flags |= BLKF_OFFERED;
    }
}

/* One prepared record for a SET. */
typedef struct pub_item {
    char key[PKV_TIER_KEY_LEN + 1];
    uint8_t *rec;
    size_t len;
} pub_item;

/* Rule T2: copy block e.b's chain tokens and payload under the cache lock if it
 * is still the block the entry names, then build its record without the lock.
 * false: gone (evicted, resealed, failed verification) or no memory. */
static bool pub_prepare(pkv_tier *t, const tier_qent *e, pub_item *it) {
    pkv_cache *c = t->c;
    const pkv_geometry *g = &c->arena.geo;
    const uint32_t bs = g->block_size;
    uint32_t *toks = NULL, *chain = NULL;
    uint8_t *payload = malloc(g->block_bytes);
    uint32_t depth = 0;
    if (!payload) return false;
    pkv_lock(c);
    const pkv_block *x = &c->pool.b[e->b];
    bool ok = x->state == BLK_SEALED && pkv_h128_eq(x->hash, e->h) && x->salt == e->salt &&
              !(x->flags & (BLKF_BAD | BLKF_UNVERIFIED));
    if (ok) {
        for (uint32_t p = x->parent; p != PKV_NONE; p = c->pool.b[p].parent) depth++;
        ok = depth < PKV_TIER_MAX_DEPTH;
    }
    if (ok) {
        toks = malloc(((size_t)depth + 1) * bs * sizeof *toks);
        chain = malloc(((size_t)depth + 1) * sizeof *chain);
        ok = toks && chain;
    }
    if (ok) {
        uint32_t i = depth + 1;
        for (uint32_t p = e->b; p != PKV_NONE; p = c->pool.b[p].parent) chain[--i] = p;
        for (uint32_t k = 0; k <= depth; k++)
            memcpy(toks + (size_t)k * bs, pkv_pool_tokens(&c->pool, chain[k]),
                   (size_t)bs * sizeof *toks);
        memcpy(payload, pkv_arena_block(&c->arena, e->b), g->block_bytes);
    }
    pkv_unlock(c);
    free(chain);
    if (!ok) {
        free(toks);
        free(payload);
        return false;
    }
    /* the cluster's chain hashes of the prefix (keyed by the shared secret) */
    pkv_h128 parent = pkv_hash_root(t->keys.seed, e->salt), h = parent;
    for (uint32_t k = 0; k <= depth; k++) {
        parent = h;
        h = pkv_hash_block(t->keys.seed, h, toks + (size_t)k * bs, bs);
    }
    pkv_tier_rec r = {g->num_layers, g->num_kv_heads, g->head_dim, bs, g->dtype, depth,
                      e->salt, parent, h, t->model, (uint32_t)strlen(t->model), NULL,
                      g->block_bytes, PKV_TIER_ENC_RAW, payload, g->block_bytes};
    uint8_t *z = NULL;
    if (t->flags & PKV_TIER_LZ4) { /* kept only if it is smaller */
        int cap = LZ4_compressBound((int)g->block_bytes);
        z = cap > 0 ? malloc((size_t)cap) : NULL;
        int zn = z ? LZ4_compress_default((const char *)payload, (char *)z,
                                          (int)g->block_bytes, cap)
                   : 0;
        if (zn > 0 && (uint64_t)zn < g->block_bytes) {
            r.encoding = PKV_TIER_ENC_LZ4;
            r.payload = z;
            r.stored_len = (uint64_t)zn;
        }
    }
    it->len = pkv_tier_rec_size(r.model_len, depth, bs, r.stored_len);
    it->rec = it->len ? malloc(it->len) : NULL;
    if (it->rec) {
        pkv_tier_encode(&t->keys, &r, toks, it->rec);
        pkv_tier_key(&t->keys, h, g, t->model, it->key);
    }
    free(z);
    free(toks);
    free(payload);
    return it->rec != NULL;
}

enum { PUB_BATCH = 16, PUB_TIMEOUT_MS = 1000 };

/* Queue the deletion of a value that failed verification (it takes val). A
 * value of a newer record version is left alone (a newer node's, during a
 * rolling upgrade): it is only rejected. */
static void del_enqueue(pkv_tier *t, const char *key, uint8_t *val, size_t len) {
    if (!pkv_tier_deletable(val, len)) {
        free(val);
        return;
    }
    pthread_mutex_lock(&t->qm);
    if (t->dn == DEL_MAX || t->dbytes + len > DEL_MAX_BYTES || t->stop) {
        pthread_mutex_unlock(&t->qm);
        free(val);
        BUMP(t, delete_failed, 1);
        return;
    }
    tier_del *d = &t->dq[t->dn++];
    memcpy(d->key, key, sizeof d->key);
    d->val = val;
    d->len = len;
    t->dbytes += len;
    pthread_cond_signal(&t->qcv);
    pthread_mutex_unlock(&t->qm);
}

/* Send the queued deletions (publisher thread, without any lock). Each is a
 * compare-and-delete: a writer that replaced the bad value meanwhile (another
 * node republishing the block) keeps its record. */
static void del_run(pkv_tier *t, tier_del *ds, uint32_t n) {
    pkv_rc_cmd cmds[DEL_MAX];
    for (uint32_t i = 0; i < n; i++)
        cmds[i] = (pkv_rc_cmd){.key = ds[i].key, .val = ds[i].val, .val_len = ds[i].len,
                               .del_if_equal = true};
    pkv_rc_stats st = {0};
    pkv_rc_run(t->pub, cmds, n, pkv_now_ns() + (uint64_t)PUB_TIMEOUT_MS * 1000000u, &st);
    BUMP(t, redirects, st.redirects);
    for (uint32_t i = 0; i < n; i++) {
        if (cmds[i].status != 0) BUMP(t, delete_failed, 1);
        else if (cmds[i].integer == 1) BUMP(t, deleted, 1);
        free(cmds[i].out);
        free(ds[i].val);
    }
}

static void *publisher(void *arg) {
    pkv_tier *t = arg;
    tier_qent batch[PUB_BATCH];
    pub_item items[PUB_BATCH];
    pkv_rc_cmd cmds[PUB_BATCH];
    tier_del dels[DEL_MAX];
    for (;;) {
        pthread_mutex_lock(&t->qm);
        while (t->qn == 0 && t->dn == 0 && !t->stop) pthread_cond_wait(&t->qcv, &t->qm);
        if (t->stop) {
            pthread_mutex_unlock(&t->qm);
            break;
        }
        uint32_t nd = t->dn;
        memcpy(dels, t->dq, nd * sizeof *dels);
        t->dn = 0;
        t->dbytes = 0;
        uint32_t n = t->qn < PUB_BATCH ? t->qn : PUB_BATCH;
        for (uint32_t i = 0; i < n; i++) batch[i] = t->q[(t->qhead + i) % t->qcap];
        t->qhead = (t->qhead + n) % t->qcap;
        t->qn -= n;
        t->busy = true;
        pthread_mutex_unlock(&t->qm);

        if (nd) del_run(t, dels, nd);
        uint32_t m = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (!pub_prepare(t, &batch[i], &items[m])) {
                BUMP(t, dropped, 1);
                continue;
            }
            cmds[m] = (pkv_rc_cmd){.key = items[m].key, .val = items[m].rec,
                                   .val_len = items[m].len, .ttl_ms = (uint64_t)t->ttl_s * 1000u};
            m++;
        }
        if (m) {
            pkv_rc_stats st = {0};
            pkv_rc_run(t->pub, cmds, m, pkv_now_ns() + (uint64_t)PUB_TIMEOUT_MS * 1000000u, &st);
            BUMP(t, redirects, st.redirects);
            for (uint32_t i = 0; i < m; i++) {
                if (cmds[i].status == 0) BUMP(t, published, 1);
                else BUMP(t, pub_errors, 1);
                free(cmds[i].out);
                free(items[i].rec);
            }
        }
        pthread_mutex_lock(&t->qm);
        t->busy = false;
        if (t->qn == 0 && t->dn == 0) pthread_cond_broadcast(&t->idle);
        pthread_mutex_unlock(&t->qm);
    }
    return NULL;
}

static void tier_free(pkv_tier *t) {
    if (!t) return;
    if (t->thr_started) {
        pthread_mutex_lock(&t->qm);
        t->stop = true;
        pthread_cond_broadcast(&t->qcv);
        pthread_mutex_unlock(&t->qm);
        pthread_join(t->thr, NULL);
    }
    for (uint32_t i = 0; i < t->dn; i++) free(t->dq[i].val);
    pkv_rc_free(t->pub);
    for (uint32_t i = 0; t->fetch && i < t->nfetch; i++) {
        pkv_rc_free(t->fetch[i].rc);
        pthread_mutex_destroy(&t->fetch[i].m);
    }
    free(t->fetch);
    free(t->q);
    pthread_mutex_destroy(&t->qm);
    pthread_cond_destroy(&t->qcv);
    pthread_cond_destroy(&t->idle);
    explicit_bzero(&t->keys, sizeof t->keys); /* secret-derived */
    free(t);
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what) {
    if (!src) {
        dst[0] = 0;
        return 0;
    }
    if (strlen(src) >= cap) return pkv_err(PKV_EINVAL, "tier %s is too long", what);
    strcpy(dst, src);
    return 0;
}

int pkv_tier_attach(pkv_cache *c, const pkv_tier_options *o) {
    if (!c || !o) return pkv_err(PKV_EINVAL, "cache or options NULL");
    if (c->remote || c->rdonly)
        return pkv_err(PKV_ERDONLY, "the tier needs a writable local cache");
    if (!o->nodes || !o->nodes[0]) return pkv_err(PKV_EINVAL, "tier nodes missing");
    if (o->flags & ~(uint32_t)(PKV_TIER_NO_PUBLISH | PKV_TIER_NO_FETCH | PKV_TIER_LZ4 |
                               PKV_TIER_LOOKUP | PKV_TIER_PUBLISH_ON_HIT))
        return pkv_err(PKV_EINVAL, "unknown tier flags 0x%x", o->flags);
    if (!o->secret || o->secret_len < 16 || o->secret_len > 256)
        return pkv_err(PKV_EINVAL, "tier secret must be 16..256 bytes (got %zu)",
                       o->secret ? o->secret_len : 0);
    pkv_tier *t = calloc(1, sizeof *t);
    if (!t) return pkv_err(PKV_ENOMEM, "tier");
    pthread_mutex_init(&t->qm, NULL);
    pthread_cond_init(&t->qcv, NULL);
    pthread_cond_init(&t->idle, NULL);
    int rc;
    if ((rc = copy_str(t->conf.nodes, sizeof t->conf.nodes, o->nodes, "node list")) ||
        (rc = copy_str(t->conf.user, sizeof t->conf.user, o->user, "user")) ||
        (rc = copy_str(t->conf.password, sizeof t->conf.password, o->password, "password"))) {
        tier_free(t);
        return rc;
    }
    t->c = c;
    pkv_tier_keys_derive(&t->keys, o->secret, o->secret_len);
    t->conf.connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 100;
    t->deadline_ms = o->fetch_deadline_ms ? o->fetch_deadline_ms : 20;
    t->max_blocks = o->fetch_max_blocks ? o->fetch_max_blocks : 256;
    t->max_depth = o->publish_max_depth;
    t->ttl_s = o->ttl_s ? o->ttl_s : 86400;
    t->flags = o->flags;
    t->qcap = o->queue_blocks ? o->queue_blocks : 1024;
    t->nfetch = o->max_inflight ? o->max_inflight : 4;
    memcpy(t->model, c->arena.model_id, sizeof t->model);
    t->q = calloc(t->qcap, sizeof *t->q);
    t->fetch = calloc(t->nfetch, sizeof *t->fetch);
    if (!t->q || !t->fetch) {
        tier_free(t);
        return pkv_err(PKV_ENOMEM, "tier queue of %u", t->qcap);
    }
    if (!(t->pub = pkv_rc_new(&t->conf, &rc))) {
        tier_free(t);
        return rc;
    }
    for (uint32_t i = 0; i < t->nfetch; i++) {
        pthread_mutex_init(&t->fetch[i].m, NULL);
        if (!(t->fetch[i].rc = pkv_rc_new(&t->conf, &rc))) {
            t->nfetch = i + 1;
            tier_free(t);
            return rc;
        }
    }
    /* read the slot map now, so the first fetch does not pay for it */
    pkv_rc_cmd probe = {.key = "pkv:probe"};
    pkv_rc_run(t->fetch[0].rc, &probe, 1,
               pkv_now_ns() + (uint64_t)t->conf.connect_timeout_ms * 1000000u, NULL);
    free(probe.out);
    pkv_lock(c);
    if (c->tier) {
        pkv_unlock(c);
        tier_free(t);
        return pkv_err(PKV_EEXIST, "a tier is already attached");
    }
    if (pthread_create(&t->thr, NULL, publisher, t) != 0) {
        pkv_unlock(c);
        tier_free(t);
        return pkv_err(PKV_ENOMEM, "tier publishing thread");
    }
    t->thr_started = true;
    /* offers made to an earlier tier (another cluster, perhaps) do not count */
    for (uint32_t b = 0; b < c->pool.capacity; b++) c->pool.b[b].flags &= (uint8_t)~BLKF_OFFERED;
    c->tier = t;
    pkv_unlock(c);
    return 0;
}

int pkv_tier_flush(pkv_cache *c, uint32_t timeout_ms) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    pkv_lock(c);
    pkv_tier *t = c->tier;
    pkv_unlock(c);
    if (!t) return pkv_err(PKV_ESTATE, "no tier attached");
    struct timespec abs;
    clock_gettime(CLOCK_REALTIME, &abs);
    uint64_t ns = (uint64_t)abs.tv_nsec + (uint64_t)timeout_ms * 1000000u;
    abs.tv_sec += (time_t)(ns / 1000000000u);
    abs.tv_nsec = (long)(ns % 1000000000u);
    int rc = 0;
    pthread_mutex_lock(&t->qm);
    while ((t->qn || t->dn || t->busy) && rc == 0)
        rc = pthread_cond_timedwait(&t->idle, &t->qm, &abs);
    bool idle = !t->qn && !t->dn && !t->busy;
    pthread_mutex_unlock(&t->qm);
    return idle ? 0 : pkv_err(PKV_EBUSY, "tier publishing still busy after %u ms", timeout_ms);
}

void pkv_tier_detach(pkv_cache *c) {
    if (!c || c->remote) return;
    pkv_lock(c);
    pkv_tier *t = c->tier;
    c->tier = NULL;
    pkv_unlock(c);
    tier_free(t); /* joins the publisher, which takes the cache lock */
}

void pkv_tier_stats(const pkv_cache *c, pkv_stats *out) {
    const pkv_tier *t = c->tier;
    if (!t) return;
    out->tier_published = READ(t, published);
    out->tier_publish_dropped = READ(t, dropped);
    out->tier_publish_errors = READ(t, pub_errors);
    out->tier_fetches = READ(t, fetches);
    out->tier_fetch_blocks = READ(t, fetch_blocks);
    out->tier_fetch_found = READ(t, found);
    out->tier_imported = READ(t, imported);
    out->tier_rejected = READ(t, rejected);
    out->tier_errors = READ(t, errors);
    out->tier_deadline_misses = READ(t, deadline_misses);
    out->tier_redirects = READ(t, redirects);
    out->tier_deleted = READ(t, deleted);
    out->tier_delete_failed = READ(t, delete_failed);
    out->tier_lookups = READ(t, lookups);
    out->tier_lookup_blocks = READ(t, lookup_blocks);
    out->tier_lookup_found = READ(t, lookup_found);
}

void pkv_tier_got_free(pkv_tier_got *g) {
    for (uint32_t i = 0; i < g->n; i++) free(g->bufs[i]);
    free(g->bufs);
    free(g->payloads);
    memset(g, 0, sizeof *g);
}

void pkv_tier_count_imported(pkv_cache *c, uint64_t n) {
    if (c->tier) BUMP(c->tier, imported, n);
}

void pkv_tier_importing(pkv_cache *c, bool on) {
    if (c->tier) c->tier->importing = on;
}

/* A free fetch client, locked, or NULL when max_inflight fetches run. */
/* A free fetch connection from index `from` on. Lookups' probes start at 1 (when
 * there are two or more), so frequent lookups never leave an open without one. */
static tier_fetcher *fetcher_take(pkv_tier *t, uint32_t from) {
    for (uint32_t i = from < t->nfetch ? from : 0; i < t->nfetch; i++)
        if (pthread_mutex_trylock(&t->fetch[i].m) == 0) return &t->fetch[i];
    return NULL;
}

/* The cluster chain hash of prompt blocks [0, hit) (keyed by the shared secret). */
static pkv_h128 chain_to(const pkv_tier *t, uint64_t salt, const uint32_t *prompt, uint64_t hit,
                         uint32_t bs) {
    pkv_h128 h = pkv_hash_root(t->keys.seed, salt);
    for (uint64_t i = 0; i < hit; i++) h = pkv_hash_block(t->keys.seed, h, prompt + i * bs, bs);
    return h;
}

bool pkv_tier_lookup_on(const pkv_cache *c) {
    const pkv_tier *t = c->tier;
    return t && (t->flags & (PKV_TIER_LOOKUP | PKV_TIER_NO_FETCH)) == PKV_TIER_LOOKUP;
}

/* pkv_prefix_lookup's question to the tier (docs/remote.md, "Lookup"). EXISTS,
 * not GET: a lookup imports nothing, so reading and verifying whole records
 * (up to fetch_max_blocks of them, megabytes each) would be paid twice, here
 * and by the open; an existing key is only a promise, which a value failing
 * rule T1 or expiring before the open breaks by shortening that open's attach
 * (the open verifies everything it imports). Touches only the tier's counters
 * and its fetch client: the cache is neither locked nor read beyond its
 * immutable geometry. */
uint64_t pkv_tier_probe(pkv_cache *c, uint64_t salt, const uint32_t *prompt, uint64_t hit,
                        uint64_t maxb) {
    pkv_tier *t = c->tier; /* attach and detach never run beside another call */
    if (!t || hit >= maxb) return 0;
    tier_fetcher *f = fetcher_take(t, 1);
    if (!f) return 0; /* max_inflight fetches running: answer from the local hit */
    uint64_t deadline = pkv_now_ns() + (uint64_t)t->deadline_ms * 1000000u;
    const uint32_t bs = c->pool.block_size;
    uint64_t k = maxb - hit < t->max_blocks ? maxb - hit : t->max_blocks, run = 0;
    pkv_rc_cmd *cmds = calloc(k, sizeof *cmds);
    char(*keys)[PKV_TIER_KEY_LEN + 1] = calloc(k, sizeof *keys);
    if (!cmds || !keys) goto out;
    pkv_h128 h = chain_to(t, salt, prompt, hit, bs);
    for (uint64_t j = 0; j < k; j++) {
        h = pkv_hash_block(t->keys.seed, h, prompt + (hit + j) * bs, bs);
        pkv_tier_key(&t->keys, h, &c->arena.geo, t->model, keys[j]);
        cmds[j].key = keys[j];
        cmds[j].exists = true;
    }
    BUMP(t, lookups, 1);
    BUMP(t, lookup_blocks, k);
    pkv_rc_stats st = {0};
    pkv_rc_run(f->rc, cmds, k, deadline, &st);
    BUMP(t, redirects, st.redirects);
    if (pkv_now_ns() >= deadline) BUMP(t, deadline_misses, 1);
    bool in_run = true;
    for (uint64_t j = 0; j < k; j++) {
        if (cmds[j].status < 0) BUMP(t, errors, 1);
        bool yes = cmds[j].status == 0 && cmds[j].integer == 1;
        if (yes) BUMP(t, lookup_found, 1);
        in_run = in_run && yes;
        if (in_run) run++;
    }
out:
    /* rc_run takes no value for an EXISTS; freed all the same, as the fetch does */
    for (uint64_t j = 0; cmds && j < k; j++) free(cmds[j].out);
    free(cmds);
    free(keys);
    pthread_mutex_unlock(&f->m);
    return run;
}

/* Rule T1, first half: fetch the records of the prompt's blocks [hit, ...) that
 * miss locally now, and keep the verified run that continues the local hit. */
void pkv_tier_fetch(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                    pkv_tier_got *got) {
    memset(got, 0, sizeof *got);
    pkv_lock(c);
    pkv_tier *t = c->tier;
    const uint32_t bs = c->pool.block_size;
    uint64_t maxb = n ? (n - 1) / bs : 0;
    if (maxb > c->pool.capacity) maxb = c->pool.capacity;
    uint32_t hit = 0;
    if (t && !(t->flags & PKV_TIER_NO_FETCH) && maxb)
        hit = pkv_prefix_match(c, salt, prompt, maxb, NULL, true);
    pkv_unlock(c);
    if (!t || (t->flags & PKV_TIER_NO_FETCH) || hit >= maxb) return;
    tier_fetcher *f = fetcher_take(t, 0);
    if (!f) return; /* max_inflight fetches running: compute instead */
    uint64_t deadline = pkv_now_ns() + (uint64_t)t->deadline_ms * 1000000u;
    uint64_t k = maxb - hit < t->max_blocks ? maxb - hit : t->max_blocks;
    pkv_rc_cmd *cmds = calloc(k, sizeof *cmds);
    char(*keys)[PKV_TIER_KEY_LEN + 1] = calloc(k, sizeof *keys);
    pkv_h128 *hs = calloc(k + 1, sizeof *hs);
    got->bufs = calloc(k, sizeof *got->bufs);
    got->payloads = calloc(k, sizeof *got->payloads);
    if (!cmds || !keys || !hs || !got->bufs || !got->payloads) goto out;
    /* the cluster chain hashes of blocks [0, hit + k): hs[j] is block hit + j - 1's */
    hs[0] = chain_to(t, salt, prompt, hit, bs);
    for (uint64_t j = 0; j < k; j++) {
        hs[j + 1] = pkv_hash_block(t->keys.seed, hs[j], prompt + (hit + j) * bs, bs);
        pkv_tier_key(&t->keys, hs[j + 1], &c->arena.geo, t->model, keys[j]);
        cmds[j].key = keys[j];
    }
    BUMP(t, fetches, 1);
    BUMP(t, fetch_blocks, k);
    pkv_rc_stats st = {0};
    pkv_rc_run(f->rc, cmds, k, deadline, &st);
    BUMP(t, redirects, st.redirects);
    if (pkv_now_ns() >= deadline) BUMP(t, deadline_misses, 1);
    bool run = true;
    for (uint64_t j = 0; j < k; j++) {
        if (cmds[j].status < 0) {
            BUMP(t, errors, 1);
            run = false;
            continue;
        }
        if (!cmds[j].out) {
            run = false;
            continue;
        }
        BUMP(t, found, 1);
        pkv_tier_rec r;
        pkv_tier_want w = {&c->arena.geo, t->model, salt, (uint32_t)(hit + j), hs[j],
                           hs[j + 1], prompt};
        uint8_t *kv = NULL;
        bool ok = pkv_tier_decode(&t->keys, cmds[j].out, cmds[j].out_len, &r) == 0 &&
                  pkv_tier_verify(&r, &w) == 0;
        /* An LZ4 record is unpacked even after a break in the run, where it is
         * not imported: a bad stream is then counted and deleted by the first
         * reader that fetched it, not left for one whose run reaches it. */
        if (ok && r.encoding != PKV_TIER_ENC_RAW) {
            kv = malloc(r.payload_len);
            if (!kv) { /* not the record's fault: computed instead */
                run = false;
                continue;
            }
            ok = pkv_tier_unpack(&r, kv) == 0;
        }
        if (!ok) { /* counted, never imported, deleted if still the same bytes */
            BUMP(t, rejected, 1);
            free(kv);
            run = false;
            del_enqueue(t, keys[j], cmds[j].out, cmds[j].out_len);
            cmds[j].out = NULL;
            continue;
        }
        if (!run) {
            free(kv);
            continue;
        }
        if (kv) {
            free(cmds[j].out);
            got->bufs[got->n] = kv;
            got->payloads[got->n] = kv;
        } else {
            got->bufs[got->n] = cmds[j].out;
            got->payloads[got->n] = r.payload;
        }
        cmds[j].out = NULL;
        got->n++;
    }
    got->first = hit;
out:
    if (cmds)
        for (uint64_t j = 0; j < k; j++) free(cmds[j].out);
    free(cmds);
    free(keys);
    free(hs);
    pthread_mutex_unlock(&f->m);
    if (!got->n) pkv_tier_got_free(got);
}

#else /* !PKV_WITH_HIREDIS */

int pkv_tier_attach(pkv_cache *c, const pkv_tier_options *o) {
    (void)c;
    (void)o;
    return pkv_err(PKV_ENOTSUP, "built without hiredis (meson option remote_tier)");
}
int pkv_tier_flush(pkv_cache *c, uint32_t timeout_ms) {
    (void)c;
    (void)timeout_ms;
    return pkv_err(PKV_ENOTSUP, "built without hiredis (meson option remote_tier)");
}
void pkv_tier_detach(pkv_cache *c) { (void)c; }
void pkv_tier_on_seal(pkv_cache *c, uint32_t b, uint32_t depth) {
    (void)c;
    (void)b;
    (void)depth;
}
void pkv_tier_on_hit(pkv_cache *c, const uint32_t *blocks, uint32_t n) {
    (void)c;
    (void)blocks;
    (void)n;
}
bool pkv_tier_lookup_on(const pkv_cache *c) {
    (void)c;
    return false;
}
uint64_t pkv_tier_probe(pkv_cache *c, uint64_t salt, const uint32_t *prompt, uint64_t hit,
                        uint64_t maxb) {
    (void)c;
    (void)salt;
    (void)prompt;
    (void)hit;
    (void)maxb;
    return 0;
}
void pkv_tier_stats(const pkv_cache *c, pkv_stats *out) {
    (void)c;
    (void)out;
}
void pkv_tier_got_free(pkv_tier_got *g) { (void)g; }
void pkv_tier_count_imported(pkv_cache *c, uint64_t n) {
    (void)c;
    (void)n;
}
void pkv_tier_importing(pkv_cache *c, bool on) {
    (void)c;
    (void)on;
}
void pkv_tier_fetch(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                    pkv_tier_got *got) {
    (void)c;
    (void)salt;
    (void)prompt;
    (void)n;
    memset(got, 0, sizeof *got);
}

#endif

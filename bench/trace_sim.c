/*
 * trace_sim.c — block-level simulator of the engine's cache accounting with
 * pluggable eviction policies (see trace_sim.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "trace_sim.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NONE UINT32_MAX
#define NLEVELS 4

static const char *const policy_names[SIM_NPOLICIES] = {
    [SIM_LEAF_LRU] = "leaf-lru",
    [SIM_LRU] = "lru",
    [SIM_BELADY] = "belady",
    [SIM_LEAF_SLRU] = "leaf-slru",
    [SIM_LEAF_MQ] = "leaf-mq",
};

const char *sim_policy_name(sim_policy p) {
    return (unsigned)p < SIM_NPOLICIES ? policy_names[p] : "?";
}

int sim_policy_parse(const char *name) {
    for (int i = 0; i < SIM_NPOLICIES; i++)
        if (strcmp(name, policy_names[i]) == 0) return i;
    return -1;
}

enum { S_FREE = 0, S_OPEN = 1, S_SEALED = 2 };

/* One physical block. */
typedef struct sblk {
    uint32_t node;    /* content id (sealed) */
    uint32_t parent;  /* physical parent at seal time, NONE for a first block */
    uint32_t serial;  /* unique per seal (0: not sealed) */
    uint32_t pserial; /* the parent's serial at seal time (0: first block) */
    uint32_t ref, nchild;
    uint32_t prev, next; /* list links */
    uint32_t hpos;       /* position in the Belady heap */
    uint32_t key;        /* Belady: next use (request index, TRACE_NEVER) */
    uint32_t depth;      /* table index */
    uint8_t state, list, cnt, pad; /* cnt: reuses while cached (saturating) */
} sblk;

typedef struct hent {
    uint64_t key; /* next use << 32 | depth */
    uint32_t x;
} hent;

typedef struct slist {
    uint32_t head, tail;
    uint64_t count;
} slist;

typedef struct sim {
    const trace *t;
    const trace_blocks *tb;
    sim_params p;
    sim_result *res;
    sblk *b;
    uint32_t cap;
    uint32_t *freestk;
    uint32_t nfree;
    uint32_t *cur;    /* content id -> the block indexed for it, NONE */
    uint64_t ncontent;
    uint64_t next_unique; /* content ids of output blocks */
    uint64_t *ghost;  /* content id -> (evictions at its eviction + 1) << 8 | cnt */
    uint64_t ghost_window;
    slist l[NLEVELS]; /* lru lists, or the levels of a segmented policy */
    uint64_t nprot;   /* cached blocks on levels >= 1 */
    uint64_t protect_max;
    hent *heap;
    uint32_t hn;
    uint64_t evictable;
    uint32_t serial;
    uint32_t *tbl;    /* block table of the running request */
} sim;

/* ---- Lists ------------------------------------------------------------------ */

static void list_push_tail(sim *s, int li, uint32_t x) {
    slist *l = &s->l[li];
    sblk *bx = &s->b[x];
    bx->list = (uint8_t)(li + 1);
    bx->next = NONE;
    bx->prev = l->tail;
    if (l->tail != NONE) s->b[l->tail].next = x;
    else l->head = x;
    l->tail = x;
    l->count++;
}

static void list_remove(sim *s, uint32_t x) {
    sblk *bx = &s->b[x];
    slist *l = &s->l[bx->list - 1];
    if (bx->prev != NONE) s->b[bx->prev].next = bx->next;
    else l->head = bx->next;
    if (bx->next != NONE) s->b[bx->next].prev = bx->prev;
    else l->tail = bx->prev;
    bx->prev = bx->next = NONE;
    bx->list = 0;
    l->count--;
}

/* ---- Belady heap: max on (next use, depth) ----------------------------------- */

/* Entries carry their key, so sifting reads only the heap array. */
static inline uint64_t bkey(const sblk *b) { return (uint64_t)b->key << 32 | b->depth; }

static inline void heap_set(sim *s, uint32_t i, hent e) {
    s->heap[i] = e;
    s->b[e.x].hpos = i;
}

static void heap_up(sim *s, uint32_t i) {
    hent e = s->heap[i];
    while (i > 0) {
        uint32_t pi = (i - 1) / 2;
        if (s->heap[pi].key >= e.key) break;
        heap_set(s, i, s->heap[pi]);
        i = pi;
    }
    heap_set(s, i, e);
}

static void heap_down(sim *s, uint32_t i) {
    hent e = s->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= s->hn) break;
        if (c + 1 < s->hn && s->heap[c + 1].key > s->heap[c].key) c++;
        if (s->heap[c].key <= e.key) break;
        heap_set(s, i, s->heap[c]);
        i = c;
    }
    heap_set(s, i, e);
}

static void heap_push(sim *s, uint32_t x) {
    hent e = {bkey(&s->b[x]), x};
    heap_set(s, s->hn++, e);
    heap_up(s, s->hn - 1);
}

static void heap_remove(sim *s, uint32_t x) {
    uint32_t i = s->b[x].hpos;
    hent last = s->heap[--s->hn];
    s->b[x].hpos = NONE;
    if (i == s->hn) return;
    heap_set(s, i, last);
    heap_up(s, i);
    heap_down(s, s->b[last.x].hpos);
}

/* ---- Policy hooks -------------------------------------------------------------- */

/* Segmented policies: level of a block from its reuse count. */
static inline int level_of(const sim *s, uint32_t cnt) {
    if (s->p.policy == SIM_LEAF_MQ) return cnt == 0 ? 0 : cnt == 1 ? 1 : cnt < 4 ? 2 : 3;
    return cnt ? 1 : 0;
}

/* The reuse count a block demoted to level `lv` gets. */
static inline uint8_t level_floor(int lv) { return (uint8_t)(lv == 0 ? 0 : lv == 1 ? 1 : 2); }

static bool segmented(const sim *s) {
    return s->p.policy == SIM_LEAF_SLRU || s->p.policy == SIM_LEAF_MQ;
}

/* x (sealed) just lost its last reference. */
static void pol_insert(sim *s, uint32_t x) {
    s->evictable++;
    if (s->p.policy == SIM_BELADY) {
        heap_push(s, x);
        return;
    }
    if (!segmented(s)) {
        list_push_tail(s, 0, x);
        return;
    }
    int lv = level_of(s, s->b[x].cnt);
    list_push_tail(s, lv, x);
    if (lv == 0) return;
    s->nprot++;
    /* Over quota: demote the head of the lowest protected level by one level. It
     * has no cached children on its level (they precede it) nor above (levels
     * never increase towards the leaves), so the order stays leaf-first. */
    while (s->nprot > s->protect_max) {
        int k = 1;
        while (s->l[k].head == NONE) k++;
        uint32_t h = s->l[k].head;
        list_remove(s, h);
        s->b[h].cnt = level_floor(k - 1);
        list_push_tail(s, k - 1, h);
        if (k == 1) s->nprot--;
    }
}

/* x (cached) is referenced again. */
static void pol_remove(sim *s, uint32_t x) {
    s->evictable--;
    sblk *bx = &s->b[x];
    if (s->p.policy == SIM_BELADY) {
        heap_remove(s, x);
    } else {
        if (segmented(s) && bx->list > 1) s->nprot--;
        list_remove(s, x);
    }
    if (bx->cnt < 255) bx->cnt++;
}

static uint32_t pol_victim(sim *s) {
    uint32_t x;
    if (s->p.policy == SIM_BELADY) {
        x = s->heap[0].x;
        heap_remove(s, x);
    } else {
        int k = 0;
        while (s->l[k].head == NONE) k++;
        x = s->l[k].head;
        if (k > 0) s->nprot--;
        list_remove(s, x);
    }
    s->evictable--;
    return x;
}

/* ---- Blocks ------------------------------------------------------------------ */

/* Is sealed block x reachable, i.e. still the chain child of a live parent? */
static inline bool live(const sim *s, uint32_t x) {
    const sblk *bx = &s->b[x];
    if (s->cur[bx->node] != x) return false;
    if (bx->parent == NONE) return true;
    return s->b[bx->parent].serial == bx->pserial;
}

static void evict_one(sim *s) {
    uint32_t x = pol_victim(s);
    sblk *bx = &s->b[x];
    sim_result *r = s->res;
    if (!live(s, x)) r->dead_evicted++;
    if (bx->nchild > 0) r->strands++;
    if (s->cur[bx->node] == x) s->cur[bx->node] = NONE;
    if (bx->parent != NONE && s->b[bx->parent].serial == bx->pserial)
        s->b[bx->parent].nchild--;
    if (s->ghost) s->ghost[bx->node] = (r->evictions + 1) << 8 | bx->cnt;
    r->evictions++;
    bx->state = S_FREE;
    bx->serial = 0;
    bx->nchild = 0;
    s->freestk[s->nfree++] = x;
}

static uint32_t alloc_block(sim *s) {
    if (s->nfree == 0) evict_one(s);
    uint32_t x = s->freestk[--s->nfree];
    sblk *bx = &s->b[x];
    bx->state = S_OPEN;
    bx->ref = 1;
    bx->cnt = 0;
    bx->parent = NONE;
    return x;
}

static void acquire(sim *s, uint32_t x) {
    if (s->b[x].ref++ == 0) pol_remove(s, x);
}

static void release(sim *s, uint32_t x, uint32_t key) {
    sblk *bx = &s->b[x];
    if (--bx->ref > 0) return;
    if (bx->state == S_SEALED) {
        bx->key = key;
        pol_insert(s, x);
    } else {
        bx->state = S_FREE;
        s->freestk[s->nfree++] = x;
    }
}

/* The cached block holding content `node` as the chain child of `parent`. */
static inline uint32_t lookup(const sim *s, uint64_t node, uint32_t parent) {
    uint32_t x = s->cur[node];
    if (x == NONE) return NONE;
    const sblk *bx = &s->b[x];
    if (bx->parent != parent) return NONE;
    if (parent != NONE && s->b[parent].serial != bx->pserial) return NONE;
    return x;
}

/* ---- Replay ------------------------------------------------------------------- */

static void seal(sim *s, size_t r, uint64_t i, uint64_t nfull) {
    uint32_t x = s->tbl[i];
    uint32_t parent = i ? s->tbl[i - 1] : NONE;
    uint64_t node = i < nfull ? trace_pnode(s->t, s->tb, r, i) : s->next_unique++;
    uint32_t e = lookup(s, node, parent);
    if (e != NONE) {
        acquire(s, e);
        s->tbl[i] = e;
        release(s, x, 0);
        s->res->dedupes++;
        return;
    }
    sblk *bx = &s->b[x];
    bx->state = S_SEALED;
    bx->node = (uint32_t)node;
    bx->parent = parent;
    bx->serial = ++s->serial;
    bx->pserial = parent != NONE ? s->b[parent].serial : 0;
    bx->nchild = 0;
    bx->depth = (uint32_t)i;
    /* Sealed again soon after its eviction: a reuse the cache was too small for;
     * count it as one. */
    uint64_t g = s->ghost ? s->ghost[node] : 0;
    if (g && s->res->evictions + 1 - (g >> 8) <= s->ghost_window)
        bx->cnt = (uint8_t)((g & 255) < 255 ? (g & 255) + 1 : 255);
    s->cur[node] = x;
    if (parent != NONE) s->b[parent].nchild++;
    s->res->seals++;
}

/* Append k tokens (len -> len + k) and commit them. false: not enough blocks. */
static bool step(sim *s, size_t r, uint64_t *len, uint64_t *nb, uint64_t k, uint64_t nfull) {
    uint32_t bs = s->tb->bs;
    uint64_t total = (*len + k + bs - 1) / bs;
    uint64_t need = total - *nb;
    if (need > s->nfree + s->evictable) return false;
    for (uint64_t j = 0; j < need; j++) s->tbl[(*nb)++] = alloc_block(s);
    uint64_t first = *len / bs, full = (*len + k) / bs;
    for (uint64_t i = first; i < full; i++) seal(s, r, i, nfull);
    *len += k;
    return true;
}

static int run(sim *s) {
    const trace *t = s->t;
    const trace_blocks *tb = s->tb;
    const uint32_t bs = tb->bs;
    sim_result *res = s->res;
    size_t n = s->p.limit && s->p.limit < t->n ? s->p.limit : t->n;
    uint64_t batch = s->p.batch ? s->p.batch : 8192;
    bool head_first = s->p.policy == SIM_LRU;
    for (size_t r = 0; r < n; r++) {
        const trace_req *q = &t->req[r];
        uint64_t nin = q->in_len, nout = q->out_len;
        uint64_t maxb = nin ? (nin - 1) / bs : 0, nfull = nin / bs;
        if (maxb > s->cap) maxb = s->cap;
        /* open: attach the longest cached chain */
        uint64_t h = 0;
        uint32_t parent = NONE;
        for (; h < maxb; h++) {
            uint32_t x = lookup(s, trace_pnode(t, tb, r, h), parent);
            if (x == NONE) break;
            acquire(s, x);
            s->tbl[h] = parent = x;
        }
        res->hit_blocks += h;
        res->miss_blocks += maxb - h;
        res->hit_tokens += h * bs;
        res->miss_tokens += nin - h * bs;
        uint64_t len = h * bs, nb = h;
        bool ok = true;
        for (uint64_t pos = len; ok && pos < nin; pos += batch)
            ok = step(s, r, &len, &nb, nin - pos < batch ? nin - pos : batch, nfull);
        for (uint64_t pos = 0; ok && pos < nout; pos += batch)
            ok = step(s, r, &len, &nb, nout - pos < batch ? nout - pos : batch, nfull);
        /* close */
        const uint32_t *nu = tb->nu + tb->off[r];
        if (head_first) {
            for (uint64_t i = 0; i < nb; i++) release(s, s->tbl[i], i < nfull ? nu[i] : TRACE_NEVER);
        } else {
            /* A parent is counted at least as often as its children (every
             * reuse of a child reuses it): keeps segment levels leaf-first. */
            uint8_t cnt = 0;
            for (uint64_t i = nb; i-- > 0;) {
                sblk *bx = &s->b[s->tbl[i]];
                if (bx->state == S_SEALED) {
                    if (bx->cnt < cnt) bx->cnt = cnt;
                    cnt = bx->cnt;
                }
                release(s, s->tbl[i], i < nfull ? nu[i] : TRACE_NEVER);
            }
        }
        if (!ok) {
            res->failed_request = (int64_t)r;
            return -1;
        }
        res->requests++;
    }
    return 0;
}

int sim_run(const trace *t, const trace_blocks *tb, const sim_params *p, sim_result *out) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memset(out, 0, sizeof *out);
    out->failed_request = -1;
    if (p->capacity == 0 || p->capacity >= UINT32_MAX) return -1;
    sim s;
    memset(&s, 0, sizeof s);
    s.t = t;
    s.tb = tb;
    s.p = *p;
    s.res = out;
    s.cap = (uint32_t)p->capacity;
    s.ncontent = tb->prompt_ids + tb->unique_blocks;
    s.next_unique = tb->prompt_ids;
    double prot = p->protect > 0 ? p->protect : 0.5;
    s.protect_max = p->protect_blocks ? p->protect_blocks : (uint64_t)(prot * (double)s.cap);
    s.ghost_window = (uint64_t)(p->ghost * (double)s.cap);
    for (int k = 0; k < NLEVELS; k++) s.l[k].head = s.l[k].tail = NONE;
    s.b = calloc(s.cap, sizeof *s.b);
    s.freestk = malloc(s.cap * sizeof *s.freestk);
    s.cur = malloc((s.ncontent ? s.ncontent : 1) * sizeof *s.cur);
    s.tbl = malloc((tb->max_req_blocks + 1) * sizeof *s.tbl);
    if (p->policy == SIM_BELADY) s.heap = malloc(s.cap * sizeof *s.heap);
    if (segmented(&s) && p->ghost > 0) s.ghost = calloc(s.ncontent ? s.ncontent : 1, sizeof *s.ghost);
    int rc = -1;
    if (!s.b || !s.freestk || !s.cur || !s.tbl || (p->policy == SIM_BELADY && !s.heap) ||
        (segmented(&s) && p->ghost > 0 && !s.ghost))
        goto out;
    for (uint64_t i = 0; i < s.ncontent; i++) s.cur[i] = NONE;
    for (uint32_t i = 0; i < s.cap; i++) {
        s.b[i].prev = s.b[i].next = s.b[i].hpos = NONE;
        s.b[i].parent = NONE;
        s.freestk[i] = s.cap - 1 - i;
    }
    s.nfree = s.cap;
    rc = run(&s);
out:
    free(s.b);
    free(s.freestk);
    free(s.cur);
    free(s.tbl);
    free(s.heap);
    free(s.ghost);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return rc;
}

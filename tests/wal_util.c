#include "wal_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool wu_in_child;
jmp_buf *wu_catch;
char wu_caught[2048];

void wu_fail_at(const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (wu_catch) {
        jmp_buf *j = wu_catch;
        wu_catch = NULL;
        int k = snprintf(wu_caught, sizeof wu_caught, "%s:%d: ", file, line);
        if (k < 0 || (size_t)k >= sizeof wu_caught) k = 0;
        snprintf(wu_caught + k, sizeof wu_caught - (size_t)k, "%.1900s", msg);
        longjmp(*j, 1);
    }
    if (wu_in_child) {
        fprintf(stderr, "%s%s:%d: (child %d) %s\n", pt_ctx, file, line, (int)getpid(), msg);
        fflush(stderr);
        _exit(3);
    }
    cr_assert_fail("%s%s:%d: %s", pt_ctx, file, line, msg);
    abort(); /* not reached */
}

void wu_check_at(const char *file, int line, pkv_cache *c, const char *what)
{
    char why[512] = "";
    int r = pkv_check(c, why, sizeof why);
    if (r) wu_fail_at(file, line, "%s: pkv_check -> %d (%s): %s", what, r, pkv_strerror(r), why);
}

static void *wu_xalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) WU_FAIL("out of memory (%zu bytes)", n);
    return p;
}

static void *wu_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) WU_FAIL("out of memory (%zu bytes)", n);
    return q;
}

/* ---- Options ------------------------------------------------------------------ */

void wu_opts(pkv_options *o, uint32_t bs, uint64_t cap, pkv_durability mode)
{
    pkv_options_init(o);
    o->num_layers = PT_LAYERS;
    o->num_kv_heads = PT_HEADS;
    o->head_dim = PT_HDIM;
    o->block_size = bs;
    o->dtype = PKV_F32;
    o->capacity = cap;
    o->model_id = PT_MODEL;
    o->durability = mode;
    o->eviction = pt_eviction();
}

int wu_open(const char *dir, const pkv_options *o, pkv_cache **out)
{
    *out = NULL;
    return pkv_open(dir, o, out);
}

pkv_cache *wu_open_ok(const char *dir, const pkv_options *o)
{
    pkv_cache *c = NULL;
    int r = pkv_open(dir, o, &c);
    if (r || !c) WU_FAIL("pkv_open(%s, flags 0x%x) -> %d (%s: %s)", dir, o->flags, r,
                         pkv_strerror(r), pkv_last_error());
    WU_CHECK(c, "after open");
    return c;
}

/* ---- Model ---------------------------------------------------------------------- */

wu_seq *wu_model_find(const wu_model *m, uint64_t id)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->s[i].id == id) return &m->s[i];
    return NULL;
}

void wu_seq_reserve(wu_seq *s, size_t n)
{
    if (n <= s->cap) return;
    size_t cap = s->cap ? s->cap : 16;
    while (cap < n) cap *= 2;
    s->tok = wu_xrealloc(s->tok, cap * sizeof *s->tok);
    s->cap = cap;
}

wu_seq *wu_model_add(wu_model *m, uint64_t id, uint64_t salt, const uint32_t *tok,
                     size_t len, size_t committed)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 8;
        m->s = wu_xrealloc(m->s, m->cap * sizeof *m->s);
    }
    wu_seq *s = &m->s[m->n++];
    memset(s, 0, sizeof *s);
    s->id = id;
    s->salt = salt;
    wu_seq_reserve(s, len + 1);
    if (len) memcpy(s->tok, tok, len * sizeof *tok);
    s->len = len;
    s->committed = committed;
    return s;
}

void wu_model_remove(wu_model *m, uint64_t id)
{
    for (size_t i = 0; i < m->n; i++) {
        if (m->s[i].id != id) continue;
        free(m->s[i].tok);
        m->s[i] = m->s[--m->n];
        return;
    }
}

void wu_model_copy(wu_model *dst, const wu_model *src)
{
    memset(dst, 0, sizeof *dst);
    for (size_t i = 0; i < src->n; i++) {
        const wu_seq *s = &src->s[i];
        wu_model_add(dst, s->id, s->salt, s->tok, s->len, s->committed);
    }
}

void wu_model_free(wu_model *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->s[i].tok);
    free(m->s);
    memset(m, 0, sizeof *m);
}

void wu_model_drop_pending(wu_model *m)
{
    for (size_t i = 0; i < m->n; i++) m->s[i].len = m->s[i].committed;
}

static int cmp_seq(const void *a, const void *b)
{
    const wu_seq *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

void wu_model_sort(wu_model *m)
{
    if (m->n) qsort(m->s, m->n, sizeof *m->s, cmp_seq);
}

static uint64_t *wu_ids(pkv_cache *c, size_t *n)
{
    size_t k = 0;
    int r = pkv_seq_list(c, NULL, 0, &k);
    WU_ASSERT(r == 0 || r == PKV_ERANGE, "pkv_seq_list(NULL, 0) -> %d", r);
    if (k == 0) WU_ASSERT(r == 0, "pkv_seq_list with no sequences -> %d", r);
    uint64_t *ids = wu_xalloc((k + 1) * sizeof *ids);
    size_t k2 = 0;
    WU_OK(pkv_seq_list(c, ids, k + 1, &k2));
    WU_ASSERT(k2 == k, "pkv_seq_list count changed %zu -> %zu", k, k2);
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < i; j++)
            WU_ASSERT(ids[i] != ids[j], "pkv_seq_list names %llu twice",
                      (unsigned long long)ids[i]);
    *n = k;
    return ids;
}

void wu_model_read(wu_model *m, pkv_cache *c)
{
    memset(m, 0, sizeof *m);
    size_t n = 0;
    uint64_t *ids = wu_ids(c, &n);
    pkv_seq_info si;
    for (size_t i = 0; i < n; i++) {
        WU_OK(pkv_seq_get_info(c, ids[i], &si));
        wu_seq *s = wu_model_add(m, ids[i], si.salt, NULL, 0, 0);
        wu_seq_reserve(s, si.len + 1);
        size_t nt = 0;
        WU_OK(pkv_seq_tokens(c, ids[i], s->tok, si.len + 1, &nt));
        WU_ASSERT(nt == si.len, "seq %llu: %zu tokens, info says len %llu",
                  (unsigned long long)ids[i], nt, (unsigned long long)si.len);
        s->len = si.len;
        s->committed = si.committed;
    }
    free(ids);
    wu_model_sort(m);
}

/* ---- K/V ---------------------------------------------------------------------------- */

void wu_kv_write(pkv_cache *c, const pkv_cache_info *inf, uint32_t block, uint32_t off,
                 uint64_t h)
{
    for (uint32_t l = 0; l < inf->num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < inf->num_kv_heads; hd++) {
                uint8_t *run = pkv_kv(c, block, l, (pkv_kind)k, hd);
                WU_ASSERT(run, "pkv_kv(%u, %u, %u, %u) NULL", block, l, k, hd);
                float *p = (float *)(void *)(run + (size_t)off * inf->head_dim * 4);
                for (uint32_t d = 0; d < inf->head_dim; d++) {
                    float f = (float)pt_val(h, l, k, hd, d);
                    memcpy(&p[d], &f, 4);
                }
            }
}

bool wu_kv_ok(pkv_cache *c, const pkv_cache_info *inf, uint32_t block, uint32_t off,
              uint64_t h, char *err, size_t errlen)
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
                const uint8_t *p = run + (size_t)off * inf->head_dim * 4;
                for (uint32_t d = 0; d < inf->head_dim; d++) {
                    float want = (float)pt_val(h, l, k, hd, d), got;
                    memcpy(&got, p + 4 * d, 4);
                    if (memcmp(&want, &got, 4) != 0) {
                        snprintf(err, errlen,
                                 "K/V mismatch at block %u offset %u layer %u kind %u head %u "
                                 "dim %u: %.1f, expected %.1f",
                                 block, off, l, k, hd, d, (double)got, (double)want);
                        return false;
                    }
                }
            }
    return true;
}

void wu_verify_seq(pkv_cache *c, const wu_seq *s, size_t kv_upto, const char *what)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    uint32_t bs = inf.block_size;
    unsigned long long id = (unsigned long long)s->id;
    pkv_seq_info si;
    int r = pkv_seq_get_info(c, s->id, &si);
    WU_ASSERT(r == 0, "%s: seq %llu: pkv_seq_get_info -> %d (%s)", what, id, r, pkv_strerror(r));
    size_t nb_want = (s->len + bs - 1) / bs;
    WU_ASSERT(si.len == s->len && si.committed == s->committed && si.n_blocks == nb_want &&
                  si.salt == s->salt,
              "%s: seq %llu: info len %llu committed %llu n_blocks %llu salt %llu, expected "
              "%zu %zu %zu %llu",
              what, id, (unsigned long long)si.len, (unsigned long long)si.committed,
              (unsigned long long)si.n_blocks, (unsigned long long)si.salt, s->len,
              s->committed, nb_want, (unsigned long long)s->salt);
    uint32_t *t = wu_xalloc((s->len + 1) * sizeof *t);
    size_t nt = 0;
    WU_OK(pkv_seq_tokens(c, s->id, t, s->len + 1, &nt));
    WU_ASSERT(nt == s->len, "%s: seq %llu has %zu tokens, expected %zu", what, id, nt, s->len);
    for (size_t i = 0; i < s->len; i++)
        WU_ASSERT(t[i] == s->tok[i], "%s: seq %llu token %zu is %u, expected %u", what, id, i,
                  t[i], s->tok[i]);
    free(t);
    uint32_t *tab = wu_xalloc((nb_want + 1) * sizeof *tab);
    size_t nb = 0;
    WU_OK(pkv_seq_blocks(c, s->id, tab, nb_want + 1, &nb));
    WU_ASSERT(nb == nb_want, "%s: seq %llu table has %zu blocks, expected %zu", what, id, nb,
              nb_want);
    for (size_t i = 0; i < nb; i++) {
        WU_ASSERT(tab[i] < inf.capacity, "%s: seq %llu block %u out of range", what, id, tab[i]);
        for (size_t j = 0; j < i; j++)
            WU_ASSERT(tab[i] != tab[j], "%s: seq %llu names block %u twice", what, id, tab[i]);
    }
    if (kv_upto > s->len) kv_upto = s->len;
    uint64_t h = pt_h0(s->salt);
    char err[256];
    for (size_t p = 0; p < kv_upto; p++) {
        h = pt_hstep(h, s->tok[p]);
        if (!wu_kv_ok(c, &inf, tab[p / bs], (uint32_t)(p % bs), h, err, sizeof err))
            WU_FAIL("%s: seq %llu (salt %llu, len %zu, committed %zu) position %zu: %s", what,
                    id, (unsigned long long)s->salt, s->len, s->committed, p, err);
    }
    free(tab);
}

void wu_verify_model(pkv_cache *c, const wu_model *m, const char *what)
{
    size_t n = 0;
    uint64_t *ids = wu_ids(c, &n);
    WU_ASSERT(n == m->n, "%s: cache lists %zu sequences, expected %zu", what, n, m->n);
    for (size_t i = 0; i < n; i++)
        WU_ASSERT(wu_model_find(m, ids[i]), "%s: cache lists unexpected sequence %llu", what,
                  (unsigned long long)ids[i]);
    free(ids);
    for (size_t i = 0; i < m->n; i++) wu_verify_seq(c, &m->s[i], m->s[i].len, what);
}

/* ---- Prompts and probes ------------------------------------------------------------ */

void wu_prompts_add(wu_prompts *ps, uint64_t salt, const uint32_t *t, size_t n)
{
    if (!ps->init) {
        pt_set_init(&ps->keys);
        ps->init = true;
    }
    uint64_t key = pt_mix(pt_prefix_key(salt, t, n) ^ salt);
    if (!pt_set_add(&ps->keys, key)) return;
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 64;
        ps->p = wu_xrealloc(ps->p, ps->cap * sizeof *ps->p);
    }
    wu_prompt *p = &ps->p[ps->n++];
    p->salt = salt;
    p->n = n;
    p->tok = wu_xalloc((n + 1) * sizeof *p->tok);
    if (n) memcpy(p->tok, t, n * sizeof *t);
}

void wu_prompts_free(wu_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++) free(ps->p[i].tok);
    free(ps->p);
    if (ps->init) pt_set_free(&ps->keys);
    memset(ps, 0, sizeof *ps);
}

static uint64_t wu_probe_next = WU_PROBE_ID;

size_t wu_probe(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, const char *what)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    uint32_t bs = inf.block_size;
    uint64_t id = wu_probe_next++;
    size_t nc = (size_t)-1;
    int r = pkv_seq_open(c, id, salt, t, n, &nc);
    WU_ASSERT(r == 0, "%s: probe seq_open(n %zu) -> %d (%s: %s)", what, n, r, pkv_strerror(r),
              pkv_last_error());
    WU_ASSERT(nc % bs == 0 && nc <= pt_hit_cap(n, bs),
              "%s: probe of %zu tokens: n_cached %zu (block size %u)", what, n, nc, bs);
    if (nc) {
        size_t nb = nc / bs;
        uint32_t *tab = wu_xalloc((nb + 1) * sizeof *tab);
        size_t got = 0;
        WU_OK(pkv_seq_blocks(c, id, tab, nb + 1, &got));
        WU_ASSERT(got == nb, "%s: probe table %zu blocks, expected %zu", what, got, nb);
        uint64_t h = pt_h0(salt);
        char err[256];
        for (size_t p = 0; p < nc; p++) {
            h = pt_hstep(h, t[p]);
            if (!wu_kv_ok(c, &inf, tab[p / bs], (uint32_t)(p % bs), h, err, sizeof err))
                WU_FAIL("%s: prefix hit of %zu tokens (salt %llu), position %zu (block %u): "
                        "%s",
                        what, nc, (unsigned long long)salt, p, tab[p / bs], err);
        }
        free(tab);
    }
    WU_CHECK(c, what);
    r = pkv_seq_close(c, id);
    WU_ASSERT(r == 0, "%s: probe close -> %d (%s)", what, r, pkv_strerror(r));
    return nc;
}

void wu_probe_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m, size_t *hits,
                  const char *what)
{
    size_t k = 0;
    for (size_t i = 0; ps && i < ps->n; i++, k++) {
        size_t h = wu_probe(c, ps->p[i].salt, ps->p[i].tok, ps->p[i].n, what);
        if (hits) hits[k] = h;
    }
    for (size_t i = 0; m && i < m->n; i++, k++) {
        const wu_seq *s = &m->s[i];
        size_t h = wu_probe(c, s->salt, s->tok, s->committed, what);
        if (hits) hits[k] = h;
    }
    WU_CHECK(c, what);
}

int wu_recompute(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, const char *what)
{
    return wu_recompute_step(c, salt, t, n, 0, what);
}

int wu_recompute_step(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n, size_t step,
                      const char *what)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    uint64_t id = wu_probe_next++;
    size_t nc = (size_t)-1;
    int r = pkv_seq_open(c, id, salt, NULL, 0, &nc);
    WU_ASSERT(r == 0 && nc == 0, "%s: recompute seq_open(n 0) -> %d (%s: %s), n_cached %zu",
              what, r, pkv_strerror(r), pkv_last_error(), nc);
    pkv_slot slots[128];
    uint64_t h = pt_h0(salt);
    size_t chunk = step && step < 128 ? step : 128;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < chunk ? n - done : chunk;
        r = pkv_seq_append(c, id, t + done, k, slots);
        if (r == PKV_EFULL) {
            WU_OK(pkv_seq_close(c, id));
            return PKV_EFULL;
        }
        WU_ASSERT(r == 0, "%s: recompute append of %zu tokens -> %d (%s: %s)", what, k, r,
                  pkv_strerror(r), pkv_last_error());
        for (size_t i = 0; i < k; i++) {
            h = pt_hstep(h, t[done + i]);
            WU_ASSERT(slots[i].block < inf.capacity &&
                          slots[i].offset == (done + i) % inf.block_size,
                      "%s: recompute append slot (%u, %u) for position %zu", what,
                      slots[i].block, slots[i].offset, done + i);
            wu_kv_write(c, &inf, slots[i].block, slots[i].offset, h);
        }
        done += k;
        if (step) {
            r = pkv_seq_commit(c, id, k);
            WU_ASSERT(r == 0, "%s: recompute commit of %zu tokens -> %d (%s: %s)", what, k, r,
                      pkv_strerror(r), pkv_last_error());
        }
    }
    if (n && !step) {
        r = pkv_seq_commit(c, id, n);
        WU_ASSERT(r == 0, "%s: recompute commit of %zu tokens -> %d (%s: %s)", what, n, r,
                  pkv_strerror(r), pkv_last_error());
    }
    WU_CHECK(c, what);
    wu_seq s = {.id = id, .salt = salt, .tok = (uint32_t *)t, .len = n, .committed = n};
    char w2[300];
    snprintf(w2, sizeof w2, "%s: prompt of %zu tokens recomputed from scratch (no prefix "
             "attach; %zu tokens per append + commit), read back through the committed table",
             what, n, step ? step : n);
    wu_verify_seq(c, &s, n, w2);
    r = pkv_seq_close(c, id);
    WU_ASSERT(r == 0, "%s: recompute close -> %d (%s)", what, r, pkv_strerror(r));
    WU_CHECK(c, what);
    return 0;
}

size_t wu_recompute_hits(pkv_cache *c, uint64_t salt, const uint32_t *t, size_t n,
                         const char *what)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    const uint32_t bs = inf.block_size;
    uint64_t id = wu_probe_next++;
    size_t nc = (size_t)-1;
    int r = pkv_seq_open(c, id, salt, NULL, 0, &nc);
    WU_ASSERT(r == 0 && nc == 0, "%s: recompute seq_open(n 0) -> %d (%s: %s), n_cached %zu",
              what, r, pkv_strerror(r), pkv_last_error(), nc);
    pkv_slot slots[PKV_BLOCK_SIZE_MAX];
    uint64_t h = pt_h0(salt);
    size_t done = 0, hits = 0;
    while (done + bs <= n) {
        r = pkv_seq_append(c, id, t + done, bs, slots);
        if (r == PKV_EFULL) break;
        WU_ASSERT(r == 0, "%s: recompute append -> %d (%s: %s)", what, r, pkv_strerror(r),
                  pkv_last_error());
        for (uint32_t i = 0; i < bs; i++) {
            h = pt_hstep(h, t[done + i]);
            wu_kv_write(c, &inf, slots[i].block, slots[i].offset, h);
        }
        r = pkv_seq_commit(c, id, bs);
        WU_ASSERT(r == 0, "%s: recompute commit -> %d (%s: %s)", what, r, pkv_strerror(r),
                  pkv_last_error());
        done += bs;
        uint32_t tab[PKV_BLOCK_SIZE_MAX];
        size_t nb = 0;
        r = pkv_seq_blocks(c, id, tab, PKV_BLOCK_SIZE_MAX, &nb);
        WU_ASSERT((r == 0 || r == PKV_ERANGE) && nb == done / bs,
                  "%s: recompute table of %zu blocks", what, nb);
        if (nb - 1 >= PKV_BLOCK_SIZE_MAX || tab[nb - 1] == slots[0].block) break; /* a miss */
        hits++;
    }
    WU_CHECK(c, what);
    wu_seq s = {.id = id, .salt = salt, .tok = (uint32_t *)t, .len = done, .committed = done};
    char w2[300];
    snprintf(w2, sizeof w2, "%s: prompt of %zu tokens recomputed from scratch block by block "
             "(no prefix attach; %zu blocks deduped), read back through the committed table",
             what, n, hits);
    wu_verify_seq(c, &s, done, w2);
    r = pkv_seq_close(c, id);
    WU_ASSERT(r == 0, "%s: recompute close -> %d (%s)", what, r, pkv_strerror(r));
    return hits;
}

void wu_recompute_hits_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m,
                           size_t *probes, const char *what)
{
    size_t np = 0;
    for (size_t i = ps ? ps->n : 0; i-- > 0; np++)
        wu_recompute_hits(c, ps->p[i].salt, ps->p[i].tok, ps->p[i].n, what);
    for (size_t i = 0; m && i < m->n; i++, np++)
        wu_recompute_hits(c, m->s[i].salt, m->s[i].tok, m->s[i].committed, what);
    if (probes) *probes += np;
}

void wu_recompute_all(pkv_cache *c, const wu_prompts *ps, const wu_model *m, size_t *probes,
                      size_t *full, const char *what)
{
    size_t np = 0, nf = 0;
    for (size_t i = 0; ps && i < ps->n; i++, np++)
        if (wu_recompute(c, ps->p[i].salt, ps->p[i].tok, ps->p[i].n, what)) nf++;
    for (size_t i = 0; m && i < m->n; i++, np++)
        if (wu_recompute(c, m->s[i].salt, m->s[i].tok, m->s[i].committed, what)) nf++;
    if (probes) *probes += np;
    if (full) *full += nf;
}

/* ---- Workload ------------------------------------------------------------------------ */

void wu_wl_init(wu_wl *w, pkv_cache *c, uint64_t seed, wu_prompts *prompts)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    WU_OK(pkv_info(c, &w->inf));
    w->rng.s = seed * 0x2545F4914F6CDD1Dull + 17;
    w->prompts = prompts;
    w->next_id = 1000;
    w->max_seqs = 8;
    w->max_len = 64;
    w->check_each = true;
    pt_rng fr = {seed ^ 0xFA111E5ull};
    for (int f = 0; f < WU_FAMILIES; f++)
        for (int i = 0; i < WU_FAMLEN; i++) w->fam[f][i] = pt_below(&fr, 30000);
    wu_model_read(&w->m, c); /* recovered sequences are part of the workload */
    for (size_t i = 0; i < w->m.n; i++)
        if (w->m.s[i].id >= w->next_id) w->next_id = w->m.s[i].id + 1;
}

void wu_wl_reattach(wu_wl *w, pkv_cache *c)
{
    w->c = c;
    wu_model_drop_pending(&w->m);
}

void wu_wl_free(wu_wl *w)
{
    wu_model_free(&w->m);
}

/* A failed call: strict mode fails the test, tolerant mode records the error. */
static int wl_call(wu_wl *w, int rc, const char *call)
{
    if (rc == 0) {
        w->calls++;
        if (w->after_call) w->after_call(w->hctx, w->c);
        return 0;
    }
    if (!w->tolerant) WU_FAIL("workload: %s -> %d (%s: %s)", call, rc, pkv_strerror(rc),
                              pkv_last_error());
    w->err = rc;
    w->err_call = call;
    return rc;
}

static void wl_intent(wu_wl *w, char kind, uint64_t id, uint64_t arg, uint64_t salt,
                      const uint32_t *t, size_t n)
{
    if (w->intent) w->intent(w->hctx, kind, id, arg, salt, t, n);
}

/* Append t[0..k) to s, write their K/V, update the model. */
static int wl_append(wu_wl *w, uint64_t id, const uint32_t *t, size_t k)
{
    pkv_slot slots[128];
    WU_ASSERT(k > 0 && k <= 128, "append of %zu", k);
    for (size_t i = 0; i < k; i++) slots[i] = (pkv_slot){0xFFFFFFFFu, 0xFFFFFFFFu};
    int rc = wl_call(w, pkv_seq_append(w->c, id, t, k, slots), "pkv_seq_append");
    if (rc) return rc;
    wu_seq *s = wu_model_find(&w->m, id);
    uint32_t bs = w->inf.block_size;
    wu_seq_reserve(s, s->len + k + 1);
    uint64_t h = pt_hprefix(s->salt, s->tok, s->len);
    for (size_t i = 0; i < k; i++) {
        size_t p = s->len + i;
        WU_ASSERT(slots[i].block < w->inf.capacity && slots[i].offset == p % bs,
                  "append slot %zu = (%u, %u) for position %zu", i, slots[i].block,
                  slots[i].offset, p);
        s->tok[p] = t[i];
        h = pt_hstep(h, t[i]);
        wu_kv_write(w->c, &w->inf, slots[i].block, slots[i].offset, h);
        if (w->written) w->written(w->hctx, slots[i].block, slots[i].offset);
    }
    s->len += k;
    return 0;
}

static int wl_commit(wu_wl *w, uint64_t id, size_t n)
{
    if (n == 0) return 0;
    int rc = wl_call(w, pkv_seq_commit(w->c, id, n), "pkv_seq_commit");
    if (rc) return rc;
    wu_model_find(&w->m, id)->committed += n;
    return 0;
}

/* Commit all pending tokens (70%), some (20%) or none (10%). */
static int wl_commit_some(wu_wl *w, uint64_t id)
{
    wu_seq *s = wu_model_find(&w->m, id);
    size_t pend = s->len - s->committed;
    if (!pend) return 0;
    uint32_t r = pt_below(&w->rng, 10);
    if (r < 7) return wl_commit(w, id, pend);
    if (r < 9) return wl_commit(w, id, 1 + pt_below(&w->rng, (uint32_t)pend));
    return 0;
}

static int op_close(wu_wl *w, uint64_t id);
static int op_open_prompt(wu_wl *w, uint64_t salt, const uint32_t *prompt, size_t n,
                          size_t pending, uint64_t *out)
{
    uint64_t id = w->next_id++;
    if (out) *out = id;
    wl_intent(w, 'O', id, 0, salt, prompt, n);
    if (w->prompts) wu_prompts_add(w->prompts, salt, prompt, n);
    size_t nc = (size_t)-1;
    int rc = wl_call(w, pkv_seq_open(w->c, id, salt, prompt, n, &nc), "pkv_seq_open");
    if (rc) return rc;
    uint32_t bs = w->inf.block_size;
    WU_ASSERT(nc % bs == 0 && nc <= pt_hit_cap(n, bs), "seq_open of %zu tokens: n_cached %zu",
              n, nc);
    wu_seq *s = wu_model_add(&w->m, id, salt, prompt, nc, nc);
    wu_verify_seq(w->c, s, nc, "prefix hit of seq_open");
    for (size_t done = nc; done < n;) {
        size_t k = n - done < 128 ? n - done : 128;
        if ((rc = wl_append(w, id, prompt + done, k))) return rc;
        done += k;
    }
    if (pending > n - nc) pending = n - nc;
    return wl_commit(w, id, n - nc - pending);
}

int wu_do_open(wu_wl *w, uint64_t salt, const uint32_t *prompt, size_t n, size_t pending,
               uint64_t *id)
{
    return op_open_prompt(w, salt, prompt, n, pending, id);
}

int wu_do_append(wu_wl *w, uint64_t id, const uint32_t *t, size_t k, bool commit)
{
    int rc = wl_append(w, id, t, k);
    if (rc || !commit) return rc;
    wu_seq *s = wu_model_find(&w->m, id);
    return wl_commit(w, id, s->len - s->committed);
}

int wu_do_commit(wu_wl *w, uint64_t id, size_t n)
{
    return wl_commit(w, id, n);
}

int wu_do_commit_append(wu_wl *w, uint64_t id, size_t nc, const uint32_t *t, size_t k)
{
    pkv_slot slots[128];
    WU_ASSERT(k <= 128, "append of %zu", k);
    for (size_t i = 0; i < k; i++) slots[i] = (pkv_slot){0xFFFFFFFFu, 0xFFFFFFFFu};
    int rc = wl_call(w, pkv_seq_commit_append(w->c, id, nc, k ? t : NULL, k, k ? slots : NULL),
                     "pkv_seq_commit_append");
    if (rc) return rc;
    wu_seq *s = wu_model_find(&w->m, id);
    s->committed += nc;
    uint32_t bs = w->inf.block_size;
    wu_seq_reserve(s, s->len + k + 1);
    uint64_t h = pt_hprefix(s->salt, s->tok, s->len);
    for (size_t i = 0; i < k; i++) {
        size_t p = s->len + i;
        WU_ASSERT(slots[i].block < w->inf.capacity && slots[i].offset == p % bs,
                  "commit_append slot %zu = (%u, %u) for position %zu", i, slots[i].block,
                  slots[i].offset, p);
        s->tok[p] = t[i];
        h = pt_hstep(h, t[i]);
        wu_kv_write(w->c, &w->inf, slots[i].block, slots[i].offset, h);
        if (w->written) w->written(w->hctx, slots[i].block, slots[i].offset);
    }
    s->len += k;
    return 0;
}

int wu_do_step_batch(wu_wl *w, const uint64_t *ids, const uint32_t *nc, const uint32_t *t,
                     size_t n, size_t *done)
{
    pkv_step st[64];
    WU_ASSERT(n >= 1 && n <= 64, "batch of %zu steps", n);
    for (size_t i = 0; i < n; i++)
        st[i] = (pkv_step){.id = ids[i], .n_commit = nc[i], .token = t[i],
                           .slot = {0xFFFFFFFFu, 0xFFFFFFFFu}};
    size_t k = (size_t)-1;
    int rc = wl_call(w, pkv_seq_step_batch(w->c, st, n, &k), "pkv_seq_step_batch");
    WU_ASSERT(k <= n && (rc != 0 || k == n), "step batch of %zu: done %zu, rc %d", n, k, rc);
    if (done) *done = k;
    uint32_t bs = w->inf.block_size;
    for (size_t i = 0; i < k; i++) { /* steps [0, k) took effect, in order */
        wu_seq *s = wu_model_find(&w->m, ids[i]);
        WU_ASSERT(s, "step %zu: sequence %llu not in the model", i, (unsigned long long)ids[i]);
        s->committed += nc[i];
        wu_seq_reserve(s, s->len + 2);
        size_t p = s->len;
        WU_ASSERT(st[i].slot.block < w->inf.capacity && st[i].slot.offset == p % bs,
                  "step %zu: slot (%u, %u) for position %zu", i, st[i].slot.block,
                  st[i].slot.offset, p);
        s->tok[p] = t[i];
        uint64_t h = pt_hstep(pt_hprefix(s->salt, s->tok, p), t[i]);
        wu_kv_write(w->c, &w->inf, st[i].slot.block, st[i].slot.offset, h);
        if (w->written) w->written(w->hctx, st[i].slot.block, st[i].slot.offset);
        s->len++;
    }
    return rc;
}

int wu_do_fork(wu_wl *w, uint64_t parent, uint64_t *child)
{
    uint64_t ch = w->next_id++;
    if (child) *child = ch;
    wl_intent(w, 'F', ch, parent, 0, NULL, 0);
    int rc = wl_call(w, pkv_seq_fork(w->c, parent, ch), "pkv_seq_fork");
    if (rc) return rc;
    wu_seq tmp = *wu_model_find(&w->m, parent);
    wu_model_add(&w->m, ch, tmp.salt, tmp.tok, tmp.len, tmp.committed);
    return 0;
}

int wu_do_truncate(wu_wl *w, uint64_t id, size_t nl)
{
    wl_intent(w, 'T', id, nl, 0, NULL, 0);
    int rc = wl_call(w, pkv_seq_truncate(w->c, id, nl), "pkv_seq_truncate");
    if (rc) return rc;
    wu_seq *s = wu_model_find(&w->m, id);
    s->len = nl;
    if (s->committed > nl) s->committed = nl;
    return 0;
}

int wu_do_close(wu_wl *w, uint64_t id)
{
    return op_close(w, id);
}

void wu_churn(pkv_cache *c, uint64_t id, uint64_t bytes)
{
    pkv_stats st;
    WU_OK(pkv_get_stats(c, &st));
    uint64_t target = st.wal_bytes + bytes;
    for (uint64_t i = 0;; i++) {
        if ((i & 255) == 0) {
            WU_OK(pkv_get_stats(c, &st));
            if (st.wal_bytes >= target) break;
        }
        WU_OK(pkv_seq_fork(c, id, id + 1));
        WU_OK(pkv_seq_close(c, id + 1));
    }
}

static int op_close(wu_wl *w, uint64_t id)
{
    wl_intent(w, 'C', id, 0, 0, NULL, 0);
    int rc = wl_call(w, pkv_seq_close(w->c, id), "pkv_seq_close");
    if (rc) return rc;
    wu_model_remove(&w->m, id);
    return 0;
}

static int op_open(wu_wl *w)
{
    uint32_t prompt[WU_FAMLEN + 32];
    size_t n = 0;
    uint64_t salt = pt_below(&w->rng, 6) == 0 ? 7 : 0;
    if (w->prompts && w->prompts->n && pt_below(&w->rng, 5) == 0) {
        /* an earlier prompt again: full hits */
        const wu_prompt *p = &w->prompts->p[pt_below(&w->rng, (uint32_t)w->prompts->n)];
        if (p->n <= WU_FAMLEN + 32 && p->n >= 1) {
            memcpy(prompt, p->tok, p->n * sizeof *prompt);
            n = p->n;
            salt = p->salt;
        }
    }
    if (n == 0) {
        size_t f = pt_below(&w->rng, WU_FAMILIES);
        size_t pre = pt_below(&w->rng, WU_FAMLEN + 1);
        size_t suf = 1 + pt_below(&w->rng, 12);
        memcpy(prompt, w->fam[f], pre * sizeof *prompt);
        for (size_t i = 0; i < suf; i++) prompt[pre + i] = pt_below(&w->rng, 30000);
        n = pre + suf;
    }
    if (n > w->max_len) n = w->max_len;
    /* commit everything (75%) or leave 1..3 tokens pending */
    size_t pending = pt_below(&w->rng, 4) ? 0 : 1 + pt_below(&w->rng, 3);
    return op_open_prompt(w, salt, prompt, n, pending, NULL);
}

static int op_decode(wu_wl *w, uint64_t id)
{
    wu_seq *s = wu_model_find(&w->m, id);
    if (s->len - s->committed && pt_below(&w->rng, 2)) return wl_commit_some(w, id);
    size_t k = 1 + pt_below(&w->rng, 6);
    if (s->len + k > w->max_len) {
        if (pt_below(&w->rng, 2)) return op_close(w, id);
        size_t nl = pt_below(&w->rng, (uint32_t)s->len + 1);
        wl_intent(w, 'T', id, nl, 0, NULL, 0);
        int rc = wl_call(w, pkv_seq_truncate(w->c, id, nl), "pkv_seq_truncate");
        if (rc) return rc;
        s->len = nl;
        if (s->committed > nl) s->committed = nl;
        return 0;
    }
    uint32_t t[8];
    for (size_t i = 0; i < k; i++) t[i] = pt_below(&w->rng, 30000);
    int rc = wl_append(w, id, t, k);
    if (rc) return rc;
    return wl_commit_some(w, id);
}

static int op_fork(wu_wl *w, uint64_t id)
{
    wu_seq *s = wu_model_find(&w->m, id);
    int rc;
    if (s->len != s->committed && (rc = wl_commit(w, id, s->len - s->committed))) return rc;
    uint64_t child = w->next_id++;
    wl_intent(w, 'F', child, id, 0, NULL, 0);
    if ((rc = wl_call(w, pkv_seq_fork(w->c, id, child), "pkv_seq_fork"))) return rc;
    s = wu_model_find(&w->m, id);
    wu_seq tmp = *s; /* s may move when the model grows */
    wu_model_add(&w->m, child, tmp.salt, tmp.tok, tmp.len, tmp.committed);
    /* a child usually diverges at once */
    if (pt_below(&w->rng, 3)) return op_decode(w, child);
    return 0;
}

static int op_truncate(wu_wl *w, uint64_t id)
{
    wu_seq *s = wu_model_find(&w->m, id);
    size_t nl;
    uint32_t r = pt_below(&w->rng, 4);
    if (r == 0) nl = s->committed; /* drop pending only */
    else if (r == 1 && s->len > 2) nl = s->len - 1 - pt_below(&w->rng, 2);
    else nl = pt_below(&w->rng, (uint32_t)s->len + 1);
    wl_intent(w, 'T', id, nl, 0, NULL, 0);
    int rc = wl_call(w, pkv_seq_truncate(w->c, id, nl), "pkv_seq_truncate");
    if (rc) return rc;
    s->len = nl;
    if (s->committed > nl) s->committed = nl;
    if (pt_below(&w->rng, 2)) return op_decode(w, id);
    return 0;
}

int wu_step(wu_wl *w)
{
    w->err = 0;
    w->err_call = NULL;
    int rc;
    uint32_t r = pt_below(&w->rng, 100);
    size_t n = w->m.n;
    if (n == 0 || (r < 20 && n < w->max_seqs)) {
        rc = op_open(w);
    } else {
        uint64_t id = w->m.s[pt_below(&w->rng, (uint32_t)n)].id;
        if (id == w->keep_id) {
            if (w->check_each) WU_CHECK(w->c, "after a workload step");
            return 0;
        }
        if (r < 52) rc = op_decode(w, id);
        else if (r < 62 && n < w->max_seqs) rc = op_fork(w, id);
        else if (r < 74) rc = op_truncate(w, id);
        else if (r < 86 || n >= w->max_seqs) rc = op_close(w, id);
        else if (w->allow_ckpt && r < 88)
            rc = wl_call(w, pkv_checkpoint(w->c), "pkv_checkpoint");
        else rc = op_decode(w, id);
    }
    if (w->check_each) WU_CHECK(w->c, "after a workload step");
    return rc;
}

/* ---- Oracle -------------------------------------------------------------------------- */

void wu_oracle_init(wu_oracle *o)
{
    memset(o, 0, sizeof *o);
}

void wu_oracle_free(wu_oracle *o)
{
    wu_model_free(&o->ack);
    free(o->it);
    memset(o, 0, sizeof *o);
}

void wu_oracle_ack(wu_oracle *o, const wu_model *m)
{
    wu_model_free(&o->ack);
    wu_model_copy(&o->ack, m);
    wu_model_drop_pending(&o->ack);
    o->nit = 0;
}

void wu_oracle_intent(wu_oracle *o, char kind, uint64_t id, uint64_t arg)
{
    if (o->nit == o->capit) {
        o->capit = o->capit ? o->capit * 2 : 64;
        o->it = wu_xrealloc(o->it, o->capit * sizeof *o->it);
    }
    o->it[o->nit++] = (wu_intent){kind, id, arg};
}

void wu_oracle_check(const wu_oracle *o, pkv_cache *c, bool tails_lost, wu_model *out,
                     const char *what)
{
    pkv_cache_info inf;
    WU_OK(pkv_info(c, &inf));
    uint32_t bs = inf.block_size;
    wu_model r;
    wu_model_read(&r, c);
    for (size_t i = 0; i < r.n; i++) {
        const wu_seq *s = &r.s[i];
        WU_ASSERT(s->len == s->committed, "%s: recovered seq %llu has pending tokens (len %zu, "
                  "committed %zu)", what, (unsigned long long)s->id, s->len, s->committed);
    }
    /* Acknowledged sequences. */
    for (size_t i = 0; i < o->ack.n; i++) {
        const wu_seq *a = &o->ack.s[i];
        bool closed = false;
        size_t lim = a->committed;
        for (size_t k = 0; k < o->nit; k++) {
            if (o->it[k].id != a->id) continue;
            if (o->it[k].kind == 'C') closed = true;
            if (o->it[k].kind == 'T' && o->it[k].arg < lim) lim = (size_t)o->it[k].arg;
        }
        const wu_seq *s = wu_model_find(&r, a->id);
        unsigned long long id = (unsigned long long)a->id;
        if (!s) {
            WU_ASSERT(closed, "%s: acknowledged sequence %llu (committed %zu, salt %llu) lost",
                      what, id, a->committed, (unsigned long long)a->salt);
            continue;
        }
        WU_ASSERT(s->salt == a->salt, "%s: seq %llu salt %llu, acknowledged %llu", what, id,
                  (unsigned long long)s->salt, (unsigned long long)a->salt);
        /* Without power-loss durability (PKV_DURABLE_NONE) a partial block acknowledged by
         * pkv_sync may later be filled and sealed; if that SEAL reaches the disk but the new
         * payload does not, recovery drops the whole block (see
         * crash::none_mode_sync_survives_a_later_seal, which checks the exact bound); and
         * after a restart recovery cuts every open tail (rule D8). */
        size_t need = tails_lost ? lim / bs * bs : lim;
        if (!closed)
            WU_ASSERT(s->committed >= need,
                      "%s: seq %llu recovered with %zu committed tokens, acknowledged %zu "
                      "(%zu after later truncations)",
                      what, id, s->committed, a->committed, lim);
        size_t cmp = lim < s->committed ? lim : s->committed;
        for (size_t p = 0; p < cmp; p++)
            WU_ASSERT(s->tok[p] == a->tok[p],
                      "%s: seq %llu token %zu is %u, acknowledged %u", what, id, p, s->tok[p],
                      a->tok[p]);
    }
    /* Other sequences must have been created after the acknowledgement. */
    for (size_t i = 0; i < r.n; i++) {
        const wu_seq *s = &r.s[i];
        if (wu_model_find(&o->ack, s->id)) continue;
        bool created = false;
        for (size_t k = 0; k < o->nit && !created; k++)
            created = o->it[k].id == s->id && (o->it[k].kind == 'O' || o->it[k].kind == 'F');
        WU_ASSERT(created, "%s: recovered sequence %llu (committed %zu) was neither "
                  "acknowledged nor opened afterwards", what, (unsigned long long)s->id,
                  s->committed);
    }
    /* K/V of recovered sequences. */
    for (size_t i = 0; i < r.n; i++) {
        const wu_seq *s = &r.s[i];
        wu_verify_seq(c, s, s->committed, what);
    }
    if (out) *out = r;
    else wu_model_free(&r);
}

/* ---- Files ------------------------------------------------------------------------------ */

bool wu_newest_seg(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    WU_ASSERT(d, "opendir(%s): %s", dir, strerror(errno));
    unsigned long long best = 0;
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long n;
        if (strlen(e->d_name) == 20 && sscanf(e->d_name, "wal-%16llx", &n) == 1 &&
            (!found || n > best)) {
            best = n;
            found = true;
        }
    }
    closedir(d);
    if (found) snprintf(out, cap, "%s/wal-%016llx", dir, best);
    return found;
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

size_t wu_frames(const char *path, wu_frame *out, size_t max)
{
    size_t len = 0;
    uint8_t *b = wu_read_file(path, &len);
    size_t n = 0;
    uint64_t off = 64;
    while (n < max && off + 32 <= len && get32(b + off) == 0x46564b50u) {
        uint32_t bytes = get32(b + off + 20);
        if (off + 32 + bytes > len) break;
        out[n].off = off;
        out[n].first_lsn = get64(b + off + 8);
        out[n].nrec = get32(b + off + 16);
        out[n].bytes = bytes;
        n++;
        off += 32 + (uint64_t)bytes;
    }
    free(b);
    return n;
}

size_t wu_count(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    WU_ASSERT(d, "opendir(%s): %s", dir, strerror(errno));
    size_t n = 0, pl = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, pl)) n++;
    closedir(d);
    return n;
}

uint8_t *wu_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    WU_ASSERT(fd >= 0, "open(%s): %s", path, strerror(errno));
    struct stat st;
    WU_ASSERT(fstat(fd, &st) == 0, "fstat(%s)", path);
    size_t n = (size_t)st.st_size;
    uint8_t *b = wu_xalloc(n + 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        WU_ASSERT(r > 0, "read(%s): %s", path, r < 0 ? strerror(errno) : "EOF");
        got += (size_t)r;
    }
    close(fd);
    *len = n;
    return b;
}

void wu_write_file(const char *path, const uint8_t *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    WU_ASSERT(fd >= 0, "create(%s): %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t r = pwrite(fd, buf + done, len - done, (off_t)done);
        WU_ASSERT(r > 0, "write(%s): %s", path, strerror(errno));
        done += (size_t)r;
    }
    close(fd);
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

void wu_copy_dir(const char *src, const char *dst)
{
    WU_ASSERT(mkdir(dst, 0700) == 0 || errno == EEXIST, "mkdir(%s): %s", dst, strerror(errno));
    DIR *d = opendir(src);
    WU_ASSERT(d, "opendir(%s): %s", src, strerror(errno));
    struct dirent *e;
    uint8_t *buf = wu_xalloc(1u << 16);
    while ((e = readdir(d))) {
        char from[1024], to[1024];
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
        struct stat st;
        if (stat(from, &st) || !S_ISREG(st.st_mode)) continue;
        int in = open(from, O_RDONLY | O_CLOEXEC);
        int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        WU_ASSERT(in >= 0 && out >= 0, "copy %s -> %s: %s", from, to, strerror(errno));
        for (off_t off = 0; off < st.st_size;) {
            ssize_t r = pread(in, buf, 1u << 16, off);
            WU_ASSERT(r > 0, "read %s", from);
            if (!all_zero(buf, (size_t)r))
                WU_ASSERT(pwrite(out, buf, (size_t)r, off) == r, "write %s", to);
            off += r;
        }
        WU_ASSERT(ftruncate(out, st.st_size) == 0, "ftruncate %s", to);
        close(in);
        close(out);
    }
    free(buf);
    closedir(d);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void wu_dirsnap_take(wu_dirsnap *s, const char *dir)
{
    memset(s, 0, sizeof *s);
    DIR *d = opendir(dir);
    WU_ASSERT(d, "opendir(%s): %s", dir, strerror(errno));
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (s->n == cap) {
            cap = cap ? cap * 2 : 16;
            s->name = wu_xrealloc(s->name, cap * sizeof *s->name);
        }
        s->name[s->n++] = strdup(e->d_name);
    }
    closedir(d);
    if (s->n) qsort(s->name, s->n, sizeof *s->name, cmp_str);
    s->data = wu_xalloc((s->n + 1) * sizeof *s->data);
    s->len = wu_xalloc((s->n + 1) * sizeof *s->len);
    for (size_t i = 0; i < s->n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, s->name[i]);
        s->data[i] = wu_read_file(path, &s->len[i]);
    }
}

void wu_dirsnap_same(const wu_dirsnap *s, const char *dir, const char *what)
{
    wu_dirsnap t;
    wu_dirsnap_take(&t, dir);
    WU_ASSERT(t.n == s->n, "%s: directory holds %zu files, before %zu", what, t.n, s->n);
    for (size_t i = 0; i < s->n; i++) {
        WU_ASSERT(!strcmp(t.name[i], s->name[i]), "%s: file %s became %s", what, s->name[i],
                  t.name[i]);
        WU_ASSERT(t.len[i] == s->len[i], "%s: %s size %zu -> %zu", what, s->name[i], s->len[i],
                  t.len[i]);
        WU_ASSERT(!memcmp(t.data[i], s->data[i], s->len[i]), "%s: bytes of %s changed", what,
                  s->name[i]);
    }
    wu_dirsnap_free(&t);
}

void wu_dirsnap_free(wu_dirsnap *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->name[i]);
        free(s->data[i]);
    }
    free(s->name);
    free(s->data);
    free(s->len);
    memset(s, 0, sizeof *s);
}

void wu_crash_image_recovers(pkv_cache *c, wu_wl *w, const char *dir, const pkv_options *o,
                             uint64_t ck, uint64_t replayed, const char *what)
{
    char img[512];
    pt_path(img, sizeof img, "img");
    pt_rmrf(img); /* an image of an earlier cache must not leave files behind */
    WU_OK(pkv_sync(c));
    WU_CHECK(c, "synced");
    wu_copy_dir(dir, img);
    pkv_close(c);
    c = wu_open_ok(img, o);
    if (ck != UINT64_MAX) {
        pkv_recovery rec;
        WU_OK(pkv_get_recovery(c, &rec));
        WU_ASSERT(rec.checkpoint_lsn == ck, "%s: recovered from checkpoint %llu", what,
                  (unsigned long long)rec.checkpoint_lsn);
        WU_ASSERT(rec.records_replayed == replayed, "%s: %llu records replayed", what,
                  (unsigned long long)rec.records_replayed);
    }
    wu_wl_reattach(w, c);
    wu_verify_model(c, &w->m, what);
    pkv_close(c);
    wu_wl_free(w);
}

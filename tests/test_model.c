/*
 * test_model.c — the reference model (src/model/) on pagedkv: the paged path's
 * logits against the from-scratch path's.
 *
 * Scenario (per KV storage type and block size): random prompts sharing a prefix
 * (the later ones attach the cached prefix), batched greedy decode, a fork whose
 * child takes the second-best token, truncations (inside a block, on a block
 * boundary, of pending tokens only) followed by new tokens, then pkv_close +
 * pkv_open of the cache: the recovered sequences continue decoding and a new prompt
 * hits the recovered prefix. After every step, the logits of each sequence's last
 * token are recomputed from scratch over its whole token list, with a contiguous
 * KV buffer and no cache:
 *  - with the same KV storage type, the logits must be bit-identical (the model
 *    and the attention do the same operations in the same order on both paths);
 *  - for f16/bf16 KV, also against from-scratch with f32 KV, compared in double:
 *    max |paged - scratch_f32| / max |scratch_f32| <= TOL_F16 / TOL_BF16.
 */
#include "pkv_test.h"

#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(model, .init = pt_setup, .fini = pt_teardown);

#define TOL_F16  5e-3 /* relative to the largest |logit| */
#define TOL_BF16 4e-2
#define MAX_CTX  512
#define MAX_SEQ  16

static uint64_t rs = 1;
static uint32_t below(uint32_t n) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) % n);
}
/* Mostly bytes, sometimes a special token. */
static uint32_t rtok(void) { return below(16) ? below(256) : PKVM_BOS + below(PKVM_VOCAB - 256); }

#define PM_OK(expr)                                                                        \
    do {                                                                                   \
        int r_ = (expr);                                                                   \
        cr_assert_eq(r_, 0, "%s%s:%d: %s -> %d (%s: %s)", pt_ctx, __FILE__, __LINE__,      \
                     #expr, r_, pkv_strerror(r_), pkvm_last_error());                      \
    } while (0)

static pkvm_model *tiny(unsigned threads, uint32_t attn_flags) {
    pkvm_config cfg;
    PM_OK(pkvm_preset("tiny", &cfg));
    cfg.seed = 7;
    pkvm_model *m = NULL;
    PM_OK(pkvm_create(&cfg, &m));
    pkvm_set_threads(m, threads);
    pkvm_set_attn_flags(m, attn_flags);
    return m;
}

static void cache_opts(pkv_options *o, pkvm_model *m, pkv_dtype dt, uint32_t bs, char *id,
                       size_t idcap) {
    pkv_options_init(o);
    pkvm_cache_geometry(m, o);
    o->block_size = bs;
    o->dtype = dt;
    o->capacity = 512;
    pkvm_model_id(m, dt, id, idcap);
    o->model_id = id;
}

/* A live sequence as the test knows it. */
typedef struct tseq {
    uint64_t id;
    uint32_t tok[MAX_CTX];
    size_t n;
    float logits[PKVM_VOCAB]; /* of tok[n-1] */
    int live;
} tseq;

typedef struct world {
    pkvm_model *m;
    pkv_cache *c;
    pkvm_engine *e;
    pkvm_scratch *same, *f32;
    pkv_dtype dt;
    tseq s[MAX_SEQ];
    size_t checks;
    double worst;
} world;

/* Recompute sequence i from scratch and compare with its paged logits. */
static void check_seq(world *w, size_t i, const char *what) {
    tseq *t = &w->s[i];
    float ref[PKVM_VOCAB];
    PM_OK(pkvm_scratch_run(w->same, t->tok, t->n, ref, NULL));
    for (uint32_t v = 0; v < PKVM_VOCAB; v++)
        cr_assert_eq(memcmp(&t->logits[v], &ref[v], sizeof(float)), 0,
                     "%s%s: seq %llu (%zu tokens): logit %u paged %a, scratch %a", pt_ctx, what,
                     (unsigned long long)t->id, t->n, v, (double)t->logits[v], (double)ref[v]);
    if (w->f32) {
        PM_OK(pkvm_scratch_run(w->f32, t->tok, t->n, ref, NULL));
        double big = 0, err = 0;
        for (uint32_t v = 0; v < PKVM_VOCAB; v++) {
            big = fmax(big, fabs((double)ref[v]));
            err = fmax(err, fabs((double)t->logits[v] - (double)ref[v]));
        }
        const double rel = err / big, tol = w->dt == PKV_F16 ? TOL_F16 : TOL_BF16;
        if (rel > w->worst) w->worst = rel;
        cr_assert(rel <= tol, "%s%s: seq %llu: relative logit error vs f32 KV %.3g > %.3g",
                  pt_ctx, what, (unsigned long long)t->id, rel, tol);
    }
    w->checks++;
}

static size_t add_seq(world *w, uint64_t id) {
    for (size_t i = 0; i < MAX_SEQ; i++)
        if (!w->s[i].live) {
            memset(&w->s[i], 0, sizeof w->s[i]);
            w->s[i].id = id;
            w->s[i].live = 1;
            return i;
        }
    cr_assert_fail("too many sequences");
    return 0;
}

/* One batched greedy step over every live sequence. */
static void step_all(world *w, const char *what) {
    uint64_t ids[MAX_SEQ];
    uint32_t toks[MAX_SEQ];
    size_t idx[MAX_SEQ], n = 0;
    for (size_t i = 0; i < MAX_SEQ; i++)
        if (w->s[i].live && w->s[i].n < MAX_CTX) {
            idx[n] = i;
            ids[n] = w->s[i].id;
            toks[n] = pkvm_argmax(w->s[i].logits, PKVM_VOCAB);
            n++;
        }
    float *lg = malloc(n * PKVM_VOCAB * sizeof(float));
    cr_assert_not_null(lg);
    PM_OK(pkvm_step(w->e, ids, toks, n, lg));
    for (size_t k = 0; k < n; k++) {
        tseq *t = &w->s[idx[k]];
        t->tok[t->n++] = toks[k];
        memcpy(t->logits, lg + k * PKVM_VOCAB, sizeof t->logits);
        check_seq(w, idx[k], what);
    }
    free(lg);
}

/* The cache's view of sequence i equals the test's. */
static void same_tokens(world *w, size_t i) {
    uint32_t got[MAX_CTX];
    size_t n = 0;
    PT_OK(pkv_seq_tokens(w->c, w->s[i].id, got, MAX_CTX, &n));
    cr_assert_eq(n, w->s[i].n, "seq %llu: %zu tokens in the cache, %zu expected",
                 (unsigned long long)w->s[i].id, n, w->s[i].n);
    cr_assert_eq(memcmp(got, w->s[i].tok, n * sizeof *got), 0);
}

static void scenario(pkv_dtype dt, uint32_t bs, uint64_t seed, unsigned threads,
                     uint32_t attn_flags) {
    rs = seed;
    snprintf(pt_ctx, sizeof pt_ctx, "[dtype %d bs %u seed %llu threads %u flags %u] ", (int)dt,
             bs, (unsigned long long)seed, threads, attn_flags);
    world *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    w->dt = dt;
    w->m = tiny(threads, attn_flags);
    char id[256];
    pkv_options o;
    cache_opts(&o, w->m, dt, bs, id, sizeof id);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cache-%d-%u", pt_dir, (int)dt, bs);
    PT_OK(pkv_open(dir, &o, &w->c));
    PM_OK(pkvm_engine_create(w->m, w->c, &w->e));
    pkvm_engine_set_chunk(w->e, 23); /* odd chunks: prefill spans several calls */
    PM_OK(pkvm_scratch_create(w->m, dt, MAX_CTX, &w->same));
    if (dt != PKV_F32) PM_OK(pkvm_scratch_create(w->m, PKV_F32, MAX_CTX, &w->f32));

    /* 1. Prompts sharing a prefix; later ones attach its cached blocks. */
    uint32_t prefix[64];
    prefix[0] = PKVM_BOS;
    for (int i = 1; i < 64; i++) prefix[i] = rtok();
    size_t hit = 0;
    for (uint64_t k = 0; k < 5; k++) {
        size_t i = add_seq(w, 100 + k);
        tseq *t = &w->s[i];
        const size_t keep = 20 + below(44);
        memcpy(t->tok, prefix, keep * sizeof(uint32_t));
        t->n = keep;
        for (uint32_t x = 1 + below(30); x > 0; x--) t->tok[t->n++] = rtok();
        size_t nc = 0;
        PM_OK(pkvm_prefill(w->e, t->id, 0, t->tok, t->n, t->logits, &nc));
        cr_assert(nc <= t->n - 1 && nc % bs == 0);
        hit += nc;
        same_tokens(w, i);
        check_seq(w, i, "prefill");
    }
    cr_assert(hit > 0, "%sno prompt attached a cached prefix", pt_ctx);

    /* 2. Batched greedy decode. */
    for (int k = 0; k < 3; k++) step_all(w, "decode");

    /* 3. Fork: the child starts from the second-best token. */
    {
        size_t p = 0, ch = add_seq(w, 200);
        PT_OK(pkv_seq_fork(w->c, w->s[p].id, w->s[ch].id));
        memcpy(w->s[ch].tok, w->s[p].tok, w->s[p].n * sizeof(uint32_t));
        w->s[ch].n = w->s[p].n;
        uint32_t tok = pkvm_rank(w->s[p].logits, PKVM_VOCAB, 1);
        cr_assert_neq(tok, pkvm_argmax(w->s[p].logits, PKVM_VOCAB));
        PM_OK(pkvm_extend(w->e, w->s[ch].id, &tok, 1, w->s[ch].logits));
        w->s[ch].tok[w->s[ch].n++] = tok;
        check_seq(w, ch, "fork");
        for (int k = 0; k < 2; k++) step_all(w, "decode after fork");
    }

    /* 4. Truncations, then new tokens. */
    for (size_t i = 1; i <= 3; i++) {
        tseq *t = &w->s[i];
        size_t nl;
        if (i == 1) nl = t->n - 1 - below((uint32_t)(t->n - 1) / 2);  /* a few tokens */
        else if (i == 2) nl = (t->n - 1) / bs * bs;                  /* block boundary */
        else nl = 1 + below((uint32_t)t->n - 1);                     /* anywhere */
        if (nl == 0) nl = 1;
        PT_OK(pkv_seq_truncate(w->c, t->id, nl));
        t->n = nl;
        same_tokens(w, i);
        uint32_t extra[9];
        const size_t ne = 1 + below(9);
        for (size_t k = 0; k < ne; k++) extra[k] = rtok();
        PM_OK(pkvm_extend(w->e, t->id, extra, ne, t->logits));
        memcpy(t->tok + t->n, extra, ne * sizeof(uint32_t));
        t->n += ne;
        check_seq(w, i, "truncate");
    }
    /* Pending tokens only: append without computing, cut them off, continue. */
    {
        tseq *t = &w->s[4];
        pkv_slot sl[5];
        uint32_t junk[5] = {1, 2, 3, 4, 5};
        PT_OK(pkv_seq_append(w->c, t->id, junk, 5, sl));
        PT_OK(pkv_seq_truncate(w->c, t->id, t->n));
        same_tokens(w, 4);
    }
    step_all(w, "decode after truncate");
    PT_CHECK(w->c);

    /* 5. Close and reopen the cache; recovered sequences continue. */
    pkvm_engine_free(w->e);
    pkv_close(w->c);
    w->c = NULL;
    PT_OK(pkv_open(dir, &o, &w->c));
    PM_OK(pkvm_engine_create(w->m, w->c, &w->e));
    pkvm_engine_set_chunk(w->e, 23);
    uint64_t ids[MAX_SEQ];
    size_t nids = 0, live = 0;
    PT_OK(pkv_seq_list(w->c, ids, MAX_SEQ, &nids));
    for (size_t i = 0; i < MAX_SEQ; i++)
        if (w->s[i].live) {
            live++;
            int found = 0;
            for (size_t k = 0; k < nids; k++) found |= ids[k] == w->s[i].id;
            cr_assert(found, "%ssequence %llu not recovered", pt_ctx,
                      (unsigned long long)w->s[i].id);
            same_tokens(w, i);
        }
    cr_assert_eq(nids, live);
    for (int k = 0; k < 2; k++) step_all(w, "decode after reopen");
    {
        size_t i = add_seq(w, 300);
        tseq *t = &w->s[i];
        memcpy(t->tok, prefix, 64 * sizeof(uint32_t));
        t->n = 64;
        t->tok[t->n++] = rtok();
        size_t nc = 0;
        PM_OK(pkvm_prefill(w->e, t->id, 0, t->tok, t->n, t->logits, &nc));
        cr_assert(nc >= bs, "%sthe recovered prefix was not hit (%zu tokens)", pt_ctx, nc);
        check_seq(w, i, "prefill after reopen");
    }
    step_all(w, "final decode");
    PT_CHECK(w->c);
    for (size_t i = 0; i < MAX_SEQ; i++)
        if (w->s[i].live) PT_OK(pkv_seq_close(w->c, w->s[i].id));
    PT_CHECK(w->c);
    if (w->f32)
        cr_log_info("%s%zu checks; worst relative logit error vs f32 KV: %.3g", pt_ctx,
                    w->checks, w->worst);
    pkvm_engine_free(w->e);
    pkv_close(w->c);
    pkvm_scratch_free(w->same);
    pkvm_scratch_free(w->f32);
    pkvm_free(w->m);
    free(w);
}

Test(model, paged_equals_scratch_f32) {
    scenario(PKV_F32, 16, 1, 1, 0);
    scenario(PKV_F32, 5, 2, 1, 0);
}

Test(model, paged_equals_scratch_f16) {
    scenario(PKV_F16, 16, 3, 1, 0);
    scenario(PKV_F16, 5, 4, 1, 0);
}

Test(model, paged_equals_scratch_bf16) {
    scenario(PKV_BF16, 16, 5, 1, 0);
    scenario(PKV_BF16, 7, 6, 1, 0);
}

Test(model, threads_and_portable_attention) {
    scenario(PKV_F32, 16, 7, 2, 0);
    scenario(PKV_F16, 4, 8, 1, PKV_ATTN_PORTABLE);
}

/* The same tokens give the same logits whatever the thread count. */
Test(model, threads_do_not_change_logits) {
    pkvm_model *a = tiny(1, 0), *b = tiny(3, 0);
    pkvm_scratch *sa, *sb;
    PM_OK(pkvm_scratch_create(a, PKV_F16, 300, &sa));
    PM_OK(pkvm_scratch_create(b, PKV_F16, 300, &sb));
    uint32_t tok[300];
    rs = 9;
    for (int i = 0; i < 300; i++) tok[i] = rtok();
    float *la = malloc(300 * PKVM_VOCAB * 4), *lb = malloc(300 * PKVM_VOCAB * 4), x[PKVM_VOCAB];
    cr_assert(la && lb);
    PM_OK(pkvm_scratch_run(sa, tok, 300, x, la));
    PM_OK(pkvm_scratch_run(sb, tok, 300, x, lb));
    cr_assert_eq(memcmp(la, lb, 300 * PKVM_VOCAB * 4), 0);
    /* Every prefix gives the logits the whole run gave at that position. */
    for (size_t n = 1; n <= 300; n += 37) {
        PM_OK(pkvm_scratch_run(sa, tok, n, x, NULL));
        cr_assert_eq(memcmp(x, la + (n - 1) * PKVM_VOCAB, sizeof x), 0, "prefix %zu", n);
    }
    free(la), free(lb);
    pkvm_scratch_free(sa), pkvm_scratch_free(sb);
    pkvm_free(a), pkvm_free(b);
}

/* Negative control: the comparison sees a single changed K element in a cached
 * block that a later prompt attaches. */
Test(model, comparison_detects_corrupted_cached_kv) {
    pkvm_model *m = tiny(1, 0);
    char id[256];
    pkv_options o;
    cache_opts(&o, m, PKV_F32, 16, id, sizeof id);
    pkv_cache *c = pt_open_sub("cache", &o);
    pkvm_engine *e;
    PM_OK(pkvm_engine_create(m, c, &e));
    pkvm_scratch *s;
    PM_OK(pkvm_scratch_create(m, PKV_F32, 64, &s));
    uint32_t tok[40];
    rs = 10;
    for (int i = 0; i < 40; i++) tok[i] = rtok();
    float a[PKVM_VOCAB], b[PKVM_VOCAB];
    size_t nc;
    PM_OK(pkvm_prefill(e, 1, 0, tok, 40, a, &nc));
    PM_OK(pkvm_scratch_run(s, tok, 40, b, NULL));
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    PT_OK(pkv_seq_close(c, 1));
    /* Same prompt again: 32 tokens attached from the cache. */
    PM_OK(pkvm_prefill(e, 2, 0, tok, 40, a, &nc));
    cr_assert_eq(nc, 32);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    uint32_t blocks[3];
    PT_OK(pkv_seq_blocks(c, 2, blocks, 3, NULL));
    PT_OK(pkv_seq_close(c, 2));
    float *k = pkv_kv(c, blocks[1], 1, PKV_K, 0); /* layer 1, head 0, token 16+3 */
    k[3 * 16 + 5] += 0.5f;
    PM_OK(pkvm_prefill(e, 3, 0, tok, 40, a, &nc));
    cr_assert_eq(nc, 32);
    cr_assert_neq(memcmp(a, b, sizeof a), 0, "a corrupted cached K element went unnoticed");
    pkvm_scratch_free(s);
    pkvm_engine_free(e);
    pkvm_free(m);
}

Test(model, presets_ids_and_errors) {
    pkvm_config cfg;
    PM_OK(pkvm_preset("default", &cfg));
    cr_assert_eq(cfg.n_layers, 8);
    cr_assert_eq(cfg.dim, 512);
    cr_assert_eq(cfg.n_heads % cfg.n_kv_heads, 0);
    cr_assert_gt(cfg.n_heads, cfg.n_kv_heads);
    PM_OK(pkvm_preset("small", &cfg));
    cr_assert_eq(pkvm_preset("huge", &cfg), PKV_EINVAL);
    PM_OK(pkvm_preset("tiny", &cfg));
    pkvm_config bad = cfg;
    bad.n_heads = 3;
    pkvm_model *m = NULL;
    cr_assert_eq(pkvm_create(&bad, &m), PKV_EINVAL);
    bad = cfg, bad.head_dim = 15;
    cr_assert_eq(pkvm_create(&bad, &m), PKV_EINVAL);
    bad = cfg, bad.vocab = 100;
    cr_assert_eq(pkvm_create(&bad, &m), PKV_EINVAL);

    m = tiny(1, 0);
    char a[256], b[256];
    pkvm_model_id(m, PKV_F16, a, sizeof a);
    pkvm_model_id(m, PKV_BF16, b, sizeof b);
    cr_assert(strcmp(a, b) != 0);
    cr_assert(strlen(a) <= PKV_MODEL_ID_MAX);

    /* A cache of another geometry is refused. */
    pkv_options o;
    pt_opts(&o, 3, 2, 16, 16, PKV_F16, 64);
    pkv_cache *c = pt_open_sub("other", &o);
    pkvm_engine *e = NULL;
    cr_assert_eq(pkvm_engine_create(m, c, &e), PKV_EGEOMETRY);
    cr_assert_null(e);

    /* pkvm_forward validates its rows. */
    pkvm_scratch *s;
    PM_OK(pkvm_scratch_create(m, PKV_F32, 8, &s));
    uint32_t tok[9] = {PKVM_BOS, 1, 2, 3, 4, 5, 6, 7, 8};
    float lg[PKVM_VOCAB];
    cr_assert_eq(pkvm_scratch_run(s, tok, 9, lg, NULL), PKV_ERANGE);
    cr_assert_eq(pkvm_scratch_run(s, tok, 0, lg, NULL), PKV_ERANGE);
    tok[3] = PKVM_VOCAB;
    cr_assert_eq(pkvm_scratch_run(s, tok, 4, lg, NULL), PKV_EINVAL);
    pkvm_scratch_free(s);

    /* Engine calls on unknown sequences fail cleanly. */
    pkv_options_init(&o);
    pkvm_cache_geometry(m, &o);
    o.capacity = 16;
    o.model_id = a;
    o.dtype = PKV_F16;
    c = pt_open_sub("mine", &o);
    PM_OK(pkvm_engine_create(m, c, &e));
    uint32_t t1 = 5;
    uint64_t id = 77;
    cr_assert_eq(pkvm_extend(e, 77, &t1, 1, lg), PKV_ENOSEQ);
    cr_assert_eq(pkvm_step(e, &id, &t1, 1, lg), PKV_ENOSEQ);
    cr_assert_eq(pkvm_prefill(e, 1, 0, tok, 0, lg, NULL), PKV_EINVAL);
    /* A prompt that does not fit: nothing is left behind. */
    uint32_t big[400];
    for (int i = 0; i < 400; i++) big[i] = (uint32_t)i % 256;
    cr_assert_eq(pkvm_prefill(e, 1, 0, big, 400, lg, NULL), PKV_EFULL);
    pkv_seq_info inf;
    cr_assert_eq(pkv_seq_get_info(c, 1, &inf), PKV_ENOSEQ);
    PT_CHECK(c);
    pkvm_engine_free(e);
    pkvm_free(m);
}

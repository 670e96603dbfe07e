/*
 * test_real_model.c — the model of src/model/model.c on SmolLM2-135M-Instruct's
 * real weights (pkvm_create_gguf) against the transformers reference in
 * tests/data/smollm2-fixture.json, for each K/V storage type:
 * - f32 K/V: the first generated position's top-20 logits within 1e-3, and the
 *   greedy continuations token-identical;
 * - f16 and bf16 K/V: the top-20 logits within the dtype's bound (docs/model.md
 *   gives the measurements behind it), and the continuations identical or
 *   diverging only at a near-tie: where the reference token beats ours by no
 *   more than the bound in our own f32-K/V logits on the same prefix;
 * - the q8 kernel (8-bit activations), with f32 and f16 K/V: the same checks
 *   with its own bound (the divergence check's stand-in runs the exact kernel).
 * The prompts of up to 64 tokens run by default; the 2,238-token one too when
 * PKV_TEST_LONG=1 (minutes on two cores). Skipped when the model file is absent.
 */
#include "fixture_json.h"
#include "gguf.h"
#include "model.h"
#include "model_file.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per K/V dtype: the largest |logit - reference| a prompt may show, and whether
 * a continuation may leave the reference at a near-tie. f32 K/V is the issue's
 * 1e-3 with no divergence; the f16 and bf16 bounds are their rounding's measured
 * effect with a safety factor (docs/model.md, "f16 and bf16 K/V"). */
typedef struct tolerance {
    pkv_dtype dt;
    const char *name;
    double bound;
    int may_diverge;
    pkvm_kernel kernel;
} tolerance;

static const tolerance TOL_F32 = {PKV_F32, "f32", 1e-3, 0, PKVM_KERNEL_EXACT};
static const tolerance TOL_F16 = {PKV_F16, "f16", 0.03, 1, PKVM_KERNEL_EXACT};
static const tolerance TOL_BF16 = {PKV_BF16, "bf16", 0.25, 1, PKVM_KERNEL_EXACT};
/* 8-bit activations (the q8 kernel, docs/model.md "The q8 kernel"), with f32 K/V
 * and with the f16 K/V the demo stores: the largest measured |delta| is 1.11
 * (llama.cpp, with the same rounding, shows 0.54 on that prompt); the bound is
 * about 2.7 times that. Divergences are allowed only at near-ties below it. */
static const tolerance TOL_Q8_F32 = {PKV_F32, "f32 (q8 kernel)", 3.0, 1, PKVM_KERNEL_Q8};
static const tolerance TOL_Q8_F16 = {PKV_F16, "f16 (q8 kernel)", 3.0, 1, PKVM_KERNEL_Q8};

/* A contiguous K/V buffer of dtype dt for max_ctx tokens, seen as one block. */
typedef struct kvbuf {
    pkv_kv_view v;
    void *buf;
    uint32_t table[1];
} kvbuf;

static void kv_init(kvbuf *k, const pkvm_config *c, size_t max_ctx, pkv_dtype dt) {
    const size_t row = (size_t)c->head_dim * (dt == PKV_F32 ? 4 : 2), head = max_ctx * row,
                 kind = head * c->n_kv_heads, layer = 2 * kind, bytes = layer * c->n_layers;
    k->buf = calloc(1, bytes);
    cr_assert_not_null(k->buf);
    k->table[0] = 0;
    k->v = (pkv_kv_view){.base = k->buf, .dtype = dt, .num_layers = c->n_layers,
                         .num_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                         .block_size = (uint32_t)max_ctx, .num_blocks = 1,
                         .block_stride = bytes, .layer_stride = layer, .kind_stride = kind,
                         .head_stride = head, .token_stride = row};
}

/* Run tokens[from..to) (positions from..to-1); logits of the last one. */
static void run(pkvm_model *m, kvbuf *k, const uint32_t *tokens, size_t from, size_t to,
                float *logits) {
    pkvm_row rows[128];
    for (size_t p0 = from; p0 < to; p0 += 128) {
        size_t n = to - p0 < 128 ? to - p0 : 128;
        for (size_t i = 0; i < n; i++) {
            size_t p = p0 + i;
            rows[i] = (pkvm_row){.token = tokens[p], .pos = (uint32_t)p,
                                 .slot = {0, (uint32_t)p}, .table = k->table, .n_table = 1,
                                 .logits = p == to - 1 ? logits : NULL};
        }
        cr_assert_eq(pkvm_forward(m, &k->v, rows, n), 0, "%s", pkvm_last_error());
    }
}

/* The largest logit other than logits[except] (the runner-up when `except` is
 * the argmax); linear, where pkvm_rank is quadratic in the vocabulary. */
static uint32_t best_other(const float *logits, uint32_t vocab, uint32_t except) {
    uint32_t b = except == 0 ? 1 : 0;
    for (uint32_t i = 0; i < vocab; i++)
        if (i != except && logits[i] > logits[b]) b = i;
    return b;
}

/* Our continuation left the reference at token j (ours `got`, the reference's
 * `want`): f32 K/V on the same prefix stands in for the reference's logits there
 * (the f32 test holds it to the reference); it must pick `want`, leading `got`
 * by no more than the bound, so the top-2 margin is below the bound too. */
static void check_divergence(pkvm_model *m, const uint32_t *toks, size_t upto, uint32_t got,
                             uint32_t want, const tolerance *t, const char *name, size_t j) {
    const pkvm_config *c = pkvm_config_of(m);
    float *ref = malloc(c->vocab * sizeof *ref);
    kvbuf k;
    kv_init(&k, c, upto, PKV_F32);
    cr_assert_eq(pkvm_set_kernel(m, PKVM_KERNEL_EXACT), 0);
    run(m, &k, toks, 0, upto, ref);
    cr_assert_eq(pkvm_set_kernel(m, t->kernel), 0);
    uint32_t top = pkvm_argmax(ref, c->vocab);
    double gap = (double)ref[want] - ref[got],
           margin = (double)ref[top] - ref[best_other(ref, c->vocab, top)];
    cr_log_info("%s, %s K/V: greedy token %zu is %u, reference %u; in f32-K/V logits the "
                "reference leads it by %.3g (top-2 margin %.3g)", name, t->name, j, got, want,
                gap, margin);
    cr_expect_eq(top, want, "%s: f32 K/V does not reproduce reference token %zu", name, j);
    cr_expect(t->may_diverge && gap <= t->bound,
              "%s, %s K/V: greedy token %zu is %u, reference %u, not at a near-tie: the "
              "reference leads by %g (bound %g)", name, t->name, j, got, want, gap, t->bound);
    free(k.buf);
    free(ref);
}

static void check_prompts(const tolerance *t, size_t max_tokens) {
    const char *path = pt_model_path();
    const char *err = NULL;
    fj *fx = fj_load(PKV_FIXTURE_DIR "/smollm2-fixture.json", &err);
    cr_assert_not_null(fx, "fixture: %s", err);
    pkv_gguf *g;
    cr_assert_eq(pkv_gguf_open(path, &g), 0, "%s", pkv_gguf_last_error());
    pkvm_model *m;
    cr_assert_eq(pkvm_create_gguf(g, &m), 0, "%s", pkvm_last_error());
    pkv_gguf_close(g);
    pkvm_set_threads(m, 2);
    cr_assert_eq(pkvm_set_kernel(m, t->kernel), 0);
    const pkvm_config *c = pkvm_config_of(m);
    cr_assert(c->n_layers == 30 && c->dim == 576 && c->n_heads == 9 && c->n_kv_heads == 3 &&
              c->head_dim == 64 && c->ffn_dim == 1536 && c->vocab == 49152);
    float *logits = malloc(c->vocab * sizeof *logits);
    const fj *prompts = fj_get(fx, "prompts");
    size_t ran = 0;
    for (size_t pi = 0; pi < prompts->len; pi++) {
        const fj *p = &prompts->item[pi];
        const fj *ids = fj_get(p, "ids"), *greedy = fj_get(p, "greedy");
        if (ids->len > max_tokens) continue;
        const char *name = fj_get(p, "name")->str;
        size_t n = ids->len, total = n + greedy->len;
        uint32_t *toks = malloc(total * sizeof *toks);
        for (size_t i = 0; i < n; i++) toks[i] = (uint32_t)ids->item[i].num;
        kvbuf k;
        kv_init(&k, c, total, t->dt);
        run(m, &k, toks, 0, n, logits);
        /* First generated position: the reference's top 20 logits. */
        const fj *tid = fj_get(p, "top20_ids"), *tv = fj_get(p, "top20_logits");
        double worst = 0;
        for (size_t j = 0; j < tid->len; j++) {
            double d = fabs((double)logits[(uint32_t)tid->item[j].num] - tv->item[j].num);
            if (d > worst) worst = d;
        }
        cr_log_info("%s (%zu tokens), %s K/V: max |delta| over the top-20 logits %.3g", name, n,
                    t->name, worst);
        cr_expect(worst <= t->bound, "%s, %s K/V: top-20 logits differ by up to %g (> %g)", name,
                  t->name, worst, t->bound);
        /* Greedy continuation. */
        size_t j = 0;
        for (; j < greedy->len; j++) {
            uint32_t want = (uint32_t)greedy->item[j].num, got = pkvm_argmax(logits, c->vocab);
            if (got != want) {
                check_divergence(m, toks, n + j, got, want, t, name, j);
                break;
            }
            toks[n + j] = got;
            if (j + 1 < greedy->len) run(m, &k, toks, n + j, n + j + 1, logits);
        }
        cr_log_info("%s, %s K/V: %zu of %zu greedy tokens identical", name, t->name, j,
                    greedy->len);
        free(k.buf);
        free(toks);
        ran++;
    }
    cr_expect(ran >= 1);
    free(logits);
    pkvm_free(m);
    fj_free(fx);
}

static void check_long(const tolerance *t) {
    const char *on = getenv("PKV_TEST_LONG");
    if (!on || strcmp(on, "1")) cr_skip_test("set PKV_TEST_LONG=1 to run the 2,238-token prompt");
    check_prompts(t, 100000);
}

Test(real_model, short_prompts_match_the_reference) { check_prompts(&TOL_F32, 64); }
Test(real_model, long_prompt_matches_the_reference) { check_long(&TOL_F32); }
Test(real_model, f16_kv_stays_within_its_bound_on_short_prompts) { check_prompts(&TOL_F16, 64); }
Test(real_model, bf16_kv_stays_within_its_bound_on_short_prompts) { check_prompts(&TOL_BF16, 64); }
Test(real_model, f16_kv_stays_within_its_bound_on_the_long_prompt) { check_long(&TOL_F16); }
Test(real_model, bf16_kv_stays_within_its_bound_on_the_long_prompt) { check_long(&TOL_BF16); }
Test(real_model, q8_kernel_stays_within_its_bound_on_short_prompts) {
    check_prompts(&TOL_Q8_F32, 64);
    check_prompts(&TOL_Q8_F16, 64);
}
Test(real_model, q8_kernel_stays_within_its_bound_on_the_long_prompt) {
    check_long(&TOL_Q8_F32);
    check_long(&TOL_Q8_F16);
}

/*
 * test_attention.c — CPU paged decode attention (src/attention.c) and the
 * f32 <-> f16/bf16 converters.
 *
 * The kernel is compared with a naive double-precision reference computed on the
 * very values stored (inputs rounded to the storage type), through random,
 * non-contiguous block tables. Every byte of the synthetic arena that no sequence
 * owns -- unused blocks, the unused slots of partially filled last blocks, other
 * layers' runs -- holds NaN, so a stray read shows up as a NaN in the output.
 *
 * Tolerance: the largest |out - ref| of a query head, divided by the largest |ref|
 * of that head. The kernel computes in f32 on exactly representable inputs, so the
 * storage type does not change its error; TOL is the bound per type
 * (f32 1e-5, f16 1e-3, bf16 1.6e-2) and every type is additionally held to
 * TOL_KERNEL = 1e-5. With huge scores the bound grows with the conditioning of the
 * f32 scores (see run_check).
 */
#include "pkv_test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(attention, .init = pt_setup, .fini = pt_teardown);

static const double TOL[3] = {1e-5, 1e-3, 1.6e-2}; /* by pkv_dtype */
#define TOL_KERNEL 1e-5

/* ---- Random numbers ---------------------------------------------------------- */

static uint64_t rs = 1;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static float frand(float a) { return (float)((2.0 * urand() - 1.0) * a); }
static uint32_t below(uint32_t n) { return (uint32_t)(rnd() % n); }

static size_t esize(pkv_dtype dt) { return dt == PKV_F32 ? 4 : 2; }
static const char *dname(pkv_dtype dt) { return dt == PKV_F32 ? "f32" : dt == PKV_F16 ? "f16" : "bf16"; }

/* ---- Converters: exhaustive and against an independent nearest-value search ---- */

/* Value of a non-negative bit pattern of a format with `mb` mantissa bits and bias
 * `bias`; the all-ones exponent is treated as a normal exponent (so the pattern of
 * infinity reads as the next power of two, which is what rounding compares with). */
static double fmt_val(uint32_t bits, int mb, int bias) {
    const uint32_t e = bits >> mb, m = bits & ((1u << mb) - 1);
    if (e == 0) return ldexp((double)m, 1 - bias - mb);
    return ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
}

/* Round finite x to the format by searching the bit patterns (monotonic in value). */
static uint16_t ref_round(float x, int mb, int bias, uint32_t inf_bits, uint32_t sign_bit) {
    double a = fabs((double)x);
    uint32_t lo = 0, hi = inf_bits; /* largest b with val(b) <= a */
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (fmt_val(mid, mb, bias) <= a) lo = mid;
        else hi = mid - 1;
    }
    uint32_t b = lo;
    if (b < inf_bits) {
        double d0 = a - fmt_val(b, mb, bias), d1 = fmt_val(b + 1, mb, bias) - a;
        if (d1 < d0 || (d1 == d0 && (b & 1))) b++;
    }
    return (uint16_t)(b | (signbit(x) ? sign_bit : 0));
}

static uint16_t ref_f16(float x) { return ref_round(x, 10, 15, 0x7c00, 0x8000); }
static uint16_t ref_bf16(float x) { return ref_round(x, 7, 127, 0x7f80, 0x8000); }

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

Test(attention, f16_round_trip_is_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = pkv_f16_to_f32((uint16_t)h);
        const uint16_t back = pkv_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) { /* NaN: stays NaN, quieted */
            cr_assert(isnan(f), "f16 %04x -> %g", h, (double)f);
            cr_assert_eq(back, h | 0x200, "NaN %04x -> %04x", h, back);
            continue;
        }
        cr_assert_eq(back, h, "f16 %04x -> %a -> %04x", h, (double)f, back);
        if ((h & 0x7c00) != 0x7c00) /* finite: the exact value */
            cr_assert_eq((double)f, (h & 0x8000 ? -1 : 1) * fmt_val(h & 0x7fff, 10, 15),
                         "f16 %04x decodes to %a", h, (double)f);
    }
}

Test(attention, bf16_round_trip_is_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = pkv_bf16_to_f32((uint16_t)h);
        cr_assert_eq(f2u(f), h << 16);
        const uint16_t back = pkv_f32_to_bf16(f);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) cr_assert_eq(back, h | 0x40);
        else cr_assert_eq(back, h, "bf16 %04x -> %04x", h, back);
    }
}

static void check_round(float x) {
    if (isnan(x)) {
        cr_assert(isnan(pkv_f16_to_f32(pkv_f32_to_f16(x))));
        cr_assert(isnan(pkv_bf16_to_f32(pkv_f32_to_bf16(x))));
        return;
    }
    uint16_t a = pkv_f32_to_f16(x), b = ref_f16(x);
    cr_assert_eq(a, b, "f32_to_f16(%a) = %04x, nearest is %04x", (double)x, a, b);
    a = pkv_f32_to_bf16(x), b = ref_bf16(x);
    cr_assert_eq(a, b, "f32_to_bf16(%a) = %04x, nearest is %04x", (double)x, a, b);
}

Test(attention, rounding_is_nearest_even) {
    rs = 11;
    /* Every f16 value, the midpoints to its neighbour (exact ties) and one f32 ulp
     * either side of them; specials and the overflow threshold. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        const double v = fmt_val(h, 10, 15), w = fmt_val(h + 1, 10, 15);
        const float mid = (float)((v + w) / 2); /* exact in f32 */
        for (int s = 0; s < 2; s++) {
            const float sg = s ? -1.0f : 1.0f;
            check_round(sg * (float)v);
            check_round(sg * mid);
            check_round(sg * nextafterf(mid, 0.0f));
            check_round(sg * nextafterf(mid, INFINITY));
        }
    }
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.99f, 65520.0f,
                        65536.0f, 1e-8f, 5.96e-8f, 2.98e-8f, 2.9802322e-08f, 3e38f,
                        3.4028235e38f, u2f(0x7f7f8000u), u2f(0x7f7fffffu), u2f(1u), u2f(0x807fffffu)};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) check_round(sp[i]);
    /* Random bit patterns, and random values in the f16 range. */
    for (int i = 0; i < 200000; i++) {
        check_round(u2f((uint32_t)rnd()));
        check_round(frand(70000.0f) * (float)ldexp(1.0, -(int)below(30)));
    }
}

Test(attention, bulk_conversion) {
    float src[37], back[37];
    uint16_t h[37];
    for (int i = 0; i < 37; i++) src[i] = frand(100.0f);
    PT_OK(pkv_kv_store(PKV_F16, h, src, 37));
    PT_OK(pkv_kv_load(PKV_F16, back, h, 37));
    for (int i = 0; i < 37; i++) cr_assert_eq(back[i], pkv_f16_to_f32(pkv_f32_to_f16(src[i])));
    PT_OK(pkv_kv_store(PKV_BF16, h, src, 37));
    PT_OK(pkv_kv_load(PKV_BF16, back, h, 37));
    for (int i = 0; i < 37; i++) cr_assert_eq(back[i], pkv_bf16_to_f32(pkv_f32_to_bf16(src[i])));
    PT_OK(pkv_kv_store(PKV_F32, back, src, 37));
    cr_assert_eq(memcmp(back, src, sizeof src), 0);
    PT_ERR(pkv_kv_store((pkv_dtype)7, h, src, 1), PKV_EINVAL);
    PT_ERR(pkv_kv_load((pkv_dtype)7, back, h, 1), PKV_EINVAL);
    PT_ERR(pkv_kv_store(PKV_F16, NULL, src, 1), PKV_EINVAL);
    PT_ERR(pkv_kv_load(PKV_F16, back, NULL, 1), PKV_EINVAL);
    PT_OK(pkv_kv_store(PKV_F16, NULL, NULL, 0));
}

/* ---- A synthetic arena ------------------------------------------------------- */

typedef struct arena {
    uint8_t *mem;
    size_t bytes;
    pkv_kv_view v;
} arena;

static void poison(uint8_t *p, size_t bytes, pkv_dtype dt) {
    const uint32_t n32 = 0x7fc00000u;
    const uint16_t n16 = dt == PKV_F16 ? 0x7e00u : 0x7fc0u;
    for (size_t i = 0; i + esize(dt) <= bytes; i += esize(dt))
        memcpy(p + i, dt == PKV_F32 ? (const void *)&n32 : (const void *)&n16, esize(dt));
}

/* pagedkv's slot layout [layer][K|V][head][token][dim], optionally with `pad`
 * elements after every token row and a page-rounded slot. */
static void arena_init(arena *a, pkv_dtype dt, uint32_t L, uint32_t H, uint32_t D, uint32_t bs,
                       uint64_t nblocks, uint32_t pad) {
    const size_t es = esize(dt);
    pkv_kv_view *v = &a->v;
    memset(a, 0, sizeof *a);
    v->dtype = dt;
    v->num_layers = L, v->num_kv_heads = H, v->head_dim = D, v->block_size = bs;
    v->num_blocks = nblocks;
    v->token_stride = (size_t)(D + pad) * es;
    v->head_stride = v->token_stride * bs;
    v->kind_stride = v->head_stride * H;
    v->layer_stride = v->kind_stride * 2;
    v->block_stride = (v->layer_stride * L + 4095) / 4096 * 4096;
    a->bytes = v->block_stride * nblocks;
    a->mem = malloc(a->bytes);
    cr_assert_not_null(a->mem);
    poison(a->mem, a->bytes, dt);
    v->base = a->mem;
}

static uint8_t *row_at(const pkv_kv_view *v, uint32_t block, uint32_t layer, int kind,
                       uint32_t head, uint32_t tok) {
    return (uint8_t *)(uintptr_t)v->base + block * v->block_stride + layer * v->layer_stride +
           (size_t)kind * v->kind_stride + head * v->head_stride + tok * v->token_stride;
}

/* A sequence: a random table of distinct blocks, and the K/V it stores (as f32 values
 * of the stored elements) for `layer`: kv[kind][head][t][d]. */
typedef struct tseq {
    uint32_t *table;
    size_t n_blocks, len;
    float *kv;
} tseq;

/* Give each sequence distinct blocks drawn from a shuffled pool, and write random
 * K/V (amplitude kamp for K) into its len token rows of layer `layer` only. */
static void make_seqs(arena *a, tseq *s, const size_t *lens, size_t n, uint32_t layer,
                      float kamp) {
    const pkv_kv_view *v = &a->v;
    uint32_t *pool = malloc(v->num_blocks * sizeof *pool);
    cr_assert_not_null(pool);
    for (uint32_t i = 0; i < v->num_blocks; i++) pool[i] = i;
    for (uint32_t i = (uint32_t)v->num_blocks - 1; i > 0; i--) {
        uint32_t j = below(i + 1), t = pool[i];
        pool[i] = pool[j], pool[j] = t;
    }
    size_t next = 0;
    const uint32_t H = v->num_kv_heads, D = v->head_dim, bs = v->block_size;
    for (size_t i = 0; i < n; i++) {
        s[i].len = lens[i];
        s[i].n_blocks = (lens[i] + bs - 1) / bs;
        cr_assert(next + s[i].n_blocks <= v->num_blocks, "arena too small");
        s[i].table = malloc(s[i].n_blocks * sizeof(uint32_t));
        s[i].kv = malloc(2 * H * lens[i] * D * sizeof(float));
        cr_assert(s[i].table && s[i].kv);
        memcpy(s[i].table, pool + next, s[i].n_blocks * sizeof(uint32_t));
        next += s[i].n_blocks;
        float tmp[1024];
        cr_assert(D <= 1024);
        for (int k = 0; k < 2; k++)
            for (uint32_t h = 0; h < H; h++)
                for (size_t t = 0; t < lens[i]; t++) {
                    for (uint32_t d = 0; d < D; d++) tmp[d] = frand(k ? 1.0f : kamp);
                    uint8_t *dst = row_at(v, s[i].table[t / bs], layer, k, h, (uint32_t)(t % bs));
                    PT_OK(pkv_kv_store(v->dtype, dst, tmp, D));
                    PT_OK(pkv_kv_load(v->dtype, s[i].kv + ((k * H + h) * lens[i] + t) * D, dst, D));
                }
    }
    free(pool);
}

static void free_seqs(tseq *s, size_t n) {
    for (size_t i = 0; i < n; i++) free(s[i].table), free(s[i].kv);
}

/* Naive double reference for one sequence and query head. Returns the largest
 * scale * sum_d |q_d k_d| (the conditioning of the f32 scores). */
static double reference(const tseq *s, uint32_t H, uint32_t D, uint32_t kvh, const float *q,
                        double scale, double *out) {
    double *sc = malloc(s->len * sizeof(double));
    cr_assert_not_null(sc);
    double m = -INFINITY, cond = 0;
    for (size_t t = 0; t < s->len; t++) {
        const float *k = s->kv + ((0 * H + kvh) * s->len + t) * D;
        double d = 0, a = 0;
        for (uint32_t i = 0; i < D; i++) d += (double)q[i] * k[i], a += fabs((double)q[i] * k[i]);
        sc[t] = d * scale;
        if (sc[t] > m) m = sc[t];
        if (a * scale > cond) cond = a * scale;
    }
    double sum = 0;
    for (uint32_t i = 0; i < D; i++) out[i] = 0;
    for (size_t t = 0; t < s->len; t++) {
        const double p = exp(sc[t] - m);
        sum += p;
        const float *vv = s->kv + ((1 * H + kvh) * s->len + t) * D;
        for (uint32_t i = 0; i < D; i++) out[i] += p * vv[i];
    }
    for (uint32_t i = 0; i < D; i++) out[i] /= sum;
    free(sc);
    return cond;
}

static double g_worst[3]; /* worst relative error seen per dtype */

/* Run the kernel over seqs and compare every head with the reference. */
static void run_check(const arena *a, tseq *s, size_t n, uint32_t layer, uint32_t nq,
                      float qamp, uint32_t flags, uint32_t threads, const char *what) {
    const pkv_kv_view *v = &a->v;
    const uint32_t D = v->head_dim, H = v->num_kv_heads, g = nq / H;
    float *q = malloc(n * nq * D * sizeof(float)), *out = malloc(n * nq * D * sizeof(float));
    pkv_attn_seq *as = malloc(n * sizeof *as);
    double *ref = malloc(D * sizeof(double));
    cr_assert(q && out && as && ref);
    for (size_t i = 0; i < n * nq * D; i++) q[i] = frand(qamp);
    for (size_t i = 0; i < n; i++) as[i] = (pkv_attn_seq){s[i].table, s[i].n_blocks, s[i].len};
    const float scale = 1.0f / sqrtf((float)D);
    pkv_attn_params p = {.layer = layer, .num_q_heads = nq, .scale = scale,
                         .num_threads = threads, .flags = flags};
    PT_OK(pkv_attn_decode(v, &p, as, n, q, out));
    const double tol = TOL[v->dtype] < TOL_KERNEL ? TOL[v->dtype] : TOL_KERNEL;
    for (size_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < nq; h++) {
            const double cond = reference(&s[i], H, D, h / g, q + (i * nq + h) * D, scale, ref);
            /* f32 scores carry an absolute error of order eps * cond, which exp()
             * turns into that relative error of the weights: no f32 kernel does
             * better, so the bound never goes below it. */
            const double bound = fmax(tol, 4.0 * FLT_EPSILON * cond);
            const float *o = out + (i * nq + h) * D;
            double big = 0, err = 0;
            for (uint32_t d = 0; d < D; d++) {
                cr_assert(isfinite(o[d]), "%s: %s len %zu head %u dim %u: %g (stray read?)", what,
                          dname(v->dtype), s[i].len, h, d, (double)o[d]);
                big = fmax(big, fabs(ref[d]));
                err = fmax(err, fabs(o[d] - ref[d]));
            }
            const double rel = big > 0 ? err / big : err;
            if (rel > g_worst[v->dtype]) g_worst[v->dtype] = rel;
            cr_assert(rel <= bound,
                      "%s: %s bs %u D %u nq %u nkv %u len %zu head %u flags %u: rel err %.3g > %.3g",
                      what, dname(v->dtype), v->block_size, D, nq, H, s[i].len, h, flags, rel,
                      bound);
        }
    free(q), free(out), free(as), free(ref);
}

static const pkv_dtype DTS[3] = {PKV_F32, PKV_F16, PKV_BF16};

Test(attention, edge_lengths_all_types_and_paths) {
    rs = 21;
    const uint32_t bss[] = {1, 7, 16};
    const uint32_t dims[] = {16, 12, 64};
    const uint32_t heads[][2] = {{1, 1}, {4, 2}, {8, 1}, {6, 3}};
    for (int di = 0; di < 3; di++)
        for (size_t bi = 0; bi < 3; bi++)
            for (size_t hi = 0; hi < 4; hi++) {
                const uint32_t bs = bss[bi], D = dims[(bi + hi) % 3];
                const uint32_t nq = heads[hi][0], H = heads[hi][1];
                size_t lens[] = {1, bs > 1 ? bs - 1 : 2, bs, bs + 1, 3 * bs + 5, 2 * bs};
                const size_t n = sizeof lens / sizeof lens[0];
                arena a;
                arena_init(&a, DTS[di], 3, H, D, bs, 128, (uint32_t)(hi & 1) * 3);
                tseq s[6];
                make_seqs(&a, s, lens, n, 1, 1.0f);
                for (uint32_t f = 0; f < 2; f++)
                    run_check(&a, s, n, 1, nq, 1.0f, f ? PKV_ATTN_PORTABLE : 0, 1, "edges");
                free_seqs(s, n);
                free(a.mem);
            }
}

Test(attention, long_contexts) {
    rs = 31;
    for (int di = 0; di < 3; di++) {
        /* 9001 tokens: nine softmax segments of 1024, the max rescaled as it grows. */
        size_t lens[] = {4096, 9001, 16, 1000};
        arena a;
        arena_init(&a, DTS[di], 2, 2, 64, 16, 950, 0);
        tseq s[4];
        make_seqs(&a, s, lens, 4, 0, 2.0f);
        for (uint32_t f = 0; f < 2; f++)
            run_check(&a, s, 4, 0, 4, 1.0f, f ? PKV_ATTN_PORTABLE : 0, 1, "long");
        free_seqs(s, 4);
        free(a.mem);
    }
    cr_log_info("worst relative error: f32 %.3g, f16 %.3g, bf16 %.3g", g_worst[0], g_worst[1],
                g_worst[2]);
}

Test(attention, large_scores_do_not_overflow) {
    rs = 41;
    for (int di = 0; di < 3; di++) {
        size_t lens[] = {300, 17};
        arena a;
        arena_init(&a, DTS[di], 1, 1, 32, 16, 64, 0);
        tseq s[2];
        make_seqs(&a, s, lens, 2, 0, 50.0f); /* scores up to ~|q||k| ~ 1e4: exp overflows */
        for (uint32_t f = 0; f < 2; f++)
            run_check(&a, s, 2, 0, 2, 40.0f, f ? PKV_ATTN_PORTABLE : 0, 1, "large scores");
        free_seqs(s, 2);
        free(a.mem);
    }
}

/* The same K/V in a paged layout and in one contiguous block, threads 1 and 3, a
 * batch and each sequence alone: every output bit is the same. */
Test(attention, result_independent_of_layout_batch_and_threads) {
    rs = 51;
    for (int di = 0; di < 3; di++)
        for (uint32_t f = 0; f < 2; f++) {
            const uint32_t D = 32, H = 2, nq = 4, bs = 16;
            size_t lens[] = {70, 1, 129, 64, 300};
            const size_t n = 5;
            arena a;
            arena_init(&a, DTS[di], 1, H, D, bs, 64, 0);
            tseq s[5];
            make_seqs(&a, s, lens, n, 0, 1.0f);
            float *q = malloc(n * nq * D * 4), *o1 = malloc(n * nq * D * 4),
                  *o2 = malloc(n * nq * D * 4), *o3 = malloc(n * nq * D * 4);
            cr_assert(q && o1 && o2 && o3);
            for (size_t i = 0; i < n * nq * D; i++) q[i] = frand(1.0f);
            pkv_attn_seq as[5];
            for (size_t i = 0; i < n; i++) as[i] = (pkv_attn_seq){s[i].table, s[i].n_blocks, s[i].len};
            pkv_attn_params p = {.layer = 0, .num_q_heads = nq, .scale = 0.17f, .num_threads = 1,
                                 .flags = f ? PKV_ATTN_PORTABLE : 0};
            PT_OK(pkv_attn_decode(&a.v, &p, as, n, q, o1));
            p.num_threads = 3;
            PT_OK(pkv_attn_decode(&a.v, &p, as, n, q, o2));
            cr_assert_eq(memcmp(o1, o2, n * nq * D * 4), 0, "threads change the result");
            p.num_threads = 1;
            for (size_t i = 0; i < n; i++) { /* one at a time */
                PT_OK(pkv_attn_decode(&a.v, &p, &as[i], 1, q + i * nq * D, o2 + i * nq * D));
            }
            cr_assert_eq(memcmp(o1, o2, n * nq * D * 4), 0, "batching changes the result");
            /* Contiguous copy: each sequence as one block of 512 tokens. */
            arena c;
            arena_init(&c, DTS[di], 1, H, D, 512, n, 2);
            pkv_attn_seq cs[5];
            uint32_t ids[5];
            for (size_t i = 0; i < n; i++) {
                ids[i] = (uint32_t)(n - 1 - i);
                for (int k = 0; k < 2; k++)
                    for (uint32_t h = 0; h < H; h++)
                        for (size_t t = 0; t < s[i].len; t++)
                            memcpy(row_at(&c.v, ids[i], 0, k, h, (uint32_t)t),
                                   row_at(&a.v, s[i].table[t / bs], 0, k, h, (uint32_t)(t % bs)),
                                   D * esize(DTS[di]));
                cs[i] = (pkv_attn_seq){&ids[i], 1, s[i].len};
            }
            PT_OK(pkv_attn_decode(&c.v, &p, cs, n, q, o3));
            cr_assert_eq(memcmp(o1, o3, n * nq * D * 4), 0, "block layout changes the result");
            /* out == q is allowed. */
            memcpy(o2, q, n * nq * D * 4);
            PT_OK(pkv_attn_decode(&a.v, &p, as, n, o2, o2));
            cr_assert_eq(memcmp(o1, o2, n * nq * D * 4), 0, "out == q");
            free(q), free(o1), free(o2), free(o3);
            free(c.mem);
            free_seqs(s, n);
            free(a.mem);
        }
}

/* Positive control for the NaN poisoning: attending one token further than written
 * reads a poisoned slot, and the output shows it. */
Test(attention, poison_is_visible) {
    rs = 61;
    for (int di = 0; di < 3; di++)
        for (uint32_t f = 0; f < 2; f++) {
            size_t lens[] = {21};
            arena a;
            arena_init(&a, DTS[di], 1, 1, 16, 16, 8, 0);
            tseq s[1];
            make_seqs(&a, s, lens, 1, 0, 1.0f);
            float q[16], o[16];
            for (int i = 0; i < 16; i++) q[i] = frand(1.0f);
            pkv_attn_seq as = {s[0].table, s[0].n_blocks, 22};
            pkv_attn_params p = {.num_q_heads = 1, .scale = 0.25f,
                                 .flags = f ? PKV_ATTN_PORTABLE : 0};
            PT_OK(pkv_attn_decode(&a.v, &p, &as, 1, q, o));
            cr_assert(isnan(o[0]), "reading a poisoned slot did not show");
            /* Only K poisoned (V of the slot finite): still shows. */
            float ones[16];
            for (int i = 0; i < 16; i++) ones[i] = 1.0f;
            PT_OK(pkv_kv_store(DTS[di], row_at(&a.v, s[0].table[1], 0, 1, 0, 5), ones, 16));
            PT_OK(pkv_attn_decode(&a.v, &p, &as, 1, q, o));
            cr_assert(isnan(o[0]), "reading a poisoned K did not show");
            as.len = 21;
            PT_OK(pkv_attn_decode(&a.v, &p, &as, 1, q, o));
            cr_assert(isfinite(o[0]));
            free_seqs(s, 1);
            free(a.mem);
        }
}

Test(attention, argument_validation) {
    rs = 71;
    arena a;
    arena_init(&a, PKV_F16, 2, 2, 16, 4, 8, 0);
    size_t lens[] = {9};
    tseq s[1];
    make_seqs(&a, s, lens, 1, 0, 1.0f);
    float q[64], o[64];
    for (int i = 0; i < 64; i++) q[i] = frand(1.0f);
    pkv_attn_seq as = {s[0].table, s[0].n_blocks, 9};
    pkv_attn_params p = {.layer = 0, .num_q_heads = 4, .scale = 0.25f};
    PT_OK(pkv_attn_decode(&a.v, &p, &as, 1, q, o));
    PT_OK(pkv_attn_decode(&a.v, &p, NULL, 0, NULL, NULL)); /* empty batch */

    PT_ERR(pkv_attn_decode(NULL, &p, &as, 1, q, o), PKV_EINVAL);
    PT_ERR(pkv_attn_decode(&a.v, NULL, &as, 1, q, o), PKV_EINVAL);
    PT_ERR(pkv_attn_decode(&a.v, &p, NULL, 1, q, o), PKV_EINVAL);
    PT_ERR(pkv_attn_decode(&a.v, &p, &as, 1, NULL, o), PKV_EINVAL);
    PT_ERR(pkv_attn_decode(&a.v, &p, &as, 1, q, NULL), PKV_EINVAL);
    cr_assert(strlen(pkv_last_error()) > 0);

    pkv_attn_params bp = p;
    bp.layer = 2;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.num_q_heads = 3;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.num_q_heads = 0;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.scale = NAN;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.scale = INFINITY;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.flags = 0x80;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);
    bp = p, bp.num_threads = 100000;
    PT_ERR(pkv_attn_decode(&a.v, &bp, &as, 1, q, o), PKV_EINVAL);

    pkv_attn_seq bs = as;
    bs.len = 0;
    PT_ERR(pkv_attn_decode(&a.v, &p, &bs, 1, q, o), PKV_EINVAL);
    bs = as, bs.blocks = NULL;
    PT_ERR(pkv_attn_decode(&a.v, &p, &bs, 1, q, o), PKV_EINVAL);
    bs = as, bs.n_blocks = 2; /* 9 tokens need 3 blocks of 4 */
    PT_ERR(pkv_attn_decode(&a.v, &p, &bs, 1, q, o), PKV_ERANGE);
    bs = as, bs.len = 13;
    PT_ERR(pkv_attn_decode(&a.v, &p, &bs, 1, q, o), PKV_ERANGE);
    uint32_t bad[3] = {s[0].table[0], 8, s[0].table[2]};
    bs = as, bs.blocks = bad;
    PT_ERR(pkv_attn_decode(&a.v, &p, &bs, 1, q, o), PKV_ERANGE);
    /* A bad entry beyond what len needs is not read. */
    uint32_t extra[4] = {s[0].table[0], s[0].table[1], s[0].table[2], 1000000};
    bs = as, bs.blocks = extra, bs.n_blocks = 4;
    PT_OK(pkv_attn_decode(&a.v, &p, &bs, 1, q, o));

    pkv_kv_view v = a.v;
    v.base = NULL;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.dtype = (pkv_dtype)3;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.num_layers = 0;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.num_kv_heads = 0;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.head_dim = 0;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.block_size = 0;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.num_blocks = 0;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.token_stride = 2 * 16 - 2; /* rows would overlap */
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.head_stride += 1; /* misaligned */
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.block_stride = SIZE_MAX / 2;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    v = a.v, v.base = (const uint8_t *)a.v.base + 1;
    PT_ERR(pkv_attn_decode(&v, &p, &as, 1, q, o), PKV_EINVAL);
    PT_ERR(pkv_kv_view_of(NULL, &v), PKV_EINVAL);
    free_seqs(s, 1);
    free(a.mem);
}

/* Through a real cache: sequences built with pkv_seq_append (forks and
 * copy-on-write included), K/V written into the returned slots, attention through
 * pkv_kv_view_of and the tables from pkv_seq_blocks. */
Test(attention, real_cache) {
    rs = 81;
    for (int di = 0; di < 3; di++) {
        const uint32_t L = 2, H = 2, D = 32, bs = 16, nq = 6;
        pkv_options o;
        pt_opts(&o, L, H, D, bs, DTS[di], 256);
        char sub[16];
        snprintf(sub, sizeof sub, "c%d", di);
        pkv_cache *c = pt_open_sub(sub, &o);
        pkv_kv_view v;
        PT_OK(pkv_kv_view_of(c, &v));
        cr_assert_eq(v.num_blocks, 256);
        for (uint32_t b = 0; b < 256; b += 37)
            for (uint32_t l = 0; l < L; l++)
                for (int k = 0; k < 2; k++)
                    for (uint32_t h = 0; h < H; h++)
                        cr_assert_eq((void *)row_at(&v, b, l, k, h, 0),
                                     pkv_kv(c, b, l, (pkv_kind)k, h));
        /* Poison the whole arena, then write each sequence's rows. */
        poison((uint8_t *)(uintptr_t)v.base, v.block_stride * v.num_blocks, v.dtype);
        /* Sequence 1: 75 tokens; 2: fork of 1 + 30 own; 3: 16 tokens. */
        const size_t ns = 3, lens[3] = {75, 105, 16};
        tseq s[3];
        uint32_t tok[200];
        for (int i = 0; i < 200; i++) tok[i] = below(1000);
        float *vals = malloc(2 * H * 200 * D * sizeof(float)); /* [k][h][pos][d] of seq 1 */
        cr_assert_not_null(vals);
        pkv_slot slots[200];
        size_t nc;
        PT_OK(pkv_seq_open(c, 1, 0, NULL, 0, &nc));
        PT_OK(pkv_seq_append(c, 1, tok, 75, slots));
        float row[32];
        uint8_t stored[32 * 4];
        for (size_t t = 0; t < 200; t++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < H; h++) { /* values rounded to the storage type */
                    for (uint32_t d = 0; d < D; d++) row[d] = frand(1.0f);
                    PT_OK(pkv_kv_store(v.dtype, stored, row, D));
                    PT_OK(pkv_kv_load(v.dtype, vals + ((k * H + h) * 200 + t) * D, stored, D));
                }
        for (size_t t = 0; t < 75; t++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < H; h++)
                    PT_OK(pkv_kv_store(v.dtype,
                                       row_at(&v, slots[t].block, 1, k, h, slots[t].offset),
                                       vals + ((k * H + h) * 200 + t) * D, D));
        PT_OK(pkv_seq_commit(c, 1, 75));
        PT_OK(pkv_seq_fork(c, 1, 2));
        PT_OK(pkv_seq_append(c, 2, tok + 75, 30, slots)); /* copy-on-write of block 4 */
        for (size_t t = 0; t < 30; t++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < H; h++)
                    PT_OK(pkv_kv_store(v.dtype,
                                       row_at(&v, slots[t].block, 1, k, h, slots[t].offset),
                                       vals + ((k * H + h) * 200 + 75 + t) * D, D));
        PT_OK(pkv_seq_commit(c, 2, 30));
        PT_OK(pkv_seq_open(c, 3, 0, tok, 17, &nc)); /* hits 1 block of sequence 1 */
        cr_assert_eq(nc, 16);
        for (size_t i = 0; i < ns; i++) {
            s[i].len = lens[i];
            s[i].n_blocks = (lens[i] + bs - 1) / bs;
            s[i].table = malloc(s[i].n_blocks * 4);
            s[i].kv = malloc(2 * H * lens[i] * D * 4);
            cr_assert(s[i].table && s[i].kv);
            size_t nb;
            PT_OK(pkv_seq_blocks(c, i + 1, s[i].table, s[i].n_blocks, &nb));
            cr_assert_eq(nb, s[i].n_blocks);
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < H; h++)
                    memcpy(s[i].kv + (k * H + h) * lens[i] * D, vals + (k * H + h) * 200 * D,
                           lens[i] * D * 4);
        }
        arena a = {.v = v};
        run_check(&a, s, ns, 1, nq, 1.0f, 0, 2, "real cache");
        run_check(&a, s, ns, 1, nq, 1.0f, PKV_ATTN_PORTABLE, 1, "real cache");
        PT_CHECK(c);
        free_seqs(s, ns);
        free(vals);
    }
}

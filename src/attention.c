/*
 * attention.c — CPU paged decode attention, and f32 <-> f16/bf16 conversion.
 *
 * This is the reference that faster kernels (a future CUDA one) are tested
 * against, so it favours exactness and simplicity:
 *
 *  - Work is split into items: one (sequence, kv head) pair each. An item handles
 *    the g = num_q_heads / num_kv_heads query heads that share the kv head (GQA),
 *    so each K/V row is read from memory once per item.
 *  - Two passes over the context, in token order. Pass 1: s_t = scale * (q . k_t)
 *    for every token, kept in a per-thread buffer. Then m = max_t s_t,
 *    p_t = expf(s_t - m) (max-subtracted: no overflow for any finite score) and
 *    sum = sum_t p_t (in double). Pass 2: acc = sum_t p_t * v_t, accumulated in f32
 *    per chunk of ATTN_CHUNK tokens, chunks added to a running f32 total (keeps the
 *    rounding error of long contexts small), and out = acc / sum (in double).
 *  - Every value depends only on the token order: the block size, the block table
 *    (only addresses come from it), the batch and the thread count never change a
 *    single bit of the result. The reference model (src/model/) relies on this to
 *    compare paged and contiguous K/V bit for bit.
 *  - Two code paths compute the same formulas: a portable C one, and on x86-64 one
 *    with AVX2+FMA+F16C (runtime-detected; head_dim a multiple of 16). They differ
 *    in rounding only (FMA, summation order inside a dot product).
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_X86 1
#include <immintrin.h>
#else
#define ATTN_X86 0
#endif

#define ATTN_CHUNK       64u  /* tokens per f32 partial sum of pass 2 */
#define ATTN_MAX_THREADS 256u

/* ---- Element conversion --------------------------------------------------- */

static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t pkv_f32_to_f16(float x) {
    const uint32_t u = f2u(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf, NaN (quieted, top payload bits kept) */
        if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
    if (a < 0x38800000u) {                                     /* < 2^-14 */
        if (a <= 0x33000000u) return sign; /* <= 2^-25: ties to even zero */
        const uint32_t e = a >> 23;       /* 102..112 */
        const uint32_t m = (a & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;  /* 14..24: units of 2^-24 */
        uint32_t k = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (k & 1u))) k++;
        return (uint16_t)(sign | k); /* k == 0x400 is the smallest normal */
    }
    uint32_t h = ((((a >> 23) - 112u)) << 10) | ((a >> 13) & 0x3ffu);
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump the exponent */
    return (uint16_t)(sign | h);
}

float pkv_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return u2f(sign);
        uint32_t sh = 0; /* subnormal: normalize */
        while (!(m & 0x400u)) {
            m <<= 1;
            sh++;
        }
        return u2f(sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13));
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t pkv_f32_to_bf16(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float pkv_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

static int dtype_ok(pkv_dtype dt) { return dt == PKV_F32 || dt == PKV_F16 || dt == PKV_BF16; }
static size_t dtype_size(pkv_dtype dt) { return dt == PKV_F32 ? 4 : 2; }

int pkv_kv_store(pkv_dtype dtype, void *dst, const float *src, size_t n) {
    if (!dtype_ok(dtype)) return pkv_err(PKV_EINVAL, "unknown dtype %d", (int)dtype);
    if (n && (!dst || !src)) return pkv_err(PKV_EINVAL, "dst or src is NULL");
    if (dtype == PKV_F32) {
        if (n) memmove(dst, src, n * sizeof(float));
        return 0;
    }
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dtype == PKV_F16 ? pkv_f32_to_f16(src[i]) : pkv_f32_to_bf16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
    return 0;
}

int pkv_kv_load(pkv_dtype dtype, float *dst, const void *src, size_t n) {
    if (!dtype_ok(dtype)) return pkv_err(PKV_EINVAL, "unknown dtype %d", (int)dtype);
    if (n && (!dst || !src)) return pkv_err(PKV_EINVAL, "dst or src is NULL");
    if (dtype == PKV_F32) {
        if (n) memmove(dst, src, n * sizeof(float));
        return 0;
    }
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = dtype == PKV_F16 ? pkv_f16_to_f32(h) : pkv_bf16_to_f32(h);
    }
    return 0;
}

/* ---- Views ---------------------------------------------------------------- */

int pkv_kv_view_of(const pkv_cache *cache, pkv_kv_view *out) {
    if (!cache || !out) return pkv_err(PKV_EINVAL, "cache or out is NULL");
    pkv_cache_info ci;
    int rc = pkv_info(cache, &ci);
    if (rc) return rc;
    const uint8_t *b0 = pkv_kv(cache, 0, 0, PKV_K, 0);
    if (!b0) return pkv_err(PKV_EINVAL, "the arena maps no block");
    /* A read-only handle of a short arena maps fewer blocks than capacity. */
    uint64_t lo = 1, hi = ci.capacity; /* blocks [0, lo) are mapped */
    if (pkv_kv(cache, (uint32_t)(ci.capacity - 1), 0, PKV_K, 0)) {
        lo = ci.capacity;
    } else {
        while (lo + 1 < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (pkv_kv(cache, (uint32_t)(mid - 1), 0, PKV_K, 0)) lo = mid;
            else hi = mid;
        }
    }
    memset(out, 0, sizeof *out);
    out->base = b0;
    out->dtype = ci.dtype;
    out->num_layers = ci.num_layers;
    out->num_kv_heads = ci.num_kv_heads;
    out->head_dim = ci.head_dim;
    out->block_size = ci.block_size;
    out->num_blocks = lo;
    out->block_stride = (size_t)ci.slot_bytes;
    out->head_stride = (size_t)ci.run_bytes;
    out->kind_stride = (size_t)ci.run_bytes * ci.num_kv_heads;
    out->layer_stride = out->kind_stride * 2;
    out->token_stride = (size_t)ci.head_dim * ci.elem_size;
    return 0;
}

static int view_check(const pkv_kv_view *v) {
    if (!v) return pkv_err(PKV_EINVAL, "view is NULL");
    if (!v->base) return pkv_err(PKV_EINVAL, "view->base is NULL");
    if (!dtype_ok(v->dtype)) return pkv_err(PKV_EINVAL, "view: unknown dtype %d", (int)v->dtype);
    if (!v->num_layers || !v->num_kv_heads || !v->head_dim || !v->block_size || !v->num_blocks)
        return pkv_err(PKV_EINVAL,
                       "view: zero geometry (layers %u, kv heads %u, head_dim %u, "
                       "block_size %u, blocks %llu)",
                       v->num_layers, v->num_kv_heads, v->head_dim, v->block_size,
                       (unsigned long long)v->num_blocks);
    const size_t es = dtype_size(v->dtype);
    const size_t row = (size_t)v->head_dim * es;
    if ((uintptr_t)v->base % es || v->block_stride % es || v->layer_stride % es ||
        v->kind_stride % es || v->head_stride % es || v->token_stride % es)
        return pkv_err(PKV_EINVAL, "view: base or a stride is not a multiple of %zu bytes", es);
    if (v->token_stride < row)
        return pkv_err(PKV_EINVAL, "view: token_stride %zu < head_dim * elem_size %zu",
                       v->token_stride, row);
    /* The last byte the view can address must not overflow. */
    size_t end = row, t;
    const size_t parts[5][2] = {
        {(size_t)(v->num_blocks - 1), v->block_stride},
        {(size_t)v->num_layers - 1, v->layer_stride},
        {1, v->kind_stride},
        {(size_t)v->num_kv_heads - 1, v->head_stride},
        {(size_t)v->block_size - 1, v->token_stride},
    };
    for (int i = 0; i < 5; i++) {
        if (__builtin_mul_overflow(parts[i][0], parts[i][1], &t) ||
            __builtin_add_overflow(end, t, &end) ||
            __builtin_add_overflow((uintptr_t)v->base, end, &t))
            return pkv_err(PKV_EINVAL, "view: address range overflows");
    }
    return 0;
}

/* ---- The kernels ---------------------------------------------------------- */

typedef struct attn_ws {
    float *scores; /* [g][max_len]: scores, then probabilities */
    float *q;      /* [g][D] */
    float *acc;    /* [g][D] running total */
    float *part;   /* [g][D] current chunk */
    float *rows;   /* [ATTN_CHUNK][D]: K or V rows converted to f32 */
    double *sum;   /* [g] */
} attn_ws;

typedef struct attn_job {
    const pkv_kv_view *v;
    const pkv_attn_params *p;
    const pkv_attn_seq *seqs;
    const float *q;
    float *out;
    size_t n_seqs, max_len;
    uint32_t g;
    int avx;
    unsigned n_threads;
} attn_job;

/* The item being computed: sequence s, kv head kvh, its g query heads. */
typedef struct attn_item_ctx {
    const uint8_t *kbase, *vbase; /* (layer, K|V, kvh) of block 0, token 0 */
    const uint32_t *blocks;
    size_t len, bs, block_stride, ts;
} attn_item_ctx;

/* The run of tokens [t0, end) that starts at t0: it ends at the end of t0's block,
 * at the next multiple of ATTN_CHUNK, or at len, whichever comes first. */
static inline size_t run_end(const attn_item_ctx *c, size_t t0) {
    size_t end = (t0 / c->bs + 1) * c->bs;
    const size_t cend = (t0 / ATTN_CHUNK + 1) * ATTN_CHUNK;
    if (end > cend) end = cend;
    return end < c->len ? end : c->len;
}

static inline size_t run_off(const attn_item_ctx *c, size_t t0) {
    return (size_t)c->blocks[t0 / c->bs] * c->block_stride + (t0 % c->bs) * c->ts;
}

/* out[h][d] = acc[h][d] / sum[h], rounded once. */
static void attn_finish(const attn_job *j, attn_ws *w, float *o) {
    const uint32_t D = j->v->head_dim;
    for (uint32_t h = 0; h < j->g; h++)
        for (uint32_t d = 0; d < D; d++)
            o[(size_t)h * D + d] = (float)((double)w->acc[(size_t)h * D + d] / w->sum[h]);
}

/* Close a chunk: acc += part, part = 0. */
static void chunk_close(attn_ws *w, size_t gd) {
    for (size_t i = 0; i < gd; i++) w->acc[i] += w->part[i];
    memset(w->part, 0, gd * sizeof(float));
}

/* Portable path: plain loops, expf, sequential sums. */
static void item_portable(const attn_job *j, attn_ws *w, const attn_item_ctx *c, float *o) {
    const uint32_t D = j->v->head_dim, g = j->g;
    const pkv_dtype dt = j->v->dtype;
    const size_t len = c->len, gd = (size_t)g * D;
    const float scale = j->p->scale;
    float *sc = w->scores, *row = w->rows;

    for (size_t t = 0; t < len; t++) { /* pass 1: scores */
        pkv_kv_load(dt, row, c->kbase + run_off(c, t), D);
        for (uint32_t h = 0; h < g; h++) {
            const float *q = w->q + (size_t)h * D;
            float s = 0.0f;
            for (uint32_t d = 0; d < D; d++) s += q[d] * row[d];
            sc[h * len + t] = s * scale;
        }
    }
    for (uint32_t h = 0; h < g; h++) { /* softmax numerators, denominators */
        float *x = sc + (size_t)h * len;
        float m = x[0];
        for (size_t t = 1; t < len; t++) m = x[t] > m ? x[t] : m;
        double sum = 0.0;
        for (size_t t = 0; t < len; t++) {
            x[t] = expf(x[t] - m);
            sum += x[t];
        }
        w->sum[h] = sum;
    }
    memset(w->acc, 0, gd * sizeof(float)); /* pass 2: weighted sum of V */
    memset(w->part, 0, gd * sizeof(float));
    for (size_t t = 0; t < len; t++) {
        pkv_kv_load(dt, row, c->vbase + run_off(c, t), D);
        for (uint32_t h = 0; h < g; h++) {
            const float ph = sc[h * len + t];
            float *a = w->part + (size_t)h * D;
            for (uint32_t d = 0; d < D; d++) a[d] += ph * row[d];
        }
        if ((t + 1) % ATTN_CHUNK == 0 || t + 1 == len) chunk_close(w, gd);
    }
    attn_finish(j, w, o);
}

#if ATTN_X86
#define AVX    __attribute__((target("avx2,fma,f16c")))
#define AVX_IN static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX_IN __m256 ld8(const uint8_t *p, const pkv_dtype dt) {
    if (dt == PKV_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (dt == PKV_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX_IN float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-6 polynomial,
 * about 1 ulp); 0 below -87.3 (where expf is subnormal or 0), NaN stays NaN. */
AVX_IN __m256 exp_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x); /* NaN in x stays NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* n rows of D elements (row stride ts bytes) as f32 rows of D floats: the rows
 * themselves for f32 storage, else converted once into buf. */
AVX_IN const float *rows_f32(const uint8_t *src, size_t n, size_t ts, uint32_t D, float *buf,
                             size_t *stride, const pkv_dtype dt) {
    if (dt == PKV_F32) {
        *stride = ts / 4;
        return (const float *)(const void *)src;
    }
    for (size_t t = 0; t < n; t++)
        for (uint32_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(buf + t * D + d, ld8(src + t * ts + (size_t)d * 2, dt));
    *stride = D;
    return buf;
}

AVX_IN void prefetch_rows(const uint8_t *p, size_t n, size_t ts, size_t row_bytes) {
    for (size_t t = 0; t < n; t++)
        for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char *)p + t * ts + b, _MM_HINT_T0);
}

/* Pass 1 on n f32 rows (D % 16 == 0). Every (token, head) dot product is computed
 * the same way whatever tile it falls in: two accumulators (even and odd 8-element
 * chunks), FMA in chunk order, then hsum8(acc0 + acc1) * scale. */
AVX_IN void qk_rows(const float *k, size_t ks, size_t n, const float *qs, uint32_t g,
                    uint32_t D, float scale, float *sc, size_t ss) {
    for (uint32_t h = 0; h < g; h++) {
        const float *q = qs + (size_t)h * D;
        float *o = sc + h * ss;
        size_t t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *k0 = k + t * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
            __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0,
                   a3 = a0, b3 = a0;
            for (uint32_t d = 0; d < D; d += 16) {
                const __m256 qa = _mm256_loadu_ps(q + d), qb = _mm256_loadu_ps(q + d + 8);
                a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + d), a3);
                b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + d + 8), b0);
                b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + d + 8), b1);
                b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + d + 8), b2);
                b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + d + 8), b3);
            }
            o[t + 0] = hsum8(_mm256_add_ps(a0, b0)) * scale;
            o[t + 1] = hsum8(_mm256_add_ps(a1, b1)) * scale;
            o[t + 2] = hsum8(_mm256_add_ps(a2, b2)) * scale;
            o[t + 3] = hsum8(_mm256_add_ps(a3, b3)) * scale;
        }
        for (; t < n; t++) {
            const float *k0 = k + t * ks;
            __m256 a0 = _mm256_setzero_ps(), b0 = a0;
            for (uint32_t d = 0; d < D; d += 16) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k0 + d), a0);
                b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k0 + d + 8), b0);
            }
            o[t] = hsum8(_mm256_add_ps(a0, b0)) * scale;
        }
    }
}

/* Pass 2 on n f32 rows: part[h][d] = fma(p_t, v_t[d], part[h][d]) in token order. */
AVX_IN void pv_rows(const float *v, size_t vs, size_t n, const float *p, size_t ss,
                    uint32_t g, uint32_t D, float *part) {
    for (uint32_t h = 0; h < g; h++) {
        const float *ph = p + h * ss;
        float *a = part + (size_t)h * D;
        uint32_t d = 0;
        for (; d + 32 <= D; d += 32) {
            __m256 x0 = _mm256_loadu_ps(a + d), x1 = _mm256_loadu_ps(a + d + 8),
                   x2 = _mm256_loadu_ps(a + d + 16), x3 = _mm256_loadu_ps(a + d + 24);
            const float *r = v + d;
            for (size_t t = 0; t < n; t++, r += vs) {
                const __m256 pt = _mm256_broadcast_ss(ph + t);
                x0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r), x0);
                x1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 8), x1);
                x2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 16), x2);
                x3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 24), x3);
            }
            _mm256_storeu_ps(a + d, x0);
            _mm256_storeu_ps(a + d + 8, x1);
            _mm256_storeu_ps(a + d + 16, x2);
            _mm256_storeu_ps(a + d + 24, x3);
        }
        if (d < D) { /* 16 left */
            __m256 x0 = _mm256_loadu_ps(a + d), x1 = _mm256_loadu_ps(a + d + 8);
            const float *r = v + d;
            for (size_t t = 0; t < n; t++, r += vs) {
                const __m256 pt = _mm256_broadcast_ss(ph + t);
                x0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r), x0);
                x1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 8), x1);
            }
            _mm256_storeu_ps(a + d, x0);
            _mm256_storeu_ps(a + d + 8, x1);
        }
    }
}

/* Softmax of x[0..len): x[t] = exp(x[t] - max), returns the sum (in double: lanes
 * of 8 accumulated as 2 x 4 doubles, reduced in a fixed order). */
AVX_IN double softmax_avx(float *x, size_t len) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    size_t t = 0;
    for (; t + 8 <= len; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + t));
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    float m = lanes[0];
    for (int i = 1; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (; t < len; t++) m = x[t] > m ? x[t] : m;
    const __m256 mb = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    for (t = 0; t + 8 <= len; t += 8) {
        const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + t), mb));
        _mm256_storeu_ps(x + t, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (t < len) { /* tail, padded with -inf (exp 0) */
        float tail[8];
        for (int i = 0; i < 8; i++) tail[i] = t + (size_t)i < len ? x[t + (size_t)i] : -INFINITY;
        const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(tail), mb));
        _mm256_storeu_ps(tail, e);
        for (size_t i = 0; t + i < len; i++) x[t + i] = tail[i];
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double d[4];
    _mm256_storeu_pd(d, _mm256_add_pd(s0, s1));
    return (d[0] + d[1]) + (d[2] + d[3]);
}

AVX_IN void item_avx_t(const attn_job *j, attn_ws *w, const attn_item_ctx *c, float *o,
                       const pkv_dtype dt) {
    const uint32_t D = j->v->head_dim, g = j->g;
    const size_t len = c->len, gd = (size_t)g * D, rb = (size_t)D * (dt == PKV_F32 ? 4 : 2);
    const float scale = j->p->scale;
    float *sc = w->scores;
    size_t rs;

    for (size_t t0 = 0; t0 < len;) { /* pass 1: scores */
        const size_t end = run_end(c, t0);
        if (end < len) prefetch_rows(c->kbase + run_off(c, end), run_end(c, end) - end, c->ts, rb);
        const float *k = rows_f32(c->kbase + run_off(c, t0), end - t0, c->ts, D, w->rows, &rs, dt);
        qk_rows(k, rs, end - t0, w->q, g, D, scale, sc + t0, len);
        t0 = end;
    }
    for (uint32_t h = 0; h < g; h++) w->sum[h] = softmax_avx(sc + (size_t)h * len, len);
    memset(w->acc, 0, gd * sizeof(float)); /* pass 2: weighted sum of V */
    memset(w->part, 0, gd * sizeof(float));
    for (size_t t0 = 0; t0 < len;) {
        const size_t end = run_end(c, t0);
        if (end < len) prefetch_rows(c->vbase + run_off(c, end), run_end(c, end) - end, c->ts, rb);
        const float *v = rows_f32(c->vbase + run_off(c, t0), end - t0, c->ts, D, w->rows, &rs, dt);
        pv_rows(v, rs, end - t0, sc + t0, len, g, D, w->part);
        t0 = end;
        if (t0 % ATTN_CHUNK == 0 || t0 == len) chunk_close(w, gd);
    }
    attn_finish(j, w, o);
}

static AVX void item_avx(const attn_job *j, attn_ws *w, const attn_item_ctx *c, float *o) {
    switch (j->v->dtype) {
    case PKV_F32: item_avx_t(j, w, c, o, PKV_F32); break;
    case PKV_F16: item_avx_t(j, w, c, o, PKV_F16); break;
    default:      item_avx_t(j, w, c, o, PKV_BF16); break;
    }
}

static int cpu_has_avx(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}
#endif /* ATTN_X86 */

/* One item: sequence s, kv head kvh, its g query heads. */
static void attn_item(const attn_job *j, attn_ws *w, size_t s, uint32_t kvh) {
    const pkv_kv_view *v = j->v;
    const pkv_attn_seq *sq = &j->seqs[s];
    const uint32_t D = v->head_dim, g = j->g, nq = j->p->num_q_heads;
    attn_item_ctx c;
    c.kbase = (const uint8_t *)v->base + (size_t)j->p->layer * v->layer_stride +
              (size_t)kvh * v->head_stride;
    c.vbase = c.kbase + v->kind_stride;
    c.blocks = sq->blocks;
    c.len = sq->len;
    c.bs = v->block_size;
    c.block_stride = v->block_stride;
    c.ts = v->token_stride;
    const size_t qoff = (s * nq + (size_t)kvh * g) * D;
    memcpy(w->q, j->q + qoff, (size_t)g * D * sizeof(float)); /* out may alias q */
#if ATTN_X86
    if (j->avx) {
        item_avx(j, w, &c, j->out + qoff);
        return;
    }
#endif
    item_portable(j, w, &c, j->out + qoff);
}

static void ws_free(attn_ws *w) {
    free(w->scores);
    free(w->q);
    free(w->acc);
    free(w->part);
    free(w->rows);
    free(w->sum);
    memset(w, 0, sizeof *w);
}

static int ws_alloc(attn_ws *w, const attn_job *j) {
    const size_t gd = (size_t)j->g * j->v->head_dim;
    memset(w, 0, sizeof *w);
    w->scores = malloc(j->g * j->max_len * sizeof(float));
    w->q = malloc(gd * sizeof(float));
    w->acc = malloc(gd * sizeof(float));
    w->part = malloc(gd * sizeof(float));
    w->rows = malloc((size_t)ATTN_CHUNK * j->v->head_dim * sizeof(float));
    w->sum = malloc(j->g * sizeof(double));
    if (!w->scores || !w->q || !w->acc || !w->part || !w->rows || !w->sum) {
        ws_free(w);
        return -1;
    }
    return 0;
}

typedef struct attn_thread {
    const attn_job *j;
    unsigned idx;
    int rc;
    pthread_t tid;
} attn_thread;

/* Thread idx takes items idx, idx + n_threads, ... (interleaved: items of a
 * prefill batch grow longer with their index). */
static void *attn_worker(void *arg) {
    attn_thread *th = arg;
    const attn_job *j = th->j;
    attn_ws w;
    if (ws_alloc(&w, j)) {
        th->rc = PKV_ENOMEM;
        return NULL;
    }
    const size_t nkv = j->v->num_kv_heads, items = j->n_seqs * nkv;
    for (size_t i = th->idx; i < items; i += j->n_threads)
        attn_item(j, &w, i / nkv, (uint32_t)(i % nkv));
    ws_free(&w);
    th->rc = 0;
    return NULL;
}

int pkv_attn_decode(const pkv_kv_view *view, const pkv_attn_params *p,
                    const pkv_attn_seq *seqs, size_t n_seqs, const float *q, float *out) {
    int rc = view_check(view);
    if (rc) return rc;
    if (!p) return pkv_err(PKV_EINVAL, "params is NULL");
    if (p->flags & ~PKV_ATTN_PORTABLE)
        return pkv_err(PKV_EINVAL, "unknown attention flags 0x%x", p->flags);
    if (p->layer >= view->num_layers)
        return pkv_err(PKV_EINVAL, "layer %u >= num_layers %u", p->layer, view->num_layers);
    if (!p->num_q_heads || p->num_q_heads % view->num_kv_heads)
        return pkv_err(PKV_EINVAL, "num_q_heads %u is not a positive multiple of num_kv_heads %u",
                       p->num_q_heads, view->num_kv_heads);
    if (!isfinite(p->scale)) return pkv_err(PKV_EINVAL, "scale is not finite");
    if (p->num_threads > ATTN_MAX_THREADS)
        return pkv_err(PKV_EINVAL, "num_threads %u > %u", p->num_threads, ATTN_MAX_THREADS);
    if (!n_seqs) return 0;
    if (!seqs || !q || !out) return pkv_err(PKV_EINVAL, "seqs, q or out is NULL");
    size_t per_seq, total;
    if (__builtin_mul_overflow((size_t)p->num_q_heads, (size_t)view->head_dim, &per_seq) ||
        __builtin_mul_overflow(per_seq, n_seqs, &total) || total > SIZE_MAX / sizeof(float))
        return pkv_err(PKV_EINVAL, "n_seqs * num_q_heads * head_dim overflows");

    const size_t bs = view->block_size;
    size_t max_len = 0;
    for (size_t s = 0; s < n_seqs; s++) {
        const pkv_attn_seq *sq = &seqs[s];
        if (!sq->len) return pkv_err(PKV_EINVAL, "sequence %zu: len is 0", s);
        if (!sq->blocks) return pkv_err(PKV_EINVAL, "sequence %zu: blocks is NULL", s);
        const size_t need = sq->len / bs + (sq->len % bs != 0);
        if (sq->n_blocks < need)
            return pkv_err(PKV_ERANGE, "sequence %zu: len %zu needs %zu blocks, table has %zu",
                           s, sq->len, need, sq->n_blocks);
        for (size_t b = 0; b < need; b++)
            if (sq->blocks[b] >= view->num_blocks)
                return pkv_err(PKV_ERANGE, "sequence %zu: block table entry %zu is %u >= %llu",
                               s, b, sq->blocks[b], (unsigned long long)view->num_blocks);
        if (sq->len > max_len) max_len = sq->len;
    }
    const uint32_t g = p->num_q_heads / view->num_kv_heads;
    size_t sc_bytes;
    if (__builtin_mul_overflow((size_t)g, max_len, &sc_bytes) ||
        __builtin_mul_overflow(sc_bytes, sizeof(float), &sc_bytes))
        return pkv_err(PKV_ENOMEM, "score buffer size overflows");

    attn_job j = {.v = view, .p = p, .seqs = seqs, .q = q, .out = out, .n_seqs = n_seqs,
                  .max_len = max_len, .g = g, .avx = 0, .n_threads = 1};
#if ATTN_X86
    static int have_avx = -1; /* every thread computes the same value */
    int avx = __atomic_load_n(&have_avx, __ATOMIC_RELAXED);
    if (avx < 0) {
        avx = cpu_has_avx();
        __atomic_store_n(&have_avx, avx, __ATOMIC_RELAXED);
    }
    j.avx = avx && !(p->flags & PKV_ATTN_PORTABLE) && view->head_dim % 16 == 0;
#endif
    const size_t items = n_seqs * view->num_kv_heads;
    unsigned nt = p->num_threads ? p->num_threads : 1;
    if (nt > items) nt = (unsigned)items;
    j.n_threads = nt;

    attn_thread th[ATTN_MAX_THREADS];
    unsigned started = 1;
    for (unsigned i = 0; i < nt; i++) th[i] = (attn_thread){.j = &j, .idx = i, .rc = 0};
    for (unsigned i = 1; i < nt; i++) {
        if (pthread_create(&th[i].tid, NULL, attn_worker, &th[i])) break;
        started++;
    }
    if (started < nt) {
        /* Could not start every thread: wait for those that run, redo on one. */
        for (unsigned i = 1; i < started; i++) pthread_join(th[i].tid, NULL);
        j.n_threads = 1;
        th[0].idx = 0;
        attn_worker(&th[0]);
        if (th[0].rc) return pkv_err(th[0].rc, "attention workspace allocation failed");
        return 0;
    }
    attn_worker(&th[0]);
    rc = th[0].rc;
    for (unsigned i = 1; i < nt; i++) {
        pthread_join(th[i].tid, NULL);
        if (!rc) rc = th[i].rc;
    }
    if (rc) return pkv_err(rc, "attention workspace allocation failed");
    return 0;
}

/*
 * attention.c — CPU paged decode attention, and f32 <-> f16/bf16 conversion.
 *
 * This is the reference that faster kernels (a future CUDA one) are tested
 * against, so it favours exactness and simplicity:
 *
 *  - For one sequence and one kv head, the g = num_q_heads / num_kv_heads query
 *    heads that share it (GQA) are computed together, so each K/V row is read from
 *    memory once.
 *  - The context is walked in token order, in segments of ATTN_SEG tokens. For a
 *    segment: s_t = scale * (q . k_t); m = max(running max, max_t s_t) (if m grew,
 *    what was accumulated is first multiplied by expf(old max - m));
 *    p_t = expf(s_t - m) (max-subtracted: no overflow for any finite score);
 *    sum += sum_t p_t (in double); acc += sum_t p_t * v_t, in f32 partial sums of
 *    ATTN_CHUNK tokens added to a running f32 total (keeps the rounding error of
 *    long contexts small). At the end out = acc / sum (in double, rounded once).
 *  - Every value depends only on the token order: the block size, the block table
 *    (only addresses come from it), the batch and the thread count never change a
 *    single bit of the result. The reference model (src/model/) relies on this to
 *    compare paged and contiguous K/V bit for bit.
 *  - Two code paths compute the same formulas: a portable C one (expf), and on
 *    x86-64 one with AVX2+FMA+F16C (runtime-detected; head_dim a multiple of 8;
 *    a vectorised Cephes exp, about 1 ulp). They differ in rounding only.
 *  - Memory: one unit of work is a sequence with its kv heads; inside a segment it
 *    goes head after head, so the pages a segment touches fit the TLB (blocks are
 *    scattered 4 KiB pages), and it prefetches the K/V run it will read next.
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
#include <cpuid.h>
#include <immintrin.h>
#else
#define ATTN_X86 0
#endif

#define ATTN_CHUNK       64u   /* tokens per f32 partial sum of V */
#define ATTN_SEG         1024u /* tokens per softmax segment (a multiple of ATTN_CHUNK) */
#ifndef ATTN_PREFETCH
#define ATTN_PREFETCH    2     /* prefetch the K/V run this many runs ahead */
#endif
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

/* A unit of work is one sequence and a set of its kv heads (all of them, unless
 * threads outnumber sequences). The unit walks the context in segments of ATTN_SEG
 * tokens and, inside a segment, head after head: the K/V pages a segment touches
 * (one run per head and block) stay few enough for the TLB, which matters with 4 KiB
 * pages and randomly placed blocks. Each head keeps its own softmax state; the
 * arithmetic of a head does not depend on the unit it is computed in. */

/* One kv head's state: its g query heads. */
typedef struct head_st {
    const uint8_t *kbase, *vbase; /* (layer, K|V, head) of block 0, token 0 */
    const float *q;               /* [g][D] (a private copy) */
    float *acc;                   /* [g][D] running total */
    float *part;                  /* [g][D] current chunk */
    float *max;                   /* [g] running max of the scores */
    double *sum;                  /* [g] running sum of the weights */
    float *out;                   /* where the result goes */
} head_st;

typedef struct attn_ws {
    float *scores; /* [g][ATTN_SEG]: scores of a segment, then its weights */
    float *rows;   /* [D]: one K or V row converted to f32 (portable path) */
    float *fl;     /* per head slot: q, acc, part [g][D] each, max [g] */
    double *db;    /* per head slot: sum [g] */
    head_st *hs;   /* [slots] */
    size_t slots;
} attn_ws;

typedef struct attn_job {
    const pkv_kv_view *v;
    const pkv_attn_params *p;
    const pkv_attn_seq *seqs;
    const float *q;
    float *out;
    size_t n_seqs;
    uint32_t g;
    uint32_t groups; /* head sets per sequence: unit (s, r) takes heads r, r+groups, ... */
    int avx;
    unsigned n_threads;
} attn_job;

/* Where the sequence's tokens are. */
typedef struct seq_ctx {
    const uint32_t *blocks;
    size_t len, bs, block_stride, ts;
} seq_ctx;

/* The run of tokens [t0, end) that starts at t0: it ends at the end of t0's block,
 * at the next multiple of ATTN_CHUNK (so also of ATTN_SEG), or at len, whichever
 * comes first. */
static inline size_t run_end(const seq_ctx *c, size_t t0) {
    size_t end = (t0 / c->bs + 1) * c->bs;
    const size_t cend = (t0 / ATTN_CHUNK + 1) * ATTN_CHUNK;
    if (end > cend) end = cend;
    return end < c->len ? end : c->len;
}

static inline size_t run_off(const seq_ctx *c, size_t t0) {
    return (size_t)c->blocks[t0 / c->bs] * c->block_stride + (t0 % c->bs) * c->ts;
}

/* A segment's scores of query head h have maximum m: raise the running max to it
 * and rescale what was accumulated under the old one. Returns the max to subtract.
 * A NaN score (m NaN) makes the max NaN, and so the output. */
static float seg_max(head_st *st, uint32_t h, uint32_t D, float m) {
    const float old = st->max[h];
    if (old == -INFINITY || isnan(m) || m > old) {
        if (old != -INFINITY && !isnan(old)) {
            const float f = expf(old - m);
            float *a = st->acc + (size_t)h * D;
            for (uint32_t d = 0; d < D; d++) a[d] *= f;
            st->sum[h] *= (double)f;
        }
        st->max[h] = m;
    }
    return st->max[h];
}

/* Close a chunk: acc += part, part = 0. */
static void chunk_close(head_st *st, size_t gd) {
    for (size_t i = 0; i < gd; i++) st->acc[i] += st->part[i];
    memset(st->part, 0, gd * sizeof(float));
}

/* Portable path, one segment [s0, send) of one kv head: plain loops, expf,
 * sequential sums. */
static void seg_portable(const attn_job *j, attn_ws *w, const seq_ctx *c, head_st *st,
                         size_t s0, size_t send) {
    const uint32_t D = j->v->head_dim, g = j->g;
    const pkv_dtype dt = j->v->dtype;
    const size_t n = send - s0, gd = (size_t)g * D;
    const float scale = j->p->scale;
    float *sc = w->scores, *row = w->rows;
    for (size_t t = 0; t < n; t++) { /* scores */
        pkv_kv_load(dt, row, st->kbase + run_off(c, s0 + t), D);
        for (uint32_t h = 0; h < g; h++) {
            const float *q = st->q + (size_t)h * D;
            float s = 0.0f;
            for (uint32_t d = 0; d < D; d++) s += q[d] * row[d];
            sc[h * ATTN_SEG + t] = s * scale;
        }
    }
    for (uint32_t h = 0; h < g; h++) { /* weights */
        float *x = sc + (size_t)h * ATTN_SEG;
        float m = x[0];
        for (size_t t = 1; t < n; t++) m = x[t] > m ? x[t] : m;
        m = seg_max(st, h, D, m);
        double sum = 0.0;
        for (size_t t = 0; t < n; t++) {
            x[t] = expf(x[t] - m);
            sum += x[t];
        }
        st->sum[h] += sum;
    }
    for (size_t t = 0; t < n; t++) { /* weighted sum of V */
        pkv_kv_load(dt, row, st->vbase + run_off(c, s0 + t), D);
        for (uint32_t h = 0; h < g; h++) {
            const float ph = sc[h * ATTN_SEG + t];
            float *a = st->part + (size_t)h * D;
            for (uint32_t d = 0; d < D; d++) a[d] += ph * row[d];
        }
        if ((s0 + t + 1) % ATTN_CHUNK == 0 || s0 + t + 1 == c->len) chunk_close(st, gd);
    }
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

/* r[i] = ((a_i[0]+a_i[1]) + (a_i[2]+a_i[3])) + ((a_i[4]+a_i[5]) + (a_i[6]+a_i[7])):
 * eight horizontal sums at once, each in the same fixed order. */
AVX_IN __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

AVX_IN void prefetch_row(const uint8_t *p, size_t bytes) {
    for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

/* Pass 1 tile loop: TB tokens x HB heads = 8 dot products at a time (D % 8 == 0),
 * each computed the same way whatever tile it falls in: one accumulator, FMA over
 * the 8-element chunks in order, hsum8x8's tree, times scale. Rows past n repeat
 * the last row; their results are dropped. Row t of `pf` (a later run of pf_n rows)
 * is prefetched along the way. */
AVX_IN void qk_tile(const uint8_t *run, size_t ts, size_t n, const float *q, uint32_t D,
                    float scale, float *sc, size_t ss, const uint8_t *pf, size_t pf_n,
                    const pkv_dtype dt, const int HB) {
    const int TB = 8 / HB;
    const size_t es = dt == PKV_F32 ? 4 : 2;
    for (size_t t0 = 0; t0 < n; t0 += (size_t)TB) {
        if (pf)
            for (size_t t = t0; t < t0 + (size_t)TB && t < pf_n; t++) prefetch_row(pf + t * ts, D * es);
        const uint8_t *k[8];
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) k[t] = run + (t0 + (size_t)t < n ? t0 + (size_t)t : n - 1) * ts;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (uint32_t d = 0; d < D; d += 8) {
            __m256 kv[8];
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) kv[t] = ld8(k[t] + d * es, dt);
#pragma GCC unroll 4
            for (int h = 0; h < HB; h++) {
                const __m256 qv = _mm256_loadu_ps(q + (size_t)h * D + d);
#pragma GCC unroll 8
                for (int t = 0; t < TB; t++)
                    acc[h * TB + t] = _mm256_fmadd_ps(qv, kv[t], acc[h * TB + t]);
            }
        }
        float r[8];
        _mm256_storeu_ps(r, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
        for (int h = 0; h < HB; h++)
            for (int t = 0; t < TB && t0 + (size_t)t < n; t++)
                sc[(size_t)h * ss + t0 + (size_t)t] = r[h * TB + t];
    }
}

/* Pass 2 tile: HB heads x DB 8-element chunks (HB * DB <= 8) of part, over n rows:
 * part[h][d] = fma(p_t, v_t[d], part[h][d]) in token order. */
AVX_IN void pv_tile(const uint8_t *run, size_t ts, size_t n, const float *p, size_t ss,
                    float *part, uint32_t D, uint32_t d0, const uint8_t *pf, size_t pf_n,
                    const pkv_dtype dt, const int HB, const int DB) {
    const size_t es = dt == PKV_F32 ? 4 : 2;
    __m256 acc[8];
#pragma GCC unroll 4
    for (int h = 0; h < HB; h++)
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++)
            acc[h * DB + c] = _mm256_loadu_ps(part + (size_t)h * D + d0 + 8 * (size_t)c);
    const uint8_t *r = run + d0 * es;
    for (size_t t = 0; t < n; t++, r += ts) {
        if (pf && t < pf_n) prefetch_row(pf + t * ts, D * es);
        __m256 v[8];
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) v[c] = ld8(r + 8 * (size_t)c * es, dt);
#pragma GCC unroll 4
        for (int h = 0; h < HB; h++) {
            const __m256 pb = _mm256_broadcast_ss(p + (size_t)h * ss + t);
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++)
                acc[h * DB + c] = _mm256_fmadd_ps(pb, v[c], acc[h * DB + c]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < HB; h++)
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++)
            _mm256_storeu_ps(part + (size_t)h * D + d0 + 8 * (size_t)c, acc[h * DB + c]);
}

/* Max of x[0..n) (lanes of 8, then the tail). */
AVX_IN float max_avx(const float *x, size_t n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    size_t t = 0;
    for (; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + t));
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    float m = lanes[0];
    for (int i = 1; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    return m;
}

/* x[t] = exp(x[t] - m) over x[0..n); returns their sum (in double: lanes of 8
 * accumulated as 2 x 4 doubles, reduced in a fixed order). */
AVX_IN double exp_sum_avx(float *x, size_t n, float m) {
    const __m256 mb = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    size_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + t), mb));
        _mm256_storeu_ps(x + t, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (t < n) { /* tail, padded with -inf (exp 0) */
        float tail[8];
        for (int i = 0; i < 8; i++) tail[i] = t + (size_t)i < n ? x[t + (size_t)i] : -INFINITY;
        const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(tail), mb));
        _mm256_storeu_ps(tail, e);
        for (size_t i = 0; t + i < n; i++) x[t + i] = tail[i];
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double d[4];
    _mm256_storeu_pd(d, _mm256_add_pd(s0, s1));
    return (d[0] + d[1]) + (d[2] + d[3]);
}

/* The run that starts at token t of `base`: its rows (NULL if t >= len) and count. */
AVX_IN const uint8_t *run_at(const seq_ctx *c, const uint8_t *base, size_t t, size_t *n) {
    if (t >= c->len) {
        *n = 0;
        return NULL;
    }
    *n = run_end(c, t) - t;
    return base + run_off(c, t);
}

/* The run ATTN_PREFETCH - 1 runs after the one that starts at `end`, if it starts
 * before `lim`. */
AVX_IN const uint8_t *run_ahead(const seq_ctx *c, const uint8_t *base, size_t end, size_t lim,
                                size_t *n) {
    size_t t = end;
    for (int i = 1; i < ATTN_PREFETCH && t < lim; i++) t = run_end(c, t);
    if (t >= lim) {
        *n = 0;
        return NULL;
    }
    return run_at(c, base, t, n);
}

/* One segment [s0, send) of one kv head, HB query heads per tile (HB divides g).
 * `next` (nn rows) is the first run processed after this segment: prefetched during
 * its last V run. */
AVX_IN void seg_avx_t(const attn_job *j, attn_ws *w, const seq_ctx *c, head_st *st,
                      size_t s0, size_t send, const uint8_t *next, size_t nn,
                      const pkv_dtype dt, const int HB) {
    const uint32_t D = j->v->head_dim, g = j->g;
    const int DB = 8 / HB;
    const size_t gd = (size_t)g * D;
    const float scale = j->p->scale;
    float *sc = w->scores;
    size_t pn;
    for (size_t t0 = s0; t0 < send;) { /* scores */
        const size_t end = run_end(c, t0);
        const uint8_t *pf = run_ahead(c, st->kbase, end, send, &pn);
        if (!pf) pf = run_at(c, st->vbase, s0, &pn); /* then the segment's V */
        const uint8_t *run = st->kbase + run_off(c, t0);
        for (uint32_t h = 0; h < g; h += (uint32_t)HB)
            qk_tile(run, c->ts, end - t0, st->q + (size_t)h * D, D, scale,
                    sc + (size_t)h * ATTN_SEG + (t0 - s0), ATTN_SEG, h ? NULL : pf, pn, dt, HB);
        t0 = end;
    }
    for (uint32_t h = 0; h < g; h++) { /* weights */
        float *x = sc + (size_t)h * ATTN_SEG;
        const float m = seg_max(st, h, D, max_avx(x, send - s0));
        st->sum[h] += exp_sum_avx(x, send - s0, m);
    }
    for (size_t t0 = s0; t0 < send;) { /* weighted sum of V */
        const size_t end = run_end(c, t0);
        const uint8_t *pf = run_ahead(c, st->vbase, end, send, &pn);
        if (!pf) pf = next, pn = nn;
        const uint8_t *run = st->vbase + run_off(c, t0);
        const float *p = sc + (t0 - s0);
        for (uint32_t h = 0; h < g; h += (uint32_t)HB) {
            uint32_t d = 0;
            for (; d + 8u * (uint32_t)DB <= D; d += 8u * (uint32_t)DB, pf = NULL)
                pv_tile(run, c->ts, end - t0, p + (size_t)h * ATTN_SEG, ATTN_SEG,
                        st->part + (size_t)h * D, D, d, pf, pn, dt, HB, DB);
            for (; d < D; d += 8, pf = NULL) /* chunks left over: one at a time */
                pv_tile(run, c->ts, end - t0, p + (size_t)h * ATTN_SEG, ATTN_SEG,
                        st->part + (size_t)h * D, D, d, pf, pn, dt, HB, 1);
        }
        t0 = end;
        if (t0 % ATTN_CHUNK == 0 || t0 == c->len) chunk_close(st, gd);
    }
}

#define SEG_AVX_HB(dt)                                                                  \
    do {                                                                                \
        if (j->g % 4 == 0) seg_avx_t(j, w, c, st, s0, send, next, nn, dt, 4);            \
        else if (j->g % 2 == 0) seg_avx_t(j, w, c, st, s0, send, next, nn, dt, 2);       \
        else seg_avx_t(j, w, c, st, s0, send, next, nn, dt, 1);                          \
    } while (0)

static AVX void seg_avx(const attn_job *j, attn_ws *w, const seq_ctx *c, head_st *st,
                        size_t s0, size_t send, const uint8_t *next, size_t nn) {
    switch (j->v->dtype) {
    case PKV_F32: SEG_AVX_HB(PKV_F32); break;
    case PKV_F16: SEG_AVX_HB(PKV_F16); break;
    default:      SEG_AVX_HB(PKV_BF16); break;
    }
}

/* AVX2, FMA and F16C, and the OS saves the YMM registers (CPUID + XGETBV; the
 * compilers' __builtin_cpu_supports does not know "f16c" everywhere). */
static int cpu_has_avx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned need1 = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29); /* FMA OSXSAVE AVX F16C */
    if ((c & need1) != need1) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return 0; /* XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1u; /* AVX2 */
}
#endif /* ATTN_X86 */

/* Unit (s, r): sequence s, kv heads r, r + groups, ... */
static void attn_unit(const attn_job *j, attn_ws *w, size_t s, uint32_t r) {
    const pkv_kv_view *v = j->v;
    const pkv_attn_seq *sq = &j->seqs[s];
    const uint32_t D = v->head_dim, g = j->g, nq = j->p->num_q_heads;
    const size_t gd = (size_t)g * D;
    const seq_ctx c = {sq->blocks, sq->len, v->block_size, v->block_stride, v->token_stride};
    const uint8_t *layer = (const uint8_t *)v->base + (size_t)j->p->layer * v->layer_stride;
    size_t nh = 0;
    for (uint32_t kvh = r; kvh < v->num_kv_heads; kvh += j->groups, nh++) {
        head_st *st = &w->hs[nh];
        float *f = w->fl + nh * (3 * gd + g);
        const size_t qoff = (s * nq + (size_t)kvh * g) * D;
        memcpy(f, j->q + qoff, gd * sizeof(float)); /* out may alias q */
        *st = (head_st){.kbase = layer + (size_t)kvh * v->head_stride,
                        .vbase = layer + (size_t)kvh * v->head_stride + v->kind_stride,
                        .q = f,
                        .acc = f + gd,
                        .part = f + 2 * gd,
                        .max = f + 3 * gd,
                        .sum = w->db + nh * g,
                        .out = j->out + qoff};
        memset(st->acc, 0, 2 * gd * sizeof(float));
        for (uint32_t h = 0; h < g; h++) st->max[h] = -INFINITY, st->sum[h] = 0.0;
    }
    for (size_t s0 = 0; s0 < c.len; s0 += ATTN_SEG) {
        const size_t send = c.len - s0 < ATTN_SEG ? c.len : s0 + ATTN_SEG;
        for (size_t i = 0; i < nh; i++) {
#if ATTN_X86
            if (j->avx) {
                /* What comes next: the next head's K of this segment, or the first
                 * head's K of the next one. */
                size_t nn = 0;
                const uint8_t *next = NULL;
                if (i + 1 < nh) next = c.len ? w->hs[i + 1].kbase + run_off(&c, s0) : NULL,
                                nn = run_end(&c, s0) - s0;
                else if (send < c.len) next = w->hs[0].kbase + run_off(&c, send),
                                       nn = run_end(&c, send) - send;
                seg_avx(j, w, &c, &w->hs[i], s0, send, next, nn);
                continue;
            }
#endif
            seg_portable(j, w, &c, &w->hs[i], s0, send);
        }
    }
    for (size_t i = 0; i < nh; i++) { /* out = acc / sum, rounded once */
        const head_st *st = &w->hs[i];
        for (uint32_t h = 0; h < g; h++)
            for (uint32_t d = 0; d < D; d++)
                st->out[(size_t)h * D + d] =
                    (float)((double)st->acc[(size_t)h * D + d] / st->sum[h]);
    }
}

static void ws_free(attn_ws *w) {
    free(w->scores);
    free(w->rows);
    free(w->fl);
    free(w->db);
    free(w->hs);
    memset(w, 0, sizeof *w);
}

static int ws_alloc(attn_ws *w, const attn_job *j) {
    const size_t g = j->g, D = j->v->head_dim;
    memset(w, 0, sizeof *w);
    w->slots = (j->v->num_kv_heads + j->groups - 1) / j->groups;
    w->scores = malloc(g * ATTN_SEG * sizeof(float));
    w->rows = malloc(D * sizeof(float));
    w->fl = malloc(w->slots * (3 * g * D + g) * sizeof(float));
    w->db = malloc(w->slots * g * sizeof(double));
    w->hs = malloc(w->slots * sizeof *w->hs);
    if (!w->scores || !w->rows || !w->fl || !w->db || !w->hs) {
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

/* Thread idx takes units idx, idx + n_threads, ... (interleaved: the sequences of a
 * prefill batch grow longer with their index). */
static void *attn_worker(void *arg) {
    attn_thread *th = arg;
    const attn_job *j = th->j;
    attn_ws w;
    if (ws_alloc(&w, j)) {
        th->rc = PKV_ENOMEM;
        return NULL;
    }
    const size_t units = j->n_seqs * j->groups;
    for (size_t u = th->idx; u < units; u += j->n_threads)
        attn_unit(j, &w, u / j->groups, (uint32_t)(u % j->groups));
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
    }
    const uint32_t g = p->num_q_heads / view->num_kv_heads;
    attn_job j = {.v = view, .p = p, .seqs = seqs, .q = q, .out = out, .n_seqs = n_seqs,
                  .g = g, .groups = 1, .avx = 0, .n_threads = 1};
#if ATTN_X86
    static int have_avx = -1; /* every thread computes the same value */
    int avx = __atomic_load_n(&have_avx, __ATOMIC_RELAXED);
    if (avx < 0) {
        avx = cpu_has_avx();
        __atomic_store_n(&have_avx, avx, __ATOMIC_RELAXED);
    }
    j.avx = avx && !(p->flags & PKV_ATTN_PORTABLE) && view->head_dim % 8 == 0;
#endif
    unsigned nt = p->num_threads ? p->num_threads : 1;
    /* Units: whole sequences, or head sets when threads outnumber sequences. */
    size_t groups = n_seqs >= nt ? 1 : (nt + n_seqs - 1) / n_seqs;
    if (groups > view->num_kv_heads) groups = view->num_kv_heads;
    j.groups = (uint32_t)groups;
    if (nt > n_seqs * groups) nt = (unsigned)(n_seqs * groups);
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

/*
 * matmul.c — weight matrices and their products (see matmul.h).
 *
 * The one invariant: every output element y[i][j] is computed by one fixed
 * sequence of floating-point operations that depends only on row j of W and row
 * i of x, never on n, on the tile (4 rows or 1) or on [j0, j1). Each kernel's
 * tile variants therefore perform, per element, exactly the same operations in
 * the same order:
 *  - f32 (and exact on quantized rows, which first dequantizes a panel of rows
 *    to the f32 values the GGUF reader gives): acc = fma(w[k..k+8], x[k..k+8],
 *    acc) for k in order, then a fixed horizontal sum;
 *  - q8: per block of 32, the integer dot product (exact), converted to float
 *    and accumulated as acc = fma(isum, d_w * d_x, acc) in block order; the
 *    Q4_1 offset term m * (d_x * sum q_x) summed separately in block order and
 *    added at the end.
 * Contraction of a*b + c into an FMA by the compiler would break this between
 * differently unrolled variants: the file is compiled without it (C11 mode
 * for gcc; the pragma for clang).
 */
#include "matmul.h"

#include "gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MM_X86 1
#include <immintrin.h>
#else
#define MM_X86 0
#endif

/* Repacked rows (f32 scales: no half conversion in the inner loops), structure
 * of arrays, nb = cols / 32 blocks:
 *  - Q8_0: d[nb] floats, then q[nb][32] int8;
 *  - Q4_1: d[nb], m[nb] floats, then q[nb][16] bytes (two nibbles each);
 *  - activations: d[nb], s[nb] (d * sum of the block's q) floats, q[nb][32] int8.
 * The offsets m and s sit in arrays of their own so that the Q4_1 offset term,
 * sum over blocks of m * s, is one vector dot product. */
typedef struct row_q8_0 {
    const float *d;
    const int8_t *q;
} row_q8_0;

typedef struct row_q4_1 {
    const float *d, *m;
    const uint8_t *q;
} row_q4_1;

typedef struct row_act {
    const float *d, *s;
    const int8_t *q;
} row_act;

size_t pkvm_wmat_row_bytes(pkvm_wtype t, size_t cols) {
    switch (t) {
    case PKVM_W_Q8_0: return cols / 32 * (4 + 32);
    case PKVM_W_Q4_1: return cols / 32 * (8 + 16);
    default: return cols * sizeof(float);
    }
}

static row_q8_0 q8_0_row(const unsigned char *p, size_t nb) {
    return (row_q8_0){(const float *)(const void *)p, (const int8_t *)(p + 4 * nb)};
}

static row_q4_1 q4_1_row(const unsigned char *p, size_t nb) {
    const float *d = (const float *)(const void *)p;
    return (row_q4_1){d, d + nb, p + 8 * nb};
}

static row_act act_row(const unsigned char *p, size_t nb) {
    const float *d = (const float *)(const void *)p;
    return (row_act){d, d + nb, (const int8_t *)(p + 8 * nb)};
}

static size_t act_row_bytes(size_t nb) { return nb * (8 + 32); }

static uint16_t u16_at(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

void pkvm_wmat_pack_row(pkvm_wmat *w, size_t row, const void *ggml_blocks) {
    const unsigned char *p = ggml_blocks;
    unsigned char *dst = w->data + row * w->row_bytes;
    const size_t nb = w->cols / 32;
    if (w->type == PKVM_W_Q8_0) {
        float *d = (float *)(void *)dst;
        int8_t *q = (int8_t *)(dst + 4 * nb);
        for (size_t b = 0; b < nb; b++, p += 34) {
            d[b] = pkv_gguf_f16(u16_at(p));
            memcpy(q + 32 * b, p + 2, 32);
        }
    } else if (w->type == PKVM_W_Q4_1) {
        float *d = (float *)(void *)dst, *m = d + nb;
        uint8_t *q = dst + 8 * nb;
        for (size_t b = 0; b < nb; b++, p += 20) {
            d[b] = pkv_gguf_f16(u16_at(p));
            m[b] = pkv_gguf_f16(u16_at(p + 2));
            memcpy(q + 16 * b, p + 4, 16);
        }
    } else {
        memcpy(dst, p, w->row_bytes);
    }
}

/* The same expressions as the GGUF reader's converter (gguf.c), so the same
 * floats: d * q, and d * q + m (a product, then a sum; never fused). */
void pkvm_wmat_row_f32(const pkvm_wmat *w, size_t row, float *out) {
    const unsigned char *src = w->data + row * w->row_bytes;
    const size_t nb = w->cols / 32;
    if (w->type == PKVM_W_Q8_0) {
        const row_q8_0 r = q8_0_row(src, nb);
        for (size_t k = 0; k < nb; k++, out += 32)
            for (int j = 0; j < 32; j++) out[j] = r.d[k] * (float)r.q[32 * k + j];
    } else if (w->type == PKVM_W_Q4_1) {
        const row_q4_1 r = q4_1_row(src, nb);
        for (size_t k = 0; k < nb; k++, out += 32)
            for (int j = 0; j < 16; j++) {
                const uint8_t b = r.q[16 * k + j];
                out[j] = r.d[k] * (float)(b & 0x0f) + r.m[k];
                out[j + 16] = r.d[k] * (float)(b >> 4) + r.m[k];
            }
    } else {
        memcpy(out, src, w->cols * sizeof(float));
    }
}

size_t pkvm_act_q8_bytes(size_t n, size_t cols) { return n * act_row_bytes(cols / 32); }

/* One block of 32: q = round(v / d) with d = amax / 127 (half to even). */
static void quantize_block_portable(const float *v, float *d_out, float *s_out, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(v[j]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int8_t)nearbyintf(v[j] * id);
        sum += q[j];
    }
    *d_out = d;
    *s_out = d * (float)sum;
}

size_t pkvm_mm_scratch_floats(const pkvm_wmat *w) {
    return w->type == PKVM_W_F32 ? 0 : 16 * w->cols;
}

#define PANEL 16 /* rows dequantized at a time by the exact kernel */

/* ---- Portable kernels ------------------------------------------------------------ */

static void f32_portable(const float *x, size_t n, const float *W, size_t in, size_t j0,
                         size_t j1, float *y, size_t ldy) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = j0; j < j1; j++) {
            const float *w = W + j * in, *xi = x + i * in;
            float s = 0.0f;
            for (size_t k = 0; k < in; k++) s += w[k] * xi[k];
            y[i * ldy + j] = s;
        }
}

static float q8_0_dot_portable(row_q8_0 w, row_act a, size_t nb) {
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w.q[32 * b + j] * a.q[32 * b + j];
        acc += (float)s * (w.d[b] * a.d[b]);
    }
    return acc;
}

static float q4_1_dot_portable(row_q4_1 w, row_act a, size_t nb) {
    float acc = 0.0f, off = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *wq = w.q + 16 * b;
        const int8_t *xq = a.q + 32 * b;
        int s = 0;
        for (int j = 0; j < 16; j++) s += (wq[j] & 0x0f) * xq[j] + (wq[j] >> 4) * xq[j + 16];
        acc += (float)s * (w.d[b] * a.d[b]);
    }
    for (size_t b = 0; b < nb; b++) off += w.m[b] * a.s[b];
    return acc + off;
}

static void q8_portable(const pkvm_wmat *w, const unsigned char *xq, size_t n, size_t j0,
                        size_t j1, float *y, size_t ldy) {
    const size_t nb = w->cols / 32, ab = act_row_bytes(nb);
    for (size_t i = 0; i < n; i++)
        for (size_t j = j0; j < j1; j++) {
            const unsigned char *row = w->data + j * w->row_bytes;
            const row_act a = act_row(xq + i * ab, nb);
            y[i * ldy + j] = w->type == PKVM_W_Q8_0 ? q8_0_dot_portable(q8_0_row(row, nb), a, nb)
                                                    : q4_1_dot_portable(q4_1_row(row, nb), a, nb);
        }
}

static void act_quantize_portable(const float *x, size_t n, size_t cols, unsigned char *xq) {
    const size_t nb = cols / 32, ab = act_row_bytes(nb);
    for (size_t i = 0; i < n; i++) {
        float *d = (float *)(void *)(xq + i * ab), *sm = d + nb;
        int8_t *q = (int8_t *)(xq + i * ab + 8 * nb);
        for (size_t b = 0; b < nb; b++)
            quantize_block_portable(x + i * cols + 32 * b, d + b, sm + b, q + 32 * b);
    }
}

/* ---- AVX2 kernels ---------------------------------------------------------------- */

#if MM_X86
#define MAVX    __attribute__((target("avx2,fma")))
#define MAVX_IN static inline __attribute__((always_inline, target("avx2,fma")))

int pkvm_mm_cpu_avx(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

MAVX_IN float mhsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* in % 8 == 0. Tiles: 4 rows x 3 outputs, 1 x 3, then 1 x 1. */
static MAVX void f32_avx(const float *x, size_t n, const float *W, size_t in, size_t j0,
                         size_t j1, float *y, size_t ldy) {
    for (size_t i0 = 0; i0 < n; i0 += 64) {
        const size_t i1 = n - i0 < 64 ? n : i0 + 64;
        size_t j = j0;
        for (; j + 3 <= j1; j += 3) {
            const float *w0 = W + j * in, *w1 = w0 + in, *w2 = w1 + in;
            size_t i = i0;
            for (; i + 4 <= i1; i += 4) {
                const float *x0 = x + i * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
                __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,
                       c12 = c00, c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00,
                       c32 = c00;
                for (size_t k = 0; k < in; k += 8) {
                    const __m256 a0 = _mm256_loadu_ps(w0 + k), a1 = _mm256_loadu_ps(w1 + k),
                                 a2 = _mm256_loadu_ps(w2 + k);
                    __m256 b = _mm256_loadu_ps(x0 + k);
                    c00 = _mm256_fmadd_ps(a0, b, c00);
                    c01 = _mm256_fmadd_ps(a1, b, c01);
                    c02 = _mm256_fmadd_ps(a2, b, c02);
                    b = _mm256_loadu_ps(x1 + k);
                    c10 = _mm256_fmadd_ps(a0, b, c10);
                    c11 = _mm256_fmadd_ps(a1, b, c11);
                    c12 = _mm256_fmadd_ps(a2, b, c12);
                    b = _mm256_loadu_ps(x2 + k);
                    c20 = _mm256_fmadd_ps(a0, b, c20);
                    c21 = _mm256_fmadd_ps(a1, b, c21);
                    c22 = _mm256_fmadd_ps(a2, b, c22);
                    b = _mm256_loadu_ps(x3 + k);
                    c30 = _mm256_fmadd_ps(a0, b, c30);
                    c31 = _mm256_fmadd_ps(a1, b, c31);
                    c32 = _mm256_fmadd_ps(a2, b, c32);
                }
                float *y0 = y + i * ldy + j;
                y0[0] = mhsum8(c00), y0[1] = mhsum8(c01), y0[2] = mhsum8(c02);
                y0 += ldy;
                y0[0] = mhsum8(c10), y0[1] = mhsum8(c11), y0[2] = mhsum8(c12);
                y0 += ldy;
                y0[0] = mhsum8(c20), y0[1] = mhsum8(c21), y0[2] = mhsum8(c22);
                y0 += ldy;
                y0[0] = mhsum8(c30), y0[1] = mhsum8(c31), y0[2] = mhsum8(c32);
            }
            for (; i < i1; i++) {
                const float *x0 = x + i * in;
                __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0;
                for (size_t k = 0; k < in; k += 8) {
                    const __m256 b = _mm256_loadu_ps(x0 + k);
                    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), b, c0);
                    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), b, c1);
                    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), b, c2);
                }
                float *y0 = y + i * ldy + j;
                y0[0] = mhsum8(c0), y0[1] = mhsum8(c1), y0[2] = mhsum8(c2);
            }
        }
        for (; j < j1; j++) {
            const float *w0 = W + j * in;
            for (size_t i = i0; i < i1; i++) {
                const float *x0 = x + i * in;
                __m256 c0 = _mm256_setzero_ps();
                for (size_t k = 0; k < in; k += 8)
                    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(x0 + k), c0);
                y[i * ldy + j] = mhsum8(c0);
            }
        }
    }
}

/* Sum of u[k] * s[k] (u unsigned, s signed bytes) over 32 pairs, as 8 floats.
 * No int16 saturation here: |u| <= 128 and |s| <= 127 (pairs sum to < 2^15). */
MAVX_IN __m256 dot32(__m256i u, __m256i s) {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    return _mm256_cvtepi32_ps(p);
}

/* sum of a[b] * b[b] over nb: 8 lanes in order, a fixed horizontal sum, then the
 * tail in order. */
MAVX_IN float fdot(const float *a, const float *b, size_t nb) {
    __m256 acc = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= nb; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    float s = mhsum8(acc);
    for (; k < nb; k++) s += a[k] * b[k];
    return s;
}

MAVX_IN __m256i q4_unpack(const uint8_t *q) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)q);
    const __m128i low = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

MAVX_IN __m256i load32(const int8_t *q) {
    return _mm256_loadu_si256((const __m256i *)(const void *)q);
}

/* J Q4_1 weight rows against R activation rows (J in 1..2, R in 1..4): per
 * element the same operations whatever J and R. */
MAVX_IN void q4_1_tile(const row_q4_1 *w, int J, const row_act *a, int R, size_t nb,
                       float *out, size_t ldo) {
    __m256 acc[2][4];
    for (int j = 0; j < J; j++)
        for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        __m256i u[2];
        for (int j = 0; j < J; j++) u[j] = q4_unpack(w[j].q + 16 * b);
        for (int r = 0; r < R; r++) {
            const __m256i s = load32(a[r].q + 32 * b);
            for (int j = 0; j < J; j++)
                acc[j][r] = _mm256_fmadd_ps(dot32(u[j], s), _mm256_set1_ps(w[j].d[b] * a[r].d[b]),
                                            acc[j][r]);
        }
    }
    for (int j = 0; j < J; j++)
        for (int r = 0; r < R; r++)
            out[r * ldo + j] = mhsum8(acc[j][r]) + fdot(w[j].m, a[r].s, nb);
}

MAVX_IN void q8_0_tile(const row_q8_0 *w, int J, const row_act *a, int R, size_t nb,
                       float *out, size_t ldo) {
    __m256 acc[2][4];
    for (int j = 0; j < J; j++)
        for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        __m256i q[2], u[2];
        for (int j = 0; j < J; j++) {
            q[j] = load32(w[j].q + 32 * b);
            u[j] = _mm256_sign_epi8(q[j], q[j]); /* |q|, -128 read as 128 (unsigned) */
        }
        for (int r = 0; r < R; r++) {
            const __m256i s = load32(a[r].q + 32 * b);
            for (int j = 0; j < J; j++)
                acc[j][r] = _mm256_fmadd_ps(dot32(u[j], _mm256_sign_epi8(s, q[j])),
                                            _mm256_set1_ps(w[j].d[b] * a[r].d[b]), acc[j][r]);
        }
    }
    for (int j = 0; j < J; j++)
        for (int r = 0; r < R; r++) out[r * ldo + j] = mhsum8(acc[j][r]);
}

/* Tiles of 2 weight rows x 4 activation rows, and the edges. */
#define TILE_CASES(fn)                                                                 \
    do {                                                                               \
        if (J == 2 && R == 4) fn(w, 2, a, 4, nb, out, ldo);                            \
        else if (J == 2) fn(w, 2, a, 1, nb, out, ldo);                                 \
        else if (R == 4) fn(w, 1, a, 4, nb, out, ldo);                                 \
        else fn(w, 1, a, 1, nb, out, ldo);                                             \
    } while (0)

static MAVX void q4_1_tiles(const row_q4_1 *w, int J, const row_act *a, int R, size_t nb,
                            float *out, size_t ldo) {
    TILE_CASES(q4_1_tile);
}

static MAVX void q8_0_tiles(const row_q8_0 *w, int J, const row_act *a, int R, size_t nb,
                            float *out, size_t ldo) {
    TILE_CASES(q8_0_tile);
}

static MAVX void q8_avx(const pkvm_wmat *w, const unsigned char *xq, size_t n, size_t j0,
                        size_t j1, float *y, size_t ldy) {
    const size_t nb = w->cols / 32, ab = act_row_bytes(nb);
    const int q4 = w->type == PKVM_W_Q4_1;
    for (size_t i0 = 0; i0 < n; i0 += 64) {
        const size_t i1 = n - i0 < 64 ? n : i0 + 64;
        for (size_t j = j0; j < j1;) {
            const int J = j + 2 <= j1 ? 2 : 1;
            row_q4_1 w4[2];
            row_q8_0 w8[2];
            for (int k = 0; k < J; k++) {
                const unsigned char *row = w->data + (j + (size_t)k) * w->row_bytes;
                if (q4) w4[k] = q4_1_row(row, nb);
                else w8[k] = q8_0_row(row, nb);
            }
            for (size_t i = i0; i < i1;) {
                const int R = i + 4 <= i1 ? 4 : 1;
                row_act a[4];
                for (int r = 0; r < R; r++) a[r] = act_row(xq + (i + (size_t)r) * ab, nb);
                if (q4) q4_1_tiles(w4, J, a, R, nb, y + i * ldy + j, ldy);
                else q8_0_tiles(w8, J, a, R, nb, y + i * ldy + j, ldy);
                i += (size_t)R;
            }
            j += (size_t)J;
        }
    }
}

#define RM (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* As quantize_block_portable, 8 lanes at a time (the same values: IEEE products
 * and round-half-even). */
static MAVX void act_quantize_avx(const float *x, size_t n, size_t cols, unsigned char *xq) {
    const size_t nb = cols / 32, ab = act_row_bytes(nb);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t i = 0; i < n; i++) {
        float *d = (float *)(void *)(xq + i * ab), *sm = d + nb;
        int8_t *q = (int8_t *)(xq + i * ab + 8 * nb);
        for (size_t b = 0; b < nb; b++) {
            const float *v = x + i * cols + 32 * b;
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8),
                   v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
            const __m256 idv = _mm256_set1_ps(id);
            const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, idv), RM)),
                          i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, idv), RM)),
                          i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, idv), RM)),
                          i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, idv), RM));
            /* Sum of the 32 values (exact in int32). */
            __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
            const int sum = _mm_cvtsi128_si32(t4);
            /* Pack to bytes in order: packs work per 128-bit lane, a permute fixes it. */
            const __m256i p16a = _mm256_packs_epi32(i0, i1), p16b = _mm256_packs_epi32(i2, i3);
            const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            const __m256i ord = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(void *)(q + 32 * b), ord);
            d[b] = dd;
            sm[b] = dd * (float)sum;
        }
    }
}
#else
int pkvm_mm_cpu_avx(void) { return 0; }
#endif

/* ---- Dispatch -------------------------------------------------------------------- */

static void f32_range(const float *x, size_t n, const float *W, size_t in, size_t j0, size_t j1,
                      float *y, size_t ldy, int avx) {
#if MM_X86
    if (avx && in % 8 == 0) {
        f32_avx(x, n, W, in, j0, j1, y, ldy);
        return;
    }
#endif
    (void)avx;
    f32_portable(x, n, W, in, j0, j1, y, ldy);
}

void pkvm_act_quantize(const float *x, size_t n, size_t cols, void *xq, int avx) {
#if MM_X86
    if (avx) {
        act_quantize_avx(x, n, cols, xq);
        return;
    }
#endif
    (void)avx;
    act_quantize_portable(x, n, cols, xq);
}

void pkvm_mm_range(const pkvm_wmat *w, const float *x, const void *xq, size_t n, size_t j0,
                   size_t j1, float *y, size_t ldy, float *scratch, int avx) {
    if (j0 >= j1 || !n) return;
    const size_t in = w->cols;
    if (w->type == PKVM_W_F32) {
        f32_range(x, n, (const float *)(const void *)w->data, in, j0, j1, y, ldy, avx);
        return;
    }
    if (xq) {
#if MM_X86
        if (avx) {
            q8_avx(w, xq, n, j0, j1, y, ldy);
            return;
        }
#endif
        q8_portable(w, xq, n, j0, j1, y, ldy);
        return;
    }
    /* Exact: a panel of rows dequantized, then the f32 kernel on it. */
    for (size_t jp = j0; jp < j1; jp += PANEL) {
        const size_t cnt = j1 - jp < PANEL ? j1 - jp : PANEL;
        for (size_t r = 0; r < cnt; r++) pkvm_wmat_row_f32(w, jp + r, scratch + r * in);
        f32_range(x, n, scratch, in, 0, cnt, y + jp, ldy, avx);
    }
}

/*
 * test_matmul.c — the model's matrix products on quantized weights
 * (src/model/matmul.c): batch independence to the bit, the exact kernel equal to
 * an f32 product of the dequantized weights to the bit, the q8 kernel within
 * the error its activation rounding allows, and the AVX2 and portable code
 * agreeing. Matrices are random ggml blocks (Q8_0, Q4_1) with odd shapes so that
 * every tile edge is crossed.
 */
#include "gguf.h"
#include "matmul.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)rnd() / 2147483648.0f - 1.0f; } /* [-1, 1) */

/* An f16 bit pattern of a modest value (exponent 2^-8 .. 2^-4), either sign. */
static uint16_t f16_scale(int sign) {
    return (uint16_t)((sign ? 0x8000u : 0u) | ((uint32_t)(7 + rnd() % 4) << 10) | (rnd() & 0x3ffu));
}

/* rows x cols of random ggml blocks of type t, packed into w. */
static void make_mat(pkvm_wmat *w, pkvm_wtype t, size_t rows, size_t cols) {
    w->type = t;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = pkvm_wmat_row_bytes(t, cols);
    w->data = malloc(rows * w->row_bytes);
    cr_assert_not_null(w->data);
    const size_t nb = cols / 32, bb = t == PKVM_W_Q8_0 ? 34 : 20;
    unsigned char *blocks = malloc(nb * bb);
    for (size_t r = 0; r < rows; r++) {
        for (size_t b = 0; b < nb; b++) {
            unsigned char *p = blocks + b * bb;
            uint16_t d = f16_scale(0), m = f16_scale((int)(rnd() & 1));
            memcpy(p, &d, 2);
            if (t == PKVM_W_Q8_0) {
                for (int j = 0; j < 32; j++) p[2 + j] = (unsigned char)(rnd() & 0xff); /* -128 too */
            } else {
                memcpy(p + 2, &m, 2);
                for (int j = 0; j < 16; j++) p[4 + j] = (unsigned char)(rnd() & 0xff);
            }
        }
        pkvm_wmat_pack_row(w, r, blocks);
    }
    free(blocks);
}

static float *make_x(size_t n, size_t cols) {
    float *x = malloc(n * cols * sizeof *x);
    for (size_t i = 0; i < n * cols; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
    return x;
}

/* y = W . x with the kernel (q8: xq from x), outputs [j0, j1) of ldy = rows. */
static void product(const pkvm_wmat *w, const float *x, size_t n, int q8, int avx, size_t j0,
                    size_t j1, float *y) {
    void *xq = NULL;
    if (q8) {
        xq = malloc(pkvm_act_q8_bytes(n, w->cols));
        pkvm_act_quantize(x, n, w->cols, xq, avx);
    }
    float *scratch = malloc((pkvm_mm_scratch_floats(w) + 1) * sizeof(float));
    pkvm_mm_range(w, x, xq, n, j0, j1, y, w->rows, scratch, avx);
    free(scratch);
    free(xq);
}

static const size_t ROWS = 37, COLS = 96, N = 11;

static void check_batch_independence(pkvm_wtype t, int q8, int avx) {
    pkvm_wmat w;
    make_mat(&w, t, ROWS, COLS);
    float *x = make_x(N, COLS);
    float *all = malloc(N * ROWS * sizeof *all), *one = malloc(ROWS * sizeof *one),
          *split = malloc(N * ROWS * sizeof *split);
    product(&w, x, N, q8, avx, 0, ROWS, all);
    /* Outputs split at an odd point, as threads split them. */
    product(&w, x, N, q8, avx, 0, 5, split);
    product(&w, x, N, q8, avx, 5, ROWS, split);
    for (size_t i = 0; i < N; i++) {
        product(&w, x + i * COLS, 1, q8, avx, 0, ROWS, one);
        for (size_t j = 0; j < ROWS; j++) {
            cr_assert(!memcmp(&one[j], &all[i * ROWS + j], 4) &&
                          !memcmp(&split[i * ROWS + j], &all[i * ROWS + j], 4),
                      "type %d q8 %d avx %d: y[%zu][%zu] is %.9g in a batch of %zu, %.9g "
                      "alone, %.9g split", (int)t, q8, avx, i, j, (double)all[i * ROWS + j], N,
                      (double)one[j], (double)split[i * ROWS + j]);
        }
    }
    free(all), free(one), free(split), free(x), free(w.data);
}

Test(matmul, a_rows_result_does_not_depend_on_the_batch_or_the_output_split) {
    const pkvm_wtype types[2] = {PKVM_W_Q8_0, PKVM_W_Q4_1};
    for (int a = 0; a <= pkvm_mm_cpu_avx(); a++)
        for (int t = 0; t < 2; t++)
            for (int q8 = 0; q8 < 2; q8++) check_batch_independence(types[t], q8, a);
}

Test(matmul, the_exact_kernel_is_the_f32_product_of_the_dequantized_weights) {
    const pkvm_wtype types[2] = {PKVM_W_Q8_0, PKVM_W_Q4_1};
    for (int a = 0; a <= pkvm_mm_cpu_avx(); a++)
        for (int t = 0; t < 2; t++) {
            pkvm_wmat w, f;
            make_mat(&w, types[t], ROWS, COLS);
            f = w;
            f.type = PKVM_W_F32;
            f.row_bytes = COLS * sizeof(float);
            f.data = malloc(ROWS * f.row_bytes);
            for (size_t j = 0; j < ROWS; j++)
                pkvm_wmat_row_f32(&w, j, (float *)(void *)(f.data + j * f.row_bytes));
            float *x = make_x(N, COLS), *yq = malloc(N * ROWS * 4), *yf = malloc(N * ROWS * 4);
            product(&w, x, N, 0, a, 0, ROWS, yq);
            product(&f, x, N, 0, a, 0, ROWS, yf);
            cr_assert(!memcmp(yq, yf, N * ROWS * 4), "type %d avx %d", (int)types[t], a);
            free(x), free(yq), free(yf), free(f.data), free(w.data);
        }
}

/* The q8 kernel differs from the exact one only by the rounding of x to
 * d * round(x / d): at most d / 2 per value, so per output at most
 * sum |w_k| d_k / 2, plus float rounding of the sums. */
Test(matmul, the_q8_kernel_stays_within_its_activation_rounding) {
    const pkvm_wtype types[2] = {PKVM_W_Q8_0, PKVM_W_Q4_1};
    for (int a = 0; a <= pkvm_mm_cpu_avx(); a++)
        for (int t = 0; t < 2; t++) {
            pkvm_wmat w;
            make_mat(&w, types[t], ROWS, COLS);
            float *x = make_x(N, COLS), *yq = malloc(N * ROWS * 4), *ye = malloc(N * ROWS * 4);
            float *wr = malloc(COLS * 4);
            product(&w, x, N, 1, a, 0, ROWS, yq);
            product(&w, x, N, 0, a, 0, ROWS, ye);
            double worst = 0;
            for (size_t i = 0; i < N; i++)
                for (size_t j = 0; j < ROWS; j++) {
                    pkvm_wmat_row_f32(&w, j, wr);
                    double bound = 0, mag = 0;
                    for (size_t b = 0; b < COLS / 32; b++) {
                        double amax = 0;
                        for (int k = 0; k < 32; k++) amax = fmax(amax, fabs(x[i * COLS + b * 32 + k]));
                        for (int k = 0; k < 32; k++) {
                            bound += fabs(wr[b * 32 + k]) * amax / 127.0 / 2.0;
                            mag += fabs(wr[b * 32 + k] * x[i * COLS + b * 32 + k]);
                        }
                    }
                    const double err = fabs((double)yq[i * ROWS + j] - ye[i * ROWS + j]);
                    cr_assert(err <= bound + 1e-5 * mag, "type %d avx %d: y[%zu][%zu] q8 %.9g "
                              "exact %.9g, error %g > bound %g", (int)types[t], a, i, j,
                              (double)yq[i * ROWS + j], (double)ye[i * ROWS + j], err, bound);
                    if (err / (bound + 1e-30) > worst) worst = err / (bound + 1e-30);
                }
            cr_log_info("type %d avx %d: q8 error at most %.2f of its bound", (int)types[t], a,
                        worst);
            free(x), free(yq), free(ye), free(wr), free(w.data);
        }
}

Test(matmul, avx2_and_portable_code_agree) {
    if (!pkvm_mm_cpu_avx()) cr_skip_test("no AVX2 on this CPU");
    const pkvm_wtype types[2] = {PKVM_W_Q8_0, PKVM_W_Q4_1};
    float *x = make_x(N, COLS);
    /* The activation quantization: the same bytes. */
    size_t qb = pkvm_act_q8_bytes(N, COLS);
    unsigned char *qa = malloc(qb), *qp = malloc(qb);
    pkvm_act_quantize(x, N, COLS, qa, 1);
    pkvm_act_quantize(x, N, COLS, qp, 0);
    cr_assert(!memcmp(qa, qp, qb), "AVX2 and portable activation quantization differ");
    for (int t = 0; t < 2; t++)
        for (int q8 = 0; q8 < 2; q8++) {
            pkvm_wmat w;
            make_mat(&w, types[t], ROWS, COLS);
            float *ya = malloc(N * ROWS * 4), *yp = malloc(N * ROWS * 4);
            product(&w, x, N, q8, 1, 0, ROWS, ya);
            product(&w, x, N, q8, 0, 0, ROWS, yp);
            for (size_t k = 0; k < N * ROWS; k++)
                cr_assert(fabsf(ya[k] - yp[k]) <= 1e-4f * (1.0f + fabsf(yp[k])),
                          "type %d q8 %d: [%zu] avx %.9g portable %.9g", (int)types[t], q8, k,
                          (double)ya[k], (double)yp[k]);
            free(ya), free(yp), free(w.data);
        }
    free(qa), free(qp), free(x);
}

/*
 * matmul.h — the model's weight matrices and their products with activation rows.
 *
 * A matrix is f32 (the seeded presets, and GGUF tensors of other types, converted
 * at load) or keeps a GGUF's quantized blocks (Q8_0, Q4_1) repacked with f32
 * scales. Its product with n activation rows, y[i][j] = W[j] . x[i], has two
 * kernels:
 *  - exact: f32 activations; a quantized row is dequantized to the f32 values
 *    the GGUF reader gives (d*q, d*q + m) and multiplied as an f32 row is, so the
 *    result is the f32 model's to the bit;
 *  - q8: the activations are quantized to 8 bits per block of 32 (a scale
 *    amax/127 per block, as llama.cpp does) and each block's dot product is
 *    computed in integers (AVX2 maddubs, or portable C), then scaled; only for
 *    quantized matrices (an f32 matrix always takes the exact kernel).
 * Each output element is one fixed sequence of operations, whatever the batch,
 * the tile it falls in or the thread computing it, so a row's result depends
 * only on that row (model.c's determinism rests on this). The AVX2 code is used
 * when the CPU has AVX2 and FMA (pkvm_mm_cpu_avx), decided once by the caller.
 *
 * Not thread-safe per call: the caller splits the outputs [j0, j1) over threads,
 * each with its own scratch (pkvm_mm_scratch_floats).
 */
#ifndef PKV_MODEL_MATMUL_H
#define PKV_MODEL_MATMUL_H

#include <stddef.h>
#include <stdint.h>

typedef enum pkvm_wtype {
    PKVM_W_F32 = 0,
    PKVM_W_Q8_0 = 1, /* per 32 values: f32 d, 32 int8 q; value d*q */
    PKVM_W_Q4_1 = 2, /* per 32 values: f32 d, f32 m, 16 bytes; value j < 16 is the
                        low nibble of byte j, j + 16 its high nibble; d*q + m */
} pkvm_wtype;

typedef struct pkvm_wmat {
    pkvm_wtype type;
    size_t rows, cols; /* cols % 32 == 0 for quantized types */
    size_t row_bytes;
    unsigned char *data; /* rows * row_bytes: f32, or repacked blocks (matmul.c) */
} pkvm_wmat;

/* Bytes of one row of `cols` values (cols % 32 == 0 unless f32). */
size_t pkvm_wmat_row_bytes(pkvm_wtype t, size_t cols);
/* Repack one row of ggml blocks (Q8_0 or Q4_1, as in the GGUF file) into row
 * `row` of w. */
void pkvm_wmat_pack_row(pkvm_wmat *w, size_t row, const void *ggml_blocks);
/* Row `row` as cols floats. */
void pkvm_wmat_row_f32(const pkvm_wmat *w, size_t row, float *out);

/* n activation rows quantized for the q8 kernel: per block of 32 values a scale
 * d = amax / 127 and q = round(x / d) (half to even), and d * sum(q). */
size_t pkvm_act_q8_bytes(size_t n, size_t cols);
void pkvm_act_quantize(const float *x, size_t n, size_t cols, void *xq, int avx);

/* Floats of scratch one thread needs for products with w (exact kernel's
 * dequantized panel). */
size_t pkvm_mm_scratch_floats(const pkvm_wmat *w);

/* y[i * ldy + j] = W[j] . x[i] for i < n, j in [j0, j1). xq NULL: the exact
 * kernel on x (n rows of w->cols floats); else the q8 kernel on xq
 * (pkvm_act_quantize of x; w quantized). scratch: pkvm_mm_scratch_floats(w). */
void pkvm_mm_range(const pkvm_wmat *w, const float *x, const void *xq, size_t n, size_t j0,
                   size_t j1, float *y, size_t ldy, float *scratch, int avx);

/* Whether this CPU runs the AVX2+FMA kernels. */
int pkvm_mm_cpu_avx(void);

#endif

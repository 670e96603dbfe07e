/*
 * gguf_build.h — builds small GGUF images in memory for the reader and tokenizer
 * tests (tests/test_gguf.c, tests/test_tokenizer.c).
 *
 * Owns: a byte writer (little-endian integers, length-prefixed strings, padding)
 * and two canned files: gb_sample, which holds one key/value of every metadata
 * type and one tensor of several types, with knobs that break one thing each;
 * and gb_tiny_tokenizer, a byte-level BPE vocabulary (256 byte tokens, a few
 * merges, ChatML specials) for tokenizer tests that need no model file.
 */
#ifndef PKV_GGUF_BUILD_H
#define PKV_GGUF_BUILD_H

#include <stddef.h>
#include <stdint.h>

typedef struct gb {
    unsigned char *p;
    size_t n, cap;
} gb;

void gb_u8(gb *b, uint8_t v);
void gb_u16(gb *b, uint16_t v);
void gb_u32(gb *b, uint32_t v);
void gb_u64(gb *b, uint64_t v);
void gb_f32(gb *b, float v);
void gb_bytes(gb *b, const void *p, size_t n);
void gb_str(gb *b, const char *s);
void gb_pad(gb *b, size_t align);
/* A key/value header: key, then the value type. */
void gb_key(gb *b, const char *key, uint32_t type);

/* What gb_sample breaks (all zero: a valid file). */
typedef struct gb_knobs {
    uint32_t version;        /* 0: 3 */
    const char *magic;       /* NULL: "GGUF" */
    uint64_t n_tensors_add;  /* added to the true count */
    uint64_t n_kv_add;
    uint64_t key_len_add;    /* added to the first key's length */
    uint32_t value_type;     /* non-zero: the type written for the u8 key */
    int nested_array;        /* an array of arrays */
    uint32_t tensor_type;    /* non-zero: type written for the F32 tensor, +1 */
    uint64_t tensor_offset_add; /* added to the last tensor's offset */
    uint32_t n_dims;         /* non-zero: n_dims written for the first tensor */
    uint64_t dim0;           /* non-zero: first tensor's dim 0 */
    uint32_t alignment;      /* non-zero: general.alignment */
    int dup_key, dup_tensor;
    uint8_t bool_value;      /* written for the bool key (default 1) */
    int bool_value_set;
} gb_knobs;

/* The sample file (tensors in this order):
 *   t.f32  F32  [4, 2]  = 0.5 * (i - 3)  for element i of 8
 *   t.f16  F16  [4]     = 1, -2, 0.5, 65504
 *   t.q8_0 Q8_0 [32, 2] row r: d = 0.5 * (r + 1), q_j = j - 16
 *   t.q4_1 Q4_1 [32]    d = 1, m = -2, byte j = j | (15 - j) << 4
 *   t.bf16 BF16 [2]     = 1.5, -3
 *   t.q4_0 Q4_0 [32]    d = 2, byte j = j | (15 - j) << 4
 *   t.q2_k Q2_K [256]   zeros (a known type without a converter)
 * Metadata: general.architecture "test", general.alignment 32 (or the knob),
 * k.u8 7, k.i8 -7, k.u16 700, k.i16 -700, k.u32 70000, k.i32 -70000, k.f32 1.25,
 * k.bool 1, k.str "hello", k.u64 2^40, k.i64 -2^40, k.f64 2.5,
 * k.arr_i32 [1, -2, 3], k.arr_f32 [0.5, 1.5], k.arr_str ["a", "", "ccc"],
 * k.arr_empty [] (of u8). The image is malloc'd: free(*img). */
unsigned char *gb_sample(const gb_knobs *k, size_t *len);

/* A tokenizer-only GGUF: id b < 256 is the GPT-2 character of byte b, then "<|endoftext|>" 256, "<|im_start|>" 257,
 * "<|im_end|>" 258 (CONTROL), then merged tokens from `merges` (each "A B", in
 * rank order, its result appended as the next id). pre: tokenizer.ggml.pre
 * (NULL: absent); model: tokenizer.ggml.model (NULL: "gpt2"); with_template adds
 * a ChatML template with a default system message "Be brief." */
unsigned char *gb_tiny_tokenizer(const char *const *merges, size_t n_merges, const char *pre,
                                 const char *model, int with_template, size_t *len);

#endif

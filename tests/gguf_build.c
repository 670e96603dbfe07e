/*
 * gguf_build.c — the in-memory GGUF writer of gguf_build.h.
 */
#include "gguf_build.h"

#include <stdlib.h>
#include <string.h>

static void grow(gb *b, size_t n) {
    if (b->cap - b->n >= n) return;
    size_t nc = b->cap ? b->cap : 1024;
    while (nc - b->n < n) nc *= 2;
    b->p = realloc(b->p, nc);
    if (!b->p) abort();
    b->cap = nc;
}

void gb_bytes(gb *b, const void *p, size_t n) {
    grow(b, n);
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}

void gb_u8(gb *b, uint8_t v) { gb_bytes(b, &v, 1); }
void gb_u16(gb *b, uint16_t v) { gb_bytes(b, &v, 2); }
void gb_u32(gb *b, uint32_t v) { gb_bytes(b, &v, 4); }
void gb_u64(gb *b, uint64_t v) { gb_bytes(b, &v, 8); }
void gb_f32(gb *b, float v) { gb_bytes(b, &v, 4); }

void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_bytes(b, s, strlen(s));
}

void gb_pad(gb *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}

void gb_key(gb *b, const char *key, uint32_t type) {
    gb_str(b, key);
    gb_u32(b, type);
}

/* ---- The sample file ------------------------------------------------------------ */

typedef struct tinfo {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[2];
    uint32_t type;
    size_t nbytes;
} tinfo;

static const tinfo sample_tensors[] = {
    {"t.f32", 2, {4, 2}, 0, 32},   {"t.f16", 1, {4, 1}, 1, 8},
    {"t.q8_0", 2, {32, 2}, 8, 68}, {"t.q4_1", 1, {32, 1}, 3, 20},
    {"t.bf16", 1, {2, 1}, 30, 4},  {"t.q4_0", 1, {32, 1}, 2, 18},
    {"t.q2_k", 1, {256, 1}, 10, 84},
};
#define N_SAMPLE_TENSORS (sizeof sample_tensors / sizeof sample_tensors[0])
#define N_SAMPLE_KV 18u

static void sample_kvs(gb *b, const gb_knobs *k) {
    uint32_t align = k->alignment ? k->alignment : 32;
    gb_u64(b, strlen("general.architecture") + k->key_len_add);
    gb_bytes(b, "general.architecture", strlen("general.architecture"));
    gb_u32(b, 8);
    gb_str(b, "test");
    gb_key(b, "general.alignment", 4), gb_u32(b, align);
    gb_key(b, "k.u8", k->value_type ? k->value_type : 0), gb_u8(b, 7);
    gb_key(b, "k.i8", 1), gb_u8(b, (uint8_t)-7);
    gb_key(b, "k.u16", 2), gb_u16(b, 700);
    gb_key(b, "k.i16", 3), gb_u16(b, (uint16_t)-700);
    gb_key(b, "k.u32", 4), gb_u32(b, 70000);
    gb_key(b, "k.i32", 5), gb_u32(b, (uint32_t)-70000);
    gb_key(b, "k.f32", 6), gb_f32(b, 1.25f);
    gb_key(b, k->dup_key ? "k.u8" : "k.bool", 7), gb_u8(b, k->bool_value_set ? k->bool_value : 1);
    gb_key(b, "k.str", 8), gb_str(b, "hello");
    gb_key(b, "k.u64", 10), gb_u64(b, 1ull << 40);
    gb_key(b, "k.i64", 11), gb_u64(b, (uint64_t)-(int64_t)(1ll << 40));
    double f64 = 2.5;
    gb_key(b, "k.f64", 12), gb_bytes(b, &f64, 8);
    gb_key(b, "k.arr_i32", 9), gb_u32(b, k->nested_array ? 9 : 5), gb_u64(b, 3);
    gb_u32(b, 1), gb_u32(b, (uint32_t)-2), gb_u32(b, 3);
    gb_key(b, "k.arr_f32", 9), gb_u32(b, 6), gb_u64(b, 2), gb_f32(b, 0.5f), gb_f32(b, 1.5f);
    gb_key(b, "k.arr_str", 9), gb_u32(b, 8), gb_u64(b, 3);
    gb_str(b, "a"), gb_str(b, ""), gb_str(b, "ccc");
    gb_key(b, "k.arr_empty", 9), gb_u32(b, 0), gb_u64(b, 0);
}

static void tensor_data(gb *b, size_t i) {
    switch (i) {
    case 0:
        for (int j = 0; j < 8; j++) gb_f32(b, 0.5f * (float)(j - 3));
        break;
    case 1: gb_u16(b, 0x3c00), gb_u16(b, 0xc000), gb_u16(b, 0x3800), gb_u16(b, 0x7bff); break;
    case 2:
        for (int r = 0; r < 2; r++) {
            gb_u16(b, r == 0 ? 0x3800 : 0x3c00); /* 0.5, 1.0 */
            for (int j = 0; j < 32; j++) gb_u8(b, (uint8_t)(int8_t)(j - 16));
        }
        break;
    case 3:
        gb_u16(b, 0x3c00), gb_u16(b, 0xc000); /* d = 1, m = -2 */
        for (int j = 0; j < 16; j++) gb_u8(b, (uint8_t)(j | (15 - j) << 4));
        break;
    case 4: gb_u16(b, 0x3fc0), gb_u16(b, 0xc040); break; /* 1.5, -3 */
    case 5:
        gb_u16(b, 0x4000); /* d = 2 */
        for (int j = 0; j < 16; j++) gb_u8(b, (uint8_t)(j | (15 - j) << 4));
        break;
    default:
        for (size_t j = 0; j < sample_tensors[i].nbytes; j++) gb_u8(b, 0);
    }
}

unsigned char *gb_sample(const gb_knobs *kn, size_t *len) {
    gb_knobs zero = {0};
    const gb_knobs *k = kn ? kn : &zero;
    uint32_t align = k->alignment ? k->alignment : 32;
    if (align & (align - 1)) align = 32; /* the data is laid out as a valid file */
    gb b = {0};
    gb_bytes(&b, k->magic ? k->magic : "GGUF", 4);
    gb_u32(&b, k->version ? k->version : 3);
    gb_u64(&b, N_SAMPLE_TENSORS + k->n_tensors_add);
    gb_u64(&b, N_SAMPLE_KV + k->n_kv_add);
    sample_kvs(&b, k);
    size_t off = 0;
    for (size_t i = 0; i < N_SAMPLE_TENSORS; i++) {
        const tinfo *t = &sample_tensors[i];
        gb_str(&b, (k->dup_tensor && i == 1) ? sample_tensors[0].name : t->name);
        gb_u32(&b, (i == 0 && k->n_dims) ? k->n_dims : t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            gb_u64(&b, (i == 0 && d == 0 && k->dim0) ? k->dim0 : t->ne[d]);
        gb_u32(&b, (i == 0 && k->tensor_type) ? k->tensor_type - 1 : t->type);
        gb_u64(&b, off + (i == N_SAMPLE_TENSORS - 1 ? k->tensor_offset_add : 0));
        off += t->nbytes;
        off = (off + align - 1) / align * align;
    }
    gb_pad(&b, align);
    for (size_t i = 0; i < N_SAMPLE_TENSORS; i++) {
        tensor_data(&b, i);
        if (i + 1 < N_SAMPLE_TENSORS) gb_pad(&b, align);
    }
    *len = b.n;
    return b.p;
}

/* ---- The tiny tokenizer ----------------------------------------------------------- */

static size_t byte_char(unsigned v, char out[4]) {
    unsigned next = 256, cp = 0;
    for (unsigned b = 0; b <= v; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        cp = printable ? b : next++;
    }
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

unsigned char *gb_tiny_tokenizer(const char *const *merges, size_t n_merges, const char *pre,
                                 const char *model, int with_template, size_t *len) {
    static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    size_t n_tok = 256 + 3 + n_merges;
    gb b = {0};
    gb_bytes(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, 7 + (pre != NULL) + (with_template != 0));
    gb_key(&b, "tokenizer.ggml.model", 8), gb_str(&b, model ? model : "gpt2");
    if (pre) gb_key(&b, "tokenizer.ggml.pre", 8), gb_str(&b, pre);
    gb_key(&b, "tokenizer.ggml.tokens", 9), gb_u32(&b, 8), gb_u64(&b, n_tok);
    for (unsigned v = 0; v < 256; v++) {
        char c[4];
        size_t l = byte_char(v, c);
        gb_u64(&b, l), gb_bytes(&b, c, l);
    }
    for (size_t i = 0; i < 3; i++) gb_str(&b, specials[i]);
    for (size_t i = 0; i < n_merges; i++) { /* the merge's result: "A B" without the space */
        const char *sp = strchr(merges[i], ' ');
        if (!sp) { /* a malformed merge: its token is the text as it is */
            gb_str(&b, merges[i]);
            continue;
        }
        gb_u64(&b, strlen(merges[i]) - 1);
        gb_bytes(&b, merges[i], (size_t)(sp - merges[i]));
        gb_bytes(&b, sp + 1, strlen(sp + 1));
    }
    gb_key(&b, "tokenizer.ggml.token_type", 9), gb_u32(&b, 5), gb_u64(&b, n_tok);
    for (size_t i = 0; i < n_tok; i++) gb_u32(&b, i >= 256 && i < 259 ? 3 : 1);
    gb_key(&b, "tokenizer.ggml.merges", 9), gb_u32(&b, 8), gb_u64(&b, n_merges);
    for (size_t i = 0; i < n_merges; i++) gb_str(&b, merges[i]);
    gb_key(&b, "tokenizer.ggml.bos_token_id", 4), gb_u32(&b, 257);
    gb_key(&b, "tokenizer.ggml.eos_token_id", 4), gb_u32(&b, 258);
    gb_key(&b, "tokenizer.ggml.padding_token_id", 4), gb_u32(&b, 258);
    if (with_template) {
        gb_key(&b, "tokenizer.chat_template", 8);
        gb_str(&b, "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                   "'system' %}{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
                   "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\n' }}{% endif %}");
    }
    *len = b.n;
    return b.p;
}

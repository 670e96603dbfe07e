/*
 * test_gguf.c — the GGUF reader (src/model/gguf.c): a hand-built file reads back
 * every field and converts every supported tensor type exactly; every kind of
 * damage (truncation at each offset, bad magic and version, impossible counts,
 * strings and tensor data past the end, misalignment, unknown types, nesting,
 * duplicates) is refused with its documented error and a message that says
 * where; and the real SmolLM2 file ($PKV_MODEL, fetched by scripts/get-model.sh)
 * opens with the model's hyper-parameters and dequantizes rows exactly as the
 * gguf package does (tests/data/smollm2-fixture.json).
 */
#include "fixture_json.h"
#include "gguf.h"
#include "gguf_build.h"
#include "model_file.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Open a copy of img[0..len) in a buffer of exactly len bytes (so a read past the
 * end is caught by ASan). */
static int open_copy(const unsigned char *img, size_t len, pkv_gguf **g, void **copy) {
    *copy = malloc(len ? len : 1);
    cr_assert_not_null(*copy);
    memcpy(*copy, img, len);
    return pkv_gguf_open_mem(*copy, len, g);
}

/* Build the sample with knobs and expect the open to fail with `code` and a
 * message containing `what`. */
static void expect_refused(const gb_knobs *k, int code, const char *what) {
    size_t len;
    unsigned char *img = gb_sample(k, &len);
    pkv_gguf *g = NULL;
    void *copy;
    int rc = open_copy(img, len, &g, &copy);
    cr_expect_eq(rc, code, "rc %d, want %d (%s)", rc, code, pkv_gguf_last_error());
    cr_expect_null(g);
    cr_expect(strstr(pkv_gguf_last_error(), what) != NULL, "message '%s' lacks '%s'",
              pkv_gguf_last_error(), what);
    free(copy);
    free(img);
}

Test(gguf, sample_reads_back_every_field) {
    size_t len;
    unsigned char *img = gb_sample(NULL, &len);
    pkv_gguf *g;
    void *copy;
    cr_assert_eq(open_copy(img, len, &g, &copy), 0, "%s", pkv_gguf_last_error());
    cr_expect_eq(pkv_gguf_version(g), 3);
    cr_expect_eq(pkv_gguf_n_kv(g), 18);
    cr_expect_eq(pkv_gguf_n_tensors(g), 7);
    cr_expect_eq(pkv_gguf_alignment(g), 32);

    pkv_gguf_str s;
    cr_assert_eq(pkv_gguf_get_str(g, "general.architecture", &s), 0);
    cr_expect(s.len == 4 && !memcmp(s.ptr, "test", 4));
    cr_assert_eq(pkv_gguf_get_str(g, "k.str", &s), 0);
    cr_expect(s.len == 5 && !memcmp(s.ptr, "hello", 5));
    uint32_t u;
    cr_expect(pkv_gguf_get_u32(g, "k.u8", &u) == 0 && u == 7);
    cr_expect(pkv_gguf_get_u32(g, "k.u16", &u) == 0 && u == 700);
    cr_expect(pkv_gguf_get_u32(g, "k.u32", &u) == 0 && u == 70000);
    cr_expect_eq(pkv_gguf_get_u32(g, "k.i8", &u), PKV_EINVAL); /* negative */
    cr_expect_eq(pkv_gguf_get_u32(g, "k.i32", &u), PKV_EINVAL);
    cr_expect_eq(pkv_gguf_get_u32(g, "k.u64", &u), PKV_EINVAL); /* 2^40 */
    cr_expect_eq(pkv_gguf_get_u32(g, "k.str", &u), PKV_EINVAL);
    cr_expect_eq(pkv_gguf_get_u32(g, "no.such.key", &u), PKV_EINVAL);
    cr_expect(strstr(pkv_gguf_last_error(), "not found"));
    float f;
    cr_expect(pkv_gguf_get_f32(g, "k.f32", &f) == 0 && f == 1.25f);
    cr_expect(pkv_gguf_get_f32(g, "k.f64", &f) == 0 && f == 2.5f);
    cr_expect_eq(pkv_gguf_get_f32(g, "k.u32", &f), PKV_EINVAL);
    int bv;
    cr_expect(pkv_gguf_get_bool(g, "k.bool", &bv) == 0 && bv == 1);
    cr_expect_eq(pkv_gguf_type(g, (uint64_t)pkv_gguf_find(g, "k.i16")), PKV_GGUF_I16);
    cr_expect_eq(pkv_gguf_type(g, (uint64_t)pkv_gguf_find(g, "k.i64")), PKV_GGUF_I64);
    cr_expect_eq(pkv_gguf_find(g, "k.absent"), -1);
    pkv_gguf_str k0 = pkv_gguf_key(g, 0);
    cr_expect(k0.len == 20 && !memcmp(k0.ptr, "general.architecture", 20));

    pkv_gguf_arr a;
    cr_assert_eq(pkv_gguf_get_arr(g, "k.arr_i32", PKV_GGUF_I32, &a), 0);
    cr_expect(a.n == 3 && pkv_gguf_arr_i32(&a, 0) == 1 && pkv_gguf_arr_i32(&a, 1) == -2 &&
              pkv_gguf_arr_i32(&a, 2) == 3);
    cr_assert_eq(pkv_gguf_get_arr(g, "k.arr_f32", PKV_GGUF_F32, &a), 0);
    cr_expect(a.n == 2 && pkv_gguf_arr_f32(&a, 0) == 0.5f && pkv_gguf_arr_f32(&a, 1) == 1.5f);
    cr_assert_eq(pkv_gguf_get_arr(g, "k.arr_str", PKV_GGUF_STRING, &a), 0);
    cr_expect_eq(a.n, 3);
    pkv_gguf_str e0 = pkv_gguf_arr_str(&a, 0), e1 = pkv_gguf_arr_str(&a, 1),
                 e2 = pkv_gguf_arr_str(&a, 2);
    cr_expect(e0.len == 1 && e0.ptr[0] == 'a' && e1.len == 0 && e2.len == 3 &&
              !memcmp(e2.ptr, "ccc", 3));
    cr_expect_eq(pkv_gguf_get_arr(g, "k.arr_str", PKV_GGUF_I32, &a), PKV_EINVAL);
    cr_expect(pkv_gguf_get_arr(g, "k.arr_empty", PKV_GGUF_U8, &a) == 0 && a.n == 0);

    static const struct { const char *name; uint32_t type, n_dims; uint64_t ne0, rows; } want[] = {
        {"t.f32", 0, 2, 4, 2},   {"t.f16", 1, 1, 4, 1},  {"t.q8_0", 8, 2, 32, 2},
        {"t.q4_1", 3, 1, 32, 1}, {"t.bf16", 30, 1, 2, 1}, {"t.q4_0", 2, 1, 32, 1},
        {"t.q2_k", 10, 1, 256, 1}};
    for (size_t i = 0; i < 7; i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_find(g, want[i].name);
        cr_assert_not_null(t, "%s", want[i].name);
        cr_expect_eq(t, pkv_gguf_tensor_at(g, i));
        cr_expect_eq(t->type, want[i].type);
        cr_expect_eq(t->n_dims, want[i].n_dims);
        cr_expect_eq(t->ne[0], want[i].ne0);
        cr_expect_eq(t->n_rows, want[i].rows);
        cr_expect_eq(t->offset % 32, 0);
        cr_expect((const unsigned char *)t->data + t->nbytes <= (const unsigned char *)copy + len);
    }
    cr_expect_null(pkv_gguf_tensor_find(g, "t.absent"));
    cr_expect_str_eq(pkv_gguf_type_name(8), "Q8_0");
    cr_expect_str_eq(pkv_gguf_type_name(4), "unknown");
    pkv_gguf_close(g);
    free(copy);
    free(img);
}

Test(gguf, converts_every_supported_type_exactly) {
    size_t len;
    unsigned char *img = gb_sample(NULL, &len);
    pkv_gguf *g;
    cr_assert_eq(pkv_gguf_open_mem(img, len, &g), 0, "%s", pkv_gguf_last_error());
    float out[256];

    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.f32"), out), 0);
    for (int i = 0; i < 8; i++) cr_expect_eq(out[i], 0.5f * (float)(i - 3));
    cr_assert_eq(pkv_gguf_row_f32(pkv_gguf_tensor_find(g, "t.f32"), 1, out), 0);
    cr_expect_eq(out[0], 0.5f);
    cr_expect_eq(pkv_gguf_row_f32(pkv_gguf_tensor_find(g, "t.f32"), 2, out), PKV_ERANGE);

    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.f16"), out), 0);
    cr_expect(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f && out[3] == 65504.0f);

    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.q8_0"), out), 0);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 32; j++)
            cr_expect_eq(out[r * 32 + j], (r ? 1.0f : 0.5f) * (float)(j - 16), "row %d el %d", r, j);

    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.q4_1"), out), 0);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(out[j], (float)j - 2.0f, "low nibble %d", j);
        cr_expect_eq(out[j + 16], (float)(15 - j) - 2.0f, "high nibble %d", j);
    }
    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.q4_0"), out), 0);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(out[j], 2.0f * (float)(j - 8));
        cr_expect_eq(out[j + 16], 2.0f * (float)(15 - j - 8));
    }
    cr_assert_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.bf16"), out), 0);
    cr_expect(out[0] == 1.5f && out[1] == -3.0f);

    cr_expect_eq(pkv_gguf_tensor_f32(pkv_gguf_tensor_find(g, "t.q2_k"), out), PKV_ENOTSUP);
    cr_expect(strstr(pkv_gguf_last_error(), "unsupported tensor type Q2_K"),
              "%s", pkv_gguf_last_error());
    pkv_gguf_close(g);
    free(img);
}

Test(gguf, half_conversions_are_exact) {
    cr_expect_eq(pkv_gguf_f16(0x0000), 0.0f);
    cr_expect(signbit(pkv_gguf_f16(0x8000)));
    cr_expect_eq(pkv_gguf_f16(0x0001), ldexpf(1.0f, -24)); /* smallest subnormal */
    cr_expect_eq(pkv_gguf_f16(0x03ff), ldexpf(1023.0f, -24));
    cr_expect_eq(pkv_gguf_f16(0x0400), ldexpf(1.0f, -14)); /* smallest normal */
    cr_expect_eq(pkv_gguf_f16(0x3555), 0.333251953125f);
    cr_expect(isinf(pkv_gguf_f16(0x7c00)) && isnan(pkv_gguf_f16(0x7e00)));
    cr_expect_eq(pkv_gguf_bf16(0x3f80), 1.0f);
}

Test(gguf, truncated_at_every_offset_is_refused) {
    size_t len;
    unsigned char *img = gb_sample(NULL, &len);
    for (size_t cut = 0; cut < len; cut++) {
        pkv_gguf *g = NULL;
        void *copy;
        int rc = open_copy(img, cut, &g, &copy);
        cr_expect_eq(rc, PKV_ECORRUPT, "cut at %zu of %zu: rc %d", cut, len, rc);
        cr_expect_null(g);
        cr_expect(strstr(pkv_gguf_last_error(), "offset") || strstr(pkv_gguf_last_error(), "end"),
                  "cut at %zu: message '%s'", cut, pkv_gguf_last_error());
        free(copy);
    }
    free(img);
}

Test(gguf, bad_magic_and_versions_are_refused) {
    expect_refused(&(gb_knobs){.magic = "GGML"}, PKV_ECORRUPT, "bad magic at offset 0");
    expect_refused(&(gb_knobs){.version = 1}, PKV_EVERSION, "version 1");
    expect_refused(&(gb_knobs){.version = 4}, PKV_EVERSION, "version 4");
    expect_refused(&(gb_knobs){.version = 0x03000000u}, PKV_EVERSION, "big-endian");
    /* Version 2 has the same layout: accepted. */
    size_t len;
    unsigned char *img = gb_sample(&(gb_knobs){.version = 2}, &len);
    pkv_gguf *g;
    cr_expect_eq(pkv_gguf_open_mem(img, len, &g), 0, "%s", pkv_gguf_last_error());
    pkv_gguf_close(g);
    free(img);
}

Test(gguf, huge_counts_are_refused_before_allocating) {
    expect_refused(&(gb_knobs){.n_tensors_add = 1ull << 60}, PKV_ECORRUPT, "tensor count");
    expect_refused(&(gb_knobs){.n_kv_add = UINT64_MAX - 18}, PKV_ECORRUPT, "key/value count");
    /* A count that fits the bound but not the file: the reader runs out of bytes. */
    expect_refused(&(gb_knobs){.n_kv_add = 20}, PKV_ECORRUPT, "offset");
}

Test(gguf, string_past_the_end_is_refused) {
    expect_refused(&(gb_knobs){.key_len_add = 1ull << 40}, PKV_ECORRUPT,
                   "key at offset 24: length");
    expect_refused(&(gb_knobs){.key_len_add = UINT64_MAX - 19}, PKV_ECORRUPT, "key at offset 24");
}

Test(gguf, tensor_data_past_the_end_is_refused) {
    expect_refused(&(gb_knobs){.tensor_offset_add = 4096}, PKV_ECORRUPT,
                   "tensor 't.q2_k': data");
    expect_refused(&(gb_knobs){.tensor_offset_add = 1ull << 63}, PKV_ECORRUPT,
                   "runs past the end");
    expect_refused(&(gb_knobs){.dim0 = 1ull << 62}, PKV_ECORRUPT, "t.f32");
    expect_refused(&(gb_knobs){.dim0 = 1ull << 40}, PKV_ECORRUPT, "past the end");
}

Test(gguf, misaligned_offset_is_refused) {
    expect_refused(&(gb_knobs){.tensor_offset_add = 4}, PKV_ECORRUPT,
                   "not a multiple of the alignment 32");
    expect_refused(&(gb_knobs){.alignment = 24}, PKV_ECORRUPT, "general.alignment 24");
}

Test(gguf, unknown_types_are_refused) {
    expect_refused(&(gb_knobs){.value_type = 13}, PKV_ECORRUPT, "unknown value type 13");
    expect_refused(&(gb_knobs){.tensor_type = 4 + 1}, PKV_ECORRUPT, "unknown type 4");
    expect_refused(&(gb_knobs){.tensor_type = 200 + 1}, PKV_ECORRUPT, "unknown type 200");
    expect_refused(&(gb_knobs){.nested_array = 1}, PKV_ECORRUPT, "array of arrays");
}

Test(gguf, bad_shapes_and_duplicates_are_refused) {
    expect_refused(&(gb_knobs){.n_dims = 5}, PKV_ECORRUPT, "n_dims 5");
    expect_refused(&(gb_knobs){.dim0 = 3, .tensor_type = 8 + 1}, PKV_ECORRUPT,
                   "not a multiple of Q8_0's block of 32");
    expect_refused(&(gb_knobs){.dup_key = 1}, PKV_ECORRUPT, "duplicate key 'k.u8'");
    expect_refused(&(gb_knobs){.dup_tensor = 1}, PKV_ECORRUPT, "duplicate tensor name 't.f32'");
    expect_refused(&(gb_knobs){.bool_value = 2, .bool_value_set = 1}, PKV_ECORRUPT, "bool value 2");
}

Test(gguf, missing_file_is_an_io_error) {
    pkv_gguf *g;
    cr_expect_eq(pkv_gguf_open("/nonexistent/model.gguf", &g), PKV_EIO);
    cr_expect(strstr(pkv_gguf_last_error(), "/nonexistent/model.gguf"));
    cr_expect_eq(pkv_gguf_open(NULL, &g), PKV_EINVAL);
}

/* ---- The real model ------------------------------------------------------------ */

static fj *fixture(void) {
    const char *err = NULL;
    fj *fx = fj_load(PKV_FIXTURE_DIR "/smollm2-fixture.json", &err);
    cr_assert_not_null(fx, "fixture: %s", err);
    return fx;
}

Test(gguf_model, smollm2_hyper_parameters) {
    const char *path = pt_model_path();
    pkv_gguf *g;
    cr_assert_eq(pkv_gguf_open(path, &g), 0, "%s", pkv_gguf_last_error());
    uint32_t u;
    float f;
    pkv_gguf_str s;
    cr_expect(pkv_gguf_get_str(g, "general.architecture", &s) == 0 && s.len == 5 &&
              !memcmp(s.ptr, "llama", 5));
    cr_expect(pkv_gguf_get_u32(g, "llama.block_count", &u) == 0 && u == 30);
    cr_expect(pkv_gguf_get_u32(g, "llama.embedding_length", &u) == 0 && u == 576);
    cr_expect(pkv_gguf_get_u32(g, "llama.feed_forward_length", &u) == 0 && u == 1536);
    cr_expect(pkv_gguf_get_u32(g, "llama.attention.head_count", &u) == 0 && u == 9);
    cr_expect(pkv_gguf_get_u32(g, "llama.attention.head_count_kv", &u) == 0 && u == 3);
    cr_expect(pkv_gguf_get_u32(g, "llama.rope.dimension_count", &u) == 0 && u == 64);
    cr_expect(pkv_gguf_get_u32(g, "llama.vocab_size", &u) == 0 && u == 49152);
    cr_expect(pkv_gguf_get_f32(g, "llama.rope.freq_base", &f) == 0 && f == 100000.0f);
    cr_expect(pkv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f) == 0 &&
              f == 1e-5f);
    pkv_gguf_arr a;
    cr_expect(pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_STRING, &a) == 0 &&
              a.n == 49152);
    /* 30 layers x 9 tensors + token_embd + output_norm; the output is tied. */
    cr_expect_eq(pkv_gguf_n_tensors(g), 272);
    cr_expect_null(pkv_gguf_tensor_find(g, "output.weight"));
    const pkv_gguf_tensor *e = pkv_gguf_tensor_find(g, "token_embd.weight");
    cr_assert_not_null(e);
    cr_expect(e->ne[0] == 576 && e->ne[1] == 49152 && e->type == PKV_GGUF_T_Q8_0);
    const pkv_gguf_tensor *q = pkv_gguf_tensor_find(g, "blk.0.attn_q.weight");
    cr_assert_not_null(q);
    cr_expect(q->ne[0] == 576 && q->ne[1] == 576 && q->type == PKV_GGUF_T_Q4_1);
    const pkv_gguf_tensor *k = pkv_gguf_tensor_find(g, "blk.29.attn_k.weight");
    cr_expect(k && k->ne[0] == 576 && k->ne[1] == 192);
    pkv_gguf_close(g);
}

Test(gguf_model, rows_match_the_reference_dequantization) {
    const char *path = pt_model_path();
    fj *fx = fixture();
    pkv_gguf *g;
    cr_assert_eq(pkv_gguf_open(path, &g), 0, "%s", pkv_gguf_last_error());
    const fj *ws = fj_get(fx, "weights");
    cr_assert(ws && ws->kind == FJ_ARR && ws->len >= 10);
    float *row = malloc(49152 * sizeof *row);
    for (size_t i = 0; i < ws->len; i++) {
        const fj *w = &ws->item[i];
        const char *name = fj_get(w, "tensor")->str;
        uint64_t r = (uint64_t)fj_get(w, "row")->num;
        const fj *vals = fj_get(w, "values");
        const pkv_gguf_tensor *t = pkv_gguf_tensor_find(g, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_str_eq(pkv_gguf_type_name(t->type), fj_get(w, "type")->str);
        cr_assert_eq(pkv_gguf_row_f32(t, r, row), 0, "%s", pkv_gguf_last_error());
        for (size_t j = 0; j < vals->len; j++)
            cr_expect_eq(row[j], (float)vals->item[j].num, "%s row %llu [%zu]: %.9g vs %.9g",
                         name, (unsigned long long)r, j, row[j], vals->item[j].num);
    }
    free(row);
    pkv_gguf_close(g);
    fj_free(fx);
}

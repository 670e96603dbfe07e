/*
 * fuzz_gguf.c — libFuzzer harness for the GGUF reader and the tokenizer built
 * from it (src/model/gguf.c, src/model/tokenizer.c; docs/testing-fuzz.md).
 *
 * Input: a GGUF image, opened in place (pkv_gguf_open_mem). A refused image must
 * be refused with PKV_ECORRUPT or PKV_EVERSION and a message. An accepted one is
 * read through every accessor: each key by name with every typed getter, every
 * array element, every tensor's first and last row converted to f32 (types
 * without a converter must say PKV_ENOTSUP), each tensor's data checked to lie in
 * the input. Then the tokenizer is loaded from it; when it loads, a fixed text and
 * the input's first bytes are encoded (every id below the vocabulary size) and
 * decoded, and the chat template is rendered.
 */
#include "fuzz_common.h"
#include "gguf.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

static void read_value(const pkv_gguf *g, const char *key, pkv_gguf_vtype type) {
    uint32_t u;
    float f;
    int b;
    pkv_gguf_str s;
    int rc = pkv_gguf_get_u32(g, key, &u);
    FZ_ASSERT(rc == 0 || rc == PKV_EINVAL, "get_u32 rc %d", rc);
    rc = pkv_gguf_get_f32(g, key, &f);
    FZ_ASSERT((rc == 0) == (type == PKV_GGUF_F32 || type == PKV_GGUF_F64), "get_f32 rc %d", rc);
    rc = pkv_gguf_get_bool(g, key, &b);
    FZ_ASSERT((rc == 0) == (type == PKV_GGUF_BOOL), "get_bool rc %d", rc);
    FZ_ASSERT(rc || b == 0 || b == 1, "bool %d", b);
    rc = pkv_gguf_get_str(g, key, &s);
    FZ_ASSERT((rc == 0) == (type == PKV_GGUF_STRING), "get_str rc %d", rc);
    if (type != PKV_GGUF_ARRAY) return;
    for (int et = 0; et <= PKV_GGUF_F64; et++) {
        pkv_gguf_arr a;
        if (pkv_gguf_get_arr(g, key, (pkv_gguf_vtype)et, &a)) continue;
        volatile uint64_t sink = 0;
        for (uint64_t i = 0; i < a.n && i < 4096; i++) {
            if (et == PKV_GGUF_STRING) {
                pkv_gguf_str e = pkv_gguf_arr_str(&a, i);
                if (e.len) sink += (unsigned char)e.ptr[0] + (unsigned char)e.ptr[e.len - 1];
            } else if (et == PKV_GGUF_I32) {
                sink += (uint64_t)pkv_gguf_arr_i32(&a, i);
            } else if (et == PKV_GGUF_F32) {
                sink += pkv_gguf_arr_f32(&a, i) > 0;
            }
        }
        (void)sink;
    }
}

static void read_tensors(const pkv_gguf *g, const uint8_t *data, size_t size) {
    for (uint64_t i = 0; i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        FZ_ASSERT(p >= data && t->nbytes <= size && (size_t)(p - data) <= size - t->nbytes,
                  "tensor %llu's data lies outside the input", (unsigned long long)i);
        FZ_ASSERT(t->n_rows * t->row_bytes == t->nbytes, "rows x row bytes != bytes");
        FZ_ASSERT(pkv_gguf_tensor_find(g, "") == NULL, "empty name found");
        if (t->ne[0] > (1u << 16)) continue;
        float *row = malloc(t->ne[0] * sizeof *row);
        if (!row) continue;
        uint64_t rows[2] = {0, t->n_rows - 1};
        for (int k = 0; k < 2; k++) {
            int rc = pkv_gguf_row_f32(t, rows[k], row);
            FZ_ASSERT(rc == 0 || (rc == PKV_ENOTSUP && !pkv_gguf_type_supported(t->type)),
                      "row_f32 rc %d on type %u", rc, t->type);
        }
        FZ_ASSERT(pkv_gguf_row_f32(t, t->n_rows, row) == PKV_ERANGE, "row past the end");
        free(row);
    }
}

static void use_tokenizer(const pkv_gguf *g, const uint8_t *data, size_t size) {
    pkv_tok *t;
    if (pkv_tok_load(g, &t)) return;
    static const char fixed[] = "<|im_start|>user\nHello, world! it's 2024 \xe2\x9c\x93  x\n";
    const char *texts[2] = {fixed, (const char *)data};
    size_t lens[2] = {sizeof fixed - 1, size < 256 ? size : 256};
    for (int k = 0; k < 2; k++) {
        uint32_t *ids;
        size_t n;
        int rc = pkv_tok_encode(t, texts[k], lens[k], k == 0, &ids, &n);
        FZ_ASSERT(rc == 0 || rc == PKV_ENOMEM, "encode rc %d", rc);
        if (rc) continue;
        for (size_t i = 0; i < n; i++)
            FZ_ASSERT(ids[i] < pkv_tok_vocab(t), "id %u >= vocabulary %u", ids[i], pkv_tok_vocab(t));
        char *back;
        size_t bl;
        rc = pkv_tok_decode(t, ids, n, &back, &bl);
        FZ_ASSERT(rc == 0 || rc == PKV_ENOMEM, "decode rc %d", rc);
        if (!rc) free(back);
        free(ids);
    }
    pkv_chat_msg m[] = {{"user", "hi"}, {"assistant", "hello"}};
    char *text;
    size_t len;
    if (pkv_tok_chat(t, m, 2, 1, &text, &len) == 0) free(text);
    pkv_tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pkv_gguf *g;
    int rc = pkv_gguf_open_mem(data, size, &g);
    if (rc) {
        FZ_ASSERT(rc == PKV_ECORRUPT || rc == PKV_EVERSION || rc == PKV_ENOMEM,
                  "open rc %d (%s)", rc, pkv_gguf_last_error());
        FZ_ASSERT(pkv_gguf_last_error()[0], "a refusal without a message");
        return 0;
    }
    static char key[65536];
    for (uint64_t i = 0; i < pkv_gguf_n_kv(g); i++) {
        pkv_gguf_str k = pkv_gguf_key(g, i);
        memcpy(key, k.ptr, k.len);
        key[k.len] = 0;
        FZ_ASSERT(pkv_gguf_find(g, key) == (int64_t)i, "key %llu not found by name",
                  (unsigned long long)i);
        read_value(g, key, pkv_gguf_type(g, i));
    }
    read_tensors(g, data, size);
    use_tokenizer(g, data, size);
    pkv_gguf_close(g);
    return 0;
}

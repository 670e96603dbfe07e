/*
 * test_tokenizer.c — the byte-level BPE tokenizer (src/model/tokenizer.c).
 *
 * On a tiny hand-built vocabulary (tests/gguf_build.c): merges by rank, the
 * pre-tokenizer's piece boundaries (gpt2 vs smollm's digit split), special
 * tokens, the ChatML template, byte-exact round trips of arbitrary bytes, and
 * the refusal of unsupported or inconsistent tokenizers. On the real SmolLM2
 * file ($PKV_MODEL): identical ids to the reference tokenizer on every text of
 * tests/data/smollm2-fixture.json, decode(encode(x)) == x, and the chat template
 * rendered as transformers renders it.
 */
#include "fixture_json.h"
#include "gguf_build.h"
#include "tokenizer.h"
#include "model_file.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tiny {
    unsigned char *img;
    pkv_gguf *g;
    pkv_tok *t;
} tiny;

static int tiny_open(tiny *x, const char *const *merges, size_t n, const char *pre,
                     const char *model, int tpl) {
    size_t len;
    x->img = gb_tiny_tokenizer(merges, n, pre, model, tpl, &len);
    x->t = NULL;
    cr_assert_eq(pkv_gguf_open_mem(x->img, len, &x->g), 0, "%s", pkv_gguf_last_error());
    return pkv_tok_load(x->g, &x->t);
}

static void tiny_close(tiny *x) {
    pkv_tok_free(x->t);
    pkv_gguf_close(x->g);
    free(x->img);
}

/* Encode s and compare with want[0..n). */
static void expect_ids(const pkv_tok *t, const char *s, int special, const uint32_t *want,
                       size_t n) {
    uint32_t *ids;
    size_t got;
    cr_assert_eq(pkv_tok_encode(t, s, strlen(s), special, &ids, &got), 0, "%s",
                 pkv_tok_last_error());
    int same = got == n && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    char msg[512] = "";
    for (size_t i = 0, o = 0; i < got && o + 12 < sizeof msg; i++)
        o += (size_t)snprintf(msg + o, sizeof msg - o, "%u ", ids[i]);
    cr_expect(same, "'%s': got [%s] (%zu ids, want %zu)", s, msg, got, n);
    free(ids);
}

/* "Ġ" is the GPT-2 character of the space byte. */
static const char *const merges[] = {
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ Ġ",
    "a 1",
};
enum { HE = 259, LL, HELL, HELLO, SP_W, OR, SP_WOR, SP_WORL, SP_WORLD, SP_SP, A1 };

Test(tokenizer, merges_apply_by_rank) {
    tiny x;
    cr_assert_eq(tiny_open(&x, merges, 11, "smollm", NULL, 0), 0, "%s", pkv_tok_last_error());
    cr_expect_eq(pkv_tok_vocab(x.t), 270);
    cr_expect_eq(pkv_tok_bos(x.t), 257);
    cr_expect_eq(pkv_tok_eos(x.t), 258);
    expect_ids(x.t, "hello world", 1, (uint32_t[]){HELLO, SP_WORLD}, 2);
    expect_ids(x.t, "hell", 1, (uint32_t[]){HELL}, 1);
    /* "he" + "ll" outrank "h"+"e"... in order: "hel" has no "el" merge. */
    expect_ids(x.t, "hel", 1, (uint32_t[]){HE, 'l'}, 2);
    expect_ids(x.t, "", 1, NULL, 0);
    tiny_close(&x);
}

Test(tokenizer, pre_tokenizer_boundaries_stop_merges) {
    tiny x;
    cr_assert_eq(tiny_open(&x, merges, 11, "gpt2", NULL, 0), 0, "%s", pkv_tok_last_error());
    /* Letters and digits are separate pieces: "a" "1". */
    expect_ids(x.t, "a1", 1, (uint32_t[]){'a', '1'}, 2);
    /* "\s+(?!\S)": of two spaces before a word, one stays with the word. */
    expect_ids(x.t, "a  b", 1, (uint32_t[]){'a', ' ', ' ', 'b'}, 4);
    /* Trailing whitespace is one piece. */
    expect_ids(x.t, "a  ", 1, (uint32_t[]){'a', SP_SP}, 2);
    /* gpt2: "a", " ", " 1" (the space joins the number). */
    expect_ids(x.t, "a  1", 1, (uint32_t[]){'a', ' ', ' ', '1'}, 4);
    tiny_close(&x);

    cr_assert_eq(tiny_open(&x, merges, 11, "smollm", NULL, 0), 0, "%s", pkv_tok_last_error());
    cr_expect_str_eq(pkv_tok_pre(x.t), "smollm");
    /* smollm: the digit is split off first, so "a  " ends its piece: "ĠĠ" merges. */
    expect_ids(x.t, "a  1", 1, (uint32_t[]){'a', SP_SP, '1'}, 3);
    /* Contractions are pieces of their own; "'S" is not one. */
    expect_ids(x.t, "he'll", 1, (uint32_t[]){HE, '\'', LL}, 3);
    tiny_close(&x);
}

Test(tokenizer, special_tokens_are_recognised_in_text) {
    tiny x;
    cr_assert_eq(tiny_open(&x, merges, 11, "smollm", NULL, 0), 0, "%s", pkv_tok_last_error());
    expect_ids(x.t, "<|im_start|>hello<|im_end|>", 1, (uint32_t[]){257, HELLO, 258}, 3);
    expect_ids(x.t, "<|im_start", 1, (uint32_t[]){'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'}, 10);
    uint32_t *ids;
    size_t n;
    cr_assert_eq(pkv_tok_encode(x.t, "<|im_end|>", 10, 0, &ids, &n), 0);
    cr_expect(n > 1 && ids[0] == '<', "parse_special 0 encodes the text as text");
    free(ids);
    cr_expect(pkv_tok_is_special(x.t, 256) && !pkv_tok_is_special(x.t, HE));
    cr_expect_eq(pkv_tok_find(x.t, "<|im_end|>"), 258);
    char *text;
    size_t len;
    cr_assert_eq(pkv_tok_decode(x.t, (uint32_t[]){257, HELLO, SP_WORLD, 258}, 4, &text, &len), 0);
    cr_expect_str_eq(text, "<|im_start|>hello world<|im_end|>");
    free(text);
    cr_expect_eq(pkv_tok_decode(x.t, (uint32_t[]){270}, 1, &text, &len), PKV_ERANGE);
    tiny_close(&x);
}

Test(tokenizer, any_bytes_round_trip) {
    tiny x;
    cr_assert_eq(tiny_open(&x, merges, 11, "smollm", NULL, 0), 0, "%s", pkv_tok_last_error());
    unsigned seed = 12345;
    char s[200];
    for (int it = 0; it < 2000; it++) {
        size_t n = (size_t)(it % 200);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            /* Mostly text-like bytes, some UTF-8 lead/continuation and invalid ones. */
            unsigned r = (seed >> 16) % 16;
            s[i] = r < 8 ? "hel o1'\n"[r] : (char)((seed >> 8) & 0xff);
        }
        uint32_t *ids;
        size_t m;
        cr_assert_eq(pkv_tok_encode(x.t, s, n, 1, &ids, &m), 0);
        char *back;
        size_t bl;
        cr_assert_eq(pkv_tok_decode(x.t, ids, m, &back, &bl), 0);
        cr_assert(bl == n && !memcmp(back, s, n), "round trip %d (%zu bytes)", it, n);
        free(back);
        free(ids);
    }
    tiny_close(&x);
}

Test(tokenizer, chatml_template_with_default_system) {
    tiny x;
    cr_assert_eq(tiny_open(&x, merges, 11, "smollm", NULL, 1), 0, "%s", pkv_tok_last_error());
    cr_assert_str_eq(pkv_tok_default_system(x.t), "Be brief.");
    char *text;
    size_t len;
    pkv_chat_msg m1[] = {{"user", "Hi"}};
    cr_assert_eq(pkv_tok_chat(x.t, m1, 1, 1, &text, &len), 0);
    cr_expect_str_eq(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                           "<|im_end|>\n<|im_start|>assistant\n");
    cr_expect_eq(len, strlen(text));
    free(text);
    pkv_chat_msg m2[] = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}};
    cr_assert_eq(pkv_tok_chat(x.t, m2, 3, 0, &text, &len), 0);
    cr_expect_str_eq(text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                           "<|im_start|>assistant\nA<|im_end|>\n");
    free(text);
    tiny_close(&x);
}

Test(tokenizer, unsupported_or_inconsistent_tokenizers_are_refused) {
    tiny x;
    cr_expect_eq(tiny_open(&x, merges, 11, "smollm", "llama", 0), PKV_ENOTSUP);
    cr_expect(strstr(pkv_tok_last_error(), "llama"));
    tiny_close(&x);
    cr_expect_eq(tiny_open(&x, merges, 11, "qwen2", NULL, 0), PKV_ENOTSUP);
    cr_expect(strstr(pkv_tok_last_error(), "qwen2"));
    tiny_close(&x);
    static const char *const bad[] = {"h e", "hq e"};
    cr_expect_eq(tiny_open(&x, bad, 2, "smollm", NULL, 0), PKV_ECORRUPT);
    cr_expect(strstr(pkv_tok_last_error(), "merge 1"), "%s", pkv_tok_last_error());
    tiny_close(&x);
    static const char *const nospace[] = {"he"};
    cr_expect_eq(tiny_open(&x, nospace, 1, "smollm", NULL, 0), PKV_ECORRUPT);
    tiny_close(&x);
}

/* ---- The real model ------------------------------------------------------------ */

typedef struct real {
    pkv_gguf *g;
    pkv_tok *t;
    fj *fx;
} real;

static void real_open(real *r) {
    const char *path = pt_model_path();
    cr_assert_eq(pkv_gguf_open(path, &r->g), 0, "%s", pkv_gguf_last_error());
    cr_assert_eq(pkv_tok_load(r->g, &r->t), 0, "%s", pkv_tok_last_error());
    const char *err = NULL;
    r->fx = fj_load(PKV_FIXTURE_DIR "/smollm2-fixture.json", &err);
    cr_assert_not_null(r->fx, "fixture: %s", err);
}

static void real_close(real *r) {
    fj_free(r->fx);
    pkv_tok_free(r->t);
    pkv_gguf_close(r->g);
}

/* ids of `text` equal the fixture's array `want`; returns 1 if so. */
static int same_ids(const pkv_tok *t, const char *text, size_t len, const fj *want,
                    size_t *first_diff) {
    uint32_t *ids;
    size_t n;
    cr_assert_eq(pkv_tok_encode(t, text, len, 1, &ids, &n), 0, "%s", pkv_tok_last_error());
    size_t i = 0;
    while (i < n && i < want->len && ids[i] == (uint32_t)want->item[i].num) i++;
    *first_diff = i;
    int ok = i == n && n == want->len;
    free(ids);
    return ok;
}

Test(tokenizer_model, fixture_texts_give_the_reference_ids) {
    real r;
    real_open(&r);
    cr_expect_eq(pkv_tok_vocab(r.t), 49152);
    cr_expect_str_eq(pkv_tok_pre(r.t), "smollm");
    const fj *tk = fj_get(r.fx, "tokenizer");
    cr_expect_eq(pkv_tok_bos(r.t), (uint32_t)fj_get(tk, "bos")->num);
    cr_expect_eq(pkv_tok_eos(r.t), (uint32_t)fj_get(tk, "eos")->num);
    const fj *texts = fj_get(r.fx, "texts");
    cr_assert(texts && texts->len >= 50, "the fixture has >= 50 texts");
    size_t bad = 0;
    for (size_t i = 0; i < texts->len; i++) {
        const fj *e = &texts->item[i];
        const fj *s = fj_get(e, "text");
        size_t at;
        if (!same_ids(r.t, s->str, s->len, fj_get(e, "ids"), &at)) {
            bad++;
            cr_log_error("text %zu '%s': ids differ from index %zu", i, s->str, at);
        }
    }
    cr_expect_eq(bad, 0, "%zu of %zu texts tokenized differently", bad, texts->len);
    const fj *prompts = fj_get(r.fx, "prompts");
    for (size_t i = 0; i < prompts->len; i++) {
        const fj *p = &prompts->item[i];
        const fj *s = fj_get(p, "text");
        size_t at;
        cr_expect(same_ids(r.t, s->str, s->len, fj_get(p, "ids"), &at),
                  "prompt %s: ids differ from index %zu", fj_get(p, "name")->str, at);
    }
    real_close(&r);
}

Test(tokenizer_model, decode_of_encode_is_the_text) {
    real r;
    real_open(&r);
    const fj *groups[] = {fj_get(r.fx, "texts"), fj_get(r.fx, "prompts")};
    for (size_t k = 0; k < 2; k++)
        for (size_t i = 0; i < groups[k]->len; i++) {
            const fj *s = fj_get(&groups[k]->item[i], "text");
            uint32_t *ids;
            size_t n, len;
            char *back;
            cr_assert_eq(pkv_tok_encode(r.t, s->str, s->len, 1, &ids, &n), 0);
            cr_assert_eq(pkv_tok_decode(r.t, ids, n, &back, &len), 0);
            cr_expect(len == s->len && !memcmp(back, s->str, len), "round trip of '%s'", s->str);
            free(back);
            free(ids);
        }
    /* The reference's greedy continuations decode to its text. */
    const fj *prompts = fj_get(r.fx, "prompts");
    for (size_t i = 0; i < prompts->len; i++) {
        const fj *gr = fj_get(&prompts->item[i], "greedy");
        uint32_t ids[64];
        for (size_t j = 0; j < gr->len && j < 64; j++) ids[j] = (uint32_t)gr->item[j].num;
        char *text;
        size_t len;
        cr_assert_eq(pkv_tok_decode(r.t, ids, gr->len, &text, &len), 0);
        cr_expect_str_eq(text, fj_get(&prompts->item[i], "greedy_text")->str);
        free(text);
    }
    real_close(&r);
}

Test(tokenizer_model, chat_template_renders_as_the_reference) {
    real r;
    real_open(&r);
    cr_expect_str_eq(pkv_tok_default_system(r.t),
                     "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    const fj *chats = fj_get(r.fx, "chats");
    cr_assert(chats && chats->len >= 3);
    for (size_t i = 0; i < chats->len; i++) {
        const fj *msgs = fj_get(&chats->item[i], "messages");
        pkv_chat_msg m[8];
        cr_assert(msgs->len <= 8);
        for (size_t j = 0; j < msgs->len; j++)
            m[j] = (pkv_chat_msg){fj_get(&msgs->item[j], "role")->str,
                                  fj_get(&msgs->item[j], "content")->str};
        char *text;
        size_t len;
        cr_assert_eq(pkv_tok_chat(r.t, m, msgs->len, 1, &text, &len), 0);
        cr_expect_str_eq(text, fj_get(&chats->item[i], "text")->str, "chat %zu", i);
        free(text);
    }
    real_close(&r);
}

Test(tokenizer_model, model_id_names_file_and_tokenizer) {
    real r;
    real_open(&r);
    char id[PKV_MODEL_ID_MAX + 1];
    cr_assert_eq(pkv_tok_model_id(r.g, r.t, id, sizeof id), 0, "%s", pkv_tok_last_error());
    char want[256];
    snprintf(want, sizeof want, "gguf-sha256:%s;tok=gpt2/smollm/49152",
             fj_get(fj_get(r.fx, "model"), "sha256")->str);
    cr_expect_str_eq(id, want);
    cr_expect_eq(pkv_tok_model_id(r.g, r.t, id, 16), PKV_ERANGE);
    real_close(&r);
}

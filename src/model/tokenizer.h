/*
 * tokenizer.h — the byte-level BPE tokenizer of a GGUF model (tokenizer.ggml.model
 * "gpt2"), its chat template, and the model identity built from both.
 *
 * Owns: text <-> token ids for the model, as the model was trained:
 *  - special tokens (token type CONTROL or USER_DEFINED, e.g. <|im_start|>) are
 *    recognised in the text first (longest match at each position) and become
 *    their own ids;
 *  - the rest is pre-tokenized by the regex tokenizer.ggml.pre names, written out
 *    by hand with Unicode categories from unicode_table.h. Supported: "gpt2"
 *    ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)
 *    and "smollm", "starcoder", "refact", "codeshell" (every \p{N} code point
 *    split off on its own first, then the gpt2 regex on what lies between);
 *  - each piece's UTF-8 bytes are mapped to GPT-2's byte characters and merged
 *    by rank (tokenizer.ggml.merges: lowest rank first, leftmost on a tie);
 *  - a byte whose character is not in the vocabulary is dropped, as the reference
 *    (Hugging Face tokenizers) drops it: SmolLM2 has no token for the control
 *    bytes 0x04 0x06 0x13 0x14 0x16 0x1d nor for bytes that never occur in UTF-8;
 *  - decode maps the byte characters back, so decode(encode(x)) == x for every
 *    byte string x without such bytes (invalid UTF-8 included; special tokens
 *    decode to their text).
 * Invariants after a successful load: every merge names two tokens of the
 * vocabulary whose concatenation is a token; bos/eos/pad ids, when present, are
 * < n_vocab.
 *
 * The chat template: the ChatML shape ("<|im_start|>" role "\n" content
 * "<|im_end|>\n" per message, "<|im_start|>assistant\n" as the generation
 * prompt) and, when tokenizer.chat_template inserts a default system message
 * for conversations that start without one (as SmolLM2's does), that message.
 * Other templates (no <|im_start|>/<|im_end|> in them) give PKV_ENOTSUP.
 *
 * Part of the model library (src/model/). Functions return 0 or a negative
 * PKV_E* code; pkv_tok_last_error() has the message. Nothing blocks but
 * pkv_tok_model_id (hashes the whole file). A loaded tokenizer points into the
 * GGUF mapping: free it before closing the GGUF. It is read-only after load, so
 * threads may share it.
 */
#ifndef PKV_TOKENIZER_H
#define PKV_TOKENIZER_H

#include "gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pkv_tok pkv_tok;

#define PKV_TOK_NONE UINT32_MAX /* an absent bos/eos/pad id */

/* Build the tokenizer from the GGUF's tokenizer.* keys. PKV_ENOTSUP (not a "gpt2"
 * tokenizer, or a pre-tokenizer not listed above), PKV_ECORRUPT (missing keys,
 * a merge of unknown tokens, ids out of range),
 * PKV_ENOMEM, PKV_EINVAL (NULL). */
int pkv_tok_load(const pkv_gguf *g, pkv_tok **out);
void pkv_tok_free(pkv_tok *t);
const char *pkv_tok_last_error(void);

uint32_t pkv_tok_vocab(const pkv_tok *t);
uint32_t pkv_tok_bos(const pkv_tok *t);
uint32_t pkv_tok_eos(const pkv_tok *t);
uint32_t pkv_tok_pad(const pkv_tok *t);
/* "smollm", "gpt2", ... */
const char *pkv_tok_pre(const pkv_tok *t);
/* Whether id is a special (CONTROL or USER_DEFINED) token. */
int pkv_tok_is_special(const pkv_tok *t, uint32_t id);
/* The id of a token's exact text (e.g. "<|im_end|>"), or PKV_TOK_NONE. */
uint32_t pkv_tok_find(const pkv_tok *t, const char *text);

/* Encode text[0..len) (any bytes). *ids is allocated (free() it), *n ids. With
 * parse_special 0, special tokens' text is encoded as plain text. PKV_ENOMEM,
 * PKV_EINVAL. */
int pkv_tok_encode(const pkv_tok *t, const char *text, size_t len, int parse_special,
                   uint32_t **ids, size_t *n);
/* Decode ids into *text (allocated, NUL-terminated, free() it), *len bytes.
 * PKV_ERANGE (an id >= n_vocab), PKV_ENOMEM, PKV_EINVAL. */
int pkv_tok_decode(const pkv_tok *t, const uint32_t *ids, size_t n, char **text,
                   size_t *len);

/* ---- Chat template ------------------------------------------------------------ */

typedef struct pkv_chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} pkv_chat_msg;

/* Render msgs[0..n) as the model's template does (with the generation prompt
 * "<|im_start|>assistant\n" when add_generation_prompt); *text is allocated.
 * PKV_ENOTSUP (a template that is not ChatML), PKV_ENOMEM, PKV_EINVAL. */
int pkv_tok_chat(const pkv_tok *t, const pkv_chat_msg *msgs, size_t n,
                 int add_generation_prompt, char **text, size_t *len);
/* The default system message the template inserts, or NULL when it has none. */
const char *pkv_tok_default_system(const pkv_tok *t);

/* ---- Identity ------------------------------------------------------------------ */

/* "gguf-sha256:<64 hex>;tok=gpt2/<pre>/<n_vocab>" into buf (cap >= 128): the
 * string to store as pkv_options.model_id, so a cache built with another model
 * file or tokenizer is refused (PKV_EMODEL). Hashes the whole file (0.07 s per 100 MB
 * with the x86 SHA extensions, 0.3 s without). PKV_ERANGE (cap too small), PKV_EINVAL. */
int pkv_tok_model_id(const pkv_gguf *g, const pkv_tok *t, char *buf, size_t cap);

#endif

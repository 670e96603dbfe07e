/*
 * model.h — a small Llama-style reference model that runs on pagedkv.
 *
 * Decoder-only transformer: token embedding, RMSNorm, rotary position embedding
 * (half-split, as in Llama/HF), grouped-query attention through
 * pkv_attn_decode(), SwiGLU MLP, output projection, greedy sampling. Weights are
 * generated from a seed (no download; tokens are bytes (0..255) plus a few
 * specials, so prompts are plain text), or read from a GGUF file of a real Llama
 * model (pkvm_create_gguf; its tokens come from src/model/tokenizer.h).
 *
 * Two ways to run it on a token sequence:
 *  - paged (pkvm_engine): pagedkv as an inference engine uses it: pkv_seq_open
 *    attaches the cached prefix, the rest is appended, each layer's K/V is written
 *    into the returned slots, then committed; fork and truncate are the caller's;
 *  - from scratch (pkvm_scratch): a plain contiguous KV buffer, no cache, every
 *    token computed from position 0.
 * Both run the same per-token arithmetic (pkvm_forward): a token's K/V and logits
 * depend only on the tokens up to it, never on the batch it was computed in, the
 * block layout or the thread count, so the paths agree bit for bit when their KV
 * storage types agree.
 *
 * Not part of the pagedkv library: built as a static library for tools/pkv-demo and
 * the tests. Functions return 0 or a negative PKV_E* code (detail on stderr is the
 * caller's business; pkvm_last_error() has a message).
 */
#ifndef PKV_MODEL_H
#define PKV_MODEL_H

#include "pagedkv.h"

#include <stddef.h>
#include <stdint.h>

/* Byte-level vocabulary: 0..255 are bytes, then the specials. */
#define PKVM_BOS       256u
#define PKVM_EOS       257u
#define PKVM_SYSTEM    258u /* starts the system prompt */
#define PKVM_USER      259u /* starts a user message */
#define PKVM_ASSISTANT 260u /* starts an assistant answer */
#define PKVM_VOCAB     264u

typedef struct pkvm_config {
    char name[32];       /* preset name, part of the model identity */
    uint32_t n_layers;
    uint32_t dim;        /* residual width */
    uint32_t n_heads;    /* query heads */
    uint32_t n_kv_heads; /* K/V heads; n_heads is a multiple */
    uint32_t head_dim;   /* even */
    uint32_t ffn_dim;    /* SwiGLU hidden width */
    uint32_t vocab;      /* >= PKVM_VOCAB */
    float rope_theta;
    float norm_eps;
    uint64_t seed;       /* weights are a pure function of (config, seed) */
} pkvm_config;

/* Presets: "tiny" (tests: 2 layers, width 64), "small" (4 layers, width 256) and
 * "default" (8 layers, width 512, 8 query heads / 2 K/V heads of 64, ffn 1408).
 * Returns 0, or PKV_EINVAL for an unknown name. */
int pkvm_preset(const char *name, pkvm_config *out);
/* "tiny, small, default" */
const char *pkvm_preset_names(void);

typedef struct pkvm_model pkvm_model;

/* Generate the weights. PKV_EINVAL for an inconsistent config, PKV_ENOMEM. */
int pkvm_create(const pkvm_config *cfg, pkvm_model **out);

/* A model from a GGUF file of architecture "llama" (src/model/gguf.h): its
 * hyper-parameters, and its weights: Q8_0 and Q4_1 matrices keep their blocks
 * (repacked, src/model/matmul.h), other types are converted to f32 (Q/K rows
 * put back in the half-split rotary order; the output is the embedding when the
 * file has no output.weight). The handle does not keep the file. PKV_ENOTSUP (another
 * architecture, partial rotary, a tensor type without a converter), PKV_EINVAL
 * (a key or tensor missing or of the wrong shape), PKV_ENOMEM. Blocks: converts
 * every weight (seconds for 135M parameters). */
typedef struct pkv_gguf pkv_gguf;
int pkvm_config_from_gguf(const pkv_gguf *g, pkvm_config *out);
int pkvm_create_gguf(const pkv_gguf *g, pkvm_model **out);
void pkvm_free(pkvm_model *m);
const pkvm_config *pkvm_config_of(const pkvm_model *m);
/* Parameter count. */
uint64_t pkvm_params(const pkvm_model *m);
/* Threads for matrix products and attention (1 = the caller only; default 1).
 * Not while a pkvm_forward of the model runs. */
void pkvm_set_threads(pkvm_model *m, unsigned n);
/* How products with quantized weights (Q8_0, Q4_1) are computed:
 *  - PKVM_KERNEL_EXACT (the default): f32 activations against the weights
 *    dequantized to f32, bit for bit what a model with f32 weights computes;
 *  - PKVM_KERNEL_Q8: activations quantized to 8 bits per block of 32 (as
 *    llama.cpp does) and integer dot products: several times faster, logits
 *    within the bound docs/model.md states (tests/test_real_model.c).
 * Products with f32 matrices (the seeded presets) are the same either way. K/V
 * computed with one kernel differ slightly from the other's: a cache's model
 * identity must name the kernel (pkvm_kernel_name). Not while a forward runs.
 * PKV_EINVAL for an unknown kernel. */
typedef enum pkvm_kernel { PKVM_KERNEL_EXACT = 0, PKVM_KERNEL_Q8 = 1 } pkvm_kernel;
int pkvm_set_kernel(pkvm_model *m, pkvm_kernel k);
pkvm_kernel pkvm_kernel_of(const pkvm_model *m);
/* "exact", "q8" */
const char *pkvm_kernel_name(pkvm_kernel k);
/* PKV_ATTN_* flags passed to pkv_attn_decode (default 0). */
void pkvm_set_attn_flags(pkvm_model *m, uint32_t flags);

/* The identity to store as pkv_options.model_id: preset, sizes, seed, KV dtype. */
void pkvm_model_id(const pkvm_model *m, pkv_dtype kv, char *buf, size_t cap);
/* Fill the geometry fields of `o` (layers, kv heads, head_dim) for this model. */
void pkvm_cache_geometry(const pkvm_model *m, pkv_options *o);

/* Message of the last failing pkvm_* call on this thread. */
const char *pkvm_last_error(void);

/* ---- The forward pass -------------------------------------------------------- */

/* One token to run: its K/V goes to `slot` of the view, and its attention reads
 * positions 0..pos through `table` (the block table of its sequence). */
typedef struct pkvm_row {
    uint32_t token;
    uint32_t pos;          /* position in its sequence */
    pkv_slot slot;         /* where the row's K/V is written */
    const uint32_t *table; /* covers pos + 1 tokens */
    size_t n_table;
    float *logits;         /* vocab floats, or NULL when not needed */
} pkvm_row;

/* Run n rows (any mix of sequences). Rows of one sequence must be in position
 * order and every position < pos of a row must already be written, in the view or
 * by an earlier row of this call. */
int pkvm_forward(pkvm_model *m, const pkv_kv_view *view, const pkvm_row *rows, size_t n);

/* Greedy sampling: the index of the largest logit (the lowest index on a tie). */
uint32_t pkvm_argmax(const float *logits, uint32_t vocab);
/* The index of the k-th largest logit (k = 0 is pkvm_argmax). */
uint32_t pkvm_rank(const float *logits, uint32_t vocab, uint32_t k);

/* ---- Paged path: pagedkv as an inference engine uses it ---------------------- */

typedef struct pkvm_engine pkvm_engine;

/* The cache's geometry must match the model (PKV_EGEOMETRY otherwise). */
int pkvm_engine_create(pkvm_model *m, pkv_cache *cache, pkvm_engine **out);
void pkvm_engine_free(pkvm_engine *e);
/* Tokens per append/forward/commit call in prefill (default 256). */
void pkvm_engine_set_chunk(pkvm_engine *e, size_t chunk);
/* Called after every prefill chunk with (tokens done, tokens to compute). */
void pkvm_engine_set_progress(pkvm_engine *e, void (*fn)(void *, size_t, size_t),
                              void *arg);

/* pkv_seq_open(id, salt, prompt) -- reusing the cached prefix -- then compute and
 * commit the rest of the prompt. logits (vocab floats) receive the last prompt
 * token's logits; *n_cached (may be NULL) the number of tokens reused. n >= 1. */
int pkvm_prefill(pkvm_engine *e, uint64_t id, uint64_t salt, const uint32_t *prompt,
                 size_t n, float *logits, size_t *n_cached);
/* Append n >= 1 tokens to open sequence id (which has no pending tokens), compute
 * their K/V and commit them; logits of the last one. On failure the sequence is
 * truncated back to its length before the call. */
int pkvm_extend(pkvm_engine *e, uint64_t id, const uint32_t *tokens, size_t n,
                float *logits);
/* One batched decode step: token toks[i] is appended to sequence ids[i] (distinct
 * ids) and its logits go to logits[i * vocab]. All-or-nothing on append errors. */
int pkvm_step(pkvm_engine *e, const uint64_t *ids, const uint32_t *toks, size_t n,
              float *logits);

/* ---- From scratch: a contiguous KV buffer, no cache ------------------------- */

typedef struct pkvm_scratch pkvm_scratch;

/* A KV buffer for max_ctx tokens stored as `kv` (laid out
 * [layer][K|V][kv_head][token][head_dim], described as one block). */
int pkvm_scratch_create(pkvm_model *m, pkv_dtype kv, size_t max_ctx, pkvm_scratch **out);
void pkvm_scratch_free(pkvm_scratch *s);
/* Compute tokens[0..n) from position 0; logits of the last token. 1 <= n <= max_ctx.
 * If all_logits is not NULL it receives the logits of every position ([n][vocab]). */
int pkvm_scratch_run(pkvm_scratch *s, const uint32_t *tokens, size_t n, float *logits,
                     float *all_logits);

#endif

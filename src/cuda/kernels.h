/*
 * kernels.h — the device code of the CUDA layer (src/cuda/kernels.cu), seen from
 * C. Every launcher returns a cudaError_t (as int): the launch error, 0 on
 * success. Only built with the CUDA layer.
 */
#ifndef PKV_CUDA_KERNELS_H
#define PKV_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_cuk_attn {
    const void *base;     /* device: block 0, layer 0, K, head 0, token 0 */
    size_t block_stride, layer_off, kind_stride, head_stride, token_stride;
    uint64_t num_blocks;
    uint32_t dtype;       /* pkv_dtype */
    uint32_t block_size, head_dim, num_q_heads, num_kv_heads, g;
    const uint32_t *tables; /* device [n_seqs][table_stride] */
    size_t table_stride;
    const uint32_t *lens;   /* device [n_seqs] */
    uint32_t n_seqs, max_len;
    const float *q;         /* device [n_seqs][num_q_heads][head_dim] */
    float *out;             /* device, same shape (may equal q) */
    float scale_log2;       /* scale * log2(e) */
    /* pkv_attn_plan */
    uint32_t variant, ht, tiles, n_splits, split_len;
    float *ws;              /* n_splits > 1: accumulators, then (max, sum) pairs */
    size_t ws_acc_floats;
} pkv_cuk_attn;

int pkv_cuk_attn_launch(const pkv_cuk_attn *a, void *stream);
/* Thread blocks of the kernel a's variant / ht / dtype / head_dim select that one
 * SM holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor). */
int pkv_cuk_attn_blocks_per_sm(const pkv_cuk_attn *a, int *blocks);

/* Copy n blocks of `bytes` each: dst[i] <- src[i]. descs points to n {src, dst}
 * pairs readable by the device (mapped pinned host memory). */
typedef struct pkv_cuk_copy {
    const void *src;
    void *dst;
} pkv_cuk_copy;
int pkv_cuk_gather_launch(const pkv_cuk_copy *descs, uint32_t n, uint64_t bytes, void *stream);

/* Pack the K/V rows of n tokens out of the device pool: for token i = (slot,
 * offset) and run r (layer, kind, head: runs = 2 * layers * kv heads), the row of
 * row_bytes at pool + slot*slot_bytes + r*run_bytes + offset*row_bytes goes to
 * out + (i*runs + r)*row_bytes. toks: n pairs readable by the device. */
typedef struct pkv_cuk_tok {
    uint32_t slot, offset;
} pkv_cuk_tok;
int pkv_cuk_pack_launch(const void *pool, size_t slot_bytes, const pkv_cuk_tok *toks, uint32_t n,
                        uint32_t runs, size_t run_bytes, size_t row_bytes, void *out,
                        void *stream);

#ifdef __cplusplus
}
#endif
#endif /* PKV_CUDA_KERNELS_H */

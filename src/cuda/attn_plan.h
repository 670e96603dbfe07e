/*
 * attn_plan.h — launch geometry of the paged decode-attention kernel
 * (src/cuda/kernels.cu): which kernel variant, how many query heads a thread
 * block handles, how the context is split (Flash-Decoding) and how much
 * workspace the split reduction needs. Plain C, compiled into every build and
 * unit-tested on the CPU (tests/test_residency.c).
 *
 * Grid: x = n_seqs * n_splits (sequence-major), y = num_kv_heads * tiles. Block
 * (x, y) handles tokens [split * split_len, min(len, (split + 1) * split_len)) of
 * one sequence, one kv head and `ht` of its query heads. A sequence whose length
 * fits one split writes its output directly; the others write per-split partial
 * results (running max, sum, unnormalized accumulator) that a second kernel
 * combines.
 */
#ifndef PKV_CUDA_ATTN_PLAN_H
#define PKV_CUDA_ATTN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define PKV_ATTN_VARIANT_GENERIC 0u /* any head_dim <= PKV_ATTN_GENERIC_MAX_D, scalar loads */
#define PKV_ATTN_VARIANT_FAST    1u /* head_dim 64/128/256, 16-byte aligned rows */
#define PKV_ATTN_GENERIC_MAX_D   1024u
#define PKV_ATTN_MIN_SPLIT       256u /* tokens: never split finer than this (auto) */
#define PKV_ATTN_SPLIT_ALIGN     32u  /* auto split lengths are multiples of this */
#define PKV_ATTN_SPLIT_OVERHEAD  128u /* tokens' worth of fixed cost per block (auto) */

typedef struct pkv_attn_plan {
    uint32_t variant;
    uint32_t ht;        /* query heads per thread block: fast 1, 4 or 8; generic 1 */
    uint32_t tiles;     /* ceil(g / ht) */
    uint32_t n_splits;  /* splits of the longest sequence */
    uint32_t split_len; /* tokens per split */
    uint64_t grid_x, grid_y;
    size_t ws_bytes;    /* workspace: 0 when n_splits == 1 */
    size_t ws_acc_floats; /* offset (in floats) of the (max, sum) pairs in the workspace */
} pkv_attn_plan;

/* head_dim, g = num_q_heads / num_kv_heads, geometry of the batch; split_len 0 =
 * choose; slots >= 1: thread blocks of the chosen kernel the device runs at once
 * (SMs x blocks per SM; the variant and ht do not depend on it, so a caller may
 * plan once with slots = 1 to learn them, then again); aligned16: base and every
 * stride are multiples of 16 bytes. PKV_ENOTSUP (head_dim beyond what the kernels
 * handle, a grid too large), PKV_EINVAL (zero sizes).
 *
 * Automatic splitting models the time as waves x (split length + overhead):
 * waves = ceil(blocks / slots), so a split count that leaves the last wave
 * nearly empty loses to a smaller one that fills the device, and long contexts
 * are split until the device is busy. Splits never go below PKV_ATTN_MIN_SPLIT
 * tokens. */
int pkv_attn_plan_make(uint32_t head_dim, uint32_t g, uint32_t num_kv_heads,
                       uint64_t n_seqs, uint32_t max_len, uint32_t split_len,
                       uint32_t slots, int aligned16, pkv_attn_plan *out);

#endif /* PKV_CUDA_ATTN_PLAN_H */

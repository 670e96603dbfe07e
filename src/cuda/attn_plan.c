/*
 * attn_plan.c — launch geometry of the paged decode-attention kernel (see
 * attn_plan.h).
 */
#include "cuda/attn_plan.h"

#include "internal.h"

int pkv_attn_plan_make(uint32_t head_dim, uint32_t g, uint32_t num_kv_heads,
                       uint64_t n_seqs, uint32_t max_len, uint32_t split_len,
                       uint32_t slots, int aligned16, pkv_attn_plan *out) {
    if (!out) return pkv_err(PKV_EINVAL, "plan is NULL");
    memset(out, 0, sizeof *out);
    if (!head_dim || !g || !num_kv_heads || !n_seqs || !max_len || !slots)
        return pkv_err(PKV_EINVAL, "attention plan: zero size (head_dim %u, g %u, kv heads %u, "
                       "sequences %llu, max_len %u, slots %u)", head_dim, g, num_kv_heads,
                       (unsigned long long)n_seqs, max_len, slots);
    if (aligned16 && (head_dim == 64 || head_dim == 128 || head_dim == 256)) {
        out->variant = PKV_ATTN_VARIANT_FAST;
        out->ht = g == 1 ? 1 : g <= 4 ? 4 : 8;
    } else if (head_dim <= PKV_ATTN_GENERIC_MAX_D) {
        out->variant = PKV_ATTN_VARIANT_GENERIC;
        out->ht = 1;
    } else {
        return pkv_err(PKV_ENOTSUP, "head_dim %u: the GPU kernel handles at most %u", head_dim,
                       PKV_ATTN_GENERIC_MAX_D);
    }
    out->tiles = (g + out->ht - 1) / out->ht;
    out->grid_y = (uint64_t)num_kv_heads * out->tiles;
    if (out->grid_y > 65535)
        return pkv_err(PKV_ENOTSUP, "%u kv heads x %u head tiles exceed the grid", num_kv_heads,
                       out->tiles);
    if (split_len) {
        out->split_len = split_len;
    } else {
        const uint64_t base = n_seqs * out->grid_y;
        const uint64_t most = (max_len + PKV_ATTN_MIN_SPLIT - 1) / PKV_ATTN_MIN_SPLIT;
        uint64_t best_sl = max_len, best_cost = UINT64_MAX;
        for (uint64_t ns = 1; ns <= most && ns <= 65536; ns++) {
            uint64_t sl = (max_len + ns - 1) / ns;
            sl = (sl + PKV_ATTN_SPLIT_ALIGN - 1) / PKV_ATTN_SPLIT_ALIGN * PKV_ATTN_SPLIT_ALIGN;
            if (sl > max_len) sl = max_len;
            const uint64_t real = (max_len + sl - 1) / sl;
            const uint64_t waves = (base * real + slots - 1) / slots;
            const uint64_t cost = waves * (sl + PKV_ATTN_SPLIT_OVERHEAD);
            if (cost < best_cost) { /* ties keep fewer splits */
                best_cost = cost;
                best_sl = sl;
            }
            if (base * real >= 64ull * slots) break; /* plenty of waves already */
        }
        out->split_len = (uint32_t)best_sl;
    }
    out->n_splits = (uint32_t)(((uint64_t)max_len + out->split_len - 1) / out->split_len);
    out->grid_x = n_seqs * out->n_splits;
    if (out->grid_x > 0x7fffffffull)
        return pkv_err(PKV_ENOTSUP, "%llu sequences x %u splits exceed the grid",
                       (unsigned long long)n_seqs, out->n_splits);
    if (out->n_splits > 1) {
        const uint64_t rows = n_seqs * g * num_kv_heads * out->n_splits;
        out->ws_acc_floats = (size_t)(rows * head_dim);
        out->ws_bytes = (size_t)(rows * (head_dim + 2) * sizeof(float));
    }
    return 0;
}

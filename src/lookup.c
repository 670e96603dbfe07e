/*
 * lookup.c — pkv_prefix_lookup: how many tokens of a prompt pkv_seq_open would
 * attach now, with no effect on what the cache serves, evicts, counts or logs.
 *
 * Owns nothing. It walks the prefix index with pkv_seq_open's own prefix match
 * (src/seq.c, pkv_prefix_match, in its quiet form): the same prompt cap (floor((n-1)/B) full
 * blocks, at most `capacity`), the same exact hit (rule S2: hash, parent, salt
 * and token ids equal, pkv_index_find) and the same payload rule for recovered
 * blocks (rule S1), so its answer equals the n_cached of a pkv_seq_open made in
 * its place under the same lock hold. Invariants it keeps, which are the call's
 * contract (tests/test_lookup.c checks each):
 *  - no block is acquired or released and the eviction policy's lists are not
 *    touched: the LRU order and SLRU protection stay as they were;
 *  - no counter of pkv_stats changes and no log record is written, so it works
 *    on read-only handles too;
 *  - a recovered (UNVERIFIED) block it reaches is checksummed through
 *    pkv_block_verify_quiet: a pass is kept as a pass (the same in-memory
 *    transition pkv_block_verify makes, never logged), a failure ends the count
 *    and changes nothing, leaving the BAD verdict, its counter and its log record
 *    to the serving path that next reaches the block.
 * The answer is advice: blocks may be evicted (or sealed) between a lookup and
 * a later pkv_seq_open, whose own n_cached is what the caller must use.
 * With a shared tier attached with PKV_TIER_LOOKUP, a local miss also asks the
 * tier, after the lock is released, which keys of the chain's continuation
 * exist (tier.c, pkv_tier_probe): the answer adds them, the tier's lookup
 * counters count the probe, and the cache is still left as it was (nothing is
 * read, imported or evicted). That part of the answer is a promise the open
 * may not keep (a value failing rule T1, an expiry): never more K/V served,
 * only a shorter attach.
 */
#include "internal.h"
#include "tier.h"

int pkv_prefix_lookup(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                      size_t *n_cached) {
    if (n_cached) *n_cached = 0;
    if (!c || !prompt || !n_cached)
        return pkv_err(PKV_EINVAL, "cache, prompt or n_cached is NULL");
    if (n == 0) return pkv_err(PKV_EINVAL, "a lookup needs n > 0 prompt tokens");
    PKV_REMOTE(c, pkv_remote_lookup(c, salt, prompt, n, n_cached));
    pkv_lock(c);
    const uint32_t bs = c->pool.block_size;
    uint64_t maxb = (n - 1) / bs; /* the prompt cap of pkv_seq_open */
    if (maxb > c->pool.capacity) maxb = c->pool.capacity;
    /* rules S2 and S1 as pkv_seq_open, with the quiet verification */
    const uint64_t hit = pkv_prefix_match(c, salt, prompt, maxb, NULL, true);
    const bool ask = hit < maxb && pkv_tier_lookup_on(c);
    pkv_unlock(c);
    /* PKV_TIER_LOOKUP: the blocks the tier holds after the local hit, asked
     * without the lock and promising no more than an open's fetch verifies */
    const uint64_t more = ask ? pkv_tier_probe(c, salt, prompt, hit, maxb) : 0;
    *n_cached = (size_t)((hit + more) * bs);
    return 0;
}

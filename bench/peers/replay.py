#!/usr/bin/env python3
"""replay.py — replay the Mooncake trace through vLLM's BlockPool or SGLang's
RadixCache (their released code, imported from the peers venv) and print the
bookkeeping time per full 16-token block reference and the prompt-token hit rate.

Owns: the trace-to-token mapping (bench/trace_data.c's, bit for bit: hash id X
becomes 512 tokens mix64(x ^ (X*512 + j)) >> 32 with x from the seed), the
per-request driver of each peer's cache the way its scheduler calls it, and the
timing. It feeds what `pkv-trace` feeds pagedkv with outputs zeroed: request r
brings its prompt, the cache attaches the longest cached prefix of at most
(n-1) tokens in whole blocks, the request allocates the rest, caches its full
blocks, and releases everything (tail first) before request r+1; requests are
sequential, timestamps ignored. Only the cache calls are timed: token ids and
the request object (which an engine has before it schedules) are made first.

One line of output, `key=value` pairs, for run.sh.
"""
import argparse
import gc
import json
import os
import site
import sys
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import stubload  # noqa: E402

BLOCK = 16
HASH_TOKENS = 512
M64 = (1 << 64) - 1


def load_trace(path, limit):
    reqs = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            n = int(o["input_length"])
            ids = [int(x) for x in o["hash_ids"]]
            if len(ids) != (n + HASH_TOKENS - 1) // HASH_TOKENS:
                sys.exit(f"replay.py: bad hash_ids length in {path}")
            reqs.append((n, ids))
            if limit and len(reqs) == limit:
                break
    return reqs


def mix64_np(np, z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Tokens:
    """trace_prompt() of bench/trace_data.c, vectorized."""

    def __init__(self, seed):
        import numpy as np
        self.np = np
        s = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & M64
        with np.errstate(over="ignore"):
            self.x = mix64_np(np, np.array([s], dtype=np.uint64))[0]
        self.j = np.arange(HASH_TOKENS, dtype=np.uint64)

    def prompt(self, n, ids):
        np = self.np
        base = (np.array(ids, dtype=np.uint64) * np.uint64(HASH_TOKENS))[:, None] + self.j
        with np.errstate(over="ignore"):
            t = mix64_np(np, self.x ^ base.reshape(-1)[:n]) >> np.uint64(32)
        return t.tolist()


# ---- vLLM ------------------------------------------------------------------------

VLLM_REAL = ["vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils",
             "vllm.utils.hashing", "vllm.utils.math_utils"]


class VllmRequest:
    """The fields of vllm.v1.request.Request that the block hasher and
    BlockPool.cache_full_blocks read (a text-only request without LoRA)."""

    __slots__ = ("all_token_ids", "num_tokens", "block_hashes", "mm_features",
                 "lora_request", "cache_salt", "prompt_embeds")

    def __init__(self, toks):
        self.all_token_ids = toks
        self.num_tokens = len(toks)
        self.block_hashes = []
        self.mm_features = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None


def run_vllm(reqs, tokens, capacity, hash_name):
    stubload.install(site.getsitepackages()[0], VLLM_REAL, extra_stubs=["cbor2", "xxhash"])
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.core.block_pool import BlockPool
    stubload.arm()
    hash_fn = get_hash_fn_by_name(hash_name)
    ku.init_none_hash(hash_fn)
    hasher = ku.get_request_block_hasher(BLOCK, hash_fn)
    # block 0 is vLLM's null block: capacity + 1 gives `capacity` usable blocks
    pool = BlockPool(num_gpu_blocks=capacity + 1, enable_caching=True, hash_block_size=BLOCK)
    groups = [0]
    get_cached, touch, get_new = pool.get_cached_block, pool.touch, pool.get_new_blocks
    cache_full, free = pool.cache_full_blocks, pool.free_blocks
    hit_tokens = 0
    ns = 0
    gc.collect()
    gc.freeze()
    for n, ids in reqs:
        req = VllmRequest(tokens.prompt(n, ids))
        t0 = time.perf_counter_ns()
        # Request creation: the scheduler's block hasher hashes every full block.
        req.block_hashes = hasher(req)
        # KVCacheManager.get_computed_blocks -> FullAttentionManager.find_longest_cache_hit
        hit = []
        for h in req.block_hashes[: (n - 1) // BLOCK]:
            b = get_cached(h, groups)
            if b is None:
                break
            hit.append(b[0])
        # KVCacheManager.allocate_slots: touch the hits, take new blocks, cache full ones
        touch(hit)
        need = (n + BLOCK - 1) // BLOCK - len(hit)
        if need > pool.get_num_free_blocks():
            sys.exit(f"replay.py: vllm: a request of {n} tokens does not fit")
        blocks = hit + get_new(need)
        cache_full(req, blocks, len(hit), n // BLOCK, BLOCK, 0)
        # KVCacheManager.free: tail first, so the leaves are evicted first
        free(reversed(blocks))
        ns += time.perf_counter_ns() - t0
        hit_tokens += len(hit) * BLOCK
    return ns, hit_tokens


# ---- SGLang ----------------------------------------------------------------------

SGLANG_REAL = ["sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.base_prefix_cache",
               "sglang.srt.mem_cache.cache_init_params", "sglang.srt.mem_cache.events",
               "sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.evict_policy"]


class TokenCounter:
    """SGLang's token_to_kv_pool_allocator as RadixCache.evict sees it: a count of
    free token slots, in pages (the real allocator keeps a tensor of free pages)."""

    device = "cpu"

    def __init__(self, tokens):
        self.free = tokens

    def free_segment(self, value, start_pos=0):
        self.free += len(value) - start_pos


def run_sglang(reqs, tokens, capacity):
    import torchstub
    stubload.install(site.getsitepackages()[0], SGLANG_REAL,
                     overrides={"torch": torchstub.make_module()})
    from sglang.srt.mem_cache.base_prefix_cache import (EvictParams, InsertParams,
                                                         MatchPrefixParams)
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    stubload.arm()
    alloc = TokenCounter(capacity * BLOCK)
    cache = RadixCache.create_simulated(mock_allocator=alloc, page_size=BLOCK)
    Tensor = sys.modules["torch"].Tensor
    hit_tokens = 0
    ns = 0
    gc.collect()
    gc.freeze()
    for n, ids in reqs:
        toks = array("q", tokens.prompt(n, ids))
        padded = (n + BLOCK - 1) // BLOCK * BLOCK
        kv_row = Tensor(array("q", range(padded)))  # the request's req_to_token row
        t0 = time.perf_counter_ns()
        # Req.init_next_round_input: match at most n-1 tokens, page-aligned
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, limit=n - 1)))
        prefix, node = m.device_prefix_len, m.last_device_node
        cache.inc_lock_ref(node)
        # alloc_paged_token_slots_extend: evict when the allocator is short
        need = padded - prefix
        if alloc.free < need:
            cache.evict(EvictParams(num_tokens=need - alloc.free))
            if alloc.free < need:
                sys.exit(f"replay.py: sglang: a request of {n} tokens does not fit")
        alloc.free -= need
        # cache_finished_req: insert the page-aligned prompt, free duplicates and tail
        full = n // BLOCK * BLOCK
        res = cache.insert(InsertParams(key=RadixKey(toks, limit=full), value=kv_row[:full]))
        alloc.free += (res.prefix_len - prefix) + (padded - full)
        cache.dec_lock_ref(node)
        ns += time.perf_counter_ns() - t0
        hit_tokens += prefix
    return ns, hit_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", choices=["vllm", "sglang"], required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--capacity", type=int, required=True, help="blocks of 16 tokens")
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vllm-hash", default="sha256")
    ap.add_argument("--list-stubs", action="store_true", help="print the stubbed modules")
    a = ap.parse_args()
    reqs = load_trace(a.trace, a.limit)
    tokens = Tokens(a.seed)
    prompt_tokens = sum(n for n, _ in reqs)
    full_blocks = sum(n // BLOCK for n, _ in reqs)
    t0 = time.perf_counter()
    if a.system == "vllm":
        ns, hit = run_vllm(reqs, tokens, a.capacity, a.vllm_hash)
    else:
        ns, hit = run_sglang(reqs, tokens, a.capacity)
    wall = time.perf_counter() - t0
    print(f"system={a.system} capacity={a.capacity} requests={len(reqs)} "
          f"full_blocks={full_blocks} prompt_tokens={prompt_tokens} hit_tokens={hit} "
          f"hit_pct={100.0 * hit / prompt_tokens:.4f} timed_s={ns / 1e9:.3f} "
          f"ns_per_block={ns / full_blocks:.1f} wall_s={wall:.1f}")
    if a.list_stubs:
        print("stubs: " + " ".join(sorted(set(stubload.STUBBED))))


if __name__ == "__main__":
    main()

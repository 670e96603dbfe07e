"""Fault injection for scripts/check-vllm.sh (variant E), loaded by vLLM as the
KV connector class in place of pagedkv.vllm.PagedKVConnector; never used
outside the check.

What it owns: `EvictingConnector`, the connector unchanged except that its
worker side, on the first step whose plan has a load, makes pkvd evict blocks
that the scheduler's lookup has just counted, *before* the worker's open. It
does so through the public API only (a sequence of filler tokens under a
salt of its own, committed on the same pkvd connection, so the cache, sized
small for this variant, evicts its least recently used cached blocks), which
is the race a busy cache can produce between vLLM's scheduler step and the
worker's load: the open then attaches fewer tokens than the lookup promised,
the connector reports the missing vLLM blocks through
get_block_ids_with_load_errors and vLLM recomputes them
(kv_load_failure_policy "recompute").

Why not a checksum failure: pagedkv's lookup applies rule S1 itself
(pkv_block_verify_quiet: a recovered block is checksummed when a lookup
first reaches it and a pass is kept), so a damaged block shortens the
lookup's answer and is never promised; once a lookup passed a block, the
open does not verify it again. The check covers the damaged file in variant
B instead (a short hit, the block marked BAD by the store's open).

Invariant: the filler blocks hold zeros under filler token ids and a salt no
request uses, in a cache directory of this check only; they are never
served to the engine.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from pagedkv.vllm import PagedKVConnector, PagedKVMetadata

FILLER_SALT = 0x5EED_F111  # no vLLM request's salt: salt_of(None) is 0


class EvictingConnector(PagedKVConnector):
    """PagedKVConnector whose worker evicts `PKV_CHECK_EVICT_BLOCKS` (env,
    default 13) cached blocks of pkvd before the first load it is sent."""

    _evicted = False

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if (not self._evicted and self._cache is not None
                and isinstance(meta, PagedKVMetadata) and meta.plan.loads):
            self._evicted = True
            self._evict(int(os.environ.get("PKV_CHECK_EVICT_BLOCKS", "13")))
        super().start_load_kv(forward_context, **kwargs)

    def _evict(self, n_evict: int) -> None:
        """Commit (free blocks + n_evict) blocks of filler: the first ones take
        the free blocks, the rest evict n_evict cached blocks."""
        assert self._cache is not None
        cache = self._cache
        before = cache.stats()
        bs = cache.info.block_size
        n_blocks = before.blocks_free + n_evict
        filler = [(7 + i) % 50000 + 1 for i in range(n_blocks * bs + 1)]
        sid = next(self._ids)
        seq = cache.open(sid, filler, FILLER_SALT)
        try:
            slots = seq.append(filler[seq.n_cached:n_blocks * bs])
            for b in sorted({s[0] for s in slots}):
                np.asarray(cache.block(b, writable=True))[...] = 0
            seq.commit(len(slots))
        finally:
            seq.close()
        after = cache.stats()
        print(f"check_vllm_hooks: evicted {after.evictions - before.evictions} cached blocks "
              f"between the scheduler's lookup and the worker's open", flush=True)

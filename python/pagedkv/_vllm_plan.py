"""pagedkv._vllm_plan: the pure logic of the vLLM connector (pagedkv.vllm),
importable without vllm or torch so that it is unit-tested in CI.

What it owns: the arithmetic and bookkeeping that decide *which* tokens of a
vLLM request are loaded from pagedkv and which are stored into it, and where
each pagedkv block goes in vLLM's paged KV tensor; plus the model identity
and the geometry check of a pkvd cache. pagedkv.vllm does the copies (torch)
and the vLLM plumbing; everything here is plain Python over ints and lists.

Invariants:
- a load covers whole vLLM blocks [start, end), with start the block-aligned
  length vLLM already had locally, end <= len(prompt) - 1 (vLLM must compute at
  least the last prompt token) and end a multiple of vLLM's block size, which
  pagedkv's block size divides: so every pagedkv block loaded lies inside one
  vLLM block, at an offset that is a multiple of pagedkv's block size;
- a store covers the whole pagedkv blocks of the prompt, [0, len(prompt)
  rounded down to pagedkv's block size), once per request, in the step whose
  forward completes the prompt's prefill (only then is the K/V of every prompt
  position in vLLM's blocks);
- the token ids of a load or store are the request's prompt ids, never
  anything else: pagedkv keys K/V by the exact token prefix (the first law),
  so requests whose K/V is not a function of their token ids alone (multimodal
  inputs, prompt embeddings, LoRA adapters) are neither loaded nor stored.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

# vLLM's torch dtypes by name -> pagedkv dtype names (Cache(dtype=...)).
DTYPES: dict[str, str] = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
}


def kv_dtype_name(torch_dtype: Any) -> str:
    """pagedkv's dtype name for a torch dtype (or its str()); ValueError for a
    K/V dtype pagedkv cannot store (fp8 K/V caches, ...)."""
    name = str(torch_dtype)
    if name not in DTYPES:
        raise ValueError(f"pagedkv stores f32, f16 or bf16 K/V, not {name}")
    return DTYPES[name]


def salt_of(cache_salt: Optional[str]) -> int:
    """pagedkv salt (trust domain) of a vLLM request's `cache_salt`: 0 without
    one, else 64 bits of its blake2b digest (never 0), so requests that vLLM
    keeps apart in its own prefix cache are kept apart in pagedkv too."""
    if not cache_salt:
        return 0
    d = int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest(), "little")
    return d or 1


def matched_tokens(hit: int, n_prompt: int, num_computed: int, vllm_block: int) -> int:
    """get_num_new_matched_tokens' answer: `hit` tokens of the prompt are in
    pagedkv (a side-effect-free lookup); vLLM already has `num_computed`
    (block-aligned) locally. The hit is capped at n_prompt - 1 (vLLM computes
    the last prompt token itself to sample from it), aligned down to vLLM's
    block (vLLM loads whole blocks), and only what goes beyond the local part
    counts. Never negative."""
    if n_prompt <= 1 or vllm_block <= 0:
        return 0
    hit = min(hit, n_prompt - 1)
    hit -= hit % vllm_block
    return max(hit - num_computed, 0)


def store_len(n_prompt: int, pkv_block: int) -> int:
    """How many prompt tokens a store writes: its whole pagedkv blocks (a
    partial last block would never be sealed, so never shared)."""
    return n_prompt - n_prompt % pkv_block


def load_split(start: int, end: int, n_attached: int, vllm_block: int) -> tuple[int, list[int]]:
    """A load of positions [start, end) found `n_attached` tokens in pagedkv
    when the worker opened the sequence (fewer than the scheduler's lookup if
    blocks were evicted in between, or, with pkvd's --tier-lookup, tier records
    expired or failed rule T1 at the open; a recovered block failing its checksum
    stops the lookup already, rule S1). Returns
    (good_end, failed): positions [start, good_end) are loaded, and `failed`
    lists the indices (into the request's vLLM block table) of the vLLM blocks
    in [good_end, end) that could not be: vLLM recomputes them
    (get_block_ids_with_load_errors)."""
    good = min(end, max(start, n_attached - n_attached % vllm_block))
    return good, list(range(good // vllm_block, end // vllm_block))


def load_copies(start: int, end: int, pkv_blocks: Sequence[int], vllm_blocks: Sequence[int],
                pkv_block: int, vllm_block: int) -> list[tuple[int, int, int]]:
    """The copies of a load of positions [start, end) (both multiples of
    pkv_block): one (pagedkv block, vLLM block, token offset in the vLLM block)
    per pagedkv block, from the sequence's block table `pkv_blocks` and the
    request's vLLM block table `vllm_blocks`."""
    if start % pkv_block or end % pkv_block or vllm_block % pkv_block:
        raise ValueError(f"load [{start}, {end}) not aligned to pagedkv blocks of {pkv_block} "
                         f"inside vLLM blocks of {vllm_block}")
    return [(pkv_blocks[t // pkv_block], vllm_blocks[t // vllm_block], t % vllm_block)
            for t in range(start, end, pkv_block)]


def store_reads_failed(n_tokens: int, vllm_blocks: Sequence[int], vllm_block: int,
                       failed: Iterable[int]) -> bool:
    """Whether a store of a prompt's first n_tokens would copy from a vLLM block
    whose load failed in this step. Such a block holds stale K/V until vLLM
    recomputes it, and another request scheduled in the same step may share it
    through vLLM's own prefix cache: its store must be skipped, or that stale
    K/V would be committed under its prompt's ids."""
    bad = set(failed)
    n = -(-n_tokens // vllm_block)
    return any(b in bad for b in vllm_blocks[:n])


def store_copies(first: int, slots: Sequence[tuple[int, int]], vllm_blocks: Sequence[int],
                 pkv_block: int, vllm_block: int) -> Optional[list[tuple[int, int, int]]]:
    """The copies of a store whose appended tokens start at position `first`
    (a multiple of pkv_block) and got `slots` ((block, offset) per token, in
    order): one (pagedkv block, vLLM block, token offset in the vLLM block) per
    whole pagedkv block. None when the slots are not whole blocks filled from
    offset 0 (then nothing may be committed: a block would hold K/V of some
    positions only)."""
    if first % pkv_block or len(slots) % pkv_block or vllm_block % pkv_block:
        return None
    out = []
    for i in range(0, len(slots), pkv_block):
        blk = slots[i][0]
        if any(slots[i + j][0] != blk or slots[i + j][1] != j for j in range(pkv_block)):
            return None
        t = first + i
        out.append((blk, vllm_blocks[t // vllm_block], t % vllm_block))
    return out


# ---- the plan the scheduler sends to the workers ------------------------------

@dataclass
class LoadSpec:
    """Copy pagedkv's K/V of prompt positions [start, end) into the request's
    vLLM blocks. `tokens` is prompt[:end + 1]: the open that attaches the
    prefix is capped at len - 1, hence the one extra id."""

    req_id: str
    tokens: list[int]
    salt: int
    start: int
    end: int
    block_ids: list[int]


@dataclass
class SaveSpec:
    """Store the K/V of prompt positions [0, len(tokens)) from the request's
    vLLM blocks into pagedkv (what pagedkv already holds is attached, not
    written again)."""

    req_id: str
    tokens: list[int]
    salt: int
    block_ids: list[int]


@dataclass
class StepPlan:
    """One engine step's loads and stores."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass
class _Req:
    prompt: list[int]
    salt: int
    block_ids: list[int] = field(default_factory=list)
    saved: bool = False


def request_usable(prompt: Optional[Sequence[int]], *, mm_features: Any = None,
                   lora_request: Any = None, prompt_embeds: Any = None) -> bool:
    """Whether a request's K/V is a function of its prompt ids alone, so that
    pagedkv may serve or store it under those ids: not for multimodal inputs
    (placeholder ids stand for images), prompt embeddings or LoRA adapters."""
    return (prompt is not None and len(prompt) > 0 and not mm_features
            and lora_request is None and prompt_embeds is None)


class Planner:
    """The scheduler side's bookkeeping: which requests pagedkv may serve,
    the loads vLLM accepted (update_state_after_alloc) and the vLLM block
    table of each tracked request, turned into one StepPlan per step.
    Duck-typed over vLLM's SchedulerOutput (scheduled_new_reqs,
    scheduled_cached_reqs, num_scheduled_tokens) so it is tested without vLLM.
    Not thread-safe: vLLM's scheduler calls it from one thread."""

    def __init__(self, vllm_block: int, pkv_block: int) -> None:
        if vllm_block % pkv_block:
            raise ValueError(f"pagedkv's block size {pkv_block} must divide vLLM's {vllm_block}")
        self.vllm_block = vllm_block
        self.pkv_block = pkv_block
        self._reqs: dict[str, _Req] = {}
        self._loads: dict[str, int] = {}

    def track(self, req_id: str, prompt: Optional[Sequence[int]], salt: int, usable: bool) -> None:
        """Register a request (on_new_request); an unusable one is not tracked."""
        if usable and prompt:
            self._reqs.setdefault(req_id, _Req(list(prompt), salt))

    def tracked(self, req_id: str) -> bool:
        return req_id in self._reqs

    def matched(self, req_id: str, num_computed: int,
                lookup: Callable[[list[int], int], int]) -> int:
        """get_num_new_matched_tokens for a tracked request (0 otherwise);
        `lookup(tokens, salt)` is pagedkv's side-effect-free prefix lookup."""
        r = self._reqs.get(req_id)
        if r is None:
            return 0
        return matched_tokens(lookup(r.prompt, r.salt), len(r.prompt), num_computed,
                              self.vllm_block)

    def after_alloc(self, req_id: str, num_external: int) -> None:
        """update_state_after_alloc: vLLM allocated blocks and will take
        `num_external` tokens from us in the next step."""
        if num_external > 0 and req_id in self._reqs:
            self._loads[req_id] = num_external
        else:
            self._loads.pop(req_id, None)

    def finished(self, req_id: str) -> None:
        """request_finished: forget the request."""
        self._reqs.pop(req_id, None)
        self._loads.pop(req_id, None)

    def build(self, out: Any) -> StepPlan:
        """build_connector_meta: the step's loads and stores."""
        plan = StepPlan()
        sched = getattr(out, "num_scheduled_tokens", {}) or {}
        for nr in getattr(out, "scheduled_new_reqs", ()) or ():
            r = self._reqs.get(nr.req_id)
            if r is None:
                continue
            r.block_ids = list(nr.block_ids[0]) if nr.block_ids else []
            self._step(plan, nr.req_id, r, nr.num_computed_tokens, sched.get(nr.req_id, 0))
        cr = getattr(out, "scheduled_cached_reqs", None)
        if cr is not None:
            resumed = getattr(cr, "resumed_req_ids", set()) or set()
            for i, rid in enumerate(cr.req_ids):
                r = self._reqs.get(rid)
                if r is None:
                    continue
                nb = cr.new_block_ids[i]
                if rid in resumed:  # a resumed request's new_block_ids are all of its blocks
                    r.block_ids = list(nb[0]) if nb else []
                elif nb is not None:
                    r.block_ids.extend(nb[0])
                self._step(plan, rid, r, cr.num_computed_tokens[i], sched.get(rid, 0))
        self._loads.clear()
        return plan

    def _step(self, plan: StepPlan, rid: str, r: _Req, computed: int, scheduled: int) -> None:
        ext = self._loads.pop(rid, 0)
        if ext > 0:
            end = computed
            start = end - ext
            if (start >= 0 and end < len(r.prompt) and start % self.vllm_block == 0
                    and end % self.vllm_block == 0
                    and len(r.block_ids) * self.vllm_block >= end):
                plan.loads.append(LoadSpec(rid, r.prompt[:end + 1], r.salt, start, end,
                                           list(r.block_ids)))
        n = store_len(len(r.prompt), self.pkv_block)
        if not r.saved and n > 0 and computed + scheduled >= len(r.prompt):
            r.saved = True
            if len(r.block_ids) * self.vllm_block >= n:
                plan.saves.append(SaveSpec(rid, r.prompt[:n], r.salt, list(r.block_ids)))


# ---- model identity and the cache's geometry ----------------------------------

def digest_files(paths: Iterable[str]) -> str:
    """sha256 over the names, sizes and contents of `paths` (sorted by name)."""
    import os

    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(os.path.basename(p).encode() + b"\0" + str(os.path.getsize(p)).encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def model_id_for(model: str, weights_digest: Optional[str], kv_dtype: str, layers: int,
                 kv_heads: int, head_dim: int, platform: str) -> str:
    """The pagedkv model_id of K/V computed by vLLM: the model's name or path,
    the sha256 of its config and weight files when it is a local directory
    (weights_digest), the engine and platform (vLLM's CPU kernels give K/V
    that differs in the last bits from other engines'), the K/V dtype and the
    geometry. The connector requires a local directory (or an explicit
    model_id) so that the digest pins the weights; what it still cannot see
    (a vLLM build computing other K/V from the same files) is the operator's
    to name in an explicit model_id."""
    w = f";sha256:{weights_digest}" if weights_digest else ""
    return (f"vllm:{model}{w};engine=vllm-{platform};kv={kv_dtype};"
            f"geom={layers}x{kv_heads}x{head_dim}")


def check_cache(info: Any, *, model_id: str, layers: int, kv_heads: int, head_dim: int,
                kv_dtype: str, vllm_block: int) -> Optional[str]:
    """Why a pkvd cache (its CacheInfo) cannot serve this engine, or None when
    it can: another model_id (its K/V is another model's), another geometry or
    dtype, or a block size that does not divide vLLM's."""
    if info.model_id != model_id:
        return f"the cache holds model_id {info.model_id!r}, this engine is {model_id!r}"
    got = (info.layers, info.kv_heads, info.head_dim, info.dtype)
    want = (layers, kv_heads, head_dim, kv_dtype)
    if got != want:
        return (f"the cache's geometry (layers, kv_heads, head_dim, dtype) is {got}, "
                f"the model's {want}")
    if vllm_block % info.block_size:
        return (f"pagedkv's block size {info.block_size} does not divide vLLM's "
                f"block size {vllm_block}")
    return None

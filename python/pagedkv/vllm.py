"""pagedkv.vllm: a vLLM v1 KV connector that keeps vLLM's prefix K/V in a
pagedkv cache served by pkvd, so it survives engine restarts and is shared by
every engine of the same model on the machine.

What it owns: `PagedKVConnector(KVConnectorBase_V1)`. vLLM instantiates it
twice, in the scheduler (role SCHEDULER) and in the worker (role WORKER),
possibly in two processes: both connect to one pkvd daemon (docs/pkvd.md), the
single writer of the cache directory, whose arena each maps. The pure logic
(what to load and store, model identity, geometry) is pagedkv._vllm_plan,
unit-tested without vLLM; this file is the vLLM and torch plumbing.

How it fits:
- scheduler: `get_num_new_matched_tokens` is pkv_prefix_lookup (side-effect
  free, a hint) capped at len(prompt) - 1, aligned down to vLLM's block size,
  minus what vLLM already has locally; `update_state_after_alloc` records the
  accepted load; `build_connector_meta` sends the step's loads and stores
  (prompt ids, vLLM block table) to the worker; `request_finished` forgets the
  request (vLLM frees its blocks at once: nothing is saved asynchronously).
- worker: `start_load_kv` opens a pagedkv sequence on the prompt (pkv_seq_open
  attaches the longest cached prefix and pins its blocks while the sequence is
  open), copies each attached block into vLLM's paged K/V tensors and closes
  the sequence; positions the open did not attach (blocks evicted since the
  lookup; with pkvd's --tier-lookup, tier records that expired or failed
  rule T1 at the open; all of them when pkvd is gone) are reported by
  `get_block_ids_with_load_errors`, so vLLM recomputes them
  (kv_load_failure_policy "recompute"). A block failing its checksum (rule S1)
  is never promised: the lookup checksums a recovered block when it first
  reaches it and stops there, and the open does not re-check a block that
  passed. Loads are
  synchronous: `wait_for_layer_load` has nothing to wait for. `save_kv_layer`
  copies one layer of the K/V of a prompt whose prefill completes in this step
  into the slots of a sequence opened and appended on the prompt's ids;
  `wait_for_save` copies the layers it was not given and commits, which seals
  the full blocks (durable under pkvd's --durability) and shares them.

Why the K/V served is the prefix's (the first law): pagedkv attaches blocks by
exact token prefix under a model_id, and this connector gives it the request's
prompt ids only; requests whose K/V is not a function of those ids alone
(multimodal inputs, prompt embeddings, LoRA) are not served or stored;
vLLM's `cache_salt` maps to a pagedkv salt; a store is committed only after
every layer of every appended token was copied from vLLM's blocks, in the
step that completed the prompt, and never for a request whose load failed in
that step (its blocks hold stale K/V until vLLM recomputes them); a cache
whose model_id or geometry is not this engine's is refused at start-up.

Layout: vLLM's CPU attention keeps one tensor per layer, viewed as
[num_blocks, kv_heads, block_size, 2 * head_size], whose kernel reads each
(block, head) as K[block_size][head_size] then V[block_size][head_size]
(vllm/v1/attention/backends/cpu_attn.py: `view(num_blocks, kv_heads,
2 * block_size, head_size).chunk(2, dim=2)`), so a vLLM block of one layer is
[head][K|V][token][dim]; pagedkv's block is [layer][K|V][head][token][dim].
One pagedkv block (16 tokens) fills the run [token offset, +16) of one vLLM
block (32 or 128 tokens): per layer, one strided copy of 2 x kv_heads runs.
Only this CPU layout is supported (other platforms' backends put K and V of a
token side by side): another platform raises NotImplementedError.

Configuration (kv_transfer_config):
    {"kv_connector": "PagedKVConnector", "kv_connector_module_path": "pagedkv.vllm",
     "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"socket": "/run/pkv.sock"}}
extra config keys: "socket" (required: a running pkvd whose geometry, dtype
and model_id are this model's, see `pkvd_args`), "model_id" (overrides the
derived one, e.g. to skip hashing large weights), "on_mismatch": "error"
(default: the engine fails to start when the cache is another model's) or
"disable" (log it and run without the cache: 0 hits).

Limits: tensor and pipeline parallel size 1, one KV cache group of full
attention (no sliding-window or hybrid models), the CPU platform, the prompt
only (generated tokens are not stored), K/V dtype f32, f16 or bf16.
"""
from __future__ import annotations

import glob
import hashlib
import itertools
import os
import warnings
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

import pagedkv
from pagedkv._vllm_plan import (
    LoadSpec,
    Planner,
    SaveSpec,
    StepPlan,
    check_cache,
    digest_files,
    kv_dtype_name,
    load_copies,
    load_split,
    model_id_for,
    request_usable,
    salt_of,
    store_copies,
    store_reads_failed,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.pagedkv")  # under "vllm": vLLM's handlers and level apply

__all__ = ["PagedKVConnector", "PagedKVMetadata", "engine_model_id", "pkvd_args"]

_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class PagedKVMetadata(KVConnectorMetadata):
    """What the scheduler side tells the worker side for one step."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


def _geometry(vllm_config: "VllmConfig") -> tuple[int, int, int, str]:
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
        raise NotImplementedError("PagedKVConnector supports tensor/pipeline parallel size 1")
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in ("auto", None):
        raise ValueError(f"PagedKVConnector: kv cache dtype {cache_dtype!r} is not supported "
                         "(f32, f16, bf16 only: leave kv_cache_dtype 'auto')")
    return (mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size(),
            kv_dtype_name(mc.dtype))


def engine_model_id(vllm_config: "VllmConfig") -> str:
    """The pagedkv model_id this engine's K/V is stored under (extra config
    "model_id" if given, else derived by `_vllm_plan.model_id_for`: a local
    model directory's config and weight files are hashed, about 1 s per GB)."""
    kvc = vllm_config.kv_transfer_config
    given = kvc.get_from_extra_config("model_id", None) if kvc is not None else None
    if given:
        return str(given)
    layers, kv_heads, head_dim, dt = _geometry(vllm_config)
    mc = vllm_config.model_config
    model = str(mc.model)
    if not os.path.isdir(model):
        # A hub name pins neither the revision nor the files behind it.
        raise ValueError(f"PagedKVConnector: model {model!r} is not a local directory, whose "
                         "files the model_id could hash: give kv_connector_extra_config "
                         "{'model_id': ...} naming the exact weights")
    files = [p for pat in ("*.json", "*.safetensors", "*.bin", "*.model", "*.py")
             for p in glob.glob(os.path.join(model, pat))]
    digest = digest_files(files)
    overrides = getattr(mc, "hf_overrides", None)
    if overrides and not callable(overrides):  # rope scaling etc. change the K/V
        digest += ";overrides=" + hashlib.sha256(repr(sorted(dict(overrides).items()))
                                                 .encode()).hexdigest()[:16]
    from vllm.platforms import current_platform

    return model_id_for(model, digest, dt, layers, kv_heads, head_dim,
                        str(current_platform.device_type))


def pkvd_args(vllm_config: "VllmConfig", capacity: int) -> list[str]:
    """The pkvd options (geometry, dtype, model id) for this engine's cache,
    pagedkv block size 16: `pkvd --dir D --socket S *pkvd_args(cfg, n)`."""
    layers, kv_heads, head_dim, dt = _geometry(vllm_config)
    return ["--layers", str(layers), "--kv-heads", str(kv_heads), "--head-dim", str(head_dim),
            "--block-size", "16", "--dtype", dt, "--capacity", str(capacity),
            "--model-id", engine_model_id(vllm_config)]


class PagedKVConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector over a pkvd-served pagedkv cache (module docstring)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        from vllm.platforms import current_platform
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        self._cache_hit_source = CacheHitSource.DISK
        if not current_platform.is_cpu():
            raise NotImplementedError(
                "PagedKVConnector maps vLLM's CPU K/V layout only "
                f"(platform {current_platform.device_type})")
        kvc = self._kv_transfer_config
        socket = kvc.get_from_extra_config("socket", None)
        if not socket:
            raise ValueError("PagedKVConnector needs kv_connector_extra_config "
                             "{'socket': <pkvd socket path>}")
        on_mismatch = kvc.get_from_extra_config("on_mismatch", "error")
        if on_mismatch not in ("error", "disable"):
            raise ValueError(f"on_mismatch must be 'error' or 'disable', not {on_mismatch!r}")
        if kv_cache_config is not None:
            from vllm.v1.kv_cache_interface import FullAttentionSpec

            groups = kv_cache_config.kv_cache_groups
            spec = groups[0].kv_cache_spec if len(groups) == 1 else None
            # A sliding-window (or MLA, chunked-local, ...) group frees or reuses
            # blocks a store would read: only plain full attention is stored.
            if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
                raise NotImplementedError("PagedKVConnector supports one KV cache group "
                                          "of full attention without a sliding window")
        self._vblock = vllm_config.cache_config.block_size
        layers, kv_heads, head_dim, dt = _geometry(vllm_config)
        self._layers, self._kv_heads, self._head_dim, self._dtype = layers, kv_heads, head_dim, dt
        self.model_id = engine_model_id(vllm_config)
        self._cache: Optional[pagedkv.Cache] = pagedkv.connect(str(socket))
        why = check_cache(self._cache.info, model_id=self.model_id, layers=layers,
                          kv_heads=kv_heads, head_dim=head_dim, kv_dtype=dt,
                          vllm_block=self._vblock)
        if why is not None:
            self._cache.close()
            self._cache = None
            if on_mismatch == "error":
                raise pagedkv.ModelError(f"PagedKVConnector: pkvd at {socket}: {why}")
            logger.error("PagedKVConnector disabled (on_mismatch='disable'): pkvd at %s: %s",
                         socket, why)
        self._pblock = self._cache.info.block_size if self._cache is not None else 16
        self._planner = Planner(self._vblock, self._pblock)
        self._ids = itertools.count(1 + (os.getpid() << 24))
        # worker state
        self._kv: dict[str, torch.Tensor] = {}     # layer name -> [B, H, 2, N, D] view
        self._layer_of: dict[str, int] = {}
        self._load_errors: set[int] = set()
        self._failed_reqs: set[str] = set()
        self._failed_blocks: set[int] = set()  # this step's vLLM blocks whose load failed
        self._pending: Optional[list[tuple[int, list[tuple[int, int, int]]]]] = None
        self._saved_layers: set[str] = set()
        self._dst: dict[int, torch.Tensor] = {}  # this step's store blocks, as tensors
        self.stats = {"lookups": 0, "hit_tokens": 0, "loaded_tokens": 0, "load_failed_blocks": 0,
                      "stored_tokens": 0, "store_skipped": 0}
        logger.info("PagedKVConnector (%s) on pkvd %s, model_id %s, vLLM block %d, "
                    "pagedkv block %d%s", role.name, socket, self.model_id, self._vblock,
                    self._pblock, "" if self._cache is not None else " (disabled)")

    # ---- scheduler side -----------------------------------------------------

    def on_new_request(self, request: "Request") -> None:
        self._track(request)

    def _track(self, request: "Request") -> None:
        if self._cache is None or self._planner.tracked(request.request_id):
            return
        prompt = request.prompt_token_ids
        usable = request_usable(prompt, mm_features=request.mm_features,
                                lora_request=request.lora_request,
                                prompt_embeds=request.prompt_embeds)
        self._planner.track(request.request_id, prompt, salt_of(request.cache_salt), usable)

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        if self._cache is None:
            return 0, False
        self._track(request)
        cache = self._cache

        def lookup(tokens: list[int], salt: int) -> int:
            try:
                return cache.lookup(tokens, salt)
            except pagedkv.Error as e:  # pkvd gone or refused: a miss, not a failure
                logger.warning("PagedKVConnector: lookup failed: %s", e)
                return 0

        n = self._planner.matched(request.request_id, num_computed_tokens, lookup)
        self.stats["lookups"] += 1
        return n, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._planner.after_alloc(request.request_id, num_external_tokens)
        self.stats["hit_tokens"] += max(num_external_tokens, 0)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return PagedKVMetadata(self._planner.build(scheduler_output))

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        self._planner.finished(request.request_id)
        return False, None

    # ---- worker side --------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.models.utils import extract_layer_index

        L, H, D = self._layers, self._kv_heads, self._head_dim
        for name, t in kv_caches.items():
            # [B, H, N, 2D] as allocated; the CPU kernel reads (block, head) as [2][N][D].
            if t.dim() != 4 or t.shape[1] != H or t.shape[2] != self._vblock or t.shape[3] != 2 * D:
                raise NotImplementedError(
                    f"PagedKVConnector: layer {name}: K/V tensor of shape {tuple(t.shape)}, "
                    f"expected [blocks, {H}, {self._vblock}, {2 * D}] (vLLM's CPU layout)")
            if t.dtype != _TORCH[self._dtype]:
                raise ValueError(f"PagedKVConnector: layer {name} K/V dtype {t.dtype}, "
                                 f"the cache stores {self._dtype}")
            self._kv[name] = t.view(t.shape[0], H, 2, self._vblock, D)
            idx = extract_layer_index(name)
            if not 0 <= idx < L:
                raise ValueError(f"PagedKVConnector: layer {name}: index {idx} not in [0, {L})")
            self._layer_of[name] = idx
        if sorted(self._layer_of.values()) != list(range(L)):
            raise ValueError(f"PagedKVConnector: {len(kv_caches)} K/V tensors do not cover "
                             f"the model's {L} layers once each")

    def _block_tensor(self, block: int, writable: bool) -> torch.Tensor:
        """pagedkv block `block` as a torch tensor [L, 2, H, n, D] over the
        mapped arena (zero copy); bf16 is stored as uint16 bits."""
        assert self._cache is not None
        a = np.asarray(self._cache.block(block, writable=writable))
        with warnings.catch_warnings():  # read-only arrays: we never write them
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if self._dtype == "bf16" else t

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self._cache is None or not isinstance(meta, PagedKVMetadata):
            return
        for ld in meta.plan.loads:
            self._load(ld)

    def _load(self, ld: LoadSpec) -> None:
        assert self._cache is not None
        seq = None
        n_attached = 0
        try:
            seq = self._cache.open(next(self._ids), ld.tokens, ld.salt)
            n_attached = seq.n_cached
            good, failed = load_split(ld.start, ld.end, n_attached, self._vblock)
            copies = load_copies(ld.start, good, seq.blocks(), ld.block_ids,
                                 self._pblock, self._vblock)
            for pb, vb, off in copies:
                src = self._block_tensor(pb, writable=False)  # [L, 2, H, n, D]
                for name, t in self._kv.items():
                    # vLLM block vb, all heads, K and V, tokens [off, off + n)
                    t[vb, :, :, off:off + self._pblock, :].copy_(
                        src[self._layer_of[name]].transpose(0, 1))
                del src
            self.stats["loaded_tokens"] += good - ld.start
        except pagedkv.Error as e:
            logger.warning("PagedKVConnector: load of request %s failed: %s", ld.req_id, e)
            good, failed = ld.start, list(range(ld.start // self._vblock, ld.end // self._vblock))
        finally:
            if seq is not None:
                try:
                    seq.close()  # unpins the blocks; they stay cached
                except pagedkv.Error as e:
                    logger.warning("PagedKVConnector: close after load: %s", e)
        if failed:
            self._failed_reqs.add(ld.req_id)
            self._load_errors.update(ld.block_ids[i] for i in failed)
            self._failed_blocks.update(ld.block_ids[i] for i in failed)
            self.stats["load_failed_blocks"] += len(failed)
            logger.warning("PagedKVConnector: request %s: %d of %d blocks to load were not in "
                           "the cache any more (attached %d tokens); vLLM recomputes them",
                           ld.req_id, len(failed), (ld.end - ld.start) // self._vblock,
                           n_attached)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous (start_load_kv)

    def _prepare_saves(self) -> list[tuple[int, list[tuple[int, int, int]]]]:
        """Open and append one sequence per store of this step; returns
        (sequence id, copies) for those that need K/V written."""
        if self._pending is not None:
            return self._pending
        self._pending = []
        meta = self._connector_metadata
        if self._cache is None or not isinstance(meta, PagedKVMetadata):
            return self._pending
        for sv in meta.plan.saves:
            if sv.req_id in self._failed_reqs or store_reads_failed(
                    len(sv.tokens), sv.block_ids, self._vblock, self._failed_blocks):
                self.stats["store_skipped"] += 1
                continue
            self._open_save(sv)
        return self._pending

    def _open_save(self, sv: SaveSpec) -> None:
        assert self._cache is not None and self._pending is not None
        sid = next(self._ids)
        try:
            seq = self._cache.open(sid, sv.tokens, sv.salt)
        except pagedkv.Error as e:
            logger.warning("PagedKVConnector: store of request %s: %s", sv.req_id, e)
            return
        try:
            first = seq.n_cached
            if first >= len(sv.tokens):
                seq.close()
                return
            slots = seq.append(sv.tokens[first:])
            copies = store_copies(first, slots, sv.block_ids, self._pblock, self._vblock)
            if copies is None:
                raise pagedkv.StateError("slots are not whole blocks")
            self._pending.append((sid, copies))
        except pagedkv.Error as e:  # FullError: the cache is full of pinned blocks
            logger.warning("PagedKVConnector: store of request %s skipped: %s", sv.req_id, e)
            self.stats["store_skipped"] += 1
            seq.close()  # drops the pending tokens: nothing is committed

    def _save_layer(self, name: str, pending: list[tuple[int, list[tuple[int, int, int]]]]) -> None:
        t = self._kv[name]
        layer = self._layer_of[name]
        for _, copies in pending:
            for pb, vb, off in copies:
                dst = self._dst.get(pb)
                if dst is None:  # one view per block and step, reused by every layer
                    dst = self._dst[pb] = self._block_tensor(pb, writable=True)
                dst[layer].copy_(t[vb, :, :, off:off + self._pblock, :].transpose(0, 1))
        self._saved_layers.add(name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: Any, **kwargs: Any) -> None:
        if self._cache is None or layer_name not in self._kv or layer_name in self._saved_layers:
            return
        pending = self._prepare_saves()
        if pending:
            self._save_layer(layer_name, pending)

    def wait_for_save(self) -> None:
        if self._cache is None:
            return
        pending: list[tuple[int, list[tuple[int, int, int]]]] = []
        try:
            pending = self._prepare_saves()
            if pending:
                # The layers save_kv_layer was not given (no attention metadata).
                for name in [n for n in self._kv if n not in self._saved_layers]:
                    self._save_layer(name, pending)
            for sid, copies in pending:
                n = len(copies) * self._pblock
                try:
                    # every layer of every appended token is written
                    pagedkv.Sequence(self._cache, sid).commit(n)
                    self.stats["stored_tokens"] += n
                except pagedkv.Error as e:
                    logger.warning("PagedKVConnector: commit of a store failed: %s", e)
        finally:
            self._dst = {}  # drop the arena views before anything else can close the cache
            # Every store's sequence is closed, committed or not (an exception
            # above): uncommitted tokens are dropped, never served (rule S4).
            for sid, _ in pending:
                try:
                    pagedkv.Sequence(self._cache, sid).close()
                except pagedkv.Error as e:  # pkvd gone: it releases the sequence itself
                    logger.warning("PagedKVConnector: close after a store: %s", e)
            self._pending = None
            self._saved_layers = set()
            self._failed_reqs = set()
            self._failed_blocks = set()

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        if self._cache is not None:
            logger.info("PagedKVConnector (%s) stats: %s", self._role.name, self.stats)
            self._cache.close()
            self._cache = None

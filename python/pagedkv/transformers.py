"""pagedkv.transformers: a Hugging Face transformers `Cache` kept in pagedkv blocks.

What it owns: `PagedCache`, a `transformers.Cache` for one generation at a time
(batch 1) whose K/V comes from and goes to a `pagedkv.Cache`, so a prompt whose
prefix an earlier call or an earlier process stored is not recomputed:
`generate()` computes only the uncached rest. Plus the helpers around it:
`model_id_for` (the identity a cache of this engine must carry), `open_store`
(a pagedkv cache shaped for a model) and `generate` (the whole round trip).

How it fits: the model's attention sees ordinary torch tensors. At construction
`PagedCache` opens a pagedkv sequence on the prompt ids (pkv_seq_open attaches
the longest cached prefix of full blocks, always leaving the last prompt token
to compute) and copies that prefix's K/V out of the arena into each layer's
tensors; from then on each layer grows like transformers' `DynamicLayer`.
`store(sequences)` then appends the tokens whose K/V the layers hold, writes
their K/V into the slots pagedkv hands out and commits them, so full blocks are
sealed and reusable by the next prompt that starts the same way, in this process
or a later one (pagedkv's log makes them durable).

Why K/V is stored at `store()` and not inside `update()`: a cache layer sees K/V
but never token ids, and pagedkv must be told which ids a K/V stands for (the
first law: never serve K/V that is not the K/V of the exact token prefix it
stands for). The only trustworthy record of the ids the model consumed is
generate()'s own output, so `store()` takes it, checks that it starts with the
ids already in the pagedkv sequence (the prompt given at construction), and
only then appends and commits; K/V is written to slots right before the commit.
Nothing is committed if store() is never called or refuses (the sequence is
closed with nothing pending). The last generated token is never stored: its
K/V was never computed.

Invariants:
- layer tensors hold positions [0, get_seq_length()); the pagedkv sequence holds
  ids[0, seq_len) with seq_len <= get_seq_length(), all committed (nothing is
  ever left pending between calls);
- positions [0, n_cached) came from pagedkv, the rest were computed by the model
  in this process;
- batch size 1; the K/V dtype equals the store's dtype ("f32" for a float32 model).

Model identity: a pagedkv cache directory holds K/V of one model only (PKV_EMODEL
otherwise). `model_id_for(gguf_path)` names the file by its sha256, the engine
("transformers": its K/V is not the project's C model's or llama.cpp's, even for
the same file) and the K/V dtype. Opening a directory made with another id raises
`pagedkv.ModelError` from `pagedkv.Cache`; PagedCache never gets to attach
anything then. We let it propagate rather than fall back silently: the caller
chose the directory, and a fallback (another directory, or wiping this one)
would hide a configuration error and could destroy another model's cache.

Unsupported (raise NotImplementedError): batch > 1, beam search and
num_return_sequences > 1 (reorder / repeat / select), crop (assisted decoding),
reset; sliding-window or linear-attention layers (ValueError at construction).
"""
from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
    from transformers import __version__ as transformers_version
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError as e:  # pragma: no cover - exercised only without the extras
    raise ImportError(
        "pagedkv.transformers needs torch and transformers "
        "(pip install torch transformers, or scripts/python-env.sh)") from e

import pagedkv

__all__ = ["PagedCache", "PagedLayer", "GenerateResult", "model_id_for", "open_store",
           "generate", "geometry_of"]

_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_ITEM_NP = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}


def _sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_id_for(gguf_path: str | os.PathLike[str], kv_dtype: str = "f32") -> str:
    """The pagedkv model_id for K/V computed by transformers from the GGUF file
    `gguf_path`: ``gguf-sha256:<hex>;engine=transformers;kv=<kv_dtype>``.

    The hash covers weights and tokenizer (the GGUF holds both); the engine part
    keeps this K/V apart from the project's C model's and llama.cpp's for the
    same file (their K/V differs in the last bits); kv_dtype keeps f32 and f16
    caches apart. Reads the whole file (about 0.3 s for 100 MB)."""
    if kv_dtype not in _TORCH_DTYPES:
        raise ValueError(f"kv_dtype must be one of {sorted(_TORCH_DTYPES)}, not {kv_dtype!r}")
    return f"gguf-sha256:{_sha256_file(gguf_path)};engine=transformers;kv={kv_dtype}"


def geometry_of(config: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers model config (its text
    config for multimodal ones). ValueError for layers that are not plain full
    attention (sliding windows, linear attention): pagedkv keeps every token."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError("PagedCache supports full-attention layers only, "
                         f"this model has {sorted(set(layer_types))}")
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        raise ValueError("PagedCache does not support sliding-window attention")
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return layers, kv_heads, int(head_dim)


def open_store(directory: str | os.PathLike[str], config: Any, model_id: str, *,
               capacity: int, kv_dtype: str = "f32", block_size: int = 16,
               **kwargs: Any) -> pagedkv.Cache:
    """Open (or create) the pagedkv cache in `directory` shaped for the model of
    `config` (geometry_of). `model_id` should come from model_id_for. Raises
    pagedkv.ModelError if the directory holds another model's cache,
    pagedkv.GeometryError if it has another shape. Other keyword arguments go to
    pagedkv.Cache (durability=..., ...)."""
    layers, kv_heads, head_dim = geometry_of(config)
    return pagedkv.Cache(os.fspath(directory), layers=layers, kv_heads=kv_heads,
                         head_dim=head_dim, capacity=capacity, model_id=model_id,
                         block_size=block_size, dtype=kv_dtype, **kwargs)


def _ids_list(ids: Any) -> list[int]:
    """Token ids of one sequence: a list/tuple of ints, a 1-D array/tensor, or a
    [1, n] tensor/array."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(f"PagedCache handles batch size 1, got {ids.shape[0]} rows")
            ids = ids[0]
        if ids.dim() != 1:
            raise ValueError(f"token ids must be 1-D or [1, n], got shape {tuple(ids.shape)}")
        return [int(x) for x in ids.tolist()]
    arr = np.asarray(ids)
    if arr.ndim == 2:
        if arr.shape[0] != 1:
            raise ValueError(f"PagedCache handles batch size 1, got {arr.shape[0]} rows")
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"token ids must be 1-D or [1, n], got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {arr.dtype}")
    return [int(x) for x in arr.tolist()]


class PagedLayer(DynamicLayer):
    """One attention layer of a PagedCache: a DynamicLayer that may start with a
    prefix read from pagedkv and refuses what PagedCache cannot keep in step
    with its pagedkv sequence (batch > 1, beams, crops, resets)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self._dtype = dtype

    def _start_with(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.device = keys.device
        self.keys, self.values = keys, values
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise NotImplementedError(
                f"PagedCache handles batch size 1, the model sent {key_states.shape[0]}")
        if key_states.dtype != self._dtype or value_states.dtype != self._dtype:
            raise TypeError(f"PagedCache stores {self._dtype}, the model computes "
                            f"{key_states.dtype}: open the store with the model's dtype")
        if self.is_initialized and self.keys.numel() and self.keys.device != key_states.device:
            # The prefix was placed on another device than the model's: move it once.
            self.keys = self.keys.to(key_states.device)
            self.values = self.values.to(key_states.device)
            self.device = key_states.device
        return super().update(key_states, value_states, *args, **kwargs)

    def _unsupported(self, what: str) -> None:
        raise NotImplementedError(
            f"PagedCache does not support {what} (batch 1, no beam search, no assisted decoding)")

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            self._unsupported("crop")

    def reset(self) -> None:
        self._unsupported("reset")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._unsupported("beam search")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if repeats != 1:
            self._unsupported("num_return_sequences > 1")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._unsupported("batch selection")


class PagedCache(Cache):
    """A transformers Cache for one sequence (batch 1) backed by a pagedkv cache.

    ``PagedCache(store, prompt_ids, config=model.config)`` opens a pagedkv
    sequence on `prompt_ids`, attaching the longest cached prefix (`n_cached`
    tokens, whole blocks, at most len-1); pass the SAME ids to
    ``model.generate(ids, cache=pc)``, which then computes only
    ``ids[n_cached:]``. Afterwards ``pc.store(out)`` with generate()'s output
    writes the K/V of every token the model consumed into pagedkv and commits
    it; ``pc.close()`` (or the ``with`` block) releases the sequence. Its sealed
    blocks stay cached for later prompts, in this process and after a restart.

    Blocking: construction and store() call pagedkv (its lock, its log;
    store() in durability "always" waits for the disk); both copy K/V between
    the arena and the layer tensors.
    """

    def __init__(self, store: pagedkv.Cache, prompt_ids: Any, *, config: Any,
                 salt: int = 0, seq_id: int | None = None,
                 device: torch.device | str | None = None) -> None:
        info = store.info
        if info.dtype not in _TORCH_DTYPES:
            raise ValueError(f"unsupported pagedkv dtype {info.dtype!r}")
        layers, kv_heads, head_dim = geometry_of(config)
        if (info.layers, info.kv_heads, info.head_dim) != (layers, kv_heads, head_dim):
            raise ValueError(
                f"the pagedkv cache is shaped layers={info.layers} kv_heads={info.kv_heads} "
                f"head_dim={info.head_dim}, the model layers={layers} kv_heads={kv_heads} "
                f"head_dim={head_dim}")
        prompt = _ids_list(prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty")
        self._store = store
        self._info = info
        self._dtype = _TORCH_DTYPES[info.dtype]
        super().__init__(layers=[PagedLayer(self._dtype) for _ in range(layers)])
        self.prompt: list[int] = prompt
        self.salt = salt
        self._seq = self._open_seq(prompt, salt, seq_id)
        self.seq_id: int = self._seq.id
        self.n_cached: int = self._seq.n_cached
        self._ids: list[int] = prompt[:self.n_cached]  # what the pagedkv sequence holds
        self.n_stored = 0
        t0 = time.perf_counter()
        try:
            if self.n_cached:
                self._load_prefix(torch.device(device) if device is not None else torch.device("cpu"))
        except BaseException:
            self._seq.close()
            raise
        self.load_seconds = time.perf_counter() - t0

    def _open_seq(self, prompt: list[int], salt: int, seq_id: int | None) -> pagedkv.Sequence:
        if seq_id is not None:
            return self._store.open(seq_id, prompt, salt)
        for _ in range(8):  # random ids: processes sharing a cache need no coordination
            try:
                return self._store.open(secrets.randbits(63), prompt, salt)
            except pagedkv.ExistsError:
                continue
        raise pagedkv.ExistsError("no free random sequence id after 8 tries")

    def _load_prefix(self, device: torch.device) -> None:
        """Copy the attached blocks' K/V ([layer][K|V][head][token][dim] each)
        into one [1, kv_heads, n_cached, head_dim] tensor per layer and kind."""
        i = self._info
        nb = self.n_cached // i.block_size
        blocks = self._seq.blocks()[:nb]
        shape = (i.layers, 2, i.kv_heads, i.block_size, i.head_dim)
        raw = np.empty((nb,) + shape, dtype=_ITEM_NP[i.dtype])
        for j, b in enumerate(blocks):
            view = self._store.block(b)  # sealed: read-only
            raw[j] = np.frombuffer(view, dtype=raw.dtype).reshape(shape)
            del view
        t = torch.from_numpy(raw).view(self._dtype)           # (nb, L, 2, H, bs, D)
        t = t.permute(1, 2, 3, 0, 4, 5).reshape(i.layers, 2, i.kv_heads, self.n_cached,
                                                i.head_dim)
        t = t.to(device)
        for layer_idx, layer in enumerate(self.layers):
            layer._start_with(t[layer_idx, 0].unsqueeze(0).contiguous(),
                              t[layer_idx, 1].unsqueeze(0).contiguous())

    # ---- storing ---------------------------------------------------------

    def store(self, sequences: Any) -> int:
        """Write the K/V of the tokens the model consumed into pagedkv and commit.

        `sequences`: generate()'s output for this cache (the prompt followed by
        the generated ids; a [1, n] tensor or a list). The first
        get_seq_length() ids are the ones whose K/V the layers hold (the last
        generated id was never fed back, so it is not stored). Refuses with
        ValueError, storing nothing, if those ids do not start with the ids
        already in the pagedkv sequence (the prompt, or what an earlier store
        stored), or if there are fewer ids than K/V positions. May be called
        again after a further generate() on this cache (a next turn).
        Returns the number of tokens stored by this call.

        Errors: ValueError as above; pagedkv.FullError when the cache has no
        room (nothing stored then); other pagedkv errors from append/commit.
        Blocks: pagedkv append and commit (lock, log)."""
        if self._seq is None:
            raise ValueError("this PagedCache is closed")
        ids = _ids_list(sequences)
        n_kv = self.get_seq_length()
        if n_kv < len(self._ids):
            raise ValueError("the cache holds fewer positions than it stored: "
                             "was it cropped or reset?")
        if len(ids) < n_kv:
            raise ValueError(f"{len(ids)} ids for {n_kv} K/V positions: pass generate()'s "
                             "whole output (prompt included)")
        have = len(self._ids)
        if ids[:have] != self._ids:
            raise ValueError("these ids do not start with the ones already stored for "
                             "this cache: refusing to store K/V under other tokens")
        p = min(len(self.prompt), n_kv)
        if ids[:p] != self.prompt[:p]:
            raise ValueError("these ids do not start with the prompt this cache was "
                             "opened on: refusing to store K/V under other tokens")
        new = ids[have:n_kv]
        if not new:
            return 0
        slots = self._seq.append(new)
        try:
            self._write(slots, have)
        except BaseException:
            self._seq.truncate(have)  # drop the pending tokens: none is committed
            raise
        self._seq.commit(len(new))
        self._ids.extend(new)
        self.n_stored += len(new)
        return len(new)

    def _write(self, slots: list[pagedkv.Slot], first: int) -> None:
        """Copy positions [first, first+len(slots)) of every layer into `slots`,
        one block at a time (a run of consecutive offsets in one block)."""
        i = self._info
        shape = (i.layers, 2, i.kv_heads, i.block_size, i.head_dim)
        k_all = [layer.keys[0, :, first:first + len(slots), :] for layer in self.layers]
        v_all = [layer.values[0, :, first:first + len(slots), :] for layer in self.layers]
        j = 0
        while j < len(slots):
            blk, off = slots[j]
            m = 1
            while (j + m < len(slots) and slots[j + m].block == blk
                   and slots[j + m].offset == off + m):
                m += 1
            view = self._store.block(blk)  # being filled: writable
            arr = np.frombuffer(view, dtype=_ITEM_NP[i.dtype]).reshape(shape)
            dst = torch.from_numpy(arr).view(self._dtype)
            for layer_idx in range(i.layers):
                dst[layer_idx, 0, :, off:off + m, :].copy_(k_all[layer_idx][:, j:j + m, :])
                dst[layer_idx, 1, :, off:off + m, :].copy_(v_all[layer_idx][:, j:j + m, :])
            del dst, arr, view  # no export may outlive the write (Cache.close refuses)
            j += m

    # ---- lifetime --------------------------------------------------------

    @property
    def sequence(self) -> pagedkv.Sequence:
        """The pagedkv sequence (its id is random unless seq_id was given)."""
        return self._seq

    def close(self) -> None:
        """Release the pagedkv sequence (pkv_seq_close): its sealed blocks stay
        cached, its partial last block is freed. Idempotent. The layer tensors
        stay usable."""
        if self._seq is not None:
            seq, self._seq = self._seq, None
            seq.close()

    def __enter__(self) -> "PagedCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PagedCache(seq_id={self.seq_id}, n_cached={self.n_cached}, "
                f"stored={len(self._ids)}, positions={self.get_seq_length()})")


@dataclass
class GenerateResult:
    """What `generate` did: the output ids (generate()'s `sequences`), how many
    prompt tokens came from pagedkv, how many were stored, and the time from
    the call to the first generated token (TTFT, prefix load included), also
    in CPU seconds of this process (all its threads; less sensitive to other
    load on the machine than the wall-clock time)."""

    sequences: torch.Tensor
    n_cached: int
    n_stored: int
    ttft_s: float
    total_s: float
    ttft_cpu_s: float


class _FirstTokenTimer:
    """A generate() streamer that notes when the first generated token arrives
    (the first put() is the prompt)."""

    def __init__(self, t0: float, c0: float) -> None:
        self.t0, self.c0 = t0, c0
        self.puts = 0
        self.first: float | None = None
        self.first_cpu: float | None = None

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter() - self.t0
            self.first_cpu = time.process_time() - self.c0

    def end(self) -> None:
        pass


def generate(model: Any, store: pagedkv.Cache, input_ids: Any, *, salt: int = 0,
             **generate_kwargs: Any) -> GenerateResult:
    """Run ``model.generate(input_ids, cache=PagedCache(...))`` for one prompt
    (batch 1), store the K/V of every consumed token, release the sequence.
    The prompt is attached from pagedkv as far as it is cached, so generate()
    computes only the rest. `generate_kwargs` go to model.generate (a
    `streamer` is not accepted: this function uses it to time the first token).
    """
    if "streamer" in generate_kwargs:
        raise ValueError("generate() uses the streamer to measure the first token")
    ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor([_ids_list(input_ids)])
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    t0 = time.perf_counter()
    timer = _FirstTokenTimer(t0, time.process_time())
    device = getattr(model, "device", None)
    with PagedCache(store, ids, config=model.config, salt=salt, device=device) as pc:
        if device is not None:
            ids = ids.to(device)
        kw = dict(generate_kwargs)
        kw.setdefault("attention_mask", torch.ones_like(ids))
        out = model.generate(ids, cache=pc, streamer=timer, **kw)
        seqs = out.sequences if hasattr(out, "sequences") else out
        total = time.perf_counter() - t0
        pc.store(seqs.cpu())
        return GenerateResult(sequences=seqs, n_cached=pc.n_cached, n_stored=pc.n_stored,
                              ttft_s=timer.first if timer.first is not None else total,
                              total_s=total,
                              ttft_cpu_s=timer.first_cpu if timer.first_cpu is not None
                              else time.process_time() - timer.c0)

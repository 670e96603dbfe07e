"""pagedkv: a persistent, mmap-backed paged KV cache for LLM inference.

Python bindings of libpagedkv (include/pagedkv.h), built from the same meson
project: every call goes to the C library, nothing is reimplemented. See
docs/python.md.

    import numpy as np, pagedkv
    with pagedkv.Cache("/tmp/kv", layers=2, kv_heads=2, head_dim=8,
                       capacity=64, model_id="demo") as c:
        seq = c.open(1, prompt)                 # attaches the cached prefix
        slots = seq.append(prompt[seq.n_cached:])
        for s in slots:                         # write K/V in place
            np.asarray(c.kv(s.block, 0, pagedkv.K, 0))[s.offset] = ...
        seq.commit(len(slots))

Blocks are laid out [layer][K|V][kv_head][token][head_dim]. `Cache.kv` and
`Cache.block` return zero-copy views (buffer protocol and DLPack:
`torch.from_dlpack(view)`) of the mapped arena: read-only for sealed blocks,
writable for the slots an append handed out.

Errors: every PKV_E* code raises its own subclass of `Error` (`FullError`,
`NoSequenceError`, ...), whose `code` is the code and whose message is
pkv_last_error()'s. Using a closed cache (or a view of one) raises ValueError.

Threads: a Cache may be used from several threads; the GIL is released around
every library call that may block (the cache lock, log waits, I/O, pkvd round
trips), so calls of other threads proceed meanwhile.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence as _Seq, Union

from . import _pagedkv
from ._pagedkv import (  # noqa: F401  (re-exported)
    CUDA_GATHER_KERNEL,
    CUDA_GPU_APPEND,
    CUDA_NO_REGISTER,
    CUDA_NO_RW_REGISTER,
    ERRORS,
    BusyError,
    CorruptError,
    CudaBatch,
    CudaHandle,
    DeviceArray,
    DisconnectedError,
    Error,
    ExistsError,
    FailedError,
    FullError,
    GeometryError,
    InvalidArgumentError,
    IoError,
    KVView,
    ModelError,
    NoMemoryError,
    NoSequenceError,
    NoSpaceError,
    NotSupportedError,
    RangeError,
    ReadOnlyError,
    StateError,
    VersionError,
)

__version__: str = _pagedkv.version
"""The library's version (pkv_version)."""

K: int = _pagedkv.K
"""Kind of a K run (pkv_kind PKV_K = 0)."""
V: int = _pagedkv.V
"""Kind of a V run (pkv_kind PKV_V = 1)."""

# Flags of pkv_options.flags, for Cache(..., flags=...).
OPEN_POINT_IN_TIME: int = _pagedkv.OPEN_POINT_IN_TIME
OPEN_PREFAULT: int = _pagedkv.OPEN_PREFAULT
OPEN_FULL_CHECKPOINTS: int = _pagedkv.OPEN_FULL_CHECKPOINTS
OPEN_LIMBO_WAIT: int = _pagedkv.OPEN_LIMBO_WAIT

Tokens = Union[_Seq[int], Any]
"""Token ids: any sequence of ints, or a 1-D integer buffer (a numpy uint32 array
crosses without a copy; other integer dtypes are converted in C)."""

# A code added to the header after this file was written still gets its class.
for _cls in ERRORS.values():
    globals().setdefault(_cls.__name__, _cls)

_DTYPES = {"f32": _pagedkv.F32, "f16": _pagedkv.F16, "bf16": _pagedkv.BF16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_DURABILITY = {
    "group": _pagedkv.DURABLE_GROUP,
    "none": _pagedkv.DURABLE_NONE,
    "always": _pagedkv.DURABLE_ALWAYS,
}
_EVICTION = {"leaf-lru": _pagedkv.EVICT_LEAF_LRU, "leaf-slru": _pagedkv.EVICT_LEAF_SLRU}
_BLOCK_STATES = {_pagedkv.BLOCK_FREE: "free", _pagedkv.BLOCK_OPEN: "open",
                 _pagedkv.BLOCK_SEALED: "sealed"}


class Slot(NamedTuple):
    """Where one appended token's K/V goes: token `offset` of physical `block`."""

    block: int
    offset: int


_pagedkv._set_slot_type(Slot)


@dataclass(frozen=True)
class CacheInfo:
    """A cache's geometry (pkv_info). `dtype` is "f16", "f32" or "bf16"."""

    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    capacity: int
    model_id: str
    elem_size: int
    block_bytes: int
    slot_bytes: int
    run_bytes: int


@dataclass(frozen=True)
class SeqInfo:
    """A sequence's state (pkv_seq_get_info): tokens (pending included),
    committed tokens, block-table entries and trust domain."""

    len: int
    committed: int
    n_blocks: int
    salt: int


@dataclass(frozen=True)
class Stats:
    """Every field of pkv_stats (include/pagedkv.h documents each)."""

    capacity: int
    blocks_free: int
    blocks_cached: int
    blocks_used: int
    blocks_sealed: int
    sequences: int
    hit_tokens: int
    miss_tokens: int
    hit_blocks: int
    miss_blocks: int
    evictions: int
    cow_copies: int
    dedupes: int
    seals: int
    verify_failures: int
    wal_records: int
    wal_frames: int
    wal_syncs: int
    wal_bytes: int
    last_lsn: int
    durable_lsn: int
    checkpoints: int
    checkpoint_deltas: int
    checkpoint_lsn: int
    cuda_handles: int
    cuda_mode: int
    seal_sums_ahead: int
    wal_max_delay_us: int
    checkpoint_failures: int
    checkpoint_error: int
    checkpoint_backoff_ms: int
    waits_limbo: int
    waits_seal: int
    waits_backlog: int
    wait_limbo_us: int
    wait_seal_us: int
    wait_backlog_us: int
    limbo_evict_max: int
    blocks_limbo: int
    tier_published: int
    tier_publish_dropped: int
    tier_publish_errors: int
    tier_fetches: int
    tier_fetch_blocks: int
    tier_fetch_found: int
    tier_imported: int
    tier_rejected: int
    tier_errors: int
    tier_deadline_misses: int
    tier_redirects: int
    tier_deleted: int
    tier_delete_failed: int
    tier_lookups: int
    tier_lookup_blocks: int
    tier_lookup_found: int


@dataclass(frozen=True)
class Recovery:
    """What the last open recovered (pkv_get_recovery)."""

    checkpoint_lsn: int
    checkpoint_deltas: int
    records_replayed: int
    last_lsn: int
    torn_bytes: int
    corrupt_lsn: int
    blocks_sealed: int
    sequences: int
    blocks_dropped: int
    sequences_dropped: int
    seq_blocks_bad: int
    sequences_cut: int
    repaired: int
    ms_checkpoint: float
    ms_replay: float
    ms_rebuild: float
    ms_verify: float
    note: str


@dataclass(frozen=True)
class BlockInfo:
    """One block's metadata (pkv_inspect_block): state "free", "open" or "sealed"."""

    state: str
    ref: int
    flags: int
    parent: int
    children: int
    salt: int
    payload_sum: int
    release_lsn: int


class Sequence:
    """A handle on sequence `id` of a cache. It holds no resources of its own:
    the sequence lives in the cache until `close()` (or, on a pkvd connection,
    until the connection ends)."""

    __slots__ = ("cache", "id", "n_cached")

    def __init__(self, cache: "Cache", seq_id: int, n_cached: int = 0) -> None:
        self.cache = cache
        self.id = seq_id
        self.n_cached = n_cached
        """Prompt tokens attached from the cache by `Cache.open` (0 otherwise)."""

    def __repr__(self) -> str:
        return f"<pagedkv.Sequence {self.id}>"

    def append(self, tokens: Tokens) -> list[Slot]:
        """Reserve room for the tokens after the sequence's end (pkv_seq_append);
        returns one Slot per token, whose K/V the caller writes. All-or-nothing:
        FullError when no block can be had, nothing changed."""
        return self.cache._h.append(self.id, tokens)

    def commit(self, n: int) -> None:
        """Declare the K/V of the next n pending tokens written (pkv_seq_commit):
        full blocks are sealed (immutable, shared by later prompts). StateError if
        n exceeds the pending tokens."""
        self.cache._h.commit(self.id, n)

    def commit_append(self, n_commit: int, tokens: Tokens | None = None) -> list[Slot]:
        """Commit n_commit pending tokens, then append `tokens`, in one call
        (pkv_seq_commit_append); returns the new tokens' slots."""
        return self.cache._h.commit_append(self.id, n_commit, tokens)

    def fork(self, child_id: int) -> "Sequence":
        """A new sequence sharing every block of this one (pkv_seq_fork); this one
        must have no pending tokens (StateError)."""
        self.cache._h.fork(self.id, child_id)
        return Sequence(self.cache, child_id)

    def truncate(self, new_len: int) -> None:
        """Drop tokens from the end so the sequence holds new_len (pkv_seq_truncate)."""
        self.cache._h.truncate(self.id, new_len)

    def close(self) -> None:
        """Release the sequence (pkv_seq_close): its sealed blocks stay cached."""
        self.cache._h.seq_close(self.id)

    def info(self) -> SeqInfo:
        """The sequence's lengths and salt (pkv_seq_get_info)."""
        return SeqInfo(*self.cache._h.seq_info(self.id))

    def blocks(self) -> list[int]:
        """Its block table (pkv_seq_blocks): token t lives in block
        blocks()[t // block_size] at offset t % block_size."""
        return self.cache._h.seq_blocks(self.id)

    def tokens(self) -> list[int]:
        """Its token ids, pending ones included (pkv_seq_tokens)."""
        return self.cache._h.seq_tokens(self.id)


class Cache:
    """A pagedkv cache: a directory opened (or created) by pkv_open, or a pkvd
    connection (`connect`). A context manager; `close()` releases it.

    Geometry (layers, kv_heads, head_dim, block_size, dtype), capacity (blocks)
    and model_id are required to create a cache; on reopen they must equal the
    stored ones (GeometryError, ModelError), except capacity=0 ("as stored").
    dtype: "f16" (default), "f32", "bf16". durability: "group" (default: durable
    within group_commit_us), "none" (survives a process crash; synced by sync(),
    checkpoints and close()), "always" (each mutating call returns durable).
    eviction: "leaf-lru" (default) or "leaf-slru". readonly=True inspects
    without the directory lock. The other keywords are pkv_options' fields.
    """

    def __init__(
        self,
        dir: str,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        model_id: str,
        block_size: int = 16,
        dtype: str = "f16",
        durability: str = "group",
        readonly: bool = False,
        flags: int = 0,
        group_commit_us: int = 0,
        checkpoint_bytes: int = 0,
        arena_dir: str | None = None,
        seal_threads: int = 0,
        log_segment_bytes: int = 0,
        eviction: str = "leaf-lru",
        evict_protect_pct: int = 0,
    ) -> None:
        if dtype not in _DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {sorted(_DTYPES)}, not {dtype!r}")
        if durability not in _DURABILITY:
            raise InvalidArgumentError(
                f"durability must be one of {sorted(_DURABILITY)}, not {durability!r}")
        if eviction not in _EVICTION:
            raise InvalidArgumentError(
                f"eviction must be one of {sorted(_EVICTION)}, not {eviction!r}")
        self._h = _pagedkv.open(
            dir, layers=layers, kv_heads=kv_heads, head_dim=head_dim, capacity=capacity,
            model_id=model_id, block_size=block_size, dtype=_DTYPES[dtype],
            durability=_DURABILITY[durability],
            flags=flags | (_pagedkv.OPEN_RDONLY if readonly else 0),
            group_commit_us=group_commit_us, checkpoint_bytes=checkpoint_bytes,
            arena_dir=arena_dir, seal_threads=seal_threads,
            log_segment_bytes=log_segment_bytes, eviction=_EVICTION[eviction],
            evict_protect_pct=evict_protect_pct)
        self._info = self._make_info()

    @classmethod
    def _from_handle(cls, h: Any) -> "Cache":
        self = cls.__new__(cls)
        self._h = h
        self._info = self._make_info()
        return self

    def _make_info(self) -> CacheInfo:
        d = self._h.info()
        d["dtype"] = _DTYPE_NAMES[d["dtype"]]
        return CacheInfo(**d)

    # ---- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Close the cache (pkv_close: a last group commit, synced). Idempotent.
        Raises BufferError while arrays, memoryviews or DLPack tensors exported
        from its views still exist (as mmap.close() does): drop them first. Views themselves may
        outlive close(); using them then raises ValueError."""
        if self._h.exports:
            gc.collect()  # arrays only kept alive by reference cycles
        self._h.close()

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return bool(self._h.closed)

    @property
    def remote(self) -> bool:
        """True for a pkvd connection (`connect`)."""
        return bool(self._h.remote)

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except BufferError:
            # Leaving on an exception whose traceback still references arrays
            # over the arena: don't mask it; the cache closes when the last
            # view is collected.
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        i = self._info
        state = "closed" if self.closed else ("remote" if self.remote else "open")
        return (f"<pagedkv.Cache {state} model_id={i.model_id!r} layers={i.layers} "
                f"kv_heads={i.kv_heads} head_dim={i.head_dim} block_size={i.block_size} "
                f"dtype={i.dtype} capacity={i.capacity}>")

    # ---- geometry ----------------------------------------------------------

    @property
    def info(self) -> CacheInfo:
        """The cache's geometry, dtype, capacity and model_id (pkv_info)."""
        return self._info

    # ---- sequences ---------------------------------------------------------

    def open(self, seq_id: int, tokens: Tokens, salt: int = 0) -> Sequence:
        """Create sequence `seq_id` and attach the longest cached prefix of
        `tokens` made of full blocks, capped below len(tokens) (pkv_seq_open).
        The result's n_cached says how many tokens are attached (committed); the
        caller appends tokens[n_cached:]. Different salts never share blocks.
        ExistsError if the id is in use."""
        n = self._h.seq_open(seq_id, tokens, salt)
        return Sequence(self, seq_id, n)

    def sequence(self, seq_id: int) -> Sequence:
        """A handle on existing sequence `seq_id` (e.g. one recovered at open);
        NoSequenceError if there is none."""
        self._h.seq_info(seq_id)
        return Sequence(self, seq_id)

    def sequences(self) -> list[int]:
        """The ids of all open sequences, recovered ones included (pkv_seq_list;
        NotSupportedError on a pkvd connection)."""
        return self._h.seq_list()

    def lookup(self, tokens: Tokens, salt: int = 0) -> int:
        """How many tokens `open(…, tokens, salt)` would attach now, without side
        effects (pkv_prefix_lookup). Advice: blocks may be evicted before an open."""
        return self._h.lookup(tokens, salt)

    def step_batch(self, steps: Iterable[tuple[int, int, int]]) -> list[Slot]:
        """A decode step for several sequences in one call (pkv_seq_step_batch):
        for each (seq_id, n_commit, token), commit n_commit pending tokens then
        append the token. Returns one Slot per step. On failure the exception
        has `done` (steps that took effect, in order) and `slots` (theirs)."""
        return self._h.step_batch(list(steps))

    # ---- K/V views ---------------------------------------------------------

    def kv(self, block: int, layer: int, kind: int, head: int,
           writable: bool | None = None) -> KVView:
        """Zero-copy view of the (block, layer, kind, head) run: shape
        (block_size, head_dim), format 'e' (f16), 'f' (f32) or 'H' (bf16 bits,
        uint16). `numpy.asarray(view)` reads and writes the arena in place, and
        so do `torch.from_dlpack(view)` and `numpy.from_dlpack(view)` (DLPack,
        bf16 as torch.bfloat16; see KVView.__dlpack__ for read-only views).

        writable=None: writable when the block is being filled (an append handed
        out its slots), read-only otherwise (sealed blocks are immutable).
        writable=True on a block that is not being filled: StateError. On a pkvd
        connection the block state cannot be inspected: read-only unless
        writable=True. RangeError for an index out of range."""
        return self._h.kv(block, layer, kind, head, writable)

    # ---- CUDA layer --------------------------------------------------------

    def cuda(self, device: int = 0, pool_blocks: int = 0, flags: int = 0) -> CudaHandle:
        """Attach CUDA device `device` (pkv_cuda_open; docs/cuda.md): a device
        pool of `pool_blocks` slots (0: the library's default) and
        `pagedkv.CUDA_*` flags. `h.page_in(seq_ids, flags=0, stream=None)` gives
        a CudaBatch whose `pool`, `tables` and `lens` export DLPack (kDLCUDA) for
        `torch.from_dlpack`; `batch.release()`, then `h.close()`, then the cache's.
        NotSupportedError without the CUDA layer (the default wheel) or without a
        usable device, with the reason. Only a build with -Dcuda=enabled
        -Dpython=true has the layer, and its device path has never run
        (docs/python.md)."""
        return self._h.cuda_open(device, pool_blocks, flags)

    def block(self, block: int, writable: bool | None = None) -> KVView:
        """Zero-copy view of a whole block's payload: shape (layers, 2, kv_heads,
        block_size, head_dim) ([layer][K|V][head][token][dim]); writability as kv()."""
        return self._h.block(block, writable)

    def block_info(self, block: int) -> BlockInfo:
        """One block's metadata (pkv_inspect_block; not on a pkvd connection)."""
        d: dict[str, Any] = dict(self._h.block_info(block))
        d["state"] = _BLOCK_STATES.get(d["state"], str(d["state"]))
        return BlockInfo(**d)

    # ---- introspection and durability --------------------------------------

    def stats(self) -> Stats:
        """Counters and occupancy (pkv_get_stats)."""
        return Stats(**self._h.stats())

    def recovery(self) -> Recovery:
        """What the open recovered (pkv_get_recovery; not on a pkvd connection)."""
        return Recovery(**self._h.recovery())

    def check(self) -> None:
        """Verify every invariant (pkv_check); CorruptError names the first broken one."""
        self._h.check()

    def sync(self) -> None:
        """Barrier: returns once every earlier mutation is durable (pkv_sync)."""
        self._h.sync()

    def checkpoint(self) -> None:
        """Write a checkpoint now and recycle the log it covers (pkv_checkpoint)."""
        self._h.checkpoint()

    def metrics_text(self) -> str:
        """The cache's metrics in the Prometheus text format (pkv_metrics_text)."""
        return self._h.metrics_text()


def connect(socket_path: str) -> Cache:
    """Connect to the pkvd daemon on the Unix socket `socket_path` (pkv_connect):
    a Cache whose sequence calls, lookup, stats, sync, info and K/V views are
    the daemon's cache; the arena is mapped into this process, so views are
    zero-copy here too. check, checkpoint, recovery, sequences and block_info
    raise NotSupportedError; once the daemon is gone calls raise
    DisconnectedError (close and connect again)."""
    return Cache._from_handle(_pagedkv.connect(socket_path))


def cuda_probe(device: int = 0) -> tuple[bool, str]:
    """(True, "") when this build has the CUDA layer and device `device` is
    usable (pkv_cuda_probe), else (False, why)."""
    ok, why = _pagedkv.cuda_probe(device)
    return bool(ok), str(why)


def strerror(code: int) -> str:
    """Static description of a PKV_E* code (pkv_strerror)."""
    return _pagedkv.strerror(code)


def attn_decode(
    kv: Union[Cache, Any],
    layer: int,
    q: Any,
    seqs: _Seq[tuple[Tokens, int]],
    *,
    num_q_heads: int | None = None,
    scale: float | None = None,
    num_threads: int = 1,
    portable: bool = False,
    dtype: str | None = None,
    out: Any = None,
) -> Any:
    """Batched decode attention over paged K/V (pkv_attn_decode), one query
    token per sequence, f32 arithmetic.

    kv: a Cache (its arena), or a numpy array of shape (num_blocks, layers, 2,
    kv_heads, block_size, head_dim) with `dtype` ("f16", "f32", "bf16"; bf16 as
    uint16 bits). q: float32 [n_seqs][num_q_heads][head_dim]. seqs: one
    (block_table, length) per sequence; token t of a sequence lives at offset
    t % block_size of block block_table[t // block_size]. num_q_heads defaults
    to q's second dimension, scale to 1/sqrt(head_dim). Returns `out`
    (allocated as a numpy float32 array like q when not given).
    Errors: InvalidArgumentError, RangeError (a table shorter than its length
    needs, a block id out of range), ValueError/TypeError for bad arrays.
    """
    import numpy as np  # only this helper needs numpy

    qa = np.ascontiguousarray(q, dtype=np.float32)
    if isinstance(kv, Cache):
        src: Any = kv._h
        head_dim = kv.info.head_dim
        dt = -1
    else:
        src = kv
        head_dim = int(np.shape(kv)[-1])
        if dtype is None:
            raise ValueError("attn_decode: an array kv needs dtype=")
        dt = _DTYPES[dtype]
    if num_q_heads is None:
        if qa.ndim != 3:
            raise ValueError("attn_decode: q must be [n_seqs][num_q_heads][head_dim] "
                             "(or pass num_q_heads)")
        num_q_heads = int(qa.shape[1])
    if scale is None:
        scale = 1.0 / float(head_dim) ** 0.5
    if out is None:
        out = np.empty_like(qa)
    tables = [s[0] for s in seqs]
    lens = [int(s[1]) for s in seqs]
    _pagedkv.attn_decode(src, layer, num_q_heads, scale, num_threads,
                         _pagedkv.ATTN_PORTABLE if portable else 0, tables, lens, qa, out,
                         dt)
    return out


__all__ = [
    "Cache", "connect", "Sequence", "Slot", "CacheInfo", "SeqInfo", "Stats", "Recovery",
    "BlockInfo", "KVView", "K", "V", "attn_decode", "strerror", "Error", "ERRORS",
    "cuda_probe", "CudaHandle", "CudaBatch", "DeviceArray", "CUDA_GPU_APPEND",
    "CUDA_NO_REGISTER", "CUDA_NO_RW_REGISTER", "CUDA_GATHER_KERNEL",
    "OPEN_POINT_IN_TIME", "OPEN_PREFAULT", "OPEN_FULL_CHECKPOINTS", "OPEN_LIMBO_WAIT",
] + [cls.__name__ for cls in ERRORS.values()]

"""Helpers of the pytest suite (tests/python/): deterministic K/V, geometry,
and finding the pkvd binary.

The K/V convention of the C suites (docs/testing.md): the values of the token
at position p are a pure function of the prefix tokens[0..p] (and the salt), so
any block reached through a prefix hit, a fork or recovery must hold exactly
what the reading sequence would have written itself.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

import pagedkv

REPO = Path(__file__).resolve().parents[2]
GEOM: dict[str, int] = dict(layers=2, kv_heads=2, head_dim=8, block_size=4)
MODEL = "pytest-model"


def open_cache(path: str | os.PathLike[str], capacity: int = 64, **kw: object) -> pagedkv.Cache:
    """A cache of the suite's geometry (f16 unless dtype= says otherwise)."""
    args: dict[str, object] = dict(GEOM, capacity=capacity, model_id=MODEL)
    args.update(kw)
    return pagedkv.Cache(str(path), **args)  # type: ignore[arg-type]


def prefix_hashes(tokens: Sequence[int], salt: int = 0) -> list[int]:
    """h[p] identifies tokens[0..p] under salt."""
    h = (salt * 0x9E3779B97F4A7C15 + 12345) & ((1 << 61) - 1)
    out = []
    for t in tokens:
        h = (h * 1000003 + int(t) + 1) % ((1 << 61) - 1)
        out.append(h)
    return out


def kv_values(h: int, info: pagedkv.CacheInfo) -> np.ndarray:
    """The (layers, 2, kv_heads, head_dim) values of a token whose prefix hash is
    h: small integers, exact in f16, bf16 and f32."""
    L, H, D = info.layers, info.kv_heads, info.head_dim
    idx = np.arange(L * 2 * H * D, dtype=np.int64).reshape(L, 2, H, D)
    return ((h % 211) + idx * 3) % 256


def np_dtype(info: pagedkv.CacheInfo) -> type:
    return {"f16": np.float16, "f32": np.float32, "bf16": np.uint16}[info.dtype]


def to_storage(vals: np.ndarray, info: pagedkv.CacheInfo) -> np.ndarray:
    if info.dtype == "bf16":  # the top 16 bits of the f32 (exact for small ints)
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(np_dtype(info))


def write_kv(c: pagedkv.Cache, tokens: Sequence[int], start: int,
             slots: Sequence[pagedkv.Slot], salt: int = 0) -> None:
    """Write the K/V of tokens[start + i] into slots[i] through block views."""
    hs = prefix_hashes(tokens[: start + len(slots)], salt)
    for i, s in enumerate(slots):
        blk = np.asarray(c.block(s.block))
        blk[:, :, :, s.offset, :] = to_storage(kv_values(hs[start + i], c.info), c.info)
        del blk


def check_kv(c: pagedkv.Cache, seq: pagedkv.Sequence, upto: int | None = None) -> int:
    """Assert that the committed tokens (or the first `upto`) of seq hold the
    K/V of their prefix; returns how many were checked."""
    info = seq.info()
    toks = seq.tokens()
    blocks = seq.blocks()
    n = info.committed if upto is None else upto
    hs = prefix_hashes(toks[:n], info.salt)
    bs = c.info.block_size
    for p in range(n):
        blk = np.asarray(c.block(blocks[p // bs]))
        got = blk[:, :, :, p % bs, :]
        want = to_storage(kv_values(hs[p], c.info), c.info)
        assert np.array_equal(got, want), f"sequence {seq.id}: token {p} holds wrong K/V"
        del blk
    return n


def fill(c: pagedkv.Cache, seq_id: int, tokens: Sequence[int], salt: int = 0,
         commit: bool = True) -> pagedkv.Sequence:
    """Open seq_id on tokens, append and write what is not cached, commit."""
    s = c.open(seq_id, tokens, salt)
    slots = s.append(tokens[s.n_cached:]) if len(tokens) > s.n_cached else []
    write_kv(c, tokens, s.n_cached, slots, salt)
    if commit and slots:
        s.commit(len(slots))
    return s


def pkvd_binary() -> str | None:
    """$PKVD, else tools/pkvd of a build tree of this clone."""
    env = os.environ.get("PKVD")
    if env:
        return env
    for tree in ("build-gcc", "build-py", "build", "build-clang"):
        p = REPO / tree / "tools" / "pkvd"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None

#!/usr/bin/env python3
"""Write fuzz/corpus/tier: hand-made seeds for fuzz_tier (docs/testing-fuzz.md).

Each seed is one byte picking the harness's reader geometry (GEOS in
fuzz/fuzz_tier.c) followed by one tier record value in the layout of
docs/remote.md ("Record", version 2), tagged with the real HMAC-SHA-256 under
the harness's secret, so a seed is valid for a production decoder too. Valid
records of each geometry (raw and LZ4), and one of each refusal the decoder or
the verifier makes. Run from the repository root: python3 fuzz/gen_tier_seeds.py
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

SECRET = b"fuzz-tier-secret-0123456789"
MAGIC = 0x54564B50
VERSION = 2
OUT = os.path.join("fuzz", "corpus", "tier")


@dataclass(frozen=True)
class Geo:
    """A reader geometry of fuzz_tier.c: layers, kv heads, head_dim, block size, dtype, bytes."""

    layers: int
    heads: int
    hdim: int
    bs: int
    dtype: int
    block_bytes: int


GEOS = [Geo(1, 1, 2, 4, 0, 64), Geo(2, 2, 4, 16, 0, 2048), Geo(1, 1, 2, 1, 1, 8),
        Geo(3, 1, 2, 3, 0, 144)]


def mac_key() -> bytes:
    """The record tag's key: HMAC(secret, label), as pkv_tier_keys_derive does."""
    return hmac.new(SECRET, b"pagedkv tier v2: record tag", hashlib.sha256).digest()


def lz4_literals(data: bytes) -> bytes:
    """An LZ4 block holding data as one run of literals (always a valid stream)."""
    n = len(data)
    out = bytearray([min(n, 15) << 4])
    if n >= 15:
        rest = n - 15
        while rest >= 255:
            out.append(255)
            rest -= 255
        out.append(rest)
    return bytes(out) + data


def lz4_zeros(n: int) -> bytes:
    """An LZ4 block of n zero bytes (n >= 13) with one match: literal, match, 5 literals."""
    m = n - 1 - 5
    code = m - 4
    out = bytearray([0x10 | min(code, 15), 0x00, 0x01, 0x00])
    if code >= 15:
        rest = code - 15
        while rest >= 255:
            out.append(255)
            rest -= 255
        out.append(rest)
    return bytes(out) + bytes([0x50]) + bytes(5)


def record(g: Geo, depth: int, *, model: bytes = b"fuzz-model", salt: int = 7,
           tokens: list[int] | None = None, payload: bytes | None = None,
           encoding: int = 0, stored: bytes | None = None, version: int = VERSION,
           reserved: int = 0, tag: bool = True) -> bytes:
    """One record value; tokens default to the reader's prompt 0, 1, 2, ..."""
    ntok = (depth + 1) * g.bs
    toks = tokens if tokens is not None else list(range(ntok))
    kv = payload if payload is not None else bytes((i * 7) & 0xFF for i in range(g.block_bytes))
    body = stored if stored is not None else kv
    h = struct.pack("<IHH", MAGIC, version, len(model))
    h += struct.pack("<5I", g.layers, g.heads, g.hdim, g.bs, g.dtype)
    h += struct.pack("<IQ", depth, salt)
    h += bytes(range(32))  # parent and own tier hash: the harness takes them as stated
    h += struct.pack("<QQII", len(kv), len(body), encoding, reserved)
    assert len(h) == 96
    rec = h + model + b"".join(struct.pack("<I", t) for t in toks) + body
    return rec + (hmac.new(mac_key(), rec, hashlib.sha256).digest() if tag else bytes(32))


def main() -> None:
    """Replace fuzz/corpus/tier with the seeds."""
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.unlink(os.path.join(OUT, f))
    seeds: dict[str, bytes] = {}
    for gi, g in enumerate(GEOS):
        for d in (0, 2):
            seeds[f"ok_g{gi}_d{d}"] = bytes([gi]) + record(g, d)
        kv = bytes((i * 7) & 0xFF for i in range(g.block_bytes))
        seeds[f"lz4_literals_g{gi}"] = bytes([gi]) + record(g, 1, encoding=1,
                                                            stored=lz4_literals(kv))
        if g.block_bytes >= 13:
            seeds[f"lz4_match_g{gi}"] = bytes([gi]) + record(
                g, 0, payload=bytes(g.block_bytes), encoding=1, stored=lz4_zeros(g.block_bytes))
    g0, g1 = GEOS[0], GEOS[1]
    kv0 = bytes((i * 7) & 0xFF for i in range(g0.block_bytes))
    seeds["lz4_short"] = bytes([0]) + record(g0, 0, encoding=1, stored=lz4_literals(kv0[:-8]))
    seeds["lz4_long"] = bytes([0]) + record(g0, 0, encoding=1, stored=lz4_literals(kv0 + b"x"))
    seeds["bad_encoding"] = bytes([0]) + record(g0, 0, encoding=2)
    seeds["reserved_nonzero"] = bytes([0]) + record(g0, 0, reserved=1)
    seeds["geometry_mismatch"] = bytes([0]) + record(g1, 0)
    seeds["wrong_model"] = bytes([1]) + record(g1, 0, model=b"fuzz-modeX")
    seeds["wrong_salt"] = bytes([1]) + record(g1, 1, salt=8)
    seeds["wrong_tokens"] = bytes([0]) + record(g0, 1, tokens=[0, 1, 2, 3, 4, 5, 6, 9])
    seeds["version1"] = bytes([1]) + record(g1, 0, version=1)
    seeds["bad_tag"] = bytes([0]) + record(g0, 0, tag=False)
    ok = record(g0, 0)
    seeds["truncated"] = bytes([0]) + ok[:-1]
    seeds["oversized"] = bytes([0]) + ok + b"\0"
    seeds["short"] = bytes([0]) + ok[:6]
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()

"""pagedkv.attn_decode over a cache's arena and over a caller's numpy array
equals a numpy reference; bad inputs raise."""
from __future__ import annotations

import numpy as np
import pytest

import pagedkv
from kvutil import fill, open_cache


def reference(kv_blocks, layer, q, tables, lens, bs, scale):
    """kv_blocks: (num_blocks, L, 2, H, bs, D) float32."""
    n, nqh, d = q.shape
    kvh = kv_blocks.shape[3]
    g = nqh // kvh
    out = np.zeros_like(q)
    for s in range(n):
        t = np.arange(lens[s])
        blk = np.asarray(tables[s])[t // bs]
        for h in range(nqh):
            K = kv_blocks[blk, layer, 0, h // g, t % bs].astype(np.float64)
            V = kv_blocks[blk, layer, 1, h // g, t % bs].astype(np.float64)
            w = scale * (K @ q[s, h].astype(np.float64))
            w = np.exp(w - w.max())
            out[s, h] = (w / w.sum()) @ V
    return out


@pytest.mark.parametrize("portable", [False, True])
def test_attn_decode_on_the_cache(tmp_path, portable):
    with open_cache(tmp_path / "c", dtype="f32") as c:
        a = fill(c, 1, list(range(1, 12)))
        b = fill(c, 2, list(range(50, 57)))
        rng = np.random.default_rng(1)
        q = rng.standard_normal((2, 4, 8)).astype(np.float32)  # 4 q heads over 2 kv heads
        tables = [a.blocks(), np.array(b.blocks(), dtype=np.uint32)]
        lens = [11, 7]
        out = pagedkv.attn_decode(c, 1, q, list(zip(tables, lens)), portable=portable,
                                  num_threads=2)
        arena = np.stack([np.asarray(c.block(i)).astype(np.float32)
                          for i in range(c.info.capacity)])
        want = reference(arena, 1, q, tables, lens, 4, 1 / np.sqrt(8))
        assert np.allclose(out, want, rtol=1e-4, atol=1e-4)
        del arena


def test_attn_decode_on_an_array():
    rng = np.random.default_rng(2)
    kv = rng.standard_normal((3, 1, 2, 1, 5, 4)).astype(np.float16)
    q = rng.standard_normal((1, 2, 4)).astype(np.float32)
    out = np.empty_like(q)
    r = pagedkv.attn_decode(kv, 0, q, [([2, 0], 9)], dtype="f16", out=out)
    assert r is out
    want = reference(kv.astype(np.float32), 0, q, [[2, 0]], [9], 5, 0.5)
    assert np.allclose(out, want, rtol=1e-3, atol=1e-3)


def test_attn_decode_errors():
    kv = np.zeros((2, 1, 2, 1, 4, 4), dtype=np.float32)
    q = np.zeros((1, 1, 4), dtype=np.float32)
    with pytest.raises(pagedkv.RangeError):
        pagedkv.attn_decode(kv, 0, q, [([0], 8)], dtype="f32")  # table too short
    with pytest.raises(pagedkv.RangeError):
        pagedkv.attn_decode(kv, 0, q, [([5], 1)], dtype="f32")  # block id out of range
    with pytest.raises(pagedkv.InvalidArgumentError):
        pagedkv.attn_decode(kv, 3, q, [([0], 1)], dtype="f32")  # layer
    with pytest.raises(ValueError):
        pagedkv.attn_decode(kv, 0, q, [([0], 1)])  # no dtype
    with pytest.raises(ValueError):
        pagedkv.attn_decode(kv[0], 0, q, [([0], 1)], dtype="f32")  # 5-D
    with pytest.raises(ValueError):
        pagedkv.attn_decode(kv, 0, q, [([0], 1)] * 2, dtype="f32")  # q too small

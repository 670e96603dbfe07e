"""Zero-copy K/V views: numpy reads and writes the arena in place (a write
through one view is read through another and by the C library's attention),
sealed blocks are read-only, views keep the cache alive, close() refuses while
buffers are exported, and a view of a closed cache raises instead of crashing."""
from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

import pagedkv
from kvutil import fill, open_cache


def test_layout_and_zero_copy(tmp_path):
    with open_cache(tmp_path / "c", dtype="f32") as c:
        s = c.open(1, [1, 2, 3, 4, 5, 6])
        slots = s.append([1, 2, 3, 4, 5, 6])
        b = slots[0].block
        run = c.kv(b, 1, pagedkv.V, 1)
        assert run.shape == (4, 8) and run.format == "f" and run.dtype == "f32"
        assert not run.readonly and run.nbytes == 4 * 8 * 4 and run.block == b
        a = np.asarray(run)
        assert a.shape == (4, 8) and a.dtype == np.float32
        a[2] = np.arange(8)  # through the run view ...
        whole = np.asarray(c.block(b))
        assert whole.shape == (2, 2, 2, 4, 8)
        assert np.array_equal(whole[1, 1, 1, 2], np.arange(8))  # ... read via the block view
        flat = np.frombuffer(c.block(b), dtype=np.float32)  # one buffer, no copy
        assert np.shares_memory(flat, whole) or flat.ctypes.data == whole.ctypes.data
        # [layer][K|V][head][token][dim]
        off = ((1 * 2 + 1) * 2 + 1) * 4 * 8 + 2 * 8
        assert np.array_equal(flat[off:off + 8], np.arange(8))
        mv = memoryview(c.kv(b, 0, pagedkv.K, 0))
        assert mv.shape == (4, 8) and mv.format == "f" and mv.c_contiguous
        mv[0, 0] = 42.0
        assert whole[0, 0, 0, 0, 0] == 42.0
        assert c.kv(b, 0, pagedkv.K, 0).tobytes()[:4] == np.float32(42).tobytes()
        del a, whole, flat, mv


def test_f16_and_bf16_formats(tmp_path):
    with open_cache(tmp_path / "h", dtype="f16") as c:
        v = c.kv(0, 0, pagedkv.K, 0)
        assert v.format == "e" and np.asarray(v).dtype == np.float16
    with open_cache(tmp_path / "b", dtype="bf16") as c:
        v = c.kv(0, 0, pagedkv.K, 0)
        assert v.format == "H" and v.dtype == "bf16" and np.asarray(v).dtype == np.uint16


def test_sealed_blocks_are_read_only(tmp_path):
    with open_cache(tmp_path / "c") as c:
        s = fill(c, 1, [1, 2, 3, 4, 5, 6])  # block 0 sealed, block 1 open
        b0, b1 = s.blocks()
        ro = c.kv(b0, 0, pagedkv.K, 0)
        assert ro.readonly and not c.kv(b1, 0, pagedkv.K, 0).readonly
        a = np.asarray(ro)
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0, 0] = 1
        assert memoryview(ro).readonly
        with pytest.raises((BufferError, TypeError)):  # ctypes restates our BufferError
            (ctypes.c_char * ro.nbytes).from_buffer(ro)  # asks for a writable buffer
        with pytest.raises(ValueError):
            np.frombuffer(ro, dtype=np.float16).setflags(write=True)
        with pytest.raises(pagedkv.StateError):
            c.kv(b0, 0, pagedkv.K, 0, writable=True)
        with pytest.raises(pagedkv.StateError):
            c.block(c.info.capacity - 1, writable=True)  # free
        assert c.block(b1, writable=False).readonly
        del a


def test_view_keeps_cache_alive_and_close_refuses_exports(tmp_path):
    c = open_cache(tmp_path / "c")
    s = c.open(1, [1, 2])
    s.append([1, 2])
    v = c.kv(0, 0, pagedkv.K, 0)
    h = weakref.ref(c._h)
    arr = np.asarray(v)
    assert v.exports == 1 and c._h.exports == 1
    with pytest.raises(BufferError, match="exported"):
        c.close()
    assert not c.closed
    arr[0, 0] = 3.0
    del arr
    gc.collect()
    assert c._h.exports == 0
    # dropping the Cache object leaves the handle alive through the view
    c.close()
    assert c.closed and v.closed and "closed" in repr(v)
    with pytest.raises(ValueError, match="closed"):
        memoryview(v)
    with pytest.raises(ValueError, match="closed"):
        np.frombuffer(v, dtype=np.float16)
    with pytest.raises(ValueError, match="closed"):
        v.tobytes()
    del c, s
    gc.collect()
    assert h() is not None  # the view holds the handle
    del v
    gc.collect()
    assert h() is None


def test_handle_closed_by_gc_reopens(tmp_path):
    d = tmp_path / "c"
    c = open_cache(d)
    v = c.kv(0, 0, pagedkv.K, 0)
    del c
    gc.collect()
    with pytest.raises(pagedkv.BusyError):
        open_cache(d)  # the view keeps it open
    del v
    gc.collect()
    with open_cache(d):
        pass


def test_close_collects_cycles_holding_arrays(tmp_path):
    c = open_cache(tmp_path / "c")
    cyc: list[object] = [np.asarray(c.kv(0, 0, pagedkv.K, 0))]
    cyc.append(cyc)
    del cyc
    c.close()  # gc.collect() releases the cycle's export
    assert c.closed


def test_write_through_view_read_by_another_process_view(tmp_path):
    """Written through a view, committed, closed: a new open reads the same bytes."""
    d = tmp_path / "c"
    with open_cache(d, dtype="f32") as c:
        s = c.open(1, list(range(8)))
        slots = s.append(list(range(8)))
        for i, sl in enumerate(slots):
            np.asarray(c.kv(sl.block, 1, pagedkv.V, 0))[sl.offset] = i + 0.5
        s.commit(8)
        blocks = s.blocks()
    with open_cache(d, capacity=0, dtype="f32") as c:
        for i in range(8):
            got = np.asarray(c.kv(blocks[i // 4], 1, pagedkv.V, 0))[i % 4].copy()
            assert np.all(got == i + 0.5)


def test_read_only_handle_gives_read_only_views(tmp_path):
    d = tmp_path / "c"
    with open_cache(d) as c:
        s = fill(c, 1, [1, 2, 3, 4, 5, 6])  # block 1 stays open (2 tokens)
        open_block = s.blocks()[1]
    with open_cache(d, capacity=0, readonly=True) as r:
        assert r.block_info(open_block).state == "open"
        assert r.kv(open_block, 0, pagedkv.K, 0).readonly
        with pytest.raises(pagedkv.ReadOnlyError):
            r.block(open_block, writable=True)

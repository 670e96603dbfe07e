"""DLPack export of K/V views (KVView.__dlpack__): numpy.from_dlpack and
torch.from_dlpack see the arena itself (same pointer, a write through one is
read through the other), with the buffer protocol's shape, strides and values;
a sealed block's versioned tensor is flagged read-only and its legacy one
refused; a tensor keeps the cache alive and close() refuses while it lives, as
for a numpy array; the capsule rules (consumed or not) and the spec's errors.
The torch tests are `heavy` (torch is a large download) and skip without it."""
from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import threading
import weakref
from typing import Any

import numpy as np
import pytest

import pagedkv
from kvutil import fill, open_cache

READ_ONLY, IS_COPIED = 1 << 0, 1 << 1


class _DLTensorV(ctypes.Structure):
    """DLManagedTensorVersioned (DLPack 1.0), read independently of the C side."""
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def versioned(cap: Any) -> _DLTensorV:
    """The managed tensor inside an unconsumed "dltensor_versioned" capsule."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensorV.from_address(get(cap, b"dltensor_versioned"))


def open_run(c: pagedkv.Cache) -> pagedkv.KVView:
    """A writable (block, layer 1, V, head 1) run of an open block."""
    s = c.open(1, [1, 2, 3])
    slots = s.append([1, 2, 3])
    return c.kv(slots[0].block, 1, pagedkv.V, 1)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_numpy_from_dlpack_is_the_arena(tmp_path, dtype):
    with open_cache(tmp_path / "c", dtype=dtype) as c:
        run = open_run(c)
        np.asarray(run)[:] = np.arange(32).reshape(4, 8)
        a = np.from_dlpack(run)
        ref = np.frombuffer(run, dtype=a.dtype).reshape(run.shape)
        assert a.shape == run.shape and a.dtype == ref.dtype
        assert a.strides == memoryview(run).strides  # bytes here, elements in DLPack
        assert np.array_equal(a, ref) and a.flags.writeable
        assert a.__array_interface__["data"][0] == ref.__array_interface__["data"][0]
        a[2, 3] = 7.0  # through the DLPack array ...
        assert np.asarray(run)[2, 3] == 7.0  # ... read through the buffer protocol
        whole = c.block(run.block)
        b = np.from_dlpack(whole)
        assert b.shape == whole.shape == (2, 2, 2, 4, 8)
        assert np.array_equal(b[1, 1, 1], a)  # [layer][K|V][head][token][dim]
        del ref
        assert run.exports == 1 and whole.exports == 1  # the DLPack arrays
        del a, b


def test_versioned_capsule_fields(tmp_path):
    with open_cache(tmp_path / "c", dtype="f16") as c:
        s = fill(c, 1, [1, 2, 3, 4, 5, 6])  # block 0 sealed, block 1 open
        sealed, open_ = s.blocks()
        wv = c.block(open_)
        cap = wv.__dlpack__(max_version=(1, 0))
        t = versioned(cap)
        assert (t.major, t.minor) == (1, 0) and t.flags == 0
        assert (t.device_type, t.device_id) == (1, 0) == wv.__dlpack_device__()
        assert (t.code, t.bits, t.lanes) == (2, 16, 1)  # kDLFloat, 16
        assert t.ndim == 5 and t.byte_offset == 0
        assert [t.shape[i] for i in range(5)] == list(wv.shape)
        mv = memoryview(wv)
        assert [t.strides[i] for i in range(5)] == [st // 2 for st in mv.strides]
        assert t.data == np.frombuffer(wv, np.uint8).ctypes.data
        del mv
        ro = c.kv(sealed, 0, pagedkv.K, 0)
        assert versioned(ro.__dlpack__(max_version=(1, 3))).flags == READ_ONLY
        cp = versioned(ro.__dlpack__(max_version=(1, 0), copy=True))
        assert cp.flags == IS_COPIED and cp.data % 256 == 0
        assert cp.data != np.frombuffer(ro, np.uint8).ctypes.data
        assert "dltensor_versioned" in repr(cap)
        assert "\"dltensor\"" in repr(wv.__dlpack__())  # no max_version: legacy
        assert "\"dltensor\"" in repr(wv.__dlpack__(max_version=(0, 8)))
        del t, cap  # an unconsumed capsule is an export: close() would refuse


def test_sealed_block_read_only_or_refused(tmp_path):
    with open_cache(tmp_path / "c", dtype="f32") as c:
        s = fill(c, 1, [1, 2, 3, 4, 5, 6])
        ro = c.block(s.blocks()[0])
        assert ro.readonly
        a = np.from_dlpack(ro)  # numpy honours the READ_ONLY flag
        assert not a.flags.writeable
        assert a.__array_interface__["data"][0] == np.frombuffer(ro, np.uint8).ctypes.data
        with pytest.raises(ValueError):
            a[0, 0, 0, 0, 0] = 1
        with pytest.raises(BufferError, match="read-only"):
            ro.__dlpack__()  # legacy: cannot say read-only
        with pytest.raises(BufferError, match="read-only"):
            ro.__dlpack__(max_version=None, copy=False)
        # copy=True: a private, writable copy, legacy or not
        cp = np.from_dlpack(ro, copy=True)
        assert np.array_equal(cp, a) and cp.flags.writeable
        assert cp.__array_interface__["data"][0] != a.__array_interface__["data"][0]
        cp[...] = 99.0
        assert not np.any(np.asarray(ro) == 99.0)
        assert ro.exports == 1  # the copy holds nothing
        legacy_copy = ro.__dlpack__(copy=True)
        assert "\"dltensor\"" in repr(legacy_copy) and ro.exports == 1
        assert c.block(s.blocks()[0], writable=False).__dlpack__(max_version=(1, 0))
        del a


def test_capsule_rules_and_export_counting(tmp_path):
    with open_cache(tmp_path / "c") as c:
        run = open_run(c)
        cap = run.__dlpack__(max_version=(1, 0))
        assert run.exports == 1 and c._h.exports == 1  # an unconsumed capsule counts
        del cap  # never consumed: its destructor runs the deleter
        assert run.exports == 0 and c._h.exports == 0
        cap = run.__dlpack__()
        a = np.from_dlpack(_Capsule(cap))  # consumed: renamed "used_dltensor"
        assert "used_dltensor" in repr(cap)
        del cap
        assert run.exports == 1  # the array owns the tensor now
        del a
        gc.collect()
        assert run.exports == 0 and c._h.exports == 0


_USED = b"used_dltensor_versioned"  # the capsule keeps the pointer: must outlive it


_GIL_CHILD = """
import ctypes, sys, threading
sys.path.insert(0, sys.argv[1])
from test_dlpack import _USED, open_run, versioned
from kvutil import open_cache
c = open_cache(sys.argv[2])
run = open_run(c)
cap = run.__dlpack__(max_version=(1, 0))
t = versioned(cap)
set_name = ctypes.pythonapi.PyCapsule_SetName
set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
assert set_name(cap, _USED) == 0  # consumed: the tensor is ours now
addr = ctypes.addressof(t)
deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(t.deleter)
h = c._h
del t, cap, run, c  # the tensor holds the last reference to the view
assert h.exports == 1
th = threading.Thread(target=deleter, args=(addr,))
th.start()
th.join()
assert h.exports == 0
print("deleted")
"""


def test_deleter_takes_the_gil_itself(tmp_path):
    """A consumer may call the deleter on a thread without the GIL (ctypes
    drops it around a CFUNCTYPE call): the deleter takes it itself. Run in a
    child with PYTHONMALLOC=debug, where the deleter's release of the last
    reference to the view frees it, and freeing without the GIL aborts."""
    env = dict(os.environ, PYTHONMALLOC="debug")
    r = subprocess.run([sys.executable, "-c", _GIL_CHILD, os.path.dirname(__file__),
                        str(tmp_path / "c")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "deleted" in r.stdout, r.stdout + r.stderr


class _Capsule:
    """Hands numpy.from_dlpack one given capsule (to watch it be consumed)."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap

    def __dlpack__(self, **kw: Any) -> Any:
        if kw.get("max_version") is not None:
            raise TypeError("legacy only")  # numpy then asks again without it
        return self.cap

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_tensor_keeps_cache_alive_and_close_refuses(tmp_path):
    d = tmp_path / "c"
    c = open_cache(d, dtype="f32")
    run = open_run(c)
    np.asarray(run)[1] = 5.0
    h = weakref.ref(c._h)
    a = np.from_dlpack(run)
    with pytest.raises(BufferError, match="DLPack"):
        c.close()
    assert not c.closed and a[1, 0] == 5.0  # the failed close left it mapped
    del c, run
    gc.collect()
    assert h() is not None and h().exports == 1  # the array -> tensor -> view -> handle
    assert np.all(a[1] == 5.0)
    with pytest.raises(pagedkv.BusyError):
        open_cache(d)  # still open in this process
    del a
    gc.collect()
    assert h() is None  # the deleter dropped the last reference: closed by dealloc
    with open_cache(d, dtype="f32") as c2:
        assert c2.info.capacity > 0


def test_bad_arguments_raise_the_specs_errors(tmp_path):
    c = open_cache(tmp_path / "c")
    run = open_run(c)
    assert run.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="kDLCPU"):
        run.__dlpack__(dl_device=(2, 0))  # kDLCUDA: cannot move
    with pytest.raises(BufferError):
        run.__dlpack__(dl_device=(1, 1))
    with pytest.raises(BufferError):
        run.__dlpack__(dl_device=(13, 0))  # kDLCUDAManaged
    assert run.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(ValueError, match="stream"):
        run.__dlpack__(stream=1)
    with pytest.raises(ValueError, match="stream"):
        run.__dlpack__(stream=-1)
    with pytest.raises(TypeError):
        run.__dlpack__(max_version=1)
    with pytest.raises(TypeError):
        run.__dlpack__(dl_device="cpu")
    with pytest.raises(TypeError):
        run.__dlpack__(None)  # keyword-only
    with pytest.raises(TypeError):
        run.__dlpack__(strem=None)
    assert run.exports == 0 and c._h.exports == 0  # no failed call left a count
    c.close()
    with pytest.raises(ValueError, match="closed"):
        run.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match="closed"):
        np.from_dlpack(run)


def test_bf16_is_refused_by_numpy(tmp_path):
    with open_cache(tmp_path / "c", dtype="bf16") as c:
        run = open_run(c)
        t = versioned(run.__dlpack__(max_version=(1, 0)))
        assert (t.code, t.bits) == (4, 16)  # kDLBfloat
        with pytest.raises(RuntimeError, match="dtype"):
            np.from_dlpack(run)  # numpy has no bfloat16 ("Unsupported dtype in DLTensor")
        gc.collect()
        assert run.exports == 0


# ---- torch ------------------------------------------------------------------

def _torch() -> Any:
    return pytest.importorskip("torch")


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_torch_from_dlpack_is_the_arena(tmp_path, dtype):
    torch = _torch()
    with open_cache(tmp_path / "c", dtype=dtype) as c:
        run = open_run(c)
        u = np.frombuffer(run, dtype=np.uint8)
        u[:] = np.arange(u.size) % 61  # bit patterns that are finite in every dtype
        t = torch.from_dlpack(run)
        want = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        assert t.dtype == want and tuple(t.shape) == run.shape and t.device.type == "cpu"
        assert t.data_ptr() == u.ctypes.data
        ref = np.frombuffer(run, dtype={"f32": np.float32, "f16": np.float16,
                                        "bf16": np.uint16}[dtype]).reshape(run.shape)
        ref_t = torch.from_numpy(ref.copy())
        if dtype == "bf16":
            ref_t = ref_t.view(torch.bfloat16)
        assert torch.equal(t, ref_t)
        t[0, 0] = 3.0  # through the tensor ...
        got = torch.from_numpy(np.frombuffer(run, dtype=ref.dtype).copy())
        if dtype == "bf16":
            got = got.view(torch.bfloat16)
        assert got[0].item() == 3.0  # ... read through the buffer protocol (flat)
        del u, ref
        assert run.exports == 1  # the tensor
        del t
        gc.collect()
        assert run.exports == 0


@pytest.mark.heavy
def test_torch_sealed_block_and_lifetime(tmp_path):
    """torch has no read-only tensors: it takes the READ_ONLY-flagged tensor
    (as the array API standard advises consumers that cannot honour the flag);
    copy=True gives a private copy. The tensor keeps the cache open."""
    torch = _torch()
    d = tmp_path / "c"
    c = open_cache(d, dtype="f32")
    s = fill(c, 1, [1, 2, 3, 4, 5, 6])
    ro = c.block(s.blocks()[0])
    t = torch.from_dlpack(ro)
    assert t.data_ptr() == np.frombuffer(ro, np.uint8).ctypes.data
    assert torch.equal(t, torch.from_numpy(np.asarray(ro).copy()))
    cp = torch.from_dlpack(ro, copy=True)
    assert cp.data_ptr() != t.data_ptr() and torch.equal(cp, t)
    with pytest.raises(BufferError, match="exported"):
        c.close()
    h = weakref.ref(c._h)
    want = t.clone()
    del c, s, ro
    gc.collect()
    assert h() is not None and torch.equal(t, want)
    done: list[bool] = []

    def drop(box: list[Any]) -> None:  # the deleter may run on any thread
        box.clear()
        done.append(True)

    box = [t]
    del t
    th = threading.Thread(target=drop, args=(box,))
    th.start()
    th.join()
    gc.collect()
    assert done and h() is None
    with open_cache(d, dtype="f32") as c2:
        assert c2.sequence(1).blocks()

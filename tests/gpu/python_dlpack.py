"""GPU check of the Python CUDA layer (src/python/cuda.c, docs/python.md): the
device pool of a page-in exported by DLPack (kDLCUDA) holds the arena's K/V of
the paged sequence, slot by slot, per the batch's block tables; the lifetime
chain refuses to cut links under a live export; the spec's errors. Standard
library only (ctypes reads the capsule and copies device memory back through
libcudart), plus torch.from_dlpack when torch with CUDA is importable.

Run by tests/gpu/run.sh with PYTHONPATH holding a `pagedkv` package built with
-Dpython=true -Dcuda=enabled. Exit 0 pass, 77 skip (no usable device), 1 fail.
Written on a machine without a GPU: it had never run when it was committed.
"""
from __future__ import annotations

import ctypes
import gc
import struct
import sys
import tempfile
from typing import Any

try:  # optional; imported before pagedkv so that one CUDA runtime serves both (python.md)
    import torch as _torch
    torch: Any = _torch
except ImportError:
    torch = None

import pagedkv

LAYERS, HEADS, DIM, BS, N = 2, 2, 64, 16, 40


class _DLTensorV(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def versioned(cap: object) -> _DLTensorV:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensorV.from_address(get(cap, b"dltensor_versioned"))


def expect(exc: type[BaseException], fn, *a, **kw) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(*a, **kw)
    except exc:
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def main() -> int:
    ok, why = pagedkv.cuda_probe(0)
    if not ok:
        print(f"SKIP: {why}")
        return 77
    cudart = ctypes.CDLL("libcudart.so.13")  # the runtime the extension loaded

    def d2h(ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        rc = cudart.cudaMemcpy(buf, ctypes.c_void_p(ptr), ctypes.c_size_t(n), 2)  # D2H
        assert rc == 0, f"cudaMemcpy: {rc}"
        return buf.raw

    d = tempfile.mkdtemp(prefix="pkv-py-gpu.")
    c = pagedkv.Cache(d, layers=LAYERS, kv_heads=HEADS, head_dim=DIM, block_size=BS,
                      capacity=64, model_id="gpu-python-check", dtype="f32")
    toks = list(range(1000, 1000 + N))
    s = c.open(1, toks)
    slots = s.append(toks)
    for i, sl in enumerate(slots):  # token i, every (layer, kind, head, dim): a distinct value
        mv = memoryview(c.block(sl.block)).cast("B")
        for l in range(LAYERS):
            for k in range(2):
                for h in range(HEADS):
                    off = ((((l * 2 + k) * HEADS + h) * BS) + sl.offset) * DIM * 4
                    base = float(i * 1000 + l * 100 + k * 50 + h * 10)
                    vals = [base + j / 64 for j in range(DIM)]
                    mv[off:off + DIM * 4] = struct.pack(f"{DIM}f", *vals)
        mv.release()
    s.commit(N)
    blocks = s.blocks()

    g = c.cuda(0, pool_blocks=16)
    print("mode", g.stats()["mode"], g.stats()["device_name"])
    b = g.page_in([1])
    info = b.info
    assert info["n_seqs"] == 1 and info["blocks"] == len(blocks), info
    pool = b.pool
    assert pool.__dlpack_device__() == (2, 0)
    cap = pool.__dlpack__(max_version=(1, 0))
    t = versioned(cap)
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)]
    assert (t.device_type, t.device_id, t.ndim) == (2, 0, 6), (t.device_type, t.ndim)
    assert shape[1:] == [LAYERS, 2, HEADS, BS, DIM] and shape[0] == info["pool_blocks"], shape
    assert t.data == pool.ptr and t.flags == 1  # READ_ONLY: not paged in with GPU_APPEND
    assert b.exports == 1
    expect(BufferError, b.release)  # a live capsule pins the batch
    expect(BufferError, g.close)  # an unreleased batch keeps the handle
    expect(BufferError, c.close)  # an open CUDA handle keeps the cache
    del t, cap
    assert b.exports == 0

    stride = info["table_stride"]
    table = struct.unpack(f"{stride}I", d2h(b.tables.ptr, 4 * stride))
    (length,) = struct.unpack("I", d2h(b.lens.ptr, 4))
    assert length == N, length
    for bi, blk in enumerate(blocks):  # the pool slot holds the arena block, element by element
        want = c.block(blk).tobytes()
        slot = d2h(pool.ptr + table[bi] * strides[0] * 4, strides[0] * 4)
        for l in range(LAYERS):
            for k in range(2):
                for h in range(HEADS):
                    for tok in range(min(BS, N - bi * BS)):
                        a = ((((l * 2 + k) * HEADS + h) * BS) + tok) * DIM * 4
                        o = (l * strides[1] + k * strides[2] + h * strides[3]
                             + tok * strides[4]) * 4
                        assert slot[o:o + DIM * 4] == want[a:a + DIM * 4], (bi, l, k, h, tok)
    print(f"pool slots {list(table[:len(blocks)])} hold the arena's {len(blocks)} blocks")

    expect(BufferError, pool.__dlpack__, max_version=(1, 0), dl_device=(1, 0))
    expect(BufferError, pool.__dlpack__, max_version=(1, 0), copy=True)
    expect(ValueError, pool.__dlpack__, max_version=(1, 0), stream=0)
    expect(BufferError, pool.__dlpack__)  # read-only: no legacy capsule
    assert b.exports == 0

    if torch is not None and torch.cuda.is_available():
        tp = torch.from_dlpack(b.pool)
        tt = torch.from_dlpack(b.tables)
        assert tp.device.type == "cuda" and tp.dtype == torch.float32
        assert tp.data_ptr() == pool.ptr and tuple(tp.shape) == tuple(shape)
        ids = [int(x) for x in tt[0].cpu().tolist()[:len(blocks)]]
        assert ids == list(table[:len(blocks)])
        host = tp[ids[0]].cpu().contiguous()
        want0 = torch.frombuffer(bytearray(c.block(blocks[0]).tobytes()), dtype=torch.float32)
        assert torch.equal(host.flatten(), want0.view(LAYERS, 2, HEADS, BS, DIM).flatten())
        del b, pool, tt  # the tensors keep the batch pinned
        gc.collect()
        expect(BufferError, g.close)
        del tp
        gc.collect()
        g.close()  # the batch was released by its dealloc
        print("torch.from_dlpack: pool and tables OK")
    else:
        print("torch with CUDA not importable: torch part skipped")
        del pool
        b.release()
        g.close()
    c.close()
    print("PASS python_dlpack")
    return 0


if __name__ == "__main__":
    sys.exit(main())

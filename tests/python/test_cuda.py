"""The CUDA layer from Python (src/python/cuda.c): without the layer (the
default wheel) or without a usable device, `cuda_probe` says why and
`Cache.cuda()` raises NotSupportedError with that reason, leaving the cache
usable and closable. With a usable device, the device check
(tests/gpu/python_dlpack.py: the pool by DLPack, lifetimes, errors) runs here
too; it skips otherwise (no GPU where this was written)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pagedkv
from kvutil import REPO, open_cache


def test_cuda_probe_says_why():
    ok, why = pagedkv.cuda_probe(0)
    assert isinstance(ok, bool) and isinstance(why, str)
    if not pagedkv._pagedkv.WITH_CUDA:
        assert not ok and "without the CUDA layer" in why
    if not ok:
        assert why  # a reason, never an empty string


def test_cuda_open_without_layer_or_device_raises(tmp_path):
    ok, why = pagedkv.cuda_probe(0)
    if ok:
        pytest.skip("a usable CUDA device: test_device_check covers it")
    c = open_cache(tmp_path / "c")
    with pytest.raises(pagedkv.NotSupportedError) as e:
        c.cuda(0)
    assert e.value.name == "PKV_ENOTSUP" and str(e.value)  # the reason, from pkv_last_error
    if not pagedkv._pagedkv.WITH_CUDA:
        assert "without the CUDA layer" in str(e.value)
    with pytest.raises(pagedkv.NotSupportedError):
        c.cuda(device=3, pool_blocks=8, flags=pagedkv.CUDA_NO_REGISTER)
    with pytest.raises(TypeError):
        c.cuda("0")  # type: ignore[arg-type]
    assert c._h.exports == 0
    c.close()  # no CUDA handle was left open
    with pytest.raises(ValueError, match="closed"):
        c.cuda(0)


def test_device_check():
    ok, why = pagedkv.cuda_probe(0)
    if not ok:
        pytest.skip(f"no usable CUDA device: {why}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(REPO / "tests/gpu/python_dlpack.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

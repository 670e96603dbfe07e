"""pagedkv.connect() to a real pkvd (the build tree's tools/pkvd, or $PKVD)
started by the test: two connections share a prefix and read its K/V in place,
writes go through writable views of the client's own mapping, the calls a
connected handle refuses raise NotSupportedError, and a killed daemon gives
DisconnectedError."""
from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import pagedkv
from kvutil import GEOM, MODEL, check_kv, pkvd_binary, prefix_hashes, kv_values, to_storage

PKVD = pkvd_binary()
pytestmark = pytest.mark.skipif(
    PKVD is None and not os.environ.get("CI"),
    reason="no pkvd binary: build the meson tree (tools/pkvd) or set $PKVD")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    assert PKVD, "pkvd binary not found (set $PKVD)"
    sock = str(tmp_path / "pkvd.sock")
    r, w = os.pipe()
    args = [PKVD, "--dir", str(tmp_path / "cache"), "--socket", sock, "--ready-fd", str(w),
            "--layers", str(GEOM["layers"]), "--kv-heads", str(GEOM["kv_heads"]),
            "--head-dim", str(GEOM["head_dim"]), "--block-size", str(GEOM["block_size"]),
            "--dtype", "f16", "--capacity", "64", "--model-id", MODEL, "--client-wait", "5"]
    p = subprocess.Popen(args, pass_fds=(w,))
    os.close(w)
    ready, _, _ = select.select([r], [], [], 20)
    line = os.read(r, 6) if ready else b""
    os.close(r)
    assert line == b"READY\n", "pkvd did not get ready"
    try:
        yield p, sock
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def write_remote(c: pagedkv.Cache, tokens: list[int], start: int,
                 slots: list[pagedkv.Slot]) -> None:
    hs = prefix_hashes(tokens)
    for i, s in enumerate(slots):
        blk = np.asarray(c.block(s.block, writable=True))
        blk[:, :, :, s.offset, :] = to_storage(kv_values(hs[start + i], c.info), c.info)
        del blk


def test_two_connections_share_a_prefix(daemon):
    _, sock = daemon
    prompt = list(range(300, 313))
    with pagedkv.connect(sock) as a, pagedkv.connect(sock) as b:
        assert a.remote and a.info.model_id == MODEL and a.info.block_size == 4
        assert repr(a).startswith("<pagedkv.Cache remote")
        s = a.open(1, prompt)
        assert s.n_cached == 0
        slots = s.append(prompt)
        assert a.kv(slots[0].block, 0, pagedkv.K, 0).readonly  # remote: read-only unless asked
        write_remote(a, prompt, 0, slots)
        s.commit(len(prompt))
        assert s.info().committed == 13 and s.tokens() == prompt
        a.sync()
        assert b.lookup(prompt) == 12
        t = b.open(1, prompt)  # ids belong to the connection
        assert t.n_cached == 12 and t.blocks()[:3] == s.blocks()[:3]
        check_kv(b, t)  # b reads what a wrote, in its own mapping of the arena
        out = b.step_batch([(1, 0, 7)])
        assert len(out) == 1
        st = b.stats()
        assert st.hit_tokens >= 12 and st.sequences == 2
        for call in (b.check, b.checkpoint, b.recovery, b.sequences, lambda: b.block_info(0)):
            with pytest.raises(pagedkv.NotSupportedError):
                call()
        t.close()
        with pytest.raises(pagedkv.NoSequenceError):
            t.close()


def test_daemon_death_gives_disconnected(daemon):
    p, sock = daemon
    c = pagedkv.connect(sock)
    c.open(1, [1, 2, 3])
    p.send_signal(signal.SIGKILL)
    p.wait()
    with pytest.raises(pagedkv.DisconnectedError) as e:
        c.open(2, [1])
    assert e.value.code == pagedkv.DisconnectedError.code
    with pytest.raises(pagedkv.DisconnectedError):
        c.lookup([1, 2])
    c.close()
    assert c.closed

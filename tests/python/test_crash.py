"""A child process writing to a cache is SIGKILLed mid-work; the reopen
serves exactly the K/V of each recovered sequence's committed prefix, and every
sequence the child had synced is there in full."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pagedkv
from kvutil import check_kv, open_cache

CHILD = textwrap.dedent("""
    import random, sys
    sys.path.insert(0, {here!r})
    from kvutil import fill, open_cache, write_kv
    c = open_cache({dir!r}, capacity=256, durability={dur!r})
    rng = random.Random({seed})
    shared = [rng.randrange(1000) for _ in range(9)]
    i = 0
    while True:
        prompt = shared[: rng.randrange(10)] + [rng.randrange(1000) for _ in range(rng.randrange(1, 12))]
        s = fill(c, i, prompt, commit=False)
        pend = s.info().len - s.info().committed
        k = rng.randrange(pend + 1) if i % 3 == 0 else pend
        if k:
            s.commit(k)
        # decode a few tokens, each committed
        toks = s.tokens()
        for _ in range(rng.randrange(4)):
            if s.info().len > s.info().committed:
                s.commit(s.info().len - s.info().committed)
            t = rng.randrange(1000)
            slots = s.append([t])
            toks.append(t)
            write_kv(c, toks, len(toks) - 1, slots)
        if i % 7 == 6:
            s.close()
        if i % 5 == 4:
            c.sync()
            print("synced", i, flush=True)
        i += 1
""")


@pytest.mark.parametrize("durability,seed", [("group", 1), ("none", 2), ("always", 3)])
def test_reopen_after_sigkill_serves_only_committed_kv(tmp_path: Path, durability: str,
                                                        seed: int) -> None:
    d = tmp_path / "c"
    here = str(Path(__file__).resolve().parent)
    code = CHILD.format(here=here, dir=str(d), dur=durability, seed=seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=env)
    synced = -1
    assert p.stdout is not None
    for line in p.stdout:
        synced = int(line.split()[1])
        if synced >= 24:
            break
    p.send_signal(signal.SIGKILL)  # mid-work: it keeps writing after its last sync
    p.wait()
    assert synced >= 24, f"the child stopped early (exit {p.returncode})"
    assert p.returncode == -signal.SIGKILL

    with open_cache(d, capacity=0) as c:
        c.check()
        ids = set(c.sequences())
        closed = {i for i in range(synced + 1) if i % 7 == 6}
        assert set(range(synced + 1)) - closed <= ids, "a synced sequence was lost"
        checked = 0
        for sid in sorted(ids):
            checked += check_kv(c, c.sequence(sid))
        assert checked > 100
        # Prompts of recovered sequences hit their prefix, and the K/V attached is right.
        for n, sid in enumerate(sorted(ids)[:10]):
            toks = c.sequence(sid).tokens()[: c.sequence(sid).info().committed]
            t = c.open(10_000 + n, toks)
            check_kv(c, t)
        r = c.recovery()
        assert r.sequences == len(ids)
    assert isinstance(pagedkv.__version__, str)

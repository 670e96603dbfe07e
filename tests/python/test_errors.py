"""Every PKV_E* code of include/pagedkv.h maps to its own subclass of
pagedkv.Error carrying the code and pkv_last_error()'s message; the errors a
user can provoke are raised as those classes; bad arguments never crash."""
from __future__ import annotations

import re

import pytest

import pagedkv
from kvutil import MODEL, REPO, fill, open_cache

HEADER = (REPO / "include" / "pagedkv.h").read_text()
CODES = {m.group(1): int(m.group(2))
         for m in re.finditer(r"PKV_(E[A-Z]+)\s*=\s*(-\d+)\s*,", HEADER)}


def test_every_header_code_has_a_class():
    assert len(CODES) >= 18
    assert set(pagedkv.ERRORS) == set(CODES.values())
    names = set()
    for name, code in CODES.items():
        cls = pagedkv.ERRORS[code]
        assert issubclass(cls, pagedkv.Error) and cls is not pagedkv.Error
        assert cls.code == code and cls.name == "PKV_" + name
        assert getattr(pagedkv, cls.__name__) is cls and cls.__module__ == "pagedkv"
        assert cls.__doc__.startswith("PKV_" + name)
        assert pagedkv.strerror(code) != "unknown error"
        names.add(cls.__name__)
    assert len(names) == len(CODES)
    assert pagedkv.FullError.code == CODES["EFULL"]


def test_open_errors(tmp_path):
    with pytest.raises(pagedkv.InvalidArgumentError) as e:
        open_cache(tmp_path / "a", capacity=0)
    assert e.value.code == CODES["EINVAL"] and str(e.value)
    with pytest.raises(pagedkv.InvalidArgumentError):
        open_cache(tmp_path / "a", dtype="f8")
    with pytest.raises(pagedkv.InvalidArgumentError):
        open_cache(tmp_path / "a", durability="sometimes")
    d = tmp_path / "c"
    with open_cache(d):
        with pytest.raises(pagedkv.BusyError):
            open_cache(d)
    with pytest.raises(pagedkv.GeometryError):
        open_cache(d, head_dim=16)
    with pytest.raises(pagedkv.ModelError) as e:
        open_cache(d, model_id="another-model")
    assert "model" in str(e.value).lower()
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "arena").write_bytes(b"\x00" * 8192)
    with pytest.raises((pagedkv.CorruptError, pagedkv.VersionError)):
        open_cache(tmp_path / "v")


def test_sequence_errors(tmp_path):
    with open_cache(tmp_path / "c", capacity=4) as c:
        s = fill(c, 1, [1, 2, 3, 4, 5])
        with pytest.raises(pagedkv.ExistsError):
            c.open(1, [1])
        with pytest.raises(pagedkv.NoSequenceError):
            c.sequence(2)
        with pytest.raises(pagedkv.NoSequenceError):
            c._h.commit(2, 1)
        with pytest.raises(pagedkv.StateError):
            s.commit(1)  # nothing pending
        with pytest.raises(pagedkv.RangeError):
            s.truncate(99)
        with pytest.raises(pagedkv.InvalidArgumentError):
            s.append([])
        with pytest.raises(pagedkv.FullError):
            s.append(list(range(100)))
        s.append([9])
        with pytest.raises(pagedkv.StateError):
            s.fork(3)  # pending tokens
        with pytest.raises(pagedkv.ExistsError):
            s.commit(1) or s.fork(1)
        with pytest.raises(pagedkv.InvalidArgumentError):
            c.lookup([])
        with pytest.raises(pagedkv.InvalidArgumentError):
            c.step_batch([])
        with pytest.raises(TypeError):
            c.step_batch([(1, 2)])
        c.check()


def test_view_argument_errors(tmp_path):
    with open_cache(tmp_path / "c") as c:
        cap = c.info.capacity
        with pytest.raises(pagedkv.RangeError):
            c.kv(cap, 0, pagedkv.K, 0)
        with pytest.raises(pagedkv.RangeError):
            c.kv(0, 2, pagedkv.K, 0)
        with pytest.raises(pagedkv.RangeError):
            c.kv(0, 0, pagedkv.V, 2)
        with pytest.raises(pagedkv.InvalidArgumentError):
            c.kv(0, 0, 2, 0)
        with pytest.raises(pagedkv.RangeError):
            c.block(cap)
        with pytest.raises(OverflowError):
            c.kv(-1, 0, 0, 0)


def test_connect_errors(tmp_path):
    with pytest.raises(pagedkv.DisconnectedError) as e:
        pagedkv.connect(str(tmp_path / "no-such.sock"))
    assert e.value.code == CODES["EDISCONNECTED"]
    with pytest.raises(pagedkv.InvalidArgumentError):
        pagedkv.connect("/" + "x" * 200)


def test_closed_cache_raises(tmp_path):
    c = open_cache(tmp_path / "c")
    c.close()
    for call in (lambda: c.open(1, [1]), lambda: c.stats(), lambda: c.kv(0, 0, 0, 0),
                 lambda: c.lookup([1, 2]), lambda: c.sync(), lambda: c.info.layers and c.check()):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert MODEL

"""Every call of the pagedkv package on a local cache: sequences, lookup,
sharing, stats, check, sync, checkpoint, recovery, reopen, read-only handles,
token inputs (lists, numpy arrays of several integer types)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pagedkv
from kvutil import GEOM, MODEL, check_kv, fill, open_cache, write_kv


def test_info_and_repr(tmp_path):
    with open_cache(tmp_path / "c", capacity=32, dtype="f32") as c:
        i = c.info
        assert (i.layers, i.kv_heads, i.head_dim, i.block_size) == (2, 2, 8, 4)
        assert (i.dtype, i.capacity, i.model_id, i.elem_size) == ("f32", 32, MODEL, 4)
        assert i.run_bytes == 4 * 8 * 4 and i.block_bytes == 2 * 2 * 2 * 4 * 8 * 4
        assert "model_id='pytest-model'" in repr(c) and not c.closed and not c.remote
    assert c.closed and "closed" in repr(c)
    c.close()  # idempotent


@pytest.mark.parametrize("dtype", ["f16", "f32", "bf16"])
def test_sequence_lifecycle_and_prefix_sharing(tmp_path, dtype):
    with open_cache(tmp_path / "c", dtype=dtype) as c:
        prompt = list(range(100, 111))  # 11 tokens: 2 full blocks + 3
        s = fill(c, 1, prompt)
        assert s.n_cached == 0
        assert s.info() == pagedkv.SeqInfo(len=11, committed=11, n_blocks=3, salt=0)
        assert s.tokens() == prompt and len(s.blocks()) == 3
        check_kv(c, s)
        # A second sequence on the same prompt attaches 2 full blocks (capped at n-1).
        assert c.lookup(prompt) == 8
        t = c.open(2, prompt)
        assert t.n_cached == 8 and t.blocks() == s.blocks()[:2]
        check_kv(c, t)
        slots = t.append(prompt[8:])
        write_kv(c, prompt, 8, slots)
        t.commit(3)
        check_kv(c, t)
        # Another salt shares nothing.
        assert c.lookup(prompt, salt=7) == 0
        u = fill(c, 3, prompt, salt=7)
        assert u.n_cached == 0 and not set(u.blocks()) & set(s.blocks())
        check_kv(c, u)
        st = c.stats()
        assert st.sequences == 3 and st.hit_tokens == 8 and st.seals >= 4
        c.check()
        for x in (s, t, u):
            x.close()
        assert c.sequences() == [] and c.stats().blocks_used == 0


def test_commit_append_step_batch_fork_truncate(tmp_path):
    with open_cache(tmp_path / "c") as c:
        prompt = [5, 6, 7, 8, 9, 10]
        s = fill(c, 1, prompt)
        toks = list(prompt)
        # decode: commit the previous token, append the next
        slots = s.commit_append(0, [11])
        toks.append(11)
        write_kv(c, toks, 6, slots)
        for nxt in (12, 13):
            slots = s.commit_append(1, [nxt])
            toks.append(nxt)
            write_kv(c, toks, len(toks) - 1, slots)
        assert s.commit_append(1) == []
        assert s.info().committed == 9 and s.tokens() == toks
        check_kv(c, s)
        # step_batch over two sequences
        f = s.fork(2)
        assert isinstance(f, pagedkv.Sequence) and f.tokens() == toks
        out = c.step_batch([(1, 0, 20), (2, 0, 21)])
        assert len(out) == 2 and all(isinstance(x, pagedkv.Slot) for x in out)
        write_kv(c, toks + [20], 9, [out[0]])
        write_kv(c, toks + [21], 9, [out[1]])
        out2 = c.step_batch([(1, 1, 30), (2, 1, 31)])
        assert out2[0] != out2[1]
        for sq in (s, f):
            sq.truncate(10)
            check_kv(c, sq)
        assert s.tokens() == toks + [20] and f.tokens() == toks + [21]
        f.truncate(3)
        assert f.info().len == 3
        check_kv(c, f)
        c.check()


def test_step_batch_partial_failure_reports_done(tmp_path):
    with open_cache(tmp_path / "c") as c:
        fill(c, 1, [1, 2, 3])
        with pytest.raises(pagedkv.NoSequenceError) as e:
            c.step_batch([(1, 0, 4), (99, 0, 5)])
        assert e.value.done == 1 and len(e.value.slots) == 1
        assert c.sequence(1).info().len == 4


def test_token_inputs(tmp_path):
    with open_cache(tmp_path / "c") as c:
        prompt = list(range(1, 10))
        fill(c, 1, prompt)
        for arr in (np.array(prompt, dtype=np.uint32), np.array(prompt, dtype=np.int64),
                    np.array(prompt, dtype=np.int32), np.array(prompt, dtype=np.uint16),
                    tuple(prompt), range(1, 10),
                    np.array(prompt * 2, dtype=np.uint32).reshape(2, 9)[0],
                    np.repeat(np.array(prompt, dtype=np.uint32), 2)[::2]):  # strided
            assert c.lookup(arr) == 8, type(arr)
        # a misaligned uint32 buffer (offset 1 into bytes) is copied, not read in place
        raw = b"\0" + np.array(prompt, dtype=np.uint32).tobytes()
        mis = np.frombuffer(raw, dtype=np.uint32, offset=1)
        assert not mis.flags.aligned
        assert c.lookup(mis) == 8
        with pytest.raises(OverflowError):
            c.lookup([1, -2, 3])
        with pytest.raises(OverflowError):
            c.lookup(np.array([1, 2**32], dtype=np.int64))
        with pytest.raises(OverflowError):
            c.lookup([2**32])
        with pytest.raises(TypeError):
            c.lookup("abc")
        with pytest.raises(TypeError):
            c.lookup(np.zeros(4, dtype=np.float32))
        with pytest.raises(TypeError):
            c.lookup(np.zeros((2, 2), dtype=np.uint32))
        with pytest.raises(OverflowError):
            c.open(-1, [1])
        with pytest.raises(TypeError):
            c.open(1.5, [1])
        s = c.open(np.uint64(2**64 - 1), np.array([1, 2], dtype=np.int8))  # numpy ids too
        s.append(np.array([1, 2, 3], dtype=np.int8))
        assert c.sequence(2**64 - 1).tokens() == [1, 2, 3]
        s.commit(np.int32(1))


def test_reopen_recovers_sequences_and_kv(tmp_path):
    d = tmp_path / "c"
    with open_cache(d) as c:
        s = fill(c, 7, list(range(40, 55)))
        c.sync()
        c.checkpoint()
        fill(c, 8, list(range(40, 50)) + [1, 2, 3])
        st = c.stats()
        assert st.checkpoints >= 1 and st.durable_lsn <= st.last_lsn
    with open_cache(d, capacity=0) as c:
        assert sorted(c.sequences()) == [7, 8]
        r = c.recovery()
        assert r.sequences == 2 and r.checkpoint_lsn > 0 and isinstance(r.note, str)
        assert dataclasses.asdict(r)["sequences"] == 2
        for sid in (7, 8):
            check_kv(c, c.sequence(sid))
        with pytest.raises(pagedkv.NoSequenceError):
            c.sequence(9)
        c.check()
        t = c.open(9, list(range(40, 55)))
        assert t.n_cached == 12
        check_kv(c, t)
        del s


def test_readonly_handle(tmp_path):
    d = tmp_path / "c"
    with open_cache(d) as c:
        fill(c, 1, list(range(20)))
    with open_cache(d, capacity=0, readonly=True) as r:
        assert r.sequences() == [1]
        check_kv(r, r.sequence(1))
        with pytest.raises(pagedkv.ReadOnlyError):
            r.open(2, [1, 2])
        with pytest.raises(pagedkv.ReadOnlyError):
            r.sync()
        assert r.lookup(list(range(20))) == 16


def test_block_info_and_metrics(tmp_path):
    with open_cache(tmp_path / "c") as c:
        s = c.open(1, [1, 2, 3, 4, 5])
        slots = s.append([1, 2, 3, 4, 5])
        b0 = slots[0].block
        assert c.block_info(b0).state == "open"
        write_kv(c, [1, 2, 3, 4, 5], 0, slots)
        s.commit(5)
        bi = c.block_info(b0)
        assert bi.state == "sealed" and bi.ref == 1
        assert c.block_info(c.info.capacity - 1).state == "free"
        with pytest.raises(pagedkv.InvalidArgumentError):
            c.block_info(c.info.capacity)
        text = c.metrics_text()
        assert "pagedkv_" in text and "# TYPE" in text


def test_stats_has_every_field(tmp_path):
    with open_cache(tmp_path / "c") as c:
        st = c.stats()
        assert set(dataclasses.asdict(st)) == set(c._h.stats())
        assert st.capacity == 64 and st.blocks_free == 64


def test_help_and_stubs_read_well():
    for obj in (pagedkv, pagedkv.Cache, pagedkv.Cache.open, pagedkv.Cache.kv,
                pagedkv.Sequence.append, pagedkv.connect, pagedkv.attn_decode,
                pagedkv.Error, pagedkv.FullError, pagedkv.KVView):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj
    assert pagedkv.__version__.count(".") == 2
    assert GEOM["block_size"] == 4

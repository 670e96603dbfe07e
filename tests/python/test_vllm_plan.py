"""The pure logic of the vLLM connector (pagedkv._vllm_plan), without vLLM or
torch: the matched-token answer (capped, aligned, beyond the local hit), the
load and store block mappings, the planner over scheduler outputs shaped like
vLLM's (new requests, chunked prefill, a resumed request, finished requests),
the requests it refuses to serve, model identity and the geometry check. The
connector itself runs against a real vLLM in scripts/check-vllm.sh (opt-in)."""
from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest

from pagedkv import _vllm_plan as vp


def test_matched_tokens_is_capped_aligned_and_beyond_local() -> None:
    # 300-token prompt, 299 cached in pagedkv: cap 299, aligned to 32 -> 288
    assert vp.matched_tokens(299, 300, 0, 32) == 288
    # the lookup itself may say n (it is capped at n - 1 by pagedkv, but be safe)
    assert vp.matched_tokens(320, 320, 0, 32) == 288
    assert vp.matched_tokens(320, 321, 0, 32) == 320
    # vLLM has 64 locally: only the rest is new
    assert vp.matched_tokens(299, 300, 64, 32) == 224
    # less in pagedkv than vLLM has locally: nothing, never negative
    assert vp.matched_tokens(48, 300, 64, 32) == 0
    # under one vLLM block: nothing
    assert vp.matched_tokens(16, 300, 0, 32) == 0
    assert vp.matched_tokens(0, 1, 0, 32) == 0


def test_load_split_reports_the_blocks_the_open_did_not_attach() -> None:
    assert vp.load_split(0, 288, 288, 32) == (288, [])
    # evicted since the lookup: 160 attached (aligned down to 160), blocks 5..8 fail
    assert vp.load_split(0, 288, 176, 32) == (160, [5, 6, 7, 8])
    # vLLM had 64 locally: the failed range starts at the load's start at the earliest
    assert vp.load_split(64, 288, 0, 32) == (64, [2, 3, 4, 5, 6, 7, 8])
    assert vp.load_split(64, 128, 300, 32) == (128, [])


def test_load_copies_map_pagedkv_blocks_into_vllm_blocks() -> None:
    pkv = [10, 11, 12, 13, 14, 15]           # pagedkv blocks of 16 tokens
    vll = [7, 3, 9]                          # vLLM blocks of 32 tokens
    assert vp.load_copies(0, 96, pkv, vll, 16, 32) == [
        (10, 7, 0), (11, 7, 16), (12, 3, 0), (13, 3, 16), (14, 9, 0), (15, 9, 16)]
    assert vp.load_copies(32, 64, pkv, vll, 16, 32) == [(12, 3, 0), (13, 3, 16)]
    with pytest.raises(ValueError):
        vp.load_copies(8, 64, pkv, vll, 16, 32)


def test_store_copies_need_whole_blocks_from_offset_zero() -> None:
    slots = [(5, i) for i in range(16)] + [(6, i) for i in range(16)]
    assert vp.store_copies(32, slots, [1, 2, 3], 16, 32) == [(5, 2, 0), (6, 2, 16)]
    assert vp.store_copies(16, slots, [1, 2, 3], 16, 32) == [(5, 1, 16), (6, 2, 0)]
    # a partial block, a block not starting at offset 0, a block change mid-way
    assert vp.store_copies(0, slots[:20], [1, 2], 16, 32) is None
    assert vp.store_copies(0, [(5, i + 1) for i in range(16)], [1], 16, 32) is None
    bad = list(slots)
    bad[3] = (9, 3)
    assert vp.store_copies(0, bad, [1, 2], 16, 32) is None
    assert vp.store_copies(8, slots, [1, 2], 16, 32) is None


def test_a_store_over_a_block_whose_load_failed_is_skipped() -> None:
    # vLLM blocks of 32 tokens; the store reads blocks [7, 9, 4] for 70 tokens
    assert vp.store_reads_failed(70, [7, 9, 4, 5], 32, {4})
    assert vp.store_reads_failed(70, [7, 9, 4, 5], 32, {7})
    assert not vp.store_reads_failed(70, [7, 9, 4, 5], 32, {5})  # beyond the prompt
    assert not vp.store_reads_failed(64, [7, 9, 4, 5], 32, {4})
    assert not vp.store_reads_failed(70, [7, 9, 4, 5], 32, set())


def test_salt_of() -> None:
    assert vp.salt_of(None) == 0 and vp.salt_of("") == 0
    a, b = vp.salt_of("tenant-a"), vp.salt_of("tenant-b")
    assert a != 0 and b != 0 and a != b and a == vp.salt_of("tenant-a")
    assert 0 < a < 2 ** 64


def test_requests_whose_kv_is_not_their_ids_alone_are_not_served() -> None:
    assert vp.request_usable([1, 2, 3])
    assert not vp.request_usable(None)
    assert not vp.request_usable([])
    assert not vp.request_usable([1, 2], mm_features=[object()])
    assert not vp.request_usable([1, 2], lora_request=object())
    assert not vp.request_usable([1, 2], prompt_embeds=object())


def _new(rid: str, prompt: list[int], blocks: list[int], computed: int) -> Any:
    return NS(req_id=rid, prompt_token_ids=prompt, block_ids=(blocks,),
              num_computed_tokens=computed)


def _out(new: list[Any] = (), cached: Any = None, sched: dict[str, int] | None = None) -> Any:
    if cached is None:
        cached = NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
    return NS(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
              num_scheduled_tokens=sched or {})


def test_planner_loads_what_vllm_accepted_and_stores_once_after_prefill() -> None:
    prompt = list(range(1000, 1300))  # 300 tokens
    p = vp.Planner(32, 16)
    p.track("a", prompt, 0, True)
    assert p.matched("a", 0, lambda toks, salt: 299) == 288
    p.after_alloc("a", 288)
    blocks = list(range(20, 30))  # 10 vLLM blocks: 320 tokens of room
    plan = p.build(_out([_new("a", prompt, blocks, 288)], sched={"a": 12}))
    assert len(plan.loads) == 1
    ld = plan.loads[0]
    assert (ld.start, ld.end, ld.tokens, ld.block_ids) == (0, 288, prompt[:289], blocks)
    # prefill completes in this step (288 + 12 = 300): the store of 288 = 18 x 16 tokens
    assert len(plan.saves) == 1 and plan.saves[0].tokens == prompt[:288]
    # a decode step: no load, no second store
    cached = NS(req_ids=["a"], resumed_req_ids=set(), new_block_ids=[None],
                num_computed_tokens=[300])
    plan = p.build(_out(cached=cached, sched={"a": 1}))
    assert plan.loads == [] and plan.saves == []
    p.finished("a")
    assert not p.tracked("a")


def test_planner_chunked_prefill_stores_in_the_last_chunk_with_all_blocks() -> None:
    prompt = list(range(100))
    p = vp.Planner(32, 16)
    p.track("c", prompt, 7, True)
    p.after_alloc("c", 0)
    plan = p.build(_out([_new("c", prompt, [1, 2], 0)], sched={"c": 64}))
    assert plan.loads == [] and plan.saves == []
    cached = NS(req_ids=["c"], resumed_req_ids=set(), new_block_ids=[([3, 4],)],
                num_computed_tokens=[64])
    plan = p.build(_out(cached=cached, sched={"c": 36}))
    assert plan.loads == []
    assert len(plan.saves) == 1
    sv = plan.saves[0]
    assert (sv.tokens, sv.salt, sv.block_ids) == (prompt[:96], 7, [1, 2, 3, 4])


def test_planner_resumed_request_takes_its_new_block_table_and_load() -> None:
    prompt = list(range(200))
    p = vp.Planner(32, 16)
    p.track("r", prompt, 0, True)
    p.build(_out([_new("r", prompt, [1, 2, 3, 4, 5, 6, 7], 0)], sched={"r": 200}))
    # preempted, then resumed with a load of 192 tokens into other blocks
    p.after_alloc("r", 192)
    cached = NS(req_ids=["r"], resumed_req_ids={"r"}, new_block_ids=[([9, 8, 7, 6, 5, 4, 3],)],
                num_computed_tokens=[192])
    plan = p.build(_out(cached=cached, sched={"r": 9}))
    assert len(plan.loads) == 1 and plan.loads[0].block_ids == [9, 8, 7, 6, 5, 4, 3]
    assert plan.saves == []  # stored once already


def test_planner_ignores_untracked_and_unaligned() -> None:
    p = vp.Planner(32, 16)
    p.track("u", [1, 2, 3], 0, False)  # unusable (e.g. multimodal)
    assert not p.tracked("u")
    assert p.matched("u", 0, lambda t, s: 100) == 0
    p.after_alloc("u", 32)
    assert p.build(_out([_new("u", [1, 2, 3], [1], 32)], sched={"u": 1})).loads == []
    # a load whose end is not block-aligned (never asked by this connector) is dropped
    prompt = list(range(100))
    p.track("x", prompt, 0, True)
    p.after_alloc("x", 40)
    plan = p.build(_out([_new("x", prompt, [1, 2, 3, 4], 40)], sched={"x": 60}))
    assert plan.loads == []
    with pytest.raises(ValueError):
        vp.Planner(32, 24)


def test_model_id_and_cache_check() -> None:
    mid = vp.model_id_for("/m/smol", "ab" * 32, "f32", 30, 3, 64, "cpu")
    assert mid == f"vllm:/m/smol;sha256:{'ab' * 32};engine=vllm-cpu;kv=f32;geom=30x3x64"
    assert vp.model_id_for("org/name", None, "bf16", 2, 1, 8, "cpu").startswith("vllm:org/name;engine")
    info = NS(model_id=mid, layers=30, kv_heads=3, head_dim=64, dtype="f32", block_size=16)
    kw = dict(model_id=mid, layers=30, kv_heads=3, head_dim=64, kv_dtype="f32", vllm_block=32)
    assert vp.check_cache(info, **kw) is None
    assert "model_id" in (vp.check_cache(info, **{**kw, "model_id": "other"}) or "")
    assert "geometry" in (vp.check_cache(info, **{**kw, "kv_dtype": "bf16"}) or "")
    assert "divide" in (vp.check_cache(info, **{**kw, "vllm_block": 40}) or "")
    with pytest.raises(ValueError):
        vp.kv_dtype_name("torch.float8_e4m3fn")
    assert vp.kv_dtype_name("torch.bfloat16") == "bf16"


def test_digest_files_covers_names_and_contents(tmp_path: Any) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.safetensors"
    a.write_bytes(b"{}")
    b.write_bytes(b"x" * 10)
    d1 = vp.digest_files([str(a), str(b)])
    assert d1 == vp.digest_files([str(b), str(a)])
    b.write_bytes(b"y" * 10)
    assert vp.digest_files([str(a), str(b)]) != d1

"""pagedkv.transformers.PagedCache: a transformers Cache kept in pagedkv blocks.

Two groups. The tiny-model tests use a 2-layer Llama with random weights (no
download but torch): layout, refusals, multi-turn storing. The real-model tests
load SmolLM2-135M-Instruct from the GGUF that scripts/get-model.sh fetches
(offline): greedy generate() with PagedCache is token-identical to the default
DynamicCache on chat prompts, a second process on the same cache directory
reuses the prefixes (TTFT cold vs warm printed; run with -s to see), another
model_id attaches nothing. Every test is marked heavy (needs torch).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion bar
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-env.sh installs it)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (scripts/python-env.sh installs it)")

import pagedkv  # noqa: E402
from pagedkv import transformers as pkt  # noqa: E402

import hf_worker  # noqa: E402

pytestmark = pytest.mark.heavy

# ---- a tiny random Llama: fast checks of layout and refusals -----------------

BS = 4  # block size of the tiny caches: prompts span several blocks


@pytest.fixture(scope="module")
def tiny() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, eos_token_id=None, bos_token_id=None,
                      pad_token_id=0, initializer_range=0.5)  # sharp attention: K matters
    model = LlamaForCausalLM(cfg).eval()
    return model


def tiny_store(path: Path, model: Any, model_id: str = "tiny", dtype: str = "f32",
               **kw: Any) -> pagedkv.Cache:
    return pkt.open_store(path, model.config, model_id, capacity=64, kv_dtype=dtype,
                          block_size=BS, **kw)


def tiny_prompt(n: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(x) for x in torch.randint(1, 96, (n,), generator=g)]


def dyn_generate(model: Any, ids: list[int], n: int = 8) -> list[int]:
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                             do_sample=False)
    return out[0].tolist()


def test_tiny_paged_matches_dynamic_and_stores_exact_kv(tiny: Any, tmp_path: Path) -> None:
    prompt = tiny_prompt(19)
    ref = dyn_generate(tiny, prompt)
    with tiny_store(tmp_path / "c", tiny) as store:
        with torch.no_grad():
            cold = pkt.generate(tiny, store, prompt, max_new_tokens=8, do_sample=False)
        assert cold.sequences[0].tolist() == ref
        assert cold.n_cached == 0
        assert cold.n_stored == len(ref) - 1  # the last token's K/V is never computed
        # The stored K/V is the K/V a plain forward pass computes for the prompt.
        with torch.no_grad():
            dc = tiny(torch.tensor([prompt]), use_cache=True).cache
        seq = store.open(7, prompt)
        assert seq.n_cached == 16  # (19 - 1) // 4 * 4: whole blocks, last token left out
        for j, b in enumerate(seq.blocks()[:4]):
            blk = torch.from_numpy(np.frombuffer(store.block(b), dtype=np.float32).copy()).view(2, 2, 2, BS, 16)
            for layer in range(2):
                for kind, want in ((0, dc.layers[layer].keys), (1, dc.layers[layer].values)):
                    got = blk[layer, kind]                      # [head][token][dim]
                    exp = want[0, :, j * BS:(j + 1) * BS, :]
                    assert torch.allclose(got, exp, atol=1e-5), (j, layer, kind)
        seq.close()
        # What a PagedCache presents to the model is that K/V, in the model's layout.
        with pkt.PagedCache(store, prompt, config=tiny.config) as pc:
            assert pc.n_cached == 16 and pc.get_seq_length() == 16
            for layer in range(2):
                assert torch.equal(pc.layers[layer].keys, dc.layers[layer].keys[:, :, :16])
                assert torch.equal(pc.layers[layer].values, dc.layers[layer].values[:, :, :16])
        with torch.no_grad():
            warm = pkt.generate(tiny, store, prompt, max_new_tokens=8, do_sample=False)
        assert warm.n_cached == 16
        assert warm.sequences[0].tolist() == ref


def test_tiny_store_refuses_other_ids(tiny: Any, tmp_path: Path) -> None:
    prompt = tiny_prompt(13)
    with tiny_store(tmp_path / "c", tiny) as store:
        pc = pkt.PagedCache(store, prompt, config=tiny.config)
        t = torch.tensor([prompt])
        with torch.no_grad():
            out = tiny.generate(t, attention_mask=torch.ones_like(t), cache=pc,
                                max_new_tokens=4, do_sample=False)
        other = out.clone()
        other[0, 3] = (other[0, 3] + 1) % 96
        with pytest.raises(ValueError, match="refusing"):
            pc.store(other)
        with pytest.raises(ValueError, match="whole output"):
            pc.store(out[:, :5])
        assert pc.sequence.info().len == 0 and pc.n_stored == 0
        pc.close()
        assert store.lookup(prompt + [1]) == 0  # nothing was committed
        assert store.stats().seals == 0


def test_tiny_multi_turn_stores_generated_tokens(tiny: Any, tmp_path: Path) -> None:
    prompt = tiny_prompt(10, seed=3)
    with tiny_store(tmp_path / "c", tiny) as store:
        with pkt.PagedCache(store, prompt, config=tiny.config) as pc:
            t = torch.tensor([prompt])
            with torch.no_grad():
                out = tiny.generate(t, attention_mask=torch.ones_like(t), cache=pc,
                                    max_new_tokens=6, do_sample=False)
            assert pc.store(out) == len(prompt) + 6 - 1
            turn2 = torch.cat([out, torch.tensor([[5, 6, 7]])], dim=1)
            with torch.no_grad():
                out2 = tiny.generate(turn2, attention_mask=torch.ones_like(turn2), cache=pc,
                                     max_new_tokens=5, do_sample=False)
            assert pc.store(out2) == 1 + 3 + 5 - 1
            assert pc.store(out2) == 0  # idempotent
        # The second turn, from scratch, equals the incremental run and reuses turn 1.
        ids2 = turn2[0].tolist()
        assert dyn_generate(tiny, ids2, 5) == out2[0].tolist()
        with torch.no_grad():
            r = pkt.generate(tiny, store, ids2, max_new_tokens=5, do_sample=False)
        assert r.n_cached == (len(ids2) - 1) // BS * BS > len(prompt)
        assert r.sequences[0].tolist() == out2[0].tolist()


def test_tiny_refusals(tiny: Any, tmp_path: Path) -> None:
    prompt = tiny_prompt(9)
    with tiny_store(tmp_path / "f16", tiny, dtype="f16") as store:
        pc = pkt.PagedCache(store, prompt, config=tiny.config)
        t = torch.tensor([prompt])
        with pytest.raises(TypeError, match="model's dtype"), torch.no_grad():
            tiny.generate(t, attention_mask=torch.ones_like(t), cache=pc, max_new_tokens=2)
        pc.close()
    with tiny_store(tmp_path / "c", tiny) as store:
        with pytest.raises(ValueError, match="batch size 1"):
            pkt.PagedCache(store, torch.tensor([prompt, prompt]), config=tiny.config)
        with pytest.raises(ValueError, match="empty"):
            pkt.PagedCache(store, [], config=tiny.config)
        bigger = type(tiny.config)(**{**tiny.config.to_dict(), "num_key_value_heads": 4})
        with pytest.raises(ValueError, match="kv_heads"):
            pkt.PagedCache(store, prompt, config=bigger)
        pc = pkt.PagedCache(store, prompt, config=tiny.config)
        with pytest.raises(NotImplementedError, match="beam"):
            pc.reorder_cache(torch.tensor([0]))
        with pytest.raises(NotImplementedError):
            pc.crop(-1)
        pc.close()
        pc.close()  # idempotent
        with pytest.raises(ValueError, match="closed"):
            pc.store(prompt)
    # A directory made for another model id is refused: nothing can attach.
    with pytest.raises(pagedkv.ModelError):
        tiny_store(tmp_path / "c", tiny, model_id="another-model")


def test_model_id_for_names_file_engine_and_dtype(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(1000))
    a = pkt.model_id_for(f)
    assert a.startswith("gguf-sha256:") and a.endswith(";engine=transformers;kv=f32")
    assert pkt.model_id_for(f, "f16") != a
    f.write_bytes(b"GGUF" + bytes(999) + b"\1")
    assert pkt.model_id_for(f) != a
    with pytest.raises(ValueError):
        pkt.model_id_for(f, "f64")


# ---- SmolLM2-135M-Instruct from the GGUF ------------------------------------


@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any, Path, str]:
    pytest.importorskip("gguf", reason="the gguf package is not installed (scripts/python-env.sh)")
    pytest.importorskip("accelerate", reason="accelerate is not installed (transformers needs it "
                        "to load a GGUF; scripts/python-env.sh)")
    path = hf_worker.model_path()
    if path is None:
        pytest.skip("the model is absent: run scripts/get-model.sh (or set PKV_MODEL)")
    tok, model = hf_worker.load(path)
    return tok, model, path, pkt.model_id_for(path)


def test_smollm2_paged_is_token_identical_and_reused_by_a_second_process(
        smol: tuple[Any, Any, Path, str], tmp_path: Path, record_property: Any) -> None:
    tok, model, path, model_id = smol
    prompts = [hf_worker.chat_ids(tok, p) for p in hf_worker.PROMPTS]
    hf_worker.greedy(model, hf_worker.chat_ids(tok, "Hi"), 2)  # warm up torch
    refs = [hf_worker.greedy(model, ids) for ids in prompts]
    d = tmp_path / "kv"
    with pkt.open_store(d, model.config, model_id, capacity=hf_worker.CAPACITY) as store:
        cold = [hf_worker.paged(model, store, ids) for ids in prompts]
    for ids, ref, c in zip(prompts, refs, cold):
        assert c["tokens"] == ref, tok.decode(ids)
        # all it consumed is in pagedkv: what it attached plus what it stored
        assert c["n_cached"] + c["n_stored"] == len(ids) + len(ref) - 1
    assert cold[0]["n_cached"] == 0
    # one follow-up turn (CI time): the long prompt, its reply as generated, a new question
    turns = [hf_worker.follow_up_ids(tok, prompts[2] + cold[2]["tokens"])]

    args = {"dir": str(d), "model": str(path), "model_id": model_id,
            "prompts": prompts, "turns": turns}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, hf_worker.__file__, json.dumps(args)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    warm = json.loads(p.stdout.strip().splitlines()[-1])

    for ids, ref, c, w in zip(prompts, refs, cold, warm["runs"]):
        assert w["tokens"] == ref  # identical to DynamicCache, from reused K/V
        # whole blocks of the prompt, at most len-1 tokens
        assert w["n_cached"] == (len(ids) - 1) // 16 * 16 > 0
        print(f"\nprompt {len(ids)} tokens: cold n_cached={c['n_cached']} TTFT "
              f"{c['ttft_s'] * 1e3:.0f} ms ({c['ttft_cpu_s'] * 1e3:.0f} ms CPU), second "
              f"process n_cached={w['n_cached']} TTFT {w['ttft_s'] * 1e3:.0f} ms "
              f"({w['ttft_cpu_s'] * 1e3:.0f} ms CPU)")
    for ids, c, t in zip(prompts[2:], cold[2:], warm["turns"]):
        stored = len(ids) + len(c["tokens"]) - 1  # prompt + reply as fed back
        assert t["n_cached"] == stored // 16 * 16  # the reply's whole blocks were reused
        if len(c["tokens"]) == hf_worker.MAX_NEW:  # no early end: the reply fills a block
            assert t["n_cached"] > (len(ids) - 1) // 16 * 16
        print(f"follow-up turn {t['n_prompt']} tokens: n_cached={t['n_cached']} "
              f"TTFT {t['ttft_s'] * 1e3:.0f} ms ({t['ttft_cpu_s'] * 1e3:.0f} ms CPU)")
    assert warm["stats"]["verify_failures"] == 0
    record_property("ttft_cold_ms", [round(c["ttft_s"] * 1e3) for c in cold])
    record_property("ttft_warm_ms", [round(w["ttft_s"] * 1e3) for w in warm["runs"]])
    record_property("n_cached_warm", [w["n_cached"] for w in warm["runs"]])
    print(f"second process: model load {warm['load_s']:.1f} s, hit tokens "
          f"{warm['stats']['hit_tokens']}")


def test_smollm2_other_model_id_attaches_nothing(smol: tuple[Any, Any, Path, str],
                                                  tmp_path: Path) -> None:
    tok, model, path, model_id = smol
    ids = hf_worker.chat_ids(tok, hf_worker.PROMPTS[0])
    d = tmp_path / "kv"
    with pkt.open_store(d, model.config, model_id, capacity=8) as store:
        with torch.no_grad():
            r = pkt.generate(model, store, ids, max_new_tokens=2, do_sample=False)
        assert r.n_stored > 16 and store.lookup(ids) > 0
    other = pkt.model_id_for(path, "f16")  # same file, other K/V dtype: another identity
    with pytest.raises(pagedkv.ModelError):
        pkt.open_store(d, model.config, other, capacity=8, kv_dtype="f16")
    with pytest.raises(pagedkv.ModelError):
        pkt.open_store(d, model.config, "gguf-sha256:" + "0" * 64 + ";engine=transformers;kv=f32",
                       capacity=8)
    # Under its own identity (its own directory) the same prompt attaches nothing.
    with pkt.open_store(tmp_path / "kv2", model.config, other, capacity=8,
                        kv_dtype="f16") as store:
        assert store.lookup(ids) == 0
    with pkt.open_store(d, model.config, model_id, capacity=8) as store:
        assert store.lookup(ids) == (len(ids) - 1) // 16 * 16  # the right id still reuses

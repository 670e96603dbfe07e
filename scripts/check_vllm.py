"""The Python half of scripts/check-vllm.sh (the opt-in vLLM check, docs/python.md):
converts SmolLM2-135M from the GGUF to a safetensors directory vLLM loads, prints
the pkvd options for it, and runs one vLLM engine (with or without
pagedkv.vllm.PagedKVConnector) on one prompt, writing what it saw as JSON.

    check_vllm.py convert GGUF OUT_DIR
    check_vllm.py pkvd-args MODEL_DIR CAPACITY
    check_vllm.py damage CACHE_DIR KVDUMP PROMPT_IDS_JSON BLOCK_INDEX
    check_vllm.py run MODEL_DIR OUT_JSON PROMPT_IDS_JSON... [--socket S] [--model-id X]
                  [--on-mismatch disable] [--hold] [--no-prefix-caching]
                  [--batched-tokens N] [--connector CLASS:MODULE]

`run --hold` prints STORED after its generation and then sleeps, so the shell
can SIGKILL it (and its EngineCore) once the prompt's K/V is in pkvd.
A prompt file given twice is generated twice (results "p1", "p1@2");
--no-prefix-caching turns vLLM's own prefix cache off so that the second one
goes to the connector again; --batched-tokens N turns on chunked prefill with
a budget of N tokens per step; --connector names another connector class (the
check's fault-injecting subclass in check_vllm_hooks.py). Each result carries
the request's time to first token (vLLM's RequestStateStats.first_token_latency,
from the request's arrival in the front end), measured after a warm-up request
of 3 tokens (too short to be stored) so that no prompt pays for a first step.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

ENGINE_KW: dict[str, Any] = dict(enforce_eager=True, dtype="float32", max_model_len=1024,
                                 block_size=32, seed=0, disable_log_stats=False,
                                 max_num_seqs=4)
MAX_TOKENS = 32


def convert(gguf: str, out: str) -> None:
    """transformers dequantizes the GGUF to float32; save it as safetensors with
    a config.json vLLM accepts (no quantization_config; tied embeddings kept)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # save_pretrained refuses a model loaded from a GGUF ("quantized"): write the
    # dequantized weights and the config ourselves.
    from safetensors.torch import save_file

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    cfg["architectures"] = ["LlamaForCausalLM"]
    if not cfg.get("tie_word_embeddings", False):
        raise SystemExit("convert: expected tied embeddings (SmolLM2)")
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()
          if k != "lm_head.weight"}  # tied to model.embed_tokens.weight
    save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    tok.save_pretrained(tmp)
    os.rename(tmp, out)


def _engine_config(model: str, socket: str | None) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(ENGINE_KW)
    if socket:
        kw["kv_transfer_config"] = _ktc(socket, None, "error")
    return EngineArgs(model=model, **kw).create_engine_config()


def _ktc(socket: str, model_id: str | None, on_mismatch: str,
         connector: str = "PagedKVConnector:pagedkv.vllm") -> dict[str, Any]:
    extra: dict[str, Any] = {"socket": socket, "on_mismatch": on_mismatch}
    if model_id:
        extra["model_id"] = model_id
    cls, _, module = connector.partition(":")
    return {"kv_connector": cls, "kv_connector_module_path": module,
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra}


def pkvd_args(model: str, capacity: int) -> None:
    from vllm.config import KVTransferConfig  # noqa: F401  (vllm importable)

    from pagedkv.vllm import pkvd_args as args_of

    cfg = _engine_config(model, None)
    print(" ".join(args_of(cfg, capacity)))


def _metric(llm: Any, name: str) -> float | None:
    try:
        for m in llm.get_metrics():
            if m.name == name:
                return float(getattr(m, "value", 0))
    except Exception:  # metrics are extra information only
        return None
    return None


def _ttft(res: Any) -> float | None:
    m = getattr(res, "metrics", None)
    v = getattr(m, "first_token_latency", None)
    return round(float(v), 3) if v else None


def run(model: str, prompt_files: list[str], out: str, socket: str | None,
        model_id: str | None, on_mismatch: str, hold: bool, prefix_caching: bool = True,
        batched_tokens: int | None = None,
        connector: str = "PagedKVConnector:pagedkv.vllm") -> None:
    """One engine; the prompts one after the other (each its own generate)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(ENGINE_KW)
    if socket:
        kw["kv_transfer_config"] = _ktc(socket, model_id, on_mismatch, connector)
    if not prefix_caching:
        kw["enable_prefix_caching"] = False
    if batched_tokens:
        kw["enable_chunked_prefill"] = True
        kw["max_num_batched_tokens"] = batched_tokens
    t0 = time.monotonic()
    llm = LLM(model=model, **kw)
    result: dict[str, Any] = {"engine_start_s": round(time.monotonic() - t0, 2)}
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])],
                 SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)  # warm-up
    for pf in prompt_files:
        with open(pf) as fh:
            ids = json.load(fh)
        t1 = time.monotonic()
        res = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        name = os.path.splitext(os.path.basename(pf))[0]
        while name in result:
            name = name.split("@")[0] + "@" + str(int((name.split("@") + ["1"])[1]) + 1)
        result[name] = {
            "prompt_tokens": len(ids),
            "tokens": list(res.outputs[0].token_ids),
            "num_cached_tokens": res.num_cached_tokens,
            "ttft_s": _ttft(res),
            "generate_s": round(time.monotonic() - t1, 3),
        }
        print(json.dumps({name: {k: v for k, v in result[name].items() if k != "tokens"}}),
              flush=True)
    result["external_prefix_cache_hits"] = _metric(llm, "vllm:external_prefix_cache_hits")
    result["external_prefix_cache_queries"] = _metric(llm, "vllm:external_prefix_cache_queries")
    with open(out, "w") as fh:
        json.dump(result, fh)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}), flush=True)
    if hold:
        print("STORED", flush=True)
        time.sleep(3600)
    os._exit(0)  # skip vLLM's slow teardown; the connector's socket closes with us


def damage(cache_dir: str, kvdump: str, prompt_file: str, index: int) -> None:
    """Overwrite the payload of the sealed block that holds prompt tokens
    [index * B, (index + 1) * B) (salt 0) in the arena file of a cache whose
    daemon is stopped, found with kvdump (the block at depth index + 1 whose
    token ids are those); then check that kvdump sees its checksum fail."""
    import subprocess

    def kd(*args: str) -> Any:
        out = subprocess.run([kvdump, args[0], cache_dir, *args[1:], "--json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    with open(prompt_file) as fh:
        ids = json.load(fh)
    geo = kd("summary")["geometry"]
    bs, slot, nbytes = geo["block_size"], geo["slot_bytes"], geo["block_bytes"]
    want = ids[index * bs:(index + 1) * bs]
    found = [b["block"] for b in kd("blocks")["blocks"]
             if b["kind"] == "sealed" and b["depth"] == index + 1 and b["salt"] == 0
             and kd("block", str(b["block"]))["tokens"] == want]
    if len(found) != 1:
        raise SystemExit(f"damage: {len(found)} blocks hold tokens {index * bs}.. of the prompt")
    blk = found[0]
    off = 4096 + blk * slot  # docs/format.md, "Arena file"
    arena = os.path.realpath(os.path.join(cache_dir, "arena"))
    with open(arena, "r+b") as fh:  # every K and V value of the block becomes 3.0
        fh.seek(off)
        fh.write(bytes.fromhex("00004040") * (nbytes // 4))
    after = kd("block", str(blk))
    if after["payload_ok"]:
        raise SystemExit(f"damage: block {blk} still passes its checksum")
    print(f"block {blk} (prompt tokens {index * bs}..{(index + 1) * bs - 1}) at arena offset "
          f"{off}: {nbytes} payload bytes overwritten; kvdump: sealed sum "
          f"{after['payload_sum']}, payload now {after['payload_sum_actual']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("gguf")
    c.add_argument("out")
    p = sub.add_parser("pkvd-args")
    p.add_argument("model")
    p.add_argument("capacity", type=int)
    d = sub.add_parser("damage")
    d.add_argument("cache_dir")
    d.add_argument("kvdump")
    d.add_argument("prompt")
    d.add_argument("index", type=int)
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("out")
    r.add_argument("prompts", nargs="+")
    r.add_argument("--socket")
    r.add_argument("--model-id")
    r.add_argument("--on-mismatch", default="error")
    r.add_argument("--hold", action="store_true")
    r.add_argument("--no-prefix-caching", action="store_true")
    r.add_argument("--batched-tokens", type=int)
    r.add_argument("--connector", default="PagedKVConnector:pagedkv.vllm")
    a = ap.parse_args()
    if a.cmd == "convert":
        convert(a.gguf, a.out)
    elif a.cmd == "damage":
        damage(a.cache_dir, a.kvdump, a.prompt, a.index)
    elif a.cmd == "pkvd-args":
        pkvd_args(a.model, a.capacity)
    else:
        run(a.model, a.prompts, a.out, a.socket, a.model_id, a.on_mismatch, a.hold,
            not a.no_prefix_caching, a.batched_tokens, a.connector)


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of test_transformers.py: load SmolLM2-135M-Instruct with transformers
from the GGUF offline, build the chat prompts, run greedy generation with the
default DynamicCache and with pagedkv's PagedCache. Also a script: the test
runs it in a second process (`python hf_worker.py '<json>'`) on the cache
directory the first process filled, and reads one JSON line of results."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

MAX_NEW = 20       # generated tokens per prompt (CI time)
CAPACITY = 64      # blocks: ~47 MB of f32 K/V for this model, ample for the prompts

# Chat prompts (rendered with the model's chat template). The long one makes the
# prefill worth skipping; all share the template's system prompt (2 blocks).
PROMPTS: list[str] = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize in one sentence: A paged KV cache keeps the keys and values of "
    "each attention layer in fixed-size blocks, so sequences that start with the "
    "same tokens can share the blocks of their common prefix instead of "
    "recomputing them. Persisting those blocks to disk lets a restarted server "
    "skip the prefill of every prompt it has already seen, which cuts the time "
    "to the first token for long system prompts, few-shot examples and "
    "multi-turn conversations.",
]
FOLLOW_UP = "\n<|im_start|>user\nAnd in French?<|im_end|>\n<|im_start|>assistant\n"


def model_path() -> Path | None:
    """The GGUF scripts/get-model.sh fetches (PKV_MODEL, else its default
    place), or None when it is absent."""
    env = os.environ.get("PKV_MODEL")
    if env:
        return Path(env) if Path(env).is_file() else None
    cache = os.environ.get("PKV_MODEL_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "pagedkv", "models"))
    p = Path(cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


def load(path: Path) -> tuple[Any, Any]:
    """(tokenizer, model) from the GGUF, float32, eval mode, CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    model.eval()
    return tok, model


def chat_ids(tok: Any, text: str) -> list[int]:
    """The chat template's token ids for one user message, ready for the reply."""
    ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                  add_generation_prompt=True)
    if hasattr(ids, "keys"):  # a BatchEncoding in recent transformers
        ids = ids["input_ids"]
    return [int(x) for x in ids]


def follow_up_ids(tok: Any, first_turn: list[int]) -> list[int]:
    """A second turn appended to a first turn's token ids (the prompt plus the
    reply as generated, no re-tokenization), so its prefix is what was stored."""
    return first_turn + [int(x) for x in tok(FOLLOW_UP, add_special_tokens=False)["input_ids"]]


def greedy(model: Any, ids: list[int], n: int = MAX_NEW) -> list[int]:
    """Greedy continuation (n tokens at most) with the default cache (DynamicCache)."""
    import torch

    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                             do_sample=False)
    return [int(x) for x in out[0, len(ids):].tolist()]


def paged(model: Any, store: Any, ids: list[int]) -> dict[str, Any]:
    """Greedy continuation through pagedkv.transformers.generate."""
    import torch
    from pagedkv import transformers as pkt

    with torch.no_grad():
        r = pkt.generate(model, store, ids, max_new_tokens=MAX_NEW, do_sample=False)
    return {"tokens": [int(x) for x in r.sequences[0, len(ids):].tolist()],
            "n_prompt": len(ids), "n_cached": r.n_cached, "n_stored": r.n_stored,
            "ttft_s": r.ttft_s, "ttft_cpu_s": r.ttft_cpu_s, "total_s": r.total_s}


def second_process(args: dict[str, Any]) -> dict[str, Any]:
    """What the second process does: open the cache directory, run the prompts
    (and one follow-up turn per prompt, given as ids), report per prompt."""
    from pagedkv import transformers as pkt

    t0 = time.perf_counter()
    tok, model = load(Path(args["model"]))
    load_s = time.perf_counter() - t0
    greedy(model, chat_ids(tok, "Hi"), 2)  # warm up torch as the first process did
    out: dict[str, Any] = {"load_s": load_s, "runs": [], "turns": []}
    with pkt.open_store(args["dir"], model.config, args["model_id"],
                        capacity=CAPACITY) as store:
        for ids in args["prompts"]:
            out["runs"].append(paged(model, store, ids))
        for ids in args["turns"]:
            out["turns"].append(paged(model, store, ids))
        st = store.stats()
        out["stats"] = {"hit_tokens": st.hit_tokens, "verify_failures": st.verify_failures}
    return out


if __name__ == "__main__":
    print(json.dumps(second_process(json.loads(sys.argv[1]))))

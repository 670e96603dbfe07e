#!/usr/bin/env python3
"""Write tests/data/smollm2-fixture.json: reference outputs for SmolLM2-135M-Instruct
(the Q4_1 GGUF scripts/get-model.sh fetches), from independent implementations,
for the C tokenizer, GGUF reader and model tests (docs/model.md).

  - token ids of varied texts (tokenizer: Hugging Face `tokenizers` as loaded by
    `transformers` from the same GGUF, see PRE-TOKENIZER below);
  - the chat template rendered by transformers (jinja) and its ids;
  - for a few prompts (one >= 1,500 tokens): the greedy continuation of 32 tokens
    and the top-20 logits of the first generated position (transformers, f32);
  - the first values of a few rows of a few tensors, dequantized by the `gguf`
    package (gguf-py, ggml's own Python reader).

PRE-TOKENIZER. SmolLM2's own tokenizer (tokenizer.ggml.pre = "smollm"; llama.cpp
implements it as \\p{N} split off first, then the GPT-2 regex) splits every digit
off before the byte-level regex. transformers' GGUF converter builds a plain
ByteLevel pre-tokenizer without that step, so for text where whitespace precedes a
digit ("a  1") it tokenizes differently from the trained tokenizer. This script
puts the Digits(individual_digits) step back before computing the ids, and for
each text where the unmodified converter disagrees records its ids too
("ids_transformers_gguf"), so the difference is visible in the fixture.

A development tool, not a CI dependency. Run it in a venv:
  python3 -m venv ~/.cache/pagedkv/devvenv
  ~/.cache/pagedkv/devvenv/bin/pip install torch transformers gguf accelerate
  ~/.cache/pagedkv/devvenv/bin/python scripts/make-model-fixture.py [GGUF]
GGUF defaults to the path scripts/get-model.sh prints.
"""
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys

import gguf
import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "smollm2-fixture.json")

TEXTS = [
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple   spaces   between   words",
    "tabs\tand\ttabs\t\t",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "   \n  \n",
    "",
    " ",
    "a",
    "12345678",
    "The year 2024 had 366 days; 1,000,000.50 dollars.",
    "a  1",
    "x   2024 and y 7",
    "Phone: +1 (555) 012-3456",
    "3.14159265358979",
    "it's, don't, we're, they've, I'm, you'll, he'd",
    "IT'S DON'T WE'RE",
    "'s 't 're 've 'm 'll 'd",
    "rock 'n' roll",
    "café résumé naïve façade",
    "Zürich, Köln, Besançon, São Paulo",
    "Ελληνικά και Русский язык",
    "日本語のテキストです。",
    "中文文本，包括标点符号。",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "עברית",
    "हिन्दी पाठ",
    "emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦",
    "flags 🇫🇷🇯🇵 and ❤️",
    "math: ∑ᵢ xᵢ² ≤ ∞, α+β=γ, ½ ¾ Ⅻ",
    "superscripts x² y³ and circled ① ②",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) { a[i] += b[i] * c; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"x\">Hello &amp; goodbye</div>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.org",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "!!! ??? ... --- ***",
    "$100 €50 £20 ¥1000",
    "C:\\Users\\name\\file.txt",
    "a\u00a0non-breaking\u2003em space\u3000ideographic",
    "zero\u200bwidth\u200djoiner",
    "mixed 中文 and English 123 together",
    "The quick brown fox jumps over the lazy dog.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "                                                ",
    "\r\nWindows\r\nline endings\r\n",
    "<|im_start|>user\nHello<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <repo_name> tokens",
    "<|im_start|><|im_end|><|im_start|>",
    "not special: <|im_start and im_end|>",
    "Ünïcödé ÀÉÎÕÜ àéîõü",
    "ﬁ ligature and full-width ＡＢＣ１２３",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "Answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"},
     {"role": "assistant", "content": "Because air scatters blue light more than red."},
     {"role": "user", "content": "And sunsets?"}],
]

# (tensor, rows) whose first 8 dequantized values are recorded.
WEIGHTS = [
    ("token_embd.weight", [0, 1, 2, 1000, 49151]),
    ("blk.0.attn_q.weight", [0, 1, 575]),
    ("blk.0.attn_k.weight", [0, 191]),
    ("blk.0.ffn_down.weight", [0, 575]),
    ("blk.29.ffn_up.weight", [1535]),
    ("blk.0.attn_norm.weight", [0]),
    ("output_norm.weight", [0]),
]


def gguf_path():
    if len(sys.argv) > 1:
        return sys.argv[1]
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-model.sh")], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def smollm_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def long_system_prompt():
    # Real text: the first part of pagedkv's design document.
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        return f.read()[:7000]


def prompts(tok):
    def chat(msgs):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return [
        ("chat-capital", chat(CHATS[0])),
        ("chat-python", chat(CHATS[1])),
        ("plain-fox", "The quick brown fox jumps over the lazy dog. The quick brown"),
        ("chat-long-design", chat([
            {"role": "system", "content": "You answer questions about this document.\n\n"
             + long_system_prompt()},
            {"role": "user", "content": "In two sentences, what does pagedkv do?"}])),
    ]


def weights(path):
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    out = []
    for name, rows in WEIGHTS:
        t = by_name[name]
        full = gguf.quants.dequantize(t.data, t.tensor_type)
        full = np.asarray(full, dtype=np.float32).reshape(-1, int(t.shape[0]))
        for row in rows:
            out.append({"tensor": name, "type": t.tensor_type.name, "row": row,
                        "values": [float(v) for v in full[row, :8]]})
    return out


def main():
    path = gguf_path()
    d, name = os.path.split(path)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    torch.set_num_threads(2)
    torch.manual_seed(0)

    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    plain = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    converter_pre = str(tok.backend_tokenizer.pre_tokenizer)
    tok.backend_tokenizer.pre_tokenizer = smollm_pre_tokenizer()

    chats = []
    for msgs in CHATS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        chats.append({"messages": msgs, "add_generation_prompt": True, "text": text})
    texts = []
    for t, ids_conv in zip(TEXTS + [c["text"] for c in chats], plain + [None] * len(chats)):
        ids = tok.encode(t, add_special_tokens=False)
        if ids_conv is None:
            ids_conv = tok.encode(t, add_special_tokens=False)  # same for these
        e = {"text": t, "ids": ids, "decoded_ok": tok.decode(ids) == t}
        if ids_conv != ids:
            e["ids_transformers_gguf"] = ids_conv
        texts.append(e)

    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    runs = []
    for pname, text in prompts(tok):
        ids = tok.encode(text, add_special_tokens=False)
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0, -1].float()
            top = torch.topk(logits, 20)
            gen = model.generate(x, max_new_tokens=32, do_sample=False, num_beams=1,
                                 pad_token_id=tok.pad_token_id or 2)
        cont = gen[0, len(ids):].tolist()
        runs.append({"name": pname, "text": text, "ids": ids, "n_tokens": len(ids),
                     "greedy": cont, "greedy_text": tok.decode(cont),
                     "top20_ids": top.indices.tolist(),
                     "top20_logits": [round(float(v), 6) for v in top.values]})
        print(f"{pname}: {len(ids)} tokens -> {tok.decode(cont)!r}", file=sys.stderr)

    fixture = {
        "model": {"file": name, "sha256": sha, "bytes": os.path.getsize(path)},
        "generated_by": "scripts/make-model-fixture.py",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": importlib.metadata.version("gguf"), "numpy": np.__version__},
        "tokenizer": {
            "pre_tokenizer_used": "Sequence[Digits(individual_digits=True), "
                                  "ByteLevel(add_prefix_space=False, use_regex=True)]",
            "pre_tokenizer_of_transformers_gguf_converter": converter_pre,
            "note": "ids use SmolLM2's pre-tokenizer (digits split off first); "
                    "ids_transformers_gguf, where present, is what transformers' GGUF "
                    "converter gives without that step",
            "bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id,
        },
        "texts": texts,
        "chats": chats,
        "prompts": runs,
        "logits_dtype": "float32 (model loaded with dtype=float32; weights dequantized by transformers)",
        "weights": weights(path),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes, {len(texts)} texts)", file=sys.stderr)


if __name__ == "__main__":
    main()

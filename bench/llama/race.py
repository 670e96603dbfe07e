#!/usr/bin/env python3
"""race.py -- pagedkv's model (src/model/, through bench/pkv-modelbench) against
llama.cpp (through llama-cpp-python's low-level bindings) on the same GGUF, the
same token ids and the same number of threads, in one run, alternating
(docs/benchmarks.md, "The real model against llama.cpp").

Measured, each in a new process per side and round (the side that goes first
alternates from round to round):
  speed  prefill tokens/s at each --prefill length (the first N tokens of the
         demo's system prompt, fresh K/V) and greedy decode tokens/s (--decode
         tokens after the first length). Only compute is timed: pkvm_prefill /
         pkvm_step on pagedkv's side, llama_decode on llama.cpp's (n_batch 512).
  ttft   time to first token of a new process answering a question after the
         system prompt (~2,400 tokens, ChatML): pagedkv warm (the cache
         directory a previous process left) and cold (emptied); llama.cpp warm
         (a new process loads the system prompt's state that a previous process
         saved with llama_state_seq_save_file) and cold. Each reports compute
         only (from the request to the first token) and since the process was
         started (what a user waits for: process start, model load, cache open
         or state load, compute). Round r asks question r of
         tools/demo/questions.txt; the previous process answered another one.

Run it with the Python of a virtual environment that has llama-cpp-python
(bench/llama/race.sh sets one up); it needs no other package.
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_ENV = None  # the environment of the llama.cpp processes (set in main)
ROOT = os.path.dirname(os.path.dirname(HERE))


# ---- llama.cpp side (runs in its own process: race.py _llama ...) ----------------

def llama_open(model, threads, n_ctx):
    import llama_cpp as L
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    load = getattr(L, "llama_model_load_from_file", None) or L.llama_load_model_from_file
    m = load(model.encode(), mp)
    if not m:
        raise SystemExit("llama.cpp could not load " + model)
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_threads = threads
    cp.n_threads_batch = threads
    new_ctx = getattr(L, "llama_init_from_model", None) or L.llama_new_context_with_model
    ctx = new_ctx(m, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    vocab = L.llama_model_get_vocab(m)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    return L, m, ctx, n_vocab


def llama_clear(L, ctx):
    if hasattr(L, "llama_memory_clear"):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
    elif hasattr(L, "llama_kv_self_clear"):
        L.llama_kv_self_clear(ctx)
    else:
        L.llama_kv_cache_clear(ctx)


def llama_eval(L, ctx, batch, ids, pos0):
    """Decode ids at positions pos0.. in chunks of 512 (n_batch); logits of the last."""
    for s in range(0, len(ids), 512):
        chunk = ids[s:s + 512]
        batch.n_tokens = len(chunk)
        for i, t in enumerate(chunk):
            batch.token[i] = t
            batch.pos[i] = pos0 + s + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if s + i == len(ids) - 1 else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit("llama_decode returned %d" % rc)


def argmax_last(L, ctx, n_vocab):
    import numpy as np  # a dependency of llama-cpp-python
    p = L.llama_get_logits_ith(ctx, -1)
    return int(np.ctypeslib.as_array(p, shape=(n_vocab,)).argmax())


def llama_main(a):
    t_start = time.monotonic()
    ids = json.load(open(a.ids))
    sys_ids, q_ids = ids["system"], ids["question"]
    L, m, ctx, n_vocab = llama_open(a.model, a.threads, 4096)
    t_loaded = time.monotonic()
    batch = L.llama_batch_init(512, 0, 1)
    out = {"impl": "llama.cpp", "threads": a.threads}
    if a.cmd == "speed":
        for k, n in enumerate(a.prefill):
            llama_clear(L, ctx)
            t0 = time.monotonic()
            llama_eval(L, ctx, batch, sys_ids[:n], 0)
            t = time.monotonic() - t0
            print(json.dumps(dict(out, what="prefill", tokens=n, seconds=t, tok_s=n / t)),
                  flush=True)
            if k == 0 and a.decode:
                tok = argmax_last(L, ctx, n_vocab)
                toks, td = [], 0.0
                for j in range(a.decode):
                    toks.append(tok)
                    t0 = time.monotonic()
                    llama_eval(L, ctx, batch, [tok], n + j)
                    td += time.monotonic() - t0
                    tok = argmax_last(L, ctx, n_vocab)
                print(json.dumps(dict(out, what="decode", context=n, tokens=a.decode,
                                      seconds=td, tok_s=a.decode / td, ids=toks)), flush=True)
    elif a.cmd == "save":
        # A previous process: the system prompt, its state saved for the next one.
        llama_eval(L, ctx, batch, sys_ids, 0)
        arr = (L.llama_token * len(sys_ids))(*sys_ids)
        save = getattr(L, "llama_state_seq_save_file")
        n = save(ctx, a.state.encode(), 0, arr, len(sys_ids))
        if not n:
            raise SystemExit("llama_state_seq_save_file failed")
        print(json.dumps(dict(out, what="save", tokens=len(sys_ids), bytes=n)), flush=True)
    elif a.cmd in ("warm", "cold"):
        t0 = time.monotonic()
        if a.cmd == "warm":
            cap = len(sys_ids) + 16
            arr = (L.llama_token * cap)()
            n_out = ctypes.c_size_t(0)
            n = L.llama_state_seq_load_file(ctx, a.state.encode(), 0, arr, cap,
                                            ctypes.byref(n_out))
            if not n or list(arr[:n_out.value]) != sys_ids:
                raise SystemExit("llama_state_seq_load_file failed or holds other tokens")
            t_state = time.monotonic()
            llama_eval(L, ctx, batch, q_ids, len(sys_ids))
            reused = len(sys_ids)
        else:
            t_state = t0
            llama_eval(L, ctx, batch, sys_ids + q_ids, 0)
            reused = 0
        tok = argmax_last(L, ctx, n_vocab)
        t1, real = time.monotonic(), time.time()
        print(json.dumps(dict(out, mode=a.cmd, prompt_tokens=len(sys_ids) + len(q_ids),
                              reused=reused, load_s=t_loaded - t_start,
                              state_s=t_state - t0, compute_s=t1 - t_state,
                              request_s=t1 - t0, first_token_realtime=real,
                              first_token=tok)), flush=True)
    L.llama_batch_free(batch)


# ---- The race --------------------------------------------------------------------

def run_json(cmd, env=None):
    if cmd and cmd[0] == sys.executable:
        env = LLAMA_ENV
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit("failed: " + " ".join(cmd))
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def timed_spawn(cmd):
    """Run cmd, return its JSON and the time from before the spawn to its first token."""
    t0 = time.time()
    res = run_json(cmd)[-1]
    res["since_spawn_s"] = res["first_token_realtime"] - t0
    return res


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", nargs="?", default="race",
                    choices=["race", "_llama"], help=argparse.SUPPRESS)
    ap.add_argument("--model", default=os.environ.get("PKV_MODEL"))
    ap.add_argument("--modelbench", default=os.path.join(ROOT, "build-release", "bench",
                                                         "pkv-modelbench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--kernel", default="q8", help="pagedkv's kernel: q8 or exact")
    ap.add_argument("--json", help="write every measurement to this file")
    ap.add_argument("--skip", default="", help="comma list: speed, ttft")
    ap.add_argument("--omp-active", action="store_true",
                    help="leave llama.cpp's OpenMP wait policy at its default (spinning)")
    # Internal: the llama.cpp side in its own process.
    ap.add_argument("--llama-cmd", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.prefill = [int(x) for x in a.prefill.split(",")]
    if not a.model:
        raise SystemExit("race.py: no model: pass --model or set PKV_MODEL")
    if a.cmd == "_llama":
        a.cmd = a.llama_cmd
        llama_main(a)
        return

    import llama_cpp
    qfile = os.path.join(ROOT, "tools", "demo", "questions.txt")
    questions = [l.strip() for l in open(qfile) if l.strip() and not l.startswith("#")]
    if len(questions) < a.rounds + 1:
        raise SystemExit("race.py: need %d questions in %s" % (a.rounds + 1, qfile))
    mb = [a.modelbench, "--model", a.model, "--threads", str(a.threads), "--kernel", a.kernel]
    work = tempfile.mkdtemp(prefix="pkv-race-")
    results = {"machine": os.uname().nodename, "nproc": os.cpu_count(),
               "loadavg_start": os.getloadavg(), "llama_cpp_python": llama_cpp.__version__,
               "threads": a.threads, "kernel": a.kernel, "speed": [], "ttft": []}

    def ids_for(q):
        path = os.path.join(work, "ids-%d.json" % abs(hash(q)))
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump(run_json(mb + ["tokens", "--question", q])[0], f)
        return path

    llama_env = dict(os.environ)
    if not a.omp_active:
        # ggml's OpenMP workers spin while they wait by default; on a machine
        # whose cores other processes share that costs llama.cpp dearly, so it
        # runs with passive waiting here (its better case on a loaded machine).
        llama_env["OMP_WAIT_POLICY"] = "PASSIVE"
    results["llama_omp_wait_policy"] = llama_env.get("OMP_WAIT_POLICY", "default")
    global LLAMA_ENV
    LLAMA_ENV = llama_env

    def llama(cmd, q, state=None):
        c = [sys.executable, os.path.abspath(__file__), "_llama", "--llama-cmd", cmd,
             "--model", a.model, "--threads", str(a.threads), "--ids", ids_for(q),
             "--prefill", ",".join(map(str, a.prefill)), "--decode", str(a.decode)]
        if state:
            c += ["--state", state]
        return c

    skip = set(a.skip.split(",")) if a.skip else set()
    try:
        if "speed" not in skip:
            pre = ",".join(map(str, a.prefill))
            for r in range(a.rounds):
                sides = [("pagedkv", mb + ["speed", "--prefill", pre, "--decode", str(a.decode)]),
                         ("llama.cpp", llama("speed", questions[0]))]
                if r % 2:
                    sides.reverse()
                for name, cmd in sides:
                    for res in run_json(cmd):
                        res["round"] = r
                        results["speed"].append(res)
                        print("speed round %d %-9s %-7s %5s tokens %8.1f tok/s" %
                              (r, name, res["what"], res["tokens"], res["tok_s"]), flush=True)
        if "ttft" not in skip:
            cache = os.path.join(work, "cache")
            cold_cache = os.path.join(work, "cache-cold")
            state = os.path.join(work, "llama-system.state")
            prep_q = questions[-1]
            # The previous processes: each side computes the system prompt once and
            # keeps it (pagedkv's cache directory, llama.cpp's saved state).
            run_json(mb + ["ttft", "--cache-dir", cache, "--cold", "--question", prep_q])
            run_json(llama("save", prep_q, state))
            for r in range(a.rounds):
                q = questions[r]
                runs = [("pagedkv", "warm", mb + ["ttft", "--cache-dir", cache, "--question", q]),
                        ("llama.cpp", "warm", llama("warm", q, state)),
                        ("pagedkv", "cold", mb + ["ttft", "--cache-dir", cold_cache, "--cold",
                                                  "--question", q]),
                        ("llama.cpp", "cold", llama("cold", q))]
                if r % 2:
                    runs.reverse()
                for name, mode, cmd in runs:
                    res = timed_spawn(cmd)
                    res["round"] = r
                    res["question"] = q
                    results["ttft"].append(res)
                    print("ttft  round %d %-9s %s: %5d tokens, %5d reused, compute %7.3f s, "
                          "since process start %7.3f s, first token %d" %
                          (r, name, mode, res["prompt_tokens"], res["reused"],
                           res.get("request_s", res.get("compute_s")), res["since_spawn_s"],
                           res["first_token"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()

    # Medians, and the table docs/benchmarks.md shows.
    print("\n| measurement | pagedkv | llama.cpp | pagedkv / llama.cpp |")
    print("|---|---:|---:|---:|")
    for what, n in [("prefill", x) for x in a.prefill] + [("decode", None)]:
        pk = [s["tok_s"] for s in results["speed"] if s["impl"] == "pagedkv" and s["what"] == what
              and (n is None or s["tokens"] == n)]
        ll = [s["tok_s"] for s in results["speed"] if s["impl"] == "llama.cpp"
              and s["what"] == what and (n is None or s["tokens"] == n)]
        if pk and ll:
            label = "prefill %d tokens (tok/s)" % n if n else "decode %d tokens (tok/s)" % a.decode
            print("| %s | %.0f | %.0f | %.2fx |" % (label, med(pk), med(ll), med(pk) / med(ll)))
    pk = [t["open_s"] for t in results["ttft"] if t["impl"] == "pagedkv" and t["mode"] == "warm"]
    ll = [t["state_s"] for t in results["ttft"] if t["impl"] == "llama.cpp" and t["mode"] == "warm"]
    if pk and ll:
        print("| warm restore: pkv_open / llama_state_seq_load_file (ms) | %.0f | %.0f | %.2fx |" %
              (1e3 * med(pk), 1e3 * med(ll), med(pk) / med(ll)))
    pk = [t["load_s"] for t in results["ttft"] if t["impl"] == "pagedkv"]
    ll = [t["load_s"] for t in results["ttft"] if t["impl"] == "llama.cpp"]
    if pk and ll:
        print("| model load in the new process (ms) | %.0f | %.0f | %.2fx |" %
              (1e3 * med(pk), 1e3 * med(ll), med(pk) / med(ll)))
    for mode in ("warm", "cold"):
        for col, key in (("compute", None), ("since process start", "since_spawn_s")):
            pk = [t[key] if key else t["compute_s"] for t in results["ttft"]
                  if t["impl"] == "pagedkv" and t["mode"] == mode]
            ll = [t[key] if key else t["request_s"] for t in results["ttft"]
                  if t["impl"] == "llama.cpp" and t["mode"] == mode]
            if pk and ll:
                print("| TTFT %s, %s (ms) | %.0f | %.0f | %.2fx |" %
                      (mode, col, 1e3 * med(pk), 1e3 * med(ll), med(pk) / med(ll)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

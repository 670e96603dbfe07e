#!/usr/bin/env bash
# run.sh — pagedkv (pkv-trace), vLLM's BlockPool and SGLang's RadixCache on the
# same trace, same capacities, alternating, in one run; prints the medians.
#
# Owns: the comparison run. It builds pkv-trace (release) in $BUILD, runs
# setup.sh if the venv is missing, writes the trace with every output_length set
# to 0 (the prompts only: what the peers' replay feeds them, see replay.py), then
# for each round and each capacity runs pagedkv, vLLM, SGLang in turn. pagedkv
# runs in the library's fastest mode: durability NONE (pkv-trace's), no payload,
# log and arena on tmpfs (--dir and --arena-dir $SHM), arena prefaulted,
# checkpoints deferred past the replay. Its time is pkv-trace's replay time less
# the time pkv-trace spent generating token ids (the peers' replay makes them
# outside the timed region). ns/block is that time over the full 16-token block
# references of the prompts. Opt-in: big downloads, never run by CI.
#
#   bench/peers/run.sh [--rounds N] [--limit N] [--capacities "2097152 204800"]
#                      [--trace FILE] [--systems "pagedkv vllm sglang"] [--out FILE]
# --out FILE keeps every run's raw line (key=value pairs) besides the table.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${PKV_PEERS_VENV:-$HOME/.cache/pagedkv/peers-venv}
BUILD=${PKV_PEERS_BUILD:-$ROOT/build-release}
SHM=${PKV_PEERS_SHM:-/dev/shm}
TRACE=$ROOT/../shared/traces/mooncake_conversation_trace.jsonl
ROUNDS=3
LIMIT=0
CAPS="2097152 204800"
SYSTEMS="pagedkv vllm sglang"
OUTFILE=
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --capacities) CAPS=$2; shift 2 ;;
    --trace) TRACE=$2; shift 2 ;;
    --systems) SYSTEMS=$2; shift 2 ;;
    --out) OUTFILE=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -f "$TRACE" ] || { echo "run.sh: no trace at $TRACE (--trace FILE)" >&2; exit 2; }

if [ ! -x "$BUILD/bench/pkv-trace" ]; then
    [ -d "$BUILD" ] || meson setup "$BUILD" "$ROOT" --buildtype=release \
        -Dinternal_checks=false -Dtests=false -Dcuda=disabled
fi
ninja -C "$BUILD" bench/pkv-trace >/dev/null
PY=$VENV/bin/python
[ -x "$PY" ] && ls "$VENV"/.pkv-peers-* >/dev/null 2>&1 || "$HERE/setup.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pkv-peers-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ZT=$WORK/trace-prompts.jsonl
"$PY" - "$TRACE" "$ZT" <<'PYEOF'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as g:
    for line in f:
        if line.strip():
            o = json.loads(line)
            o["output_length"] = 0
            g.write(json.dumps(o) + "\n")
PYEOF
LIM=()
[ "$LIMIT" -gt 0 ] && LIM=(--limit "$LIMIT")
RES=$WORK/results.txt
: >"$RES"

run_pagedkv() { # capacity -> one key=value line
    local out
    out=$("$BUILD/bench/pkv-trace" --trace "$ZT" --capacities "$1" --no-sim \
        --dir "$SHM" --arena-dir "$SHM" --prefault --checkpoint-mib 1048576 "${LIM[@]}")
    "$PY" - "$1" <<PYEOF
import re, sys
out = """$out"""
rep = re.search(r"replay ([0-9.]+) s \(([0-9.]+) s of it generating", out)
hit = re.search(r"engine leaf-lru\s+([0-9.]+)%", out)
ck = re.search(r"([0-9]+) checkpoints", out)
print(f"system=pagedkv capacity={sys.argv[1]} timed_s={float(rep[1]) - float(rep[2]):.3f} "
      f"hit_pct={hit[1]} checkpoints={ck[1]}")
PYEOF
}

for round in $(seq 1 "$ROUNDS"); do
    for cap in $CAPS; do
        for s in $SYSTEMS; do
            if [ "$s" = pagedkv ]; then
                line=$(run_pagedkv "$cap")
            else
                line=$("$PY" "$HERE/replay.py" --system "$s" --trace "$ZT" --capacity "$cap" "${LIM[@]}")
            fi
            echo "round=$round $line" | tee -a "$RES"
        done
    done
done

[ -z "$OUTFILE" ] || cp "$RES" "$OUTFILE"
"$PY" - "$RES" "$ZT" "$LIMIT" <<'PYEOF'
import json, statistics, sys
rows = [dict(kv.split("=", 1) for kv in l.split()) for l in open(sys.argv[1]) if l.strip()]
limit = int(sys.argv[3])
blocks = 0
with open(sys.argv[2]) as f:
    for i, line in enumerate(f):
        if limit and i == limit:
            break
        blocks += json.loads(line)["input_length"] // 16
caps = list(dict.fromkeys(r["capacity"] for r in rows))
systems = list(dict.fromkeys(r["system"] for r in rows))
print(f"\n{blocks:,} full 16-token block references; medians of "
      f"{len({r['round'] for r in rows})} alternating rounds (ns per block; prompt-token hit rate)")
print("| system | " + " | ".join(f"{int(c):,} blocks" for c in caps) + " | hit rate (" +
      " / ".join(f"{int(c):,}" for c in caps) + ") |")
print("|---|" + "---:|" * len(caps) + "---|")
for s in systems:
    ns, hits = [], []
    for c in caps:
        rs = [r for r in rows if r["system"] == s and r["capacity"] == c]
        ns.append(statistics.median(float(r["timed_s"]) for r in rs) * 1e9 / blocks)
        hits.append(sorted({r["hit_pct"] for r in rs}))
    print(f"| {s} | " + " | ".join(f"{v:,.0f}" for v in ns) + " | " +
          " / ".join(",".join(f"{float(h):.2f}%" for h in hs) for hs in hits) + " |")
PYEOF

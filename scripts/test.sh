#!/usr/bin/env bash
# Build and run every test: gcc (warnings are errors), clang (warnings are errors),
# and an ASan+UBSan build. Usage: scripts/test.sh [--quick]  (--quick: gcc only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
quick=0
[ "${1:-}" = "--quick" ] && quick=1

run_suite() { # name, setup args..., -- test args...
  local dir=$1; shift
  local setup=() testargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do setup+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  testargs=("$@")
  echo "=== $dir: meson setup ${setup[*]}"
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "${setup[@]}" >/dev/null
  else
    meson setup "$dir" "${setup[@]}" >/dev/null
  fi
  ninja -C "$dir"
  meson test -C "$dir" --print-errorlogs --num-processes 2 "${testargs[@]}"
}

run_suite build-gcc -Dwerror=true
if [ $quick -eq 0 ]; then
  # The CUDA layer (compiled by nvcc when present) is built in the gcc pass; the
  # clang and sanitizer passes cover the C code only.
  CC=clang run_suite build-clang -Dwerror=true -Dcuda=disabled
  run_suite build-asan -Dwerror=true -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false \
    -- --setup=sanitize
fi
echo "all test suites passed"

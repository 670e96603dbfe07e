#!/usr/bin/env bash
# Build and run every test: gcc (warnings are errors), the Python package's
# pytest suite (tests/python/), clang (warnings are errors),
# an ASan+UBSan build, a ThreadSanitizer build of the thread tests
# (test_threads, test_stress, test_lock; see docs/testing.md), the cache lock's
# model checked by spin (scripts/check-lock-model.sh), then each fuzz target for
# 15 seconds (docs/testing-fuzz.md; PKV_SKIP_FUZZ=1 skips that,
# PKV_FUZZ_TIME=S changes it).
# Usage: scripts/test.sh [--quick | --tsan]
#   --quick  gcc only (no fuzzing)
#   --tsan   the ThreadSanitizer pass only
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# The real model file for the tests that read it (test_gguf, test_tokenizer,
# test_real_model, test_demo) is named to them by PKV_MODEL; without it they
# skip, which CI does not accept.
if PKV_MODEL=$(scripts/get-model.sh); then
  export PKV_MODEL
elif [ "${CI:-}" = true ]; then
  echo "test.sh: the model file is required in CI (scripts/get-model.sh failed)" >&2
  exit 1
else
  echo "test.sh: no model file: the model-file tests will skip" >&2
fi
# The shared Redis tier's tests (tests/test_tier.c) are built only with hiredis
# and start redis-server; both come from bootstrap, and CI does not accept their
# absence (the test itself fails, rather than skips, without redis-server).
if [ "${CI:-}" = true ] && ! pkg-config --exists hiredis; then
  echo "test.sh: hiredis is required in CI (libhiredis-dev; docs/remote.md)" >&2
  exit 1
fi
quick=0 tsan_only=0
[ "${1:-}" = "--quick" ] && quick=1
[ "${1:-}" = "--tsan" ] && tsan_only=1

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
  ninja -C "$dir" ${PKV_NINJA_TARGETS:-}
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 "${testargs[@]}"
}

# ThreadSanitizer (clang): tests/meson.build builds only the thread tests in a
# -Db_sanitize=thread tree, against tests/nocriterion (Criterion cannot run under
# TSan); only the library and those two tests are compiled.
run_tsan() {
  CC=clang PKV_NINJA_TARGETS="tests/test_threads tests/test_stress tests/test_lock" run_suite build-tsan \
    -Dwerror=true -Dcuda=disabled -Db_sanitize=thread -Db_lundef=false -- --setup=tsan
}

if [ $tsan_only -eq 1 ]; then
  run_tsan
  echo "tsan suite passed"
  exit 0
fi

run_suite build-gcc -Dwerror=true
# The Python package (docs/python.md): pip-installed into the venv that
# scripts/python-env.sh keeps outside the clone, then its pytest suite, whose
# pkvd tests use the gcc tree's daemon.
echo "=== python"
py=$(scripts/python-env.sh | tail -n 1)
PKVD=$PWD/build-gcc/tools/pkvd "$py" -m pytest -q tests/python
if [ $quick -eq 0 ]; then
  # The CUDA layer (compiled by nvcc when present) is built in the gcc pass; the
  # clang and sanitizer passes cover the C code only.
  CC=clang run_suite build-clang -Dwerror=true -Dcuda=disabled
  run_suite build-asan -Dwerror=true -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false \
    -- --setup=sanitize
  run_tsan
  # The lock's protocol, model-checked (tools/model/): ~2 minutes.
  scripts/check-lock-model.sh
fi
# Fuzzing (docs/testing-fuzz.md): every libFuzzer target for a bounded time
# (clang, ASan+UBSan, build-fuzz/), in parallel up to nproc. The corpus-replay
# tests (suite fuzz-replay) already ran in every pass above. PKV_SKIP_FUZZ=1
# skips this step for quick local runs; CI leaves it unset.
if [ $quick -eq 0 ] && [ "${PKV_SKIP_FUZZ:-0}" != 1 ]; then
  echo "=== fuzz: ${PKV_FUZZ_TIME:-15}s per target"
  scripts/fuzz.sh --time "${PKV_FUZZ_TIME:-15}" --jobs "$(nproc)"
fi
echo "all test suites passed"

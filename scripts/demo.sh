#!/usr/bin/env bash
# The main job. Until the warm-restart demo lands, this builds pagedkv in release
# mode and runs the core-engine benchmark (bench/pkv-bench). Extra arguments are
# passed to pkv-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release --buildtype=release -Dinternal_checks=false -Dtests=false >/dev/null
fi
ninja -C build-release >/dev/null
exec build-release/bench/pkv-bench "$@"

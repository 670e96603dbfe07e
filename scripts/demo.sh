#!/usr/bin/env bash
# The main job: builds pagedkv in release mode and runs tools/pkv-demo, which
# serves a scripted multi-user chat workload twice on one cache directory (a new
# one under $TMPDIR unless --cache-dir is given) -- cold, then as a warm restart
# in a new process -- and compares time to first token and
# the generated tokens (docs/demo.md). Extra arguments are passed to pkv-demo
# (`scripts/demo.sh --help` lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release --buildtype=release -Dinternal_checks=false -Dtests=false >/dev/null
fi
ninja -C build-release tools/pkv-demo >/dev/null
exec build-release/tools/pkv-demo "$@"

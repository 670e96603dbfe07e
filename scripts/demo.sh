#!/usr/bin/env bash
# The main job: builds pagedkv in release mode and runs tools/pkv-demo, which
# serves a scripted multi-user chat workload twice on one cache directory (a new
# one under $TMPDIR unless --cache-dir is given) -- cold, then as a warm restart
# in a new process -- and compares time to first token and the generated tokens
# (docs/demo.md). Extra arguments are passed to pkv-demo (`scripts/demo.sh
# --help` lists them).
#
# Build messages go to stderr (stdout is pkv-demo's, e.g. its --json summary):
# one line before a build, so that the first run's minute or two of compiling
# is not silence, and the full output of a step that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
log=$(mktemp "${TMPDIR:-/tmp}/pkv-demo-build.XXXXXX")
trap 'rm -f "$log"' EXIT
# Run a build step quietly; on failure show what it printed and stop.
step() {
  if ! "$@" >"$log" 2>&1; then
    echo "demo.sh: the build failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}
if [ ! -f build-release/build.ninja ]; then
  echo "demo.sh: configuring a release build in build-release/" >&2
  step meson setup build-release --buildtype=release -Dinternal_checks=false -Dtests=false
fi
if ! ninja -C build-release -n tools/pkv-demo 2>/dev/null | grep -q "no work to do"; then
  echo "demo.sh: building tools/pkv-demo in build-release/ (the first time takes a minute or two)" >&2
  step ninja -C build-release tools/pkv-demo
fi
exec build-release/tools/pkv-demo "$@"

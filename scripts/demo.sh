#!/usr/bin/env bash
# The main job: builds pagedkv in release mode, fetches the real model
# (scripts/get-model.sh: SmolLM2-135M-Instruct, once) and runs tools/pkv-demo,
# which serves a multi-user chat on it twice on one cache directory (a new one
# under $TMPDIR unless --cache-dir is given) -- cold, then as a warm restart in a
# new process -- and compares time to first token and the generated tokens, and
# prints the answers (docs/demo.md). Extra arguments are passed to pkv-demo
# (`scripts/demo.sh --help` lists them); with --preset NAME it runs the seeded
# model and fetches nothing, with --model PATH another GGUF.
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
# The real model unless the arguments choose one (or only ask for the usage).
fetch=1
for a in "$@"; do
  case "$a" in --preset|--preset=*|--model|--model=*|--help|-h) fetch=0 ;; esac
done
if [ $fetch -eq 1 ]; then
  if ! model=$(scripts/get-model.sh); then
    echo "demo.sh: could not fetch the model (see above); the seeded model needs no" \
         "download: scripts/demo.sh --preset default" >&2
    exit 1
  fi
  exec build-release/tools/pkv-demo --model "$model" "$@"
fi
exec build-release/tools/pkv-demo "$@"

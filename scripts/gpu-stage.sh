#!/usr/bin/env bash
# Stage a prebuilt CUDA-enabled tree for a GPU machine that has a driver and
# nvcc but not this project's build dependencies (the `device` machines here
# lack liburing and criterion): builds BUILD_DIR (-Dcuda=enabled, release, tests
# on) with every test program, then copies the programs, libpagedkv and the
# shared libraries they need (all but the C library's own) into STAGE_DIR.
# On the GPU machine, from the repository root: scripts/gpu-prebuilt-check.sh STAGE_DIR
# Usage: scripts/gpu-stage.sh [BUILD_DIR [STAGE_DIR]]   (default build-gpu .gpurun)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
stage=${2:-.gpurun}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda=enabled -Dbuildtype=release -Dtests=true >/dev/null
fi
ninja -C "$build" >/dev/null
rm -rf "$stage/build" "$stage/libs"
mkdir -p "$stage/build" "$stage/libs"
progs=$(cd "$build" && ls -d libpagedkv.so tests/test_* tests/gpu/gpu_* tests/gpu/pkv-gpubench tools/kvdump \
  | grep -v '\.p$')
(cd "$build" && cp --parents $progs "$OLDPWD/$stage/build/")
for p in $progs; do ldd "$build/$p"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
  grep -v -E "/$(basename "$build")/" | xargs -r cp -L -t "$stage/libs/"
echo "staged $(du -sh "$stage" | cut -f1) in $stage: $(echo $progs | wc -w) programs, $(ls "$stage/libs" | wc -l) libraries"

#!/usr/bin/env bash
# The GPU check on a machine that cannot build (see scripts/gpu-stage.sh): runs
# tests/gpu/run.sh on the staged tree, then every CPU suite of that same
# CUDA-enabled build, six at a time, and prints one line per suite. Logs go to
# $OUT (the `device` tool's folder) when set, else to a fresh /tmp directory.
# Usage, from the repository root: scripts/gpu-prebuilt-check.sh [STAGE_DIR]  (default .gpurun)
set -u
root=$(pwd)
stage=$(cd "${1:-.gpurun}" && pwd)
b=$stage/build
out=${OUT:-$(mktemp -d /tmp/pkv-gpucheck.XXXXXX)}
mkdir -p "$out"
exec > >(tee "$out/check.log") 2>&1 # the whole output, also as a file
echo "== $(date -u +%FT%TZ) $(nproc) cores; $(uname -r); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
mkdir -p "$out/gpu"
PKV_GPU_PREBUILT=1 PKV_GPU_LIBS=$stage/libs PKV_GPU_LOGS=$out/gpu timeout 400 "$root/tests/gpu/run.sh" "$b"
gpu_rc=$?
echo "== CPU suites of the CUDA build"
export LD_LIBRARY_PATH=$stage/libs KVDUMP=$b/tools/kvdump
logs=$(mktemp -d /tmp/pkv-suites.XXXXXX)
export logs
ls "$b"/tests/test_* | xargs -P 6 -I{} bash -c 't={}; n=$(basename $t); s=$(date +%s.%N)
  (cd /tmp && timeout 300 $t -j2 > $logs/$n.log 2>&1); rc=$?; e=$(date +%s.%N)
  printf "%-18s rc=%-3s %6.1f s  %s\n" $n $rc $(awk -v a=$s -v b=$e "BEGIN{print b-a}") \
    "$(grep -E Synthesis $logs/$n.log | tail -1)"' | tee "$logs/summary"
for f in "$logs"/test_*.log; do echo "##### $(basename "$f")"; grep -v -E '^\[----\]|^$' "$f" | tail -15; done \
  > "$out/suites.log"
if grep -q -v -E 'rc=0 ' "$logs/summary"; then echo "== some CPU suites FAILED"; exit 1; fi
echo "== all CPU suites passed $(date -u +%TZ)"
[ $gpu_rc = 0 ] || echo "== tests/gpu/run.sh FAILED (exit $gpu_rc)"
exit $gpu_rc

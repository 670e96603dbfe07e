#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU check of the CUDA layer (docs/cuda.md), in one go:
# build pagedkv with the CUDA layer, run the CPU-side residency suite and every
# GPU test, run the GPU benchmark, and print one final table (test results;
# host -> device GB/s from the arena in each registration mode vs pinned vs
# pageable memory; attention time and bandwidth as a fraction of the measured
# device-to-device copy bandwidth at 4k / 32k / 128k context); then the Python
# extension's CUDA layer (python_dlpack.py: the device pool by DLPack), built in
# BUILD_DIR-py (PKV_GPU_PYBUILD) with -Dpython=true -Dcuda=enabled.
#
# Needs a machine with an NVIDIA GPU (written for one H100/H200: under 8 minutes
# there, build included). Without a GPU, driver or CUDA layer the GPU tests and
# the benchmark report SKIP (exit 77) and the table says so.
#
# Usage: tests/gpu/run.sh [BUILD_DIR]          (default: BUILD_DIR=build-gpu)
# Environment:
#   PKV_GPU_SHM     tmpfs directory for arenas (default /dev/shm)
#   PKV_GPU_DISK    disk directory for arenas (default BUILD_DIR)
#   PKV_GPU_LOGS    where logs go (default a fresh /tmp/pkv-gpu.XXXXXX)
#   PKV_GPU_PREBUILT=1  do not configure or build: use BUILD_DIR as it is
#   PKV_SEED        repeat a run's random inputs (printed in the logs)
#   PKV_GPU_LIBS    extra shared-library directory for the test programs only
#                   (e.g. liburing/criterion copied along with a prebuilt tree)
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-gpu}
case $build in /*) ;; *) build=$PWD/$build ;; esac
logs=${PKV_GPU_LOGS:-$(mktemp -d /tmp/pkv-gpu.XXXXXX)}
mkdir -p "$logs"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }

echo "== pagedkv GPU check: build $build, logs $logs"
gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
echo "== GPU: ${gpu_line:-none found by nvidia-smi}"

# ---- Build -------------------------------------------------------------------
build_status=ok
if [ "${PKV_GPU_PREBUILT:-0}" = 1 ]; then
    echo "== build: prebuilt ($build)"
else
    echo "== build (CUDA layer enabled, release)"
    if [ ! -f "$build/build.ninja" ]; then
        if ! meson setup "$build" "$root" -Dcuda=enabled -Dbuildtype=release -Dwerror=false \
                >"$logs/setup.log" 2>&1; then
            tail -30 "$logs/setup.log"
            build_status=failed
        fi
    fi
    # Only what this check runs (the rest of the tree need not build here).
    if [ $build_status = ok ] && ! ninja -C "$build" tests/test_residency tests/gpu/gpu_attention \
            tests/gpu/gpu_paging tests/gpu/pkv-gpubench >"$logs/build.log" 2>&1; then
        grep -E "error|FAILED" "$logs/build.log" | head -30
        build_status=failed
    fi
    echo "   build: $build_status ($(elapsed) s)"
fi

disk=${PKV_GPU_DISK:-$build}
export PKV_GPU_SHM=${PKV_GPU_SHM:-/dev/shm}
export PKV_GPU_DISK=$disk

# ---- Tests -------------------------------------------------------------------
declare -A status
run_one() { # name, timeout, command...
    local name=$1 tmo=$2
    shift 2
    if [ ! -x "$1" ]; then
        status[$name]="NOT BUILT"
        return
    fi
    (cd "$disk" && LD_LIBRARY_PATH=${PKV_GPU_LIBS:+$PKV_GPU_LIBS:}${LD_LIBRARY_PATH:-} timeout "$tmo" "$@") \
        >"$logs/$name.log" 2>&1
    local rc=$?
    case $rc in
        0) status[$name]=PASS ;;
        77) status[$name]="SKIP ($(grep -m1 '^SKIP' "$logs/$name.log" | cut -c7-))" ;;
        124) status[$name]="TIMEOUT (${tmo} s)" ;;
        *) status[$name]="FAIL (exit $rc)" ;;
    esac
    echo "   $name: ${status[$name]} ($(elapsed) s)"
    grep -E '^(FAIL|#)' "$logs/$name.log" | head -40 | sed 's/^/     /'
}
echo "== tests"
run_one residency 120 "$build/tests/test_residency"
run_one gpu_attention 200 "$build/tests/gpu/gpu_attention"
run_one gpu_paging 150 "$build/tests/gpu/gpu_paging"
echo "== benchmark"
run_one gpu_bench 180 "$build/tests/gpu/pkv-gpubench"

# ---- Python: the CUDA layer's DLPack export (src/python/cuda.c) --------------
# A build of its own (-Dpython=true links the shared CUDA runtime, which a
# dlopen-ed extension needs; the tree above keeps the static one); PYTHONPATH
# gets a pagedkv package of the sources' .py files and the built extension.
pybuild=${PKV_GPU_PYBUILD:-$build-py}
echo "== python (build $pybuild)"
py3=$(command -v python3 || true)
if [ -z "$py3" ] || ! "$py3" -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then
    status[python_dlpack]="SKIP (no python3 with its headers)"
elif [ "${PKV_GPU_PREBUILT:-0}" != 1 ] && { [ -f "$pybuild/build.ninja" ] || meson setup "$pybuild" "$root" \
        -Dcuda=enabled -Dpython=true -Dtests=false -Dbuildtype=release -Dwerror=false \
        >"$logs/py-setup.log" 2>&1; } && ! meson compile -C "$pybuild" _pagedkv >"$logs/py-build.log" 2>&1; then
    status[python_dlpack]="NOT BUILT (see $logs/py-build.log)"
else
    so=$(ls "$pybuild"/src/python/_pagedkv*.so 2>/dev/null | head -1)
    if [ -z "$so" ]; then
        status[python_dlpack]="NOT BUILT"
    else
        mkdir -p "$logs/pyroot/pagedkv"
        ln -sf "$root"/python/pagedkv/*.py "$so" "$logs/pyroot/pagedkv/"
        run_one python_dlpack 120 "$(command -v env)" PYTHONPATH="$logs/pyroot" "$py3" "$here/python_dlpack.py"
    fi
fi

# ---- Final table -------------------------------------------------------------
declare -A R
while read -r _ k v; do R[$k]=$v; done < <(cat "$logs"/gpu_*.log 2>/dev/null | grep '^RESULT ')
val() { echo "${R[$1]:-n/a}"; }
pct() { # a b -> a/b in %
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.0f%%", 100 * a / b }'
}
pin=$(val h2d_pinned_gbs)
echo
echo "======================== pagedkv GPU check ========================"
echo "GPU: ${gpu_line:-n/a}"
echo "Build: $build_status; total time $(elapsed) s"
echo
echo "Tests"
for t in residency gpu_attention gpu_paging gpu_bench python_dlpack; do
    printf "  %-16s %s\n" "$t" "${status[$t]:-not run}"
done
printf "  attention: %s cases, worst relative error f32 %s, f16 %s (tol 1e-3), bf16 %s (tol 1.6e-2)\n" \
    "$(val attention_cases)" "$(val attention_err_f32)" "$(val attention_err_f16)" "$(val attention_err_bf16)"
modes=""
for s in tmpfs disk disk-ro staging gather chunks staging-small; do
    [ -n "${R[mode_$s]:-}" ] && modes="$modes $s=${R[mode_$s]}"
done
echo "  paging modes obtained:${modes:- n/a}"
echo
echo "Host -> device                                  GB/s   vs pinned"
printf "  %-42s %6s   %s\n" "pinned memory, cudaMemcpyAsync" "$pin" "100%"
printf "  %-42s %6s   %s\n" "pageable memory, cudaMemcpyAsync" "$(val h2d_pageable_gbs)" "$(pct "$(val h2d_pageable_gbs)" "$pin")"
for s in tmpfs disk disk-ro staging gather; do
    [ -n "${R[paging_${s}_gbs]:-}" ] || continue
    label="arena ($s): $(val paging_${s}_mode), $(val paging_${s}_copy)"
    printf "  %-42s %6s   %s\n" "$label" "$(val paging_${s}_gbs)" "$(pct "$(val paging_${s}_gbs)" "$pin")"
done
echo
echo "Device -> device copy: $(val d2d_copy_gbs) GB/s copied = $(val d2d_traffic_gbs) GB/s of HBM traffic (read + write)"
echo
echo "Paged decode attention (f16, 8 kv heads, 32 query heads, head_dim 128, block 16)"
echo "    context  batch   time (us)   K/V GB/s   fraction of D2D traffic"
for c in 4096 32768 131072 32768g8 32768cc 32768g8cc; do
    label=$c
    [ "$c" = 32768g8 ] && label="32768*"
    [ "$c" = 32768cc ] && label="32768**"
    [ "$c" = 32768g8cc ] && label="32768*,**"
    printf "  %9s  %5s  %10s  %9s   %s\n" "$label" "$(val attn_${c}_batch)" "$(val attn_${c}_us)" \
        "$(val attn_${c}_gbs)" "$(pct "$(val attn_${c}_gbs)" "$(val d2d_traffic_gbs)")"
done
echo "  (* 64 query heads: 8 per kv head; ** the CUDA-core kernel, PKV_CUDA_ATTN_NO_MMA; the others"
echo "   run the tensor-core kernel)"
echo
best_paging=n/a
for s in tmpfs disk disk-ro; do
    v=${R[paging_${s}_gbs]:-}
    [ -n "$v" ] || continue
    if [ "$best_paging" = n/a ] || awk -v a="$v" -v b="$best_paging" 'BEGIN{exit !(a > b)}'; then best_paging=$v; fi
done
verdict() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else if (a / b >= t) print "met"; else print "NOT met" }'; }
echo "Targets: paging >= 85% of pinned (best registered mode: $(pct "$best_paging" "$pin")): $(verdict "$best_paging" "$pin" 0.85)"
echo "         attention >= 75% of the copy bandwidth at 32k ($(pct "$(val attn_32768_gbs)" "$(val d2d_traffic_gbs)")): $(verdict "$(val attn_32768_gbs)" "$(val d2d_traffic_gbs)" 0.75)"
echo "Logs: $logs"
echo "==================================================================="

fail=0
for t in residency gpu_attention gpu_paging gpu_bench python_dlpack; do
    case ${status[$t]:-} in PASS|SKIP*) ;; *) fail=1 ;; esac
done
[ $build_status = ok ] || fail=1
exit $fail

#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan+UBSan, in build-fuzz/) and run each for
# a given time with its dictionary and a scratch copy of its seed corpus.
#
# usage: scripts/fuzz.sh [--time SECONDS] [--jobs N] [--merge] [--regen-corpus]
#                        [--keep] [target...]
#   --time S        seconds per target (default 60)
#   --jobs N        targets run in parallel (default: nproc)
#   --merge         afterwards, minimize the committed corpus fuzz/corpus/<t> together
#                   with what the run found (-merge=1) and replace it
#   --regen-corpus  regenerate the seeds from real files (fuzz/gen_corpus.c),
#                   minimize them into fuzz/corpus/<t>, then run as usual
#   --keep          keep the scratch directory (default: removed unless a crash)
#   target          record checkpoint recover bundle api kvdump gguf tier (default: all)
# Prints executions, exec/s, coverage and corpus size per target. Exits 1 if any
# target crashed (a sanitizer report, a failed harness check, a leak, a timeout,
# an out-of-memory or a unit that ran 10 s or more), after printing the path of each
# crash file and, up to 64 KiB, its gzip+base64 text (a CI log keeps it); copy it into
# fuzz/regressions/<t>/ once the bug is fixed. docs/testing-fuzz.md has the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
time_s=60
jobs=$(nproc)
merge=0
regen=0
keep=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --regen-corpus) regen=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(record checkpoint recover bundle api kvdump gguf wire tier)
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target '$t' (have: ${all[*]})" >&2; exit 2; }
done

build=build-fuzz
if [ ! -f $build/build.ninja ]; then
  CC=clang meson setup $build -Dfuzzing=true -Dtests=false -Dcuda=disabled -Dwerror=true \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C $build $(for t in "${targets[@]}"; do echo fuzz/fuzz-$t; done) fuzz/gen_corpus \
  fuzz/gen_gguf_corpus >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:handle_segv=1:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$(mktemp -d "${TMPDIR:-/tmp}/pkv-fuzz.XXXXXX")

if [ $regen -eq 1 ]; then
  $build/fuzz/gen_corpus "$work/seeds" >/dev/null
  $build/fuzz/gen_gguf_corpus "$work/seeds/gguf"
  for t in "${targets[@]}"; do
    # targets gen_corpus makes no seeds for (tier: hand-made) keep their corpus
    [ -d "$work/seeds/$t" ] || { echo "kept fuzz/corpus/$t (no generated seeds)"; continue; }
    rm -rf "fuzz/corpus/$t.new"; mkdir -p "fuzz/corpus/$t.new"
    $build/fuzz/fuzz-$t -merge=1 -close_fd_mask=3 "fuzz/corpus/$t.new" "$work/seeds/$t" \
      >"$work/regen-$t.log" 2>&1
    rm -rf "fuzz/corpus/$t"; mv "fuzz/corpus/$t.new" "fuzz/corpus/$t"
    echo "regenerated fuzz/corpus/$t: $(ls fuzz/corpus/$t | wc -l) files"
  done
fi

run_one() { # target
  local t=$1 d="$work/$1"
  mkdir -p "$d/corpus" "$d/artifacts"
  cp fuzz/corpus/$t/* "$d/corpus/" 2>/dev/null || true
  # The regression inputs run first too, read-only (never merged into the corpus).
  local dict=() regr=()
  [ -f fuzz/dict/$t.dict ] && dict=(-dict=fuzz/dict/$t.dict)
  [ -d fuzz/regressions/$t ] && regr=(fuzz/regressions/$t)
  set +e
  "$root/$build/fuzz/fuzz-$t" "$d/corpus" "${regr[@]}" "${dict[@]}" -max_total_time="$time_s" \
    -artifact_prefix="$d/artifacts/" -print_final_stats=1 -close_fd_mask=3 \
    -timeout=30 -report_slow_units=10 -rss_limit_mb=2048 -max_len=65536 >"$d/log" 2>&1
  echo $? >"$d/rc"
  set -e
}

echo "fuzzing ${targets[*]} for ${time_s}s each, $jobs at a time (scratch: $work)"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ $running -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait

status=0
printf '%-11s %12s %9s %8s %9s %s\n' target execs exec/s cov corpus result
for t in "${targets[@]}"; do
  d="$work/$t"
  rc=$(cat "$d/rc" 2>/dev/null || echo 99)
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$d/log" | tail -1 | awk '{print $2}' || true)
  eps=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$d/log" | tail -1 | awk '{print $2}' || true)
  cov=$(grep -o 'cov: [0-9]*' "$d/log" | tail -1 | awk '{print $2}' || true)
  ncorp=$(ls "$d/corpus" | wc -l)
  crashes=$(ls "$d/artifacts" 2>/dev/null | wc -l)
  result=ok
  if [ "$rc" != 0 ] || [ "$crashes" -gt 0 ]; then result="CRASH (rc $rc)"; status=1; fi
  printf '%-11s %12s %9s %8s %9s %s\n' "$t" "${execs:-?}" "${eps:-?}" "${cov:-?}" "$ncorp" "$result"
  if [ "$result" != ok ]; then
    for f in "$d"/artifacts/*; do
      [ -e "$f" ] || continue
      echo "  crash file: $f ($(stat -c %s "$f") bytes)"
      # A CI log is all that survives a CI machine: carry the input in it, so
      # it can be replayed here (base64 -d | gunzip > FILE).
      z=$(gzip -9c "$f" | base64 -w 0)
      if [ ${#z} -le 65536 ]; then echo "  gzip+base64: $z"
      else echo "  (${#z} bytes of gzip+base64: too large to print)"; fi
    done
    echo "  log: $d/log"
    grep -m3 -E 'ERROR: |SUMMARY: |fuzz harness check failed|Slowest unit' "$d/log" | sed 's/^/  /' || true
  fi
done

if [ $merge -eq 1 ]; then
  for t in "${targets[@]}"; do
    # targets gen_corpus makes no seeds for (tier: hand-made) keep their corpus
    [ -d "$work/seeds/$t" ] || { echo "kept fuzz/corpus/$t (no generated seeds)"; continue; }
    rm -rf "fuzz/corpus/$t.new"; mkdir -p "fuzz/corpus/$t.new"
    $build/fuzz/fuzz-$t -merge=1 -close_fd_mask=3 "fuzz/corpus/$t.new" "fuzz/corpus/$t" \
      "$work/$t/corpus" >"$work/merge-$t.log" 2>&1
    rm -rf "fuzz/corpus/$t"; mv "fuzz/corpus/$t.new" "fuzz/corpus/$t"
    echo "merged fuzz/corpus/$t: $(ls fuzz/corpus/$t | wc -l) files, $(du -sh fuzz/corpus/$t | cut -f1)"
  done
fi
if [ $status -eq 0 ] && [ $keep -eq 0 ]; then rm -rf "$work"; fi
exit $status

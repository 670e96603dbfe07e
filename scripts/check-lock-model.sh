#!/usr/bin/env bash
# Model-check the cache lock (src/lock.c) with spin: tools/model/lock.pml, three
# threads the bias moves among, on x86-TSO store buffers with membarrier (see
# tools/model/README.md). Two checks, and the script fails unless both hold:
#   1. the protocol as built: no assertion violated (one thread inside, the
#      previous holder's data seen), no invalid end state (no thread left asleep
#      by a lost wake-up), the whole state space searched, every statement of
#      the threads reached;
#   2. broken variants fail: the protocol before the per-thread busy word
#      (-DSHARED_BUSY: two threads inside), the revocation without its
#      membarrier (-DNO_MB1), the sleep path without its second one (-DNO_MB2: a
#      lost wake-up, a thread asleep for ever); otherwise the model has stopped
#      telling right from wrong.
# Exhaustive search, 41.7 M states: 1-2 minutes and 5.3 GB on the 2-core
# development VM. PKV_MODEL_PAN_FLAGS adds compile flags for pan (e.g.
# -DCOLLAPSE: a third of the memory, slower).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v spin >/dev/null || { echo "check-lock-model: spin is not installed (scripts/bootstrap.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp tools/model/lock.pml "$work/"
cd "$work"

verify() { # label, spin -D options...
  local label=$1; shift
  spin "$@" -a lock.pml >/dev/null
  # -w: pan.c has code the compiler warns about (not ours); -DSAFETY: safety
  # properties only (assertions, invalid end states), no cycle search.
  gcc -O2 -w -DSAFETY ${PKV_MODEL_PAN_FLAGS:-} -o pan pan.c
  ./pan -m10000000 -w26 > "pan-$label.out" 2>&1 || true
  echo "=== $label: spin${*:+ $*} -a lock.pml; gcc -O2 -w -DSAFETY${PKV_MODEL_PAN_FLAGS:+ $PKV_MODEL_PAN_FLAGS} -o pan pan.c; ./pan -m10000000 -w26"
  grep -E "^pan:[0-9]|errors:|states, stored|transitions|elapsed time" "pan-$label.out" | head -6
  # every statement of a thread reached: no path of the protocol left unexplored
  if [ "$label" = model ]; then
    grep -A1 "unreached in proctype T" "pan-$label.out" | tr -s '\t\n' ' ' | sed 's/ *$/\n/'
  fi
}

verify model
out=pan-model.out
if ! grep -q "errors: 0" $out || grep -q "max search depth too small" $out ||
   grep -q "Search not completed" $out; then
  echo "check-lock-model: FAILED: the lock's model has an error (or the search did not complete)" >&2
  cat $out >&2
  exit 1
fi
if ! grep -A1 "unreached in proctype T" $out | grep -q "(0 of"; then
  echo "check-lock-model: FAILED: statements of the lock's model are never reached:" >&2
  sed -n '/unreached in proctype T/,/unreached in proctype flusher/p' $out >&2
  exit 1
fi

# The model must be able to fail: each of these breaks the protocol, and spin
# must say how.
expect_error() { # label, what pan must report, spin -D option
  verify "$1" "$3"
  if ! grep -q "$2" "pan-$1.out"; then
    echo "check-lock-model: FAILED: $1: spin did not report '$2'" >&2
    exit 1
  fi
}
expect_error old "assertion violated (cs==0)" -DSHARED_BUSY # before the per-thread busy word
expect_error no-membarrier "assertion violated" -DNO_MB1    # revocation without its membarrier
expect_error no-second-membarrier "invalid end state" -DNO_MB2 # a revoker sleeps forever
echo "check-lock-model: the lock's model holds; each broken variant fails as it should"

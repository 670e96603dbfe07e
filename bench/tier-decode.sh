#!/bin/sh
# tier-decode.sh — the decode path (pkv-bench (b)) with a shared tier publishing,
# against the same without a tier, in one pkv-bench run (docs/benchmarks.md,
# "Shared Redis tier").
#
# Starts a standalone redis-server on a free loopback port in a temporary
# directory (no persistence, the tests' settings), runs
# `pkv-bench --only decode --tier-nodes 127.0.0.1:PORT` with the options given,
# and stops the server. The decode pair with the tier and the pair without run
# on the same cache, their order alternating between runs.
#
# usage: bench/tier-decode.sh BUILD_DIR [pkv-bench options ...]
#   e.g. bench/tier-decode.sh build-release --runs 5
#        bench/tier-decode.sh build-release --runs 5 --tier-max-depth 64
# Needs redis-server (scripts/bootstrap.sh installs it) and a build with hiredis.
set -eu
if [ $# -lt 1 ]; then
    sed -n '2,15p' "$0" >&2
    exit 2
fi
build=$1
shift
bin=$build/bench/pkv-bench
[ -x "$bin" ] || { echo "tier-decode.sh: no $bin (ninja -C $build bench/pkv-bench)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "tier-decode.sh: redis-server not found (apt-get install redis-server)" >&2; exit 2; }
tmp=$(mktemp -d)
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$tmp" && exec redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --protected-mode no --logfile redis.log) &
pid=$!
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 500 ] || { echo "tier-decode.sh: redis-server did not start ($tmp/redis.log)" >&2; exit 1; }
    sleep 0.01
done
"$bin" --only decode --tier-nodes "127.0.0.1:$port" "$@"
echo "redis-server: $(redis-cli -p "$port" dbsize) keys, $(redis-cli -p "$port" info memory | sed -n 's/^used_memory_human:\(.*\)\r*$/\1/p') used"

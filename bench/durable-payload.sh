#!/bin/sh
# durable-payload.sh — the durable replay's write bandwidth against the disk's.
#
# Measures the device's sequential write bandwidth under DIR with dd (O_DIRECT,
# 1 MiB writes, fsync at the end), replays a trace through pkv-trace in GROUP
# durability with K/V payload written (cache directory and arena under DIR),
# measures the device again, and prints the replay's rates against the mean of
# the two dd runs: the K/V bytes it wrote and the bytes the process sent to
# storage (arena pages and log), each per second of replay wall time. Whether
# the disk or the CPU bounds the replay is in pkv-trace's "request thread" line:
# time blocked on the disk shows there as "blocked".
#
# usage: bench/durable-payload.sh BUILD_DIR DIR TRACE [pkv-trace options ...]
#   e.g. bench/durable-payload.sh build-release /var/tmp \
#            ../shared/traces/mooncake_conversation_trace.jsonl \
#            --capacities 64k --geometry 4,2,64 --limit 400
# Needs dd (coreutils). fio is not needed; docs/benchmarks.md has the figures.
set -eu
if [ $# -lt 3 ]; then
    sed -n '2,17p' "$0" >&2
    exit 2
fi
build=$1 dir=$2 trace=$3
shift 3
bin=$build/bench/pkv-trace
[ -x "$bin" ] || { echo "durable-payload.sh: no $bin (ninja -C $build bench/pkv-trace)" >&2; exit 2; }
ddfile=$dir/durable-payload-dd.$$
trap 'rm -f "$ddfile"' EXIT INT TERM

# MiB/s of one 2 GiB O_DIRECT sequential write under DIR.
dd_mibs() {
    out=$(LC_ALL=C dd if=/dev/zero of="$ddfile" bs=1M count=2048 oflag=direct conv=fsync 2>&1)
    rm -f "$ddfile"
    echo "$out" | awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1);
                                   printf "%.1f\n", 2048 / s }'
}

echo "load before: $(cat /proc/loadavg)"
d1=$(dd_mibs)
echo "dd O_DIRECT sequential write: $d1 MiB/s"
log=$(mktemp)
"$bin" --trace "$trace" --policies leaf-lru --durability group --payload --dir "$dir" "$@" \
    | tee "$log"
d2=$(dd_mibs)
echo "dd O_DIRECT sequential write: $d2 MiB/s"
echo "load after: $(cat /proc/loadavg)"
awk -v d1="$d1" -v d2="$d2" '
    /payload: .* MiB of K\/V written/ {
        for (i = 1; i <= NF; i++) {
            if ($i == "MiB/s" && !kv) kv = $(i - 1)
            if ($i == "writes") { sw = $(i + 3); sub(/^\(/, "", sw) }
        }
        dev = (d1 + d2) / 2
        printf "replay: K/V %.1f MiB/s = %.0f%% of the device; storage writes %.1f MiB/s = %.0f%%\n",
               kv, 100 * kv / dev, sw, 100 * sw / dev
    }' "$log"
rm -f "$log"

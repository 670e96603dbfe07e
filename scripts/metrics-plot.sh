#!/usr/bin/env bash
# Draw the panels of docs/grafana/pagedkv.json as PNGs with gnuplot, from a
# Prometheus server's HTTP API (/api/v1/query_range), for users without Grafana.
#
# usage: scripts/metrics-plot.sh [options] OUTDIR
#   --prometheus URL  query this server (e.g. http://127.0.0.1:9090) over the last
#                     --last seconds (default 600)
#   --window W        PromQL range of rate() and friends (default 1m; 5s for a demo)
#   --demo-args ARGS  without --prometheus: pkv-demo's arguments (default
#                     "--preset small"); the script runs pkv-demo --metrics on a
#                     free loopback port with a temporary Prometheus (Debian
#                     package prometheus) scraping it every second, then plots
#                     that run and stops the server
#   --build DIR       the build directory holding tools/pkv-demo (default:
#                     build-gcc, else build)
# Writes OUTDIR/<panel>.png (hit-rate, block-usage, evictions, cow-per-token,
# group-commit-delay, log-sync, checkpoint-duration, gpu-pool-hits) and the
# data behind each as OUTDIR/<panel>-<series>.tsv (unix time, value). A panel
# whose series have no data (e.g. GPU hits without a CUDA handle) says so on
# the picture. Needs curl, python3 (JSON) and gnuplot (pngcairo terminal).
set -euo pipefail
cd "$(dirname "$0")/.."

prom="" last=600 window="" demo_args="--preset small" build=""
while [ $# -gt 1 ]; do
  case $1 in
    --prometheus) prom=$2; shift 2 ;;
    --last) last=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --demo-args) demo_args=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
out=$1
for t in curl python3 gnuplot; do
  command -v $t >/dev/null || { echo "$0: $t not found" >&2; exit 1; }
done
mkdir -p "$out"
tmp=$(mktemp -d)
prom_pid=""
cleanup() {
  if [ -n "$prom_pid" ]; then kill "$prom_pid" 2>/dev/null || true; wait "$prom_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [ -z "$prom" ]; then
  # Demo mode: a private Prometheus scraping pkv-demo --metrics.
  command -v prometheus >/dev/null || { echo "$0: prometheus not found (apt-get install prometheus)" >&2; exit 1; }
  if [ -z "$build" ]; then
    for b in build-gcc build; do [ -x "$b/tools/pkv-demo" ] && { build=$b; break; }; done
  fi
  demo=${build:+$build/tools/pkv-demo}
  [ -n "$demo" ] && [ -x "$demo" ] || { echo "$0: no tools/pkv-demo in ${build:-build-gcc or build} (build first, or --build DIR)" >&2; exit 1; }
  window=${window:-5s}
  mport=$(free_port) pport=$(free_port)
  cat > "$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: pagedkv
    static_configs:
      - targets: ['127.0.0.1:$mport']
EOF
  prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn > "$tmp/prometheus.log" 2>&1 &
  prom_pid=$!
  prom="http://127.0.0.1:$pport"
  for _ in $(seq 150); do curl -fs "$prom/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fs "$prom/-/ready" >/dev/null || { cat "$tmp/prometheus.log" >&2; echo "$0: prometheus did not start" >&2; exit 1; }
  # Its first scrape comes a few seconds after the start (target discovery is
  # throttled): begin the run once it scrapes, so that the plots show all of it.
  echo "metrics-plot: waiting for Prometheus's first scrape" >&2
  # (the endpoint is not up yet: wait for the scrape attempt, which records up 0)
  for _ in $(seq 200); do
    curl -fs "$prom/api/v1/query" --data-urlencode 'query=up{job="pagedkv"}' | grep -q '"value"' && break
    sleep 0.1
  done
  start=$(date +%s)
  echo "metrics-plot: $demo $demo_args --metrics 127.0.0.1:$mport --metrics-linger 4" >&2
  # shellcheck disable=SC2086 # demo_args is a list of words
  "$demo" $demo_args --quiet --metrics "127.0.0.1:$mport" --metrics-linger 4 > "$out/demo.txt"
  sleep 2 # the last scrape
  end=$(date +%s)
else
  window=${window:-1m}
  end=$(date +%s)
  start=$((end - last))
fi
step=$(( (end - start) / 300 )); [ "$step" -ge 1 ] || step=1

# query_range -> TSV (unix time, value), the series summed over instances.
fetch() { # promql file
  curl -fsS "$prom/api/v1/query_range" --data-urlencode "query=$1" \
    --data-urlencode "start=$start" --data-urlencode "end=$end" --data-urlencode "step=$step" |
    python3 -c '
import json, math, sys
d = json.load(sys.stdin)
if d.get("status") != "success": sys.exit("query failed: " + str(d))
res = d["data"]["result"]
if len(res) > 1: sys.exit("query returned %d series; panels use one per query" % len(res))
for t, v in (res[0]["values"] if res else []):
    f = float(v)
    if math.isfinite(f): print("%s\t%s" % (t, v))
' > "$2"
}

W=$window
# panel | title | y label | y scale | series: legend=PromQL ;; legend=PromQL ...
panels=(
"hit-rate|Prefix cache hit rate (tokens and blocks)|hit rate|1|tokens=sum(rate(pagedkv_prefix_cache_hits_total[$W])) / sum(rate(pagedkv_prefix_cache_queries_total[$W]));;blocks=sum(rate(pagedkv_prefix_cache_block_hits_total[$W])) / sum(rate(pagedkv_prefix_cache_block_queries_total[$W]))"
"block-usage|Block usage|blocks|1|used=sum(pagedkv_blocks{state=\"used\"});;cached=sum(pagedkv_blocks{state=\"cached\"});;free=sum(pagedkv_blocks{state=\"free\"});;capacity=sum(pagedkv_capacity_blocks)"
"evictions|Evictions per minute|evictions / min|1|evictions=sum(rate(pagedkv_evictions_total[$W])) * 60"
"cow-per-token|Copy-on-write copies per appended token|copies / token|1|cow=sum(rate(pagedkv_cow_copies_total[$W])) / sum(rate(pagedkv_tokens_appended_total[$W]))"
"group-commit-delay|Group-commit delay (append to durable)|ms|1000|p50=histogram_quantile(0.5, sum by (le) (rate(pagedkv_wal_group_commit_delay_seconds_bucket[$W])));;p99=histogram_quantile(0.99, sum by (le) (rate(pagedkv_wal_group_commit_delay_seconds_bucket[$W])))"
"log-sync|Log write+fdatasync latency|ms|1000|p50=histogram_quantile(0.5, sum by (le) (rate(pagedkv_wal_sync_duration_seconds_bucket[$W])));;p99=histogram_quantile(0.99, sum by (le) (rate(pagedkv_wal_sync_duration_seconds_bucket[$W])))"
"checkpoint-duration|Checkpoint duration (mean over the window)|ms|1000|mean=sum(rate(pagedkv_checkpoint_duration_seconds_sum[$W])) / sum(rate(pagedkv_checkpoint_duration_seconds_count[$W]))"
"gpu-pool-hits|GPU pool: blocks hit vs copied per second|blocks / s|1|hit=sum(rate(pagedkv_gpu_blocks_hit_total[$W]));;copied=sum(rate(pagedkv_gpu_blocks_copied_total[$W]))"
)

for p in "${panels[@]}"; do
  IFS='|' read -r name title ylabel scale series <<< "$p"
  plots="" any=0
  rest=$series
  while [ -n "$rest" ]; do
    item=${rest%%;;*}
    if [ "$item" = "$rest" ]; then rest=""; else rest=${rest#*;;}; fi
    legend=${item%%=*} q=${item#*=}
    f="$out/$name-$legend.tsv"
    fetch "$q" "$f"
    if [ -s "$f" ]; then
      any=1
      plots+="${plots:+, }'$f' using (\$1 - $start):(\$2 * $scale) with lines lw 2 title '$legend'"
    fi
  done
  {
    echo "set terminal pngcairo size 900,420 font 'sans,10'"
    echo "set output '$out/$name.png'"
    echo "set title '$title (rate window $W)'"
    echo "set xlabel 'seconds since $(date -u -d "@$start" '+%Y-%m-%d %H:%M:%S') UTC'"
    echo "set ylabel '$ylabel'"
    echo "set grid"
    echo "set key outside right"
    echo "set xrange [0:$((end - start))]"
    if [ $any -eq 1 ]; then
      echo "set yrange [0:*]"
      echo "plot $plots"
    else
      echo "set yrange [0:1]"
      echo "set label 1 'no data in this range' at graph 0.5, 0.5 center"
      echo "plot NaN notitle"
    fi
  } > "$tmp/$name.gp"
  gnuplot "$tmp/$name.gp"
  echo "$out/$name.png"
done

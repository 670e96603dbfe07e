#!/usr/bin/env bash
# scripts/metrics-plot.sh end to end (meson test 'metrics_plot'): it runs a tiny
# pkv-demo with --metrics, scraped by a temporary Prometheus, and must draw every
# panel (a query Prometheus refuses fails the script) with the block gauges'
# data. The tiny runs end within a scrape or two, so the rate panels may
# rightly have no points. Exit 77 (skip) without prometheus, an error when
# CI=true.
# usage: metrics_plot_test.sh SOURCE_ROOT BUILD_ROOT
set -euo pipefail
src=$1 build=$2
if ! command -v prometheus >/dev/null; then
  [ "${CI:-}" = true ] && { echo "prometheus is required in CI (Debian package prometheus)" >&2; exit 1; }
  echo "prometheus not installed: skipped" >&2
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$src/scripts/metrics-plot.sh" --build "$build" --window 3s \
  --demo-args "--preset tiny --users 2 --turns 1 --samples 1 --system-tokens 64 --message-tokens 16-32 --answer-tokens 8" \
  "$out" > "$out/list.txt"
for p in hit-rate block-usage evictions cow-per-token group-commit-delay log-sync \
         checkpoint-duration gpu-pool-hits; do
  [ -s "$out/$p.png" ] || { echo "no $p.png" >&2; exit 1; }
  head -c 8 "$out/$p.png" | od -An -c | grep -q 'P   N   G' || { echo "$p.png is not a PNG" >&2; exit 1; }
done
for t in block-usage-used block-usage-free block-usage-capacity; do
  [ -s "$out/$t.tsv" ] || { echo "no data in $t.tsv" >&2; exit 1; }
done
# the capacity the demo sized is what was plotted
awk -F'\t' '$2 <= 0 { bad = 1 } END { exit bad }' "$out/block-usage-capacity.tsv" ||
  { echo "capacity not positive" >&2; exit 1; }
echo "metrics-plot: $(wc -l < "$out/list.txt") panels drawn"

#!/usr/bin/env bash
# Plot token hit rate against cache capacity from a pkv-trace --csv file.
#
# usage: scripts/plot-trace.sh RESULTS.csv OUT.png [TITLE]
#
# Top panel: token hit rate of every simulated policy, of Belady's optimum, of the
# engine (points) and of an infinite cache, against capacity as a share of the
# trace's distinct blocks (log scale). Bottom panel: each online policy's hit rate
# minus leaf-first LRU's, in percentage points (the differences are too small to
# see on the top panel). Needs gnuplot (Debian: gnuplot-nox) with the pngcairo
# terminal.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 RESULTS.csv OUT.png [TITLE]" >&2
  exit 2
fi
csv=$1
out=$2
command -v gnuplot >/dev/null || { echo "$0: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -r "$csv" ] || { echo "$0: cannot read $csv" >&2; exit 1; }
head -1 "$csv" | grep -q '^trace,block_size,capacity,share_pct,policy,token_hit_pct' ||
  { echo "$0: $csv is not a pkv-trace --csv file" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

label=$(awk -F, 'NR == 2 { print $1 }' "$csv")
bs=$(awk -F, 'NR == 2 { print $2 }' "$csv")
title=${3:-"$label, ${bs}-token blocks"}

# One file per policy: share_pct token_hit_pct capacity (sorted by capacity).
awk -F, -v dir="$tmp" 'NR > 1 { print $4, $6, $3 > (dir "/" $5 ".dat") }' "$csv"
for f in "$tmp"/*.dat; do sort -g -o "$f" "$f"; done
# Differences to leaf-first LRU at equal capacity.
for p in lru leaf-slru leaf-mq engine; do
  [ -f "$tmp/$p.dat" ] && [ -f "$tmp/leaf-lru.dat" ] || continue
  awk 'NR == FNR { base[$3] = $2; next } ($3 in base) { print $1, $2 - base[$3] }' \
    "$tmp/leaf-lru.dat" "$tmp/$p.dat" > "$tmp/$p.diff"
done
inf=$(awk '{ print $2 }' "$tmp/infinite.dat" 2>/dev/null || true)
ymax=""
if [ -n "$inf" ]; then ymax=$(awk -v i="$inf" 'BEGIN { m = i * 1.1; s = m > 50 ? 10 : 5; print int(m / s + 1) * s }'); fi
xmin=$(awk -F, 'NR > 1 && $5 != "infinite" { print $4 }' "$csv" | sort -g | head -1)

plots=""
diffs=""
add() { # file, title, style
  [ -s "$tmp/$1" ] || return 0
  plots+="${plots:+, }'$tmp/$1' using 1:2 title '$2' $3"
}
adddiff() {
  [ -s "$tmp/$1" ] || return 0
  diffs+="${diffs:+, }'$tmp/$1' using 1:2 title '$2' $3"
}
add belady.dat "Belady (offline optimum)" "with linespoints lw 2.5 dt 2 pt 7 ps 0.6 lc rgb '#000000'"
add leaf-lru.dat "leaf-first LRU (engine policy, simulated)" "with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4'"
add engine.dat "engine replay (pkv_get_stats)" "with points pt 6 ps 1.8 lw 1.5 lc rgb '#1f77b4'"
add lru.dat "plain LRU (parents may go first)" "with linespoints lw 1.5 pt 5 ps 0.5 lc rgb '#ff7f0e'"
add leaf-slru.dat "leaf-first SLRU + ghosts" "with linespoints lw 1.5 pt 9 ps 0.7 lc rgb '#2ca02c'"
add leaf-mq.dat "leaf-first 4-level MQ + ghosts" "with linespoints lw 1.5 pt 11 ps 0.7 lc rgb '#9467bd'"
adddiff lru.diff "plain LRU" "with linespoints lw 1.5 pt 5 ps 0.5 lc rgb '#ff7f0e'"
adddiff leaf-slru.diff "leaf-first SLRU + ghosts" "with linespoints lw 1.5 pt 9 ps 0.7 lc rgb '#2ca02c'"
adddiff leaf-mq.diff "leaf-first 4-level MQ + ghosts" "with linespoints lw 1.5 pt 11 ps 0.7 lc rgb '#9467bd'"
adddiff engine.diff "engine replay" "with points pt 6 ps 1.5 lc rgb '#1f77b4'"

infline=""
if [ -n "$inf" ]; then
  infline="set arrow from graph 0, first $inf to graph 1, first $inf nohead lw 1 dt 3 lc rgb '#808080'
set label 'infinite cache ($(printf '%.1f' "$inf")%)' at graph 0.02, first $inf offset 0,0.7 tc rgb '#606060' font ',9'"
fi

gnuplot <<EOF
set terminal pngcairo size 1150,820 noenhanced font 'Sans,10'
set output '$out'
set multiplot layout 2,1 title '$title' font ',12'
set logscale x
set xrange [${xmin:-1}*0.9:105]
set xtics (1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 70, 100)
set grid xtics ytics lc rgb '#dddddd'
set lmargin 10
set rmargin 3
set key inside bottom right Left reverse box opaque font ',9'
set size 1, 0.68
set origin 0, 0.30
set ylabel 'token hit rate (%)'
set format y '%g'
set yrange [0:${ymax:-*}]
$infline
plot $plots
unset arrow
unset label
set size 1, 0.28
set origin 0, 0.0
set title ''
set xlabel "cache capacity (% of the trace's distinct blocks, log scale)"
set ylabel "minus leaf-first LRU (pp)"
set yrange [*:*]
unset key
set label 'same colours as above' at graph 0.99, graph 0.9 right tc rgb '#606060' font ',9'
plot 0 notitle lc rgb '#1f77b4' lw 1.5, $diffs
unset multiplot
EOF
echo "wrote $out"

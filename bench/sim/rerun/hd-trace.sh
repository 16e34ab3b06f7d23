#!/bin/bash
# hd-trace.sh: one forced algorithm on the 8 x 1 cluster while qdisc-trace.sh records what every
# host receives (the switch ports' tx bytes). Under the bench lock:
#   ALG=halving_doubling COLL=all_gather SIZE=64M flock /work/bench.lock bench/sim/rerun/hd-trace.sh
set -eu
BIN=${BIN:-target/release/tutti}; LINK=${LINK:-1gbit}; SIZE=${SIZE:-64M}
ALG=${ALG:-halving_doubling}; COLL=${COLL:-all_gather}; OUT=${OUT:-bench/sim/rerun/hd-cause}
tag="trace-8x1-$LINK-$COLL-$SIZE-$ALG${TAG:-}"
scripts/cluster.sh up --hosts 8 --link "$LINK" --prefix simv >/dev/null
rm -f "$OUT/$tag.rx"
bench/sim/rerun/qdisc-trace.sh simv-br "$OUT/$tag.rx" &
TR=$!
sleep 0.2
TUTTI_TUNE=model timeout 300 scripts/cluster.sh launch --prefix simv --hosts 8 --ranks-per-host 1 \
  --no-label --timeout 280 -- "$BIN" perf "$COLL" -b "$SIZE" -e "$SIZE" -c 0 -w 1 -i 2 -a "$ALG" \
  >"$OUT/$tag.txt" 2>&1 || echo "$tag failed"
sleep 0.2
kill "$TR"; wait "$TR" 2>/dev/null || true
grep -E "^ +[0-9]+ " "$OUT/$tag.txt" | awk -v t="$tag" '{print t, "time_us=" $6}'

#!/bin/bash
# sim_validate.sh: `tutti perf` measured on the namespace cluster (cluster.sh, tbf-limited
# links) against `tutti sim`'s prediction for the algorithm each call ran.
#
# Usage (root; take the bench lock): flock /work/bench.lock scripts/sim_validate.sh
#   SHAPES="2x1 4x1 2x2 2x4 8x1" COLLS="all_reduce all_gather reduce_scatter broadcast"
#   LINK=1gbit SIZES="-b 64K -e 16M -f 4" CLUSTER=bench/sim/ns-1g.toml OUT=bench/sim
# Writes OUT/SHAPE-COLL.json (measured), then scripts/sim_compare.py prints the table.
set -eu
BIN=${BIN:-target/release/tutti}
LINK=${LINK:-1gbit}
OUT=${OUT:-bench/sim}
SIZES=${SIZES:--b 64K -e 16M -f 4}
SHAPES=${SHAPES:-2x1 4x1 2x2 2x4 8x1}
COLLS=${COLLS:-all_reduce all_gather reduce_scatter broadcast}
mkdir -p "$OUT"
for shape in $SHAPES; do
  H=${shape%x*}; K=${shape#*x}
  scripts/cluster.sh up --hosts "$H" --link "$LINK" --prefix simv >/dev/null
  for coll in $COLLS; do
    # TUTTI_TUNE=model: Auto runs the cost model's pick, no online trials.
    TUTTI_TUNE=model timeout 300 scripts/cluster.sh launch --prefix simv --hosts "$H" \
      --ranks-per-host "$K" --no-label --timeout 280 -- \
      "$BIN" perf "$coll" $SIZES -c 0 --json "$OUT/$shape-$coll.json" >"$OUT/$shape-$coll.txt" 2>&1 \
      || echo "$shape $coll: failed (see $OUT/$shape-$coll.txt)"
  done
done
scripts/cluster.sh down --prefix simv >/dev/null

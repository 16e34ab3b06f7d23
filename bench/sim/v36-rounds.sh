#!/bin/bash
# v36-rounds.sh: the validation's 1 Gbit/s cells, ROUNDS rounds, each shape's run under the bench
# lock on its own (others interleave): BASE/rR/SHAPE-COLL.json, 64 KiB - 64 MiB.
#   ROUNDS=3 SHAPES="8x1 2x1 4x1 2x2" BASE=bench/sim/v36 bench/sim/v36-rounds.sh
#   scripts/sim_compare.py bench/sim/ns-1g.toml bench/sim/v36/r*   (median per cell over rounds)
set -u
ROUNDS=${ROUNDS:-3}; SHAPES=${SHAPES:-8x1 2x1 4x1 2x2}; BASE=${BASE:-bench/sim/v36}; FIRST=${FIRST:-1}
for r in $(seq "$FIRST" "$ROUNDS"); do
  for s in $SHAPES; do
    OUT=$BASE/r$r SHAPES=$s SIZES="-b 64K -e 64M -f 4" flock /work/bench.lock scripts/sim_validate.sh
    echo "round $r $s done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done

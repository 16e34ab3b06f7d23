#!/bin/bash
# Usage (root): bench/sim/rerun/hd-8x1-rounds.sh  (takes the bench lock per round)
# 5 rounds of the two 8x1 halving-doubling cells, each round under the exclusive lock.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=bench/sim/rerun/hd-8x1
mkdir -p $OUT
for r in 1 2 3 4 5; do
  flock /work/bench.lock bash -c "
    scripts/cluster.sh up --hosts 8 --link 1gbit --prefix simh >/dev/null
    for cell in 'all_reduce 16M' 'reduce_scatter 1M'; do
      set -- \$cell
      TUTTI_TUNE=model timeout 300 scripts/cluster.sh launch --prefix simh --hosts 8 --ranks-per-host 1 --no-label --timeout 280 -- \
        target/release/tutti perf \$1 -b \$2 -e \$2 -c 0 --json $OUT/r$r-\$1-\$2.json > $OUT/r$r-\$1-\$2.txt 2>&1 || echo \"r$r \$1 failed\"
    done
    uptime > $OUT/r$r-uptime.txt
  "
  echo "round $r done $(date -u)"
  sleep 20
done
flock /work/bench.lock scripts/cluster.sh down --prefix simh >/dev/null

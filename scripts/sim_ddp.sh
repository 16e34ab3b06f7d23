#!/bin/bash
# sim_ddp.sh: the DDP step of python/examples/ddp_torch.py --time (backend tutti) on 1, 2 and 4
# namespace hosts (one rank each, scripts/cluster.sh, tbf LINK), and its compute alone (one
# process, no DDP; and HOSTS_MAX processes at once, as the ranks share this machine's cores).
# Then predicts with tutti sim CLUSTER step --grad-bytes G --compute-ms C --step-1-ms S
# --hosts H for H = 2 and 4 (C: the plain compute's median; S: the 1-host DDP step's median,
# one rank under the framework), into $OUT/sim-H.txt.
#
# Usage (root; take the bench lock): flock /work/bench.lock scripts/sim_ddp.sh
#   PY=.venv/bin/python LINK=1gbit ARGS="--batch 128 --steps 10 --warmup 3" OUT=bench/sim/ddp
#   GRAD_BYTES=12763168 (the MLP's gradients: also timed alone with tutti perf all_reduce)
#   CLUSTER=bench/sim/ns-1g.toml PREFIX=simd (namespace prefix; not another job's)
set -eu
PY=${PY:-.venv/bin/python}
LINK=${LINK:-1gbit}
ARGS=${ARGS:---batch 128 --steps 10 --warmup 3}
OUT=${OUT:-bench/sim/ddp}
CLUSTER=${CLUSTER:-bench/sim/ns-1g.toml}
PREFIX=${PREFIX:-simd}
EX=python/examples/ddp_torch.py
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$PY" $EX --time --local $ARGS > "$OUT/local-1.txt" 2>&1
for i in 1 2 3 4; do "$PY" $EX --time --local $ARGS > "$OUT/local-4-$i.txt" 2>&1 & done
wait
for H in 1 2 4; do
  scripts/cluster.sh up --hosts "$H" --link "$LINK" --prefix "$PREFIX" >/dev/null
  timeout 300 scripts/cluster.sh launch --prefix "$PREFIX" --hosts "$H" --ranks-per-host 1 --timeout 280 -- \
    "$PY" $EX --time $ARGS > "$OUT/ddp-$H.txt" 2>&1 || echo "ddp $H hosts: failed (see $OUT/ddp-$H.txt)"
  # the gradients' AllReduce alone (the MLP's 12763168 bytes), as tutti perf measures it
  [ "$H" -gt 1 ] && TUTTI_TUNE=model timeout 120 scripts/cluster.sh launch --prefix "$PREFIX" --hosts "$H" \
    --ranks-per-host 1 --no-label --timeout 100 -- target/release/tutti perf all_reduce \
    -b "${GRAD_BYTES:-12763168}" -e "${GRAD_BYTES:-12763168}" -c 0 > "$OUT/perf-$H.txt" 2>&1
done
scripts/cluster.sh down --prefix "$PREFIX" >/dev/null
grep -h "timed:" "$OUT"/*.txt
grep -H "^ *[0-9]" "$OUT"/perf-*.txt
# The prediction, from the two measured medians: compute alone, and one rank's step under DDP.
median() { sed -n 's/.*step_ms median \([0-9.]*\).*/\1/p' "$1" | head -1; }
C=$(median "$OUT/local-1.txt")
S=$(median "$OUT/ddp-1.txt")
for H in 2 4; do
  target/release/tutti sim "$CLUSTER" --hosts "$H" step --grad-bytes "${GRAD_BYTES:-12763168}" \
    --compute-ms "$C" --step-1-ms "$S" > "$OUT/sim-$H.txt"
  echo "predicted, $H hosts (--compute-ms $C --step-1-ms $S): $(grep '^step on' "$OUT/sim-$H.txt")"
done

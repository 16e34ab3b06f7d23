#!/bin/bash
# hd-cause.sh: forced ring vs halving-doubling AllReduce on the 8 x 1 namespace cluster, with the
# machine's CPU use (from /proc/stat) over each run. Run under the bench lock:
#   LINK=1gbit SIZE=16M OUT=bench/sim/rerun/hd-cause flock /work/bench.lock bench/sim/rerun/hd-cause.sh
set -eu
BIN=${BIN:-target/release/tutti}
LINK=${LINK:-1gbit}; SIZE=${SIZE:-16M}; H=${H:-8}; K=${K:-1}
OUT=${OUT:-bench/sim/rerun/hd-cause}; ALGS=${ALGS:-ring halving_doubling}
ITERS=${ITERS:-5}; COLL=${COLL:-all_reduce}
mkdir -p "$OUT"
# /proc/stat: busy (user+nice+system+irq+softirq) and idle (idle+iowait) ticks; user, system, softirq
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6, $2+$3, $4, $8}' /proc/stat; }
scripts/cluster.sh up --hosts "$H" --link "$LINK" --prefix simv >/dev/null
# TBF_LAT=5ms: every tbf of the cluster with that queue (cluster.sh's is 50ms), same rate and burst
if [ -n "${TBF_LAT:-}" ]; then
  for ((h = 0; h < H; h++)); do
    tc -n "simv-h$h" qdisc replace dev eth0 root tbf rate "$LINK" burst 262144 latency "$TBF_LAT"
    tc -n simv-br qdisc replace dev "h$h" root tbf rate "$LINK" burst 262144 latency "$TBF_LAT"
  done
fi
# SSAI=0: no TCP slow start after idle in the cluster's hosts (a per-namespace sysctl)
if [ -n "${SSAI:-}" ]; then
  for ((h = 0; h < H; h++)); do ip netns exec "simv-h$h" sysctl -qw net.ipv4.tcp_slow_start_after_idle="$SSAI"; done
fi
for a in $ALGS; do
  read -r b0 i0 u0 s0 q0 < <(cpu)
  tag="${H}x${K}-$LINK-$COLL-$SIZE-$a${TAG:-}"
  TUTTI_TUNE=model timeout 300 scripts/cluster.sh launch --prefix simv --hosts "$H" \
    --ranks-per-host "$K" --no-label --timeout 280 -- \
    "$BIN" perf "$COLL" -b "$SIZE" -e "$SIZE" -c 0 -w 2 -i "$ITERS" -a "$a" \
    --json "$OUT/$tag.json" >"$OUT/$tag.txt" 2>&1 || echo "$tag failed"
  read -r b1 i1 u1 s1 q1 < <(cpu)
  busy=$(awk -v b=$((b1-b0)) -v i=$((i1-i0)) 'BEGIN{printf "%.0f", 100*b/(b+i)}')
  t=$(grep -E "^ +[0-9]+ " "$OUT/$tag.txt" | awk '{print $6}' | head -1)
  split=$(awk -v u=$((u1-u0)) -v s=$((s1-s0)) -v q=$((q1-q0)) -v b=$((b1-b0)) -v i=$((i1-i0)) \
    'BEGIN{printf "user=%.0f%% sys=%.0f%% softirq=%.0f%%", 100*u/(b+i), 100*s/(b+i), 100*q/(b+i)}')
  echo "$tag time_us=$t cpu_busy=${busy}% $split load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/summary.txt"
done
scripts/cluster.sh down --prefix simv >/dev/null

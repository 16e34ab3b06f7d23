#!/bin/bash
# tcp_loopback.sh: tutti forced over TCP on loopback (TUTTI_TRANSPORT=tcp), next to what
# iperf3 carries over loopback in the same run, and optionally next to other tutti builds or
# settings.
#
# Usage: bench/tcp_loopback.sh [-r ROUNDS] [-c COLLS] [-b MIN] [-e MAX] [-n RANKS]
#                              [--run LABEL=ENV...]... [--bin LABEL=PATH]... [--no-build]
#   -r ROUNDS   rounds (default 3); each round measures iperf3 (1 and 2 streams, 3 s each)
#               and then every collective with every variant, so variants alternate
#   -c COLLS    comma list of tutti perf collectives (default all_reduce,send_recv,broadcast,
#               all_gather)
#   -b, -e      size range, x4 steps (default 1M .. 256M)
#   -n RANKS    ranks (default 2)
#   --run L=E   a variant: this build with environment E (space-separated NAME=VALUE), labelled
#               L, e.g. --run "io=TUTTI_TCP_IO_THREAD=1"; default one variant "tutti" with none
#   --bin L=P   a variant: another tutti binary P (e.g. built from an older commit), labelled L
#   --no-build  do not run cargo build --release -p tutti-cli
# Before each run it waits (up to $QUIET_WAIT seconds, default 120) for the machine to be
# >= 90% idle for 2 s: other work on a small machine easily halves TCP numbers.
# Output: per collective and size, the median busbw (GB/s, nccl-tests definition) of each
# variant over the rounds and, in brackets, its share of iperf3's 2-stream median; then what
# loopback carried (GB/s: the bytes all ranks sent per second, busbw times the links the
# collective keeps busy: n ranks for all_reduce, all_gather, reduce_scatter, all_to_all and
# send_recv, n - 1 for broadcast and reduce; nccl-tests' busbw is one link's rate) and, in
# brackets, its share of iperf3's 2-stream median, which is also all bytes through loopback
# per second. Raw outputs go to $OUT (default /tmp/tutti-bench/tcp_loopback.<time>).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 colls=all_reduce,send_recv,broadcast,all_gather min=1M max=256M n=2 build=1
labels=() kinds=() specs=()
while [ $# -gt 0 ]; do
  case $1 in
    -r) rounds=$2; shift 2 ;;
    -c) colls=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --run) labels+=("${2%%=*}"); kinds+=(env); specs+=("${2#*=}"); shift 2 ;;
    --bin) labels+=("${2%%=*}"); kinds+=(bin); specs+=("${2#*=}"); shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ ${#labels[@]} -gt 0 ] || { labels=(tutti); kinds=(env); specs=(""); }
OUT=${OUT:-/tmp/tutti-bench/tcp_loopback.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
command -v iperf3 > /dev/null || { echo "needs iperf3 (apt-get install iperf3)" >&2; exit 2; }
if [ $build = 1 ]; then
  (cd "$ROOT" && cargo build --release -p tutti-cli > "$OUT/build.txt" 2>&1)
fi
BIN=$ROOT/target/release/tutti

wait_quiet() {
  local max=$((2 * ${QUIET_WAIT:-120})) t=0 ok=0 u n s i w q sq st u2 n2 s2 i2 w2 q2 sq2 st2 b id
  while :; do
    read -r _ u n s i w q sq st _ < /proc/stat
    sleep 0.5
    read -r _ u2 n2 s2 i2 w2 q2 sq2 st2 _ < /proc/stat
    b=$(((u2 + n2 + s2 + q2 + sq2 + st2) - (u + n + s + q + sq + st)))
    id=$(((i2 + w2) - (i + w)))
    if [ $((100 * id / (b + id + 1))) -ge 90 ]; then ok=$((ok + 1)); else ok=0; fi
    t=$((t + 1))
    if [ $ok -ge 4 ] || [ $t -ge $max ]; then return 0; fi
  done
}

port=$((5300 + RANDOM % 500))
for r in $(seq "$rounds"); do
  for p in 1 2; do
    wait_quiet
    iperf3 -s -1 -p $port > /dev/null 2>&1 &
    sleep 0.5
    # GB/s = Gbit/s / 8, from the receiver's summary.
    iperf3 -c 127.0.0.1 -p $port -P $p -t 3 -f g 2>&1 | grep receiver | tail -1 |
      awk '{for (i = 1; i <= NF; i++) if ($(i+1) == "Gbits/sec") print $i / 8}' > "$OUT/iperf.P$p.r$r"
    wait
  done
  for c in ${colls//,/ }; do
    for v in "${!labels[@]}"; do
      wait_quiet
      if [ "${kinds[$v]}" = bin ]; then bin=${specs[$v]}; envs=(); else bin=$BIN; read -ra envs <<< "${specs[$v]}"; fi
      env "${envs[@]}" TUTTI_TRANSPORT=tcp "$bin" perf "$c" -n "$n" -b "$min" -e "$max" -f 4 \
        > "$OUT/$c.${labels[$v]}.r$r.txt" 2>&1 || true
    done
  done
done

med() { sort -g | awk '{v[NR]=$1} END{if (NR == 0) print "nan"; else print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ip1=$(cat "$OUT"/iperf.P1.r* | med)
ip2=$(cat "$OUT"/iperf.P2.r* | med)
{
  echo "# TCP over loopback, $n ranks, $rounds round(s), median busbw in GB/s, then what loopback carried (GB/s, all ranks' sends); (x%) = share of iperf3 -P 2"
  echo "# iperf3 loopback: 1 stream $ip1 GB/s, 2 streams $ip2 GB/s (medians: $(cat "$OUT"/iperf.P1.r* | tr '\n' ' ')/ $(cat "$OUT"/iperf.P2.r* | tr '\n' ' '))"
  for c in ${colls//,/ }; do
    # Links kept busy, each at busbw (see the header).
    case $c in
      all_reduce | all_gather | reduce_scatter | all_to_all | send_recv) links=$n ;;
      broadcast | reduce) links=$((n - 1)) ;;
      *) links=0 ;;
    esac
    printf '%-12s %10s' "$c" size
    for l in "${labels[@]}"; do printf ' %16s %16s' "$l" "carried"; done
    echo
    sizes=$(awk '/^ +[0-9]/{print $1}' "$OUT/$c.${labels[0]}.r1.txt" 2> /dev/null)
    for s in $sizes; do
      printf '%-12s %10s' "" "$s"
      for l in "${labels[@]}"; do
        m=$(cat "$OUT/$c.$l".r*.txt 2> /dev/null | awk -v s="$s" '/^ +[0-9]/ && $1 == s {print $8}' | med)
        printf ' %7.3f (%4.0f%%)' "$m" "$(awk -v m="$m" -v i="$ip2" 'BEGIN{print 100 * m / i}')"
        if [ "$links" -gt 0 ]; then
          printf ' %7.3f (%4.0f%%)' "$(awk -v m="$m" -v k="$links" 'BEGIN{print m * k}')" \
            "$(awk -v m="$m" -v k="$links" -v i="$ip2" 'BEGIN{print 100 * m * k / i}')"
        else
          printf ' %16s' -
        fi
      done
      echo
    done
  done
  echo "# raw outputs: $OUT"
} | tee "$OUT/table.txt"

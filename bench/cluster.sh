#!/bin/bash
# bench/cluster.sh: tutti's collectives across a 2-host namespace cluster with rate-limited links,
# next to what the link itself carries (iperf3, measured in the same run).
#
# Usage: bench/cluster.sh [--link RATE] [--hosts H] [--rph "1 2"] [--min SIZE] [--max SIZE]
#                         [--secs S] [--colls LIST] [--tool auto|perf|worker] [--iperf-secs S]
#                         [--algos LIST] [--prefix NAME] [--out DIR]
#   --link   tbf rate of every host's link, each way (default 1gbit; "none" for no limit)
#   --hosts  hosts in the cluster (default 2)
#   --rph    ranks per host to run, a list (default "1 2")
#   --min, --max  size range, stepping by 4x (default 1M .. 64M; the target is about >= 16M)
#   --secs   seconds of timed calls per size (default 1)
#   --colls  comma list (default all_reduce,broadcast,reduce,all_gather,reduce_scatter,
#            all_to_all,gather,scatter)
#   --tool   perf: target/release/tutti perf (built with cargo build --release -p tutti-cli);
#            worker: the bench_worker of crates/tutti/tests/multihost.rs (built with
#            cargo test --release --test multihost --no-run); auto (default): perf if it builds.
#   --algos  comma list of TUTTI_ALGO values to run each collective with (default auto: the
#            tuner decides). E.g. "auto,ring,hierarchical": the table then also gives each
#            algorithm's time over the ring's ("x ring") — with ranks numbered host by host, the
#            flat ring is the host-ordered one.
#   --out    where the CSV files and the log go (default /tmp/tutti-bench/cluster.<time>)
#   --env K=V  one more environment variable for every rank (repeatable), e.g.
#            --env TUTTI_TCP_IO_THREAD=1
# Needs root. Takes the cluster down when it ends, also on failure or Ctrl-C.
#
# Output: one row per collective, ranks and size with time, algbw, busbw (nccl-tests: algbw x
# 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all, gather, scatter,
# 1 for broadcast and reduce, n = ranks) and linkbw, the rate each host's link has to carry: the
# same factors with n = hosts (x ranks per host for all_to_all, whose size is per rank).
# "link%" is linkbw / the iperf3 rate (the best of 1 and 2 streams). With 1 rank per host,
# linkbw = busbw.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=$ROOT/scripts/cluster.sh
LINK=1gbit HOSTS=2 RPH="1 2" MIN=1M MAX=64M SECS=1 TOOL=auto IPERF_SECS=5
COLLS=all_reduce,broadcast,reduce,all_gather,reduce_scatter,all_to_all,gather,scatter
PREFIX=tbench OUTDIR="" ALGOS=auto
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "bench/cluster.sh: $*" >&2; exit 1; }
XENV=()
while [ $# -gt 0 ]; do
  case $1 in
    --link) LINK=${2:?}; shift ;;
    --hosts) HOSTS=${2:?}; shift ;;
    --rph) RPH=${2:?}; shift ;;
    --min) MIN=${2:?}; shift ;;
    --max) MAX=${2:?}; shift ;;
    --secs) SECS=${2:?}; shift ;;
    --colls) COLLS=${2:?}; shift ;;
    --tool) TOOL=${2:?}; shift ;;
    --iperf-secs) IPERF_SECS=${2:?}; shift ;;
    --prefix) PREFIX=${2:?}; shift ;;
    --algos) ALGOS=${2:?}; shift ;;
    --out) OUTDIR=${2:?}; shift ;;
    --env) XENV+=(--env "${2:?}"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
OUTDIR=${OUTDIR:-/tmp/tutti-bench/cluster.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
LOG=$OUTDIR/log.txt
exec > >(tee -a "$LOG") 2>&1
echo "# bench/cluster.sh $(date '+%F %T'): $HOSTS hosts, link ${LINK}, ranks per host: $RPH, sizes $MIN..$MAX, $(nproc) CPUs"
echo "# results in $OUTDIR"

# ---- the program ----
cd "$ROOT" || exit 1
PROG=()
if [ "$TOOL" = auto ] || [ "$TOOL" = perf ]; then
  echo "# building tutti perf: cargo build --release -p tutti-cli"
  if cargo build --release -p tutti-cli > "$OUTDIR/build-cli.txt" 2>&1 && target/release/tutti perf --help > /dev/null 2>&1; then
    TOOL=perf
    PROG=("$ROOT/target/release/tutti" perf)
  elif [ "$TOOL" = perf ]; then
    tail -20 "$OUTDIR/build-cli.txt"; die "tutti perf did not build"
  else
    echo "# tutti perf did not build (see $OUTDIR/build-cli.txt); using the multihost bench worker"
    TOOL=worker
  fi
fi
if [ "$TOOL" = worker ]; then
  echo "# building the bench worker: cargo test --release -p tutti --test multihost --no-run"
  out=$(cargo test --release -p tutti --test multihost --no-run 2>&1) || { echo "$out" | tail -20; die "build failed"; }
  exe=$(echo "$out" | grep -o 'target/release/deps/multihost-[0-9a-f]*' | tail -1)
  [ -x "$ROOT/$exe" ] || die "cannot find the multihost test binary in: $out"
  PROG=("$ROOT/$exe" --exact bench_worker --include-ignored --nocapture --test-threads=1 -q)
fi
command -v iperf3 > /dev/null || { echo "# apt-get install -y iperf3"; apt-get install -y iperf3 > /dev/null 2>&1 || die "cannot install iperf3"; }

# ---- the cluster ----
cleanup() { "$CLUSTER" down --prefix "$PREFIX" > /dev/null 2>&1; }
trap cleanup EXIT
trap 'exit 130' INT TERM
"$CLUSTER" up --hosts "$HOSTS" --link "$LINK" --prefix "$PREFIX" --owner $$ || die "cluster up failed"
ADDR1=$("$CLUSTER" addr --prefix "$PREFIX" 1)

# ---- the link: iperf3 from host 0 to host 1 ----
# iperf P [--bidir]: Gbit/s received by host 1 (with --bidir: the mean of the two directions)
iperf() {
  local P=$1 out gbit
  shift
  "$CLUSTER" exec --prefix "$PREFIX" 1 iperf3 -s -1 -p 5301 > /dev/null 2>&1 &
  local spid=$!
  sleep 0.5
  out=$("$CLUSTER" exec --prefix "$PREFIX" 0 iperf3 -c "$ADDR1" -p 5301 -t "$IPERF_SECS" -P "$P" -f m "$@" 2>&1)
  wait "$spid" 2> /dev/null
  echo "$out" >> "$OUTDIR/iperf3.txt"
  # the "receiver" lines of the summary ([SUM] with several streams; TX-C/RX-C with --bidir)
  gbit=$(echo "$out" | awk -v P="$P" '
    /receiver/ && (P == 1 || /SUM/) { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") { s += $(i - 1); k++ } }
    END { if (k) printf "%.3f\n", s / k / 1000 }')
  [ -n "$gbit" ] || { echo "iperf3 -P $P $* failed:" >&2; echo "$out" | tail -3 >&2; return 1; }
  echo "$gbit"
}
IP1=$(iperf 1) || die "iperf3 failed"
IP2=$(iperf 2) || die "iperf3 failed"
IPB=$(iperf 1 --bidir) || IPB=0
LINK_GBPS=$(awk -v a="$IP1" -v b="$IP2" 'BEGIN { m = a > b ? a : b; printf "%.4f", m / 8 }')
printf "# iperf3 host 0 -> host 1: 1 stream %.3f Gbit/s, 2 streams %.3f Gbit/s, both ways at once %.3f Gbit/s each; the link carries %s GB/s\n" "$IP1" "$IP2" "$IPB" "$LINK_GBPS"
echo "iperf3,$HOSTS,$LINK,$IP1,$IP2,$IPB,$LINK_GBPS" > "$OUTDIR/iperf3.csv"

# ---- tutti ----
# The tuner's cost model is measured when a communicator is created and cached per host layout
# in $XDG_CACHE_HOME/tutti for an hour. The layout of this cluster is the same with and without
# a rate limit, so a fresh cache makes it measure these links, not ones measured earlier.
CACHE=$OUTDIR/cache
mkdir -p "$CACHE"
ALL=$OUTDIR/results.csv
echo "tool,hosts,rph,algo,coll,nranks,size_bytes,in_place,time_us,algbw_GBps,busbw_GBps,linkbw_GBps,link_frac,wrong" > "$ALL"
for K in $RPH; do
 for A in ${ALGOS//,/ }; do
  AENV=("${XENV[@]}")
  [ "$A" = auto ] || AENV+=(--env "TUTTI_ALGO=$A")
  tag=${HOSTS}x$K.$A
  csv=$OUTDIR/tutti.$tag.csv
  echo "# $HOSTS hosts x $K ranks, TUTTI_ALGO=$A: ${PROG[*]}"
  if [ "$TOOL" = perf ]; then
    rm -f "$csv"
    for c in ${COLLS//,/ }; do
      "$CLUSTER" launch --prefix "$PREFIX" --ranks-per-host "$K" --timeout 900 --env XDG_CACHE_HOME="$CACHE" "${AENV[@]}" -- \
        "${PROG[@]}" "$c" -b "$MIN" -e "$MAX" -f 4 -T "$SECS" -c 1 --csv "$csv.$c" > "$OUTDIR/perf.$tag.$c.txt" 2>&1 ||
        { tail -20 "$OUTDIR/perf.$tag.$c.txt"; die "tutti perf $c failed on $HOSTS x $K with TUTTI_ALGO=$A"; }
      if [ -f "$csv" ]; then tail -n +2 "$csv.$c" >> "$csv"; else cp "$csv.$c" "$csv"; fi
    done
  else
    "$CLUSTER" launch --prefix "$PREFIX" --ranks-per-host "$K" --timeout 900 --no-label --env XDG_CACHE_HOME="$CACHE" "${AENV[@]}" \
      --env TUTTI_MH_ROLE=rank --env BENCH_MIN="$MIN" --env BENCH_MAX="$MAX" --env BENCH_SECS="$SECS" \
      --env BENCH_COLLS="$COLLS" -- "${PROG[@]}" > "$OUTDIR/worker.$tag.txt" 2>&1 ||
      { tail -20 "$OUTDIR/worker.$tag.txt"; die "bench worker failed on $HOSTS x $K with TUTTI_ALGO=$A"; }
    grep -E '^(coll,|[a-z_]+,[0-9]+,)' "$OUTDIR/worker.$tag.txt" > "$csv"
  fi
  # columns by name, so that both tools' CSV files work
  awk -F, -v tool="$TOOL" -v H="$HOSTS" -v K="$K" -v A="$A" -v link="$LINK_GBPS" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
      c = $col["coll"]; n = $col["nranks"]; alg = $col["algbw_GBps"]
      if (c == "all_reduce") f = 2 * (H - 1) / H
      else if (c == "broadcast" || c == "reduce") f = 1
      else if (c == "all_to_all") f = K * (H - 1) / H
      else f = (H - 1) / H
      lb = alg * f
      ip = ("in_place" in col) ? $col["in_place"] : 0
      wrong = ("wrong" in col) ? $col["wrong"] : ""
      printf "%s,%d,%d,%s,%s,%d,%d,%s,%s,%s,%s,%.4f,%.3f,%s\n", tool, H, K, A, c, n, $col["size_bytes"], ip, $col["time_us"], alg, $col["busbw_GBps"], lb, (link > 0 ? lb / link : 0), wrong
    }' "$csv" >> "$ALL"
 done
done

# ---- the table ----
echo
printf "link: %s tbf each way; iperf3 %.3f / %.3f Gbit/s (1 / 2 streams), %.3f Gbit/s each way with --bidir; link%% is of %s GB/s\n" "$LINK" "$IP1" "$IP2" "$IPB" "$LINK_GBPS"
printf "%-22s %-6s %-16s %10s %11s %9s %9s %9s %6s %6s %7s\n" collective ranks algo size time_us algbw busbw linkbw link% wrong "x ring"
# "x ring": the ring's time over this row's (same collective, ranks, size, placement); above 1 is faster.
tail -n +2 "$ALL" | awk -F, '
  { row[NR] = $0; if ($4 == "ring") ring[$2, $3, $5, $7, $8] = $9 }
  END {
    for (i = 1; i <= NR; i++) {
      split(row[i], f, ",")
      s = f[7]; u = "B"; if (s >= 1048576) { s /= 1048576; u = "M" } else if (s >= 1024) { s /= 1024; u = "K" }
      name = f[5] (f[8] == 1 ? " (in place)" : "")
      k = f[2] SUBSEP f[3] SUBSEP f[5] SUBSEP f[7] SUBSEP f[8]
      x = (k in ring && f[9] > 0) ? sprintf("%.2f", ring[k] / f[9]) : "-"
      printf "%-22s %-6s %-16s %9.0f%s %11.0f %9.4f %9.4f %9.4f %5.1f%% %6s %7s\n", name, f[2] "x" f[3], f[4], s, u, f[9], f[10], f[11], f[12], f[13] * 100, f[14], x
    }
  }'
echo
echo "# CSV: $ALL"

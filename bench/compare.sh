#!/bin/bash
# compare.sh: tutti perf side by side with the peers (Open MPI, MPICH, Gloo), as ratios.
#
# Usage: bench/compare.sh [-c COLL] [-n RANKS] [-b MIN] [-e MAX] [-r ROUNDS] [-t SECS]
#                         [--peers LIST] [--tcp] [--no-setup] [--no-build]
#   -c COLL      all_reduce (default), broadcast, reduce, all_gather, reduce_scatter, all_to_all
#                or send_recv (the peers' spellings allreduce, allgather, alltoall, sendrecv
#                work too). The kit measures no Reduce and no Send/Recv: for those the MPI
#                peers run bench/mpi_perf.sh (bench/peers/mpi_perf.c, the kit's method and
#                launch; MPI_Reduce, or MPI_Sendrecv to rank+1 from rank-1); Gloo is skipped
#   -n RANKS     ranks (default 2)
#   -b MIN       smallest size, K/M/G suffixes allowed (default 8)
#   -e MAX       largest size (default 64M)
#   -r ROUNDS    rounds (default 3). A round runs tutti and then each peer once, so that
#                tutti and the peers alternate; the table shows the median of the rounds.
#   -t SECS      seconds of timed calls per size in each run (default 0.15, the peers' default;
#                Gloo's script has no such option)
#   --peers LIST comma list of openmpi, mpich, gloo (default: openmpi,mpich, plus gloo when
#                $VENV has torch)
#   --tcp        TCP between the ranks for everybody (TUTTI_TRANSPORT=tcp; run_mpi.sh --tcp;
#                Gloo always uses TCP)
#   --no-setup   do not run the kit's setup.sh (which apt-installs Open MPI and MPICH if missing)
#   --no-build   do not build tutti (cargo build --release -p tutti-cli)
#   --table DIR  measure nothing: print the table again from the runs kept in DIR
#                (a $OUT/results/compare-<time> folder; -c must name the same collective)
# Environment:
#   PEERS        the peer kit (default: ../shared/peers next to the repository root)
#   OUT          the kit's output folder (default /tmp/tutti-peers); this script's runs go to
#                $OUT/results/compare-<time>/ (one CSV and log per run, and table.txt)
#   VENV         a venv with torch for Gloo (default $OUT/venv)
#   RUN_TIMEOUT  seconds one run (tutti's or a peer's) may take before it is killed and the
#                script stops (default 900: MPICH over TCP with 4 ranks on 2 cores once hung for
#                80 minutes)
#   QUIET_WAIT   wait up to this many seconds before each run for an idle machine (kit's README)
#   CARGO_TARGET_DIR  where cargo builds (default <repo>/target)
# Columns: tutti's time per call (us) and every implementation's busbw in GB/s (nccl-tests
# definition), medians over rounds; tutti/X is tutti's busbw divided by X's, computed from the
# median times (above 1: tutti is faster); best MPI is the faster of Open MPI and MPICH at
# that size. paired: within each round, the best MPI's time over tutti's in that round (the
# runs follow each other), median over rounds: a slow stretch of the machine that lasts a
# round (it can last minutes, and slow everybody 2-3x) counts against both sides alike. Benchmarks are noisy: repeat, and read small sizes as "within a factor of two".
set -u
set -o pipefail

die() { echo "compare.sh: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

RUN_TIMEOUT=${RUN_TIMEOUT:-900}
COLL=all_reduce N=2 MINB=8 MAXB=64M ROUNDS=3 T=0.15 PEERLIST="" TCP=0 SETUP=1 BUILD=1 TABLE=""
while [ $# -gt 0 ]; do
  case $1 in
    -c) COLL=${2:?-c needs a value}; shift ;;
    -n) N=${2:?-n needs a value}; shift ;;
    -b) MINB=${2:?-b needs a value}; shift ;;
    -e) MAXB=${2:?-e needs a value}; shift ;;
    -r) ROUNDS=${2:?-r needs a value}; shift ;;
    -t) T=${2:?-t needs a value}; shift ;;
    --peers) PEERLIST=${2:?--peers needs a value}; shift ;;
    --peers=*) PEERLIST=${1#--peers=} ;;
    --tcp) TCP=1 ;;
    --no-setup) SETUP=0 ;;
    --no-build) BUILD=0 ;;
    --table) TABLE=${2:?--table needs a folder}; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
if ! [[ $N =~ ^[1-9][0-9]*$ ]]; then die "-n needs a positive number"; fi
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then die "-r needs a positive number"; fi

# tutti's name and the peers' name of the collective.
case ${COLL,,} in
  all_reduce | allreduce) TC=all_reduce PC=allreduce ;;
  broadcast | bcast) TC=broadcast PC=broadcast ;;
  reduce) TC=reduce PC=reduce ;;
  all_gather | allgather) TC=all_gather PC=allgather ;;
  reduce_scatter | reducescatter) TC=reduce_scatter PC=reduce_scatter ;;
  all_to_all | alltoall) TC=all_to_all PC=alltoall ;;
  send_recv | sendrecv) TC=send_recv PC=sendrecv ;;
  *) die "the peers measure allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall and sendrecv, not '$COLL'" ;;
esac

# print_table DIR IMPL...: median busbw per implementation and size from DIR/<impl>.<round>.csv,
# then the ratios.
print_table() {
  local dir=$1
  shift
  awk -F, -v coll="$PC" -v impls="tutti $*" '
    function median(s,   a, k, i, j, t) {
      k = split(s, a, " ")
      for (i = 2; i <= k; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    # busbw ratio tutti/peer at one size = time ratio peer/tutti (times keep more digits)
    function ratio(t, p) { return (t == "" || p == "" || t + 0 == 0) ? "-" : sprintf("%.2f", p / t) }
    FNR == 1 {
      delete col
      for (i = 1; i <= NF; i++) col[$i] = i
      f = FILENAME; sub(/.*\//, "", f); impl = f; sub(/\..*/, "", impl)
      rnd = f; sub(/^[^.]*\./, "", rnd); sub(/\..*/, "", rnd); rounds[rnd] = 1
      next
    }
    {
      c = $col["coll"]; gsub(/_/, "", c); want = coll; gsub(/_/, "", want)
      if (c != want) next
      if (("in_place" in col) && $col["in_place"] == 1) next
      s = $col["size_bytes"] + 0
      v[impl, s] = v[impl, s] " " $col["busbw_GBps"]
      tm[impl, s] = tm[impl, s] " " $col["time_us"]
      tr[impl, s, rnd] = $col["time_us"]
      sizes[s] = 1
    }
    END {
      n = split(impls, im, " ")
      printf "%12s %10s", "size", "tutti_us"
      for (i = 1; i <= n; i++) printf " %9s", im[i]
      for (i = 2; i <= n; i++) printf " %10s", "tutti/" im[i]
      hasmpi = 0
      for (i = 2; i <= n; i++) if (im[i] == "openmpi" || im[i] == "mpich") hasmpi++
      if (hasmpi) printf " %12s %7s %11s", "tutti/bestMPI", "paired", "paired_lohi"
      printf "\n"
      k = 0
      for (s in sizes) order[++k] = s + 0
      for (i = 2; i <= k; i++) { t = order[i]; for (j = i - 1; j >= 1 && order[j] > t; j--) order[j + 1] = order[j]; order[j + 1] = t }
      for (a = 1; a <= k; a++) {
        s = order[a]
        for (i = 1; i <= n; i++) {
          m[i] = ((im[i], s) in v) ? median(v[im[i], s]) : ""
          mt[i] = ((im[i], s) in tm) ? median(tm[im[i], s]) : ""
        }
        printf "%12d %10s", s, mt[1] == "" ? "-" : sprintf("%.2f", mt[1])
        for (i = 1; i <= n; i++) printf " %9s", m[i] == "" ? "-" : sprintf("%.4f", m[i])
        for (i = 2; i <= n; i++) printf " %10s", ratio(mt[1], mt[i])
        if (hasmpi) {
          best = ""
          for (i = 2; i <= n; i++) if ((im[i] == "openmpi" || im[i] == "mpich") && mt[i] != "" && (best == "" || mt[i] + 0 < best + 0)) best = mt[i]
          printf " %12s", ratio(mt[1], best)
          # Paired: within each round, the best MPI time of that round over the
          # time of tutti (run just before it); the median over rounds.
          pr = ""; lo = ""; hi = ""
          for (r in rounds) {
            if (!(("tutti", s, r) in tr)) continue
            b = ""
            for (i = 2; i <= n; i++) if ((im[i] == "openmpi" || im[i] == "mpich") && ((im[i], s, r) in tr) && (b == "" || tr[im[i], s, r] + 0 < b + 0)) b = tr[im[i], s, r]
            if (b != "" && tr["tutti", s, r] + 0 > 0) {
              q = b / tr["tutti", s, r]
              pr = pr " " q
              if (lo == "" || q < lo) lo = q
              if (hi == "" || q > hi) hi = q
            }
          }
          printf " %7s %11s", pr == "" ? "-" : sprintf("%.2f", median(pr)), pr == "" ? "-" : sprintf("%.2f-%.2f", lo, hi)
        }
        printf "\n"
      }
    }' "$dir"/*.csv
}

if [ -n "$TABLE" ]; then
  [ -d "$TABLE" ] || die "--table: no folder $TABLE"
  IMPLS=()
  for impl in openmpi mpich gloo; do
    ls "$TABLE/$impl".*.csv > /dev/null 2>&1 && IMPLS+=("$impl")
  done
  cat "$TABLE/title" 2> /dev/null || echo "# $TABLE"
  print_table "$TABLE" "${IMPLS[@]}"
  exit 0
fi

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2> /dev/null) || die "not inside the tutti repository"
PEERS=${PEERS:-$ROOT/../shared/peers}
[ -d "$PEERS" ] || die "peer kit not found at $PEERS (set PEERS)"
PEERS=$(cd "$PEERS" && pwd)
# The kit's settings (OUT, VENV) and its wait_quiet; sourcing it defines nothing else we use.
# shellcheck source=/dev/null
. "$PEERS/common.sh"
: "${VENV:?common.sh sets VENV}" "${RES:?common.sh sets RES}"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TUTTI=$TARGET/release/tutti

if [ "$BUILD" = 1 ]; then
  note "building tutti (release)"
  (cd "$ROOT" && cargo build --release -q -p tutti-cli) || die "cargo build failed"
fi
[ -x "$TUTTI" ] || die "no $TUTTI (drop --no-build)"
if [ "$SETUP" = 1 ]; then
  note "peer setup: $PEERS/setup.sh"
  "$PEERS/setup.sh" >&2 || die "setup.sh failed"
fi

has_torch() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch" 2> /dev/null; }
if [ -z "$PEERLIST" ]; then
  PEERLIST=openmpi,mpich
  if has_torch; then PEERLIST=$PEERLIST,gloo; else note "no torch in $VENV: Gloo skipped (setup.sh --torch, or VENV=...)"; fi
fi
IMPLS=()
for p in ${PEERLIST//,/ }; do
  case $p in
    openmpi | ompi) IMPLS+=(openmpi) ;;
    mpich) IMPLS+=(mpich) ;;
    gloo)
      has_torch || die "--peers gloo: no torch in $VENV"
      [ "$PC" = alltoall ] && { note "Gloo's benchmark has no alltoall: skipped"; continue; }
      [ "$PC" = reduce ] || [ "$PC" = sendrecv ] && { note "Gloo's benchmark has no $PC: skipped"; continue; }
      IMPLS+=(gloo) ;;
    *) die "unknown peer '$p' (openmpi, mpich, gloo)" ;;
  esac
done

STAMP=$(date +%Y%m%d-%H%M%S)
RUN=$OUT/results/compare-$STAMP
mkdir -p "$RUN" || die "cannot create $RUN"
TENV=()
MPIFLAGS=()
if [ "$TCP" = 1 ]; then
  TENV=(TUTTI_TRANSPORT=tcp)
  MPIFLAGS=(--tcp)
fi

# The CSV a peer script just wrote for LABEL.
# shellcheck disable=SC2012 # the kit names files LABEL.YYYYmmdd-HHMMSS.csv: no odd characters
latest_csv() { ls -t "$RES/$1".*.csv 2> /dev/null | head -n 1; }

for ((r = 1; r <= ROUNDS; r++)); do
  wait_quiet
  note "round $r/$ROUNDS: tutti"
  timeout -k 10 "$RUN_TIMEOUT" env "${TENV[@]}" "$TUTTI" perf "$TC" -n "$N" -b "$MINB" -e "$MAXB" --time "$T" --label tutti \
    --csv "$RUN/tutti.$r.csv" > "$RUN/tutti.$r.txt" 2>&1 || die "tutti perf failed (see $RUN/tutti.$r.txt)"
  for impl in "${IMPLS[@]}"; do
    wait_quiet
    note "round $r/$ROUNDS: $impl"
    label=cmp${STAMP//-/}_${impl}_r$r
    if [ "$impl" = gloo ]; then
      timeout -k 10 "$RUN_TIMEOUT" "$PEERS/run_gloo.sh" -n "$N" -c "$PC" -b "$MINB" -e "$MAXB" -l "$label" > "$RUN/$impl.$r.txt" 2>&1
    elif [ "$PC" = reduce ] || [ "$PC" = sendrecv ]; then
      PEERS=$PEERS timeout -k 10 "$RUN_TIMEOUT" "$ROOT/bench/mpi_perf.sh" --impl "$impl" -c "$PC" -n "$N" -b "$MINB" -e "$MAXB" -t "$T" \
        -l "$label" "${MPIFLAGS[@]}" > "$RUN/$impl.$r.txt" 2>&1
    else
      timeout -k 10 "$RUN_TIMEOUT" "$PEERS/run_mpi.sh" --impl "$impl" -n "$N" -c "$PC" -b "$MINB" -e "$MAXB" -t "$T" -l "$label" \
        "${MPIFLAGS[@]}" > "$RUN/$impl.$r.txt" 2>&1
    fi || die "$impl failed (see $RUN/$impl.$r.txt)"
    csv=$(latest_csv "$label")
    [ -n "$csv" ] || die "$impl wrote no CSV (see $RUN/$impl.$r.txt)"
    cp "$csv" "$RUN/$impl.$r.csv"
  done
done

# One table: median busbw per implementation and size, then the ratios.
transport=$([ "$TCP" = 1 ] && echo tcp || echo "shared memory")
title="# $TC, $N ranks, $MINB .. $MAXB, $transport, median of $ROUNDS round(s), busbw in GB/s"
echo "$title" > "$RUN/title"
{
  echo "$title; $(date '+%F %T'), $(nproc) cpus"
  print_table "$RUN" "${IMPLS[@]}"
} | tee "$RUN/table.txt"
note "runs and table: $RUN"

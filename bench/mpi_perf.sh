#!/bin/bash
# mpi_perf.sh: MPI_Reduce or MPI_Sendrecv under Open MPI or MPICH, launched as the peer kit's
# run_mpi.sh launches coll_perf (the kit measures neither): bench/peers/mpi_perf.c, built into
# $OUT/bin with the implementation's mpicc, results in $OUT/results/LABEL.<time>.csv|txt
# in the kit's CSV format. bench/compare.sh -c reduce|send_recv runs it for the MPI peers.
#
# Usage: bench/mpi_perf.sh [--impl openmpi|mpich] [-c reduce|sendrecv] [-n RANKS] [-b MIN]
#                          [-e MAX] [-t SECS] [-l LABEL] [--tcp]
#   -c      reduce (default: f32 sum, root 0) or sendrecv (to rank+1, from rank-1 at once)
#   --tcp   TCP between the ranks (Open MPI: pml ob1, btl tcp,self; MPICH: no shared memory)
# Environment: PEERS (the kit, default ../shared/peers next to the repository), OUT.
set -u
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2> /dev/null) || {
  echo "mpi_perf.sh: not inside the tutti repository" >&2
  exit 2
}
PEERS=${PEERS:-$ROOT/../shared/peers}
# The kit's OUT, RES, BIN, note, die, stamp, ncpu, is_root, make_out and wait_quiet.
# shellcheck source=/dev/null
. "$PEERS/common.sh"

IMPL=openmpi COLL=reduce N=2 MINB=8 MAXB=256M T=0.15 LABEL="" TCP=0
while [ $# -gt 0 ]; do
  case $1 in
    --impl) IMPL=${2:?--impl needs a value}; shift ;;
    -c) COLL=${2:?-c needs a value}; shift ;;
    -n) N=${2:?-n needs a value}; shift ;;
    -b) MINB=${2:?-b needs a value}; shift ;;
    -e) MAXB=${2:?-e needs a value}; shift ;;
    -t) T=${2:?-t needs a value}; shift ;;
    -l) LABEL=${2:?-l needs a value}; shift ;;
    --tcp) TCP=1 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
case $IMPL in
  openmpi | ompi) IMPL=openmpi ;;
  mpich) ;;
  *) die "--impl must be openmpi or mpich" ;;
esac
case $COLL in
  reduce) ;;
  sendrecv | send_recv) COLL=sendrecv ;;
  *) die "-c must be reduce or sendrecv" ;;
esac
[[ $N =~ ^[1-9][0-9]*$ ]] || die "-n needs a positive number"

make_out
CC=mpicc.$IMPL
MPIRUN=mpirun.$IMPL
PROG=$BIN/mpi_perf.$IMPL
SRC=$ROOT/bench/peers/mpi_perf.c
command -v "$CC" > /dev/null || die "$CC not found (run the kit's setup.sh)"
command -v "$MPIRUN" > /dev/null || die "$MPIRUN not found (run the kit's setup.sh)"
if [ ! -x "$PROG" ] || [ "$SRC" -nt "$PROG" ]; then
  note "building $PROG with $CC"
  "$CC" -O2 -Wall -o "$PROG.tmp.$$" "$SRC" && mv -f "$PROG.tmp.$$" "$PROG" ||
    { rm -f "$PROG.tmp.$$"; die "building mpi_perf failed"; }
fi

# The same launch as the kit's run_mpi.sh: Open MPI binds rank i to core i unless there are
# more ranks than cores; MPICH does not bind.
CPUS=$(ncpu)
ENVV=()
ARGS=(-np "$N")
if [ "$IMPL" = openmpi ]; then
  if is_root; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ARGS+=(--allow-run-as-root)
  fi
  [ "$N" -gt "$CPUS" ] && ARGS+=(--oversubscribe --bind-to none)
  [ "$TCP" = 1 ] && ARGS+=(--mca pml ob1 --mca btl tcp,self)
elif [ "$TCP" = 1 ]; then
  ENVV=(env MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self)
fi
[ -n "$LABEL" ] || LABEL=${IMPL}${N}_$COLL
base=$RES/$LABEL.$(stamp)
CMD=("${ENVV[@]}" "$MPIRUN" "${ARGS[@]}" "$PROG" -c "$COLL" -b "$MINB" -e "$MAXB" -t "$T" -l "$LABEL" -o "$base.csv")
wait_quiet
echo "# $(date '+%F %T') cpus=$CPUS command: ${CMD[*]}" | tee "$base.txt"
set -o pipefail
"${CMD[@]}" 2>&1 | tee -a "$base.txt"
rc=$?
if grep -q FAIL "$base.txt"; then
  echo "# CORRECTNESS FAILURE (see above)" | tee -a "$base.txt"
  rc=1
fi
note "results: $base.csv $base.txt (rc=$rc)"
exit $rc

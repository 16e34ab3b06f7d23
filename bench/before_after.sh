#!/bin/bash
# before_after.sh: one collective, two builds of tutti, alternated in one sitting.
#
# Usage: bench/before_after.sh BEFORE AFTER [-c COLL] [-n RANKS] [-b MIN] [-e MAX]
#                              [-r ROUNDS] [-T SECS] [-o DIR]
#   BEFORE, AFTER  two `tutti` binaries (e.g. a build of the last release in its own
#                  worktree, and target/release/tutti)
#   -c COLL        collective (default all_reduce); -n ranks (default 2)
#   -b/-e          size range (default 8 .. 64M, doubling)
#   -r ROUNDS      rounds (default 5). A round runs both builds once, in alternating order
#                  (before first in odd rounds, after first in even ones)
#   -T SECS        seconds of timed calls per size per run (default 0.1)
#   -o DIR         keep the CSVs and the table here (default a fresh /tmp folder)
# Columns (out-of-place rows): each build's median time per call over the rounds (us), and
# `paired`: within each round, after's time over before's (the two runs follow each other,
# so a slow stretch of the machine counts against both), median over rounds, with its
# smallest and largest value. Above 1 the new build is slower; `slower` marks a paired
# median over 1.05. Benchmarks are noisy: read one run as a sample, not a verdict.
set -eu -o pipefail

die() { echo "before_after.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] || die "usage: bench/before_after.sh BEFORE AFTER [options] (see the header)"
BEFORE=$1 AFTER=$2
shift 2
[ -x "$BEFORE" ] || die "$BEFORE is not an executable"
[ -x "$AFTER" ] || die "$AFTER is not an executable"
COLL=all_reduce N=2 MINB=8 MAXB=64M ROUNDS=5 T=0.1 OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    -c) COLL=${2:?}; shift ;;
    -n) N=${2:?}; shift ;;
    -b) MINB=${2:?}; shift ;;
    -e) MAXB=${2:?}; shift ;;
    -r) ROUNDS=${2:?}; shift ;;
    -T) T=${2:?}; shift ;;
    -o) OUT=${2:?}; shift ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
[ "$ROUNDS" -ge 1 ] 2>/dev/null || die "-r needs a positive number"
OUT=${OUT:-$(mktemp -d /tmp/tutti-before-after-XXXXXX)}
mkdir -p "$OUT"

run() { # label binary round
  "$2" perf "$COLL" -n "$N" -b "$MINB" -e "$MAXB" -c 0 -T "$T" --label "$1" \
    --csv "$OUT/$1-$3.csv" > "$OUT/$1-$3.log" 2>&1 || die "$2 failed (see $OUT/$1-$3.log)"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "# round $r of $ROUNDS" >&2
  if [ $((r % 2)) = 1 ]; then run before "$BEFORE" "$r"; run after "$AFTER" "$r"
  else run after "$AFTER" "$r"; run before "$BEFORE" "$r"; fi
done

python3 - "$OUT" "$ROUNDS" "$COLL" "$N" <<'EOF' | tee "$OUT/table.txt"
import csv, statistics, sys
out, rounds, coll, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(label, r):
    with open(f"{out}/{label}-{r}.csv") as f:
        return {int(row["size_bytes"]): float(row["time_us"])
                for row in csv.DictReader(f) if row["in_place"] == "0"}
b = [load("before", r) for r in range(1, rounds + 1)]
a = [load("after", r) for r in range(1, rounds + 1)]
print(f"# {coll}, {n} ranks, {rounds} rounds, out-of-place; times in us; paired = after/before per round")
print(f"{'size':>10} {'before_us':>11} {'after_us':>11} {'paired':>8} {'min':>7} {'max':>7}")
worst = []
for s in sorted(b[0]):
    ratios = [ai[s] / bi[s] for ai, bi in zip(a, b) if s in ai and s in bi and bi[s] > 0]
    med = statistics.median(ratios)
    flag = "  slower" if med > 1.05 else ""
    if med > 1.05:
        worst.append(s)
    print(f"{s:>10} {statistics.median(x[s] for x in b):>11.2f} {statistics.median(x[s] for x in a):>11.2f}"
          f" {med:>8.3f} {min(ratios):>7.3f} {max(ratios):>7.3f}{flag}")
print(f"# sizes with a paired median over 1.05: {worst if worst else 'none'}")
EOF
echo "# runs kept in $OUT" >&2

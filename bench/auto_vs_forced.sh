#!/bin/bash
# Auto against every forced algorithm: `tutti perf COLL -n N -a ALG` for each
# algorithm, 3 runs each; prints the minimum time per call (us) per size and
# Auto's time over the best forced one. Usage: bench/auto_vs_forced.sh N [COLL]
# Note: a forced run goes through perf's -a path, which costs a little per
# call that Auto does not pay; small sizes therefore flatter Auto.
set -euo pipefail
N=${1:-2}
C=${2:-all_reduce}
cd "$(git rev-parse --show-toplevel)"
cargo build --release -q -p tutti-cli
out=$(mktemp)
for rep in 1 2 3; do
  for a in auto ring tree double_tree halving_doubling direct two_shot; do
    target/release/tutti perf "$C" -n "$N" -b 8 -e 64M -f 4 -a "$a" 2>/dev/null |
      grep -E '^ +[0-9]' | awk -v a="$a" '{print a, $1, $6}'
  done
done > "$out"
python3 - "$out" "$N" "$C" <<'PY'
import sys, collections
path, n, c = sys.argv[1:4]
rows = collections.defaultdict(dict)
for line in open(path):
    a, size, t = line.split()
    rows[int(size)][a] = min(float(t), rows[int(size)].get(a, 1e18))
algs = ["ring", "tree", "double_tree", "halving_doubling", "direct", "two_shot"]
print(f"{c}, {n} ranks: min over 3 runs of the time per call (us)")
print(f"{'size':>10} {'auto':>9} " + " ".join(f"{a[:9]:>9}" for a in algs) + f" {'best':>16} {'auto/best':>9}")
for size in sorted(rows):
    r = rows[size]
    forced = {a: r[a] for a in algs if a in r}
    best = min(forced, key=forced.get)
    print(f"{size:>10} {r.get('auto', float('nan')):>9.2f} "
          + " ".join(f"{r.get(a, float('nan')):>9.2f}" for a in algs)
          + f" {best:>16} {r['auto'] / forced[best]:>9.2f}")
PY
rm -f "$out"

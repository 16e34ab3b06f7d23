#!/bin/bash
# recorder_cost.sh: what the flight recorder's timings cost an 8 B AllReduce.
#
# Usage: flock /work/bench.lock bench/recorder_cost.sh BASE NEW [ROUNDS]
#   BASE, NEW   two `tutti` binaries (a build without the change, and this one)
#   ROUNDS      rounds (default 9); each runs three configurations in rotating order:
#               base, new with TUTTI_TRACE_DIR unset (off), new with it set (on)
# Prints, per run: configuration, the 1-rank API overhead (ns, from `tutti perf -n 1`'s
# header) and the 2-rank out-of-place time per call (us, `tutti perf -n 2 --json`).
set -eu
BASE=$1 NEW=$2 ROUNDS=${3:-9}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
one() { # label binary trace-dir-or-empty
  if [ -n "$3" ]; then export TUTTI_TRACE_DIR=$3; else unset TUTTI_TRACE_DIR; fi
  o1=$($2 perf -n 1 -b 8 -e 8 -c 0 2>&1 | sed -n 's/.*API overhead: \([0-9.]*\) ns.*/\1/p')
  $2 perf -n 2 -b 8 -e 8 -c 0 -T 1 --json "$TMP/j.json" >/dev/null 2>&1
  o2=$(python3 -c "import json;print([x for x in json.load(open('$TMP/j.json'))['rows'] if not x['in_place']][0]['time_us'])")
  echo "$1 $o1 $o2"
}
for r in $(seq 1 "$ROUNDS"); do
  case $((r % 3)) in
    1) one base "$BASE" ""; one off "$NEW" ""; one on "$NEW" "$TMP/trace" ;;
    2) one off "$NEW" ""; one on "$NEW" "$TMP/trace"; one base "$BASE" "" ;;
    0) one on "$NEW" "$TMP/trace"; one base "$BASE" ""; one off "$NEW" "" ;;
  esac
done

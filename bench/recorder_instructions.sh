#!/bin/bash
# recorder_instructions.sh: what the flight recorder's timings (TUTTI_TRACE_DIR) add to an
# 8 B AllReduce, in instructions: deterministic, so it reads the same on a busy machine,
# where timings of a 100 ns call swing by 5% or more (bench/recorder_cost.sh).
#
# Usage: bench/recorder_instructions.sh [TUTTI] [LOW] [HIGH]
#   TUTTI  the `tutti` binary (default target/release/tutti)
#   LOW, HIGH  iteration counts (default 12000 and 32000; both fill the 4,096-op ring, so
#          the trace written at the end is the same size in both runs)
# Runs `tutti perf -n 1 -b 8 -e 8 -c 0 -w 0 -i N` under valgrind's callgrind (every
# process), with TUTTI_TRACE_DIR unset and set, at LOW and HIGH iterations; an iteration
# is two calls (out of place and in place). Per call = (instructions at HIGH - at LOW) /
# (2 (HIGH - LOW)): the start-up, the header's overhead loop and the trace's writing cancel.
set -eu
TUTTI=${1:-target/release/tutti} LOW=${2:-12000} HIGH=${3:-32000}
command -v valgrind > /dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
count() { # iterations trace-dir-or-empty -> total instructions of every process
  rm -rf "$TMP"/cg.* "$TMP/trace"
  if [ -n "$2" ]; then export TUTTI_TRACE_DIR=$2; else unset TUTTI_TRACE_DIR; fi
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$TMP/cg.%p" \
    "$TUTTI" perf -n 1 -b 8 -e 8 -c 0 -w 0 -i "$1" > "$TMP/log" 2>&1 || { cat "$TMP/log" >&2; exit 1; }
  awk '/^summary:/ { s += $2 } END { print s }' "$TMP"/cg.*
}
off_lo=$(count "$LOW" "") off_hi=$(count "$HIGH" "")
on_lo=$(count "$LOW" "$TMP/trace") on_hi=$(count "$HIGH" "$TMP/trace")
python3 - "$LOW" "$HIGH" "$off_lo" "$off_hi" "$on_lo" "$on_hi" << 'PY'
import sys
lo, hi, a, b, c, d = map(int, sys.argv[1:])
calls = 2 * (hi - lo)
off, on = (b - a) / calls, (d - c) / calls
print(f"8 B AllReduce, 1 rank, instructions per call: off {off:.1f}, on {on:.1f}, "
      f"+{on - off:.1f} ({100 * (on - off) / off:.2f}%)")
PY

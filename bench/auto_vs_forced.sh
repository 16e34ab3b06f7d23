#!/bin/bash
# Auto against every forced algorithm, measured in one communicator per run:
# crates/tutti/examples/auto_vs_forced.rs under `tutti run -n N`. Every round
# times Auto and each algorithm forced per call, each round starting one
# further along, so drift, the ranks' placement on cores and the place in
# the order affect all of them alike; the table shows medians over
# rounds (us per call), what Auto picked (algorithm/chunks), Auto's time
# over the best forced algorithm's, and the picked algorithm's forced time
# over the best (pick/best: the choice, apart from run-to-run noise). The
# two ratios are paired by round (the median of the ratios within a round);
# auto/best_m is the ratio of the medians; auto/pick is Auto over its own
# pick forced, paired: one schedule timed twice a round, i.e. the noise
# plus the cost of the reviews during the rounds (counted in `reviews`);
# `tuning` counts the calls before the rounds: until the first decision and
# then the first AVF_SETTLE reviews; `held_out` scores, as auto/best, the
# forced algorithm fastest over the other half of the rounds (the worse of
# the two halves): over 1.10 there, the best algorithm changed within the
# run by more than the 10% the table is read against.
# Usage: bench/auto_vs_forced.sh N [COLL] [MIN] [MAX]
#   env: AVF_ROUNDS (default 7), AVF_MS (timed ms per measurement, default 20),
#   AVF_SETTLE (online tuning's reviews let run before the rounds, default 3),
#   AVF_DUMP=1 (every round's times too), TUTTI_BIND (core or none: binding
#   as for tutti perf, below)
set -euo pipefail
N=${1:-2}
export AVF_COLL=${2:-all_reduce} AVF_MIN=${3:-8} AVF_MAX=${4:-64M}
cd "$(git rev-parse --show-toplevel)"
cargo build --release -q -p tutti-cli --bins
cargo build --release -q -p tutti --example auto_vs_forced
# Bound as tutti perf binds: a core per rank when there are enough, else
# placement left to the scheduler (as mpirun does); TUTTI_BIND overrides.
BIND=none; [ "$N" -le "$(nproc)" ] && BIND=core
case "${TUTTI_BIND:-}" in
  core | none) BIND=$TUTTI_BIND ;;
  "") ;;
  *) echo "TUTTI_BIND=$TUTTI_BIND: use core or none" >&2; exit 2 ;;
esac
target/release/tutti run --bind "$BIND" -n "$N" -- target/release/examples/auto_vs_forced 2>&1 | sed -e 's/^\[rank 0\] //'

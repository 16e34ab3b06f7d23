#!/usr/bin/env bash
# The C ABI's overhead: a loop of 8 B AllReduces on 2 ranks through the C
# API (bench/allreduce_loop.c) and through the Rust API
# (examples/allreduce_loop.rs), run alternately for ROUNDS rounds; prints
# each round and the median and spread (min..max) of each, and C / Rust.
#
#   flock /work/bench.lock crates/tutti-c/scripts/bench_overhead.sh [ROUNDS] [ITERS] [RANKS]
set -euo pipefail
rounds=${1:-7}
iters=${2:-50000}
ranks=${3:-2}
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}/release"
# Everything it runs: `--lib` makes cargo refresh target/release's
# libtutti_c.{so,a} (which install.sh --no-build takes); built as the
# example's dependency alone, they would stay stale. Build beforehand under
# the shared lock (the same command); then this is a no-op.
(cd "$repo" && cargo build --release --locked -q -p tutti-cli -p tutti-c --lib --bins --example allreduce_loop)
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
bash "$here/scripts/install.sh" --no-build "$prefix" > /dev/null
cc -O2 -I"$prefix/include" "$here/bench/allreduce_loop.c" -o "$prefix/c_loop" \
  -L"$prefix/lib" -ltutti -Wl,-rpath,"$prefix/lib"
c=()
r=()
for i in $(seq "$rounds"); do
  c+=("$("$target/tutti" run -n "$ranks" --no-prefix -- "$prefix/c_loop" "$iters" 8 | awk '/us_per_op/ {print $3}')")
  r+=("$("$target/tutti" run -n "$ranks" --no-prefix -- "$target/examples/allreduce_loop" "$iters" 8 | awk '/us_per_op/ {print $3}')")
  echo "round $i: C ${c[-1]} us, Rust ${r[-1]} us"
done
stats() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median %.3f us (min %.3f, max %.3f)", m, a[1], a[NR]}'; }
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo "C    (libtutti):  $(stats "${c[@]}")"
echo "Rust (tutti API): $(stats "${r[@]}")"
awk -v c="$(med "${c[@]}")" -v r="$(med "${r[@]}")" 'BEGIN {printf "C / Rust: %.3f (%+.1f%%)\n", c / r, (c / r - 1) * 100}'

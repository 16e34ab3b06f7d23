#!/bin/bash
# fuzz/run.sh [SECONDS] [TARGET...]: runs each cargo-fuzz target of tutti for
# SECONDS (default 60) and prints its executions; exits non-zero on a crash
# (the input is saved under fuzz/artifacts/TARGET/). Targets: store_request
# (the bootstrap store's frame and request decoders), tcp_message (the TCP
# transport's receive path), tcp_lanes (the same on a link of several
# sockets) and tcp_stream (point-to-point's link: messages of variable
# length on one socket). The corpus grows in fuzz/corpus/TARGET (not
# committed), seeded from fuzz/seeds/TARGET.
#
# cargo-fuzz needs nightly-only compiler flags (-Z sanitizer=address, ...):
# RUSTC_BOOTSTRAP=1 lets the stable toolchain take them (tested with stable
# 1.95; the first build takes about 3 minutes on 2 cores). cargo-fuzz itself
# is installed from crates.io if missing.
set -euo pipefail
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(store_request tcp_message tcp_lanes tcp_stream)
cd "$(dirname "$0")"

if ! cargo fuzz --version > /dev/null 2>&1; then
  echo "run.sh: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
# FUZZ_TOOLCHAIN=+nightly picks a toolchain; by default the active one.
tc=()
[ -n "${FUZZ_TOOLCHAIN:-}" ] && tc=("$FUZZ_TOOLCHAIN")
export RUSTC_BOOTSTRAP=1

mkdir -p logs
summary=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t"
  extra=()
  [ "$t" = tcp_message ] && extra=(-max_len=70000)
  echo "run.sh: fuzzing $t for ${secs}s"
  set +e
  cargo "${tc[@]}" fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -malloc_limit_mb=64 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
    > "logs/$t.log" 2>&1
  rc=$?
  set -e
  runs=$(awk '/stat::number_of_executed_units/ {print $NF}' "logs/$t.log")
  rate=$(awk '/stat::average_exec_per_sec/ {print $NF}' "logs/$t.log")
  if [ $rc != 0 ]; then
    echo "run.sh: $t FAILED (exit $rc); last lines of logs/$t.log:"
    grep -v '^"' "logs/$t.log" | tail -40
    exit 1
  fi
  summary+=("$t: ${runs:-?} executions in ${secs}s (${rate:-?}/s), corpus $(find "corpus/$t" -type f | wc -l) inputs")
done
printf 'run.sh: %s\n' "${summary[@]}"

#!/usr/bin/env bash
# Every test: the Rust workspace (unit tests, the symbolic verifier, the
# multi-process correctness matrix, faults, multi-host namespaces when run as
# root) and the Python package (numpy API, torch.distributed backend, DDP).
#
#   scripts/test.sh            # both
#   SKIP_PYTHON=1 scripts/test.sh
#
# Python needs python3 with venv; python/ci.sh installs maturin, numpy,
# pytest and torch (about 3 GB the first time) into .venv.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
cargo test --workspace --release --locked --no-fail-fast || status=1
if [ "${SKIP_PYTHON:-0}" != 1 ]; then
  # The launcher test takes the release `tutti` that cargo test built (a
  # no-op build makes sure of it) instead of a debug build of its own.
  if [ -z "${TUTTI_BIN:-}" ] && cargo build -q --release --workspace --all-targets --locked; then
    export TUTTI_BIN="$PWD/target/release/tutti" SKIP_CLI=1
  fi
  bash python/ci.sh || status=1
fi
exit $status

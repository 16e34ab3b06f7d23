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
  bash python/ci.sh || status=1
fi
exit $status

#!/usr/bin/env bash
# Builds the tutti wheel and runs the Python tests (numpy API, torch backend, DDP, launchers).
#
#   python/ci.sh [PYTEST ARGS...]
#
# Environment:
#   VENV          the virtual environment to use or create (default: <repo>/.venv)
#   PYTHON        the interpreter that creates it (default: python3; CPython >= 3.9)
#   TORCH_SPEC    what pip installs for torch (default: torch==2.15.0; "none" skips torch and
#                 its tests)
#   SKIP_CLI=1    do not build the `tutti` launcher (its test is then skipped)
#
# Steps: create the venv and install maturin, numpy, pytest and torch (the PyPI torch wheel is
# the CUDA build, about 3 GB, about 2 minutes the first time; pip's cache makes later runs
# fast); build an abi3 wheel with maturin (release) and install it; build the `tutti`
# launcher; run pytest from the tests folder, so that the installed wheel is what is tested.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="${VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.15.0}"
t0=$SECONDS

step() { printf '\n== %s (%ds)\n' "$*" "$((SECONDS - t0))"; }

step "venv $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --disable-pip-version-check --upgrade pip
pkgs=("maturin>=1.5,<2" "numpy" "pytest")
if [ "$TORCH_SPEC" != "none" ]; then
    pkgs+=("$TORCH_SPEC" "expecttest")  # expecttest: torch's test harness (tests/torch_suite)
fi
"$PY" -m pip install -q --disable-pip-version-check "${pkgs[@]}"
"$PY" -c 'import numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
if [ "$TORCH_SPEC" != "none" ]; then
    "$PY" -c 'import torch; print("torch", torch.__version__)'
fi

step "wheel (maturin build --release)"
DIST="$REPO/target/wheels-ci"
rm -rf "$DIST"
# maturin builds crates/tutti-py with pyo3/extension-module (see python/pyproject.toml)
(cd "$HERE" && "$VENV/bin/maturin" build --release -o "$DIST" -i "$PY" 2>&1 | tail -n 3)
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$DIST"/tutti-*.whl
ls -l "$DIST"

if [ "${SKIP_CLI:-0}" != "1" ]; then
    step "the tutti launcher (cargo build -p tutti-cli)"
    (cd "$REPO" && cargo build -q -p tutti-cli) || echo "warning: the tutti launcher did not build; its test will be skipped"
fi

step "pytest"
cd "$HERE/tests"   # not python/: the installed wheel must be what `import tutti` finds
"$PY" - <<'EOF'
import os, tutti
assert "site-packages" in tutti.__file__, f"testing {tutti.__file__}, not the installed wheel"
print("testing", os.path.dirname(tutti.__file__), "version", tutti.__version__)
EOF
set +e
"$PY" -m pytest -p no:cacheprovider -q -rs --durations=8 "$@"
rc=$?
set -e
step "done: pytest exit code $rc"
exit $rc

"""Programs in any language started by torchrun join through the agent's store.

torchrun's agent serves a torch TCPStore on MASTER_PORT and sets
TORCHELASTIC_USE_AGENT_STORE=True, so rank 0 cannot serve tutti's store there: the
Rust library speaks the TCPStore protocol as a client instead. Checked here for the
CLI (`tutti perf`), a Rust example binary, the numpy API, and an elastic restart.
"""
import os
import subprocess
import sys

import pytest

from test_launch import REPO, run, tutti_bin

pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", *args]


def test_cli_perf_under_torchrun():
    exe = tutti_bin()
    if exe is None:
        pytest.skip("no `tutti` binary built (cargo build --release -p tutti-cli)")
    out = run(torchrun("--nproc-per-node", "2", "--no-python", exe, "perf", "-b", "8", "-e", "64K", "-f", "8",
                       "-c", "1", "-n", "5", "-w", "1"))
    assert "Out of bounds values : 0 OK" in out, out[-3000:]


def test_rust_example_under_torchrun():
    exe = os.path.join(REPO, "target", "release", "examples", "allreduce")
    if not os.access(exe, os.X_OK):
        pytest.skip("the allreduce example is not built (cargo build --release --examples)")
    out = run(torchrun("--nproc-per-node", "3", "--no-python", exe, "4096"))
    assert out.count("result correct") == 3, out[-3000:]


def test_numpy_api_joins_the_agent_store():
    out = run(torchrun("--nproc-per-node", "2", os.path.join(REPO, "python", "examples", "numpy_allreduce.py")))
    assert out.count("numpy API OK") == 2


def test_elastic_restart_forms_a_new_communicator():
    p = subprocess.run(
        torchrun("--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.5",
                 os.path.join(HERE, "elastic_worker.py")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-4000:]
    assert "attempt 0: rank 1 dies" in p.stdout
    assert "should not get here" not in p.stdout
    for r in range(2):
        assert f"attempt 1: rank {r}/2 OK" in p.stdout, p.stdout[-4000:]

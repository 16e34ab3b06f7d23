"""The examples under each launcher: torchrun, `tutti run` and multiprocessing spawn."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def run(cmd, timeout=240, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=e)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-4000:]}"
    return p.stdout


def tutti_bin():
    """The `tutti` launcher: $TUTTI_BIN, or the workspace's build, if it has `run`."""
    cands = [os.environ.get("TUTTI_BIN", "")] + [os.path.join(REPO, "target", p, "tutti") for p in ("release", "debug")]
    cands.append(shutil.which("tutti") or "")
    for c in cands:
        if c and os.access(c, os.X_OK):
            try:
                if subprocess.run([c, "run", "--help"], capture_output=True, timeout=10).returncode == 0:
                    return c
            except (OSError, subprocess.TimeoutExpired):
                pass
    return None


def test_numpy_under_torchrun():
    pytest.importorskip("torch")
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.join(EXAMPLES, "numpy_allreduce.py")])
    assert out.count("numpy API OK") == 2


def test_numpy_under_spawn():
    out = run([sys.executable, os.path.join(EXAMPLES, "numpy_allreduce.py"), "--spawn", "3"])
    assert out.count("numpy API OK") == 3


def test_ddp_under_torchrun():
    pytest.importorskip("torch")
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.join(EXAMPLES, "ddp_torch.py"), "--steps", "5"])
    assert out.count("DDP on backend tutti OK") == 2


def test_ddp_under_mp_spawn():
    pytest.importorskip("torch")
    out = run([sys.executable, os.path.join(EXAMPLES, "ddp_torch.py"), "--spawn", "2", "--steps", "5"])
    assert out.count("DDP on backend tutti OK") == 2


def test_ddp_under_tutti_run():
    pytest.importorskip("torch")
    exe = tutti_bin()
    if exe is None:
        pytest.skip("no `tutti` launcher with `run` built (cargo build -p tutti-cli)")
    out = run([exe, "run", "-n", "2", "--", sys.executable, os.path.join(EXAMPLES, "ddp_torch.py"), "--steps", "5"])
    assert out.count("DDP on backend tutti OK") == 2
    out = run([exe, "run", "-n", "2", "--", sys.executable, os.path.join(EXAMPLES, "numpy_allreduce.py")])
    assert out.count("numpy API OK") == 2


def test_ddp_with_only_tutti_variables():
    """What `tutti run` sets at the least (TUTTI_*): tutti.torch fills in torch's env://."""
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                                 "LOCAL_RANK")}
        env.update(TUTTI_RANK=str(r), TUTTI_WORLD_SIZE="2", TUTTI_LOCAL_RANK=str(r), TUTTI_MASTER_ADDR="127.0.0.1",
                   TUTTI_MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "ddp_torch.py"), "--steps", "3"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
        assert "DDP on backend tutti OK" in o


@pytest.mark.parametrize("launcher", ["slurm", "openmpi"])
def test_ddp_with_slurm_or_openmpi_variables(launcher):
    """What srun (SLURM_PROCID/NTASKS/LOCALID) or mpirun (OMPI_COMM_WORLD_*) sets, plus the
    MASTER_ADDR/PORT a job script exports: tutti.torch fills in torch's env://."""
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    names = {"slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
             "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")}[launcher]
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
               and not k.startswith(("TUTTI_", "SLURM_", "OMPI_"))}
        env.update({names[0]: str(r), names[1]: "2", names[2]: str(r), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "ddp_torch.py"), "--steps", "3"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
        assert "DDP on backend tutti OK" in o


@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_parallel_example(stages):
    pytest.importorskip("torch")
    out = run([sys.executable, os.path.join(EXAMPLES, "pipeline.py"), "--spawn", str(stages), "--steps", "6"])
    assert out.count("pipeline stage matches") == stages

"""Install and go: the wheel registers the backend through torch's
``torch.distributed.backends`` entry point, so ``init_process_group("tutti")`` works in a
program that never imports tutti.

The wheel that python/ci.sh built (``target/wheels-ci``, or ``$TUTTI_WHEEL``) is
pip-installed into a fresh virtual environment, which borrows everything else (torch,
numpy) from this one by symbolic links, all but tutti itself; ranks started there with
torch's own spawn call ``init_process_group("tutti")`` on world sizes 1 and 2.
"""

import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

PROGRAM = textwrap.dedent('''
    import datetime, os, socket, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def rank_main(rank, n, port):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        assert "tutti" not in sys.modules
        dist.init_process_group("tutti", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        assert t.tolist() == [n * (n + 1) / 2] * 4, t
        import tutti
        kind = type(dist.group.WORLD).__name__
        # one write per line: the ranks share the pipe, and print's text and newline
        # could interleave with the other rank's
        os.write(1, f"rank {rank} of {n}: {kind} from {os.path.dirname(tutti.__file__)};\\n".encode())
        dist.destroy_process_group()

    if __name__ == "__main__":
        n = int(sys.argv[1])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, args=(n, port), nprocs=n)
''')


def _wheel():
    w = os.environ.get("TUTTI_WHEEL")
    if w:
        return w
    found = sorted(glob.glob(os.path.join(REPO, "target", "wheels-ci", "tutti-*.whl")))
    return found[-1] if found else None


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    wheel = _wheel()
    if not wheel:
        pytest.skip("no tutti wheel (python/ci.sh builds one into target/wheels-ci; or set TUTTI_WHEEL)")
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    venv = str(tmp_path_factory.mktemp("fresh") / "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    fresh_site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    have = set(os.listdir(fresh_site))
    for name in os.listdir(site):  # borrow torch and the rest; never tutti
        if name.startswith("tutti") or name in have or name.startswith(("pip", "setuptools", "_distutils")):
            continue
        os.symlink(os.path.join(site, name), os.path.join(fresh_site, name))
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
                    wheel], check=True)
    return py, fresh_site


@pytest.mark.parametrize("n", [1, 2])
def test_init_process_group_without_import(fresh_venv, tmp_path, n):
    py, fresh_site = fresh_venv
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    p = subprocess.run([py, str(prog), str(n)], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-4000:]
    lines = re.findall(r"rank (\d+) of \d+: (.*?);", p.stdout)
    assert sorted(int(r) for r, _ in lines) == list(range(n)), p.stdout[-4000:]
    for _, what in lines:
        assert what == "ProcessGroupTutti from " + os.path.join(fresh_site, "tutti"), what

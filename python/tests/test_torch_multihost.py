"""The torch backend on two hosts: network namespaces made by scripts/cluster.sh, one rank
in each, with neither MASTER_ADDR nor TUTTI_* variables set, so that rank 0's address
comes from torch's store alone (``tcp://HOST:PORT``, ``file://PATH``). Rank 0 must listen
on an address the other host can reach: a rank 0 that published 127.0.0.1 left rank 1
connecting to its own loopback until its timeout.

Needs root and ``ip netns``; skipped without them, unless TUTTI_MULTIHOST_REQUIRED=1 (as
CI sets where the machine can make namespaces), which makes the skip a failure.
"""

import os
import subprocess
import sys
import tempfile
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.abspath(os.path.join(HERE, "..", "..", "scripts", "cluster.sh"))

# One rank: joins the group through the given init_method, all-reduces, checks, and
# makes a subgroup (its own store prefix, so the address exchange runs again).
WORKER = r"""
import sys, datetime
import torch, torch.distributed as dist
import tutti.torch  # noqa: F401

method, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("tutti", init_method=method, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=20))
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), 3.0)), t[:4]
g = dist.new_group([0, 1])
u = torch.arange(10, dtype=torch.float64) * (rank + 1)
dist.all_reduce(u, group=g)
assert torch.equal(u, torch.arange(10, dtype=torch.float64) * 3), u
dist.destroy_process_group()
print("rank", rank, "ok")
"""


def _sh(*args, check=True, timeout=60):
    return subprocess.run([CLUSTER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=check)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("torch")
    why = None
    if os.geteuid() != 0:
        why = "needs root"
    else:
        c = _sh("check", check=False)
        if c.returncode != 0:
            why = c.stdout.strip()
    if why:
        if os.environ.get("TUTTI_MULTIHOST_REQUIRED") == "1":
            pytest.fail(f"network namespaces unavailable ({why}) with TUTTI_MULTIHOST_REQUIRED=1")
        pytest.skip(f"network namespaces unavailable: {why}")
    prefix = f"tpy{os.getpid() % 100000}"
    _sh("up", "--hosts", "2", "--prefix", prefix, "--subnet", "10.234.7", "--owner", str(os.getpid()))
    try:
        yield prefix
    finally:
        _sh("down", "--prefix", prefix, check=False)


def _run_pair(prefix: str, method: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TUTTI_") and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["TUTTI_CONNECT_TIMEOUT"] = "20"  # a rank that cannot reach rank 0 fails in 20 s, not 60
    procs = [subprocess.Popen([CLUSTER, "exec", "--prefix", prefix, str(r), sys.executable, "-c", WORKER,
                               method, str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
             for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append(p.communicate()[0] + "\n(killed after 90 s)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {r} ok" in out, f"rank {r} exited {p.returncode}:\n{out[-3000:]}"


def test_tcp_init_method_across_hosts(cluster):
    addr = _sh("addr", "--prefix", cluster, "0").stdout.strip()
    port = 20000 + uuid.uuid4().int % 10000
    _run_pair(cluster, f"tcp://{addr}:{port}")


def test_file_init_method_across_hosts(cluster):
    with tempfile.TemporaryDirectory() as d:
        _run_pair(cluster, f"file://{os.path.join(d, 'store')}")


# Both ranks on this host: the address exchange through a FileStore finds the same
# addresses on both, and rank 0 keeps tutti's default (None: loopback).
SAME_HOST = r"""
import sys, datetime
import torch.distributed as dist
from tutti import _net

path, rank = sys.argv[1], int(sys.argv[2])
store = dist.FileStore(path, 2)
print("address", rank, _net.address_for_group(dist.PrefixStore("g", store), rank, 2))
"""


def test_file_store_on_one_host_keeps_loopback():
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_") and k != "MASTER_ADDR"}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [subprocess.Popen([sys.executable, "-c", SAME_HOST, path, str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"address {r} None" in out, out

"""``tutti.explain(dir)`` on a real run (2 processes, TUTTI_TRACE_DIR set, rank 1 late
before every op), and torch's time estimator (``torch.distributed._time_estimator``) on
the ``"tutti"`` backend's two routes."""

import json
import os

import pytest

from harness import check_all, spawn


def f_late(rank, n, port):
    import time

    import numpy as np

    import tutti

    uid = tutti.UniqueId.for_address("127.0.0.1", port)
    c = tutti.Communicator.init_rank(uid, n, rank, timeout=60)
    x = np.ones(16384, np.float32)  # 64 KiB: every call timed (smaller ones one in 16)
    for _ in range(10):
        if rank == 1:
            time.sleep(0.003)
        c.all_reduce(x)
        x[:] = 1
    c.destroy()  # writes this rank's trace
    return True


def test_explain_names_the_late_rank(tmp_path):
    import tutti

    check_all(spawn(2, f_late, env={"TUTTI_TRACE_DIR": str(tmp_path)}), "late")
    r = tutti.explain(tmp_path)
    assert isinstance(r, dict)
    # 10 AllReduces, and what the communicator ran at its start
    assert r["ranks"] == 2 and r["ops"] >= 10, r["notes"]
    assert r["stragglers"]["straggler"] == 1, r["stragglers"]
    assert r["stragglers"]["ranks"][1]["median_late_us"] > 1000, r["stragglers"]
    g = [g for g in r["groups"] if g["bytes"] == 65536]
    assert [(g["collective"], g["calls"]) for g in g] == [("all_reduce", 10)], r["groups"]
    assert r["what_ifs"][0]["what"].startswith("no stragglers"), r["what_ifs"]
    # the same keys as `tutti explain DIR --json`
    assert json.loads(json.dumps(r)) == r


def test_explain_errors_name_the_file(tmp_path):
    import tutti

    with pytest.raises(ValueError, match="no tutti-trace-rank"):
        tutti.explain(tmp_path)
    (tmp_path / "tutti-trace-rank0.json").write_text('{"rank": 0, "size": 2, "ops": [')
    with pytest.raises(ValueError, match="tutti-trace-rank0.json"):
        tutti.explain(tmp_path)


def f_estimate(rank, n, port, backend):
    import datetime

    import torch
    import torch.distributed as dist

    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = be.comm.ops_done()
    est = []
    for numel in (1 << 16, 1 << 18, 1 << 20):  # 256 KiB, 1 MiB, 4 MiB of f32
        t = torch.full((numel,), float(rank + 1))
        with dist._time_estimator() as e:
            dist.all_reduce(t)
            w = dist.all_reduce(t, async_op=True)
            w.wait()
        # nothing moved: the tensor is as it was
        assert bool((t == rank + 1).all()), t[:4]
        est.append(e.estimated_time)
    assert be.comm.ops_done() == before, (before, be.comm.ops_done())
    # after the block, collectives run again
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4
    dist.destroy_process_group()
    return est


@pytest.mark.parametrize("backend", ["tutti", "cpu:tutti"])
def test_time_estimator(backend):
    pytest.importorskip("torch")
    est = check_all(spawn(2, f_estimate, backend), "estimate")
    for e in est:
        assert all(x > 0 for x in e), e
        assert e[0] < e[1] < e[2], e  # grows with size
    # every rank predicts the same
    assert est[0] == est[1], est

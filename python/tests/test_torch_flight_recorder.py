"""torch's flight recorder on the ``"cpu:tutti"`` route.

torch 2.15 attaches its backend-agnostic ``FlightRecorderHook`` to every group whose
backends do not record themselves; its pre/post hooks fire in the dispatcher kernels
(Ops.cpp), so every op torch routes to :class:`tutti.torch.TuttiBackend` is recorded in
the recorder instance named after the backend, ``"tutti"``
(``_dump_fr_trace(backend="tutti")``). These tests check the entries' fields and that
torch's own analyzer (``torch.distributed.flight_recorder``) matches the ranks' traces.
Fresh processes per test (harness.spawn)."""

import os
import pickle

import pytest

from harness import check_all, spawn

pytest.importorskip("torch")


def _init(rank, n, port, backend, seconds=60):
    import datetime

    import torch.distributed as dist
    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=seconds))
    return dist


# what each rank issues, and the name torch records for it
OPS = ["all_reduce", "all_reduce", "broadcast", "_all_gather_base", "_reduce_scatter_base", "p2p", "barrier"]


def f_record(rank, n, port, out_dir):
    import torch

    dist = _init(rank, n, port, "cpu:tutti")
    fr = torch._C._distributed_c10d
    fr._reset_fr_trace(backend="tutti")
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(torch.ones(3, dtype=torch.float64), async_op=True).wait()
    dist.broadcast(t, 0)
    dist.all_gather_into_tensor(torch.empty(4 * n), t)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n))
    peer = (rank + 1) % n
    if rank % 2 == 0:
        dist.send(torch.ones(5), peer)
    else:
        dist.recv(torch.empty(5), (rank - 1) % n)
    dist.barrier()
    dump = pickle.loads(fr._dump_fr_trace(backend="tutti"))
    with open(os.path.join(out_dir, f"trace_{rank}"), "wb") as f:
        pickle.dump(dump, f)
    entries = dump["entries"]
    names = [e["profiling_name"] for e in entries]
    p2p = "tutti:send 0->1" if rank == 0 else "tutti:recv 1<-0"
    want = [f"tutti:{o}" if o != "p2p" else p2p for o in OPS]
    assert names == want, names
    first, second = entries[0], entries[1]
    assert first["input_sizes"] == [[4]] and first["input_dtypes"] == ["Float"], first
    assert second["input_sizes"] == [[3]] and second["input_dtypes"] == ["Double"], second
    assert entries[3]["output_sizes"] == [[4 * n]], entries[3]
    colls = [e["collective_seq_id"] for e in entries if not e["is_p2p"]]
    assert colls == list(range(1, len(colls) + 1)), colls
    assert [e["p2p_seq_id"] for e in entries if e["is_p2p"]] == [1], entries
    name = dist.group.WORLD.group_name
    assert all(e["process_group"] == (name, "default_pg") for e in entries), entries[0]["process_group"]
    assert name in dump["pg_config"], dump["pg_config"]
    assert all(e["timeout_ms"] == 60000 for e in entries)
    dist.destroy_process_group()
    return True


def test_flight_recorder_records_backend_route(tmp_path):
    check_all(spawn(2, f_record, str(tmp_path), timeout=90), "flight recorder")
    from torch.distributed.flight_recorder.fr_trace import main

    # torch's analyzer matches every rank's entries into collectives
    db_file = tmp_path / "db.pkl"
    main([str(tmp_path), "--prefix", "trace_", "-o", str(db_file)])
    with open(db_file, "rb") as f:
        _, db = pickle.load(f)
    names = [c.collective_name for c in db.collectives]
    assert names == [f"tutti:{o}" for o in OPS if o != "p2p"][:5] + ["tutti:send 0->1", "tutti:barrier"], names
    assert all(c.pass_check for c in db.collectives), db.collectives
    assert all(c.missing_ranks is None and c.mismatch_collectives is None for c in db.collectives)

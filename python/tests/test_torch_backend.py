"""The torch backend's two routes: ``"tutti"`` (a whole Python ProcessGroup, with a
c10d Backend on the same communicator registered in it for cpu) and ``"cpu:tutti"`` (that
c10d Backend under torch's own ProcessGroup, which device mixes such as
``"cpu:tutti,cuda:nccl"`` use); and what torch asks of a per-device backend:
``dist.monitored_barrier``, ``dist.split_group``, ``dist.shrink_group``,
``dist.set_timeout``. Fresh processes per test (harness.spawn)."""

import pytest

from harness import check_all, spawn

pytest.importorskip("torch")

# the group's class and its cpu backend's, per route
ROUTES = {"tutti": ("ProcessGroupTutti", "TuttiBackend"), "cpu:tutti": ("ProcessGroup", "TuttiBackend")}


def _init(rank, n, port, backend, seconds=60):
    import datetime
    import os

    import torch.distributed as dist
    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=seconds))
    return dist


def _cpu_backend(g):
    import torch

    return g._get_backend(torch.device("cpu"))


def f_collectives(rank, n, port, backend):
    import torch

    dist = _init(rank, n, port, backend)
    be = _cpu_backend(dist.group.WORLD)
    kind = (type(dist.group.WORLD).__name__, type(be).__name__)
    before = be.comm.ops_done()
    # all_reduce, blocking and asynchronous, with the Work's future
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [n * (n + 1) / 2] * 5, t
    t = torch.full((3,), float(rank + 1))
    w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert w.wait()
    if kind[0] == "ProcessGroupTutti":  # torch's PyWorkHolder (the Backend route) forwards only wait and get_future
        assert w.is_completed()
    assert t.tolist() == [float(n)] * 3 and doubled.tolist() == [2.0 * n] * 3, (t, doubled)
    # every kind of Work has a future: an empty list's, a barrier's, a send's
    assert dist.barrier(async_op=True).get_future().wait() is not None
    # broadcast, all_gather (list and into one tensor), reduce_scatter_tensor, all_to_all_single
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=n - 1)
    assert b.tolist() == [float(n - 1)] * 4
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(n)]
    o = torch.empty(2 * n)
    w = dist.all_gather_into_tensor(o, torch.full((2,), float(rank)), async_op=True)
    assert w.get_future().wait()[0] is o
    assert o.tolist() == [float(r) for r in range(n) for _ in range(2)]
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * n, dtype=torch.float32))
    assert rs.tolist() == [float(n * (2 * rank)), float(n * (2 * rank + 1))], rs
    a2a = torch.empty(n)
    dist.all_to_all_single(a2a, torch.full((n,), float(rank)))
    assert a2a.tolist() == [float(r) for r in range(n)]
    # gather and scatter to rank 0
    g = [torch.empty(1) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), g, dst=0)
    if rank == 0:
        assert [x.item() for x in g] == [float(r) for r in range(n)]
    s = torch.empty(1)
    dist.scatter(s, [torch.tensor([float(r * 10)]) for r in range(n)] if rank == 0 else None, src=0)
    assert s.item() == rank * 10.0
    # a sparse all-reduce, and the coalesced form
    sp = torch.sparse_coo_tensor([[rank]], [1.0], (n,))
    dist.all_reduce(sp)
    assert sp.to_dense().tolist() == [1.0] * n
    cs = [torch.ones(2), torch.ones(3)]
    dist.all_reduce_coalesced(cs)
    assert [c.tolist() for c in cs] == [[float(n)] * 2, [float(n)] * 3]
    # batch_isend_irecv: a ring, sends listed first
    send = torch.full((1000,), float(rank))
    recv = torch.empty(1000)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
    works = dist.batch_isend_irecv(ops)
    for w in works:
        w.wait()
        w.get_future().wait()
    assert recv.tolist() == [float((rank - 1) % n)] * 1000
    # a new group of all but the last rank, and the world again
    sub = dist.new_group(list(range(max(n - 1, 1))))
    if rank < max(n - 1, 1):
        assert (type(sub).__name__, type(_cpu_backend(sub)).__name__) == kind
        u = torch.ones(2)
        dist.all_reduce(u, group=sub)
        assert u.tolist() == [float(max(n - 1, 1))] * 2
    dist.barrier()
    ran = be.comm.ops_done() - before  # the world's CPU ops ran on tutti
    import datetime

    dist.distributed_c10d.set_timeout(datetime.timedelta(seconds=45))  # either route honours it
    assert be.comm.timeout == 45.0, be.comm.timeout
    dist.destroy_process_group()
    return kind, ran


@pytest.mark.parametrize("backend", list(ROUTES))
@pytest.mark.parametrize("n", [2, 3])
def test_routes_collectives(backend, n):
    out = check_all(spawn(n, f_collectives, backend, timeout=120), f"collectives on {backend!r}")
    for kind, ran in out:
        assert kind == ROUTES[backend], kind
        assert ran >= 15, ran


def _ops_object(g):
    """What torch calls a group's sends and receives on: the group itself on the
    ProcessGroup route, its cpu backend on the Backend route."""
    return g if type(g).__name__ == "ProcessGroupTutti" else _cpu_backend(g)


def f_coalescing(rank, n, port, backend):
    import torch
    from torch.distributed.distributed_c10d import _coalescing_manager

    dist = _init(rank, n, port, backend)
    g = dist.group.WORLD
    ops_obj, be = _ops_object(g), _cpu_backend(g)
    assert be.supports_coalescing
    # batch_isend_irecv: torch opens a coalescing window; its sends and receives are
    # posted as one batch (one p2p post) and torch returns that batch's one Work
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    sends = [torch.full((100 * (k + 1),), float(rank * 10 + k)) for k in range(3)]
    recvs = [torch.empty(100 * (k + 1)) for k in range(3)]
    ops = [dist.P2POp(dist.isend, s, nxt, tag=k) for k, s in enumerate(sends)]
    ops += [dist.P2POp(dist.irecv, r, prv, tag=k) for k, r in enumerate(recvs)]
    before = ops_obj.p2p_posts
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 1, works
    works[0].wait()
    assert ops_obj.p2p_posts == before + 1, ops_obj.p2p_posts - before
    assert [r[0].item() for r in recvs] == [float(prv * 10 + k) for k in range(3)], recvs
    # _coalescing_manager with a device opens the same window: the all-reduces are one
    # tutti collective, and the window's Work covers them
    ts = [torch.full((s,), float(rank + 1)) for s in (3, 1, 5)]
    done = be.comm.ops_done()
    with _coalescing_manager(g, torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    assert be.comm.ops_done() == done + 1, be.comm.ops_done() - done
    assert all(t.tolist() == [n * (n + 1) / 2] * t.numel() for t in ts), ts
    # sends and receives inside it: one post at its end; waiting for one before raises
    r = torch.empty(4)
    before = ops_obj.p2p_posts
    with _coalescing_manager(g, torch.device("cpu"), async_ops=True) as cm:
        w = dist.isend(torch.full((4,), float(rank)), nxt)
        dist.irecv(r, prv)
        assert ops_obj.p2p_posts == before
        try:
            w.wait()
            raise AssertionError("waiting for a held send did not raise")
        except RuntimeError as e:
            assert "coalescing window" in str(e), e
    cm.wait()
    assert ops_obj.p2p_posts == before + 1 and r.tolist() == [float(prv)] * 4, r
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("backend", list(ROUTES))
def test_coalescing_window_is_one_batch(backend):
    check_all(spawn(3, f_coalescing, backend, timeout=90), f"coalescing on {backend!r}")


def f_monitored(rank, n, port, backend, absent):
    import datetime

    import torch

    dist = _init(rank, n, port, backend)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))  # everybody: passes
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=30))  # the group's method too
    err = None
    if rank not in absent:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=len(absent) > 1)
        except RuntimeError as e:
            err = str(e)
    t = torch.ones(4)  # the group is usable afterwards
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 4
    dist.destroy_process_group()
    return err


@pytest.mark.parametrize("backend", list(ROUTES))
@pytest.mark.parametrize("absent", [(1,), (1, 2)], ids=["one", "two"])
def test_monitored_barrier_names_missing_rank(backend, absent):
    out = check_all(spawn(3, f_monitored, backend, absent, timeout=90), "monitored_barrier")
    if len(absent) == 1:
        assert f"Rank {absent[0]} failed to pass monitoredBarrier" in out[0], out[0]
    else:
        assert "Ranks 1, 2 failed to pass monitoredBarrier" in out[0], out[0]
    for r in range(1, 3):
        if r not in absent:
            assert f"Rank {r} successfully reached monitoredBarrier" in out[r], out[r]
        else:
            assert out[r] is None


def f_device_mix(rank, n, port, spec):
    import torch

    dist = _init(rank, n, port, spec)
    pg = dist.group.WORLD
    be = _cpu_backend(pg)
    other = type(pg._get_backend(torch.device("cuda"))).__name__
    before = be.comm.ops_done()
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert t.tolist() == [n * (n + 1) / 2] * 3 and objs == [{"rank": r} for r in range(n)]
    ran = be.comm.ops_done() - before
    dist.destroy_process_group()
    return type(be).__name__, other, ran, sorted(d.type for d in pg._device_types)


def test_device_mix_cpu_tutti():
    """``"cpu:tutti,cuda:gloo"``: CPU tensors (and object collectives) go to tutti, cuda to
    gloo (a cuda leg that needs no GPU to be built, standing in for nccl here)."""
    out = check_all(spawn(2, f_device_mix, "cpu:tutti,cuda:gloo", timeout=90), "device mix")
    for kind, other, ran, devices in out:
        assert (kind, other, devices) == ("TuttiBackend", "ProcessGroupGloo", ["cpu", "cuda"]), (kind, other)
        assert ran >= 3, ran


def f_nccl_mix(rank, n, port):
    import torch
    from torch.distributed.distributed_c10d import BackendConfig

    import tutti.torch  # noqa: F401

    cfg = BackendConfig("cpu:tutti,cuda:nccl").get_device_backend_map()
    assert cfg == {"cpu": "tutti", "cuda": "nccl"}, cfg
    if torch.cuda.is_available():
        return f_device_mix(rank, n, port, "cpu:tutti,cuda:nccl")
    try:
        _init(rank, n, port, "cpu:tutti,cuda:nccl")
    except RuntimeError as e:  # nccl's leg needs a GPU; tutti's was built before it
        return str(e)
    raise AssertionError("nccl started without a GPU")


def test_device_mix_with_nccl():
    """``"cpu:tutti,cuda:nccl"`` parses to tutti for cpu and nccl for cuda; with a GPU it
    runs (one rank: nccl needs a GPU per rank), without one only nccl's leg refuses."""
    out = check_all(spawn(1, f_nccl_mix, timeout=90), "cpu:tutti,cuda:nccl")
    if isinstance(out[0], str):
        assert "CUDA" in out[0] or "cuda" in out[0], out[0]
    else:
        assert out[0][:2] == ("TuttiBackend", "ProcessGroupNCCL"), out[0]


def f_split(rank, n, port, backend):
    import datetime

    import torch

    dist = _init(rank, n, port, backend)
    sg = dist.split_group(split_ranks=[[2, 0], [1]], timeout=datetime.timedelta(seconds=7))
    be = _cpu_backend(sg)  # a split is a c10d Backend under torch's ProcessGroup, from either route
    assert type(be).__name__ == "TuttiBackend" and be.comm.timeout == 7.0, (type(be), be.comm.timeout)
    members = [2, 0] if rank in (0, 2) else [1]
    assert sg.size() == len(members) and sg.rank() == members.index(rank), (sg.size(), sg.rank())
    assert dist.get_process_group_ranks(sg) == members, dist.get_process_group_ranks(sg)
    got = [torch.empty(1) for _ in members]
    dist.all_gather(got, torch.tensor([float(rank)]), group=sg)  # in the split's rank order
    assert [g.item() for g in got] == [float(m) for m in members], got
    w = dist.all_reduce(torch.ones(2), group=sg, async_op=True)
    assert w.get_future().wait()[0].tolist() == [float(len(members))] * 2
    # dist.set_timeout changes the group's deadline for later ops
    dist.distributed_c10d.set_timeout(datetime.timedelta(seconds=3), group=sg)
    assert be.comm.timeout == 3.0, be.comm.timeout
    t = torch.ones(1)
    dist.all_reduce(t)  # the world is unaffected
    assert t.item() == n
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("backend", list(ROUTES))
def test_split_group(backend):
    check_all(spawn(3, f_split, backend, timeout=90), f"split_group on {backend!r}")


def f_shrink(rank, n, port, backend):
    import torch

    dist = _init(rank, n, port, backend)
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == n - 1:
        return "excluded"  # leaves: its process exits, its communicator with it
    new = dist.shrink_group([n - 1])
    be = _cpu_backend(new)
    assert type(be).__name__ == "TuttiBackend", type(be)
    assert new.size() == n - 1 and new.rank() == rank and dist.get_world_size() == n - 1
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)  # the shrunk group is the default group now
    assert t.tolist() == [(n - 1) * n / 2] * 3, t
    w = dist.broadcast(torch.full((2,), float(rank)), src=0, async_op=True)
    assert w.get_future().wait()[0].tolist() == [0.0, 0.0]
    dist.destroy_process_group()
    return "shrunk"


@pytest.mark.parametrize("backend", list(ROUTES))
def test_shrink_group(backend):
    out = check_all(spawn(3, f_shrink, backend, timeout=90), f"shrink_group on {backend!r}")
    assert out == ["shrunk", "shrunk", "excluded"], out


def f_timeouts(rank, n, port, backend):
    import datetime

    import torch

    # the world's timeout is longer than the test's: only the group's ends the wait
    dist = _init(rank, n, port, backend, seconds=600)
    g = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=2))
    assert _cpu_backend(g).comm.timeout == 2.0
    err = None
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(1), group=g)  # rank 1 never joins it
        except RuntimeError as e:
            err = type(e).__name__
    dist.barrier()  # the world still works
    dist.destroy_process_group()
    return err


@pytest.mark.parametrize("backend", list(ROUTES))
def test_group_timeout_honoured(backend):
    out = check_all(spawn(2, f_timeouts, backend, timeout=90), f"per-group timeout on {backend!r}")
    assert out[0] == "TimeoutError", out

"""What torch asks of a backend beyond the plain collectives: monitored_barrier naming
the ranks that did not arrive, fused coalesced calls, sparse all-reduce, and clear
errors for input the backend cannot take. Fresh processes per test (harness.spawn)."""

import pytest

from harness import check_all, spawn

pytest.importorskip("torch")


def _init(rank, n, port, seconds=60):
    import datetime
    import os

    import torch.distributed as dist
    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=seconds))
    return dist


def f_monitored(rank, n, port, absent, wait_all):
    import datetime

    import torch

    dist = _init(rank, n, port)
    pg = dist.group.WORLD
    pg.monitored_barrier(datetime.timedelta(seconds=30))  # everybody: passes
    err = None
    if rank not in absent:
        try:
            pg.monitored_barrier(datetime.timedelta(seconds=2), wait_all_ranks=wait_all)
        except RuntimeError as e:
            err = str(e)
    # a failed monitored barrier leaves the group usable
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 4
    dist.destroy_process_group()
    return err


@pytest.mark.parametrize("absent,wait_all", [((1,), False), ((1, 2), True), ((2,), False)])
def test_monitored_barrier_names_missing_ranks(absent, wait_all):
    out = check_all(spawn(3, f_monitored, absent, wait_all, timeout=90), "monitored_barrier")
    if wait_all:
        assert "Ranks 1, 2 failed to pass monitoredBarrier" in out[0], out[0]
    else:
        assert f"Rank {absent[0]} failed to pass monitoredBarrier" in out[0], out[0]
    for r in range(1, 3):
        if r in absent:
            assert out[r] is None
        else:
            assert f"Rank {r} successfully reached monitoredBarrier" in out[r], out[r]


def f_bad_input(rank, n, port):
    import torch

    dist = _init(rank, n, port)
    msgs = {}
    for name, call in [
        ("int16 sum", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16))),
        ("sparse max", lambda: dist.all_reduce(torch.ones(2, 2).to_sparse(), op=dist.ReduceOp.MAX)),
        ("coalesced dtypes", lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)])),
        ("gather lists", lambda: dist.all_gather_coalesced([[torch.ones(2)]], [torch.ones(2)])),
        # a tensor on another device (meta: the one non-CPU device without a GPU)
        ("device", lambda: dist.all_reduce(torch.ones(3, device="meta"))),
    ]:
        try:
            call()
            msgs[name] = None
        except (TypeError, ValueError, RuntimeError) as e:
            msgs[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(2)
    dist.all_reduce(t)  # nothing was sent: the group still works
    assert t.tolist() == [float(n)] * 2
    dist.destroy_process_group()
    return msgs


def test_bad_input_raises_before_sending():
    out = check_all(spawn(2, f_bad_input, timeout=90), "bad input")
    for r, msgs in enumerate(out):
        for name, m in msgs.items():  # every message names the op and the rank that raised it
            if name != "coalesced dtypes":
                assert f"(rank {r} of 2)" in m, (name, m)
        assert "int16" in msgs["int16 sum"] and "(3,)" in msgs["int16 sum"], msgs
        assert "t.to(torch.int32)" in msgs["int16 sum"], msgs
        assert msgs["int16 sum"].startswith("TypeError: tutti allreduce (rank"), msgs
        assert "SUM only" in msgs["sparse max"], msgs
        assert msgs["coalesced dtypes"] is not None, msgs  # torch or tutti refuses it
        assert "one per rank" in msgs["gather lists"], msgs
        assert "on meta" in msgs["device"] and ".cpu()" in msgs["device"], msgs


def f_mismatched_lists(rank, n, port):
    import torch

    dist = _init(rank, n, port, seconds=30)
    ts = [torch.ones(4) for _ in range(2 + rank)]  # rank 0 passes 2 tensors, rank 1 passes 3
    try:
        dist.all_reduce_coalesced(ts)
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return None


def test_mismatched_tensor_lists_raise_on_every_rank():
    out = check_all(spawn(2, f_mismatched_lists, timeout=90), "mismatched lists")
    for r, msg in enumerate(out):
        assert msg is not None, f"rank {r} did not notice that the ranks' lists differ"
        assert msg.split(":")[0] in ("MismatchError", "TimeoutError", "PeerLostError"), msg


def f_one_rank_wrong(rank, n, port):
    import time

    import torch

    dist = _init(rank, n, port, seconds=3)
    outs = [torch.zeros(2) for _ in range(n + (rank == 1))]  # rank 1 passes one output too many
    t0 = time.monotonic()
    try:
        dist.all_gather(outs, torch.ones(2))
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        took = time.monotonic() - t0
        if rank == 1:
            time.sleep(5)  # stays alive past the others' timeout (exiting would be a lost peer)
        return f"{type(e).__name__}: {e}", took
    return None, time.monotonic() - t0


def test_a_wrong_list_on_one_rank_is_named_on_every_rank():
    """The rank whose list is wrong raises at once, naming itself and the rule; the others
    cannot know why it did not come, and raise at the group's timeout, naming it."""
    out = check_all(spawn(3, f_one_rank_wrong, timeout=90), "one rank wrong")
    msg, took = out[1]
    assert msg and msg.startswith("ValueError: tutti all_gather (rank 1 of 3)"), msg
    assert "has 4 tensors; it needs 3" in msg, msg
    assert took < 1.0, took
    # Ranks 0 and 2 both wait for rank 1 and time out a few ms apart; the
    # first to give up tells its peers it failed, and why, and on a loaded
    # machine the other may hear that before its own deadline: then it names
    # the rank that gave up and the rank that one waited for (one of the
    # two, never both).
    timed_out = 0
    for r in (0, 2):
        msg, took = out[r]
        assert took < 30, (r, took)  # the group's 3 s timeout, not a hang
        if msg and msg.startswith("TimeoutError"):
            assert "rank(s) [1]" in msg or "rank 1" in msg, (r, msg)
            timed_out += 1
        else:
            other = 2 - r
            assert msg and msg.startswith("PeerLostError"), (r, msg)
            assert f"lost peer rank {other}" in msg, (r, msg)
            # and says why that rank failed, naming the root of it
            assert f"rank {other} timed out waiting for rank 1" in msg, (r, msg)
            assert took > 2.0, (r, took)  # it heard of the other's timeout
    assert timed_out >= 1, out


def f_coalescing_manager(rank, n, port):
    import torch
    from torch.distributed.distributed_c10d import _coalescing_manager

    dist = _init(rank, n, port)
    sizes = [3, 1, 5]
    # all_gather_into_tensor batched: output j holds every rank's input j, rank-major
    ins = [torch.arange(s, dtype=torch.float32) + 100 * rank + 10 * j for j, s in enumerate(sizes)]
    outs = [torch.full((n * s,), -1.0) for s in sizes]
    comm = dist.group.WORLD.comm
    before = comm.ops_done()
    with _coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    assert comm.ops_done() == before + 1, "the batch was not one tutti op"
    for j, (o, s) in enumerate(zip(outs, sizes)):
        want = torch.cat([torch.arange(s, dtype=torch.float32) + 100 * r + 10 * j for r in range(n)])
        assert torch.equal(o, want), (j, o, want)
    # reduce_scatter_tensor batched: output j is block `rank` of the sum of inputs j
    ins = [torch.arange(n * s, dtype=torch.float32) * (rank + 1) + j for j, s in enumerate(sizes)]
    outs = [torch.zeros(s) for s in sizes]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    tot = sum(range(1, n + 1))
    for j, (o, s) in enumerate(zip(outs, sizes)):
        full = torch.arange(n * s, dtype=torch.float32) * tot + n * j
        assert torch.equal(o, full[rank * s:(rank + 1) * s]), (j, o, full)
    # all_reduce batched, tensors not back to back
    ts = [torch.full((s,), float(rank + 1)) for s in sizes]
    before = comm.ops_done()
    with _coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    assert comm.ops_done() == before + 1, "the batch was not one tutti op"
    assert all(torch.equal(t, torch.full_like(t, float(tot))) for t in ts)
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_coalescing_manager_batches(n):
    check_all(spawn(n, f_coalescing_manager, timeout=90), "coalescing manager")

"""Failures surface as Python exceptions on every rank, never as hangs: killed ranks,
timeouts, mismatched calls, abort. Each test runs in fresh processes."""

import os
import time

import numpy as np
import pytest

from harness import check_all, spawn


def _comm(rank, n, port, timeout=60.0):
    import tutti

    return tutti.Communicator.init_rank(tutti.UniqueId.for_address("127.0.0.1", port), n, rank, timeout=timeout)


def f_killed(rank, n, port, victim, async_op):
    import tutti

    c = _comm(rank, n, port)
    x = np.ones(1 << 16, np.float32)
    c.all_reduce(x)
    if rank == victim:
        os._exit(3)  # dies without a word
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            if async_op:
                c.all_reduce(x, async_op=True).wait()
            else:
                c.all_reduce(x)
            time.sleep(0.001)
    except tutti.TuttiError as e:
        return type(e).__name__, str(e), time.monotonic() - t0, getattr(e, "peer", None)
    raise AssertionError("all_reduce kept working after a rank died")


@pytest.mark.parametrize("n,victim,async_op", [(2, 1, False), (3, 1, False), (4, 0, True)])
def test_killed_rank_raises(n, victim, async_op):
    out = spawn(n, f_killed, victim, async_op, timeout=90)
    for r, res in enumerate(out):
        if r == victim:
            assert res is None  # it died
            continue
        assert res is not None and res[0], f"rank {r}: {res}"
        name, msg, took, peer = res[1]
        assert name in ("PeerLostError", "AbortedError", "TimeoutError"), (name, msg)
        assert took < 45, f"rank {r} needed {took:.1f} s to notice: {name}: {msg}"
        if name == "PeerLostError":
            assert "lost peer" in msg


def f_timeout(rank, n, port):
    import tutti

    c = _comm(rank, n, port, timeout=60)
    c.barrier()
    if rank == 1:
        time.sleep(6)  # does not join the next all_reduce in time
        return None
    t0 = time.monotonic()
    try:
        c.all_reduce(np.ones(4), timeout=1.5)
    except tutti.TimeoutError as e:
        assert isinstance(e, TimeoutError) and isinstance(e, tutti.TuttiError)
        return e.waiting_for, e.op, time.monotonic() - t0, str(e)
    raise AssertionError("no timeout")


def test_timeout_names_missing_rank():
    out = check_all(spawn(3, f_timeout, timeout=60), "timeout")
    for r in (0, 2):
        waiting, op, took, msg = out[r]
        assert 1 in waiting or waiting, msg  # rank 1 (or the rank that waits on it) is named
        assert op == "all_reduce"
        assert 1.0 < took < 20, took


def f_mismatch(rank, n, port, kind):
    import tutti

    c = _comm(rank, n, port, timeout=20)
    c.barrier()
    try:
        if kind == "size":
            c.all_reduce(np.ones(100 + 50 * rank, np.float32))
        elif kind == "dtype":
            c.all_reduce(np.ones(64, np.float32 if rank == 0 else np.int32))
        elif kind == "op":
            c.all_reduce(np.ones(64, np.float32), op="sum" if rank == 0 else "max")
        elif kind == "collective":
            if rank == 0:
                c.broadcast(np.ones(64, np.float32), src=0)
            else:
                c.all_reduce(np.ones(64, np.float32))
    except tutti.TuttiError as e:
        return type(e).__name__, str(e)
    finally:
        time.sleep(2)  # stay alive so that the others see the mismatch, not a death
    return None


@pytest.mark.parametrize("kind", ["size", "dtype", "op", "collective"])
def test_mismatch_raises_not_hangs(kind):
    out = check_all(spawn(2, f_mismatch, kind, timeout=60), f"mismatch {kind}")
    raised = [o for o in out if o is not None]
    assert raised, f"no rank noticed a {kind} mismatch"
    for name, msg in raised:
        assert name in ("MismatchError", "TimeoutError", "PeerLostError", "InvalidArgumentError"), (name, msg)


def f_abort(rank, n, port):
    import threading

    import tutti

    c = _comm(rank, n, port, timeout=60)
    c.barrier()
    if rank == 1:
        time.sleep(3)
        return None
    threading.Timer(0.5, c.abort).start()
    t0 = time.monotonic()
    try:
        c.recv(np.empty(10), src=1)  # never sent
    except tutti.AbortedError:
        return time.monotonic() - t0
    raise AssertionError("abort did not interrupt recv")


def test_abort_interrupts_a_waiting_op():
    out = check_all(spawn(2, f_abort, timeout=60), "abort")
    assert out[0] < 10


def f_exception_hierarchy(rank, n, port):
    import tutti

    assert issubclass(tutti.TimeoutError, TimeoutError) and issubclass(tutti.TimeoutError, tutti.TuttiError)
    assert issubclass(tutti.InvalidArgumentError, ValueError)
    assert issubclass(tutti.PeerLostError, ConnectionError)
    assert issubclass(tutti.TuttiError, RuntimeError)
    c = _comm(rank, n, port)
    try:
        c.all_reduce(np.ones(3), out=np.ones(5))
    except tutti.InvalidArgumentError as e:
        return str(e)
    raise AssertionError("no error")


def test_exception_hierarchy_and_message():
    (msg,) = check_all(spawn(1, f_exception_hierarchy), "hierarchy")
    assert "receive buffer" in msg and "rank 0" in msg

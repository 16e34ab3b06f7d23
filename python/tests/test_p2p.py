"""Point to point through the numpy API and the torch backend: tags, receives from any
source, batches that would deadlock if sends and receives ran in issue order, receives of
the wrong size, completion out of issue order, and the 1F1B pipeline example on shared
memory and on TCP."""

import os
import subprocess
import sys

import numpy as np
import pytest

from harness import Ranks

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
BIG = 2 << 20  # float64 elements: 16 MiB


@pytest.fixture(scope="module")
def tcp_ranks():
    """Three ranks whose communicators use TCP between every pair (TUTTI_TRANSPORT=tcp)."""
    r = Ranks(3, timeout=60.0, env={"TUTTI_TRANSPORT": "tcp"})
    yield r
    r.close()


# ---- numpy API, worker side -------------------------------------------------------------


def w_tags(ctx):
    """Rank 1 sends tags 0..3 in that order; rank 0 receives them in reverse order."""
    import tutti

    c, n, r = ctx.comm, ctx.n, ctx.rank
    if n == 1:
        x, y = np.arange(5.0), np.empty(5)
        ws = c.batch_isend_irecv([tutti.P2POp("irecv", y, 0, tag=3), tutti.P2POp("isend", x, 0, tag=3)])
        for w in ws:
            w.wait()
        assert (y == x).all() and ws[0].source == 0 and ws[1].source is None
        return True
    if r == 1:
        ws = [c.isend(np.full(k + 1, k, np.int32), 0, tag=k) for k in range(4)]
        # and three messages of one tag, which arrive in the order they were sent
        ws += [c.isend(np.full(2, 10 + k, np.int32), 0, tag=9) for k in range(3)]
        for w in ws:
            assert w.wait(timeout=30) is None
            assert w.source is None
    elif r == 0:
        for k in reversed(range(4)):
            a = np.empty(k + 1, np.int32)
            assert c.recv(a, 1, tag=k) == 1
            assert (a == k).all(), (k, a)
        for k in range(3):
            a = np.empty(2, np.int32)
            c.recv(a, 1, tag=9)
            assert (a == 10 + k).all(), (k, a)
    c.barrier()
    return True


def w_any_source(ctx):
    """recv(src=None) takes whichever message comes first and says who sent it."""
    c, n, r = ctx.comm, ctx.n, ctx.rank
    if n == 1:
        return True
    if r == 0:
        seen = []
        for _ in range(n - 1):
            a = np.empty(3, np.int64)
            s = c.recv(a, tag=7)  # any source
            assert (a == s).all(), (s, a)
            seen.append(s)
        assert sorted(seen) == list(range(1, n)), seen
        ws = [c.irecv(np.empty(2), tag=8) for _ in range(n - 1)]
        got = []
        for w in ws:
            a = w.wait(timeout=30)
            st = w.status
            assert st is not None and st[0] == w.source and st[1] == 8 and st[2] == 16, st
            assert (a == w.source).all()
            got.append(w.source)
        assert sorted(got) == list(range(1, n)), got
    else:
        c.send(np.full(3, r, np.int64), 0, tag=7)
        c.send(np.full(2, float(r)), 0, tag=8)
    c.barrier()
    return True


def w_big_exchange(ctx, recv_first):
    """A ring shift of 16 MiB per rank, every rank listing its send first (or its receive
    first), through batch_isend_irecv; then a pairwise swap with isend + blocking recv."""
    import tutti

    c, n, r = ctx.comm, ctx.n, ctx.rank
    x = np.full(BIG, float(r))
    y = np.zeros(BIG)
    nxt, prev = (r + 1) % n, (r - 1) % n
    ops = [tutti.P2POp(tutti.isend, x, nxt, group=c), tutti.P2POp(c.irecv, y, prev)]
    if recv_first:
        ops.reverse()
    ws = c.batch_isend_irecv(ops)
    assert len(ws) == 2
    for w in ws:
        w.wait(timeout=60)
    assert (y == prev).all()
    if n > 1 and r < n - n % 2:  # pairs (0, 1), (2, 3): both send first
        peer = r + 1 if r % 2 == 0 else r - 1
        z = np.zeros(BIG)
        w = c.isend(x, peer, tag=4)
        assert c.recv(z, peer, tag=4) == peer
        w.wait(timeout=60)
        assert (z == peer).all()
    c.barrier()
    return True


def w_too_small(ctx):
    """A receive smaller than its message raises SizeMismatchError, nothing is written,
    and the next messages and collectives work. A rendezvous send (over 128 KiB) raises
    too; an eager one has completed once it left (as in MPI), and its receiver alone
    raises."""
    import tutti

    c, n, r = ctx.comm, ctx.n, ctx.rank
    if n > 1 and r == 0:
        try:
            c.send(np.ones(20000), 1, tag=3)
        except tutti.SizeMismatchError as e:
            assert isinstance(e, ValueError) and isinstance(e, tutti.TuttiError)
            assert (e.rank, e.peer, e.tag, e.message, e.buffer) == (0, 1, 3, 160000, 136000), str(e)
            assert "160000" in str(e) and "136000" in str(e)
        else:
            raise AssertionError("the sender did not raise")
        c.send(np.ones(100), 1, tag=3)  # eager: completes once it has left
        w = c.isend(np.ones(10), 1)  # an exact receive of another size fails at the receiver
        w.wait(timeout=30)
        assert w.is_success()
        c.send(np.arange(50.0), 1, tag=3)
    elif n > 1 and r == 1:
        big = np.full(17000, 7.0)
        try:
            c.recv(big, 0, tag=3)
        except tutti.SizeMismatchError as e:
            assert isinstance(e, ValueError) and isinstance(e, tutti.TuttiError)
            assert (e.rank, e.peer, e.tag, e.message, e.buffer) == (1, 0, 3, 160000, 136000), str(e)
        else:
            raise AssertionError("the receiver did not raise")
        assert (big == 7.0).all(), "the receive buffer was written"
        b = np.full(50, 7.0)
        try:
            c.recv(b, 0, tag=3)
        except tutti.SizeMismatchError as e:
            assert (e.rank, e.peer, e.tag, e.message, e.buffer) == (1, 0, 3, 800, 400), str(e)
            assert "800" in str(e) and "400" in str(e)
        else:
            raise AssertionError("the receiver did not raise")
        assert (b == 7.0).all(), "the receive buffer was written"
        try:
            c.recv(np.empty(12), 0)
        except tutti.SizeMismatchError:
            pass
        else:
            raise AssertionError("no SizeMismatchError for a larger receive")
        assert c.recv(b, 0, tag=3) == 0
        assert (b == np.arange(50.0)).all()
    x = np.ones(3)
    c.all_reduce(x)
    assert (x == n).all()
    return True


def w_p2p_arg_errors(ctx):
    import tutti

    c, n, r = ctx.comm, ctx.n, ctx.rank
    x = np.zeros(4)
    cases = [
        (lambda: c.send(x, 0, tag=-1), ValueError, "tag"),
        (lambda: c.isend(x, 0, tag=1 << 32), ValueError, "tag"),
        (lambda: c.send(x, n), ValueError, "out of range"),
        (lambda: c.recv(x, r), tutti.InvalidArgumentError, "oneself"),
        (lambda: tutti.P2POp("isend", x, None), ValueError, "destination"),
        (lambda: tutti.P2POp("all_reduce", x, 0), ValueError, "isend or irecv"),
        (lambda: c.batch_isend_irecv([tutti.P2POp("irecv", x, 0), tutti.P2POp("irecv", x[1:], 0)]), ValueError,
         "overlaps"),
        (lambda: c.batch_isend_irecv([(x, 0)]), TypeError, "P2POp"),
    ]
    for i, (f, exc, text) in enumerate(cases):
        try:
            f()
        except exc as e:
            assert text in str(e), f"case {i}: {e!r} does not mention {text!r}"
        else:
            raise AssertionError(f"case {i}: no {exc}")
    assert c.batch_isend_irecv([]) == []
    c.barrier()
    return True


# ---- torch backend, worker side ---------------------------------------------------------


def t_tags_and_any_source(ctx):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    if n == 1:
        dist.barrier()
        return True
    if r == 1:
        ws = [dist.isend(torch.full((k + 1,), float(k)), dst=0, tag=k) for k in range(4)]
        for w in ws:
            w.wait()
    elif r == 0:
        for k in reversed(range(4)):
            a = torch.empty(k + 1)
            assert dist.recv(a, src=1, tag=k) == 1
            assert torch.all(a == k), (k, a)
    if r == 0:
        seen = []
        for _ in range(n - 1):
            a = torch.empty(5, dtype=torch.int64)
            s = dist.recv(a, tag=11)  # src=None: any source, returns the sender
            assert torch.all(a == s), (s, a)
            seen.append(s)
        assert sorted(seen) == list(range(1, n)), seen
        w = dist.irecv(torch.empty(5, dtype=torch.int64), tag=12)
        w.wait()
        assert w._source_rank() in range(1, n)
        for _ in range(n - 2):
            dist.recv(torch.empty(5, dtype=torch.int64), tag=12)
    else:
        dist.send(torch.full((5,), r, dtype=torch.int64), dst=0, tag=11)
        dist.send(torch.full((5,), r, dtype=torch.int64), dst=0, tag=12)
    dist.barrier()
    return True


def t_big_batch(ctx, recv_first):
    """torch.distributed.batch_isend_irecv: a ring shift of 16 MiB per rank, both ways at
    once (four ops per rank), in either order."""
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    nxt, prev = (r + 1) % n, (r - 1) % n
    x = torch.full((BIG,), float(r), dtype=torch.float64)
    fwd = torch.zeros(BIG, dtype=torch.float64)
    back = torch.zeros(BIG, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, x, nxt, tag=1), dist.P2POp(dist.isend, x, prev, tag=2),
           dist.P2POp(dist.irecv, fwd, prev, tag=1), dist.P2POp(dist.irecv, back, nxt, tag=2)]
    if recv_first:
        ops.reverse()
    reqs = dist.batch_isend_irecv(ops)
    for q in reqs:
        q.wait()
    assert torch.all(fwd == prev) and torch.all(back == nxt)
    dist.barrier()
    return True


def t_too_small(ctx):
    """A receive smaller than its message: a rendezvous message (over 128 KiB) raises on
    both sides, an eager one at the receiver alone (its send completed once it left)."""
    import torch

    import tutti

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    if n > 1 and r == 0:
        try:
            dist.send(torch.ones(40000), dst=1, tag=5)
        except tutti.SizeMismatchError as e:
            assert (e.message, e.buffer, e.peer, e.tag) == (160000, 136000, 1, 5), str(e)
        else:
            raise AssertionError("the sender did not raise")
        dist.send(torch.ones(10), dst=1, tag=5)  # eager: completes once it has left
        dist.send(torch.arange(6.0), dst=1, tag=5)
    elif n > 1 and r == 1:
        big = torch.full((34000,), 7.0)
        try:
            dist.recv(big, src=0, tag=5)
        except tutti.SizeMismatchError as e:
            assert (e.message, e.buffer, e.peer, e.tag) == (160000, 136000, 0, 5), str(e)
        else:
            raise AssertionError("the receiver did not raise")
        assert torch.all(big == 7.0)
        b = torch.full((6,), 7.0)
        try:
            dist.recv(b, src=0, tag=5)
        except tutti.SizeMismatchError as e:
            assert (e.message, e.buffer, e.peer, e.tag) == (40, 24, 0, 5), str(e)
        else:
            raise AssertionError("the receiver did not raise")
        assert torch.all(b == 7.0)
        dist.recv(b, src=0, tag=5)
        assert torch.equal(b, torch.arange(6.0))
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 2
    return True


def t_completion_order(ctx):
    """An op's Work (and future) completes when the op does, not after earlier ops: rank
    0's isend and an async all-reduce complete while its earlier irecv waits for a message
    that rank 1 sends only after both (it deadlocked when one completer thread took the
    ops in issue order)."""
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    if n == 1:
        return True
    if r == 0:
        late = torch.zeros(4)
        w1 = dist.irecv(late, src=1, tag=1)
        w2 = dist.isend(torch.ones(4), dst=1, tag=0)
        w2.wait()
        w2.get_future().wait()
        t = torch.ones(2)
        dist.all_reduce(t, async_op=True).get_future().wait()
        dist.send(torch.full((4,), 2.0), dst=1, tag=2)
        w1.wait()
        assert late.tolist() == [3.0] * 4 and w1.get_future().wait()[0] is late
    else:
        a = torch.empty(4)
        if r == 1:
            dist.recv(a, src=0, tag=0)
        t = torch.ones(2)
        dist.all_reduce(t)
        if r == 1:
            dist.recv(a, src=0, tag=2)
            assert a.tolist() == [2.0] * 4
            dist.send(torch.full((4,), 3.0), dst=0, tag=1)
    dist.barrier()
    return True


# ---- tests --------------------------------------------------------------------------------


def test_p2p_tags(ranks):
    ranks.run(w_tags)


def test_p2p_any_source(ranks):
    ranks.run(w_any_source)


@pytest.mark.parametrize("recv_first", [False, True], ids=["send_first", "recv_first"])
def test_p2p_big_exchange(ranks, recv_first):
    ranks.run(w_big_exchange, recv_first)


def test_p2p_too_small_receive(ranks):
    ranks.run(w_too_small)


def test_p2p_argument_errors(ranks):
    ranks.run(w_p2p_arg_errors)


def test_p2p_numpy_over_tcp(tcp_ranks):
    for fn, args in ((w_tags, ()), (w_any_source, ()), (w_big_exchange, (False,)), (w_too_small, ())):
        tcp_ranks.run(fn, *args)


def test_torch_p2p_tags_and_any_source(ranks):
    pytest.importorskip("torch")
    ranks.run(t_tags_and_any_source)


@pytest.mark.parametrize("recv_first", [False, True], ids=["send_first", "recv_first"])
def test_torch_p2p_big_batch(ranks, recv_first):
    pytest.importorskip("torch")
    ranks.run(t_big_batch, recv_first)


def test_torch_p2p_too_small_receive(ranks):
    pytest.importorskip("torch")
    ranks.run(t_too_small)


def test_torch_p2p_completion_order(ranks):
    pytest.importorskip("torch")
    ranks.run(t_completion_order)


def test_torch_p2p_over_tcp(tcp_ranks):
    pytest.importorskip("torch")
    for fn, args in ((t_tags_and_any_source, ()), (t_big_batch, (False,)), (t_too_small, ()),
                     (t_completion_order, ())):
        tcp_ranks.run(fn, *args)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_pipeline_1f1b_example(transport):
    """The 1F1B example on 4 stages: forward sends and backward receives in flight together
    through batch_isend_irecv; every stage bit for bit equal to a one-process run."""
    pytest.importorskip("torch")
    env = dict(os.environ, TUTTI_TRANSPORT=transport)
    cmd = [sys.executable, os.path.join(EXAMPLES, "pipeline_1f1b.py"), "--spawn", "4", "--steps", "3"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-4000:]}"
    assert p.stdout.count("matches the one-process run bit for bit") == 4, p.stdout[-4000:]
    assert p.stdout.count(f"transport {transport}") == 4

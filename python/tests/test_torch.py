"""Every collective through torch.distributed with backend "tutti", on 1-4 ranks, every dtype
and op, against numpy references computed on each rank."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from refdata import assert_equal, data, reduce_ref  # noqa: E402

TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")
TORCH_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")


def tdata(rank, count, dtype, op, salt=0):
    """(torch tensor, numpy twin) of rank's data; bfloat16 comes from float32 (exact small ints)."""
    import torch

    npdt = "float32" if dtype == "bfloat16" else dtype
    a = data(rank, count, npdt, op.lower().replace("product", "prod"), salt)
    return torch.from_numpy(a.copy()).to(getattr(torch, dtype)), a


def tref(n, count, dtype, op, salt=0):
    import torch

    npdt = "float32" if dtype == "bfloat16" else dtype
    o = op.lower().replace("product", "prod")
    want = reduce_ref([data(q, count, npdt, o, salt) for q in range(n)], o, npdt)
    return torch.from_numpy(np.ascontiguousarray(want)).to(getattr(torch, dtype))


def teq(got, want, what, dtype=None, op=None):
    import torch

    if dtype == "bfloat16" or got.dtype == torch.bfloat16:
        got, want = got.float(), want.float()
    assert_equal(got.numpy(), want.numpy(), what, "float32" if dtype == "bfloat16" else dtype,
                 (op or "").lower())


# ---- worker-side functions ------------------------------------------------------------------


def t_all_reduce(ctx, dtype):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    for op in TORCH_OPS:
        if dtype == "bool" and op == "AVG":
            continue
        for count in (0, 1, 13, 4099):
            t, _ = tdata(r, count, dtype, op)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            teq(t, tref(n, count, dtype, op), f"all_reduce {dtype} {op} count={count}", dtype, op)
        # asynchronous, with the future DDP uses
        t, _ = tdata(r, 33, dtype, op)
        w = dist.all_reduce(t, op=getattr(dist.ReduceOp, op), async_op=True)
        fut = w.get_future()
        val = fut.wait()
        assert isinstance(val, list) and val[0] is t
        assert w.wait() and w.is_completed() and w.is_success()
        teq(t, tref(n, 33, dtype, op), f"async all_reduce {dtype} {op}", dtype, op)
        # a non-contiguous tensor is copied once, transparently
        t2, _ = tdata(r, 40, dtype, op)
        view = t2.view(8, 5).t()
        dist.all_reduce(view, op=getattr(dist.ReduceOp, op))
        teq(t2, tref(n, 40, dtype, op), f"non-contiguous all_reduce {dtype} {op}", dtype, op)
    return True


def t_rooted(ctx, dtype):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    for root in range(n):
        t, _ = tdata(r, 21, dtype, "MAX", salt=root)
        dist.broadcast(t, src=root)
        teq(t, tdata(root, 21, dtype, "MAX", salt=root)[0], f"broadcast {dtype} root={root}")
        for op in ("SUM", "MAX") if dtype != "bool" else ("MAX", "MIN"):
            t, _ = tdata(r, 9, dtype, op)
            dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, op))
            if r == root:
                teq(t, tref(n, 9, dtype, op), f"reduce {dtype} {op} root={root}", dtype, op)
        x, _ = tdata(r, 4, dtype, "MAX")
        outs = [torch.empty(4, dtype=x.dtype) for _ in range(n)] if r == root else None
        dist.gather(x, outs, dst=root)
        if r == root:
            for q in range(n):
                teq(outs[q], tdata(q, 4, dtype, "MAX")[0], f"gather {dtype} root={root} from {q}")
        full = [tdata(root, 3, dtype, "MAX", salt=q)[0] for q in range(n)]
        y = torch.empty(3, dtype=x.dtype)
        dist.scatter(y, full if r == root else None, src=root)
        teq(y, tdata(root, 3, dtype, "MAX", salt=r)[0], f"scatter {dtype} root={root}")
    return True


def t_gathers(ctx, dtype):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    x, _ = tdata(r, 5, dtype, "MAX")
    want = [tdata(q, 5, dtype, "MAX")[0] for q in range(n)]
    outs = [torch.empty(5, dtype=x.dtype) for _ in range(n)]
    dist.all_gather(outs, x)
    for q in range(n):
        teq(outs[q], want[q], f"all_gather {dtype} from {q}")
    big = torch.empty(5 * n, dtype=x.dtype)
    dist.all_gather(list(big.chunk(n)), x)  # back to back: no temporary
    teq(big, torch.cat(want), f"all_gather chunks {dtype}")
    flat = torch.empty(5 * n, dtype=x.dtype)
    dist.all_gather_into_tensor(flat, x)
    teq(flat, torch.cat(want), f"all_gather_into_tensor {dtype}")
    # uneven sizes: rank q contributes q + 1 elements
    mine, _ = tdata(r, r + 1, dtype, "MAX", salt=9)
    outs = [torch.empty(q + 1, dtype=x.dtype) for q in range(n)]
    dist.all_gather(outs, mine)
    for q in range(n):
        teq(outs[q], tdata(q, q + 1, dtype, "MAX", salt=9)[0], f"uneven all_gather {dtype} from {q}")
    # async all_gather_into_tensor
    w = dist.all_gather_into_tensor(flat, x, async_op=True)
    assert w.get_future().wait()[0] is flat
    teq(flat, torch.cat(want), f"async all_gather_into_tensor {dtype}")
    if hasattr(dist, "gather_single"):
        g = torch.empty(5 * n, dtype=x.dtype) if r == 0 else None
        dist.gather_single(x, g, dst=0)
        if r == 0:
            teq(g, torch.cat(want), f"gather_single {dtype}")
    return True


def t_reduce_scatters(ctx, dtype):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    for op in TORCH_OPS:
        if dtype == "bool" and op == "AVG":
            continue
        count = 6
        t, _ = tdata(r, n * count, dtype, op)
        want = tref(n, n * count, dtype, op)[r * count:(r + 1) * count]
        out = torch.empty(count, dtype=t.dtype)
        dist.reduce_scatter_tensor(out, t, op=getattr(dist.ReduceOp, op))
        teq(out, want, f"reduce_scatter_tensor {dtype} {op}", dtype, op)
        out2 = torch.empty(count, dtype=t.dtype)
        dist.reduce_scatter(out2, list(t.chunk(n)), op=getattr(dist.ReduceOp, op))
        teq(out2, want, f"reduce_scatter list {dtype} {op}", dtype, op)
        # separate (non-adjacent) input tensors
        ins = [c.clone() for c in t.chunk(n)]
        out3 = torch.empty(count, dtype=t.dtype)
        dist.reduce_scatter(out3, ins, op=getattr(dist.ReduceOp, op))
        teq(out3, want, f"reduce_scatter cloned list {dtype} {op}", dtype, op)
    # uneven blocks: block q has q + 2 elements
    sizes = [q + 2 for q in range(n)]
    t, _ = tdata(r, sum(sizes), dtype, "MAX")
    out = torch.empty(sizes[r], dtype=t.dtype)
    dist.reduce_scatter(out, list(t.split(sizes)), op=dist.ReduceOp.MAX)
    lo = sum(sizes[:r])
    teq(out, tref(n, sum(sizes), dtype, "MAX")[lo:lo + sizes[r]], f"uneven reduce_scatter {dtype}")
    return True


def t_all_to_all(ctx, dtype):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    src = [tdata(q, 4 * n, dtype, "MAX")[0] for q in range(n)]
    out = torch.empty(4 * n, dtype=src[0].dtype)
    dist.all_to_all_single(out, src[r])
    teq(out, torch.cat([src[q][4 * r:4 * r + 4] for q in range(n)]), f"all_to_all_single {dtype}")
    # with split sizes: rank r sends (p + r) % 3 + 1 rows of 2 to rank p
    def rows(a, b):
        return (a + b) % 3 + 1

    ins = tdata(r, 2 * sum(rows(p, r) for p in range(n)), dtype, "MAX", salt=3)[0].view(-1, 2)
    out = torch.empty(sum(rows(r, q) for q in range(n)), 2, dtype=ins.dtype)
    dist.all_to_all_single(out, ins, [rows(r, q) for q in range(n)], [rows(p, r) for p in range(n)])
    parts = []
    for q in range(n):
        theirs = tdata(q, 2 * sum(rows(p, q) for p in range(n)), dtype, "MAX", salt=3)[0].view(-1, 2)
        off = sum(rows(p, q) for p in range(r))
        parts.append(theirs[off:off + rows(r, q)])
    teq(out, torch.cat(parts), f"all_to_all_single splits {dtype}")
    # list form with uneven sizes
    in_list = [tdata(r, p + 1, dtype, "MAX", salt=p)[0] for p in range(n)]
    out_list = [torch.empty(r + 1, dtype=ins.dtype) for _ in range(n)]
    dist.all_to_all(out_list, in_list)
    for q in range(n):
        teq(out_list[q], tdata(q, r + 1, dtype, "MAX", salt=r)[0], f"all_to_all list {dtype} from {q}")
    return True


def t_p2p(ctx):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    if n == 1:
        dist.barrier()
        return True
    x = torch.arange(1000, dtype=torch.float32) + 1
    if r == 0:
        dist.send(x, dst=1)
        y = torch.empty(1000, dtype=torch.bfloat16)
        dist.recv(y, src=n - 1)
        teq(y, x.bfloat16(), "recv bf16 from last")
    else:
        z = torch.empty(1000)
        if r >= 1:
            src = r - 1
            if r == 1:
                dist.recv(z, src=0)
            else:
                w = dist.irecv(z, src=src)
                w.wait()
            teq(z, x, f"recv on {r}")
        if r < n - 1:
            dist.isend(z, dst=r + 1).wait()
        else:
            dist.send(z.bfloat16(), dst=0)
    # non-contiguous receive
    if r == 0:
        dist.send(torch.arange(12, dtype=torch.int64), dst=1)
    elif r == 1:
        buf = torch.zeros(4, 3, dtype=torch.int64).t()
        dist.recv(buf, src=0)
        assert torch.equal(buf.reshape(-1), torch.arange(12)), buf
    dist.barrier()
    return True


def t_subgroups(ctx):
    import torch

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    odd = [q for q in range(n) if q % 2 == 1]
    everyone = dist.new_group(list(range(n)))
    g = dist.new_group(odd) if odd else None
    if r in odd:
        x = torch.tensor([float(r)])
        dist.all_reduce(x, group=g)
        assert x.item() == sum(odd)
        y = torch.zeros(2)
        if r == odd[0]:
            y += 7
        dist.broadcast(y, src=odd[0], group=g)
        assert y.tolist() == [7.0, 7.0]
    z = torch.ones(3)
    dist.all_reduce(z, group=everyone)
    assert z.tolist() == [float(n)] * 3
    assert dist.get_backend(everyone) == "tutti"
    return True


def t_errors(ctx):
    import torch

    import tutti

    dist = ctx.dist()
    cases = [
        (lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), TypeError, "cannot be reduced"),
        (lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG), ValueError, "bool"),
        (lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR), ValueError, "not supported"),
        (lambda: dist.all_gather_into_tensor(torch.empty(3 * ctx.n + 1), torch.ones(3)), (ValueError, RuntimeError),
         "receive buffer"),
    ]
    for i, (f, exc, text) in enumerate(cases):
        try:
            f()
        except exc as e:
            assert text in str(e), f"case {i}: {e!r}"
        else:
            raise AssertionError(f"case {i}: no {exc}")
    assert issubclass(tutti.InvalidArgumentError, ValueError)
    t = torch.ones(4)
    dist.all_reduce(t)  # still working
    assert t.tolist() == [float(ctx.n)] * 4
    # int16 and complex still move
    a = torch.full((3,), ctx.rank, dtype=torch.int16)
    dist.broadcast(a, src=0)
    assert a.tolist() == [0, 0, 0]
    c = torch.full((2,), 1 + 1j, dtype=torch.complex64)
    dist.all_reduce(c)  # torch views complex as float
    assert c.tolist() == [complex(ctx.n, ctx.n)] * 2
    return True


def t_first_call_fails(ctx):
    """An op the backend cuts into several core calls (one per tensor of a list) fails if
    any of them fails, not only the last: the first call here is rejected at once (its
    send length is short), the second runs; wait() must raise the first call's error."""
    import torch

    import tutti
    from tutti import _codes as C
    from tutti._torch_util import _reduce_codes

    dist = ctx.dist()
    import tutti.torch as tt

    # A group of its own (earlier tests in this worker may have made others).
    before = set(tt._groups)
    group = dist.new_group(list(range(ctx.n)))
    (pg,) = set(tt._groups) - before
    a, b = torch.ones(8), torch.ones(16)
    calls = []
    for t, short in ((a, 4), (b, 0)):
        code, opc = _reduce_codes(t, dist.ReduceOp.SUM)
        nb = t.numel() * t.element_size()
        calls.append((C.ALL_REDUCE, 0, code, opc, t.numel(), t.data_ptr(), nb - short, t.data_ptr(), nb, None))
    w = pg._submit(calls, [a, b], [], [a, b], True)
    try:
        w.wait()
    except tutti.InvalidArgumentError:
        pass
    else:
        raise AssertionError("the first call's error was lost")
    assert not w.is_success()
    assert torch.all(b == ctx.n)
    dist.barrier(group=group)
    return True


def t_many_async(ctx):
    """Many overlapping async ops, completed in order, futures chained."""
    import torch

    dist = ctx.dist()
    n = ctx.n
    ts = [torch.full((1000 + i,), float(i)) for i in range(30)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    chained = [w.get_future().then(lambda f: f.value()[0].sum().item()) for w in works]
    for i, (t, f) in enumerate(zip(ts, chained)):
        assert f.wait() == float(i * n) * (1000 + i)
        assert torch.all(t == i * n)
    b = dist.barrier(async_op=True)
    b.wait()
    return True


def t_blocking_callbacks(ctx):
    """A future callback that issues another op and waits for it (as torch's PowerSGD hook
    does) must not deadlock the thread that completes futures."""
    import torch

    dist = ctx.dist()
    n = ctx.n
    a, b, c = torch.ones(10), torch.ones(20), torch.ones(30)

    def second(f):
        return dist.all_reduce(b, async_op=True).get_future().wait()[0].sum().item()

    def third(f):
        return dist.all_reduce(c, async_op=True).get_future().wait()[0].sum().item() + f.value()

    fut = dist.all_reduce(a, async_op=True).get_future().then(second).then(third)
    assert fut.wait() == 20 * n + 30 * n
    assert torch.all(a == n)
    return True


def t_callback_waits_own_work(ctx):
    """A future callback that waits on its own op's Work (the op is done; its callback,
    this one, is what runs) returns instead of waiting for itself forever."""
    import torch

    dist = ctx.dist()
    t = torch.ones(16)
    w = dist.all_reduce(t, async_op=True)
    seen = []

    def cb(f):
        seen.append((w.wait(), w.is_completed()))
        return f.value()

    w.get_future().then(cb).wait()
    assert seen == [(True, True)], seen
    assert torch.all(t == ctx.n)
    return True


def _tutti_group(g):
    """The ProcessGroupTutti behind a torch group."""
    import torch

    from tutti.torch import ProcessGroupTutti

    return g if isinstance(g, ProcessGroupTutti) else g._get_backend(torch.device("cpu"))


def _raises_destroyed(fn):
    """Asserts that fn() raises the RuntimeError of a destroyed communicator."""
    try:
        fn()
    except RuntimeError as e:
        assert "destroyed" in str(e), repr(e)
        return
    raise AssertionError("an op on a destroyed communicator ran")


def t_destroy_in_callback(ctx):
    """Destroying a group's communicator from an op's callback returns (the release
    follows once the callback has returned); later ops on it raise, other groups work."""
    import torch

    dist = ctx.dist()
    g = dist.new_group(list(range(ctx.n)))
    pg = _tutti_group(g)
    t = torch.ones(8)
    w = dist.all_reduce(t, group=g, async_op=True)
    w.get_future().then(lambda f: pg.comm.destroy()).wait()
    assert torch.all(t == ctx.n)
    _raises_destroyed(lambda: dist.all_reduce(torch.ones(2), group=g))
    z = torch.ones(3)
    dist.all_reduce(z)
    assert z.tolist() == [float(ctx.n)] * 3
    return True


def t_destroy_subgroup(ctx):
    """dist.destroy_process_group(subgroup) releases that group's communicator; the world
    and groups made later keep working."""
    import torch

    dist = ctx.dist()
    n = ctx.n
    g = dist.new_group(list(range(n)))
    pg = _tutti_group(g)
    assert isinstance(g.group_name, str) and g.group_name
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    assert t.tolist() == [float(n)] * 4
    dist.destroy_process_group(g)
    _raises_destroyed(pg.comm.ops_done)
    z = torch.ones(3)
    dist.all_reduce(z)
    assert z.tolist() == [float(n)] * 3
    g2 = dist.new_group(list(range(n)))
    u = torch.ones(2)
    dist.all_reduce(u, group=g2)
    assert u.tolist() == [float(n)] * 2
    return True


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_all_reduce(ranks, dtype):
    ranks.run(t_all_reduce, dtype)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "int64", "uint8", "bool"))
def test_torch_broadcast_reduce_gather_scatter(ranks, dtype):
    ranks.run(t_rooted, dtype)


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16", "int32", "bool"))
def test_torch_all_gather(ranks, dtype):
    ranks.run(t_gathers, dtype)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_reduce_scatter(ranks, dtype):
    ranks.run(t_reduce_scatters, dtype)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "int8"))
def test_torch_all_to_all(ranks, dtype):
    ranks.run(t_all_to_all, dtype)


def test_torch_send_recv(ranks):
    ranks.run(t_p2p)


def test_torch_subgroups(ranks):
    ranks.run(t_subgroups)


def test_torch_errors(ranks):
    ranks.run(t_errors)


def test_torch_first_call_fails(ranks):
    ranks.run(t_first_call_fails)


def test_torch_many_async(ranks):
    ranks.run(t_many_async)


def test_torch_blocking_future_callbacks(ranks):
    ranks.run(t_blocking_callbacks)


def test_torch_callback_waits_own_work(ranks):
    ranks.run(t_callback_waits_own_work)


def test_torch_destroy_in_callback(ranks):
    ranks.run(t_destroy_in_callback)


def test_torch_destroy_subgroup(ranks):
    ranks.run(t_destroy_subgroup)

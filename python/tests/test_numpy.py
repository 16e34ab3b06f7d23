"""Every collective through the numpy API, on 1-4 ranks, every dtype and op, against numpy."""

import numpy as np
import pytest

import tutti
from refdata import DTYPES, OPS, assert_equal, data, reduce_ref

COUNTS = (0, 1, 7, 1031)


# ---- worker-side functions (run on every rank) ----------------------------------------------


def w_all_reduce(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for op in OPS:
        if dtype == "bool" and op == "avg":
            continue
        for count in COUNTS:
            mine = data(r, count, dtype, op)
            want = reduce_ref([data(q, count, dtype, op) for q in range(n)], op, dtype)
            x = mine.copy()
            got = c.all_reduce(x, op=op)
            assert got is x
            assert_equal(x, want, f"all_reduce {dtype} {op} count={count} in place", dtype, op)
            out = np.empty_like(mine)
            c.all_reduce(mine, op=getattr(tutti.ReduceOp, op.upper()), out=out)
            assert_equal(out, want, f"all_reduce {dtype} {op} count={count} out=", dtype, op)
            assert_equal(mine, data(r, count, dtype, op), "all_reduce input untouched")
    return True


def w_all_reduce_large(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    count = (1 << 20) + 3
    x = np.full(count, r + 1, np.float32)
    x[::1000] = np.arange(len(x[::1000]), dtype=np.float32) * (r + 1)
    want = x / (r + 1) * (n * (n + 1) // 2)
    c.all_reduce(x)
    assert_equal(x, want, "all_reduce 4 MiB float32")
    return True


def w_broadcast(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for root in range(n):
        for count in COUNTS:
            x = data(r, count, dtype, "max", salt=root)
            c.broadcast(x, src=root)
            assert_equal(x, data(root, count, dtype, "max", salt=root), f"broadcast {dtype} root={root} count={count}")
    return True


def w_reduce(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for op in OPS:
        if dtype == "bool" and op == "avg":
            continue
        for root in range(n):
            count = 17
            want = reduce_ref([data(q, count, dtype, op) for q in range(n)], op, dtype)
            x = data(r, count, dtype, op)
            res = c.reduce(x, dst=root, op=op)
            if r == root:
                assert res is x
                assert_equal(x, want, f"reduce {dtype} {op} root={root} in place", dtype, op)
            else:
                assert res is None
                assert_equal(x, data(r, count, dtype, op), "reduce: non-root input untouched")
            out = np.empty(count, dtype) if r == root else None
            res = c.reduce(data(r, count, dtype, op), dst=root, op=op, out=out)
            if r == root:
                assert_equal(out, want, f"reduce {dtype} {op} root={root} out=", dtype, op)
    return True


def w_all_gather(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for count in COUNTS:
        x = data(r, count, dtype, "max").reshape(count, 1)
        out = c.all_gather(x)
        want = np.stack([data(q, count, dtype, "max").reshape(count, 1) for q in range(n)])
        assert_equal(out, want, f"all_gather {dtype} count={count}")
        flat = np.empty(n * count, dtype)
        c.all_gather(x, out=flat)
        assert_equal(flat, want.reshape(-1), f"all_gather {dtype} count={count} out=")
        # in place: this rank's block of the output is the input
        buf = np.zeros((n, count), dtype)
        buf[r] = data(r, count, dtype, "max")
        c.all_gather(buf[r], out=buf)
        assert_equal(buf, want.reshape(n, count), f"all_gather {dtype} count={count} in place")
    return True


def w_reduce_scatter(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for op in OPS:
        if dtype == "bool" and op == "avg":
            continue
        for count in (0, 1, 5, 257):
            ins = [data(q, n * count, dtype, op) for q in range(n)]
            want = reduce_ref(ins, op, dtype)[r * count:(r + 1) * count]
            out = c.reduce_scatter(ins[r].reshape(n, count), op=op)
            assert_equal(out, want, f"reduce_scatter {dtype} {op} count={count}", dtype, op)
            out2 = np.empty(count, dtype)
            c.reduce_scatter(ins[r], op=op, out=out2)
            assert_equal(out2, want, f"reduce_scatter {dtype} {op} count={count} out=", dtype, op)
    return True


def w_all_to_all(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for count in (0, 1, 6):
        ins = [data(q, n * count, dtype, "max").reshape(n, count) for q in range(n)]
        out = c.all_to_all(ins[r])
        want = np.stack([ins[q][r] for q in range(n)])
        assert_equal(out, want, f"all_to_all {dtype} count={count}")
    # uneven: rank r sends (p + r) % 3 elements to rank p
    sc = [(p + r) % 3 for p in range(n)]
    rc = [(r + q) % 3 for q in range(n)]
    mine = data(r, sum(sc), dtype, "max")
    out = c.all_to_all_v(mine, sc, rc)
    parts = []
    for q in range(n):
        theirs = data(q, sum((p + q) % 3 for p in range(n)), dtype, "max")
        off = sum((p + q) % 3 for p in range(r))
        parts.append(theirs[off:off + (r + q) % 3])
    assert_equal(out, np.concatenate(parts) if parts else np.empty(0, dtype), f"all_to_all_v {dtype}")
    return True


def w_gather_scatter(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for root in range(n):
        for count in (0, 3):
            x = data(r, count, dtype, "max", salt=root)
            out = c.gather(x, dst=root)
            if r == root:
                want = np.stack([data(q, count, dtype, "max", salt=root) for q in range(n)])
                assert_equal(out, want, f"gather {dtype} root={root} count={count}")
            else:
                assert out is None
            full = data(root, n * count, dtype, "max", salt=root).reshape(n, count)
            got = c.scatter(np.empty(count, dtype), full if r == root else None, src=root)
            assert_equal(got, full[r], f"scatter {dtype} root={root} count={count}")
    return True


def w_send_recv(ctx, dtype):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    if n == 1:
        return True
    count = 300
    # a chain 0 -> 1 -> ... -> n-1, then back from n-1 to 0
    x = np.empty(count, dtype)
    if r > 0:
        c.recv(x, src=r - 1)
        assert_equal(x, data(0, count, dtype, "max"), f"chain recv {dtype} on {r}")
    else:
        x[:] = data(0, count, dtype, "max")
    if r < n - 1:
        c.send(x, dst=r + 1)
    if r == n - 1:
        c.send(x, dst=0)
    if r == 0:
        y = np.empty(count, dtype)
        c.recv(y, src=n - 1)
        assert_equal(y, x, f"return trip {dtype}")
    c.barrier()
    return True


def w_moved_types(ctx):
    """Types that cannot be reduced still move (as bytes)."""
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for dt in (np.int16, np.complex64, np.dtype([("a", np.int32), ("b", np.float64)])):
        x = np.zeros(5, dt)
        if r == 0:
            x = np.frombuffer(bytes(range(x.nbytes)), dtype=dt).copy()
        want = np.frombuffer(bytes(range(x.nbytes)), dtype=dt)
        c.broadcast(x, src=0)
        assert x.tobytes() == want.tobytes()
        g = c.all_gather(np.full(3, r, dtype=np.int16))
        assert_equal(g, np.repeat(np.arange(n, dtype=np.int16), 3).reshape(n, 3), "all_gather int16")
        a2a = c.all_to_all(np.arange(n * 2, dtype=np.complex64) + 100 * r)
        want = np.concatenate([np.arange(n * 2, dtype=np.complex64)[2 * r:2 * r + 2] + 100 * q for q in range(n)])
        assert_equal(a2a, want, "all_to_all complex64")
    return True


def w_async(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    xs = [np.full(1000 * (i + 1), float(r + i), np.float64) for i in range(8)]
    works = [c.all_reduce(x, async_op=True) for x in xs]
    b = np.full(10, r, np.int32)
    wb = c.broadcast(b, src=n - 1, async_op=True)
    g = c.all_gather(np.array([r], np.int64), async_op=True)
    assert all(isinstance(w, tutti.Work) for w in works)
    for i, (w, x) in enumerate(zip(works, xs)):
        res = w.wait(timeout=30)
        assert res is x
        assert w.is_completed() and w.is_success() and w.exception() is None
        assert_equal(x, np.full(len(x), sum(q + i for q in range(n)), np.float64), f"async all_reduce {i}")
    assert_equal(wb.wait(), np.full(10, n - 1, np.int32), "async broadcast")
    assert_equal(g.wait(), np.arange(n, dtype=np.int64).reshape(n, 1), "async all_gather")
    # a blocking op after async ones runs after them
    y = np.ones(4, np.float32)
    w = c.all_reduce(y, async_op=True)
    c.barrier()
    w.wait(timeout=10)  # done (its completion flag may be set just after the barrier returns)
    # dropping a Work does not lose the op nor free its buffers early
    for i in range(20):
        c.all_reduce(np.full(100, 1.0), async_op=True)
    z = np.ones(3)
    c.all_reduce(z)
    assert_equal(z, np.full(3, float(n)), "after dropped works")
    c.barrier(async_op=True).wait()
    return True


def w_subgroups(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    evens = list(range(0, n, 2))
    g = c.new_group(evens)
    if r in evens:
        assert g is not None and g.world_size() == len(evens) and g.rank() == evens.index(r)
        x = np.array([r], np.int64)
        g.all_reduce(x)
        assert x[0] == sum(evens)
        g.destroy()
    else:
        assert g is None
    s = c.split(r % 2, key=-r)  # reversed order inside each color
    members = [q for q in range(n) if q % 2 == r % 2]
    assert s.world_size() == len(members)
    assert s.rank() == sorted(members, reverse=True).index(r)
    y = s.all_gather(np.array([r], np.int32)).reshape(-1)
    assert y.tolist() == sorted(members, reverse=True)
    s.destroy()
    none = c.split(None if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none is not None:
        none.destroy()
    return True


def w_arg_errors(ctx):
    """Bad arguments raise TypeError/ValueError before anything is sent (no collective runs)."""
    c = ctx.comm
    cases = [
        (lambda: c.all_reduce([1.0, 2.0]), TypeError, "numpy.ndarray"),
        (lambda: c.all_reduce(np.zeros(3, np.int16)), TypeError, "cannot be reduced"),
        (lambda: c.all_reduce(np.zeros(3, np.complex64)), TypeError, "cannot be reduced"),
        (lambda: c.all_reduce(np.zeros(3, object)), TypeError, "object"),
        (lambda: c.all_reduce(np.zeros(3, ">f4")), TypeError, "byte order"),
        (lambda: c.all_reduce(np.zeros((4, 4))[:, 1]), ValueError, "C-contiguous"),
        (lambda: c.all_reduce(np.zeros(3, bool), op="avg"), TypeError, "bool"),
        (lambda: c.all_reduce(np.zeros(3), op="mul"), ValueError, "unknown reduction"),
        (lambda: c.all_reduce(np.zeros(3), out=np.zeros(3, np.float32)), TypeError, "dtype"),
        (lambda: c.all_reduce(np.zeros(3), out=np.zeros(4)), tutti.InvalidArgumentError, "receive buffer"),
        (lambda: c.broadcast(np.zeros(3), src=ctx.n), ValueError, "out of range"),
        (lambda: c.send(np.zeros(3), dst=ctx.rank), tutti.InvalidArgumentError, "peer"),
        (lambda: c.reduce_scatter(np.zeros(ctx.n * 2 + 1)) if ctx.n > 1 else c.all_reduce(np.zeros(1), op=7),
         (ValueError, TypeError), ""),
        (lambda: c.all_gather(np.zeros(2), out=np.zeros(2 * ctx.n + 1)), ValueError, "receive buffer"),
    ]
    ro = np.zeros(3)
    ro.flags.writeable = False
    cases.append((lambda: c.all_reduce(ro), ValueError, "read-only"))
    for i, (f, exc, text) in enumerate(cases):
        try:
            f()
        except exc as e:
            assert text in str(e), f"case {i}: {e!r} does not mention {text!r}"
        else:
            raise AssertionError(f"case {i}: no {exc}")
    # the communicator is still fine
    x = np.ones(2)
    c.all_reduce(x)
    assert x[0] == ctx.n
    return True


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(ranks, dtype):
    ranks.run(w_all_reduce, dtype)


def test_all_reduce_large(ranks):
    ranks.run(w_all_reduce_large)


@pytest.mark.parametrize("dtype", ("float32", "float16", "int8", "uint64", "bool"))
def test_broadcast(ranks, dtype):
    ranks.run(w_broadcast, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce(ranks, dtype):
    ranks.run(w_reduce, dtype)


@pytest.mark.parametrize("dtype", ("float32", "float64", "int8", "uint32", "bool"))
def test_all_gather(ranks, dtype):
    ranks.run(w_all_gather, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(ranks, dtype):
    ranks.run(w_reduce_scatter, dtype)


@pytest.mark.parametrize("dtype", ("float32", "int64", "uint8"))
def test_all_to_all(ranks, dtype):
    ranks.run(w_all_to_all, dtype)


@pytest.mark.parametrize("dtype", ("float16", "int32"))
def test_gather_scatter(ranks, dtype):
    ranks.run(w_gather_scatter, dtype)


@pytest.mark.parametrize("dtype", ("float32", "int8"))
def test_send_recv(ranks, dtype):
    ranks.run(w_send_recv, dtype)


def test_moved_types(ranks):
    ranks.run(w_moved_types)


def test_async(ranks):
    ranks.run(w_async)


def test_subgroups(ranks):
    ranks.run(w_subgroups)


def test_argument_errors(ranks):
    ranks.run(w_arg_errors)


def test_unique_id_roundtrip():
    u = tutti.UniqueId.new()
    assert str(tutti.UniqueId(str(u))) == str(u)
    assert str(u).startswith("tutti1:127.0.0.1:")
    a = tutti.UniqueId.for_address("127.0.0.1", 12345)
    assert a == tutti.UniqueId.for_address("127.0.0.1", 12345)
    assert a.address == "127.0.0.1:12345"
    with pytest.raises(ValueError):
        tutti.UniqueId("not an id")


def test_threads_init_all():
    """Ranks as threads of one process (the local transport), with the GIL released."""
    import threading

    comms = tutti.Communicator.init_all(3)
    out = [None] * 3

    def run(c):
        x = np.full(1 << 16, c.rank() + 1.0, np.float32)
        for _ in range(10):
            c.all_reduce(x, op="max")
        out[c.rank()] = x[0]

    ts = [threading.Thread(target=run, args=(c,)) for c in comms]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out == [3.0, 3.0, 3.0]
    for c in comms:
        c.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        comms[0].barrier()

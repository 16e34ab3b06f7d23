"""The training options of the numpy API (issue 41), on 1-4 ranks, against numpy references:
the 16-bit wire (accuracy bound from the rank count and the type), all_reduce_many, sparse
AllReduce, Top-K with error feedback, and bad input (a typed error on every rank, no hang)."""

import numpy as np
import pytest

import tutti
from refdata import assert_equal

# Unit roundoff of one narrowing (round to nearest even).
U = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def _floats(rank, count, salt=0):
    """Rank `rank`'s float32 input: random values in [-1, 1), not exactly representable in 16 bits."""
    rng = np.random.default_rng(100 * rank + count + salt)
    return rng.uniform(-1.0, 1.0, count).astype(np.float32)


def _bound(n, wire, inputs):
    """The worst error of a 16-bit-wire reduction of `inputs` (one array per rank), per element:
    no value is narrowed more than n + 1 times on its way (the ring: n - 1 partial sums and the
    result), each narrowing a relative error of at most u, and the f32 additions n * 2^-24
    (docs/training.md, "Accuracy")."""
    u = U[wire]
    mag = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    return ((1 + u) ** (n + 1) - 1 + n * 2.0 ** -24) * mag


def _check_bound(got, want, bound, what):
    err = np.abs(got.astype(np.float64) - want)
    if np.any(err > bound):
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{what}: element {i} is {got.reshape(-1)[i]}, reference {want.reshape(-1)[i]}, "
                             f"error {err.reshape(-1)[i]:.3g} > bound {bound.reshape(-1)[i]:.3g}")


# ---- worker-side functions (run on every rank) ----------------------------------------------


def w_wire(ctx, wire):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    for count in (0, 1, 7, 1031, 70001):
        xs = [_floats(q, count) for q in range(n)]
        ref = np.sum([x.astype(np.float64) for x in xs], axis=0)
        bound = _bound(n, wire, xs)
        for op, scale in (("sum", 1), ("avg", n)):
            x = xs[r].copy()
            c.all_reduce(x, op=op, wire=wire)
            _check_bound(x, ref / scale, bound / scale, f"all_reduce {wire} {op} count={count}")
            # every rank ends with the same bits
            everyone = c.all_gather(x)
            assert all(np.array_equal(everyone[q], x) for q in range(n)), f"all_reduce {wire}: ranks differ"
            out = np.empty_like(xs[r])
            c.all_reduce(xs[r], op=op, out=out, wire=wire)
            assert np.array_equal(out, x), f"all_reduce {wire} out= differs from in place"
            w = c.all_reduce(xs[r].copy(), op=op, wire=wire, async_op=True)
            assert np.array_equal(w.wait(), x), f"all_reduce {wire} async differs"
            # reduce onto each root
            for root in range(n):
                y = xs[r].copy()
                got = c.reduce(y, dst=root, op=op, wire=wire)
                if r == root:
                    _check_bound(got, ref / scale, bound / scale, f"reduce {wire} {op} root={root} count={count}")
            # reduce_scatter: rank r's block of the sum of n blocks
            big = np.concatenate([_floats(r, count, salt=q + 1) for q in range(n)])
            bigs = [np.concatenate([_floats(p, count, salt=q + 1) for q in range(n)]) for p in range(n)]
            got = c.reduce_scatter(big, op=op, wire=wire)
            blk = slice(r * count, (r + 1) * count)
            rref = np.sum([b.astype(np.float64) for b in bigs], axis=0)[blk]
            _check_bound(got, rref / scale, _bound(n, wire, [b[blk] for b in bigs]) / scale,
                         f"reduce_scatter {wire} {op} count={count}")
    # The data really travels narrowed: 1 + 2^-12 is not a 16-bit value, and arrives as 1.
    if n > 1:
        x = np.zeros(4, np.float32)
        if r == 0:
            x[:] = 1 + 2.0 ** -12
        c.all_reduce(x, wire=wire)
        assert np.all(x == 1.0), f"{wire}: {x} (expected 1.0: the value was rounded on the wire)"
    return True


def w_all_reduce_many(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    rng = np.random.default_rng(r)
    sizes = [0, 1, 3, 17, 0, 300, 5000, 2]
    dtypes = [np.float32, np.int64, np.float32, np.float64, np.int32, np.float32, np.float32, np.int64]
    for bucket_bytes in (1, 64, 4096, tutti.DEFAULT_BUCKET_BYTES):
        arrays = [rng.integers(-9, 9, s).astype(d) for s, d in zip(sizes, dtypes)]
        everyone = [c.all_gather(a) for a in arrays]
        for op in ("sum", "max", "avg"):
            # averages only of floats (an integer average rounds; test_numpy covers it)
            pick = [i for i, a in enumerate(arrays) if op != "avg" or a.dtype.kind == "f"]
            xs = [arrays[i].copy() for i in pick]
            got = c.all_reduce_many(xs, op=op, bucket_bytes=bucket_bytes)
            assert all(g is x for g, x in zip(got, xs)) and len(got) == len(xs)
            for i, x in zip(pick, xs):
                e = everyone[i]
                if op == "sum":
                    want = e.sum(axis=0, dtype=e.dtype)
                elif op == "max":
                    want = e.max(axis=0)
                else:
                    want = (e.astype(np.float64).sum(axis=0) / n).astype(e.dtype)
                assert_equal(x, want.reshape(x.shape), f"all_reduce_many {op} bucket_bytes={bucket_bytes} "
                                                       f"array {i}", x.dtype, op)
    assert c.all_reduce_many([]) == []
    # on the 16-bit wire: every float32 array within the bound
    xs = [_floats(q, s) for q, s in ((r, 5), (r, 1000), (r, 3))]
    refs = [[_floats(q, s) for q in range(n)] for s in (5, 1000, 3)]
    c.all_reduce_many(xs, op="avg", bucket_bytes=1024, wire="bf16")
    for x, ins in zip(xs, refs):
        want = np.sum([v.astype(np.float64) for v in ins], axis=0) / n
        _check_bound(x, want, _bound(n, "bf16", ins) / n, "all_reduce_many wire=bf16")
    return True


def _pairs(rank, count, k, salt=0):
    """Rank `rank`'s sparse input: k int64 indices in 0..count (duplicates allowed) and
    integer-valued float32 values, so that every sum is exact whatever its order."""
    rng = np.random.default_rng(31 * rank + k + salt)
    k = k + rank  # counts differ per rank
    return rng.integers(0, count, k), rng.integers(-8, 9, k).astype(np.float32)


def w_sparse(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    routes = set()
    for count, k in ((1, 1), (64, 0), (1000, 3), (1000, 900), (200, 20000), (50000, 20)):
        everyone = [_pairs(q, count, k) for q in range(n)]
        want = np.zeros(count, np.float64)
        for idx, val in everyone:
            np.add.at(want, idx, val)
        idx, val = everyone[r]
        for dtype in (np.int64, np.uint32):
            for op, scale in (("sum", 1), ("avg", n)):
                out = np.full(count, 123.0, np.float32)  # overwritten, not added to
                routes.add(c.sparse_all_reduce(idx.astype(dtype), val, out, op=op))
                assert_equal(out, (want / scale).astype(np.float32), f"sparse_all_reduce count={count} k={k} {op}",
                             np.float32, op)
    assert routes <= {"gather", "dense"}
    if n > 1:
        assert routes == {"gather", "dense"}, f"both routes expected across these sizes, got {routes}"
    return True


def w_top_k(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    count, steps = 1000, 4
    # Every rank can compute every rank's compression (its inputs are seeded by rank).
    mine = tutti.TopK(count, 0.01)
    assert (mine.k, mine.n, mine.error_feedback) == (10, count, True)
    shadows = [tutti.TopK(count, 0.01) for _ in range(n)]
    sent_sum = np.zeros(count, np.float64)
    grad_sum = np.zeros(count, np.float64)
    for step in range(steps):
        grads = [_floats(q, count, salt=step) for q in range(n)]
        want = np.zeros(count, np.float64)
        for q in range(n):
            idx, val = shadows[q].compress(grads[q])
            assert idx.dtype == np.uint32 and val.dtype == np.float32 and len(idx) == 10
            assert np.all(np.diff(idx.astype(np.int64)) > 0), "indices ascend"
            want[idx] += val
            if q == r:
                sent_sum[idx] += val
        grad_sum += grads[r]
        g = grads[r].copy()
        route = c.top_k_all_reduce(g, mine, op="avg")
        assert route in ("gather", "dense")
        np.testing.assert_allclose(g, want / n, rtol=1e-6, atol=1e-7, err_msg=f"top_k_all_reduce step {step}")
        assert np.array_equal(mine.residual, shadows[r].residual)
        # Error feedback: what was sent plus what is held back is every gradient so far.
        np.testing.assert_allclose(sent_sum + mine.residual, grad_sum, rtol=1e-5, atol=1e-5)
    # Without error feedback nothing is kept; the kept entries are the largest of the gradient alone.
    plain = tutti.TopK(count, k=5, error_feedback=False)
    g = _floats(r, count, salt=99)
    idx, val = plain.compress(g)
    assert plain.k == 5 and not plain.residual.any()
    assert set(idx.tolist()) == set(np.argsort(-np.abs(g))[:5].tolist())
    assert np.array_equal(val, g[idx])
    return True


def _raises_everywhere(c, fn, exc, text_here, what):
    """fn() raises `exc` (mentioning `text_here`), and the communicator still works afterwards."""
    try:
        fn()
    except exc as e:
        assert text_here in str(e), f"{what}: {e!r} does not mention {text_here!r}"
    else:
        raise AssertionError(f"{what}: no {exc.__name__}")
    x = np.ones(3, np.float32)
    c.all_reduce(x)
    assert np.all(x == c.world_size()), f"{what}: the communicator is not usable afterwards"


def w_bad_input(ctx):
    c, n, r = ctx.comm, ctx.n, ctx.rank
    bad = tutti.InvalidArgumentError
    f32 = np.ones(8, np.float32)
    # The wire: the same option on every rank, rejected by the core on every rank.
    _raises_everywhere(c, lambda: c.all_reduce(np.ones(8, np.int32), wire="bf16"), bad, "carries f32 data",
                       "wire on int32")
    _raises_everywhere(c, lambda: c.all_reduce(f32.copy(), op="max", wire="f16"), bad, "sum or avg", "wire with MAX")
    _raises_everywhere(c, lambda: c.reduce_scatter(np.ones(8 * n), op="min", wire="bf16"), bad, "wire",
                       "wire on float64 with MIN")
    _raises_everywhere(c, lambda: c.all_reduce(f32.copy(), wire="f64"), bad, "must be bf16 or f16", "wire=f64")
    _raises_everywhere(c, lambda: c.all_reduce(f32.copy(), wire="fp8"), bad, "unknown data type", "wire=fp8")
    _raises_everywhere(c, lambda: c.all_reduce_many([np.ones(3, np.int64)], wire="bf16"), bad, "carries f32",
                       "all_reduce_many wire on int64")
    _raises_everywhere(c, lambda: c.all_reduce_many([f32.copy()], bucket_bytes=0), bad, "bucket_bytes",
                       "bucket_bytes=0")
    # k larger than the count.
    _raises_everywhere(c, lambda: tutti.TopK(10, k=11), bad, "k=11", "k > count")
    _raises_everywhere(c, lambda: tutti.TopK(10, ratio=1.5), bad, "ratio", "ratio > 1")
    # Bad input on ONE rank: that rank names the rule, every other one fails too, nobody waits.
    last = n - 1
    others = "another rank passed bad input" if n > 1 else "outside"

    def idx_out_of_range():
        i = np.array([3, 8 if r == last else 2], np.int64)
        c.sparse_all_reduce(i, np.ones(2, np.float32), np.zeros(8, np.float32))

    _raises_everywhere(c, idx_out_of_range, bad, "indices[1] = 8 is outside" if r == last else others,
                       "index out of range on one rank")

    def idx_negative():
        i = np.array([-1 if r == last else 0], np.int64)
        c.sparse_all_reduce(i, np.ones(1, np.float32), np.zeros(8, np.float32))

    _raises_everywhere(c, idx_negative, bad, "indices[0] = -1" if r == last else others, "negative index")

    def unpaired():
        c.sparse_all_reduce(np.array([1, 2], np.uint32), np.ones(1 if r == last else 2, np.float32),
                            np.zeros(8, np.float32))

    _raises_everywhere(c, unpaired, bad, "must pair up" if r == last else others, "unpaired indices and values")

    def wrong_values_dtype():
        c.sparse_all_reduce(np.array([1]), np.ones(1, np.float64 if r == last else np.float32),
                            np.zeros(8, np.float32))

    _raises_everywhere(c, wrong_values_dtype, TypeError if r == last else bad, "float32" if r == last else others,
                       "values of another dtype on one rank")

    def top_k_wrong_length():
        t = tutti.TopK(100, 0.1)
        c.top_k_all_reduce(np.ones(99 if r == last else 100, np.float32), t)

    # (the others learn it from the lengths, which differ across ranks)
    _raises_everywhere(c, top_k_wrong_length, bad, "99 elements" if r == last else "sparse_all_reduce",
                       "top_k_all_reduce gradient of another length on one rank")
    return True


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["bf16", "f16"])
def test_wire_accuracy(ranks, wire):
    ranks.run(w_wire, wire)


def test_all_reduce_many(ranks):
    ranks.run(w_all_reduce_many)


def test_sparse_all_reduce(ranks):
    ranks.run(w_sparse)


def test_top_k_error_feedback(ranks):
    ranks.run(w_top_k)


def test_bad_input_fails_on_every_rank(ranks):
    ranks.run(w_bad_input)


def test_top_k_momentum_correction():
    """tutti.TopK(momentum=m), one process: compress folds in u = m u + g and masks u and
    the residual where it sent; dense_step sends all and keeps u; restore puts state back;
    bad input is a clear error."""
    import tutti

    rng = np.random.default_rng(3)
    n, m = 20_000, 0.9
    t = tutti.TopK(n, 0.01, momentum=m)
    assert t.momentum == pytest.approx(m) and "momentum" in repr(t)
    u, v = np.zeros(n, np.float64), np.zeros(n, np.float64)
    for _ in range(3):
        g = rng.standard_normal(n).astype(np.float32)
        u = m * u + g
        v = v + u
        idx, vals = t.compress(g)
        assert len(idx) == t.k == 200
        np.testing.assert_allclose(vals, v[idx], rtol=1e-5)
        # the largest of v were sent
        assert np.abs(v[idx]).min() >= np.sort(np.abs(v))[-t.k] * (1 - 1e-6)
        u[idx] = 0.0
        v[idx] = 0.0
        np.testing.assert_allclose(t.velocity, u, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.residual, v, rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(n).astype(np.float32)
    sent = g.copy()
    t.dense_step(sent)
    u = m * u + g
    np.testing.assert_allclose(sent, v + u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.velocity, u, rtol=1e-5, atol=1e-6)
    assert not t.residual.any()
    t.restore(np.full(n, 2.0, np.float32), np.full(n, 3.0, np.float32))
    assert (t.residual == 2.0).all() and (t.velocity == 3.0).all()
    assert tutti.TopK(n, 0.01).velocity is None
    with pytest.raises(tutti.InvalidArgumentError, match="momentum"):
        tutti.TopK(n, 0.01, momentum=1.0)
    with pytest.raises(tutti.InvalidArgumentError, match="error feedback"):
        tutti.TopK(n, 0.01, error_feedback=False, momentum=0.5)
    with pytest.raises(ValueError, match="velocity"):
        tutti.TopK(n, 0.01).restore(np.zeros(n, np.float32), np.zeros(n, np.float32))
    with pytest.raises(ValueError, match="elements"):
        t.restore(np.zeros(n - 1, np.float32))
    with pytest.raises(TypeError, match="float32"):
        t.dense_step(np.zeros(n, np.float64))

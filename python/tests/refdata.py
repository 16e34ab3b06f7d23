"""Test data whose reductions are exact, and numpy references for every collective."""

import numpy as np

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int32", "int64", "uint32", "uint64")
DTYPES = FLOATS + INTS + ("bool",)
OPS = ("sum", "prod", "max", "min", "avg")


def data(rank, count, dtype, op, salt=0):
    """Rank `rank`'s input: values chosen so that sum/prod/avg are exact in `dtype`."""
    rng = np.random.default_rng(1000 * rank + 7 * count + salt + 13 * len(dtype))
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, count).astype(bool)
    if op == "prod":
        v = rng.integers(1, 3, count)  # 1 or 2: at most 2**4 with 4 ranks
        return v.astype(dt)
    if op in ("sum", "avg"):
        v = rng.integers(0, 5, count)  # sums stay small and exact, avg nonnegative
        return v.astype(dt)
    lo = 0 if dt.kind in "ub" else -50
    return rng.integers(lo, 50, count).astype(dt)


def reduce_ref(arrays, op, dtype):
    dt = np.dtype(dtype)
    a = np.stack(arrays)
    n = len(arrays)
    if dt == np.bool_:
        if op in ("sum", "max"):
            return a.any(axis=0)
        return a.all(axis=0)
    if op == "sum":
        return a.sum(axis=0, dtype=dt)
    if op == "prod":
        return a.prod(axis=0, dtype=dt)
    if op == "max":
        return a.max(axis=0)
    if op == "min":
        return a.min(axis=0)
    if op == "avg":
        s = a.astype(np.float64).sum(axis=0)
        if dt.kind == "f":
            return (s / n).astype(dt)
        return (a.astype(np.int64).sum(axis=0) // n).astype(dt)
    raise ValueError(op)


def assert_equal(got, want, what, dtype=None, op=None):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape} != expected {want.shape}")
    if op == "avg" and np.dtype(dtype).kind == "f":
        tol = 1e-3 if np.dtype(dtype) == np.float16 else 1e-6
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))[:5]
        raise AssertionError(f"{what}: mismatch at {bad.tolist()}: got {got.reshape(-1)[bad].tolist()}, "
                             f"expected {want.reshape(-1)[bad].tolist()}")

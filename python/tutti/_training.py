"""Training options of the numpy API (issue 41): fused AllReduce of many arrays, sparse
AllReduce, and Top-K with error feedback (:class:`TopK`).

:class:`TrainingOps` is a mixin of :class:`tutti.Communicator`; the 16-bit wire
(``wire="bf16"`` / ``"f16"`` on ``all_reduce``, ``reduce_scatter`` and ``reduce``) is an
argument of those methods themselves (``tutti._comm``), checked by the core. Everything here
runs on the core (``crates/tutti/src/comm/fusion.rs`` and ``sparse.rs``) through
``tutti._native`` (``crates/tutti-py/src/training.rs``), blocking, with the GIL released.

Bad input that only one rank sees (a wrongly typed array, an index out of range) still
fails on every rank: the sparse calls carry a "bad input" flag in the agreement that
precedes them, so no rank is left waiting.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _codes as C
from . import _native
from ._errors import InvalidArgumentError

__all__ = ["TopK", "TrainingOps", "DEFAULT_BUCKET_BYTES"]

#: Bytes per bucket of :meth:`Communicator.all_reduce_many` unless given: 25 MiB, as
#: PyTorch DDP (``tutti::DEFAULT_BUCKET_BYTES``).
DEFAULT_BUCKET_BYTES = 25 << 20

_PAD = 0xFFFFFFFF  # an index no vector has: makes the core's sparse check fail


def wire_name(wire: Any) -> Optional[str]:
    """The ``wire`` argument as the core reads it: None, or a type name (``"bf16"``,
    ``"f16"``, their aliases, or a numpy/torch 16-bit float dtype). Other names are
    passed on for the core to reject with its rule."""
    if wire is None or isinstance(wire, str):
        return wire
    name = str(getattr(wire, "name", None) or wire).replace("torch.", "")
    if name in ("float16", "bfloat16"):
        return name
    raise TypeError(f"wire must be 'bf16', 'f16' or None, not {wire!r}")


class TopK:
    """Top-K sparsification with error feedback, for gradient vectors of ``n`` float32
    elements (``tutti::TopK``).

    Each step, :meth:`compress` adds the residual (what earlier steps did not send) to the
    gradient, keeps the ``k`` entries of largest magnitude and keeps the rest as the new
    residual: nothing is lost, only delayed (without ``error_feedback`` the rest is
    dropped, and Top-K training tends to stall). ``k`` is ``ceil(ratio * n)`` (at least 1),
    or given directly with ``k=``. Use it with :meth:`Communicator.top_k_all_reduce`, or
    compress yourself and call :meth:`Communicator.sparse_all_reduce`.

    ``momentum=m`` (in ``[0, 1)``, with error feedback) adds Deep Gradient Compression's
    momentum correction: :meth:`compress` folds the gradient in as ``u = m * u + g;
    residual += u`` and zeroes ``u`` and the residual where it sent; the optimizer then
    takes plain SGD steps (no momentum of its own).
    """

    __slots__ = ("_t",)

    def __init__(self, n: int, ratio: Optional[float] = None, error_feedback: bool = True, *,
                 k: Optional[int] = None, momentum: Optional[float] = None):
        n = int(n)
        if (ratio is None) == (k is None):
            raise TypeError("TopK: give exactly one of ratio and k")
        if k is not None:
            k = int(k)
            if not 1 <= k <= max(n, 1):
                raise InvalidArgumentError(f"TopK: k={k} must be in 1..{n} (the vector has {n} elements)")
            ratio = (k - 0.5) / n if n else 1.0  # ceil(ratio * n) == k, whatever the rounding
        m = None if momentum is None else float(momentum)
        self._t = _native.TopK(n, float(ratio), bool(error_feedback), m)

    @property
    def k(self) -> int:
        """Entries sent per step."""
        return self._t.k

    @property
    def n(self) -> int:
        """The vector length."""
        return self._t.len

    @property
    def error_feedback(self) -> bool:
        """Whether what is not sent is kept for the next step."""
        return self._t.error_feedback

    @property
    def residual(self) -> np.ndarray:
        """A copy of what has not been sent yet (``n`` float32; zeros without error
        feedback)."""
        return self._t.residual()

    @property
    def momentum(self) -> Optional[float]:
        """The momentum factor of momentum correction, or None without it."""
        return self._t.momentum

    @property
    def velocity(self) -> Optional[np.ndarray]:
        """A copy of momentum correction's velocity ``u`` (``n`` float32), or None without
        momentum correction."""
        return self._t.velocity()

    def restore(self, residual: np.ndarray, velocity: Optional[np.ndarray] = None) -> None:
        """Overwrites the residual (and, with momentum correction, the velocity; None keeps
        it) with ``n`` float32 values each, e.g. to carry them over when the gradients are
        regrouped into new vectors."""
        r = np.ascontiguousarray(residual, dtype=np.float32).reshape(-1)
        v = None if velocity is None else np.ascontiguousarray(velocity, dtype=np.float32).reshape(-1)
        self._t.restore(r, v)

    def dense_step(self, grad: np.ndarray) -> None:
        """A dense step, in place on ``grad`` (``n`` float32, contiguous and writable): folds
        the gradient in as :meth:`compress` does (with momentum correction ``u = m * u +
        g``), leaves the whole residual in ``grad``, to be sent dense, and empties the
        residual; the velocity is kept, so dense steps are SGD with momentum ``m``. For a
        dense warm-up before Top-K."""
        if not isinstance(grad, np.ndarray) or grad.dtype != np.float32 or not grad.flags.c_contiguous:
            raise TypeError("TopK.dense_step: grad must be a contiguous float32 numpy array")
        self._t.dense_step(grad.reshape(-1))

    def compress(self, grad: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Adds the residual to ``grad`` (``n`` float32 elements, any shape; not modified)
        and returns the ``k`` entries of largest magnitude as ``(indices uint32, values
        float32)``, ascending by index; the rest becomes the residual."""
        g = np.asarray(grad)
        if g.dtype != np.float32:
            raise TypeError(f"TopK.compress: grad must be float32, not {g.dtype}")
        return self._t.compress(np.ascontiguousarray(g).reshape(-1))

    def __repr__(self) -> str:
        m = "" if self.momentum is None else f", momentum={self.momentum}"
        return f"tutti.TopK(n={self.n}, k={self.k}, error_feedback={self.error_feedback}{m})"


def _f32_out(a: Any, what: str) -> Tuple[int, int]:
    """(address, count) of a writable, C-contiguous float32 numpy array."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        dt = getattr(a, "dtype", type(a).__name__)
        raise TypeError(f"{what} must be a float32 numpy array, not {dt}")
    p, nb, _, _ = _native.buffer(a, True, what)
    return p, nb // 4


class TrainingOps:
    """The training calls of :class:`tutti.Communicator` (a mixin; ``self._c`` is the
    compiled communicator)."""

    __slots__ = ()
    _c: Any

    def all_reduce_many(self, arrays: Sequence[np.ndarray], op: Any = C.OP_SUM, *,
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES, wire: Optional[str] = None,
                        timeout: Optional[float] = None) -> List[np.ndarray]:
        """Reduces every array of ``arrays`` across ranks, in place, as if each were
        reduced by its own :meth:`all_reduce`, in far fewer ops: arrays are packed, in
        order, into buckets of ``bucket_bytes`` (25 MiB by default, as PyTorch DDP), one
        AllReduce each; an array at least a bucket long, or alone in its bucket, is reduced
        without a copy. Arrays of different dtypes are reduced per dtype, in order of first
        appearance. Every rank passes arrays of the same sizes and dtypes in the same order.
        ``wire="bf16"``/``"f16"`` puts every bucket on the 16-bit wire (then every array must
        be float32 and ``op`` SUM or AVG, else :class:`tutti.InvalidArgumentError`). Blocking, with the GIL released. Returns ``arrays`` (as a list)."""
        from . import _comm

        arrays = list(arrays)
        opc = _comm._op_code(op)
        if isinstance(bucket_bytes, bool) or int(bucket_bytes) < 1:
            raise InvalidArgumentError(f"all_reduce_many: bucket_bytes={bucket_bytes}; a bucket holds at least one "
                                       f"byte")
        groups: dict = {}
        for i, a in enumerate(arrays):
            p, nb, code, _ = _native.buffer(a, True, f"all_reduce_many: arrays[{i}]")
            key = _comm._reducible(code, opc, a.dtype, "all_reduce_many")
            groups.setdefault(key, []).append((p, nb))
        w = wire_name(wire)
        for (code, oc), bufs in groups.items():
            _native._all_reduce_many(self._c, bufs, code, oc, int(bucket_bytes), w, timeout)
        return arrays

    def sparse_all_reduce(self, indices: Any, values: Any, out: np.ndarray, op: Any = C.OP_SUM) -> str:
        """Sums the sparse vectors of all ranks into ``out`` (float32, the same number of
        elements on every rank): this rank contributes ``values[j]`` at flat index
        ``indices[j]`` (duplicates add up; counts may differ per rank); every rank ends with
        the same ``out``. ``indices``: uint32 or int64 (any integer type); ``values``:
        float32; ``op``: SUM or AVG (divided by the rank count). Returns the route the cost
        model chose: ``"gather"`` (every rank's pairs to every rank) or ``"dense"`` (an
        AllReduce of the scattered vector).

        Bad input on any rank (an index outside ``out``, unpaired indices and values,
        another dtype, ``out`` sizes that differ) raises :class:`tutti.InvalidArgumentError`
        (or ``TypeError``) on that rank and an InvalidArgumentError on every other, and
        ``out`` is not written."""
        from . import _comm

        try:
            opc = _comm._op_code(op)
            optr, cnt = _f32_out(out, "sparse_all_reduce: out")
        except (TypeError, ValueError) as e:
            n = out.size if isinstance(out, np.ndarray) else 0
            return self._fail_sparse_len(n, e)
        try:
            idx, bad = _indices(indices, cnt)
            vals = np.asarray(values)
            if vals.dtype != np.float32:
                raise TypeError(f"sparse_all_reduce: values must be float32, not {vals.dtype}")
            vals = np.ascontiguousarray(vals).reshape(-1)
        except (TypeError, ValueError) as e:
            return self._fail_sparse_len(cnt, e)
        try:
            return _native._sparse_all_reduce(self._c, idx, vals, optr, cnt, opc)
        except InvalidArgumentError as e:
            if bad is not None:  # name the index as the caller gave it, not as converted
                j, v = bad
                raise InvalidArgumentError(f"sparse_all_reduce: indices[{j}] = {v} is outside the vector of {cnt} "
                                           f"elements") from e
            raise

    def _fail_sparse_len(self, n: int, err: BaseException) -> str:
        """Takes part in a sparse AllReduce (over a vector of `n` elements, as this rank's
        peers pass) with input the core rejects, so that every other rank fails too ("another
        rank passed bad input") and nobody waits; then raises `err` here."""
        dummy = np.zeros(n, np.float32)
        try:
            _native._sparse_all_reduce(self._c, np.array([_PAD], np.uint32), np.zeros(1, np.float32),
                                       _native.buffer(dummy, True)[0], n, C.OP_SUM)
        except Exception:  # noqa: BLE001 - the core's rejection; ours is clearer
            pass
        raise err

    def top_k_all_reduce(self, grad: np.ndarray, topk: TopK, op: Any = C.OP_SUM) -> str:
        """Top-K AllReduce of ``grad`` (float32, ``topk.n`` elements) in place:
        ``topk.compress(grad)`` (residual in, residual out), then :meth:`sparse_all_reduce`
        of the kept entries into ``grad`` (``op`` SUM or AVG). Returns the route
        (``"gather"`` or ``"dense"``). A wrong length or dtype on any rank fails on every
        rank."""
        from . import _comm

        if not isinstance(topk, TopK):
            raise TypeError(f"top_k_all_reduce: topk must be a tutti.TopK, not {type(topk).__name__}")
        try:
            opc = _comm._op_code(op)
            p, cnt = _f32_out(grad, "top_k_all_reduce: grad")
        except (TypeError, ValueError) as e:
            return self._fail_sparse_len(topk.n, e)
        return _native._top_k_all_reduce(self._c, p, cnt, topk._t, opc)


def _indices(indices: Any, n: int) -> Tuple[np.ndarray, Optional[Tuple[int, int]]]:
    """Indices as contiguous uint32, and the first (position, value) outside ``0..n`` if
    the conversion had to change it (negative, or beyond uint32: then it becomes an index
    the core rejects, so every rank fails)."""
    a = np.asarray(indices)
    if a.dtype.kind not in "iu":
        raise TypeError(f"sparse_all_reduce: indices must be integers (uint32 or int64), not {a.dtype}")
    a = a.reshape(-1)
    if a.dtype == np.uint32:
        return np.ascontiguousarray(a), None
    wide = a.astype(np.int64) if a.dtype != np.uint64 else a
    bad = (wide < 0) | (wide >= _PAD) if wide.dtype != np.uint64 else wide >= _PAD
    if not bad.any():
        return wide.astype(np.uint32), None
    j = int(np.argmax(bad))
    return np.where(bad, _PAD, wide).astype(np.uint32), (j, int(a[j]))

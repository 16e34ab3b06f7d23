"""torch's collective time estimator on tutti: ``torch.distributed._time_estimator()``.

torch 2.15 asks the group's backend for ``cpu``: ``_supports_time_estimate`` (a property),
``_start_time_estimate()``, then runs the user's block, then ``_end_time_estimate()``,
which returns the total estimated time of the collectives issued inside, in microseconds.
Inside the block nothing moves: each collective adds what tutti's Auto would run for it
and its time (``tutti._native._predict_us``: the cost model's prediction on the
communicator's calibrated links, or online tuning's measured time once it decided the
shape; the same on every rank) and completes at once, outputs untouched. Sends and
receives are not estimated (they run as usual).

:class:`TimeEstimateMixin` is a base of :class:`tutti._torch_backend.TuttiBackend`. Every
op of the backend's two routes goes through the group object's ``_call`` (the native
communicator's entry point); while estimating, each group object on this communicator
(the backend itself and, on the ``"tutti"`` route, the ``ProcessGroupTutti`` whose cpu
backend it is) has its ``_call`` replaced by the estimating one, and back afterwards: no
cost outside the block.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from . import _native

__all__ = ["TimeEstimateMixin"]

# _codes' collective codes and DataType::ALL order (codes 10, bool, and -1, other
# fixed-size types, travel as bytes).
_KINDS = {0: "all_reduce", 1: "broadcast", 2: "reduce", 3: "all_gather", 4: "reduce_scatter",
          5: "all_to_all", 6: "all_to_all", 7: "gather", 8: "scatter", 9: "barrier"}
_DTYPES = ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "u32", "u64")


class _Estimated:
    """The native Work of an estimated call: done, successful, nothing received."""

    def wait(self, timeout: Any = None) -> None:
        return None

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def status(self) -> None:
        return None


class _Estimator:
    """Sums the predicted time of the calls made through it."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.total_us = 0.0
        self.calls: List[Tuple[str, int, str, str, float]] = []

    def call(self, kind: int, arg: int, code: int, op: int, count: int, *rest: Any) -> Any:
        # rest: sp, sl, rp, rl, timeout, async_op, keep, done[, vcounts]
        name = _KINDS.get(kind)
        if name is None:
            raise NotImplementedError(f"tutti: no time estimate for collective code {kind}")
        # bool and other fixed-size types travel as bytes
        dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else "u8"
        alg, us = _native._predict_us(self.comm, name, count, dtype, arg)
        if us == us:  # not NaN
            self.total_us += us
        self.calls.append((name, count, dtype, alg, us))
        async_op = len(rest) > 5 and rest[5]
        if not async_op:
            return None
        done = rest[7] if len(rest) > 7 else None
        if done is not None:
            done(None)
        return _Estimated()


class TimeEstimateMixin:
    """``_supports_time_estimate``, ``_start_time_estimate`` and ``_end_time_estimate``
    for a tutti torch backend (see the module doc). The class mixing it in has ``_comm``
    (the native communicator) and ``_call`` (its entry point)."""

    _comm: Any
    _call: Any
    _tutti_estimate: Optional[Tuple[_Estimator, List[Tuple[Any, Any]]]] = None

    @property
    def _supports_time_estimate(self) -> bool:
        return True

    def _start_time_estimate(self) -> None:
        if self._tutti_estimate is not None:
            raise RuntimeError("tutti: a time estimate is already running on this group")
        from ._torch_ops import groups

        est = _Estimator(self._comm)
        swapped = []
        members = [self] + [g for g in list(groups) if g is not self and getattr(g, "_comm", None) is self._comm]
        for g in members:
            swapped.append((g, g.__dict__.get("_call")))
            g._call = est.call
        self._tutti_estimate = (est, swapped)

    def _end_time_estimate(self) -> float:
        if self._tutti_estimate is None:
            raise RuntimeError("tutti: no time estimate was started on this group")
        est, swapped = self._tutti_estimate
        self._tutti_estimate = None
        for g, call in swapped:
            g._call = call if call is not None else g._comm._call
        return est.total_us

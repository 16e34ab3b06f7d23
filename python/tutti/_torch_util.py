"""Helpers of the torch backend (tutti.torch): dtype and op mapping, buffers, Work classes."""

from __future__ import annotations

import datetime
import functools
import time
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from . import _codes as C
from ._errors import TuttiError

# ---- errors that name the rank -------------------------------------------------------------


def _ranked_message(msg: str, op: str, rank: int, size: int) -> str:
    """`msg` ("tutti: ..." or "tutti OP: ...") with the op and the rank put in its prefix:
    "tutti OP (rank R of N): ..."."""
    head, sep, rest = msg.partition(": ")
    if not sep or not head.startswith("tutti"):
        return f"tutti {op} (rank {rank} of {size}): {msg}"
    what = head[len("tutti"):].strip() or op
    return f"tutti {what} (rank {rank} of {size}): {rest}"


def ranked(e: Exception, op: str, ops: Any) -> Exception:
    """`e` itself, or, for a plain ``TypeError``/``ValueError`` (bad input, raised before
    anything was sent), the same error with the op and the calling rank in its message
    ("tutti allreduce (rank 1 of 2): ..."), so that the rank whose input was wrong is
    known in a job's merged log. ``tutti.TuttiError``s name their ranks themselves."""
    if type(e) not in (TypeError, ValueError) or "(rank " in str(e):
        return e
    return type(e)(_ranked_message(str(e), op, ops._rank, ops._size)).with_traceback(e.__traceback__)


def name_the_rank(*hot: str) -> Any:
    """Class decorator for the ops mixins: every public op's bad-input errors go through
    :func:`ranked`. The ops named in `hot` are left alone: they catch in their own body
    (a ``try`` costs nothing until it raises; a wrapper costs ~0.2 us per call)."""

    def deco(cls: type) -> type:
        for name, f in list(vars(cls).items()):
            if name.startswith("__") or not callable(f) or name in hot:
                continue
            if name.startswith("_") and name not in ("_allgather_base", "_reduce_scatter_base"):
                continue

            def wrap(f: Any, name: str = name) -> Any:
                @functools.wraps(f)
                def op(self: Any, *args: Any, **kwargs: Any) -> Any:
                    try:
                        return f(self, *args, **kwargs)
                    except (TypeError, ValueError) as e:
                        raise ranked(e, name, self) from None
                return op

            setattr(cls, name, wrap(f))
        return cls

    return deco


# ---- type and op mapping ------------------------------------------------------------------

_DT = {
    torch.float32: C.F32,
    torch.float64: C.F64,
    torch.float16: C.F16,
    torch.bfloat16: C.BF16,  # no numpy type: passed as raw 2-byte elements tagged bf16
    torch.int8: C.I8,
    torch.uint8: C.U8,
    torch.int32: C.I32,
    torch.int64: C.I64,
    torch.bool: C.BOOL,
}
for _name, _code in (("uint32", C.U32), ("uint64", C.U64)):
    if hasattr(torch, _name):
        _DT[getattr(torch, _name)] = _code

_R = dist.ReduceOp
_TORCH_OPS = (("SUM", C.OP_SUM), ("AVG", C.OP_AVG), ("PRODUCT", C.OP_PROD), ("MIN", C.OP_MIN), ("MAX", C.OP_MAX))
# bool: SUM/BOR/MAX are a logical or, PRODUCT/BAND/MIN a logical and.
_TORCH_BOOL_OPS = (("SUM", C.OP_MAX), ("BOR", C.OP_MAX), ("MAX", C.OP_MAX), ("PRODUCT", C.OP_MIN),
                   ("BAND", C.OP_MIN), ("MIN", C.OP_MIN))
_REDUCIBLE = "float32, float64, float16, bfloat16, int8, int32, int64, uint8 (uint32, uint64), and bool with MAX/MIN"


def _key(op: Any) -> Any:
    """A cheap dictionary key for a torch ReduceOp. Comparing ReduceOp objects costs about
    1.5 us through pybind; their hash is the op's enum value (checked below), 0.1 us."""
    return hash(op)


def _table(pairs: tuple) -> dict:
    return {_key(_R(getattr(_R, name))): code for name, code in pairs}


if all(hash(_R(getattr(_R, n))) == int(getattr(_R, n)) for n, _ in _TORCH_BOOL_OPS + _TORCH_OPS):
    _OPS = _table(_TORCH_OPS)
    _BOOL_OPS = _table(_TORCH_BOOL_OPS)
else:  # a torch whose ReduceOp hashes differently: compare (slow, but right)
    def _key(op: Any) -> Any:  # noqa: F811
        for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR"):
            if op == getattr(_R, name):
                return name
        return None

    _OPS = dict(_TORCH_OPS)
    _BOOL_OPS = dict(_TORCH_BOOL_OPS)


def _reduce_codes(t: torch.Tensor, op: Any) -> tuple:
    """(dtype code, op code) for reducing `t` with torch op `op`."""
    code = _DT.get(t.dtype)
    if code == C.BOOL:
        opc = _BOOL_OPS.get(_key(op))
        if opc is None:
            raise ValueError(f"tutti: bool tensors reduce with MAX/SUM/BOR (or) or MIN/PRODUCT/BAND (and), not {op}")
        return C.U8, opc
    opc = _OPS.get(_key(op))
    if opc is None:
        raise ValueError(f"tutti: reduce op {op} is not supported; use SUM, AVG, PRODUCT, MIN or MAX")
    if code is None:
        raise TypeError(f"tutti: a {tuple(t.shape)} tensor of dtype {t.dtype} cannot be reduced; supported: "
                        f"{_REDUCIBLE}. Convert it first (e.g. t.to(torch.int32) or t.float(), and back)")
    return code, opc


def _moved(t: torch.Tensor) -> tuple:
    """(dtype code, element size) to move `t` without reducing it (other dtypes go as bytes)."""
    code = _DT.get(t.dtype)
    if code is None or code == C.BOOL:
        return C.U8, 1
    return code, t.element_size()


def _cpu(t: torch.Tensor) -> None:
    if not t.is_cpu:
        raise ValueError(f"tutti: the backend handles CPU tensors only; got a {tuple(t.shape)} {t.dtype} tensor on "
                         f"{t.device}. Move it with .cpu(), or give GPU tensors their own backend "
                         "(a group with backend='nccl' or 'gloo')")


def _src(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with `t`'s data, to read from (a copy only if `t` is not contiguous)."""
    _cpu(t)
    return t if t.is_contiguous() else t.contiguous()


def _dst(t: torch.Tensor, post: list, keep_data: bool = True) -> torch.Tensor:
    """A contiguous tensor to write into, copied back into `t` afterwards if `t` is not contiguous."""
    _cpu(t)
    if t.is_contiguous():
        return t
    tmp = t.contiguous() if keep_data else torch.empty(t.shape, dtype=t.dtype)
    post.append(lambda: t.copy_(tmp))
    return tmp


def _flat(ts: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """If the tensors lie back to back in one storage (e.g. from `x.chunk(n)`), a 1-D view
    over all of them; else None."""
    if not ts:
        return None
    t0 = ts[0]
    if not all(t.is_contiguous() and t.dtype == t0.dtype and t.is_cpu for t in ts):
        return None
    try:
        if any(t.untyped_storage().data_ptr() != t0.untyped_storage().data_ptr() for t in ts):
            return None
    except Exception:
        return None
    end = t0.data_ptr()
    for t in ts:
        if t.data_ptr() != end:
            return None
        end += t.numel() * t.element_size()
    total = sum(t.numel() for t in ts)
    return torch.empty(0, dtype=t0.dtype).set_(t0.untyped_storage(), t0.storage_offset(), (total,), (1,))


def _gather_buffer(outs: List[torch.Tensor], post: list) -> torch.Tensor:
    """One contiguous buffer for a list of outputs: the list itself if it is back to back,
    else a temporary copied into the outputs afterwards."""
    for t in outs:
        _cpu(t)
    flat = _flat(outs)
    if flat is not None:
        return flat
    tmp = torch.empty(sum(t.numel() for t in outs), dtype=outs[0].dtype)

    def copy_out() -> None:
        off = 0
        for t in outs:
            n = t.numel()
            t.copy_(tmp[off:off + n].view(t.shape))
            off += n

    post.append(copy_out)
    return tmp


def _concat(ins: List[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer with the inputs' data, back to back (a copy unless they already are)."""
    for t in ins:
        _cpu(t)
    flat = _flat(ins)
    if flat is not None:
        return flat
    return torch.cat([t.reshape(-1) for t in ins]) if ins else torch.empty(0)


def _disjoint(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """`src`, or a copy of it if it overlaps `dst` (the core reads and writes separate buffers)."""
    a, b = src.data_ptr(), dst.data_ptr()
    if a < b + dst.numel() * dst.element_size() and b < a + src.numel() * src.element_size():
        return src.clone()
    return src


def _prefix(xs: List[int]) -> List[int]:
    out, acc = [], 0
    for x in xs:
        out.append(acc)
        acc += x
    return out


def _seconds(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


# ---- Work --------------------------------------------------------------------------------


class _DoneWork(dist._Work):
    """The Work of a blocking call (``async_op=False``): complete when returned."""

    def __init__(self, outputs: Any = None):
        super().__init__()
        self._out = outputs if outputs is not None else []
        self._fut: Optional[torch.futures.Future] = None

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        if self._fut is None:
            self._fut = torch.futures.Future()
            self._fut.set_result(self._out)
        return self._fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> Any:
        return self._out

    def synchronize(self) -> None:
        pass


# torch returns None to the user for blocking calls, so one shared completed Work serves them all.
_DONE = _DoneWork()


class TuttiWork(dist._Work):
    """The Work of an asynchronous call. ``wait()`` blocks without the GIL and raises the
    op's error (a :class:`tutti.TuttiError`); ``get_future()`` is completed, with the list
    of output tensors, from tutti's completer thread once the op (and any copy back into
    non-contiguous outputs) is done."""

    def __init__(self, native: Any, fut: torch.futures.Future, outputs: Any):
        super().__init__()
        # One native Work per call the op was cut into (a list of tensors is
        # several calls); waiting waits for all, and the first error wins.
        self._ws = list(native) if isinstance(native, (list, tuple)) else [native]
        self._fut = fut
        self._out = outputs

    def wait(self, timeout: Any = None) -> bool:
        # Every call is waited for before an error is raised (the first), so
        # that no call still uses the tensors when wait() returns or raises;
        # a timeout (the built-in TimeoutError: still running) is raised at once.
        t = _seconds(timeout)
        end = None if t is None else time.monotonic() + t
        first: Optional[BaseException] = None
        for w in self._ws:
            try:
                w.wait(None if end is None else max(end - time.monotonic(), 0.0))
            except Exception as e:  # noqa: BLE001 - the op's error, raised below
                if isinstance(e, TimeoutError) and not isinstance(e, TuttiError):
                    raise  # still running
                if first is None:
                    first = e
        if first is not None:
            raise first
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._ws)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._ws)

    def exception(self) -> Any:
        for w in self._ws:
            e = w.exception()
            if e is not None:
                return e
        return None

    def result(self) -> Any:
        return self._out

    def synchronize(self) -> None:
        pass

    def _source_rank(self) -> int:
        """The rank that sent what a receive got (what ``dist.recv(t)`` without ``src``
        returns); valid once the receive completed successfully."""
        for w in self._ws:
            st = w.status()
            if st is not None:
                return st[0]
        raise RuntimeError("tutti: _source_rank() needs a receive that completed successfully (wait() first)")

    source_rank = _source_rank

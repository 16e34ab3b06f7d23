"""DDP communication hooks on tutti (``tutti.torch.hooks``): the 16-bit wire and Top-K.

Register one on a ``DistributedDataParallel`` model whose process group is a tutti group
(``init_process_group("tutti")``, ``"cpu:tutti"``, or ``new_group(backend="tutti")``)::

    from tutti.torch.hooks import bf16_wire_hook, topk_hook, TopKState

    ddp.register_comm_hook(None, bf16_wire_hook)           # or ddp.process_group as the state
    ddp.register_comm_hook(TopKState(ratio=0.01), topk_hook)

* :func:`bf16_wire_hook`, :func:`fp16_wire_hook`: the bucket's float32 gradients travel as
  bf16 / f16 (half the bytes) and every rank adds them in float32, rounding once per hop;
  the result is averaged over the group. Torch's ``fp16_compress_hook`` instead casts the
  bucket to fp16 and divides it by the group size before the AllReduce (a gradient beyond
  65504 is infinite before it is sent), and DDP refuses its ``bf16_compress_hook`` without
  CUDA and NCCL; tutti's f16 wire scales by ``2^-ceil(log2 n)`` to keep partial sums in
  range, and its bf16 wire has float32's range (docs/training.md, "The 16-bit wire").
* :func:`topk_hook` with a :class:`TopKState`: each rank sends only the ``ceil(ratio *
  len)`` entries of largest magnitude of each bucket, plus error feedback: what is not sent
  is kept (per bucket index, per parameter) and added to the next step's gradient.
  ``TopKState(warmup_steps=W)`` sends the first ``W`` synchronisations dense (a plain
  average), the dense warm-up of Deep Gradient Compression (Lin et al. 2018), and
  ``TopKState(momentum=m)`` its momentum correction (the optimizer then uses plain SGD).

Each hook returns at once with a ``torch.futures.Future`` that tutti's completer thread
completes when the op is done, so the communication overlaps the rest of the backward
pass, like DDP's own all-reduce. ``no_sync()`` accumulation needs nothing from a hook:
DDP calls it only on the step that synchronises, with the accumulated gradients.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import _codes as C
from . import _native
from ._training import TopK

__all__ = ["bf16_wire_hook", "fp16_wire_hook", "topk_hook", "TopKState"]


def _native_comm(state: Any, hook: str) -> Any:
    """The tutti communicator behind the hook's process group: ``state`` itself (a
    ``ProcessGroup``), its ``process_group`` attribute, or the default group for None."""
    pg = getattr(state, "process_group", state)
    if pg is None:
        pg = dist.group.WORLD
        if pg is None:
            raise RuntimeError(f"tutti.torch.hooks.{hook}: no process group (call dist.init_process_group first)")
    comm = getattr(pg, "comm", None)  # ProcessGroupTutti, TuttiBackend
    if not isinstance(comm, _native.Communicator):
        try:  # torch's ProcessGroup with a tutti backend for cpu ("cpu:tutti")
            comm = getattr(pg._get_backend(torch.device("cpu")), "comm", None)
        except Exception:  # noqa: BLE001 - no cpu backend: not a tutti group
            comm = None
    if not isinstance(comm, _native.Communicator):
        try:
            name = dist.get_backend(pg)
        except Exception:  # noqa: BLE001
            name = type(pg).__name__
        raise TypeError(f"tutti.torch.hooks.{hook} runs on a tutti process group, but this DDP model's group has "
                        f"backend {name!r}; create the group with backend='tutti' (or 'cpu:tutti'), or use "
                        f"torch's own hooks (torch.distributed.algorithms.ddp_comm_hooks) for other backends")
    return comm


def _f32_buffer(bucket: Any, hook: str) -> torch.Tensor:
    buf = bucket.buffer()
    if buf.dtype != torch.float32 or not buf.is_cpu or not buf.is_contiguous():
        raise TypeError(f"tutti.torch.hooks.{hook}: the bucket holds {buf.dtype} gradients on {buf.device}; "
                        f"this hook handles contiguous float32 CPU buckets (the parameters' dtype)")
    return buf


def _completion(fut: torch.futures.Future, result: torch.Tensor, post: Any = None) -> Any:
    """The callback of a tutti op that completes ``fut``: with the op's error, or after
    ``post()`` (on the completer thread) with ``result``."""

    def done(err: Optional[BaseException]) -> None:
        if err is not None:
            fut.set_exception(err)
            return
        try:
            if post is not None:
                post()
        except BaseException as e:  # noqa: BLE001 - handed to the future
            fut.set_exception(e)
            return
        fut.set_result(result)

    return done


def _wire_hook(state: Any, bucket: Any, wire: str, hook: str) -> torch.futures.Future[torch.Tensor]:
    comm = _native_comm(state, hook)
    buf = _f32_buffer(bucket, hook)
    n = buf.numel()
    p, nb = buf.data_ptr(), n * 4
    fut: torch.futures.Future = torch.futures.Future()
    comm._call(C.ALL_REDUCE, 0, C.F32, C.OP_AVG, n, p, nb, p, nb, None, True, buf, _completion(fut, buf), None,
               wire)
    return fut


def bf16_wire_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket's float32 gradients are all-reduced by tutti on
    a bf16 wire (half the bytes; float32 accumulation at every hop, float32's range) and
    averaged over the group. ``state``: the process group (a tutti group), or None for the
    default one. Register with ``ddp.register_comm_hook(None, bf16_wire_hook)``."""
    return _wire_hook(state, bucket, "bf16", "bf16_wire_hook")


def fp16_wire_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """As :func:`bf16_wire_hook` on an f16 wire: more mantissa (2^-11 per rounding against
    bf16's 2^-8), less range (values are scaled by ``2^-ceil(log2 n)`` so partial sums
    cannot overflow f16; magnitudes below about ``2^-24 * 2^ceil(log2 n)`` flush to zero).
    Unlike torch's ``fp16_compress_hook``, every hop adds in float32."""
    return _wire_hook(state, bucket, "f16", "fp16_wire_hook")


class _Entry:
    """One bucket index's compressor: the bucket's parameters (identity and size, in
    buffer order) and its :class:`tutti.TopK` (residual and velocity)."""

    __slots__ = ("sig", "params", "topk")

    def __init__(self, sig: Tuple, params: List[torch.Tensor], topk: TopK):
        self.sig, self.params, self.topk = sig, params, topk


class TopKState:
    """The state of :func:`topk_hook`: the ratio of entries sent per bucket (``ceil(ratio *
    len)``, at least one), error feedback on or off, the process group (None: the DDP
    model's default group), and a residual per bucket index.

    ``warmup_steps``: the first ``warmup_steps`` synchronisations send every entry (a plain
    average over the group, nothing held back), then Top-K starts: the dense warm-up of
    Deep Gradient Compression (Lin et al. 2018), which lets the early, fast-changing
    gradients through undelayed. :attr:`syncs` counts the synchronisations so far.

    ``momentum``: DGC's momentum correction with factor ``m`` in ``[0, 1)`` (needs error
    feedback). Each rank keeps a velocity per gradient entry, ``u = m * u + g``, adds it to
    the residual, sends the top ``k`` of the residual and zeroes both where it sent; the
    dense warm-up sends the whole residual and keeps ``u`` (SGD with momentum ``m``). The
    hook's result is then the update itself: use the optimizer **without** momentum
    (``torch.optim.SGD(params, lr, momentum=0)``), or momentum is applied twice. Plain
    error feedback releases held-back entries in bursts that an optimizer's momentum
    amplifies; this keeps Top-K training on the dense curve (docs/training.md).

    DDP rebuilds its buckets after the first iteration (by the order gradients became
    ready): a residual (and a velocity) follows its parameters to their new bucket, so
    nothing held back is lost or misplaced. :meth:`residuals` shows what is held back, per
    parameter, and :meth:`velocities` the velocity."""

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True, process_group: Any = None,
                 warmup_steps: int = 0, momentum: Optional[float] = None):
        ratio = float(ratio)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"TopKState: ratio {ratio} must be in (0, 1]")
        if int(warmup_steps) < 0:
            raise ValueError(f"TopKState: warmup_steps {warmup_steps} must be >= 0")
        if momentum is not None:
            momentum = float(momentum)
            if not 0.0 <= momentum < 1.0:
                raise ValueError(f"TopKState: momentum {momentum} must be in [0, 1)")
            if not error_feedback:
                raise ValueError("TopKState: momentum correction needs error_feedback=True (the velocity is "
                                 "added to the residual)")
        self.ratio, self.error_feedback, self.process_group = ratio, bool(error_feedback), process_group
        self.warmup_steps = int(warmup_steps)
        #: The momentum correction's factor, or None.
        self.momentum = momentum
        #: Synchronisations so far (counted at each step's last bucket).
        self.syncs = 0
        self._buckets: Dict[int, _Entry] = {}
        # (residual, velocity) of parameters whose bucket was rebuilt, until their new
        # bucket comes.
        self._loose: Dict[int, Tuple[np.ndarray, Optional[np.ndarray]]] = {}

    def _entry(self, bucket: Any, n: int) -> _Entry:
        params = list(bucket.parameters())
        sig = tuple((id(p), p.numel()) for p in params)
        e = self._buckets.get(bucket.index())
        if e is not None and e.sig == sig:
            return e
        if e is not None:  # the buckets were rebuilt: every old residual goes loose, by parameter
            for old in self._buckets.values():
                self._loosen(old)
            self._buckets.clear()
        topk = TopK(n, self.ratio, self.error_feedback, momentum=self.momentum)
        if self.error_feedback and self._loose and sig and sum(c for _, c in sig) == n:
            parts = [self._loose.pop(i, None) for i, _ in sig]
            if any(x is not None for x in parts):
                zero = [np.zeros(c, np.float32) for _, c in sig]
                res = np.concatenate([x[0] if x is not None else z for x, z in zip(parts, zero)])
                vel = None if self.momentum is None else np.concatenate(
                    [x[1] if x is not None and x[1] is not None else z for x, z in zip(parts, zero)])
                topk.restore(res, vel)
        e = _Entry(sig, params, topk)
        self._buckets[bucket.index()] = e
        return e

    def _loosen(self, e: _Entry) -> None:
        res, vel = e.topk.residual, e.topk.velocity
        if sum(c for _, c in e.sig) != len(res):
            return
        at = 0
        for i, c in e.sig:
            self._loose[i] = (res[at:at + c], None if vel is None else vel[at:at + c])
            at += c

    def residuals(self) -> Dict[torch.Tensor, torch.Tensor]:
        """What is held back now, per parameter (a copy shaped like the parameter); zeros
        without error feedback. Parameters no bucket has carried yet are absent."""
        return self._per_param(lambda t: t.residual)

    def velocities(self) -> Dict[torch.Tensor, torch.Tensor]:
        """The momentum correction's velocity now, per parameter (a copy shaped like the
        parameter); empty without momentum correction."""
        return {} if self.momentum is None else self._per_param(lambda t: t.velocity)

    def _per_param(self, of: Any) -> Dict[torch.Tensor, torch.Tensor]:
        out: Dict[Any, torch.Tensor] = {}
        for e in self._buckets.values():
            vec = of(e.topk)  # a copy
            at = 0
            for p in e.params:
                c = p.numel()
                out[p] = torch.from_numpy(vec[at:at + c].copy()).view(p.shape)
                at += c
        return out


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: Top-K with error feedback. Each rank adds its residual to
    the bucket's gradient, sends the ``k`` entries of largest magnitude (``k = ceil(ratio *
    len)``, the same on every rank) and keeps the rest for the next step; every rank gets
    the average over the group of what was sent, dense. The pairs travel as one AllGather
    (``k`` indices and values per rank) or, where the cost model finds it cheaper (``n * k``
    pairs outweigh the bucket), as an AllReduce of the scattered bucket; both are
    asynchronous tutti ops. With ``state.warmup_steps`` the first synchronisations are a
    dense AllReduce (average) instead. Register with ``ddp.register_comm_hook(TopKState(ratio=0.01),
    topk_hook)``."""
    if not isinstance(state, TopKState):
        raise TypeError(f"tutti.torch.hooks.topk_hook needs a tutti.torch.hooks.TopKState as its state (e.g. "
                        f"ddp.register_comm_hook(TopKState(ratio=0.01), topk_hook)), not {type(state).__name__}")
    comm = _native_comm(state, "topk_hook")
    buf = _f32_buffer(bucket, "topk_hook")
    g = buf.detach().numpy()  # shares the bucket's memory
    n_el = g.size
    e = state._entry(bucket, n_el)
    warm = state.syncs < state.warmup_steps
    if bucket.is_last():
        state.syncs += 1
    if warm:  # dense warm-up: the plain average of the folded-in gradient (momentum, residual)
        e.topk.dense_step(g)
        fut0: torch.futures.Future = torch.futures.Future()
        p = buf.data_ptr()
        comm._call(C.ALL_REDUCE, 0, C.F32, C.OP_AVG, n_el, p, n_el * 4, p, n_el * 4, None, True, buf,
                   _completion(fut0, buf))
        return fut0
    idx, vals = e.topk.compress(g)
    k = len(idx)
    size = comm.size
    fut: torch.futures.Future = torch.futures.Future()
    if _native._sparse_route(comm, k, n_el) == "dense":
        g[:] = 0
        g[idx] = vals

        def scale() -> None:
            if size > 1:
                np.divide(g, size, out=g)

        comm._call(C.ALL_REDUCE, 0, C.F32, C.OP_SUM, n_el, buf.data_ptr(), n_el * 4, buf.data_ptr(), n_el * 4,
                   None, True, buf, _completion(fut, buf, scale))
        return fut
    # Gather: one block per rank, k indices then k values (their bits), summed in rank
    # order so that every rank gets the same bits.
    mine = np.empty(2 * k, np.uint32)
    mine[:k] = idx
    mine[k:] = vals.view(np.uint32)
    every = np.empty(size * 2 * k, np.uint32)

    def add_up() -> None:  # in Rust, without the GIL: zero, add in rank order, divide what was touched
        _native._sum_pair_blocks(every, k, g, size > 1)

    comm._call(C.ALL_GATHER, 0, C.U32, C.OP_SUM, 2 * k, mine.ctypes.data, mine.nbytes, every.ctypes.data,
               every.nbytes, None, True, (mine, every, buf), _completion(fut, buf, add_up))
    return fut

"""The c10d ``Backend`` route of the torch backend: :class:`TuttiBackend`.

torch keeps a ``ProcessGroup`` per group and, in it, one c10d ``Backend`` per device
type; ``init_process_group("cpu:tutti")`` and ``init_process_group("cpu:tutti,cuda:nccl")``
ask the creator registered for ``"tutti"`` for the ``cpu`` one. :class:`TuttiBackend` is
that backend: a ``torch._C._distributed_c10d.Backend`` subclass (torch's ``PyBackend``
trampoline dispatches its C++ virtuals to these Python methods) with the same ops as the
whole-``ProcessGroup`` route (:class:`tutti._torch_ops.TorchOps`, shared, not copied).

Being a per-device backend is what some of torch's calls need: ``dist.monitored_barrier``
(it asks the group for a backend registered for ``cpu``), ``dist.split_group`` (the
group's backend must support splitting: onto tutti's ``split``), ``dist.shrink_group``
(onto tutti's ``shrink``) and ``dist.set_timeout``. CUDA tensors in a device-mixed group
go to the other backend; torch does the routing, by the tensor's device.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend

from ._torch_barrier import monitored_barrier as _monitored_barrier
from ._torch_coalesced import CoalescedOps
from ._torch_estimate import TimeEstimateMixin
from ._torch_ops import TorchOps, groups, join
from ._torch_util import _seconds
from ._torch_window import CoalescingWindow

BACKEND_NAME = "tutti"

# dist.shrink_group's flag that asks to abort the parent's pending ops first.
_SHRINK_ABORT = getattr(dist.distributed_c10d, "SHRINK_ABORT", 0x01)


def _options(timeout: Any, ranks: Optional[List[int]] = None, name: str = "") -> Any:
    """A ``Backend.Options`` for tutti with `timeout` (a timedelta, or seconds)."""
    if not isinstance(timeout, datetime.timedelta):
        s = _seconds(timeout)
        timeout = datetime.timedelta(seconds=s) if s is not None else datetime.timedelta(minutes=30)
    o = C10dBackend.Options(BACKEND_NAME, timeout)
    if ranks is not None:
        o.global_ranks_in_group = list(ranks)
    if name:
        o.group_name = name
    return o


class TuttiBackend(TimeEstimateMixin, TorchOps, CoalescedOps, CoalescingWindow, C10dBackend):
    """A c10d ``Backend`` for CPU tensors on a tutti communicator (see the module doc).

    ``TuttiBackend(store, rank, size, timeout)`` joins through torch's store, as the
    ``ProcessGroup`` route does; ``comm=`` wraps a communicator made by a split or a shrink
    (``owner=False``: one that a :class:`tutti.torch.ProcessGroupTutti` owns and releases).
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: Any = None, *, comm: Any = None,
                 options: Any = None, owner: bool = True):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._options = options if options is not None else _options(timeout)
        self._comm = comm if comm is not None else join(store, rank, size, _seconds(self._options._timeout))
        self._call = self._comm._call
        if owner:
            groups.add(self)

    # ---- identity and capabilities (torch reads these) ----
    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def options(self) -> Any:
        """This backend's ``Backend.Options`` (its timeout; torch copies them for splits)."""
        return self._options

    @property
    def supports_splitting(self) -> bool:
        """``dist.split_group`` and ``new_group`` splits run on tutti's ``split``."""
        return True

    @property
    def supports_shrinking(self) -> bool:
        """``dist.shrink_group`` runs on tutti's ``shrink``."""
        return True

    def set_timeout(self, timeout: Any) -> None:
        """``dist.set_timeout``: the deadline of this group's later ops."""
        TorchOps.set_timeout(self, timeout)
        s = _seconds(timeout)
        if s is not None:
            self._options._timeout = datetime.timedelta(seconds=s)

    def shutdown(self) -> None:
        self._comm.destroy()

    def abort(self) -> None:
        self._comm.abort()

    # ---- what needs a per-device backend ----
    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        """``dist.monitored_barrier``: rank 0 names the ranks that did not arrive within
        the barrier's timeout (the first, or all with `wait_all_ranks`)."""
        timeout = getattr(opts, "timeout", None) if opts is not None else None
        if _seconds(timeout) is None:
            timeout = self._comm.timeout
        _monitored_barrier(self, timeout, wait_all_ranks)

    def split(self, store: Any, ranks: List[int], opts: Any = None) -> Optional["TuttiBackend"]:
        """``dist.split_group`` (every rank of this group calls it): ``ranks`` (this
        group's ranks, in the new group's order) get a backend on a tutti ``split`` of this
        communicator; the others get None."""
        ranks = [int(r) for r in ranks]
        me = self.rank()
        member = me in ranks
        sub = self._comm.split(min(ranks) if member and ranks else None, ranks.index(me) if member else 0)
        if sub is None:
            return None
        return self._child(sub, opts, [self._global(r) for r in ranks])

    def perform_nocolor_split(self, device: Any = None) -> None:
        """A rank outside a new group's ranks takes part in the split that makes it."""
        self._comm.split(None, 0)

    def shrink(self, ranks_to_exclude: List[int], shrink_flags: int = 0, opts: Any = None) -> "TuttiBackend":
        """``dist.shrink_group`` (every remaining rank calls it): a backend on a tutti
        ``shrink`` of this communicator to the ranks not excluded."""
        dead = sorted(int(r) for r in ranks_to_exclude)
        if shrink_flags & _SHRINK_ABORT:
            self._comm.abort()
        sub = self._comm.shrink(dead)
        keep = [r for r in range(self.size()) if r not in dead]
        return self._child(sub, opts, [self._global(r) for r in keep])

    def _global(self, r: int) -> int:
        ranks = list(self._options.global_ranks_in_group)
        return ranks[r] if len(ranks) == self.size() else r

    def _child(self, comm: Any, opts: Any, global_ranks: List[int]) -> "TuttiBackend":
        if opts is None:
            opts = _options(self._options._timeout, global_ranks)
        else:
            opts.global_ranks_in_group = global_ranks
        comm.timeout = _seconds(opts._timeout)
        return TuttiBackend(None, comm.rank, comm.size, comm=comm, options=opts)


def _route_of_call() -> Optional[str]:
    """The backend string torch is building a group for (``"tutti"``, ``"cpu:tutti"``,
    ...), read from torch's ``_new_process_group_helper`` up the stack; None if not found."""
    f: Any = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_new_process_group_helper":
            b = f.f_locals.get("backend")
            return None if b is None else str(b)
        f = f.f_back
    return None


def create_backend(opts: Any, backend_options: Any = None) -> TuttiBackend:
    """The extended-API creator: a :class:`TuttiBackend` for torch's group (a split of
    the default group's when torch asks for one)."""
    options = _options(opts.timeout, list(opts.global_ranks_in_group) or None, str(opts.group_id))
    if backend_options is not None and isinstance(backend_options, C10dBackend.Options):
        options._timeout = backend_options._timeout
    parent = opts.split_from
    if isinstance(parent, TuttiBackend) and opts.global_ranks_in_group:
        child = parent.split(opts.store, list(opts.global_ranks_in_group), options)
        if child is not None:
            return child
    return TuttiBackend(opts.store, opts.group_rank, opts.group_size, options=options)

"""The torch.distributed backend ``"tutti"`` for CPU tensors.

An installed tutti registers the backend through torch's ``torch.distributed.backends``
entry point; importing this module registers it too::

    import torch.distributed as dist

    dist.init_process_group(backend="tutti")       # under torchrun, tutti run, or mp.spawn
    dist.init_process_group(backend="cpu:tutti,cuda:nccl")   # beside NCCL in a GPU job

after which every torch.distributed collective on CPU tensors, and DistributedDataParallel,
run over tutti (shared memory within a host, TCP across hosts).

Two routes, one set of ops (tutti._torch_ops). The plain name ``"tutti"`` makes a
:class:`ProcessGroupTutti`, a whole ``torch.distributed.ProcessGroup`` in Python whose
methods torch calls directly: the cheaper route per call (python/bench/torch_routes.py).
A device string (``"cpu:tutti"``, ``"cpu:tutti,cuda:nccl"``) makes a
:class:`TuttiBackend`, a c10d ``Backend`` for cpu under torch's own ProcessGroup
(tutti._torch_backend): reached through torch's dispatcher, so dearer per call, but what
``dist.monitored_barrier``, ``dist.split_group``, ``dist.shrink_group``,
``dist.set_timeout`` and a device mix need.

How it works. The creator receives torch's store (``env://``, ``tcp://`` or
``file://``) and uses it only to hand rank 0's :class:`tutti.UniqueId` to the others
(rank 0 listens on its address on the route to ``MASTER_ADDR`` or to the ``tcp://`` host;
with ``file://``, the ranks first publish their addresses there, and rank 0 takes its
address on the route to a rank on another host if there is one);
every group (the default one and each ``dist.new_group``) gets its own tutti
communicator. Tensors are passed to tutti by address: no copy for contiguous CPU
tensors (a non-contiguous one is copied once into a contiguous buffer and back).
Blocking calls (``async_op=False``) run on the calling thread with the GIL released;
asynchronous ones (``async_op=True``, and every call DDP makes) run on tutti's progress
thread, and their ``torch.futures.Future`` is completed from tutti's completer thread,
so DDP's gradient all-reduces overlap the backward pass. The group's timeout (the
``timeout=`` of ``init_process_group``/``new_group``) is every op's deadline.

Supported: all_reduce, broadcast, reduce, all_gather (lists, uneven sizes too) and
all_gather_into_tensor, reduce_scatter (lists) and reduce_scatter_tensor, all_to_all and
all_to_all_single (with split sizes), gather, gather_single, scatter, send/recv/isend/
irecv (with tags, and from any source), batch_isend_irecv, barrier, and the coalesced
forms. Reductions: SUM, AVG, PRODUCT, MIN, MAX on
float32/64, float16, bfloat16, int8/32/64, uint8 (and uint32/64); bool with MAX/MIN (SUM
and PRODUCT mean or/and, BOR/BAND too). Other dtypes (int16, complex, ...) are moved
as bytes; torch itself turns complex all-reduces into float ones.

Point to point. send/recv/isend/irecv and ``batch_isend_irecv`` run on the
communicator's point-to-point channel, beside the collectives and not behind them: they
match per (peer, tag) in issue order, like MPI and NCCL, so ``tag`` is honoured and
messages of different tags or peers never wait for each other; ``dist.recv(t)`` without
``src`` receives from any source and returns the sender's rank (``Work._source_rank()``);
every op of a ``batch_isend_irecv`` is posted before any is waited for, so no order of
sends and receives (a ring shift of large tensors, a pipeline's forward sends and
backward receives in flight together) can deadlock. A receive whose tensor is not the
size of the message raises :class:`tutti.SizeMismatchError` at the receiver (and at the
sender too for a message over 128 KiB; a smaller send has completed once it left); the
group stays usable.

Batches and the rest. Coalesced calls (``all_reduce_coalesced``, ``all_gather_coalesced``,
``_coalescing_manager``'s batches) are one tutti op per batch (tutti._torch_coalesced);
sparse COO tensors all-reduce with SUM (tutti._torch_sparse); ``group.monitored_barrier``
names the ranks that did not arrive (tutti._torch_barrier); ``barrier(timeout=)`` is honoured.

Coalescing window (tutti._torch_window): ``supports_coalescing`` is True, so
``batch_isend_irecv`` and ``_coalescing_manager(group, device)`` open a window whose
sends and receives are posted at its end as one batch, with one Work.

Flight recorder. On the Backend route torch's own FlightRecorderHook records every op
in the recorder instance ``"tutti"`` (``_dump_fr_trace(backend="tutti")``); the
ProcessGroup route is not recorded (torch calls its Python methods, not the dispatcher
kernels where the hooks fire). tutti's own recorder (``TUTTI_TRACE_DIR``) covers both.

Limits. CPU tensors only. On the Backend route torch wraps each Work in its
``PyWorkHolder`` (torch/csrc/distributed/c10d/py/PyProcessGroup.hpp), which forwards only
``wait()`` and ``get_future()``: ``is_completed()`` stays False (``get_future().done()``
works) and ``dist.recv(t)`` without ``src`` (it reads ``Work._source_rank()``) raises;
a Python backend cannot change that; use the plain name for those.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ._torch_backend import BACKEND_NAME, TuttiBackend, _options, _route_of_call, create_backend
from ._torch_barrier import monitored_barrier as _monitored_barrier
from ._torch_coalesced import CoalescedOps
from ._torch_ops import TorchOps, groups, join
from ._torch_util import TuttiWork, _seconds
from ._torch_window import CoalescingWindow
from . import _torch_hooks as hooks  # DDP communication hooks: tutti.torch.hooks (the 16-bit wire, Top-K)

__import__("sys").modules[__name__ + ".hooks"] = hooks  # so that `from tutti.torch.hooks import ...` works

__all__ = ["ProcessGroupTutti", "TuttiBackend", "TuttiWork", "BACKEND_NAME", "register"]

_groups = groups  # every group of either route (weakly), destroyed at exit

# ---- the process group -------------------------------------------------------------------


class ProcessGroupTutti(TorchOps, CoalescedOps, CoalescingWindow, dist.ProcessGroup):
    """A torch.distributed ProcessGroup backed by a tutti communicator (see the module doc)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = _seconds(timeout)
        self._comm = join(store, rank, size, self._timeout)
        self._call = self._comm._call
        groups.add(self)
        # Torch's own per-device questions (dist.monitored_barrier, split_group,
        # shrink_group, the device of object collectives) go to a c10d backend
        # registered for cpu: one on this same communicator. Torch calls this
        # group's Python methods directly, so collectives do not pass through it.
        self._backend = TuttiBackend(None, rank, size, comm=self._comm, options=_options(timeout),
                                     owner=False)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self._backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    # ---- identity ----
    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch keeps a group's name in its C++ backends, and this group has none (it is a
    # ProcessGroup itself): without these, ``group_name`` raised "ProcessGroup name not
    # set", and so did ``dist.destroy_process_group(subgroup)``.
    def _set_group_name(self, name: str) -> None:
        self._name = name
        super()._set_group_name(name)  # and on the registered backend

    @property
    def group_name(self) -> str:
        """The name torch gave this group (``_set_group_name``)."""
        name = getattr(self, "_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def shutdown(self) -> None:
        self._comm.destroy()

    def abort(self) -> None:
        self._comm.abort()

    def _get_backend(self, device: Any) -> Any:
        # torch asks a group for its per-device backend (batch_isend_irecv reads its
        # `supports_coalescing`, shrink_group its `supports_shrinking`), sometimes for
        # the machine's accelerator although the group is CPU only: the answer is
        # the cpu backend (whose ops raise, naming the device, for other tensors).
        try:
            return super()._get_backend(device)
        except RuntimeError:
            return self._backend

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``group.monitored_barrier``: rank 0 names the ranks that did not arrive within
        `timeout` (the first, or all with `wait_all_ranks`); see tutti._torch_barrier."""
        _monitored_barrier(self, timeout, wait_all_ranks)


def _create(opts: Any, backend_options: Any = None) -> Any:
    """torch's creator for ``"tutti"``: a whole :class:`ProcessGroupTutti` for the plain
    name (``init_process_group("tutti")``, the cheaper route), a c10d :class:`TuttiBackend`
    when torch builds a group from ``"cpu:tutti"`` or ``"cpu:tutti,cuda:nccl"``."""
    route = _route_of_call()
    if route is not None and ":" not in route and "," not in route:
        return ProcessGroupTutti(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return create_backend(opts, backend_options)


def _adopt_tutti_env() -> None:
    """Under ``tutti run`` (TUTTI_* set), Slurm's ``srun`` (SLURM_*) or Open MPI's ``mpirun``
    (OMPI_COMM_WORLD_*), with torch's own variables not set, fill in torch's env://
    variables (the master from TUTTI_MASTER_ADDR/PORT, or MASTER_ADDR/PORT as set by the
    job script) so that ``dist.init_process_group(backend="tutti")`` works unchanged."""
    launchers = (
        ("TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    )
    if os.environ.get("RANK"):
        return
    for rank, size, local in launchers:
        if os.environ.get(rank) and os.environ.get(size):
            pairs = (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local),
                     ("MASTER_ADDR", "TUTTI_MASTER_ADDR"), ("MASTER_PORT", "TUTTI_MASTER_PORT"))
            for torch_name, name in pairs:
                v = os.environ.get(name)
                if v and not os.environ.get(torch_name):
                    os.environ[torch_name] = v
            return


def register() -> None:
    """Registers the backend ``"tutti"`` for CPU tensors (done on import; idempotent). It
    is also torch's ``torch.distributed.backends`` entry point, so that an installed
    tutti needs no ``import tutti.torch``."""
    _adopt_tutti_env()
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])


register()


@__import__("atexit").register
def _destroy_all() -> None:
    for g in list(groups):
        try:
            g.comm.destroy()
        except Exception:
            pass

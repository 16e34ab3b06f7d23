"""tutti: collective communication for CPU processes, from Python.

Two ways in:

* numpy arrays: :class:`Communicator` (one per process; or per thread with
  :meth:`Communicator.init_all`) or the torch.distributed-style module functions after
  :func:`init_process_group`::

      import numpy as np, tutti
      tutti.init_process_group()              # under `tutti run`, torchrun, Slurm, mpirun
      x = np.full(4, tutti.rank(), np.float32)
      tutti.all_reduce(x)                     # in place, GIL released, no copy

* torch: ``import tutti.torch`` registers the torch.distributed backend ``"tutti"``::

      import torch.distributed as dist, tutti.torch
      dist.init_process_group(backend="tutti")

Errors from the core are :class:`TuttiError` subclasses (:class:`TimeoutError`,
:class:`PeerLostError`, ...) with the core's message.
"""

from ._errors import (
    AbortedError,
    BootstrapError,
    ConfigError,
    InvalidArgumentError,
    IoError,
    MismatchError,
    PeerLostError,
    SizeMismatchError,
    TimeoutError,
    TuttiError,
)
from ._comm import Communicator, P2POp, ReduceOp, UniqueId, Work
from ._training import DEFAULT_BUCKET_BYTES, TopK
from ._explain import explain
from ._group import *  # noqa: F401,F403  (init_process_group, rank, all_reduce, ...)
from ._group import __all__ as _group_all
from . import _native

__version__ = _native.__version__

__all__ = [
    "Communicator",
    "explain",
    "Work",
    "P2POp",
    "ReduceOp",
    "UniqueId",
    "TopK",
    "DEFAULT_BUCKET_BYTES",
    "TuttiError",
    "TimeoutError",
    "PeerLostError",
    "MismatchError",
    "SizeMismatchError",
    "AbortedError",
    "InvalidArgumentError",
    "ConfigError",
    "BootstrapError",
    "IoError",
] + list(_group_all)

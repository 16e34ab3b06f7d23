"""torch.distributed-style module functions over a default communicator."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, List, Optional, Sequence, Union
from urllib.parse import urlparse

from . import _net
from ._comm import Communicator, P2POp, UniqueId

__all__ = [
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "get_default_group",
    "rank",
    "world_size",
    "get_rank",
    "get_world_size",
    "new_group",
    "batch_isend_irecv",
]

_default: Optional[Communicator] = None
_groups: List[Communicator] = []


def _env_int(*names: str) -> Optional[int]:
    for n in names:
        v = os.environ.get(n, "").strip()
        if v:
            return int(v)
    return None


def _env_master() -> tuple:
    addr = os.environ.get("TUTTI_MASTER_ADDR") or os.environ.get("MASTER_ADDR")
    port = os.environ.get("TUTTI_MASTER_PORT") or os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError("init_method='env://' with an explicit rank/world_size needs TUTTI_MASTER_ADDR and "
                         "TUTTI_MASTER_PORT (or MASTER_ADDR and MASTER_PORT) in the environment")
    return addr, int(port)


def init_process_group(backend: Optional[str] = None, *, init_method: str = "env://", rank: Optional[int] = None,
                       world_size: Optional[int] = None, timeout: Optional[float] = None) -> Communicator:
    """Creates the default communicator that the module functions use, and returns it.

    ``init_method`` is one of:

    * ``"env://"`` (default): with ``rank`` and ``world_size`` unset, everything comes from
      the environment (``tutti run``, torchrun, Slurm, Open MPI; see
      :meth:`Communicator.from_env`). With them set, only the master comes from
      ``TUTTI_MASTER_ADDR``/``TUTTI_MASTER_PORT`` or ``MASTER_ADDR``/``MASTER_PORT``.
    * ``"tcp://HOST:PORT"``: rank 0 listens on PORT at HOST; ``rank`` and ``world_size``
      are required.
    * a unique id string (``"tutti1:..."``, from :meth:`UniqueId.new` on rank 0).

    ``timeout`` is the deadline of each op in seconds (default ``TUTTI_TIMEOUT``, 300).
    ``backend`` is accepted for symmetry with torch and must be None or ``"tutti"``.
    """
    global _default
    if backend not in (None, "tutti"):
        raise ValueError(f"tutti.init_process_group: backend must be 'tutti' (or omitted), not {backend!r}")
    if _default is not None:
        raise RuntimeError("tutti.init_process_group was already called; call destroy_process_group() first")
    if init_method.startswith("tutti1:"):
        if rank is None or world_size is None:
            raise ValueError("init_method=<unique id> needs rank= and world_size=")
        comm = Communicator.init_rank(init_method, world_size, rank, timeout)
    elif init_method.startswith("tcp://"):
        u = urlparse(init_method)
        if rank is None or world_size is None:
            raise ValueError("init_method='tcp://HOST:PORT' needs rank= and world_size=")
        if not u.hostname or not u.port:
            raise ValueError(f"init_method {init_method!r} must be tcp://HOST:PORT")
        comm = Communicator.init_rank(UniqueId.for_address(u.hostname, u.port), world_size, rank, timeout)
    elif init_method.startswith("env://"):
        if rank is None and world_size is None:
            comm = Communicator.from_env(timeout)
        else:
            r = rank if rank is not None else _env_int("TUTTI_RANK", "RANK")
            n = world_size if world_size is not None else _env_int("TUTTI_WORLD_SIZE", "WORLD_SIZE")
            if r is None or n is None:
                raise ValueError("init_method='env://': pass both rank= and world_size=, or set both in the environment")
            if _net.under_torchrun():  # torchrun's agent owns MASTER_PORT
                comm = Communicator.init_rank(_net.unique_id_via_torch_store(r), n, r, timeout)
            else:
                host, port = _env_master()
                comm = Communicator.init_rank(UniqueId.for_address(host, port), n, r, timeout)
    else:
        raise ValueError(f"init_method must be 'env://', 'tcp://HOST:PORT' or a tutti unique id, not {init_method!r}")
    _default = comm
    return comm


def is_initialized() -> bool:
    """True between :func:`init_process_group` and :func:`destroy_process_group`."""
    return _default is not None


def get_default_group() -> Communicator:
    """The default communicator; raises if :func:`init_process_group` was not called."""
    if _default is None:
        raise RuntimeError("tutti: call tutti.init_process_group() first (or pass group=)")
    return _default


def _group(group: Optional[Communicator]) -> Communicator:
    return get_default_group() if group is None else group


def destroy_process_group(group: Optional[Communicator] = None) -> None:
    """Destroys ``group``, or (by default) the default communicator and every group made
    by :func:`new_group`."""
    global _default
    if group is not None:
        group.destroy()
        if group is _default:
            _default = None
        return
    for g in _groups:
        g.destroy()
    _groups.clear()
    if _default is not None:
        _default.destroy()
        _default = None


def rank(group: Optional[Communicator] = None) -> int:
    """This process's rank in ``group`` (default: the default communicator)."""
    return _group(group).rank()


def world_size(group: Optional[Communicator] = None) -> int:
    """The number of ranks in ``group`` (default: the default communicator)."""
    return _group(group).world_size()


get_rank = rank
get_world_size = world_size


def new_group(ranks: Sequence[int], group: Optional[Communicator] = None) -> Optional[Communicator]:
    """A communicator of ``ranks`` of the default communicator (or of ``group``), like
    ``torch.distributed.new_group``. Every rank calls it with the same list; the members
    get the new communicator (ranked in sorted order), the others None. It is destroyed
    by :func:`destroy_process_group`."""
    g = _group(group).new_group(ranks)
    if g is not None:
        _groups.append(g)
    return g


def batch_isend_irecv(p2p_op_list: Sequence[P2POp], *, timeout: Optional[float] = None) -> list:
    """Posts the sends and receives of ``p2p_op_list`` (:class:`tutti.P2POp`) at once on
    their group (every op names the same one; None: the default communicator) and returns
    a :class:`tutti.Work` per op, like ``torch.distributed.batch_isend_irecv``; see
    :meth:`Communicator.batch_isend_irecv`."""
    ops = list(p2p_op_list)
    if not ops:
        return []
    g = ops[0].group
    if any(o.group is not g for o in ops):
        raise ValueError("batch_isend_irecv: every op of a batch must name the same group")
    return _group(g).batch_isend_irecv(ops, timeout=timeout)


def _module_function(name: str) -> Callable[..., Any]:
    method = getattr(Communicator, name)

    @functools.wraps(method)
    def f(*args: Any, group: Optional[Communicator] = None, **kwargs: Any) -> Any:
        return getattr(_group(group), name)(*args, **kwargs)

    f.__doc__ = (method.__doc__ or "") + "\n\n        Runs on ``group`` (default: the default communicator)."
    f.__qualname__ = f.__name__ = name
    sig = inspect.signature(method)
    params = list(sig.parameters.values())[1:]  # no self
    params.append(inspect.Parameter("group", inspect.Parameter.KEYWORD_ONLY, default=None))
    f.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return f


COLLECTIVES = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
               "gather", "scatter", "send", "recv", "isend", "irecv", "barrier"]

for _name in COLLECTIVES:
    globals()[_name] = _module_function(_name)
    __all__.append(_name)

GroupLike = Union[Communicator, None]

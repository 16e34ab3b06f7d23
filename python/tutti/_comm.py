"""The numpy API: :class:`Communicator`, :class:`Work` and :class:`ReduceOp`."""

from __future__ import annotations

import atexit
import enum
import weakref
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _codes as C
from . import _native, _net, _training
from ._errors import InvalidArgumentError

__all__ = ["Communicator", "Work", "ReduceOp", "UniqueId", "P2POp"]

UniqueId = _native.UniqueId


class ReduceOp(enum.IntEnum):
    """Reduction operators. Functions also accept their names as strings
    (``"sum"``, ``"prod"``/``"product"``, ``"max"``, ``"min"``, ``"avg"``/``"mean"``)."""

    SUM = C.OP_SUM
    PRODUCT = C.OP_PROD
    MAX = C.OP_MAX
    MIN = C.OP_MIN
    AVG = C.OP_AVG
    PROD = C.OP_PROD  # alias


_OP_NAMES = {"sum": C.OP_SUM, "prod": C.OP_PROD, "product": C.OP_PROD, "max": C.OP_MAX, "min": C.OP_MIN,
             "avg": C.OP_AVG, "mean": C.OP_AVG}

ReduceOpLike = Union[ReduceOp, int, str]


def _op_code(op: ReduceOpLike) -> int:
    if isinstance(op, str):
        try:
            return _OP_NAMES[op.lower()]
        except KeyError:
            raise ValueError(f"unknown reduction {op!r}; valid: sum, prod, max, min, avg") from None
    if isinstance(op, int) and 0 <= op <= C.OP_AVG:
        return int(op)
    raise TypeError(f"op must be a tutti.ReduceOp or one of 'sum', 'prod', 'max', 'min', 'avg', not {op!r}")


_REDUCIBLE = "float16, float32, float64, int8, int32, int64, uint8, uint32, uint64, and bool with max/min"


def _reducible(code: int, op: int, dtype: Any, what: str) -> tuple:
    """(dtype code, op code) for a reduction over an array of type `code`."""
    if code >= 0 and code != C.BOOL:
        return code, op
    if code == C.BOOL:
        if op in (C.OP_MAX, C.OP_SUM):  # logical or
            return C.U8, C.OP_MAX
        if op in (C.OP_MIN, C.OP_PROD):  # logical and
            return C.U8, C.OP_MIN
        raise TypeError(f"{what}: bool arrays cannot be averaged; use max/sum (or) or min/prod (and)")
    raise TypeError(f"{what}: dtype {dtype} cannot be reduced; supported: {_REDUCIBLE}")


def _moved(code: int, nbytes: int, item: int) -> tuple:
    """(dtype code, element size) to move an array of type `code` without reducing it."""
    if code < 0 or code == C.BOOL:
        return C.U8, 1  # any fixed-size type travels as bytes
    return code, item


_live: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


@atexit.register
def _destroy_all() -> None:
    # Join the completer threads while the interpreter is still whole.
    for c in list(_live):
        try:
            c.destroy()
        except Exception:
            pass


class Work:
    """The handle of an asynchronous op (``async_op=True``, :meth:`Communicator.isend`,
    :meth:`Communicator.irecv`, :meth:`Communicator.batch_isend_irecv`).

    Collectives on one communicator complete in the order they were issued; sends and
    receives complete when they match, whatever the order. The arrays the op reads and
    writes are kept alive until it completes, even if this handle is dropped; do not
    touch them before :meth:`wait` returns.
    """

    __slots__ = ("_w", "_result")

    def __init__(self, native: Any, result: Any):
        self._w = native
        self._result = result

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits for the op and returns its result (the output array, or None).

        Raises the op's error (a :class:`tutti.TuttiError`), or the built-in
        ``TimeoutError`` if the op is still running after ``timeout`` seconds (the op
        carries on; wait again). The GIL is released while waiting.
        """
        self._w.wait(timeout)
        return self._result

    def is_completed(self) -> bool:
        """True once the op has finished, successfully or not."""
        return self._w.is_completed()

    def is_success(self) -> bool:
        """True if the op has finished successfully."""
        return self._w.is_success()

    def exception(self) -> Optional[BaseException]:
        """The op's error once it failed, else None."""
        return self._w.exception()

    @property
    def source(self) -> Optional[int]:
        """For a receive that completed successfully, the rank that sent the message (what
        a receive from any source needs); None for other ops, and before completion."""
        st = self._w.status()
        return None if st is None else st[0]

    @property
    def status(self) -> Optional[tuple]:
        """For a receive that completed successfully, ``(source, tag, nbytes)``; else None."""
        return self._w.status()

    def __repr__(self) -> str:
        return f"<tutti.Work {'done' if self.is_completed() else 'pending'}>"


_SEND_NAMES = ("send", "isend")
_RECV_NAMES = ("recv", "irecv")
_MAX_TAG = (1 << 32) - 1


def _is_send(op: Any) -> bool:
    """Whether a P2POp's ``op`` (a string, or a send/receive function or method) sends."""
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name in _SEND_NAMES:
        return True
    if name in _RECV_NAMES:
        return False
    raise ValueError(f"P2POp: op must be isend or irecv (the functions, the Communicator methods, or the strings "
                     f"'isend'/'irecv'), not {op!r}")


def _tag(tag: Any) -> int:
    t = int(tag)
    if not 0 <= t <= _MAX_TAG:
        raise ValueError(f"tag={tag} is out of range: tags are integers in 0..2**32-1")
    return t


class P2POp:
    """One send or receive of :meth:`Communicator.batch_isend_irecv` (like
    ``torch.distributed.P2POp``).

    ``op`` is :func:`tutti.isend` or :func:`tutti.irecv` (or the :class:`Communicator`
    methods of those names, or the strings ``"isend"``/``"irecv"``); ``array`` the array
    to send, or to receive into; ``peer`` the destination or source rank (for a receive,
    None: any source); ``tag`` matches a send with a receive; ``group`` the communicator
    (default: the one whose ``batch_isend_irecv`` runs the batch, or the default one)."""

    __slots__ = ("op", "array", "peer", "tag", "group", "_send")

    def __init__(self, op: Any, array: np.ndarray, peer: Optional[int] = None, tag: int = 0,
                 group: Optional["Communicator"] = None):
        self._send = _is_send(op)
        if self._send and peer is None:
            raise ValueError("P2POp: a send needs a destination rank (peer)")
        self.op, self.array, self.peer, self.tag, self.group = op, array, peer, _tag(tag), group

    def __repr__(self) -> str:
        kind = "isend" if self._send else "irecv"
        return f"<tutti.P2POp {kind} peer={self.peer} tag={self.tag}>"


def _buf(a: Any, writable: bool, what: str) -> tuple:
    return _native.buffer(a, writable, what)


def _same_dtype(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{what} has dtype {b.dtype} but the input has {a.dtype}; they must match")


class Communicator(_training.TrainingOps):
    """A group of ranks running collectives together, on numpy arrays.

    Create one per process with :meth:`from_env` (under ``tutti run``, torchrun, Slurm
    or mpirun), :meth:`init_rank` (with a :class:`UniqueId`), or
    :func:`tutti.init_process_group`; or one per thread with :meth:`init_all`. Every rank
    must call the same collectives in the same order.

    Arrays must be C-contiguous numpy arrays of a native-endian type; they are used in
    place, never copied (except the one copy :meth:`reduce` makes for an in-place result
    on the root). Outputs must be writable. Reductions accept float16/32/64,
    int8/32/64, uint8/32/64 and bool (max/min; sum and prod mean or and and); the
    other collectives move any fixed-size type. Blocking calls release the GIL;
    ``async_op=True`` returns a :class:`Work`. ``timeout`` (seconds) overrides the
    communicator's deadline for one call.
    """

    __slots__ = ("_c", "_call", "_n", "_r", "__weakref__")

    def __init__(self, native: Any):
        self._c = native
        self._call = native._call
        self._n = native.size
        self._r = native.rank
        _live.add(self)

    # ---- creation -----------------------------------------------------------------------

    @classmethod
    def from_env(cls, timeout: Optional[float] = None) -> "Communicator":
        """Joins the job described by the environment: ``TUTTI_RANK``/``TUTTI_WORLD_SIZE``/
        ``TUTTI_MASTER_ADDR``/``TUTTI_MASTER_PORT`` (as set by ``tutti run``), torchrun's
        ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, Slurm or Open MPI.
        Under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the ranks meet through the
        agent's store on ``MASTER_PORT``, as torch's own ranks do.
        ``timeout`` is the default deadline of each op, in seconds."""
        return cls(_native.Communicator.from_env(timeout))

    @classmethod
    def init_rank(cls, unique_id: Union[UniqueId, str], world_size: int, rank: int,
                  timeout: Optional[float] = None) -> "Communicator":
        """Joins the job named by ``unique_id`` (a :class:`UniqueId` or its string) as
        ``rank`` of ``world_size``, like ``ncclCommInitRank``. Rank 0 must run in the
        process that created the id with ``UniqueId.new()``."""
        return cls(_native.Communicator.init_rank(unique_id, world_size, rank, timeout))

    @classmethod
    def init_all(cls, n: int, timeout: Optional[float] = None) -> list:
        """``n`` communicators for ``n`` threads of this process (element r is rank r),
        like ``ncclCommInitAll``; each thread uses its own."""
        return [cls(c) for c in _native.Communicator.init_all(n, timeout)]

    def new_group(self, ranks: Sequence[int]) -> Optional["Communicator"]:
        """A communicator of ``ranks`` (ranks of this one; sorted, as torch does).

        Collective: every rank of this communicator calls it with the same list. Ranks
        not in the list get None."""
        rs = sorted(int(r) for r in ranks)
        sub = self._c.new_group(rs)
        return None if sub is None else Communicator(sub)

    def split(self, color: Optional[int], key: Optional[int] = None) -> Optional["Communicator"]:
        """Like ``MPI_Comm_split``: ranks passing the same ``color`` form a communicator,
        ordered by ``key`` (default: this rank); ``color=None`` gets None. Collective."""
        sub = self._c.split(color, self._r if key is None else key)
        return None if sub is None else Communicator(sub)

    def destroy(self) -> None:
        """Finishes queued ops, then releases threads, sockets and shared memory. Later
        calls raise. Idempotent; also done at interpreter exit."""
        self._c.destroy()

    def abort(self) -> None:
        """Makes every waiting and later op fail with :class:`tutti.AbortedError`, at
        once. Callable from any thread (e.g. a watchdog)."""
        self._c.abort()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # ---- facts --------------------------------------------------------------------------

    def rank(self) -> int:
        """This rank, in ``0..world_size()``."""
        return self._r

    def world_size(self) -> int:
        """Number of ranks."""
        return self._n

    size = world_size

    def local_rank(self) -> int:
        """This rank's index among the ranks on its host."""
        return self._c.local_rank

    def local_size(self) -> int:
        """Number of ranks on this rank's host."""
        return self._c.local_size

    @property
    def native(self) -> Any:
        """The compiled communicator (``tutti._native.Communicator``)."""
        return self._c

    def __repr__(self) -> str:
        return f"<tutti.Communicator rank {self._r} of {self._n}>"

    # ---- plumbing -----------------------------------------------------------------------

    def _run(self, kind: int, arg: int, code: int, op: int, count: int, sp: int, sl: int, rp: int, rl: int,
             keep: Any, result: Any, async_op: bool, timeout: Optional[float], vcounts: Any = None,
             wire: Optional[str] = None) -> Any:
        w = _training.wire_name(wire)
        if async_op:
            return Work(self._call(kind, arg, code, op, count, sp, sl, rp, rl, timeout, True, keep, None, vcounts,
                                   w), result)
        self._call(kind, arg, code, op, count, sp, sl, rp, rl, timeout, False, None, None, vcounts, w)
        return result

    def _check_rank(self, r: int, what: str) -> int:
        r = int(r)
        if not 0 <= r < self._n:
            raise ValueError(f"{what}={r} is out of range: this communicator has ranks 0..{self._n - 1}")
        return r

    # ---- collectives --------------------------------------------------------------------

    def all_reduce(self, array: np.ndarray, op: ReduceOpLike = ReduceOp.SUM, *, out: Optional[np.ndarray] = None,
                   async_op: bool = False, timeout: Optional[float] = None, wire: Optional[str] = None) -> Any:
        """Reduces ``array`` across ranks; every rank gets the result, in ``array`` itself
        (default) or in ``out`` (same size and dtype). Returns the result array, or a
        :class:`Work` with ``async_op=True``. ``wire="bf16"`` or ``"f16"``: float32 data
        with SUM or AVG travels as 16-bit values and is added in float32 at every hop
        (docs/training.md)."""
        opc = _op_code(op)
        sp, sl, code, item = _buf(array, out is None, "array")
        code, opc = _reducible(code, opc, array.dtype, "all_reduce")
        if out is None:
            rp, rl, result = sp, sl, array
        else:
            _same_dtype(array, out, "out")
            rp, rl, _, _ = _buf(out, True, "out")
            result = out
        return self._run(C.ALL_REDUCE, 0, code, opc, sl // item if item else 0, sp, sl, rp, rl,
                         (array, out), result, async_op, timeout, wire=wire)

    def broadcast(self, array: np.ndarray, src: int = 0, *, async_op: bool = False,
                  timeout: Optional[float] = None) -> Any:
        """Copies rank ``src``'s ``array`` into every rank's ``array`` (same size and dtype
        on every rank). Returns ``array`` (or a :class:`Work`)."""
        src = self._check_rank(src, "src")
        p, n, code, item = _buf(array, self._r != src, "array")
        code, item = _moved(code, n, item)
        return self._run(C.BROADCAST, src, code, C.OP_SUM, n // item, p, n, p, n, array, array, async_op, timeout)

    def reduce(self, array: np.ndarray, dst: int = 0, op: ReduceOpLike = ReduceOp.SUM, *,
               out: Optional[np.ndarray] = None, async_op: bool = False, timeout: Optional[float] = None,
               wire: Optional[str] = None) -> Any:
        """Reduces ``array`` across ranks onto rank ``dst``: the result lands in ``out`` if
        given, else in ``array`` itself (then the root copies its input once). Returns the
        result on ``dst`` and None elsewhere (or a :class:`Work`). ``wire``: as for
        :meth:`all_reduce`."""
        dst = self._check_rank(dst, "dst")
        opc = _op_code(op)
        root = self._r == dst
        sp, sl, code, item = _buf(array, root and out is None, "array")
        code, opc = _reducible(code, opc, array.dtype, "reduce")
        send = array
        if not root:
            rp, rl, result = 0, 0, None
        elif out is None:
            send = array.copy()
            sp = _buf(send, False, "array")[0]
            rp, rl, result = _buf(array, True, "array")[0], sl, array
        else:
            _same_dtype(array, out, "out")
            rp, rl, _, _ = _buf(out, True, "out")
            result = out
        return self._run(C.REDUCE, dst, code, opc, sl // item, sp, sl, rp, rl, (send, array, out), result,
                         async_op, timeout, wire=wire)

    def all_gather(self, array: np.ndarray, *, out: Optional[np.ndarray] = None, async_op: bool = False,
                   timeout: Optional[float] = None) -> Any:
        """Gathers every rank's ``array`` (same size everywhere) on every rank, in rank
        order. ``out`` holds ``world_size() * array.size`` elements; by default a new array
        of shape ``(world_size(), *array.shape)``. Returns ``out`` (or a :class:`Work`)."""
        sp, sl, code, item = _buf(array, False, "array")
        if out is None:
            out = np.empty((self._n,) + array.shape, dtype=array.dtype)
        else:
            _same_dtype(array, out, "out")
        rp, rl, _, _ = _buf(out, True, "out")
        code, item = _moved(code, sl, item)
        return self._run(C.ALL_GATHER, 0, code, C.OP_SUM, sl // item, sp, sl, rp, rl, (array, out), out,
                         async_op, timeout)

    def _split_shape(self, a: np.ndarray, what: str) -> tuple:
        n = self._n
        if a.size % n:
            raise ValueError(f"{what}: the input has {a.size} elements, not a multiple of the {n} ranks")
        if a.ndim >= 1 and a.shape[0] == n:
            return a.shape[1:]
        if a.ndim >= 1 and a.shape[0] % n == 0:
            return (a.shape[0] // n,) + a.shape[1:]
        return (a.size // n,)

    def reduce_scatter(self, array: np.ndarray, op: ReduceOpLike = ReduceOp.SUM, *,
                       out: Optional[np.ndarray] = None, async_op: bool = False,
                       timeout: Optional[float] = None, wire: Optional[str] = None) -> Any:
        """Reduces ``array`` (``world_size()`` equal blocks) across ranks; rank r gets
        block r of the result in ``out`` (by default a new array: ``array.shape[1:]`` if
        the first dimension is the rank count, else the first dimension divided by it).
        Returns ``out`` (or a :class:`Work`). ``wire``: as for :meth:`all_reduce`."""
        opc = _op_code(op)
        sp, sl, code, item = _buf(array, False, "array")
        code, opc = _reducible(code, opc, array.dtype, "reduce_scatter")
        if out is None:
            out = np.empty(self._split_shape(array, "reduce_scatter"), dtype=array.dtype)
        else:
            _same_dtype(array, out, "out")
        rp, rl, _, _ = _buf(out, True, "out")
        return self._run(C.REDUCE_SCATTER, 0, code, opc, rl // item, sp, sl, rp, rl, (array, out), out,
                         async_op, timeout, wire=wire)

    def all_to_all(self, array: np.ndarray, *, out: Optional[np.ndarray] = None, async_op: bool = False,
                   timeout: Optional[float] = None) -> Any:
        """Block p of ``array`` (``world_size()`` equal blocks) goes to rank p, where it
        becomes block r (this rank) of ``out`` (by default a new array shaped like
        ``array``). Returns ``out`` (or a :class:`Work`)."""
        sp, sl, code, item = _buf(array, False, "array")
        if array.size % self._n:
            raise ValueError(f"all_to_all: the input has {array.size} elements, not a multiple of the {self._n} ranks")
        if out is None:
            out = np.empty_like(array)
        else:
            _same_dtype(array, out, "out")
        rp, rl, _, _ = _buf(out, True, "out")
        code, item = _moved(code, sl, item)
        return self._run(C.ALL_TO_ALL, 0, code, C.OP_SUM, sl // item // self._n, sp, sl, rp, rl, (array, out), out,
                         async_op, timeout)

    def all_to_all_v(self, array: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *,
                     out: Optional[np.ndarray] = None, send_displs: Optional[Sequence[int]] = None,
                     recv_displs: Optional[Sequence[int]] = None, async_op: bool = False,
                     timeout: Optional[float] = None) -> Any:
        """All-to-all with per-rank counts (in elements of the flattened arrays): this rank
        sends ``array.flat[send_displs[p]:][:send_counts[p]]`` to rank p and receives rank
        p's block at ``out.flat[recv_displs[p]:]``. Displacements default to the running
        sums of the counts; ``out`` defaults to a new 1-D array of ``sum(recv_counts)``."""
        n = self._n
        sc, rc = [int(x) for x in send_counts], [int(x) for x in recv_counts]
        if len(sc) != n or len(rc) != n:
            raise ValueError(f"all_to_all_v: send_counts and recv_counts need one entry per rank ({n})")

        def prefix(xs: list) -> list:
            acc, out_ = 0, []
            for x in xs:
                out_.append(acc)
                acc += x
            return out_

        sd = prefix(sc) if send_displs is None else [int(x) for x in send_displs]
        rd = prefix(rc) if recv_displs is None else [int(x) for x in recv_displs]
        sp, sl, code, item = _buf(array, False, "array")
        if out is None:
            out = np.empty(max((c + d for c, d in zip(rc, rd)), default=0), dtype=array.dtype)
        else:
            _same_dtype(array, out, "out")
        rp, rl, _, _ = _buf(out, True, "out")
        if code < 0 or code == C.BOOL:
            code, k = C.U8, item  # bytes: scale the counts
            sc, sd, rc, rd = ([x * k for x in xs] for xs in (sc, sd, rc, rd))
        return self._run(C.ALL_TO_ALL_V, 0, code, C.OP_SUM, 0, sp, sl, rp, rl, (array, out), out, async_op,
                         timeout, (sc, sd, rc, rd))

    def gather(self, array: np.ndarray, dst: int = 0, *, out: Optional[np.ndarray] = None, async_op: bool = False,
               timeout: Optional[float] = None) -> Any:
        """Gathers every rank's ``array`` onto rank ``dst``, in rank order: ``out`` (only
        on ``dst``; by default a new array of shape ``(world_size(), *array.shape)``).
        Returns ``out`` on ``dst`` and None elsewhere (or a :class:`Work`)."""
        dst = self._check_rank(dst, "dst")
        sp, sl, code, item = _buf(array, False, "array")
        rp = rl = 0
        if self._r == dst:
            if out is None:
                out = np.empty((self._n,) + array.shape, dtype=array.dtype)
            else:
                _same_dtype(array, out, "out")
            rp, rl, _, _ = _buf(out, True, "out")
        else:
            out = None
        code, item = _moved(code, sl, item)
        return self._run(C.GATHER, dst, code, C.OP_SUM, sl // item, sp, sl, rp, rl, (array, out), out,
                         async_op, timeout)

    def scatter(self, out: np.ndarray, array: Optional[np.ndarray] = None, src: int = 0, *, async_op: bool = False,
                timeout: Optional[float] = None) -> Any:
        """Block p of rank ``src``'s ``array`` (``world_size()`` blocks the size of ``out``;
        ignored on other ranks) lands in rank p's ``out``. Returns ``out`` (or a
        :class:`Work`)."""
        src = self._check_rank(src, "src")
        rp, rl, code, item = _buf(out, True, "out")
        sp = sl = 0
        if self._r == src:
            if array is None:
                raise ValueError("scatter: the source rank must pass the array to scatter")
            _same_dtype(out, array, "array")
            sp, sl, _, _ = _buf(array, False, "array")
        else:
            array = None
        code, item = _moved(code, rl, item)
        return self._run(C.SCATTER, src, code, C.OP_SUM, rl // item, sp, sl, rp, rl, (array, out), out,
                         async_op, timeout)

    # ---- point to point ----------------------------------------------------------------

    def _p2p_op(self, send: bool, array: np.ndarray, peer: Optional[int], tag: int, what: str) -> tuple:
        """The native op tuple (is_send, peer or -1, address, bytes, tag, exact)."""
        if peer is None:
            if send:
                raise ValueError(f"{what}: a send needs a destination rank")
            p = -1
        else:
            p = self._check_rank(peer, "dst" if send else "src")
        addr, nbytes, _, _ = _buf(array, not send, "array")
        return (send, p, addr, nbytes, _tag(tag), True)

    def send(self, array: np.ndarray, dst: int, *, tag: int = 0, async_op: bool = False,
             timeout: Optional[float] = None) -> Any:
        """Sends ``array`` to rank ``dst`` with ``tag``. Rank ``dst`` receives it with
        :meth:`recv` (or :meth:`irecv`, :meth:`batch_isend_irecv`) into an array of the
        same size in bytes, from this rank (or any source) and with the same tag.

        Sends and receives match per (peer, tag) in the order they were issued, like MPI;
        messages of different tags or from different ranks do not wait for each other, nor
        for the collectives. Blocking: returns None once the message is delivered, or, for
        a message of at most 128 KiB (eager), once it has left (a blocking send to this
        rank itself is an error: nothing could receive it). A receive of another size
        raises :class:`tutti.SizeMismatchError` at the receiver, and at the sender too for
        a message over 128 KiB; the communicator stays usable."""
        op = self._p2p_op(True, array, dst, tag, "send")
        if async_op:
            return Work(self._c._p2p([op], timeout, True, array)[0], None)
        if op[1] == self._r:
            raise InvalidArgumentError(f"send: peer {op[1]} is this rank; a blocking send to oneself cannot be "
                                       f"received (use isend and irecv, or batch_isend_irecv)")
        self._c._p2p([op], timeout)
        return None

    def recv(self, array: np.ndarray, src: Optional[int] = None, *, tag: int = 0, async_op: bool = False,
             timeout: Optional[float] = None) -> Any:
        """Receives into ``array`` the next message with ``tag`` from rank ``src``, or
        from whichever rank's message comes first if ``src`` is None. The message must
        fill ``array`` exactly (same size in bytes); otherwise the receive raises
        :class:`tutti.SizeMismatchError` (and the send too, for a message over 128 KiB),
        nothing is written, and the communicator stays usable.

        Returns the rank that sent the message (as ``torch.distributed.recv`` does), or a
        :class:`Work` with ``async_op=True`` whose ``wait()`` returns ``array`` and whose
        :attr:`Work.source` then tells the sender."""
        op = self._p2p_op(False, array, src, tag, "recv")
        if async_op:
            return Work(self._c._p2p([op], timeout, True, array)[0], array)
        if op[1] == self._r:
            raise InvalidArgumentError(f"recv: peer {op[1]} is this rank; a blocking receive from oneself cannot "
                                       f"complete (use isend and irecv, or batch_isend_irecv)")
        (st,) = self._c._p2p([op], timeout)
        return st[0]

    def isend(self, array: np.ndarray, dst: int, *, tag: int = 0, timeout: Optional[float] = None) -> Work:
        """``send(array, dst, tag=tag, async_op=True)``: returns a :class:`Work` at once."""
        return self.send(array, dst, tag=tag, async_op=True, timeout=timeout)

    def irecv(self, array: np.ndarray, src: Optional[int] = None, *, tag: int = 0,
              timeout: Optional[float] = None) -> Work:
        """``recv(array, src, tag=tag, async_op=True)``: returns a :class:`Work` at once;
        ``wait()`` returns ``array``, and :attr:`Work.source` the sender's rank."""
        return self.recv(array, src, tag=tag, async_op=True, timeout=timeout)

    def batch_isend_irecv(self, ops: Sequence[P2POp], *, timeout: Optional[float] = None) -> list:
        """Posts a batch of sends and receives (:class:`P2POp`) at once, like
        ``torch.distributed.batch_isend_irecv`` or NCCL's group calls, and returns one
        :class:`Work` per op, in order. No order of the ops in a batch can deadlock (a
        ring shift of large arrays where every rank sends first is fine): all of them
        progress at once. Ops between the same two ranks with the same tag still match in
        the order they were issued. A receive's buffer must not overlap another op's."""
        ops = list(ops)
        if not ops:
            return []
        native = []
        for o in ops:
            if not isinstance(o, P2POp):
                raise TypeError(f"batch_isend_irecv: expected tutti.P2POp, got {type(o).__name__}")
            if o.group is not None and o.group is not self:
                raise ValueError("batch_isend_irecv: every op of a batch must be on this communicator")
            native.append(self._p2p_op(o._send, o.array, o.peer, o.tag, "batch_isend_irecv"))
        _check_overlap(native)
        arrays = tuple(o.array for o in ops)
        ws = self._c._p2p(native, timeout, True, arrays)
        return [Work(w, None if o._send else o.array) for w, o in zip(ws, ops)]

    def barrier(self, *, async_op: bool = False, timeout: Optional[float] = None) -> Any:
        """Returns once every rank has entered the barrier (or a :class:`Work`)."""
        return self._run(C.BARRIER, 0, C.U8, C.OP_SUM, 0, 0, 0, 0, 0, None, None, async_op, timeout)


def _check_overlap(ops: list) -> None:
    """Raises ValueError if a receive buffer of the batch overlaps another op's buffer."""
    recvs = [(a, a + n) for (send, _, a, n, _, _) in ops if not send and n]
    if not recvs:
        return
    spans = sorted((a, a + n, send) for (send, _, a, n, _, _) in ops if n)
    for i, (a, b, send) in enumerate(spans):
        for c, d, send2 in spans[i + 1:]:
            if c >= b:
                break
            if not (send and send2):
                raise ValueError("batch_isend_irecv: a receive buffer overlaps another op's buffer")

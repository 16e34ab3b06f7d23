"""The operations of the torch backend (tutti.torch), shared by its two routes.

:class:`TorchOps` holds every collective and point-to-point op on CPU tensors, written
once for both :class:`tutti.torch.ProcessGroupTutti` (a whole Python ``ProcessGroup``,
whose methods torch calls directly) and :class:`tutti._torch_backend.TuttiBackend` (a
c10d ``Backend`` for one device type, which torch reaches through its C++ dispatcher).
A class mixing it in sets ``_rank``, ``_size``, ``_comm`` and ``_call``
(``_comm._call``) in its constructor.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List, Optional

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from . import _codes as C
from . import _native, _net
from ._comm import _tag
from ._torch_util import (
    _DONE,
    _DT,
    _OPS,
    TuttiWork,
    _concat,
    _disjoint,
    _DoneWork,
    _dst,
    _gather_buffer,
    _key,
    _moved,
    _prefix,
    _reduce_codes,
    _seconds,
    _src,
    name_the_rank,
    ranked,
)
from ._torch_sparse import sparse_allreduce
from ._torch_uneven import reduce_scatter_uneven


_UID_KEY = "tutti/unique_id"

# Every group's ops object (either route), for the communicators' release at exit.
groups: "weakref.WeakSet[Any]" = weakref.WeakSet()


def join(store: Any, rank: int, size: int, timeout: Optional[float]) -> Any:
    """A tutti communicator for a torch group, met through torch's `store`: rank 0
    listens on its address on the route to the others and publishes a
    :class:`tutti.UniqueId` there; the others read it."""
    addr = _net.address_for_group(store, rank, size)
    if rank == 0:
        uid = _native.UniqueId.new(addr)
        store.set(_UID_KEY, str(uid))
    else:
        uid = store.get(_UID_KEY).decode()
    return _native.Communicator.init_rank(uid, size, rank, timeout)


def _async_op(opts: Any) -> bool:
    """Whether the caller wants a Work back: ``opts.asyncOp``. Option structs
    of older torch releases lack it, and those always take a Work back."""
    return bool(getattr(opts, "asyncOp", True))


@name_the_rank("allreduce", "broadcast", "all_gather_single", "_allgather_base", "reduce_scatter_single",
               "_reduce_scatter_base", "send", "recv", "recv_anysource")
class TorchOps:
    """The ops of the torch backend on a tutti communicator (a mixin; see the module doc)."""

    _rank: int
    _size: int
    _comm: Any
    _call: Any
    _window: Any = None  # an open coalescing window (tutti._torch_window.Window)
    p2p_posts = 0  # how many batches of sends and receives were posted (one per Communicator._p2p call)

    @property
    def comm(self) -> Any:
        """The tutti communicator (``tutti._native.Communicator``) behind this group."""
        return self._comm

    def set_timeout(self, timeout: Any) -> None:
        """``dist.set_timeout``: the deadline of this group's later ops (a timedelta)."""
        self._comm.timeout = _seconds(timeout)

    # ---- plumbing ----
    def _submit(self, calls: list, keep: Any, post: list, outputs: Any, async_op: bool,
                timeout: Optional[float] = None) -> Any:
        """Runs `calls` (tuples of _call's first nine arguments plus vcounts) in order;
        `timeout` (seconds) replaces the group's for these calls."""
        call = self._call
        if not async_op:
            for c in calls:
                call(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], timeout, False, None, None, c[9])
            for p in post:
                p()
            return _DONE
        fut = torch.futures.Future()

        done = _finisher(fut, post, outputs)

        if not calls:  # nothing to do (an empty list of tensors)
            done(None)
            return _DoneWork(outputs)
        one = _all_of(len(calls), done)
        ws = [call(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], timeout, True, (keep, outputs), one, c[9])
              for c in calls]
        work = TuttiWork(ws, fut, outputs)
        if self._window is not None:
            self._window.works.append(work)
        return work

    def _p2p(self, ops: list, keep: Any, post: list, outputs: Any) -> Any:
        """Posts sends and receives (tuples for ``_native.Communicator._p2p``) at once,
        asynchronously; their Work completes once all of them did. Inside a coalescing
        window (tutti._torch_window) they are held, and posted with the window's others
        when it ends."""
        win = self._window
        if win is not None:
            return win.hold(ops, keep, post, outputs)
        return self._post_p2p(ops, keep, post, outputs)

    def _post_p2p(self, ops: list, keep: Any, post: list, outputs: Any) -> Any:
        self.p2p_posts += 1
        fut = torch.futures.Future()

        done = _finisher(fut, post, outputs)

        if not ops:
            done(None)
            return _DoneWork(outputs)
        ws = self._comm._p2p(ops, None, True, (keep, outputs), _all_of(len(ops), done))
        return TuttiWork(ws, fut, outputs)

    def _peer(self, r: int, what: str) -> int:
        r = int(r)
        if not 0 <= r < self._size:
            raise ValueError(f"tutti {what}: rank {r} is out of range for a group of {self._size} ranks")
        return r

    def _async1(self, kind: int, arg: int, code: int, op: int, count: int, sp: int, sl: int, rp: int, rl: int,
                outputs: Any) -> TuttiWork:
        fut = torch.futures.Future()

        def done(err: Optional[BaseException]) -> None:
            if err is None:
                fut.set_result(outputs)
            else:
                fut.set_exception(err)

        w = self._call(kind, arg, code, op, count, sp, sl, rp, rl, None, True, outputs, done)
        work = TuttiWork(w, fut, outputs)
        if self._window is not None:
            self._window.works.append(work)
        return work

    # ---- all_reduce ----
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        try:
            if opts is None:
                opts = AllreduceOptions()
            elif not isinstance(opts, AllreduceOptions):  # pg.allreduce(tensors, ReduceOp)
                op, opts = opts, AllreduceOptions()
                opts.reduceOp = op
            if len(tensors) == 1:  # the fast path: one contiguous (so not sparse) CPU tensor of a native type
                t = tensors[0]
                if t.is_cpu and t.is_contiguous():
                    code = _DT.get(t.dtype)
                    opc = _OPS.get(_key(opts.reduceOp))
                    if code is not None and opc is not None and code != C.BOOL:
                        n = t.numel()
                        p = t.data_ptr()
                        nb = n * t.element_size()
                        if not _async_op(opts):
                            self._call(C.ALL_REDUCE, 0, code, opc, n, p, nb, p, nb)
                            return _DONE
                        return self._async1(C.ALL_REDUCE, 0, code, opc, n, p, nb, p, nb, tensors)
            if any(t.layout != torch.strided for t in tensors):
                return sparse_allreduce(self, tensors, opts.reduceOp)
            post: list = []
            calls = []
            bufs = []
            for t in tensors:
                code, opc = _reduce_codes(t, opts.reduceOp)
                b = _dst(t, post)
                bufs.append(b)
                nb = b.numel() * b.element_size()
                calls.append((C.ALL_REDUCE, 0, code, opc, b.numel(), b.data_ptr(), nb, b.data_ptr(), nb, None))
            return self._submit(calls, bufs, post, tensors, _async_op(opts))
        except (TypeError, ValueError) as e:
            raise ranked(e, "allreduce", self) from None

    # ---- broadcast ----
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        try:
            if opts is None:
                opts = BroadcastOptions()
            root = opts.rootRank
            post: list = []
            calls, bufs = [], []
            for t in tensors:
                code, item = _moved(t)
                b = _dst(t, post) if self._rank != root else _src(t)
                bufs.append(b)
                nb = b.numel() * b.element_size()
                calls.append((C.BROADCAST, root, code, C.OP_SUM, nb // item, b.data_ptr(), nb, b.data_ptr(), nb, None))
            return self._submit(calls, bufs, post, tensors, _async_op(opts))
        except (TypeError, ValueError) as e:
            raise ranked(e, "broadcast", self) from None

    # ---- reduce ----
    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        if opts is None:
            opts = ReduceOptions()
        root = opts.rootRank
        post: list = []
        calls, bufs = [], []
        for t in tensors:
            code, opc = _reduce_codes(t, opts.reduceOp)
            if self._rank == root:
                send = t.clone(memory_format=torch.contiguous_format)  # the core needs separate buffers
                recv = _dst(t, post, keep_data=False)
                rp, rl = recv.data_ptr(), recv.numel() * recv.element_size()
                bufs += [send, recv]
            else:
                send = _src(t)
                rp, rl = 0, 0
                bufs.append(send)
            sl = send.numel() * send.element_size()
            calls.append((C.REDUCE, root, code, opc, send.numel(), send.data_ptr(), sl, rp, rl, None))
        return self._submit(calls, bufs, post, tensors, _async_op(opts))

    # ---- all_gather ----
    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        if opts is None:
            opts = AllgatherOptions()
        post: list = []
        calls, bufs = [], []
        n = self._size
        for outs, inp in zip(output_lists, inputs):
            if len(outs) != n:
                raise ValueError(f"tutti all_gather: the output list has {len(outs)} tensors; it needs {n}")
            for o in outs:
                if o.dtype != inp.dtype:
                    raise TypeError(f"tutti all_gather: output dtype {o.dtype} differs from input dtype {inp.dtype}")
            src = _src(inp)
            dst = _gather_buffer(outs, post)
            bufs += [src, dst]
            code, item = _moved(inp)
            sl = src.numel() * src.element_size()
            rl = dst.numel() * dst.element_size()
            esz = inp.element_size()
            counts = [o.numel() for o in outs]
            if all(c == inp.numel() for c in counts):
                calls.append((C.ALL_GATHER, 0, code, C.OP_SUM, sl // item, src.data_ptr(), sl, dst.data_ptr(), rl, None))
            else:  # uneven sizes: an all-to-all-v that sends the same block to everybody
                if counts[self._rank] != inp.numel():
                    raise ValueError(f"tutti all_gather: output {self._rank} has {counts[self._rank]} elements but "
                                     f"this rank's input has {inp.numel()}")
                k = esz // item
                rc = [c * k for c in counts]
                vc = ([inp.numel() * k] * n, [0] * n, rc, _prefix(rc))
                calls.append((C.ALL_TO_ALL_V, 0, code, C.OP_SUM, 0, src.data_ptr(), sl, dst.data_ptr(), rl, vc))
        return self._submit(calls, bufs, post, output_lists, _async_op(opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        try:
            if opts is None:
                opts = AllgatherOptions()
            if output.dtype != input.dtype:
                raise TypeError(f"tutti all_gather_into_tensor: output dtype {output.dtype} differs from input {input.dtype}")
            post: list = []
            src = _src(input)
            dst = _dst(output, post, keep_data=False)
            code, item = _moved(input)
            sl = src.numel() * src.element_size()
            rl = dst.numel() * dst.element_size()
            call = (C.ALL_GATHER, 0, code, C.OP_SUM, sl // item, src.data_ptr(), sl, dst.data_ptr(), rl, None)
            return self._submit([call], (src, dst), post, [output], _async_op(opts))
        except (TypeError, ValueError) as e:
            raise ranked(e, "all_gather_single", self) from None

    _allgather_base = all_gather_single

    # ---- reduce_scatter ----
    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        if opts is None:
            opts = ReduceScatterOptions()
        n = self._size
        post: list = []
        calls, bufs = [], []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != n:
                raise ValueError(f"tutti reduce_scatter: the input list has {len(ins)} tensors; it needs {n}")
            code, opc = _reduce_codes(out, opts.reduceOp)
            src = _concat(ins)
            counts = [t.numel() for t in ins]
            if all(c == out.numel() for c in counts):
                dst = _dst(out, post, keep_data=False)
                src = _disjoint(src, dst)
                bufs += [src, dst]
                sl = src.numel() * src.element_size()
                rl = dst.numel() * dst.element_size()
                calls.append((C.REDUCE_SCATTER, 0, code, opc, dst.numel(), src.data_ptr(), sl, dst.data_ptr(), rl,
                              None))
            else:  # uneven blocks: an all-to-all-v and a local reduction (tutti._torch_uneven)
                reduce_scatter_uneven(self._rank, n, out, ins, src, code, opc, calls, bufs, post)
        return self._submit(calls, bufs, post, outputs, _async_op(opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        try:
            if opts is None:
                opts = ReduceScatterOptions()
            if output.dtype != input.dtype:
                raise TypeError(f"tutti reduce_scatter_tensor: output dtype {output.dtype} differs from input {input.dtype}")
            code, opc = _reduce_codes(input, opts.reduceOp)
            post: list = []
            src = _src(input)
            dst = _dst(output, post, keep_data=False)
            src = _disjoint(src, dst)
            sl = src.numel() * src.element_size()
            rl = dst.numel() * dst.element_size()
            call = (C.REDUCE_SCATTER, 0, code, opc, dst.numel(), src.data_ptr(), sl, dst.data_ptr(), rl, None)
            return self._submit([call], (src, dst), post, [output], _async_op(opts))
        except (TypeError, ValueError) as e:
            raise ranked(e, "reduce_scatter_single", self) from None

    _reduce_scatter_base = reduce_scatter_single

    # ---- all_to_all ----
    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        if opts is None:
            opts = AllToAllOptions()
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"tutti all_to_all: the input and output lists need {n} tensors each")
        dt = input_tensors[0].dtype
        if any(t.dtype != dt for t in list(output_tensors) + list(input_tensors)):
            raise TypeError("tutti all_to_all: every input and output tensor must have the same dtype")
        post: list = []
        src = _concat(input_tensors)
        dst = _gather_buffer(output_tensors, post)
        src = _disjoint(src, dst)
        code, item = _moved(src)
        k = src.element_size() // item
        sc = [t.numel() * k for t in input_tensors]
        rc = [t.numel() * k for t in output_tensors]
        sl = src.numel() * src.element_size()
        rl = dst.numel() * dst.element_size()
        if len(set(sc + rc)) == 1:
            call = (C.ALL_TO_ALL, 0, code, C.OP_SUM, sc[0], src.data_ptr(), sl, dst.data_ptr(), rl, None)
        else:
            call = (C.ALL_TO_ALL_V, 0, code, C.OP_SUM, 0, src.data_ptr(), sl, dst.data_ptr(), rl,
                    (sc, _prefix(sc), rc, _prefix(rc)))
        return self._submit([call], (src, dst), post, output_tensors, _async_op(opts))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                      input_split_sizes: List[int], opts: Any = None) -> Any:
        if opts is None:
            opts = AllToAllOptions()
        n = self._size
        if output.dtype != input.dtype:
            raise TypeError(f"tutti all_to_all_single: output dtype {output.dtype} differs from input {input.dtype}")
        post: list = []
        src = _src(input)
        dst = _dst(output, post, keep_data=False)
        src = _disjoint(src, dst)
        code, item = _moved(src)
        k = src.element_size() // item
        sl = src.numel() * src.element_size()
        rl = dst.numel() * dst.element_size()
        if not output_split_sizes and not input_split_sizes:
            if src.numel() % n:
                raise ValueError(f"tutti all_to_all_single: the input has {src.numel()} elements, not a multiple of {n}")
            call = (C.ALL_TO_ALL, 0, code, C.OP_SUM, src.numel() // n * k, src.data_ptr(), sl, dst.data_ptr(), rl,
                    None)
        else:
            def counts(t: torch.Tensor, splits: List[int]) -> List[int]:
                rows = t.shape[0] if t.dim() else 1
                row = (t.numel() // rows if rows else 0) * k
                if not splits:
                    if rows % n:
                        raise ValueError(f"tutti all_to_all_single: dim 0 ({rows}) is not a multiple of {n}")
                    return [rows // n * row] * n
                if len(splits) != n:
                    raise ValueError(f"tutti all_to_all_single: split sizes need {n} entries, got {len(splits)}")
                return [int(s) * row for s in splits]

            sc, rc = counts(src, input_split_sizes), counts(dst, output_split_sizes)
            call = (C.ALL_TO_ALL_V, 0, code, C.OP_SUM, 0, src.data_ptr(), sl, dst.data_ptr(), rl,
                    (sc, _prefix(sc), rc, _prefix(rc)))
        return self._submit([call], (src, dst), post, [output], _async_op(opts))

    all_to_all_single = alltoall_base

    # ---- gather / scatter ----
    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        if opts is None:
            opts = GatherOptions()
        root = opts.rootRank
        n = self._size
        post: list = []
        calls, bufs = [], []
        for i, inp in enumerate(inputs):
            src = _src(inp)
            code, item = _moved(src)
            sl = src.numel() * src.element_size()
            rp = rl = 0
            bufs.append(src)
            if self._rank == root:
                outs = output_lists[i] if i < len(output_lists) else []
                if len(outs) != n:
                    raise ValueError(f"tutti gather: the root's output list has {len(outs)} tensors; it needs {n}")
                if any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
                    raise ValueError("tutti gather: every output tensor must match the input in size and dtype")
                dst = _gather_buffer(outs, post)
                bufs.append(dst)
                rp, rl = dst.data_ptr(), dst.numel() * dst.element_size()
            calls.append((C.GATHER, root, code, C.OP_SUM, sl // item, src.data_ptr(), sl, rp, rl, None))
        return self._submit(calls, bufs, post, output_lists, _async_op(opts))

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        if opts is None:
            opts = GatherOptions()
        root = opts.rootRank
        post: list = []
        src = _src(input)
        code, item = _moved(src)
        sl = src.numel() * src.element_size()
        rp = rl = 0
        bufs = [src]
        if self._rank == root:
            dst = _dst(output, post, keep_data=False)
            bufs.append(dst)
            rp, rl = dst.data_ptr(), dst.numel() * dst.element_size()
        call = (C.GATHER, root, code, C.OP_SUM, sl // item, src.data_ptr(), sl, rp, rl, None)
        return self._submit([call], bufs, post, [output], _async_op(opts))

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> Any:
        if opts is None:
            opts = ScatterOptions()
        root = opts.rootRank
        n = self._size
        post: list = []
        calls, bufs = [], []
        for i, out in enumerate(outputs):
            dst = _dst(out, post, keep_data=False)
            code, item = _moved(dst)
            rl = dst.numel() * dst.element_size()
            sp = sl = 0
            bufs.append(dst)
            if self._rank == root:
                ins = input_lists[i] if i < len(input_lists) else []
                if len(ins) != n:
                    raise ValueError(f"tutti scatter: the root's input list has {len(ins)} tensors; it needs {n}")
                if any(t.numel() != out.numel() or t.dtype != out.dtype for t in ins):
                    raise ValueError("tutti scatter: every input tensor must match the output in size and dtype")
                src = _concat(ins)
                bufs.append(src)
                sp, sl = src.data_ptr(), src.numel() * src.element_size()
            calls.append((C.SCATTER, root, code, C.OP_SUM, rl // item, sp, sl, dst.data_ptr(), rl, None))
        return self._submit(calls, bufs, post, outputs, _async_op(opts))

    # ---- point to point ----
    # torch calls these for send/recv/isend/irecv and, one per op, for
    # batch_isend_irecv; each posts at once and returns a Work (dist.send and
    # dist.recv wait on it), so the ops of a batch all progress together.
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        try:
            dst, tag = self._peer(dst, "send"), _tag(tag)
            ops, bufs = [], []
            for t in tensors:
                src = _src(t)
                bufs.append(src)
                ops.append((True, dst, src.data_ptr(), src.numel() * src.element_size(), tag, True))
            return self._p2p(ops, bufs, [], tensors)
        except (TypeError, ValueError) as e:
            raise ranked(e, "send", self) from None

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        """A receive from whichever rank's message (with ``tag``) comes first; the Work's
        ``_source_rank()`` tells the sender once it completed (``dist.recv`` returns it)."""
        return self._recv(tensors, None, tag)

    def _recv(self, tensors: List[torch.Tensor], src: Optional[int], tag: int) -> Any:
        try:
            src = -1 if src is None else self._peer(src, "recv")  # -1: any source
            tag = _tag(tag)
            post: list = []
            ops, bufs = [], []
            for t in tensors:
                dst = _dst(t, post, keep_data=False)
                bufs.append(dst)
                ops.append((False, src, dst.data_ptr(), dst.numel() * dst.element_size(), tag, True))
            return self._p2p(ops, bufs, post, tensors)
        except (TypeError, ValueError) as e:
            raise ranked(e, "recv", self) from None

    # ---- barrier ----
    def barrier(self, opts: Any = None) -> Any:
        async_op = True if opts is None else _async_op(opts)
        timeout = None if opts is None else _seconds(getattr(opts, "timeout", None))
        return self._submit([(C.BARRIER, 0, C.U8, C.OP_SUM, 0, 0, 0, 0, 0, None)], None, [], [], async_op, timeout)

    # ---- sparse ----
    def allreduce_sparse(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """All-reduce of sparse COO tensors (SUM), where torch's dispatcher sends them
        (the c10d ``Backend`` route; the ``ProcessGroup`` route gets them in ``allreduce``)."""
        op = opts.reduceOp if opts is not None else AllreduceOptions().reduceOp
        return sparse_allreduce(self, tensors, op)


def _all_of(n: int, done: Callable[[Optional[BaseException]], None]) -> Callable[[Optional[BaseException]], None]:
    """A callback for `n` native ops: the last one to finish (in whatever order: an op
    that fails its argument check finishes at once) calls `done` with the first error."""
    lock = threading.Lock()
    state = {"left": n, "err": None}

    def one(err: Optional[BaseException]) -> None:
        with lock:
            if err is not None and state["err"] is None:
                state["err"] = err
            state["left"] -= 1
            finished = state["left"] == 0
        if finished:
            done(state["err"])

    return one


def _finisher(fut: Any, post: list, outputs: Any) -> Any:
    """The callback that completes ``fut`` once every call of an op has ended: with the
    first error, or after running ``post`` (copies out of staging buffers) with ``outputs``."""

    def done(err: Optional[BaseException]) -> None:
        if err is not None:
            fut.set_exception(err)
            return
        try:
            for p in post:
                p()
        except BaseException as e:  # noqa: BLE001 - handed to the future
            fut.set_exception(e)
            return
        fut.set_result(outputs)

    return done

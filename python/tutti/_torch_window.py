"""torch's coalescing window (``start_coalescing`` / ``end_coalescing``) for the torch
backend (tutti.torch), on both routes.

A backend whose ``supports_coalescing`` is True gets ``dist.batch_isend_irecv`` as a
window: torch calls ``start_coalescing``, then ``send``/``recv`` once per op, then
``end_coalescing``, and hands the caller only the ``Work`` that ``end_coalescing``
returns; ``dist._coalescing_manager(group, device)`` opens the same window around the
``*_coalesced`` call it makes for its batch. Here the sends and receives of a window are
held and posted at its end as one batch on the point-to-point channel (one
``Communicator._p2p`` call; every op is posted before any is waited for, so no order of
sends and receives deadlocks). Collectives issued inside the window run at once, as
outside it (a ``_coalescing_manager`` batch already reaches the backend as one fused
``*_coalesced`` call), and the window's ``Work`` completes once they and the batch have.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

from ._torch_util import TuttiWork, _DoneWork


class _HeldWork(dist._Work):
    """The Work of a send or receive issued inside a coalescing window: its op is posted
    when the window ends, and waiting for it before that raises (wait for the Work that
    ``end_coalescing`` returned, or for ``batch_isend_irecv``'s)."""

    def __init__(self, window: "Window", outputs: Any):
        super().__init__()
        self._window = window
        self._out = outputs
        self._ws: List[Any] = []  # this op's native works, once the window is posted

    def _posted(self) -> Any:
        w = self._window.work
        if w is None:
            raise RuntimeError("tutti: this send/recv is held in an open coalescing window and is posted when the "
                               "window ends; wait for the Work that end_coalescing (or batch_isend_irecv) returns")
        return w

    def wait(self, timeout: Any = None) -> bool:
        return self._posted().wait(timeout)

    def get_future(self) -> torch.futures.Future:
        return self._window.fut

    def is_completed(self) -> bool:
        return self._window.fut.done()

    def is_success(self) -> bool:
        return self._window.fut.done() and self._posted().is_success()

    def exception(self) -> Any:
        return None if self._window.work is None else self._window.work.exception()

    def result(self) -> Any:
        return self._out

    def synchronize(self) -> None:
        pass

    def _source_rank(self) -> int:
        self._posted()
        for w in self._ws:
            st = w.status()
            if st is not None:
                return st[0]
        raise RuntimeError("tutti: _source_rank() needs a receive that completed successfully (wait() first)")

    source_rank = _source_rank


class Window:
    """What a coalescing window holds until it ends."""

    def __init__(self) -> None:
        self.p2p: List[tuple] = []  # (ops, keep, post, outputs, held work)
        self.works: List[TuttiWork] = []  # asynchronous collectives issued in the window
        self.fut: torch.futures.Future = torch.futures.Future()  # completed with the window's Work
        self.work: Optional[Any] = None  # the window's Work, once it ended

    def hold(self, ops: list, keep: Any, post: list, outputs: Any) -> _HeldWork:
        held = _HeldWork(self, outputs)
        self.p2p.append((ops, keep, post, outputs, held))
        return held


class CoalescingWindow:
    """``start_coalescing`` / ``end_coalescing`` (a mixin of both routes; it uses
    :meth:`tutti._torch_ops.TorchOps._post_p2p`)."""

    _window: Optional[Window] = None

    def _post_p2p(self, ops: list, keep: Any, post: list, outputs: Any) -> TuttiWork:
        raise NotImplementedError

    @property
    def supports_coalescing(self) -> bool:
        """``batch_isend_irecv`` and ``_coalescing_manager(group, device)`` open a window:
        its sends and receives are posted at its end as one batch."""
        return True

    def start_coalescing(self, device: Any = None) -> None:
        """Opens a window (torch's ``_start_coalescing``): sends and receives are held."""
        if self._window is not None:
            raise RuntimeError("tutti: start_coalescing while a coalescing window is open on this group "
                               "(windows do not nest)")
        self._window = Window()

    def end_coalescing(self, device: Any = None) -> Any:
        """Closes the window: posts its sends and receives as one batch and returns one
        Work for everything issued in it."""
        win = self._window
        if win is None:
            raise RuntimeError("tutti: end_coalescing without start_coalescing")
        self._window = None
        natives: List[Any] = []
        futs: List[torch.futures.Future] = []
        outs: List[Any] = []
        if win.p2p:
            ops = [op for e in win.p2p for op in e[0]]
            posts = [p for e in win.p2p for p in e[2]]
            outs = [e[3] for e in win.p2p]
            batch = self._post_p2p(ops, [e[1] for e in win.p2p], posts, outs)
            at = 0
            for e in win.p2p:
                e[4]._ws = batch._ws[at:at + len(e[0])]
                at += len(e[0])
            natives += batch._ws
            futs.append(batch.get_future())
        for w in win.works:
            natives += w._ws
            futs.append(w.get_future())
        if not futs:
            work: Any = _DoneWork([])
            fut = work.get_future()
        else:
            fut = futs[0] if len(futs) == 1 else torch.futures.collect_all(futs).then(lambda _: outs)
            work = TuttiWork(natives, fut, outs)
        win.work = work

        def settle(f: torch.futures.Future) -> None:
            try:
                win.fut.set_result(f.value())
            except BaseException as e:  # noqa: BLE001 - handed to the held works' future
                win.fut.set_exception(e)

        fut.add_done_callback(settle)
        return work

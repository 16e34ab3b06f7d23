"""``dist.monitored_barrier`` for the torch backend (tutti.torch), as gloo does it.

Every rank but 0 sends a token to rank 0 and waits for its answer; rank 0 waits for
every token (all posted at once, each with the barrier's timeout) and answers each only
when all arrived. So rank 0 names the ranks that did not arrive in time (the first in
rank order, or all of them with ``wait_all_ranks=True``), and the others report that
rank 0 did not answer. The messages go on the point-to-point channel with a tag of
their own, so they never match a user's sends and receives; an unmatched one is
forgotten at its deadline and leaves the communicator usable.
"""

from __future__ import annotations

import datetime
from typing import Any, List

import torch

from ._errors import TimeoutError as TuttiTimeout
from ._errors import TuttiError

# The tag of the barrier's messages (tags are 32-bit; users rarely go this high).
MONITORED_BARRIER_TAG = 0xFFFF_FFF0


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _error(msg: str, rank: int, waiting_for: List[int], after: float) -> TuttiTimeout:
    e = TuttiTimeout(msg)
    e.op, e.seq, e.rank, e.waiting_for, e.after = "monitored_barrier", None, rank, waiting_for, after
    return e


def monitored_barrier(pg: Any, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """Runs the monitored barrier on group `pg` (a ProcessGroupTutti); raises a
    :class:`tutti.TimeoutError` naming the ranks that did not arrive within `timeout`."""
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif timeout is None:
        secs = pg.comm.timeout
    else:
        secs = float(timeout)
    rank, n = pg.rank(), pg.size()
    if n == 1:
        return
    if secs is not None and secs <= 0:
        raise _error(f"tutti: Rank {rank} timed out in monitoredBarrier after {_ms(secs)} ms", rank,
                     [r for r in range(n) if r != rank], secs)
    comm = pg.comm
    tag = MONITORED_BARRIER_TAG
    if rank != 0:
        token = torch.zeros(1, dtype=torch.uint8)
        try:
            for send in (True, False):
                (w,) = comm._p2p([(send, 0, token.data_ptr(), 1, tag, True)], secs, True, token, None)
                w.wait()
        except TuttiError as e:
            raise _error(f"tutti: Rank {rank} successfully reached monitoredBarrier, but received errors while "
                         f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank. ({e})",
                         rank, [0], secs) from e
        return
    tokens = torch.zeros(n, dtype=torch.uint8)
    base = tokens.data_ptr()
    ws = comm._p2p([(False, r, base + r, 1, tag, True) for r in range(1, n)], secs, True, tokens, None)
    missing = []
    for r, w in zip(range(1, n), ws):
        try:
            w.wait()
        except TuttiError:
            missing.append(r)
            if not wait_all_ranks:
                break
    if missing:
        who = f"Rank {missing[0]}" if len(missing) == 1 and not wait_all_ranks else \
            "Ranks " + ", ".join(str(r) for r in missing)
        raise _error(f"tutti: {who} failed to pass monitoredBarrier in {_ms(secs)} ms", rank, missing, secs)
    acks = comm._p2p([(True, r, base + r, 1, tag, True) for r in range(1, n)], secs, True, tokens, None)
    for w in acks:
        w.wait()

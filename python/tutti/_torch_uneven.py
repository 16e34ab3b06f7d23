"""Reduce-scatter with uneven blocks for the torch backend (tutti.torch).

``dist.reduce_scatter(out, blocks)`` with blocks of different sizes has no tutti
collective of its own. It runs as one all-to-all-v that sends block p to rank p (each
rank receives the n contributions to its block, (n-1)/n of the input in all, as a
reduce-scatter moves) followed by a local reduction of those n pieces, in rank order.
Where a local reduction could differ from the core's (AVG of integers, whose rounding is
the core's; bool) it runs as before: an all-reduce of the whole input (twice the traffic),
of which this rank keeps its block.
"""

from __future__ import annotations

from typing import Any, List

import torch

from . import _codes as C
from ._torch_util import _prefix

_LOCAL = {
    C.OP_SUM: lambda r: r.sum(0),
    C.OP_PROD: lambda r: r.prod(0),
    C.OP_MIN: lambda r: r.amin(0),
    C.OP_MAX: lambda r: r.amax(0),
    C.OP_AVG: lambda r: r.sum(0) / r.shape[0],
}


def reduce_scatter_uneven(rank: int, n: int, out: torch.Tensor, ins: List[torch.Tensor], src: torch.Tensor,
                          code: int, opc: int, calls: list, bufs: list, post: list) -> None:
    """Adds the calls (to ``calls``), buffers to keep (``bufs``) and copies back (``post``)
    that reduce-scatter `src` (the blocks `ins` back to back) into this rank's `out`."""
    counts = [t.numel() for t in ins]
    k = out.numel()
    if counts[rank] != k:
        raise ValueError(f"tutti reduce_scatter: input block {rank} has {counts[rank]} "
                         f"elements but the output has {k}")
    if out.dtype == torch.bool or (opc == C.OP_AVG and not out.is_floating_point()):
        tmp = src.clone() if src.data_ptr() in {t.data_ptr() for t in ins} else src
        lo = sum(counts[:rank])
        bufs.append(tmp)
        nb = tmp.numel() * tmp.element_size()
        calls.append((C.ALL_REDUCE, 0, code, opc, tmp.numel(), tmp.data_ptr(), nb, tmp.data_ptr(), nb, None))
        post.append(lambda: out.copy_(tmp[lo:lo + k].view(out.shape)))
        return
    recv = torch.empty(n * k, dtype=out.dtype)
    rc = [k] * n
    sl = src.numel() * src.element_size()
    rl = recv.numel() * recv.element_size()
    reduce = _LOCAL[opc]

    def finish() -> Any:
        return out.copy_(reduce(recv.view(n, k)).view(out.shape))

    bufs += [src, recv]
    calls.append((C.ALL_TO_ALL_V, 0, code, C.OP_SUM, 0, src.data_ptr(), sl, recv.data_ptr(), rl,
                  (counts, _prefix(counts), rc, _prefix(rc))))
    post.append(finish)

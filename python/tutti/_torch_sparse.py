"""All-reduce of sparse COO tensors for the torch backend (tutti.torch), as gloo does it.

Every rank's indices and values are gathered (an all-gather of the counts and shapes,
then of the indices and values, of uneven sizes), summed by ``coalesce()``, and the sum
is written into the input tensor. Only SUM has a meaning here (what DDP's sparse
gradients use); the op runs to completion on the calling thread even when torch asked
for an asynchronous one, and returns a completed Work.
"""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from ._torch_util import _DoneWork, _key

_SUM = _key(dist.ReduceOp.SUM)


def _blocking() -> AllgatherOptions:
    o = AllgatherOptions()
    if hasattr(o, "asyncOp"):
        o.asyncOp = False
    return o


def _gather_rows(pg: Any, rows: torch.Tensor, counts: List[int]) -> torch.Tensor:
    """All-gathers `rows` (rank r has counts[r] rows of the same width) into one tensor."""
    rows = rows.contiguous()
    width = 1
    for d in rows.shape[1:]:
        width *= d
    outs = [torch.empty((c,) + tuple(rows.shape[1:]), dtype=rows.dtype) for c in counts]
    if sum(counts) * width > 0:
        pg.allgather([outs], [rows], _blocking())
    return torch.cat(outs)


def sparse_allreduce(pg: Any, tensors: List[torch.Tensor], op: Any) -> Any:
    """Sums sparse COO `tensors` over the group `pg` in place; returns a completed Work."""
    if _key(op) != _SUM:
        raise ValueError(f"tutti all_reduce: sparse tensors reduce with SUM only, not {op}; "
                         "use to_dense() for other ops")
    n, rank = pg.size(), pg.rank()
    for i, t in enumerate(tensors):
        if t.layout != torch.sparse_coo:
            raise TypeError(f"tutti all_reduce: tensor {i} is {t.layout}; sparse all-reduce takes sparse_coo "
                            "tensors (to_sparse_coo() or to_dense() first)")
        if not t.is_cpu:
            raise ValueError(f"tutti all_reduce: tensor {i} is on {t.device}; the backend handles CPU tensors only")
        idx, val = t._indices(), t._values()
        meta = torch.tensor([idx.shape[1], t.sparse_dim(), t.dense_dim()] + list(t.shape), dtype=torch.int64)
        metas = [torch.empty_like(meta) for _ in range(n)]
        lens = torch.tensor([meta.numel()], dtype=torch.int64)
        all_lens = [torch.empty_like(lens) for _ in range(n)]
        pg.allgather([all_lens], [lens], _blocking())
        for r, ln in enumerate(all_lens):
            if int(ln) != meta.numel():
                raise ValueError(f"tutti all_reduce: rank {r}'s sparse tensor {i} has {int(ln) - 3} dimensions, "
                                 f"rank {rank}'s has {t.dim()}; every rank needs the same shape")
        pg.allgather([metas], [meta], _blocking())
        for r, m in enumerate(metas):
            if not torch.equal(m[1:], meta[1:]):
                raise ValueError(f"tutti all_reduce: rank {r}'s sparse tensor {i} is {tuple(m[3:].tolist())} with "
                                 f"{int(m[1])} sparse dims, rank {rank}'s is {tuple(t.shape)} with "
                                 f"{t.sparse_dim()}; every rank needs the same shape and sparse_dim")
        counts = [int(m[0]) for m in metas]
        all_idx = _gather_rows(pg, idx.t(), counts).t()
        all_val = _gather_rows(pg, val, counts)
        total = torch.sparse_coo_tensor(all_idx, all_val, t.shape).coalesce()
        t.copy_(total)
    return _DoneWork(tensors)

"""The coalesced collectives of the torch backend (tutti.torch): one tutti op per batch.

torch hands a backend a batch of tensors in ``dist.all_reduce_coalesced``,
``dist.all_gather_coalesced`` and, inside ``dist._coalescing_manager``, in
``allreduce_coalesced``, ``all_gather_single_coalesced`` and
``reduce_scatter_single_coalesced``. Each batch here is one tutti collective over one
buffer holding every tensor of the batch (the tensors themselves when they lie back to
back in one storage, else a staging copy), not one collective per tensor: a batch of
small tensors costs one op's latency, like NCCL's grouped calls. A batch of one tensor
(torch's functional ``all_gather_tensor`` and ``reduce_scatter_tensor``, which DTensor
issues, arrive here as batches of one) goes straight to the single-tensor op, without
staging copies.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch
from torch._C._distributed_c10d import AllreduceOptions, ReduceScatterOptions

from . import _codes as C
from ._torch_util import _concat, _cpu, _disjoint, _flat, _gather_buffer, _moved, _reduce_codes, name_the_rank


def _async_op(opts: Any) -> bool:
    return True if opts is None else bool(getattr(opts, "asyncOp", True))


def _same_dtype(what: str, ts: List[torch.Tensor]) -> None:
    for i, t in enumerate(ts):
        _cpu(t)
        if t.dtype != ts[0].dtype:
            raise TypeError(f"tutti {what}: tensor {i} is {t.dtype} but tensor 0 is {ts[0].dtype}; "
                            "a coalesced call takes tensors of one dtype")
        if t.layout != torch.strided:
            raise TypeError(f"tutti {what}: tensor {i} is {t.layout}; coalesced calls take dense tensors")


def _scatter_back(flat: torch.Tensor, outs: List[torch.Tensor]) -> None:
    """Copies consecutive pieces of 1-D `flat` into `outs`."""
    off = 0
    for t in outs:
        n = t.numel()
        t.copy_(flat[off:off + n].view(t.shape))
        off += n


@name_the_rank()
class CoalescedOps:
    """The coalesced collectives of :class:`tutti.torch.ProcessGroupTutti` (a mixin: it
    uses the group's ``_rank``, ``_size`` and ``_submit``)."""

    _rank: int
    _size: int
    # the group's single-tensor ops (annotations only: a stub here would shadow them)
    all_gather_single: Callable[..., Any]
    reduce_scatter_single: Callable[..., Any]

    def _submit(self, calls: list, keep: Any, post: list, outputs: Any, async_op: bool) -> Any:
        raise NotImplementedError

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """``dist.all_reduce_coalesced`` and ``_coalescing_manager`` all-reduces: one
        all-reduce over the tensors side by side."""
        op = opts.reduceOp if opts is not None else AllreduceOptions().reduceOp
        if not tensors:
            return self._submit([], None, [], tensors, _async_op(opts))
        _same_dtype("all_reduce_coalesced", tensors)
        code, opc = _reduce_codes(tensors[0], op)
        post: list = []
        flat = _flat(tensors)
        if flat is None:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            post.append(lambda: _scatter_back(flat, tensors))
        nb = flat.numel() * flat.element_size()
        call = (C.ALL_REDUCE, 0, code, opc, flat.numel(), flat.data_ptr(), nb, flat.data_ptr(), nb, None)
        return self._submit([call], flat, post, tensors, _async_op(opts))

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                            opts: Any = None) -> Any:
        """``dist.all_gather_coalesced``: ``output_lists[r][j]`` receives rank r's
        ``inputs[j]``; one all-gather of the inputs side by side."""
        n = self._size
        what = "all_gather_coalesced"
        if len(output_lists) != n:
            raise ValueError(f"tutti {what}: output_tensor_lists has {len(output_lists)} lists; it needs one per "
                             f"rank ({n}), each with a tensor shaped like each input")
        _same_dtype(what, list(inputs))
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(f"tutti {what}: output_tensor_lists[{r}] has {len(outs)} tensors but there are "
                                 f"{len(inputs)} inputs; it needs one per input")
            for j, (o, i) in enumerate(zip(outs, inputs)):
                if o.numel() != i.numel() or o.dtype != i.dtype:
                    raise ValueError(f"tutti {what}: output_tensor_lists[{r}][{j}] is {o.dtype} of {o.numel()} "
                                     f"elements but input {j} is {i.dtype} of {i.numel()}; make them alike")
        outs = [o for lst in output_lists for o in lst]
        if not inputs or sum(i.numel() for i in inputs) == 0:
            return self._submit([], None, [], output_lists, _async_op(opts))
        post: list = []
        src = _concat(list(inputs))
        dst = _gather_buffer(outs, post)
        src = _disjoint(src, dst)
        code, item = _moved(src)
        sl = src.numel() * src.element_size()
        rl = dst.numel() * dst.element_size()
        call = (C.ALL_GATHER, 0, code, C.OP_SUM, sl // item, src.data_ptr(), sl, dst.data_ptr(), rl, None)
        return self._submit([call], (src, dst), post, output_lists, _async_op(opts))

    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> Any:
        """``all_gather_into_tensor`` calls batched by ``_coalescing_manager``: one
        all-gather of the inputs side by side, then each output takes its pieces."""
        n = self._size
        what = "all_gather_into_tensor (coalesced)"
        if len(outputs) != len(inputs):
            raise ValueError(f"tutti {what}: {len(outputs)} outputs for {len(inputs)} inputs")
        _same_dtype(what, list(inputs) + list(outputs))
        for j, (o, i) in enumerate(zip(outputs, inputs)):
            if o.numel() != n * i.numel():
                raise ValueError(f"tutti {what}: output {j} has {o.numel()} elements; it needs {n} x {i.numel()}")
        if len(inputs) == 1:  # a batch of one (every functional all_gather_tensor): no staging copies
            return self.all_gather_single(outputs[0], inputs[0], opts)
        sizes = [i.numel() for i in inputs]
        total = sum(sizes)
        if total == 0:
            return self._submit([], None, [], outputs, _async_op(opts))
        src = _concat(list(inputs))
        dst = torch.empty(n * total, dtype=src.dtype)

        def copy_out() -> None:
            blocks = dst.view(n, total)
            off = 0
            for o, s in zip(outputs, sizes):
                o.copy_(blocks[:, off:off + s].reshape(o.shape))  # o holds rank r's piece at r*s
                off += s

        code, item = _moved(src)
        sl = src.numel() * src.element_size()
        rl = dst.numel() * dst.element_size()
        call = (C.ALL_GATHER, 0, code, C.OP_SUM, sl // item, src.data_ptr(), sl, dst.data_ptr(), rl, None)
        return self._submit([call], (src, dst), [copy_out], outputs, _async_op(opts))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> Any:
        """``reduce_scatter_tensor`` calls batched by ``_coalescing_manager``: the inputs
        are interleaved by destination rank into one buffer, reduce-scattered at once."""
        n = self._size
        what = "reduce_scatter_tensor (coalesced)"
        if opts is None:
            opts = ReduceScatterOptions()
        if len(outputs) != len(inputs):
            raise ValueError(f"tutti {what}: {len(outputs)} outputs for {len(inputs)} inputs")
        _same_dtype(what, list(inputs) + list(outputs))
        for j, (o, i) in enumerate(zip(outputs, inputs)):
            if i.numel() != n * o.numel():
                raise ValueError(f"tutti {what}: input {j} has {i.numel()} elements; it needs {n} x {o.numel()}")
        if len(inputs) == 1:  # a batch of one (every functional reduce_scatter_tensor): no staging copies
            return self.reduce_scatter_single(outputs[0], inputs[0], opts)
        code, opc = _reduce_codes(inputs[0], opts.reduceOp) if inputs else (0, 0)
        sizes = [o.numel() for o in outputs]
        total = sum(sizes)
        if total == 0:
            return self._submit([], None, [], outputs, _async_op(opts))
        # block r of the buffer: every input's block r, in order
        src = torch.cat([i.reshape(n, s) for i, s in zip(inputs, sizes)], dim=1).reshape(-1)
        dst = torch.empty(total, dtype=src.dtype)
        sl = src.numel() * src.element_size()
        rl = dst.numel() * dst.element_size()
        call = (C.REDUCE_SCATTER, 0, code, opc, total, src.data_ptr(), sl, dst.data_ptr(), rl, None)
        return self._submit([call], (src, dst), [lambda: _scatter_back(dst, outputs)], outputs, _async_op(opts))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced


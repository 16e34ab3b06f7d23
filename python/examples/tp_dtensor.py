#!/usr/bin/env python3
"""Tensor parallelism with DTensor (``parallelize_module``) on CPU, Megatron style.

A 2-layer decoder-only transformer (d_model 64, 4 heads, vocabulary 256, float32) is split
over a 1-D DeviceMesh("cpu", ...) of n ranks (1, 2 or 4) with
``torch.distributed.tensor.parallel``: in every block the query, key, value and first MLP
layers are ``ColwiseParallel`` (each rank holds HEADS/n heads and 1/n of the MLP) and the
attention output and second MLP layers ``RowwiseParallel``. With sequence parallelism
(the default) the layer norms are ``SequenceParallel`` and the activations between blocks
are split along the sequence: entering a block all-gathers them
(``all_gather_into_tensor``), leaving it reduce-scatters the partial sums
(``reduce_scatter_tensor``), and the embedding is vocabulary-sharded (``RowwiseParallel``,
a reduce-scatter into sequence shards); ``--no-sequence-parallel`` keeps activations
replicated, and the row-wise layers all-reduce instead. The output layer is column-wise
(vocabulary-sharded), all-gathered into replicated logits. Replicated parameters (layer
norms) get their gradients all-reduced by DTensor.

Every rank trains on the same batch; rank 0 prints the loss of every step and compares the
losses with a one-process run of the unsharded model within ``RTOL``. ``--compare gloo``
then runs the same training on backend ``gloo`` and compares the two backends. At the end,
a tensor is resharded from rows to columns (Shard(0) -> Shard(1): DTensor's
``redistribute``, and ``all_to_all_single`` as DTensor does it on GPU meshes) and tokens
are dispatched with an uneven ``all_to_all_single``, each checked (``reshard_check``).

    python tp_dtensor.py --spawn 2                          # backend tutti, 2 ranks
    python tp_dtensor.py --spawn 4 --compare gloo           # tutti, then gloo, compared
    python tp_dtensor.py --spawn 2 --no-sequence-parallel   # plain tensor parallel
    torchrun --nproc-per-node 2 tp_dtensor.py
    tutti run -n 2 -- python tp_dtensor.py
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import tutti.torch  # noqa: F401  registers the backend "tutti"

VOCAB, D_MODEL, HEADS, LAYERS, SEQ, BATCH = 256, 64, 4, 2, 32, 8
HEAD_DIM = D_MODEL // HEADS
LR = 3e-3
step_seconds = []  # the wall time of each step of the last train()
RTOL = 1e-4  # relative agreement of the losses (with the reference, or the other backend)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP. The head count is read off the local
    query width, so the same code runs sharded (HEADS/n heads per rank) and whole."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.q, self.k, self.v = (nn.Linear(D_MODEL, D_MODEL) for _ in range(3))
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.fc1, self.fc2 = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        b, s, w = q.shape  # s: the whole sequence, w: this rank's heads x HEAD_DIM

        def heads(t):
            return t.view(b, s, w // HEAD_DIM, HEAD_DIM).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        x = self.tok(tokens) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build():
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return Transformer()


def batch(step):
    """(inputs, targets) of `step`: sequences of x[i+1] = (a*x[i] + b) mod VOCAB."""
    g = torch.Generator().manual_seed(1000 + step)
    a = torch.randint(0, 8, (BATCH, 1), generator=g) * 2 + 1
    b = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    x = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    seq = [x]
    for _ in range(SEQ):
        x = (a * x + b) % VOCAB
        seq.append(x)
    seq = torch.cat(seq, dim=1)
    return seq[:, :-1], seq[:, 1:]


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def reference(steps):
    """The losses of a one-process run of the unsharded model."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def parallelize(model, mesh, sequence_parallel):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    if sequence_parallel:
        seq = Shard(1)
        top = {
            "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "pos": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "ln": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
        }
        block = {"ln1": SequenceParallel(), "ln2": SequenceParallel()}
    else:
        seq = Replicate()
        top = {"head": ColwiseParallel(output_layouts=Replicate())}
        block = {}
    parallelize_module(model, mesh, top)
    for blk in model.blocks:
        plan = dict(block)
        for name in ("q", "k", "v", "fc1"):
            plan[name] = ColwiseParallel(input_layouts=seq)
        for name in ("proj", "fc2"):
            plan[name] = RowwiseParallel(output_layouts=seq)
        parallelize_module(blk, mesh, plan)
    return model


def train(steps, sequence_parallel=True):
    """Tensor-parallel training on the default group; returns the per-step losses."""
    from torch.distributed.device_mesh import init_device_mesh

    n = dist.get_world_size()
    if HEADS % n or SEQ % n:
        raise SystemExit(f"{n} ranks do not split {HEADS} heads and {SEQ} positions")
    mesh = init_device_mesh("cpu", (n,))
    model = parallelize(build(), mesh, sequence_parallel)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    step_seconds.clear()
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = batch(step)
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step_seconds.append(time.perf_counter() - t0)
    reshard_check(mesh)
    return losses


def reshard_check(mesh):
    """Rows to columns (Shard(0) -> Shard(1)), checked against the full tensor, two ways:
    DTensor's ``redistribute``, which on a CPU mesh all-gathers and keeps its columns
    (torch routes it to an all-to-all only on other devices), and the op it runs there,
    ``_dtensor.shard_dim_alltoall`` (an ``all_to_all_single``), called directly. Then an
    ``all_to_all_single`` with uneven splits, as expert parallelism dispatches tokens."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Shard, distribute_tensor

    n, r = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(7)
    full = torch.randn(8 * n, 4 * n)
    w = full.shape[1] // n
    want = full[:, r * w:(r + 1) * w]
    rows = distribute_tensor(full, mesh, [Shard(0)])
    if not torch.equal(rows.redistribute(mesh, [Shard(1)]).to_local(), want):
        raise AssertionError("Shard(0) -> Shard(1) redistribute gave wrong columns")
    group = mesh.get_group()
    cols = torch.ops._dtensor.shard_dim_alltoall(rows.to_local(), 0, 1, group.group_name)
    if not torch.equal(cols, want):
        raise AssertionError("shard_dim_alltoall gave wrong columns")
    # rank r sends p + 1 rows of value 100 r + p to rank p
    send = torch.cat([torch.full((p + 1, 3), 100.0 * r + p) for p in range(n)])
    got = funcol.all_to_all_single(send, [r + 1] * n, [p + 1 for p in range(n)], group)
    want = torch.cat([torch.full((r + 1, 3), 100.0 * q + r) for q in range(n)])
    if not torch.equal(funcol.wait_tensor(got), want):
        raise AssertionError("uneven all_to_all_single gave wrong rows")


def agree(a, b, rtol=RTOL):
    """The largest relative difference of two loss curves, and whether it is within rtol."""
    worst = max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(a, b))
    return worst, len(a) == len(b) and worst <= rtol


def run(backend, steps, sequence_parallel=True, out=None):
    rank = dist.get_rank()
    losses = train(steps, sequence_parallel)
    if rank == 0:
        for i, v in enumerate(losses):
            print(f"{backend} step {i}: loss {v:.6f}", flush=True)
        want = reference(steps)
        worst, ok = agree(losses, want)
        style = "sequence parallel" if sequence_parallel else "tensor parallel"
        print(f"{backend} on {dist.get_world_size()} ranks ({style}): losses {'match' if ok else 'DIFFER FROM'} "
              f"the one-process reference (max relative diff {worst:.2e}, tolerance {RTOL:g})", flush=True)
        t = sorted(step_seconds[1:] or step_seconds)
        print(f"{backend}: median step time {t[len(t) // 2] * 1e3:.1f} ms (steps after the first)", flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(losses, f)
        if not ok:
            raise SystemExit(1)
    return losses


def worker(rank, n, port, backend, steps, sequence_parallel, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=n)
    run(backend, steps, sequence_parallel, out)
    dist.barrier()  # nobody leaves while rank 0 still checks (gloo aborts a rank whose peer left)
    dist.destroy_process_group()


def spawn(n, backend, steps, sequence_parallel):
    """Runs the training in n fresh processes; returns rank 0's losses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "losses.json")
        torch.multiprocessing.spawn(worker, args=(n, port, backend, steps, sequence_parallel, out), nprocs=n)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="tutti", help="tutti (default) or gloo")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    ap.add_argument("--compare", default=None, help="also run on this backend (e.g. gloo) and compare the losses")
    ap.add_argument("--no-sequence-parallel", dest="sp", action="store_false",
                    help="keep activations replicated (all-reduces instead of all-gathers and reduce-scatters)")
    a = ap.parse_args()
    if not a.spawn:  # started by a launcher (torchrun, tutti run)
        torch.set_num_threads(1)
        dist.init_process_group(a.backend)
        run(a.backend, a.steps, a.sp)
        dist.barrier()
        dist.destroy_process_group()
        return
    losses = spawn(a.spawn, a.backend, a.steps, a.sp)
    if a.compare:
        other = spawn(a.spawn, a.compare, a.steps, a.sp)
        worst, ok = agree(losses, other)
        print(f"{a.backend} and {a.compare} losses {'match' if ok else 'DIFFER'} (max relative diff {worst:.2e}, "
              f"tolerance {RTOL:g})", flush=True)
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()

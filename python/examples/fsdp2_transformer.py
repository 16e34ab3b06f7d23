#!/usr/bin/env python3
"""FSDP2 (``torch.distributed.fsdp.fully_shard``) training of a small transformer on CPU.

A 2-layer decoder-only transformer (d_model 64, 4 heads, vocabulary 256, float32) learns
a generated language: sequences of a random affine recurrence ``x[i+1] = (a*x[i] + b) mod
256`` whose coefficients vary per sequence, so the model must read them off the context.
Every block and the whole model are ``fully_shard``-ed over a 1-D DeviceMesh("cpu", ...):
each rank keeps 1/n of every parameter; the forward and backward passes all-gather them
(``all_gather_into_tensor``, one call per block) and the gradients are reduce-scattered
(``reduce_scatter_tensor`` with AVG) back to their shards; AdamW steps on the shards.
With ``--replicas R`` (HSDP) the mesh is 2-D, R replicas of n/R shards: the gradients are
reduce-scattered within a replica and then all-reduced across the replicas (subgroups).
``--bf16`` turns on mixed precision: bfloat16 parameters are all-gathered and computed
with, float32 gradients reduced (against the float32 one-process run the losses then
agree within ``BF16_RTOL`` only; between backends still within ``RTOL``).

Each rank trains on its slice of a fixed global batch, so the run computes what one
process computes on the whole batch. Rank 0 prints the loss of every step (the mean over
the ranks) and compares the losses with a one-process run of the same model on the same
data: they agree within ``RTOL`` (float32 summed in another order; measured in
docs/python.md). ``--compare gloo`` runs the same training on backend ``gloo`` afterwards
and compares the two backends' losses within the same tolerance.

    python fsdp2_transformer.py --spawn 2                    # backend tutti, 2 ranks
    python fsdp2_transformer.py --spawn 4 --compare gloo     # tutti, then gloo, compared
    python fsdp2_transformer.py --spawn 2 --backend gloo     # gloo only
    python fsdp2_transformer.py --spawn 4 --replicas 2       # HSDP: 2 replicas x 2 shards
    python fsdp2_transformer.py --spawn 2 --bf16 --compare gloo   # mixed precision
    torchrun --nproc-per-node 2 fsdp2_transformer.py
    tutti run -n 2 -- python fsdp2_transformer.py
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

VOCAB, D_MODEL, HEADS, LAYERS, SEQ = 256, 64, 4, 2, 32
GLOBAL_BATCH = 16  # sequences per step, split evenly over the ranks (1, 2 or 4)
LR = 3e-3
step_seconds = []  # the wall time of each step of the last train()
RTOL = 1e-4  # relative agreement of the losses (with the reference, or the other backend)
BF16_RTOL = 3e-2  # with --bf16, against the float32 one-process run (bfloat16 keeps 8 bits)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.fc1, self.fc2 = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build():
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return Transformer()


def batch(step):
    """The global batch of `step`: (inputs, targets), GLOBAL_BATCH x SEQ tokens each."""
    g = torch.Generator().manual_seed(1000 + step)
    a = torch.randint(0, 8, (GLOBAL_BATCH, 1), generator=g) * 2 + 1
    b = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    x = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    seq = [x]
    for _ in range(SEQ):
        x = (a * x + b) % VOCAB
        seq.append(x)
    seq = torch.cat(seq, dim=1)
    return seq[:, :-1], seq[:, 1:]


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def reference(steps):
    """The losses of a one-process run on the whole global batch."""
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


def train(steps, replicas=1, bf16=False):
    """FSDP2 training on the default group; returns the per-step losses (mean over ranks).
    ``replicas`` > 1: HSDP, a 2-D mesh of that many replicas, each sharded over n/replicas
    ranks (gradients reduce-scattered within a replica, then all-reduced across).
    ``bf16``: mixed precision, parameters all-gathered and used in bfloat16, gradients
    reduced in float32 (``MixedPrecisionPolicy``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % n:
        raise SystemExit(f"{n} ranks do not split a global batch of {GLOBAL_BATCH}")
    if n % replicas:
        raise SystemExit(f"{replicas} replicas do not split {n} ranks")
    mesh = init_device_mesh("cpu", (n,)) if replicas == 1 else init_device_mesh(
        "cpu", (replicas, n // replicas), mesh_dim_names=("replicate", "shard"))
    model = build()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"mp_policy": mp} if mp else {}
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    per = GLOBAL_BATCH // n
    losses = []
    step_seconds.clear()
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        loss = loss_of(model, x, y).float()
        opt.zero_grad()
        loss.backward()  # gradients reduce-scattered with AVG: the gradient of the global mean
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        losses.append(mean.item() / n)
        step_seconds.append(time.perf_counter() - t0)
    return losses


def agree(a, b, rtol=RTOL):
    """The largest relative difference of two loss curves, and whether it is within rtol."""
    worst = max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(a, b))
    return worst, len(a) == len(b) and worst <= rtol


def run(backend, steps, replicas=1, bf16=False, out=None):
    rank = dist.get_rank()
    losses = train(steps, replicas, bf16)
    if rank == 0:
        for i, v in enumerate(losses):
            print(f"{backend} step {i}: loss {v:.6f}", flush=True)
        want = reference(steps)
        rtol = BF16_RTOL if bf16 else RTOL
        worst, ok = agree(losses, want, rtol)
        style = ("FSDP" if replicas == 1 else f"HSDP, {replicas} replicas") + (", bfloat16" if bf16 else "")
        print(f"{backend} on {dist.get_world_size()} ranks ({style}): losses {'match' if ok else 'DIFFER FROM'} the "
              f"one-process reference (max relative diff {worst:.2e}, tolerance {rtol:g})", flush=True)
        t = sorted(step_seconds[1:] or step_seconds)
        print(f"{backend}: median step time {t[len(t) // 2] * 1e3:.1f} ms (steps after the first)", flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(losses, f)
        if not ok:
            raise SystemExit(1)
    return losses


def worker(rank, n, port, backend, steps, replicas, bf16, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=n)
    run(backend, steps, replicas, bf16, out)
    dist.barrier()  # nobody leaves while rank 0 still checks (gloo aborts a rank whose peer left)
    dist.destroy_process_group()


def spawn(n, backend, steps, replicas, bf16):
    """Runs the training in n fresh processes; returns rank 0's losses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "losses.json")
        torch.multiprocessing.spawn(worker, args=(n, port, backend, steps, replicas, bf16, out), nprocs=n)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="tutti", help="tutti (default) or gloo")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    ap.add_argument("--compare", default=None, help="also run on this backend (e.g. gloo) and compare the losses")
    ap.add_argument("--replicas", type=int, default=1,
                    help="HSDP: a 2-D mesh of this many replicas, each sharded over the others")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: bfloat16 parameters and compute, float32 gradient reduction")
    a = ap.parse_args()
    if not a.spawn:  # started by a launcher (torchrun, tutti run)
        torch.set_num_threads(1)
        dist.init_process_group(a.backend)
        run(a.backend, a.steps, a.replicas, a.bf16)
        dist.barrier()
        dist.destroy_process_group()
        return
    losses = spawn(a.spawn, a.backend, a.steps, a.replicas, a.bf16)
    if a.compare:
        other = spawn(a.spawn, a.compare, a.steps, a.replicas, a.bf16)
        worst, ok = agree(losses, other)
        print(f"{a.backend} and {a.compare} losses {'match' if ok else 'DIFFER'} (max relative diff {worst:.2e}, "
              f"tolerance {RTOL:g})", flush=True)
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()

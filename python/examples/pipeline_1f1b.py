#!/usr/bin/env python3
"""Pipeline parallelism with the 1F1B schedule over tutti, checked bit for bit.

A small MLP (float64) is cut into one stage per rank (4 by default). Each step splits the
batch into micro-batches and runs the 1F1B ("one forward, one backward") schedule of
PipeDream-Flush / Megatron-LM: stage s first runs n-1-s forward passes (warm-up), then
alternates one forward and one backward pass, then finishes the remaining backward
passes (cool-down). In the steady state a stage sends its forward activation to the next
stage and receives that stage's gradient in one ``torch.distributed.batch_isend_irecv``
(and sends its input gradient to the previous stage while receiving the next activation
from it in another): both neighbours send before they receive, which deadlocks under a
backend that runs point-to-point ops in issue order and is fine on tutti, where sends and
receives match per (peer, tag) and progress together. Activations and gradients travel
with tags of their own (per micro-batch).

At the end of every step each rank compares its stage's gradients, and at the end its
parameters, with a one-process run of the whole model on the same micro-batches, with
``torch.equal``: the same kernels on the same data in the same order give the same bits.

    python pipeline_1f1b.py --spawn 4                         # torch.multiprocessing.spawn
    TUTTI_TRANSPORT=tcp python pipeline_1f1b.py --spawn 4     # TCP between the stages
    python pipeline_1f1b.py --spawn 4 --transport tcp         # the same
    torchrun --nproc-per-node 4 pipeline_1f1b.py
    tutti run -n 4 -- python pipeline_1f1b.py
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tutti.torch  # noqa: F401  registers the backend "tutti"

DT = torch.float64
WIDTH, BLOCKS_PER_STAGE, MICRO, MB = 48, 2, 8, 2048  # MICRO micro-batches of MB rows (768 KiB activations: more than a ring holds)
LR = 0.05


def build(n_stages):
    """The model's stages (the same weights everywhere: a fixed seed)."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH, dtype=DT), torch.nn.Tanh())
              for _ in range(n_stages * BLOCKS_PER_STAGE)]
    return [torch.nn.Sequential(*blocks[s * BLOCKS_PER_STAGE:(s + 1) * BLOCKS_PER_STAGE]) for s in range(n_stages)]


def micro_batches(step):
    g = torch.Generator().manual_seed(1000 + step)
    xs = [torch.randn(MB, WIDTH, generator=g, dtype=DT) for _ in range(MICRO)]
    ys = [torch.randn(MB, WIDTH, generator=g, dtype=DT) for _ in range(MICRO)]
    return xs, ys


def fwd_tag(m):
    return 2 * m


def bwd_tag(m):
    return 2 * m + 1


def p2p(ops):
    """Posts sends and receives (kind, tensor, peer, tag) at once and waits for all."""
    if not ops:
        return
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, tag=tag)
                                   for kind, t, peer, tag in ops])
    for r in reqs:
        r.wait()


def train_step(stage, rank, n, xs, ys):
    """One 1F1B step of stage `rank` of `n` over the micro-batches; leaves the gradients
    in the stage's parameters."""
    first, last = rank == 0, rank == n - 1
    inputs, outputs = {}, {}

    def empty():
        return torch.empty(MB, WIDTH, dtype=DT)

    def forward(m, a):
        if first:
            a = xs[m]
        else:
            a.requires_grad_(True)
        out = stage(a)
        if last:
            out = F.mse_loss(out, ys[m]) / MICRO
        inputs[m], outputs[m] = a, out
        return out

    def backward(m, g):
        out = outputs.pop(m)
        if last:
            out.backward()
        else:
            out.backward(g)
        a = inputs.pop(m)
        return None if first else a.grad

    def recv_forward(m):
        if first:
            return None
        a = empty()
        p2p([("recv", a, rank - 1, fwd_tag(m))])
        return a

    warmup = min(n - 1 - rank, MICRO)
    steady = MICRO - warmup
    fm = bm = 0  # next micro-batch to run forward, backward
    for _ in range(warmup):  # warm-up: forward passes only (never on the last stage)
        out = forward(fm, recv_forward(fm))
        p2p([("send", out.detach(), rank + 1, fwd_tag(fm))])
        fm += 1
    a = recv_forward(fm) if steady else None
    for i in range(steady):  # steady state: one forward, one backward
        out = forward(fm, a)
        g = None
        if not last:  # send the activation and receive a gradient, together
            g = empty()
            p2p([("send", out.detach(), rank + 1, fwd_tag(fm)), ("recv", g, rank + 1, bwd_tag(bm))])
        fm += 1
        gin = backward(bm, g)
        ops = []
        if not first:  # send the input gradient and receive the next activation, together
            ops.append(("send", gin, rank - 1, bwd_tag(bm)))
            if i < steady - 1:
                a = empty()
                ops.append(("recv", a, rank - 1, fwd_tag(fm)))
        p2p(ops)
        bm += 1
    for _ in range(warmup):  # cool-down: the remaining backward passes
        g = empty()
        p2p([("recv", g, rank + 1, bwd_tag(bm))])
        gin = backward(bm, g)
        if not first:
            p2p([("send", gin, rank - 1, bwd_tag(bm))])
        bm += 1
    assert fm == bm == MICRO and not inputs and not outputs


def reference(n_stages, steps):
    """The whole model in one process on the same micro-batches (backward in micro-batch
    order, as 1F1B runs them): per step, every stage's gradients; and the final stages."""
    stages = build(n_stages)
    model = torch.nn.Sequential(*stages)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = []
    for step in range(steps):
        xs, ys = micro_batches(step)
        opt.zero_grad()
        for x, y in zip(xs, ys):
            (F.mse_loss(model(x), y) / MICRO).backward()
        grads.append([[p.grad.clone() for p in s.parameters()] for s in stages])
        opt.step()
    return grads, stages


def run(steps):
    rank, n = dist.get_rank(), dist.get_world_size()
    stage = build(n)[rank]
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    want_grads, want = reference(n, steps)
    for step in range(steps):
        xs, ys = micro_batches(step)
        opt.zero_grad()
        train_step(stage, rank, n, xs, ys)
        for i, (p, q) in enumerate(zip(stage.parameters(), want_grads[step][rank])):
            if not torch.equal(p.grad, q):
                raise AssertionError(f"stage {rank}, step {step}: gradient {i} differs from the one-process run "
                                     f"(max |diff| {(p.grad - q).abs().max().item():.3g})")
        opt.step()
    for p, q in zip(stage.parameters(), want[rank].parameters()):
        assert torch.equal(p, q), f"stage {rank}: parameters differ from the one-process run"
    dist.barrier()
    transport = os.environ.get("TUTTI_TRANSPORT", "auto")
    print(f"rank {rank}/{n}: 1F1B stage matches the one-process run bit for bit after {steps} steps "
          f"({MICRO} micro-batches, transport {transport})", flush=True)


def worker(rank, n, port, steps):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("tutti", rank=rank, world_size=n)
    run(steps)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--spawn", type=int, default=0, help="start this many stages with torch.multiprocessing.spawn")
    ap.add_argument("--transport", choices=("auto", "shm", "tcp"), default=None,
                    help="sets TUTTI_TRANSPORT (tcp: sockets between the stages, also on one host)")
    a = ap.parse_args()
    if a.transport:
        os.environ["TUTTI_TRANSPORT"] = a.transport
    if a.spawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(worker, args=(a.spawn, port, a.steps), nprocs=a.spawn)
        return
    torch.set_num_threads(1)
    dist.init_process_group("tutti")
    run(a.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Pipeline parallelism with torch.distributed send/recv over tutti (GPipe schedule, scaled down).

The model (a stack of Linear+Tanh blocks) is cut into one stage per rank. Each step splits
the batch into micro-batches; every micro-batch flows forward stage to stage (activations
sent with dist.send, received with dist.recv), the last stage computes the loss, and the
gradients flow back the same way. At the end every rank checks that its stage's parameters
equal those of the whole model trained in one process on the same data (float tolerance:
micro-batching sums the gradients in another order).

    python pipeline.py --spawn 3                      # torch.multiprocessing.spawn
    torchrun --nproc-per-node 3 pipeline.py
    tutti run -n 3 -- python pipeline.py
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist

import tutti.torch  # noqa: F401  registers the backend "tutti"

WIDTH, BLOCKS_PER_STAGE, BATCH, MICRO = 32, 2, 16, 4


def build(n_stages):
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
              for _ in range(n_stages * BLOCKS_PER_STAGE)]
    return [torch.nn.Sequential(*blocks[s * BLOCKS_PER_STAGE:(s + 1) * BLOCKS_PER_STAGE]) for s in range(n_stages)]


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def reference(n_stages, steps):
    """The whole model in one process, no micro-batches."""
    stages = build(n_stages)
    model = torch.nn.Sequential(*stages)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return stages


def run(steps):
    rank, n = dist.get_rank(), dist.get_world_size()
    stage = build(n)[rank]
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    mb = BATCH // MICRO
    for step in range(steps):
        x, y = batch(step)
        inputs, outputs, losses = [], [], []
        for m in range(MICRO):  # forward, all micro-batches
            if rank == 0:
                a = x[m * mb:(m + 1) * mb]
            else:
                a = torch.empty(mb, WIDTH)
                dist.recv(a, src=rank - 1)
                a.requires_grad_(True)
            out = stage(a)
            inputs.append(a)
            outputs.append(out)
            if rank < n - 1:
                dist.send(out.detach(), dst=rank + 1)
            else:
                losses.append(torch.nn.functional.mse_loss(out, y[m * mb:(m + 1) * mb]) / MICRO)
        opt.zero_grad()
        for m in reversed(range(MICRO)):  # backward, last micro-batch first
            if rank == n - 1:
                losses[m].backward()
            else:
                g = torch.empty(mb, WIDTH)
                dist.recv(g, src=rank + 1)
                outputs[m].backward(g)
            if rank > 0:
                dist.send(inputs[m].grad, dst=rank - 1)
        opt.step()
        if rank == n - 1 and step % 5 == 0:
            print(f"step {step}: loss {sum(l.item() for l in losses):.4f}", flush=True)
    want = reference(n, steps)[rank]
    for p, q in zip(stage.parameters(), want.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), f"stage {rank} differs from the one-process run"
    dist.barrier()
    print(f"rank {rank}/{n}: pipeline stage matches the one-process model after {steps} steps", flush=True)


def worker(rank, n, port, steps):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("tutti", rank=rank, world_size=n)
    run(steps)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--spawn", type=int, default=0, help="start this many stages with torch.multiprocessing.spawn")
    a = ap.parse_args()
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

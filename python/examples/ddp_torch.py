#!/usr/bin/env python3
"""DistributedDataParallel on CPU with the tutti backend. Runs under any launcher:

    torchrun --nproc-per-node 4 ddp_torch.py
    tutti run -n 4 -- python ddp_torch.py
    python ddp_torch.py --spawn 4                 # torch.multiprocessing.spawn
    MASTER_ADDR=$(hostname) MASTER_PORT=29500 srun -n 4 python ddp_torch.py   # Slurm
    mpirun -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python ddp_torch.py

It trains a small MLP and checks, after every step, that the parameters are identical on
all ranks.

--time measures instead (what docs/sim.md validates `tutti sim CLUSTER step` with): a wider
MLP (--width, --depth), no check between steps, and rank 0 prints the median step time after
--warmup steps, with the gradient bytes; --local times the same steps on one process without
DDP or a process group (the compute alone).
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tutti.torch  # noqa: F401  registers the backend "tutti"


def train(steps):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(64, 32, generator=gen)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(every, flat)
        assert all(torch.equal(every[0], e) for e in every), f"ranks diverged at step {step}"
    print(f"rank {rank}/{n}: DDP on backend {dist.get_backend()} OK after {steps} steps, loss {loss.item():.4f}",
          flush=True)


def mlp(width, depth):
    """32 inputs, `depth` hidden layers of `width`, 8 outputs."""
    layers, d = [], 32
    for _ in range(depth):
        layers += [torch.nn.Linear(d, width), torch.nn.ReLU()]
        d = width
    return torch.nn.Sequential(*layers, torch.nn.Linear(d, 8))


def timed(a):
    """Step times (forward, backward, optimizer) of the wide MLP, under DDP unless --local."""
    rank, n = (0, 1) if a.local else (dist.get_rank(), dist.get_world_size())
    torch.manual_seed(0)
    model = mlp(a.width, a.depth)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    net = model if a.local else DDP(model)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(a.warmup + a.steps):
        x = torch.randn(a.batch, 32, generator=gen)
        t0 = time.perf_counter()
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    t = sorted(times[a.warmup:])
    if rank == 0:
        print(f"timed: ranks {n} {'local' if a.local else 'ddp'} grad_bytes {grad_bytes} "
              f"step_ms median {1e3 * statistics.median(t):.2f} min {1e3 * t[0]:.2f} "
              f"max {1e3 * t[-1]:.2f} steps {len(t)}", flush=True)


def worker(rank, n, port, steps):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n)
    train(steps)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    ap.add_argument("--time", action="store_true", help="time the steps of a wider MLP (see above)")
    ap.add_argument("--local", action="store_true", help="with --time: one process, no DDP")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.time and a.local:
        timed(a)
        return
    if a.spawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(worker, args=(a.spawn, port, a.steps), nprocs=a.spawn)
        return
    dist.init_process_group(backend="tutti")  # env:// from torchrun, tutti run, srun, mpirun
    if a.time:
        timed(a)
    else:
        train(a.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

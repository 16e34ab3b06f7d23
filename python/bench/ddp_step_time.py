#!/usr/bin/env python3
"""DDP step time, backend tutti vs gloo, in one run.

A ~25 M parameter MLP (1024 -> 4096 -> 4096 -> 1024, float32) trained with SGD under
DistributedDataParallel on CPU. Both process groups live in the same processes (gloo as the
default group, tutti as a second group over the same ranks); the two DDP models start from
the same weights and see the same data. Rounds alternate which backend goes first; each
round times `--steps` steps (forward, backward with DDP's bucketed all-reduces, optimizer
step) after `--warmup` steps, and reports the median step time, the maximum over ranks.
A "local" row times the same step without DDP (no communication) for reference.

    python bench/ddp_step_time.py --nproc 2 [--rounds 3] [--steps 8] [--batch 32]
"""
import argparse
import os
import socket
import statistics
import time


def model(width_in, hidden, width_out):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width_in, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, width_out),
    )


def worker(rank, n, port, a, q):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tutti.torch  # noqa: F401

    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    groups = {"gloo": dist.group.WORLD, "tutti": dist.new_group(list(range(n)), backend="tutti")}
    nets = {}
    for name, g in groups.items():
        m = model(1024, 4096, 1024)
        nets[name] = (DDP(m, process_group=g), torch.optim.SGD(m.parameters(), lr=1e-3))
    local = model(1024, 4096, 1024)
    local_opt = torch.optim.SGD(local.parameters(), lr=1e-3)
    nparams = sum(p.numel() for p in local.parameters())
    gen = torch.Generator().manual_seed(rank)
    xs = [torch.randn(a.batch, 1024, generator=gen) for _ in range(4)]
    ys = [torch.randn(a.batch, 1024, generator=gen) for _ in range(4)]

    def step(net, opt, i):
        loss = torch.nn.functional.mse_loss(net(xs[i % 4]), ys[i % 4])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    def timed(name):
        net, opt = (local, local_opt) if name == "local" else nets[name]
        for i in range(a.warmup):
            step(net, opt, i)
        dist.barrier()
        per = []
        for i in range(a.steps):
            t0 = time.perf_counter()
            step(net, opt, i)
            per.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(per)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    res = {"gloo": [], "tutti": [], "local": []}
    for rd in range(a.rounds):
        order = ("gloo", "tutti", "local") if rd % 2 == 0 else ("tutti", "gloo", "local")
        for name in order:
            res[name].append(timed(name))
    # same weights and data: the two DDP models must agree
    pg = [p.detach() for p in nets["gloo"][0].module.parameters()]
    pt = [p.detach() for p in nets["tutti"][0].module.parameters()]
    diff = max((x - y).abs().max().item() for x, y in zip(pg, pt))
    dist.destroy_process_group()
    if rank == 0:
        q.put((nparams, {k: statistics.median(v) for k, v in res.items()}, res, diff))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--quiet-wait", type=float, default=0, help="wait up to this many seconds for an idle machine")
    a = ap.parse_args()
    import torch.multiprocessing as mp

    if a.quiet_wait:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _quiet import wait_quiet

        wait_quiet(a.quiet_wait)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(worker, args=(a.nproc, port, a, q), nprocs=a.nproc, join=True, start_method="spawn")
    nparams, med, res, diff = q.get()
    print(f"# DDP step time, {nparams / 1e6:.1f} M parameters (float32, {nparams * 4 / 2**20:.0f} MiB of gradients), "
          f"{a.nproc} ranks, batch {a.batch}, {a.threads} torch thread(s) per rank, median of {a.rounds} rounds "
          f"x {a.steps} steps")
    for k in ("gloo", "tutti", "local"):
        print(f"{k:6s} {med[k] * 1e3:9.1f} ms/step   rounds: {', '.join(f'{x * 1e3:.1f}' for x in res[k])}")
    print(f"gloo / tutti step time: {med['gloo'] / med['tutti']:.2f}x; communication overhead over local: "
          f"gloo {(med['gloo'] - med['local']) * 1e3:.1f} ms, tutti {(med['tutti'] - med['local']) * 1e3:.1f} ms")
    print(f"max |param gloo - param tutti| after training: {diff:.3g}")


if __name__ == "__main__":
    main()

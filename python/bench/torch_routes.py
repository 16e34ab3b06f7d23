#!/usr/bin/env python3
"""Per-call cost of the torch backend's two routes: 8 B dist.all_reduce loops.

* ProcessGroup route (``init_process_group("tutti")``): a whole Python ProcessGroup
  (``tutti.torch.ProcessGroupTutti``), whose methods torch calls directly (it also
  registers a TuttiBackend on the same communicator for torch's per-device questions).
* Backend route (``"cpu:tutti"``, ``"cpu:tutti,cuda:nccl"``): a c10d Backend
  (``tutti.torch.TuttiBackend``) under torch's C++ ProcessGroup, reached through torch's
  dispatcher and its ``PyBackend`` trampoline (plus the hooks torch attaches to such a group).

Both groups live in the same processes (gloo as the default group, each route as a
``new_group`` over the same ranks). Each round times ``--iters`` back-to-back calls on
one route, then on the other, alternating which goes first; per call = elapsed / iters,
the maximum over ranks. Prints every round and the median and range per route, blocking
(``async_op=False``) and asynchronous (``async_op=True`` then ``wait()``).

    flock /work/bench.lock python bench/torch_routes.py [--nproc 2] [--rounds 7] [--iters 3000] [--fr]

``--fr`` adds a third group, the Backend route created with ``TORCH_FR_BUFFER_SIZE=0``
(torch then attaches no FlightRecorderHook to it): the flight recorder's per-call cost.
"""
import argparse
import os
import socket
import statistics
import sys
import time


def worker(rank, n, port, args, q):
    import torch
    import torch.distributed as dist

    import tutti.torch  # noqa: F401  registers "tutti"

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    ranks = list(range(n))
    groups = {"ProcessGroup": dist.new_group(ranks, backend="tutti"),
              "Backend": dist.new_group(ranks, backend="cpu:tutti")}
    if args.fr:  # the Backend route once more, without torch's FlightRecorderHook
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
        groups["Backend-noFR"] = dist.new_group(ranks, backend="cpu:tutti")
        del os.environ["TORCH_FR_BUFFER_SIZE"]
        hooked = dist.distributed_c10d._world.pg_flight_recorder_hooks
        assert groups["Backend"] in hooked and groups["Backend-noFR"] not in hooked
    kinds = {name: (type(g).__name__, type(g._get_backend(torch.device("cpu"))).__name__)
             for name, g in groups.items()}
    assert kinds == {"ProcessGroup": ("ProcessGroupTutti", "TuttiBackend"),
                     "Backend": ("ProcessGroup", "TuttiBackend"),
                     **({"Backend-noFR": ("ProcessGroup", "TuttiBackend")} if args.fr else {})}, kinds
    buf = torch.ones(2, dtype=torch.float32)  # 8 bytes

    def timed(g, async_op):
        for _ in range(200):
            dist.all_reduce(buf, group=g)
        dist.barrier()
        t0 = time.perf_counter()
        if async_op:
            for _ in range(args.iters):
                dist.all_reduce(buf, group=g, async_op=True).wait()
        else:
            for _ in range(args.iters):
                dist.all_reduce(buf, group=g)
        dt = (time.perf_counter() - t0) / args.iters
        t = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    res = {(name, a): [] for name in groups for a in (False, True)}
    for rd in range(args.rounds):
        order = list(groups)[rd % len(groups):] + list(groups)[:rd % len(groups)]
        if rd % 2:
            order.reverse()
        line = []
        for a in (False, True):
            for name in order:
                us = timed(groups[name], a) * 1e6
                res[(name, a)].append(us)
                line.append(f"{name}{' async' if a else ''} {us:.2f}")
        if rank == 0:
            print(f"round {rd}: " + ", ".join(line) + " us/call", flush=True)
    buf.fill_(float(rank + 1))
    ok = True
    for g in groups.values():
        b = torch.full((2,), float(rank + 1))
        dist.all_reduce(b, group=g)
        ok &= bool((b == n * (n + 1) / 2).all())
    dist.destroy_process_group()
    if rank == 0:
        q.put((res, ok))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--fr", action="store_true",
                    help="also time the Backend route without torch's flight recorder hook (TORCH_FR_BUFFER_SIZE=0)")
    ap.add_argument("--quiet-wait", type=float, default=0, help="wait up to this many seconds for an idle machine")
    a = ap.parse_args()
    import torch.multiprocessing as mp

    if a.quiet_wait:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _quiet import wait_quiet

        wait_quiet(a.quiet_wait)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    print(f"# dist.all_reduce of 8 B (2 float32, sum), {a.nproc} ranks, {a.iters} calls per round, "
          f"{a.rounds} alternating rounds; us per call (max over ranks)", flush=True)
    mp.start_processes(worker, args=(a.nproc, port, a, q), nprocs=a.nproc, join=True, start_method="spawn")
    res, ok = q.get()
    for (name, asy), xs in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{name:>12s} {'async+wait' if asy else 'blocking':>10s}: median {statistics.median(xs):7.2f} us "
              f"(min {min(xs):.2f}, max {max(xs):.2f})")
    for asy in (False, True):
        r = statistics.median(res[("Backend", asy)]) / statistics.median(res[("ProcessGroup", asy)])
        print(f"Backend / ProcessGroup ({'async+wait' if asy else 'blocking'}): {r:.2f}x")
        if a.fr:
            r = statistics.median(res[("Backend", asy)]) / statistics.median(res[("Backend-noFR", asy)])
            print(f"Backend / Backend-noFR ({'async+wait' if asy else 'blocking'}): {r:.2f}x")
    print("results checked:", "OK" if ok else "WRONG")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

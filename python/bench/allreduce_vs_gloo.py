#!/usr/bin/env python3
"""torch.distributed.all_reduce busbw, backend tutti vs gloo, in one run.

Both process groups live in the same processes (gloo as the default group, tutti as a
second group over the same ranks), and for every size the two backends are timed one
after the other, alternating which goes first, `--rounds` times; the table shows the
median of the rounds. Timing follows shared/peers/gloo_perf.py (nccl-tests style):
warmup, barrier, `iters` back-to-back blocking calls, elapsed/iters, the maximum over
ranks; busbw = size/time * 2(n-1)/n. Every size is checked for correctness after timing.

    python bench/allreduce_vs_gloo.py --nproc 2 [--sizes 8,64K,1M,16M,256M] [--rounds 3] [--csv out.csv]
"""
import argparse
import os
import socket
import statistics
import sys
import time


def parse_size(s):
    s = s.strip().upper()
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf):
            return int(float(s[:-1]) * m)
    return int(s)


def fmt_size(b):
    for suf, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m}{suf}"
    return f"{b}"


def schedule(nbytes):  # (warmup, iters), as gloo_perf.py, with more iterations for small sizes
    if nbytes <= 64 << 10:
        return 20, 200
    if nbytes <= 1 << 20:
        return 5, 40
    if nbytes <= 8 << 20:
        return 3, 15
    if nbytes <= 64 << 20:
        return 2, 6
    return 1, 3


def worker(rank, n, port, args, q):
    import torch
    import torch.distributed as dist

    import tutti.torch  # noqa: F401  registers "tutti"

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    groups = {"gloo": dist.group.WORLD, "tutti": dist.new_group(list(range(n)), backend="tutti")}
    factor = 2 * (n - 1) / n

    def timed(g, buf, nbytes):
        warm, iters = schedule(nbytes)
        for _ in range(warm):
            dist.all_reduce(buf, group=g)
        dist.barrier()
        per = []
        t0 = time.perf_counter()
        for _ in range(iters):
            a = time.perf_counter()
            dist.all_reduce(buf, group=g)
            per.append(time.perf_counter() - a)
        dt = (time.perf_counter() - t0) / iters
        per.sort()
        t = torch.tensor([dt, per[len(per) // 2]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t[0].item(), t[1].item()

    rows = []
    for size in args.sizes:
        count = max(size // 4, 1)
        buf = torch.full((count,), float(rank + 1), dtype=torch.float32)
        res = {"gloo": [], "tutti": []}
        for rd in range(args.rounds):
            order = ("gloo", "tutti") if rd % 2 == 0 else ("tutti", "gloo")
            for name in order:
                res[name].append(timed(groups[name], buf, size))
        ok = {}
        for name in ("gloo", "tutti"):
            buf.fill_(float(rank + 1))
            dist.all_reduce(buf, group=groups[name])
            ok[name] = bool((buf == n * (n + 1) / 2).all())
        if rank == 0:
            row = {"size": size}
            for name in ("gloo", "tutti"):
                t = statistics.median(x[0] for x in res[name])
                p50 = statistics.median(x[1] for x in res[name])
                row[name] = (t, p50, size / t / 1e9 * factor, ok[name])
            rows.append(row)
            g, u = row["gloo"], row["tutti"]
            print(f"{fmt_size(size):>6s}  gloo {g[0]*1e6:10.1f} us (p50 {g[1]*1e6:9.1f}) busbw {g[2]:7.3f}  |  "
                  f"tutti {u[0]*1e6:10.1f} us (p50 {u[1]*1e6:9.1f}) busbw {u[2]:7.3f}  |  "
                  f"tutti/gloo {u[2]/g[2]:7.1f}x  {'OK' if g[3] and u[3] else 'WRONG'}", flush=True)
        del buf
    dist.destroy_process_group()
    if rank == 0:
        q.put(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="8,64K,1M,16M,256M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--quiet-wait", type=float, default=0, help="wait up to this many seconds for an idle machine")
    a = ap.parse_args()
    a.sizes = [parse_size(s) for s in a.sizes.split(",")]
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
    print(f"# torch.distributed.all_reduce, float32 sum, {a.nproc} ranks, median of {a.rounds} alternating rounds; "
          f"busbw in GB/s", flush=True)
    mp.start_processes(worker, args=(a.nproc, port, a, q), nprocs=a.nproc, join=True, start_method="spawn")
    rows = q.get()
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("size_bytes,backend,time_us,p50_us,busbw_GBps,check\n")
            for r in rows:
                for name in ("gloo", "tutti"):
                    t, p50, bw, ok = r[name]
                    f.write(f"{r['size']},{name},{t*1e6:.2f},{p50*1e6:.2f},{bw:.4f},{'ok' if ok else 'wrong'}\n")
    bad = [r for r in rows if not (r["gloo"][3] and r["tutti"][3])]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

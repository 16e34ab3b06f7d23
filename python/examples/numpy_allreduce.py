#!/usr/bin/env python3
"""The numpy API in a few lines. Run it under any launcher:

    tutti run -n 4 -- python numpy_allreduce.py
    torchrun --nproc-per-node 4 numpy_allreduce.py
    python numpy_allreduce.py --spawn 4          # starts its own processes
"""
import argparse
import sys

import numpy as np


def main(rank=None, world_size=None, port=None):
    import tutti

    if port is None:
        comm = tutti.init_process_group()  # env://: tutti run, torchrun, Slurm, mpirun
    else:
        comm = tutti.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    r, n = tutti.rank(), tutti.world_size()
    x = np.full(1 << 20, r + 1, np.float32)
    tutti.all_reduce(x)  # in place, no copy, GIL released
    assert np.all(x == n * (n + 1) / 2)
    parts = tutti.all_gather(np.array([r, r * r], np.int64))
    assert parts.tolist() == [[q, q * q] for q in range(n)]
    w = tutti.broadcast(np.arange(5.0) if r == 0 else np.zeros(5), src=0, async_op=True)
    assert w.wait().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    print(f"rank {r}/{n} ({comm.local_rank()} on this host): numpy API OK", flush=True)
    tutti.destroy_process_group()


def _spawned(rank, n, port):
    main(rank, n, port)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--spawn", type=int, default=0, help="start this many local ranks with multiprocessing")
    a = ap.parse_args()
    if a.spawn:
        import multiprocessing as mp
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ps = [mp.get_context("spawn").Process(target=_spawned, args=(r, a.spawn, port)) for r in range(a.spawn)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        sys.exit(max(p.exitcode for p in ps))
    main()

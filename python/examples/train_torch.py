#!/usr/bin/env python3
"""Data-parallel training with torch DDP on backend tutti (or gloo), with the gradient
exchange of your choice. Runs under any launcher that sets the usual variables:

    tutti run -n 2 -- python train_torch.py --hook bf16
    torchrun --nproc-per-node 2 train_torch.py --hook topk --accum 4
    scripts/cluster.sh launch --prefix tr -- .venv/bin/python python/examples/train_torch.py --width 5000
    python train_torch.py                       # no launcher: one rank alone (the scaling baseline)

The task (the same as crates/tutti/examples/train_mlp.rs): 10 classes, each a fixed random
+-1 prototype of 64 inputs; a sample is its class's prototype times 0.15 plus uniform noise
in [-1, 1) per input. Each rank draws its own samples (seeded by rank and micro-step); the
model is an MLP 64 -> width (ReLU) x depth -> 10, softmax cross-entropy, SGD with momentum
(a layer's rate scaled by min(1, 256 / fan-in), so one --lr fits every --width).

--hook: none (DDP's own AllReduce on the backend), bf16 / fp16 (tutti.torch.hooks'
16-bit wire, f32 accumulation), topk (tutti.torch.hooks.topk_hook, --topk-ratio, error
feedback; --topk-warmup W: W dense synchronisations first; --topk-momentum M: Deep Gradient
Compression's momentum correction in the hook, and the optimizer without momentum),
torch-fp16 (torch's own fp16_compress_hook: casts to fp16 and sums in fp16).
--accum N: N micro-batches per optimizer step, the first N-1 under ddp.no_sync().

Communication share, decided here: before training, each rank times --probe optimizer steps
of the same model and micro-batches without DDP (no communication at all; every rank does it
at the same time, so the ranks share the machine as they do in training), and
comm_share = 1 - compute / step, with medians. That is the communication the backward pass
did not hide (plus DDP's own overhead), which is what the link costs the job.

Rank 0 prints one line per step (the loss averaged over ranks, the step time) and a final JSON
line (medians over the steps after the first two; the loss curve against wall time).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

INPUTS, CLASSES, SIGNAL = 64, 10, 0.15


def setup(backend):
    """Joins the job the launcher describes (TUTTI_*, torchrun's or Slurm's variables), or a
    one-rank group when there is none."""
    env = os.environ
    if "RANK" not in env and "TUTTI_RANK" in env:  # tutti run, scripts/cluster.sh launch
        env["RANK"], env["WORLD_SIZE"] = env["TUTTI_RANK"], env["TUTTI_WORLD_SIZE"]
        env.setdefault("MASTER_ADDR", env.get("TUTTI_MASTER_ADDR", "127.0.0.1"))
        env.setdefault("MASTER_PORT", env.get("TUTTI_MASTER_PORT", "29500"))
    if "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    if backend == "gloo" and "CLUSTER_HOST" in env:
        env.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # a namespace host's link, not loopback
    if backend == "tutti":
        import tutti.torch  # noqa: F401  registers the backend "tutti"
    dist.init_process_group(backend=backend)


def mlp(width, depth):
    layers, d = [], INPUTS
    for _ in range(depth):
        layers += [torch.nn.Linear(d, width), torch.nn.ReLU()]
        d = width
    return torch.nn.Sequential(*layers, torch.nn.Linear(d, CLASSES))


def optimizer(model, lr, momentum=0.9):
    groups = [{"params": list(m.parameters()), "lr": lr * min(1.0, 256 / m.in_features)}
              for m in model if isinstance(m, torch.nn.Linear)]
    return torch.optim.SGD(groups, lr=lr, momentum=momentum)


def batch(protos, rank, micro, rows):
    g = torch.Generator().manual_seed((rank << 40) ^ micro)
    labels = torch.randint(0, CLASSES, (rows,), generator=g)
    x = SIGNAL * protos[labels] + (2 * torch.rand(rows, INPUTS, generator=g) - 1)
    return x, labels


def hook_of(a, ddp):
    if a.hook == "none":
        return
    if a.hook == "torch-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    if a.backend != "tutti":
        raise SystemExit(f"--hook {a.hook} needs --backend tutti")
    from tutti.torch import hooks
    if a.hook == "bf16":
        ddp.register_comm_hook(None, hooks.bf16_wire_hook)
    elif a.hook == "fp16":
        ddp.register_comm_hook(None, hooks.fp16_wire_hook)
    else:
        state = hooks.TopKState(ratio=a.topk_ratio, warmup_steps=a.topk_warmup, momentum=a.topk_momentum)
        ddp.register_comm_hook(state, hooks.topk_hook)


def steps(a, net, opt, protos, rank, n_steps, micro0, ddp=None, on_step=None):
    """Runs `n_steps` optimizer steps of `a.accum` micro-batches; returns step times (s)."""
    times, micro = [], micro0
    for step in range(n_steps):
        t0 = time.perf_counter()
        loss_sum = 0.0
        opt.zero_grad(set_to_none=False)
        for m in range(a.accum):
            x, y = batch(protos, rank, micro, a.batch)
            micro += 1
            last = m == a.accum - 1
            ctx = ddp.no_sync() if (ddp is not None and not last) else _null()
            with ctx:
                loss = torch.nn.functional.cross_entropy(net(x), y) / a.accum
                loss.backward()
            loss_sum += loss.item()
        opt.step()
        times.append(time.perf_counter() - t0)
        if on_step:
            on_step(step, loss_sum, times[-1])
    return times


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="tutti", choices=["tutti", "gloo"])
    ap.add_argument("--hook", default="none", choices=["none", "bf16", "fp16", "topk", "torch-fp16"])
    ap.add_argument("--topk-ratio", type=float, default=0.01)
    ap.add_argument("--topk-warmup", type=int, default=0, help="--hook topk: dense synchronisations first")
    ap.add_argument("--topk-momentum", type=float, default=None,
                    help="--hook topk: DGC's momentum correction in the hook (the optimizer then takes plain "
                         "SGD steps)")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per rank and micro-batch")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--probe", type=int, default=5, help="steps without communication, to time the compute")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.topk_momentum is not None and a.hook != "topk":
        raise SystemExit("--topk-momentum needs --hook topk")
    torch.set_num_threads(1)
    setup(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    protos = (torch.rand(CLASSES, INPUTS, generator=torch.Generator().manual_seed(7)) < 0.5).float() * 2 - 1

    # The compute alone: the same model and steps, no DDP, no communication.
    torch.manual_seed(0)
    probe = mlp(a.width, a.depth)
    compute = steps(a, probe, optimizer(probe, a.lr), protos, rank, a.probe, 1 << 30)
    del probe

    torch.manual_seed(0)
    model = mlp(a.width, a.depth)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    hook_of(a, ddp)
    # With momentum correction the hook applies the momentum; the optimizer must not again.
    opt = optimizer(ddp.module, a.lr, 0.0 if a.topk_momentum is not None else 0.9)
    curve, start = [], time.perf_counter()
    if rank == 0:
        print(f"train_torch: {n} ranks, backend {a.backend}, hook {a.hook}, {params} parameters, accum {a.accum}, "
              f"batch {a.batch} per rank and micro-batch", flush=True)

    def on_step(step, loss, dt):
        t = torch.tensor([loss])
        dist.all_reduce(t)  # the mean loss over ranks (outside the step's timing)
        curve.append((time.perf_counter() - start, t.item() / n))
        if rank == 0 and not a.quiet:
            print(f"step {step:4d}  loss {curve[-1][1]:.4f}  step {1e3 * dt:8.1f} ms", flush=True)

    times = steps(a, ddp, opt, protos, rank, a.steps, 0, ddp=ddp, on_step=on_step)
    skip = min(2, len(times) - 1)
    step_ms = 1e3 * statistics.median(times[skip:])
    compute_ms = 1e3 * statistics.median(compute[min(1, len(compute) - 1):])
    if rank == 0:
        tail = [l for _, l in curve[-5:]]
        print(json.dumps({
            "example": "train_torch", "backend": a.backend, "hook": a.hook,
            "topk_ratio": a.topk_ratio if a.hook == "topk" else None,
            "topk_warmup": a.topk_warmup if a.hook == "topk" else None,
            "topk_momentum": a.topk_momentum if a.hook == "topk" else None, "ranks": n, "params": params,
            "accum": a.accum, "batch": a.batch, "steps": a.steps, "step_ms": round(step_ms, 2),
            "compute_ms": round(compute_ms, 2), "comm_share": round(max(0.0, 1 - compute_ms / step_ms), 4),
            "loss_first": round(curve[0][1], 5), "loss_last5": round(sum(tail) / len(tail), 5),
            "curve": [[round(t, 3), round(l, 5)] for t, l in curve],
        }), flush=True)
    # Every rank leaves together, and DDP (with its hook's state and pending work) goes before
    # its process group: otherwise a rank can tear the group down while a peer still needs it.
    dist.barrier()
    del ddp, opt, model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

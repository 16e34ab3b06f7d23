"""DistributedDataParallel on backend "tutti": a small MLP trained 50 steps on 2 and 4 ranks.
After every step the parameters are bitwise identical on all ranks, and at the end they match
the same run on Gloo (same seed, same data) within float tolerance."""

import os

import pytest

pytest.importorskip("torch")

from harness import check_all, spawn  # noqa: E402

STEPS = 50


def mlp():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 4),
    )


def train(rank, n, pg, check_pg, steps):
    """Trains on `pg`; after each step compares parameters across ranks through `check_pg`.
    Returns (final flat parameters, list of steps where ranks differed, losses)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1234 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = mlp()
    # small buckets: several all-reduces per backward, overlapping it
    ddp = DDP(model, process_group=pg, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(99 + rank)  # different data on each rank
    w_true = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))  # a target to learn
    diverged, losses = [], []
    for step in range(steps):
        x = torch.randn(32, 16, generator=gen)
        y = torch.tanh(x @ w_true)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(every, flat, group=check_pg)
        if not all(torch.equal(every[0], e) for e in every):
            diverged.append(step)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), diverged, losses


def f_ddp(rank, n, port, steps):
    import datetime

    import torch
    import torch.distributed as dist

    import tutti.torch  # noqa: F401

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))
    tg = dist.new_group(list(range(n)), backend="tutti")
    assert dist.get_backend(tg) == "tutti"
    p_tutti, div_tutti, loss_tutti = train(rank, n, tg, dist.group.WORLD, steps)
    p_gloo, div_gloo, loss_gloo = train(rank, n, dist.group.WORLD, tg, steps)
    diff = (p_tutti - p_gloo).abs().max().item()
    dist.destroy_process_group()
    return div_tutti, div_gloo, diff, loss_tutti[0], loss_tutti[-1], p_tutti.numel()


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_mlp_matches_gloo(n):
    out = check_all(spawn(n, f_ddp, STEPS, timeout=600), f"ddp n={n}")
    for rank, (div_tutti, div_gloo, diff, first, last, nparams) in enumerate(out):
        assert not div_tutti, f"rank {rank}: parameters differed across ranks after steps {div_tutti} (tutti)"
        assert not div_gloo, f"rank {rank}: parameters differed across ranks after steps {div_gloo} (gloo)"
        assert diff < 1e-4, f"rank {rank}: tutti and gloo runs differ by {diff}"
        assert last < first, "the model did not learn"
    print(f"\nDDP n={n}: {nparams} parameters, {STEPS} steps, identical on all ranks after every step; "
          f"max |tutti - gloo| = {max(o[2] for o in out):.3g}; loss {out[0][3]:.4f} -> {out[0][4]:.4f}")


def f_torch_timeout(rank, n, port):
    import datetime
    import time

    import torch
    import torch.distributed as dist

    import tutti
    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=2))
    dist.barrier()
    if rank == 1:
        time.sleep(8)
        return None
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(3))
    except tutti.TimeoutError as e:
        return time.monotonic() - t0, str(e)
    raise AssertionError("the group timeout was not honoured")


def test_torch_group_timeout_is_honoured():
    out = check_all(spawn(2, f_torch_timeout, timeout=90), "torch timeout")
    took, msg = out[0]
    assert 1.5 < took < 15, (took, msg)
    assert "timeout" in msg


def f_torch_killed(rank, n, port):
    import time

    import torch
    import torch.distributed as dist

    import tutti
    import tutti.torch  # noqa: F401

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n)
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == n - 1:
        os._exit(1)
    t0 = time.monotonic()
    try:
        for _ in range(10000):
            dist.all_reduce(t, async_op=True).wait()
    except tutti.TuttiError as e:
        return type(e).__name__, time.monotonic() - t0
    raise AssertionError("no error after a rank died")


def test_torch_killed_rank_raises():
    out = spawn(3, f_torch_killed, timeout=120)
    assert out[2] is None
    for r in (0, 1):
        assert out[r] is not None and out[r][0], out[r]
        name, took = out[r][1]
        assert name in ("PeerLostError", "AbortedError"), name
        assert took < 30


def f_powersgd(rank, n, port):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tutti.torch  # noqa: F401

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n)
    torch.manual_seed(0)
    model = mlp()
    ddp = DDP(model)
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(6):
        loss = ddp(torch.randn(32, 16, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(every, flat)
    assert all(torch.equal(every[0], e) for e in every)
    dist.destroy_process_group()
    return True


def test_ddp_powersgd_hook():
    """PowerSGD waits on futures inside future callbacks: no deadlock, ranks agree."""
    check_all(spawn(2, f_powersgd, timeout=240), "powerSGD")

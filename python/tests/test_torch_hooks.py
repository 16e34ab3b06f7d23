"""DDP communication hooks of tutti.torch.hooks (issue 41) on 1-4 ranks: the 16-bit wire
hooks give the f32 reference gradients within the wire's bound (from the rank count and
the type), with and without ``no_sync()`` accumulation; Top-K with error feedback loses
nothing (what was sent plus what is held back is the sum of the gradients), also across
DDP's bucket rebuild; a group that is not tutti's is a clear error."""

import pytest

pytest.importorskip("torch")

U = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}
HOOKS = {"bf16": "bf16_wire_hook", "f16": "fp16_wire_hook"}


def _model():
    import torch

    torch.manual_seed(5)  # the same weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 3))


def _batch(rank, step, micro=0):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(16, 8, generator=g), torch.randn(16, 3, generator=g)


def _local_grads(model, batches):
    """Every parameter's gradient (float64) of `model` summed over `batches`, without DDP."""
    import copy

    import torch

    m = copy.deepcopy(model)
    m.zero_grad()
    for x, y in batches:
        torch.nn.functional.mse_loss(m(x), y).backward()
    return [p.grad.detach().double().clone() for p in m.parameters()]


def _ddp(model, dist):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # small buckets: several hooks per backward
    return DDP(model, bucket_cap_mb=0.002)


def _accumulating_steps(model, ddp, n, r, steps):
    """Runs `steps` DDP steps on this rank's batches, step 1 accumulating two
    micro-batches under `no_sync`; yields (step, every rank's local gradients)
    after each backward, for the caller to compare with the synced ones."""
    import torch

    for step in range(steps):
        micros = 2 if step == 1 else 1
        every = [[_batch(q, step, m) for m in range(micros)] for q in range(n)]
        per_rank = [_local_grads(model, b) for b in every]
        ddp.zero_grad()
        for m, (x, y) in enumerate(every[r]):
            if m + 1 < micros:
                with ddp.no_sync():
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        yield step, per_rank


def w_wire_hook(ctx, wire):
    import torch

    import tutti.torch.hooks as hooks

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    model = _model()
    ddp = _ddp(model, dist)
    ddp.register_comm_hook(None, getattr(hooks, HOOKS[wire]))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    u = U[wire]
    factor = (1 + u) ** (n + 1) - 1 + n * 2.0 ** -24
    for step in range(4):
        micros = 2 if step % 2 else 1  # odd steps accumulate two micro-batches with no_sync()
        every = [[_batch(q, step, m) for m in range(micros)] for q in range(n)]
        # each micro-batch's gradient, per rank: the reference sums them, and the sum of their
        # magnitudes bounds the rounding (of the accumulation too)
        per_batch = [[_local_grads(model, [b]) for b in bs] for bs in every]
        opt.zero_grad()
        for m, (x, y) in enumerate(every[r]):
            if m + 1 < micros:
                with ddp.no_sync():
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        for i, p in enumerate(model.parameters()):
            want = sum(g[i] for gs in per_batch for g in gs) / n
            mag = sum(g[i].abs() for gs in per_batch for g in gs) / n
            err = (p.grad.double() - want).abs()
            bound = factor * mag
            assert torch.all(err <= bound), (f"{wire} step {step} param {i}: error {err.max().item():.3g} above the "
                                             f"bound {bound.flatten()[err.flatten().argmax()].item():.3g}")
        opt.step()
    # the parameters stay identical on every rank
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    got = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(got, flat)
    assert all(torch.equal(got[0], g) for g in got)
    return True


class _Route:
    """Forces the route of topk_hook ("gather" or "dense"; None: the cost model's) while
    in effect: the two must give the same averages."""

    def __init__(self, route):
        self.route = route

    def __enter__(self):
        from tutti import _native

        self.saved = _native._sparse_route
        if self.route is not None:
            _native._sparse_route = lambda comm, k, n: self.route
        return self

    def __exit__(self, *exc):
        from tutti import _native

        _native._sparse_route = self.saved


def w_topk_all(ctx, route):
    with _Route(route):
        return _topk_all(ctx)


def _topk_all(ctx):
    """ratio=1: Top-K sends everything, so the hook is the plain average (no_sync too)."""
    import torch

    from tutti.torch.hooks import TopKState, topk_hook

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    model = _model()
    ddp = _ddp(model, dist)
    ddp.register_comm_hook(TopKState(ratio=1.0), topk_hook)
    for step, per_rank in _accumulating_steps(model, ddp, n, r, 3):
        for i, p in enumerate(model.parameters()):
            want = sum(g[i] for g in per_rank) / n
            torch.testing.assert_close(p.grad.double(), want, rtol=1e-5, atol=1e-6)
    return True


def w_topk_error_feedback(ctx, ratio, route):
    with _Route(route):
        return _topk_error_feedback(ctx, ratio)


def _topk_error_feedback(ctx, ratio):
    """Nothing is lost: the sum over steps of the averaged gradients the hook produced,
    plus the average of what every rank holds back, is the average of every gradient."""
    import torch

    from tutti.torch.hooks import TopKState, topk_hook

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    model = _model()
    ddp = _ddp(model, dist)
    state = TopKState(ratio=ratio)
    ddp.register_comm_hook(state, topk_hook)
    params = list(model.parameters())
    got_sum = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    want_sum = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    held_back = False
    for step in range(5):  # the parameters stay fixed: gradients of different data
        every = [[_batch(q, step)] for q in range(n)]
        per_rank = [_local_grads(model, b) for b in every]
        ddp.zero_grad()
        x, y = every[r][0]
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        for i, p in enumerate(params):
            got_sum[i] += p.grad.double()
            want_sum[i] += sum(g[i] for g in per_rank) / n
            if step == 0 and not torch.allclose(p.grad.double(), sum(g[i] for g in per_rank) / n):
                held_back = True
    assert held_back or ratio == 1.0, "Top-K sent everything"
    res = state.residuals()
    assert set(res) == set(params), "every parameter has a residual"
    for i, p in enumerate(params):
        mean_res = res[p].clone()
        dist.all_reduce(mean_res, op=dist.ReduceOp.AVG)
        torch.testing.assert_close(got_sum[i] + mean_res.double(), want_sum[i], rtol=1e-5, atol=1e-5)
    return True


def w_topk_warmup(ctx):
    """TopKState(warmup_steps=2): the first two synchronisations are the plain average
    (nothing held back), the third holds back; accumulation counts as one."""
    import torch

    from tutti.torch.hooks import TopKState, topk_hook

    ctx.dist()
    n, r = ctx.n, ctx.rank
    model = _model()
    ddp = _ddp(model, None)
    state = TopKState(ratio=0.05, warmup_steps=2)
    ddp.register_comm_hook(state, topk_hook)
    for step, per_rank in _accumulating_steps(model, ddp, n, r, 3):
        assert state.syncs == step + 1, (state.syncs, step)
        dense = all(torch.allclose(p.grad.double(), sum(g[i] for g in per_rank) / n, rtol=1e-5, atol=1e-6)
                    for i, p in enumerate(model.parameters()))
        assert dense == (step < 2), f"step {step}: dense {dense}"
        held = sum(float(v.abs().sum()) for v in state.residuals().values())
        assert (held == 0.0) == (step < 2), f"step {step}: held back {held}"
    return True


def w_topk_momentum(ctx, warmup):
    """TopKState(momentum=0.9): per rank and step, the velocity and the residual move as
    DGC's momentum correction says (u = m u + g; v += u; both zeroed where sent, u kept
    during the dense warm-up), across DDP's bucket rebuild, and the synced gradient is the
    average over ranks of what each sent."""
    import torch

    from tutti.torch.hooks import TopKState, topk_hook

    dist = ctx.dist()
    n, r, m = ctx.n, ctx.rank, 0.9
    model = _model()
    ddp = _ddp(model, dist)
    state = TopKState(ratio=0.05, momentum=m, warmup_steps=warmup)
    ddp.register_comm_hook(state, topk_hook)
    params = list(model.parameters())
    zeros = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    held_back = False
    for step in range(4):  # the parameters stay fixed: gradients of different data
        res0, vel0 = state.residuals(), state.velocities()
        u0 = [vel0[p].double() if p in vel0 else z for p, z in zip(params, zeros)]
        v0 = [res0[p].double() if p in res0 else z for p, z in zip(params, zeros)]
        g = _local_grads(model, [_batch(r, step)])
        ddp.zero_grad()
        x, y = _batch(r, step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        res1, vel1 = state.residuals(), state.velocities()
        warm = step < warmup
        for i, p in enumerate(params):
            u1 = m * u0[i] + g[i]
            folded = v0[i] + u1
            v_after, u_after = res1[p].double(), vel1[p].double()
            sent = (v_after == 0) & (folded != 0)
            if warm:
                assert bool(sent.all()), f"step {step}: the warm-up held something back"
            elif not bool(sent.all()):
                held_back = True
            want_u = u1 if warm else torch.where(sent, torch.zeros_like(u1), u1)
            torch.testing.assert_close(u_after, want_u, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(v_after, torch.where(sent, torch.zeros_like(folded), folded),
                                       rtol=1e-5, atol=1e-6)
            every = torch.where(sent, folded, torch.zeros_like(folded))
            dist.all_reduce(every)
            torch.testing.assert_close(p.grad.double(), every / n, rtol=1e-5, atol=1e-6)
    assert held_back, "Top-K sent everything"
    return True


def w_not_a_tutti_group(ctx):
    import torch

    from tutti.torch.hooks import TopKState, bf16_wire_hook, topk_hook

    dist = ctx.dist()
    gloo = dist.new_group(list(range(ctx.n)), backend="gloo")
    try:
        for call in (lambda: bf16_wire_hook(gloo, None), lambda: topk_hook(TopKState(process_group=gloo), None)):
            try:
                call()
            except TypeError as e:
                assert "gloo" in str(e) and "tutti" in str(e), str(e)
            else:
                raise AssertionError("a gloo group was accepted")
        try:
            topk_hook(None, None)
        except TypeError as e:
            assert "TopKState" in str(e)
        else:
            raise AssertionError("topk_hook without a TopKState was accepted")
        # and inside DDP: the error reaches backward()
        model = _model()
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, process_group=gloo)
        ddp.register_comm_hook(gloo, bf16_wire_hook)
        x, y = _batch(ctx.rank, 0)
        try:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        except Exception as e:  # noqa: BLE001 - torch wraps the hook's error
            assert "backend 'gloo'" in str(e), str(e)
        else:
            raise AssertionError("DDP on gloo with a tutti hook did not fail")
    finally:
        dist.destroy_process_group(gloo)
    return True


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["bf16", "f16"])
def test_wire_hook_matches_f32_within_bound(ranks, wire):
    ranks.run(w_wire_hook, wire)


@pytest.mark.parametrize("route", ["gather", "dense"])
def test_topk_hook_ratio_one_is_the_average(ranks, route):
    ranks.run(w_topk_all, route)


@pytest.mark.parametrize("ratio,route", [(0.05, None), (0.3, "dense")])
def test_topk_hook_error_feedback_loses_nothing(ranks, ratio, route):
    ranks.run(w_topk_error_feedback, ratio, route)


def test_topk_hook_warmup_sends_dense(ranks):
    ranks.run(w_topk_warmup)


@pytest.mark.parametrize("warmup", [0, 2])
def test_topk_hook_momentum_correction(ranks, warmup):
    ranks.run(w_topk_momentum, warmup)


def test_topk_state_momentum_rules():
    from tutti.torch.hooks import TopKState

    for bad in (dict(momentum=1.0), dict(momentum=-0.1), dict(momentum=0.5, error_feedback=False)):
        with pytest.raises(ValueError, match="momentum"):
            TopKState(**bad)


def test_hooks_reject_other_groups(ranks):
    ranks.run(w_not_a_tutti_group)


def f_backend_route(rank, n, port):
    """On a "cpu:tutti" group (torch's ProcessGroup with tutti's c10d backend for cpu) the
    hooks find the communicator through the group's cpu backend."""
    import os

    import torch
    import torch.distributed as dist

    import tutti.torch  # noqa: F401
    from tutti.torch.hooks import TopKState, fp16_wire_hook, topk_hook

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("cpu:tutti", rank=rank, world_size=n)
    try:
        errs = []
        for hook, state in ((fp16_wire_hook, None), (topk_hook, TopKState(ratio=1.0))):
            model = _model()
            ddp = _ddp(model, dist)
            ddp.register_comm_hook(state, hook)
            x, y = _batch(rank, 0)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            per_rank = [_local_grads(model, [_batch(q, 0)]) for q in range(n)]
            errs.append(max((p.grad.double() - sum(g[i] for g in per_rank) / n).abs().max().item()
                            for i, p in enumerate(model.parameters())))
        return errs
    finally:
        dist.destroy_process_group()


def test_hooks_on_the_backend_route():
    from harness import check_all, spawn

    for errs in check_all(spawn(2, f_backend_route, timeout=120), "hooks on cpu:tutti"):
        assert errs[0] < 1e-3 and errs[1] < 1e-6, errs

"""FSDP2 and DTensor tensor parallel on backend "tutti": the examples
(python/examples/fsdp2_transformer.py, tp_dtensor.py) on 2 and 4 ranks, their losses
against gloo's, and every collective they issue run as one native tutti op.

How "native" is checked: in each tutti worker, every collective entry point of
ProcessGroupTutti (the methods torch's C++ side calls, coalesced forms included) is
wrapped to count its calls, and each group's native entry (``_call``, one tutti
collective) to count the tutti ops each of those calls issued and of which kind. A call
served by a per-tensor Python loop issues several ops; one served by a fallback issues an
op of another kind (an all-reduce standing in for a reduce-scatter). Fresh processes per
test (harness.spawn)."""

import collections
import importlib.util
import os
import subprocess
import sys
import threading

import pytest

from harness import check_all, spawn

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
STEPS = 4
RTOL = 1e-4  # the examples' tolerance

# The tutti op each collective entry point must issue (codes of tutti._codes), once per call.
EXPECTED = {
    "allreduce": "ALL_REDUCE",
    "allreduce_coalesced": "ALL_REDUCE",
    "broadcast": "BROADCAST",
    "reduce": "REDUCE",
    "allgather": "ALL_GATHER",
    "allgather_coalesced": "ALL_GATHER",
    "all_gather_single": "ALL_GATHER",
    "_allgather_base": "ALL_GATHER",
    "allgather_into_tensor_coalesced": "ALL_GATHER",
    "all_gather_single_coalesced": "ALL_GATHER",
    "reduce_scatter": ("REDUCE_SCATTER", "ALL_TO_ALL_V"),  # uneven blocks: an all-to-all-v, reduced locally
    "reduce_scatter_single": "REDUCE_SCATTER",
    "_reduce_scatter_base": "REDUCE_SCATTER",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER",
    "reduce_scatter_single_coalesced": "REDUCE_SCATTER",
    "alltoall": ("ALL_TO_ALL", "ALL_TO_ALL_V"),
    "alltoall_base": ("ALL_TO_ALL", "ALL_TO_ALL_V"),
    "all_to_all_single": ("ALL_TO_ALL", "ALL_TO_ALL_V"),
    "gather": "GATHER",
    "gather_single": "GATHER",
    "scatter": "SCATTER",
    "barrier": "BARRIER",
}


def instrument():
    """Wraps ProcessGroupTutti's collective entry points and each group's native `_call`
    in this process; returns (calls, ops): calls[name] counts the entry's calls (the
    outermost, when one entry calls another), ops[(name, kind)] the tutti ops they issued."""
    from tutti import _codes as C
    from tutti.torch import ProcessGroupTutti

    kinds = {getattr(C, k): k for k in ("ALL_REDUCE", "BROADCAST", "REDUCE", "ALL_GATHER", "REDUCE_SCATTER",
                                        "ALL_TO_ALL", "ALL_TO_ALL_V", "GATHER", "SCATTER", "BARRIER")}
    calls, ops = collections.Counter(), collections.Counter()
    local = threading.local()
    init = ProcessGroupTutti.__init__

    def counted_init(self, *a, **k):
        init(self, *a, **k)
        native = self._call

        def call(kind, *rest, **kw):
            ops[(getattr(local, "op", None) or "outside an entry point", kinds.get(kind, kind))] += 1
            return native(kind, *rest, **kw)

        self._call = call

    ProcessGroupTutti.__init__ = counted_init
    for name in EXPECTED:
        f = getattr(ProcessGroupTutti, name, None)
        if f is None:
            continue

        def entry(self, *a, _f=f, _name=name, **k):
            outer = getattr(local, "op", None)
            if outer is None:
                local.op = _name
                calls[_name] += 1
            try:
                return _f(self, *a, **k)
            finally:
                if outer is None:
                    local.op = None

        setattr(ProcessGroupTutti, name, entry)
    return calls, ops


def native_problems(calls, ops):
    """What in the counts is not one native op of the right kind per call."""
    problems = []
    for (name, kind), k in ops.items():
        want = EXPECTED.get(name)
        if want is None:
            problems.append(f"{k} {kind} op(s) {name}")
        elif kind not in (want if isinstance(want, tuple) else (want,)):
            problems.append(f"{name} issued {k} {kind} op(s), not {want} (a fallback)")
    for name, k in calls.items():
        issued = sum(v for (nm, _), v in ops.items() if nm == name)
        if issued != k:
            problems.append(f"{name}: {k} call(s) issued {issued} tutti op(s) (a per-tensor loop?)")
    return problems


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def f_train(rank, n, port, example, backend, kwargs):
    """One rank of `example`'s training on `backend`: (losses, entry-point calls, ops)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    mod = _example(example)
    calls, ops = instrument() if backend == "tutti" else ({}, {})
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))
    try:
        losses = mod.train(STEPS, **kwargs)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return losses, dict(calls), dict(ops)


def train_both(n, example, **kwargs):
    """Trains `example` on tutti and on gloo; checks the losses agree, within tolerance,
    across backends and ranks; returns tutti's per-rank results."""
    tutti = check_all(spawn(n, f_train, example, "tutti", kwargs, timeout=240), f"{example} on tutti")
    gloo = check_all(spawn(n, f_train, example, "gloo", kwargs, timeout=240), f"{example} on gloo")
    mod = _example(example)
    ref = tutti[0][0]
    assert len(ref) == STEPS
    for r in range(n):
        worst, ok = mod.agree(tutti[r][0], gloo[r][0], RTOL)
        assert ok, f"rank {r}: tutti losses {tutti[r][0]} differ from gloo's {gloo[r][0]} (max rel diff {worst:.2e})"
        assert tutti[r][0] == ref, f"rank {r}'s losses differ from rank 0's: {tutti[r][0]} vs {ref}"
    return tutti


def check_native(results, must_issue):
    """Every rank's entry points issued one native op of their kind per call, and some
    issued each kind of tutti op in `must_issue` (a tuple: any of them)."""
    for r, (_, calls, ops) in enumerate(results):
        problems = native_problems(calls, ops)
        assert not problems, f"rank {r}: " + "; ".join(problems) + f" (calls {calls}, ops {ops})"
        kinds = {kind for (_, kind) in ops}
        missing = [m for m in must_issue if not kinds & set(m if isinstance(m, tuple) else (m,))]
        assert not missing, f"rank {r}: issued no {missing}; calls {calls}"


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_transformer(n):
    """fully_shard training: the parameters all-gathered and the gradients reduce-scattered
    (all_gather_into_tensor, reduce_scatter_tensor), each call one tutti op; losses equal
    gloo's within tolerance."""
    res = train_both(n, "fsdp2_transformer")
    check_native(res, ["ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE"])


def test_fsdp2_mixed_precision():
    """fully_shard with MixedPrecisionPolicy (bfloat16 parameters all-gathered, float32
    gradients reduce-scattered) on 2 ranks: losses equal gloo's within tolerance."""
    res = train_both(2, "fsdp2_transformer", bf16=True)
    check_native(res, ["ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE"])


def test_hsdp_transformer():
    """HSDP on 4 ranks (fully_shard on a 2 x 2 mesh): subgroups; gradients reduce-scattered
    within a replica, all-reduced across the two."""
    res = train_both(4, "fsdp2_transformer", replicas=2)
    check_native(res, ["ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE"])


@pytest.mark.parametrize("n", [2, 4])
def test_tp_dtensor_sequence_parallel(n):
    """parallelize_module with ColwiseParallel / RowwiseParallel / SequenceParallel: the
    activations all-gathered and reduce-scattered, the replicated gradients all-reduced,
    all_to_all_single (even and uneven) in the reshard check; losses equal gloo's."""
    res = train_both(n, "tp_dtensor", sequence_parallel=True)
    check_native(res, ["ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE", "ALL_TO_ALL", "ALL_TO_ALL_V"])


def test_tp_dtensor_replicated_activations():
    """Plain tensor parallel (activations replicated): row-wise outputs all-reduced."""
    res = train_both(2, "tp_dtensor", sequence_parallel=False)
    check_native(res, ["ALL_REDUCE", "ALL_GATHER"])


def f_functional_coalesced(rank, n, port):
    """The coalesced functional collectives (torch.distributed._functional_collectives),
    which DTensor and torch.compile'd code issue, each one tutti op per batch."""
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    calls, ops = instrument()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("tutti", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    g = dist.group.WORLD
    # torch 2.15 names them *_single_coalesced; older releases *_into_tensor_coalesced / *_tensor_coalesced
    ag = getattr(funcol, "all_gather_single_coalesced", None) or funcol.all_gather_into_tensor_coalesced
    rs = getattr(funcol, "reduce_scatter_single_coalesced", None) or funcol.reduce_scatter_tensor_coalesced
    tot = n * (n + 1) // 2
    for sizes in ([3, 5, 2], [7]):  # a batch of three, and a batch of one (the single-tensor path)
        ins = [torch.arange(s, dtype=torch.float32) + 100 * rank + 10 * j for j, s in enumerate(sizes)]
        outs = [funcol.wait_tensor(t) for t in ag(ins, g)]
        for j, (o, s) in enumerate(zip(outs, sizes)):
            want = torch.cat([torch.arange(s, dtype=torch.float32) + 100 * r + 10 * j for r in range(n)])
            assert torch.equal(o, want), (j, o, want)
        ins = [torch.arange(n * s, dtype=torch.float32) * (rank + 1) + j for j, s in enumerate(sizes)]
        outs = [funcol.wait_tensor(t) for t in rs(ins, "sum", [0] * len(sizes), g)]
        for j, (o, s) in enumerate(zip(outs, sizes)):
            full = torch.arange(n * s, dtype=torch.float32) * tot + n * j
            assert torch.equal(o, full[rank * s:(rank + 1) * s]), (j, o, full)
    ts = [torch.full((s,), float(rank + 1)) for s in (3, 5, 2)]
    outs = [funcol.wait_tensor(t) for t in funcol.all_reduce_coalesced(ts, "sum", g)]
    assert all(torch.equal(t, torch.full_like(t, float(tot))) for t in outs), outs
    # the single-tensor functional forms (what DTensor issues), 2-D, gathered along dim 1
    x = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank
    got = funcol.wait_tensor(funcol.all_gather_tensor(x, 1, g))
    assert torch.equal(got, torch.cat([torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * r
                                       for r in range(n)], dim=1)), got
    y = torch.ones(2 * n, 3) * (rank + 1)
    got = funcol.wait_tensor(funcol.reduce_scatter_tensor(y, "avg", 0, g))
    assert torch.equal(got, torch.full((2, 3), (n + 1) / 2)), got
    # the list form with uneven blocks (block q has q + 1 elements): one all-to-all-v
    sizes = [q + 1 for q in range(n)]
    blocks = list((torch.arange(sum(sizes), dtype=torch.float32) * (rank + 1)).split(sizes))
    out = torch.empty(sizes[rank])
    dist.reduce_scatter(out, blocks)
    lo = sum(sizes[:rank])
    assert torch.equal(out, torch.arange(lo, lo + sizes[rank], dtype=torch.float32) * tot), out
    dist.barrier()
    # the checker's own check: the legacy multi-tensor form loops over its tensors, and is caught
    seen = (dict(calls), dict(ops))
    calls.clear()
    ops.clear()
    g.allreduce([torch.ones(2), torch.ones(3)]).wait()
    caught = native_problems(calls, ops)
    dist.destroy_process_group()
    return seen[0], seen[1], caught


@pytest.mark.parametrize("n", [2, 4])
def test_functional_coalesced(n):
    """torch's functional collectives, coalesced and single, each call one tutti op."""
    res = check_all(spawn(n, f_functional_coalesced, timeout=120), "functional coalesced")
    for r, (calls, ops, caught) in enumerate(res):
        assert caught == ["allreduce: 1 call(s) issued 2 tutti op(s) (a per-tensor loop?)"], caught
        problems = native_problems(calls, ops)
        assert not problems, f"rank {r}: " + "; ".join(problems) + f" (calls {calls}, ops {ops})"
        # 2 batches + 1 single-tensor call each (functional single calls arrive as batches of one)
        for m in (("allgather_into_tensor_coalesced", "all_gather_single_coalesced", "all_gather_single",
                   "_allgather_base"),
                  ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced", "reduce_scatter_single",
                   "_reduce_scatter_base")):
            assert sum(calls.get(name, 0) for name in m) == 3, (m, calls)
        assert calls.get("allreduce_coalesced") == 1, calls
        assert calls.get("reduce_scatter") == 1 and ops.get(("reduce_scatter", "ALL_TO_ALL_V")) == 1, (calls, ops)


@pytest.mark.parametrize("example", ["fsdp2_transformer"])
def test_example_command_line(example):
    """An example as documented: --spawn 2 on tutti, compared with gloo (tp_dtensor's
    command line is the same code; its training runs above; left out for CI's time)."""
    cmd = [sys.executable, os.path.join(EXAMPLES, example + ".py"), "--spawn", "2", "--steps", "3",
           "--compare", "gloo"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-4000:]}"
    assert "tutti on 2 ranks" in p.stdout and "losses match the one-process reference" in p.stdout, p.stdout[-4000:]
    assert "tutti and gloo losses match" in p.stdout, p.stdout[-4000:]


def t_uneven_reduce_scatter(ctx, dtype):
    """dist.reduce_scatter with uneven blocks (block q has q + 2 elements), every op,
    against numpy references (the checks of test_torch.py)."""
    import torch
    from test_torch import TORCH_OPS, tdata, teq, tref

    dist = ctx.dist()
    n, r = ctx.n, ctx.rank
    sizes = [q + 2 for q in range(n)]
    lo = sum(sizes[:r])
    for op in TORCH_OPS:
        if dtype == "bool" and op == "AVG":
            continue
        t, _ = tdata(r, sum(sizes), dtype, op, salt=5)
        want = tref(n, sum(sizes), dtype, op, salt=5)[lo:lo + sizes[r]]
        out = torch.empty(sizes[r], dtype=t.dtype)
        dist.reduce_scatter(out, list(t.split(sizes)), op=getattr(dist.ReduceOp, op))
        teq(out, want, f"uneven reduce_scatter {dtype} {op}", dtype, op)
        # asynchronous, into a non-contiguous output, from separate input tensors
        out2 = torch.zeros(sizes[r], 2, dtype=t.dtype)[:, 0]
        w = dist.reduce_scatter(out2, [b.clone() for b in t.split(sizes)], op=getattr(dist.ReduceOp, op),
                                async_op=True)
        w.wait()
        teq(out2.contiguous(), want, f"async uneven reduce_scatter {dtype} {op}", dtype, op)
    return True


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
                                   "bool"])
def test_uneven_reduce_scatter(ranks, dtype):
    """Uneven reduce-scatter (an all-to-all-v and a local reduction; an all-reduce for
    AVG of integers and for bool), every dtype and op, 1-4 ranks."""
    ranks.run(t_uneven_reduce_scatter, dtype)

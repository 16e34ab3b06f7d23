"""PyTorch's own distributed test suite (``DistributedTest._DistTestBase``) on a backend.

Runs torch's ``torch.testing._internal.distributed.distributed_test`` the way torch's
``test/distributed/test_distributed_spawn.py`` does (one set of fresh spawned processes
per test, a ``file://`` store, ``BACKEND``/``WORLD_SIZE``/``TEMP_DIR`` in the environment),
for backend ``tutti`` (or ``gloo``, to compare), and writes one line of JSON per test::

    python suite.py --backend tutti --world-size 2 --out tutti-2.json
    python suite.py --backend gloo --world-size 3 -k all_reduce --timeout 120
    python table.py tutti-2.json gloo-2.json  # the pass/fail/skip table, tutti beside gloo

What this driver changes in the harness, and why (nothing else is patched):

* ``tutti`` joins the harness's lists of backends with DDP, subgroups and a plugin
  (``DistTestCases.backend_feature``), as any third-party backend must.
* The gates of :data:`LIFTED` are lifted for tutti: those tests are skipped by name on
  every backend but gloo (``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``)
  although what they check is backend-neutral. In their decorators (only there, and only
  for those tests) ``BACKEND`` reads ``"gloo"`` when it is ``"tutti"``; the tests' bodies
  run unchanged with ``BACKEND == "tutti"``. The source is edited as a syntax tree and
  compiled under torch's own file name, so tracebacks point at torch's lines.
* :data:`EXCEPTIONS` lists the tests skipped on tutti, each with its cause (docs/python.md
  repeats the list).

Exit status: 0 if no test failed or raised, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests that torch gates to gloo by name, and why their meaning is not gloo's alone.
LIFTED = {
    "test_barrier_timeout_global": "a barrier that one rank skips raises after the group's timeout",
    "test_barrier_timeout_group": "the same on a subgroup with its own timeout",
    "test_barrier_timeout_full_group": "the same on a new group of every rank",
    "test_barrier_timeout_arg": "barrier(timeout=) overrides the group's timeout",
    "test_batch_isend_irecv_gloo": "batch_isend_irecv of CPU tensors, a ring of sends and receives",
    "test_batch_isend_irecv_gloo_tags": "the same with tags",
    "test_sparse_all_reduce_sum": "all_reduce of sparse CPU tensors",
    "test_all_reduce_coalesced_sum": "all_reduce_coalesced on CPU tensors",
    "test_all_reduce_coalesced_product": "all_reduce_coalesced on CPU tensors",
    "test_all_reduce_coalesced_min": "all_reduce_coalesced on CPU tensors",
    "test_all_reduce_coalesced_max": "all_reduce_coalesced on CPU tensors",
    "test_all_reduce_coalesced_group_sum": "all_reduce_coalesced on a subgroup",
    "test_all_reduce_coalesced_group_product": "all_reduce_coalesced on a subgroup",
    "test_all_reduce_coalesced_group_min": "all_reduce_coalesced on a subgroup",
    "test_all_reduce_coalesced_group_max": "all_reduce_coalesced on a subgroup",
    "test_all_reduce_coalesced_full_group_sum": "all_reduce_coalesced on a group of every rank",
    "test_all_reduce_coalesced_full_group_product": "all_reduce_coalesced on a group of every rank",
    "test_all_reduce_coalesced_full_group_min": "all_reduce_coalesced on a group of every rank",
    "test_all_reduce_coalesced_full_group_max": "all_reduce_coalesced on a group of every rank",
    "test_accumulate_gradients_no_sync": "DDP's no_sync gradient accumulation on CPU",
    "test_accumulate_gradients_no_sync_grad_is_view": "the same with gradient_as_bucket_view",
    "test_accumulate_gradients_no_sync_allreduce_hook": "the same with an all-reduce comm hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "the same with a hook chaining then()",
    "test_get_future": "Work.get_future() of an all_reduce",
    "test_grads_same_across_ranks_with_no_sync": "DDP gradients agree after no_sync steps",
    "test_scatter_object_list": "scatter_object_list over CPU tensors",
    "test_monitored_barrier_gloo": "monitored_barrier names the ranks that did not arrive",
    "test_monitored_barrier_gloo_subgroup": "the same on a subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout": "the same when rank 0 is late",
    "test_monitored_barrier_failure_order": "monitored_barrier reports the first missing rank",
    "test_monitored_barrier_wait_all_ranks": "monitored_barrier(wait_all_ranks=True) names them all",
    "test_all_gather_object_default_pg": "all_gather_object on CPU (gated on backends with GPUs; only nccl uses them)",
    "test_all_gather_object_subgroup": "the same on a subgroup",
    "test_static_graph_multi_forward": "DDP static_graph with several forwards",
    "test_sync_bn_logged": "SyncBatchNorm use is logged by DDP",
}

# Helpers of lifted tests whose bodies choose by backend name (only their comparisons
# of BACKEND are lifted), and why.
LIFTED_HELPERS = {
    "_test_accumulate_gradients_no_sync": "builds its CPU model only `if BACKEND == \"mpi\" or BACKEND == \"gloo\"`",
}

# Tests skipped on tutti, with their cause (also in docs/python.md). Keep it short. (The
# monitored_barrier ones left it when the group gained a c10d backend for cpu.)
EXCEPTIONS: dict = {}


class _Gate(ast.NodeTransformer):
    """``BACKEND`` -> ``_GATE_BACKEND`` inside comparisons, ``{"gloo"}`` -> ``{"gloo", "tutti"}``,
    ``DistTestCases.backend_feature[f]`` -> ``DistTestCases.backend_feature[f] | {"tutti"}``."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id == "BACKEND":
                sub.id = "_GATE_BACKEND"
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if ast.unparse(node.value) == "DistTestCases.backend_feature":
            tutti = ast.Set(elts=[ast.Constant(value="tutti")])
            return ast.copy_location(ast.BinOp(left=node, op=ast.BitOr(), right=tutti), node)
        return self.generic_visit(node)

    def visit_Set(self, node: ast.Set) -> ast.AST:
        if any(isinstance(e, ast.Constant) and e.value == "gloo" for e in node.elts):
            node.elts.append(ast.copy_location(ast.Constant(value="tutti"), node))
        return node


def _load_distributed_test(backend: str) -> None:
    """Imports torch's distributed_test module with the gates of LIFTED lifted for tutti."""
    name = "torch.testing._internal.distributed.distributed_test"
    spec = importlib.util.find_spec(name)
    path = spec.origin
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in LIFTED:
            node.decorator_list = [_Gate().visit(d) for d in node.decorator_list]
            found.add(node.name)
        elif isinstance(node, ast.FunctionDef) and node.name in LIFTED_HELPERS:
            node.body = [_Gate().visit(b) for b in node.body]
            found.add(node.name)
    missing = (set(LIFTED) | set(LIFTED_HELPERS)) - found
    if missing:
        print(f"suite: not in this torch's suite (ignored): {sorted(missing)}", file=sys.stderr)
    # After `BACKEND = os.environ["BACKEND"]`, define what the lifted gates read.
    for i, stmt in enumerate(tree.body):
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == "BACKEND"):
            gate = ast.parse('_GATE_BACKEND = "gloo" if BACKEND == "tutti" else BACKEND').body[0]
            tree.body.insert(i + 1, ast.copy_location(gate, stmt))
            break
    else:
        raise RuntimeError("suite: torch's distributed_test has no `BACKEND = ...` line any more")
    ast.fix_missing_locations(tree)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    exec(compile(tree, path, "exec", dont_inherit=True), mod.__dict__)  # not our __future__ flags


def _setup() -> type:
    """Prepares the harness (in the parent and in every spawned rank) and returns the test class."""
    backend = os.environ["BACKEND"]
    import torch  # noqa: F401
    import torch.distributed as dist  # noqa: F401
    from torch.testing._internal.common_distributed import DistTestCases

    if backend == "tutti":
        import tutti.torch  # noqa: F401  (registers the backend)

        for feature in ("ddp", "subgroup", "plugin"):
            DistTestCases.backend_feature[feature].add("tutti")
    _load_distributed_test(backend)
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self) -> None:
            reason = EXCEPTIONS.get(self._testMethodName) if backend == "tutti" else None
            if reason:
                self.skipTest(f"tutti exception: {reason}")
            super().setUp()
            if os.environ.get("TUTTI_SUITE_START", "fork") == "fork":
                # Forked ranks start with torch and the harness already imported: about
                # 5 s of CPU less per rank and test than spawned ones (torch's own driver).
                import torch.multiprocessing as tmp

                self._start_processes(tmp.get_context("fork").Process)
            else:
                self._spawn_processes()

    # Spawned ranks find the class by name in this module (pickle).
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    return TestDistBackendWithSpawn


if "BACKEND" in os.environ and "WORLD_SIZE" in os.environ and "TEMP_DIR" in os.environ:
    TestDistBackendWithSpawn = _setup()


class _Recorder(unittest.TextTestResult):
    """Records each test's outcome and duration, and writes them as JSON lines."""

    def __init__(self, *a, out=None, **kw):
        super().__init__(*a, **kw)
        self.records: list = []
        self._out = out
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _rec(self, test, outcome, detail=""):
        r = {"test": test._testMethodName, "outcome": outcome, "seconds": round(time.monotonic() - self._t0, 2),
             "detail": detail[-2000:]}
        self.records.append(r)
        if self._out is not None:
            self._out.write(json.dumps(r) + "\n")
            self._out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._rec(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._rec(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._rec(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._rec(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._rec(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._rec(test, "xpass")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="tutti", choices=["tutti", "gloo"])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    ap.add_argument("--tests", help="a file with test names, one a line (# comments), to run only those")
    ap.add_argument("--timeout", type=int, default=120, help="seconds one test may take (all its ranks)")
    ap.add_argument("--out", help="write one JSON line per test here")
    ap.add_argument("--start", choices=["fork", "spawn"], default="fork",
                    help="how ranks start: fork (fast, default) or spawn (as torch's CI)")
    ap.add_argument("-v", action="store_true", help="unittest's verbose output")
    args = ap.parse_args()

    if os.environ.get("_TUTTI_SUITE_CHILD") != "1":
        # The environment must be in place before torch's harness is imported (it reads
        # it at import), so the suite runs in a child process with it.
        import shutil
        import subprocess

        tmp = tempfile.mkdtemp(prefix=f"torch-suite-{args.backend}-{args.world_size}-")
        env = dict(os.environ, BACKEND=args.backend, WORLD_SIZE=str(args.world_size), TEMP_DIR=tmp,
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.timeout), TUTTI_SUITE_START=args.start,
                   _TUTTI_SUITE_CHILD="1")
        try:
            return subprocess.call([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    cls = globals()["TestDistBackendWithSpawn"]
    names = sorted(n for n in dir(cls) if n.startswith("test_"))
    if args.tests:
        with open(args.tests) as f:
            wanted = {ln.split("#")[0].strip() for ln in f} - {""}
        names = [n for n in names if n in wanted]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    suite = unittest.TestSuite(cls(n) for n in names)
    out = open(args.out, "w") if args.out else None
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(verbosity=2 if args.v else 1,
                                     resultclass=lambda *a, **kw: _Recorder(*a, out=out, **kw))
    res = runner.run(suite)
    counts: dict = {}
    for r in res.records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"suite {args.backend} world {args.world_size}: {counts} in {time.monotonic() - t0:.0f} s")
    if out:
        out.close()
    return 0 if res.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())

"""python/examples/train_torch.py at a small size: two real processes (the launcher's
TUTTI_* variables set here, as ``tutti run`` does), DDP on backend tutti with every
gradient exchange (DDP's own AllReduce, the bf16 and f16 wire hooks, Top-K with error
feedback and accumulation under no_sync()) and on gloo with torch's fp16 hook; each runs to its
JSON line and the loss falls (about 30 s in all on the 2-core VM, most of it starting torch). Nothing is timed."""

import json
import os
import subprocess
import sys

import pytest

from harness import free_port

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_torch.py")
BASE = ["--steps", "60", "--width", "64", "--probe", "1", "--quiet"]


def run(args, timeout=120):
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "RANK", "WORLD_SIZE", "MASTER_"))}
    procs = [
        subprocess.Popen([sys.executable, EXAMPLE, *BASE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**env, "TUTTI_RANK": str(r), "TUTTI_WORLD_SIZE": "2",
                                         "TUTTI_LOCAL_RANK": str(r), "TUTTI_MASTER_ADDR": "127.0.0.1",
                                         "TUTTI_MASTER_PORT": port})
        for r in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} of {args} failed:\n{out}\n{err}"
    line = next((l for l in outs[0][0].splitlines() if l.startswith("{")), None)
    assert line, f"no JSON line from {args}:\n{outs[0][0]}"
    return json.loads(line)


# (the f16 wire hook is the bf16 one with another type: tests/test_torch_hooks.py covers both)
@pytest.mark.parametrize("args", [
    ["--hook", "none"],
    ["--hook", "bf16"],
    ["--hook", "topk", "--topk-ratio", "0.05", "--accum", "2"],
    ["--backend", "gloo", "--hook", "torch-fp16"],
], ids=["tutti-f32", "bf16-wire", "topk-accum2", "gloo-torch-fp16"])
def test_train_torch_learns(args):
    r = run(args)
    assert r["ranks"] == 2 and r["steps"] == 60
    assert r["loss_last5"] < 0.8 * r["loss_first"], f"{args}: the loss did not fall: {r['loss_first']} -> {r['loss_last5']}"

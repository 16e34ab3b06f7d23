"""The pass/fail/skip table of torch_suite runs (suite.py --out FILE), tutti beside gloo.

    python table.py results/tutti-2.json results/gloo-2.json results/tutti-3.json ...

A file's backend and world size come from its name (``<backend>-<world>.json``). Prints a
Markdown table of counts per run, then the tests whose outcome differs between backends
at the same world size.
"""

import collections
import json
import os
import sys


def main(paths: list) -> None:
    runs = {}
    for p in paths:
        backend, world = os.path.basename(p).rsplit(".", 1)[0].rsplit("-", 1)
        with open(p) as f:
            runs[(backend, int(world))] = {r["test"]: r for r in map(json.loads, f)}
    print("| backend | world | pass | fail | error | skip | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (b, w), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "tutti")):
        c = collections.Counter(r["outcome"] for r in rs.values())
        secs = round(sum(r["seconds"] for r in rs.values()))
        print(f"| {b} | {w} | {c['pass']} | {c['fail']} | {c['error']} | {c['skip']} | {secs} |")
    for (b, w), rs in sorted(runs.items()):
        if b == "tutti" and ("gloo", w) in runs:
            g = runs[("gloo", w)]
            for n in sorted(set(rs) | set(g)):
                a, o = rs.get(n, {}).get("outcome"), g.get(n, {}).get("outcome")
                if a != o:
                    why = rs.get(n, {}).get("detail", "")[:120]
                    print(f"world {w}: {n}: tutti {a}, gloo {o} {why}")


if __name__ == "__main__":
    main(sys.argv[1:])

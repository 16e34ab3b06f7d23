#!/usr/bin/env python3
"""sim_compare.py CLUSTER OUT [OUT...]: measured (OUT/SHAPE-COLL.json from sim_validate.sh) against
`tutti sim CLUSTER --hosts H --ranks-per-host K COLL -a ALG -b SIZE -e SIZE` for the
algorithm each call ran; prints a markdown table, the median and the largest error.

Several OUTs holding the same SHAPE-COLL files (rounds of one validation, e.g. bench/sim/v36/r*)
are one measurement: each cell's measured time is the median over the rounds (with the smallest
and largest), its algorithm the one most rounds ran, and the prediction is for that algorithm."""
import collections, glob, json, os, statistics, subprocess, sys

cluster, outs = sys.argv[1], sys.argv[2:]
binary = os.environ.get("BIN", "target/release/tutti")
cells = collections.OrderedDict()
for path in sorted(p for out in outs for p in glob.glob(os.path.join(out, "*x*-*.json"))):
    shape, coll = os.path.basename(path)[:-5].split("-", 1)
    for r in json.load(open(path))["rows"]:
        if r["in_place"]:
            continue
        alg = r["algo"].split(":", 1)[-1].split("/")[0].split("+")[0]
        cells.setdefault((shape, coll, r["size_bytes"]), []).append((r["time_us"], alg))

rows = []
for (shape, coll, size), ms in sorted(cells.items(), key=lambda kv: kv[0]):
    h, k = shape.split("x")
    alg = collections.Counter(a for _, a in ms).most_common(1)[0][0]
    times = [t for t, _ in ms]
    med = statistics.median(times)
    cmd = [binary, "sim", cluster, "--hosts", h, "--ranks-per-host", k, coll,
           "-a", alg, "-b", str(size), "-e", str(size), "--json", "/tmp/sim-cmp.json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("sim failed:", " ".join(cmd), p.stderr.strip(), file=sys.stderr)
        continue
    pred = json.load(open("/tmp/sim-cmp.json"))["rows"][0]["time_us"]
    err = (pred - med) / med
    algs = "/".join(sorted(set(a for _, a in ms)))
    rows.append((shape, coll, size, algs, len(times), med, min(times), max(times), pred, err))
print("| shape | collective | size | algorithm | rounds | measured median (min-max) us | predicted (us) | error |")
print("|---|---|---:|---|---:|---:|---:|---:|")
for s, c, b, a, n, m, lo, hi, p, e in rows:
    print(f"| {s} | {c} | {b} | {a} | {n} | {m:.0f} ({lo:.0f}-{hi:.0f}) | {p:.0f} | {100*e:+.0f}% |")
errs = [abs(r[9]) for r in rows]
if errs:
    print(f"\ncells: {len(errs)}, median |error| {100*statistics.median(errs):.1f}%, "
          f"max {100*max(errs):.1f}%, over 30%: {sum(e > 0.3 for e in errs)}")
    over = [f"{r[0]} {r[1]} {r[2]} ({100*r[9]:+.0f}%)" for r in rows if abs(r[9]) > 0.3]
    if over:
        print("over 30%: " + ", ".join(over))

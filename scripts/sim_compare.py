#!/usr/bin/env python3
"""sim_compare.py CLUSTER OUT [OUT...]: measured (OUT/SHAPE-COLL.json from sim_validate.sh) against
`tutti sim CLUSTER --hosts H --ranks-per-host K COLL -a ALG -b SIZE -e SIZE` for the
algorithm each call ran; prints a markdown table, the median and the largest error."""
import glob, json, os, statistics, subprocess, sys

cluster, outs = sys.argv[1], sys.argv[2:]
binary = os.environ.get("BIN", "target/release/tutti")
rows = []
for path in sorted(p for out in outs for p in glob.glob(os.path.join(out, "*x*-*.json"))):
    shape, coll = os.path.basename(path)[:-5].split("-", 1)
    h, k = shape.split("x")
    for r in json.load(open(path))["rows"]:
        if r["in_place"]:
            continue
        alg = r["algo"].split(":", 1)[-1].split("/")[0].split("+")[0]
        cmd = [binary, "sim", cluster, "--hosts", h, "--ranks-per-host", k, coll,
               "-a", alg, "-b", str(r["size_bytes"]), "-e", str(r["size_bytes"]), "--json", "/tmp/sim-cmp.json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print("sim failed:", " ".join(cmd), p.stderr.strip(), file=sys.stderr)
            continue
        pred = json.load(open("/tmp/sim-cmp.json"))["rows"][0]["time_us"]
        err = (pred - r["time_us"]) / r["time_us"]
        rows.append((shape, coll, r["size_bytes"], alg, r["time_us"], pred, err))
print("| shape | collective | size | algorithm | measured (us) | predicted (us) | error |")
print("|---|---|---:|---|---:|---:|---:|")
for s, c, b, a, m, p, e in rows:
    print(f"| {s} | {c} | {b} | {a} | {m:.0f} | {p:.0f} | {100*e:+.0f}% |")
errs = [abs(r[6]) for r in rows]
if errs:
    print(f"\ncells: {len(errs)}, median |error| {100*statistics.median(errs):.1f}%, "
          f"max {100*max(errs):.1f}%, over 30%: {sum(e > 0.3 for e in errs)}")

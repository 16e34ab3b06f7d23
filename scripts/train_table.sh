#!/bin/bash
# train_table.sh: issue 41's measured table. The training examples (crates/tutti/examples/
# train_mlp.rs with GradSync, python/examples/train_torch.py with DDP) on a namespace cluster
# (scripts/cluster.sh, one rank per host, tbf-limited links) with every gradient exchange,
# with and without accumulation of 4; the 16-bit wire's AllReduce against f32 (tutti perf);
# a longer convergence run at a small size; then the markdown table and an SVG plot of the
# loss against wall time.
#
# Usage (root): scripts/train_table.sh PHASE...
#   PHASE: rust LINK | torch LINK | perf LINK | converge | report
#     rust 1gbit      train_mlp: 1 rank alone, then HOSTS (default "2 4") hosts x {f32, bf16,
#                     f16, topk 1%} x accum {1, 4}
#     torch 1gbit     train_torch: 1 rank alone, then HOSTS hosts x {tutti: none, bf16, fp16,
#                     topk 1%, torch-fp16; gloo: none, torch-fp16} x accum {1, 4}
#     perf 1gbit      tutti perf all_reduce 16 MiB and 64 MiB, f32 and --wire bf16 alternated
#                     ROUNDS (default 5) times, on 2 hosts
#     converge        train_mlp and train_torch at a small size on 2 local ranks (no link
#                     limit), every exchange, Top-K also after a dense warm-up, and (Rust)
#                     with DGC's momentum correction, with and without the warm-up;
#                     train_mlp CONV_STEPS_RUST (default 2000) steps (its f32 loss flattens
#                     after about 400), train_torch CONV_STEPS (default 300)
#     report          writes $OUT/table.md, $OUT/targets.md and docs/img/train_loss_*.svg
#   Every run takes the exclusive bench lock (flock /work/bench.lock) for itself alone, so
#   other builds proceed between runs. Results: one JSON line per run in $OUT/runs.jsonl
#   (the example's JSON line plus link, hosts, impl, variant), logs in $OUT/log/.
#
# Knobs (environment): OUT=bench/train PY=.venv/bin/python STEPS=20 HOSTS="2 4" ROUNDS=5
#   WIDTH (model width; default 5000 at 1gbit: 25.4 M parameters, 101 MB of f32 gradients;
#   2240 at other links: 5.2 M, so a step moves about as long on a 200mbit link)
#   BATCH=8 (per rank and micro-batch) LR_RUST=0.2 LR_TORCH=0.2 CONV_STEPS=300
#   CONV_STEPS_RUST=2000 PREFIX=tr
#   TOPK_WARMUP=40 (converge: the dense synchronisations of the torch "tutti/topk+warmup" and
#   "tutti/topk+momentum+warmup" runs)
#   TORCH_TOPK_MOMENTUM=0.9 (converge: the momentum factor of the torch "tutti/topk+momentum"
#   and "tutti/topk+momentum+warmup" runs, train_torch.py --topk-momentum)
#   RUST_TOPK_WARMUP=100 (converge: the same for the Rust "topk+warmup" and
#   "topk+momentum+warmup" runs)
#   RUST_TOPK_MOMENTUM=0.9 (converge: the momentum factor of the Rust "topk+momentum" and
#   "topk+momentum+warmup" runs, train_mlp --topk-momentum)
#   CONV_RUST="f32 bf16 f16 topk topk+warmup topk+momentum topk+momentum+warmup" and
#   CONV_TORCH="tutti/none tutti/bf16 tutti/fp16 tutti/topk tutti/torch-fp16 tutti/topk+warmup
#   tutti/topk+momentum tutti/topk+momentum+warmup"
#   (converge: the variants to run; empty runs none of that example)
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/train}
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-20}
HOSTS=${HOSTS:-2 4}
ROUNDS=${ROUNDS:-5}
BATCH=${BATCH:-8}
LR_RUST=${LR_RUST:-0.2}
LR_TORCH=${LR_TORCH:-0.2}
CONV_STEPS=${CONV_STEPS:-300}
CONV_STEPS_RUST=${CONV_STEPS_RUST:-2000}
TOPK_WARMUP=${TOPK_WARMUP:-40}
RUST_TOPK_WARMUP=${RUST_TOPK_WARMUP:-100}
RUST_TOPK_MOMENTUM=${RUST_TOPK_MOMENTUM:-0.9}
TORCH_TOPK_MOMENTUM=${TORCH_TOPK_MOMENTUM:-0.9}
CONV_RUST=${CONV_RUST-f32 bf16 f16 topk topk+warmup topk+momentum topk+momentum+warmup}
CONV_TORCH=${CONV_TORCH-tutti/none tutti/bf16 tutti/fp16 tutti/topk tutti/torch-fp16 tutti/topk+warmup tutti/topk+momentum tutti/topk+momentum+warmup}
PREFIX=${PREFIX:-tr}
RUST=target/release/examples/train_mlp
TORCH=python/examples/train_torch.py
LOCK=/work/bench.lock
mkdir -p "$OUT/log"

width_for() { if [ -n "${WIDTH:-}" ]; then echo "$WIDTH"; elif [ "$1" = 1gbit ]; then echo 5000; else echo 2240; fi; }

# record LOG KEY=VALUE...: the JSON line of LOG, with the keys added, appended to runs.jsonl
record() {
  local log=$1
  shift
  "$PY" - "$log" "$@" >> "$OUT/runs.jsonl" << 'EOF'
import json, re, sys
# `tutti run` prefixes each line with "[rank N] "; scripts/cluster.sh --no-label does not.
lines = (re.sub(r"^\[rank \d+\] ", "", l) for l in open(sys.argv[1]))
line = next((l for l in lines if l.startswith("{")), None)
if line is None:
    sys.exit(f"no JSON line in {sys.argv[1]}")
d = json.loads(line)
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1)
    d[k] = int(v) if v.isdigit() else v
print(json.dumps(d))
EOF
}

# run LINK HOSTS IMPL VARIANT ACCUM -- CMD...: one run (under the lock), recorded
run() {
  local link=$1 hosts=$2 impl=$3 variant=$4 accum=$5
  shift 6
  local log="$OUT/log/$impl-$link-$hosts-${variant//\//_}-a$accum.txt"
  local rc=0
  if [ "$hosts" = 1 ]; then
    flock "$LOCK" timeout 600 "$@" --accum "$accum" --quiet > "$log" 2>&1 || rc=$?
  else
    flock "$LOCK" timeout 600 scripts/cluster.sh launch --prefix "$PREFIX" --hosts "$hosts" --ranks-per-host 1 \
      --no-label --timeout 580 -- "$@" --accum "$accum" --quiet > "$log" 2>&1 || rc=$?
  fi
  if [ $rc = 0 ]; then
    record "$log" link="$link" hosts="$hosts" impl="$impl" variant="$variant"
    echo "$impl $link $hosts hosts $variant accum $accum: $(grep -o '"step_ms": *[0-9.]*' "$log" | head -1)"
  else
    echo "$impl $link $hosts hosts $variant accum $accum: FAILED ($rc, see $log)"
  fi
}

cluster() { scripts/cluster.sh up --prefix "$PREFIX" --hosts "$1" --link "$2" > /dev/null; }

phase_rust() {
  local link=$1 w
  w=$(width_for "$link")
  local base=("$RUST" --hidden "$w" --batch "$BATCH" --lr "$LR_RUST" --steps "$STEPS")
  for acc in 1 4; do run "$link" 1 rust f32 "$acc" -- "${base[@]}" --wire f32; done
  for h in $HOSTS; do
    cluster "$h" "$link"
    for acc in 1 4; do
      for v in f32 bf16 f16 topk; do
        case $v in topk) x=(--topk 0.01) ;; *) x=(--wire "$v") ;; esac
        run "$link" "$h" rust "$v" "$acc" -- "${base[@]}" "${x[@]}"
      done
    done
  done
}

phase_torch() {
  local link=$1 w
  w=$(width_for "$link")
  local base=("$PY" "$TORCH" --width "$w" --batch "$BATCH" --lr "$LR_TORCH" --steps "$STEPS")
  for acc in 1 4; do run "$link" 1 torch tutti/none "$acc" -- "${base[@]}" --backend tutti --hook none; done
  for h in $HOSTS; do
    cluster "$h" "$link"
    for acc in 1 4; do
      for v in tutti/none tutti/bf16 tutti/fp16 tutti/topk tutti/torch-fp16 gloo/none gloo/torch-fp16; do
        run "$link" "$h" torch "$v" "$acc" -- "${base[@]}" --backend "${v%%/*}" --hook "${v#*/}"
      done
    done
  done
}

phase_perf() {
  local link=$1
  cluster 2 "$link"
  for r in $(seq "$ROUNDS"); do
    for wire in f32 bf16; do
      local x=()
      [ $wire = bf16 ] && x=(--wire bf16)
      local log="$OUT/log/perf-$link-$wire-$r.txt"
      flock "$LOCK" timeout 300 scripts/cluster.sh launch --prefix "$PREFIX" --hosts 2 --ranks-per-host 1 \
        --no-label --timeout 280 -- target/release/tutti perf all_reduce -b 16M -e 64M -f 4 -c 0 -w 1 -i 5 \
        "${x[@]}" --json "$OUT/log/perf-$link-$wire-$r.json" > "$log" 2>&1 || echo "perf $wire $r: FAILED"
      grep -E "^ *[0-9]" "$log" | sed "s/^/$link $wire round $r: /" || true
    done
  done
}

phase_converge() {
  local port=$((20000 + RANDOM % 9000))
  for v in $CONV_RUST; do
    case $v in
      topk) x=(--topk 0.01) ;;
      topk+warmup) x=(--topk 0.01 --topk-warmup "$RUST_TOPK_WARMUP") ;;
      topk+momentum) x=(--topk 0.01 --topk-momentum "$RUST_TOPK_MOMENTUM") ;;
      topk+momentum+warmup)
        x=(--topk 0.01 --topk-momentum "$RUST_TOPK_MOMENTUM" --topk-warmup "$RUST_TOPK_WARMUP") ;;
      *) x=(--wire "$v") ;;
    esac
    local log="$OUT/log/converge-rust-${v//+/_}.txt"
    flock "$LOCK" timeout 600 target/release/tutti run -n 2 -- "$RUST" --steps "$CONV_STEPS_RUST" --hidden 256 \
      --quiet "${x[@]}" > "$log" 2>&1 && record "$log" link=none hosts=2 impl=rust variant="$v" phase=converge ||
      echo "converge rust $v: FAILED"
  done
  for v in $CONV_TORCH; do
    local log="$OUT/log/converge-torch-${v//[\/+]/_}.txt" hook=${v#*/} extra=()
    case $hook in
      topk+warmup) hook=topk extra=(--topk-warmup "$TOPK_WARMUP") ;;
      topk+momentum) hook=topk extra=(--topk-momentum "$TORCH_TOPK_MOMENTUM") ;;
      topk+momentum+warmup) hook=topk extra=(--topk-momentum "$TORCH_TOPK_MOMENTUM" --topk-warmup "$TOPK_WARMUP") ;;
    esac
    flock "$LOCK" timeout 600 target/release/tutti run -n 2 --master-port $((port++)) -- "$PY" "$TORCH" \
      --steps "$CONV_STEPS" --width 256 --quiet --backend tutti --hook "$hook" "${extra[@]}" > "$log" 2>&1 &&
      record "$log" link=none hosts=2 impl=torch variant="$v" phase=converge || echo "converge torch $v: FAILED"
  done
}

phase_report() {
  mkdir -p docs/img
  "$PY" - "$OUT" << 'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
# The latest run of each configuration wins.
key = lambda r: (r.get("phase", "table"), r["impl"], r["link"], r["hosts"], r["variant"], r["accum"])
last = {key(r): r for r in runs}
table = [r for k, r in last.items() if k[0] == "table"]
base = {(r["impl"], r["link"], r["accum"]): r for r in table if r["hosts"] == 1}
names = {"f32": "f32", "bf16": "bf16 wire", "f16": "f16 wire", "topk": "Top-K 1% + EF",
         "tutti/none": "tutti f32", "tutti/bf16": "tutti bf16 wire", "tutti/fp16": "tutti f16 wire",
         "tutti/topk": "tutti Top-K 1% + EF", "tutti/torch-fp16": "tutti + torch fp16 hook",
         "gloo/none": "gloo f32", "gloo/torch-fp16": "gloo + torch fp16 hook"}
order = list(names)
rows = ["| example | link | hosts | exchange | accum | params | step ms | comm share | scaling eff. | loss after steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in sorted(table, key=lambda r: (r["impl"], r["link"], r["hosts"], r["accum"], order.index(r["variant"]))):
    b = base.get((r["impl"], r["link"], r["accum"]))
    eff = f"{b['step_ms'] / r['step_ms']:.2f}" if b and r["hosts"] > 1 else "-"
    ex = "Rust GradSync" if r["impl"] == "rust" else "torch DDP"
    hosts = "1 (alone)" if r["hosts"] == 1 else str(r["hosts"])
    var = "f32 (no exchange)" if r["hosts"] == 1 else names[r["variant"]]
    rows.append(f"| {ex} | {r['link'] if r['hosts'] > 1 else '-'} | {hosts} | {var} | {r['accum']} | "
                f"{r['params'] / 1e6:.1f} M | {r['step_ms']:.0f} | {100 * r['comm_share']:.0f}% | {eff} | "
                f"{r['loss_last5']:.3f} ({r['steps']}) |")
open(f"{out}/table.md", "w").write("\n".join(rows) + "\n")

# Targets.
t = []
perf = {}
for f in glob.glob(f"{out}/log/perf-*-*-*.json"):
    link, wire = os.path.basename(f).split("-")[1:3]
    try:  # tutti perf --json: one object, its "rows" one per size and placement
        rows_ = json.load(open(f)).get("rows", [])
    except ValueError:
        continue
    for x in rows_:
        if isinstance(x, dict) and "size_bytes" in x:
            perf.setdefault((link, x["size_bytes"], x.get("in_place", False)), {}).setdefault(wire, []).append(
                x["time_us"])
for (link, size, ip), v in sorted(perf.items()):
    if "f32" in v and "bf16" in v and all(v["f32"]) and all(v["bf16"]):
        f, b = statistics.median(v["f32"]), statistics.median(v["bf16"])
        sp = sorted(a / c for a, c in zip(v["f32"], v["bf16"]))
        t.append(f"- AllReduce {size >> 20} MiB, 2 hosts, {link}{' in place' if ip else ''}: f32 {f / 1e3:.1f} ms, "
                 f"bf16 wire {b / 1e3:.1f} ms: {f / b:.2f}x (per round {sp[0]:.2f}-{sp[-1]:.2f}, {len(sp)} rounds)")
for impl, f32v, tkv in (("rust", "f32", "topk"), ("torch", "tutti/none", "tutti/topk")):
    for (ph, im, link, h, var, acc), r in sorted(last.items()):
        if ph == "table" and im == impl and var == f32v and h > 1:
            k = last.get((ph, im, link, h, tkv, acc))
            if k:
                if impl == "rust":
                    a_, b_ = r["comm_ms"], k["comm_ms"]
                    what = "time in GradSync (selection, issue, wait)"
                else:
                    a_ = max(r["step_ms"] - r["compute_ms"], 1e-9)
                    b_ = max(k["step_ms"] - k["compute_ms"], 1e-9)
                    what = "step - compute"
                t.append(f"- Top-K 1% vs f32, {impl}, {r['params'] / 1e6:.1f} M params, {h} hosts, {link}, accum {acc}: "
                         f"communication ({what}) {a_:.0f} ms vs {b_:.0f} ms: {a_ / b_:.1f}x less")
conv = {(r["impl"], r["variant"]): r for k, r in last.items() if k[0] == "converge"}
for impl, f32v in (("rust", "f32"), ("torch", "tutti/none")):
    ref = conv.get((impl, f32v))
    if not ref:
        continue
    def smooth(c, w=20):
        ls = [l for _, l in c]
        return [statistics.mean(ls[max(0, i - w + 1):i + 1]) for i in range(len(ls))]
    fs = smooth(ref["curve"])
    target, n = fs[-1], len(fs)
    tail = [l for _, l in ref["curve"][-50:]]
    noise = statistics.stdev(tail) / len(tail) ** 0.5
    steps_f32 = next(i for i, x in enumerate(fs) if x <= target) + 1
    for (im, var), r in sorted(conv.items()):
        if im != impl:
            continue
        s = smooth(r["curve"])
        hit = next((i + 1 for i, x in enumerate(s) if x <= target), None)
        lt = [l for _, l in r["curve"][-50:]]
        # The second half, paired by step with f32 (the same batches): the plateau's gap.
        half = [x[1] - y[1] for x, y in zip(r["curve"][n // 2:], ref["curve"][n // 2:])]
        gap = (f"; second half {statistics.mean(l for _, l in r['curve'][n // 2:]):.4f}, paired difference "
               f"from f32 {statistics.mean(half):+.4f}") if var != f32v and len(half) > 1 else ""
        t.append(f"- converge, {impl}, {var}: mean loss of the last 50 of {n} steps {statistics.mean(lt):.4f} "
                 f"(f32 {statistics.mean(tail):.4f} +- {noise:.4f} s.e.); reaches f32's final smoothed loss "
                 f"{target:.4f} at step {hit if hit else 'never'} (f32: {steps_f32}; ratio "
                 f"{(hit / steps_f32) if hit else float('inf'):.2f}){gap}")
open(f"{out}/targets.md", "w").write("\n".join(t) + "\n")

# The plots: loss against wall time.
def svg(series, path, title):
    W, H, L, R, T, B = 640, 360, 60, 170, 30, 40
    xs = [x for _, c in series for x, _ in c] or [1]
    ys = [y for _, c in series for _, y in c] or [1]
    x1, y0, y1 = max(xs), min(ys), max(ys)
    if y1 == y0:
        y1 = y0 + 1
    px = lambda x: L + (W - L - R) * x / x1
    py = lambda y: T + (H - T - B) * (1 - (y - y0) / (y1 - y0))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for i in range(6):
        xv, yv = x1 * i / 5, y0 + (y1 - y0) * i / 5
        s.append(f'<text x="{px(xv):.1f}" y="{H - B + 14}" text-anchor="middle">{xv:.1f}</text>')
        s.append(f'<text x="{L - 4}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{H - 6}" text-anchor="middle">wall time (s)</text>')
    s.append(f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 14 {(T + H - B) / 2})">loss</text>')
    for i, (name, c) in enumerate(series):
        col = colors[i % len(colors)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in c)
        s.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{pts}"/>')
        s.append(f'<line x1="{W - R + 10}" y1="{T + 14 * i + 6}" x2="{W - R + 30}" y2="{T + 14 * i + 6}" stroke="{col}" stroke-width="2"/>')
        s.append(f'<text x="{W - R + 34}" y="{T + 14 * i + 10}">{name}</text>')
    s.append("</svg>")
    open(path, "w").write("\n".join(s) + "\n")
for impl in ("rust", "torch"):
    for link in sorted({r["link"] for r in table}):
        ser = [(names[r["variant"]] + (f" a{r['accum']}" if r["accum"] > 1 else ""), r["curve"])
               for r in sorted(table, key=lambda r: (r["accum"], order.index(r["variant"])))
               if r["impl"] == impl and r["link"] == link and r["hosts"] == 2]
        if ser:
            svg(ser, f"docs/img/train_loss_{impl}_{link}.svg",
                f"{'Rust GradSync' if impl == 'rust' else 'torch DDP'}, 2 hosts, {link}: loss against wall time")
print(open(f"{out}/table.md").read())
print(open(f"{out}/targets.md").read())
EOF
}

[ $# -gt 0 ] || { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    rust | torch | perf) "phase_$1" "$2"; shift 2 ;;
    converge | report) "phase_$1"; shift ;;
    *) echo "unknown phase $1" >&2; exit 2 ;;
  esac
done

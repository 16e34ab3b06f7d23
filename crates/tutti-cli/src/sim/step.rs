//! `tutti sim CLUSTER step`: the training step's report: where the time
//! goes, scaling efficiency over 1, 2, 4, ... hosts, the bottleneck, and
//! what-ifs with their predicted gain ([`workload`](super::workload) has
//! the model).

use super::cluster::Checked;
use super::price;
use super::workload::{step_time, StepTime, Workload, MODELS};
use super::SimArgs;
use std::path::PathBuf;
use tutti::Algorithm;

/// The training step's flags (`tutti sim CLUSTER step ...`).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct StepArgs {
    /// Model preset: resnet50, bert-large, gpt2, llm-7b (parameters and gradient type).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Gradient bytes per step, f32 (instead of --model; K, M, G suffixes).
    #[arg(long, value_name = "SIZE")]
    pub grad_bytes: Option<String>,
    /// One micro-batch's compute on one rank, milliseconds.
    #[arg(long, value_name = "MS")]
    pub compute_ms: Option<f64>,
    /// One micro-batch's FLOPs per rank (with --tflops, instead of --compute-ms).
    #[arg(long, value_name = "FLOPS")]
    pub flops: Option<f64>,
    /// One rank's rate, TFLOP/s (with --flops).
    #[arg(long, value_name = "RATE")]
    pub tflops: Option<f64>,
    /// One rank's whole step measured under the framework (e.g. DDP on a
    /// world of 1), milliseconds: what it takes over the compute is
    /// charged to every step as the framework's own cost.
    #[arg(long = "step-1-ms", value_name = "MS")]
    pub step_1_ms: Option<f64>,
    /// Gradient bucket size (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "25M")]
    pub bucket: String,
    /// Overlap communication with the backward pass: on or off.
    #[arg(long, value_name = "on|off", default_value = "on")]
    pub overlap: String,
    /// Type on the wire: f32, bf16 or f16 (default: the gradients' type).
    #[arg(long, value_name = "TYPE")]
    pub wire: Option<String>,
    /// Fraction of gradient elements sent (Top-K), in (0, 1]; 1 is dense.
    #[arg(long, value_name = "RATIO", default_value_t = 1.0)]
    pub sparsify: f64,
    /// Micro-batches per step (gradient accumulation).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub accum: usize,
    /// Scaling table up to this many hosts (default: the cluster's).
    #[arg(long, value_name = "N")]
    pub max_hosts: Option<usize>,
    /// Draw scaling efficiency against ranks as an SVG to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The workload the flags describe, every field checked.
pub(crate) fn workload(s: &StepArgs) -> Result<Workload, String> {
    let names = || MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ");
    let (params, grad_elem) = match (&s.model, &s.grad_bytes) {
        (Some(_), Some(_)) => return Err("give --model or --grad-bytes, not both".into()),
        (None, None) => {
            return Err(format!(
                "step: the gradients are missing: --model ({}) or --grad-bytes SIZE",
                names()
            ))
        }
        (Some(m), None) => {
            let x = MODELS
                .iter()
                .find(|x| x.0.eq_ignore_ascii_case(m))
                .ok_or_else(|| format!("--model {m:?} is not a preset; allowed: {}", names()))?;
            (x.1, x.2)
        }
        (None, Some(b)) => {
            let bytes = tutti::config::parse_bytes(b)
                .filter(|&b| b >= 4)
                .ok_or_else(|| {
                    format!("--grad-bytes {b:?}: allowed: a size of at least 4 bytes, e.g. 100M")
                })?;
            ((bytes / 4) as u64, 4)
        }
    };
    let compute_ms =
        match (s.compute_ms, s.flops, s.tflops) {
            (Some(ms), None, None) if ms.is_finite() && ms >= 0.0 => ms,
            (Some(ms), None, None) => {
                return Err(format!(
                    "--compute-ms {ms}: allowed: 0 or more milliseconds"
                ))
            }
            (None, Some(f), Some(r)) if f.is_finite() && f >= 0.0 && r.is_finite() && r > 0.0 => {
                f / (r * 1e12) * 1e3
            }
            (None, Some(_), Some(_)) => {
                return Err("--flops and --tflops: allowed: FLOPs >= 0 and a rate > 0".into())
            }
            _ => return Err(
                "step: the compute is missing: --compute-ms MS, or --flops F with --tflops RATE"
                    .into(),
            ),
        };
    let bucket = tutti::config::parse_bytes(&s.bucket)
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            format!(
                "--bucket {:?}: allowed: a positive size, e.g. 25M",
                s.bucket
            )
        })?;
    let overlap = match s.overlap.to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => true,
        "off" | "0" | "false" => false,
        v => return Err(format!("--overlap {v:?}: allowed: on, off")),
    };
    let wire_elem = match s.wire.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => grad_elem,
        Some("f32") => 4,
        Some("bf16") | Some("f16") => 2,
        Some(v) => return Err(format!("--wire {v:?}: allowed: f32, bf16, f16")),
    };
    if !(s.sparsify > 0.0 && s.sparsify <= 1.0) {
        return Err(format!(
            "--sparsify {}: allowed: a fraction in (0, 1], 1 for dense",
            s.sparsify
        ));
    }
    if s.accum == 0 {
        return Err("--accum 0: allowed: 1 or more micro-batches".into());
    }
    let compute_step_ms = compute_ms * s.accum as f64;
    // Measured against measured: where the framework costs less than the
    // two runs' noise, one rank's step can come out below its compute.
    // The framework's cost is then 0, not negative (the report says so).
    let framework_ms = match s.step_1_ms {
        None => 0.0,
        Some(t) if t.is_finite() && t > 0.0 => (t - compute_step_ms).max(0.0),
        Some(t) => {
            return Err(format!(
                "--step-1-ms {t}: allowed: a positive number of milliseconds, one rank's whole step under the framework (at least its compute, {compute_step_ms} ms here), e.g. {}",
                (compute_step_ms * 1.5 * 100.0).round() / 100.0
            ))
        }
    };
    Ok(Workload {
        params,
        grad_elem,
        wire_elem,
        compute_us: compute_ms * 1e3,
        framework_us: framework_ms * 1e3,
        bucket_bytes: bucket as u64,
        overlap,
        sparsify: s.sparsify,
        accum: s.accum,
    })
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1e3)
}

/// Host counts of the scaling table: 1, 2, 4, ... up to `max`, and `max`.
pub(crate) fn host_counts(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut h = 1;
    while h < max {
        v.push(h);
        h *= 2;
    }
    v.push(max.max(1));
    v
}

/// A what-if: what changes, and the predicted step.
pub(crate) struct WhatIf {
    /// What changes.
    pub what: String,
    /// The step with it.
    pub step: StepTime,
    /// Throughput gain (per micro-batch), as a fraction: 0.1 = 10% more.
    pub gain: f64,
}

/// The what-ifs of `w` on `c`, best gain first.
pub(crate) fn what_ifs(c: &Checked, w: &Workload, base: &StepTime) -> Result<Vec<WhatIf>, String> {
    let mut v: Vec<(String, Checked, Workload, Option<Algorithm>)> = Vec::new();
    let pick = base.pick.map(|p| p.alg);
    let alts: Vec<Algorithm> = if c.nranks() > 64 {
        let mut a = vec![
            Algorithm::Ring,
            Algorithm::Tree,
            Algorithm::DoubleTree,
            Algorithm::HalvingDoubling,
        ];
        a.extend(
            Algorithm::VARIANTS
                .iter()
                .copied()
                .find(|x| x.is_hierarchical()),
        );
        a
    } else {
        Algorithm::VARIANTS.to_vec()
    };
    if c.nranks() > 1 {
        // The best forced alternatives to Auto's pick (largest bucket's).
        let mut forced: Vec<(Algorithm, f64)> = Vec::new();
        for a in alts.into_iter().filter(|&a| Some(a) != pick) {
            if let Ok(s) = step_time(c, w, Some(a)) {
                if s.step_us.is_finite() {
                    forced.push((a, s.step_us));
                }
            }
        }
        forced.sort_by(|x, y| x.1.total_cmp(&y.1));
        for (a, _) in forced.into_iter().take(2) {
            v.push((
                format!("algorithm {a} for every bucket"),
                c.clone(),
                w.clone(),
                Some(a),
            ));
        }
    }
    if w.wire_elem == 4 {
        v.push((
            "bf16 on the wire".into(),
            c.clone(),
            Workload {
                wire_elem: 2,
                ..w.clone()
            },
            None,
        ));
    }
    v.push((
        format!("buckets of {} MB", 4 * w.bucket_bytes / 1_000_000),
        c.clone(),
        Workload {
            bucket_bytes: 4 * w.bucket_bytes,
            ..w.clone()
        },
        None,
    ));
    v.push((
        format!("{} accumulation steps", 2 * w.accum),
        c.clone(),
        Workload {
            accum: 2 * w.accum,
            ..w.clone()
        },
        None,
    ));
    if !w.overlap {
        v.push((
            "overlap with backward".into(),
            c.clone(),
            Workload {
                overlap: true,
                ..w.clone()
            },
            None,
        ));
    }
    if w.sparsify >= 1.0 {
        v.push((
            "Top-1% sparsification".into(),
            c.clone(),
            Workload {
                sparsify: 0.01,
                ..w.clone()
            },
            None,
        ));
    }
    if c.hosts > 1 {
        let mut fast = c.clone();
        fast.port_gbps *= 2.0;
        fast.model.tcp.gbps *= 2.0;
        v.push((
            format!("network {:.0} Gbit/s per port (2x)", fast.port_gbps * 8.0),
            fast,
            w.clone(),
            None,
        ));
        let mut nics = c.clone();
        nics.ports *= 2;
        v.push((
            format!("{} NICs per host (2x)", nics.ports),
            nics,
            w.clone(),
            None,
        ));
    }
    let mut host = c.clone();
    host.model.shm.gbps *= 2.0;
    host.model.local.gbps *= 2.0;
    host.model.copy_gbps *= 2.0;
    host.model.reduce_gbps *= 2.0;
    v.push((
        "2x faster memory within hosts".into(),
        host,
        w.clone(),
        None,
    ));
    let base_pb = base.per_batch_us(w);
    let mut out = Vec::new();
    for (what, c2, w2, force) in v {
        let s = step_time(&c2, &w2, force)?;
        let gain = base_pb / s.per_batch_us(&w2) - 1.0;
        out.push(WhatIf {
            what,
            step: s,
            gain,
        });
    }
    out.sort_by(|x, y| y.gain.total_cmp(&x.gain));
    Ok(out)
}

/// Which level limits the largest bucket's call: its time with the
/// network's bandwidth doubled, the host's bandwidth doubled, and every
/// latency halved.
fn bottleneck(c: &Checked, w: &Workload, base: &StepTime) -> String {
    let Some(p) = base.pick else {
        return "bottleneck: none, one rank does not communicate\n".into();
    };
    let elems = (w.bucket_bytes / w.grad_elem.max(1) as u64)
        .min(w.params)
        .max(1) as usize;
    let (coll, count, elem) = if w.sparsify < 1.0 {
        let k = ((elems as f64 * w.sparsify).ceil() as usize).max(1);
        (tutti::Collective::AllGather, k, w.wire_elem + 4)
    } else {
        (tutti::Collective::AllReduce, elems, w.wire_elem)
    };
    let t = |c2: &Checked| {
        price::price_one(c2, coll, count, elem, p.alg, p.chunks).map_or(f64::NAN, |s| s.us)
    };
    let t0 = p.stats.us;
    let mut net = c.clone();
    net.port_gbps *= 2.0;
    net.model.tcp.gbps *= 2.0;
    let mut host = c.clone();
    host.model.shm.gbps *= 2.0;
    host.model.copy_gbps *= 2.0;
    host.model.reduce_gbps *= 2.0;
    let mut lat = c.clone();
    lat.model.tcp.alpha_us /= 2.0;
    lat.model.shm.alpha_us /= 2.0;
    lat.model.step_us /= 2.0;
    let mut cands = vec![
        ("host memory bandwidth (level 0)", t(&host)),
        ("latency", t(&lat)),
    ];
    if c.hosts > 1 {
        cands.push(("network bandwidth (level 1)", t(&net)));
    }
    cands.sort_by(|x, y| x.1.total_cmp(&y.1));
    let cut = |x: f64| 100.0 * (1.0 - x / t0);
    let mut s = format!(
        "bottleneck: {} — the largest bucket's {} ({}, {:.0} us) is {:.0}% faster with it doubled (others: {})\n",
        cands[0].0,
        if w.sparsify < 1.0 { "AllGather" } else { "AllReduce" },
        price::label(&p),
        t0,
        cut(cands[0].1),
        cands[1..]
            .iter()
            .map(|x| format!("{} {:.0}%", x.0, cut(x.1)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if c.hosts > 1 && t0 > 0.0 {
        let per_host = p.stats.net_bytes / c.hosts as f64;
        let rate = per_host / t0 / 1e3;
        let cap = c.port_gbps * c.ports as f64 / c.oversub;
        s += &format!(
            "  each host's network ports carried {:.1} MB out in {:.0} us: {:.1} Gbit/s of {:.1} ({:.0}% used)\n",
            per_host / 1e6,
            t0,
            rate * 8.0,
            cap * 8.0,
            100.0 * rate / cap
        );
    }
    s
}

/// The report of `tutti sim CLUSTER step`.
pub(super) fn run(a: &SimArgs, c: &Checked) -> Result<String, String> {
    let started = std::time::Instant::now();
    let w = workload(&a.step)?;
    let max_hosts = a.step.max_hosts.unwrap_or(c.hosts);
    if max_hosts == 0 {
        return Err("--max-hosts 0: allowed: 1 or more".into());
    }
    let base = step_time(c, &w, None)?;
    let mut out = super::describe(c, a.cluster.as_deref().unwrap_or_default());
    out += &format!(
        "# step: {} parameters, {} B per gradient, {} B on the wire{}, buckets of {} MB ({} per step), {} micro-batch(es) of {} ms, overlap {}\n\n",
        w.params,
        w.grad_elem,
        w.wire_elem,
        if w.sparsify < 1.0 { format!(", Top-{}%", w.sparsify * 100.0) } else { String::new() },
        w.bucket_bytes as f64 / 1e6,
        base.buckets,
        w.accum,
        ms(w.compute_us),
        if w.overlap { "on" } else { "off" }
    );
    let share = if base.step_us > 0.0 {
        100.0 * base.exposed_us / base.step_us
    } else {
        0.0
    };
    out += &format!(
        "step on {} ranks: {} ms = compute {} ms{} + exposed communication {} ms ({share:.0}% of the step); overlapped communication {} ms; algorithm {}\n",
        c.nranks(),
        ms(base.step_us),
        ms(base.compute_us),
        if base.framework_us > 0.0 {
            format!(" + framework {} ms", ms(base.framework_us))
        } else {
            String::new()
        },
        ms(base.exposed_us),
        ms(base.overlapped_us()),
        base.pick.as_ref().map_or("-".into(), price::label),
    );
    if base.slowdown > 1.0 {
        out += &format!(
            "  compute: {} ms per micro-batch x {:.2}: {} ranks share {} cores (shared_cores)\n",
            ms(w.compute_us),
            base.slowdown,
            c.nranks(),
            c.shared_cores.unwrap_or_default()
        );
    }
    if let Some(t) = a.step.step_1_ms.filter(|_| w.framework_us == 0.0) {
        out += &format!(
            "  framework: 0 ms (--step-1-ms {t} is not above one rank's compute {} ms: its cost is within the measurements' noise)\n",
            ms(w.compute_us * w.accum as f64),
        );
    }
    if w.framework_us > 0.0 {
        out += &format!(
            "  framework: {} ms per step{} (--step-1-ms {} less one rank's compute {} ms), not overlapped\n",
            ms(w.framework_us),
            if base.slowdown > 1.0 {
                format!(" x {:.2}", base.slowdown)
            } else {
                String::new()
            },
            ms(base.alone_us),
            ms(w.compute_us * w.accum as f64),
        );
    }
    out += "\n";
    out += "scaling (same per-rank batch; efficiency = one rank's step alone / step)\n";
    out += &format!(
        "  {:>6}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}  {}\n",
        "hosts", "ranks", "step (ms)", "comm (ms)", "exposed", "efficiency", "algorithm"
    );
    let mut points: Vec<(u64, f64)> = vec![(1, 100.0)];
    out += &format!(
        "  {:>6}  {:>6}  {:>10}  {:>10}  {:>10}  {:>9.1}%  -\n",
        1,
        1,
        ms(base.alone_us),
        ms(0.0),
        ms(0.0),
        100.0
    );
    for h in host_counts(max_hosts) {
        let ch = super::with_hosts(c, h);
        if ch.nranks() == 1 {
            continue;
        }
        let s = step_time(&ch, &w, None)?;
        out += &format!(
            "  {:>6}  {:>6}  {:>10}  {:>10}  {:>10}  {:>9.1}%  {}\n",
            h,
            ch.nranks(),
            ms(s.step_us),
            ms(s.comm_us),
            ms(s.exposed_us),
            100.0 * s.efficiency(),
            s.pick.as_ref().map_or("-".into(), price::label)
        );
        points.push((ch.nranks() as u64, 100.0 * s.efficiency()));
    }
    out += "\n";
    out += &bottleneck(c, &w, &base);
    out += "\nwhat-ifs (predicted step, and throughput gain against now)\n";
    for x in what_ifs(c, &w, &base)? {
        out += &format!(
            "  {:<44} {:>10} ms  {:>+7.1}%\n",
            x.what,
            ms(x.step.step_us),
            100.0 * x.gain
        );
    }
    out += &format!("# simulated in {:.2} s\n", started.elapsed().as_secs_f64());
    if let Some(p) = &a.step.plot {
        crate::plot::efficiency_svg(p, &format!("tutti sim: {}", c.name), &points)?;
        out += &format!("# wrote {}\n", p.display());
    }
    Ok(out)
}

//! `tutti perf`: collectives measured in the style of nccl-tests.
//!
//! Without a launcher, `tutti perf -n N` starts N local ranks of itself (as
//! `tutti run` would) and rank 0 prints; under `tutti run`, torchrun, Slurm
//! or mpirun it uses the ranks it is given.
//!
//! For every size: one call to warm up and estimate the time, the calls
//! Auto's online tuning spends on the shape (untimed), more warm-up calls, a
//! barrier, `iters` timed back-to-back calls on every rank; the time
//! reported is the mean per call, maximum over ranks. All ranks derive the
//! same warm-up and iteration counts from an all-reduced estimate, so they
//! always issue the same calls. With `-c 1` the inputs are then refilled with
//! check data, the call runs once more and every rank counts wrong output
//! elements (see [`bench`](mod@bench)); `#wrong` is the sum over ranks.

pub(crate) mod bench;
mod header;
mod measure;
mod plan;
pub(crate) mod report;

use crate::launch;
pub(crate) use header::{gather_info, short_host};
use header::{header, transport_summary, RankInfo};
use measure::{measure, settle, Meas};
pub(crate) use plan::PerfArgs;
use plan::{Count, Plan, DEFAULT_RANKS};
use report::Row;
use std::io::IsTerminal;
use tutti::{CollKind, Communicator, DataType};

/// `tutti perf`.
pub(crate) fn main(a: PerfArgs) -> Result<i32, String> {
    if !a.plot_from.is_empty() {
        let plot = a
            .plot
            .as_ref()
            .expect("clap requires --plot with --plot-from");
        let mut series = Vec::new();
        for p in &a.plot_from {
            series.extend(report::read_series(p)?);
        }
        crate::plot::busbw_svg(plot, "busbw vs size", &series)?;
        eprintln!("tutti perf: wrote {}", plot.display());
        return Ok(0);
    }
    let plan = Plan::parse(&a)?;
    if !a.as_rank {
        let world = launch::launcher_world();
        let spawn = match world {
            None => true,
            // A one-task allocation (salloc, sbatch) with an explicit -n: start them here.
            Some(w) => a.nranks.is_some() && w <= 1,
        };
        if spawn {
            let n = a.nranks.unwrap_or(DEFAULT_RANKS);
            if n == 0 {
                return Err("-n must be at least 1".into());
            }
            return launch::relaunch_self(n, "--as-rank");
        }
    }
    worker(&a, &plan)
}

/// Runs `f` with the element type named by `t`.
macro_rules! with_type {
    ($t:expr, $T:ident => $body:expr) => {
        match $t {
            DataType::F32 => {
                type $T = f32;
                $body
            }
            DataType::F64 => {
                type $T = f64;
                $body
            }
            DataType::F16 => {
                type $T = half::f16;
                $body
            }
            DataType::Bf16 => {
                type $T = half::bf16;
                $body
            }
            DataType::I8 => {
                type $T = i8;
                $body
            }
            DataType::U8 => {
                type $T = u8;
                $body
            }
            DataType::I32 => {
                type $T = i32;
                $body
            }
            DataType::I64 => {
                type $T = i64;
                $body
            }
            DataType::U32 => {
                type $T = u32;
                $body
            }
            DataType::U64 => {
                type $T = u64;
                $body
            }
        }
    };
}

/// Why `kind` cannot be measured in this setting, if it cannot.
fn skip_reason(kind: CollKind, plan: &Plan, comm: &Communicator) -> Option<String> {
    let (n, r) = (comm.size(), comm.rank());
    if kind == CollKind::SendRecv && n < 2 {
        return Some("send_recv needs at least 2 ranks".into());
    }
    if let Some(w) = plan.opts.wire.filter(|_| bench::reduces(kind)) {
        if plan.dtype != tutti::DataType::F32
            || !matches!(plan.op, tutti::ReduceOp::Sum | tutti::ReduceOp::Avg)
        {
            return Some(format!(
                "a {w} wire needs f32 data and sum or avg, not {} {}",
                plan.dtype, plan.op
            ));
        }
    }
    if let Some(a) = plan.algo {
        let coll = match kind {
            CollKind::SendRecv => tutti::Collective::Send { peer: (r + 1) % n },
            k => bench::collective(k, plan.root),
        };
        // The host layout matters: hierarchical builds only across hosts.
        let mut p = tutti::algo::Problem::new(coll, n, r, 0);
        p.hosts = comm.hosts();
        if a.build(&p).is_none() {
            return Some(format!("algorithm {a} does not implement {kind}"));
        }
    }
    None
}

fn worker(a: &PerfArgs, plan: &Plan) -> Result<i32, String> {
    let comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let (n, lead) = (comm.size(), comm.rank() == 0);
    if plan.root >= n {
        return Err(format!(
            "-r {}: the root must be a rank in 0..{n}",
            plan.root
        ));
    }
    if lead && !a.as_rank {
        if let Some(want) = a.nranks.filter(|&w| w != n) {
            eprintln!("tutti perf: -n {want} ignored: the launcher started {n} ranks");
        }
    }
    let err = |e: tutti::Error| e.to_string();
    let info: Vec<RankInfo> = gather_info(&comm)
        .map_err(err)?
        .into_iter()
        .map(|(pid, transports)| RankInfo { pid, transports })
        .collect();
    let transport = transport_summary(&comm.topology().transports);
    if lead {
        print!("{}", header(&comm, a, plan, &info));
    }
    let esz = plan.dtype.size();
    let bar = (lead && std::io::stderr().is_terminal()).then(|| {
        let total = plan.colls.len() * plan.sizes.len();
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(total as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} {elapsed:>4} [{bar:30}] {pos}/{len} {msg}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb
    });
    let say = |s: String| match &bar {
        Some(pb) => pb.suspend(|| println!("{s}")),
        None => println!("{s}"),
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut total_wrong = 0u64;
    for &kind in &plan.colls {
        if let Some(why) = skip_reason(kind, plan, &comm) {
            if lead {
                say(format!("#\n# {kind}: skipped, {why}"));
            }
            if let Some(pb) = &bar {
                pb.inc(plan.sizes.len() as u64);
            }
            continue;
        }
        if lead {
            say(report::table_header(kind.name()));
        }
        if !matches!(plan.warmup, Count::Exact(0)) {
            let (_, count) = bench::shape(kind, plan.sizes[0], n, esz);
            with_type!(plan.dtype, T => settle::<T>(&comm, plan, kind, count)).map_err(err)?;
        }
        let mut seen = Vec::new();
        let mut busbw_sum = (0.0, 0usize);
        let mut wrong_here = 0u64;
        for &req in &plan.sizes {
            if let Some(pb) = &bar {
                pb.set_message(format!("{kind} {}", report::human_bytes(req as u64)));
                pb.inc(1);
            }
            let (size, count) = bench::shape(kind, req, n, esz);
            if seen.contains(&size) {
                continue;
            }
            seen.push(size);
            let row = |m: &Meas, in_place: bool| {
                let algbw = if m.time_us > 0.0 {
                    size as f64 / (m.time_us * 1e-6) / 1e9
                } else {
                    0.0
                };
                Row {
                    label: a.label.clone(),
                    coll: kind.name(),
                    nranks: n,
                    size_bytes: size,
                    count,
                    iters: m.iters,
                    time_us: m.time_us,
                    algbw,
                    busbw: algbw * bench::bus_factor(kind, n),
                    wrong: m.wrong,
                    in_place,
                    dtype: match plan.opts.wire.filter(|_| bench::reduces(kind)) {
                        Some(w) => format!("{}@{w}", plan.dtype),
                        None => plan.dtype.to_string(),
                    },
                    op: if bench::reduces(kind) {
                        plan.op.to_string()
                    } else {
                        "none".into()
                    },
                    root: if bench::rooted(kind) {
                        plan.root as i64
                    } else {
                        -1
                    },
                    algo: match (plan.algo, &m.picked) {
                        (Some(x), _) => x.to_string(),
                        (None, Some(p)) => format!("auto:{p}"),
                        (None, None) => "auto".into(),
                    },
                    transport: transport.clone(),
                }
            };
            let oop = with_type!(plan.dtype, T => measure::<T>(&comm, plan, kind, count, false))
                .map_err(err)?;
            let oop = row(&oop, false);
            let ip = if kind == CollKind::AllReduce {
                let m = with_type!(plan.dtype, T => measure::<T>(&comm, plan, kind, count, true))
                    .map_err(err)?;
                Some(row(&m, true))
            } else {
                None
            };
            for r in std::iter::once(&oop).chain(ip.as_ref()) {
                busbw_sum.0 += r.busbw;
                busbw_sum.1 += 1;
                wrong_here += r.wrong.unwrap_or(0);
            }
            if lead {
                say(report::table_line(&oop, ip.as_ref(), size / esz.max(1)));
            }
            rows.push(oop);
            rows.extend(ip);
            if kind == CollKind::Barrier {
                break;
            }
        }
        if lead {
            let avg = busbw_sum.0 / busbw_sum.1.max(1) as f64;
            let ok = if !plan.check {
                "(not checked)".to_string()
            } else if wrong_here == 0 {
                "OK".into()
            } else {
                "FAILED".into()
            };
            say(format!(
                "# Out of bounds values : {wrong_here} {ok}\n# Avg bus bandwidth    : {avg:.4}"
            ));
        }
        total_wrong += wrong_here;
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if lead {
        write_outputs(a, plan, &comm, &rows)?;
    }
    Ok(if total_wrong > 0 { 1 } else { 0 })
}

fn write_outputs(
    a: &PerfArgs,
    plan: &Plan,
    comm: &Communicator,
    rows: &[Row],
) -> Result<(), String> {
    if let Some(p) = &a.csv {
        report::write_csv(p, rows).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if let Some(p) = &a.json {
        let topo = comm.topology();
        let meta = serde_json::json!({
            "label": a.label,
            "nranks": comm.size(),
            "hosts": topo.hosts,
            "dtype": plan.dtype.to_string(),
            "op": plan.op.to_string(),
            "algo": plan.algo.map_or("auto".into(), |x| x.to_string()),
            "tutti_algo": Some(&comm.config().algo)
                .filter(|o| !o.is_empty())
                .map(|o| o.to_string()),
            "transports_rank0": topo.transports,
            "check": plan.check,
        });
        report::write_json(p, &meta, rows)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        let mut series: Vec<report::Series> = Vec::new();
        for r in rows.iter().filter(|r| !r.in_place && r.coll != "barrier") {
            let name = format!("{} {} n={}", r.label, r.coll, r.nranks);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((r.size_bytes as u64, r.busbw)),
                None => series.push(report::Series {
                    name,
                    points: vec![(r.size_bytes as u64, r.busbw)],
                }),
            }
        }
        crate::plot::busbw_svg(
            p,
            &format!("tutti perf, {} ranks, {}", comm.size(), plan.dtype),
            &series,
        )?;
    }
    Ok(())
}

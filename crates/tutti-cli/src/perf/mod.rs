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
pub(crate) mod report;

use crate::launch;
use bench::{Bench, Val};
use report::Row;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tutti::{Algorithm, CollKind, Communicator, DataType, Options, ReduceOp, TransportKind};

/// Arguments of `tutti perf` (nccl-tests' flags where they exist).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct PerfArgs {
    /// all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all,
    /// send_recv, gather, scatter, barrier, or all.
    #[arg(value_name = "COLLECTIVE", default_value = "all_reduce")]
    pub collective: String,
    /// Ranks to start locally (default 4); ignored under a launcher, which sets the ranks.
    #[arg(short = 'n', long = "nranks", value_name = "N")]
    pub nranks: Option<usize>,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(
        short = 'b',
        long = "minbytes",
        value_name = "SIZE",
        default_value = "8"
    )]
    pub minbytes: String,
    /// Largest size in bytes (K, M, G suffixes).
    #[arg(
        short = 'e',
        long = "maxbytes",
        value_name = "SIZE",
        default_value = "64M"
    )]
    pub maxbytes: String,
    /// Multiply the size by this factor between rows.
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "F",
        default_value_t = 2
    )]
    pub stepfactor: usize,
    /// Warm-up calls per size [default: 5, more to fill ~2 ms, fewer when a call takes long].
    #[arg(
        short = 'w',
        long = "warmup-iters",
        alias = "warmup_iters",
        value_name = "N"
    )]
    pub warmup: Option<usize>,
    /// Timed calls per size [default: 20, more to fill ~10 ms, capped at ~0.2 s of calls]; given explicitly, exactly N.
    #[arg(short = 'i', long = "iters", value_name = "N", conflicts_with = "time")]
    pub iters: Option<usize>,
    /// Seconds of timed calls per size; the iteration count follows (like the peers' -t).
    #[arg(short = 'T', long = "time", value_name = "SECS")]
    pub time: Option<f64>,
    /// Element type: f32, f64, f16, bf16, i8, u8, i32, i64, u32, u64.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "f32"
    )]
    pub datatype: String,
    /// Reduction: sum, prod, max, min, avg.
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum")]
    pub op: String,
    /// Force an algorithm on every measured call (ring, tree, double_tree,
    /// halving_doubling, direct, pairwise, two_shot, hierarchical, or
    /// 'hierarchical(intra=A,inter=B)'); auto lets the tuner (and TUTTI_ALGO) choose.
    #[arg(
        short = 'a',
        long = "algo",
        value_name = "ALGO",
        default_value = "auto"
    )]
    pub algo: String,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", value_name = "0|1", default_value_t = 1)]
    pub check: u8,
    /// Root of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub root: usize,
    /// Deadline of each call, seconds (default: TUTTI_TIMEOUT or 300).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Write every row as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write every row as CSV to FILE (the peers' columns plus tutti's).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw busbw against size as an SVG to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Plot these CSV files (tutti's or the peers') into --plot instead of measuring.
    #[arg(
        long,
        value_name = "A.csv,B.csv",
        value_delimiter = ',',
        requires = "plot"
    )]
    pub plot_from: Vec<PathBuf>,
    /// Label of this run in CSV, JSON and plots.
    #[arg(long, value_name = "NAME", default_value = "tutti")]
    pub label: String,
    /// Internal: this process is a rank started by `tutti perf -n N`.
    #[arg(long, hide = true)]
    pub as_rank: bool,
}

/// Default number of ranks `tutti perf` starts.
const DEFAULT_RANKS: usize = 4;
/// Default cap on timed work per size, seconds.
const CAP_SECS: f64 = 0.2;
/// By default, warm-up calls fill at least this many seconds per size.
const MIN_WARMUP_SECS: f64 = 0.002;
/// By default, timed calls fill at least this many seconds per size. Small
/// calls are otherwise timed over a few tens of microseconds, in which the
/// first calls after a change of size weigh heavily: 2 ranks, send_recv of
/// 2 KiB, 5 warm-up and 20 timed calls measured 8.3-17.7 us a call in three
/// runs, 1.5-2.2 us with 200 or 2000 timed calls (4 KiB: 15.2-16.1 against
/// 2.6-3.1; AllReduce of 4 KiB 5.66 against 0.80).
const MIN_TIMED_SECS: f64 = 0.01;

/// How many warm-up and timed calls to make.
#[derive(Clone, Copy, Debug)]
enum Count {
    /// Exactly this many (given on the command line).
    Exact(usize),
    /// This many, or more to fill the given seconds, and at most about
    /// `CAP_SECS` of calls.
    Capped(usize, f64),
    /// As many as fit in this many seconds.
    Timed(f64),
}

impl Count {
    fn for_estimate(self, secs_per_call: f64) -> usize {
        let t = secs_per_call.max(1e-9);
        match self {
            Count::Exact(n) => n,
            Count::Capped(n, min) => n
                .max((min / t).ceil() as usize)
                .min(((CAP_SECS / t).ceil() as usize).max(1)),
            Count::Timed(s) => ((s / t).round() as usize).clamp(1, 1_000_000),
        }
    }
}

/// The parsed, validated command line.
#[derive(Clone, Debug)]
struct Plan {
    colls: Vec<CollKind>,
    sizes: Vec<usize>,
    dtype: DataType,
    op: ReduceOp,
    algo: Option<Algorithm>,
    warmup: Count,
    iters: Count,
    check: bool,
    root: usize,
    opts: Options,
}

fn parse_size(flag: &str, v: &str) -> Result<usize, String> {
    tutti::config::parse_bytes(v)
        .ok_or_else(|| format!("{flag} {v:?} is not a size (e.g. 8, 64K, 256M, 1G)"))
}

impl Plan {
    fn parse(a: &PerfArgs) -> Result<Plan, String> {
        let colls = if a.collective.eq_ignore_ascii_case("all") {
            CollKind::ALL.to_vec()
        } else {
            vec![a
                .collective
                .parse::<CollKind>()
                .map_err(|e| e.to_string())?]
        };
        let (lo, hi) = (
            parse_size("-b", &a.minbytes)?,
            parse_size("-e", &a.maxbytes)?,
        );
        if lo == 0 || lo > hi {
            return Err(format!(
                "the size range -b {} -e {} is empty; -b must be at least 1 and at most -e",
                a.minbytes, a.maxbytes
            ));
        }
        if a.stepfactor < 2 {
            return Err("-f must be at least 2".into());
        }
        let mut sizes = Vec::new();
        let mut s = lo;
        while s <= hi {
            sizes.push(s);
            s = match s.checked_mul(a.stepfactor) {
                Some(x) => x,
                None => break,
            };
        }
        let algo = if a.algo.eq_ignore_ascii_case("auto") {
            None
        } else {
            Some(a.algo.parse::<Algorithm>().map_err(|e| e.to_string())?)
        };
        if a.check > 1 {
            return Err("-c takes 0 or 1".into());
        }
        let timeout = match a.timeout {
            None => None,
            Some(t) if t > 0.0 && t.is_finite() => Some(Duration::from_secs_f64(t)),
            Some(_) => return Err("--timeout must be a positive number of seconds".into()),
        };
        let (warmup, iters) = match a.time {
            Some(t) if !(t > 0.0 && t.is_finite()) => {
                return Err("--time must be a positive number of seconds".into())
            }
            Some(t) => (
                a.warmup
                    .map_or(Count::Capped(5, MIN_WARMUP_SECS), Count::Exact),
                Count::Timed(t),
            ),
            None => (
                a.warmup
                    .map_or(Count::Capped(5, MIN_WARMUP_SECS), Count::Exact),
                a.iters
                    .map_or(Count::Capped(20, MIN_TIMED_SECS), Count::Exact),
            ),
        };
        if matches!(iters, Count::Exact(0)) {
            return Err("-i must be at least 1".into());
        }
        Ok(Plan {
            colls,
            sizes,
            dtype: a
                .datatype
                .parse()
                .map_err(|e: tutti::Error| e.to_string())?,
            op: a.op.parse().map_err(|e: tutti::Error| e.to_string())?,
            algo,
            warmup,
            iters,
            check: a.check == 1,
            root: a.root,
            opts: Options {
                algorithm: algo,
                timeout,
            },
        })
    }
}

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

/// One measurement.
struct Meas {
    time_us: f64,
    iters: usize,
    wrong: Option<u64>,
    /// What Auto ran (`ring`, `tree/4`: algorithm and pipeline chunks),
    /// if nothing was forced.
    picked: Option<String>,
}

fn all_max(comm: &Communicator, x: f64) -> tutti::Result<f64> {
    let mut v = [x];
    comm.all_reduce(&mut v, ReduceOp::Max)?;
    Ok(v[0])
}

fn all_sum(comm: &Communicator, x: u64) -> tutti::Result<u64> {
    let mut v = [x];
    comm.all_reduce(&mut v, ReduceOp::Sum)?;
    Ok(v[0])
}

/// Seconds per call of `k` calls.
fn time_calls<T: Val>(b: &mut Bench<'_, T>, k: usize) -> tutti::Result<f64> {
    let t = Instant::now();
    b.run_n(k)?;
    Ok(t.elapsed().as_secs_f64() / k.max(1) as f64)
}

/// Untimed calls before a collective's first size, for about this long.
const SETTLE_SECS: f64 = 0.05;
/// At most this many of them.
const SETTLE_MAX: usize = 10_000;

/// Before a collective's first size: calls of that size for about
/// [`SETTLE_SECS`], untimed, as nccl-tests warms up once before its sizes.
/// A run's first calls find the ranks not yet settled: with 4 ranks on 2
/// cores, an 8-byte AllReduce took 10-17 us per call with the usual 5
/// warm-up calls, 7 us after 100, and 2.9-3.8 us (as every later size)
/// after 1000 or more.
fn settle<T: Val>(
    comm: &Communicator,
    plan: &Plan,
    kind: CollKind,
    count: usize,
) -> tutti::Result<()> {
    let (mut b, first) = first_call::<T>(comm, plan, kind, count, false)?;
    let k = ((SETTLE_SECS / first.max(1e-9)) as usize).clamp(1, SETTLE_MAX);
    b.run_n(k)
}

/// A filled bench and the time of its first call (max over ranks); that
/// call also faults the fresh buffers in, so it is a warm-up call.
fn first_call<'c, T: Val>(
    comm: &'c Communicator,
    plan: &Plan,
    kind: CollKind,
    count: usize,
    in_place: bool,
) -> tutti::Result<(Bench<'c, T>, f64)> {
    let mut b = Bench::<T>::new(comm, kind, plan.root, count, plan.op, in_place, plan.opts);
    b.fill();
    let first = all_max(comm, time_calls(&mut b, 1)?)?;
    Ok((b, first))
}

fn measure<T: Val>(
    comm: &Communicator,
    plan: &Plan,
    kind: CollKind,
    count: usize,
    in_place: bool,
) -> tutti::Result<Meas> {
    let (mut b, first) = first_call::<T>(comm, plan, kind, count, in_place)?;
    // Auto times candidate algorithms on a shape's first calls (online
    // tuning): let it decide before the warm-up, so that the timed calls
    // run the algorithm it keeps.
    while b.tuning() {
        b.run()?;
    }
    let more = plan.warmup.for_estimate(first).saturating_sub(1);
    let est = if more > 0 {
        all_max(comm, time_calls(&mut b, more)?)?
    } else {
        first
    };
    let iters = plan.iters.for_estimate(est);
    let picked = match (plan.algo, kind) {
        (None, k) if k != CollKind::SendRecv => {
            let c = comm.plan(bench::collective(kind, plan.root), count, T::DTYPE)?;
            let chunks = if c.chunks > 1 {
                format!("/{}", c.chunks)
            } else {
                String::new()
            };
            Some(format!("{}{chunks}{}", c.algorithm, c.twin()))
        }
        _ => None,
    };
    comm.barrier()?;
    let t = time_calls(&mut b, iters)?;
    let time = all_max(comm, t)?;
    let wrong = if plan.check {
        b.fill();
        b.run()?;
        Some(all_sum(comm, b.wrong())?)
    } else {
        None
    };
    Ok(Meas {
        time_us: time * 1e6,
        iters,
        wrong,
        picked,
    })
}

/// What every rank is: pid and transports (0 none, 1 local, 2 shm, 3 tcp), gathered to all.
struct RankInfo {
    pid: u64,
    transports: Vec<Option<TransportKind>>,
}

fn code(t: Option<TransportKind>) -> u64 {
    match t {
        None => 0,
        Some(TransportKind::Local) => 1,
        Some(TransportKind::Shm) => 2,
        Some(TransportKind::Tcp) => 3,
    }
}

fn uncode(c: u64) -> Option<TransportKind> {
    match c {
        1 => Some(TransportKind::Local),
        2 => Some(TransportKind::Shm),
        3 => Some(TransportKind::Tcp),
        _ => None,
    }
}

/// Every rank's pid and transports, on every rank.
pub(crate) fn gather_info(
    comm: &Communicator,
) -> tutti::Result<Vec<(u64, Vec<Option<TransportKind>>)>> {
    let n = comm.size();
    let mine: Vec<u64> = std::iter::once(std::process::id() as u64)
        .chain(comm.topology().transports.iter().map(|t| code(*t)))
        .collect();
    let mut all = vec![0u64; n * (n + 1)];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(n + 1)
        .map(|c| (c[0], c[1..].iter().map(|&x| uncode(x)).collect()))
        .collect())
}

/// `shm`, `tcp`, `shm+tcp`: the kinds in `ts`.
fn transport_summary(ts: &[Option<TransportKind>]) -> String {
    let mut kinds: Vec<String> = Vec::new();
    for t in ts.iter().flatten() {
        let s = t.to_string();
        if !kinds.contains(&s) {
            kinds.push(s);
        }
    }
    if kinds.is_empty() {
        "none".into()
    } else {
        kinds.join("+")
    }
}

/// The short host name of a host id (`hostname/boot/netns`).
pub(crate) fn short_host(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

fn header(comm: &Communicator, a: &PerfArgs, plan: &Plan, info: &[RankInfo]) -> String {
    let topo = comm.topology();
    let n = comm.size();
    let mut h = String::new();
    let what = if plan.colls.len() == 1 {
        plan.colls[0].name()
    } else {
        "all"
    };
    let algo = match plan.algo {
        Some(x) => format!("{x} (forced with -a)"),
        None if comm.config().algo.is_empty() => "auto (tuner)".into(),
        None => format!("auto, TUTTI_ALGO={}", comm.config().algo),
    };
    let count = |c: Count, what: &str| match c {
        Count::Exact(k) => format!("{what} {k}"),
        Count::Capped(k, min) => format!(
            "{what} {k} (at least ~{} ms, at most ~{CAP_SECS} s per size)",
            min * 1e3
        ),
        Count::Timed(s) => format!("{what}: {s} s per size"),
    };
    h += &format!(
        "# tutti perf {what}: {n} ranks on {} host(s), local size {}, dtype {}, op {}, root {}\n",
        topo.hosts.len(),
        comm.local_size(),
        plan.dtype,
        plan.op,
        plan.root
    );
    h += &format!(
        "#   sizes {} .. {} x{}, {}, {}, check {}, algorithm {}\n#\n",
        report::human_bytes(plan.sizes[0] as u64),
        report::human_bytes(*plan.sizes.last().expect("at least one size") as u64),
        a.stepfactor,
        count(plan.warmup, "warm-up"),
        count(plan.iters, "iters"),
        if plan.check { "on" } else { "off" },
        algo
    );
    for (r, i) in info.iter().enumerate() {
        let peers = if n <= 16 {
            i.transports
                .iter()
                .enumerate()
                .filter_map(|(q, t)| t.map(|t| format!("{q}:{t}")))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            transport_summary(&i.transports)
        };
        h += &format!(
            "#  Rank {r:>3}  Pid {:>7}  on {:<16} local {}/{}  transports {}\n",
            i.pid,
            short_host(&topo.hosts[topo.host_of[r]].id),
            topo.local_rank[r],
            topo.local_size(r),
            if peers.is_empty() { "-".into() } else { peers }
        );
    }
    h
}

/// Why `kind` cannot be measured in this setting, if it cannot.
fn skip_reason(kind: CollKind, plan: &Plan, comm: &Communicator) -> Option<String> {
    let (n, r) = (comm.size(), comm.rank());
    if kind == CollKind::SendRecv && n < 2 {
        return Some("send_recv needs at least 2 ranks".into());
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
                    dtype: plan.dtype.to_string(),
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

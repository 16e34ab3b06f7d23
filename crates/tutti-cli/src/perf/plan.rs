//! The command line of `tutti perf`: its arguments ([`PerfArgs`]) and the
//! checked plan made of them ([`Plan`]): the collectives, sizes, type and
//! options, and how many calls to warm up and time ([`Count`]).

use std::path::PathBuf;
use std::time::Duration;
use tutti::{Algorithm, CollKind, DataType, Options, ReduceOp};

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
    /// A 16-bit wire for the f32 reductions (all_reduce, reduce_scatter,
    /// reduce; sum or avg): bf16 or f16. The data travels in that type and
    /// every rank adds in f32; the other collectives run as they are.
    #[arg(long, value_name = "bf16|f16")]
    pub wire: Option<String>,
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
pub(super) const DEFAULT_RANKS: usize = 4;
/// Default cap on timed work per size, seconds.
pub(super) const CAP_SECS: f64 = 0.2;
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
pub(super) enum Count {
    /// Exactly this many (given on the command line).
    Exact(usize),
    /// This many, or more to fill the given seconds, and at most about
    /// `CAP_SECS` of calls.
    Capped(usize, f64),
    /// As many as fit in this many seconds.
    Timed(f64),
}

impl Count {
    pub(super) fn for_estimate(self, secs_per_call: f64) -> usize {
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
pub(super) struct Plan {
    pub(super) colls: Vec<CollKind>,
    pub(super) sizes: Vec<usize>,
    pub(super) dtype: DataType,
    pub(super) op: ReduceOp,
    pub(super) algo: Option<Algorithm>,
    pub(super) warmup: Count,
    pub(super) iters: Count,
    pub(super) check: bool,
    pub(super) root: usize,
    pub(super) opts: Options,
}

fn parse_size(flag: &str, v: &str) -> Result<usize, String> {
    tutti::config::parse_bytes(v)
        .ok_or_else(|| format!("{flag} {v:?} is not a size (e.g. 8, 64K, 256M, 1G)"))
}

impl Plan {
    pub(super) fn parse(a: &PerfArgs) -> Result<Plan, String> {
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
        let wire = match &a.wire {
            None => None,
            Some(w) => {
                let t: DataType = w.parse().map_err(|e: tutti::Error| e.to_string())?;
                if !matches!(t, DataType::Bf16 | DataType::F16) {
                    return Err(format!("--wire takes bf16 or f16, not {w}"));
                }
                Some(t)
            }
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
                wire,
            },
        })
    }
}

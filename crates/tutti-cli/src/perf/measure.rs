//! Measuring one size: the untimed calls that settle the ranks before a
//! collective's first size ([`settle`]), then a warm-up, the calls online
//! tuning spends, and the timed calls ([`measure`]), each time the maximum
//! over ranks.

use super::bench::{self, Bench, Val};
use super::plan::Plan;
use std::time::Instant;
use tutti::{CollKind, Communicator, Options, ReduceOp};

/// One measurement.
pub(super) struct Meas {
    pub(super) time_us: f64,
    pub(super) iters: usize,
    pub(super) wrong: Option<u64>,
    /// What Auto ran (`ring`, `tree/4`: algorithm and pipeline chunks),
    /// if nothing was forced.
    pub(super) picked: Option<String>,
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
pub(super) fn settle<T: Val>(
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
    // The wire applies to the reductions; the other collectives run plain.
    let opts = Options {
        wire: plan.opts.wire.filter(|_| bench::reduces(kind)),
        ..plan.opts
    };
    let mut b = Bench::<T>::new(comm, kind, plan.root, count, plan.op, in_place, opts);
    b.fill();
    let first = all_max(comm, time_calls(&mut b, 1)?)?;
    Ok((b, first))
}

pub(super) fn measure<T: Val>(
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

/// The API's own cost per call: an 8-byte f32 AllReduce on a 1-rank
/// communicator (no peer, so no transport), in ns, the median of 5 blocks
/// of 20,000 calls. `None` if the communicator cannot be made.
pub(super) fn api_overhead_ns() -> Option<f64> {
    let comm = Communicator::init_all(1).ok()?.pop()?;
    let mut x = [1.0f32, 2.0];
    let mut blocks = Vec::with_capacity(5);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..20_000 {
            comm.all_reduce(&mut x, ReduceOp::Sum).ok()?;
        }
        blocks.push(t.elapsed().as_secs_f64() * 1e9 / 20_000.0);
    }
    blocks.sort_by(f64::total_cmp);
    Some(blocks[2])
}

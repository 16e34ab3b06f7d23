//! Auto against every forced algorithm, in one communicator: run under
//! `tutti run -n N` (bench/auto_vs_forced.sh does). For each size, every
//! round times Auto and each algorithm forced per call (`Options`), each
//! round starting one choice further along, so that the machine's drift,
//! the ranks' placement on cores and the place in the order hit all of
//! them alike; the table shows the median over rounds of the time per call
//! (max over ranks), the algorithm and chunk count Auto picked, Auto's
//! time over the best forced one, and the picked algorithm's forced time
//! over the best (the choice apart from the noise between two runs of one
//! schedule; where Auto and its pick differ much, that noise is large).
//! The two ratios are paired: for each forced algorithm, the median over
//! rounds of the ratio within a round (a round lasts a fraction of a
//! second, so a slow stretch of the machine that slows a whole round
//! cancels), and the best is the algorithm against which that median is
//! highest. Then Auto's median over the best median (not paired), for
//! comparison, then Auto over its own pick forced, paired (`auto/pick`:
//! one schedule timed twice a round, so its spread is the bench's noise,
//! plus what online tuning's reviews during the rounds cost Auto), and
//! then how many reviews ran during the rounds, and last `held_out`: the
//! forced algorithm fastest over half the rounds (by median), scored as
//! `auto/best` is on the other half (the worse of the two halves): what a
//! choice informed by measurements interleaved with the ones it is scored
//! on gets, which tells a cell whose best algorithm changed within the run
//! by more than the 10% the bench is read against from one Auto chose
//! badly.
//! Before a size's rounds, Auto's calls run until its online tuning has
//! decided (`TUTTI_TUNE=model` compares the cost model's pick instead;
//! `TUTTI_TUNE=once`, the first decision without reviews), then on until
//! its first `AVF_SETTLE` reviews have run: reviews come soon after a
//! decision, at gaps that double while they keep the pick, and at large
//! sizes the rounds give Auto few calls (at 32 MiB, 4 ranks, 3 a round),
//! so that the rounds measured mostly those first reviews: the start of a
//! run, not the loop a training job runs for hours (`tuning` counts the
//! calls before the rounds). The bench's own barrier and maximum force an
//! algorithm, so that they do not count towards the gaps between reviews
//! (see `SCAFFOLD`). The ratios against the pick are against the pick when
//! the rounds start, and `auto picks` shows `first>last` where a review
//! changed it during the rounds, and a `+` after a pick whose shared-memory
//! sends stream (forced algorithms run with cached ring stores, so
//! `auto/pick` then also measures that).
//!
//! Environment: `AVF_COLL` (all_reduce, broadcast, reduce, all_gather,
//! reduce_scatter; default all_reduce), `AVF_MIN`/`AVF_MAX` (bytes, default
//! 8 and 64M), `AVF_ROUNDS` (default 7), `AVF_MS` (timed milliseconds per
//! measurement, default 20), `AVF_SETTLE` (reviews before the rounds,
//! default 3; 0: the rounds start at the first decision), `AVF_SETTLE_S`
//! (for those, at most this many seconds of calls at the pace of the
//! size's first calls, default 4), `AVF_DUMP` (set: rank 0 also prints every
//! round's time per call of Auto and each forced algorithm, in the table's
//! column order, to stderr as `DUMP size column times...`, which shows
//! when within a run an algorithm's time changed).
// Reads the environment: the example's own knobs (AVF_*).
#![allow(clippy::disallowed_methods)]

use std::time::Instant;
use tutti::algo::Problem;
use tutti::{Algorithm, CollKind, Collective, Communicator, DataType, Options, RawCall, ReduceOp};

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn bytes_env(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| tutti::config::parse_bytes(&v))
        .unwrap_or(d)
}

/// The bench's own collectives (the barrier before a measurement, the
/// maximum after) force an algorithm: online tuning counts the gaps
/// between its reviews in the collectives that leave the algorithm to it,
/// and these would make a shape's reviews come several times as often
/// between its own calls as in a loop of them (at 32 MiB, 4 ranks, 24 of
/// them to Auto's 3 calls a round).
const SCAFFOLD: Options = Options {
    algorithm: Some(Algorithm::Direct),
    timeout: None,
    wire: None,
};

/// Seconds per call of `iters` calls, the maximum over ranks.
fn time(comm: &Communicator, call: &RawCall, opts: &Options, iters: usize) -> tutti::Result<f64> {
    // A barrier: every rank's value is in every rank's result.
    comm.all_reduce_with(&mut [0u8], ReduceOp::Max, &SCAFFOLD)?;
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: the call's buffers are owned by main and untouched while it runs.
        unsafe { comm.run_raw(call, opts)? };
    }
    let mut dt = [t.elapsed().as_secs_f64() / iters as f64];
    comm.all_reduce_with(&mut dt, ReduceOp::Max, &SCAFFOLD)?;
    Ok(dt[0])
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> tutti::Result<()> {
    let comm = Communicator::from_env()?;
    let n = comm.size();
    let me = comm.rank();
    let kind: CollKind = std::env::var("AVF_COLL")
        .unwrap_or_else(|_| "all_reduce".into())
        .parse()?;
    let coll = match kind {
        CollKind::AllReduce => Collective::AllReduce,
        CollKind::Broadcast => Collective::Broadcast { root: 0 },
        CollKind::Reduce => Collective::Reduce { root: 0 },
        CollKind::AllGather => Collective::AllGather,
        CollKind::ReduceScatter => Collective::ReduceScatter,
        other => {
            return Err(tutti::Error::Config(format!(
                "AVF_COLL={other}: use all_reduce, broadcast, reduce, all_gather or reduce_scatter"
            )))
        }
    };
    let (min, max) = (bytes_env("AVF_MIN", 8), bytes_env("AVF_MAX", 64 << 20));
    let rounds: usize = env_or("AVF_ROUNDS", 7);
    let ms: f64 = env_or("AVF_MS", 20.0);
    let settle: usize = env_or("AVF_SETTLE", 3);
    let settle_s: f64 = env_or("AVF_SETTLE_S", 4.0);
    // Reviews run unless TUTTI_TUNE says once or model.
    let review = comm.config().review;
    let algs: Vec<Algorithm> = Algorithm::ALL
        .into_iter()
        .filter(|a| {
            let mut p = Problem::new(coll, n, me, 0);
            if comm.topology().hosts.len() > 1 {
                p.hosts = Some(comm.topology().host_of.clone().into());
            }
            a.build(&p).is_some()
        })
        .collect();
    if me == 0 {
        println!(
            "{kind}, {n} ranks, f32 sum: median of {rounds} rounds of the time per call (us); \
             rounds alternate Auto and the forced algorithms, in rotating order; ratios paired by round; \
             before them, Auto's calls until its first decision and {settle} reviews (`tuning` calls)"
        );
        print!("{:>10} {:>18} {:>9}", "size", "auto picks", "auto");
        for a in &algs {
            print!(" {:>9}", &a.name()[..a.name().len().min(9)]);
        }
        println!(
            " {:>16} {:>9} {:>9} {:>11} {:>9} {:>7} {:>7} {:>8}",
            "best",
            "auto/best",
            "pick/best",
            "auto/best_m",
            "auto/pick",
            "reviews",
            "tuning",
            "held_out"
        );
    }
    let mut bytes = min.max(4);
    while bytes <= max {
        // Per-rank element count as tutti perf counts it.
        let total = bytes / 4;
        let count = match kind {
            CollKind::AllGather | CollKind::ReduceScatter => (total / n).max(1),
            _ => total,
        };
        let (ilen, olen) = match kind {
            CollKind::AllGather => (count, count * n),
            CollKind::ReduceScatter => (count * n, count),
            _ => (count, count),
        };
        let input = vec![1.0f32; ilen];
        let mut output = vec![0.0f32; olen];
        let call = RawCall {
            coll,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            count,
            send: input.as_ptr() as *const u8,
            send_len: ilen * 4,
            recv: output.as_mut_ptr() as *mut u8,
            recv_len: olen * 4,
            vcounts: None,
        };
        let mut opts: Vec<Options> = vec![Options::default()];
        opts.extend(algs.iter().map(|&a| Options {
            algorithm: Some(a),
            timeout: None,
            wire: None,
        }));
        // Iterations: about `ms` of Auto, the same count for every algorithm.
        let t0 = time(&comm, &call, &opts[0], 5)?; // schedules, page faults

        // Auto's online tuning times its candidates on a shape's first
        // calls: let it, back to back as the timed calls run (a barrier
        // between calls would have it time calls that start together).
        let mut tuning = 0usize;
        while comm.is_tuning(coll, count, DataType::F32) {
            // SAFETY: as in `time`.
            unsafe { comm.run_raw(&call, &opts[0])? };
            tuning += 1;
        }
        // Then its first reviews, which come soon after the decision (the
        // gaps between them double while they keep the pick), until
        // `settle` of them have run, in at most `settle_s` of calls at the
        // pace of the first five (agreed on: every rank stops at the same
        // call).
        if review && comm.tuning_candidates(coll, count, DataType::F32).len() > 1 {
            let most = tuning + (settle_s / t0.max(1e-9)).min(1e9) as usize;
            while comm.tuning_reviews(coll, count, DataType::F32) < settle && tuning < most {
                // SAFETY: as in `time`.
                unsafe { comm.run_raw(&call, &opts[0])? };
                tuning += 1;
            }
        }
        let pick = comm.plan(coll, count, DataType::F32)?;
        let reviews0 = comm.tuning_reviews(coll, count, DataType::F32);
        let t1 = time(&comm, &call, &opts[0], 20)?;
        let iters = ((ms * 1e-3 / t1.max(1e-7)) as usize).clamp(2, 200_000);
        let mut t = vec![Vec::new(); opts.len()];
        for round in 0..rounds {
            // Each round starts one choice later, so that every choice
            // takes every place in the order alike: the first measurement
            // of a round ran measurably slower (4 ranks on 2 cores, 64 KiB).
            for j in 0..opts.len() {
                let i = (round + j) % opts.len();
                let o = &opts[i];
                time(&comm, &call, o, 1)?; // warm-up (and schedule) for this choice
                t[i].push(time(&comm, &call, o, iters)? * 1e6);
            }
        }
        let last = comm.plan(coll, count, DataType::F32)?;
        let reviews = comm.tuning_reviews(coll, count, DataType::F32) - reviews0;
        if me == 0 && std::env::var_os("AVF_DUMP").is_some() {
            for (i, v) in t.iter().enumerate() {
                let r: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                eprintln!("DUMP {bytes} {i} {}", r.join(" "));
            }
        }
        if me == 0 {
            // Paired: x's time over algorithm i's within each round, median
            // over rounds; against the best, the highest of those.
            // Over the rounds `from`, `from + step`, ...
            let paired_over = |x: usize, i: usize, from: usize, step: usize| {
                let mut r: Vec<f64> = t[x]
                    .iter()
                    .zip(&t[i])
                    .skip(from)
                    .step_by(step)
                    .map(|(a, b)| a / b)
                    .collect();
                median(&mut r)
            };
            let paired = |x: usize, i: usize| paired_over(x, i, 0, 1);
            let over_best = |x: usize| {
                (1..opts.len())
                    .map(|i| (i - 1, paired(x, i)))
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .expect("an algorithm")
            };
            let (bi, auto_best) = over_best(0);
            // A choice made from half the rounds, scored as `auto/best` on
            // the other half (of the two ways to split, the worse): the
            // forced algorithm with the least median time over the even
            // rounds, against the others within the odd ones, and the
            // other way round. Its measurements ran interleaved with the
            // ones it is scored on, which no tuner's trials can, so a cell
            // where it too is over 1.10 is one whose best algorithm the
            // machine changed by more than that within the run.
            let halves = if t[0].len() > 1 { 0..2 } else { 0..0 };
            let held_out = halves
                .map(|half| {
                    let chosen = (1..opts.len())
                        .min_by(|&a, &b| {
                            let m = |i: usize| {
                                let mut v: Vec<f64> =
                                    t[i].iter().skip(1 - half).step_by(2).copied().collect();
                                median(&mut v)
                            };
                            m(a).total_cmp(&m(b))
                        })
                        .expect("an algorithm");
                    (1..opts.len())
                        .map(|i| paired_over(chosen, i, half, 2))
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .fold(f64::NAN, f64::max);
            let med: Vec<f64> = t.iter().map(|v| median(&mut v.clone())).collect();
            let name = |c: &tutti::tune::Choice| {
                let chunks = if c.chunks > 1 {
                    format!("/{}", c.chunks)
                } else {
                    String::new()
                };
                // "+": the pick's shared-memory sends stream (Choice::stream);
                // "^": its large messages go direct (Choice::cma).
                let twin = match (c.stream, c.cma) {
                    (true, _) => "+",
                    (_, true) => "^",
                    _ => "",
                };
                format!("{}{chunks}{twin}", c.algorithm)
            };
            // Where a review changed Auto's pick during the rounds: the
            // pick before and after.
            let mut picks = name(&pick);
            if (last.algorithm, last.chunks, last.stream, last.cma)
                != (pick.algorithm, pick.chunks, pick.stream, pick.cma)
            {
                picks = format!("{picks}>{}", name(&last));
            }
            print!("{:>10} {:>18} {:>9.2}", bytes, picks, med[0]);
            for v in &med[1..] {
                print!(" {v:>9.2}");
            }
            // The pick's own forced time over the best: how well Auto
            // chose, apart from the noise between two runs of one schedule.
            let at = algs.iter().position(|&a| a == pick.algorithm);
            let picked = at.map_or(f64::NAN, |i| over_best(1 + i).1);
            let best_med = med[1..].iter().copied().fold(f64::INFINITY, f64::min);
            // Auto over its own pick forced, paired: the same schedule
            // (unless the chunk counts differ) timed twice per round, so
            // what this ratio shows besides 1.0 is the bench's own noise.
            let same = at.map_or(f64::NAN, |i| paired(0, 1 + i));
            println!(
                " {:>16} {:>9.2} {:>9.2} {:>11.2} {:>9.2} {:>7} {:>7} {:>8.2}",
                algs[bi].name(),
                auto_best,
                picked,
                med[0] / best_med,
                same,
                reviews,
                tuning,
                held_out
            );
        }
        bytes *= 4;
    }
    Ok(())
}

//! A quick AllReduce sweep for profiling the data path: run under
//! `tutti run -n 2`. Prints size, time per op (max over ranks) and busbw.
//! `tutti perf` is the full tool; this one is small enough to profile.
// Reads the environment: the example's own knobs (SWEEP_MIN, SWEEP_MAX).
#![allow(clippy::disallowed_methods)]

use std::time::Instant;
use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    let comm = Communicator::from_env()?;
    let n = comm.size();
    let max: usize = std::env::var("SWEEP_MAX")
        .ok()
        .and_then(|s| tutti::config::parse_bytes(&s))
        .unwrap_or(256 << 20);
    let min: usize = std::env::var("SWEEP_MIN")
        .ok()
        .and_then(|s| tutti::config::parse_bytes(&s))
        .unwrap_or(8);
    let mut bytes = min;
    while bytes <= max {
        let count = bytes / 4;
        let mut x = vec![1.0f32; count];
        let iters = ((200 << 20) / bytes.max(1)).clamp(5, 2000);
        for _ in 0..3 {
            comm.all_reduce(&mut x, ReduceOp::Sum)?;
        }
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&mut x, ReduceOp::Sum)?;
        }
        let mut dt = [t.elapsed().as_secs_f64() / iters as f64];
        comm.all_reduce(&mut dt, ReduceOp::Max)?;
        if comm.rank() == 0 {
            let algbw = bytes as f64 / dt[0] / 1e9;
            println!(
                "{:>12} {:>10.2} us  busbw {:>7.3} GB/s",
                bytes,
                dt[0] * 1e6,
                algbw * 2.0 * (n - 1) as f64 / n as f64
            );
        }
        bytes *= 4;
    }
    Ok(())
}

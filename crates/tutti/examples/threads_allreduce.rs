//! AllReduce between threads of one process (`Communicator::init_all`, the
//! `local` transport), out of place, 1-64 MiB: time per call (max over
//! ranks) and busbw. Threads read each other's buffers with `memcpy` where
//! `TUTTI_SHM_DIRECT_BYTES` lets them, the single-copy path that processes
//! lack, so this bounds what single copy could give (docs/performance.md,
//! "4 ranks on 2 cores against 2 ranks").
//!
//! `TUTTI_ALGO=all_reduce:two_shot TUTTI_SHM_DIRECT_BYTES=256K
//! THREADS=4 cargo run --release -p tutti --example threads_allreduce`
//! (`THREADS`, default 2).
// Reads the environment: the example's own knob (THREADS).
#![allow(clippy::disallowed_methods)]

use std::time::Instant;
use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    let n: usize = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let comms = Communicator::init_all(n)?;
    let sizes = [1usize << 20, 4 << 20, 16 << 20, 64 << 20];
    let per_rank: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> tutti::Result<Vec<f64>> {
                    let mut secs = Vec::new();
                    for &bytes in &sizes {
                        let x = vec![1.0f32; bytes / 4];
                        let mut y = vec![0.0f32; bytes / 4];
                        let iters = ((400 << 20) / bytes).clamp(5, 400);
                        for _ in 0..3 {
                            c.all_reduce_into(&x, &mut y, ReduceOp::Sum)?;
                        }
                        c.barrier()?;
                        let t = Instant::now();
                        for _ in 0..iters {
                            c.all_reduce_into(&x, &mut y, ReduceOp::Sum)?;
                        }
                        c.barrier()?;
                        secs.push(t.elapsed().as_secs_f64() / iters as f64);
                    }
                    Ok(secs)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread panicked"))
            .collect::<tutti::Result<_>>()
    })?;
    println!("{:>10} {:>12} {:>12}", "size", "time (us)", "busbw (GB/s)");
    for (i, &bytes) in sizes.iter().enumerate() {
        let t = per_rank.iter().map(|r| r[i]).fold(0.0, f64::max);
        let busbw = bytes as f64 / t / 1e9 * 2.0 * (n - 1) as f64 / n as f64;
        println!("{bytes:>10} {:>12.1} {busbw:>12.2}", t * 1e6);
    }
    Ok(())
}

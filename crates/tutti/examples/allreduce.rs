//! A multi-process AllReduce: run it under `tutti run -n 4`, torchrun, Slurm
//! or mpirun. Each rank reduces a vector and checks the result.
//!
//! ```text
//! tutti run -n 4 -- cargo run --release --example allreduce
//! ```

use std::time::Instant;
use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    let comm = Communicator::from_env()?;
    let (r, n) = (comm.rank(), comm.size());
    let len: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 20);
    let mut x: Vec<f32> = (0..len).map(|i| (r + i % 7) as f32).collect();
    comm.barrier()?;
    let t = Instant::now();
    comm.all_reduce(&mut x, ReduceOp::Sum)?;
    let dt = t.elapsed();
    let ok = x
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (0..n).map(|q| (q + i % 7) as f32).sum::<f32>());
    println!(
        "rank {r}/{n} (local {}/{}): all_reduce of {len} f32 in {:.1} us, result {}",
        comm.local_rank(),
        comm.local_size(),
        dt.as_secs_f64() * 1e6,
        if ok { "correct" } else { "WRONG" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

//! Fault demo: every rank loops AllReduce; kill one (`kill -9`) and watch the
//! others fail fast with `PeerLost` instead of hanging. Prints the wall-clock
//! time (ms since the epoch) at which each survivor saw the error.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    let comm = Communicator::from_env()?;
    let len: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 18);
    let mut x = vec![1.0f32; len];
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs(30) {
        if let Err(e) = comm.all_reduce(&mut x, ReduceOp::Sum) {
            let ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis();
            println!("rank {} after {n} ops at {ms}: {e}", comm.rank());
            println!(
                "rank {} error(): {:?}",
                comm.rank(),
                comm.error().map(|e| e.to_string())
            );
            std::process::exit(2);
        }
        n += 1;
    }
    println!("rank {}: {n} ops, no failure", comm.rank());
    Ok(())
}

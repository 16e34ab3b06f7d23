//! A training loop that loses a rank mid-run, shrinks to the survivors and
//! finishes with correct results. Run under `tutti run -n 4` (or with the
//! TUTTI_* variables set by hand); rank `VICTIM` (default 2) exits abruptly
//! at step 5.
//!
//! Each step every rank contributes its "gradient" `rank + 1` to an
//! AllReduce; after the failure the survivors recompute the failed step on
//! the new communicator and carry on. The expected sum is checked every step.
// Reads the environment: the example's own knob (VICTIM).
#![allow(clippy::disallowed_methods)]

use tutti::{Communicator, Error, ReduceOp};

fn main() -> tutti::Result<()> {
    let mut comm = Communicator::from_env()?;
    let world_rank = comm.rank();
    let victim: usize = std::env::var("VICTIM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    // The original ranks still in the job, so each survivor knows what to expect.
    let mut alive: Vec<usize> = (0..comm.size()).collect();
    let mut step = 0;
    while step < 10 {
        if step == 5 && world_rank == victim {
            eprintln!("rank {world_rank}: dying at step {step}");
            std::process::exit(9);
        }
        let mut grad = vec![(world_rank + 1) as f64; 1 << 16];
        match comm.all_reduce(&mut grad, ReduceOp::Sum) {
            Ok(()) => {
                let want: f64 = alive.iter().map(|&r| (r + 1) as f64).sum();
                assert!(
                    grad.iter().all(|&g| g == want),
                    "step {step}: got {} want {want}",
                    grad[0]
                );
                step += 1;
            }
            Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) => {
                eprintln!("rank {world_rank}: step {step} failed: {e}");
                // Allow the others to notice too, then agree on who is gone.
                std::thread::sleep(std::time::Duration::from_millis(200));
                let dead = comm.dead_ranks();
                eprintln!("rank {world_rank}: ranks {dead:?} are gone; shrinking");
                let new = comm.shrink(&dead)?;
                alive = alive
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !dead.contains(i))
                    .map(|(_, &r)| r)
                    .collect();
                comm = new;
            }
            Err(e) => return Err(e),
        }
    }
    println!(
        "rank {world_rank} (now {} of {}): finished 10 steps with correct sums",
        comm.rank(),
        comm.size()
    );
    Ok(())
}

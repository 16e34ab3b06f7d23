//! Data-parallel training with `GradSync`: linear regression on generated
//! data, 4 ranks as threads of this process, each with its own shard.
//! Every step each rank computes the gradient of its micro-batch, marks the
//! bias then the weights ready (the order a backward pass produces them),
//! and `wait()` leaves the gradient averaged over ranks and over the 2
//! accumulated micro-batches; every rank then takes the same SGD step, so
//! the replicas stay identical. Prints the mean loss over all ranks.
//!
//! `cargo run --release -p tutti --example grad_sync`

use tutti::{Communicator, GradSync, ReduceOp};

const RANKS: usize = 4;
const DIM: usize = 16;
const SHARD: usize = 512;
const BATCH: usize = 32;
const ACCUMULATE: usize = 2;
const STEPS: usize = 60;
const LR: f32 = 0.1;

/// A small deterministic generator (xorshift), uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// This rank's shard: features and targets of y = x . w* + b* + noise.
fn shard(rank: usize) -> (Vec<[f32; DIM]>, Vec<f32>) {
    let mut truth = Rng(42);
    let w: Vec<f32> = (0..DIM).map(|_| truth.next() * 2.0).collect();
    let b = 0.5;
    let mut rng = Rng(1000 + rank as u64);
    let xs: Vec<[f32; DIM]> = (0..SHARD)
        .map(|_| std::array::from_fn(|_| rng.next()))
        .collect();
    let ys = xs
        .iter()
        .map(|x| x.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() + b + 0.01 * rng.next())
        .collect();
    (xs, ys)
}

fn train(c: &Communicator) -> tutti::Result<f32> {
    let (xs, ys) = shard(c.rank());
    let (mut w, mut b) = ([0.0f32; DIM], 0.0f32);
    let mut gs = GradSync::new(c).bucket_bytes(64).sync_every(ACCUMULATE);
    let gw = gs.register("weight", DIM)?;
    let gb = gs.register("bias", 1)?;
    let mut loss = 0.0;
    for step in 0..STEPS * ACCUMULATE {
        let lo = (step * BATCH) % SHARD;
        let (bx, by) = (&xs[lo..lo + BATCH], &ys[lo..lo + BATCH]);
        // Forward and backward of the mean squared error on this micro-batch.
        let errs: Vec<f32> = bx
            .iter()
            .zip(by)
            .map(|(x, y)| x.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() + b - y)
            .collect();
        let mut local = errs.iter().map(|e| e * e).sum::<f32>() / BATCH as f32;
        gs.grad_mut(gb)?[0] += 2.0 * errs.iter().sum::<f32>() / BATCH as f32;
        gs.mark_ready(gb)?;
        let g = gs.grad_mut(gw)?;
        for (x, e) in bx.iter().zip(&errs) {
            for (gj, xj) in g.iter_mut().zip(x) {
                *gj += 2.0 * e * xj / BATCH as f32;
            }
        }
        gs.mark_ready(gw)?;
        if gs.wait()? {
            // The optimizer step: every rank holds the same averaged gradient.
            for (wj, gj) in w.iter_mut().zip(gs.grad(gw)?) {
                *wj -= LR * gj;
            }
            b -= LR * gs.grad(gb)?[0];
            gs.zero_grad()?;
            let mut l = [local];
            c.all_reduce(&mut l, ReduceOp::Sum)?;
            local = l[0] / c.size() as f32;
            loss = local;
            let s = step / ACCUMULATE;
            if c.rank() == 0 && (s.is_multiple_of(10) || s == STEPS - 1) {
                println!("step {s:3}  loss {loss:.6}");
            }
        }
    }
    Ok(loss)
}

fn main() -> tutti::Result<()> {
    let comms = Communicator::init_all(RANKS)?;
    let losses = std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || train(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect::<tutti::Result<Vec<f32>>>()
    })?;
    println!("final loss {:.6} on {RANKS} ranks", losses[0]);
    assert!(losses[0] < 0.01, "training did not converge");
    Ok(())
}

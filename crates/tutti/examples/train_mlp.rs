//! Data-parallel training of a hand-written MLP with `GradSync`, one rank per
//! process (under `tutti run -n N`, `scripts/cluster.sh launch`, torchrun,
//! Slurm: anything `Communicator::from_env` reads).
//!
//! The task: 10 classes, each a fixed random +-1 prototype of 64 inputs; a
//! sample is its class's prototype times 0.15 plus uniform noise in
//! [-1, 1) per input, so there is a rule to learn through the noise. Each
//! rank draws its own samples (its shard: the seed is the rank and the
//! micro-step), all ranks start from the same weights. The student: 64 -> hidden (ReLU) x depth -> 10,
//! softmax cross-entropy, SGD with momentum (plain SGD under
//! `--topk-momentum`, whose momentum is applied before the exchange); f32,
//! plain loops.
//!
//! Backward marks each layer's gradients ready as soon as they are final
//! (last layer first), so a bucket's reduction overlaps the backward pass
//! of the layers below it; `--accum N` accumulates N micro-batches per
//! optimizer step (`GradSync::sync_every`).
//!
//! ```text
//! cargo run --release -p tutti --example train_mlp -- --steps 100    # 1 rank
//! tutti run -n 2 -- target/release/examples/train_mlp --wire bf16 --accum 4
//! scripts/cluster.sh launch --prefix tr -- target/release/examples/train_mlp \
//!     --hidden 5000 --topk 0.01          # ~25 M parameters, Top-K 1%
//! ```
//!
//! Without a launcher it runs as one rank alone.
//!
//! Flags: `--wire f32|bf16|f16`, `--topk RATIO` (error feedback on),
//! `--topk-warmup W` (with `--topk`: the first W synchronisations dense,
//! `GradSync::top_k_warmup`), `--topk-momentum M` (with `--topk`: Deep
//! Gradient Compression's momentum correction, `GradSync::top_k_momentum`,
//! the momentum M applied on each rank before the selection; the optimizer
//! then takes plain SGD steps instead of SGD with momentum 0.9), `--accum N`, `--steps N`, `--hidden H`,
//! `--depth D`, `--batch B` (per rank and micro-step), `--lr X`,
//! `--bucket-mb M`, `--quiet` (no per-step lines). Rank 0 prints one
//! line per optimizer step (the mean loss over the ranks, the step's wall
//! time, and the time spent in `GradSync`: `mark_ready`, which issues
//! buckets and does the Top-K selection, plus `wait`, i.e. the
//! communication not hidden behind the backward pass), then one JSON line
//! with medians over the steps after the first two and the loss curve
//! against wall time.

use std::time::Instant;
use tutti::{Communicator, DataType, GradSync, ReduceOp};

const INPUTS: usize = 64;
const CLASSES: usize = 10;
/// How far the classes' prototypes stand out of the noise.
const SIGNAL: f32 = 0.15;

struct Args {
    wire: Option<DataType>,
    topk: Option<f64>,
    topk_warmup: usize,
    topk_momentum: Option<f64>,
    accum: usize,
    steps: usize,
    hidden: usize,
    depth: usize,
    batch: usize,
    lr: f32,
    bucket_mb: f64,
    quiet: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        wire: None,
        topk: None,
        topk_warmup: 0,
        topk_momentum: None,
        accum: 1,
        steps: 50,
        hidden: 256,
        depth: 2,
        batch: 32,
        lr: 0.2,
        bucket_mb: 25.0,
        quiet: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--quiet" {
            a.quiet = true;
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--wire" => {
                a.wire = match v.as_str() {
                    "f32" => None,
                    "bf16" => Some(DataType::Bf16),
                    "f16" => Some(DataType::F16),
                    _ => return Err(format!("--wire {v}: f32, bf16 or f16")),
                }
            }
            "--topk" => a.topk = Some(num(&v)?).filter(|&r| r > 0.0),
            "--topk-warmup" => a.topk_warmup = num(&v)? as usize,
            "--topk-momentum" => a.topk_momentum = Some(num(&v)?),
            "--accum" => a.accum = num(&v)? as usize,
            "--steps" => a.steps = num(&v)? as usize,
            "--hidden" => a.hidden = num(&v)? as usize,
            "--depth" => a.depth = num(&v)? as usize,
            "--batch" => a.batch = num(&v)? as usize,
            "--lr" => a.lr = num(&v)? as f32,
            "--bucket-mb" => a.bucket_mb = num(&v)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.topk_momentum.is_some() && a.topk.is_none() {
        return Err("--topk-momentum needs --topk (momentum correction is for Top-K)".into());
    }
    Ok(a)
}

/// splitmix64: a deterministic generator, uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d)
    }

    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A dense layer: `w` is `inputs x outputs`, row-major.
struct Layer {
    inputs: usize,
    outputs: usize,
    w: Vec<f32>,
    b: Vec<f32>,
    /// Momentum buffers.
    vw: Vec<f32>,
    vb: Vec<f32>,
}

impl Layer {
    fn new(inputs: usize, outputs: usize, rng: &mut Rng) -> Layer {
        // torch.nn.Linear's initialisation: uniform in +-1/sqrt(fan-in).
        let scale = 1.0 / (inputs as f32).sqrt();
        Layer {
            inputs,
            outputs,
            w: (0..inputs * outputs).map(|_| rng.next() * scale).collect(),
            b: (0..outputs).map(|_| rng.next() * scale).collect(),
            vw: vec![0.0; inputs * outputs],
            vb: vec![0.0; outputs],
        }
    }

    /// `y = x W + b` for a batch of rows.
    fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = Vec::with_capacity(rows * self.outputs);
        for r in 0..rows {
            y.extend_from_slice(&self.b);
            let yr = &mut y[r * self.outputs..];
            for (i, &xv) in x[r * self.inputs..(r + 1) * self.inputs].iter().enumerate() {
                if xv != 0.0 {
                    axpy(yr, xv, &self.w[i * self.outputs..(i + 1) * self.outputs]);
                }
            }
        }
        y
    }

    /// Adds `x^T dy` to `gw` (the weight gradient).
    fn grad_w(&self, x: &[f32], dy: &[f32], rows: usize, gw: &mut [f32]) {
        for i in 0..self.inputs {
            let gr = &mut gw[i * self.outputs..(i + 1) * self.outputs];
            for r in 0..rows {
                let xv = x[r * self.inputs + i];
                if xv != 0.0 {
                    axpy(gr, xv, &dy[r * self.outputs..(r + 1) * self.outputs]);
                }
            }
        }
    }

    /// `dy W^T`, masked by the ReLU of this layer's input `x`.
    fn grad_x(&self, x: &[f32], dy: &[f32], rows: usize) -> Vec<f32> {
        let mut dx = vec![0.0; rows * self.inputs];
        for r in 0..rows {
            let dyr = &dy[r * self.outputs..(r + 1) * self.outputs];
            for i in 0..self.inputs {
                if x[r * self.inputs + i] > 0.0 {
                    dx[r * self.inputs + i] =
                        dot(&self.w[i * self.outputs..(i + 1) * self.outputs], dyr);
                }
            }
        }
        dx
    }

    /// SGD with momentum `m` (0: plain SGD).
    fn step(&mut self, gw: &[f32], gb: &[f32], lr: f32, m: f32) {
        for ((w, v), g) in self.w.iter_mut().zip(&mut self.vw).zip(gw) {
            *v = m * *v + g;
            *w -= lr * *v;
        }
        for ((b, v), g) in self.b.iter_mut().zip(&mut self.vb).zip(gb) {
            *v = m * *v + g;
            *b -= lr * *v;
        }
    }
}

fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn relu(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = x.max(0.0));
}

/// A micro-batch of this rank's shard: a class drawn uniformly, its input
/// the class's prototype (a fixed random +-1 vector) scaled by `SIGNAL`
/// plus uniform noise in [-1, 1) per input.
fn batch(protos: &[f32], rank: usize, micro: usize, rows: usize) -> (Vec<f32>, Vec<usize>) {
    let mut rng = Rng::new(((rank as u64) << 40) ^ micro as u64);
    let mut x = Vec::with_capacity(rows * INPUTS);
    let mut labels = Vec::with_capacity(rows);
    for _ in 0..rows {
        let c = (((rng.next() + 1.0) * 0.5 * CLASSES as f32) as usize).min(CLASSES - 1);
        labels.push(c);
        for p in &protos[c * INPUTS..(c + 1) * INPUTS] {
            x.push(SIGNAL * p + rng.next());
        }
    }
    (x, labels)
}

/// Mean cross-entropy of `logits` and its gradient (already divided by the
/// number of rows).
fn softmax_ce(logits: &[f32], labels: &[usize]) -> (f32, Vec<f32>) {
    let rows = labels.len() as f32;
    let mut d = vec![0.0; logits.len()];
    let mut loss = 0.0;
    for ((l, dl), &y) in logits
        .chunks_exact(CLASSES)
        .zip(d.chunks_exact_mut(CLASSES))
        .zip(labels)
    {
        let m = l.iter().copied().fold(f32::MIN, f32::max);
        let z: f32 = l.iter().map(|v| (v - m).exp()).sum();
        loss += z.ln() + m - l[y];
        for (j, (dj, v)) in dl.iter_mut().zip(l).enumerate() {
            *dj = ((v - m).exp() / z - if j == y { 1.0 } else { 0.0 }) / rows;
        }
    }
    (loss / rows, d)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

fn run(c: &Communicator, a: &Args) -> tutti::Result<()> {
    let (n, rank) = (c.size(), c.rank());
    let mut prng = Rng::new(7);
    let protos: Vec<f32> = (0..CLASSES * INPUTS)
        .map(|_| if prng.next() < 0.0 { -1.0 } else { 1.0 })
        .collect();
    let mut rng = Rng::new(1);
    let mut dims = vec![INPUTS];
    dims.extend(std::iter::repeat_n(a.hidden, a.depth));
    dims.push(CLASSES);
    let mut layers: Vec<Layer> = dims
        .windows(2)
        .map(|d| Layer::new(d[0], d[1], &mut rng))
        .collect();
    let params: usize = layers.iter().map(|l| l.w.len() + l.b.len()).sum();

    let mut gs = GradSync::new(c)
        .bucket_bytes((a.bucket_mb * (1 << 20) as f64) as usize)
        .sync_every(a.accum);
    if let Some(w) = a.wire {
        gs = gs.wire(w);
    }
    if let Some(r) = a.topk {
        gs = gs.top_k(r);
    }
    if a.topk_warmup > 0 {
        gs = gs.top_k_warmup(a.topk_warmup);
    }
    // With momentum correction the momentum is GradSync's, before the
    // selection: the optimizer takes plain SGD steps.
    let momentum = match a.topk_momentum {
        Some(m) => {
            gs = gs.top_k_momentum(m);
            0.0
        }
        None => 0.9,
    };
    let mut ids = Vec::new();
    for (j, l) in layers.iter().enumerate() {
        let w = gs.register(&format!("layer{j}.weight"), l.w.len())?;
        let b = gs.register(&format!("layer{j}.bias"), l.b.len())?;
        ids.push((w, b));
    }
    let wire = match (a.topk, a.wire) {
        (Some(r), _) => {
            let mut w = format!("topk{r}");
            if let Some(m) = a.topk_momentum {
                w += &format!("+momentum{m}");
            }
            if a.topk_warmup > 0 {
                w += &format!("+warmup{}", a.topk_warmup);
            }
            w
        }
        (None, Some(DataType::Bf16)) => "bf16".into(),
        (None, Some(DataType::F16)) => "f16".into(),
        _ => "f32".into(),
    };
    if rank == 0 {
        println!(
            "train_mlp: {n} ranks, {params} parameters ({} MB of f32 gradients), wire {wire}, \
             accum {}, batch {} per rank and micro-step",
            params * 4 / 1_000_000,
            a.accum,
            a.batch
        );
    }
    let (mut steps_ms, mut comm_ms, mut curve) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    let mut micro = 0;
    for step in 0..a.steps {
        let t0 = Instant::now();
        let mut in_sync = 0.0f64;
        let mut loss_sum = 0.0f32;
        for _ in 0..a.accum {
            let (x, labels) = batch(&protos, rank, micro, a.batch);
            micro += 1;
            // Forward, keeping each layer's input.
            let mut acts = vec![x];
            for (j, l) in layers.iter().enumerate() {
                let mut y = l.forward(&acts[j], a.batch);
                if j + 1 < layers.len() {
                    relu(&mut y);
                }
                acts.push(y);
            }
            let (loss, mut dy) = softmax_ce(&acts[layers.len()], &labels);
            loss_sum += loss;
            // Backward, last layer first; each layer's gradients marked
            // ready as soon as they are final.
            for j in (0..layers.len()).rev() {
                let (gw, gb) = ids[j];
                layers[j].grad_w(&acts[j], &dy, a.batch, gs.grad_mut(gw)?);
                let g = gs.grad_mut(gb)?;
                for r in 0..a.batch {
                    axpy(g, 1.0, &dy[r * dims[j + 1]..(r + 1) * dims[j + 1]]);
                }
                let t = Instant::now();
                gs.mark_ready(gb)?;
                gs.mark_ready(gw)?;
                in_sync += t.elapsed().as_secs_f64();
                if j > 0 {
                    dy = layers[j].grad_x(&acts[j], &dy, a.batch);
                }
            }
            let t = Instant::now();
            let synced = gs.wait()?;
            in_sync += t.elapsed().as_secs_f64();
            if synced {
                for (l, &(gw, gb)) in layers.iter_mut().zip(&ids) {
                    // A wide layer's output moves with lr * fan-in: scale
                    // its rate down, so one --lr fits every --hidden.
                    let lr = a.lr * (256.0 / l.inputs as f32).min(1.0);
                    let gwv = gs.grad(gw)?.to_vec();
                    l.step(&gwv, gs.grad(gb)?, lr, momentum);
                }
                gs.zero_grad()?;
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        // The mean loss over ranks (a tiny AllReduce, outside the timing).
        let mut l = [loss_sum / a.accum as f32];
        c.all_reduce(&mut l, ReduceOp::Avg)?;
        let wall = start.elapsed().as_secs_f64();
        steps_ms.push(dt * 1e3);
        comm_ms.push(in_sync * 1e3);
        curve.push((wall, l[0]));
        if rank == 0 && !a.quiet {
            println!(
                "step {step:4}  loss {:.4}  step {:8.1} ms  comm {:8.1} ms",
                l[0],
                dt * 1e3,
                in_sync * 1e3
            );
        }
    }
    if rank == 0 {
        let skip = 2.min(a.steps.saturating_sub(1));
        let (sm, cm) = (median(&steps_ms[skip..]), median(&comm_ms[skip..]));
        let tail = &curve[curve.len().saturating_sub(5)..];
        let last = tail.iter().map(|p| p.1 as f64).sum::<f64>() / tail.len().max(1) as f64;
        let pts: Vec<String> = curve
            .iter()
            .map(|(t, l)| format!("[{t:.3},{l:.5}]"))
            .collect();
        println!(
            "{{\"example\":\"train_mlp\",\"ranks\":{n},\"params\":{params},\"wire\":\"{wire}\",\
             \"accum\":{},\"batch\":{},\"steps\":{},\"step_ms\":{sm:.2},\"comm_ms\":{cm:.2},\
             \"comm_share\":{:.4},\"loss_first\":{:.5},\"loss_last5\":{last:.5},\"curve\":[{}]}}",
            a.accum,
            a.batch,
            a.steps,
            cm / sm,
            curve.first().map_or(f32::NAN, |p| p.1),
            pts.join(",")
        );
    }
    Ok(())
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_mlp: {e}");
            std::process::exit(2);
        }
    };
    // No launcher: one rank alone (the baseline of the scaling efficiency).
    let comm = match Communicator::from_env() {
        Err(tutti::Error::Config(m)) if m.contains("no rank/world size") => {
            Communicator::init_all(1).map(|mut v| v.remove(0))
        }
        c => c,
    };
    let r = comm.and_then(|c| run(&c, &a));
    if let Err(e) = r {
        eprintln!("train_mlp: {e}");
        std::process::exit(1);
    }
}

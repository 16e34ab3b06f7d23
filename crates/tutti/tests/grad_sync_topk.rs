//! `GradSync` with Top-K (error feedback) and per-bucket options, over real
//! communicators: with ratio 1 the result is the dense average bit for bit
//! (integer gradients: exact in any order), mixed with bf16-wire and f32
//! buckets; with a small ratio the first step sends exactly each rank's
//! `k` largest entries of each bucket (a reference computed here), every
//! step keeps the error-feedback invariant (everything sent so far, summed
//! over ranks, plus every rank's residual equals the sum of every gradient
//! of every rank, exactly), accumulation included; bad input is a typed
//! error; a step where a rank misses a gradient fails everywhere and loses
//! nothing (what was sent goes back into the residual). With a dense
//! warm-up of `W` synchronisations (`top_k_warmup`), the first `W` syncs
//! leave the exact dense average with nothing held back, counted in
//! syncs when accumulating, and the next sync is each rank's top `k`
//! again, the invariant kept throughout; a failed warm-up step counts and
//! loses nothing.

mod common;

use common::{Ctx, Transport};
use std::collections::HashMap;
use std::ops::Range;
use tutti::{BucketOptions, Communicator, DataType, Error, GradSync, ReduceOp};

/// Gradient lengths, registered in this order (bucket 0 holds the last).
const GRADS: &[usize] = &[3, 100, 0, 1, 50, 7, 20];
const BUCKET: usize = 256;

/// Integer-valued, nonzero, of distinct magnitudes within a rank at step 0
/// (so the Top-K reference below has no ties), both signs.
fn grad_val(r: usize, step: usize, t: usize, i: usize) -> f32 {
    let uid = GRADS[..t].iter().sum::<usize>() + i;
    let m = (1 + uid + 200 * r + 37 * step) as f32;
    if (uid + step).is_multiple_of(3) {
        -m
    } else {
        m
    }
}

fn new_sync<'c>(gs: GradSync<'c>) -> (GradSync<'c>, Vec<usize>) {
    let mut gs = gs.bucket_bytes(BUCKET);
    let ids = GRADS
        .iter()
        .enumerate()
        .map(|(t, &n)| gs.register(&format!("layer{t}"), n).expect("register"))
        .collect();
    (gs, ids)
}

fn fill(gs: &mut GradSync, ids: &[usize], r: usize, step: usize) {
    for &t in ids.iter().rev() {
        let g: Vec<f32> = (0..GRADS[t]).map(|i| grad_val(r, step, t, i)).collect();
        gs.accumulate(t, &g).expect("accumulate");
        gs.mark_ready(t).expect("mark_ready");
    }
}

/// Ratio 1 sends everything: the dense average, bit for bit; the same with
/// bucket 0 on Top-K, bucket 1 on a bf16 wire (small integers are exact in
/// bf16) and the others f32.
fn dense_reference(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let mixed = GradSync::new(c)
        .bucket_options(0, BucketOptions::dense().top_k(1.0))
        .bucket_options(1, BucketOptions::dense().wire(DataType::Bf16));
    for gs in [GradSync::new(c).top_k(1.0), mixed] {
        let (mut gs, ids) = new_sync(gs);
        assert!(gs.bucket_of(0).is_ok() && gs.buckets() > 2);
        for step in 0..3 {
            // Small values: bf16 holds integers up to 256 exactly.
            for &t in ids.iter().rev() {
                let g: Vec<f32> = (0..GRADS[t])
                    .map(|i| ((r + t + i + step) % 9) as f32 - 4.0)
                    .collect();
                gs.set_grad(t, &g).expect("set_grad");
                gs.mark_ready(t).expect("mark_ready");
            }
            assert!(gs.wait().expect("wait"));
            for &t in &ids {
                for (i, &g) in gs.grad(t).expect("grad").iter().enumerate() {
                    let sum: f32 = (0..n).map(|q| ((q + t + i + step) % 9) as f32 - 4.0).sum();
                    assert_eq!(g.to_bits(), (sum / n as f32).to_bits(), "grad {t}[{i}]");
                }
            }
            gs.zero_grad().expect("zero_grad");
        }
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(
    dense_reference_local_2,
    Transport::Local,
    2,
    dense_reference
);
rank_test!(dense_reference_shm_4, Transport::Shm, 4, dense_reference);

/// What a sync of the micro-steps `steps` leaves (times `ranks * every`)
/// when every residual is zero: rank q sends its `k` largest of each
/// bucket of its accumulated gradients, summed over the ranks.
fn top_k_reference(
    bucket: &[usize],
    buckets: usize,
    n: usize,
    ratio: f64,
    steps: Range<usize>,
) -> HashMap<(usize, usize), f32> {
    let mut want: HashMap<(usize, usize), f32> = HashMap::new();
    for k in 0..buckets {
        let elems: Vec<(usize, usize)> = (0..GRADS.len())
            .filter(|&t| bucket[t] == k)
            .flat_map(|t| (0..GRADS[t]).map(move |i| (t, i)))
            .collect();
        let keep = ((elems.len() as f64 * ratio).ceil() as usize).min(elems.len());
        for q in 0..n {
            let acc = |&(t, i): &(usize, usize)| -> f32 {
                steps.clone().map(|s| grad_val(q, s, t, i)).sum()
            };
            let mut by_size = elems.clone();
            by_size.sort_by(|a, b| acc(b).abs().total_cmp(&acc(a).abs()));
            for e in &by_size[..keep] {
                *want.entry(*e).or_default() += acc(e);
            }
        }
    }
    want
}

/// Ratio 0.1, accumulation of `every` micro-steps, a dense warm-up of
/// `warmup` syncs: each warm-up sync is the exact dense average with an
/// empty residual; the first sync after it is each rank's top `k` of each
/// bucket summed; every sync keeps the invariant.
fn sparse(c: &Communicator, _: &Ctx, every: usize, warmup: usize) {
    let (n, r) = (c.size(), c.rank());
    let ratio = 0.1;
    let gs = GradSync::new(c)
        .top_k(ratio)
        .top_k_warmup(warmup)
        .sync_every(every);
    let (mut gs, ids) = new_sync(gs);
    let bucket: Vec<usize> = ids
        .iter()
        .map(|&t| gs.bucket_of(t).expect("bucket"))
        .collect();
    // Running sums over every rank: of the gradients, and of what was sent.
    let mut grads_sum: Vec<Vec<f32>> = GRADS.iter().map(|&l| vec![0.0; l]).collect();
    let mut sent_sum = grads_sum.clone();
    for step in 0..(warmup + 4) * every {
        fill(&mut gs, &ids, r, step);
        for (t, g) in grads_sum.iter_mut().enumerate() {
            for (i, x) in g.iter_mut().enumerate() {
                *x += (0..n).map(|q| grad_val(q, step, t, i)).sum::<f32>();
            }
        }
        if !gs.wait().expect("wait") {
            continue;
        }
        let denom = (n * every) as f32; // a power of two here: exact
        let sync = (step + 1) / every - 1;
        let steps = sync * every..step + 1;
        if sync < warmup {
            // Warm-up: the dense average (integers: exact in any order),
            // nothing held back.
            for &t in &ids {
                for (i, &g) in gs.grad(t).expect("grad").iter().enumerate() {
                    let sum: f32 = (0..n)
                        .flat_map(|q| steps.clone().map(move |s| grad_val(q, s, t, i)))
                        .sum();
                    assert_eq!(g, sum / denom, "warm-up sync {sync}, grad {t}[{i}]");
                }
                let res = gs.residual(t).expect("residual");
                assert!(
                    res.iter().all(|&x| x == 0.0),
                    "warm-up sync {sync}: {res:?}"
                );
            }
        } else if sync == warmup {
            // The first Top-K sync: rank q sends its k largest of each
            // bucket (nothing held back before it).
            let want = top_k_reference(&bucket, gs.buckets(), n, ratio, steps);
            for &t in &ids {
                for (i, &g) in gs.grad(t).expect("grad").iter().enumerate() {
                    let w = want.get(&(t, i)).copied().unwrap_or(0.0) / denom;
                    assert_eq!(g, w, "first Top-K sync, grad {t}[{i}]");
                }
                // Every entry is nonzero: exactly len - k are held back.
            }
        }
        for &t in &ids {
            for (s, &g) in sent_sum[t].iter_mut().zip(gs.grad(t).expect("grad")) {
                *s += g * denom;
            }
        }
        // The invariant: sent so far + every rank's residual = all gradients.
        for &t in &ids {
            let mut res = gs.residual(t).expect("residual").to_vec();
            c.all_reduce(&mut res, ReduceOp::Sum).expect("all_reduce");
            for (i, ((s, r), g)) in sent_sum[t].iter().zip(&res).zip(&grads_sum[t]).enumerate() {
                assert_eq!(
                    s + r,
                    *g,
                    "step {step}: sent + residual != gradients at {t}[{i}]"
                );
            }
        }
        gs.zero_grad().expect("zero_grad");
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

fn sparse_1(c: &Communicator, x: &Ctx) {
    sparse(c, x, 1, 0)
}

fn sparse_2(c: &Communicator, x: &Ctx) {
    sparse(c, x, 2, 0)
}

/// Two dense syncs, then Top-K.
fn warmup_1(c: &Communicator, x: &Ctx) {
    sparse(c, x, 1, 2)
}

/// Two dense syncs of 2 micro-steps each (4 steps: counted in syncs, not
/// micro-steps), then Top-K.
fn warmup_2(c: &Communicator, x: &Ctx) {
    sparse(c, x, 2, 2)
}

rank_test!(sparse_local_2, Transport::Local, 2, sparse_1);
rank_test!(sparse_local_4, Transport::Local, 4, sparse_1);
rank_test!(sparse_accumulate_local_2, Transport::Local, 2, sparse_2);
rank_test!(sparse_accumulate_shm_4, Transport::Shm, 4, sparse_2);
rank_test!(sparse_tcp_2, Transport::Tcp, 2, sparse_1);
rank_test!(warmup_local_2, Transport::Local, 2, warmup_1);
rank_test!(warmup_shm_4, Transport::Shm, 4, warmup_1);
rank_test!(warmup_accumulate_shm_4, Transport::Shm, 4, warmup_2);
rank_test!(warmup_accumulate_tcp_2, Transport::Tcp, 2, warmup_2);

fn invalid(e: Error, words: &[&str]) {
    match &e {
        Error::InvalidArgument(m) => {
            for w in words {
                assert!(m.contains(w), "'{m}' does not name '{w}'");
            }
        }
        other => panic!("expected InvalidArgument, got {other}"),
    }
}

fn bad_input(c: &Communicator, _: &Ctx) {
    for ratio in [0.0, -0.5, 1.5, f64::NAN] {
        let mut gs = GradSync::new(c).top_k(ratio);
        let a = gs.register("w", 8).expect("register");
        invalid(gs.mark_ready(a).expect_err("ratio"), &["ratio", "(0, 1]"]);
    }
    let mut gs = GradSync::new(c).wire(DataType::Bf16).top_k(0.5);
    gs.register("w", 8).expect("register");
    invalid(
        gs.wait().expect_err("wire and Top-K"),
        &["bucket 0", "not supported"],
    );
    let mut gs = GradSync::new(c).bucket_options(3, BucketOptions::dense().top_k(0.5));
    gs.register("w", 8).expect("register");
    invalid(
        gs.wait().expect_err("no bucket 3"),
        &["bucket 3", "1 buckets"],
    );
    let mut gs = GradSync::new(c);
    let w = gs.register("w", 8).expect("register");
    invalid(gs.residual(w).expect_err("dense"), &["'w'", "Top-K"]);
    // A warm-up needs Top-K on its bucket.
    let mut gs = GradSync::new(c).top_k_warmup(3);
    gs.register("w", 8).expect("register");
    invalid(
        gs.wait().expect_err("warm-up without Top-K"),
        &["bucket 0", "warm-up (3 synchronisations)", "needs Top-K"],
    );
    // Bucket 0 sets itself apart without a warm-up; bucket 1 keeps none.
    let mut gs = GradSync::new(c)
        .bucket_bytes(32)
        .top_k_warmup(2)
        .bucket_options(0, BucketOptions::dense().top_k(0.5));
    gs.register("a", 8).expect("register");
    gs.register("b", 8).expect("register");
    invalid(
        gs.wait().expect_err("bucket 1: warm-up without Top-K"),
        &["bucket 1", "needs Top-K"],
    );
    let mut gs = GradSync::new(c)
        .bucket_bytes(32)
        .top_k(0.5)
        .top_k_warmup(2)
        .bucket_options(1, BucketOptions::dense());
    let a = gs.register("a", 8).expect("register");
    gs.register("b", 8).expect("register");
    assert_eq!(gs.bucket_of(a).expect("laid out"), 1);

    for warmup in [0, 1] {
        forgotten_gradient(c, warmup);
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

/// Rank 1 forgets a gradient: every rank fails, nothing is lost. With a
/// warm-up of 1 the failed step is the warm-up step: it counts, so the
/// next is Top-K.
fn forgotten_gradient(c: &Communicator, warmup: usize) {
    let r = c.rank();
    let mut gs = GradSync::new(c)
        .bucket_bytes(32)
        .top_k(0.25)
        .top_k_warmup(warmup);
    let a = gs.register("fc.weight", 8).expect("register");
    let b = gs.register("fc.bias", 8).expect("register");
    let g: Vec<f32> = (0..8).map(|i| (i + 1) as f32).collect();
    gs.set_grad(b, &g).expect("set_grad");
    gs.mark_ready(b).expect("mark_ready");
    gs.set_grad(a, &g).expect("set_grad");
    if r != 1 {
        gs.mark_ready(a).expect("mark_ready");
    }
    let e = gs.wait().expect_err("a rank missed a gradient");
    if r == 1 {
        invalid(e, &["fc.weight", "marked ready"]);
    } else {
        invalid(e, &["other rank"]);
    }
    // What this rank sent went back: the residuals hold every gradient.
    assert_eq!(gs.residual(b).expect("residual"), &g[..]);
    if r != 1 {
        assert_eq!(gs.residual(a).expect("residual"), &g[..]);
    }
    // The next step works everywhere, the residual added in.
    gs.zero_grad().expect("zero_grad");
    gs.mark_ready(a).expect("mark_ready");
    gs.mark_ready(b).expect("mark_ready");
    assert!(gs.wait().expect("wait"));
    assert_eq!(
        gs.grad(b).expect("grad")[7],
        8.0 * (c.size() as f32) / c.size() as f32
    );
    // Top-K (2 of 8): the smallest entry stayed back.
    assert_eq!(gs.grad(b).expect("grad")[0], 0.0, "warm-up {warmup}");
    assert_eq!(gs.residual(b).expect("residual")[0], 1.0);
}

rank_test!(bad_input_local_2, Transport::Local, 2, bad_input);
rank_test!(bad_input_shm_3, Transport::Shm, 3, bad_input);

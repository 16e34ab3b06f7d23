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
//! loses nothing. With DGC's momentum correction (`top_k_momentum`), each
//! rank's velocity and residual follow `u = m u + g`, `v = v + u` (a
//! reference kept here per rank), each sync sends a top `k` of `v` per
//! bucket, zeroes `u` and `v` exactly there and keeps them elsewhere, and
//! leaves the sum of what the ranks sent; the dense warm-up is dense SGD
//! with momentum (the average velocity, `u` unmasked); ratio 1 masks every
//! coordinate, leaving the plain average; a failed step puts `u` and `v`
//! back; a factor outside `[0, 1)` or without Top-K is rejected.

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
    invalid(gs.velocity(w).expect_err("dense"), &["'w'", "momentum"]);
    let mut gs = GradSync::new(c).top_k(0.5);
    let w = gs.register("w", 8).expect("register");
    invalid(
        gs.velocity(w).expect_err("no momentum"),
        &["'w'", "momentum"],
    );
    // The momentum factor: in [0, 1), only with Top-K.
    for m in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        let mut gs = GradSync::new(c).top_k(0.5).top_k_momentum(m);
        let a = gs.register("w", 8).expect("register");
        invalid(
            gs.mark_ready(a).expect_err("momentum"),
            &["bucket 0", "momentum", "[0, 1)"],
        );
    }
    let mut gs = GradSync::new(c).top_k_momentum(0.9);
    gs.register("w", 8).expect("register");
    invalid(
        gs.wait().expect_err("momentum without Top-K"),
        &["bucket 0", "momentum", "needs Top-K"],
    );
    let mut gs = GradSync::new(c)
        .bucket_bytes(32)
        .top_k(0.5)
        .bucket_options(1, BucketOptions::dense().top_k_momentum(0.5));
    gs.register("a", 8).expect("register");
    gs.register("b", 8).expect("register");
    invalid(
        gs.wait().expect_err("bucket 1: momentum without Top-K"),
        &["bucket 1", "needs Top-K"],
    );
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
        forgotten_gradient(c, warmup, None);
        forgotten_gradient(c, warmup, Some(0.5));
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

/// Rank 1 forgets a gradient: every rank fails, nothing is lost. With a
/// warm-up of 1 the failed step is the warm-up step: it counts, so the
/// next is Top-K. With momentum `m`, the velocity is put back too (it is
/// the gradient after one step), and the next step sends `(1 + m) g`.
fn forgotten_gradient(c: &Communicator, warmup: usize, momentum: Option<f64>) {
    let r = c.rank();
    let mut gs = GradSync::new(c)
        .bucket_bytes(32)
        .top_k(0.25)
        .top_k_warmup(warmup);
    if let Some(m) = momentum {
        gs = gs.top_k_momentum(m);
    }
    let m = momentum.unwrap_or(0.0) as f32;
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
    if momentum.is_some() {
        assert_eq!(
            gs.velocity(b).expect("velocity"),
            &g[..],
            "warm-up {warmup}"
        );
        if r != 1 {
            assert_eq!(gs.velocity(a).expect("velocity"), &g[..]);
        }
    }
    // The next step works everywhere, the residual added in.
    gs.zero_grad().expect("zero_grad");
    gs.mark_ready(a).expect("mark_ready");
    gs.mark_ready(b).expect("mark_ready");
    assert!(gs.wait().expect("wait"));
    // u = m g, v = g + u: (1 + m) g (m = 0.5: exact).
    assert_eq!(
        gs.grad(b).expect("grad")[7],
        (1.0 + m) * 8.0 * (c.size() as f32) / c.size() as f32
    );
    // Top-K (2 of 8): the smallest entry stayed back.
    assert_eq!(gs.grad(b).expect("grad")[0], 0.0, "warm-up {warmup}");
    assert_eq!(gs.residual(b).expect("residual")[0], 1.0 + m);
    if momentum.is_some() {
        let u = gs.velocity(b).expect("velocity");
        assert_eq!((u[0], u[6], u[7]), (m, 0.0, 0.0), "warm-up {warmup}");
    }
}

rank_test!(bad_input_local_2, Transport::Local, 2, bad_input);
rank_test!(bad_input_shm_3, Transport::Shm, 3, bad_input);

/// Momentum correction, ratio 0.1, factor `m`, `every` micro-steps per
/// sync, a dense warm-up of `warmup` syncs, against a reference of this
/// rank's velocity `u` and residual `v` kept here: each sync, `u' = m u + g`
/// and `v' = v + u'`; a warm-up sync sends all of `v'` (residual zero, `u'`
/// kept); a Top-K sync sends, per bucket, `k` entries of largest `|v'|`,
/// where both the residual and the velocity are now zero, and leaves `v'`
/// and `u'` everywhere else; `wait` leaves the sum over ranks of what each
/// sent (an AllReduce of this rank's sent entries here). Integers and
/// `m = 0.5` keep everything exact in f32.
fn momentum_reference(c: &Communicator, _: &Ctx, m: f64, every: usize, warmup: usize) {
    let (n, r) = (c.size(), c.rank());
    let ratio = 0.1;
    let gs = GradSync::new(c)
        .top_k(ratio)
        .top_k_warmup(warmup)
        .top_k_momentum(m)
        .sync_every(every);
    let (mut gs, ids) = new_sync(gs);
    let bucket: Vec<usize> = ids
        .iter()
        .map(|&t| gs.bucket_of(t).expect("bucket"))
        .collect();
    let keep: Vec<usize> = (0..gs.buckets())
        .map(|k| {
            let len: usize = (0..GRADS.len())
                .filter(|&t| bucket[t] == k)
                .map(|t| GRADS[t])
                .sum();
            (len as f64 * ratio).ceil() as usize
        })
        .collect();
    let mf = m as f32;
    let mut u: Vec<Vec<f32>> = GRADS.iter().map(|&l| vec![0.0; l]).collect();
    let mut v = u.clone();
    let mut g = u.clone();
    let mut sent_any = false;
    for step in 0..(warmup + 4) * every {
        fill(&mut gs, &ids, r, step);
        for (t, gt) in g.iter_mut().enumerate() {
            for (i, x) in gt.iter_mut().enumerate() {
                *x += grad_val(r, step, t, i);
            }
        }
        if !gs.wait().expect("wait") {
            continue;
        }
        let sync = (step + 1) / every - 1;
        let denom = (n * every) as f32; // a power of two here: exact
                                        // This rank's u' and v'.
        for t in 0..GRADS.len() {
            for i in 0..GRADS[t] {
                u[t][i] = mf * u[t][i] + g[t][i];
                v[t][i] += u[t][i];
            }
        }
        // What this rank sent, from what GradSync kept.
        let mut sent: Vec<Vec<f32>> = GRADS.iter().map(|&l| vec![0.0; l]).collect();
        let mut count = vec![0; keep.len()];
        let (mut low, mut high) = (vec![f32::INFINITY; keep.len()], vec![0f32; keep.len()]);
        for &t in &ids {
            let res = gs.residual(t).expect("residual").to_vec();
            let vel = gs.velocity(t).expect("velocity").to_vec();
            let k = bucket[t];
            for i in 0..GRADS[t] {
                let at = format!("sync {sync}, grad {t}[{i}]");
                if sync < warmup {
                    // Dense SGD with momentum: all of v' sent, u' kept.
                    assert_eq!(res[i], 0.0, "warm-up {at}");
                    assert_eq!(vel[i], u[t][i], "warm-up {at}");
                    sent[t][i] = v[t][i];
                } else if res[i] == 0.0 && v[t][i] != 0.0 {
                    // Sent: masked in u and v.
                    assert_eq!(vel[i], 0.0, "sent, velocity not masked: {at}");
                    sent[t][i] = v[t][i];
                    count[k] += 1;
                    low[k] = low[k].min(v[t][i].abs());
                } else {
                    // Held back: u' and v' kept.
                    assert_eq!(res[i], v[t][i], "held back, residual: {at}");
                    assert_eq!(vel[i], u[t][i], "held back, velocity: {at}");
                    high[k] = high[k].max(v[t][i].abs());
                }
            }
        }
        if sync >= warmup {
            sent_any = true;
            for k in 0..keep.len() {
                assert_eq!(
                    count[k], keep[k],
                    "sync {sync}: bucket {k} sent {}",
                    count[k]
                );
                assert!(low[k] >= high[k], "sync {sync}: bucket {k} not a top k");
            }
        }
        for &t in &ids {
            let mut want = sent[t].clone();
            c.all_reduce(&mut want, ReduceOp::Sum).expect("all_reduce");
            for (i, (&got, &w)) in gs.grad(t).expect("grad").iter().zip(&want).enumerate() {
                assert_eq!(got * denom, w, "sync {sync}: grad {t}[{i}]");
            }
            for i in 0..GRADS[t] {
                if sent[t][i] != 0.0 || sync < warmup {
                    (u[t][i], v[t][i]) = (if sync < warmup { u[t][i] } else { 0.0 }, 0.0);
                }
            }
        }
        g.iter_mut().for_each(|x| x.fill(0.0));
        gs.zero_grad().expect("zero_grad");
    }
    assert!(sent_any);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

fn momentum_1(c: &Communicator, x: &Ctx) {
    momentum_reference(c, x, 0.5, 1, 0)
}

/// Factor 0: plain error feedback, through the momentum path.
fn momentum_0(c: &Communicator, x: &Ctx) {
    momentum_reference(c, x, 0.0, 1, 0)
}

fn momentum_accumulate(c: &Communicator, x: &Ctx) {
    momentum_reference(c, x, 0.5, 2, 0)
}

/// Two dense syncs (SGD with momentum), then Top-K from that velocity.
fn momentum_warmup(c: &Communicator, x: &Ctx) {
    momentum_reference(c, x, 0.5, 1, 2)
}

fn momentum_warmup_accumulate(c: &Communicator, x: &Ctx) {
    momentum_reference(c, x, 0.5, 2, 2)
}

rank_test!(momentum_local_2, Transport::Local, 2, momentum_1);
rank_test!(momentum_local_4, Transport::Local, 4, momentum_1);
rank_test!(momentum_zero_local_2, Transport::Local, 2, momentum_0);
rank_test!(
    momentum_accumulate_shm_4,
    Transport::Shm,
    4,
    momentum_accumulate
);
rank_test!(momentum_tcp_2, Transport::Tcp, 2, momentum_1);
rank_test!(
    momentum_warmup_local_2,
    Transport::Local,
    2,
    momentum_warmup
);
rank_test!(momentum_warmup_shm_4, Transport::Shm, 4, momentum_warmup);
rank_test!(
    momentum_warmup_accumulate_tcp_2,
    Transport::Tcp,
    2,
    momentum_warmup_accumulate
);

/// Ratio 1 with momentum, against formulas over every rank's gradients
/// (not GradSync's state): with a warm-up as long as the run, each sync is
/// dense SGD with momentum, the average velocity `U = m U + mean(g)`;
/// without one every coordinate is sent and masked each sync, so each
/// sync is the plain average of the gradients (no momentum) and `u` and
/// `v` stay zero.
fn momentum_dense(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let syncs = 4;
    for warmup in [syncs, 0] {
        let gs = GradSync::new(c)
            .top_k(1.0)
            .top_k_warmup(warmup)
            .top_k_momentum(0.5);
        let (mut gs, ids) = new_sync(gs);
        // Every rank's velocity.
        let mut us: Vec<Vec<Vec<f32>>> = (0..n)
            .map(|_| GRADS.iter().map(|&l| vec![0.0; l]).collect())
            .collect();
        for step in 0..syncs {
            fill(&mut gs, &ids, r, step);
            assert!(gs.wait().expect("wait"));
            for &t in &ids {
                for (q, u) in us.iter_mut().enumerate() {
                    for (i, x) in u[t].iter_mut().enumerate() {
                        *x = 0.5 * *x + grad_val(q, step, t, i);
                    }
                }
                let got = gs.grad(t).expect("grad").to_vec();
                for (i, &g) in got.iter().enumerate() {
                    let at = format!("warm-up {warmup}, step {step}, grad {t}[{i}]");
                    if warmup > 0 {
                        let sum: f32 = (0..n).map(|q| us[q][t][i]).sum();
                        assert_eq!(g, sum / n as f32, "SGD with momentum: {at}");
                    } else {
                        let sum: f32 = (0..n).map(|q| grad_val(q, step, t, i)).sum();
                        assert_eq!(g, sum / n as f32, "plain average: {at}");
                    }
                }
                let (res, vel) = (
                    gs.residual(t).expect("residual").to_vec(),
                    gs.velocity(t).expect("velocity").to_vec(),
                );
                assert!(res.iter().all(|&x| x == 0.0), "{res:?}");
                if warmup > 0 {
                    assert_eq!(vel, us[r][t], "warm-up: u kept");
                } else {
                    assert!(vel.iter().all(|&x| x == 0.0), "ratio 1: u masked: {vel:?}");
                }
            }
            if warmup == 0 {
                us.iter_mut().flatten().for_each(|u| u.fill(0.0));
            }
            gs.zero_grad().expect("zero_grad");
        }
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(momentum_dense_local_2, Transport::Local, 2, momentum_dense);
rank_test!(momentum_dense_shm_3, Transport::Shm, 3, momentum_dense);

//! Fusion and the data-parallel reducer: `all_reduce_many` (blocking and
//! async) against a per-tensor reference, with tensors of mixed sizes (0,
//! 1, odd, larger than a bucket); `GradSync` averages, accumulation over
//! several steps, overlap (a bucket's AllReduce completes before the last
//! gradient is marked ready; no timing), and bad input, each a typed error
//! that leaves no rank waiting.

mod common;

use common::{Ctx, Transport};
use tutti::{Communicator, Error, FusionOptions, GradSync, ReduceOp};

/// Tensor lengths: empty, one, odd, prime, a run of small ones that pack,
/// and one far larger than the 256-byte buckets used below.
const LENS: &[usize] = &[0, 1, 7, 13, 3, 0, 5000, 2, 61, 1, 64, 0];
const BUCKET: usize = 256;

/// A value unique per (rank, tensor, index), exact in f32 and i32.
fn val(r: usize, t: usize, i: usize) -> i64 {
    ((r * 131 + t * 17 + i) % 1000) as i64 - 300
}

fn tensors<T: Copy>(r: usize, f: impl Fn(i64) -> T) -> Vec<Vec<T>> {
    LENS.iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| f(val(r, t, i))).collect())
        .collect()
}

fn many(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let opts = FusionOptions::default().bucket_bytes(BUCKET);

    // i32, Sum and Max: bit for bit against the per-tensor formula.
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let mut ts = tensors(r, |v| v as i32);
        let mut refs: Vec<&mut [i32]> = ts.iter_mut().map(|t| &mut t[..]).collect();
        c.all_reduce_many(&mut refs, op, &opts)
            .expect("all_reduce_many");
        for (t, got) in ts.iter().enumerate() {
            assert_eq!(got.len(), LENS[t]);
            for (i, &g) in got.iter().enumerate() {
                let all = (0..n).map(|q| val(q, t, i));
                let want = match op {
                    ReduceOp::Max => all.max().expect("ranks"),
                    _ => all.sum(),
                };
                assert_eq!(g as i64, want, "{op:?} tensor {t} index {i}");
            }
        }
    }

    // f32 with integer values (exact in any order): the same as reducing
    // each tensor separately, bit for bit; blocking and async agree.
    let mut fused = tensors(r, |v| v as f32);
    let mut refs: Vec<&mut [f32]> = fused.iter_mut().map(|t| &mut t[..]).collect();
    c.all_reduce_many(&mut refs, ReduceOp::Sum, &opts)
        .expect("all_reduce_many f32");
    let mut single = tensors(r, |v| v as f32);
    for t in &mut single {
        c.all_reduce(t, ReduceOp::Sum).expect("all_reduce");
    }
    let w = c.all_reduce_many_async(tensors(r, |v| v as f32), ReduceOp::Sum, &opts);
    assert!(w.buckets() < LENS.len(), "small tensors are packed");
    let asynced = w.wait().expect("all_reduce_many_async");
    for t in 0..LENS.len() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused[t]), bits(&single[t]), "tensor {t}");
        assert_eq!(bits(&asynced[t]), bits(&single[t]), "async tensor {t}");
    }

    // f64 with fractional values: within rounding of the exact sum.
    let mut fr = tensors(r, |v| v as f64 / 7.0);
    let mut refs: Vec<&mut [f64]> = fr.iter_mut().map(|t| &mut t[..]).collect();
    c.all_reduce_many(&mut refs, ReduceOp::Sum, &FusionOptions::default())
        .expect("all_reduce_many f64");
    for (t, got) in fr.iter().enumerate() {
        for (i, &g) in got.iter().enumerate() {
            let want: f64 = (0..n).map(|q| val(q, t, i) as f64 / 7.0).sum();
            assert!((g - want).abs() <= 1e-9 * want.abs().max(1.0), "tensor {t}");
        }
    }

    // Nothing to reduce, and a bad bucket size: no op, an error.
    c.all_reduce_many::<u8>(&mut [], ReduceOp::Sum, &opts)
        .expect("no tensors");
    let e = c
        .all_reduce_many(&mut [&mut [1u8][..]], ReduceOp::Sum, &opts.bucket_bytes(0))
        .expect_err("bucket_bytes 0");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(many_local_2, Transport::Local, 2, many);
rank_test!(many_local_3, Transport::Local, 3, many);
rank_test!(many_local_4, Transport::Local, 4, many);
rank_test!(many_shm_3, Transport::Shm, 3, many);

/// Gradient lengths, registered in this order (so bucket 0 holds the last).
const GRADS: &[usize] = &[3, 100, 0, 1, 50, 7];

fn grad_val(r: usize, step: usize, t: usize, i: usize) -> f32 {
    ((r + 1) * (t + 1) + i + 3 * step) as f32
}

fn new_sync<'c>(c: &'c Communicator, every: usize) -> (GradSync<'c>, Vec<usize>) {
    let mut gs = GradSync::new(c).bucket_bytes(256).sync_every(every);
    let ids = GRADS
        .iter()
        .enumerate()
        .map(|(t, &n)| gs.register(&format!("layer{t}"), n).expect("register"))
        .collect();
    (gs, ids)
}

fn averages(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let (mut gs, ids) = new_sync(c, 1);
    assert!(gs.buckets() == 0 && gs.bucket_of(0).is_ok() && gs.buckets() > 1);
    for step in 0..3 {
        // Backward: last layer first; two gradients swapped, so a bucket
        // may be complete before an earlier one (they still start in order).
        let mut order: Vec<usize> = ids.iter().rev().copied().collect();
        order.swap(1, 2);
        for &t in &order {
            for (i, g) in gs.grad_mut(t).expect("grad_mut").iter_mut().enumerate() {
                *g = grad_val(r, step, t, i);
            }
            gs.mark_ready(t).expect("mark_ready");
        }
        assert!(gs.wait().expect("wait"), "every step syncs");
        let denom = n as f32;
        for &t in &ids {
            let got = gs.grad(t).expect("grad");
            assert_eq!(got.len(), GRADS[t]);
            for (i, &g) in got.iter().enumerate() {
                let sum: f32 = (0..n).map(|q| grad_val(q, step, t, i)).sum();
                assert_eq!(
                    g.to_bits(),
                    (sum / denom).to_bits(),
                    "step {step} grad {t}[{i}]"
                );
            }
        }
        gs.zero_grad().expect("zero_grad");
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(averages_local_2, Transport::Local, 2, averages);
rank_test!(averages_local_4, Transport::Local, 4, averages);
rank_test!(averages_shm_3, Transport::Shm, 3, averages);

fn accumulates(c: &Communicator, _: &Ctx) {
    let (n, r, every) = (c.size(), c.rank(), 3);
    let (mut gs, ids) = new_sync(c, every);
    for step in 0..2 * every {
        for &t in ids.iter().rev() {
            let micro: Vec<f32> = (0..GRADS[t]).map(|i| grad_val(r, step, t, i)).collect();
            gs.accumulate(t, &micro).expect("accumulate");
            gs.mark_ready(t).expect("mark_ready");
            if !(step + 1).is_multiple_of(every) {
                let k = gs.bucket_of(t).expect("bucket");
                assert!(!gs.started(k), "no sync yet");
            }
        }
        let synced = gs.wait().expect("wait");
        assert_eq!(synced, (step + 1).is_multiple_of(every), "step {step}");
        if synced {
            let window = step + 1 - every..=step;
            for &t in &ids {
                for (i, &g) in gs.grad(t).expect("grad").iter().enumerate() {
                    let sum: f32 = (0..n)
                        .flat_map(|q| window.clone().map(move |s| grad_val(q, s, t, i)))
                        .sum();
                    assert_eq!(g, sum / (n * every) as f32, "step {step} grad {t}[{i}]");
                }
            }
            gs.zero_grad().expect("zero_grad");
        }
    }
}

rank_test!(accumulates_local_2, Transport::Local, 2, accumulates);
rank_test!(accumulates_local_3, Transport::Local, 3, accumulates);
rank_test!(accumulates_shm_2, Transport::Shm, 2, accumulates);

/// Overlap: every bucket but the last one's AllReduce is issued, and runs to
/// completion on every rank, while the first registered gradient (the last
/// one backward produces) is not yet ready. Nothing is timed: the loop
/// ends when the ops complete (the harness's timeout bounds it).
fn overlaps(c: &Communicator, _: &Ctx) {
    let r = c.rank();
    let mut gs = GradSync::new(c).bucket_bytes(64);
    let ids: Vec<usize> = (0..4)
        .map(|t| gs.register(&format!("p{t}"), 16).expect("register"))
        .collect();
    assert_eq!(gs.bucket_of(ids[3]).expect("bucket"), 0);
    for &t in ids[1..].iter().rev() {
        gs.grad_mut(t).expect("grad_mut").fill((r + t) as f32);
        gs.mark_ready(t).expect("mark_ready");
        let k = gs.bucket_of(t).expect("bucket");
        assert!(
            gs.started(k),
            "bucket {k} starts as soon as its gradient is ready"
        );
    }
    let last = gs.bucket_of(ids[0]).expect("bucket");
    assert!(!gs.started(last));
    while !(0..last).all(|k| gs.done(k)) {
        std::hint::spin_loop();
    }
    // Only now is the last gradient computed.
    gs.grad_mut(ids[0]).expect("grad_mut").fill(r as f32);
    gs.mark_ready(ids[0]).expect("mark_ready");
    assert!(gs.wait().expect("wait"));
    let n = c.size();
    let mean = |t: usize| (0..n).map(|q| (q + t) as f32).sum::<f32>() / n as f32;
    for &t in &ids {
        assert!(gs.grad(t).expect("grad").iter().all(|&g| g == mean(t)));
    }
}

rank_test!(overlaps_local_2, Transport::Local, 2, overlaps);
rank_test!(overlaps_shm_3, Transport::Shm, 3, overlaps);

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
    let r = c.rank();
    let mut gs = GradSync::new(c).bucket_bytes(64);
    let a = gs.register("fc.weight", 8).expect("register");
    let b = gs.register("fc.bias", 2).expect("register");
    invalid(
        gs.register("fc.weight", 8).expect_err("twice"),
        &["fc.weight", "once"],
    );
    invalid(
        gs.set_grad(a, &[0.0; 9]).expect_err("resized"),
        &["fc.weight", "resized"],
    );
    invalid(gs.mark_ready(7).expect_err("index"), &["7"]);

    gs.mark_ready(b).expect("mark_ready");
    invalid(
        gs.register("late", 1).expect_err("closed"),
        &["late", "closes"],
    );
    invalid(
        gs.mark_ready(b).expect_err("twice"),
        &["fc.bias", "once per step"],
    );
    invalid(gs.grad_mut(b).expect_err("frozen"), &["fc.bias"]);
    // Rank 1 forgets a gradient: it names it; the others learn of it; nobody hangs.
    if r != 1 {
        gs.mark_ready(a).expect("mark_ready");
    }
    let e = gs.wait().expect_err("a rank missed a gradient");
    if r == 1 {
        invalid(e, &["fc.weight", "marked ready"]);
    } else {
        invalid(e, &["other rank"]);
    }
    // The next step is fine everywhere.
    gs.zero_grad().expect("zero_grad");
    gs.set_grad(a, &[r as f32; 8]).expect("set_grad");
    gs.mark_ready(a).expect("mark_ready");
    gs.mark_ready(b).expect("mark_ready");
    assert!(gs.wait().expect("wait"));
    let mean = (0..c.size()).sum::<usize>() as f32 / c.size() as f32;
    assert!(gs.grad(a).expect("grad").iter().all(|&g| g == mean));

    let mut zero = GradSync::new(c).bucket_bytes(0);
    zero.register("x", 1).expect("register");
    invalid(zero.wait().expect_err("bucket_bytes 0"), &["bucket_bytes"]);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(bad_input_local_2, Transport::Local, 2, bad_input);
rank_test!(bad_input_shm_3, Transport::Shm, 3, bad_input);

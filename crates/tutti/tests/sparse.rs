//! Sparse AllReduce and Top-K with error feedback: results against a dense
//! reference (integer values, so exact in any order), both routes (few
//! pairs in a long vector gather; as many pairs as elements go dense),
//! every rank bit for bit the same with non-integer values, Avg, bad input
//! on one rank (named there, reported everywhere, the next call fine), and
//! the compressor's bookkeeping (sent + residual = everything so far).

mod common;

use common::{Ctx, Transport};
use tutti::{Communicator, Error, ReduceOp, SparseRoute, TopK};

/// Rank `r`'s pairs for case `case`: `k` distinct-ish indices (duplicates
/// allowed: they add up) into `len`, integer values.
fn pairs(r: usize, case: usize, k: usize, len: usize) -> (Vec<u32>, Vec<f32>) {
    let idx = (0..k)
        .map(|j| ((r * 7919 + case * 104_729 + j * 31) % len) as u32)
        .collect();
    let val = (0..k)
        .map(|j| ((r * 13 + j * 5 + case) % 21) as f32 - 10.0)
        .collect();
    (idx, val)
}

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

fn sums(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let mut routes = Vec::new();
    // (k, len): few pairs in a long vector, a middle case, dense, empty.
    let cases: [(usize, usize); 5] = [(3, 1 << 16), (40, 4096), (20_000, 20_000), (0, 64), (1, 1)];
    for (case, &(k, len)) in cases.iter().enumerate() {
        // Rank-dependent counts: the last rank sends one pair fewer.
        let k_here = if r == n - 1 { k.saturating_sub(1) } else { k };
        let (idx, val) = pairs(r, case, k_here, len);
        let mut out = vec![f32::NAN; len];
        let route = c
            .sparse_all_reduce(&idx, &val, &mut out, ReduceOp::Sum)
            .expect("sparse_all_reduce");
        routes.push(route);
        let mut want = vec![0f32; len];
        for q in 0..n {
            let kq = if q == n - 1 { k.saturating_sub(1) } else { k };
            let (i, v) = pairs(q, case, kq, len);
            for (&i, &v) in i.iter().zip(&v) {
                want[i as usize] += v;
            }
        }
        assert_eq!(out, want, "case {case} (k {k}, len {len}, {route:?})");
    }
    assert_eq!(routes[0], SparseRoute::Gather, "3 pairs in 64 Ki elements");
    assert_eq!(
        routes[2],
        SparseRoute::Dense,
        "as many pairs per rank as elements"
    );
    assert_eq!(c.sparse_route(3, 1 << 16), SparseRoute::Gather);

    // Avg, and non-integer values: every rank holds the same bits.
    let len = 5000;
    let idx: Vec<u32> = (0..50).map(|j| ((j * 97 + r * 11) % len) as u32).collect();
    let val: Vec<f32> = (0..50).map(|j| 0.1 + (j + r) as f32 / 3.0).collect();
    let mut out = vec![0f32; len];
    c.sparse_all_reduce(&idx, &val, &mut out, ReduceOp::Avg)
        .expect("avg");
    let mut all = vec![0f32; n * len];
    c.all_gather(&out, &mut all).expect("all_gather");
    for q in 0..n {
        assert!(
            all[q * len..(q + 1) * len]
                .iter()
                .zip(&out)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {q}'s result differs from rank {r}'s"
        );
    }
    let total: f64 = out.iter().map(|&x| x as f64).sum();
    let want: f64 = (0..n)
        .flat_map(|q| (0..50).map(move |j| 0.1 + (j + q) as f64 / 3.0))
        .sum::<f64>()
        / n as f64;
    assert!(
        (total - want).abs() < 1e-3 * want.abs(),
        "{total} vs {want}"
    );
}

fn bad_input(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let mut out = vec![0f32; 100];
    // Rank 1 passes an index outside the vector: it is named there; the
    // others learn that another rank failed; nothing hangs.
    let idx = if r == 1 { vec![3, 100] } else { vec![3, 4] };
    let e = c
        .sparse_all_reduce(&idx, &[1.0, 1.0], &mut out, ReduceOp::Sum)
        .expect_err("bad index on rank 1");
    if r == 1 {
        invalid(e, &["indices[1]", "100"]);
    } else {
        invalid(e, &["another rank"]);
    }
    assert!(out.iter().all(|&x| x == 0.0), "nothing written");
    // A length that differs between ranks fails everywhere.
    let mut odd = vec![0f32; 100 + r];
    invalid(
        c.sparse_all_reduce(&[0], &[1.0], &mut odd, ReduceOp::Sum)
            .expect_err("lengths differ"),
        &["same length"],
    );
    // Mismatched pairs and an unsupported op, on one rank each.
    if r == 0 {
        invalid(
            c.sparse_all_reduce(&[0, 1], &[1.0], &mut out, ReduceOp::Sum)
                .expect_err("pairs"),
            &["2 indices", "1 values"],
        );
    } else {
        c.sparse_all_reduce(&[0], &[1.0], &mut out, ReduceOp::Sum)
            .expect_err("rank 0 failed");
    }
    invalid(
        c.sparse_all_reduce(&[0], &[1.0], &mut out, ReduceOp::Max)
            .expect_err("max"),
        &["Max"],
    );
    // The communicator is fine afterwards.
    c.sparse_all_reduce(&[r as u32], &[1.0], &mut out, ReduceOp::Sum)
        .expect("after the errors");
    assert_eq!(out[..n].iter().sum::<f32>(), n as f32);
    invalid(TopK::new(10, 0.0, true).expect_err("ratio"), &["ratio"]);
}

fn top_k(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let len = 1000;
    let mut tk = TopK::new(len, 0.01, true).expect("TopK");
    assert_eq!(tk.k(), 10);
    let mut sent_total = vec![0f64; len];
    let mut grads_total = vec![0f64; len];
    for step in 0..20 {
        // Integer gradients: every sum is exact.
        let grad: Vec<f32> = (0..len)
            .map(|i| ((i * 7 + step * 3 + r) % 11) as f32 - 5.0)
            .collect();
        for (t, &g) in grads_total.iter_mut().zip(&grad) {
            *t += g as f64;
        }
        // What this rank sends this step, from a twin of its compressor.
        let mut twin = tk.clone();
        let (idx, val) = twin.compress(&grad).expect("compress");
        assert_eq!(idx.len(), 10);
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "ascending indices");
        for (&i, &v) in idx.iter().zip(&val) {
            sent_total[i as usize] += v as f64;
        }
        let mut g = grad.clone();
        c.top_k_all_reduce(&mut g, &mut tk, ReduceOp::Sum)
            .expect("top_k_all_reduce");
        assert_eq!(tk.residual(), twin.residual());
        // Every rank's contribution is in: the sum over ranks of what each
        // sent (gathered to check).
        let mut mine = vec![0f32; len];
        for (&i, &v) in idx.iter().zip(&val) {
            mine[i as usize] += v;
        }
        let mut all = mine.clone();
        c.all_reduce(&mut all, ReduceOp::Sum).expect("reference");
        assert_eq!(g, all, "step {step}");
    }
    // Error feedback loses nothing: sent + residual = every gradient.
    for i in 0..len {
        let kept = sent_total[i] + tk.residual()[i] as f64;
        assert_eq!(kept, grads_total[i], "element {i}");
    }
    // Without error feedback the rest is dropped.
    let mut plain = TopK::new(4, 0.5, false).expect("TopK");
    let (idx, val) = plain.compress(&[1.0, -9.0, 3.0, 0.5]).expect("compress");
    assert_eq!((idx, val), (vec![1, 2], vec![-9.0, 3.0]));
    assert!(plain.residual().iter().all(|&x| x == 0.0));
    // A gradient of the wrong length fails on that rank, and the others
    // hear of it.
    let mut wrong = vec![0f32; if r == 0 { 999 } else { 1000 }];
    let e = c
        .top_k_all_reduce(&mut wrong, &mut tk, ReduceOp::Sum)
        .expect_err("length");
    if r == 0 {
        invalid(e, &["999", "1000"]);
    } else {
        invalid(e, &["same length"]);
    }
    assert!(n >= 2);
}

rank_test!(sums_local_3, Transport::Local, 3, sums);
rank_test!(sums_shm_4, Transport::Shm, 4, sums);
rank_test!(sums_tcp_3, Transport::Tcp, 3, sums);
rank_test!(bad_input_local_3, Transport::Local, 3, bad_input);
rank_test!(bad_input_tcp_2, Transport::Tcp, 2, bad_input);
rank_test!(top_k_local_2, Transport::Local, 2, top_k);
rank_test!(top_k_shm_3, Transport::Shm, 3, top_k);

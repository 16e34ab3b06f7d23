//! The 16-bit wire (`Options::wire`), over real ranks: threads (every
//! algorithm forced), shm and TCP processes, and two emulated hosts.
//!
//! * Accuracy: AllReduce (Sum and Avg), ReduceScatter and Reduce of f32
//!   against an f64 reference, within the bound that one rounding per hop
//!   gives: `((1 + u)^(n + 1) - 1 + n 2^-24) * sum |x|` with `u` the wire
//!   type's unit roundoff (2^-8 bf16, 2^-11 f16), `n` the rank count (no
//!   algorithm narrows a value more often than `n + 1` times on its way).
//! * Agreement: an AllReduce's result is bitwise the same on every rank
//!   (compared through an AllGather of the bits).
//! * Range: values near f32's largest sum without overflow on a bf16 wire;
//!   values near f16's largest (65504) on every rank sum without overflow
//!   on an f16 wire, whose scaling keeps the partial sums in range.
//! * Bad input: a wire on an integer or f64 tensor, on a non-reducing
//!   collective, with Max, or of a non-16-bit type is `InvalidArgument`,
//!   and the communicator goes on working.
//! * Fusion and `GradSync` take the wire per bucket.

mod common;

use common::{Ctx, Transport};
use tutti::{
    Algorithm, Collective, Communicator, DataType, Error, FusionOptions, GradSync, Options,
    RawCall, ReduceOp,
};

const WIRES: [DataType; 2] = [DataType::Bf16, DataType::F16];

fn unit(w: DataType) -> f64 {
    match w {
        DataType::Bf16 => 1.0 / 256.0,
        _ => 1.0 / 2048.0,
    }
}

/// Rank r's element i: mixed signs and magnitudes, not exact in 16 bits.
fn x(r: usize, i: usize) -> f32 {
    let t = (r * 7919 + i * 104_729) as f64;
    ((t * 0.618_033_988_7).fract() - 0.4) as f32 * (1.0 + (i % 17) as f32 * 3.7)
}

/// Checks `got[i]` against the f64 sum of `xs(i)` (divided by `div`).
fn within(w: DataType, n: usize, got: &[f32], idx: impl Fn(usize) -> usize, div: f64, what: &str) {
    let gamma = (1.0 + unit(w)).powi(n as i32 + 1) - 1.0 + n as f64 * 2f64.powi(-24);
    for (k, &g) in got.iter().enumerate() {
        let i = idx(k);
        let exact: f64 = (0..n).map(|q| x(q, i) as f64).sum::<f64>() / div;
        let mag: f64 = (0..n).map(|q| (x(q, i) as f64).abs()).sum::<f64>() / div;
        let err = (g as f64 - exact).abs();
        assert!(
            err <= gamma * mag + 1e-30,
            "{what} {w}: element {i}: {g} vs {exact} (error {err:e}, bound {:e})",
            gamma * mag
        );
    }
}

/// Every rank's `v`, as bits, through an exact AllGather: equal everywhere?
fn same_everywhere(c: &Communicator, v: &[f32], what: &str) {
    let bits: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
    let mut all = vec![0u32; bits.len() * c.size()];
    c.all_gather(&bits, &mut all).expect("all_gather");
    for (q, other) in all.chunks(bits.len().max(1)).enumerate() {
        if let Some(k) = (0..bits.len()).find(|&k| other[k] != bits[k]) {
            panic!(
                "{what}: rank {q} differs from rank {} at element {k}",
                c.rank()
            );
        }
    }
}

fn opts(w: DataType, alg: Option<Algorithm>) -> Options {
    Options {
        algorithm: alg,
        ..Options::default().wire(w)
    }
}

/// AllReduce (Sum and Avg), ReduceScatter and Reduce on both wires.
fn accurate_with(c: &Communicator, algs: &[Option<Algorithm>], counts: &[usize]) {
    let (n, r) = (c.size(), c.rank());
    for &w in &WIRES {
        for &alg in algs {
            let o = opts(w, alg);
            let what = format!("{alg:?}");
            // The data does travel narrowed: rank 0's 1 + 2^-12 (exact in
            // f32, not in bf16 or f16) arrives as 1 everywhere.
            let mut one = vec![if r == 0 { 1.0 + 2f32.powi(-12) } else { 0.0 }; 3];
            c.all_reduce_with(&mut one, ReduceOp::Sum, &o)
                .unwrap_or_else(|e| panic!("{what} {w}: {e}"));
            assert_eq!(one, vec![1.0; 3], "{what} {w}: rounded to the wire type");
            for &count in counts {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let mut v: Vec<f32> = (0..count).map(|i| x(r, i)).collect();
                    c.all_reduce_with(&mut v, op, &o)
                        .unwrap_or_else(|e| panic!("{what} all_reduce {w}: {e}"));
                    let div = if op == ReduceOp::Avg { n as f64 } else { 1.0 };
                    within(w, n, &v, |k| k, div, &format!("{what} all_reduce {op}"));
                    same_everywhere(c, &v, &format!("{what} all_reduce {op} {w} count {count}"));
                }
                let implements = |coll: Collective| {
                    alg.is_none_or(|a| a.build(&tutti::algo::Problem::new(coll, n, r, 0)).is_some())
                };
                if implements(Collective::ReduceScatter) {
                    let send: Vec<f32> = (0..n * count).map(|i| x(r, i)).collect();
                    let mut recv = vec![0f32; count];
                    c.reduce_scatter_with(&send, &mut recv, ReduceOp::Sum, &o)
                        .unwrap_or_else(|e| panic!("{what} reduce_scatter {w}: {e}"));
                    within(
                        w,
                        n,
                        &recv,
                        |k| r * count + k,
                        1.0,
                        &format!("{what} reduce_scatter"),
                    );
                }
                let root = n - 1;
                if implements(Collective::Reduce { root }) {
                    let send: Vec<f32> = (0..count).map(|i| x(r, i)).collect();
                    let mut recv = vec![0f32; if r == root { count } else { 0 }];
                    c.reduce_with(&send, &mut recv, ReduceOp::Sum, root, &o)
                        .unwrap_or_else(|e| panic!("{what} reduce {w}: {e}"));
                    within(w, n, &recv, |k| k, 1.0, &format!("{what} reduce"));
                }
            }
        }
    }
}

/// Every flat algorithm forced (threads).
fn every_algorithm(c: &Communicator, _: &Ctx) {
    let mut algs = vec![None];
    algs.extend(
        [
            Algorithm::Ring,
            Algorithm::Tree,
            Algorithm::DoubleTree,
            Algorithm::HalvingDoubling,
            Algorithm::Direct,
            Algorithm::TwoShot,
        ]
        .map(Some),
    );
    accurate_with(c, &algs, &[0, 1, 13, 4099]);
}

/// The tuner's choice and the ring, larger (processes).
fn tuned_and_ring(c: &Communicator, _: &Ctx) {
    accurate_with(c, &[None, Some(Algorithm::Ring)], &[1, 1009, 300_007]);
}

rank_test!(algorithms_local_2, Transport::Local, 2, every_algorithm);
rank_test!(algorithms_local_3, Transport::Local, 3, every_algorithm);
rank_test!(algorithms_local_5, Transport::Local, 5, every_algorithm);
rank_test!(tuned_shm_3, Transport::Shm, 3, tuned_and_ring);
rank_test!(tuned_tcp_2, Transport::Tcp, 2, tuned_and_ring);
rank_test!(
    tuned_hosts_2x2,
    Transport::Hosts { per_host: 2 },
    4,
    hierarchical
);

/// Two emulated hosts: the hierarchical algorithm and the tuner's pick.
fn hierarchical(c: &Communicator, _: &Ctx) {
    let h = Some(Algorithm::Hierarchical(tutti::algo::Levels::DEFAULT));
    accurate_with(c, &[None, h], &[7, 100_003]);
}

/// Near the top of each type's range: no overflow where f32 has none.
fn no_overflow(c: &Communicator, _: &Ctx) {
    let n = c.size();
    // bf16: n values summing to 0.99 of f32's largest.
    let mut v = vec![f32::MAX / n as f32 * 0.99; 257];
    v[0] = -v[0];
    c.all_reduce_with(
        &mut v,
        ReduceOp::Sum,
        &Options::default().wire(DataType::Bf16),
    )
    .expect("bf16");
    assert!(
        v.iter().all(|x| x.is_finite()),
        "bf16 overflowed: {:?}",
        &v[..2]
    );
    let want = f32::MAX as f64 * 0.99;
    assert!(
        (v[1] as f64 - want).abs() <= want * (n as f64 + 1.0) / 256.0,
        "{}",
        v[1]
    );
    assert!(
        (v[0] as f64 + want).abs() <= want * (n as f64 + 1.0) / 256.0,
        "{}",
        v[0]
    );
    // f16: every rank near f16's largest; the sum is n times that.
    let mut h = vec![65000.0f32; 33];
    c.all_reduce_with(
        &mut h,
        ReduceOp::Sum,
        &Options::default().wire(DataType::F16),
    )
    .expect("f16");
    let want = 65000.0 * n as f64;
    for &x in &h {
        assert!(x.is_finite(), "f16 overflowed");
        assert!(
            (x as f64 - want).abs() <= want * (n as f64 + 1.0) / 2048.0,
            "{x} vs {want}"
        );
    }
    // And Avg of the same stays at 65000 (give or take the rounding).
    let mut a = vec![65000.0f32; 5];
    c.all_reduce_with(
        &mut a,
        ReduceOp::Avg,
        &Options::default().wire(DataType::F16),
    )
    .expect("f16 avg");
    assert!(
        a.iter().all(|&x| (x - 65000.0).abs() <= 65000.0 * 0.01),
        "{a:?}"
    );
}

rank_test!(no_overflow_local_4, Transport::Local, 4, no_overflow);
rank_test!(no_overflow_tcp_3, Transport::Tcp, 3, no_overflow);

fn assert_arg(res: tutti::Result<()>, needles: &[&str]) {
    match res {
        Err(Error::InvalidArgument(m)) => {
            for n in needles {
                assert!(m.contains(n), "'{m}' lacks '{n}'");
            }
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn bad_input(c: &Communicator, _: &Ctx) {
    let bf = Options::default().wire(DataType::Bf16);
    let mut ints = vec![1i32; 8];
    assert_arg(
        c.all_reduce_with(&mut ints, ReduceOp::Sum, &bf),
        &["f32", "i32", "wire"],
    );
    let mut f64s = vec![1f64; 8];
    assert_arg(
        c.all_reduce_with(&mut f64s, ReduceOp::Sum, &bf),
        &["f32", "f64"],
    );
    let mut v = vec![1f32; 8];
    assert_arg(
        c.all_reduce_with(&mut v, ReduceOp::Max, &bf),
        &["sum or avg", "max"],
    );
    let f32wire = Options::default().wire(DataType::F32);
    assert_arg(
        c.all_reduce_with(&mut v, ReduceOp::Sum, &f32wire),
        &["bf16 or f16"],
    );
    // A non-reducing collective.
    let send = [1f32; 4];
    let mut recv = vec![0f32; 4 * c.size()];
    let raw = RawCall {
        coll: Collective::AllGather,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        count: 4,
        send: send.as_ptr() as *const u8,
        send_len: 16,
        recv: recv.as_mut_ptr() as *mut u8,
        recv_len: recv.len() * 4,
        vcounts: None,
    };
    // SAFETY: the pointers are live vectors of the lengths given.
    assert_arg(
        unsafe { c.run_raw(&raw, &bf) },
        &["all_gather", "only to all_reduce"],
    );
    // Nothing was sent: the communicator works, on and off the wire.
    c.all_reduce_with(&mut v, ReduceOp::Sum, &bf)
        .expect("after errors");
    assert!(v.iter().all(|&x| x == c.size() as f32));
    c.all_reduce(&mut ints, ReduceOp::Sum).expect("plain");
    assert!(ints.iter().all(|&x| x == c.size() as i32));
}

rank_test!(bad_input_local_2, Transport::Local, 2, bad_input);
rank_test!(bad_input_shm_2, Transport::Shm, 2, bad_input);

/// `all_reduce_many` (blocking and async) and `GradSync` with a wire.
fn fusion_and_grad_sync(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let lens = [0usize, 1, 7, 5000, 3, 64];
    let offs: Vec<usize> = lens
        .iter()
        .scan(0, |a, &l| {
            let o = *a;
            *a += l;
            Some(o)
        })
        .collect();
    for &w in &WIRES {
        let opts = FusionOptions::default().bucket_bytes(256).wire(w);
        let mut ts: Vec<Vec<f32>> = lens
            .iter()
            .zip(&offs)
            .map(|(&l, &o)| (0..l).map(|i| x(r, o + i)).collect())
            .collect();
        let mut refs: Vec<&mut [f32]> = ts.iter_mut().map(|t| &mut t[..]).collect();
        c.all_reduce_many(&mut refs, ReduceOp::Sum, &opts)
            .expect("many");
        for (t, got) in ts.iter().enumerate() {
            within(w, n, got, |k| offs[t] + k, 1.0, "all_reduce_many");
            same_everywhere(c, got, "all_reduce_many");
        }
        let owned: Vec<Vec<f32>> = lens
            .iter()
            .zip(&offs)
            .map(|(&l, &o)| (0..l).map(|i| x(r, o + i)).collect())
            .collect();
        let back = c
            .all_reduce_many_async(owned, ReduceOp::Sum, &opts)
            .wait()
            .expect("many async");
        assert_eq!(back, ts, "{w}: async and blocking agree bit for bit");

        let mut gs = GradSync::new(c).bucket_bytes(1024).wire(w);
        let ids: Vec<usize> = lens
            .iter()
            .enumerate()
            .map(|(t, &l)| gs.register(&format!("g{t}"), l).expect("register"))
            .collect();
        for (t, &i) in ids.iter().enumerate().rev() {
            for (k, g) in gs.grad_mut(i).expect("grad").iter_mut().enumerate() {
                *g = x(r, offs[t] + k);
            }
            gs.mark_ready(i).expect("ready");
        }
        assert!(gs.wait().expect("wait"));
        for (t, &i) in ids.iter().enumerate() {
            let g = gs.grad(i).expect("grad").to_vec();
            within(w, n, &g, |k| offs[t] + k, n as f64, "GradSync");
        }
    }
    // A bad wire type reaches the caller through wait, on every rank alike.
    let mut gs = GradSync::new(c).wire(DataType::I32);
    let i = gs.register("w", 3).expect("register");
    gs.mark_ready(i).expect("ready");
    assert!(matches!(gs.wait(), Err(Error::InvalidArgument(_))));
}

rank_test!(fusion_local_3, Transport::Local, 3, fusion_and_grad_sync);
rank_test!(fusion_shm_2, Transport::Shm, 2, fusion_and_grad_sync);

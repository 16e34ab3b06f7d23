//! One collective at one size: buffers, the call, and the data check.
//!
//! Sizes follow nccl-tests: `size` is the bytes of the larger buffer (the
//! receive buffer of AllGather and Gather, the send buffer of ReduceScatter,
//! Scatter and AllToAll), and the call's count follows from it:
//!
//! | collective | count per call | send | recv |
//! |---|---|---|---|
//! | all_reduce | size/e | c | c (the same buffer in place) |
//! | broadcast | size/e | – | c (the root's holds the data) |
//! | reduce | size/e | c | c on the root |
//! | all_gather | size/(n e) | c | n c |
//! | reduce_scatter | size/(n e) | n c | c |
//! | all_to_all | size/(n e) | n c | n c |
//! | gather | size/(n e) | c | n c on the root |
//! | scatter | size/(n e) | n c on the root | c |
//! | send_recv | size/e | c to rank r+1 | c from rank r-1 |
//!
//! Check data: element `i` of rank `r`'s input is `v(r, i) = 1 + (7 i + 13 r)
//! mod m`, a small integer, with `m` a prime chosen so that no reduction over
//! the ranks leaves the integers the element type represents exactly (products
//! use 1 and 2 instead). Every expected output is then a formula of `r` and
//! `i`, exact in every type, and a block from the wrong rank or offset shows.

use tutti::{
    CollKind, Collective, Communicator, DataType, Element, Options, RawCall, RawP2p, ReduceOp,
};

/// An element type `tutti perf` can fill and check.
pub(crate) trait Val: Element + Copy {
    /// Converts a small integer (or an average) to this type.
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` for comparison.
    fn to_f64(self) -> f64;
}

macro_rules! val_num {
    ($($t:ty),*) => {$(
        impl Val for $t {
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
val_num!(f32, f64, i8, u8, i32, i64, u32, u64);

impl Val for half::f16 {
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}

impl Val for half::bf16 {
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

/// True if the collective reduces.
pub(crate) fn reduces(k: CollKind) -> bool {
    matches!(
        k,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    )
}

/// True if the collective is rooted.
pub(crate) fn rooted(k: CollKind) -> bool {
    matches!(
        k,
        CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
    )
}

/// The bus-bandwidth factor of nccl-tests (`busbw = algbw * factor`).
pub(crate) fn bus_factor(k: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match k {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (n - 1.0) / n,
        // nccl-tests' gather.cu and scatter.cu: baseBw * (nranks-1)/nranks.
        CollKind::Gather | CollKind::Scatter => (n - 1.0) / n,
        CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv => 1.0,
        CollKind::Barrier => 0.0,
    }
}

/// True if `size` is split over the ranks (count = size / (n * elem)).
fn per_rank_blocks(k: CollKind) -> bool {
    matches!(
        k,
        CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
    )
}

/// The size actually measured for a requested `size` (a whole number of
/// elements, per rank where the size is split over ranks, at least one), and
/// the count passed to the call.
pub(crate) fn shape(k: CollKind, size: usize, n: usize, esz: usize) -> (usize, usize) {
    if k == CollKind::Barrier {
        return (0, 0);
    }
    let unit = if per_rank_blocks(k) { n * esz } else { esz };
    let s = (size - size % unit).max(unit);
    (s, s / unit)
}

/// The collective, with its root or peer.
pub(crate) fn collective(k: CollKind, root: usize) -> Collective {
    k.with_root(root).unwrap_or(Collective::Send { peer: 0 })
}

/// The check data generator (see the module comment).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gen {
    m: u64,
    prod: bool,
}

/// The largest integer every value up to which `t` represents exactly (capped).
fn exact_limit(t: DataType) -> u64 {
    match t {
        DataType::I8 => 127,
        DataType::U8 => 255,
        DataType::Bf16 => 256,
        DataType::F16 => 2048,
        _ => 1 << 20,
    }
}

fn largest_prime_at_most(x: u64) -> u64 {
    let is_prime = |p: u64| {
        p >= 2
            && (2..)
                .take_while(|d| d * d <= p)
                .all(|d| !p.is_multiple_of(d))
    };
    (2..=x.max(2))
        .rev()
        .find(|&p| is_prime(p))
        .unwrap_or(2)
        .min(x.max(1))
}

impl Gen {
    /// The generator for `kind` with `op` on `n` ranks in type `t`.
    pub(crate) fn new(kind: CollKind, op: ReduceOp, n: usize, t: DataType) -> Gen {
        let lim = exact_limit(t);
        if reduces(kind) && op == ReduceOp::Prod {
            return Gen { m: 0, prod: true };
        }
        let grow = if reduces(kind) && matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            n as u64
        } else {
            1
        };
        Gen {
            m: largest_prime_at_most((lim / grow).min(1021)),
            prod: false,
        }
    }

    /// Input element `i` of rank `r`.
    #[inline]
    pub(crate) fn v(&self, r: usize, i: usize) -> f64 {
        if self.prod {
            // At most ceil(n/3) factors of 2: exact in every type for n <= 18.
            if (i + r).is_multiple_of(3) {
                2.0
            } else {
                1.0
            }
        } else {
            (1 + (7 * i as u64 + 13 * r as u64) % self.m) as f64
        }
    }

    /// The reduction over all `n` ranks of element `i`.
    pub(crate) fn reduced(&self, op: ReduceOp, n: usize, i: usize, int: bool) -> f64 {
        let vals = (0..n).map(|q| self.v(q, i));
        match op {
            ReduceOp::Sum => vals.sum(),
            ReduceOp::Prod => vals.product(),
            ReduceOp::Max => vals.fold(f64::MIN, f64::max),
            ReduceOp::Min => vals.fold(f64::MAX, f64::min),
            ReduceOp::Avg => {
                let s: f64 = vals.sum();
                if int {
                    (s / n as f64).trunc()
                } else {
                    s / n as f64
                }
            }
        }
    }
}

/// The relative tolerance of a check: zero except for float averages.
fn tolerance(t: DataType, op: ReduceOp, kind: CollKind) -> f64 {
    if op != ReduceOp::Avg || !reduces(kind) {
        return 0.0;
    }
    match t {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-6,
        DataType::F16 => 2e-3,
        DataType::Bf16 => 1e-2,
        _ => 0.0,
    }
}

/// Buffers and parameters of one collective at one size on this rank.
pub(crate) struct Bench<'a, T: Val> {
    comm: &'a Communicator,
    kind: CollKind,
    root: usize,
    count: usize,
    op: ReduceOp,
    in_place: bool,
    opts: Options,
    gen: Gen,
    send: Vec<T>,
    recv: Vec<T>,
}

impl<'a, T: Val> Bench<'a, T> {
    /// Allocates the buffers of `kind` for `count` (see the module table).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        comm: &'a Communicator,
        kind: CollKind,
        root: usize,
        count: usize,
        op: ReduceOp,
        in_place: bool,
        opts: Options,
    ) -> Self {
        let (n, r) = (comm.size(), comm.rank());
        let c = count;
        let (s, o) = match kind {
            CollKind::AllReduce => (if in_place { 0 } else { c }, c),
            CollKind::Broadcast => (0, c),
            CollKind::Reduce => (c, if r == root { c } else { 0 }),
            CollKind::AllGather => (c, n * c),
            CollKind::ReduceScatter => (n * c, c),
            CollKind::AllToAll => (n * c, n * c),
            CollKind::Gather => (c, if r == root { n * c } else { 0 }),
            CollKind::Scatter => (if r == root { n * c } else { 0 }, c),
            CollKind::SendRecv => (c, c),
            CollKind::Barrier => (0, 0),
        };
        let zero = T::from_f64(0.0);
        Bench {
            comm,
            kind,
            root,
            count,
            op,
            in_place,
            opts,
            // On a 16-bit wire, data exact in the wire type: the sums
            // stay exact (f16's power-of-two scale is exact too).
            gen: Gen::new(kind, op, n, opts.wire.unwrap_or(T::DTYPE)),
            send: vec![zero; s],
            recv: vec![zero; o],
        }
    }

    /// Writes the check data into the inputs and zeroes the outputs.
    pub(crate) fn fill(&mut self) {
        let (r, g) = (self.comm.rank(), self.gen);
        let zero = T::from_f64(0.0);
        self.recv.iter_mut().for_each(|x| *x = zero);
        match self.kind {
            CollKind::AllReduce if self.in_place => fill(&mut self.recv, |i| g.v(r, i)),
            CollKind::Broadcast if r == self.root => fill(&mut self.recv, |i| g.v(r, i)),
            _ => fill(&mut self.send, |i| g.v(r, i)),
        }
    }

    fn raw(
        &self,
        coll: Collective,
        send: *const T,
        send_len: usize,
        recv: *mut T,
        recv_len: usize,
    ) -> RawCall {
        let e = std::mem::size_of::<T>();
        RawCall {
            coll,
            dtype: T::DTYPE,
            op: self.op,
            count: self.count,
            send: send as *const u8,
            send_len: send_len * e,
            recv: recv as *mut u8,
            recv_len: recv_len * e,
            vcounts: None,
        }
    }

    /// Runs the collective once (for send_recv: one exchange with both neighbours).
    pub(crate) fn run(&mut self) -> tutti::Result<()> {
        self.run_n(1)
    }

    /// Runs the call `k` times (the calls are built once, outside the loop,
    /// as a training loop would: the loop times the library, not this).
    pub(crate) fn run_n(&mut self, k: usize) -> tutti::Result<()> {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let (sp, sl) = (self.send.as_ptr(), self.send.len());
        let (rp, rl) = (self.recv.as_mut_ptr(), self.recv.len());
        if self.kind == CollKind::SendRecv {
            // Both directions at once, as NCCL's sendrecv test does in one
            // group: each rank posts its send to the next rank and its
            // receive from the previous one, and the call returns when both
            // have ended (`batch_isend_irecv` over these raw buffers).
            let ops = [
                RawP2p {
                    send: true,
                    peer: Some((r + 1) % n),
                    ptr: sp.cast::<u8>().cast_mut(),
                    len: sl * std::mem::size_of::<T>(),
                    tag: 0,
                    exact: true,
                },
                RawP2p {
                    send: false,
                    peer: Some((r + n - 1) % n),
                    ptr: rp.cast::<u8>(),
                    len: rl * std::mem::size_of::<T>(),
                    tag: 0,
                    exact: true,
                },
            ];
            for _ in 0..k {
                // SAFETY: `self.send` and `self.recv` are valid for these lengths
                // and do not overlap; `&mut self` keeps all else off them until
                // this blocking call (as MPI_Sendrecv) returns, both ops ended.
                unsafe { self.comm.run_p2p_raw(&ops, self.opts.timeout) }?;
            }
            return Ok(());
        }
        // At most one call, kept on the stack: the timed loop allocates nothing.
        let call: RawCall = match self.kind {
            CollKind::AllReduce if self.in_place => self.raw(Collective::AllReduce, rp, rl, rp, rl),
            CollKind::Broadcast => {
                self.raw(Collective::Broadcast { root: self.root }, rp, rl, rp, rl)
            }
            k => self.raw(collective(k, self.root), sp, sl, rp, rl),
        };
        for _ in 0..k {
            // In place, send and recv are the same buffer, which AllReduce
            // and Broadcast allow.
            // SAFETY: the pointers come from `self.send`/`self.recv` (or are
            // null with length 0), valid for the lengths given; `&mut self`
            // keeps anything else from touching them until run_raw returns.
            unsafe { self.comm.run_raw(&call, &self.opts)? };
        }
        Ok(())
    }

    /// Whether Auto is still timing candidate algorithms on this call
    /// (online tuning); never for send_recv.
    pub(crate) fn tuning(&self) -> bool {
        self.kind != CollKind::SendRecv
            && self
                .comm
                .is_tuning(collective(self.kind, self.root), self.count, T::DTYPE)
    }

    /// Counts the output elements that differ from the expected formula.
    pub(crate) fn wrong(&self) -> u64 {
        let (n, r, c, g) = (self.comm.size(), self.comm.rank(), self.count, self.gen);
        let int = !T::DTYPE.is_float();
        let tol = tolerance(self.opts.wire.unwrap_or(T::DTYPE), self.op, self.kind);
        let bad = |got: T, exp: f64| {
            let x = got.to_f64();
            let d = (x - exp).abs();
            d.is_nan() || d > tol * exp.abs().max(1.0)
        };
        let out = &self.recv;
        let count = |f: &dyn Fn(usize) -> f64| {
            out.iter()
                .enumerate()
                .filter(|&(i, &x)| bad(x, f(i)))
                .count() as u64
        };
        match self.kind {
            CollKind::AllReduce => count(&|i| g.reduced(self.op, n, i, int)),
            CollKind::Broadcast => count(&|i| g.v(self.root, i)),
            CollKind::Reduce if r == self.root => count(&|i| g.reduced(self.op, n, i, int)),
            CollKind::ReduceScatter => count(&|k| g.reduced(self.op, n, r * c + k, int)),
            CollKind::AllGather => count(&|j| g.v(j / c.max(1), j % c.max(1))),
            CollKind::Gather if r == self.root => count(&|j| g.v(j / c.max(1), j % c.max(1))),
            CollKind::AllToAll => count(&|j| g.v(j / c.max(1), r * c + j % c.max(1))),
            CollKind::Scatter => count(&|k| g.v(self.root, r * c + k)),
            CollKind::SendRecv => count(&|k| g.v((r + n - 1) % n, k)),
            _ => 0,
        }
    }
}

fn fill<T: Val>(buf: &mut [T], f: impl Fn(usize) -> f64) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = T::from_f64(f(i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_nccl_tests() {
        assert_eq!(shape(CollKind::AllReduce, 1024, 4, 4), (1024, 256));
        assert_eq!(shape(CollKind::AllGather, 1024, 4, 4), (1024, 64));
        assert_eq!(shape(CollKind::AllGather, 8, 4, 4), (16, 1));
        assert_eq!(shape(CollKind::ReduceScatter, 100, 3, 4), (96, 8));
        assert_eq!(shape(CollKind::Barrier, 100, 3, 4), (0, 0));
    }

    #[test]
    fn bus_factors() {
        assert_eq!(bus_factor(CollKind::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(CollKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(CollKind::Broadcast, 4), 1.0);
    }

    #[test]
    fn sums_stay_exact() {
        for t in DataType::ALL {
            for n in 1..=8 {
                let g = Gen::new(CollKind::AllReduce, ReduceOp::Sum, n, t);
                let max = (0..n)
                    .map(|q| (0..2000).map(|i| g.v(q, i)).fold(0.0, f64::max))
                    .sum::<f64>();
                assert!(max <= exact_limit(t) as f64, "{t} n={n}: {max}");
            }
        }
        assert_eq!(largest_prime_at_most(42), 41);
        assert_eq!(largest_prime_at_most(1021), 1021);
        assert_eq!(largest_prime_at_most(1), 1);
    }
}

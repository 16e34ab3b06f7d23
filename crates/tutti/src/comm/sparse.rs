//! Sparse AllReduce for Top-K gradients: every rank contributes some
//! (index, value) pairs of a vector of `len` f32 elements, and every rank
//! gets the dense sum (or mean). Two routes, picked by the cost model for
//! this call's sizes, the same on every rank:
//!
//! * **gather**: the pairs go everywhere (one AllGather of each rank's
//!   pairs, padded to the largest rank's count), and each rank adds them
//!   up in rank order; bytes on the wire grow with `n * k`, not with `len`;
//! * **dense**: each rank scatters its pairs into a zeroed vector of
//!   `len` elements and the ranks AllReduce it; better once the pairs of
//!   all ranks together would outweigh the vector.
//!
//! [`TopK`] is the compressor with error feedback: what a step does not
//! send is kept and added to the next step's gradient, so nothing is lost,
//! only delayed.

use super::Communicator;
use crate::algo::{Collective, Problem};
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;
use crate::tune::choose_with;

/// Padding index in a gathered block: no element.
const PAD: u32 = u32::MAX;

/// How [`Communicator::sparse_all_reduce`] moved the pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparseRoute {
    /// Every rank's pairs to every rank (AllGather), summed locally.
    Gather,
    /// Scattered into dense vectors and AllReduced.
    Dense,
}

impl Communicator {
    /// Sums the sparse vectors of all ranks into `out`, densely: rank `r`
    /// contributes `values[j]` at `indices[j]` (duplicates add up), and
    /// every rank ends with the same `out` (`out.len()` elements, the same
    /// on every rank). `op` is [`ReduceOp::Sum`] or [`ReduceOp::Avg`]
    /// (divided by the number of ranks). Returns the route the cost model
    /// chose ([`SparseRoute`]); the counts of pairs may differ per rank.
    ///
    /// Bad input (lengths that differ between `indices` and `values`, an
    /// index outside `out`, another `op`) is an argument error on the
    /// rank that has it; a vector length that differs between ranks is an
    /// argument error on every rank. Nothing is written to `out` then.
    ///
    /// ```
    /// # use tutti::{Communicator, ReduceOp};
    /// let comms = Communicator::init_all(2).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let r = c.rank() as u32;
    ///             let mut out = vec![0f32; 8];
    ///             c.sparse_all_reduce(&[r, 7], &[1.0, 2.0], &mut out, ReduceOp::Sum).unwrap();
    ///             assert_eq!(out, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn sparse_all_reduce(
        &self,
        indices: &[u32],
        values: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<SparseRoute> {
        self.sparse_inner(indices, values, out, op, Ok(()))
    }

    /// [`sparse_all_reduce`](Communicator::sparse_all_reduce), with an
    /// error the caller already has (the ranks still agree on failing).
    fn sparse_inner(
        &self,
        indices: &[u32],
        values: &[f32],
        out: &mut [f32],
        op: ReduceOp,
        before: Result<()>,
    ) -> Result<SparseRoute> {
        let len = out.len();
        let local = before.and_then(|_| check_local(indices, values, len, op));
        // One small AllReduce (Max) agrees on: the largest count of pairs,
        // the vector length (largest and smallest), and whether some rank's
        // input is bad, so that every rank fails alike.
        let k = indices.len() as u64;
        let mut agree = [
            k,
            len as u64,
            u64::MAX - len as u64,
            u64::from(local.is_err()),
        ];
        self.all_reduce(&mut agree, ReduceOp::Max)?;
        local?;
        let [k_max, len_max, len_min_inv, bad] = agree;
        let len_min = u64::MAX - len_min_inv;
        if len_max != len_min {
            return Err(Error::arg(format!(
                "sparse_all_reduce: the vector has {len} elements on rank {}, but between {len_min} and {len_max} across ranks; every rank must pass the same length",
                self.rank()
            )));
        }
        if bad != 0 {
            return Err(Error::arg(
                "sparse_all_reduce: another rank passed bad input (it reports why)".to_string(),
            ));
        }
        let k_max = k_max as usize;
        let route = self.sparse_route(k_max, len);
        match route {
            SparseRoute::Gather => self.gather_pairs(indices, values, k_max, out)?,
            SparseRoute::Dense => {
                out.fill(0.0);
                for (&i, &v) in indices.iter().zip(values) {
                    out[i as usize] += v;
                }
                self.all_reduce(out, ReduceOp::Sum)?;
            }
        }
        if op == ReduceOp::Avg {
            let n = self.size() as f32;
            out.iter_mut().for_each(|x| *x /= n);
        }
        Ok(route)
    }

    /// The cheaper route for `k_max` pairs per rank and `len` elements,
    /// as this communicator's cost model prices an AllGather of the pairs
    /// against an AllReduce of the vector (by bytes where it prices
    /// neither). Every rank decides alike: they share the model.
    pub fn sparse_route(&self, k_max: usize, len: usize) -> SparseRoute {
        let n = self.size();
        if k_max == 0 || n == 1 {
            return SparseRoute::Dense;
        }
        let (gather, dense) = self.engine.with_core(|c| {
            let g = Problem::new(Collective::AllGather, n, self.rank(), 2 * k_max);
            let d = Problem::new(Collective::AllReduce, n, self.rank(), len);
            (
                choose_with(&g, 4, &c.tune).us,
                choose_with(&d, 4, &c.tune).us,
            )
        });
        let gather_wins = if gather.is_finite() && dense.is_finite() {
            gather < dense
        } else {
            // AllGather moves n*k pairs of 8 B to each rank; a ring AllReduce
            // about 2*len*4 B.
            n * k_max * 8 < 2 * len * 4
        };
        if gather_wins {
            SparseRoute::Gather
        } else {
            SparseRoute::Dense
        }
    }

    fn gather_pairs(
        &self,
        indices: &[u32],
        values: &[f32],
        k_max: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let n = self.size();
        // A block: k_max indices, then k_max values (their bits).
        let mut mine = vec![PAD; 2 * k_max];
        mine[..indices.len()].copy_from_slice(indices);
        for (j, v) in values.iter().enumerate() {
            mine[k_max + j] = v.to_bits();
        }
        let mut all = vec![0u32; n * 2 * k_max];
        self.all_gather(&mine, &mut all)?;
        sum_pair_blocks(&all, k_max, out, false)
    }
}

/// Sums gathered (index, value) blocks into `out`, the layout of
/// [`Communicator::sparse_all_reduce`]'s gather route: `all` holds one
/// block per rank, in rank order, each `k` indices (`u32::MAX` pads the
/// end) and then `k` values (their f32 bits). `out` is zeroed first, and
/// the blocks are added in order, so every rank that sums the same blocks
/// gets the same bits. With `avg` the entries that any block touched are
/// divided by the number of blocks (the others stay 0, as dividing the
/// whole vector would leave them, without a pass over it). An index
/// outside `out` is an error.
///
/// ```
/// let (a, b) = (3.0f32.to_bits(), 1.0f32.to_bits());
/// let all = [0, 2, a, b, /* rank 1 */ 2, u32::MAX, a, 0];
/// let mut out = [9.0f32; 4];
/// tutti::sum_pair_blocks(&all, 2, &mut out, true)?;
/// assert_eq!(out, [1.5, 0.0, 2.0, 0.0]);
/// # Ok::<(), tutti::Error>(())
/// ```
pub fn sum_pair_blocks(all: &[u32], k: usize, out: &mut [f32], avg: bool) -> Result<()> {
    if k == 0 || !all.len().is_multiple_of(2 * k) {
        return Err(Error::arg(format!(
            "sum_pair_blocks: {} words are not whole blocks of {k} pairs",
            all.len()
        )));
    }
    let blocks = || {
        all.chunks_exact(2 * k).map(|b| {
            let (idx, val) = b.split_at(k);
            let real = idx.iter().position(|&i| i == PAD).unwrap_or(k);
            (&idx[..real], &val[..real])
        })
    };
    if let Some(&i) = blocks()
        .flat_map(|(idx, _)| idx)
        .find(|&&i| i as usize >= out.len())
    {
        return Err(Error::arg(format!(
            "sum_pair_blocks: index {i} is outside the vector of {} elements",
            out.len()
        )));
    }
    out.fill(0.0);
    for (idx, val) in blocks() {
        for (&i, &v) in idx.iter().zip(val) {
            out[i as usize] += f32::from_bits(v);
        }
    }
    if avg {
        let n = (all.len() / (2 * k)) as f32;
        let mut done = vec![0u64; out.len().div_ceil(64)];
        for (idx, _) in blocks() {
            for &i in idx {
                let (w, b) = (i as usize / 64, 1u64 << (i % 64));
                if done[w] & b == 0 {
                    done[w] |= b;
                    out[i as usize] /= n;
                }
            }
        }
    }
    Ok(())
}

fn check_local(indices: &[u32], values: &[f32], len: usize, op: ReduceOp) -> Result<()> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
        return Err(Error::arg(format!(
            "sparse_all_reduce: {op:?} is not supported; use Sum or Avg"
        )));
    }
    if indices.len() != values.len() {
        return Err(Error::arg(format!(
            "sparse_all_reduce: {} indices but {} values; they must pair up",
            indices.len(),
            values.len()
        )));
    }
    if len >= PAD as usize {
        return Err(Error::arg(format!(
            "sparse_all_reduce: a vector of {len} elements is too long for u32 indices"
        )));
    }
    if let Some((j, &i)) = indices.iter().enumerate().find(|(_, &i)| i as usize >= len) {
        return Err(Error::arg(format!(
            "sparse_all_reduce: indices[{j}] = {i} is outside the vector of {len} elements"
        )));
    }
    Ok(())
}

/// Top-K sparsification with error feedback, for one gradient vector.
///
/// Each step, [`compress`](TopK::compress) adds what earlier steps did not
/// send (the residual) to the gradient, keeps the `k` entries of largest
/// magnitude, and keeps the rest as the new residual; with error feedback
/// off the rest is dropped. [`Communicator::top_k_all_reduce`] does that
/// and the sparse AllReduce in one call.
///
/// With [`with_momentum`](TopK::with_momentum) it also applies Deep
/// Gradient Compression's momentum correction (Lin et al. 2018) before the
/// selection: a velocity `u = m * u + g` is added to the residual, and both
/// are zeroed where entries were sent; the optimizer then takes plain SGD
/// steps. `GradSync` has the same per bucket
/// ([`GradSync::top_k_momentum`](crate::GradSync::top_k_momentum)).
#[derive(Clone, Debug)]
pub struct TopK {
    k: usize,
    residual: Vec<f32>,
    error_feedback: bool,
    /// The momentum factor, with momentum correction.
    momentum: Option<f32>,
    /// The velocity `u`: one entry per element with momentum correction,
    /// empty without.
    velocity: Vec<f32>,
}

impl TopK {
    /// For vectors of `len` elements, sending `ceil(ratio * len)` of them
    /// (at least one where `len > 0`); `ratio` in `(0, 1]`.
    pub fn new(len: usize, ratio: f64, error_feedback: bool) -> Result<TopK> {
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(Error::arg(format!("TopK: ratio {ratio} must be in (0, 1]")));
        }
        let k = ((len as f64 * ratio).ceil() as usize).clamp(len.min(1), len);
        Ok(TopK {
            k,
            residual: vec![0.0; len],
            error_feedback,
            momentum: None,
            velocity: Vec::new(),
        })
    }

    /// This compressor with momentum correction, factor `m` in `[0, 1)`:
    /// [`compress`](TopK::compress) then folds the gradient in as
    /// `u = m * u + g; residual += u`, selects from the residual, and zeroes
    /// the residual and `u` where it sent (momentum factor masking). Needs
    /// error feedback. `m = 0` is plain error feedback.
    ///
    /// ```
    /// let mut t = tutti::TopK::new(4, 0.25, true)?.with_momentum(0.5)?;
    /// assert_eq!(t.compress(&[1.0, -4.0, 3.0, 2.0])?, (vec![1], vec![-4.0]));
    /// assert_eq!(t.velocity(), Some(&[1.0, 0.0, 3.0, 2.0][..]));
    /// // u = 0.5 * u + g = [1.5, 0, 1.5, 1]; residual = [1, 0, 3, 2] + u.
    /// assert_eq!(t.compress(&[1.0, 0.0, 0.0, 0.0])?, (vec![2], vec![4.5]));
    /// assert_eq!(t.residual(), &[2.5, 0.0, 0.0, 3.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn with_momentum(self, m: f64) -> Result<TopK> {
        if !(0.0..1.0).contains(&m) {
            return Err(Error::arg(format!("TopK: momentum {m} must be in [0, 1)")));
        }
        if !self.error_feedback {
            return Err(Error::arg(format!(
                "TopK: momentum correction (momentum {m}) needs error feedback: the velocity \
                 is added to the residual"
            )));
        }
        let len = self.residual.len();
        Ok(TopK {
            momentum: Some(m as f32),
            velocity: vec![0.0; len],
            ..self
        })
    }

    /// The momentum factor, if momentum correction is on.
    pub fn momentum(&self) -> Option<f64> {
        self.momentum.map(f64::from)
    }

    /// The velocity `u` of momentum correction, if on.
    pub fn velocity(&self) -> Option<&[f32]> {
        self.momentum.map(|_| &self.velocity[..])
    }

    /// The residual and the velocity (if momentum correction is on), to
    /// write: e.g. to carry them over when a framework regroups its
    /// gradients into new vectors.
    pub fn state_mut(&mut self) -> (&mut [f32], Option<&mut [f32]>) {
        let v = self.momentum.map(|_| &mut self.velocity[..]);
        (&mut self.residual[..], v)
    }

    /// Entries sent per step.
    pub fn k(&self) -> usize {
        self.k
    }

    /// What has not been sent yet (all zeros without error feedback).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Adds the residual to `grad` and splits it: returns the `k` largest
    /// entries by magnitude as (indices, values), ascending by index, and
    /// keeps the rest as the residual. `grad` must have the length given
    /// to [`new`](TopK::new).
    pub fn compress(&mut self, grad: &[f32]) -> Result<(Vec<u32>, Vec<f32>)> {
        self.check_len(grad.len(), "compress")?;
        // In place: the residual becomes gradient + residual, the selection
        // runs on it, and what is sent is zeroed; no full-length temporary.
        let k = self.k;
        if !self.error_feedback {
            let order = top_k_indices(grad, k);
            let values = order.iter().map(|&i| grad[i as usize]).collect();
            return Ok((order, values));
        }
        let mo = self.momentum.map(|m| (&mut self.velocity[..], m));
        let order = add_and_select(&mut self.residual, grad, mo, k);
        let values = order.iter().map(|&i| self.residual[i as usize]).collect();
        for &i in &order {
            self.residual[i as usize] = 0.0;
        }
        if self.momentum.is_some() {
            for &i in &order {
                self.velocity[i as usize] = 0.0;
            }
        }
        Ok((order, values))
    }

    /// A dense step (a warm-up before Top-K, say): folds `grad` in as
    /// [`compress`](TopK::compress) does, then leaves the whole residual in
    /// `grad`, to be sent by a dense AllReduce, and empties the residual.
    /// The velocity is kept (nothing is stale when everything is sent), so
    /// dense steps with momentum correction are SGD with momentum `m`.
    /// Without error feedback `grad` is left as it is.
    ///
    /// ```
    /// let mut t = tutti::TopK::new(2, 0.5, true)?.with_momentum(0.5)?;
    /// let mut g = [2.0, 4.0];
    /// t.dense_step(&mut g)?;
    /// t.dense_step(&mut g)?; // u = 0.5 * [2, 4] + [2, 4]
    /// assert_eq!(g, [3.0, 6.0]);
    /// assert_eq!((t.residual(), t.velocity()), (&[0.0, 0.0][..], Some(&[3.0, 6.0][..])));
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn dense_step(&mut self, grad: &mut [f32]) -> Result<()> {
        self.check_len(grad.len(), "dense_step")?;
        if !self.error_feedback {
            return Ok(());
        }
        let m = self.momentum.unwrap_or(0.0);
        let has_u = self.momentum.is_some();
        for (i, (g, r)) in grad.iter_mut().zip(&mut self.residual).enumerate() {
            let mut x = *g;
            if has_u {
                let u = &mut self.velocity[i];
                *u = m * *u + x;
                x = *u;
            }
            *g = *r + x;
            *r = 0.0;
        }
        Ok(())
    }

    fn check_len(&self, len: usize, what: &str) -> Result<()> {
        if len != self.residual.len() {
            return Err(Error::arg(format!(
                "TopK::{what}: the gradient has {len} elements, this compressor {}",
                self.residual.len()
            )));
        }
        Ok(())
    }
}

impl Communicator {
    /// Top-K AllReduce of `grad` in place: [`TopK::compress`] (residual in,
    /// residual out), then [`sparse_all_reduce`](Communicator::sparse_all_reduce)
    /// of the kept entries into `grad` (`op` Sum or Avg).
    ///
    /// ```
    /// use tutti::{Communicator, ReduceOp, TopK};
    ///
    /// let comms = Communicator::init_all(2).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let mut topk = TopK::new(1000, 0.01, true).unwrap(); // send 10 of 1000
    ///             let mut grad = vec![0f32; 1000];
    ///             grad[c.rank()] = 9.0;
    ///             let route = c.top_k_all_reduce(&mut grad, &mut topk, ReduceOp::Avg).unwrap();
    ///             assert_eq!((grad[0], grad[1]), (4.5, 4.5));
    ///             println!("rank {}: {route:?}, {} values held back", c.rank(), 1000 - topk.k());
    ///         });
    ///     }
    /// });
    /// ```
    pub fn top_k_all_reduce(
        &self,
        grad: &mut [f32],
        topk: &mut TopK,
        op: ReduceOp,
    ) -> Result<SparseRoute> {
        match topk.compress(grad) {
            Ok((idx, val)) => self.sparse_inner(&idx, &val, grad, op, Ok(())),
            Err(e) => self.sparse_inner(&[], &[], grad, op, Err(e)),
        }
    }
}

/// `acc += grad` (or, with momentum `(u, m)`, `u = m * u + grad; acc +=
/// u`), then [`top_k_indices`] of the sum, in one pass over the vectors
/// where the sampled threshold holds: the sample is taken from the sum
/// before it is stored, and the candidates are collected while adding.
pub(crate) fn add_and_select(
    acc: &mut [f32],
    grad: &[f32],
    mut mo: Option<(&mut [f32], f32)>,
    k: usize,
) -> Vec<u32> {
    let n = acc.len();
    let sampled = !(k == 0 || n < 8192 || k * 8 > n);
    let t = sampled.then(|| {
        let step = n / 4096;
        let inc = |i: usize| match &mo {
            None => grad[i],
            Some((u, m)) => m * u[i] + grad[i],
        };
        let mut sample: Vec<f32> = (0..4096)
            .map(|j| (acc[j * step] + inc(j * step)).abs())
            .collect();
        sample_threshold(&mut sample, k, n)
    });
    let mut cands = Cands::with_capacity(if sampled { 4 * k } else { 0 });
    // In blocks that stay in L1: a pass that adds (vectorised), then a
    // pass that collects the candidates (a branch rarely taken).
    const BLOCK: usize = 2048;
    for (b, r) in acc.chunks_mut(BLOCK).enumerate() {
        let (at, len) = (b * BLOCK, r.len());
        let g = &grad[at..at + len];
        match &mut mo {
            None => {
                for (r, g) in r.iter_mut().zip(g) {
                    *r += g;
                }
            }
            Some((u, m)) => {
                let m = *m;
                for ((r, g), u) in r.iter_mut().zip(g).zip(&mut u[at..at + len]) {
                    *u = m * *u + g;
                    *r += *u;
                }
            }
        }
        if let Some(t) = t {
            // Magnitudes as bits: for non-negative floats (and NaN's
            // absolute value, above infinity) the integer order is
            // total_cmp's.
            let tb = t.to_bits();
            for (j, r) in r.iter().enumerate() {
                let m = mag(*r);
                if m >= tb {
                    cands.push((at + j) as u32, m);
                }
            }
        }
    }
    if sampled {
        select_from(acc, k, cands)
    } else {
        top_k_indices(acc, k)
    }
}

/// The magnitude above which about twice the wanted fraction of a 4096
/// sample of a vector of `n` elements lies.
fn sample_threshold(sample: &mut [f32], k: usize, n: usize) -> f32 {
    let above = ((2 * k * 4096).div_ceil(n)).clamp(1, 4095);
    let (_, t, _) = sample.select_nth_unstable_by(4096 - above, f32::total_cmp);
    *t
}

/// `|x|` as bits: for non-negative floats (NaN's magnitude above
/// infinity's) the integer order is `total_cmp`'s.
#[inline(always)]
fn mag(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// Candidates for the selection: indices, ascending, and their magnitudes
/// ([`mag`]), taken where the values pass by anyway.
struct Cands {
    idx: Vec<u32>,
    mag: Vec<u32>,
}

impl Cands {
    fn with_capacity(c: usize) -> Cands {
        Cands {
            idx: Vec::with_capacity(c),
            mag: Vec::with_capacity(c),
        }
    }

    #[inline(always)]
    fn push(&mut self, i: u32, m: u32) {
        self.idx.push(i);
        self.mag.push(m);
    }

    fn all(acc: &[f32]) -> Cands {
        Cands {
            idx: (0..acc.len() as u32).collect(),
            mag: acc.iter().map(|&x| mag(x)).collect(),
        }
    }
}

/// The `k` of largest magnitude among `cands` (ascending), or among all of
/// `acc` where the candidates cannot be right (fewer than `k`, or so many
/// that the sample misjudged).
fn select_from(acc: &[f32], k: usize, cands: Cands) -> Vec<u32> {
    let n = cands.idx.len();
    if n < k || n > 16 * k {
        return pick(k, Cands::all(acc));
    }
    pick(k, cands)
}

/// The `k` of largest magnitude among `cands`, kept in index order: the
/// `k`-th largest magnitude is selected from a copy of the magnitudes (a
/// small sequential array), then one pass keeps those above it and, of
/// those equal to it, the first few, so no sort is needed.
fn pick(k: usize, cands: Cands) -> Vec<u32> {
    let Cands { idx, mag } = cands;
    if k >= idx.len() {
        return idx;
    }
    if k == 0 {
        return Vec::new();
    }
    let mut keys = mag.clone();
    let at = keys.len() - k;
    let (_, &mut kth, larger) = keys.select_nth_unstable(at);
    let mut ties = k - larger.iter().filter(|&&m| m > kth).count();
    let mut out = Vec::with_capacity(k);
    for (i, m) in idx.into_iter().zip(mag) {
        if m > kth || (m == kth && ties > 0) {
            if m == kth {
                ties -= 1;
            }
            out.push(i);
        }
    }
    out
}

/// The indices of the `k` entries of `acc` of largest magnitude, ascending
/// (ties broken arbitrarily). One pass, not a selection over the whole
/// vector: a threshold from a strided sample below which at most `k` of the
/// largest can lie is checked by counting, and the exact selection then
/// runs on the few candidates above it (the full selection if the sample
/// misjudged).
pub(crate) fn top_k_indices(acc: &[f32], k: usize) -> Vec<u32> {
    let n = acc.len();
    if k == 0 {
        return Vec::new();
    }
    if n < 8192 || k * 8 > n {
        return pick(k, Cands::all(acc));
    }
    // A sample of 4096; the threshold sits at twice the wanted fraction.
    let step = n / 4096;
    let mut sample: Vec<f32> = (0..4096).map(|j| acc[j * step].abs()).collect();
    let tb = mag(sample_threshold(&mut sample, k, n));
    let mut cands = Cands::with_capacity(4 * k);
    for (i, &x) in acc.iter().enumerate() {
        let m = mag(x);
        if m >= tb {
            cands.push(i as u32, m);
        }
    }
    select_from(acc, k, cands)
}

#[cfg(test)]
mod tests {
    use super::{add_and_select, top_k_indices, TopK};

    /// Pseudo-random values of both signs up to about 1.7e4 (xorshift).
    fn small_values(mut x: u64) -> impl FnMut() -> f32 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 * if x & 1 == 0 { 1e-3 } else { -1e-3 }
        }
    }

    /// The fused add-and-select equals adding, then selecting.
    #[test]
    fn fused_add_and_select_matches() {
        let mut next = small_values(0x2545_f491_4f6c_dd1d);
        let acc: Vec<f32> = (0..50_000).map(|_| next()).collect();
        let grad: Vec<f32> = (0..50_000).map(|_| next()).collect();
        for k in [0, 1, 50, 500, 5000, 50_000] {
            let mut a = acc.clone();
            let got = add_and_select(&mut a, &grad, None, k);
            let sum: Vec<f32> = acc.iter().zip(&grad).map(|(r, g)| r + g).collect();
            assert_eq!(a, sum);
            assert_eq!(got, top_k_indices(&sum, k), "k = {k}");
        }
    }

    /// Bad blocks are errors; the average divides each touched entry once.
    #[test]
    fn pair_blocks_checked_and_averaged() {
        let one = 1.0f32.to_bits();
        let mut out = [0f32; 3];
        assert!(super::sum_pair_blocks(&[0, one, 1], 1, &mut out, false).is_err());
        assert!(super::sum_pair_blocks(&[3, one], 1, &mut out, false).is_err());
        assert!(super::sum_pair_blocks(&[], 0, &mut out, false).is_err());
        let all = [2, 0, one, one, 2, u32::MAX, one, 0, 2, 1, one, one];
        super::sum_pair_blocks(&all, 2, &mut out, true).unwrap();
        assert_eq!(out, [1.0 / 3.0, 1.0 / 3.0, 1.0]);
    }

    /// With momentum the fused pass equals `u = m * u + g; acc += u`, then
    /// selecting; and `TopK` masks both vectors where it sent.
    #[test]
    fn fused_momentum_matches_and_masks() {
        let mut next = small_values(0x1234_5678_9abc_def1);
        let n = 40_000;
        let (acc, vel, grad): (Vec<f32>, Vec<f32>, Vec<f32>) = (
            (0..n).map(|_| next()).collect(),
            (0..n).map(|_| next()).collect(),
            (0..n).map(|_| next()).collect(),
        );
        for k in [1, 40, 400, 4000, n] {
            let (mut a, mut u) = (acc.clone(), vel.clone());
            let got = add_and_select(&mut a, &grad, Some((&mut u, 0.9)), k);
            let u2: Vec<f32> = vel.iter().zip(&grad).map(|(u, g)| 0.9 * u + g).collect();
            let a2: Vec<f32> = acc.iter().zip(&u2).map(|(a, u)| a + u).collect();
            assert_eq!((&u, &a), (&u2, &a2));
            assert_eq!(got, top_k_indices(&a2, k), "k = {k}");
        }
        let mut t = TopK::new(n, 0.01, true)
            .unwrap()
            .with_momentum(0.9)
            .unwrap();
        for _ in 0..3 {
            let (idx, val) = t.compress(&grad).unwrap();
            assert_eq!(idx.len(), 400);
            for (&i, &v) in idx.iter().zip(&val) {
                let i = i as usize;
                assert!(v != 0.0);
                assert_eq!((t.residual()[i], t.velocity().unwrap()[i]), (0.0, 0.0));
            }
        }
        assert!(TopK::new(4, 0.5, false)
            .unwrap()
            .with_momentum(0.5)
            .is_err());
        assert!(TopK::new(4, 0.5, true).unwrap().with_momentum(1.0).is_err());
        assert!(TopK::new(4, 0.5, true)
            .unwrap()
            .with_momentum(f64::NAN)
            .is_err());
    }

    /// The sampled threshold selects the same set as a full selection
    /// (distinct magnitudes), for long vectors and a range of k.
    #[test]
    fn sampled_selection_is_exact() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let acc: Vec<f32> = (0..100_000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let m = (x >> 40) as f32 + i as f32 * 1e-3;
                if x & 1 == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect();
        for k in [1, 10, 100, 1000, 5000, 20_000, 100_000] {
            let got = top_k_indices(&acc, k);
            let mut order: Vec<u32> = (0..acc.len() as u32).collect();
            order.sort_by(|&a, &b| acc[b as usize].abs().total_cmp(&acc[a as usize].abs()));
            let mut want = order[..k].to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "k = {k}");
        }
    }
}

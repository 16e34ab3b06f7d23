//! [`GradSync`](super::GradSync)'s buckets: the layout, and one bucket's
//! reduction per step, dense (f32 or a 16-bit wire) or Top-K with error
//! feedback.
//!
//! A Top-K bucket adds its residual to the gradients, keeps the
//! `ceil(ratio * len)` entries of largest magnitude ([`TopK`]'s selection)
//! and holds the rest back as the new residual. `k` is a function of the
//! bucket's length, so every rank sends exactly `k` pairs plus one for the
//! invalid flag (index `len`): no agreement round is needed, and the route
//! ([`Communicator::sparse_route`]) is the same on every rank. The gather
//! route AllGathers the pairs asynchronously and adds them up in rank order
//! at `wait`; the dense route scatters them into the bucket's vector and
//! AllReduces it. If the step turns out invalid (a rank's gradients not
//! all marked ready, or an op failed), what was sent goes back into the
//! residual: nothing is lost.
//!
//! A Top-K bucket with a warm-up ([`BucketOptions::top_k_warmup`]) sends
//! its first synchronisations dense instead, the residual added in and
//! then flushed (the residual holds what was sent until the step has
//! succeeded, so a failed warm-up step loses nothing either).
//!
//! With momentum correction ([`BucketOptions::top_k_momentum`], the
//! `momentum` module) the gradients go through a per-element velocity
//! before they are added to the residual, and the velocity is zeroed where
//! the residual was sent.

use super::super::sparse::add_and_select;
use super::super::{Communicator, Options, SparseRoute, TopK, Work};
use super::momentum::{self, Momentum};
use crate::error::{Error, Result};
use crate::reduce::{DataType, ReduceOp};

/// Padding index in a gathered block: no element.
const PAD: u32 = u32::MAX;

/// How one bucket's gradients travel: f32 (the default), on a 16-bit wire,
/// or Top-K with error feedback. Set for every bucket with
/// [`GradSync::wire`](super::GradSync::wire) and
/// [`GradSync::top_k`](super::GradSync::top_k), for one bucket with
/// [`GradSync::bucket_options`](super::GradSync::bucket_options).
///
/// ```
/// use tutti::{BucketOptions, DataType};
/// let dense = BucketOptions::dense();
/// let wire = BucketOptions::dense().wire(DataType::Bf16);
/// let sparse = BucketOptions::dense().top_k(0.01);
/// let warm = BucketOptions::dense().top_k(0.01).top_k_warmup(40);
/// let dgc = BucketOptions::dense().top_k(0.01).top_k_momentum(0.9);
/// assert_ne!(wire, sparse);
/// assert_eq!(warm.top_k_warmup, 40);
/// assert_eq!(dgc.top_k_momentum, Some(0.9));
/// # let _ = dense;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BucketOptions {
    /// The 16-bit wire type (bf16 or f16), if any.
    pub wire: Option<DataType>,
    /// The Top-K ratio in `(0, 1]`, if any (error feedback is always on).
    pub top_k: Option<f64>,
    /// How many of the bucket's first synchronisations go dense before
    /// Top-K starts (0: none); only with `top_k`. See
    /// [`top_k_warmup`](BucketOptions::top_k_warmup).
    pub top_k_warmup: usize,
    /// DGC's momentum correction factor in `[0, 1)`, if any; only with
    /// `top_k`. See [`top_k_momentum`](BucketOptions::top_k_momentum).
    pub top_k_momentum: Option<f64>,
}

impl BucketOptions {
    /// f32 on the wire, every element sent.
    pub fn dense() -> Self {
        Self::default()
    }

    /// These options with the 16-bit wire `wire` ([`Options::wire`]).
    pub fn wire(self, wire: DataType) -> Self {
        BucketOptions {
            wire: Some(wire),
            ..self
        }
    }

    /// These options with Top-K: send the `ceil(ratio * len)` largest
    /// entries (by magnitude) of the bucket, keep the rest for the next
    /// step (error feedback).
    pub fn top_k(self, ratio: f64) -> Self {
        BucketOptions {
            top_k: Some(ratio),
            ..self
        }
    }

    /// These options with a dense warm-up of `syncs` synchronisations
    /// before Top-K starts (the warm-up of Deep Gradient Compression, Lin
    /// et al. 2018): the bucket's first `syncs` synchronisations send
    /// every entry in f32, the residual added in, so the result is the
    /// plain average and nothing is held back (the residual is zero after
    /// each successful warm-up step); Top-K with error feedback starts at
    /// synchronisation `syncs + 1`. Synchronisations are counted, not
    /// steps: with [`sync_every(n)`](super::GradSync::sync_every) a
    /// warm-up of `W` lasts `W * n` steps. Every synchronisation the
    /// bucket takes part in counts, a failed one included (it fails on
    /// every rank alike, so the count stays the same everywhere). Needs
    /// [`top_k`](BucketOptions::top_k): a warm-up without Top-K is an
    /// error at first use.
    pub fn top_k_warmup(self, syncs: usize) -> Self {
        BucketOptions {
            top_k_warmup: syncs,
            ..self
        }
    }

    /// The rules: a ratio in `(0, 1]`, not both a wire and Top-K, a
    /// warm-up only with Top-K, a momentum in `[0, 1)` only with Top-K.
    pub(super) fn check(&self, k: usize) -> Result<()> {
        momentum::check(self, k)?;
        if self.top_k_warmup > 0 && self.top_k.is_none() {
            return Err(Error::arg(format!(
                "GradSync: bucket {k}: a Top-K warm-up ({} synchronisations) needs Top-K on \
                 the same bucket: set top_k(ratio) too, or no warm-up",
                self.top_k_warmup
            )));
        }
        if let Some(r) = self.top_k {
            if !(r > 0.0 && r <= 1.0) {
                return Err(Error::arg(format!(
                    "GradSync: bucket {k}: Top-K ratio {r} must be in (0, 1]"
                )));
            }
            if let Some(w) = self.wire {
                return Err(Error::arg(format!(
                    "GradSync: bucket {k}: a {w:?} wire and Top-K on the same bucket are not \
                     supported: Top-K sends f32 (index, value) pairs; choose one"
                )));
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
pub(super) struct Layout {
    /// Tensor -> (bucket, offset in the bucket's vector).
    pub place: Vec<(usize, usize)>,
    pub buckets: Vec<Bucket>,
    /// The first bucket not yet started this step.
    pub next: usize,
}

#[derive(Debug)]
pub(super) struct Bucket {
    /// Its tensors, in the order they are laid out.
    pub tensors: Vec<usize>,
    /// Its tensors not yet marked ready this step.
    pub pending: usize,
    /// Gradient elements (the vector has one more: the invalid flag).
    pub len: usize,
    /// The gradients plus the invalid flag; `None` while in flight.
    pub data: Option<Vec<f32>>,
    pub flight: Option<Flight>,
    /// The AllReduce options of a dense bucket (its wire).
    pub call: Options,
    pub topk: Option<TopKState>,
}

#[derive(Debug)]
pub(super) struct TopKState {
    /// Its `k` (its own residual unused: error feedback is here).
    select: TopK,
    pub residual: Vec<f32>,
    /// This step's pairs, until the step ends.
    sent: Option<Sent>,
    /// Dense synchronisations before Top-K starts.
    warmup: usize,
    /// Synchronisations started so far (every rank starts the same).
    syncs: usize,
    /// The velocity, with momentum correction.
    pub momentum: Option<Momentum>,
}

/// What a Top-K bucket sent this step, until the step ends.
#[derive(Debug)]
enum Sent {
    /// (index, value) pairs, no longer in the residual, and the velocity
    /// masked at those indices (empty without momentum correction).
    Pairs(Vec<u32>, Vec<f32>, Vec<f32>),
    /// A warm-up step: everything, the residual a copy of it until the
    /// step succeeds.
    Dense,
}

#[derive(Debug)]
pub(super) enum Flight {
    Reduce(Work<Vec<f32>>),
    Gather {
        work: Work<(Vec<u32>, Vec<u32>)>,
        data: Vec<f32>,
        k: usize,
    },
}

impl Flight {
    pub fn is_done(&self) -> bool {
        match self {
            Flight::Reduce(w) => w.is_done(),
            Flight::Gather { work, .. } => work.is_done(),
        }
    }
}

impl Bucket {
    pub fn new(tensors: Vec<usize>, len: usize, opts: &BucketOptions) -> Result<Bucket> {
        let topk = match opts.top_k {
            Some(ratio) => Some(TopKState {
                select: TopK::new(len, ratio, false)?,
                residual: vec![0.0; len],
                sent: None,
                warmup: opts.top_k_warmup,
                syncs: 0,
                momentum: opts.top_k_momentum.map(|m| Momentum::new(len, m)),
            }),
            None => None,
        };
        Ok(Bucket {
            pending: tensors.len(),
            tensors,
            len,
            data: Some(vec![0.0; len + 1]),
            flight: None,
            call: Options {
                wire: opts.wire,
                ..Options::default()
            },
            topk,
        })
    }

    /// Issues this step's reduction; `invalid` sets the flag (and a Top-K
    /// bucket then sends nothing and keeps its residual).
    fn start(&mut self, comm: &Communicator, invalid: bool) {
        let mut d = self.data.take().expect("a bucket starts once per step");
        let n = self.len;
        let flag = if invalid { 1.0 } else { 0.0 };
        let Some(t) = &mut self.topk else {
            d[n] = flag;
            self.flight = Some(Flight::Reduce(comm.all_reduce_async_with(
                d,
                ReduceOp::Sum,
                &self.call,
            )));
            return;
        };
        t.syncs += 1;
        if t.syncs <= t.warmup {
            // Warm-up: the residual goes with the gradients and keeps a
            // copy of what is sent until the step has succeeded.
            if !invalid {
                momentum::fold(t.momentum.as_mut(), &mut d[..n], &mut t.residual);
                t.sent = Some(Sent::Dense);
            }
            d[n] = flag;
            self.flight = Some(Flight::Reduce(comm.all_reduce_async_with(
                d,
                ReduceOp::Sum,
                &self.call,
            )));
            return;
        }
        let (idx, val, masked) = if invalid {
            (Vec::new(), Vec::new(), Vec::new())
        } else {
            // One pass: the gradients folded into the residual (through
            // the velocity, with momentum) and the candidates collected;
            // `d` is not written, as what is sent comes from the residual.
            let mo = t.momentum.as_mut().map(Momentum::parts);
            let idx = add_and_select(&mut t.residual, &d[..n], mo, t.select.k());
            let val: Vec<f32> = idx.iter().map(|&i| t.residual[i as usize]).collect();
            for &i in &idx {
                t.residual[i as usize] = 0.0;
            }
            let masked = t.momentum.as_mut().map_or(Vec::new(), |m| m.mask(&idx));
            (idx, val, masked)
        };
        let k = t.select.k();
        self.flight = Some(match comm.sparse_route(k + 1, n + 1) {
            SparseRoute::Gather => {
                // A block: k + 1 indices, then k + 1 values (their bits);
                // the last pair is the flag.
                let mut mine = vec![PAD; 2 * (k + 1)];
                mine[..idx.len()].copy_from_slice(&idx);
                mine[k] = n as u32;
                for (j, v) in val.iter().enumerate() {
                    mine[k + 1 + j] = v.to_bits();
                }
                mine[2 * k + 1] = flag.to_bits();
                let all = vec![0u32; comm.size() * 2 * (k + 1)];
                Flight::Gather {
                    work: comm.all_gather_async(mine, all),
                    data: d,
                    k,
                }
            }
            SparseRoute::Dense => {
                d.fill(0.0);
                for (&i, &v) in idx.iter().zip(&val) {
                    d[i as usize] = v;
                }
                d[n] = flag;
                Flight::Reduce(comm.all_reduce_async(d, ReduceOp::Sum))
            }
        });
        t.sent = Some(Sent::Pairs(idx, val, masked));
    }

    /// Waits for this step's reduction and puts the sums back in `data`
    /// (zeros if the op failed); returns the summed invalid flag. `None`
    /// if nothing was issued.
    pub fn finish(&mut self) -> Option<Result<f32>> {
        let n = self.len;
        let r = match self.flight.take()? {
            Flight::Reduce(w) => w.wait(),
            Flight::Gather { work, mut data, k } => work.wait().map(|(_, all)| {
                data.fill(0.0);
                // Every rank adds in rank order, so all get the same bits.
                for block in all.chunks_exact(2 * (k + 1)) {
                    let (idx, val) = block.split_at(k + 1);
                    for (&i, &v) in idx.iter().zip(val) {
                        if i != PAD {
                            data[i as usize] += f32::from_bits(v);
                        }
                    }
                }
                data
            }),
        };
        Some(match r {
            Ok(d) => {
                let flag = d[n];
                self.data = Some(d);
                Ok(flag)
            }
            Err(e) => {
                self.data = Some(vec![0.0; n + 1]);
                Err(e)
            }
        })
    }

    /// Ends a Top-K bucket's step: on a failed step, what was sent goes
    /// back into the residual (and the masked velocity back into the
    /// velocity); after a successful warm-up step the residual is empty
    /// (everything was sent).
    pub fn settle(&mut self, failed: bool) {
        if let Some(t) = &mut self.topk {
            match t.sent.take() {
                Some(Sent::Pairs(idx, val, masked)) if failed => {
                    for (&i, &v) in idx.iter().zip(&val) {
                        t.residual[i as usize] += v;
                    }
                    if let Some(m) = &mut t.momentum {
                        m.unmask(&idx, &masked);
                    }
                }
                Some(Sent::Dense) if !failed => t.residual.fill(0.0),
                _ => {}
            }
        }
    }
}

impl Layout {
    /// Starts, in bucket order, every bucket from `next` whose gradients
    /// are all ready (every remaining one if `force`, flagged invalid).
    pub fn start_ready(&mut self, comm: &Communicator, force: bool) {
        while let Some(b) = self.buckets.get_mut(self.next) {
            if b.pending > 0 && !force {
                break;
            }
            let invalid = force && b.pending > 0;
            b.start(comm, invalid);
            self.next += 1;
        }
    }
}

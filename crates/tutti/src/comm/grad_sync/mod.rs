//! [`GradSync`]: the data-parallel reducer for Rust users (what PyTorch's
//! DDP `Reducer` does): gradient buckets, AllReduce overlapped with the
//! backward pass, accumulation over several micro-steps.
//!
//! Ownership: `GradSync` owns the gradients. Each bucket is one vector,
//! and a gradient is a fixed slice of its bucket's vector (DDP's "gradient
//! as bucket view"), so a bucket's AllReduce needs no packing copy, and a
//! gradient cannot be resized or aliased once registered: the borrow
//! checker, not a runtime check, keeps user code off a bucket in flight.
//!
//! Every bucket carries one extra element, the *invalid flag*: 0 from a
//! rank whose step was complete, 1 from a rank that ended its step with
//! gradients not marked ready. Such a rank still issues its remaining
//! buckets, so no peer is left waiting, and the summed flag tells every
//! rank the step's gradients are not an average.

mod bucket;
mod momentum;

pub use bucket::BucketOptions;

use super::Communicator;
use crate::error::{Error, Result};
use crate::reduce::DataType;
use bucket::{Bucket, Layout};

/// The data-parallel gradient reducer: register the gradients in the order
/// the model defines them (the backward pass produces them in reverse);
/// each step, fill them ([`grad_mut`](GradSync::grad_mut)), mark each one
/// ready as soon as it is final ([`mark_ready`](GradSync::mark_ready)),
/// and call [`wait`](GradSync::wait) before the optimizer step.
///
/// Gradients are packed into buckets of at most
/// [`bucket_bytes`](GradSync::bucket_bytes) (25 MiB by default) in reverse
/// registration order. A bucket's AllReduce starts as soon as its last
/// gradient is marked ready and every earlier bucket has started (buckets
/// start in the same order on every rank, whatever order the gradients
/// are marked in), so communication overlaps the rest of the backward pass.
///
/// Accumulation: with [`sync_every(n)`](GradSync::sync_every), only every
/// n-th step communicates. Between syncs each rank adds its micro-step
/// gradients into the buffers (e.g. `+=` through `grad_mut`, or
/// [`accumulate`](GradSync::accumulate)) and `wait` returns `Ok(false)`
/// leaving them untouched; at the n-th step `wait` leaves the sum over all
/// ranks and micro-steps divided by `ranks * n`: the mean of every
/// micro-step gradient of every rank. Call [`zero_grad`](GradSync::zero_grad)
/// after the optimizer step.
///
/// Per bucket, gradients travel as f32, on a 16-bit wire
/// ([`wire`](GradSync::wire)) or as Top-K pairs with error feedback
/// ([`top_k`](GradSync::top_k)), optionally after a dense warm-up
/// ([`top_k_warmup`](GradSync::top_k_warmup)) and with Deep Gradient
/// Compression's momentum correction
/// ([`top_k_momentum`](GradSync::top_k_momentum));
/// [`bucket_options`](GradSync::bucket_options) sets one bucket apart.
///
/// Every rank registers the same gradients (names and lengths) in the same
/// order, with the same options.
///
/// ```
/// use tutti::{Communicator, GradSync};
///
/// let comms = Communicator::init_all(2)?;
/// std::thread::scope(|s| {
///     for c in &comms {
///         s.spawn(move || -> tutti::Result<()> {
///             let mut gs = GradSync::new(c).bucket_bytes(64);
///             let w = gs.register("w", 32)?;
///             let b = gs.register("b", 1)?;
///             // Backward: the bias gradient is final first.
///             gs.grad_mut(b)?[0] = c.rank() as f32;
///             gs.mark_ready(b)?;
///             gs.grad_mut(w)?.fill(1.0 + c.rank() as f32);
///             gs.mark_ready(w)?;
///             assert!(gs.wait()?); // this step communicated
///             assert_eq!(gs.grad(b)?[0], 0.5); // (0 + 1) / 2
///             assert!(gs.grad(w)?.iter().all(|&g| g == 1.5));
///             gs.zero_grad()?;
///             Ok(())
///         });
///     }
/// });
/// # Ok::<(), tutti::Error>(())
/// ```
#[derive(Debug)]
pub struct GradSync<'c> {
    comm: &'c Communicator,
    bucket_bytes: usize,
    every: usize,
    /// Every bucket's options, unless `per_bucket` names it.
    all: BucketOptions,
    /// Options for single buckets, by bucket index.
    per_bucket: Vec<(usize, BucketOptions)>,
    names: Vec<String>,
    lens: Vec<usize>,
    /// Laid out at first use; registration is closed from then on.
    layout: Option<Layout>,
    /// Steps ended by `wait` so far.
    steps: u64,
    /// Marked ready this step.
    ready: Vec<bool>,
}

impl<'c> GradSync<'c> {
    /// A reducer over `comm`, with no gradients, buckets of 25 MiB
    /// ([`DEFAULT_BUCKET_BYTES`](crate::DEFAULT_BUCKET_BYTES)) and a sync
    /// every step.
    ///
    /// ```
    /// let comms = tutti::Communicator::init_all(1)?;
    /// let gs = tutti::GradSync::new(&comms[0]);
    /// assert_eq!(gs.len(), 0);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn new(comm: &'c Communicator) -> Self {
        GradSync {
            comm,
            bucket_bytes: super::fusion::DEFAULT_BUCKET_BYTES,
            every: 1,
            all: BucketOptions::default(),
            per_bucket: Vec::new(),
            names: Vec::new(),
            lens: Vec::new(),
            layout: None,
            steps: 0,
            ready: Vec::new(),
        }
    }

    /// This reducer with buckets of at most `bytes` (a gradient longer
    /// than that gets a bucket of its own). Checked (not 0) at first use.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let gs = tutti::GradSync::new(&comms[0]).bucket_bytes(1 << 20);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// This reducer with every bucket's AllReduce on the 16-bit wire
    /// `wire` (bf16 or f16, [`Options::wire`](crate::Options::wire)): half the bytes, each rank
    /// still adding in f32. Checked at the first bucket's AllReduce, where
    /// a type other than bf16 or f16 makes `wait` an error.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let gs = tutti::GradSync::new(&comms[0]).wire(tutti::DataType::Bf16);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn wire(mut self, wire: DataType) -> Self {
        self.all.wire = Some(wire);
        self
    }

    /// This reducer with every bucket reduced by Top-K with error feedback
    /// ([`BucketOptions::top_k`]): each rank sends the `ceil(ratio * len)`
    /// entries of largest magnitude of each bucket (its gradients plus
    /// what earlier steps held back) as (index, value) pairs, and keeps
    /// the rest, added to the next step's gradients. `wait` leaves the
    /// average of what the ranks sent. `ratio` must be in `(0, 1]`, and a
    /// bucket cannot have both a wire and Top-K: checked at first use.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).top_k(0.001);
    /// let w = gs.register("w", 1000)?;
    /// gs.grad_mut(w)?[7] = 5.0;
    /// gs.grad_mut(w)?[8] = 1.0;
    /// gs.mark_ready(w)?;
    /// gs.wait()?;
    /// assert_eq!(&gs.grad(w)?[7..9], &[5.0, 0.0]); // 1 of 1000 sent
    /// assert_eq!(gs.residual(w)?[8], 1.0); // the rest held back
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn top_k(mut self, ratio: f64) -> Self {
        self.all.top_k = Some(ratio);
        self
    }

    /// This reducer with every bucket's first `syncs` synchronisations
    /// dense before Top-K starts ([`BucketOptions::top_k_warmup`], the
    /// dense warm-up of Deep Gradient Compression): during the warm-up
    /// `wait` leaves the plain f32 average (of the velocity, with
    /// [`top_k_momentum`](GradSync::top_k_momentum)), the residual is sent
    /// along and nothing is held back (the residual stays zero); from the
    /// `syncs + 1`-th synchronisation on, Top-K with error feedback.
    /// Synchronisations are counted, not steps: with
    /// [`sync_every(n)`](GradSync::sync_every) the warm-up lasts
    /// `syncs * n` steps. Needs [`top_k`](GradSync::top_k) (for every
    /// bucket [`bucket_options`](GradSync::bucket_options) does not set
    /// apart): a bucket with a warm-up and no Top-K is an error at first
    /// use.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).top_k(0.25).top_k_warmup(1);
    /// let w = gs.register("w", 4)?;
    /// for step in 0..2 {
    ///     gs.set_grad(w, &[1.0, -4.0, 3.0, 2.0])?;
    ///     gs.mark_ready(w)?;
    ///     gs.wait()?;
    ///     if step == 0 {
    ///         // Warm-up: everything sent, nothing held back.
    ///         assert_eq!(gs.grad(w)?, &[1.0, -4.0, 3.0, 2.0]);
    ///         assert_eq!(gs.residual(w)?, &[0.0; 4]);
    ///     } else {
    ///         // Top-K: 1 of 4 sent, the rest held back.
    ///         assert_eq!(gs.grad(w)?, &[0.0, -4.0, 0.0, 0.0]);
    ///         assert_eq!(gs.residual(w)?, &[1.0, 0.0, 3.0, 2.0]);
    ///     }
    ///     gs.zero_grad()?;
    /// }
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn top_k_warmup(mut self, syncs: usize) -> Self {
        self.all.top_k_warmup = syncs;
        self
    }

    /// This reducer with bucket `k` (see [`bucket_of`](GradSync::bucket_of);
    /// bucket 0 holds the last registered gradients) reduced as `opts`
    /// says, whatever [`wire`](GradSync::wire) and [`top_k`](GradSync::top_k)
    /// say for the others. Checked at first use: `k` must be a bucket.
    ///
    /// ```
    /// use tutti::{BucketOptions, DataType};
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// // The large first bucket Top-K, the others on a bf16 wire.
    /// let gs = tutti::GradSync::new(&comms[0])
    ///     .wire(DataType::Bf16)
    ///     .bucket_options(0, BucketOptions::dense().top_k(0.01));
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn bucket_options(mut self, k: usize, opts: BucketOptions) -> Self {
        self.per_bucket.retain(|(b, _)| *b != k);
        self.per_bucket.push((k, opts));
        self
    }

    /// Bucket `k`'s options (after [`bucket_options`](GradSync::bucket_options)).
    fn options_of(&self, k: usize) -> BucketOptions {
        self.per_bucket
            .iter()
            .find(|(b, _)| *b == k)
            .map_or(self.all, |(_, o)| *o)
    }

    /// What Top-K has held back of gradient `i` so far (added to its next
    /// sync), or an error if its bucket does not use Top-K or is in
    /// flight.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).top_k(0.5);
    /// let w = gs.register("w", 4)?;
    /// gs.set_grad(w, &[1.0, -4.0, 3.0, 2.0])?;
    /// gs.mark_ready(w)?;
    /// gs.wait()?;
    /// assert_eq!(gs.grad(w)?, &[0.0, -4.0, 3.0, 0.0]);
    /// assert_eq!(gs.residual(w)?, &[1.0, 0.0, 0.0, 2.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn residual(&mut self, i: usize) -> Result<&[f32]> {
        self.topk_part(i, "residual", "does not use Top-K", |b| {
            b.topk.as_ref().map(|t| &t.residual[..])
        })
    }

    /// Gradient `i`'s share of the Top-K state that `pick` finds in its
    /// bucket (for [`residual`](GradSync::residual) and
    /// [`velocity`](GradSync::velocity), named `what`), or an error: the
    /// bucket `lacks` that state, or it is in flight.
    fn topk_part(
        &mut self,
        i: usize,
        what: &str,
        lacks: &str,
        pick: fn(&bucket::Bucket) -> Option<&[f32]>,
    ) -> Result<&[f32]> {
        self.index(i, what)?;
        let len = self.lens[i];
        let (k, at) = self.layout()?.place[i];
        let name = &self.names[i];
        let b = &self.layout.as_ref().expect("laid out").buckets[k];
        match pick(b) {
            Some(v) if b.data.is_some() => Ok(&v[at..at + len]),
            Some(_) => Err(Error::arg(format!(
                "GradSync::{what}: gradient '{name}' is being reduced: read it after wait()"
            ))),
            None => Err(Error::arg(format!(
                "GradSync::{what}: gradient '{name}' is in bucket {k}, which {lacks}"
            ))),
        }
    }

    /// This reducer communicating every `n`-th step only (gradient
    /// accumulation; see [`GradSync`]). Checked (not 0) at first use.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let gs = tutti::GradSync::new(&comms[0]).sync_every(4);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn sync_every(mut self, n: usize) -> Self {
        self.every = n;
        self
    }

    /// Registers a gradient of `len` elements named `name` (for errors) and
    /// returns its index. Registration closes at the first use of any
    /// gradient; a name registered twice is an error.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]);
    /// assert_eq!(gs.register("layer1.weight", 100)?, 0);
    /// assert!(gs.register("layer1.weight", 100).is_err());
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn register(&mut self, name: &str, len: usize) -> Result<usize> {
        if self.layout.is_some() {
            return Err(Error::arg(format!(
                "GradSync: cannot register gradient '{name}': registration closes \
                 at the first use of a gradient (grad, mark_ready, wait)"
            )));
        }
        if self.names.iter().any(|n| n == name) {
            return Err(Error::arg(format!(
                "GradSync: gradient '{name}' is already registered: register each gradient once"
            )));
        }
        self.names.push(name.to_string());
        self.lens.push(len);
        self.ready.push(false);
        Ok(self.names.len() - 1)
    }

    /// The number of registered gradients.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// gs.register("w", 3)?;
    /// assert_eq!(gs.len(), 1);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True if no gradient is registered.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// assert!(tutti::GradSync::new(&comms[0]).is_empty());
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Lays the buckets out (once): reverse registration order, greedy.
    fn layout(&mut self) -> Result<&mut Layout> {
        if self.layout.is_none() {
            if self.bucket_bytes == 0 || self.every == 0 {
                return Err(Error::arg(format!(
                    "GradSync: bucket_bytes ({}) and sync_every ({}) must be at least 1",
                    self.bucket_bytes, self.every
                )));
            }
            let mut place = vec![(0, 0); self.lens.len()];
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut filled = 0;
            for i in (0..self.lens.len()).rev() {
                let b = self.lens[i] * 4;
                match groups.last_mut() {
                    Some(g) if filled + b <= self.bucket_bytes => g.push(i),
                    _ => {
                        groups.push(vec![i]);
                        filled = 0;
                    }
                }
                filled += b;
            }
            if let Some(&(k, _)) = self.per_bucket.iter().find(|(k, _)| *k >= groups.len()) {
                return Err(Error::arg(format!(
                    "GradSync: bucket_options names bucket {k}, but there are {} buckets",
                    groups.len()
                )));
            }
            let mut buckets = Vec::with_capacity(groups.len());
            for (k, tensors) in groups.into_iter().enumerate() {
                let opts = self.options_of(k);
                opts.check(k)?;
                let mut at = 0;
                for &i in &tensors {
                    place[i] = (k, at);
                    at += self.lens[i];
                }
                buckets.push(Bucket::new(tensors, at, &opts)?);
            }
            self.layout = Some(Layout {
                place,
                buckets,
                next: 0,
            });
        }
        Ok(self.layout.as_mut().expect("laid out above"))
    }

    fn index(&self, i: usize, what: &str) -> Result<()> {
        if i >= self.names.len() {
            return Err(Error::arg(format!(
                "GradSync::{what}: gradient {i} is not registered ({} are)",
                self.names.len()
            )));
        }
        Ok(())
    }

    /// Gradient `i`, to read. An error while its bucket is in flight.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 3)?;
    /// assert_eq!(gs.grad(i)?, &[0.0; 3]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn grad(&mut self, i: usize) -> Result<&[f32]> {
        self.index(i, "grad")?;
        let len = self.lens[i];
        let (k, at) = self.layout()?.place[i];
        let name = &self.names[i];
        let l = self.layout.as_ref().expect("laid out");
        match &l.buckets[k].data {
            Some(d) => Ok(&d[at..at + len]),
            None => Err(Error::arg(format!(
                "GradSync::grad: gradient '{name}' is being reduced (its bucket is in flight): \
                 read it after wait()"
            ))),
        }
    }

    /// Gradient `i`, to write (fill it, or add to it to accumulate). An
    /// error once it is marked ready this step, until [`wait`](GradSync::wait).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 3)?;
    /// gs.grad_mut(i)?[1] += 2.0;
    /// gs.mark_ready(i)?;
    /// assert!(gs.grad_mut(i).is_err()); // frozen until wait()
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn grad_mut(&mut self, i: usize) -> Result<&mut [f32]> {
        self.index(i, "grad_mut")?;
        let len = self.lens[i];
        let (k, at) = self.layout()?.place[i];
        let name = &self.names[i];
        if self.ready[i] {
            return Err(Error::arg(format!(
                "GradSync::grad_mut: gradient '{name}' was marked ready this step: \
                 it may not change until wait()"
            )));
        }
        let l = self.layout.as_mut().expect("laid out");
        let d = l.buckets[k]
            .data
            .as_mut()
            .expect("a bucket is in flight only once all its gradients are ready");
        Ok(&mut d[at..at + len])
    }

    /// Copies `src` into gradient `i`; `src` must have the registered
    /// length (a gradient cannot be resized after registration).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// gs.set_grad(i, &[1.0, 2.0])?;
    /// assert!(gs.set_grad(i, &[1.0, 2.0, 3.0]).is_err());
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn set_grad(&mut self, i: usize, src: &[f32]) -> Result<()> {
        self.same_len(i, src, "set_grad")?;
        self.grad_mut(i)?.copy_from_slice(src);
        Ok(())
    }

    /// Adds `src` into gradient `i` (accumulation); `src` must have the
    /// registered length.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// gs.accumulate(i, &[1.0, 2.0])?;
    /// gs.accumulate(i, &[1.0, 2.0])?;
    /// assert_eq!(gs.grad(i)?, &[2.0, 4.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn accumulate(&mut self, i: usize, src: &[f32]) -> Result<()> {
        self.same_len(i, src, "accumulate")?;
        for (g, s) in self.grad_mut(i)?.iter_mut().zip(src) {
            *g += s;
        }
        Ok(())
    }

    fn same_len(&self, i: usize, src: &[f32], what: &str) -> Result<()> {
        self.index(i, what)?;
        if src.len() != self.lens[i] {
            return Err(Error::arg(format!(
                "GradSync::{what}: gradient '{}' was registered with {} elements, got {}: \
                 a gradient cannot be resized after registration",
                self.names[i],
                self.lens[i],
                src.len()
            )));
        }
        Ok(())
    }

    /// True if this step communicates (the `sync_every`-th since the last).
    fn syncs(&self) -> bool {
        (self.steps + 1).is_multiple_of(self.every as u64)
    }

    /// Marks gradient `i` final for this step. On a step that
    /// communicates, the AllReduce of its bucket starts now if this was the
    /// bucket's last gradient (and every earlier bucket has started).
    /// Marking a gradient twice in one step is an error.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// gs.mark_ready(i)?;
    /// assert!(gs.mark_ready(i).is_err());
    /// let k = gs.bucket_of(i)?;
    /// assert!(gs.started(k));
    /// # gs.wait()?;
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn mark_ready(&mut self, i: usize) -> Result<()> {
        self.index(i, "mark_ready")?;
        let syncs = self.syncs();
        let (k, _) = self.layout()?.place[i];
        if self.ready[i] {
            return Err(Error::arg(format!(
                "GradSync::mark_ready: gradient '{}' was already marked ready this step: \
                 mark each gradient once per step",
                self.names[i]
            )));
        }
        self.ready[i] = true;
        let comm = self.comm;
        let l = self.layout.as_mut().expect("laid out");
        l.buckets[k].pending -= 1;
        if syncs {
            l.start_ready(comm, false);
        }
        Ok(())
    }

    /// The bucket gradient `i` is in (bucket 0 holds the last registered).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).bucket_bytes(8);
    /// let (a, b) = (gs.register("a", 2)?, gs.register("b", 2)?);
    /// assert_eq!((gs.bucket_of(a)?, gs.bucket_of(b)?), (1, 0));
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn bucket_of(&mut self, i: usize) -> Result<usize> {
        self.index(i, "bucket_of")?;
        Ok(self.layout()?.place[i].0)
    }

    /// The number of buckets (0 before the first use of a gradient).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).bucket_bytes(8);
    /// let a = gs.register("a", 5)?;
    /// gs.bucket_of(a)?; // lays the buckets out
    /// assert_eq!(gs.buckets(), 1);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn buckets(&self) -> usize {
        self.layout.as_ref().map_or(0, |l| l.buckets.len())
    }

    /// True if bucket `k`'s AllReduce has been issued this step (its
    /// [`Work`](crate::Work) exists); false once `wait` has ended the step.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// assert!(!gs.started(0));
    /// gs.mark_ready(i)?;
    /// assert!(gs.started(0));
    /// # gs.wait()?;
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn started(&self, k: usize) -> bool {
        self.bucket(k).is_some_and(|b| b.flight.is_some())
    }

    /// True if bucket `k`'s AllReduce has been issued this step and has
    /// completed (every rank has contributed to it).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// gs.mark_ready(i)?;
    /// while !gs.done(0) {}
    /// # gs.wait()?;
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn done(&self, k: usize) -> bool {
        self.bucket(k)
            .and_then(|b| b.flight.as_ref())
            .is_some_and(|f| f.is_done())
    }

    fn bucket(&self, k: usize) -> Option<&Bucket> {
        self.layout.as_ref().and_then(|l| l.buckets.get(k))
    }

    /// Ends the step. On a step that communicates, waits for every
    /// bucket's AllReduce and leaves the averaged gradients (see
    /// [`GradSync`]), returning `Ok(true)`; on an accumulation step returns
    /// `Ok(false)` at once. Every gradient must have been marked ready:
    /// if not, this rank still issues its remaining buckets (so no peer
    /// waits for it), and every rank's `wait` returns an error; the
    /// step's gradients are then not averaged. Either way the step ends.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// assert!(gs.wait().is_err()); // 'w' was never marked ready
    /// gs.mark_ready(i)?;
    /// assert!(gs.wait()?);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn wait(&mut self) -> Result<bool> {
        let syncs = self.syncs();
        let denom = (self.comm.size() * self.every) as f32;
        let comm = self.comm;
        self.layout()?;
        let missing: Vec<&str> = (0..self.names.len())
            .filter(|&i| !self.ready[i])
            .map(|i| self.names[i].as_str())
            .collect();
        let local = (!missing.is_empty()).then(|| {
            Error::arg(format!(
                "GradSync::wait: gradients not marked ready this step: {}: every registered \
                 gradient must be marked ready once per step before wait()",
                missing.join(", ")
            ))
        });
        self.steps += 1;
        self.ready.iter_mut().for_each(|r| *r = false);
        let l = self.layout.as_mut().expect("laid out");
        if syncs {
            // Issue what is left (all of it if this step is invalid here).
            l.start_ready(comm, local.is_some());
        }
        l.next = 0;
        for b in &mut l.buckets {
            b.pending = b.tensors.len();
        }
        if !syncs {
            return local.map_or(Ok(false), Err);
        }
        let (mut first, mut invalid) = (None, 0f32);
        for b in &mut l.buckets {
            match b.finish() {
                Some(Ok(flag)) => invalid = invalid.max(flag),
                Some(Err(e)) => {
                    first.get_or_insert(e);
                }
                None => {}
            }
        }
        let failed = first.is_some() || local.is_some() || invalid > 0.0;
        for b in &mut l.buckets {
            b.settle(failed);
        }
        if let Some(e) = first {
            return Err(e);
        }
        if let Some(e) = local {
            return Err(e);
        }
        if invalid > 0.0 {
            return Err(Error::arg(format!(
                "GradSync::wait: {invalid} other rank(s) ended this step with gradients not \
                 marked ready; this step's gradients are not averaged"
            )));
        }
        for b in &mut l.buckets {
            let d = b.data.as_mut().expect("waited above");
            let n = d.len() - 1;
            d[..n].iter_mut().for_each(|g| *g /= denom);
        }
        Ok(true)
    }

    /// Sets every gradient to zero (after the optimizer step).
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// # let mut gs = tutti::GradSync::new(&comms[0]);
    /// let i = gs.register("w", 2)?;
    /// gs.grad_mut(i)?[0] = 3.0;
    /// gs.zero_grad()?;
    /// assert_eq!(gs.grad(i)?, &[0.0, 0.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn zero_grad(&mut self) -> Result<()> {
        for (k, b) in self.layout()?.buckets.iter_mut().enumerate() {
            match &mut b.data {
                Some(d) => d.fill(0.0),
                None => {
                    return Err(Error::arg(format!(
                        "GradSync::zero_grad: bucket {k} is in flight: call wait() first"
                    )))
                }
            }
        }
        Ok(())
    }
}

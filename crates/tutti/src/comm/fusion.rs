//! Fusion: [`Communicator::all_reduce_many`] reduces many tensors of mixed
//! sizes as one logical op, packed into buckets of a configurable size
//! (25 MiB by default, as PyTorch DDP), each bucket one AllReduce.
//!
//! Vocabulary: a *tensor* is one of the caller's buffers; a *bucket* is a
//! run of consecutive tensors reduced by one AllReduce. A tensor at least a
//! bucket long, or alone in its bucket, is reduced in place (no copy);
//! smaller ones are packed into a staging buffer, reduced, and copied back.
//! Every rank must pass tensors of the same lengths in the same order (the
//! plan is a pure function of the lengths, so every rank issues the same
//! AllReduces).

use super::{Communicator, Options, Work};
use crate::error::{Error, Result};
use crate::reduce::{Element, ReduceOp};
use std::ops::Range;

/// The default bucket size of [`FusionOptions`]: 25 MiB, as PyTorch DDP.
///
/// ```
/// assert_eq!(tutti::DEFAULT_BUCKET_BYTES, 25 << 20);
/// ```
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Options of [`Communicator::all_reduce_many`]: the bucket size and the
/// options of each bucket's AllReduce.
///
/// ```
/// let opts = tutti::FusionOptions::default().bucket_bytes(1 << 20);
/// assert_eq!(opts.bucket_bytes, 1 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Bytes per bucket (at least 1): tensors are packed until the next
    /// one would overflow the bucket; a tensor at least this long is
    /// reduced alone, in place.
    pub bucket_bytes: usize,
    /// Options of every bucket's AllReduce (algorithm, timeout, a 16-bit
    /// wire for f32 tensors: [`Options::wire`], see
    /// [`wire`](FusionOptions::wire)), in both forms.
    pub call: Options,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            call: Options::default(),
        }
    }
}

impl FusionOptions {
    /// These options with `bytes` per bucket.
    ///
    /// ```
    /// let o = tutti::FusionOptions::default().bucket_bytes(4096);
    /// assert_eq!(o.bucket_bytes, 4096);
    /// ```
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// These options with every bucket's AllReduce on the 16-bit wire
    /// `wire` (bf16 or f16; f32 tensors, Sum or Avg: [`Options::wire`]).
    ///
    /// ```
    /// let o = tutti::FusionOptions::default().wire(tutti::DataType::Bf16);
    /// assert_eq!(o.call.wire, Some(tutti::DataType::Bf16));
    /// ```
    pub fn wire(mut self, wire: crate::reduce::DataType) -> Self {
        self.call.wire = Some(wire);
        self
    }

    fn check(&self) -> Result<()> {
        if self.bucket_bytes == 0 {
            return Err(Error::arg(
                "all_reduce_many: bucket_bytes is 0; a bucket holds at least one byte",
            ));
        }
        Ok(())
    }
}

/// One AllReduce of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// Tensor i, reduced in place.
    Alone(usize),
    /// Tensors in the range, packed (two or more, some possibly empty).
    Packed(Range<usize>),
}

/// The buckets for tensors of `bytes` each, in order: pack consecutive
/// tensors while they fit `bucket_bytes`; a tensor of at least
/// `bucket_bytes` goes alone; a bucket of one tensor is reduced in place;
/// buckets of no bytes are dropped (they would reduce nothing).
pub(crate) fn plan(bytes: &[usize], bucket_bytes: usize) -> Vec<Bucket> {
    let mut out = Vec::new();
    let flush = |out: &mut Vec<Bucket>, r: Range<usize>, filled: usize| {
        if filled == 0 {
            return;
        }
        let nonempty: Vec<usize> = r.clone().filter(|&i| bytes[i] > 0).collect();
        out.push(match nonempty[..] {
            [only] => Bucket::Alone(only),
            _ => Bucket::Packed(r),
        });
    };
    let (mut start, mut filled) = (0, 0);
    for (i, &b) in bytes.iter().enumerate() {
        if b >= bucket_bytes {
            flush(&mut out, start..i, filled);
            out.push(Bucket::Alone(i));
            (start, filled) = (i + 1, 0);
        } else if filled + b > bucket_bytes {
            flush(&mut out, start..i, filled);
            (start, filled) = (i, b);
        } else {
            filled += b;
        }
    }
    flush(&mut out, start..bytes.len(), filled);
    out
}

impl Communicator {
    /// Reduces every tensor of `bufs` across all ranks, in place, as if
    /// each were reduced by its own [`all_reduce`](Communicator::all_reduce),
    /// in far fewer ops: tensors are packed into buckets of
    /// `opts.bucket_bytes` (see [`FusionOptions`]), one AllReduce each.
    /// A tensor at least a bucket long, or alone in its bucket, is reduced
    /// in place; the others go through one staging buffer, reused bucket
    /// after bucket. Every rank passes tensors of the same lengths in the
    /// same order.
    ///
    /// ```
    /// use tutti::{Communicator, FusionOptions, ReduceOp};
    ///
    /// let comms = Communicator::init_all(2)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let (mut a, mut b, mut big) = (vec![1i32; 3], vec![2i32; 5], vec![3i32; 4096]);
    ///             let opts = FusionOptions::default().bucket_bytes(1024);
    ///             c.all_reduce_many(&mut [&mut a, &mut b, &mut big], ReduceOp::Sum, &opts)
    ///                 .unwrap();
    ///             assert_eq!((a[0], b[4], big[4095]), (2, 4, 6));
    ///         });
    ///     }
    /// });
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn all_reduce_many<T: Element>(
        &self,
        bufs: &mut [&mut [T]],
        op: ReduceOp,
        opts: &FusionOptions,
    ) -> Result<()> {
        opts.check()?;
        let bytes: Vec<usize> = bufs.iter().map(|b| std::mem::size_of_val(&**b)).collect();
        let mut staging: Vec<T> = Vec::new();
        for bucket in plan(&bytes, opts.bucket_bytes) {
            match bucket {
                Bucket::Alone(i) => self.all_reduce_with(bufs[i], op, &opts.call)?,
                Bucket::Packed(r) => {
                    staging.clear();
                    for b in &bufs[r.clone()] {
                        staging.extend_from_slice(b);
                    }
                    self.all_reduce_with(&mut staging, op, &opts.call)?;
                    let mut at = 0;
                    for b in &mut bufs[r] {
                        b.copy_from_slice(&staging[at..at + b.len()]);
                        at += b.len();
                    }
                }
            }
        }
        Ok(())
    }

    /// Asynchronous [`all_reduce_many`](Communicator::all_reduce_many) over
    /// owned tensors: every bucket's AllReduce is issued before this
    /// returns; [`ManyWork::wait`] returns the tensors with the results.
    /// Tensors reduced alone travel in their own vector (no copy); each
    /// packed bucket has its own staging vector while in flight.
    ///
    /// ```
    /// use tutti::{Communicator, FusionOptions, ReduceOp};
    ///
    /// let comms = Communicator::init_all(2)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let w = c.all_reduce_many_async(
    ///                 vec![vec![1.0f32; 7], vec![], vec![0.5; 1000]],
    ///                 ReduceOp::Sum,
    ///                 &FusionOptions::default(),
    ///             );
    ///             let out = w.wait().unwrap();
    ///             assert_eq!((out[0][6], out[1].len(), out[2][999]), (2.0, 0, 1.0));
    ///         });
    ///     }
    /// });
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn all_reduce_many_async<T: Element>(
        &self,
        mut bufs: Vec<Vec<T>>,
        op: ReduceOp,
        opts: &FusionOptions,
    ) -> ManyWork<T> {
        if let Err(e) = opts.check() {
            return ManyWork {
                parts: Vec::new(),
                bufs,
                error: Some(e),
            };
        }
        let bytes: Vec<usize> = bufs.iter().map(|b| std::mem::size_of_val(&b[..])).collect();
        let parts = plan(&bytes, opts.bucket_bytes)
            .into_iter()
            .map(|bucket| {
                let work = match &bucket {
                    Bucket::Alone(i) => {
                        self.all_reduce_async_with(std::mem::take(&mut bufs[*i]), op, &opts.call)
                    }
                    Bucket::Packed(r) => {
                        let staging = bufs[r.clone()].concat();
                        self.all_reduce_async_with(staging, op, &opts.call)
                    }
                };
                (bucket, work)
            })
            .collect();
        ManyWork {
            parts,
            bufs,
            error: None,
        }
    }
}

/// The handle of an [`all_reduce_many_async`](Communicator::all_reduce_many_async):
/// one [`Work`] per bucket. Dropping it without waiting blocks until every
/// bucket's op is done, as [`Work`] does.
///
/// ```
/// use tutti::{Communicator, FusionOptions, ReduceOp};
///
/// let comms = Communicator::init_all(1)?;
/// let w = comms[0].all_reduce_many_async(vec![vec![3u8; 2]], ReduceOp::Sum, &FusionOptions::default());
/// assert_eq!(w.buckets(), 1);
/// assert_eq!(w.wait()?, vec![vec![3u8; 2]]);
/// # Ok::<(), tutti::Error>(())
/// ```
#[must_use = "an op's results are only available through wait()"]
#[derive(Debug)]
pub struct ManyWork<T> {
    parts: Vec<(Bucket, Work<Vec<T>>)>,
    /// The caller's tensors; those reduced alone are empty until `wait`.
    bufs: Vec<Vec<T>>,
    /// An error found before anything was issued.
    error: Option<Error>,
}

impl<T: Element> ManyWork<T> {
    /// The number of AllReduces (buckets) issued.
    ///
    /// ```
    /// # use tutti::{Communicator, FusionOptions, ReduceOp};
    /// # let comms = Communicator::init_all(1)?;
    /// let w = comms[0].all_reduce_many_async(vec![Vec::<f32>::new()], ReduceOp::Sum, &FusionOptions::default());
    /// assert_eq!(w.buckets(), 0); // nothing to reduce
    /// # w.wait()?;
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn buckets(&self) -> usize {
        self.parts.len()
    }

    /// True once every bucket's op has completed (successfully or not).
    ///
    /// ```
    /// # use tutti::{Communicator, FusionOptions, ReduceOp};
    /// # let comms = Communicator::init_all(1)?;
    /// let w = comms[0].all_reduce_many_async(vec![vec![1i64]], ReduceOp::Sum, &FusionOptions::default());
    /// while !w.is_done() {}
    /// # w.wait()?;
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn is_done(&self) -> bool {
        self.parts.iter().all(|(_, w)| w.is_done())
    }

    /// Waits for every bucket and returns the tensors with the results, or
    /// the first error (after every bucket's op has ended).
    ///
    /// ```
    /// # use tutti::{Communicator, FusionOptions, ReduceOp};
    /// # let comms = Communicator::init_all(1)?;
    /// let w = comms[0].all_reduce_many_async(vec![vec![1i64], vec![2]], ReduceOp::Sum, &FusionOptions::default());
    /// assert_eq!(w.wait()?, vec![vec![1], vec![2]]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn wait(mut self) -> Result<Vec<Vec<T>>> {
        let mut first = self.error.take();
        for (bucket, work) in std::mem::take(&mut self.parts) {
            match (work.wait(), bucket) {
                (Ok(v), Bucket::Alone(i)) => self.bufs[i] = v,
                (Ok(v), Bucket::Packed(r)) => {
                    let mut at = 0;
                    for b in &mut self.bufs[r] {
                        let n = b.len();
                        b.copy_from_slice(&v[at..at + n]);
                        at += n;
                    }
                }
                (Err(e), _) => {
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.bufs)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{plan, Bucket::*};

    #[test]
    fn packs_in_order_and_puts_large_tensors_alone() {
        assert_eq!(plan(&[], 10), vec![]);
        assert_eq!(plan(&[0, 0], 10), vec![]);
        assert_eq!(plan(&[4, 4, 4], 10), vec![Packed(0..2), Alone(2)]);
        assert_eq!(
            plan(&[4, 0, 4, 12, 3], 10),
            vec![Packed(0..3), Alone(3), Alone(4)]
        );
        // A packed bucket with one non-empty tensor is reduced in place.
        assert_eq!(plan(&[0, 5, 0], 10), vec![Alone(1)]);
        assert_eq!(
            plan(&[10, 9, 1, 1], 10),
            vec![Alone(0), Packed(1..3), Alone(3)]
        );
    }
}

//! The direct algorithm over mailboxes: what each rank publishes and reads
//! for each collective when every rank shares one segment.
//!
//! The result is the direct schedule's, bit for bit: reductions run in rank
//! order 0, 1, ..., n-1 on every rank, with this rank's own part read from
//! its own slot or input. Only the transport differs: one write into this
//! rank's slot replaces n-1 ring messages, and readers reduce or copy
//! straight out of the writers' slots ([`crate::transport::mailbox`]).
//! What the direct schedule's frame does ([`crate::algo::frame`]) happens
//! here too: the copy of an AllGather's block or a Broadcast root's data
//! into the output, and an Avg's division, over the range of the frame's
//! own [`frame::mean`] step.
//!
//! That claim is checked, not trusted: the body ([`one_shot`]) is written
//! once over a [`Medium`], what it does to memory. Over the mailboxes
//! ([`Live`]) each operation is the mailbox call or kernel it forwards to,
//! inlined (the code is what it would be written out by hand); in the
//! tests (`oneshot/tests.rs`) a symbolic medium runs the very same body on
//! the verifier's symbols, and every rank's output must equal, symbol and
//! reduction order, what the verifier finds the direct schedule leaves
//! there, for every collective the mailboxes carry on 2 to 8 ranks.

use super::{Core, OpCall};
use crate::algo::{frame, Buf, Collective, Step};
use crate::error::Result;
use crate::reduce::{self, ReduceOp};
use crate::sizes::contribution;
use crate::transport::mailbox::{self, Waiting, MBOX_BYTES};
use std::sync::atomic::AtomicBool;

/// Bytes of its next slot a scatter's root claims ahead
/// ([`Mailbox::prefetch_own_next`](mailbox::Mailbox::prefetch_own_next)):
/// the lines every writer claimed before it could claim whole slots.
const SCATTER_CLAIM: usize = mailbox::PREFETCH_PAYLOAD;

/// What the one-shot body ([`one_shot`]) does to memory: over the
/// mailboxes ([`Live`]), or symbolically in the tests.
///
/// # Safety
/// Every pointer argument is valid for `len` bytes (a block, for
/// [`reduce`](Medium::reduce)); a returned payload holds what its rank
/// published.
trait Medium {
    /// `(ranks, this rank)`.
    fn ranks(&self) -> (usize, usize);
    /// Publishes `len` bytes at `src` as this rank's contribution.
    unsafe fn publish(&mut self, src: *const u8, len: usize) -> Result<()>;
    /// This rank's own published contribution.
    fn own(&self) -> *const u8;
    /// Rank `q`'s contribution, once it has published it.
    fn receive(&mut self, q: usize) -> Result<*const u8>;
    /// `acc = a (op) b` over `len` bytes.
    unsafe fn reduce(&mut self, acc: *mut u8, a: *const u8, b: *const u8, len: usize);
    /// Copies `len` bytes; the ranges do not overlap.
    unsafe fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize);
    /// Copies `len` bytes; the ranges may overlap (or be one).
    unsafe fn copy_overlapping(&mut self, src: *const u8, dst: *mut u8, len: usize);
    /// A hint: this rank's next contribution is `len` bytes.
    fn prefetch_own_next(&self, len: usize);
    /// A hint: this rank will next read `len` bytes at `off` of `q`'s contribution.
    fn prefetch_peer_next(&self, q: usize, off: usize, len: usize);
}

/// The mailboxes as a [`Medium`]: op number `s`, reduction kernel `k`.
struct Live<'a, 'w> {
    mb: &'a mut mailbox::Mailbox,
    w: &'a mut Waiting<'w>,
    s: u64,
    k: reduce::Kernel,
}

impl Medium for Live<'_, '_> {
    #[inline(always)]
    fn ranks(&self) -> (usize, usize) {
        self.mb.ranks()
    }
    #[inline(always)]
    unsafe fn publish(&mut self, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { self.mb.publish(self.s, src, len, self.w) }
    }
    #[inline(always)]
    fn own(&self) -> *const u8 {
        self.mb.payload(self.mb.ranks().1, self.s)
    }
    #[inline(always)]
    fn receive(&mut self, q: usize) -> Result<*const u8> {
        self.mb.receive(q, self.s, self.w)
    }
    #[inline(always)]
    unsafe fn reduce(&mut self, acc: *mut u8, a: *const u8, b: *const u8, len: usize) {
        // SAFETY: forwarded from the trait's contract; `k` is a kernel the
        // running CPU can run (`reduce::kernel`).
        unsafe { (self.k)(acc, a, b, len) }
    }
    #[inline(always)]
    unsafe fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: forwarded from the trait's contract.
        unsafe { crate::reduce::copy::copy(src, dst, len) }
    }
    #[inline(always)]
    unsafe fn copy_overlapping(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: forwarded from the trait's contract.
        unsafe { crate::reduce::copy::copy_overlapping(src, dst, len) }
    }
    #[inline(always)]
    fn prefetch_own_next(&self, len: usize) {
        self.mb.prefetch_own_next(len);
    }
    #[inline(always)]
    fn prefetch_peer_next(&self, q: usize, off: usize, len: usize) {
        self.mb.prefetch_peer_next(q, off, len);
    }
}

/// `acc = x_0 op x_1 op ... op x_{n-1}` over one block of `b` bytes: this
/// rank's x at `own`, a peer's at offset `off` of its contribution
/// (waited for in rank order).
///
/// # Safety
/// `acc` and `own` valid for `b` bytes, `off + b` within a contribution.
#[inline(always)]
unsafe fn all_reduced<M: Medium>(
    m: &mut M,
    acc: *mut u8,
    own: *const u8,
    off: usize,
    b: usize,
) -> Result<()> {
    let (n, me) = m.ranks();
    // SAFETY: as this function's contract says.
    unsafe {
        let mut first = if me == 0 { own } else { m.receive(0)?.add(off) };
        for q in 1..n {
            let x = if q == me { own } else { m.receive(q)?.add(off) };
            m.reduce(acc, first, x, b);
            first = acc;
        }
    }
    Ok(())
}

/// True if `coll` with `bytes` per block fits a mailbox on `n` ranks.
pub(crate) fn fits(coll: Collective, n: usize, bytes: usize) -> bool {
    contribution(coll, n, bytes).is_some_and(|b| b <= MBOX_BYTES)
}

impl Core {
    /// Runs `c` through the mailboxes (the caller checked [`fits`]),
    /// writing this rank's slot with non-temporal stores where `stream`.
    pub(super) fn run_oneshot(
        &mut self,
        c: &OpCall,
        seq: u64,
        tag: u16,
        coll_seq: u32,
        stream: bool,
        abort: &AtomicBool,
    ) -> Result<()> {
        let spin = if c.background {
            (self.spin.0.min(std::time::Duration::from_micros(20)), true)
        } else {
            self.spin
        };
        let mut w = Waiting {
            abort,
            timeout: c.timeout.unwrap_or(self.config.timeout),
            spin,
            peer_pids: &self.peer_pids,
            links: &self.links,
            op_name: c.coll.kind().name(),
            op_seq: seq,
            coll_seq,
            deadline: None,
        };
        let mb = self.mailbox.as_mut().expect("caller checked");
        let r = mb
            .check_stale(&w)
            .and_then(|()| Self::oneshot_steps(mb, c, tag, stream, &mut w));
        // Whatever happened, no peer may stay asleep on what we published.
        mb.flush();
        r?;
        if c.op == ReduceOp::Avg {
            Self::oneshot_mean(c, self.nranks, self.rank);
        }
        Ok(())
    }

    /// The range of the output an Avg's division covers, in bytes, and
    /// its divisor: the frame's last step ([`frame::mean`]) for `c` as rank
    /// `me` of `n`, where it has one.
    fn mean_range(c: &OpCall, n: usize, me: usize) -> Option<(usize, usize, usize)> {
        if c.op != ReduceOp::Avg {
            return None;
        }
        match frame::mean(c.coll, n, me, c.count)? {
            Step::Scale { dst, len, divisor } if dst.buf == Buf::Output => {
                let esz = c.dtype.size();
                Some((dst.off * esz, len * esz, divisor))
            }
            other => unreachable!("an Avg ends with a division of the output, not {other:?}"),
        }
    }

    /// Ends an Avg reduction as its schedule would ([`Core::mean_range`]),
    /// on the output (which no peer reads: mailboxes publish inputs).
    fn oneshot_mean(c: &OpCall, n: usize, me: usize) {
        if let Some((off, len, divisor)) = Self::mean_range(c, n, me) {
            assert!(off + len <= c.output_len, "the division fits the output");
            // SAFETY: the range lies in the output (just checked), which
            // the caller keeps for this op alone while it runs.
            let out = unsafe { std::slice::from_raw_parts_mut(c.output.add(off), len) };
            reduce::scale_avg(c.dtype, out, divisor);
        }
    }

    /// The body of [`run_oneshot`](Core::run_oneshot), over the mailboxes.
    fn oneshot_steps(
        mb: &mut mailbox::Mailbox,
        c: &OpCall,
        tag: u16,
        stream: bool,
        w: &mut Waiting<'_>,
    ) -> Result<()> {
        let s = mb.begin(mailbox::meta(tag, c.count), stream);
        let k = reduce::kernel(c.dtype, c.op.step_op());
        let mut m = Live { mb, w, s, k };
        // The buffers were checked against the collective (see `one_shot`);
        // slots hold MBOX_BYTES >= the contribution (`fits`).
        // SAFETY: as above, and a peer's slot is not rewritten before this
        // rank starts its next op (the mailbox reuse rule).
        unsafe { one_shot(&mut m, c) }
    }
}

/// What rank `me` of `n` publishes, reads, reduces and copies for `c`, on
/// medium `m` (see the module docs).
///
/// # Safety
/// `c`'s buffers hold what the comm layer checks for its collective, as
/// described inside; `m`'s contributions hold what their ranks published.
#[inline(always)]
unsafe fn one_shot<M: Medium>(m: &mut M, c: &OpCall) -> Result<()> {
    let (n, me) = m.ranks();
    let b = c.count * c.dtype.size();
    let (input, output) = (c.input as *const u8, c.output);
    // For the whole body: the comm layer checked every buffer length
    // against the collective (input n*b for the all-to-all shapes, b
    // otherwise; output likewise), so each offset below stays in its
    // buffer; contributions hold what their ranks published (`Medium`),
    // and input and output do not overlap
    // except for an in-place AllReduce, which reads its own part where
    // it is still intact: from the buffer on ranks 0 and 1 (each element
    // is read before its sum is written there), else from its slot; a
    // Broadcast root's input that is its output (in place: input_len is
    // 0, output_len b); and an AllGather's input anywhere in its output
    // (the comm layer allows it), read whole (published, then copied
    // with `copy_overlapping`) before anything is written to the output.
    // SAFETY: buffers and contributions as just described.
    unsafe {
        match c.coll {
            Collective::AllReduce => {
                m.publish(input, b)?;
                // Its own part from its input, which stays in this
                // core's cache (its slot's lines are busy: every peer
                // reads them now), unless the partial sums overwrite
                // the input first: in place, on ranks 2 and up (the
                // first step writes x0 + x1 over it). Then from its slot.
                let own = if !c.in_place || me <= 1 {
                    input
                } else {
                    m.own()
                };
                all_reduced(m, output, own, 0, b)?;
            }
            Collective::ReduceScatter => {
                m.publish(input, n * b)?;
                all_reduced(m, output, input.add(me * b), me * b, b)?;
            }
            Collective::Reduce { root } => {
                if me == root {
                    m.publish(input, 0)?;
                    all_reduced(m, output, input, 0, b)?;
                    for q in (0..n).filter(|&q| q != me) {
                        m.prefetch_peer_next(q, 0, b);
                    }
                } else {
                    m.publish(input, b)?;
                    m.prefetch_own_next(b);
                }
            }
            Collective::Broadcast { root } => {
                // The root's data is in its input (its output, in
                // place): published from there, and copied to its
                // output out of place, as the schedule's first step.
                if me == root {
                    m.publish(input, b)?;
                    if !std::ptr::eq(input, output) {
                        m.copy_overlapping(input, output, b);
                    }
                    m.prefetch_own_next(b);
                } else {
                    m.publish(input, 0)?;
                    let p = m.receive(root)?;
                    m.copy(p, output, b);
                    m.prefetch_peer_next(root, 0, b);
                }
            }
            Collective::AllGather => {
                // This rank's block, published from its input and
                // copied to its place in the output (where it is not
                // there already), as the schedule's first step.
                m.publish(input, b)?;
                if !std::ptr::eq(input, output.add(me * b)) {
                    m.copy_overlapping(input, output.add(me * b), b);
                }
                for k in 1..n {
                    let q = (me + k) % n;
                    let p = m.receive(q)?;
                    m.copy(p, output.add(q * b), b);
                }
            }
            Collective::AllToAll => {
                m.publish(input, n * b)?;
                m.copy(input.add(me * b), output.add(me * b), b);
                for k in 1..n {
                    let q = (me + k) % n;
                    let p = m.receive(q)?;
                    m.copy(p.add(me * b), output.add(q * b), b);
                }
            }
            Collective::Gather { root } => {
                if me == root {
                    m.publish(input, 0)?;
                    m.copy(input, output.add(me * b), b);
                    for k in 1..n {
                        let q = (me + k) % n;
                        let p = m.receive(q)?;
                        m.copy(p, output.add(q * b), b);
                    }
                    for q in (0..n).filter(|&q| q != me) {
                        m.prefetch_peer_next(q, 0, b);
                    }
                } else {
                    m.publish(input, b)?;
                    m.prefetch_own_next(b);
                }
            }
            Collective::Scatter { root } => {
                if me == root {
                    m.publish(input, n * b)?;
                    m.copy(input.add(me * b), output, b);
                    // Only the slot's first 2 KiB: claiming all of it (as a
                    // broadcast root does) measured 1.21-1.25x slower at
                    // 4 KiB blocks and 0.99-1.34x at 8 KiB (2 ranks, 5-7
                    // rounds, three sittings).
                    m.prefetch_own_next((n * b).min(SCATTER_CLAIM));
                } else {
                    m.publish(input, 0)?;
                    let p = m.receive(root)?;
                    m.copy(p.add(me * b), output, b);
                    m.prefetch_peer_next(root, me * b, b);
                }
            }
            Collective::Barrier => {
                m.publish(input, 0)?;
                for k in 1..n {
                    m.receive((me + k) % n)?;
                }
            }
            Collective::AllToAllV | Collective::Send { .. } | Collective::Recv { .. } => {
                unreachable!("`fits` rejects {:?}", c.coll)
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

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
//! into the output, and an Avg's division, run as the frame's own
//! [`frame::mean`] step.

use super::{Core, OpCall};
use crate::algo::{frame, Buf, Collective, Step};
use crate::error::Result;
use crate::reduce::{self, ReduceOp};
use crate::transport::mailbox::{self, Waiting, MBOX_BYTES};
use std::sync::atomic::AtomicBool;

/// Bytes a rank contributes to `coll` with `bytes` per block on `n` ranks
/// (what its slot must hold), or `None` for calls mailboxes do not carry.
pub(crate) fn contribution(coll: Collective, n: usize, bytes: usize) -> Option<usize> {
    match coll {
        Collective::AllReduce
        | Collective::Reduce { .. }
        | Collective::Broadcast { .. }
        | Collective::AllGather
        | Collective::Gather { .. } => Some(bytes),
        Collective::ReduceScatter | Collective::AllToAll | Collective::Scatter { .. } => {
            bytes.checked_mul(n)
        }
        Collective::Barrier => Some(0),
        Collective::AllToAllV | Collective::Send { .. } | Collective::Recv { .. } => None,
    }
}

/// What a reducing mailbox op combines: kernel, op number, block bytes.
struct Reduction {
    k: reduce::Kernel,
    s: u64,
    b: usize,
}

impl Reduction {
    /// `acc = x_0 op x_1 op ... op x_{n-1}` over one block: this rank's x
    /// at `own`, a peer's at offset `off` of its payload (waited for in
    /// rank order).
    ///
    /// # Safety
    /// `acc` and `own` valid for the block's bytes, `off` + bytes within a
    /// payload, `k` runnable here (see `oneshot_steps`).
    #[inline(always)]
    unsafe fn all(
        &self,
        mb: &mut mailbox::Mailbox,
        w: &mut Waiting<'_>,
        acc: *mut u8,
        own: *const u8,
        off: usize,
    ) -> Result<()> {
        let (n, me) = mb.ranks();
        let (k, s, b) = (self.k, self.s, self.b);
        // SAFETY: as this function's contract says.
        unsafe {
            let mut first = if me == 0 {
                own
            } else {
                mb.receive(0, s, w)?.add(off)
            };
            for q in 1..n {
                let x = if q == me {
                    own
                } else {
                    mb.receive(q, s, w)?.add(off)
                };
                k(acc, first, x, b);
                first = acc;
            }
        }
        Ok(())
    }
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

    /// Ends an Avg reduction as its schedule would: with the frame's last
    /// step ([`frame::mean`]), the division of this rank's result by the
    /// rank count, on the output (which no peer reads: mailboxes publish
    /// inputs).
    fn oneshot_mean(c: &OpCall, n: usize, me: usize) {
        if let Some(Step::Scale { dst, len, divisor }) = frame::mean(c.coll, n, me, c.count) {
            debug_assert_eq!(dst.buf, Buf::Output);
            let esz = c.dtype.size();
            assert!(
                (dst.off + len) * esz <= c.output_len,
                "the step fits the output"
            );
            // SAFETY: the range lies in the output (just checked), which
            // the caller keeps for this op alone while it runs.
            let out =
                unsafe { std::slice::from_raw_parts_mut(c.output.add(dst.off * esz), len * esz) };
            reduce::scale_avg(c.dtype, out, divisor);
        }
    }

    /// The body of [`run_oneshot`](Core::run_oneshot).
    fn oneshot_steps(
        mb: &mut mailbox::Mailbox,
        c: &OpCall,
        tag: u16,
        stream: bool,
        w: &mut Waiting<'_>,
    ) -> Result<()> {
        let (n, me) = mb.ranks();
        let b = c.count * c.dtype.size();
        let s = mb.begin(mailbox::meta(tag, c.count), stream);
        let k = reduce::kernel(c.dtype, c.op.step_op());
        let (input, output) = (c.input as *const u8, c.output);
        // For the whole block below: `k` is a kernel the running CPU can run
        // (`reduce::kernel`); the comm layer checked every buffer length
        // against the collective (input n*b for the all-to-all shapes, b
        // otherwise; output likewise), so each offset below stays in its
        // buffer; slots hold MBOX_BYTES >= the contribution (`fits`); a
        // peer's slot is not rewritten before this rank starts its next op
        // (the mailbox reuse rule), and input and output do not overlap
        // except for an in-place AllReduce, which reads its own part where
        // it is still intact: from the buffer on ranks 0 and 1 (each element
        // is read before its sum is written there), else from its slot; a
        // Broadcast root's input that is its output (in place: input_len is
        // 0, output_len b); and an AllGather's input anywhere in its output
        // (the comm layer allows it), read whole (published, then copied
        // with `copy_overlapping`) before anything is written to the output.
        // SAFETY: buffers, slots and kernel as just described.
        unsafe {
            let red = Reduction { k, s, b };
            match c.coll {
                Collective::AllReduce => {
                    mb.publish(s, input, b, w)?;
                    // Its own part from its input, which stays in this
                    // core's cache (its slot's lines are busy: every peer
                    // reads them now), unless the partial sums overwrite
                    // the input first: in place, on ranks 2 and up (the
                    // first step writes x0 + x1 over it). Then from its slot.
                    let own = if !c.in_place || me <= 1 {
                        input
                    } else {
                        mb.payload(me, s)
                    };
                    red.all(mb, w, output, own, 0)?;
                }
                Collective::ReduceScatter => {
                    mb.publish(s, input, n * b, w)?;
                    red.all(mb, w, output, input.add(me * b), me * b)?;
                }
                Collective::Reduce { root } => {
                    if me == root {
                        mb.publish(s, input, 0, w)?;
                        red.all(mb, w, output, input, 0)?;
                        for q in (0..n).filter(|&q| q != me) {
                            mb.prefetch_peer_next(q, 0, b);
                        }
                    } else {
                        mb.publish(s, input, b, w)?;
                        mb.prefetch_own_next(b);
                    }
                }
                Collective::Broadcast { root } => {
                    // The root's data is in its input (its output, in
                    // place): published from there, and copied to its
                    // output out of place, as the schedule's first step.
                    if me == root {
                        mb.publish(s, input, b, w)?;
                        if !std::ptr::eq(input, output) {
                            crate::reduce::copy::copy_overlapping(input, output, b);
                        }
                        mb.prefetch_own_next(b);
                    } else {
                        mb.publish(s, input, 0, w)?;
                        let p = mb.receive(root, s, w)?;
                        crate::reduce::copy::copy(p, output, b);
                        mb.prefetch_peer_next(root, 0, b);
                    }
                }
                Collective::AllGather => {
                    // This rank's block, published from its input and
                    // copied to its place in the output (where it is not
                    // there already), as the schedule's first step.
                    mb.publish(s, input, b, w)?;
                    if !std::ptr::eq(input, output.add(me * b)) {
                        crate::reduce::copy::copy_overlapping(input, output.add(me * b), b);
                    }
                    for k in 1..n {
                        let q = (me + k) % n;
                        let p = mb.receive(q, s, w)?;
                        crate::reduce::copy::copy(p, output.add(q * b), b);
                    }
                }
                Collective::AllToAll => {
                    mb.publish(s, input, n * b, w)?;
                    crate::reduce::copy::copy(input.add(me * b), output.add(me * b), b);
                    for k in 1..n {
                        let q = (me + k) % n;
                        let p = mb.receive(q, s, w)?;
                        crate::reduce::copy::copy(p.add(me * b), output.add(q * b), b);
                    }
                }
                Collective::Gather { root } => {
                    if me == root {
                        mb.publish(s, input, 0, w)?;
                        crate::reduce::copy::copy(input, output.add(me * b), b);
                        for k in 1..n {
                            let q = (me + k) % n;
                            let p = mb.receive(q, s, w)?;
                            crate::reduce::copy::copy(p, output.add(q * b), b);
                        }
                        for q in (0..n).filter(|&q| q != me) {
                            mb.prefetch_peer_next(q, 0, b);
                        }
                    } else {
                        mb.publish(s, input, b, w)?;
                        mb.prefetch_own_next(b);
                    }
                }
                Collective::Scatter { root } => {
                    if me == root {
                        mb.publish(s, input, n * b, w)?;
                        crate::reduce::copy::copy(input.add(me * b), output, b);
                        mb.prefetch_own_next(n * b);
                    } else {
                        mb.publish(s, input, 0, w)?;
                        let p = mb.receive(root, s, w)?;
                        crate::reduce::copy::copy(p.add(me * b), output, b);
                        mb.prefetch_peer_next(root, me * b, b);
                    }
                }
                Collective::Barrier => {
                    mb.publish(s, input, 0, w)?;
                    for k in 1..n {
                        mb.receive((me + k) % n, s, w)?;
                    }
                }
                Collective::AllToAllV | Collective::Send { .. } | Collective::Recv { .. } => {
                    unreachable!("`fits` rejects {:?}", c.coll)
                }
            }
        }
        Ok(())
    }
}

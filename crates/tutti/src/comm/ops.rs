//! The collectives: a typed API over slices, asynchronous variants over owned
//! vectors, and an untyped one ([`RawCall`]) for the C and Python bindings.
//! All of them end in one place, [`Communicator::check`], which validates
//! lengths, roots and peers before anything is sent.

use super::{Communicator, Options, Work};
use crate::algo::{verify::buffer_sizes, Collective, Problem, VCounts};
use crate::engine::{Completion, OpCall};
use crate::error::{Error, Result};
use crate::reduce::{DataType, Element, ReduceOp};
use std::sync::Arc;

/// An untyped collective call: buffers as raw bytes plus a [`DataType`].
///
/// Buffer sizes follow the table on [`Problem`]: e.g. AllGather's `recv`
/// holds `size * count` elements. A root-only buffer may be null/empty on
/// other ranks. Broadcast sends the root's `recv`; the root may instead pass
/// its data in a separate `send` of `count` elements (copied into `recv`
/// first, as NCCL's out-of-place broadcast); a null or empty `send` means
/// the data is in `recv`. Other ranks' `send` is ignored.
#[derive(Clone, Debug)]
pub struct RawCall {
    /// Which collective (with its root or peer).
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Element count, per the conventions of [`Problem`].
    pub count: usize,
    /// Send buffer.
    pub send: *const u8,
    /// Send buffer length in bytes.
    pub send_len: usize,
    /// Receive buffer.
    pub recv: *mut u8,
    /// Receive buffer length in bytes.
    pub recv_len: usize,
    /// AllToAllV counts and displacements (elements).
    pub vcounts: Option<VCounts>,
}

// SAFETY: RawCall only carries addresses; the unsafe entry points that use
// it state the caller's obligations.
unsafe impl Send for RawCall {}

/// Where the engine reads a call's input: `send`, except for a Broadcast
/// without a separate send buffer (null, empty, or `recv` itself), whose
/// root's data is already in `recv`.
pub(crate) fn input_of(c: &RawCall) -> *mut u8 {
    let separate = !c.send.is_null() && c.send_len > 0;
    if matches!(c.coll, Collective::Broadcast { .. }) && !separate {
        c.recv
    } else {
        c.send as *mut u8
    }
}

fn ptr<T>(s: &[T]) -> *const u8 {
    s.as_ptr() as *const u8
}

fn mptr<T>(s: &mut [T]) -> *mut u8 {
    s.as_mut_ptr() as *mut u8
}

/// A call whose send and receive buffer are one slice (in place).
fn in_place<T: Element>(coll: Collective, op: ReduceOp, buf: &mut [T]) -> RawCall {
    let p = mptr(buf);
    RawCall {
        coll,
        dtype: T::DTYPE,
        op,
        count: buf.len(),
        send: p,
        send_len: std::mem::size_of_val(buf),
        recv: p,
        recv_len: std::mem::size_of_val(buf),
        vcounts: None,
    }
}

fn call<T: Element>(
    coll: Collective,
    op: ReduceOp,
    count: usize,
    send: &[T],
    recv: &mut [T],
) -> RawCall {
    RawCall {
        coll,
        dtype: T::DTYPE,
        op,
        count,
        send: ptr(send),
        send_len: std::mem::size_of_val(send),
        recv: mptr(recv),
        recv_len: std::mem::size_of_val(recv),
        vcounts: None,
    }
}

impl Communicator {
    /// Validates `c` and turns it into an engine call.
    fn check(&self, c: &RawCall, opts: &Options) -> Result<OpCall> {
        let (n, r) = (self.size(), self.rank());
        let name = c.coll.kind().name();
        if let Some(root) = c.coll.root() {
            if root >= n {
                return Err(Error::arg(format!(
                    "{name}: root {root} is out of range; this communicator has ranks 0..{n}"
                )));
            }
        }
        if let Collective::Send { peer } | Collective::Recv { peer } = c.coll {
            if peer >= n || peer == r {
                return Err(Error::arg(format!(
                    "{name}: peer {peer} is invalid on rank {r}; it must be another rank in 0..{n}"
                )));
            }
        }
        let esz = c.dtype.size();
        if c.count
            .checked_mul(esz)
            .and_then(|b| b.checked_mul(n))
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::arg(format!(
                "{name}: count {} overflows the addressable size",
                c.count
            )));
        }
        if let Some(v) = &c.vcounts {
            for (what, xs) in [
                ("send_counts", &v.send_counts),
                ("send_displs", &v.send_displs),
                ("recv_counts", &v.recv_counts),
                ("recv_displs", &v.recv_displs),
            ] {
                if xs.len() != n {
                    return Err(Error::arg(format!(
                        "{name}: {what} has {} entries; it needs one per rank ({n})",
                        xs.len()
                    )));
                }
            }
            // End of every block in bytes, without overflow: the buffer
            // sizes below and the executor's offsets multiply by the element
            // size (with wrapping arithmetic in a release build, a huge
            // displacement would otherwise point before the buffer).
            let end_ok = |count: usize, displ: usize| {
                count
                    .checked_add(displ)
                    .and_then(|e| e.checked_mul(esz))
                    .is_some_and(|b| b <= isize::MAX as usize)
            };
            for q in 0..n {
                if !end_ok(v.send_counts[q], v.send_displs[q])
                    || !end_ok(v.recv_counts[q], v.recv_displs[q])
                {
                    return Err(Error::arg(format!(
                        "{name}: counts/displacements of rank {q} overflow the addressable size"
                    )));
                }
            }
            if v.send_counts[r] != v.recv_counts[r] {
                return Err(Error::arg(format!(
                    "{name}: rank {r} sends itself {} elements (send_counts[{r}]) but expects {} \
                     (recv_counts[{r}]); they must be equal",
                    v.send_counts[r], v.recv_counts[r]
                )));
            }
        } else if c.coll == Collective::AllToAllV {
            return Err(Error::arg("all_to_all_v needs counts and displacements"));
        }
        let p = Problem {
            coll: c.coll,
            nranks: n,
            rank: r,
            count: c.count,
            in_place: false,
            avg: false,
            vcounts: c.vcounts.clone(),
            chunks: 1,
            hosts: None,
        };
        let (mut ie, oe) = buffer_sizes(&p);
        // Broadcast sends the root's `recv`. A root may pass its data in a
        // separate `send` instead (as NCCL's out-of-place broadcast does):
        // the schedule copies it into `recv` first, so it is an input of the
        // whole message. A null or empty `send` means the data is in `recv`.
        let bcast_send =
            matches!(c.coll, Collective::Broadcast { root } if root == r) && input_of(c) != c.recv;
        if bcast_send {
            ie = c.count;
        }
        let (ib, ob) = (ie * esz, oe * esz);
        let input_needed = bcast_send
            || !matches!(
                c.coll,
                Collective::Broadcast { .. } | Collective::Recv { .. } | Collective::Barrier
            );
        let rooted_out = matches!(
            c.coll,
            Collective::Reduce { .. } | Collective::Gather { .. }
        );
        let rooted_in = matches!(c.coll, Collective::Scatter { .. });
        let in_len_ok = if c.coll == Collective::AllToAllV {
            c.send_len >= ib
        } else {
            c.send_len == ib
        };
        let out_len_ok = if c.coll == Collective::AllToAllV {
            c.recv_len >= ob
        } else {
            c.recv_len == ob
        };
        if input_needed && !(rooted_in && ib == 0) && !in_len_ok {
            return Err(Error::arg(format!(
                "{name} on rank {r}: the send buffer has {} bytes but {} elements of {} ({} bytes) are needed{}",
                c.send_len,
                ie,
                c.dtype,
                ib,
                hint(c.coll, n)
            )));
        }
        let out_unused = c.coll == Collective::Barrier
            || matches!(c.coll, Collective::Send { .. })
            || (rooted_out && ob == 0);
        if !out_unused && !out_len_ok {
            return Err(Error::arg(format!(
                "{name} on rank {r}: the receive buffer has {} bytes but {} elements of {} ({} bytes) are needed{}",
                c.recv_len,
                oe,
                c.dtype,
                ob,
                hint(c.coll, n)
            )));
        }
        let in_place = c.coll == Collective::AllReduce && std::ptr::eq(c.send, c.recv);
        if !in_place && ib > 0 && ob > 0 && c.coll != Collective::AllGather {
            let (s, e) = (c.send as usize, c.send as usize + ib);
            let (rs, re) = (c.recv as usize, c.recv as usize + ob);
            if s < re && rs < e {
                return Err(Error::arg(format!(
                    "{name}: the send and receive buffers overlap; use separate buffers"
                )));
            }
        }
        Ok(OpCall {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            vcounts: c.vcounts.clone(),
            in_place,
            input: input_of(c),
            input_len: if input_needed { ib } else { 0 },
            output: c.recv,
            output_len: ob,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            background: false,
        })
    }

    /// Runs an untyped call to completion.
    ///
    /// # Safety
    /// `send` must be valid for reads of `send_len` bytes and `recv` for
    /// writes of `recv_len` bytes, and neither may be accessed by anything
    /// else until this returns.
    pub unsafe fn run_raw(&self, c: &RawCall, opts: &Options) -> Result<()> {
        if let Some(p) = p2p_of(c) {
            // SAFETY: the caller's promise covers the buffer for this call.
            let (w, _) = unsafe { self.post_p2p_raw(&[p?], opts.timeout) }
                .pop()
                .expect("one op");
            return w.wait();
        }
        self.engine.run_raw(c, opts, || self.check(c, opts))
    }

    /// Issues an untyped call asynchronously.
    ///
    /// # Safety
    /// As for [`run_raw`](Communicator::run_raw), and the buffers must stay
    /// valid and untouched until the returned [`Work`] reports completion.
    pub unsafe fn submit_raw(&self, c: &RawCall, opts: &Options) -> Work<()> {
        let done = Arc::new(Completion::default());
        match p2p_of(c) {
            // SAFETY: the caller's promise covers the buffer until the Work completes.
            Some(Ok(p)) => {
                return unsafe { self.post_p2p_raw(&[p], opts.timeout) }
                    .pop()
                    .expect("one op")
                    .0
            }
            Some(Err(e)) => {
                done.complete(Err(e));
                return Work::new(done, ());
            }
            None => {}
        }
        match self.check(c, opts) {
            Ok(op) => self.engine.submit(op, done.clone()),
            Err(e) => done.complete(Err(e)),
        }
        Work::new(done, ())
    }

    /// `coll` of `count` elements from `send` into `recv` with `opts`: the
    /// typed calls' common path, for callers inside the crate that need a
    /// collective and options no public method pairs (the calibration).
    pub(crate) fn run_slices<T: Element>(
        &self,
        coll: Collective,
        op: ReduceOp,
        count: usize,
        send: &[T],
        recv: &mut [T],
        opts: &Options,
    ) -> Result<()> {
        self.blocking(call(coll, op, count, send, recv), opts)
    }

    fn blocking(&self, c: RawCall, opts: &Options) -> Result<()> {
        // SAFETY: every typed caller builds `c` from slices it borrows for
        // the duration of this call (shared for send, exclusive for recv).
        unsafe { self.run_raw(&c, opts) }
    }

    fn issue<B>(&self, c: RawCall, bufs: B) -> Work<B> {
        let done = Arc::new(Completion::default());
        match self.check(&c, &Options::default()) {
            Ok(op) => self.engine.submit(op, done.clone()),
            Err(e) => done.complete(Err(e)),
        }
        // The vectors' heap memory does not move when they move into Work,
        // and Work keeps them alive (and blocks in drop) until the op is done.
        Work::new(done, bufs)
    }

    // ---- AllReduce ----

    /// Reduces `buf` across all ranks, in place: every rank ends with the result.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_with(buf, op, &Options::default())
    }

    /// [`all_reduce`](Communicator::all_reduce) with per-call options (algorithm, timeout).
    pub fn all_reduce_with<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        opts: &Options,
    ) -> Result<()> {
        let c = in_place(Collective::AllReduce, op, buf);
        self.blocking(c, opts)
    }

    /// Reduces `send` across all ranks into `recv` (same length).
    pub fn all_reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(
            call(Collective::AllReduce, op, send.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous in-place AllReduce; `wait()` returns the vector with the result.
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        let c = in_place(Collective::AllReduce, op, &mut buf);
        self.issue(c, buf)
    }

    // ---- Broadcast ----

    /// Copies the root's `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let c = in_place(Collective::Broadcast { root }, ReduceOp::Sum, buf);
        self.blocking(c, &Options::default())
    }

    /// Asynchronous [`broadcast`](Communicator::broadcast).
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        let c = in_place(Collective::Broadcast { root }, ReduceOp::Sum, &mut buf);
        self.issue(c, buf)
    }

    // ---- Reduce ----

    /// Reduces every rank's `send` into the root's `recv` (same length as
    /// `send` on the root; ignored, and may be empty, elsewhere).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let recv = if self.rank() == root { recv } else { &mut [] };
        self.blocking(
            call(Collective::Reduce { root }, op, send.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous [`reduce`](Communicator::reduce); returns `(send, recv)`.
    pub fn reduce_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = {
            let r: &mut [T] = if self.rank() == root {
                &mut recv
            } else {
                &mut []
            };
            call(Collective::Reduce { root }, op, send.len(), &send, r)
        };
        self.issue(c, (send, recv))
    }

    // ---- AllGather ----

    /// Every rank's `send` (all the same length) lands in every rank's `recv`,
    /// in rank order; `recv.len() == size() * send.len()`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.blocking(
            call(Collective::AllGather, ReduceOp::Sum, send.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous [`all_gather`](Communicator::all_gather); returns `(send, recv)`.
    pub fn all_gather_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = call(
            Collective::AllGather,
            ReduceOp::Sum,
            send.len(),
            &send,
            &mut recv,
        );
        self.issue(c, (send, recv))
    }

    // ---- ReduceScatter ----

    /// Reduces `send` (`size() * recv.len()` elements) across ranks; rank r
    /// receives block r of the result.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(
            call(Collective::ReduceScatter, op, recv.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous [`reduce_scatter`](Communicator::reduce_scatter); returns `(send, recv)`.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
        op: ReduceOp,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = call(Collective::ReduceScatter, op, recv.len(), &send, &mut recv);
        self.issue(c, (send, recv))
    }

    // ---- AllToAll ----

    /// Block p of `send` goes to rank p, where it becomes block r (this
    /// rank) of `recv`. Both hold `size()` equal blocks.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if !send.len().is_multiple_of(n) {
            return Err(Error::arg(format!(
                "all_to_all: the send buffer has {} elements, not a multiple of the {n} ranks",
                send.len()
            )));
        }
        self.blocking(
            call(
                Collective::AllToAll,
                ReduceOp::Sum,
                send.len() / n,
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    /// Asynchronous [`all_to_all`](Communicator::all_to_all); returns `(send, recv)`.
    pub fn all_to_all_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let n = self.size();
        let c = call(
            Collective::AllToAll,
            ReduceOp::Sum,
            send.len() / n,
            &send,
            &mut recv,
        );
        if !send.len().is_multiple_of(n) {
            let done = Arc::new(Completion::default());
            done.complete(Err(Error::arg(
                "all_to_all: send length is not a multiple of the rank count",
            )));
            return Work::new(done, (send, recv));
        }
        self.issue(c, (send, recv))
    }

    /// AllToAll with per-peer counts and displacements (in elements): this
    /// rank sends `send[send_displs[p]..][..send_counts[p]]` to rank p and
    /// receives rank p's block into `recv[recv_displs[p]..][..recv_counts[p]]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let mut c = call(Collective::AllToAllV, ReduceOp::Sum, 0, send, recv);
        c.vcounts = Some(VCounts {
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
        });
        self.blocking(c, &Options::default())
    }

    // ---- Gather / Scatter ----

    /// Every rank's `send` lands in the root's `recv` (`size() * send.len()`
    /// elements, in rank order; ignored elsewhere).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let recv = if self.rank() == root { recv } else { &mut [] };
        self.blocking(
            call(
                Collective::Gather { root },
                ReduceOp::Sum,
                send.len(),
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    /// Block p of the root's `send` (`size() * recv.len()` elements; ignored
    /// elsewhere) lands in rank p's `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let send = if self.rank() == root { send } else { &[] };
        self.blocking(
            call(
                Collective::Scatter { root },
                ReduceOp::Sum,
                recv.len(),
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    // ---- Barrier (Send and Recv: see p2p.rs) ----

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(
            call::<u8>(Collective::Barrier, ReduceOp::Sum, 0, &[], &mut []),
            &Options::default(),
        )
    }

    /// Asynchronous [`barrier`](Communicator::barrier).
    pub fn barrier_async(&self) -> Work<()> {
        self.issue(
            call::<u8>(Collective::Barrier, ReduceOp::Sum, 0, &[], &mut []),
            (),
        )
    }
}

/// A raw Send or Recv as a point-to-point op (tag 0, exact length), after
/// checking its buffer; `None` for collectives.
fn p2p_of(c: &RawCall) -> Option<Result<super::RawP2p>> {
    let (send, peer) = match c.coll {
        Collective::Send { peer } => (true, peer),
        Collective::Recv { peer } => (false, peer),
        _ => return None,
    };
    let (ptr, have) = if send {
        (c.send as *mut u8, c.send_len)
    } else {
        (c.recv, c.recv_len)
    };
    let what = if send { "send" } else { "recv" };
    Some(
        c.count
            .checked_mul(c.dtype.size())
            .filter(|&len| len <= have)
            .map(|len| super::RawP2p {
                send,
                peer: Some(peer),
                ptr,
                len,
                tag: 0,
                exact: true,
            })
            .ok_or_else(|| {
                Error::arg(format!(
                    "{what}: {} elements of {} do not fit its buffer of {have} bytes",
                    c.count, c.dtype
                ))
            }),
    )
}

fn hint(c: Collective, n: usize) -> String {
    match c {
        Collective::AllGather => {
            format!(" (AllGather's receive buffer holds size ({n}) x the send count)")
        }
        Collective::ReduceScatter => {
            format!(" (ReduceScatter's send buffer holds size ({n}) x the receive count)")
        }
        Collective::Gather { .. } => {
            format!(" (the root's receive buffer holds size ({n}) x the send count)")
        }
        Collective::Scatter { .. } => {
            format!(" (the root's send buffer holds size ({n}) x the receive count)")
        }
        Collective::AllReduce => {
            " (AllReduce's send and receive buffers have the same length)".into()
        }
        Collective::Broadcast { .. } => " (a root's separate send buffer holds the whole \
             message; an empty one means the data is in the receive buffer)"
            .into(),
        _ => String::new(),
    }
}
